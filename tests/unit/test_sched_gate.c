/*
 * tests/unit/test_sched_gate.c — the scheduler's training gate (scheduler.h): a training step
 * waits while inference is pending on its device and goes once it drains; the starvation bound
 * lets a step through under load that never drains; a cancel flag or a stopping scheduler wakes
 * a waiting trainer; a device takes at most training_max_jobs jobs.
 *
 * A real scheduler on the cpu device with the serving fixture's MLP. The device is kept busy
 * deterministically by a task (kd_sched_task_submit) that blocks on the test's condition
 * variable, so nothing here depends on how long anything takes: the test waits for states
 * (a trainer reported waiting, a thread returned), never for durations.
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
#include <pthread.h>
#include <sys/resource.h>

#include "sched-loop-util.h"
#include "scheduler.h"

#ifndef KILN_TEST_FIXTURES
#error "KILN_TEST_FIXTURES must name tests/fixtures"
#endif

/* ---- a task that holds the device's worker until released ---------------------------------- */

struct blocker {
    struct kd_sched_task task;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool started, release, done;
};

static void blocker_run(struct kd_sched_task *t, kiln_device *dev)
{
    (void)dev;
    struct blocker *b = t->ud;
    pthread_mutex_lock(&b->mu);
    b->started = true;
    pthread_cond_broadcast(&b->cv);
    while (!b->release)
        pthread_cond_wait(&b->cv, &b->mu);
    pthread_mutex_unlock(&b->mu);
}

static void blocker_done(struct kd_sched_task *t)
{
    struct blocker *b = t->ud;
    b->done = true;
}

static void blocker_start(struct kd_sched *s, struct blocker *b)
{
    memset(b, 0, sizeof *b);
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    b->task.run = blocker_run;
    b->task.done = blocker_done;
    b->task.ud = b;
    int w = kd_sched_worker_for(s, "cpu", 0);
    assert_true(w >= 0);
    assert_int_equal(kd_sched_task_submit(s, w, &b->task), 0);
    pthread_mutex_lock(&b->mu);
    while (!b->started)
        pthread_cond_wait(&b->cv, &b->mu);
    pthread_mutex_unlock(&b->mu);
}

