/*
 * backends/vulkan/vk-data.c — data movement and creation: fill, arange, copy (strided,
 * with dtype conversion) and rng (Philox, the same stream as cpu and ref).
 */
#include "vk-impl.h"

typedef struct fill_params {
    kvk_view out;
    kvk_scalar value;
} fill_params;

int kvk_fill(void *vq, const kiln_tdesc *out, double value)
{
    kvk_queue *q = vq;
    fill_params p;
    if (kvk_view_of(&p.out, out, "fill") < 0)
        return KILN_EINVAL;
    if (p.out.numel == 0)
        return 0;
    p.value = kvk_scalar_of(value);
    kiln_buffer *bufs[1] = {out->buf};
    return kvk_dispatch(q, "fill", "fill", kvk_dtype_name(out->dtype), NULL, bufs, 1, &p, sizeof p,
                        kvk_groups(p.out.numel, KVK_WG), 1, 1);
}

typedef struct arange_params {
    kvk_view out;
    kvk_scalar start, step;
} arange_params;

int kvk_arange(void *vq, const kiln_tdesc *out, double start, double step)
{
    kvk_queue *q = vq;
    arange_params p;
    if (kvk_view_of(&p.out, out, "arange") < 0)
        return KILN_EINVAL;
    if (p.out.numel == 0)
        return 0;
    p.start = kvk_scalar_of(start);
    p.step = kvk_scalar_of(step);
    kiln_buffer *bufs[1] = {out->buf};
    return kvk_dispatch(q, "arange", q->d->feat.f64 ? "arange_d" : "arange", kvk_dtype_name(out->dtype), NULL,
                        bufs, 1, &p, sizeof p, kvk_groups(p.out.numel, KVK_WG), 1, 1);
}

typedef struct copy_params {
    kvk_view out, in;
} copy_params;

int kvk_copy(void *vq, const kiln_tdesc *out, const kiln_tdesc *in)
{
    kvk_queue *q = vq;
    copy_params p;
    const kiln_tdesc *ops[2] = {out, in};
    if (kvk_views_of(&p.out, ops, 2, "copy") < 0)
        return KILN_EINVAL;
    if (p.out.numel == 0)
        return 0;
    size_t es = kiln_dtype_size(out->dtype);
    if (out->dtype == in->dtype && p.out.contig && p.in.contig && (p.out.offset * es) % 4 == 0 &&
        (p.in.offset * es) % 4 == 0 && ((size_t)p.out.numel * es) % 4 == 0) {
        /* same bytes, both contiguous: a transfer copy */
        pthread_mutex_lock(&q->lock);
        VkCommandBuffer cmd = kvk_record(q, "copy");
        if (!cmd) {
            pthread_mutex_unlock(&q->lock);
            return KILN_EDEVICE;
        }
        VkBufferCopy region = {
            .srcOffset = in->buf->offset + (VkDeviceSize)p.in.offset * es,
            .dstOffset = out->buf->offset + (VkDeviceSize)p.out.offset * es,
            .size = (VkDeviceSize)p.out.numel * es,
        };
        vkCmdCopyBuffer(cmd, in->buf->vkbuf, out->buf->vkbuf, 1, &region);
        pthread_mutex_unlock(&q->lock);
        return 0;
    }
    kiln_dtype dts[2] = {out->dtype, in->dtype};
    char variant[16];
    kiln_buffer *bufs[2] = {out->buf, in->buf};
    return kvk_dispatch(q, "copy", "copy", kvk_variant(variant, sizeof variant, 2, dts), NULL, bufs, 2, &p,
                        sizeof p, kvk_groups(p.out.numel, KVK_WG), 1, 1);
}

typedef struct rng_params {
    kvk_view out;
    uint32_t seed_lo, seed_hi, off_lo, off_hi;
    kvk_scalar p0, p1;
} rng_params;

int kvk_rng(void *vq, kiln_rng_kind kind, const kiln_tdesc *out, uint64_t seed, uint64_t offset, double p0,
            double p1)
{
    kvk_queue *q = vq;
    rng_params p;
    /* the shader reads the bounds as int64 (the scalar's saturated l words): exact within
     * 2^53 (backend.h), and an empty range would fill every element with p0 */
    if (kind == KILN_RNG_INT &&
        !(p0 >= -9007199254740992.0 && p1 <= 9007199254740992.0 && (int64_t)p0 < (int64_t)p1))
        return kiln__error_set("rng on vulkan: invalid integer range [%g, %g)", p0, p1), KILN_EINVAL;
    if (kvk_view_of(&p.out, out, "rng") < 0)
        return KILN_EINVAL;
    if (p.out.numel == 0)
        return 0;
    p.seed_lo = (uint32_t)seed;
    p.seed_hi = (uint32_t)(seed >> 32);
    p.off_lo = (uint32_t)offset;
    p.off_hi = (uint32_t)(offset >> 32);
    p.p0 = kvk_scalar_of(p0);
    p.p1 = kvk_scalar_of(p1);
    uint32_t c[1] = {(uint32_t)kind};
    kvk_spec spec = kvk_spec_1d(1, c);
    kiln_buffer *bufs[1] = {out->buf};
    return kvk_dispatch(q, "rng", q->d->feat.f64 ? "rng_d" : "rng", kvk_dtype_name(out->dtype), &spec, bufs, 1, &p,
                        sizeof p, kvk_groups(p.out.numel, KVK_WG), 1, 1);
}
