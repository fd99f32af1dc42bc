/*
 * backends/cpu/cpu-kernels.c — the hot f32 kernels, compiled twice.
 *
 * meson builds this file once for any x86-64 (or other) CPU, once with
 * -mavx2 -mfma -mf16c and, on x86-64, once more with AVX-512 (F/DQ/BW/VL) on top; the
 * device picks a table at open with __builtin_cpu_supports, so the library still runs
 * on older CPUs. The portable build relies on libm and the compiler's auto-vectorizer;
 * the AVX2 build adds hand-vectorized transcendental functions (cpu-math.h) for the ops
 * that dominate networks — exp, tanh, erf, gelu, sigmoid, silu — and F16C conversions.
 * The AVX-512 build keeps every AVX2 path and replaces the heavy ones (those
 * transcendentals, softmax and layer-norm rows) with 16-wide forms (cpu-math512.h), and
 * adds the direct stride-1 convolution tile kernel (conv_tile_f32) at 8 channels × 48
 * positions; the AVX2 build has a 4 × 24 one, the portable build none.
 *
 * The convolution kernels live in cpu-kernels-conv.inc and the softmax and layer-norm row
 * kernels in cpu-kernels-rows.inc, which this file includes so that they are built in
 * each of the three forms and land in the same table.
 *
 * Each kernel switches on the op once, outside its loop, and runs a loop over plain
 * restrict pointers that the compiler can vectorize. Results follow PyTorch: NaN
 * propagates through max/min and clamp, remainder takes the divisor's sign, round is
 * half to even.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu-impl.h"

#if defined(KILN_CPU_AVX512) && defined(__AVX512F__) && defined(__AVX512DQ__) && \
    defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX2__) && defined(__FMA__)
#define USE_AVX2 1
#define USE_AVX512 1
#include "cpu-math.h"
#include "cpu-math512.h"
#define KTABLE kiln__cpu_kernels_avx512
#define KNAME "avx512"
#define KSTREAM 16 /* floats per non-temporal store */
#elif defined(KILN_CPU_AVX2) && defined(__AVX2__) && defined(__FMA__)
#define USE_AVX2 1
#define USE_AVX512 0
#include "cpu-math.h"
#define KTABLE kiln__cpu_kernels_avx2
#define KNAME "avx2"
#define KSTREAM 8
#else
#define USE_AVX2 0
#define USE_AVX512 0
#define KTABLE kiln__cpu_kernels_base
#define KNAME "base"
#define KSTREAM 4 /* SSE2 on x86-64; elsewhere the fused stores copy plainly */
#endif

/* ------------------------------------------------------------------ scalar forms */

#if !USE_AVX2 /* the vector builds have their own gelu */
static inline float s_gelu(float x)
{
    double v = x;
    return (float)(0.5 * v * erfc(-v * 0.70710678118654752440));
}

static inline float s_gelu_tanh(float x)
{
    double v = x;
    double u = 0.79788456080286535588 * (v + 0.044715 * v * v * v);
    return (float)(0.5 * v * (1.0 + tanh(u)));
}
#endif

static inline float s_remainder(float a, float b)
{
    float r = fmodf(a, b);
    if (r != 0 && ((r < 0) != (b < 0)))
        r += b;
    return r;
}

static inline float s_softplus(float x, float beta, float thr)
{
    float bx = x * beta;
    return bx > thr ? x : log1pf(expf(bx)) / beta;
}

/* ------------------------------------------------------------------ unary */

#if USE_AVX2
/* Apply an 8-wide function over n floats, finishing the tail through a padded block. */
#define VLOOP(FN)                                                            \
    do {                                                                     \
        int64_t i = 0;                                                       \
        for (; i + 8 <= n; i += 8)                                           \
            _mm256_storeu_ps(o + i, FN(_mm256_loadu_ps(x + i)));             \
        if (i < n) {                                                         \
            float t[8] = {0};                                                \
            for (int64_t k = 0; k < n - i; k++)                              \
                t[k] = x[i + k];                                             \
            _mm256_storeu_ps(t, FN(_mm256_loadu_ps(t)));                     \
            for (int64_t k = 0; k < n - i; k++)                              \
                o[i + k] = t[k];                                             \
        }                                                                    \
    } while (0)

#if !USE_AVX512
static inline __m256 kv_silu(__m256 x) { return _mm256_mul_ps(x, kv_sigmoid(x)); }
#endif
#endif

