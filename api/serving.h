/*
 * api/serving.h — the KServe v2 model endpoints: model metadata, readiness, inference (JSON and
 * binary tensor data), the model repository extension (index, load, unload), the statistics
 * extension, bearer-token scopes and the per-model metrics.
 *
 * It keeps the table of served models (name -> loaded versions, each a reference-counted
 * scheduler model), so a load that swaps versions never pulls a model out from under a request:
 * the request holds its own reference until its answer is written.
 *
 * Thread affinity: everything here runs on the I/O loop thread, except kd_infer_fill and
 * kd_infer_body, which the inference workers run.
 */
#ifndef KD_API_SERVING_H
#define KD_API_SERVING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "buf.h"
#include "config.h"
#include "metrics.h"
#include "router.h"
#include "scheduler.h"

struct kd_serving_options {
    uv_loop_t *loop;
    const char *models_root;            /* <data_dir>/models */
    struct kd_sched *sched;             /* borrowed */
    struct kd_metrics *metrics;         /* borrowed */
    const struct kd_strlist *tokens;    /* "admin:T", "read:T" or "T" (read) */
    int64_t max_tensor_elements;
    int64_t max_string_bytes;
    int64_t infer_timeout_ms;
    void (*log)(void *ud, enum kd_log_level level, const char *msg);
    void *log_ud;
    /* Optional: runs once on the loop when the last of the loads kd_serving_new started has
     * finished, loaded or failed (never from inside kd_serving_new: ask
     * kd_serving_startup_loads then). Loads asked for later do not count. */
    void (*startup_done)(void *ud);
    void *startup_ud;
};

struct kd_serving;

/* Opens the repository and starts loading every served version. NULL with err on failure. */
struct kd_serving *kd_serving_new(const struct kd_serving_options *o, char *err, size_t errlen);
/* The loads kd_serving_new started that have not finished yet. */
int kd_serving_startup_loads(const struct kd_serving *sv);
/* Releases every model (call after kd_sched_stop delivered the last completions). */
void kd_serving_free(struct kd_serving *sv);
/* Not ready while draining: readiness answers 503. Infer requests that reach the router while
 * draining were already in flight when the drain began and are served. */
void kd_serving_set_accepting(struct kd_serving *sv, bool accepting);

/*
 * The one way a model gets (re)loaded, used by POST /v2/repository/models/<name>/load and by a
 * training job that added a version: rescan the repository, build every version the model's
 * policy serves on its device's worker and, once all have finished, swap the model table's entry
 * (requests already holding the old versions finish on them). done then runs on the loop, once:
 * status 200 and why NULL when the entry now answers with the new versions, or 400 and the reason
 * (the entry keeps serving what it served before). Every version the policy selects must load:
 * the policy is applied to every version folder, valid or not (as Triton does), and one that is
 * not valid or fails to build fails the load, its reason naming it. With need_version > 0 the
 * load also fails, without a swap, unless that version is among those loaded. Returns 0, or an
 * HTTP status (404 unknown model, 400 invalid model or a selected version not valid, 500) with
 * why filled, and then done is never called.
 */
typedef void (*kd_serving_load_done)(void *ud, int status, const char *why);
int kd_serving_load(struct kd_serving *sv, const char *name, int64_t need_version, kd_serving_load_done done,
                    void *ud, char *why, size_t whylen);

/* Route handlers: ctx is the struct kd_serving. */
int kd_serving_handle_models(void *ctx, const struct kd_request *req, struct kd_buf *out);
int kd_serving_handle_repository(void *ctx, const struct kd_request *req, struct kd_buf *out);
/* /v2/systemsharedmemory/... (shm-routes.c). */
int kd_serving_handle_shm(void *ctx, const struct kd_request *req, struct kd_buf *out);

/*
 * For other protocols over the same table (the gRPC service): the same lookups, rules, loads
 * and accounting as the HTTP endpoints. Statuses are HTTP's (the caller maps them).
 */
