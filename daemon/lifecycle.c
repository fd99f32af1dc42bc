/*
 * daemon/lifecycle.c — bringing kilnd up, keeping it running and taking it down.
 *
 * Start: log, the model folders checked, data folder and its lock (one kilnd per data folder),
 * listening socket bound, job store, devices and models, remote tensors, gRPC socket bound; only
 * then, with nothing left that can fail the start, <data_dir>/kilnd.port (for whoever started us
 * with --port 0) and the line naming the bound port, at level notice so that every log_level shows
 * it. A start that fails never writes either. Ready once every model found at start has finished
 * loading (loaded or failed) on the workers.
 * SIGTERM/SIGINT: draining — the listener closes (new connections are refused), idle connections
 * close, busy ones finish their request (readiness answers 503 only to a request already on an open
 * connection); after drain_timeout_ms whatever remains is cut. Training stops as the drain begins
 * (kd_jobs_drain): the running job at the end of its step, resumable. A second signal cuts at once.
 * SIGHUP reopens the log file. Shutdown closes every handle so the loop ends with nothing leaked.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon.h"
#include "kiln/kiln.h"
#include "process-metrics.h"

/* GET /v2 and gRPC ServerMetadata; the names are Triton's (its docs/protocol/extension_*.md), which
 * tritonclient and other Triton clients look for. */
static const char *const api_extensions[] = {"model_repository", "statistics",           "binary_tensor_data",
                                             "classification",   "system_shared_memory", NULL};

const char *kd_daemon_state_to_str(enum kd_daemon_state s)
{
    switch (s) {
    case KD_DAEMON_STARTING: return "starting";
    case KD_DAEMON_READY: return "ready";
    case KD_DAEMON_DRAINING: return "draining";
    case KD_DAEMON_STOPPED: return "stopped";
    }
    return "?";
}

static void set_state(struct kd_daemon *d, enum kd_daemon_state s)
{
    d->state = s;
    if (d->api_ready && kd_api_set_ready(&d->api, s == KD_DAEMON_READY, kd_daemon_state_to_str(s)) != 0)
        kd_log_write(&d->log, KD_LOG_ERROR, "out of memory updating readiness");
    kd_log_write(&d->log, KD_LOG_INFO, "state %s", kd_daemon_state_to_str(s));
    /* A service manager learns the same transitions: READY=1 once /v2/health/ready says 200. */
    char status[320];
    int rc = 0;
    if (s == KD_DAEMON_READY) {
        snprintf(status, sizeof status, "ready on %s:%d", d->cfg.host, d->server ? kd_server_port(d->server) : 0);
        rc = kd_notify_status(&d->notify, "READY=1", status);
    } else if (s == KD_DAEMON_DRAINING) {
        rc = kd_notify_status(&d->notify, "STOPPING=1", "draining");
    }
    if (rc != 0)
        kd_log_write(&d->log, KD_LOG_WARN, "NOTIFY_SOCKET: cannot notify the service manager: %s", strerror(-rc));
}

/* Written under a temporary name and renamed, so a reader never sees a half-written port. */
static int write_port_file(struct kd_daemon *d, const char *name, int port, char **path)
{
    size_t n = strlen(d->cfg.data_dir) + 48;
    char *tmp = malloc(n);
    char **port_file = path;
    *port_file = malloc(n);
    if (!tmp || !*port_file) {
        free(tmp);
        return -1;
    }
    snprintf(*port_file, n, "%s/%s", d->cfg.data_dir, name);
    snprintf(tmp, n, "%s/%s.tmp", d->cfg.data_dir, name);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666); /* the umask decides, as everywhere */
    int rc = -1;
    if (fd >= 0) {
        char text[16];
        int len = snprintf(text, sizeof text, "%d\n", port);
        rc = write(fd, text, (size_t)len) == len ? 0 : -1;
        if (close(fd) != 0)
            rc = -1;
        if (rc == 0)
            rc = rename(tmp, *port_file);
    }
    if (rc != 0) {
        int saved = errno;
        /* A full disk must not stop a start that needs no room to serve: said, and the file of
         * an earlier kilnd removed, so that no reader finds a port nobody listens on. */
        bool no_room = saved == ENOSPC || saved == EDQUOT || saved == EFBIG;
        kd_log_write(&d->log, no_room ? KD_LOG_WARN : KD_LOG_ERROR, "cannot write %s: %s%s", *port_file,
                     strerror(saved), no_room ? "; kilnd starts without it (the port is in the next line)" : "");
        unlink(tmp);
        if (no_room) {
            unlink(*port_file);
            rc = 0;
        }
        free(*port_file);
        *port_file = NULL;
    }
    free(tmp);
    return rc;
}

