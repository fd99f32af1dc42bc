/*
 * scheduler/trainer.c — a training job from its JSON spec to a served model version.
 *
 * Parsing runs on the loop thread, so it only reads JSON and the file system: it never builds
 * the model (that allocates device memory and can take long for a large graph). A model spec
 * that is well-formed JSON but does not build fails the job when it starts, with the engine's
 * message naming the node. Every problem the parser can see is reported at once, so a user
 * fixes a spec in one round trip rather than one field per submit.
 *
 * The run happens on the daemon's training thread. Cancellation is a flag the Learner's
 * subscriber reads after each step, which is the granularity the Learner offers
 * (kiln_learner_cancel stops before the next step). Resuming uses the Learner's exact resume:
 * the loaders' order is a function of (seed, epoch), so a job restarted after a crash repeats
 * the batches it lost and ends with the model an uninterrupted run would have produced.
 */
#include <errno.h>
#include <stdarg.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kiln/data.h"
#include "kiln/loss.h"
#include "kiln/nn.h"
#include "kiln/record.h"
#include "kiln/repository.h"
#include "kiln/train.h"
#include "trainer.h"

#define FASHION_DIR "/usr/share/datasets/fashion-mnist"

/* The two models of examples/fashion_mnist.c, so a spec can name one instead of spelling it. */
static const char FASHION_MLP[] =
    "{\"inputs\":[\"x\"],\"nodes\":["
    "{\"name\":\"flat\",\"op\":\"flatten\",\"start_dim\":1,\"end_dim\":-1,\"inputs\":[\"x\"]},"
    "{\"name\":\"fc1\",\"layer\":\"Linear\",\"config\":{\"in_features\":784,\"out_features\":256},\"inputs\":[\"flat\"]},"
    "{\"name\":\"a1\",\"op\":\"relu\",\"inputs\":[\"fc1\"]},"
    "{\"name\":\"fc2\",\"layer\":\"Linear\",\"config\":{\"in_features\":256,\"out_features\":128},\"inputs\":[\"a1\"]},"
    "{\"name\":\"a2\",\"op\":\"relu\",\"inputs\":[\"fc2\"]},"
    "{\"name\":\"fc3\",\"layer\":\"Linear\",\"config\":{\"in_features\":128,\"out_features\":10},\"inputs\":[\"a2\"]}"
    "],\"outputs\":[\"fc3\"]}";
static const char FASHION_CNN[] =
    "{\"inputs\":[\"x\"],\"nodes\":["
    "{\"name\":\"conv1\",\"layer\":\"Conv2d\",\"config\":{\"in_channels\":1,\"out_channels\":32,\"kernel_size\":3,\"padding\":1},\"inputs\":[\"x\"]},"
    "{\"name\":\"bn1\",\"layer\":\"BatchNorm2d\",\"config\":{\"num_features\":32},\"inputs\":[\"conv1\"]},"
    "{\"name\":\"a1\",\"op\":\"relu\",\"inputs\":[\"bn1\"]},"
    "{\"name\":\"pool1\",\"layer\":\"MaxPool2d\",\"config\":{\"kernel_size\":2},\"inputs\":[\"a1\"]},"
    "{\"name\":\"conv2\",\"layer\":\"Conv2d\",\"config\":{\"in_channels\":32,\"out_channels\":64,\"kernel_size\":3,\"padding\":1},\"inputs\":[\"pool1\"]},"
    "{\"name\":\"bn2\",\"layer\":\"BatchNorm2d\",\"config\":{\"num_features\":64},\"inputs\":[\"conv2\"]},"
    "{\"name\":\"a2\",\"op\":\"relu\",\"inputs\":[\"bn2\"]},"
    "{\"name\":\"pool2\",\"layer\":\"MaxPool2d\",\"config\":{\"kernel_size\":2},\"inputs\":[\"a2\"]},"
    "{\"name\":\"flat\",\"op\":\"flatten\",\"start_dim\":1,\"end_dim\":-1,\"inputs\":[\"pool2\"]},"
    "{\"name\":\"fc1\",\"layer\":\"Linear\",\"config\":{\"in_features\":3136,\"out_features\":128},\"inputs\":[\"flat\"]},"
    "{\"name\":\"a3\",\"op\":\"relu\",\"inputs\":[\"fc1\"]},"
    "{\"name\":\"fc2\",\"layer\":\"Linear\",\"config\":{\"in_features\":128,\"out_features\":10},\"inputs\":[\"a3\"]}"
    "],\"outputs\":[\"fc2\"]}";

/* Metric names the Learner produces; checkpoint keep-best and early stopping must use one. */
static const char *const known_metrics[] = {
    "train_loss", "train_accuracy", "valid_loss", "valid_accuracy", "valid_top5_accuracy", "valid_precision",
    "valid_recall", "valid_f1", "lr", "items_per_sec", "epoch_seconds", NULL};

/* ---- problems ------------------------------------------------------------------------------ */

struct problems {
    char *buf;
    size_t len, used;
    int count;
};

