/*
 * backends/cpu/cpu-fused-product.c — a fused program headed by a producer, a matrix
 * product (MATMUL) or a convolution (CONV): the producer's elementwise consumers applied
 * as its epilogue.
 *
 * Unfused, x @ w followed by a bias add and an activation writes the whole product to
 * memory and reads it back once per op. Here the product is computed by the cpu's own
 * matmul entry (the same threads, the same bits), straight into the output when it is
 * kept (a training step keeps it for backward) or into pooled scratch when it is dead,
 * and the rest of the program runs over it in one pass, jobs cut at whole rows where a
 * softmax or reduction follows. Computing the product a panel of rows at a time, with
 * the epilogue over each panel while it is in L2, was measured and dropped: OpenBLAS
 * rounds a panel differently from the whole product (by an ulp here and there, which
 * broke fused-equals-unfused), and repacks B for every panel (32-row panels made a
 * 2048x1024x4096 product 6% slower; the best panel height only tied the whole product).
 *
 * A max pooling's gradient (POOL_GRAD) runs by chunks of planes, each job its own: a
 * chunk is zeroed, the gradient of each window added at the index its forward chose, and
 * the epilogue (a relu's backward) run over it, all while it is in L1/L2. Unfused, the
 * zero fill, the scatter and the epilogue each pass over the whole gradient in memory.
 *
 * A convolution runs by chunks of images: the cpu's conv entry computes a chunk
 * (spreading it over the pool itself; an image's output does not depend on the images
 * beside it, to the bit), then the epilogue runs over it while it is in the caches. The
 * chunk (the whole batch, 16, 4 or 1 images) is a real trade, tuned per shape class on
 * whole calls (see conv_trial) and kept in the autotune cache (engine/autotune.c).
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

/* Convolutions below this many multiply-adds (about 1 ms) are not timed: the whole batch. */
#define CHUNK_TUNE_MIN_MACS ((double)(1 << 26))

/* The producer's operands (arg, arg2, and a CONV's bias arg3) are valid inputs of f32
 * (a POOL_GRAD's indices: i64), loaded by no other instruction and overlapped by no output. */
