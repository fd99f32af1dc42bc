/*
 * engine/grad-reduce.c — recording hooks and backward functions of reductions, cumsum,
 * sort/topk values, matmul and linear.
 *
 * A reduction's gradient is brought back to the keepdim shape and broadcast over the
 * reduced dims. max/min (and the infinity norm) share it evenly among the elements that
 * tie for the extreme, as PyTorch's amax/amin do; prod handles zeros exactly (one zero
 * gets the product of the others, two or more zeros give nothing anywhere); std's
 * gradient is 0 where the std is 0, as PyTorch's.
 */
#include <math.h>
#include <string.h>

#include "autograd-impl.h"

/* ------------------------------------------------------------------- reductions */

static int reduce_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    kiln_reduce_op op = (kiln_reduce_op)n->iv[0];
    uint32_t mask = (uint32_t)n->iv[1];
    double param = n->dv[0];
    kiln_tensor *x = n->saved[0], *y = n->saved[1];
    int nd = n->edges[0].ndim;
    const int64_t *shape = n->edges[0].shape;
    int64_t kshape[KILN_MAX_DIMS];
    int dims[KILN_MAX_DIMS], ndims = 0;
    double count = 1;
    for (int i = 0; i < nd; i++) {
        bool red = mask & (1u << i);
        kshape[i] = red ? 1 : shape[i];
        if (red) {
            dims[ndims++] = i;
            count *= (double)shape[i];
        }
    }
    kiln_tensor *gk = kiln_reshape(g, nd, kshape);
    kiln_tensor *yk = y ? kiln_reshape(y, nd, kshape) : NULL; /* sum and mean save nothing */
    kiln_tensor *ge = kiln_expand(gk, nd, shape);
    kiln_tensor *zero = kiln__const_like(g, 0);
    kiln_tensor *r = NULL;
    /* ndims == 0 only for a 0-d input, where "every dim" is the identity anyway. */
    switch (op) {
    case KILN_REDUCE_SUM:
        r = ge;
        break;
    case KILN_REDUCE_MEAN:
        r = kiln_mul_scalar(ge, 1.0 / count);
        break;
    case KILN_REDUCE_PROD: {
        kiln_tensor *isz = kiln_eq(x, zero);
        kiln_tensor *xp = kiln_where(isz, kiln__const_like(g, 1), x);
        kiln_tensor *zc = kiln_sum(kiln_cast(isz, g->dtype), ndims, dims, true);
        kiln_tensor *pnz = kiln_prod(xp, ndims, dims, true);
        kiln_tensor *none = kiln_div(kiln_mul(ge, yk), xp);
        kiln_tensor *one = kiln_mul(ge, pnz);
        kiln_tensor *only = kiln_logical_and(kiln_eq(zc, kiln__const_like(g, 1)), isz);
        r = kiln_where(kiln_eq(zc, zero), none, kiln_where(only, one, zero));
        break;
    }
    case KILN_REDUCE_MAX: case KILN_REDUCE_MIN: {
        kiln_tensor *hit = kiln_cast(kiln_eq(x, yk), g->dtype);
        kiln_tensor *cnt = kiln_sum(hit, ndims, dims, true);
        r = kiln_mul(ge, kiln_div(hit, cnt));
        break;
    }
    case KILN_REDUCE_VAR: case KILN_REDUCE_STD: {
        kiln_tensor *xc = kiln_sub(x, kiln_mean(x, ndims, dims, true));
        double denom = count - param;
        r = kiln_mul(ge, kiln_mul_scalar(xc, (op == KILN_REDUCE_VAR ? 2.0 : 1.0) / denom));
        /* 0 where the std is 0 (a constant slice), as PyTorch masks it, rather than the
         * 0 / 0 the quotient gives; the mask is taken on the reduced shape */
        if (op == KILN_REDUCE_STD)
            r = kiln_mul(r, kiln_where(kiln_eq(yk, zero), zero, kiln_reciprocal(yk)));
        break;
    }
    case KILN_REDUCE_LOGSUMEXP:
        r = kiln_mul(ge, kiln_exp(kiln_sub(x, yk)));
        break;
    case KILN_REDUCE_NORM: {
        double p = param;
        if (p == 0) {
            r = kiln_zeros_like(x);
        } else if (p == 1) {
            r = kiln_mul(ge, kiln_sign(x));
        } else if (isinf(p)) {
            kiln_tensor *hit = kiln_cast(kiln_eq(kiln_abs(x), yk), g->dtype);
            kiln_tensor *cnt = kiln_sum(hit, ndims, dims, true);
            r = kiln_mul(ge, kiln_mul(kiln_sign(x), kiln_div(hit, cnt)));
        } else {
            /* sign(x) |x|^(p-1) / y^(p-1); 0 where the norm is 0 */
            kiln_tensor *num = p == 2 ? x : kiln_mul(kiln_sign(x), kiln_pow_scalar(kiln_abs(x), p - 1));
            kiln_tensor *den = p == 2 ? yk : kiln_pow_scalar(yk, p - 1);
            kiln_tensor *d = kiln_div(num, den);
            r = kiln_mul(ge, kiln_where(kiln_eq(yk, zero), zero, d));
        }
        break;
    }
    default:
        return kiln__error_set("backward: op '%s' has no backward", n->name);
    }
    gin[0] = r;
    return r ? 0 : -1;
}

