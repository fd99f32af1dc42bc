/*
 * backends/cpu/cpu-math512.h — 16-wide f32 exp, tanh, erf, gelu and sigmoid for
 * AVX-512 (F, DQ, BW, VL).
 *
 * Included only by the AVX-512 build of cpu-kernels.c. The algorithms are those of the
 * 8-wide versions in cpu-math.h (same reductions, same polynomials, so the two tables
 * agree to the last bit or two), with what AVX-512 does better:
 *  - scaling by 2^n is one vscalefps, which rounds once and gets subnormal results and
 *    overflow to infinity right without the two-step multiply, and passes NaN through;
 *  - lane selection uses mask registers instead of blend-by-sign;
 *  - the reciprocals inside erfc and tanh come from vrcp14ps plus one Newton step
 *    (relative error about 2^-27, below f32 rounding) instead of a division, whose
 *    throughput otherwise bounds gelu. Their arguments are bounded there, so the
 *    approximation never meets 0 or infinity; sigmoid keeps the exact division because
 *    its denominator can be infinite;
 *  - gelu is a piecewise polynomial of 32 segments picked per lane by vpermt2ps (see
 *    kz_gelu), where the 8-wide build picks among 8 wider ones with vpermps; the two
 *    tables agree within the accuracy stated at kz_gelu, not to the last bit.
 */
#ifndef KILN_CPU_MATH512_H
#define KILN_CPU_MATH512_H

#include <immintrin.h>

#include "cpu-gelu-table.h"

#define V16(c) _mm512_set1_ps((float)(c))

/* 1 / d for d in a range where rcp14 neither overflows nor underflows. */
static inline __m512 kz_rcp(__m512 d)
{
    __m512 r = _mm512_rcp14_ps(d);
    __m512 e = _mm512_fnmadd_ps(d, r, V16(1.0f));
    return _mm512_fmadd_ps(r, e, r);
}

/* The shared core: exp(r) ≈ 1 + r + r²·p(r) on the reduced argument. */
static inline __m512 kz_exp_poly(__m512 r)
{
    __m512 p = V16(1.9875691500E-4f);
    p = _mm512_fmadd_ps(p, r, V16(1.3981999507E-3f));
    p = _mm512_fmadd_ps(p, r, V16(8.3334519073E-3f));
    p = _mm512_fmadd_ps(p, r, V16(4.1665795894E-2f));
    p = _mm512_fmadd_ps(p, r, V16(1.6666665459E-1f));
    p = _mm512_fmadd_ps(p, r, V16(5.0000001201E-1f));
    return _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), V16(1.0f));
}

#define KZ_ROUND(v) _mm512_roundscale_ps((v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* exp(x) for any x: clamped to [-104, 89] (beyond which the answer is 0 or +inf
 * anyway); NaN survives the clamp because max/min return their second operand, x,
 * when it is NaN, and scalef propagates it. */
static inline __m512 kz_exp(__m512 x)
{
    x = _mm512_min_ps(V16(89.0f), _mm512_max_ps(V16(-104.0f), x));
    __m512 n = KZ_ROUND(_mm512_mul_ps(x, V16(1.44269504088896341f)));
    __m512 r = _mm512_fnmadd_ps(n, V16(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, V16(-2.12194440e-4f), r);
    return _mm512_scalef_ps(kz_exp_poly(r), n);
}

/* exp(hi + lo) for hi + lo in [-102, 0] (erfc's exponent): no clamping needed. */
static inline __m512 kz_exp2_neg(__m512 hi, __m512 lo)
{
    __m512 n = KZ_ROUND(_mm512_mul_ps(_mm512_add_ps(hi, lo), V16(1.44269504088896341f)));
    __m512 r = _mm512_fnmadd_ps(n, V16(0.693359375f), hi);
    r = _mm512_fnmadd_ps(n, V16(-2.12194440e-4f), r);
    r = _mm512_add_ps(r, lo);
    return _mm512_scalef_ps(kz_exp_poly(r), n);
}

static inline __m512 kz_abs(__m512 x)
{
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff)));
}

static inline __m512 kz_copysign(__m512 mag, __m512 sgn)
{
    /* take bits of sgn where the mask constant has the sign bit */
    return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(mag), _mm512_castps_si512(sgn),
                                                         _mm512_set1_epi32((int)0x80000000u), 0xd8));
}

