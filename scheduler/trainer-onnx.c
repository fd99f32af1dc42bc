/*
 * scheduler/trainer-onnx.c — fine-tuning an imported ONNX graph: the graph wrapped as a module
 * the Learner trains, and the trained weights written back into a copy of the original file.
 *
 * The module owns the loaded graph and registers each floating initializer as a parameter (a
 * second reference to the graph's own tensor), so the optimizer's in-place updates and a
 * checkpoint's in-place restore are what the graph computes with. The graph is loaded with
 * BatchNormalization folding off: folding would change the initializers, and the file written
 * at the end must hold exactly the tensors its nodes read.
 *
 * Writing the result re-encodes the ModelProto with every matching float initializer's data
 * replaced by raw_data holding the trained values, and copies every other byte as it was (the
 * nodes, attributes, metadata and opsets stay the exporter's). External data is inlined. Only
 * the fields on the path ModelProto.graph.initializer are decoded; the protobuf wire format is
 * public (a key varint, then a varint, 8 or 4 bytes, or a length and that many bytes).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <stdlib.h>
#include <string.h>

#include "common/bytes.h"
#include "kiln/onnx.h"
#include "trainer-impl.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ONNX raw_data is little-endian; this writer copies host floats as they are"
#endif

#define MODEL_GRAPH_FIELD 7 /* ModelProto.graph */

struct onnx_mod {
    kiln_onnx_model *g;
    const char *input;                  /* the graph's first input (borrowed from g) */
    int noutputs;
};

static int onnx_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    struct onnx_mod *om = kiln_module_self(m);
    if (n_in != 1 || max_out < 1)
        return -1;
    kiln_tensor *outs[16];
    if (kiln_onnx_run(om->g, 1, &om->input, in, om->noutputs, outs) != 0)
        return -1;
    /* The class logits are the first output; the rest are not trained on. */
    out[0] = outs[0];
    for (int i = 1; i < om->noutputs; i++)
        kiln_tensor_release(outs[i]);
    return 1;
}

static void onnx_destroy(void *self)
{
    struct onnx_mod *om = self;
    if (om)
        kiln_onnx_free(om->g);
    free(om);
}

static const kiln_module_class onnx_class = {"OnnxGraph", onnx_forward, onnx_destroy};

/* A module's parameter name may not hold a dot, and exporters use them ("f1.weight"). */
static void param_name(char *dst, size_t n, const char *src, int index)
{
    if (!src || !*src) {
        snprintf(dst, n, "param_%d", index);
        return;
    }
    snprintf(dst, n, "%s", src);
    for (char *c = dst; *c; c++)
        if (*c == '.')
            *c = '_';
}

kiln_module *kd_trainer_onnx_module(const char *path, kiln_device *dev, char *err, size_t errlen)
{
    kiln_onnx_options o = kiln_onnx_options_default();
    o.fold_batchnorm = false;
    kiln_onnx_model *g = kiln_onnx_load(path, dev, &o);
    if (!g) {
        snprintf(err, errlen, "model.onnx: %s", kiln_error());
        return NULL;
    }
    int nout = kiln_onnx_output_count(g);
    if (kiln_onnx_input_count(g) != 1 || nout < 1 || nout > 16) {
        snprintf(err, errlen, "model.onnx: fine-tuning needs a graph of one input and 1..16 outputs (it has %d and %d)",
                 kiln_onnx_input_count(g), nout);
        kiln_onnx_free(g);
        return NULL;
    }
    struct onnx_mod *om = calloc(1, sizeof *om);
    kiln_module *m = om ? kiln_module_new(&onnx_class, om) : NULL;
    if (!m) {
        snprintf(err, errlen, "out of memory");
        kiln_onnx_free(g);
        free(om);
        return NULL;
    }
    *om = (struct onnx_mod){g, kiln_onnx_input_name(g, 0), nout};
    int np = kiln_onnx_param_count(g), added = 0;
    for (int i = 0; i < np; i++) {
        kiln_tensor *t = kiln_onnx_param(g, i);
        if (!t || !kiln_dtype_is_float(kiln_tensor_dtype(t)))
            continue;
        char name[256];
        param_name(name, sizeof name, kiln_onnx_param_name(g, i), i);
        if (kiln_module_get(m, name)) { /* two names equal once dots are replaced */
            size_t l = strlen(name) < 200 ? strlen(name) : 200;
            snprintf(name + l, sizeof name - l, "_%d", i);
        }
        if (kiln_module_add_parameter(m, name, kiln_tensor_retain(t)) != 0) {
            snprintf(err, errlen, "model.onnx: initializer '%.100s': %.200s", kiln_onnx_param_name(g, i), kiln_error());
            kiln_module_free(m);
            return NULL;
        }
        added++;
    }
    if (added == 0) {
        snprintf(err, errlen, "model.onnx: the graph has no floating-point initializers to train");
        kiln_module_free(m);
        return NULL;
    }
    return m;
}

