/*
 * backends/cuda/cuda-math.cuh — the scalar formulas of the elementwise ops, in each
 * domain, written after the ref backend's (backends/ref/ref-elementwise.c) so results
 * agree: round half to even, remainder with the divisor's sign, NaN through max/min and
 * relu/clamp, integer division flooring and 0 for a zero divisor, wrapping integers.
 * Op numbers are kiln_unary_op / kiln_binary_op (backends/backend.h).
 */
#ifndef KILN_CUDA_MATH_CUH
#define KILN_CUDA_MATH_CUH

#include "cuda-common.cuh"

enum {
    KU_NEG = 0, KU_ABS, KU_SIGN, KU_EXP, KU_LOG, KU_LOG1P, KU_EXPM1, KU_SQRT, KU_RSQRT, KU_SQUARE,
    KU_RECIPROCAL, KU_SIN, KU_COS, KU_TANH, KU_SIGMOID, KU_RELU, KU_LEAKY_RELU, KU_ELU, KU_GELU,
    KU_GELU_TANH, KU_SILU, KU_SOFTPLUS, KU_ERF, KU_FLOOR, KU_CEIL, KU_ROUND, KU_CLAMP,
    KU_POW_SCALAR, KU_ADD_SCALAR, KU_MUL_SCALAR, KU_ISNAN, KU_ISINF, KU_LOGICAL_NOT
};
enum {
    KB_ADD = 0, KB_SUB, KB_MUL, KB_DIV, KB_REMAINDER, KB_POW, KB_MAXIMUM, KB_MINIMUM, KB_EQ, KB_NE,
    KB_LT, KB_LE, KB_GT, KB_GE, KB_LOGICAL_AND, KB_LOGICAL_OR, KB_LOGICAL_XOR
};

template <typename T> __device__ __forceinline__ T kcu_unary_fp(int op, T x, T alpha, T beta)
{
    switch (op) {
    case KU_NEG: return -x;
    case KU_ABS: return fabs(x);
    case KU_SIGN: return (T)((T(0) < x) - (x < T(0)));
    case KU_EXP: return exp(x);
    case KU_LOG: return log(x);
    case KU_LOG1P: return log1p(x);
    case KU_EXPM1: return expm1(x);
    case KU_SQRT: return sqrt(x);
    case KU_RSQRT: return T(1) / sqrt(x);
    case KU_SQUARE: return x * x;
    case KU_RECIPROCAL: return T(1) / x;
    case KU_SIN: return sin(x);
    case KU_COS: return cos(x);
    case KU_TANH: return tanh(x);
    case KU_SIGMOID: return T(1) / (T(1) + exp(-x));
    case KU_RELU: return x < T(0) ? T(0) : x; /* NaN and -0 pass through, as PyTorch's */
    case KU_LEAKY_RELU: return x > T(0) ? x : alpha * x;
    case KU_ELU: return x > T(0) ? x : alpha * expm1(x);
    case KU_GELU: return T(0.5) * x * (T(1) + erf(x * T(0.70710678118654752440)));
    case KU_GELU_TANH: {
        const T k = T(0.79788456080286535588);
        return T(0.5) * x * (T(1) + tanh(k * (x + T(0.044715) * x * x * x)));
    }
    case KU_SILU: return x / (T(1) + exp(-x));
    case KU_SOFTPLUS: return x * alpha > beta ? x : log1p(exp(x * alpha)) / alpha;
    case KU_ERF: return erf(x);
    case KU_FLOOR: return floor(x);
    case KU_CEIL: return ceil(x);
    case KU_ROUND: return rint(x);
    case KU_CLAMP:
        if (x != x)
            return x;
        x = x < alpha ? alpha : x;
        return x > beta ? beta : x;
    case KU_POW_SCALAR:
        if (alpha == T(0.5))
            return sqrt(x);
        if (alpha == T(-0.5))
            return T(1) / sqrt(x);
        return pow(x, alpha);
    case KU_ADD_SCALAR: return x + alpha;
    case KU_MUL_SCALAR: return x * alpha;
    default: return T(NAN);
    }
}

__device__ __forceinline__ int64_t kcu_wadd(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
__device__ __forceinline__ int64_t kcu_wsub(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }
__device__ __forceinline__ int64_t kcu_wmul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }

__device__ __forceinline__ int64_t kcu_d2i(double v)
{
    if (!(v == v))
        return 0;
    if (v >= 9.2233720368547758e18)
        return INT64_MAX;
    if (v <= -9.2233720368547758e18)
        return INT64_MIN;
    return (int64_t)v;
}

__device__ __forceinline__ bool kcu_integral(double v)
{
    return isfinite(v) && v == floor(v) && fabs(v) < 9007199254740992.0;
}

__device__ __forceinline__ int64_t kcu_ipow(int64_t base, int64_t e)
{
    if (e < 0)
        return base == 1 ? 1 : base == -1 ? ((e & 1) ? -1 : 1) : 0;
    int64_t r = 1;
    while (e) {
        if (e & 1)
            r = kcu_wmul(r, base);
        base = kcu_wmul(base, base);
        e >>= 1;
    }
    return r;
}