#if USE_AVX512
/* The 16-wide form: the tail is one masked load and store (masked-off lanes read as 0,
 * which every function maps to something finite, and are never written). Plain stores
 * on purpose: streaming stores made a 64 MiB gelu twice as slow on an AVX-512 server,
 * where the output otherwise stays in its large L3 from one use to the next. */
#define ZLOOP(FN)                                                                   \
    do {                                                                            \
        int64_t i = 0;                                                              \
        for (; i + 16 <= n; i += 16)                                                \
            _mm512_storeu_ps(o + i, FN(_mm512_loadu_ps(x + i)));                    \
        if (i < n) {                                                                \
            __mmask16 m = (__mmask16)((1u << (n - i)) - 1);                         \
            _mm512_mask_storeu_ps(o + i, m, FN(_mm512_maskz_loadu_ps(m, x + i)));   \
        }                                                                           \
    } while (0)
#endif

#define ULOOP(EXPR)                               \
    for (int64_t i = 0; i < n; i++) {             \
        float v = x[i];                           \
        o[i] = (EXPR);                            \
    }                                             \
    break

static void unary_f32(int op, float *restrict o, const float *restrict x, int64_t n, float a,
                      float b)
{
    switch ((kiln_unary_op)op) {
    case KILN_UNARY_NEG: ULOOP(-v);
    case KILN_UNARY_ABS: ULOOP(fabsf(v));
    case KILN_UNARY_SIGN: ULOOP(v > 0 ? 1.0f : (v < 0 ? -1.0f : 0.0f)); /* NaN gives 0 */
    case KILN_UNARY_LOG: ULOOP(logf(v));
    case KILN_UNARY_LOG1P: ULOOP(log1pf(v));
    case KILN_UNARY_EXPM1: ULOOP(expm1f(v));
    case KILN_UNARY_SQRT: ULOOP(sqrtf(v));
    case KILN_UNARY_RSQRT: ULOOP((float)(1.0 / sqrt((double)v)));
    case KILN_UNARY_SQUARE: ULOOP(v * v);
    case KILN_UNARY_RECIPROCAL: ULOOP(1.0f / v);
    case KILN_UNARY_SIN: ULOOP(sinf(v));
    case KILN_UNARY_COS: ULOOP(cosf(v));
    case KILN_UNARY_RELU: ULOOP(v < 0 ? 0.0f : v);
    case KILN_UNARY_LEAKY_RELU: ULOOP(v < 0 ? v * a : v);
    case KILN_UNARY_ELU: ULOOP(v > 0 ? v : a * expm1f(v));
    case KILN_UNARY_SOFTPLUS: ULOOP(s_softplus(v, a, b));
    case KILN_UNARY_FLOOR: ULOOP(floorf(v));
    case KILN_UNARY_CEIL: ULOOP(ceilf(v));
    case KILN_UNARY_ROUND: ULOOP(nearbyintf(v));
    case KILN_UNARY_CLAMP: ULOOP(v != v ? v : (v < a ? (a > b ? b : a) : (v > b ? b : v)));
    case KILN_UNARY_POW_SCALAR:
        if (a == 2.0f) {
            ULOOP(v * v);
        } else if (a == 1.0f) {
            ULOOP(v);
        } else if (a == 0.5f) { /* as PyTorch: sqrt and rsqrt, not pow (-inf, -0 differ) */
            ULOOP(sqrtf(v));
        } else if (a == -0.5f) {
            ULOOP((float)(1.0 / sqrt((double)v)));
        } else {
            ULOOP(powf(v, a));
        }
    case KILN_UNARY_ADD_SCALAR: ULOOP(v + a);
    case KILN_UNARY_MUL_SCALAR: ULOOP(v * a);
#if USE_AVX512
    case KILN_UNARY_EXP: ZLOOP(kz_exp); break;
    case KILN_UNARY_TANH: ZLOOP(kz_tanh); break;
    case KILN_UNARY_SIGMOID: ZLOOP(kz_sigmoid); break;
    case KILN_UNARY_GELU: ZLOOP(kz_gelu); break;
    case KILN_UNARY_GELU_TANH: ZLOOP(kz_gelu_tanh); break;
    case KILN_UNARY_SILU: ZLOOP(kz_silu); break;
    case KILN_UNARY_ERF: ZLOOP(kz_erf); break;
#elif USE_AVX2
    case KILN_UNARY_EXP: VLOOP(kv_exp); break;
    case KILN_UNARY_TANH: VLOOP(kv_tanh); break;
    case KILN_UNARY_SIGMOID: VLOOP(kv_sigmoid); break;
    case KILN_UNARY_GELU: VLOOP(kv_gelu); break;
    case KILN_UNARY_GELU_TANH: VLOOP(kv_gelu_tanh); break;
    case KILN_UNARY_SILU: VLOOP(kv_silu); break;
    case KILN_UNARY_ERF: VLOOP(kv_erf); break;
#else
    case KILN_UNARY_EXP: ULOOP(expf(v));
    case KILN_UNARY_TANH: ULOOP(tanhf(v));
    case KILN_UNARY_SIGMOID: ULOOP((float)(1.0 / (1.0 + exp(-(double)v))));
    case KILN_UNARY_GELU: ULOOP(s_gelu(v));
    case KILN_UNARY_GELU_TANH: ULOOP(s_gelu_tanh(v));
    case KILN_UNARY_SILU: ULOOP((float)((double)v / (1.0 + exp(-(double)v))));
    case KILN_UNARY_ERF: ULOOP(erff(v));
#endif
    default: /* bool-valued ops never reach the f32 kernel */
        break;
    }
}

