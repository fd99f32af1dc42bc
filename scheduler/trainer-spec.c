/*
 * scheduler/trainer-spec.c — a job spec from JSON to struct kd_jobspec, every problem found.
 *
 * Parsing runs on the loop thread, so it only reads JSON and the file system (and which devices
 * kilnd drives: kd_jobspec_set_devices). What a spec needs to run at all, so that "queued" means
 * it can, is kd_jobspec_check_runnable: the device opened and closed again, and the model built
 * once on the ref device (host memory, never the job's device), run on one zero item shaped like
 * the data's where a header tells that shape, and given to the optimizer and scheduler, which
 * finds what only the engine knows (an unknown layer, a bad config, a node that does not connect,
 * a Linear of the wrong width, too few class scores) with the engine's message naming the node.
 * Those can take long (a large model's initialisation, a GPU context, a remote device's
 * connection), so the submission runs them off the loop (api/jobs-routes.c); a queued job parsed
 * again to run skips them, since the run meets the same problems itself. Every problem is
 * reported at once, so a user fixes a spec in one round trip rather than one field per submit.
 *
 * This file holds the whole spec's parse, the problem list and the field readers every section
 * uses, the device, and the sections that name what is trained (model, data);
 * trainer-spec-settings.c holds the sections that say how (loss, optimizer, learning-rate
 * scheduler, checkpoints, early stopping).
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

#include "common/utf8.h"
#include "json-keys-impl.h"
#include "kiln/nn.h"
#include "kiln/record.h"
#include "repository.h"
#include "scheduler.h"
#include "trainer-impl.h"
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

/* ---- problems, and the fields' readers that report them (trainer-impl.h) -------------------- */

void kd_spec_problem(struct kd_spec_problems *p, const char *field, const char *fmt, ...)
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

const cJSON *kd_spec_get(const cJSON *obj, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(obj, key);
}

/* A number field within [lo, hi]; absent keeps *out. */
void kd_spec_number(struct kd_spec_problems *p, const cJSON *obj, const char *key, const char *field, double lo,
                    double hi, double *out)
{
    const cJSON *v = kd_spec_get(obj, key);
    if (!v)
        return;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        kd_spec_problem(p, field, "must be a number");
    else if (v->valuedouble < lo || v->valuedouble > hi)
        kd_spec_problem(p, field, "%g is out of range [%g, %g]", v->valuedouble, lo, hi);
    else
        *out = v->valuedouble;
}

void kd_spec_integer(struct kd_spec_problems *p, const cJSON *obj, const char *key, const char *field, int64_t lo,
                     int64_t hi, int64_t *out)
{
    const cJSON *v = kd_spec_get(obj, key);
    if (!v)
        return;
    /* JSON numbers are read as doubles: past 2^53 the value read may not be the one written
     * (9007199254740993 reads as ...992), and printed whole it runs to 309 digits (1e308) */
    const double exact = 9007199254740992.0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        kd_spec_problem(p, field, "must be an integer");
    else if ((v->valuedouble < (double)lo || v->valuedouble > (double)hi) && fabs(v->valuedouble) >= exact)
        kd_spec_problem(p, field, "%g is out of range [%lld, %lld]", v->valuedouble, (long long)lo, (long long)hi);
    else if (v->valuedouble < (double)lo || v->valuedouble > (double)hi)
        kd_spec_problem(p, field, "%.0f is out of range [%lld, %lld]", v->valuedouble, (long long)lo,
                        (long long)hi);
    else if (fabs(v->valuedouble) >= exact) /* 2^53 + 1 reads as 2^53: that one is suspect too */
        kd_spec_problem(p, field,
                        "%g is past 2^53, where a JSON number is not read exactly; give one of magnitude at most "
                        "9007199254740991",
                        v->valuedouble);
    else
        *out = (int64_t)v->valuedouble;
}

void kd_spec_boolean(struct kd_spec_problems *p, const cJSON *obj, const char *key, const char *field, bool *out)
{
    const cJSON *v = kd_spec_get(obj, key);
    if (!v)
        return;
    if (!cJSON_IsBool(v))
        kd_spec_problem(p, field, "must be true or false");
    else
        *out = cJSON_IsTrue(v);
}

char *kd_spec_string(struct kd_spec_problems *p, const cJSON *obj, const char *key, const char *field,
                     bool required)
{
    const cJSON *v = kd_spec_get(obj, key);
    if (!v) {
        if (required)
            kd_spec_problem(p, field, "is required");
        return NULL;
    }
    if (!cJSON_IsString(v) || !v->valuestring[0]) {
        kd_spec_problem(p, field, "must be a non-empty string");
        return NULL;
    }
    return strdup(v->valuestring);
}

