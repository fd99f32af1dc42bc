/*
 * tests/autodiff/test-grad-edges.c — gradients at the edges of their ops' domains,
 * against PyTorch's values, on every backend that opens here (ref, cpu, cpu with fusion,
 * vulkan:0): binary cross-entropy at probabilities 0 and 1 (a saturated sigmoid),
 * cross-entropy with every target ignored, std of a constant slice, maximum/minimum
 * with NaN operands, batch_norm and group_norm on f16/bf16 activations whose variance
 * is past f16's range, and the derivatives of gelu's tanh form, elu and silu on half
 * dtypes.
 *
 * The expected numbers are PyTorch's (torch 2.x on the CPU, float64 unless a test says
 * otherwise) for the same inputs; where kiln knowingly differs (BCE's target gradient)
 * the comment gives the documented formula instead.
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

#include "kiln/autodiff.h"
#include "kiln/loss.h"
#include "kiln/tensor.h"

#include "edge-devices.h"

/* A tensor of dtype dt holding the n doubles v (rounded to dt). */
static kiln_tensor *tensor_of(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape, const double *v)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    kiln_tensor *t = kiln_from_data(dev, KILN_F64, ndim, shape, v, (size_t)n * sizeof(double));
    assert_non_null(t);
    return kiln_cast(t, dt);
}

#define TENSOR(dev, dt, v, ...) tensor_of((dev), (dt), KILN_SHAPE(__VA_ARGS__), (v))

/* t's n values must be the expected ones: NaN where expected is NaN, infinities equal,
 * else within atol + rtol |expected|. */
static void expect_values(const char *spec, const char *what, kiln_tensor *t, int64_t n, const double *expected,
                          double rtol, double atol)
{
    if (!t)
        fail_msg("%s on %s: no tensor (%s)", what, spec, kiln_error());
    assert_int_equal(kiln_tensor_numel(t), n);
    double got[64];
    assert_true(n <= 64);
    assert_int_equal(kiln_to_data(kiln_cast(t, KILN_F64), got, (size_t)n * sizeof(double)), 0);
    for (int64_t i = 0; i < n; i++) {
        bool ok = isnan(expected[i])
                      ? isnan(got[i])
                      : got[i] == expected[i] || fabs(got[i] - expected[i]) <= atol + rtol * fabs(expected[i]);
        if (!ok)
            fail_msg("%s on %s: element %lld is %.10g, expected %.10g", what, spec, (long long)i, got[i],
                     expected[i]);
    }
}

/* The gradient of leaf t after backward, checked as expect_values does. */
static void expect_grad(const char *spec, const char *what, kiln_tensor *t, int64_t n, const double *expected,
                        double rtol, double atol)
{
    kiln_tensor *g = kiln_grad(t);
    if (!g)
        fail_msg("%s on %s: no gradient (%s)", what, spec, kiln_error());
    assert_int_equal(kiln_tensor_dtype(g), kiln_tensor_dtype(t));
    expect_values(spec, what, g, n, expected, rtol, atol);
    kiln_tensor_release(g);
}

static void backward_of(const char *spec, kiln_tensor *loss)
{
    if (!loss)
        fail_msg("forward failed on %s: %s", spec, kiln_error());
    if (kiln_backward(loss, NULL) != 0)
        fail_msg("backward failed on %s: %s", spec, kiln_error());
}

/* ------------------------------------------------------------ binary cross-entropy */

