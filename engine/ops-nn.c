/*
 * engine/ops-nn.c — softmax, normalizations, dropout and attention.
 *
 * softmax and layer_norm go to the backend's fused entry when it has one and are
 * composed otherwise; the rest are always composed from primitives. Composites run in
 * a private scope: every intermediate is released at its end and only the result is
 * kept, which is also what makes every early error path leak-free.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "autograd-impl.h"
#include "tensor-impl.h"

/* ------------------------------------------------------------------- softmax */

static kiln_tensor *softmax_impl(kiln_tensor *t, int dim, bool log, const char *op)
{
    int d = kiln__wrap_dim(dim, t->ndim, op);
    if (d < 0)
        return NULL;
    kiln_dtype dt = kiln_dtype_is_float(t->dtype) ? t->dtype : KILN_F32;
    const kiln_backend_iface *be = kiln__be(t);
    /* fallback when the device lacks it: composed from exp, sums and logs below */
    if (kiln__supports(kiln__dev(t), KILN_ENTRY_SOFTMAX, -1, dt, NULL) && t->ndim > 0) {
        kiln_tensor *in = kiln__cast(t, dt, op);
        kiln_tensor *out = in ? kiln__alloc(kiln__dev(t), dt, t->ndim, t->shape, op) : NULL;
        int rc = out ? 0 : -1;
        if (rc == 0 && kiln__numel(out) > 0) {
            kiln_tdesc od, id;
            kiln__desc(out, &od);
            kiln__desc(in, &id);
            rc = be->softmax(kiln__ctx(t), log, &od, &id, d);
        }
        kiln_tensor_release(in);
        if (rc < 0) {
            kiln_tensor_release(out);
            return NULL;
        }
        if (kiln__ad_want(t))
            out = kiln__grad_softmax(out, t, d, log);
        return kiln__ret(out);
    }
    kiln_scope_begin();
    kiln_tensor *x = kiln_cast(t, dt);
    kiln_tensor *m = kiln_max(x, KILN_DIMS(d), true);
    kiln_tensor *z = kiln_sub(x, m);
    kiln_tensor *e = kiln_exp(z);
    kiln_tensor *s = kiln_sum(e, KILN_DIMS(d), true);
    kiln_tensor *r = log ? kiln_sub(z, kiln_log(s)) : kiln_div(e, s);
    return kiln__scope_end_keep(r);
}

kiln_tensor *kiln_softmax(kiln_tensor *t, int dim)
{
    return t ? softmax_impl(t, dim, false, "softmax") : NULL;
}

kiln_tensor *kiln_log_softmax(kiln_tensor *t, int dim)
{
    return t ? softmax_impl(t, dim, true, "log_softmax") : NULL;
}

/* ---------------------------------------------------------------- layer_norm */

