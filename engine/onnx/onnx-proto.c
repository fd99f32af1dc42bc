/*
 * onnx-proto.c — a small protobuf wire-format decoder for the ONNX messages kiln reads.
 *
 * Why hand-written rather than protobuf-c: the loader needs a dozen fields of seven
 * messages, and a reader that checks every length against the bytes left, caps nesting
 * and element counts, and skips everything else is a few hundred lines with no build-time
 * code generation or extra dependency. Field numbers are those of onnx.proto.
 *
 * Everything here treats the input as hostile: a varint longer than ten bytes, a length
 * past the end, a wire type kiln does not know, a tensor whose data disagree with its
 * dims, or a nesting deeper than the messages can legitimately be, is an error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/bytes.h"
#include "error-impl.h"
#include "onnx-impl.h"

/* Each If nested in a branch adds three levels (GraphProto, NodeProto, AttributeProto), and
 * a branch's value infos need five below its graph: 32 allows eight nested Ifs, and bounds
 * the decoder's recursion through branches. */
#define MAX_DEPTH 32
#define MAX_ITEMS (1 << 22)       /* repeated entries of any one field */
#define MAX_NUMEL ((int64_t)1 << 32)

typedef struct rd {
    const uint8_t *p, *end;
    int depth;
    /* the bytes are a private anonymous mapping the caller lets go of as it is read: each
     * tensor's raw_data is given back to the system once copied (kiln__onnx_decode_consuming) */
    bool consume;
} rd;

static int bad(const char *what) { return kiln__error_set("onnx: malformed model: %s", what); }

static int rd_varint(rd *r, uint64_t *v) {
    switch (kiln_varint_read(&r->p, r->end, v)) {
    case KILN_VARINT_OK: return 0;
    case KILN_VARINT_TRUNCATED: return bad("truncated varint");
    default: return bad("varint longer than 10 bytes");
    }
}

static int rd_fixed(rd *r, int n, uint64_t *v) {
    if (r->end - r->p < n) return bad("truncated fixed-width field");
    uint64_t x = 0;
    for (int i = 0; i < n; i++) x |= (uint64_t)r->p[i] << (8 * i);
    r->p += n;
    *v = x;
    return 0;
}

/* A length-delimited field: checks the claimed length against what is left. */
static int rd_bytes(rd *r, const uint8_t **b, size_t *n) {
    uint64_t len = 0; /* rd_varint sets it on success; -O3 cannot tell */
    if (rd_varint(r, &len)) return -1;
    if (len > (uint64_t)(r->end - r->p)) return bad("length past the end of its message");
    *b = r->p;
    *n = (size_t)len;
    r->p += len;
    return 0;
}

static int rd_tag(rd *r, int *field, int *wt) {
    uint64_t t = 0;
    if (rd_varint(r, &t)) return -1;
    if ((t >> 3) == 0 || (t >> 3) > 0x1fffffff) return bad("field number out of range");
    *field = (int)(t >> 3);
    *wt = (int)(t & 7);
    return 0;
}

static int rd_skip(rd *r, int wt) {
    uint64_t v = 0;
    const uint8_t *b = NULL;
    size_t n = 0;
    switch (wt) {
    case 0: return rd_varint(r, &v);
    case 1: return rd_fixed(r, 8, &v);
    case 2: return rd_bytes(r, &b, &n);
    case 5: return rd_fixed(r, 4, &v);
    default: return bad("unsupported wire type (groups are not used by ONNX)");
    }
}

static int sub(rd *r, rd *s) {
    const uint8_t *b = NULL;
    size_t n = 0;
    if (r->depth + 1 > MAX_DEPTH) return bad("messages nested too deeply");
    if (rd_bytes(r, &b, &n)) return -1;
    *s = (rd){b, b + n, r->depth + 1, r->consume};
    return 0;
}

static char *dup_bytes(const uint8_t *b, size_t n) {
    char *s = malloc(n + 1);
    if (!s) return NULL;
    memcpy(s, b, n);
    s[n] = 0;
    return s;
}

static int rd_string(rd *r, char **out) {
    const uint8_t *b = NULL;
    size_t n = 0;
    if (rd_bytes(r, &b, &n)) return -1;
    char *s = dup_bytes(b, n);
    if (!s) return kiln__error_set("onnx: out of memory");
    free(*out);
    *out = s;
    return 0;
}

