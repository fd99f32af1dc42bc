/*
 * backends/cpu/cpu-pool.c — the cpu backend's thread pool and its parallel-for.
 *
 * One pool per device context, created in open and joined in close, so the library
 * never runs threads nobody asked for. Between parallel regions a worker first polls for
 * a short while (KILN_CPU_SPIN_US, default 50 µs) and then sleeps on a condition
 * variable. Sleeping at once made every region pay a futex wake-up and a context switch
 * on both sides (the caller also slept until the last worker checked out): a network of
 * many small layers, such as MobileNetV3 at about 150 regions a run, spent over a
 * quarter of its time in the scheduler. Spinning without bound is no better: on a machine
 * with as many threads as cores, a worker that spins after a region steals the core from
 * whoever runs next (OpenBLAS's own threads when KILN_CPU_BLAS=openblas, the daemon's
 * I/O loop), which made mixed workloads 2-4x slower in earlier measurements. The bound
 * covers the executor's bookkeeping between two layers, not idle time between requests.
 *
 * A region gives each thread a contiguous share of its jobs, which it may take from the
 * others once its own are done (pool_lane, below), so a slow worker delays only its own
 * job. The caller's thread takes part, so a pool of n threads starts n - 1 workers.
 * Only one region runs at a time: a second caller (another thread using the same device)
 * or a nested call from inside a job runs its jobs inline rather than waiting, which can
 * neither deadlock nor oversubscribe the cores.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "cpu-impl.h"

struct kiln__cpu_pool {
    int nthreads;             /* including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake;      /* workers wait here for a new generation */
    pthread_cond_t done;      /* the caller waits here for active == 0 */
    pthread_mutex_t region;   /* held by the thread running a parallel region */
    int64_t spin_ns;          /* how long a waiting thread polls before it sleeps */
    /* written under mu; also read without it by polling threads */
    _Atomic uint64_t generation;
    _Atomic bool stop;
    _Atomic int active;       /* workers still inside the current region */
    /* the current region: written under mu before generation moves */
    kiln__cpu_job_fn fn;
    void *arg;
    int njobs;
    struct pool_lane *lanes;  /* [nthreads]: each thread's share of the current region */
    struct worker_arg *wargs; /* [nthreads - 1] */
};

/* Thread t (the caller is 0) owns the contiguous jobs [t·n/T, (t+1)·n/T) of a region and
 * takes them in order; when its own run out it takes the next ones of the others. Jobs
 * are laid out in data order (planes, channel blocks, element ranges), so a thread tends
 * to read what it wrote in the previous layer, still in its own L2: with one shared
 * counter the caller took jobs 0, 2, 4... of one layer and the first half of the next,
 * and MobileNetV3's small layers scaled 1.1-1.3x on two cores, an elementwise Mul after
 * a depthwise layer running slower on two threads than on one. Taking the others' jobs
 * keeps the balance when a thread loses its core for a while. */
typedef struct pool_lane {
    _Atomic int next;
    int end;
} __attribute__((aligned(64))) pool_lane;

typedef struct worker_arg {
    struct kiln__cpu_pool *p;
    int lane;
} worker_arg;

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* One poll of a bounded wait: false once spin_ns has passed since the wait's first poll
 * (*until starts at 0). The clock is read every 64 polls, so it costs little next to the
 * pauses. */
static bool spin_on(const kiln__cpu_pool *p, unsigned i, int64_t *until)
{
    if ((i & 63) == 0) {
        int64_t t = mono_ns();
        if (!*until)
            *until = t + p->spin_ns;
        else if (t >= *until)
            return false;
    }
    cpu_relax();
    return true;
}

/* A worker's side: poll until generation differs from seen (or stop is set), for at most
 * spin_ns; true if it did. */
static bool spin_for_generation(kiln__cpu_pool *p, uint64_t seen)
{
    int64_t until = 0;
    for (unsigned i = 0; p->spin_ns > 0; i++) {
        if (atomic_load_explicit(&p->generation, memory_order_acquire) != seen ||
            atomic_load_explicit(&p->stop, memory_order_relaxed))
            return true;
        if (!spin_on(p, i, &until))
            break;
    }
    return false;
}

/* The caller's side: poll until the workers have checked out, for at most spin_ns. */
static bool spin_for_done(kiln__cpu_pool *p)
{
    int64_t until = 0;
    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(&p->active, memory_order_acquire) == 0)
            return true;
        if (p->spin_ns <= 0 || !spin_on(p, i, &until))
            return false;
    }
}

/* Set on pool workers so that a job which itself asks for parallelism runs inline. */
static _Thread_local bool in_worker;
/* The slot of the thread running the current job among the threads running its region
 * (kiln__cpu_pool_slot): its lane in a region, 0 for a region run inline, where it is
 * the only one. */
static _Thread_local int pool_slot;

int kiln__cpu_pool_slot(void)
{
    return pool_slot;
}

static int take_job(kiln__cpu_pool *p, int self)
{
    const int T = p->nthreads;
    for (int k = 0; k < T; k++) {
        pool_lane *l = &p->lanes[(self + k) % T];
        if (atomic_load_explicit(&l->next, memory_order_relaxed) >= l->end)
            continue;
        int j = atomic_fetch_add_explicit(&l->next, 1, memory_order_relaxed);
        if (j < l->end)
            return j;
    }
    return -1;
}

