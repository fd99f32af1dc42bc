/*
 * backends/cpu/cpu-math.h — 8-wide f32 exp, tanh, erf, erfc and gelu for AVX2+FMA.
 *
 * Included only by the AVX2 build of cpu-kernels.c. Calling libm per element is what
 * makes a naive gelu loop slow (a scalar erff call each); these evaluate the function
 * for eight lanes at once with a few FMAs. Accuracy aims at 1-2 ulp: exp is reduced with
 * a two-part ln 2 (Cody-Waite) and scales by 2^n in two steps so that results in the
 * subnormal range and overflow to infinity come out right; erfc uses a Chebyshev fit of
 * erfc(z)·exp(z²) (fractional error below 1.2e-7) with z² split into a rounded part
 * and its exact error, so the exponential does not amplify the rounding of z². NaN
 * inputs come back as NaN from every function.
 */
#ifndef KILN_CPU_MATH_H
#define KILN_CPU_MATH_H

#include <immintrin.h>

#include "cpu-gelu-table.h"

#define V8(c) _mm256_set1_ps((float)(c))

/* exp(hi + lo), |lo| small relative to hi or both moderate. */
static inline __m256 kv_exp2(__m256 hi, __m256 lo)
{
    __m256 x = _mm256_add_ps(hi, lo);
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    x = _mm256_min_ps(_mm256_max_ps(x, V8(-104.0f)), V8(89.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, V8(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* clamping moves x, not hi and lo: re-derive r from the clamped sum when it moved */
    __m256 moved = _mm256_cmp_ps(x, _mm256_add_ps(hi, lo), _CMP_NEQ_UQ);
    __m256 h = _mm256_blendv_ps(hi, x, moved);
    __m256 l = _mm256_blendv_ps(lo, _mm256_setzero_ps(), moved);
    __m256 r = _mm256_fnmadd_ps(n, V8(0.693359375f), h);
    r = _mm256_fnmadd_ps(n, V8(-2.12194440e-4f), r);
    r = _mm256_add_ps(r, l);
    __m256 p = V8(1.9875691500E-4f);
    p = _mm256_fmadd_ps(p, r, V8(1.3981999507E-3f));
    p = _mm256_fmadd_ps(p, r, V8(8.3334519073E-3f));
    p = _mm256_fmadd_ps(p, r, V8(4.1665795894E-2f));
    p = _mm256_fmadd_ps(p, r, V8(1.6666665459E-1f));
    p = _mm256_fmadd_ps(p, r, V8(5.0000001201E-1f));
    __m256 y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
    y = _mm256_add_ps(y, V8(1.0f));
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i n1 = _mm256_srai_epi32(ni, 1);
    __m256i n2 = _mm256_sub_epi32(ni, n1);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
    y = _mm256_mul_ps(_mm256_mul_ps(y, s1), s2);
    return _mm256_blendv_ps(y, _mm256_add_ps(hi, lo), nan);
}

/* exp(hi + lo) for hi + lo known to lie in [-102, 0] (erfc's exponent): no clamping
 * or NaN handling needed, which matters inside gelu's inner loop. */
static inline __m256 kv_exp2_neg(__m256 hi, __m256 lo)
{
    __m256 n = _mm256_round_ps(_mm256_mul_ps(_mm256_add_ps(hi, lo), V8(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, V8(0.693359375f), hi);
    r = _mm256_fnmadd_ps(n, V8(-2.12194440e-4f), r);
    r = _mm256_add_ps(r, lo);
    __m256 p = V8(1.9875691500E-4f);
    p = _mm256_fmadd_ps(p, r, V8(1.3981999507E-3f));
    p = _mm256_fmadd_ps(p, r, V8(8.3334519073E-3f));
    p = _mm256_fmadd_ps(p, r, V8(4.1665795894E-2f));
    p = _mm256_fmadd_ps(p, r, V8(1.6666665459E-1f));
    p = _mm256_fmadd_ps(p, r, V8(5.0000001201E-1f));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), V8(1.0f));
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i n1 = _mm256_srai_epi32(ni, 1);
    __m256i n2 = _mm256_sub_epi32(ni, n1);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(y, s1), s2);
}

static inline __m256 kv_exp(__m256 x)
{
    return kv_exp2(x, _mm256_setzero_ps());
}

static inline __m256 kv_abs(__m256 x)
{
    return _mm256_andnot_ps(V8(-0.0f), x);
}

static inline __m256 kv_tanh(__m256 x)
{
    __m256 ax = kv_abs(x);
    __m256 sign = _mm256_and_ps(x, V8(-0.0f));
    /* small: odd polynomial */
    __m256 z = _mm256_mul_ps(x, x);
    __m256 p = V8(-5.70498872745E-3f);
    p = _mm256_fmadd_ps(p, z, V8(2.06390887954E-2f));
    p = _mm256_fmadd_ps(p, z, V8(-5.37397155531E-2f));
    p = _mm256_fmadd_ps(p, z, V8(1.33314422036E-1f));
    p = _mm256_fmadd_ps(p, z, V8(-3.33332819422E-1f));
    __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), x, x);
    /* large: 1 - 2 / (exp(2|x|) + 1) */
    __m256 e = kv_exp(_mm256_add_ps(ax, ax));
    __m256 big = _mm256_sub_ps(V8(1.0f), _mm256_div_ps(V8(2.0f), _mm256_add_ps(e, V8(1.0f))));
    __m256 is_small = _mm256_cmp_ps(ax, V8(0.625f), _CMP_LT_OQ);
    /* x's sign on both branches: the polynomial's last add gives +0 for x = -0 */
    return _mm256_or_ps(_mm256_blendv_ps(big, small, is_small), sign);
}

