/*
 * engine/ops-elementwise.c — unary, binary, scalar and selection ops (where,
 * masked_fill, tril, triu).
 *
 * The front end settles every dtype question here, once, so backends see operands of
 * the dtype they compute in: floating functions of integer tensors compute in f32,
 * binary operands are cast to their promoted type, comparisons produce bool. Broadcast
 * operands reach the backend as descriptors of the output's shape with 0 strides, so
 * no broadcast copy is ever made.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "autograd-impl.h"
#include "tensor-impl.h"

void kiln__bcast_desc(const kiln_tensor *t, int ndim, const int64_t *shape, kiln_tdesc *d)
{
    kiln__desc(t, d);
    int lead = ndim - t->ndim;
    d->ndim = ndim;
    for (int i = ndim - 1; i >= 0; i--) {
        int j = i - lead;
        d->shape[i] = shape[i];
        d->strides[i] = (j >= 0 && t->shape[j] == shape[i]) ? t->strides[j] : 0;
    }
}

static bool is_integral(double s) { return isfinite(s) && s == floor(s); }

/* ------------------------------------------------------------------------ unary */

typedef enum { U_FLOAT, U_KEEP, U_BOOL } unary_kind;

static unary_kind unary_kind_of(kiln_unary_op op)
{
    switch (op) {
    case KILN_UNARY_NEG: case KILN_UNARY_ABS: case KILN_UNARY_SIGN: case KILN_UNARY_SQUARE:
    case KILN_UNARY_RELU: case KILN_UNARY_FLOOR: case KILN_UNARY_CEIL: case KILN_UNARY_ROUND:
    case KILN_UNARY_CLAMP: case KILN_UNARY_POW_SCALAR: case KILN_UNARY_ADD_SCALAR:
    case KILN_UNARY_MUL_SCALAR:
        return U_KEEP;
    case KILN_UNARY_ISNAN: case KILN_UNARY_ISINF: case KILN_UNARY_LOGICAL_NOT:
        return U_BOOL;
    default:
        return U_FLOAT;
    }
}

/* The dtype an op computes in (and returns, except for the bool-valued ones). */
static int unary_dtype(kiln_unary_op op, const kiln_tensor *t, double alpha, double beta,
                       kiln_dtype *out)
{
    kiln_dtype dt = t->dtype;
    bool fl = kiln_dtype_is_float(dt);
    const char *name = kiln__unary_name(op);
    char ds[200];
    switch (unary_kind_of(op)) {
    case U_BOOL:
        *out = dt;
        return 0;
    case U_FLOAT:
        *out = fl ? dt : KILN_F32;
        return 0;
    case U_KEEP:
        break;
    }
    *out = dt;
    if (fl)
        return 0;
    switch (op) {
    case KILN_UNARY_NEG:
        if (dt == KILN_BOOL)
            return kiln__error_set_code(KILN_EINVAL,
                                        "%s: negation of a bool tensor (%s) is not supported; use logical_not",
                                        name, kiln__describe(t, ds, sizeof ds));
        break;
    case KILN_UNARY_ABS:
    case KILN_UNARY_RELU:
    case KILN_UNARY_FLOOR:
    case KILN_UNARY_CEIL:
    case KILN_UNARY_ROUND:
    case KILN_UNARY_CLAMP:
        /* Refused as PyTorch refuses them, rather than given a meaning: with a bool result
         * they could only be the identity (or, for clamp, a test against the bounds), and a
         * backend left to guess once answered all-false. Cast to an integer dtype first. */
        if (dt == KILN_BOOL)
            return kiln__error_set_code(KILN_EINVAL, "%s: not defined for a bool tensor (%s); cast it first", name,
                                        kiln__describe(t, ds, sizeof ds));
        if (op == KILN_UNARY_CLAMP && ((isfinite(alpha) && alpha != floor(alpha)) ||
                                       (isfinite(beta) && beta != floor(beta)) || isnan(alpha) || isnan(beta)))
            *out = KILN_F32;
        break;
    case KILN_UNARY_SQUARE:
        if (dt == KILN_BOOL)
            *out = KILN_I64;
        break;
    case KILN_UNARY_ADD_SCALAR: case KILN_UNARY_MUL_SCALAR:
        if (!is_integral(alpha))
            *out = KILN_F32;
        else if (dt == KILN_BOOL)
            *out = KILN_I64;
        break;
    case KILN_UNARY_POW_SCALAR:
        if (!is_integral(alpha))
            *out = KILN_F32;
        else if (alpha < 0)
            return kiln__error_set("%s: integer tensor %s to the negative power %g is not allowed", name,
                                   kiln__describe(t, ds, sizeof ds), alpha);
        else if (dt == KILN_BOOL)
            *out = KILN_I64;
        break;
    default:
        break;
    }
    return 0;
}

