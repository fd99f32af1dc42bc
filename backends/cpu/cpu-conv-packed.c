/*
 * backends/cpu/cpu-conv-packed.c — the packed path of f32 convolutions: weights packed once
 * per model by output channel, 32 output channels in the vector lanes and 14 freely chosen
 * positions per tile, chosen over the direct path by a cost model per layer.
 */
#include <stdlib.h>
#include <string.h>

#include "cpu-conv-impl.h"

/* The position tile of the direct path is 48 consecutive grid positions, which fits the
 * large maps of a network's first stages but not its last: a 7x7 map is 63 grid positions
 * (two columns of padding per row), two tiles of which 49 lanes do work, and a 14x14 one
 * wastes a fifth. With weights pre-packed by output channel ([Co/32][Ci][nk][32], one
 * packing per model, not per call), the table's cvconv_f32 puts 32 output channels in
 * the vector lanes and broadcasts 14 positions chosen freely: the real outputs in raster
 * order, nothing of the padding grid, so only the last tile of a map is partly empty.
 * Positions map to the padded (and stride-phased) grid exactly as in the direct path. */
#define CV_NP 14
#define CV_NO 32
#define CV_MAX_POS 1024 /* maps above this many outputs keep the direct path */

/* Whether the packed tile beats the direct one on a layer (both apply): an estimate of
 * each one's multiply-adds, wasted lanes included, plus the packed tile's transposed
 * store, which costs about CV_STORE_COST multiply-adds per output. The direct tile
 * wastes the grid's padding columns and a partly empty last tile of TQ positions and
 * block of TO channels; the packed one a partly empty block of 32 channels and the
 * last tile of 14 positions. Measured per layer on ResNet-50 and MobileNetV3 (one
 * thread), the model picks the faster path on every layer where they differ by more
 * than ~10%: the packed tile wins deep, narrow-map layers (14x14 with 256+ input
 * channels, every 7x7 map), the direct one the 1x1 layers of few input channels on
 * 28x28 and 14x14 maps, by up to 2.3x (24 -> 96 channels at 28x28). KILN_CPU_CONV=
 * packed or direct (read when the device opens) overrides the model, for tests and
 * measurements. */
#define CV_STORE_COST 33

static bool cv_preferred(const kiln__cpu_ctx *ctx, int64_t Ci, int64_t Co, int64_t nk, int64_t OH, int64_t OW,
                         int64_t W, int64_t pw, int64_t s)
{
    const kiln__cpu_kernels *k = ctx->k;
    if (ctx->conv_path == KILN__CPU_CONV_PACKED)
        return true;
    const int64_t TO = k->conv_tile_o, TQ = k->conv_tile_q, K = Ci * nk, osz = OH * OW;
    if (!k->conv_tile_f32 || TO <= 0 || TQ <= 0 || (nk == 1 && osz < TQ)) /* no direct path there */
        return true;
    if (ctx->conv_path == KILN__CPU_CONV_DIRECT)
        return false;
    const int64_t Wg = (W + 2 * pw + s - 1) / s; /* the direct tile's grid row, as kiln__cpu_conv_direct_grid */
    double direct = (double)((Co + TO - 1) / TO * TO) * (double)((OH * Wg + TQ - 1) / TQ * TQ) * (double)K;
    double packed = (double)((Co + CV_NO - 1) / CV_NO * CV_NO) * (double)((osz + CV_NP - 1) / CV_NP * CV_NP) *
                    (double)(K + CV_STORE_COST);
    return packed < direct;
}

typedef struct cvconv {
    dconv d; /* geometry and the padded input */
    const float *wpack;
    int64_t nob, ntile, osz; /* channel blocks, tiles per image, outputs per plane */
    const int64_t *pin;      /* [ntile · CV_NP] grid offset of each output position */
} cvconv;

