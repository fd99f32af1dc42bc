/*
 * backends/cuda/cuda-ops.c — the primitive entries that run kiln's own kernels: each
 * checks what the kernels cannot express (the same refusals as the ref backend), turns
 * its descriptors into device views and queues one launch (cuda-kernels.h) on the queue's
 * stream, naming the op in any error.
 *
 * Index checks park on the queue: each check gets a slot in device memory, which the
 * kernel sets on the first violation; the next sync or download reads every slot at once
 * and reports the first violation with kiln__index_error's message.
 */
#include <string.h>

#include "cuda-impl.h"

static bool is_float(kiln_dtype dt)
{
    return dt == KILN_F32 || dt == KILN_F64 || dt == KILN_F16 || dt == KILN_BF16;
}

static const char *dtype_name(kiln_dtype dt)
{
    static const char *const names[KILN_DTYPE_COUNT] = {"f32", "f64", "f16", "bf16", "i64", "i32", "u8", "bool"};
    return (unsigned)dt < KILN_DTYPE_COUNT ? names[dt] : "?";
}

#define ENTER(q, op)                                                                                              \
    kiln_cuda_queue *q = vq;                                                                                      \
    do {                                                                                                          \
        int rc_ = kiln__cuda_enter(q->dev, op);                                                                   \
        if (rc_)                                                                                                  \
            return rc_;                                                                                           \
    } while (0)

int kiln__cuda_fill(void *vq, const kiln_tdesc *out, double value)
{
    ENTER(q, "fill");
    kcu_view o = kiln__cuda_view(out);
    return kiln__cuda_check(q, kcu_fill(q->stream, &o, value), "fill");
}

int kiln__cuda_arange(void *vq, const kiln_tdesc *out, double start, double step)
{
    ENTER(q, "arange");
    kcu_view o = kiln__cuda_view(out);
    return kiln__cuda_check(q, kcu_arange(q->stream, &o, start, step), "arange");
}

int kiln__cuda_copy(void *vq, const kiln_tdesc *out, const kiln_tdesc *in)
{
    ENTER(q, "copy");
    kcu_view o = kiln__cuda_view(out), i = kiln__cuda_view(in);
    return kiln__cuda_check(q, kcu_copy(q->stream, &o, &i), "copy");
}

int kiln__cuda_rng(void *vq, kiln_rng_kind kind, const kiln_tdesc *out, uint64_t seed, uint64_t offset, double p0,
                   double p1)
{
    ENTER(q, "rng");
    if ((unsigned)kind >= KILN_RNG_COUNT)
        return kiln__error_set("rng on %s: unknown kind %d", q->dev->name, (int)kind), KILN_EINVAL;
    if (kind == KILN_RNG_INT) {
        if (!(p0 >= -9007199254740992.0 && p1 <= 9007199254740992.0) || (int64_t)p1 <= (int64_t)p0)
            return kiln__error_set("rng on %s: empty or invalid integer range [%g, %g)", q->dev->name, p0, p1),
                   KILN_EINVAL;
    }
    kcu_view o = kiln__cuda_view(out);
    return kiln__cuda_check(q, kcu_rng(q->stream, (int)kind, &o, seed, offset, p0, p1), "rng");
}

/* Unary ops with an integer formula (ref-elementwise.c's unary_has_int). */
static bool unary_has_int(kiln_unary_op op, double alpha)
{
    switch (op) {
    case KILN_UNARY_NEG:
    case KILN_UNARY_ABS:
    case KILN_UNARY_SIGN:
    case KILN_UNARY_SQUARE:
    case KILN_UNARY_RELU:
    case KILN_UNARY_CLAMP:
    case KILN_UNARY_FLOOR:
    case KILN_UNARY_CEIL:
    case KILN_UNARY_ROUND:
    case KILN_UNARY_ADD_SCALAR:
    case KILN_UNARY_MUL_SCALAR: return true;
    case KILN_UNARY_POW_SCALAR: return alpha == (double)(int64_t)alpha && alpha > -9.0e15 && alpha < 9.0e15;
    default: return false;
    }
}

