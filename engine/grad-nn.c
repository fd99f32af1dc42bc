/*
 * engine/grad-nn.c — recording hooks and backward functions of convolution, transposed
 * convolution, pooling, adaptive pooling, interpolation, the fused softmax and the
 * fused layer_norm.
 *
 * Convolution and pooling gradients come from the backend's dedicated entries
 * (conv_backward_input/weight, pool_backward, ...), called here directly on freshly
 * zeroed outputs. The composed paths of softmax and layer_norm (backends without the
 * fused entry), batch_norm, group_norm, dropout and attention need nothing here: they
 * are built from recorded ops and differentiate through their parts.
 */
#include <string.h>

#include "autograd-impl.h"

/* The backend entries a backward here may call. */
typedef enum {
    NN_CONV,            /* conv(out, a = x, b = w) */
    NN_CONV_GRAD_INPUT, /* conv_backward_input(out = grad_x, a = grad_out, b = w) */
    NN_CONV_GRAD_WEIGHT,/* conv_backward_weight(out = grad_w, a = x, b = grad_out) */
} nn_entry;

/* A zeroed tensor of shape, filled by one backend entry; scoped like a public op's. */
static kiln_tensor *run_conv_entry(nn_entry e, const kiln_conv_params *p, int ndim, const int64_t *shape,
                                   kiln_tensor *a0, kiln_tensor *b0, const char *op)
{
    if (!a0 || !b0)
        return NULL;
    kiln_tensor *out = kiln_zeros(kiln__dev(a0), a0->dtype, ndim, shape);
    kiln_tensor *a = kiln_contiguous(a0), *b = kiln_contiguous(b0);
    if (!out || !a || !b)
        return NULL;
    if (kiln__numel(out) == 0 || kiln__numel(a) == 0 || kiln__numel(b) == 0)
        return out;
    const kiln_backend_iface *be = kiln__be(a);
    kiln_tdesc od, ad, bd;
    kiln__desc(out, &od);
    kiln__desc(a, &ad);
    kiln__desc(b, &bd);
    int rc;
    kiln_entry entry = e == NN_CONV              ? KILN_ENTRY_CONV
                       : e == NN_CONV_GRAD_INPUT ? KILN_ENTRY_CONV_BACKWARD_INPUT
                                                 : KILN_ENTRY_CONV_BACKWARD_WEIGHT;
    if (!kiln__supports(kiln__dev(a), entry, -1, out->dtype, p)) {
        kiln__unsupported(kiln__dev(a), op, entry, -1, out->dtype);
        return NULL;
    }
    switch (e) {
    case NN_CONV:
        rc = be->conv(kiln__ctx(a), p, &od, &ad, &bd, NULL);
        break;
    case NN_CONV_GRAD_INPUT:
        rc = be->conv_backward_input(kiln__ctx(a), p, &od, &ad, &bd);
        break;
    default:
        rc = be->conv_backward_weight(kiln__ctx(a), p, &od, &ad, &bd);
        break;
    }
    return rc < 0 ? NULL : out;
}

/* g with a leading batch dim of 1 when the op's input had none. */
static kiln_tensor *batch_g(kiln__node *n, kiln_tensor *g, bool unbatched)
{
    (void)n;
    return unbatched ? kiln_unsqueeze(g, 0) : g;
}

/* --------------------------------------------------------------------- convolution */

