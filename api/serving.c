/*
 * api/serving.c — the served-model table, with bearer-token scopes, request ids and per-model
 * metrics; the KServe v2 model, repository and statistics routes over it are in
 * serving-routes.c, and gRPC uses the same table through serving.h.
 *
 * A model name maps to the versions currently loaded, each a scheduler model reference. Loading
 * (at start, or POST .../load) rescans the repository and builds every served version on its
 * device's worker; only when all have finished is the table entry swapped, and the replaced
 * versions are released — requests already holding them run to the end. Inference checks the
 * body on the loop (serving-routes.c) and queues it; the worker that runs it first converts its
 * tensor data (infer_prepare: number parsing costs more than the rest of a small request, and the
 * loop is a single thread) and afterwards encodes the response body (infer_finish); the loop
 * sends it when the worker's completion arrives.
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "auth.h"
#include "http-conn.h"
#include "logf.h"
#include "responses.h"
#include "serving-impl.h"
#include "shm.h"

struct load_op;

/* One version's load, so that its failure can say which version it was. */
struct version_load {
    struct load_op *op;
    int64_t version;
};

struct load_op {
    struct kd_serving *sv;
    char name[KD_MODEL_NAME_MAX + 1];
    int64_t need_version;           /* fail unless this version is among those loaded (0: any) */
    kd_serving_load_done done;      /* NULL: nobody waits (the loads at start) */
    void *done_ud;
    uint64_t seq;                   /* the entry's loads_started when this one began */
    int remaining, n;
    struct kd_sched_model *got[MAX_VERSIONS];
    struct version_load started[MAX_VERSIONS];
    struct version_load hold; /* start_load's, dropped once every load has started */
    char why[768];            /* a device refusal lists the configured devices */
};

/* Up to a minute: a request may wait up to limits.infer_timeout_ms (10 s by default) and a large
 * model's run take longer; past the last bucket a quantile says nothing. Batches up to 4096 rows. */
static const double seconds_buckets[] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                         0.1,     0.25,   0.5,     1,      2.5,   5,      10,    30,   60};
static const double batch_buckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};

#define vlog(sv, level, ...) kd_api_logf((sv)->o.log, (sv)->o.log_ud, (level), __VA_ARGS__)

/* ---- metrics ------------------------------------------------------------------------------- */

/* The series of f for version m (labels model and version), and extra's value when f has a
 * third label. Versions are labelled apart, as Triton labels them: a canary's errors and latency
 * are then seen beside the version it replaces. */
static struct kd_metric_series *series(struct kd_metric_family *f, const struct kd_sched_model *m,
                                       const char *extra)
{
    char version[24];
    snprintf(version, sizeof version, "%lld", (long long)kd_sched_model_version(m));
    return f ? kd_metrics_series(f, (const char *const[]){kd_sched_model_name(m), version, extra, NULL}) : NULL;
}

/* A loaded version's series, at 0 until something happens: a rate over a series that appears
 * with its first event misses that event, and an alert on one reads "no data" until then. */
static void open_series(struct kd_serving *sv, const struct kd_sched_model *m)
{
    static const char *const outcomes[] = {"success", "failed",    "rejected", "overloaded",
                                           "timeout", "cancelled", "shutdown"};
    for (size_t i = 0; i < sizeof outcomes / sizeof outcomes[0]; i++)
        series(sv->f_requests, m, outcomes[i]);
    series(sv->f_queue, m, NULL);
    series(sv->f_compute, m, NULL);
    series(sv->f_batch, m, NULL);
    series(sv->f_depth, m, NULL);
    series(sv->f_inflight, m, NULL);
}

void kd_serving_count_outcome(struct kd_serving *sv, const struct kd_sched_model *m, const char *outcome)
{
    struct kd_metric_series *s = series(sv->f_requests, m, outcome);
    if (s)
        kd_metric_add(s, 1);
}

