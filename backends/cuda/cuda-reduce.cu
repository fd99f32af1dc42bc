/*
 * backends/cuda/cuda-reduce.cu — reductions, arg-reductions, cumsum, softmax, layer norm
 * and sort: the ops that combine many elements into one, one launch each.
 *
 * Each output element (or lane, or row) gets one block of KCU_THREADS threads, which
 * strides over its elements and combines through shared memory; a grid-stride loop over
 * outputs covers more outputs than blocks. Floating reductions accumulate in double, as
 * the ref oracle does, so sums of many f32 values agree with it closely; integer sums
 * and products wrap in int64. Conventions are the ref backend's (backends/ref/ref-reduce.c):
 * NaN wins max/min and argmax/argmin (the first NaN), var divides by max(0, N - correction),
 * logsumexp of all -inf is -inf, sort is stable with NaN after every number.
 */
#include "cuda-math.cuh"

enum { KR_SUM = 0, KR_MEAN, KR_PROD, KR_MAX, KR_MIN, KR_VAR, KR_STD, KR_LOGSUMEXP, KR_NORM, KR_ANY, KR_ALL };

/* Tree-combines v over the block; every thread gets the result. op: 0 sum, 1 prod,
 * 2 max, 3 min (NaN winning). */
__device__ double kcu_block_combine_d(double v, int op)
{
    __shared__ double sh[KCU_THREADS];
    int t = threadIdx.x;
    __syncthreads(); /* sh may still be read from a previous call */
    sh[t] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) {
            double a = sh[t], b = sh[t + s];
            double r;
            switch (op) {
            case 0: r = a + b; break;
            case 1: r = a * b; break;
            case 2: r = (a != a) ? a : (b != b) ? b : (b > a ? b : a); break;
            default: r = (a != a) ? a : (b != b) ? b : (b < a ? b : a); break;
            }
            sh[t] = r;
        }
        __syncthreads();
    }
    return sh[0];
}

__device__ int64_t kcu_block_combine_i(int64_t v, int op)
{
    __shared__ int64_t sh[KCU_THREADS];
    int t = threadIdx.x;
    __syncthreads();
    sh[t] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) {
            int64_t a = sh[t], b = sh[t + s];
            sh[t] = op == 0 ? kcu_wadd(a, b) : op == 1 ? kcu_wmul(a, b) : op == 2 ? (b > a ? b : a) : (b < a ? b : a);
        }
        __syncthreads();
    }
    return sh[0];
}

/* ------------------------------------------------------------------- reduce */