static int conv_backward(kiln__node *n, kiln_tensor *g0, kiln_tensor **gin)
{
    kiln_conv_params p;
    memcpy(&p, n->blob, sizeof p);
    bool transposed = n->iv[0], unb = n->iv[1];
    kiln_tensor *x = n->saved[0], *w = n->saved[1];
    kiln_tensor *g = batch_g(n, g0, unb);
    if (!g)
        return -1;
    if (kiln__ad_needs(n, 0)) {
        kiln_tensor *gx = transposed ? run_conv_entry(NN_CONV, &p, x->ndim, x->shape, g, w, n->name)
                                     : run_conv_entry(NN_CONV_GRAD_INPUT, &p, x->ndim, x->shape, g, w, n->name);
        gin[0] = unb && gx ? kiln_squeeze(gx, 0) : gx;
        if (!gin[0])
            return -1;
    }
    if (kiln__ad_needs(n, 1)) {
        /* Transposed: y = conv_backward_input(x, w), so w's gradient is that of a conv
         * whose input is y-shaped (g) and whose output is x-shaped. */
        gin[1] = transposed ? run_conv_entry(NN_CONV_GRAD_WEIGHT, &p, w->ndim, w->shape, g, x, n->name)
                            : run_conv_entry(NN_CONV_GRAD_WEIGHT, &p, w->ndim, w->shape, x, g, n->name);
        if (!gin[1])
            return -1;
    }
    if (kiln__ad_needs(n, 2)) {
        /* the bias gradient as each plane's sum (trailing dims: contiguous rows) and then
         * the sum of those over the batch: one sum over the batch and the positions at once
         * strides across planes, and took the CNN's step of fusion-bench 2-3% longer */
        int dims[KILN_MAX_DIMS], nd = 0;
        for (int i = 2; i < g->ndim; i++)
            dims[nd++] = i;
        kiln_tensor *planes = kiln_sum(g, nd, dims, false); /* (g is [N, C, spatial...]) */
        gin[2] = kiln_sum(planes, 1, (int[]){0}, false);
        if (!gin[2])
            return -1;
    }
    return 0;
}

kiln_tensor *kiln__grad_conv(kiln_tensor *out, kiln_tensor *x, kiln_tensor *w, kiln_tensor *bias,
                             const kiln_conv_params *p, kiln_tensor *cx, kiln_tensor *cw, bool transposed,
                             const char *name)
{
    bool failed;
    kiln_tensor *ins[3] = {x, w, bias};
    kiln__node *n = kiln__ad_record(out, name, conv_backward, 3, ins, &failed);
    if (n) {
        memcpy(n->blob, p, sizeof *p);
        n->iv[0] = transposed;
        n->iv[1] = x->ndim == p->nspatial + 1;
        failed = kiln__ad_save(n, 0, cx) < 0 || kiln__ad_save(n, 1, cw) < 0;
    }
    return kiln__ad_fail(out, failed);
}

/* ------------------------------------------------------------------------- pooling */

/* The batched shape of input 0. */
static int batched_shape(const kiln__node *n, bool unb, int64_t *shape)
{
    const kiln__edge *e = &n->edges[0];
    int m = 0;
    if (unb)
        shape[m++] = 1;
    for (int i = 0; i < e->ndim; i++)
        shape[m++] = e->shape[i];
    return m;
}

static int pool_backward(kiln__node *n, kiln_tensor *g0, kiln_tensor **gin)
{
    kiln_pool_params p;
    memcpy(&p, n->blob, sizeof p);
    bool unb = n->iv[0];
    kiln_tensor *g = batch_g(n, g0, unb);
    kiln_tensor *gc = g ? kiln_contiguous(g) : NULL;
    int64_t shape[KILN_MAX_DIMS];
    int nd = batched_shape(n, unb, shape);
    kiln_tensor *gx = gc ? kiln_zeros(kiln__dev(g), g->dtype, nd, shape) : NULL;
    if (!gx)
        return -1;
    if (kiln__numel(gc) > 0) {
        const kiln_backend_iface *be = kiln__be(gx);
        if (!kiln__supports(kiln__dev(gx), KILN_ENTRY_POOL_BACKWARD, -1, gx->dtype, NULL))
            return kiln__unsupported(kiln__dev(gx), n->name, KILN_ENTRY_POOL_BACKWARD, -1, gx->dtype);
        kiln_tdesc xd, gd, id;
        kiln__desc(gx, &xd);
        kiln__desc(gc, &gd);
        if (n->saved[0])
            kiln__desc(n->saved[0], &id);
        if (be->pool_backward(kiln__ctx(gx), &p, &xd, &gd, n->saved[0] ? &id : NULL) < 0)
            return -1;
    }
    gin[0] = unb ? kiln_squeeze(gx, 0) : gx;
    return gin[0] ? 0 : -1;
}

kiln_tensor *kiln__grad_pool(kiln_tensor *out, kiln_tensor *x, const kiln_pool_params *p,
                             kiln_tensor *indices, const char *name)
{
    bool failed;
    kiln__node *n = kiln__ad_record(out, name, pool_backward, 1, &x, &failed);
    if (n) {
        memcpy(n->blob, p, sizeof *p);
        n->iv[0] = x->ndim == p->nspatial + 1;
        if (p->kind == KILN_POOL_MAX)
            failed = !indices || kiln__ad_save(n, 0, indices) < 0;
        if (failed)
            kiln__error_set("%s: cannot keep the pooling indices for backward", name);
    }
    return kiln__ad_fail(out, failed);
}

