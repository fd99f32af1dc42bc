/*
 * api/infer.c — the KServe v2 inference codec: request JSON (or a JSON header followed by binary
 * tensor data) into host tensors, and finished requests back into a response.
 *
 * Every size the client states is checked against the model's config and the configured limits
 * before anything is allocated from it: the shape's element count (overflow-checked) against
 * limits.max_tensor_elements, the batch dim against max_batch_size, the data's element count
 * against the shape, binary_data_size against what the shape needs and what the body holds.
 * JSON "data" may be flat or nested (row-major); BOOL takes true/false, integers must be exact
 * and in range for their datatype. FP16 and BF16 values arrive as JSON numbers and are sent on
 * as f32; the worker casts them to the model's dtype.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "responses.h"
#include "serving.h"

#define FAIL(status, ...)                         \
    do {                                          \
        snprintf(msg, msglen, __VA_ARGS__);       \
        rc = (status);                            \
        goto done;                                \
    } while (0)

struct walk {
    void *dst;
    kiln_dtype dt;
    int64_t n, cap;
    const char *bad;
};

static int store(struct walk *w, const cJSON *v)
{
    if (w->n >= w->cap) {
        w->bad = "more data elements than the shape holds";
        return -1;
    }
    double d;
    if (w->dt == KILN_BOOL) {
        if (!cJSON_IsBool(v)) {
            w->bad = "BOOL data must be true or false";
            return -1;
        }
        ((uint8_t *)w->dst)[w->n++] = cJSON_IsTrue(v) ? 1 : 0;
        return 0;
    }
    if (!cJSON_IsNumber(v)) {
        w->bad = "data elements must be numbers";
        return -1;
    }
    d = v->valuedouble;
    switch (w->dt) {
    case KILN_F32: ((float *)w->dst)[w->n] = (float)d; break;
    case KILN_F64: ((double *)w->dst)[w->n] = d; break;
    case KILN_I64:
        if (d != floor(d) || d < -9223372036854775808.0 || d >= 9223372036854775808.0) {
            w->bad = "INT64 data must be integers in range";
            return -1;
        }
        ((int64_t *)w->dst)[w->n] = (int64_t)d;
        break;
    case KILN_I32:
        if (d != floor(d) || d < -2147483648.0 || d > 2147483647.0) {
            w->bad = "INT32 data must be integers in range";
            return -1;
        }
        ((int32_t *)w->dst)[w->n] = (int32_t)d;
        break;
    case KILN_U8:
        if (d != floor(d) || d < 0 || d > 255) {
            w->bad = "UINT8 data must be integers in 0..255";
            return -1;
        }
        ((uint8_t *)w->dst)[w->n] = (uint8_t)d;
        break;
    default:
        w->bad = "unsupported datatype";
        return -1;
    }
    w->n++;
    return 0;
}

/* Flattens nested arrays row-major; depth is bounded by cJSON's own nesting limit. */
static int walk_data(struct walk *w, const cJSON *v)
{
    if (cJSON_IsArray(v)) {
        const cJSON *it;
        cJSON_ArrayForEach(it, v) {
            if (walk_data(w, it) != 0)
                return -1;
        }
        return 0;
    }
    return store(w, v);
}

static int find_spec(const kiln_model_tensor_spec *specs, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(specs[i].name, name) == 0)
            return i;
    return -1;
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

static const cJSON *param(const cJSON *obj, const char *key)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(obj, "parameters");
    return cJSON_IsObject(p) ? cJSON_GetObjectItemCaseSensitive(p, key) : NULL;
}

