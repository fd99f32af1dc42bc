/*
 * api/jobs-impl.h — the jobs module's state and the functions its files share:
 *   jobs.c             life cycle (requeue after a restart, the thread, the loop handles)
 *   jobs-routes.c      the /v1/jobs routes (but submit), their query strings
 *   jobs-submit.c      POST /v1/jobs: the spec checked (the slow part, with the checkpoint a
 *                      resume starts from and the repository's writability, off the loop), stored
 *   jobs-events.c      server-sent event streams
 *   jobs-history.c     GET .../metrics and .../logs: pages of a job's stored events
 *   jobs-train.c       the training thread
 *   jobs-finish.c      a registered model loaded for serving, then the job succeeded (loop)
 *   jobs-store-glue.c  the store under its lock, events, states (and final states the store
 *                      refused, kept and written again), paths, the log
 *   jobs-purge.c       ended jobs removed: DELETE ...?purge=true, retention, folders no job owns
 */
#ifndef KD_API_JOBS_IMPL_H
#define KD_API_JOBS_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <uv.h>

#include "auth.h"
#include "http-conn.h"
#include "jobs.h"
#include "kiln/record.h"
#include "responses.h"
#include "serving.h"
#include "trainer.h"

#define STREAM_OUT_MAX (4u << 20)   /* a client this far behind is dropped; it can reconnect */
#define PING_MS 15000
#define RETRY_MS 2000 /* how often an unsaved final state is written again */

struct kd_jobs_stream {
    struct kd_jobs *j;
    int64_t job_id;
    int64_t last_seq;
    struct kd_http_pending *p;
    struct kd_jobs_stream *next;
};

/*
 * A job whose training added a model version, handed from the training thread to the loop
 * (jobs-finish.c): the loop loads the version for serving and only then records the job
 * succeeded, or removes the version and records it failed. Owned by the loop once posted.
 */
struct kd_jobs_finish {
    struct kd_jobs *j;
    int64_t id;
    char name[KD_MODEL_NAME_MAX + 1];
    int64_t version;
    char *metrics_json;              /* the final metrics (may be NULL) */
    char stop_reason[32];
    struct kd_jobs_finish *next;
};

/*
 * A final state the job store refused to record (a full disk, an I/O error): kept here, given in
 * every answer about the job (its state_saved is false), and written again by the retry timer,
 * by the training thread between jobs and at shutdown until the store takes it. A job the store
 * still calls running is never mistaken for one to cancel or resume meanwhile. What a stop
 * leaves unwritten the next start reconciles: the job is running in the store, so it resumes
 * from its newest checkpoint (or is found done by its version's source.json). Under mu.
 */
struct kd_jobs_unsaved {
    int64_t id;
    char state[16];
    char *error;   /* the state's message (may be NULL) */
    char *payload; /* its "state" event */
    /* a job that added a model version succeeds with it in one transaction */
    char name[KD_MODEL_NAME_MAX + 1]; /* "" for a plain transition */
    int64_t version;
    char *metrics_json, *model_payload;
    char why[256]; /* the store's last refusal */
    struct kd_jobs_unsaved *next;
};

struct kd_jobs {
    struct kd_jobs_options o;
    char *data_dir;
    char *models_dir;                /* data_dir/models: the repository fine-tuning reads */
    const char **roots;
    size_t nroots;
    struct kd_auth *auth; /* the bearer-token rules (auth.h) */
    struct kd_metric_series *by_state[5]; /* kiln_training_jobs{state}, in kd_job_counts' order; NULL: none */
    /* loop thread */
    uv_async_t async;
    uv_timer_t ping;
    uv_timer_t retry; /* writes the unsaved final states again while there are any */
    bool handles_open;
    struct kd_jobs_stream *streams;
    struct kd_jobs_finish *loading; /* handed to serving, waiting for their load to end */
    /* shared */
    pthread_mutex_t store_mu;        /* the job store */
    pthread_mutex_t mu;              /* the fields below */
    pthread_cond_t cv;
    /* Bumped (under mu) whenever a job is queued. The trainer reads the store with mu
     * released, so it sleeps only if no job was queued since it started looking;
     * without this a submit landing in that window was a lost wake-up and the job
     * stayed queued forever. */
    uint64_t queued_seq;
    bool stopping;
    int64_t current;                 /* the job being trained, 0 when none */
    atomic_bool cancel;              /* the current job: stop before its next step (shutdown or user) */
    /* The user asked the current job to stop, and the request is stored: whatever the run ends
     * with, the job ends cancelled. Set only while finishing is not the current job. */
    bool cancel_requested;
    struct kd_jobs_finish *to_finish; /* posted by the training thread, not yet taken */
    /* The current job once its run has ended and its outcome is decided (0: none): recording it
     * (and loading its model) is under way, so a cancel comes too late and is answered 409. */
    int64_t finishing;
    struct kd_jobs_unsaved *unsaved; /* final states the store refused, oldest first */
    int64_t finished;                /* the last job the loop finished (the trainer waits for it) */
    bool retention_due;              /* a job ended: the training thread applies retention next */
    pthread_t thread;
    bool thread_started;
    /* training thread only: the queued job the store would not give it, and why, so that a retry
     * every RETRY_MS logs the failure once and its end, not a line each time */
    int64_t unreadable_id;
    char unreadable_why[256];
};

