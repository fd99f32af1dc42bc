/*
 * backends/cpu/cpu-pooling.c — max/avg pooling (1-3 spatial dims) with backward, and
 * adaptive average pooling with backward.
 *
 * Pooling is memory-bound: each input element is read once and the output is a
 * fraction of the input, so the kernels make a single pass and are threaded over the
 * N·C planes (and output rows, for the 2x2 fast path, so two planes still feed two
 * threads). Max pooling with no indices requested never computes them. Semantics follow
 * PyTorch: a NaN in a window wins (and its index is reported), indices are flat within
 * the input plane, average pooling with count_include_pad divides by the window clipped
 * to the padded input (so ceil-mode overhang does not count), without it by the number
 * of real elements.
 *
 * Everything runs in f32 (or f64 for f64 tensors) on contiguous planes; other dtypes and
 * strided views go through a converted contiguous copy.
 */
#include <stdlib.h>

#include "cpu-impl.h"

typedef struct pgeom {
    int64_t planes;
    int64_t in[3], out[3], k[3], st[3], pad[3], dil[3];
    int64_t isz, osz;
} pgeom;

static void pgeom_init(pgeom *g, int ns, const int64_t *k, const int64_t *st, const int64_t *pad,
                       const int64_t *dil, const kiln_tdesc *x, const kiln_tdesc *y)
{
    g->isz = g->osz = 1;
    for (int i = 0; i < 3; i++) {
        int d = i - (3 - ns);
        if (d < 0) {
            g->in[i] = g->out[i] = g->k[i] = g->st[i] = g->dil[i] = 1;
            g->pad[i] = 0;
        } else {
            g->in[i] = x->shape[x->ndim - ns + d];
            g->out[i] = y->shape[y->ndim - ns + d];
            g->k[i] = k ? k[d] : 1;
            g->st[i] = st ? st[d] : 1;
            g->pad[i] = pad ? pad[d] : 0;
            g->dil[i] = dil && dil[d] > 0 ? dil[d] : 1;
        }
        g->isz *= g->in[i];
        g->osz *= g->out[i];
    }
    g->planes = g->isz ? kiln__cpu_numel(x) / g->isz : 0;
}

typedef struct pool_job {
    const pgeom *g;
    const kiln_pool_params *p;
    void *x, *y;
    int64_t *idx;
    bool dbl;
    kiln__cpu_ctx *ctx;
} pool_job;

/* Window bounds along axis a for output position o. */
static inline void win(const pgeom *g, int a, int64_t o, int64_t *start, int64_t *cnt_pad)
{
    *start = o * g->st[a] - g->pad[a];
    /* positions start + i*dil inside [-pad, in + pad) count toward count_include_pad */
    int64_t c = 0;
    for (int64_t i = 0; i < g->k[a]; i++) {
        int64_t q = *start + i * g->dil[a];
        if (q >= -g->pad[a] && q < g->in[a] + g->pad[a])
            c++;
    }
    *cnt_pad = c;
}

