/*
 * engine/ops-conv.c — convolution, transposed convolution, pooling and interpolation.
 *
 * The public option structs use 0 for "the default" so that a zeroed struct is valid;
 * this file resolves them into the fully filled kiln_conv_params / kiln_pool_params the
 * backends take, checks the geometry and computes output sizes with PyTorch's formulas
 * (ceil_mode included). Unbatched inputs ([C, L...]) get a batch dim of 1 for the call.
 */
#include <stdio.h>
#include <string.h>

#include "autograd-impl.h"
#include "tensor-impl.h"

/* x as a batched tensor: a view with a leading 1 when it lacks the batch dim. */
static kiln_tensor *batched(kiln_tensor *x, int ns, bool *unbatched, const char *op)
{
    char dx[200];
    *unbatched = x->ndim == ns + 1;
    if (x->ndim != ns + 2 && !*unbatched) {
        kiln__error_set("%s: input must be [N, C, %d spatial dims] or [C, ...], got %s", op, ns,
                        kiln__describe(x, dx, sizeof dx));
        return NULL;
    }
    if (!*unbatched)
        return kiln_tensor_retain(x);
    int64_t sh[KILN_MAX_DIMS], st[KILN_MAX_DIMS];
    sh[0] = 1;
    st[0] = 0;
    for (int i = 0; i < x->ndim; i++) {
        sh[i + 1] = x->shape[i];
        st[i + 1] = x->strides[i];
    }
    return kiln__view(x, x->ndim + 1, sh, st, x->offset);
}

/* Undo batched(): drop the leading dim of a result when the input had none. */
static kiln_tensor *unbatch(kiln_tensor *y, bool unbatched)
{
    if (!y || !unbatched)
        return y;
    kiln_tensor *v = kiln__view(y, y->ndim - 1, y->shape + 1, y->strides + 1, y->offset);
    kiln_tensor_release(y);
    return v;
}

/* out + bias viewed as [C, 1, ...]; consumes out. */
static kiln_tensor *add_channel_bias(kiln_tensor *out, kiln_tensor *bias, int ns, const char *op)
{
    int64_t bshape[KILN_MAX_DIMS];
    bshape[0] = bias->shape[0];
    for (int i = 0; i < ns; i++)
        bshape[1 + i] = 1;
    kiln_tensor *b = kiln__reshape(bias, ns + 1, bshape, op);
    kiln_tensor *y = b ? kiln__binary(KILN_BINARY_ADD, out, b) : NULL;
    kiln_tensor_release(b);
    kiln_tensor_release(out);
    return y;
}

static int resolve_conv(const kiln_conv_opts *o, int ns, kiln_conv_params *p, const char *op)
{
    memset(p, 0, sizeof *p);
    p->nspatial = ns;
    p->groups = o && o->groups ? o->groups : 1;
    if (p->groups < 1)
        return kiln__error_set("%s: groups %lld must be positive", op, (long long)p->groups);
    for (int i = 0; i < ns; i++) {
        p->stride[i] = o && o->stride[i] ? o->stride[i] : 1;
        p->padding[i] = o ? o->padding[i] : 0;
        p->dilation[i] = o && o->dilation[i] ? o->dilation[i] : 1;
        if (p->stride[i] < 1 || p->padding[i] < 0 || p->dilation[i] < 1)
            return kiln__error_set("%s: stride %lld, padding %lld, dilation %lld of spatial dim %d are invalid",
                                   op, (long long)p->stride[i], (long long)p->padding[i],
                                   (long long)p->dilation[i], i);
    }
    return 0;
}

static int check_bias(const kiln_tensor *bias, int64_t channels, const kiln_tensor *x, const char *op)
{
    char db[200];
    if (!bias)
        return 0;
    if (kiln__same_device(x, bias, op) < 0)
        return -1;
    if (bias->ndim != 1 || bias->shape[0] != channels)
        return kiln__error_set("%s: bias %s must be [%lld]", op, kiln__describe(bias, db, sizeof db),
                               (long long)channels);
    return 0;
}

