/*
 * backends/cpu/cpu-index.c — gather, scatter, index_select and index_add.
 *
 * All four walk "lines" along the indexed dim: a line is one position in every other
 * dim, and the index tensor (or the output, for index_select) decides which positions
 * exist. Lines are independent — two lines never touch the same output element, since
 * they differ in a non-indexed coordinate — so they are spread over the thread pool
 * even for scatter with accumulation, where duplicates within a line are summed in
 * order by one thread. Elements move as raw bytes when the dtypes agree (exact for
 * every dtype) and through double/int64 otherwise. Negative indices count from the end.
 */
#include "cpu-impl.h"

/* Offset of line l of `shape_of` (row-major over dims other than dim) in a view with
 * strides `st`. */
static inline int64_t line_off(const kiln_tdesc *shape_of, int dim, int64_t l, const int64_t *st)
{
    int64_t off = 0;
    for (int i = shape_of->ndim - 1; i >= 0; i--) {
        if (i == dim)
            continue;
        int64_t n = shape_of->shape[i];
        off += (l % n) * st[i];
        l /= n;
    }
    return off;
}

static inline int64_t fix_index(int64_t v, int64_t n)
{
    return v < 0 ? v + n : v;
}

static inline void move_elem(char *dst, kiln_dtype dd, const char *src, kiln_dtype sd, size_t es)
{
    if (dd == sd)
        memcpy(dst, src, es);
    else if (kiln__cpu_is_int(sd))
        kiln__cpu_sti(dst, dd, kiln__cpu_ldi(src, sd));
    else
        kiln__cpu_st(dst, dd, kiln__cpu_ld(src, sd));
}

static inline void add_elem(char *dst, kiln_dtype dd, const char *src, kiln_dtype sd)
{
    if (dd == KILN_F32 && sd == KILN_F32) {
        *(float *)dst += *(const float *)src;
    } else if (kiln__cpu_is_int(dd)) {
        uint64_t s = (uint64_t)kiln__cpu_ldi(dst, dd) + (uint64_t)kiln__cpu_ldi(src, sd);
        kiln__cpu_sti(dst, dd, dd == KILN_BOOL ? (s != 0) : (int64_t)s);
    } else {
        kiln__cpu_st(dst, dd, kiln__cpu_ld(dst, dd) + kiln__cpu_ld(src, sd));
    }
}

typedef struct ix_job {
    const kiln_tdesc *out, *in, *index, *src;
    int dim;
    bool accumulate;
} ix_job;

/* ------------------------------------------------------------------ gather */

static void gather_range(void *argp, int64_t b, int64_t e)
{
    const ix_job *j = argp;
    const kiln_tdesc *out = j->out, *in = j->in, *ix = j->index;
    int dim = j->dim;
    int64_t n = ix->shape[dim], lim = in->shape[dim];
    size_t oes = kiln__cpu_esize(out->dtype), ies = kiln__cpu_esize(in->dtype);
    for (int64_t l = b; l < e; l++) {
        const int64_t *ip = (const int64_t *)kiln__cpu_ptr(ix) + line_off(ix, dim, l, ix->strides);
        char *op = (char *)kiln__cpu_ptr(out) + line_off(ix, dim, l, out->strides) * (int64_t)oes;
        const char *sp = (const char *)kiln__cpu_ptr(in) + line_off(ix, dim, l, in->strides) * (int64_t)ies;
        for (int64_t i = 0; i < n; i++) {
            int64_t k = fix_index(ip[i * ix->strides[dim]], lim);
            move_elem(op + i * out->strides[dim] * (int64_t)oes, out->dtype,
                      sp + k * in->strides[dim] * (int64_t)ies, in->dtype, oes);
        }
    }
}

int kiln__cpu_gather(void *vctx, const kiln_tdesc *out, const kiln_tdesc *in, int dim,
                     const kiln_tdesc *index)
{
    if (dim < 0 || dim >= in->ndim)
        return kiln__error_set("cpu gather: dim %d out of range", dim), KILN_EINVAL;
    if (kiln__cpu_numel(index) == 0)
        return 0;
    ix_job j = {out, in, index, NULL, dim, false};
    int64_t n = index->shape[dim] ? index->shape[dim] : 1;
    kiln__cpu_parallel_for(vctx, kiln__cpu_nlines(index, dim), 1 + 16384 / n, gather_range, &j);
    return 0;
}