/* Grow a dynamic array to hold one more element. */
static int grow(void **arr, int *cap, int count, size_t elem) {
    if (count < *cap) return 0;
    if (count >= MAX_ITEMS) return bad("too many repeated entries");
    int nc = *cap ? *cap * 2 : 8;
    void *p = realloc(*arr, (size_t)nc * elem);
    if (!p) return kiln__error_set("onnx: out of memory");
    memset((char *)p + (size_t)*cap * elem, 0, (size_t)(nc - *cap) * elem);
    *arr = p;
    *cap = nc;
    return 0;
}

/* A vector of numbers gathered from packed or unpacked repeated fields. */
typedef struct numvec {
    int n, cap;
    union { int64_t *i; double *d; void *v; } u;
} numvec;

/* wt 0 (one varint), or wt 2 (a packed run of varints). */
static int rd_rep_varint(rd *r, int wt, numvec *v, bool as_int32) {
    uint64_t x = 0;
    if (wt == 0) {
        if (rd_varint(r, &x) || grow(&v->u.v, &v->cap, v->n, sizeof(int64_t))) return -1;
        v->u.i[v->n++] = as_int32 ? (int64_t)(int32_t)x : (int64_t)x;
        return 0;
    }
    if (wt != 2) return bad("repeated integer field with a wrong wire type");
    const uint8_t *b = NULL;
    size_t n = 0;
    if (rd_bytes(r, &b, &n)) return -1;
    rd s = {b, b + n, r->depth, r->consume};
    while (s.p < s.end) {
        if (rd_varint(&s, &x) || grow(&v->u.v, &v->cap, v->n, sizeof(int64_t))) return -1;
        v->u.i[v->n++] = as_int32 ? (int64_t)(int32_t)x : (int64_t)x;
    }
    return 0;
}

/* Repeated float (wt 5) or double (wt 1), packed (wt 2) or not. */
static int rd_rep_fixed(rd *r, int wt, numvec *v, int width) {
    uint64_t x = 0;
    int want = width == 4 ? 5 : 1;
    const uint8_t *b = NULL;
    size_t n = 0;
    rd s;
    if (wt == want) {
        s = *r;
        n = (size_t)width;
        if (r->end - r->p < width) return bad("truncated fixed-width field");
        r->p += width;
        s.end = s.p + width;
    } else if (wt == 2) {
        if (rd_bytes(r, &b, &n)) return -1;
        if (n % (size_t)width) return bad("packed float data of a length not a multiple of its width");
        s = (rd){b, b + n, r->depth, r->consume};
    } else {
        return bad("repeated float field with a wrong wire type");
    }
    while (s.p < s.end) {
        if (rd_fixed(&s, width, &x) || grow(&v->u.v, &v->cap, v->n, sizeof(double))) return -1;
        if (width == 4) {
            uint32_t w = (uint32_t)x;
            float f;
            memcpy(&f, &w, 4);
            v->u.d[v->n++] = f;
        } else {
            double d;
            memcpy(&d, &x, 8);
            v->u.d[v->n++] = d;
        }
    }
    return 0;
}

int kiln__onnx_kdtype(int t) {
    switch (t) {
    case KILN__ONNX_FLOAT: return KILN_F32;
    case KILN__ONNX_DOUBLE: return KILN_F64;
    case KILN__ONNX_FLOAT16: return KILN_F16;
    case KILN__ONNX_BFLOAT16: return KILN_BF16;
    case KILN__ONNX_INT64: case KILN__ONNX_UINT32: case KILN__ONNX_UINT64: return KILN_I64;
    case KILN__ONNX_INT32: case KILN__ONNX_INT8: case KILN__ONNX_INT16: case KILN__ONNX_UINT16:
        return KILN_I32;
    case KILN__ONNX_UINT8: return KILN_U8;
    case KILN__ONNX_BOOL: return KILN_BOOL;
    default: return -1;
    }
}

/* Bytes per element of raw_data for an ONNX type. */
static size_t onnx_size(int t) {
    switch (t) {
    case KILN__ONNX_FLOAT: case KILN__ONNX_INT32: case KILN__ONNX_UINT32: return 4;
    case KILN__ONNX_DOUBLE: case KILN__ONNX_INT64: case KILN__ONNX_UINT64: return 8;
    case KILN__ONNX_FLOAT16: case KILN__ONNX_BFLOAT16: case KILN__ONNX_INT16: case KILN__ONNX_UINT16:
        return 2;
    case KILN__ONNX_UINT8: case KILN__ONNX_INT8: case KILN__ONNX_BOOL: return 1;
    default: return 0;
    }
}

