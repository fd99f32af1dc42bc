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
        break;
    case KILN_SCHED_NOAM:
        if (c->d_model <= 0 || c->noam_warmup <= 0)
            return kiln__error_set("%s: noam: d_model and warmup must be positive (got %lld, %lld)", op,
                                   (long long)c->d_model, (long long)c->noam_warmup);
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
        if (t > c->total_steps) {
            kiln__error_set("sched: one_cycle: step %lld is past total_steps %lld", (long long)t,
                            (long long)c->total_steps);
            return NAN;
        }
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
    if (t < 0) {
        kiln__error_set("sched: %s: negative step %lld", kind_names[cfg->kind], (long long)t);
        return NAN;
    }
    int64_t w = cfg->warmup_steps;
    if (w > 0 && t < w)
        return base_lr * (cfg->warmup_start_factor + (1 - cfg->warmup_start_factor) * (double)t / (double)w);
    return schedule(cfg, base_lr, w > 0 ? t - w : t);
}

double kiln_sched_momentum_at(const kiln_sched_config *cfg, int64_t t)
{
    if (check(cfg) < 0 || cfg->kind != KILN_SCHED_ONE_CYCLE || !cfg->cycle_momentum)
        return NAN;
    t -= cfg->warmup_steps > 0 && t >= cfg->warmup_steps ? cfg->warmup_steps : 0;
    if (t < 0 || t > cfg->total_steps)
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

static void apply(kiln_sched *s)
{
    s->lr = kiln_sched_lr_at(&s->cfg, s->base_lr, s->step);
    if (!s->opt)
        return;
    kiln_optim_set_lr(s->opt, s->lr);
    bool in_warmup = s->cfg.warmup_steps > 0 && s->step < s->cfg.warmup_steps;
    double m = kiln_sched_momentum_at(&s->cfg, s->step);
    if (!in_warmup && !isnan(m))
        kiln_optim_set_momentum(s->opt, m);
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
    s->base_lr = base_lr;
    apply(s);
    return s;
}

kiln_sched *kiln_sched_create(const kiln_sched_config *cfg, kiln_optim *opt)
{
    return kiln_sched_create_base(cfg, opt, opt ? kiln_optim_lr(opt) : 1.0);
}

void kiln_sched_free(kiln_sched *s) { free(s); }

double kiln_sched_step(kiln_sched *s)
{
    if (!s)
        return NAN;
    s->step++;
    apply(s);
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

int kiln_sched_state_import(kiln_sched *s, const char *json)
{
    const char *op = "sched_state_import";
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
        s->step = (int64_t)step->valuedouble;
        s->base_lr = base->valuedouble;
        apply(s);
    }
    cJSON_Delete(o);
    return rc;
}
