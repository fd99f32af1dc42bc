/*
 * backends/cpu/cpu-adaptive-pool.c — adaptive average pooling (1-3 spatial dims) and its
 * backward: output cell o of a dim averages the input range [o·in/out, ceil((o+1)·in/out)),
 * as PyTorch does, threaded over the N·C planes in f32 or f64.
 */
#include <stdlib.h>
#include <string.h>

#include "cpu-impl.h"
#include "cpu-pooling-impl.h"

static inline int64_t ad_start(int64_t o, int64_t in, int64_t out)
{
    return (o * in) / out;
}
static inline int64_t ad_end(int64_t o, int64_t in, int64_t out)
{
    return ((o + 1) * in + out - 1) / out;
}

typedef struct ad_job {
    const pgeom *g;
    void *x, *y;
    bool back, dbl;
} ad_job;

static void adaptive_planes(void *argp, int64_t p0, int64_t p1)
{
    const ad_job *j = argp;
    const pgeom *g = j->g;
    for (int64_t pl = p0; pl < p1; pl++) {
        int64_t oi = 0;
        for (int64_t od = 0; od < g->out[0]; od++) {
            int64_t d0 = ad_start(od, g->in[0], g->out[0]), d1 = ad_end(od, g->in[0], g->out[0]);
            for (int64_t oh = 0; oh < g->out[1]; oh++) {
                int64_t h0 = ad_start(oh, g->in[1], g->out[1]), h1 = ad_end(oh, g->in[1], g->out[1]);
                for (int64_t ow = 0; ow < g->out[2]; ow++, oi++) {
                    int64_t w0 = ad_start(ow, g->in[2], g->out[2]), w1 = ad_end(ow, g->in[2], g->out[2]);
                    double cnt = (double)((d1 - d0) * (h1 - h0) * (w1 - w0));
                    double acc = 0, share = 0;
                    if (j->back)
                        share = (j->dbl ? ((double *)j->y)[pl * g->osz + oi] : ((float *)j->y)[pl * g->osz + oi]) /
                                cnt;
                    for (int64_t a = d0; a < d1; a++)
                        for (int64_t b = h0; b < h1; b++)
                            for (int64_t c = w0; c < w1; c++) {
                                int64_t xi = pl * g->isz + (a * g->in[1] + b) * g->in[2] + c;
                                if (j->back) {
                                    if (j->dbl)
                                        ((double *)j->x)[xi] += share;
                                    else
                                        ((float *)j->x)[xi] += (float)share;
                                } else {
                                    acc += j->dbl ? ((double *)j->x)[xi] : ((float *)j->x)[xi];
                                }
                            }
                    if (!j->back) {
                        if (j->dbl)
                            ((double *)j->y)[pl * g->osz + oi] = acc / cnt;
                        else
                            ((float *)j->y)[pl * g->osz + oi] = (float)(acc / cnt);
                    }
                }
            }
        }
    }
}

static int adaptive(kiln__cpu_ctx *ctx, int ns, const kiln_tdesc *big, const kiln_tdesc *small, bool back)
{
    pgeom g;
    kiln__cpu_pgeom_init(&g, ns, NULL, NULL, NULL, NULL, big, small);
    kiln_dtype ct = kiln__cpu_fdt(big->dtype);
    struct kiln_buffer *hin, *hout = NULL;
    const kiln_tdesc *src = back ? small : big, *dst = back ? big : small;
    void *ip = kiln__cpu_materialize(ctx, src, ct, &hin);
    bool direct = dst->dtype == ct && kiln__cpu_contig(dst);
    size_t ob = (size_t)kiln__cpu_numel(dst) * kiln__cpu_esize(ct);
    void *op = direct ? kiln__cpu_ptr(dst) : kiln__cpu_scratch_get(ctx, ob, &hout);
    if (!ip || !op) {
        kiln__cpu_scratch_put(ctx, hin);
        kiln__cpu_scratch_put(ctx, hout);
        return kiln__cpu_enomem(back ? "adaptive_avg_pool_backward" : "adaptive_avg_pool");
    }
    if (back)
        memset(op, 0, ob);
    ad_job j = {&g, back ? op : ip, back ? ip : op, back, ct == KILN_F64};
    kiln__cpu_parallel_for(ctx, g.planes, 1 + 4096 / (g.isz + 1), adaptive_planes, &j);
    if (!direct)
        kiln__cpu_writeback(ctx, dst, op, ct);
    kiln__cpu_scratch_put(ctx, hin);
    kiln__cpu_scratch_put(ctx, hout);
    return 0;
}

int kiln__cpu_adaptive_avg_pool(void *vctx, int nspatial, const kiln_tdesc *out, const kiln_tdesc *x)
{
    if (kiln__cpu_numel(out) == 0)
        return 0;
    return adaptive(vctx, nspatial, x, out, false);
}

int kiln__cpu_adaptive_avg_pool_backward(void *vctx, int nspatial, const kiln_tdesc *grad_x,
                                         const kiln_tdesc *grad_out)
{
    return adaptive(vctx, nspatial, grad_x, grad_out, true);
}