/* Store element i of value v (integer form iv or floating form dv) in kiln layout. */
static void put(void *dst, int kdt, int64_t i, int64_t iv, double dv, bool is_float) {
    switch (kdt) {
    case KILN_F32: ((float *)dst)[i] = is_float ? (float)dv : (float)iv; break;
    case KILN_F64: ((double *)dst)[i] = is_float ? dv : (double)iv; break;
    case KILN_F16: case KILN_BF16: ((uint16_t *)dst)[i] = (uint16_t)iv; break;
    case KILN_I64: ((int64_t *)dst)[i] = iv; break;
    case KILN_I32: ((int32_t *)dst)[i] = (int32_t)iv; break;
    case KILN_U8: ((uint8_t *)dst)[i] = (uint8_t)iv; break;
    case KILN_BOOL: ((uint8_t *)dst)[i] = iv != 0; break;
    default: break;
    }
}

/* Widen one raw_data element of ONNX type t. */
static int64_t raw_int(const uint8_t *p, int t) {
    switch (t) {
    case KILN__ONNX_INT8: return (int8_t)p[0];
    case KILN__ONNX_UINT8: case KILN__ONNX_BOOL: return p[0];
    case KILN__ONNX_INT16: { int16_t v; memcpy(&v, p, 2); return v; }
    case KILN__ONNX_UINT16: case KILN__ONNX_FLOAT16: case KILN__ONNX_BFLOAT16: {
        uint16_t v; memcpy(&v, p, 2); return v; }
    case KILN__ONNX_INT32: { int32_t v; memcpy(&v, p, 4); return v; }
    case KILN__ONNX_UINT32: { uint32_t v; memcpy(&v, p, 4); return v; }
    default: { int64_t v; memcpy(&v, p, 8); return v; }
    }
}

void kiln__onnx_ptensor_clear(kiln__onnx_ptensor *t) {
    if (!t) return;
    free(t->name);
    free(t->data);
    free(t->ext_location);
    memset(t, 0, sizeof *t);
}

static int dec_string_entry(rd *r, char **key, char **value) {
    rd s;
    if (sub(r, &s)) return -1;
    while (s.p < s.end) {
        int f = 0, wt = 0;
        if (rd_tag(&s, &f, &wt)) return -1;
        if (f == 1 && wt == 2) { if (rd_string(&s, key)) return -1; }
        else if (f == 2 && wt == 2) { if (rd_string(&s, value)) return -1; }
        else if (rd_skip(&s, wt)) return -1;
    }
    return 0;
}

static int parse_i64(const char *s, int64_t *out) {
    char *end;
    if (!s || !*s) return -1;
    long long v = strtoll(s, &end, 10);
    if (*end || v < 0) return -1;
    *out = v;
    return 0;
}

/* Gives the whole pages inside [b, b + n) back to the system: a consumed tensor's raw_data,
 * which nothing reads again. A large model's bytes and its decoded tensors would otherwise be
 * resident together, twice the weights at the load's peak. */
static void give_back(const uint8_t *b, size_t n)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t first = ((uintptr_t)b + page - 1) & ~(page - 1), last = ((uintptr_t)b + n) & ~(page - 1);
    if (last > first)
        madvise((void *)first, last - first, MADV_DONTNEED);
}

