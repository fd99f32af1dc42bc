/*
 * backends/cpu/cpu-pool.c — the cpu backend's thread pool and its parallel-for.
 *
 * One pool per device context, created in open and joined in close, so the library
 * never runs threads nobody asked for. Workers sleep on a condition variable between
 * parallel regions (passive waiting): on a machine with as many threads as cores, a
 * worker that spins after a region steals the core from whoever runs next — OpenBLAS's
 * threads in particular, which made mixed workloads 2-4x slower in earlier measurements.
 *
 * A region hands out its jobs through a shared counter, so a slow worker delays only its
 * own job. The caller's thread takes part, so a pool of n threads starts n - 1 workers.
 * Only one region runs at a time: a second caller (another thread using the same device)
 * or a nested call from inside a job runs its jobs inline rather than waiting, which can
 * neither deadlock nor oversubscribe the cores.
 */
#include <stdlib.h>

#include "cpu-impl.h"

struct kiln__cpu_pool {
    int nthreads;             /* including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake;      /* workers wait here for a new generation */
    pthread_cond_t done;      /* the caller waits here for active == 0 */
    pthread_mutex_t region;   /* held by the thread running a parallel region */
    uint64_t generation;
    bool stop;
    int active;               /* workers still inside the current region */
    /* the current region */
    kiln__cpu_job_fn fn;
    void *arg;
    int njobs;
    int next;                 /* next job to hand out, under mu */
};

/* Set on pool workers so that a job which itself asks for parallelism runs inline. */
static _Thread_local bool in_worker;

static int take_job(kiln__cpu_pool *p)
{
    pthread_mutex_lock(&p->mu);
    int j = p->next < p->njobs ? p->next++ : -1;
    pthread_mutex_unlock(&p->mu);
    return j;
}

static void *worker_main(void *argp)
{
    kiln__cpu_pool *p = argp;
    in_worker = true;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen)
            pthread_cond_wait(&p->wake, &p->mu);
        if (p->stop)
            break;
        seen = p->generation;
        kiln__cpu_job_fn fn = p->fn;
        void *arg = p->arg;
        int njobs = p->njobs;
        pthread_mutex_unlock(&p->mu);
        for (int j; (j = take_job(p)) >= 0;)
            fn(arg, j, njobs);
        pthread_mutex_lock(&p->mu);
        if (--p->active == 0)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

kiln__cpu_pool *kiln__cpu_pool_create(int nthreads)
{
    if (nthreads < 1)
        nthreads = 1;
    kiln__cpu_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->nthreads = nthreads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->region, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    if (nthreads > 1) {
        p->threads = calloc((size_t)nthreads - 1, sizeof *p->threads);
        if (!p->threads) {
            free(p);
            return NULL;
        }
        for (int i = 0; i < nthreads - 1; i++) {
            if (pthread_create(&p->threads[i], NULL, worker_main, p) != 0) {
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
    p->stop = true;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nthreads - 1; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
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
        for (int j = 0; j < njobs; j++)
            fn(arg, j, njobs);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->njobs = njobs;
    p->next = 0;
    /* Every worker wakes for a generation and must check out, even if it finds no job
     * left; counting all of them keeps the bookkeeping simple. */
    p->active = p->nthreads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);

    bool was = in_worker;
    in_worker = true; /* nested regions from the caller's own jobs run inline */
    for (int j; (j = take_job(p)) >= 0;)
        fn(arg, j, njobs);
    in_worker = was;

    pthread_mutex_lock(&p->mu);
    while (p->active > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
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