kiln_tensor *kiln__unary(kiln_unary_op op, kiln_tensor *t, double alpha, double beta)
{
    const char *name = kiln__unary_name(op);
    kiln_dtype cdt;
    if (unary_dtype(op, t, alpha, beta, &cdt) < 0)
        return NULL;
    kiln_dtype odt = unary_kind_of(op) == U_BOOL ? KILN_BOOL : cdt;
    kiln_tensor *in = kiln__cast(t, cdt, name);
    if (!in)
        return NULL;
    kiln_tensor *out = kiln__alloc(kiln__dev(t), odt, t->ndim, t->shape, name);
    int rc = out ? 0 : -1;
    if (rc == 0 && kiln__numel(out) > 0) {
        const kiln_backend_iface *be = kiln__be(t);
        if (!kiln__supports(kiln__dev(t), KILN_ENTRY_UNARY, (int)op, cdt, NULL)) {
            rc = kiln__unsupported(kiln__dev(t), name, KILN_ENTRY_UNARY, (int)op, cdt);
        } else {
            kiln_tdesc od, id;
            kiln__desc(out, &od);
            kiln__desc(in, &id);
            rc = be->unary(kiln__ctx(t), op, &od, &id, alpha, beta);
        }
    }
    kiln_tensor_release(in);
    if (rc < 0) {
        kiln_tensor_release(out);
        return NULL;
    }
    return out;
}

/* The public form: compute, then record when the input asks for gradients. */
static kiln_tensor *unary_pub(kiln_unary_op op, kiln_tensor *t, double alpha, double beta)
{
    kiln_tensor *out = kiln__unary(op, t, alpha, beta);
    if (out && kiln__ad_want(t))
        out = kiln__grad_unary(out, op, t, alpha, beta);
    return out;
}

#define UNARY0(fn, OP) \
    kiln_tensor *kiln_##fn(kiln_tensor *t) { return t ? kiln__ret(unary_pub(OP, t, 0, 0)) : NULL; }

UNARY0(neg, KILN_UNARY_NEG)
UNARY0(abs, KILN_UNARY_ABS)
UNARY0(sign, KILN_UNARY_SIGN)
UNARY0(exp, KILN_UNARY_EXP)
UNARY0(log, KILN_UNARY_LOG)
UNARY0(log1p, KILN_UNARY_LOG1P)
UNARY0(expm1, KILN_UNARY_EXPM1)
UNARY0(sqrt, KILN_UNARY_SQRT)
UNARY0(rsqrt, KILN_UNARY_RSQRT)
UNARY0(square, KILN_UNARY_SQUARE)
UNARY0(reciprocal, KILN_UNARY_RECIPROCAL)
UNARY0(sin, KILN_UNARY_SIN)
UNARY0(cos, KILN_UNARY_COS)
UNARY0(tanh, KILN_UNARY_TANH)
UNARY0(sigmoid, KILN_UNARY_SIGMOID)
UNARY0(relu, KILN_UNARY_RELU)
UNARY0(silu, KILN_UNARY_SILU)
UNARY0(erf, KILN_UNARY_ERF)
UNARY0(floor, KILN_UNARY_FLOOR)
UNARY0(ceil, KILN_UNARY_CEIL)
UNARY0(round, KILN_UNARY_ROUND)
UNARY0(isnan, KILN_UNARY_ISNAN)
UNARY0(isinf, KILN_UNARY_ISINF)
UNARY0(logical_not, KILN_UNARY_LOGICAL_NOT)

kiln_tensor *kiln_leaky_relu(kiln_tensor *t, double negative_slope)
{
    return t ? kiln__ret(unary_pub(KILN_UNARY_LEAKY_RELU, t, negative_slope, 0)) : NULL;
}

