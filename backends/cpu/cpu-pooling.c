/*
 * backends/cpu/cpu-pooling.c — max/avg pooling (1-3 spatial dims) with backward (adaptive
 * average pooling is in cpu-adaptive-pool.c).
 *
 * Pooling is memory-bound: each input element is read once and the output is a
 * fraction of the input, so the kernels make a single pass. f32 runs a vectorized path
 * for any geometry, threaded over output rows so that two planes still feed two threads
 * (the 2x2 stride-2 max pool has a kernel of its own); f64 runs the generic per-output
 * loop, threaded over the N·C planes. Max pooling with no indices requested never
 * computes them. Semantics follow PyTorch: a NaN in a window wins (and its index is
 * reported), indices are flat within the input plane, average pooling with
 * count_include_pad divides by the window clipped to the padded input (so ceil-mode
 * overhang does not count), without it by the number of real elements.
 *
 * Everything runs in f32 (or f64 for f64 tensors) on contiguous planes; other dtypes and
 * strided views go through a converted contiguous copy.
 */
#include <stdlib.h>

#include "cpu-impl.h"
#include "cpu-pooling-impl.h"

void kiln__cpu_pgeom_init(pgeom *g, int ns, const int64_t *k, const int64_t *st, const int64_t *pad,
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

/* The generic loop: any geometry, one output at a time; f64 only, as f32 takes the row
 * path below. */
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

POOL_PLANES(double)

/* ------------------------------------------------------------------ f32 by output rows */

/* Every f32 geometry the 2x2 kernel does not take runs here. The generic loop above spends
 * ~20 ns an output on window arithmetic and on branches that mispredict on every unsorted
 * compare (3.9 ms for ResNet-50's 3x3 stride-2 max pool); here an output row is computed
 * in blocks of PROW_VEC-multiple outputs, and each tap of the window updates the whole
 * block at once: a contiguous load and a select, which the compiler vectorizes. Each
 * window row is first copied into a local segment with the padding (and whatever lies
 * past the input) filled in, so border outputs need no special case, and a block may
 * run past the row's last output into fill, so no loop has a scalar remainder; with
 * stride 2 the copy splits even from odd columns, because loading every other element
 * makes the vectorizer leave the last vector of each loop to scalar code (its loads
 * would reach one element past the last one read), which costs more than the rest.
 *
 * The results keep the generic loop's bits, because the taps are visited in its order
 * (depth, height, width) with its rule: a max starts at -inf, which anything but -inf
 * itself replaces (-inf has one encoding), so -inf fill never wins; a NaN replaces
 * anything (so the last NaN wins, payload included); a tie keeps the first (so +0 and
 * -0 keep the first's sign); the index starts at the window's first element inside the
 * input, which the generic loop takes unconditionally. An average adds the same doubles
 * in the same order to +0, and adding the +0 fill changes nothing, as the sum can never
 * be -0. */

#define PROW_VEC 16    /* a multiple of every vector width, in floats */
#define PROW_BLOCK 256 /* outputs at most in a block, a multiple of PROW_VEC */
#define PROW_SEG 1024  /* floats in the padded copy of one window row's segment */
#define PROW_GROUP 4   /* window rows copied before the first is read */

enum { PROW_MAX, PROW_MAX_IDX, PROW_AVG };

typedef struct prow_job {
    const pgeom *g;
    const float *x;
    float *y;
    int64_t *idx;
    int mode;
    int64_t block; /* outputs per block; 0 when even PROW_VEC do not fit PROW_SEG */
    /* per output column, rounded up to PROW_VEC entries: max with indices, the column of
     * the first tap inside the input (-1 when none); avg, the taps inside [-pad, W + pad)
     * and inside [0, W), which give its share of the divisor */
    const int64_t *wfirst, *wpad, *wval;
    bool cip;
} prow_job;

/* An output row's window rows: taps a in [alo, ahi) of depth and b in [blo, bhi) of height
 * fall inside the input; dc and hc count the taps inside the padding too. */
typedef struct prow_win {
    int64_t ds, dc, hs, hc, alo, ahi, blo, bhi;
} prow_win;

#define POOL_INLINE static inline __attribute__((always_inline))

/* Taps i of a window starting at start (step dil) that land in [0, in): [*lo, *hi). */
static inline void inside(int64_t start, int64_t k, int64_t dil, int64_t in, int64_t *lo, int64_t *hi)
{
    int64_t l = start < 0 ? (-start + dil - 1) / dil : 0;
    int64_t h = start > in - 1 ? 0 : (in - 1 - start) / dil + 1;
    if (h > k)
        h = k;
    *lo = l < h ? l : h;
    *hi = h;
}

static void prow_win_init(const pgeom *g, int64_t od, int64_t oh, prow_win *w)
{
    win(g, 0, od, &w->ds, &w->dc);
    win(g, 1, oh, &w->hs, &w->hc);
    inside(w->ds, g->k[0], g->dil[0], g->in[0], &w->alo, &w->ahi);
    inside(w->hs, g->k[1], g->dil[1], g->in[1], &w->blo, &w->bhi);
}

/* The generic rule for one output, for geometries too wide for the segment. */
static void prow_one(const prow_job *j, const prow_win *w, const float *x, float *y, int64_t *ix, int64_t ow)
{
    const pgeom *g = j->g;
    int64_t ws, wc, clo, chi;
    win(g, 2, ow, &ws, &wc);
    inside(ws, g->k[2], g->dil[2], g->in[2], &clo, &chi);
    float best = -INFINITY;
    int64_t bi = -1;
    double acc = 0;
    for (int64_t a = w->alo; a < w->ahi; a++)
        for (int64_t b = w->blo; b < w->bhi; b++) {
            int64_t off = ((w->ds + a * g->dil[0]) * g->in[1] + w->hs + b * g->dil[1]) * g->in[2] + ws;
            for (int64_t c = clo; c < chi; c++) {
                int64_t i = off + c * g->dil[2];
                float v = x[i];
                if (j->mode == PROW_AVG) {
                    acc += v;
                } else if (bi < 0 || v > best || v != v) {
                    best = v;
                    bi = i;
                }
            }
        }
    if (j->mode != PROW_AVG) {
        y[ow] = best;
        if (ix)
            ix[ow] = bi < 0 ? 0 : bi;
    } else {
        int64_t div = j->cip ? w->dc * w->hc * wc : (w->ahi - w->alo) * (w->bhi - w->blo) * (chi - clo);
        y[ow] = (float)(div ? acc / (double)div : NAN);
    }
}

/* One tap over n outputs: the element of output i is src[i * ls], its flat index
 * base + i * is. Instantiated for ls 1 (plain loads) and any ls. */
POOL_INLINE void prow_tap_s(int mode, float *restrict m, int64_t *restrict ib, double *restrict acc,
                            const float *restrict src, int64_t n, int64_t ls, int64_t base, int64_t is)
{
    for (int64_t i = 0; i < n; i++) {
        float v = src[i * ls];
        if (mode == PROW_AVG) {
            /* a NaN sum keeps its payload, as the generic loop's acc += v does (x86 gives
             * the first operand's NaN when both are NaN), whichever operand order the
             * vectorizer picks */
            double a = acc[i];
            acc[i] = a != a ? a : a + (double)v;
        } else {
            float a = m[i];
            bool t = (v > a) | (v != v);
            m[i] = t ? v : a;
            if (mode == PROW_MAX_IDX)
                ib[i] = t ? base + i * is : ib[i];
        }
    }
}

POOL_INLINE void prow_tap(int mode, float *m, int64_t *ib, double *acc, const float *src, int64_t n, int64_t ls,
                          int64_t base, int64_t is)
{
    if (ls == 1)
        prow_tap_s(mode, m, ib, acc, src, n, 1, base, is);
    else
        prow_tap_s(mode, m, ib, acc, src, n, ls, base, is);
}

/* seg[e] = row[start + e] for e < len, fill where that lies outside [0, W). */
POOL_INLINE void prow_copy(float *restrict seg, const float *restrict row, int64_t start, int64_t len, int64_t W,
                           float fill)
{
    int64_t lo = start < 0 ? (-start < len ? -start : len) : 0;
    int64_t hi = W - start < len ? (W - start > lo ? W - start : lo) : len;
    for (int64_t e = 0; e < lo; e++)
        seg[e] = fill;
    memcpy(seg + lo, row + start + lo, (size_t)(hi - lo) * sizeof *seg);
    for (int64_t e = hi; e < len; e++)
        seg[e] = fill;
}

/* The same for stride 2, split: ev[i] = element 2i, od[i] = element 2i + 1, i < cnt. */
POOL_INLINE void prow_split(float *restrict ev, float *restrict od, const float *restrict row, int64_t start,
                            int64_t cnt, int64_t W, float fill)
{
    /* pairs wholly inside the row: start + 2i >= 0 and start + 2i + 1 <= W - 1 */
    int64_t lo = start < 0 ? (-start + 1) / 2 : 0, hi = W - 1 - start > 0 ? (W - 1 - start) / 2 : 0;
    if (hi > cnt)
        hi = cnt;
    if (lo > hi)
        lo = hi;
    for (int64_t i = 0; i < lo; i++) {
        int64_t e = start + 2 * i;
        ev[i] = e >= 0 && e < W ? row[e] : fill;
        od[i] = e + 1 >= 0 && e + 1 < W ? row[e + 1] : fill;
    }
    const float *p = row + start;
    for (int64_t i = lo; i < hi; i++) {
        ev[i] = p[2 * i];
        od[i] = p[2 * i + 1];
    }
    for (int64_t i = hi; i < cnt; i++) {
        int64_t e = start + 2 * i;
        ev[i] = e >= 0 && e < W ? row[e] : fill;
        od[i] = e + 1 >= 0 && e + 1 < W ? row[e + 1] : fill;
    }
}

/* Outputs [from, from + n) of one output row, n a multiple of PROW_VEC, of which the first
 * nout exist. The window rows' segments are copied PROW_GROUP at a time before any is
 * read, so that the taps' vector loads seldom wait on the copy's stores (narrower or
 * differently aligned, so not forwarded) still in flight: a few percent. */
POOL_INLINE void prow_block(int mode, const prow_job *j, const prow_win *w, const float *x, float *y, int64_t *ix,
                            int64_t from, int64_t n, int64_t nout)
{
    const pgeom *g = j->g;
    int64_t H = g->in[1], W = g->in[2], s = g->st[2], dw = g->dil[2], span = (g->k[2] - 1) * dw;
    int64_t start = from * s - g->pad[2]; /* input column of output from's first tap */
    float fill = mode == PROW_AVG ? 0.0f : -INFINITY;
    _Alignas(64) float m[PROW_BLOCK];
    _Alignas(64) int64_t ib[mode == PROW_MAX_IDX ? PROW_BLOCK : 1];
    _Alignas(64) double acc[mode == PROW_AVG ? PROW_BLOCK : 1];
    _Alignas(64) float seg[PROW_GROUP][PROW_SEG];
    int64_t rowoff[PROW_GROUP];
    if (mode == PROW_AVG) {
        for (int64_t i = 0; i < n; i++)
            acc[i] = 0;
    } else {
        for (int64_t i = 0; i < n; i++)
            m[i] = -INFINITY;
    }
    if (mode == PROW_MAX_IDX) {
        bool any = w->alo < w->ahi && w->blo < w->bhi;
        int64_t row0 = ((w->ds + w->alo * g->dil[0]) * H + w->hs + w->blo * g->dil[1]) * W;
        for (int64_t i = 0; i < n; i++)
            ib[i] = any && j->wfirst[from + i] >= 0 ? row0 + j->wfirst[from + i] : 0;
    }
    int64_t nrows = (w->ahi - w->alo) * (w->bhi - w->blo), a = w->alo, b = w->blo;
    for (int64_t t0 = 0; t0 < nrows; t0 += PROW_GROUP) {
        int64_t gn = nrows - t0 < PROW_GROUP ? nrows - t0 : PROW_GROUP;
        for (int64_t t = 0; t < gn; t++) {
            rowoff[t] = ((w->ds + a * g->dil[0]) * H + w->hs + b * g->dil[1]) * W;
            if (++b == w->bhi) {
                b = w->blo;
                a++;
            }
            if (s == 2)
                prow_split(seg[t], seg[t] + PROW_SEG / 2, x + rowoff[t], start, n + span / 2, W, fill);
            else
                prow_copy(seg[t], x + rowoff[t], start, (n - 1) * s + span + 1, W, fill);
        }
        for (int64_t t = 0; t < gn; t++)
            for (int64_t c = 0, q = 0; c < g->k[2]; c++, q += dw) {
                if (s == 2)
                    prow_tap(mode, m, ib, acc, seg[t] + (q & 1) * (PROW_SEG / 2) + q / 2, n, 1,
                             rowoff[t] + start + q, 2);
                else
                    prow_tap(mode, m, ib, acc, seg[t] + q, n, s, rowoff[t] + start + q, s);
            }
    }
    if (mode == PROW_AVG) {
        int64_t dh = j->cip ? w->dc * w->hc : (w->ahi - w->alo) * (w->bhi - w->blo);
        const int64_t *wn = j->cip ? j->wpad : j->wval;
        for (int64_t i = 0; i < n; i++) {
            int64_t div = dh * wn[from + i];
            m[i] = (float)(div ? acc[i] / (double)div : NAN);
        }
    }
    memcpy(y + from, m, (size_t)nout * sizeof *m);
    if (mode == PROW_MAX_IDX)
        memcpy(ix + from, ib, (size_t)nout * sizeof *ib);
}

POOL_INLINE void prow_rows_mode(int mode, const prow_job *j, int64_t r0, int64_t r1)
{
    const pgeom *g = j->g;
    int64_t OD = g->out[0], OH = g->out[1], OW = g->out[2];
    int64_t pl = r0 / (OD * OH), od = r0 / OH % OD, oh = r0 % OH;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + pl * g->isz;
        int64_t yo = pl * g->osz + (od * OH + oh) * OW;
        float *y = j->y + yo;
        int64_t *ix = mode == PROW_MAX_IDX ? j->idx + yo : NULL;
        prow_win w;
        prow_win_init(g, od, oh, &w);
        if (j->block) {
            for (int64_t from = 0; from < OW; from += j->block) {
                int64_t nout = OW - from < j->block ? OW - from : j->block;
                int64_t n = (nout + PROW_VEC - 1) / PROW_VEC * PROW_VEC;
                prow_block(mode, j, &w, x, y, ix, from, n, nout);
            }
        } else {
            for (int64_t ow = 0; ow < OW; ow++)
                prow_one(j, &w, x, y, ix, ow);
        }
        if (++oh == OH) {
            oh = 0;
            if (++od == OD) {
                od = 0;
                pl++;
            }
        }
    }
}

