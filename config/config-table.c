/*
 * config/config-table.c — the one table that knows kilnd's configuration keys, and the typed
 * setters that validate a value against it. The file loader, the environment, the flags,
 * --help and the generated documentation all read this table; no other place lists keys.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "config-impl.h"

static const char *const log_levels[] = {"error", "warn", "info", "debug", NULL};
static const char *const log_formats[] = {"text", "json", NULL};
static const char *const off_on[] = {"off", "on", NULL};

#define OFF(field) offsetof(struct kd_config, field)
#define KIB 1024LL
#define MIB (1024LL * 1024LL)

const struct kd_config_key kd_config_keys[] = {
    {"host", KD_CT_STRING, OFF(host), 1, 255, NULL, "127.0.0.1", "KILN_HOST", "--host",
     "Address to listen on. Anything but loopback (127.0.0.0/8, ::1, localhost) requires api_tokens; kilnd "
     "refuses to start without them."},
    {"port", KD_CT_INT, OFF(port), 0, 65535, NULL, "8080", "KILN_PORT", "--port",
     "TCP port. 0 picks a free port; the chosen port is logged first (at level notice, whatever log_level says) "
     "and written to <data_dir>/kilnd.port."},
    {"grpc_port", KD_CT_INT, OFF(grpc_port), -1, 65535, NULL, "-1", "KILN_GRPC_PORT", "--grpc-port",
     "TCP port for the KServe v2 gRPC service (on host, beside HTTP). -1 turns it off; 0 picks a free port, "
     "which is logged (at level notice) and written to <data_dir>/kilnd.grpc_port."},
    {"data_dir", KD_CT_STRING, OFF(data_dir), 1, 4096, NULL, "./var", "KILN_DATA_DIR", "--data-dir",
     "Folder for the job store (kiln.db), models and checkpoints; created when missing. One kilnd per folder: "
     "a start on a folder another kilnd is using is refused, naming that kilnd's pid (kilnd.lock holds the lock, "
     "which the system releases when that kilnd ends, however it ends)."},
    {"model_repository", KD_CT_STRING, OFF(model_repository), 0, 4096, NULL, "", "KILN_MODEL_REPOSITORY",
     "--model-repository",
     "Folder of models (<name>/<version>/ folders) to serve, as Triton and KServe mount one (e.g. /mnt/models); "
     "empty means <data_dir>/models, created when missing. A folder set here must exist (a missing one stops the "
     "start) and is served as it is found: kilnd never creates it nor copies example_models into it, and writes "
     "into it only when a training job registers a model, so it may be read-only (a job that would "
     "register a model there is then refused at submission, saying so). Files beside the model folders (a "
     "README.md) are passed over. Writable state (job "
     "store, checkpoints, port file) stays in data_dir."},
    {"example_models", KD_CT_STRING, OFF(example_models), 0, 4096, NULL, "", "KILN_EXAMPLE_MODELS",
     "--example-models",
     "Folder of example models (<name>/<version>/ folders) copied into <data_dir>/models at start when that "
     "repository holds no model yet; empty means none. A missing folder stops the start. Nothing is copied when "
     "model_repository is set (the log says so). The README's run command passes examples/models."},
    {"devices", KD_CT_STRLIST, OFF(devices), 1, 64, NULL, "cpu", "KILN_DEVICES", "--devices",
     "Devices to open, e.g. [\"cpu\", \"cuda:0\"]. Comma-separated in the environment and on the command line. "
     "One device listed twice, under any two spellings (\"vulkan\" and \"vulkan:0\"), is refused. A model's "
     "`device` names one of them as written here or as the device names itself (\"vulkan:0\")."},
    {"device_options", KD_CT_STRLIST, OFF(device_options), 0, 8, NULL, "", "KILN_DEVICE_OPTIONS",
     "--device-options",
     "Options for every device of a backend, each \"BACKEND:key=value&key=value\", e.g. "
     "\"cpu:threads=2&conv=direct\" "
     "(the device options are listed in docs/configuration.md, or by kilnd --print-config-doc). They override the "
     "backend's environment variables; a device spec's "
     "own "
     "options (\"cpu?threads=4\") override them. An unknown option or bad value stops the start, naming it."},
    {"worker_threads", KD_CT_INT, OFF(worker_threads), 0, 1024, NULL, "0", "KILN_WORKER_THREADS",
     "--worker-threads", "Inference worker threads per device, each with its own model instances; 0 means one."},
    {"limits.max_header_bytes", KD_CT_INT, OFF(limits.max_header_bytes), 256, 1 * MIB, NULL, "8192",
     "KILN_MAX_HEADER_BYTES", "--max-header-bytes",
     "Largest request line plus header block; larger requests get 431 and the connection closes. This is the "
     "only bound on a header: kilnd keeps the fields it reads whole (an X-Request-Id longer than 128 characters, "
     "or holding other than letters, digits and -_.:, is replaced by a generated one), and every api_tokens token "
     "must be at least 64 bytes shorter, room for the request line and the Authorization field around it."},
    {"limits.max_body_bytes", KD_CT_INT, OFF(limits.max_body_bytes), 0, 4096 * MIB, NULL, "16777216",
     "KILN_MAX_BODY_BYTES", "--max-body-bytes",
     "Largest request body (after de-chunking); larger bodies get 413 and the connection closes. A gzip or "
     "deflate body is held to it once inflated as well; one that passes it only then gets 413 and the "
     "connection stays open, since the body was read whole."},
    {"limits.idle_timeout_ms", KD_CT_INT, OFF(limits.idle_timeout_ms), 10, 86400000, NULL, "60000",
     "KILN_IDLE_TIMEOUT_MS", "--idle-timeout-ms",
     "A keep-alive connection with no request in progress is closed after this long (HTTP and gRPC). "
     "It also bounds a client that stops reading: a gRPC connection whose answers wait this long "
     "unread, or held by its flow-control windows, is cut, and a remote tensor session whose client "
     "reads none of its replies for half of it is closed."},
    {"limits.max_connections", KD_CT_INT, OFF(limits.max_connections), 1, 1000000, NULL, "1024",
     "KILN_MAX_CONNECTIONS", "--max-connections",
     "Client connections kilnd keeps open at once, HTTP and gRPC together (a remote tensor session is one). "
     "A connection past it is refused: over HTTP with 503 and Retry-After: 1 before its request is read, "
     "over gRPC with GOAWAY ENHANCE_YOUR_CALM before any stream is served; the connections already open "
     "are served as before. A run of refusals is logged once when it starts and once when a connection is "
     "served again; /metrics counts them in kiln_connections_refused_total. At start kilnd raises its "
     "open-file limit (toward the hard limit) to hold this many connections and 320 descriptors more; "
     "when the hard limit is lower, the limit is lowered to fit, with a warning."},
    {"limits.request_timeout_ms", KD_CT_INT, OFF(limits.request_timeout_ms), 10, 86400000, NULL, "30000",
     "KILN_REQUEST_TIMEOUT_MS", "--request-timeout-ms",
     "A request must arrive completely within this long of its first byte, or it gets 408 and the connection "
     "closes."},
    {"limits.max_tensor_elements", KD_CT_INT, OFF(limits.max_tensor_elements), 1, 1LL << 34, NULL, "16777216",
     "KILN_MAX_TENSOR_ELEMENTS", "--max-tensor-elements",
     "Most elements one inference input may have; checked before anything is allocated (413)."},
    {"limits.max_string_bytes", KD_CT_INT, OFF(limits.max_string_bytes), 1, 65536, NULL, "128",
     "KILN_MAX_STRING_BYTES", "--max-string-bytes",
     "Longest string a request may carry where a string is expected (the inference request id)."},
    {"limits.max_queue_depth", KD_CT_INT, OFF(limits.max_queue_depth), 1, 1000000, NULL, "256",
     "KILN_MAX_QUEUE_DEPTH", "--max-queue-depth",
     "Requests a model's queue may hold; past it, inference answers 503 with Retry-After."},
    {"limits.infer_timeout_ms", KD_CT_INT, OFF(limits.infer_timeout_ms), 1, 3600000, NULL, "10000",
     "KILN_INFER_TIMEOUT_MS", "--infer-timeout-ms",
     "An inference request that has not started running this long after it arrived gets 503."},
    {"limits.pool_idle_trim_ms", KD_CT_INT, OFF(limits.pool_idle_trim_ms), 0, 86400000, NULL, "30000",
     "KILN_POOL_IDLE_TRIM_MS", "--pool-idle-trim-ms",
     "A device keeps the buffers its work frees for reuse and gives them back only when an allocation needs the "
     "room, so after a large batch or a training job an idle kilnd would go on holding that memory. Once a device "
     "has had no work (inference, remote tensor sessions, model loads, training jobs) for this long, its worker "
     "hands those cached buffers back to the system; the next request reserves memory afresh. /metrics shows "
     "kiln_device_memory_bytes{state=\"cached\"} and kiln_device_pool_trims_total. 0 turns the trim off."},
    {"remote.max_sessions", KD_CT_INT, OFF(remote.max_sessions), 0, 100000, NULL, "64", "KILN_REMOTE_MAX_SESSIONS",
     "--remote-max-sessions",
     "Remote tensor sessions (WebSocket connections to /v1/tensor) open at once; past it the upgrade gets 503. "
     "0 turns the endpoint off."},
    {"remote.max_message_bytes", KD_CT_INT, OFF(remote.max_message_bytes), 1024, 1024 * MIB, NULL, "67108864",
     "KILN_REMOTE_MAX_MESSAGE_BYTES", "--remote-max-message-bytes",
     "Largest WebSocket message a remote session may send (after reassembling fragments); a larger one closes "
     "the session with 1009, checked from the frame header before its payload is buffered."},
    {"remote.max_live_bytes", KD_CT_INT, OFF(remote.max_live_bytes), 0, 1LL << 40, NULL, "1073741824",
     "KILN_REMOTE_MAX_LIVE_BYTES", "--remote-max-live-bytes",
     "Device memory one remote session may hold in live tensors; a create past it gets an error message."},
    {"remote.max_ids", KD_CT_INT, OFF(remote.max_ids), 1, 1LL << 24, NULL, "65536", "KILN_REMOTE_MAX_IDS",
     "--remote-max-ids", "Tensor ids one remote session may hold live at once."},
    {"remote.max_queued_ops", KD_CT_INT, OFF(remote.max_queued_ops), 1, 1LL << 20, NULL, "4096",
     "KILN_REMOTE_MAX_QUEUED_OPS", "--remote-max-queued-ops",
     "Messages one remote session may have waiting for its device worker; past it a message gets an error "
     "instead of being queued."},
    {"training.max_wait_ms", KD_CT_INT, OFF(training.max_wait_ms), 0, 60000, NULL, "100",
     "KILN_TRAINING_MAX_WAIT_MS", "--training-max-wait-ms",
     "Inference preempts training between training steps: a step waits while the device has inference queued or "
     "running, but never longer than this, so training still makes a step at least this often (plus the step's "
     "own time) under constant load. 0 lets training run without waiting."},
    {"training.max_jobs_per_device", KD_CT_INT, OFF(training.max_jobs_per_device), 1, 64, NULL, "1",
     "KILN_TRAINING_MAX_JOBS_PER_DEVICE", "--training-max-jobs-per-device",
     "Training jobs that may hold one device at once; another waits for a slot. kilnd runs its jobs one at a time "
     "on one training thread, so today a value above 1 changes nothing."},
    {"training.nice", KD_CT_INT, OFF(training.nice), 0, 19, NULL, "10", "KILN_TRAINING_NICE", "--training-nice",
     "CPU priority (nice value) a training job's thread and the data-loader threads it starts run at, so that a "
     "step in flight gives the cores to inference's threads first; 0 leaves them at kilnd's own."},
    {"drain_timeout_ms", KD_CT_INT, OFF(drain_timeout_ms), 0, 3600000, NULL, "10000", "KILN_DRAIN_TIMEOUT_MS",
     "--drain-timeout-ms",
     "On SIGTERM/SIGINT, how long in-flight requests may take before the remaining connections are cut. Idle "
     "connections close at once; a request still arriving (no handler has seen it) may finish arriving within "
     "1 s (or limits.request_timeout_ms if shorter), else it is answered 503 with Connection: close, so a "
     "stalled client does not hold the stop."},
    {"log_level", KD_CT_ENUM, OFF(log_level), 0, 0, log_levels, "info", "KILN_LOG_LEVEL", "--log-level",
     "Least severe level written to the log. The lines naming the ports kilnd listens on are written at level "
     "notice whatever this says."},
    {"log_format", KD_CT_ENUM, OFF(log_format), 0, 0, log_formats, "text", "KILN_LOG_FORMAT", "--log-format",
     "text: one human-readable line per event; json: one JSON object per line."},
    {"log_access", KD_CT_ENUM, OFF(log_access), 0, 0, off_on, "off", "KILN_LOG_ACCESS", "--log-access",
     "on: an access log line per HTTP response (method, target, status, duration, request body bytes, request id, "
     "client address) at level info, in log_format; a request without a usable X-Request-Id gets a generated one, "
     "which the inference endpoints echo; and one per gRPC call as it ends (method, status code, duration, client "
     "address). Written at level info: a log_level of warn or error keeps them out."},
    {"log_file", KD_CT_STRING, OFF(log_file), 0, 4096, NULL, "", "KILN_LOG_FILE", "--log-file",
     "Append the log to this file (reopened on SIGHUP, for log rotation); empty means stderr. A file that "
     "cannot be opened (its folder missing, no write permission) stops the start."},
    {"api_tokens", KD_CT_STRLIST, OFF(api_tokens), 0, 1024, NULL, "", "KILN_API_TOKENS", NULL,
     "Bearer tokens the API accepts, each \"admin:TOKEN\" (load/unload plus everything read allows) or "
     "\"read:TOKEN\" (inference, model metadata, statistics, repository index); a bare \"TOKEN\" has the read "
     "scope. "
     "Scopes are lower case; an entry with any other text before a ':' (\"Admin:TOKEN\", \"write:TOKEN\") is "
     "refused, so a token that itself holds a ':' is written with its scope (\"read:TOKEN\"). A token listed "
     "twice, under one scope or two, or with blanks around it, is refused. "
     "When any are set, the model endpoints require \"Authorization: Bearer TOKEN\"; health probes, /v2 and "
     "/metrics stay open. "
     "Kept off the command line so tokens do not show in the process list."},
    {"jobs.data_roots", KD_CT_STRLIST, OFF(data_roots), 0, 64, NULL, "/usr/share/datasets", "KILN_DATA_ROOTS",
     "--data-roots",
     "Folders a training job's data paths may lie under (data_dir is always allowed); a path that resolves "
     "elsewhere, through symlinks included, is refused with 400."},
    {"jobs.retention_count", KD_CT_INT, OFF(job_retention_count), 0, 1000000, NULL, "0",
     "KILN_JOBS_RETENTION_COUNT", "--jobs-retention-count",
     "Ended training jobs (succeeded, failed, cancelled) to keep, those that ended last; older ones are purged "
     "as DELETE /v1/jobs/{id}?purge=true does (record, events, metrics, checkpoints; a model version a job "
     "registered stays in the repository), at start and whenever a job ends, one log line each. A job that a "
     "queued or running job resumes from is kept until that one ends. 0 keeps every job."},
    {"jobs.retention_days", KD_CT_INT, OFF(job_retention_days), 0, 36500, NULL, "0", "KILN_JOBS_RETENTION_DAYS",
     "--jobs-retention-days",
     "Days an ended training job is kept after it ended; then it is purged as with jobs.retention_count (at "
     "start, whenever a job ends, and hourly while kilnd is idle). Both may be set: a job goes when either "
     "says so. 0 keeps jobs forever."},
};

const size_t kd_config_key_count = sizeof kd_config_keys / sizeof kd_config_keys[0];

/* The secret of an api_tokens entry as api/auth.c reads it ("admin:S", "read:S" or a bare S), or
 * NULL when text before a ':' is not a scope: "Admin:S" or "write:S" would otherwise be taken
 * as a read token whose secret is the whole entry, which no client sends. */