/* ------------------------------------------------------------------ binary */

/* One loop per stride pattern: both contiguous, a broadcast scalar on either side. */
#define BLOOP(EXPR)                                                                   \
    if (sa && sb) {                                                                   \
        for (int64_t i = 0; i < n; i++) { float x = a[i], y = b[i]; o[i] = (EXPR); }  \
    } else if (sa) {                                                                  \
        float y = b[0];                                                               \
        for (int64_t i = 0; i < n; i++) { float x = a[i]; o[i] = (EXPR); }           \
    } else if (sb) {                                                                  \
        float x = a[0];                                                               \
        for (int64_t i = 0; i < n; i++) { float y = b[i]; o[i] = (EXPR); }           \
    } else {                                                                          \
        float x = a[0], y = b[0], r = (EXPR);                                         \
        for (int64_t i = 0; i < n; i++) o[i] = r;                                     \
    }                                                                                 \
    break

#if USE_AVX2
/* Outputs far larger than the caches are written with streaming stores: a normal store
 * first reads the line it writes (read-for-ownership), so a + b -> o moves four bytes
 * per three touched; streaming cuts a memory-bound op's traffic by a quarter. Only for
 * runs of 8 MiB and more, where the result would not stay in cache anyway. */
#define STREAM_MIN ((int64_t)1 << 21)
#define SLOOP(VEXPR, SEXPR)                                                        \
    do {                                                                           \
        int64_t i = 0;                                                             \
        for (; i < n && ((uintptr_t)(o + i) & 31); i++) {                         \
            float x = a[i], y = b[i];                                              \
            o[i] = (SEXPR);                                                        \
        }                                                                          \
        for (; i + 8 <= n; i += 8) {                                               \
            __m256 x = _mm256_loadu_ps(a + i), y = _mm256_loadu_ps(b + i);         \
            _mm256_stream_ps(o + i, (VEXPR));                                      \
        }                                                                          \
        for (; i < n; i++) {                                                       \
            float x = a[i], y = b[i];                                              \
            o[i] = (SEXPR);                                                        \
        }                                                                          \
        _mm_sfence();                                                              \
    } while (0)

static bool binary_stream(int op, float *o, const float *a,
                          const float *b, int64_t n)
{
    if (n < STREAM_MIN)
        return false;
    switch ((kiln_binary_op)op) {
    case KILN_BINARY_ADD: SLOOP(_mm256_add_ps(x, y), x + y); return true;
    case KILN_BINARY_SUB: SLOOP(_mm256_sub_ps(x, y), x - y); return true;
    case KILN_BINARY_MUL: SLOOP(_mm256_mul_ps(x, y), x * y); return true;
    case KILN_BINARY_DIV: SLOOP(_mm256_div_ps(x, y), x / y); return true;
    default: return false;
    }
}
#endif

/* o may be a or b exactly (backend.h): no restrict, and the vectorizer's overlap checks
 * accept a distance of zero, so an in-place update keeps the vector loops. */
