/*
 * engine/optim/optim.c — the optimizers: SGD, Adam, AdamW, RMSprop and Adagrad with
 * PyTorch's update rules (torch.optim's single-tensor path, step for step), gradient
 * accumulation, and the optimizer's life cycle.
 *
 * Each update is written with the public tensor ops, so it runs on any backend, inside
 * a no-grad section and a scope of its own. New parameter values and new state tensors
 * are all computed first; only when every one of them exists are the parameters
 * overwritten in place and the state swapped in, so a failing step leaves the optimizer
 * and the parameters as they were.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error-impl.h"
#include "kiln/autodiff.h"
#include "optim-impl.h"
#include "tensor-impl.h"

static const char *const kind_names[KILN_OPTIM_KIND_COUNT] = {
    [KILN_OPTIM_SGD] = "sgd",         [KILN_OPTIM_ADAM] = "adam",       [KILN_OPTIM_ADAMW] = "adamw",
    [KILN_OPTIM_RMSPROP] = "rmsprop", [KILN_OPTIM_ADAGRAD] = "adagrad",
};

/* The slot names are PyTorch's state keys, so an exported state reads like a
 * torch.optim state_dict. */
static const char *const slot_names[KILN_OPTIM_KIND_COUNT][KILN_OPTIM_SLOTS] = {
    [KILN_OPTIM_SGD] = {"momentum_buffer", NULL, NULL},
    [KILN_OPTIM_ADAM] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
    [KILN_OPTIM_ADAMW] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
    [KILN_OPTIM_RMSPROP] = {"square_avg", "momentum_buffer", "grad_avg"},
    [KILN_OPTIM_ADAGRAD] = {"sum", NULL, NULL},
};

const char *kiln_optim_kind_name(kiln_optim_kind kind)
{
    return (unsigned)kind < KILN_OPTIM_KIND_COUNT ? kind_names[kind] : "?";
}

int kiln_optim_kind_from_name(const char *name)
{
    for (int k = 0; name && k < KILN_OPTIM_KIND_COUNT; k++)
        if (strcmp(name, kind_names[k]) == 0)
            return k;
    return -1;
}

const char *kiln__optim_slot_name(kiln_optim_kind kind, int i)
{
    if ((unsigned)kind >= KILN_OPTIM_KIND_COUNT || i < 0 || i >= KILN_OPTIM_SLOTS)
        return NULL;
    return slot_names[kind][i];
}

kiln_optim_config kiln_optim_config_default(kiln_optim_kind kind)
{
    kiln_optim_config c = {.kind = kind, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                           .alpha = 0.99, .accumulate_steps = 1};
    switch (kind) {
    case KILN_OPTIM_ADAMW:
        c.weight_decay = 1e-2;
        break;
    case KILN_OPTIM_RMSPROP:
        c.lr = 1e-2;
        break;
    case KILN_OPTIM_ADAGRAD:
        c.lr = 1e-2;
        c.eps = 1e-10;
        break;
    default:
        break;
    }
    return c;
}

