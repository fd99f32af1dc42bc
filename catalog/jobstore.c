/*
 * catalog/jobstore.c — kilnd's kiln.db: opening, migrating its schema, and the job API.
 *
 * Migrations are an append-only list of SQL scripts: script i brings the schema from version i
 * to i + 1. Never edit a released script; add a new one. Each runs in an IMMEDIATE transaction
 * together with its schema_version update, so a crash leaves the file at one version or the next.
 *
 * Every write is one IMMEDIATE transaction (taking the write lock up front, so a busy store
 * waits in busy_timeout instead of failing half-way). WAL with synchronous=NORMAL: a process
 * crash loses nothing that was committed; a power cut may lose the last commits but never
 * corrupts the file. Reads use the same connection (one thread per store).
 */
#include <math.h>
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

static const char *const migrations[] = {
    /* 1: a place for facts about the store itself. Jobs tables arrive with the jobs API. */
    "CREATE TABLE kiln_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "INSERT INTO kiln_meta (key, value) VALUES ('created_at', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));",
    /* 2: jobs, their events and metrics, the checkpoint index, the model registry. Times are
     * Unix milliseconds; JSON columns are checked with json_valid so bad text never lands. */
    "CREATE TABLE jobs ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  spec TEXT NOT NULL CHECK (json_valid(spec)),"
    "  state TEXT NOT NULL CHECK (state IN ('queued','running','succeeded','failed','cancelled')),"
    "  owner TEXT NOT NULL DEFAULT '',"
    "  error TEXT,"
    "  progress REAL NOT NULL DEFAULT 0,"
    "  created_ms INTEGER NOT NULL,"
    "  started_ms INTEGER,"
    "  finished_ms INTEGER);"
    "CREATE INDEX jobs_by_state ON jobs (state, id);"
    "CREATE TABLE job_events ("
    "  job_id INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,"
    "  seq INTEGER NOT NULL,"
    "  time_ms INTEGER NOT NULL,"
    "  type TEXT NOT NULL,"
    "  payload TEXT NOT NULL CHECK (json_valid(payload)),"
    "  PRIMARY KEY (job_id, seq)) WITHOUT ROWID;"
    "CREATE TABLE job_metrics ("
    "  job_id INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,"
    "  step INTEGER NOT NULL,"
    "  epoch INTEGER NOT NULL,"
    "  name TEXT NOT NULL,"
    "  value REAL NOT NULL);"
    "CREATE INDEX job_metrics_by_job ON job_metrics (job_id, name, step);"
    "CREATE TABLE checkpoints ("
    "  id INTEGER PRIMARY KEY,"
    "  job_id INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,"
    "  path TEXT NOT NULL UNIQUE,"
    "  step INTEGER NOT NULL,"
    "  metric REAL,"
    "  created_ms INTEGER NOT NULL);"
    "CREATE INDEX checkpoints_by_job ON checkpoints (job_id, step);"
    "CREATE TABLE model_registry ("
    "  name TEXT NOT NULL,"
    "  version INTEGER NOT NULL CHECK (version > 0),"
    "  source_job INTEGER REFERENCES jobs (id) ON DELETE SET NULL,"
    "  metrics TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(metrics)),"
    "  created_ms INTEGER NOT NULL,"
    "  PRIMARY KEY (name, version));",
    /* 3: a cancel the user asked for is kept with the job (Unix ms), so that it outlives the
     * process: a job asked to stop ends cancelled after a restart rather than resuming. */
    "ALTER TABLE jobs ADD COLUMN cancel_requested_ms INTEGER;",
};

int kd_jobstore_latest_version(void)
{
    return (int)(sizeof migrations / sizeof migrations[0]);
}

static int seterr(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int fail(sqlite3 *db, const char *what, char *err, size_t errlen)
{
    return seterr(err, errlen, "%s: %s", what, db ? sqlite3_errmsg(db) : "out of memory");
}

static int exec(sqlite3 *db, const char *sql, const char *what, char *err, size_t errlen)
{
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) == SQLITE_OK)
        return 0;
    seterr(err, errlen, "%s: %s", what, msg ? msg : sqlite3_errmsg(db));
    sqlite3_free(msg);
    return -1;
}

static int read_version(sqlite3 *db, int *version, char *err, size_t errlen)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "SELECT coalesce(max(version), 0) FROM schema_version", -1, &st, NULL) != SQLITE_OK)
        return fail(db, "reading schema_version", err, errlen);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        *version = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return rc == SQLITE_ROW ? 0 : fail(db, "reading schema_version", err, errlen);
}

