/*
 * api/jobs.c — /v1/jobs: the REST face of training jobs, the training thread that runs them,
 * and the server-sent event streams that follow them.
 *
 * Why one training thread: a Learner already spreads its work over the backend's thread pool
 * and its loaders' workers, so two concurrent jobs on one device would mostly fight over the
 * same cores. Jobs therefore run one at a time, oldest first; the queue is the jobs table itself
 * (state 'queued'), which is what makes it survive a crash without any extra bookkeeping.
 *
 * The store is shared by the loop (requests, streams) and the training thread (events,
 * progress, states) behind one mutex; every call under it is a single short SQLite statement
 * or transaction, so the loop never waits long.
 *
 * Event streams are deferred responses that never finish while the job runs: the handler
 * writes the SSE header, and each time the training thread appends events (uv_async) the loop
 * appends the rows after the stream's last id to the connection's output and wakes it. A
 * stream ends once its job is final and every event is out.
 *
 * A finished model is loaded through the serving module's repository endpoint, called in
 * process with a connection of our own: that is the one load path serving has (rescan, build
 * every served version on its worker, swap), so a trained model is served exactly like one
 * loaded with POST /v2/repository/models/<name>/load.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "http_conn.h"
#include "jobs.h"
#include "kiln/record.h"
#include "responses.h"
#include "serving.h"
#include "trainer.h"

#define STREAM_OUT_MAX (4u << 20)   /* a client this far behind is dropped; it can reconnect */
#define PING_MS 15000
#define LOAD_POLL_MS 50

struct stream {
    struct kiln_jobs *j;
    int64_t job_id;
    int64_t last_seq;
    struct kiln_http_pending *p;
    struct stream *next;
};

struct load_req {
    struct kiln_http_conn conn;      /* a connection of our own for the in-process request */
    struct kiln_http_headers headers;
    char path[KILN_MODEL_NAME_MAX + 64];
    char name[KILN_MODEL_NAME_MAX + 1];
    bool done;
    struct load_req *next;
};

struct kiln_jobs {
    struct kiln_jobs_options o;
    char *data_dir;
    const char **roots;
    size_t nroots;
    char admin_token[256];           /* for in-process loads when tokens are on */
    bool auth;
    /* loop thread */
    uv_async_t async;
    uv_timer_t ping, load_timer;
    bool handles_open;
    struct stream *streams;
    struct load_req *loads;
    struct kiln_http_service load_svc;
    /* shared */
    pthread_mutex_t store_mu;        /* the job store */
    pthread_mutex_t mu;              /* the fields below */
    pthread_cond_t cv;
    /* Bumped (under mu) whenever a job is queued. The trainer reads the store with mu
     * released, so it sleeps only if no job was queued since it started looking;
     * without this a submit landing in that window was a lost wake-up and the job
     * stayed queued forever. */
    uint64_t queued_seq;
    bool stopping;
    int64_t current;                 /* the job being trained, 0 when none */
    atomic_bool cancel;              /* the current job: stop before its next step */
    char *to_load[16];               /* models registered, waiting for the loop to load them */
    int nto_load;
    pthread_t thread;
    bool thread_started;
};

static void jlog(struct kiln_jobs *j, enum kiln_log_level l, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void jlog(struct kiln_jobs *j, enum kiln_log_level l, const char *fmt, ...)
{
    if (!j->o.log)
        return;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    j->o.log(j->o.log_ud, l, msg);
}

/* ---- the store, shared --------------------------------------------------------------------- */

static void store_lock(struct kiln_jobs *j)
{
    pthread_mutex_lock(&j->store_mu);
}

static void store_unlock(struct kiln_jobs *j)
{
    pthread_mutex_unlock(&j->store_mu);
}

/* Append an event and tell the loop; from either thread. */
static void emit(struct kiln_jobs *j, int64_t id, const char *type, const char *payload)
{
    char err[256];
    store_lock(j);
    int rc = kiln_jobstore_event_append(j->o.store, id, type, payload, NULL, err, sizeof err);
    store_unlock(j);
    if (rc != 0)
        jlog(j, KILN_LOG_WARN, "job %lld: event not stored: %s", (long long)id, err);
    uv_async_send(&j->async);
}

static void emit_state(struct kiln_jobs *j, int64_t id, const char *state, const char *error, const char *extra_key,
                       const char *extra_json)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "state", state);
    if (error)
        cJSON_AddStringToObject(o, "error", error);
    if (extra_key && extra_json) {
        cJSON *x = cJSON_Parse(extra_json);
        if (x)
            cJSON_AddItemToObject(o, extra_key, x);
    }
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (text)
        emit(j, id, "state", text);
    cJSON_free(text);
}

static int set_state(struct kiln_jobs *j, int64_t id, const char *state, const char *error)
{
    char err[256];
    store_lock(j);
    int rc = kiln_jobstore_job_set_state(j->o.store, id, state, error, err, sizeof err);
    store_unlock(j);
    if (rc != 0)
        jlog(j, KILN_LOG_WARN, "job %lld: %s", (long long)id, err);
    return rc;
}

