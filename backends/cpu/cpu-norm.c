/*
 * backends/cpu/cpu-norm.c — fused softmax / log-softmax and layer norm.
 *
 * Both are row operations. The common case — f32, normalizing along a contiguous last
 * dim — runs the row kernels of the kernel table (three passes over a row that stays in
 * cache: max, exp-and-sum, scale; or sum, squared deviations, affine), threaded over
 * rows. Sums keep full f32 precision on long rows: the AVX2 and portable rows accumulate
 * in double, the AVX-512 rows in f32 vectors that are folded into a double every 1024
 * elements. Other layouts and dtypes take a strided path that computes each line in
 * double.
 */
#include <stdlib.h>

#include "cpu-impl.h"

/* ------------------------------------------------------------------ softmax */

typedef struct sm_job {
    kiln__cpu_ctx *ctx;
    const kiln_tdesc *out, *in;
    int dim;
    bool want_log;
    float *o;
    const float *x;
    int64_t n;
} sm_job;

static void sm_rows_fast(void *argp, int64_t b, int64_t e)
{
    const sm_job *j = argp;
    for (int64_t r = b; r < e; r++)
        j->ctx->k->softmax_row_f32(j->o + r * j->n, j->x + r * j->n, j->n, j->want_log);
}

static void sm_lines(void *argp, int64_t b, int64_t e)
{
    const sm_job *j = argp;
    const kiln_tdesc *in = j->in, *out = j->out;
    int dim = j->dim;
    int64_t n = in->shape[dim];
    int64_t ies = (int64_t)kiln__cpu_esize(in->dtype), oes = (int64_t)kiln__cpu_esize(out->dtype);
    int64_t ist = in->strides[dim] * ies, ost = out->strides[dim] * oes;
    for (int64_t l = b; l < e; l++) {
        const char *p = (const char *)kiln__cpu_ptr(in) + kiln__cpu_line_offset(in, dim, l) * ies;
        char *q = (char *)kiln__cpu_ptr(out) + kiln__cpu_line_offset(out, dim, l) * oes;
        double mx = -INFINITY;
        bool nan = false;
        for (int64_t i = 0; i < n; i++) {
            double v = kiln__cpu_ld(p + i * ist, in->dtype);
            if (v != v)
                nan = true;
            if (v > mx)
                mx = v;
        }
        if (nan)
            mx = NAN;
        double s = 0;
        for (int64_t i = 0; i < n; i++)
            s += exp(kiln__cpu_ld(p + i * ist, in->dtype) - mx);
        for (int64_t i = 0; i < n; i++) {
            double v = kiln__cpu_ld(p + i * ist, in->dtype);
            kiln__cpu_st(q + i * ost, out->dtype, j->want_log ? (v - mx) - log(s) : exp(v - mx) / s);
        }
    }
}

int kiln__cpu_softmax(void *vctx, bool want_log, const kiln_tdesc *out, const kiln_tdesc *in, int dim)
{
    kiln__cpu_ctx *ctx = vctx;
    if (dim < 0 || dim >= in->ndim)
        return kiln__error_set("cpu softmax: dim %d out of range", dim), KILN_EINVAL;
    int64_t n = in->shape[dim];
    if (kiln__cpu_numel(in) == 0)
        return 0;
    sm_job j = {ctx, out, in, dim, want_log, NULL, NULL, n};
    bool last = dim == in->ndim - 1;
    if (last && in->dtype == KILN_F32 && out->dtype == KILN_F32 && kiln__cpu_contig(in) &&
        kiln__cpu_contig(out)) {
        j.o = kiln__cpu_ptr(out);
        j.x = kiln__cpu_ptr(in);
        kiln__cpu_parallel_for(ctx, kiln__cpu_numel(in) / n, 1 + 8192 / n, sm_rows_fast, &j);
        return 0;
    }
    if (last && (in->dtype == KILN_F16 || in->dtype == KILN_BF16 || in->dtype == KILN_F32) &&
        (out->dtype == KILN_F16 || out->dtype == KILN_BF16 || out->dtype == KILN_F32)) {
        /* half types and strided f32: convert rows to contiguous f32 and use the fast path */
        struct kiln_buffer *hx, *ho;
        float *x = kiln__cpu_materialize(ctx, in, KILN_F32, &hx);
        float *o = kiln__cpu_scratch_get(ctx, (size_t)kiln__cpu_numel(in) * 4, &ho);
        if (!x || !o) {
            kiln__cpu_scratch_put(ctx, hx);
            kiln__cpu_scratch_put(ctx, ho);
            return kiln__cpu_enomem("softmax");
        }
        j.o = o;
        j.x = x;
        kiln__cpu_parallel_for(ctx, kiln__cpu_numel(in) / n, 1 + 8192 / n, sm_rows_fast, &j);
        kiln__cpu_writeback(ctx, out, o, KILN_F32);
        kiln__cpu_scratch_put(ctx, hx);
        kiln__cpu_scratch_put(ctx, ho);
        return 0;
    }
    kiln__cpu_parallel_for(ctx, kiln__cpu_nlines(in, dim), 1 + 4096 / (n + 1), sm_lines, &j);
    return 0;
}