static const char *token_secret(const char *entry)
{
    const char *colon = strchr(entry, ':');
    if (!colon)
        return entry;
    size_t n = (size_t)(colon - entry);
    if ((n == 5 && strncmp(entry, "admin", 5) == 0) || (n == 4 && strncmp(entry, "read", 4) == 0))
        return colon + 1;
    return NULL;
}

/* Messages name an entry by its position and never show a secret: a prefix is quoted only when
 * it is short and printable, as a mistyped scope is; longer text may be part of a secret. */
static int check_api_tokens(const struct kd_strlist *list, char *why, size_t whylen)
{
    for (size_t i = 0; i < list->count; i++) {
        const char *entry = list->items[i], *secret = token_secret(entry);
        if (!secret) {
            size_t n = (size_t)(strchr(entry, ':') - entry);
            bool quotable = n <= 16;
            for (size_t c = 0; c < n && quotable; c++)
                quotable = entry[c] >= 0x20 && entry[c] < 0x7f;
            int len = quotable
                          ? snprintf(why, whylen, "entry %zu starts with '%.*s:', which is not a scope", i + 1,
                                     (int)n, entry)
                          : snprintf(why, whylen,
                                     "entry %zu has %zu characters before its first ':', which are not a scope",
                                     i + 1, n);
            if (len > 0 && (size_t)len < whylen)
                snprintf(why + len, whylen - (size_t)len,
                         " (admin or read, lower case); a token that itself holds a ':' is written read:TOKEN");
            return -1;
        }
        if (!secret[0]) {
            snprintf(why, whylen, "entry %zu has an empty token", i + 1);
            return -1;
        }
        size_t n = strlen(secret);
        if (secret[0] == ' ' || secret[0] == '\t' || secret[n - 1] == ' ' || secret[n - 1] == '\t') {
            /* HTTP drops the blanks around a header value, so no request could carry them */
            snprintf(why, whylen, "entry %zu has blanks around its token; no Authorization header can match it",
                     i + 1);
            return -1;
        }
        for (size_t j = 0; j < i; j++)
            if (strcmp(token_secret(list->items[j]), secret) == 0) {
                snprintf(
                    why, whylen,
                    "entries %zu and %zu are the same token; list each token once, with the scope it should have",
                    j + 1, i + 1);
                return -1;
            }
    }
    return 0;
}