static void blocker_release(struct blocker *b)
{
    pthread_mutex_lock(&b->mu);
    b->release = true;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

static void blocker_destroy(struct blocker *b)
{
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
}

/* ---- a scheduler with the fixture model loaded ------------------------------------------- */

struct fixture {
    uv_loop_t loop;
    uv_timer_t tick;                    /* keeps the loop polling while a test waits on it */
    struct kd_sched *s;
    struct kd_sched_model *m;
    bool loaded;
};

static void run_until(struct fixture *f, const bool *flag)
{
    sched_test_run_until(&f->loop, &f->tick, flag);
}

static void on_loaded(void *ud, struct kd_sched_model *m, const char *why)
{
    struct fixture *f = ud;
    if (!m)
        fprintf(stderr, "load failed: %s\n", why);
    f->m = m;
    f->loaded = true;
}

static int fixture_nice; /* training_nice of the next fixture */

static void fixture_open(struct fixture *f, int64_t max_wait_ms, int max_jobs)
{
    memset(f, 0, sizeof *f);
    assert_int_equal(uv_loop_init(&f->loop), 0);
    uv_timer_init(&f->loop, &f->tick);
    const char *devs[] = {"cpu"};
    struct kd_sched_options o = {
        .loop = &f->loop,
        .devices = devs,
        .ndevices = 1,
        .workers_per_device = 1,
        .max_queue = 16,
        .training_max_wait_ms = max_wait_ms,
        .training_max_jobs = max_jobs,
        .training_nice = fixture_nice,
    };
    char err[256];
    assert_int_equal(kd_sched_new(&f->s, &o, err, sizeof err), 0);
    kd_repository *repo = kd_repository_open(KILN_TEST_FIXTURES "/serving");
    assert_non_null(repo);
    const kd_model_info *info = kd_repository_find(repo, "mnist_mlp");
    assert_non_null(info);
    assert_true(info->nversions >= 1);
    assert_int_equal(kd_sched_model_load(f->s, "mnist_mlp", &info->versions[0], on_loaded, f), 0);
    run_until(f, &f->loaded);
    kd_repository_close(repo);
    assert_non_null(f->m);
}

static void fixture_close(struct fixture *f)
{
    kd_sched_stop(f->s);
    if (f->m)
        kd_sched_model_release(f->m);
    kd_sched_close(f->s);
    uv_close((uv_handle_t *)&f->tick, NULL);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    kd_sched_destroy(f->s);
    assert_int_equal(uv_loop_close(&f->loop), 0);
}

/* ---- an inference request ---------------------------------------------------------------- */

struct infer {
    struct kd_sched_request r;
    bool done;
};

static void infer_done(struct kd_sched_request *r)
{
    struct infer *in = r->ud;
    in->done = true;
}

static void infer_submit(struct fixture *f, struct infer *in)
{
    memset(in, 0, sizeof *in);
    in->r.model = kd_sched_model_retain(f->m);
    in->r.ninputs = 1;
    struct kd_sched_tensor *t = &in->r.inputs[0];
    t->dtype = KILN_F32;
    t->ndim = 2;
    t->shape[0] = 1;
    t->shape[1] = 784;
    t->nbytes = 784 * sizeof(float);
    t->data = calloc(784, sizeof(float));
    assert_non_null(t->data);
    in->r.done = infer_done;
    in->r.ud = in;
    assert_int_equal(kd_sched_submit(f->s, &in->r), 0);
}

static void infer_finish(struct fixture *f, struct infer *in)
{
    run_until(f, &in->done);
    /* It ran: the fixture's logits, one row of ten. */
    assert_int_equal(in->r.outcome, KD_SCHED_OK);
    assert_int_equal(in->r.noutputs, 1);
    assert_int_equal(in->r.outputs[0].ndim, 2);
    assert_int_equal(in->r.outputs[0].shape[0], 1);
    assert_int_equal(in->r.outputs[0].shape[1], 10);
    kd_sched_request_clear(&in->r);
    kd_sched_model_release(in->r.model);
}

/* ---- a trainer thread ---------------------------------------------------------------------- */

struct trainer {
    struct kd_sched_training *t;
    atomic_bool returned;
    int rc;
    /* what the trainer saw of the request the moment its acquire returned */
    struct infer *watch;
    uint64_t watch_finished_ns;
    pthread_t thread;
};

static void *trainer_acquire(void *arg)
{
    struct trainer *tr = arg;
    tr->rc = kd_sched_training_acquire(tr->t);
    if (tr->watch)
        tr->watch_finished_ns = tr->watch->r.finished_ns;
    atomic_store(&tr->returned, true);
    return NULL;
}

static void trainer_start(struct trainer *tr, struct kd_sched_training *t, struct infer *watch)
{
    memset(tr, 0, sizeof *tr);
    tr->t = t;
    tr->watch = watch;
    atomic_init(&tr->returned, false);
    assert_int_equal(pthread_create(&tr->thread, NULL, trainer_acquire, tr), 0);
}

/* Until n trainers are blocked in the gate (a state the gate reports, not a duration). */
static void wait_for_waiters(struct kd_sched *s, int n)
{
    for (;;) {
        struct kd_sched_training_stats st;
        kd_sched_training_stats(s, &st);
        if (st.waiting >= n)
            return;
        usleep(1000);
    }
}

/* ---- the tests ------------------------------------------------------------------------------ */

/* Inference pending (a task running, a request queued behind it): acquire returns only after
 * both ran, and counts one yield that the bound did not cut short. */
static void test_waits_until_inference_drains(void **state)
{
    (void)state;
    struct fixture f;
    fixture_open(&f, 600000, 1);
    atomic_bool cancel;
    atomic_init(&cancel, false);
    struct kd_sched_training t;
    assert_int_equal(kd_sched_training_begin(f.s, "cpu", &cancel, &t), 0);

    /* An idle device: the step goes at once, without a yield. */
    assert_int_equal(kd_sched_training_acquire(&t), 0);
    kd_sched_training_release(&t);
    assert_int_equal(t.yields, 0);

    struct blocker b;
    blocker_start(f.s, &b);
    struct infer in;
    infer_submit(&f, &in);
    struct trainer tr;
    trainer_start(&tr, &t, &in);
    wait_for_waiters(f.s, 1);
    assert_false(atomic_load(&tr.returned));
    blocker_release(&b);
    pthread_join(tr.thread, NULL);
    assert_int_equal(tr.rc, 0);
    /* The request had run before the trainer got the device. */
    assert_true(tr.watch_finished_ns != 0);
    infer_finish(&f, &in);
    assert_int_equal(t.yields, 1);
    assert_int_equal(t.forced, 0);
    assert_true(t.wait_ns > 0);
    kd_sched_training_release(&t);

    struct kd_sched_training_stats st;
    kd_sched_training_stats(f.s, &st);
    assert_int_equal(st.steps, 2);
    assert_int_equal(st.yields, 1);
    assert_int_equal(st.forced, 0);
    assert_int_equal(st.jobs, 1);
    /* a job's last acquire (after its last step) is ended, not released: no step ran */
    assert_int_equal(kd_sched_training_acquire(&t), 0);
    kd_sched_training_end(&t);
    kd_sched_training_stats(f.s, &st);
    assert_int_equal(st.jobs, 0);
    assert_int_equal(st.steps, 2);
    run_until(&f, &b.done);
    fixture_close(&f);
    blocker_destroy(&b);
}

/* Inference that never drains (the task holds the worker throughout): the bound lets the step
 * run anyway, counted as forced. */
static void test_bound_lets_a_step_through(void **state)
{
    (void)state;
    struct fixture f;
    fixture_open(&f, 5, 1);
    struct kd_sched_training t;
    assert_int_equal(kd_sched_training_begin(f.s, "cpu", NULL, &t), 0);
    struct blocker b;
    blocker_start(f.s, &b);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(kd_sched_training_acquire(&t), 0);
        kd_sched_training_release(&t);
    }
    assert_false(b.done);
    assert_int_equal(t.yields, 3);
    assert_int_equal(t.forced, 3);
    kd_sched_training_end(&t);
    blocker_release(&b);
    run_until(&f, &b.done);

    /* training_max_wait_ms 0: training never waits, even with work queued. */
    fixture_close(&f);
    fixture_open(&f, 0, 1);
    assert_int_equal(kd_sched_training_begin(f.s, "cpu", NULL, &t), 0);
    blocker_start(f.s, &b);
    assert_int_equal(kd_sched_training_acquire(&t), 0);
    assert_int_equal(t.yields, 0);
    kd_sched_training_end(&t);
    blocker_release(&b);
    run_until(&f, &b.done);
    fixture_close(&f);
    blocker_destroy(&b);
}

