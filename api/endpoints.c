/*
 * api/endpoints.c — handlers for the health probes, server metadata and metrics, and the routes
 * into the model, job and remote tensor services.
 *
 * KServe v2 says a health endpoint answers with its status code alone (200 true, other false),
 * so the 200s carry an empty body; the 503 is an error and carries the usual JSON body.
 */
#include <stdio.h>
#include <string.h>

#include "endpoints.h"
#include "responses.h"
#include "jobs.h"
#include "serving.h"
#include "tensor.h"

#include "scheduler.h"

/* room for "device 'SPEC': <the backend's message>" in a readiness answer */
#define KD_READY_WHY_MAX 600

static int copy_static(const struct kd_buf pair[2], const struct kd_request *req, struct kd_buf *out)
{
    const struct kd_buf *b = &pair[req->keep_alive ? 1 : 0];
    if (kd_buf_append(out, b->data, b->len) != 0)
        return -1;
    /* The status code sits at a fixed offset: "HTTP/1.1 NNN". */
    return (b->data[9] - '0') * 100 + (b->data[10] - '0') * 10 + (b->data[11] - '0');
}

static int handle_live(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    return copy_static(((struct kd_api *)ctx)->live, req, out);
}

static int handle_ready(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    struct kd_api *api = ctx;
    char why[KD_READY_WHY_MAX];
    /* a device that failed for good (a lost GPU) makes the server unable to serve */
    if (api->sched && kd_sched_device_health(api->sched, why, sizeof why) != 0)
        return kd_resp_error(out, 503, why, req->keep_alive, NULL);
    return copy_static(api->ready, req, out);
}

static int handle_meta(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    return copy_static(((struct kd_api *)ctx)->meta, req, out);
}

/* One device's idle pool trims, and its allocator figures into the gauges; devices that keep
 * no figures (ref, remote) are left out of those rather than shown as zero. */
static void sample_device_memory(void *ctx, const char *spec, kiln_device *dev)
{
    struct kd_api *api = ctx;
    struct kd_sched_pool_stats ps;
    if (kd_sched_pool_stats(api->sched, spec, &ps) == 0) {
        struct kd_metric_series *t = kd_metrics_series(api->pool_trims, (const char *const[]){spec, NULL});
        struct kd_metric_series *b = kd_metrics_series(api->pool_released, (const char *const[]){spec, NULL});
        if (t)
            kd_metric_set(t, (double)ps.trims);
        if (b)
            kd_metric_set(b, (double)ps.released_bytes);
    }
    kiln_device_memory m;
    if (kiln_device_memory_get(dev, &m) != 0)
        return;
    /* the states are parts of one whole (what is reserved from the device), so that a sum by
     * device means something; the peak is a figure of its own */
    static const char *const states[] = {"in_use", "cached"};
    const uint64_t values[] = {m.in_use_bytes, m.cached_bytes};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        struct kd_metric_series *s = kd_metrics_series(api->device_memory,
                                                       (const char *const[]){spec, states[i], NULL});
        if (s)
            kd_metric_set(s, (double)values[i]);
    }
    struct kd_metric_series *peak = kd_metrics_series(api->device_memory_peak, (const char *const[]){spec, NULL});
    if (peak)
        kd_metric_set(peak, (double)m.peak_in_use_bytes);
    struct kd_metric_series *a = kd_metrics_series(api->device_allocs, (const char *const[]){spec, NULL});
    struct kd_metric_series *r = kd_metrics_series(api->device_reuses, (const char *const[]){spec, NULL});
    if (a)
        kd_metric_set(a, (double)m.device_allocs);
    if (r)
        kd_metric_set(r, (double)m.reuses);
}