/* erfc(u) for u >= 0 (callers pass |z|); u is clamped to 10, where erfc is ~2e-45. */
static inline __m256 kv_erfc_pos(__m256 u)
{
    u = _mm256_min_ps(u, V8(10.0f));
    __m256 t = _mm256_div_ps(V8(1.0f), _mm256_fmadd_ps(V8(0.5f), u, V8(1.0f)));
    __m256 p = V8(0.17087277f);
    p = _mm256_fmadd_ps(p, t, V8(-0.82215223f));
    p = _mm256_fmadd_ps(p, t, V8(1.48851587f));
    p = _mm256_fmadd_ps(p, t, V8(-1.13520398f));
    p = _mm256_fmadd_ps(p, t, V8(0.27886807f));
    p = _mm256_fmadd_ps(p, t, V8(-0.18628806f));
    p = _mm256_fmadd_ps(p, t, V8(0.09678418f));
    p = _mm256_fmadd_ps(p, t, V8(0.37409196f));
    p = _mm256_fmadd_ps(p, t, V8(1.00002368f));
    p = _mm256_fmadd_ps(p, t, V8(-1.26551223f));
    __m256 z2 = _mm256_mul_ps(u, u);
    __m256 z2err = _mm256_fmsub_ps(u, u, z2); /* u*u - z2 exactly */
    __m256 hi = _mm256_sub_ps(_mm256_setzero_ps(), z2);
    __m256 lo = _mm256_sub_ps(p, z2err);
    return _mm256_mul_ps(t, kv_exp2_neg(hi, lo));
}

/* erf(z) * 1 for |z| < 0.5 by its Taylor series (7 terms, < 1e-9 relative). */
static inline __m256 kv_erf_small(__m256 z)
{
    __m256 z2 = _mm256_mul_ps(z, z);
    __m256 p = V8(0.00012055332981789664);
    p = _mm256_fmadd_ps(p, z2, V8(-0.0008548327023450852));
    p = _mm256_fmadd_ps(p, z2, V8(0.005223977625442188));
    p = _mm256_fmadd_ps(p, z2, V8(-0.026866170645131252));
    p = _mm256_fmadd_ps(p, z2, V8(0.11283791670955126));
    p = _mm256_fmadd_ps(p, z2, V8(-0.37612638903183754));
    p = _mm256_fmadd_ps(p, z2, V8(1.1283791670955126));
    return _mm256_mul_ps(p, z);
}

static inline __m256 kv_erf(__m256 z)
{
    __m256 u = kv_abs(z);
    __m256 sign = _mm256_and_ps(z, V8(-0.0f));
    __m256 big = _mm256_or_ps(_mm256_sub_ps(V8(1.0f), kv_erfc_pos(u)), sign);
    __m256 is_small = _mm256_cmp_ps(u, V8(0.5f), _CMP_LT_OQ);
    __m256 r = _mm256_blendv_ps(big, kv_erf_small(z), is_small);
    __m256 nan = _mm256_cmp_ps(z, z, _CMP_UNORD_Q);
    return _mm256_blendv_ps(r, z, nan);
}

/* 0.5 x (1 + erf(x / sqrt 2)), computed through erfc where 1 + erf would cancel. */
static inline __m256 kv_gelu_erfc(__m256 x)
{
    __m256 z = _mm256_mul_ps(x, V8(0.70710678118654752f));
    __m256 u = kv_abs(z);
    __m256 hx = _mm256_mul_ps(x, V8(0.5f));
    __m256 is_small = _mm256_cmp_ps(u, V8(0.5f), _CMP_LT_OQ);
    int m = _mm256_movemask_ps(is_small);
    __m256 r;
    if (m == 0xff) { /* every lane near zero: the series alone */
        r = _mm256_fmadd_ps(hx, kv_erf_small(z), hx);
    } else {
        __m256 h = _mm256_mul_ps(hx, kv_erfc_pos(u));
        __m256 pos = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GT_OQ);
        r = _mm256_blendv_ps(h, _mm256_sub_ps(x, h), pos);
        if (m)
            r = _mm256_blendv_ps(r, _mm256_fmadd_ps(hx, kv_erf_small(z), hx), is_small);
    }
    /* +inf stays +inf; -inf gives NaN as 0.5·x·(1 + erf) does; NaN stays NaN */
    r = _mm256_blendv_ps(r, x, _mm256_cmp_ps(x, V8(10.0f), _CMP_GT_OQ));
    __m256 bad = _mm256_or_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q),
                              _mm256_cmp_ps(x, V8(-INFINITY), _CMP_EQ_OQ));
    return _mm256_blendv_ps(r, V8(NAN), bad);
}