static void problem(struct problems *p, const char *field, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void problem(struct problems *p, const char *field, const char *fmt, ...)
{
    p->count++;
    if (p->used + 2 >= p->len)
        return;
    int n = snprintf(p->buf + p->used, p->len - p->used, "%s%s: ", p->used ? "\n" : "", field);
    if (n > 0)
        p->used = p->used + (size_t)n < p->len ? p->used + (size_t)n : p->len - 1;
    va_list ap;
    va_start(ap, fmt);
    n = vsnprintf(p->buf + p->used, p->len - p->used, fmt, ap);
    va_end(ap);
    if (n > 0)
        p->used = p->used + (size_t)n < p->len ? p->used + (size_t)n : p->len - 1;
}

static const cJSON *get(const cJSON *obj, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(obj, key);
}

/* A number field within [lo, hi]; absent keeps *out. */
static void num(struct problems *p, const cJSON *obj, const char *key, const char *field, double lo, double hi,
                double *out)
{
    const cJSON *v = get(obj, key);
    if (!v)
        return;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        problem(p, field, "must be a number");
    else if (v->valuedouble < lo || v->valuedouble > hi)
        problem(p, field, "%g is out of range [%g, %g]", v->valuedouble, lo, hi);
    else
        *out = v->valuedouble;
}

static void integer(struct problems *p, const cJSON *obj, const char *key, const char *field, int64_t lo, int64_t hi,
                    int64_t *out)
{
    const cJSON *v = get(obj, key);
    if (!v)
        return;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        problem(p, field, "must be an integer");
    else if (v->valuedouble < (double)lo || v->valuedouble > (double)hi)
        problem(p, field, "%.0f is out of range [%lld, %lld]", v->valuedouble, (long long)lo, (long long)hi);
    else
        *out = (int64_t)v->valuedouble;
}

static void boolean(struct problems *p, const cJSON *obj, const char *key, const char *field, bool *out)
{
    const cJSON *v = get(obj, key);
    if (!v)
        return;
    if (!cJSON_IsBool(v))
        problem(p, field, "must be true or false");
    else
        *out = cJSON_IsTrue(v);
}

static char *string(struct problems *p, const cJSON *obj, const char *key, const char *field, bool required)
{
    const cJSON *v = get(obj, key);
    if (!v) {
        if (required)
            problem(p, field, "is required");
        return NULL;
    }
    if (!cJSON_IsString(v) || !v->valuestring[0]) {
        problem(p, field, "must be a non-empty string");
        return NULL;
    }
    return strdup(v->valuestring);
}

static void unknown_keys(struct problems *p, const cJSON *obj, const char *prefix, const char *const *allowed)
{
    for (const cJSON *c = obj ? obj->child : NULL; c; c = c->next) {
        bool ok = false;
        for (int i = 0; allowed[i] && !ok; i++)
            ok = strcmp(c->string, allowed[i]) == 0;
        if (!ok) {
            char field[160];
            snprintf(field, sizeof field, "%s%s", prefix, c->string);
            problem(p, field, "unknown field");
        }
    }
}

static bool known_metric(const char *name)
{
    for (int i = 0; known_metrics[i]; i++)
        if (strcmp(known_metrics[i], name) == 0)
            return true;
    return false;
}

/* "max"/"min", or the metric's natural direction (losses go down). */
static bool metric_max(struct problems *p, const cJSON *obj, const char *field, const char *metric)
{
    const cJSON *m = get(obj, "mode");
    if (m && cJSON_IsString(m) && strcmp(m->valuestring, "max") == 0)
        return true;
    if (m && cJSON_IsString(m) && strcmp(m->valuestring, "min") == 0)
        return false;
    if (m)
        problem(p, field, "must be \"max\" or \"min\"");
    return !metric || !strstr(metric, "loss");
}

/* Resolve path and require it under one of the roots; returns the real path (malloc'd). */
static char *confined_path(struct problems *p, const char *field, const char *path, const struct kiln_jobspec_env *env,
                           bool want_dir)
{
    if (!path)
        return NULL;
    char *real = realpath(path, NULL);
    if (!real) {
        problem(p, field, "%s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (stat(real, &st) != 0 || (want_dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode))) {
        problem(p, field, "%s is not a %s", path, want_dir ? "folder" : "regular file");
        free(real);
        return NULL;
    }
    for (size_t i = 0; env && i < env->nroots; i++) {
        char *root = realpath(env->roots[i], NULL);
        if (!root)
            continue;
        size_t n = strlen(root);
        bool under = strncmp(real, root, n) == 0 && (real[n] == '/' || real[n] == '\0' || (n == 1 && root[0] == '/'));
        free(root);
        if (under)
            return real;
    }
    problem(p, field, "%s is outside the data roots kilnd allows (config jobs.data_roots)", path);
    free(real);
    return NULL;
}

static void parse_model(struct problems *p, const cJSON *root, struct kiln_jobspec *s)
{
    const cJSON *m = get(root, "model");
    if (!m) {
        problem(p, "model", "is required (a JSON graph spec, or \"fashion_mlp\" / \"fashion_cnn\")");
        return;
    }
    if (cJSON_IsString(m)) {
        if (strcmp(m->valuestring, "fashion_mlp") == 0)
            s->model_json = strdup(FASHION_MLP);
        else if (strcmp(m->valuestring, "fashion_cnn") == 0)
            s->model_json = strdup(FASHION_CNN);
        else
            problem(p, "model", "unknown built-in model '%s' (known: fashion_mlp, fashion_cnn)", m->valuestring);
        return;
    }
    if (!cJSON_IsObject(m)) {
        problem(p, "model", "must be a JSON graph spec object or a built-in model name");
        return;
    }
    const cJSON *in = get(m, "inputs"), *nodes = get(m, "nodes"), *out = get(m, "outputs");
    if (!cJSON_IsArray(in) || cJSON_GetArraySize(in) != 1 || !cJSON_IsString(cJSON_GetArrayItem(in, 0)))
        problem(p, "model.inputs", "must list exactly one input name");
    if (!cJSON_IsArray(nodes) || cJSON_GetArraySize(nodes) == 0)
        problem(p, "model.nodes", "must be a non-empty array");
    if (!cJSON_IsArray(out) || cJSON_GetArraySize(out) != 1 || !cJSON_IsString(cJSON_GetArrayItem(out, 0)))
        problem(p, "model.outputs", "must list exactly one output name (the class logits)");
    s->model_json = cJSON_PrintUnformatted(m);
}

static void parse_data(struct problems *p, const cJSON *root, const struct kiln_jobspec_env *env, struct kiln_jobspec *s)
{
    const cJSON *d = get(root, "data");
    if (!cJSON_IsObject(d)) {
        problem(p, "data", d ? "must be an object" : "is required");
        return;
    }
    s->data_type = string(p, d, "type", "data.type", true);
    integer(p, d, "limit", "data.limit", 0, INT64_MAX / 2, &s->limit);
    integer(p, d, "valid_limit", "data.valid_limit", 0, INT64_MAX / 2, &s->valid_limit);
    num(p, d, "valid_split", "data.valid_split", 0, 0.9, &s->valid_split);
    if (!s->data_type)
        return;
    if (strcmp(s->data_type, "fashion_mnist") == 0) {
        static const char *const keys[] = {"type", "path", "normalize", "limit", "valid_limit", "valid_split", NULL};
        unknown_keys(p, d, "data.", keys);
        char *dir = string(p, d, "path", "data.path", false);
        s->train_a = confined_path(p, "data.path", dir ? dir : FASHION_DIR, env, true);
        free(dir);
        s->normalize = true;
        boolean(p, d, "normalize", "data.normalize", &s->normalize);
    } else if (strcmp(s->data_type, "idx") == 0) {
        static const char *const keys[] = {"type", "train_images", "train_labels", "valid_images", "valid_labels",
                                           "limit", "valid_limit", "valid_split", NULL};
        unknown_keys(p, d, "data.", keys);
        const char *names[4] = {"train_images", "train_labels", "valid_images", "valid_labels"};
        char **dst[4] = {&s->train_a, &s->train_b, &s->valid_a, &s->valid_b};
        for (int i = 0; i < 4; i++) {
            char field[64];
            snprintf(field, sizeof field, "data.%s", names[i]);
            char *raw = string(p, d, names[i], field, i < 2);
            *dst[i] = confined_path(p, field, raw, env, false);
            free(raw);
        }
        if (!s->valid_a != !s->valid_b)
            problem(p, "data.valid_images", "valid_images and valid_labels go together");
    } else if (strcmp(s->data_type, "csv") == 0) {
        static const char *const keys[] = {"type", "train", "valid", "label_column", "limit", "valid_limit",
                                           "valid_split", NULL};
        unknown_keys(p, d, "data.", keys);
        char *raw = string(p, d, "train", "data.train", true);
        s->train_a = confined_path(p, "data.train", raw, env, false);
        free(raw);
        raw = string(p, d, "valid", "data.valid", false);
        s->valid_a = confined_path(p, "data.valid", raw, env, false);
        free(raw);
        s->label_column = string(p, d, "label_column", "data.label_column", false);
        if (!s->label_column && !get(d, "label_column"))
            s->label_column = strdup("label");
    } else {
        problem(p, "data.type", "unknown type '%s' (known: fashion_mnist, idx, csv)", s->data_type);
    }
    if (s->valid_split > 0 && (s->valid_a || strcmp(s->data_type, "fashion_mnist") == 0))
        problem(p, "data.valid_split", "a split needs a data set without its own validation set");
}

static void parse_loss(struct problems *p, const cJSON *root, struct kiln_jobspec *s)
{
    const cJSON *l = get(root, "loss");
    if (!l)
        return;
    const char *kind = cJSON_IsString(l) ? l->valuestring : NULL;
    if (cJSON_IsObject(l)) {
        static const char *const keys[] = {"kind", "label_smoothing", NULL};
        unknown_keys(p, l, "loss.", keys);
        const cJSON *k = get(l, "kind");
        kind = cJSON_IsString(k) ? k->valuestring : "cross_entropy";
        num(p, l, "label_smoothing", "loss.label_smoothing", 0, 1, &s->label_smoothing);
    } else if (!kind) {
        problem(p, "loss", "must be a name or an object");
        return;
    }
    if (strcmp(kind, "cross_entropy") != 0)
        problem(p, "loss", "unknown loss '%s' (jobs train classifiers: cross_entropy)", kind);
}

static void parse_optimizer(struct problems *p, const cJSON *root, struct kiln_jobspec *s)
{
    s->optim = kiln_optim_config_default(KILN_OPTIM_ADAM);
    const cJSON *o = get(root, "optimizer");
    if (!o)
        return;
    if (!cJSON_IsObject(o)) {
        problem(p, "optimizer", "must be an object");
        return;
    }
    static const char *const keys[] = {"kind", "lr", "weight_decay", "momentum", "nesterov", "beta1", "beta2",
                                       "eps", "amsgrad", "grad_accum", NULL};
    unknown_keys(p, o, "optimizer.", keys);
    const cJSON *k = get(o, "kind");
    if (k) {
        int kind = cJSON_IsString(k) ? kiln_optim_kind_from_name(k->valuestring) : -1;
        if (kind < 0)
            problem(p, "optimizer.kind", "unknown optimizer (known: sgd, adam, adamw, rmsprop, adagrad)");
        else
            s->optim = kiln_optim_config_default((kiln_optim_kind)kind);
    }
    num(p, o, "lr", "optimizer.lr", 1e-12, 100, &s->optim.lr);
    num(p, o, "weight_decay", "optimizer.weight_decay", 0, 10, &s->optim.weight_decay);
    num(p, o, "momentum", "optimizer.momentum", 0, 1, &s->optim.momentum);
    num(p, o, "beta1", "optimizer.beta1", 0, 0.999999, &s->optim.beta1);
    num(p, o, "beta2", "optimizer.beta2", 0, 0.999999999, &s->optim.beta2);
    num(p, o, "eps", "optimizer.eps", 0, 1, &s->optim.eps);
    boolean(p, o, "nesterov", "optimizer.nesterov", &s->optim.nesterov);
    boolean(p, o, "amsgrad", "optimizer.amsgrad", &s->optim.amsgrad);
}

static void parse_scheduler(struct problems *p, const cJSON *root, struct kiln_jobspec *s)
{
    const cJSON *o = get(root, "scheduler");
    s->sched_per_step = true;
    if (!o || cJSON_IsNull(o))
        return;
    if (!cJSON_IsObject(o)) {
        problem(p, "scheduler", "must be an object");
        return;
    }
    static const char *const keys[] = {"kind", "per", "t_max", "eta_min", "step_size", "gamma", "warmup_steps",
                                       NULL};
    unknown_keys(p, o, "scheduler.", keys);
    static const struct {
        const char *name;
        kiln_sched_kind kind;
    } kinds[] = {{"cosine", KILN_SCHED_COSINE}, {"step", KILN_SCHED_STEP}, {"exponential", KILN_SCHED_EXPONENTIAL},
                 {"linear", KILN_SCHED_LINEAR}, {"constant", KILN_SCHED_CONSTANT}};
    const cJSON *k = get(o, "kind");
    int found = -1;
    for (size_t i = 0; cJSON_IsString(k) && i < sizeof kinds / sizeof kinds[0]; i++)
        if (strcmp(kinds[i].name, k->valuestring) == 0)
            found = (int)i;
    if (found < 0) {
        problem(p, "scheduler.kind", "unknown or missing (known: cosine, step, exponential, linear, constant)");
        return;
    }
    s->has_sched = true;
    s->sched = kiln_sched_config_default(kinds[found].kind);
    const cJSON *per = get(o, "per");
    if (per && !(cJSON_IsString(per) && (!strcmp(per->valuestring, "step") || !strcmp(per->valuestring, "epoch"))))
        problem(p, "scheduler.per", "must be \"step\" or \"epoch\"");
    else if (per)
        s->sched_per_step = strcmp(per->valuestring, "step") == 0;
    integer(p, o, "t_max", "scheduler.t_max", 1, INT64_MAX / 2, &s->sched.t_max);
    num(p, o, "eta_min", "scheduler.eta_min", 0, 100, &s->sched.eta_min);
    integer(p, o, "step_size", "scheduler.step_size", 1, INT64_MAX / 2, &s->sched.step_size);
    num(p, o, "gamma", "scheduler.gamma", 0, 10, &s->sched.gamma);
    integer(p, o, "warmup_steps", "scheduler.warmup_steps", 0, INT64_MAX / 2, &s->sched.warmup_steps);
    if (kinds[found].kind == KILN_SCHED_STEP && s->sched.step_size < 1)
        problem(p, "scheduler.step_size", "is required for kind step");
}

static void parse_checkpoint(struct problems *p, const cJSON *root, struct kiln_jobspec *s)
{
    s->ckpt_every_epochs = 1;
    s->keep_last = 2;
    const cJSON *c = get(root, "checkpoint");
    if (!c)
        return;
    if (!cJSON_IsObject(c)) {
        problem(p, "checkpoint", "must be an object");
        return;
    }
    static const char *const keys[] = {"every_epochs", "every_steps", "keep_last", "best_metric", "mode", NULL};
    unknown_keys(p, c, "checkpoint.", keys);
    integer(p, c, "every_epochs", "checkpoint.every_epochs", 0, 1000000, &s->ckpt_every_epochs);
    integer(p, c, "every_steps", "checkpoint.every_steps", 0, INT64_MAX / 2, &s->ckpt_every_steps);
    int64_t keep = s->keep_last;
    integer(p, c, "keep_last", "checkpoint.keep_last", 1, 1000, &keep);
    s->keep_last = (int)keep;
    s->best_metric = string(p, c, "best_metric", "checkpoint.best_metric", false);
    if (s->best_metric && !known_metric(s->best_metric))
        problem(p, "checkpoint.best_metric", "unknown metric '%s'", s->best_metric);
    s->best_max = metric_max(p, c, "checkpoint.mode", s->best_metric);
}

static void parse_early(struct problems *p, const cJSON *root, struct kiln_jobspec *s)
{
    const cJSON *e = get(root, "early_stopping");
    s->patience = 3;
    if (!e || cJSON_IsNull(e))
        return;
    if (!cJSON_IsObject(e)) {
        problem(p, "early_stopping", "must be an object");
        return;
    }
    static const char *const keys[] = {"metric", "mode", "patience", "min_delta", NULL};
    unknown_keys(p, e, "early_stopping.", keys);
    s->early_metric = string(p, e, "metric", "early_stopping.metric", true);
    if (s->early_metric && !known_metric(s->early_metric))
        problem(p, "early_stopping.metric", "unknown metric '%s'", s->early_metric);
    s->early_max = metric_max(p, e, "early_stopping.mode", s->early_metric);
    int64_t pat = s->patience;
    integer(p, e, "patience", "early_stopping.patience", 1, 1000000, &pat);
    s->patience = (int)pat;
    num(p, e, "min_delta", "early_stopping.min_delta", 0, 1e9, &s->min_delta);
}

int kiln_jobspec_parse(const char *json, const struct kiln_jobspec_env *env, struct kiln_jobspec *s,
                       char *buf, size_t len)
{
    memset(s, 0, sizeof *s);
    struct problems p = {buf, len, 0, 0};
    if (len)
        buf[0] = '\0';
    cJSON *root = cJSON_Parse(json);
    if (!cJSON_IsObject(root)) {
        problem(&p, "body", root ? "must be a JSON object" : "is not valid JSON");
        cJSON_Delete(root);
        return -1;
    }
    static const char *const keys[] = {"model", "data", "loss", "optimizer", "scheduler", "epochs", "batch_size",
                                       "device", "seed", "workers", "metrics", "checkpoint", "early_stopping",
                                       "register_as", "max_batch_size", "resume_from_job", NULL};
    unknown_keys(&p, root, "", keys);
    parse_model(&p, root, s);
    parse_data(&p, root, env, s);
    parse_loss(&p, root, s);
    parse_optimizer(&p, root, s);
    parse_scheduler(&p, root, s);
    parse_checkpoint(&p, root, s);
    parse_early(&p, root, s);
    s->epochs = 1;
    s->batch_size = 64;
    integer(&p, root, "epochs", "epochs", 1, 100000, &s->epochs);
    integer(&p, root, "batch_size", "batch_size", 1, 1 << 20, &s->batch_size);
    int64_t seed = 0, workers = 0, mbs = 64;
    integer(&p, root, "seed", "seed", 0, INT64_MAX, &seed);
    integer(&p, root, "workers", "workers", 0, 64, &workers);
    integer(&p, root, "max_batch_size", "max_batch_size", 0, 4096, &mbs);
    integer(&p, root, "resume_from_job", "resume_from_job", 0, INT64_MAX / 2, &s->resume_from_job);
    s->seed = (uint64_t)seed;
    s->workers = (int)workers;
    s->max_batch_size = (int)mbs;
    s->device = string(&p, root, "device", "device", false);
    if (!s->device)
        s->device = strdup("cpu");
    const cJSON *metrics = get(root, "metrics");
    if (metrics && !cJSON_IsArray(metrics))
        problem(&p, "metrics", "must be an array of metric names");
    for (const cJSON *m = metrics ? metrics->child : NULL; m; m = m->next) {
        /* The Learner computes all of them anyway; the list only guards against typos, and
         * "accuracy" / "loss" are accepted as the short names people write. */
        if (!cJSON_IsString(m) || (!known_metric(m->valuestring) && strcmp(m->valuestring, "accuracy") &&
                                   strcmp(m->valuestring, "loss")))
            problem(&p, "metrics", "unknown metric %s", cJSON_IsString(m) ? m->valuestring : "(not a string)");
    }
    const cJSON *reg = get(root, "register_as");
    if (reg) {
        if (!cJSON_IsString(reg) || !kiln_repository_name_valid(reg->valuestring))
            problem(&p, "register_as", "must be a model name of [A-Za-z0-9_.-] without a leading dot");
        else
            s->register_as = strdup(reg->valuestring);
    }
    cJSON_Delete(root);
    if (p.count) {
        kiln_jobspec_free(s);
        return -1;
    }
    return 0;
}

void kiln_jobspec_free(struct kiln_jobspec *s)
{
    char *const strs[] = {s->model_json, s->data_type, s->train_a, s->train_b, s->valid_a, s->valid_b,
                          s->label_column, s->device, s->best_metric, s->early_metric, s->register_as};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
        free(strs[i]);
    memset(s, 0, sizeof *s);
}

/* ---- the run ------------------------------------------------------------------------------- */

struct run_ctx {
    const struct kiln_trainer_run *run;
    kiln_learner *L;
    uint64_t last_step_ns;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void logf_(const struct kiln_trainer_run *run, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(const struct kiln_trainer_run *run, const char *fmt, ...)
{
    if (!run->hooks.event)
        return;
    char msg[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "message", msg);
    char *text = cJSON_PrintUnformatted(o);
    if (text)
        run->hooks.event(run->hooks.ud, "log", text);
    cJSON_free(text);
    cJSON_Delete(o);
}

static void on_event(void *ud, const kiln_train_event *ev)
{
    struct run_ctx *c = ud;
    const struct kiln_trainer_hooks *h = &c->run->hooks;
    if (atomic_load(c->run->cancel))
        kiln_learner_cancel(c->L);
    switch (ev->kind) {
    case KILN_EVENT_STEP: {
        double total = (double)(c->run->spec->epochs * ev->batches);
        if (h->progress && total > 0)
            h->progress(h->ud, ((double)(ev->epoch - 1) * (double)ev->batches + (double)ev->batch + 1) / total);
        /* Every step is too many rows for the store on a fast model: at most five a second,
         * plus each epoch's last step. */
        uint64_t t = now_ns();
        if (h->event && (t - c->last_step_ns > 200000000u || ev->batch + 1 == ev->batches)) {
            c->last_step_ns = t;
            h->event(h->ud, "step", ev->json);
        }
        break;
    }
    case KILN_EVENT_EPOCH:
        if (h->event)
            h->event(h->ud, "epoch", ev->json);
        break;
    case KILN_EVENT_CHECKPOINT:
        if (h->event)
            h->event(h->ud, "checkpoint", ev->json);
        if (h->checkpoint && ev->path)
            h->checkpoint(h->ud, ev->path, ev->step);
        break;
    case KILN_EVENT_DONE:
        break;
    }
}

static kiln_dataset *open_set(const struct kiln_jobspec *s, const char *a, const char *b, const char *fashion_prefix,
                              int64_t limit)
{
    kiln_dataset *ds = NULL;
    if (strcmp(s->data_type, "fashion_mnist") == 0) {
        char im[PATH_MAX + 64], lb[PATH_MAX + 64];
        snprintf(im, sizeof im, "%s/%s-images-idx3-ubyte.gz", a, fashion_prefix);
        snprintf(lb, sizeof lb, "%s/%s-labels-idx1-ubyte.gz", a, fashion_prefix);
        kiln_dataset *raw = kiln_dataset_idx(im, lb);
        ds = raw && s->normalize ? kiln_dataset_normalize(raw, 1, (const float[]){0.2860f}, (const float[]){0.3530f})
                                 : (raw ? kiln_dataset_retain(raw) : NULL);
        kiln_dataset_free(raw);
    } else if (strcmp(s->data_type, "idx") == 0) {
        ds = kiln_dataset_idx(a, b);
    } else {
        ds = kiln_dataset_csv(a, s->label_column, 0, NULL);
    }
    if (ds && limit > 0 && limit < kiln_dataset_length(ds)) {
        kiln_dataset *sub = kiln_dataset_range(ds, 0, limit);
        kiln_dataset_free(ds);
        ds = sub;
    }
    return ds;
}

static int write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    int rc = fputs(text, f) < 0 ? -1 : 0;
    if (fclose(f) != 0)
        rc = -1;
    return rc;
}

/* The served model's config.json: one input shaped like an item, one output of class logits. */
static char *serving_config(const struct kiln_jobspec *s, const kiln_dataset_info *info)
{
    cJSON *spec = cJSON_Parse(s->model_json);
    const cJSON *in = cJSON_GetArrayItem(get(spec, "inputs"), 0), *out = cJSON_GetArrayItem(get(spec, "outputs"), 0);
    cJSON *c = cJSON_CreateObject();
    cJSON *ins = cJSON_AddArrayToObject(c, "inputs"), *outs = cJSON_AddArrayToObject(c, "outputs");
    cJSON *i0 = cJSON_CreateObject(), *o0 = cJSON_CreateObject();
    cJSON_AddStringToObject(i0, "name", cJSON_IsString(in) ? in->valuestring : "x");
    cJSON_AddStringToObject(i0, "datatype", "FP32");
    cJSON *shape = cJSON_AddArrayToObject(i0, "shape");
    cJSON_AddItemToArray(shape, cJSON_CreateNumber(-1));
    for (int d = 0; d < info->ndim; d++)
        cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)info->shape[d]));
    cJSON_AddStringToObject(o0, "name", cJSON_IsString(out) ? out->valuestring : "logits");
    cJSON_AddStringToObject(o0, "datatype", "FP32");
    shape = cJSON_AddArrayToObject(o0, "shape");
    cJSON_AddItemToArray(shape, cJSON_CreateNumber(-1));
    cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)info->num_classes));
    cJSON_AddItemToArray(ins, i0);
    cJSON_AddItemToArray(outs, o0);
    cJSON_AddNumberToObject(c, "max_batch_size", s->max_batch_size);
    cJSON_AddStringToObject(c, "device", s->device);
    char *text = cJSON_Print(c);
    cJSON_Delete(c);
    cJSON_Delete(spec);
    return text;
}

