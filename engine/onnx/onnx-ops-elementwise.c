/*
 * onnx-ops-elementwise.c — ONNX's unary, binary, comparison, logical and activation
 * operators on kiln's elementwise ops. ONNX and kiln both broadcast as NumPy does, so
 * most operators are one call; the exceptions are integer Div (ONNX truncates, kiln's
 * true division gives floats), Clip (bounds moved from attributes to inputs in opset 11)
 * and the activations ONNX spells out with parameters (HardSigmoid, HardSwish).
 */
#include <math.h>
#include <string.h>

#include "onnx-impl.h"
#include "tensor-impl.h"

#define UNARY(NAME, EXPR)                                                                                         \
    static int NAME(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out)       \
    {                                                                                                             \
        KILN__ONNX_NEED(1);                                                                                       \
        kiln_tensor *x = in[0];                                                                                   \
        out[0] = (EXPR);                                                                                          \
        return out[0] ? 0 : -1;                                                                                   \
    }

static bool is_int(kiln_tensor *t) { return !kiln_dtype_is_float(kiln_tensor_dtype(t)); }

UNARY(op_neg, kiln_neg(x))
UNARY(op_abs, kiln_abs(x))
UNARY(op_exp, kiln_exp(x))
UNARY(op_log, kiln_log(x))
UNARY(op_sqrt, kiln_sqrt(x))
UNARY(op_reciprocal, kiln_reciprocal(x))
UNARY(op_erf, kiln_erf(x))
UNARY(op_tanh, kiln_tanh(x))
UNARY(op_sigmoid, kiln_sigmoid(x))
UNARY(op_relu, kiln_relu(x))
UNARY(op_floor, kiln_floor(x))
UNARY(op_ceil, kiln_ceil(x))
UNARY(op_round, kiln_round(x))
UNARY(op_sin, kiln_sin(x))
UNARY(op_cos, kiln_cos(x))
UNARY(op_sign, kiln_sign(x))
UNARY(op_not, kiln_logical_not(x))
UNARY(op_softplus, kiln_softplus(x, 1.0, 20.0))
UNARY(op_identity, (x))
UNARY(op_leaky_relu, kiln_leaky_relu(x, kiln__onnx_attr_float(n, "alpha", 0.01)))
UNARY(op_elu, kiln_elu(x, kiln__onnx_attr_float(n, "alpha", 1.0)))
UNARY(op_gelu, kiln_gelu(x, !strcmp(kiln__onnx_attr_str(n, "approximate", "none"), "tanh")))
UNARY(op_isnan, kiln_isnan(x))
UNARY(op_isinf, kiln_isinf(x))

/* max(0, min(1, alpha x + beta)) */
static kiln_tensor *hard_sigmoid(kiln_tensor *x, double alpha, double beta) {
    return kiln_clamp(kiln_add_scalar(kiln_mul_scalar(x, alpha), beta), 0.0, 1.0);
}
UNARY(op_hard_sigmoid, hard_sigmoid(x, kiln__onnx_attr_float(n, "alpha", 0.2), kiln__onnx_attr_float(n, "beta", 0.5)))
UNARY(op_hard_swish, kiln_mul(x, hard_sigmoid(x, 1.0 / 6.0, 0.5)))

#define BINARY(NAME, EXPR)                                                                                        \
    static int NAME(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out)       \
    {                                                                                                             \
        KILN__ONNX_NEED(2);                                                                                       \
        kiln_tensor *a = in[0], *b = in[1];                                                                       \
        out[0] = (EXPR);                                                                                          \
        return out[0] ? 0 : -1;                                                                                   \
    }

BINARY(op_add, kiln_add(a, b))
BINARY(op_sub, kiln_sub(a, b))
BINARY(op_mul, kiln_mul(a, b))
BINARY(op_pow, kiln_cast(kiln_pow(a, b), kiln_tensor_dtype(a)))
BINARY(op_equal, kiln_eq(a, b))
BINARY(op_less, kiln_lt(a, b))
BINARY(op_less_equal, kiln_le(a, b))
BINARY(op_greater, kiln_gt(a, b))
BINARY(op_greater_equal, kiln_ge(a, b))
BINARY(op_and, kiln_logical_and(a, b))
BINARY(op_or, kiln_logical_or(a, b))
BINARY(op_xor, kiln_logical_xor(a, b))

