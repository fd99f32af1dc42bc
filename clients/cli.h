/*
 * clients/cli.h — what the kiln CLI's files share: the parsed server address, a blocking
 * one-request-per-connection HTTP client, and the job and model commands (clients/jobs.c).
 */
#ifndef KILN_CLIENTS_CLI_H
#define KILN_CLIENTS_CLI_H

#include <stdbool.h>
#include <stddef.h>

struct url {
    char host[256];
    char port[8];
    char base[256];   /* path prefix, without a trailing slash */
};

struct response {
    int status;
    char *raw;        /* the whole response, NUL-terminated */
    const char *body;
    size_t body_len;
};

struct kiln_client {
    struct url u;
    const char *shown;    /* the URL as the user gave it, for messages */
    const char *token;    /* bearer token or NULL */
    bool quiet;           /* say nothing on stderr (the dashboard owns the terminal) */
    int connect_timeout_ms; /* how long a connect may take; 0: the CLI's 10 s */
};

/* A connected socket, or -1 after printing why (the daemon is unreachable). */
int kiln_cli_connect(const struct kiln_client *cl);
int kiln_cli_send_all(const struct kiln_client *cl, int fd, const char *p, size_t n);
/* Connect and send one request; the socket (the answer is read by the caller), or -1. */
int kiln_cli_send_request(const struct kiln_client *cl, const char *method, const char *path, const char *body,
                          size_t body_len, const char *extra_headers);
/* One whole request and response; 0, or -1 after printing why. free(r->raw) afterwards. */
int kiln_cli_request(const struct kiln_client *cl, const char *method, const char *path, const char *body,
                     size_t body_len, struct response *r);
/* text[0, len) as one JSON value: the parsed value, or NULL with why in whyb ("is not valid JSON
 * (at byte 5)", "has more after its JSON value (at byte 12) ..."): text after the value is
 * refused rather than dropped, which would answer for part of what the user gave. */
struct cJSON *kiln_cli_parse_json(const char *text, size_t len, char *whyb, size_t whylen);
/* "kiln: WHAT: HTTP 404: no job 7" from a JSON error body. */
void kiln_cli_print_error(const char *what, const struct response *r);

extern const char kiln_cli_jobs_usage[];
/* Whether s is a job id as the CLI takes one: a positive decimal integer without leading zeros,
 * as kilnd writes it (0 names no job). */
bool kiln_cli_job_id_valid(const char *s);
bool kiln_cli_jobs_known(const char *cmd);
/* Runs a job or model command with its arguments; the process exit status. */
int kiln_cli_jobs_main(const struct kiln_client *cl, const char *cmd, int argc, char **argv);

/* kiln watch ID [--plain] [--exit-on-end]: the dashboard on a terminal, plain lines otherwise
 * (clients/watch.c); the process exit status. */
int kiln_cli_watch_main(const struct kiln_client *cl, int argc, char **argv);
/* Follows job ID: the dashboard when DASHBOARD, else plain lines; the process exit status. */
int kiln_cli_watch(const struct kiln_client *cl, long long id, bool dashboard, bool exit_on_end);
/* Whether stdin and stdout are a terminal the dashboard can draw on. */
bool kiln_cli_is_tty(void);

#endif /* KILN_CLIENTS_CLI_H */
