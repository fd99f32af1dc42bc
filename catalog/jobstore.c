/*
 * catalog/jobstore.c — kilnd's kiln.db: opening, migrating its schema, and the job API (a job's
 * history is in jobstore-history.c, the removal of ended jobs in jobstore-purge.c).
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
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#include "jobstore-impl.h"

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
    int rc = exec(db, "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
                  "creating schema_version", err, errlen);
    if (rc != 0 || (rc = read_version(db, &js->version, err, errlen)) != 0)
        return rc;
    int latest = kd_jobstore_latest_version();
    if (js->version > latest)
        return seterr(err, errlen, "schema version %d is newer than this build supports (%d)", js->version,
                      latest);
    for (int v = js->version; v < latest; v++) {
        char step[64], bump[96];
        snprintf(step, sizeof step, "migration to schema version %d", v + 1);
        snprintf(bump, sizeof bump, "DELETE FROM schema_version; INSERT INTO schema_version VALUES (%d);", v + 1);
        if ((rc = exec(db, "BEGIN IMMEDIATE", step, err, errlen)) != 0)
            return rc;
        if ((rc = exec(db, migrations[v], step, err, errlen)) != 0 ||
            (rc = exec(db, bump, step, err, errlen)) != 0 || (rc = exec(db, "COMMIT", step, err, errlen)) != 0) {
            sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
            return rc;
        }
        js->version = v + 1;
    }
    return 0;
}

/*
 * A new store's file, made before SQLite opens it so its mode is 0666 less the umask: SQLite
 * would make it 0644 less the umask, and its -wal and -shm files copy the database's mode, so a
 * data folder shared by the users of one group (a container image run under another uid of group
 * 0) could not be written by the next one. An empty file is an empty database to SQLite. An
 * existing file keeps its mode.
 */
static int create_group_writable(const char *path, char *err, size_t errlen)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
        close(fd);
        return 0;
    }
    int e = errno;
    if (e == EEXIST)
        return 0;
    seterr(err, errlen, "creating %s: %s", path, strerror(e));
    return e == ENOSPC || e == EDQUOT ? KD_JOBSTORE_FULL : KD_JOBSTORE_FAILED;
}

/*
 * SQLite opens a database it may not write read-only, without an error, and a -wal or -shm file
 * another user left behind fails only the first write. kilnd would then start, report ready and
 * answer its first job with a 500; refused here instead, naming the file.
 */