static int handle_metrics(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    struct kd_api *api = ctx;
    if (api->sched && api->device_memory && api->device_memory_peak && api->device_allocs && api->device_reuses &&
        api->pool_trims && api->pool_released)
        kd_sched_each_device(api->sched, sample_device_memory, api);
    if (api->serving)
        kd_serving_sample_gauges(api->serving);
    kd_jobs_sample_gauges(api->jobs);
    api->scratch.len = 0;
    if (kd_metrics_render(api->metrics, &api->scratch) != 0)
        return kd_resp_error(out, 500, "out of memory rendering metrics", req->keep_alive, NULL);
    return kd_resp_append(out, 200, "text/plain; version=0.0.4; charset=utf-8", api->scratch.data,
                          api->scratch.len, req->keep_alive, NULL);
}

static int handle_models(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    struct kd_api *api = ctx;
    if (!api->serving)
        return kd_resp_error(out, 503, "model serving is not available", req->keep_alive, NULL);
    return kd_serving_handle_models(api->serving, req, out);
}

static int handle_repository(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    struct kd_api *api = ctx;
    if (!api->serving)
        return kd_resp_error(out, 503, "model serving is not available", req->keep_alive, NULL);
    return kd_serving_handle_repository(api->serving, req, out);
}

static int handle_shm(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    struct kd_api *api = ctx;
    if (!api->serving)
        return kd_resp_error(out, 503, "model serving is not available", req->keep_alive, NULL);
    return kd_serving_handle_shm(api->serving, req, out);
}

static int handle_jobs(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    struct kd_api *api = ctx;
    if (!api->jobs && api->jobs_unavailable[0])
        return kd_resp_error(out, 507, api->jobs_unavailable, req->keep_alive, NULL);
    if (!api->jobs)
        return kd_resp_error(out, 503, "training jobs are not available", req->keep_alive, NULL);
    return kd_jobs_handle(api->jobs, req, out);
}

static int handle_tensor(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    struct kd_api *api = ctx;
    if (!api->tensor)
        return kd_resp_error(out, 503, "remote tensor sessions are not available", req->keep_alive, NULL);
    return kd_tensor_service_handle(api->tensor, req, out);
}

/* ---- the methods each path under a prefix route takes (router.h: methods_at) ---- */

/* Splits rest on '/' into at most max segments; the count, or -1 for an empty segment or too many. */
static int split_path(const char *rest, size_t len, const char **seg, size_t *seglen, int max)
{
    int n = 0;
    size_t i = 0;
    while (i < len) {
        size_t j = i;
        while (j < len && rest[j] != '/')
            j++;
        if (j == i || n == max)
            return -1;
        seg[n] = rest + i;
        seglen[n++] = j - i;
        i = j + 1;
        if (j < len && i == len)
            return -1; /* a trailing slash */
    }
    return n;
}

static bool seg_is(const char *seg, size_t len, const char *word)
{
    return strlen(word) == len && memcmp(seg, word, len) == 0;
}

/* /v2/models/stats, /v2/models/{name}[/versions/{v}][/ready|/infer|/stats] */
static unsigned models_methods(const char *rest, size_t len)
{
    const char *seg[4];
    size_t sl[4];
    int n = split_path(rest, len, seg, sl, 4);
    if (n < 1)
        return 0;
    int k = 1;
    if (n >= 3 && seg_is(seg[1], sl[1], "versions"))
        k = 3;
    if (n == k)
        return KD_HTTP_GET;
    if (n != k + 1)
        return 0;
    if (seg_is(seg[k], sl[k], "infer"))
        return KD_HTTP_POST;
    if (seg_is(seg[k], sl[k], "ready") || seg_is(seg[k], sl[k], "stats") || seg_is(seg[k], sl[k], "config"))
        return KD_HTTP_GET;
    return 0;
}

/* /v2/systemsharedmemory/[region/{name}/]status|unregister, .../region/{name}/register */
static unsigned shm_methods(const char *rest, size_t len)
{
    const char *seg[3];
    size_t sl[3];
    int n = split_path(rest, len, seg, sl, 3);
    if (n != 1 && !(n == 3 && seg_is(seg[0], sl[0], "region")))
        return 0;
    const char *last = seg[n - 1];
    size_t ll = sl[n - 1];
    if (seg_is(last, ll, "status"))
        return KD_HTTP_GET;
    if (seg_is(last, ll, "unregister") || (n == 3 && seg_is(last, ll, "register")))
        return KD_HTTP_POST;
    return 0;
}