int kiln__optim_check_config(const kiln_optim_config *c, const char *op)
{
    if (!c)
        return kiln__error_set("%s: config is NULL", op);
    if ((unsigned)c->kind >= KILN_OPTIM_KIND_COUNT)
        return kiln__error_set("%s: unknown optimizer kind %d", op, (int)c->kind);
    const char *k = kind_names[c->kind];
    /* The same checks, in the same spirit, as torch.optim's constructors. */
    /* Stricter than torch.optim: an infinite lr, too, turns every parameter into NaN. */
    if (!(c->lr >= 0) || isinf(c->lr))
        return kiln__error_set("%s: %s: invalid learning rate %g", op, k, c->lr);
    if (!(c->weight_decay >= 0))
        return kiln__error_set("%s: %s: invalid weight_decay %g", op, k, c->weight_decay);
    if (!(c->eps >= 0))
        return kiln__error_set("%s: %s: invalid eps %g", op, k, c->eps);
    if (c->accumulate_steps < 0)
        return kiln__error_set("%s: %s: invalid accumulate_steps %d", op, k, c->accumulate_steps);
    switch (c->kind) {
    case KILN_OPTIM_SGD:
        if (!(c->momentum >= 0))
            return kiln__error_set("%s: sgd: invalid momentum %g", op, c->momentum);
        if (c->nesterov && (c->momentum <= 0 || c->dampening != 0))
            return kiln__error_set("%s: sgd: nesterov needs momentum > 0 and dampening 0 (momentum %g, "
                                   "dampening %g)", op, c->momentum, c->dampening);
        break;
    case KILN_OPTIM_ADAM:
    case KILN_OPTIM_ADAMW:
        if (!(c->beta1 >= 0 && c->beta1 < 1) || !(c->beta2 >= 0 && c->beta2 < 1))
            return kiln__error_set("%s: %s: invalid betas (%g, %g)", op, k, c->beta1, c->beta2);
        break;
    case KILN_OPTIM_RMSPROP:
        if (!(c->momentum >= 0))
            return kiln__error_set("%s: rmsprop: invalid momentum %g", op, c->momentum);
        if (!(c->alpha >= 0))
            return kiln__error_set("%s: rmsprop: invalid alpha %g", op, c->alpha);
        break;
    case KILN_OPTIM_ADAGRAD:
        if (!(c->lr_decay >= 0))
            return kiln__error_set("%s: adagrad: invalid lr_decay %g", op, c->lr_decay);
        if (!(c->initial_accumulator_value >= 0))
            return kiln__error_set("%s: adagrad: invalid initial_accumulator_value %g", op,
                                   c->initial_accumulator_value);
        break;
    default:
        break;
    }
    return 0;
}

int kiln__optim_write(kiln_tensor *dst, kiln_tensor *src, const char *op)
{
    if (!dst || !src)
        return -1;
    if (dst->ndim != src->ndim || memcmp(dst->shape, src->shape, sizeof(int64_t) * (size_t)dst->ndim)) {
        char a[128], b[128];
        return kiln__error_set("%s: cannot write %s into %s", op, kiln__describe(src, b, sizeof b),
                               kiln__describe(dst, a, sizeof a));
    }
    return kiln__copy_into(dst, src, op);
}

static void param_free(kiln__optim_pstate *p)
{
    kiln_tensor_release(p->param);
    free(p->name);
    for (int s = 0; s < KILN_OPTIM_SLOTS; s++)
        kiln_tensor_release(p->slot[s]);
    kiln_tensor_release(p->accum);
}

void kiln_optim_free(kiln_optim *opt)
{
    if (!opt)
        return;
    for (int i = 0; i < opt->n; i++)
        param_free(&opt->p[i]);
    free(opt->p);
    free(opt);
}

