/*
 * backends/vulkan/vk-reduce.c — reductions (reduce, arg_reduce) and cumsum. Each splits its
 * operand into an outer view (one element per output or lane) and the run of elements it
 * combines, so the kernels stay free of per-op shape logic. sort is in vk-sort.c.
 */
#include <math.h>
#include <string.h>

#include "vk-impl.h"

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
 * all. And no workgroup takes more than SPLIT_MAX_CHUNK elements (256 strides of its
 * threads) of an op whose partial results one op combines: a workgroup walking a run of
 * millions would leave the device idle too, and its loop would outrun llvmpipe's limit.
 * A second dispatch combines each output's partial results in order (so the result depends
 * on the shapes only, never on timing). */
#define SPLIT_GROUPS 256
#define SPLIT_MIN_CHUNK 4096
#define SPLIT_MAX_CHUNK (256 * 128)

/* The op that combines op's partial results over pieces of a run, or -1 where no one op
 * does (var, std, logsumexp, a p-norm for p other than 0, 1 and ±inf). */
static int split_combine(kiln_reduce_op op, double p)
{
    switch (op) {
    case KILN_REDUCE_SUM:
    case KILN_REDUCE_MEAN:
    case KILN_REDUCE_PROD:
    case KILN_REDUCE_MAX:
    case KILN_REDUCE_MIN:
    case KILN_REDUCE_ANY:
    case KILN_REDUCE_ALL: return (int)op;
    case KILN_REDUCE_NORM:
        if (p == 0 || p == 1)
            return KILN_REDUCE_SUM;
        if (isinf(p))
            return p > 0 ? KILN_REDUCE_MAX : KILN_REDUCE_MIN;
        return -1;
    default: return -1;
    }
}

static int64_t split_count(kiln_reduce_op op, double param, const kiln_tdesc *out, const kiln_tdesc *in,
                           int64_t nout, int64_t n)
{
    if (nout == 0 || split_combine(op, param) < 0)
        return 1;
    int64_t splits = (n + SPLIT_MAX_CHUNK - 1) / SPLIT_MAX_CHUNK;
    bool float_sum = (op == KILN_REDUCE_SUM || op == KILN_REDUCE_MEAN) && kiln_dtype_is_float(out->dtype) &&
                     kiln_dtype_is_float(in->dtype);
    if (float_sum && nout < SPLIT_GROUPS / 2 && n >= 2 * SPLIT_MIN_CHUNK) {
        int64_t want = (SPLIT_GROUPS + nout - 1) / nout, most = n / SPLIT_MIN_CHUNK;
        want = want < most ? want : most;
        splits = want > splits ? want : splits;
    }
    return splits > 1 ? splits : 1;
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

/* The loop iterations of one thread of reduce.glsl: its workgroup's share of the groups,
 * each a pass or two over chunk / 128 elements (their offsets a loop over the dims where
 * the run is strided) and the shared-memory trees. */
static int64_t reduce_steps(kiln_reduce_op op, const reduce_params *p, int64_t groups)
{
    int64_t passes = op == KILN_REDUCE_VAR || op == KILN_REDUCE_STD || op == KILN_REDUCE_LOGSUMEXP ? 2 : 1;
    int64_t per_element = p->inner.contig ? 1 : 1 + p->inner.ndim;
    int64_t rounds = (groups + KVK_GROUPS_MAX - 1) / KVK_GROUPS_MAX;
    return rounds * (passes * ((p->chunk + 127) / 128) * per_element + 32);
}

/* The op's name, for messages. */
static const char *reduce_name(kiln_reduce_op op)
{
    static const char *const names[KILN_REDUCE_COUNT] = {
        [KILN_REDUCE_SUM] = "sum",   [KILN_REDUCE_MEAN] = "mean",
        [KILN_REDUCE_PROD] = "prod", [KILN_REDUCE_MAX] = "max",
        [KILN_REDUCE_MIN] = "min",   [KILN_REDUCE_VAR] = "var",
        [KILN_REDUCE_STD] = "std",   [KILN_REDUCE_LOGSUMEXP] = "logsumexp",
        [KILN_REDUCE_NORM] = "norm", [KILN_REDUCE_ANY] = "any",
        [KILN_REDUCE_ALL] = "all",
    };
    return (unsigned)op < KILN_REDUCE_COUNT && names[op] ? names[op] : "reduce";
}

int kvk_reduce(void *vq, kiln_reduce_op op, const kiln_tdesc *out, const kiln_tdesc *in, uint32_t mask,
               double param)
{
    kvk_queue *q = vq;
    reduce_params p;
    memset(&p, 0, sizeof p);
    kiln_tdesc i1 = kvk_lifted(in), o1 = kvk_lifted(out);
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
    int64_t splits = split_count(op, param, out, in, nout, n);
    if (splits <= 1) {
        int rc = kvk_loop_check(q, "reduce", reduce_steps(op, &p, nout), "%s over runs of %lld elements",
                                reduce_name(op), (long long)n);
        return rc < 0 ? rc : dispatch_reduce(q, op, out->dtype, out->buf, in->dtype, in->buf, &p, nout);
    }
    int64_t chunk = (n + splits - 1) / splits;
    splits = (n + chunk - 1) / chunk;
    /* the partial results of integer sums, products and extremes in int64, the rest in the
     * precision the shader accumulates in */
    kiln_reduce_op first_op = op == KILN_REDUCE_MEAN ? KILN_REDUCE_SUM : op;
    bool int_path = !kiln_dtype_is_float(out->dtype) && !kiln_dtype_is_float(in->dtype) &&
                    (first_op == KILN_REDUCE_SUM || first_op == KILN_REDUCE_PROD || first_op == KILN_REDUCE_MAX ||
                     first_op == KILN_REDUCE_MIN);
    kiln_dtype acc = int_path ? KILN_I64 : q->d->feat.f64 ? KILN_F64 : KILN_F32;
    kiln_buffer *part = kvk_buffer_alloc(q, (size_t)(nout * splits) * kiln_dtype_size(acc));
    if (!part)
        return kiln__error_set_code(KILN_ENOMEM, "reduce: no device memory for %lld partial results",
                                    (long long)(nout * splits));
    reduce_params first = p;
    first.splits = (int32_t)splits;
    first.chunk = (int32_t)chunk;
    int rc = dispatch_reduce(q, first_op, acc, part, in->dtype, in->buf, &first, nout * splits);
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
            rc = dispatch_reduce(q, (kiln_reduce_op)split_combine(op, param), out->dtype, out->buf, acc, part,
                                 &second, nout);
    }
    kvk_buffer_free(q, part);
    return rc;
}

