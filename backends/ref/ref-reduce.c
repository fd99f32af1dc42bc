/*
 * backends/ref/ref-reduce.c — reductions, arg-reductions, cumsum and sort.
 *
 * reduce walks out (keepdim shape) with an outer iterator and, for each output element,
 * copies the reduced elements into a scratch array with an inner iterator over the
 * reduced dims only. Working on a gathered array keeps each formula textbook-plain:
 * variance is two-pass (mean, then squared deviations), logsumexp subtracts the max
 * first. Every input element is visited once per pass, so the cost stays linear.
 *
 * PyTorch's conventions: max/min and argmax/argmin let NaN win (argmax/argmin report
 * the first NaN); var divides by max(0, N - correction), so a non-positive denominator
 * gives inf or NaN; logsumexp of all -inf is -inf; sort is stable and orders NaN after
 * every number (before them when descending). Integer sums and products wrap in int64.
 */
#include <stdlib.h>

#include "ref-impl.h"

/* ------------------------------------------------------------------ reduce */

static double reduce_f(kiln_reduce_op op, const double *v, int64_t n, double param)
{
    switch (op) {
    case KILN_REDUCE_SUM:
    case KILN_REDUCE_MEAN: {
        double s = 0;
        for (int64_t i = 0; i < n; i++)
            s += v[i];
        return op == KILN_REDUCE_SUM ? s : s / (double)n; /* empty mean: 0/0 = NaN */
    }
    case KILN_REDUCE_PROD: {
        double p = 1;
        for (int64_t i = 0; i < n; i++)
            p *= v[i];
        return p;
    }
    case KILN_REDUCE_MAX:
    case KILN_REDUCE_MIN: {
        double m = v[0];
        for (int64_t i = 1; i < n && !isnan(m); i++) {
            if (isnan(v[i]) || (op == KILN_REDUCE_MAX ? v[i] > m : v[i] < m))
                m = v[i];
        }
        return m;
    }
    case KILN_REDUCE_VAR:
    case KILN_REDUCE_STD: {
        double mean = 0, m2 = 0;
        for (int64_t i = 0; i < n; i++)
            mean += v[i];
        mean /= (double)n;
        for (int64_t i = 0; i < n; i++)
            m2 += (v[i] - mean) * (v[i] - mean);
        double denom = (double)n - param;
        double var = m2 / (denom > 0 ? denom : 0.0);
        return op == KILN_REDUCE_VAR ? var : sqrt(var);
    }
    case KILN_REDUCE_LOGSUMEXP: {
        double m = -INFINITY;
        for (int64_t i = 0; i < n; i++) {
            if (isnan(v[i]))
                return v[i];
            if (v[i] > m)
                m = v[i];
        }
        if (isinf(m))
            m = 0; /* as PyTorch: all -inf gives -inf, any +inf gives +inf, no NaN */
        double s = 0;
        for (int64_t i = 0; i < n; i++)
            s += exp(v[i] - m);
        return log(s) + m;
    }
    case KILN_REDUCE_NORM: {
        double p = param, acc = 0;
        if (isinf(p)) {
            acc = p > 0 ? 0.0 : INFINITY;
            if (n == 0)
                return 0;
            for (int64_t i = 0; i < n; i++) {
                double a = fabs(v[i]);
                if (isnan(a))
                    return a;
                acc = p > 0 ? (a > acc ? a : acc) : (a < acc ? a : acc);
            }
            return acc;
        }
        if (p == 0) {
            for (int64_t i = 0; i < n; i++)
                acc += v[i] != 0; /* NaN counts as nonzero */
            return acc;
        }
        for (int64_t i = 0; i < n; i++) {
            double a = fabs(v[i]);
            acc += p == 1 ? a : p == 2 ? a * a : pow(a, p);
        }
        return p == 1 ? acc : p == 2 ? sqrt(acc) : pow(acc, 1.0 / p);
    }
    case KILN_REDUCE_ANY: {
        for (int64_t i = 0; i < n; i++)
            if (v[i] != 0)
                return 1;
        return 0;
    }
    case KILN_REDUCE_ALL: {
        for (int64_t i = 0; i < n; i++)
            if (v[i] == 0)
                return 0;
        return 1;
    }
    default:
        return NAN;
    }
}

static int64_t reduce_i(kiln_reduce_op op, const int64_t *v, int64_t n)
{
    int64_t r = op == KILN_REDUCE_PROD ? 1 : op == KILN_REDUCE_SUM ? 0 : v[0];
    for (int64_t i = 0; i < n; i++) {
        switch (op) {
        case KILN_REDUCE_SUM: r = ref_wadd(r, v[i]); break;
        case KILN_REDUCE_PROD: r = ref_wmul(r, v[i]); break;
        case KILN_REDUCE_MAX: r = v[i] > r ? v[i] : r; break;
        default: r = v[i] < r ? v[i] : r; break;
        }
    }
    return r;
}