/* /v1/jobs/{id}[/events|/metrics|/logs|/resume] */
static unsigned jobs_methods(const char *rest, size_t len)
{
    const char *seg[2];
    size_t sl[2];
    int n = split_path(rest, len, seg, sl, 2);
    if (n == 1)
        return KD_HTTP_GET | KD_HTTP_DELETE;
    if (n != 2)
        return 0;
    if (seg_is(seg[1], sl[1], "resume"))
        return KD_HTTP_POST;
    if (seg_is(seg[1], sl[1], "events") || seg_is(seg[1], sl[1], "metrics") || seg_is(seg[1], sl[1], "logs"))
        return KD_HTTP_GET;
    return 0;
}

/*
 * Triton extensions tritonclient can call that kilnd does not implement: a 501 that says so and
 * what to do instead, rather than a bare 404 a client could take for a wrong URL.
 */
static int handle_not_implemented(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    (void)ctx;
    static const struct {
        const char *prefix, *msg;
    } what[] = {
        {"/v2/logging", "kilnd does not implement Triton's logging extension: the log is set by log_level, "
                        "log_format and log_file in its configuration"},
        {"/v2/trace", "kilnd does not implement Triton's trace extension: per-request timings are in the "
                      "statistics extension and /metrics"},
        {"/v2/cudasharedmemory", "kilnd does not implement the CUDA shared-memory extension: use system "
                                 "shared memory (/v2/systemsharedmemory) or send tensors in the request body"},
    };
    for (size_t i = 0; i < sizeof what / sizeof what[0]; i++)
        if (req->path_len >= strlen(what[i].prefix) && memcmp(req->path, what[i].prefix, strlen(what[i].prefix)) == 0)
            return kd_resp_error(out, 501, what[i].msg, req->keep_alive, NULL);
    return kd_resp_error(out, 501, "not implemented", req->keep_alive, NULL);
}

static const struct kd_route routes[] = {
    {"/v2/health/live", KD_HTTP_GET, handle_live, NULL},
    {"/v2/health/ready", KD_HTTP_GET, handle_ready, NULL},
    {"/v2", KD_HTTP_GET, handle_meta, NULL},
    {"/metrics", KD_HTTP_GET, handle_metrics, NULL},
    {"/v2/models/*", KD_HTTP_GET | KD_HTTP_POST, handle_models, models_methods},
    {"/v2/repository/*", KD_HTTP_POST, handle_repository, NULL},
    {"/v1/jobs", KD_HTTP_GET | KD_HTTP_POST, handle_jobs, NULL},
    {"/v1/jobs/*", KD_HTTP_GET | KD_HTTP_POST | KD_HTTP_DELETE, handle_jobs, jobs_methods},
    {"/v1/tensor", KD_HTTP_GET, handle_tensor, NULL},
    {"/v2/logging", KD_HTTP_GET | KD_HTTP_POST, handle_not_implemented, NULL},
    {"/v2/trace/setting", KD_HTTP_GET | KD_HTTP_POST, handle_not_implemented, NULL},
    {"/v2/systemsharedmemory/*", KD_HTTP_GET | KD_HTTP_POST, handle_shm, shm_methods},
    {"/v2/cudasharedmemory/*", KD_HTTP_GET | KD_HTTP_POST, handle_not_implemented, NULL},
};

static int render_pair(struct kd_buf pair[2], int status, const char *ctype, const char *body)
{
    for (int ka = 0; ka < 2; ka++) {
        pair[ka].len = 0;
        int rc = status >= 400 ? kd_resp_error(&pair[ka], status, body, ka, NULL)
                               : kd_resp_append(&pair[ka], status, ctype, body, strlen(body), ka, NULL);
        if (rc < 0)
            return -1;
    }
    return 0;
}

