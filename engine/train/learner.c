/*
 * engine/train/learner.c — the training loop: epochs of scoped steps, validation,
 * per-step and per-epoch metrics to subscribers and a terminal progress line,
 * early stopping, cancellation, and the final report. Checkpoint writing and resuming
 * live in learner-ckpt.c; both share learner-impl.h.
 *
 * Epoch numbers are 0-based inside (L->epoch counts completed epochs) and 1-based in
 * everything a person or a subscriber reads.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "error-impl.h"
#include "kiln/autodiff.h"
#include "kiln/loss.h"
#include "learner-impl.h"
#include "storage-impl.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double peak_rss_mb(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0; /* Linux reports KiB */
}

kiln_learner_config kiln_learner_config_default(void)
{
    return (kiln_learner_config){.epochs = 1, .topk = 5, .grad_accum = 1, .sched_per_step = true,
                                 .checkpoint_every_epochs = 1, .keep_last = 2, .best_max = true,
                                 .early_stop_max = true, .patience = 3};
}

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

/* Whether fit will ever record a metric called name under cfg (with a validation loader
 * or not): a keep-best or early-stopping metric that never appears would leave both
 * silently idle. Empty when it will, else why not, in why. */
static void metric_problem(const kiln_learner_config *cfg, bool has_valid, const char *name, char *why, size_t len)
{
    static const char *const always[] = {"epoch",         "train_loss",    "lr",
                                         "items_per_sec", "epoch_seconds", "peak_rss_mb"};
    static const char *const classify[] = {"valid_accuracy", "valid_precision", "valid_recall", "valid_f1"};
    char topk[40];
    snprintf(topk, sizeof topk, "valid_top%d_accuracy", cfg->topk);
    why[0] = 0;
    for (size_t i = 0; i < sizeof always / sizeof *always; i++)
        if (strcmp(name, always[i]) == 0)
            return;
    bool cls = strcmp(name, "train_accuracy") == 0 || strcmp(name, topk) == 0;
    for (size_t i = 0; i < sizeof classify / sizeof *classify; i++)
        cls = cls || strcmp(name, classify[i]) == 0;
    bool valid = strncmp(name, "valid_", 6) == 0;
    if (!cls && strcmp(name, "valid_loss") != 0)
        snprintf(why, len,
                 "is not a metric the learner records (train_loss, train_accuracy, valid_loss, "
                 "valid_accuracy, %s, valid_precision, valid_recall, valid_f1, lr, items_per_sec, "
                 "epoch_seconds, peak_rss_mb)",
                 topk);
    else if (cls && cfg->num_classes <= 0)
        snprintf(why, len, "is recorded only for a classifier (num_classes > 0)");
    else if (valid && !has_valid)
        snprintf(why, len, "is recorded only with a validation loader");
}

/* Every parameter the optimizer updates must be one of the model's own tensors: an
 * optimizer built over another model (or before kiln_module_to_device replaced the
 * tensors) would step parameters the forward never uses, and fit would change nothing. */
static int check_optimizer_params(kiln_module *model, kiln_optim *opt)
{
    int nm = kiln_module_parameters(model, NULL, 0), no = kiln_optim_param_count(opt);
    if (nm < 0)
        return -1;
    kiln_named_tensor *ps = calloc((size_t)nm + 1, sizeof *ps);
    if (!ps)
        return kiln__error_set("learner_create: out of memory");
    kiln_module_parameters(model, ps, nm);
    int rc = no > 0 ? 0 : kiln__error_set("learner_create: the optimizer has no parameters");
    for (int i = 0; rc == 0 && i < no; i++) {
        kiln_tensor *p = kiln_optim_param(opt, i);
        bool found = false;
        for (int j = 0; j < nm && !found; j++)
            found = ps[j].tensor == p;
        if (!found)
            rc = kiln__error_set("learner_create: the optimizer's parameter '%s' is not a parameter of the model "
                                 "(an optimizer over another model, or one created before kiln_module_to_device "
                                 "replaced the model's tensors)",
                                 kiln_optim_param_name(opt, i));
    }
    free(ps);
    return rc;
}