/* The training gate's totals (scheduler.h), sampled when /metrics renders. */
static double training_stat(struct kd_serving *sv, int which)
{
    struct kd_sched_training_stats t;
    kd_sched_training_stats(sv->o.sched, &t);
    return which == 0 ? (double)t.yields : which == 1 ? (double)t.wait_ns / 1e9 : which == 2 ? (double)t.forced
                                                                                               : (double)t.steps;
}
static double training_yields(void *ctx) { return training_stat(ctx, 0); }
static double training_wait(void *ctx) { return training_stat(ctx, 1); }
static double training_forced(void *ctx) { return training_stat(ctx, 2); }
static double training_steps(void *ctx) { return training_stat(ctx, 3); }

static int register_training_metrics(struct kd_serving *sv)
{
    struct kd_metrics *m = sv->o.metrics;
    int rc = kd_metrics_counter_fn(m, "kiln_training_steps_total",
                                   "Training steps that went through the device's training gate.", training_steps,
                                   sv);
    rc |= kd_metrics_counter_fn(
        m, "kiln_training_yields_total",
        "Training steps that waited because inference was queued or running on the device.", training_yields, sv);
    rc |= kd_metrics_counter_fn(
        m, "kiln_training_forced_steps_total",
        "Training steps that ran with inference still pending, after training.max_wait_ms.", training_forced, sv);
    rc |= kd_metrics_counter_fn(m, "kiln_training_wait_seconds_total",
                                "Time training steps spent waiting for inference to drain.", training_wait, sv);
    return rc;
}

static int register_metrics(struct kd_serving *sv)
{
    struct kd_metrics *m = sv->o.metrics;
    const char *const model[] = {"model", "version", NULL};
    sv->f_requests = kd_metrics_family(m, "kiln_inference_requests_total",
                                       "Inference requests by model version and outcome (success, failed, "
                                       "rejected: refused as bad input, overloaded: refused because the queue "
                                       "was full, timeout, cancelled, shutdown).",
                                       KD_METRIC_COUNTER,
                                       (const char *const[]){"model", "version", "outcome", NULL}, NULL, 0);
    sv->f_queue = kd_metrics_family(m, "kiln_inference_queue_seconds",
                                    "Time requests waited in the model's queue.", KD_METRIC_HISTOGRAM, model,
                                    seconds_buckets, sizeof seconds_buckets / sizeof seconds_buckets[0]);
    sv->f_compute = kd_metrics_family(m, "kiln_inference_compute_seconds",
                                      "Time the run a request was part of took.", KD_METRIC_HISTOGRAM, model,
                                      seconds_buckets, sizeof seconds_buckets / sizeof seconds_buckets[0]);
    sv->f_batch = kd_metrics_family(m, "kiln_inference_batch_size", "Rows in the run each request was part of.",
                                    KD_METRIC_HISTOGRAM, model, batch_buckets,
                                    sizeof batch_buckets / sizeof batch_buckets[0]);
    sv->f_depth = kd_metrics_family(m, "kiln_inference_queue_depth", "Requests waiting in a model's queue.",
                                    KD_METRIC_GAUGE, model, NULL, 0);
    sv->f_inflight = kd_metrics_family(m, "kiln_inference_in_flight",
                                       "Inference requests accepted and not yet answered.", KD_METRIC_GAUGE, model,
                                       NULL, 0);
    if (!sv->f_requests || !sv->f_queue || !sv->f_compute || !sv->f_batch || !sv->f_depth || !sv->f_inflight)
        return -1;
    return register_training_metrics(sv);
}

static void add_in_flight(struct kd_serving *sv, struct kd_sched_model *m, double delta)
{
    struct kd_metric_series *f = series(sv->f_inflight, m, NULL);
    if (f)
        kd_metric_add(f, delta);
}

void kd_serving_sample_gauges(struct kd_serving *sv)
{
    for (const struct kd_serving_entry *e = sv->entries; e; e = e->next)
        for (int i = 0; i < e->nv; i++) {
            struct kd_metric_series *d = series(sv->f_depth, e->v[i], NULL);
            if (d)
                kd_metric_set(d, (double)kd_sched_model_queued(e->v[i]));
        }
}

