/*
 * tests/unit/test_classify.c — the classification extension's ranking (api/classify.c): the top
 * classes per batch item or of a whole tensor, their strings "<value>:<index>[:<label>]" in
 * Triton's serialized BYTES layout, ties to the lower index, NaN last, a count past the classes
 * cut to them, every numeric dtype; and the checks a request's count passes (api/infer.c).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "classify.h"
#include "common/half.h"
#include "serving.h"

static struct kd_sched_tensor tensor(kiln_dtype dt, void *data, int ndim, const int64_t *shape)
{
    struct kd_sched_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.ndim = ndim;
    size_t n = 1;
    for (int d = 0; d < ndim; d++) {
        t.shape[d] = shape[d];
        n *= (size_t)shape[d];
    }
    t.data = data;
    t.nbytes = n * kiln_dtype_size(dt);
    return t;
}

/* The strings of c joined by '|', for comparing whole. */
static void joined(const struct kd_classes *c, char *out, size_t cap)
{
    size_t pos = 0, used = 0;
    uint32_t len;
    const char *s;
    out[0] = '\0';
    for (int i = 0; (s = kd_classes_next(c, &pos, &len)) != NULL; i++)
        used += (size_t)snprintf(out + used, cap - used, "%s%.*s", i ? "|" : "", (int)len, s);
}

static void test_batched_top_with_labels(void **state)
{
    (void)state;
    float v[2 * 4] = {0.1f, 0.7f, -2.0f, 0.2f, /* item 0 */ 5.0f, 5.0f, 1.0f, 7.5f /* item 1: a tie */};
    int64_t shape[2] = {2, 4};
    struct kd_sched_tensor t = tensor(KILN_F32, v, 2, shape);
    const char *labels[3] = {"cat", "dog \"big\"", "bird"}; /* index 3 has no label */
    struct kd_classes c;
    assert_int_equal(kd_classify(&t, true, 3, labels, 3, &c), 0);
    assert_int_equal(c.ndim, 2);
    assert_int_equal(c.shape[0], 2);
    assert_int_equal(c.shape[1], 3);
    assert_int_equal(c.n, 6);
    char s[512];
    joined(&c, s, sizeof s);
    assert_string_equal(s, "0.700000:1:dog \"big\"|0.200000:3|0.100000:0:cat|"
                           "7.500000:3|5.000000:0:cat|5.000000:1:dog \"big\"");
    /* the wire: a 4-byte little-endian length before each string */
    assert_int_equal((unsigned char)c.wire[0], strlen("0.700000:1:dog \"big\""));
    assert_int_equal(c.wire[1] | c.wire[2] | c.wire[3], 0);
    size_t total = 0, pos = 0;
    uint32_t len;
    while (kd_classes_next(&c, &pos, &len))
        total += 4 + len;
    assert_int_equal(total, c.wire_len);
    kd_classes_free(&c);
}

static void test_unbatched_whole_tensor_and_count_cut(void **state)
{
    (void)state;
    float v[2 * 3] = {1, 9, 3, 8, 2, 7};
    int64_t shape[2] = {2, 3};
    struct kd_sched_tensor t = tensor(KILN_F32, v, 2, shape);
    struct kd_classes c;
    assert_int_equal(kd_classify(&t, false, 100, NULL, 0, &c), 0);
    assert_int_equal(c.ndim, 1);
    assert_int_equal(c.shape[0], 6); /* every element of the tensor, ranked as one item */
    char s[512];
    joined(&c, s, sizeof s);
    assert_string_equal(s, "9.000000:1|8.000000:3|7.000000:5|3.000000:2|2.000000:4|1.000000:0");
    kd_classes_free(&c);
}

static void test_nan_ranks_last(void **state)
{
    (void)state;
    float v[4] = {NAN, -1.0f, NAN, -3.0f};
    int64_t shape[2] = {1, 4};
    struct kd_sched_tensor t = tensor(KILN_F32, v, 2, shape);
    struct kd_classes c;
    assert_int_equal(kd_classify(&t, true, 4, NULL, 0, &c), 0);
    char s[256];
    joined(&c, s, sizeof s);
    assert_string_equal(s, "-1.000000:1|-3.000000:3|nan:0|nan:2");
    kd_classes_free(&c);
}