static int adaptive_backward(kiln__node *n, kiln_tensor *g0, kiln_tensor **gin)
{
    int ns = (int)n->iv[0];
    bool unb = n->iv[1];
    kiln_tensor *g = batch_g(n, g0, unb);
    kiln_tensor *gc = g ? kiln_contiguous(g) : NULL;
    int64_t shape[KILN_MAX_DIMS];
    int nd = batched_shape(n, unb, shape);
    kiln_tensor *gx = gc ? kiln_zeros(kiln__dev(g), g->dtype, nd, shape) : NULL;
    if (!gx)
        return -1;
    if (kiln__numel(gx) > 0 && kiln__numel(gc) > 0) {
        const kiln_backend_iface *be = kiln__be(gx);
        if (!kiln__supports(kiln__dev(gx), KILN_ENTRY_ADAPTIVE_AVG_POOL_BACKWARD, -1, gx->dtype, NULL))
            return kiln__unsupported(kiln__dev(gx), n->name, KILN_ENTRY_ADAPTIVE_AVG_POOL_BACKWARD, -1, gx->dtype);
        kiln_tdesc xd, gd;
        kiln__desc(gx, &xd);
        kiln__desc(gc, &gd);
        if (be->adaptive_avg_pool_backward(kiln__ctx(gx), ns, &xd, &gd) < 0)
            return -1;
    }
    gin[0] = unb ? kiln_squeeze(gx, 0) : gx;
    return gin[0] ? 0 : -1;
}

kiln_tensor *kiln__grad_adaptive(kiln_tensor *out, kiln_tensor *x, int ns, const char *name)
{
    bool failed;
    kiln__node *n = kiln__ad_record(out, name, adaptive_backward, 1, &x, &failed);
    if (n) {
        n->iv[0] = ns;
        n->iv[1] = x->ndim == ns + 1;
    }
    return kiln__ad_fail(out, failed);
}

static int interpolate_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    kiln_tensor *gc = kiln_contiguous(g);
    kiln_tensor *gx = gc ? kiln_zeros(kiln__dev(g), g->dtype, n->edges[0].ndim, n->edges[0].shape) : NULL;
    if (!gx)
        return -1;
    if (kiln__numel(gx) > 0 && kiln__numel(gc) > 0) {
        const kiln_backend_iface *be = kiln__be(gx);
        if (!kiln__supports(kiln__dev(gx), KILN_ENTRY_INTERPOLATE_BACKWARD, -1, gx->dtype, NULL))
            return kiln__unsupported(kiln__dev(gx), n->name, KILN_ENTRY_INTERPOLATE_BACKWARD, -1, gx->dtype);
        kiln_tdesc xd, gd;
        kiln__desc(gx, &xd);
        kiln__desc(gc, &gd);
        if (be->interpolate_backward(kiln__ctx(gx), (kiln_interp_mode)n->iv[0], n->iv[1], &xd, &gd) < 0)
            return -1;
    }
    gin[0] = gx;
    return 0;
}

kiln_tensor *kiln__grad_interpolate(kiln_tensor *out, kiln_tensor *x, kiln_interp_mode mode,
                                    bool align_corners)
{
    bool failed;
    kiln__node *n = kiln__ad_record(out, "interpolate", interpolate_backward, 1, &x, &failed);
    if (n) {
        n->iv[0] = mode;
        n->iv[1] = align_corners;
    }
    return kiln__ad_fail(out, failed);
}

/* ------------------------------------------------------------- softmax, layer_norm */

static int softmax_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    kiln_tensor *y = n->saved[0];
    int d = (int)n->iv[0];
    if (n->iv[1]) /* log_softmax: g - softmax * sum(g) */
        gin[0] = kiln_sub(g, kiln_mul(kiln_exp(y), kiln_sum(g, KILN_DIMS(d), true)));
    else          /* softmax: y (g - sum(g y)) */
        gin[0] = kiln_mul(y, kiln_sub(g, kiln_sum(kiln_mul(g, y), KILN_DIMS(d), true)));
    return gin[0] ? 0 : -1;
}

