/*
 * bench/engine/plain-loops.c — the "plain C loop" peers for the elementwise benchmarks:
 * what a programmer writes by hand, compiled with -O3 -march=native (see meson.build).
 */
#include <math.h>
#include <stddef.h>

#include "plain-loops.h"

void plain_add_f32(float *restrict out, const float *restrict a, const float *restrict b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

void plain_gelu_f32(float *restrict out, const float *restrict x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}