/*
 * A token must fit in a request's header block, with room for the request line and the
 * "Authorization: Bearer " around it (what http-conn.c counts toward limits.max_header_bytes):
 * every request carrying a longer one would get 431. The rule relates two keys, so it is checked
 * on the merged configuration, not as each layer is stored: a later layer may raise the limit
 * that a token from an earlier one needs.
 */
#define TOKEN_REQUEST_ROOM 64

/* Where the value of key k came from, as a message says it: "the default", "config file F", ... */
static void describe_origin(const struct kd_config *cfg, const struct kd_config_key *k, enum kd_config_layer layer,
                            char *buf, size_t len)
{
    switch (layer) {
    case KD_LAYER_DEFAULT: snprintf(buf, len, "the default"); return;
    case KD_LAYER_FILE:
        snprintf(buf, len, "from config file %s", cfg->config_file ? cfg->config_file : "?");
        return;
    case KD_LAYER_ENV: snprintf(buf, len, "from environment variable %s", k->env); return;
    case KD_LAYER_FLAG: snprintf(buf, len, "from command-line flag %s", k->flag ? k->flag : "?"); return;
    }
    snprintf(buf, len, "from an unknown place");
}

static int tokens_fit(const struct kd_config *cfg, const enum kd_config_layer *layers, char *err, size_t errlen)
{
    const struct kd_config_key *tokens_key = kd_config_find("api_tokens"),
                               *header_key = kd_config_find("limits.max_header_bytes");
    int64_t max_header_bytes = cfg->limits.max_header_bytes;
    for (size_t i = 0; i < cfg->api_tokens.count; i++) {
        const char *secret = token_secret(cfg->api_tokens.items[i]);
        size_t n = secret ? strlen(secret) : 0;
        if ((int64_t)n + TOKEN_REQUEST_ROOM <= max_header_bytes)
            continue;
        char tokens_from[4200], header_from[4200];
        describe_origin(cfg, tokens_key, layers[tokens_key - kd_config_keys], tokens_from, sizeof tokens_from);
        describe_origin(cfg, header_key, layers[header_key - kd_config_keys], header_from, sizeof header_from);
        snprintf(err, errlen,
                 "api_tokens: entry %zu (%s) is a %zu-byte token, which no request can carry within "
                 "limits.max_header_bytes (%" PRId64 ", %s; a token may have up to %" PRId64
                 " bytes): raise limits.max_header_bytes or use a shorter token",
                 i + 1, tokens_from, n, max_header_bytes, header_from, max_header_bytes - TOKEN_REQUEST_ROOM);
        return -1;
    }
    return 0;
}