int kiln__ref_reduce(void *ctx, kiln_reduce_op op, const kiln_tdesc *out, const kiln_tdesc *in,
                     uint32_t reduce_mask, double param)
{
    if ((unsigned)op >= KILN_REDUCE_COUNT)
        return ref_fail(KILN_EINVAL, "ref reduce: unknown op %d", (int)op);
    int64_t rshape[KILN_MAX_DIMS];
    int64_t rn = 1;
    for (int d = 0; d < in->ndim; d++) {
        rshape[d] = (reduce_mask >> d) & 1u ? in->shape[d] : 1;
        rn *= rshape[d];
    }
    ref_iter outer;
    int64_t nout = ref_iter_init(&outer, out->ndim, out->shape);
    if (nout == 0)
        return 0;
    if (rn == 0 && (op == KILN_REDUCE_MAX || op == KILN_REDUCE_MIN))
        return ref_fail(KILN_EINVAL, "ref reduce: max/min over an empty dimension");
    ref_iter_add_t(&outer, out);
    ref_iter_add(&outer, in->offset, in->strides);

    bool int_path = !ref_is_float(in->dtype) && !ref_is_float(out->dtype) &&
                    (op == KILN_REDUCE_SUM || op == KILN_REDUCE_PROD || op == KILN_REDUCE_MAX ||
                     op == KILN_REDUCE_MIN);
    double *fv = NULL;
    int64_t *iv = NULL;
    if (int_path)
        iv = malloc((size_t)(rn > 0 ? rn : 1) * sizeof *iv);
    else
        fv = malloc((size_t)(rn > 0 ? rn : 1) * sizeof *fv);
    if (!iv && !fv)
        return kiln__ref_enomem("reduce");

    unsigned char *ob = ref_data(out);
    const unsigned char *ib = ref_data(in);
    for (int64_t o = 0; o < nout; o++, ref_iter_next(&outer)) {
        ref_iter inner;
        ref_iter_init(&inner, in->ndim, rshape);
        ref_iter_add(&inner, outer.off[1], in->strides);
        for (int64_t i = 0; i < rn; i++, ref_iter_next(&inner)) {
            if (int_path)
                iv[i] = ref_geti(in->dtype, ib, inner.off[0]);
            else
                fv[i] = ref_getf(in->dtype, ib, inner.off[0]);
        }
        if (int_path)
            ref_seti(out->dtype, ob, outer.off[0], reduce_i(op, iv, rn));
        else
            ref_setf(out->dtype, ob, outer.off[0], reduce_f(op, fv, rn, param));
    }
    free(fv);
    free(iv);
    return 0;
}

/* ------------------------------------------------------- lanes along a dim */

/** An outer iterator over every lane of `dim`: the shape with that dim set to 1. */
static int64_t lanes_init(ref_iter *it, const kiln_tdesc *shape_of, int dim)
{
    int64_t shape[KILN_MAX_DIMS];
    for (int d = 0; d < shape_of->ndim; d++)
        shape[d] = d == dim ? 1 : shape_of->shape[d];
    return ref_iter_init(it, shape_of->ndim, shape);
}

int kiln__ref_arg_reduce(void *ctx, bool is_max, const kiln_tdesc *out, const kiln_tdesc *in,
                         int dim)
{
    kiln_tdesc t0, t1;
    out = ref_lift_0d(out, &t0);
    in = ref_lift_0d(in, &t1);
    ref_iter it;
    int64_t nlanes = lanes_init(&it, in, dim);
    int64_t len = in->shape[dim], step = in->strides[dim];
    if (nlanes == 0)
        return 0;
    if (len == 0)
        return ref_fail(KILN_EINVAL, "ref arg_reduce: empty dimension %d", dim);
    ref_iter_add_t(&it, out);
    ref_iter_add_t(&it, in);
    bool fl = ref_is_float(in->dtype);
    const unsigned char *ib = ref_data(in);
    for (int64_t l = 0; l < nlanes; l++, ref_iter_next(&it)) {
        int64_t best = 0;
        if (fl) {
            double m = ref_getf(in->dtype, ib, it.off[1]);
            for (int64_t j = 1; j < len && !isnan(m); j++) {
                double v = ref_getf(in->dtype, ib, it.off[1] + j * step);
                if (isnan(v) || (is_max ? v > m : v < m)) {
                    m = v;
                    best = j;
                }
            }
        } else {
            int64_t m = ref_geti(in->dtype, ib, it.off[1]);
            for (int64_t j = 1; j < len; j++) {
                int64_t v = ref_geti(in->dtype, ib, it.off[1] + j * step);
                if (is_max ? v > m : v < m) {
                    m = v;
                    best = j;
                }
            }
        }
        ref_seti(out->dtype, ref_data(out), it.off[0], best);
    }
    return 0;
}

