/*
 * backends/cuda/cuda-elementwise.cu — fill, arange, copy, Philox draws, unary, binary,
 * where, the fused epilogue and the Adam step: one launch each.
 *
 * Every kernel is a grid-stride loop over the output's flat index. Strided operands
 * decompose the index over the output's shape (kcu_offset_in), after the launcher merged
 * the dims every operand steps through alike (kcu_coalesce); when every operand is
 * contiguous the division is skipped. f32 unary and binary ops over contiguous operands
 * take a vectorized path (four floats per load) — the case that decides bandwidth-bound
 * throughput.
 */
#include "cuda-math.cuh"

/* ------------------------------------------------------------------ fill, arange */

__global__ void k_fill(kcu_view out, int64_t n, double v, bool contig)
{
    KCU_GRID_LOOP(i, n)
    {
        int64_t o = contig ? out.offset + i : kcu_offset(out, i);
        kcu_store_d(out.base, out.dtype, o, v);
    }
}

__global__ void k_fill_int(kcu_view out, int64_t n, int64_t v, bool contig)
{
    KCU_GRID_LOOP(i, n)
    {
        int64_t o = contig ? out.offset + i : kcu_offset(out, i);
        kcu_store_i(out.base, out.dtype, o, v);
    }
}

extern "C" int kcu_fill(kcu_stream s, const kcu_view *out, double value)
{
    int64_t n = kcu_numel(out);
    if (n == 0)
        return 0;
    bool contig = kcu_contiguous(out);
    kcu_view o = *out;
    kcu_view *vs[1] = {&o};
    if (!contig)
        kcu_coalesce(vs, 1);
    if (kcu_is_float(out->dtype))
        k_fill<<<kcu_blocks(n), KCU_THREADS, 0, (cudaStream_t)s>>>(o, n, value, contig);
    else
        k_fill_int<<<kcu_blocks(n), KCU_THREADS, 0, (cudaStream_t)s>>>(
            o, n, value != value ? 0 : (int64_t)value, contig);
    return KCU_LAUNCHED();
}

__global__ void k_arange(kcu_view out, int64_t n, double start, double step, bool contig)
{
    KCU_GRID_LOOP(i, n)
    {
        int64_t o = contig ? out.offset + i : kcu_offset(out, i);
        double v = start + (double)i * step;
        if (kcu_is_float(out.dtype))
            kcu_store_d(out.base, out.dtype, o, v);
        else
            kcu_store_i(out.base, out.dtype, o, kcu_d2i(v));
    }
}

extern "C" int kcu_arange(kcu_stream s, const kcu_view *out, double start, double step)
{
    int64_t n = kcu_numel(out);
    if (n == 0)
        return 0;
    k_arange<<<kcu_blocks(n), KCU_THREADS, 0, (cudaStream_t)s>>>(*out, n, start, step, kcu_contiguous(out));
    return KCU_LAUNCHED();
}

/* --------------------------------------------------------------------- copy */

__global__ void k_copy(kcu_view out, kcu_view in, int64_t n)
{
    bool fo = kcu_is_float(out.dtype), fi = kcu_is_float(in.dtype);
    KCU_GRID_LOOP(i, n)
    {
        int64_t o = kcu_offset(out, i), s = kcu_offset_in(out, in, i);
        if (fo || fi)
            kcu_store_d(out.base, out.dtype, o, kcu_load_d(in.base, in.dtype, s));
        else
            kcu_store_i(out.base, out.dtype, o, kcu_load_i(in.base, in.dtype, s));
    }
}

/* A strided copy within one dtype: the bits move as they are (no trip through double), and a
 * contiguous output (the usual case: a view made contiguous, a head transpose) takes its
 * offset from the flat index directly; only the input's is decomposed. */
template <typename T>
__global__ void k_copy_same(kcu_view out, kcu_view in, int64_t n, bool out_contig)
{
    T *o = (T *)out.base;
    const T *src = (const T *)in.base;
    KCU_GRID_LOOP(i, n)
    {
        int64_t e = out_contig ? out.offset + i : kcu_offset(out, i);
        o[e] = src[kcu_offset_in(out, in, i)];
    }
}

static const int kcu_dtype_size[] = {4, 8, 2, 2, 8, 4, 1, 1};

