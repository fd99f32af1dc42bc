/*
 * backends/ref/ref-nn.c — pooling, adaptive pooling, interpolation, softmax and
 * layer norm, with their backwards.
 *
 * All of these are floating-only and run on contiguous double copies of their operands
 * (ref_read_flat / ref_write_flat). The window and source-index formulas are PyTorch's,
 * quoted where they matter:
 *  - max pool keeps the first position of the window, replaces it on `v > max || isnan(v)`
 *    (so the last NaN wins) and reports the flat index within the input plane;
 *  - avg pool clips the window to [−pad, in + pad) to get the count_include_pad divisor
 *    and to [0, in) for the other, so a ceil-mode window overhanging the padding never
 *    counts the overhang;
 *  - adaptive pooling uses start = floor(i·in/out), end = ceil((i+1)·in/out);
 *  - nearest uses PyTorch's legacy rule, src = min(floor(dst · (float)(in/out)), in−1);
 *    linear uses align_corners scale (in−1)/(out−1) or the half-pixel rule clamped at 0.
 * The backwards overwrite their whole gradient (accumulating in double first), so they
 * do not depend on the caller having zeroed it.
 */
#include <stdlib.h>

#include "ref-impl.h"

/** The last ns dims padded on the left to three; everything before them is "planes". */
typedef struct spatial {
    int64_t planes;
    int64_t size[3];
    int64_t n; /* elements per plane */
} spatial;

static void spatial_init(spatial *s, const kiln_tdesc *t, int ns)
{
    s->planes = 1;
    for (int d = 0; d < t->ndim - ns; d++)
        s->planes *= t->shape[d];
    s->n = 1;
    for (int d = 0; d < 3; d++) {
        int k = d - (3 - ns);
        s->size[d] = k >= 0 ? t->shape[t->ndim - ns + k] : 1;
        s->n *= s->size[d];
    }
}

static int check_ns(const char *op, int ns, const kiln_tdesc *t)
{
    if (ns < 1 || ns > 3 || ns > t->ndim)
        return ref_fail(KILN_EINVAL, "ref %s: %d spatial dims for a %d-d tensor", op, ns, t->ndim);
    return 0;
}

/* ---------------------------------------------------------------- pooling */

typedef struct pool_win {
    int64_t lo[3], hi[3]; /* clipped to the input */
    double divisor;       /* avg only */
} pool_win;

/** The window of output position o (3 coordinates) under p. */
static void pool_window(const kiln_pool_params *p, const spatial *in, const int64_t *o,
                        pool_win *w)
{
    int ns = p->nspatial;
    double full = 1, clipped = 1;
    for (int d = 0; d < 3; d++) {
        int k = d - (3 - ns);
        int64_t kernel = k >= 0 ? p->kernel[k] : 1, stride = k >= 0 ? p->stride[k] : 1;
        int64_t pad = k >= 0 ? p->padding[k] : 0;
        int64_t start = o[d] * stride - pad;
        int64_t end = start + kernel < in->size[d] + pad ? start + kernel : in->size[d] + pad;
        full *= (double)(end - start);
        w->lo[d] = start > 0 ? start : 0;
        w->hi[d] = end < in->size[d] ? end : in->size[d];
        clipped *= (double)(w->hi[d] - w->lo[d]);
    }
    w->divisor = p->count_include_pad ? full : clipped;
}

/** Max over the dilated window; returns the flat index within the plane. */
static int64_t pool_max(const kiln_pool_params *p, const spatial *in, const double *plane,
                        const int64_t *o, double *value)
{
    int ns = p->nspatial;
    int64_t first[3], last[3], step[3];
    for (int d = 0; d < 3; d++) {
        int k = d - (3 - ns);
        int64_t kernel = k >= 0 ? p->kernel[k] : 1, stride = k >= 0 ? p->stride[k] : 1;
        int64_t pad = k >= 0 ? p->padding[k] : 0, dil = k >= 0 ? p->dilation[k] : 1;
        first[d] = o[d] * stride - pad;
        last[d] = first[d] + (kernel - 1) * dil + 1;
        if (last[d] > in->size[d])
            last[d] = in->size[d];
        while (first[d] < 0)
            first[d] += dil;
        step[d] = dil;
    }
    int64_t best = (first[0] * in->size[1] + first[1]) * in->size[2] + first[2];
    double m = -INFINITY;
    for (int64_t i0 = first[0]; i0 < last[0]; i0 += step[0])
        for (int64_t i1 = first[1]; i1 < last[1]; i1 += step[1])
            for (int64_t i2 = first[2]; i2 < last[2]; i2 += step[2]) {
                int64_t idx = (i0 * in->size[1] + i1) * in->size[2] + i2;
                if (plane[idx] > m || isnan(plane[idx])) {
                    m = plane[idx];
                    best = idx;
                }
            }
    *value = m;
    return best;
}

