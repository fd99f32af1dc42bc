/*
 * backends/cuda/cuda-common.cuh — what every kernel file shares: the vendor's headers,
 * element loads and stores per dtype, strided offsets and launch sizes.
 *
 * Values move through three domains, as in the ref backend: float (f32, f16 and bf16
 * widen to f32), double (f64) and int64 (integers and bool). A kernel is instantiated
 * per storage dtype; the dtype tag picks the domain at compile time.
 */
#ifndef KILN_CUDA_COMMON_CUH
#define KILN_CUDA_COMMON_CUH

#ifdef KILN_CUDA_HIP
#include "vendor-hip.h"
#else
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define KCU_HALF __half
#endif

#include <stdint.h>

#define KILN_HOST_DEVICE __host__ __device__
#include "common/philox.h"
#include "cuda-kernels.h"

/* kiln_dtype values (kiln/tensor.h), repeated so the kernels need no C headers. */
enum { KCU_F32 = 0, KCU_F64, KCU_F16, KCU_BF16, KCU_I64, KCU_I32, KCU_U8, KCU_BOOL };

#define KCU_THREADS 256

static inline unsigned kcu_blocks(int64_t n)
{
    int64_t b = (n + KCU_THREADS - 1) / KCU_THREADS;
    if (b < 1)
        b = 1;
    return (unsigned)(b > 65535 * 16 ? 65535 * 16 : b); /* grid-stride loops cover the rest */
}

/* ------------------------------------------------------------- f16 and bf16 */

