/*
 * backends/ref/ref-impl.h — what the files of the ref backend share.
 *
 * ref is the oracle: every other backend is compared with it, so it is written to be
 * obviously right rather than fast. Three ideas carry the whole backend:
 *
 *  - Element access goes through ref_getf / ref_geti / ref_setf / ref_seti, which
 *    switch on the dtype. Floating math happens in double (f16/bf16 are widened on
 *    load and rounded once, with half.h, on store); integer math happens in int64 and
 *    wraps to the stored width on store, so no integer value is ever squeezed through
 *    a double.
 *  - Strided operands are walked with one multi-index counter, ref_iter: a shape plus
 *    up to REF_MAX_OPS stride vectors, advanced one element at a time in row-major
 *    order with amortized O(1) work per step. Broadcast (0) and flipped (negative)
 *    strides need no special case.
 *  - The float-only nn ops copy their operands into contiguous double arrays
 *    (ref_read_flat) and write results back with ref_write_flat, so their loops do
 *    plain index arithmetic on row-major data.
 */
#ifndef KILN_REF_IMPL_H
#define KILN_REF_IMPL_H

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "backend.h"
#include "common/half.h"
#include "error-impl.h"

/** A ref buffer: plain zeroed host memory. */
struct kiln_buffer {
    size_t nbytes;
    unsigned char *data;
    /* Set for buffer_wrap_host buffers: data belongs to the caller, who gets it back
     * through release(release_ud) when the buffer is freed (release may be NULL). */
    bool wrapped;
    void (*release)(void *);
    void *release_ud;
};

/** The context open() returns. ref keeps no state; the struct exists for the contract. */
typedef struct ref_ctx {
    int index;
} ref_ctx;

/* ------------------------------------------------------------------- errors */

/** Set the message and code (for kiln_error_code) and return the code:
 *  `return ref_fail(KILN_ENOTSUP, "...")`. */
#define ref_fail(code, ...) kiln__error_set_code((code), __VA_ARGS__)

int kiln__ref_enomem(const char *op);

/* ------------------------------------------------------------------- dtypes */

const char *kiln__ref_dtype_name(kiln_dtype dt);
size_t kiln__ref_dtype_size(kiln_dtype dt);

static inline bool ref_is_float(kiln_dtype dt)
{
    return dt == KILN_F32 || dt == KILN_F64 || dt == KILN_F16 || dt == KILN_BF16;
}

/* ------------------------------------------------------------ element access */

static inline unsigned char *ref_data(const kiln_tdesc *t)
{
    return t->buf->data;
}

/** Element at element offset i of base, as a double. */
static inline double ref_getf(kiln_dtype dt, const unsigned char *base, int64_t i)
{
    switch (dt) {
    case KILN_F32: return ((const float *)base)[i];
    case KILN_F64: return ((const double *)base)[i];
    case KILN_F16: return kiln_f16_to_f32(((const uint16_t *)base)[i]);
    case KILN_BF16: return kiln_bf16_to_f32(((const uint16_t *)base)[i]);
    case KILN_I64: return (double)((const int64_t *)base)[i];
    case KILN_I32: return ((const int32_t *)base)[i];
    case KILN_U8: return ((const uint8_t *)base)[i];
    case KILN_BOOL: return ((const uint8_t *)base)[i] != 0;
    default: return NAN;
    }
}

/**
 * A double converted to int64 the way a C cast would, made total: truncation toward
 * zero, NaN gives 0 and values beyond the int64 range saturate (a bare cast would be
 * undefined behaviour there).
 */
static inline int64_t ref_d2i(double v)
{
    if (isnan(v))
        return 0;
    if (v >= 9223372036854775808.0)
        return INT64_MAX;
    if (v < -9223372036854775808.0)
        return INT64_MIN;
    return (int64_t)v;
}