void kd_spec_unknown_keys(struct kd_spec_problems *p, const cJSON *obj, const char *prefix,
                          const char *const *allowed)
{
    for (const cJSON *c = obj ? obj->child : NULL; c; c = c->next) {
        bool ok = false;
        for (int i = 0; allowed[i] && !ok; i++)
            ok = strcmp(c->string, allowed[i]) == 0;
        if (!ok) {
            char field[160];
            snprintf(field, sizeof field, "%s%s", prefix, c->string);
            kd_spec_problem(p, field, "unknown field");
        }
    }
}

/* Each key given twice, anywhere in the spec, is a problem named by its place: GET
 * /v1/jobs/N would otherwise show a spec other than the one that ran (json-keys-impl.h). */
static int repeated_key(void *ud, const char *path, const char *key)
{
    char field[320];
    snprintf(field, sizeof field, "%s%s%s", path, *path ? "." : "", key);
    kd_spec_problem(ud, field, "duplicate key '%s' in %s", key, *path ? path : "the job spec");
    return 0;
}

/* Submission: the device opens here (then closes: the run opens its own), so a device this
 * server does not have ("cuda:9") is a 400 rather than a job that fails when it starts. */
static void check_device(struct kd_spec_problems *p, const char *spec)
{
    kiln_device *dev = kiln_device_open(spec);
    if (!dev)
        kd_spec_problem(p, "device", "'%s' cannot be opened on this server: %s", spec, kiln_error());
    else
        kiln_device_close(dev);
}

/* Submission: the model built on the ref device as the run builds it (trainer-run.c), one item
 * of the data's shape through it where that shape is known, and the optimizer and scheduler made
 * over its parameters, so that what only the engine knows (an unknown layer, a Linear of the
 * wrong width, a setting the optimizer refuses) is a 400 now, with the engine's message. */
static void check_model(struct kd_spec_problems *p, const struct kd_jobspec *s)
{
    kiln_device *dev = kiln_device_open("ref");
    kiln_generator gen = kiln_generator_make(0);
    char why[400] = "";
    kiln_module *m = NULL;
    if (!dev)
        snprintf(why, sizeof why, "%s", kiln_error());
    else if (s->model_onnx)
        m = kd_trainer_onnx_module(s->model_onnx, dev, why, sizeof why);
    else
        m = kiln_model_from_json(s->model_json, dev, &gen);
    if (!m) {
        kd_spec_problem(p, "model", "does not build: %s", s->model_json ? kiln_error() : why);
    } else {
        struct kd_trainer_items items;
        kd_trainer_probe_items(s, &items);
        if (items.problem[0])
            kd_spec_problem(p, items.problem_field, "%s", items.problem);
        else if (items.ndim > 0 && kd_trainer_output_width(m, dev, &items, why, sizeof why) < 0)
            kd_spec_problem(p, "model", "%s", why);
        kiln_optim *opt = kiln_optim_create_module(&s->optim, m);
        if (!opt)
            kd_spec_problem(p, "optimizer", "%s", kiln_error());
        kiln_sched_config sc = s->sched;
        if (sc.kind == KILN_SCHED_COSINE && sc.t_max <= 0)
            sc.t_max = 1; /* the whole run, which the run knows */
        kiln_sched *sched = opt && s->has_sched ? kiln_sched_create(&sc, opt) : NULL;
        if (opt && s->has_sched && !sched)
            kd_spec_problem(p, "scheduler", "%s", kiln_error());
        kiln_sched_free(sched);
        kiln_optim_free(opt);
    }
    kiln_module_free(m);
    if (dev)
        kiln_device_close(dev);
}

/* ---- the device ---------------------------------------------------------------------------- */

static _Atomic(struct kd_sched *) configured_devices;

void kd_jobspec_set_devices(struct kd_sched *sched)
{
    atomic_store(&configured_devices, sched);
}

struct device_match {
    const char *want;  /* the spec's device, or NULL for the first configured */
    const char *found; /* the configured spec it names */
    char listed[512];  /* every configured device, secrets masked */
    size_t used;
};

