/*
 * backends/vulkan/vk-index.c — index_check (on the device, reported at the next sync),
 * gather, index_select, scatter, index_add and pad. Views stay unmerged here: the
 * kernels address one dim by number.
 */
#include <string.h>

#include "vk-impl.h"

typedef struct check_params {
    kvk_view idx;
    uint32_t slot, lo_lo, lo_hi, hi_lo, hi_hi;
} check_params;

static int check_locked(kvk_queue *q, check_params *pp, const kiln_tdesc *index, int64_t lo, int64_t hi,
                        const char *op, const char *noun);

int kvk_index_check(void *vq, const kiln_tdesc *index, int64_t lo, int64_t hi, const char *op, const char *noun)
{
    kvk_queue *q = vq;
    check_params p;
    if (kvk_view_of(&p.idx, index, op) < 0)
        return KILN_EINVAL;
    if (p.idx.numel == 0)
        return 0;
    pthread_mutex_lock(&q->lock); /* the slot and its two passes go in one order */
    int rc = check_locked(q, &p, index, lo, hi, op, noun);
    pthread_mutex_unlock(&q->lock);
    return rc;
}

static int check_locked(kvk_queue *q, check_params *pp, const kiln_tdesc *index, int64_t lo, int64_t hi,
                        const char *op, const char *noun)
{
    check_params p = *pp;
    int slot = kvk_check_slot(q, op, noun, lo, hi);
    if (slot < 0)
        return KILN_EDEVICE;
    p.slot = (uint32_t)slot;
    p.lo_lo = (uint32_t)(uint64_t)lo;
    p.lo_hi = (uint32_t)((uint64_t)lo >> 32);
    p.hi_lo = (uint32_t)(uint64_t)hi;
    p.hi_hi = (uint32_t)((uint64_t)hi >> 32);
    kiln_buffer *bufs[2] = {index->buf, q->check_buf};
    for (uint32_t pass = 0; pass < 2; pass++) {
        kvk_spec spec = kvk_spec_1d(1, &pass);
        int rc = kvk_dispatch(q, op, "index_check", kvk_dtype_name(index->dtype), &spec, bufs, 2, &p, sizeof p,
                              kvk_groups(p.idx.numel, KVK_WG), 1, 1);
        if (rc < 0)
            return rc;
    }
    return 0;
}

typedef struct gather_params {
    kvk_view out, in, idx;
    int32_t dim, size;
} gather_params;

static int gather_like(kvk_queue *q, const char *op, uint32_t mode, const kiln_tdesc *out, const kiln_tdesc *in,
                       int dim, const kiln_tdesc *index)
{
    kiln_tdesc o1 = kvk_lifted(out), i1 = kvk_lifted(in), x1 = mode ? *index : kvk_lifted(index);
    if (mode && x1.ndim == 0) {
        x1.ndim = 1;
        x1.shape[0] = 1;
        x1.strides[0] = 1;
    }
    gather_params p;
    if (kvk_view_exact(&p.out, &o1, op) < 0 || kvk_view_exact(&p.in, &i1, op) < 0 ||
        kvk_view_exact(&p.idx, &x1, op) < 0)
        return KILN_EINVAL;
    if (p.out.numel == 0)
        return 0;
    p.dim = dim;
    p.size = (int32_t)i1.shape[dim];
    if (p.size == 0)
        return kiln__error_set("%s: cannot index an empty dimension %d", op, dim), KILN_EINVAL;
    kiln_dtype dts[2] = {out->dtype, index->dtype};
    char variant[16];
    kvk_spec spec = kvk_spec_1d(1, &mode);
    kiln_buffer *bufs[3] = {out->buf, in->buf, index->buf};
    return kvk_dispatch(q, op, "gather", kvk_variant(variant, sizeof variant, 2, dts), &spec, bufs, 3, &p,
                        sizeof p, kvk_groups(p.out.numel, KVK_WG), 1, 1);
}

int kvk_gather(void *vq, const kiln_tdesc *out, const kiln_tdesc *in, int dim, const kiln_tdesc *index)
{
    return gather_like(vq, "gather", 0, out, in, dim, index);
}

int kvk_index_select(void *vq, const kiln_tdesc *out, const kiln_tdesc *in, int dim, const kiln_tdesc *index)
{
    return gather_like(vq, "index_select", 1, out, in, dim, index);
}

typedef struct scatter_params {
    kvk_view line, out, src, idx;
    int32_t dim, len, size, k0, k1;
} scatter_params;

/* The positions along dim one scatter dispatch walks per line: a line is one thread's, in
 * order, so a long one takes several dispatches in turn (about 4 loop iterations each). */
#define SCATTER_SPAN 8192