extern "C" int kcu_copy(kcu_stream s, const kcu_view *out, const kcu_view *in)
{
    int64_t n = kcu_numel(out);
    if (n == 0)
        return 0;
    if (out->dtype == in->dtype && kcu_contiguous(out) && kcu_contiguous(in)) {
        size_t es = (size_t)kcu_dtype_size[out->dtype];
        return (int)cudaMemcpyAsync((char *)out->base + out->offset * es, (const char *)in->base + in->offset * es,
                                    (size_t)n * es, cudaMemcpyDeviceToDevice, (cudaStream_t)s);
    }
    kcu_view o = *out, i = *in;
    kcu_view *vs[2] = {&o, &i};
    kcu_coalesce(vs, 2);
    if (out->dtype == in->dtype) {
        bool oc = kcu_contiguous(&o);
        dim3 g(kcu_blocks(n)), b(KCU_THREADS);
        switch (kcu_dtype_size[out->dtype]) {
        case 1: k_copy_same<uint8_t><<<g, b, 0, (cudaStream_t)s>>>(o, i, n, oc); break;
        case 2: k_copy_same<uint16_t><<<g, b, 0, (cudaStream_t)s>>>(o, i, n, oc); break;
        case 4: k_copy_same<uint32_t><<<g, b, 0, (cudaStream_t)s>>>(o, i, n, oc); break;
        default: k_copy_same<uint64_t><<<g, b, 0, (cudaStream_t)s>>>(o, i, n, oc); break;
        }
        return KCU_LAUNCHED();
    }
    k_copy<<<kcu_blocks(n), KCU_THREADS, 0, (cudaStream_t)s>>>(o, i, n);
    return KCU_LAUNCHED();
}

/* ---------------------------------------------------------------------- rng */

__global__ void k_rng(int kind, kcu_view out, int64_t n, uint64_t seed, uint64_t offset, double p0,
                      double p1, int64_t lo, int64_t hi)
{
    KCU_GRID_LOOP(i, n)
    {
        uint64_t counter = offset + (uint64_t)i;
        int64_t o = out.offset + i; /* out is contiguous (backend.h) */
        switch (kind) {
        /* rounded multiply and add, never contracted into one fma: the draw must round as
         * the reference computes it (exact match) */
        case 0: kcu_store_d(out.base, out.dtype, o, __dadd_rn(p0, __dmul_rn(p1 - p0, kiln_rng_uniform01(counter, seed)))); break;
        case 1: kcu_store_d(out.base, out.dtype, o, p0 + p1 * kiln_rng_normal01(counter, seed)); break;
        case 2: kcu_store_i(out.base, out.dtype, o, kiln_rng_uniform01(counter, seed) < p0); break;
        default: kcu_store_i(out.base, out.dtype, o, kiln_rng_int(counter, seed, lo, hi)); break;
        }
    }
}

extern "C" int kcu_rng(kcu_stream s, int kind, const kcu_view *out, uint64_t seed, uint64_t offset,
                       double p0, double p1)
{
    int64_t n = kcu_numel(out);
    if (n == 0)
        return 0;
    int64_t lo = (int64_t)p0, hi = (int64_t)p1; /* the caller checked the range */
    k_rng<<<kcu_blocks(n), KCU_THREADS, 0, (cudaStream_t)s>>>(kind, *out, n, seed, offset, p0, p1, lo, hi);
    return KCU_LAUNCHED();
}

/* -------------------------------------------------------------------- unary */

__global__ void k_unary_f32_vec(int op, float *out, const float *in, int64_t n4, float alpha, float beta)
{
    KCU_GRID_LOOP(i, n4)
    {
        float4 v = ((const float4 *)in)[i];
        v.x = kcu_unary_fp<float>(op, v.x, alpha, beta);
        v.y = kcu_unary_fp<float>(op, v.y, alpha, beta);
        v.z = kcu_unary_fp<float>(op, v.z, alpha, beta);
        v.w = kcu_unary_fp<float>(op, v.w, alpha, beta);
        ((float4 *)out)[i] = v;
    }
}

