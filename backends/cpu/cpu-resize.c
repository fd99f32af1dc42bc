/*
 * backends/cpu/cpu-resize.c — interpolate (nearest, bilinear) with backward, and pad
 * (constant, reflect, replicate).
 *
 * Interpolation works on the last two dims ([N, C, H, W], or [N, C, W] as a height-1
 * image) and is threaded over planes; source coordinates follow PyTorch's formulas for
 * align_corners true and false exactly, since a half-pixel difference shows up as a
 * visibly shifted image. The backward pass scatters each output gradient onto the
 * same (one or four) source pixels with the same weights, plane by plane, so threads
 * never add into the same memory.
 *
 * Pad maps every output coordinate back to an input coordinate per dim (or to the fill
 * value) and is threaded over output rows; elements are copied as raw bytes, so every
 * dtype pads exactly.
 */
#include <stdlib.h>

#include "cpu-impl.h"

typedef struct rgeom {
    int64_t planes, ih, iw, oh, ow;
} rgeom;

static void rgeom_init(rgeom *g, const kiln_tdesc *big_in, const kiln_tdesc *out)
{
    int nd = big_in->ndim;
    g->iw = big_in->shape[nd - 1];
    g->ih = nd >= 2 ? big_in->shape[nd - 2] : 1;
    g->ow = out->shape[nd - 1];
    g->oh = nd >= 2 ? out->shape[nd - 2] : 1;
    if (nd == 3) {
        g->ih = g->oh = 1;
    }
    g->planes = (g->ih * g->iw != 0) ? kiln__cpu_numel(big_in) / (g->ih * g->iw) : 0;
}

/* Source position for output index o: i0, i1 and the weight of i1. */
static inline void src_pos(kiln_interp_mode mode, bool ac, int64_t o, int64_t in, int64_t out,
                           int64_t *i0, int64_t *i1, double *l1)
{
    if (mode == KILN_INTERP_NEAREST) {
        int64_t s = (int64_t)floor((double)o * ((double)in / (double)out));
        *i0 = *i1 = s < in - 1 ? s : in - 1;
        *l1 = 0;
        return;
    }
    double s;
    if (ac)
        s = out > 1 ? (double)o * (double)(in - 1) / (double)(out - 1) : 0.0;
    else {
        s = ((double)o + 0.5) * ((double)in / (double)out) - 0.5;
        if (s < 0)
            s = 0;
    }
    int64_t a = (int64_t)s;
    if (a > in - 1)
        a = in - 1;
    *i0 = a;
    *i1 = a + (a < in - 1 ? 1 : 0);
    *l1 = s - (double)a;
}

typedef struct ip_job {
    const rgeom *g;
    kiln_interp_mode mode;
    bool ac, back, dbl;
    void *x, *y; /* x: input image (grad_x when back), y: output image (grad_out when back) */
} ip_job;

static void interp_planes(void *argp, int64_t p0, int64_t p1)
{
    const ip_job *j = argp;
    const rgeom *g = j->g;
    for (int64_t pl = p0; pl < p1; pl++) {
        for (int64_t oy = 0; oy < g->oh; oy++) {
            int64_t y0, y1;
            double ly;
            src_pos(j->mode, j->ac, oy, g->ih, g->oh, &y0, &y1, &ly);
            for (int64_t ox = 0; ox < g->ow; ox++) {
                int64_t x0, x1;
                double lx;
                src_pos(j->mode, j->ac, ox, g->iw, g->ow, &x0, &x1, &lx);
                int64_t base = pl * g->ih * g->iw;
                int64_t q00 = base + y0 * g->iw + x0, q01 = base + y0 * g->iw + x1;
                int64_t q10 = base + y1 * g->iw + x0, q11 = base + y1 * g->iw + x1;
                double w00 = (1 - ly) * (1 - lx), w01 = (1 - ly) * lx;
                double w10 = ly * (1 - lx), w11 = ly * lx;
                int64_t oi = (pl * g->oh + oy) * g->ow + ox;
                if (j->dbl) {
                    double *x = j->x, *y = j->y;
                    if (j->back && j->mode == KILN_INTERP_NEAREST) {
                        x[q00] += y[oi];
                    } else if (j->back) {
                        double v = y[oi];
                        x[q00] += w00 * v; x[q01] += w01 * v; x[q10] += w10 * v; x[q11] += w11 * v;
                    } else if (j->mode == KILN_INTERP_NEAREST) {
                        y[oi] = x[q00];
                    } else {
                        y[oi] = w00 * x[q00] + w01 * x[q01] + w10 * x[q10] + w11 * x[q11];
                    }
                } else {
                    float *x = j->x, *y = j->y;
                    if (j->back) {
                        double v = y[oi];
                        if (j->mode == KILN_INTERP_NEAREST) {
                            x[q00] += (float)v;
                        } else {
                            x[q00] += (float)(w00 * v); x[q01] += (float)(w01 * v);
                            x[q10] += (float)(w10 * v); x[q11] += (float)(w11 * v);
                        }
                    } else if (j->mode == KILN_INTERP_NEAREST) {
                        y[oi] = x[q00];
                    } else {
                        y[oi] = (float)(w00 * x[q00] + w01 * x[q01] + w10 * x[q10] + w11 * x[q11]);
                    }
                }
            }
        }
    }
}

