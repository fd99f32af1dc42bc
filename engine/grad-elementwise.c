/*
 * engine/grad-elementwise.c — recording hooks and backward functions of the unary,
 * binary and selection ops (where, masked_fill, tril, triu).
 *
 * Formulas follow PyTorch's derivatives: floor/ceil/round/sign have a zero gradient,
 * clamp passes the gradient where lo <= x <= hi, maximum/minimum split it evenly on
 * ties and give all of it to both operands where either is NaN, pow's exponent gradient
 * is zero where the base is 0 and the exponent is non-negative; the activations' on
 * f16/bf16 are taken in f32 (half_intermediates). Binary gradients are computed at the
 * output's (broadcast) shape and summed back to each operand's shape; the engine casts
 * them to the operand's dtype.
 */
#include <math.h>

#include "autograd-impl.h"

#define SQRT_2_OVER_PI 0.79788456080286535588
#define TWO_OVER_SQRT_PI 1.12837916709551257390
#define INV_SQRT_2PI 0.39894228040143267794

/* 1 where pred holds, else 0, in t's dtype. */
static kiln_tensor *as_mask(kiln_tensor *pred, const kiln_tensor *t)
{
    return kiln_cast(pred, t->dtype);
}

/* ------------------------------------------------------------------------- unary */

/* What op's backward reads: its input x, its output y, or neither (the scalar shifts and
 * scales, neg, and the ops whose gradient is zero). Only that is saved, as PyTorch does:
 * a value no backward reads can die as soon as the forward lets go of it (dropout's
 * x · mask before the scaling, the attention scores before the softmax), which halves
 * such chains' activation memory, lets a fused group skip storing them, and lets the
 * caller write them in place before the backward. */
static void unary_reads(kiln_unary_op op, bool *x, bool *y)
{
    *x = *y = false;
    switch (op) {
    case KILN_UNARY_NEG:
    case KILN_UNARY_SIGN:
    case KILN_UNARY_FLOOR:
    case KILN_UNARY_CEIL:
    case KILN_UNARY_ROUND:
    case KILN_UNARY_ADD_SCALAR:
    case KILN_UNARY_MUL_SCALAR: return;
    case KILN_UNARY_EXP:
    case KILN_UNARY_EXPM1:
    case KILN_UNARY_SQRT:
    case KILN_UNARY_RSQRT:
    case KILN_UNARY_RECIPROCAL:
    case KILN_UNARY_TANH:
    case KILN_UNARY_SIGMOID:
    case KILN_UNARY_RELU: *y = true; return;
    default: *x = true; return;
    }
}