/* outer: the kept dims (in's strides), inner: the reduced dims (in's strides). */
__global__ void k_reduce(int op, kcu_view out, kcu_view outer, kcu_view inner, int64_t nout, int64_t rn,
                         double param, bool int_path)
{
    for (int64_t o = blockIdx.x; o < nout; o += gridDim.x) {
        int64_t base = kcu_offset(outer, o) - outer.offset + inner.offset;
        int64_t oe = kcu_offset(out, o);
        if (int_path) {
            int cop = op == KR_SUM ? 0 : op == KR_PROD ? 1 : op == KR_MAX ? 2 : 3;
            int64_t acc = cop == 1 ? 1 : 0;
            bool have = false;
            for (int64_t j = threadIdx.x; j < rn; j += blockDim.x) {
                int64_t v = kcu_load_i(inner.base, inner.dtype, base + kcu_offset(inner, j) - inner.offset);
                if (cop == 0)
                    acc = kcu_wadd(acc, v);
                else if (cop == 1)
                    acc = kcu_wmul(acc, v);
                else if (!have)
                    acc = v;
                else
                    acc = cop == 2 ? (v > acc ? v : acc) : (v < acc ? v : acc);
                have = true;
            }
            if (!have && cop >= 2) /* idle thread: a neutral value */
                acc = cop == 2 ? INT64_MIN : INT64_MAX;
            int64_t r = kcu_block_combine_i(acc, cop);
            if (threadIdx.x == 0)
                kcu_store_i(out.base, out.dtype, oe, r);
            continue;
        }
        double r;
        if (op == KR_MAX || op == KR_MIN) {
            double acc = op == KR_MAX ? -INFINITY : INFINITY;
            for (int64_t j = threadIdx.x; j < rn; j += blockDim.x) {
                double v = kcu_load_d(inner.base, inner.dtype, base + kcu_offset(inner, j) - inner.offset);
                if (acc == acc && (v != v || (op == KR_MAX ? v > acc : v < acc)))
                    acc = v;
            }
            r = kcu_block_combine_d(acc, op == KR_MAX ? 2 : 3);
        } else if (op == KR_PROD) {
            double acc = 1;
            for (int64_t j = threadIdx.x; j < rn; j += blockDim.x)
                acc *= kcu_load_d(inner.base, inner.dtype, base + kcu_offset(inner, j) - inner.offset);
            r = kcu_block_combine_d(acc, 1);
        } else if (op == KR_LOGSUMEXP) {
            double m = -INFINITY;
            for (int64_t j = threadIdx.x; j < rn; j += blockDim.x) {
                double v = kcu_load_d(inner.base, inner.dtype, base + kcu_offset(inner, j) - inner.offset);
                if (m == m && (v != v || v > m))
                    m = v;
            }
            m = kcu_block_combine_d(m, 2);
            if (m != m) {
                r = m;
            } else {
                /* a max of +-inf or NaN makes the whole lane NaN, as the reference and PyTorch do */
        double shift = m;
                double s = 0;
                for (int64_t j = threadIdx.x; j < rn; j += blockDim.x)
                    s += exp(kcu_load_d(inner.base, inner.dtype, base + kcu_offset(inner, j) - inner.offset) - shift);
                r = log(kcu_block_combine_d(s, 0)) + shift;
            }
        } else if (op == KR_NORM && isinf(param)) {
            bool pos = param > 0;
            double acc = pos ? 0.0 : INFINITY;
            for (int64_t j = threadIdx.x; j < rn; j += blockDim.x) {
                double a = fabs(kcu_load_d(inner.base, inner.dtype, base + kcu_offset(inner, j) - inner.offset));
                if (acc == acc && (a != a || (pos ? a > acc : a < acc)))
                    acc = a;
            }
            r = rn == 0 ? 0.0 : kcu_block_combine_d(acc, pos ? 2 : 3);
        } else if (op == KR_ANY || op == KR_ALL) {
            double acc = 0; /* count of nonzero (any) or zero (all) elements */
            for (int64_t j = threadIdx.x; j < rn; j += blockDim.x) {
                double v = kcu_load_d(inner.base, inner.dtype, base + kcu_offset(inner, j) - inner.offset);
                acc += op == KR_ANY ? (v != 0) : (v == 0);
            }
            acc = kcu_block_combine_d(acc, 0);
            r = op == KR_ANY ? (acc > 0) : (acc == 0);
        } else {
            /* sum, mean, var, std, norm p: a sum of a per-element term */
            double s = 0;
            for (int64_t j = threadIdx.x; j < rn; j += blockDim.x) {
                double v = kcu_load_d(inner.base, inner.dtype, base + kcu_offset(inner, j) - inner.offset);
                if (op == KR_NORM) {
                    double a = fabs(v);
                    v = param == 0 ? (double)(v != 0) : param == 1 ? a : param == 2 ? a * a : pow(a, param);
                }
                s += v;
            }
            s = kcu_block_combine_d(s, 0);
            if (op == KR_SUM) {
                r = s;
            } else if (op == KR_MEAN) {
                r = s / (double)rn;
            } else if (op == KR_NORM) {
                r = param == 0 || param == 1 ? s : param == 2 ? sqrt(s) : pow(s, 1.0 / param);
            } else {
                double mean = s / (double)rn, m2 = 0;
                for (int64_t j = threadIdx.x; j < rn; j += blockDim.x) {
                    double d = kcu_load_d(inner.base, inner.dtype, base + kcu_offset(inner, j) - inner.offset) - mean;
                    m2 += d * d;
                }
                m2 = kcu_block_combine_d(m2, 0);
                double denom = (double)rn - param;
                double var = m2 / (denom > 0 ? denom : 0.0);
                r = op == KR_VAR ? var : sqrt(var);
            }
        }
        if (threadIdx.x == 0)
            kcu_store_d(out.base, out.dtype, oe, r);
    }
}

static unsigned kcu_rows_grid(int64_t rows)
{
    return (unsigned)(rows < 1 ? 1 : rows > 65535 * 8 ? 65535 * 8 : rows);
}