static int interp(kiln__cpu_ctx *ctx, kiln_interp_mode mode, bool ac, const kiln_tdesc *img,
                  const kiln_tdesc *res, bool back)
{
    rgeom g;
    rgeom_init(&g, img, res);
    kiln_dtype ct = kiln__cpu_fdt(img->dtype);
    const kiln_tdesc *src = back ? res : img, *dst = back ? img : res;
    struct kiln_buffer *hs, *hd = NULL;
    void *sp = kiln__cpu_materialize(ctx, src, ct, &hs);
    bool direct = dst->dtype == ct && kiln__cpu_contig(dst);
    size_t db = (size_t)kiln__cpu_numel(dst) * kiln__cpu_esize(ct);
    void *dp = direct ? kiln__cpu_ptr(dst) : kiln__cpu_scratch_get(ctx, db, &hd);
    if (!sp || !dp) {
        kiln__cpu_scratch_put(ctx, hs);
        kiln__cpu_scratch_put(ctx, hd);
        return kiln__cpu_enomem(back ? "interpolate_backward" : "interpolate");
    }
    if (back)
        memset(dp, 0, db);
    ip_job j = {&g, mode, ac, back, ct == KILN_F64, back ? dp : sp, back ? sp : dp};
    if (g.oh * g.ow > 0 && g.ih * g.iw > 0)
        kiln__cpu_parallel_for(ctx, g.planes, 1 + 4096 / (g.oh * g.ow + 1), interp_planes, &j);
    if (!direct)
        kiln__cpu_writeback(ctx, dst, dp, ct);
    kiln__cpu_scratch_put(ctx, hs);
    kiln__cpu_scratch_put(ctx, hd);
    return 0;
}

int kiln__cpu_interpolate(void *vctx, kiln_interp_mode mode, bool align_corners,
                          const kiln_tdesc *out, const kiln_tdesc *x)
{
    if (kiln__cpu_numel(out) == 0)
        return 0;
    return interp(vctx, mode, align_corners, x, out, false);
}

int kiln__cpu_interpolate_backward(void *vctx, kiln_interp_mode mode, bool align_corners,
                                   const kiln_tdesc *grad_x, const kiln_tdesc *grad_out)
{
    return interp(vctx, mode, align_corners, grad_x, grad_out, true);
}

/* ------------------------------------------------------------------ pad */

typedef struct pad_job {
    const kiln_tdesc *out, *in;
    const int64_t *pads;
    kiln_pad_mode mode;
    _Alignas(8) unsigned char fill[8];
} pad_job;

/* Input coordinate for output coordinate o along a dim of input size n, or -1. */
static inline int64_t pad_map(kiln_pad_mode mode, int64_t o, int64_t lo, int64_t n)
{
    int64_t i = o - lo;
    if (i >= 0 && i < n)
        return i;
    if (mode == KILN_PAD_CONSTANT || n == 0)
        return -1;
    if (mode == KILN_PAD_REPLICATE)
        return i < 0 ? 0 : n - 1;
    if (n == 1)
        return 0;
    /* reflect without repeating the edge; fold repeatedly for very wide pads */
    int64_t period = 2 * (n - 1);
    i %= period;
    if (i < 0)
        i += period;
    return i < n ? i : period - i;
}

static void pad_rows(void *argp, int64_t r0, int64_t r1)
{
    const pad_job *j = argp;
    const kiln_tdesc *out = j->out, *in = j->in;
    int nd = out->ndim;
    size_t es = kiln__cpu_esize(out->dtype);
    int64_t W = out->shape[nd - 1];
    char *ob = kiln__cpu_ptr(out);
    const char *ib = kiln__cpu_ptr(in);
    for (int64_t r = r0; r < r1; r++) {
        int64_t rem = r, ooff = 0, ioff = 0;
        bool outside = false;
        for (int d = nd - 2; d >= 0; d--) {
            int64_t o = rem % out->shape[d];
            rem /= out->shape[d];
            ooff += o * out->strides[d];
            int64_t i = pad_map(j->mode, o, j->pads[2 * d], in->shape[d]);
            if (i < 0)
                outside = true;
            else
                ioff += i * in->strides[d];
        }
        int64_t lo = j->pads[2 * (nd - 1)], n = in->shape[nd - 1];
        int64_t os = out->strides[nd - 1], is = in->strides[nd - 1];
        for (int64_t w = 0; w < W; w++) {
            char *dst = ob + (ooff + w * os) * (int64_t)es;
            int64_t i = outside ? -1 : pad_map(j->mode, w, lo, n);
            if (i < 0)
                memcpy(dst, j->fill, es);
            else if (in->dtype == out->dtype)
                memcpy(dst, ib + (ioff + i * is) * (int64_t)es, es);
            else
                kiln__cpu_st(dst, out->dtype, kiln__cpu_ld(ib + (ioff + i * is) * (int64_t)kiln__cpu_esize(in->dtype), in->dtype));
        }
    }
}

int kiln__cpu_pad(void *vctx, kiln_pad_mode mode, const kiln_tdesc *out, const kiln_tdesc *in,
                  const int64_t *pads, double value)
{
    if (kiln__cpu_numel(out) == 0)
        return 0;
    if (out->ndim == 0)
        return kiln__cpu_copy(vctx, out, in);
    pad_job j = {out, in, pads, mode, {0}};
    kiln__cpu_st(j.fill, out->dtype, value);
    int64_t W = out->shape[out->ndim - 1];
    kiln__cpu_parallel_for(vctx, kiln__cpu_numel(out) / W, 1 + 16384 / W, pad_rows, &j);
    return 0;
}
