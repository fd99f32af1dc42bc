/*
 * backends/cpu/cpu-conv.c — convolution forward and both backward passes, for 1 to 3
 * spatial dims, with stride, padding, dilation and groups.
 *
 * The classic lowering: kiln__cpu_conv_im2col unrolls each receptive field of one image into a column,
 * so the convolution becomes one GEMM per image and group, [O/g, C/g·k] × [C/g·k, S'],
 * which OpenBLAS runs near peak. The input gradient is the transposed GEMM followed by
 * kiln__cpu_conv_col2im (scatter-add back into the image); the weight gradient is a GEMM of the output
 * gradient with the columns, accumulated over the batch with beta = 1. A 1x1 kernel
 * with unit stride and no padding needs no columns at all: the image already is the
 * matrix. Everything is handled as 3-D (missing leading spatial dims have size 1).
 *
 * f32 forward convolutions mostly avoid the lowering: one group runs on the direct path
 * (a register-tiled kernel over a padded image, any stride through stride phases, below)
 * and one input channel per group on the depthwise path; what remains (f64, grouped
 * convolutions with several channels per group, 3-D, 1x1 kernels on small images) goes
 * through kiln__cpu_conv_im2col and OpenBLAS.
 *
 * kiln__cpu_conv_im2col/kiln__cpu_conv_col2im are threaded over column rows (resp. channels, so no two threads add
 * into the same plane) on our pool, and so are the GEMMs (kiln__cpu_gemm, in blocks).
 * The column buffer comes from the buffer pool, so repeated layers reuse it.
 *
 * This file has the geometry, the lowering, the direct path and the forward entry points;
 * the packed path (and weight packing) is in cpu-conv-packed.c, the depthwise path in
 * cpu-conv-depthwise.c and both backward passes in cpu-conv-backward.c (what they share:
 * cpu-conv-impl.h).
 */
#include <cblas.h>
#include <stdlib.h>

#include "cpu-conv-impl.h"
#include "cpu-impl.h"

const conv_ep kiln__cpu_conv_no_ep = {NULL, KILN_EPI_NONE, 0.0f, 0.0f, NULL, false};

void kiln__cpu_conv_geom_init(geom *g, const kiln_conv_params *p, const kiln_tdesc *x, const kiln_tdesc *w,
                              const kiln_tdesc *y)
{
    int ns = p->nspatial;
    g->N = x->shape[0];
    g->C = x->shape[1];
    g->O = w->shape[0];
    g->G = p->groups > 0 ? p->groups : 1;
    g->Cg = g->C / g->G;
    g->Og = g->O / g->G;
    g->isz = g->osz = g->ksz = 1;
    g->direct = true;
    for (int i = 0; i < 3; i++) {
        int d = i - (3 - ns); /* which real spatial dim, or < 0 for padding dims */
        if (d < 0) {
            g->in[i] = g->out[i] = g->k[i] = g->st[i] = g->dil[i] = 1;
            g->pad[i] = 0;
        } else {
            g->in[i] = x->shape[2 + d];
            g->out[i] = y->shape[2 + d];
            g->k[i] = w->shape[2 + d];
            g->st[i] = p->stride[d];
            g->pad[i] = p->padding[d];
            g->dil[i] = p->dilation[d];
        }
        g->isz *= g->in[i];
        g->osz *= g->out[i];
        g->ksz *= g->k[i];
        if (g->k[i] != 1 || g->st[i] != 1 || g->pad[i] != 0)
            g->direct = false;
    }
}

typedef struct col_job {
    const geom *g;
    void *col;
    void *img;   /* image of one group: Cg planes */
    bool dbl;
} col_job;