static void *worker_main(void *argp)
{
    const worker_arg *wa = argp;
    kiln__cpu_pool *p = wa->p;
    const int self = wa->lane;
    in_worker = true;
    pool_slot = self;
    uint64_t seen = 0;
    for (;;) {
        /* the polling phase; the region's fields were written before generation moved
         * (release), so the acquire load that sees the move also sees them */
        spin_for_generation(p, seen);
        pthread_mutex_lock(&p->mu);
        while (!p->stop && p->generation == seen)
            pthread_cond_wait(&p->wake, &p->mu);
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        seen = p->generation;
        kiln__cpu_job_fn fn = p->fn;
        void *arg = p->arg;
        int njobs = p->njobs;
        pthread_mutex_unlock(&p->mu);
        for (int j; (j = take_job(p, self)) >= 0;)
            fn(arg, j, njobs);
        /* under mu, so that a caller between its check of active and its wait cannot
         * miss the signal */
        pthread_mutex_lock(&p->mu);
        if (atomic_fetch_sub_explicit(&p->active, 1, memory_order_acq_rel) == 1)
            pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
    return NULL;
}

kiln__cpu_pool *kiln__cpu_pool_create(int nthreads, int64_t spin_ns)
{
    if (nthreads < 1)
        nthreads = 1;
    kiln__cpu_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->nthreads = nthreads;
    p->spin_ns = spin_ns > 0 ? spin_ns : 0;
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->region, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    p->lanes = aligned_alloc(64, (size_t)nthreads * sizeof *p->lanes);
    if (!p->lanes) {
        free(p);
        return NULL;
    }
    for (int t = 0; t < nthreads; t++) {
        atomic_init(&p->lanes[t].next, 0);
        p->lanes[t].end = 0;
    }
    if (nthreads > 1) {
        p->threads = calloc((size_t)nthreads - 1, sizeof *p->threads);
        p->wargs = calloc((size_t)nthreads - 1, sizeof *p->wargs);
        if (!p->threads || !p->wargs) {
            free(p->threads);
            free(p->wargs);
            free(p->lanes);
            free(p);
            return NULL;
        }
        for (int i = 0; i < nthreads - 1; i++) {
            p->wargs[i].p = p;
            p->wargs[i].lane = i + 1;
            if (pthread_create(&p->threads[i], NULL, worker_main, &p->wargs[i]) != 0) {
                /* run with the workers we got */
                p->nthreads = i + 1;
                break;
            }
        }
    }
    return p;
}

void kiln__cpu_pool_destroy(kiln__cpu_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nthreads - 1; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
    free(p->wargs);
    free(p->lanes);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->region);
    free(p);
}

int kiln__cpu_pool_size(const kiln__cpu_pool *p)
{
    return p ? p->nthreads : 1;
}

void kiln__cpu_pool_run(kiln__cpu_pool *p, int njobs, kiln__cpu_job_fn fn, void *arg)
{
    if (njobs <= 0)
        return;
    if (!p || p->nthreads == 1 || njobs == 1 || in_worker || pthread_mutex_trylock(&p->region) != 0) {
        /* the only thread running these jobs: slot 0 of this region, whatever lane it
         * holds in an enclosing one (restored for that one's remaining jobs) */
        int outer = pool_slot;
        pool_slot = 0;
        for (int j = 0; j < njobs; j++)
            fn(arg, j, njobs);
        pool_slot = outer;
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->njobs = njobs;
    for (int t = 0; t < p->nthreads; t++) {
        atomic_store_explicit(&p->lanes[t].next, (int)((int64_t)njobs * t / p->nthreads), memory_order_relaxed);
        p->lanes[t].end = (int)((int64_t)njobs * (t + 1) / p->nthreads);
    }
    /* Every worker wakes for a generation and must check out, even if it finds no job
     * left; counting all of them keeps the bookkeeping simple. */
    atomic_store_explicit(&p->active, p->nthreads - 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    /* no system call when every worker is still polling */
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);

    bool was = in_worker;
    in_worker = true; /* nested regions from the caller's own jobs run inline */
    pool_slot = 0;
    for (int j; (j = take_job(p, 0)) >= 0;)
        fn(arg, j, njobs);
    in_worker = was;

    if (!spin_for_done(p)) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load_explicit(&p->active, memory_order_acquire) > 0)
            pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
    pthread_mutex_unlock(&p->region);
}

typedef struct range_job {
    kiln__cpu_range_fn fn;
    void *arg;
    int64_t n;
} range_job;

static void range_job_run(void *argp, int job, int njobs)
{
    range_job *r = argp;
    int64_t begin = r->n * job / njobs;
    int64_t end = r->n * (job + 1) / njobs;
    if (end > begin)
        r->fn(r->arg, begin, end);
}

void kiln__cpu_parallel_for(kiln__cpu_ctx *ctx, int64_t n, int64_t grain, kiln__cpu_range_fn fn,
                            void *arg)
{
    if (n <= 0)
        return;
    if (grain < 1)
        grain = 1;
    int64_t chunks = n / grain;
    if (chunks > ctx->nthreads)
        chunks = ctx->nthreads;
    if (chunks <= 1) {
        fn(arg, 0, n);
        return;
    }
    range_job r = {fn, arg, n};
    kiln__cpu_pool_run(ctx->pool, (int)chunks, range_job_run, &r);
}
