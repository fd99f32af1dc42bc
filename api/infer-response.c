/*
 * api/infer-response.c — a finished inference request written back as a KServe v2 response:
 * the JSON body (outputs' values as JSON, or their place when they go as binary data or into a
 * shared-memory region), followed by the binary outputs, and the HTTP framing that tells a
 * client where the JSON ends (Inference-Header-Content-Length).
 *
 * Outputs asked as classes (the classification extension) are ranked first, so their strings
 * can be the JSON's data or follow it as binary like any other output.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "classify.h"
#include "common/half.h"
#include "responses.h"
#include "serving.h"
#include "shm.h"

static int put_number(struct kd_buf *b, double v, int digits)
{
    if (!isfinite(v))
        return kd_buf_puts(b, "null"); /* JSON has no NaN or infinity */
    return kd_buf_printf(b, "%.*g", digits, v);
}

static int put_values(struct kd_buf *b, const struct kd_sched_tensor *t)
{
    int64_t n = (int64_t)(t->nbytes / (kiln_dtype_size(t->dtype) ? kiln_dtype_size(t->dtype) : 1));
    int rc = kd_buf_reserve(b, (size_t)n * 8);
    for (int64_t i = 0; i < n && rc == 0; i++) {
        if (i)
            rc = kd_buf_append(b, ",", 1);
        switch (t->dtype) {
        case KILN_F32: rc |= put_number(b, ((const float *)t->data)[i], 9); break;
        case KILN_F64: rc |= put_number(b, ((const double *)t->data)[i], 17); break;
        case KILN_F16: rc |= put_number(b, kiln_f16_to_f32(((const uint16_t *)t->data)[i]), 5); break;
        case KILN_BF16: rc |= put_number(b, kiln_bf16_to_f32(((const uint16_t *)t->data)[i]), 4); break;
        case KILN_I64: rc |= kd_buf_printf(b, "%lld", (long long)((const int64_t *)t->data)[i]); break;
        case KILN_I32: rc |= kd_buf_printf(b, "%d", ((const int32_t *)t->data)[i]); break;
        case KILN_U8: rc |= kd_buf_printf(b, "%u", ((const uint8_t *)t->data)[i]); break;
        case KILN_BOOL: rc |= kd_buf_puts(b, ((const uint8_t *)t->data)[i] ? "true" : "false"); break;
        default: rc = -1;
        }
    }
    return rc;
}