static int migrate(struct kd_jobstore *js, char *err, size_t errlen)
{
    sqlite3 *db = js->db;
    if (exec(db, "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)", "creating schema_version",
             err, errlen) != 0)
        return -1;
    if (read_version(db, &js->version, err, errlen) != 0)
        return -1;
    int latest = kd_jobstore_latest_version();
    if (js->version > latest) {
        snprintf(err, errlen, "schema version %d is newer than this build supports (%d)", js->version, latest);
        return -1;
    }
    for (int v = js->version; v < latest; v++) {
        char step[64], bump[96];
        snprintf(step, sizeof step, "migration to schema version %d", v + 1);
        snprintf(bump, sizeof bump, "DELETE FROM schema_version; INSERT INTO schema_version VALUES (%d);", v + 1);
        if (exec(db, "BEGIN IMMEDIATE", step, err, errlen) != 0)
            return -1;
        if (exec(db, migrations[v], step, err, errlen) != 0 || exec(db, bump, step, err, errlen) != 0 ||
            exec(db, "COMMIT", step, err, errlen) != 0) {
            sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
            return -1;
        }
        js->version = v + 1;
    }
    return 0;
}

int kd_jobstore_open(struct kd_jobstore **out, const char *path, char *err, size_t errlen)
{
    *out = NULL;
    struct kd_jobstore *js = calloc(1, sizeof *js);
    if (!js) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int rc = sqlite3_open_v2(path, &js->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                             NULL);
    if (rc != SQLITE_OK) {
        char what[256];
        snprintf(what, sizeof what, "opening %s", path);
        fail(js->db, what, err, errlen);
        goto error;
    }
    sqlite3_busy_timeout(js->db, 5000);

    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(js->db, "PRAGMA journal_mode=WAL", -1, &st, NULL) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW) {
        sqlite3_finalize(st);
        fail(js->db, "enabling WAL", err, errlen);
        goto error;
    }
    const char *mode = (const char *)sqlite3_column_text(st, 0);
    bool wal = mode && strcmp(mode, "wal") == 0;
    sqlite3_finalize(st);
    if (!wal) {
        snprintf(err, errlen, "enabling WAL: the file system refused write-ahead logging for %s", path);
        goto error;
    }
    if (exec(js->db, "PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON", "setting pragmas", err, errlen) != 0)
        goto error;
    if (migrate(js, err, errlen) != 0)
        goto error;
    *out = js;
    return 0;

error:
    kd_jobstore_close(js);
    return -1;
}

int kd_jobstore_schema_version(const struct kd_jobstore *js)
{
    return js->version;
}

void kd_jobstore_close(struct kd_jobstore *js)
{
    if (!js)
        return;
    sqlite3_close(js->db);
    free(js);
}

/* ------------------------------------------------------------------------ the job API */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int begin(struct kd_jobstore *js, const char *what, char *err, size_t errlen)
{
    return exec(js->db, "BEGIN IMMEDIATE", what, err, errlen);
}

/* Commit when rc is 0, else roll back; returns rc (or -1 when the commit fails). */
static int finish(struct kd_jobstore *js, int rc, const char *what, char *err, size_t errlen)
{
    if (rc == 0 && exec(js->db, "COMMIT", what, err, errlen) == 0)
        return 0;
    sqlite3_exec(js->db, "ROLLBACK", NULL, NULL, NULL);
    return rc != 0 ? rc : -1;
}

static sqlite3_stmt *prepare(struct kd_jobstore *js, const char *sql, const char *what, char *err, size_t errlen)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(js->db, sql, -1, &st, NULL) != SQLITE_OK) {
        fail(js->db, what, err, errlen);
        return NULL;
    }
    return st;
}

/* Step a statement that returns no rows; 0 or -1. */
static int run(struct kd_jobstore *js, sqlite3_stmt *st, const char *what, char *err, size_t errlen)
{
    int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : fail(js->db, what, err, errlen);
    sqlite3_finalize(st);
    return rc;
}

static bool valid_state(const char *s)
{
    static const char *const states[] = {KD_JOB_QUEUED, KD_JOB_RUNNING, KD_JOB_SUCCEEDED, KD_JOB_FAILED,
                                         KD_JOB_CANCELLED};
    for (size_t i = 0; s && i < sizeof states / sizeof states[0]; i++)
        if (strcmp(s, states[i]) == 0)
            return true;
    return false;
}