static void unflatten3(int64_t i, const int64_t *size, int64_t *o)
{
    o[2] = i % size[2];
    o[1] = (i / size[2]) % size[1];
    o[0] = i / (size[2] * size[1]);
}

int kiln__ref_pool(void *ctx, const kiln_pool_params *p, const kiln_tdesc *out,
                   const kiln_tdesc *indices, const kiln_tdesc *x)
{
    int rc;
    if ((rc = check_ns("pool", p->nspatial, x)) || (rc = ref_require_float("pool", x)) ||
        (rc = ref_require_float("pool", out)))
        return rc;
    if (p->kind != KILN_POOL_MAX && p->kind != KILN_POOL_AVG)
        return ref_fail(KILN_EINVAL, "ref pool: unknown kind %d", (int)p->kind);
    spatial in, os;
    spatial_init(&in, x, p->nspatial);
    spatial_init(&os, out, p->nspatial);
    double *xs = ref_read_flat(x, "pool");
    double *ys = ref_zeros(os.planes * os.n, "pool");
    double *is = ref_zeros(os.planes * os.n, "pool");
    if (!xs || !ys || !is) {
        free(xs), free(ys), free(is);
        return KILN_ENOMEM;
    }
    for (int64_t pl = 0; pl < os.planes; pl++) {
        const double *plane = xs + pl * in.n;
        for (int64_t i = 0; i < os.n; i++) {
            int64_t o[3];
            unflatten3(i, os.size, o);
            double v;
            if (p->kind == KILN_POOL_MAX) {
                is[pl * os.n + i] = (double)pool_max(p, &in, plane, o, &v);
            } else {
                pool_win w;
                pool_window(p, &in, o, &w);
                double s = 0;
                for (int64_t i0 = w.lo[0]; i0 < w.hi[0]; i0++)
                    for (int64_t i1 = w.lo[1]; i1 < w.hi[1]; i1++)
                        for (int64_t i2 = w.lo[2]; i2 < w.hi[2]; i2++)
                            s += plane[(i0 * in.size[1] + i1) * in.size[2] + i2];
                v = s / w.divisor;
            }
            ys[pl * os.n + i] = v;
        }
    }
    ref_write_flat(out, ys);
    if (indices && p->kind == KILN_POOL_MAX)
        ref_write_flat(indices, is); /* indices < 2^53: exact through double */
    free(xs), free(ys), free(is);
    return 0;
}

int kiln__ref_pool_backward(void *ctx, const kiln_pool_params *p, const kiln_tdesc *grad_x,
                            const kiln_tdesc *grad_out, const kiln_tdesc *indices)
{
    int rc;
    if ((rc = check_ns("pool_backward", p->nspatial, grad_x)) ||
        (rc = ref_require_float("pool_backward", grad_x)))
        return rc;
    if (p->kind == KILN_POOL_MAX && !indices)
        return ref_fail(KILN_EINVAL, "ref pool_backward: max pooling needs indices");
    spatial in, os;
    spatial_init(&in, grad_x, p->nspatial);
    spatial_init(&os, grad_out, p->nspatial);
    double *gx = ref_zeros(in.planes * in.n, "pool_backward");
    double *gy = ref_read_flat(grad_out, "pool_backward");
    double *ix = indices ? ref_read_flat(indices, "pool_backward") : NULL;
    if (!gx || !gy || (indices && !ix)) {
        free(gx), free(gy), free(ix);
        return KILN_ENOMEM;
    }
    for (int64_t pl = 0; pl < os.planes; pl++) {
        double *plane = gx + pl * in.n;
        for (int64_t i = 0; i < os.n; i++) {
            double g = gy[pl * os.n + i];
            if (p->kind == KILN_POOL_MAX) {
                int64_t at = (int64_t)ix[pl * os.n + i];
                if (at >= 0 && at < in.n)
                    plane[at] += g;
                continue;
            }
            int64_t o[3];
            unflatten3(i, os.size, o);
            pool_win w;
            pool_window(p, &in, o, &w);
            for (int64_t i0 = w.lo[0]; i0 < w.hi[0]; i0++)
                for (int64_t i1 = w.lo[1]; i1 < w.hi[1]; i1++)
                    for (int64_t i2 = w.lo[2]; i2 < w.hi[2]; i2++)
                        plane[(i0 * in.size[1] + i1) * in.size[2] + i2] += g / w.divisor;
        }
    }
    ref_write_flat(grad_x, gx);
    free(gx), free(gy), free(ix);
    return 0;
}