/* ------------------------------------------------------------------ scatter */

static void scatter_range(void *argp, int64_t b, int64_t e)
{
    const ix_job *j = argp;
    const kiln_tdesc *out = j->out, *src = j->src, *ix = j->index;
    int dim = j->dim;
    int64_t n = ix->shape[dim], lim = out->shape[dim];
    size_t oes = kiln__cpu_esize(out->dtype), ses = kiln__cpu_esize(src->dtype);
    for (int64_t l = b; l < e; l++) {
        const int64_t *ip = (const int64_t *)kiln__cpu_ptr(ix) + line_off(ix, dim, l, ix->strides);
        char *op = (char *)kiln__cpu_ptr(out) + line_off(ix, dim, l, out->strides) * (int64_t)oes;
        const char *sp = (const char *)kiln__cpu_ptr(src) + line_off(ix, dim, l, src->strides) * (int64_t)ses;
        for (int64_t i = 0; i < n; i++) {
            int64_t k = fix_index(ip[i * ix->strides[dim]], lim);
            char *d = op + k * out->strides[dim] * (int64_t)oes;
            const char *s = sp + i * src->strides[dim] * (int64_t)ses;
            if (j->accumulate)
                add_elem(d, out->dtype, s, src->dtype);
            else
                move_elem(d, out->dtype, s, src->dtype, oes);
        }
    }
}

int kiln__cpu_scatter(void *vctx, const kiln_tdesc *out, int dim, const kiln_tdesc *index,
                      const kiln_tdesc *src, bool accumulate)
{
    if (dim < 0 || dim >= out->ndim)
        return kiln__error_set("cpu scatter: dim %d out of range", dim), KILN_EINVAL;
    if (kiln__cpu_numel(index) == 0)
        return 0;
    ix_job j = {out, NULL, index, src, dim, accumulate};
    int64_t n = index->shape[dim] ? index->shape[dim] : 1;
    kiln__cpu_parallel_for(vctx, kiln__cpu_nlines(index, dim), 1 + 16384 / n, scatter_range, &j);
    return 0;
}

/* ------------------------------------------------------------------ index_select */

/* out has in's shape except along dim, where it has len(index). Lines run along dim of
 * out; the contiguous case instead copies whole inner blocks. */
static void isel_range(void *argp, int64_t b, int64_t e)
{
    const ix_job *j = argp;
    const kiln_tdesc *out = j->out, *in = j->in, *ix = j->index;
    int dim = j->dim;
    int64_t n = out->shape[dim], lim = in->shape[dim];
    int64_t xs = ix->ndim ? ix->strides[0] : 0;
    const int64_t *ip = kiln__cpu_ptr(ix);
    size_t oes = kiln__cpu_esize(out->dtype), ies = kiln__cpu_esize(in->dtype);
    for (int64_t l = b; l < e; l++) {
        char *op = (char *)kiln__cpu_ptr(out) + line_off(out, dim, l, out->strides) * (int64_t)oes;
        const char *sp = (const char *)kiln__cpu_ptr(in) + line_off(out, dim, l, in->strides) * (int64_t)ies;
        for (int64_t i = 0; i < n; i++) {
            int64_t k = fix_index(ip[i * xs], lim);
            move_elem(op + i * out->strides[dim] * (int64_t)oes, out->dtype,
                      sp + k * in->strides[dim] * (int64_t)ies, in->dtype, oes);
        }
    }
}

typedef struct isel_block_job {
    char *o;
    const char *x;
    const int64_t *ip;
    int64_t xs, n, lim, inner_bytes, in_dim_bytes;
} isel_block_job;

static void isel_block_range(void *argp, int64_t b, int64_t e)
{
    const isel_block_job *j = argp;
    for (int64_t r = b; r < e; r++) {
        int64_t outer = r / j->n, i = r % j->n;
        int64_t k = fix_index(j->ip[i * j->xs], j->lim);
        memcpy(j->o + r * j->inner_bytes, j->x + outer * j->in_dim_bytes + k * j->inner_bytes,
               (size_t)j->inner_bytes);
    }
}

