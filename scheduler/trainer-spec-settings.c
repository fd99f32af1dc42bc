/*
 * scheduler/trainer-spec-settings.c — the training settings of a job spec: the loss, optimizer,
 * learning-rate scheduler, checkpoint and early_stopping sections, each into struct kd_jobspec,
 * with the metric names keep-best and early stopping may follow.
 *
 * Each section is optional and starts from the defaults a run uses without it. A setting is
 * checked for its range and for belonging to the kind chosen (momentum is refused for adam, as
 * torch.optim refuses an unknown keyword), and every problem is added to the spec's list rather
 * than stopping at the first (trainer-spec.c, which calls these from kd_jobspec_parse).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "trainer-impl.h"

/* Metric names the Learner produces; checkpoint keep-best and early stopping must use one. */
const char *const kd_trainer_metrics[] = {
    "train_loss",   "train_accuracy", "valid_loss", "valid_accuracy", "valid_top5_accuracy", "valid_precision",
    "valid_recall", "valid_f1",       "lr",         "items_per_sec",  "epoch_seconds",       NULL};

bool kd_spec_known_metric(const char *name)
{
    for (int i = 0; kd_trainer_metrics[i]; i++)
        if (strcmp(kd_trainer_metrics[i], name) == 0)
            return true;
    return false;
}

/* "max"/"min", or the metric's natural direction (losses go down). */
static bool metric_max(struct kd_spec_problems *p, const cJSON *obj, const char *field, const char *metric)
{
    const cJSON *m = kd_spec_get(obj, "mode");
    if (m && cJSON_IsString(m) && strcmp(m->valuestring, "max") == 0)
        return true;
    if (m && cJSON_IsString(m) && strcmp(m->valuestring, "min") == 0)
        return false;
    if (m)
        kd_spec_problem(p, field, "must be \"max\" or \"min\"");
    return !metric || !strstr(metric, "loss");
}

void kd_spec_parse_loss(struct kd_spec_problems *p, const cJSON *root, struct kd_jobspec *s)
{
    const cJSON *l = kd_spec_get(root, "loss");
    if (!l)
        return;
    const char *kind = cJSON_IsString(l) ? l->valuestring : NULL;
    if (cJSON_IsObject(l)) {
        static const char *const keys[] = {"kind", "label_smoothing", NULL};
        kd_spec_unknown_keys(p, l, "loss.", keys);
        const cJSON *k = kd_spec_get(l, "kind");
        kind = cJSON_IsString(k) ? k->valuestring : "cross_entropy";
        kd_spec_number(p, l, "label_smoothing", "loss.label_smoothing", 0, 1, &s->label_smoothing);
        if (k && !cJSON_IsString(k)) {
            kd_spec_problem(p, "loss.kind", "must be a loss name (jobs train classifiers: cross_entropy)");
            return;
        }
    } else if (!kind) {
        kd_spec_problem(p, "loss", "must be a name or an object");
        return;
    }
    if (strcmp(kind, "cross_entropy") != 0)
        kd_spec_problem(p, "loss", "unknown loss '%s' (jobs train classifiers: cross_entropy)", kind);
}

/* Whether list ("a, b, c") names word. */
static bool listed(const char *list, const char *word)
{
    size_t n = strlen(word);
    for (const char *at = list; (at = strstr(at, word)) != NULL; at += n)
        if ((at == list || at[-1] == ' ') && (at[n] == ',' || at[n] == '\0'))
            return true;
    return false;
}

/* A setting the chosen kind does not have would be ignored, leaving the run other than asked:
 * refused (as torch.optim's constructors refuse an unknown keyword), naming the kinds it has. */
static void foreign_keys(struct kd_spec_problems *p, const cJSON *obj, const char *prefix, const char *kind,
                         const char *const owners[][2], size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char field[64];
        snprintf(field, sizeof field, "%s.%s", prefix, owners[i][0]);
        if (kd_spec_get(obj, owners[i][0]) && !listed(owners[i][1], kind))
            kd_spec_problem(p, field, "%s has no %s (it is a setting of %s)", kind, owners[i][0], owners[i][1]);
    }
}

