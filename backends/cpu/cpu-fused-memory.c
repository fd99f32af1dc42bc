/*
 * backends/cpu/cpu-fused-memory.c — how the cpu's fused blocks meet memory: streamed
 * (non-temporal) stores of outputs far larger than the caches, and prefetches of the
 * next block's inputs while the current one computes (cpu-fused.c runs the blocks).
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

/* Ask for the next block's contiguous inputs while this one computes: a chain with a
 * heavy op (erf, tanh) is compute-bound per block, and without this its loads only start
 * when the next block does. Only for one or two such streams: measured on gelu(x·a+b)·c
 * over 64 MiB on one thread (CPU time, three runs each), 16.6-16.9 ms without and
 * 14.5-16.6 ms with it for a, b, c per column (one stream), but 22.6 -> 23.5 ms with a,
 * b, c full (four streams, which the hardware prefetchers already keep busy).
 *
 * Where the program has heavy ops, the requests are spread over them (run_block asks for
 * a share after each 256-element chunk of such an op) rather than issued all at once
 * when the block starts: a burst of a whole block's lines outruns the core's outstanding
 * misses, so the later ones only went out once the first arrived, while the heavy op
 * computes long enough to hide them all. The same chain, one thread, CPU time, three
 * alternating runs each: 7.3-7.7 ms with the burst, 6.2-6.7 ms spread. The stores were
 * tried the same way (a block's streamed output kept aside and written out in shares
 * during the next block's heavy op): 7.3 ms against 6.2, so they are not deferred. */
void kiln__cpu_fused_prefetch_upto(kiln__cpu_prefetcher *pf, int64_t upto)
{
    if (upto > pf->bytes)
        upto = pf->bytes;
    for (; pf->issued < upto; pf->issued += 64)
        for (int k = 0; k < pf->nbase; k++)
            __builtin_prefetch(pf->base[k] + pf->issued, 0, 3);
}

void kiln__cpu_fused_prefetch_next(const fplan *pl, int64_t i0, int64_t m, int64_t end, kiln__cpu_prefetcher *pf)
{
    int64_t next = i0 + m, len = end - next < pl->block ? end - next : pl->block;
    pf->nbase = 0;
    pf->bytes = pf->issued = 0;
    if (len <= 0 || !pl->prefetch)
        return;
    for (int k = 0; k < pl->p->ninputs && pf->nbase < 2; k++)
        if (pl->in[k].kind == IN_CONTIG)
            pf->base[pf->nbase++] = (const char *)(pl->in[k].base + next);
    pf->bytes = len * (int64_t)sizeof(float);
    if (pl->nheavy == 0)
        kiln__cpu_fused_prefetch_upto(pf, pf->bytes);
}
