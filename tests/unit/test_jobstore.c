/*
 * tests/unit/test_jobstore.c — the SQLite job store: created in WAL mode, migrated to the latest
 * schema once, reopened without re-running migrations, a file from a newer build refused, a
 * version-1 file migrated forward with its data kept, and the job API (create, get, list with
 * state filter and pagination, state changes, events since a sequence number, metrics); a new
 * file made 0666 less the umask, a store its user may not write refused at open.
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
#include <sys/stat.h>
#include <sys/wait.h>

#include "jobstore-files.h"
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
    jobstore_files_remove(db, dir);
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
    struct kd_jobstore *js;
    char err[256];
    assert_int_equal(kd_jobstore_open(&js, db, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_schema_version(js), kd_jobstore_latest_version());
    kd_jobstore_close(js);
    assert_int_equal(query_int("SELECT count(*) FROM schema_version"), 1);
    assert_int_equal(query_int("SELECT version FROM schema_version"), kd_jobstore_latest_version());
    assert_int_equal(query_int("SELECT count(*) FROM kiln_meta"), 1);
    assert_int_equal(query_int("SELECT count(*) FROM pragma_journal_mode WHERE journal_mode = 'wal'"), 1);

    /* Reopening runs nothing twice. */
    assert_int_equal(kd_jobstore_open(&js, db, err, sizeof err), 0);
    kd_jobstore_close(js);
    assert_int_equal(query_int("SELECT count(*) FROM kiln_meta"), 1);
}

