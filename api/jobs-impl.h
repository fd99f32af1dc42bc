/*
 * api/jobs-impl.h — the jobs module's state and the functions its files share:
 *   jobs.c             life cycle (requeue after a restart, the thread, the loop handles)
 *   jobs-routes.c      the /v1/jobs routes
 *   jobs-events.c      server-sent event streams
 *   jobs-history.c     GET .../metrics and .../logs: pages of a job's stored events
 *   jobs-train.c       the training thread
 *   jobs-finish.c      a registered model loaded for serving, then the job succeeded (loop)
 *   jobs-store-glue.c  the store under its lock, events, states, paths, the log
 */
#ifndef KILN_API_JOBS_IMPL_H
#define KILN_API_JOBS_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <uv.h>

#include "auth.h"
#include "http_conn.h"
#include "jobs.h"
#include "kiln/record.h"
#include "responses.h"
#include "serving.h"
#include "trainer.h"

#define STREAM_OUT_MAX (4u << 20)   /* a client this far behind is dropped; it can reconnect */
#define PING_MS 15000

struct kiln__jobs_stream {
    struct kiln_jobs *j;
    int64_t job_id;
    int64_t last_seq;
    struct kiln_http_pending *p;
    struct kiln__jobs_stream *next;
};

/*
 * A job whose training added a model version, handed from the training thread to the loop
 * (jobs-finish.c): the loop loads the version for serving and only then records the job
 * succeeded, or removes the version and records it failed. Owned by the loop once posted.
 */
struct kiln__jobs_finish {
    struct kiln_jobs *j;
    int64_t id;
    char name[KILN_MODEL_NAME_MAX + 1];
    int64_t version;
    char *metrics_json;              /* the final metrics (may be NULL) */
    char stop_reason[32];
    struct kiln__jobs_finish *next;
};

struct kiln_jobs {
    struct kiln_jobs_options o;
    char *data_dir;
    char *models_dir;                /* data_dir/models: the repository fine-tuning reads */
    const char **roots;
    size_t nroots;
    struct kiln_auth *auth;          /* the bearer-token rules (auth.h) */
    /* loop thread */
    uv_async_t async;
    uv_timer_t ping;
    bool handles_open;
    struct kiln__jobs_stream *streams;
    struct kiln__jobs_finish *loading;  /* handed to serving, waiting for their load to end */
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
    atomic_bool cancel;              /* the current job: stop before its next step */
    struct kiln__jobs_finish *to_finish; /* posted by the training thread, not yet taken */
    int64_t finishing;               /* the job whose model is being loaded (0: none) */
    int64_t finished;                /* the last job the loop finished (the trainer waits for it) */
    pthread_t thread;
    bool thread_started;
};

/* jobs-store-glue.c; the store calls are only ever made between lock and unlock */
void kiln__jobs_log(struct kiln_jobs *j, enum kiln_log_level l, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void kiln__jobs_store_lock(struct kiln_jobs *j);
void kiln__jobs_store_unlock(struct kiln_jobs *j);
/* Append an event and tell the loop; from either thread. */
void kiln__jobs_emit(struct kiln_jobs *j, int64_t id, const char *type, const char *payload);
/* A "state" event; extra_json (when given) goes in under extra_key. */
void kiln__jobs_emit_state(struct kiln_jobs *j, int64_t id, const char *state, const char *error,
                           const char *extra_key, const char *extra_json);
/* The payload of a "state" event (cJSON_free it); NULL when out of memory. */
char *kiln__jobs_state_payload(const char *state, const char *error, const char *extra_key, const char *extra_json);
int kiln__jobs_set_state(struct kiln_jobs *j, int64_t id, const char *state, const char *error);
/* kiln__jobs_set_state and its "state" event (as kiln__jobs_emit_state makes it) in one store
 * transaction, so an event stream that sees the job final has its final event; tells the loop.
 * 0, or -1 (logged) with neither stored. */
int kiln__jobs_transition(struct kiln_jobs *j, int64_t id, const char *state, const char *error, const char *extra_key,
                          const char *extra_json);
/* a + "/" + the formatted tail, malloc'd (NULL when out of memory) */
char *kiln__jobs_path(const char *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool kiln__jobs_dir_exists(const char *p);
struct kiln_jobspec_env kiln__jobs_spec_env(struct kiln_jobs *j);

/* jobs-train.c */
void *kiln__jobs_trainer_main(void *ud);

/* jobs-finish.c */
/* The source a job writes into its model version's source.json (kiln_repository_find_source). */
void kiln__jobs_source(const struct kiln_job *job, char *out, size_t len);
/* Records job id succeeded with the version it added, in one store transaction (either thread:
 * the loop once the version answers, or the training thread when nothing serves). 0, or -1
 * (logged) with the job left running. */
int kiln__jobs_succeed(struct kiln_jobs *j, int64_t id, const char *name, int64_t version, const char *metrics_json,
                       const char *stop_reason);
/* On the loop: take the finishes the training thread posted and start loading their models. */
void kiln__jobs_take_finishes(struct kiln_jobs *j);
/* After kiln_jobs_stop: free what is still posted or loading. */
void kiln__jobs_finishes_free(struct kiln_jobs *j);

/* jobs-events.c (loop thread) */
/* succeeded, failed or cancelled: a state a job never leaves */
bool kiln__jobs_final_state(const char *s);
void kiln__jobs_stream_end(struct kiln_jobs *j, struct kiln__jobs_stream *s);
void kiln__jobs_on_async(uv_async_t *a);
void kiln__jobs_on_ping(uv_timer_t *t);
int kiln__jobs_handle_events(struct kiln_jobs *j, int64_t id, const struct kiln_request *req, struct kiln_buf *out);

/* jobs-history.c (loop thread) */
int kiln__jobs_handle_metrics(struct kiln_jobs *j, int64_t id, const struct kiln_request *req, struct kiln_buf *out);
int kiln__jobs_handle_logs(struct kiln_jobs *j, int64_t id, const struct kiln_request *req, struct kiln_buf *out);

/* jobs-routes.c */
int kiln__jobs_errorf(struct kiln_buf *out, const struct kiln_request *req, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A query parameter's value (bounded copy); false when absent. */
bool kiln__jobs_query_param(const struct kiln_request *req, const char *key, char *val, size_t len);
bool kiln__jobs_parse_i64(const char *s, int64_t *v);
/* Reads job id; 0, or the status of the error answer written to out (404, 500). */
int kiln__jobs_get_job(struct kiln_jobs *j, int64_t id, struct kiln_job *job, const struct kiln_request *req,
                       struct kiln_buf *out);
int kiln__jobs_send_json(struct kiln_buf *out, int status, cJSON *o, const struct kiln_request *req);

#endif /* KILN_API_JOBS_IMPL_H */