/* Integer Div and Mod by zero fail, as in ONNX Runtime ("Integer division by zero"): the
 * f64 quotient below would saturate to INT64_MAX and kiln's integer remainder gives 0, a
 * wrong value either way. One reduction over the divisor and one read, on integer operands
 * only (float division by zero is IEEE's inf or nan, as ONNX has it). */
static int check_divisor(const kiln__onnx_node *n, kiln_tensor *b, const char *what)
{
    kiln_tensor *zero = kiln_any(kiln_logical_not(b), 0, NULL, false);
    double v = zero ? kiln_item(zero) : NAN;
    if (isnan(v))
        return -1;
    return v != 0 ? kiln__onnx_fail(n, "integer %s by zero", what) : 0;
}

/* Integer division truncates toward zero in ONNX; done in f64, exact for |v| < 2^53. */
/* Integer Div of shape values on a host-memory device (the head size of an attention
 * layer: the embedding width over the head count), computed on the host: the device path
 * below takes nine ops. Only int64 vectors or scalars of at most 64 elements, one of them a
 * single element or both the same length, and magnitudes under 2^52, where the device
 * path's f64 quotient, truncated, is the exact integer quotient: the result is the same
 * either way. 1 with *out made, 0 when the operands are not such (the device path checks for
 * a zero divisor then), -1 with a message on a zero divisor. */
static int div_small_ints(const kiln__onnx_node *nd, kiln_tensor *a, kiln_tensor *b, kiln_tensor **out)
{
    enum {
        MAXV = 64
    };
    kiln_device *dev = kiln__dev(a);
    int64_t na = kiln_tensor_numel(a), nb = kiln_tensor_numel(b);
    if (!kiln__onnx_small_host_ints(a, dev, MAXV) || !kiln__onnx_small_host_ints(b, dev, MAXV) || a->ndim > 1 ||
        b->ndim > 1 || na < 1 || nb < 1 || (na != nb && na != 1 && nb != 1))
        return 0;
    int64_t x[MAXV], y[MAXV], q[MAXV];
    if (kiln_to_data(a, x, (size_t)na * sizeof *x) != 0 || kiln_to_data(b, y, (size_t)nb * sizeof *y) != 0) {
        kiln_error_clear();
        return 0;
    }
    const int64_t big = (int64_t)1 << 52;
    int64_t n = na > nb ? na : nb;
    for (int64_t i = 0; i < n; i++) {
        int64_t u = x[na == 1 ? 0 : i], v = y[nb == 1 ? 0 : i];
        if (v == 0)
            return kiln__onnx_fail(nd, "integer division by zero");
        if (u <= -big || u >= big || v <= -big || v >= big)
            return 0;
        q[i] = u / v; /* C truncates toward zero, as the device path does */
    }
    const kiln_tensor *shaped = a->ndim >= b->ndim && na >= nb ? a : b;
    *out = kiln_from_data(dev, KILN_I64, shaped->ndim, shaped->shape, q, (size_t)n * sizeof *q);
    return *out ? 1 : -1;
}

static int op_div(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(2);
    if (!is_int(in[0]) || !is_int(in[1])) {
        out[0] = kiln_div(in[0], in[1]);
        return out[0] ? 0 : -1;
    }
    int small = div_small_ints(n, in[0], in[1], &out[0]);
    if (small != 0)
        return small > 0 ? 0 : -1;
    if (check_divisor(n, in[1], "division"))
        return -1;
    kiln_tensor *q = kiln_div(kiln_cast(in[0], KILN_F64), kiln_cast(in[1], KILN_F64));
    kiln_tensor *t = kiln_where(kiln_lt(q, kiln_zeros_like(q)), kiln_ceil(q), kiln_floor(q));
    out[0] = kiln_cast(t, kiln_promote_types(kiln_tensor_dtype(in[0]), kiln_tensor_dtype(in[1])));
    return out[0] ? 0 : -1;
}

/* fmod = 1: C's fmod (sign of the dividend); fmod = 0: Python's (sign of the divisor). */
static int op_mod(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(2);
    if (is_int(in[0]) && is_int(in[1]) && check_divisor(n, in[1], "modulo"))
        return -1;
    kiln_tensor *r = kiln_remainder(in[0], in[1]);
    if (kiln__onnx_attr_int(n, "fmod", 0)) {
        /* remainder differs from fmod only when it is non-zero and the signs differ */
        kiln_tensor *fix = kiln_logical_and(kiln_ne(r, kiln_zeros_like(r)),
                                            kiln_ne(kiln_lt(r, kiln_zeros_like(r)), kiln_lt(in[0], kiln_zeros_like(in[0]))));
        r = kiln_where(fix, kiln_sub(r, in[1]), r);
    }
    out[0] = r;
    return r ? 0 : -1;
}