static void test_newer_schema_refused(void **state)
{
    (void)state;
    struct kd_jobstore *js;
    char err[256];
    assert_int_equal(kd_jobstore_open(&js, db, err, sizeof err), 0);
    kd_jobstore_close(js);
    sqlite3 *h;
    assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
    assert_int_equal(sqlite3_exec(h, "UPDATE schema_version SET version = 999", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(h);
    assert_int_equal(kd_jobstore_open(&js, db, err, sizeof err), -1);
    assert_null(js);
    assert_non_null(strstr(err, "999"));
}

/* The read-only check --check-config runs: a missing file passes and is not made; a sound store
 * passes; a newer schema is refused as the start refuses it. */
static void test_check_read_only(void **state)
{
    (void)state;
    char err[512];
    assert_int_equal(kd_jobstore_check(db, err, sizeof err), 0);
    assert_int_equal(access(db, F_OK), -1);
    struct kd_jobstore *js;
    assert_int_equal(kd_jobstore_open(&js, db, err, sizeof err), 0);
    kd_jobstore_close(js);
    assert_int_equal(kd_jobstore_check(db, err, sizeof err), 0);
    sqlite3 *h;
    assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
    assert_int_equal(sqlite3_exec(h, "UPDATE schema_version SET version = 999", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(h);
    assert_int_equal(kd_jobstore_check(db, err, sizeof err), -1);
    assert_non_null(strstr(err, "schema version 999 is newer"));
}

/* The highest id issued outlives a purge, and reserving moves the next id past folders another
 * store left, never back. */
static void test_ids_issued_and_reserved(void **state)
{
    (void)state;
    struct kd_jobstore *js;
    char err[256];
    int64_t issued = -1, id = 0;
    assert_int_equal(kd_jobstore_open(&js, db, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_jobs_issued(js, &issued, err, sizeof err), 0);
    assert_int_equal(issued, 0);
    assert_int_equal(kd_jobstore_jobs_reserve_through(js, 40, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_create(js, "{}", "", &id, err, sizeof err), 0);
    assert_int_equal(id, 41);
    assert_int_equal(kd_jobstore_jobs_reserve_through(js, 7, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_create(js, "{}", "", &id, err, sizeof err), 0);
    assert_int_equal(id, 42);
    struct kd_job_purge purged;
    assert_int_equal(kd_jobstore_job_set_state(js, 42, "cancelled", NULL, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_purge(js, 42, &purged, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_jobs_issued(js, &issued, err, sizeof err), 0);
    assert_int_equal(issued, 42);
    assert_int_equal(kd_jobstore_jobs_reserve_through(js, 0, err, sizeof err), -1);
    kd_jobstore_close(js);
}

static void test_unopenable_path(void **state)
{
    (void)state;
    struct kd_jobstore *js;
    char err[256];
    assert_int_equal(kd_jobstore_open(&js, "/nonexistent/folder/kiln.db", err, sizeof err), -1);
    assert_null(js);
    assert_non_null(strstr(err, "/nonexistent/folder/kiln.db"));
}

/* A new store follows the umask (0002 in the container image, so one group shares the data
 * folder), where SQLite alone makes 0644 files whatever the umask; -wal and -shm copy it. */
static void test_new_file_follows_umask(void **state)
{
    (void)state;
    mode_t old = umask(0002);
    struct kd_jobstore *js;
    char err[256];
    int rc = kd_jobstore_open(&js, db, err, sizeof err);
    umask(old);
    assert_int_equal(rc, 0);
    struct stat sb;
    assert_int_equal(stat(db, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0664);
    char wal[128];
    snprintf(wal, sizeof wal, "%s-wal", db);
    assert_int_equal(stat(wal, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0664);
    kd_jobstore_close(js);
}

/* Opens the store as a user the file's mode keeps out: as root (who passes every mode check) in a
 * child that has become nobody, else here. 0 when the open was refused with the file's name. */
static int open_refused_as_other_user(void)
{
    if (geteuid() != 0) {
        struct kd_jobstore *js;
        char err[256];
        int rc = kd_jobstore_open(&js, db, err, sizeof err);
        if (rc == 0)
            kd_jobstore_close(js);
        return rc == -1 && strstr(err, db) && strstr(err, "writable") ? 0 : 1;
    }
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (setgid(65534) != 0 || setuid(65534) != 0)
            _exit(3);
        struct kd_jobstore *js;
        char err[256];
        int rc = kd_jobstore_open(&js, db, err, sizeof err);
        _exit(rc == -1 && strstr(err, db) && strstr(err, "writable") ? 0 : 1);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

/* SQLite would open such a file read-only without a word, and kilnd would answer its first job
 * with a 500; the store refuses at open, naming the file. Likewise for a -wal file another user
 * left behind. */
static void test_read_only_store_refused(void **state)
{
    (void)state;
    struct kd_jobstore *js;
    char err[256];
    assert_int_equal(kd_jobstore_open(&js, db, err, sizeof err), 0);
    kd_jobstore_close(js);
    assert_int_equal(chmod(dir, 0777), 0);
    assert_int_equal(chmod(db, 0644), 0);
    assert_int_equal(open_refused_as_other_user(), 0);

    /* the database writable by all, its -wal file not */
    char wal[128];
    snprintf(wal, sizeof wal, "%s-wal", db);
    FILE *f = fopen(wal, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(chmod(db, 0666), 0);
    assert_int_equal(chmod(wal, 0644), 0);
    assert_int_equal(open_refused_as_other_user(), 0);
}

static struct kd_jobstore *open_store(void)
{
    struct kd_jobstore *js;
    char err[256];
    if (kd_jobstore_open(&js, db, err, sizeof err) != 0)
        fail_msg("%s", err);
    return js;
}

static void test_migrate_from_v1(void **state)
{
    (void)state;
    /* A file exactly as the first release left it. */
    sqlite3 *h;
    assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
    assert_int_equal(sqlite3_exec(h,
                                  "PRAGMA journal_mode=WAL;"
                                  "CREATE TABLE schema_version (version INTEGER NOT NULL);"
                                  "INSERT INTO schema_version VALUES (1);"
                                  "CREATE TABLE kiln_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
                                  "INSERT INTO kiln_meta VALUES ('created_at', 'then');",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(h);
    struct kd_jobstore *js = open_store();
    assert_int_equal(kd_jobstore_schema_version(js), kd_jobstore_latest_version());
    assert_true(kd_jobstore_latest_version() >= 2);
    kd_jobstore_close(js);
    assert_int_equal(query_int("SELECT count(*) FROM kiln_meta WHERE value = 'then'"), 1);
    assert_int_equal(query_int("SELECT count(*) FROM sqlite_master WHERE name IN "
                               "('jobs', 'job_events', 'job_metrics', 'checkpoints', 'model_registry')"), 5);
    assert_int_equal(query_int("SELECT version FROM schema_version"), kd_jobstore_latest_version());
}

static void test_job_crud(void **state)
{
    (void)state;
    struct kd_jobstore *js = open_store();
    char err[256];
    int64_t id;
    assert_int_equal(kd_jobstore_job_create(js, "{\"model\": \"mlp\"}", "alice", &id, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_create(js, "{not json", "alice", &id, err, sizeof err), -1);
    assert_non_null(strstr(err, "JSON"));
    struct kd_job j;
    assert_int_equal(kd_jobstore_job_get(js, 1, &j, err, sizeof err), 0);
    assert_string_equal(j.state, "queued");
    assert_string_equal(j.owner, "alice");
    assert_non_null(strstr(j.spec, "mlp"));
    assert_true(j.created_ms > 0 && j.started_ms == 0 && j.finished_ms == 0);
    kd_jobstore_job_clear(&j);
    assert_int_equal(kd_jobstore_job_get(js, 99, &j, err, sizeof err), KD_JOBSTORE_NOT_FOUND);

    assert_int_equal(kd_jobstore_job_set_state(js, 1, "running", NULL, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_set_progress(js, 1, 0.5, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_set_progress(js, 1, 1.5, err, sizeof err), -1);
    assert_int_equal(kd_jobstore_job_set_state(js, 1, "bogus", NULL, err, sizeof err), -1);
    assert_int_equal(kd_jobstore_job_set_state(js, 1, "failed", "out of memory", err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_set_state(js, 1, "running", NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "final"));
    assert_int_equal(kd_jobstore_job_set_state(js, 42, "running", NULL, err, sizeof err), KD_JOBSTORE_NOT_FOUND);
    assert_int_equal(kd_jobstore_job_get(js, 1, &j, err, sizeof err), 0);
    assert_string_equal(j.state, "failed");
    assert_string_equal(j.error, "out of memory");
    assert_true(j.started_ms > 0 && j.finished_ms >= j.started_ms);
    assert_true(j.progress == 0.5);
    kd_jobstore_job_clear(&j);

    /* Events: numbered per job from 1, read back after a sequence number. */
    int64_t seq;
    for (int i = 0; i < 5; i++) {
        char payload[32];
        snprintf(payload, sizeof payload, "{\"i\": %d}", i);
        assert_int_equal(kd_jobstore_event_append(js, 1, "log", payload, &seq, err, sizeof err), 0);
        assert_int_equal(seq, i + 1);
    }
    assert_int_equal(kd_jobstore_event_append(js, 1, "log", "[", &seq, err, sizeof err), -1);
    assert_int_equal(kd_jobstore_event_append(js, 7, "log", "{}", &seq, err, sizeof err), KD_JOBSTORE_NOT_FOUND);
    struct kd_job_event *ev;
    int n;
    assert_int_equal(kd_jobstore_events_since(js, 1, 3, 100, &ev, &n, err, sizeof err), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ev[0].seq, 4);
    assert_string_equal(ev[1].payload, "{\"i\": 4}");
    kd_jobstore_events_free(ev, n);

    struct kd_job_metric m[2] = {{.step = 10, .epoch = 1, .name = "loss", .value = 0.25},
                                 {.step = 10, .epoch = 1, .name = "acc", .value = 0.9}};
    assert_int_equal(kd_jobstore_metrics_append(js, 1, 2, m, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_checkpoint_add(js, 1, "checkpoints/1/step-000000010", 10, 0.25, err, sizeof err),
                     0);
    assert_int_equal(kd_jobstore_model_register(js, "mlp", 1, 1, "{\"acc\": 0.9}", err, sizeof err), 0);
    assert_int_equal(kd_jobstore_model_register(js, "mlp", 1, 1, NULL, err, sizeof err), -1);
    kd_jobstore_close(js);
    assert_int_equal(query_int("SELECT count(*) FROM job_metrics WHERE job_id = 1 AND step = 10"), 2);
    assert_int_equal(query_int("SELECT count(*) FROM checkpoints WHERE job_id = 1"), 1);
    assert_int_equal(query_int("SELECT source_job FROM model_registry WHERE name = 'mlp'"), 1);
}

/* A state and its "state" event go in together or not at all: a stream that reads a job final
 * finds its final event stored. */
static void test_job_transition(void **state)
{
    (void)state;
    struct kd_jobstore *js = open_store();
    char err[256];
    int64_t id, seq = 0;
    assert_int_equal(kd_jobstore_job_create(js, "{}", NULL, &id, err, sizeof err), 0);
    assert_int_equal(
        kd_jobstore_job_transition(js, id, KD_JOB_RUNNING, NULL, "{\"state\":\"running\"}", &seq, err, sizeof err),
        0);
    assert_int_equal(seq, 1);
    assert_int_equal(kd_jobstore_job_transition(js, id, KD_JOB_SUCCEEDED, NULL, "{\"state\":\"succeeded\"}", &seq,
                                                err, sizeof err),
                     0);
    assert_int_equal(seq, 2);
    struct kd_job j;
    assert_int_equal(kd_jobstore_job_get(js, id, &j, err, sizeof err), 0);
    assert_string_equal(j.state, KD_JOB_SUCCEEDED);
    kd_jobstore_job_clear(&j);
    /* refused (a final state does not change): no event either */
    assert_int_equal(
        kd_jobstore_job_transition(js, id, KD_JOB_FAILED, "late", "{\"state\":\"failed\"}", NULL, err, sizeof err),
        -1);
    assert_non_null(strstr(err, "final"));
    /* an event that cannot be stored (not JSON) takes its state change back with it */
    assert_int_equal(kd_jobstore_job_create(js, "{}", NULL, &id, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_transition(js, id, KD_JOB_RUNNING, NULL, "{not json", NULL, err, sizeof err),
                     -1);
    assert_int_equal(kd_jobstore_job_get(js, id, &j, err, sizeof err), 0);
    assert_string_equal(j.state, KD_JOB_QUEUED);
    kd_jobstore_job_clear(&j);
    kd_jobstore_close(js);
    assert_int_equal(query_int("SELECT count(*) FROM job_events"), 2);
    assert_int_equal(query_int("SELECT count(*) FROM job_events WHERE payload LIKE '%failed%'"), 0);
}

/* A job that produced a model: registry row, "model" event, state and "state" event in one
 * transaction; a second try of the same job replaces its row; a refused step takes all back. */
static void test_job_succeed_with_model(void **state)
{
    (void)state;
    struct kd_jobstore *js = open_store();
    char err[256];
    int64_t id, other;
    assert_int_equal(kd_jobstore_job_create(js, "{}", NULL, &id, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_create(js, "{}", NULL, &other, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_set_state(js, id, KD_JOB_RUNNING, NULL, err, sizeof err), 0);
    /* an earlier try of the job left its row (a crash before the state was written) */
    assert_int_equal(kd_jobstore_model_register(js, "mlp", 3, id, "{\"acc\": 0.1}", err, sizeof err), 0);
    /* a bad state payload refuses the whole step */
    assert_int_equal(kd_jobstore_job_succeed_with_model(js, id, "mlp", 3, "{\"acc\": 0.9}",
                                                        "{\"name\":\"mlp\",\"version\":3}", "{nope", err,
                                                        sizeof err),
                     -1);
    struct kd_job j;
    assert_int_equal(kd_jobstore_job_get(js, id, &j, err, sizeof err), 0);
    assert_string_equal(j.state, KD_JOB_RUNNING);
    kd_jobstore_job_clear(&j);
    assert_int_equal(kd_jobstore_job_succeed_with_model(js, id, "mlp", 3, "{\"acc\": 0.9}",
                                                        "{\"name\":\"mlp\",\"version\":3}",
                                                        "{\"state\":\"succeeded\"}", err, sizeof err),
                     0);
    assert_int_equal(kd_jobstore_job_get(js, id, &j, err, sizeof err), 0);
    assert_string_equal(j.state, KD_JOB_SUCCEEDED);
    assert_true(j.progress == 1 && j.finished_ms > 0);
    kd_jobstore_job_clear(&j);
    struct kd_job_event *ev;
    int n;
    assert_int_equal(kd_jobstore_events_since(js, id, 0, 100, &ev, &n, err, sizeof err), 0);
    assert_int_equal(n, 2);
    assert_string_equal(ev[0].type, "model");
    assert_string_equal(ev[1].type, "state");
    assert_true(ev[0].seq < ev[1].seq);
    kd_jobstore_events_free(ev, n);
    /* a final job does not succeed again; a missing one is not found */
    assert_int_equal(kd_jobstore_job_succeed_with_model(js, id, "mlp", 4, NULL, "{}", "{}", err, sizeof err), -1);
    assert_non_null(strstr(err, "final"));
    assert_int_not_equal(kd_jobstore_job_succeed_with_model(js, 99, "mlp", 5, NULL, "{}", "{}", err, sizeof err),
                         0);
    kd_jobstore_close(js);
    assert_int_equal(query_int("SELECT count(*) FROM model_registry"), 1);
    assert_int_equal(query_int("SELECT json_extract(metrics, '$.acc') * 10 FROM model_registry WHERE version = 3"), 9);
    assert_int_equal(query_int("SELECT count(*) FROM job_events"), 2);
}

static void test_job_list_pagination(void **state)
{
    (void)state;
    struct kd_jobstore *js = open_store();
    char err[256];
    for (int i = 0; i < 25; i++) {
        int64_t id;
        assert_int_equal(kd_jobstore_job_create(js, "{}", NULL, &id, err, sizeof err), 0);
        if (i % 3 == 0)
            assert_int_equal(kd_jobstore_job_set_state(js, id, "running", NULL, err, sizeof err), 0);
    }
    /* Pages of 10 over everything: 10, 10, 5, then empty; ids strictly increasing. */
    int64_t after = 0, last = 0;
    int pages = 0, total = 0;
    for (;;) {
        struct kd_job *jobs;
        int n;
        assert_int_equal(kd_jobstore_job_list(js, NULL, after, 10, &jobs, &n, err, sizeof err), 0);
        if (n == 0) {
            kd_jobstore_job_list_free(jobs, n);
            break;
        }
        for (int i = 0; i < n; i++) {
            assert_true(jobs[i].id > last);
            last = jobs[i].id;
        }
        after = jobs[n - 1].id;
        total += n;
        pages++;
        kd_jobstore_job_list_free(jobs, n);
    }
    assert_int_equal(pages, 3);
    assert_int_equal(total, 25);
    struct kd_job *jobs;
    int n;
    assert_int_equal(kd_jobstore_job_list(js, "running", 0, 100, &jobs, &n, err, sizeof err), 0);
    assert_int_equal(n, 9);
    for (int i = 0; i < n; i++)
        assert_string_equal(jobs[i].state, "running");
    kd_jobstore_job_list_free(jobs, n);
    assert_int_equal(kd_jobstore_job_list(js, "nope", 0, 10, &jobs, &n, err, sizeof err), -1);
    assert_int_equal(kd_jobstore_job_list(js, NULL, 0, 0, &jobs, &n, err, sizeof err), -1);
    kd_jobstore_close(js);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_create_and_reopen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_newer_schema_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_check_read_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ids_issued_and_reserved, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unopenable_path, setup, teardown),
        cmocka_unit_test_setup_teardown(test_new_file_follows_umask, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_only_store_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_migrate_from_v1, setup, teardown),
        cmocka_unit_test_setup_teardown(test_job_crud, setup, teardown),
        cmocka_unit_test_setup_teardown(test_job_transition, setup, teardown),
        cmocka_unit_test_setup_teardown(test_job_succeed_with_model, setup, teardown),
        cmocka_unit_test_setup_teardown(test_job_list_pagination, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
