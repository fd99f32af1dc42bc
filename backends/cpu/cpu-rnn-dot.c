/*
 * backends/cpu/cpu-rnn-dot.c — the recurrent product of a fused LSTM/GRU step for a few
 * batch rows: g[b][j] = h[b] · R[j] for every gate row j of R ([N, H] as ONNX stores it).
 *
 * At batch 1 this is a matrix-vector product that reads all of R every step, so it runs
 * at the speed R streams from the caches. OpenBLAS's sgemv (its AVX2 kernel, through the
 * generic interface) and a dot product per row (sixteen rows side by side, each reduced
 * across its lanes at the end) both reached about a third of that. So R is transposed once
 * per layer into column panels (kiln__cpu_rnn_pack) and each step reads a panel row after
 * row in k: g[j..j+63] += h[k] · Rᵀ[k][j..j+63], vector accumulators, no reductions, one
 * broadcast per k. Built with per-function target attributes and chosen by the kernel
 * table the device picked (KILN_CPU_KERNELS caps it), so libkiln still runs on any
 * x86-64; elsewhere the caller uses BLAS.
 */
#include "cpu-impl.h"

#if defined(__x86_64__)
#include <immintrin.h>

/* Rᵀ and Wᵀ are kept in column panels (kiln__cpu_rnn_pack): panel p holds columns
 * [64p, 64p + 64) of the transpose, K rows of 64 floats one after the other, the columns past
 * N zero. A kernel walking down a panel reads one contiguous 256-byte row per k. (Read
 * straight out of an [K, N] transpose, those rows were N floats apart: at N = 2048 every
 * row of a block fell into the same few cache sets, so a 128 KiB block that should have
 * stayed in L2 while the batch rows passed over it was mostly evicted before its reuse.) */
#define PANEL RNN_PANEL

/* out[0 .. n) of one row over one panel pair, the accumulators in registers. np is 1 or 2
 * (a constant after inlining); the tail of a panel past n is computed on its zeros and not
 * stored. */
__attribute__((target("avx512f"), always_inline)) static inline void row_panels_avx512(const float *p0,
                                                                                       const float *p1, int64_t K,
                                                                                       const float *hb, float *out,
                                                                                       int64_t n, int np)
{
    __m512 a[8];
    for (int u = 0; u < 8; u++)
        a[u] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++, p0 += PANEL, p1 += PANEL) {
        __m512 hk = _mm512_set1_ps(hb[k]);
        for (int u = 0; u < 4; u++)
            a[u] = _mm512_fmadd_ps(_mm512_loadu_ps(p0 + 16 * u), hk, a[u]);
        if (np == 2)
            for (int u = 0; u < 4; u++)
                a[4 + u] = _mm512_fmadd_ps(_mm512_loadu_ps(p1 + 16 * u), hk, a[4 + u]);
    }
    for (int u = 0; u < 4 * np; u++) {
        int64_t left = n - 16 * u;
        if (left <= 0)
            break;
        __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        _mm512_mask_storeu_ps(out + 16 * u, m, a[u]);
    }
}

__attribute__((target("avx512f"))) static void bcast_avx512(const float *P, int64_t N, int64_t K, const float *h,
                                                            int64_t ldh, int64_t bn, float *g, int64_t ldg)
{
    int64_t npan = (N + PANEL - 1) / PANEL;
    for (int64_t b = 0; b < bn; b++) {
        const float *hb = h + b * ldh;
        float *gb = g + b * ldg;
        int64_t p = 0;
        for (; p + 2 <= npan; p += 2) /* two panels: eight independent accumulators */
            row_panels_avx512(P + p * PANEL * K, P + (p + 1) * PANEL * K, K, hb, gb + p * PANEL,
                              N - p * PANEL < 2 * PANEL ? N - p * PANEL : 2 * PANEL, 2);
        if (p < npan)
            row_panels_avx512(P + p * PANEL * K, P + p * PANEL * K, K, hb, gb + p * PANEL, N - p * PANEL, 1);
    }
}

/* Rows four at a time against one panel: sixteen accumulators, the panel read once per four
 * rows, so a projection of many rows (x·Wᵀ) runs near the FMA units' rate. init, when
 * given, is a row of N values every output row starts from (the biases). Columns past N
 * are not stored. */