static kiln_tensor *unary_derivative(kiln_unary_op op, kiln_tensor *x, kiln_tensor *y, double alpha,
                                     double beta)
{
    switch (op) {
    case KILN_UNARY_ABS: return kiln_sign(x);
    case KILN_UNARY_EXP: return y;
    case KILN_UNARY_LOG: return kiln_reciprocal(x);
    case KILN_UNARY_LOG1P: return kiln_reciprocal(kiln_add_scalar(x, 1));
    case KILN_UNARY_EXPM1: return kiln_add_scalar(y, 1);
    case KILN_UNARY_SQRT: return kiln_mul_scalar(kiln_reciprocal(y), 0.5);
    case KILN_UNARY_RSQRT: return kiln_mul_scalar(kiln_pow_scalar(y, 3), -0.5);
    case KILN_UNARY_SQUARE: return kiln_mul_scalar(x, 2);
    case KILN_UNARY_RECIPROCAL: return kiln_neg(kiln_square(y));
    case KILN_UNARY_SIN: return kiln_cos(x);
    case KILN_UNARY_COS: return kiln_neg(kiln_sin(x));
    case KILN_UNARY_TANH: return kiln_add_scalar(kiln_neg(kiln_square(y)), 1);
    case KILN_UNARY_SIGMOID: return kiln_mul(y, kiln_add_scalar(kiln_neg(y), 1));
    case KILN_UNARY_LEAKY_RELU:
        return kiln_where(kiln_gt(x, kiln__const_like(x, 0)), kiln__const_like(x, 1), kiln__const_like(x, alpha));
    case KILN_UNARY_ELU:
        /* alpha exp(x), as PyTorch's; y + alpha cancels to 0 once expm1(x) rounds to -1 */
        return kiln_where(kiln_gt(x, kiln__const_like(x, 0)), kiln__const_like(x, 1),
                          kiln_mul_scalar(kiln_exp(x), alpha));
    case KILN_UNARY_GELU: {
        /* Phi(x) + x phi(x) */
        kiln_tensor *cdf = kiln_mul_scalar(kiln_add_scalar(kiln_erf(kiln_mul_scalar(x, M_SQRT1_2)), 1), 0.5);
        kiln_tensor *pdf = kiln_mul_scalar(kiln_exp(kiln_mul_scalar(kiln_square(x), -0.5)), INV_SQRT_2PI);
        return kiln_add(cdf, kiln_mul(x, pdf));
    }
    case KILN_UNARY_GELU_TANH: {
        const double c = 0.044715;
        kiln_tensor *x2 = kiln_square(x);
        kiln_tensor *u = kiln_mul_scalar(kiln_mul(x, kiln_add_scalar(kiln_mul_scalar(x2, c), 1)), SQRT_2_OVER_PI);
        kiln_tensor *t = kiln_tanh(u);
        kiln_tensor *du = kiln_mul_scalar(kiln_add_scalar(kiln_mul_scalar(x2, 3 * c), 1), SQRT_2_OVER_PI);
        kiln_tensor *left = kiln_mul_scalar(kiln_add_scalar(t, 1), 0.5);
        kiln_tensor *sech2 = kiln_add_scalar(kiln_neg(kiln_square(t)), 1);
        return kiln_add(left, kiln_mul(kiln_mul_scalar(x, 0.5), kiln_mul(sech2, du)));
    }
    case KILN_UNARY_SILU: {
        kiln_tensor *s = kiln_sigmoid(x);
        return kiln_mul(s, kiln_add_scalar(kiln_mul(x, kiln_add_scalar(kiln_neg(s), 1)), 1));
    }
    case KILN_UNARY_SOFTPLUS: {
        /* linear above the threshold, sigmoid(beta x) below it */
        kiln_tensor *bx = kiln_mul_scalar(x, alpha);
        return kiln_where(kiln_gt(bx, kiln__const_like(x, beta)), kiln__const_like(x, 1), kiln_sigmoid(bx));
    }
    case KILN_UNARY_ERF:
        return kiln_mul_scalar(kiln_exp(kiln_neg(kiln_square(x))), TWO_OVER_SQRT_PI);
    case KILN_UNARY_CLAMP:
        return as_mask(kiln_logical_and(kiln_ge(x, kiln__const_like(x, alpha)), kiln_le(x, kiln__const_like(x, beta))), x);
    case KILN_UNARY_POW_SCALAR:
        if (alpha == 0)
            return kiln_zeros_like(x);
        return kiln_mul_scalar(kiln_pow_scalar(x, alpha - 1), alpha);
    default:
        return NULL;
    }
}

/* Whether op's derivative on an f16/bf16 input is taken in f32, as PyTorch's is: the
 * multi-step formulas leave half range or precision long before the derivative does
 * (gelu's tanh form squares x: at x = 256 x² is inf in f16 and sech² · inf is NaN
 * where the derivative is 1; at x = -3.5 f16 rounding puts it 40% off, bf16 makes it
 * 0). The engine rounds the f32 gradient back to the input's dtype. */
static bool half_intermediates(kiln_unary_op op, kiln_dtype dt)
{
    if (dt != KILN_F16 && dt != KILN_BF16)
        return false;
    switch (op) {
    case KILN_UNARY_ELU:
    case KILN_UNARY_GELU:
    case KILN_UNARY_GELU_TANH:
    case KILN_UNARY_SILU:
    case KILN_UNARY_SOFTPLUS:
    case KILN_UNARY_ERF: return true;
    default: return false;
    }
}

static int unary_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    kiln_unary_op op = (kiln_unary_op)n->iv[0];
    kiln_tensor *x = n->saved[0], *y = n->saved[1];
    switch (op) {
    case KILN_UNARY_NEG: gin[0] = kiln_neg(g); break;
    case KILN_UNARY_SIGN: case KILN_UNARY_FLOOR: case KILN_UNARY_CEIL: case KILN_UNARY_ROUND:
        gin[0] = kiln_zeros_like(g);
        break;
    case KILN_UNARY_ADD_SCALAR: gin[0] = g; break;
    case KILN_UNARY_MUL_SCALAR: gin[0] = kiln_mul_scalar(g, n->dv[0]); break;
    case KILN_UNARY_RELU:
        /* a select rather than g * cast(mask): two passes instead of three, no f32 mask.
         * From the output (y > 0 exactly where x > 0, NaN and signed zeros included), as
         * PyTorch does: the input need not be kept (kiln__grad_unary) */
        gin[0] = kiln_where(kiln_gt(y, kiln__const_like(y, 0)), g, kiln__const_like(g, 0));
        break;
    default:
        /* every op here reads x or y (unary_reads), whichever was saved */
        if (half_intermediates(op, (x ? x : y)->dtype)) {
            x = kiln_cast(x, KILN_F32);
            y = kiln_cast(y, KILN_F32);
        }
        gin[0] = kiln_mul(g, unary_derivative(op, x, y, n->dv[0], n->dv[1]));
        break;
    }
    return gin[0] ? 0 : -1;
}

