/*
 * api/serving-impl.h — what the served-model table (serving.c: loading, metrics, auth, request
 * ids, accounting) and its HTTP routes (serving-routes.c) share. Loop thread only.
 */
#ifndef KD_API_SERVING_IMPL_H
#define KD_API_SERVING_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "auth.h"
#include "http-conn.h"
#include "responses.h"
#include "serving.h"

/* The versions of one model served at once; a version policy selecting more is refused at load
 * (docs/storage.md, "Version policy"). */
#define MAX_VERSIONS 64

struct kd_serving_entry {
    char name[KD_MODEL_NAME_MAX + 1];
    int nv;
    struct kd_sched_model *v[MAX_VERSIONS]; /* ascending versions */
    bool loading;
    /* Loads of one name may overlap (a job's and a POST .../load): the one started last wins, so
     * an older load finishing late never swaps back what a newer one put in. */
    uint64_t loads_started, newest_applied;
    char why[768]; /* the last load's failure, for the index (a device refusal lists the devices) */
    struct kd_serving_entry *next;
};

struct kd_serving {
    struct kd_serving_options o;
    kd_repository *repo;
    struct kd_serving_entry *entries;
    bool accepting;
    int startup_loads; /* kd_serving_new's loads still running (options' startup_done) */
    uint64_t next_id;
    int pid; /* for generated request ids (getpid is a system call) */
    struct kd_auth *auth;
    struct kd_shm_table *shm; /* the registered system shared-memory regions */
    struct kd_metric_family *f_requests, *f_queue, *f_compute, *f_batch, *f_depth, *f_inflight;
    double inflight_total;
};

/* A parsed "/v2/models/<name>[/versions/<v>][/<action>]". */
struct kd_serving_path {
    char name[KD_MODEL_NAME_MAX + 1];
    int64_t version;    /* 0: latest */
    const char *action; /* "", "ready", "infer", "stats", "config" */
};

/** Counts one request of model under the outcome label of kiln_inference_requests_total. */
void kd_serving_count_outcome(struct kd_serving *sv, const struct kd_sched_model *m, const char *outcome);

/** 0 when allowed; otherwise the 401/403 response is appended and its status returned. */
int kd_serving_authorize(struct kd_serving *sv, const struct kd_request *req, enum kd_auth_scope need,
                         struct kd_buf *out);

/** The request's X-Request-Id when it is a plain token, else a generated one, into out. */
void kd_serving_request_id(struct kd_serving *sv, const struct kd_request *req, char *out, size_t n);

/** Appends the JSON error response with X-Request-Id: rid and the more headers (may be NULL). */
int kd_serving_error_with_id(struct kd_buf *out, int status, const char *msg, bool keep_alive, const char *rid,
                             const char *more);

/** The table's entry for name, or NULL. */
struct kd_serving_entry *kd_serving_find_entry(struct kd_serving *sv, const char *name);

/* serving-load-checks.c */
/* Warns once per load of m when its batching delay is not shorter than the request timeout. */
void kd_serving_warn_batching_delay(struct kd_serving *sv, struct kd_sched_model *m);
/* The newest version folder the model's version policy selects that is not valid, or NULL. */
const kd_model_version *kd_serving_selected_invalid(const kd_model_info *info);
/* Warns of each version a "specific" policy lists that has no folder. */
void kd_serving_warn_unlisted_specific(struct kd_serving *sv, const kd_model_info *info);
/* why, for a version whose device no worker drives: names the configured devices. */
void kd_serving_unknown_device(struct kd_serving *sv, const char *name, int64_t version, const char *device,
                               char *why, size_t n);

/** The loaded model mp names (its latest version when mp->version is 0), or NULL with *status
 *  (404 unknown, 503 not ready) and msg set; *transient (may be NULL): not ready only while a
 *  load is under way, which ends by itself (worth a Retry-After). */
struct kd_sched_model *kd_serving_resolve(struct kd_serving *sv, const struct kd_serving_path *mp, int *status,
                                          bool *transient, char *msg, size_t n);

#endif /* KD_API_SERVING_IMPL_H */