/** Element at offset i as int64 (floats are truncated with ref_d2i). */
static inline int64_t ref_geti(kiln_dtype dt, const unsigned char *base, int64_t i)
{
    switch (dt) {
    case KILN_I64: return ((const int64_t *)base)[i];
    case KILN_I32: return ((const int32_t *)base)[i];
    case KILN_U8: return ((const uint8_t *)base)[i];
    case KILN_BOOL: return ((const uint8_t *)base)[i] != 0;
    default: return ref_d2i(ref_getf(dt, base, i));
    }
}

/** Store an int64, wrapping to the width of dt (bool stores v != 0). */
static inline void ref_seti(kiln_dtype dt, unsigned char *base, int64_t i, int64_t v)
{
    switch (dt) {
    case KILN_F32: ((float *)base)[i] = (float)v; break;
    case KILN_F64: ((double *)base)[i] = (double)v; break;
    case KILN_F16: ((uint16_t *)base)[i] = kiln_f32_to_f16((float)v); break;
    case KILN_BF16: ((uint16_t *)base)[i] = kiln_f32_to_bf16((float)v); break;
    case KILN_I64: ((int64_t *)base)[i] = v; break;
    case KILN_I32: ((int32_t *)base)[i] = (int32_t)(uint32_t)(uint64_t)v; break;
    case KILN_U8: ((uint8_t *)base)[i] = (uint8_t)(uint64_t)v; break;
    case KILN_BOOL: ((uint8_t *)base)[i] = v != 0; break;
    default: break;
    }
}

/**
 * Store a double. f16/bf16 round through float, as PyTorch's conversions do; integer
 * targets truncate (ref_d2i) and wrap; bool stores v != 0, so NaN is true.
 */
static inline void ref_setf(kiln_dtype dt, unsigned char *base, int64_t i, double v)
{
    switch (dt) {
    case KILN_F32: ((float *)base)[i] = (float)v; break;
    case KILN_F64: ((double *)base)[i] = v; break;
    case KILN_F16: ((uint16_t *)base)[i] = kiln_f32_to_f16((float)v); break;
    case KILN_BF16: ((uint16_t *)base)[i] = kiln_f32_to_bf16((float)v); break;
    case KILN_BOOL: ((uint8_t *)base)[i] = v != 0; break;
    default: ref_seti(dt, base, i, ref_d2i(v)); break;
    }
}

/**
 * Move one element from (sdt, src, si) to (ddt, dst, di) with conversion: bytes when
 * the dtypes match (NaN payloads and -0 survive), int64 when the source is an integer
 * (exact, one rounding at most), double otherwise.
 */
static inline void ref_move(kiln_dtype ddt, unsigned char *dst, int64_t di, kiln_dtype sdt,
                            const unsigned char *src, int64_t si)
{
    if (ddt == sdt) {
        size_t es = kiln__ref_dtype_size(ddt);
        memcpy(dst + di * (int64_t)es, src + si * (int64_t)es, es);
    } else if (!ref_is_float(sdt)) {
        ref_seti(ddt, dst, di, ref_geti(sdt, src, si));
    } else {
        ref_setf(ddt, dst, di, ref_getf(sdt, src, si));
    }
}

/** Wrapping int64 arithmetic (signed overflow is undefined in C; unsigned is not). */
static inline int64_t ref_wadd(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static inline int64_t ref_wsub(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }
static inline int64_t ref_wmul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }

/* ------------------------------------------------------------------ iterator */

#define REF_MAX_OPS 4

/**
 * A row-major multi-index counter over `shape`, carrying one running element offset
 * per attached operand. Use:
 *
 *     ref_iter it;
 *     int64_t n = ref_iter_init(&it, out->ndim, out->shape);
 *     ref_iter_add(&it, out->offset, out->strides);   // off[0]
 *     ref_iter_add(&it, in->offset, in->strides);     // off[1]
 *     for (int64_t i = 0; i < n; i++, ref_iter_next(&it))
 *         ... it.off[0], it.off[1], it.idx[d] ...
 */
