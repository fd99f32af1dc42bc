/*
 * config/config.h — kilnd's configuration: one table of keys drives the JSON config file,
 * KILN_* environment variables, command-line flags, --help and docs/configuration.md.
 *
 * Precedence is file < environment < flags. Every error names the key and where the bad value
 * came from. Nothing here is global: a struct kd_config is plain data the caller owns, so
 * two daemons (or two tests) can each hold their own.
 *
 *     struct kd_config cfg;
 *     char err[512];
 *     enum kd_config_action act = kd_config_load(&cfg, argc, argv, environ, err, sizeof err);
 *     if (act == KD_CONFIG_ERROR) { fprintf(stderr, "%s\n", err); return 1; }
 *     ...
 *     kd_config_free(&cfg);
 */
#ifndef KD_CONFIG_H
#define KD_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum kd_log_level {
    KD_LOG_ERROR = 0,
    KD_LOG_WARN,
    KD_LOG_INFO,
    KD_LOG_DEBUG,
};

enum kd_log_format {
    KD_LOG_TEXT = 0,
    KD_LOG_JSON,
};

struct kd_strlist {
    char **items;
    size_t count;
};

struct kd_config_limits {
    int64_t max_header_bytes;
    int64_t max_body_bytes;
    int64_t idle_timeout_ms;
    int64_t request_timeout_ms;
    int64_t max_tensor_elements;
    int64_t max_string_bytes;
    int64_t max_queue_depth;
    int64_t infer_timeout_ms;
    int64_t pool_idle_trim_ms; /* a device idle this long gives its cached buffers back; 0: never */
    int64_t max_connections;   /* client connections open at once, HTTP and gRPC together */
};

/* The remote tensor endpoint (/v1/tensor): per-daemon and per-session limits. */
struct kd_config_remote {
    int64_t max_sessions;
    int64_t max_message_bytes;
    int64_t max_live_bytes;
    int64_t max_ids;
    int64_t max_queued_ops;
};

/* Training beside inference on a shared device (the scheduler's training gate). */
struct kd_config_training {
    int64_t max_wait_ms;
    int64_t max_jobs_per_device;
    int64_t nice;
};

struct kd_config {
    char *host;
    int64_t port;
    int64_t grpc_port;          /* -1: no gRPC service */
    char *data_dir;
    char *example_models;       /* "" means none */
    char *model_repository;     /* "" means <data_dir>/models; may be read-only */
    struct kd_strlist devices;
    struct kd_strlist device_options; /* "BACKEND:k=v&k=v", given to kiln_device_defaults_set */
    int64_t worker_threads;
    struct kd_config_limits limits;
    struct kd_config_remote remote;
    struct kd_config_training training;
    int64_t drain_timeout_ms;
    int64_t log_level;          /* enum kd_log_level */
    int64_t log_format;         /* enum kd_log_format */
    int64_t log_access;         /* 0 off, 1 on: one line per HTTP response */
    char *log_file;             /* "" means stderr */
    struct kd_strlist api_tokens;
    struct kd_strlist data_roots; /* jobs.data_roots */
    int64_t job_retention_count;  /* jobs.retention_count: ended jobs kept, the newest; 0 all */
    int64_t job_retention_days;   /* jobs.retention_days: ended jobs kept this many days; 0 forever */
    char *config_file;          /* the --config path, or NULL */
    char *notes;                /* what the load went on past, one warning per line (NULL: none): a value of the
                  * file an environment variable overrides, a KILN_* name that looks like a
                  * misspelt setting; kilnd logs them at start and --check-config prints them */
};

/* What the caller should do after kd_config_load. */
enum kd_config_action {
    KD_CONFIG_RUN = 0,   /* start the daemon */
    KD_CONFIG_CHECK,     /* --check-config: the configuration is valid, exit 0 */
    KD_CONFIG_HELP,      /* --help was asked for */
    KD_CONFIG_VERSION,   /* --version was asked for */
    KD_CONFIG_PRINT_DOC, /* --print-config-doc was asked for */
    KD_CONFIG_ERROR,     /* err holds the message; exit 1 */
};

/* Fills cfg with the defaults from the table; heap strings are owned by cfg. */
int kd_config_init_defaults(struct kd_config *cfg);

/*
 * Loads defaults, then the --config file (if any), then env (a NULL-terminated "KEY=VALUE"
 * array, may be NULL), then the flags in argv[1..]. On KD_CONFIG_ERROR cfg is left freed.
 */
enum kd_config_action kd_config_load(struct kd_config *cfg, int argc, char *const *argv, char *const *env,
                                     char *err, size_t errlen);

void kd_config_free(struct kd_config *cfg);

/* --help text, generated from the table. */
void kd_config_print_help(FILE *out, const char *prog);

/* docs/configuration.md, generated from the table. */
void kd_config_print_doc(FILE *out);

const char *kd_log_level_to_str(enum kd_log_level level);

#endif /* KD_CONFIG_H */