struct stopper {
    struct kd_sched *s;
    pthread_t thread;
};

static void *stop_main(void *arg)
{
    kd_sched_stop(((struct stopper *)arg)->s);
    return NULL;
}

/* A cancel flag (set without calling anything) and a stopping scheduler both end a wait that the
 * bound would let run for ten minutes. */
static void test_cancel_and_stop_wake_a_trainer(void **state)
{
    (void)state;
    struct fixture f;
    fixture_open(&f, 600000, 1);
    atomic_bool cancel;
    atomic_init(&cancel, false);
    struct kd_sched_training t;
    assert_int_equal(kd_sched_training_begin(f.s, "cpu", &cancel, &t), 0);
    struct blocker b;
    blocker_start(f.s, &b);

    struct trainer tr;
    trainer_start(&tr, &t, NULL);
    wait_for_waiters(f.s, 1);
    atomic_store(&cancel, true);
    pthread_join(tr.thread, NULL);
    assert_int_equal(tr.rc, 1);
    assert_false(b.done);
    assert_int_equal(kd_sched_training_acquire(&t), 1); /* still cancelled: no step */

    atomic_store(&cancel, false);
    trainer_start(&tr, &t, NULL);
    wait_for_waiters(f.s, 1);
    /* stop joins the worker, which the blocker holds: stop from another thread, see the
     * trainer wake, then let the worker go. */
    struct stopper st = {f.s, 0};
    assert_int_equal(pthread_create(&st.thread, NULL, stop_main, &st), 0);
    pthread_join(tr.thread, NULL);
    assert_int_equal(tr.rc, 1);
    blocker_release(&b);
    pthread_join(st.thread, NULL);
    assert_true(b.done); /* stop delivered the task's completion */
    assert_int_equal(kd_sched_training_acquire(&t), 1); /* stopped: no more steps */
    kd_sched_training_end(&t);
    fixture_close(&f);
    blocker_destroy(&b);
}

