/*
 * api/jobs-routes.c — the /v1/jobs routes: the bearer-token check, list, get, cancel, resume, and
 * the dispatch by path and method (submit in jobs-submit.c, events in jobs-events.c, metrics and
 * logs in jobs-history.c, DELETE ...?purge=true in jobs-purge.c).
 */
#include <ctype.h>
#include <stdatomic.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "jobs-impl.h"

/* ---- HTTP ---------------------------------------------------------------------------------- */

/* Jobs need the admin scope once tokens are configured. 0, or the status of the answer given. */
static int authorize(struct kd_jobs *j, const struct kd_request *req, struct kd_buf *out)
{
    return kd_auth_require(j->auth, req, KD_AUTH_ADMIN, "training jobs need a token with the admin scope", out);
}

int kd_jobs_send_json(struct kd_buf *out, int status, cJSON *o, const struct kd_request *req)
{
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!text)
        return kd_resp_error(out, 500, "out of memory", req->keep_alive, NULL);
    int rc = kd_resp_append(out, status, "application/json", text, strlen(text), req->keep_alive, NULL);
    cJSON_free(text);
    return rc;
}

int kd_jobs_errorf(struct kd_buf *out, const struct kd_request *req, int status, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kd_resp_error(out, status, msg, req->keep_alive, NULL);
}

int kd_jobs_store_errorf(struct kd_jobs *j, struct kd_buf *out, const struct kd_request *req, int code,
                         int fallback, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int status = kd_jobs_store_status(code, fallback);
    /* The access log shows only the status; what the store said is for whoever runs kilnd too,
     * who may not see the client's answer. A full disk is the operator's to mend: a warning. */
    kd_jobs_log(j, status == 507 ? KD_LOG_WARN : KD_LOG_ERROR, "%.*s: %d %s", (int)req->path_len, req->path,
                status, msg);
    return kd_resp_error(out, status, msg, req->keep_alive, NULL);
}

#define KD_JOBS_STR_(x) #x
#define KD_JOBS_STR(x) KD_JOBS_STR_(x)

