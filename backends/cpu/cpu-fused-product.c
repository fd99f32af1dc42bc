/*
 * backends/cpu/cpu-fused-product.c — a fused program headed by a producer, a matrix
 * product (MATMUL) or a convolution (CONV): the producer's elementwise consumers applied
 * as its epilogue while its output is still in the caches.
 *
 * Unfused, x @ w followed by a bias add and an activation writes the whole product to
 * memory and reads it back once per op. Here the epilogue reads it back once, or not at
 * all: with panels, each job computes the product a panel of rows at a time with one single-threaded BLAS call (kiln__cpu_mm_rows), into the
 * output itself when the product is kept (a training step keeps it for backward) or
 * into a panel of scratch when it is dead, and at once runs the rest of the program over
 * that panel (kiln__cpu_fused_span), which then reads the product from L2 instead of
 * memory. Panels hold whole rows, so a softmax or a reduction over the product's rows
 * (which the fusion layer admits only when their rows divide the product's) takes them
 * whole.
 *
 * The panel height is a real trade: a short panel stays in L2, but OpenBLAS packs B once
 * per call, so short panels pack it more often (with B of 16 MiB, 32-row panels made a
 * 2048x1024x4096 product 6% slower than one call); a tall one amortizes the packing and
 * spills to L3. So the default is the whole product computed as the matmul entry computes
 * it (the same bits) with the epilogue run over it after, one pass instead of one per
 * op; products of a shape class large enough to time try 512, 128 and 32 rows on their
 * next calls and keep the fastest in the autotune cache (engine/autotune.c).
 *
 * A convolution runs the same way by chunks of images: the cpu's conv entry computes a
 * chunk (spreading it over the pool itself), then the epilogue runs over it. The number
 * of images per chunk is tuned the same way, on whole calls (see conv_trial).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "autotune-impl.h"
#include "cpu-fused-impl.h"

/* Panel heights: 0 is the whole product as the matmul entry computes it (one BLAS call per
 * thread, B packed once), then the epilogue over it. */
static const int64_t panel_candidates[] = {0, 512, 128, 32};
/* Products below this many multiply-adds (about 1 ms) are not timed: one guess serves. */
#define PANEL_TUNE_MIN_MACS ((double)(1 << 26))
/* Below this many multiply-adds a product runs on one thread (as kiln__cpu_gemm). */
#define PRODUCT_SPLIT_MIN ((double)(1 << 20))

/* The producer's operands (arg, arg2, and a CONV's bias arg3) are valid inputs of f32,
 * loaded by no other instruction and overlapped by no output. */
static bool operands_ok(const kiln_fused_program *p, const kiln_fused_instr *pr, int nops)
{
    int ops[3] = {pr->arg, pr->arg2, pr->arg3};
    for (int k = 0; k < nops; k++) {
        if ((unsigned)ops[k] >= (unsigned)p->ninputs || p->inputs[ops[k]].dtype != KILN_F32)
            return false;
        for (int j = 0; j < k; j++)
            if (ops[j] == ops[k])
                return false;
        for (int i = 0; i < p->ninstrs; i++)
            if (p->instrs[i].code == KILN_FUSED_LOAD && p->instrs[i].arg == ops[k])
                return false;
        for (int o = 0; o < p->noutputs; o++)
            if (p->outputs[o].buf == p->inputs[ops[k]].buf)
                return false;
    }
    return true;
}

static void contiguous_strides(kiln_tdesc *o)
{
    int64_t st = 1;
    for (int d = o->ndim - 1; d >= 0; d--) {
        o->strides[d] = st;
        st *= o->shape[d];
    }
}

/* A CONV's output shape [N, O, S'...] into pl->conv_out; false when the geometry does not
 * make one of p->n elements. */
static bool plan_conv(fplan *pl, const kiln_fused_program *p, const kiln_tdesc *x, const kiln_tdesc *w,
                      const kiln_tdesc *bias)
{
    const kiln_conv_params *cp = p->conv;
    int ns = cp ? cp->nspatial : 0;
    if (!cp || ns < 1 || ns > 3 || x->ndim != ns + 2 || w->ndim != ns + 2 || cp->groups < 1 ||
        (bias && kiln__cpu_numel(bias) != w->shape[0]))
        return false;
    kiln_tdesc *o = &pl->conv_out;
    o->dtype = KILN_F32;
    o->ndim = x->ndim;
    o->shape[0] = x->shape[0];
    o->shape[1] = w->shape[0];
    for (int d = 0; d < ns; d++) {
        if (cp->stride[d] < 1 || cp->dilation[d] < 1)
            return false;
        int64_t span = cp->dilation[d] * (w->shape[d + 2] - 1) + 1;
        int64_t in = x->shape[d + 2] + 2 * cp->padding[d];
        if (in < span)
            return false;
        o->shape[d + 2] = (in - span) / cp->stride[d] + 1;
    }
    contiguous_strides(o);
    return kiln__cpu_numel(o) == p->n && p->n > 0;
}