static int variadic(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, kiln_tensor **out,
                    kiln_tensor *(*f)(kiln_tensor *, kiln_tensor *)) {
    KILN__ONNX_NEED(1);
    kiln_tensor *acc = in[0];
    for (int i = 1; i < nin; i++)
        if (in[i]) acc = f(acc, in[i]);
    out[0] = nin == 1 ? (acc) : acc;
    return out[0] ? 0 : -1;
}
static int op_max(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    return variadic(n, nin, in, out, kiln_maximum);
}
static int op_min(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    return variadic(n, nin, in, out, kiln_minimum);
}
static int op_sum(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    return variadic(n, nin, in, out, kiln_add);
}
static int op_mean(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    if (variadic(n, nin, in, out, kiln_add)) return -1;
    out[0] = kiln_mul_scalar(out[0], 1.0 / nin);
    return out[0] ? 0 : -1;
}

static int op_clip(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(1);
    double lo = -INFINITY, hi = INFINITY;
    if (n->opset < 11) {
        lo = kiln__onnx_attr_float(n, "min", -INFINITY);
        hi = kiln__onnx_attr_float(n, "max", INFINITY);
    } else {
        if (nin > 1 && in[1] && kiln__onnx_read_scalar(n, in[1], &lo)) return -1;
        if (nin > 2 && in[2] && kiln__onnx_read_scalar(n, in[2], &hi)) return -1;
    }
    out[0] = kiln_clamp(in[0], lo, hi);
    return out[0] ? 0 : -1;
}

static int op_where(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(3);
    kiln_tensor *c = kiln_tensor_dtype(in[0]) == KILN_BOOL ? in[0] : kiln_cast(in[0], KILN_BOOL);
    out[0] = kiln_where(c, in[1], in[2]);
    return out[0] ? 0 : -1;
}

static int op_cast(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(1);
    int to = (int)kiln__onnx_attr_int(n, "to", 0);
    int k = kiln__onnx_kdtype(to);
    if (k < 0) return kiln__onnx_fail(n, "cannot cast to ONNX type %d", to);
    out[0] = kiln_cast(in[0], (kiln_dtype)k);
    return out[0] ? 0 : -1;
}

static int op_cast_like(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(2);
    out[0] = kiln_cast(in[0], kiln_tensor_dtype(in[1]));
    return out[0] ? 0 : -1;
}

const kiln__onnx_op kiln__onnx_ops_elementwise[] = {
    {"Neg", op_neg}, {"Abs", op_abs}, {"Exp", op_exp}, {"Log", op_log}, {"Sqrt", op_sqrt},
    {"Reciprocal", op_reciprocal}, {"Erf", op_erf}, {"Tanh", op_tanh}, {"Sigmoid", op_sigmoid},
    {"Relu", op_relu}, {"Floor", op_floor}, {"Ceil", op_ceil}, {"Round", op_round}, {"Sin", op_sin},
    {"Cos", op_cos}, {"Sign", op_sign}, {"Not", op_not}, {"Softplus", op_softplus},
    {"Identity", op_identity}, {"LeakyRelu", op_leaky_relu}, {"Elu", op_elu}, {"Gelu", op_gelu},
    {"IsNaN", op_isnan}, {"IsInf", op_isinf}, {"HardSigmoid", op_hard_sigmoid}, {"HardSwish", op_hard_swish},
    {"Add", op_add}, {"Sub", op_sub}, {"Mul", op_mul}, {"Div", op_div}, {"Pow", op_pow}, {"Mod", op_mod},
    {"Equal", op_equal}, {"Less", op_less}, {"LessOrEqual", op_less_equal}, {"Greater", op_greater},
    {"GreaterOrEqual", op_greater_equal}, {"And", op_and}, {"Or", op_or}, {"Xor", op_xor},
    {"Max", op_max}, {"Min", op_min}, {"Sum", op_sum}, {"Mean", op_mean}, {"Clip", op_clip},
    {"Where", op_where}, {"Cast", op_cast}, {"CastLike", op_cast_like},
    {NULL, NULL},
};
