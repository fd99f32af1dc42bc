/*
 * tests/jobs/test_jobstore_full.c — the job store when its disk is full: every write returns
 * KD_JOBSTORE_FULL (which the API answers 507) with the message users have always read, the
 * store keeps what it held, reads go on, and writes work again once room is made, without a
 * reopen. Two ways to run out, neither needing a small file system or root:
 *   - the database at its page limit (PRAGMA max_page_count): SQLite's SQLITE_FULL;
 *   - the process's file size limit (RLIMIT_FSIZE, SIGXFSZ ignored as kilnd ignores it): each
 *     write past it fails with EFBIG, which SQLite reports as an I/O error, not as "full".
 * Other failures keep their own codes: a spec that is not JSON is KD_JOBSTORE_FAILED (500).
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* before cmocka.h, whose fail() macro would take the store's helper of that name */
#include "jobs-impl.h" /* kd_jobs_store_status: the status the API answers */
#include "jobstore-files.h"
#include "jobstore-impl.h" /* the store's connection, to set its page limit */

#include <cmocka.h>

/* What the message says (the API's users read it; the code is what decides). */
#define FULL_WORDS "no space left on the disk holding the job store"

static char dir[64];
static char db[96];
static struct kd_jobstore *js;
static char err[256];
static struct rlimit fsize_before;

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/kiln-jobstore-full-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(db, sizeof db, "%s/kiln.db", dir);
    assert_int_equal(kd_jobstore_open(&js, db, err, sizeof err), 0);
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &fsize_before), 0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    setrlimit(RLIMIT_FSIZE, &fsize_before);
    kd_jobstore_close(js);
    jobstore_files_remove(db, dir);
    return 0;
}

/* A spec of about 3 KB, so that a few jobs need pages of their own. */
static const char *big_spec(void)
{
    static char spec[3100];
    if (!spec[0]) {
        int n = snprintf(spec, sizeof spec, "{\"model\":\"mlp\",\"note\":\"");
        memset(spec + n, 'x', sizeof spec - (size_t)n - 3);
        memcpy(spec + sizeof spec - 3, "\"}", 3);
    }
    return spec;
}

static int count_jobs(void)
{
    struct kd_job *jobs;
    int n;
    assert_int_equal(kd_jobstore_job_list(js, NULL, 0, 10000, &jobs, &n, err, sizeof err), 0);
    kd_jobstore_job_list_free(jobs, n);
    return n;
}

static void assert_full(int rc, const char *call)
{
    if (rc != KD_JOBSTORE_FULL)
        fail_msg("%s: %d, not KD_JOBSTORE_FULL: %s", call, rc, err);
    assert_non_null(strstr(err, FULL_WORDS));
    assert_non_null(strstr(err, "nothing was written"));
    assert_int_equal(kd_jobs_store_status(rc, 500), 507);
    assert_int_equal(kd_jobs_store_status(rc, 503), 507);
}

