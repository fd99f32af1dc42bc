/*
 * backends/vulkan/vk-nn-common.c — the helpers of vk-nn-impl.h (plain operands, launch
 * shapes) and kvk_nn_supports, the capability answer of every nn kernel in one table.
 */
#include <string.h>

#include "vk-nn-impl.h"

bool kvknn_is_plain(const kiln_tdesc *t)
{
    if (t->offset != 0)
        return false;
    int64_t expect = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->strides[d] != expect)
            return false;
        expect *= t->shape[d];
    }
    return true;
}

static int scratch(kvk_queue *q, kvknn_operand *o, const kiln_tdesc *t, const char *op)
{
    int64_t n = kvk_numel(t);
    size_t bytes = (size_t)(n > 0 ? n : 1) * kiln_dtype_size(t->dtype);
    o->tmp = kvk_buffer_alloc(q, bytes);
    if (!o->tmp)
        return kiln__error_set_code(KILN_ENOMEM, "%s: no device memory for a %zu-byte scratch copy", op, bytes);
    o->d = *t;
    o->d.buf = o->tmp;
    o->d.offset = 0;
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        o->d.strides[d] = s;
        s *= t->shape[d];
    }
    return 0;
}

/* Mirrors nn-pack.comp's params block. */
typedef struct pack_params {
    kvk_view v;
    int32_t unpack, n;
} pack_params;

/* plain <- view (unpack false) or view <- plain (unpack true), in view's own dtype */
static int pack(kvk_queue *q, const kiln_tdesc *view, kiln_buffer *plain, bool unpack, const char *op)
{
    pack_params p;
    memset(&p, 0, sizeof p);
    int rc = kvk_view_of(&p.v, view, op);
    if (rc < 0)
        return rc;
    p.unpack = unpack;
    p.n = (int32_t)kvk_numel(view);
    kiln_buffer *bufs[2] = {unpack ? view->buf : plain, unpack ? plain : view->buf};
    return kvknn_launch_items(q, op, "nn-pack", view->dtype, bufs, 2, &p, sizeof p, p.n);
}

int kvknn_input(kvk_queue *q, kvknn_operand *o, const kiln_tdesc *t, const char *op)
{
    memset(o, 0, sizeof *o);
    o->orig = t;
    if (!t) /* an optional operand left out */
        return 0;
    if (kvknn_is_plain(t)) {
        o->d = *t;
        return 0;
    }
    int rc = scratch(q, o, t, op);
    if (rc == 0 && kvk_numel(t) > 0)
        rc = pack(q, t, o->tmp, false, op);
    if (rc < 0)
        kvknn_release(q, o);
    return rc;
}

int kvknn_output(kvk_queue *q, kvknn_operand *o, const kiln_tdesc *t, bool keep, const char *op)
{
    memset(o, 0, sizeof *o);
    o->orig = t;
    if (!t)
        return 0;
    if (kvknn_is_plain(t)) {
        o->d = *t;
        return 0;
    }
    int rc = scratch(q, o, t, op);
    if (rc == 0 && keep && kvk_numel(t) > 0)
        rc = pack(q, t, o->tmp, false, op);
    if (rc < 0)
        kvknn_release(q, o);
    return rc;
}

int kvknn_output_done(kvk_queue *q, kvknn_operand *o, const char *op)
{
    if (!o->tmp || kvk_numel(o->orig) == 0)
        return 0;
    return pack(q, o->orig, o->tmp, true, op);
}

void kvknn_release(kvk_queue *q, kvknn_operand *o)
{
    if (o->tmp)
        kvk_buffer_free(q, o->tmp);
    o->tmp = NULL;
}

int kvknn_fits(int64_t v, const char *op, const char *what)
{
    if (v < 0 || v > INT32_MAX)
        return kiln__error_set("%s: %s (%lld) is beyond the vulkan backend's 32-bit index range", op, what,
                               (long long)v),
               KILN_EINVAL;
    return 0;
}

/* gx x gy workgroups covering `groups`, gx capped at KVK_GROUPS_MAX */
static void grid(int64_t groups, uint32_t *gx, uint32_t *gy)
{
    if (groups < 1)
        groups = 1;
    *gx = groups > KVK_GROUPS_MAX ? KVK_GROUPS_MAX : (uint32_t)groups;
    *gy = (uint32_t)((groups + *gx - 1) / *gx);
}

