/*
 * backends/cpu/cpu-conv-depthwise.c — f32 convolutions with one input channel per group
 * (MobileNet-style depthwise layers), channel by channel on the direct path's padded grid
 * or, at stride 1, on the unpadded plane.
 */
#include <stdlib.h>
#include <string.h>

#include "cpu-conv-impl.h"

/* Groups = input channels (each output plane sees one input plane): the GEMM lowering ran
 * one kiln__cpu_conv_im2col and one tiny GEMM per channel, a pool region and a BLAS call each, which
 * made MobileNet-style layers cost several times their arithmetic. Here each job pads one
 * input plane into its own scratch, split into stride phases as in the direct path, and
 * the table's dwconv_plane_f32 computes that channel's output planes from it, epilogue
 * included. At stride 1 a table with dwconv_s1_f32 reads the unpadded plane instead: the
 * padding copy cost more than the arithmetic on the small planes of a network's last
 * stages (a 7x7 plane padded to 11x11 is 33 library calls for 49 outputs). */
typedef struct dwconv {
    dconv d;                /* geometry of one plane: N = Ci = 1 */
    int64_t planes, m;      /* input planes (batch × channels), outputs per input plane */
    int64_t C, slot;        /* input channels; floats of scratch per job */
    int64_t KH, KW, dh, dw; /* for the unpadded stride-1 kernel */
    bool s1;                /* use it: no padded copy at all */
    const float *x, *w, *bias;
    float *out, *scratch;
    const conv_ep *ep;
} dwconv;

static void dwconv_job(void *argp, int job, int njobs)
{
    const dwconv *dw = argp;
    dconv d = dw->d;
    float *xg = dw->scratch ? dw->scratch + job * dw->slot : NULL;
    const int64_t osz = d.OH * d.OW;
    const conv_ep *ep = dw->ep ? dw->ep : &kiln__cpu_conv_no_ep;
    for (int64_t pl = dw->planes * job / njobs, pe = dw->planes * (job + 1) / njobs; pl < pe; pl++) {
        const float *xpl = dw->x + pl * d.H * d.W;
        if (!dw->s1) {
            d.x = xpl;
            d.xp = xg;
            kiln__cpu_conv_direct_pad(&d, 0, d.Hg);
        }
        int64_t n = pl / dw->C, c = pl % dw->C;
        for (int64_t j = 0; j < dw->m; j++) {
            int64_t o = c * dw->m + j;
            int64_t at = (n * dw->C * dw->m + o) * osz;
            float bias = dw->bias ? dw->bias[o] : 0.0f;
            const float *res = ep->res ? ep->res + at : NULL;
            if (dw->s1)
                d.k->dwconv_s1_f32(dw->out + at, res, xpl, d.H, d.W, d.OH, d.OW, dw->KH, dw->KW, d.ph, d.pw,
                                   dw->dh, dw->dw, dw->w + o * d.nk, bias, ep->act, ep->a, ep->b);
            else
                d.k->dwconv_plane_f32(dw->out + at, res, xg, d.Wg, d.OH, d.OW, d.offs, dw->w + o * d.nk, d.nk,
                                      bias, ep->act, ep->a, ep->b);
        }
    }
}

/* Whether the depthwise path applies: f32, one input channel per group, 1-D or 2-D, the
 * same stride in both dims, and an output of the usual size. */
bool kiln__cpu_conv_depthwise_ok(const kiln__cpu_ctx *ctx, const geom *g, bool dbl)
{
    if (dbl || !ctx->k->dwconv_plane_f32 || g->G < 2 || g->Cg != 1)
        return false;
    if (g->k[0] != 1 || g->in[0] != 1 || g->pad[0] != 0 || g->st[0] != 1)
        return false;
    if (g->st[1] != g->st[2] && !(g->in[1] == 1 && g->k[1] == 1 && g->pad[1] == 0))
        return false;
    for (int i = 1; i < 3; i++)
        if (g->out[i] != (g->in[i] + 2 * g->pad[i] - g->dil[i] * (g->k[i] - 1) - 1) / g->st[i] + 1)
            return false;
    return g->osz > 0 && g->isz > 0;
}