static void cvconv_tiles(void *argp, int64_t b, int64_t e)
{
    const cvconv *cv = argp;
    const dconv *d = &cv->d;
    const int64_t per_image = cv->nob * cv->ntile, wblk = d->Ci * d->nk * CV_NO;
    const conv_ep *ep = d->ep ? d->ep : &kiln__cpu_conv_no_ep;
    for (int64_t jt = b; jt < e; jt++) {
        int64_t n = jt / per_image, r = jt % per_image, ob = r / cv->ntile, t = r % cv->ntile;
        const float *xq = (d->inplace ? d->x : d->xp) + n * d->Ci * d->cs;
        int64_t q0 = t * CV_NP, nq = cv->osz - q0 < CV_NP ? cv->osz - q0 : CV_NP;
        int64_t jn = d->Co - ob * CV_NO < CV_NO ? d->Co - ob * CV_NO : CV_NO;
        int64_t at = (n * d->Co + ob * CV_NO) * cv->osz + q0;
        d->k->cvconv_f32(d->out + at, ep->res ? ep->res + at : NULL, cv->osz, (int)nq, (int)jn,
                         d->bias ? d->bias + ob * CV_NO : NULL, ep->act, ep->a, ep->b, xq, d->cs, d->Ci, d->offs,
                         d->nk, cv->pin + t * CV_NP, cv->wpack + ob * wblk);
    }
}

bool kiln__cpu_conv_packed_ok(const kiln__cpu_ctx *ctx, const geom *g, bool dbl, const kiln_tdesc *wpacked)
{
    if (!wpacked || dbl || !ctx->k->cvconv_f32 || g->G != 1 || g->osz > CV_MAX_POS)
        return false;
    if (wpacked->dtype != KILN_F32 || !kiln__cpu_contig(wpacked) ||
        kiln__cpu_numel(wpacked) != (g->O + CV_NO - 1) / CV_NO * CV_NO * g->C * g->ksz)
        return false;
    if (g->k[0] != 1 || g->in[0] != 1 || g->pad[0] != 0 || g->st[0] != 1 || g->st[1] != g->st[2])
        return false;
    for (int i = 1; i < 3; i++)
        if (g->out[i] != (g->in[i] + 2 * g->pad[i] - g->dil[i] * (g->k[i] - 1) - 1) / g->st[i] + 1)
            return false;
    return g->osz > 0 && g->C > 0 && g->O > 0 &&
           cv_preferred(ctx, g->C, g->O, g->ksz, g->out[1], g->out[2], g->in[2], g->pad[2], g->st[2]);
}

bool kiln__cpu_conv_packed_run(kiln__cpu_ctx *ctx, const geom *g, const float *x, const float *wpack,
                               const float *bias, float *out, const conv_ep *ep)
{
    cvconv cv = {0};
    dconv *d = &cv.d;
    d->N = g->N, d->Ci = g->C, d->Co = g->O;
    /* kiln__cpu_conv_packed_ok checked that the output size is the one this grid gives */
    kiln__cpu_conv_direct_grid(d, g->in[1], g->in[2], g->pad[1], g->pad[2], g->st[2], g->k[1], g->k[2], g->dil[1],
                               g->dil[2]);
    d->inplace = d->nk == 1 && d->ph == 0 && d->pw == 0 && d->s == 1;
    d->x = x, d->bias = bias, d->out = out, d->ep = ep, d->k = ctx->k;
    cv.wpack = wpack;
    cv.osz = d->OH * d->OW;
    cv.nob = (d->Co + CV_NO - 1) / CV_NO;
    cv.ntile = (cv.osz + CV_NP - 1) / CV_NP;
    struct kiln_buffer *h[3] = {0};
    if (!d->inplace)
        d->xp = kiln__cpu_scratch_get(ctx, (size_t)(d->N * d->Ci * d->cs) * sizeof(float), &h[0]);
    int64_t *offs = kiln__cpu_scratch_get(ctx, (size_t)d->nk * sizeof(int64_t), &h[1]);
    int64_t *pin = kiln__cpu_scratch_get(ctx, (size_t)(cv.ntile * CV_NP) * sizeof(int64_t), &h[2]);
    if ((!d->inplace && !d->xp) || !offs || !pin) {
        for (int i = 0; i < 3; i++)
            kiln__cpu_scratch_put(ctx, h[i]);
        return false;
    }
    kiln__cpu_conv_direct_offsets(d, offs, g->k[1], g->k[2], g->dil[1], g->dil[2]);
    /* the last tile's unused lanes repeat the last position: computed, never stored */
    for (int64_t q = 0; q < cv.ntile * CV_NP; q++) {
        int64_t qq = q < cv.osz ? q : cv.osz - 1;
        pin[q] = (qq / d->OW) * d->Wg + qq % d->OW;
    }
    d->offs = offs;
    cv.pin = pin;
    if (!d->inplace)
        kiln__cpu_parallel_for(ctx, d->N * d->Ci * d->Hg, kiln__cpu_conv_direct_pad_grain(d),
                               kiln__cpu_conv_direct_pad, d);
    /* images outermost, then channel blocks: a job's run of tiles reuses one block's
     * weights, and the blocks of one image re-read that image's input while it is still
     * in the shared cache. Blocks outside images made a batch of 8 stream the whole
     * batch's input (12.8 MB at 512 x 28x28) from memory once per block: up to 1.65x
     * the per-image time of batch 1. */
    kiln__cpu_conv_direct_job_run(ctx, cv.nob * d->N * cv.ntile, cvconv_tiles, &cv);
    for (int i = 0; i < 3; i++)
        kiln__cpu_scratch_put(ctx, h[i]);
    return true;
}

