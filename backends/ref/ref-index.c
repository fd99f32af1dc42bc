/*
 * backends/ref/ref-index.c — gather, scatter, index_select, index_add and pad.
 *
 * The trick used throughout: the operand that is addressed through an index is attached
 * to the iterator with a 0 stride on the indexed dim, so the iterator supplies the
 * offset of every other coordinate and the op only adds index * stride[dim]. Values are
 * moved, not recomputed (ref_move), so gather/select/pad are exact for every dtype;
 * the accumulating forms add in int64 for integer outputs and in double otherwise.
 *
 * The front end checks index ranges; a negative index is still wrapped once (as Python
 * would) because it costs nothing here.
 */
#include "ref-impl.h"

static int64_t index_at(const kiln_tdesc *index, int64_t off, int64_t size)
{
    int64_t v = ref_geti(index->dtype, ref_data(index), off);
    return v < 0 ? v + size : v;
}

/** Attach t with its stride on `dim` zeroed; the caller adds the indexed part. */
static int add_without_dim(ref_iter *it, const kiln_tdesc *t, int dim)
{
    int64_t st[KILN_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++)
        st[d] = d == dim ? 0 : t->strides[d];
    return ref_iter_add(it, t->offset, st);
}

/** out[o] += src[s] for one element, in the output's domain. */
static void accumulate(const kiln_tdesc *out, int64_t o, const kiln_tdesc *src, int64_t s)
{
    unsigned char *ob = ref_data(out);
    const unsigned char *sb = ref_data(src);
    if (ref_is_float(out->dtype))
        ref_setf(out->dtype, ob, o, ref_getf(out->dtype, ob, o) + ref_getf(src->dtype, sb, s));
    else
        ref_seti(out->dtype, ob, o,
                 ref_wadd(ref_geti(out->dtype, ob, o), ref_geti(src->dtype, sb, s)));
}

int kiln__ref_gather(void *ctx, const kiln_tdesc *out, const kiln_tdesc *in, int dim,
                     const kiln_tdesc *index)
{
    ref_iter it;
    int64_t n = ref_iter_init(&it, out->ndim, out->shape);
    ref_iter_add_t(&it, out);
    ref_iter_add_t(&it, index);
    add_without_dim(&it, in, dim);
    for (int64_t i = 0; i < n; i++, ref_iter_next(&it)) {
        int64_t j = index_at(index, it.off[1], in->shape[dim]);
        ref_move(out->dtype, ref_data(out), it.off[0], in->dtype, ref_data(in),
                 it.off[2] + j * in->strides[dim]);
    }
    return 0;
}

int kiln__ref_scatter(void *ctx, const kiln_tdesc *out, int dim, const kiln_tdesc *index,
                      const kiln_tdesc *src, bool accumulate_)
{
    /* Walk index's shape; src may be larger than index, as torch.scatter allows. */
    ref_iter it;
    int64_t n = ref_iter_init(&it, index->ndim, index->shape);
    ref_iter_add_t(&it, index);
    ref_iter_add_t(&it, src);
    add_without_dim(&it, out, dim);
    for (int64_t i = 0; i < n; i++, ref_iter_next(&it)) {
        int64_t o = it.off[2] + index_at(index, it.off[0], out->shape[dim]) * out->strides[dim];
        if (accumulate_)
            accumulate(out, o, src, it.off[1]);
        else
            ref_move(out->dtype, ref_data(out), o, src->dtype, ref_data(src), it.off[1]);
    }
    return 0;
}

int kiln__ref_index_select(void *ctx, const kiln_tdesc *out, const kiln_tdesc *in, int dim,
                           const kiln_tdesc *index)
{
    ref_iter it;
    int64_t n = ref_iter_init(&it, out->ndim, out->shape);
    ref_iter_add_t(&it, out);
    add_without_dim(&it, in, dim);
    for (int64_t i = 0; i < n; i++, ref_iter_next(&it)) {
        int64_t j = index_at(index, index->offset + it.idx[dim] * index->strides[0],
                             in->shape[dim]);
        ref_move(out->dtype, ref_data(out), it.off[0], in->dtype, ref_data(in),
                 it.off[1] + j * in->strides[dim]);
    }
    return 0;
}

