/*
 * tests/engine/test-fused.h — what the fused-producer tests share (test-fused.c: the
 * convolutions and their fallbacks; test-fused-epilogue.c: kiln__epilogue after a matmul):
 * the cpu device they run on, seeded host data, bitwise and tolerance comparisons, and the
 * activations with their composed forms.
 */
#ifndef KILN_TEST_FUSED_H
#define KILN_TEST_FUSED_H

#include "test-util.h"

#include <float.h>

#include "kiln/autodiff.h"
#include "tensor-impl.h"

/** The cpu device of the group (opened by test-fused.c's group setup). */
extern kiln_device *cpu_dev;
/** The group's ref device: test-util.h's test_dev is one variable per file, so the
 *  group setup (test-fused.c) publishes its own here for the other file. */
extern kiln_device *group_ref_dev;

/* ------------------------------------------------------------------ host data */

/* A private generator, so that the data (and where the NaNs land) does not depend on
 * the engine's own random ops, which are under test elsewhere. */
static uint64_t rng_state;

static inline float urand(void)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(rng_state >> 40) / (double)(1ULL << 24) * 2.0 - 1.0);
}

static inline float *host_rand(int64_t n, float scale)
{
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++)
        v[i] = urand() * scale;
    return v;
}

static inline kiln_tensor *mk(kiln_device *dev, int ndim, const int64_t *shape, const float *data)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    kiln_tensor *t = kiln_from_data(dev, KILN_F32, ndim, shape, data, (size_t)n * sizeof(float));
    if (!t)
        fail_msg("from_data: %s", kiln_error());
    return t;
}

/* t's values as f32, row-major; the caller frees them. */
static inline float *host_of(kiln_tensor *t)
{
    if (!t)
        fail_msg("result is NULL: %s", kiln_error());
    int64_t n = kiln_tensor_numel(t);
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    assert_non_null(v);
    kiln_tensor *c = kiln_tensor_dtype(t) == KILN_F32 ? t : kiln_cast(t, KILN_F32);
    assert_non_null(c);
    assert_int_equal(kiln_to_data(c, v, (size_t)n * sizeof *v), 0);
    return v;
}

static inline void expect_dims(kiln_tensor *t, int ndim, const int64_t *shape)
{
    if (!t)
        fail_msg("result is NULL: %s", kiln_error());
    assert_int_equal(kiln_tensor_ndim(t), ndim);
    for (int d = 0; d < ndim; d++)
        assert_int_equal(kiln_tensor_dim(t, d), shape[d]);
}

/* ------------------------------------------------------------------ comparisons */

static inline bool same_bits(float a, float b)
{
    /* NaN payloads are not part of the contract; everything else, -0 included, is */
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    uint32_t ua, ub;
    memcpy(&ua, &a, 4);
    memcpy(&ub, &b, 4);
    return ua == ub;
}

static inline void expect_bitwise(const char *what, const char *label, const float *got, const float *want,
                                  int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!same_bits(got[i], want[i]))
            fail_msg("%s: %s: element %lld: got %.9g (%a), want %.9g (%a)", label, what, (long long)i,
                     (double)got[i], (double)got[i], (double)want[i], (double)want[i]);
}

/* got against want where mag[i] bounds the magnitude of every term that went into
 * element i (so the rounding error of a k-term f32 sum stays under k·eps·mag[i]; random
 * data keeps it near sqrt(k)·eps·mag[i]). Non-finite values must match exactly in kind:
 * NaN where want is NaN, the same infinity where it is infinite. */
