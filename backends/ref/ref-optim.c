/*
 * backends/ref/ref-optim.c — the oracle's fused Adam/AdamW step (adam_step): every
 * operand read whole into double, the update of kiln_adam_params applied per element in
 * double, the results written back rounded once. Any strides are accepted here, so the
 * oracle checks the arithmetic, not the layout rules of a fast backend. Intermediates
 * round to the dtype where the composed update's primitives would.
 */
#include <math.h>
#include <stdlib.h>

#include "ref-impl.h"

int kiln__ref_adam_step(void *ctx, const kiln_adam_params *p, const kiln_tdesc *param,
                        const kiln_tdesc *grad, const kiln_tdesc *exp_avg, const kiln_tdesc *exp_avg_sq,
                        const kiln_tdesc *max_exp_avg_sq)
{
    const kiln_tdesc *all[5] = {param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq};
    int nt = p->amsgrad ? 5 : 4;
    int64_t n = ref_numel(param);
    for (int i = 0; i < nt; i++) {
        if (!all[i] || !ref_is_float(all[i]->dtype) || ref_numel(all[i]) != n)
            return ref_fail(KILN_EINVAL, "ref adam_step: operand %d must be a floating tensor of %lld elements",
                            i, (long long)n);
    }
    if (n == 0)
        return 0;
    double *buf[5] = {NULL};
    int rc = 0;
    for (int i = 0; i < nt && rc == 0; i++)
        if (!(buf[i] = ref_read_flat(all[i], "adam_step")))
            rc = KILN_ENOMEM;
    if (rc == 0) {
        /* Each intermediate is rounded to the parameter's dtype where the composition
         * (one primitive per step) would round it, so overflow and underflow behave as
         * in the dtype: g * g of a 1e30 gradient is inf in f32, not 1e60. */
        bool f32 = param->dtype != KILN_F64;
#define RD(e) (f32 ? (double)(float)(e) : (e))
        double *x = buf[0], *gr = buf[1], *m = buf[2], *v = buf[3], *vx = buf[4];
        bool l2 = !p->decoupled && p->weight_decay != 0, scale = p->decoupled && p->weight_decay != 0;
        for (int64_t i = 0; i < n; i++) {
            double g = p->maximize ? -gr[i] : gr[i];
            if (scale)
                x[i] = RD(x[i] * p->param_scale);
            if (l2)
                g = RD(g + RD(x[i] * p->weight_decay));
            m[i] = RD(m[i] + RD(RD(g - m[i]) * (1 - p->beta1)));
            v[i] = RD(RD(v[i] * p->beta2) + RD(RD(g * g) * (1 - p->beta2)));
            double s = v[i];
            if (vx) {
                if (isnan(vx[i]) || isnan(s))
                    vx[i] = NAN;
                else if (s > vx[i])
                    vx[i] = s;
                s = vx[i];
            }
            double denom = RD(RD(RD(sqrt(s)) * p->inv_bc2_sqrt) + p->eps);
            x[i] = RD(x[i] + RD(RD(m[i] / denom) * -p->step_size));
        }
#undef RD
        ref_write_flat(param, x);
        ref_write_flat(exp_avg, m);
        ref_write_flat(exp_avg_sq, v);
        if (vx)
            ref_write_flat(max_exp_avg_sq, vx);
    }
    for (int i = 0; i < 5; i++)
        free(buf[i]);
    return rc;
}