static char *path_join(const char *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *path_join(const char *a, const char *fmt, ...)
{
    char tail[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tail, sizeof tail, fmt, ap);
    va_end(ap);
    size_t n = strlen(a) + strlen(tail) + 2;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s/%s", a, tail);
    return s;
}

/* ---- the training thread ------------------------------------------------------------------- */

struct job_run {
    struct kiln_jobs *j;
    int64_t id;
    uint64_t last_progress_ns;
};

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void hook_event(void *ud, const char *type, const char *json)
{
    struct job_run *r = ud;
    emit(r->j, r->id, type, json);
}

static void hook_progress(void *ud, double f)
{
    struct job_run *r = ud;
    uint64_t t = mono_ns();
    if (t - r->last_progress_ns < 500000000u && f < 1.0)
        return;
    r->last_progress_ns = t;
    store_lock(r->j);
    kiln_jobstore_job_set_progress(r->j->o.store, r->id, f < 0 ? 0 : f > 1 ? 1 : f, NULL, 0);
    store_unlock(r->j);
}

static void hook_checkpoint(void *ud, const char *path, int64_t step)
{
    struct job_run *r = ud;
    store_lock(r->j);
    kiln_jobstore_checkpoint_add(r->j->o.store, r->id, path, step, NAN, NULL, 0);
    store_unlock(r->j);
}

static bool dir_exists(const char *p)
{
    struct stat st;
    return p && stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static struct kiln_jobspec_env spec_env(struct kiln_jobs *j)
{
    return (struct kiln_jobspec_env){j->roots, j->nroots};
}

static void run_job(struct kiln_jobs *j, int64_t id)
{
    struct kiln_job job;
    char err[256], problems[2048];
    store_lock(j);
    int rc = kiln_jobstore_job_get(j->o.store, id, &job, err, sizeof err);
    store_unlock(j);
    if (rc != 0) {
        jlog(j, KILN_LOG_ERROR, "job %lld: %s", (long long)id, err);
        return;
    }
    bool restarted = job.started_ms != 0;
    struct kiln_jobspec spec;
    struct kiln_jobspec_env env = spec_env(j);
    if (kiln_jobspec_parse(job.spec, &env, &spec, problems, sizeof problems) != 0) {
        /* Checked at submission; a data file removed since makes it fail here. */
        for (char *c = problems; *c; c++)
            if (*c == '\n')
                *c = ';';
        if (set_state(j, id, KILN_JOB_RUNNING, NULL) == 0 && set_state(j, id, KILN_JOB_FAILED, problems) == 0)
            emit_state(j, id, KILN_JOB_FAILED, problems, NULL, NULL);
        kiln_jobstore_job_clear(&job);
        return;
    }
    if (set_state(j, id, KILN_JOB_RUNNING, NULL) != 0) {
        kiln_jobspec_free(&spec);
        kiln_jobstore_job_clear(&job);
        return;
    }
    emit_state(j, id, KILN_JOB_RUNNING, NULL, NULL, NULL);
    jlog(j, KILN_LOG_INFO, "job %lld %s", (long long)id, restarted ? "resumes after a restart" : "starts");
    char *ckpt = path_join(j->data_dir, "checkpoints/job-%lld", (long long)id);
    char *from = spec.resume_from_job > 0 ? path_join(j->data_dir, "checkpoints/job-%lld", (long long)spec.resume_from_job)
                                          : NULL;
    char *scratch = path_join(j->data_dir, "tmp/job-%lld-model", (long long)id);
    char *models = path_join(j->data_dir, "%s", "models");
    char *tmp = path_join(j->data_dir, "%s", "tmp");
    char *cks = path_join(j->data_dir, "%s", "checkpoints");
    if (tmp)
        mkdir(tmp, 0755);
    if (cks)
        mkdir(cks, 0755);
    /* Our own checkpoints win over the ones of the job this one continues. */
    const char *resume = NULL;
    if (ckpt && dir_exists(ckpt)) {
        kiln_ckpt *ck = kiln_ckpt_open_latest(ckpt, NULL, NULL);
        if (ck)
            resume = ckpt;
        kiln_ckpt_close(ck);
    }
    if (!resume && from && dir_exists(from))
        resume = from;
    struct job_run jr = {j, id, 0};
    struct kiln_trainer_run run = {
        .spec = &spec,
        .checkpoint_dir = ckpt,
        .resume_dir = resume,
        .models_root = models,
        .scratch_dir = scratch,
        .cancel = &j->cancel,
        .hooks = {&jr, hook_event, hook_progress, hook_checkpoint},
    };
    struct kiln_trainer_result res;
    if (!ckpt || !scratch || !models) {
        memset(&res, 0, sizeof res);
        snprintf(res.error, sizeof res.error, "out of memory");
        rc = -1;
    } else {
        rc = kiln_trainer_run(&run, &res);
    }
    pthread_mutex_lock(&j->mu);
    bool stopping = j->stopping;
    pthread_mutex_unlock(&j->mu);
    if (rc != 0) {
        jlog(j, KILN_LOG_WARN, "job %lld failed: %s", (long long)id, res.error);
        if (set_state(j, id, KILN_JOB_FAILED, res.error) == 0)
            emit_state(j, id, KILN_JOB_FAILED, res.error, NULL, NULL);
    } else if (strcmp(res.stop_reason, "cancelled") == 0) {
        if (stopping) {
            /* kilnd is shutting down, not the user cancelling: the job stays running in the
             * store and the next kilnd picks it up from its checkpoint. */
            jlog(j, KILN_LOG_INFO, "job %lld interrupted by shutdown; it resumes on the next start", (long long)id);
        } else if (set_state(j, id, KILN_JOB_CANCELLED, NULL) == 0) {
            emit_state(j, id, KILN_JOB_CANCELLED, NULL, NULL, NULL);
            jlog(j, KILN_LOG_INFO, "job %lld cancelled", (long long)id);
        }
    } else {
        if (res.version > 0) {
            char e2[256];
            store_lock(j);
            if (kiln_jobstore_model_register(j->o.store, spec.register_as, res.version, id, res.metrics_json, e2,
                                             sizeof e2) != 0)
                jlog(j, KILN_LOG_WARN, "job %lld: model registry: %s", (long long)id, e2);
            store_unlock(j);
            char model[KILN_MODEL_NAME_MAX + 64];
            snprintf(model, sizeof model, "{\"name\":\"%s\",\"version\":%lld}", spec.register_as,
                     (long long)res.version);
            emit(j, id, "model", model);
            pthread_mutex_lock(&j->mu);
            if (j->nto_load < (int)(sizeof j->to_load / sizeof j->to_load[0]))
                j->to_load[j->nto_load++] = strdup(spec.register_as);
            pthread_mutex_unlock(&j->mu);
        }
        if (set_state(j, id, KILN_JOB_SUCCEEDED, NULL) == 0)
            emit_state(j, id, KILN_JOB_SUCCEEDED, NULL, "metrics", res.metrics_json);
        jlog(j, KILN_LOG_INFO, "job %lld succeeded (%s)", (long long)id, res.stop_reason);
    }
    uv_async_send(&j->async);
    free(res.metrics_json);
    free(ckpt);
    free(from);
    free(scratch);
    free(models);
    free(tmp);
    free(cks);
    kiln_jobspec_free(&spec);
    kiln_jobstore_job_clear(&job);
}

static int64_t next_queued(struct kiln_jobs *j)
{
    struct kiln_job *jobs = NULL;
    int n = 0;
    store_lock(j);
    int rc = kiln_jobstore_job_list(j->o.store, KILN_JOB_QUEUED, 0, 1, &jobs, &n, NULL, 0);
    store_unlock(j);
    int64_t id = rc == 0 && n > 0 ? jobs[0].id : 0;
    kiln_jobstore_job_list_free(jobs, n);
    return id;
}

static void *trainer_main(void *ud)
{
    struct kiln_jobs *j = ud;
    pthread_mutex_lock(&j->mu);
    while (!j->stopping) {
        uint64_t seen = j->queued_seq;
        pthread_mutex_unlock(&j->mu);
        int64_t id = next_queued(j);
        pthread_mutex_lock(&j->mu);
        if (j->stopping)
            break;
        if (!id) {
            while (!j->stopping && j->queued_seq == seen)
                pthread_cond_wait(&j->cv, &j->mu);
            continue;
        }
        j->current = id;
        atomic_store(&j->cancel, false);
        pthread_mutex_unlock(&j->mu);
        run_job(j, id);
        pthread_mutex_lock(&j->mu);
        j->current = 0;
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

/* ---- loading trained models ---------------------------------------------------------------- */

static void load_poll(uv_timer_t *t)
{
    struct kiln_jobs *j = t->data;
    bool busy = false;
    for (struct load_req **pp = &j->loads; *pp;) {
        struct load_req *l = *pp;
        if (l->conn.pending) {
            busy = true;
            pp = &l->next;
            continue;
        }
        /* "HTTP/1.1 NNN ...": read the three digits from the byte buffer itself (it is
         * not NUL-terminated, so no string function may run off its end) */
        int status = 0;
        const char *o = l->conn.out.data;
        if (l->conn.out.len > 12)
            for (int k = 9; k < 12 && o[k] >= '0' && o[k] <= '9'; k++)
                status = status * 10 + (o[k] - '0');
        if (status == 200)
            jlog(j, KILN_LOG_INFO, "trained model %s loaded", l->name);
        else
            jlog(j, KILN_LOG_WARN, "trained model %s did not load (HTTP %d): %.*s", l->name, status,
                 (int)(l->conn.out.len < 400 ? l->conn.out.len : 400), l->conn.out.data ? l->conn.out.data : "");
        *pp = l->next;
        kiln_http_conn_free(&l->conn);
        free(l);
    }
    if (!busy)
        uv_timer_stop(t);
}

static void start_model_load(struct kiln_jobs *j, const char *name)
{
    if (!j->o.serving)
        return;
    struct load_req *l = calloc(1, sizeof *l);
    if (!l)
        return;
    l->conn.svc = &j->load_svc;
    snprintf(l->name, sizeof l->name, "%s", name);
    snprintf(l->path, sizeof l->path, "/v2/repository/models/%s/load", name);
    if (j->auth)
        snprintf(l->headers.authorization, sizeof l->headers.authorization, "Bearer %s", j->admin_token);
    struct kiln_request req = {
        .method = KILN_HTTP_POST,
        .path = l->path,
        .path_len = strlen(l->path),
        .body = "",
        .keep_alive = false,
        .headers = &l->headers,
        .conn = &l->conn,
    };
    kiln_serving_handle_repository(j->o.serving, &req, &l->conn.out);
    l->next = j->loads;
    j->loads = l;
    if (!uv_is_active((uv_handle_t *)&j->load_timer))
        uv_timer_start(&j->load_timer, load_poll, LOAD_POLL_MS, LOAD_POLL_MS);
}

/* ---- event streams ------------------------------------------------------------------------- */

static void stream_end(struct kiln_jobs *j, struct stream *s)
{
    for (struct stream **pp = &j->streams; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    kiln_http_pending_finish(s->p, 200);
    free(s);
}

static void stream_wake(struct kiln_http_pending *p)
{
    /* The socket layer sends what sits in the connection's output when woken; a pending
     * response that has not finished is exactly what a stream is. */
    if (p->conn && p->conn->wake)
        p->conn->wake(p->conn->wake_ud);
}

static bool final_state(const char *s)
{
    return s && (!strcmp(s, KILN_JOB_SUCCEEDED) || !strcmp(s, KILN_JOB_FAILED) || !strcmp(s, KILN_JOB_CANCELLED));
}

/*
 * Append the events of job id after *last_seq in SSE form; true when the job is final and
 * every one of its events is in out. The state is read in the same locked section as the last
 * events, after them, so an event appended later is seen by the next call.
 */
static bool append_events(struct kiln_jobs *j, int64_t id, int64_t *last_seq, struct kiln_buf *out)
{
    bool final = false;
    for (;;) {
        struct kiln_job_event *ev = NULL;
        int n = 0;
        struct kiln_job job;
        store_lock(j);
        int rc = kiln_jobstore_events_since(j->o.store, id, *last_seq, 500, &ev, &n, NULL, 0);
        int grc = n < 500 ? kiln_jobstore_job_get(j->o.store, id, &job, NULL, 0) : 1;
        store_unlock(j);
        for (int i = 0; rc == 0 && i < n; i++) {
            kiln_buf_printf(out, "id: %lld\nevent: %s\ndata: %s\n\n", (long long)ev[i].seq, ev[i].type,
                            ev[i].payload);
            *last_seq = ev[i].seq;
        }
        kiln_jobstore_events_free(ev, n);
        if (grc == 0) {
            final = final_state(job.state);
            kiln_jobstore_job_clear(&job);
        }
        if (rc != 0 || n < 500)
            return final;
    }
}

/* Send what the stream has not seen; end it when its job is over. Returns false when ended. */
static bool stream_pump(struct kiln_jobs *j, struct stream *s)
{
    struct kiln_buf *out = kiln_http_pending_out(s->p);
    if (!out || out->len > STREAM_OUT_MAX) {
        stream_end(j, s);
        return false;
    }
    if (append_events(j, s->job_id, &s->last_seq, out)) {
        stream_end(j, s);
        return false;
    }
    stream_wake(s->p);
    return true;
}

static void on_async(uv_async_t *a)
{
    struct kiln_jobs *j = a->data;
    char *names[16];
    int n;
    pthread_mutex_lock(&j->mu);
    n = j->nto_load;
    memcpy(names, j->to_load, sizeof names);
    j->nto_load = 0;
    pthread_mutex_unlock(&j->mu);
    for (int i = 0; i < n; i++) {
        start_model_load(j, names[i]);
        free(names[i]);
    }
    for (struct stream *s = j->streams, *next; s; s = next) {
        next = s->next;
        stream_pump(j, s);
    }
}

static void on_ping(uv_timer_t *t)
{
    struct kiln_jobs *j = t->data;
    /* A comment line keeps proxies from timing the stream out and finds clients that left. */
    for (struct stream *s = j->streams, *next; s; s = next) {
        next = s->next;
        struct kiln_buf *out = kiln_http_pending_out(s->p);
        if (!out) {
            stream_end(j, s);
            continue;
        }
        kiln_buf_puts(out, ": ping\n\n");
        stream_wake(s->p);
    }
}

/* ---- HTTP ---------------------------------------------------------------------------------- */

static bool same_secret(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    unsigned char diff = na != nb;
    for (size_t i = 0; i < na; i++)
        diff |= (unsigned char)(a[i] ^ b[i % (nb ? nb : 1)]);
    return diff == 0;
}

/* Jobs need the admin scope once tokens are configured. 0, or the status of the answer given. */
static int authorize(struct kiln_jobs *j, const struct kiln_request *req, struct kiln_buf *out)
{
    if (!j->auth)
        return 0;
    const char *h = req->headers ? req->headers->authorization : "";
    if (strncasecmp(h, "Bearer ", 7) != 0)
        return kiln_resp_error(out, 401, "a bearer token is required", req->keep_alive, "WWW-Authenticate: Bearer\r\n");
    bool known = false, admin = false;
    for (size_t i = 0; i < j->o.tokens->count; i++) {
        const char *t = j->o.tokens->items[i];
        bool is_admin = strncmp(t, "admin:", 6) == 0;
        const char *secret = is_admin ? t + 6 : strncmp(t, "read:", 5) == 0 ? t + 5 : t;
        if (same_secret(h + 7, secret)) {
            known = true;
            admin |= is_admin;
        }
    }
    if (!known)
        return kiln_resp_error(out, 401, "invalid bearer token", req->keep_alive,
                               "WWW-Authenticate: Bearer error=\"invalid_token\"\r\n");
    if (!admin)
        return kiln_resp_error(out, 403, "training jobs need a token with the admin scope", req->keep_alive, NULL);
    return 0;
}

static int send_json(struct kiln_buf *out, int status, cJSON *o, const struct kiln_request *req)
{
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!text)
        return kiln_resp_error(out, 500, "out of memory", req->keep_alive, NULL);
    int rc = kiln_resp_append(out, status, "application/json", text, strlen(text), req->keep_alive, NULL);
    cJSON_free(text);
    return rc;
}

static int errorf(struct kiln_buf *out, const struct kiln_request *req, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int errorf(struct kiln_buf *out, const struct kiln_request *req, int status, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln_resp_error(out, status, msg, req->keep_alive, NULL);
}

/* A query parameter's value (bounded copy); false when absent. */
static bool query_param(const struct kiln_request *req, const char *key, char *val, size_t len)
{
    size_t kl = strlen(key);
    const char *q = req->query, *end = q ? q + req->query_len : NULL;
    while (q && q < end) {
        const char *amp = memchr(q, '&', (size_t)(end - q));
        const char *stop = amp ? amp : end;
        if ((size_t)(stop - q) > kl && memcmp(q, key, kl) == 0 && q[kl] == '=') {
            size_t vl = (size_t)(stop - q - (ptrdiff_t)kl - 1);
            if (vl >= len)
                vl = len - 1;
            memcpy(val, q + kl + 1, vl);
            val[vl] = '\0';
            return true;
        }
        q = amp ? amp + 1 : end;
    }
    return false;
}

static bool parse_i64(const char *s, int64_t *v)
{
    if (!*s)
        return false;
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (*end || errno || x < 0)
        return false;
    *v = x;
    return true;
}

static cJSON *job_summary(const struct kiln_job *job)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)job->id);
    cJSON_AddStringToObject(o, "state", job->state);
    cJSON_AddNumberToObject(o, "progress", job->progress);
    cJSON *spec = cJSON_Parse(job->spec);
    const cJSON *reg = cJSON_GetObjectItemCaseSensitive(spec, "register_as");
    if (cJSON_IsString(reg))
        cJSON_AddStringToObject(o, "register_as", reg->valuestring);
    cJSON_Delete(spec);
    if (job->error)
        cJSON_AddStringToObject(o, "error", job->error);
    cJSON_AddNumberToObject(o, "created_ms", (double)job->created_ms);
    if (job->started_ms)
        cJSON_AddNumberToObject(o, "started_ms", (double)job->started_ms);
    if (job->finished_ms)
        cJSON_AddNumberToObject(o, "finished_ms", (double)job->finished_ms);
    return o;
}

static int handle_submit(struct kiln_jobs *j, const struct kiln_request *req, struct kiln_buf *out)
{
    char problems[4096];
    /* The request body is a byte range, not a C string: copy it whole and terminate it
     * (strndup would read past the range looking for a NUL, and stop early at one). */
    if (req->body_len && memchr(req->body, '\0', req->body_len))
        return errorf(out, req, 400, "job spec: the body contains a NUL byte");
    char *body = malloc(req->body_len + 1);
    if (!body)
        return errorf(out, req, 500, "out of memory");
    if (req->body_len)
        memcpy(body, req->body, req->body_len);
    body[req->body_len] = '\0';
    struct kiln_jobspec spec;
    struct kiln_jobspec_env env = spec_env(j);
    if (kiln_jobspec_parse(body, &env, &spec, problems, sizeof problems) != 0) {
        free(body);
        cJSON *o = cJSON_CreateObject();
        cJSON *list = cJSON_AddArrayToObject(o, "problems");
        char first[600] = "";
        for (char *line = problems, *nl; line && *line; line = nl ? nl + 1 : NULL) {
            nl = strchr(line, '\n');
            if (nl)
                *nl = '\0';
            if (!first[0])
                snprintf(first, sizeof first, "%.500s", line);
            cJSON_AddItemToArray(list, cJSON_CreateString(line));
        }
        int np = cJSON_GetArraySize(list);
        char msg[700];
        snprintf(msg, sizeof msg, "invalid job spec: %s%s", first, np > 1 ? " (and more, see problems)" : "");
        cJSON_AddStringToObject(o, "error", msg);
        return send_json(out, 400, o, req);
    }
    kiln_jobspec_free(&spec);
    int64_t id = 0;
    char err[256];
    store_lock(j);
    int rc = kiln_jobstore_job_create(j->o.store, body, NULL, &id, err, sizeof err);
    store_unlock(j);
    free(body);
    if (rc != 0)
        return errorf(out, req, 500, "job store: %s", err);
    emit_state(j, id, KILN_JOB_QUEUED, NULL, NULL, NULL);
    pthread_mutex_lock(&j->mu);
    j->queued_seq++;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    jlog(j, KILN_LOG_INFO, "job %lld queued", (long long)id);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)id);
    cJSON_AddStringToObject(o, "state", KILN_JOB_QUEUED);
    return send_json(out, 201, o, req);
}

