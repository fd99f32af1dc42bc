/*
 * tests/jobs/test_jobstore_jobs.c — the job store calls the jobs service leans on to keep a job's
 * end right: a stored cancel request, a transition made only from an expected state, the
 * continuations of a job, and the history pruned when a run resumes from a checkpoint (events
 * after the checkpoint's own event go, the epoch that checkpoint closed stays, and event ids are
 * never given twice).
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

#include "jobstore-files.h"
#include "jobstore.h"

static char dir[64];
static char db[96];
static struct kd_jobstore *js;
static char err[256];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/kiln-jobstore-jobs-XXXXXX");
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

static void append(int64_t id, const char *type, const char *payload)
{
    assert_int_equal(kd_jobstore_event_append(js, id, type, payload, NULL, err, sizeof err), 0);
}

/* The job's events as "type:step/epoch" words with their ids, for comparing. */
static void history(int64_t id, char *out, size_t len, int64_t *last_seq)
{
    struct kd_job_event *ev;
    int n;
    assert_int_equal(kd_jobstore_events_since(js, id, 0, 1000, &ev, &n, err, sizeof err), 0);
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        const char *step = strstr(ev[i].payload, "\"step\":"), *epoch = strstr(ev[i].payload, "\"epoch\":");
        size_t used = strlen(out);
        snprintf(out + used, len - used, "%s%s:%d/%d", i ? " " : "", ev[i].type, step ? atoi(step + 7) : -1,
                 epoch ? atoi(epoch + 8) : -1);
        *last_seq = ev[i].seq;
    }
    kd_jobstore_events_free(ev, n);
}

