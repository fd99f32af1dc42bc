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
#if KVK_DOUBLE
#define K_SQRT1_2 0.70710678118654752440LF
#define K_SQRT2_PI 0.79788456080286535588LF
#define K_GELU 0.044715LF
#define U_EXP(x) kd_exp(x)
#define U_LOG(x) kd_log(x)
#define U_LOG1P(x) kd_log1p(x)
#define U_EXPM1(x) kd_expm1(x)
#define U_SIN(x) kd_sin(x)
#define U_COS(x) kd_cos(x)
#define U_TANH(x) kd_tanh(x)
#define U_SIGMOID(x) kd_sigmoid(x)
#define U_ERF(x) kd_erf(x)
#define U_POW(x, y) kd_pow(x, y)
#else
#define K_SQRT1_2 0.70710678118654752440
#define K_SQRT2_PI 0.79788456080286535588
#define K_GELU 0.044715
#define U_EXP(x) exp(x)
#define U_LOG(x) kvk_log(x)
#define U_LOG1P(x) kvk_log1p(x)
#define U_EXPM1(x) kvk_expm1(x)
#define U_SIN(x) kvk_sin_f(x)
#define U_COS(x) kvk_cos_f(x)
#define U_TANH(x) kvk_tanh(x)
#define U_SIGMOID(x) kvk_sigmoid(x)
#define U_ERF(x) kvk_erf(x)
#define U_POW(x, y) kvk_powf(x, y)
#endif

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
    // +0 for NaN and both zeros, as ref: the select chain x > 0 ? 1 : (x < 0 ? -1 : 0)
    // is rewritten by compilers into -b2f(x < 0), which is -0 there
    case 2: return FT(x > FT(0)) - FT(x < FT(0));
    case 3: return U_EXP(x);
    case 4: return U_LOG(x);
    case 5: return U_LOG1P(x);
    case 6: return U_EXPM1(x);
    case 7: return x < FT(0) ? FT(KVK_NAN) : sqrt(x);
    case 8: return x < FT(0) ? FT(KVK_NAN) : FT(1) / sqrt(x);
    case 9: return x * x;
    case 10: return FT(1) / x;
    case 11: return U_SIN(x);
    case 12: return U_COS(x);
    case 13: return U_TANH(x);
    case 14: return U_SIGMOID(x);
    case 15: return x < FT(0) ? FT(0) : x; /* relu: NaN and -0 pass through */
    case 16: return x > FT(0) ? x : FA * x;
    case 17: return x > FT(0) ? x : FA * U_EXPM1(x);
    case 18: return FT(0.5) * x * (FT(1) + U_ERF(x * K_SQRT1_2));
    case 19: {
        FT k = K_SQRT2_PI;
        return FT(0.5) * x * (FT(1) + U_TANH(k * (x + K_GELU * x * x * x)));
    }
    case 20: return x * U_SIGMOID(x);
    case 21: return x * FA > FB ? x : U_LOG1P(U_EXP(x * FA)) / FA;
    case 22: return U_ERF(x);
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
        return U_POW(x, FA);
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