/* jobs-store-glue.c; the store calls are only ever made between lock and unlock */
void kd_jobs_log(struct kd_jobs *j, enum kd_log_level l, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void kd_jobs_store_lock(struct kd_jobs *j);
void kd_jobs_store_unlock(struct kd_jobs *j);
/* Stores a new queued job (spec JSON; resumes: the job it resumes from, 0 for none) into *id. The
 * job it resumes from is checked to exist in the same locked section, so that a purge can never
 * leave a queued job resuming from a job that is gone: KD_JOBSTORE_NOT_FOUND, with why in err. */
int kd_jobs_create(struct kd_jobs *j, const char *spec, int64_t resumes, int64_t *id, char *err, size_t errlen);
/* Append an event and tell the loop; from either thread. */
void kd_jobs_emit(struct kd_jobs *j, int64_t id, const char *type, const char *payload);
/* A "state" event; extra_json (when given) goes in under extra_key. */
void kd_jobs_emit_state(struct kd_jobs *j, int64_t id, const char *state, const char *error, const char *extra_key,
                        const char *extra_json);
/* The payload of a "state" event (cJSON_free it); NULL when out of memory. */
char *kd_jobs_state_payload(const char *state, const char *error, const char *extra_key, const char *extra_json);
int kd_jobs_set_state(struct kd_jobs *j, int64_t id, const char *state, const char *error);
/* kd_jobs_set_state and its "state" event (as kd_jobs_emit_state makes it) in one store
 * transaction, so an event stream that sees the job final has its final event; tells the loop.
 * 0, or -1 (logged) with neither stored. */
int kd_jobs_transition(struct kd_jobs *j, int64_t id, const char *state, const char *error, const char *extra_key,
                       const char *extra_json);
/* A final state the store did not take: keep it (struct kd_jobs_unsaved) when the job is still
 * not final in the store, which makes it a store failure rather than a refusal. Takes u (freed
 * when not kept, or when a string it needs is missing: out of memory); true when kept. */
bool kd_jobs_keep_unsaved(struct kd_jobs *j, struct kd_jobs_unsaved *u);
/* Write the unsaved final states again (either thread; notify: tell the loop of those written,
 * false once its handles are closed); how many are still unsaved. */
int kd_jobs_retry_unsaved(struct kd_jobs *j, bool notify);
/* The unsaved final state of job id into state (and its error into error, "" for none);
 * false when it has none. */
bool kd_jobs_unsaved_state(struct kd_jobs *j, int64_t id, char *state, size_t len, char *error, size_t errlen);
/* job as the daemon knows it: an unsaved final state replaces the stored one. True when it did. */
bool kd_jobs_overlay_unsaved(struct kd_jobs *j, struct kd_job *job);
void kd_jobs_on_retry(uv_timer_t *t);
/* After kd_jobs_stop: one last write of each unsaved state, then the list is freed. */
void kd_jobs_unsaved_free(struct kd_jobs *j);
/* a + "/" + the formatted tail, malloc'd (NULL when out of memory) */
char *kd_jobs_path(const char *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool kd_jobs_dir_exists(const char *p);
/* The env a queued job's spec is parsed in to run (no submission checks). */
struct kd_jobspec_env kd_jobs_spec_env(struct kd_jobs *j);
/* Whether job id has a checkpoint to continue from, by its manifests (cheap enough for the loop;
 * the run verifies the checkpoint it opens). */
bool kd_jobs_has_checkpoint(struct kd_jobs *j, int64_t id);

/* jobs-submit.c: POST /v1/jobs (the response may come later: KD_HTTP_DEFERRED) */
int kd_jobs_handle_submit(struct kd_jobs *j, const struct kd_request *req, struct kd_buf *out);

/* jobs-train.c */
void *kd_jobs_trainer_main(void *ud);

/* jobs-purge.c */
/* A purge: the rows the store removed, then the job's files. */
struct kd_jobs_purged {
    int64_t id;
    struct kd_job_purge rows;
    int64_t files_removed, bytes_freed;
    char left_behind[512]; /* the first file that could not be removed, and why ("" when none) */
};
/* The store's part of a purge of job id (its rows, in one transaction; p filled). 0, or the code
 * of kd_jobstore_job_purge with why in err. Either thread. */
int kd_jobs_purge_rows(struct kd_jobs *j, int64_t id, struct kd_jobs_purged *p, char *err, size_t errlen);
/* kd_jobs_purge_rows, then the job's folders, then a log line (why: "" or what made the purge,
 * " by retention (...)"). Either thread; not the loop for a large job (the files take time). */
int kd_jobs_purge(struct kd_jobs *j, int64_t id, const char *why, struct kd_jobs_purged *p, char *err,
                  size_t errlen);
/* Purges the ended jobs jobs.retention_count and jobs.retention_days no longer keep, one log line
 * each (nothing when neither is set). Not on the loop. */
void kd_jobs_apply_retention(struct kd_jobs *j);
/* From the loop, when it ended a job (a queued job cancelled): kd_jobs_apply_retention on libuv's
 * thread pool, so that neither the loop nor a job running meanwhile holds it up. */
void kd_jobs_apply_retention_soon(struct kd_jobs *j);
/* At start: checkpoint and scratch folders of jobs the store does not hold are removed, logged. */
void kd_jobs_sweep_orphans(struct kd_jobs *j);
/* DELETE /v1/jobs/{id}?purge=true (the answer comes once the files are gone: KD_HTTP_DEFERRED). */
int kd_jobs_handle_purge(struct kd_jobs *j, int64_t id, const struct kd_request *req, struct kd_buf *out);

/* jobs-finish.c */
/* The source a job writes into its model version's source.json (kd_repository_find_source). */
void kd_jobs_source(const struct kd_job *job, char *out, size_t len);
/* The version of name that job added (by its source.json), removed from the repository again
 * along with a model folder it leaves empty: a cancelled job registers nothing. The version
 * removed, 0 when there was none, -1 (logged) when it could not be removed. */
int64_t kd_jobs_remove_version_of(struct kd_jobs *j, const struct kd_job *job, const char *name);
/* Whether a job can add a version of name to the model repository: a folder is made and removed
 * where the version would go. 0, or -1 with why ("the model repository ... is read-only"). */
int kd_jobs_repository_writable(const char *models_dir, const char *name, char *why, size_t len);
/* Records job id succeeded with the version it added, in one store transaction (either thread:
 * the loop once the version answers, or the training thread when nothing serves). 0, or -1
 * (logged) with the job left running. */
int kd_jobs_succeed(struct kd_jobs *j, int64_t id, const char *name, int64_t version, const char *metrics_json,
                    const char *stop_reason);
/* On the loop: take the finishes the training thread posted and start loading their models. */
void kd_jobs_take_finishes(struct kd_jobs *j);
/* After kd_jobs_stop: free what is still posted or loading. */
void kd_jobs_finishes_free(struct kd_jobs *j);

/* jobs-events.c (loop thread) */
/* succeeded, failed or cancelled: a state a job never leaves */
bool kd_jobs_final_state(const char *s);
void kd_jobs_stream_end(struct kd_jobs *j, struct kd_jobs_stream *s);
void kd_jobs_on_async(uv_async_t *a);
void kd_jobs_on_ping(uv_timer_t *t);
int kd_jobs_handle_events(struct kd_jobs *j, int64_t id, const struct kd_request *req, struct kd_buf *out);

/* jobs-history.c (loop thread) */
int kd_jobs_handle_metrics(struct kd_jobs *j, int64_t id, const struct kd_request *req, struct kd_buf *out);
int kd_jobs_handle_logs(struct kd_jobs *j, int64_t id, const struct kd_request *req, struct kd_buf *out);

/* jobs-routes.c */
int kd_jobs_errorf(struct kd_buf *out, const struct kd_request *req, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The status a failed job store call answers, from the code it returned: 507 (Insufficient
 * Storage) for KD_JOBSTORE_FULL, which freeing space mends without a restart; else fallback. */
static inline int kd_jobs_store_status(int code, int fallback)
{
    return code == KD_JOBSTORE_FULL ? 507 : fallback;
}
/* kd_jobs_errorf for a job store call that failed with code: answered with kd_jobs_store_status
 * (code, fallback) and logged, since the store's words are the operator's concern too. */
int kd_jobs_store_errorf(struct kd_jobs *j, struct kd_buf *out, const struct kd_request *req, int code,
                         int fallback, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* A request's query string, percent-decoded, each key at most once and known to the route. */
#define KD_JOBS_QUERY_MAX 8
#define KD_JOBS_QUERY_VALUE_MAX 128
struct kd_jobs_query {
    int n;
    struct {
        char key[32];
        char value[KD_JOBS_QUERY_VALUE_MAX + 1];
    } params[KD_JOBS_QUERY_MAX];
};
/* Reads req's query into q. A key not in allowed (NULL-terminated; NULL allows none), a key given
 * twice, a bad percent escape or a value longer than KD_JOBS_QUERY_VALUE_MAX is a 400 naming it:
 * 0, or the status of the answer written to out. */
int kd_jobs_query_read(const struct kd_request *req, const char *const *allowed, struct kd_jobs_query *q,
                       struct kd_buf *out);
/* A parameter's decoded value; NULL when absent. */
const char *kd_jobs_query_get(const struct kd_jobs_query *q, const char *key);
bool kd_jobs_parse_i64(const char *s, int64_t *v);
/* Reads job id; 0, or the status of the error answer written to out (404, 500). */
int kd_jobs_get_job(struct kd_jobs *j, int64_t id, struct kd_job *job, const struct kd_request *req,
                    struct kd_buf *out);
int kd_jobs_send_json(struct kd_buf *out, int status, cJSON *o, const struct kd_request *req);

#endif /* KD_API_JOBS_IMPL_H */