static int dec_tensor(rd *r, kiln__onnx_ptensor *t) {
    rd s;
    numvec dims = {0}, ints = {0}, dbls = {0};
    const uint8_t *raw = NULL;
    size_t raw_len = 0;
    bool have_raw = false;
    int rc = -1;
    int64_t location = 0;
    if (sub(r, &s)) return -1;
    t->ext_length = -1;
    while (s.p < s.end) {
        int f = 0, wt = 0;
        uint64_t v = 0;
        if (rd_tag(&s, &f, &wt)) goto out;
        switch (f) {
        case 1: if (rd_rep_varint(&s, wt, &dims, false)) goto out; break;
        case 2: if (wt != 0 || rd_varint(&s, &v)) { bad("TensorProto.data_type"); goto out; }
            t->onnx_type = (int)v; break;
        case 4: if (rd_rep_fixed(&s, wt, &dbls, 4)) goto out; break;
        case 5: if (rd_rep_varint(&s, wt, &ints, true)) goto out; break;
        case 7: case 11: if (rd_rep_varint(&s, wt, &ints, false)) goto out; break;
        case 10: if (rd_rep_fixed(&s, wt, &dbls, 8)) goto out; break;
        case 8: if (wt != 2 || rd_string(&s, &t->name)) { bad("TensorProto.name"); goto out; } break;
        case 9: if (wt != 2 || rd_bytes(&s, &raw, &raw_len)) { bad("TensorProto.raw_data"); goto out; }
            have_raw = true; break;
        case 13: {
            char *k = NULL, *val = NULL;
            if (wt != 2 || dec_string_entry(&s, &k, &val)) { free(k); free(val); bad("external_data"); goto out; }
            int e = 0;
            if (k && !strcmp(k, "location")) { free(t->ext_location); t->ext_location = val; val = NULL; }
            else if (k && !strcmp(k, "offset")) e = parse_i64(val, &t->ext_offset);
            else if (k && !strcmp(k, "length")) e = parse_i64(val, &t->ext_length);
            free(k);
            free(val);
            if (e) { bad("external_data offset or length is not a non-negative integer"); goto out; }
            break;
        }
        case 14: if (wt != 0 || rd_varint(&s, &v)) { bad("TensorProto.data_location"); goto out; }
            location = (int64_t)v; break;
        default: if (rd_skip(&s, wt)) goto out;
        }
    }
    if (dims.n > KILN_MAX_DIMS) { kiln__error_set("onnx: tensor '%s' has %d dims (kiln allows %d)",
                                                  t->name ? t->name : "", dims.n, KILN_MAX_DIMS); goto out; }
    t->ndim = dims.n;
    t->numel = 1;
    for (int i = 0; i < dims.n; i++) {
        int64_t d = dims.u.i[i];
        if (d < 0 || (d > 0 && t->numel > MAX_NUMEL / d)) {
            kiln__error_set("onnx: tensor '%s' has an invalid or absurd shape", t->name ? t->name : "");
            goto out;
        }
        t->dims[i] = d;
        t->numel *= d;
    }
    t->kdtype = kiln__onnx_kdtype(t->onnx_type);
    if (t->kdtype < 0) {
        kiln__error_set("onnx: tensor '%s' has data type %d, which kiln does not support",
                        t->name ? t->name : "", t->onnx_type);
        goto out;
    }
    size_t ksz = kiln_dtype_size((kiln_dtype)t->kdtype);
    t->nbytes = (size_t)t->numel * ksz;
    if (location == 1) {
        if (!t->ext_location) { bad("external tensor without a location"); goto out; }
        t->external = true;
        rc = 0;
        goto out;
    }
    size_t osz = onnx_size(t->onnx_type);
    int64_t have = have_raw ? (int64_t)(raw_len / osz) : (ints.n ? ints.n : dbls.n);
    if (have_raw && raw_len % osz) { bad("raw_data length is not a multiple of the element size"); goto out; }
    if (have != t->numel) {
        kiln__error_set("onnx: tensor '%s' holds %lld elements but its dims say %lld", t->name ? t->name : "",
                        (long long)have, (long long)t->numel);
        goto out;
    }
    t->data = malloc(t->nbytes ? t->nbytes : 1);
    if (!t->data) { kiln__error_set("onnx: out of memory for tensor '%s'", t->name ? t->name : ""); goto out; }
    if (have_raw && (int)ksz == (int)osz && t->onnx_type != KILN__ONNX_INT8 && t->onnx_type != KILN__ONNX_UINT32) {
        memcpy(t->data, raw, t->nbytes);       /* little-endian, same layout */
    } else if (have_raw) {
        for (int64_t i = 0; i < t->numel; i++) {
            const uint8_t *p = raw + (size_t)i * osz;
            if (t->onnx_type == KILN__ONNX_FLOAT) { float f; memcpy(&f, p, 4); put(t->data, t->kdtype, i, 0, f, true); }
            else if (t->onnx_type == KILN__ONNX_DOUBLE) { double d; memcpy(&d, p, 8); put(t->data, t->kdtype, i, 0, d, true); }
            else put(t->data, t->kdtype, i, raw_int(p, t->onnx_type), 0, false);
        }
    } else {
        bool fl = dbls.n > 0;
        for (int64_t i = 0; i < t->numel; i++)
            put(t->data, t->kdtype, i, fl ? 0 : ints.u.i[i], fl ? dbls.u.d[i] : 0, fl);
    }
    if (have_raw && r->consume)
        give_back(raw, raw_len);
    rc = 0;
out:
    free(dims.u.v);
    free(ints.u.v);
    free(dbls.u.v);
    return rc;
}