kiln_tensor *kiln_elu(kiln_tensor *t, double alpha)
{
    return t ? kiln__ret(unary_pub(KILN_UNARY_ELU, t, alpha, 0)) : NULL;
}

kiln_tensor *kiln_gelu(kiln_tensor *t, bool tanh_approx)
{
    if (!t)
        return NULL;
    return kiln__ret(unary_pub(tanh_approx ? KILN_UNARY_GELU_TANH : KILN_UNARY_GELU, t, 0, 0));
}

kiln_tensor *kiln_softplus(kiln_tensor *t, double beta, double threshold)
{
    if (!t)
        return NULL;
    if (beta == 0 || isnan(beta)) {
        kiln__error_set("softplus: beta %g must be nonzero", beta);
        return NULL;
    }
    return kiln__ret(unary_pub(KILN_UNARY_SOFTPLUS, t, beta, threshold));
}

kiln_tensor *kiln_clamp(kiln_tensor *t, double lo, double hi)
{
    if (!t)
        return NULL;
    if (lo > hi) {
        kiln__error_set("clamp: lo %g is above hi %g", lo, hi);
        return NULL;
    }
    return kiln__ret(unary_pub(KILN_UNARY_CLAMP, t, lo, hi));
}

kiln_tensor *kiln_pow_scalar(kiln_tensor *t, double exponent)
{
    return t ? kiln__ret(unary_pub(KILN_UNARY_POW_SCALAR, t, exponent, 0)) : NULL;
}

kiln_tensor *kiln_add_scalar(kiln_tensor *a, double s)
{
    return a ? kiln__ret(unary_pub(KILN_UNARY_ADD_SCALAR, a, s, 0)) : NULL;
}

kiln_tensor *kiln_mul_scalar(kiln_tensor *a, double s)
{
    return a ? kiln__ret(unary_pub(KILN_UNARY_MUL_SCALAR, a, s, 0)) : NULL;
}

/* ----------------------------------------------------------------------- binary */

static bool binary_is_bool_valued(kiln_binary_op op)
{
    return op >= KILN_BINARY_EQ && op <= KILN_BINARY_LOGICAL_XOR;
}

kiln_tensor *kiln__binary(kiln_binary_op op, kiln_tensor *a, kiln_tensor *b)
{
    const char *name = kiln__binary_name(op);
    if (kiln__same_device(a, b, name) < 0)
        return NULL;
    int64_t shape[KILN_MAX_DIMS];
    int ndim = kiln__broadcast_shape(a->ndim, a->shape, b->ndim, b->shape, shape, name, a, b);
    if (ndim < 0)
        return NULL;
    kiln_dtype cdt = kiln_promote_types(a->dtype, b->dtype), odt = cdt;
    char da[200], db[200];
    if (binary_is_bool_valued(op)) {
        odt = KILN_BOOL;
    } else if (op == KILN_BINARY_DIV && !kiln_dtype_is_float(cdt)) {
        cdt = odt = KILN_F32;
    } else if (cdt == KILN_BOOL &&
               (op == KILN_BINARY_SUB || op == KILN_BINARY_REMAINDER || op == KILN_BINARY_POW)) {
        /* Refused as PyTorch refuses them: sub has no bool answer (0 - 1), remainder none for
         * a zero divisor, and the backends, left to choose, answered remainder and pow
         * differently. add and mul stay (or, and), as do maximum and minimum. */
        kiln__error_set_code(KILN_EINVAL, "%s: not defined for bool tensors (%s, %s); cast them first", name,
                             kiln__describe(a, da, sizeof da), kiln__describe(b, db, sizeof db));
        return NULL;
    }
    kiln_tensor *ca = kiln__cast(a, cdt, name);
    kiln_tensor *cb = ca ? kiln__cast(b, cdt, name) : NULL;
    kiln_tensor *out = cb ? kiln__alloc(kiln__dev(a), odt, ndim, shape, name) : NULL;
    int rc = out ? 0 : -1;
    if (rc == 0 && kiln__numel(out) > 0) {
        const kiln_backend_iface *be = kiln__be(a);
        if (!kiln__supports(kiln__dev(a), KILN_ENTRY_BINARY, (int)op, cdt, NULL)) {
            rc = kiln__unsupported(kiln__dev(a), name, KILN_ENTRY_BINARY, (int)op, cdt);
        } else {
            kiln_tdesc od, ad, bd;
            kiln__desc(out, &od);
            kiln__bcast_desc(ca, ndim, shape, &ad);
            kiln__bcast_desc(cb, ndim, shape, &bd);
            rc = be->binary(kiln__ctx(a), op, &od, &ad, &bd);
        }
    }
    kiln_tensor_release(ca);
    kiln_tensor_release(cb);
    if (rc < 0) {
        kiln_tensor_release(out);
        return NULL;
    }
    return out;
}

