/*
 * api/serving-routes.c — the KServe v2 HTTP routes over the served-model table (serving.c):
 * /v2/models/... (metadata, readiness, config, statistics and inference: the body is checked
 * here, on the loop, the worker converts the tensor data and encodes the answer) and the
 * repository extension (/v2/repository/index, .../load, .../unload).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "serving-impl.h"
#include "shm.h"

/* An inference request between the loop and the worker that runs it. */
struct infer_job {
    struct kd_sched_request r;
    struct kd_serving *sv;
    struct kd_http_pending *pending;
    char id[256];
    char req_id[KD_HTTP_SHORT_HEADER_MAX];
    struct kd_output_asks asks;
    struct kd_infer_data data; /* the inputs' filling, left to the worker */
    bool refused;              /* the worker found the data bad: a 400, counted as rejected */
    struct kd_buf body;        /* the response body, encoded by the worker */
    size_t body_json_len;
    bool encoded; /* body is complete */
    struct kd_shm_use shm; /* the shared-memory regions its tensors use, held until done */
    int shm_status;        /* 400 when an output could not go into its region */
};

/* POST .../load's deferred answer: the done callback of its kd_serving_load. */
struct load_reply {
    struct kd_http_pending *pending;
    char req_id[KD_HTTP_SHORT_HEADER_MAX];
};

/* ---- path parsing ------------------------------------------------------------------------- */

/*
 * A version in a path, as openapi's ^[1-9][0-9]*$ says, that fits int64_t: "01" or "+1" is not
 * another spelling of 1, and a number past the range is refused rather than clamped to it.
 * The version, or -1.
 */