static inline __m512 kz_tanh(__m512 x)
{
    __m512 ax = kz_abs(x);
    __m512 z = _mm512_mul_ps(x, x);
    __m512 p = V16(-5.70498872745E-3f);
    p = _mm512_fmadd_ps(p, z, V16(2.06390887954E-2f));
    p = _mm512_fmadd_ps(p, z, V16(-5.37397155531E-2f));
    p = _mm512_fmadd_ps(p, z, V16(1.33314422036E-1f));
    p = _mm512_fmadd_ps(p, z, V16(-3.33332819422E-1f));
    __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), x, x);
    /* 1 - 2 / (exp(2|x|) + 1); |x| is capped at 10, where tanh is 1 in f32, so the
     * reciprocal's argument stays finite. NaN passes through the min (second operand). */
    __m512 e = kz_exp(_mm512_add_ps(_mm512_min_ps(V16(10.0f), ax), _mm512_min_ps(V16(10.0f), ax)));
    __m512 big = _mm512_fnmadd_ps(V16(2.0f), kz_rcp(_mm512_add_ps(e, V16(1.0f))), V16(1.0f));
    __mmask16 is_small = _mm512_cmp_ps_mask(ax, V16(0.625f), _CMP_LT_OQ);
    /* x's sign on both branches: the polynomial's last add gives +0 for x = -0 */
    return kz_copysign(_mm512_mask_blend_ps(is_small, big, small), x);
}

/* erfc(u) for u >= 0; u is clamped to 10, where erfc is ~2e-45. */
static inline __m512 kz_erfc_pos(__m512 u)
{
    u = _mm512_min_ps(u, V16(10.0f));
    __m512 t = kz_rcp(_mm512_fmadd_ps(V16(0.5f), u, V16(1.0f)));
    __m512 p = V16(0.17087277f);
    p = _mm512_fmadd_ps(p, t, V16(-0.82215223f));
    p = _mm512_fmadd_ps(p, t, V16(1.48851587f));
    p = _mm512_fmadd_ps(p, t, V16(-1.13520398f));
    p = _mm512_fmadd_ps(p, t, V16(0.27886807f));
    p = _mm512_fmadd_ps(p, t, V16(-0.18628806f));
    p = _mm512_fmadd_ps(p, t, V16(0.09678418f));
    p = _mm512_fmadd_ps(p, t, V16(0.37409196f));
    p = _mm512_fmadd_ps(p, t, V16(1.00002368f));
    p = _mm512_fmadd_ps(p, t, V16(-1.26551223f));
    __m512 z2 = _mm512_mul_ps(u, u);
    __m512 z2err = _mm512_fmsub_ps(u, u, z2); /* u*u - z2 exactly */
    __m512 hi = _mm512_sub_ps(_mm512_setzero_ps(), z2);
    __m512 lo = _mm512_sub_ps(p, z2err);
    return _mm512_mul_ps(t, kz_exp2_neg(hi, lo));
}

static inline __m512 kz_erf_small(__m512 z)
{
    __m512 z2 = _mm512_mul_ps(z, z);
    __m512 p = V16(0.00012055332981789664);
    p = _mm512_fmadd_ps(p, z2, V16(-0.0008548327023450852));
    p = _mm512_fmadd_ps(p, z2, V16(0.005223977625442188));
    p = _mm512_fmadd_ps(p, z2, V16(-0.026866170645131252));
    p = _mm512_fmadd_ps(p, z2, V16(0.11283791670955126));
    p = _mm512_fmadd_ps(p, z2, V16(-0.37612638903183754));
    p = _mm512_fmadd_ps(p, z2, V16(1.1283791670955126));
    return _mm512_mul_ps(p, z);
}

static inline __m512 kz_erf(__m512 z)
{
    __m512 u = kz_abs(z);
    __m512 big = kz_copysign(_mm512_sub_ps(V16(1.0f), kz_erfc_pos(u)), z);
    __mmask16 is_small = _mm512_cmp_ps_mask(u, V16(0.5f), _CMP_LT_OQ);
    __m512 r = _mm512_mask_blend_ps(is_small, big, kz_erf_small(z));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(z, z, _CMP_UNORD_Q), r, z);
}

/* 0.5 x (1 + erf(x / sqrt 2)), through erfc where 1 + erf would cancel: the general form,
 * for the lanes past the table of kz_gelu. */
static inline __m512 kz_gelu_erfc(__m512 x)
{
    __m512 z = _mm512_mul_ps(x, V16(0.70710678118654752f));
    __m512 u = kz_abs(z);
    __m512 hx = _mm512_mul_ps(x, V16(0.5f));
    __mmask16 is_small = _mm512_cmp_ps_mask(u, V16(0.5f), _CMP_LT_OQ);
    __m512 r;
    if (is_small == 0xffff) {
        r = _mm512_fmadd_ps(hx, kz_erf_small(z), hx);
    } else {
        __m512 h = _mm512_mul_ps(hx, kz_erfc_pos(u));
        __mmask16 pos = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ);
        r = _mm512_mask_sub_ps(h, pos, x, h); /* x > 0: x - h, else h */
        if (is_small)
            r = _mm512_mask_blend_ps(is_small, r, _mm512_fmadd_ps(hx, kz_erf_small(z), hx));
    }
    /* +inf stays +inf; -inf gives NaN as 0.5·x·(1 + erf) does; NaN stays NaN */
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, V16(10.0f), _CMP_GT_OQ), r, x);
    __mmask16 bad = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q) |
                    _mm512_cmp_ps_mask(x, V16(-INFINITY), _CMP_EQ_OQ);
    return _mm512_mask_blend_ps(bad, r, V16(NAN));
}