/* A float sum or mean with few outputs and long reductions (a convolution's bias gradient:
 * [N, C, H, W] summed over N, H and W, C outputs of N*H*W elements each) would run on only
 * C blocks, a fraction of the GPU; it splits each output's reduction over several blocks
 * instead, each writing a partial sum (in double, as the one-block path accumulates), and a
 * second pass adds each output's partials in order (deterministic, like the one-block path). */
#define KR_SPLIT_BLOCKS 1024  /* about eight blocks per SM on an H100 */
#define KR_SPLIT_MIN_CHUNK 4096 /* elements a block reduces at the least */

static bool kcu_reduce_splittable(int op, const kcu_view *out, const kcu_view *in)
{
    return (op == KR_SUM || op == KR_MEAN) && kcu_is_float(in->dtype) && kcu_is_float(out->dtype);
}

extern "C" int64_t kcu_reduce_splits(int op, const kcu_view *out, const kcu_view *in, uint32_t mask)
{
    if (!kcu_reduce_splittable(op, out, in))
        return 1;
    int64_t rn = 1;
    for (int d = 0; d < in->ndim; d++)
        if ((mask >> d) & 1u)
            rn *= in->shape[d];
    int64_t nout = kcu_numel(out);
    if (nout == 0 || nout >= KR_SPLIT_BLOCKS / 2 || rn < 2 * KR_SPLIT_MIN_CHUNK)
        return 1;
    int64_t want = (KR_SPLIT_BLOCKS + nout - 1) / nout, most = rn / KR_SPLIT_MIN_CHUNK;
    int64_t splits = want < most ? want : most;
    return splits > 65535 ? 65535 : splits;
}

__global__ void k_reduce_partial(kcu_view outer, kcu_view inner, int64_t rn, int64_t chunk, double *partials)
{
    int64_t o = blockIdx.x, y = blockIdx.y;
    int64_t base = kcu_offset(outer, o) - outer.offset + inner.offset;
    int64_t lo = y * chunk, hi = lo + chunk < rn ? lo + chunk : rn;
    double s = 0;
    for (int64_t j = lo + threadIdx.x; j < hi; j += blockDim.x)
        s += kcu_load_d(inner.base, inner.dtype, base + kcu_offset(inner, j) - inner.offset);
    s = kcu_block_combine_d(s, 0);
    if (threadIdx.x == 0)
        partials[o * gridDim.y + y] = s;
}

__global__ void k_reduce_finish(int op, kcu_view out, int64_t nout, int64_t rn, int64_t splits,
                                const double *partials)
{
    KCU_GRID_LOOP(o, nout)
    {
        double s = 0;
        for (int64_t y = 0; y < splits; y++)
            s += partials[o * splits + y];
        kcu_store_d(out.base, out.dtype, kcu_offset(out, o), op == KR_MEAN ? s / (double)rn : s);
    }
}

extern "C" int kcu_reduce(kcu_stream s, int op, const kcu_view *out, const kcu_view *in, uint32_t mask, double param,
                          double *partials)
{
    kcu_view outer = *in, inner = *in;
    int64_t rn = 1;
    for (int d = 0; d < in->ndim; d++) {
        bool red = (mask >> d) & 1u;
        outer.shape[d] = red ? 1 : in->shape[d];
        inner.shape[d] = red ? in->shape[d] : 1;
        rn *= inner.shape[d];
    }
    int64_t nout = kcu_numel(out);
    if (nout == 0)
        return 0;
    int64_t splits = partials ? kcu_reduce_splits(op, out, in, mask) : 1;
    bool int_path = !kcu_is_float(in->dtype) && !kcu_is_float(out->dtype) &&
                    (op == KR_SUM || op == KR_PROD || op == KR_MAX || op == KR_MIN);
    /* each index space on its own: the kept dims (outer and out) and the reduced ones */
    kcu_view o = *out;
    kcu_view *vo[1] = {&o}, *vouter[1] = {&outer}, *vinner[1] = {&inner};
    kcu_coalesce(vo, 1);
    kcu_coalesce(vouter, 1);
    kcu_coalesce(vinner, 1);
    if (splits > 1) {
        int64_t chunk = (rn + splits - 1) / splits;
        dim3 grid((unsigned)nout, (unsigned)splits);
        k_reduce_partial<<<grid, KCU_THREADS, 0, (cudaStream_t)s>>>(outer, inner, rn, chunk, partials);
        int e = KCU_LAUNCHED();
        if (e)
            return e;
        k_reduce_finish<<<kcu_blocks(nout), KCU_THREADS, 0, (cudaStream_t)s>>>(op, o, nout, rn, splits, partials);
        return KCU_LAUNCHED();
    }
    k_reduce<<<kcu_rows_grid(nout), KCU_THREADS, 0, (cudaStream_t)s>>>(op, o, outer, inner, nout, rn, param,
                                                                        int_path);
    return KCU_LAUNCHED();
}

