/*
 * backends/cpu/cpu-fused-product.c — a fused program headed by a matrix product (MATMUL):
 * the product's elementwise consumers applied as its epilogue, while its rows are still
 * in the caches.
 *
 * Unfused, x @ w followed by a bias add and an activation writes the whole product to
 * memory and reads it back once per op. Here each job computes the product a panel of
 * rows at a time with one single-threaded BLAS call (kiln__cpu_mm_rows), into the
 * output itself when the product is kept (a training step keeps it for backward) or
 * into a panel of scratch when it is dead, and at once runs the rest of the program over
 * that panel (kiln__cpu_fused_span), which then reads the product from L2 instead of
 * memory. Panels hold whole rows, so a softmax or a reduction over the product's rows
 * (which the fusion layer admits only when their rows divide the product's) takes them
 * whole.
 *
 * The panel height is a real trade: a short panel stays in L2, but OpenBLAS packs B once
 * per call, so short panels pack it more often; a tall one amortizes the packing and
 * spills the panel to L3. The first product of a shape class (rows, columns and depth as
 * powers of two) large enough to time runs equal segments of its rows with each
 * candidate height and keeps the fastest in the autotune cache (engine/autotune.c), as
 * the plain evaluator does for its block size; others take a height that makes a panel
 * about 256 KiB.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "autotune-impl.h"
#include "cpu-fused-impl.h"

static const int64_t panel_candidates[] = {32, 64, 128, 256, 512};
#define NPANELS (int)(sizeof panel_candidates / sizeof *panel_candidates)
/* Products below this many multiply-adds (about 1 ms) are not timed: one guess serves. */
#define PANEL_TUNE_MIN_MACS ((double)(1 << 26))
/* Below this many multiply-adds a product runs on one thread (as kiln__cpu_gemm). */
#define PRODUCT_SPLIT_MIN ((double)(1 << 20))

typedef struct prun {
    const fplan *pl;
    int64_t panel;        /* rows per panel */
    int64_t r_lo, r_hi;   /* the rows (of every batch, batch-major) the jobs split */
    float *panels;        /* per job panel * N floats, when the product is not stored */
    int64_t panel_floats; /* the size of one job's panel */
    size_t slab;          /* floats of register scratch per job */
} prun;

static void product_job(void *arg, int job, int njobs)
{
    const prun *r = arg;
    const fplan *pl = r->pl;
    int64_t M = pl->mm.M, N = pl->mm.N, total = r->r_hi - r->r_lo;
    int64_t g0 = r->r_lo + total * job / njobs, g1 = r->r_lo + total * (job + 1) / njobs;
    float *scratch = (float *)pl->scratch + (size_t)job * r->slab;
    float *panel = r->panels ? r->panels + (size_t)job * (size_t)r->panel_floats : NULL;
    double acc[KILN_FUSED_MAX_INSTRS] = {0};
    for (int64_t g = g0; g < g1;) {
        int64_t bi = g / M, row = g % M, rows = r->panel;
        if (rows > g1 - g)
            rows = g1 - g;
        if (rows > M - row)
            rows = M - row; /* a panel never crosses a batch */
        int64_t e0 = g * N;
        float *dst = pl->product_out >= 0 ? pl->out[pl->product_out] + e0 : panel;
        kiln__cpu_mm_rows(&pl->mm, bi, row, rows, dst);
        kiln__cpu_fused_span(pl, scratch, acc, e0, e0 + rows * N, dst, e0);
        g += rows;
    }
#if defined(__x86_64__)
    if (pl->stream)
        _mm_sfence(); /* the streamed lines are visible before the job reports done */
#endif
}

static void run_rows(kiln__cpu_ctx *ctx, prun *r, int64_t lo, int64_t hi, int64_t panel, int njobs)
{
    r->r_lo = lo;
    r->r_hi = hi;
    r->panel = panel;
    int64_t panels = (hi - lo + panel - 1) / panel;
    if (panels < njobs)
        njobs = (int)(panels > 0 ? panels : 1);
    if (hi <= lo)
        return;
    if (njobs == 1)
        product_job(r, 0, 1);
    else
        kiln__cpu_pool_run(ctx->pool, njobs, product_job, r);
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int log2_of(int64_t v)
{
    int lg = 0;
    for (; v > 1; v >>= 1)
        lg++;
    return lg;
}

int kiln__cpu_fused_product(kiln__cpu_ctx *ctx, fplan *pl)
{
    const kiln__cpu_mm *mm = &pl->mm;
    int64_t rows = mm->M * mm->nbatch;
    double macs = (double)rows * (double)mm->N * (double)mm->K;
    int njobs = macs < PRODUCT_SPLIT_MIN ? 1 : ctx->nthreads;
    /* a panel of about 256 KiB, in whole register tiles of 16 rows, and at least one
     * panel per job */
    int64_t panel = 65536 / (mm->N > 0 ? mm->N : 1);
    int64_t per_job = (rows + njobs - 1) / njobs;
    panel = panel < 32 ? 32 : panel > 512 ? 512 : panel;
    panel = panel / 16 * 16;
    if (panel > per_job)
        panel = per_job < 1 ? 1 : per_job;
    char device[64], key[96];
    bool tune = false;
    if (macs >= PANEL_TUNE_MIN_MACS && mm->nbatch == 1 && mm->M >= NPANELS * panel_candidates[0]) {
        snprintf(device, sizeof device, "cpu/%s/%dt", ctx->k->name, ctx->nthreads);
        snprintf(key, sizeof key, "fused-mm-panel m2^%d n2^%d k2^%d %s", log2_of(mm->M), log2_of(mm->N),
                 log2_of(mm->K), pl->product_out >= 0 ? "stored" : "dead");
        int64_t cached = 0;
        tune = !kiln__autotune_lookup(device, key, &cached);
        if (!tune && cached >= 1 && cached <= panel_candidates[NPANELS - 1])
            panel = cached;
    }
    prun r = {.pl = pl, .slab = (size_t)pl->nslots * (size_t)pl->block};
    int64_t most = tune ? panel_candidates[NPANELS - 1] : panel;
    if (most > mm->M)
        most = mm->M;
    r.panel_floats = pl->product_out >= 0 ? 0 : most * mm->N;
    size_t per = r.slab + (size_t)r.panel_floats;
    if (per && !(pl->scratch = aligned_alloc(64, (per * (size_t)njobs * sizeof(float) + 63) & ~(size_t)63)))
        return kiln__cpu_enomem("fused");
    if (r.panel_floats)
        r.panels = (float *)pl->scratch + r.slab * (size_t)njobs;
    if (tune) {
        int best = 0;
        double best_ns = 0;
        for (int c = 0; c < NPANELS; c++) {
            double t0 = now_ns();
            run_rows(ctx, &r, rows * c / NPANELS, rows * (c + 1) / NPANELS, panel_candidates[c], njobs);
            double t = now_ns() - t0;
            if (c == 0 || t < best_ns)
                best = c, best_ns = t;
        }
        kiln__autotune_store(device, key, panel_candidates[best]);
    } else {
        run_rows(ctx, &r, 0, rows, panel, njobs);
    }
    free(pl->scratch);
    pl->scratch = NULL;
    return 0;
}