__global__ void k_unary(int op, kcu_view out, kcu_view in, int64_t n, double alpha, double beta, bool contig)
{
    bool predicate = op == KU_ISNAN || op == KU_ISINF || op == KU_LOGICAL_NOT;
    bool in_float = kcu_is_float(in.dtype), out_float = kcu_is_float(out.dtype);
    KCU_GRID_LOOP(i, n)
    {
        int64_t o = contig ? out.offset + i : kcu_offset(out, i);
        int64_t s = contig ? in.offset + i : kcu_offset_in(out, in, i);
        if (predicate) {
            bool r;
            if (op == KU_LOGICAL_NOT)
                r = in_float ? kcu_load_d(in.base, in.dtype, s) == 0 : kcu_load_i(in.base, in.dtype, s) == 0;
            else if (!in_float)
                r = false;
            else if (op == KU_ISNAN)
                r = isnan(kcu_load_d(in.base, in.dtype, s));
            else
                r = isinf(kcu_load_d(in.base, in.dtype, s));
            kcu_store_i(out.base, out.dtype, o, r);
        } else if (out.dtype == KCU_F64) {
            kcu_store_d(out.base, out.dtype, o, kcu_unary_fp<double>(op, kcu_load_d(in.base, in.dtype, s), alpha, beta));
        } else if (out_float) {
            float r = kcu_unary_fp<float>(op, kcu_load_f(in.base, in.dtype, s), (float)alpha, (float)beta);
            kcu_store_d(out.base, out.dtype, o, r);
        } else {
            kcu_store_i(out.base, out.dtype, o, kcu_unary_int(op, kcu_load_i(in.base, in.dtype, s), alpha, beta));
        }
    }
}

static bool kcu_aligned16(const kcu_view *v)
{
    return (((uintptr_t)v->base + (uintptr_t)v->offset * 4) & 15) == 0;
}

extern "C" int kcu_unary(kcu_stream s, int op, const kcu_view *out, const kcu_view *in, double alpha, double beta)
{
    int64_t n = kcu_numel(out);
    if (n == 0)
        return 0;
    bool contig = kcu_contiguous(out) && kcu_contiguous(in);
    if (contig && out->dtype == KCU_F32 && in->dtype == KCU_F32 && op < KU_ISNAN && n % 4 == 0 &&
        kcu_aligned16(out) && kcu_aligned16(in)) {
        k_unary_f32_vec<<<kcu_blocks(n / 4), KCU_THREADS, 0, (cudaStream_t)s>>>(
            op, (float *)out->base + out->offset, (const float *)in->base + in->offset, n / 4, (float)alpha,
            (float)beta);
        return KCU_LAUNCHED();
    }
    kcu_view o = *out, i = *in;
    kcu_view *vs[2] = {&o, &i};
    if (!contig)
        kcu_coalesce(vs, 2);
    k_unary<<<kcu_blocks(n), KCU_THREADS, 0, (cudaStream_t)s>>>(op, o, i, n, alpha, beta, contig);
    return KCU_LAUNCHED();
}

/* ------------------------------------------------------------------- binary */

__global__ void k_binary_f32_vec(int op, float *out, const float *a, const float *b, int64_t n4)
{
    KCU_GRID_LOOP(i, n4)
    {
        float4 x = ((const float4 *)a)[i], y = ((const float4 *)b)[i];
        x.x = kcu_binary_fp<float>(op, x.x, y.x);
        x.y = kcu_binary_fp<float>(op, x.y, y.y);
        x.z = kcu_binary_fp<float>(op, x.z, y.z);
        x.w = kcu_binary_fp<float>(op, x.w, y.w);
        ((float4 *)out)[i] = x;
    }
}

__device__ __forceinline__ bool kcu_truth(const kcu_view &v, int64_t e)
{
    return kcu_is_float(v.dtype) ? kcu_load_d(v.base, v.dtype, e) != 0 : kcu_load_i(v.base, v.dtype, e) != 0;
}