static bool final_state(const char *s)
{
    return strcmp(s, KD_JOB_SUCCEEDED) == 0 || strcmp(s, KD_JOB_FAILED) == 0 || strcmp(s, KD_JOB_CANCELLED) == 0;
}

static char *col_dup(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? strdup((const char *)t) : NULL;
}

int kd_jobstore_job_create(struct kd_jobstore *js, const char *spec, const char *owner, int64_t *id, char *err,
                           size_t errlen)
{
    if (!js || !spec || !id)
        return seterr(err, errlen, "job create: invalid arguments");
    if (begin(js, "job create", err, errlen) != 0)
        return -1;
    sqlite3_stmt *st = prepare(js, "INSERT INTO jobs (spec, state, owner, created_ms) VALUES (?, 'queued', ?, ?)",
                               "job create", err, errlen);
    int rc = -1;
    if (st) {
        sqlite3_bind_text(st, 1, spec, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 2, owner ? owner : "", -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 3, now_ms());
        int s = sqlite3_step(st);
        if (s == SQLITE_DONE) {
            *id = sqlite3_last_insert_rowid(js->db);
            rc = 0;
        } else if (s == SQLITE_CONSTRAINT) {
            seterr(err, errlen, "job create: the spec is not valid JSON");
        } else {
            fail(js->db, "job create", err, errlen);
        }
        sqlite3_finalize(st);
    }
    return finish(js, rc, "job create", err, errlen);
}

#define JOB_COLUMNS                                                                                               \
    "id, spec, state, owner, error, progress, created_ms, started_ms, finished_ms, cancel_requested_ms"

static int job_from_row(sqlite3_stmt *st, struct kd_job *j)
{
    memset(j, 0, sizeof *j);
    j->id = sqlite3_column_int64(st, 0);
    j->spec = col_dup(st, 1);
    j->state = col_dup(st, 2);
    j->owner = col_dup(st, 3);
    j->error = col_dup(st, 4);
    j->progress = sqlite3_column_double(st, 5);
    j->created_ms = sqlite3_column_int64(st, 6);
    j->started_ms = sqlite3_column_int64(st, 7);
    j->finished_ms = sqlite3_column_int64(st, 8);
    j->cancel_requested_ms = sqlite3_column_int64(st, 9);
    if (!j->spec || !j->state || !j->owner) {
        kd_jobstore_job_clear(j);
        return -1;
    }
    return 0;
}

void kd_jobstore_job_clear(struct kd_job *j)
{
    if (!j)
        return;
    free(j->spec);
    free(j->state);
    free(j->owner);
    free(j->error);
    memset(j, 0, sizeof *j);
}

void kd_jobstore_job_list_free(struct kd_job *jobs, int n)
{
    for (int i = 0; jobs && i < n; i++)
        kd_jobstore_job_clear(&jobs[i]);
    free(jobs);
}

int kd_jobstore_job_get(struct kd_jobstore *js, int64_t id, struct kd_job *out, char *err, size_t errlen)
{
    if (!js || !out)
        return seterr(err, errlen, "job get: invalid arguments");
    memset(out, 0, sizeof *out);
    sqlite3_stmt *st = prepare(js, "SELECT " JOB_COLUMNS " FROM jobs WHERE id = ?", "job get", err, errlen);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, id);
    int s = sqlite3_step(st), rc;
    if (s == SQLITE_ROW)
        rc = job_from_row(st, out) == 0 ? 0 : seterr(err, errlen, "job get: out of memory");
    else if (s == SQLITE_DONE)
        rc = (seterr(err, errlen, "job %lld not found", (long long)id), KD_JOBSTORE_NOT_FOUND);
    else
        rc = fail(js->db, "job get", err, errlen);
    sqlite3_finalize(st);
    return rc;
}