int kd_infer_body(struct kd_buf *j, const char *model, int64_t version, const kd_model_config *c,
                  const struct kd_sched_request *r, const struct kd_output_asks *asks,
                  const struct kd_shm_use *shm, const char *id, size_t *json_len)
{
    /* outputs asked as classes, computed first: their strings are the JSON's data or follow it */
    struct kd_classes classes[KD_SCHED_MAX_IO]; /* only those of outputs asked as classes are set */
    int rc = 0;
    for (int o = 0; o < c->noutputs && o < r->noutputs; o++)
        if (asks->want[o] && asks->classes[o] > 0) {
            if (rc == 0)
                rc = kd_classify(&r->outputs[o], c->max_batch_size > 0, asks->classes[o],
                                 (const char *const *)c->outputs[o].labels, c->outputs[o].nlabels, &classes[o]);
            else
                memset(&classes[o], 0, sizeof classes[o]); /* freed below with the others */
        }
    rc |= kd_buf_puts(j, "{\"model_name\":\"");
    rc |= kd_buf_json_escape(j, model, strlen(model));
    rc |= kd_buf_printf(j, "\",\"model_version\":\"%lld\"", (long long)version);
    if (id[0]) {
        rc |= kd_buf_puts(j, ",\"id\":\"");
        rc |= kd_buf_json_escape(j, id, strlen(id));
        rc |= kd_buf_puts(j, "\"");
    }
    rc |= kd_buf_puts(j, ",\"outputs\":[");
    bool first = true;
    for (int o = 0; o < c->noutputs && o < r->noutputs && rc == 0; o++) {
        if (!asks->want[o])
            continue;
        const struct kd_sched_tensor *t = &r->outputs[o];
        const struct kd_classes *cl = asks->classes[o] > 0 ? &classes[o] : NULL;
        rc |= kd_buf_printf(j, "%s{\"name\":\"", first ? "" : ",");
        first = false;
        rc |= kd_buf_json_escape(j, c->outputs[o].name, strlen(c->outputs[o].name));
        rc |= kd_buf_printf(j, "\",\"datatype\":\"%s\",\"shape\":[", cl ? "BYTES" : c->outputs[o].datatype);
        int ndim = cl ? cl->ndim : t->ndim;
        for (int d = 0; d < ndim; d++)
            rc |= kd_buf_printf(j, "%s%lld", d ? "," : "", (long long)(cl ? cl->shape[d] : t->shape[d]));
        const struct kd_shm_slice *in_shm = shm && shm->out[o].region ? &shm->out[o] : NULL;
        if (in_shm) {
            /* written into the region by kd_shm_write_outputs: only where, and how much */
            const char *region = kd_shm_slice_region_name(in_shm);
            rc |= kd_buf_puts(j, "],\"parameters\":{\"shared_memory_region\":\"");
            rc |= kd_buf_json_escape(j, region, strlen(region));
            rc |= kd_buf_printf(j, "\",\"shared_memory_byte_size\":%zu", t->nbytes);
            if (in_shm->offset)
                rc |= kd_buf_printf(j, ",\"shared_memory_offset\":%llu", (unsigned long long)in_shm->offset);
            rc |= kd_buf_puts(j, "}}");
        } else if (asks->binary[o]) {
            rc |= kd_buf_printf(j, "],\"parameters\":{\"binary_data_size\":%zu}}", cl ? cl->wire_len : t->nbytes);
        } else if (cl) {
            rc |= kd_buf_puts(j, "],\"data\":[");
            size_t pos = 0;
            uint32_t len;
            const char *s;
            for (int64_t i = 0; (s = kd_classes_next(cl, &pos, &len)) != NULL; i++) {
                rc |= kd_buf_puts(j, i ? ",\"" : "\"");
                rc |= kd_buf_json_escape(j, s, len);
                rc |= kd_buf_puts(j, "\"");
            }
            rc |= kd_buf_puts(j, "]}");
        } else {
            rc |= kd_buf_puts(j, "],\"data\":[");
            rc |= put_values(j, t);
            rc |= kd_buf_puts(j, "]}");
        }
    }
    rc |= kd_buf_puts(j, "]}");
    *json_len = j->len;
    for (int o = 0; o < c->noutputs && o < r->noutputs && rc == 0; o++) {
        if (!asks->want[o] || !asks->binary[o] || (shm && shm->out[o].region))
            continue;
        if (asks->classes[o] > 0)
            rc |= kd_buf_append(j, classes[o].wire, classes[o].wire_len);
        else
            rc |= kd_buf_append(j, r->outputs[o].data, r->outputs[o].nbytes);
    }
    for (int o = 0; o < c->noutputs && o < r->noutputs; o++)
        if (asks->want[o] && asks->classes[o] > 0)
            kd_classes_free(&classes[o]);
    return rc ? -1 : 0;
}

int kd_infer_respond(struct kd_buf *out, const struct kd_buf *body, size_t json_len, bool keep_alive,
                     const char *extra_headers)
{
    if (json_len == body->len)
        return kd_resp_append(out, 200, "application/json", body->data, body->len, keep_alive, extra_headers);
    char hdr[512];
    snprintf(hdr, sizeof hdr, "Inference-Header-Content-Length: %zu\r\n%s", json_len,
             extra_headers ? extra_headers : "");
    return kd_resp_append(out, 200, "application/octet-stream", body->data, body->len, keep_alive, hdr);
}
