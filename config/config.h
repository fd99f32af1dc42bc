/*
 * config/config.h — kilnd's configuration: one table of keys drives the JSON config file,
 * KILN_* environment variables, command-line flags, --help and docs/configuration.md.
 *
 * Precedence is file < environment < flags. Every error names the key and where the bad value
 * came from. Nothing here is global: a struct kiln_config is plain data the caller owns, so
 * two daemons (or two tests) can each hold their own.
 *
 *     struct kiln_config cfg;
 *     char err[512];
 *     enum kiln_config_action act = kiln_config_load(&cfg, argc, argv, environ, err, sizeof err);
 *     if (act == KILN_CONFIG_ERROR) { fprintf(stderr, "%s\n", err); return 1; }
 *     ...
 *     kiln_config_free(&cfg);
 */
#ifndef KILN_CONFIG_H
#define KILN_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum kiln_log_level {
    KILN_LOG_ERROR = 0,
    KILN_LOG_WARN,
    KILN_LOG_INFO,
    KILN_LOG_DEBUG,
};

enum kiln_log_format {
    KILN_LOG_TEXT = 0,
    KILN_LOG_JSON,
};

struct kiln_strlist {
    char **items;
    size_t count;
};

struct kiln_config_limits {
    int64_t max_header_bytes;
    int64_t max_body_bytes;
    int64_t idle_timeout_ms;
    int64_t request_timeout_ms;
    int64_t max_tensor_elements;
    int64_t max_string_bytes;
    int64_t max_queue_depth;
    int64_t infer_timeout_ms;
};

/* The remote tensor endpoint (/v1/tensor): per-daemon and per-session limits. */
struct kiln_config_remote {
    int64_t max_sessions;
    int64_t max_message_bytes;
    int64_t max_live_bytes;
    int64_t max_ids;
    int64_t max_queued_ops;
};

/* Training beside inference on a shared device (the scheduler's training gate). */
struct kiln_config_training {
    int64_t max_wait_ms;
    int64_t max_jobs_per_device;
    int64_t nice;
};

struct kiln_config {
    char *host;
    int64_t port;
    int64_t grpc_port;          /* -1: no gRPC service */
    char *data_dir;
    char *example_models;       /* "" means none */
    char *model_repository;     /* "" means <data_dir>/models; may be read-only */
    struct kiln_strlist devices;
    struct kiln_strlist device_options;   /* "BACKEND:k=v&k=v", given to kiln_device_defaults_set */
    int64_t worker_threads;
    struct kiln_config_limits limits;
    struct kiln_config_remote remote;
    struct kiln_config_training training;
    int64_t drain_timeout_ms;
    int64_t log_level;          /* enum kiln_log_level */
    int64_t log_format;         /* enum kiln_log_format */
    int64_t log_access;         /* 0 off, 1 on: one line per HTTP response */
    char *log_file;             /* "" means stderr */
    struct kiln_strlist api_tokens;
    struct kiln_strlist data_roots;   /* jobs.data_roots */
    char *config_file;          /* the --config path, or NULL */
};

/* What the caller should do after kiln_config_load. */
enum kiln_config_action {
    KILN_CONFIG_RUN = 0,        /* start the daemon */
    KILN_CONFIG_CHECK,          /* --check-config: the configuration is valid, exit 0 */
    KILN_CONFIG_HELP,           /* --help was asked for */
    KILN_CONFIG_VERSION,        /* --version was asked for */
    KILN_CONFIG_PRINT_DOC,      /* --print-config-doc was asked for */
    KILN_CONFIG_ERROR,          /* err holds the message; exit 1 */
};

/* Fills cfg with the defaults from the table; heap strings are owned by cfg. */
int kiln_config_init_defaults(struct kiln_config *cfg);

/*
 * Loads defaults, then the --config file (if any), then env (a NULL-terminated "KEY=VALUE"
 * array, may be NULL), then the flags in argv[1..]. On KILN_CONFIG_ERROR cfg is left freed.
 */
enum kiln_config_action kiln_config_load(struct kiln_config *cfg, int argc, char *const *argv,
                                         char *const *env, char *err, size_t errlen);

void kiln_config_free(struct kiln_config *cfg);

/* --help text, generated from the table. */
void kiln_config_print_help(FILE *out, const char *prog);

/* docs/configuration.md, generated from the table. */
void kiln_config_print_doc(FILE *out);

const char *kiln_log_level_to_str(enum kiln_log_level level);

#endif /* KILN_CONFIG_H */
