// binary: out = a op b, op the specialization constant OP (kiln_binary_op). Variants X_X
// and bool_X (comparisons and logical ops). Integer math is int64, wrapping on store.
#version 450
#include "common.glsl"

KVK_PARAMS {
    KView out_v;
    KView a_v;
    KView b_v;
};
KVK_BUF_WO(1, S0, out_d);
KVK_BUF_RO(2, S1, a_d);
KVK_BUF_RO(3, S1, b_d);
KVK_SPEC(3, OP, 0);

#if KVK_F1
#if KVK_DOUBLE
#define FT double
#else
#define FT float
#endif
float kvk_powf2(float x, float y)
{
    if (y == 0.0 || x == 1.0) return 1.0;
    if (isnan(x) || isnan(y)) return x + y;
    if (isinf(y)) {
        float ax = abs(x);
        if (ax == 1.0) return 1.0;
        return (ax > 1.0) == (y > 0.0) ? uintBitsToFloat(0x7f800000u) : 0.0;
    }
    bool odd = y == floor(y) && mod(y, 2.0) == 1.0;
    if (y == floor(y) && abs(y) <= 64.0) {
        int e = int(abs(y));
        float r = 1.0, b = x;
        while (e > 0) {
            if ((e & 1) != 0) r *= b;
            b *= b;
            e >>= 1;
        }
        return y < 0.0 ? 1.0 / r : r;
    }
    if (x < 0.0 || (x == 0.0 && floatBitsToUint(x) != 0u)) {
        if (y != floor(y) && !isinf(x) && x != 0.0) return uintBitsToFloat(0x7fc00000u);
        float r = x == 0.0 ? (y < 0.0 ? uintBitsToFloat(0x7f800000u) : 0.0) : (isinf(x) ? (y < 0.0 ? 0.0 : uintBitsToFloat(0x7f800000u)) : pow(-x, y));
        return odd ? -r : r;
    }
    if (x == 0.0) return y < 0.0 ? uintBitsToFloat(0x7f800000u) : 0.0;
    return pow(x, y);
}
FT binary_f(FT a, FT b)
{
    switch (OP) {
    case 0: return a + b;
    case 1: return a - b;
    case 2: return a * b;
    case 3: return a / b;
    case 4: {
#if KVK_DOUBLE
        FT m = kd_fmod(a, b);
#else
        FT m = kvk_fmod(a, b);
#endif
        if (m != FT(0) && ((b < FT(0)) != (m < FT(0)))) m += b;
        return m;
    }
    #if KVK_DOUBLE
    case 5: return kd_pow(a, b);
#else
    case 5: return kvk_powf2(a, b);
#endif
    case 6: return isnan(a) || isnan(b) ? a + b : (a < b ? b : a);
    case 7: return isnan(a) || isnan(b) ? a + b : (b < a ? b : a);
    }
    return a;
}
#endif

int64_t kvk_ipow2(int64_t b, int64_t e)
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

int64_t binary_i(int64_t a, int64_t b)
{
    switch (OP) {
    case 0: return a + b;
    case 1: return a - b;
    case 2: return a * b;
    case 3: {
        if (b == 0l) return 0l;
        if (b == -1l) return -a;
        int64_t q = a / b;
        if ((a - q * b) != 0l && ((a < 0l) != (b < 0l))) q -= 1l;
        return q;
    }
    case 4: {
        if (b == 0l || b == -1l) return 0l;
        int64_t r = a - (a / b) * b;
        if (r != 0l && ((r < 0l) != (b < 0l))) r += b;
        return r;
    }
    case 5: return kvk_ipow2(a, b);
    case 6: return a < b ? b : a;
    case 7: return b < a ? b : a;
    }
    return a;
}

void main()
{
    KVK_FOR_EACH(i, out_v.numel) {
        C1 a = LD1(a_d[kvk_at(a_v, i)]);
        C1 b = LD1(b_d[kvk_at(b_v, i)]);
        int o = kvk_at(out_v, i);
        if (OP >= 8) {
            bool r;
            switch (OP) {
            case 8: r = a == b; break;
            case 9: r = a != b; break;
            case 10: r = a < b; break;
            case 11: r = a <= b; break;
            case 12: r = a > b; break;
            case 13: r = a >= b; break;
            case 14: r = a != C1(0) && b != C1(0); break;
            case 15: r = a != C1(0) || b != C1(0); break;
            default: r = (a != C1(0)) != (b != C1(0)); break;
            }
#if KVK_DT0_IS_BOOL
            out_d[o] = ST0(r ? 1u : 0u);
#endif
        } else {
#if !KVK_DT0_IS_BOOL || KVK_DT1_IS_BOOL
#if KVK_F1
            out_d[o] = ST0(C0(binary_f(FT(a), FT(b))));
#else
            out_d[o] = ST0(FROML0(binary_i(TOL1(a), TOL1(b))));
#endif
#endif
        }
    }
}