int kiln__cuda_unary(void *vq, kiln_unary_op op, const kiln_tdesc *out, const kiln_tdesc *in, double alpha,
                     double beta)
{
    ENTER(q, "unary");
    if ((unsigned)op >= KILN_UNARY_COUNT)
        return kiln__error_set("unary on %s: unknown op %d", q->dev->name, (int)op), KILN_EINVAL;
    bool predicate = op == KILN_UNARY_ISNAN || op == KILN_UNARY_ISINF || op == KILN_UNARY_LOGICAL_NOT;
    bool bool_sign = op == KILN_UNARY_SIGN && in->dtype == KILN_BOOL && out->dtype == KILN_BOOL;
    if (!predicate && !is_float(out->dtype) && !bool_sign &&
        (out->dtype == KILN_BOOL || is_float(in->dtype) || !unary_has_int(op, alpha)))
        return kiln__error_set_code(KILN_ENOTSUP, "unary on %s: %s is not supported from %s to %s", q->dev->name,
                                    kiln__unary_name(op), dtype_name(in->dtype), dtype_name(out->dtype));
    if (op == KILN_UNARY_POW_SCALAR && !is_float(out->dtype) && alpha < 0)
        return kiln__error_set("unary on %s: integers to negative integer powers are not allowed (%s)",
                               q->dev->name, dtype_name(out->dtype)),
               KILN_ENOTSUP;
    kcu_view o = kiln__cuda_view(out), i = kiln__cuda_view(in);
    return kiln__cuda_check(q, kcu_unary(q->stream, (int)op, &o, &i, alpha, beta), "unary");
}

int kiln__cuda_binary(void *vq, kiln_binary_op op, const kiln_tdesc *out, const kiln_tdesc *a, const kiln_tdesc *b)
{
    ENTER(q, "binary");
    if ((unsigned)op >= KILN_BINARY_COUNT)
        return kiln__error_set("binary on %s: unknown op %d", q->dev->name, (int)op), KILN_EINVAL;
    bool cmp_or_logic = op >= KILN_BINARY_EQ;
    if (!cmp_or_logic && out->dtype == KILN_BOOL &&
        !(op == KILN_BINARY_ADD || op == KILN_BINARY_MUL || op == KILN_BINARY_MAXIMUM ||
          op == KILN_BINARY_MINIMUM))
        return kiln__error_set_code(KILN_ENOTSUP, "binary on %s: %s is not defined for bool", q->dev->name,
                                    kiln__binary_name(op));
    kcu_view o = kiln__cuda_view(out), x = kiln__cuda_view(a), y = kiln__cuda_view(b);
    return kiln__cuda_check(q, kcu_binary(q->stream, (int)op, &o, &x, &y), "binary");
}

int kiln__cuda_where(void *vq, const kiln_tdesc *out, const kiln_tdesc *cond, const kiln_tdesc *a,
                     const kiln_tdesc *b)
{
    ENTER(q, "where");
    kcu_view o = kiln__cuda_view(out), c = kiln__cuda_view(cond), x = kiln__cuda_view(a), y = kiln__cuda_view(b);
    return kiln__cuda_check(q, kcu_where(q->stream, &o, &c, &x, &y), "where");
}

