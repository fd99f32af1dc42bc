/*
 * api/jobs-store-glue.c — what the loop and the training thread share: the job store behind
 * its lock, events (appended, then the loop is poked to push them to the streams), state
 * changes, the log, and the paths under the data directory.
 */
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

#include "logf.h"
#include "jobs-impl.h"

void kd_jobs_log(struct kd_jobs *j, enum kd_log_level l, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kd_api_logv(j->o.log, j->o.log_ud, l, fmt, ap);
    va_end(ap);
}

/* ---- the store, shared --------------------------------------------------------------------- */

void kd_jobs_store_lock(struct kd_jobs *j)
{
    pthread_mutex_lock(&j->store_mu);
}

void kd_jobs_store_unlock(struct kd_jobs *j)
{
    pthread_mutex_unlock(&j->store_mu);
}

int kd_jobs_create(struct kd_jobs *j, const char *spec, int64_t resumes, int64_t *id, char *err, size_t errlen)
{
    bool exists = true;
    kd_jobs_store_lock(j);
    /* a purge holds the same lock while it checks that no queued job resumes from its job */
    int rc = resumes > 0 ? kd_jobstore_job_exists(j->o.store, resumes, &exists, err, errlen) : 0;
    if (rc == 0 && !exists) {
        snprintf(err, errlen, "job %lld was purged meanwhile; there is nothing to resume from",
                 (long long)resumes);
        rc = KD_JOBSTORE_NOT_FOUND;
    }
    if (rc == 0)
        rc = kd_jobstore_job_create(j->o.store, spec, NULL, id, err, errlen);
    kd_jobs_store_unlock(j);
    return rc;
}

/* Append an event and tell the loop; from either thread. */
void kd_jobs_emit(struct kd_jobs *j, int64_t id, const char *type, const char *payload)
{
    char err[256];
    kd_jobs_store_lock(j);
    int rc = kd_jobstore_event_append(j->o.store, id, type, payload, NULL, err, sizeof err);
    kd_jobs_store_unlock(j);
    if (rc != 0)
        kd_jobs_log(j, KD_LOG_WARN, "job %lld: event not stored: %s", (long long)id, err);
    uv_async_send(&j->async);
}

char *kd_jobs_state_payload(const char *state, const char *error, const char *extra_key, const char *extra_json)
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
    return text;
}

void kd_jobs_emit_state(struct kd_jobs *j, int64_t id, const char *state, const char *error, const char *extra_key,
                        const char *extra_json)
{
    char *text = kd_jobs_state_payload(state, error, extra_key, extra_json);
    if (text)
        kd_jobs_emit(j, id, "state", text);
    cJSON_free(text);
}

int kd_jobs_transition(struct kd_jobs *j, int64_t id, const char *state, const char *error, const char *extra_key,
                       const char *extra_json)
{
    char err[256];
    char *text = kd_jobs_state_payload(state, error, extra_key, extra_json);
    if (!text) {
        kd_jobs_log(j, KD_LOG_WARN, "job %lld: out of memory moving it to %s", (long long)id, state);
        return -1;
    }
    kd_jobs_store_lock(j);
    int rc = kd_jobstore_job_transition(j->o.store, id, state, error, text, NULL, err, sizeof err);
    kd_jobs_store_unlock(j);
    if (rc == 0) {
        cJSON_free(text);
        uv_async_send(&j->async);
        return 0;
    }
    kd_jobs_log(j, KD_LOG_WARN, "job %lld: %s", (long long)id, err);
    struct kd_jobs_unsaved *u = kd_jobs_final_state(state) ? calloc(1, sizeof *u) : NULL;
    if (u) {
        u->id = id;
        snprintf(u->state, sizeof u->state, "%s", state);
        snprintf(u->why, sizeof u->why, "%s", err);
        u->error = error ? strdup(error) : NULL;
        u->payload = strdup(text);
        if (kd_jobs_keep_unsaved(j, u))
            rc = 0; /* the state stands; its write is pending */
    }
    cJSON_free(text);
    return rc;
}

/* ---- final states the store refused --------------------------------------------------------- */

static void unsaved_free(struct kd_jobs_unsaved *u)
{
    free(u->error);
    free(u->payload);
    free(u->metrics_json);
    free(u->model_payload);
    free(u);
}

/* Write u; 0 written, 1 refused for good (the job is final in the store or gone), -1 not written. */
static int unsaved_write(struct kd_jobs *j, struct kd_jobs_unsaved *u)
{
    char err[256];
    struct kd_job job;
    kd_jobs_store_lock(j);
    int rc = u->name[0]
                 ? kd_jobstore_job_succeed_with_model(j->o.store, u->id, u->name, u->version, u->metrics_json,
                                                      u->model_payload, u->payload, err, sizeof err)
                 : kd_jobstore_job_transition(j->o.store, u->id, u->state, u->error, u->payload, NULL, err,
                                              sizeof err);
    /* A refusal and a failed write look alike; the state read back tells them apart. */
    int got = rc != 0 ? kd_jobstore_job_get(j->o.store, u->id, &job, NULL, 0) : 0;
    kd_jobs_store_unlock(j);
    if (rc == 0)
        return 0;
    snprintf(u->why, sizeof u->why, "%s", err);
    bool gone = got == KD_JOBSTORE_NOT_FOUND || (got == 0 && kd_jobs_final_state(job.state));
    if (got == 0)
        kd_jobstore_job_clear(&job);
    return gone ? 1 : -1;
}