static void binary_f32(int op, float *o, const float *a, int64_t sa, const float *b, int64_t sb, int64_t n)
{
#if USE_AVX2
    if (sa && sb && binary_stream(op, o, a, b, n))
        return;
#endif
    switch ((kiln_binary_op)op) {
    case KILN_BINARY_ADD: BLOOP(x + y);
    case KILN_BINARY_SUB: BLOOP(x - y);
    case KILN_BINARY_MUL: BLOOP(x * y);
    case KILN_BINARY_DIV: BLOOP(x / y);
    case KILN_BINARY_REMAINDER: BLOOP(s_remainder(x, y));
    case KILN_BINARY_POW: BLOOP(powf(x, y));
    /* of equal operands the first, as ref and std::max: maximum(+0, -0) is +0 */
    case KILN_BINARY_MAXIMUM: BLOOP((x != x || y != y) ? x + y : (x < y ? y : x));
    case KILN_BINARY_MINIMUM: BLOOP((x != x || y != y) ? x + y : (y < x ? y : x));
    default:
        break;
    }
}

/* ------------------------------------------------------------------ half precision */

static void f16_to_f32(float *restrict o, const uint16_t *restrict x, int64_t n)
{
    int64_t i = 0;
#if USE_AVX2
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(o + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
#endif
    for (; i < n; i++)
        o[i] = kiln_f16_to_f32(x[i]);
}

static void f32_to_f16(uint16_t *restrict o, const float *restrict x, int64_t n)
{
    int64_t i = 0;
#if USE_AVX2
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        /* F16C keeps NaN payloads; write the canonical quiet NaN as the portable path does */
        __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) {
            uint16_t t[8];
            _mm_storeu_si128((__m128i *)t, h);
            for (int k = 0; k < 8; k++)
                if (x[i + k] != x[i + k])
                    t[k] = kiln_f32_to_f16(x[i + k]);
            h = _mm_loadu_si128((const __m128i *)t);
        }
        _mm_storeu_si128((__m128i *)(o + i), h);
    }
#endif
    for (; i < n; i++)
        o[i] = kiln_f32_to_f16(x[i]);
}

#include "cpu-kernels-rows.inc"
#include "cpu-kernels-select.inc"

/* ------------------------------------------------------------------ max pool 2x2 */

static inline float s_max_nan(float m, float v)
{
    return (v > m || v != v) ? v : m;
}

static void maxpool2x2_row_f32(float *restrict o, const float *restrict r0,
                               const float *restrict r1, int64_t ow)
{
    int64_t j = 0;
#if USE_AVX2
    for (; j + 8 <= ow; j += 8) {
        __m256 a0 = _mm256_loadu_ps(r0 + 2 * j), a1 = _mm256_loadu_ps(r0 + 2 * j + 8);
        __m256 b0 = _mm256_loadu_ps(r1 + 2 * j), b1 = _mm256_loadu_ps(r1 + 2 * j + 8);
        __m256 v0 = kv_max_nan(a0, b0), v1 = kv_max_nan(a1, b1);
        __m256 ev = _mm256_shuffle_ps(v0, v1, _MM_SHUFFLE(2, 0, 2, 0));
        __m256 od = _mm256_shuffle_ps(v0, v1, _MM_SHUFFLE(3, 1, 3, 1));
        __m256 m = kv_max_nan(ev, od);
        m = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(m), _MM_SHUFFLE(3, 1, 2, 0)));
        _mm256_storeu_ps(o + j, m);
    }
#endif
    for (; j < ow; j++) {
        float m = r0[2 * j];
        m = s_max_nan(m, r0[2 * j + 1]);
        m = s_max_nan(m, r1[2 * j]);
        m = s_max_nan(m, r1[2 * j + 1]);
        o[j] = m;
    }
}

/* The rule of the generic pooling loop for one window when it returns indices: the first
 * maximum wins, a NaN wins and a later NaN replaces it. */
static inline void mp2_take(float v, int64_t i, float *best, int64_t *bi)
{
    if (v > *best || v != v) {
        if (*best == *best || v != v) {
            *best = v;
            *bi = i;
        }
    }
}

/* One window: without a NaN (the common case, written without branches since which of the
 * four wins is unpredictable on real activations) the max, then the first position equal
 * to it; with one, the exact rule. */
