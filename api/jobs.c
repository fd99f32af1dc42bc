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
 * A job that trained a model ends on the loop: its version is loaded through kd_serving_load,
 * the one load path serving has (rescan, build every served version on its worker, swap), also
 * behind POST /v2/repository/models/<name>/load, and the job is recorded succeeded in the same
 * loop callback that swapped the model table (jobs-finish.c), so "succeeded" means servable.
 *
 * This file holds the life cycle; jobs-impl.h says where the rest lives.
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

#include "jobs-impl.h"
#include "metrics.h"

/* ---- life cycle ---------------------------------------------------------------------------- */

/*
 * A job that was running when kilnd stopped, after the user had asked it to stop: it ends
 * cancelled. A version it may have added in the instant between its registration and the
 * cancel taking effect is removed first, before the serving side's first loads read the
 * repository, so that nothing a cancelled job made is ever served.
 */
static void cancel_at_start(struct kd_jobs *j, const struct kd_job *job)
{
    cJSON *spec = cJSON_Parse(job->spec);
    const cJSON *reg = cJSON_GetObjectItemCaseSensitive(spec, "register_as");
    if (cJSON_IsString(reg))
        kd_jobs_remove_version_of(j, job, reg->valuestring); /* a failure is logged, naming the version */
    cJSON_Delete(spec);
    /* a store that refuses keeps it among the unsaved final states, written again later */
    static const char reason[] = "\"cancelled before kilnd stopped\"";
    if (kd_jobs_transition(j, job->id, KD_JOB_CANCELLED, NULL, "reason", reason) == 0)
        kd_jobs_log(j, KD_LOG_INFO, "job %lld was cancelled before kilnd stopped; it stays cancelled, not resumed",
                    (long long)job->id);
}

struct kd_jobs *kd_jobs_new(const struct kd_jobs_options *o, char *err, size_t errlen)
{
    struct kd_jobs *j = calloc(1, sizeof *j);
    if (!j) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    /* a job trains on one of the devices kilnd drives (checked at submit, and again when a
     * requeued job is parsed below); cleared in kd_jobs_stop, before the scheduler goes */
    kd_jobspec_set_devices(o->sched);
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
    if (o->metrics) {
        /* every state at 0 from the start, so a rate or an alert sees the first job */
        static const char *const states[] = {KD_JOB_QUEUED, KD_JOB_RUNNING, KD_JOB_SUCCEEDED, KD_JOB_FAILED,
                                             KD_JOB_CANCELLED};
        struct kd_metric_family *f = kd_metrics_family(
            o->metrics, "kiln_training_jobs",
            "Training jobs in the job store by state (ended jobs until retention or a purge removes them).",
            KD_METRIC_GAUGE, (const char *const[]){"state", NULL}, NULL, 0);
        for (int i = 0; f && i < 5; i++)
            j->by_state[i] = kd_metrics_series(f, (const char *const[]){states[i], NULL});
    }
    j->models_dir = o->models_dir ? strdup(o->models_dir) : kd_jobs_path(j->data_dir, "%s", "models");
    j->auth = j->models_dir ? kd_auth_new(o->tokens, err, errlen) : NULL;
    if (!j->auth) {
        if (!j->models_dir)
            snprintf(err, errlen, "out of memory");
        free(j->models_dir);
        free(j->data_dir);
        free(j->roots);
        free(j);
        return NULL;
    }
    j->roots[j->nroots++] = j->data_dir;
    for (size_t i = 0; i < nr; i++)
        if (o->data_roots->items[i][0])
            j->roots[j->nroots++] = o->data_roots->items[i];
    pthread_mutex_init(&j->store_mu, NULL);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    atomic_init(&j->cancel, false);
    uv_async_init(o->loop, &j->async, kd_jobs_on_async);
    uv_timer_init(o->loop, &j->ping);
    uv_timer_init(o->loop, &j->retry);
    j->async.data = j->ping.data = j->retry.data = j;
    j->handles_open = true;
    /* None of these keep the loop alive: it ends when the server's connections have gone. */
    uv_unref((uv_handle_t *)&j->async);
    uv_unref((uv_handle_t *)&j->ping);
    uv_unref((uv_handle_t *)&j->retry);
    uv_timer_start(&j->ping, kd_jobs_on_ping, PING_MS, PING_MS);