kiln_optim *kiln_optim_create(const kiln_optim_config *cfg, int n, kiln_tensor *const *params,
                              const char *const *names)
{
    const char *op = "optim_create";
    if (kiln__optim_check_config(cfg, op) < 0)
        return NULL;
    if (n < 0 || (n > 0 && !params)) {
        kiln__error_set("%s: %s: bad parameter list (n = %d)", op, kind_names[cfg->kind], n);
        return NULL;
    }
    /* As torch.optim refuses one: an optimizer over nothing can only be a mistake (a model
     * that lost its layers, a filter that matched no parameter). */
    if (n == 0) {
        kiln__error_set("%s: %s: empty parameter list (n = 0)", op, kind_names[cfg->kind]);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        char buf[128];
        if (!params[i]) {
            kiln__error_set("%s: %s: parameter %d is NULL", op, kind_names[cfg->kind], i);
            return NULL;
        }
        if (!kiln_dtype_is_float(params[i]->dtype)) {
            kiln__error_set("%s: %s: parameter %d (%s) is not floating", op, kind_names[cfg->kind], i,
                            kiln__describe(params[i], buf, sizeof buf));
            return NULL;
        }
        /* The result of an op: writing the update into it would change a temporary the
         * forward recomputes, never the leaf it was computed from (torch.optim refuses it too). */
        if (kiln_tensor_has_grad_fn(params[i])) {
            if (names && names[i])
                kiln__error_set("%s: %s: can't optimize a non-leaf tensor: parameter %d \"%s\" (%s) is the "
                                "output of an op; pass the leaf it was computed from",
                                op, kind_names[cfg->kind], i, names[i],
                                kiln__describe(params[i], buf, sizeof buf));
            else
                kiln__error_set("%s: %s: can't optimize a non-leaf tensor: parameter %d (%s) is the output of an "
                                "op; pass the leaf it was computed from",
                                op, kind_names[cfg->kind], i, kiln__describe(params[i], buf, sizeof buf));
            return NULL;
        }
        if (names && (!names[i] || !names[i][0])) {
            kiln__error_set("%s: %s: parameter %d has an empty name", op, kind_names[cfg->kind], i);
            return NULL;
        }
        for (int j = 0; j < i; j++) {
            if (params[j] == params[i]) {
                kiln__error_set("%s: %s: parameter %d appears twice (also %d)", op, kind_names[cfg->kind], i, j);
                return NULL;
            }
            if (names && strcmp(names[i], names[j]) == 0) {
                kiln__error_set("%s: %s: duplicate parameter name \"%s\"", op, kind_names[cfg->kind], names[i]);
                return NULL;
            }
        }
    }
    kiln_optim *opt = calloc(1, sizeof *opt);
    if (!opt || !(opt->p = calloc(n ? (size_t)n : 1, sizeof *opt->p))) {
        free(opt);
        kiln__error_set("%s: out of memory", op);
        return NULL;
    }
    opt->cfg = *cfg;
    if (opt->cfg.accumulate_steps < 1)
        opt->cfg.accumulate_steps = 1;
    opt->n = n;
    for (int i = 0; i < n; i++) {
        char tmp[32];
        snprintf(tmp, sizeof tmp, "param.%d", i);
        opt->p[i].param = kiln_tensor_retain(params[i]);
        opt->p[i].name = strdup(names ? names[i] : tmp);
        if (!opt->p[i].name) {
            kiln_optim_free(opt);
            kiln__error_set("%s: out of memory", op);
            return NULL;
        }
    }
    return opt;
}

/* ------------------------------------------------------------------ update rules */

/* What one parameter's update produces: its new value and its new state, or NULL
 * entries where a slot stays as it is. All are scope-held until committed. */
typedef struct update {
    kiln_tensor *param;
    kiln_tensor *slot[KILN_OPTIM_SLOTS];
} update;

static kiln_tensor *axpy(kiln_tensor *y, double a, kiln_tensor *x) /* y + a x */
{
    return kiln_add(y, kiln_mul_scalar(x, a));
}

/* torch.optim.SGD, _single_tensor_sgd. */
static void sgd_update(const kiln_optim_config *c, const kiln__optim_pstate *ps, kiln_tensor *g, update *u)
{
    kiln_tensor *p = ps->param;
    if (c->weight_decay != 0)
        g = axpy(g, c->weight_decay, p);
    if (c->momentum != 0) {
        kiln_tensor *buf = ps->slot[0];
        /* The first buffer is the gradient itself, undamped. */
        buf = buf ? kiln_add(kiln_mul_scalar(buf, c->momentum), kiln_mul_scalar(g, 1 - c->dampening))
                  : kiln_clone(g);
        u->slot[0] = buf;
        g = c->nesterov ? axpy(g, c->momentum, buf) : buf;
    }
    u->param = axpy(p, -c->lr, g);
}