int kd_jobstore_job_list(struct kd_jobstore *js, const char *state, int64_t after_id, int limit,
                         struct kd_job **out, int *n, char *err, size_t errlen)
{
    if (!js || !out || !n || limit < 1 || limit > 10000 || (state && !valid_state(state)))
        return seterr(err, errlen, "job list: invalid arguments (limit 1..10000, a known state)");
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st = prepare(js,
                               "SELECT " JOB_COLUMNS " FROM jobs WHERE id > ?1 AND (?2 IS NULL OR state = ?2) "
                               "ORDER BY id LIMIT ?3",
                               "job list", err, errlen);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, after_id);
    if (state)
        sqlite3_bind_text(st, 2, state, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, 3, limit);
    struct kd_job *jobs = calloc((size_t)limit, sizeof *jobs);
    int count = 0, rc = jobs ? 0 : seterr(err, errlen, "job list: out of memory"), s = SQLITE_DONE;
    while (rc == 0 && (s = sqlite3_step(st)) == SQLITE_ROW) {
        if (job_from_row(st, &jobs[count]) != 0)
            rc = seterr(err, errlen, "job list: out of memory");
        else
            count++;
    }
    if (rc == 0 && s != SQLITE_DONE)
        rc = fail(js->db, "job list", err, errlen);
    sqlite3_finalize(st);
    if (rc != 0) {
        kd_jobstore_job_list_free(jobs, count);
        return rc;
    }
    *out = jobs;
    *n = count;
    return 0;
}

/* Read a job's state inside the current transaction: 0, NOT_FOUND or -1. */
static int current_state(struct kd_jobstore *js, int64_t id, char *state, size_t len, char *err, size_t errlen)
{
    sqlite3_stmt *st = prepare(js, "SELECT state FROM jobs WHERE id = ?", "job state", err, errlen);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, id);
    int s = sqlite3_step(st), rc;
    if (s == SQLITE_ROW) {
        snprintf(state, len, "%s", (const char *)sqlite3_column_text(st, 0));
        rc = 0;
    } else if (s == SQLITE_DONE) {
        rc = (seterr(err, errlen, "job %lld not found", (long long)id), KD_JOBSTORE_NOT_FOUND);
    } else {
        rc = fail(js->db, "job state", err, errlen);
    }
    sqlite3_finalize(st);
    return rc;
}

/* The state change of kd_jobstore_job_set_state, inside a transaction the caller holds. */
static int set_state_in(struct kd_jobstore *js, int64_t id, const char *state, const char *error, char *err,
                        size_t errlen)
{
    char cur[32];
    int rc = current_state(js, id, cur, sizeof cur, err, errlen);
    if (rc == 0 && final_state(cur) && strcmp(cur, state) != 0)
        rc = seterr(err, errlen, "job %lld is %s, which is final: cannot become %s", (long long)id, cur, state);
    if (rc == 0 && strcmp(state, KD_JOB_QUEUED) == 0 && strcmp(cur, KD_JOB_QUEUED) != 0)
        rc = seterr(err, errlen, "job %lld is %s: cannot go back to queued", (long long)id, cur);
    if (rc == 0) {
        sqlite3_stmt *st = prepare(
            js,
            "UPDATE jobs SET state = ?2, error = ?3, "
            "started_ms = CASE WHEN ?2 = 'running' AND started_ms IS NULL THEN ?4 "
            "ELSE started_ms END, "
            "finished_ms = CASE WHEN ?5 AND finished_ms IS NULL THEN ?4 ELSE finished_ms END, "
            "progress = CASE WHEN ?2 = 'succeeded' THEN 1 ELSE progress END "
            "WHERE id = ?1",
            "job set state", err, errlen);
        if (!st)
            rc = -1;
        else {
            sqlite3_bind_int64(st, 1, id);
            sqlite3_bind_text(st, 2, state, -1, SQLITE_TRANSIENT);
            if (error)
                sqlite3_bind_text(st, 3, error, -1, SQLITE_TRANSIENT);
            sqlite3_bind_int64(st, 4, now_ms());
            sqlite3_bind_int(st, 5, final_state(state));
            rc = run(js, st, "job set state", err, errlen);
        }
    }
    return rc;
}

static int check_state_arg(const struct kd_jobstore *js, int64_t id, const char *state, char *err, size_t errlen)
{
    /* NULL is answered on its own so the compiler can see state is non-NULL below */
    if (!state)
        return seterr(err, errlen, "job %lld: no state given", (long long)id);
    if (!js || !valid_state(state))
        return seterr(err, errlen, "job %lld: unknown state '%s'", (long long)id, state);
    return 0;
}

int kd_jobstore_job_set_state(struct kd_jobstore *js, int64_t id, const char *state, const char *error, char *err,
                              size_t errlen)
{
    if (check_state_arg(js, id, state, err, errlen) != 0 || begin(js, "job set state", err, errlen) != 0)
        return -1;
    return finish(js, set_state_in(js, id, state, error, err, errlen), "job set state", err, errlen);
}

