/*
 * api/jobs.h — training jobs over REST (/v1/jobs): submit, list, inspect, cancel, resume, purge
 * an ended job, and follow a job's events as server-sent events.
 *
 * Jobs live in the job store (kiln.db). One training thread takes queued jobs in id order and
 * runs each through scheduler/trainer-run.c; it writes state changes, step and epoch metrics and
 * checkpoints to the store and pokes the loop through a uv_async, and the loop pushes new
 * events to the event streams. The store is the single source of truth, so a stream resumed
 * with Last-Event-ID, a GET after a restart and a live stream all read the same rows.
 *
 * Thread affinity: every function here runs on the loop thread. The training thread only
 * touches the store (under the module's lock) and the async handle.
 */
#ifndef KD_API_JOBS_H
#define KD_API_JOBS_H

#include <stddef.h>

#include <uv.h>

#include "buf.h"
#include "config.h"
#include "jobstore.h"
#include "router.h"

struct kd_serving;
struct kd_sched;

struct kd_jobs_options {
    uv_loop_t *loop;
    struct kd_jobstore *store; /* borrowed; from now on used only through this module */
    const char *data_dir;      /* checkpoints/ and tmp/ live under it */
    const char *models_dir;    /* the model repository jobs register into; NULL: <data_dir>/models */
    const struct kd_strlist *data_roots;
    const struct kd_strlist *tokens; /* as kd_serving_options: "admin:T", "read:T", "T" */
    struct kd_serving *serving;      /* finished models are loaded through it; may be NULL */
    struct kd_sched *sched;          /* steps take turns with its inference; NULL: ungated */
    /* Ended jobs kept (jobs.retention_count: the newest N; jobs.retention_days: those ended within N
     * days); the others are purged at start and whenever a job ends. 0: no limit. */
    int64_t retention_count, retention_days;
    struct kd_metrics *metrics; /* kiln_training_jobs{state} is registered into it; may be NULL */
    void (*log)(void *ud, enum kd_log_level level, const char *msg);
    void *log_ud;
};

struct kd_jobs;
struct kd_metrics;

/* Requeues jobs a previous process left running (or records them cancelled, when a cancel of
 * theirs had been accepted), removes checkpoint folders no job in the store owns, purges the
 * ended jobs the retention options no longer keep, then starts the training thread. */
struct kd_jobs *kd_jobs_new(const struct kd_jobs_options *o, char *err, size_t errlen);
/* SIGTERM: the running job stops at the end of its current step (left running in the store, to
 * resume at the next start), no queued job starts, and every event stream ends (clients
 * reconnect with Last-Event-ID). */
void kd_jobs_drain(struct kd_jobs *j);
/* Sets the kiln_training_jobs{state} gauges from the job store; called when /metrics renders. */
void kd_jobs_sample_gauges(struct kd_jobs *j);
/*
 * Stop the training thread: a running job stops before its next step and stays "running" in the
 * store, so the next kilnd resumes it from its checkpoint (one whose cancel was accepted is
 * recorded cancelled instead). Closes the loop handles.
 */
void kd_jobs_stop(struct kd_jobs *j);
/* After kd_jobs_stop and once the loop has closed its handles. */
void kd_jobs_free(struct kd_jobs *j);

/* Route handler for /v1/jobs and /v1/jobs/...; ctx is the struct kd_jobs. */
int kd_jobs_handle(void *ctx, const struct kd_request *req, struct kd_buf *out);

#endif /* KD_API_JOBS_H */