POOL_INLINE void prow_rows(const prow_job *j, int64_t r0, int64_t r1)
{
    if (j->mode == PROW_MAX)
        prow_rows_mode(PROW_MAX, j, r0, r1);
    else if (j->mode == PROW_MAX_IDX)
        prow_rows_mode(PROW_MAX_IDX, j, r0, r1);
    else
        prow_rows_mode(PROW_AVG, j, r0, r1);
}

static void prow_rows_base(void *argp, int64_t r0, int64_t r1) { prow_rows(argp, r0, r1); }

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) static void prow_rows_avx2(void *argp, int64_t r0, int64_t r1)
{
    prow_rows(argp, r0, r1);
}

__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq"))) static void prow_rows_avx512(void *argp, int64_t r0,
                                                                                         int64_t r1)
{
    prow_rows(argp, r0, r1);
}
#endif

static kiln__cpu_range_fn prow_pick(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq"))
        return prow_rows_avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return prow_rows_avx2;
#endif
    return prow_rows_base;
}

static int pool_rows_f32(kiln__cpu_ctx *ctx, const pgeom *g, const kiln_pool_params *p, const float *x, float *y,
                         int64_t *idx)
{
    prow_job j = {g, x, y, idx, p->kind != KILN_POOL_MAX ? PROW_AVG : idx ? PROW_MAX_IDX : PROW_MAX,
                  PROW_BLOCK, NULL, NULL, NULL, p->count_include_pad};
    int64_t s = g->st[2], span = (g->k[2] - 1) * g->dil[2];
    for (; j.block >= PROW_VEC; j.block /= 2) {
        int64_t need = s == 2 ? 2 * (j.block + span / 2) : (j.block - 1) * s + span + 1;
        if (need <= PROW_SEG)
            break;
    }
    if (j.block < PROW_VEC)
        j.block = 0;
    int64_t OW = g->out[2], owr = (OW + PROW_VEC - 1) / PROW_VEC * PROW_VEC;
    struct kiln_buffer *h = NULL;
    if (j.block && j.mode != PROW_MAX) {
        int64_t *cols = kiln__cpu_scratch_get(ctx, (size_t)owr * 2 * sizeof *cols, &h);
        if (!cols)
            return kiln__cpu_enomem("pool");
        for (int64_t ow = 0; ow < owr; ow++) {
            int64_t ws, wc, clo, chi;
            win(g, 2, ow, &ws, &wc);
            inside(ws, g->k[2], g->dil[2], g->in[2], &clo, &chi);
            if (j.mode == PROW_MAX_IDX) {
                cols[ow] = ow < OW && clo < chi ? ws + clo * g->dil[2] : -1;
            } else {
                cols[ow] = ow < OW ? wc : 1;
                cols[owr + ow] = ow < OW ? chi - clo : 1;
            }
        }
        j.wfirst = j.wpad = cols;
        j.wval = cols + owr;
    }
    int64_t rows = g->planes * g->out[0] * g->out[1];
    kiln__cpu_parallel_for(ctx, rows, 1 + 16384 / (OW * g->k[0] * g->k[1] * g->k[2] + 1), prow_pick(), &j);
    kiln__cpu_scratch_put(ctx, h);
    return 0;
}

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