kiln_tensor *kiln__grad_unary(kiln_tensor *out, kiln_unary_op op, kiln_tensor *t, double alpha, double beta)
{
    bool failed;
    kiln__node *n = kiln__ad_record(out, kiln__unary_name(op), unary_backward, 1, &t, &failed);
    if (n) {
        n->iv[0] = op;
        n->dv[0] = alpha;
        n->dv[1] = beta;
        /* The input has the output's dtype for every recordable op (floating in, same
         * floating out), so either can be saved as it is; only what the backward reads
         * is (unary_reads). A relu's backward reads only its output: not keeping the
         * input lets a convolution's output before the relu die at once (a layer's
         * activation memory halves, and a fused convolution never stores it). */
        bool save_x, save_y;
        unary_reads(op, &save_x, &save_y);
        failed = (save_x && kiln__ad_save(n, 0, t) < 0) || (save_y && kiln__ad_save(n, 1, out) < 0);
        if (failed)
            kiln__error_set("%s: out of memory saving for backward", kiln__unary_name(op));
    }
    return kiln__ad_fail(out, failed);
}

/* ------------------------------------------------------------------------ binary */

static int binary_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    kiln_binary_op op = (kiln_binary_op)n->iv[0];
    kiln_tensor *a = n->saved[0], *b = n->saved[1], *y = n->saved[2];
    kiln_tensor *ga = NULL, *gb = NULL;
    bool na = kiln__ad_needs(n, 0), nb = kiln__ad_needs(n, 1);
    switch (op) {
    case KILN_BINARY_ADD:
        ga = g;
        gb = g;
        break;
    case KILN_BINARY_SUB:
        ga = g;
        gb = nb ? kiln_neg(g) : NULL;
        break;
    case KILN_BINARY_MUL:
        ga = na ? kiln_mul(g, b) : NULL;
        gb = nb ? kiln_mul(g, a) : NULL;
        break;
    case KILN_BINARY_DIV:
        ga = na ? kiln_div(g, b) : NULL;
        gb = nb ? kiln_neg(kiln_div(kiln_mul(g, y), b)) : NULL;
        break;
    case KILN_BINARY_REMAINDER:
        ga = g;
        gb = nb ? kiln_neg(kiln_mul(g, kiln_floor(kiln_div(a, b)))) : NULL;
        break;
    case KILN_BINARY_POW: {
        kiln_tensor *zero = kiln__const_like(g, 0);
        if (na) {
            /* b * a^(b-1), taken as 0 where b == 0 */
            kiln_tensor *d = kiln_mul(b, kiln_pow(a, kiln_add_scalar(b, -1)));
            ga = kiln_mul(g, kiln_where(kiln_eq(b, zero), zero, d));
        }
        if (nb) {
            /* y log a, taken as 0 where a == 0 and b >= 0 */
            kiln_tensor *d = kiln_mul(y, kiln_log(a));
            kiln_tensor *skip = kiln_logical_and(kiln_eq(a, zero), kiln_ge(b, zero));
            gb = kiln_mul(g, kiln_where(skip, zero, d));
        }
        break;
    }
    case KILN_BINARY_MAXIMUM: case KILN_BINARY_MINIMUM: {
        bool mx = op == KILN_BINARY_MAXIMUM;
        kiln_tensor *half = kiln_mul_scalar(g, 0.5);
        kiln_tensor *zero = kiln__const_like(g, 0);
        kiln_tensor *tie = kiln_eq(a, b);
        /* An operand gets nothing only where it loses outright; where either is NaN
         * neither loses (comparisons with NaN are false), so both get g, as PyTorch's. */
        if (na) {
            kiln_tensor *lose = mx ? kiln_lt(a, b) : kiln_gt(a, b);
            ga = kiln_where(tie, half, kiln_where(lose, zero, g));
        }
        if (nb) {
            kiln_tensor *lose = mx ? kiln_lt(b, a) : kiln_gt(b, a);
            gb = kiln_where(tie, half, kiln_where(lose, zero, g));
        }
        break;
    }
    default:
        return kiln__error_set("backward: op '%s' has no backward", n->name);
    }
    if (na) {
        gin[0] = kiln__sum_to(ga, n->edges[0].ndim, n->edges[0].shape);
        if (!gin[0])
            return -1;
    }
    if (nb) {
        gin[1] = kiln__sum_to(gb, n->edges[1].ndim, n->edges[1].shape);
        if (!gin[1])
            return -1;
    }
    return 0;
}