kiln_tensor *kiln_layer_norm(kiln_tensor *x, int nnorm, kiln_tensor *weight, kiln_tensor *bias, double eps)
{
    if (!x)
        return NULL;
    const char *op = "layer_norm";
    char dx[200], dp[200];
    if (nnorm < 1 || nnorm > x->ndim) {
        kiln__error_set("%s: cannot normalize the last %d dims of %s", op, nnorm, kiln__describe(x, dx, sizeof dx));
        return NULL;
    }
    const int64_t *nshape = x->shape + x->ndim - nnorm;
    kiln_tensor *params[2] = {weight, bias};
    for (int k = 0; k < 2; k++) {
        kiln_tensor *p = params[k];
        if (!p)
            continue;
        bool ok = p->ndim == nnorm;
        for (int i = 0; ok && i < nnorm; i++)
            ok = p->shape[i] == nshape[i];
        if (!ok || kiln__same_device(x, p, op) < 0) {
            if (ok)
                return NULL;
            char ns[160];
            kiln__error_set("%s: %s %s must have shape %s", op, k ? "bias" : "weight",
                            kiln__describe(p, dp, sizeof dp), kiln__shape_str(nnorm, nshape, ns, sizeof ns));
            return NULL;
        }
    }
    kiln_dtype dt = kiln_dtype_is_float(x->dtype) ? x->dtype : KILN_F32;
    int64_t inner = 1;
    for (int i = 0; i < nnorm; i++)
        inner *= nshape[i];
    const kiln_backend_iface *be = kiln__be(x);
    /* fallback when the device lacks it: composed from means and elementwise ops */
    if (kiln__supports(kiln__dev(x), KILN_ENTRY_LAYER_NORM, -1, dt, NULL)) {
        kiln_tensor *cx = kiln__cast(x, dt, op);
        kiln_tensor *in = cx ? kiln__contiguous(cx, op) : NULL;
        kiln_tensor *w = NULL, *b = NULL, *out = NULL;
        kiln_tensor_release(cx);
        int rc = in ? 0 : -1;
        if (rc == 0 && weight) {
            kiln_tensor *c = kiln__cast(weight, dt, op);
            w = c ? kiln__reshape(c, 1, &inner, op) : NULL;
            kiln_tensor_release(c);
            rc = w ? 0 : -1;
        }
        if (rc == 0 && bias) {
            kiln_tensor *c = kiln__cast(bias, dt, op);
            b = c ? kiln__reshape(c, 1, &inner, op) : NULL;
            kiln_tensor_release(c);
            rc = b ? 0 : -1;
        }
        if (rc == 0) {
            out = kiln__alloc(kiln__dev(x), dt, x->ndim, x->shape, op);
            rc = out ? 0 : -1;
        }
        if (rc == 0 && kiln__numel(out) > 0) {
            kiln_tdesc od, xd, wd, bd;
            kiln__desc(out, &od);
            kiln__desc(in, &xd);
            if (w)
                kiln__desc(w, &wd);
            if (b)
                kiln__desc(b, &bd);
            rc = be->layer_norm(kiln__ctx(x), &od, NULL, NULL, &xd, w ? &wd : NULL, b ? &bd : NULL, inner, eps);
        }
        kiln_tensor_release(in);
        kiln_tensor_release(w);
        kiln_tensor_release(b);
        if (rc < 0) {
            kiln_tensor_release(out);
            return NULL;
        }
        if (kiln__ad_want(x) || kiln__ad_want(weight) || kiln__ad_want(bias))
            out = kiln__grad_layer_norm(out, x, nnorm, weight, bias, eps);
        return kiln__ret(out);
    }
    int dims[KILN_MAX_DIMS];
    for (int i = 0; i < nnorm; i++)
        dims[i] = x->ndim - nnorm + i;
    kiln_scope_begin();
    kiln_tensor *cx = kiln_cast(x, dt);
    kiln_tensor *mean = kiln_mean(cx, nnorm, dims, true);
    kiln_tensor *var = kiln_var(cx, nnorm, dims, 0, true);
    kiln_tensor *y = kiln_mul(kiln_sub(cx, mean), kiln_rsqrt(kiln_add_scalar(var, eps)));
    if (weight)
        y = kiln_mul(y, kiln_cast(weight, dt));
    if (bias)
        y = kiln_add(y, kiln_cast(bias, dt));
    return kiln__scope_end_keep(y);
}

/* ---------------------------------------------------------- batch, group norm */

/* The dtype normalization statistics are computed in: f32 for the half dtypes, whose
 * range a variance leaves early (activations of std 256 have a variance past f16's
 * 65504), as PyTorch accumulates them; the input's own dtype otherwise. */
static kiln_dtype stats_dtype(kiln_dtype dt)
{
    return dt == KILN_F16 || dt == KILN_BF16 ? KILN_F32 : dt;
}

/* Shape [1, C, 1, ...] of rank ndim, for per-channel parameters. */
static kiln_tensor *per_channel(kiln_tensor *p, int ndim, kiln_dtype dt)
{
    int64_t shape[KILN_MAX_DIMS];
    for (int i = 0; i < ndim; i++)
        shape[i] = 1;
    shape[1] = -1;
    return kiln_reshape(kiln_cast(p, dt), ndim, shape);
}

