/*
 * backends/ref/ref-buffer.c — the ref backend's interface table, its life cycle and its
 * buffers.
 *
 * Buffers are plain calloc'd host memory. The design asks backends to pool their
 * buffers, but ref exists to be trusted, not to be fast: a fresh zeroed allocation per
 * buffer keeps every buffer independent, which is also what lets the address
 * sanitizer catch an out-of-bounds access in an op. All work is synchronous, so sync
 * has nothing to wait for.
 */
#include <stdlib.h>

#include "ref-impl.h"

static const char *const dtype_names[KILN_DTYPE_COUNT] = {
    [KILN_F32] = "f32", [KILN_F64] = "f64", [KILN_F16] = "f16", [KILN_BF16] = "bf16",
    [KILN_I64] = "i64", [KILN_I32] = "i32", [KILN_U8] = "u8",   [KILN_BOOL] = "bool",
};

static const size_t dtype_sizes[KILN_DTYPE_COUNT] = {
    [KILN_F32] = 4, [KILN_F64] = 8, [KILN_F16] = 2, [KILN_BF16] = 2,
    [KILN_I64] = 8, [KILN_I32] = 4, [KILN_U8] = 1,  [KILN_BOOL] = 1,
};

const char *kiln__ref_dtype_name(kiln_dtype dt)
{
    return (unsigned)dt < KILN_DTYPE_COUNT ? dtype_names[dt] : "?";
}

size_t kiln__ref_dtype_size(kiln_dtype dt)
{
    return (unsigned)dt < KILN_DTYPE_COUNT ? dtype_sizes[dt] : 0;
}

int kiln__ref_enomem(const char *op)
{
    return kiln__error_set_code(KILN_ENOMEM, "ref %s: out of memory", op);
}

int kiln__ref_require_float(const char *op, const kiln_tdesc *t)
{
    if (ref_is_float(t->dtype))
        return 0;
    kiln__error_set("ref %s: needs a floating dtype, got %s", op, kiln__ref_dtype_name(t->dtype));
    return KILN_ENOTSUP;
}

/* ---------------------------------------------------------------- life cycle */

static void *ref_open(int index)
{
    if (index != 0) {
        kiln__error_set("ref: no device %d (ref has only device 0)", index);
        return NULL;
    }
    ref_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) {
        kiln__ref_enomem("open");
        return NULL;
    }
    ctx->index = index;
    return ctx;
}

static void ref_close(void *ctx)
{
    free(ctx);
}

static void ref_caps(void *ctx, kiln_backend_caps *out)
{
    memset(out, 0, sizeof *out);
    for (int d = 0; d < KILN_DTYPE_COUNT; d++)
        out->dtype[d] = true;
    out->host_memory = true;
    out->async = false;
}

/* ------------------------------------------------------------------- buffers */

static kiln_buffer *ref_buffer_alloc(void *ctx, size_t nbytes)
{
    kiln_buffer *b = calloc(1, sizeof *b); /* release stays NULL: memory of our own */
    if (!b) {
        kiln__ref_enomem("buffer_alloc");
        return NULL;
    }
    /* calloc(0) may return NULL; one byte keeps "NULL means failure" true. */
    b->data = calloc(nbytes ? nbytes : 1, 1);
    if (!b->data) {
        free(b);
        kiln__error_set_code(KILN_ENOMEM, "ref buffer_alloc: out of memory (%zu bytes)", nbytes);
        return NULL;
    }
    b->nbytes = nbytes;
    return b;
}

static void ref_buffer_free(void *ctx, kiln_buffer *buf)
{
    if (!buf)
        return;
    if (buf->wrapped) {
        if (buf->release)
            buf->release(buf->release_ud);
    } else {
        free(buf->data);
    }
    free(buf);
}

/* ref keeps no freed buffers (buffer_free hands them straight back), so there is never
 * anything to release */
static size_t ref_buffer_trim(void *ctx, size_t bytes)
{
    (void)ctx;
    (void)bytes;
    return 0;
}