struct kd_auth;
struct kd_shm_table;
struct kd_shm_use;
/* The loaded version (0: the latest) of name, borrowed; NULL with *status 400/404/503 and msg. */
struct kd_sched_model *kd_serving_model(struct kd_serving *sv, const char *name, int64_t version, int *status,
                                        char *msg, size_t n);
/* The loaded versions of name, ascending, borrowed (at most max); their count. */
int kd_serving_versions(struct kd_serving *sv, const char *name, struct kd_sched_model **out, int max);
/* Calls each(ud, m) for every loaded version of every model (borrowed), from the model table in
 * memory: what the all-model statistics of both protocols list. */
void kd_serving_each_loaded(struct kd_serving *sv, void (*each)(void *ud, struct kd_sched_model *m), void *ud);
/* What kd_serving_parse_version takes, for messages refusing a version. */
#define KD_SERVING_VERSION_RULE "a version is a whole number from 1 to 9223372036854775807, without leading zeros"
/* A request's model version: "" or NULL is the latest (0); otherwise a positive integer written
 * without leading zeros, within int64; -1 for anything else. */
int64_t kd_serving_parse_version(const char *text);
bool kd_serving_accepting(const struct kd_serving *sv);
const struct kd_auth *kd_serving_auth(const struct kd_serving *sv);
/* The registered system shared-memory regions (api/shm.h), for both protocols. */
struct kd_shm_table *kd_serving_shm(struct kd_serving *sv);
/* The options it was made with (limits, scheduler, log). */
const struct kd_serving_options *kd_serving_limits(const struct kd_serving *sv);
/* Every repository model version as the index shows it (version 0: the model has none), in name
 * and version order, with every version still served whose folder has left the repository (READY,
 * its reason saying the folder is gone, so that an unload is for good). */
void kd_serving_index(struct kd_serving *sv, bool only_ready,
                      void (*row)(void *ud, const char *name, int64_t version, const char *state, const char *why),
                      void *ud);
/* 0, or 404 with msg when name is not loaded. */
int kd_serving_unload(struct kd_serving *sv, const char *name, char *msg, size_t n);
/* Queues r (model retained by the caller) with the HTTP path's accounting; -1 when the queue is full
 * (counted under the outcome "overloaded"). */
int kd_serving_submit(struct kd_serving *sv, struct kd_sched_request *r);
/* In r's done callback, before anything else: the metrics of its outcome (refused: its data was bad). */
void kd_serving_account_done(struct kd_serving *sv, const struct kd_sched_request *r, bool refused);
/* Sets each loaded version's queue-depth gauge from its queue now, before /metrics renders:
 * updated only at submit and answer, it read the requests a worker had already taken off. */
void kd_serving_sample_gauges(struct kd_serving *sv);
/* A request to m refused before it was queued (its input): counted under the outcome "rejected"
 * and as a failure in m's statistics. */
void kd_serving_count_rejected(struct kd_serving *sv, struct kd_sched_model *m);

/* ---- between serving.c and infer.c ---- */
struct kd_infer_ctx {
    struct kd_serving *sv;
    int64_t max_tensor_elements;
    int64_t max_string_bytes;
    /* Both NULL: a tensor in shared memory is refused. Otherwise the regions a request names are
     * looked up in shm and retained into use (the caller releases them when the request is done). */
    struct kd_shm_table *shm;
    struct kd_shm_use *use;
};

/*
 * What the loop leaves to a worker: filling the input buffers. The JSON "data" arrays were only
 * skipped (kd_jscan_skip_lax) on the loop; the worker checks and converts them, and copies
 * binary tensor data. The pointers are into the request body, which the pending response keeps
 * alive until the answer is written.
 */