static int check_config(const kiln_learner_config *cfg, bool has_valid)
{
    if (cfg->epochs < 1 || cfg->grad_accum < 1 || cfg->topk < 1 || cfg->keep_last < 0 || cfg->patience < 1)
        return kiln__error_set("learner_create: epochs %lld, grad_accum %d, topk %d, keep_last %d, patience %d "
                               "out of range",
                               (long long)cfg->epochs, cfg->grad_accum, cfg->topk, cfg->keep_last, cfg->patience);
    if (cfg->num_classes < 0)
        return kiln__error_set("learner_create: num_classes %lld is negative (0: not a classifier)",
                               (long long)cfg->num_classes);
    if (cfg->checkpoint_every_epochs < 0 || cfg->checkpoint_every_steps < 0)
        return kiln__error_set("learner_create: checkpoint_every_epochs %lld and checkpoint_every_steps %lld must "
                               "be >= 0 (0: never)",
                               (long long)cfg->checkpoint_every_epochs, (long long)cfg->checkpoint_every_steps);
    if (!(cfg->min_delta >= 0 && isfinite(cfg->min_delta)))
        return kiln__error_set("learner_create: min_delta %g must be a finite number >= 0", cfg->min_delta);
    const char *keys[2] = {"best_metric", "early_stop_metric"};
    const char *vals[2] = {cfg->best_metric, cfg->early_stop_metric};
    for (int i = 0; i < 2; i++) {
        char why[400];
        if (vals[i])
            metric_problem(cfg, has_valid, vals[i], why, sizeof why);
        if (vals[i] && why[0])
            return kiln__error_set("learner_create: %s \"%s\" %s", keys[i], vals[i], why);
    }
    return 0;
}

kiln_learner *kiln_learner_create(const kiln_learner_config *cfg, kiln_module *model, kiln_optim *opt,
                                  kiln_sched *sched, kiln_loader *train, kiln_loader *valid)
{
    if (!cfg || !model || !opt || !train)
        return kiln__error_set("learner_create: model, optimizer and training loader are required"), NULL;
    if (check_config(cfg, valid != NULL) < 0 || check_optimizer_params(model, opt) < 0)
        return NULL;
    kiln_learner *L = calloc(1, sizeof *L);
    if (!L)
        return kiln__error_set("learner_create: out of memory"), NULL;
    L->cfg = *cfg;
    L->cfg.checkpoint_dir = L->ckpt_dir = dup_or_null(cfg->checkpoint_dir);
    L->cfg.best_metric = L->best_metric = dup_or_null(cfg->best_metric);
    L->cfg.early_stop_metric = L->es_metric = dup_or_null(cfg->early_stop_metric);
    L->model = model;
    L->opt = opt;
    L->sched = sched;
    L->train = train;
    L->valid = valid;
    L->rng = kiln_generator_make(cfg->seed);
    L->history = cJSON_CreateArray();
    L->stop_reason = "not started";
    atomic_init(&L->cancel, 0);
    snprintf(L->topk_name, sizeof L->topk_name, "valid_top%d_accuracy", cfg->topk);
    /* The metrics need a tally linear in the classes; the matrix (the report's) is quadratic
     * and kept only while it is small. */
    bool classifier = cfg->num_classes > 0;
    if (!L->history || (classifier && kiln__tally_init(&L->tally, cfg->num_classes) < 0) ||
        (classifier && cfg->num_classes <= KILN_LEARNER_CONFUSION_MAX &&
         kiln_confusion_init(&L->cm, cfg->num_classes) < 0)) {
        kiln_learner_free(L);
        return kiln__error_set("learner_create: out of memory for %lld classes", (long long)cfg->num_classes),
               NULL;
    }
    return L;
}

void kiln_learner_free(kiln_learner *L)
{
    if (!L)
        return;
    free(L->ckpt_dir);
    free(L->best_metric);
    free(L->es_metric);
    cJSON_Delete(L->history);
    kiln__tally_free(&L->tally);
    kiln_confusion_free(&L->cm);
    free(L);
}

void kiln_learner_set_loss(kiln_learner *L, kiln_train_loss_fn fn, void *ud)
{
    if (L) {
        L->loss_fn = fn;
        L->loss_ud = ud;
    }
}

int kiln_learner_subscribe(kiln_learner *L, kiln_train_subscriber fn, void *ud)
{
    if (!L || !fn)
        return kiln__error_set("learner_subscribe: NULL argument");
    if (L->nsubs == KILN__MAX_SUBS)
        return kiln__error_set("learner_subscribe: at most %d subscribers", KILN__MAX_SUBS);
    L->subs[L->nsubs].fn = fn;
    L->subs[L->nsubs++].ud = ud;
    return 0;
}