static int dec_graph(rd *r, kiln__onnx_pmodel *pm);

static int dec_attr(rd *r, kiln__onnx_attr *a) {
    rd s;
    numvec fl = {0}, in = {0};
    int scap = 0, rc = -1;
    uint64_t v = 0;
    if (sub(r, &s)) return -1;
    while (s.p < s.end) {
        int f = 0, wt = 0;
        if (rd_tag(&s, &f, &wt)) goto out;
        switch (f) {
        case 1: if (wt != 2 || rd_string(&s, &a->name)) { bad("AttributeProto.name"); goto out; } break;
        case 20: if (wt != 0 || rd_varint(&s, &v)) { bad("AttributeProto.type"); goto out; } a->type = (int)v; break;
        case 2: if (wt != 5 || rd_fixed(&s, 4, &v)) { bad("AttributeProto.f"); goto out; } else {
                uint32_t w = (uint32_t)v; float x; memcpy(&x, &w, 4); a->f = x; } break;
        case 3: if (wt != 0 || rd_varint(&s, &v)) { bad("AttributeProto.i"); goto out; } a->i = (int64_t)v; break;
        case 4: { const uint8_t *b = NULL; size_t n = 0;
            if (wt != 2 || rd_bytes(&s, &b, &n)) { bad("AttributeProto.s"); goto out; }
            free(a->s); a->s = dup_bytes(b, n); a->slen = n;
            if (!a->s) { kiln__error_set("onnx: out of memory"); goto out; } break; }
        case 5:
            if (wt != 2) { bad("AttributeProto.t"); goto out; }
            if (!a->t) { a->t = calloc(1, sizeof *a->t); if (!a->t) { kiln__error_set("onnx: out of memory"); goto out; } }
            else kiln__onnx_ptensor_clear(a->t);
            if (dec_tensor(&s, a->t)) goto out;
            break;
        case 7: if (rd_rep_fixed(&s, wt, &fl, 4)) goto out; break;
        case 8: if (rd_rep_varint(&s, wt, &in, false)) goto out; break;
        case 6: /* g: a branch of an If; a repeated field decodes afresh */
            if (wt != 2) {
                bad("AttributeProto.g");
                goto out;
            }
            kiln__onnx_pmodel_free(a->g);
            if (!(a->g = calloc(1, sizeof *a->g))) {
                kiln__error_set("onnx: out of memory");
                goto out;
            }
            if (dec_graph(&s, a->g))
                goto out;
            break;
        case 9:
            if (wt != 2 || grow((void **)&a->strings, &scap, a->nstrings, sizeof(char *))) { bad("strings"); goto out; }
            if (rd_string(&s, &a->strings[a->nstrings])) goto out;
            a->nstrings++;
            break;
        default: /* graphs, tensors: not used */
            if (rd_skip(&s, wt))
                goto out;
        }
    }
    if (!a->name) { bad("attribute without a name"); goto out; }
    a->floats = fl.u.d; a->nfloats = fl.n; fl.u.v = NULL;
    a->ints = in.u.i; a->nints = in.n; in.u.v = NULL;
    rc = 0;
out:
    free(fl.u.v);
    free(in.u.v);
    return rc;
}

static void attr_free(kiln__onnx_attr *a) {
    free(a->name);
    free(a->s);
    if (a->t) { kiln__onnx_ptensor_clear(a->t); free(a->t); }
    free(a->floats);
    free(a->ints);
    for (int i = 0; i < a->nstrings; i++) free(a->strings[i]);
    free(a->strings);
    kiln__onnx_pmodel_free(a->g);
}

static int add_string(rd *r, char ***arr, int *n, int *cap) {
    if (grow((void **)arr, cap, *n, sizeof(char *))) return -1;
    if (rd_string(r, &(*arr)[*n])) return -1;
    (*n)++;
    return 0;
}