/* model.kiln (the spec as the record's config, the state dict as its tensors) and config.json
 * staged in scratch, then added to the repository as its next version. */
static int register_model(const struct kiln_trainer_run *run, kiln_module *model, const kiln_dataset_info *info,
                          struct kiln_trainer_result *res)
{
    const struct kiln_jobspec *s = run->spec;
    mkdir(run->scratch_dir, 0755);
    char kpath[PATH_MAX], cpath[PATH_MAX];
    snprintf(kpath, sizeof kpath, "%s/model.kiln", run->scratch_dir);
    snprintf(cpath, sizeof cpath, "%s/config.json", run->scratch_dir);
    int n = kiln_module_state_dict(model, NULL, 0);
    kiln_named_tensor *nt = calloc((size_t)(n > 0 ? n : 1), sizeof *nt);
    const char **names = calloc((size_t)(n > 0 ? n : 1), sizeof *names);
    kiln_tensor **ts = calloc((size_t)(n > 0 ? n : 1), sizeof *ts);
    int rc = nt && names && ts ? 0 : -1;
    if (rc == 0) {
        kiln_module_state_dict(model, nt, n);
        for (int i = 0; i < n; i++) {
            names[i] = nt[i].name;
            ts[i] = nt[i].tensor;
        }
        rc = kiln_record_save(kpath, n, names, ts, s->model_json, 0);
    }
    free(nt);
    free(names);
    free(ts);
    if (rc != 0) {
        snprintf(res->error, sizeof res->error, "saving the model: %s", kiln_error());
        return -1;
    }
    char *cfg = serving_config(s, info);
    if (!cfg || write_text(cpath, cfg) != 0) {
        free(cfg);
        snprintf(res->error, sizeof res->error, "writing %.300s: %.100s", cpath, strerror(errno));
        return -1;
    }
    free(cfg);
    kiln_repository *repo = kiln_repository_open(run->models_root);
    int64_t version = 0;
    rc = repo ? kiln_repository_add_version(repo, s->register_as, run->scratch_dir, 0, &version) : -1;
    if (rc != 0)
        snprintf(res->error, sizeof res->error, "adding the model to the repository: %s", kiln_error());
    kiln_repository_close(repo);
    unlink(kpath);
    unlink(cpath);
    rmdir(run->scratch_dir);
    res->version = rc == 0 ? version : 0;
    return rc == 0 ? 0 : -1;
}