/* ------------------------------------------------------- adaptive avg pool */

static void adaptive_bounds(int64_t i, int64_t in, int64_t out, int64_t *lo, int64_t *hi)
{
    *lo = (i * in) / out;                      /* floor(i * in / out) */
    *hi = ((i + 1) * in + out - 1) / out;      /* ceil((i + 1) * in / out) */
}

/** Forward (backward == false) or backward of adaptive average pooling on planes. */
static void adaptive_run(bool backward, const spatial *in, const spatial *os, double *xs,
                         double *ys)
{
    for (int64_t pl = 0; pl < os->planes; pl++) {
        double *plane = xs + pl * in->n;
        for (int64_t i = 0; i < os->n; i++) {
            int64_t o[3], lo[3], hi[3];
            unflatten3(i, os->size, o);
            double count = 1;
            for (int d = 0; d < 3; d++) {
                adaptive_bounds(o[d], in->size[d], os->size[d], &lo[d], &hi[d]);
                count *= (double)(hi[d] - lo[d]);
            }
            double s = 0, g = ys[pl * os->n + i] / count;
            for (int64_t i0 = lo[0]; i0 < hi[0]; i0++)
                for (int64_t i1 = lo[1]; i1 < hi[1]; i1++)
                    for (int64_t i2 = lo[2]; i2 < hi[2]; i2++) {
                        int64_t at = (i0 * in->size[1] + i1) * in->size[2] + i2;
                        if (backward)
                            plane[at] += g;
                        else
                            s += plane[at];
                    }
            if (!backward)
                ys[pl * os->n + i] = s / count;
        }
    }
}

int kiln__ref_adaptive_avg_pool(void *ctx, int nspatial, const kiln_tdesc *out, const kiln_tdesc *x)
{
    int rc;
    if ((rc = check_ns("adaptive_avg_pool", nspatial, x)) ||
        (rc = ref_require_float("adaptive_avg_pool", x)))
        return rc;
    spatial in, os;
    spatial_init(&in, x, nspatial);
    spatial_init(&os, out, nspatial);
    double *xs = ref_read_flat(x, "adaptive_avg_pool");
    double *ys = ref_zeros(os.planes * os.n, "adaptive_avg_pool");
    if (!xs || !ys) {
        free(xs), free(ys);
        return KILN_ENOMEM;
    }
    adaptive_run(false, &in, &os, xs, ys);
    ref_write_flat(out, ys);
    free(xs), free(ys);
    return 0;
}

int kiln__ref_adaptive_avg_pool_backward(void *ctx, int nspatial, const kiln_tdesc *grad_x,
                                         const kiln_tdesc *grad_out)
{
    int rc;
    if ((rc = check_ns("adaptive_avg_pool_backward", nspatial, grad_x)) ||
        (rc = ref_require_float("adaptive_avg_pool_backward", grad_x)))
        return rc;
    spatial in, os;
    spatial_init(&in, grad_x, nspatial);
    spatial_init(&os, grad_out, nspatial);
    double *gx = ref_zeros(in.planes * in.n, "adaptive_avg_pool_backward");
    double *gy = ref_read_flat(grad_out, "adaptive_avg_pool_backward");
    if (!gx || !gy) {
        free(gx), free(gy);
        return KILN_ENOMEM;
    }
    adaptive_run(true, &in, &os, gx, gy);
    ref_write_flat(grad_x, gx);
    free(gx), free(gy);
    return 0;
}

