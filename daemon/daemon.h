/*
 * daemon/daemon.h — the daemon context and its life cycle. Everything a running kilnd owns
 * hangs off one struct kiln_daemon; there is no global mutable state, so two daemons can run in
 * one process (each on its own loop).
 *
 * States: starting -> ready -> draining -> stopped. /v2/health/ready answers 200 only in ready.
 * Inference runs on the scheduler's workers (scheduler/); the model table is api/serving.c.
 *
 *     struct kiln_daemon d;
 *     if (kiln_daemon_init(&d, &cfg) == 0)   // takes ownership of cfg
 *         rc = kiln_daemon_run(&d);          // until SIGTERM/SIGINT and the drain finish
 *     kiln_daemon_free(&d);
 */
#ifndef KILN_DAEMON_DAEMON_H
#define KILN_DAEMON_DAEMON_H

#include <stdint.h>

#include <uv.h>

#include "config.h"
#include "endpoints.h"
#include "grpc.h"
#include "jobs.h"
#include "jobstore.h"
#include "log.h"
#include "metrics.h"
#include "notify.h"
#include "scheduler.h"
#include "server.h"
#include "serving.h"
#include "tensor.h"

enum kiln_daemon_state {
    KILN_DAEMON_STARTING,
    KILN_DAEMON_READY,
    KILN_DAEMON_DRAINING,
    KILN_DAEMON_STOPPED,
};

struct kiln_daemon {
    struct kiln_config cfg;
    struct kiln_log log;
    uv_loop_t loop;
    uv_signal_t sig_term, sig_int, sig_hup;
    uv_timer_t drain_timer;
    struct kiln_metrics *metrics;
    struct kiln_api api;
    struct kiln_server *server;
    struct kiln_grpc *grpc;        /* NULL unless grpc_port is set */
    char *grpc_port_file;
    int drains_pending;            /* listeners whose connections are still draining */
    struct kiln_jobstore *jobs;
    struct kiln_sched *sched;
    struct kiln_serving *serving;
    struct kiln_jobs *training;
    struct kiln_tensor_service *tensor;
    char *port_file;
    struct kiln_notify notify; /* a service manager's NOTIFY_SOCKET, inert without one */
    enum kiln_daemon_state state;
    uint64_t started_ns;
    int exit_code;
    bool loop_ready, api_ready, log_ready, handles_ready;
};

const char *kiln_daemon_state_to_str(enum kiln_daemon_state s);

/* Opens the log, the data folder, the job store and the listening socket. Logs its own errors. */
int kiln_daemon_init(struct kiln_daemon *d, struct kiln_config *cfg);
/* Runs the loop until the daemon stops; returns the process exit code. */
int kiln_daemon_run(struct kiln_daemon *d);
void kiln_daemon_free(struct kiln_daemon *d);

#endif /* KILN_DAEMON_DAEMON_H */