/* ---- auth ---------------------------------------------------------------------------------- */

/* 0 when allowed; otherwise the 401/403 response is appended and its status returned. */
int kd_serving_authorize(struct kd_serving *sv, const struct kd_request *req, enum kd_auth_scope need,
                         struct kd_buf *out)
{
    return kd_auth_require(sv->auth, req, need, "this token lacks the admin scope", out);
}

/* ---- request ids -------------------------------------------------------------------------- */

void kd_serving_request_id(struct kd_serving *sv, const struct kd_request *req, char *out, size_t n)
{
    const char *given = req->headers ? req->headers->request_id : "";
    bool ok = given[0] != '\0';
    for (const char *p = given; *p && ok; p++)
        ok = isalnum((unsigned char)*p) || strchr("-_.:", *p);
    if (ok)
        snprintf(out, n, "%s", given);
    else
        snprintf(out, n, "kiln-%d-%llu", sv->pid, (unsigned long long)++sv->next_id);
}

int kd_serving_error_with_id(struct kd_buf *out, int status, const char *msg, bool keep_alive, const char *rid,
                             const char *more)
{
    char hdr[512];
    snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\n%s", rid, more ? more : "");
    return kd_resp_error(out, status, msg, keep_alive, hdr);
}

/* ---- the model table ----------------------------------------------------------------------- */

struct kd_serving_entry *kd_serving_find_entry(struct kd_serving *sv, const char *name)
{
    for (struct kd_serving_entry *e = sv->entries; e; e = e->next)
        if (strcmp(e->name, name) == 0)
            return e;
    return NULL;
}

static struct kd_serving_entry *get_entry(struct kd_serving *sv, const char *name)
{
    struct kd_serving_entry *e = kd_serving_find_entry(sv, name);
    if (e)
        return e;
    e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    snprintf(e->name, sizeof e->name, "%s", name);
    e->next = sv->entries;
    sv->entries = e;
    return e;
}

static void drop_versions(struct kd_serving_entry *e)
{
    for (int i = 0; i < e->nv; i++)
        kd_sched_model_release(e->v[i]);
    e->nv = 0;
}

static void load_answer(struct load_op *op, int status, const char *msg)
{
    if (op->done)
        op->done(op->done_ud, status, msg);
}

/* Whether the versions loaded include the one the caller needs served. */
static bool has_needed_version(const struct load_op *op)
{
    for (int i = 0; i < op->n; i++)
        if (kd_sched_model_version(op->got[i]) == op->need_version)
            return true;
    return op->need_version == 0;
}

