/*
 * backends/vulkan/vk-resize.c — interpolate (nearest, and linear over 1-3 spatial dims)
 * and its input gradient (shaders/resize.comp, resize-bwd.comp). x is [N, C, S...]; the
 * spatial dims are right-aligned into three. The gradient gathers from the outputs whose
 * taps name each input element, so it needs no atomics and writes every element once.
 */
#include <string.h>

#include "vk-nn-impl.h"

/* Mirrors the params block of resize.comp / resize-bwd.comp. */
typedef struct resize_params {
    int32_t in[3], out[3];
    int32_t nearest, align_corners, total, base;
} resize_params;

static void sizes(const kiln_tdesc *t, int ns, int32_t *size)
{
    for (int d = 0; d < 3; d++) {
        int k = d - (3 - ns);
        size[d] = (int32_t)(k >= 0 ? t->shape[2 + k] : 1);
    }
}

/* forward: dst = out, src = x; backward: dst = grad_x, src = grad_out */
static int resize(kvk_queue *q, const char *op, const char *shader, kiln_interp_mode mode, bool align,
                  const kiln_tdesc *dst, const kiln_tdesc *src, const kiln_tdesc *x, const kiln_tdesc *y)
{
    if (!kvknn_float_ok(q->d, dst->dtype))
        return kvknn_unsupported(op, dst->dtype);
    if (mode != KILN_INTERP_NEAREST && mode != KILN_INTERP_BILINEAR)
        return kiln__error_set("%s: unknown mode %d", op, (int)mode), KILN_EINVAL;
    int ns = x->ndim - 2;
    if (ns < 1 || ns > 3 || y->ndim != x->ndim)
        return kiln__error_set("%s: x must have 3 to 5 dims, got %d", op, x->ndim), KILN_EINVAL;
    int rc = kvknn_fits(kvk_numel(dst), op, "an operand's element count");
    if (rc < 0 || (rc = kvknn_fits(kvk_numel(src), op, "an operand's element count")) < 0)
        return rc;
    int64_t total = kvk_numel(dst);
    if (total == 0)
        return 0;
    resize_params r;
    memset(&r, 0, sizeof r);
    sizes(x, ns, r.in);
    sizes(y, ns, r.out);
    if (kvk_numel(src) == 0)
        return kvk_fill(q, dst, 0.0);
    r.nearest = mode == KILN_INTERP_NEAREST;
    r.align_corners = align;
    r.total = (int32_t)total;
    if (dst != y) { /* the gradient: each element walks the outputs its taps reach (out_span) */
        int64_t span[3];
        for (int d = 0; d < 3; d++) {
            int64_t ratio = (r.out[d] + r.in[d] - 1) / (r.in[d] > 0 ? r.in[d] : 1);
            span[d] = 3 * ratio + 6 < r.out[d] ? 3 * ratio + 6 : r.out[d];
        }
        if ((rc = kvk_loop_check(q, op, kvknn_nest_steps(span), "a %d x %d x %d result of %d x %d x %d", r.out[0],
                                 r.out[1], r.out[2], r.in[0], r.in[1], r.in[2])) < 0)
            return rc;
    }
    kvknn_operand o[2];
    memset(o, 0, sizeof o);
    if ((rc = kvknn_output(q, &o[0], dst, false, op)) < 0 || (rc = kvknn_input(q, &o[1], src, op)) < 0) {
        kvknn_release(q, &o[0]);
        kvknn_release(q, &o[1]);
        return rc;
    }
    kiln_buffer *bufs[2] = {o[0].d.buf, o[1].d.buf};
    rc = kvknn_launch_items(q, op, shader, dst->dtype, bufs, 2, &r, sizeof r, total);
    if (rc == 0)
        rc = kvknn_output_done(q, &o[0], op);
    kvknn_release(q, &o[0]);
    kvknn_release(q, &o[1]);
    return rc;
}

int kvk_interpolate(void *q, kiln_interp_mode mode, bool align_corners, const kiln_tdesc *out, const kiln_tdesc *x)
{
    return resize(q, "interpolate", "resize", mode, align_corners, out, x, x, out);
}

int kvk_interpolate_backward(void *q, kiln_interp_mode mode, bool align_corners, const kiln_tdesc *grad_x,
                             const kiln_tdesc *grad_out)
{
    return resize(q, "interpolate_backward", "resize-bwd", mode, align_corners, grad_x, grad_out, grad_x,
                  grad_out);
}