int kd_jobstore_job_requeue(struct kd_jobstore *js, int64_t id, char *err, size_t errlen)
{
    if (!js)
        return seterr(err, errlen, "job %lld: no store", (long long)id);
    /* Only a running job goes back: the process that ran it is gone, and its checkpoints say
     * where to continue. started_ms keeps the first start. */
    sqlite3_stmt *st = prepare(js, "UPDATE jobs SET state = 'queued' WHERE id = ? AND state = 'running'",
                               "job requeue", err, errlen);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, id);
    int rc = run(js, st, "job requeue", err, errlen);
    if (rc == 0 && sqlite3_changes(js->db) == 0)
        rc = (seterr(err, errlen, "job %lld is not running", (long long)id), KD_JOBSTORE_NOT_FOUND);
    return rc;
}

int kd_jobstore_job_set_progress(struct kd_jobstore *js, int64_t id, double progress, char *err, size_t errlen)
{
    if (!js || !(progress >= 0.0 && progress <= 1.0))
        return seterr(err, errlen, "job %lld: progress must be within 0..1", (long long)id);
    sqlite3_stmt *st = prepare(js, "UPDATE jobs SET progress = ? WHERE id = ?", "job progress", err, errlen);
    if (!st)
        return -1;
    sqlite3_bind_double(st, 1, progress);
    sqlite3_bind_int64(st, 2, id);
    /* A single statement is its own transaction. */
    int rc = run(js, st, "job progress", err, errlen);
    if (rc == 0 && sqlite3_changes(js->db) == 0)
        rc = (seterr(err, errlen, "job %lld not found", (long long)id), KD_JOBSTORE_NOT_FOUND);
    return rc;
}

/* The insert of kd_jobstore_event_append, inside a transaction the caller holds. */
static int append_event_in(struct kd_jobstore *js, int64_t job_id, const char *type, const char *payload,
                           int64_t *seq, char *err, size_t errlen)
{
    char cur[32];
    int rc = current_state(js, job_id, cur, sizeof cur, err, errlen);
    sqlite3_stmt *st = NULL;
    if (rc == 0)
        st = prepare(js,
                     "INSERT INTO job_events (job_id, seq, time_ms, type, payload) "
                     "SELECT ?1, coalesce(max(seq), 0) + 1, ?2, ?3, ?4 FROM job_events WHERE job_id = ?1 "
                     "RETURNING seq",
                     "event append", err, errlen);
    if (rc == 0 && !st)
        rc = -1;
    if (rc == 0) {
        sqlite3_bind_int64(st, 1, job_id);
        sqlite3_bind_int64(st, 2, now_ms());
        sqlite3_bind_text(st, 3, type, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 4, payload ? payload : "{}", -1, SQLITE_TRANSIENT);
        int s = sqlite3_step(st);
        if (s == SQLITE_ROW) {
            if (seq)
                *seq = sqlite3_column_int64(st, 0);
            s = sqlite3_step(st);
        }
        if (s == SQLITE_CONSTRAINT)
            rc = seterr(err, errlen, "event append: the payload is not valid JSON");
        else if (s != SQLITE_DONE)
            rc = fail(js->db, "event append", err, errlen);
    }
    sqlite3_finalize(st);
    return rc;
}

int kd_jobstore_event_append(struct kd_jobstore *js, int64_t job_id, const char *type, const char *payload,
                             int64_t *seq, char *err, size_t errlen)
{
    if (!js || !type || !type[0])
        return seterr(err, errlen, "event append: invalid arguments");
    if (begin(js, "event append", err, errlen) != 0)
        return -1;
    return finish(js, append_event_in(js, job_id, type, payload, seq, err, errlen), "event append", err, errlen);
}

int kd_jobstore_job_transition(struct kd_jobstore *js, int64_t id, const char *state, const char *error,
                               const char *payload, int64_t *seq, char *err, size_t errlen)
{
    return kd_jobstore_job_transition_from(js, id, NULL, state, error, payload, seq, err, errlen);
}

int kd_jobstore_job_transition_from(struct kd_jobstore *js, int64_t id, const char *from, const char *state,
                                    const char *error, const char *payload, int64_t *seq, char *err, size_t errlen)
{
    if (check_state_arg(js, id, state, err, errlen) != 0 || begin(js, "job transition", err, errlen) != 0)
        return -1;
    char cur[32];
    int rc = from ? current_state(js, id, cur, sizeof cur, err, errlen) : 0;
    if (rc == 0 && from && strcmp(cur, from) != 0)
        rc = seterr(err, errlen, "job %lld is %s, not %s", (long long)id, cur, from);
    if (rc == 0)
        rc = set_state_in(js, id, state, error, err, errlen);
    if (rc == 0)
        rc = append_event_in(js, id, "state", payload, seq, err, errlen);
    return finish(js, rc, "job transition", err, errlen);
}