kiln_tensor *kiln__grad_softmax(kiln_tensor *out, kiln_tensor *t, int dim, bool log)
{
    bool failed;
    kiln__node *n = kiln__ad_record(out, log ? "log_softmax" : "softmax", softmax_backward, 1, &t, &failed);
    if (n) {
        n->iv[0] = dim;
        n->iv[1] = log;
        failed = kiln__ad_save(n, 0, out) < 0;
    }
    return kiln__ad_fail(out, failed);
}

static int layer_norm_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    kiln_tensor *x = n->saved[0], *w = n->saved[1];
    int nnorm = (int)n->iv[0];
    double eps = n->dv[0];
    int64_t inner = 1;
    for (int i = x->ndim - nnorm; i < x->ndim; i++)
        inner *= x->shape[i];
    if (inner == 0 || kiln__numel(x) == 0) {
        for (int i = 0; i < 3; i++)
            if (kiln__ad_needs(n, i))
                gin[i] = kiln_zeros(kiln__dev(g), g->dtype, n->edges[i].ndim, n->edges[i].shape);
        return 0;
    }
    kiln_tensor *g2 = kiln_reshape(g, KILN_SHAPE(-1, inner));
    /* The row-wise part runs in a scope of its own that keeps only the input gradient and
     * g xhat: its temporaries (xhat, dxhat, the row means) die before the column sums
     * below, whose reads end a fused group, so that group stores two values instead of
     * every one it made (it stored eleven). */
    kiln_scope_begin();
    kiln_tensor *x2 = kiln_reshape(x, KILN_SHAPE(-1, inner));
    kiln_tensor *mean = kiln_mean(x2, KILN_DIMS(1), true);
    kiln_tensor *rstd = kiln_rsqrt(kiln_add_scalar(kiln_var(x2, KILN_DIMS(1), 0, true), eps));
    kiln_tensor *xhat = kiln_mul(kiln_sub(x2, mean), rstd);
    if (kiln__ad_needs(n, 0)) {
        /* rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = g w */
        kiln_tensor *dxhat = w ? kiln_mul(g2, kiln_reshape(w, KILN_SHAPE(inner))) : g2;
        kiln_tensor *m1 = kiln_mean(dxhat, KILN_DIMS(1), true);
        kiln_tensor *m2 = kiln_mean(kiln_mul(dxhat, xhat), KILN_DIMS(1), true);
        kiln_tensor *gx = kiln_mul(rstd, kiln_sub(kiln_sub(dxhat, m1), kiln_mul(xhat, m2)));
        gin[0] = kiln_keep(kiln_reshape(gx, n->edges[0].ndim, n->edges[0].shape));
    }
    kiln_tensor *gxhat = kiln__ad_needs(n, 1) ? kiln_keep(kiln_mul(g2, xhat)) : NULL;
    kiln_scope_end();
    /* back into the node's scope, which releases them with the rest */
    gin[0] = kiln__ret(gin[0]);
    gxhat = kiln__ret(gxhat);
    if (kiln__ad_needs(n, 0) && !gin[0])
        return -1;
    if (kiln__ad_needs(n, 1)) {
        gin[1] = kiln_reshape(kiln_sum(gxhat, KILN_DIMS(0), false), n->edges[1].ndim, n->edges[1].shape);
        if (!gin[1])
            return -1;
    }
    if (kiln__ad_needs(n, 2)) {
        gin[2] = kiln_reshape(kiln_sum(g2, KILN_DIMS(0), false), n->edges[2].ndim, n->edges[2].shape);
        if (!gin[2])
            return -1;
    }
    return 0;
}

/* Batch norm with batch statistics, as one node: the composition (mean, var, sub, mul,
 * mul, add) records six nodes whose backward passes each walk the whole activation,
 * with a broadcast reduction for every per-channel operand. The closed form needs the
 * centred input, two per-channel sums and one output expression:
 *     gx = rstd w (g - sum(g)/N - xc rstd^2 sum(g xc)/N),  gw = rstd sum(g xc),  gb = sum(g)
 * with sums over every dim but 1. The forward's batch mean and rstd ([1, C, 1, ...]) are
 * saved with the input: backward runs once over a graph (there is no create_graph), so
 * nothing needs to differentiate through them again. Half dtypes work in f32, the
 * dtype of those statistics (ops-nn.c): the per-channel sums of g and g xc would
 * otherwise overflow or round away; the engine rounds the gradients back. */
