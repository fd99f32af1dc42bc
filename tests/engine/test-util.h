/*
 * tests/engine/test-util.h — small helpers shared by the engine's unit tests: a device
 * per test group, f32 tensors from literals, and reading results back for assertions.
 */
#ifndef KILN_TEST_UTIL_H
#define KILN_TEST_UTIL_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kiln/tensor.h"

static kiln_device *test_dev;

/* Older cmocka has no floating assertion: compare within an absolute tolerance. */
#define assert_near(a, b, tol)                                                          \
    do {                                                                                \
        double a_ = (a), b_ = (b);                                                      \
        if (!(fabs(a_ - b_) <= (tol) || (isnan(a_) && isnan(b_))))                       \
            fail_msg("%s = %.10g, want %.10g", #a, a_, b_);                             \
    } while (0)

static inline int test_group_setup(void **state)
{
    (void)state;
    test_dev = kiln_device_open("ref");
    if (!test_dev)
        fprintf(stderr, "cannot open ref: %s\n", kiln_error());
    return test_dev ? 0 : -1;
}

static inline int test_group_teardown(void **state)
{
    (void)state;
    kiln_device_close(test_dev);
    test_dev = NULL;
    return 0;
}

/* An f32 tensor from a literal list; the shape is given separately. */
static inline kiln_tensor *tf32(int ndim, const int64_t *shape, const float *data, size_t n)
{
    kiln_tensor *t = kiln_from_data(test_dev, KILN_F32, ndim, shape, data, n * sizeof(float));
    if (!t)
        fail_msg("from_data: %s", kiln_error());
    return t;
}
#define TF32(shape_macro, ...) \
    tf32(shape_macro, (const float[]){__VA_ARGS__}, sizeof((float[]){__VA_ARGS__}) / sizeof(float))

/* Read t (any dtype) as f32 into out (n elements) and check the element count. */
static inline void read_f32(kiln_tensor *t, float *out, size_t n)
{
    if (!t)
        fail_msg("tensor is NULL: %s", kiln_error());
    assert_int_equal(kiln_tensor_numel(t), (int64_t)n);
    kiln_tensor *c = kiln_cast(t, KILN_F32);
    assert_non_null(c);
    assert_int_equal(kiln_to_data(c, out, n * sizeof(float)), 0);
    kiln_tensor_release(c);
}

static inline void expect_f32(kiln_tensor *t, const float *want, size_t n, double tol)
{
    float *got = calloc(n ? n : 1, sizeof(float));
    read_f32(t, got, n);
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - (double)want[i]);
        bool both_nan = isnan(got[i]) && isnan(want[i]);
        bool same_inf = isinf(got[i]) && got[i] == want[i];
        if (!(both_nan || same_inf || err <= tol * (1 + fabs((double)want[i]))))
            fail_msg("element %zu: got %.9g, want %.9g", i, (double)got[i], (double)want[i]);
    }
    free(got);
}
#define EXPECT_F32(t, tol, ...) \
    expect_f32((t), (const float[]){__VA_ARGS__}, sizeof((float[]){__VA_ARGS__}) / sizeof(float), (tol))

static inline void expect_shape(const kiln_tensor *t, int ndim, const int64_t *shape)
{
    if (!t)
        fail_msg("tensor is NULL: %s", kiln_error());
    assert_int_equal(kiln_tensor_ndim(t), ndim);
    for (int i = 0; i < ndim; i++)
        assert_int_equal(kiln_tensor_shape(t)[i], shape[i]);
}
#define EXPECT_SHAPE(t, ...) expect_shape((t), KILN_SHAPE(__VA_ARGS__))

static inline void expect_error(const char *needle)
{
    if (!strstr(kiln_error(), needle))
        fail_msg("error \"%s\" does not mention \"%s\"", kiln_error(), needle);
}

#endif
