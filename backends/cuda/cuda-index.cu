/*
 * backends/cuda/cuda-index.cu — the index range check, gather, scatter, index_select,
 * index_add and pad.
 *
 * Indexing kernels never touch memory outside their operands, whatever an index holds:
 * a negative index wraps once (as the ref backend does), and one still outside the dim
 * is skipped. The range error itself comes from kcu_index_check, which runs before the
 * op on the same stream and parks the first violation in device memory for the next
 * sync or download to report (backend.h's device-side assert).
 *
 * Accumulating forms (scatter with accumulate, index_add) add atomically: natively for
 * f32, f64, i32 and i64, and through a compare-and-swap on the enclosing 32-bit word for
 * the 16- and 8-bit dtypes. Floating additions in a different order than the ref
 * backend's may differ in the last bits, as on every parallel device.
 */
#include "cuda-math.cuh"

__global__ void k_index_check(kcu_view index, int64_t n, int64_t lo, int64_t hi, kcu_index_flag *flag)
{
    KCU_GRID_LOOP(i, n)
    {
        int64_t v = kcu_load_i(index.base, index.dtype, kcu_offset(index, i));
        if ((v < lo || v >= hi) && atomicCAS(&flag->flag, 0, 1) == 0)
            flag->value = v;
    }
}

extern "C" int kcu_index_check(kcu_stream s, const kcu_view *index, int64_t lo, int64_t hi, kcu_index_flag *flag)
{
    int64_t n = kcu_numel(index);
    if (n == 0)
        return 0;
    k_index_check<<<kcu_blocks(n), KCU_THREADS, 0, (cudaStream_t)s>>>(*index, n, lo, hi, flag);
    return KCU_LAUNCHED();
}

__device__ __forceinline__ void kcu_move(const kcu_view &out, int64_t o, const kcu_view &in, int64_t s)
{
    if (kcu_is_float(out.dtype) || kcu_is_float(in.dtype))
        kcu_store_d(out.base, out.dtype, o, kcu_load_d(in.base, in.dtype, s));
    else
        kcu_store_i(out.base, out.dtype, o, kcu_load_i(in.base, in.dtype, s));
}

/* The index value at element e, wrapped once; -1 when outside [0, size). */
__device__ __forceinline__ int64_t kcu_index_at(const kcu_view &index, int64_t e, int64_t size)
{
    int64_t v = kcu_load_i(index.base, index.dtype, e);
    if (v < 0)
        v += size;
    return v >= 0 && v < size ? v : -1;
}

/* The coordinate of flat index i (over shape's dims) along dim. */
__device__ __forceinline__ int64_t kcu_coord(const kcu_view &shape, int64_t i, int dim)
{
    for (int d = shape.ndim - 1; d > dim; d--)
        i /= shape.shape[d];
    return i % shape.shape[dim];
}

/* in_nodim / out_nodim: the operand with its stride on dim zeroed (kcu_offset_in then
 * gives the offset of every other coordinate). */
static kcu_view kcu_without_dim(const kcu_view *v, int dim)
{
    kcu_view r = *v;
    r.strides[dim] = 0;
    return r;
}

__global__ void k_gather(kcu_view out, kcu_view in_nodim, int64_t in_step, int64_t size, kcu_view index,
                         int64_t n)
{
    KCU_GRID_LOOP(i, n)
    {
        int64_t o = kcu_offset(out, i);
        int64_t j = kcu_index_at(index, kcu_offset_in(out, index, i), size);
        if (j < 0)
            kcu_store_i(out.base, out.dtype, o, 0);
        else
            kcu_move(out, o, in_nodim, kcu_offset_in(out, in_nodim, i) + j * in_step);
    }
}

extern "C" int kcu_gather(kcu_stream s, const kcu_view *out, const kcu_view *in, int dim, const kcu_view *index)
{
    int64_t n = kcu_numel(out);
    if (n == 0)
        return 0;
    k_gather<<<kcu_blocks(n), KCU_THREADS, 0, (cudaStream_t)s>>>(*out, kcu_without_dim(in, dim), in->strides[dim],
                                                                  in->shape[dim], *index, n);
    return KCU_LAUNCHED();
}

__global__ void k_scatter(kcu_view out_nodim, int64_t out_step, int64_t size, kcu_view index, kcu_view src,
                          int64_t n, bool accumulate)
{
    KCU_GRID_LOOP(i, n)
    {
        int64_t j = kcu_index_at(index, kcu_offset(index, i), size);
        if (j < 0)
            continue;
        int64_t o = kcu_offset_in(index, out_nodim, i) + j * out_step;
        int64_t se = kcu_offset_in(index, src, i);
        if (accumulate)
            kcu_atomic_acc(out_nodim, o, src, se);
        else
            kcu_move(out_nodim, o, src, se);
    }
}

extern "C" int kcu_scatter(kcu_stream s, const kcu_view *out, int dim, const kcu_view *index, const kcu_view *src,
                           bool accumulate)
{
    int64_t n = kcu_numel(index);
    if (n == 0)
        return 0;
    k_scatter<<<kcu_blocks(n), KCU_THREADS, 0, (cudaStream_t)s>>>(kcu_without_dim(out, dim), out->strides[dim],
                                                                   out->shape[dim], *index, *src, n, accumulate);
    return KCU_LAUNCHED();
}

