/*
 * tests/conformance/signed-zero.c — the sign of zero and the small-argument values of
 * the unary ops, on every backend that opens here, each against the answer C's libm (and
 * ref, and PyTorch) gives: the odd functions (sin, tanh, erf, expm1, elu, gelu in both
 * forms, silu) and relu (PyTorch's clamp at 0) keep -0 as -0; sign gives +0 for both zeros
 * and for NaN; maximum and minimum of equal operands give the first (std::max's rule, which
 * PyTorch's scalar kernel follows), so maximum(x, -x) and minimum(x, -x) are x at ±0; expm1, log1p and tanh of ±1e-6 are x to a few ulps (a driver's log(exp(x))
 * folded to x, or an inexact log near 1, once put them 1-7% off).
 *
 * The ops run as a chain op -> neg -> neg over 2^17 elements, so that the devices that
 * fuse elementwise chains (cpu?fusion=on, vulkan:0) run them in their generated kernels
 * too; vulkan:0?fusion=off and the cpu kernel tables (kernels=avx2, kernels=base) run
 * the plain kernels. A device that does not open here is skipped with a line.
 *
 *   signed-zero [-v]
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/tensor.h"

#define N (1 << 17)

static const char *const devices[] = {"ref",           "cpu",      "cpu?kernels=avx2",   "cpu?kernels=base",
                                      "cpu?fusion=on", "vulkan:0", "vulkan:0?fusion=off"};

typedef enum {
    OP_SIN,
    OP_TANH,
    OP_ERF,
    OP_EXPM1,
    OP_ELU,
    OP_GELU,
    OP_GELU_TANH,
    OP_SILU,
    OP_LOG1P,
    OP_SIGN,
    OP_RELU,
    OP_MAXIMUM,
    OP_MINIMUM,
    OP_COUNT
} op_id;

static const char *const op_names[OP_COUNT] = {"sin",  "tanh",  "erf",  "expm1", "elu",     "gelu",   "gelu_tanh",
                                               "silu", "log1p", "sign", "relu",  "maximum", "minimum"};

static kiln_tensor *apply(op_id op, kiln_tensor *x)
{
    switch (op) {
    case OP_SIN: return kiln_sin(x);
    case OP_TANH: return kiln_tanh(x);
    case OP_ERF: return kiln_erf(x);
    case OP_EXPM1: return kiln_expm1(x);
    case OP_ELU: return kiln_elu(x, 1.0);
    case OP_GELU: return kiln_gelu(x, false);
    case OP_GELU_TANH: return kiln_gelu(x, true);
    case OP_SILU: return kiln_silu(x);
    case OP_LOG1P: return kiln_log1p(x);
    case OP_RELU: return kiln_relu(x);
    case OP_MAXIMUM: return kiln_maximum(x, kiln_neg(x));
    case OP_MINIMUM: return kiln_minimum(x, kiln_neg(x));
    default: return kiln_sign(x);
    }
}

/* The probes at the head of the input; the rest is filler the chain also runs over. */
enum {
    AT_NEG_ZERO,
    AT_POS_ZERO,
    AT_NAN,
    AT_NEG_SMALL,
    AT_POS_SMALL,
    NPROBE
};
static const double probe[NPROBE] = {-0.0, 0.0, NAN, -1e-6, 1e-6};

/* What the op gives at a small x, from libm (the ops' definitions; ref agrees). */
static double small_value(op_id op, double x)
{
    switch (op) {
    case OP_TANH: return tanh(x);
    case OP_EXPM1: return expm1(x);
    case OP_LOG1P: return log1p(x);
    default: return NAN; /* not checked */
    }
}

static int g_failed, g_passed, g_verbose;

static void check(bool ok, const char *dev, const char *dt, op_id op, const char *fmt, double got, double want)
{
    if (ok) {
        g_passed++;
        return;
    }
    g_failed++;
    printf("FAIL %-20s %-4s %-9s ", dev, dt, op_names[op]);
    printf(fmt, got, want);
    printf("\n");
}