kiln_tensor *kiln__grad_reduce(kiln_tensor *out, kiln_reduce_op op, kiln_tensor *t, int ndims,
                               const int *dims, bool keepdim, double param)
{
    if (op == KILN_REDUCE_ANY || op == KILN_REDUCE_ALL)
        return out;
    uint32_t mask = 0;
    if (ndims == 0)
        mask = t->ndim ? (uint32_t)((1u << t->ndim) - 1) : 0;
    for (int i = 0; i < ndims; i++) {
        int d = kiln__wrap_dim(dims[i], t->ndim, kiln__reduce_name(op));
        if (d < 0) {
            kiln_tensor_release(out);
            return NULL;
        }
        if (t->ndim)
            mask |= 1u << d;
    }
    bool failed;
    kiln__node *n = kiln__ad_record(out, kiln__reduce_name(op), reduce_backward, 1, &t, &failed);
    if (n) {
        n->iv[0] = op;
        n->iv[1] = mask;
        n->iv[2] = keepdim;
        n->dv[0] = param;
        /* sum's and mean's gradients need only the input's shape (in the node's edge) */
        bool shape_only = op == KILN_REDUCE_SUM || op == KILN_REDUCE_MEAN;
        failed = !shape_only && (kiln__ad_save(n, 0, t) < 0 || kiln__ad_save(n, 1, out) < 0);
    }
    return kiln__ad_fail(out, failed);
}

/* ------------------------------------------------------------------- cumsum, sort */

static int cumsum_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    if (g->ndim == 0) {
        gin[0] = g;
        return 0;
    }
    int d = (int)n->iv[0];
    gin[0] = kiln_flip(kiln_cumsum(kiln_flip(g, KILN_DIMS(d)), d), KILN_DIMS(d));
    return gin[0] ? 0 : -1;
}

kiln_tensor *kiln__grad_cumsum(kiln_tensor *out, kiln_tensor *t, int dim)
{
    bool failed;
    kiln__node *n = kiln__ad_record(out, "cumsum", cumsum_backward, 1, &t, &failed);
    if (n)
        n->iv[0] = dim;
    return kiln__ad_fail(out, failed);
}

static int sort_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    if (g->ndim == 0) {
        gin[0] = g;
        return 0;
    }
    kiln_tensor *z = kiln_zeros(kiln__dev(g), g->dtype, n->edges[0].ndim, n->edges[0].shape);
    gin[0] = kiln_scatter(z, (int)n->iv[0], n->saved[0], g);
    return gin[0] ? 0 : -1;
}

kiln_tensor *kiln__grad_sort(kiln_tensor *values, kiln_tensor *t, int dim, kiln_tensor *indices,
                             const char *name)
{
    bool failed;
    kiln__node *n = kiln__ad_record(values, name, sort_backward, 1, &t, &failed);
    if (n) {
        n->iv[0] = dim;
        failed = kiln__ad_save(n, 0, indices) < 0;
    }
    return kiln__ad_fail(values, failed);
}

/* ------------------------------------------------------------------ matmul, linear */

