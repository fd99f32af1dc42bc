/*
 * engine/optim/sched.c — learning-rate schedulers with PyTorch's schedules
 * (torch.optim.lr_scheduler), written in closed form.
 *
 * PyTorch computes most schedules recursively ("chainable" form: each lr from the
 * previous one). The closed forms here give the same sequence up to rounding (the
 * fixture test compares them over 50 steps), and they make a scheduler's whole state
 * one integer, so restoring a checkpoint is exact and cheap, and any step can be
 * evaluated on its own (kiln_sched_lr_at).
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error-impl.h"
#include "optim-impl.h"

static const char *const kind_names[KILN_SCHED_KIND_COUNT] = {
    [KILN_SCHED_CONSTANT] = "constant",
    [KILN_SCHED_LINEAR] = "linear",
    [KILN_SCHED_STEP] = "step",
    [KILN_SCHED_MULTISTEP] = "multistep",
    [KILN_SCHED_EXPONENTIAL] = "exponential",
    [KILN_SCHED_COSINE] = "cosine",
    [KILN_SCHED_COSINE_RESTARTS] = "cosine_restarts",
    [KILN_SCHED_ONE_CYCLE] = "one_cycle",
    [KILN_SCHED_NOAM] = "noam",
};

const char *kiln_sched_kind_name(kiln_sched_kind kind)
{
    return (unsigned)kind < KILN_SCHED_KIND_COUNT ? kind_names[kind] : "?";
}

kiln_sched_config kiln_sched_config_default(kiln_sched_kind kind)
{
    kiln_sched_config c = {
        .kind = kind,
        .factor = kind == KILN_SCHED_NOAM ? 1.0 : 1.0 / 3,
        .total_iters = 5,
        .start_factor = 1.0 / 3,
        .end_factor = 1.0,
        .gamma = 0.1,
        .step_size = 1,
        .t_max = 1,
        .t_0 = 1,
        .t_mult = 1,
        .max_lr = 0.1,
        .total_steps = 1,
        .pct_start = 0.3,
        .div_factor = 25,
        .final_div_factor = 1e4,
        .cycle_momentum = true,
        .base_momentum = 0.85,
        .max_momentum = 0.95,
        .d_model = 512,
        .noam_warmup = 4000,
        .warmup_start_factor = 1.0 / 3,
    };
    return c;
}

static int check(const kiln_sched_config *c)
{
    const char *op = "sched";
    if (!c)
        return kiln__error_set("%s: config is NULL", op);
    if ((unsigned)c->kind >= KILN_SCHED_KIND_COUNT)
        return kiln__error_set("%s: unknown scheduler kind %d", op, (int)c->kind);
    const char *k = kind_names[c->kind];
    if (c->warmup_steps < 0 || (c->warmup_steps > 0 && !(c->warmup_start_factor > 0 && c->warmup_start_factor <= 1)))
        return kiln__error_set("%s: %s: warm-up needs warmup_steps >= 0 and a start factor in (0, 1] (got %lld, %g)",
                               op, k, (long long)c->warmup_steps, c->warmup_start_factor);
    /* Values the schedule multiplies the lr by: a NaN or negative one would give every
     * step a NaN or negative lr. */
    bool uses_gamma = c->kind == KILN_SCHED_STEP || c->kind == KILN_SCHED_MULTISTEP ||
                      c->kind == KILN_SCHED_EXPONENTIAL;
    if (uses_gamma && !(c->gamma >= 0 && isfinite(c->gamma)))
        return kiln__error_set("%s: %s: gamma must be a finite number >= 0 (got %g)", op, k, c->gamma);
    bool uses_eta = c->kind == KILN_SCHED_COSINE || c->kind == KILN_SCHED_COSINE_RESTARTS;
    if (uses_eta && !(c->eta_min >= 0 && isfinite(c->eta_min)))
        return kiln__error_set("%s: %s: eta_min must be a finite number >= 0 (got %g)", op, k, c->eta_min);
    switch (c->kind) {
    case KILN_SCHED_CONSTANT:
        if (!(c->factor >= 0 && c->factor <= 1) || c->total_iters < 0)
            return kiln__error_set("%s: constant: factor must be in [0, 1] and total_iters >= 0 (got %g, %lld)", op,
                                   c->factor, (long long)c->total_iters);
        break;
    case KILN_SCHED_LINEAR:
        if (!(c->start_factor > 0 && c->start_factor <= 1) || !(c->end_factor >= 0 && c->end_factor <= 1) ||
            c->total_iters <= 0)
            return kiln__error_set("%s: linear: start_factor in (0, 1], end_factor in [0, 1], total_iters > 0 "
                                   "(got %g, %g, %lld)", op, c->start_factor, c->end_factor, (long long)c->total_iters);
        break;
    case KILN_SCHED_STEP:
        if (c->step_size <= 0)
            return kiln__error_set("%s: step: step_size must be positive (got %lld)", op, (long long)c->step_size);
        break;
    case KILN_SCHED_MULTISTEP:
        if (c->nmilestones < 0 || c->nmilestones > KILN_SCHED_MAX_MILESTONES)
            return kiln__error_set("%s: multistep: %d milestones (at most %d)", op, c->nmilestones,
                                   KILN_SCHED_MAX_MILESTONES);
        for (int i = 1; i < c->nmilestones; i++)
            if (c->milestones[i] < c->milestones[i - 1])
                return kiln__error_set("%s: multistep: milestones must not decrease", op);
        break;
    case KILN_SCHED_COSINE:
        if (c->t_max <= 0)
            return kiln__error_set("%s: cosine: t_max must be positive (got %lld)", op, (long long)c->t_max);
        break;
    case KILN_SCHED_COSINE_RESTARTS:
        if (c->t_0 <= 0 || c->t_mult < 1)
            return kiln__error_set("%s: cosine_restarts: t_0 > 0 and t_mult >= 1 (got %lld, %lld)", op,
                                   (long long)c->t_0, (long long)c->t_mult);
        break;
    case KILN_SCHED_ONE_CYCLE:
        if (c->total_steps <= 0 || !(c->pct_start >= 0 && c->pct_start <= 1) || !(c->div_factor > 0) ||
            !(c->final_div_factor > 0))
            return kiln__error_set("%s: one_cycle: total_steps > 0, pct_start in [0, 1], positive div factors "
                                   "(got %lld, %g, %g, %g)", op, (long long)c->total_steps, c->pct_start,
                                   c->div_factor, c->final_div_factor);
        if (!(c->max_lr >= 0 && isfinite(c->max_lr)))
            return kiln__error_set("%s: one_cycle: max_lr must be a finite number >= 0 (got %g)", op, c->max_lr);
        if (c->cycle_momentum && !(isfinite(c->base_momentum) && isfinite(c->max_momentum) &&
                                   c->base_momentum >= 0 && c->max_momentum >= 0))
            return kiln__error_set("%s: one_cycle: base_momentum and max_momentum must be finite numbers >= 0 "
                                   "(got %g, %g)",
                                   op, c->base_momentum, c->max_momentum);
        break;
    case KILN_SCHED_NOAM:
        if (c->d_model <= 0 || c->noam_warmup <= 0 || !(c->factor > 0 && isfinite(c->factor)))
            return kiln__error_set("%s: noam: d_model, warmup and factor must be positive (got %lld, %lld, %g)",
                                   op, (long long)c->d_model, (long long)c->noam_warmup, c->factor);
        break;
    default:
        break;
    }
    return 0;
}