static void run_device(const char *spec, kiln_device *dev, const float *host)
{
    static const kiln_dtype dtypes[4] = {KILN_F32, KILN_F64, KILN_F16, KILN_BF16};
    for (int d = 0; d < 4; d++) {
        kiln_dtype dt = dtypes[d];
        const char *dn = kiln_dtype_name(dt);
        for (int op = 0; op < OP_COUNT; op++) {
            kiln_scope_begin();
            kiln_tensor *x = kiln_cast(kiln_from_data(dev, KILN_F32, KILN_SHAPE(N), host, N * sizeof(float)), dt);
            kiln_tensor *y = kiln_neg(kiln_neg(apply((op_id)op, x)));
            double got[NPROBE];
            kiln_tensor *head = y ? kiln_cast(kiln_narrow(y, 0, 0, NPROBE), KILN_F64) : NULL;
            if (!head || kiln_to_data(head, got, sizeof got) != 0) {
                g_failed++;
                printf("FAIL %-20s %-4s %-9s did not run: %s\n", spec, dn, op_names[op], kiln_error());
                kiln_scope_end();
                continue;
            }
            kiln_scope_end();
            if (op == OP_SIGN) {
                for (int i = AT_NEG_ZERO; i <= AT_NAN; i++)
                    check(got[i] == 0 && !signbit(got[i]), spec, dn, (op_id)op, "of ±0/NaN is %g, want %g", got[i],
                          0.0);
                continue;
            }
            /* f(±0) = ±0 */
            check(got[AT_NEG_ZERO] == 0 && signbit(got[AT_NEG_ZERO]), spec, dn, (op_id)op, "(-0) is %g, want %g",
                  got[AT_NEG_ZERO], -0.0);
            check(got[AT_POS_ZERO] == 0 && !signbit(got[AT_POS_ZERO]), spec, dn, (op_id)op, "(+0) is %g, want %g",
                  got[AT_POS_ZERO], 0.0);
            /* x to a few ulps at ±1e-6 (float dtypes with the precision to tell) */
            double want_neg = small_value((op_id)op, (float)probe[AT_NEG_SMALL]);
            if (!isnan(want_neg) && (dt == KILN_F32 || dt == KILN_F64)) {
                double rtol = dt == KILN_F32 ? 5e-7 : 1e-12;
                for (int i = AT_NEG_SMALL; i <= AT_POS_SMALL; i++) {
                    double want = small_value((op_id)op, (float)probe[i]);
                    check(fabs(got[i] - want) <= rtol * fabs(want), spec, dn, (op_id)op,
                          "(±1e-6) is %.9g, want %.9g", got[i], want);
                }
            }
            if (g_verbose)
                printf("ok   %-20s %-4s %s\n", spec, dn, op_names[op]);
        }
    }
}

int main(int argc, char **argv)
{
    g_verbose = argc > 1 && strcmp(argv[1], "-v") == 0;
    float *host = malloc(N * sizeof(float));
    if (!host)
        return 1;
    for (int i = 0; i < N; i++)
        host[i] = i < NPROBE ? (float)probe[i] : (float)((i % 401) - 200) * 0.01f;
    for (size_t d = 0; d < sizeof devices / sizeof devices[0]; d++) {
        kiln_device *dev = kiln_device_open(devices[d]);
        if (!dev) {
            if (strncmp(devices[d], "vulkan", 6) != 0) {
                printf("FAIL cannot open %s: %s\n", devices[d], kiln_error());
                g_failed++;
            } else {
                printf("backend %s: does not open here (%s); not tested\n", devices[d], kiln_error());
            }
            continue;
        }
        run_device(devices[d], dev, host);
        kiln_device_close(dev);
    }
    free(host);
    printf("signed-zero: %d passed, %d failed\n", g_passed, g_failed);
    return g_failed ? 1 : 0;
}