typedef struct ref_iter {
    int ndim;
    int nops;
    int64_t shape[KILN_MAX_DIMS];
    int64_t idx[KILN_MAX_DIMS];
    int64_t strides[REF_MAX_OPS][KILN_MAX_DIMS];
    int64_t off[REF_MAX_OPS];
} ref_iter;

/** Start at the zero index; returns the element count (0 when any dim is 0). */
int64_t kiln__ref_iter_init(ref_iter *it, int ndim, const int64_t *shape);
/** Attach an operand walked with `strides` from `offset`; returns its slot. */
int kiln__ref_iter_add(ref_iter *it, int64_t offset, const int64_t *strides);
/** Attach a descriptor (its own offset and strides). */
int kiln__ref_iter_add_t(ref_iter *it, const kiln_tdesc *t);
void kiln__ref_iter_next(ref_iter *it);

#define ref_iter_init kiln__ref_iter_init
#define ref_iter_add kiln__ref_iter_add
#define ref_iter_add_t kiln__ref_iter_add_t
#define ref_iter_next kiln__ref_iter_next

int64_t kiln__ref_numel(const kiln_tdesc *t);
#define ref_numel kiln__ref_numel

/** Copy t into a new row-major double array (malloc'd; caller frees). NULL + message
 *  on allocation failure; a non-NULL pointer even for empty t. */
double *kiln__ref_read_flat(const kiln_tdesc *t, const char *op);
/** Store a row-major double array into t (honouring t's strides). */
void kiln__ref_write_flat(const kiln_tdesc *t, const double *src);
/** Allocate n zeroed doubles (at least one), NULL + message on failure. */
double *kiln__ref_zeros(int64_t n, const char *op);
#define ref_read_flat kiln__ref_read_flat
#define ref_write_flat kiln__ref_write_flat
#define ref_zeros kiln__ref_zeros

/**
 * A 0-d operand seen as a 1-d tensor of one element, so that ops along a dim accept a
 * scalar with dim 0 without reading past shape[]. Returns t itself otherwise.
 */
static inline const kiln_tdesc *ref_lift_0d(const kiln_tdesc *t, kiln_tdesc *tmp)
{
    if (!t || t->ndim > 0)
        return t;
    *tmp = *t;
    tmp->ndim = 1;
    tmp->shape[0] = 1;
    tmp->strides[0] = 1;
    return tmp;
}

/* ------------------------------------------------------------ the primitives */

int kiln__ref_fill(void *ctx, const kiln_tdesc *out, double value);
int kiln__ref_arange(void *ctx, const kiln_tdesc *out, double start, double step);
int kiln__ref_copy(void *ctx, const kiln_tdesc *out, const kiln_tdesc *in);
int kiln__ref_rng(void *ctx, kiln_rng_kind kind, const kiln_tdesc *out, uint64_t seed,
                  uint64_t offset, double p0, double p1);

int kiln__ref_unary(void *ctx, kiln_unary_op op, const kiln_tdesc *out, const kiln_tdesc *in,
                    double alpha, double beta);
int kiln__ref_binary(void *ctx, kiln_binary_op op, const kiln_tdesc *out, const kiln_tdesc *a,
                     const kiln_tdesc *b);
int kiln__ref_where(void *ctx, const kiln_tdesc *out, const kiln_tdesc *cond, const kiln_tdesc *a,
                    const kiln_tdesc *b);

int kiln__ref_reduce(void *ctx, kiln_reduce_op op, const kiln_tdesc *out, const kiln_tdesc *in,
                     uint32_t reduce_mask, double param);
int kiln__ref_arg_reduce(void *ctx, bool is_max, const kiln_tdesc *out, const kiln_tdesc *in,
                         int dim);
