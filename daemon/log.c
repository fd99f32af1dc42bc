/*
 * daemon/log.c — formatting and writing log lines.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/utf8.h"
#include "http-conn.h"
#include "log.h"

/* A new log file gets 0666 under the umask, as every file kilnd creates, so that a kilnd run later
 * as another uid of the same group (an arbitrary uid in group 0) can append to it. */
static int open_path(const char *path)
{
    return open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
}

int kd_log_open(struct kd_log *log, const char *path, enum kd_log_level level, enum kd_log_format format,
                char *err, size_t errlen)
{
    log->fd = STDERR_FILENO;
    log->path = NULL;
    log->level = level;
    log->format = format;
    atomic_init(&log->lost_lines, 0);
    atomic_init(&log->lost_errno, 0);
    atomic_init(&log->torn, false);
    if (!path || !path[0])
        return 0;
    int fd = open_path(path);
    if (fd < 0) {
        snprintf(err, errlen, "log_file: cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    log->path = strdup(path);
    if (!log->path) {
        close(fd);
        snprintf(err, errlen, "log_file: out of memory");
        return -1;
    }
    log->fd = fd;
    return 0;
}

/*
 * The new file takes the old one's descriptor number with dup3, in one step: log->fd never
 * changes, so a thread writing a line meanwhile (the trainer, the libuv pool's purges) writes to
 * the old file or the new one. Swapping the number and closing the old one had let such a writer
 * read a closed descriptor, or one the loop had just given to an accepted socket.
 */
int kd_log_reopen(struct kd_log *log)
{
    if (!log->path)
        return 0;
    int fd = open_path(log->path);
    if (fd < 0)
        return -1;
    int rc = dup3(fd, log->fd, O_CLOEXEC) < 0 ? -1 : 0;
    close(fd);
    return rc;
}

void kd_log_close(struct kd_log *log)
{
    if (log->path && log->fd >= 0)
        close(log->fd);
    free(log->path);
    log->path = NULL;
    log->fd = STDERR_FILENO;
}

/* s as the inside of a JSON string: quotes, backslashes and control characters escaped, and a
 * byte that is not part of well-formed UTF-8 (a model folder's name can hold any byte) written
 * as U+FFFD, since JSON text is UTF-8 (RFC 8259 section 8.1) and a log shipper drops or garbles
 * a line that is not. Stops before a character that would not fit whole; the length written. */
static size_t put_json_string(char *dst, size_t room, const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t left = strlen(s), n = 0;
    while (left > 0) {
        unsigned char c = *u;
        size_t take = 1;
        if (c == '"' || c == '\\') {
            if (n + 2 >= room)
                break;
            dst[n++] = '\\';
            dst[n++] = (char)c;
        } else if (c < 0x20 || c == 0x7f) {
            if (n + 6 >= room)
                break;
            n += (size_t)snprintf(dst + n, room - n, "\\u%04x", c);
        } else if (c < 0x80) {
            if (n + 1 >= room)
                break;
            dst[n++] = (char)c;
        } else if ((take = kiln_utf8_sequence_len(u, left)) > 0) {
            if (n + take >= room)
                break;
            memcpy(dst + n, u, take);
            n += take;
        } else {
            take = 1;
            if (n + 6 >= room)
                break;
            memcpy(dst + n, "\\ufffd", 6);
            n += 6;
        }
        u += take;
        left -= take;
    }
    return n;
}

/* s for a text line: a newline, a tab, a backslash and other control characters escaped as \n,
 * \t, \\ and \xNN, and a byte that is not part of well-formed UTF-8 as \xNN, so that a value
 * inside a message (a model folder's name) cannot start a line of its own that reads like one
 * kilnd wrote. Stops before a character that would not fit whole; the length written. */
static size_t put_text_message(char *dst, size_t room, const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t left = strlen(s), n = 0;
    while (left > 0) {
        unsigned char c = *u;
        size_t take = c < 0x80 ? 1 : kiln_utf8_sequence_len(u, left);
        char esc[8];
        size_t elen = 0;
        if (c == '\\' || c == '\n' || c == '\t')
            elen = (size_t)snprintf(esc, sizeof esc, "\\%c", c == '\n' ? 'n' : c == '\t' ? 't' : '\\');
        else if (c < 0x20 || c == 0x7f || take == 0)
            elen = (size_t)snprintf(esc, sizeof esc, "\\x%02X", c);
        if (take == 0)
            take = 1;
        if (n + (elen ? elen : take) >= room)
            break;
        if (elen)
            memcpy(dst + n, esc, elen), n += elen;
        else
            memcpy(dst + n, u, take), n += take;
        u += take;
        left -= take;
    }
    return n;
}

/* A line for msg at level_name (kd_log_level_to_str's, or "notice") in the log's format, ending in a
 * newline, into line (room bytes, at least 64); its length. */
static size_t format_line(const struct kd_log *log, const char *level_name, const char *msg, char *line,
                          size_t room)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    char stamp[96];
    snprintf(stamp, sizeof stamp, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ts.tv_nsec / 1000000));

    size_t n;
    if (log->format == KD_LOG_JSON) {
        n = (size_t)snprintf(line, room, "{\"ts\":\"%s\",\"level\":\"%s\",\"msg\":\"", stamp, level_name);
        n += put_json_string(line + n, room - n - 3, msg);
        memcpy(line + n, "\"}\n", 3);
        n += 3;
    } else {
        n = (size_t)snprintf(line, room, "%s %-5s ", stamp, level_name);
        n += put_text_message(line + n, room - n - 1, msg);
        line[n++] = '\n';
    }
    return n;
}