int kiln__cpu_fused_plan_product(fplan *pl, const kiln_fused_program *p)
{
    pl->product_out = -1;
    for (int i = 1; i < p->ninstrs; i++)
        if (kiln__cpu_fused_producer(p->instrs[i].code))
            return KILN_ENOTSUP;
    if (p->ninstrs == 0 || !kiln__cpu_fused_producer(p->instrs[0].code))
        return 0;
    const kiln_fused_instr *pr = &p->instrs[0];
    pl->conv = pr->code == KILN_FUSED_CONV;
    if (!operands_ok(p, pr, pl->conv && pr->arg3 >= 0 ? 3 : 2))
        return KILN_ENOTSUP;
    const kiln_tdesc *a = &p->inputs[pr->arg], *b = &p->inputs[pr->arg2];
    if (pl->conv) /* reductions and softmaxes do not follow a convolution */
        return p->reduce_inner == 0 && plan_conv(pl, p, a, b, pr->arg3 >= 0 ? &p->inputs[pr->arg3] : NULL)
                   ? 1
                   : KILN_ENOTSUP;
    /* the product's shape [B..., M, N]: batch dims broadcast between a's and b's */
    if (a->ndim < 2 || b->ndim < 2 || a->shape[a->ndim - 1] != b->shape[b->ndim - 2])
        return KILN_ENOTSUP;
    kiln_tdesc *o = &pl->mm_out;
    o->dtype = KILN_F32;
    o->ndim = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int d = 0; d < o->ndim - 2; d++) {
        int da = d - (o->ndim - a->ndim), db = d - (o->ndim - b->ndim);
        int64_t sa = da >= 0 ? a->shape[da] : 1, sb = db >= 0 ? b->shape[db] : 1;
        if (sa != sb && sa != 1 && sb != 1)
            return KILN_ENOTSUP;
        o->shape[d] = sa > sb ? sa : sb;
    }
    o->shape[o->ndim - 2] = a->shape[a->ndim - 2];
    o->shape[o->ndim - 1] = b->shape[b->ndim - 1];
    contiguous_strides(o);
    if (kiln__cpu_numel(o) != p->n || !kiln__cpu_mm_plan(&pl->mm, o, a, b))
        return KILN_ENOTSUP;
    /* reductions and softmaxes take whole rows of the panels' rows */
    if (p->reduce_inner > 0 && pl->mm.N % p->reduce_inner)
        return KILN_ENOTSUP;
    return 1;
}

typedef struct prun {
    const fplan *pl;
    int64_t panel;        /* rows per panel */
    int64_t chunk;        /* rows per job */
    int64_t r_lo, r_hi;   /* the rows (of every batch, batch-major) the jobs split */
    float *panels;        /* per job panel * N floats, when the product is not stored */
    int64_t panel_floats; /* the size of one job's panel */
    size_t slab;          /* floats of register scratch per job */
} prun;

static void product_job(void *arg, int job, int njobs)
{
    const prun *r = arg;
    const fplan *pl = r->pl;
    int64_t M = pl->mm.M, N = pl->mm.N;
    (void)njobs;
    int64_t g0 = r->r_lo + job * r->chunk, g1 = g0 + r->chunk < r->r_hi ? g0 + r->chunk : r->r_hi;
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
    if (hi <= lo)
        return;
    /* rows split over the jobs as the matmul entry splits them (whole batches, or whole
     * register tiles of 16 rows), so a panel as tall as a job's rows rounds as it does */
    int64_t total = hi - lo, M = r->pl->mm.M;
    if (r->pl->mm.nbatch > 1) {
        int64_t batches = (total + M - 1) / M;
        r->chunk = (batches + njobs - 1) / njobs * M;
    } else {
        r->chunk = ((total + njobs - 1) / njobs + 15) / 16 * 16;
    }
    njobs = (int)((total + r->chunk - 1) / r->chunk);
    if (njobs == 1)
        product_job(r, 0, 1);
    else
        kiln__cpu_pool_run(ctx->pool, njobs, product_job, r);
}