__device__ __forceinline__ int64_t kcu_unary_int(int op, int64_t x, double alpha, double beta)
{
    switch (op) {
    case KU_NEG: return kcu_wsub(0, x);
    case KU_ABS: return x < 0 ? kcu_wsub(0, x) : x;
    case KU_SIGN: return (0 < x) - (x < 0);
    case KU_SQUARE: return kcu_wmul(x, x);
    case KU_RELU: return x > 0 ? x : 0;
    case KU_CLAMP: {
        /* compared in int64, as ref: through a double, an i64 past 2^53 rounds onto the bound */
        int64_t lo = kcu_d2i(ceil(alpha)), hi = kcu_d2i(floor(beta));
        if (x < lo)
            x = lo;
        return x > hi ? hi : x;
    }
    case KU_FLOOR: case KU_CEIL: case KU_ROUND: return x;
    case KU_POW_SCALAR: return kcu_ipow(x, (int64_t)alpha);
    case KU_ADD_SCALAR:
        return kcu_integral(alpha) ? kcu_wadd(x, (int64_t)alpha) : kcu_d2i((double)x + alpha);
    case KU_MUL_SCALAR:
        return kcu_integral(alpha) ? kcu_wmul(x, (int64_t)alpha) : kcu_d2i((double)x * alpha);
    default: return 0;
    }
}

template <typename T> __device__ __forceinline__ T kcu_binary_fp(int op, T a, T b)
{
    switch (op) {
    case KB_ADD: return a + b;
    case KB_SUB: return a - b;
    case KB_MUL: return a * b;
    case KB_DIV: return a / b;
    case KB_REMAINDER: {
        T m = fmod(a, b);
        if (m != T(0) && ((b < T(0)) != (m < T(0))))
            m += b;
        return m;
    }
    case KB_POW: return pow(a, b);
    case KB_MAXIMUM: return (a != a || b != b) ? T(NAN) : (a < b ? b : a);
    case KB_MINIMUM: return (a != a || b != b) ? T(NAN) : (b < a ? b : a);
    default: return T(NAN);
    }
}

__device__ __forceinline__ int64_t kcu_binary_int(int op, int64_t a, int64_t b)
{
    switch (op) {
    case KB_ADD: return kcu_wadd(a, b);
    case KB_SUB: return kcu_wsub(a, b);
    case KB_MUL: return kcu_wmul(a, b);
    case KB_DIV: {
        if (b == 0)
            return 0;
        if (b == -1)
            return kcu_wsub(0, a);
        int64_t q = a / b;
        if ((a % b != 0) && ((a < 0) != (b < 0)))
            q--;
        return q;
    }
    case KB_REMAINDER: {
        if (b == 0 || b == -1)
            return 0;
        int64_t r = a % b;
        if (r != 0 && ((r < 0) != (b < 0)))
            r += b;
        return r;
    }
    case KB_POW: return kcu_ipow(a, b);
    case KB_MAXIMUM: return a < b ? b : a;
    case KB_MINIMUM: return b < a ? b : a;
    default: return 0;
    }
}

/* ------------------------------------------------------ atomic accumulation */

/* Adds to a 16- or 8-bit element through its aligned 32-bit word. */
__device__ __forceinline__ void kcu_atomic_add_narrow(void *base, int dt, int64_t e, double dv, int64_t iv)
{
    int es = dt == KCU_F16 || dt == KCU_BF16 ? 2 : 1;
    uintptr_t addr = (uintptr_t)base + (uintptr_t)(e * es);
    unsigned int *word = (unsigned int *)(addr & ~(uintptr_t)3);
    unsigned shift = (unsigned)((addr & 3) * 8);
    unsigned mask = (es == 2 ? 0xffffu : 0xffu) << shift;
    unsigned old = *word, assumed;
    do {
        assumed = old;
        unsigned bits = (assumed & mask) >> shift;
        unsigned nb;
        if (dt == KCU_F16)
            nb = kcu_f32_to_f16(kcu_f16_to_f32((uint16_t)bits) + (float)dv);
        else if (dt == KCU_BF16)
            nb = kcu_f32_to_bf16(kcu_bf16_to_f32((uint16_t)bits) + (float)dv);
        else if (dt == KCU_BOOL)
            nb = (bits != 0 || iv != 0) ? 1u : 0u;
        else
            nb = (unsigned)((uint64_t)bits + (uint64_t)iv) & 0xffu;
        old = atomicCAS(word, assumed, (assumed & ~mask) | ((nb << shift) & mask));
    } while (old != assumed);
}

/* out[o] += src[s] in out's domain, atomically. */
__device__ __forceinline__ void kcu_atomic_acc(const kcu_view &out, int64_t o, const kcu_view &src, int64_t s)
{
    bool fl = kcu_is_float(out.dtype);
    double dv = fl ? kcu_load_d(src.base, src.dtype, s) : 0;
    int64_t iv = fl ? 0 : kcu_load_i(src.base, src.dtype, s);
    switch (out.dtype) {
    case KCU_F32: atomicAdd((float *)out.base + o, (float)dv); break;
    case KCU_F64: atomicAdd((double *)out.base + o, dv); break;
    case KCU_I64: atomicAdd((unsigned long long *)out.base + o, (unsigned long long)iv); break;
    case KCU_I32: atomicAdd((int *)out.base + o, (int)(uint32_t)(uint64_t)iv); break;
    default: kcu_atomic_add_narrow(out.base, out.dtype, o, dv, iv); break;
    }
}

#endif /* KILN_CUDA_MATH_CUH */
