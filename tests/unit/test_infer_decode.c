/*
 * tests/unit/test_infer_decode.c — the KServe v2 infer request decoder (api/infer.c) on a model
 * config made here, so that shapes no fixture model takes (three dynamic dims) can be tried:
 * dims past limits.max_tensor_elements, dims past 64 bits, and dims whose product overflows.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "serving.h"

#define LIMIT (1LL << 34) /* the largest limits.max_tensor_elements the configuration allows */

static int decode(const char *body, char *msg, size_t msglen)
{
    kd_model_tensor_spec in = {.name = "x", .datatype = "FP32", .ndim = 3, .shape = {-1, -1, -1}};
    kd_model_tensor_spec out = {.name = "y", .datatype = "FP32", .ndim = 1, .shape = {-1}};
    kd_model_config c = {.ninputs = 1, .noutputs = 1, .inputs = &in, .outputs = &out, .instance_count = 1};
    struct kd_infer_ctx ic = {.sv = NULL, .max_tensor_elements = LIMIT, .max_string_bytes = 1024};
    struct kd_http_headers h;
    memset(&h, 0, sizeof h);
    struct kd_request req = {.method = KD_HTTP_POST, .body = body, .body_len = strlen(body), .headers = &h};
    struct kd_sched_request r;
    memset(&r, 0, sizeof r);
    struct kd_output_asks asks;
    char id[64];
    msg[0] = '\0';
    int st = kd_infer_decode(&ic, &c, &req, &r, &asks, id, sizeof id, NULL, msg, msglen);
    kd_sched_request_clear(&r);
    return st;
}

static int decode_shape(const char *shape, char *msg, size_t msglen)
{
    char body[256];
    snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":%s,\"data\":[]}]}", shape);
    return decode(body, msg, msglen);
}

static void test_good_shape(void **state)
{
    (void)state;
    char msg[256];
    assert_int_equal(decode("{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1,2,3],"
                            "\"data\":[1,2,3,4,5,6]}]}", msg, sizeof msg), 0);
}

/* A dim past the limit is 413 naming the limit, not a 400 about signs. */
static void test_dim_over_limit_is_413(void **state)
{
    (void)state;
    const char *shapes[] = {"[1,17179869185,1]", "[17179869185,0,1]", "[1,1e30,1]",
                            "[99999999999999999999999,1,1]", "[1,1,18446744073709551616]"};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        char msg[256];
        int st = decode_shape(shapes[i], msg, sizeof msg);
        if (st != 413)
            fail_msg("%s: expected 413, got %d (%s)", shapes[i], st, msg);
        assert_non_null(strstr(msg, "limits.max_tensor_elements (17179869184)"));
    }
}

/* Each dim within the limit, their product past it or past 64 bits: 413, never a wrapped count. */
static void test_product_over_limit_is_413(void **state)
{
    (void)state;
    const char *shapes[] = {"[65536,65536,16]", "[17179869184,17179869184,1]", "[17179869184,17179869184,17179869184]",
                            "[4294967296,4294967296,16]"};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        char msg[256];
        int st = decode_shape(shapes[i], msg, sizeof msg);
        if (st != 413)
            fail_msg("%s: expected 413, got %d (%s)", shapes[i], st, msg);
        assert_non_null(strstr(msg, "limits.max_tensor_elements (17179869184)"));
    }
    /* a zero dim anywhere makes an empty tensor, which is within any limit */
    char msg[256];
    assert_int_equal(decode_shape("[17179869184,0,17179869184]", msg, sizeof msg), 0);
}

static void test_bad_dims_are_400(void **state)
{
    (void)state;
    const char *shapes[] = {"[-1,2,3]", "[1.5,2,3]", "[1,\"2\",3]", "[1,-1e30,3]", "[1,null,3]"};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        char msg[256];
        int st = decode_shape(shapes[i], msg, sizeof msg);
        if (st != 400)
            fail_msg("%s: expected 400, got %d (%s)", shapes[i], st, msg);
        assert_non_null(strstr(msg, "shape entries must be non-negative integers"));
    }
}

/* More inputs than a request may carry (16), none of them the model's: each entry is looked at
 * only up to that bound (the missing-input check read the 17th past its array, found by fuzzing),
 * and the answer names the input that is missing. */
static void test_more_inputs_than_kept(void **state)
{
    (void)state;
    char body[256] = "{\"inputs\":[1";
    for (int i = 1; i < 17; i++)
        strcat(body, ",1");
    strcat(body, "]}");
    char msg[256];
    int st = decode(body, msg, sizeof msg);
    if (st != 400 || !strstr(msg, "input 'x' is missing: the model takes 1 input(s), the request has 17"))
        fail_msg("17 inputs: %d %s", st, msg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_shape),
        cmocka_unit_test(test_dim_over_limit_is_413),
        cmocka_unit_test(test_product_over_limit_is_413),
        cmocka_unit_test(test_bad_dims_are_400),
        cmocka_unit_test(test_more_inputs_than_kept),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