    /* Jobs a previous process was running go back to the queue; they resume from their
     * newest checkpoint when the thread takes them, ahead of newer queued jobs (lower ids).
     * One the user had asked to stop ends cancelled instead: the request was accepted. */
    struct kd_job *jobs = NULL;
    int n = 0;
    if (kd_jobstore_job_list(o->store, KD_JOB_RUNNING, 0, 10000, &jobs, &n, err, errlen) == 0) {
        for (int i = 0; i < n; i++) {
            if (jobs[i].cancel_requested_ms) {
                cancel_at_start(j, &jobs[i]);
            } else if (kd_jobstore_job_requeue(o->store, jobs[i].id, err, errlen) == 0) {
                kd_jobs_log(j, KD_LOG_INFO, "job %lld was running when kilnd stopped; queued to resume",
                            (long long)jobs[i].id);
                kd_jobstore_event_append(o->store, jobs[i].id, "state",
                                         "{\"state\":\"queued\",\"reason\":\"kilnd restarted\"}", NULL, NULL, 0);
            }
        }
        kd_jobstore_job_list_free(jobs, n);
    }
    /* Before any job runs: a purge cut short by a crash is finished, and a job that would start
     * now finds no stranger's checkpoints under its id. */
    kd_jobs_sweep_orphans(j);
    kd_jobs_apply_retention(j);
    if (pthread_create(&j->thread, NULL, kd_jobs_trainer_main, j) != 0) {
        snprintf(err, errlen, "jobs: cannot start the training thread");
        kd_jobs_stop(j);
        return j; /* the caller frees it after the loop closed the handles */
    }
    j->thread_started = true;
    return j;
}

void kd_jobs_drain(struct kd_jobs *j)
{
    if (!j)
        return;
    /* Training stops with the drain, not after it (docs/deployment.md, "Stopping"): a job
     * still running when the loop ends would be cut wherever it is then, and one that finished
     * meanwhile would let the next queued job start on a daemon that is going. The running job
     * stops at the end of its current step and stays running in the store (record_outcome sees
     * stopping); the thread takes no further job; a submission still being checked gets 503
     * (check_done). kd_jobs_stop joins the thread later. */
    pthread_mutex_lock(&j->mu);
    j->stopping = true;
    atomic_store(&j->cancel, true);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    while (j->streams)
        kd_jobs_stream_end(j, j->streams);
}

void kd_jobs_sample_gauges(struct kd_jobs *j)
{
    if (!j || !j->by_state[0])
        return;
    struct kd_job_counts c;
    kd_jobs_store_lock(j);
    int rc = kd_jobstore_job_counts(j->o.store, &c, NULL, 0);
    kd_jobs_store_unlock(j);
    if (rc != 0)
        return; /* the last figures stay: a scrape is no place to fail */
    const int64_t n[] = {c.queued, c.running, c.succeeded, c.failed, c.cancelled};
    for (int i = 0; i < 5; i++)
        if (j->by_state[i])
            kd_metric_set(j->by_state[i], (double)n[i]);
}

void kd_jobs_stop(struct kd_jobs *j)
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
    kd_jobspec_set_devices(NULL);
    kd_jobs_drain(j);
    if (j->handles_open) {
        uv_close((uv_handle_t *)&j->async, NULL);
        uv_close((uv_handle_t *)&j->ping, NULL);
        uv_close((uv_handle_t *)&j->retry, NULL);
        j->handles_open = false;
    }
}

void kd_jobs_free(struct kd_jobs *j)
{
    if (!j)
        return;
    kd_jobs_finishes_free(j);
    kd_jobs_unsaved_free(j);
    pthread_mutex_destroy(&j->store_mu);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j->roots);
    free(j->models_dir);
    free(j->data_dir);
    kd_auth_free(j->auth);
    free(j);
}
