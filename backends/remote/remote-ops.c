/*
 * backends/remote/remote-ops.c — the remote backend's primitives and its interface table.
 *
 * Each primitive (fill, unary, matmul, conv, ...) is encoded as one OP message naming its tensors
 * by buffer id, offset, shape and strides, with its scalar parameters, and handed to
 * kiln__remote_submit (remote.c), which appends it to the device's batch without waiting: the
 * op's own errors come back later and are reported by the next download or sync. The table at
 * the end joins these entries with remote.c's device, buffer, sync and event entries.
 */
#include <stdint.h>
#include <string.h>

#include "backend.h"
#include "remote-impl.h"
#include "wire.h"

/* ---- encoding ------------------------------------------------------------------------------------- */
static void td(kiln_wire_op *op, const kiln_tdesc *t)
{
    kiln_wire_td *w = &op->td[op->ntd++];
    if (!t || !t->buf) {
        memset(w, 0, sizeof *w);
        return;
    }
    w->id = t->buf->id;
    w->offset = t->offset;
    w->dtype = t->dtype;
    w->ndim = t->ndim;
    for (int i = 0; i < t->ndim; i++) {
        w->shape[i] = t->shape[i];
        w->strides[i] = t->strides[i];
    }
}

static void fparam(kiln_wire_op *op, double v)
{
    op->f[op->nf++] = v;
}

static void iparam(kiln_wire_op *op, int64_t v)
{
    op->i[op->ni++] = v;
}

/* ---- primitives ----------------------------------------------------------------------------------- */

#define OP_BEGIN(primv, subv)                                                                                     \
    kiln_wire_msg m_ = {.h = {.type = KILN_WIRE_OP}};                                                             \
    kiln_wire_op *op = &m_.u.op;                                                                                  \
    op->prim = (primv);                                                                                           \
    op->sub = (uint32_t)(subv)
#define OP_END(ctx) return kiln__remote_submit((ctx), &m_)

static int remote_fill(void *ctx, const kiln_tdesc *out, double value)
{
    OP_BEGIN(KILN_WIRE_P_FILL, 0);
    td(op, out);
    fparam(op, value);
    OP_END(ctx);
}

static int remote_arange(void *ctx, const kiln_tdesc *out, double start, double step)
{
    OP_BEGIN(KILN_WIRE_P_ARANGE, 0);
    td(op, out);
    fparam(op, start);
    fparam(op, step);
    OP_END(ctx);
}

static int remote_copy(void *ctx, const kiln_tdesc *out, const kiln_tdesc *in)
{
    OP_BEGIN(KILN_WIRE_P_COPY, 0);
    td(op, out);
    td(op, in);
    OP_END(ctx);
}

static int remote_rng(void *ctx, kiln_rng_kind kind, const kiln_tdesc *out, uint64_t seed, uint64_t offset,
                      double p0, double p1)
{
    OP_BEGIN(KILN_WIRE_P_RNG, kind);
    td(op, out);
    iparam(op, (int64_t)seed);
    iparam(op, (int64_t)offset);
    fparam(op, p0);
    fparam(op, p1);
    OP_END(ctx);
}

static int remote_unary(void *ctx, kiln_unary_op u, const kiln_tdesc *out, const kiln_tdesc *in, double alpha,
                        double beta)
{
    OP_BEGIN(KILN_WIRE_P_UNARY, u);
    td(op, out);
    td(op, in);
    fparam(op, alpha);
    fparam(op, beta);
    OP_END(ctx);
}

static int remote_binary(void *ctx, kiln_binary_op b, const kiln_tdesc *out, const kiln_tdesc *a,
                         const kiln_tdesc *bb)
{
    OP_BEGIN(KILN_WIRE_P_BINARY, b);
    td(op, out);
    td(op, a);
    td(op, bb);
    OP_END(ctx);
}

static int remote_where(void *ctx, const kiln_tdesc *out, const kiln_tdesc *cond, const kiln_tdesc *a,
                        const kiln_tdesc *b)
{
    OP_BEGIN(KILN_WIRE_P_WHERE, 0);
    td(op, out);
    td(op, cond);
    td(op, a);
    td(op, b);
    OP_END(ctx);
}