/* Mirrors arg_reduce.comp's params block. */
typedef struct arg_params {
    kvk_view out, lane;
    int32_t len, step, splits, chunk;
} arg_params;

static int dispatch_arg(kvk_queue *q, bool is_max, uint32_t pass, kiln_buffer *out, kiln_dtype in_dt,
                        kiln_buffer *in, kiln_buffer *picks, const arg_params *p, int64_t groups)
{
    kiln_dtype dts[2] = {KILN_I64, in_dt}; /* the result and the picks are i64 */
    char variant[16];
    uint32_t c[2] = {is_max ? 1u : 0u, pass};
    kvk_spec spec = kvk_spec_1d(2, c);
    kiln_buffer *bufs[3] = {out, in, picks};
    return kvk_dispatch(q, "arg_reduce", "arg_reduce", kvk_variant(variant, sizeof variant, 2, dts), &spec, bufs,
                        3, p, sizeof *p, kvk_groups(groups, 1), 1, 1);
}

int kvk_arg_reduce(void *vq, bool is_max, const kiln_tdesc *out, const kiln_tdesc *in, int dim)
{
    kvk_queue *q = vq;
    kiln_tdesc i1 = kvk_lifted(in), o1 = kvk_lifted(out);
    if (in->ndim == 0)
        dim = 0;
    arg_params p;
    memset(&p, 0, sizeof p);
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
    /* a lane longer than SPLIT_MAX_CHUNK: its chunks' picks first, as reduce splits */
    int64_t lanes = p.out.numel, splits = ((int64_t)p.len + SPLIT_MAX_CHUNK - 1) / SPLIT_MAX_CHUNK;
    p.splits = 1;
    p.chunk = p.len;
    if (splits <= 1)
        return dispatch_arg(q, is_max, 0, out->buf, in->dtype, in->buf, NULL, &p, lanes);
    p.splits = (int32_t)splits;
    p.chunk = SPLIT_MAX_CHUNK;
    kiln_buffer *picks = kvk_buffer_alloc(q, (size_t)(lanes * splits) * sizeof(int64_t));
    if (!picks)
        return kiln__error_set_code(KILN_ENOMEM, "arg_reduce: no device memory for %lld partial picks",
                                    (long long)(lanes * splits));
    int rc = dispatch_arg(q, is_max, 0, picks, in->dtype, in->buf, NULL, &p, lanes * splits);
    if (rc == 0)
        rc = dispatch_arg(q, is_max, 1, out->buf, in->dtype, in->buf, picks, &p, lanes);
    kvk_buffer_free(q, picks);
    return rc;
}

/* Mirrors cumsum.comp's params block. */
typedef struct cumsum_params {
    kvk_view out_lane, in_lane;
    int32_t len, out_step, in_step, blocks, has_offsets;
} cumsum_params;

/* cumsum.comp's passes and block: lanes of at most CUMSUM_SERIAL_MAX elements take one
 * thread each; longer ones are scanned in blocks of CUMSUM_BLOCK, one workgroup each. */
