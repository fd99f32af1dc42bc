/*
 * tests/fusion/test-tune.c — the cpu's block-size tuner (backends/cpu/cpu-fused-tune.c)
 * through its two calls, on planned programs that are never run: a class is tuned over
 * its first whole runs, every candidate twice, and its winner then comes from the
 * autotune cache; small programs are not tuned; and when every tuning slot is taken by
 * classes seen once, a new class still gets tuned (it takes the least recently used slot).
 */
#include <string.h>

#include "autotune-impl.h"
#include "cpu-fused-impl.h"
#include "fusion-test.h"

/* A planned program of n elements whose class differs by its scratch register count. */
static void plan_of(fplan *pl, kiln_fused_program *p, int64_t n, int nslots)
{
    memset(pl, 0, sizeof *pl);
    memset(p, 0, sizeof *p);
    p->n = n;
    p->ninstrs = 3;
    p->ninputs = 1;
    pl->p = p;
    pl->in[0].kind = IN_CONTIG;
    pl->nslots = nslots;
    pl->stream = n >= ((int64_t)1 << 21);
}

/* Runs of one class until the cache holds its winner (at most 40); how many it took, and
 * the blocks the runs used in blocks[]. */
static int tune_runs(kiln__cpu_ctx *ctx, int nslots, int64_t blocks[40], int64_t *winner)
{
    fplan pl;
    kiln_fused_program p;
    plan_of(&pl, &p, (int64_t)1 << 20, nslots);
    for (int r = 0; r < 40; r++) {
        kiln__cpu_fused_tuning t;
        blocks[r] = kiln__cpu_fused_block_begin(ctx, &pl, &t);
        kiln__cpu_fused_block_end(&t);
        if (kiln__autotune_lookup(t.device, t.key, winner))
            return r + 1;
    }
    return 40;
}

void test_tune(void)
{
    kiln__cpu_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.k = &kiln__cpu_kernels_base;
    ctx.nthreads = 3; /* a device name ("cpu/base/3t") no real device here uses */

    int64_t blocks[40], winner = 0;
    int runs = tune_runs(&ctx, 1000, blocks, &winner);
    int seen[5] = {0};
    const int64_t cand[5] = {512, 1024, 2048, 4096, 8192};
    for (int r = 0; r < runs && r < 40; r++)
        for (int c = 0; c < 5; c++)
            seen[c] += blocks[r] == cand[c];
    CHECK(runs == 10 && seen[0] == 2 && seen[1] == 2 && seen[2] == 2 && seen[3] == 2 && seen[4] == 2,
          "a class is tuned over 10 runs, each candidate twice (%d runs; %d %d %d %d %d)", runs, seen[0], seen[1],
          seen[2], seen[3], seen[4]);
    bool valid = false;
    for (int c = 0; c < 5; c++)
        valid = valid || winner == cand[c];
    CHECK(valid, "the winner is a candidate: %lld", (long long)winner);
    fplan pl;
    kiln_fused_program p;
    plan_of(&pl, &p, (int64_t)1 << 20, 1000);
    kiln__cpu_fused_tuning t;
    CHECK(kiln__cpu_fused_block_begin(&ctx, &pl, &t) == winner && t.candidate < 0,
          "a tuned class runs its winner, untimed");
    kiln__cpu_fused_block_end(&t);

    plan_of(&pl, &p, 4096, 1001);
    CHECK(kiln__cpu_fused_block_begin(&ctx, &pl, &t) == KILN_CPU_FUSED_BLOCK && t.candidate < 0,
          "a small program is not tuned");
    kiln__cpu_fused_block_end(&t);

    /* 40 classes seen once each fill every slot; a new class is still tuned to the end */
    for (int k = 0; k < 40; k++) {
        plan_of(&pl, &p, (int64_t)1 << 20, 2000 + k);
        kiln__cpu_fused_block_begin(&ctx, &pl, &t);
        kiln__cpu_fused_block_end(&t);
    }
    runs = tune_runs(&ctx, 3000, blocks, &winner);
    CHECK(runs == 10, "after 40 classes seen once, a new class is tuned in 10 runs (took %d)", runs);
}