int kd_config_check_merged(const struct kd_config *cfg, const enum kd_config_layer *layers, char *err,
                           size_t errlen)
{
    return tokens_fit(cfg, layers, err, errlen);
}

/* Rules over a whole list, beyond the per-item ones: 0, or -1 with the reason in why (the setter
 * adds the key and where the value came from). */
static const struct {
    size_t offset;
    int (*check)(const struct kd_strlist *list, char *why, size_t whylen);
} list_rules[] = {
    {OFF(api_tokens), check_api_tokens},
};

const struct kd_config_key *kd_config_find(const char *name)
{
    for (size_t i = 0; i < kd_config_key_count; i++)
        if (strcmp(kd_config_keys[i].name, name) == 0)
            return &kd_config_keys[i];
    return NULL;
}

const char *kd_config_type_name(enum kd_config_type t)
{
    switch (t) {
    case KD_CT_STRING: return "string";
    case KD_CT_INT: return "integer";
    case KD_CT_ENUM: return "enum";
    case KD_CT_STRLIST: return "list of strings";
    }
    return "?";
}

void kd_config_describe_bounds(const struct kd_config_key *k, char *buf, size_t len)
{
    switch (k->type) {
    case KD_CT_INT: snprintf(buf, len, "%" PRId64 "..%" PRId64, k->min, k->max); return;
    case KD_CT_STRING: snprintf(buf, len, "length %" PRId64 "..%" PRId64, k->min, k->max); return;
    case KD_CT_STRLIST: snprintf(buf, len, "%" PRId64 "..%" PRId64 " items", k->min, k->max); return;
    case KD_CT_ENUM: {
        size_t used = (size_t)snprintf(buf, len, "one of");
        for (size_t i = 0; k->choices[i] && used < len; i++)
            used += (size_t)snprintf(buf + used, len - used, "%s %s", i ? "," : "", k->choices[i]);
        return;
    }
    }
}