int kiln__cuda_reduce(void *vq, kiln_reduce_op op, const kiln_tdesc *out, const kiln_tdesc *in, uint32_t mask,
                      double param)
{
    ENTER(q, "reduce");
    if ((unsigned)op >= KILN_REDUCE_COUNT)
        return kiln__error_set("reduce on %s: unknown op %d", q->dev->name, (int)op), KILN_EINVAL;
    int64_t rn = 1;
    for (int d = 0; d < in->ndim; d++)
        if ((mask >> d) & 1u)
            rn *= in->shape[d];
    if (rn == 0 && (op == KILN_REDUCE_MAX || op == KILN_REDUCE_MIN))
        return kiln__error_set("reduce on %s: max/min over an empty dimension", q->dev->name), KILN_EINVAL;
    kcu_view o = kiln__cuda_view(out), i = kiln__cuda_view(in);
    /* few outputs of long reductions share each output among blocks: scratch for their partial
     * sums, back to the allocator in stream order once queued (kcu_reduce_splits) */
    int64_t splits = kcu_reduce_splits((int)op, &o, &i, mask);
    kiln_cuda_block *scratch = NULL;
    if (splits > 1) {
        int64_t nout = 1;
        for (int d = 0; d < out->ndim; d++)
            nout *= out->shape[d];
        bool oom = false;
        scratch = kiln__cuda_alloc_get(&q->dev->alloc, q->stream, (size_t)(nout * splits) * sizeof(double), &oom);
        if (!scratch)
            (void)cudaGetLastError(); /* without scratch the one-block path runs */
    }
    int rc = kiln__cuda_check(
        q, kcu_reduce(q->stream, (int)op, &o, &i, mask, param, scratch ? scratch->ptr : NULL), "reduce");
    if (scratch)
        kiln__cuda_alloc_put(&q->dev->alloc, q->stream, scratch);
    return rc;
}

/* A 0-d operand along "dim 0": lanes of one element. */
static kcu_view lane_view(const kiln_tdesc *t)
{
    kcu_view v = kiln__cuda_view(t);
    if (v.ndim == 0) {
        v.ndim = 1;
        v.shape[0] = 1;
        v.strides[0] = 1;
    }
    return v;
}

/* How many lanes run along dim (every dim's size but dim's). */
static int64_t lane_count(const kcu_view *v, int dim)
{
    int64_t n = 1;
    for (int d = 0; d < v->ndim; d++)
        if (d != dim)
            n *= v->shape[d];
    return n;
}

int kiln__cuda_arg_reduce(void *vq, bool is_max, const kiln_tdesc *out, const kiln_tdesc *in, int dim)
{
    ENTER(q, "arg_reduce");
    kcu_view o = lane_view(out), i = lane_view(in);
    if (i.shape[dim] == 0 && lane_count(&i, dim) > 0)
        return kiln__error_set("arg_reduce on %s: empty dimension %d", q->dev->name, dim), KILN_EINVAL;
    return kiln__cuda_check(q, kcu_arg_reduce(q->stream, is_max, &o, &i, dim), "arg_reduce");
}

int kiln__cuda_cumsum(void *vq, const kiln_tdesc *out, const kiln_tdesc *in, int dim)
{
    ENTER(q, "cumsum");
    kcu_view o = lane_view(out), i = lane_view(in);
    return kiln__cuda_check(q, kcu_cumsum(q->stream, &o, &i, dim), "cumsum");
}

int kiln__cuda_sort(void *vq, const kiln_tdesc *values, const kiln_tdesc *indices, const kiln_tdesc *in, int dim,
                    bool descending)
{
    ENTER(q, "sort");
    kcu_view v = lane_view(values), x = lane_view(indices), i = lane_view(in);
    return kiln__cuda_check(q, kcu_sort(q->stream, &v, &x, &i, dim, descending), "sort");
}

/* ------------------------------------------------------------ index checks */

/* The queue's own slots, then those of the graphs launched since the last report (in
 * launch order), all read after one wait. */