int kvknn_launch_items(kvk_queue *q, const char *op, const char *shader, kiln_dtype dt, kiln_buffer *const *bufs,
                       int nbufs, const void *params, size_t params_bytes, int64_t n)
{
    if (n <= 0)
        return 0;
    kvk_spec spec = {.wg = {KVKNN_WG, 1, 1}};
    uint32_t gx, gy;
    grid((n + KVKNN_WG - 1) / KVKNN_WG, &gx, &gy);
    return kvk_dispatch(q, op, shader, kvk_dtype_name(dt), &spec, bufs, nbufs, params, params_bytes, gx, gy, 1);
}

int kvknn_launch_groups(kvk_queue *q, const char *op, const char *shader, kiln_dtype dt, kiln_buffer *const *bufs,
                        int nbufs, const void *params, size_t params_bytes, int64_t n, int nc, const uint32_t *c)
{
    if (n <= 0)
        return 0;
    kvk_spec spec = {.wg = {KVKNN_WG, 1, 1}, .n = (uint32_t)nc};
    for (int i = 0; i < nc && i < KVK_SPEC_MAX; i++)
        spec.c[i] = c[i];
    uint32_t gx, gy;
    grid(n, &gx, &gy);
    return kvk_dispatch(q, op, shader, kvk_dtype_name(dt), &spec, bufs, nbufs, params, params_bytes, gx, gy, 1);
}

/* the power of two >= ceil(v / 4), within [lo, 16] */
static uint32_t side(int64_t v, uint32_t lo)
{
    uint32_t s = lo;
    while (s < 16 && (int64_t)s * 4 < v)
        s *= 2;
    return s;
}

void kvknn_gemm_wg(int64_t m, int64_t n, uint32_t *wg)
{
    wg[0] = side(n, 2);
    wg[1] = side(m, 2);
    /* at least 64 threads: widen the side that has work left */
    while (wg[0] * wg[1] < 64 && (wg[0] < 16 || wg[1] < 16)) {
        if (wg[1] < 16 && ((int64_t)wg[1] * 4 < m || wg[0] == 16))
            wg[1] *= 2;
        else
            wg[0] *= 2;
    }
    wg[2] = 1;
}

int64_t kvknn_gemm_steps(const uint32_t *wg, int64_t k, int64_t bk)
{
    /* per step of K: staging bk x tile rows and bk x tile columns (4 per thread on a side),
     * the bk-long multiply loop and the step itself */
    int64_t threads = (int64_t)wg[0] * wg[1];
    int64_t rows = (bk * 4 * wg[1] + threads - 1) / threads, cols = (bk * 4 * wg[0] + threads - 1) / threads;
    return (k + bk - 1) / bk * (rows + cols + bk + 1);
}

int64_t kvknn_nest_steps(const int64_t *n)
{
    int64_t a = n[0] > 0 ? n[0] : 0, b = n[1] > 0 ? n[1] : 0, c = n[2] > 0 ? n[2] : 0;
    return a + a * b + a * b * c;
}

bool kvknn_float_ok(const kvk_device *d, kiln_dtype dt)
{
    switch (dt) {
    case KILN_F32: return true;
    case KILN_F16:
    case KILN_BF16: return d->feat.f16;
    case KILN_F64: return d->feat.f64;
    default: return false;
    }
}

int kvknn_unsupported(const char *op, kiln_dtype dt)
{
    return kiln__error_set("%s: not supported on %s by the vulkan backend", op, kiln_dtype_name(dt)), KILN_ENOTSUP;
}

bool kvk_nn_supports(kvk_queue *q, const kiln_op_query *query)
{
    const kvk_device *d = q->d;
    kiln_dtype dt = query->dtype;
    switch (query->entry) {
    case KILN_ENTRY_MATMUL:
        /* integer matmul wraps as the reference does; u8 and bool have no kernel */
        return kvknn_float_ok(d, dt) || dt == KILN_I32 || dt == KILN_I64;
    case KILN_ENTRY_CONV:
    case KILN_ENTRY_CONV_BACKWARD_INPUT:
    case KILN_ENTRY_CONV_BACKWARD_WEIGHT:
    case KILN_ENTRY_POOL:
    case KILN_ENTRY_POOL_BACKWARD:
    case KILN_ENTRY_ADAPTIVE_AVG_POOL:
    case KILN_ENTRY_ADAPTIVE_AVG_POOL_BACKWARD:
    case KILN_ENTRY_INTERPOLATE:
    case KILN_ENTRY_INTERPOLATE_BACKWARD:
    case KILN_ENTRY_SOFTMAX:
    case KILN_ENTRY_LAYER_NORM:
    case KILN_ENTRY_ADAM_STEP: return kvknn_float_ok(d, dt);
    case KILN_ENTRY_CONV_FUSED:
    case KILN_ENTRY_EPILOGUE:
        /* the fused activations are f32 (the front end composes the others) */
        return dt == KILN_F32;
    default: return true;
    }
}