static int handle_list(struct kiln_jobs *j, const struct kiln_request *req, struct kiln_buf *out)
{
    char state[32] = "", num[32];
    int64_t after = 0, limit = 50;
    if (query_param(req, "state", state, sizeof state) && strcmp(state, KILN_JOB_QUEUED) &&
        strcmp(state, KILN_JOB_RUNNING) && !final_state(state))
        return errorf(out, req, 400, "state: must be queued, running, succeeded, failed or cancelled");
    if (query_param(req, "after", num, sizeof num) && !parse_i64(num, &after))
        return errorf(out, req, 400, "after: must be a job id");
    if (query_param(req, "limit", num, sizeof num) && (!parse_i64(num, &limit) || limit < 1 || limit > 1000))
        return errorf(out, req, 400, "limit: must be within 1..1000");
    struct kiln_job *jobs = NULL;
    int n = 0;
    char err[256];
    store_lock(j);
    int rc = kiln_jobstore_job_list(j->o.store, state[0] ? state : NULL, after, (int)limit, &jobs, &n, err, sizeof err);
    store_unlock(j);
    if (rc != 0)
        return errorf(out, req, 500, "job store: %s", err);
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "jobs");
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(arr, job_summary(&jobs[i]));
    if (n == limit)
        cJSON_AddNumberToObject(o, "next_after", (double)jobs[n - 1].id);
    else
        cJSON_AddNullToObject(o, "next_after");
    kiln_jobstore_job_list_free(jobs, n);
    return send_json(out, 200, o, req);
}

