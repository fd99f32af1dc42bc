/* bench/engine/plain-loops.h — hand-written loops the elementwise benchmarks compare with. */
#ifndef KILN_BENCH_PLAIN_LOOPS_H
#define KILN_BENCH_PLAIN_LOOPS_H

#include <stddef.h>

void plain_add_f32(float *restrict out, const float *restrict a, const float *restrict b, size_t n);
void plain_gelu_f32(float *restrict out, const float *restrict x, size_t n);

#endif
