/*
 * tests/fusion/fusion-test.h — what the fusion suite's files share: a counting check
 * macro, a tiny seeded generator and the ops random expression graphs draw from.
 */
#ifndef KILN_FUSION_TEST_H
#define KILN_FUSION_TEST_H

#include <stdint.h>
#include <stdio.h>

#include "kiln/tensor.h"

extern int fusion_passed, fusion_failed;

#define CHECK(cond, ...)                                                                                          \
    do {                                                                                                          \
        if (cond) {                                                                                               \
            fusion_passed++;                                                                                      \
        } else {                                                                                                  \
            fusion_failed++;                                                                                      \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                  \
            fprintf(stderr, __VA_ARGS__);                                                                         \
            fputc('\n', stderr);                                                                                  \
        }                                                                                                         \
    } while (0)

/* Calls of the primitive entry named entry ("fused", "unary", ...) that a device over the
 * counting decorator made so far, or all its calls with entry NULL; 0 on a device that
 * counts nothing. */
static inline uint64_t fusion_calls_of(kiln_device *d, const char *entry)
{
    kiln_device_counters c;
    uint64_t n = 0;
    if (kiln_device_counters_get(d, &c, entry, &n) < 0)
        return 0;
    return entry ? n : c.calls;
}

static inline uint64_t test_rand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static inline int test_pick(uint64_t *s, int n)
{
    return (int)(test_rand(s) % (uint64_t)n);
}

/* The unary and binary ops the random expression graphs draw from (test-graphs.c on the
 * cpu, test-gpu.c on the GPU backends): which picks one. */
static inline kiln_tensor *fusion_unary_of(kiln_tensor *t, int which)
{
    switch (which) {
    case 0: return kiln_tanh(t);
    case 1: return kiln_relu(t);
    case 2: return kiln_gelu(t, false);
    case 3: return kiln_sigmoid(t);
    case 4: return kiln_neg(t);
    case 5: return kiln_abs(t);
    case 6: return kiln_mul_scalar(t, 0.5);
    case 7: return kiln_add_scalar(t, -0.25);
    case 8: return kiln_silu(t);
    default: return kiln_square(kiln_tanh(t));
    }
}

static inline kiln_tensor *fusion_binary_of(kiln_tensor *a, kiln_tensor *b, int which)
{
    switch (which) {
    case 0: return kiln_add(a, b);
    case 1: return kiln_sub(a, b);
    case 2: return kiln_mul(a, b);
    case 3: return kiln_maximum(a, b);
    case 4: return kiln_minimum(a, b);
    default: return kiln_div(a, kiln_add_scalar(kiln_abs(b), 1.0));
    }
}

void test_programs(void); /* test-programs.c: kiln_fused_program on the cpu's fused_run */
void test_graphs(void);   /* test-graphs.c: random expression graphs, fused vs unfused vs ref */
void test_training(void); /* test-training.c: gradients and launch counts of training steps */
void test_autotune(void); /* test-autotune.c: the autotune cache through the fused block size */
void test_gpu(void);      /* test-gpu.c: graphs fused on cuda:0 and vulkan:0 (skipped without them) */
void test_wrapped(void);  /* test-wrapped.c: wrapped buffers freed under a pending group */
void test_epilogue(void); /* test-epilogue.c: matmul epilogues and row reductions fused */
void test_tune(void);     /* test-tune.c: the cpu's fused block-size tuner */
void test_pool_grad(void); /* test-pool-grad.c: a max pooling's gradient heading a group */
void test_conv_chains(void); /* test-conv-chain.c: a convolution's epilogue chained into its tiles */
void test_dead_memory(void); /* test-dead-memory.c: dead intermediates' memory back before the flush */
void test_lent_memory(void); /* test-lent-memory.c: the caller's lent memory touched between ops */

#endif