/* ---- checking a spec's file ---------------------------------------------------------------- */

static bool file_varint(FILE *f, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        int b = getc(f);
        if (b == EOF)
            return false;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return true;
    }
    return false;
}

/*
 * A submitted job gets its answer on the loop thread, so the check is the ModelProto's top level
 * only: every field well formed, the last one ending at the end of the file, an ir_version
 * (field 1, a varint) and a graph (field 7, bytes). Large fields are skipped with a seek, so a
 * big model costs a few reads; whatever this lets through still fails the run with the loader's
 * message.
 */
int kd_trainer_onnx_check(const char *path, char *why, size_t len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(why, len, "%s", strerror(errno));
        return -1;
    }
    bool ir = false, graph = false, ok = true;
    off_t size = 0;
    if (fseeko(f, 0, SEEK_END) != 0 || (size = ftello(f)) < 0 || fseeko(f, 0, SEEK_SET) != 0)
        ok = false;
    while (ok) {
        off_t at = ftello(f);
        if (at == size)
            break;
        uint64_t key, v;
        if (at < 0 || !file_varint(f, &key) || key >> 3 == 0 || key >> 3 > 536870911u) {
            ok = false;
            break;
        }
        unsigned num = (unsigned)(key >> 3), wire = (unsigned)(key & 7);
        off_t skip = 0;
        if (wire == 0) {
            ok = file_varint(f, &v);
        } else if (wire == 1 || wire == 5) {
            skip = wire == 1 ? 8 : 4;
        } else if (wire == 2) {
            ok = file_varint(f, &v) && (at = ftello(f)) >= 0 && v <= (uint64_t)(size - at);
            skip = ok ? (off_t)v : 0;
        } else {
            ok = false;
        }
        if (ok && skip) {
            at = ftello(f);
            ok = at >= 0 && skip <= size - at && fseeko(f, skip, SEEK_CUR) == 0;
        }
        ir |= ok && num == 1 && wire == 0;
        graph |= ok && num == MODEL_GRAPH_FIELD && wire == 2 && skip > 0;
    }
    fclose(f);
    if (!ok || !ir || !graph) {
        snprintf(why, len, "%s", !ok ? "is not an ONNX model (not a well-formed protobuf ModelProto)"
                                      : "is not an ONNX model (no ir_version and graph)");
        return -1;
    }
    return 0;
}

/* ---- the file written back ------------------------------------------------------------------ */

struct obuf {
    unsigned char *d;
    size_t len, cap;
    bool oom;
};

static void put(struct obuf *o, const void *p, size_t n)
{
    if (o->oom)
        return;
    if (o->len + n > o->cap) {
        size_t cap = o->cap ? o->cap : 4096;
        while (cap < o->len + n)
            cap *= 2;
        unsigned char *d = realloc(o->d, cap);
        if (!d) {
            o->oom = true;
            return;
        }
        o->d = d;
        o->cap = cap;
    }
    if (n)
        memcpy(o->d + o->len, p, n);
    o->len += n;
}