int kiln__cuda_checks_report(kiln_cuda_queue *q)
{
    if (q->kept) {
        q->kept = false;
        return kiln__index_error(q->kept_check.op, q->kept_check.noun, q->kept_value, q->kept_check.lo,
                                 q->kept_check.hi);
    }
    if (q->nchecks == 0 && q->npending == 0)
        return 0;
    kcu_index_flag flags[KILN_CUDA_CHECK_SLOTS];
    kcu_index_flag gflags[KILN_CUDA_PENDING_GRAPHS][KILN_CUDA_CHECK_SLOTS];
    int n = q->nchecks, ng = q->npending;
    q->nchecks = 0;
    q->npending = 0;
    cudaError_t e = cudaSuccess;
    if (n)
        e = cudaMemcpyAsync(flags, q->check_blk->ptr, (size_t)n * sizeof *flags, cudaMemcpyDeviceToHost,
                            q->stream);
    for (int k = 0; k < ng && e == cudaSuccess; k++)
        e = cudaMemcpyAsync(gflags[k], q->pending[k]->check_blk->ptr,
                            (size_t)q->pending[k]->nchecks * sizeof *flags, cudaMemcpyDeviceToHost, q->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(q->stream);
    if (e == cudaSuccess && n)
        e = cudaMemsetAsync(q->check_blk->ptr, 0, (size_t)n * sizeof *flags, q->stream);
    for (int k = 0; k < ng; k++)
        q->pending[k]->pending = false;
    if (e != cudaSuccess)
        return kiln__cuda_fail(q->dev, e, "index check (reading its result)");
    for (int i = 0; i < n; i++)
        if (flags[i].flag)
            return kiln__index_error(q->checks[i].op, q->checks[i].noun, flags[i].value, q->checks[i].lo,
                                     q->checks[i].hi);
    for (int k = 0; k < ng; k++)
        for (int i = 0; i < q->pending[k]->nchecks; i++)
            if (gflags[k][i].flag) {
                const kiln_cuda_check_slot *c = &q->pending[k]->checks[i];
                return kiln__index_error(c->op, c->noun, gflags[k][i].value, c->lo, c->hi);
            }
    return 0;
}

int kiln__cuda_index_check(void *vq, const kiln_tdesc *index, int64_t lo, int64_t hi, const char *op,
                           const char *noun)
{
    ENTER(q, "index_check");
    if (q->recording) /* the graph's own slots, read after each launch */
        return kiln__cuda_graph_index_check(q, index, lo, hi, op, noun);
    if (!q->check_blk) {
        bool oom = false;
        size_t bytes = KILN_CUDA_CHECK_SLOTS * sizeof(kcu_index_flag);
        q->check_blk = kiln__cuda_alloc_get(&q->dev->alloc, q->stream, bytes, &oom);
        if (!q->check_blk)
            return oom ? kiln__error_set_code(KILN_ENOMEM, "%s on %s: out of device memory for index checks", op,
                                              q->dev->name)
                       : KILN_EDEVICE;
        int rc = kiln__cuda_check(q, cudaMemsetAsync(q->check_blk->ptr, 0, bytes, q->stream), "index_check");
        if (rc)
            return rc;
    }
    if (q->nchecks == KILN_CUDA_CHECK_SLOTS) {
        /* every slot is parked: read them now (a wait, once per 64 unsynced checks) */
        int rc = kiln__cuda_checks_report(q);
        if (rc)
            return rc;
    }
    int slot = q->nchecks++;
    q->checks[slot] = (kiln_cuda_check_slot){.op = op, .noun = noun, .lo = lo, .hi = hi};
    kcu_view v = kiln__cuda_view(index);
    kcu_index_flag *flags = q->check_blk->ptr;
    return kiln__cuda_check(q, kcu_index_check(q->stream, &v, lo, hi, flags + slot), op);
}

int kiln__cuda_gather(void *vq, const kiln_tdesc *out, const kiln_tdesc *in, int dim, const kiln_tdesc *index)
{
    ENTER(q, "gather");
    kcu_view o = lane_view(out), i = lane_view(in), x = lane_view(index);
    return kiln__cuda_check(q, kcu_gather(q->stream, &o, &i, dim, &x), "gather");
}

int kiln__cuda_scatter(void *vq, const kiln_tdesc *out, int dim, const kiln_tdesc *index, const kiln_tdesc *src,
                       bool accumulate)
{
    ENTER(q, "scatter");
    kcu_view o = lane_view(out), x = lane_view(index), s = lane_view(src);
    return kiln__cuda_check(q, kcu_scatter(q->stream, &o, dim, &x, &s, accumulate), "scatter");
}

int kiln__cuda_index_select(void *vq, const kiln_tdesc *out, const kiln_tdesc *in, int dim,
                            const kiln_tdesc *index)
{
    ENTER(q, "index_select");
    kcu_view o = lane_view(out), i = lane_view(in), x = lane_view(index);
    return kiln__cuda_check(q, kcu_index_select(q->stream, &o, &i, dim, &x), "index_select");
}

int kiln__cuda_index_add(void *vq, const kiln_tdesc *out, int dim, const kiln_tdesc *index, const kiln_tdesc *src)
{
    ENTER(q, "index_add");
    kcu_view o = lane_view(out), x = lane_view(index), s = lane_view(src);
    return kiln__cuda_check(q, kcu_index_add(q->stream, &o, dim, &x, &s), "index_add");
}

int kiln__cuda_pad(void *vq, kiln_pad_mode mode, const kiln_tdesc *out, const kiln_tdesc *in, const int64_t *pads,
                   double value)
{
    ENTER(q, "pad");
    if (mode != KILN_PAD_CONSTANT && mode != KILN_PAD_REFLECT && mode != KILN_PAD_REPLICATE)
        return kiln__error_set("pad on %s: unknown mode %d", q->dev->name, (int)mode), KILN_EINVAL;
    for (int d = 0; d < in->ndim; d++) {
        if (mode == KILN_PAD_REFLECT && (pads[2 * d] != 0 || pads[2 * d + 1] != 0) &&
            (pads[2 * d] >= in->shape[d] || pads[2 * d + 1] >= in->shape[d]))
            return kiln__error_set("pad on %s: reflect padding of dim %d must be below its size %lld",
                                   q->dev->name, d, (long long)in->shape[d]),
                   KILN_EINVAL;
        if (mode == KILN_PAD_REPLICATE && in->shape[d] == 0 && out->shape[d] > 0)
            return kiln__error_set("pad on %s: cannot replicate an empty dim %d", q->dev->name, d), KILN_EINVAL;
    }
    kcu_view o = kiln__cuda_view(out), i = kiln__cuda_view(in);
    return kiln__cuda_check(q, kcu_pad(q->stream, (int)mode, &o, &i, pads, value), "pad");
}

/* ------------------------------------------------------------- fused rows */

int kiln__cuda_softmax(void *vq, bool log, const kiln_tdesc *out, const kiln_tdesc *in, int dim)
{
    ENTER(q, "softmax");
    kcu_view o = lane_view(out), i = lane_view(in);
    return kiln__cuda_check(q, kcu_softmax(q->stream, log, &o, &i, dim), log ? "log_softmax" : "softmax");
}

int kiln__cuda_layer_norm(void *vq, const kiln_tdesc *out, const kiln_tdesc *mean, const kiln_tdesc *rstd,
                          const kiln_tdesc *x, const kiln_tdesc *weight, const kiln_tdesc *bias, int64_t inner,
                          double eps)
{
    ENTER(q, "layer_norm");
    kcu_view o = kiln__cuda_view(out), m = kiln__cuda_view_opt(mean), r = kiln__cuda_view_opt(rstd);
    kcu_view xv = kiln__cuda_view(x), w = kiln__cuda_view_opt(weight), b = kiln__cuda_view_opt(bias);
    return kiln__cuda_check(q, kcu_layer_norm(q->stream, &o, &m, &r, &xv, &w, &b, inner, eps), "layer_norm");
}

int kiln__cuda_epilogue(void *vq, const kiln_tdesc *out, const kiln_epilogue *ep)
{
    ENTER(q, "epilogue");
    if ((unsigned)ep->act >= KILN_EPI_COUNT)
        return kiln__error_set("epilogue on %s: unknown activation %d", q->dev->name, (int)ep->act), KILN_EINVAL;
    kcu_view o = kiln__cuda_view(out), b = kiln__cuda_view_opt(ep->bias), r = kiln__cuda_view_opt(ep->residual);
    int64_t ncols = out->ndim ? out->shape[out->ndim - 1] : 1;
    return kiln__cuda_check(q, kcu_epilogue(q->stream, &o, ncols, &b, &r, (int)ep->act, ep->alpha, ep->beta),
                            "epilogue");
}

int kiln__cuda_adam_step(void *vq, const kiln_adam_params *p, const kiln_tdesc *param, const kiln_tdesc *grad,
                         const kiln_tdesc *exp_avg, const kiln_tdesc *exp_avg_sq, const kiln_tdesc *max_exp_avg_sq)
{
    ENTER(q, "adam_step");
    if (!is_float(param->dtype))
        return kiln__error_set("adam_step on %s: %s parameters are not supported", q->dev->name,
                               dtype_name(param->dtype)),
               KILN_ENOTSUP;
    int64_t n = 1;
    for (int d = 0; d < param->ndim; d++)
        n *= param->shape[d];
    void *vmax = p->amsgrad && max_exp_avg_sq ? kiln__cuda_ptr(max_exp_avg_sq) : NULL;
    if (p->amsgrad && !vmax)
        return kiln__error_set("adam_step on %s: amsgrad needs max_exp_avg_sq", q->dev->name), KILN_EINVAL;
    return kiln__cuda_check(q,
                            kcu_adam(q->stream, (int)param->dtype, n, kiln__cuda_ptr(param), kiln__cuda_ptr(grad),
                                     kiln__cuda_ptr(exp_avg), kiln__cuda_ptr(exp_avg_sq), vmax, p->beta1, p->beta2,
                                     p->eps, p->weight_decay, p->param_scale, p->step_size, p->inv_bc2_sqrt,
                                     p->decoupled, p->amsgrad, p->maximize),
                            "adam_step");
}

/* ------------------------------------------------------------------ pooling */

static int pool_params(kiln_cuda_queue *q, const char *op, int nspatial, kiln_dtype dt, const kiln_tdesc *x)
{
    if (nspatial < 1 || nspatial > 3 || x->ndim < nspatial)
        return kiln__error_set("%s on %s: %d spatial dims over a %d-d tensor", op, q->dev->name, nspatial,
                               x->ndim),
               KILN_EINVAL;
    if (!is_float(dt))
        return kiln__error_set("%s on %s: %s is not supported (floating dtypes are)", op, q->dev->name,
                               dtype_name(dt)),
               KILN_ENOTSUP;
    return 0;
}

static kcu_pool_params pool_geometry(const kiln_pool_params *p)
{
    kcu_pool_params g;
    memset(&g, 0, sizeof g);
    g.nspatial = p->nspatial;
    g.kind = p->kind == KILN_POOL_MAX ? 0 : 1;
    for (int i = 0; i < 3; i++) {
        g.kernel[i] = p->kernel[i];
        g.stride[i] = p->stride[i];
        g.padding[i] = p->padding[i];
        g.dilation[i] = p->dilation[i] > 0 ? p->dilation[i] : 1;
    }
    g.count_include_pad = p->count_include_pad;
    return g;
}

int kiln__cuda_pool(void *vq, const kiln_pool_params *p, const kiln_tdesc *out, const kiln_tdesc *indices,
                    const kiln_tdesc *x)
{
    ENTER(q, "pool");
    int rc = pool_params(q, "pool", p->nspatial, x->dtype, x);
    if (rc)
        return rc;
    if (p->kind != KILN_POOL_MAX && p->kind != KILN_POOL_AVG)
        return kiln__error_set("pool on %s: unknown kind %d", q->dev->name, (int)p->kind), KILN_EINVAL;
    kcu_pool_params g = pool_geometry(p);
    kcu_view o = kiln__cuda_view(out), xv = kiln__cuda_view(x);
    kcu_view iv = kiln__cuda_view_opt(p->kind == KILN_POOL_MAX ? indices : NULL);
    return kiln__cuda_check(q, kcu_pool(q->stream, &g, &o, &iv, &xv), "pool");
}

int kiln__cuda_pool_backward(void *vq, const kiln_pool_params *p, const kiln_tdesc *grad_x,
                             const kiln_tdesc *grad_out, const kiln_tdesc *indices)
{
    ENTER(q, "pool_backward");
    int rc = pool_params(q, "pool_backward", p->nspatial, grad_x->dtype, grad_x);
    if (rc)
        return rc;
    if (p->kind == KILN_POOL_MAX && !indices)
        return kiln__error_set("pool_backward on %s: max pooling needs indices", q->dev->name), KILN_EINVAL;
    kcu_pool_params g = pool_geometry(p);
    kcu_view gx = kiln__cuda_view(grad_x), gy = kiln__cuda_view(grad_out);
    kcu_view iv = kiln__cuda_view_opt(p->kind == KILN_POOL_MAX ? indices : NULL);
    return kiln__cuda_check(q, kcu_pool_backward(q->stream, &g, &gx, &gy, &iv), "pool_backward");
}

int kiln__cuda_adaptive_avg_pool(void *vq, int nspatial, const kiln_tdesc *out, const kiln_tdesc *x)
{
    ENTER(q, "adaptive_avg_pool");
    int rc = pool_params(q, "adaptive_avg_pool", nspatial, x->dtype, x);
    if (rc)
        return rc;
    kcu_view o = kiln__cuda_view(out), xv = kiln__cuda_view(x);
    return kiln__cuda_check(q, kcu_adaptive_avg_pool(q->stream, nspatial, &o, &xv), "adaptive_avg_pool");
}

int kiln__cuda_adaptive_avg_pool_backward(void *vq, int nspatial, const kiln_tdesc *grad_x,
                                          const kiln_tdesc *grad_out)
{
    ENTER(q, "adaptive_avg_pool_backward");
    int rc = pool_params(q, "adaptive_avg_pool_backward", nspatial, grad_x->dtype, grad_x);
    if (rc)
        return rc;
    kcu_view gx = kiln__cuda_view(grad_x), gy = kiln__cuda_view(grad_out);
    return kiln__cuda_check(q, kcu_adaptive_avg_pool_backward(q->stream, nspatial, &gx, &gy),
                            "adaptive_avg_pool_backward");
}

/* ------------------------------------------------------------ interpolation */

static int interp_check(kiln_cuda_queue *q, const char *op, kiln_interp_mode mode, const kiln_tdesc *x)
{
    if (mode != KILN_INTERP_NEAREST && mode != KILN_INTERP_BILINEAR)
        return kiln__error_set("%s on %s: unknown mode %d", op, q->dev->name, (int)mode), KILN_EINVAL;
    if (x->ndim < 3 || x->ndim > 5)
        return kiln__error_set("%s on %s: expected [N, C, S...] with 1 to 3 spatial dims, got %d dims", op,
                               q->dev->name, x->ndim),
               KILN_EINVAL;
    return pool_params(q, op, x->ndim - 2, x->dtype, x);
}

int kiln__cuda_interpolate(void *vq, kiln_interp_mode mode, bool align_corners, const kiln_tdesc *out,
                           const kiln_tdesc *x)
{
    ENTER(q, "interpolate");
    int rc = interp_check(q, "interpolate", mode, x);
    if (rc)
        return rc;
    kcu_view o = kiln__cuda_view(out), xv = kiln__cuda_view(x);
    return kiln__cuda_check(
        q, kcu_interpolate(q->stream, mode == KILN_INTERP_NEAREST ? 0 : 1, align_corners, &o, &xv), "interpolate");
}

int kiln__cuda_interpolate_backward(void *vq, kiln_interp_mode mode, bool align_corners, const kiln_tdesc *grad_x,
                                    const kiln_tdesc *grad_out)
{
    ENTER(q, "interpolate_backward");
    int rc = interp_check(q, "interpolate_backward", mode, grad_x);
    if (rc)
        return rc;
    kcu_view gx = kiln__cuda_view(grad_x), gy = kiln__cuda_view(grad_out);
    return kiln__cuda_check(
        q, kcu_interpolate_backward(q->stream, mode == KILN_INTERP_NEAREST ? 0 : 1, align_corners, &gx, &gy),
        "interpolate_backward");
}