__global__ void k_binary(int op, kcu_view out, kcu_view a, kcu_view b, int64_t n, bool contig)
{
    bool compare = op >= KB_EQ && op <= KB_GE, logical = op >= KB_LOGICAL_AND;
    bool in_float = kcu_is_float(a.dtype) || kcu_is_float(b.dtype);
    bool out_float = kcu_is_float(out.dtype);
    KCU_GRID_LOOP(i, n)
    {
        int64_t o = contig ? out.offset + i : kcu_offset(out, i);
        int64_t sa = contig ? a.offset + i : kcu_offset_in(out, a, i);
        int64_t sb = contig ? b.offset + i : kcu_offset_in(out, b, i);
        if (compare) {
            int c;
            if (in_float) {
                double x = kcu_load_d(a.base, a.dtype, sa), y = kcu_load_d(b.base, b.dtype, sb);
                c = x < y ? -1 : x > y ? 1 : x == y ? 0 : 2;
            } else {
                int64_t x = kcu_load_i(a.base, a.dtype, sa), y = kcu_load_i(b.base, b.dtype, sb);
                c = x < y ? -1 : x > y ? 1 : 0;
            }
            bool r = op == KB_EQ ? c == 0 : op == KB_NE ? c != 0 : op == KB_LT ? c == -1
                   : op == KB_LE ? (c == -1 || c == 0) : op == KB_GT ? c == 1 : (c == 1 || c == 0);
            kcu_store_i(out.base, out.dtype, o, r);
        } else if (logical) {
            bool x = kcu_truth(a, sa), y = kcu_truth(b, sb);
            bool r = op == KB_LOGICAL_AND ? (x && y) : op == KB_LOGICAL_OR ? (x || y) : (x != y);
            kcu_store_i(out.base, out.dtype, o, r);
        } else if (out.dtype == KCU_F64) {
            kcu_store_d(out.base, out.dtype, o,
                        kcu_binary_fp<double>(op, kcu_load_d(a.base, a.dtype, sa), kcu_load_d(b.base, b.dtype, sb)));
        } else if (out_float) {
            float r = kcu_binary_fp<float>(op, kcu_load_f(a.base, a.dtype, sa), kcu_load_f(b.base, b.dtype, sb));
            kcu_store_d(out.base, out.dtype, o, r);
        } else {
            kcu_store_i(out.base, out.dtype, o,
                        kcu_binary_int(op, kcu_load_i(a.base, a.dtype, sa), kcu_load_i(b.base, b.dtype, sb)));
        }
    }
}

extern "C" int kcu_binary(kcu_stream s, int op, const kcu_view *out, const kcu_view *a, const kcu_view *b)
{
    int64_t n = kcu_numel(out);
    if (n == 0)
        return 0;
    bool contig = kcu_contiguous(out) && kcu_contiguous(a) && kcu_contiguous(b);
    if (contig && out->dtype == KCU_F32 && a->dtype == KCU_F32 && b->dtype == KCU_F32 && op <= KB_MINIMUM &&
        n % 4 == 0 && kcu_aligned16(out) && kcu_aligned16(a) && kcu_aligned16(b)) {
        k_binary_f32_vec<<<kcu_blocks(n / 4), KCU_THREADS, 0, (cudaStream_t)s>>>(
            op, (float *)out->base + out->offset, (const float *)a->base + a->offset,
            (const float *)b->base + b->offset, n / 4);
        return KCU_LAUNCHED();
    }
    kcu_view o = *out, x = *a, y = *b;
    kcu_view *vs[3] = {&o, &x, &y};
    if (!contig)
        kcu_coalesce(vs, 3);
    k_binary<<<kcu_blocks(n), KCU_THREADS, 0, (cudaStream_t)s>>>(op, o, x, y, n, contig);
    return KCU_LAUNCHED();
}

/* -------------------------------------------------------------------- where */

__global__ void k_where(kcu_view out, kcu_view cond, kcu_view a, kcu_view b, int64_t n)
{
    bool fo = kcu_is_float(out.dtype);
    KCU_GRID_LOOP(i, n)
    {
        int64_t o = kcu_offset(out, i);
        bool c = kcu_truth(cond, kcu_offset_in(out, cond, i));
        const kcu_view &src = c ? a : b;
        int64_t e = kcu_offset_in(out, src, i);
        if (fo)
            kcu_store_d(out.base, out.dtype, o, kcu_load_d(src.base, src.dtype, e));
        else
            kcu_store_i(out.base, out.dtype, o, kcu_load_i(src.base, src.dtype, e));
    }
}

extern "C" int kcu_where(kcu_stream s, const kcu_view *out, const kcu_view *cond, const kcu_view *a,
                         const kcu_view *b)
{
    int64_t n = kcu_numel(out);
    if (n == 0)
        return 0;
    kcu_view o = *out, c = *cond, x = *a, y = *b;
    kcu_view *vs[4] = {&o, &c, &x, &y};
    kcu_coalesce(vs, 4);
    k_where<<<kcu_blocks(n), KCU_THREADS, 0, (cudaStream_t)s>>>(o, c, x, y, n);
    return KCU_LAUNCHED();
}

/* ----------------------------------------------------------------- epilogue */