static kiln_tensor *binary_pub(kiln_binary_op op, kiln_tensor *a, kiln_tensor *b)
{
    kiln_tensor *out = kiln__binary(op, a, b);
    if (out && (kiln__ad_want(a) || kiln__ad_want(b)))
        out = kiln__grad_binary(out, op, a, b);
    return out;
}

#define BINARY(fn, OP)                                                      \
    kiln_tensor *kiln_##fn(kiln_tensor *a, kiln_tensor *b)                  \
    {                                                                       \
        return (a && b) ? kiln__ret(binary_pub(OP, a, b)) : NULL;           \
    }

BINARY(add, KILN_BINARY_ADD)
BINARY(sub, KILN_BINARY_SUB)
BINARY(mul, KILN_BINARY_MUL)
BINARY(div, KILN_BINARY_DIV)
BINARY(remainder, KILN_BINARY_REMAINDER)
BINARY(pow, KILN_BINARY_POW)
BINARY(maximum, KILN_BINARY_MAXIMUM)
BINARY(minimum, KILN_BINARY_MINIMUM)
BINARY(eq, KILN_BINARY_EQ)
BINARY(ne, KILN_BINARY_NE)
BINARY(lt, KILN_BINARY_LT)
BINARY(le, KILN_BINARY_LE)
BINARY(gt, KILN_BINARY_GT)
BINARY(ge, KILN_BINARY_GE)
BINARY(logical_and, KILN_BINARY_LOGICAL_AND)
BINARY(logical_or, KILN_BINARY_LOGICAL_OR)
BINARY(logical_xor, KILN_BINARY_LOGICAL_XOR)

/* ------------------------------------------------------------------- selection */

static kiln_tensor *where_impl(kiln_tensor *cond, kiln_tensor *a, kiln_tensor *b, int ndim,
                               const int64_t *shape, const char *op)
{
    char dc[200];
    if (cond->dtype != KILN_BOOL) {
        kiln__error_set("%s: condition must be bool, got %s", op, kiln__describe(cond, dc, sizeof dc));
        return NULL;
    }
    if (kiln__same_device(cond, a, op) < 0 || kiln__same_device(cond, b, op) < 0)
        return NULL;
    kiln_dtype dt = kiln_promote_types(a->dtype, b->dtype);
    kiln_tensor *ca = kiln__cast(a, dt, op);
    kiln_tensor *cb = ca ? kiln__cast(b, dt, op) : NULL;
    kiln_tensor *out = cb ? kiln__alloc(kiln__dev(a), dt, ndim, shape, op) : NULL;
    int rc = out ? 0 : -1;
    if (rc == 0 && kiln__numel(out) > 0) {
        const kiln_backend_iface *be = kiln__be(a);
        if (!kiln__supports(kiln__dev(a), KILN_ENTRY_WHERE, -1, dt, NULL)) {
            rc = kiln__unsupported(kiln__dev(a), op, KILN_ENTRY_WHERE, -1, dt);
        } else {
            kiln_tdesc od, cd, ad, bd;
            kiln__desc(out, &od);
            kiln__bcast_desc(cond, ndim, shape, &cd);
            kiln__bcast_desc(ca, ndim, shape, &ad);
            kiln__bcast_desc(cb, ndim, shape, &bd);
            rc = be->where(kiln__ctx(a), &od, &cd, &ad, &bd);
        }
    }
    kiln_tensor_release(ca);
    kiln_tensor_release(cb);
    if (rc < 0) {
        kiln_tensor_release(out);
        return NULL;
    }
    return out;
}