void kiln_learner_cancel(kiln_learner *L)
{
    if (L)
        atomic_store(&L->cancel, 1);
}

const char *kiln_learner_stop_reason(const kiln_learner *L)
{
    return L ? L->stop_reason : "";
}

int64_t kiln_learner_epoch(const kiln_learner *L)
{
    return L ? L->epoch : 0;
}

int64_t kiln_learner_step(const kiln_learner *L)
{
    return L ? L->step : 0;
}

kiln_generator *kiln_learner_rng(kiln_learner *L)
{
    return L ? &L->rng : NULL;
}

double kiln_learner_metric(const kiln_learner *L, const char *name)
{
    if (!L || !name)
        return NAN;
    for (int i = 0; i < L->nm; i++)
        if (strcmp(L->mnames[i], name) == 0)
            return L->mvals[i];
    return NAN;
}

/* ------------------------------------------------------------------- events */

void kiln__learner_emit(kiln_learner *L, kiln_train_event *ev)
{
    char json[2048];
    int off = snprintf(json, sizeof json, "{\"event\":\"%s\",\"epoch\":%lld,\"epochs\":%lld,\"batch\":%lld,"
                                          "\"batches\":%lld,\"step\":%lld",
                       ev->kind == KILN_EVENT_STEP    ? "step"
                       : ev->kind == KILN_EVENT_EPOCH ? "epoch"
                       : ev->kind == KILN_EVENT_CHECKPOINT ? "checkpoint"
                                                           : "done",
                       (long long)ev->epoch, (long long)L->cfg.epochs, (long long)ev->batch, (long long)ev->batches,
                       (long long)ev->step);
    for (int i = 0; i < ev->n && off < (int)sizeof json - 100; i++)
        if (strcmp(ev->names[i], "epoch") != 0) /* already a fixed member; a name appears once */
            off += snprintf(json + off, sizeof json - (size_t)off, isfinite(ev->values[i]) ? ",\"%s\":%.17g" : ",\"%s\":null",
                            ev->names[i], ev->values[i]);
    if (ev->path && off < (int)sizeof json - 100) {
        cJSON *s = cJSON_CreateString(ev->path);
        char *q = s ? cJSON_PrintUnformatted(s) : NULL;
        off += snprintf(json + off, sizeof json - (size_t)off, ",\"path\":%.1500s", q ? q : "null");
        free(q);
        cJSON_Delete(s);
    }
    if (ev->stop_reason && off < (int)sizeof json - 100)
        off += snprintf(json + off, sizeof json - (size_t)off, ",\"stop_reason\":\"%s\"", ev->stop_reason);
    if (off < (int)sizeof json - 1)
        snprintf(json + off, sizeof json - (size_t)off, "}");
    ev->json = json;
    ev->epochs = L->cfg.epochs;
    for (int i = 0; i < L->nsubs; i++)
        L->subs[i].fn(L->subs[i].ud, ev);
}

/* The terminal line: "epoch 2/10 [=====>     ] 312/938 loss 0.4123 acc 0.8610 5321 it/s ETA 0:12". */
static void progress(kiln_learner *L, int64_t e, int64_t b, int64_t nb, double loss, double acc, double ips,
                     double eta)
{
    FILE *f = L->cfg.progress;
    char bar[33];
    int filled = nb ? (int)((b + 1) * 30 / nb) : 30;
    bar[0] = '[';
    for (int i = 0; i < 30; i++)
        bar[i + 1] = i < filled ? '=' : i == filled ? '>' : ' ';
    bar[31] = ']';
    bar[32] = 0;
    int eta_s = eta > 0 && eta < 1e7 ? (int)eta : 0;
    fprintf(f, "%sepoch %lld/%lld %s %lld/%lld loss %.4f", isatty(fileno(f)) ? "\r" : "", (long long)e + 1,
            (long long)L->cfg.epochs, bar, (long long)b + 1, (long long)nb, loss);
    if (L->cfg.num_classes > 0)
        fprintf(f, " acc %.4f", acc);
    fprintf(f, " %.0f it/s ETA %d:%02d ", ips, eta_s / 60, eta_s % 60);
    fflush(f);
}

/* ---------------------------------------------------------------- one batch */

static kiln_tensor *compute_loss(kiln_learner *L, kiln_tensor *out, kiln_tensor *y)
{
    if (L->loss_fn)
        return L->loss_fn(L->loss_ud, out, y);
    return kiln_loss_cross_entropy(out, y, NULL);
}