static int get_job(struct kiln_jobs *j, int64_t id, struct kiln_job *job, const struct kiln_request *req,
                   struct kiln_buf *out)
{
    char err[256];
    store_lock(j);
    int rc = kiln_jobstore_job_get(j->o.store, id, job, err, sizeof err);
    store_unlock(j);
    if (rc == KILN_JOBSTORE_NOT_FOUND)
        return errorf(out, req, 404, "no job %lld", (long long)id);
    if (rc != 0)
        return errorf(out, req, 500, "job store: %s", err);
    return 0;
}

static int handle_get(struct kiln_jobs *j, int64_t id, const struct kiln_request *req, struct kiln_buf *out)
{
    struct kiln_job job;
    int st = get_job(j, id, &job, req, out);
    if (st)
        return st;
    cJSON *o = job_summary(&job);
    cJSON *spec = cJSON_Parse(job.spec);
    if (spec)
        cJSON_AddItemToObject(o, "spec", spec);
    /* The latest step and epoch metrics and the registered model come from the events. */
    struct kiln_job_event *ev = NULL;
    int n = 0;
    cJSON *step = NULL, *epoch = NULL, *model = NULL, *logs = cJSON_CreateArray();
    for (int64_t after = 0;;) {
        store_lock(j);
        int rc = kiln_jobstore_events_since(j->o.store, id, after, 2000, &ev, &n, NULL, 0);
        store_unlock(j);
        if (rc != 0)
            break;
        for (int i = 0; i < n; i++) {
            cJSON **slot = !strcmp(ev[i].type, "step") ? &step : !strcmp(ev[i].type, "epoch") ? &epoch
                         : !strcmp(ev[i].type, "model") ? &model : NULL;
            if (slot) {
                cJSON_Delete(*slot);
                *slot = cJSON_Parse(ev[i].payload);
            } else if (!strcmp(ev[i].type, "log")) {
                cJSON *l = cJSON_Parse(ev[i].payload);
                const cJSON *m = cJSON_GetObjectItemCaseSensitive(l, "message");
                if (cJSON_IsString(m))
                    cJSON_AddItemToArray(logs, cJSON_CreateString(m->valuestring));
                cJSON_Delete(l);
                if (cJSON_GetArraySize(logs) > 20)
                    cJSON_DeleteItemFromArray(logs, 0);
            }
            after = ev[i].seq;
        }
        kiln_jobstore_events_free(ev, n);
        if (n < 2000)
            break;
    }
    cJSON_AddItemToObject(o, "latest_step", step ? step : cJSON_CreateNull());
    cJSON_AddItemToObject(o, "latest_epoch", epoch ? epoch : cJSON_CreateNull());
    cJSON_AddItemToObject(o, "model", model ? model : cJSON_CreateNull());
    cJSON_AddItemToObject(o, "logs", logs);
    cJSON *cks = cJSON_AddArrayToObject(o, "checkpoints");
    char *dir = path_join(j->data_dir, "checkpoints/job-%lld", (long long)id);
    kiln_ckpt_info *list = NULL;
    int nl = 0;
    if (dir_exists(dir) && kiln_ckpt_list(dir, false, NULL, &list, &nl) == 0) {
        for (int i = 0; i < nl; i++) {
            if (!list[i].valid)
                continue;
            cJSON *c = cJSON_CreateObject();
            cJSON_AddNumberToObject(c, "step", (double)list[i].step);
            cJSON_AddNumberToObject(c, "epoch", (double)list[i].epoch);
            cJSON_AddStringToObject(c, "path", list[i].path);
            cJSON_AddItemToArray(cks, c);
        }
        kiln_ckpt_list_free(list, nl);
    }
    free(dir);
    kiln_jobstore_job_clear(&job);
    return send_json(out, 200, o, req);
}