static int batch_norm_backward(kiln__node *n, kiln_tensor *g0, kiln_tensor **gin)
{
    kiln_tensor *x0 = n->saved[0], *w = n->saved[1], *mean = n->saved[2], *rstd = n->saved[3];
    int64_t C = x0->shape[1];
    if (kiln__numel(x0) == 0) {
        for (int i = 0; i < 3; i++)
            if (kiln__ad_needs(n, i))
                gin[i] = kiln_zeros(kiln__dev(g0), g0->dtype, n->edges[i].ndim, n->edges[i].shape);
        return 0;
    }
    kiln_tensor *x = kiln_cast(x0, rstd->dtype), *g = kiln_cast(g0, rstd->dtype);
    if (!x || !g)
        return -1;
    int dims[KILN_MAX_DIMS], nd = 0;
    int64_t cshape[KILN_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) {
        cshape[i] = i == 1 ? C : 1;
        if (i != 1)
            dims[nd++] = i;
    }
    double count = (double)(kiln__numel(x) / C);
    kiln_tensor *xc = kiln_sub(x, mean);
    kiln_tensor *sum_g = kiln_sum(g, nd, dims, true);
    kiln_tensor *sum_gxc = kiln_sum(kiln_mul(g, xc), nd, dims, true);
    if (kiln__ad_needs(n, 0)) {
        kiln_tensor *k1 = w ? kiln_mul(rstd, kiln_reshape(w, x->ndim, cshape)) : rstd;
        kiln_tensor *k2 = kiln_mul_scalar(sum_g, 1.0 / count);
        kiln_tensor *k3 = kiln_mul_scalar(kiln_mul(sum_gxc, kiln_square(rstd)), 1.0 / count);
        gin[0] = kiln_mul(kiln_sub(kiln_sub(g, k2), kiln_mul(xc, k3)), k1);
        if (!gin[0])
            return -1;
    }
    if (kiln__ad_needs(n, 1)) {
        gin[1] = kiln_reshape(kiln_mul(sum_gxc, rstd), n->edges[1].ndim, n->edges[1].shape);
        if (!gin[1])
            return -1;
    }
    if (kiln__ad_needs(n, 2)) {
        gin[2] = kiln_reshape(sum_g, n->edges[2].ndim, n->edges[2].shape);
        if (!gin[2])
            return -1;
    }
    return 0;
}

kiln_tensor *kiln__grad_batch_norm(kiln_tensor *out, kiln_tensor *x, kiln_tensor *weight, kiln_tensor *bias,
                                   kiln_tensor *mean, kiln_tensor *rstd)
{
    bool failed;
    kiln_tensor *ins[3] = {x, weight, bias};
    kiln__node *n = kiln__ad_record(out, "batch_norm", batch_norm_backward, 3, ins, &failed);
    if (n) {
        kiln_tensor *cx = kiln__cast(x, out->dtype, n->name);
        kiln_tensor *cw = weight && cx ? kiln__cast(weight, out->dtype, n->name) : NULL;
        failed = !cx || (weight && !cw) || kiln__ad_save(n, 0, cx) < 0 || (cw && kiln__ad_save(n, 1, cw) < 0) ||
                 kiln__ad_save(n, 2, mean) < 0 || kiln__ad_save(n, 3, rstd) < 0;
        kiln_tensor_release(cx);
        kiln_tensor_release(cw);
    }
    return kiln__ad_fail(out, failed);
}

kiln_tensor *kiln__grad_layer_norm(kiln_tensor *out, kiln_tensor *x, int nnorm, kiln_tensor *weight,
                                   kiln_tensor *bias, double eps)
{
    bool failed;
    kiln_tensor *ins[3] = {x, weight, bias};
    kiln__node *n = kiln__ad_record(out, "layer_norm", layer_norm_backward, 3, ins, &failed);
    if (n) {
        n->iv[0] = nnorm;
        n->dv[0] = eps;
        kiln_tensor *cx = kiln__cast(x, out->dtype, n->name);
        kiln_tensor *cw = weight && cx ? kiln__cast(weight, out->dtype, n->name) : NULL;
        failed = !cx || (weight && !cw) || kiln__ad_save(n, 0, cx) < 0 || (cw && kiln__ad_save(n, 1, cw) < 0);
        kiln_tensor_release(cx);
        kiln_tensor_release(cw);
    }
    return kiln__ad_fail(out, failed);
}