/* kiln_epilogue_act values */
enum { KE_NONE = 0, KE_RELU, KE_LEAKY_RELU, KE_CLAMP, KE_HARD_SIGMOID, KE_HARD_SWISH, KE_SIGMOID };

template <typename T> __device__ __forceinline__ T kcu_act(int act, T x, T alpha, T beta)
{
    switch (act) {
    case KE_RELU: return x < T(0) ? T(0) : x;
    case KE_LEAKY_RELU: return x > T(0) ? x : alpha * x;
    case KE_CLAMP:
        if (x != x)
            return x;
        x = x < alpha ? alpha : x;
        return x > beta ? beta : x;
    case KE_HARD_SIGMOID: {
        T y = x * alpha;
        y = y + beta;
        return y != y ? y : (y < T(0) ? T(0) : (y > T(1) ? T(1) : y));
    }
    case KE_HARD_SWISH: {
        T y = x * T(1.0 / 6.0);
        y = y + T(0.5);
        y = y != y ? y : (y < T(0) ? T(0) : (y > T(1) ? T(1) : y));
        return x * y;
    }
    case KE_SIGMOID: return T(1) / (T(1) + exp(-x));
    default: return x;
    }
}

__global__ void k_epilogue(kcu_view out, int64_t n, int64_t ncols, kcu_view bias, kcu_view res, int act,
                           double alpha, double beta)
{
    KCU_GRID_LOOP(i, n)
    {
        int64_t o = out.offset + i;
        if (out.dtype == KCU_F64) {
            double x = kcu_load_d(out.base, out.dtype, o);
            if (bias.base)
                x = x + kcu_load_d(bias.base, bias.dtype, bias.offset + i % ncols);
            if (res.base)
                x = x + kcu_load_d(res.base, res.dtype, res.offset + i);
            kcu_store_d(out.base, out.dtype, o, kcu_act<double>(act, x, alpha, beta));
        } else {
            float x = kcu_load_f(out.base, out.dtype, o);
            if (bias.base)
                x = x + kcu_load_f(bias.base, bias.dtype, bias.offset + i % ncols);
            if (res.base)
                x = x + kcu_load_f(res.base, res.dtype, res.offset + i);
            kcu_store_d(out.base, out.dtype, o, kcu_act<float>(act, x, (float)alpha, (float)beta));
        }
    }
}

extern "C" int kcu_epilogue(kcu_stream s, const kcu_view *out, int64_t ncols, const kcu_view *bias,
                            const kcu_view *residual, int act, double alpha, double beta)
{
    int64_t n = kcu_numel(out);
    if (n == 0)
        return 0;
    k_epilogue<<<kcu_blocks(n), KCU_THREADS, 0, (cudaStream_t)s>>>(*out, n, ncols > 0 ? ncols : 1, *bias,
                                                                   *residual, act, alpha, beta);
    return KCU_LAUNCHED();
}

__global__ void k_channel_bias(kcu_view out, kcu_view bias, int64_t n, int64_t channels, int64_t plane)
{
    KCU_GRID_LOOP(i, n)
    {
        int64_t c = (i / plane) % channels;
        int64_t o = out.offset + i;
        if (out.dtype == KCU_F64)
            kcu_store_d(out.base, out.dtype, o,
                        kcu_load_d(out.base, out.dtype, o) + kcu_load_d(bias.base, bias.dtype, kcu_offset(bias, c)));
        else
            kcu_store_d(out.base, out.dtype, o,
                        kcu_load_f(out.base, out.dtype, o) + kcu_load_f(bias.base, bias.dtype, kcu_offset(bias, c)));
    }
}

extern "C" int kcu_channel_bias(kcu_stream s, const kcu_view *out, const kcu_view *bias, int64_t channels,
                                int64_t plane)
{
    int64_t n = kcu_numel(out);
    if (n == 0 || channels == 0 || plane == 0)
        return 0;
    k_channel_bias<<<kcu_blocks(n), KCU_THREADS, 0, (cudaStream_t)s>>>(*out, *bias, n, channels, plane);
    return KCU_LAUNCHED();
}

/* A convolution's epilogue, one pass over its contiguous output: out = act(out + bias[c] +
 * residual), c the channel (dim 1), residual contiguous of out's shape. The additions round in
 * the unfused ops' order (bias, then residual), so the result equals conv + add + act to the
 * bit. Indices in 32 bits when they fit: the channel's division is the costly part. */