static void bce_cases(kiln_device *dev, const char *spec)
{
    /* bce(sigmoid(z), y), mean: sigmoid(20) is 1.0 in f32, where the clamped logs'
     * derivative was 0 * inf = NaN. torch: grad [0, 6.8705e-10, -0.125847] */
    static const double z[3] = {20, -20, 0.5}, y[3] = {1, 0, 1};
    static const double gz[3] = {0, 6.870512492263003e-10, -0.12584687769412994};
    kiln_tensor *zt = kiln_requires_grad(TENSOR(dev, KILN_F32, z, 3), true);
    kiln_tensor *loss = kiln_loss_bce(kiln_sigmoid(zt), TENSOR(dev, KILN_F32, y, 3), NULL, KILN_REDUCTION_MEAN);
    expect_values(spec, "bce(sigmoid) loss", loss, 1, (const double[]){0.15802565217018127}, 1e-6, 0);
    backward_of(spec, loss);
    expect_grad(spec, "bce(sigmoid) dz", zt, 3, gz, 1e-5, 1e-7);

    /* Probabilities as leaves, weighted, summed. torch: dp = w (p - t) / max(p (1 - p),
     * 1e-12) = [0, 0, -1e12, 1e12, -16] (1e-12 rounded to f32). dt is w (log(1 - p) -
     * log(p)) with both logs clamped at -100, as kiln documents (torch leaves them
     * unclamped: -inf, inf, inf, -inf there): [-200, 300, 100, -100, 4 log 3]. */
    static const double p[5] = {1, 0, 0, 1, 0.25}, t[5] = {1, 0, 1, 0, 1}, w[5] = {2, 3, 1, 1, 4};
    static const double gp[5] = {0, 0, -999999995904.0, 999999995904.0, -16};
    static const double gt[5] = {-200, 300, 100, -100, 4.394449154672439};
    kiln_tensor *pt = kiln_requires_grad(TENSOR(dev, KILN_F32, p, 5), true);
    kiln_tensor *tt = kiln_requires_grad(TENSOR(dev, KILN_F32, t, 5), true);
    loss = kiln_loss_bce(pt, tt, TENSOR(dev, KILN_F32, w, 5), KILN_REDUCTION_SUM);
    expect_values(spec, "bce weighted loss", loss, 1, (const double[]){205.54518127441406}, 1e-6, 0);
    backward_of(spec, loss);
    expect_grad(spec, "bce weighted dp", pt, 5, gp, 1e-6, 0);
    expect_grad(spec, "bce weighted dt", tt, 5, gt, 1e-5, 0);

    /* Half dtypes: finite, and (p - t) / (p (1 - p)) / 3 = -4/3 at p = 0.25, t = 1
     * (torch bf16: [0, 0, -1.3359]; its f16 gives NaN where 1e-12 flushes to 0). */
    static const double ph[3] = {1, 0, 0.25}, th[3] = {1, 0, 1}, gh[3] = {0, 0, -4.0 / 3.0};
    static const kiln_dtype halves[2] = {KILN_F16, KILN_BF16};
    for (int h = 0; h < 2; h++) {
        kiln_tensor *x = kiln_requires_grad(TENSOR(dev, halves[h], ph, 3), true);
        loss = kiln_loss_bce(x, TENSOR(dev, halves[h], th, 3), NULL, KILN_REDUCTION_MEAN);
        expect_values(spec, "bce half loss", loss, 1, (const double[]){0.46209812037329684}, 1e-2, 0);
        backward_of(spec, loss);
        expect_grad(spec, h ? "bce bf16 dp" : "bce f16 dp", x, 3, gh, 1e-2, 0);
    }
}

static void test_bce_at_zero_and_one(void **state)
{
    (void)state;
    on_each_device(bce_cases);
}

/* ------------------------------------------------------- cross-entropy, all ignored */

static void ce_cases(kiln_device *dev, const char *spec)
{
    static const double x[6] = {1, 2, 3, 4, 5, 6}, zeros[6] = {0};
    int64_t ignored[2] = {-100, -100}, half_ignored[2] = {2, -100};
    kiln_tensor *all = kiln_from_data(dev, KILN_I64, KILN_SHAPE(2), ignored, sizeof ignored);
    kiln_tensor *w = TENSOR(dev, KILN_F32, ((const double[]){1, 2, 3}), 3);

    /* torch: loss NaN (0 / 0), gradient all zeros, with or without weights and label
     * smoothing, and for nll_loss */
    for (int variant = 0; variant < 3; variant++) {
        kiln_tensor *xt = kiln_requires_grad(TENSOR(dev, KILN_F32, x, 2, 3), true);
        kiln_loss_ce_opts o = kiln_loss_ce_opts_default();
        kiln_tensor *loss;
        if (variant == 0) {
            loss = kiln_loss_cross_entropy(xt, all, &o);
        } else if (variant == 1) {
            o.weight = w;
            o.label_smoothing = 0.1;
            loss = kiln_loss_cross_entropy(xt, all, &o);
        } else {
            loss = kiln_loss_nll(kiln_log_softmax(xt, 1), all, &o);
        }
        expect_values(spec, "ce all ignored loss", loss, 1, (const double[]){NAN}, 0, 0);
        backward_of(spec, loss);
        expect_grad(spec, "ce all ignored grad", xt, 6, zeros, 0, 0);
    }

    /* One target counted: the mean is over it alone. torch: loss 0.40760596, grad row 0
     * softmax - onehot(2), row 1 zero. */
    kiln_tensor *xt = kiln_requires_grad(TENSOR(dev, KILN_F32, x, 2, 3), true);
    kiln_tensor *loss = kiln_loss_cross_entropy(
        xt, kiln_from_data(dev, KILN_I64, KILN_SHAPE(2), half_ignored, sizeof half_ignored), NULL);
    expect_values(spec, "ce one counted loss", loss, 1, (const double[]){0.4076059644443804}, 1e-5, 0);
    backward_of(spec, loss);
    static const double g1[6] = {0.09003057317038043, 0.24472847105479764, -0.3347590442251782, 0, 0, 0};
    expect_grad(spec, "ce one counted grad", xt, 6, g1, 1e-5, 1e-7);
}