/* ---------------------------------------------------------- lanes along a dim */

/* The view of every lane's first element: shape with dim set to 1. */
static kcu_view kcu_lanes(const kcu_view *v, int dim)
{
    kcu_view l = *v;
    if (l.ndim > 0)
        l.shape[dim] = 1;
    return l;
}

__global__ void k_arg_reduce(bool is_max, kcu_view out, kcu_view lanes_in, kcu_view lanes_out, int64_t nlanes,
                             int64_t len, int64_t step)
{
    __shared__ double shv[KCU_THREADS];
    __shared__ int64_t shi[KCU_THREADS];
    bool fl = kcu_is_float(lanes_in.dtype);
    for (int64_t l = blockIdx.x; l < nlanes; l += gridDim.x) {
        int64_t base = kcu_offset(lanes_in, l);
        double best = 0;
        int64_t bi = -1;
        for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
            double v = fl ? kcu_load_d(lanes_in.base, lanes_in.dtype, base + j * step)
                          : (double)kcu_load_i(lanes_in.base, lanes_in.dtype, base + j * step);
            if (bi < 0 || (best == best && (v != v || (is_max ? v > best : v < best)))) {
                best = v;
                bi = j;
            }
        }
        __syncthreads();
        shv[threadIdx.x] = best;
        shi[threadIdx.x] = bi;
        __syncthreads();
        for (int s2 = blockDim.x / 2; s2 > 0; s2 >>= 1) {
            if (threadIdx.x < s2) {
                double a = shv[threadIdx.x], b = shv[threadIdx.x + s2];
                int64_t ia = shi[threadIdx.x], ib = shi[threadIdx.x + s2];
                bool take_b;
                if (ib < 0)
                    take_b = false;
                else if (ia < 0)
                    take_b = true;
                else if (a != a)
                    take_b = b != b && ib < ia;
                else if (b != b)
                    take_b = true;
                else
                    take_b = (is_max ? b > a : b < a) || (b == a && ib < ia);
                if (take_b) {
                    shv[threadIdx.x] = b;
                    shi[threadIdx.x] = ib;
                }
            }
            __syncthreads();
        }
        if (threadIdx.x == 0)
            kcu_store_i(out.base, out.dtype, kcu_offset(lanes_out, l), shi[0] < 0 ? 0 : shi[0]);
    }
}

/* Integer lanes compare through double above, exact below 2^53; wider i64 values are
 * rare enough in argmax inputs that the approximation is documented, not special-cased. */
extern "C" int kcu_arg_reduce(kcu_stream s, bool is_max, const kcu_view *out, const kcu_view *in, int dim)
{
    kcu_view li = kcu_lanes(in, dim), lo = kcu_lanes(out, dim);
    int64_t nlanes = kcu_numel(&li);
    if (nlanes == 0)
        return 0;
    int64_t len = in->ndim ? in->shape[dim] : 1, step = in->ndim ? in->strides[dim] : 0;
    k_arg_reduce<<<kcu_rows_grid(nlanes), KCU_THREADS, 0, (cudaStream_t)s>>>(is_max, *out, li, lo, nlanes, len,
                                                                             step);
    return KCU_LAUNCHED();
}

__global__ void k_cumsum(kcu_view out, kcu_view lanes_in, kcu_view lanes_out, int64_t nlanes, int64_t len,
                         int64_t istep, int64_t ostep)
{
    bool fl = kcu_is_float(out.dtype);
    KCU_GRID_LOOP(l, nlanes)
    {
        int64_t ib = kcu_offset(lanes_in, l), ob = kcu_offset(lanes_out, l);
        double fs = 0;
        int64_t is = 0;
        for (int64_t j = 0; j < len; j++) {
            if (fl) {
                fs += kcu_load_d(lanes_in.base, lanes_in.dtype, ib + j * istep);
                kcu_store_d(out.base, out.dtype, ob + j * ostep, fs);
            } else {
                is = kcu_wadd(is, kcu_load_i(lanes_in.base, lanes_in.dtype, ib + j * istep));
                kcu_store_i(out.base, out.dtype, ob + j * ostep, is);
            }
        }
    }
}

