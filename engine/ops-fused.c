/*
 * engine/ops-fused.c — producers with their consumers folded in: a convolution that adds a
 * residual and applies an activation as it stores each output, and an epilogue (bias,
 * residual, activation) applied in place to a result nobody else holds yet.
 *
 * These are what a graph executor calls after it has matched Conv → Add → Relu or
 * MatMul → Add → Gelu-like chains (engine/onnx): unfused, each link reads and writes the
 * whole activation once more and allocates a buffer for it. The arithmetic is the
 * unfused ops' own, rounding step for rounding step (backends/backend.h, kiln_epilogue),
 * so a fused graph gives the same bits.
 *
 * The fused path is taken only when it can be: f32, a backend with the entry, a residual
 * of exactly the output's shape, and nothing that autograd must record. Otherwise the
 * chain runs as the separate engine ops, with broadcasting and gradients as usual; the
 * caller never needs to know which happened.
 */
#include <math.h>
#include <string.h>

#include "autograd-impl.h"
#include "error-impl.h"
#include "kiln/nn.h"
#include "tensor-impl.h"

static bool same_shape(const kiln_tensor *a, int ndim, const int64_t *shape)
{
    if (a->ndim != ndim)
        return false;
    for (int d = 0; d < ndim; d++)
        if (a->shape[d] != shape[d])
            return false;
    return true;
}

kiln_tensor *kiln__act_apply(kiln_tensor *t, kiln_epilogue_act act, double alpha, double beta)
{
    if (!t)
        return NULL;
    switch (act) {
    case KILN_EPI_NONE:
        return t;
    case KILN_EPI_RELU:
        return kiln_relu(t);
    case KILN_EPI_LEAKY_RELU:
        return kiln_leaky_relu(t, alpha);
    case KILN_EPI_CLAMP:
        return kiln_clamp(t, alpha, beta);
    case KILN_EPI_HARD_SIGMOID:
        return kiln_clamp(kiln_add_scalar(kiln_mul_scalar(t, alpha), beta), 0.0, 1.0);
    case KILN_EPI_HARD_SWISH:
        return kiln_mul(t, kiln_clamp(kiln_add_scalar(kiln_mul_scalar(t, 1.0 / 6.0), 0.5), 0.0, 1.0));
    case KILN_EPI_SIGMOID:
        return kiln_sigmoid(t);
    default:
        kiln__error_set("fused epilogue: unknown activation %d", (int)act);
        return NULL;
    }
}

/* t holds its storage alone and is a plain contiguous f32 result: the epilogue may write
 * over it. */
static bool epilogue_in_place_ok(const kiln_tensor *t)
{
    if (t->dtype != KILN_F32 || t->requires_grad || t->autograd || atomic_load(&t->storage->refcount) != 1)
        return false;
    int64_t want = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->strides[d] != want)
            return false;
        want *= t->shape[d];
    }
    return true;
}

kiln_tensor *kiln__epilogue(kiln_tensor *y, kiln_tensor *bias, kiln_tensor *residual, kiln_epilogue_act act,
                            double alpha, double beta)
{
    if (!y)
        return NULL;
    const kiln_backend_iface *be = kiln__be(y);
    int64_t last = y->ndim ? y->shape[y->ndim - 1] : 1;
    /* a clamp with lo above hi is kiln_clamp's error to report, so it takes the ops */
    bool fast = kiln__supports(kiln__dev(y), KILN_ENTRY_EPILOGUE, -1, y->dtype, NULL) && epilogue_in_place_ok(y) && !kiln__ad_want(bias) && !kiln__ad_want(residual) &&
                !(act == KILN_EPI_CLAMP && alpha > beta);
    if (fast && bias)
        fast = bias->dtype == KILN_F32 && bias->ndim == 1 && bias->shape[0] == last && kiln__dev(bias) == kiln__dev(y);
    if (fast && residual)
        fast = residual->dtype == KILN_F32 && same_shape(residual, y->ndim, y->shape) &&
               kiln__dev(residual) == kiln__dev(y) && residual->storage != y->storage;
    if (!fast) {
        kiln_tensor *z = y;
        if (bias)
            z = kiln_add(z, bias);
        if (residual)
            z = kiln_add(z, residual);
        return kiln__act_apply(z, act, alpha, beta);
    }
    kiln_tdesc yd, bd, rd;
    kiln__desc(y, &yd);
    kiln_epilogue ep = {act, alpha, beta, NULL, NULL};
    if (bias) {
        kiln__desc(bias, &bd);
        ep.bias = &bd;
    }
    if (residual) {
        kiln__desc(residual, &rd);
        ep.residual = &rd;
    }
    if (be->epilogue(kiln__ctx(y), &yd, &ep) < 0)
        return NULL;
    return y;
}

static void conv_params(const kiln_conv_opts *opts, int nspatial, kiln_conv_params *p)
{
    memset(p, 0, sizeof *p);
    p->nspatial = nspatial;
    p->groups = opts && opts->groups ? opts->groups : 1;
    for (int i = 0; i < nspatial; i++) {
        p->stride[i] = opts && opts->stride[i] ? opts->stride[i] : 1;
        p->padding[i] = opts ? opts->padding[i] : 0;
        p->dilation[i] = opts && opts->dilation[i] ? opts->dilation[i] : 1;
    }
}