int kiln__ref_index_add(void *ctx, const kiln_tdesc *out, int dim, const kiln_tdesc *index,
                        const kiln_tdesc *src)
{
    ref_iter it;
    int64_t n = ref_iter_init(&it, src->ndim, src->shape);
    ref_iter_add_t(&it, src);
    add_without_dim(&it, out, dim);
    for (int64_t i = 0; i < n; i++, ref_iter_next(&it)) {
        int64_t j = index_at(index, index->offset + it.idx[dim] * index->strides[0],
                             out->shape[dim]);
        accumulate(out, it.off[1] + j * out->strides[dim], src, it.off[0]);
    }
    return 0;
}

/* ---------------------------------------------------------------------- pad */

int kiln__ref_pad(void *ctx, kiln_pad_mode mode, const kiln_tdesc *out, const kiln_tdesc *in,
                  const int64_t *pads, double value)
{
    if (mode != KILN_PAD_CONSTANT && mode != KILN_PAD_REFLECT && mode != KILN_PAD_REPLICATE)
        return ref_fail(KILN_EINVAL, "ref pad: unknown mode %d", (int)mode);
    for (int d = 0; d < in->ndim; d++) {
        if (mode == KILN_PAD_REFLECT && (pads[2 * d] != 0 || pads[2 * d + 1] != 0) &&
            (pads[2 * d] >= in->shape[d] || pads[2 * d + 1] >= in->shape[d]))
            return ref_fail(KILN_EINVAL, "ref pad: reflect padding of dim %d must be below its size %" PRId64,
                            d, in->shape[d]);
        if (mode == KILN_PAD_REPLICATE && in->shape[d] == 0 && out->shape[d] > 0)
            return ref_fail(KILN_EINVAL, "ref pad: cannot replicate an empty dim %d", d);
    }
    ref_iter it;
    int64_t n = ref_iter_init(&it, out->ndim, out->shape);
    ref_iter_add_t(&it, out);
    unsigned char *ob = ref_data(out);
    for (int64_t i = 0; i < n; i++, ref_iter_next(&it)) {
        /* Map each output coordinate back to the input; pads may be negative (crop). */
        int64_t src = in->offset;
        bool inside = true;
        for (int d = 0; d < out->ndim && inside; d++) {
            int64_t s = it.idx[d] - pads[2 * d], len = in->shape[d];
            if (s < 0 || s >= len) {
                if (mode == KILN_PAD_CONSTANT)
                    inside = false;
                else if (mode == KILN_PAD_REFLECT)
                    s = s < 0 ? -s : 2 * (len - 1) - s;
                else
                    s = s < 0 ? 0 : len - 1;
            }
            src += s * in->strides[d];
        }
        if (inside)
            ref_move(out->dtype, ob, it.off[0], in->dtype, ref_data(in), src);
        else
            ref_setf(out->dtype, ob, it.off[0], value);
    }
    return 0;
}

/* The range check of an index, done where the index lives. ref finishes its work at
 * submission, so the violation is reported at once rather than at the next sync. */
int kiln__ref_index_check(void *ctx, const kiln_tdesc *index, int64_t lo, int64_t hi, const char *op,
                          const char *noun)
{
    ref_iter it;
    int64_t n = ref_iter_init(&it, index->ndim, index->shape);
    ref_iter_add_t(&it, index);
    for (int64_t i = 0; i < n; i++, ref_iter_next(&it)) {
        int64_t v = ref_geti(index->dtype, ref_data(index), it.off[0]);
        if (v < lo || v >= hi)
            return kiln__index_error(op, noun, v, lo, hi);
    }
    return 0;
}