void kd_spec_parse_optimizer(struct kd_spec_problems *p, const cJSON *root, struct kd_jobspec *s)
{
    s->optim = kiln_optim_config_default(KILN_OPTIM_ADAM);
    s->grad_accum = 1;
    const cJSON *o = kd_spec_get(root, "optimizer");
    if (!o)
        return;
    if (!cJSON_IsObject(o)) {
        kd_spec_problem(p, "optimizer", "must be an object");
        return;
    }
    static const char *const keys[] = {"kind",  "lr",  "weight_decay", "momentum",   "nesterov", "beta1",
                                       "beta2", "eps", "amsgrad",      "grad_accum", NULL};
    kd_spec_unknown_keys(p, o, "optimizer.", keys);
    const cJSON *k = kd_spec_get(o, "kind");
    bool kind_known = true;
    if (k) {
        int kind = cJSON_IsString(k) ? kiln_optim_kind_from_name(k->valuestring) : -1;
        kind_known = kind >= 0;
        if (kind < 0)
            kd_spec_problem(p, "optimizer.kind", "unknown optimizer (known: sgd, adam, adamw, rmsprop, adagrad)");
        else
            s->optim = kiln_optim_config_default((kiln_optim_kind)kind);
    }
    kd_spec_number(p, o, "lr", "optimizer.lr", 1e-12, 100, &s->optim.lr);
    kd_spec_number(p, o, "weight_decay", "optimizer.weight_decay", 0, 10, &s->optim.weight_decay);
    kd_spec_number(p, o, "momentum", "optimizer.momentum", 0, 1, &s->optim.momentum);
    kd_spec_number(p, o, "beta1", "optimizer.beta1", 0, 0.999999, &s->optim.beta1);
    kd_spec_number(p, o, "beta2", "optimizer.beta2", 0, 0.999999999, &s->optim.beta2);
    kd_spec_number(p, o, "eps", "optimizer.eps", 0, 1, &s->optim.eps);
    kd_spec_boolean(p, o, "nesterov", "optimizer.nesterov", &s->optim.nesterov);
    kd_spec_boolean(p, o, "amsgrad", "optimizer.amsgrad", &s->optim.amsgrad);
    int64_t accum = s->grad_accum;
    kd_spec_integer(p, o, "grad_accum", "optimizer.grad_accum", 1, 1 << 20, &accum);
    s->grad_accum = (int)accum;
    static const char *const owners[][2] = {
        {"momentum", "sgd, rmsprop"}, {"nesterov", "sgd"},        {"beta1", "adam, adamw"},
        {"beta2", "adam, adamw"},     {"amsgrad", "adam, adamw"}, {"eps", "adam, adamw, rmsprop, adagrad"}};
    if (kind_known)
        foreign_keys(p, o, "optimizer", kiln_optim_kind_name(s->optim.kind), owners,
                     sizeof owners / sizeof *owners);
    if (s->optim.kind == KILN_OPTIM_SGD && s->optim.nesterov && !(s->optim.momentum > 0))
        kd_spec_problem(p, "optimizer.nesterov", "needs momentum > 0 (momentum is %g)", s->optim.momentum);
}