/* A classifier's output must be [n, W] with W >= num_classes: logits wider than the classes
 * that occur are fine (PyTorch's cross entropy takes them), narrower ones leave a class
 * without a score. Checked before the loss, whose message would only name a target. */
static int check_output(const kiln_learner *L, kiln_tensor *out, int64_t n)
{
    int64_t C = L->cfg.num_classes;
    int nd = kiln_tensor_ndim(out);
    if (nd == 2 && kiln_tensor_dim(out, 0) == n && kiln_tensor_dim(out, 1) >= C)
        return 0;
    char shape[160] = "";
    for (int d = 0, used = 0; d < nd && used < (int)sizeof shape - 24; d++)
        used += snprintf(shape + used, sizeof shape - (size_t)used, "%s%lld", d ? ", " : "",
                         (long long)kiln_tensor_dim(out, d));
    if (nd == 2 && kiln_tensor_dim(out, 0) == n)
        return kiln__error_set("the classification output [%s] has %lld class scores an item, fewer than "
                               "the data's %lld classes",
                               shape, (long long)kiln_tensor_dim(out, 1), (long long)C);
    return kiln__error_set("the classification output is [%s]; expected [%lld, W] with W >= %lld (the "
                           "data's classes)",
                           shape, (long long)n, (long long)C);
}

/* Argmax predictions (and top-k hits) of logits [n, W] against labels, on the host; a row
 * holding a NaN is a miss. */
static int classify(kiln_learner *L, kiln_tensor *out, kiln_tensor *y, int64_t n, int64_t *correct, int64_t *topk,
                    bool tally)
{
    if (check_output(L, out, n) < 0)
        return -1;
    int64_t W = kiln_tensor_dim(out, 1);
    float *lg = malloc((size_t)(n * W) * sizeof *lg + 1);
    int64_t *lab = malloc((size_t)n * sizeof *lab + 1);
    kiln_tensor *of = kiln_cast(out, KILN_F32), *yl = kiln_cast(y, KILN_I64);
    int rc = -1;
    if (lg && lab && of && yl && kiln_to_data(of, lg, (size_t)(n * W) * sizeof *lg) == 0 &&
        kiln_to_data(yl, lab, (size_t)n * sizeof *lab) == 0) {
        for (int64_t i = 0; i < n; i++) {
            const float *row = lg + i * W;
            int64_t best = 0;
            for (int64_t c = 1; c < W && best >= 0; c++)
                best = isnan(row[c]) ? -1 : row[c] > row[best] ? c : best;
            if (isnan(row[0]))
                best = -1;
            *correct += best == lab[i];
            if (tally) {
                kiln__tally_add(&L->tally, lab[i], best);
                if (L->cm.counts)
                    kiln_confusion_add(&L->cm, lab[i], best);
            }
        }
        if (topk)
            *topk += kiln_topk_hits(lg, n, W, lab, L->cfg.topk);
        rc = 0;
    }
    free(lg);
    free(lab);
    return rc;
}

/* Forward, loss, backward and (at the end of an accumulation group) the update, all in
 * one scope. Returns 0 or -1; *loss_out gets the unscaled batch loss. */