template <typename I>
__global__ void k_conv_epilogue(float *out, const float *bias, const float *res, I n, I channels, I plane, int act,
                                float alpha, float beta)
{
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        float x = out[i];
        if (bias)
            x = x + bias[(i / plane) % channels];
        if (res)
            x = x + res[i];
        out[i] = kcu_act<float>(act, x, alpha, beta);
    }
}

extern "C" int kcu_conv_epilogue(kcu_stream s, const kcu_view *out, const kcu_view *bias, const kcu_view *residual,
                                 int64_t channels, int64_t plane, int act, double alpha, double beta)
{
    int64_t n = kcu_numel(out);
    if (n == 0 || channels == 0 || plane == 0)
        return 0;
    float *o = (float *)out->base + out->offset;
    const float *b = bias->base ? (const float *)bias->base + bias->offset : NULL;
    const float *r = residual->base ? (const float *)residual->base + residual->offset : NULL;
    if (n <= INT32_MAX)
        k_conv_epilogue<uint32_t><<<kcu_blocks(n), KCU_THREADS, 0, (cudaStream_t)s>>>(
            o, b, r, (uint32_t)n, (uint32_t)channels, (uint32_t)plane, act, (float)alpha, (float)beta);
    else
        k_conv_epilogue<int64_t><<<kcu_blocks(n), KCU_THREADS, 0, (cudaStream_t)s>>>(o, b, r, n, channels, plane, act,
                                                                                     (float)alpha, (float)beta);
    return KCU_LAUNCHED();
}

/* --------------------------------------------------------------------- adam */

__global__ void k_adam(int dt, int64_t n, void *param, const void *grad, void *m, void *v, void *vmax,
                       double beta1, double beta2, double eps, double wd, double param_scale,
                       double step_size, double inv_bc2_sqrt, bool decoupled, bool amsgrad, bool maximize)
{
    /* Every intermediate is rounded to the parameter's dtype where the reference rounds it
     * (one primitive per step), so overflow behaves as in that dtype: g * g of a 1e30 f32
     * gradient is inf, as in PyTorch, not 1e60. */
    bool f32 = dt != KCU_F64;
#define RD(e) (f32 ? (double)(float)(e) : (e))
    bool l2 = !decoupled && wd != 0, scale = decoupled && wd != 0;
    KCU_GRID_LOOP(i, n)
    {
        double p = kcu_load_d(param, dt, i), g = kcu_load_d(grad, dt, i);
        if (maximize)
            g = -g;
        if (scale)
            p = RD(p * param_scale);
        if (l2)
            g = RD(g + RD(p * wd));
        double mi = kcu_load_d(m, dt, i), vi = kcu_load_d(v, dt, i);
        mi = RD(mi + RD(RD(g - mi) * (1 - beta1)));
        vi = RD(RD(vi * beta2) + RD(RD(g * g) * (1 - beta2)));
        double sv = vi;
        if (amsgrad) {
            double vm = kcu_load_d(vmax, dt, i);
            vm = (vm != vm || vi != vi) ? (double)NAN : (vi > vm ? vi : vm);
            kcu_store_d(vmax, dt, i, vm);
            sv = vm;
        }
        double denom = RD(RD(RD(sqrt(sv)) * inv_bc2_sqrt) + eps);
        p = RD(p + RD(RD(mi / denom) * -step_size));
        kcu_store_d(m, dt, i, mi);
        kcu_store_d(v, dt, i, vi);
        kcu_store_d(param, dt, i, p);
    }
#undef RD
}

extern "C" int kcu_adam(kcu_stream s, int dtype, int64_t n, void *param, const void *grad, void *m, void *v,
                        void *vmax, double beta1, double beta2, double eps, double weight_decay,
                        double param_scale, double step_size, double inv_bc2_sqrt, bool decoupled,
                        bool amsgrad, bool maximize)
{
    if (n == 0)
        return 0;
    k_adam<<<kcu_blocks(n), KCU_THREADS, 0, (cudaStream_t)s>>>(dtype, n, param, grad, m, v, vmax, beta1, beta2,
                                                                eps, weight_decay, param_scale, step_size,
                                                                inv_bc2_sqrt, decoupled, amsgrad, maximize);
    return KCU_LAUNCHED();
}

extern "C" const char *kcu_error_string(int status)
{
    return cudaGetErrorString((cudaError_t)status);
}
