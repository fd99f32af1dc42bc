/*
 * tests/fusion/test-fusion.c — the fusion suite's runner: fused programs on the cpu
 * (test-programs.c), random expression graphs through the fused decorator
 * (test-graphs.c), training steps (test-training.c), the autotune cache (test-autotune.c)
 * matmul epilogues (test-epilogue.c), the cpu's block-size tuner (test-tune.c), the
 * decorator's wrapped buffers (test-wrapped.c) and pooling gradients heading a group
 * (test-pool-grad.c).
 * Prints "N passed, N failed".
 */
#include <stdio.h>

#include "fusion-test.h"

int fusion_passed, fusion_failed;

int main(void)
{
    test_programs();
    test_graphs();
    test_training();
    test_autotune();
    test_gpu();
    test_wrapped();
    test_dead_memory();
    test_lent_memory();
    test_epilogue();
    test_tune();
    test_pool_grad();
    test_conv_chains();
    printf("fusion: %d passed, %d failed\n", fusion_passed, fusion_failed);
    return fusion_failed ? 1 : 0;
}