static double cos_anneal(double start, double end, double pct)
{
    return end + (start - end) / 2.0 * (cos(M_PI * pct) + 1);
}

/* OneCycleLR's value for step t of a two-phase cycle between the given endpoints:
 * phase 1 from a to b until step pct_start * total - 1, phase 2 from b to c. */
static double one_cycle(const kiln_sched_config *c, double a, double b, double e, int64_t t)
{
    double end1 = c->pct_start * (double)c->total_steps - 1, end2 = (double)c->total_steps - 1;
    double start = 0, from = a, to = b, end = end1;
    if (!((double)t <= end1)) {
        start = end1;
        from = b;
        to = e;
        end = end2;
    }
    double pct = ((double)t - start) / (end - start);
    return c->anneal_linear ? (to - from) * pct + from : cos_anneal(from, to, pct);
}

static double schedule(const kiln_sched_config *c, double base, int64_t t)
{
    switch (c->kind) {
    case KILN_SCHED_CONSTANT:
        return t < c->total_iters ? base * c->factor : base;
    case KILN_SCHED_LINEAR: {
        int64_t tt = t < c->total_iters ? t : c->total_iters;
        return base * (c->start_factor + (c->end_factor - c->start_factor) * (double)tt / (double)c->total_iters);
    }
    case KILN_SCHED_STEP:
        return base * pow(c->gamma, (double)(t / c->step_size));
    case KILN_SCHED_MULTISTEP: {
        int passed = 0;
        for (int i = 0; i < c->nmilestones; i++)
            passed += c->milestones[i] <= t;
        return base * pow(c->gamma, passed);
    }
    case KILN_SCHED_EXPONENTIAL:
        return base * pow(c->gamma, (double)t);
    case KILN_SCHED_COSINE:
        return c->eta_min + (base - c->eta_min) * (1 + cos(M_PI * (double)t / (double)c->t_max)) / 2;
    case KILN_SCHED_COSINE_RESTARTS: {
        int64_t cur = t, ti = c->t_0;
        if (c->t_mult == 1) {
            cur = t % ti;
        } else {
            while (cur >= ti) {
                cur -= ti;
                ti *= c->t_mult;
            }
        }
        return c->eta_min + (base - c->eta_min) * (1 + cos(M_PI * (double)cur / (double)ti)) / 2;
    }
    case KILN_SCHED_ONE_CYCLE: {
        double initial = c->max_lr / c->div_factor;
        return one_cycle(c, initial, c->max_lr, initial / c->final_div_factor, t);
    }
    case KILN_SCHED_NOAM: {
        /* Step s = t + 1: the lr at t = 0 is the one the first update uses, as the
         * original (OpenNMT) schedule counts its first update as step 1. */
        double s = (double)(t + 1);
        return base * c->factor * pow((double)c->d_model, -0.5) *
               fmin(pow(s, -0.5), s * pow((double)c->noam_warmup, -1.5));
    }
    default:
        return NAN;
    }
}