static inline void maxpool2x2_idx_one(float *o, int64_t *ix, const float *r0, const float *r1, int64_t j,
                                      int64_t base, int64_t w)
{
    float v[4] = {r0[2 * j], r0[2 * j + 1], r1[2 * j], r1[2 * j + 1]};
    float sum = (v[0] + v[1]) + (v[2] + v[3]);
    if (__builtin_expect(sum != sum, 0)) { /* a NaN (or inf - inf): the exact rule */
        float best = v[0];
        int64_t bi = base + 2 * j;
        mp2_take(v[1], base + 2 * j + 1, &best, &bi);
        mp2_take(v[2], base + 2 * j + w, &best, &bi);
        mp2_take(v[3], base + 2 * j + w + 1, &best, &bi);
        o[j] = best;
        ix[j] = bi;
        return;
    }
    float m01 = v[1] > v[0] ? v[1] : v[0], m23 = v[3] > v[2] ? v[3] : v[2];
    float m = m23 > m01 ? m23 : m01;
    int n0 = v[0] != m, n1 = v[1] != m, n2 = v[2] != m;
    int k = n0 * (1 + n1 * (1 + n2));
    o[j] = v[k]; /* v[k] == m; taken from v so a +0/-0 tie keeps the first's sign */
    ix[j] = base + 2 * j + (k & 1) + (k >> 1) * w;
}

/* The same with the flat in-plane index of each maximum (training keeps them for the
 * backward): windows (r0[2j], r0[2j+1], r1[2j], r1[2j+1]) at indices base + 2j + {0, 1, w,
 * w + 1}. Eight windows per vector where none holds a NaN (max then the first position
 * equal to it, which is the rule without NaNs; the value is taken from that position, so
 * a +0/-0 tie keeps the first's sign); a vector with a NaN takes the exact rule window by
 * window. */
static void maxpool2x2_idx_row_f32(float *restrict o, int64_t *restrict ix, const float *restrict r0,
                                   const float *restrict r1, int64_t ow, int64_t base, int64_t w)
{
    int64_t j = 0;
#if USE_AVX2
    const __m256i lanes2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const __m256i one = _mm256_set1_epi32(1), wv = _mm256_set1_epi32((int)w), w1 = _mm256_set1_epi32((int)w + 1);
    for (; j + 8 <= ow && w < INT32_MAX; j += 8) {
        __m256 a0 = _mm256_loadu_ps(r0 + 2 * j), a1 = _mm256_loadu_ps(r0 + 2 * j + 8);
        __m256 b0 = _mm256_loadu_ps(r1 + 2 * j), b1 = _mm256_loadu_ps(r1 + 2 * j + 8);
        /* even and odd columns, in window order after the 64-bit lane permute */
        __m256 v0 = _mm256_shuffle_ps(a0, a1, _MM_SHUFFLE(2, 0, 2, 0));
        __m256 v1 = _mm256_shuffle_ps(a0, a1, _MM_SHUFFLE(3, 1, 3, 1));
        __m256 v2 = _mm256_shuffle_ps(b0, b1, _MM_SHUFFLE(2, 0, 2, 0));
        __m256 v3 = _mm256_shuffle_ps(b0, b1, _MM_SHUFFLE(3, 1, 3, 1));
#define KV_ORDER(v) _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(v), _MM_SHUFFLE(3, 1, 2, 0)))
        v0 = KV_ORDER(v0);
        v1 = KV_ORDER(v1);
        v2 = KV_ORDER(v2);
        v3 = KV_ORDER(v3);
#undef KV_ORDER
        __m256 sum = _mm256_add_ps(_mm256_add_ps(v0, v1), _mm256_add_ps(v2, v3));
        if (_mm256_movemask_ps(_mm256_cmp_ps(sum, sum, _CMP_UNORD_Q))) { /* a NaN (or inf - inf) */
            for (int64_t t = j; t < j + 8; t++)
                maxpool2x2_idx_one(o, ix, r0, r1, t, base, w); /* which takes the exact rule */
            continue;
        }
        __m256 m01 = _mm256_blendv_ps(v0, v1, _mm256_cmp_ps(v1, v0, _CMP_GT_OQ));
        __m256 m23 = _mm256_blendv_ps(v2, v3, _mm256_cmp_ps(v3, v2, _CMP_GT_OQ));
        __m256 m = _mm256_blendv_ps(m01, m23, _mm256_cmp_ps(m23, m01, _CMP_GT_OQ));
        __m256 e1 = _mm256_cmp_ps(v0, m, _CMP_NEQ_OQ);                    /* not the first: k >= 1 */
        __m256 e2 = _mm256_and_ps(e1, _mm256_cmp_ps(v1, m, _CMP_NEQ_OQ)); /* k >= 2 */
        __m256 e3 = _mm256_and_ps(e2, _mm256_cmp_ps(v2, m, _CMP_NEQ_OQ)); /* k == 3 */
        __m256 y = _mm256_blendv_ps(_mm256_blendv_ps(_mm256_blendv_ps(v0, v1, e1), v2, e2), v3, e3);
        _mm256_storeu_ps(o + j, y);
        __m256i off = _mm256_blendv_epi8(_mm256_setzero_si256(), one, _mm256_castps_si256(e1));
        off = _mm256_blendv_epi8(off, wv, _mm256_castps_si256(e2));
        off = _mm256_blendv_epi8(off, w1, _mm256_castps_si256(e3));
        off = _mm256_add_epi32(off, lanes2); /* + 2 * (window - j) */
        __m256i start = _mm256_set1_epi64x(base + 2 * j);
        _mm256_storeu_si256((__m256i *)(ix + j),
                            _mm256_add_epi64(start, _mm256_cvtepi32_epi64(_mm256_castsi256_si128(off))));
        _mm256_storeu_si256((__m256i *)(ix + j + 4),
                            _mm256_add_epi64(start, _mm256_cvtepi32_epi64(_mm256_extracti128_si256(off, 1))));
    }
#endif
    for (; j < ow; j++)
        maxpool2x2_idx_one(o, ix, r0, r1, j, base, w);
}

