/*
 * tests/conformance/cases-optim.c — optimizer steps: Adam and AdamW (plain, weight
 * decay, amsgrad, maximize) over three steps, the parameter and the exported state
 * compared with ref. On cpu and ref these run the fused adam_step primitive when every
 * operand is contiguous; a strided parameter takes the composed path on cpu and is
 * still compared with ref's fused answer, so both paths are held to the same numbers.
 */
#include <math.h>
#include <stdio.h>

#include "conformance.h"
#include "kiln/optim.h"

static int b_adam(const conf_case *c, kiln_device *dev, kiln_tensor **in, kiln_tensor **out)
{
    /* in[0] is the parameter, updated in place (marked mutated); in[1], in[2] the
     * gradients of alternate steps. */
    kiln_tensor *p = in[0];
    kiln_optim_config cfg = kiln_optim_config_default(c->p[0] ? KILN_OPTIM_ADAMW : KILN_OPTIM_ADAM);
    cfg.lr = c->d[0];
    cfg.weight_decay = c->d[1];
    cfg.amsgrad = c->p[1] != 0;
    cfg.maximize = c->p[2] != 0;
    kiln_optim *opt = kiln_optim_create(&cfg, 1, &p, NULL);
    if (!opt)
        return -1;
    for (int s = 0; s < 3; s++) {
        kiln_tensor *g = in[1 + s % 2];
        if (kiln_optim_step_grads(opt, &g) < 0) {
            kiln_optim_free(opt);
            return -1;
        }
    }
    kiln_optim_state st;
    if (kiln_optim_state_export(opt, &st) < 0) {
        kiln_optim_free(opt);
        return -1;
    }
    int n = 0;
    out[n++] = kiln_clone(p);
    for (int i = 0; i < st.n && n < CONF_MAX_OUT; i++)
        out[n++] = kiln_clone(st.tensors[i]);
    kiln_optim_state_free(&st);
    kiln_optim_free(opt);
    for (int i = 0; i < n; i++)
        if (!out[i])
            return -1;
    return n;
}

static void adam_case(kiln_dtype dt, bool adamw, double wd, bool amsgrad, bool maximize, int ndim,
                      const int64_t *shape, conf_view pv, conf_view gv, conf_gen gg)
{
    conf_case c = conf_make("adam_step", dt, b_adam);
    c.p[0] = adamw;
    c.p[1] = amsgrad;
    c.p[2] = maximize;
    c.d[0] = 1e-2;
    c.d[1] = wd;
    conf_in(&c, -1, ndim, shape, G_UNI, -2, 2, pv);
    conf_in(&c, -1, ndim, shape, gg, -1, 1, gv);
    conf_in(&c, -1, ndim, shape, G_UNI, -0.01, 0.01, V_NONE);
    c.in[0].mutated = true;
    /* tiny second moments make the update m / (sqrt(v) + eps) sensitive to rounding */
    c.tol = TOL_REL;
    c.tol_a = dt == KILN_F64 ? 1e-10 : 2e-5;
    c.tol_b = dt == KILN_F64 ? 1e-12 : 1e-6;
    conf_push(&c, "%s wd %g%s%s", adamw ? "adamw" : "adam", wd, amsgrad ? " amsgrad" : "",
              maximize ? " maximize" : "");
}

void conf_cases_optim(void)
{
    static const kiln_dtype dts[2] = {KILN_F32, KILN_F64};
    for (int i = 0; i < 2; i++) {
        kiln_dtype dt = dts[i];
        for (int adamw = 0; adamw < 2; adamw++)
            for (int v = 0; v < 4; v++)
                adam_case(dt, adamw, v & 1 ? 0.05 : 0, v & 2, adamw && v == 3, KILN_SHAPE(37, 29), V_NONE,
                          V_NONE, G_UNI);
        adam_case(dt, false, 0.1, false, true, KILN_SHAPE(1), V_NONE, V_NONE, G_UNI);
    }
    /* more elements than one thread's share; strided parameter and gradient (composed on
     * cpu); NaN/Inf gradients; an empty parameter */
    adam_case(KILN_F32, true, 0.01, false, false, KILN_SHAPE(70001), V_NONE, V_NONE, G_UNI);
    adam_case(KILN_F32, true, 0.01, true, false, KILN_SHAPE(9, 14), V_T, V_NONE, G_UNI);
    adam_case(KILN_F32, false, 0.01, false, false, KILN_SHAPE(9, 14), V_NONE, V_STEP, G_UNI);
    adam_case(KILN_F32, true, 0, true, false, KILN_SHAPE(6, 7), V_NONE, V_NONE, G_SPECIAL);
    adam_case(KILN_F32, true, 0.01, false, false, KILN_SHAPE(0, 5), V_NONE, V_NONE, G_UNI);
}
