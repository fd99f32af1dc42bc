// unary: out = op(in), op the specialization constant OP (kiln_unary_op). Variants X_X
// (same dtype) and bool_X (isnan, isinf, logical_not; sign of bool). Float math runs in
// float (f16/bf16/f32) or, for the ops GLSL has in double, in double (f64); the
// transcendental ones are float-only and refused on f64 by supports().
#version 450
#include "common.glsl"

KVK_PARAMS {
    KView out_v;
    KView in_v;
    KScalar alpha;
    KScalar beta;
    KScalar lo_i; // integer clamp bounds: ceil(alpha), floor(beta)
    KScalar hi_i;
    int alpha_integral;
};
KVK_BUF_WO(1, S0, out_d);
KVK_BUF_RO(2, S1, in_d);
KVK_SPEC(3, OP, 0);

#if KVK_DOUBLE
#define FT double
#define FA packDouble2x32(uvec2(alpha.dlo, alpha.dhi))
#define FB packDouble2x32(uvec2(beta.dlo, beta.dhi))
#else
#define FT float
#define FA alpha.f
#define FB beta.f
#endif
#define FN(f, x) FT(f(float(x)))

float kvk_powf(float x, float y)
{
    if (y == 0.0) return 1.0;
    if (isnan(x) || isnan(y)) return x + y;
    if (y == floor(y) && abs(y) <= 64.0) {
        // exact repeated squaring, as pow's correctly rounded result nearly always is
        int e = int(abs(y));
        float r = 1.0, b = x;
        while (e > 0) {
            if ((e & 1) != 0) r *= b;
            b *= b;
            e >>= 1;
        }
        return y < 0.0 ? 1.0 / r : r;
    }
    if (x < 0.0) {
        if (isinf(x)) return y > 0.0 ? (y == floor(y) && mod(y, 2.0) == 1.0 ? x : -x) : 0.0;
        if (y != floor(y)) return uintBitsToFloat(0x7fc00000u);
        float r = pow(-x, y);
        return mod(y, 2.0) == 1.0 ? -r : r;
    }
    if (x == 0.0) return y < 0.0 ? uintBitsToFloat(0x7f800000u) : 0.0;
    return pow(x, y);
}

FT unary_f(FT x)
{
    switch (OP) {
    case 0: return -x;
    case 1: return abs(x);
    case 2: return x > FT(0) ? FT(1) : (x < FT(0) ? FT(-1) : FT(0));
    case 3: return FN(exp, x);
    case 4: return FN(kvk_log, x);
    case 5: return FN(kvk_log1p, x);
    case 6: return FN(kvk_expm1, x);
    case 7: return x < FT(0) ? FT(KVK_NAN) : sqrt(x);
    case 8: return x < FT(0) ? FT(KVK_NAN) : FT(1) / sqrt(x);
    case 9: return x * x;
    case 10: return FT(1) / x;
    case 11: return FN(sin, x);
    case 12: return FN(cos, x);
    case 13: return FN(kvk_tanh, x);
    case 14: return FN(kvk_sigmoid, x);
    case 15: return isnan(x) ? x : (x > FT(0) ? x : FT(0));
    case 16: return x > FT(0) ? x : FA * x;
    case 17: return x > FT(0) ? x : FA * FN(kvk_expm1, x);
    case 18: return FT(0.5) * x * (FT(1) + FN(kvk_erf, x * FT(0.70710678118654752440)));
    case 19: {
        FT k = FT(0.79788456080286535588);
        return FT(0.5) * x * (FT(1) + FN(kvk_tanh, k * (x + FT(0.044715) * x * x * x)));
    }
    case 20: return x * FN(kvk_sigmoid, x);
    case 21: return x * FA > FB ? x : FN(kvk_log1p, FN(exp, x * FA)) / FA;
    case 22: return FN(kvk_erf, x);
    case 23: return floor(x);
    case 24: return ceil(x);
    case 25: return roundEven(x);
    case 26: {
        if (isnan(x)) return x;
        FT y = x < FA ? FA : x;
        return y > FB ? FB : y;
    }
    case 27:
        if (FA == FT(0.5)) return x < FT(0) ? FT(KVK_NAN) : sqrt(x);
        if (FA == FT(-0.5)) return x < FT(0) ? FT(KVK_NAN) : FT(1) / sqrt(x);
        return FT(kvk_powf(float(x), float(FA)));
    case 28: return x + FA;
    case 29: return x * FA;
    }
    return x;
}

int64_t kvk_ipow(int64_t b, int64_t e)
{
    if (e < 0l) return b == 1l ? 1l : (b == -1l ? ((e & 1l) != 0l ? -1l : 1l) : 0l);
    int64_t r = 1l;
    while (e != 0l) {
        if ((e & 1l) != 0l) r *= b;
        b *= b;
        e >>= 1;
    }
    return r;
}

int64_t unary_i(int64_t x)
{
    int64_t a = KVK_SCALAR_i64(alpha);
    switch (OP) {
    case 0: return -x;
    case 1: return x < 0l ? -x : x;
    case 2: return x > 0l ? 1l : (x < 0l ? -1l : 0l);
    case 9: return x * x;
    case 15: return x > 0l ? x : 0l;
    case 26: {
        int64_t lo = KVK_SCALAR_i64(lo_i), hi = KVK_SCALAR_i64(hi_i);
        if (float(x) < FA || x < lo) x = lo;
        if (x > hi) x = hi;
        return x;
    }
    case 27: return kvk_ipow(x, a);
    case 28: return alpha_integral != 0 ? x + a : kvk_f2l(float(x) + FA);
    case 29: return alpha_integral != 0 ? x * a : kvk_f2l(float(x) * FA);
    }
    return x; // floor, ceil, round
}

void main()
{
    KVK_FOR_EACH(i, out_v.numel) {
        C1 x = LD1(in_d[kvk_at(in_v, i)]);
        int o = kvk_at(out_v, i);
#if KVK_DT0_IS_BOOL
        uint r;
#if KVK_F1
        if (OP == 30) r = isnan(x) ? 1u : 0u;
        else if (OP == 31) r = isinf(x) ? 1u : 0u;
        else r = x == C1(0) ? 1u : 0u;
#else
        if (OP == 32) r = x == C1(0) ? 1u : 0u;
        else if (OP == 2) r = x != C1(0) ? 1u : 0u;
        else r = 0u;
#endif
        out_d[o] = ST0(r);
#elif KVK_F0
        out_d[o] = ST0(C0(unary_f(FT(x))));
#else
        out_d[o] = ST0(FROML0(unary_i(TOL1(x))));
#endif
    }
}