double kiln_sched_lr_at(const kiln_sched_config *cfg, double base_lr, int64_t t)
{
    if (check(cfg) < 0)
        return NAN;
    const char *k = kind_names[cfg->kind];
    if (t < 0) {
        kiln__error_set("sched: %s: negative step %lld", k, (long long)t);
        return NAN;
    }
    if (!(base_lr >= 0 && isfinite(base_lr))) {
        kiln__error_set("sched: %s: invalid base lr %g", k, base_lr);
        return NAN;
    }
    int64_t w = cfg->warmup_steps > 0 ? cfg->warmup_steps : 0;
    if (cfg->kind == KILN_SCHED_ONE_CYCLE && t - w > cfg->total_steps) {
        /* PyTorch's OneCycleLR raises here ("Tried to step N times"); the formula would
         * give NaN, which the optimizer would write into every parameter. */
        kiln__error_set("sched: one_cycle: step %lld is past total_steps %lld%s", (long long)t,
                        (long long)(cfg->total_steps + w), w ? " (warm-up included)" : "");
        return NAN;
    }
    /* The warm-up ramps to the schedule's own first lr: the base lr, except for one-cycle,
     * which starts from max_lr / div_factor (PyTorch's SequentialLR resets to the initial lr
     * OneCycleLR sets) */
    double ramp_to = cfg->kind == KILN_SCHED_ONE_CYCLE ? cfg->max_lr / cfg->div_factor : base_lr;
    double lr = t < w
                    ? ramp_to * (cfg->warmup_start_factor + (1 - cfg->warmup_start_factor) * (double)t / (double)w)
                    : schedule(cfg, base_lr, t - w);
    /* A catch-all for the corners the checks above leave (an exponential overflowing, a
     * one-cycle phase of zero length, where PyTorch divides by zero and raises). */
    if (!(lr >= 0 && isfinite(lr))) {
        kiln__error_set("sched: %s: the lr at step %lld would be %g, not a finite number >= 0", k, (long long)t,
                        lr);
        return NAN;
    }
    return lr;
}

double kiln_sched_momentum_at(const kiln_sched_config *cfg, int64_t t)
{
    if (check(cfg) < 0 || cfg->kind != KILN_SCHED_ONE_CYCLE || !cfg->cycle_momentum)
        return NAN;
    if (t < 0)
        return NAN;
    if (cfg->warmup_steps > 0 && t < cfg->warmup_steps)
        return cfg->max_momentum; /* what OneCycleLR sets when made, before its first step */
    t -= cfg->warmup_steps > 0 ? cfg->warmup_steps : 0;
    if (t > cfg->total_steps)
        return NAN;
    return one_cycle(cfg, cfg->max_momentum, cfg->base_momentum, cfg->max_momentum, t);
}

/* ------------------------------------------------------------------ the object */

struct kiln_sched {
    kiln_sched_config cfg;
    kiln_optim *opt; /* borrowed; may be NULL */
    double base_lr;
    int64_t step;
    double lr;
};

/* Move s to step t (from base lr base): its lr, and the optimizer's lr and momentum.
 * Everything that can fail is tried before anything changes: the lr is checked first,
 * then the momentum (the optimizer may refuse it), and only then the lr (which cannot
 * fail once checked) and the step are written. 0 or -1. */
static int move_to(kiln_sched *s, int64_t t, double base)
{
    double lr = kiln_sched_lr_at(&s->cfg, base, t);
    if (isnan(lr))
        return -1;
    if (s->opt) {
        double m = kiln_sched_momentum_at(&s->cfg, t);
        if (!isnan(m) && kiln_optim_set_momentum(s->opt, m) < 0)
            return -1;
        if (kiln_optim_set_lr(s->opt, lr) < 0)
            return -1;
    }
    s->step = t;
    s->base_lr = base;
    s->lr = lr;
    return 0;
}