static int train_step(kiln_learner *L, kiln_batch *b, bool update, double *loss_out, int64_t *correct)
{
    int rc = -1;
    kiln_tensor *out = kiln_module_forward(L->model, b->x);
    if (out && L->cfg.num_classes > 0 && check_output(L, out, b->n) < 0)
        return -1;
    kiln_tensor *loss = compute_loss(L, out, b->y);
    kiln_tensor *scaled = L->cfg.grad_accum > 1 ? kiln_mul_scalar(loss, 1.0 / L->cfg.grad_accum) : loss;
    if (!scaled)
        return -1;
    if (kiln_backward(scaled, NULL) < 0)
        return -1;
    /* The loss and, for a classifier, the batch's correct count (argmax against the labels,
     * on the device) come back in one read: the step's only wait for the host. */
    kiln_tensor *parts[2] = {kiln_cast(loss, KILN_F64), NULL};
    int nparts = 1;
    if (L->cfg.num_classes > 0) {
        /* a row holding a NaN is a miss, whatever index argmax makes of it */
        kiln_tensor *clean = kiln_logical_not(kiln_any(kiln_isnan(out), KILN_DIMS(1), false));
        kiln_tensor *hits = kiln_logical_and(kiln_eq(kiln_argmax(out, 1, false), kiln_cast(b->y, KILN_I64)),
                                             clean);
        parts[nparts++] = kiln_sum(kiln_cast(hits, KILN_F64), KILN_ALL_DIMS, false);
    }
    double got[2] = {NAN, 0};
    kiln_tensor *packed = kiln_stack(parts, nparts, 0);
    if (!packed || kiln_to_data(packed, got, (size_t)nparts * sizeof *got) < 0)
        return -1;
    double lv = got[0];
    if (nparts == 2)
        *correct += (int64_t)got[1];
    *loss_out = lv;
    if (L->cfg.fail_on_nonfinite_loss && !isfinite(lv))
        return 1; /* before the update: the caller names the step */
    if (update) {
        if (kiln_optim_step(L->opt) < 0)
            return -1;
        kiln_optim_zero_grad(L->opt);
        L->step++;
        /* A scheduler that refuses the step (one-cycle past total_steps) stops the run, as
         * PyTorch's raises: going on would train at an lr nobody asked for. */
        if (L->sched && L->cfg.sched_per_step && isnan(kiln_sched_step(L->sched)))
            return -1;
    }
    rc = 0;
    return rc;
}

/* ---------------------------------------------------------------- evaluation */

static int evaluate(kiln_learner *L, kiln_loader *ld, double *loss, int64_t *n_out, int64_t *correct,
                    int64_t *topk, bool tally)
{
    bool was = kiln_module_is_training(L->model);
    kiln_module_train(L->model, false);
    kiln_no_grad_begin();
    double sum = 0;
    int64_t n = 0;
    int rc = kiln_loader_start(ld, 0, 0);
    if (tally) {
        kiln__tally_reset(&L->tally);
        kiln_confusion_reset(&L->cm);
    }
    while (rc == 0) {
        kiln_scope_begin();
        kiln_batch b;
        int got = kiln_loader_next(ld, &b);
        if (got <= 0) {
            rc = got;
            kiln_scope_end();
            break;
        }
        kiln_tensor *out = kiln_module_forward(L->model, b.x);
        double lv = NAN;
        if (!out || (L->cfg.num_classes > 0 && check_output(L, out, b.n) < 0))
            rc = -1;
        else
            lv = kiln_item(compute_loss(L, out, b.y));
        if (rc == 0 && L->cfg.num_classes > 0)
            rc = classify(L, out, b.y, b.n, correct, topk, tally);
        sum += lv * (double)b.n;
        n += b.n;
        kiln_scope_end();
    }
    kiln_no_grad_end();
    kiln_module_train(L->model, was);
    *loss = n ? sum / (double)n : NAN;
    *n_out = n;
    return rc < 0 ? -1 : 0;
}

int kiln_learner_evaluate(kiln_learner *L, kiln_loader *ld, double *loss, double *accuracy)
{
    if (!L || !ld)
        return kiln__error_set("learner_evaluate: NULL argument");
    int64_t n = 0, correct = 0, topk = 0;
    double l;
    if (evaluate(L, ld, &l, &n, &correct, &topk, false) < 0)
        return -1;
    if (loss)
        *loss = l;
    if (accuracy)
        *accuracy = n ? (double)correct / (double)n : NAN;
    return 0;
}

/* ------------------------------------------------------------------ metrics */

static void set_metric(kiln_learner *L, const char *name, double v)
{
    for (int i = 0; i < L->nm; i++)
        if (strcmp(L->mnames[i], name) == 0) {
            L->mvals[i] = v;
            return;
        }
    if (L->nm < KILN__MAX_METRICS) {
        L->mnames[L->nm] = name;
        L->mvals[L->nm++] = v;
    }
}

void kiln__learner_track(kiln_learner *L, const cJSON *ep)
{
    if (L->best_metric) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(ep, L->best_metric);
        if (cJSON_IsNumber(v) &&
            (!L->has_best || (L->cfg.best_max ? v->valuedouble > L->best_value : v->valuedouble < L->best_value))) {
            L->has_best = true;
            L->best_value = v->valuedouble;
            L->best_epoch = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(ep, "epoch"));
            const cJSON *p = cJSON_GetObjectItemCaseSensitive(ep, "checkpoint");
            snprintf(L->best_ckpt, sizeof L->best_ckpt, "%s", cJSON_IsString(p) ? p->valuestring : "");
        }
    }
    if (L->es_metric) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(ep, L->es_metric);
        if (cJSON_IsNumber(v)) {
            double x = v->valuedouble;
            bool better = !L->es_has || (L->cfg.early_stop_max ? x > L->es_best + L->cfg.min_delta
                                                               : x < L->es_best - L->cfg.min_delta);
            if (better) {
                L->es_has = true;
                L->es_best = x;
                L->es_bad = 0;
            } else {
                L->es_bad++;
            }
        }
    }
}