/* Candidates are timed in the process's CPU time, not wall time: on a shared machine
 * another process's load moves wall times by 2x between calls (a 128-row panel won a trial
 * on wall time while costing 4% more CPU than the whole product), and every candidate
 * keeps the threads equally busy, so less CPU is less time on a quiet one. */
static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int log2_of(int64_t v)
{
    int lg = 0;
    for (; v > 1; v >>= 1)
        lg++;
    return lg;
}

/* The job scratch (and product scratch) from the cpu's buffer pool: a fresh mapping of a
 * product-sized buffer per call would pay its page faults every time (about 10 ms for
 * 32 MiB), which the unfused matmul never does. */
static bool scratch_get(kiln__cpu_ctx *ctx, fplan *pl, size_t floats, struct kiln_buffer **h)
{
    *h = NULL;
    if (!floats)
        return true;
    pl->scratch = kiln__cpu_scratch_get(ctx, floats * sizeof(float), h);
    return pl->scratch != NULL;
}

static void scratch_put(kiln__cpu_ctx *ctx, fplan *pl, struct kiln_buffer *h)
{
    kiln__cpu_scratch_put(ctx, h);
    pl->scratch = NULL;
}

/* ------------------------------------------------------------------ convolution */

/* The epilogue over elements [lo, hi) of a chunk of images, split over the pool. */
typedef struct ejob {
    const fplan *pl;
    int64_t lo, hi;
    const float *prod; /* the chunk's convolution output, element lo first */
    size_t slab;
} ejob;

static void epilogue_job(void *arg, int job, int njobs)
{
    const ejob *e = arg;
    int64_t n = e->hi - e->lo, b = e->lo + n * job / njobs, end = e->lo + n * (job + 1) / njobs;
    double acc[KILN_FUSED_MAX_INSTRS] = {0};
    kiln__cpu_fused_span(e->pl, (float *)e->pl->scratch + (size_t)job * e->slab, acc, b, end, e->prod, e->lo);
#if defined(__x86_64__)
    if (e->pl->stream)
        _mm_sfence();
#endif
}

/* Images [lo, hi) in chunks of `chunk`: each chunk convolved (the cpu's conv entry, which
 * spreads it over the pool) into the output or a scratch chunk, then the epilogue run over
 * it while it is in the caches. */
static int conv_images(kiln__cpu_ctx *ctx, const fplan *pl, int64_t lo, int64_t hi, int64_t chunk, float *images,
                       size_t slab)
{
    const kiln_fused_program *p = pl->p;
    const kiln_fused_instr *pr = &p->instrs[0];
    const kiln_tdesc *x = &p->inputs[pr->arg], *w = &p->inputs[pr->arg2];
    const kiln_tdesc *bias = pr->arg3 >= 0 ? &p->inputs[pr->arg3] : NULL;
    int64_t per = p->n / pl->conv_out.shape[0];
    for (int64_t n0 = lo; n0 < hi; n0 += chunk) {
        int64_t cnt = hi - n0 < chunk ? hi - n0 : chunk;
        kiln_tdesc xs = *x, os = pl->conv_out;
        xs.shape[0] = cnt;
        xs.offset += n0 * x->strides[0];
        float *dst = pl->product_out >= 0 ? pl->out[pl->product_out] + n0 * per : images;
        struct kiln_buffer fake = {.data = dst};
        os.buf = &fake;
        os.offset = 0;
        os.shape[0] = cnt;
        int rc = kiln__cpu_conv(ctx, p->conv, &os, &xs, w, bias);
        if (rc < 0)
            return rc;
        ejob e = {pl, n0 * per, (n0 + cnt) * per, dst, slab};
        int64_t jobs = cnt * per / 16384;
        int njobs = jobs < 1 ? 1 : jobs > ctx->nthreads ? ctx->nthreads : (int)jobs;
        if (njobs == 1)
            epilogue_job(&e, 0, 1);
        else
            kiln__cpu_pool_run(ctx->pool, njobs, epilogue_job, &e);
    }
    return 0;
}

/* Images per chunk: the whole batch (the conv entry at its most efficient, the epilogue
 * reading the output back from L3 or memory), or a few images (their output in L2, the
 * convolution cut into smaller products). */
static const int64_t chunk_candidates[] = {0 /* the whole batch */, 16, 4, 1};
#define NCANDIDATES 4
_Static_assert(sizeof chunk_candidates / sizeof *chunk_candidates == NCANDIDATES, "one trial size");
_Static_assert(sizeof panel_candidates / sizeof *panel_candidates == NCANDIDATES, "one trial size");