/* gelu(x) = x·Φ(x) with Φ(x) = 1 - q or q, q = erfc(|x|/√2)/2, by a piecewise polynomial:
 * 32 segments of width 1/4 in u = |x|/√2 up to 8 (|x| < 11.3), degree 8 each
 * (cpu-gelu-table.h, from tools/gelu-table.py), the segment's coefficients picked per
 * lane with vpermt2ps from two registers. That is 9 permutes and 8 fmas where the erfc
 * form above costs a reciprocal, a 10-term polynomial and an exp (about 45 instructions):
 * 2.9x less time per element on an AVX-512 EPYC, which is what the fused
 * gelu(x·a+b)·c chain spends most of its time on. The error stays at the erfc form's
 * (tests/backend-cpu/test-cpu-math.c, against erfc in double: worst relative error 7.0e-7
 * for |x| <= 3, 2.7e-6 up to 6, 1.0e-5 up to 12, where both forms are limited by the
 * rounding of x/√2 itself). Lanes past the table, NaN and infinities take kz_gelu_erfc;
 * positive ones need none of it (gelu(x) = x in f32 there). */
static inline __m512 kz_gelu(__m512 x)
{
    __m512 u4 = _mm512_mul_ps(kz_abs(x), V16(2.82842712474619009f)); /* 4|x|/√2: segment units */
    __m512 seg = _mm512_roundscale_ps(u4, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512i idx = _mm512_cvttps_epi32(seg); /* vpermt2ps reads its low 5 bits only */
    __m512 s = _mm512_sub_ps(_mm512_sub_ps(u4, seg), V16(0.5f));
#define KZ_GELU_COEF(j)                                                                                           \
    _mm512_permutex2var_ps(_mm512_load_ps(kz_gelu_q[j]), idx, _mm512_load_ps(kz_gelu_q[j] + 16))
    __m512 q = KZ_GELU_COEF(8);
    q = _mm512_fmadd_ps(q, s, KZ_GELU_COEF(7));
    q = _mm512_fmadd_ps(q, s, KZ_GELU_COEF(6));
    q = _mm512_fmadd_ps(q, s, KZ_GELU_COEF(5));
    q = _mm512_fmadd_ps(q, s, KZ_GELU_COEF(4));
    q = _mm512_fmadd_ps(q, s, KZ_GELU_COEF(3));
    q = _mm512_fmadd_ps(q, s, KZ_GELU_COEF(2));
    q = _mm512_fmadd_ps(q, s, KZ_GELU_COEF(1));
    q = _mm512_fmadd_ps(q, s, KZ_GELU_COEF(0));
#undef KZ_GELU_COEF
    __m512 xq = _mm512_mul_ps(x, q);
    __mmask16 pos = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ);
    __m512 r = _mm512_mask_sub_ps(xq, pos, x, xq);                              /* x > 0: x - x·q, else x·q */
    __mmask16 far = _mm512_cmp_ps_mask(u4, V16(KZ_GELU_SEGMENTS), _CMP_NLT_UQ); /* NaN too */
    if (far) {
        r = _mm512_mask_blend_ps(far & pos, r, x);
        if (far & ~pos)
            r = _mm512_mask_blend_ps(far & ~pos, r, kz_gelu_erfc(x));
    }
    return r;
}

static inline __m512 kz_gelu_tanh(__m512 x)
{
    __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
    __m512 inner = _mm512_mul_ps(V16(0.7978845608028654f), _mm512_fmadd_ps(V16(0.044715f), x3, x));
    __m512 e = kz_exp(_mm512_mul_ps(inner, V16(-2.0f)));
    return _mm512_div_ps(x, _mm512_add_ps(V16(1.0f), e));
}

static inline __m512 kz_sigmoid(__m512 x)
{
    __m512 e = kz_exp(_mm512_sub_ps(_mm512_setzero_ps(), x));
    return _mm512_div_ps(V16(1.0f), _mm512_add_ps(V16(1.0f), e));
}

static inline __m512 kz_silu(__m512 x)
{
    return _mm512_mul_ps(x, kz_sigmoid(x));
}

#endif /* KILN_CPU_MATH512_H */
