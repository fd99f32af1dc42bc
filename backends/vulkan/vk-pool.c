/*
 * backends/vulkan/vk-pool.c — max and average pooling with their input gradient
 * (shaders/pool.comp, pool-bwd.comp) and adaptive average pooling with its gradient
 * (adaptive-pool.comp, adaptive-pool-bwd.comp), over 1-3 spatial dims right-aligned into
 * three, every leading dim a plane.
 *
 * The gradients gather (one thread per grad_x element, summing the outputs whose window
 * reaches it) instead of scattering: no atomics, a fixed order, and every element
 * written once. Max pooling's indices are i64 as the interface asks; the kernels write
 * and read them as 32-bit halves, so they need no 64-bit integer arithmetic.
 */
#include <string.h>

#include "vk-nn-impl.h"

/* Mirrors the params block of pool.comp and pool-bwd.comp. */
typedef struct pool_params {
    int32_t in[3], out[3], k[3], stride[3], pad[3], dil[3];
    int32_t is_max, count_include_pad, has_indices, total;
    int32_t base, unused[3];
} pool_params;

/* Mirrors adaptive-pool.comp's (and the first eight ints of resize.comp's) block. */
typedef struct adaptive_params {
    int32_t in[3], out[3];
    int32_t total, base;
} adaptive_params;

/* Planes and the three right-aligned spatial sizes of t's last ns dims. */
static int64_t planes_of(const kiln_tdesc *t, int ns, int32_t *size)
{
    int64_t planes = 1;
    for (int d = 0; d < t->ndim - ns; d++)
        planes *= t->shape[d];
    for (int d = 0; d < 3; d++) {
        int k = d - (3 - ns);
        size[d] = (int32_t)(k >= 0 ? t->shape[t->ndim - ns + k] : 1);
    }
    return planes;
}

static int check(const char *op, int ns, const kiln_tdesc *a, const kiln_tdesc *b)
{
    if (ns < 1 || ns > 3 || ns > a->ndim || ns > b->ndim)
        return kiln__error_set("%s: %d spatial dims for a %d-d tensor", op, ns, a->ndim), KILN_EINVAL;
    int rc = kvknn_fits(kvk_numel(a), op, "an operand's element count");
    return rc < 0 ? rc : kvknn_fits(kvk_numel(b), op, "an operand's element count");
}

static void release_all(kvk_queue *q, kvknn_operand *o, int n)
{
    for (int i = 0; i < n; i++)
        kvknn_release(q, &o[i]);
}

static void pool_geometry(pool_params *g, const kiln_pool_params *p, int32_t *in, int32_t *out)
{
    int ns = p->nspatial;
    memset(g, 0, sizeof *g);
    memcpy(g->in, in, sizeof g->in);
    memcpy(g->out, out, sizeof g->out);
    for (int d = 0; d < 3; d++) {
        int k = d - (3 - ns);
        g->k[d] = (int32_t)(k >= 0 ? p->kernel[k] : 1);
        g->stride[d] = (int32_t)(k >= 0 ? p->stride[k] : 1);
        g->pad[d] = (int32_t)(k >= 0 ? p->padding[k] : 0);
        g->dil[d] = (int32_t)(k >= 0 ? p->dilation[k] : 1);
    }
    g->is_max = p->kind == KILN_POOL_MAX;
    g->count_include_pad = p->count_include_pad;
}