/* The convolution kernels (direct and packed tiles, depthwise planes and channel lanes)
 * are compiled here, as part of this file, under the same flags. */
#include "cpu-kernels-conv.inc"

/* ------------------------------------------------------------------ fused epilogue */

/* Written as ternaries over restrict runs so each table's build vectorizes it for its
 * ISA; the rounding steps are those of the engine's separate ops (bias, then residual,
 * then the activation, hard_sigmoid's multiply and add rounded apart), so a fused graph
 * gives the bits the unfused one does. One loop per (activation, operands) case: for the
 * short runs the convolution tiles hand over (14 to 48 outputs), separate passes cost
 * more in loop overhead than in arithmetic. Sigmoid goes through the table's own
 * vectorized unary in chunks, via a copy, since unary_f32 must not see its output alias
 * its input. */
#define EPI_LOOP(EXPR)                                                                \
    do {                                                                              \
        if (res && bias)                                                              \
            for (int64_t i = 0; i < n; i++) {                                         \
                float v = (o[i] + bias[i]) + res[i];                                  \
                o[i] = (EXPR);                                                        \
            }                                                                         \
        else if (res)                                                                 \
            for (int64_t i = 0; i < n; i++) {                                         \
                float v = o[i] + res[i];                                              \
                o[i] = (EXPR);                                                        \
            }                                                                         \
        else if (bias)                                                                \
            for (int64_t i = 0; i < n; i++) {                                         \
                float v = o[i] + bias[i];                                             \
                o[i] = (EXPR);                                                        \
            }                                                                         \
        else                                                                          \
            for (int64_t i = 0; i < n; i++) {                                         \
                float v = o[i];                                                       \
                o[i] = (EXPR);                                                        \
            }                                                                         \
    } while (0)

static inline float epi_clamp01(float t) { return t != t ? t : (t < 0.0f ? 0.0f : (t > 1.0f ? 1.0f : t)); }

static void epilogue_f32(float *restrict o, const float *restrict res, const float *restrict bias, int64_t n,
                         int act, float a, float b)
{
    const float lo = a > b ? b : a;
    switch ((kiln_epilogue_act)act) {
    case KILN_EPI_RELU:
        EPI_LOOP(v < 0 ? 0.0f : v);
        break;
    case KILN_EPI_LEAKY_RELU:
        EPI_LOOP(v < 0 ? v * a : v);
        break;
    case KILN_EPI_CLAMP:
        EPI_LOOP(v != v ? v : (v < a ? lo : (v > b ? b : v)));
        break;
    case KILN_EPI_HARD_SIGMOID:
        EPI_LOOP(epi_clamp01((v * a) + b));
        break;
    case KILN_EPI_HARD_SWISH:
        EPI_LOOP(v * epi_clamp01((v * (1.0f / 6.0f)) + 0.5f));
        break;
    case KILN_EPI_SIGMOID: {
        EPI_LOOP(v);
        float tmp[256] __attribute__((aligned(64)));
        for (int64_t i = 0; i < n; i += 256) {
            int64_t m = n - i < 256 ? n - i : 256;
            memcpy(tmp, o + i, (size_t)m * sizeof(float));
            unary_f32(KILN_UNARY_SIGMOID, o + i, tmp, m, 0.0f, 0.0f);
        }
        break;
    }
    default:
        EPI_LOOP(v);
        break;
    }
}