/* ----------------------------------------------------------------------- fit */

static void done_event(kiln_learner *L, const char *reason)
{
    L->stop_reason = reason;
    kiln_train_event ev = {.kind = KILN_EVENT_DONE, .epoch = L->epoch, .step = L->step,
                           .batches = kiln_loader_batches(L->train), .stop_reason = reason,
                           .n = L->nm, .names = L->mnames, .values = L->mvals};
    kiln__learner_emit(L, &ev);
}

/* One epoch of training from L->batch_pos. 0 done, 1 cancelled, -1 error, -2 the loss became
 * NaN or infinite under fail_on_nonfinite_loss (the message names where). */
static int train_epoch(kiln_learner *L, int64_t e, double *seconds, int64_t *items)
{
    int64_t nb = kiln_loader_batches(L->train);
    if (kiln_loader_start(L->train, e, L->batch_pos) < 0)
        return -1;
    kiln_module_train(L->model, true);
    double t0 = now_s(), last_print = 0;
    int64_t seen = 0, b0 = L->batch_pos;
    int rc = 0;
    for (int64_t b = b0; b < nb; b++) {
        if (atomic_load(&L->cancel)) {
            rc = 1;
            break;
        }
        kiln_scope_begin();
        kiln_batch batch;
        int got = kiln_loader_next(L->train, &batch);
        bool update = (b + 1) % L->cfg.grad_accum == 0 || b == nb - 1;
        double lv = NAN;
        int64_t correct = 0;
        int step = got == 1 ? train_step(L, &batch, update, &lv, &correct) : -1;
        if (step != 0) {
            if (got == 0)
                kiln__error_set("learner: the training loader ended at batch %lld of %lld", (long long)b,
                                (long long)nb);
            if (step == 1)
                kiln__error_set("learner: loss became %s at epoch %lld step %lld (batch %lld of the epoch)",
                                isnan(lv) ? "NaN" : "infinite", (long long)e + 1, (long long)L->step + 1,
                                (long long)b + 1);
            kiln_scope_end();
            rc = step == 1 ? -2 : -1;
            break;
        }
        int64_t n = batch.n;
        kiln_scope_end();
        L->part_loss += lv * (double)n;
        L->part_correct += correct;
        L->part_n += n;
        L->batch_pos = b + 1;
        seen += n;
        double el = now_s() - t0, ips = el > 0 ? (double)seen / el : 0;
        double acc = n ? (double)correct / (double)n : 0, lr = kiln_optim_lr(L->opt);
        const char *names[] = {"loss", "accuracy", "lr", "items_per_sec"};
        double vals[] = {lv, acc, lr, ips};
        kiln_train_event ev = {.kind = KILN_EVENT_STEP, .epoch = e + 1, .batch = b, .batches = nb, .step = L->step,
                               .n = L->cfg.num_classes > 0 ? 4 : 3, .names = names, .values = vals};
        if (L->cfg.num_classes <= 0) {
            names[1] = "lr";
            vals[1] = lr;
            names[2] = "items_per_sec";
            vals[2] = ips;
        }
        kiln__learner_emit(L, &ev);
        /* A terminal gets the line redrawn five times a second; a pipe or a file gets it once an
         * epoch, since every redraw there is another line of carriage returns in a log. */
        if (L->cfg.progress && ((el - last_print > 0.2 && isatty(fileno(L->cfg.progress))) || b == nb - 1)) {
            last_print = el;
            double eta = el / (double)(b + 1 - b0) * (double)(nb - b - 1);
            progress(L, e, b, nb, L->part_n ? L->part_loss / (double)L->part_n : lv,
                     L->part_n ? (double)L->part_correct / (double)L->part_n : 0, ips, eta);
        }
        if (update && L->ckpt_dir && L->cfg.checkpoint_every_steps > 0 &&
            L->step % L->cfg.checkpoint_every_steps == 0 && b + 1 < nb) {
            if (kiln__learner_save(L, false) < 0) {
                rc = -1;
                break;
            }
        }
    }
    *seconds = now_s() - t0;
    *items = seen;
    if (L->cfg.progress && rc == 0)
        fputc('\n', L->cfg.progress);
    return rc;
}

