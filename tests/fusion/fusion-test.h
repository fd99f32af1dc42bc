/*
 * tests/fusion/fusion-test.h — what the fusion suite's files share: a counting check
 * macro and a tiny seeded generator.
 */
#ifndef KILN_FUSION_TEST_H
#define KILN_FUSION_TEST_H

#include <stdint.h>
#include <stdio.h>

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

static inline uint64_t test_rand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static inline int test_pick(uint64_t *s, int n)
{
    return (int)(test_rand(s) % (uint64_t)n);
}

void test_programs(void); /* test-programs.c: kiln_fused_program on the cpu's fused_run */
void test_graphs(void);   /* test-graphs.c: random expression graphs, fused vs unfused vs ref */
void test_training(void); /* test-training.c: gradients and launch counts of training steps */
void test_autotune(void); /* test-autotune.c: the autotune cache through the fused block size */
void test_gpu(void);      /* test-gpu.c: graphs fused on cuda:0 and vulkan:0 (skipped without them) */
void test_epilogue(void); /* test-epilogue.c: matmul epilogues and row reductions fused */
void test_tune(void);     /* test-tune.c: the cpu's fused block-size tuner */

#endif
