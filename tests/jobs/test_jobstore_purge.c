/*
 * tests/jobs/test_jobstore_purge.c — removing ended jobs from the job store: a purge takes the job
 * with its events, metric points and checkpoint index in one transaction and keeps the model
 * registry's row (without its source job); a queued or running job, one that a queued or running
 * job resumes from, and a missing one are refused with nothing removed; the ids a retention rule
 * gives (by count and by age) leave out the kept and the referenced ones.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "jobstore-files.h"
#include "jobstore.h"

static char dir[64];
static char db[96];
static struct kd_jobstore *js;
static char err[256];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/kiln-jobstore-purge-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(db, sizeof db, "%s/kiln.db", dir);
    assert_int_equal(kd_jobstore_open(&js, db, err, sizeof err), 0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kd_jobstore_close(js);
    jobstore_files_remove(db, dir);
    return 0;
}

static int64_t create(const char *spec)
{
    int64_t id = 0;
    assert_int_equal(kd_jobstore_job_create(js, spec, NULL, &id, err, sizeof err), 0);
    return id;
}

/* A job run to state (succeeded, failed, cancelled) with two events, one metric point and one
 * checkpoint indexed on the way. */
static int64_t ended(const char *spec, const char *state)
{
    int64_t id = create(spec);
    assert_int_equal(kd_jobstore_job_set_state(js, id, KD_JOB_RUNNING, NULL, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_event_append(js, id, "step", "{\"step\":1}", NULL, err, sizeof err), 0);
    struct kd_job_metric m = {.step = 1, .epoch = 1, .name = "loss", .value = 0.5};
    assert_int_equal(kd_jobstore_metrics_append(js, id, 1, &m, err, sizeof err), 0);
    char path[64];
    snprintf(path, sizeof path, "checkpoints/job-%lld/step-000000001", (long long)id);
    assert_int_equal(kd_jobstore_checkpoint_add(js, id, path, 1, 0.5, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_transition(js, id, state, NULL, "{}", NULL, err, sizeof err), 0);
    return id;
}

/* One number a query about the store gives (through a second connection, as another reader). */
static int64_t scalar(const char *sql)
{
    sqlite3 *c = NULL;
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_open(db, &c), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(c, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    int64_t v = sqlite3_column_type(st, 0) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(c);
    return v;
}

static void test_purge_succeeded_keeps_model(void **state)
{
    (void)state;
    int64_t id = create("{}"), other = ended("{}", KD_JOB_FAILED);
    assert_int_equal(kd_jobstore_job_set_state(js, id, KD_JOB_RUNNING, NULL, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_event_append(js, id, "step", "{\"step\":1}", NULL, err, sizeof err), 0);
    assert_int_equal(
        kd_jobstore_checkpoint_add(js, id, "checkpoints/job-1/step-000000001", 1, 0.5, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_succeed_with_model(js, id, "iris", 3, "{}", "{\"name\":\"iris\"}",
                                                        "{\"state\":\"succeeded\"}", err, sizeof err),
                     0);
    struct kd_job_purge p;
    assert_int_equal(kd_jobstore_job_purge(js, id, &p, err, sizeof err), 0);
    assert_string_equal(p.state, KD_JOB_SUCCEEDED);
    assert_int_equal(p.events, 3);  /* step, model, state */
    assert_int_equal(p.metrics, 1); /* the step event: the metric history's one row */
    assert_int_equal(p.checkpoints, 1);
    assert_string_equal(p.model_name, "iris");
    assert_int_equal(p.model_version, 3);
    /* gone, with everything it recorded; after reopening too */
    kd_jobstore_close(js);
    assert_int_equal(kd_jobstore_open(&js, db, err, sizeof err), 0);
    struct kd_job j;
    assert_int_equal(kd_jobstore_job_get(js, id, &j, err, sizeof err), KD_JOBSTORE_NOT_FOUND);
    bool exists = true;
    assert_int_equal(kd_jobstore_job_exists(js, id, &exists, err, sizeof err), 0);
    assert_false(exists);
    assert_int_equal(scalar("SELECT count(*) FROM job_events WHERE job_id = 1"), 0);
    assert_int_equal(scalar("SELECT count(*) FROM checkpoints WHERE job_id = 1"), 0);
    /* the registry keeps the version, with no source job */
    assert_int_equal(scalar("SELECT count(*) FROM model_registry WHERE name = 'iris' AND version = 3"), 1);
    assert_int_equal(scalar("SELECT source_job FROM model_registry WHERE name = 'iris'"), -1);
    /* the other job is untouched, and the purged id is never given again */
    assert_int_equal(kd_jobstore_job_exists(js, other, &exists, err, sizeof err), 0);
    assert_true(exists);
    assert_int_equal(scalar("SELECT count(*) FROM job_events WHERE job_id = 2"), 2);
    assert_int_equal(scalar("SELECT count(*) FROM job_metrics WHERE job_id = 2"), 1);
    assert_true(create("{}") > other);
    /* a second purge finds nothing */
    assert_int_equal(kd_jobstore_job_purge(js, id, &p, err, sizeof err), KD_JOBSTORE_NOT_FOUND);
    assert_non_null(strstr(err, "not found"));
}

static void test_purge_counts_and_cancelled(void **state)
{
    (void)state;
    int64_t id = ended("{}", KD_JOB_CANCELLED);
    struct kd_job_purge p;
    assert_int_equal(kd_jobstore_job_purge(js, id, &p, err, sizeof err), 0);
    assert_string_equal(p.state, KD_JOB_CANCELLED);
    assert_int_equal(p.events, 2);
    assert_int_equal(p.metrics, 2); /* the step event, and the job_metrics row */
    assert_int_equal(p.checkpoints, 1);
    assert_string_equal(p.model_name, "");
    assert_int_equal(scalar("SELECT count(*) FROM job_metrics"), 0);
    assert_int_equal(scalar("SELECT count(*) FROM jobs"), 0);
}

static void test_purge_refusals(void **state)
{
    (void)state;
    int64_t queued = create("{}"), running = create("{}");
    assert_int_equal(kd_jobstore_job_set_state(js, running, KD_JOB_RUNNING, NULL, err, sizeof err), 0);
    struct kd_job_purge p;
    assert_int_equal(kd_jobstore_job_purge(js, queued, &p, err, sizeof err), KD_JOBSTORE_NOT_ENDED);
    assert_string_equal(p.state, KD_JOB_QUEUED);
    assert_non_null(strstr(err, "is queued: it has not ended"));
    assert_int_equal(kd_jobstore_job_purge(js, running, &p, err, sizeof err), KD_JOBSTORE_NOT_ENDED);
    assert_non_null(strstr(err, "is running"));
    assert_int_equal(kd_jobstore_job_purge(js, 999, &p, err, sizeof err), KD_JOBSTORE_NOT_FOUND);
    /* a job that a queued or running job resumes from stays while that one has not ended */
    int64_t src = ended("{}", KD_JOB_FAILED);
    char spec[64];
    snprintf(spec, sizeof spec, "{\"resume_from_job\": %lld}", (long long)src);
    int64_t cont = create(spec);
    assert_int_equal(kd_jobstore_job_purge(js, src, &p, err, sizeof err), KD_JOBSTORE_RESUMED_BY);
    assert_int_equal(p.resumed_by, cont);
    assert_non_null(strstr(err, "resumes from"));
    assert_int_equal(kd_jobstore_job_set_state(js, cont, KD_JOB_RUNNING, NULL, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_purge(js, src, &p, err, sizeof err), KD_JOBSTORE_RESUMED_BY);
    /* nothing went with the refusals */
    assert_int_equal(scalar("SELECT count(*) FROM jobs"), 4);
    assert_int_equal(scalar("SELECT count(*) FROM job_events"), 2);
    assert_int_equal(kd_jobstore_job_set_state(js, cont, KD_JOB_CANCELLED, NULL, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_purge(js, src, &p, err, sizeof err), 0);
}

static void past(int64_t keep, int64_t before, int64_t *ids, int *n)
{
    assert_int_equal(kd_jobstore_jobs_past_retention(js, keep, before, ids, 16, n, err, sizeof err), 0);
}

static void test_retention(void **state)
{
    (void)state;
    /* five ended jobs, each ended a day before the next (set by hand: the store writes the time
     * a job ends), and one still queued */
    int64_t id[5];
    for (int i = 0; i < 5; i++)
        id[i] = ended("{}", i % 2 ? KD_JOB_FAILED : KD_JOB_SUCCEEDED);
    create("{}");
    sqlite3 *c = NULL;
    assert_int_equal(sqlite3_open(db, &c), SQLITE_OK);
    int64_t now = (int64_t)time(NULL) * 1000, day = 86400000;
    for (int i = 0; i < 5; i++) {
        char sql[128];
        snprintf(sql, sizeof sql, "UPDATE jobs SET finished_ms = %lld WHERE id = %lld",
                 (long long)(now - (5 - i) * day), (long long)id[i]);
        assert_int_equal(sqlite3_exec(c, sql, NULL, NULL, NULL), SQLITE_OK);
    }
    int64_t ids[16];
    int n = -1;
    past(0, 0, ids, &n);
    assert_int_equal(n, 0);
    /* by count: beyond the 2 that ended last, the earliest ended first */
    past(2, 0, ids, &n);
    assert_int_equal(n, 3);
    assert_true(ids[0] == id[0] && ids[1] == id[1] && ids[2] == id[2]);
    past(10, 0, ids, &n);
    assert_int_equal(n, 0);
    /* by age: ended more than 3.5 days ago */
    past(0, now - 7 * day / 2, ids, &n);
    assert_int_equal(n, 2);
    assert_true(ids[0] == id[0] && ids[1] == id[1]);
    /* either rule: the union */
    past(4, now - 7 * day / 2, ids, &n);
    assert_int_equal(n, 2);
    /* a job a queued job resumes from is kept, whatever the rules say */
    char sql[96];
    snprintf(sql, sizeof sql, "UPDATE jobs SET spec = '{\"resume_from_job\": %lld}' WHERE id = 6",
             (long long)id[1]);
    assert_int_equal(sqlite3_exec(c, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(c);
    past(2, 0, ids, &n);
    assert_int_equal(n, 2);
    assert_true(ids[0] == id[0] && ids[1] == id[2]);
    assert_int_equal(kd_jobstore_jobs_past_retention(js, -1, 0, ids, 16, &n, err, sizeof err), -1);
    assert_non_null(strstr(err, "invalid arguments"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_purge_succeeded_keeps_model, setup, teardown),
        cmocka_unit_test_setup_teardown(test_purge_counts_and_cancelled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_purge_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retention, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
