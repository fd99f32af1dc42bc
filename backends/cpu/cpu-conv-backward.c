/*
 * backends/cpu/cpu-conv-backward.c — the input and weight gradients of a convolution: the
 * transposed GEMM and col2im for the input, the output gradient times the columns (summed
 * over the batch) for the weights, on the direct path where it applies.
 */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "cpu-conv-impl.h"

int kiln__cpu_conv_backward_input(void *vctx, const kiln_conv_params *p, const kiln_tdesc *grad_x,
                                  const kiln_tdesc *grad_out, const kiln_tdesc *w)
{
    kiln__cpu_ctx *ctx = vctx;
    geom g;
    kiln__cpu_conv_geom_init(&g, p, grad_x, w, grad_out);
    kiln_dtype ct = kiln__cpu_fdt(grad_x->dtype);
    bool dbl = ct == KILN_F64;
    size_t es = kiln__cpu_esize(ct);
    opnd ops[4] = {{0}};
    ops[0].p = kiln__cpu_materialize(ctx, grad_out, ct, &ops[0].h);
    ops[1].p = kiln__cpu_materialize(ctx, w, ct, &ops[1].h);
    kiln__cpu_conv_out_buffer(ctx, grad_x, ct, &ops[2]);
    int64_t rows = g.Cg * g.ksz;
    bool tiled = kiln__cpu_conv_direct_ok(ctx, &g, dbl) && !g.direct && g.st[1] == 1 && g.st[2] == 1 &&
                 g.pad[1] <= g.dil[1] * (g.k[1] - 1) && g.pad[2] <= g.dil[2] * (g.k[2] - 1);
    bool need_col = !g.direct && !tiled;
    if (need_col)
        ops[3].p = kiln__cpu_scratch_get(ctx, (size_t)(rows * g.osz) * es, &ops[3].h);
    if (!ops[0].p || !ops[1].p || !ops[2].p || (need_col && !ops[3].p)) {
        kiln__cpu_conv_release(ctx, ops, 4);
        return kiln__cpu_enomem("conv_backward_input");
    }
    char *gop = ops[0].p, *wp = ops[1].p, *gx = ops[2].p, *col = ops[3].p;
    size_t gx_bytes = (size_t)(g.N * g.C * g.isz) * es;
    if (tiled) {
        /* stride 1: the input gradient is the output gradient padded by dil·(k-1) - pad,
         * convolved with the kernel flipped in space and with in/out channels swapped */
        int64_t ph = g.dil[1] * (g.k[1] - 1) - g.pad[1], pw = g.dil[2] * (g.k[2] - 1) - g.pad[2];
        const float *wflip = (const float *)wp + (g.k[1] - 1) * g.k[2] + (g.k[2] - 1);
        if (!kiln__cpu_conv_direct_run(ctx, g.N, g.O, g.C, g.out[1], g.out[2], ph, pw, g.k[1], g.k[2], g.dil[1],
                                       g.dil[2], 1, (const float *)gop, wflip, g.ksz, g.C * g.ksz, -g.k[2], -1,
                                       NULL, (float *)gx, NULL)) {
            kiln__cpu_conv_release(ctx, ops, 4);
            return kiln__cpu_enomem("conv_backward_input");
        }
    } else if (!g.direct || g.Og == 0 || g.osz == 0)
        memset(gx, 0, gx_bytes);
    if (!tiled && g.Og > 0 && g.osz > 0 && rows > 0) {
        for (int64_t n = 0; n < g.N; n++) {
            for (int64_t gi = 0; gi < g.G; gi++) {
                char *img = gx + ((n * g.C + gi * g.Cg) * g.isz) * (int64_t)es;
                const char *go = gop + ((n * g.O + gi * g.Og) * g.osz) * (int64_t)es;
                const char *wg = wp + (gi * g.Og * rows) * (int64_t)es;
                if (g.direct) {
                    kiln__cpu_gemm(ctx, dbl, true, false, rows, g.osz, g.Og, wg, rows, go, g.osz, 0.0, img, g.osz);
                } else {
                    kiln__cpu_gemm(ctx, dbl, true, false, rows, g.osz, g.Og, wg, rows, go, g.osz, 0.0, col, g.osz);
                    kiln__cpu_conv_col2im(ctx, &g, col, img, dbl);
                }
            }
        }
    }
    if (ops[2].h)
        kiln__cpu_writeback(ctx, grad_x, ops[2].p, ct);
    kiln__cpu_conv_release(ctx, ops, 4);
    return 0;
}

/* The weight gradient over a range of images into one accumulator, for the
 * image-parallel path below: each job has its own columns and its own partial sum. */
typedef struct bw_job {
    kiln__cpu_ctx *ctx;
    const geom *g;
    bool dbl;
    int64_t es, rows;
    const char *xp, *gop;
    char **part, **col;
} bw_job;