kiln_tensor *kiln__grad_binary(kiln_tensor *out, kiln_binary_op op, kiln_tensor *a, kiln_tensor *b)
{
    bool failed;
    kiln_tensor *ins[2] = {a, b};
    kiln__node *n = kiln__ad_record(out, kiln__binary_name(op), binary_backward, 2, ins, &failed);
    if (n) {
        n->iv[0] = op;
        /* Only what the backward reads is saved (as PyTorch's): nothing for add and sub, so a
         * residual's operands can die after the forward and may be written in place before
         * the backward; for mul, each operand only when the other needs its gradient. */
        bool na = kiln__ad_needs(n, 0), nb = kiln__ad_needs(n, 1);
        bool save_a = false, save_b = false, save_y = false;
        switch (op) {
        case KILN_BINARY_ADD:
        case KILN_BINARY_SUB: break;
        case KILN_BINARY_MUL: save_a = nb, save_b = na; break;
        case KILN_BINARY_DIV: save_b = true, save_y = nb; break;
        case KILN_BINARY_REMAINDER: save_a = save_b = nb; break;
        case KILN_BINARY_POW: save_a = save_b = true, save_y = nb; break;
        default: save_a = save_b = true; break;
        }
        /* Operands are saved in the dtype the op computed in, so the backward's own
         * arithmetic sees no mixed dtypes. */
        kiln_tensor *ca = save_a ? kiln__cast(a, out->dtype, n->name) : NULL;
        kiln_tensor *cb = save_b ? kiln__cast(b, out->dtype, n->name) : NULL;
        failed = (save_a && (!ca || kiln__ad_save(n, 0, ca) < 0)) ||
                 (save_b && (!cb || kiln__ad_save(n, 1, cb) < 0)) || (save_y && kiln__ad_save(n, 2, out) < 0);
        kiln_tensor_release(ca);
        kiln_tensor_release(cb);
    }
    return kiln__ad_fail(out, failed);
}

/* ---------------------------------------------------------------------- selection */

static int where_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    kiln_tensor *cond = n->saved[0];
    kiln_tensor *zero = kiln__const_like(g, 0);
    for (int i = 1; i <= 2; i++) {
        if (!kiln__ad_needs(n, i))
            continue;
        kiln_tensor *gi = i == 1 ? kiln_where(cond, g, zero) : kiln_where(cond, zero, g);
        gin[i] = kiln__sum_to(gi, n->edges[i].ndim, n->edges[i].shape);
        if (!gin[i])
            return -1;
    }
    return 0;
}

kiln_tensor *kiln__grad_where(kiln_tensor *out, kiln_tensor *cond, kiln_tensor *a, kiln_tensor *b)
{
    bool failed;
    kiln_tensor *ins[3] = {cond, a, b};
    kiln__node *n = kiln__ad_record(out, "where", where_backward, 3, ins, &failed);
    if (n)
        failed = kiln__ad_save(n, 0, cond) < 0;
    return kiln__ad_fail(out, failed);
}

static int masked_fill_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    gin[0] = kiln_where(n->saved[0], kiln__const_like(g, 0), g);
    return gin[0] ? 0 : -1;
}

kiln_tensor *kiln__grad_masked_fill(kiln_tensor *out, kiln_tensor *t, kiln_tensor *mask)
{
    bool failed;
    kiln_tensor *ins[2] = {t, mask};
    kiln__node *n = kiln__ad_record(out, "masked_fill", masked_fill_backward, 2, ins, &failed);
    if (n)
        failed = kiln__ad_save(n, 0, mask) < 0;
    return kiln__ad_fail(out, failed);
}

static int tri_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    gin[0] = n->iv[1] ? kiln_tril(g, n->iv[0]) : kiln_triu(g, n->iv[0]);
    return gin[0] ? 0 : -1;
}

kiln_tensor *kiln__grad_tri(kiln_tensor *out, kiln_tensor *t, int64_t diagonal, bool lower)
{
    bool failed;
    kiln__node *n = kiln__ad_record(out, lower ? "tril" : "triu", tri_backward, 1, &t, &failed);
    if (n) {
        n->iv[0] = diagonal;
        n->iv[1] = lower;
    }
    return kiln__ad_fail(out, failed);
}