/* The longest line written: an access line (kd_log_access) or any other (emit). */
#define KD_LOG_LINE_MAX 4096

/* Writes a finished line (n bytes, at most KD_LOG_LINE_MAX, ending in a newline), after the note
 * on lines lost before it when there were any, in one write(2). A line that cannot be written is
 * counted for that note: the log has nowhere else to report its own failure. */
static void put_line(struct kd_log *log, const char *line, size_t n)
{
    uint64_t lost = atomic_exchange(&log->lost_lines, 0);
    bool torn = atomic_exchange(&log->torn, false);
    char joined[1 + 512 + KD_LOG_LINE_MAX]; /* a newline, the note, then the line */
    const char *out = line;
    size_t len = n, prefix = 0;
    if (lost || torn) {
        if (torn)
            joined[prefix++] = '\n'; /* ends the line a short write cut */
        if (lost) {
            char msg[256];
            int why = atomic_load(&log->lost_errno);
            snprintf(msg, sizeof msg, "%llu log line(s) lost: the log could not be written (%s)",
                     (unsigned long long)lost, why ? strerror(why) : "short write");
            prefix += format_line(log, kd_log_level_to_str(KD_LOG_WARN), msg, joined + prefix, 512);
        }
        memcpy(joined + prefix, line, n);
        out = joined;
        len = prefix + n;
    }
    ssize_t rc = write(log->fd, out, len);
    if (rc == (ssize_t)len) {
        if (lost)
            atomic_store(&log->lost_errno, 0);
        return;
    }
    /* a short write (the disk filled during it) says no errno; the next write, refused, will */
    if (rc < 0)
        atomic_store(&log->lost_errno, errno);
    if (rc > 0 || torn)
        atomic_store(&log->torn, true);
    /* a short write kept some bytes of this line but not the line; the note, unless it went whole */
    atomic_fetch_add(&log->lost_lines, 1 + (rc >= 0 && (size_t)rc >= prefix ? 0 : lost));
}

static void emit(struct kd_log *log, const char *level_name, const char *msg)
{
    char line[KD_LOG_LINE_MAX];
    put_line(log, line, format_line(log, level_name, msg, line, sizeof line));
}

void kd_log_write(struct kd_log *log, enum kd_log_level level, const char *fmt, ...)
{
    if (level > log->level)
        return;
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    emit(log, kd_log_level_to_str(level), msg);
}

void kd_log_notice(struct kd_log *log, const char *fmt, ...)
{
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    emit(log, "notice", msg);
}

void kd_log_sink(void *ud, enum kd_log_level level, const char *msg)
{
    struct kd_log *log = ud;
    if (level <= log->level)
        emit(log, kd_log_level_to_str(level), msg);
}

/* Copies up to n bytes of s for a text line: bytes outside printable ASCII and spaces as %XX. */
static size_t put_text_target(char *dst, size_t room, const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k + 4 < room; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= 0x20 || c >= 0x7f || c == '%')
            k += (size_t)snprintf(dst + k, room - k, "%%%02X", c);
        else
            dst[k++] = (char)c;
    }
    dst[k] = '\0';
    return k;
}

void kd_log_access(void *ud, const struct kd_http_access *a)
{
    struct kd_log *log = ud;
    if (KD_LOG_INFO > log->level)
        return;
    /* The target is the only long field; 512 bytes of it say enough. */
    size_t tlen = a->target_len > 512 ? 512 : a->target_len;
    double ms = (double)a->elapsed_ns / 1e6;
    char line[KD_LOG_LINE_MAX];
    size_t n;
    if (log->format == KD_LOG_JSON) {
        struct timespec ts;
        struct tm tm;
        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        char target[520], rid[160], peer[160];
        memcpy(target, a->target, tlen);
        target[tlen] = '\0';
        /* a NUL inside the target ends it here; llhttp refuses those in a request line anyway */
        char et[1100], er[400], ep[400];
        et[put_json_string(et, sizeof et - 1, target)] = '\0';
        snprintf(rid, sizeof rid, "%s", a->request_id);
        snprintf(peer, sizeof peer, "%s", a->peer);
        er[put_json_string(er, sizeof er - 1, rid)] = '\0';
        ep[put_json_string(ep, sizeof ep - 1, peer)] = '\0';
        int w = snprintf(line, sizeof line,
                         "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03dZ\",\"level\":\"info\",\"msg\":\"access\","
                         "\"method\":\"%s\",\"target\":\"%s\",\"status\":%d,\"ms\":%.3f,\"bytes_in\":%llu,"
                         "\"request_id\":\"%s\",\"peer\":\"%s\"}\n",
                         tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                         (int)(ts.tv_nsec / 1000000), a->method, et, a->status, ms, (unsigned long long)a->bytes_in,
                         er, ep);
        n = w < 0 ? 0 : (size_t)w >= sizeof line ? sizeof line - 1 : (size_t)w;
        if (n == sizeof line - 1)
            line[n - 1] = '\n';
        put_line(log, line, n);
        return;
    }
    char target[2100];
    put_text_target(target, sizeof target, a->target, tlen);
    snprintf(line, sizeof line, "access %s %s %d %.3fms in=%llu id=%s peer=%s", a->method, target, a->status, ms,
             (unsigned long long)a->bytes_in, a->request_id, a->peer);
    emit(log, kd_log_level_to_str(KD_LOG_INFO), line);
}
