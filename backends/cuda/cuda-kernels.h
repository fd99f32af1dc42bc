/*
 * backends/cuda/cuda-kernels.h — the launchers of kiln's own CUDA kernels, as the C side
 * of the backend calls them. Implemented in the .cu files of this folder, which build
 * for CUDA with nvcc and for AMD GPUs with hipcc (vendor-hip.h maps the names).
 *
 * Each launcher queues its kernels on `stream` and returns the launch status
 * (cudaSuccess, or the error cudaGetLastError gave); it never waits. Operands travel as
 * kcu_view: a device base pointer plus the descriptor's offset, shape and strides in
 * elements, so a kernel honours any layout (broadcast 0 strides, negative strides).
 *
 * Arithmetic follows the ref backend's formulas: f16 and bf16 compute in f32 and round
 * once on store (round to nearest even), f32 in f32, f64 in f64, integers in int64
 * wrapping at the stored width, bool as 0/1.
 */
#ifndef KILN_CUDA_KERNELS_H
#define KILN_CUDA_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KCU_MAX_DIMS 8

/** One operand on the device. dtype is a kiln_dtype value. */
typedef struct kcu_view {
    void *base;
    int64_t offset;
    int32_t ndim;
    int32_t dtype;
    int64_t shape[KCU_MAX_DIMS];
    int64_t strides[KCU_MAX_DIMS];
} kcu_view;

/** The stream type without the vendor's headers: a cudaStream_t / hipStream_t. */
typedef void *kcu_stream;

/* Where an asynchronous index check parks a violation, in device memory: flag 0 while
 * none; the first failing thread writes flag 1 and the value. */
typedef struct kcu_index_flag {
    int32_t flag;
    int32_t pad;
    int64_t value;
} kcu_index_flag;

/** Rewrites nv views that share one logical shape (views[0]'s: the others' shapes broadcast to
 *  it, as kcu_offset_in reads them) into the fewest dims that address the same elements: dims
 *  of size 1 go, and a dim merges into the next outer one wherever every view steps through
 *  the pair as through one dim (outer stride == inner stride * inner size). Each flat
 *  row-major index then names the same element in every view as before, and a kernel
 *  decomposes it over fewer dims (a transposed copy of [B, S, H, D] to [B, H, S, D]: 4 -> 3
 *  dims; a contiguous operand: 1 dim). Host-side, before a launch; a view of no dims (or
 *  all of size 1) becomes 0-d. */
static inline void kcu_coalesce(kcu_view *const *views, int nv)
{
    int64_t shape[KCU_MAX_DIMS];
    int64_t strides[4][KCU_MAX_DIMS];
    int m = 0;
    if (nv < 1 || nv > 4)
        return;
    for (int d = 0; d < views[0]->ndim; d++) {
        int64_t n = views[0]->shape[d];
        if (n == 1)
            continue;
        bool merge = m > 0;
        for (int k = 0; k < nv && merge; k++)
            merge = strides[k][m - 1] == views[k]->strides[d] * n;
        if (merge) {
            shape[m - 1] *= n;
            for (int k = 0; k < nv; k++)
                strides[k][m - 1] = views[k]->strides[d];
            continue;
        }
        shape[m] = n;
        for (int k = 0; k < nv; k++)
            strides[k][m] = views[k]->strides[d];
        m++;
    }
    for (int k = 0; k < nv; k++) {
        views[k]->ndim = m;
        for (int d = 0; d < m; d++) {
            views[k]->shape[d] = shape[d];
            views[k]->strides[d] = strides[k][d];
        }
    }
}

/* data movement (cuda-elementwise.cu) */
int kcu_fill(kcu_stream s, const kcu_view *out, double value);
int kcu_arange(kcu_stream s, const kcu_view *out, double start, double step);
int kcu_copy(kcu_stream s, const kcu_view *out, const kcu_view *in);
int kcu_rng(kcu_stream s, int kind, const kcu_view *out, uint64_t seed, uint64_t offset, double p0, double p1);

/* elementwise (cuda-elementwise.cu); op values are kiln_unary_op / kiln_binary_op */
int kcu_unary(kcu_stream s, int op, const kcu_view *out, const kcu_view *in, double alpha, double beta);
int kcu_binary(kcu_stream s, int op, const kcu_view *out, const kcu_view *a, const kcu_view *b);
int kcu_where(kcu_stream s, const kcu_view *out, const kcu_view *cond, const kcu_view *a, const kcu_view *b);
/** out = act(out + bias[col] + residual) in place over a contiguous out of ncols columns;
 *  bias and residual may have a NULL base. act is a kiln_epilogue_act. */
int kcu_epilogue(kcu_stream s, const kcu_view *out, int64_t ncols, const kcu_view *bias, const kcu_view *residual,
                 int act, double alpha, double beta);
/** out[n, c, i] += bias[c] over a contiguous out [N, channels, plane]. */
int kcu_channel_bias(kcu_stream s, const kcu_view *out, const kcu_view *bias, int64_t channels, int64_t plane);
/* f32, out and residual contiguous: out = act(out + bias[channel] + residual); bias and
 * residual optional (base NULL) */
