/*
 * backends/ref/ref-elementwise.c — unary, binary and where.
 *
 * Each op is written once per domain: a double formula for floating outputs and an
 * int64 formula for integer outputs (wrapping on overflow, as PyTorch's integer
 * tensors do). The formulas are PyTorch's: round is half to even, remainder takes the
 * divisor's sign, maximum/minimum and relu/clamp propagate NaN, sign(NaN) = 0.
 *
 * Integer division and remainder by zero are undefined in C and an error in PyTorch;
 * here they give 0, so a stray zero in an integer tensor can never crash the process.
 * Integer DIV rounds toward negative infinity (Python's //), so that
 * a == b * div(a, b) + remainder(a, b) holds for every b != 0. Integer POW with a
 * negative exponent gives 1 for base 1, ±1 for base -1 and 0 otherwise.
 *
 * Support is checked before the first element is written, so an unsupported
 * combination leaves out untouched.
 */
#include "ref-impl.h"

/* ------------------------------------------------------------------- unary */

static double sigmoid(double x)
{
    return 1.0 / (1.0 + exp(-x));
}

static double unary_f(kiln_unary_op op, double x, double alpha, double beta)
{
    switch (op) {
    case KILN_UNARY_NEG: return -x;
    case KILN_UNARY_ABS: return fabs(x);
    case KILN_UNARY_SIGN: return (double)((0 < x) - (x < 0)); /* NaN and ±0 give 0 */
    case KILN_UNARY_EXP: return exp(x);
    case KILN_UNARY_LOG: return log(x);
    case KILN_UNARY_LOG1P: return log1p(x);
    case KILN_UNARY_EXPM1: return expm1(x);
    case KILN_UNARY_SQRT: return sqrt(x);
    case KILN_UNARY_RSQRT: return 1.0 / sqrt(x);
    case KILN_UNARY_SQUARE: return x * x;
    case KILN_UNARY_RECIPROCAL: return 1.0 / x;
    case KILN_UNARY_SIN: return sin(x);
    case KILN_UNARY_COS: return cos(x);
    case KILN_UNARY_TANH: return tanh(x);
    case KILN_UNARY_SIGMOID: return sigmoid(x);
    case KILN_UNARY_RELU: return x < 0 ? 0.0 : x; /* NaN and -0 pass through, as PyTorch's */
    case KILN_UNARY_LEAKY_RELU: return x > 0 ? x : alpha * x;
    case KILN_UNARY_ELU: return x > 0 ? x : alpha * expm1(x);
    case KILN_UNARY_GELU: return 0.5 * x * (1.0 + erf(x * 0.70710678118654752440));
    case KILN_UNARY_GELU_TANH: {
        const double k = 0.79788456080286535588; /* sqrt(2 / pi) */
        return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
    }
    case KILN_UNARY_SILU: return x * sigmoid(x);
    case KILN_UNARY_SOFTPLUS:
        /* alpha = beta, beta = threshold: linear once beta * x passes the threshold. */
        return x * alpha > beta ? x : log1p(exp(x * alpha)) / alpha;
    case KILN_UNARY_ERF: return erf(x);
    case KILN_UNARY_FLOOR: return floor(x);
    case KILN_UNARY_CEIL: return ceil(x);
    case KILN_UNARY_ROUND: return nearbyint(x); /* default rounding mode: ties to even */
    case KILN_UNARY_CLAMP:
        if (isnan(x))
            return x;
        x = x < alpha ? alpha : x;
        return x > beta ? beta : x; /* lo > hi gives hi, as torch.clamp */
    case KILN_UNARY_POW_SCALAR:
        /* PyTorch computes x ** 0.5 as sqrt and x ** -0.5 as rsqrt, which differ from
         * pow at -inf and -0 (pow(-inf, 0.5) is +inf, sqrt(-inf) NaN) */
        if (alpha == 0.5)
            return sqrt(x);
        if (alpha == -0.5)
            return 1.0 / sqrt(x);
        return pow(x, alpha);
    case KILN_UNARY_ADD_SCALAR: return x + alpha;
    case KILN_UNARY_MUL_SCALAR: return x * alpha;
    default: return NAN;
    }
}