static void *field(struct kd_config *cfg, const struct kd_config_key *k)
{
    return (char *)cfg + k->offset;
}

void kd_config_free_value(struct kd_config *cfg, const struct kd_config_key *k)
{
    if (k->type == KD_CT_STRING) {
        char **s = field(cfg, k);
        free(*s);
        *s = NULL;
    } else if (k->type == KD_CT_STRLIST) {
        struct kd_strlist *l = field(cfg, k);
        for (size_t i = 0; i < l->count; i++)
            free(l->items[i]);
        free(l->items);
        l->items = NULL;
        l->count = 0;
    }
}

#define FAIL(...)                                                                                                 \
    do {                                                                                                          \
        int n_ = snprintf(err, errlen, "%s: ", k->name);                                                          \
        if (n_ > 0 && (size_t)n_ < errlen)                                                                        \
            n_ += snprintf(err + n_, errlen - (size_t)n_, __VA_ARGS__);                                           \
        if (n_ > 0 && (size_t)n_ < errlen)                                                                        \
            snprintf(err + n_, errlen - (size_t)n_, " (from %s)", origin);                                        \
        return -1;                                                                                                \
    } while (0)

static int store_string(struct kd_config *cfg, const struct kd_config_key *k, const char *s, const char *origin,
                        char *err, size_t errlen)
{
    size_t n = strlen(s);
    if ((int64_t)n < k->min || (int64_t)n > k->max)
        FAIL("length %zu is outside %" PRId64 "..%" PRId64, n, k->min, k->max);
    char *copy = strdup(s);
    if (!copy)
        FAIL("out of memory");
    kd_config_free_value(cfg, k);
    *(char **)field(cfg, k) = copy;
    return 0;
}