/* Each version's load ends here, and start_load's hold once every load has started. */
static void version_loaded(void *ud, struct kd_sched_model *m, const char *why)
{
    struct version_load *vl = ud;
    struct load_op *op = vl->op;
    if (m) {
        kd_serving_warn_batching_delay(op->sv, m);
        /* Keep ascending order by version. */
        int i = op->n++;
        while (i > 0 && kd_sched_model_version(op->got[i - 1]) > kd_sched_model_version(m)) {
            op->got[i] = op->got[i - 1];
            i--;
        }
        op->got[i] = m;
    } else if (why && !op->why[0]) {
        snprintf(op->why, sizeof op->why, "version %lld: %s", (long long)vl->version, why);
    }
    if (--op->remaining > 0)
        return;
    struct kd_serving *sv = op->sv;
    if (!op->why[0] && !has_needed_version(op))
        snprintf(op->why, sizeof op->why, "version %lld is not among the versions its version policy serves",
                 (long long)op->need_version);
    struct kd_serving_entry *e = get_entry(sv, op->name);
    if (!e || op->why[0]) {
        for (int i = 0; i < op->n; i++)
            kd_sched_model_release(op->got[i]);
        if (e) {
            e->loading = false;
            snprintf(e->why, sizeof e->why, "%s", op->why[0] ? op->why : "out of memory");
        }
        vlog(sv, KD_LOG_WARN, "model %s failed to load: %s", op->name, op->why);
        load_answer(op, 400, op->why[0] ? op->why : "out of memory");
    } else if (op->seq < e->newest_applied) {
        for (int i = 0; i < op->n; i++)
            kd_sched_model_release(op->got[i]);
        load_answer(op, 200, NULL); /* a newer load's swap already holds what the repository has */
    } else {
        e->newest_applied = op->seq;
        /* a version served before and after the reload keeps its statistics */
        for (int i = 0; i < op->n; i++)
            for (int k = 0; k < e->nv; k++)
                if (kd_sched_model_version(e->v[k]) == kd_sched_model_version(op->got[i]))
                    kd_sched_model_carry_stats(op->got[i], e->v[k]);
        drop_versions(e); /* requests holding the old versions keep them alive */
        for (int i = 0; i < op->n; i++) {
            e->v[i] = op->got[i];
            open_series(sv, op->got[i]);
        }
        e->nv = op->n;
        e->loading = false;
        e->why[0] = '\0';
        vlog(sv, KD_LOG_INFO, "model %s loaded (%d version%s)", op->name, op->n, op->n == 1 ? "" : "s");
        load_answer(op, 200, NULL);
    }
    free(op);
}

/* Starts loading every served version of name (see kd_serving_load). 0, or an HTTP status with
 * why filled and done never called. */
static int start_load(struct kd_serving *sv, const char *name, int64_t need_version, kd_serving_load_done done,
                      void *done_ud, char *why, size_t n)
{
    const kd_model_info *info = kd_repository_find(sv->repo, name);
    if (!info) {
        snprintf(why, n, "no model '%s' in the repository", name);
        return 404;
    }
    const kd_model_version *bad = kd_serving_selected_invalid(info);
    int selected = 0;
    for (int i = 0; i < info->nversions; i++)
        selected += info->versions[i].served;
    if (bad || !info->valid || selected > MAX_VERSIONS) {
        if (bad)
            snprintf(why, n, "model '%s' version %lld is not valid: %s", name, (long long)bad->version,
                     bad->why ? bad->why : "?");
        else if (!info->valid)
            snprintf(why, n, "model '%s' is not valid: %s", name, info->why ? info->why : "?");
        else /* refused whole: serving some of them would drop the newest without a word */
            snprintf(why, n,
                     "model '%s': its version policy selects %d versions, and kilnd serves at most %d of a model "
                     "at once; narrow it (\"latest\": {\"num_versions\": N} or \"specific\")",
                     name, selected, MAX_VERSIONS);
        struct kd_serving_entry *e = get_entry(sv, name);
        if (e)
            snprintf(e->why, sizeof e->why, "%s", why);
        return 400;
    }
    kd_serving_warn_unlisted_specific(sv, info);
    struct load_op *op = calloc(1, sizeof *op);
    struct kd_serving_entry *e = get_entry(sv, name);
    if (!op || !e) {
        free(op);
        snprintf(why, n, "out of memory");
        return 500;
    }
    op->sv = sv;
    op->seq = ++e->loads_started;
    op->need_version = need_version;
    op->done = done;
    op->done_ud = done_ud;
    snprintf(op->name, sizeof op->name, "%s", name);
    op->remaining = 1; /* held until every load is started, so completions cannot finish it early */
    op->hold.op = op;
    for (int i = 0, k = 0; i < info->nversions; i++) { /* at most MAX_VERSIONS are served, above */
        const kd_model_version *v = &info->versions[i];
        if (!v->served)
            continue;
        op->remaining++;
        op->started[k] = (struct version_load){op, v->version};
        int rc = kd_sched_model_load(sv->o.sched, name, v, version_loaded, &op->started[k++]);
        if (rc != 0) {
            op->remaining--;
            if (!op->why[0] && rc == -2)
                kd_serving_unknown_device(sv, name, v->version, v->config.device ? v->config.device : "cpu",
                                          op->why, sizeof op->why);
            else if (!op->why[0] && rc == -3)
                snprintf(op->why, sizeof op->why, "kilnd is shutting down");
            else if (!op->why[0])
                snprintf(op->why, sizeof op->why, "out of memory");
        }
    }
    e->loading = true;
    e->why[0] = '\0'; /* the last unload's or failure's reason no longer says why it is not ready */
    version_loaded(&op->hold, NULL, NULL); /* drop the hold; with nothing started this finishes now */
    return 0;
}

