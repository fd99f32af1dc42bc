/*
 * backends/vulkan/vk-sort.c — sort (and so argsort and topk): a bitonic sorting network
 * over (key, position) pairs, stable in both directions with NaN last ascending and first
 * descending, as the host's merge sort (shaders/sort.comp says how the keys make it so).
 *
 * Each lane is padded to the next power of two P. Tiles of SORT_TILE pairs are sorted in
 * shared memory by one dispatch; when P is larger, each later merge stage k takes one
 * dispatch per compare distance from k / 2 down to SORT_TILE over a scratch copy of the
 * pairs (12 bytes each), and one tile dispatch for the distances below. A lane of 2^20
 * elements takes 66 dispatches, O(n log^2 n) compares spread over the whole device; no
 * thread's loop grows with the lane.
 */
#include <string.h>

#include "vk-impl.h"

/* Mirrors sort.comp's params block. */
typedef struct sort_params {
    kvk_view in_lane, val_lane, idx_lane;
    int32_t len, in_step, val_step, idx_step;
    int32_t lanes, log_p, stage, step, to_output;
} sort_params;

enum {
    SORT_TILE_SORT = 0,
    SORT_GLOBAL_STEP = 1,
    SORT_TILE_MERGE = 2
};
#define SORT_TILE 1024 /* TILE in sort.comp */

typedef struct sort_run {
    kvk_queue *q;
    const char *variant;
    uint32_t descending, has_values, has_indices;
    kiln_buffer *bufs[5]; /* in, values, indices, keys, positions */
} sort_run;

static int sort_pass(sort_run *r, uint32_t pass, const sort_params *p, int64_t groups)
{
    uint32_t c[4] = {pass, r->descending, r->has_values, r->has_indices};
    kvk_spec spec = kvk_spec_1d(4, c);
    return kvk_dispatch(r->q, "sort", "sort", r->variant, &spec, r->bufs, 5, p, sizeof *p, kvk_groups(groups, 1),
                        1, 1);
}

int kvk_sort(void *vq, const kiln_tdesc *values, const kiln_tdesc *indices, const kiln_tdesc *in, int dim,
             bool descending)
{
    kvk_queue *q = vq;
    kiln_tdesc i1 = kvk_lifted(in);
    kiln_tdesc v1 = values ? kvk_lifted(values) : i1, x1 = indices ? kvk_lifted(indices) : i1;
    if (in->ndim == 0)
        dim = 0;
    sort_params p;
    memset(&p, 0, sizeof p);
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
    p.lanes = p.in_lane.numel;
    while (((int64_t)1 << p.log_p) < p.len)
        p.log_p++;
    int64_t padded = (int64_t)1 << p.log_p, pairs = (int64_t)p.lanes * padded;
    if (pairs > INT32_MAX - SORT_TILE)
        return kiln__error_set("sort: %d lanes of %d elements, each padded to %lld, are past the 2^31 pairs "
                               "one sort can index",
                               p.lanes, p.len, (long long)padded),
               KILN_EINVAL;

    kiln_dtype dts[2] = {in->dtype, KILN_I64};
    char variant[16];
    sort_run r = {
        .q = q,
        .variant = kvk_variant(variant, sizeof variant, 2, dts),
        .descending = descending,
        .has_values = values != NULL,
        .has_indices = indices != NULL,
        .bufs = {in->buf, values ? values->buf : NULL, indices ? indices->buf : NULL, NULL, NULL},
    };
    int64_t tiles = (pairs + SORT_TILE - 1) / SORT_TILE;
    if (padded <= SORT_TILE) {
        p.to_output = 1;
        return sort_pass(&r, SORT_TILE_SORT, &p, tiles);
    }
    r.bufs[3] = kvk_buffer_alloc(q, (size_t)pairs * sizeof(uint64_t));
    r.bufs[4] = r.bufs[3] ? kvk_buffer_alloc(q, (size_t)pairs * sizeof(uint32_t)) : NULL;
    if (!r.bufs[4]) {
        kvk_buffer_free(q, r.bufs[3]);
        return kiln__error_set_code(KILN_ENOMEM,
                                    "sort: no device memory for the %lld bytes of scratch that %d lanes of %d "
                                    "elements need",
                                    (long long)pairs * 12, p.lanes, p.len);
    }
    int rc = sort_pass(&r, SORT_TILE_SORT, &p, tiles);
    for (int64_t k = 2 * SORT_TILE; rc == 0 && k <= padded; k *= 2) {
        p.stage = (int32_t)k;
        for (int64_t j = k / 2; rc == 0 && j >= SORT_TILE; j /= 2) {
            p.step = (int32_t)j;
            rc = sort_pass(&r, SORT_GLOBAL_STEP, &p, (pairs / 2 + KVK_WG - 1) / KVK_WG);
        }
        p.to_output = k == padded;
        if (rc == 0)
            rc = sort_pass(&r, SORT_TILE_MERGE, &p, tiles);
    }
    kvk_buffer_free(q, r.bufs[3]);
    kvk_buffer_free(q, r.bufs[4]);
    return rc;
}