static int hex_digit(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* Percent-decode [s, end) into out (at most cap bytes and a NUL; '+' is a space, as forms send
 * it). 0; -1 for a bad escape or a decoded NUL; -2 when it does not fit. */
static int url_decode(const char *s, const char *end, char *out, size_t cap)
{
    size_t n = 0;
    for (; s < end; s++) {
        char c = *s;
        if (c == '%') {
            int hi = end - s > 2 ? hex_digit(s[1]) : -1, lo = end - s > 2 ? hex_digit(s[2]) : -1;
            if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
                return -1;
            c = (char)(hi * 16 + lo);
            s += 2;
        } else if (c == '+') {
            c = ' ';
        }
        if (n == cap)
            return -2;
        out[n++] = c;
    }
    out[n] = '\0';
    return 0;
}

int kd_jobs_query_read(const struct kd_request *req, const char *const *allowed, struct kd_jobs_query *q,
                       struct kd_buf *out)
{
    q->n = 0;
    const char *p = req->query, *end = p ? p + req->query_len : NULL;
    while (p && p < end) {
        const char *amp = memchr(p, '&', (size_t)(end - p));
        const char *stop = amp ? amp : end;
        const char *eq = memchr(p, '=', (size_t)(stop - p));
        if (stop == p) { /* "a=1&&b=2": an empty piece says nothing */
            p = stop + 1;
            continue;
        }
        char key[sizeof q->params[0].key];
        int rk = url_decode(p, eq ? eq : stop, key, sizeof key - 1);
        if (rk != 0)
            return kd_jobs_errorf(out, req, 400, "query: the parameter name '%.*s' is %s",
                                  (int)((eq ? eq : stop) - p), p,
                                  rk == -2 ? "too long" : "not valid percent-encoding");
        bool known = false;
        for (int i = 0; allowed && allowed[i] && !known; i++)
            known = strcmp(allowed[i], key) == 0;
        if (!known) {
            char list[160] = "";
            for (int i = 0; allowed && allowed[i]; i++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", allowed[i]);
            return kd_jobs_errorf(out, req, 400, "query: unknown parameter '%s' (%s%s)", key,
                                  list[0] ? "this path takes " : "this path takes none", list);
        }
        if (kd_jobs_query_get(q, key))
            return kd_jobs_errorf(out, req, 400, "query: '%s' is given more than once", key);
        if (q->n == KD_JOBS_QUERY_MAX)
            return kd_jobs_errorf(out, req, 400, "query: too many parameters");
        memcpy(q->params[q->n].key, key, sizeof key);
        int rv = eq ? url_decode(eq + 1, stop, q->params[q->n].value, KD_JOBS_QUERY_VALUE_MAX) : 0;
        if (!eq)
            q->params[q->n].value[0] = '\0';
        if (rv != 0)
            return kd_jobs_errorf(out, req, 400, "%s: %s", key,
                                  rv == -2
                                      ? "the value is longer than " KD_JOBS_STR(KD_JOBS_QUERY_VALUE_MAX) " bytes"
                                      : "the value is not valid percent-encoding");
        q->n++;
        p = amp ? amp + 1 : end;
    }
    return 0;
}

const char *kd_jobs_query_get(const struct kd_jobs_query *q, const char *key)
{
    for (int i = 0; i < q->n; i++)
        if (strcmp(q->params[i].key, key) == 0)
            return q->params[i].value;
    return NULL;
}

bool kd_jobs_parse_i64(const char *s, int64_t *v)
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

/* job as listed; its state as the daemon knows it (an unsaved final state overlaid already). */
static cJSON *job_summary(struct kd_jobs *j, const struct kd_job *job)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)job->id);
    cJSON_AddStringToObject(o, "state", job->state);
    char unsaved[16];
    if (kd_jobs_unsaved_state(j, job->id, unsaved, sizeof unsaved, NULL, 0))
        cJSON_AddFalseToObject(o, "state_saved");
    if (job->cancel_requested_ms && !kd_jobs_final_state(job->state))
        cJSON_AddNumberToObject(o, "cancel_requested_ms", (double)job->cancel_requested_ms);
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

static int handle_list(struct kd_jobs *j, const struct kd_request *req, struct kd_buf *out)
{
    static const char *const params[] = {"state", "after", "limit", NULL};
    struct kd_jobs_query q;
    int st = kd_jobs_query_read(req, params, &q, out);
    if (st)
        return st;
    const char *state = kd_jobs_query_get(&q, "state"), *num;
    int64_t after = 0, limit = 50;
    if (state && strcmp(state, KD_JOB_QUEUED) && strcmp(state, KD_JOB_RUNNING) && !kd_jobs_final_state(state))
        return kd_jobs_errorf(out, req, 400, "state: must be queued, running, succeeded, failed or cancelled");
    if ((num = kd_jobs_query_get(&q, "after")) && !kd_jobs_parse_i64(num, &after))
        return kd_jobs_errorf(out, req, 400, "after: must be a job id");
    if ((num = kd_jobs_query_get(&q, "limit")) && (!kd_jobs_parse_i64(num, &limit) || limit < 1 || limit > 1000))
        return kd_jobs_errorf(out, req, 400, "limit: must be within 1..1000");
    struct kd_job *jobs = NULL;
    int n = 0;
    char err[256];
    /* One row more than the page: whether it exists says whether this page is the last. */
    kd_jobs_store_lock(j);
    int rc = kd_jobstore_job_list(j->o.store, state, after, (int)limit + 1, &jobs, &n, err, sizeof err);
    kd_jobs_store_unlock(j);
    if (rc != 0)
        return kd_jobs_store_errorf(j, out, req, rc, 500, "job store: %s", err);
    bool more = n > limit;
    int shown = more ? (int)limit : n;
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "jobs");
    for (int i = 0; i < shown; i++) {
        /* A final state the store has not taken yet stands; it no longer matches a filter on
         * the stored one. */
        if (kd_jobs_overlay_unsaved(j, &jobs[i]) && state && strcmp(state, jobs[i].state) != 0)
            continue;
        cJSON_AddItemToArray(arr, job_summary(j, &jobs[i]));
    }
    if (more)
        cJSON_AddNumberToObject(o, "next_after", (double)jobs[shown - 1].id);
    else
        cJSON_AddNullToObject(o, "next_after");
    kd_jobstore_job_list_free(jobs, n);
    return kd_jobs_send_json(out, 200, o, req);
}