static int remote_reduce(void *ctx, kiln_reduce_op r, const kiln_tdesc *out, const kiln_tdesc *in, uint32_t mask,
                         double param)
{
    OP_BEGIN(KILN_WIRE_P_REDUCE, r);
    td(op, out);
    td(op, in);
    iparam(op, mask);
    fparam(op, param);
    OP_END(ctx);
}

static int remote_arg_reduce(void *ctx, bool is_max, const kiln_tdesc *out, const kiln_tdesc *in, int dim)
{
    OP_BEGIN(KILN_WIRE_P_ARG_REDUCE, 0);
    op->flags = is_max ? KILN_WIRE_OPF_IS_MAX : 0;
    td(op, out);
    td(op, in);
    iparam(op, dim);
    OP_END(ctx);
}

static int remote_cumsum(void *ctx, const kiln_tdesc *out, const kiln_tdesc *in, int dim)
{
    OP_BEGIN(KILN_WIRE_P_CUMSUM, 0);
    td(op, out);
    td(op, in);
    iparam(op, dim);
    OP_END(ctx);
}

static int remote_sort(void *ctx, const kiln_tdesc *values, const kiln_tdesc *indices, const kiln_tdesc *in,
                       int dim, bool descending)
{
    OP_BEGIN(KILN_WIRE_P_SORT, 0);
    op->flags = descending ? KILN_WIRE_OPF_DESCENDING : 0;
    td(op, values);
    td(op, indices);
    td(op, in);
    iparam(op, dim);
    OP_END(ctx);
}

/* gather, index_select: out, in, index; scatter, index_add: out, index, src. */
static int index_op(void *ctx, kiln_wire_prim prim, uint32_t flags, const kiln_tdesc *t0, const kiln_tdesc *t1,
                    const kiln_tdesc *t2, int dim)
{
    OP_BEGIN(prim, 0);
    op->flags = flags;
    td(op, t0);
    td(op, t1);
    td(op, t2);
    iparam(op, dim);
    OP_END(ctx);
}

static int remote_gather(void *ctx, const kiln_tdesc *out, const kiln_tdesc *in, int dim, const kiln_tdesc *index)
{
    return index_op(ctx, KILN_WIRE_P_GATHER, 0, out, in, index, dim);
}

static int remote_scatter(void *ctx, const kiln_tdesc *out, int dim, const kiln_tdesc *index,
                          const kiln_tdesc *src, bool accumulate)
{
    return index_op(ctx, KILN_WIRE_P_SCATTER, accumulate ? KILN_WIRE_OPF_ACCUMULATE : 0, out, index, src, dim);
}

static int remote_index_select(void *ctx, const kiln_tdesc *out, const kiln_tdesc *in, int dim,
                               const kiln_tdesc *index)
{
    return index_op(ctx, KILN_WIRE_P_INDEX_SELECT, 0, out, in, index, dim);
}

static int remote_index_add(void *ctx, const kiln_tdesc *out, int dim, const kiln_tdesc *index,
                            const kiln_tdesc *src)
{
    return index_op(ctx, KILN_WIRE_P_INDEX_ADD, 0, out, index, src, dim);
}

static int remote_matmul(void *ctx, const kiln_tdesc *out, const kiln_tdesc *a, const kiln_tdesc *b)
{
    OP_BEGIN(KILN_WIRE_P_MATMUL, 0);
    td(op, out);
    td(op, a);
    td(op, b);
    OP_END(ctx);
}

/* conv geometry: nspatial, stride[3], padding[3], dilation[3], groups */
static void conv_geom(kiln_wire_op *op, const kiln_conv_params *p)
{
    iparam(op, p->nspatial);
    for (int k = 0; k < 3; k++)
        iparam(op, p->stride[k]);
    for (int k = 0; k < 3; k++)
        iparam(op, p->padding[k]);
    for (int k = 0; k < 3; k++)
        iparam(op, p->dilation[k]);
    iparam(op, p->groups);
}