static inline double expect_close(const char *what, const char *label, const float *got, const float *want,
                                  const float *mag, int64_t n, int64_t k, double rel)
{
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], w = want[i];
        if (isnan(w) || isnan(g)) {
            if (!(isnan(w) && isnan(g)))
                fail_msg("%s: %s: element %lld: got %.9g, want %.9g", label, what, (long long)i, g, w);
            continue;
        }
        if (isinf(w) || isinf(g)) {
            if (g != w)
                fail_msg("%s: %s: element %lld: got %.9g, want %.9g", label, what, (long long)i, g, w);
            continue;
        }
        /* a term that was infinite before a saturating activation (relu, clamp, sigmoid)
         * leaves a magnitude bound of inf: the activation's own value must come out */
        double m = mag && isfinite(mag[i]) ? mag[i] : 0;
        double tol = rel * (1 + fabs(w)) + (mag ? FLT_EPSILON * sqrt((double)k) * m : 0);
        if (mag && !isfinite(mag[i]))
            tol = 1e-6;
        double err = fabs(g - w);
        if (!(err <= tol))
            fail_msg("%s: %s: element %lld: got %.9g, want %.9g (error %.3g, tolerance %.3g)", label, what,
                     (long long)i, g, w, err, tol);
        if (tol > 0 && err / tol > worst)
            worst = err / tol;
    }
    return worst;
}

/* ------------------------------------------------------------------ activations */

typedef struct act_case {
    const char *name;
    kiln_epilogue_act act;
    double alpha, beta;
} act_case;

static const act_case acts[] = {
    {"none", KILN_EPI_NONE, 0, 0},
    {"relu", KILN_EPI_RELU, 0, 0},
    {"leaky_relu(0.1)", KILN_EPI_LEAKY_RELU, 0.1, 0},
    {"clip(-1,6)", KILN_EPI_CLAMP, -1, 6},
    {"clip(0.1,0.3)", KILN_EPI_CLAMP, 0.1, 0.3}, /* bounds that are not floats */
    {"clip(-inf,inf)", KILN_EPI_CLAMP, -INFINITY, INFINITY},
    {"hard_sigmoid(0.2,0.5)", KILN_EPI_HARD_SIGMOID, 0.2, 0.5},
    {"hard_sigmoid(1/6,0.5)", KILN_EPI_HARD_SIGMOID, 1.0 / 6.0, 0.5},
    {"hard_swish", KILN_EPI_HARD_SWISH, 0, 0},
    {"sigmoid", KILN_EPI_SIGMOID, 0, 0},
};
#define NACTS ((int)(sizeof acts / sizeof acts[0]))

/* The activation composed from the public ops, step for step as kiln__act_apply composes
 * it, written out here so the reference does not lean on the code under test. */
static inline kiln_tensor *compose_act(kiln_tensor *t, const act_case *a)
{
    switch (a->act) {
    case KILN_EPI_NONE: return t;
    case KILN_EPI_RELU: return kiln_relu(t);
    case KILN_EPI_LEAKY_RELU: return kiln_leaky_relu(t, a->alpha);
    case KILN_EPI_CLAMP: return kiln_clamp(t, a->alpha, a->beta);
    case KILN_EPI_HARD_SIGMOID: return kiln_clamp(kiln_add_scalar(kiln_mul_scalar(t, a->alpha), a->beta), 0, 1);
    case KILN_EPI_HARD_SWISH:
        return kiln_mul(t, kiln_clamp(kiln_add_scalar(kiln_mul_scalar(t, 1.0 / 6.0), 0.5), 0, 1));
    case KILN_EPI_SIGMOID: return kiln_sigmoid(t);
    default: fail_msg("no such activation %d", (int)a->act); return NULL;
    }
}

static inline float *host_abs(const float *v, int64_t n)
{
    float *a = malloc((size_t)(n ? n : 1) * sizeof *a);
    assert_non_null(a);
    for (int64_t i = 0; i < n; i++)
        a[i] = fabsf(v[i]);
    return a;
}

/** Per-test setup of test-fused-epilogue.c's tests: that file's test_dev is the group's. */
int epilogue_setup(void **state);
void test_epilogue_matmul(void **state);
void test_epilogue_shared(void **state);
void test_epilogue_fallbacks(void **state);

#endif /* KILN_TEST_FUSED_H */