/* ------------------------------------------------------------- interpolate */

/** Up to two source taps (index, weight) of one output coordinate along one dim. */
typedef struct interp_tap {
    int64_t i[2];
    double w[2];
    int n;
} interp_tap;

static interp_tap interp_taps(kiln_interp_mode mode, bool align_corners, int64_t dst, int64_t in,
                              int64_t out)
{
    interp_tap t = {.n = 1, .w = {1, 0}};
    if (mode == KILN_INTERP_NEAREST) {
        if (out == in) {
            t.i[0] = dst;
        } else if (out == 2 * in) {
            t.i[0] = dst >> 1;
        } else {
            float scale = (float)in / (float)out;
            int64_t s = (int64_t)floorf((float)dst * scale);
            t.i[0] = s < in - 1 ? s : in - 1;
        }
        return t;
    }
    double scale, src;
    if (align_corners) {
        scale = out > 1 ? (double)(in - 1) / (double)(out - 1) : 0.0;
        src = scale * (double)dst;
    } else {
        scale = (double)in / (double)out;
        src = scale * ((double)dst + 0.5) - 0.5;
        if (src < 0)
            src = 0;
    }
    int64_t i0 = (int64_t)src;
    double l1 = src - (double)i0;
    t.n = 2;
    t.i[0] = i0;
    t.i[1] = i0 + (i0 < in - 1 ? 1 : 0);
    t.w[0] = 1.0 - l1;
    t.w[1] = l1;
    return t;
}

static int interp_run(const char *op, kiln_interp_mode mode, bool align_corners, bool backward,
                      const kiln_tdesc *x, const kiln_tdesc *y)
{
    int ns = x->ndim - 2, rc;
    if (mode != KILN_INTERP_NEAREST && mode != KILN_INTERP_BILINEAR)
        return ref_fail(KILN_EINVAL, "ref %s: unknown mode %d", op, (int)mode);
    if ((rc = check_ns(op, ns, x)) || (rc = ref_require_float(op, x)) ||
        (rc = ref_require_float(op, y)))
        return rc;
    spatial in, os;
    spatial_init(&in, x, ns);
    spatial_init(&os, y, ns);
    double *xs = backward ? ref_zeros(in.planes * in.n, op) : ref_read_flat(x, op);
    double *ys = backward ? ref_read_flat(y, op) : ref_zeros(os.planes * os.n, op);
    if (!xs || !ys) {
        free(xs), free(ys);
        return KILN_ENOMEM;
    }
    for (int64_t i = 0; i < os.n; i++) {
        int64_t o[3];
        unflatten3(i, os.size, o);
        interp_tap t[3];
        for (int d = 0; d < 3; d++)
            t[d] = interp_taps(mode, align_corners, o[d], in.size[d], os.size[d]);
        for (int64_t pl = 0; pl < os.planes; pl++) {
            double *plane = xs + pl * in.n, *yv = ys + pl * os.n + i, acc = 0;
            for (int a = 0; a < t[0].n; a++)
                for (int b = 0; b < t[1].n; b++)
                    for (int c = 0; c < t[2].n; c++) {
                        double w = t[0].w[a] * t[1].w[b] * t[2].w[c];
                        int64_t at = (t[0].i[a] * in.size[1] + t[1].i[b]) * in.size[2] + t[2].i[c];
                        if (backward)
                            plane[at] += w * *yv;
                        else
                            acc += w * plane[at];
                    }
            if (!backward)
                *yv = acc;
        }
    }
    if (backward)
        ref_write_flat(x, xs);
    else
        ref_write_flat(y, ys);
    free(xs), free(ys);
    return 0;
}

int kiln__ref_interpolate(void *ctx, kiln_interp_mode mode, bool align_corners,
                          const kiln_tdesc *out, const kiln_tdesc *x)
{
    return interp_run("interpolate", mode, align_corners, false, x, out);
}

int kiln__ref_interpolate_backward(void *ctx, kiln_interp_mode mode, bool align_corners,
                                   const kiln_tdesc *grad_x, const kiln_tdesc *grad_out)
{
    return interp_run("interpolate_backward", mode, align_corners, true, grad_x, grad_out);
}

