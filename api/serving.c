/*
 * api/serving.c — the served-model table and the KServe v2 model, repository and statistics
 * endpoints, with bearer-token scopes and per-model metrics.
 *
 * A model name maps to the versions currently loaded, each a scheduler model reference. Loading
 * (at start, or POST .../load) rescans the repository and builds every served version on its
 * device's worker; only when all have finished is the table entry swapped, and the replaced
 * versions are released — requests already holding them run to the end. Inference checks the
 * body here, on the loop, and queues it; the worker that runs it first converts its tensor data
 * (infer_prepare: number parsing costs more than the rest of a small request, and the loop is a
 * single thread) and afterwards encodes the response body (infer_finish); the loop sends it when
 * the worker's completion arrives.
 */
#include <ctype.h>
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
#include "serving.h"

#define MAX_VERSIONS 16

struct entry {
    char name[KD_MODEL_NAME_MAX + 1];
    int nv;
    struct kd_sched_model *v[MAX_VERSIONS]; /* ascending versions */
    bool loading;
    /* Loads of one name may overlap (a job's and a POST .../load): the one started last wins, so
     * an older load finishing late never swaps back what a newer one put in. */
    uint64_t loads_started, newest_applied;
    char why[256];                              /* the last load's failure, for the index */
    struct entry *next;
};

struct kd_serving {
    struct kd_serving_options o;
    kd_repository *repo;
    struct entry *entries;
    bool accepting;
    uint64_t next_id;
    int pid;                        /* for generated request ids (getpid is a system call) */
    struct kd_auth *auth;
    struct kd_metric_family *f_requests, *f_queue, *f_compute, *f_batch, *f_depth, *f_inflight;
    double inflight_total;
};

struct infer_job {
    struct kd_sched_request r;
    struct kd_serving *sv;
    struct kd_http_pending *pending;
    char id[256];
    char req_id[KD_HTTP_SHORT_HEADER_MAX];
    bool want_output[KD_SCHED_MAX_IO], want_binary[KD_SCHED_MAX_IO];
    struct kd_infer_data data;      /* the inputs' filling, left to the worker */
    bool refused;                   /* the worker found the data bad: a 400, counted as rejected */
    struct kd_buf body;             /* the response body, encoded by the worker */
    size_t body_json_len;
    bool encoded;                   /* body is complete */
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
    char why[256];
};

/* POST .../load's deferred answer: the done callback of its kd_serving_load. */
struct load_reply {
    struct kd_http_pending *pending;
    char req_id[KD_HTTP_SHORT_HEADER_MAX];
};

static const double seconds_buckets[] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                         0.01,    0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5};
static const double batch_buckets[] = {1, 2, 4, 8, 16, 32, 64, 128};

#define vlog(sv, level, ...) kd_api_logf((sv)->o.log, (sv)->o.log_ud, (level), __VA_ARGS__)

/* ---- metrics ------------------------------------------------------------------------------- */

static struct kd_metric_series *series(struct kd_metric_family *f, const char *model, const char *extra)
{
    return f ? kd_metrics_series(f, (const char *const[]){model, extra, NULL}) : NULL;
}

static void count_outcome(struct kd_serving *sv, const char *model, const char *outcome)
{
    struct kd_metric_series *s = series(sv->f_requests, model, outcome);
    if (s)
        kd_metric_add(s, 1);
}

static double process_rss(void *ctx)
{
    (void)ctx;
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
            rss = 0;
        fclose(f);
    }
    return (double)rss * (double)sysconf(_SC_PAGESIZE);
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
    const char *const model[] = {"model", NULL};
    sv->f_requests = kd_metrics_family(m, "kiln_inference_requests_total",
                                       "Inference requests by model and outcome (success, failed, rejected, "
                                       "timeout, cancelled, shutdown).",
                                       KD_METRIC_COUNTER, (const char *const[]){"model", "outcome", NULL}, NULL,
                                       0);
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
    if (!sv->f_requests || !sv->f_queue || !sv->f_compute || !sv->f_batch || !sv->f_depth || !sv->f_inflight ||
        register_training_metrics(sv) != 0)
        return -1;
    return kd_metrics_gauge_fn(m, "kiln_process_resident_memory_bytes", "Resident set size of kilnd.", process_rss,
                               sv);
}

