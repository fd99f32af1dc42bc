/*
 * backends/vulkan/vk-reduce.c — reductions (reduce, arg_reduce), cumsum and sort. Each
 * splits its operand into an outer view (one element per output or lane) and the run of
 * elements it combines, so the kernels stay free of per-op shape logic.
 */
#include <string.h>

#include "vk-impl.h"

/* t lifted to at least one dim (a 0-d tensor is [1]). */
static kiln_tdesc lifted(const kiln_tdesc *t)
{
    kiln_tdesc r = *t;
    if (r.ndim == 0) {
        r.ndim = 1;
        r.shape[0] = 1;
        r.strides[0] = 1;
    }
    return r;
}

/* t with dims whose bit in mask is set (mask_keep false) or clear (true) sized 1. */
static kiln_tdesc collapsed(const kiln_tdesc *t, uint32_t mask, bool keep_masked, bool zero_offset)
{
    kiln_tdesc r = *t;
    for (int d = 0; d < t->ndim; d++) {
        bool masked = (mask >> d) & 1u;
        if (masked != keep_masked)
            r.shape[d] = 1;
    }
    if (zero_offset)
        r.offset = 0;
    return r;
}

/* Mirrors reduce.glsl's params block. */
typedef struct reduce_params {
    kvk_view out, outer, inner;
    kvk_scalar param;
    int32_t splits, chunk, divisor;
} reduce_params;

/* A float sum or mean with fewer outputs than a GPU has cores, each over a long run, would
 * leave most of the device idle at one workgroup per output: it splits each output's run
 * into chunks of at least SPLIT_MIN_CHUNK elements, for about SPLIT_GROUPS workgroups in
 * all, whose partial sums a second dispatch adds in order (so the result depends on the
 * shapes only, never on timing). */
#define SPLIT_GROUPS 256
#define SPLIT_MIN_CHUNK 4096

static int64_t split_count(kiln_reduce_op op, const kiln_tdesc *out, const kiln_tdesc *in, int64_t nout, int64_t n)
{
    if ((op != KILN_REDUCE_SUM && op != KILN_REDUCE_MEAN) || !kiln_dtype_is_float(out->dtype) ||
        !kiln_dtype_is_float(in->dtype))
        return 1;
    if (nout == 0 || nout >= SPLIT_GROUPS / 2 || n < 2 * SPLIT_MIN_CHUNK)
        return 1;
    int64_t want = (SPLIT_GROUPS + nout - 1) / nout, most = n / SPLIT_MIN_CHUNK;
    return want < most ? want : most;
}

static int dispatch_reduce(kvk_queue *q, kiln_reduce_op op, kiln_dtype out_dt, kiln_buffer *out_buf,
                           kiln_dtype in_dt, kiln_buffer *in_buf, const reduce_params *p, int64_t groups)
{
    kiln_dtype dts[2] = {out_dt, in_dt};
    char variant[16];
    uint32_t c[1] = {(uint32_t)op};
    kvk_spec spec = kvk_spec_1d(1, c);
    kiln_buffer *bufs[2] = {out_buf, in_buf};
    /* float sums go through subgroup adds where the device has them */
    bool sg = q->d->feat.subgroup_arith && out_dt == in_dt && kiln_dtype_is_float(in_dt);
    const char *shader = sg ? (q->d->feat.f64 ? "reduce_sg_d" : "reduce_sg")
                            : (q->d->feat.f64 ? "reduce_d" : "reduce");
    return kvk_dispatch(q, "reduce", shader, kvk_variant(variant, sizeof variant, 2, dts), &spec, bufs, 2, p,
                        sizeof *p, kvk_groups(groups, 1), 1, 1);
}