static void match_device(void *ctx, const char *spec, kiln_device *dev)
{
    struct device_match *m = ctx;
    if (!m->found && (!m->want || strcmp(spec, m->want) == 0 || strcmp(kiln_device_name(dev), m->want) == 0))
        m->found = spec;
    char shown[200];
    kiln_device_spec_redact(spec, shown, sizeof shown);
    int n = snprintf(m->listed + m->used, sizeof m->listed - m->used, "%s%s", m->used ? ", " : "", shown);
    if (n > 0)
        m->used = m->used + (size_t)n < sizeof m->listed ? m->used + (size_t)n : sizeof m->listed - 1;
}

/* A job trains on one of the devices kilnd drives, and says so in the configured spelling:
 * serving then finds the registered model's device among its workers, and a device kilnd was
 * not told to use is a 400 at submission rather than a job that trains and then cannot serve.
 * The workers' devices are fixed once the scheduler runs, so reading them from the training
 * thread is as safe as from the loop. */
static void parse_device(struct kd_spec_problems *p, const cJSON *root, struct kd_jobspec *s)
{
    char *want = kd_spec_string(p, root, "device", "device", false);
    struct kd_sched *sched = atomic_load(&configured_devices);
    if (!sched) {
        s->device = want ? want : kd_spec_get(root, "device") ? NULL : strdup("cpu");
        return;
    }
    if (!want && kd_spec_get(root, "device"))
        return; /* not a string: said already */
    struct device_match m = {.want = want};
    kd_sched_each_device(sched, match_device, &m);
    if (m.found) {
        s->device = strdup(m.found);
    } else {
        char shown[200];
        kd_spec_problem(p, "device", "'%s' is not one of the devices kilnd drives (%s: the devices setting)",
                        kiln_device_spec_redact(want ? want : "", shown, sizeof shown),
                        m.used ? m.listed : "none");
    }
    free(want);
}

/* A model name, or what is wrong with it. */
static void name_problem(struct kd_spec_problems *p, const char *field, const cJSON *v)
{
    if (cJSON_IsString(v) && strlen(v->valuestring) > KD_MODEL_NAME_MAX)
        kd_spec_problem(p, field, "is %zu characters long; a model name has at most %d", strlen(v->valuestring),
                        KD_MODEL_NAME_MAX);
    else
        kd_spec_problem(
            p, field, "must be a model name: 1 to %d characters of [A-Za-z0-9_.-], without a leading dot or '..'",
            KD_MODEL_NAME_MAX);
}