static kiln_tensor *conv_impl(kiln_tensor *x0, kiln_tensor *w, kiln_tensor *bias,
                              const kiln_conv_opts *opts, int ns, const char *op)
{
    char dx[200], dw[200];
    kiln_conv_params p;
    if (resolve_conv(opts, ns, &p, op) < 0 || kiln__same_device(x0, w, op) < 0)
        return NULL;
    bool unb;
    kiln_tensor *x = batched(x0, ns, &unb, op);
    if (!x)
        return NULL;
    int64_t C = x->shape[1], O = w->ndim ? w->shape[0] : 0;
    kiln_tensor *out = NULL, *cx = NULL, *cw = NULL, *cbias = NULL;
    kiln_dtype dt = kiln_promote_types(x->dtype, w->dtype);
    if (w->ndim != ns + 2 || w->shape[1] * p.groups != C || O % p.groups != 0) {
        kiln__error_set("%s: weight %s does not fit input %s with groups %lld", op,
                        kiln__describe(w, dw, sizeof dw), kiln__describe(x0, dx, sizeof dx), (long long)p.groups);
        goto done;
    }
    if (!kiln_dtype_is_float(dt)) {
        kiln__error_set("%s: needs floating tensors, got %s and %s", op, kiln__describe(x0, dx, sizeof dx),
                        kiln__describe(w, dw, sizeof dw));
        goto done;
    }
    if (check_bias(bias, O, x, op) < 0)
        goto done;
    int64_t oshape[KILN_MAX_DIMS] = {x->shape[0], O};
    for (int i = 0; i < ns; i++) {
        int64_t span = p.dilation[i] * (w->shape[2 + i] - 1) + 1;
        int64_t padded = x->shape[2 + i] + 2 * p.padding[i];
        if (padded < span) {
            kiln__error_set("%s: kernel %s (dilated) is larger than the padded input %s", op,
                            kiln__describe(w, dw, sizeof dw), kiln__describe(x0, dx, sizeof dx));
            goto done;
        }
        oshape[2 + i] = (padded - span) / p.stride[i] + 1;
    }
    cx = kiln__cast(x, dt, op);
    cw = cx ? kiln__cast(w, dt, op) : NULL;
    cbias = cw && bias ? kiln__cast(bias, dt, op) : NULL;
    if (!cw || (bias && !cbias))
        goto done;
    out = kiln__alloc(kiln__dev(x), dt, ns + 2, oshape, op);
    if (out && kiln__numel(out) > 0) {
        int rc;
        const kiln_backend_iface *be = kiln__be(x);
        if (C == 0) {
            /* No input channels: the result is the bias alone. */
            rc = kiln__fill(out, 0, op);
            if (rc == 0 && cbias) {
                out = add_channel_bias(out, cbias, ns, op);
                rc = out ? 0 : -1;
            }
        } else if (!kiln__supports(kiln__dev(x), KILN_ENTRY_CONV, -1, out->dtype, &p)) {
            rc = kiln__unsupported(kiln__dev(x), op, KILN_ENTRY_CONV, -1, out->dtype);
        } else {
            kiln_tdesc od, xd, wd, bd;
            kiln__desc(out, &od);
            kiln__desc(cx, &xd);
            kiln__desc(cw, &wd);
            if (cbias)
                kiln__desc(cbias, &bd);
            rc = be->conv(kiln__ctx(x), &p, &od, &xd, &wd, cbias ? &bd : NULL);
        }
        if (rc < 0) {
            kiln_tensor_release(out);
            out = NULL;
        }
    }
done:
    out = unbatch(out, unb);
    if (out && (kiln__ad_want(x0) || kiln__ad_want(w) || kiln__ad_want(bias)))
        out = kiln__grad_conv(out, x0, w, bias, &p, cx, cw, false, op);
    kiln_tensor_release(cx);
    kiln_tensor_release(cw);
    kiln_tensor_release(cbias);
    kiln_tensor_release(x);
    return out;
}