static kiln_buffer *ref_buffer_wrap_host(void *ctx, void *ptr, size_t nbytes, void (*release)(void *),
                                         void *release_ud)
{
    kiln_buffer *b = calloc(1, sizeof *b);
    if (!b) {
        kiln__ref_enomem("buffer_wrap_host");
        return NULL;
    }
    b->data = ptr;
    b->nbytes = nbytes;
    b->wrapped = true;
    b->release = release;
    b->release_ud = release_ud;
    return b;
}

static bool ref_buffer_is_wrapped(void *ctx, const kiln_buffer *b)
{
    return b && b->wrapped;
}

static int ref_buffer_upload(void *ctx, kiln_buffer *dst, size_t dst_offset, const void *src,
                             size_t n)
{
    /* The caller guarantees the range; checking it anyway costs nothing and turns a
     * front-end bug into an error instead of a heap overflow in the oracle. */
    if (dst_offset > dst->nbytes || n > dst->nbytes - dst_offset)
        return ref_fail(KILN_EINVAL, "ref buffer_upload: %zu bytes at %zu exceed a %zu-byte buffer",
                        n, dst_offset, dst->nbytes);
    if (n)
        memcpy(dst->data + dst_offset, src, n);
    return 0;
}

static int ref_buffer_download(void *ctx, kiln_buffer *src, size_t src_offset, void *dst, size_t n)
{
    if (src_offset > src->nbytes || n > src->nbytes - src_offset)
        return ref_fail(KILN_EINVAL,
                        "ref buffer_download: %zu bytes at %zu exceed a %zu-byte buffer", n,
                        src_offset, src->nbytes);
    if (n)
        memcpy(dst, src->data + src_offset, n);
    return 0;
}

static void *ref_buffer_host_ptr(void *ctx, kiln_buffer *buf)
{
    return buf->data;
}

static int ref_sync(void *ctx)
{
    return 0; /* every primitive has finished by the time it returns */
}

static const kiln_backend_iface ref_iface = {
    .name = "ref",
    .open = ref_open,
    .close = ref_close,
    .caps = ref_caps,
    .buffer_alloc = ref_buffer_alloc,
    .buffer_free = ref_buffer_free,
    .buffer_upload = ref_buffer_upload,
    .buffer_download = ref_buffer_download,
    .buffer_host_ptr = ref_buffer_host_ptr,
    .buffer_wrap_host = ref_buffer_wrap_host,
    .buffer_is_wrapped = ref_buffer_is_wrapped,
    .buffer_trim = ref_buffer_trim,
    .sync = ref_sync,
    .fill = kiln__ref_fill,
    .arange = kiln__ref_arange,
    .copy = kiln__ref_copy,
    .rng = kiln__ref_rng,
    .unary = kiln__ref_unary,
    .binary = kiln__ref_binary,
    .where = kiln__ref_where,
    .reduce = kiln__ref_reduce,
    .arg_reduce = kiln__ref_arg_reduce,
    .cumsum = kiln__ref_cumsum,
    .sort = kiln__ref_sort,
    .gather = kiln__ref_gather,
    .scatter = kiln__ref_scatter,
    .index_select = kiln__ref_index_select,
    .index_check = kiln__ref_index_check,
    .index_add = kiln__ref_index_add,
    .matmul = kiln__ref_matmul,
    .conv = kiln__ref_conv,
    .conv_backward_input = kiln__ref_conv_backward_input,
    .conv_backward_weight = kiln__ref_conv_backward_weight,
    .pool = kiln__ref_pool,
    .pool_backward = kiln__ref_pool_backward,
    .adaptive_avg_pool = kiln__ref_adaptive_avg_pool,
    .adaptive_avg_pool_backward = kiln__ref_adaptive_avg_pool_backward,
    .interpolate = kiln__ref_interpolate,
    .interpolate_backward = kiln__ref_interpolate_backward,
    .pad = kiln__ref_pad,
    .softmax = kiln__ref_softmax,
    .layer_norm = kiln__ref_layer_norm,
    .adam_step = kiln__ref_adam_step,
};

const kiln_backend_iface *kiln_backend_ref(void)
{
    return &ref_iface;
}