/* A convolution's chain (kiln__cpu_chain) over rows: each value taken from src (plus
 * the row's bias), every op applied while it is in registers (16 lanes at a time), then
 * stored once. Every step rounds as the separate op does (C17's standard mode: the
 * compiler fuses no multiply and add). */
static void chain_rows_f32(float *o, int64_t ld, const float *src, int64_t sld, const float *bias, int rows,
                           int64_t n, const kiln__cpu_chain *c, int64_t at, int64_t plane)
{
    float one[KILN__CHAIN_MAX_OPS];
    for (int r = 0; r < rows; r++) {
        for (int k = 0; k < c->nops; k++)
            one[k] = c->ops[k].plane ? c->ops[k].plane[plane + r] : c->ops[k].scalar;
        const float *in = src + r * sld;
        float *out = o + r * ld;
        int64_t fo = at + r * ld;
#if USE_AVX512
        /* 64 values at a time in four registers, each op dispatched once for all four */
        const __m512 vb = _mm512_set1_ps(bias ? bias[r] : 0.0f), zero = _mm512_setzero_ps();
        for (int64_t i0 = 0; i0 < n; i0 += 64) {
            __mmask16 m[4];
            __m512 v[4];
            for (int q = 0; q < 4; q++) {
                int64_t left = n - i0 - 16 * q;
                m[q] = left >= 16 ? (__mmask16)0xffff : left > 0 ? tail_mask(left) : 0;
                v[q] = _mm512_maskz_loadu_ps(m[q], in + i0 + 16 * q);
                if (bias)
                    v[q] = _mm512_add_ps(v[q], vb);
            }
            for (int k = 0; k < c->nops; k++) {
                const kiln__cpu_chain_op *op = &c->ops[k];
                __m512 s[4];
                for (int q = 0; q < 4; q++)
                    s[q] = op->full ? _mm512_maskz_loadu_ps(m[q], op->full + fo + i0 + 16 * q)
                                    : _mm512_set1_ps(one[k]);
                switch ((kiln__cpu_chain_code)op->code) {
                case KILN__CHAIN_ADD:
                    for (int q = 0; q < 4; q++)
                        v[q] = _mm512_add_ps(v[q], s[q]);
                    break;
                case KILN__CHAIN_SUB:
                    for (int q = 0; q < 4; q++)
                        v[q] = _mm512_sub_ps(v[q], s[q]);
                    break;
                case KILN__CHAIN_RSUB:
                    for (int q = 0; q < 4; q++)
                        v[q] = _mm512_sub_ps(s[q], v[q]);
                    break;
                case KILN__CHAIN_MUL:
                    for (int q = 0; q < 4; q++)
                        v[q] = _mm512_mul_ps(v[q], s[q]);
                    break;
                case KILN__CHAIN_DIV:
                    for (int q = 0; q < 4; q++)
                        v[q] = _mm512_div_ps(v[q], s[q]);
                    break;
                case KILN__CHAIN_RDIV:
                    for (int q = 0; q < 4; q++)
                        v[q] = _mm512_div_ps(s[q], v[q]);
                    break;
                case KILN__CHAIN_RELU:
                    for (int q = 0; q < 4; q++)
                        v[q] = _mm512_mask_mov_ps(v[q], _mm512_cmp_ps_mask(v[q], zero, _CMP_LT_OQ), zero);
                    break;
                }
            }
            for (int q = 0; q < 4; q++)
                _mm512_mask_storeu_ps(out + i0 + 16 * q, m[q], v[q]);
        }
#else
        for (int64_t i0 = 0; i0 < n; i0 += 16) {
            int64_t m = n - i0 < 16 ? n - i0 : 16;
            float v[16];
            for (int64_t i = 0; i < m; i++)
                v[i] = bias ? in[i0 + i] + bias[r] : in[i0 + i];
            for (int k = 0; k < c->nops; k++) {
                const kiln__cpu_chain_op *op = &c->ops[k];
                const float *f = op->full ? op->full + fo + i0 : NULL;
                for (int64_t i = 0; i < m; i++) {
                    float s = f ? f[i] : one[k];
                    switch ((kiln__cpu_chain_code)op->code) {
                    case KILN__CHAIN_ADD: v[i] = v[i] + s; break;
                    case KILN__CHAIN_SUB: v[i] = v[i] - s; break;
                    case KILN__CHAIN_RSUB: v[i] = s - v[i]; break;
                    case KILN__CHAIN_MUL: v[i] = v[i] * s; break;
                    case KILN__CHAIN_DIV: v[i] = v[i] / s; break;
                    case KILN__CHAIN_RDIV: v[i] = s / v[i]; break;
                    case KILN__CHAIN_RELU: v[i] = v[i] < 0 ? 0.0f : v[i]; break;
                    }
                }
            }
            for (int64_t i = 0; i < m; i++)
                out[i0 + i] = v[i];
        }
#endif
    }
}