int kiln__ref_cumsum(void *ctx, const kiln_tdesc *out, const kiln_tdesc *in, int dim);
int kiln__ref_sort(void *ctx, const kiln_tdesc *values, const kiln_tdesc *indices,
                   const kiln_tdesc *in, int dim, bool descending);

int kiln__ref_gather(void *ctx, const kiln_tdesc *out, const kiln_tdesc *in, int dim,
                     const kiln_tdesc *index);
int kiln__ref_scatter(void *ctx, const kiln_tdesc *out, int dim, const kiln_tdesc *index,
                      const kiln_tdesc *src, bool accumulate);
int kiln__ref_index_check(void *ctx, const kiln_tdesc *index, int64_t lo, int64_t hi, const char *op,
                          const char *noun);
int kiln__ref_index_select(void *ctx, const kiln_tdesc *out, const kiln_tdesc *in, int dim,
                           const kiln_tdesc *index);
int kiln__ref_index_add(void *ctx, const kiln_tdesc *out, int dim, const kiln_tdesc *index,
                        const kiln_tdesc *src);
int kiln__ref_pad(void *ctx, kiln_pad_mode mode, const kiln_tdesc *out, const kiln_tdesc *in,
                  const int64_t *pads, double value);

int kiln__ref_adam_step(void *ctx, const kiln_adam_params *p, const kiln_tdesc *param,
                        const kiln_tdesc *grad, const kiln_tdesc *exp_avg, const kiln_tdesc *exp_avg_sq,
                        const kiln_tdesc *max_exp_avg_sq);
int kiln__ref_matmul(void *ctx, const kiln_tdesc *out, const kiln_tdesc *a, const kiln_tdesc *b);
int kiln__ref_conv(void *ctx, const kiln_conv_params *p, const kiln_tdesc *out, const kiln_tdesc *x,
                   const kiln_tdesc *w, const kiln_tdesc *bias);
int kiln__ref_conv_backward_input(void *ctx, const kiln_conv_params *p, const kiln_tdesc *grad_x,
                                  const kiln_tdesc *grad_out, const kiln_tdesc *w);
int kiln__ref_conv_backward_weight(void *ctx, const kiln_conv_params *p, const kiln_tdesc *grad_w,
                                   const kiln_tdesc *x, const kiln_tdesc *grad_out);

int kiln__ref_pool(void *ctx, const kiln_pool_params *p, const kiln_tdesc *out,
                   const kiln_tdesc *indices, const kiln_tdesc *x);
int kiln__ref_pool_backward(void *ctx, const kiln_pool_params *p, const kiln_tdesc *grad_x,
                            const kiln_tdesc *grad_out, const kiln_tdesc *indices);
int kiln__ref_adaptive_avg_pool(void *ctx, int nspatial, const kiln_tdesc *out, const kiln_tdesc *x);
int kiln__ref_adaptive_avg_pool_backward(void *ctx, int nspatial, const kiln_tdesc *grad_x,
                                         const kiln_tdesc *grad_out);
int kiln__ref_interpolate(void *ctx, kiln_interp_mode mode, bool align_corners,
                          const kiln_tdesc *out, const kiln_tdesc *x);
int kiln__ref_interpolate_backward(void *ctx, kiln_interp_mode mode, bool align_corners,
                                   const kiln_tdesc *grad_x, const kiln_tdesc *grad_out);
int kiln__ref_softmax(void *ctx, bool log, const kiln_tdesc *out, const kiln_tdesc *in, int dim);
int kiln__ref_layer_norm(void *ctx, const kiln_tdesc *out, const kiln_tdesc *mean,
                         const kiln_tdesc *rstd, const kiln_tdesc *x, const kiln_tdesc *weight,
                         const kiln_tdesc *bias, int64_t inner, double eps);

/** Fail with KILN_ENOTSUP unless every listed dtype is floating. */
int kiln__ref_require_float(const char *op, const kiln_tdesc *t);
#define ref_require_float kiln__ref_require_float

#endif /* KILN_REF_IMPL_H */