int kd_jobstore_job_request_cancel(struct kd_jobstore *js, int64_t id, char *err, size_t errlen)
{
    if (!js || begin(js, "job cancel request", err, errlen) != 0)
        return js ? -1 : seterr(err, errlen, "job %lld: no store", (long long)id);
    char cur[32];
    int rc = current_state(js, id, cur, sizeof cur, err, errlen);
    if (rc == 0 && final_state(cur))
        rc = seterr(err, errlen, "job %lld is %s, which is final: it cannot be cancelled", (long long)id, cur);
    /* The first request's time is kept: a second DELETE changes nothing. */
    sqlite3_stmt *st = rc == 0 ? prepare(js,
                                         "UPDATE jobs SET cancel_requested_ms = coalesce(cancel_requested_ms, ?2) "
                                         "WHERE id = ?1",
                                         "job cancel request", err, errlen)
                               : NULL;
    if (rc == 0 && !st)
        rc = -1;
    if (rc == 0) {
        sqlite3_bind_int64(st, 1, id);
        sqlite3_bind_int64(st, 2, now_ms());
        rc = run(js, st, "job cancel request", err, errlen);
    }
    return finish(js, rc, "job cancel request", err, errlen);
}

int kd_jobstore_job_continuations(struct kd_jobstore *js, int64_t id, int64_t *ids, int max, int *n, char *err,
                                  size_t errlen)
{
    if (!js || !ids || !n || max < 1)
        return seterr(err, errlen, "job continuations: invalid arguments");
    *n = 0;
    sqlite3_stmt *st = prepare(js,
                               "SELECT id FROM jobs WHERE state IN ('queued', 'running') "
                               "AND json_extract(spec, '$.resume_from_job') = ?1 ORDER BY id LIMIT ?2",
                               "job continuations", err, errlen);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int(st, 2, max);
    int s;
    while ((s = sqlite3_step(st)) == SQLITE_ROW)
        ids[(*n)++] = sqlite3_column_int64(st, 0);
    int rc = s == SQLITE_DONE ? 0 : fail(js->db, "job continuations", err, errlen);
    sqlite3_finalize(st);
    return rc;
}

/* The position a prune keeps: ?1 job, ?2 step, ?3 epoch, ?4 the id of the event that recorded
 * the checkpoint (0: not recorded), ?5 the log event's id. */
struct prune_at {
    int64_t id, step, epoch, cut, seq;
};

/* One statement of the prune below (binding a parameter a statement lacks does nothing); the
 * first column of its row into *value when given. 0 or -1. */
static int prune_step(struct kd_jobstore *js, const char *sql, const struct prune_at *at, int64_t *value,
                      char *err, size_t errlen)
{
    sqlite3_stmt *st = prepare(js, sql, "events prune", err, errlen);
    if (!st)
        return -1;
    const int64_t params[] = {at->id, at->step, at->epoch, at->cut, at->seq};
    for (int i = 0; i < 5; i++)
        sqlite3_bind_int64(st, i + 1, params[i]);
    int s = sqlite3_step(st);
    if (value && s == SQLITE_ROW)
        *value = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return s == SQLITE_DONE || (value && s == SQLITE_ROW) ? 0 : fail(js->db, "events prune", err, errlen);
}

/* What came after the checkpoint: the events recorded after the checkpoint's own event (an epoch's
 * event follows its checkpoint's, so epochs are also compared), or without that event, by step. */
#define PRUNED_EVENTS                                                                                             \
    "FROM job_events WHERE job_id = ?1 AND ("                                                                     \
    "(type = 'epoch' AND json_extract(payload, '$.epoch') > ?3 AND seq > ?4) OR "                                 \
    "(type IN ('step', 'checkpoint') AND CASE WHEN ?4 > 0 THEN seq > ?4 "                                         \
    "ELSE json_extract(payload, '$.step') > ?2 END))"

