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

/* The message into err (when the caller wants it); returns KD_JOBSTORE_FAILED. */
static inline int seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return KD_JOBSTORE_FAILED;
}

/* Said in err when a write failed because the disk holding the store is full, so that the person
 * reading it knows what to free; callers tell such a failure by its code, KD_JOBSTORE_FULL. */
#define KD_JOBSTORE_FULL_TEXT "no space left on the disk holding the job store"

static inline bool no_space_errno(int e)
{
    return e == ENOSPC || e == EDQUOT || e == EFBIG;
}

/* Whether the last failed system call on one of the store's files, the write-ahead log (where a
 * transaction's pages are written, at COMMIT) or the database, ran out of space. SQLite keeps an
 * errno per file, and sqlite3_system_errno() only for some failures (one at COMMIT leaves it as
 * it was), so all three are asked. An errno stays after later calls succeed, so ask only about
 * an I/O error just reported: the file that failed holds its errno, and the other one at worst
 * an earlier lack of space, which then names an I/O error on the same disk full (507, not 500). */
static inline bool store_files_out_of_space(sqlite3 *db)
{
    int wal_errno = 0, db_errno = 0;
    sqlite3_file *wal = NULL;
    if (sqlite3_file_control(db, "main", SQLITE_FCNTL_JOURNAL_POINTER, &wal) == SQLITE_OK && wal && wal->pMethods)
        wal->pMethods->xFileControl(wal, SQLITE_FCNTL_LAST_ERRNO, &wal_errno);
    sqlite3_file_control(db, "main", SQLITE_FCNTL_LAST_ERRNO, &db_errno);
    return no_space_errno(sqlite3_system_errno(db)) || no_space_errno(wal_errno) || no_space_errno(db_errno);
}

/* The last statement failed for want of disk space: SQLite says SQLITE_FULL when a write comes
 * up short (ENOSPC included), but an fsync or a truncate that hits ENOSPC (or a quota), and a
 * write past the process's file size limit (RLIMIT_FSIZE: EFBIG), are reported as I/O errors
 * whose errno tells. All are the same to the store: nothing more fits until room is made. */
static inline bool store_full(sqlite3 *db)
{
    int code = sqlite3_errcode(db);
    return code == SQLITE_FULL || ((code & 0xff) == SQLITE_IOERR && store_files_out_of_space(db));
}

/* what's failure with SQLite's message (msg, or the connection's): KD_JOBSTORE_FULL, its message
 * saying so, when the disk ran out of space; else KD_JOBSTORE_FAILED. */
static inline int fail_with(sqlite3 *db, const char *what, const char *msg, char *err, size_t errlen)
{
    if (!db)
        return seterr(err, errlen, "%s: out of memory", what);
    if (store_full(db)) {
        seterr(err, errlen, "%s: %s (%s); nothing was written, and writes work again once space is freed", what,
               KD_JOBSTORE_FULL_TEXT, msg ? msg : sqlite3_errmsg(db));
        return KD_JOBSTORE_FULL;
    }
    return seterr(err, errlen, "%s: %s", what, msg ? msg : sqlite3_errmsg(db));
}

static inline int fail(sqlite3 *db, const char *what, char *err, size_t errlen)
{
    return fail_with(db, what, NULL, err, errlen);
}

/* 0, or the code of fail_with. */
static inline int exec(sqlite3 *db, const char *sql, const char *what, char *err, size_t errlen)
{
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) == SQLITE_OK)
        return 0;
    int rc = fail_with(db, what, msg, err, errlen);
    sqlite3_free(msg);
    return rc;
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

/* Commit when rc is 0, else roll back; returns rc, or the code of a commit that failed. */
static inline int finish(struct kd_jobstore *js, int rc, const char *what, char *err, size_t errlen)
{
    if (rc == 0 && (rc = exec(js->db, "COMMIT", what, err, errlen)) == 0)
        return 0;
    sqlite3_exec(js->db, "ROLLBACK", NULL, NULL, NULL);
    return rc;
}

/* The statement sql into *st: 0, or the code of fail with *st NULL. Preparing reads the schema,
 * which may first rebuild the WAL index after a crash (a write), so a full disk can fail it too. */
static inline int prepare(struct kd_jobstore *js, const char *sql, const char *what, sqlite3_stmt **st, char *err,
                          size_t errlen)
{
    if (sqlite3_prepare_v2(js->db, sql, -1, st, NULL) == SQLITE_OK)
        return 0;
    *st = NULL;
    return fail(js->db, what, err, errlen);
}

/* Step a statement that returns no rows, and finalize it; 0 or the code of fail. */
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

/* A job's state read inside the current transaction into state: 0, KD_JOBSTORE_NOT_FOUND or a
 * negative code. */
int kd_js_current_state(struct kd_jobstore *js, int64_t id, char *state, size_t len, char *err, size_t errlen);
/* The insert of kd_jobstore_event_append (its seq into *seq when not NULL), inside a transaction the
 * caller holds. */
int kd_js_append_event_in(struct kd_jobstore *js, int64_t job_id, const char *type, const char *payload,
                          int64_t *seq, char *err, size_t errlen);

#endif /* KD_CATALOG_JOBSTORE_IMPL_H */