static int dec_node(rd *r, kiln__onnx_pnode *nd) {
    rd s;
    int icap = 0, ocap = 0, acap = 0;
    if (sub(r, &s)) return -1;
    while (s.p < s.end) {
        int f = 0, wt = 0;
        if (rd_tag(&s, &f, &wt)) return -1;
        if (wt == 2 && f == 1) { if (add_string(&s, &nd->inputs, &nd->ninputs, &icap)) return -1; }
        else if (wt == 2 && f == 2) { if (add_string(&s, &nd->outputs, &nd->noutputs, &ocap)) return -1; }
        else if (wt == 2 && f == 3) { if (rd_string(&s, &nd->name)) return -1; }
        else if (wt == 2 && f == 4) { if (rd_string(&s, &nd->op_type)) return -1; }
        else if (wt == 2 && f == 7) { if (rd_string(&s, &nd->domain)) return -1; }
        else if (wt == 2 && f == 5) {
            if (grow((void **)&nd->attrs, &acap, nd->nattrs, sizeof *nd->attrs)) return -1;
            nd->nattrs++;   /* counted first so a half-decoded attribute is still freed */
            if (dec_attr(&s, &nd->attrs[nd->nattrs - 1])) return -1;
        } else if (rd_skip(&s, wt)) return -1;
    }
    if (!nd->op_type) return bad("node without an op_type");
    /* An unnamed node is named after its first output in every message ("node '<unnamed,
     * output y>' (Det)"): an empty name left a user nothing to find it by. */
    if (!nd->name || !nd->name[0]) {
        const char *out = nd->noutputs > 0 && nd->outputs[0] ? nd->outputs[0] : "";
        size_t len = strlen(out) + 32;
        char *named = malloc(len);
        if (!named)
            return kiln__error_set("onnx: out of memory");
        snprintf(named, len, out[0] ? "<unnamed, output %s>" : "<unnamed>", out);
        free(nd->name);
        nd->name = named;
    }
    return 0;
}

static void node_free(kiln__onnx_pnode *nd) {
    free(nd->name); free(nd->op_type); free(nd->domain);
    for (int i = 0; i < nd->ninputs; i++) free(nd->inputs[i]);
    for (int i = 0; i < nd->noutputs; i++) free(nd->outputs[i]);
    free(nd->inputs); free(nd->outputs);
    for (int i = 0; i < nd->nattrs; i++) attr_free(&nd->attrs[i]);
    free(nd->attrs);
}

/* TensorShapeProto.Dimension: dim_value or dim_param (symbolic, kept as -1). */
static int dec_shape(rd *r, kiln__onnx_pvalue *v) {
    rd s;
    if (sub(r, &s)) return -1;
    v->ndim = 0;
    while (s.p < s.end) {
        int f = 0, wt = 0;
        if (rd_tag(&s, &f, &wt)) return -1;
        if (f != 1 || wt != 2) { if (rd_skip(&s, wt)) return -1; continue; }
        rd d;
        if (sub(&s, &d)) return -1;
        if (v->ndim >= KILN_MAX_DIMS) return kiln__error_set("onnx: value '%s' has more than %d dims",
                                                             v->name ? v->name : "", KILN_MAX_DIMS);
        int64_t dv = -1;
        while (d.p < d.end) {
            int g = 0, w2 = 0;
            uint64_t x = 0;
            if (rd_tag(&d, &g, &w2)) return -1;
            if (g == 1 && w2 == 0) { if (rd_varint(&d, &x)) return -1; dv = (int64_t)x < 0 ? -1 : (int64_t)x; }
            else if (rd_skip(&d, w2)) return -1;
        }
        v->dims[v->ndim++] = dv;
    }
    return 0;
}