int kd_jobs_get_job(struct kd_jobs *j, int64_t id, struct kd_job *job, const struct kd_request *req,
                    struct kd_buf *out)
{
    char err[256];
    kd_jobs_store_lock(j);
    int rc = kd_jobstore_job_get(j->o.store, id, job, err, sizeof err);
    kd_jobs_store_unlock(j);
    if (rc == KD_JOBSTORE_NOT_FOUND)
        return kd_jobs_errorf(out, req, 404, "no job %lld", (long long)id);
    if (rc != 0)
        return kd_jobs_store_errorf(j, out, req, rc, 500, "job store: %s", err);
    kd_jobs_overlay_unsaved(j, job);
    return 0;
}

static int handle_get(struct kd_jobs *j, int64_t id, const struct kd_request *req, struct kd_buf *out)
{
    struct kd_job job;
    int st = kd_jobs_get_job(j, id, &job, req, out);
    if (st)
        return st;
    cJSON *o = job_summary(j, &job);
    cJSON *spec = cJSON_Parse(job.spec);
    if (spec)
        cJSON_AddItemToObject(o, "spec", spec);
    /* The latest step and epoch metrics and the registered model come from the events. */
    struct kd_job_event *ev = NULL;
    int n = 0;
    cJSON *step = NULL, *epoch = NULL, *model = NULL, *logs = cJSON_CreateArray();
    for (int64_t after = 0;;) {
        kd_jobs_store_lock(j);
        int rc = kd_jobstore_events_since(j->o.store, id, after, 2000, &ev, &n, NULL, 0);
        kd_jobs_store_unlock(j);
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
        kd_jobstore_events_free(ev, n);
        if (n < 2000)
            break;
    }
    cJSON_AddItemToObject(o, "latest_step", step ? step : cJSON_CreateNull());
    cJSON_AddItemToObject(o, "latest_epoch", epoch ? epoch : cJSON_CreateNull());
    cJSON_AddItemToObject(o, "model", model ? model : cJSON_CreateNull());
    cJSON_AddItemToObject(o, "logs", logs);
    cJSON *cks = cJSON_AddArrayToObject(o, "checkpoints");
    char *dir = kd_jobs_path(j->data_dir, "checkpoints/job-%lld", (long long)id);
    kiln_ckpt_info *list = NULL;
    int nl = 0;
    if (kd_jobs_dir_exists(dir) && kiln_ckpt_list(dir, false, NULL, &list, &nl) == 0) {
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
    kd_jobstore_job_clear(&job);
    return kd_jobs_send_json(out, 200, o, req);
}

/* The running job id: its cancel is stored, then the training thread told. 0 (not the current
 * job), or the status of the answer written. */
static int cancel_current(struct kd_jobs *j, int64_t id, const struct kd_request *req, struct kd_buf *out)
{
    char err[256];
    int rc = 0;
    pthread_mutex_lock(&j->mu);
    bool current = j->current == id, decided = j->finishing == id;
    if (current && !decided) {
        /* Stored first, under mu: the trainer decides the outcome under mu too, so a cancel
         * is either seen by that decision or refused below, never accepted and then lost. */
        kd_jobs_store_lock(j);
        rc = kd_jobstore_job_request_cancel(j->o.store, id, err, sizeof err);
        kd_jobs_store_unlock(j);
        if (rc == 0) {
            j->cancel_requested = true;
            atomic_store(&j->cancel, true);
        }
    }
    pthread_mutex_unlock(&j->mu);
    if (!current)
        return 0;
    if (decided)
        return kd_jobs_errorf(
            out, req, 409,
            "job %lld has finished training; its result is being recorded (a model it registered "
            "is being loaded for serving), so it ends succeeded or failed",
            (long long)id);
    if (rc != 0)
        return kd_jobs_store_errorf(j, out, req, rc, 503,
                                    "job %lld: the cancel could not be stored, so it was not made: %s",
                                    (long long)id, err);
    kd_jobs_log(j, KD_LOG_INFO, "job %lld: cancel requested", (long long)id);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)id);
    /* The Learner stops before its next step; the state turns cancelled then. */
    cJSON_AddStringToObject(o, "state", "cancelling");
    return kd_jobs_send_json(out, 202, o, req);
}