int kd_api_set_ready(struct kd_api *api, bool ready, const char *state)
{
    char msg[96];
    snprintf(msg, sizeof msg, "not ready: %s", state);
    return ready ? render_pair(api->ready, 200, NULL, "") : render_pair(api->ready, 503, NULL, msg);
}

int kd_api_init(struct kd_api *api, struct kd_metrics *metrics, const char *const *extensions)
{
    memset(api, 0, sizeof *api);
    api->metrics = metrics;
    api->router.routes = routes;
    api->router.count = sizeof routes / sizeof routes[0];
    for (size_t i = 0; i < api->router.count; i++)
        if (strcmp(routes[i].path, "/v2/models/*") == 0)
            api->models_route = i;

    struct kd_buf meta = {0};
    int rc = kd_buf_printf(&meta, "{\"name\":\"kiln\",\"version\":\"%s\",\"extensions\":[", KILN_VERSION);
    for (size_t i = 0; extensions && extensions[i] && rc == 0; i++) {
        rc |= kd_buf_puts(&meta, i ? ",\"" : "\"");
        rc |= kd_buf_json_escape(&meta, extensions[i], strlen(extensions[i]));
        rc |= kd_buf_puts(&meta, "\"");
    }
    rc |= kd_buf_append(&meta, "]}", 3); /* with the NUL, so render_pair can strlen it */
    if (rc == 0)
        rc = render_pair(api->meta, 200, "application/json", meta.data);
    kd_buf_free(&meta);
    if (rc == 0)
        rc = render_pair(api->live, 200, NULL, "");
    if (rc == 0)
        rc = kd_api_set_ready(api, false, "starting");
    if (rc == 0 && metrics) {
        api->device_memory = kd_metrics_family(
            metrics, "kiln_device_memory_bytes",
            "Device memory a device's allocator holds, in_use by live tensors or cached for reuse; their sum "
            "is what is reserved from the device. Only devices that keep figures (GPUs, and cpu's buffer pool).",
            KD_METRIC_GAUGE, (const char *const[]){"device", "state", NULL}, NULL, 0);
        api->device_memory_peak = kd_metrics_family(
            metrics, "kiln_device_memory_peak_bytes",
            "The most device memory live tensors held at once since start.", KD_METRIC_GAUGE,
            (const char *const[]){"device", NULL}, NULL, 0);
        api->device_allocs = kd_metrics_family(metrics, "kiln_device_memory_allocations_total",
                                               "Allocations that reached the device driver, or the system on cpu "
                                               "(not served from the allocator's cache).",
                                               KD_METRIC_COUNTER, (const char *const[]){"device", NULL}, NULL, 0);
        api->device_reuses = kd_metrics_family(metrics, "kiln_device_memory_reuses_total",
                                               "Allocations served from the allocator's cache.", KD_METRIC_COUNTER,
                                               (const char *const[]){"device", NULL}, NULL, 0);
        api->pool_trims = kd_metrics_family(metrics, "kiln_device_pool_trims_total",
                                            "Times a device idle for limits.pool_idle_trim_ms had its cached "
                                            "buffers handed back to the system.",
                                            KD_METRIC_COUNTER, (const char *const[]){"device", NULL}, NULL, 0);
        api->pool_released = kd_metrics_family(metrics, "kiln_device_pool_released_bytes_total",
                                               "Cached buffers those idle trims handed back to the system.",
                                               KD_METRIC_COUNTER, (const char *const[]){"device", NULL}, NULL, 0);
        rc = api->device_memory && api->device_allocs && api->device_reuses && api->pool_trims &&
                     api->pool_released
                 ? 0
                 : -1;
    }
    if (rc != 0)
        kd_api_free(api);
    return rc;
}

void kd_api_free(struct kd_api *api)
{
    for (int i = 0; i < 2; i++) {
        kd_buf_free(&api->live[i]);
        kd_buf_free(&api->ready[i]);
        kd_buf_free(&api->meta[i]);
    }
    kd_buf_free(&api->scratch);
}