struct joiner {
    struct kd_sched *s;
    struct kd_sched_training t;
    const atomic_bool *cancel;
    int rc;
    int nice_before, nice_after;        /* the joining thread's own nice value */
    pthread_t thread;
};

static void *join_main(void *arg)
{
    struct joiner *j = arg;
    j->nice_before = getpriority(PRIO_PROCESS, (id_t)gettid());
    j->rc = kd_sched_training_begin(j->s, "cpu", j->cancel, &j->t);
    j->nice_after = getpriority(PRIO_PROCESS, (id_t)gettid());
    return NULL;
}

/* training_max_jobs 1: a second job waits for the first to end; a device no worker drives is
 * not gated at all. With training_nice 7, a job's thread runs at nice 7 once it began (asked on
 * threads of their own, so the test's thread keeps its priority). */
static void test_one_job_per_device(void **state)
{
    (void)state;
    struct fixture f;
    fixture_nice = 7;
    fixture_open(&f, 600000, 1);
    fixture_nice = 0;
    struct kd_sched_training first;
    struct joiner j0 = {.s = f.s};
    assert_int_equal(pthread_create(&j0.thread, NULL, join_main, &j0), 0);
    pthread_join(j0.thread, NULL);
    assert_int_equal(j0.rc, 0);
    first = j0.t;
    struct joiner j = {.s = f.s};
    assert_int_equal(pthread_create(&j.thread, NULL, join_main, &j), 0);
    wait_for_waiters(f.s, 1);
    kd_sched_training_end(&first);
    pthread_join(j.thread, NULL);
    assert_int_equal(j.rc, 0);
    /* Lowered to 7, or left alone when the test already runs at a lower priority. */
    assert_int_equal(j.nice_after, j.nice_before < 7 ? 7 : j.nice_before);
    struct kd_sched_training_stats st;
    kd_sched_training_stats(f.s, &st);
    assert_int_equal(st.jobs, 1);

    /* A third, cancelled while it waits, gets no slot. */
    atomic_bool cancel;
    atomic_init(&cancel, false);
    struct joiner k = {.s = f.s, .cancel = &cancel};
    assert_int_equal(pthread_create(&k.thread, NULL, join_main, &k), 0);
    wait_for_waiters(f.s, 1);
    atomic_store(&cancel, true);
    pthread_join(k.thread, NULL);
    assert_int_equal(k.rc, 1);
    kd_sched_training_stats(f.s, &st);
    assert_int_equal(st.jobs, 1);
    kd_sched_training_end(&j.t);

    struct kd_sched_training other;
    assert_int_equal(kd_sched_training_begin(f.s, "cuda:7", NULL, &other), 0);
    assert_int_equal(other.dev, -1);
    assert_int_equal(kd_sched_training_acquire(&other), 0);
    kd_sched_training_end(&other);
    fixture_close(&f);
}

/* A load on a device no worker drives is -2; any load once the scheduler stops is -3, so a load
 * racing the shutdown is told kilnd is stopping, not that its device is unknown. */
static void test_load_refusals_name_their_cause(void **state)
{
    (void)state;
    struct fixture f;
    fixture_open(&f, 50, 1);
    kd_repository *repo = kd_repository_open(KILN_TEST_FIXTURES "/serving");
    assert_non_null(repo);
    const kd_model_info *info = kd_repository_find(repo, "mnist_mlp");
    assert_non_null(info);
    kd_model_version v = info->versions[0];
    v.config.device = "cuda:7";
    bool unused = false;
    assert_int_equal(kd_sched_model_load(f.s, "mnist_mlp", &v, on_loaded, &unused), -2);
    kd_sched_stop(f.s);
    assert_int_equal(kd_sched_model_load(f.s, "mnist_mlp", &info->versions[0], on_loaded, &unused), -3);
    kd_repository_close(repo);
    fixture_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_waits_until_inference_drains),   cmocka_unit_test(test_bound_lets_a_step_through),
        cmocka_unit_test(test_cancel_and_stop_wake_a_trainer), cmocka_unit_test(test_one_job_per_device),
        cmocka_unit_test(test_load_refusals_name_their_cause),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