int kiln__cpu_index_select(void *vctx, const kiln_tdesc *out, const kiln_tdesc *in, int dim,
                           const kiln_tdesc *index)
{
    if (dim < 0 || dim >= in->ndim)
        return kiln__error_set("cpu index_select: dim %d out of range", dim), KILN_EINVAL;
    if (kiln__cpu_numel(out) == 0)
        return 0;
    if (out->dtype == in->dtype && kiln__cpu_contig(out) && kiln__cpu_contig(in)) {
        /* embedding-style: copy rows of `inner` contiguous elements */
        int64_t inner = 1, outer = 1;
        for (int d = dim + 1; d < in->ndim; d++)
            inner *= in->shape[d];
        for (int d = 0; d < dim; d++)
            outer *= in->shape[d];
        size_t es = kiln__cpu_esize(in->dtype);
        isel_block_job bj = {kiln__cpu_ptr(out), kiln__cpu_ptr(in), kiln__cpu_ptr(index),
                             index->ndim ? index->strides[0] : 0, out->shape[dim], in->shape[dim],
                             inner * (int64_t)es, in->shape[dim] * inner * (int64_t)es};
        kiln__cpu_parallel_for(vctx, outer * out->shape[dim], 1 + 65536 / (inner * (int64_t)es + 1),
                               isel_block_range, &bj);
        return 0;
    }
    ix_job j = {out, in, index, NULL, dim, false};
    int64_t n = out->shape[dim] ? out->shape[dim] : 1;
    kiln__cpu_parallel_for(vctx, kiln__cpu_nlines(out, dim), 1 + 16384 / n, isel_range, &j);
    return 0;
}

/* ------------------------------------------------------------------ index_add */

static void iadd_range(void *argp, int64_t b, int64_t e)
{
    const ix_job *j = argp;
    const kiln_tdesc *out = j->out, *src = j->src, *ix = j->index;
    int dim = j->dim;
    int64_t n = src->shape[dim], lim = out->shape[dim];
    int64_t xs = ix->ndim ? ix->strides[0] : 0;
    const int64_t *ip = kiln__cpu_ptr(ix);
    size_t oes = kiln__cpu_esize(out->dtype), ses = kiln__cpu_esize(src->dtype);
    for (int64_t l = b; l < e; l++) {
        char *op = (char *)kiln__cpu_ptr(out) + line_off(src, dim, l, out->strides) * (int64_t)oes;
        const char *sp = (const char *)kiln__cpu_ptr(src) + line_off(src, dim, l, src->strides) * (int64_t)ses;
        for (int64_t i = 0; i < n; i++) {
            int64_t k = fix_index(ip[i * xs], lim);
            add_elem(op + k * out->strides[dim] * (int64_t)oes, out->dtype,
                     sp + i * src->strides[dim] * (int64_t)ses, src->dtype);
        }
    }
}

int kiln__cpu_index_add(void *vctx, const kiln_tdesc *out, int dim, const kiln_tdesc *index,
                        const kiln_tdesc *src)
{
    if (dim < 0 || dim >= out->ndim)
        return kiln__error_set("cpu index_add: dim %d out of range", dim), KILN_EINVAL;
    if (kiln__cpu_numel(src) == 0)
        return 0;
    ix_job j = {out, NULL, index, src, dim, true};
    int64_t n = src->shape[dim] ? src->shape[dim] : 1;
    kiln__cpu_parallel_for(vctx, kiln__cpu_nlines(src, dim), 1 + 16384 / n, iadd_range, &j);
    return 0;
}

/* The range check of an index where it lives. The cpu backend finishes its work at
 * submission, so a violation is reported at once rather than at the next sync. */
int kiln__cpu_index_check(void *ctx, const kiln_tdesc *index, int64_t lo, int64_t hi, const char *op,
                          const char *noun)
{
    int64_t n = 1, idx[KILN_MAX_DIMS] = {0};
    for (int d = 0; d < index->ndim; d++)
        n *= index->shape[d];
    const char *base = kiln__cpu_ptr(index);
    size_t es = kiln__cpu_esize(index->dtype);
    int64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t v = kiln__cpu_ldi(base + off * (int64_t)es, index->dtype);
        if (v < lo || v >= hi)
            return kiln__index_error(op, noun, v, lo, hi);
        for (int d = index->ndim - 1; d >= 0; d--) {
            off += index->strides[d];
            if (++idx[d] < index->shape[d])
                break;
            off -= index->strides[d] * index->shape[d];
            idx[d] = 0;
        }
    }
    return 0;
}