static void page_limit_is_full(void **state)
{
    (void)state;
    sqlite3_stmt *st;
    assert_int_equal(sqlite3_prepare_v2(js->db, "PRAGMA page_count", -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int pages = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA max_page_count = %d", pages + 2);
    assert_int_equal(sqlite3_exec(js->db, sql, NULL, NULL, NULL), SQLITE_OK);

    int64_t id = 0;
    int rc = 0, acknowledged = 0;
    for (int i = 0; i < 64 && rc == 0; i++)
        if ((rc = kd_jobstore_job_create(js, big_spec(), NULL, &id, err, sizeof err)) == 0)
            acknowledged++;
    assert_full(rc, "job create at the page limit");
    assert_non_null(strstr(err, "database or disk is full"));
    assert_int_equal(count_jobs(), acknowledged); /* reads go on; nothing half-written */

    assert_int_equal(sqlite3_exec(js->db, "PRAGMA max_page_count = 1073741823", NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(kd_jobstore_job_create(js, big_spec(), NULL, &id, err, sizeof err), 0);
    assert_int_equal(count_jobs(), acknowledged + 1);
}

/* Every later write of this process fails past one byte of any file. */
static void limit_file_size(void)
{
    signal(SIGXFSZ, SIG_IGN); /* a write past the limit then fails with EFBIG, as in kilnd */
    struct rlimit tiny = {.rlim_cur = 1, .rlim_max = fsize_before.rlim_max};
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &tiny), 0);
}

static void file_size_limit_is_full(void **state)
{
    (void)state;
    int64_t running, ended, seq;
    assert_int_equal(kd_jobstore_job_create(js, "{\"model\":\"a\"}", NULL, &running, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_set_state(js, running, KD_JOB_RUNNING, NULL, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_create(js, "{\"model\":\"b\"}", NULL, &ended, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_transition(js, ended, KD_JOB_CANCELLED, NULL, "{}", NULL, err, sizeof err),
                     0);

    limit_file_size();
    int64_t id;
    int rc = kd_jobstore_job_create(js, big_spec(), NULL, &id, err, sizeof err);
    assert_full(rc, "job create past the file size limit");
    /* SQLite's words for EFBIG: an I/O error, which only its errno tells from any other */
    assert_non_null(strstr(err, "disk I/O error"));
    assert_full(kd_jobstore_event_append(js, running, "log", "{\"message\":\"hello\"}", &seq, err, sizeof err),
                "event append");
    assert_full(kd_jobstore_job_request_cancel(js, running, err, sizeof err), "cancel request");
    assert_full(kd_jobstore_job_transition(js, running, KD_JOB_FAILED, "stopped", "{}", NULL, err, sizeof err),
                "transition");
    struct kd_job_purge purged;
    assert_full(kd_jobstore_job_purge(js, ended, &purged, err, sizeof err), "purge");

    /* reads go on, and show the store as it was */
    struct kd_job job;
    assert_int_equal(kd_jobstore_job_get(js, running, &job, err, sizeof err), 0);
    assert_string_equal(job.state, KD_JOB_RUNNING);
    assert_int_equal(job.cancel_requested_ms, 0);
    kd_jobstore_job_clear(&job);
    assert_int_equal(count_jobs(), 2);

    /* room again: the same store takes writes */
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &fsize_before), 0);
    assert_int_equal(kd_jobstore_job_create(js, big_spec(), NULL, &id, err, sizeof err), 0);
    assert_int_equal(
        kd_jobstore_job_transition(js, running, KD_JOB_FAILED, "stopped", "{}", NULL, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_purge(js, ended, &purged, err, sizeof err), 0);
    assert_int_equal(count_jobs(), 2);
}

static void other_failures_are_not_full(void **state)
{
    (void)state;
    int64_t id;
    int rc = kd_jobstore_job_create(js, "{not json", NULL, &id, err, sizeof err);
    assert_int_equal(rc, KD_JOBSTORE_FAILED);
    assert_int_equal(kd_jobs_store_status(rc, 500), 500);
    assert_null(strstr(err, FULL_WORDS));
    assert_int_equal(kd_jobstore_job_create(js, "{\"model\":\"a\"}", NULL, &id, err, sizeof err), 0);
    rc = kd_jobstore_job_set_state(js, id, "paused", NULL, err, sizeof err);
    assert_int_equal(rc, KD_JOBSTORE_FAILED);
    assert_non_null(strstr(err, "unknown state 'paused'"));
    rc = kd_jobstore_job_set_state(js, id, NULL, NULL, err, sizeof err);
    assert_int_equal(rc, KD_JOBSTORE_FAILED);
    assert_non_null(strstr(err, "no state given"));
    assert_int_equal(kd_jobstore_job_set_state(js, id + 100, KD_JOB_RUNNING, NULL, err, sizeof err),
                     KD_JOBSTORE_NOT_FOUND);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(page_limit_is_full, setup, teardown),
        cmocka_unit_test_setup_teardown(file_size_limit_is_full, setup, teardown),
        cmocka_unit_test_setup_teardown(other_failures_are_not_full, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