static int store_int(struct kd_config *cfg, const struct kd_config_key *k, int64_t v, const char *origin,
                     char *err, size_t errlen)
{
    if (v < k->min || v > k->max)
        FAIL("%" PRId64 " is out of range %" PRId64 "..%" PRId64, v, k->min, k->max);
    *(int64_t *)field(cfg, k) = v;
    return 0;
}

static int store_enum(struct kd_config *cfg, const struct kd_config_key *k, const char *s, const char *origin,
                      char *err, size_t errlen)
{
    for (int64_t i = 0; k->choices[i]; i++) {
        if (strcmp(k->choices[i], s) == 0) {
            *(int64_t *)field(cfg, k) = i;
            return 0;
        }
    }
    char bounds[128];
    kd_config_describe_bounds(k, bounds, sizeof bounds);
    FAIL("'%s' is not %s", s, bounds);
}

/* Takes ownership of items (count entries) whatever happens. */
static int store_list(struct kd_config *cfg, const struct kd_config_key *k, char **items, size_t count,
                      const char *origin, char *err, size_t errlen)
{
    const char *why = NULL;
    if ((int64_t)count < k->min || (int64_t)count > k->max)
        why = "item count";
    for (size_t i = 0; !why && i < count; i++)
        if (!items[i] || items[i][0] == '\0')
            why = "empty item";
    char rule[256] = "";
    for (size_t r = 0; !why && r < sizeof list_rules / sizeof list_rules[0]; r++)
        if (list_rules[r].offset == k->offset &&
            list_rules[r].check(&(struct kd_strlist){items, count}, rule, sizeof rule) != 0)
            why = rule;
    if (why) {
        for (size_t i = 0; i < count; i++)
            free(items[i]);
        free(items);
        if (why == rule)
            FAIL("%s", rule);
        if (strcmp(why, "item count") == 0)
            FAIL("%zu items is outside %" PRId64 "..%" PRId64, count, k->min, k->max);
        FAIL("items must be non-empty strings");
    }
    kd_config_free_value(cfg, k);
    struct kd_strlist *l = field(cfg, k);
    l->items = items;
    l->count = count;
    return 0;
}

