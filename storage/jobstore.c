/*
 * storage/jobstore.c — opening kiln.db and migrating its schema.
 *
 * Migrations are an append-only list of SQL scripts: script i brings the schema from version i
 * to i + 1. Never edit a released script; add a new one. Each runs in an IMMEDIATE transaction
 * together with its schema_version update, so a crash leaves the file at one version or the next.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "jobstore.h"

struct kiln_jobstore {
    sqlite3 *db;
    int version;
};

static const char *const migrations[] = {
    /* 1: a place for facts about the store itself. Jobs tables arrive with the jobs API. */
    "CREATE TABLE kiln_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "INSERT INTO kiln_meta (key, value) VALUES ('created_at', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));",
};

int kiln_jobstore_latest_version(void)
{
    return (int)(sizeof migrations / sizeof migrations[0]);
}

static int fail(sqlite3 *db, const char *what, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s: %s", what, db ? sqlite3_errmsg(db) : "out of memory");
    return -1;
}

static int exec(sqlite3 *db, const char *sql, const char *what, char *err, size_t errlen)
{
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) == SQLITE_OK)
        return 0;
    snprintf(err, errlen, "%s: %s", what, msg ? msg : sqlite3_errmsg(db));
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

static int migrate(struct kiln_jobstore *js, char *err, size_t errlen)
{
    sqlite3 *db = js->db;
    if (exec(db, "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)", "creating schema_version",
             err, errlen) != 0)
        return -1;
    if (read_version(db, &js->version, err, errlen) != 0)
        return -1;
    int latest = kiln_jobstore_latest_version();
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

int kiln_jobstore_open(struct kiln_jobstore **out, const char *path, char *err, size_t errlen)
{
    *out = NULL;
    struct kiln_jobstore *js = calloc(1, sizeof *js);
    if (!js) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int rc = sqlite3_open_v2(path, &js->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
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
    kiln_jobstore_close(js);
    return -1;
}

int kiln_jobstore_schema_version(const struct kiln_jobstore *js)
{
    return js->version;
}

void kiln_jobstore_close(struct kiln_jobstore *js)
{
    if (!js)
        return;
    sqlite3_close(js->db);
    free(js);
}