int kvk_reduce(void *vq, kiln_reduce_op op, const kiln_tdesc *out, const kiln_tdesc *in, uint32_t mask,
               double param)
{
    kvk_queue *q = vq;
    reduce_params p;
    memset(&p, 0, sizeof p);
    kiln_tdesc i1 = lifted(in), o1 = lifted(out);
    if (in->ndim == 0)
        mask = 1;
    kiln_tdesc outer = collapsed(&i1, mask, false, false);
    kiln_tdesc inner = collapsed(&i1, mask, true, true);
    const kiln_tdesc *pair[2] = {&o1, &outer};
    if (kvk_views_of(&p.out, pair, 2, "reduce") < 0 || kvk_view_of(&p.inner, &inner, "reduce") < 0)
        return KILN_EINVAL;
    if (p.out.numel == 0)
        return 0;
    if (p.inner.numel == 0 && (op == KILN_REDUCE_MAX || op == KILN_REDUCE_MIN))
        return kiln__error_set("reduce: max/min over an empty dimension"), KILN_EINVAL;
    p.param = kvk_scalar_of(param);
    int64_t nout = p.out.numel, n = p.inner.numel;
    p.splits = 1;
    p.chunk = (int32_t)n;
    int64_t splits = split_count(op, out, in, nout, n);
    if (splits <= 1)
        return dispatch_reduce(q, op, out->dtype, out->buf, in->dtype, in->buf, &p, nout);
    int64_t chunk = (n + splits - 1) / splits;
    splits = (n + chunk - 1) / chunk;
    /* partial sums in the precision the shader accumulates in */
    kiln_dtype acc = q->d->feat.f64 ? KILN_F64 : KILN_F32;
    kiln_buffer *part = kvk_buffer_alloc(q, (size_t)(nout * splits) * kiln_dtype_size(acc));
    if (!part)
        return kiln__error_set("reduce: no device memory for %lld partial sums", (long long)(nout * splits)),
               KILN_ENOMEM;
    reduce_params first = p;
    first.splits = (int32_t)splits;
    first.chunk = (int32_t)chunk;
    int rc = dispatch_reduce(q, KILN_REDUCE_SUM, acc, part, in->dtype, in->buf, &first, nout * splits);
    if (rc == 0) {
        /* output o's partials are part[o * splits ...], o counted as the outer view counts */
        reduce_params second = p;
        kiln_tdesc po = {.buf = part, .dtype = acc, .ndim = 1, .shape = {nout}, .strides = {splits}};
        kiln_tdesc pi = {.buf = part, .dtype = acc, .ndim = 1, .shape = {splits}, .strides = {1}};
        if (kvk_view_of(&second.outer, &po, "reduce") < 0 || kvk_view_of(&second.inner, &pi, "reduce") < 0)
            rc = KILN_EINVAL;
        second.chunk = (int32_t)splits;
        second.divisor = op == KILN_REDUCE_MEAN ? (int32_t)n : 0;
        if (rc == 0)
            rc = dispatch_reduce(q, op, out->dtype, out->buf, acc, part, &second, nout);
    }
    kvk_buffer_free(q, part);
    return rc;
}

typedef struct arg_params {
    kvk_view out, lane;
    int32_t len, step;
} arg_params;

int kvk_arg_reduce(void *vq, bool is_max, const kiln_tdesc *out, const kiln_tdesc *in, int dim)
{
    kvk_queue *q = vq;
    kiln_tdesc i1 = lifted(in), o1 = lifted(out);
    if (in->ndim == 0)
        dim = 0;
    arg_params p;
    kiln_tdesc lane = i1;
    lane.shape[dim] = 1;
    const kiln_tdesc *pair[2] = {&o1, &lane};
    if (kvk_views_of(&p.out, pair, 2, "arg_reduce") < 0)
        return KILN_EINVAL;
    if (p.out.numel == 0)
        return 0;
    if (i1.shape[dim] == 0)
        return kiln__error_set("arg_reduce: empty dimension %d", dim), KILN_EINVAL;
    p.len = (int32_t)i1.shape[dim];
    p.step = (int32_t)i1.strides[dim];
    kiln_dtype dts[2] = {out->dtype, in->dtype};
    char variant[16];
    uint32_t c[1] = {is_max ? 1u : 0u};
    kvk_spec spec = kvk_spec_1d(1, c);
    kiln_buffer *bufs[2] = {out->buf, in->buf};
    return kvk_dispatch(q, "arg_reduce", "arg_reduce", kvk_variant(variant, sizeof variant, 2, dts), &spec, bufs,
                        2, &p, sizeof p, kvk_groups(p.out.numel, 1), 1, 1);
}