/* One column row: channel c, kernel offset (kd, kh, kw). */
#define IM2COL_ROW(T)                                                                        \
    static void im2col_rows_##T(void *argp, int64_t r0, int64_t r1)                          \
    {                                                                                        \
        const col_job *j = argp;                                                             \
        const geom *g = j->g;                                                                \
        const T *img = j->img;                                                               \
        T *col = j->col;                                                                     \
        for (int64_t r = r0; r < r1; r++) {                                                  \
            int64_t kw = r % g->k[2], kh = (r / g->k[2]) % g->k[1];                          \
            int64_t kd = (r / (g->k[2] * g->k[1])) % g->k[0], c = r / g->ksz;                \
            const T *plane = img + c * g->isz;                                               \
            T *dst = col + r * g->osz;                                                       \
            for (int64_t od = 0; od < g->out[0]; od++) {                                     \
                int64_t id = od * g->st[0] - g->pad[0] + kd * g->dil[0];                     \
                for (int64_t oh = 0; oh < g->out[1]; oh++, dst += g->out[2]) {              \
                    int64_t ih = oh * g->st[1] - g->pad[1] + kh * g->dil[1];                 \
                    if (id < 0 || id >= g->in[0] || ih < 0 || ih >= g->in[1]) {              \
                        memset(dst, 0, (size_t)g->out[2] * sizeof(T));                       \
                        continue;                                                            \
                    }                                                                        \
                    const T *src = plane + (id * g->in[1] + ih) * g->in[2];                  \
                    int64_t w0 = kw * g->dil[2] - g->pad[2], sw = g->st[2];                  \
                    /* [lo, hi): the outputs whose input column is inside the image; the  \
                     * edges are zeros and the middle a plain (strided) copy */            \
                    int64_t lo = w0 >= 0 ? 0 : (-w0 + sw - 1) / sw;                          \
                    int64_t hi = g->in[2] - w0 <= 0 ? 0 : (g->in[2] - w0 + sw - 1) / sw;     \
                    if (hi > g->out[2])                                                      \
                        hi = g->out[2];                                                      \
                    if (lo > hi)                                                             \
                        lo = hi;                                                             \
                    for (int64_t ow = 0; ow < lo; ow++)                                      \
                        dst[ow] = (T)0;                                                      \
                    if (sw == 1 && hi > lo)                                                  \
                        memcpy(dst + lo, src + lo + w0, (size_t)(hi - lo) * sizeof(T));      \
                    else if (sw != 1)                                                        \
                        for (int64_t ow = lo; ow < hi; ow++)                                 \
                            dst[ow] = src[ow * sw + w0];                                     \
                    for (int64_t ow = hi; ow < g->out[2]; ow++)                              \
                        dst[ow] = (T)0;                                                      \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
    }

#define COL2IM_CH(T)                                                                         \
    static void col2im_ch_##T(void *argp, int64_t c0, int64_t c1)                            \
    {                                                                                        \
        const col_job *j = argp;                                                             \
        const geom *g = j->g;                                                                \
        T *img = j->img;                                                                     \
        const T *col = j->col;                                                               \
        for (int64_t c = c0; c < c1; c++) {                                                  \
            T *plane = img + c * g->isz;                                                     \
            for (int64_t kk = 0; kk < g->ksz; kk++) {                                        \
                int64_t kw = kk % g->k[2], kh = (kk / g->k[2]) % g->k[1];                    \
                int64_t kd = kk / (g->k[2] * g->k[1]);                                       \
                const T *src = col + (c * g->ksz + kk) * g->osz;                             \
                for (int64_t od = 0; od < g->out[0]; od++) {                                 \
                    int64_t id = od * g->st[0] - g->pad[0] + kd * g->dil[0];                 \
                    for (int64_t oh = 0; oh < g->out[1]; oh++, src += g->out[2]) {          \
                        int64_t ih = oh * g->st[1] - g->pad[1] + kh * g->dil[1];             \
                        if (id < 0 || id >= g->in[0] || ih < 0 || ih >= g->in[1])            \
                            continue;                                                        \
                        T *dst = plane + (id * g->in[1] + ih) * g->in[2];                    \
                        int64_t w0 = kw * g->dil[2] - g->pad[2], sw = g->st[2];              \
                        for (int64_t ow = 0; ow < g->out[2]; ow++) {                         \
                            int64_t iw = ow * sw + w0;                                       \
                            if (iw >= 0 && iw < g->in[2])                                    \
                                dst[iw] += src[ow];                                          \
                        }                                                                    \
                    }                                                                        \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
    }

IM2COL_ROW(float)
IM2COL_ROW(double)
COL2IM_CH(float)
COL2IM_CH(double)

void kiln__cpu_conv_im2col(kiln__cpu_ctx *ctx, const geom *g, void *col, void *img, bool dbl)
{
    col_job j = {g, col, img, dbl};
    int64_t rows = g->Cg * g->ksz;
    kiln__cpu_parallel_for(ctx, rows, 1 + 32768 / (g->osz + 1),
                           dbl ? im2col_rows_double : im2col_rows_float, &j);
}

void kiln__cpu_conv_col2im(kiln__cpu_ctx *ctx, const geom *g, void *col, void *img, bool dbl)
{
    col_job j = {g, col, img, dbl};
    kiln__cpu_parallel_for(ctx, g->Cg, 1 + 32768 / (g->ksz * g->osz + 1),
                           dbl ? col2im_ch_double : col2im_ch_float, &j);
}

typedef struct bias_job {
    void *out;
    const void *bias;
    int64_t O, osz;
    bool dbl;
} bias_job;

static void bias_range(void *argp, int64_t b, int64_t e)
{
    const bias_job *j = argp;
    for (int64_t r = b; r < e; r++) {
        int64_t o = r % j->O;
        if (j->dbl) {
            double *p = (double *)j->out + r * j->osz, v = ((const double *)j->bias)[o];
            for (int64_t i = 0; i < j->osz; i++)
                p[i] += v;
        } else {
            float *p = (float *)j->out + r * j->osz, v = ((const float *)j->bias)[o];
            for (int64_t i = 0; i < j->osz; i++)
                p[i] += v;
        }
    }
}


/* ------------------------------------------------------------------ direct path */

/* An f32 2-D (or 1-D) convolution with one group on a CPU whose kernel table has
 * conv_tile_f32 runs without kiln__cpu_conv_im2col. Profiles of the GEMM lowering on a 3x3, 64-channel
 * layer spent as much time writing the column matrix and in OpenBLAS packing it again
 * as in the multiply itself; here the input is copied once into a zero-padded image
 * (so a kernel offset is just an address offset on the padded grid), the weights are
 * packed into blocks of the tile's output channels (8 for AVX-512, 4 for AVX2), and the
 * tile kernel reads both straight from cache. Tiles of positions are spread over the
 * pool.
 *
 * Stride s > 1 keeps every kernel offset a plain address offset by splitting the padded
 * image into its s·s phases (rows ≡ a, columns ≡ b mod s), each a dense plane of
 * ceil(Hp/s) × ceil(Wp/s): output (oh, ow) reads tap (kh, kw) from phase
 * (kh·dh mod s, kw·dw mod s) at (oh + kh·dh div s, ow + kw·dw div s), so the tile runs
 * over a grid of ceil(Wp/s) columns exactly as in the stride-1 case, with no wasted
 * multiplies. A 1x1 kernel with stride 1 and no padding reads the input in place: the
 * tile is then a GEMM micro-kernel on the NCHW image, and the convolution never leaves
 * our pool for OpenBLAS's threads (whose waiting between calls costs the pool's cores
 * when the two alternate layer by layer, as in a ResNet).
 *
 * The same routine computes the input gradient, which for stride 1 is a convolution of
 * the padded output gradient with the flipped, channel-transposed kernel. */

/* The stride-phased padded grid of an H x W input (padding ph, pw, stride s) under a
 * KH x KW kernel with dilation (dh, dw): grid and output sizes, plane and channel sizes.
 * Shared by the direct, depthwise and packed paths. */
void kiln__cpu_conv_direct_grid(dconv *d, int64_t H, int64_t W, int64_t ph, int64_t pw, int64_t s, int64_t KH,
                                int64_t KW, int64_t dh, int64_t dw)
{
    d->H = H, d->W = W, d->ph = ph, d->pw = pw, d->s = s;
    int64_t Hp = H + 2 * ph, Wp = W + 2 * pw;
    d->Hg = (Hp + s - 1) / s, d->Wg = (Wp + s - 1) / s;
    d->OH = (Hp - dh * (KH - 1) - 1) / s + 1, d->OW = (Wp - dw * (KW - 1) - 1) / s + 1;
    d->pp = d->Hg * d->Wg;
    d->cs = s * s * d->pp;
    d->nk = KH * KW;
}

/* offs[kh·KW + kw]: where tap (kh, kw) reads, relative to its output's grid position. */
void kiln__cpu_conv_direct_offsets(const dconv *d, int64_t *offs, int64_t KH, int64_t KW, int64_t dh, int64_t dw)
{
    const int64_t s = d->s;
    for (int64_t kh = 0; kh < KH; kh++)
        for (int64_t kw = 0; kw < KW; kw++) {
            int64_t rh = kh * dh, rw = kw * dw;
            offs[kh * KW + kw] = ((rh % s) * s + rw % s) * d->pp + (rh / s) * d->Wg + rw / s;
        }
}

/* Rows [b, e) of the padded, stride-phased input, counted over planes × Hg: row i of
 * plane pl is row i of each of its s·s phases. By rows rather than by planes, so a
 * network's first layer (three input planes at batch 1) pads on every thread. */
void kiln__cpu_conv_direct_pad(void *argp, int64_t b, int64_t e)
{
    const dconv *d = argp;
    if (d->inplace)
        return;
    const int64_t s = d->s;
    for (int64_t u = b; u < e; u++) {
        const int64_t pl = u / d->Hg, i = u % d->Hg;
        const float *src = d->x + pl * d->H * d->W;
        float *dst = d->xp + pl * d->cs;
        for (int64_t a = 0; a < s; a++) {
            const int64_t h = s * i + a - d->ph;
            const bool inside = h >= 0 && h < d->H;
            if (s == 1) {
                float *row = dst + i * d->Wg;
                if (!inside) {
                    memset(row, 0, (size_t)d->Wg * sizeof(float));
                    continue;
                }
                memset(row, 0, (size_t)d->pw * sizeof(float));
                memcpy(row + d->pw, src + h * d->W, (size_t)d->W * sizeof(float));
                memset(row + d->pw + d->W, 0, (size_t)(d->Wg - d->pw - d->W) * sizeof(float));
                continue;
            }
            if (s == 2 && d->k->pad_row_s2_f32) {
                float *p0 = dst + (a * 2) * d->pp + i * d->Wg, *p1 = p0 + d->pp;
                if (!inside) {
                    memset(p0, 0, (size_t)d->Wg * sizeof(float));
                    memset(p1, 0, (size_t)d->Wg * sizeof(float));
                } else {
                    d->k->pad_row_s2_f32(p0, p1, src + h * d->W, d->W, d->pw, d->Wg);
                }
                continue;
            }
            for (int64_t bb = 0; bb < s; bb++) {
                float *row = dst + (a * s + bb) * d->pp + i * d->Wg;
                if (!inside) {
                    memset(row, 0, (size_t)d->Wg * sizeof(float));
                    continue;
                }
                /* columns j of this phase whose input column s·j + bb - pw is inside */
                int64_t w0 = bb - d->pw;
                int64_t lo = w0 >= 0 ? 0 : (-w0 + s - 1) / s;
                int64_t hi = d->W - w0 <= 0 ? 0 : (d->W - w0 + s - 1) / s;
                if (hi > d->Wg)
                    hi = d->Wg;
                if (lo > hi)
                    lo = hi;
                const float *in = src + h * d->W + w0;
                for (int64_t j = 0; j < lo; j++)
                    row[j] = 0.0f;
                for (int64_t j = lo; j < hi; j++)
                    row[j] = in[s * j];
                for (int64_t j = hi; j < d->Wg; j++)
                    row[j] = 0.0f;
            }
        }
    }
}

/* How many padded rows a job pads at least: about 16K floats written. */
int64_t kiln__cpu_conv_direct_pad_grain(const dconv *d)
{
    return 1 + 16384 / (d->s * d->s * d->Wg + 1);
}

/* Pack output-channel blocks [b, e) of the weights; reads each block's rows in order. */
static void dconv_pack(void *argp, int64_t b, int64_t e)
{
    const dconv *d = argp;
    const int64_t TO = d->to, nk = d->nk, KW = d->KW;
    for (int64_t ob = b; ob < e; ob++)
        for (int64_t c = 0; c < d->Ci; c++) {
            float *dst = d->wpack + (ob * d->Ci + c) * nk * TO;
            for (int64_t j = 0; j < TO; j++) {
                int64_t a = ob * TO + j;
                if (a >= d->Co) {
                    for (int64_t kk = 0; kk < nk; kk++)
                        dst[kk * TO + j] = 0.0f;
                    continue;
                }
                const float *src = d->w + a * d->sa + c * d->sc;
                for (int64_t kk = 0; kk < nk; kk++)
                    dst[kk * TO + j] = src[(kk / KW) * d->skh + (kk % KW) * d->skw];
            }
        }
}

/* A chained tile's output runs requested for writing before the tile is computed: a
 * fused group's stored result was allocated before the buffers of the group before it came
 * back to the pool, so its lines are seldom in the caches, and writing them after the
 * sums stalled the tile loop (a 1x1 layer 64 -> 256 on 56x56 with its batch norm and ReLU
 * chained: 0.66-0.75 ms without, 0.57 with; the convolution alone 0.49). */
static void chain_prefetch(const dconv *d, int64_t n, int64_t ob, int64_t jn, const int64_t (*seg)[3], int nseg)
{
    for (int64_t j = 0; j < jn; j++) {
        const float *plane = d->out + (n * d->Co + ob * d->to + j) * d->OH * d->OW;
        for (int s = 0; s < nseg; s++)
            for (int64_t i = 0; i < seg[s][2]; i += 16)
                __builtin_prefetch(plane + seg[s][1] + i, 1, 3);
    }
}

static void dconv_tiles(void *argp, int64_t b, int64_t e)
{
    const dconv *d = argp;
    float tile[DT_OMAX * DT_QMAX] __attribute__((aligned(64)));
    const int64_t TO = d->to, TQ = d->tq;
    int64_t nq_all = d->OH * d->Wg;
    /* the runs of a tile that are real outputs (grid columns below OW), found once per
     * tile and reused for its 8 channels: [offset in tile, offset in plane, length] */
    int64_t seg[DT_QMAX][3];
    const conv_ep *ep = d->ep ? d->ep : &kiln__cpu_conv_no_ep;
    const int64_t ntall = d->N * d->ntile, wrs = d->Ci * d->nk, nfull = d->Co / TO;
    for (int64_t jt = b; jt < e; jt++) {
        int64_t t = d->wmajor ? jt % ntall : jt / d->nobg, g = d->wmajor ? jt / ntall : jt % d->nobg;
        int64_t ob0 = d->nob * g / d->nobg, ob1 = d->nob * (g + 1) / d->nobg;
        int64_t n = t / d->ntile, q0 = (t % d->ntile) * TQ;
        int nq = (int)(nq_all - q0 < TQ ? nq_all - q0 : TQ);
        int nseg = 0;
        for (int64_t q = q0, qe = q0 + nq; q < qe;) {
            int64_t oh = q / d->Wg, ow = q - oh * d->Wg;
            int64_t run = d->Wg - ow < qe - q ? d->Wg - ow : qe - q;
            int64_t valid = ow < d->OW ? (d->OW - ow < run ? d->OW - ow : run) : 0;
            if (valid > 0) {
                seg[nseg][0] = q - q0;
                seg[nseg][1] = oh * d->OW + ow;
                seg[nseg][2] = valid;
                nseg++;
            }
            q += run;
        }
        const float *xq = (d->inplace ? d->x : d->xp) + n * d->Ci * d->cs + q0;
        const int64_t osz = d->OH * d->OW;
        for (int64_t ob = ob0; ob < ob1; ob++) {
            int64_t jn = d->Co - ob * TO < TO ? d->Co - ob * TO : TO;
            const float *wb = ob < nfull ? d->w + ob * TO * wrs : d->wpack;
            if (d->rows && d->Wg == d->OW) {
                /* every grid position is an output: the kernel stores them in place */
                int64_t at = (n * d->Co + ob * TO) * osz + q0;
                const float *bo = d->bias ? d->bias + ob * TO : NULL;
                if (ep->chain && d->k->conv_tile_rows_chain_f32) {
                    d->k->conv_tile_rows_chain_f32(d->out + at, osz, bo, (int)jn, xq, d->cs, d->Ci, d->offs, d->nk,
                                                   wb, wrs, nq, ep->chain, at, n * d->Co + ob * TO);
                    continue;
                }
                d->k->conv_tile_rows_f32(d->out + at, osz, bo, (int)jn, xq, d->cs, d->Ci, d->offs, d->nk, wb, wrs,
                                         nq, ep->res ? ep->res + at : NULL, ep->act, ep->a, ep->b);
                if (ep->chain) /* a table without the chained tile: while the tile is in L1 */
                    d->k->chain_rows_f32(d->out + at, osz, d->out + at, osz, NULL, (int)jn, nq, ep->chain, at,
                                         n * d->Co + ob * TO);
                continue;
            }
            /* a chain of per-channel operands only (a batch norm and a ReLU) is applied to
             * the tile while it is in registers or L1, and its runs copied out as they are */
            bool tile_chain = ep->chain && !ep->chain_full;
            if (ep->chain) /* the runs' lines asked for while the tile computes */
                chain_prefetch(d, n, ob, jn, seg, nseg);
            if (tile_chain && d->rows && d->k->conv_tile_rows_chain_f32) {
                d->k->conv_tile_rows_chain_f32(tile, TQ, d->bias ? d->bias + ob * TO : NULL, (int)jn, xq, d->cs,
                                               d->Ci, d->offs, d->nk, wb, wrs, nq, ep->chain, 0,
                                               n * d->Co + ob * TO);
            } else {
                if (!d->rows)
                    d->k->conv_tile_f32(tile, xq, d->cs, d->Ci, d->offs, d->nk, d->wpack + ob * wrs * TO, nq);
                else
                    d->k->conv_tile_rows_f32(tile, TQ, NULL, (int)TO, xq, d->cs, d->Ci, d->offs, d->nk, wb, wrs,
                                             nq, NULL, KILN_EPI_NONE, 0.0f, 0.0f);
                if (tile_chain)
                    d->k->chain_rows_f32(tile, TQ, tile, TQ, d->bias ? d->bias + ob * TO : NULL, (int)jn, nq,
                                         ep->chain, 0, n * d->Co + ob * TO);
            }
            if (tile_chain) {
                for (int64_t j = 0; j < jn; j++) {
                    float *plane = d->out + (n * d->Co + ob * TO + j) * osz;
                    for (int s = 0; s < nseg; s++)
                        memcpy(plane + seg[s][1], tile + j * TQ + seg[s][0], (size_t)seg[s][2] * sizeof(float));
                }
                continue;
            }
            for (int64_t j = 0; j < jn; j++) {
                int64_t o = ob * TO + j;
                float bv = d->bias ? d->bias[o] : 0.0f;
                float *plane = d->out + (n * d->Co + o) * d->OH * d->OW;
                const float *src = tile + j * TQ;
                for (int s = 0; s < nseg; s++) {
                    float *dst = plane + seg[s][1];
                    if (ep->chain)
                        d->k->chain_rows_f32(dst, 0, src + seg[s][0], 0, &bv, 1, seg[s][2], ep->chain,
                                             dst - d->out, n * d->Co + o);
                    else
                        d->k->bias_act_f32(dst, src + seg[s][0], seg[s][2], bv,
                                           ep->res ? ep->res + (dst - d->out) : NULL, ep->act, ep->a, ep->b);
                }
            }
        }
    }
}

static void dconv_images(void *argp, int64_t b, int64_t e)
{
    const dconv *d = argp;
    for (int64_t n = b; n < e; n++) {
        kiln__cpu_conv_direct_pad(argp, n * d->Ci * d->Hg, (n + 1) * d->Ci * d->Hg);
        dconv_tiles(argp, n * d->ntile, (n + 1) * d->ntile);
    }
}

/* Hand [0, n) out in up to 8 jobs per thread rather than one equal share each: the pool
 * gives jobs to whichever thread is free, so a thread that loses its core for a while
 * (a shared machine, another process) does not hold the others back at the end. */
typedef struct dconv_jobs {
    kiln__cpu_range_fn fn;
    void *arg;
    int64_t n;
} dconv_jobs;

static void dconv_job(void *argp, int job, int njobs)
{
    const dconv_jobs *j = argp;
    int64_t b = j->n * job / njobs, e = j->n * (job + 1) / njobs;
    if (e > b)
        j->fn(j->arg, b, e);
}

void kiln__cpu_conv_direct_job_run(kiln__cpu_ctx *ctx, int64_t n, kiln__cpu_range_fn fn, void *arg)
{
    int64_t njobs = 8 * (int64_t)ctx->nthreads;
    if (njobs > n)
        njobs = n;
    dconv_jobs j = {fn, arg, n};
    kiln__cpu_pool_run(ctx->pool, (int)njobs, dconv_job, &j);
}

/* Run the direct path: x [N, Ci, H, W] padded by (ph, pw), kernel KH×KW with dilation
 * (dh, dw) and stride s in both dims; weight element (output channel a, input channel c,
 * kh, kw) is at w[a·sa + c·sc + kh·skh + kw·skw] (negative strides flip). Returns false
 * when scratch memory is short, so the caller can fall back. */
bool kiln__cpu_conv_direct_run(kiln__cpu_ctx *ctx, int64_t N, int64_t Ci, int64_t Co, int64_t H, int64_t W,
                               int64_t ph, int64_t pw, int64_t KH, int64_t KW, int64_t dh, int64_t dw, int64_t s,
                               const float *x, const float *w, int64_t sa, int64_t sc, int64_t skh, int64_t skw,
                               const float *bias, float *out, const conv_ep *ep)
{
    dconv d = {0};
    d.N = N, d.Ci = Ci, d.Co = Co;
    kiln__cpu_conv_direct_grid(&d, H, W, ph, pw, s, KH, KW, dh, dw);
    d.inplace = KH == 1 && KW == 1 && ph == 0 && pw == 0 && s == 1;
    const int64_t TO = ctx->k->conv_tile_o, TQ = ctx->k->conv_tile_q;
    d.to = TO, d.tq = TQ;
    d.nob = (Co + TO - 1) / TO;
    d.ntile = (d.OH * d.Wg + TQ - 1) / TQ;
    d.x = x, d.bias = bias, d.out = out, d.ep = ep, d.k = ctx->k;
    d.w = w, d.sa = sa, d.sc = sc, d.skh = skh, d.skw = skw, d.KW = KW;
    struct kiln_buffer *h[3] = {0};
    /* slack: the discarded grid columns of the last rows read up to Wg past the image */
    if (!d.inplace)
        d.xp = kiln__cpu_scratch_get(ctx, (size_t)(N * Ci * d.cs + d.Wg + TQ) * sizeof(float), &h[0]);
    /* weights laid out as [Co, Ci, KH, KW] are read in place when there are few positions
     * per weight (at batch 1 the packing pass cost up to as much as the multiplies, and in
     * a whole model it is one more trip over every weight through memory); with many
     * (a batch of large images) the packed copy's single stream wins, by ~14% at 3x3
     * 64 -> 64 on 8 x 56x56. Only a last, partial block of channels is copied then,
     * padded with zero rows. */
    d.rows = ctx->k->conv_tile_rows_f32 && skw == 1 && skh == KW && sc == d.nk && sa == Ci * d.nk &&
             N * d.OH * d.OW < 8192;
    size_t wpn = d.rows ? (size_t)(TO * Ci * d.nk) : (size_t)(d.nob * Ci * d.nk * TO);
    float *wp = kiln__cpu_scratch_get(ctx, wpn * sizeof(float), &h[1]);
    int64_t *offs = kiln__cpu_scratch_get(ctx, (size_t)d.nk * sizeof(int64_t), &h[2]);
    if ((!d.inplace && !d.xp) || !wp || !offs) {
        for (int i = 0; i < 3; i++)
            kiln__cpu_scratch_put(ctx, h[i]);
        return false;
    }
    if (!d.inplace)
        memset(d.xp + N * Ci * d.cs, 0, (size_t)(d.Wg + TQ) * sizeof(float));
    kiln__cpu_conv_direct_offsets(&d, offs, KH, KW, dh, dw);
    d.wpack = wp;
    d.offs = offs;
    if (!d.rows) {
        kiln__cpu_parallel_for(ctx, d.nob, 1 + 16384 / (Ci * d.nk * TO + 1), dconv_pack, &d);
    } else if (Co % TO) {
        int64_t full = Co / TO * TO, wrs = Ci * d.nk;
        memcpy(wp, w + full * wrs, (size_t)((Co - full) * wrs) * sizeof(float));
        memset(wp + (Co - full) * wrs, 0, (size_t)((full + TO - Co) * wrs) * sizeof(float));
    }
    if (N % ctx->nthreads == 0 || N >= 4 * (int64_t)ctx->nthreads) {
        /* whole images per job: each thread pads an image and then runs its tiles while
         * the padded copy is still in its L2 */
        d.nobg = 1;
        kiln__cpu_conv_direct_job_run(ctx, N, dconv_images, &d);
        for (int i = 0; i < 3; i++)
            kiln__cpu_scratch_put(ctx, h[i]);
        return true;
    }
    if (!d.inplace)
        kiln__cpu_parallel_for(ctx, N * Ci * d.Hg, kiln__cpu_conv_direct_pad_grain(&d), kiln__cpu_conv_direct_pad,
                               &d);
    /* jobs are tiles of positions, each over all channel blocks (the input of a tile then
     * stays in L1 across them); when there are too few tiles to keep every thread busy
     * (small images, batch 1), the channel blocks are split across jobs as well */
    d.nobg = 1;
    if (Co * Ci * d.nk > N * Ci * d.cs) {
        /* more weights than input (deep layers on small images): each job keeps one block
         * of channels' weights in cache across a run of tiles, rather than streaming all
         * the weights past every tile */
        d.wmajor = true;
        d.nobg = d.nob;
    } else if (N * d.ntile < 4 * (int64_t)ctx->nthreads) {
        d.nobg = 4 * (int64_t)ctx->nthreads;
        if (d.nobg > d.nob)
            d.nobg = d.nob;
    }
    kiln__cpu_conv_direct_job_run(ctx, N * d.ntile * d.nobg, dconv_tiles, &d);
    for (int i = 0; i < 3; i++)
        kiln__cpu_scratch_put(ctx, h[i]);
    return true;
}

/* Whether the direct path applies: f32, a table with the tile kernel, one group, 1-D
 * or 2-D, the same stride in both dims, and an output of the usual size. */
bool kiln__cpu_conv_direct_ok(const kiln__cpu_ctx *ctx, const geom *g, bool dbl)
{
    if (dbl || !ctx->k->conv_tile_f32 || g->G != 1)
        return false;
    /* a 1x1 kernel on an image smaller than one tile (the 1x1 maps of squeeze-excitation
     * blocks, fully connected layers written as convolutions) would leave most of the
     * tile's positions empty; the GEMM lowering is the better fit there. From 7x7 up the
     * tile wins in a whole model even at half occupancy, as it keeps the layer on our
     * pool rather than waking OpenBLAS's threads between our layers. */
    if (g->ksz == 1 && g->osz < ctx->k->conv_tile_q)
        return false;
    if (g->k[0] != 1 || g->in[0] != 1 || g->pad[0] != 0 || g->st[0] != 1)
        return false;
    /* a 1-D convolution has a unit stride in its missing height dim */
    if (g->st[1] != g->st[2] && !(g->in[1] == 1 && g->k[1] == 1 && g->pad[1] == 0))
        return false;
    for (int i = 1; i < 3; i++)
        if (g->out[i] != (g->in[i] + 2 * g->pad[i] - g->dil[i] * (g->k[i] - 1) - 1) / g->st[i] + 1)
            return false;
    return g->osz > 0 && g->C > 0 && g->O > 0;
}

/* Contiguous f32/f64 views of the operands; outputs get scratch when they need it. */
void *kiln__cpu_conv_out_buffer(kiln__cpu_ctx *ctx, const kiln_tdesc *d, kiln_dtype ct, opnd *o)
{
    o->h = NULL;
    if (d->dtype == ct && kiln__cpu_contig(d))
        return o->p = kiln__cpu_ptr(d);
    return o->p = kiln__cpu_scratch_get(ctx, (size_t)kiln__cpu_numel(d) * kiln__cpu_esize(ct), &o->h);
}

void kiln__cpu_conv_release(kiln__cpu_ctx *ctx, opnd *ops, int n)
{
    for (int i = 0; i < n; i++)
        kiln__cpu_scratch_put(ctx, ops[i].h);
}

/* The epilogue over rows of n outputs, as a pass of its own: the GEMM lowering's planes
 * and the epilogue entry's rows. res follows the rows; bias (n long) is the same for each. */
typedef struct ep_rows {
    const kiln__cpu_kernels *k;
    float *out;
    const float *res, *bias;
    int act;
    float a, b;
    int64_t n;
} ep_rows;

static void ep_rows_run(void *argp, int64_t b, int64_t e)
{
    const ep_rows *j = argp;
    for (int64_t r = b; r < e; r++)
        j->k->epilogue_f32(j->out + r * j->n, j->res ? j->res + r * j->n : NULL, j->bias, j->n, j->act, j->a, j->b);
}

/* A chain over whole output planes (of osz elements), a pass of its own. */
typedef struct chain_pass {
    const kiln__cpu_kernels *k;
    float *out;
    const kiln__cpu_chain *c;
    int64_t osz;
} chain_pass;

static void chain_pass_run(void *argp, int64_t b, int64_t e)
{
    const chain_pass *j = argp;
    for (int64_t r = b; r < e; r++)
        j->k->chain_rows_f32(j->out + r * j->osz, j->osz, j->out + r * j->osz, j->osz, NULL, 1, j->osz, j->c,
                             r * j->osz, r);
}

static int conv_run(kiln__cpu_ctx *ctx, const kiln_conv_params *p, const kiln_tdesc *out, const kiln_tdesc *x,
                    const kiln_tdesc *w, const kiln_tdesc *wpacked, const kiln_tdesc *bias, const conv_ep *ep)
{
    geom g;
    kiln__cpu_conv_geom_init(&g, p, x, w, out);
    kiln_dtype ct = kiln__cpu_fdt(out->dtype);
    bool dbl = ct == KILN_F64;
    size_t es = kiln__cpu_esize(ct);
    opnd ops[5] = {{0}};
    ops[0].p = kiln__cpu_materialize(ctx, x, ct, &ops[0].h);
    ops[1].p = kiln__cpu_materialize(ctx, w, ct, &ops[1].h);
    if (bias)
        ops[2].p = kiln__cpu_materialize(ctx, bias, ct, &ops[2].h);
    kiln__cpu_conv_out_buffer(ctx, out, ct, &ops[3]);
    int64_t rows = g.Cg * g.ksz;
    bool packed = kiln__cpu_conv_packed_ok(ctx, &g, dbl, wpacked);
    bool depthwise = !packed && kiln__cpu_conv_depthwise_ok(ctx, &g, dbl);
    bool tiled = !packed && !depthwise && kiln__cpu_conv_direct_ok(ctx, &g, dbl);
    bool need_col = !g.direct && !tiled && !depthwise && !packed;
    if (need_col)
        ops[4].p = kiln__cpu_scratch_get(ctx, (size_t)(rows * g.osz) * es, &ops[4].h);
    if (!ops[0].p || !ops[1].p || (bias && !ops[2].p) || !ops[3].p || (need_col && !ops[4].p)) {
        kiln__cpu_conv_release(ctx, ops, 5);
        return kiln__cpu_enomem("conv");
    }
    char *xp = ops[0].p, *wp = ops[1].p, *op = ops[3].p, *col = ops[4].p;
    if (packed) {
        if (!kiln__cpu_conv_packed_run(ctx, &g, (const float *)xp, kiln__cpu_ptr(wpacked), bias ? ops[2].p : NULL,
                                       (float *)op, ep)) {
            kiln__cpu_conv_release(ctx, ops, 5);
            return kiln__cpu_enomem("conv");
        }
    } else if (depthwise) {
        if (!kiln__cpu_conv_depthwise_run(ctx, &g, (const float *)xp, (const float *)wp, bias ? ops[2].p : NULL,
                                          (float *)op, ep)) {
            kiln__cpu_conv_release(ctx, ops, 5);
            return kiln__cpu_enomem("conv");
        }
    } else if (tiled) {
        if (!kiln__cpu_conv_direct_run(ctx, g.N, g.C, g.O, g.in[1], g.in[2], g.pad[1], g.pad[2], g.k[1], g.k[2],
                                       g.dil[1], g.dil[2], g.st[2], (const float *)xp, (const float *)wp,
                                       g.C * g.ksz, g.ksz, g.k[2], 1, bias ? ops[2].p : NULL, (float *)op, ep)) {
            kiln__cpu_conv_release(ctx, ops, 5);
            return kiln__cpu_enomem("conv");
        }
    } else if (g.osz > 0 && g.Og > 0) {
        for (int64_t n = 0; n < g.N; n++) {
            for (int64_t gi = 0; gi < g.G; gi++) {
                char *img = xp + ((n * g.C + gi * g.Cg) * g.isz) * (int64_t)es;
                char *dst = op + ((n * g.O + gi * g.Og) * g.osz) * (int64_t)es;
                const char *wg = wp + (gi * g.Og * rows) * (int64_t)es;
                const void *B = img;
                if (!g.direct) {
                    kiln__cpu_conv_im2col(ctx, &g, col, img, dbl);
                    B = col;
                }
                if (rows == 0)
                    memset(dst, 0, (size_t)(g.Og * g.osz) * es);
                else
                    kiln__cpu_gemm(ctx, dbl, false, false, g.Og, g.osz, rows, wg, rows, B, g.osz, 0.0, dst, g.osz);
            }
        }
        if (bias) {
            bias_job bj = {op, ops[2].p, g.O, g.osz, dbl};
            kiln__cpu_parallel_for(ctx, g.N * g.O, 1 + 16384 / g.osz, bias_range, &bj);
        }
        if (ep && (ep->res || ep->act != KILN_EPI_NONE)) {
            /* the GEMM path's epilogue is one more pass: only f32 gets here with one */
            ep_rows ej = {ctx->k, (float *)op, ep->res, NULL, ep->act, ep->a, ep->b, g.osz};
            kiln__cpu_parallel_for(ctx, g.N * g.O, 1 + 16384 / g.osz, ep_rows_run, &ej);
        }
    }
    if (ep && ep->chain && !tiled) {
        /* only the direct path's tiles take a chain as they are stored: one pass here */
        chain_pass cj = {ctx->k, (float *)op, ep->chain, g.osz};
        kiln__cpu_parallel_for(ctx, g.N * g.O, 1 + 16384 / g.osz, chain_pass_run, &cj);
    }
    if (ops[3].h)
        kiln__cpu_writeback(ctx, out, ops[3].p, ct);
    kiln__cpu_conv_release(ctx, ops, 5);
    return 0;
}

int kiln__cpu_conv(void *vctx, const kiln_conv_params *p, const kiln_tdesc *out, const kiln_tdesc *x,
                   const kiln_tdesc *w, const kiln_tdesc *bias)
{
    return conv_run(vctx, p, out, x, w, NULL, bias, NULL);
}

int kiln__cpu_conv_fused(void *vctx, const kiln_conv_params *p, const kiln_tdesc *out, const kiln_tdesc *x,
                         const kiln_tdesc *w, const kiln_tdesc *wpacked, const kiln_tdesc *bias,
                         const kiln_epilogue *ep)
{
    kiln__cpu_ctx *ctx = vctx;
    if (out->dtype != KILN_F32)
        return kiln__error_set("conv_fused: f32 only, got %s", kiln_dtype_name(out->dtype)), KILN_ENOTSUP;
    conv_ep e = {
        NULL, ep ? (int)ep->act : KILN_EPI_NONE, ep ? (float)ep->alpha : 0.0f, ep ? (float)ep->beta : 0.0f, NULL,
        false};
    struct kiln_buffer *rh = NULL;
    if (ep && ep->residual) {
        e.res = kiln__cpu_materialize(ctx, ep->residual, KILN_F32, &rh);
        if (!e.res)
            return kiln__cpu_enomem("conv_fused");
    }
    int rc = conv_run(ctx, p, out, x, w, wpacked, bias, e.res || e.act != KILN_EPI_NONE ? &e : NULL);
    kiln__cpu_scratch_put(ctx, rh);
    return rc;
}

int kiln__cpu_conv_chain(kiln__cpu_ctx *ctx, const kiln_conv_params *p, const kiln_tdesc *out, const kiln_tdesc *x,
                         const kiln_tdesc *w, const kiln_tdesc *bias, const kiln__cpu_chain *chain)
{
    if (out->dtype != KILN_F32)
        return kiln__error_set("conv: a chained epilogue takes f32 only, got %s", kiln_dtype_name(out->dtype)),
               KILN_ENOTSUP;
    conv_ep e = {NULL, KILN_EPI_NONE, 0.0f, 0.0f, chain, false};
    for (int k = 0; k < chain->nops; k++)
        e.chain_full = e.chain_full || chain->ops[k].full;
    return conv_run(ctx, p, out, x, w, NULL, bias, chain->nops > 0 ? &e : NULL);
}

int kiln__cpu_epilogue(void *vctx, const kiln_tdesc *out, const kiln_epilogue *ep)
{
    kiln__cpu_ctx *ctx = vctx;
    if (out->dtype != KILN_F32 || !kiln__cpu_contig(out))
        return kiln__error_set("epilogue: a contiguous f32 output only"), KILN_ENOTSUP;
    int64_t numel = kiln__cpu_numel(out), n = out->ndim ? out->shape[out->ndim - 1] : 1;
    if (numel == 0 || n == 0)
        return 0;
    struct kiln_buffer *h[2] = {0};
    ep_rows j = {ctx->k, kiln__cpu_ptr(out), NULL, NULL, (int)ep->act, (float)ep->alpha, (float)ep->beta, n};
    if (ep->bias)
        j.bias = kiln__cpu_materialize(ctx, ep->bias, KILN_F32, &h[0]);
    if (ep->residual)
        j.res = kiln__cpu_materialize(ctx, ep->residual, KILN_F32, &h[1]);
    if ((ep->bias && !j.bias) || (ep->residual && !j.res)) {
        kiln__cpu_scratch_put(ctx, h[0]);
        kiln__cpu_scratch_put(ctx, h[1]);
        return kiln__cpu_enomem("epilogue");
    }
    kiln__cpu_parallel_for(ctx, numel / n, 1 + 16384 / n, ep_rows_run, &j);
    kiln__cpu_scratch_put(ctx, h[0]);
    kiln__cpu_scratch_put(ctx, h[1]);
    return 0;
}