/* iter: the shape walked (index's for scatter, src's for index_add). */
static int scatter_like(kvk_queue *q, const char *op, uint32_t mode, bool accumulate, const kiln_tdesc *out,
                        int dim, const kiln_tdesc *index, const kiln_tdesc *src, const kiln_tdesc *iter)
{
    kiln_tdesc o1 = kvk_lifted(out), s1 = kvk_lifted(src), x1 = kvk_lifted(index), it = kvk_lifted(iter);
    kiln_tdesc line = it;
    line.shape[dim] = 1;
    scatter_params p;
    if (kvk_view_exact(&p.line, &line, op) < 0 || kvk_view_exact(&p.out, &o1, op) < 0 ||
        kvk_view_exact(&p.src, &s1, op) < 0 || kvk_view_exact(&p.idx, &x1, op) < 0)
        return KILN_EINVAL;
    if (kvk_numel(&it) == 0)
        return 0;
    p.dim = dim;
    p.len = (int32_t)it.shape[dim];
    p.size = (int32_t)o1.shape[dim];
    kiln_dtype dts[2] = {out->dtype, index->dtype};
    char variant[16];
    uint32_t c[2] = {mode, accumulate};
    kvk_spec spec = kvk_spec_1d(2, c);
    kiln_buffer *bufs[3] = {out->buf, src->buf, index->buf};
    uint32_t groups = kvk_groups(p.line.numel, KVK_WG);
    int64_t rounds = (p.line.numel + (int64_t)groups * KVK_WG - 1) / ((int64_t)groups * KVK_WG);
    int64_t span = SCATTER_SPAN / rounds > 0 ? SCATTER_SPAN / rounds : 1;
    int rc = 0;
    for (int64_t k0 = 0; rc == 0 && k0 < p.len; k0 += span) {
        p.k0 = (int32_t)k0;
        p.k1 = (int32_t)(k0 + span < p.len ? k0 + span : p.len);
        rc = kvk_dispatch(q, op, "scatter", kvk_variant(variant, sizeof variant, 2, dts), &spec, bufs, 3, &p,
                          sizeof p, groups, 1, 1);
    }
    return rc;
}

int kvk_scatter(void *vq, const kiln_tdesc *out, int dim, const kiln_tdesc *index, const kiln_tdesc *src,
                bool accumulate)
{
    return scatter_like(vq, "scatter", 0, accumulate, out, dim, index, src, index);
}

int kvk_index_add(void *vq, const kiln_tdesc *out, int dim, const kiln_tdesc *index, const kiln_tdesc *src)
{
    return scatter_like(vq, "index_add", 1, true, out, dim, index, src, src);
}

typedef struct pad_params {
    kvk_view out, in;
    int32_t lo[KILN_MAX_DIMS];
    kvk_scalar value;
} pad_params;

int kvk_pad(void *vq, kiln_pad_mode mode, const kiln_tdesc *out, const kiln_tdesc *in, const int64_t *pads,
            double value)
{
    kvk_queue *q = vq;
    if (mode != KILN_PAD_CONSTANT && mode != KILN_PAD_REFLECT && mode != KILN_PAD_REPLICATE)
        return kiln__error_set("pad: unknown mode %d", (int)mode), KILN_EINVAL;
    for (int d = 0; d < in->ndim; d++) {
        if (mode == KILN_PAD_REFLECT && (pads[2 * d] != 0 || pads[2 * d + 1] != 0) &&
            (pads[2 * d] >= in->shape[d] || pads[2 * d + 1] >= in->shape[d]))
            return kiln__error_set("pad: reflect padding of dim %d must be below its size %lld", d,
                                   (long long)in->shape[d]),
                   KILN_EINVAL;
        if (mode == KILN_PAD_REPLICATE && in->shape[d] == 0 && out->shape[d] > 0)
            return kiln__error_set("pad: cannot replicate an empty dim %d", d), KILN_EINVAL;
    }
    pad_params p;
    memset(&p, 0, sizeof p);
    if (kvk_view_exact(&p.out, out, "pad") < 0 || kvk_view_exact(&p.in, in, "pad") < 0)
        return KILN_EINVAL;
    if (p.out.numel == 0)
        return 0;
    for (int d = 0; d < in->ndim; d++)
        p.lo[d] = (int32_t)pads[2 * d];
    p.value = kvk_scalar_of(value);
    uint32_t c[1] = {mode == KILN_PAD_CONSTANT ? 0u : mode == KILN_PAD_REFLECT ? 1u : 2u};
    kvk_spec spec = kvk_spec_1d(1, c);
    kiln_buffer *bufs[2] = {out->buf, in->buf};
    return kvk_dispatch(q, "pad", "pad", kvk_dtype_name(out->dtype), &spec, bufs, 2, &p, sizeof p,
                        kvk_groups(p.out.numel, KVK_WG), 1, 1);
}
