/*
 * api/jobs-finish.c — the last step of a job that trained a model: "succeeded" means servable.
 *
 * The training thread adds the version to the repository (weights, config.json and a
 * source.json naming the job, renamed into place in one step), posts the job here and waits.
 * On the loop, which owns the serving model table, the version is loaded through
 * kd_serving_load, the path POST /v2/repository/models/<name>/load takes too. In the callback
 * that swaps the table entry, the job's registry row, its "model" event, its state and its
 * "state" event are written in one store transaction. The loop serves no request between the
 * swap and that write, so a client that sees the job succeeded (GET, the event stream, the CLI,
 * the Python client) finds /v2/models/<name>/ready answering 200 and the new version answering
 * inference.
 *
 * A version that does not load (its device is not one kilnd serves on, the model's version
 * policy does not select it, the build fails) is removed from the repository again, so that no
 * later start serves what a failed job left, and the job fails with the reason. The model is then
 * loaded again from what remains, in case a restart had tried the new version and left the name
 * serving nothing.
 *
 * docs/architecture.md ("Training jobs: how a job ends") gives the order of the steps and what a
 * crash between any two of them leaves.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "jobs-impl.h"
#include "repository.h"

void kd_jobs_source(const struct kd_job *job, char *out, size_t len)
{
    /* The creation time keeps two data directories sharing one repository apart. */
    snprintf(out, len, "kilnd job %lld created %lld", (long long)job->id, (long long)job->created_ms);
}

static void finish_free(struct kd_jobs_finish *f)
{
    free(f->metrics_json);
    free(f);
}

/* The training thread waits for this before it takes the next job. */
static void release_trainer(struct kd_jobs *j, int64_t id)
{
    pthread_mutex_lock(&j->mu);
    j->finished = id;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

int kd_jobs_succeed(struct kd_jobs *j, int64_t id, const char *name, int64_t version, const char *metrics_json,
                    const char *stop_reason)
{
    char model[KD_MODEL_NAME_MAX + 64], err[256];
    snprintf(model, sizeof model, "{\"name\":\"%s\",\"version\":%lld}", name, (long long)version);
    char *state = kd_jobs_state_payload(KD_JOB_SUCCEEDED, NULL, "metrics", metrics_json);
    int rc = -1;
    if (!state) {
        snprintf(err, sizeof err, "out of memory");
    } else {
        kd_jobs_store_lock(j);
        rc = kd_jobstore_job_succeed_with_model(j->o.store, id, name, version, metrics_json, model, state, err,
                                                sizeof err);
        kd_jobs_store_unlock(j);
    }
    cJSON_free(state);
    if (rc == 0) {
        kd_jobs_log(j, KD_LOG_INFO, "job %lld succeeded (%s); model %s version %lld is served", (long long)id,
                    stop_reason, name, (long long)version);
        uv_async_send(&j->async);
    } else {
        /* Still running in the store: the next start finds the version by its source.json and
         * records the job then. */
        kd_jobs_log(j, KD_LOG_ERROR,
                    "job %lld: model %s version %lld is ready but the job's success was not "
                    "recorded: %s",
                    (long long)id, name, (long long)version, err);
    }
    return rc;
}

static void reloaded(void *ud, int status, const char *why)
{
    struct kd_jobs *j = ud;
    if (status != 200)
        kd_jobs_log(j, KD_LOG_WARN, "reloading a model after a failed job: %s", why);
}

static void fail_unservable(struct kd_jobs *j, const struct kd_jobs_finish *f, const char *why)
{
    char msg[640];
    snprintf(msg, sizeof msg, "model %s version %lld was written but does not load for serving: %s", f->name,
             (long long)f->version, why);
    kd_jobs_log(j, KD_LOG_WARN, "job %lld failed: %s", (long long)f->id, msg);
    /* The version goes first: a job recorded failed leaves nothing that a later start would serve. */
    kd_repository *repo = kd_repository_open(j->models_dir);
    if (!repo || kd_repository_remove_version(repo, f->name, f->version) != 0) {
        kd_jobs_log(j, KD_LOG_ERROR, "job %lld: removing %s version %lld: %s", (long long)f->id, f->name,
                    (long long)f->version, kiln_error());
    } else {
        const kd_model_info *m = kd_repository_find(repo, f->name);
        char w[320];
        if (m && m->nversions == 0) {
            /* The job had made the folder: it goes too (rmdir leaves a folder with anything in it). */
            char *dir = kd_jobs_path(j->models_dir, "%s", f->name);
            if (dir)
                rmdir(dir);
            free(dir);
        } else if (m && m->valid && j->o.serving &&
                   kd_serving_load(j->o.serving, f->name, 0, reloaded, j, w, sizeof w) != 0) {
            kd_jobs_log(j, KD_LOG_WARN, "reloading %s after job %lld: %s", f->name, (long long)f->id, w);
        }
    }
    kd_repository_close(repo);
    kd_jobs_transition(j, f->id, KD_JOB_FAILED, msg, NULL, NULL);
}

static void unlink_loading(struct kd_jobs *j, struct kd_jobs_finish *f)
{
    for (struct kd_jobs_finish **pp = &j->loading; *pp; pp = &(*pp)->next)
        if (*pp == f) {
            *pp = f->next;
            return;
        }
}

/* kd_serving_load's callback: the table entry has been swapped (200) or the load failed. */
static void on_loaded(void *ud, int status, const char *why)
{
    struct kd_jobs_finish *f = ud;
    struct kd_jobs *j = f->j;
    unlink_loading(j, f);
    if (!j->handles_open)
        /* kd_jobs_stop has run: the job stays running and the next start finishes it. */
        kd_jobs_log(j, KD_LOG_INFO, "job %lld: its model loaded while kilnd stops; the next start records it",
                    (long long)f->id);
    else if (status == 200)
        kd_jobs_succeed(j, f->id, f->name, f->version, f->metrics_json, f->stop_reason);
    else
        fail_unservable(j, f, why ? why : "unknown reason");
    release_trainer(j, f->id);
    finish_free(f);
}

static void start_load(struct kd_jobs *j, struct kd_jobs_finish *f)
{
    char why[320];
    /* Listed before the call: a load with nothing to wait for calls back before it returns. */
    f->next = j->loading;
    j->loading = f;
    int st = kd_serving_load(j->o.serving, f->name, f->version, on_loaded, f, why, sizeof why);
    if (st == 0)
        return;
    unlink_loading(j, f);
    fail_unservable(j, f, why);
    release_trainer(j, f->id);
    finish_free(f);
}

void kd_jobs_take_finishes(struct kd_jobs *j)
{
    pthread_mutex_lock(&j->mu);
    struct kd_jobs_finish *list = j->to_finish;
    j->to_finish = NULL;
    pthread_mutex_unlock(&j->mu);
    while (list) {
        struct kd_jobs_finish *f = list;
        list = f->next;
        if (j->handles_open) {
            start_load(j, f);
        } else {
            release_trainer(j, f->id);
            finish_free(f);
        }
    }
}

void kd_jobs_finishes_free(struct kd_jobs *j)
{
    /* Loads the scheduler never completed (it stopped first) and posts the loop never took. */
    struct kd_jobs_finish *lists[2] = {j->loading, j->to_finish};
    for (int i = 0; i < 2; i++)
        while (lists[i]) {
            struct kd_jobs_finish *f = lists[i];
            lists[i] = f->next;
            finish_free(f);
        }
    j->loading = j->to_finish = NULL;
}
