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
#include <errno.h>
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

int64_t kd_jobs_remove_version_of(struct kd_jobs *j, const struct kd_job *job, const char *name)
{
    char source[96];
    kd_jobs_source(job, source, sizeof source);
    kd_repository *repo = kd_repository_open(j->models_dir);
    int64_t v = repo ? kd_repository_find_source(repo, name, source, NULL) : 0;
    if (v > 0 && kd_repository_remove_version(repo, name, v) == 0) {
        kd_jobs_log(j, KD_LOG_INFO,
                    "job %lld: %s version %lld, which it added before it was cancelled, is removed",
                    (long long)job->id, name, (long long)v);
        const kd_model_info *m = kd_repository_find(repo, name);
        char *dir = m && m->nversions == 0 ? kd_jobs_path(j->models_dir, "%s", name) : NULL;
        if (dir)
            rmdir(dir); /* the job had made the folder (rmdir leaves one with anything in it) */
        free(dir);
    } else if (v != 0) {
        kd_jobs_log(j, KD_LOG_ERROR,
                    "job %lld was cancelled, but %s version %lld it added could not be removed: %s",
                    (long long)job->id, name, (long long)v, kiln_error());
        v = -1;
    }
    kd_repository_close(repo);
    return v;
}

int kd_jobs_repository_writable(const char *models_dir, const char *name, char *why, size_t len)
{
    /* The version goes into the model's folder, which goes into the repository when new. */
    char *folder = kd_jobs_path(models_dir, "%s", name);
    bool exists = kd_jobs_dir_exists(folder);
    char *probe = kd_jobs_path(exists ? folder : models_dir, "%s", ".kiln-write-check-XXXXXX");
    int rc = 0;
    if (!probe) {
        rc = -1;
        snprintf(why, len, "out of memory");
    } else if (!mkdtemp(probe)) {
        int e = errno;
        rc = -1;
        snprintf(why, len, "the %s %.300s is %s for kilnd (%s): the trained model cannot be added to it",
                 exists ? "model folder" : "model repository", exists ? folder : models_dir,
                 e == EACCES || e == EPERM || e == EROFS ? "read-only" : "not writable", strerror(e));
    } else {
        rmdir(probe);
    }
    free(probe);
    free(folder);
    return rc;
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
    if (rc == 0) {
        cJSON_free(state);
        kd_jobs_log(j, KD_LOG_INFO, "job %lld succeeded (%s); model %s version %lld is served", (long long)id,
                    stop_reason, name, (long long)version);
        uv_async_send(&j->async);
        return 0;
    }
    kd_jobs_log(j, KD_LOG_ERROR,
                "job %lld: model %s version %lld is ready but the job's success was not recorded: %s",
                (long long)id, name, (long long)version, err);
    /* Kept and written again; should kilnd stop first, the job is still running in the store and
     * the next start finds the version by its source.json and records the job then. */
    struct kd_jobs_unsaved *u = state ? calloc(1, sizeof *u) : NULL;
    if (u) {
        *u = (struct kd_jobs_unsaved){.id = id, .version = version};
        snprintf(u->state, sizeof u->state, "%s", KD_JOB_SUCCEEDED);
        snprintf(u->name, sizeof u->name, "%s", name);
        snprintf(u->why, sizeof u->why, "%s", err);
        u->payload = strdup(state);
        u->model_payload = strdup(model);
        u->metrics_json = metrics_json ? strdup(metrics_json) : NULL;
        if (kd_jobs_keep_unsaved(j, u))
            rc = 0;
    }
    cJSON_free(state);
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
