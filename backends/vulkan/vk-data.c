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