/* torch.optim.Adam / AdamW, _single_tensor_adam. */
static void adam_update(const kiln_optim_config *c, const kiln__optim_pstate *ps, kiln_tensor *g, int64_t step,
                        update *u)
{
    kiln_tensor *p = ps->param;
    if (c->weight_decay != 0) {
        if (c->kind == KILN_OPTIM_ADAMW)
            p = kiln_mul_scalar(p, 1 - c->lr * c->weight_decay);
        else
            g = axpy(g, c->weight_decay, p);
    }
    kiln_tensor *m = ps->slot[0] ? ps->slot[0] : kiln_zeros_like(p);
    kiln_tensor *v = ps->slot[1] ? ps->slot[1] : kiln_zeros_like(p);
    m = axpy(m, 1 - c->beta1, kiln_sub(g, m)); /* exp_avg.lerp_(grad, 1 - beta1) */
    v = kiln_add(kiln_mul_scalar(v, c->beta2), kiln_mul_scalar(kiln_mul(g, g), 1 - c->beta2));
    u->slot[0] = m;
    u->slot[1] = v;
    double bc1 = 1 - pow(c->beta1, (double)step);
    double bc2_sqrt = sqrt(1 - pow(c->beta2, (double)step));
    kiln_tensor *second = v;
    if (c->amsgrad) {
        kiln_tensor *vmax = ps->slot[2] ? kiln_maximum(ps->slot[2], v) : kiln_clone(v);
        u->slot[2] = vmax;
        second = vmax;
    }
    kiln_tensor *denom = kiln_add_scalar(kiln_mul_scalar(kiln_sqrt(second), 1 / bc2_sqrt), c->eps);
    u->param = axpy(p, -c->lr / bc1, kiln_div(m, denom));
}

/* The fused path: when the parameter's backend has adam_step and every operand is a
 * contiguous f32/f64 tensor of the parameter's dtype, the step runs as one in-place pass
 * (param, exp_avg, exp_avg_sq and max_exp_avg_sq) instead of the composition above. The
 * state tensors are the optimizer's own (export and import copy them), so updating them
 * in place is invisible outside; a slot shared anyway keeps the composed path. */
static bool plain_contig(const kiln_tensor *t, const kiln_tensor *like)
{
    if (!t || t->dtype != like->dtype || t->ndim != like->ndim ||
        memcmp(t->shape, like->shape, sizeof(int64_t) * (size_t)t->ndim))
        return false;
    int64_t st[KILN_MAX_DIMS];
    kiln__contig_strides(t->ndim, t->shape, st);
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] != 1 && t->strides[d] != st[d])
            return false;
    return true;
}

static bool sole_owner(const kiln_tensor *t)
{
    return !t || (atomic_load(&t->refcount) == 1 && atomic_load(&t->storage->refcount) == 1);
}

static bool adam_fusable(const kiln_optim_config *c, const kiln__optim_pstate *ps, const kiln_tensor *g)
{
    const kiln_tensor *p = ps->param;
    if (!kiln__supports(kiln__dev(p), KILN_ENTRY_ADAM_STEP, -1, p->dtype, NULL) || (p->dtype != KILN_F32 && p->dtype != KILN_F64) || !plain_contig(p, p) ||
        !plain_contig(g, p) || kiln__dev(g) != kiln__dev(p))
        return false;
    int ns = c->amsgrad ? 3 : 2;
    for (int s = 0; s < ns; s++)
        if (ps->slot[s] && (!plain_contig(ps->slot[s], p) || !sole_owner(ps->slot[s])))
            return false;
    return true;
}

/* Creates missing state (zeros, as the composition starts from) outside the scope. */
static int adam_fused_prepare(const kiln_optim_config *c, kiln__optim_pstate *ps)
{
    int ns = c->amsgrad ? 3 : 2;
    for (int s = 0; s < ns; s++) {
        if (ps->slot[s])
            continue;
        kiln_tensor *z = kiln_zeros_like(ps->param);
        if (!z)
            return -1;
        kiln_keep(z);
        ps->slot[s] = z;
    }
    return 0;
}