static int conv_op(void *ctx, kiln_wire_prim prim, const kiln_conv_params *p, const kiln_tdesc *t0,
                   const kiln_tdesc *t1, const kiln_tdesc *t2, const kiln_tdesc *t3, bool four)
{
    OP_BEGIN(prim, 0);
    td(op, t0);
    td(op, t1);
    td(op, t2);
    if (four)
        td(op, t3);
    conv_geom(op, p);
    OP_END(ctx);
}

static int remote_conv(void *ctx, const kiln_conv_params *p, const kiln_tdesc *out, const kiln_tdesc *x,
                       const kiln_tdesc *w, const kiln_tdesc *bias)
{
    return conv_op(ctx, KILN_WIRE_P_CONV, p, out, x, w, bias, true);
}

static int remote_conv_backward_input(void *ctx, const kiln_conv_params *p, const kiln_tdesc *grad_x,
                                      const kiln_tdesc *grad_out, const kiln_tdesc *w)
{
    return conv_op(ctx, KILN_WIRE_P_CONV_BWD_INPUT, p, grad_x, grad_out, w, NULL, false);
}

static int remote_conv_backward_weight(void *ctx, const kiln_conv_params *p, const kiln_tdesc *grad_w,
                                       const kiln_tdesc *x, const kiln_tdesc *grad_out)
{
    return conv_op(ctx, KILN_WIRE_P_CONV_BWD_WEIGHT, p, grad_w, x, grad_out, NULL, false);
}

/* pool geometry: nspatial, kernel[3], stride[3], padding[3], dilation[3]; kind in sub */
static int pool_op(void *ctx, kiln_wire_prim prim, const kiln_pool_params *p, const kiln_tdesc *t0,
                   const kiln_tdesc *t1, const kiln_tdesc *t2)
{
    OP_BEGIN(prim, p->kind);
    op->flags = p->count_include_pad ? KILN_WIRE_OPF_COUNT_PAD : 0;
    td(op, t0);
    td(op, t1);
    td(op, t2);
    iparam(op, p->nspatial);
    for (int k = 0; k < 3; k++)
        iparam(op, p->kernel[k]);
    for (int k = 0; k < 3; k++)
        iparam(op, p->stride[k]);
    for (int k = 0; k < 3; k++)
        iparam(op, p->padding[k]);
    for (int k = 0; k < 3; k++)
        iparam(op, p->dilation[k]);
    OP_END(ctx);
}

static int remote_pool(void *ctx, const kiln_pool_params *p, const kiln_tdesc *out, const kiln_tdesc *indices,
                       const kiln_tdesc *x)
{
    return pool_op(ctx, KILN_WIRE_P_POOL, p, out, indices, x);
}

static int remote_pool_backward(void *ctx, const kiln_pool_params *p, const kiln_tdesc *grad_x,
                                const kiln_tdesc *grad_out, const kiln_tdesc *indices)
{
    return pool_op(ctx, KILN_WIRE_P_POOL_BWD, p, grad_x, grad_out, indices);
}

static int remote_adaptive_avg_pool(void *ctx, int nspatial, const kiln_tdesc *out, const kiln_tdesc *x)
{
    OP_BEGIN(KILN_WIRE_P_ADAPTIVE_AVG_POOL, 0);
    td(op, out);
    td(op, x);
    iparam(op, nspatial);
    OP_END(ctx);
}

static int remote_adaptive_avg_pool_backward(void *ctx, int nspatial, const kiln_tdesc *grad_x,
                                             const kiln_tdesc *grad_out)
{
    OP_BEGIN(KILN_WIRE_P_ADAPTIVE_AVG_POOL_BWD, 0);
    td(op, grad_x);
    td(op, grad_out);
    iparam(op, nspatial);
    OP_END(ctx);
}

static int remote_interpolate(void *ctx, kiln_interp_mode mode, bool align_corners, const kiln_tdesc *out,
                              const kiln_tdesc *x)
{
    OP_BEGIN(KILN_WIRE_P_INTERPOLATE, mode);
    op->flags = align_corners ? KILN_WIRE_OPF_ALIGN_CORNERS : 0;
    td(op, out);
    td(op, x);
    OP_END(ctx);
}

