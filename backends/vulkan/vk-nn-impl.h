/*
 * backends/vulkan/vk-nn-impl.h — what the neural-network kernels of the Vulkan backend
 * (vk-matmul.c, vk-conv.c, vk-pool.c, vk-resize.c, vk-norm.c, vk-optim.c) share on top of
 * vk-impl.h: operands made contiguous on the queue when a kernel needs them so, results
 * computed into a scratch buffer when the output view is not one, and the two launch
 * shapes the kernels use (one thread per item, one workgroup per item).
 *
 * Most of these kernels index their operands as contiguous arrays from element 0. An
 * operand that is a strided view, or that starts at an offset, is first moved into a
 * scratch buffer by shaders/nn-pack.comp on the same queue (and a result meant for a
 * strided output is moved back by it); the scratch is freed on the queue after the
 * kernel, which the allocator's stream-ordered reuse makes safe without a wait. Matmul
 * reads its operands through their strides instead.
 */
#ifndef KILN_VK_NN_IMPL_H
#define KILN_VK_NN_IMPL_H

#include "vk-impl.h"

/** The workgroup size of the nn kernels' 1-D launches (a power of two: the tree
 *  reductions in shared memory halve it). */
#define KVKNN_WG 64

/** An operand as a kernel reads it: d describes contiguous data from element 0 of d.buf,
 *  either the caller's own view or a scratch copy (tmp, freed by kvknn_release). */
typedef struct kvknn_operand {
    kiln_tdesc d;
    kiln_buffer *tmp;
    const kiln_tdesc *orig; /* the caller's view (outputs: copied back to it) */
} kvknn_operand;

/** True when t is row-major contiguous from element 0 of its buffer. */
bool kvknn_is_plain(const kiln_tdesc *t);
/** An input in plain form: t itself, or a copy of it made on q. */
int kvknn_input(kvk_queue *q, kvknn_operand *o, const kiln_tdesc *t, const char *op);
/** An output in plain form: t itself, or a scratch buffer that kvknn_output_done copies
 *  into t. When `keep` the scratch starts as a copy of t (for kernels that update in
 *  place). */
int kvknn_output(kvk_queue *q, kvknn_operand *o, const kiln_tdesc *t, bool keep, const char *op);
/** Copy a scratch output back into the caller's view (0 when there was none). */
int kvknn_output_done(kvk_queue *q, kvknn_operand *o, const char *op);
/** Free o's scratch buffer on q (no-op without one). */
void kvknn_release(kvk_queue *q, kvknn_operand *o);

/** 0 when v fits the kernels' int32 index math, else KILN_EINVAL naming op and what. */
int kvknn_fits(int64_t v, const char *op, const char *what);

/** Launch `shader` (variant: dt's name) with one thread per item over n items. */
int kvknn_launch_items(kvk_queue *q, const char *op, const char *shader, kiln_dtype dt, kiln_buffer *const *bufs,
                       int nbufs, const void *params, size_t params_bytes, int64_t n);
/** Launch `shader` with one KVKNN_WG-thread workgroup per item over n items; spec
 *  constants c[0..nc-1] go to ids 3.. */
int kvknn_launch_groups(kvk_queue *q, const char *op, const char *shader, kiln_dtype dt, kiln_buffer *const *bufs,
                        int nbufs, const void *params, size_t params_bytes, int64_t n, int nc, const uint32_t *c);

/** The workgroup of the tiled GEMM kernels (matmul.comp, conv-gemm.comp: 4 x 4 outputs per
 *  thread) for an M x N result: 16 x 16 threads (64 x 64 tiles) when both sides are large,
 *  narrower on a side that is small, so a 10-column or 32-row result does not leave most of
 *  each tile idle. wg[0] covers N, wg[1] covers M; both powers of two. */
void kvknn_gemm_wg(int64_t m, int64_t n, uint32_t *wg);

/** The loop iterations of one thread of matmul.comp or conv-gemm.comp walking k in steps
 *  of bk with workgroup wg (for kvk_loop_check). */
int64_t kvknn_gemm_steps(const uint32_t *wg, int64_t k, int64_t bk);
/** The loop iterations of three nested loops of n[0], n[1] and n[2] iterations. */
int64_t kvknn_nest_steps(const int64_t *n);

/** Whether the device computes floating dtype dt in these kernels: f32 always, f16 and
 *  bf16 with 16-bit storage and shaderFloat16, f64 with shaderFloat64. */
bool kvknn_float_ok(const kvk_device *d, kiln_dtype dt);
/** The "op: ... not supported on <dtype>" error for a dtype a kernel lacks. */
int kvknn_unsupported(const char *op, kiln_dtype dt);

#endif /* KILN_VK_NN_IMPL_H */