static int check_writable(sqlite3 *db, const char *path, char *err, size_t errlen)
{
    if (sqlite3_db_readonly(db, "main") == 1) {
        snprintf(err, errlen,
                 "%s is read-only for uid %u: the job store must be writable by the user kilnd runs as", path,
                 (unsigned)geteuid());
        return -1;
    }
    static const char *const companions[] = {"-wal", "-shm"};
    for (size_t i = 0; i < sizeof companions / sizeof *companions; i++) {
        char p[4096];
        if (snprintf(p, sizeof p, "%s%s", path, companions[i]) >= (int)sizeof p)
            continue;
        if (access(p, F_OK) == 0 && access(p, R_OK | W_OK) != 0) {
            snprintf(err, errlen,
                     "%s is not writable by uid %u (%s): the job store's files must be writable by the user kilnd "
                     "runs as",
                     p, (unsigned)geteuid(), strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* Damage inside the file (a page overwritten, a torn copy) is found now, at start, where it is
 * said once with what to do, rather than by some later request that happens to read the page and
 * fails, or by a job whose steps then cannot be written. quick_check reads every page but skips
 * the index-content cross-check, which keeps it to a fraction of a second for stores of many
 * thousands of jobs. */
static int check_intact(sqlite3 *db, bool *damaged, char *err, size_t errlen)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "PRAGMA quick_check(1)", -1, &st, NULL) != SQLITE_OK)
        return fail(db, "checking the file", err, errlen);
    int s = sqlite3_step(st);
    if (s != SQLITE_ROW) {
        int rc = fail(db, "checking the file", err, errlen);
        sqlite3_finalize(st);
        return rc;
    }
    const char *verdict = (const char *)sqlite3_column_text(st, 0);
    *damaged = !verdict || strcmp(verdict, "ok") != 0;
    char said[200] = "no verdict"; /* SQLite's report, its lines joined so a log line stays one line */
    if (verdict)
        snprintf(said, sizeof said, "%s", verdict);
    for (char *c = said; *c; c++)
        if (*c == '\n')
            *c = ' ';
    int rc = *damaged ? fail_with(db, "checking the file", said, err, errlen) : 0;
    sqlite3_finalize(st);
    return rc;
}

/* err, said of a damaged file or one that is no SQLite database at all, with what to do: the
 * library's words ("file is not a database") name neither the file nor a way out. */
static void say_damaged(const char *path, char *err, size_t errlen)
{
    char was[256];
    snprintf(was, sizeof was, "%s", err);
    seterr(
        err, errlen,
        "%s is damaged or is not kilnd's job store (%s): move it away (with its -wal and -shm files) and kilnd "
        "starts with an empty job store; the jobs it held are lost (their checkpoints stay on disk), models/ is "
        "not touched",
        path, was);
}

/* err for a path that is there but no file (SQLite's words for it are "unable to open database
 * file", or "disk I/O error" read-only). */
static int not_a_file(const char *path, const struct stat *sb, char *err, size_t errlen)
{
    return seterr(err, errlen,
                  "%s is %s, not kilnd's job store file: move it away, and kilnd makes a new job store there",
                  path, S_ISDIR(sb->st_mode) ? "a folder" : "no regular file");
}

/* Whether db's last error says its file is damaged or no SQLite database at all. */
static bool is_damaged(sqlite3 *db)
{
    int primary = db ? sqlite3_errcode(db) & 0xff : SQLITE_OK;
    return primary == SQLITE_NOTADB || primary == SQLITE_CORRUPT;
}

int kd_jobstore_open(struct kd_jobstore **out, const char *path, char *err, size_t errlen)
{
    *out = NULL;
    struct kd_jobstore *js = calloc(1, sizeof *js);
    if (!js)
        return seterr(err, errlen, "out of memory");
    bool damaged = false; /* found by the check, which leaves no damage code behind */
    struct stat sb;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        free(js);
        return not_a_file(path, &sb, err, errlen);
    }
    int rc = create_group_writable(path, err, errlen);
    if (rc != 0)
        goto error;
    if (sqlite3_open_v2(path, &js->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL) !=
        SQLITE_OK) {
        char what[256];
        snprintf(what, sizeof what, "opening %s", path);
        rc = fail(js->db, what, err, errlen);
        goto error;
    }
    if ((rc = check_writable(js->db, path, err, errlen)) != 0)
        goto error;
    sqlite3_busy_timeout(js->db, 5000);

    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(js->db, "PRAGMA journal_mode=WAL", -1, &st, NULL) != SQLITE_OK ||
        sqlite3_step(st) != SQLITE_ROW) {
        rc = fail(js->db, "enabling WAL", err, errlen);
        sqlite3_finalize(st);
        goto error;
    }
    const char *mode = (const char *)sqlite3_column_text(st, 0);
    bool wal = mode && strcmp(mode, "wal") == 0;
    sqlite3_finalize(st);
    if (!wal) {
        rc = seterr(err, errlen, "enabling WAL: the file system refused write-ahead logging for %s", path);
        goto error;
    }
    rc = exec(js->db, "PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON", "setting pragmas", err, errlen);
    if (rc != 0 || (rc = check_intact(js->db, &damaged, err, errlen)) != 0 || (rc = migrate(js, err, errlen)) != 0)
        goto error;
    *out = js;
    return 0;

error:
    if (damaged || is_damaged(js->db))
        say_damaged(path, err, errlen);
    kd_jobstore_close(js);
    return rc;
}

int kd_jobstore_check(const char *path, char *err, size_t errlen)
{
    struct stat sb;
    int stat_rc = stat(path, &sb);
    if (stat_rc != 0 && errno == ENOENT)
        return 0; /* a start makes it */
    if (stat_rc == 0 && !S_ISREG(sb.st_mode))
        return not_a_file(path, &sb, err, errlen);
    /* read-only: a check writes nothing, and may run beside the kilnd that holds the file */
    sqlite3 *db = NULL;
    bool damaged = false;
    int rc = 0, version = 0;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
        char what[256];
        snprintf(what, sizeof what, "opening %s", path);
        rc = fail(db, what, err, errlen);
    } else {
        sqlite3_busy_timeout(db, 5000);
        rc = check_intact(db, &damaged, err, errlen);
    }
    if (rc == 0 && (stat_rc != 0 || sb.st_size > 0) && (rc = read_version(db, &version, err, errlen)) == 0 &&
        version > kd_jobstore_latest_version())
        rc = seterr(err, errlen, "%s: schema version %d is newer than this build supports (%d)", path, version,
                    kd_jobstore_latest_version());
    if (rc != 0 && (damaged || is_damaged(db)))
        say_damaged(path, err, errlen);
    sqlite3_close(db);
    return rc;
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