static int remote_interpolate_backward(void *ctx, kiln_interp_mode mode, bool align_corners,
                                       const kiln_tdesc *grad_x, const kiln_tdesc *grad_out)
{
    OP_BEGIN(KILN_WIRE_P_INTERPOLATE_BWD, mode);
    op->flags = align_corners ? KILN_WIRE_OPF_ALIGN_CORNERS : 0;
    td(op, grad_x);
    td(op, grad_out);
    OP_END(ctx);
}

static int remote_pad(void *ctx, kiln_pad_mode mode, const kiln_tdesc *out, const kiln_tdesc *in,
                      const int64_t *pads, double value)
{
    OP_BEGIN(KILN_WIRE_P_PAD, mode);
    td(op, out);
    td(op, in);
    fparam(op, value);
    for (int k = 0; k < 2 * out->ndim; k++)
        iparam(op, pads[k]);
    OP_END(ctx);
}

static int remote_softmax(void *ctx, bool log, const kiln_tdesc *out, const kiln_tdesc *in, int dim)
{
    OP_BEGIN(KILN_WIRE_P_SOFTMAX, 0);
    op->flags = log ? KILN_WIRE_OPF_LOG : 0;
    td(op, out);
    td(op, in);
    iparam(op, dim);
    OP_END(ctx);
}

static int remote_layer_norm(void *ctx, const kiln_tdesc *out, const kiln_tdesc *mean, const kiln_tdesc *rstd,
                             const kiln_tdesc *x, const kiln_tdesc *weight, const kiln_tdesc *bias, int64_t inner,
                             double eps)
{
    OP_BEGIN(KILN_WIRE_P_LAYER_NORM, 0);
    td(op, out);
    td(op, mean);
    td(op, rstd);
    td(op, x);
    td(op, weight);
    td(op, bias);
    iparam(op, inner);
    fparam(op, eps);
    OP_END(ctx);
}

/* ---- the interface ------------------------------------------------------------------------------- */

static const kiln_backend_iface remote_iface = {
    .name = "remote",
    .open = kiln__remote_open,
    .open_opts = kiln__remote_open_opts,
    .close = kiln__remote_close,
    .caps = kiln__remote_caps,
    .buffer_alloc = kiln__remote_buffer_alloc,
    .buffer_free = kiln__remote_buffer_free,
    .buffer_upload = kiln__remote_buffer_upload,
    .buffer_download = kiln__remote_buffer_download,
    .sync = kiln__remote_sync,
    .queue_open = kiln__remote_queue_open,
    .event_record = kiln__remote_event_record,
    .event_sync = kiln__remote_event_sync,
    .event_query = kiln__remote_event_query,
    .event_free = kiln__remote_event_free,
    .lost = kiln__remote_lost,
    .fill = remote_fill,
    .arange = remote_arange,
    .copy = remote_copy,
    .rng = remote_rng,
    .unary = remote_unary,
    .binary = remote_binary,
    .where = remote_where,
    .index_check = kiln__remote_index_check,
    .reduce = remote_reduce,
    .arg_reduce = remote_arg_reduce,
    .cumsum = remote_cumsum,
    .sort = remote_sort,
    .gather = remote_gather,
    .scatter = remote_scatter,
    .index_select = remote_index_select,
    .index_add = remote_index_add,
    .matmul = remote_matmul,
    .conv = remote_conv,
    .conv_backward_input = remote_conv_backward_input,
    .conv_backward_weight = remote_conv_backward_weight,
    .pool = remote_pool,
    .pool_backward = remote_pool_backward,
    .adaptive_avg_pool = remote_adaptive_avg_pool,
    .adaptive_avg_pool_backward = remote_adaptive_avg_pool_backward,
    .interpolate = remote_interpolate,
    .interpolate_backward = remote_interpolate_backward,
    .pad = remote_pad,
    .softmax = remote_softmax,
    .layer_norm = remote_layer_norm,
};

const kiln_backend_iface *kiln_backend_remote(void)
{
    return &remote_iface;
}
