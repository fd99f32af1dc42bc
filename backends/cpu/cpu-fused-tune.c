/*
 * backends/cpu/cpu-fused-tune.c — the block size of the cpu's fused programs: the
 * candidates, the classes being tuned and the choice cpu-fused.c runs with.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "autotune-impl.h"
#include "cpu-fused-impl.h"

/* Block sizes: a few registers of this many floats stay in L1/L2 while a block runs. A
 * program of TUNE_MIN elements or more whose shape class has no cached winner is tuned
 * over its class's first runs: each run computes the whole range with the next candidate
 * (so every run is a real one, in-place programs included) and is timed; once every
 * candidate has run TUNE_ROUNDS times, the one with the fastest run becomes the class's
 * block size in the autotune cache (engine/autotune.c). Smaller programs take
 * KILN_CPU_FUSED_BLOCK.
 *
 * Why whole runs: timing the candidates on segments of one run (as this did before) saw
 * conditions a steady run never has — short segments, inputs partly still cached from
 * their producer — and picked differently from one process to the next: on
 * gelu(x·a+b)·c over 64 MiB with a, b, c full, 2048 in one process (16.4 ms on one
 * thread) where 512 and 1024 take 12.7-13.0. */
static const int64_t block_candidates[] = {512, 1024, 2048, 4096, 8192};
#define NCANDIDATES (int)(sizeof block_candidates / sizeof *block_candidates)
#define TUNE_ROUNDS 2

/* The classes being tuned, process-wide (kernel table and thread count are part of the
 * id, as of the cache's device name), behind one lock: a class's runs may come from any
 * queue's thread. When every slot is taken, a new class takes the one used least
 * recently, so classes seen once (a model's odd shapes in a long-running kilnd) cannot
 * keep the later ones from being tuned; the evicted class starts over if it comes back. */
#define TUNING_SLOTS 32
typedef struct tuning {
    char id[184]; /* device, tab, key */
    int runs;
    unsigned long used; /* tuning_clock at its last run */
    double fastest[NCANDIDATES];
} tuning;
static pthread_mutex_t tuning_lock = PTHREAD_MUTEX_INITIALIZER;
static tuning tunings[TUNING_SLOTS];
static int ntunings;
static unsigned long tuning_clock;

/* The candidate this run of class id should time. */
static int tuning_next(const char *id)
{
    pthread_mutex_lock(&tuning_lock);
    int i = 0;
    while (i < ntunings && strcmp(tunings[i].id, id) != 0)
        i++;
    if (i == ntunings) {
        if (ntunings < TUNING_SLOTS) {
            ntunings++;
        } else {
            i = 0;
            for (int k = 1; k < ntunings; k++)
                if (tunings[k].used < tunings[i].used)
                    i = k;
        }
        memset(&tunings[i], 0, sizeof tunings[i]);
        snprintf(tunings[i].id, sizeof tunings[i].id, "%s", id);
    }
    tunings[i].used = ++tuning_clock;
    int c = tunings[i].runs % NCANDIDATES;
    pthread_mutex_unlock(&tuning_lock);
    return c;
}

/* Record a timed run; after the last one, store the class's winner and free its slot. A
 * class evicted meanwhile is no longer found: its run counts for nothing. */
static void tuning_done(const char *device, const char *key, const char *id, int c, double ns)
{
    int64_t winner = 0;
    pthread_mutex_lock(&tuning_lock);
    for (int i = 0; i < ntunings; i++) {
        tuning *t = &tunings[i];
        if (strcmp(t->id, id) != 0)
            continue;
        if (t->fastest[c] == 0 || ns < t->fastest[c])
            t->fastest[c] = ns;
        if (++t->runs >= NCANDIDATES * TUNE_ROUNDS) {
            int best = 0;
            for (int k = 1; k < NCANDIDATES; k++)
                if (t->fastest[k] > 0 && (t->fastest[best] == 0 || t->fastest[k] < t->fastest[best]))
                    best = k;
            winner = block_candidates[best];
            tunings[i] = tunings[--ntunings];
        }
        break;
    }
    pthread_mutex_unlock(&tuning_lock);
    if (winner)
        kiln__autotune_store(device, key, winner);
}

#define TUNE_MIN ((int64_t)1 << 20)

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* The shape class: element count (power of two), instructions, scratch registers,
 * gathered and contiguous inputs, streamed or cached stores. */
static void shape_class(const fplan *pl, char *key, size_t len)
{
    const kiln_fused_program *p = pl->p;
    int lg = 0, gathers = 0, contiguous = 0;
    for (int64_t n = p->n; n > 1; n >>= 1)
        lg++;
    for (int i = 0; i < p->ninputs; i++) {
        gathers += pl->in[i].kind == IN_GATHER;
        contiguous += pl->in[i].kind == IN_CONTIG;
    }
    int instrs = p->ninstrs <= 4 ? 4 : p->ninstrs <= 8 ? 8 : p->ninstrs <= 16 ? 16 : 64;
    /* the full-size inputs streamed from memory count too: gelu(x·a+b)·c with a, b, c per
     * column runs best with 2048-element blocks, the same with a, b, c full with 512-1024 */
    snprintf(key, len, "fused-block n2^%d i%d r%d g%d c%d %s", lg, instrs, pl->nslots, gathers, contiguous,
             pl->stream ? "stream" : "cached");
}

int64_t kiln__cpu_fused_block_begin(const kiln__cpu_ctx *ctx, const fplan *pl, kiln__cpu_fused_tuning *t)
{
    const kiln_fused_program *p = pl->p;
    memset(t, 0, sizeof *t);
    t->candidate = -1;
    int64_t block = KILN_CPU_FUSED_BLOCK;
    if (p->n >= TUNE_MIN && p->reduce_inner == 0) {
        snprintf(t->device, sizeof t->device, "cpu/%s/%dt", ctx->k->name, ctx->nthreads);
        shape_class(pl, t->key, sizeof t->key);
        snprintf(t->id, sizeof t->id, "%s\t%s", t->device, t->key);
        if (!kiln__autotune_lookup(t->device, t->key, &block)) {
            t->candidate = tuning_next(t->id);
            block = block_candidates[t->candidate];
        }
        if (block < 64 || block > block_candidates[NCANDIDATES - 1])
            block = KILN_CPU_FUSED_BLOCK;
    }
    if (t->candidate >= 0)
        t->start_ns = now_ns(); /* only a tuning run is timed */
    return block;
}

void kiln__cpu_fused_block_end(const kiln__cpu_fused_tuning *t)
{
    if (t->candidate >= 0)
        tuning_done(t->device, t->key, t->id, t->candidate, now_ns() - t->start_ns);
}
