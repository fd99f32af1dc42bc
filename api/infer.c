/*
 * api/infer.c — the KServe v2 inference codec's request side: request JSON (or a JSON header
 * followed by binary tensor data) into host tensors. The response side is infer-response.c.
 *
 * Every size the client states is checked against the model's config and the configured limits
 * before anything is allocated from it: the shape's element count (overflow-checked) against
 * limits.max_tensor_elements, the batch dim against max_batch_size, the data's element count
 * against the shape, binary_data_size against what the shape needs and what the body holds.
 * JSON "data" may be flat, or nested exactly as the shape says (row-major either way); BOOL
 * takes true/false, integers must be whole numbers in range for their datatype, floats must be
 * finite in their datatype. FP16 and BF16 values arrive as JSON numbers and are sent on as f32;
 * the worker casts them to the model's dtype.
 *
 * The JSON is read with the in-place scanner of jscan.h, in two passes and no tree: the first
 * checks the whole document and notes where the members it needs start; the second converts
 * each "data" array straight into its tensor buffer. A tree of one node per number used to cost
 * more than the model's run.
 *
 * Served by kilnd, the two passes are split between threads (kd_infer_data): the I/O loop
 * runs the first with the inputs' "data" arrays skipped by their brackets alone, checks the rest
 * and queues the request; the worker that runs it checks and converts those arrays. Number
 * parsing was most of the loop's time, and one loop thread was kilnd's limit on small requests.
 * Errors stay what one thread would answer: a syntax error anywhere wins over any other error,
 * so every failure path with unchecked arrays (on the loop or the worker) first runs the strict
 * pass over the whole document (check_syntax), which also finds the same first error; and an
 * error the loop finds after some inputs first converts those, whose bad data came first.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "classify.h"
#include "common/utf8.h"
#include "jscan.h"
#include "serving.h"
#include "shm.h"

#define FAIL(status, ...)                         \
    do {                                          \
        snprintf(msg, msglen, __VA_ARGS__);       \
        rc = (status);                            \
        goto done;                                \
    } while (0)

/* Where an input object's members start (NULL: absent; a repeated key is refused). */
struct in_desc {
    bool is_object;
    const char *name, *datatype, *shape, *data, *params;
};

int kd_infer_find_spec(const kd_model_tensor_spec *specs, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(specs[i].name, name) == 0)
            return i;
    return -1;
}

const char *kd_infer_input_list(const kd_model_config *c, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < c->ninputs && at < len; i++) {
        int w = snprintf(buf + at, len - at, "%s%s", i ? ", " : "", c->inputs[i].name);
        at += w > 0 ? (size_t)w : 0;
    }
    return buf;
}