kiln_sched *kiln_sched_create_base(const kiln_sched_config *cfg, kiln_optim *opt, double base_lr)
{
    if (check(cfg) < 0)
        return NULL;
    kiln_sched *s = calloc(1, sizeof *s);
    if (!s) {
        kiln__error_set("sched: out of memory");
        return NULL;
    }
    s->cfg = *cfg;
    s->opt = opt;
    if (move_to(s, 0, base_lr) < 0) {
        free(s);
        return NULL;
    }
    return s;
}

kiln_sched *kiln_sched_create(const kiln_sched_config *cfg, kiln_optim *opt)
{
    return kiln_sched_create_base(cfg, opt, opt ? kiln_optim_lr(opt) : 1.0);
}

void kiln_sched_free(kiln_sched *s) { free(s); }

double kiln_sched_step(kiln_sched *s)
{
    if (!s) {
        kiln__error_set("sched_step: scheduler is NULL");
        return NAN;
    }
    if (move_to(s, s->step + 1, s->base_lr) < 0)
        return NAN;
    return s->lr;
}

double kiln_sched_lr(const kiln_sched *s) { return s ? s->lr : NAN; }
int64_t kiln_sched_last_step(const kiln_sched *s) { return s ? s->step : -1; }

char *kiln_sched_state_export(const kiln_sched *s)
{
    if (!s) {
        kiln__error_set("sched_state_export: scheduler is NULL");
        return NULL;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "format", "kiln-sched-1");
    cJSON_AddStringToObject(o, "kind", kind_names[s->cfg.kind]);
    cJSON_AddNumberToObject(o, "step", (double)s->step);
    cJSON_AddNumberToObject(o, "base_lr", s->base_lr);
    char *out = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!out)
        kiln__error_set("sched_state_export: out of memory");
    return out;
}

/* Whether s's optimizer would take the momentum step t sets, as kiln_optim_set_momentum
 * would judge it; 0 or -1 plus its message. */
static int check_momentum(const kiln_sched *s, int64_t t)
{
    double m = kiln_sched_momentum_at(&s->cfg, t);
    if (!s->opt || isnan(m))
        return 0;
    kiln_optim_config c = kiln_optim_get_config(s->opt);
    if (c.kind == KILN_OPTIM_ADAM || c.kind == KILN_OPTIM_ADAMW)
        c.beta1 = m;
    else
        c.momentum = m;
    return kiln__optim_check_config(&c, "momentum");
}

/* Parse and check a state for s: the step and base lr it restores, whose lr must be one
 * kiln_sched_lr_at accepts and whose momentum one the optimizer takes. 0 or -1 plus a
 * message. */
static int parse_state(const kiln_sched *s, const char *json, const char *op, int64_t *step_out, double *base_out)
{
    if (!s || !json)
        return kiln__error_set("%s: NULL argument", op);
    cJSON *o = cJSON_Parse(json);
    if (!o)
        return kiln__error_set("%s: the state is not valid JSON", op);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(o, "format");
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(o, "kind");
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step");
    const cJSON *base = cJSON_GetObjectItemCaseSensitive(o, "base_lr");
    int rc = 0;
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "kiln-sched-1") != 0)
        rc = kiln__error_set("%s: not a kiln-sched-1 document", op);
    else if (!cJSON_IsString(kind) || strcmp(kind->valuestring, kind_names[s->cfg.kind]) != 0)
        rc = kiln__error_set("%s: the state is for \"%s\", the scheduler is %s", op,
                             cJSON_IsString(kind) ? kind->valuestring : "?", kind_names[s->cfg.kind]);
    else if (!cJSON_IsNumber(step) || step->valuedouble < 0 || step->valuedouble > 9.0e15 || !cJSON_IsNumber(base))
        rc = kiln__error_set("%s: missing or invalid step or base_lr", op);
    if (rc == 0) {
        *step_out = (int64_t)step->valuedouble;
        *base_out = base->valuedouble;
        if (isnan(kiln_sched_lr_at(&s->cfg, *base_out, *step_out)) || check_momentum(s, *step_out) < 0) {
            char msg[KILN_ERROR_MAX];
            snprintf(msg, sizeof msg, "%s", kiln_error());
            rc = kiln__error_restate("%s: %s", op, msg);
        }
    }
    cJSON_Delete(o);
    return rc;
}

int kiln_sched_state_check(const kiln_sched *s, const char *json)
{
    int64_t step;
    double base;
    return parse_state(s, json, "sched_state_check", &step, &base);
}

int kiln_sched_state_import(kiln_sched *s, const char *json)
{
    int64_t step;
    double base;
    if (parse_state(s, json, "sched_state_import", &step, &base) < 0)
        return -1;
    return move_to(s, step, base);
}
