/*
 * tests/unit/test_jobstore.c — the SQLite job store: created in WAL mode, migrated to the latest
 * schema once, reopened without re-running migrations, and a file from a newer build refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "jobstore.h"

static char dir[64];
static char db[96];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/kiln-jobstore-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(db, sizeof db, "%s/kiln.db", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char path[128];
    const char *suffixes[] = {"", "-wal", "-shm"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s%s", db, suffixes[i]);
        unlink(path);
    }
    rmdir(dir);
    return 0;
}

static int query_int(const char *sql)
{
    sqlite3 *h;
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(h, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int v = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(h);
    return v;
}

static void test_create_and_reopen(void **state)
{
    (void)state;
    struct kiln_jobstore *js;
    char err[256];
    assert_int_equal(kiln_jobstore_open(&js, db, err, sizeof err), 0);
    assert_int_equal(kiln_jobstore_schema_version(js), kiln_jobstore_latest_version());
    kiln_jobstore_close(js);
    assert_int_equal(query_int("SELECT count(*) FROM schema_version"), 1);
    assert_int_equal(query_int("SELECT version FROM schema_version"), kiln_jobstore_latest_version());
    assert_int_equal(query_int("SELECT count(*) FROM kiln_meta"), 1);
    assert_int_equal(query_int("SELECT count(*) FROM pragma_journal_mode WHERE journal_mode = 'wal'"), 1);

    /* Reopening runs nothing twice. */
    assert_int_equal(kiln_jobstore_open(&js, db, err, sizeof err), 0);
    kiln_jobstore_close(js);
    assert_int_equal(query_int("SELECT count(*) FROM kiln_meta"), 1);
}

static void test_newer_schema_refused(void **state)
{
    (void)state;
    struct kiln_jobstore *js;
    char err[256];
    assert_int_equal(kiln_jobstore_open(&js, db, err, sizeof err), 0);
    kiln_jobstore_close(js);
    sqlite3 *h;
    assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
    assert_int_equal(sqlite3_exec(h, "UPDATE schema_version SET version = 999", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(h);
    assert_int_equal(kiln_jobstore_open(&js, db, err, sizeof err), -1);
    assert_null(js);
    assert_non_null(strstr(err, "999"));
}

static void test_unopenable_path(void **state)
{
    (void)state;
    struct kiln_jobstore *js;
    char err[256];
    assert_int_equal(kiln_jobstore_open(&js, "/nonexistent/folder/kiln.db", err, sizeof err), -1);
    assert_null(js);
    assert_non_null(strstr(err, "/nonexistent/folder/kiln.db"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_create_and_reopen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_newer_schema_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unopenable_path, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