extern "C" int kcu_cumsum(kcu_stream s, const kcu_view *out, const kcu_view *in, int dim)
{
    kcu_view li = kcu_lanes(in, dim), lo = kcu_lanes(out, dim);
    int64_t nlanes = kcu_numel(&li);
    if (nlanes == 0 || kcu_numel(out) == 0)
        return 0;
    int64_t len = in->ndim ? in->shape[dim] : 1;
    k_cumsum<<<kcu_blocks(nlanes), KCU_THREADS, 0, (cudaStream_t)s>>>(
        *out, li, lo, nlanes, len, in->ndim ? in->strides[dim] : 0, out->ndim ? out->strides[dim] : 0);
    return KCU_LAUNCHED();
}

/* ------------------------------------------------------------------ softmax */

__global__ void k_softmax(bool log_, kcu_view out, kcu_view lanes_in, kcu_view lanes_out, int64_t nlanes,
                          int64_t len, int64_t istep, int64_t ostep)
{
    for (int64_t l = blockIdx.x; l < nlanes; l += gridDim.x) {
        int64_t ib = kcu_offset(lanes_in, l), ob = kcu_offset(lanes_out, l);
        double m = -INFINITY;
        for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
            double v = kcu_load_d(lanes_in.base, lanes_in.dtype, ib + j * istep);
            if (m == m && (v != v || v > m))
                m = v;
        }
        m = kcu_block_combine_d(m, 2);
        /* a max of +-inf or NaN makes the whole lane NaN, as the reference and PyTorch do */
        double shift = m;
        double sum = 0;
        for (int64_t j = threadIdx.x; j < len; j += blockDim.x)
            sum += exp(kcu_load_d(lanes_in.base, lanes_in.dtype, ib + j * istep) - shift);
        sum = kcu_block_combine_d(sum, 0);
        double lse = log(sum);
        for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
            double x = kcu_load_d(lanes_in.base, lanes_in.dtype, ib + j * istep) - shift;
            kcu_store_d(out.base, out.dtype, ob + j * ostep, log_ ? x - lse : exp(x) / sum);
        }
    }
}

extern "C" int kcu_softmax(kcu_stream s, bool log, const kcu_view *out, const kcu_view *in, int dim)
{
    kcu_view li = kcu_lanes(in, dim), lo = kcu_lanes(out, dim);
    int64_t nlanes = kcu_numel(&li);
    if (nlanes == 0 || kcu_numel(out) == 0)
        return 0;
    int64_t len = in->ndim ? in->shape[dim] : 1;
    k_softmax<<<kcu_rows_grid(nlanes), KCU_THREADS, 0, (cudaStream_t)s>>>(
        log, *out, li, lo, nlanes, len, in->ndim ? in->strides[dim] : 0, out->ndim ? out->strides[dim] : 0);
    return KCU_LAUNCHED();
}

/* --------------------------------------------------------------- layer norm */

__global__ void k_layer_norm(kcu_view out, kcu_view mean, kcu_view rstd, kcu_view x, kcu_view w, kcu_view b,
                             int64_t rows, int64_t inner, double eps)
{
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        double s = 0;
        for (int64_t j = threadIdx.x; j < inner; j += blockDim.x)
            s += kcu_load_d(x.base, x.dtype, kcu_offset(x, r * inner + j));
        double mu = kcu_block_combine_d(s, 0) / (double)inner;
        double m2 = 0;
        for (int64_t j = threadIdx.x; j < inner; j += blockDim.x) {
            double d = kcu_load_d(x.base, x.dtype, kcu_offset(x, r * inner + j)) - mu;
            m2 += d * d;
        }
        double rs = 1.0 / sqrt(kcu_block_combine_d(m2, 0) / (double)inner + eps);
        for (int64_t j = threadIdx.x; j < inner; j += blockDim.x) {
            double y = (kcu_load_d(x.base, x.dtype, kcu_offset(x, r * inner + j)) - mu) * rs;
            if (w.base)
                y *= kcu_load_d(w.base, w.dtype, kcu_offset(w, j));
            if (b.base)
                y += kcu_load_d(b.base, b.dtype, kcu_offset(b, j));
            kcu_store_d(out.base, out.dtype, kcu_offset(out, r * inner + j), y);
        }
        if (threadIdx.x == 0) {
            if (mean.base)
                kcu_store_d(mean.base, mean.dtype, kcu_offset(mean, r), mu);
            if (rstd.base)
                kcu_store_d(rstd.base, rstd.dtype, kcu_offset(rstd, r), rs);
        }
    }
}

