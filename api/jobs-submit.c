/*
 * api/jobs-submit.c — POST /v1/jobs: the spec checked whole before it is stored, so that a job
 * that is queued can run.
 *
 * Two steps. On the loop: the spec is parsed (JSON, keys given twice, ranges, paths, the job a
 * resume continues), which only reads the body and the file system. Then, on libuv's thread
 * pool, what a spec needs to run at all (kd_jobspec_check_runnable: its device opens, its JSON
 * model builds once on the ref device). Those can take long — a large model's initialisation, a
 * GPU's first context, a remote device's connection — and the loop serves every other client
 * meanwhile, so the response is deferred and written when the check is back on the loop, where
 * the job is stored and queued.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "jobs-impl.h"

/*
 * resume_from_job at submission: the job must exist and have a checkpoint, or the new job would
 * start from step 0 while its spec says it continues (the run fails it if the checkpoint has gone
 * by the time it starts, rather than starting over).
 */
static int resumable(void *ud, int64_t id, char *why, size_t len)
{
    struct kd_jobs *j = ud;
    struct kd_job job;
    char err[256];
    kd_jobs_store_lock(j);
    int rc = kd_jobstore_job_get(j->o.store, id, &job, err, sizeof err);
    kd_jobs_store_unlock(j);
    if (rc == KD_JOBSTORE_NOT_FOUND)
        return snprintf(why, len, "%lld: there is no job %lld", (long long)id, (long long)id), -1;
    if (rc != 0)
        return snprintf(why, len, "%lld: job store: %s", (long long)id, err), -1;
    kd_jobstore_job_clear(&job);
    if (!kd_jobs_has_checkpoint(j, id))
        return snprintf(why, len, "%lld: job %lld has no checkpoint to resume from", (long long)id, (long long)id),
               -1;
    return 0;
}

/* The 400 body for problem lines ("field: message\n..."): {"error": the first, "problems": all}.
 * Consumes problems (its newlines are cut). NULL when out of memory. */
static char *problems_body(char *problems)
{
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
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

/* Store and queue the checked spec (body): 201 {"id", "state"} into out, or an error. */
static int store_job(struct kd_jobs *j, const char *body, struct kd_buf *out, bool keep_alive)
{
    int64_t id = 0;
    char err[256];
    kd_jobs_store_lock(j);
    int rc = kd_jobstore_job_create(j->o.store, body, NULL, &id, err, sizeof err);
    kd_jobs_store_unlock(j);
    if (rc != 0) {
        char msg[320];
        snprintf(msg, sizeof msg, "job store: %s", err);
        return out ? kd_resp_error(out, 500, msg, keep_alive, NULL) : 500;
    }
    kd_jobs_emit_state(j, id, KD_JOB_QUEUED, NULL, NULL, NULL);
    pthread_mutex_lock(&j->mu);
    j->queued_seq++;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    kd_jobs_log(j, KD_LOG_INFO, "job %lld queued", (long long)id);
    if (!out)
        return 201;
    char text[96];
    snprintf(text, sizeof text, "{\"id\":%lld,\"state\":\"%s\"}", (long long)id, KD_JOB_QUEUED);
    return kd_resp_append(out, 201, "application/json", text, strlen(text), keep_alive, NULL);
}

/* A submission whose spec parsed, waiting for kd_jobspec_check_runnable on the thread pool. */
struct submit_op {
    uv_work_t work;
    struct kd_jobs *j;
    struct kd_http_pending *pending;
    char *body; /* the spec as sent: what is stored */
    struct kd_jobspec spec;
    int rc; /* kd_jobspec_check_runnable's */
    char problems[4096];
};

static void check_on_pool(uv_work_t *w)
{
    struct submit_op *op = w->data;
    op->rc = kd_jobspec_check_runnable(&op->spec, op->problems, sizeof op->problems);
}

/* Back on the loop: store the job, or answer the problems. A daemon that began to stop in the
 * meantime stores nothing (its jobs module has closed its loop handles). */
static void check_done(uv_work_t *w, int status)
{
    struct submit_op *op = w->data;
    struct kd_jobs *j = op->j;
    struct kd_buf *out = kd_http_pending_out(op->pending);
    bool keep_alive = kd_http_pending_keep_alive(op->pending);
    pthread_mutex_lock(&j->mu);
    bool stopping = j->stopping;
    pthread_mutex_unlock(&j->mu);
    int st;
    if (status != 0 || stopping) {
        st = out ? kd_resp_error(out, 503, "kilnd is stopping; submit the job again once it is back", keep_alive,
                                 NULL)
                 : 503;
    } else if (op->rc != 0) {
        char *text = problems_body(op->problems);
        st = !out   ? 400
             : text ? kd_resp_append(out, 400, "application/json", text, strlen(text), keep_alive, NULL)
                    : kd_resp_error(out, 500, "out of memory", keep_alive, NULL);
        cJSON_free(text);
    } else {
        /* also when the client has gone: it sent the job, and a retry after a lost answer
         * finds it in GET /v1/jobs */
        st = store_job(j, op->body, out, keep_alive);
    }
    kd_http_pending_finish(op->pending, out ? st : -1);
    kd_jobspec_free(&op->spec);
    free(op->body);
    free(op);
}

int kd_jobs_handle_submit(struct kd_jobs *j, const struct kd_request *req, struct kd_buf *out)
{
    /* The request body is a byte range, not a C string: copy it whole and terminate it
     * (strndup would read past the range looking for a NUL, and stop early at one). */
    if (req->body_len && memchr(req->body, '\0', req->body_len))
        return kd_jobs_errorf(out, req, 400, "job spec: the body contains a NUL byte");
    struct submit_op *op = calloc(1, sizeof *op);
    char *body = op ? malloc(req->body_len + 1) : NULL;
    if (!body) {
        free(op);
        return kd_jobs_errorf(out, req, 500, "out of memory");
    }
    if (req->body_len)
        memcpy(body, req->body, req->body_len);
    body[req->body_len] = '\0';
    struct kd_jobspec_env env = kd_jobs_spec_env(j);
    env.submit = true;
    env.resumable = resumable;
    env.resumable_ud = j;
    if (kd_jobspec_parse(body, &env, &op->spec, op->problems, sizeof op->problems) != 0) {
        free(body);
        char *text = problems_body(op->problems);
        free(op);
        int rc = text ? kd_resp_append(out, 400, "application/json", text, strlen(text), req->keep_alive, NULL)
                      : kd_resp_error(out, 500, "out of memory", req->keep_alive, NULL);
        cJSON_free(text);
        return rc;
    }
    op->j = j;
    op->body = body;
    op->work.data = op;
    op->pending = kd_http_defer(req);
    if (!op->pending) {
        kd_jobspec_free(&op->spec);
        free(body);
        free(op);
        return kd_jobs_errorf(out, req, 500, "out of memory");
    }
    int rc = uv_queue_work(j->o.loop, &op->work, check_on_pool, check_done);
    if (rc != 0) { /* the response is deferred already: it goes where a late one would */
        struct kd_buf *late = kd_http_pending_out(op->pending);
        char msg[160];
        snprintf(msg, sizeof msg, "cannot check the job spec: %s", uv_strerror(rc));
        int st = late ? kd_resp_error(late, 500, msg, kd_http_pending_keep_alive(op->pending), NULL) : -1;
        kd_http_pending_finish(op->pending, st);
        kd_jobspec_free(&op->spec);
        free(body);
        free(op);
    }
    return KD_HTTP_DEFERRED;
}