/* Resolve path and require it under one of the roots; returns the real path (malloc'd). */
static char *confined_path(struct kd_spec_problems *p, const char *field, const char *path,
                           const struct kd_jobspec_env *env, bool want_dir)
{
    if (!path)
        return NULL;
    char *real = realpath(path, NULL);
    if (!real) {
        kd_spec_problem(p, field, "%s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (stat(real, &st) != 0 || (want_dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode))) {
        kd_spec_problem(p, field, "%s is not a %s", path, want_dir ? "folder" : "regular file");
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
    kd_spec_problem(p, field, "%s is outside the data roots kilnd allows (config jobs.data_roots)", path);
    free(real);
    return NULL;
}

static char *path_in(const char *dir, const char *file)
{
    size_t n = strlen(dir) + strlen(file) + 2;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s/%s", dir, file);
    return s;
}

/* {"repository": name, "version": N}: a version of a served model is the starting point. */
static void parse_base_model(struct kd_spec_problems *p, const cJSON *m, const struct kd_jobspec_env *env,
                             struct kd_jobspec *s)
{
    static const char *const keys[] = {"repository", "version", NULL};
    kd_spec_unknown_keys(p, m, "model.", keys);
    const cJSON *name = kd_spec_get(m, "repository");
    int64_t want = 0;
    kd_spec_integer(p, m, "version", "model.version", 1, INT64_MAX / 2, &want);
    if (!cJSON_IsString(name) || !kd_repository_name_valid(name->valuestring)) {
        name_problem(p, "model.repository", name);
        return;
    }
    kd_repository *repo = env->models_root ? kd_repository_open(env->models_root) : NULL;
    const kd_model_info *info = repo ? kd_repository_find(repo, name->valuestring) : NULL;
    const kd_model_version *v = NULL;
    for (int i = 0; info && i < info->nversions; i++)
        if (info->versions[i].valid && (want ? info->versions[i].version == want : true))
            v = &info->versions[i]; /* ascending: the last valid one is the newest */
    if (!info)
        kd_spec_problem(p, "model.repository", "no model '%s' in the repository", name->valuestring);
    else if (!v && want)
        kd_spec_problem(p, "model.version", "'%s' has no valid version %lld", name->valuestring, (long long)want);
    else if (!v)
        kd_spec_problem(p, "model.repository", "'%s' has no valid version", name->valuestring);
    if (v) {
        s->base_model = strdup(name->valuestring);
        s->base_version = v->version;
        if (strcmp(v->format, "onnx") == 0) {
            s->model_onnx = path_in(v->path, "model.onnx");
            char why[128];
            if (s->model_onnx && kd_trainer_onnx_check(s->model_onnx, why, sizeof why) != 0)
                kd_spec_problem(p, "model.repository", "%s version %lld: model.onnx %s", name->valuestring,
                                (long long)v->version, why);
        } else {
            /* A kiln version's record carries the model's JSON spec as its config. */
            s->init_weights = path_in(v->path, "model.kiln");
            kiln_record *rec = s->init_weights ? kiln_record_open(s->init_weights) : NULL;
            const char *spec = rec ? kiln_record_config(rec) : NULL;
            if (!spec || !*spec)
                kd_spec_problem(p, "model.repository", "%s version %lld: model.kiln holds no model spec: %s",
                                name->valuestring, (long long)v->version, rec ? "empty config" : kiln_error());
            else
                s->model_json = strdup(spec);
            kiln_record_close(rec);
        }
    }
    kd_repository_close(repo);
}

static void parse_model(struct kd_spec_problems *p, const cJSON *root, const struct kd_jobspec_env *env,
                        struct kd_jobspec *s)
{
    const cJSON *m = kd_spec_get(root, "model");
    if (!m) {
        kd_spec_problem(p, "model",
                        "is required (a JSON graph spec, \"fashion_mlp\" / \"fashion_cnn\", {\"onnx\": path} "
                        "or {\"repository\": name})");
        return;
    }
    if (cJSON_IsObject(m) && kd_spec_get(m, "onnx")) {
        static const char *const keys[] = {"onnx", NULL};
        kd_spec_unknown_keys(p, m, "model.", keys);
        char *raw = kd_spec_string(p, m, "onnx", "model.onnx", true);
        s->model_onnx = confined_path(p, "model.onnx", raw, env, false);
        char why[128];
        if (s->model_onnx && kd_trainer_onnx_check(s->model_onnx, why, sizeof why) != 0)
            kd_spec_problem(p, "model.onnx", "%s %s", raw, why);
        free(raw);
        return;
    }
    if (cJSON_IsObject(m) && kd_spec_get(m, "repository")) {
        parse_base_model(p, m, env, s);
        return;
    }
    if (cJSON_IsString(m)) {
        if (strcmp(m->valuestring, "fashion_mlp") == 0)
            s->model_json = strdup(FASHION_MLP);
        else if (strcmp(m->valuestring, "fashion_cnn") == 0)
            s->model_json = strdup(FASHION_CNN);
        else
            kd_spec_problem(p, "model", "unknown built-in model '%s' (known: fashion_mlp, fashion_cnn)",
                            m->valuestring);
        return;
    }
    if (!cJSON_IsObject(m)) {
        kd_spec_problem(p, "model", "must be a JSON graph spec object or a built-in model name");
        return;
    }
    const cJSON *in = kd_spec_get(m, "inputs"), *nodes = kd_spec_get(m, "nodes"), *out = kd_spec_get(m, "outputs");
    if (!cJSON_IsArray(in) || cJSON_GetArraySize(in) != 1 || !cJSON_IsString(cJSON_GetArrayItem(in, 0)))
        kd_spec_problem(p, "model.inputs", "must list exactly one input name");
    if (!cJSON_IsArray(nodes) || cJSON_GetArraySize(nodes) == 0)
        kd_spec_problem(p, "model.nodes", "must be a non-empty array");
    if (!cJSON_IsArray(out) || cJSON_GetArraySize(out) != 1 || !cJSON_IsString(cJSON_GetArrayItem(out, 0)))
        kd_spec_problem(p, "model.outputs", "must list exactly one output name (the class logits)");
    s->model_json = cJSON_PrintUnformatted(m);
}

static void parse_data(struct kd_spec_problems *p, const cJSON *root, const struct kd_jobspec_env *env,
                       struct kd_jobspec *s)
{
    const cJSON *d = kd_spec_get(root, "data");
    if (!cJSON_IsObject(d)) {
        kd_spec_problem(p, "data", d ? "must be an object" : "is required");
        return;
    }
    s->data_type = kd_spec_string(p, d, "type", "data.type", true);
    kd_spec_integer(p, d, "limit", "data.limit", 0, INT64_MAX / 2, &s->limit);
    kd_spec_integer(p, d, "valid_limit", "data.valid_limit", 0, INT64_MAX / 2, &s->valid_limit);
    kd_spec_number(p, d, "valid_split", "data.valid_split", 0, 0.9, &s->valid_split);
    if (!s->data_type)
        return;
    if (strcmp(s->data_type, "fashion_mnist") == 0) {
        static const char *const keys[] = {"type", "path", "normalize", "limit", "valid_limit", "valid_split", NULL};
        kd_spec_unknown_keys(p, d, "data.", keys);
        char *dir = kd_spec_string(p, d, "path", "data.path", false);
        s->train_a = confined_path(p, "data.path", dir ? dir : FASHION_DIR, env, true);
        free(dir);
        s->normalize = true;
        kd_spec_boolean(p, d, "normalize", "data.normalize", &s->normalize);
    } else if (strcmp(s->data_type, "idx") == 0) {
        static const char *const keys[] = {"type", "train_images", "train_labels", "valid_images", "valid_labels",
                                           "limit", "valid_limit", "valid_split", NULL};
        kd_spec_unknown_keys(p, d, "data.", keys);
        const char *names[4] = {"train_images", "train_labels", "valid_images", "valid_labels"};
        char **dst[4] = {&s->train_a, &s->train_b, &s->valid_a, &s->valid_b};
        for (int i = 0; i < 4; i++) {
            char field[64];
            snprintf(field, sizeof field, "data.%s", names[i]);
            char *raw = kd_spec_string(p, d, names[i], field, i < 2);
            *dst[i] = confined_path(p, field, raw, env, false);
            free(raw);
        }
        if (!s->valid_a != !s->valid_b)
            kd_spec_problem(p, "data.valid_images", "valid_images and valid_labels go together");
    } else if (strcmp(s->data_type, "csv") == 0) {
        static const char *const keys[] = {"type", "train", "valid", "label_column", "limit", "valid_limit",
                                           "valid_split", NULL};
        kd_spec_unknown_keys(p, d, "data.", keys);
        char *raw = kd_spec_string(p, d, "train", "data.train", true);
        s->train_a = confined_path(p, "data.train", raw, env, false);
        free(raw);
        raw = kd_spec_string(p, d, "valid", "data.valid", false);
        s->valid_a = confined_path(p, "data.valid", raw, env, false);
        free(raw);
        s->label_column = kd_spec_string(p, d, "label_column", "data.label_column", false);
        if (!s->label_column && !kd_spec_get(d, "label_column"))
            s->label_column = strdup("label");
    } else {
        kd_spec_problem(p, "data.type", "unknown type '%s' (known: fashion_mnist, idx, csv)", s->data_type);
    }
    if (s->valid_split > 0 && (s->valid_a || strcmp(s->data_type, "fashion_mnist") == 0))
        kd_spec_problem(p, "data.valid_split", "a split needs a data set without its own validation set");
}

int kd_jobspec_parse(const char *json, const struct kd_jobspec_env *env, struct kd_jobspec *s, char *buf,
                     size_t len)
{
    memset(s, 0, sizeof *s);
    struct kd_spec_problems p = {buf, len, 0, 0};
    if (len)
        buf[0] = '\0';
    /* JSON text is UTF-8, and a problem quoting other bytes would make the 400's own body
     * invalid JSON (common/utf8.h) */
    long bad = kiln_utf8_invalid_at((const unsigned char *)json, strlen(json));
    if (bad >= 0) {
        kd_spec_problem(&p, "body", "is not valid UTF-8 (byte %ld); JSON text must be UTF-8", bad);
        return -1;
    }
    /* the whole body: text after the object is an error too, at the byte where it starts */
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(json, &end, true);
    if (!root) {
        kd_spec_problem(&p, "body", "is not valid JSON (at byte %ld)",
                        end && end >= json ? (long)(end - json) : 0L);
        return -1;
    }
    long nul = kiln__json_nul_escape_at(json, strlen(json));
    if (nul >= 0) { /* a path would read as its part before the NUL */
        kd_spec_problem(&p, "body", "holds \\u0000 (a NUL character) in a string at byte %ld; no field may", nul);
        cJSON_Delete(root);
        return -1;
    }
    if (!cJSON_IsObject(root)) {
        kd_spec_problem(&p, "body", "must be a JSON object");
        cJSON_Delete(root);
        return -1;
    }
    if (env && env->submit) {
        /* the rest would read the first of a repeated key: nothing more is said until it is one */
        if (kiln__json_repeated_keys(root, repeated_key, &p) < 0)
            kd_spec_problem(&p, "body", "out of memory checking its keys");
        if (p.count) {
            cJSON_Delete(root);
            return -1;
        }
    }
    static const char *const keys[] = {"model", "data", "loss", "optimizer", "scheduler", "epochs", "batch_size",
                                       "device", "seed", "workers", "metrics", "checkpoint", "early_stopping",
                                       "register_as", "max_batch_size", "resume_from_job", NULL};
    kd_spec_unknown_keys(&p, root, "", keys);
    parse_model(&p, root, env, s);
    parse_data(&p, root, env, s);
    kd_spec_parse_loss(&p, root, s);
    kd_spec_parse_optimizer(&p, root, s);
    kd_spec_parse_scheduler(&p, root, s);
    kd_spec_parse_checkpoint(&p, root, s);
    kd_spec_parse_early_stopping(&p, root, s);
    s->epochs = 1;
    s->batch_size = 64;
    kd_spec_integer(&p, root, "epochs", "epochs", 1, 100000, &s->epochs);
    kd_spec_integer(&p, root, "batch_size", "batch_size", 1, 1 << 20, &s->batch_size);
    int64_t seed = 0, workers = 0, mbs = 64;
    kd_spec_integer(&p, root, "seed", "seed", 0, INT64_MAX, &seed);
    kd_spec_integer(&p, root, "workers", "workers", 0, 64, &workers);
    kd_spec_integer(&p, root, "max_batch_size", "max_batch_size", 0, 4096, &mbs);
    kd_spec_integer(&p, root, "resume_from_job", "resume_from_job", 1, INT64_MAX / 2, &s->resume_from_job);
    s->seed = (uint64_t)seed;
    s->workers = (int)workers;
    s->max_batch_size = (int)mbs;
    parse_device(&p, root, s);
    char why[400];
    /* a queued job whose device was lost since fails naming it, not by an op on the dead handle */
    if (env && !env->submit && s->device &&
        kd_sched_device_lost(atomic_load(&configured_devices), s->device, why, sizeof why))
        kd_spec_problem(&p, "device", "the device was lost after the job was queued (%s)", why);
    if (env && env->resumable && s->resume_from_job > 0 &&
        env->resumable(env->resumable_ud, s->resume_from_job, why, sizeof why) != 0)
        kd_spec_problem(&p, "resume_from_job", "%s", why);
    const cJSON *metrics = kd_spec_get(root, "metrics");
    if (metrics && !cJSON_IsArray(metrics))
        kd_spec_problem(&p, "metrics", "must be an array of metric names");
    for (const cJSON *m = metrics ? metrics->child : NULL; m; m = m->next) {
        /* The Learner computes all of them anyway; the list only guards against typos, and
         * "accuracy" / "loss" are accepted as the short names people write. */
        if (!cJSON_IsString(m) || (!kd_spec_known_metric(m->valuestring) && strcmp(m->valuestring, "accuracy") &&
                                   strcmp(m->valuestring, "loss")))
            kd_spec_problem(&p, "metrics", "unknown metric %s",
                            cJSON_IsString(m) ? m->valuestring : "(not a string)");
    }
    const cJSON *reg = kd_spec_get(root, "register_as");
    if (reg) {
        if (!cJSON_IsString(reg) || !kd_repository_name_valid(reg->valuestring))
            name_problem(&p, "register_as", reg);
        else
            s->register_as = strdup(reg->valuestring);
    }
    cJSON_Delete(root);
    if (p.count) {
        kd_jobspec_free(s);
        return -1;
    }
    return 0;
}

int kd_jobspec_check_runnable(const struct kd_jobspec *s, char *problems, size_t len)
{
    struct kd_spec_problems p = {problems, len, 0, 0};
    if (len)
        problems[0] = '\0';
    if (s->model_json || s->model_onnx)
        check_model(&p, s);
    if (s->device)
        check_device(&p, s->device);
    return p.count ? -1 : 0;
}

void kd_jobspec_free(struct kd_jobspec *s)
{
    char *const strs[] = {s->model_json, s->model_onnx, s->init_weights, s->base_model, s->data_type, s->train_a, s->train_b, s->valid_a, s->valid_b,
                          s->label_column, s->device, s->best_metric, s->early_metric, s->register_as};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
        free(strs[i]);
    memset(s, 0, sizeof *s);
}