kiln_tensor *kiln_batch_norm(kiln_tensor *x, kiln_tensor *running_mean, kiln_tensor *running_var,
                             kiln_tensor *weight, kiln_tensor *bias, bool training, double momentum,
                             double eps)
{
    if (!x)
        return NULL;
    const char *op = "batch_norm";
    char dx[200], dp[200];
    if (x->ndim < 2) {
        kiln__error_set("%s: input must be [N, C, ...], got %s", op, kiln__describe(x, dx, sizeof dx));
        return NULL;
    }
    int64_t C = x->shape[1];
    kiln_tensor *params[4] = {running_mean, running_var, weight, bias};
    static const char *const pname[4] = {"running_mean", "running_var", "weight", "bias"};
    for (int k = 0; k < 4; k++) {
        if (!params[k])
            continue;
        if (kiln__same_device(x, params[k], op) < 0)
            return NULL;
        if (params[k]->ndim != 1 || params[k]->shape[0] != C) {
            kiln__error_set("%s: %s %s must be [%lld] for input %s", op, pname[k],
                            kiln__describe(params[k], dp, sizeof dp), (long long)C, kiln__describe(x, dx, sizeof dx));
            return NULL;
        }
        /* the running statistics are updated in place: integers would take a truncated update
         * without a word, as PyTorch refuses them */
        if (k < 2 && !kiln_dtype_is_float(params[k]->dtype)) {
            kiln__error_set("%s: %s %s must be a floating-point tensor (it is updated with fractional values)", op,
                            pname[k], kiln__describe(params[k], dp, sizeof dp));
            return NULL;
        }
    }
    if ((running_mean == NULL) != (running_var == NULL)) {
        kiln__error_set("%s: give both running_mean and running_var or neither", op);
        return NULL;
    }
    bool use_batch = training || !running_mean;
    int64_t per = C ? kiln__numel(x) / C : 0;
    /* Batch statistics of fewer than 2 values per channel are undefined (the mean of an
     * empty batch is NaN, the unbiased variance divides by per - 1): refuse before any
     * work is queued, so the running statistics are never touched, on any backend. */
    if (use_batch && C > 0 && per <= 1) {
        kiln__error_set("%s: need more than 1 value per channel when training, got %s", op,
                        kiln__describe(x, dx, sizeof dx));
        return NULL;
    }
    kiln_dtype dt = kiln_dtype_is_float(x->dtype) ? x->dtype : KILN_F32;
    kiln_dtype st = stats_dtype(dt);
    int dims[KILN_MAX_DIMS], nd = 0;
    for (int i = 0; i < x->ndim; i++)
        if (i != 1)
            dims[nd++] = i;
    /* With batch statistics the result is recorded as one batch_norm node (closed-form
     * backward, grad-nn.c) rather than as its composition. */
    bool one_node = use_batch && (kiln__ad_want(x) || kiln__ad_want(weight) || kiln__ad_want(bias));
    kiln_scope_begin();
    if (one_node)
        kiln_no_grad_begin();
    kiln_tensor *cx = kiln_cast(x, st);
    kiln_tensor *mean, *var;
    if (use_batch) {
        mean = kiln_mean(cx, nd, dims, true);
        var = kiln_var(cx, nd, dims, 0, true);
        if (training && running_mean && mean && var) {
            /* running = (1 - m) running + m batch, with the unbiased batch variance.
             * Bookkeeping, not part of the result: nothing to record. */
            kiln_no_grad_begin();
            kiln_tensor *bm = kiln_reshape(mean, KILN_SHAPE(C));
            kiln_tensor *bv = kiln_mul_scalar(kiln_reshape(var, KILN_SHAPE(C)), (double)per / (double)(per - 1));
            kiln_tensor *nm = kiln_add(kiln_mul_scalar(running_mean, 1 - momentum), kiln_mul_scalar(bm, momentum));
            kiln_tensor *nv = kiln_add(kiln_mul_scalar(running_var, 1 - momentum), kiln_mul_scalar(bv, momentum));
            int urc = (!nm || !nv || kiln__copy_into(running_mean, nm, op) < 0 ||
                       kiln__copy_into(running_var, nv, op) < 0) ? -1 : 0;
            kiln_no_grad_end();
            if (urc < 0) {
                if (one_node)
                    kiln_no_grad_end();
                kiln_scope_end();
                return NULL;
            }
        }
    } else {
        mean = per_channel(running_mean, x->ndim, st);
        var = per_channel(running_var, x->ndim, st);
    }
    /* (x - mean) (rstd w) + b: the per-channel factors combine first, three passes over
     * the activation instead of four */
    kiln_tensor *rstd = kiln_rsqrt(kiln_add_scalar(var, eps)), *scale = rstd;
    if (weight)
        scale = kiln_mul(rstd, per_channel(weight, x->ndim, st));
    kiln_tensor *y = kiln_mul(kiln_sub(cx, mean), scale);
    if (bias)
        y = kiln_add(y, per_channel(bias, x->ndim, st));
    y = kiln_cast(y, dt);
    if (one_node) {
        kiln_no_grad_end();
        if (y && mean && rstd)
            y = kiln__grad_batch_norm(y, x, weight, bias, mean, rstd);
    }
    return kiln__scope_end_keep(y);
}