static int adam_fused_run(const kiln_optim_config *c, kiln__optim_pstate *ps, kiln_tensor *g, int64_t step)
{
    kiln_adam_params ap = {
        .beta1 = c->beta1,
        .beta2 = c->beta2,
        .eps = c->eps,
        .weight_decay = c->weight_decay,
        .param_scale = 1 - c->lr * c->weight_decay,
        .step_size = c->lr / (1 - pow(c->beta1, (double)step)),
        .inv_bc2_sqrt = 1 / sqrt(1 - pow(c->beta2, (double)step)),
        .decoupled = c->kind == KILN_OPTIM_ADAMW,
        .amsgrad = c->amsgrad,
        .maximize = c->maximize,
    };
    kiln_tdesc pd, gd, md, vd, xd;
    kiln__desc(ps->param, &pd);
    kiln__desc(g, &gd);
    kiln__desc(ps->slot[0], &md);
    kiln__desc(ps->slot[1], &vd);
    if (c->amsgrad)
        kiln__desc(ps->slot[2], &xd);
    int rc = kiln__be(ps->param)->adam_step(kiln__ctx(ps->param), &ap, &pd, &gd, &md, &vd,
                                            c->amsgrad ? &xd : NULL);
    atomic_fetch_add(&ps->param->storage->version, 1u);
    kiln__stamp(ps->param->storage);
    kiln__stamp(ps->slot[0]->storage);
    kiln__stamp(ps->slot[1]->storage);
    if (c->amsgrad)
        kiln__stamp(ps->slot[2]->storage);
    return rc < 0 ? -1 : 0;
}

/* torch.optim.RMSprop, _single_tensor_rmsprop. */
static void rmsprop_update(const kiln_optim_config *c, const kiln__optim_pstate *ps, kiln_tensor *g, update *u)
{
    kiln_tensor *p = ps->param;
    if (c->weight_decay != 0)
        g = axpy(g, c->weight_decay, p);
    kiln_tensor *sq = ps->slot[0] ? ps->slot[0] : kiln_zeros_like(p);
    sq = kiln_add(kiln_mul_scalar(sq, c->alpha), kiln_mul_scalar(kiln_mul(g, g), 1 - c->alpha));
    u->slot[0] = sq;
    kiln_tensor *avg;
    if (c->centered) {
        kiln_tensor *ga = ps->slot[2] ? ps->slot[2] : kiln_zeros_like(p);
        ga = axpy(ga, 1 - c->alpha, kiln_sub(g, ga)); /* grad_avg.lerp_(grad, 1 - alpha) */
        u->slot[2] = ga;
        avg = kiln_sqrt(kiln_sub(sq, kiln_mul(ga, ga)));
    } else {
        avg = kiln_sqrt(sq);
    }
    avg = kiln_add_scalar(avg, c->eps);
    if (c->momentum > 0) {
        kiln_tensor *buf = ps->slot[1] ? ps->slot[1] : kiln_zeros_like(p);
        buf = kiln_add(kiln_mul_scalar(buf, c->momentum), kiln_div(g, avg));
        u->slot[1] = buf;
        u->param = axpy(p, -c->lr, buf);
    } else {
        u->param = axpy(p, -c->lr, kiln_div(g, avg));
    }
}

/* torch.optim.Adagrad, _single_tensor_adagrad. */
static void adagrad_update(const kiln_optim_config *c, const kiln__optim_pstate *ps, kiln_tensor *g, int64_t step,
                           update *u)
{
    kiln_tensor *p = ps->param;
    if (c->weight_decay != 0)
        g = axpy(g, c->weight_decay, p);
    double clr = c->lr / (1 + (double)(step - 1) * c->lr_decay);
    kiln_tensor *sum = ps->slot[0] ? ps->slot[0] : kiln_full_like(p, c->initial_accumulator_value);
    sum = kiln_add(sum, kiln_mul(g, g));
    u->slot[0] = sum;
    kiln_tensor *std = kiln_add_scalar(kiln_sqrt(sum), c->eps);
    u->param = axpy(p, -clr, kiln_div(g, std));
}