static int dec_value(rd *r, kiln__onnx_pvalue *v) {
    rd s;
    if (sub(r, &s)) return -1;
    v->ndim = -1;
    while (s.p < s.end) {
        int f = 0, wt = 0;
        if (rd_tag(&s, &f, &wt)) return -1;
        if (f == 1 && wt == 2) { if (rd_string(&s, &v->name)) return -1; continue; }
        if (f != 2 || wt != 2) { if (rd_skip(&s, wt)) return -1; continue; }
        rd ty;                                   /* TypeProto */
        if (sub(&s, &ty)) return -1;
        while (ty.p < ty.end) {
            int g = 0, w2 = 0;
            if (rd_tag(&ty, &g, &w2)) return -1;
            if (g != 1 || w2 != 2) { if (rd_skip(&ty, w2)) return -1; continue; }
            rd tt;                               /* TypeProto.Tensor */
            if (sub(&ty, &tt)) return -1;
            while (tt.p < tt.end) {
                int h = 0, w3 = 0;
                uint64_t x = 0;
                if (rd_tag(&tt, &h, &w3)) return -1;
                if (h == 1 && w3 == 0) { if (rd_varint(&tt, &x)) return -1; v->elem_type = (int)x; }
                else if (h == 2 && w3 == 2) { if (dec_shape(&tt, v)) return -1; }
                else if (rd_skip(&tt, w3)) return -1;
            }
        }
    }
    if (!v->name) return bad("value info without a name");
    return 0;
}

static int dec_graph(rd *r, kiln__onnx_pmodel *pm) {
    rd s;
    int ncap = 0, tcap = 0, icap = 0, ocap = 0;
    if (sub(r, &s)) return -1;
    while (s.p < s.end) {
        int f = 0, wt = 0;
        if (rd_tag(&s, &f, &wt)) return -1;
        if (wt == 2 && f == 1) {
            if (grow((void **)&pm->nodes, &ncap, pm->nnodes, sizeof *pm->nodes)) return -1;
            if (dec_node(&s, &pm->nodes[pm->nnodes++])) return -1;
        } else if (wt == 2 && f == 5) {
            if (grow((void **)&pm->inits, &tcap, pm->ninits, sizeof *pm->inits)) return -1;
            if (dec_tensor(&s, &pm->inits[pm->ninits++])) return -1;
            if (!pm->inits[pm->ninits - 1].name) return bad("initializer without a name");
        } else if (wt == 2 && f == 11) {
            if (grow((void **)&pm->inputs, &icap, pm->ninputs, sizeof *pm->inputs)) return -1;
            if (dec_value(&s, &pm->inputs[pm->ninputs++])) return -1;
        } else if (wt == 2 && f == 12) {
            if (grow((void **)&pm->outputs, &ocap, pm->noutputs, sizeof *pm->outputs)) return -1;
            if (dec_value(&s, &pm->outputs[pm->noutputs++])) return -1;
        } else if (rd_skip(&s, wt)) return -1;   /* value_info, sparse initializers, docs */
    }
    return 0;
}

/* ------------------------------------------------------- not ONNX at all */

/* What the first bytes of a file that is not ONNX say it is, or NULL. Checked only after the
 * decoder failed, so a model is never refused for its first bytes; none of these can begin a
 * ModelProto (their first byte is no tag of it with its wire type). */