static void test_cross_entropy_all_ignored(void **state)
{
    (void)state;
    on_each_device(ce_cases);
}

/* ------------------------------------------------------------------ std at zero */

static void std_cases(kiln_device *dev, const char *spec)
{
    /* torch: d sum(std(x, 1)) = [0, 0, 0, -0.5, 0, 0.5]; correction 0: ±1/sqrt(6) */
    static const double x[6] = {5, 5, 5, 1, 2, 3};
    static const double g1[6] = {0, 0, 0, -0.5, 0, 0.5};
    static const double g0[6] = {0, 0, 0, -0.4082482904638631, 0, 0.4082482904638631};
    for (int corr = 0; corr < 2; corr++) {
        kiln_tensor *xt = kiln_requires_grad(TENSOR(dev, KILN_F32, x, 2, 3), true);
        backward_of(spec, kiln_sum(kiln_std(xt, KILN_DIMS(1), corr, false), KILN_ALL_DIMS, false));
        expect_grad(spec, corr ? "std(unbiased) grad" : "std(biased) grad", xt, 6, corr ? g1 : g0, 1e-5, 1e-7);
    }
    /* a 0-d input, std 0 with correction 0: torch's gradient is 0 */
    kiln_tensor *s = kiln_requires_grad(kiln_full(dev, KILN_F32, 0, NULL, 3.0), true);
    backward_of(spec, kiln_std(s, KILN_ALL_DIMS, 0, false));
    expect_grad(spec, "std 0-d grad", s, 1, (const double[]){0}, 0, 0);
}

static void test_std_of_constant_slice(void **state)
{
    (void)state;
    on_each_device(std_cases);
}

/* ------------------------------------------------------------- maximum, minimum */

static void maxmin_cases(kiln_device *dev, const char *spec)
{
    /* torch.maximum / minimum backward: ties (equal values, ±0 included) split g in
     * halves, NaN on either side gives g to both, the loser gets 0 */
    static const double a[7] = {1, 2, NAN, 1, INFINITY, 0.0, -0.0};
    static const double b[7] = {1, NAN, 2, 2, INFINITY, -0.0, 0.0};
    static const double ymax[7] = {1, NAN, NAN, 2, INFINITY, 0, 0}, ymin[7] = {1, NAN, NAN, 1, INFINITY, 0, 0};
    static const double ga_max[7] = {0.5, 1, 1, 0, 0.5, 0.5, 0.5}, gb_max[7] = {0.5, 1, 1, 1, 0.5, 0.5, 0.5};
    static const double ga_min[7] = {0.5, 1, 1, 1, 0.5, 0.5, 0.5}, gb_min[7] = {0.5, 1, 1, 0, 0.5, 0.5, 0.5};
    for (int mx = 0; mx < 2; mx++) {
        kiln_tensor *at = kiln_requires_grad(TENSOR(dev, KILN_F32, a, 7), true);
        kiln_tensor *bt = kiln_requires_grad(TENSOR(dev, KILN_F32, b, 7), true);
        kiln_tensor *y = mx ? kiln_maximum(at, bt) : kiln_minimum(at, bt);
        expect_values(spec, mx ? "maximum" : "minimum", y, 7, mx ? ymax : ymin, 0, 0);
        backward_of(spec, kiln_sum(y, KILN_ALL_DIMS, false));
        expect_grad(spec, mx ? "maximum da" : "minimum da", at, 7, mx ? ga_max : ga_min, 0, 0);
        expect_grad(spec, mx ? "maximum db" : "minimum db", bt, 7, mx ? gb_max : gb_min, 0, 0);
    }
}

static void test_maximum_minimum_nan(void **state)
{
    (void)state;
    on_each_device(maxmin_cases);
}

/* --------------------------------------------------------- batch_norm in f16/bf16 */