static void test_cancel_request(void **state)
{
    (void)state;
    int64_t id = create("{}");
    struct kd_job j;
    assert_int_equal(kd_jobstore_job_get(js, id, &j, err, sizeof err), 0);
    assert_true(j.cancel_requested_ms == 0);
    kd_jobstore_job_clear(&j);
    assert_int_equal(kd_jobstore_job_set_state(js, id, KD_JOB_RUNNING, NULL, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_request_cancel(js, id, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_get(js, id, &j, err, sizeof err), 0);
    int64_t first = j.cancel_requested_ms;
    assert_true(first > 0);
    kd_jobstore_job_clear(&j);
    /* a second request keeps the first one's time; it survives reopening the store */
    usleep(2000);
    assert_int_equal(kd_jobstore_job_request_cancel(js, id, err, sizeof err), 0);
    kd_jobstore_close(js);
    assert_int_equal(kd_jobstore_open(&js, db, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_get(js, id, &j, err, sizeof err), 0);
    assert_true(j.cancel_requested_ms == first);
    kd_jobstore_job_clear(&j);
    /* a final job is not asked again; a missing one is not found */
    assert_int_equal(kd_jobstore_job_set_state(js, id, KD_JOB_CANCELLED, NULL, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_request_cancel(js, id, err, sizeof err), -1);
    assert_non_null(strstr(err, "final"));
    assert_int_equal(kd_jobstore_job_request_cancel(js, 999, err, sizeof err), KD_JOBSTORE_NOT_FOUND);
}

static void test_transition_from(void **state)
{
    (void)state;
    int64_t queued = create("{}"), running = create("{}");
    assert_int_equal(kd_jobstore_job_set_state(js, running, KD_JOB_RUNNING, NULL, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_transition_from(js, queued, KD_JOB_QUEUED, KD_JOB_CANCELLED, NULL,
                                                     "{\"state\":\"cancelled\"}", NULL, err, sizeof err),
                     0);
    /* the trainer took it: not cancelled as if queued, and no event either */
    assert_int_equal(kd_jobstore_job_transition_from(js, running, KD_JOB_QUEUED, KD_JOB_CANCELLED, NULL,
                                                     "{\"state\":\"cancelled\"}", NULL, err, sizeof err),
                     -1);
    assert_non_null(strstr(err, "is running, not queued"));
    struct kd_job j;
    assert_int_equal(kd_jobstore_job_get(js, running, &j, err, sizeof err), 0);
    assert_string_equal(j.state, KD_JOB_RUNNING);
    kd_jobstore_job_clear(&j);
    struct kd_job_event *ev;
    int n;
    assert_int_equal(kd_jobstore_events_since(js, running, 0, 10, &ev, &n, err, sizeof err), 0);
    assert_int_equal(n, 0);
    kd_jobstore_events_free(ev, n);
}

static void test_continuations(void **state)
{
    (void)state;
    int64_t src = create("{}");
    int64_t a = create("{\"resume_from_job\": 1}"), b = create("{\"resume_from_job\": 1}");
    create("{\"resume_from_job\": 2}");
    assert_int_equal(src, 1);
    int64_t ids[4];
    int n = 0;
    assert_int_equal(kd_jobstore_job_continuations(js, src, ids, 4, &n, err, sizeof err), 0);
    assert_int_equal(n, 2);
    assert_true(ids[0] == a && ids[1] == b);
    /* running counts, final does not */
    assert_int_equal(kd_jobstore_job_set_state(js, a, KD_JOB_RUNNING, NULL, err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_set_state(js, b, KD_JOB_FAILED, "x", err, sizeof err), 0);
    assert_int_equal(kd_jobstore_job_continuations(js, src, ids, 4, &n, err, sizeof err), 0);
    assert_int_equal(n, 1);
    assert_true(ids[0] == a);
}

/* Steps 1..4 of epoch 1 with a checkpoint at its end (step 4), then epoch 2 cut short by a crash.
 * Updates every 2 batches, as with grad_accum 2: batches after the checkpoint report step 4 until
 * the next update, which only the events' order tells apart from those before it. */
static void test_prune_after_checkpoint(void **state)
{
    (void)state;
    int64_t id = create("{}");
    append(id, "state", "{\"state\":\"running\"}");
    append(id, "step", "{\"epoch\":1,\"batch\":1,\"step\":1}");
    append(id, "step", "{\"epoch\":1,\"batch\":3,\"step\":2}");
    append(id, "step", "{\"epoch\":1,\"batch\":7,\"step\":4}");
    append(id, "checkpoint", "{\"epoch\":1,\"step\":4,\"path\":\"c/step-4\"}");
    append(id, "epoch", "{\"epoch\":1,\"step\":4}");
    append(id, "step", "{\"epoch\":2,\"batch\":0,\"step\":4}");
    append(id, "step", "{\"epoch\":2,\"batch\":1,\"step\":5}");
    append(id, "log", "{\"message\":\"kept\"}");
    append(id, "step", "{\"epoch\":2,\"batch\":5,\"step\":7}");
    append(id, "state", "{\"state\":\"queued\"}");
    char h[1024];
    int64_t last = 0, removed = 0;
    history(id, h, sizeof h, &last);
    assert_int_equal(last, 11);
    assert_int_equal(
        kd_jobstore_events_prune_after(js, id, 4, 1, "{\"message\":\"pruned\"}", &removed, err, sizeof err), 0);
    assert_int_equal(removed, 3);
    history(id, h, sizeof h, &last);
    assert_string_equal(h, "state:-1/-1 step:1/1 step:2/1 step:4/1 checkpoint:4/1 epoch:4/1 log:-1/-1 state:-1/-1 "
                           "log:-1/-1");
    /* the log event has the next id: none is given twice, later ones follow it */
    assert_int_equal(last, 12);
    append(id, "step", "{\"epoch\":2,\"batch\":0,\"step\":4}");
    history(id, h, sizeof h, &last);
    assert_int_equal(last, 13);
    /* a step recorded after that log event goes the same way; then there is nothing to remove */
    assert_int_equal(kd_jobstore_events_prune_after(js, id, 4, 1, "{}", &removed, err, sizeof err), 0);
    assert_int_equal(removed, 1);
    assert_int_equal(kd_jobstore_events_prune_after(js, id, 4, 1, "{}", &removed, err, sizeof err), 0);
    assert_int_equal(removed, 0);
}

/* Without the checkpoint's own event (another job's checkpoint, or a run that starts over): by
 * step and epoch. */
static void test_prune_by_step(void **state)
{
    (void)state;
    int64_t id = create("{}");
    append(id, "step", "{\"epoch\":1,\"batch\":0,\"step\":11}");
    append(id, "checkpoint", "{\"epoch\":1,\"step\":12,\"path\":\"own/step-12\"}");
    append(id, "epoch", "{\"epoch\":3,\"step\":12}");
    int64_t removed = 0, last = 0;
    assert_int_equal(kd_jobstore_events_prune_after(js, id, 10, 2, "{}", &removed, err, sizeof err), 0);
    assert_int_equal(removed, 3);
    char h[256];
    history(id, h, sizeof h, &last);
    assert_string_equal(h, "log:-1/-1");
    assert_int_equal(last, 4);
    assert_int_equal(kd_jobstore_events_prune_after(js, 99, 0, 0, "{}", &removed, err, sizeof err),
                     KD_JOBSTORE_NOT_FOUND);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_cancel_request, setup, teardown),
        cmocka_unit_test_setup_teardown(test_transition_from, setup, teardown),
        cmocka_unit_test_setup_teardown(test_continuations, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prune_after_checkpoint, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prune_by_step, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