int kd_config_set_text(struct kd_config *cfg, const struct kd_config_key *k, const char *text, const char *origin,
                       char *err, size_t errlen)
{
    switch (k->type) {
    case KD_CT_STRING: return store_string(cfg, k, text, origin, err, errlen);
    case KD_CT_ENUM: return store_enum(cfg, k, text, origin, err, errlen);
    case KD_CT_INT: {
        char *end = NULL;
        errno = 0;
        long long v = strtoll(text, &end, 10);
        /* digits only, with a '-' before them: strtoll alone takes " 80" and "+80" */
        bool digits = isdigit((unsigned char)text[0]) || (text[0] == '-' && isdigit((unsigned char)text[1]));
        if (!digits || *end != '\0')
            FAIL("'%s' is not an integer", text);
        if (errno == ERANGE)
            FAIL("%s is out of range", text);
        return store_int(cfg, k, v, origin, err, errlen);
    }
    case KD_CT_STRLIST: {
        /* An empty text is the empty list, so "KILN_API_TOKENS=" clears the tokens. */
        size_t count = 0, cap = 0;
        char **items = NULL;
        const char *p = text;
        while (*p) {
            const char *comma = strchr(p, ',');
            size_t n = comma ? (size_t)(comma - p) : strlen(p);
            if (count == cap) {
                cap = cap ? cap * 2 : 4;
                char **grown = realloc(items, cap * sizeof *items);
                if (!grown) {
                    store_list(cfg, k, items, count, origin, err, errlen);
                    FAIL("out of memory");
                }
                items = grown;
            }
            items[count++] = strndup(p, n);
            if (!comma)
                break;
            p = comma + 1;
            if (*p == '\0') { /* a trailing comma is an empty item */
                if (count == cap) {
                    char **grown = realloc(items, (cap + 1) * sizeof *items);
                    if (!grown) {
                        store_list(cfg, k, items, count, origin, err, errlen);
                        FAIL("out of memory");
                    }
                    items = grown;
                }
                items[count++] = strdup("");
            }
        }
        return store_list(cfg, k, items, count, origin, err, errlen);
    }
    }
    FAIL("unknown type");
}