static void cv_pack_blocks(void *argp, int64_t b, int64_t e)
{
    const kiln_tdesc *const *io = argp;
    const kiln_tdesc *pk = io[0], *w = io[1];
    float *dst = kiln__cpu_ptr(pk);
    const float *src = kiln__cpu_ptr(w);
    int64_t O = w->shape[0], C = w->shape[1], nk = w->shape[2] * w->shape[3];
    for (int64_t ob = b; ob < e; ob++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t k = 0; k < nk; k++) {
                float *o = dst + ((ob * C + c) * nk + k) * CV_NO;
                for (int64_t j = 0; j < CV_NO; j++) {
                    int64_t a = ob * CV_NO + j;
                    o[j] = a < O ? src[(a * C + c) * nk + k] : 0.0f;
                }
            }
}

int64_t kiln__cpu_conv_pack_size(void *vctx, const kiln_conv_params *p, const kiln_tdesc *x, const kiln_tdesc *w)
{
    kiln__cpu_ctx *ctx = vctx;
    if (!ctx->k->cvconv_f32 || w->dtype != KILN_F32 || w->ndim != 4 || x->ndim != 4 || p->nspatial != 2 ||
        p->groups != 1)
        return 0;
    int64_t od[2];
    for (int i = 0; i < 2; i++) {
        int64_t span = p->dilation[i] * (w->shape[2 + i] - 1) + 1, padded = x->shape[2 + i] + 2 * p->padding[i];
        od[i] = padded >= span ? (padded - span) / p->stride[i] + 1 : 0;
    }
    int64_t osz = od[0] * od[1];
    if (osz == 0 || osz > CV_MAX_POS) /* the direct path serves large maps without packing */
        return 0;
    /* nor is a pack made for a layer the direct tile serves better */
    if (p->stride[0] == p->stride[1] && p->stride[1] > 0 &&
        !cv_preferred(ctx, w->shape[1], w->shape[0], w->shape[2] * w->shape[3], od[0], od[1], x->shape[3],
                      p->padding[1], p->stride[1]))
        return 0;
    return (w->shape[0] + CV_NO - 1) / CV_NO * CV_NO * w->shape[1] * w->shape[2] * w->shape[3];
}

int kiln__cpu_conv_pack(void *vctx, const kiln_tdesc *packed, const kiln_tdesc *w)
{
    kiln__cpu_ctx *ctx = vctx;
    int64_t n = w->dtype == KILN_F32 && w->ndim == 4
                    ? (w->shape[0] + CV_NO - 1) / CV_NO * CV_NO * w->shape[1] * w->shape[2] * w->shape[3]
                    : 0;
    if (n == 0 || !ctx->k->cvconv_f32 || packed->dtype != KILN_F32 || !kiln__cpu_contig(packed) ||
        kiln__cpu_numel(packed) != n || !kiln__cpu_contig(w))
        return kiln__error_set("conv_pack: a contiguous f32 [O, C, KH, KW] weight and a buffer of its packed "
                               "size are needed"),
               KILN_EINVAL;
    const kiln_tdesc *io[2] = {packed, w};
    kiln__cpu_parallel_for(ctx, (w->shape[0] + CV_NO - 1) / CV_NO, 1, cv_pack_blocks, io);
    return 0;
}
