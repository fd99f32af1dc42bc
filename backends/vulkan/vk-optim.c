/*
 * backends/vulkan/vk-optim.c — the fused Adam/AdamW step (shaders/adam.comp): one pass
 * over param, grad and the moment buffers, in place, with kiln_adam_params' arithmetic.
 * The scalars travel both as floats (for f32, f16 and bf16, which compute in float) and
 * as double bits (for f64), so no variant needs 64-bit floats it does not use.
 */
#include <string.h>

#include "vk-nn-impl.h"

/* Mirrors adam.comp's params block. */
typedef struct adam_params {
    int32_t n, base, l2, scale;
    int32_t amsgrad, maximize, pad0, pad1;
    float f[8];
    uint32_t d[16];
} adam_params;

int kvk_adam_step(void *vq, const kiln_adam_params *p, const kiln_tdesc *param, const kiln_tdesc *grad,
                  const kiln_tdesc *exp_avg, const kiln_tdesc *exp_avg_sq, const kiln_tdesc *max_exp_avg_sq)
{
    kvk_queue *q = vq;
    const char *op = "adam_step";
    kiln_dtype dt = param->dtype;
    if (!kvknn_float_ok(q->d, dt))
        return kvknn_unsupported(op, dt);
    int64_t n = kvk_numel(param);
    const kiln_tdesc *all[5] = {param, grad, exp_avg, exp_avg_sq, p->amsgrad ? max_exp_avg_sq : NULL};
    for (int i = 0; i < 5; i++)
        if (i < 4 || p->amsgrad)
            if (!all[i] || all[i]->dtype != dt || kvk_numel(all[i]) != n)
                return kiln__error_set("%s: operand %d must be a %s tensor of %lld elements", op, i,
                                       kiln_dtype_name(dt), (long long)n),
                       KILN_EINVAL;
    int rc = kvknn_fits(n, op, "the parameter's element count");
    if (rc < 0 || n == 0)
        return rc;
    adam_params a;
    memset(&a, 0, sizeof a);
    a.n = (int32_t)n;
    a.l2 = !p->decoupled && p->weight_decay != 0;
    a.scale = p->decoupled && p->weight_decay != 0;
    a.amsgrad = p->amsgrad;
    a.maximize = p->maximize;
    const double s[8] = {p->param_scale, p->weight_decay, 1 - p->beta1, p->beta2,
                         1 - p->beta2,   p->inv_bc2_sqrt, p->eps,       -p->step_size};
    for (int i = 0; i < 8; i++) {
        uint64_t bits;
        memcpy(&bits, &s[i], sizeof bits);
        a.f[i] = (float)s[i];
        a.d[2 * i] = (uint32_t)bits;
        a.d[2 * i + 1] = (uint32_t)(bits >> 32);
    }
    kvknn_operand o[5];
    memset(o, 0, sizeof o);
    if ((rc = kvknn_output(q, &o[0], param, true, op)) < 0 || (rc = kvknn_input(q, &o[1], grad, op)) < 0 ||
        (rc = kvknn_output(q, &o[2], exp_avg, true, op)) < 0 ||
        (rc = kvknn_output(q, &o[3], exp_avg_sq, true, op)) < 0 ||
        (rc = kvknn_output(q, &o[4], all[4], true, op)) < 0)
        goto done;
    kiln_buffer *bufs[5] = {o[0].d.buf, o[1].d.buf, o[2].d.buf, o[3].d.buf, all[4] ? o[4].d.buf : NULL};
    rc = kvknn_launch_items(q, op, "adam", dt, bufs, 5, &a, sizeof a, n);
    for (int i = 0; rc == 0 && i < 5; i++)
        if (i != 1)
            rc = kvknn_output_done(q, &o[i], op);
done:
    for (int i = 0; i < 5; i++)
        kvknn_release(q, &o[i]);
    return rc;
}