static int check_grad(const kiln_optim *opt, int i, kiln_tensor *g)
{
    const kiln_tensor *p = opt->p[i].param;
    if (g->ndim != p->ndim || memcmp(g->shape, p->shape, sizeof(int64_t) * (size_t)p->ndim)) {
        char a[128], b[128];
        return kiln__error_set("optim_step: %s: gradient %s does not match parameter \"%s\" %s",
                               kind_names[opt->cfg.kind], kiln__describe(g, a, sizeof a), opt->p[i].name,
                               kiln__describe(p, b, sizeof b));
    }
    if (!kiln_dtype_is_float(g->dtype)) {
        char a[128];
        return kiln__error_set("optim_step: %s: gradient of \"%s\" is %s, not floating", kind_names[opt->cfg.kind],
                               opt->p[i].name, kiln__describe(g, a, sizeof a));
    }
    return kiln__same_device(g, p, "optim_step");
}

/* Replace *slot by t (taken out of the scope), releasing what was there. */
static void swap_in(kiln_tensor **slot, kiln_tensor *t)
{
    if (!t || t == *slot)
        return;
    kiln_keep(t);
    kiln_tensor_release(*slot);
    *slot = t;
}

/* The body of a step, inside a scope and a no-grad section. */
static int step_scoped(kiln_optim *opt, kiln_tensor *const *grads)
{
    const kiln_optim_config *c = &opt->cfg;
    int n = opt->n;
    for (int i = 0; i < n; i++)
        if (grads && grads[i] && check_grad(opt, i, grads[i]) < 0)
            return -1;

    /* Accumulation: sum the gradients into the optimizer's buffers until the
     * accumulate_steps-th call, then update with their mean. */
    kiln_tensor **g = calloc(n ? (size_t)n : 1, sizeof *g);
    update *u = calloc(n ? (size_t)n : 1, sizeof *u);
    bool *fused = calloc(n ? (size_t)n : 1, sizeof *fused);
    if (!g || !u || !fused) {
        free(g);
        free(u);
        free(fused);
        return kiln__error_set("optim_step: out of memory");
    }
    int rc = 0;
    bool update_now = opt->accum_count + 1 >= c->accumulate_steps;
    for (int i = 0; i < n && rc == 0; i++) {
        kiln_tensor *gi = grads ? grads[i] : NULL;
        kiln_tensor *acc = opt->p[i].accum;
        if (c->accumulate_steps > 1) {
            if (gi)
                acc = acc ? kiln_add(acc, gi) : kiln_clone(gi);
            if (!update_now) {
                g[i] = acc; /* the new running sum, committed below */
                continue;
            }
            gi = acc ? kiln_mul_scalar(acc, 1.0 / c->accumulate_steps) : NULL;
        }
        if (!gi)
            continue;
        if (gi->dtype != opt->p[i].param->dtype)
            gi = kiln_cast(gi, opt->p[i].param->dtype);
        int64_t step = opt->p[i].step + 1;
        if ((c->kind == KILN_OPTIM_ADAM || c->kind == KILN_OPTIM_ADAMW) && gi &&
            adam_fusable(c, &opt->p[i], gi)) {
            /* run at commit time with the others, so a failure before it changes nothing */
            fused[i] = true;
            g[i] = gi;
            continue;
        }
        if (c->maximize)
            gi = kiln_neg(gi);
        switch (c->kind) {
        case KILN_OPTIM_SGD:
            sgd_update(c, &opt->p[i], gi, &u[i]);
            break;
        case KILN_OPTIM_ADAM:
        case KILN_OPTIM_ADAMW:
            adam_update(c, &opt->p[i], gi, step, &u[i]);
            break;
        case KILN_OPTIM_RMSPROP:
            rmsprop_update(c, &opt->p[i], gi, &u[i]);
            break;
        case KILN_OPTIM_ADAGRAD:
            adagrad_update(c, &opt->p[i], gi, step, &u[i]);
            break;
        default:
            break;
        }
        if (!u[i].param)
            rc = -1;
        for (int s = 0; s < KILN_OPTIM_SLOTS; s++)
            if (slot_names[c->kind][s] == NULL && u[i].slot[s])
                rc = -1;
        g[i] = gi;
    }
    if (rc == 0 && !update_now) {
        for (int i = 0; i < n; i++)
            if (g[i] && g[i] != opt->p[i].accum)
                swap_in(&opt->p[i].accum, g[i]);
        opt->accum_count++;
        free(g);
        free(u);
        free(fused);
        return 0;
    }
    /* Commit: the parameters in place (fused steps update their state with them), then
     * the state. Missing fused state is made first, so running out of memory there still
     * leaves every parameter as it was. */
    for (int i = 0; i < n && rc == 0; i++)
        if (fused[i] && adam_fused_prepare(c, &opt->p[i]) < 0)
            rc = -1;
    for (int i = 0; i < n && rc == 0; i++) {
        if (fused[i]) {
            if (adam_fused_run(c, &opt->p[i], g[i], opt->p[i].step + 1) < 0)
                rc = -1;
            continue;
        }
        if (!u[i].param)
            continue;
        if (kiln__optim_write(opt->p[i].param, u[i].param, "optim_step") < 0)
            rc = -1;
    }
    int updated = 0;
    if (rc == 0) {
        for (int i = 0; i < n; i++) {
            kiln_tensor_release(opt->p[i].accum);
            opt->p[i].accum = NULL;
            if (!u[i].param && !fused[i])
                continue;
            for (int s = 0; s < KILN_OPTIM_SLOTS; s++)
                swap_in(&opt->p[i].slot[s], u[i].slot[s]);
            opt->p[i].step++;
            updated++;
        }
        /* The accumulation window is over either way; but when no parameter had a gradient
         * nothing changed, so it is not an update: 0, and kiln_optim_steps does not count it. */
        opt->accum_count = 0;
        if (updated > 0)
            opt->steps++;
    }
    free(g);
    free(u);
    free(fused);
    return rc < 0 ? -1 : updated > 0 ? 1 : 0;
}