void kd_spec_parse_scheduler(struct kd_spec_problems *p, const cJSON *root, struct kd_jobspec *s)
{
    const cJSON *o = kd_spec_get(root, "scheduler");
    s->sched_per_step = true;
    if (!o || cJSON_IsNull(o))
        return;
    if (!cJSON_IsObject(o)) {
        kd_spec_problem(p, "scheduler", "must be an object");
        return;
    }
    static const char *const keys[] = {"kind",      "per",   "t_max",        "eta_min",
                                       "step_size", "gamma", "warmup_steps", NULL};
    kd_spec_unknown_keys(p, o, "scheduler.", keys);
    static const struct {
        const char *name;
        kiln_sched_kind kind;
    } kinds[] = {{"cosine", KILN_SCHED_COSINE},
                 {"step", KILN_SCHED_STEP},
                 {"exponential", KILN_SCHED_EXPONENTIAL},
                 {"linear", KILN_SCHED_LINEAR},
                 {"constant", KILN_SCHED_CONSTANT}};
    const cJSON *k = kd_spec_get(o, "kind");
    int found = -1;
    for (size_t i = 0; cJSON_IsString(k) && i < sizeof kinds / sizeof kinds[0]; i++)
        if (strcmp(kinds[i].name, k->valuestring) == 0)
            found = (int)i;
    if (found < 0) {
        kd_spec_problem(p, "scheduler.kind",
                        "unknown or missing (known: cosine, step, exponential, linear, constant)");
        return;
    }
    s->has_sched = true;
    s->sched = kiln_sched_config_default(kinds[found].kind);
    if (kinds[found].kind == KILN_SCHED_COSINE)
        s->sched.t_max = 0; /* unless given: the whole run, which only the run knows (trainer-run.c) */
    const cJSON *per = kd_spec_get(o, "per");
    if (per && !(cJSON_IsString(per) && (!strcmp(per->valuestring, "step") || !strcmp(per->valuestring, "epoch"))))
        kd_spec_problem(p, "scheduler.per", "must be \"step\" or \"epoch\"");
    else if (per)
        s->sched_per_step = strcmp(per->valuestring, "step") == 0;
    static const char *const owners[][2] = {
        {"t_max", "cosine"}, {"eta_min", "cosine"}, {"step_size", "step"}, {"gamma", "step, exponential"}};
    foreign_keys(p, o, "scheduler", kinds[found].name, owners, sizeof owners / sizeof *owners);
    kd_spec_integer(p, o, "t_max", "scheduler.t_max", 1, INT64_MAX / 2, &s->sched.t_max);
    kd_spec_number(p, o, "eta_min", "scheduler.eta_min", 0, 100, &s->sched.eta_min);
    kd_spec_integer(p, o, "step_size", "scheduler.step_size", 1, INT64_MAX / 2, &s->sched.step_size);
    kd_spec_number(p, o, "gamma", "scheduler.gamma", 0, 10, &s->sched.gamma);
    kd_spec_integer(p, o, "warmup_steps", "scheduler.warmup_steps", 0, INT64_MAX / 2, &s->sched.warmup_steps);
    if (kinds[found].kind == KILN_SCHED_STEP && s->sched.step_size < 1)
        kd_spec_problem(p, "scheduler.step_size", "is required for kind step");
}

void kd_spec_parse_checkpoint(struct kd_spec_problems *p, const cJSON *root, struct kd_jobspec *s)
{
    s->ckpt_every_epochs = 1;
    s->keep_last = 2;
    const cJSON *c = kd_spec_get(root, "checkpoint");
    if (!c)
        return;
    if (!cJSON_IsObject(c)) {
        kd_spec_problem(p, "checkpoint", "must be an object");
        return;
    }
    static const char *const keys[] = {"every_epochs", "every_steps", "keep_last", "best_metric", "mode", NULL};
    kd_spec_unknown_keys(p, c, "checkpoint.", keys);
    kd_spec_integer(p, c, "every_epochs", "checkpoint.every_epochs", 0, 1000000, &s->ckpt_every_epochs);
    kd_spec_integer(p, c, "every_steps", "checkpoint.every_steps", 0, INT64_MAX / 2, &s->ckpt_every_steps);
    int64_t keep = s->keep_last;
    kd_spec_integer(p, c, "keep_last", "checkpoint.keep_last", 1, 1000, &keep);
    s->keep_last = (int)keep;
    s->best_metric = kd_spec_string(p, c, "best_metric", "checkpoint.best_metric", false);
    if (s->best_metric && !kd_spec_known_metric(s->best_metric))
        kd_spec_problem(p, "checkpoint.best_metric", "unknown metric '%s'", s->best_metric);
    s->best_max = metric_max(p, c, "checkpoint.mode", s->best_metric);
}

void kd_spec_parse_early_stopping(struct kd_spec_problems *p, const cJSON *root, struct kd_jobspec *s)
{
    const cJSON *e = kd_spec_get(root, "early_stopping");
    s->patience = 3;
    if (!e || cJSON_IsNull(e))
        return;
    if (!cJSON_IsObject(e)) {
        kd_spec_problem(p, "early_stopping", "must be an object");
        return;
    }
    static const char *const keys[] = {"metric", "mode", "patience", "min_delta", NULL};
    kd_spec_unknown_keys(p, e, "early_stopping.", keys);
    s->early_metric = kd_spec_string(p, e, "metric", "early_stopping.metric", true);
    if (s->early_metric && !kd_spec_known_metric(s->early_metric))
        kd_spec_problem(p, "early_stopping.metric", "unknown metric '%s'", s->early_metric);
    s->early_max = metric_max(p, e, "early_stopping.mode", s->early_metric);
    int64_t pat = s->patience;
    kd_spec_integer(p, e, "patience", "early_stopping.patience", 1, 1000000, &pat);
    s->patience = (int)pat;
    kd_spec_number(p, e, "min_delta", "early_stopping.min_delta", 0, 1e9, &s->min_delta);
}
