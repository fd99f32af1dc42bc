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
    cJSON_free(text);
    if (rc != 0)
        kd_jobs_log(j, KD_LOG_WARN, "job %lld: %s", (long long)id, err);
    else
        uv_async_send(&j->async);
    return rc;
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
    return (struct kd_jobspec_env){j->roots, j->nroots, j->models_dir, false, NULL, NULL};
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
