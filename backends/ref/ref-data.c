/*
 * backends/ref/ref-data.c — the strided iterator every ref op walks with, the flat
 * double staging helpers, and the creation and data-movement primitives (fill, arange,
 * copy, rng).
 *
 * Conversions follow one rule so that copy agrees with every other op: integer sources
 * go to integer destinations through int64 (exact, then wrapped) and to floating ones
 * with a single rounding; floating sources go through double (exact for every stored
 * float) and are rounded once on store.
 */
#include <stdlib.h>

#include "common/philox.h"
#include "ref-impl.h"

/* ------------------------------------------------------------------ iterator */

int64_t kiln__ref_iter_init(ref_iter *it, int ndim, const int64_t *shape)
{
    it->ndim = ndim;
    it->nops = 0;
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        it->shape[d] = shape[d];
        it->idx[d] = 0;
        n *= shape[d];
    }
    return n;
}

int kiln__ref_iter_add(ref_iter *it, int64_t offset, const int64_t *strides)
{
    int k = it->nops++;
    it->off[k] = offset;
    for (int d = 0; d < it->ndim; d++)
        it->strides[k][d] = strides[d];
    return k;
}

int kiln__ref_iter_add_t(ref_iter *it, const kiln_tdesc *t)
{
    return kiln__ref_iter_add(it, t->offset, t->strides);
}

void kiln__ref_iter_next(ref_iter *it)
{
    /* Odometer: bump the last dim; on wrap-around undo that dim's whole travel and
     * carry into the next one. Each element costs O(1) amortized. */
    for (int d = it->ndim - 1; d >= 0; d--) {
        it->idx[d]++;
        for (int k = 0; k < it->nops; k++)
            it->off[k] += it->strides[k][d];
        if (it->idx[d] < it->shape[d])
            return;
        for (int k = 0; k < it->nops; k++)
            it->off[k] -= it->strides[k][d] * it->shape[d];
        it->idx[d] = 0;
    }
}

int64_t kiln__ref_numel(const kiln_tdesc *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    return n;
}

double *kiln__ref_zeros(int64_t n, const char *op)
{
    double *p = calloc(n > 0 ? (size_t)n : 1, sizeof *p);
    if (!p)
        kiln__ref_enomem(op);
    return p;
}

double *kiln__ref_read_flat(const kiln_tdesc *t, const char *op)
{
    ref_iter it;
    int64_t n = ref_iter_init(&it, t->ndim, t->shape);
    ref_iter_add_t(&it, t);
    double *p = ref_zeros(n, op);
    if (!p)
        return NULL;
    const unsigned char *base = ref_data(t);
    for (int64_t i = 0; i < n; i++, ref_iter_next(&it))
        p[i] = ref_getf(t->dtype, base, it.off[0]);
    return p;
}

void kiln__ref_write_flat(const kiln_tdesc *t, const double *src)
{
    ref_iter it;
    int64_t n = ref_iter_init(&it, t->ndim, t->shape);
    ref_iter_add_t(&it, t);
    unsigned char *base = ref_data(t);
    for (int64_t i = 0; i < n; i++, ref_iter_next(&it))
        ref_setf(t->dtype, base, it.off[0], src[i]);
}

/* ------------------------------------------------------------ fill / arange */

int kiln__ref_fill(void *ctx, const kiln_tdesc *out, double value)
{
    ref_iter it;
    int64_t n = ref_iter_init(&it, out->ndim, out->shape);
    ref_iter_add_t(&it, out);
    unsigned char *base = ref_data(out);
    for (int64_t i = 0; i < n; i++, ref_iter_next(&it))
        ref_setf(out->dtype, base, it.off[0], value);
    return 0;
}

static bool is_integral(double v)
{
    return isfinite(v) && v == floor(v) && fabs(v) < 9223372036854775808.0;
}

int kiln__ref_arange(void *ctx, const kiln_tdesc *out, double start, double step)
{
    ref_iter it;
    int64_t n = ref_iter_init(&it, out->ndim, out->shape);
    ref_iter_add_t(&it, out);
    unsigned char *base = ref_data(out);
    /* Integer outputs with integral start and step count in int64, so large ranges
     * stay exact; everything else computes start + i * step in double. */
    bool exact = !ref_is_float(out->dtype) && is_integral(start) && is_integral(step);
    for (int64_t i = 0; i < n; i++, ref_iter_next(&it)) {
        if (exact)
            ref_seti(out->dtype, base, it.off[0],
                     ref_wadd((int64_t)start, ref_wmul(i, (int64_t)step)));
        else
            ref_setf(out->dtype, base, it.off[0], start + (double)i * step);
    }
    return 0;
}

/* ---------------------------------------------------------------------- copy */

int kiln__ref_copy(void *ctx, const kiln_tdesc *out, const kiln_tdesc *in)
{
    ref_iter it;
    int64_t n = ref_iter_init(&it, out->ndim, out->shape);
    ref_iter_add_t(&it, out);
    ref_iter_add_t(&it, in);
    unsigned char *ob = ref_data(out);
    const unsigned char *ib = ref_data(in);
    for (int64_t i = 0; i < n; i++, ref_iter_next(&it))
        ref_move(out->dtype, ob, it.off[0], in->dtype, ib, it.off[1]);
    return 0;
}

/* ----------------------------------------------------------------------- rng */

int kiln__ref_rng(void *ctx, kiln_rng_kind kind, const kiln_tdesc *out, uint64_t seed,
                  uint64_t offset, double p0, double p1)
{
    if ((unsigned)kind >= KILN_RNG_COUNT)
        return ref_fail(KILN_EINVAL, "ref rng: unknown kind %d", (int)kind);
    int64_t lo = 0, hi = 0;
    if (kind == KILN_RNG_INT) {
        if (!(p0 >= -9007199254740992.0 && p1 <= 9007199254740992.0)) /* backend.h: within 2^53 */
            return ref_fail(KILN_EINVAL, "ref rng: integer range [%g, %g) exceeds 2^53", p0, p1);
        lo = ref_d2i(p0);
        hi = ref_d2i(p1);
        if (hi <= lo)
            return ref_fail(KILN_EINVAL, "ref rng: empty integer range [%" PRId64 ", %" PRId64 ")",
                            lo, hi);
    }
    ref_iter it;
    int64_t n = ref_iter_init(&it, out->ndim, out->shape);
    ref_iter_add_t(&it, out);
    unsigned char *base = ref_data(out);
    /* Element i (flat, row-major) always uses counter offset + i: that is what makes a
     * draw identical on every backend. */
    for (int64_t i = 0; i < n; i++, ref_iter_next(&it)) {
        uint64_t counter = offset + (uint64_t)i;
        switch (kind) {
        case KILN_RNG_UNIFORM:
            ref_setf(out->dtype, base, it.off[0],
                     p0 + (p1 - p0) * kiln_rng_uniform01(counter, seed));
            break;
        case KILN_RNG_NORMAL:
            ref_setf(out->dtype, base, it.off[0], p0 + p1 * kiln_rng_normal01(counter, seed));
            break;
        case KILN_RNG_BERNOULLI:
            ref_seti(out->dtype, base, it.off[0], kiln_rng_uniform01(counter, seed) < p0);
            break;
        case KILN_RNG_INT:
            ref_seti(out->dtype, base, it.off[0], kiln_rng_int(counter, seed, lo, hi));
            break;
        default:
            break;
        }
    }
    return 0;
}