static void set_gauges(struct kd_serving *sv, struct kd_sched_model *m, double inflight_delta)
{
    const char *name = kd_sched_model_name(m);
    struct kd_metric_series *d = kd_metrics_series(sv->f_depth, (const char *const[]){name, NULL});
    struct kd_metric_series *f = kd_metrics_series(sv->f_inflight, (const char *const[]){name, NULL});
    if (d)
        kd_metric_set(d, (double)kd_sched_model_queued(m));
    if (f)
        kd_metric_add(f, inflight_delta);
}

/* ---- auth ---------------------------------------------------------------------------------- */

/* 0 when allowed; otherwise the 401/403 response is appended and its status returned. */
static int authorize(struct kd_serving *sv, const struct kd_request *req, enum kd_auth_scope need,
                     struct kd_buf *out)
{
    return kd_auth_require(sv->auth, req, need, "this token lacks the admin scope", out);
}

/* ---- request ids -------------------------------------------------------------------------- */

static void request_id(struct kd_serving *sv, const struct kd_request *req, char *out, size_t n)
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

static int error_with_id(struct kd_buf *out, int status, const char *msg, bool keep_alive, const char *rid,
                         const char *more)
{
    char hdr[512];
    snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\n%s", rid, more ? more : "");
    return kd_resp_error(out, status, msg, keep_alive, hdr);
}

/* ---- the model table ----------------------------------------------------------------------- */

static struct entry *find_entry(struct kd_serving *sv, const char *name)
{
    for (struct entry *e = sv->entries; e; e = e->next)
        if (strcmp(e->name, name) == 0)
            return e;
    return NULL;
}