extern "C" int kcu_layer_norm(kcu_stream s, const kcu_view *out, const kcu_view *mean, const kcu_view *rstd,
                              const kcu_view *x, const kcu_view *weight, const kcu_view *bias, int64_t inner,
                              double eps)
{
    int64_t n = kcu_numel(x);
    if (n == 0 || inner <= 0)
        return 0;
    int64_t rows = n / inner;
    kcu_view o = *out, xv = *x;
    kcu_view *vo[1] = {&o}, *vx[1] = {&xv};
    kcu_coalesce(vo, 1);
    kcu_coalesce(vx, 1);
    k_layer_norm<<<kcu_rows_grid(rows), KCU_THREADS, 0, (cudaStream_t)s>>>(o, *mean, *rstd, xv, *weight, *bias, rows,
                                                                           inner, eps);
    return KCU_LAUNCHED();
}

/* --------------------------------------------------------------------- sort */

/* "Element a goes before element b" in ascending order with NaN last (descending:
 * swapped), on values loaded as double (floats) or int64. */
__device__ __forceinline__ bool kcu_before_d(double a, double b, bool desc)
{
    if (desc) {
        double t = a;
        a = b;
        b = t;
    }
    if (a != a)
        return false;
    return b != b || a < b;
}

/* Each thread places its elements by rank: the count of elements that go before it,
 * plus the equal ones at smaller positions (which keeps the sort stable). O(len^2) per
 * lane, spread over the block: right for the short lanes sort and top-k see in models. */
__global__ void k_sort(kcu_view values, kcu_view indices, kcu_view lanes_in, kcu_view lanes_v, kcu_view lanes_i,
                       int64_t nlanes, int64_t len, int64_t istep, int64_t vstep, int64_t xstep, bool desc)
{
    bool fl = kcu_is_float(lanes_in.dtype);
    for (int64_t l = blockIdx.x; l < nlanes; l += gridDim.x) {
        int64_t ib = kcu_offset(lanes_in, l), vb = kcu_offset(lanes_v, l), xb = kcu_offset(lanes_i, l);
        for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
            int64_t rank = 0;
            if (fl) {
                double vi = kcu_load_d(lanes_in.base, lanes_in.dtype, ib + i * istep);
                for (int64_t j = 0; j < len; j++) {
                    double vj = kcu_load_d(lanes_in.base, lanes_in.dtype, ib + j * istep);
                    if (kcu_before_d(vj, vi, desc) || (j < i && !kcu_before_d(vi, vj, desc)))
                        rank++;
                }
                kcu_store_d(values.base, values.dtype, vb + rank * vstep, vi);
            } else {
                int64_t vi = kcu_load_i(lanes_in.base, lanes_in.dtype, ib + i * istep);
                for (int64_t j = 0; j < len; j++) {
                    int64_t vj = kcu_load_i(lanes_in.base, lanes_in.dtype, ib + j * istep);
                    bool before = desc ? vj > vi : vj < vi;
                    if (before || (j < i && vj == vi))
                        rank++;
                }
                kcu_store_i(values.base, values.dtype, vb + rank * vstep, vi);
            }
            kcu_store_i(indices.base, indices.dtype, xb + rank * xstep, i);
        }
    }
}

extern "C" int kcu_sort(kcu_stream s, const kcu_view *values, const kcu_view *indices, const kcu_view *in, int dim,
                        bool descending)
{
    kcu_view li = kcu_lanes(in, dim), lv = kcu_lanes(values, dim), lx = kcu_lanes(indices, dim);
    int64_t nlanes = kcu_numel(&li);
    if (nlanes == 0 || kcu_numel(in) == 0)
        return 0;
    bool nd = in->ndim > 0;
    k_sort<<<kcu_rows_grid(nlanes), KCU_THREADS, 0, (cudaStream_t)s>>>(
        *values, *indices, li, lv, lx, nlanes, nd ? in->shape[dim] : 1, nd ? in->strides[dim] : 0,
        nd ? values->strides[dim] : 0, nd ? indices->strides[dim] : 0, descending);
    return KCU_LAUNCHED();
}
