/*
 * api/jobs.h — training jobs over REST (/v1/jobs): submit, list, inspect, cancel, resume, and
 * follow a job's events as server-sent events.
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
#ifndef KILN_API_JOBS_H
#define KILN_API_JOBS_H

#include <stddef.h>

#include <uv.h>

#include "buf.h"
#include "config.h"
#include "jobstore.h"
#include "router.h"

struct kiln_serving;
struct kiln_sched;

struct kiln_jobs_options {
    uv_loop_t *loop;
    struct kiln_jobstore *store;          /* borrowed; from now on used only through this module */
    const char *data_dir;                 /* checkpoints/ and tmp/ live under it */
    const char *models_dir;               /* the model repository jobs register into; NULL: <data_dir>/models */
    const struct kiln_strlist *data_roots;
    const struct kiln_strlist *tokens;    /* as kiln_serving_options: "admin:T", "read:T", "T" */
    struct kiln_serving *serving;         /* finished models are loaded through it; may be NULL */
    struct kiln_sched *sched;             /* steps take turns with its inference; NULL: ungated */
    void (*log)(void *ud, enum kiln_log_level level, const char *msg);
    void *log_ud;
};

struct kiln_jobs;

/* Requeues jobs a previous process left running, then starts the training thread. */
struct kiln_jobs *kiln_jobs_new(const struct kiln_jobs_options *o, char *err, size_t errlen);
/* SIGTERM: end every event stream (clients reconnect with Last-Event-ID). */
void kiln_jobs_drain(struct kiln_jobs *j);
/*
 * Stop the training thread: a running job stops before its next step and stays "running" in the
 * store, so the next kilnd resumes it from its checkpoint. Closes the loop handles.
 */
void kiln_jobs_stop(struct kiln_jobs *j);
/* After kiln_jobs_stop and once the loop has closed its handles. */
void kiln_jobs_free(struct kiln_jobs *j);

/* Route handler for /v1/jobs and /v1/jobs/...; ctx is the struct kiln_jobs. */
int kiln_jobs_handle(void *ctx, const struct kiln_request *req, struct kiln_buf *out);

#endif /* KILN_API_JOBS_H */