int kiln_learner_fit(kiln_learner *L)
{
    if (!L)
        return kiln__error_set("learner_fit: NULL learner");
    atomic_store(&L->cancel, 0);
    L->stop_reason = "running";
    if (L->es_metric && L->es_bad >= L->cfg.patience) {
        done_event(L, "early_stopping");
        return 0;
    }
    while (L->epoch < L->cfg.epochs) {
        int64_t e = L->epoch;
        double secs = 0;
        int64_t items = 0;
        int rc = train_epoch(L, e, &secs, &items);
        if (rc == -2) {
            char msg[KILN_ERROR_MAX];
            snprintf(msg, sizeof msg, "%s", kiln_error());
            int code = kiln_error_code(); /* read with the message: the event may set others */
            done_event(L, "error");
            kiln__error_set_code(code, "%s", msg);
            return -1;
        }
        if (rc < 0) {
            char msg[KILN_ERROR_MAX];
            snprintf(msg, sizeof msg, "%s", kiln_error());
            int code = kiln_error_code(); /* read with the message: the event may set others */
            done_event(L, "error");
            kiln__error_set_code(code, "learner: epoch %lld: %s", (long long)e + 1, msg);
            return -1;
        }
        if (rc == 1) {
            done_event(L, "cancelled");
            return 0;
        }
        cJSON *ep = cJSON_CreateObject();
        if (!ep)
            return kiln__error_set("learner: out of memory");
        L->nm = 0;
        set_metric(L, "epoch", (double)(e + 1));
        set_metric(L, "train_loss", L->part_n ? L->part_loss / (double)L->part_n : NAN);
        if (L->cfg.num_classes > 0)
            set_metric(L, "train_accuracy", L->part_n ? (double)L->part_correct / (double)L->part_n : NAN);
        if (L->valid) {
            double vl;
            int64_t vn = 0, vc = 0, vk = 0;
            if (evaluate(L, L->valid, &vl, &vn, &vc, &vk, L->cfg.num_classes > 0) < 0) {
                cJSON_Delete(ep);
                char msg[KILN_ERROR_MAX];
                snprintf(msg, sizeof msg, "%s", kiln_error());
                int code = kiln_error_code(); /* read with the message: the event may set others */
                done_event(L, "error");
                kiln__error_set_code(code, "learner: validation after epoch %lld: %s", (long long)e + 1, msg);
                return -1;
            }
            set_metric(L, "valid_loss", vl);
            if (L->cfg.num_classes > 0 && vn > 0) {
                set_metric(L, "valid_accuracy", (double)vc / (double)vn);
                set_metric(L, L->topk_name, (double)vk / (double)vn);
                set_metric(L, "valid_precision", kiln__tally_precision(&L->tally));
                set_metric(L, "valid_recall", kiln__tally_recall(&L->tally));
                set_metric(L, "valid_f1", kiln__tally_f1(&L->tally));
            }
        }
        if (L->sched && !L->cfg.sched_per_step && isnan(kiln_sched_step(L->sched))) {
            cJSON_Delete(ep);
            char msg[KILN_ERROR_MAX];
            snprintf(msg, sizeof msg, "%s", kiln_error());
            int code = kiln_error_code(); /* read with the message: the event may set others */
            done_event(L, "error");
            kiln__error_set_code(code, "learner: scheduler after epoch %lld: %s", (long long)e + 1, msg);
            return -1;
        }
        set_metric(L, "lr", kiln_optim_lr(L->opt));
        set_metric(L, "items_per_sec", secs > 0 ? (double)items / secs : 0);
        set_metric(L, "epoch_seconds", secs);
        set_metric(L, "peak_rss_mb", peak_rss_mb());
        for (int i = 0; i < L->nm; i++)
            cJSON_AddItemToObject(ep, L->mnames[i], isfinite(L->mvals[i]) ? cJSON_CreateNumber(L->mvals[i])
                                                                            : cJSON_CreateNull());
        L->epoch = e + 1;
        L->batch_pos = 0;
        L->part_loss = 0;
        L->part_n = L->part_correct = 0;
        bool save = L->ckpt_dir && ((L->cfg.checkpoint_every_epochs > 0 &&
                                     L->epoch % L->cfg.checkpoint_every_epochs == 0) ||
                                    L->epoch == L->cfg.epochs);
        if (save) {
            char path[4200];
            snprintf(path, sizeof path, "%s/step-%09lld", L->ckpt_dir, (long long)L->step);
            cJSON_AddStringToObject(ep, "checkpoint", path);
        }
        cJSON_AddItemToArray(L->history, ep);
        kiln__learner_track(L, ep);
        if (save && kiln__learner_save(L, true) < 0) {
            char msg[KILN_ERROR_MAX];
            snprintf(msg, sizeof msg, "%s", kiln_error());
            int code = kiln_error_code(); /* read with the message: the event may set others */
            done_event(L, "error");
            kiln__error_set_code(code, "learner: checkpoint after epoch %lld: %s", (long long)L->epoch, msg);
            return -1;
        }
        if (L->cfg.progress) {
            fprintf(L->cfg.progress, "epoch %lld/%lld:", (long long)L->epoch, (long long)L->cfg.epochs);
            for (int i = 1; i < L->nm; i++)
                fprintf(L->cfg.progress, " %s %.4g", L->mnames[i], L->mvals[i]);
            fputc('\n', L->cfg.progress);
            fflush(L->cfg.progress);
        }
        kiln_train_event ev = {.kind = KILN_EVENT_EPOCH, .epoch = L->epoch, .step = L->step,
                               .batches = kiln_loader_batches(L->train), .n = L->nm, .names = L->mnames,
                               .values = L->mvals};
        kiln__learner_emit(L, &ev);
        if (L->es_metric && L->es_bad >= L->cfg.patience) {
            done_event(L, "early_stopping");
            return 0;
        }
    }
    done_event(L, "completed");
    return 0;
}