int kcu_conv_epilogue(kcu_stream s, const kcu_view *out, const kcu_view *bias, const kcu_view *residual,
                      int64_t channels, int64_t plane, int act, double alpha, double beta);
/** The fused Adam/AdamW step (kiln_adam_params' arithmetic) over n contiguous elements. */
int kcu_adam(kcu_stream s, int dtype, int64_t n, void *param, const void *grad, void *m, void *v, void *vmax,
             double beta1, double beta2, double eps, double weight_decay, double param_scale, double step_size,
             double inv_bc2_sqrt, bool decoupled, bool amsgrad, bool maximize);

/* reductions and rows (cuda-reduce.cu); op values are kiln_reduce_op */
/** How many blocks share each output of this reduction (1: one block an output). Above 1,
 *  kcu_reduce wants partials: numel(out) * splits doubles of device scratch. */
int64_t kcu_reduce_splits(int op, const kcu_view *out, const kcu_view *in, uint32_t mask);
/** partials: NULL (one block an output), or scratch sized by kcu_reduce_splits. */
int kcu_reduce(kcu_stream s, int op, const kcu_view *out, const kcu_view *in, uint32_t mask, double param,
               double *partials);
int kcu_arg_reduce(kcu_stream s, bool is_max, const kcu_view *out, const kcu_view *in, int dim);
int kcu_cumsum(kcu_stream s, const kcu_view *out, const kcu_view *in, int dim);
int kcu_softmax(kcu_stream s, bool log, const kcu_view *out, const kcu_view *in, int dim);
int kcu_layer_norm(kcu_stream s, const kcu_view *out, const kcu_view *mean, const kcu_view *rstd,
                   const kcu_view *x, const kcu_view *weight, const kcu_view *bias, int64_t inner, double eps);
int kcu_sort(kcu_stream s, const kcu_view *values, const kcu_view *indices, const kcu_view *in, int dim,
             bool descending);

/* indexing (cuda-index.cu); index views are i64 */
int kcu_index_check(kcu_stream s, const kcu_view *index, int64_t lo, int64_t hi, kcu_index_flag *flag);
int kcu_gather(kcu_stream s, const kcu_view *out, const kcu_view *in, int dim, const kcu_view *index);
int kcu_scatter(kcu_stream s, const kcu_view *out, int dim, const kcu_view *index, const kcu_view *src,
                bool accumulate);
int kcu_index_select(kcu_stream s, const kcu_view *out, const kcu_view *in, int dim, const kcu_view *index);
int kcu_index_add(kcu_stream s, const kcu_view *out, int dim, const kcu_view *index, const kcu_view *src);

/** Constant (0), reflect (1) or replicate (2) padding; pads[2d], pads[2d+1] = lo, hi. */
int kcu_pad(kcu_stream s, int mode, const kcu_view *out, const kcu_view *in, const int64_t *pads, double value);
/** Integer matmul out = a @ b (wrapping 64-bit sums); a and b aligned to out's ndim, stride 0 on
 *  broadcast batch dims (cuda-index.cu). */
int kcu_matmul_int(kcu_stream s, const kcu_view *out, const kcu_view *a, const kcu_view *b, int64_t k);

/* pooling (cuda-pool.cu): kind 0 max, 1 avg; the geometry of kiln_pool_params */
typedef struct kcu_pool_params {
    int nspatial, kind;
    int64_t kernel[3], stride[3], padding[3], dilation[3];
    bool count_include_pad;
} kcu_pool_params;
int kcu_pool(kcu_stream s, const kcu_pool_params *p, const kcu_view *out, const kcu_view *indices,
             const kcu_view *x);
/** Zeroes grad_x, then adds each output gradient into its window (max: at its index). */
int kcu_pool_backward(kcu_stream s, const kcu_pool_params *p, const kcu_view *grad_x, const kcu_view *grad_out,
                      const kcu_view *indices);
int kcu_adaptive_avg_pool(kcu_stream s, int nspatial, const kcu_view *out, const kcu_view *x);
int kcu_adaptive_avg_pool_backward(kcu_stream s, int nspatial, const kcu_view *grad_x, const kcu_view *grad_out);

/* interpolation (cuda-resize.cu) over [N, C, S...] with 1 to 3 spatial dims; mode 0
 * nearest, 1 linear */
int kcu_interpolate(kcu_stream s, int mode, bool align_corners, const kcu_view *out, const kcu_view *x);
/** Zeroes grad_x, then adds each output gradient to its taps. */
int kcu_interpolate_backward(kcu_stream s, int mode, bool align_corners, const kcu_view *grad_x,
                             const kcu_view *grad_out);

/** The name of a launch status, for messages (cudaGetErrorString). */
const char *kcu_error_string(int status);

#ifdef __cplusplus
}
#endif
#endif /* KILN_CUDA_KERNELS_H */