/* ------------------------------------------------------------------ layer norm */

typedef struct ln_job {
    kiln__cpu_ctx *ctx;
    void *o;
    const void *x, *w, *b;
    int64_t inner;
    double eps;
    double *mean, *rstd;
    bool dbl;
} ln_job;

static void ln_row_f64(double *o, const double *x, int64_t n, const double *w, const double *b,
                       double eps, double *mean_out, double *rstd_out)
{
    double s = 0, sq = 0;
    for (int64_t i = 0; i < n; i++)
        s += x[i];
    double mean = n ? s / (double)n : 0;
    for (int64_t i = 0; i < n; i++)
        sq += (x[i] - mean) * (x[i] - mean);
    double rstd = 1.0 / sqrt((n ? sq / (double)n : 0) + eps);
    for (int64_t i = 0; i < n; i++) {
        double v = (x[i] - mean) * rstd;
        if (w)
            v *= w[i];
        if (b)
            v += b[i];
        o[i] = v;
    }
    *mean_out = mean;
    *rstd_out = rstd;
}

static void ln_rows(void *argp, int64_t b, int64_t e)
{
    const ln_job *j = argp;
    int64_t n = j->inner;
    for (int64_t r = b; r < e; r++) {
        double m, rs;
        if (j->dbl)
            ln_row_f64((double *)j->o + r * n, (const double *)j->x + r * n, n, j->w, j->b, j->eps,
                       &m, &rs);
        else
            j->ctx->k->layer_norm_row_f32((float *)j->o + r * n, (const float *)j->x + r * n, n,
                                          j->w, j->b, j->eps, &m, &rs);
        if (j->mean)
            j->mean[r] = m;
        if (j->rstd)
            j->rstd[r] = rs;
    }
}

int kiln__cpu_layer_norm(void *vctx, const kiln_tdesc *out, const kiln_tdesc *mean,
                         const kiln_tdesc *rstd, const kiln_tdesc *x, const kiln_tdesc *weight,
                         const kiln_tdesc *bias, int64_t inner, double eps)
{
    kiln__cpu_ctx *ctx = vctx;
    int64_t total = kiln__cpu_numel(x);
    if (inner <= 0 || total == 0)
        return 0;
    int64_t rows = total / inner;
    kiln_dtype ct = kiln__cpu_fdt(out->dtype);
    size_t es = kiln__cpu_esize(ct);
    struct kiln_buffer *h[6] = {0};
    const void *xp = kiln__cpu_materialize(ctx, x, ct, &h[0]);
    const void *wp = weight ? kiln__cpu_materialize(ctx, weight, ct, &h[1]) : NULL;
    const void *bp = bias ? kiln__cpu_materialize(ctx, bias, ct, &h[2]) : NULL;
    bool direct = out->dtype == ct && kiln__cpu_contig(out);
    void *op = direct ? kiln__cpu_ptr(out) : kiln__cpu_scratch_get(ctx, (size_t)total * es, &h[3]);
    double *mp = mean ? kiln__cpu_scratch_get(ctx, (size_t)rows * 8, &h[4]) : NULL;
    double *rp = rstd ? kiln__cpu_scratch_get(ctx, (size_t)rows * 8, &h[5]) : NULL;
    int rc = 0;
    if (!xp || (weight && !wp) || (bias && !bp) || !op || (mean && !mp) || (rstd && !rp)) {
        rc = kiln__cpu_enomem("layer_norm");
    } else {
        ln_job j = {ctx, op, xp, wp, bp, inner, eps, mp, rp, ct == KILN_F64};
        kiln__cpu_parallel_for(ctx, rows, 1 + 8192 / inner, ln_rows, &j);
        if (!direct)
            kiln__cpu_writeback(ctx, out, op, ct);
        if (mean)
            kiln__cpu_writeback(ctx, mean, mp, KILN_F64);
        if (rstd)
            kiln__cpu_writeback(ctx, rstd, rp, KILN_F64);
    }
    for (int i = 0; i < 6; i++)
        kiln__cpu_scratch_put(ctx, h[i]);
    return rc;
}