static void put_varint(struct obuf *o, uint64_t v)
{
    unsigned char b[10];
    size_t n = 0;
    do {
        b[n] = (unsigned char)(v & 0x7f);
        v >>= 7;
        b[n++] |= v ? 0x80 : 0;
    } while (v);
    put(o, b, n);
}

static void put_bytes_field(struct obuf *o, unsigned field, const void *p, size_t n)
{
    put_varint(o, (uint64_t)field << 3 | 2);
    put_varint(o, n);
    put(o, p, n);
}

static bool get_varint(const unsigned char **p, const unsigned char *end, uint64_t *v)
{
    return kiln_varint_read(p, end, v) == KILN_VARINT_OK;
}

/* One field: its number and wire type, its value (for type 2: the payload) and its end. */
struct field {
    unsigned num, wire;
    uint64_t v;
    const unsigned char *start, *data, *end;
};

static bool next_field(const unsigned char **p, const unsigned char *end, struct field *f)
{
    f->start = *p;
    uint64_t key;
    if (!get_varint(p, end, &key) || key >> 3 == 0 || key >> 3 > UINT32_MAX)
        return false;
    f->num = (unsigned)(key >> 3);
    f->wire = (unsigned)(key & 7);
    f->data = *p;
    switch (f->wire) {
    case 0:
        if (!get_varint(p, end, &f->v))
            return false;
        break;
    case 1:
        if (end - *p < 8)
            return false;
        *p += 8;
        break;
    case 2:
        if (!get_varint(p, end, &f->v) || f->v > (uint64_t)(end - *p))
            return false;
        f->data = *p;
        *p += f->v;
        break;
    case 5:
        if (end - *p < 4)
            return false;
        *p += 4;
        break;
    default:
        return false; /* groups are not used by ONNX */
    }
    f->end = *p;
    return true;
}

enum {
    MODEL_GRAPH = 7,
    GRAPH_INITIALIZER = 5,
    TENSOR_DIMS = 1,
    TENSOR_DATA_TYPE = 2,
    TENSOR_FLOAT_DATA = 4,
    TENSOR_NAME = 8,
    TENSOR_RAW_DATA = 9,
    TENSOR_EXTERNAL_DATA = 13,
    TENSOR_DATA_LOCATION = 14,
    ONNX_FLOAT = 1,
};

struct writer {
    kiln_onnx_model *g;
    int replaced;
    char *err;
    size_t errlen;
};

/* The graph's parameter of that name when it is an f32 tensor of numel elements. */
static kiln_tensor *trained(const struct writer *w, const unsigned char *name, size_t nlen, int64_t numel)
{
    int np = kiln_onnx_param_count(w->g);
    for (int i = 0; i < np; i++) {
        const char *pn = kiln_onnx_param_name(w->g, i);
        kiln_tensor *t = kiln_onnx_param(w->g, i);
        if (pn && strlen(pn) == nlen && memcmp(pn, name, nlen) == 0 && t && kiln_tensor_dtype(t) == KILN_F32 &&
            kiln_tensor_numel(t) == numel)
            return t;
    }
    return NULL;
}