/* The bytes per element a client sends for a KServe datatype (0: not a fixed-size type). */
static size_t wire_size(const char *dt)
{
    static const struct {
        const char *name;
        size_t size;
    } t[] = {{"BOOL", 1}, {"UINT8", 1}, {"INT8", 1}, {"UINT16", 2}, {"INT16", 2}, {"FP16", 2}, {"BF16", 2},
             {"UINT32", 4}, {"INT32", 4}, {"FP32", 4}, {"UINT64", 8}, {"INT64", 8}, {"FP64", 8}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (strcmp(t[i].name, dt) == 0)
            return t[i].size;
    return 0;
}

static bool known_datatype(const char *dt)
{
    return wire_size(dt) != 0 || strcmp(dt, "BYTES") == 0;
}

/* ---- reading the already validated document ---------------------------------------------- */

static void scan_at(struct kd_jscan *s, const char *at, const char *end)
{
    kd_jscan_init(s, at, (size_t)(end - at));
}

/*
 * The string value at `at` into out: its length, -1 when it is not a string (or holds a NUL,
 * which no name can), -2 when longer than cap - 1.
 */
static long string_at(const char *at, const char *end, char *out, size_t cap)
{
    struct kd_jscan s;
    out[0] = '\0';
    if (!at)
        return -1;
    scan_at(&s, at, end);
    if (kd_jscan_peek(&s) != KD_J_STRING)
        return -1;
    long n = kd_jscan_string(&s, out, cap);
    return n >= 0 && strlen(out) != (size_t)n ? -1 : n;
}

static enum kd_jtype type_at(const char *at, const char *end)
{
    struct kd_jscan s;
    if (!at)
        return KD_J_NONE;
    scan_at(&s, at, end);
    return kd_jscan_peek(&s);
}

/* Whether the number at p is a whole number too large for a shape: beyond limit, or beyond 64 bits. */
static bool dim_too_large(const char *p, const char *end, int64_t limit)
{
    double d;
    return kd_json_to_f64(p, end, &d) > 0 && d == floor(d) && d > (double)limit;
}

/* Where the value of key starts in the object at `at` (checked: no key repeats), or NULL. */
static const char *member_at(const char *at, const char *end, const char *key)
{
    struct kd_jscan s;
    char k[64];
    int r;
    if (type_at(at, end) != KD_J_OBJECT)
        return NULL;
    scan_at(&s, at, end);
    kd_jscan_object_begin(&s);
    for (int i = 0; (r = kd_jscan_member(&s, i, k, sizeof k)) > 0; i++) {
        if (strcmp(k, key) == 0) {
            kd_jscan_peek(&s);
            return s.p;
        }
        if (kd_jscan_skip(&s) != 0)
            return NULL;
    }
    return NULL;
}

/*
 * The first pass: checks the whole document's syntax and notes where the members the decoder
 * needs start, without converting anything. The second pass reads from those places.
 */
struct doc {
    const char *id, *inputs, *outputs, *params;
    int ninputs; /* in the request, may exceed KD_SCHED_MAX_IO */
    struct in_desc in[KD_SCHED_MAX_IO];
    bool lax;                                       /* the inputs' "data" arrays are skipped unchecked */
    int nlax;
    const char *lax_at[KD_SCHED_MAX_IO]; /* those arrays */
};

static void note(struct kd_jscan *s, const char **slot)
{
    kd_jscan_peek(s);
    if (!*slot)
        *slot = s->p;
}

/* doc is NULL for an input past KD_SCHED_MAX_IO (the request is refused; only its syntax counts). */
static int walk_input(struct kd_jscan *s, struct in_desc *d, struct doc *doc)
{
    char key[16];
    int r;
    struct kd_jkeys keys;
    if (kd_jscan_peek(s) != KD_J_OBJECT)
        return kd_jscan_skip(s);
    d->is_object = true;
    kd_jscan_object_begin_keys(s, &keys);
    for (int i = 0; (r = kd_jscan_member(s, i, key, sizeof key)) > 0; i++) {
        if (doc && doc->lax && !d->data && strcmp(key, "data") == 0 && kd_jscan_peek(s) == KD_J_ARRAY) {
            note(s, &d->data);
            doc->lax_at[doc->nlax++] = d->data; /* at most one per input */
            if (kd_jscan_skip_lax(s) != 0)
                return -1;
            continue;
        }
        const char **slot = strcmp(key, "name") == 0       ? &d->name
                            : strcmp(key, "datatype") == 0 ? &d->datatype
                            : strcmp(key, "shape") == 0    ? &d->shape
                            : strcmp(key, "data") == 0     ? &d->data
                            : strcmp(key, "parameters") == 0 ? &d->params
                                                             : NULL;
        if (slot)
            note(s, slot);
        if (kd_jscan_skip(s) != 0)
            return -1;
    }
    return r;
}

static int walk_doc(struct kd_jscan *s, struct doc *doc)
{
    char key[16];
    int r;
    struct kd_jkeys keys; /* a repeated key would be read first-wins here, last-wins elsewhere */
    kd_jscan_object_begin_keys(s, &keys);
    for (int i = 0; (r = kd_jscan_member(s, i, key, sizeof key)) > 0; i++) {
        if (strcmp(key, "inputs") == 0 && !doc->inputs) {
            note(s, &doc->inputs);
            if (kd_jscan_peek(s) != KD_J_ARRAY) {
                if (kd_jscan_skip(s) != 0)
                    return -1;
                continue;
            }
            kd_jscan_array_begin(s);
            for (int k = 0; (r = kd_jscan_element(s, k)) > 0; k++, doc->ninputs++) {
                struct in_desc scratch = {0};
                bool kept = doc->ninputs < KD_SCHED_MAX_IO;
                if (walk_input(s, kept ? &doc->in[doc->ninputs] : &scratch, kept ? doc : NULL) != 0)
                    return -1;
            }
            if (r < 0)
                return -1;
            continue;
        }
        const char **slot = strcmp(key, "id") == 0           ? &doc->id
                            : strcmp(key, "outputs") == 0    ? &doc->outputs
                            : strcmp(key, "parameters") == 0 ? &doc->params
                                                             : NULL;
        if (slot)
            note(s, slot);
        if (kd_jscan_skip(s) != 0)
            return -1;
    }
    return r < 0 ? -1 : kd_jscan_finish(s);
}

/* The strict first pass over the whole document: 0 when it is valid JSON, else 400 with msg. */
static int check_syntax(const char *body, const char *jend, char *msg, size_t msglen)
{
    struct doc doc = {0};
    struct kd_jscan s;
    kd_jscan_init(&s, body, (size_t)(jend - body));
    if (kd_jscan_peek(&s) != KD_J_OBJECT) {
        snprintf(msg, msglen, "request body is not a JSON object");
        return 400;
    }
    if (walk_doc(&s, &doc) == 0)
        return 0;
    snprintf(msg, msglen, "request body is not valid JSON: %s at byte %zu", s.err ? s.err : "?", s.err_at);
    return 400;
}

/* ---- tensor data -------------------------------------------------------------------------- */

struct dec {
    struct kd_jscan s;
    kiln_dtype dt;
    bool fp16;                  /* FP16 sent on as f32: its range is checked here */
    void *dst;
    int64_t n, cap;
    const int64_t *shape;
    int ndim;
    bool nested;
    const char *bad;
};

static int put_elem(struct dec *d)
{
    const char *p = d->s.p, *end = d->s.end;
    long len = 0;
    size_t ilen = 0;
    int64_t iv = 0;
    if (d->n >= d->cap) {
        d->bad = "more data elements than the shape holds";
        return -1;
    }
    switch (d->dt) {
    case KILN_BOOL:
        if (end - p >= 4 && memcmp(p, "true", 4) == 0) {
            ((uint8_t *)d->dst)[d->n] = 1;
            len = 4;
        } else if (end - p >= 5 && memcmp(p, "false", 5) == 0) {
            ((uint8_t *)d->dst)[d->n] = 0;
            len = 5;
        } else {
            d->bad = "BOOL data must be true or false";
            return -1;
        }
        break;
    case KILN_F32: {
        float f;
        len = kd_json_to_f32(p, end, &f);
        if (len > 0 && (isinf(f) || (d->fp16 && fabsf(f) >= 65520.0f))) {
            d->bad = d->fp16 ? "FP16 data must be finite and within +-65504"
                             : "FP32 data must be finite and within the FP32 range";
            return -1;
        }
        ((float *)d->dst)[d->n] = f;
        break;
    }
    case KILN_F64: {
        double v;
        len = kd_json_to_f64(p, end, &v);
        if (len > 0 && isinf(v)) {
            d->bad = "FP64 data must be finite and within the FP64 range";
            return -1;
        }
        ((double *)d->dst)[d->n] = v;
        break;
    }
    case KILN_I64:
        len = kd_json_to_int(p, end, INT64_MIN, INT64_MAX, &iv, &ilen);
        if (len == -2)
            d->bad = "INT64 data must be integers in range";
        else
            ((int64_t *)d->dst)[d->n] = iv;
        break;
    case KILN_I32:
        len = kd_json_to_int(p, end, INT32_MIN, INT32_MAX, &iv, &ilen);
        if (len == -2)
            d->bad = "INT32 data must be integers in range";
        else
            ((int32_t *)d->dst)[d->n] = (int32_t)iv;
        break;
    case KILN_U8:
        len = kd_json_to_int(p, end, 0, 255, &iv, &ilen);
        if (len == -2)
            d->bad = "UINT8 data must be integers in 0..255";
        else
            ((uint8_t *)d->dst)[d->n] = (uint8_t)iv;
        break;
    default:
        d->bad = "unsupported datatype";
        return -1;
    }
    if (len <= 0) {
        if (!d->bad)
            d->bad = len == -1 ? "out of memory" : "data elements must be numbers";
        return -1;
    }
    d->s.p += len;
    d->n++;
    return 0;
}

/*
 * Data is flat, or nested exactly as the shape says (each level's length equal to its dim),
 * row-major either way.
 */
static int walk_data(struct dec *d, int level)
{
    int r;
    int64_t count = 0;
    kd_jscan_array_begin(&d->s);
    for (; (r = kd_jscan_element(&d->s, count > 0)) > 0; count++) {
        if (kd_jscan_peek(&d->s) == KD_J_ARRAY) {
            if (level == 0 && count == 0)
                d->nested = true;
            if (!d->nested || level + 1 >= d->ndim) {
                d->bad = "nested data must follow the shape (or be flat)";
                return -1;
            }
            if (walk_data(d, level + 1) != 0)
                return -1;
        } else {
            if (d->nested && level != d->ndim - 1) {
                d->bad = "nested data must follow the shape (or be flat)";
                return -1;
            }
            if (put_elem(d) != 0)
                return -1;
        }
    }
    if (r < 0) {
        d->bad = "malformed data";
        return -1;
    }
    if (d->nested && count != d->shape[level]) {
        d->bad = "nested data must follow the shape (or be flat)";
        return -1;
    }
    return 0;
}

/* Fills input f->input of r: copies its binary data, or checks and converts its "data" array. */
static int fill_one(const struct kd_infer_data *dd, int i, const kd_model_config *c, struct kd_sched_request *r,
                    char *msg, size_t msglen)
{
    int k = dd->fill[i].input;
    struct kd_sched_tensor *t = &r->inputs[k];
    const char *name = c->inputs[k].name;
    if (!dd->fill[i].json) {
        memcpy(t->data, dd->fill[i].bin, t->nbytes);
        return 0;
    }
    int64_t numel = 1;
    for (int d = 0; d < t->ndim; d++)
        numel *= t->shape[d];
    struct dec d = {.dt = t->dtype, .fp16 = dd->fill[i].fp16, .dst = t->data, .cap = numel, .shape = t->shape,
                    .ndim = t->ndim};
    scan_at(&d.s, dd->fill[i].json, dd->jend);
    if (walk_data(&d, 0) != 0) {
        snprintf(msg, msglen, "input '%s': %s", name, d.bad);
        return 400;
    }
    if (d.n != numel) {
        snprintf(msg, msglen, "input '%s': shape holds %lld elements but data has %lld", name, (long long)numel,
                 (long long)d.n);
        return 400;
    }
    return 0;
}

int kd_infer_fill(const struct kd_infer_data *dd, const kd_model_config *c, struct kd_sched_request *r, char *msg,
                  size_t msglen)
{
    for (int i = 0; i < dd->n; i++) {
        int st = fill_one(dd, i, c, r, msg, msglen);
        if (st != 0)
            return dd->nlax && check_syntax(dd->body, dd->jend, msg, msglen) ? 400 : st;
    }
    /* A converted array was checked as it was read; one nobody reads (an input that has binary
     * data too) is checked here, at the depth it sits at in the document. */
    for (int j = 0; j < dd->nlax; j++) {
        bool converted = false;
        for (int i = 0; i < dd->n && !converted; i++)
            converted = dd->fill[i].json == dd->lax[j];
        struct kd_jscan s;
        scan_at(&s, dd->lax[j], dd->jend);
        s.depth = 3; /* the body's object, "inputs", the input's object */
        if (!converted && kd_jscan_skip(&s) != 0 && check_syntax(dd->body, dd->jend, msg, msglen) != 0)
            return 400;
    }
    return 0;
}

/* A whole number in 0..INT64_MAX at `at` into *v; false when it is not one. */
static bool count_at(const char *at, const char *end, uint64_t *v)
{
    int64_t x;
    size_t len;
    if (!at || kd_json_to_int(at, end, 0, INT64_MAX, &x, &len) <= 0)
        return false;
    *v = (uint64_t)x;
    return true;
}

int kd_infer_check_classes(const kd_model_config *c, int k, int64_t count, bool in_shm, char *msg, size_t msglen)
{
    const kd_model_tensor_spec *o = &c->outputs[k];
    if (count < 1 || count > KD_CLASSIFY_MAX_COUNT) {
        snprintf(msg, msglen, "output '%s': classification must be a whole number of classes from 1 to %lld",
                 o->name, (long long)KD_CLASSIFY_MAX_COUNT);
        return 400;
    }
    if (!kd_classify_datatype_ok(o->datatype)) {
        snprintf(msg, msglen, "output '%s' is %s: classification ranks numbers", o->name, o->datatype);
        return 400;
    }
    if (in_shm) {
        snprintf(msg, msglen,
                 "output '%s': classification answers strings, which are not written into shared memory; "
                 "leave out its shared_memory_region",
                 o->name);
        return 400;
    }
    return 0;
}

/* A "parameters" member, where one is given, must be an object; a flag it carries (binary_data,
 * binary_data_output) must be true or false. what names the place ("the request", "output 'y'"). */
static int check_params(const char *params, const char *jend, const char *what, const char *flag, char *msg,
                        size_t msglen)
{
    if (!params)
        return 0;
    if (type_at(params, jend) != KD_J_OBJECT) {
        snprintf(msg, msglen, "%s: \"parameters\" must be an object", what);
        return 400;
    }
    enum kd_jtype f = flag ? type_at(member_at(params, jend, flag), jend) : KD_J_NONE;
    if (f != KD_J_NONE && f != KD_J_TRUE && f != KD_J_FALSE) {
        snprintf(msg, msglen, "%s: parameters.%s must be true or false", what, flag);
        return 400;
    }
    return 0;
}

/*
 * A tensor's shared_memory_region / _offset / _byte_size parameters (Triton's system shared-memory
 * extension): 0 with *in_shm false when it names no region; 0 with the slice retained into *out;
 * or 400 with msg. An input's byte size must be exactly need.
 */
static int shm_params(const struct kd_infer_ctx *ic, const char *params, const char *jend, const char *tensor,
                      bool is_input, uint64_t need, bool *in_shm, struct kd_shm_slice *out, char *msg,
                      size_t msglen)
{
    const char *region = params ? member_at(params, jend, "shared_memory_region") : NULL;
    *in_shm = region != NULL;
    if (!region)
        return 0;
    char what[KD_MODEL_NAME_MAX + 16];
    snprintf(what, sizeof what, "%s '%s'", is_input ? "input" : "output", tensor);
    char name[KD_SHM_NAME_MAX + 1];
    uint64_t offset = 0, size = 0;
    const char *off_at = member_at(params, jend, "shared_memory_offset");
    if (string_at(region, jend, name, sizeof name) < 0) {
        snprintf(msg, msglen, "%s: shared_memory_region must be a string naming a registered region", what);
        return 400;
    }
    if (!count_at(member_at(params, jend, "shared_memory_byte_size"), jend, &size) ||
        (off_at && !count_at(off_at, jend, &offset))) {
        snprintf(msg, msglen,
                 "%s: shared_memory_byte_size (and shared_memory_offset, if given) must be "
                 "non-negative integers",
                 what);
        return 400;
    }
    if (!ic->shm || !ic->use) {
        snprintf(msg, msglen, "%s: shared memory is not available here", what);
        return 400;
    }
    if (out->region) {
        snprintf(msg, msglen, "%s is requested twice", what);
        return 400;
    }
    if (is_input && size != need) {
        snprintf(msg, msglen, "%s: shared_memory_byte_size is %llu; its shape and datatype need %llu", what,
                 (unsigned long long)size, (unsigned long long)need);
        return 400;
    }
    return kd_shm_slice_get(ic->shm, name, offset, size, what, out, msg, msglen);
}

int kd_infer_decode(const struct kd_infer_ctx *ic, const kd_model_config *c, const struct kd_request *req,
                    struct kd_sched_request *r, struct kd_output_asks *asks, char *id, size_t idlen,
                    struct kd_infer_data *dd, char *msg, size_t msglen)
{
    int rc = 0;
    size_t json_len = req->body_len;
    const char *ihcl = req->headers ? req->headers->inference_header_length : "";
    if (ihcl[0]) {
        char *end;
        unsigned long long v = strtoull(ihcl, &end, 10);
        if (*end || ihcl[0] == '-' || v > req->body_len) {
            snprintf(msg, msglen, "Inference-Header-Content-Length must be an integer no larger than the body");
            return 400;
        }
        json_len = (size_t)v;
    }
    const char *body = req->body ? req->body : "";
    const char *jend = body + (req->body ? json_len : 0);
    const char *bin = req->body ? req->body + json_len : NULL;
    size_t bin_len = req->body_len - json_len, bin_used = 0;
    struct doc doc = {.lax = dd != NULL};
    /* Filled here when the caller leaves it to no one. */
    struct kd_infer_data now = {.body = body, .jend = jend};
    struct kd_infer_data *fill = dd ? dd : &now;
    *fill = (struct kd_infer_data){.body = body, .jend = jend};
    bool unchecked = false;     /* arrays were skipped unchecked, so a syntax error may still hide */
    struct kd_jscan s;
    kd_jscan_init(&s, body, (size_t)(jend - body));
    if (kd_jscan_peek(&s) != KD_J_OBJECT)
        FAIL(400, "request body is not a JSON object");
    if (walk_doc(&s, &doc) != 0) {
        if (!(doc.lax && check_syntax(body, jend, msg, msglen) != 0))
            snprintf(msg, msglen, "request body is not valid JSON: %s at byte %zu", s.err ? s.err : "?", s.err_at);
        /* tritonclient adds the header to the headers dict a caller passed for a binary
         * request: a JSON request sent with that dict again is cut at the old length */
        size_t used = strlen(msg);
        if (ihcl[0] && used < msglen)
            snprintf(
                msg + used, msglen - used,
                " (Inference-Header-Content-Length says the JSON is the first %zu bytes of this %zu-byte body;"
                " a header left from an earlier binary request?)",
                json_len, req->body_len);
        rc = 400;
        goto done;
    }
    unchecked = doc.nlax > 0;
    if (doc.id) {
        long n = string_at(doc.id, jend, id, idlen);
        if (n < 0 || n > ic->max_string_bytes) {
            id[0] = '\0';
            FAIL(400, "\"id\" must be a string of at most %lld bytes", (long long)ic->max_string_bytes);
        }
        /* the id is echoed in the answer: other bytes than UTF-8 would make it invalid JSON */
        if (kiln_utf8_invalid_at((const unsigned char *)id, strlen(id)) >= 0) {
            id[0] = '\0';
            FAIL(400, "\"id\" must be valid UTF-8");
        }
    }
    if (type_at(doc.inputs, jend) != KD_J_ARRAY)
        FAIL(400, "\"inputs\" must be an array");
    /* Named before counted: for a duplicate or a misspelt name, the name is
     * what the client needs, and "takes 1 input(s), the request has 2" did not
     * give it. An entry that is not an object with a string name is left to the
     * loop below, which says so. */
    for (int i = 0; i < doc.ninputs && i < KD_SCHED_MAX_IO; i++) {
        char name[KD_MODEL_NAME_MAX + 1], other[KD_MODEL_NAME_MAX + 1];
        if (!doc.in[i].is_object || string_at(doc.in[i].name, jend, name, sizeof name) < 0)
            continue;
        if (kd_infer_find_spec(c->inputs, c->ninputs, name) < 0) {
            char list[512];
            FAIL(400, "the model has no input '%.64s' (its inputs: %s)", name,
                 kd_infer_input_list(c, list, sizeof list));
        }
        for (int j = 0; j < i; j++)
            if (doc.in[j].is_object && string_at(doc.in[j].name, jend, other, sizeof other) >= 0 &&
                strcmp(name, other) == 0)
                FAIL(400, "input '%.64s' is given twice", name);
    }
    if (doc.ninputs != c->ninputs) {
        /* every name given is the model's and given once (above): so one of the model's is missing */
        for (int k = 0; k < c->ninputs; k++) {
            bool given = false;
            for (int i = 0; i < doc.ninputs && i < KD_SCHED_MAX_IO && !given; i++) { /* the entries noted */
                char name[KD_MODEL_NAME_MAX + 1];
                given = doc.in[i].is_object && string_at(doc.in[i].name, jend, name, sizeof name) >= 0 &&
                        strcmp(name, c->inputs[k].name) == 0;
            }
            if (!given)
                FAIL(400, "input '%.64s' is missing: the model takes %d input(s), the request has %d",
                     c->inputs[k].name, c->ninputs, doc.ninputs);
        }
        FAIL(400, "the model takes %d input(s), the request has %d", c->ninputs, doc.ninputs);
    }
    r->ninputs = c->ninputs;
    int64_t batch = -1;
    for (int i = 0; i < doc.ninputs; i++) {
        const struct in_desc *in = &doc.in[i];
        char name[KD_MODEL_NAME_MAX + 1], dtname[16];
        long nl = in->is_object ? string_at(in->name, jend, name, sizeof name) : -1;
        long dl = in->is_object ? string_at(in->datatype, jend, dtname, sizeof dtname) : -1;
        if (nl == -1 || dl == -1 || type_at(in->shape, jend) != KD_J_ARRAY)
            FAIL(400, "each input needs \"name\", \"datatype\" and \"shape\"");
        int k = nl < 0 ? -1 : kd_infer_find_spec(c->inputs, c->ninputs, name);
        if (k < 0)
            FAIL(400, "the model has no input '%.64s'", name);
        if (r->inputs[k].data)
            FAIL(400, "input '%.64s' is given twice", name);
        const kd_model_tensor_spec *sp = &c->inputs[k];
        if (dl < 0 || !known_datatype(dtname))
            FAIL(400, "unknown datatype '%.32s'", dtname);
        if (strcmp(dtname, sp->datatype) != 0)
            FAIL(400, "input '%s' has datatype %.32s; the model expects %s", sp->name, dtname, sp->datatype);
        struct kd_sched_tensor *t = &r->inputs[k];
        int nd = 0, sr, bad_dim = -1;
        int64_t numel = 1;
        struct kd_jscan ss;
        scan_at(&ss, in->shape, jend);
        kd_jscan_array_begin(&ss);
        for (; (sr = kd_jscan_element(&ss, nd)) > 0; nd++) {
            int64_t v;
            size_t vlen;
            kd_jscan_peek(&ss);
            long len = kd_json_to_int(ss.p, ss.end, 0, INT64_MAX, &v, &vlen);
            if (len <= 0 && !dim_too_large(ss.p, ss.end, ic->max_tensor_elements))
                FAIL(400, "input '%s': shape entries must be non-negative integers", sp->name);
            if (len <= 0 || v > ic->max_tensor_elements)
                FAIL(413, "input '%s': dim %d is larger than limits.max_tensor_elements (%lld)", sp->name, nd,
                     (long long)ic->max_tensor_elements);
            ss.p += len;
            if (nd >= sp->ndim)
                continue; /* counted, and refused below */
            t->shape[nd] = v;
            if (sp->shape[nd] >= 0 && sp->shape[nd] != v && bad_dim < 0)
                bad_dim = nd; /* said after the rank: [1, 784] for a 4-dim input is a rank error */
            /* both factors are at most the limit, yet their product may not fit in 64 bits */
            if (__builtin_mul_overflow(numel, v, &numel) || numel > ic->max_tensor_elements)
                FAIL(413, "input '%s' has more than limits.max_tensor_elements (%lld) elements", sp->name,
                     (long long)ic->max_tensor_elements);
        }
        if (nd != sp->ndim)
            FAIL(400, "input '%s' has %d dims; the model expects %d", sp->name, nd, sp->ndim);
        if (bad_dim >= 0)
            FAIL(400, "input '%s': dim %d is %lld; the model expects %lld", sp->name, bad_dim,
                 (long long)t->shape[bad_dim], (long long)sp->shape[bad_dim]);
        t->ndim = nd;
        if (c->max_batch_size > 0) {
            if (nd < 1 || t->shape[0] < 1 || t->shape[0] > c->max_batch_size)
                FAIL(400, "input '%s': batch dim must be 1..%d", sp->name, c->max_batch_size);
            if (batch >= 0 && t->shape[0] != batch)
                FAIL(400, "inputs disagree on the batch size");
            batch = t->shape[0];
        }
        int want = kd_sched_dtype_of(sp->datatype);
        if (want < 0)
            FAIL(400, "datatype %s is not supported", sp->datatype);
        bool half = want == KILN_F16 || want == KILN_BF16;
        char what[KD_MODEL_NAME_MAX + 16];
        snprintf(what, sizeof what, "input '%s'", sp->name);
        if ((rc = check_params(in->params, jend, what, NULL, msg, msglen)) != 0)
            goto done;
        const char *bsize = member_at(in->params, jend, "binary_data_size");
        size_t esize = wire_size(sp->datatype);
        int f = fill->n;
        bool in_shm = false;
        if ((rc = shm_params(ic, in->params, jend, sp->name, true, (uint64_t)numel * esize, &in_shm,
                             ic->use ? &ic->use->in[k] : NULL, msg, msglen)) != 0)
            goto done;
        if (in_shm) {
            if (bsize || in->data)
                FAIL(400, "input '%s' has data or binary_data_size beside shared_memory_region", sp->name);
            const void *src = kd_shm_slice_ptr(&ic->use->in[k], msg, msglen);
            if (!src) {
                rc = 400; /* msg names the region */
                goto done;
            }
            t->dtype = (kiln_dtype)want;
            t->nbytes = (size_t)numel * esize;
            t->data = malloc(t->nbytes ? t->nbytes : 1);
            if (!t->data)
                FAIL(500, "out of memory");
            fill->fill[f].input = k;
            fill->fill[f].json = NULL;
            fill->fill[f].bin = src; /* copied by the worker; the request holds the region */
            fill->n++;
            continue;
        }
        if (bsize && in->data)
            /* one of them would be dropped without a word (Triton refuses this too) */
            FAIL(400, "input '%s' has both \"data\" and binary_data_size: give its values in one of them",
                 sp->name);
        if (bsize) {
            size_t need = (size_t)numel * esize, blen;
            int64_t got;
            if (kd_json_to_int(bsize, jend, 0, INT64_MAX, &got, &blen) <= 0 || (uint64_t)got != need)
                FAIL(400, "input '%s': binary_data_size must be %zu for its shape and datatype", sp->name, need);
            if (need > bin_len - bin_used)
                FAIL(400, "input '%s': the body holds fewer binary bytes than binary_data_size", sp->name);
            t->dtype = (kiln_dtype)want;
            t->nbytes = need;
            t->data = malloc(need ? need : 1);
            if (!t->data)
                FAIL(500, "out of memory");
            fill->fill[f].input = k;
            fill->fill[f].json = NULL;
            fill->fill[f].bin = bin + bin_used;
            fill->n++;
            bin_used += need;
            continue;
        }
        if (!in->data)
            FAIL(400, "input '%s' has neither \"data\" nor binary_data_size", sp->name);
        if (type_at(in->data, jend) != KD_J_ARRAY)
            FAIL(400, "input '%s': \"data\" must be an array", sp->name);
        t->dtype = half ? KILN_F32 : (kiln_dtype)want;
        t->nbytes = (size_t)numel * kiln_dtype_size(t->dtype);
        t->data = malloc(t->nbytes ? t->nbytes : 1);
        if (!t->data)
            FAIL(500, "out of memory");
        fill->fill[f].input = k;
        fill->fill[f].json = in->data;
        fill->fill[f].bin = NULL;
        fill->fill[f].fp16 = want == KILN_F16;
        fill->n++;
        if (!dd && (rc = fill_one(fill, f, c, r, msg, msglen)) != 0)
            goto done; /* in document order, before the next input's checks, as ever */
    }
    if (bin_used != bin_len)
        FAIL(400, "the body has %zu binary bytes no input claims", bin_len - bin_used);

    if ((rc = check_params(doc.params, jend, "the request", "binary_data_output", msg, msglen)) != 0)
        goto done;
    bool all_binary = type_at(member_at(doc.params, jend, "binary_data_output"), jend) == KD_J_TRUE;
    for (int o = 0; o < c->noutputs; o++) {
        asks->want[o] = !doc.outputs;
        asks->binary[o] = all_binary;
        asks->classes[o] = 0;
    }
    if (doc.outputs) {
        if (type_at(doc.outputs, jend) != KD_J_ARRAY)
            FAIL(400, "\"outputs\" must be an array");
        struct kd_jscan os;
        int orr;
        scan_at(&os, doc.outputs, jend);
        kd_jscan_array_begin(&os);
        for (int i = 0; (orr = kd_jscan_element(&os, i)) > 0; i++) {
            kd_jscan_peek(&os);
            const char *ro = os.p;
            char name[KD_MODEL_NAME_MAX + 1];
            if (string_at(member_at(ro, jend, "name"), jend, name, sizeof name) == -1)
                FAIL(400, "each requested output needs a \"name\"");
            int k = kd_infer_find_spec(c->outputs, c->noutputs, name);
            if (k < 0)
                FAIL(400, "unknown output '%.64s'", name);
            asks->want[k] = true;
            const char *oparams = member_at(ro, jend, "parameters");
            char what[KD_MODEL_NAME_MAX + 16];
            snprintf(what, sizeof what, "output '%s'", name);
            if ((rc = check_params(oparams, jend, what, "binary_data", msg, msglen)) != 0)
                goto done;
            bool out_shm = false;
            if ((rc = shm_params(ic, oparams, jend, name, false, 0, &out_shm, ic->use ? &ic->use->out[k] : NULL,
                                 msg, msglen)) != 0)
                goto done;
            enum kd_jtype b = type_at(member_at(oparams, jend, "binary_data"), jend);
            if (b != KD_J_NONE)
                asks->binary[k] = b == KD_J_TRUE;
            const char *classes = member_at(oparams, jend, "classification");
            if (classes) {
                int64_t count = 0;
                size_t len;
                if (kd_json_to_int(classes, jend, INT64_MIN, INT64_MAX, &count, &len) <= 0)
                    FAIL(400, "output '%s': classification must be a whole number of classes", name);
                if ((rc = kd_infer_check_classes(c, k, count, out_shm, msg, msglen)) != 0)
                    goto done;
                asks->classes[k] = count;
            }
            kd_jscan_skip(&os);
        }
    }
    if (dd) {
        dd->nlax = doc.nlax;
        memcpy(dd->lax, doc.lax_at, sizeof dd->lax);
    } else {
        for (int i = 0; i < now.n && rc == 0; i++)
            if (!now.fill[i].json)
                rc = fill_one(&now, i, c, r, msg, msglen); /* binary copies; the arrays were filled above */
    }
done:
    if (rc != 0 && unchecked && check_syntax(body, jend, msg, msglen) != 0) {
        rc = 400;
    } else if (rc != 0 && dd) {
        /* One thread would have converted the inputs before this one, and refused bad data
         * there first: so does this (only ever on the way to an error). */
        for (int i = 0; i < dd->n; i++) {
            int st = dd->fill[i].json ? fill_one(dd, i, c, r, msg, msglen) : 0;
            if (st != 0) {
                rc = st;
                break;
            }
        }
    }
    if (rc != 0)
        kd_sched_request_clear(r);
    return rc;
}