static int handle_cancel(struct kiln_jobs *j, int64_t id, const struct kiln_request *req, struct kiln_buf *out)
{
    struct kiln_job job;
    int st = get_job(j, id, &job, req, out);
    if (st)
        return st;
    char state[32];
    snprintf(state, sizeof state, "%s", job.state);
    kiln_jobstore_job_clear(&job);
    if (final_state(state))
        return errorf(out, req, 409, "job %lld is already %s", (long long)id, state);
    pthread_mutex_lock(&j->mu);
    bool running = j->current == id;
    if (running)
        atomic_store(&j->cancel, true);
    pthread_mutex_unlock(&j->mu);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)id);
    if (running) {
        /* The Learner stops before its next step; the state turns cancelled then. */
        cJSON_AddStringToObject(o, "state", "cancelling");
        return send_json(out, 202, o, req);
    }
    /* Queued (a job the thread has not taken yet, or just finished: the store decides). */
    if (set_state(j, id, KILN_JOB_CANCELLED, NULL) != 0) {
        cJSON_Delete(o);
        return errorf(out, req, 409, "job %lld could not be cancelled; it may have just finished", (long long)id);
    }
    emit_state(j, id, KILN_JOB_CANCELLED, NULL, NULL, NULL);
    cJSON_AddStringToObject(o, "state", KILN_JOB_CANCELLED);
    return send_json(out, 200, o, req);
}