/* Chunk sizes (and panel heights) are tried on whole calls, one candidate per call of a
 * shape class (a training step or a served model repeats its products, so no work is
 * repeated for timing), and the fastest stored once all have run. The trials in progress are process-wide, as the
 * autotune cache is: one lock guards them. */
typedef struct conv_trial {
    char device[64], key[96];
    int next;               /* the candidate the next call runs */
    double ns[NCANDIDATES]; /* each candidate's time */
} conv_trial;

#define MAX_TRIALS 32
static pthread_mutex_t trial_lock = PTHREAD_MUTEX_INITIALIZER;
static conv_trial trials[MAX_TRIALS];
static int ntrials;

/* The candidate this call of (device, key) runs, or -1 for an untimed call (the class's
 * first, or too many classes on trial) which runs candidate 0. */
static int trial_pick(const char *device, const char *key)
{
    pthread_mutex_lock(&trial_lock);
    int pick = -1;
    for (int i = 0; i < ntrials && pick < 0; i++)
        if (!strcmp(trials[i].device, device) && !strcmp(trials[i].key, key))
            pick = trials[i].next < NCANDIDATES ? trials[i].next++ : 0;
    if (pick < 0 && ntrials < MAX_TRIALS) {
        /* the class's first call runs untimed (candidate 0): it pays the first touch of
         * its buffers, which would count against whichever candidate ran it */
        conv_trial *t = &trials[ntrials++];
        memset(t, 0, sizeof *t);
        snprintf(t->device, sizeof t->device, "%s", device);
        snprintf(t->key, sizeof t->key, "%s", key);
    }
    pthread_mutex_unlock(&trial_lock);
    return pick;
}

/* Record candidate c's time; once every candidate has one, store the fastest. */
static void trial_done(const char *device, const char *key, int c, double ns)
{
    int64_t winner = -1;
    pthread_mutex_lock(&trial_lock);
    for (int i = 0; i < ntrials; i++) {
        conv_trial *t = &trials[i];
        if (strcmp(t->device, device) || strcmp(t->key, key))
            continue;
        t->ns[c] = ns;
        bool all = true;
        int best = 0;
        for (int k = 0; k < NCANDIDATES; k++) {
            all = all && t->ns[k] > 0;
            if (t->ns[k] > 0 && t->ns[k] < t->ns[best])
                best = k;
        }
        if (all && t->next >= NCANDIDATES) {
            winner = best + 1; /* stored as 1 + the candidate's index (values are positive) */
            trials[i] = trials[--ntrials];
        }
        break;
    }
    pthread_mutex_unlock(&trial_lock);
    if (winner > 0)
        kiln__autotune_store(device, key, winner);
}

/* A convolution's epilogue by chunks of images, the chunk tuned per shape class (see
 * chunk_candidates and conv_trial); small convolutions take the whole batch. */
static int conv_product(kiln__cpu_ctx *ctx, fplan *pl)
{
    const kiln_fused_program *p = pl->p;
    const kiln_tdesc *w = &p->inputs[p->instrs[0].arg2];
    int64_t N = pl->conv_out.shape[0], per = p->n / N;
    double macs = (double)p->n * (double)(kiln__cpu_numel(w) / (w->shape[0] ? w->shape[0] : 1));
    int choice = 0, trial = -1;
    char device[64], key[96];
    if (macs >= PANEL_TUNE_MIN_MACS && N > 1) {
        snprintf(device, sizeof device, "cpu/%s/%dt", ctx->k->name, ctx->nthreads);
        snprintf(key, sizeof key, "fused-conv-chunk n2^%d per2^%d w2^%d %s", log2_of(N), log2_of(per),
                 log2_of(kiln__cpu_numel(w)), pl->product_out >= 0 ? "stored" : "dead");
        int64_t cached = 0;
        if (kiln__autotune_lookup(device, key, &cached) && cached >= 1 && cached <= NCANDIDATES)
            choice = (int)cached - 1;
        else if ((trial = trial_pick(device, key)) >= 0)
            choice = trial;
    }
    int64_t chunk = chunk_candidates[choice] == 0 || chunk_candidates[choice] > N ? N : chunk_candidates[choice];
    size_t slab = (size_t)pl->nslots * (size_t)pl->block;
    size_t images = pl->product_out >= 0 ? 0 : (size_t)(chunk * per);
    size_t total = slab * (size_t)ctx->nthreads + images;
    struct kiln_buffer *h;
    if (!scratch_get(ctx, pl, total, &h))
        return kiln__cpu_enomem("fused");
    float *img = images ? (float *)pl->scratch + slab * (size_t)ctx->nthreads : NULL;
    double t0 = now_ns();
    int rc = conv_images(ctx, pl, 0, N, chunk, img, slab);
    if (rc == 0 && trial >= 0)
        trial_done(device, key, trial, now_ns() - t0);
    scratch_put(ctx, pl, h);
    return rc;
}