__attribute__((target("avx512f"))) static void bcast4_avx512(const float *P, int64_t N, int64_t K, const float *h,
                                                             int64_t ldh, int64_t bn, float *g, int64_t ldg,
                                                             const float *init)
{
    int64_t b4 = bn - bn % 4;
    /* panels outside, rows inside: a panel (K x 64) stays in L2 while every row passes
     * over it, so Rᵀ streams from memory once per call however many rows */
    for (int64_t j0 = 0; j0 < N; j0 += PANEL) {
        const float *panel = P + j0 * K;
        int64_t nj = N - j0;
        __mmask16 m0 = nj >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nj) - 1);
        __mmask16 m1 = nj >= 32 ? (__mmask16)0xFFFF : nj > 16 ? (__mmask16)((1u << (nj - 16)) - 1) : 0;
        __mmask16 m2 = nj >= 48 ? (__mmask16)0xFFFF : nj > 32 ? (__mmask16)((1u << (nj - 32)) - 1) : 0;
        __mmask16 m3 = nj >= 64 ? (__mmask16)0xFFFF : nj > 48 ? (__mmask16)((1u << (nj - 48)) - 1) : 0;
        __m512 i0 = _mm512_setzero_ps(), i1 = i0, i2 = i0, i3 = i0;
        if (init) {
            i0 = _mm512_maskz_loadu_ps(m0, init + j0);
            i1 = _mm512_maskz_loadu_ps(m1, init + j0 + 16);
            i2 = _mm512_maskz_loadu_ps(m2, init + j0 + 32);
            i3 = _mm512_maskz_loadu_ps(m3, init + j0 + 48);
        }
        for (int64_t b = 0; b < b4; b += 4) {
            const float *h0 = h + b * ldh, *h1 = h0 + ldh, *h2 = h1 + ldh, *h3 = h2 + ldh;
            __m512 a00 = i0, a01 = i1, a02 = i2, a03 = i3, a10 = i0, a11 = i1, a12 = i2, a13 = i3;
            __m512 a20 = i0, a21 = i1, a22 = i2, a23 = i3, a30 = i0, a31 = i1, a32 = i2, a33 = i3;
            const float *rt = panel;
            for (int64_t k = 0; k < K; k++, rt += PANEL) {
                __m512 w0 = _mm512_loadu_ps(rt), w1 = _mm512_loadu_ps(rt + 16);
                __m512 w2 = _mm512_loadu_ps(rt + 32), w3 = _mm512_loadu_ps(rt + 48);
                __m512 x = _mm512_set1_ps(h0[k]);
                a00 = _mm512_fmadd_ps(w0, x, a00), a01 = _mm512_fmadd_ps(w1, x, a01);
                a02 = _mm512_fmadd_ps(w2, x, a02), a03 = _mm512_fmadd_ps(w3, x, a03);
                x = _mm512_set1_ps(h1[k]);
                a10 = _mm512_fmadd_ps(w0, x, a10), a11 = _mm512_fmadd_ps(w1, x, a11);
                a12 = _mm512_fmadd_ps(w2, x, a12), a13 = _mm512_fmadd_ps(w3, x, a13);
                x = _mm512_set1_ps(h2[k]);
                a20 = _mm512_fmadd_ps(w0, x, a20), a21 = _mm512_fmadd_ps(w1, x, a21);
                a22 = _mm512_fmadd_ps(w2, x, a22), a23 = _mm512_fmadd_ps(w3, x, a23);
                x = _mm512_set1_ps(h3[k]);
                a30 = _mm512_fmadd_ps(w0, x, a30), a31 = _mm512_fmadd_ps(w1, x, a31);
                a32 = _mm512_fmadd_ps(w2, x, a32), a33 = _mm512_fmadd_ps(w3, x, a33);
            }
            float *o = g + b * ldg + j0;
            _mm512_mask_storeu_ps(o, m0, a00), _mm512_mask_storeu_ps(o + 16, m1, a01);
            _mm512_mask_storeu_ps(o + 32, m2, a02), _mm512_mask_storeu_ps(o + 48, m3, a03);
            o += ldg;
            _mm512_mask_storeu_ps(o, m0, a10), _mm512_mask_storeu_ps(o + 16, m1, a11);
            _mm512_mask_storeu_ps(o + 32, m2, a12), _mm512_mask_storeu_ps(o + 48, m3, a13);
            o += ldg;
            _mm512_mask_storeu_ps(o, m0, a20), _mm512_mask_storeu_ps(o + 16, m1, a21);
            _mm512_mask_storeu_ps(o + 32, m2, a22), _mm512_mask_storeu_ps(o + 48, m3, a23);
            o += ldg;
            _mm512_mask_storeu_ps(o, m0, a30), _mm512_mask_storeu_ps(o + 16, m1, a31);
            _mm512_mask_storeu_ps(o + 32, m2, a32), _mm512_mask_storeu_ps(o + 48, m3, a33);
        }
    }
    for (int64_t b = b4; b < bn; b++) { /* the last rows one at a time */
        bcast_avx512(P, N, K, h + b * ldh, ldh, 1, g + b * ldg, ldg);
        if (init)
            for (int64_t j = 0; j < N; j++)
                g[b * ldg + j] += init[j];
    }
}