/* A DELETE without purge of a job that has ended: nothing to cancel, and how to remove it. */
static int ended_answer(int64_t id, const char *state, const struct kd_request *req, struct kd_buf *out)
{
    return kd_jobs_errorf(out, req, 409,
                          "job %lld is already %s: it has ended, so there is nothing to cancel; "
                          "DELETE /v1/jobs/%lld?purge=true removes the job with its checkpoints, metrics and "
                          "events",
                          (long long)id, state, (long long)id);
}

static int handle_cancel(struct kd_jobs *j, int64_t id, const struct kd_request *req, struct kd_buf *out)
{
    struct kd_job job;
    int st = kd_jobs_get_job(j, id, &job, req, out);
    if (st)
        return st;
    char state[32];
    snprintf(state, sizeof state, "%s", job.state);
    kd_jobstore_job_clear(&job);
    if (kd_jobs_final_state(state))
        return ended_answer(id, state, req, out);
    if ((st = cancel_current(j, id, req, out)) != 0)
        return st;
    /* Not the job being trained: a queued one is cancelled at once, in a transaction that
     * checks it is still queued (the trainer may have just taken it). */
    char *text = kd_jobs_state_payload(KD_JOB_CANCELLED, NULL, NULL, NULL);
    char err[256];
    kd_jobs_store_lock(j);
    int rc = text ? kd_jobstore_job_transition_from(j->o.store, id, KD_JOB_QUEUED, KD_JOB_CANCELLED, NULL, text,
                                                    NULL, err, sizeof err)
                  : -1;
    int got = rc != 0 ? kd_jobstore_job_get(j->o.store, id, &job, NULL, 0) : 1;
    kd_jobs_store_unlock(j);
    if (!text)
        snprintf(err, sizeof err, "out of memory");
    cJSON_free(text);
    if (rc == 0) {
        uv_async_send(&j->async);
        kd_jobs_apply_retention_soon(j); /* a job has ended */
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", (double)id);
        cJSON_AddStringToObject(o, "state", KD_JOB_CANCELLED);
        return kd_jobs_send_json(out, 200, o, req);
    }
    snprintf(state, sizeof state, "%s", got == 0 ? job.state : "");
    if (got == 0)
        kd_jobstore_job_clear(&job);
    if (!strcmp(state, KD_JOB_RUNNING) && (st = cancel_current(j, id, req, out)) != 0)
        return st; /* the trainer took it meanwhile */
    if (kd_jobs_final_state(state))
        return ended_answer(id, state, req, out);
    if (!strcmp(state, KD_JOB_RUNNING))
        return kd_jobs_errorf(out, req, 409,
                              "job %lld is recorded running but is not being trained; the next start "
                              "resumes it",
                              (long long)id);
    return kd_jobs_store_errorf(j, out, req, rc, 503,
                                "job %lld: the cancel could not be stored, so it was not made: %s", (long long)id,
                                err);
}

/* Whether the request carries a body of anything but whitespace: resume and DELETE take none,
 * and a setting sent there (a new epoch count) would otherwise be silently ignored. */
static bool has_body(const struct kd_request *req)
{
    for (size_t i = 0; i < req->body_len; i++) {
        char c = req->body[i];
        if (c != ' ' && c != '\t' && c != '\r' && c != '\n')
            return true;
    }
    return false;
}