static int handle_resume(struct kiln_jobs *j, int64_t id, const struct kiln_request *req, struct kiln_buf *out)
{
    struct kiln_job job;
    int st = get_job(j, id, &job, req, out);
    if (st)
        return st;
    if (strcmp(job.state, KILN_JOB_FAILED) != 0 && strcmp(job.state, KILN_JOB_CANCELLED) != 0) {
        st = errorf(out, req, 409, "job %lld is %s; only failed or cancelled jobs resume", (long long)id, job.state);
        kiln_jobstore_job_clear(&job);
        return st;
    }
    /* A final state is never left, so the continuation is a new job carrying the old one's
     * spec and starting from its newest checkpoint. */
    cJSON *spec = cJSON_Parse(job.spec);
    kiln_jobstore_job_clear(&job);
    if (!spec)
        return errorf(out, req, 500, "job %lld has an unreadable spec", (long long)id);
    cJSON_DeleteItemFromObjectCaseSensitive(spec, "resume_from_job");
    cJSON_AddNumberToObject(spec, "resume_from_job", (double)id);
    char *text = cJSON_PrintUnformatted(spec);
    cJSON_Delete(spec);
    int64_t nid = 0;
    char err[256];
    store_lock(j);
    int rc = text ? kiln_jobstore_job_create(j->o.store, text, NULL, &nid, err, sizeof err) : -1;
    store_unlock(j);
    cJSON_free(text);
    if (rc != 0)
        return errorf(out, req, 500, "job store: %s", text ? err : "out of memory");
    emit_state(j, nid, KILN_JOB_QUEUED, NULL, NULL, NULL);
    pthread_mutex_lock(&j->mu);
    j->queued_seq++;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)nid);
    cJSON_AddNumberToObject(o, "resumes", (double)id);
    cJSON_AddStringToObject(o, "state", KILN_JOB_QUEUED);
    return send_json(out, 201, o, req);
}

