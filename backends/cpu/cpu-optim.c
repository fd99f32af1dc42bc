/*
 * backends/cpu/cpu-optim.c — the fused Adam/AdamW step (backend entry adam_step).
 *
 * Composed from elementwise primitives, one Adam step over a parameter is about a dozen
 * passes over memory (lerp, the squared-gradient average, sqrt, scale, add, divide,
 * axpy, the write back) and as many temporaries; here it is one pass that reads param,
 * grad, exp_avg and exp_avg_sq once and writes param and the two averages once, threaded
 * over the pool. The arithmetic is the composition's, in the tensors' own precision
 * (f32 or f64), in the same order, so results agree to rounding.
 */
#include "cpu-impl.h"

typedef struct adam_job {
    const kiln_adam_params *p;
    void *param, *m, *v, *vmax;
    const void *grad;
} adam_job;

/* maximum() as the binary primitive has it: NaN if either side is NaN. */
#define ADAM_RANGE(T, SQRT)                                                                    \
    static void adam_range_##T(void *argp, int64_t b, int64_t e)                               \
    {                                                                                          \
        const adam_job *j = argp;                                                              \
        const kiln_adam_params *p = j->p;                                                      \
        T *restrict pa = j->param, *restrict ma = j->m, *restrict va = j->v;                   \
        T *restrict vx = j->vmax;                                                              \
        const T *restrict ga = j->grad;                                                        \
        const T b1c = (T)(1 - p->beta1), b2 = (T)p->beta2, b2c = (T)(1 - p->beta2);            \
        const T eps = (T)p->eps, wd = (T)p->weight_decay, ps = (T)p->param_scale;              \
        const T step = (T)p->step_size, inv = (T)p->inv_bc2_sqrt, sg = p->maximize ? -1 : 1;   \
        const bool l2 = !p->decoupled && p->weight_decay != 0;                                 \
        const bool scale = p->decoupled && p->weight_decay != 0;                               \
        for (int64_t i = b; i < e; i++) {                                                      \
            T g = sg * ga[i], x = pa[i];                                                       \
            if (scale)                                                                         \
                x = x * ps;                                                                    \
            if (l2)                                                                            \
                g = g + wd * x;                                                                \
            T m = ma[i] + b1c * (g - ma[i]);                                                   \
            T v = va[i] * b2 + (g * g) * b2c;                                                  \
            T s = v;                                                                           \
            if (vx) {                                                                          \
                T o = vx[i];                                                                   \
                s = o != o ? o : v != v ? v : (v > o ? v : o);                                 \
                vx[i] = s;                                                                     \
            }                                                                                  \
            ma[i] = m;                                                                         \
            va[i] = v;                                                                         \
            pa[i] = x + (-step) * (m / (SQRT(s) * inv + eps));                                 \
        }                                                                                      \
    }

ADAM_RANGE(float, sqrtf)
ADAM_RANGE(double, sqrt)

int kiln__cpu_adam_step(void *vctx, const kiln_adam_params *p, const kiln_tdesc *param,
                        const kiln_tdesc *grad, const kiln_tdesc *exp_avg, const kiln_tdesc *exp_avg_sq,
                        const kiln_tdesc *max_exp_avg_sq)
{
    kiln__cpu_ctx *ctx = vctx;
    const kiln_tdesc *all[5] = {param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq};
    int nt = p->amsgrad ? 5 : 4;
    if (param->dtype != KILN_F32 && param->dtype != KILN_F64)
        return kiln__error_set("cpu adam_step: dtype %s is not f32 or f64", kiln_dtype_name(param->dtype)),
               KILN_EINVAL;
    int64_t n = kiln__cpu_numel(param);
    for (int i = 0; i < nt; i++) {
        if (!all[i])
            return kiln__error_set("cpu adam_step: operand %d is missing", i), KILN_EINVAL;
        if (all[i]->dtype != param->dtype || kiln__cpu_numel(all[i]) != n || !kiln__cpu_contig(all[i]))
            return kiln__error_set("cpu adam_step: operand %d must be a contiguous %s tensor of %lld elements",
                                   i, kiln_dtype_name(param->dtype), (long long)n),
                   KILN_EINVAL;
    }
    if (n == 0)
        return 0;
    adam_job j = {p, kiln__cpu_ptr(param), kiln__cpu_ptr(exp_avg), kiln__cpu_ptr(exp_avg_sq),
                  p->amsgrad ? kiln__cpu_ptr(max_exp_avg_sq) : NULL, kiln__cpu_ptr(grad)};
    kiln__cpu_parallel_for(ctx, n, 16384, param->dtype == KILN_F32 ? adam_range_float : adam_range_double, &j);
    return 0;
}