int kvk_pool(void *vq, const kiln_pool_params *p, const kiln_tdesc *out, const kiln_tdesc *indices,
             const kiln_tdesc *x)
{
    kvk_queue *q = vq;
    const char *op = "pool";
    if (!kvknn_float_ok(q->d, out->dtype))
        return kvknn_unsupported(op, out->dtype);
    if (p->kind != KILN_POOL_MAX && p->kind != KILN_POOL_AVG)
        return kiln__error_set("%s: unknown kind %d", op, (int)p->kind), KILN_EINVAL;
    int rc = check(op, p->nspatial, x, out);
    if (rc < 0)
        return rc;
    int32_t in_sz[3], out_sz[3];
    planes_of(x, p->nspatial, in_sz);
    int64_t total = kvk_numel(out);
    if (total == 0)
        return 0;
    int64_t window[3];
    for (int d = 0; d < 3; d++) {
        int k = d - (3 - p->nspatial);
        window[d] = k >= 0 ? p->kernel[k] : 1;
    }
    if ((rc = kvk_loop_check(q, op, kvknn_nest_steps(window), "a %lld x %lld x %lld window", (long long)window[0],
                             (long long)window[1], (long long)window[2])) < 0)
        return rc;
    bool with_idx = indices && p->kind == KILN_POOL_MAX;
    kvknn_operand o[3];
    memset(o, 0, sizeof o);
    if ((rc = kvknn_output(q, &o[0], out, false, op)) < 0 ||
        (rc = kvknn_output(q, &o[1], with_idx ? indices : NULL, false, op)) < 0 ||
        (rc = kvknn_input(q, &o[2], x, op)) < 0) {
        release_all(q, o, 3);
        return rc;
    }
    planes_of(out, p->nspatial, out_sz);
    pool_params g;
    pool_geometry(&g, p, in_sz, out_sz);
    g.has_indices = with_idx;
    g.total = (int32_t)total;
    kiln_buffer *bufs[3] = {o[0].d.buf, with_idx ? o[1].d.buf : NULL, o[2].d.buf};
    /* average windows sum in double where the device has it, as the reference does */
    const char *shader = p->kind == KILN_POOL_AVG && q->d->feat.f64 && out->dtype != KILN_F64 ? "pool-acc64"
                                                                                              : "pool";
    rc = kvknn_launch_items(q, op, shader, out->dtype, bufs, 3, &g, sizeof g, total);
    if (rc == 0)
        rc = kvknn_output_done(q, &o[0], op);
    if (rc == 0 && with_idx)
        rc = kvknn_output_done(q, &o[1], op);
    release_all(q, o, 3);
    return rc;
}

int kvk_pool_backward(void *vq, const kiln_pool_params *p, const kiln_tdesc *grad_x, const kiln_tdesc *grad_out,
                      const kiln_tdesc *indices)
{
    kvk_queue *q = vq;
    const char *op = "pool_backward";
    if (!kvknn_float_ok(q->d, grad_x->dtype))
        return kvknn_unsupported(op, grad_x->dtype);
    if (p->kind == KILN_POOL_MAX && !indices)
        return kiln__error_set("%s: max pooling needs indices", op), KILN_EINVAL;
    int rc = check(op, p->nspatial, grad_x, grad_out);
    if (rc < 0)
        return rc;
    int64_t total = kvk_numel(grad_x);
    if (total == 0)
        return 0;
    bool is_max = p->kind == KILN_POOL_MAX;
    kvknn_operand o[3];
    memset(o, 0, sizeof o);
    if ((rc = kvknn_output(q, &o[0], grad_x, false, op)) < 0 || (rc = kvknn_input(q, &o[1], grad_out, op)) < 0 ||
        (rc = kvknn_input(q, &o[2], is_max ? indices : NULL, op)) < 0) {
        release_all(q, o, 3);
        return rc;
    }
    int32_t in_sz[3], out_sz[3];
    planes_of(grad_x, p->nspatial, in_sz);
    planes_of(grad_out, p->nspatial, out_sz);
    pool_params g;
    pool_geometry(&g, p, in_sz, out_sz);
    /* the outputs whose windows can reach one element, along each dim */
    int64_t reach[3];
    for (int d = 0; d < 3; d++) {
        int64_t span = (int64_t)(g.k[d] - 1) * (g.dil[d] > 0 ? g.dil[d] : 1) + 1,
                s = g.stride[d] > 0 ? g.stride[d] : 1;
        reach[d] = span / s + 2 < out_sz[d] ? span / s + 2 : out_sz[d];
    }
    if ((rc = kvk_loop_check(q, op, kvknn_nest_steps(reach), "windows overlapping %lld x %lld x %lld deep",
                             (long long)reach[0], (long long)reach[1], (long long)reach[2])) < 0) {
        release_all(q, o, 3);
        return rc;
    }
    g.has_indices = is_max;
    g.total = (int32_t)total;
    kiln_buffer *bufs[3] = {o[0].d.buf, o[1].d.buf, is_max ? o[2].d.buf : NULL};
    if (kvk_numel(grad_out) == 0)
        rc = kvk_fill(q, grad_x, 0.0);
    else
        rc = kvknn_launch_items(q, op, "pool-bwd", grad_x->dtype, bufs, 3, &g, sizeof g, total);
    if (rc == 0 && kvk_numel(grad_out) != 0)
        rc = kvknn_output_done(q, &o[0], op);
    release_all(q, o, 3);
    return rc;
}