static bool integral(double v)
{
    return isfinite(v) && v == floor(v) && fabs(v) < 9007199254740992.0;
}

/** Wrapping integer power; negative exponents as documented at the top. */
static int64_t ipow(int64_t base, int64_t e)
{
    if (e < 0)
        return base == 1 ? 1 : base == -1 ? ((e & 1) ? -1 : 1) : 0;
    int64_t r = 1;
    while (e) {
        if (e & 1)
            r = ref_wmul(r, base);
        base = ref_wmul(base, base);
        e >>= 1;
    }
    return r;
}

/** Ops with an integer formula (integer output); everything else needs a float out. */
static bool unary_has_int(kiln_unary_op op, double alpha)
{
    switch (op) {
    case KILN_UNARY_NEG: case KILN_UNARY_ABS: case KILN_UNARY_SIGN: case KILN_UNARY_SQUARE:
    case KILN_UNARY_RELU: case KILN_UNARY_CLAMP: case KILN_UNARY_FLOOR: case KILN_UNARY_CEIL:
    case KILN_UNARY_ROUND: case KILN_UNARY_ADD_SCALAR: case KILN_UNARY_MUL_SCALAR:
        return true;
    case KILN_UNARY_POW_SCALAR:
        return integral(alpha);
    default:
        return false;
    }
}

static int64_t unary_i(kiln_unary_op op, int64_t x, double alpha, double beta)
{
    switch (op) {
    case KILN_UNARY_NEG: return ref_wsub(0, x);
    case KILN_UNARY_ABS: return x < 0 ? ref_wsub(0, x) : x;
    case KILN_UNARY_SIGN: return (0 < x) - (x < 0);
    case KILN_UNARY_SQUARE: return ref_wmul(x, x);
    case KILN_UNARY_RELU: return x > 0 ? x : 0;
    case KILN_UNARY_CLAMP: {
        /* Compared in int64: through a double, an i64 past 2^53 rounds onto the bound
         * (2^53 + 1 read as 2^53 passed a bound of 2^53). For an integer x, x < alpha is
         * x < ceil(alpha); a bound past the int64 range saturates, which compares alike. */
        int64_t lo = ref_d2i(ceil(alpha)), hi = ref_d2i(floor(beta));
        if (x < lo)
            x = lo;
        return x > hi ? hi : x; /* lo > hi gives hi, as torch.clamp */
    }
    case KILN_UNARY_FLOOR: case KILN_UNARY_CEIL: case KILN_UNARY_ROUND: return x;
    case KILN_UNARY_POW_SCALAR: return ipow(x, (int64_t)alpha);
    case KILN_UNARY_ADD_SCALAR:
        return integral(alpha) ? ref_wadd(x, (int64_t)alpha) : ref_d2i((double)x + alpha);
    case KILN_UNARY_MUL_SCALAR:
        return integral(alpha) ? ref_wmul(x, (int64_t)alpha) : ref_d2i((double)x * alpha);
    default: return 0;
    }
}