int kd_jobstore_events_prune_after(struct kd_jobstore *js, int64_t id, int64_t step, int64_t epoch,
                                   const char *log_payload, int64_t *removed, char *err, size_t errlen)
{
    if (removed)
        *removed = 0;
    if (!js || step < 0 || epoch < 0 || begin(js, "events prune", err, errlen) != 0)
        return js && step >= 0 && epoch >= 0 ? -1 : seterr(err, errlen, "events prune: invalid arguments");
    char cur[32];
    struct prune_at at = {id, step, epoch, 0, 0};
    int64_t count = 0;
    int rc = current_state(js, id, cur, sizeof cur, err, errlen);
    if (rc == 0 && step > 0)
        rc = prune_step(js,
                        "SELECT coalesce(max(seq), 0) FROM job_events WHERE job_id = ?1 AND type = 'checkpoint' "
                        "AND json_extract(payload, '$.step') = ?2",
                        &at, &at.cut, err, errlen);
    if (rc == 0)
        rc = prune_step(js, "SELECT count(*) " PRUNED_EVENTS, &at, &count, err, errlen);
    /* The log event goes in first: the job's newest event id stays above every one removed. */
    if (rc == 0 && count > 0)
        rc = append_event_in(js, id, "log", log_payload, &at.seq, err, errlen);
    if (rc == 0 && count > 0)
        rc = prune_step(js, "DELETE " PRUNED_EVENTS " AND seq < ?5", &at, NULL, err, errlen);
    if (rc == 0)
        rc = prune_step(js, "DELETE FROM job_metrics WHERE job_id = ?1 AND step > ?2", &at, NULL, err, errlen);
    if (rc == 0)
        rc = prune_step(js, "DELETE FROM checkpoints WHERE job_id = ?1 AND step > ?2", &at, NULL, err, errlen);
    rc = finish(js, rc, "events prune", err, errlen);
    if (rc == 0 && removed)
        *removed = count;
    return rc;
}

void kd_jobstore_events_free(struct kd_job_event *events, int n)
{
    for (int i = 0; events && i < n; i++) {
        free(events[i].type);
        free(events[i].payload);
    }
    free(events);
}

