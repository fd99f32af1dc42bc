/*
 * backends/cpu/cpu-sort.c — stable sort along a dim, with indices.
 *
 * Each line along the dim is copied into a key array (double for floating dtypes,
 * int64 for integers so large i64 values compare exactly) paired with the original
 * positions, sorted with a bottom-up merge sort — stable, so equal keys keep their
 * order in both directions, as torch.sort(stable=True) does — and written out. NaN
 * sorts as the largest value: last ascending, first descending. Lines are spread
 * over the thread pool; each thread keeps its own scratch for the duration.
 */
#include <stdlib.h>

#include "cpu-impl.h"

typedef struct skey {
    union { double d; int64_t i; } k;
    int64_t idx;
} skey;

/* true when a must come before b (strictly); ties keep the earlier element first */
static inline bool before_f(double a, double b, bool desc)
{
    bool an = a != a, bn = b != b;
    if (desc) {
        if (an) return !bn;
        if (bn) return false;
        return a > b;
    }
    if (an) return false;
    if (bn) return true;
    return a < b;
}

static inline bool before_i(int64_t a, int64_t b, bool desc)
{
    return desc ? a > b : a < b;
}

static void merge_sort(skey *a, skey *tmp, int64_t n, bool ints, bool desc)
{
    skey *src = a, *dst = tmp;
    for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            int64_t mid = lo + w < n ? lo + w : n;
            int64_t hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                /* take from the right only when it is strictly before the left: stable */
                bool right = ints ? before_i(src[j].k.i, src[i].k.i, desc)
                                  : before_f(src[j].k.d, src[i].k.d, desc);
                dst[k++] = right ? src[j++] : src[i++];
            }
            while (i < mid)
                dst[k++] = src[i++];
            while (j < hi)
                dst[k++] = src[j++];
        }
        skey *t = src;
        src = dst;
        dst = t;
    }
    if (src != a)
        memcpy(a, src, (size_t)n * sizeof *a);
}

typedef struct sort_job {
    kiln__cpu_ctx *ctx;
    const kiln_tdesc *values, *indices, *in;
    int dim;
    bool desc;
    int failed;
} sort_job;

static void sort_range(void *argp, int64_t b, int64_t e)
{
    sort_job *j = argp;
    const kiln_tdesc *in = j->in;
    int dim = j->dim;
    int64_t n = in->shape[dim];
    bool ints = kiln__cpu_is_int(in->dtype);
    struct kiln_buffer *h;
    skey *keys = kiln__cpu_scratch_get(j->ctx, 2 * (size_t)n * sizeof(skey), &h);
    if (!keys) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED); /* several threads may fail */
        return;
    }
    int64_t ies = (int64_t)kiln__cpu_esize(in->dtype), ist = in->strides[dim];
    for (int64_t l = b; l < e; l++) {
        const char *p = (const char *)kiln__cpu_ptr(in) + kiln__cpu_line_offset(in, dim, l) * ies;
        for (int64_t i = 0; i < n; i++) {
            if (ints)
                keys[i].k.i = kiln__cpu_ldi(p + i * ist * ies, in->dtype);
            else
                keys[i].k.d = kiln__cpu_ld(p + i * ist * ies, in->dtype);
            keys[i].idx = i;
        }
        merge_sort(keys, keys + n, n, ints, j->desc);
        if (j->values) {
            const kiln_tdesc *v = j->values;
            int64_t ves = (int64_t)kiln__cpu_esize(v->dtype), vst = v->strides[dim];
            char *q = (char *)kiln__cpu_ptr(v) + kiln__cpu_line_offset(v, dim, l) * ves;
            /* copy the original element bytes: exact for every dtype, NaN payloads included */
            for (int64_t i = 0; i < n; i++) {
                const char *src = p + keys[i].idx * ist * ies;
                if (v->dtype == in->dtype)
                    memcpy(q + i * vst * ves, src, (size_t)ves);
                else if (ints)
                    kiln__cpu_sti(q + i * vst * ves, v->dtype, keys[i].k.i);
                else
                    kiln__cpu_st(q + i * vst * ves, v->dtype, keys[i].k.d);
            }
        }
        if (j->indices) {
            const kiln_tdesc *x = j->indices;
            int64_t xst = x->strides[dim];
            int64_t *q = (int64_t *)kiln__cpu_ptr(x) + kiln__cpu_line_offset(x, dim, l);
            for (int64_t i = 0; i < n; i++)
                q[i * xst] = keys[i].idx;
        }
    }
    kiln__cpu_scratch_put(j->ctx, h);
}

int kiln__cpu_sort(void *vctx, const kiln_tdesc *values, const kiln_tdesc *indices,
                   const kiln_tdesc *in, int dim, bool descending)
{
    if (dim < 0 || dim >= in->ndim)
        return kiln__error_set("cpu sort: dim %d out of range", dim), KILN_EINVAL;
    if (kiln__cpu_numel(in) == 0)
        return 0;
    sort_job j = {vctx, values, indices, in, dim, descending, 0};
    int64_t n = in->shape[dim];
    kiln__cpu_parallel_for(vctx, kiln__cpu_nlines(in, dim), 1 + 4096 / n, sort_range, &j);
    if (j.failed)
        return kiln__cpu_enomem("sort");
    return 0;
}