/* -------------------------------------------------------------------- report */

char *kiln_learner_report_json(const kiln_learner *L)
{
    if (!L)
        return kiln__error_set("learner_report_json: NULL learner"), NULL;
    cJSON *r = cJSON_CreateObject();
    if (!r)
        return NULL;
    cJSON_AddStringToObject(r, "stop_reason", L->stop_reason);
    cJSON_AddNumberToObject(r, "epochs_completed", (double)L->epoch);
    cJSON_AddNumberToObject(r, "steps", (double)L->step);
    cJSON_AddItemToObject(r, "history", cJSON_Duplicate(L->history, true));
    if (L->cm.counts) {
        cJSON *m = cJSON_AddArrayToObject(r, "valid_confusion");
        for (int64_t i = 0; m && i < L->cm.classes; i++) {
            cJSON *row = cJSON_CreateArray();
            for (int64_t j = 0; row && j < L->cm.classes; j++)
                cJSON_AddItemToArray(row, cJSON_CreateNumber((double)L->cm.counts[i * L->cm.classes + j]));
            cJSON_AddItemToArray(m, row);
        }
    }
    if (L->best_metric) {
        cJSON *b = cJSON_AddObjectToObject(r, "best");
        cJSON_AddStringToObject(b, "metric", L->best_metric);
        if (L->has_best) {
            cJSON_AddNumberToObject(b, "value", L->best_value);
            cJSON_AddNumberToObject(b, "epoch", (double)L->best_epoch);
            if (L->best_ckpt[0])
                cJSON_AddStringToObject(b, "checkpoint", L->best_ckpt);
        }
    }
    if (L->last_ckpt[0])
        cJSON_AddStringToObject(r, "last_checkpoint", L->last_ckpt);
    char *s = cJSON_Print(r);
    cJSON_Delete(r);
    return s;
}

int kiln_learner_write_report(const kiln_learner *L, const char *path)
{
    if (!path)
        return kiln__error_set("learner_write_report: NULL path");
    char *s = kiln_learner_report_json(L);
    if (!s)
        return -1;
    size_t n = strlen(s);
    char *text = realloc(s, n + 2);
    if (!text) {
        free(s);
        return kiln__error_set("learner_write_report: out of memory");
    }
    text[n] = '\n';
    text[n + 1] = 0;
    int rc = kiln__write_file_atomic(path, text, n + 1);
    if (rc < 0)
        kiln__error_restate("learner_write_report: %s", kiln_error());
    free(text);
    return rc;
}