bool kd_jobs_keep_unsaved(struct kd_jobs *j, struct kd_jobs_unsaved *u)
{
    if (!u->payload || (u->name[0] && !u->model_payload)) {
        kd_jobs_log(j, KD_LOG_ERROR, "job %lld: out of memory keeping its final state %s", (long long)u->id,
                    u->state);
        unsaved_free(u);
        return false;
    }
    struct kd_job job;
    kd_jobs_store_lock(j);
    int got = kd_jobstore_job_get(j->o.store, u->id, &job, NULL, 0);
    kd_jobs_store_unlock(j);
    bool refused = got == KD_JOBSTORE_NOT_FOUND || (got == 0 && kd_jobs_final_state(job.state));
    if (got == 0)
        kd_jobstore_job_clear(&job);
    if (refused) {
        unsaved_free(u);
        return false;
    }
    kd_jobs_log(
        j, KD_LOG_ERROR,
        "job %lld is %s, but the job store did not take it (%s); kilnd keeps the state and writes it again "
        "until the store does",
        (long long)u->id, u->state, u->why);
    pthread_mutex_lock(&j->mu);
    struct kd_jobs_unsaved **tail = &j->unsaved;
    while (*tail)
        tail = &(*tail)->next;
    *tail = u;
    pthread_mutex_unlock(&j->mu);
    uv_async_send(&j->async); /* the loop starts the retry timer */
    return true;
}

int kd_jobs_retry_unsaved(struct kd_jobs *j, bool notify)
{
    int left = 0, written = 0;
    /* mu is held through the writes, so a reader never finds the job in neither place. */
    pthread_mutex_lock(&j->mu);
    for (struct kd_jobs_unsaved **pp = &j->unsaved; *pp;) {
        struct kd_jobs_unsaved *u = *pp;
        int rc = unsaved_write(j, u);
        if (rc < 0) {
            left++;
            pp = &u->next;
            continue;
        }
        if (rc == 0 && ++written)
            kd_jobs_log(j, KD_LOG_INFO, "job %lld: its final state %s is stored now", (long long)u->id, u->state);
        else
            kd_jobs_log(j, KD_LOG_WARN, "job %lld: its final state %s was not stored: %s", (long long)u->id,
                        u->state, u->why);
        *pp = u->next;
        unsaved_free(u);
    }
    pthread_mutex_unlock(&j->mu);
    if (written && notify)
        uv_async_send(&j->async); /* streams waiting for a final event */
    return left;
}

bool kd_jobs_unsaved_state(struct kd_jobs *j, int64_t id, char *state, size_t len, char *error, size_t errlen)
{
    bool found = false;
    pthread_mutex_lock(&j->mu);
    for (struct kd_jobs_unsaved *u = j->unsaved; u && !found; u = u->next) {
        if (u->id != id)
            continue;
        found = true;
        snprintf(state, len, "%s", u->state);
        if (error)
            snprintf(error, errlen, "%s", u->error ? u->error : "");
    }
    pthread_mutex_unlock(&j->mu);
    return found;
}

bool kd_jobs_overlay_unsaved(struct kd_jobs *j, struct kd_job *job)
{
    char state[16], error[1024];
    if (!kd_jobs_unsaved_state(j, job->id, state, sizeof state, error, sizeof error))
        return false;
    char *s = strdup(state), *e = error[0] ? strdup(error) : NULL;
    if (!s) {
        free(e);
        return false;
    }
    free(job->state);
    free(job->error);
    job->state = s;
    job->error = e;
    return true;
}

void kd_jobs_on_retry(uv_timer_t *t)
{
    struct kd_jobs *j = t->data;
    if (kd_jobs_retry_unsaved(j, true) == 0)
        uv_timer_stop(t);
}

void kd_jobs_unsaved_free(struct kd_jobs *j)
{
    if (j->unsaved && kd_jobs_retry_unsaved(j, false) > 0)
        for (struct kd_jobs_unsaved *u = j->unsaved; u; u = u->next)
            kd_jobs_log(j, KD_LOG_ERROR,
                        "job %lld: its final state %s could not be stored before kilnd stopped (%s); the next "
                        "start finds it running and resumes it",
                        (long long)u->id, u->state, u->why);
    while (j->unsaved) {
        struct kd_jobs_unsaved *u = j->unsaved;
        j->unsaved = u->next;
        unsaved_free(u);
    }
}

int kd_jobs_set_state(struct kd_jobs *j, int64_t id, const char *state, const char *error)
{
    char err[256];
    kd_jobs_store_lock(j);
    int rc = kd_jobstore_job_set_state(j->o.store, id, state, error, err, sizeof err);
    kd_jobs_store_unlock(j);
    if (rc != 0)
        kd_jobs_log(j, KD_LOG_WARN, "job %lld: %s", (long long)id, err);
    return rc;
}

char *kd_jobs_path(const char *a, const char *fmt, ...)
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

bool kd_jobs_dir_exists(const char *p)
{
    struct stat st;
    return p && stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

struct kd_jobspec_env kd_jobs_spec_env(struct kd_jobs *j)
{
    return (struct kd_jobspec_env){.roots = j->roots, .nroots = j->nroots, .models_root = j->models_dir};
}

bool kd_jobs_has_checkpoint(struct kd_jobs *j, int64_t id)
{
    char *dir = kd_jobs_path(j->data_dir, "checkpoints/job-%lld", (long long)id);
    kiln_ckpt_info *list = NULL;
    int n = 0;
    bool found = false;
    if (kd_jobs_dir_exists(dir) && kiln_ckpt_list(dir, false, NULL, &list, &n) == 0) {
        for (int i = 0; i < n && !found; i++)
            found = list[i].valid;
        kiln_ckpt_list_free(list, n);
    }
    free(dir);
    return found;
}