kiln_tensor *kiln_group_norm(kiln_tensor *x, int64_t groups, kiln_tensor *weight, kiln_tensor *bias,
                             double eps)
{
    if (!x)
        return NULL;
    const char *op = "group_norm";
    char dx[200], dp[200];
    if (x->ndim < 2 || groups < 1 || x->shape[1] % groups != 0) {
        kiln__error_set("%s: input %s must be [N, C, ...] with C divisible by groups %lld", op,
                        kiln__describe(x, dx, sizeof dx), (long long)groups);
        return NULL;
    }
    int64_t C = x->shape[1];
    kiln_tensor *params[2] = {weight, bias};
    for (int k = 0; k < 2; k++) {
        if (!params[k])
            continue;
        if (kiln__same_device(x, params[k], op) < 0)
            return NULL;
        if (params[k]->ndim != 1 || params[k]->shape[0] != C) {
            kiln__error_set("%s: %s %s must be [%lld]", op, k ? "bias" : "weight",
                            kiln__describe(params[k], dp, sizeof dp), (long long)C);
            return NULL;
        }
    }
    kiln_dtype dt = kiln_dtype_is_float(x->dtype) ? x->dtype : KILN_F32;
    kiln_dtype st = stats_dtype(dt);
    kiln_scope_begin();
    kiln_tensor *cx = kiln_cast(x, st);
    int64_t inner = C / groups;
    for (int i = 2; i < x->ndim; i++)
        inner *= x->shape[i];
    kiln_tensor *g = kiln_reshape(cx, KILN_SHAPE(x->shape[0], groups, inner));
    kiln_tensor *mean = kiln_mean(g, KILN_DIMS(2), true);
    kiln_tensor *var = kiln_var(g, KILN_DIMS(2), 0, true);
    kiln_tensor *n = kiln_mul(kiln_sub(g, mean), kiln_rsqrt(kiln_add_scalar(var, eps)));
    kiln_tensor *y = kiln_reshape(n, x->ndim, x->shape);
    if (weight)
        y = kiln_mul(y, per_channel(weight, x->ndim, st));
    if (bias)
        y = kiln_add(y, per_channel(bias, x->ndim, st));
    return kiln__scope_end_keep(kiln_cast(y, dt));
}

/* ------------------------------------------------------------------- dropout */