int kiln__ref_unary(void *ctx, kiln_unary_op op, const kiln_tdesc *out, const kiln_tdesc *in,
                    double alpha, double beta)
{
    if ((unsigned)op >= KILN_UNARY_COUNT)
        return ref_fail(KILN_EINVAL, "ref unary: unknown op %d", (int)op);
    bool predicate = op == KILN_UNARY_ISNAN || op == KILN_UNARY_ISINF ||
                     op == KILN_UNARY_LOGICAL_NOT;
    bool out_float = ref_is_float(out->dtype);
    bool in_float = ref_is_float(in->dtype);
    /* sign of a bool tensor is the identity with a bool result, as in PyTorch */
    bool bool_sign = op == KILN_UNARY_SIGN && in->dtype == KILN_BOOL && out->dtype == KILN_BOOL;
    if (!predicate && !out_float && !bool_sign &&
        (out->dtype == KILN_BOOL || in_float || !unary_has_int(op, alpha)))
        return ref_fail(KILN_ENOTSUP, "ref unary: %s is not supported from %s to %s", kiln__unary_name(op),
                        kiln__ref_dtype_name(in->dtype), kiln__ref_dtype_name(out->dtype));
    if (op == KILN_UNARY_POW_SCALAR && !out_float && alpha < 0)
        return ref_fail(KILN_ENOTSUP,
                        "ref unary: integers to negative integer powers are not allowed (%s)",
                        kiln__ref_dtype_name(out->dtype));

    ref_iter it;
    int64_t n = ref_iter_init(&it, out->ndim, out->shape);
    ref_iter_add_t(&it, out);
    ref_iter_add_t(&it, in);
    unsigned char *ob = ref_data(out);
    const unsigned char *ib = ref_data(in);
    for (int64_t i = 0; i < n; i++, ref_iter_next(&it)) {
        int64_t o = it.off[0], s = it.off[1];
        if (predicate) {
            bool r;
            if (op == KILN_UNARY_LOGICAL_NOT)
                r = in_float ? ref_getf(in->dtype, ib, s) == 0 : ref_geti(in->dtype, ib, s) == 0;
            else if (!in_float)
                r = false; /* integers are never NaN or infinite */
            else if (op == KILN_UNARY_ISNAN)
                r = isnan(ref_getf(in->dtype, ib, s));
            else
                r = isinf(ref_getf(in->dtype, ib, s));
            ref_seti(out->dtype, ob, o, r);
        } else if (out_float) {
            ref_setf(out->dtype, ob, o, unary_f(op, ref_getf(in->dtype, ib, s), alpha, beta));
        } else {
            ref_seti(out->dtype, ob, o, unary_i(op, ref_geti(in->dtype, ib, s), alpha, beta));
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ binary */

static double binary_f(kiln_binary_op op, double a, double b)
{
    switch (op) {
    case KILN_BINARY_ADD: return a + b;
    case KILN_BINARY_SUB: return a - b;
    case KILN_BINARY_MUL: return a * b;
    case KILN_BINARY_DIV: return a / b;
    case KILN_BINARY_REMAINDER: {
        double m = fmod(a, b);
        if (m != 0 && ((b < 0) != (m < 0)))
            m += b;
        return m;
    }
    case KILN_BINARY_POW: return pow(a, b);
    /* NaN wins; otherwise std::max / std::min (the first operand on ties). */
    case KILN_BINARY_MAXIMUM: return isnan(a) || isnan(b) ? NAN : (a < b ? b : a);
    case KILN_BINARY_MINIMUM: return isnan(a) || isnan(b) ? NAN : (b < a ? b : a);
    default: return NAN;
    }
}

static int64_t binary_i(kiln_binary_op op, int64_t a, int64_t b)
{
    switch (op) {
    case KILN_BINARY_ADD: return ref_wadd(a, b);
    case KILN_BINARY_SUB: return ref_wsub(a, b);
    case KILN_BINARY_MUL: return ref_wmul(a, b);
    case KILN_BINARY_DIV: {
        if (b == 0)
            return 0;
        if (b == -1)
            return ref_wsub(0, a); /* INT64_MIN / -1 wraps instead of trapping */
        int64_t q = a / b;
        if ((a % b != 0) && ((a < 0) != (b < 0)))
            q--; /* floor, as Python's // */
        return q;
    }
    case KILN_BINARY_REMAINDER: {
        if (b == 0 || b == -1)
            return 0;
        int64_t r = a % b;
        if (r != 0 && ((r < 0) != (b < 0)))
            r += b;
        return r;
    }
    case KILN_BINARY_POW: return ipow(a, b);
    case KILN_BINARY_MAXIMUM: return a < b ? b : a;
    case KILN_BINARY_MINIMUM: return b < a ? b : a;
    default: return 0;
    }
}

int kiln__ref_binary(void *ctx, kiln_binary_op op, const kiln_tdesc *out, const kiln_tdesc *a,
                     const kiln_tdesc *b)
{
    if ((unsigned)op >= KILN_BINARY_COUNT)
        return ref_fail(KILN_EINVAL, "ref binary: unknown op %d", (int)op);
    bool compare = op >= KILN_BINARY_EQ && op <= KILN_BINARY_GE;
    bool logical = op >= KILN_BINARY_LOGICAL_AND;
    bool out_float = ref_is_float(out->dtype);
    /* Comparisons look at the inputs' domain; arithmetic at the output's. */
    bool in_float = ref_is_float(a->dtype) || ref_is_float(b->dtype);
    if (!compare && !logical && out->dtype == KILN_BOOL &&
        !(op == KILN_BINARY_ADD || op == KILN_BINARY_MUL || op == KILN_BINARY_MAXIMUM ||
          op == KILN_BINARY_MINIMUM))
        return ref_fail(KILN_ENOTSUP, "ref binary: %s is not defined for bool", kiln__binary_name(op));

    ref_iter it;
    int64_t n = ref_iter_init(&it, out->ndim, out->shape);
    ref_iter_add_t(&it, out);
    ref_iter_add_t(&it, a);
    ref_iter_add_t(&it, b);
    unsigned char *ob = ref_data(out);
    const unsigned char *ab = ref_data(a), *bb = ref_data(b);
    for (int64_t i = 0; i < n; i++, ref_iter_next(&it)) {
        int64_t o = it.off[0], sa = it.off[1], sb = it.off[2];
        if (compare) {
            int c; /* -1, 0, 1, or 2 for unordered (a NaN is involved) */
            if (in_float) {
                double x = ref_getf(a->dtype, ab, sa), y = ref_getf(b->dtype, bb, sb);
                c = x < y ? -1 : x > y ? 1 : x == y ? 0 : 2;
            } else {
                int64_t x = ref_geti(a->dtype, ab, sa), y = ref_geti(b->dtype, bb, sb);
                c = x < y ? -1 : x > y ? 1 : 0;
            }
            bool r;
            switch (op) {
            case KILN_BINARY_EQ: r = c == 0; break;
            case KILN_BINARY_NE: r = c != 0; break;
            case KILN_BINARY_LT: r = c == -1; break;
            case KILN_BINARY_LE: r = c == -1 || c == 0; break;
            case KILN_BINARY_GT: r = c == 1; break;
            default: r = c == 1 || c == 0; break;
            }
            ref_seti(out->dtype, ob, o, r);
        } else if (logical) {
            /* Truth is "nonzero"; NaN is nonzero, hence true. */
            bool x = ref_is_float(a->dtype) ? ref_getf(a->dtype, ab, sa) != 0
                                            : ref_geti(a->dtype, ab, sa) != 0;
            bool y = ref_is_float(b->dtype) ? ref_getf(b->dtype, bb, sb) != 0
                                            : ref_geti(b->dtype, bb, sb) != 0;
            bool r = op == KILN_BINARY_LOGICAL_AND ? (x && y)
                     : op == KILN_BINARY_LOGICAL_OR ? (x || y)
                                                     : (x != y);
            ref_seti(out->dtype, ob, o, r);
        } else if (out_float) {
            ref_setf(out->dtype, ob, o,
                     binary_f(op, ref_getf(a->dtype, ab, sa), ref_getf(b->dtype, bb, sb)));
        } else {
            ref_seti(out->dtype, ob, o,
                     binary_i(op, ref_geti(a->dtype, ab, sa), ref_geti(b->dtype, bb, sb)));
        }
    }
    return 0;
}

/* ------------------------------------------------------------------- where */

int kiln__ref_where(void *ctx, const kiln_tdesc *out, const kiln_tdesc *cond, const kiln_tdesc *a,
                    const kiln_tdesc *b)
{
    ref_iter it;
    int64_t n = ref_iter_init(&it, out->ndim, out->shape);
    ref_iter_add_t(&it, out);
    ref_iter_add_t(&it, cond);
    ref_iter_add_t(&it, a);
    ref_iter_add_t(&it, b);
    unsigned char *ob = ref_data(out);
    const unsigned char *cb = ref_data(cond), *ab = ref_data(a), *bb = ref_data(b);
    for (int64_t i = 0; i < n; i++, ref_iter_next(&it)) {
        bool c = ref_is_float(cond->dtype) ? ref_getf(cond->dtype, cb, it.off[1]) != 0
                                           : ref_geti(cond->dtype, cb, it.off[1]) != 0;
        if (c)
            ref_move(out->dtype, ob, it.off[0], a->dtype, ab, it.off[2]);
        else
            ref_move(out->dtype, ob, it.off[0], b->dtype, bb, it.off[3]);
    }
    return 0;
}
