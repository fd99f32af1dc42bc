/*
 * api/jobs-impl.h — the jobs module's state and the functions its files share:
 *   jobs.c             life cycle (requeue after a restart, the thread, the loop handles)
 *   jobs-routes.c      the /v1/jobs routes (but submit)
 *   jobs-submit.c      POST /v1/jobs: the spec checked (the slow part off the loop), stored
 *   jobs-events.c      server-sent event streams
 *   jobs-history.c     GET .../metrics and .../logs: pages of a job's stored events
 *   jobs-train.c       the training thread
 *   jobs-finish.c      a registered model loaded for serving, then the job succeeded (loop)
 *   jobs-store-glue.c  the store under its lock, events, states, paths, the log
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

struct kd_jobs {
    struct kd_jobs_options o;
    char *data_dir;
    char *models_dir;                /* data_dir/models: the repository fine-tuning reads */
    const char **roots;
    size_t nroots;
    struct kd_auth *auth; /* the bearer-token rules (auth.h) */
    /* loop thread */
    uv_async_t async;
    uv_timer_t ping;
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
    atomic_bool cancel;              /* the current job: stop before its next step */
    struct kd_jobs_finish *to_finish; /* posted by the training thread, not yet taken */
    int64_t finishing;               /* the job whose model is being loaded (0: none) */
    int64_t finished;                /* the last job the loop finished (the trainer waits for it) */
    pthread_t thread;
    bool thread_started;
};

/* jobs-store-glue.c; the store calls are only ever made between lock and unlock */
void kd_jobs_log(struct kd_jobs *j, enum kd_log_level l, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void kd_jobs_store_lock(struct kd_jobs *j);
void kd_jobs_store_unlock(struct kd_jobs *j);
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

/* jobs-finish.c */
/* The source a job writes into its model version's source.json (kd_repository_find_source). */
void kd_jobs_source(const struct kd_job *job, char *out, size_t len);
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
/* A query parameter's value (bounded copy); false when absent. */
bool kd_jobs_query_param(const struct kd_request *req, const char *key, char *val, size_t len);
bool kd_jobs_parse_i64(const char *s, int64_t *v);
/* Reads job id; 0, or the status of the error answer written to out (404, 500). */
int kd_jobs_get_job(struct kd_jobs *j, int64_t id, struct kd_job *job, const struct kd_request *req,
                    struct kd_buf *out);
int kd_jobs_send_json(struct kd_buf *out, int status, cJSON *o, const struct kd_request *req);

#endif /* KD_API_JOBS_IMPL_H */
