/*
 * backends/cpu/cpu-iter.c — strided iteration, and moving views in and out of
 * contiguous scratch.
 *
 * Every elementwise entry describes its operands as strided views of one shape. The
 * iterator drops size-1 dims and merges neighbours whose strides allow it in every
 * operand, so contiguous operands (and row-broadcast ones) collapse into long rows; the
 * kernels then see a pointer and a stride per operand and pick their fast path when the
 * strides are 1 (or 0 for a broadcast scalar). Threading splits the flat element range,
 * not the rows, so one long row is still shared by all threads.
 */
#include <stdlib.h>

#include "cpu-impl.h"

void kiln__cpu_iter_init(kiln__cpu_iter *it, int nops, const kiln_tdesc *const *ops)
{
    memset(it, 0, sizeof *it);
    it->nops = nops;
    const kiln_tdesc *o = ops[0];
    it->numel = kiln__cpu_numel(o);
    for (int i = 0; i < nops; i++) {
        it->esize[i] = kiln__cpu_esize(ops[i]->dtype);
        it->base[i] = (char *)kiln__cpu_ptr(ops[i]);
    }
    int nd = 0;
    for (int d = 0; d < o->ndim; d++) {
        if (o->shape[d] == 1)
            continue;
        if (nd > 0) {
            bool merge = true;
            for (int i = 0; i < nops; i++)
                if (it->stride[i][nd - 1] != ops[i]->strides[d] * o->shape[d])
                    merge = false;
            if (merge) {
                it->shape[nd - 1] *= o->shape[d];
                for (int i = 0; i < nops; i++)
                    it->stride[i][nd - 1] = ops[i]->strides[d];
                continue;
            }
        }
        it->shape[nd] = o->shape[d];
        for (int i = 0; i < nops; i++)
            it->stride[i][nd] = ops[i]->strides[d];
        nd++;
    }
    if (nd == 0) {
        it->shape[0] = 1;
        for (int i = 0; i < nops; i++)
            it->stride[i][0] = 1;
        nd = 1;
    }
    it->ndim = nd;
}

typedef struct iter_job {
    const kiln__cpu_iter *it;
    kiln__cpu_row_fn fn;
    void *arg;
} iter_job;

static void iter_range(void *argp, int64_t begin, int64_t end)
{
    iter_job *j = argp;
    const kiln__cpu_iter *it = j->it;
    int nd = it->ndim, nops = it->nops;
    int64_t idx[KILN_MAX_DIMS];
    int64_t rem = begin;
    for (int d = nd - 1; d >= 0; d--) {
        idx[d] = rem % it->shape[d];
        rem /= it->shape[d];
    }
    char *ptrs[KILN_CPU_MAXOPS];
    int64_t inner[KILN_CPU_MAXOPS];
    for (int i = 0; i < nops; i++) {
        int64_t off = 0;
        for (int d = 0; d < nd; d++)
            off += idx[d] * it->stride[i][d];
        ptrs[i] = it->base[i] + off * (int64_t)it->esize[i];
        inner[i] = it->stride[i][nd - 1];
    }
    int64_t pos = begin;
    while (pos < end) {
        int64_t n = it->shape[nd - 1] - idx[nd - 1];
        if (n > end - pos)
            n = end - pos;
        j->fn(j->arg, ptrs, inner, n);
        pos += n;
        if (pos >= end)
            break;
        /* advance the multi-index by n along the last dim, carrying */
        idx[nd - 1] += n;
        for (int i = 0; i < nops; i++)
            ptrs[i] += n * inner[i] * (int64_t)it->esize[i];
        for (int d = nd - 1; d > 0 && idx[d] == it->shape[d]; d--) {
            idx[d] = 0;
            idx[d - 1]++;
            for (int i = 0; i < nops; i++)
                ptrs[i] += (it->stride[i][d - 1] - it->shape[d] * it->stride[i][d]) *
                           (int64_t)it->esize[i];
        }
    }
}

void kiln__cpu_iter_run(kiln__cpu_ctx *ctx, const kiln__cpu_iter *it, int64_t grain,
                        kiln__cpu_row_fn fn, void *arg)
{
    if (it->numel <= 0)
        return;
    iter_job j = {it, fn, arg};
    kiln__cpu_parallel_for(ctx, it->numel, grain, iter_range, &j);
}

void kiln__cpu_desc_contig(kiln_tdesc *d, struct kiln_buffer *buf, kiln_dtype dt, int ndim,
                           const int64_t *shape)
{
    memset(d, 0, sizeof *d);
    d->buf = buf;
    d->dtype = dt;
    d->ndim = ndim;
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        d->shape[i] = shape[i];
        d->strides[i] = s;
        s *= shape[i];
    }
}

void *kiln__cpu_materialize(kiln__cpu_ctx *ctx, const kiln_tdesc *d, kiln_dtype want,
                            struct kiln_buffer **handle)
{
    *handle = NULL;
    if (d->dtype == want && kiln__cpu_contig(d))
        return kiln__cpu_ptr(d);
    int64_t n = kiln__cpu_numel(d);
    struct kiln_buffer *b = kiln__cpu_buffer_get(ctx, (size_t)n * kiln__cpu_esize(want) + 64);
    if (!b)
        return NULL;
    kiln_tdesc t;
    kiln__cpu_desc_contig(&t, b, want, d->ndim, d->shape);
    kiln__cpu_copy(ctx, &t, d);
    *handle = b;
    return b->data;
}

void kiln__cpu_writeback(kiln__cpu_ctx *ctx, const kiln_tdesc *out, const void *src, kiln_dtype have)
{
    if (out->dtype == have && kiln__cpu_contig(out) && kiln__cpu_ptr(out) == src)
        return;
    struct kiln_buffer fake = {.data = (void *)src};
    kiln_tdesc t;
    kiln__cpu_desc_contig(&t, &fake, have, out->ndim, out->shape);
    kiln__cpu_copy(ctx, out, &t);
}