__global__ void k_index_select(kcu_view out, kcu_view in_nodim, int64_t in_step, int64_t size, kcu_view index,
                               int dim, int64_t n)
{
    KCU_GRID_LOOP(i, n)
    {
        int64_t o = kcu_offset(out, i);
        int64_t k = kcu_coord(out, i, dim);
        int64_t j = kcu_index_at(index, index.offset + k * index.strides[0], size);
        if (j < 0)
            kcu_store_i(out.base, out.dtype, o, 0);
        else
            kcu_move(out, o, in_nodim, kcu_offset_in(out, in_nodim, i) + j * in_step);
    }
}

extern "C" int kcu_index_select(kcu_stream s, const kcu_view *out, const kcu_view *in, int dim,
                                const kcu_view *index)
{
    int64_t n = kcu_numel(out);
    if (n == 0)
        return 0;
    k_index_select<<<kcu_blocks(n), KCU_THREADS, 0, (cudaStream_t)s>>>(
        *out, kcu_without_dim(in, dim), in->strides[dim], in->shape[dim], *index, dim, n);
    return KCU_LAUNCHED();
}

__global__ void k_index_add(kcu_view out_nodim, int64_t out_step, int64_t size, kcu_view index, kcu_view src,
                            int dim, int64_t n)
{
    KCU_GRID_LOOP(i, n)
    {
        int64_t k = kcu_coord(src, i, dim);
        int64_t j = kcu_index_at(index, index.offset + k * index.strides[0], size);
        if (j < 0)
            continue;
        kcu_atomic_acc(out_nodim, kcu_offset_in(src, out_nodim, i) + j * out_step, src, kcu_offset(src, i));
    }
}

extern "C" int kcu_index_add(kcu_stream s, const kcu_view *out, int dim, const kcu_view *index, const kcu_view *src)
{
    int64_t n = kcu_numel(src);
    if (n == 0)
        return 0;
    k_index_add<<<kcu_blocks(n), KCU_THREADS, 0, (cudaStream_t)s>>>(kcu_without_dim(out, dim), out->strides[dim],
                                                                     out->shape[dim], *index, *src, dim, n);
    return KCU_LAUNCHED();
}

/* ---------------------------------------------------------------------- pad */

struct kcu_pads {
    int64_t v[2 * KCU_MAX_DIMS];
};

__global__ void k_pad(int mode, kcu_view out, kcu_view in, kcu_pads pads, double value, int64_t n)
{
    KCU_GRID_LOOP(i, n)
    {
        int64_t rem = i, src = in.offset;
        bool inside = true;
        for (int d = out.ndim - 1; d >= 0; d--) {
            int64_t c = rem % out.shape[d];
            rem /= out.shape[d];
            int64_t sc = c - pads.v[2 * d], len = in.shape[d];
            if (sc < 0 || sc >= len) {
                if (mode == 0)
                    inside = false;
                else if (mode == 1)
                    sc = sc < 0 ? -sc : 2 * (len - 1) - sc;
                else
                    sc = sc < 0 ? 0 : len - 1;
            }
            src += sc * in.strides[d];
        }
        int64_t o = kcu_offset(out, i);
        if (inside)
            kcu_move(out, o, in, src);
        else
            kcu_store_d(out.base, out.dtype, o, value);
    }
}

extern "C" int kcu_pad(kcu_stream s, int mode, const kcu_view *out, const kcu_view *in, const int64_t *pads,
                       double value)
{
    int64_t n = kcu_numel(out);
    if (n == 0)
        return 0;
    kcu_pads p;
    for (int d = 0; d < 2 * KCU_MAX_DIMS; d++)
        p.v[d] = d < 2 * out->ndim ? pads[d] : 0;
    k_pad<<<kcu_blocks(n), KCU_THREADS, 0, (cudaStream_t)s>>>(mode, *out, *in, p, value, n);
    return KCU_LAUNCHED();
}

/* ------------------------------------------------------------ integer matmul */

/* One thread per output element, accumulating in wrapping 64-bit arithmetic as the
 * reference does. Integer matrices are small where models use them (index arithmetic,
 * shape computations), so a plain loop serves; a and b arrive aligned to out's dims with
 * stride 0 on broadcast batch dims, a's last stride stepping k and b's second-to-last. */
__global__ void k_matmul_int(kcu_view out, kcu_view a, kcu_view b, int64_t n, int64_t K)
{
    int nd = out.ndim;
    KCU_GRID_LOOP(i, n)
    {
        int64_t rem = i, oo = out.offset, oa = a.offset, ob = b.offset;
        for (int d = nd - 1; d >= 0; d--) {
            int64_t len = out.shape[d], q = rem / len, c = rem - q * len;
            rem = q;
            oo += c * out.strides[d];
            if (d != nd - 1)
                oa += c * a.strides[d];
            if (d != nd - 2)
                ob += c * b.strides[d];
        }
        uint64_t acc = 0;
        for (int64_t k = 0; k < K; k++)
            acc += (uint64_t)kcu_load_i(a.base, a.dtype, oa + k * a.strides[nd - 1]) *
                   (uint64_t)kcu_load_i(b.base, b.dtype, ob + k * b.strides[nd - 2]);
        kcu_store_i(out.base, out.dtype, oo, (int64_t)acc);
    }
}

extern "C" int kcu_matmul_int(kcu_stream s, const kcu_view *out, const kcu_view *a, const kcu_view *b, int64_t k)
{
    int64_t n = kcu_numel(out);
    if (n == 0)
        return 0;
    k_matmul_int<<<kcu_blocks(n), KCU_THREADS, 0, (cudaStream_t)s>>>(*out, *a, *b, n, k);
    return KCU_LAUNCHED();
}