static bool valid_state(const char *s)
{
    static const char *const states[] = {KD_JOB_QUEUED, KD_JOB_RUNNING, KD_JOB_SUCCEEDED, KD_JOB_FAILED,
                                         KD_JOB_CANCELLED};
    for (size_t i = 0; s && i < sizeof states / sizeof states[0]; i++)
        if (strcmp(s, states[i]) == 0)
            return true;
    return false;
}

int kd_jobstore_job_create(struct kd_jobstore *js, const char *spec, const char *owner, int64_t *id, char *err,
                           size_t errlen)
{
    if (!js || !spec || !id)
        return seterr(err, errlen, "job create: invalid arguments");
    int rc = begin(js, "job create", err, errlen);
    if (rc != 0)
        return rc;
    sqlite3_stmt *st;
    rc = prepare(js, "INSERT INTO jobs (spec, state, owner, created_ms) VALUES (?, 'queued', ?, ?)", "job create",
                 &st, err, errlen);
    if (rc == 0) {
        sqlite3_bind_text(st, 1, spec, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 2, owner ? owner : "", -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 3, now_ms());
        int s = sqlite3_step(st);
        if (s == SQLITE_DONE)
            *id = sqlite3_last_insert_rowid(js->db);
        else if (s == SQLITE_CONSTRAINT)
            rc = seterr(err, errlen, "job create: the spec is not valid JSON");
        else
            rc = fail(js->db, "job create", err, errlen);
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
    sqlite3_stmt *st;
    int rc = prepare(js, "SELECT " JOB_COLUMNS " FROM jobs WHERE id = ?", "job get", &st, err, errlen);
    if (rc != 0)
        return rc;
    sqlite3_bind_int64(st, 1, id);
    int s = sqlite3_step(st);
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
    sqlite3_stmt *st;
    int rc = prepare(js,
                     "SELECT " JOB_COLUMNS " FROM jobs WHERE id > ?1 AND (?2 IS NULL OR state = ?2) "
                     "ORDER BY id LIMIT ?3",
                     "job list", &st, err, errlen);
    if (rc != 0)
        return rc;
    sqlite3_bind_int64(st, 1, after_id);
    if (state)
        sqlite3_bind_text(st, 2, state, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, 3, limit);
    struct kd_job *jobs = calloc((size_t)limit, sizeof *jobs);
    int count = 0, s = SQLITE_DONE;
    rc = jobs ? 0 : seterr(err, errlen, "job list: out of memory");
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

/* Read a job's state inside the current transaction: 0, NOT_FOUND or a negative code. */
int kd_js_current_state(struct kd_jobstore *js, int64_t id, char *state, size_t len, char *err, size_t errlen)
{
    sqlite3_stmt *st;
    int rc = prepare(js, "SELECT state FROM jobs WHERE id = ?", "job state", &st, err, errlen);
    if (rc != 0)
        return rc;
    sqlite3_bind_int64(st, 1, id);
    int s = sqlite3_step(st);
    if (s == SQLITE_ROW) {
        /* NULL only when SQLite ran out of memory converting it: the column is NOT NULL */
        const char *text = (const char *)sqlite3_column_text(st, 0);
        if (text)
            snprintf(state, len, "%s", text);
        else
            rc = seterr(err, errlen, "job state: out of memory");
    } else if (s == SQLITE_DONE) {
        rc = (seterr(err, errlen, "job %lld not found", (long long)id), KD_JOBSTORE_NOT_FOUND);
    } else {
        rc = fail(js->db, "job state", err, errlen);
    }
    sqlite3_finalize(st);
    return rc;
}

/*
 * The state change of kd_jobstore_job_set_state, inside a transaction the caller holds. The state
 * is checked here, where it is used, rather than by each caller: every path below then has a
 * known state, never NULL (the compiler sees that too, even where a sanitizer's check of strcmp's
 * argument adds a path of its own).
 */
static int set_state_in(struct kd_jobstore *js, int64_t id, const char *state, const char *error, char *err,
                        size_t errlen)
{
    if (!state)
        return seterr(err, errlen, "job %lld: no state given", (long long)id);
    if (!valid_state(state))
        return seterr(err, errlen, "job %lld: unknown state '%s'", (long long)id, state);
    char cur[32];
    int rc = kd_js_current_state(js, id, cur, sizeof cur, err, errlen);
    if (rc == 0 && final_state(cur) && strcmp(cur, state) != 0)
        rc = seterr(err, errlen, "job %lld is %s, which is final: cannot become %s", (long long)id, cur, state);
    if (rc == 0 && strcmp(state, KD_JOB_QUEUED) == 0 && strcmp(cur, KD_JOB_QUEUED) != 0)
        rc = seterr(err, errlen, "job %lld is %s: cannot go back to queued", (long long)id, cur);
    sqlite3_stmt *st = NULL;
    if (rc == 0)
        rc = prepare(js,
                     "UPDATE jobs SET state = ?2, error = ?3, "
                     "started_ms = CASE WHEN ?2 = 'running' AND started_ms IS NULL THEN ?4 "
                     "ELSE started_ms END, "
                     "finished_ms = CASE WHEN ?5 AND finished_ms IS NULL THEN ?4 ELSE finished_ms END, "
                     "progress = CASE WHEN ?2 = 'succeeded' THEN 1 ELSE progress END "
                     "WHERE id = ?1",
                     "job set state", &st, err, errlen);
    if (rc == 0) {
        sqlite3_bind_int64(st, 1, id);
        sqlite3_bind_text(st, 2, state, -1, SQLITE_TRANSIENT);
        if (error)
            sqlite3_bind_text(st, 3, error, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(st, 4, now_ms());
        sqlite3_bind_int(st, 5, final_state(state));
        rc = run(js, st, "job set state", err, errlen);
    }
    return rc;
}

int kd_jobstore_job_set_state(struct kd_jobstore *js, int64_t id, const char *state, const char *error, char *err,
                              size_t errlen)
{
    if (!js)
        return seterr(err, errlen, "job %lld: no store", (long long)id);
    int rc = begin(js, "job set state", err, errlen);
    return rc != 0 ? rc
                   : finish(js, set_state_in(js, id, state, error, err, errlen), "job set state", err, errlen);
}

int kd_jobstore_job_requeue(struct kd_jobstore *js, int64_t id, char *err, size_t errlen)
{
    if (!js)
        return seterr(err, errlen, "job %lld: no store", (long long)id);
    /* Only a running job goes back: the process that ran it is gone, and its checkpoints say
     * where to continue. started_ms keeps the first start. */
    sqlite3_stmt *st;
    int rc = prepare(js, "UPDATE jobs SET state = 'queued' WHERE id = ? AND state = 'running'", "job requeue", &st,
                     err, errlen);
    if (rc != 0)
        return rc;
    sqlite3_bind_int64(st, 1, id);
    rc = run(js, st, "job requeue", err, errlen);
    if (rc == 0 && sqlite3_changes(js->db) == 0)
        rc = (seterr(err, errlen, "job %lld is not running", (long long)id), KD_JOBSTORE_NOT_FOUND);
    return rc;
}

int kd_jobstore_job_set_progress(struct kd_jobstore *js, int64_t id, double progress, char *err, size_t errlen)
{
    if (!js || !(progress >= 0.0 && progress <= 1.0))
        return seterr(err, errlen, "job %lld: progress must be within 0..1", (long long)id);
    sqlite3_stmt *st;
    int rc = prepare(js, "UPDATE jobs SET progress = ? WHERE id = ?", "job progress", &st, err, errlen);
    if (rc != 0)
        return rc;
    sqlite3_bind_double(st, 1, progress);
    sqlite3_bind_int64(st, 2, id);
    /* A single statement is its own transaction. */
    rc = run(js, st, "job progress", err, errlen);
    if (rc == 0 && sqlite3_changes(js->db) == 0)
        rc = (seterr(err, errlen, "job %lld not found", (long long)id), KD_JOBSTORE_NOT_FOUND);
    return rc;
}

int kd_jobstore_job_transition(struct kd_jobstore *js, int64_t id, const char *state, const char *error,
                               const char *payload, int64_t *seq, char *err, size_t errlen)
{
    return kd_jobstore_job_transition_from(js, id, NULL, state, error, payload, seq, err, errlen);
}

int kd_jobstore_job_transition_from(struct kd_jobstore *js, int64_t id, const char *from, const char *state,
                                    const char *error, const char *payload, int64_t *seq, char *err, size_t errlen)
{
    if (!js)
        return seterr(err, errlen, "job %lld: no store", (long long)id);
    int rc = begin(js, "job transition", err, errlen);
    if (rc != 0)
        return rc;
    char cur[32];
    if (from)
        rc = kd_js_current_state(js, id, cur, sizeof cur, err, errlen);
    if (rc == 0 && from && strcmp(cur, from) != 0)
        rc = seterr(err, errlen, "job %lld is %s, not %s", (long long)id, cur, from);
    if (rc == 0)
        rc = set_state_in(js, id, state, error, err, errlen);
    if (rc == 0)
        rc = kd_js_append_event_in(js, id, "state", payload, seq, err, errlen);
    return finish(js, rc, "job transition", err, errlen);
}

int kd_jobstore_job_request_cancel(struct kd_jobstore *js, int64_t id, char *err, size_t errlen)
{
    if (!js)
        return seterr(err, errlen, "job %lld: no store", (long long)id);
    int rc = begin(js, "job cancel request", err, errlen);
    if (rc != 0)
        return rc;
    char cur[32];
    rc = kd_js_current_state(js, id, cur, sizeof cur, err, errlen);
    if (rc == 0 && final_state(cur))
        rc = seterr(err, errlen, "job %lld is %s, which is final: it cannot be cancelled", (long long)id, cur);
    /* The first request's time is kept: a second DELETE changes nothing. */
    sqlite3_stmt *st = NULL;
    if (rc == 0)
        rc = prepare(js, "UPDATE jobs SET cancel_requested_ms = coalesce(cancel_requested_ms, ?2) WHERE id = ?1",
                     "job cancel request", &st, err, errlen);
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
    sqlite3_stmt *st;
    int rc = prepare(js,
                     "SELECT id FROM jobs WHERE state IN ('queued', 'running') "
                     "AND json_extract(spec, '$.resume_from_job') = ?1 ORDER BY id LIMIT ?2",
                     "job continuations", &st, err, errlen);
    if (rc != 0)
        return rc;
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int(st, 2, max);
    int s;
    while ((s = sqlite3_step(st)) == SQLITE_ROW)
        ids[(*n)++] = sqlite3_column_int64(st, 0);
    rc = s == SQLITE_DONE ? 0 : fail(js->db, "job continuations", err, errlen);
    sqlite3_finalize(st);
    return rc;
}

/* The registry row; replace: a row already there for (name, version) is replaced, not refused. */
static int model_register_in(struct kd_jobstore *js, const char *name, int64_t version, int64_t source_job,
                             const char *metrics, bool replace, char *err, size_t errlen)
{
    if (!js || !name || !name[0] || version < 1)
        return seterr(err, errlen, "model register: invalid arguments (a name and a version >= 1)");
    sqlite3_stmt *st;
    int rc = prepare(js,
                     replace ? "INSERT OR REPLACE INTO model_registry (name, version, source_job, metrics, "
                               "created_ms) VALUES (?, ?, ?, ?, ?)"
                             : "INSERT INTO model_registry (name, version, source_job, metrics, created_ms) "
                               "VALUES (?, ?, ?, ?, ?)",
                     "model register", &st, err, errlen);
    if (rc != 0)
        return rc;
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
    if (!js)
        return seterr(err, errlen, "job %lld: no store", (long long)id);
    int rc = begin(js, "job succeed", err, errlen);
    if (rc != 0)
        return rc;
    char cur[32];
    rc = kd_js_current_state(js, id, cur, sizeof cur, err, errlen);
    if (rc == 0 && final_state(cur))
        rc = seterr(err, errlen, "job %lld is %s, which is final: it cannot succeed with a model", (long long)id,
                    cur);
    if (rc == 0)
        rc = model_register_in(js, name, version, id, metrics, true, err, errlen);
    if (rc == 0)
        rc = kd_js_append_event_in(js, id, "model", model_payload, NULL, err, errlen);
    if (rc == 0)
        rc = set_state_in(js, id, KD_JOB_SUCCEEDED, NULL, err, errlen);
    if (rc == 0)
        rc = kd_js_append_event_in(js, id, "state", state_payload, NULL, err, errlen);
    return finish(js, rc, "job succeed", err, errlen);
}
