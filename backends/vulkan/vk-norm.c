/*
 * backends/vulkan/vk-norm.c — softmax / log-softmax along one dim (shaders/softmax.comp)
 * and layer normalization with its optional mean and rstd outputs (layer-norm.comp),
 * each one workgroup per row with the reductions in shared memory.
 */
#include <string.h>

#include "vk-nn-impl.h"

/* Mirrors softmax.comp's params block. */
typedef struct softmax_params {
    int32_t outer, len, inner, base;
} softmax_params;

int kvk_softmax(void *vq, bool log, const kiln_tdesc *out, const kiln_tdesc *in, int dim)
{
    kvk_queue *q = vq;
    const char *op = log ? "log_softmax" : "softmax";
    if (!kvknn_float_ok(q->d, out->dtype))
        return kvknn_unsupported(op, out->dtype);
    int64_t n = kvk_numel(in);
    int rc = kvknn_fits(n, op, "the input's element count");
    if (rc < 0 || n == 0)
        return rc;
    if (in->ndim > 0 && (dim < 0 || dim >= in->ndim))
        return kiln__error_set("%s: dim %d out of range for %d dims", op, dim, in->ndim), KILN_EINVAL;
    softmax_params s = {.outer = 1, .len = 1, .inner = 1};
    for (int d = 0; d < in->ndim; d++) {
        if (d < dim)
            s.outer *= (int32_t)in->shape[d];
        else if (d == dim)
            s.len = (int32_t)in->shape[d];
        else
            s.inner *= (int32_t)in->shape[d];
    }
    /* each thread strides over the row three times, KVKNN_WG apart */
    int64_t steps = 3 * ((s.len + KVKNN_WG - 1) / KVKNN_WG) + 16;
    if ((rc = kvk_loop_check(q, op, steps, "a row of %d elements", s.len)) < 0)
        return rc;
    kvknn_operand o[2];
    memset(o, 0, sizeof o);
    if ((rc = kvknn_output(q, &o[0], out, false, op)) < 0 || (rc = kvknn_input(q, &o[1], in, op)) < 0) {
        kvknn_release(q, &o[0]);
        kvknn_release(q, &o[1]);
        return rc;
    }
    kiln_buffer *bufs[2] = {o[0].d.buf, o[1].d.buf};
    uint32_t spec_log = log ? 1u : 0u;
    rc = kvknn_launch_groups(q, op, "softmax", out->dtype, bufs, 2, &s, sizeof s, (int64_t)s.outer * s.inner, 1,
                             &spec_log);
    if (rc == 0)
        rc = kvknn_output_done(q, &o[0], op);
    kvknn_release(q, &o[0]);
    kvknn_release(q, &o[1]);
    return rc;
}

/* Mirrors layer-norm.comp's params block. */
typedef struct layer_norm_params {
    int32_t rows, inner, has_weight, has_bias;
    int32_t has_mean, has_rstd, base, pad0;
    float eps;
    uint32_t eps_lo, eps_hi, pad1;
} layer_norm_params;

/* A statistics output: f64 rows keep f64 statistics, the others f32 (the engine asks for
 * them in that dtype); another dtype is refused by name. */
static int stat_output(kvk_queue *q, kvknn_operand *o, const kiln_tdesc *t, kiln_dtype want, const char *op)
{
    if (t && t->dtype != want)
        return kiln__error_set("%s: mean and rstd must be %s here, got %s", op, kiln_dtype_name(want),
                               kiln_dtype_name(t->dtype)),
               KILN_EINVAL;
    return kvknn_output(q, o, t, false, op);
}

int kvk_layer_norm(void *vq, const kiln_tdesc *out, const kiln_tdesc *mean, const kiln_tdesc *rstd,
                   const kiln_tdesc *x, const kiln_tdesc *weight, const kiln_tdesc *bias, int64_t inner,
                   double eps)
{
    kvk_queue *q = vq;
    const char *op = "layer_norm";
    kiln_dtype dt = out->dtype;
    if (!kvknn_float_ok(q->d, dt))
        return kvknn_unsupported(op, dt);
    int64_t total = kvk_numel(x);
    int rc = kvknn_fits(total, op, "the input's element count");
    if (rc < 0 || total == 0)
        return rc;
    if (inner <= 0 || total % inner != 0)
        return kiln__error_set("%s: %lld elements do not split into rows of %lld", op, (long long)total,
                               (long long)inner),
               KILN_EINVAL;
    if ((rc = kvk_loop_check(q, op, 3 * ((inner + KVKNN_WG - 1) / KVKNN_WG) + 16, "a row of %lld elements",
                             (long long)inner)) < 0)
        return rc;
    kiln_dtype stat_dt = dt == KILN_F64 ? KILN_F64 : KILN_F32;
    kvknn_operand o[6];
    memset(o, 0, sizeof o);
    if ((rc = kvknn_output(q, &o[0], out, false, op)) < 0 || (rc = kvknn_input(q, &o[1], x, op)) < 0 ||
        (rc = kvknn_input(q, &o[2], weight, op)) < 0 || (rc = kvknn_input(q, &o[3], bias, op)) < 0 ||
        (rc = stat_output(q, &o[4], mean, stat_dt, op)) < 0 || (rc = stat_output(q, &o[5], rstd, stat_dt, op)) < 0)
        goto done;
    layer_norm_params p = {.rows = (int32_t)(total / inner),
                           .inner = (int32_t)inner,
                           .has_weight = weight != NULL,
                           .has_bias = bias != NULL,
                           .has_mean = mean != NULL,
                           .has_rstd = rstd != NULL,
                           .eps = (float)eps};
    uint64_t bits;
    memcpy(&bits, &eps, sizeof bits);
    p.eps_lo = (uint32_t)bits;
    p.eps_hi = (uint32_t)(bits >> 32);
    kiln_buffer *bufs[6] = {o[0].d.buf,
                            o[1].d.buf,
                            weight ? o[2].d.buf : NULL,
                            bias ? o[3].d.buf : NULL,
                            mean ? o[4].d.buf : NULL,
                            rstd ? o[5].d.buf : NULL};
    rc = kvknn_launch_groups(q, op, "layer-norm", dt, bufs, 6, &p, sizeof p, p.rows, 0, NULL);
    for (int i = 0; rc == 0 && i < 6; i += i == 0 ? 4 : 1)
        rc = kvknn_output_done(q, &o[i], op);
done:
    for (int i = 0; i < 6; i++)
        kvknn_release(q, &o[i]);
    return rc;
}