static double uptime_seconds(void *ctx)
{
    struct kd_daemon *d = ctx;
    return (double)(uv_hrtime() - d->started_ns) / 1e9;
}

static void close_handle(uv_handle_t *h)
{
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

/* Everything the daemon itself holds open on the loop; the server closes its own. */
static void close_daemon_handles(struct kd_daemon *d)
{
    if (!d->handles_ready)
        return;
    close_handle((uv_handle_t *)&d->sig_term);
    close_handle((uv_handle_t *)&d->sig_int);
    close_handle((uv_handle_t *)&d->sig_hup);
    close_handle((uv_handle_t *)&d->drain_timer);
    close_handle((uv_handle_t *)&d->store_retry);
    kd_notify_close(&d->notify, NULL);
}

static void on_drained(void *ud)
{
    struct kd_daemon *d = ud;
    if (--d->drains_pending > 0)
        return; /* the other listener (HTTP or gRPC) still has connections */
    kd_log_write(&d->log, KD_LOG_INFO, "all connections closed");
    /* The signal handles are unreferenced by now; with the timer gone the loop ends. */
    close_handle((uv_handle_t *)&d->drain_timer);
}

static void on_drain_deadline(uv_timer_t *t)
{
    struct kd_daemon *d = t->data;
    kd_log_write(&d->log, KD_LOG_WARN, "drain_timeout_ms passed with %zu connection(s) open; closing them",
                 kd_server_connections(d->server) + (d->grpc ? kd_grpc_connections(d->grpc) : 0));
    kd_server_close_all(d->server);
    if (d->grpc)
        kd_grpc_close_all(d->grpc);
}

static void begin_drain(struct kd_daemon *d, const char *why)
{
    if (d->state == KD_DAEMON_DRAINING) {
        kd_log_write(&d->log, KD_LOG_WARN, "%s again while draining; closing connections now", why);
        kd_server_close_all(d->server);
        if (d->grpc)
            kd_grpc_close_all(d->grpc);
        return;
    }
    kd_log_write(&d->log, KD_LOG_INFO, "%s received; draining (up to %lld ms)", why,
                 (long long)d->cfg.drain_timeout_ms);
    set_state(d, KD_DAEMON_DRAINING);
    if (d->serving)
        kd_serving_set_accepting(d->serving, false);
    kd_tensor_service_set_accepting(d->tensor, false);
    kd_jobs_drain(d->training);
    /* Still catching signals (a second one cuts the drain short), but no longer keeping the
     * loop alive: the loop ends when the last connection has gone. */
    uv_unref((uv_handle_t *)&d->sig_term);
    uv_unref((uv_handle_t *)&d->sig_int);
    uv_unref((uv_handle_t *)&d->sig_hup);
    uv_timer_start(&d->drain_timer, on_drain_deadline, (uint64_t)d->cfg.drain_timeout_ms, 0);
    d->drains_pending = d->grpc ? 2 : 1;
    if (d->grpc)
        kd_grpc_drain(d->grpc, on_drained, d);
    kd_server_drain(d->server, on_drained, d);
}

static void on_signal(uv_signal_t *h, int signum)
{
    struct kd_daemon *d = h->data;
    if (signum == SIGHUP) {
        if (kd_log_reopen(&d->log) != 0) {
            int e = errno;
            /* the old file goes on taking lines, but it may be gone (its folder removed): stderr
             * hears of it too, where a supervisor sees it */
            fprintf(stderr, "kilnd: SIGHUP: cannot reopen %s: %s; logging goes on into the file opened before\n",
                    d->log.path, strerror(e));
            kd_log_write(&d->log, KD_LOG_ERROR, "SIGHUP: cannot reopen %s: %s", d->log.path, strerror(e));
        } else
            kd_log_write(&d->log, KD_LOG_INFO, "SIGHUP: log reopened");
        return;
    }
    begin_drain(d, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

static int start_handles(struct kd_daemon *d)
{
    uv_signal_init(&d->loop, &d->sig_term);
    uv_signal_init(&d->loop, &d->sig_int);
    uv_signal_init(&d->loop, &d->sig_hup);
    uv_timer_init(&d->loop, &d->drain_timer);
    uv_timer_init(&d->loop, &d->store_retry);
    /* never what keeps the loop running: a drain ends with the last connection */
    uv_unref((uv_handle_t *)&d->store_retry);
    d->sig_term.data = d->sig_int.data = d->sig_hup.data = d->drain_timer.data = d->store_retry.data = d;
    d->handles_ready = true;
    int rc = uv_signal_start(&d->sig_term, on_signal, SIGTERM);
    if (rc == 0)
        rc = uv_signal_start(&d->sig_int, on_signal, SIGINT);
    if (rc == 0)
        rc = uv_signal_start(&d->sig_hup, on_signal, SIGHUP);
    return rc;
}

/*
 * --example-models: copies every <name>/<version>/ folder of dir into <data_dir>/models (root) when
 * it holds no model, so a first start has something to serve. Only an empty repository is seeded —
 * a user's own models are never mixed with examples — and never a configured model_repository,
 * which kilnd serves as it finds it. Each version goes through kd_repository_add_version, which
 * validates it and renames it into place atomically. A failure is logged and the start goes on:
 * examples are a convenience, not something to refuse to run over.
 */
static void seed_examples(struct kd_daemon *d, const char *root, const char *dir)
{
    kd_repository *repo = kd_repository_open(root);
    if (!repo) {
        kd_log_write(&d->log, KD_LOG_WARN, "example models: %s: %s", root, kiln_error());
        return;
    }
    DIR *top = kd_repository_count(repo) == 0 ? opendir(dir) : NULL;
    if (!top && kd_repository_count(repo) == 0)
        kd_log_write(&d->log, KD_LOG_WARN, "example models: cannot open %s: %s", dir, strerror(errno));
    struct dirent *me;
    while (top && (me = readdir(top))) {
        if (!kd_repository_name_valid(me->d_name))
            continue;
        size_t n = strlen(dir) + strlen(me->d_name) + 2;
        char *mdir = malloc(n);
        DIR *vd = NULL;
        if (mdir) {
            snprintf(mdir, n, "%s/%s", dir, me->d_name);
            vd = opendir(mdir);
        }
        struct dirent *ve;
        while (vd && (ve = readdir(vd))) {
            char *end;
            long long v = strtoll(ve->d_name, &end, 10);
            if (ve->d_name[0] < '1' || ve->d_name[0] > '9' || *end || v <= 0)
                continue;
            size_t vn = strlen(mdir) + strlen(ve->d_name) + 2;
            char *vdir = malloc(vn);
            if (!vdir)
                break;
            snprintf(vdir, vn, "%s/%s", mdir, ve->d_name);
            if (kd_repository_add_version(repo, me->d_name, vdir, v, NULL) == 0)
                kd_log_write(&d->log, KD_LOG_INFO, "example model %s version %lld copied into %s", me->d_name, v,
                             root);
            else
                kd_log_write(&d->log, KD_LOG_WARN, "example model %s version %lld: %s", me->d_name, v,
                             kiln_error());
            free(vdir);
        }
        if (vd)
            closedir(vd);
        free(mdir);
    }
    if (top)
        closedir(top);
    kd_repository_close(repo);
}

/* The last load kd_serving_new started has finished (on the loop). Ready, unless the start failed
 * meanwhile or a drain began: a model still loading never turns a drain back into ready. */
static void on_models_loaded(void *ud)
{
    struct kd_daemon *d = ud;
    if (!d->init_done || d->state != KD_DAEMON_STARTING)
        return;
    kd_log_write(&d->log, KD_LOG_INFO, "the models found at start have finished loading");
    set_state(d, KD_DAEMON_READY);
}

/* The scheduler's workers and the model table; models load in the background. */
static int start_serving(struct kd_daemon *d)
{
    char err[512];
    if (kd_daemon_apply_device_options(&d->cfg, err, sizeof err) != 0) {
        kd_log_write(&d->log, KD_LOG_ERROR, "%s", err);
        return -1;
    }
    struct kd_sched_options so = {
        .loop = &d->loop,
        .devices = (const char *const *)d->cfg.devices.items,
        .ndevices = d->cfg.devices.count,
        .workers_per_device = (int)d->cfg.worker_threads,
        .max_queue = (size_t)d->cfg.limits.max_queue_depth,
        .training_max_wait_ms = d->cfg.training.max_wait_ms,
        .training_max_jobs = (int)d->cfg.training.max_jobs_per_device,
        .training_nice = (int)d->cfg.training.nice,
        .log = kd_log_sink,
        .log_ud = &d->log,
        .pool_idle_trim_ms = d->cfg.limits.pool_idle_trim_ms,
    };
    if (kd_sched_new(&d->sched, &so, err, sizeof err) != 0) {
        kd_log_write(&d->log, KD_LOG_ERROR, "scheduler: %s", err);
        return -1;
    }
    char *root = kd_daemon_models_root(&d->cfg);
    if (!root)
        return -1;
    bool configured = d->cfg.model_repository && d->cfg.model_repository[0];
    /* only the default repository is made; a configured one was checked to exist. 0777 under the
     * umask, as every folder kilnd creates (see make_folder in folders.c). */
    if (!configured && mkdir(root, 0777) != 0 && errno != EEXIST) {
        kd_log_write(&d->log, KD_LOG_ERROR, "data_dir: cannot create %s: %s", root, strerror(errno));
        free(root);
        return -1;
    }
    char dangling[600];
    if (kd_daemon_dangling_link(root, dangling, sizeof dangling)) {
        kd_log_write(&d->log, KD_LOG_ERROR,
                     "model repository %s is %s: create that folder, or remove the link and "
                     "kilnd makes the folder",
                     root, dangling);
        free(root);
        return -1;
    }
    if (access(root, W_OK) != 0)
        kd_log_write(&d->log, KD_LOG_INFO,
                     "model repository %s is read-only here: serving only, jobs "
                     "cannot register models into it",
                     root);
    if (d->cfg.example_models && d->cfg.example_models[0] && configured)
        kd_log_write(&d->log, KD_LOG_INFO,
                     "example models in %s not copied: model_repository is set, and kilnd serves it as it finds "
                     "it (examples go into <data_dir>/models only)",
                     d->cfg.example_models);
    else if (d->cfg.example_models && d->cfg.example_models[0])
        seed_examples(d, root, d->cfg.example_models);
    struct kd_serving_options vo = {
        .loop = &d->loop,
        .models_root = root,
        .sched = d->sched,
        .metrics = d->metrics,
        .tokens = &d->cfg.api_tokens,
        .max_tensor_elements = d->cfg.limits.max_tensor_elements,
        .max_string_bytes = d->cfg.limits.max_string_bytes,
        .infer_timeout_ms = d->cfg.limits.infer_timeout_ms,
        .log = kd_log_sink,
        .log_ud = &d->log,
        .startup_done = on_models_loaded,
        .startup_ud = d,
    };
    d->serving = kd_serving_new(&vo, err, sizeof err);
    free(root);
    if (!d->serving) {
        kd_log_write(&d->log, KD_LOG_ERROR, "%s", err);
        return -1;
    }
    d->api.serving = d->serving;
    d->api.sched = d->sched;
    if (d->cfg.api_tokens.count)
        kd_log_write(&d->log, KD_LOG_INFO, "%zu api token(s) loaded; the model endpoints require one",
                     d->cfg.api_tokens.count);
    return 0;
}

/* The gRPC service (grpc_port >= 0) on the same loop, serving the same model table: bound here,
 * announced with the HTTP port by announce_listening. */
static int start_grpc(struct kd_daemon *d)
{
    if (d->cfg.grpc_port < 0)
        return 0;
    char err[512];
    struct kd_grpc_options go = {
        .host = d->cfg.host,
        .port = (int)d->cfg.grpc_port,
        .serving = d->serving,
        .max_message_bytes = (uint64_t)d->cfg.limits.max_body_bytes,
        .max_concurrent_streams = 100,
        .max_header_bytes = (size_t)d->cfg.limits.max_header_bytes,
        .idle_timeout_ms = (uint64_t)d->cfg.limits.idle_timeout_ms,
        .conn_limit = &d->conn_limit,
        .extensions = api_extensions,
        .log = kd_log_sink,
        .log_ud = &d->log,
        .log_access = d->cfg.log_access,
    };
    if (kd_grpc_new(&d->grpc, &d->loop, &go) != 0) {
        kd_log_write(&d->log, KD_LOG_ERROR, "out of memory");
        return -1;
    }
    if (kd_grpc_listen(d->grpc, err, sizeof err) != 0) {
        kd_log_write(&d->log, KD_LOG_ERROR, "%s", err);
        return -1;
    }
    return 0;
}

/*
 * The start's last step, once nothing is left that can fail it: the port files, then the lines
 * naming the ports. Whoever waits for either (a supervisor, a script started with --port 0) never
 * sees a kilnd that goes on to refuse its devices or its models' folder.
 */
static int announce_listening(struct kd_daemon *d)
{
    int port = kd_server_port(d->server);
    if (write_port_file(d, "kilnd.port", port, &d->port_file) != 0)
        return -1;
    int grpc_port = d->grpc ? kd_grpc_port(d->grpc) : -1;
    if (d->grpc && write_port_file(d, "kilnd.grpc_port", grpc_port, &d->grpc_port_file) != 0)
        return -1;
    kd_log_notice(&d->log, "kilnd %s listening on %s:%d port=%d pid=%d data_dir=%s", KILN_VERSION, d->cfg.host,
                  port, port, (int)getpid(), d->cfg.data_dir);
    if (d->grpc)
        kd_log_notice(&d->log, "gRPC listening on %s:%d grpc_port=%d", d->cfg.host, grpc_port, grpc_port);
    if (d->notify.timer_ready)
        kd_log_write(&d->log, KD_LOG_INFO, "service manager watchdog: pinging every %llu ms",
                     (unsigned long long)(d->notify.watchdog_usec / 2000));
    return 0;
}

static void log_libkiln_warning(void *ud, const char *message)
{
    kd_log_write(ud, KD_LOG_WARN, "%s", message);
}

/* How often a job store a full disk kept shut at start is tried again. */
#define STORE_RETRY_MS 10000

/*
 * Opens the job store and starts training on it: 0, or the store's code (KD_JOBSTORE_FULL: the
 * disk is full) or -1, with why in err. The job API answers from the moment it succeeds.
 */
static int open_training(struct kd_daemon *d, char *err, size_t errlen)
{
    char *db = kd_daemon_job_store_path(&d->cfg);
    if (!db)
        return snprintf(err, errlen, "out of memory"), -1;
    char why[768];
    int rc = kd_jobstore_open(&d->jobs, db, why, sizeof why);
    free(db);
    if (rc != 0) {
        snprintf(err, errlen, "job store: %s", why);
        return rc;
    }
    kd_log_write(&d->log, KD_LOG_DEBUG, "job store at schema version %d", kd_jobstore_schema_version(d->jobs));
    char *models = kd_daemon_models_root(&d->cfg);
    if (!models)
        return snprintf(err, errlen, "out of memory"), -1;
    struct kd_jobs_options jo = {
        .loop = &d->loop,
        .store = d->jobs,
        .data_dir = d->cfg.data_dir,
        .models_dir = models,
        .data_roots = &d->cfg.data_roots,
        .tokens = &d->cfg.api_tokens,
        .serving = d->serving,
        .sched = d->sched,
        .retention_count = d->cfg.job_retention_count,
        .retention_days = d->cfg.job_retention_days,
        .metrics = d->metrics,
        .log = kd_log_sink,
        .log_ud = &d->log,
    };
    d->training = kd_jobs_new(&jo, err, errlen);
    free(models);
    if (!d->training)
        return -1;
    d->api.jobs = d->training;
    d->api.jobs_unavailable[0] = '\0';
    return 0;
}

/* The job store could not be opened for a full disk: tried again until it opens. */
static void on_store_retry(uv_timer_t *t)
{
    struct kd_daemon *d = t->data;
    if (d->state == KD_DAEMON_DRAINING) {
        uv_timer_stop(t);
        return;
    }
    char err[1024];
    int rc = open_training(d, err, sizeof err); /* d->jobs is NULL: a store that failed is never kept */
    if (rc == KD_JOBSTORE_FULL)
        return;
    uv_timer_stop(t);
    if (rc == 0)
        kd_log_write(&d->log, KD_LOG_INFO, "job store opened now that there is room: training jobs are accepted");
    else
        kd_log_write(&d->log, KD_LOG_ERROR, "%s; training jobs stay unavailable until kilnd restarts", err);
}

int kd_daemon_init(struct kd_daemon *d, struct kd_config *cfg)
{
    char err[512];
    memset(d, 0, sizeof *d);
    d->notify.fd = -1;
    d->data_dir_lock = -1;
    d->data_dir_folder = -1;
    d->cfg = *cfg;
    memset(cfg, 0, sizeof *cfg);
    d->started_ns = uv_hrtime();
    d->state = KD_DAEMON_STARTING;
    d->exit_code = 1;

    if (kd_log_open(&d->log, d->cfg.log_file, (enum kd_log_level)d->cfg.log_level,
                    (enum kd_log_format)d->cfg.log_format, err, sizeof err) != 0) {
        fprintf(stderr, "kilnd: %s\n", err);
        return -1;
    }
    d->log_ready = true;
    /* libkiln's own warnings (an autotune cache ignored, a fused kernel that did not compile)
     * go to this log in its format, not as bare lines on stderr beside it */
    kiln_set_warning_handler(log_libkiln_warning, &d->log);
    /* what the configuration's load went on past (an environment variable over the file's value,
     * a misspelt KILN_* name): valid, so not refused, but probably not what was meant */
    for (const char *line = d->cfg.notes; line && *line; line += strcspn(line, "\n") + 1)
        kd_log_write(&d->log, KD_LOG_WARN, "configuration: %.*s", (int)strcspn(line, "\n"), line);
    /* libkiln keeps device caches (the Vulkan pipeline cache) under KILN_DATA_DIR: point it
     * at the data_dir this daemon resolved, first, before any thread or device exists */
    if (setenv("KILN_DATA_DIR", d->cfg.data_dir, 1) != 0)
        kd_log_write(&d->log, KD_LOG_WARN, "cannot set KILN_DATA_DIR: %s", strerror(errno));

    if (uv_loop_init(&d->loop) != 0) {
        kd_log_write(&d->log, KD_LOG_ERROR, "cannot create the event loop");
        return -1;
    }
    d->loop_ready = true;
    if (kd_notify_open(&d->notify, &d->loop, getenv("NOTIFY_SOCKET"), getenv("WATCHDOG_USEC"),
                       getenv("WATCHDOG_PID"), err, sizeof err) != 0) {
        kd_log_write(&d->log, KD_LOG_ERROR, "%s", err);
        return -1;
    }
    if (d->notify.timer_ready)
        uv_unref((uv_handle_t *)&d->notify.timer); /* the pings never keep a draining loop alive */

    d->metrics = kd_metrics_new();
    if (!d->metrics ||
        kd_metrics_gauge_fn(d->metrics, "kiln_process_uptime_seconds", "Seconds since kilnd started.",
                            uptime_seconds, d) != 0 ||
        kd_process_metrics_register(d->metrics, &d->start_time_s) != 0) {
        kd_log_write(&d->log, KD_LOG_ERROR, "out of memory");
        return -1;
    }
    struct kd_metric_family *info = kd_metrics_family(
        d->metrics, "kiln_build_info", "Always 1; the labels say which kilnd this is.", KD_METRIC_GAUGE,
        (const char *const[]){"version", NULL}, NULL, 0);
    struct kd_metric_series *info_series = info
                                               ? kd_metrics_series(info, (const char *const[]){KILN_VERSION, NULL})
                                               : NULL;
    if (!info_series || kd_api_init(&d->api, d->metrics, api_extensions) != 0) {
        kd_log_write(&d->log, KD_LOG_ERROR, "out of memory");
        return -1;
    }
    kd_metric_set(info_series, 1);
    d->api_ready = true;

    /* in kd_daemon_check's order, so both report the same first problem */
    if (kd_daemon_check_listen(&d->cfg, err, sizeof err) != 0 ||
        kd_daemon_check_model_folders(&d->cfg, err, sizeof err) != 0 ||
        kd_daemon_make_data_dir(d->cfg.data_dir, false, err, sizeof err) != 0) {
        kd_log_write(&d->log, KD_LOG_ERROR, "%s", err);
        return -1;
    }
    /* Before anything in the folder is touched (port file, job store): a second kilnd on one
     * data folder would requeue the first one's running jobs and train them alongside it. */
    int locked = kd_daemon_lock_data_dir(d->cfg.data_dir, &d->data_dir_lock, &d->data_dir_folder, err, sizeof err);
    if (locked < 0) {
        kd_log_write(&d->log, KD_LOG_ERROR, "%s", err);
        return -1;
    }
    if (locked > 0)
        kd_log_write(&d->log, KD_LOG_WARN, "%s", err);
    /* kernel choices timed once are kept beside the models (autotune.tsv) */
    if (!getenv("KILN_AUTOTUNE_DIR"))
        kiln_autotune_dir_set(d->cfg.data_dir);

    /* One bound for both listeners, within what the open-file limit leaves (conn-limit.h). */
    char note[384];
    enum kd_log_level note_level;
    size_t max_connections = kd_conn_limit_fit_descriptors((size_t)d->cfg.limits.max_connections, note,
                                                           sizeof note, &note_level);
    if (note[0])
        kd_log_write(&d->log, note_level, "%s", note);
    if (kd_conn_limit_init(&d->conn_limit, max_connections, d->metrics, kd_log_sink, &d->log) != 0) {
        kd_log_write(&d->log, KD_LOG_ERROR, "out of memory");
        return -1;
    }

    struct kd_server_options opts = {
        .host = d->cfg.host,
        .port = (int)d->cfg.port,
        .idle_timeout_ms = (uint64_t)d->cfg.limits.idle_timeout_ms,
        .request_timeout_ms = (uint64_t)d->cfg.limits.request_timeout_ms,
        .service =
            {
                .router = d->api.router,
                .split_suffix = "/infer",
                .split_route = d->api.models_route,
                .ctx = &d->api,
                .max_header_bytes = (size_t)d->cfg.limits.max_header_bytes,
                .max_body_bytes = (uint64_t)d->cfg.limits.max_body_bytes,
                .access = d->cfg.log_access ? kd_log_access : NULL,
                .access_ctx = &d->log,
            },
        .metrics = d->metrics,
        .conn_limit = &d->conn_limit,
        .log = kd_log_sink,
        .log_ud = &d->log,
        .log_level = d->log.level,
    };
    if (kd_server_new(&d->server, &d->loop, &opts) != 0) {
        kd_log_write(&d->log, KD_LOG_ERROR, "out of memory");
        return -1;
    }
    if (start_handles(d) != 0) {
        kd_log_write(&d->log, KD_LOG_ERROR, "cannot install signal handlers");
        return -1;
    }
    /* Bound first, so a port in use stops the start before any model loads or job resumes; the
     * loop is not running yet, so nothing is answered before announce_listening. */
    if (kd_server_listen(d->server, err, sizeof err) != 0) {
        kd_log_write(&d->log, KD_LOG_ERROR, "%s", err);
        return -1;
    }

    if (start_serving(d) != 0)
        return -1;
    /* after serving, which a job's new model version is handed to */
    int store = open_training(d, err, sizeof err);
    if (store == KD_JOBSTORE_FULL) {
        /* Serving needs no room on the disk: it goes on, and training comes once there is room. */
        kd_log_write(&d->log, KD_LOG_WARN,
                     "%s. kilnd serves its models without it; training jobs are answered 507 until "
                     "space is freed (tried again every %d s)",
                     err, STORE_RETRY_MS / 1000);
        snprintf(
            d->api.jobs_unavailable, sizeof d->api.jobs_unavailable,
            "training jobs are unavailable: kilnd could not open its job store at start (%.400s); it tries again "
            "every %d s, and takes jobs once space is freed",
            err, STORE_RETRY_MS / 1000);
        uv_timer_start(&d->store_retry, on_store_retry, STORE_RETRY_MS, STORE_RETRY_MS);
    } else if (store != 0) {
        kd_log_write(&d->log, KD_LOG_ERROR, "%s", err);
        return -1;
    }
    struct kd_tensor_service_options to = {
        .sched = d->sched,
        .metrics = d->metrics,
        .tokens = &d->cfg.api_tokens,
        .devices = &d->cfg.devices,
        .limits = d->cfg.remote,
        .loop = &d->loop,
        /* under the server's idle timeout, which would cut the stalled connection without a word */
        .stall_timeout_ms = (uint64_t)d->cfg.limits.idle_timeout_ms / 2,
        .log = kd_log_sink,
        .log_ud = &d->log,
    };
    d->tensor = kd_tensor_service_new(&to, err, sizeof err);
    if (!d->tensor) {
        kd_log_write(&d->log, KD_LOG_ERROR, "remote tensors: %s", err);
        return -1;
    }
    d->api.tensor = d->tensor;
    if (start_grpc(d) != 0 || announce_listening(d) != 0)
        return -1;
    d->init_done = true;
    int loading = kd_serving_startup_loads(d->serving);
    if (loading == 0)
        set_state(d, KD_DAEMON_READY);
    else
        kd_log_write(&d->log, KD_LOG_INFO, "loading %d model(s) found at start; ready when they have finished",
                     loading);
    return 0;
}

int kd_daemon_run(struct kd_daemon *d)
{
    uv_run(&d->loop, UV_RUN_DEFAULT);
    /* said by kd_daemon_free once the training step and queued inference are over and the data
     * folder is let go: whoever waits for the line may then start the next kilnd */
    d->state = KD_DAEMON_STOPPED;
    d->exit_code = 0;
    return d->exit_code;
}

void kd_daemon_free(struct kd_daemon *d)
{
    if (d->loop_ready) {
        /* After a failed start the listener and handles are still open: close them and let
         * the loop deliver the close callbacks before it is torn down. */
        if (d->server && d->state != KD_DAEMON_STOPPED) {
            kd_server_drain(d->server, NULL, NULL);
            kd_server_close_all(d->server);
        }
        if (d->grpc)
            kd_grpc_close_all(d->grpc);
        close_daemon_handles(d);
        /* Closing the signal handles gave SIGHUP back its default action, which kills: a log
         * rotation during the wait for the trainer below would turn a clean stop into exit 129
         * with the job's outcome unrecorded. A reopen is pointless now; the lines go on to the
         * open file. (A second SIGTERM or SIGINT still cuts at once, as documented.) */
        signal(SIGHUP, SIG_IGN);
        /* A running job stops before its next step and stays running in the store. */
        kd_jobs_stop(d->training);
        d->api.jobs = NULL;
        /* Queued inference gets its answer (or is dropped with its connection) before the
         * model table goes; then the scheduler's async handle closes with the rest. */
        d->api.sched = NULL;
        kd_sched_stop(d->sched);
        kd_serving_free(d->serving);
        d->serving = NULL;
        d->api.serving = NULL;
        kd_sched_close(d->sched);
        uv_run(&d->loop, UV_RUN_DEFAULT);
        if (uv_loop_close(&d->loop) != 0)
            kd_log_write(&d->log, KD_LOG_WARN, "event loop closed with handles still open");
    }
    kd_server_free(d->server);
    if (d->grpc)
        kd_grpc_free(d->grpc);
    if (d->grpc_port_file) {
        unlink(d->grpc_port_file);
        free(d->grpc_port_file);
    }
    /* After the connections (a session outlives its connection until its device memory is
     * freed) and before the devices close. */
    d->api.tensor = NULL;
    kd_tensor_service_free(d->tensor);
    kd_sched_destroy(d->sched);
    kd_jobs_free(d->training);
    kd_jobstore_close(d->jobs);
    if (d->port_file) {
        unlink(d->port_file);
        free(d->port_file);
    }
    /* last of the data folder: a kilnd started next finds every file here closed */
    kd_daemon_unlock_data_dir(d->data_dir_lock, d->data_dir_folder);
    d->data_dir_lock = -1;
    d->data_dir_folder = -1;
    if (d->state == KD_DAEMON_STOPPED)
        kd_log_write(&d->log, KD_LOG_INFO, "state stopped");
    if (d->api_ready)
        kd_api_free(&d->api);
    kd_metrics_free(d->metrics);
    if (d->log_ready) {
        kiln_set_warning_handler(NULL, NULL);
        kd_log_close(&d->log);
    }
    kd_config_free(&d->cfg);
}