int kd_jobstore_events_since(struct kd_jobstore *js, int64_t job_id, int64_t after_seq, int limit,
                             struct kd_job_event **out, int *n, char *err, size_t errlen)
{
    if (!js || !out || !n || limit < 1 || limit > 10000)
        return seterr(err, errlen, "events since: invalid arguments (limit 1..10000)");
    *out = NULL;
    *n = 0;
    sqlite3_stmt *st = prepare(js,
                               "SELECT job_id, seq, time_ms, type, payload FROM job_events "
                               "WHERE job_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                               "events since", err, errlen);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, job_id);
    sqlite3_bind_int64(st, 2, after_seq);
    sqlite3_bind_int(st, 3, limit);
    struct kd_job_event *ev = calloc((size_t)limit, sizeof *ev);
    int count = 0, rc = ev ? 0 : seterr(err, errlen, "events since: out of memory"), s = SQLITE_DONE;
    while (rc == 0 && (s = sqlite3_step(st)) == SQLITE_ROW) {
        struct kd_job_event *e = &ev[count++];
        e->job_id = sqlite3_column_int64(st, 0);
        e->seq = sqlite3_column_int64(st, 1);
        e->time_ms = sqlite3_column_int64(st, 2);
        e->type = col_dup(st, 3);
        e->payload = col_dup(st, 4);
        if (!e->type || !e->payload)
            rc = seterr(err, errlen, "events since: out of memory");
    }
    if (rc == 0 && s != SQLITE_DONE)
        rc = fail(js->db, "events since", err, errlen);
    sqlite3_finalize(st);
    if (rc != 0) {
        kd_jobstore_events_free(ev, count);
        return rc;
    }
    *out = ev;
    *n = count;
    return 0;
}

int kd_jobstore_metrics_append(struct kd_jobstore *js, int64_t job_id, int n, const struct kd_job_metric *m,
                               char *err, size_t errlen)
{
    if (!js || n < 0 || (n > 0 && !m))
        return seterr(err, errlen, "metrics append: invalid arguments");
    for (int i = 0; i < n; i++)
        if (!m[i].name || !m[i].name[0] || !isfinite(m[i].value))
            return seterr(err, errlen, "metrics append: point %d needs a name and a finite value", i);
    if (begin(js, "metrics append", err, errlen) != 0)
        return -1;
    char cur[32];
    int rc = current_state(js, job_id, cur, sizeof cur, err, errlen);
    sqlite3_stmt *st = rc == 0 ? prepare(js,
                                         "INSERT INTO job_metrics (job_id, step, epoch, name, value) "
                                         "VALUES (?, ?, ?, ?, ?)",
                                         "metrics append", err, errlen)
                               : NULL;
    if (rc == 0 && !st)
        rc = -1;
    for (int i = 0; rc == 0 && i < n; i++) {
        sqlite3_reset(st);
        sqlite3_bind_int64(st, 1, job_id);
        sqlite3_bind_int64(st, 2, m[i].step);
        sqlite3_bind_int64(st, 3, m[i].epoch);
        sqlite3_bind_text(st, 4, m[i].name, -1, SQLITE_TRANSIENT);
        sqlite3_bind_double(st, 5, m[i].value);
        if (sqlite3_step(st) != SQLITE_DONE)
            rc = fail(js->db, "metrics append", err, errlen);
    }
    sqlite3_finalize(st);
    return finish(js, rc, "metrics append", err, errlen);
}

int kd_jobstore_checkpoint_add(struct kd_jobstore *js, int64_t job_id, const char *path, int64_t step,
                               double metric, char *err, size_t errlen)
{
    if (!js || !path || !path[0] || step < 0)
        return seterr(err, errlen, "checkpoint add: invalid arguments");
    sqlite3_stmt *st = prepare(js,
                               "INSERT INTO checkpoints (job_id, path, step, metric, created_ms) "
                               "VALUES (?, ?, ?, ?, ?) ON CONFLICT (path) DO UPDATE SET "
                               "job_id = excluded.job_id, step = excluded.step, metric = excluded.metric, "
                               "created_ms = excluded.created_ms",
                               "checkpoint add", err, errlen);
    if (!st)
        return -1;
    sqlite3_bind_int64(st, 1, job_id);
    sqlite3_bind_text(st, 2, path, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 3, step);
    if (isnan(metric))
        sqlite3_bind_null(st, 4);
    else
        sqlite3_bind_double(st, 4, metric);
    sqlite3_bind_int64(st, 5, now_ms());
    return run(js, st, "checkpoint add", err, errlen);
}

/* The registry row; replace: a row already there for (name, version) is replaced, not refused. */
static int model_register_in(struct kd_jobstore *js, const char *name, int64_t version, int64_t source_job,
                             const char *metrics, bool replace, char *err, size_t errlen)
{
    if (!js || !name || !name[0] || version < 1)
        return seterr(err, errlen, "model register: invalid arguments (a name and a version >= 1)");
    sqlite3_stmt *st = prepare(js,
                               replace
                                   ? "INSERT OR REPLACE INTO model_registry (name, version, source_job, metrics, "
                                     "created_ms) VALUES (?, ?, ?, ?, ?)"
                                   : "INSERT INTO model_registry (name, version, source_job, metrics, created_ms) "
                                     "VALUES (?, ?, ?, ?, ?)",
                               "model register", err, errlen);
    if (!st)
        return -1;
    sqlite3_bind_text(st, 1, name, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 2, version);
    if (source_job > 0)
        sqlite3_bind_int64(st, 3, source_job);
    sqlite3_bind_text(st, 4, metrics ? metrics : "{}", -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 5, now_ms());
    return run(js, st, "model register", err, errlen);
}

int kd_jobstore_model_register(struct kd_jobstore *js, const char *name, int64_t version, int64_t source_job,
                               const char *metrics, char *err, size_t errlen)
{
    return model_register_in(js, name, version, source_job, metrics, false, err, errlen);
}

int kd_jobstore_job_succeed_with_model(struct kd_jobstore *js, int64_t id, const char *name, int64_t version,
                                       const char *metrics, const char *model_payload, const char *state_payload,
                                       char *err, size_t errlen)
{
    if (!js || begin(js, "job succeed", err, errlen) != 0)
        return js ? -1 : seterr(err, errlen, "job %lld: no store", (long long)id);
    char cur[32];
    int rc = current_state(js, id, cur, sizeof cur, err, errlen);
    if (rc == 0 && final_state(cur))
        rc = seterr(err, errlen, "job %lld is %s, which is final: it cannot succeed with a model", (long long)id,
                    cur);
    if (rc == 0)
        rc = model_register_in(js, name, version, id, metrics, true, err, errlen);
    if (rc == 0)
        rc = append_event_in(js, id, "model", model_payload, NULL, err, errlen);
    if (rc == 0)
        rc = set_state_in(js, id, KD_JOB_SUCCEEDED, NULL, err, errlen);
    if (rc == 0)
        rc = append_event_in(js, id, "state", state_payload, NULL, err, errlen);
    return finish(js, rc, "job succeed", err, errlen);
}