int kiln_optim_step_grads(kiln_optim *opt, kiln_tensor *const *grads)
{
    if (!opt)
        return kiln__error_set("optim_step: optimizer is NULL");
    kiln_no_grad_begin();
    kiln_scope_begin();
    int rc = step_scoped(opt, grads);
    kiln_scope_end();
    kiln_no_grad_end();
    return rc;
}

/* ------------------------------------------------------------------ accessors */

double kiln_optim_lr(const kiln_optim *opt) { return opt ? opt->cfg.lr : NAN; }

int kiln_optim_set_lr(kiln_optim *opt, double lr)
{
    if (!opt)
        return kiln__error_set("optim_set_lr: optimizer is NULL");
    /* The same check as creation: a NaN lr set here would reach every parameter on the
     * next step. */
    kiln_optim_config c = opt->cfg;
    c.lr = lr;
    if (kiln__optim_check_config(&c, "optim_set_lr") < 0)
        return -1;
    opt->cfg.lr = lr;
    return 0;
}

kiln_optim_config kiln_optim_get_config(const kiln_optim *opt)
{
    return opt ? opt->cfg : kiln_optim_config_default(KILN_OPTIM_SGD);
}

int kiln_optim_set_momentum(kiln_optim *opt, double momentum)
{
    if (!opt)
        return kiln__error_set("optim_set_momentum: optimizer is NULL");
    if (!isfinite(momentum))
        return kiln__error_set("optim_set_momentum: %s: invalid momentum %g", kiln_optim_kind_name(opt->cfg.kind),
                               momentum);
    kiln_optim_config c = opt->cfg;
    if (c.kind == KILN_OPTIM_ADAM || c.kind == KILN_OPTIM_ADAMW)
        c.beta1 = momentum;
    else
        c.momentum = momentum;
    if (kiln__optim_check_config(&c, "optim_set_momentum") < 0)
        return -1;
    opt->cfg = c;
    return 0;
}

int64_t kiln_optim_steps(const kiln_optim *opt) { return opt ? opt->steps : 0; }
int kiln_optim_param_count(const kiln_optim *opt) { return opt ? opt->n : 0; }

kiln_tensor *kiln_optim_param(const kiln_optim *opt, int i)
{
    return opt && i >= 0 && i < opt->n ? opt->p[i].param : NULL;
}

const char *kiln_optim_param_name(const kiln_optim *opt, int i)
{
    return opt && i >= 0 && i < opt->n ? opt->p[i].name : NULL;
}