int kiln__ref_cumsum(void *ctx, const kiln_tdesc *out, const kiln_tdesc *in, int dim)
{
    kiln_tdesc t0, t1;
    out = ref_lift_0d(out, &t0);
    in = ref_lift_0d(in, &t1);
    ref_iter it;
    int64_t nlanes = lanes_init(&it, in, dim);
    int64_t len = in->shape[dim];
    ref_iter_add_t(&it, out);
    ref_iter_add_t(&it, in);
    bool fl = ref_is_float(out->dtype);
    unsigned char *ob = ref_data(out);
    const unsigned char *ib = ref_data(in);
    for (int64_t l = 0; l < nlanes; l++, ref_iter_next(&it)) {
        double fs = 0;
        int64_t is = 0;
        for (int64_t j = 0; j < len; j++) {
            int64_t so = it.off[1] + j * in->strides[dim], oo = it.off[0] + j * out->strides[dim];
            if (fl) {
                fs += ref_getf(in->dtype, ib, so);
                ref_setf(out->dtype, ob, oo, fs);
            } else {
                is = ref_wadd(is, ref_geti(in->dtype, ib, so));
                ref_seti(out->dtype, ob, oo, is);
            }
        }
    }
    return 0;
}

/* -------------------------------------------------------------------- sort */

typedef struct sort_key {
    double f;
    int64_t i;
    int64_t idx; /* position along the lane */
} sort_key;

/** Strict "a goes before b" for ascending order, NaN after everything. */
static bool key_before(const sort_key *a, const sort_key *b, bool fl, bool descending)
{
    if (descending) {
        const sort_key *t = a;
        a = b;
        b = t;
    }
    if (!fl)
        return a->i < b->i;
    if (isnan(a->f))
        return false;
    return isnan(b->f) || a->f < b->f;
}

/** Bottom-up merge sort: stable because ties always take from the left run. */
static void merge_sort(sort_key *k, sort_key *tmp, int64_t n, bool fl, bool descending)
{
    for (int64_t width = 1; width < n; width *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * width) {
            int64_t mid = lo + width < n ? lo + width : n;
            int64_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            int64_t i = lo, j = mid, t = lo;
            while (i < mid && j < hi)
                tmp[t++] = key_before(&k[j], &k[i], fl, descending) ? k[j++] : k[i++];
            while (i < mid)
                tmp[t++] = k[i++];
            while (j < hi)
                tmp[t++] = k[j++];
        }
        memcpy(k, tmp, (size_t)n * sizeof *k);
    }
}

int kiln__ref_sort(void *ctx, const kiln_tdesc *values, const kiln_tdesc *indices,
                   const kiln_tdesc *in, int dim, bool descending)
{
    kiln_tdesc t0, t1, t2;
    values = ref_lift_0d(values, &t0);
    indices = ref_lift_0d(indices, &t1);
    in = ref_lift_0d(in, &t2);
    ref_iter it;
    int64_t nlanes = lanes_init(&it, in, dim);
    int64_t len = in->shape[dim];
    if (nlanes == 0 || len == 0)
        return 0;
    sort_key *keys = malloc((size_t)len * 2 * sizeof *keys);
    if (!keys)
        return kiln__ref_enomem("sort");
    int vslot = values ? ref_iter_add_t(&it, values) : -1;
    int islot = indices ? ref_iter_add_t(&it, indices) : -1;
    int inslot = ref_iter_add_t(&it, in);
    bool fl = ref_is_float(in->dtype);
    const unsigned char *ib = ref_data(in);
    for (int64_t l = 0; l < nlanes; l++, ref_iter_next(&it)) {
        for (int64_t j = 0; j < len; j++) {
            int64_t so = it.off[inslot] + j * in->strides[dim];
            keys[j].idx = j;
            keys[j].f = fl ? ref_getf(in->dtype, ib, so) : 0;
            keys[j].i = fl ? 0 : ref_geti(in->dtype, ib, so);
        }
        merge_sort(keys, keys + len, len, fl, descending);
        for (int64_t j = 0; j < len; j++) {
            if (values)
                ref_move(values->dtype, ref_data(values), it.off[vslot] + j * values->strides[dim],
                         in->dtype, ib, it.off[inslot] + keys[j].idx * in->strides[dim]);
            if (indices)
                ref_seti(indices->dtype, ref_data(indices),
                         it.off[islot] + j * indices->strides[dim], keys[j].idx);
        }
    }
    free(keys);
    return 0;
}
