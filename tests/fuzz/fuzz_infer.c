/*
 * tests/fuzz/fuzz_infer.c — libFuzzer target for kilnd's KServe v2 HTTP inference decoder
 * (api/infer.c): arbitrary bytes as the body of POST /v2/models/<m>/infer for a model with
 * FP32, INT64, FP16 and BOOL inputs, with and without the binary tensor extension's
 * Inference-Header-Content-Length.
 *
 * The first input byte picks the header: 0 none, otherwise the JSON part is that many bytes
 * times the second byte's worth of 1/256 of the rest (so lengths inside, at and past the body
 * all occur). Each body is decoded twice, as kilnd does it: whole on one thread (dd NULL),
 * and split, the loop's checks then the worker's kd_infer_fill. Both must refuse what they
 * refuse with a 4xx/5xx status and a message, agree on the status, and accept only inputs
 * whose buffers hold exactly their shape's bytes; nothing may be read past the body or leak.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router.h"
#include "serving.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kd_model_tensor_spec inputs[] = {
    {.name = "x", .datatype = "FP32", .ndim = 2, .shape = {-1, 3}},
    {.name = "ids", .datatype = "INT64", .ndim = 1, .shape = {-1}},
    {.name = "h", .datatype = "FP16", .ndim = 2, .shape = {-1, 2}},
    {.name = "mask", .datatype = "BOOL", .ndim = 2, .shape = {-1, 4}},
};
static kd_model_tensor_spec outputs[] = {
    {.name = "y", .datatype = "FP32", .ndim = 2, .shape = {-1, 3}},
    {.name = "z", .datatype = "INT64", .ndim = 1, .shape = {-1}},
};

/* Every input the decoder accepted must be sized for its shape and datatype. */
static void check_inputs(const kd_model_config *c, const struct kd_sched_request *r)
{
    if (r->ninputs != c->ninputs)
        __builtin_trap();
    for (int i = 0; i < r->ninputs; i++) {
        const struct kd_sched_tensor *t = &r->inputs[i];
        int64_t n = 1;
        for (int d = 0; d < t->ndim; d++)
            n *= t->shape[d];
        if (!t->data || t->ndim != c->inputs[i].ndim || t->nbytes != (size_t)n * kiln_dtype_size(t->dtype))
            __builtin_trap();
    }
}

static int decode(const kd_model_config *c, const struct kd_request *req, bool split)
{
    struct kd_infer_ctx ic = {.max_tensor_elements = 4096, .max_string_bytes = 64};
    struct kd_sched_request r;
    memset(&r, 0, sizeof r);
    struct kd_output_asks asks;
    char id[80], msg[256] = "";
    struct kd_infer_data dd;
    int st = kd_infer_decode(&ic, c, req, &r, &asks, id, sizeof id, split ? &dd : NULL, msg, sizeof msg);
    if (st == 0 && split)
        st = kd_infer_fill(&dd, c, &r, msg, sizeof msg);
    if (st != 0 && (st < 400 || st > 599 || !msg[0]))
        __builtin_trap(); /* a refusal always says why, with an error status */
    if (st == 0)
        check_inputs(c, &r);
    kd_sched_request_clear(&r);
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    kd_model_config c = {.ninputs = 4, .noutputs = 2, .inputs = inputs, .outputs = outputs, .max_batch_size = 8};
    struct kd_http_headers h;
    memset(&h, 0, sizeof h);
    size_t body_len = size - 2;
    if (data[0]) {
        /* a length up to somewhat past the body: the decoder must refuse the ones past it */
        size_t len = (size_t)data[0] * (body_len + 8) / 255 * data[1] / 255;
        snprintf(h.inference_header_length, sizeof h.inference_header_length, "%zu", len);
    }
    /* the body in a buffer of its own size, so a read past it is the sanitizer's to catch */
    char *body = malloc(body_len ? body_len : 1);
    if (!body)
        return 0;
    memcpy(body, data + 2, body_len);
    struct kd_request req = {.body = body_len ? body : NULL, .body_len = body_len, .headers = &h};
    int whole = decode(&c, &req, false);
    int split = decode(&c, &req, true);
    if (whole != split)
        __builtin_trap(); /* kilnd answers alike whichever thread converts the data */
    free(body);
    return 0;
}