/* gelu(x) = x·Φ(x), Φ from erfc(|x|/√2)/2 as a piecewise polynomial, as kz_gelu does
 * (cpu-math512.h), with what 8 lanes allow: vpermps picks among 8 segments, so they are
 * 1/2 wide in u = |x|/√2, cover |x| < 5.66 and take degree 9 (cpu-gelu-table.h). Lanes
 * past the table, NaN and infinities take kv_gelu_erfc; positive ones need none of it.
 * About 30 instructions against kv_gelu_erfc's 45 and a division (tests/backend-cpu/
 * test-cpu-math.c holds both tables to the same bounds). */
static inline __m256 kv_gelu(__m256 x)
{
    __m256 u2 = _mm256_mul_ps(kv_abs(x), V8(1.41421356237309505f)); /* 2|x|/√2: segment units */
    __m256 seg = _mm256_floor_ps(u2);
    __m256i idx = _mm256_cvttps_epi32(seg); /* vpermps reads the low 3 bits only */
    __m256 s = _mm256_sub_ps(_mm256_sub_ps(u2, seg), V8(0.5f));
#define KV_GELU_COEF(j) _mm256_permutevar8x32_ps(_mm256_load_ps(kv_gelu_q[j]), idx)
    __m256 q = KV_GELU_COEF(9);
    q = _mm256_fmadd_ps(q, s, KV_GELU_COEF(8));
    q = _mm256_fmadd_ps(q, s, KV_GELU_COEF(7));
    q = _mm256_fmadd_ps(q, s, KV_GELU_COEF(6));
    q = _mm256_fmadd_ps(q, s, KV_GELU_COEF(5));
    q = _mm256_fmadd_ps(q, s, KV_GELU_COEF(4));
    q = _mm256_fmadd_ps(q, s, KV_GELU_COEF(3));
    q = _mm256_fmadd_ps(q, s, KV_GELU_COEF(2));
    q = _mm256_fmadd_ps(q, s, KV_GELU_COEF(1));
    q = _mm256_fmadd_ps(q, s, KV_GELU_COEF(0));
#undef KV_GELU_COEF
    __m256 xq = _mm256_mul_ps(x, q);
    __m256 pos = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GT_OQ);
    __m256 r = _mm256_blendv_ps(xq, _mm256_sub_ps(x, xq), pos);        /* x > 0: x - x·q, else x·q */
    __m256 far = _mm256_cmp_ps(u2, V8(KV_GELU_SEGMENTS), _CMP_NLT_UQ); /* NaN too */
    if (_mm256_movemask_ps(far)) {
        r = _mm256_blendv_ps(r, x, _mm256_and_ps(far, pos));
        __m256 slow = _mm256_andnot_ps(pos, far);
        if (_mm256_movemask_ps(slow))
            r = _mm256_blendv_ps(r, kv_gelu_erfc(x), slow);
    }
    return r;
}

/* x · sigmoid(2k(x + 0.044715 x³)) == 0.5 x (1 + tanh(k(x + 0.044715 x³))) without the
 * cancellation of 1 + tanh for negative x. */
static inline __m256 kv_gelu_tanh(__m256 x)
{
    __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    __m256 inner = _mm256_mul_ps(V8(0.7978845608028654f), _mm256_fmadd_ps(V8(0.044715f), x3, x));
    __m256 e = kv_exp(_mm256_mul_ps(inner, V8(-2.0f)));
    return _mm256_div_ps(x, _mm256_add_ps(V8(1.0f), e));
}

static inline __m256 kv_sigmoid(__m256 x)
{
    __m256 e = kv_exp(_mm256_sub_ps(_mm256_setzero_ps(), x));
    return _mm256_div_ps(V8(1.0f), _mm256_add_ps(V8(1.0f), e));
}

static inline float kv_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

static inline double kv_hsum_pd(__m256d v)
{
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    s = _mm_add_sd(s, _mm_unpackhi_pd(s, s));
    return _mm_cvtsd_f64(s);
}

/* max that returns NaN when either lane is NaN (torch.maximum semantics). */
static inline __m256 kv_max_nan(__m256 a, __m256 b)
{
    __m256 m = _mm256_max_ps(a, b);
    return _mm256_blendv_ps(m, _mm256_add_ps(a, b), _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
}

static inline __m256 kv_min_nan(__m256 a, __m256 b)
{
    __m256 m = _mm256_min_ps(a, b);
    return _mm256_blendv_ps(m, _mm256_add_ps(a, b), _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
}

#endif /* KILN_CPU_MATH_H */