static int64_t path_version(const char *text)
{
    if (text[0] < '1' || text[0] > '9')
        return -1;
    int64_t v = 0;
    for (const char *p = text; *p; p++) {
        if (*p < '0' || *p > '9' || v > (INT64_MAX - (*p - '0')) / 10)
            return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

/* "/v2/models/<name>[/versions/<v>][/<action>]". 0, or an HTTP status with msg. */
static int parse_model_path(const struct kd_request *req, size_t prefix, struct kd_serving_path *mp, char *msg,
                            size_t n)
{
    char path[512];
    size_t len = req->path_len - prefix;
    if (len == 0 || len >= sizeof path) {
        snprintf(msg, n, "malformed model path");
        return len == 0 ? 404 : 414;
    }
    memcpy(path, req->path + prefix, len);
    path[len] = '\0';
    char *parts[5];
    int np = 0;
    for (char *save = NULL, *t = strtok_r(path, "/", &save); t; t = strtok_r(NULL, "/", &save)) {
        if (np == 4) {
            snprintf(msg, n, "malformed model path");
            return 404;
        }
        parts[np++] = t;
    }
    if (np == 0 || !kd_repository_name_valid(parts[0])) {
        snprintf(msg, n, "invalid model name: a model name is " KD_MODEL_NAME_RULE);
        return 400;
    }
    snprintf(mp->name, sizeof mp->name, "%s", parts[0]);
    mp->version = 0;
    int k = 1;
    if (np >= 3 && strcmp(parts[1], "versions") == 0) {
        int64_t v = path_version(parts[2]);
        if (v <= 0) {
            snprintf(msg, n, "invalid model version '%.64s': %s", parts[2], KD_SERVING_VERSION_RULE);
            return 400;
        }
        mp->version = v;
        k = 3;
    }
    static const char *const actions[] = {"ready", "infer", "stats", "config", "load", "unload"};
    mp->action = "";
    if (k + 2 == np && strcmp(parts[k], "trace") == 0 && strcmp(parts[k + 1], "setting") == 0) {
        snprintf(msg, n,
                 "kilnd does not implement Triton's trace extension: per-request timings are in the "
                 "statistics extension and /metrics");
        return 501;
    }
    if (k < np) {
        mp->action = NULL;
        for (size_t i = 0; i < sizeof actions / sizeof actions[0]; i++)
            if (strcmp(parts[k], actions[i]) == 0)
                mp->action = actions[i];
        if (!mp->action || k + 1 != np) {
            snprintf(msg, n, "no route for this model path");
            return 404;
        }
    }
    return 0;
}

/* ---- model endpoints ------------------------------------------------------------------------ */

static int send_json(struct kd_buf *out, struct kd_buf *body, int rc, const struct kd_request *req,
                     const char *rid)
{
    char hdr[256];
    snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\n", rid);
    int status = rc == 0
                     ? kd_resp_append(out, 200, "application/json", body->data, body->len, req->keep_alive, hdr)
                     : kd_resp_error(out, 500, "out of memory", req->keep_alive, hdr);
    kd_buf_free(body);
    return status;
}

/* Worker thread: the request's tensor data into its input buffers, before it joins a run. */
static int infer_prepare(struct kd_sched_request *r)
{
    struct infer_job *j = (struct infer_job *)r;
    if (kd_infer_fill(&j->data, kd_sched_model_config(r->model), r, r->error, sizeof r->error) == 0)
        return 0;
    j->refused = true;
    return -1;
}

/* Worker thread, after the run: the response body, so that the loop only wraps and sends it. */
static void infer_finish(struct kd_sched_request *r)
{
    struct infer_job *j = (struct infer_job *)r;
    struct kd_sched_model *m = r->model;
    if (r->outcome != KD_SCHED_OK)
        return;
    if (kd_shm_use_any(&j->shm) && (j->shm_status = kd_shm_write_outputs(&j->shm, kd_sched_model_config(m), r,
                                                                         r->error, sizeof r->error)) != 0)
        return;
    j->encoded = kd_infer_body(&j->body, kd_sched_model_name(m), kd_sched_model_version(m),
                               kd_sched_model_config(m), r, &j->asks, &j->shm, j->id, &j->body_json_len) == 0;
}

/* {"error": msg} whole: kd_resp_error caps its body near 500 bytes, and a run's failure carries
 * the engine's message (up to 512) behind the scheduler's prefix, whose end names the limit. Bytes
 * outside printable ASCII become '?' as there (a node name may quote anything). */
static int error_whole(struct kd_buf *out, int status, const char *msg, bool ka, const char *hdr)
{
    char clean[sizeof((struct kd_sched_request *)0)->error];
    size_t n = 0;
    for (; msg[n] && n < sizeof clean - 1; n++)
        clean[n] = (unsigned char)msg[n] < 0x20 || (unsigned char)msg[n] >= 0x7f ? '?' : msg[n];
    clean[n] = '\0';
    struct kd_buf body = {0};
    int st = kd_buf_append(&body, "{\"error\":\"", 10) || kd_buf_json_escape(&body, clean, n) ||
                     kd_buf_append(&body, "\"}", 2)
                 ? -1
                 : kd_resp_append(out, status, "application/json", body.data, body.len, ka, hdr);
    kd_buf_free(&body);
    return st;
}

/* The status of a failed run (scheduler.h, enum kd_sched_fault): the request's data is the
 * client's to fix (400); memory that ran out may free up (503, retry); a buffer past a device's
 * limit at this size wants a smaller batch (413); the rest is the server's (500). */
static int failed_status(const struct kd_sched_request *r, bool *retry)
{
    char lost[320];
    *retry = false;
    if (r->model && kd_sched_model_lost(r->model, lost, sizeof lost))
        return 503; /* the input was fine, the device under the model was lost */
    switch (r->fault) {
    case KD_SCHED_FAULT_MEMORY: *retry = true; return 503;
    case KD_SCHED_FAULT_TOO_LARGE: return 413;
    case KD_SCHED_FAULT_INTERNAL: return 500;
    default: return 400;
    }
}

static void infer_done(struct kd_sched_request *r)
{
    struct infer_job *j = (struct infer_job *)r;
    struct kd_serving *sv = j->sv;
    struct kd_sched_model *m = r->model;
    kd_serving_account_done(sv, r, j->refused);
    struct kd_buf *out = kd_http_pending_out(j->pending);
    int status = -1;
    if (out) {
        bool ka = kd_http_pending_keep_alive(j->pending);
        char hdr[256];
        snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\n", j->req_id);
        switch (r->outcome) {
        case KD_SCHED_OK:
            if (j->shm_status)
                status = kd_resp_error(out, j->shm_status, r->error, ka, hdr);
            else
                status = j->encoded ? kd_infer_respond(out, &j->body, j->body_json_len, ka, hdr) : -1;
            break;
        case KD_SCHED_FAILED: {
            bool retry;
            int st = failed_status(r, &retry);
            if (retry)
                snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\nRetry-After: 1\r\n", j->req_id);
            status = error_whole(out, st, r->error, ka, hdr);
            break;
        }
        default:
            snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\nRetry-After: 1\r\n", j->req_id);
            /* Cancelled: the client closed its side of the connection while the request queued.
             * Like most servers kilnd takes that as leaving (it cannot tell a half-close from a
             * close) and does not run it; a client that half-closes still reads why. */
            status = kd_resp_error(out, 503,
                                   r->error[0] ? r->error
                                   : r->outcome == KD_SCHED_CANCELLED
                                       ? "request dropped before it ran: the client "
                                         "closed its side of the connection"
                                       : kd_sched_outcome_to_str(r->outcome),
                                   ka, hdr);
        }
    }
    kd_http_pending_finish(j->pending, status);
    kd_sched_request_clear(r);
    kd_sched_model_release(m);
    kd_shm_use_release(&j->shm);
    kd_buf_free(&j->body);
    free(j);
}

static int handle_infer(struct kd_serving *sv, struct kd_sched_model *m, const struct kd_request *req,
                        struct kd_buf *out, const char *rid)
{
    /* No refusal while draining: a request that gets here was already arriving when the drain
     * began (at the drain a connection closes after its message in progress and nothing later on
     * it is read), and a drain finishes the requests it had accepted. Refusing one here made a
     * client that had sent half its body before SIGTERM get 503 instead of its answer. */
    struct infer_job *j = calloc(1, sizeof *j);
    if (!j)
        return kd_serving_error_with_id(out, 500, "out of memory", req->keep_alive, rid, NULL);
    j->sv = sv;
    snprintf(j->req_id, sizeof j->req_id, "%s", rid);
    struct kd_infer_ctx ic = {sv, sv->o.max_tensor_elements, sv->o.max_string_bytes, sv->shm, &j->shm};
    char msg[256];
    int st = kd_infer_decode(&ic, kd_sched_model_config(m), req, &j->r, &j->asks, j->id, sizeof j->id, &j->data,
                             msg, sizeof msg);
    if (st != 0) {
        kd_shm_use_release(&j->shm);
        free(j);
        kd_serving_count_rejected(sv, m);
        return kd_serving_error_with_id(out, st, msg, req->keep_alive, rid, NULL);
    }
    j->pending = kd_http_defer(req);
    if (!j->pending) {
        kd_sched_request_clear(&j->r);
        kd_shm_use_release(&j->shm);
        free(j);
        return kd_serving_error_with_id(out, 500, "out of memory", req->keep_alive, rid, NULL);
    }
    j->r.model = kd_sched_model_retain(m);
    j->r.cancelled = &j->pending->cancelled;
    j->r.deadline_ns = uv_hrtime() + (uint64_t)sv->o.infer_timeout_ms * 1000000u;
    j->r.done = infer_done;
    j->r.prepare = infer_prepare;
    j->r.finish = infer_finish;
    if (kd_serving_submit(sv, &j->r) != 0) {
        kd_sched_model_release(m);
        kd_sched_request_clear(&j->r);
        kd_shm_use_release(&j->shm);
        struct kd_http_pending *p = j->pending;
        free(j);
        int rc = kd_serving_error_with_id(out, 503, "the model's queue is full; retry later", req->keep_alive, rid,
                                          "Retry-After: 1\r\n");
        kd_http_pending_finish(p, rc);
        return KD_HTTP_DEFERRED;
    }
    return KD_HTTP_DEFERRED;
}

struct stats_rows {
    struct kd_buf *b;
    bool first;
    int rc;
};

static void add_stats_row(void *ud, struct kd_sched_model *m)
{
    struct stats_rows *r = ud;
    r->rc |= r->first ? 0 : kd_buf_puts(r->b, ",");
    r->first = false;
    r->rc |= kd_serving_stats_json(r->b, m);
}

static int all_stats(struct kd_serving *sv, const struct kd_request *req, struct kd_buf *out, const char *rid)
{
    struct kd_buf b = {0};
    int rc = kd_buf_puts(&b, "{\"model_stats\":[");
    struct stats_rows rows = {&b, true, 0};
    kd_serving_each_loaded(sv, add_stats_row, &rows);
    rc |= rows.rc;
    rc |= kd_buf_puts(&b, "]}");
    return send_json(out, &b, rc, req, rid);
}

int kd_serving_handle_models(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    struct kd_serving *sv = ctx;
    char rid[KD_HTTP_SHORT_HEADER_MAX], msg[1024]; /* a load failure's reason whole (kd_serving_entry.why) */
    kd_serving_request_id(sv, req, rid, sizeof rid);
    int st = kd_serving_authorize(sv, req, KD_AUTH_READ, out);
    if (st != 0)
        return st;
    static const char prefix[] = "/v2/models/";
    if (req->path_len == sizeof prefix - 1 + 5 && memcmp(req->path + sizeof prefix - 1, "stats", 5) == 0)
        return req->method == KD_HTTP_GET
                   ? all_stats(sv, req, out, rid)
                   : kd_serving_error_with_id(out, 405, "use GET", req->keep_alive, rid, "Allow: GET\r\n");
    struct kd_serving_path mp;
    st = parse_model_path(req, sizeof prefix - 1, &mp, msg, sizeof msg);
    if (st == 0 && (strcmp(mp.action, "load") == 0 || strcmp(mp.action, "unload") == 0)) {
        snprintf(msg, sizeof msg, "no route for this model path");
        st = 404;
    }
    if (st != 0)
        return kd_serving_error_with_id(out, st, msg, req->keep_alive, rid, NULL);
    bool is_infer = strcmp(mp.action, "infer") == 0;
    unsigned want = is_infer ? KD_HTTP_POST : KD_HTTP_GET;
    if (!(req->method & want))
        return kd_serving_error_with_id(out, 405, is_infer ? "use POST" : "use GET", req->keep_alive, rid,
                                        is_infer ? "Allow: POST\r\n" : "Allow: GET\r\n");
    bool transient = false;
    struct kd_sched_model *m = kd_serving_resolve(sv, &mp, &st, &transient, msg, sizeof msg);
    if (strcmp(mp.action, "ready") == 0) {
        if (!m && st == 404)
            return kd_serving_error_with_id(out, 404, msg, req->keep_alive, rid, NULL);
        char hdr[256], lost[320];
        snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\n", rid);
        if (m && kd_sched_model_lost(m, lost, sizeof lost))
            return kd_resp_error(out, 503, lost, req->keep_alive, hdr); /* loaded on a lost GPU */
        return m && sv->accepting
                   ? kd_resp_append(out, 200, NULL, "", 0, req->keep_alive, hdr)
                   : kd_resp_error(out, 503, m ? "the server is draining" : msg, req->keep_alive, hdr);
    }
    if (!m)
        return kd_serving_error_with_id(out, st, msg, req->keep_alive, rid,
                                        st == 503 && transient ? "Retry-After: 1\r\n" : NULL);
    if (is_infer)
        return handle_infer(sv, m, req, out, rid);
    struct kd_buf b = {0};
    int rc = 0;
    if (strcmp(mp.action, "stats") == 0) {
        rc |= kd_buf_puts(&b, "{\"model_stats\":[");
        struct kd_serving_entry *e = kd_serving_find_entry(sv, mp.name);
        for (int i = 0; e && i < e->nv; i++) {
            if (mp.version && kd_sched_model_version(e->v[i]) != mp.version)
                continue;
            rc |= b.len > 16 ? kd_buf_puts(&b, ",") : 0;
            rc |= kd_serving_stats_json(&b, e->v[i]);
        }
        rc |= kd_buf_puts(&b, "]}");
        return send_json(out, &b, rc, req, rid);
    }
    const kd_model_config *c = kd_sched_model_config(m);
    if (strcmp(mp.action, "config") == 0) {
        rc |= kd_serving_config_json(&b, mp.name, kd_sched_model_format(m), c);
        return send_json(out, &b, rc, req, rid);
    }
    struct kd_serving_entry *e = kd_serving_find_entry(sv, mp.name);
    rc |= kd_buf_puts(&b, "{\"name\":\"");
    rc |= kd_buf_json_escape(&b, mp.name, strlen(mp.name));
    rc |= kd_buf_puts(&b, "\",\"versions\":[");
    for (int i = 0; e && i < e->nv; i++)
        rc |= kd_buf_printf(&b, "%s\"%lld\"", i ? "," : "", (long long)kd_sched_model_version(e->v[i]));
    /* The format it was loaded from ("kiln" or "onnx"): kilnd runs both itself. */
    rc |= kd_buf_printf(&b, "],\"platform\":\"%s\"", kd_sched_model_format(m));
    rc |= kd_serving_specs_json(&b, "inputs", c->inputs, c->ninputs);
    rc |= kd_serving_specs_json(&b, "outputs", c->outputs, c->noutputs);
    rc |= kd_buf_printf(&b, ",\"max_batch_size\":%d}", c->max_batch_size);
    return send_json(out, &b, rc, req, rid);
}

/* ---- repository extension ------------------------------------------------------------------ */

struct index_json {
    struct kd_buf b;
    int rc;
    bool first;
};

static void index_row_json(void *ud, const char *name, int64_t version, const char *state, const char *why)
{
    struct index_json *ij = ud;
    ij->rc |= kd_buf_puts(&ij->b, ij->first ? "{\"name\":\"" : ",{\"name\":\"");
    ij->first = false;
    ij->rc |= kd_buf_json_escape(&ij->b, name, strlen(name));
    if (version > 0)
        ij->rc |= kd_buf_printf(&ij->b, "\",\"version\":\"%lld", (long long)version);
    ij->rc |= kd_buf_printf(&ij->b, "\",\"state\":\"%s\",\"reason\":\"", state);
    ij->rc |= kd_buf_json_escape(&ij->b, why, strlen(why));
    ij->rc |= kd_buf_puts(&ij->b, "\"}");
}

static int repo_index(struct kd_serving *sv, const struct kd_request *req, struct kd_buf *out, const char *rid)
{
    /* The body is empty or {"ready": bool}: with true, only the versions ready to serve. */
    bool only_ready = false;
    if (req->body_len) {
        cJSON *j = cJSON_ParseWithLength(req->body, req->body_len);
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "ready");
        bool ok = cJSON_IsObject(j) && (!r || cJSON_IsBool(r));
        only_ready = ok && cJSON_IsTrue(r);
        cJSON_Delete(j);
        if (!ok)
            return kd_serving_error_with_id(out, 400, "the index request body is {\"ready\": true|false} or empty",
                                            req->keep_alive, rid, NULL);
    }
    struct index_json ij = {.first = true};
    ij.rc = kd_buf_puts(&ij.b, "[");
    kd_serving_index(sv, only_ready, index_row_json, &ij);
    struct kd_buf b = ij.b;
    int rc = ij.rc;
    rc |= kd_buf_puts(&b, "]");
    return send_json(out, &b, rc, req, rid);
}

/*
 * A load request's body: empty, or {"parameters": {...}}. Triton lets "config" (a whole model
 * configuration) and "file:<path>" (model files) ride along; kilnd loads only what the repository
 * folder holds, so those are refused (501) rather than silently ignored. 0, or a status with msg.
 */
static int load_overrides(const struct kd_request *req, char *msg, size_t n)
{
    if (req->body_len == 0)
        return 0;
    cJSON *j = cJSON_ParseWithLength(req->body, req->body_len);
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(j, "parameters");
    int st = 0;
    if (!cJSON_IsObject(j) || (params && !cJSON_IsObject(params))) {
        snprintf(msg, n, "the load request body is a JSON object with an optional \"parameters\" object");
        st = 400;
    }
    for (const cJSON *p = params ? params->child : NULL; p && st == 0; p = p->next)
        if (strcmp(p->string, "config") == 0 || strncmp(p->string, "file:", 5) == 0) {
            snprintf(msg, n,
                     "kilnd does not take a model configuration or files with a load request: put "
                     "config.json and the model file in the model's repository folder, then load");
            st = 501;
        }
    cJSON_Delete(j);
    return st;
}

static void load_reply_send(void *ud, int status, const char *msg)
{
    struct load_reply *r = ud;
    struct kd_buf *out = kd_http_pending_out(r->pending);
    bool ka = kd_http_pending_keep_alive(r->pending);
    int rc = status;
    if (out) {
        char hdr[256];
        snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\n", r->req_id);
        rc = status == 200 ? kd_resp_append(out, 200, "application/json", "{}", 2, ka, hdr)
                           : kd_resp_error(out, status, msg, ka, hdr);
    }
    kd_http_pending_finish(r->pending, rc);
    free(r);
}

int kd_serving_handle_repository(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    struct kd_serving *sv = ctx;
    char rid[KD_HTTP_SHORT_HEADER_MAX], msg[1024]; /* a load failure's reason whole (kd_serving_entry.why) */
    kd_serving_request_id(sv, req, rid, sizeof rid);
    static const char index_path[] = "/v2/repository/index";
    if (req->path_len == sizeof index_path - 1 && memcmp(req->path, index_path, req->path_len) == 0) {
        int st = kd_serving_authorize(sv, req, KD_AUTH_READ, out);
        return st ? st : repo_index(sv, req, out, rid);
    }
    int st = kd_serving_authorize(sv, req, KD_AUTH_ADMIN, out);
    if (st != 0)
        return st;
    static const char prefix[] = "/v2/repository/models/";
    struct kd_serving_path mp;
    if (req->path_len <= sizeof prefix - 1 || memcmp(req->path, prefix, sizeof prefix - 1) != 0)
        return kd_serving_error_with_id(out, 404, "no route for this repository path", req->keep_alive, rid, NULL);
    st = parse_model_path(req, sizeof prefix - 1, &mp, msg, sizeof msg);
    if (st == 0 && mp.version) {
        snprintf(msg, sizeof msg, "load and unload apply to a whole model");
        st = 400;
    } else if (st == 0 && strcmp(mp.action, "load") != 0 && strcmp(mp.action, "unload") != 0) {
        snprintf(msg, sizeof msg, "no route for this repository path");
        st = 404;
    }
    if (st != 0)
        return kd_serving_error_with_id(out, st, msg, req->keep_alive, rid, NULL);
    if (strcmp(mp.action, "unload") == 0) {
        if (kd_serving_unload(sv, mp.name, msg, sizeof msg) != 0)
            return kd_serving_error_with_id(out, 404, msg, req->keep_alive, rid, NULL);
        char hdr[256];
        snprintf(hdr, sizeof hdr, "X-Request-Id: %s\r\n", rid);
        return kd_resp_append(out, 200, "application/json", "{}", 2, req->keep_alive, hdr);
    }
    st = load_overrides(req, msg, sizeof msg);
    if (st != 0)
        return kd_serving_error_with_id(out, st, msg, req->keep_alive, rid, NULL);
    struct load_reply *r = calloc(1, sizeof *r);
    struct kd_http_pending *p = r ? kd_http_defer(req) : NULL;
    if (!p) {
        free(r);
        return kd_serving_error_with_id(out, 500, "out of memory", req->keep_alive, rid, NULL);
    }
    r->pending = p;
    snprintf(r->req_id, sizeof r->req_id, "%s", rid);
    st = kd_serving_load(sv, mp.name, 0, load_reply_send, r, msg, sizeof msg);
    if (st != 0) {
        struct kd_buf *o = kd_http_pending_out(p);
        kd_http_pending_finish(p, kd_serving_error_with_id(o, st, msg, kd_http_pending_keep_alive(p), rid, NULL));
        free(r);
    }
    return KD_HTTP_DEFERRED;
}