struct kd_infer_data {
    const char *body, *jend;            /* the request's JSON */
    int n;                              /* inputs to fill, in document order */
    struct {
        int input;                      /* r->inputs[input] */
        const char *json;               /* its "data" array, or NULL for binary data: */
        const char *bin;                /* r->inputs[input].nbytes bytes to copy */
        bool fp16;                      /* FP16 sent on as f32: its range is checked */
    } fill[KD_SCHED_MAX_IO];
    int nlax;                           /* the arrays skipped unchecked, the converted ones included */
    const char *lax[KD_SCHED_MAX_IO];
};

/* What a request asks of each model output (its "outputs" and their parameters). */
struct kd_output_asks {
    bool want[KD_SCHED_MAX_IO];       /* in the response */
    bool binary[KD_SCHED_MAX_IO];     /* as binary data after the JSON (HTTP) */
    int64_t classes[KD_SCHED_MAX_IO]; /* > 0: the top so many classes instead of the scores
                                         (the classification extension, api/classify.h) */
};

/*
 * Decodes a KServe v2 infer request (JSON, or a JSON header plus binary tensor data) for model
 * config c into r's inputs; fills asks for each model output and the request "id" into id
 * (bounded). Returns 0, or an HTTP status with msg filled.
 *
 * With dd NULL it does the whole job. Otherwise it does everything but filling the input buffers
 * (which it allocates and sizes) and describes that in dd for kd_infer_fill, to be run later,
 * on another thread. The status and message either returns are those a decode of the whole
 * request in one go would have returned.
 */
int kd_infer_decode(const struct kd_infer_ctx *ic, const kd_model_config *c, const struct kd_request *req,
                    struct kd_sched_request *r, struct kd_output_asks *asks, char *id, size_t idlen,
                    struct kd_infer_data *dd, char *msg, size_t msglen);
/* Checks a requested output's "classification" count (HTTP and gRPC alike): 0 when output k of
 * c may be classified into count classes, else 400 with msg naming the output. in_shm: the
 * output was asked into shared memory (classes are strings, not the region's layout). */
int kd_infer_check_classes(const kd_model_config *c, int k, int64_t count, bool in_shm, char *msg, size_t msglen);
/* The index of the spec named name in specs[0..n), or -1. */
int kd_infer_find_spec(const kd_model_tensor_spec *specs, int n, const char *name);
/* c's input names, comma-separated, into buf (cut at len), for messages;
 * returns buf. */
const char *kd_infer_input_list(const kd_model_config *c, char *buf, size_t len);
/* Fills r's input buffers as dd says (any thread). 0, or 400 with msg filled. */
int kd_infer_fill(const struct kd_infer_data *dd, const kd_model_config *c, struct kd_sched_request *r, char *msg,
                  size_t msglen);

/*
 * The response body of a finished request into j (any thread): its JSON, then the binary
 * outputs; *json_len is the JSON's length. 0, or -1 when out of memory.
 */
int kd_infer_body(struct kd_buf *j, const char *model, int64_t version, const kd_model_config *c,
                  const struct kd_sched_request *r, const struct kd_output_asks *asks,
                  const struct kd_shm_use *shm, const char *id, size_t *json_len);

/* Appends the whole HTTP response around a body from kd_infer_body. The status, or -1. */
int kd_infer_respond(struct kd_buf *out, const struct kd_buf *body, size_t json_len, bool keep_alive,
                     const char *extra_headers);

/* ,"<key>":[...] for a list of tensor specs, as the metadata endpoint shows them (model-json.c). */
int kd_serving_specs_json(struct kd_buf *b, const char *key, const kd_model_tensor_spec *sp, int n);
/* One version's statistics as Triton's statistics extension shows them (model-json.c). */
int kd_serving_stats_json(struct kd_buf *b, struct kd_sched_model *m);
/*
 * A model's configuration as Triton's model-configuration JSON (model-json.c), from the
 * config the scheduler runs it with; format is "kiln" or "onnx". 0, or -1 when out of memory.
 */
int kd_serving_config_json(struct kd_buf *b, const char *name, const char *format, const kd_model_config *c);

#endif /* KD_API_SERVING_H */