static void bw_images(void *argp, int job, int njobs)
{
    const bw_job *j = argp;
    const geom *g = j->g;
    int64_t es = j->es, n0 = g->N * job / njobs, n1 = g->N * (job + 1) / njobs;
    char *acc = j->part[job];
    memset(acc, 0, (size_t)(g->O * j->rows * es));
    for (int64_t n = n0; n < n1; n++)
        for (int64_t gi = 0; gi < g->G; gi++) {
            const char *img = j->xp + ((n * g->C + gi * g->Cg) * g->isz) * es;
            const char *go = j->gop + ((n * g->O + gi * g->Og) * g->osz) * es;
            const void *B = img;
            if (!g->direct) {
                kiln__cpu_conv_im2col(j->ctx, g, j->col[job], (void *)img, j->dbl); /* nested: runs inline */
                B = j->col[job];
            }
            kiln__cpu_gemm(j->ctx, j->dbl, false, true, g->Og, j->rows, g->osz, go, g->osz, B, g->osz, 1.0,
                           acc + (gi * g->Og * j->rows) * es, j->rows);
        }
}

/* With at least as many images as threads, each thread takes a share of the batch (its
 * own columns, its own partial gradient; the partials are added in job order) instead
 * of every image's small GEMM being split across the pool: a first layer's per-image
 * product ([32, 784] x [784, 9]) is too small to split at all and ran on one thread.
 * Returns false (nothing done) when there are too few images or no scratch. */
static bool bw_by_images(kiln__cpu_ctx *ctx, const geom *g, bool dbl, int64_t rows, const char *xp,
                         const char *gop, char *gw)
{
    int T = ctx->nthreads < 16 ? ctx->nthreads : 16;
    if (T < 2 || g->N < T)
        return false;
    int64_t es = dbl ? 8 : 4;
    struct kiln_buffer *hp[16] = {0}, *hc[16] = {0};
    char *part[16] = {0}, *col[16] = {0};
    bool ok = true;
    part[0] = gw;
    for (int t = 0; t < T && ok; t++) {
        if (t > 0)
            ok = (part[t] = kiln__cpu_scratch_get(ctx, (size_t)(g->O * rows * es), &hp[t])) != NULL;
        if (ok && !g->direct)
            ok = (col[t] = kiln__cpu_scratch_get(ctx, (size_t)(rows * g->osz * es), &hc[t])) != NULL;
    }
    if (ok) {
        bw_job j = {ctx, g, dbl, es, rows, xp, gop, part, col};
        kiln__cpu_pool_run(ctx->pool, T, bw_images, &j);
        int64_t n = g->O * rows;
        for (int t = 1; t < T; t++) {
            if (dbl) {
                double *d = (double *)gw;
                const double *q = (const double *)part[t];
                for (int64_t i = 0; i < n; i++)
                    d[i] += q[i];
            } else {
                float *d = (float *)gw;
                const float *q = (const float *)part[t];
                for (int64_t i = 0; i < n; i++)
                    d[i] += q[i];
            }
        }
    }
    for (int t = 0; t < T; t++) {
        kiln__cpu_scratch_put(ctx, hp[t]);
        kiln__cpu_scratch_put(ctx, hc[t]);
    }
    return ok;
}

int kiln__cpu_conv_backward_weight(void *vctx, const kiln_conv_params *p, const kiln_tdesc *grad_w,
                                   const kiln_tdesc *x, const kiln_tdesc *grad_out)
{
    kiln__cpu_ctx *ctx = vctx;
    geom g;
    kiln__cpu_conv_geom_init(&g, p, x, grad_w, grad_out);
    kiln_dtype ct = kiln__cpu_fdt(grad_w->dtype);
    bool dbl = ct == KILN_F64;
    size_t es = kiln__cpu_esize(ct);
    opnd ops[4] = {{0}};
    ops[0].p = kiln__cpu_materialize(ctx, x, ct, &ops[0].h);
    ops[1].p = kiln__cpu_materialize(ctx, grad_out, ct, &ops[1].h);
    kiln__cpu_conv_out_buffer(ctx, grad_w, ct, &ops[2]);
    int64_t rows = g.Cg * g.ksz;
    if (!g.direct)
        ops[3].p = kiln__cpu_scratch_get(ctx, (size_t)(rows * g.osz) * es, &ops[3].h);
    if (!ops[0].p || !ops[1].p || !ops[2].p || (!g.direct && !ops[3].p)) {
        kiln__cpu_conv_release(ctx, ops, 4);
        return kiln__cpu_enomem("conv_backward_weight");
    }
    char *xp = ops[0].p, *gop = ops[1].p, *gw = ops[2].p, *col = ops[3].p;
    memset(gw, 0, (size_t)(g.O * rows) * es);
    if (g.osz > 0 && rows > 0 && g.Og > 0 && !bw_by_images(ctx, &g, dbl, rows, xp, gop, gw)) {
        for (int64_t n = 0; n < g.N; n++) {
            for (int64_t gi = 0; gi < g.G; gi++) {
                char *img = xp + ((n * g.C + gi * g.Cg) * g.isz) * (int64_t)es;
                const char *go = gop + ((n * g.O + gi * g.Og) * g.osz) * (int64_t)es;
                char *wg = gw + (gi * g.Og * rows) * (int64_t)es;
                const void *B = img;
                if (!g.direct) {
                    kiln__cpu_conv_im2col(ctx, &g, col, img, dbl);
                    B = col;
                }
                kiln__cpu_gemm(ctx, dbl, false, true, g.Og, rows, g.osz, go, g.osz, B, g.osz, 1.0, wg, rows);
            }
        }
    }
    if (ops[2].h)
        kiln__cpu_writeback(ctx, grad_w, ops[2].p, ct);
    kiln__cpu_conv_release(ctx, ops, 4);
    return 0;
}