static int handle_events(struct kiln_jobs *j, int64_t id, const struct kiln_request *req, struct kiln_buf *out)
{
    struct kiln_job job;
    int st = get_job(j, id, &job, req, out);
    if (st)
        return st;
    kiln_jobstore_job_clear(&job);
    int64_t after = 0;
    char num[32];
    if (req->headers && req->headers->last_event_id[0] && !parse_i64(req->headers->last_event_id, &after))
        return errorf(out, req, 400, "Last-Event-ID: must be an event id");
    if (query_param(req, "after", num, sizeof num) && !parse_i64(num, &after))
        return errorf(out, req, 400, "after: must be an event id");
    /* A finished job's stream is known whole: one ordinary response, and the connection stays
     * usable. */
    struct kiln_buf body = {0};
    kiln_buf_puts(&body, "retry: 1000\n\n");
    int64_t last = after;
    if (append_events(j, id, &last, &body)) {
        st = kiln_resp_append(out, 200, "text/event-stream", body.data, body.len, req->keep_alive,
                              "Cache-Control: no-cache\r\n");
        kiln_buf_free(&body);
        return st;
    }
    struct stream *s = calloc(1, sizeof *s);
    struct kiln_http_pending *p = s ? kiln_http_defer(req) : NULL;
    if (!p) {
        free(s);
        kiln_buf_free(&body);
        return errorf(out, req, 500, "out of memory");
    }
    /* The body runs until the connection closes, so the connection cannot be reused. */
    p->keep_alive = false;
    *s = (struct stream){j, id, last, p, j->streams};
    j->streams = s;
    /* The events so far go out with the header. Whatever the training thread appends from now
     * on comes with an async wake-up, so nothing is pumped here (a stream must not finish
     * inside its own handler). */
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                               "X-Accel-Buffering: no\r\nConnection: close\r\n\r\n";
    kiln_buf_append(out, head, sizeof head - 1);
    kiln_buf_append(out, body.data, body.len);
    kiln_buf_free(&body);
    return KILN_HTTP_DEFERRED;
}

int kiln_jobs_handle(void *ctx, const struct kiln_request *req, struct kiln_buf *out)
{
    struct kiln_jobs *j = ctx;
    int st = authorize(j, req, out);
    if (st)
        return st;
    static const char base[] = "/v1/jobs";
    size_t bl = sizeof base - 1;
    const char *rest = req->path + bl;
    size_t rl = req->path_len - bl;
    if (rl == 0 || (rl == 1 && rest[0] == '/')) {
        if (req->method == KILN_HTTP_POST)
            return handle_submit(j, req, out);
        if (req->method == KILN_HTTP_GET)
            return handle_list(j, req, out);
        return errorf(out, req, 405, "/v1/jobs takes GET and POST");
    }
    /* /v1/jobs/{id}[/events|/resume] */
    char tail[64];
    if (rl >= sizeof tail || rest[0] != '/')
        return errorf(out, req, 404, "no such job path");
    memcpy(tail, rest + 1, rl - 1);
    tail[rl - 1] = '\0';
    char *slash = strchr(tail, '/');
    const char *action = "";
    if (slash) {
        *slash = '\0';
        action = slash + 1;
    }
    int64_t id;
    if (!parse_i64(tail, &id) || id < 1)
        return errorf(out, req, 404, "'%s' is not a job id", tail);
    if (!action[0]) {
        if (req->method == KILN_HTTP_GET)
            return handle_get(j, id, req, out);
        if (req->method == KILN_HTTP_DELETE)
            return handle_cancel(j, id, req, out);
        return errorf(out, req, 405, "/v1/jobs/{id} takes GET and DELETE");
    }
    if (!strcmp(action, "events"))
        return req->method == KILN_HTTP_GET ? handle_events(j, id, req, out)
                                            : errorf(out, req, 405, "events take GET");
    if (!strcmp(action, "resume"))
        return req->method == KILN_HTTP_POST ? handle_resume(j, id, req, out)
                                             : errorf(out, req, 405, "resume takes POST");
    return errorf(out, req, 404, "no such job path");
}