#define CONV(fn, NS)                                                                         \
    kiln_tensor *kiln_##fn(kiln_tensor *x, kiln_tensor *weight, kiln_tensor *bias,           \
                           const kiln_conv_opts *opts)                                       \
    {                                                                                        \
        if (!x || !weight)                                                                   \
            return NULL;                                                                     \
        return kiln__ret(conv_impl(x, weight, bias, opts, NS, #fn));                         \
    }

CONV(conv1d, 1)
CONV(conv2d, 2)
CONV(conv3d, 3)

static kiln_tensor *conv_transpose_impl(kiln_tensor *x0, kiln_tensor *w, kiln_tensor *bias,
                                        const kiln_conv_opts *opts, int ns, const char *op)
{
    char dx[200], dw[200];
    kiln_conv_params p;
    if (resolve_conv(opts, ns, &p, op) < 0 || kiln__same_device(x0, w, op) < 0)
        return NULL;
    bool unb;
    kiln_tensor *x = batched(x0, ns, &unb, op);
    if (!x)
        return NULL;
    kiln_tensor *out = NULL, *cx = NULL, *cw = NULL;
    int64_t Cin = x->shape[1];
    kiln_dtype dt = kiln_promote_types(x->dtype, w->dtype);
    if (w->ndim != ns + 2 || w->shape[0] != Cin || Cin % p.groups != 0) {
        kiln__error_set("%s: weight %s [C_in, C_out/groups, K...] does not fit input %s with groups %lld", op,
                        kiln__describe(w, dw, sizeof dw), kiln__describe(x0, dx, sizeof dx), (long long)p.groups);
        goto done;
    }
    if (!kiln_dtype_is_float(dt)) {
        kiln__error_set("%s: needs floating tensors, got %s and %s", op, kiln__describe(x0, dx, sizeof dx),
                        kiln__describe(w, dw, sizeof dw));
        goto done;
    }
    int64_t Cout = w->shape[1] * p.groups;
    if (check_bias(bias, Cout, x, op) < 0)
        goto done;
    int64_t oshape[KILN_MAX_DIMS] = {x->shape[0], Cout};
    for (int i = 0; i < ns; i++) {
        int64_t opad = opts ? opts->output_padding[i] : 0;
        if (opad < 0 || (opad >= p.stride[i] && opad >= p.dilation[i])) {
            kiln__error_set("%s: output_padding %lld must be below stride %lld or dilation %lld", op,
                            (long long)opad, (long long)p.stride[i], (long long)p.dilation[i]);
            goto done;
        }
        oshape[2 + i] = (x->shape[2 + i] - 1) * p.stride[i] - 2 * p.padding[i] +
                        p.dilation[i] * (w->shape[2 + i] - 1) + opad + 1;
        if (oshape[2 + i] < 1) {
            kiln__error_set("%s: input %s gives a non-positive output size", op, kiln__describe(x0, dx, sizeof dx));
            goto done;
        }
    }
    cx = kiln__cast(x, dt, op);
    cw = cx ? kiln__cast(w, dt, op) : NULL;
    if (!cw)
        goto done;
    out = kiln__alloc(kiln__dev(x), dt, ns + 2, oshape, op);
    if (out && kiln__numel(out) > 0) {
        const kiln_backend_iface *be = kiln__be(x);
        int rc = kiln__fill(out, 0, op);
        if (rc == 0 && Cin > 0 && kiln__numel(x) > 0) {
            if (!kiln__supports(kiln__dev(x), KILN_ENTRY_CONV_BACKWARD_INPUT, -1, x->dtype, &p)) {
                rc = kiln__unsupported(kiln__dev(x), op, KILN_ENTRY_CONV_BACKWARD_INPUT, -1, x->dtype);
            } else {
                kiln_tdesc od, xd, wd;
                kiln__desc(out, &od);
                kiln__desc(cx, &xd);
                kiln__desc(cw, &wd);
                rc = be->conv_backward_input(kiln__ctx(x), &p, &od, &xd, &wd);
            }
        }
        if (rc == 0 && bias) {
            out = add_channel_bias(out, bias, ns, op);
            rc = out ? 0 : -1;
        }
        if (rc < 0) {
            kiln_tensor_release(out);
            out = NULL;
        }
    }
done:
    out = unbatch(out, unb);
    if (out && (kiln__ad_want(x0) || kiln__ad_want(w) || kiln__ad_want(bias)))
        out = kiln__grad_conv(out, x0, w, bias, &p, cx, cw, true, op);
    kiln_tensor_release(cx);
    kiln_tensor_release(cw);
    kiln_tensor_release(x);
    return out;
}

kiln_tensor *kiln_conv_transpose1d(kiln_tensor *x, kiln_tensor *weight, kiln_tensor *bias,
                                   const kiln_conv_opts *opts)
{
    if (!x || !weight)
        return NULL;
    return kiln__ret(conv_transpose_impl(x, weight, bias, opts, 1, "conv_transpose1d"));
}

kiln_tensor *kiln_conv_transpose2d(kiln_tensor *x, kiln_tensor *weight, kiln_tensor *bias,
                                   const kiln_conv_opts *opts)
{
    if (!x || !weight)
        return NULL;
    return kiln__ret(conv_transpose_impl(x, weight, bias, opts, 2, "conv_transpose2d"));
}

/* ------------------------------------------------------------------- pooling */

static int64_t pool_out(int64_t L, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode)
{
    int64_t num = L + 2 * p - d * (k - 1) - 1;
    if (num < 0)
        return -1;
    int64_t o = (ceil_mode ? (num + s - 1) / s : num / s) + 1;
    /* PyTorch: the last window must start inside the input or its left padding. */
    if (ceil_mode && (o - 1) * s >= L + p)
        o--;
    return o;
}

static kiln_tensor *pool_impl(kiln_tensor *x0, const kiln_pool_opts *o, int ns, kiln_pool_kind kind,
                              kiln_tensor **indices, const char *op)
{
    char dx[200];
    if (indices)
        *indices = NULL;
    if (!o) {
        kiln__error_set("%s: options with a kernel size are required", op);
        return NULL;
    }
    kiln_pool_params p;
    memset(&p, 0, sizeof p);
    p.nspatial = ns;
    p.kind = kind;
    p.count_include_pad = o->count_include_pad;
    for (int i = 0; i < ns; i++) {
        p.kernel[i] = o->kernel[i];
        p.stride[i] = o->stride[i] ? o->stride[i] : o->kernel[i];
        p.padding[i] = o->padding[i];
        p.dilation[i] = kind == KILN_POOL_MAX && o->dilation[i] ? o->dilation[i] : 1;
        if (p.kernel[i] < 1 || p.stride[i] < 1 || p.padding[i] < 0 || p.dilation[i] < 1 ||
            p.padding[i] > p.kernel[i] / 2) {
            kiln__error_set("%s: kernel %lld, stride %lld, padding %lld, dilation %lld are invalid "
                            "(padding must be at most half the kernel)", op, (long long)p.kernel[i],
                            (long long)p.stride[i], (long long)p.padding[i], (long long)p.dilation[i]);
            return NULL;
        }
    }
    bool unb;
    kiln_tensor *x = batched(x0, ns, &unb, op);
    if (!x)
        return NULL;
    int64_t oshape[KILN_MAX_DIMS] = {x->shape[0], x->shape[1]};
    for (int i = 0; i < ns; i++) {
        oshape[2 + i] = pool_out(x->shape[2 + i], p.kernel[i], p.stride[i], p.padding[i], p.dilation[i],
                                 o->ceil_mode);
        if (oshape[2 + i] < 1) {
            kiln__error_set("%s: input %s is too small for the kernel", op, kiln__describe(x0, dx, sizeof dx));
            kiln_tensor_release(x);
            return NULL;
        }
    }
    /* Max pooling keeps its indices for backward even when the caller wants none. */
    bool record = kiln__ad_want(x0);
    bool want_ix = indices || (record && kind == KILN_POOL_MAX);
    kiln_tensor *out = kiln__alloc(kiln__dev(x), x->dtype, ns + 2, oshape, op);
    kiln_tensor *ix = out && want_ix ? kiln__alloc(kiln__dev(x), KILN_I64, ns + 2, oshape, op) : NULL;
    int rc = out && (!want_ix || ix) ? 0 : -1;
    if (rc == 0 && kiln__numel(out) > 0) {
        const kiln_backend_iface *be = kiln__be(x);
        if (!kiln__supports(kiln__dev(x), KILN_ENTRY_POOL, (int)kind, x->dtype, NULL)) {
            rc = kiln__unsupported(kiln__dev(x), op, KILN_ENTRY_POOL, (int)kind, x->dtype);
        } else {
            kiln_tdesc od, xd, id;
            kiln__desc(out, &od);
            kiln__desc(x, &xd);
            if (ix)
                kiln__desc(ix, &id);
            rc = be->pool(kiln__ctx(x), &p, &od, ix ? &id : NULL, &xd);
        }
    }
    kiln_tensor_release(x);
    if (rc < 0) {
        kiln_tensor_release(out);
        kiln_tensor_release(ix);
        return NULL;
    }
    out = unbatch(out, unb);
    if (out && record)
        out = kiln__grad_pool(out, x0, &p, ix, op);
    if (!out) {
        kiln_tensor_release(ix);
        return NULL;
    }
    if (indices)
        *indices = kiln__ret(unbatch(ix, unb));
    else
        kiln_tensor_release(ix);
    return out;
}

kiln_tensor *kiln_max_pool1d(kiln_tensor *x, const kiln_pool_opts *opts, kiln_tensor **indices)
{
    if (indices)
        *indices = NULL;
    return x ? kiln__ret(pool_impl(x, opts, 1, KILN_POOL_MAX, indices, "max_pool1d")) : NULL;
}

kiln_tensor *kiln_max_pool2d(kiln_tensor *x, const kiln_pool_opts *opts, kiln_tensor **indices)
{
    if (indices)
        *indices = NULL;
    return x ? kiln__ret(pool_impl(x, opts, 2, KILN_POOL_MAX, indices, "max_pool2d")) : NULL;
}

kiln_tensor *kiln_avg_pool1d(kiln_tensor *x, const kiln_pool_opts *opts)
{
    return x ? kiln__ret(pool_impl(x, opts, 1, KILN_POOL_AVG, NULL, "avg_pool1d")) : NULL;
}

kiln_tensor *kiln_avg_pool2d(kiln_tensor *x, const kiln_pool_opts *opts)
{
    return x ? kiln__ret(pool_impl(x, opts, 2, KILN_POOL_AVG, NULL, "avg_pool2d")) : NULL;
}

static kiln_tensor *adaptive_impl(kiln_tensor *x0, int ns, const int64_t *osz, const char *op)
{
    char dx[200];
    bool unb;
    for (int i = 0; i < ns; i++) {
        if (osz[i] < 1) {
            kiln__error_set("%s: output size %lld must be positive", op, (long long)osz[i]);
            return NULL;
        }
    }
    kiln_tensor *x = batched(x0, ns, &unb, op);
    if (!x)
        return NULL;
    int64_t oshape[KILN_MAX_DIMS] = {x->shape[0], x->shape[1]};
    for (int i = 0; i < ns; i++) {
        if (x->shape[2 + i] < 1 && kiln__numel(x) > 0) {
            kiln__error_set("%s: input %s has an empty spatial dim", op, kiln__describe(x0, dx, sizeof dx));
            kiln_tensor_release(x);
            return NULL;
        }
        oshape[2 + i] = osz[i];
    }
    kiln_dtype dt = kiln_dtype_is_float(x->dtype) ? x->dtype : KILN_F32;
    kiln_tensor *cx = kiln__cast(x, dt, op);
    kiln_tensor *out = cx ? kiln__alloc(kiln__dev(x), dt, ns + 2, oshape, op) : NULL;
    int rc = out ? 0 : -1;
    if (rc == 0 && kiln__numel(out) > 0 && kiln__numel(x) > 0) {
        const kiln_backend_iface *be = kiln__be(x);
        kiln_tdesc od, xd;
        kiln__desc(out, &od);
        kiln__desc(cx, &xd);
        rc = kiln__supports(kiln__dev(x), KILN_ENTRY_ADAPTIVE_AVG_POOL, -1, cx->dtype, NULL)
                 ? be->adaptive_avg_pool(kiln__ctx(x), ns, &od, &xd)
                 : kiln__unsupported(kiln__dev(x), op, KILN_ENTRY_ADAPTIVE_AVG_POOL, -1, cx->dtype);
    }
    kiln_tensor_release(cx);
    kiln_tensor_release(x);
    if (rc < 0) {
        kiln_tensor_release(out);
        return NULL;
    }
    out = unbatch(out, unb);
    if (out && kiln__ad_want(x0))
        out = kiln__grad_adaptive(out, x0, ns, op);
    return out;
}

kiln_tensor *kiln_adaptive_avg_pool1d(kiln_tensor *x, int64_t out_l)
{
    return x ? kiln__ret(adaptive_impl(x, 1, &out_l, "adaptive_avg_pool1d")) : NULL;
}

kiln_tensor *kiln_adaptive_avg_pool2d(kiln_tensor *x, int64_t out_h, int64_t out_w)
{
    int64_t o[2] = {out_h, out_w};
    return x ? kiln__ret(adaptive_impl(x, 2, o, "adaptive_avg_pool2d")) : NULL;
}

kiln_tensor *kiln_interpolate(kiln_tensor *x, int64_t out_h, int64_t out_w, kiln_interp_mode mode,
                              bool align_corners)
{
    if (!x)
        return NULL;
    const char *op = "interpolate";
    char dx[200];
    if (x->ndim != 4 || out_h < 1 || out_w < 1 ||
        (mode != KILN_INTERP_NEAREST && mode != KILN_INTERP_BILINEAR)) {
        kiln__error_set("%s: needs [N, C, H, W] input, positive sizes and a known mode (got %s to %lldx%lld)",
                        op, kiln__describe(x, dx, sizeof dx), (long long)out_h, (long long)out_w);
        return NULL;
    }
    if (mode == KILN_INTERP_NEAREST)
        align_corners = false;
    kiln_dtype dt = mode == KILN_INTERP_BILINEAR && !kiln_dtype_is_float(x->dtype) ? KILN_F32 : x->dtype;
    kiln_tensor *cx = kiln__cast(x, dt, op);
    int64_t oshape[4] = {x->shape[0], x->shape[1], out_h, out_w};
    kiln_tensor *out = cx ? kiln__alloc(kiln__dev(x), dt, 4, oshape, op) : NULL;
    int rc = out ? 0 : -1;
    if (rc == 0 && kiln__numel(out) > 0) {
        if (x->shape[2] == 0 || x->shape[3] == 0) {
            rc = kiln__error_set("%s: input %s is empty", op, kiln__describe(x, dx, sizeof dx));
        } else {
            const kiln_backend_iface *be = kiln__be(x);
            kiln_tdesc od, xd;
            kiln__desc(out, &od);
            kiln__desc(cx, &xd);
            rc = kiln__supports(kiln__dev(x), KILN_ENTRY_INTERPOLATE, (int)mode, cx->dtype, NULL)
                     ? be->interpolate(kiln__ctx(x), mode, align_corners, &od, &xd)
                     : kiln__unsupported(kiln__dev(x), op, KILN_ENTRY_INTERPOLATE, (int)mode, cx->dtype);
        }
    }
    kiln_tensor_release(cx);
    if (rc < 0) {
        kiln_tensor_release(out);
        return NULL;
    }
    if (kiln__ad_want(x))
        out = kiln__grad_interpolate(out, x, mode, align_corners);
    return kiln__ret(out);
}