/* A load kd_serving_new started has finished: readiness waits for the last of them. */
static void startup_load_done(void *ud, int status, const char *why)
{
    (void)status, (void)why; /* a failed load is logged and shown in the index; it ends the wait too */
    struct kd_serving *sv = ud;
    if (--sv->startup_loads == 0 && sv->o.startup_done)
        sv->o.startup_done(sv->o.startup_ud);
}

struct kd_serving *kd_serving_new(const struct kd_serving_options *o, char *err, size_t errlen)
{
    struct kd_serving *sv = calloc(1, sizeof *sv);
    if (!sv) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    sv->o = *o;
    sv->accepting = true;
    sv->pid = (int)getpid();
    sv->auth = kd_auth_new(o->tokens, err, errlen);
    if (!sv->auth)
        goto fail;
    sv->shm = kd_shm_table_new();
    if (!sv->shm) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (register_metrics(sv) != 0) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    sv->repo = kd_repository_open(o->models_root);
    if (!sv->repo) {
        snprintf(err, errlen, "model repository %s: %s", o->models_root, kiln_error());
        kd_serving_free(sv);
        return NULL;
    }
    /* Held at 1 while loads start, so one that finishes at once cannot call startup_done here. */
    sv->startup_loads = 1;
    for (int i = 0; i < kd_repository_count(sv->repo); i++) {
        const kd_model_info *m = kd_repository_model(sv->repo, i);
        char why[256];
        sv->startup_loads++;
        if (start_load(sv, m->name, 0, startup_load_done, sv, why, sizeof why) != 0) {
            sv->startup_loads--; /* refused before starting: no completion will come */
            vlog(sv, KD_LOG_WARN, "model %s not loaded: %s", m->name, why);
        }
    }
    sv->startup_loads--;
    return sv;
fail:
    kd_serving_free(sv);
    return NULL;
}

int kd_serving_load(struct kd_serving *sv, const char *name, int64_t need_version, kd_serving_load_done done,
                    void *ud, char *why, size_t whylen)
{
    if (kd_repository_scan(sv->repo) != 0) {
        snprintf(why, whylen, "cannot read the model repository: %s", kiln_error());
        vlog(sv, KD_LOG_WARN, "model %s not loaded: %s", name, why);
        return 500;
    }
    int rc = start_load(sv, name, need_version, done, ud, why, whylen);
    /* refused before any version started (an invalid config, a policy past the limit): the
     * caller has the reason, and the log says it as it does for a model refused at start and
     * for a load that fails later; asking for a model the repository lacks is the caller's
     * mistake alone, said at info */
    if (rc != 0)
        vlog(sv, rc == 404 ? KD_LOG_INFO : KD_LOG_WARN, "model %s not loaded: %s", name, why);
    return rc;
}

void kd_serving_free(struct kd_serving *sv)
{
    if (!sv)
        return;
    for (struct kd_serving_entry *e = sv->entries, *next; e; e = next) {
        next = e->next;
        drop_versions(e);
        free(e);
    }
    kd_auth_free(sv->auth);
    kd_shm_table_free(sv->shm);
    kd_repository_close(sv->repo);
    free(sv);
}

int kd_serving_startup_loads(const struct kd_serving *sv)
{
    return sv->startup_loads;
}

void kd_serving_set_accepting(struct kd_serving *sv, bool accepting)
{
    sv->accepting = accepting;
}

/* ---- resolving a model path --------------------------------------------------------------- */