__device__ __forceinline__ float kcu_bf16_to_f32(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

__device__ __forceinline__ uint16_t kcu_f32_to_bf16(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN, sign kept */
    u += 0x7fffu + ((u >> 16) & 1u);       /* round to nearest even */
    return (uint16_t)(u >> 16);
}

__device__ __forceinline__ float kcu_f16_to_f32(uint16_t h)
{
    return __half2float(__ushort_as_half(h));
}

__device__ __forceinline__ uint16_t kcu_f32_to_f16(float f)
{
    return __half_as_ushort(__float2half_rn(f));
}

/* -------------------------------------------------- loads and stores per dtype */

/* Loads element e (an element offset from base) into each domain. */
__device__ __forceinline__ double kcu_load_d(const void *base, int dt, int64_t e)
{
    switch (dt) {
    case KCU_F32: return ((const float *)base)[e];
    case KCU_F64: return ((const double *)base)[e];
    case KCU_F16: return kcu_f16_to_f32(((const uint16_t *)base)[e]);
    case KCU_BF16: return kcu_bf16_to_f32(((const uint16_t *)base)[e]);
    case KCU_I64: return (double)((const int64_t *)base)[e];
    case KCU_I32: return ((const int32_t *)base)[e];
    case KCU_U8: return ((const uint8_t *)base)[e];
    default: return ((const uint8_t *)base)[e] != 0;
    }
}

__device__ __forceinline__ float kcu_load_f(const void *base, int dt, int64_t e)
{
    switch (dt) {
    case KCU_F32: return ((const float *)base)[e];
    case KCU_F16: return kcu_f16_to_f32(((const uint16_t *)base)[e]);
    case KCU_BF16: return kcu_bf16_to_f32(((const uint16_t *)base)[e]);
    default: return (float)kcu_load_d(base, dt, e);
    }
}

__device__ __forceinline__ int64_t kcu_load_i(const void *base, int dt, int64_t e)
{
    switch (dt) {
    case KCU_I64: return ((const int64_t *)base)[e];
    case KCU_I32: return ((const int32_t *)base)[e];
    case KCU_U8: return ((const uint8_t *)base)[e];
    case KCU_BOOL: return ((const uint8_t *)base)[e] != 0;
    default: {
        double v = kcu_load_d(base, dt, e);
        /* float to int as the ref backend's ref_d2i: truncation, NaN to 0, saturating */
        if (!(v == v))
            return 0;
        if (v >= 9.2233720368547758e18)
            return INT64_MAX;
        if (v <= -9.2233720368547758e18)
            return INT64_MIN;
        return (int64_t)v;
    }
    }
}

__device__ __forceinline__ void kcu_store_d(void *base, int dt, int64_t e, double v)
{
    switch (dt) {
    case KCU_F32: ((float *)base)[e] = (float)v; break;
    case KCU_F64: ((double *)base)[e] = v; break;
    case KCU_F16: ((uint16_t *)base)[e] = kcu_f32_to_f16((float)v); break;
    case KCU_BF16: ((uint16_t *)base)[e] = kcu_f32_to_bf16((float)v); break;
    case KCU_BOOL: ((uint8_t *)base)[e] = v != 0; break;
    default: {
        int64_t i;
        if (!(v == v))
            i = 0;
        else if (v >= 9.2233720368547758e18)
            i = INT64_MAX;
        else if (v <= -9.2233720368547758e18)
            i = INT64_MIN;
        else
            i = (int64_t)v;
        if (dt == KCU_I64)
            ((int64_t *)base)[e] = i;
        else if (dt == KCU_I32)
            ((int32_t *)base)[e] = (int32_t)(uint32_t)(uint64_t)i;
        else
            ((uint8_t *)base)[e] = (uint8_t)(uint64_t)i;
    }
    }
}

__device__ __forceinline__ void kcu_store_i(void *base, int dt, int64_t e, int64_t v)
{
    switch (dt) {
    case KCU_I64: ((int64_t *)base)[e] = v; break;
    case KCU_I32: ((int32_t *)base)[e] = (int32_t)(uint32_t)(uint64_t)v; break; /* wraps */
    case KCU_U8: ((uint8_t *)base)[e] = (uint8_t)(uint64_t)v; break;
    case KCU_BOOL: ((uint8_t *)base)[e] = v != 0; break;
    default: kcu_store_d(base, dt, e, (double)v); break;
    }
}

__host__ __device__ __forceinline__ bool kcu_is_float(int dt)
{
    return dt == KCU_F32 || dt == KCU_F64 || dt == KCU_F16 || dt == KCU_BF16;
}

/* ----------------------------------------------------------- strided offsets */

/* i / n for the non-negative index arithmetic below: a 32-bit division (several times cheaper
 * than a 64-bit one on the GPU) whenever both fit in 31 bits. */
__device__ __forceinline__ int64_t kcu_div(int64_t i, int64_t n)
{
    return (i | n) < 2147483648LL ? (int64_t)((uint32_t)i / (uint32_t)n) : i / n;
}

/* The element offset of flat (row-major over shape) index i in view v. */
__device__ __forceinline__ int64_t kcu_offset(const kcu_view &v, int64_t i)
{
    int64_t off = v.offset;
    for (int d = v.ndim - 1; d >= 0; d--) {
        int64_t n = v.shape[d];
        if (n == 1)
            continue;
        int64_t q = kcu_div(i, n);
        off += (i - q * n) * v.strides[d];
        i = q;
    }
    return off;
}

/* Offset of flat index i over `shape` (the output's) in a view with its own strides. */
__device__ __forceinline__ int64_t kcu_offset_in(const kcu_view &shape, const kcu_view &v, int64_t i)
{
    int64_t off = v.offset;
    for (int d = shape.ndim - 1; d >= 0; d--) {
        int64_t n = shape.shape[d];
        if (n == 1)
            continue;
        int64_t q = kcu_div(i, n);
        off += (i - q * n) * v.strides[d];
        i = q;
    }
    return off;
}

static inline int64_t kcu_numel(const kcu_view *v)
{
    int64_t n = 1;
    for (int d = 0; d < v->ndim; d++)
        n *= v->shape[d];
    return n;
}

/* Row-major contiguous (so flat index == element offset - offset). */
static inline bool kcu_contiguous(const kcu_view *v)
{
    int64_t want = 1;
    for (int d = v->ndim - 1; d >= 0; d--) {
        if (v->shape[d] != 1 && v->strides[d] != want)
            return false;
        want *= v->shape[d];
    }
    return true;
}

#define KCU_GRID_LOOP(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (int64_t)gridDim.x * blockDim.x)

#define KCU_LAUNCHED() ((int)cudaGetLastError())

#endif /* KILN_CUDA_COMMON_CUH */
