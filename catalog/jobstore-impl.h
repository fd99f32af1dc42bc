/*
 * catalog/jobstore-impl.h — what the job store's files share (jobstore.c: opening, migrations,
 * jobs and their states; jobstore-history.c: events, metrics and the checkpoint index;
 * jobstore-purge.c: removing ended jobs, retention): the store itself and the small helpers every
 * statement goes through. Internal to catalog/; jobstore.h is the interface.
 */
#ifndef KD_CATALOG_JOBSTORE_IMPL_H
#define KD_CATALOG_JOBSTORE_IMPL_H

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sqlite3.h>

#include "jobstore.h"

struct kd_jobstore {
    sqlite3 *db;
    int version;
};

/* Helpers small enough to live here, so each file keeps its short names without exporting them. */

static inline int seterr(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static inline int seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* The last statement failed for want of disk space: SQLite says SQLITE_FULL when a write comes
 * up short, but an fsync or a truncate that hits ENOSPC (or a quota) is reported as an I/O error. */
static inline bool store_full(sqlite3 *db)
{
    int code = sqlite3_errcode(db);
    int sys = sqlite3_system_errno(db);
    return code == SQLITE_FULL || ((code & 0xff) == SQLITE_IOERR && (sys == ENOSPC || sys == EDQUOT));
}

/* what's failure with SQLite's message (msg, or the connection's); one that ran out of disk space
 * says so in words the API recognizes (kd_jobstore_error_is_full). */
static inline int fail_with(sqlite3 *db, const char *what, const char *msg, char *err, size_t errlen)
{
    if (!db)
        return seterr(err, errlen, "%s: out of memory", what);
    if (store_full(db))
        return seterr(err, errlen, "%s: %s (%s); nothing was written, and writes work again once space is freed",
                      what, KD_JOBSTORE_FULL_TEXT, msg ? msg : sqlite3_errmsg(db));
    return seterr(err, errlen, "%s: %s", what, msg ? msg : sqlite3_errmsg(db));
}

static inline int fail(sqlite3 *db, const char *what, char *err, size_t errlen)
{
    return fail_with(db, what, NULL, err, errlen);
}

static inline int exec(sqlite3 *db, const char *sql, const char *what, char *err, size_t errlen)
{
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) == SQLITE_OK)
        return 0;
    fail_with(db, what, msg, err, errlen);
    sqlite3_free(msg);
    return -1;
}

static inline int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int begin(struct kd_jobstore *js, const char *what, char *err, size_t errlen)
{
    return exec(js->db, "BEGIN IMMEDIATE", what, err, errlen);
}

/* Commit when rc is 0, else roll back; returns rc (or -1 when the commit fails). */
static inline int finish(struct kd_jobstore *js, int rc, const char *what, char *err, size_t errlen)
{
    if (rc == 0 && exec(js->db, "COMMIT", what, err, errlen) == 0)
        return 0;
    sqlite3_exec(js->db, "ROLLBACK", NULL, NULL, NULL);
    return rc != 0 ? rc : -1;
}

static inline sqlite3_stmt *prepare(struct kd_jobstore *js, const char *sql, const char *what, char *err,
                                    size_t errlen)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(js->db, sql, -1, &st, NULL) != SQLITE_OK) {
        fail(js->db, what, err, errlen);
        return NULL;
    }
    return st;
}

/* Step a statement that returns no rows; 0 or -1. */
static inline int run(struct kd_jobstore *js, sqlite3_stmt *st, const char *what, char *err, size_t errlen)
{
    int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : fail(js->db, what, err, errlen);
    sqlite3_finalize(st);
    return rc;
}

static inline bool final_state(const char *s)
{
    return strcmp(s, KD_JOB_SUCCEEDED) == 0 || strcmp(s, KD_JOB_FAILED) == 0 || strcmp(s, KD_JOB_CANCELLED) == 0;
}

static inline char *col_dup(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? strdup((const char *)t) : NULL;
}

/* A job's state read inside the current transaction into state: 0, KD_JOBSTORE_NOT_FOUND or -1. */
int kd_js_current_state(struct kd_jobstore *js, int64_t id, char *state, size_t len, char *err, size_t errlen);
/* The insert of kd_jobstore_event_append (its seq into *seq when not NULL), inside a transaction the
 * caller holds. */
int kd_js_append_event_in(struct kd_jobstore *js, int64_t job_id, const char *type, const char *payload,
                          int64_t *seq, char *err, size_t errlen);

#endif /* KD_CATALOG_JOBSTORE_IMPL_H */