#define POOL_PLANES(T)                                                                         \
    static void pool_planes_##T(void *argp, int64_t p0, int64_t p1)                            \
    {                                                                                          \
        const pool_job *j = argp;                                                              \
        const pgeom *g = j->g;                                                                 \
        bool is_max = j->p->kind == KILN_POOL_MAX;                                             \
        for (int64_t pl = p0; pl < p1; pl++) {                                                 \
            const T *x = (const T *)j->x + pl * g->isz;                                        \
            T *y = (T *)j->y + pl * g->osz;                                                    \
            int64_t *ix = j->idx ? j->idx + pl * g->osz : NULL;                                \
            int64_t oi = 0;                                                                    \
            for (int64_t od = 0; od < g->out[0]; od++) {                                       \
                int64_t ds, dc;                                                                \
                win(g, 0, od, &ds, &dc);                                                       \
                for (int64_t oh = 0; oh < g->out[1]; oh++) {                                   \
                    int64_t hs, hc;                                                            \
                    win(g, 1, oh, &hs, &hc);                                                   \
                    for (int64_t ow = 0; ow < g->out[2]; ow++, oi++) {                         \
                        int64_t ws, wc;                                                        \
                        win(g, 2, ow, &ws, &wc);                                               \
                        double acc = 0;                                                        \
                        T best = (T)-INFINITY;                                                 \
                        int64_t bi = -1, n = 0;                                                \
                        for (int64_t a = 0; a < g->k[0]; a++) {                                \
                            int64_t id = ds + a * g->dil[0];                                   \
                            if (id < 0 || id >= g->in[0])                                      \
                                continue;                                                      \
                            for (int64_t b = 0; b < g->k[1]; b++) {                            \
                                int64_t ih = hs + b * g->dil[1];                               \
                                if (ih < 0 || ih >= g->in[1])                                  \
                                    continue;                                                  \
                                int64_t rowoff = (id * g->in[1] + ih) * g->in[2];              \
                                for (int64_t c = 0; c < g->k[2]; c++) {                        \
                                    int64_t iw = ws + c * g->dil[2];                           \
                                    if (iw < 0 || iw >= g->in[2])                              \
                                        continue;                                              \
                                    T v = x[rowoff + iw];                                      \
                                    if (is_max) {                                              \
                                        if (bi < 0 || v > best || v != v) {                    \
                                            if (!(best != best && bi >= 0) || v != v) {        \
                                                best = v;                                      \
                                                bi = rowoff + iw;                              \
                                            }                                                  \
                                        }                                                      \
                                    } else {                                                   \
                                        acc += v;                                              \
                                    }                                                          \
                                    n++;                                                       \
                                }                                                              \
                            }                                                                  \
                        }                                                                      \
                        if (is_max) {                                                          \
                            y[oi] = best;                                                      \
                            if (ix)                                                            \
                                ix[oi] = bi < 0 ? 0 : bi;                                      \
                        } else {                                                               \
                            int64_t div = j->p->count_include_pad ? dc * hc * wc : n;          \
                            y[oi] = (T)(div ? acc / (double)div : NAN);                        \
                        }                                                                      \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }

POOL_PLANES(float)
POOL_PLANES(double)

typedef struct mp2_job {
    const pgeom *g;
    const float *x;
    float *y;
    const kiln__cpu_kernels *k;
    int64_t *idx; /* flat in-plane indices, for the training variant */
} mp2_job;

static void mp2_rows(void *argp, int64_t r0, int64_t r1)
{
    const mp2_job *j = argp;
    const pgeom *g = j->g;
    int64_t OH = g->out[1], OW = g->out[2], W = g->in[2];
    for (int64_t r = r0; r < r1; r++) {
        int64_t pl = r / OH, oh = r % OH;
        const float *r0p = j->x + pl * g->isz + 2 * oh * W;
        j->k->maxpool2x2_row_f32(j->y + pl * g->osz + oh * OW, r0p, r0p + W, OW);
    }
}

/* The same 2x2 stride-2 window when training asks for indices, with the generic loop's
 * rule: the first maximum wins, a NaN wins and a later NaN replaces it. Which of the four
 * wins is unpredictable on real activations, so the common (NaN-free) case is written
 * without branches: the max, then the first position equal to it. */
static inline void mp2_take(float v, int64_t i, float *best, int64_t *bi)
{
    if (v > *best || v != v) {
        if (*best == *best || v != v) {
            *best = v;
            *bi = i;
        }
    }
}

static void mp2_rows_idx(void *argp, int64_t r0, int64_t r1)
{
    const mp2_job *j = argp;
    const pgeom *g = j->g;
    int64_t OH = g->out[1], OW = g->out[2], W = g->in[2];
    for (int64_t r = r0; r < r1; r++) {
        int64_t pl = r / OH, oh = r % OH;
        const float *a = j->x + pl * g->isz + 2 * oh * W, *b = a + W;
        float *y = j->y + pl * g->osz + oh * OW;
        int64_t *ix = j->idx + pl * g->osz + oh * OW;
        int64_t base = 2 * oh * W;
        for (int64_t ow = 0; ow < OW; ow++) {
            float v[4] = {a[2 * ow], a[2 * ow + 1], b[2 * ow], b[2 * ow + 1]};
            float sum = (v[0] + v[1]) + (v[2] + v[3]);
            if (__builtin_expect(sum != sum, 0)) { /* a NaN (or inf - inf): the exact rule */
                float best = v[0];
                int64_t bi = base + 2 * ow;
                mp2_take(v[1], base + 2 * ow + 1, &best, &bi);
                mp2_take(v[2], base + 2 * ow + W, &best, &bi);
                mp2_take(v[3], base + 2 * ow + W + 1, &best, &bi);
                y[ow] = best;
                ix[ow] = bi;
                continue;
            }
            float m01 = v[1] > v[0] ? v[1] : v[0], m23 = v[3] > v[2] ? v[3] : v[2];
            float m = m23 > m01 ? m23 : m01;
            int n0 = v[0] != m, n1 = v[1] != m, n2 = v[2] != m;
            int k = n0 * (1 + n1 * (1 + n2));
            y[ow] = v[k]; /* v[k] == m; taken from v so a +0/-0 tie keeps the first's sign */
            ix[ow] = base + 2 * ow + (k & 1) + (k >> 1) * W;
        }
    }
}

int kiln__cpu_pooling(void *vctx, const kiln_pool_params *p, const kiln_tdesc *out,
                   const kiln_tdesc *indices, const kiln_tdesc *x)
{
    kiln__cpu_ctx *ctx = vctx;
    pgeom g;
    pgeom_init(&g, p->nspatial, p->kernel, p->stride, p->padding,
               p->kind == KILN_POOL_MAX ? p->dilation : NULL, x, out);
    if (kiln__cpu_numel(out) == 0)
        return 0;
    kiln_dtype ct = kiln__cpu_fdt(out->dtype);
    struct kiln_buffer *hx, *hy = NULL, *hi = NULL;
    void *xp = kiln__cpu_materialize(ctx, x, ct, &hx);
    void *yp = (out->dtype == ct && kiln__cpu_contig(out)) ? kiln__cpu_ptr(out)
               : kiln__cpu_scratch_get(ctx, (size_t)kiln__cpu_numel(out) * kiln__cpu_esize(ct), &hy);
    int64_t *ip = NULL;
    if (indices)
        ip = kiln__cpu_contig(indices) ? kiln__cpu_ptr(indices)
             : kiln__cpu_scratch_get(ctx, (size_t)kiln__cpu_numel(indices) * 8, &hi);
    if (!xp || !yp || (indices && !ip)) {
        kiln__cpu_scratch_put(ctx, hx);
        kiln__cpu_scratch_put(ctx, hy);
        kiln__cpu_scratch_put(ctx, hi);
        return kiln__cpu_enomem("pool");
    }
    bool fast2x2 = p->kind == KILN_POOL_MAX && ct == KILN_F32 && p->nspatial >= 2 &&
                   g.k[0] == 1 && g.st[0] == 1 && g.pad[0] == 0 &&
                   g.k[1] == 2 && g.k[2] == 2 && g.st[1] == 2 && g.st[2] == 2 &&
                   g.pad[1] == 0 && g.pad[2] == 0 && g.dil[1] == 1 && g.dil[2] == 1 &&
                   g.in[0] == g.out[0] && 2 * g.out[1] <= g.in[1] && 2 * g.out[2] <= g.in[2] &&
                   (!indices || g.out[0] == 1); /* indices are flat over a whole 3-D plane */
    if (fast2x2) {
        mp2_job j = {&g, xp, yp, ctx->k, ip};
        int64_t rows = g.planes * g.out[0] * g.out[1];
        if (g.out[0] != 1) {
            /* 3-D input with unit depth kernel: treat depth slices as planes */
            g.planes *= g.out[0];
            g.isz /= g.in[0];
            g.osz /= g.out[0];
        }
        kiln__cpu_parallel_for(ctx, rows, 1 + 8192 / (g.out[2] + 1), ip ? mp2_rows_idx : mp2_rows, &j);
    } else {
        pool_job j = {&g, p, xp, yp, ip, ct == KILN_F64, ctx};
        kiln__cpu_parallel_for(ctx, g.planes, 1 + 16384 / (g.osz * 4 + 1),
                               ct == KILN_F64 ? pool_planes_double : pool_planes_float, &j);
    }
    if (hy)
        kiln__cpu_writeback(ctx, out, yp, ct);
    if (hi)
        kiln__cpu_writeback(ctx, indices, ip, KILN_I64);
    kiln__cpu_scratch_put(ctx, hx);
    kiln__cpu_scratch_put(ctx, hy);
    kiln__cpu_scratch_put(ctx, hi);
    return 0;
}

/* ------------------------------------------------------------------ pool backward */

typedef struct pb_job {
    const pgeom *g;
    const kiln_pool_params *p;
    void *gx;
    const void *gy;
    const int64_t *idx;
} pb_job;

#define POOL_BACK(T)                                                                           \
    static void pool_back_##T(void *argp, int64_t p0, int64_t p1)                              \
    {                                                                                          \
        const pb_job *j = argp;                                                                \
        const pgeom *g = j->g;                                                                 \
        for (int64_t pl = p0; pl < p1; pl++) {                                                 \
            T *gx = (T *)j->gx + pl * g->isz;                                                  \
            const T *gy = (const T *)j->gy + pl * g->osz;                                      \
            if (j->p->kind == KILN_POOL_MAX) {                                                 \
                const int64_t *ix = j->idx + pl * g->osz;                                      \
                for (int64_t o = 0; o < g->osz; o++)                                           \
                    gx[ix[o]] += gy[o];                                                        \
                continue;                                                                      \
            }                                                                                  \
            int64_t oi = 0;                                                                    \
            for (int64_t od = 0; od < g->out[0]; od++) {                                       \
                int64_t ds, dc;                                                                \
                win(g, 0, od, &ds, &dc);                                                       \
                for (int64_t oh = 0; oh < g->out[1]; oh++) {                                   \
                    int64_t hs, hc;                                                            \
                    win(g, 1, oh, &hs, &hc);                                                   \
                    for (int64_t ow = 0; ow < g->out[2]; ow++, oi++) {                         \
                        int64_t ws, wc, n = 0;                                                 \
                        win(g, 2, ow, &ws, &wc);                                               \
                        for (int pass = 0; pass < 2; pass++) {                                 \
                            T share = 0;                                                       \
                            if (pass == 1) {                                                   \
                                int64_t div = j->p->count_include_pad ? dc * hc * wc : n;      \
                                if (!div)                                                      \
                                    break;                                                     \
                                share = (T)(gy[oi] / (double)div);                             \
                            }                                                                  \
                            for (int64_t a = 0; a < g->k[0]; a++) {                            \
                                int64_t id = ds + a * g->dil[0];                               \
                                if (id < 0 || id >= g->in[0])                                  \
                                    continue;                                                  \
                                for (int64_t b = 0; b < g->k[1]; b++) {                        \
                                    int64_t ih = hs + b * g->dil[1];                           \
                                    if (ih < 0 || ih >= g->in[1])                              \
                                        continue;                                              \
                                    for (int64_t c = 0; c < g->k[2]; c++) {                    \
                                        int64_t iw = ws + c * g->dil[2];                       \
                                        if (iw < 0 || iw >= g->in[2])                          \
                                            continue;                                          \
                                        if (pass == 0)                                         \
                                            n++;                                               \
                                        else                                                   \
                                            gx[(id * g->in[1] + ih) * g->in[2] + iw] += share; \
                                    }                                                          \
                                }                                                              \
                            }                                                                  \
                        }                                                                      \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }

POOL_BACK(float)
POOL_BACK(double)

int kiln__cpu_pooling_backward(void *vctx, const kiln_pool_params *p, const kiln_tdesc *grad_x,
                            const kiln_tdesc *grad_out, const kiln_tdesc *indices)
{
    kiln__cpu_ctx *ctx = vctx;
    pgeom g;
    pgeom_init(&g, p->nspatial, p->kernel, p->stride, p->padding,
               p->kind == KILN_POOL_MAX ? p->dilation : NULL, grad_x, grad_out);
    if (p->kind == KILN_POOL_MAX && !indices)
        return kiln__error_set("cpu pool_backward: max pooling needs indices"), KILN_EINVAL;
    kiln_dtype ct = kiln__cpu_fdt(grad_x->dtype);
    struct kiln_buffer *hgy, *hgx = NULL, *hi = NULL;
    const void *gy = kiln__cpu_materialize(ctx, grad_out, ct, &hgy);
    const int64_t *ip = indices ? kiln__cpu_materialize(ctx, indices, KILN_I64, &hi) : NULL;
    bool direct = grad_x->dtype == ct && kiln__cpu_contig(grad_x);
    size_t gxb = (size_t)kiln__cpu_numel(grad_x) * kiln__cpu_esize(ct);
    void *gx = direct ? kiln__cpu_ptr(grad_x) : kiln__cpu_scratch_get(ctx, gxb, &hgx);
    if (!gy || !gx || (indices && !ip)) {
        kiln__cpu_scratch_put(ctx, hgy);
        kiln__cpu_scratch_put(ctx, hgx);
        kiln__cpu_scratch_put(ctx, hi);
        return kiln__cpu_enomem("pool_backward");
    }
    if (!direct)
        memset(gx, 0, gxb);
    pb_job j = {&g, p, gx, gy, ip};
    kiln__cpu_parallel_for(ctx, g.planes, 1 + 16384 / (g.osz * 4 + 1),
                           ct == KILN_F64 ? pool_back_double : pool_back_float, &j);
    if (!direct)
        kiln__cpu_writeback(ctx, grad_x, gx, ct);
    kiln__cpu_scratch_put(ctx, hgy);
    kiln__cpu_scratch_put(ctx, hgx);
    kiln__cpu_scratch_put(ctx, hi);
    return 0;
}

/* ------------------------------------------------------------------ adaptive average */

static inline int64_t ad_start(int64_t o, int64_t in, int64_t out) { return (o * in) / out; }
static inline int64_t ad_end(int64_t o, int64_t in, int64_t out) { return ((o + 1) * in + out - 1) / out; }

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
                        share = (j->dbl ? ((double *)j->y)[pl * g->osz + oi]
                                        : ((float *)j->y)[pl * g->osz + oi]) / cnt;
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
    pgeom_init(&g, ns, NULL, NULL, NULL, NULL, big, small);
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