typedef struct cumsum_params {
    kvk_view out_lane, in_lane;
    int32_t len, out_step, in_step;
} cumsum_params;

int kvk_cumsum(void *vq, const kiln_tdesc *out, const kiln_tdesc *in, int dim)
{
    kvk_queue *q = vq;
    kiln_tdesc i1 = lifted(in), o1 = lifted(out);
    if (in->ndim == 0)
        dim = 0;
    cumsum_params p;
    kiln_tdesc ol = o1, il = i1;
    ol.shape[dim] = 1;
    il.shape[dim] = 1;
    const kiln_tdesc *pair[2] = {&ol, &il};
    if (kvk_views_of(&p.out_lane, pair, 2, "cumsum") < 0)
        return KILN_EINVAL;
    if (p.out_lane.numel == 0 || i1.shape[dim] == 0)
        return 0;
    p.len = (int32_t)i1.shape[dim];
    p.out_step = (int32_t)o1.strides[dim];
    p.in_step = (int32_t)i1.strides[dim];
    kiln_dtype dts[2] = {out->dtype, in->dtype};
    char variant[16];
    kiln_buffer *bufs[2] = {out->buf, in->buf};
    return kvk_dispatch(q, "cumsum", "cumsum", kvk_variant(variant, sizeof variant, 2, dts), NULL, bufs, 2, &p,
                        sizeof p, kvk_groups(p.out_lane.numel, KVK_WG), 1, 1);
}

typedef struct sort_params {
    kvk_view in_lane, val_lane, idx_lane;
    int32_t len, in_step, val_step, idx_step;
} sort_params;

int kvk_sort(void *vq, const kiln_tdesc *values, const kiln_tdesc *indices, const kiln_tdesc *in, int dim,
             bool descending)
{
    kvk_queue *q = vq;
    kiln_tdesc i1 = lifted(in);
    kiln_tdesc v1 = values ? lifted(values) : i1, x1 = indices ? lifted(indices) : i1;
    if (in->ndim == 0)
        dim = 0;
    sort_params p;
    kiln_tdesc il = i1, vl = v1, xl = x1;
    il.shape[dim] = vl.shape[dim] = xl.shape[dim] = 1;
    const kiln_tdesc *three[3] = {&il, &vl, &xl};
    if (kvk_views_of(&p.in_lane, three, 3, "sort") < 0)
        return KILN_EINVAL;
    if (p.in_lane.numel == 0 || i1.shape[dim] == 0)
        return 0;
    p.len = (int32_t)i1.shape[dim];
    p.in_step = (int32_t)i1.strides[dim];
    p.val_step = (int32_t)v1.strides[dim];
    p.idx_step = (int32_t)x1.strides[dim];
    kiln_dtype dts[2] = {in->dtype, KILN_I64};
    char variant[16];
    uint32_t c[3] = {descending, values != NULL, indices != NULL};
    kvk_spec spec = kvk_spec_1d(3, c);
    kiln_buffer *bufs[3] = {in->buf, values ? values->buf : NULL, indices ? indices->buf : NULL};
    return kvk_dispatch(q, "sort", "sort", kvk_variant(variant, sizeof variant, 2, dts), &spec, bufs, 3, &p,
                        sizeof p, kvk_groups(p.in_lane.numel, 1), 1, 1);
}