static int matmul_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    kiln_tensor *a = n->saved[0], *b = n->saved[1];
    kiln_tensor *a2 = a->ndim == 1 ? kiln_unsqueeze(a, 0) : a;
    kiln_tensor *b2 = b->ndim == 1 ? kiln_unsqueeze(b, -1) : b;
    if (!a2 || !b2)
        return -1;
    /* The gradient with the dims 1-d operands dropped put back: [batch..., M, N]. */
    int nb = g->ndim - (a->ndim > 1) - (b->ndim > 1);
    int64_t gs[KILN_MAX_DIMS];
    memcpy(gs, g->shape, sizeof(int64_t) * (size_t)nb);
    gs[nb] = a2->shape[a2->ndim - 2];
    gs[nb + 1] = b2->shape[b2->ndim - 1];
    kiln_tensor *g2 = kiln_reshape(g, nb + 2, gs);
    /* b's gradient first: a's, made last, is the product a fusing device still holds
     * when the node that made a runs its backward next (see linear_backward) */
    if (kiln__ad_needs(n, 1)) {
        kiln_tensor *gb = kiln_matmul(kiln_transpose(a2, -1, -2), g2);
        gin[1] = kiln_reshape(kiln__sum_to(gb, b2->ndim, b2->shape), n->edges[1].ndim, n->edges[1].shape);
        if (!gin[1])
            return -1;
    }
    if (kiln__ad_needs(n, 0)) {
        kiln_tensor *ga = kiln_matmul(g2, kiln_transpose(b2, -1, -2));
        gin[0] = kiln_reshape(kiln__sum_to(ga, a2->ndim, a2->shape), n->edges[0].ndim, n->edges[0].shape);
        if (!gin[0])
            return -1;
    }
    return 0;
}

/* Save a and b as the dtype out was computed in. */
static bool save_cast(kiln__node *n, int k, kiln_tensor *t, kiln_dtype dt)
{
    kiln_tensor *c = kiln__cast(t, dt, n->name);
    bool ok = c && kiln__ad_save(n, k, c) == 0;
    kiln_tensor_release(c);
    return ok;
}

kiln_tensor *kiln__grad_matmul(kiln_tensor *out, kiln_tensor *a, kiln_tensor *b)
{
    bool failed;
    kiln_tensor *ins[2] = {a, b};
    kiln__node *n = kiln__ad_record(out, "matmul", matmul_backward, 2, ins, &failed);
    if (n)
        failed = !save_cast(n, 0, a, out->dtype) || !save_cast(n, 1, b, out->dtype);
    return kiln__ad_fail(out, failed);
}

static int linear_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    kiln_tensor *x = n->saved[0], *w = n->saved[1];
    int64_t O = w->shape[0], I = w->shape[1];
    /* The input's gradient last. The node that made x runs its backward next, and its
     * first ops (an activation's backward, a residual's sum) read this product: on a
     * fusing device they join it as its epilogue, so the product is never written out
     * and read back. Made first, the weight's product would end that group at once. */
    kiln_tensor *g2 = kiln_reshape(g, KILN_SHAPE(-1, O));
    if (kiln__ad_needs(n, 2)) {
        gin[2] = kiln_sum(g2, KILN_DIMS(0), false);
        if (!gin[2])
            return -1;
    }
    if (kiln__ad_needs(n, 1)) {
        kiln_tensor *x2 = kiln_reshape(x, KILN_SHAPE(-1, I));
        gin[1] = kiln_matmul(kiln_transpose(g2, 0, 1), x2);
        if (!gin[1])
            return -1;
    }
    if (kiln__ad_needs(n, 0)) {
        gin[0] = kiln_matmul(g, w);
        if (!gin[0])
            return -1;
    }
    return 0;
}

kiln_tensor *kiln__grad_linear(kiln_tensor *out, kiln_tensor *x, kiln_tensor *w, kiln_tensor *bias)
{
    bool failed;
    kiln_tensor *ins[3] = {x, w, bias};
    kiln__node *n = kiln__ad_record(out, "linear", linear_backward, 3, ins, &failed);
    if (n)
        failed = !save_cast(n, 0, x, out->dtype) || !save_cast(n, 1, w, out->dtype);
    return kiln__ad_fail(out, failed);
}