static void test_integer_and_half_dtypes(void **state)
{
    (void)state;
    int64_t shape[2] = {1, 3};
    int64_t i64[3] = {-5, 40, 7};
    struct kd_sched_tensor t = tensor(KILN_I64, i64, 2, shape);
    struct kd_classes c;
    char s[256];
    assert_int_equal(kd_classify(&t, true, 2, NULL, 0, &c), 0);
    joined(&c, s, sizeof s);
    assert_string_equal(s, "40:1|7:2");
    kd_classes_free(&c);
    uint8_t u8[3] = {200, 3, 255};
    t = tensor(KILN_U8, u8, 2, shape);
    assert_int_equal(kd_classify(&t, true, 1, NULL, 0, &c), 0);
    joined(&c, s, sizeof s);
    assert_string_equal(s, "255:2");
    kd_classes_free(&c);
    uint16_t h[3] = {kiln_f32_to_f16(0.5f), kiln_f32_to_f16(-1.0f), kiln_f32_to_f16(2.0f)};
    t = tensor(KILN_F16, h, 2, shape);
    assert_int_equal(kd_classify(&t, true, 2, NULL, 0, &c), 0);
    joined(&c, s, sizeof s);
    assert_string_equal(s, "2.000000:2|0.500000:0");
    kd_classes_free(&c);
    uint8_t b[3] = {1, 0, 1};
    t = tensor(KILN_BOOL, b, 2, shape);
    assert_int_equal(kd_classify(&t, true, 2, NULL, 0, &c), -1);
    assert_null(c.wire);
}

/* A large item ranked by the bounded heap agrees with a full sort. */
static int by_value_desc(const void *a, const void *b)
{
    const float *x = a, *y = b;
    return (*x < *y) - (*x > *y);
}

static void test_heap_agrees_with_sort(void **state)
{
    (void)state;
    enum {
        N = 5000,
        K = 37
    };
    float *v = malloc(sizeof *v * N), *sorted = malloc(sizeof *sorted * N);
    assert_non_null(v);
    assert_non_null(sorted);
    uint32_t x = 12345;
    for (int i = 0; i < N; i++) {
        x = x * 1664525u + 1013904223u;
        v[i] = (float)(x >> 8) / (float)(1u << 24); /* distinct enough: ties are tested above */
        sorted[i] = v[i];
    }
    qsort(sorted, N, sizeof *sorted, by_value_desc);
    int64_t shape[1] = {N};
    struct kd_sched_tensor t = tensor(KILN_F32, v, 1, shape);
    struct kd_classes c;
    assert_int_equal(kd_classify(&t, false, K, NULL, 0, &c), 0);
    size_t pos = 0;
    uint32_t len;
    const char *s;
    for (int k = 0; (s = kd_classes_next(&c, &pos, &len)) != NULL; k++) {
        char want[32];
        snprintf(want, sizeof want, "%f:", sorted[k]);
        assert_true(len > strlen(want) && memcmp(s, want, strlen(want)) == 0);
        char digits[16]; /* the wire's strings are not NUL-ended */
        snprintf(digits, sizeof digits, "%.*s", (int)(len - strlen(want)), s + strlen(want));
        long index = strtol(digits, NULL, 10);
        assert_true(v[index] == sorted[k]);
    }
    assert_int_equal(c.n, K);
    kd_classes_free(&c);
    free(v);
    free(sorted);
}

static void test_request_checks(void **state)
{
    (void)state;
    kd_model_tensor_spec outs[2] = {{.name = "scores", .datatype = "FP32"}, {.name = "mask", .datatype = "BOOL"}};
    kd_model_config cfg = {.noutputs = 2, .outputs = outs};
    char msg[256];
    assert_int_equal(kd_infer_check_classes(&cfg, 0, 5, false, msg, sizeof msg), 0);
    assert_int_equal(kd_infer_check_classes(&cfg, 0, 0, false, msg, sizeof msg), 400);
    assert_non_null(strstr(msg, "output 'scores': classification must be a whole number of classes from 1"));
    assert_int_equal(kd_infer_check_classes(&cfg, 0, KD_CLASSIFY_MAX_COUNT + 1, false, msg, sizeof msg), 400);
    assert_int_equal(kd_infer_check_classes(&cfg, 1, 2, false, msg, sizeof msg), 400);
    assert_non_null(strstr(msg, "output 'mask' is BOOL: classification ranks numbers"));
    assert_int_equal(kd_infer_check_classes(&cfg, 0, 2, true, msg, sizeof msg), 400);
    assert_non_null(strstr(msg, "not written into shared memory"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_top_with_labels),
        cmocka_unit_test(test_unbatched_whole_tensor_and_count_cut),
        cmocka_unit_test(test_nan_ranks_last),
        cmocka_unit_test(test_integer_and_half_dtypes),
        cmocka_unit_test(test_heap_agrees_with_sort),
        cmocka_unit_test(test_request_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