enum {
    CUMSUM_SERIAL = 0,
    CUMSUM_TOTALS = 1,
    CUMSUM_SCAN = 2
};
#define CUMSUM_BLOCK (8 * KVK_WG)
#define CUMSUM_SERIAL_MAX 256

/* What cumsum.comp accumulates in for an (out, in) variant: int64 for integer results,
 * double where a slot is f64, float otherwise. */
static kiln_dtype cumsum_acc(kiln_dtype out, kiln_dtype in)
{
    if (!kiln_dtype_is_float(out))
        return KILN_I64;
    return out == KILN_F64 || in == KILN_F64 ? KILN_F64 : KILN_F32;
}

static int cumsum_dispatch(kvk_queue *q, uint32_t pass, kiln_dtype out_dt, kiln_buffer *out, kiln_dtype in_dt,
                           kiln_buffer *in, kiln_buffer *offsets, const cumsum_params *p, int64_t groups)
{
    kiln_dtype dts[2] = {out_dt, in_dt};
    char variant[16];
    kvk_spec spec = kvk_spec_1d(1, &pass);
    kiln_buffer *bufs[3] = {out, in, offsets};
    return kvk_dispatch(q, "cumsum", "cumsum", kvk_variant(variant, sizeof variant, 2, dts), &spec, bufs, 3, p,
                        sizeof *p, kvk_groups(groups, 1), 1, 1);
}

/* Scan every lane of p (its views, len and steps set) from in into out. A lane longer than
 * one block: each block's total (PASS_TOTALS), those totals scanned per lane by this same
 * function (a lane of 2^31 elements needs three levels), then each block rescanned from
 * the running total before it (PASS_SCAN). */
static int cumsum_lanes(kvk_queue *q, cumsum_params p, kiln_dtype out_dt, kiln_buffer *out, kiln_dtype in_dt,
                        kiln_buffer *in)
{
    int64_t lanes = p.in_lane.numel;
    p.blocks = 1;
    p.has_offsets = 0;
    if (p.len <= CUMSUM_SERIAL_MAX)
        return cumsum_dispatch(q, CUMSUM_SERIAL, out_dt, out, in_dt, in, NULL, &p, (lanes + KVK_WG - 1) / KVK_WG);
    int64_t blocks = ((int64_t)p.len + CUMSUM_BLOCK - 1) / CUMSUM_BLOCK;
    if (blocks == 1)
        return cumsum_dispatch(q, CUMSUM_SCAN, out_dt, out, in_dt, in, NULL, &p, lanes);
    p.blocks = (int32_t)blocks;
    kiln_dtype acc = cumsum_acc(out_dt, in_dt);
    size_t bytes = (size_t)(lanes * blocks) * kiln_dtype_size(acc);
    kiln_buffer *totals = kvk_buffer_alloc(q, bytes);
    kiln_buffer *running = totals ? kvk_buffer_alloc(q, bytes) : NULL;
    if (!running) {
        kvk_buffer_free(q, totals);
        return kiln__error_set_code(KILN_ENOMEM, "cumsum: no device memory for %lld block totals",
                                    (long long)(lanes * blocks));
    }
    int rc = cumsum_dispatch(q, CUMSUM_TOTALS, acc, totals, in_dt, in, NULL, &p, lanes * blocks);
    if (rc == 0) {
        /* lane l's totals are totals[l * blocks ...]: the same layout for the running totals */
        cumsum_params tp;
        memset(&tp, 0, sizeof tp);
        kiln_tdesc lane_of = {.buf = totals, .dtype = acc, .ndim = 1, .shape = {lanes}, .strides = {blocks}};
        if (kvk_view_of(&tp.in_lane, &lane_of, "cumsum") < 0 || kvk_view_of(&tp.out_lane, &lane_of, "cumsum") < 0)
            rc = KILN_EINVAL;
        tp.len = p.blocks;
        tp.in_step = tp.out_step = 1;
        if (rc == 0)
            rc = cumsum_lanes(q, tp, acc, running, acc, totals);
    }
    p.has_offsets = 1;
    if (rc == 0)
        rc = cumsum_dispatch(q, CUMSUM_SCAN, out_dt, out, in_dt, in, running, &p, lanes * blocks);
    kvk_buffer_free(q, totals);
    kvk_buffer_free(q, running);
    return rc;
}

int kvk_cumsum(void *vq, const kiln_tdesc *out, const kiln_tdesc *in, int dim)
{
    kvk_queue *q = vq;
    kiln_tdesc i1 = kvk_lifted(in), o1 = kvk_lifted(out);
    if (in->ndim == 0)
        dim = 0;
    cumsum_params p;
    memset(&p, 0, sizeof p);
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
    return cumsum_lanes(q, p, out->dtype, out->buf, in->dtype, in->buf);
}