static int rewrite_tensor(struct writer *w, const unsigned char *p, const unsigned char *end, struct obuf *o)
{
    const unsigned char *name = NULL;
    size_t nlen = 0;
    uint64_t dtype = 0;
    int64_t numel = 1;
    struct field f;
    for (const unsigned char *q = p; q < end;) {
        if (!next_field(&q, end, &f))
            return -1;
        if (f.num == TENSOR_NAME && f.wire == 2) {
            name = f.data;
            nlen = (size_t)f.v;
        } else if (f.num == TENSOR_DATA_TYPE && f.wire == 0) {
            dtype = f.v;
        } else if (f.num == TENSOR_DIMS && f.wire == 0) {
            numel *= (int64_t)f.v;
        } else if (f.num == TENSOR_DIMS && f.wire == 2) {
            for (const unsigned char *d = f.data; d < f.end;) {
                uint64_t v;
                if (!get_varint(&d, f.end, &v))
                    return -1;
                numel *= (int64_t)v;
            }
        }
    }
    kiln_tensor *t = name && dtype == ONNX_FLOAT ? trained(w, name, nlen, numel) : NULL;
    if (!t) {
        put(o, p, (size_t)(end - p));
        return 0;
    }
    for (const unsigned char *q = p; q < end;) {
        next_field(&q, end, &f);
        if (f.num != TENSOR_FLOAT_DATA && f.num != TENSOR_RAW_DATA && f.num != TENSOR_EXTERNAL_DATA &&
            f.num != TENSOR_DATA_LOCATION)
            put(o, f.start, (size_t)(f.end - f.start));
    }
    size_t bytes = (size_t)numel * sizeof(float);
    void *buf = malloc(bytes ? bytes : 1);
    if (!buf || kiln_to_data(t, buf, bytes) != 0) {
        snprintf(w->err, w->errlen, "reading trained initializer '%.*s': %s", (int)(nlen < 100 ? nlen : 100),
                 (const char *)name, buf ? kiln_error() : "out of memory");
        free(buf);
        return -2;
    }
    put_bytes_field(o, TENSOR_RAW_DATA, buf, bytes);
    free(buf);
    w->replaced++;
    return 0;
}

/* Copies the message in [p, end), sending the fields numbered `nested` through fn. */
static int rewrite(struct writer *w, const unsigned char *p, const unsigned char *end, unsigned nested,
                   int (*fn)(struct writer *, const unsigned char *, const unsigned char *, struct obuf *),
                   struct obuf *o)
{
    struct field f;
    while (p < end) {
        if (!next_field(&p, end, &f))
            return -1;
        if (f.num != nested || f.wire != 2) {
            put(o, f.start, (size_t)(f.end - f.start));
            continue;
        }
        struct obuf sub = {0};
        int rc = fn(w, f.data, f.end, &sub);
        if (rc == 0 && !sub.oom)
            put_bytes_field(o, f.num, sub.d, sub.len);
        free(sub.d);
        if (rc != 0)
            return rc;
        if (sub.oom)
            o->oom = true;
    }
    return 0;
}

static int rewrite_graph(struct writer *w, const unsigned char *p, const unsigned char *end, struct obuf *o)
{
    return rewrite(w, p, end, GRAPH_INITIALIZER, rewrite_tensor, o);
}

static unsigned char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    unsigned char *d = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (d = malloc((size_t)n + 1)) != NULL &&
        fread(d, 1, (size_t)n, f) != (size_t)n) {
        free(d);
        d = NULL;
    }
    fclose(f);
    *len = n > 0 ? (size_t)n : 0;
    return d;
}

int kd_trainer_onnx_write(kiln_module *model, const char *src, const char *dst, char *err, size_t errlen)
{
    struct onnx_mod *om = kiln_module_self(model);
    size_t len = 0;
    unsigned char *in = read_file(src, &len);
    if (!in) {
        snprintf(err, errlen, "reading %.300s: %.100s", src, strerror(errno));
        return -1;
    }
    struct writer w = {om->g, 0, err, errlen};
    struct obuf out = {0};
    int rc = rewrite(&w, in, in + len, MODEL_GRAPH, rewrite_graph, &out);
    free(in);
    if (rc == -1)
        snprintf(err, errlen, "%.300s: not a protobuf ONNX model this writer can re-encode", src);
    else if (rc == 0 && out.oom)
        snprintf(err, errlen, "out of memory");
    else if (rc == 0 && w.replaced == 0)
        snprintf(err, errlen, "%.300s: no float initializer matched the trained parameters", src);
    if (rc != 0 || out.oom || w.replaced == 0) {
        free(out.d);
        return -1;
    }
    FILE *f = fopen(dst, "wb");
    bool ok = f && fwrite(out.d, 1, out.len, f) == out.len;
    if (f && fclose(f) != 0)
        ok = false;
    free(out.d);
    if (!ok) {
        snprintf(err, errlen, "writing %.300s: %.100s", dst, strerror(errno));
        return -1;
    }
    return 0;
}
