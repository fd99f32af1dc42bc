/*
 * api/jobs-routes.c — the /v1/jobs routes: the bearer-token check, list, get, cancel, resume, and
 * the dispatch by path and method (submit in jobs-submit.c, events in jobs-events.c, metrics and
 * logs in jobs-history.c).
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

/* A query parameter's value (bounded copy); false when absent. */
bool kd_jobs_query_param(const struct kd_request *req, const char *key, char *val, size_t len)
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

static cJSON *job_summary(const struct kd_job *job)
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

static int handle_list(struct kd_jobs *j, const struct kd_request *req, struct kd_buf *out)
{
    char state[32] = "", num[32];
    int64_t after = 0, limit = 50;
    if (kd_jobs_query_param(req, "state", state, sizeof state) && strcmp(state, KD_JOB_QUEUED) &&
        strcmp(state, KD_JOB_RUNNING) && !kd_jobs_final_state(state))
        return kd_jobs_errorf(out, req, 400, "state: must be queued, running, succeeded, failed or cancelled");
    if (kd_jobs_query_param(req, "after", num, sizeof num) && !kd_jobs_parse_i64(num, &after))
        return kd_jobs_errorf(out, req, 400, "after: must be a job id");
    if (kd_jobs_query_param(req, "limit", num, sizeof num) &&
        (!kd_jobs_parse_i64(num, &limit) || limit < 1 || limit > 1000))
        return kd_jobs_errorf(out, req, 400, "limit: must be within 1..1000");
    struct kd_job *jobs = NULL;
    int n = 0;
    char err[256];
    kd_jobs_store_lock(j);
    int rc = kd_jobstore_job_list(j->o.store, state[0] ? state : NULL, after, (int)limit, &jobs, &n, err,
                                  sizeof err);
    kd_jobs_store_unlock(j);
    if (rc != 0)
        return kd_jobs_errorf(out, req, 500, "job store: %s", err);
    cJSON *o = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(o, "jobs");
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(arr, job_summary(&jobs[i]));
    if (n == limit)
        cJSON_AddNumberToObject(o, "next_after", (double)jobs[n - 1].id);
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
        return kd_jobs_errorf(out, req, 500, "job store: %s", err);
    return 0;
}

static int handle_get(struct kd_jobs *j, int64_t id, const struct kd_request *req, struct kd_buf *out)
{
    struct kd_job job;
    int st = kd_jobs_get_job(j, id, &job, req, out);
    if (st)
        return st;
    cJSON *o = job_summary(&job);
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
        return kd_jobs_errorf(out, req, 409, "job %lld is already %s", (long long)id, state);
    pthread_mutex_lock(&j->mu);
    bool finishing = j->finishing == id;
    bool running = j->current == id && !finishing;
    if (running)
        atomic_store(&j->cancel, true);
    pthread_mutex_unlock(&j->mu);
    if (finishing)
        return kd_jobs_errorf(
            out, req, 409, "job %lld has finished training; its model is being loaded for serving", (long long)id);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)id);
    if (running) {
        /* The Learner stops before its next step; the state turns cancelled then. */
        cJSON_AddStringToObject(o, "state", "cancelling");
        return kd_jobs_send_json(out, 202, o, req);
    }
    /* Queued (a job the thread has not taken yet, or just finished: the store decides). */
    if (kd_jobs_transition(j, id, KD_JOB_CANCELLED, NULL, NULL, NULL) != 0) {
        cJSON_Delete(o);
        return kd_jobs_errorf(out, req, 409, "job %lld could not be cancelled; it may have just finished",
                              (long long)id);
    }
    cJSON_AddStringToObject(o, "state", KD_JOB_CANCELLED);
    return kd_jobs_send_json(out, 200, o, req);
}

static int handle_resume(struct kd_jobs *j, int64_t id, const struct kd_request *req, struct kd_buf *out)
{
    struct kd_job job;
    int st = kd_jobs_get_job(j, id, &job, req, out);
    if (st)
        return st;
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
    char err[256];
    kd_jobs_store_lock(j);
    int rc = text ? kd_jobstore_job_create(j->o.store, text, NULL, &nid, err, sizeof err) : -1;
    kd_jobs_store_unlock(j);
    cJSON_free(text);
    if (rc != 0)
        return kd_jobs_errorf(out, req, 500, "job store: %s", text ? err : "out of memory");
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
    if (rl == 0 || (rl == 1 && rest[0] == '/')) {
        if (req->method == KD_HTTP_POST)
            return kd_jobs_handle_submit(j, req, out);
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
    }
    int64_t id;
    if (!kd_jobs_parse_i64(tail, &id) || id < 1)
        return kd_jobs_errorf(out, req, 404, "'%s' is not a job id", tail);
    if (!action[0]) {
        if (req->method == KD_HTTP_GET)
            return handle_get(j, id, req, out);
        if (req->method == KD_HTTP_DELETE)
            return handle_cancel(j, id, req, out);
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