/* Adaptive pooling forward (dst = out, src = x) or backward (dst = grad_x, src = grad_out). */
static int adaptive(kvk_queue *q, const char *op, const char *shader, int ns, const kiln_tdesc *dst,
                    const kiln_tdesc *src, const kiln_tdesc *in_t, const kiln_tdesc *out_t)
{
    if (!kvknn_float_ok(q->d, dst->dtype))
        return kvknn_unsupported(op, dst->dtype);
    int rc = check(op, ns, dst, src);
    if (rc < 0)
        return rc;
    int64_t total = kvk_numel(dst);
    if (total == 0)
        return 0;
    adaptive_params a;
    memset(&a, 0, sizeof a);
    planes_of(in_t, ns, a.in);
    planes_of(out_t, ns, a.out);
    int64_t cells[3]; /* what one thread walks along each dim: its window, or the cells reaching it */
    for (int d = 0; d < 3; d++) {
        if (a.in[d] == 0 || a.out[d] == 0) /* nothing to average: an empty window sums to 0 */
            return kvk_fill(q, dst, 0.0);
        int64_t in = a.in[d], out = a.out[d];
        if (dst == out_t)
            cells[d] = (in + out - 1) / out + (in % out != 0);
        else
            cells[d] = (out + in - 1) / in + 3 < out ? (out + in - 1) / in + 3 : out;
    }
    if ((rc = kvk_loop_check(q, op, kvknn_nest_steps(cells), "pooling %d x %d x %d to %d x %d x %d", a.in[0],
                             a.in[1], a.in[2], a.out[0], a.out[1], a.out[2])) < 0)
        return rc;
    a.total = (int32_t)total;
    kvknn_operand o[2];
    memset(o, 0, sizeof o);
    if ((rc = kvknn_output(q, &o[0], dst, false, op)) < 0 || (rc = kvknn_input(q, &o[1], src, op)) < 0) {
        release_all(q, o, 2);
        return rc;
    }
    kiln_buffer *bufs[2] = {o[0].d.buf, o[1].d.buf};
    rc = kvknn_launch_items(q, op, shader, dst->dtype, bufs, 2, &a, sizeof a, total);
    if (rc == 0)
        rc = kvknn_output_done(q, &o[0], op);
    release_all(q, o, 2);
    return rc;
}

int kvk_adaptive_avg_pool(void *q, int nspatial, const kiln_tdesc *out, const kiln_tdesc *x)
{
    return adaptive(q, "adaptive_avg_pool", "adaptive-pool", nspatial, out, x, x, out);
}

int kvk_adaptive_avg_pool_backward(void *q, int nspatial, const kiln_tdesc *grad_x, const kiln_tdesc *grad_out)
{
    return adaptive(q, "adaptive_avg_pool_backward", "adaptive-pool-bwd", nspatial, grad_x, grad_out, grad_x,
                    grad_out);
}