/* An 8x8 block of R into Rᵀ with the usual unpack / shuffle / lane-swap sequence. */
__attribute__((target("avx2,fma"))) static void transpose8_avx2(const float *src, int64_t lds, float *dst,
                                                               int64_t ldd)
{
    __m256 r[8], t[8], s[8];
    for (int i = 0; i < 8; i++)
        r[i] = _mm256_loadu_ps(src + i * lds);
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        s[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        s[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        s[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        s[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(s[i], s[i + 4], 0x20));
        _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(s[i], s[i + 4], 0x31));
    }
}

__attribute__((target("avx2,fma"))) static void bcast_avx2(const float *P, int64_t N, int64_t K, const float *h,
                                                           int64_t ldh, int64_t bn, float *g, int64_t ldg)
{
    for (int64_t b = 0; b < bn; b++) {
        const float *hb = h + b * ldh;
        float *gb = g + b * ldg;
        for (int64_t j0 = 0; j0 < N; j0 += PANEL) {
            __m256 acc[8];
            for (int u = 0; u < 8; u++)
                acc[u] = _mm256_setzero_ps();
            const float *rt = P + j0 * K;
            for (int64_t k = 0; k < K; k++, rt += PANEL) {
                __m256 hk = _mm256_set1_ps(hb[k]);
                for (int u = 0; u < 8; u++)
                    acc[u] = _mm256_fmadd_ps(_mm256_loadu_ps(rt + 8 * u), hk, acc[u]);
            }
            if (N - j0 >= PANEL) {
                for (int u = 0; u < 8; u++)
                    _mm256_storeu_ps(gb + j0 + 8 * u, acc[u]);
            } else { /* the last panel's columns past N are zeros of the padding */
                float last[PANEL];
                for (int u = 0; u < 8; u++)
                    _mm256_storeu_ps(last + 8 * u, acc[u]);
                memcpy(gb + j0, last, (size_t)(N - j0) * sizeof *last);
            }
        }
    }
}
#endif

bool kiln__cpu_rnn_dot_ok(const kiln__cpu_ctx *ctx, int64_t rows)
{
#if defined(__x86_64__)
    /* AVX2 has the one-row kernel only: from a few rows on, OpenBLAS's own does better */
    return ctx->k == &kiln__cpu_kernels_avx512 || (ctx->k == &kiln__cpu_kernels_avx2 && rows <= 4);
#else
    (void)ctx, (void)rows;
    return false;
#endif
}

int64_t kiln__cpu_rnn_panels_size(int64_t N, int64_t K)
{
    return (N + PANEL - 1) / PANEL * PANEL * K;
}

void kiln__cpu_rnn_pack(const kiln__cpu_ctx *ctx, const float *R, int64_t N, int64_t K, float *P)
{
    int64_t npan = (N + PANEL - 1) / PANEL;
    for (int64_t p = 0; p < npan; p++) {
        float *panel = P + p * PANEL * K;
        int64_t c0 = p * PANEL, nc = N - c0 < PANEL ? N - c0 : PANEL, c8 = 0, k8 = 0;
#if defined(__x86_64__)
        if (ctx->k == &kiln__cpu_kernels_avx512 || ctx->k == &kiln__cpu_kernels_avx2) {
            /* whole 8x8 blocks with vectors, along the panel's rows so each of its cache
             * lines is written whole while it is hot; the edges below */
            c8 = nc - nc % 8, k8 = K - K % 8;
            for (int64_t k0 = 0; k0 < k8; k0 += 8)
                for (int64_t j = 0; j < c8; j += 8)
                    transpose8_avx2(R + (c0 + j) * K + k0, K, panel + k0 * PANEL + j, PANEL);
        }
#else
        (void)ctx;
#endif
        for (int64_t k = 0; k < K; k++) {
            float *row = panel + k * PANEL;
            for (int64_t j = k < k8 ? c8 : 0; j < nc; j++)
                row[j] = R[(c0 + j) * K + k];
            for (int64_t j = nc; j < PANEL; j++)
                row[j] = 0.0f;
        }
    }
}

bool kiln__cpu_rnn_project_ok(const kiln__cpu_ctx *ctx)
{
#if defined(__x86_64__)
    return ctx->k == &kiln__cpu_kernels_avx512;
#else
    (void)ctx;
    return false;
#endif
}

void kiln__cpu_rnn_project(const kiln__cpu_ctx *ctx, const float *WP, int64_t N, int64_t K, const float *x,
                           int64_t M, float *out, int64_t ldo, const float *init)
{
#if defined(__x86_64__)
    bcast4_avx512(WP, N, K, x, K, M, out, ldo, init);
#endif
    (void)ctx, (void)WP, (void)N, (void)K, (void)x, (void)M, (void)out, (void)ldo, (void)init;
}

void kiln__cpu_rnn_dot(const kiln__cpu_ctx *ctx, const float *P, int64_t N, int64_t K, const float *h, int64_t ldh,
                       int64_t bn, float *g, int64_t ldg)
{
#if defined(__x86_64__)
    if (ctx->k == &kiln__cpu_kernels_avx512 && bn >= 4)
        bcast4_avx512(P, N, K, h, ldh, bn, g, ldg, NULL);
    else if (ctx->k == &kiln__cpu_kernels_avx512)
        bcast_avx512(P, N, K, h, ldh, bn, g, ldg);
    else
        bcast_avx2(P, N, K, h, ldh, bn, g, ldg);
#else
    (void)ctx, (void)P, (void)N, (void)K, (void)h, (void)ldh, (void)bn, (void)g, (void)ldg;
#endif
}