/* Channels in the vector lanes (the table's dwconv_c16_f32): a unit of work is one block
 * of 16 channels of one image and one band of output rows, whose input rows are
 * transposed into the job's scratch. Per plane, a 7x7 map fills a 16-lane vector with 7
 * outputs and its borders cost branches and masks; with the channels in the lanes every
 * lane works whatever the map's size. Bands keep the transposed rows within L2 on large
 * maps and give the pool work when there are few blocks. */
#define DW16_BAND_BYTES (96 * 1024)

typedef struct dw16_run {
    kiln__cpu_dw16 p; /* the geometry and whole tensors; each unit moves the pointers */
    const kiln__cpu_kernels *k;
    int64_t C, blocks, bands, bh, units, slot;
    float *scratch;
} dw16_run;

static void dw16_job(void *argp, int job, int njobs)
{
    const dw16_run *r = argp;
    kiln__cpu_dw16 p = r->p;
    p.scratch = r->scratch + kiln__cpu_pool_slot() * r->slot;
    const int64_t isz = p.H * p.W, osz = p.OH * p.OW;
    for (int64_t u = r->units * job / njobs, ue = r->units * (job + 1) / njobs; u < ue; u++) {
        const int64_t band = u % r->bands, c0 = u / r->bands % r->blocks * 16, n = u / r->bands / r->blocks;
        const int64_t plane = n * r->C + c0;
        p.nc = r->C - c0 < 16 ? (int)(r->C - c0) : 16;
        p.x = r->p.x + plane * isz;
        p.out = r->p.out + plane * osz;
        p.res = r->p.res ? r->p.res + plane * osz : NULL;
        p.w = r->p.w + c0 * p.KH * p.KW;
        p.bias = r->p.bias ? r->p.bias + c0 : NULL;
        const int64_t oh0 = band * r->bh, oh1 = oh0 + r->bh < p.OH ? oh0 + r->bh : p.OH;
        r->k->dwconv_c16_f32(&p, oh0, oh1);
    }
}

/* Whether the channel-lane kernel serves this depthwise layer: one output per input
 * channel and at least half a vector of channels (fewer would leave most lanes idle,
 * where the per-plane kernels fill theirs with positions). */
static bool dw16_ok(const kiln__cpu_ctx *ctx, const geom *g)
{
    return ctx->k->dwconv_c16_f32 && ctx->dw_path == KILN__CPU_DW_AUTO && g->Og == 1 && g->C >= 8;
}

static bool dw16_conv(kiln__cpu_ctx *ctx, const geom *g, const float *x, const float *w, const float *bias,
                      float *out, const conv_ep *ep)
{
    dw16_run r = {0};
    kiln__cpu_dw16 *p = &r.p;
    p->x = x, p->out = out, p->res = ep->res, p->w = w, p->bias = bias;
    p->act = ep->act, p->a = ep->a, p->b = ep->b;
    p->H = g->in[1], p->W = g->in[2], p->OH = g->out[1], p->OW = g->out[2];
    p->KH = g->k[1], p->KW = g->k[2], p->sh = g->st[1], p->sw = g->st[2];
    p->ph = g->pad[1], p->pw = g->pad[2], p->dh = g->dil[1], p->dw = g->dil[2];
    p->xstride = g->isz, p->ostride = g->osz;
    r.k = ctx->k;
    r.C = g->C;
    r.blocks = (g->C + 15) / 16;
    /* the tallest band whose transposed rows fit the budget, then bands of equal height */
    int64_t bh = p->OH;
    while (bh > 1 && kiln__cpu_dw16_scratch(p, bh) * (int64_t)sizeof(float) > DW16_BAND_BYTES)
        bh = (bh + 1) / 2;
    r.bands = (p->OH + bh - 1) / bh;
    /* enough units for every thread to get a share even with one block */
    while (g->N * r.blocks * r.bands < 4 * ctx->nthreads && r.bands < p->OH)
        r.bands = r.bands * 2 < p->OH ? r.bands * 2 : p->OH;
    r.bh = (p->OH + r.bands - 1) / r.bands;
    r.bands = (p->OH + r.bh - 1) / r.bh;
    r.units = g->N * r.blocks * r.bands;
    r.slot = kiln__cpu_dw16_scratch(p, r.bh);
    /* a scratch slot per thread, not per job: a slot per job put several hundred KB of
     * scratch beside the layer's input and output in L2 */
    int64_t njobs = 8 * (int64_t)ctx->nthreads < r.units ? 8 * (int64_t)ctx->nthreads : r.units;
    struct kiln_buffer *h;
    r.scratch = kiln__cpu_scratch_get(ctx, (size_t)(ctx->nthreads * r.slot) * sizeof(float), &h);
    if (!r.scratch)
        return false;
    kiln__cpu_pool_run(ctx->pool, (int)njobs, dw16_job, &r);
    kiln__cpu_scratch_put(ctx, h);
    return true;
}