/* ----------------------------------------------------------------- softmax */

int kiln__ref_softmax(void *ctx, bool log_, const kiln_tdesc *out, const kiln_tdesc *in, int dim)
{
    kiln_tdesc t0, t1;
    out = ref_lift_0d(out, &t0);
    in = ref_lift_0d(in, &t1);
    int rc;
    if ((rc = ref_require_float("softmax", in)) || (rc = ref_require_float("softmax", out)))
        return rc;
    int64_t shape[KILN_MAX_DIMS], len = in->shape[dim];
    for (int d = 0; d < in->ndim; d++)
        shape[d] = d == dim ? 1 : in->shape[d];
    ref_iter it;
    int64_t nlanes = ref_iter_init(&it, in->ndim, shape);
    ref_iter_add_t(&it, out);
    ref_iter_add_t(&it, in);
    double *v = ref_zeros(len, "softmax");
    if (!v)
        return KILN_ENOMEM;
    for (int64_t l = 0; l < nlanes && len > 0; l++, ref_iter_next(&it)) {
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < len; j++) {
            v[j] = ref_getf(in->dtype, ref_data(in), it.off[1] + j * in->strides[dim]);
            m = v[j] > m || isnan(v[j]) ? v[j] : m;
        }
        for (int64_t j = 0; j < len; j++)
            s += exp(v[j] - m); /* a max of ±inf makes every term NaN, as PyTorch */
        for (int64_t j = 0; j < len; j++)
            ref_setf(out->dtype, ref_data(out), it.off[0] + j * out->strides[dim],
                     log_ ? v[j] - m - log(s) : exp(v[j] - m) / s);
    }
    free(v);
    return 0;
}

/* -------------------------------------------------------------- layer norm */

int kiln__ref_layer_norm(void *ctx, const kiln_tdesc *out, const kiln_tdesc *mean,
                         const kiln_tdesc *rstd, const kiln_tdesc *x, const kiln_tdesc *weight,
                         const kiln_tdesc *bias, int64_t inner, double eps)
{
    int rc;
    if ((rc = ref_require_float("layer_norm", x)) || (rc = ref_require_float("layer_norm", out)))
        return rc;
    int64_t total = ref_numel(x);
    if (total == 0)
        return 0;
    if (inner <= 0 || total % inner != 0)
        return ref_fail(KILN_EINVAL, "ref layer_norm: %" PRId64 " elements do not split into rows of %" PRId64,
                        total, inner);
    int64_t rows = total / inner;
    double *xs = ref_read_flat(x, "layer_norm");
    double *ws = weight ? ref_read_flat(weight, "layer_norm") : NULL;
    double *bs = bias ? ref_read_flat(bias, "layer_norm") : NULL;
    double *ms = ref_zeros(rows, "layer_norm"), *rs = ref_zeros(rows, "layer_norm");
    if (!xs || (weight && !ws) || (bias && !bs) || !ms || !rs) {
        free(xs), free(ws), free(bs), free(ms), free(rs);
        return KILN_ENOMEM;
    }
    /* Rows are contiguous runs of `inner` in row-major order, whatever x's strides. */
    for (int64_t r = 0; r < rows; r++) {
        double *row = xs + r * inner, mu = 0, var = 0;
        for (int64_t j = 0; j < inner; j++)
            mu += row[j];
        mu /= (double)inner;
        for (int64_t j = 0; j < inner; j++)
            var += (row[j] - mu) * (row[j] - mu);
        var /= (double)inner; /* biased, as layer norm is defined */
        double rsd = 1.0 / sqrt(var + eps);
        for (int64_t j = 0; j < inner; j++) {
            double y = (row[j] - mu) * rsd;
            if (ws)
                y *= ws[j];
            if (bs)
                y += bs[j];
            row[j] = y;
        }
        ms[r] = mu;
        rs[r] = rsd;
    }
    ref_write_flat(out, xs);
    if (mean)
        ref_write_flat(mean, ms);
    if (rstd)
        ref_write_flat(rstd, rs);
    free(xs), free(ws), free(bs), free(ms), free(rs);
    return 0;
}