int kiln__infer_decode(const struct kiln__infer_ctx *ic, const kiln_model_config *c, const struct kiln_request *req,
                       struct kiln_sched_request *r, bool *want_output, bool *want_binary, char *id, size_t idlen,
                       char *msg, size_t msglen)
{
    int rc = 0;
    cJSON *root = NULL;
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
    const char *bin = req->body ? req->body + json_len : NULL;
    size_t bin_len = req->body_len - json_len, bin_used = 0;
    root = cJSON_ParseWithLength(req->body ? req->body : "", json_len);
    if (!root || !cJSON_IsObject(root))
        FAIL(400, "request body is not a JSON object");
    const cJSON *jid = cJSON_GetObjectItemCaseSensitive(root, "id");
    if (jid) {
        if (!cJSON_IsString(jid) || strlen(jid->valuestring) > (size_t)ic->max_string_bytes ||
            strlen(jid->valuestring) >= idlen)
            FAIL(400, "\"id\" must be a string of at most %lld bytes", (long long)ic->max_string_bytes);
        snprintf(id, idlen, "%s", jid->valuestring);
    }
    const cJSON *inputs = cJSON_GetObjectItemCaseSensitive(root, "inputs");
    if (!cJSON_IsArray(inputs))
        FAIL(400, "\"inputs\" must be an array");
    if (cJSON_GetArraySize(inputs) != c->ninputs)
        FAIL(400, "the model takes %d input(s), the request has %d", c->ninputs, cJSON_GetArraySize(inputs));
    r->ninputs = c->ninputs;
    int64_t batch = -1;
    const cJSON *in;
    cJSON_ArrayForEach(in, inputs) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(in, "name");
        const cJSON *dtj = cJSON_GetObjectItemCaseSensitive(in, "datatype");
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(in, "shape");
        if (!cJSON_IsString(name) || !cJSON_IsString(dtj) || !cJSON_IsArray(shape))
            FAIL(400, "each input needs \"name\", \"datatype\" and \"shape\"");
        int k = find_spec(c->inputs, c->ninputs, name->valuestring);
        if (k < 0)
            FAIL(400, "unknown input '%.64s'", name->valuestring);
        if (r->inputs[k].data)
            FAIL(400, "input '%.64s' given twice", name->valuestring);
        const kiln_model_tensor_spec *sp = &c->inputs[k];
        if (!known_datatype(dtj->valuestring))
            FAIL(400, "unknown datatype '%.32s'", dtj->valuestring);
        if (strcmp(dtj->valuestring, sp->datatype) != 0)
            FAIL(400, "input '%s' has datatype %.32s; the model expects %s", sp->name, dtj->valuestring, sp->datatype);
        int nd = cJSON_GetArraySize(shape);
        if (nd != sp->ndim)
            FAIL(400, "input '%s' has %d dims; the model expects %d", sp->name, nd, sp->ndim);
        struct kiln_sched_tensor *t = &r->inputs[k];
        t->ndim = nd;
        int64_t numel = 1;
        for (int d = 0; d < nd; d++) {
            const cJSON *e = cJSON_GetArrayItem(shape, d);
            if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble != floor(e->valuedouble) ||
                e->valuedouble > (double)ic->max_tensor_elements)
                FAIL(400, "input '%s': shape entries must be non-negative integers", sp->name);
            t->shape[d] = (int64_t)e->valuedouble;
            if (sp->shape[d] >= 0 && sp->shape[d] != t->shape[d])
                FAIL(400, "input '%s': dim %d is %lld; the model expects %lld", sp->name, d, (long long)t->shape[d],
                     (long long)sp->shape[d]);
            numel *= t->shape[d];
            if (numel > ic->max_tensor_elements)
                FAIL(413, "input '%s' has more than limits.max_tensor_elements (%lld) elements", sp->name,
                     (long long)ic->max_tensor_elements);
        }
        if (c->max_batch_size > 0) {
            if (nd < 1 || t->shape[0] < 1 || t->shape[0] > c->max_batch_size)
                FAIL(400, "input '%s': batch dim must be 1..%d", sp->name, c->max_batch_size);
            if (batch >= 0 && t->shape[0] != batch)
                FAIL(400, "inputs disagree on the batch size");
            batch = t->shape[0];
        }
        int want = kiln_sched_dtype_of(sp->datatype);
        if (want < 0)
            FAIL(400, "datatype %s is not supported", sp->datatype);
        bool half = want == KILN_F16 || want == KILN_BF16;
        const cJSON *bsize = param(in, "binary_data_size");
        size_t esize = wire_size(sp->datatype);
        if (bsize) {
            size_t need = (size_t)numel * esize;
            if (!cJSON_IsNumber(bsize) || bsize->valuedouble != (double)need)
                FAIL(400, "input '%s': binary_data_size must be %zu for its shape and datatype", sp->name, need);
            if (need > bin_len - bin_used)
                FAIL(400, "input '%s': the body holds fewer binary bytes than binary_data_size", sp->name);
            t->dtype = (kiln_dtype)want;
            t->nbytes = need;
            t->data = malloc(need ? need : 1);
            if (!t->data)
                FAIL(500, "out of memory");
            memcpy(t->data, bin + bin_used, need);
            bin_used += need;
            continue;
        }
        const cJSON *data = cJSON_GetObjectItemCaseSensitive(in, "data");
        if (!data)
            FAIL(400, "input '%s' has neither \"data\" nor binary_data_size", sp->name);
        t->dtype = half ? KILN_F32 : (kiln_dtype)want;
        t->nbytes = (size_t)numel * kiln_dtype_size(t->dtype);
        t->data = malloc(t->nbytes ? t->nbytes : 1);
        if (!t->data)
            FAIL(500, "out of memory");
        struct walk w = {.dst = t->data, .dt = t->dtype, .cap = numel};
        if (walk_data(&w, data) != 0)
            FAIL(400, "input '%s': %s", sp->name, w.bad);
        if (w.n != numel)
            FAIL(400, "input '%s': shape holds %lld elements but data has %lld", sp->name, (long long)numel,
                 (long long)w.n);
    }
    if (bin_used != bin_len)
        FAIL(400, "the body has %zu binary bytes no input claims", bin_len - bin_used);

    const cJSON *bdo = param(root, "binary_data_output");
    bool all_binary = cJSON_IsTrue(bdo);
    const cJSON *outs = cJSON_GetObjectItemCaseSensitive(root, "outputs");
    for (int o = 0; o < c->noutputs; o++) {
        want_output[o] = !outs;
        want_binary[o] = all_binary;
    }
    if (outs) {
        if (!cJSON_IsArray(outs))
            FAIL(400, "\"outputs\" must be an array");
        const cJSON *ro;
        cJSON_ArrayForEach(ro, outs) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(ro, "name");
            if (!cJSON_IsString(name))
                FAIL(400, "each requested output needs a \"name\"");
            int k = find_spec(c->outputs, c->noutputs, name->valuestring);
            if (k < 0)
                FAIL(400, "unknown output '%.64s'", name->valuestring);
            want_output[k] = true;
            const cJSON *b = param(ro, "binary_data");
            if (b)
                want_binary[k] = cJSON_IsTrue(b);
        }
    }