bool kiln__cpu_conv_depthwise_run(kiln__cpu_ctx *ctx, const geom *g, const float *x, const float *w,
                                  const float *bias, float *out, const conv_ep *ep)
{
    if (dw16_ok(ctx, g))
        return dw16_conv(ctx, g, x, w, bias, out, ep ? ep : &kiln__cpu_conv_no_ep);
    dwconv dw = {0};
    dconv *d = &dw.d;
    d->N = 1, d->Ci = 1;
    /* kiln__cpu_conv_depthwise_ok checked that the output size is the one this grid gives */
    kiln__cpu_conv_direct_grid(d, g->in[1], g->in[2], g->pad[1], g->pad[2], g->st[2], g->k[1], g->k[2], g->dil[1],
                               g->dil[2]);
    d->k = ctx->k;
    dw.planes = g->N * g->C, dw.m = g->Og, dw.C = g->C;
    dw.KH = g->k[1], dw.KW = g->k[2], dw.dh = g->dil[1], dw.dw = g->dil[2];
    dw.s1 = ctx->k->dwconv_s1_f32 && g->st[2] == 1 && g->k[2] <= ctx->k->dwconv_s1_maxk;
    dw.slot = (d->cs + d->Wg + 16 + 15) / 16 * 16; /* slack: reads run up to Wg past the phases */
    dw.x = x, dw.w = w, dw.bias = bias, dw.out = out, dw.ep = ep;
    int64_t njobs = 8 * (int64_t)ctx->nthreads;
    if (njobs > dw.planes)
        njobs = dw.planes;
    if (dw.s1) {
        kiln__cpu_pool_run(ctx->pool, (int)njobs, dwconv_job, &dw);
        return true;
    }
    struct kiln_buffer *h[2] = {0};
    dw.scratch = kiln__cpu_scratch_get(ctx, (size_t)(njobs * dw.slot) * sizeof(float), &h[0]);
    int64_t *offs = kiln__cpu_scratch_get(ctx, (size_t)d->nk * sizeof(int64_t), &h[1]);
    if (!dw.scratch || !offs) {
        kiln__cpu_scratch_put(ctx, h[0]);
        kiln__cpu_scratch_put(ctx, h[1]);
        return false;
    }
    for (int64_t j = 0; j < njobs; j++)
        memset(dw.scratch + j * dw.slot + d->cs, 0, (size_t)(dw.slot - d->cs) * sizeof(float));
    kiln__cpu_conv_direct_offsets(d, offs, g->k[1], g->k[2], g->dil[1], g->dil[2]);
    d->offs = offs;
    kiln__cpu_pool_run(ctx->pool, (int)njobs, dwconv_job, &dw);
    kiln__cpu_scratch_put(ctx, h[0]);
    kiln__cpu_scratch_put(ctx, h[1]);
    return true;
}