static char *final_metrics(kiln_learner *L)
{
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; known_metrics[i]; i++) {
        double v = kiln_learner_metric(L, known_metrics[i]);
        if (isfinite(v))
            cJSON_AddNumberToObject(o, known_metrics[i], v);
    }
    cJSON_AddNumberToObject(o, "epochs", (double)kiln_learner_epoch(L));
    cJSON_AddNumberToObject(o, "steps", (double)kiln_learner_step(L));
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    char *copy = text ? strdup(text) : NULL;
    cJSON_free(text);
    return copy;
}

static kiln_tensor *smoothed_ce(void *ud, kiln_tensor *output, kiln_tensor *target)
{
    kiln_loss_ce_opts o = kiln_loss_ce_opts_default();
    o.label_smoothing = *(const double *)ud;
    return kiln_loss_cross_entropy(output, target, &o);
}

int kiln_trainer_run(const struct kiln_trainer_run *run, struct kiln_trainer_result *res)
{
    const struct kiln_jobspec *s = run->spec;
    memset(res, 0, sizeof *res);
    snprintf(res->stop_reason, sizeof res->stop_reason, "error");
    kiln_device *dev = kiln_device_open(s->device);
    kiln_dataset *train = NULL, *valid = NULL;
    kiln_module *model = NULL;
    kiln_optim *opt = NULL;
    kiln_sched *sched = NULL;
    kiln_loader *tl = NULL, *vl = NULL;
    kiln_learner *L = NULL;
    int rc = -1;
    if (!dev) {
        snprintf(res->error, sizeof res->error, "device: %s", kiln_error());
        goto out;
    }
    logf_(run, "loading %s data", s->data_type);
    train = open_set(s, s->train_a, s->train_b, "train", s->limit);
    if (train && strcmp(s->data_type, "fashion_mnist") == 0)
        valid = open_set(s, s->train_a, NULL, "t10k", s->valid_limit);
    else if (train && s->valid_a)
        valid = open_set(s, s->valid_a, s->valid_b, NULL, s->valid_limit);
    if (!train || (!valid && (s->valid_a || strcmp(s->data_type, "fashion_mnist") == 0))) {
        snprintf(res->error, sizeof res->error, "data: %s", kiln_error());
        goto out;
    }
    if (s->valid_split > 0) {
        kiln_dataset *tr = NULL, *va = NULL;
        if (kiln_dataset_split(train, s->valid_split, s->seed, &tr, &va) != 0) {
            snprintf(res->error, sizeof res->error, "data.valid_split: %s", kiln_error());
            goto out;
        }
        kiln_dataset_free(train);
        train = tr;
        valid = va;
    }
    kiln_dataset_info info = kiln_dataset_get_info(train);
    if (info.num_classes <= 0) {
        snprintf(res->error, sizeof res->error, "data: the training set has no class labels");
        goto out;
    }
    kiln_generator gen = kiln_generator_make(s->seed);
    model = kiln_model_from_json(s->model_json, dev, &gen);
    if (!model) {
        snprintf(res->error, sizeof res->error, "model: %s", kiln_error());
        goto out;
    }
    opt = kiln_optim_create_module(&s->optim, model);
    kiln_loader_config lc = kiln_loader_config_default();
    lc.batch_size = s->batch_size;
    lc.seed = s->seed;
    lc.workers = s->workers;
    tl = opt ? kiln_loader_create(train, &lc, dev) : NULL;
    lc.shuffle = false;
    lc.batch_size = s->batch_size > 256 ? s->batch_size : 256;
    vl = tl && valid ? kiln_loader_create(valid, &lc, dev) : NULL;
    if (!tl || (valid && !vl)) {
        snprintf(res->error, sizeof res->error, "%s", kiln_error());
        goto out;
    }
    if (s->has_sched) {
        kiln_sched_config sc = s->sched;
        if (sc.kind == KILN_SCHED_COSINE && sc.t_max <= 0)
            sc.t_max = s->sched_per_step ? s->epochs * kiln_loader_batches(tl) : s->epochs;
        sched = kiln_sched_create(&sc, opt);
        if (!sched) {
            snprintf(res->error, sizeof res->error, "scheduler: %s", kiln_error());
            goto out;
        }
    }
    mkdir(run->checkpoint_dir, 0755);
    kiln_learner_config cfg = kiln_learner_config_default();
    cfg.epochs = s->epochs;
    cfg.num_classes = info.num_classes;
    cfg.sched_per_step = s->sched_per_step;
    cfg.checkpoint_dir = run->checkpoint_dir;
    cfg.checkpoint_every_epochs = s->ckpt_every_epochs;
    cfg.checkpoint_every_steps = s->ckpt_every_steps;
    cfg.keep_last = s->keep_last;
    cfg.best_metric = s->best_metric;
    cfg.best_max = s->best_max;
    cfg.early_stop_metric = s->early_metric;
    cfg.early_stop_max = s->early_max;
    cfg.patience = s->patience;
    cfg.min_delta = s->min_delta;
    cfg.seed = s->seed;
    L = kiln_learner_create(&cfg, model, opt, sched, tl, vl);
    if (!L) {
        snprintf(res->error, sizeof res->error, "%s", kiln_error());
        goto out;
    }
    double smoothing = s->label_smoothing;
    if (smoothing > 0)
        kiln_learner_set_loss(L, smoothed_ce, &smoothing);
    struct run_ctx ctx = {run, L, 0};
    kiln_learner_subscribe(L, on_event, &ctx);
    if (run->resume_dir) {
        kiln_ckpt *ck = kiln_ckpt_open_latest(run->resume_dir, NULL, NULL);
        if (ck) {
            int64_t step = kiln_ckpt_step(ck);
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%s", kiln_ckpt_path(ck));
            kiln_ckpt_close(ck);
            if (kiln_learner_resume(L, path) != 0) {
                snprintf(res->error, sizeof res->error, "resuming from %.200s: %.250s", path, kiln_error());
                goto out;
            }
            res->resumed = true;
            res->resumed_step = step;
            logf_(run, "resumed from checkpoint at step %lld (epoch %lld)", (long long)step,
                  (long long)kiln_learner_epoch(L));
        } else {
            logf_(run, "no usable checkpoint in %s; starting from the beginning", run->resume_dir);
        }
    }
    if (atomic_load(run->cancel)) {
        snprintf(res->stop_reason, sizeof res->stop_reason, "cancelled");
        rc = 0;
        goto out;
    }
    logf_(run, "training %lld parameters on %lld items (%lld validation), %lld batches per epoch on %s",
          (long long)kiln_module_parameter_count(model, true), (long long)kiln_dataset_length(train),
          (long long)(valid ? kiln_dataset_length(valid) : 0), (long long)kiln_loader_batches(tl),
          kiln_device_name(dev));
    if (kiln_learner_fit(L) != 0) {
        snprintf(res->error, sizeof res->error, "%s", kiln_error());
        goto out;
    }
    snprintf(res->stop_reason, sizeof res->stop_reason, "%s", kiln_learner_stop_reason(L));
    res->metrics_json = final_metrics(L);
    rc = 0;
    if (strcmp(res->stop_reason, "cancelled") != 0 && s->register_as) {
        kiln_module_train(model, false);
        rc = register_model(run, model, &info, res);
        if (rc == 0)
            logf_(run, "model registered as %s version %lld", s->register_as, (long long)res->version);
    }
out:
    if (rc != 0)
        snprintf(res->stop_reason, sizeof res->stop_reason, "error");
    kiln_learner_free(L);
    kiln_sched_free(sched);
    kiln_loader_free(vl);
    kiln_loader_free(tl);
    kiln_optim_free(opt);
    kiln_module_free(model);
    kiln_dataset_free(train);
    kiln_dataset_free(valid);
    if (dev)
        kiln_device_close(dev);
    return rc;
}