int kd_config_set_json(struct kd_config *cfg, const struct kd_config_key *k, const cJSON *v, const char *origin,
                       char *err, size_t errlen)
{
    switch (k->type) {
    case KD_CT_STRING:
        if (!cJSON_IsString(v))
            FAIL("expected a string");
        return store_string(cfg, k, v->valuestring, origin, err, errlen);
    case KD_CT_ENUM:
        if (!cJSON_IsString(v))
            FAIL("expected a string");
        return store_enum(cfg, k, v->valuestring, origin, err, errlen);
    case KD_CT_INT: {
        if (!cJSON_IsNumber(v))
            FAIL("expected an integer");
        double d = v->valuedouble;
        /* Doubles hold integers exactly up to 2^53, far past every bound in the table. */
        if (d != d || d != floor(d))
            FAIL("expected an integer, got %g", d);
        if (d < -9007199254740992.0 || d > 9007199254740992.0) /* a whole number, past every bound */
            FAIL("%g is out of range", d);
        return store_int(cfg, k, (int64_t)d, origin, err, errlen);
    }
    case KD_CT_STRLIST: {
        if (!cJSON_IsArray(v))
            FAIL("expected an array of strings");
        size_t count = (size_t)cJSON_GetArraySize(v);
        char **items = calloc(count ? count : 1, sizeof *items);
        if (!items)
            FAIL("out of memory");
        size_t i = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, v)
        {
            if (!cJSON_IsString(it)) {
                store_list(cfg, k, items, i, origin, err, errlen);
                FAIL("expected an array of strings");
            }
            items[i++] = strdup(it->valuestring);
        }
        return store_list(cfg, k, items, i, origin, err, errlen);
    }
    }
    FAIL("unknown type");
}