struct kd_sched_model *kd_serving_resolve(struct kd_serving *sv, const struct kd_serving_path *mp, int *status,
                                          bool *transient, char *msg, size_t n)
{
    if (transient)
        *transient = false;
    struct kd_serving_entry *e = kd_serving_find_entry(sv, mp->name);
    if (!e || (e->nv == 0 && !e->loading && !kd_repository_find(sv->repo, mp->name))) {
        snprintf(msg, n, "unknown model '%s'", mp->name);
        *status = 404;
        return NULL;
    }
    if (e->nv == 0) {
        /* a load's failure already names the model ("model 'h' is not valid: ..."): said once */
        char named[KD_MODEL_NAME_MAX + 16];
        snprintf(named, sizeof named, "model '%s' ", mp->name);
        bool says_name = strncmp(e->why, named, strlen(named)) == 0;
        if (e->loading)
            snprintf(msg, n, "model '%.128s' is not ready: it is loading", mp->name);
        else if (says_name)
            snprintf(msg, n, "%s; once that is fixed, POST /v2/repository/models/%s/load loads it", e->why,
                     mp->name);
        else
            snprintf(msg, n, "model '%.128s' is not ready%s%s; POST /v2/repository/models/%s/load loads it",
                     mp->name, e->why[0] ? ": " : "", e->why, mp->name);
        /* only a load under way ends by itself: Retry-After would have clients retry the others forever */
        if (transient)
            *transient = e->loading;
        *status = e->loading || e->why[0] ? 503 : 404;
        return NULL;
    }
    if (!mp->version)
        return e->v[e->nv - 1];
    for (int i = 0; i < e->nv; i++)
        if (kd_sched_model_version(e->v[i]) == mp->version)
            return e->v[i];
    snprintf(msg, n, "model '%s' has no loaded version %lld", mp->name, (long long)mp->version);
    *status = 404;
    return NULL;
}

void kd_serving_account_done(struct kd_serving *sv, const struct kd_sched_request *r, bool refused)
{
    struct kd_sched_model *m = r->model;
    sv->inflight_total--;
    add_in_flight(sv, m, -1);
    /* Data refused by the worker is what the loop used to refuse before queueing: "rejected". */
    kd_serving_count_outcome(sv, m, refused ? "rejected" : kd_sched_outcome_to_str(r->outcome));
    /* a failure that is not the request's data (memory ran out, the device or the model failed)
     * is the operator's to see: logged, where the client alone had heard of it; bad data is the
     * client's, counted only */
    if (!refused && r->outcome == KD_SCHED_FAILED && r->fault != KD_SCHED_FAULT_INPUT)
        vlog(sv, KD_LOG_WARN, "model %s version %lld: inference failed (%s): %s", kd_sched_model_name(m),
             (long long)kd_sched_model_version(m),
             r->fault == KD_SCHED_FAULT_INTERNAL ? "internal"
             : r->fault == KD_SCHED_FAULT_MEMORY ? "out of memory"
                                                 : "too large for the device",
             r->error);
    /* every request a worker took off the queue waited (a timed-out one longest): an autoscaler
     * reading the queue's time must see the waits of an overload too */
    if (r->started_ns) {
        struct kd_metric_series *q = series(sv->f_queue, m, NULL);
        if (q)
            kd_metric_observe(q, (double)(r->started_ns - r->enqueued_ns) / 1e9);
    }
    if (!refused && (r->outcome == KD_SCHED_OK || r->outcome == KD_SCHED_FAILED)) {
        struct kd_metric_series *c = series(sv->f_compute, m, NULL);
        struct kd_metric_series *b = series(sv->f_batch, m, NULL);
        if (c)
            kd_metric_observe(c, (double)(r->finished_ns - r->started_ns) / 1e9);
        if (b)
            kd_metric_observe(b, r->batch_size);
    }
}