/* Eight double lanes, combined pairwise at the end: the order is fixed by the source,
 * so the wider tables only convert and add more lanes per instruction. The compiled row
 * loops add up a row the same way (kj_sum_add and kj_sum_total in cpu-fused-jit.c's
 * preludes): a change here is a change there, or fused and unfused sums part. */
static double sum_run_f32(const float *restrict x, int64_t n)
{
    double l[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int q = 0; q < 8; q++)
            l[q] += x[i + q];
    double s = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    for (; i < n; i++)
        s += x[i];
    return s;
}

/* s[i] += x[a·ld + i] for the rows a in order, i < m: a sum over leading dims (a bias's
 * gradient, cpu-reduce.c). Four rows per pass over s, each column's adds still one
 * after another in row order, so every table gives the same bits; compiled once for the
 * baseline the loop converted and added two floats at a time. */
static void colsum_f32(double *restrict s, const float *restrict x, int64_t rows, int64_t ld, int64_t m)
{
    int64_t a = 0;
    for (; a + 4 <= rows; a += 4) {
        const float *r0 = x + a * ld, *r1 = r0 + ld, *r2 = r1 + ld, *r3 = r2 + ld;
        for (int64_t i = 0; i < m; i++)
            s[i] = (((s[i] + r0[i]) + r1[i]) + r2[i]) + r3[i];
    }
    for (; a < rows; a++) {
        const float *r = x + a * ld;
        for (int64_t i = 0; i < m; i++)
            s[i] += r[i];
    }
}

static double sqdev_run_f32(const float *restrict x, int64_t n, double c)
{
    double l[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int q = 0; q < 8; q++) {
            double d = x[i + q] - c;
            l[q] += d * d;
        }
    double s = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    for (; i < n; i++) {
        double d = x[i] - c;
        s += d * d;
    }
    return s;
}

#include "cpu-kernels-philox.inc"

const kiln__cpu_kernels KTABLE = {
    .name = KNAME,
    .stream_floats = KSTREAM,
    .unary_f32 = unary_f32,
    .binary_f32 = binary_f32,
    .f16_to_f32 = f16_to_f32,
    .f32_to_f16 = f32_to_f16,
    .softmax_row_f32 = softmax_row_f32,
    .layer_norm_row_f32 = layer_norm_row_f32,
    .maxpool2x2_row_f32 = maxpool2x2_row_f32,
    .maxpool2x2_idx_row_f32 = maxpool2x2_idx_row_f32,
    .dwconv_plane_f32 = dwconv_plane_f32,
#if USE_AVX512
    .dwconv_s1_f32 = dwconv_s1_f32,
    .dwconv_s1_maxk = DW_MAXK,
    .pad_row_s2_f32 = pad_row_s2_f32,
    .dwconv_c16_f32 = dwconv_c16_f32,
#endif
    .epilogue_f32 = epilogue_f32,
    .bias_act_f32 = bias_act_f32,
    .chain_rows_f32 = chain_rows_f32,
    .sum_run_f32 = sum_run_f32,
    .sqdev_run_f32 = sqdev_run_f32,
    .colsum_f32 = colsum_f32,
    .compare_f32 = compare_f32,
    .where_f32 = where_f32,
    .fill_f32 = fill_f32,
    .philox_u01 = philox_u01,
#if USE_AVX512
    .conv_tile_f32 = conv_tile_f32,
    .conv_tile_rows_f32 = conv_tile_rows_f32,
    .conv_tile_rows_chain_f32 = conv_tile_rows_chain_f32,
    .conv_tile_o = 8,
    .conv_tile_q = 48,
    .cvconv_f32 = cvconv_f32,
#elif USE_AVX2
    .conv_tile_f32 = conv_tile_f32,
    .conv_tile_rows_f32 = conv_tile_rows_f32,
    .conv_tile_o = 4,
    .conv_tile_q = 24,
#endif
};