static int handle_resume(struct kd_jobs *j, int64_t id, const struct kd_request *req, struct kd_buf *out)
{
    if (has_body(req))
        return kd_jobs_errorf(out, req, 400,
                              "resume takes no body: it continues job %lld's own spec from its newest "
                              "checkpoint; to change a setting, submit a spec with \"resume_from_job\": %lld",
                              (long long)id, (long long)id);
    struct kd_job job;
    int st = kd_jobs_get_job(j, id, &job, req, out);
    if (st)
        return st;
    char unsaved[16];
    if (kd_jobs_unsaved_state(j, id, unsaved, sizeof unsaved, NULL, 0)) {
        kd_jobstore_job_clear(&job);
        return kd_jobs_errorf(out, req, 409,
                              "job %lld is %s, but the job store has not taken that yet; resume it once it has",
                              (long long)id, unsaved);
    }
    if (strcmp(job.state, KD_JOB_FAILED) != 0 && strcmp(job.state, KD_JOB_CANCELLED) != 0) {
        st = kd_jobs_errorf(out, req, 409, "job %lld is %s; only failed or cancelled jobs resume", (long long)id,
                            job.state);
        kd_jobstore_job_clear(&job);
        return st;
    }
    if (!kd_jobs_has_checkpoint(j, id)) {
        kd_jobstore_job_clear(&job);
        return kd_jobs_errorf(out, req, 409,
                              "job %lld has no checkpoint to resume from; submit its spec again to start over",
                              (long long)id);
    }
    /* One continuation at a time: two would each train on and register a version. */
    int64_t ids[8];
    int nc = 0;
    char err[256];
    kd_jobs_store_lock(j);
    int rc = kd_jobstore_job_continuations(j->o.store, id, ids, 8, &nc, err, sizeof err);
    kd_jobs_store_unlock(j);
    for (int i = 0; rc == 0 && i < nc; i++) {
        char s[16];
        if (kd_jobs_unsaved_state(j, ids[i], s, sizeof s, NULL, 0))
            continue; /* final already, though not stored yet */
        kd_jobstore_job_clear(&job);
        return kd_jobs_errorf(out, req, 409, "job %lld is continued by job %lld already, which has not ended",
                              (long long)id, (long long)ids[i]);
    }
    if (rc != 0) {
        kd_jobstore_job_clear(&job);
        return kd_jobs_store_errorf(j, out, req, rc, 500, "job store: %s", err);
    }
    /* A final state is never left, so the continuation is a new job carrying the old one's
     * spec and starting from its newest checkpoint. */
    cJSON *spec = cJSON_Parse(job.spec);
    kd_jobstore_job_clear(&job);
    if (!spec)
        return kd_jobs_errorf(out, req, 500, "job %lld has an unreadable spec", (long long)id);
    cJSON_DeleteItemFromObjectCaseSensitive(spec, "resume_from_job");
    cJSON_AddNumberToObject(spec, "resume_from_job", (double)id);
    char *text = cJSON_PrintUnformatted(spec);
    cJSON_Delete(spec);
    int64_t nid = 0;
    rc = text ? kd_jobs_create(j, text, id, &nid, err, sizeof err) : -1;
    cJSON_free(text);
    if (rc == KD_JOBSTORE_NOT_FOUND)
        return kd_jobs_errorf(out, req, 404, "no job %lld: %s", (long long)id, err);
    if (rc != 0)
        return kd_jobs_store_errorf(j, out, req, rc, 500, "job store: %s", text ? err : "out of memory");
    kd_jobs_emit_state(j, nid, KD_JOB_QUEUED, NULL, NULL, NULL);
    pthread_mutex_lock(&j->mu);
    j->queued_seq++;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)nid);
    cJSON_AddNumberToObject(o, "resumes", (double)id);
    cJSON_AddStringToObject(o, "state", KD_JOB_QUEUED);
    return kd_jobs_send_json(out, 201, o, req);
}

