/*
 * daemon/log.h — kilnd's leveled log: text or JSON lines to stderr or a file that SIGHUP reopens
 * (so logrotate can move it away). Each line leaves in a single write(2), so lines from
 * concurrent writers never interleave mid-line. While the log cannot be written (its disk full)
 * lines are dropped and counted; the first line written afterwards is preceded by one saying how
 * many were lost and why, on a line of its own even when the last failed write left half a line.
 *
 *     struct kd_log log;
 *     kd_log_open(&log, "", KD_LOG_INFO, KD_LOG_TEXT, err, sizeof err);  // "" = stderr
 *     kd_log_write(&log, KD_LOG_INFO, "listening on port %d", port);
 *     kd_log_close(&log);
 */
#ifndef KD_DAEMON_LOG_H
#define KD_DAEMON_LOG_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

struct kd_log {
    int fd;
    char *path;                 /* NULL for stderr */
    enum kd_log_level level;
    enum kd_log_format format;
    /* Lines that could not be written (a full disk, a file size limit) and why, said in the first
     * line that can be: a lost line is counted, not silently gone. torn: a write came up short, so
     * the file ends mid-line and the next write starts a new one. */
    _Atomic uint64_t lost_lines;
    _Atomic int lost_errno;
    atomic_bool torn;
};

int kd_log_open(struct kd_log *log, const char *path, enum kd_log_level level, enum kd_log_format format,
                char *err, size_t errlen);
/* Opens the path again (after rotation); keeps the old file when the new open fails. */
int kd_log_reopen(struct kd_log *log);
void kd_log_close(struct kd_log *log);

void kd_log_write(struct kd_log *log, enum kd_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A line written whatever log_level says, at level "notice": what a deployment must always be
 * able to read back, such as the ports kilnd bound (with --port 0, the only place they are said). */
void kd_log_notice(struct kd_log *log, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Adapter with the server's log callback signature; ud is the struct kd_log. */
void kd_log_sink(void *ud, enum kd_log_level level, const char *msg);

/*
 * The access log (api/http-conn.h's access callback; ud is the struct kd_log): one info line
 * per response. Text: `access GET /v2 200 0.123ms in=0 id=kiln-1-2-3 peer=127.0.0.1:5000`
 * (target with control characters and spaces escaped); JSON: msg "access" plus method, target,
 * status, ms, bytes_in, request_id and peer fields.
 */
struct kd_http_access;
void kd_log_access(void *ud, const struct kd_http_access *a);

#endif /* KD_DAEMON_LOG_H */