static struct entry *get_entry(struct kd_serving *sv, const char *name)
{
    struct entry *e = find_entry(sv, name);
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

static void drop_versions(struct entry *e)
{
    for (int i = 0; i < e->nv; i++)
        kd_sched_model_release(e->v[i]);
    e->nv = 0;
}

static void load_reply_send(void *ud, int status, const char *msg)
{
    struct load_reply *r = ud;
    struct kd_buf *out = kd_http_pending_out(r->pending);
    bool ka = kd_http_pending_keep_alive(r->pending);
    int rc = status;
    if (out) {
        char hdr[256];
        snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\n", r->req_id);
        rc = status == 200 ? kd_resp_append(out, 200, "application/json", "{}", 2, ka, hdr)
                           : kd_resp_error(out, status, msg, ka, hdr);
    }
    kd_http_pending_finish(r->pending, rc);
    free(r);
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

static void version_loaded(void *ud, struct kd_sched_model *m, const char *why)
{
    struct load_op *op = ud;
    if (m) {
        /* Keep ascending order by version. */
        int i = op->n++;
        while (i > 0 && kd_sched_model_version(op->got[i - 1]) > kd_sched_model_version(m)) {
            op->got[i] = op->got[i - 1];
            i--;
        }
        op->got[i] = m;
    } else if (why && !op->why[0]) {
        snprintf(op->why, sizeof op->why, "%s", why);
    }
    if (--op->remaining > 0)
        return;
    struct kd_serving *sv = op->sv;
    if (!op->why[0] && !has_needed_version(op))
        snprintf(op->why, sizeof op->why, "version %lld is not among the versions its version policy serves",
                 (long long)op->need_version);
    struct entry *e = get_entry(sv, op->name);
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
        drop_versions(e); /* requests holding the old versions keep them alive */
        for (int i = 0; i < op->n; i++)
            e->v[i] = op->got[i];
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
    if (!info->valid) {
        snprintf(why, n, "model '%s' is not valid: %s", name, info->why ? info->why : "?");
        struct entry *e = get_entry(sv, name);
        if (e)
            snprintf(e->why, sizeof e->why, "%s", why);
        return 400;
    }
    struct load_op *op = calloc(1, sizeof *op);
    struct entry *e = get_entry(sv, name);
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
    for (int i = 0; i < info->nversions && op->remaining <= MAX_VERSIONS; i++) {
        const kd_model_version *v = &info->versions[i];
        if (!v->served)
            continue;
        op->remaining++;
        int rc = kd_sched_model_load(sv->o.sched, name, v, version_loaded, op);
        if (rc != 0) {
            op->remaining--;
            if (!op->why[0])
                snprintf(op->why, sizeof op->why, rc == -2 ? "device '%s' is not one of the configured devices"
                                                           : "out of memory (%s)",
                         v->config.device ? v->config.device : "cpu");
        }
    }
    e->loading = true;
    version_loaded(op, NULL, NULL); /* drop the hold; with nothing started this finishes now */
    return 0;
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
    for (int i = 0; i < kd_repository_count(sv->repo); i++) {
        const kd_model_info *m = kd_repository_model(sv->repo, i);
        char why[256];
        if (start_load(sv, m->name, 0, NULL, NULL, why, sizeof why) != 0)
            vlog(sv, KD_LOG_WARN, "model %s not loaded: %s", m->name, why);
    }
    return sv;
fail:
    kd_serving_free(sv);
    return NULL;
}

int kd_serving_load(struct kd_serving *sv, const char *name, int64_t need_version, kd_serving_load_done done,
                    void *ud, char *why, size_t whylen)
{
    if (kd_repository_scan(sv->repo) != 0) {
        snprintf(why, whylen, "cannot read the model repository");
        return 500;
    }
    return start_load(sv, name, need_version, done, ud, why, whylen);
}

void kd_serving_free(struct kd_serving *sv)
{
    if (!sv)
        return;
    for (struct entry *e = sv->entries, *next; e; e = next) {
        next = e->next;
        drop_versions(e);
        free(e);
    }
    kd_auth_free(sv->auth);
    kd_repository_close(sv->repo);
    free(sv);
}

void kd_serving_set_accepting(struct kd_serving *sv, bool accepting)
{
    sv->accepting = accepting;
}

/* ---- path parsing ------------------------------------------------------------------------- */

struct model_path {
    char name[KD_MODEL_NAME_MAX + 1];
    int64_t version;        /* 0: latest */
    const char *action;     /* "", "ready", "infer", "stats", "config" */
};

/* "/v2/models/<name>[/versions/<v>][/<action>]". 0, or an HTTP status with msg. */
static int parse_model_path(const struct kd_request *req, size_t prefix, struct model_path *mp, char *msg,
                            size_t n)
{
    char path[512];
    size_t len = req->path_len - prefix;
    if (len == 0 || len >= sizeof path) {
        snprintf(msg, n, "malformed model path");
        return len == 0 ? 404 : 414;
    }
    memcpy(path, req->path + prefix, len);
    path[len] = '\0';
    char *parts[5];
    int np = 0;
    for (char *save = NULL, *t = strtok_r(path, "/", &save); t; t = strtok_r(NULL, "/", &save)) {
        if (np == 4) {
            snprintf(msg, n, "malformed model path");
            return 404;
        }
        parts[np++] = t;
    }
    if (np == 0 || !kd_repository_name_valid(parts[0])) {
        snprintf(msg, n, "invalid model name");
        return 400;
    }
    snprintf(mp->name, sizeof mp->name, "%s", parts[0]);
    mp->version = 0;
    int k = 1;
    if (np >= 3 && strcmp(parts[1], "versions") == 0) {
        char *end;
        long long v = strtoll(parts[2], &end, 10);
        if (*end || v <= 0) {
            snprintf(msg, n, "invalid model version '%.32s'", parts[2]);
            return 400;
        }
        mp->version = v;
        k = 3;
    }
    static const char *const actions[] = {"ready", "infer", "stats", "config", "load", "unload"};
    mp->action = "";
    if (k + 2 == np && strcmp(parts[k], "trace") == 0 && strcmp(parts[k + 1], "setting") == 0) {
        snprintf(msg, n, "kilnd does not implement Triton's trace extension: per-request timings are in the "
                         "statistics extension and /metrics");
        return 501;
    }
    if (k < np) {
        mp->action = NULL;
        for (size_t i = 0; i < sizeof actions / sizeof actions[0]; i++)
            if (strcmp(parts[k], actions[i]) == 0)
                mp->action = actions[i];
        if (!mp->action || k + 1 != np) {
            snprintf(msg, n, "no route for this model path");
            return 404;
        }
    }
    return 0;
}

static struct kd_sched_model *resolve(struct kd_serving *sv, const struct model_path *mp, int *status, char *msg,
                                      size_t n)
{
    struct entry *e = find_entry(sv, mp->name);
    if (!e || (e->nv == 0 && !e->loading && !kd_repository_find(sv->repo, mp->name))) {
        snprintf(msg, n, "unknown model '%s'", mp->name);
        *status = 404;
        return NULL;
    }
    if (e->nv == 0) {
        snprintf(msg, n, "model '%.128s' is not ready%s%.160s", mp->name, e->why[0] ? ": " : "", e->why);
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

/* ---- model endpoints ------------------------------------------------------------------------ */

static int send_json(struct kd_buf *out, struct kd_buf *body, int rc, const struct kd_request *req,
                     const char *rid)
{
    char hdr[256];
    snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\n", rid);
    int status = rc == 0
                     ? kd_resp_append(out, 200, "application/json", body->data, body->len, req->keep_alive, hdr)
                     : kd_resp_error(out, 500, "out of memory", req->keep_alive, hdr);
    kd_buf_free(body);
    return status;
}

/* Worker thread: the request's tensor data into its input buffers, before it joins a run. */
static int infer_prepare(struct kd_sched_request *r)
{
    struct infer_job *j = (struct infer_job *)r;
    if (kd_infer_fill(&j->data, kd_sched_model_config(r->model), r, r->error, sizeof r->error) == 0)
        return 0;
    j->refused = true;
    return -1;
}

/* Worker thread, after the run: the response body, so that the loop only wraps and sends it. */
static void infer_finish(struct kd_sched_request *r)
{
    struct infer_job *j = (struct infer_job *)r;
    struct kd_sched_model *m = r->model;
    if (r->outcome != KD_SCHED_OK)
        return;
    j->encoded = kd_infer_body(&j->body, kd_sched_model_name(m), kd_sched_model_version(m),
                               kd_sched_model_config(m), r, j->want_output, j->want_binary, j->id,
                               &j->body_json_len) == 0;
}

void kd_serving_account_done(struct kd_serving *sv, const struct kd_sched_request *r, bool refused)
{
    struct kd_sched_model *m = r->model;
    const char *name = kd_sched_model_name(m);
    sv->inflight_total--;
    set_gauges(sv, m, -1);
    /* Data refused by the worker is what the loop used to refuse before queueing: "rejected". */
    count_outcome(sv, name, refused ? "rejected" : kd_sched_outcome_to_str(r->outcome));
    if (!refused && (r->outcome == KD_SCHED_OK || r->outcome == KD_SCHED_FAILED)) {
        struct kd_metric_series *q = kd_metrics_series(sv->f_queue, (const char *const[]){name, NULL});
        struct kd_metric_series *c = kd_metrics_series(sv->f_compute, (const char *const[]){name, NULL});
        struct kd_metric_series *b = kd_metrics_series(sv->f_batch, (const char *const[]){name, NULL});
        if (q)
            kd_metric_observe(q, (double)(r->started_ns - r->enqueued_ns) / 1e9);
        if (c)
            kd_metric_observe(c, (double)(r->finished_ns - r->started_ns) / 1e9);
        if (b)
            kd_metric_observe(b, r->batch_size);
    }
}

static void infer_done(struct kd_sched_request *r)
{
    struct infer_job *j = (struct infer_job *)r;
    struct kd_serving *sv = j->sv;
    struct kd_sched_model *m = r->model;
    kd_serving_account_done(sv, r, j->refused);
    struct kd_buf *out = kd_http_pending_out(j->pending);
    int status = -1;
    if (out) {
        bool ka = kd_http_pending_keep_alive(j->pending);
        char hdr[256];
        snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\n", j->req_id);
        switch (r->outcome) {
        case KD_SCHED_OK:
            status = j->encoded ? kd_infer_respond(out, &j->body, j->body_json_len, ka, hdr) : -1;
            break;
        case KD_SCHED_FAILED: status = kd_resp_error(out, 400, r->error, ka, hdr); break;
        default:
            snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\nRetry-After: 1\r\n", j->req_id);
            status = kd_resp_error(out, 503, r->error[0] ? r->error : kd_sched_outcome_to_str(r->outcome), ka,
                                   hdr);
        }
    }
    kd_http_pending_finish(j->pending, status);
    kd_sched_request_clear(r);
    kd_sched_model_release(m);
    kd_buf_free(&j->body);
    free(j);
}

int kd_serving_submit(struct kd_serving *sv, struct kd_sched_request *r)
{
    if (kd_sched_submit(sv->o.sched, r) != 0) {
        count_outcome(sv, kd_sched_model_name(r->model), "rejected");
        return -1;
    }
    sv->inflight_total++;
    set_gauges(sv, r->model, 1);
    return 0;
}

void kd_serving_count_rejected(struct kd_serving *sv, const char *model)
{
    count_outcome(sv, model, "rejected");
}

static int handle_infer(struct kd_serving *sv, struct kd_sched_model *m, const struct kd_request *req,
                        struct kd_buf *out, const char *rid)
{
    const char *name = kd_sched_model_name(m);
    if (!sv->accepting) {
        count_outcome(sv, name, "rejected");
        return error_with_id(out, 503, "the server is draining", req->keep_alive, rid, "Retry-After: 1\r\n");
    }
    struct infer_job *j = calloc(1, sizeof *j);
    if (!j)
        return error_with_id(out, 500, "out of memory", req->keep_alive, rid, NULL);
    j->sv = sv;
    snprintf(j->req_id, sizeof j->req_id, "%s", rid);
    struct kd_infer_ctx ic = {sv, sv->o.max_tensor_elements, sv->o.max_string_bytes};
    char msg[256];
    int st = kd_infer_decode(&ic, kd_sched_model_config(m), req, &j->r, j->want_output, j->want_binary, j->id,
                             sizeof j->id, &j->data, msg, sizeof msg);
    if (st != 0) {
        free(j);
        count_outcome(sv, name, "rejected");
        return error_with_id(out, st, msg, req->keep_alive, rid, NULL);
    }
    j->pending = kd_http_defer(req);
    if (!j->pending) {
        kd_sched_request_clear(&j->r);
        free(j);
        return error_with_id(out, 500, "out of memory", req->keep_alive, rid, NULL);
    }
    j->r.model = kd_sched_model_retain(m);
    j->r.cancelled = &j->pending->cancelled;
    j->r.deadline_ns = uv_hrtime() + (uint64_t)sv->o.infer_timeout_ms * 1000000u;
    j->r.done = infer_done;
    j->r.prepare = infer_prepare;
    j->r.finish = infer_finish;
    if (kd_serving_submit(sv, &j->r) != 0) {
        kd_sched_model_release(m);
        kd_sched_request_clear(&j->r);
        struct kd_http_pending *p = j->pending;
        free(j);
        int rc = error_with_id(out, 503, "the model's queue is full; retry later", req->keep_alive, rid,
                               "Retry-After: 1\r\n");
        kd_http_pending_finish(p, rc);
        return KD_HTTP_DEFERRED;
    }
    return KD_HTTP_DEFERRED;
}

static int all_stats(struct kd_serving *sv, const struct kd_request *req, struct kd_buf *out, const char *rid)
{
    struct kd_buf b = {0};
    int rc = kd_buf_puts(&b, "{\"model_stats\":[");
    bool first = true;
    for (struct entry *e = sv->entries; e; e = e->next)
        for (int i = 0; i < e->nv; i++) {
            rc |= first ? 0 : kd_buf_puts(&b, ",");
            first = false;
            rc |= kd_serving_stats_json(&b, e->v[i]);
        }
    rc |= kd_buf_puts(&b, "]}");
    return send_json(out, &b, rc, req, rid);
}

int kd_serving_handle_models(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    struct kd_serving *sv = ctx;
    char rid[KD_HTTP_SHORT_HEADER_MAX], msg[320];
    request_id(sv, req, rid, sizeof rid);
    int st = authorize(sv, req, KD_AUTH_READ, out);
    if (st != 0)
        return st;
    static const char prefix[] = "/v2/models/";
    if (req->path_len == sizeof prefix - 1 + 5 && memcmp(req->path + sizeof prefix - 1, "stats", 5) == 0)
        return req->method == KD_HTTP_GET
                   ? all_stats(sv, req, out, rid)
                   : error_with_id(out, 405, "use GET", req->keep_alive, rid, "Allow: GET\r\n");
    struct model_path mp;
    st = parse_model_path(req, sizeof prefix - 1, &mp, msg, sizeof msg);
    if (st == 0 && (strcmp(mp.action, "load") == 0 || strcmp(mp.action, "unload") == 0)) {
        snprintf(msg, sizeof msg, "no route for this model path");
        st = 404;
    }
    if (st != 0)
        return error_with_id(out, st, msg, req->keep_alive, rid, NULL);
    bool is_infer = strcmp(mp.action, "infer") == 0;
    unsigned want = is_infer ? KD_HTTP_POST : KD_HTTP_GET;
    if (!(req->method & want))
        return error_with_id(out, 405, is_infer ? "use POST" : "use GET", req->keep_alive, rid,
                             is_infer ? "Allow: POST\r\n" : "Allow: GET\r\n");
    struct kd_sched_model *m = resolve(sv, &mp, &st, msg, sizeof msg);
    if (strcmp(mp.action, "ready") == 0) {
        if (!m && st == 404)
            return error_with_id(out, 404, msg, req->keep_alive, rid, NULL);
        char hdr[256];
        snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\n", rid);
        return m && sv->accepting
                   ? kd_resp_append(out, 200, NULL, "", 0, req->keep_alive, hdr)
                   : kd_resp_error(out, 503, m ? "the server is draining" : msg, req->keep_alive, hdr);
    }
    if (!m)
        return error_with_id(out, st, msg, req->keep_alive, rid, st == 503 ? "Retry-After: 1\r\n" : NULL);
    if (is_infer)
        return handle_infer(sv, m, req, out, rid);
    struct kd_buf b = {0};
    int rc = 0;
    if (strcmp(mp.action, "stats") == 0) {
        rc |= kd_buf_puts(&b, "{\"model_stats\":[");
        struct entry *e = find_entry(sv, mp.name);
        for (int i = 0; e && i < e->nv; i++) {
            if (mp.version && kd_sched_model_version(e->v[i]) != mp.version)
                continue;
            rc |= b.len > 16 ? kd_buf_puts(&b, ",") : 0;
            rc |= kd_serving_stats_json(&b, e->v[i]);
        }
        rc |= kd_buf_puts(&b, "]}");
        return send_json(out, &b, rc, req, rid);
    }
    const kd_model_config *c = kd_sched_model_config(m);
    if (strcmp(mp.action, "config") == 0) {
        rc |= kd_serving_config_json(&b, mp.name, kd_sched_model_format(m), c);
        return send_json(out, &b, rc, req, rid);
    }
    struct entry *e = find_entry(sv, mp.name);
    rc |= kd_buf_puts(&b, "{\"name\":\"");
    rc |= kd_buf_json_escape(&b, mp.name, strlen(mp.name));
    rc |= kd_buf_puts(&b, "\",\"versions\":[");
    for (int i = 0; e && i < e->nv; i++)
        rc |= kd_buf_printf(&b, "%s\"%lld\"", i ? "," : "", (long long)kd_sched_model_version(e->v[i]));
    /* The format it was loaded from ("kiln" or "onnx"): kilnd runs both itself. */
    rc |= kd_buf_printf(&b, "],\"platform\":\"%s\"", kd_sched_model_format(m));
    rc |= kd_serving_specs_json(&b, "inputs", c->inputs, c->ninputs);
    rc |= kd_serving_specs_json(&b, "outputs", c->outputs, c->noutputs);
    rc |= kd_buf_printf(&b, ",\"max_batch_size\":%d}", c->max_batch_size);
    return send_json(out, &b, rc, req, rid);
}

/* ---- repository extension ------------------------------------------------------------------ */

struct index_json {
    struct kd_buf b;
    int rc;
    bool first;
};

static void index_row_json(void *ud, const char *name, int64_t version, const char *state, const char *why)
{
    struct index_json *ij = ud;
    ij->rc |= kd_buf_puts(&ij->b, ij->first ? "{\"name\":\"" : ",{\"name\":\"");
    ij->first = false;
    ij->rc |= kd_buf_json_escape(&ij->b, name, strlen(name));
    if (version > 0)
        ij->rc |= kd_buf_printf(&ij->b, "\",\"version\":\"%lld", (long long)version);
    ij->rc |= kd_buf_printf(&ij->b, "\",\"state\":\"%s\",\"reason\":\"", state);
    ij->rc |= kd_buf_json_escape(&ij->b, why, strlen(why));
    ij->rc |= kd_buf_puts(&ij->b, "\"}");
}

void kd_serving_index(struct kd_serving *sv, bool only_ready,
                      void (*row)(void *ud, const char *name, int64_t version, const char *state, const char *why),
                      void *ud)
{
    kd_repository_scan(sv->repo);
    for (int i = 0; i < kd_repository_count(sv->repo); i++) {
        const kd_model_info *info = kd_repository_model(sv->repo, i);
        struct entry *e = find_entry(sv, info->name);
        for (int k = 0; k < info->nversions || (k == 0 && info->nversions == 0); k++) {
            const kd_model_version *v = info->nversions ? &info->versions[k] : NULL;
            bool ready = false;
            for (int j = 0; e && v && j < e->nv; j++)
                ready |= kd_sched_model_version(e->v[j]) == v->version;
            if (only_ready && !ready)
                continue;
            const char *state = ready ? "READY" : e && e->loading ? "LOADING" : "UNAVAILABLE";
            const char *why = ready ? "" : v && !v->valid && v->why ? v->why : !info->valid && info->why ? info->why
                                  : e && e->why[0] ? e->why : v && !v->served ? "not selected by the version policy"
                                                                                : "not loaded";
            row(ud, info->name, v ? v->version : 0, state, why);
        }
    }
}

static int repo_index(struct kd_serving *sv, const struct kd_request *req, struct kd_buf *out, const char *rid)
{
    /* The body is empty or {"ready": bool}: with true, only the versions ready to serve. */
    bool only_ready = false;
    if (req->body_len) {
        cJSON *j = cJSON_ParseWithLength(req->body, req->body_len);
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "ready");
        bool ok = cJSON_IsObject(j) && (!r || cJSON_IsBool(r));
        only_ready = ok && cJSON_IsTrue(r);
        cJSON_Delete(j);
        if (!ok)
            return error_with_id(out, 400, "the index request body is {\"ready\": true|false} or empty",
                                 req->keep_alive, rid, NULL);
    }
    struct index_json ij = {.first = true};
    ij.rc = kd_buf_puts(&ij.b, "[");
    kd_serving_index(sv, only_ready, index_row_json, &ij);
    struct kd_buf b = ij.b;
    int rc = ij.rc;
    rc |= kd_buf_puts(&b, "]");
    return send_json(out, &b, rc, req, rid);
}

/*
 * A load request's body: empty, or {"parameters": {...}}. Triton lets "config" (a whole model
 * configuration) and "file:<path>" (model files) ride along; kilnd loads only what the repository
 * folder holds, so those are refused (501) rather than silently ignored. 0, or a status with msg.
 */
static int load_overrides(const struct kd_request *req, char *msg, size_t n)
{
    if (req->body_len == 0)
        return 0;
    cJSON *j = cJSON_ParseWithLength(req->body, req->body_len);
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(j, "parameters");
    int st = 0;
    if (!cJSON_IsObject(j) || (params && !cJSON_IsObject(params))) {
        snprintf(msg, n, "the load request body is a JSON object with an optional \"parameters\" object");
        st = 400;
    }
    for (const cJSON *p = params ? params->child : NULL; p && st == 0; p = p->next)
        if (strcmp(p->string, "config") == 0 || strncmp(p->string, "file:", 5) == 0) {
            snprintf(msg, n, "kilnd does not take a model configuration or files with a load request: put "
                             "config.json and the model file in the model's repository folder, then load");
            st = 501;
        }
    cJSON_Delete(j);
    return st;
}

int kd_serving_handle_repository(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    struct kd_serving *sv = ctx;
    char rid[KD_HTTP_SHORT_HEADER_MAX], msg[320];
    request_id(sv, req, rid, sizeof rid);
    static const char index_path[] = "/v2/repository/index";
    if (req->path_len == sizeof index_path - 1 && memcmp(req->path, index_path, req->path_len) == 0) {
        int st = authorize(sv, req, KD_AUTH_READ, out);
        return st ? st : repo_index(sv, req, out, rid);
    }
    int st = authorize(sv, req, KD_AUTH_ADMIN, out);
    if (st != 0)
        return st;
    static const char prefix[] = "/v2/repository/models/";
    struct model_path mp;
    if (req->path_len <= sizeof prefix - 1 || memcmp(req->path, prefix, sizeof prefix - 1) != 0)
        return error_with_id(out, 404, "no route for this repository path", req->keep_alive, rid, NULL);
    st = parse_model_path(req, sizeof prefix - 1, &mp, msg, sizeof msg);
    if (st == 0 && mp.version) {
        snprintf(msg, sizeof msg, "load and unload apply to a whole model");
        st = 400;
    } else if (st == 0 && strcmp(mp.action, "load") != 0 && strcmp(mp.action, "unload") != 0) {
        snprintf(msg, sizeof msg, "no route for this repository path");
        st = 404;
    }
    if (st != 0)
        return error_with_id(out, st, msg, req->keep_alive, rid, NULL);
    if (strcmp(mp.action, "unload") == 0) {
        if (kd_serving_unload(sv, mp.name, msg, sizeof msg) != 0)
            return error_with_id(out, 404, msg, req->keep_alive, rid, NULL);
        char hdr[256];
        snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\n", rid);
        return kd_resp_append(out, 200, "application/json", "{}", 2, req->keep_alive, hdr);
    }
    st = load_overrides(req, msg, sizeof msg);
    if (st != 0)
        return error_with_id(out, st, msg, req->keep_alive, rid, NULL);
    struct load_reply *r = calloc(1, sizeof *r);
    struct kd_http_pending *p = r ? kd_http_defer(req) : NULL;
    if (!p) {
        free(r);
        return error_with_id(out, 500, "out of memory", req->keep_alive, rid, NULL);
    }
    r->pending = p;
    snprintf(r->req_id, sizeof r->req_id, "%s", rid);
    st = kd_serving_load(sv, mp.name, 0, load_reply_send, r, msg, sizeof msg);
    if (st != 0) {
        struct kd_buf *o = kd_http_pending_out(p);
        kd_http_pending_finish(p, error_with_id(o, st, msg, kd_http_pending_keep_alive(p), rid, NULL));
        free(r);
    }
    return KD_HTTP_DEFERRED;
}

/* ---- for the other protocols (gRPC): the same table, rules and accounting ------------------ */

int kd_serving_unload(struct kd_serving *sv, const char *name, char *msg, size_t n)
{
    struct entry *e = find_entry(sv, name);
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
    struct model_path mp = {.version = version, .action = ""};
    if (!kd_repository_name_valid(name)) {
        snprintf(msg, n, "invalid model name");
        *status = 400;
        return NULL;
    }
    snprintf(mp.name, sizeof mp.name, "%s", name);
    return resolve(sv, &mp, status, msg, n);
}

int kd_serving_versions(struct kd_serving *sv, const char *name, struct kd_sched_model **out, int max)
{
    struct entry *e = find_entry(sv, name);
    int k = 0;
    for (int i = 0; e && i < e->nv && k < max; i++)
        out[k++] = e->v[i];
    return k;
}

bool kd_serving_accepting(const struct kd_serving *sv)
{
    return sv->accepting;
}

const struct kd_auth *kd_serving_auth(const struct kd_serving *sv)
{
    return sv->auth;
}

const struct kd_serving_options *kd_serving_limits(const struct kd_serving *sv)
{
    return &sv->o;
}