done:
    cJSON_Delete(root);
    if (rc != 0)
        kiln_sched_request_clear(r);
    return rc;
}

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023;
    float f;
    if (exp == 0)
        f = ldexpf((float)man, -24);
    else if (exp == 31)
        f = man ? NAN : INFINITY;
    else
        f = ldexpf((float)(man | 1024), (int)exp - 25);
    return sign ? -f : f;
}

static float bf16_to_float(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static int put_number(struct kiln_buf *b, double v, int digits)
{
    if (!isfinite(v))
        return kiln_buf_puts(b, "null"); /* JSON has no NaN or infinity */
    return kiln_buf_printf(b, "%.*g", digits, v);
}

static int put_values(struct kiln_buf *b, const struct kiln_sched_tensor *t)
{
    int64_t n = (int64_t)(t->nbytes / (kiln_dtype_size(t->dtype) ? kiln_dtype_size(t->dtype) : 1));
    int rc = kiln_buf_reserve(b, (size_t)n * 8);
    for (int64_t i = 0; i < n && rc == 0; i++) {
        if (i)
            rc = kiln_buf_append(b, ",", 1);
        switch (t->dtype) {
        case KILN_F32: rc |= put_number(b, ((const float *)t->data)[i], 9); break;
        case KILN_F64: rc |= put_number(b, ((const double *)t->data)[i], 17); break;
        case KILN_F16: rc |= put_number(b, half_to_float(((const uint16_t *)t->data)[i]), 5); break;
        case KILN_BF16: rc |= put_number(b, bf16_to_float(((const uint16_t *)t->data)[i]), 4); break;
        case KILN_I64: rc |= kiln_buf_printf(b, "%lld", (long long)((const int64_t *)t->data)[i]); break;
        case KILN_I32: rc |= kiln_buf_printf(b, "%d", ((const int32_t *)t->data)[i]); break;
        case KILN_U8: rc |= kiln_buf_printf(b, "%u", ((const uint8_t *)t->data)[i]); break;
        case KILN_BOOL: rc |= kiln_buf_puts(b, ((const uint8_t *)t->data)[i] ? "true" : "false"); break;
        default: rc = -1;
        }
    }
    return rc;
}

int kiln__infer_encode(struct kiln_buf *out, const char *model, int64_t version, const kiln_model_config *c,
                       const struct kiln_sched_request *r, const bool *want_output, const bool *want_binary,
                       const char *id, bool keep_alive, const char *extra_headers)
{
    struct kiln_buf j = {0};
    int rc = kiln_buf_puts(&j, "{\"model_name\":\"");
    rc |= kiln_buf_json_escape(&j, model, strlen(model));
    rc |= kiln_buf_printf(&j, "\",\"model_version\":\"%lld\"", (long long)version);
    if (id[0]) {
        rc |= kiln_buf_puts(&j, ",\"id\":\"");
        rc |= kiln_buf_json_escape(&j, id, strlen(id));
        rc |= kiln_buf_puts(&j, "\"");
    }
    rc |= kiln_buf_puts(&j, ",\"outputs\":[");
    size_t bin_total = 0;
    bool first = true;
    for (int o = 0; o < c->noutputs && o < r->noutputs && rc == 0; o++) {
        if (!want_output[o])
            continue;
        const struct kiln_sched_tensor *t = &r->outputs[o];
        rc |= kiln_buf_printf(&j, "%s{\"name\":\"", first ? "" : ",");
        first = false;
        rc |= kiln_buf_json_escape(&j, c->outputs[o].name, strlen(c->outputs[o].name));
        rc |= kiln_buf_printf(&j, "\",\"datatype\":\"%s\",\"shape\":[", c->outputs[o].datatype);
        for (int d = 0; d < t->ndim; d++)
            rc |= kiln_buf_printf(&j, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        if (want_binary[o]) {
            rc |= kiln_buf_printf(&j, "],\"parameters\":{\"binary_data_size\":%zu}}", t->nbytes);
            bin_total += t->nbytes;
        } else {
            rc |= kiln_buf_puts(&j, "],\"data\":[");
            rc |= put_values(&j, t);
            rc |= kiln_buf_puts(&j, "]}");
        }
    }
    rc |= kiln_buf_puts(&j, "]}");
    size_t json_len = j.len;
    for (int o = 0; o < c->noutputs && o < r->noutputs && rc == 0; o++)
        if (want_output[o] && want_binary[o])
            rc |= kiln_buf_append(&j, r->outputs[o].data, r->outputs[o].nbytes);
    int status = -1;
    if (rc == 0) {
        char hdr[512];
        if (bin_total)
            snprintf(hdr, sizeof hdr, "Inference-Header-Content-Length: %zu\r\n%s", json_len,
                     extra_headers ? extra_headers : "");
        status = kiln_resp_append(out, 200, bin_total ? "application/octet-stream" : "application/json", j.data,
                                  j.len, keep_alive, bin_total ? hdr : extra_headers);
    }
    kiln_buf_free(&j);
    return status;
}
