/*
 * daemon/daemon.h — the daemon context and its life cycle. Everything a running kilnd owns
 * hangs off one struct kd_daemon; there is no global mutable state, so two daemons can run in
 * one process (each on its own loop).
 *
 * States: starting -> ready -> draining -> stopped. /v2/health/ready answers 200 only in ready,
 * which comes once start-up is done and every model found at start has finished loading.
 * Inference runs on the scheduler's workers (scheduler/); the model table is api/serving.c.
 *
 *     struct kd_daemon d;
 *     if (kd_daemon_init(&d, &cfg) == 0)   // takes ownership of cfg
 *         rc = kd_daemon_run(&d);          // until SIGTERM/SIGINT and the drain finish
 *     kd_daemon_free(&d);
 */
#ifndef KD_DAEMON_DAEMON_H
#define KD_DAEMON_DAEMON_H

#include <stdint.h>

#include <uv.h>

#include "config.h"
#include "conn-limit.h"
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

enum kd_daemon_state {
    KD_DAEMON_STARTING,
    KD_DAEMON_READY,
    KD_DAEMON_DRAINING,
    KD_DAEMON_STOPPED,
};

struct kd_daemon {
    struct kd_config cfg;
    struct kd_log log;
    uv_loop_t loop;
    uv_signal_t sig_term, sig_int, sig_hup;
    uv_timer_t drain_timer;
    uv_timer_t store_retry; /* the job store, tried again while a full disk keeps it shut */
    struct kd_metrics *metrics;
    struct kd_api api;
    struct kd_conn_limit conn_limit; /* limits.max_connections, for HTTP and gRPC together */
    struct kd_server *server;
    struct kd_grpc *grpc; /* NULL unless grpc_port is set */
    char *grpc_port_file;
    int drains_pending;            /* listeners whose connections are still draining */
    struct kd_jobstore *jobs;
    struct kd_sched *sched;
    struct kd_serving *serving;
    struct kd_jobs *training;
    struct kd_tensor_service *tensor;
    char *port_file;
    int data_dir_lock;       /* the open kilnd.lock holding the data folder's lock; -1 when none */
    int data_dir_folder;     /* the data folder, open and locked (flock); -1 when none */
    struct kd_notify notify; /* a service manager's NOTIFY_SOCKET, inert without one */
    enum kd_daemon_state state;
    uint64_t started_ns;
    double start_time_s; /* wall clock, for process_start_time_seconds */
    int exit_code;
    bool loop_ready, api_ready, log_ready, handles_ready;
    bool init_done; /* kd_daemon_init got to its end: readiness may follow the model loads */
};

const char *kd_daemon_state_to_str(enum kd_daemon_state s);

/*
 * The start's own checks of a configuration (check.c), each 0 or -1 with the message a failed
 * start logs in err. kd_daemon_check runs them all without listening or loading anything, and
 * opens and closes each configured device: what --check-config answers.
 */
int kd_daemon_check_listen(const struct kd_config *cfg, char *err, size_t errlen);
/* Sets the backends' defaults from device_options (process-wide, before any device opens). */
int kd_daemon_apply_device_options(const struct kd_config *cfg, char *err, size_t errlen);
int kd_daemon_check(const struct kd_config *cfg, char *err, size_t errlen);

/*
 * The files and folders a start uses (folders.c), each 0 or -1 with the message a failed start
 * logs in err; a start and kd_daemon_check call the same ones, and a check leaves nothing behind.
 */
/* log_file can be opened for appending (a file the check had to create is removed again). */
int kd_daemon_check_log_file(const char *path, char *err, size_t errlen);
/* model_repository, when set, is an existing folder kilnd can list (kilnd never creates it);
 * otherwise <data_dir>/models is a folder or absent (a start creates it). example_models, when
 * set, is an existing folder kilnd can list. */
int kd_daemon_check_model_folders(const struct kd_config *cfg, char *err, size_t errlen);
/* The folder kilnd serves: model_repository, or <data_dir>/models when it is empty. NULL when out
 * of memory; the caller frees it. */
char *kd_daemon_models_root(const struct kd_config *cfg);
/* <data_dir>/kiln.db, malloc'd; NULL when out of memory. */
char *kd_daemon_job_store_path(const struct kd_config *cfg);
/* When path is a symbolic link whose target does not exist, says so into out ("a symbolic link
 * to T, which does not exist") and returns its length; 0 (out "") otherwise. */
size_t kd_daemon_dangling_link(const char *path, char *out, size_t len);
/* Creates the data folder (and its parents) when missing and checks that it takes new files.
 * check_only: removes again the folders it created. */
int kd_daemon_make_data_dir(const char *dir, bool check_only, char *err, size_t errlen);
/*
 * Takes the data folder's lock for the life of the process: a lock on the folder itself, which no
 * file removal undoes, and one on <dir>/kilnd.lock, which then holds this process's id for the
 * messages. The kernel releases both when the process ends, however it ends. 0 with *lock_fd and
 * *folder_fd set; -1 when another kilnd holds either (err names its pid when known) or the file
 * cannot be opened; 1 when the start may go on with a warning in err (a file system without
 * locks: *lock_fd is -1).
 */
int kd_daemon_lock_data_dir(const char *dir, int *lock_fd, int *folder_fd, char *err, size_t errlen);
void kd_daemon_unlock_data_dir(int lock_fd, int folder_fd);
/* Whether a running kilnd holds dir's lock, without taking it: 0 when none does, else its pid
 * (-1 when unknown). */
long kd_daemon_data_dir_user(const char *dir);

/* Opens the log, the data folder, the job store and the listening socket. Logs its own errors. */
int kd_daemon_init(struct kd_daemon *d, struct kd_config *cfg);
/* Runs the loop until the daemon stops; returns the process exit code. */
int kd_daemon_run(struct kd_daemon *d);
void kd_daemon_free(struct kd_daemon *d);

#endif /* KD_DAEMON_DAEMON_H */
