/*
 * backends/cpu/cpu-fused-memory.c — streamed (non-temporal) stores of the cpu's fused
 * blocks, for outputs far larger than the caches (cpu-fused.c runs the blocks; the
 * prefetches of the next block are inline in cpu-fused-impl.h).
 */
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cpu-fused-impl.h"

/* o[0, m) = src[0, m) bypassing the caches where the CPU can, in the widest stores the
 * kernel table's CPU has: one 64-byte store fills a whole write-combining line at once,
 * where four 16-byte ones may leave it partly filled when the loop is interrupted. On
 * gelu(x·a+b)·c over 64 MiB (one thread, CPU time, 1024-element blocks) 512-bit stores
 * took 6.9 ms against 7.1-7.6 with SSE2's. */
#if defined(__x86_64__)
__attribute__((target("avx512f"))) static void store_stream512(float *o, const float *src, int64_t m)
{
    int64_t j = 0;
    for (; j < m && ((uintptr_t)(o + j) & 63); j++)
        o[j] = src[j];
    for (; j + 16 <= m; j += 16)
        _mm512_stream_ps(o + j, _mm512_loadu_ps(src + j));
    for (; j < m; j++)
        o[j] = src[j];
}

__attribute__((target("avx"))) static void store_stream256(float *o, const float *src, int64_t m)
{
    int64_t j = 0;
    for (; j < m && ((uintptr_t)(o + j) & 31); j++)
        o[j] = src[j];
    for (; j + 8 <= m; j += 8)
        _mm256_stream_ps(o + j, _mm256_loadu_ps(src + j));
    for (; j < m; j++)
        o[j] = src[j];
}
#endif

void kiln__cpu_fused_store_stream(const fplan *pl, float *o, const float *src, int64_t m)
{
    if (src == o)
        return;
    int64_t j = 0;
#if defined(__x86_64__)
    if (pl->k->stream_floats == 16) {
        store_stream512(o, src, m);
        return;
    }
    if (pl->k->stream_floats == 8) {
        store_stream256(o, src, m);
        return;
    }
    for (; j < m && ((uintptr_t)(o + j) & 15); j++)
        o[j] = src[j];
    for (; j + 4 <= m; j += 4)
        _mm_stream_ps(o + j, _mm_loadu_ps(src + j));
#else
    (void)pl;
#endif
    memmove(o + j, src + j, (size_t)(m - j) * sizeof *o);
}