int kd_serving_submit(struct kd_serving *sv, struct kd_sched_request *r)
{
    if (kd_sched_submit(sv->o.sched, r) != 0) {
        /* not "rejected" (the client's bad input): overload must be told apart from bad requests */
        kd_serving_count_outcome(sv, r->model, "overloaded");
        kd_sched_model_count_refused(r->model, 0);
        return -1;
    }
    sv->inflight_total++;
    add_in_flight(sv, r->model, 1);
    return 0;
}

void kd_serving_count_rejected(struct kd_serving *sv, struct kd_sched_model *m)
{
    kd_serving_count_outcome(sv, m, "rejected");
    kd_sched_model_count_refused(m, 0);
}

/* ---- the index ------------------------------------------------------------------------------ */

typedef void (*index_row_fn)(void *ud, const char *name, int64_t version, const char *state, const char *why);

/* A version still served after its folder left the repository (moved away or deleted): it answers,
 * so the index lists it as Triton lists every model it knows, but an unload is for good. */
static const char folder_gone[] = "served, but its folder is gone from the model repository: once unloaded it "
                                  "cannot be loaded again";

/* One loaded version: READY, or UNAVAILABLE on a device that was lost (a GPU fault). */
static void loaded_row(const struct kd_serving_entry *e, const struct kd_sched_model *m, bool in_repository,
                       bool only_ready, index_row_fn row, void *ud)
{
    char lost_why[320];
    bool lost = kd_sched_model_lost(m, lost_why, sizeof lost_why) != 0;
    if (only_ready && lost)
        return;
    const char *why = in_repository ? "" : folder_gone;
    row(ud, e->name, kd_sched_model_version(m), lost ? "UNAVAILABLE" : "READY", lost ? lost_why : why);
}

/* A version folder of the repository, loaded as m (NULL: not loaded). */
static void folder_row(const kd_model_info *info, const kd_model_version *v, const struct kd_serving_entry *e,
                       const struct kd_sched_model *m, bool only_ready, index_row_fn row, void *ud)
{
    if (m) {
        loaded_row(e, m, true, only_ready, row, ud);
        return;
    }
    if (only_ready)
        return;
    const char *why = v && !v->valid && v->why    ? v->why
                      : !info->valid && info->why ? info->why
                      : v && !v->served           ? "not selected by the version policy"
                      : e && e->loading           ? "loading"
                      : e && e->why[0]            ? e->why /* the last load's failure, for versions it chose */
                                                  : "not loaded";
    row(ud, info->name, v ? v->version : 0, e && e->loading ? "LOADING" : "UNAVAILABLE", why);
}

/* Every version of a repository model: its folders and, in version order among them, the loaded
 * versions whose folders are gone. A model with neither has one row of version 0. */
static void model_rows(struct kd_serving *sv, const kd_model_info *info, bool only_ready, index_row_fn row,
                       void *ud)
{
    const struct kd_serving_entry *e = kd_serving_find_entry(sv, info->name);
    int nloaded = e ? e->nv : 0;
    if (info->nversions == 0 && nloaded == 0) {
        folder_row(info, NULL, e, NULL, only_ready, row, ud);
        return;
    }
    for (int k = 0, j = 0; k < info->nversions || j < nloaded;) {
        int64_t in_folder = k < info->nversions ? info->versions[k].version : INT64_MAX;
        int64_t loaded = j < nloaded ? kd_sched_model_version(e->v[j]) : INT64_MAX;
        if (loaded < in_folder)
            loaded_row(e, e->v[j++], false, only_ready, row, ud);
        else
            folder_row(info, &info->versions[k++], e, loaded == in_folder ? e->v[j++] : NULL, only_ready, row, ud);
    }
}

/* The first model of the table in name order after `after` and before `before` (NULL: no bound)
 * that serves versions but has no folder in the repository any more. */