int kd_jobs_handle(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    struct kd_jobs *j = ctx;
    int st = authorize(j, req, out);
    if (st)
        return st;
    static const char base[] = "/v1/jobs";
    size_t bl = sizeof base - 1;
    const char *rest = req->path + bl;
    size_t rl = req->path_len - bl;
    struct kd_jobs_query none;
    if (rl == 0 || (rl == 1 && rest[0] == '/')) {
        if (req->method == KD_HTTP_POST)
            return (st = kd_jobs_query_read(req, NULL, &none, out)) ? st : kd_jobs_handle_submit(j, req, out);
        if (req->method == KD_HTTP_GET)
            return handle_list(j, req, out);
        return kd_jobs_errorf(out, req, 405, "/v1/jobs takes GET and POST");
    }
    /* /v1/jobs/{id}[/events|/metrics|/logs|/resume] */
    char tail[64];
    if (rl >= sizeof tail || rest[0] != '/')
        return kd_jobs_errorf(out, req, 404, "no such job path");
    memcpy(tail, rest + 1, rl - 1);
    tail[rl - 1] = '\0';
    char *slash = strchr(tail, '/');
    const char *action = "";
    if (slash) {
        *slash = '\0';
        action = slash + 1;
        if (!action[0]) /* a trailing slash names no resource, as on /v2/health/ */
            return kd_jobs_errorf(out, req, 404, "no such job path (no '/' after the job id)");
    }
    int64_t id;
    /* written as the server writes ids: digits, no sign, no leading zero ("01" and "+1" are
     * not ids, as "01" is no model version) */
    if (!isdigit((unsigned char)tail[0]) || tail[0] == '0' || !kd_jobs_parse_i64(tail, &id) || id < 1)
        return kd_jobs_errorf(out, req, 404, "'%s' is not a job id", tail);
    static const char *const delete_params[] = {"purge", NULL};
    bool deleting = !action[0] && req->method == KD_HTTP_DELETE;
    struct kd_jobs_query q = {.n = 0};
    if ((!action[0] || !strcmp(action, "resume")) &&
        (st = kd_jobs_query_read(req, deleting ? delete_params : NULL, &q, out)) != 0)
        return st;
    if (!action[0]) {
        if (req->method == KD_HTTP_GET)
            return handle_get(j, id, req, out);
        if (req->method == KD_HTTP_DELETE) {
            if (has_body(req))
                return kd_jobs_errorf(out, req, 400,
                                      "DELETE /v1/jobs/{id} takes no body (?purge=true removes an ended job)");
            const char *purge = kd_jobs_query_get(&q, "purge");
            if (purge && strcmp(purge, "true") != 0 && strcmp(purge, "false") != 0)
                return kd_jobs_errorf(out, req, 400,
                                      "purge: must be true or false, not '%s' (purge=true removes an ended job)",
                                      purge);
            return purge && !strcmp(purge, "true") ? kd_jobs_handle_purge(j, id, req, out)
                                                   : handle_cancel(j, id, req, out);
        }
        return kd_jobs_errorf(out, req, 405, "/v1/jobs/{id} takes GET and DELETE");
    }
    if (!strcmp(action, "events"))
        return req->method == KD_HTTP_GET ? kd_jobs_handle_events(j, id, req, out)
                                          : kd_jobs_errorf(out, req, 405, "events take GET");
    if (!strcmp(action, "metrics"))
        return req->method == KD_HTTP_GET ? kd_jobs_handle_metrics(j, id, req, out)
                                          : kd_jobs_errorf(out, req, 405, "metrics take GET");
    if (!strcmp(action, "logs"))
        return req->method == KD_HTTP_GET ? kd_jobs_handle_logs(j, id, req, out)
                                          : kd_jobs_errorf(out, req, 405, "logs take GET");
    if (!strcmp(action, "resume"))
        return req->method == KD_HTTP_POST ? handle_resume(j, id, req, out)
                                           : kd_jobs_errorf(out, req, 405, "resume takes POST");
    return kd_jobs_errorf(out, req, 404, "no such job path");
}