static const char *other_format(const uint8_t *b, size_t n)
{
    if (n >= 4 && !memcmp(b, "PK\x03\x04", 4))
        return "a zip archive, as torch.save writes a PyTorch checkpoint: export the model with torch.onnx.export";
    if (n >= 2 && b[0] == 0x80 && b[1] >= 2 && b[1] <= 5)
        return "a Python pickle (a PyTorch checkpoint of the legacy format, or a pickled object): export the "
               "model with torch.onnx.export";
    /* safetensors: an 8-byte little-endian header length, then the JSON header */
    if (n >= 10 && b[8] == '{') {
        uint64_t hl = 0;
        for (int i = 0; i < 8; i++)
            hl |= (uint64_t)b[i] << (8 * i);
        if (hl >= 2 && hl <= n - 8)
            return "safetensors (tensors without a graph)";
    }
    if (n >= 8 && !memcmp(b, "\x89HDF\r\n\x1a\n", 8))
        return "HDF5 (a Keras .h5 model?)";
    if (n >= 8 && !memcmp(b + 4, "TFL3", 4))
        return "a TensorFlow Lite model";
    if (n >= 4 && !memcmp(b, "GGUF", 4))
        return "a GGUF model";
    if (n >= 6 && !memcmp(b, "\x93NUMPY", 6))
        return "a NumPy array (.npy)";
    size_t i = n >= 3 && !memcmp(b, "\xef\xbb\xbf", 3) ? 3 : 0; /* a UTF-8 byte order mark */
    while (i < n && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n'))
        i++;
    if (i < n && (b[i] == '{' || b[i] == '['))
        return "JSON";
    return NULL;
}

/* Whether buf begins as a ModelProto does: its first tag is one of ModelProto's fields with
 * that field's wire type (serializers write ir_version, field 1, first). Such a file is a
 * damaged model, whose decoder message says where; any other is not ONNX. */
static bool starts_like_onnx(const uint8_t *buf, size_t len)
{
    static const struct {
        uint8_t field, wt;
    } fields[] = {
        {1, 0}, {2, 2}, {3, 2}, {4, 2}, {5, 0}, {6, 2}, {7, 2}, {8, 2}, {14, 2}, {20, 2}, {25, 2}, {26, 2},
    };
    const uint8_t *p = buf;
    uint64_t t = 0;
    if (kiln_varint_read(&p, buf + len, &t) != KILN_VARINT_OK)
        return false;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (t >> 3 == fields[i].field && (t & 7) == fields[i].wt)
            return true;
    return false;
}

/* Replaces the decoder's message when buf is no ONNX model at all: a JSON file or a PyTorch
 * checkpoint named model.onnx would otherwise be reported as a model with an odd wire type. */
static void explain_not_onnx(const uint8_t *buf, size_t len)
{
    const char *other = other_format(buf, len);
    if (len == 0)
        kiln__error_set("onnx: not an ONNX model: the file is empty");
    else if (other)
        kiln__error_set("onnx: not an ONNX model: the bytes look like %s", other);
    else if (!starts_like_onnx(buf, len))
        kiln__error_set("onnx: not an ONNX model: the bytes do not parse as an ONNX ModelProto");
}

static kiln__onnx_pmodel *decode(const uint8_t *buf, size_t len, bool consume)
{
    kiln__onnx_pmodel *pm = calloc(1, sizeof *pm);
    if (!pm) { kiln__error_set("onnx: out of memory"); return NULL; }
    rd r = {buf, buf + len, 0, consume};
    bool have_graph = false;
    while (r.p < r.end) {
        int f = 0, wt = 0;
        uint64_t v = 0;
        if (rd_tag(&r, &f, &wt)) goto fail;
        if (f == 1 && wt == 0) {
            if (rd_varint(&r, &v)) goto fail;
            pm->ir_version = (int64_t)v;
        } else if (f == 8 && wt == 2) {
            rd s;
            char *domain = NULL;
            int64_t ver = 0;
            if (sub(&r, &s)) goto fail;
            while (s.p < s.end) {
                int g = 0, w2 = 0;
                if (rd_tag(&s, &g, &w2)) { free(domain); goto fail; }
                if (g == 1 && w2 == 2) { if (rd_string(&s, &domain)) { free(domain); goto fail; } }
                else if (g == 2 && w2 == 0) { if (rd_varint(&s, &v)) { free(domain); goto fail; } ver = (int64_t)v; }
                else if (rd_skip(&s, w2)) { free(domain); goto fail; }
            }
            if (!domain || !*domain || !strcmp(domain, "ai.onnx")) pm->opset = ver;
            free(domain);
        } else if (f == 7 && wt == 2) {
            if (have_graph) { bad("two graphs in one model"); goto fail; }
            have_graph = true;
            if (dec_graph(&r, pm)) goto fail;
        } else if (rd_skip(&r, wt)) goto fail;
    }
    if (!have_graph) { bad("no graph"); goto fail; }
    return pm;
fail:
    explain_not_onnx(buf, len);
    kiln__onnx_pmodel_free(pm);
    return NULL;
}

kiln__onnx_pmodel *kiln__onnx_decode(const uint8_t *buf, size_t len)
{
    return decode(buf, len, false);
}

kiln__onnx_pmodel *kiln__onnx_decode_consuming(uint8_t *buf, size_t len)
{
    return decode(buf, len, true);
}

void kiln__onnx_pmodel_free(kiln__onnx_pmodel *pm) {
    if (!pm) return;
    for (int i = 0; i < pm->nnodes; i++) node_free(&pm->nodes[i]);
    for (int i = 0; i < pm->ninits; i++) kiln__onnx_ptensor_clear(&pm->inits[i]);
    for (int i = 0; i < pm->ninputs; i++) free(pm->inputs[i].name);
    for (int i = 0; i < pm->noutputs; i++) free(pm->outputs[i].name);
    free(pm->nodes); free(pm->inits); free(pm->inputs); free(pm->outputs);
    free(pm);
}