/* The same 2x2 stride-2 window when training asks for indices: the kernel table's row
 * (the generic loop's rule: the first maximum wins, a NaN wins and a later NaN replaces
 * it). */
static void mp2_rows_idx(void *argp, int64_t r0, int64_t r1)
{
    const mp2_job *j = argp;
    const pgeom *g = j->g;
    int64_t OH = g->out[1], OW = g->out[2], W = g->in[2];
    for (int64_t r = r0; r < r1; r++) {
        int64_t pl = r / OH, oh = r % OH;
        const float *a = j->x + pl * g->isz + 2 * oh * W;
        j->k->maxpool2x2_idx_row_f32(j->y + pl * g->osz + oh * OW, j->idx + pl * g->osz + oh * OW, a, a + W, OW,
                                     2 * oh * W, W);
    }
}

int kiln__cpu_pooling(void *vctx, const kiln_pool_params *p, const kiln_tdesc *out,
                   const kiln_tdesc *indices, const kiln_tdesc *x)
{
    kiln__cpu_ctx *ctx = vctx;
    pgeom g;
    kiln__cpu_pgeom_init(&g, p->nspatial, p->kernel, p->stride, p->padding,
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
    int rc = 0;
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
    } else if (ct == KILN_F32) {
        rc = pool_rows_f32(ctx, &g, p, xp, yp, ip);
    } else {
        pool_job j = {&g, p, xp, yp, ip, ct == KILN_F64, ctx};
        kiln__cpu_parallel_for(ctx, g.planes, 1 + 16384 / (g.osz * 4 + 1), pool_planes_double, &j);
    }
    if (hy && !rc)
        kiln__cpu_writeback(ctx, out, yp, ct);
    if (hi && !rc)
        kiln__cpu_writeback(ctx, indices, ip, KILN_I64);
    kiln__cpu_scratch_put(ctx, hx);
    kiln__cpu_scratch_put(ctx, hy);
    kiln__cpu_scratch_put(ctx, hi);
    return rc;
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
    kiln__cpu_pgeom_init(&g, p->nspatial, p->kernel, p->stride, p->padding,
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