static bool operands_ok(const kiln_fused_program *p, const kiln_fused_instr *pr, int nops)
{
    int ops[3] = {pr->arg, pr->arg2, pr->arg3};
    for (int k = 0; k < nops; k++) {
        kiln_dtype want = pr->code == KILN_FUSED_POOL_GRAD && k == 1 ? KILN_I64 : KILN_F32;
        if ((unsigned)ops[k] >= (unsigned)p->ninputs || p->inputs[ops[k]].dtype != want)
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

/* A POOL_GRAD's planes: grad_x [N, C, S...] of p->n elements, grad_out and the indices
 * contiguous with a whole number of elements per plane. Only max pooling has a POOL_GRAD
 * (its indices say where each gradient goes, so the geometry is not needed here). */
static bool plan_pool_grad(fplan *pl, const kiln_fused_program *p, const kiln_tdesc *go, const kiln_tdesc *ix)
{
    const kiln_tdesc *gx = p->pool_grad_x;
    if (!p->pool || p->pool->kind != KILN_POOL_MAX || !gx || gx->ndim < 3 || gx->ndim != p->pool->nspatial + 2 ||
        kiln__cpu_numel(gx) != p->n || p->n <= 0 || p->reduce_inner != 0 || !kiln__cpu_contig(go) ||
        !kiln__cpu_contig(ix))
        return false;
    pl->planes = gx->shape[0] * gx->shape[1];
    if (pl->planes <= 0 || p->n % pl->planes || kiln__cpu_numel(go) % pl->planes ||
        kiln__cpu_numel(go) != kiln__cpu_numel(ix))
        return false;
    pl->plane_in = p->n / pl->planes;
    pl->plane_out = kiln__cpu_numel(go) / pl->planes;
    return true;
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
    if (pr->code == KILN_FUSED_POOL_GRAD) {
        pl->pool_grad = true;
        return plan_pool_grad(pl, p, a, b) ? 1 : KILN_ENOTSUP;
    }
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
    if (kiln__cpu_numel(o) != p->n || (p->reduce_inner > 0 && p->n % p->reduce_inner))
        return KILN_ENOTSUP;
    return 1;
}

/* Candidates are timed in the process's CPU time, not wall time: on a shared machine
 * another process's load moves wall times by 2x between calls (a 128-row matmul panel won
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

/* The epilogue over elements [lo, hi) of a product (or a chunk of images), split over the
 * pool. */
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
    int64_t row = e->pl->p->reduce_inner;
    if (row > 0) { /* whole rows per job: a softmax or reduction follows */
        int64_t rows = n / row;
        b = e->lo + rows * job / njobs * row;
        end = e->lo + rows * (job + 1) / njobs * row;
    }
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

/* Chunk sizes are tried on whole calls, one candidate per call of a shape class (a
 * training step or a served model repeats its convolutions, so no work is repeated for
 * timing), and the fastest stored once all have run. The trials in progress are process-wide, as the
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
    if (pl->chained)
        return kiln__cpu_fused_chain_run(ctx, pl);
    const kiln_fused_program *p = pl->p;
    const kiln_tdesc *w = &p->inputs[p->instrs[0].arg2];
    int64_t N = pl->conv_out.shape[0], per = p->n / N;
    double macs = (double)p->n * (double)(kiln__cpu_numel(w) / (w->shape[0] ? w->shape[0] : 1));
    int choice = 0, trial = -1;
    char device[64], key[96];
    if (macs >= CHUNK_TUNE_MIN_MACS && N > 1) {
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

/* The product computed by the matmul entry, then the epilogue over it. */
static int whole_product(kiln__cpu_ctx *ctx, fplan *pl)
{
    const kiln_fused_program *p = pl->p;
    size_t slab = (size_t)pl->nslots * (size_t)pl->block;
    size_t whole = pl->product_out >= 0 ? 0 : (size_t)p->n;
    struct kiln_buffer *h;
    if (!scratch_get(ctx, pl, slab * (size_t)ctx->nthreads + whole, &h))
        return kiln__cpu_enomem("fused");
    float *dst = pl->product_out >= 0 ? pl->out[pl->product_out]
                                      : (float *)pl->scratch + slab * (size_t)ctx->nthreads;
    struct kiln_buffer fake = {.data = dst};
    kiln_tdesc od = pl->mm_out;
    od.buf = &fake;
    od.offset = 0;
    int rc = kiln__cpu_matmul(ctx, &od, &p->inputs[p->instrs[0].arg], &p->inputs[p->instrs[0].arg2]);
    if (rc == 0) {
        ejob e = {pl, 0, p->n, dst, slab};
        int64_t jobs = p->n / 16384;
        int njobs = jobs < 1 ? 1 : jobs > ctx->nthreads ? ctx->nthreads : (int)jobs;
        if (p->reduce_inner > 0 && p->n / p->reduce_inner < njobs)
            njobs = (int)(p->n / p->reduce_inner);
        if (njobs <= 1)
            epilogue_job(&e, 0, 1);
        else
            kiln__cpu_pool_run(ctx->pool, njobs, epilogue_job, &e);
    }
    scratch_put(ctx, pl, h);
    return rc;
}

/* A batched product (attention's per-head scores, their gradient) batch by batch: each
 * job computes a batch's product into its own scratch (or the kept output) and runs the
 * epilogue over it at once, while the product is in L2, instead of writing the whole
 * product out and reading it back. The batches are the cpu matmul's own BLAS calls
 * (kiln__cpu_matmul_batch), so the bits are those of the whole product. */
typedef struct bjob {
    kiln__cpu_ctx *ctx;
    const fplan *pl;
    const kiln__cpu_mm_batches *mb;
    size_t slab, per_job; /* floats: the epilogue's slab, and slab + one batch's product */
} bjob;

static void batched_job(void *arg, int job, int njobs)
{
    const bjob *e = arg;
    const fplan *pl = e->pl;
    int64_t nb = e->mb->nbatch, per = e->mb->M * e->mb->N;
    int64_t b0 = nb * job / njobs, b1 = nb * (job + 1) / njobs;
    float *slab = (float *)pl->scratch + (size_t)job * e->per_job, *mine = slab + e->slab;
    double acc[KILN_FUSED_MAX_INSTRS] = {0};
    for (int64_t bi = b0; bi < b1; bi++) {
        float *dst = pl->product_out >= 0 ? pl->out[pl->product_out] + bi * per : mine;
        kiln__cpu_matmul_batch(e->ctx, e->mb, bi, dst);
        kiln__cpu_fused_span(pl, slab, acc, bi * per, (bi + 1) * per, dst, bi * per);
    }
#if defined(__x86_64__)
    if (pl->stream)
        _mm_sfence();
#endif
}

/* Batches of at most this many product elements are run batch by batch (in L2). */
#define BATCH_IN_CACHE_ELEMENTS (1 << 17)

/* 1 when run batch by batch (0 or an error), 0 when the product is not such a batch. */
static int batched_product(kiln__cpu_ctx *ctx, fplan *pl)
{
    const kiln_fused_program *p = pl->p;
    kiln__cpu_mm_batches mb;
    /* (with blas=openblas the product is OpenBLAS's to thread, not called from our jobs) */
    if (ctx->blas_own_threads ||
        !kiln__cpu_matmul_batches(ctx, &pl->mm_out, &p->inputs[p->instrs[0].arg], &p->inputs[p->instrs[0].arg2],
                                  &mb) ||
        mb.M * mb.N > BATCH_IN_CACHE_ELEMENTS || (p->reduce_inner > 0 && (mb.M * mb.N) % p->reduce_inner))
        return 0;
    int njobs = mb.nbatch < ctx->nthreads ? (int)mb.nbatch : ctx->nthreads;
    bjob e = {ctx, pl, &mb, (size_t)pl->nslots * (size_t)pl->block, 0};
    e.per_job = e.slab + (pl->product_out >= 0 ? 0 : (size_t)(mb.M * mb.N));
    struct kiln_buffer *h;
    if (!scratch_get(ctx, pl, e.per_job * (size_t)njobs, &h))
        return kiln__cpu_enomem("fused");
    if (njobs <= 1)
        batched_job(&e, 0, 1);
    else
        kiln__cpu_pool_run(ctx->pool, njobs, batched_job, &e);
    scratch_put(ctx, pl, h);
    return 1;
}

/* ------------------------------------------------------------------ pooling gradient */

/* Planes per chunk: about this many elements (in L1/L2 while zeroed, scattered into and
 * read by the epilogue), at least one plane. */
#define POOL_GRAD_CHUNK_ELEMENTS 8192

typedef struct pgjob {
    const fplan *pl;
    const float *go;
    const int64_t *ix;
    int64_t chunk; /* planes */
    float *images; /* per job: chunk planes, where the gradient is not stored */
    size_t slab;
} pgjob;

/* One job's planes, a chunk at a time: zeroed, each window's gradient added at its
 * forward's index (the pool_backward entry's order, so the same bits), then the epilogue
 * over the chunk. An index outside its plane (never made by the forward) is skipped. */
static void pool_grad_job(void *arg, int job, int njobs)
{
    const pgjob *e = arg;
    const fplan *pl = e->pl;
    int64_t p0 = pl->planes * job / njobs, p1 = pl->planes * (job + 1) / njobs;
    int64_t isz = pl->plane_in, osz = pl->plane_out;
    float *slab = (float *)pl->scratch + (size_t)job * e->slab;
    float *img = e->images ? e->images + (size_t)job * (size_t)(e->chunk * isz) : NULL;
    double acc[KILN_FUSED_MAX_INSTRS] = {0};
    for (int64_t c0 = p0; c0 < p1; c0 += e->chunk) {
        int64_t cnt = p1 - c0 < e->chunk ? p1 - c0 : e->chunk;
        float *dst = pl->product_out >= 0 ? pl->out[pl->product_out] + c0 * isz : img;
        memset(dst, 0, (size_t)(cnt * isz) * sizeof *dst);
        for (int64_t q = 0; q < cnt; q++) {
            float *gx = dst + q * isz;
            const float *gy = e->go + (c0 + q) * osz;
            const int64_t *ix = e->ix + (c0 + q) * osz;
            for (int64_t o = 0; o < osz; o++)
                if ((uint64_t)ix[o] < (uint64_t)isz)
                    gx[ix[o]] += gy[o];
        }
        kiln__cpu_fused_span(pl, slab, acc, c0 * isz, (c0 + cnt) * isz, dst, c0 * isz);
    }
#if defined(__x86_64__)
    if (pl->stream)
        _mm_sfence();
#endif
}

static int pool_grad_product(kiln__cpu_ctx *ctx, fplan *pl)
{
    const kiln_fused_program *p = pl->p;
    const kiln_fused_instr *pr = &p->instrs[0];
    int64_t chunk = POOL_GRAD_CHUNK_ELEMENTS / pl->plane_in;
    chunk = chunk < 1 ? 1 : chunk;
    int64_t jobs = p->n / 16384;
    int njobs = jobs < 1 ? 1 : jobs > ctx->nthreads ? ctx->nthreads : (int)jobs;
    if (njobs > pl->planes)
        njobs = (int)pl->planes;
    size_t slab = (size_t)pl->nslots * (size_t)pl->block;
    size_t images = pl->product_out >= 0 ? 0 : (size_t)(chunk * pl->plane_in);
    struct kiln_buffer *h;
    if (!scratch_get(ctx, pl, (slab + images) * (size_t)njobs, &h))
        return kiln__cpu_enomem("fused");
    pgjob e = {pl,
               kiln__cpu_ptr(&p->inputs[pr->arg]),
               kiln__cpu_ptr(&p->inputs[pr->arg2]),
               chunk,
               images ? (float *)pl->scratch + slab * (size_t)njobs : NULL,
               slab};
    if (njobs == 1)
        pool_grad_job(&e, 0, 1);
    else
        kiln__cpu_pool_run(ctx->pool, njobs, pool_grad_job, &e);
    scratch_put(ctx, pl, h);
    return 0;
}

int kiln__cpu_fused_product(kiln__cpu_ctx *ctx, fplan *pl)
{
    if (pl->pool_grad)
        return pool_grad_product(ctx, pl);
    if (pl->conv)
        return conv_product(ctx, pl);
    int rc = batched_product(ctx, pl);
    if (rc == 0)
        return whole_product(ctx, pl);
    return rc < 0 ? rc : 0;
}