static void batch_norm_half_cases(kiln_device *dev, const char *spec)
{
    /* x [4, 2]: channel 0 {-300, 300, -300, 300} has variance 9e4, past f16's 65504;
     * channel 1 {1, 2, 3, 4}. weight [2, 0.5], bias [0.25, -1], loss sum(y c) with
     * c = [[1, 2], [3, 4], [5, 6], [7, 8]], running stats 0 and 1, momentum 0.1.
     * torch (float64): */
    static const double x[8] = {-300, 1, 300, 2, -300, 3, 300, 4};
    static const double c[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    static const double y[8] = {-1.749999999888889, -1.6708177099844632, 2.249999999888889, -1.2236059033281543,
                                -1.749999999888889, -0.7763940966718453, 2.249999999888889, -0.32918229001553634};
    static const double gx[8] = {-0.013333333333333334,   -1.0732997495703834e-05, -0.013333333331851854,
                                 -3.5776658318847275e-06, 0.013333333331851854,    3.5776658318847275e-06,
                                 0.013333333333333334,    1.0732997495703834e-05};
    static const double gw[2] = {3.999999999777778, 8.94423613312618}, gb[2] = {16, 20};
    /* 12000.9 rounds to 12000 in f16, 12032 in bf16: the tolerance covers both */
    static const double rm[2] = {0, 0.25}, rv[2] = {12000.9, 1.0666666666666667};
    static const kiln_dtype halves[2] = {KILN_F16, KILN_BF16};
    for (int h = 0; h < 2; h++) {
        kiln_dtype dt = halves[h];
        double tol = dt == KILN_F16 ? 2e-3 : 1.6e-2;
        kiln_tensor *xt = kiln_requires_grad(TENSOR(dev, dt, x, 4, 2), true);
        kiln_tensor *w = kiln_requires_grad(TENSOR(dev, dt, ((const double[]){2, 0.5}), 2), true);
        kiln_tensor *b = kiln_requires_grad(TENSOR(dev, dt, ((const double[]){0.25, -1}), 2), true);
        kiln_tensor *run_mean = kiln_keep(kiln_zeros(dev, dt, KILN_SHAPE(2)));
        kiln_tensor *run_var = kiln_keep(kiln_ones(dev, dt, KILN_SHAPE(2)));
        kiln_tensor *yt = kiln_batch_norm(xt, run_mean, run_var, w, b, true, 0.1, 1e-5);
        assert_non_null(yt);
        assert_int_equal(kiln_tensor_dtype(yt), dt);
        expect_values(spec, "batch_norm half y", yt, 8, y, tol, 0);
        expect_values(spec, "batch_norm half running_mean", run_mean, 2, rm, tol, 0);
        expect_values(spec, "batch_norm half running_var", run_var, 2, rv, tol, 0);
        backward_of(spec, kiln_sum(kiln_mul(yt, TENSOR(dev, dt, c, 4, 2)), KILN_ALL_DIMS, false));
        /* channel 1's input gradient is a cancellation (terms near 0.9 summing to 1e-5):
         * an absolute tolerance of the terms' rounding */
        expect_grad(spec, "batch_norm half dx", xt, 8, gx, tol, dt == KILN_F16 ? 1e-3 : 1e-2);
        expect_grad(spec, "batch_norm half dweight", w, 2, gw, tol, 0);
        expect_grad(spec, "batch_norm half dbias", b, 2, gb, tol, 0);
        kiln_tensor_release(run_mean);
        kiln_tensor_release(run_var);
    }
}

/* A batch of 70000 in f16: the backward's per-channel sum of g (70000 for loss sum(y))
 * is past f16's range, but the input gradient of sum(y) is 0 (y sums to N bias whatever
 * x is), as torch gives it, computing in float. */
static void batch_norm_long_half_cases(kiln_device *dev, const char *spec)
{
    enum {
        N = 70000
    };
    kiln_tensor *ramp = kiln_arange(dev, KILN_F32, 0, N, 1);
    kiln_tensor *x = kiln_requires_grad(
        kiln_cast(kiln_reshape(kiln_remainder(ramp, kiln_full(dev, KILN_F32, 0, NULL, 7)), KILN_SHAPE(N, 1)),
                  KILN_F16),
        true);
    backward_of(spec, kiln_sum(kiln_batch_norm(x, NULL, NULL, NULL, NULL, true, 0.1, 1e-5), KILN_ALL_DIMS, false));
    kiln_tensor *g = kiln_grad(x);
    assert_non_null(g);
    double worst = kiln_item(kiln_max(kiln_abs(kiln_cast(g, KILN_F32)), KILN_ALL_DIMS, false));
    if (!(worst <= 1e-3))
        fail_msg("batch_norm f16 N=%d dx on %s: max |dx| is %g, expected 0", N, spec, worst);
    kiln_tensor_release(g);
}

/* group_norm, composed rather than one node, normalizes half inputs in f32 too: one
 * group {-300, 300, -300, 300} (variance 9e4), loss sum(y [1, 2, 3, 4]). torch (f16 in,
 * float64 alike): y [-1, 1, -1, 1], dx [-1, -1, 1, 1] / 300. */
static void group_norm_half_cases(kiln_device *dev, const char *spec)
{
    static const double x[4] = {-300, 300, -300, 300}, c[4] = {1, 2, 3, 4};
    static const double y[4] = {-1, 1, -1, 1};
    static const double gx[4] = {-1.0 / 300, -1.0 / 300, 1.0 / 300, 1.0 / 300};
    static const kiln_dtype halves[2] = {KILN_F16, KILN_BF16};
    for (int h = 0; h < 2; h++) {
        double tol = halves[h] == KILN_F16 ? 2e-3 : 1.6e-2;
        kiln_tensor *xt = kiln_requires_grad(TENSOR(dev, halves[h], x, 1, 1, 4), true);
        kiln_tensor *yt = kiln_group_norm(xt, 1, NULL, NULL, 1e-5);
        assert_non_null(yt);
        assert_int_equal(kiln_tensor_dtype(yt), halves[h]);
        expect_values(spec, "group_norm half y", yt, 4, y, tol, 0);
        backward_of(spec, kiln_sum(kiln_mul(yt, TENSOR(dev, halves[h], c, 1, 1, 4)), KILN_ALL_DIMS, false));
        expect_grad(spec, "group_norm half dx", xt, 4, gx, tol, 0);
    }
}

static void test_batch_norm_half(void **state)
{
    (void)state;
    on_each_device(batch_norm_half_cases);
    on_each_device(batch_norm_long_half_cases);
    on_each_device(group_norm_half_cases);
}

/* ---------------------------------------------- activation derivatives in f16/bf16 */

typedef enum {
    ACT_GELU_TANH,
    ACT_ELU,
    ACT_SILU
} act_kind;

static void act_case(kiln_device *dev, const char *spec, const char *what, act_kind k, kiln_dtype dt, int n,
                     const double *x, const double *expected, double rtol)
{
    kiln_tensor *xt = kiln_requires_grad(tensor_of(dev, dt, 1, (const int64_t[]){n}, x), true);
    kiln_tensor *y = k == ACT_GELU_TANH ? kiln_gelu(xt, true) : k == ACT_ELU ? kiln_elu(xt, 1) : kiln_silu(xt);
    backward_of(spec, kiln_sum(y, KILN_ALL_DIMS, false));
    expect_grad(spec, what, xt, n, expected, rtol, 0);
}

static void half_activation_cases(kiln_device *dev, const char *spec)
{
    /* gelu's tanh form squares x: 256² is inf in f16 (derivative was NaN), and at -3.5
     * f16 rounding of the intermediates put it 40% off. torch (f16 in, computed in
     * float): [1, 1, 1, -0.0024223]; bf16 at -3.5: -0.0024261 (kiln's was 0). */
    act_case(dev, spec, "gelu tanh f16", ACT_GELU_TANH, KILN_F16, 4, (const double[]){200, 256, 300, -3.5},
             (const double[]){1, 1, 1, -0.002422332763671875}, 2e-3);
    act_case(dev, spec, "gelu tanh bf16", ACT_GELU_TANH, KILN_BF16, 2, (const double[]){-3.5, 300},
             (const double[]){-0.0024261474609375, 1}, 1.6e-2);
    /* elu at -20: alpha exp(x) = 2.0664e-9 (y + alpha cancelled to 0 in bf16) */
    act_case(dev, spec, "elu bf16", ACT_ELU, KILN_BF16, 2, (const double[]){-20, -3.5},
             (const double[]){2.066371962428093e-09, 0.0301513671875}, 1.6e-2);
    /* silu at -20: s (1 + x (1 - s)) = -5.96e-8 in f16 (the f16 intermediates gave 0) */
    act_case(dev, spec, "silu f16", ACT_SILU, KILN_F16, 2, (const double[]){-20, -3.5},
             (const double[]){-5.960464477539063e-08, -0.07025146484375}, 2e-3);
}

static void test_half_activation_grads(void **state)
{
    (void)state;
    on_each_device(half_activation_cases);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bce_at_zero_and_one),   cmocka_unit_test(test_cross_entropy_all_ignored),
        cmocka_unit_test(test_std_of_constant_slice), cmocka_unit_test(test_maximum_minimum_nan),
        cmocka_unit_test(test_batch_norm_half),       cmocka_unit_test(test_half_activation_grads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
