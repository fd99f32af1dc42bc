/*
 * daemon/log.h — kilnd's leveled log: text or JSON lines to stderr or a file that SIGHUP reopens
 * (so logrotate can move it away). Each line leaves in a single write(2), so lines from
 * concurrent writers never interleave mid-line.
 *
 *     struct kiln_log log;
 *     kiln_log_open(&log, "", KILN_LOG_INFO, KILN_LOG_TEXT, err, sizeof err);  // "" = stderr
 *     kiln_log_write(&log, KILN_LOG_INFO, "listening on port %d", port);
 *     kiln_log_close(&log);
 */
#ifndef KILN_DAEMON_LOG_H
#define KILN_DAEMON_LOG_H

#include <stddef.h>

#include "config.h"

struct kiln_log {
    int fd;
    char *path;                 /* NULL for stderr */
    enum kiln_log_level level;
    enum kiln_log_format format;
};

int kiln_log_open(struct kiln_log *log, const char *path, enum kiln_log_level level,
                  enum kiln_log_format format, char *err, size_t errlen);
/* Opens the path again (after rotation); keeps the old file when the new open fails. */
int kiln_log_reopen(struct kiln_log *log);
void kiln_log_close(struct kiln_log *log);

void kiln_log_write(struct kiln_log *log, enum kiln_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Adapter with the server's log callback signature; ud is the struct kiln_log. */
void kiln_log_sink(void *ud, enum kiln_log_level level, const char *msg);

/*
 * The access log (api/http_conn.h's access callback; ud is the struct kiln_log): one info line
 * per response. Text: `access GET /v2 200 0.123ms in=0 id=kiln-1-2-3 peer=127.0.0.1:5000`
 * (target with control characters and spaces escaped); JSON: msg "access" plus method, target,
 * status, ms, bytes_in, request_id and peer fields.
 */
struct kiln_http_access;
void kiln_log_access(void *ud, const struct kiln_http_access *a);

#endif /* KILN_DAEMON_LOG_H */
