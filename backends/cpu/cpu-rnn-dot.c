/*
 * backends/cpu/cpu-rnn-dot.c — the recurrent product of a fused LSTM/GRU step for a few
 * batch rows: g[b][j] = h[b] · R[j] for every gate row j of R ([N, H] as ONNX stores it).
 *
 * At batch 1 this is a matrix-vector product that reads all of R every step, so it runs
 * at the speed R streams from the caches. OpenBLAS's sgemv (its AVX2 kernel, through the
 * generic interface) and a dot product per row (sixteen rows side by side, each reduced
 * across its lanes at the end) both reached about a third of that. So R is transposed once
 * per layer into per-job scratch (kiln__cpu_rnn_pack) and each step reads it row after row
 * in k: g[j..j+127] += h[k] · Rᵀ[k][j..j+127], eight vector accumulators, no reductions,
 * one broadcast per k. Built with per-function target attributes and chosen by the kernel
 * table the device picked (KILN_CPU_KERNELS caps it), so libkiln still runs on any
 * x86-64; elsewhere the caller uses BLAS.
 */
#include "cpu-impl.h"

#if defined(__x86_64__)
#include <immintrin.h>

/* Columns per block: eight accumulators of 16 (AVX-512) or 8 (AVX2) lanes. */
#define BLOCK512 128
#define BLOCK256 64

__attribute__((target("avx512f"))) static void bcast_avx512(const float *RT, int64_t ldr, int64_t N, int64_t H,
                                                            const float *h, int64_t bn, float *g, int64_t ldg)
{
    for (int64_t b = 0; b < bn; b++) {
        const float *hb = h + b * H;
        for (int64_t j0 = 0; j0 < N; j0 += BLOCK512) {
            int64_t nj = N - j0 < BLOCK512 ? N - j0 : BLOCK512;
            int nv = (int)((nj + 15) / 16);
            __mmask16 last = nj % 16 ? (__mmask16)((1u << (nj % 16)) - 1) : (__mmask16)0xFFFF;
            __m512 acc[8];
            for (int u = 0; u < 8; u++)
                acc[u] = _mm512_setzero_ps();
            const float *rt = RT + j0;
            if (nj == BLOCK512) {
                for (int64_t k = 0; k < H; k++, rt += ldr) {
                    __m512 hk = _mm512_set1_ps(hb[k]);
                    for (int u = 0; u < 8; u++)
                        acc[u] = _mm512_fmadd_ps(_mm512_loadu_ps(rt + 16 * u), hk, acc[u]);
                }
            } else {
                for (int64_t k = 0; k < H; k++, rt += ldr) {
                    __m512 hk = _mm512_set1_ps(hb[k]);
                    for (int u = 0; u < nv; u++)
                        acc[u] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(u == nv - 1 ? last : 0xFFFF, rt + 16 * u), hk,
                                                 acc[u]);
                }
            }
            for (int u = 0; u < nv; u++)
                _mm512_mask_storeu_ps(g + b * ldg + j0 + 16 * u, u == nv - 1 ? last : 0xFFFF, acc[u]);
        }
    }
}

__attribute__((target("avx2,fma"))) static void bcast_avx2(const float *RT, int64_t ldr, int64_t N, int64_t H,
                                                          const float *h, int64_t bn, float *g, int64_t ldg)
{
    int64_t nfull = N - N % 8;
    for (int64_t b = 0; b < bn; b++) {
        const float *hb = h + b * H;
        float *gb = g + b * ldg;
        for (int64_t j0 = 0; j0 < nfull; j0 += BLOCK256) {
            int nv = (int)((nfull - j0 < BLOCK256 ? nfull - j0 : BLOCK256) / 8);
            __m256 acc[8];
            for (int u = 0; u < 8; u++)
                acc[u] = _mm256_setzero_ps();
            const float *rt = RT + j0;
            if (nv == 8) {
                for (int64_t k = 0; k < H; k++, rt += ldr) {
                    __m256 hk = _mm256_set1_ps(hb[k]);
                    for (int u = 0; u < 8; u++)
                        acc[u] = _mm256_fmadd_ps(_mm256_loadu_ps(rt + 8 * u), hk, acc[u]);
                }
            } else {
                for (int64_t k = 0; k < H; k++, rt += ldr) {
                    __m256 hk = _mm256_set1_ps(hb[k]);
                    for (int u = 0; u < nv; u++)
                        acc[u] = _mm256_fmadd_ps(_mm256_loadu_ps(rt + 8 * u), hk, acc[u]);
                }
            }
            for (int u = 0; u < nv; u++)
                _mm256_storeu_ps(gb + j0 + 8 * u, acc[u]);
        }
        for (int64_t j = nfull; j < N; j++) { /* the last N % 8 columns */
            float s = 0.0f;
            for (int64_t k = 0; k < H; k++)
                s = fmaf(hb[k], RT[k * ldr + j], s);
            gb[j] = s;
        }
    }
}
#endif

bool kiln__cpu_rnn_dot_ok(const kiln__cpu_ctx *ctx)
{
#if defined(__x86_64__)
    return ctx->k == &kiln__cpu_kernels_avx512 || ctx->k == &kiln__cpu_kernels_avx2;
#else
    (void)ctx;
    return false;
#endif
}

void kiln__cpu_rnn_pack(const float *R, int64_t N, int64_t H, float *RT)
{
    for (int64_t j0 = 0; j0 < N; j0 += 16)
        for (int64_t k0 = 0; k0 < H; k0 += 16) {
            int64_t j1 = j0 + 16 < N ? j0 + 16 : N, k1 = k0 + 16 < H ? k0 + 16 : H;
            for (int64_t j = j0; j < j1; j++)
                for (int64_t k = k0; k < k1; k++)
                    RT[k * N + j] = R[j * H + k];
        }
}

void kiln__cpu_rnn_dot(const kiln__cpu_ctx *ctx, const float *RT, int64_t ldr, int64_t N, int64_t H, const float *h,
                       int64_t bn, float *g, int64_t ldg)
{
#if defined(__x86_64__)
    if (ctx->k == &kiln__cpu_kernels_avx512)
        bcast_avx512(RT, ldr, N, H, h, bn, g, ldg);
    else
        bcast_avx2(RT, ldr, N, H, h, bn, g, ldg);
#else
    (void)ctx, (void)RT, (void)ldr, (void)N, (void)H, (void)h, (void)bn, (void)g, (void)ldg;
#endif
}