kiln_tensor *kiln_dropout(kiln_tensor *x, double p, bool training, kiln_generator *gen)
{
    if (!x)
        return NULL;
    if (!(p >= 0 && p <= 1)) {
        kiln__error_set("dropout: p %g must lie in [0, 1]", p);
        return NULL;
    }
    if (!training || p == 0)
        return kiln__ret(kiln_tensor_retain(x));
    if (p == 1) /* x * 0, as PyTorch: zeros that keep the graph (a zero gradient, NaN for inf) */
        return kiln_mul_scalar(x, 0.0);
    kiln_dtype dt = kiln_dtype_is_float(x->dtype) ? x->dtype : KILN_F32;
    kiln_scope_begin();
    kiln_tensor *mask = kiln_rand_bernoulli(kiln__dev(x), dt, x->ndim, x->shape, 1 - p, gen);
    kiln_tensor *y = kiln_mul_scalar(kiln_mul(x, mask), 1.0 / (1.0 - p));
    return kiln__scope_end_keep(y);
}

/* ----------------------------------------------------------------- attention */

kiln_tensor *kiln_scaled_dot_product_attention(kiln_tensor *q, kiln_tensor *k, kiln_tensor *v,
                                               kiln_tensor *mask, bool causal, double scale)
{
    if (!q || !k || !v)
        return NULL;
    const char *op = "scaled_dot_product_attention";
    char dq[200], dk[200], dv[200];
    if (q->ndim < 2 || k->ndim < 2 || v->ndim < 2 || q->shape[q->ndim - 1] != k->shape[k->ndim - 1] ||
        k->shape[k->ndim - 2] != v->shape[v->ndim - 2]) {
        kiln__error_set("%s: q %s, k %s, v %s must be [..., L, D], [..., S, D], [..., S, Dv]", op,
                        kiln__describe(q, dq, sizeof dq), kiln__describe(k, dk, sizeof dk),
                        kiln__describe(v, dv, sizeof dv));
        return NULL;
    }
    if (mask && mask->dtype != KILN_BOOL && !kiln_dtype_is_float(mask->dtype)) {
        kiln__error_set("%s: mask must be bool or floating, got %s", op, kiln__describe(mask, dq, sizeof dq));
        return NULL;
    }
    int64_t D = q->shape[q->ndim - 1];
    int64_t L = q->shape[q->ndim - 2], S = k->shape[k->ndim - 2];
    if (scale <= 0)
        scale = D > 0 ? 1.0 / sqrt((double)D) : 1.0;
    kiln_scope_begin();
    kiln_tensor *qf = kiln_dtype_is_float(q->dtype) ? q : kiln_cast(q, KILN_F32);
    kiln_tensor *scores = kiln_mul_scalar(kiln_matmul(qf, kiln_transpose(k, -2, -1)), scale);
    if (causal) {
        kiln_tensor *keep = kiln_tril(kiln_ones(kiln__dev(q), KILN_BOOL, KILN_SHAPE(L, S)), 0);
        scores = kiln_masked_fill(scores, kiln_logical_not(keep), -INFINITY);
    }
    if (mask) {
        if (mask->dtype == KILN_BOOL) {
            /* The mask may carry batch dims scores lack: broadcast both first. */
            int64_t s[KILN_MAX_DIMS];
            int n = scores ? kiln__broadcast_shape(scores->ndim, scores->shape, mask->ndim, mask->shape, s, op,
                                                   scores, mask)
                           : -1;
            kiln_tensor *full = n >= 0 ? kiln_expand(scores, n, s) : NULL;
            scores = kiln_masked_fill(full, kiln_logical_not(mask), -INFINITY);
        } else {
            /* in the scores' dtype: an f32 mask must not promote f16 attention to f32 */
            scores = kiln_add(scores, scores ? kiln_cast(mask, scores->dtype) : NULL);
        }
    }
    kiln_tensor *attn = kiln_softmax(scores, -1);
    kiln_tensor *out = kiln_matmul(attn, v);
    return kiln__scope_end_keep(out);
}