/* ---- life cycle ---------------------------------------------------------------------------- */

struct kiln_jobs *kiln_jobs_new(const struct kiln_jobs_options *o, char *err, size_t errlen)
{
    struct kiln_jobs *j = calloc(1, sizeof *j);
    if (!j) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    j->o = *o;
    j->data_dir = realpath(o->data_dir, NULL);
    size_t nr = o->data_roots ? o->data_roots->count : 0;
    j->roots = calloc(nr + 1, sizeof *j->roots);
    if (!j->data_dir || !j->roots) {
        snprintf(err, errlen, "jobs: cannot resolve data_dir %s", o->data_dir);
        free(j->data_dir);
        free(j->roots);
        free(j);
        return NULL;
    }
    j->roots[j->nroots++] = j->data_dir;
    for (size_t i = 0; i < nr; i++)
        if (o->data_roots->items[i][0])
            j->roots[j->nroots++] = o->data_roots->items[i];
    for (size_t i = 0; o->tokens && i < o->tokens->count; i++) {
        j->auth = true;
        if (!j->admin_token[0] && strncmp(o->tokens->items[i], "admin:", 6) == 0)
            snprintf(j->admin_token, sizeof j->admin_token, "%s", o->tokens->items[i] + 6);
    }
    pthread_mutex_init(&j->store_mu, NULL);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    atomic_init(&j->cancel, false);
    uv_async_init(o->loop, &j->async, on_async);
    uv_timer_init(o->loop, &j->ping);
    uv_timer_init(o->loop, &j->load_timer);
    j->async.data = j->ping.data = j->load_timer.data = j;
    j->handles_open = true;
    /* None of these keep the loop alive: it ends when the server's connections have gone. */
    uv_unref((uv_handle_t *)&j->async);
    uv_unref((uv_handle_t *)&j->ping);
    uv_unref((uv_handle_t *)&j->load_timer);
    uv_timer_start(&j->ping, on_ping, PING_MS, PING_MS);

    /* Jobs a previous process was running go back to the queue; they resume from their
     * newest checkpoint when the thread takes them, ahead of newer queued jobs (lower ids). */
    struct kiln_job *jobs = NULL;
    int n = 0;
    if (kiln_jobstore_job_list(o->store, KILN_JOB_RUNNING, 0, 1000, &jobs, &n, err, errlen) == 0) {
        for (int i = 0; i < n; i++) {
            if (kiln_jobstore_job_requeue(o->store, jobs[i].id, err, errlen) == 0) {
                jlog(j, KILN_LOG_INFO, "job %lld was running when kilnd stopped; queued to resume", (long long)jobs[i].id);
                kiln_jobstore_event_append(o->store, jobs[i].id, "state",
                                           "{\"state\":\"queued\",\"reason\":\"kilnd restarted\"}", NULL, NULL, 0);
            }
        }
        kiln_jobstore_job_list_free(jobs, n);
    }
    if (pthread_create(&j->thread, NULL, trainer_main, j) != 0) {
        snprintf(err, errlen, "jobs: cannot start the training thread");
        kiln_jobs_stop(j);
        return j; /* the caller frees it after the loop closed the handles */
    }
    j->thread_started = true;
    return j;
}

void kiln_jobs_drain(struct kiln_jobs *j)
{
    if (!j)
        return;
    while (j->streams)
        stream_end(j, j->streams);
}

void kiln_jobs_stop(struct kiln_jobs *j)
{
    if (!j)
        return;
    pthread_mutex_lock(&j->mu);
    j->stopping = true;
    atomic_store(&j->cancel, true);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (j->thread_started) {
        pthread_join(j->thread, NULL);
        j->thread_started = false;
    }
    kiln_jobs_drain(j);
    if (j->handles_open) {
        uv_close((uv_handle_t *)&j->async, NULL);
        uv_close((uv_handle_t *)&j->ping, NULL);
        uv_close((uv_handle_t *)&j->load_timer, NULL);
        j->handles_open = false;
    }
}

void kiln_jobs_free(struct kiln_jobs *j)
{
    if (!j)
        return;
    while (j->loads) {
        struct load_req *l = j->loads;
        j->loads = l->next;
        kiln_http_conn_free(&l->conn);
        free(l);
    }
    for (int i = 0; i < j->nto_load; i++)
        free(j->to_load[i]);
    pthread_mutex_destroy(&j->store_mu);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j->roots);
    free(j->data_dir);
    free(j);
}