kiln_tensor *kiln__conv_pack(kiln_tensor *w, kiln_tensor *x, const kiln_conv_opts *opts, int nspatial)
{
    if (!w || !x)
        return NULL;
    const kiln_backend_iface *be = kiln__be(w);
    if (!be->conv_pack_size || !kiln__supports(kiln__dev(w), KILN_ENTRY_CONV_PACK, -1, w->dtype, NULL) ||
        w->dtype != KILN_F32 || kiln__dev(x) != kiln__dev(w))
        return NULL;
    kiln_conv_params p;
    conv_params(opts, nspatial, &p);
    kiln_tdesc xd;
    kiln__desc(x, &xd);
    kiln_tensor *cw = kiln__contiguous(w, "conv_pack");
    if (!cw)
        return NULL;
    kiln_tdesc wd, pd;
    kiln__desc(cw, &wd);
    int64_t n = be->conv_pack_size(kiln__ctx(cw), &p, &xd, &wd);
    kiln_tensor *packed = n > 0 ? kiln__alloc(kiln__dev(w), KILN_F32, 1, &n, "conv_pack") : NULL;
    if (packed) {
        kiln__desc(packed, &pd);
        if (be->conv_pack(kiln__ctx(cw), &pd, &wd) < 0) {
            kiln_tensor_release(packed);
            packed = NULL;
        }
    }
    kiln_tensor_release(cw);
    return kiln__ret(packed);
}

kiln_tensor *kiln__conv_fused(kiln_tensor *x, kiln_tensor *w, kiln_tensor *wpacked, kiln_tensor *bias,
                              const kiln_conv_opts *opts, int nspatial, kiln_tensor *residual,
                              kiln_epilogue_act act, double alpha, double beta)
{
    if (!x || !w)
        return NULL;
    if (act == KILN_EPI_NONE && !residual && !wpacked) /* nothing to fuse: the plain op */
        return nspatial == 1 ? kiln_conv1d(x, w, bias, opts) : nspatial == 2 ? kiln_conv2d(x, w, bias, opts)
                                                                             : kiln_conv3d(x, w, bias, opts);
    const kiln_backend_iface *be = kiln__be(x);
    bool fast = kiln__supports(kiln__dev(x), KILN_ENTRY_CONV_FUSED, -1, x->dtype, NULL) && x->dtype == KILN_F32 && w->dtype == KILN_F32 && (!bias || bias->dtype == KILN_F32) &&
                x->ndim == nspatial + 2 && w->ndim == nspatial + 2 && !kiln__ad_want(x) && !kiln__ad_want(w) &&
                !kiln__ad_want(bias) && !kiln__ad_want(residual) && kiln__dev(w) == kiln__dev(x) &&
                (!bias || kiln__dev(bias) == kiln__dev(x)) && !(act == KILN_EPI_CLAMP && alpha > beta);
    kiln_conv_params p;
    conv_params(opts, nspatial, &p);
    int64_t oshape[KILN_MAX_DIMS] = {0};
    if (fast) {
        /* the geometry conv itself checks; anything unusual takes the separate ops, which
         * report it with their own messages */
        int64_t C = x->shape[1], O = w->shape[0];
        fast = p.groups >= 1 && C % p.groups == 0 && w->shape[1] * p.groups == C && O % p.groups == 0 && C > 0 &&
               (!bias || (bias->ndim == 1 && bias->shape[0] == O));
        oshape[0] = x->shape[0];
        oshape[1] = O;
        for (int i = 0; fast && i < nspatial; i++) {
            int64_t span = p.dilation[i] * (w->shape[2 + i] - 1) + 1, padded = x->shape[2 + i] + 2 * p.padding[i];
            fast = p.stride[i] >= 1 && p.padding[i] >= 0 && p.dilation[i] >= 1 && padded >= span;
            oshape[2 + i] = fast ? (padded - span) / p.stride[i] + 1 : 0;
        }
        if (fast && residual)
            fast = residual->dtype == KILN_F32 && kiln__dev(residual) == kiln__dev(x) &&
                   same_shape(residual, nspatial + 2, oshape);
    }
    if (!fast) {
        kiln_tensor *y = nspatial == 1   ? kiln_conv1d(x, w, bias, opts)
                         : nspatial == 2 ? kiln_conv2d(x, w, bias, opts)
                                         : kiln_conv3d(x, w, bias, opts);
        if (residual)
            y = kiln_add(y, residual);
        return kiln__act_apply(y, act, alpha, beta);
    }
    kiln_tensor *out = kiln__alloc(kiln__dev(x), KILN_F32, nspatial + 2, oshape, "conv_fused");
    if (!out)
        return NULL;
    if (kiln__numel(out) > 0) {
        kiln_tdesc od, xd, wd, bd, rd, pd;
        kiln__desc(out, &od);
        if (wpacked)
            kiln__desc(wpacked, &pd);
        kiln__desc(x, &xd);
        kiln__desc(w, &wd);
        if (bias)
            kiln__desc(bias, &bd);
        kiln_epilogue ep = {act, alpha, beta, NULL, NULL};
        if (residual) {
            kiln__desc(residual, &rd);
            ep.residual = &rd;
        }
        bool use_packed = wpacked && kiln__dev(wpacked) == kiln__dev(x) && wpacked->dtype == KILN_F32;
        if (be->conv_fused(kiln__ctx(x), &p, &od, &xd, &wd, use_packed ? &pd : NULL, bias ? &bd : NULL, &ep) < 0) {
            kiln_tensor_release(out);
            return NULL;
        }
    }
    return kiln__ret(out);
}