static const struct kd_serving_entry *next_gone(struct kd_serving *sv, const char *after, const char *before)
{
    const struct kd_serving_entry *first = NULL;
    for (const struct kd_serving_entry *e = sv->entries; e; e = e->next)
        if (e->nv > 0 && (!after || strcmp(e->name, after) > 0) && (!before || strcmp(e->name, before) < 0) &&
            (!first || strcmp(e->name, first->name) < 0) && !kd_repository_find(sv->repo, e->name))
            first = e;
    return first;
}

void kd_serving_index(struct kd_serving *sv, bool only_ready, index_row_fn row, void *ud)
{
    kd_repository_scan(sv->repo);
    /* the repository's models in name order, the ones whose folders are gone merged in */
    const char *last = NULL;
    for (int i = 0; i <= kd_repository_count(sv->repo); i++) {
        const kd_model_info *info = i < kd_repository_count(sv->repo) ? kd_repository_model(sv->repo, i) : NULL;
        for (const struct kd_serving_entry *e; (e = next_gone(sv, last, info ? info->name : NULL)); last = e->name)
            for (int j = 0; j < e->nv; j++)
                loaded_row(e, e->v[j], false, only_ready, row, ud);
        if (info) {
            model_rows(sv, info, only_ready, row, ud);
            last = info->name;
        }
    }
}

/* ---- for the other protocols (gRPC): the same table, rules and accounting ------------------ */

int kd_serving_unload(struct kd_serving *sv, const char *name, char *msg, size_t n)
{
    struct kd_serving_entry *e = kd_serving_find_entry(sv, name);
    if (!e || (e->nv == 0 && !e->loading)) {
        snprintf(msg, n, "model '%s' is not loaded", name);
        return 404;
    }
    drop_versions(e); /* in-flight requests keep their references until answered */
    snprintf(e->why, sizeof e->why, "unloaded");
    vlog(sv, KD_LOG_INFO, "model %s unloaded", name);
    return 0;
}

struct kd_sched_model *kd_serving_model(struct kd_serving *sv, const char *name, int64_t version, int *status,
                                        char *msg, size_t n)
{
    struct kd_serving_path mp = {.version = version, .action = ""};
    if (!kd_repository_name_valid(name)) {
        snprintf(msg, n, "invalid model name: a model name is " KD_MODEL_NAME_RULE);
        *status = 400;
        return NULL;
    }
    /* a valid name fits (at most KD_MODEL_NAME_MAX); a copy, not snprintf: this is every gRPC call */
    memcpy(mp.name, name, strlen(name) + 1);
    return kd_serving_resolve(sv, &mp, status, NULL, msg, n);
}

int kd_serving_versions(struct kd_serving *sv, const char *name, struct kd_sched_model **out, int max)
{
    struct kd_serving_entry *e = kd_serving_find_entry(sv, name);
    int k = 0;
    for (int i = 0; e && i < e->nv && k < max; i++)
        out[k++] = e->v[i];
    return k;
}

void kd_serving_each_loaded(struct kd_serving *sv, void (*each)(void *ud, struct kd_sched_model *m), void *ud)
{
    for (struct kd_serving_entry *e = sv->entries; e; e = e->next)
        for (int i = 0; i < e->nv; i++)
            each(ud, e->v[i]);
}

int64_t kd_serving_parse_version(const char *text)
{
    if (!text || !text[0])
        return 0;
    /* as the HTTP paths: ^[1-9][0-9]*$ within int64, never "01" read as 1 or a huge
     * number clamped to INT64_MAX */
    if (text[0] < '1' || text[0] > '9' || strspn(text, "0123456789") != strlen(text))
        return -1;
    errno = 0;
    long long v = strtoll(text, NULL, 10);
    return errno == ERANGE ? -1 : v;
}

bool kd_serving_accepting(const struct kd_serving *sv)
{
    return sv->accepting;
}

const struct kd_auth *kd_serving_auth(const struct kd_serving *sv)
{
    return sv->auth;
}

struct kd_shm_table *kd_serving_shm(struct kd_serving *sv)
{
    return sv->shm;
}

const struct kd_serving_options *kd_serving_limits(const struct kd_serving *sv)
{
    return &sv->o;
}