kiln_tensor *kiln_where(kiln_tensor *cond, kiln_tensor *a, kiln_tensor *b)
{
    if (!cond || !a || !b)
        return NULL;
    int64_t s1[KILN_MAX_DIMS], s2[KILN_MAX_DIMS];
    int n1 = kiln__broadcast_shape(a->ndim, a->shape, b->ndim, b->shape, s1, "where", a, b);
    if (n1 < 0)
        return NULL;
    int n2 = kiln__broadcast_shape(cond->ndim, cond->shape, n1, s1, s2, "where", NULL, NULL);
    if (n2 < 0)
        return NULL;
    kiln_tensor *out = where_impl(cond, a, b, n2, s2, "where");
    if (out && (kiln__ad_want(a) || kiln__ad_want(b)))
        out = kiln__grad_where(out, cond, a, b);
    return kiln__ret(out);
}

kiln_tensor *kiln_masked_fill(kiln_tensor *t, kiln_tensor *mask, double value)
{
    if (!t || !mask)
        return NULL;
    int64_t s[KILN_MAX_DIMS];
    int n = kiln__broadcast_shape(t->ndim, t->shape, mask->ndim, mask->shape, s, "masked_fill", t, mask);
    if (n < 0)
        return NULL;
    bool same = n == t->ndim;
    for (int i = 0; same && i < n; i++)
        same = s[i] == t->shape[i];
    if (!same) {
        char dt[200], dm[200];
        kiln__error_set("masked_fill: mask %s does not broadcast to %s", kiln__describe(mask, dm, sizeof dm),
                        kiln__describe(t, dt, sizeof dt));
        return NULL;
    }
    if (kiln__check_int_value(t->dtype, value, "masked_fill", "value") < 0)
        return NULL;
    kiln_tensor *fill = kiln__scalar(kiln__dev(t), t->dtype, value, "masked_fill");
    if (!fill)
        return NULL;
    kiln_tensor *out = where_impl(mask, fill, t, t->ndim, t->shape, "masked_fill");
    kiln_tensor_release(fill);
    if (out && kiln__ad_want(t))
        out = kiln__grad_masked_fill(out, t, mask);
    return kiln__ret(out);
}

/* tril keeps col - row <= diagonal; triu keeps col - row >= diagonal. */
static kiln_tensor *tri_impl(kiln_tensor *t, int64_t diagonal, bool lower, const char *op)
{
    if (!t)
        return NULL;
    if (t->ndim < 2) {
        char ds[200];
        kiln__error_set("%s: needs at least 2 dims, got %s", op, kiln__describe(t, ds, sizeof ds));
        return NULL;
    }
    kiln_device *dev = kiln__dev(t);
    int64_t r = t->shape[t->ndim - 2], c = t->shape[t->ndim - 1];
    kiln_scope_begin();
    kiln_tensor *rows = kiln_reshape(kiln_arange(dev, KILN_I64, 0, (double)r, 1), KILN_SHAPE(r, 1));
    kiln_tensor *cols = kiln_reshape(kiln_arange(dev, KILN_I64, 0, (double)c, 1), KILN_SHAPE(1, c));
    kiln_tensor *diff = kiln_sub(cols, rows);
    kiln_tensor *d = kiln__ret(kiln__scalar(dev, KILN_I64, (double)diagonal, op));
    kiln_tensor *mask = d && diff ? (lower ? kiln_le(diff, d) : kiln_ge(diff, d)) : NULL;
    kiln_tensor *zero = kiln__ret(kiln__scalar(dev, t->dtype, 0, op));
    kiln_tensor *out = NULL;
    if (mask && zero)
        out = where_impl(mask, t, zero, t->ndim, t->shape, op);
    kiln_scope_end();
    if (out && kiln__ad_want(t))
        out = kiln__grad_tri(out, t, diagonal, lower);
    return kiln__ret(out);
}

kiln_tensor *kiln_tril(kiln_tensor *t, int64_t diagonal) { return tri_impl(t, diagonal, true, "tril"); }
kiln_tensor *kiln_triu(kiln_tensor *t, int64_t diagonal) { return tri_impl(t, diagonal, false, "triu"); }