/* The product computed whole, threaded and rounded as the matmul entry does it, and the
 * epilogue run over it after: for a few rows (a classifier at batch 1), too few for panels
 * to matter, and the panel candidate 0. */
static int whole_product(kiln__cpu_ctx *ctx, fplan *pl)
{
    const kiln_fused_program *p = pl->p;
    size_t slab = (size_t)pl->nslots * (size_t)pl->block;
    size_t whole = pl->product_out >= 0 ? 0 : (size_t)p->n;
    size_t total = slab * (size_t)ctx->nthreads + whole;
    struct kiln_buffer *h;
    if (!scratch_get(ctx, pl, total, &h))
        return kiln__cpu_enomem("fused");
    float *dst = pl->product_out >= 0 ? pl->out[pl->product_out]
                                      : (float *)pl->scratch + slab * (size_t)ctx->nthreads;
    kiln__cpu_mm_whole(ctx, &pl->mm, dst);
    ejob e = {pl, 0, p->n, dst, slab};
    int64_t jobs = p->n / 16384;
    int njobs = jobs < 1 ? 1 : jobs > ctx->nthreads ? ctx->nthreads : (int)jobs;
    if (njobs == 1)
        epilogue_job(&e, 0, 1);
    else
        kiln__cpu_pool_run(ctx->pool, njobs, epilogue_job, &e);
    scratch_put(ctx, pl, h);
    return 0;
}

int kiln__cpu_fused_product(kiln__cpu_ctx *ctx, fplan *pl)
{
    if (pl->conv)
        return conv_product(ctx, pl);
    const kiln__cpu_mm *mm = &pl->mm;
    int64_t rows = mm->M * mm->nbatch;
    double macs = (double)rows * (double)mm->N * (double)mm->K;
    if (mm->nbatch == 1 && mm->M <= 16)
        return whole_product(ctx, pl);
    int choice = 0, trial = -1;
    char device[64], key[96];
    if (macs >= PANEL_TUNE_MIN_MACS && mm->M >= 2 * 32) {
        snprintf(device, sizeof device, "cpu/%s/%dt", ctx->k->name, ctx->nthreads);
        snprintf(key, sizeof key, "fused-mm-panel m2^%d n2^%d k2^%d b2^%d %s", log2_of(mm->M), log2_of(mm->N),
                 log2_of(mm->K), log2_of(mm->nbatch), pl->product_out >= 0 ? "stored" : "dead");
        int64_t cached = 0;
        if (kiln__autotune_lookup(device, key, &cached) && cached >= 1 && cached <= NCANDIDATES)
            choice = (int)cached - 1;
        else if ((trial = trial_pick(device, key)) >= 0)
            choice = trial;
    }
    double t0 = now_ns();
    int rc;
    if (panel_candidates[choice] == 0 && mm->nbatch == 1) {
        rc = whole_product(ctx, pl);
    } else {
        /* panels of the candidate's height, or one batch each for the whole product of a
         * batched one */
        int njobs = macs < PRODUCT_SPLIT_MIN ? 1 : ctx->nthreads;
        int64_t panel = panel_candidates[choice] == 0 || panel_candidates[choice] > mm->M
                            ? mm->M
                            : panel_candidates[choice];
        prun r = {.pl = pl, .slab = (size_t)pl->nslots * (size_t)pl->block};
        r.panel_floats = pl->product_out >= 0 ? 0 : panel * mm->N;
        size_t per = r.slab + (size_t)r.panel_floats;
        struct kiln_buffer *h;
        if (!scratch_get(ctx, pl, per * (size_t)njobs, &h))
            return kiln__cpu_enomem("fused");
        if (r.panel_floats)
            r.panels = (float *)pl->scratch + r.slab * (size_t)njobs;
        run_rows(ctx, &r, 0, rows, panel, njobs);
        scratch_put(ctx, pl, h);
        rc = 0;
    }
    if (rc == 0 && trial >= 0)
        trial_done(device, key, trial, now_ns() - t0);
    return rc;
}
