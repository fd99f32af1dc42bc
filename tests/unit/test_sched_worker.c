/*
 * tests/unit/test_sched_worker.c — what the scheduler's workers do beside running batches:
 *
 *   - a warning a worker meets at a load goes to the log hook of kd_sched_options at level warn,
 *     naming the model and what happened: a model served unbatched (its config.json declares an
 *     output whose dim 0 is not the batch), a shipped autotune.tsv that is corrupt; without a
 *     hook, the warning goes to stderr;
 *   - once its device has been idle for pool_idle_trim_ms, a worker hands the device's cached
 *     buffers back (kd_sched_pool_stats counts it, and the cpu pool's cached bytes are 0), not
 *     while a training job holds the device, and never with the trim off.
 *
 * A real scheduler on the cpu device with the serving fixture's MLP. Nothing waits for a
 * duration to pass except where a trim must not happen; a trim that must happen is polled for
 * with a generous deadline.
 */
#include <fcntl.h>
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
#include <pthread.h>
#include <sys/stat.h>

#include "sched-loop-util.h"
#include "scheduler.h"

#ifndef KILN_TEST_FIXTURES
#error "KILN_TEST_FIXTURES must name tests/fixtures"
#endif

/* ---- a log hook that keeps the lines it is given ------------------------------------------ */

#define MAX_LINES 32

struct recorder {
    pthread_mutex_t mu; /* the hook runs on worker threads */
    int n;
    enum kd_log_level level[MAX_LINES];
    char line[MAX_LINES][1024];
};

static void record(void *ud, enum kd_log_level level, const char *msg)
{
    struct recorder *r = ud;
    pthread_mutex_lock(&r->mu);
    if (r->n < MAX_LINES) {
        r->level[r->n] = level;
        snprintf(r->line[r->n], sizeof r->line[r->n], "%s", msg);
        r->n++;
    }
    pthread_mutex_unlock(&r->mu);
}

/* The lines at level holding every one of the NULL-terminated words. */
static int lines_with(struct recorder *r, enum kd_log_level level, ...)
{
    int found = 0;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n; i++) {
        bool all = r->level[i] == level;
        va_list ap;
        va_start(ap, level);
        for (const char *w = va_arg(ap, const char *); w && all; w = va_arg(ap, const char *))
            all = strstr(r->line[i], w) != NULL;
        va_end(ap);
        if (!all)
            fprintf(stderr, "  (other line at %s: %s)\n", kd_log_level_to_str(r->level[i]), r->line[i]);
        found += all;
    }
    pthread_mutex_unlock(&r->mu);
    return found;
}

/* ---- a scheduler on cpu, and models loaded into it ---------------------------------------- */

struct fixture {
    uv_loop_t loop;
    uv_timer_t tick; /* keeps the loop polling while a test waits on it */
    struct kd_sched *s;
    struct recorder log;
    struct kd_sched_model *m;
    bool loaded;
};

static void run_until(struct fixture *f, const bool *flag)
{
    sched_test_run_until(&f->loop, &f->tick, flag);
}

static void fixture_open(struct fixture *f, bool hook, int64_t pool_idle_trim_ms)
{
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->log.mu, NULL);
    assert_int_equal(uv_loop_init(&f->loop), 0);
    uv_timer_init(&f->loop, &f->tick);
    const char *devs[] = {"cpu"};
    struct kd_sched_options o = {
        .loop = &f->loop,
        .devices = devs,
        .ndevices = 1,
        .workers_per_device = 1,
        .max_queue = 16,
        .training_max_wait_ms = 100,
        .log = hook ? record : NULL,
        .log_ud = hook ? &f->log : NULL,
        .pool_idle_trim_ms = pool_idle_trim_ms,
    };
    char err[256];
    assert_int_equal(kd_sched_new(&f->s, &o, err, sizeof err), 0);
}

static void on_loaded(void *ud, struct kd_sched_model *m, const char *why)
{
    struct fixture *f = ud;
    if (!m)
        fprintf(stderr, "load failed: %s\n", why);
    f->m = m;
    f->loaded = true;
}

/* Loads version v of name; the model stays in f->m. */
static void load(struct fixture *f, const char *name, const kd_model_version *v)
{
    f->loaded = false;
    assert_int_equal(kd_sched_model_load(f->s, name, v, on_loaded, f), 0);
    run_until(f, &f->loaded);
    assert_non_null(f->m);
}

/* The fixture's mnist_mlp, as its config.json has it, or with its output declared [1, 10]
 * (dim 0 fixed: the model cannot batch). */
static void load_fixture(struct fixture *f, bool fixed_output)
{
    kd_repository *repo = kd_repository_open(KILN_TEST_FIXTURES "/serving");
    assert_non_null(repo);
    const kd_model_info *info = kd_repository_find(repo, "mnist_mlp");
    assert_non_null(info);
    kd_model_version v = info->versions[0];
    assert_int_equal(v.version, 1);
    assert_int_equal(v.config.noutputs, 1);
    kd_model_tensor_spec out = v.config.outputs[0];
    if (fixed_output) {
        out.shape[0] = 1;
        v.config.outputs = &out; /* the load takes a deep copy */
    }
    load(f, "mnist_mlp", &v);
    kd_repository_close(repo);
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
    pthread_mutex_destroy(&f->log.mu);
}

/* ---- warnings ------------------------------------------------------------------------------ */

static void test_unbatched_model_is_logged_through_the_hook(void **state)
{
    (void)state;
    struct fixture f;
    fixture_open(&f, true, 0);
    load_fixture(&f, true);
    assert_int_equal(kd_sched_model_config(f.m)->max_batch_size, 0);
    assert_int_equal(lines_with(&f.log, KD_LOG_WARN, "model mnist_mlp version 1 is served unbatched",
                                "max_batch_size 64", "output 'logits' with shape [1, 10]", NULL),
                     1);
    fixture_close(&f);
}

static void copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    assert_non_null(in);
    assert_non_null(out);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        assert_int_equal(fwrite(buf, 1, n, out), n);
    fclose(in);
    assert_int_equal(fclose(out), 0);
}

/* A copy of the fixture model as "tuned" version 1, with a corrupt autotune.tsv beside it: the
 * load goes on, and the hook is told which model's file was passed over and why. */
static void test_corrupt_autotune_file_is_logged_through_the_hook(void **state)
{
    (void)state;
    char root[] = "/tmp/kiln-sched-worker-XXXXXX";
    assert_non_null(mkdtemp(root));
    char dir[256], path[320];
    snprintf(dir, sizeof dir, "%s/tuned", root);
    assert_int_equal(mkdir(dir, 0777), 0);
    snprintf(dir, sizeof dir, "%s/tuned/1", root);
    assert_int_equal(mkdir(dir, 0777), 0);
    snprintf(path, sizeof path, "%s/model.kiln", dir);
    copy_file(KILN_TEST_FIXTURES "/serving/mnist_mlp/1/model.kiln", path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    copy_file(KILN_TEST_FIXTURES "/serving/mnist_mlp/1/config.json", path);
    snprintf(path, sizeof path, "%s/autotune.tsv", dir);
    FILE *tune = fopen(path, "w");
    assert_non_null(tune);
    fputs("kiln-autotune 1\nnot four fields\n", tune);
    assert_int_equal(fclose(tune), 0);

    struct fixture f;
    fixture_open(&f, true, 0);
    kd_repository *repo = kd_repository_open(root);
    assert_non_null(repo);
    const kd_model_info *info = kd_repository_find(repo, "tuned");
    assert_non_null(info);
    load(&f, "tuned", &info->versions[0]);
    kd_repository_close(repo);
    assert_int_equal(lines_with(&f.log, KD_LOG_WARN, "model tuned version 1", "autotune.tsv", "corrupt", NULL), 1);
    fixture_close(&f);

    const char *files[] = {"model.kiln", "config.json", "autotune.tsv"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
    snprintf(dir, sizeof dir, "%s/tuned", root);
    rmdir(dir);
    rmdir(root);
}

/* A scheduler made without a hook (a program that keeps no log) still says it, on stderr. */
static void test_without_a_hook_warnings_go_to_stderr(void **state)
{
    (void)state;
    char path[] = "/tmp/kiln-sched-stderr-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    assert_true(saved >= 0);
    assert_true(dup2(fd, STDERR_FILENO) >= 0);

    struct fixture f;
    fixture_open(&f, false, 0);
    load_fixture(&f, true);
    fixture_close(&f);

    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    char text[4096] = "";
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    close(fd);
    unlink(path);
    assert_true(n > 0);
    text[n] = '\0';
    assert_non_null(strstr(text, "kilnd: warn: model mnist_mlp version 1 is served unbatched"));
}

/* ---- the idle trim ------------------------------------------------------------------------- */

struct infer {
    struct kd_sched_request r;
    bool done;
};

static void infer_done(struct kd_sched_request *r)
{
    struct infer *in = r->ud;
    in->done = true;
}

/* One request of 8 rows through the fixture model; its activations end in the device's pool. */
static void infer(struct fixture *f)
{
    struct infer in;
    memset(&in, 0, sizeof in);
    in.r.model = kd_sched_model_retain(f->m);
    in.r.ninputs = 1;
    struct kd_sched_tensor *t = &in.r.inputs[0];
    t->dtype = KILN_F32;
    t->ndim = 2;
    t->shape[0] = 8;
    t->shape[1] = 784;
    t->nbytes = 8 * 784 * sizeof(float);
    t->data = calloc(8 * 784, sizeof(float));
    assert_non_null(t->data);
    in.r.done = infer_done;
    in.r.ud = &in;
    assert_int_equal(kd_sched_submit(f->s, &in.r), 0);
    run_until(f, &in.done);
    assert_int_equal(in.r.outcome, KD_SCHED_OK);
    kd_sched_request_clear(&in.r);
    kd_sched_model_release(in.r.model);
}

static void read_memory(void *ctx, const char *spec, kiln_device *dev)
{
    (void)spec;
    if (kiln_device_memory_get(dev, ctx) != 0)
        fail_msg("kiln_device_memory_get: %s", kiln_error());
}

static uint64_t cached_bytes(struct fixture *f)
{
    kiln_device_memory m;
    memset(&m, 0, sizeof m);
    kd_sched_each_device(f->s, read_memory, &m);
    return m.cached_bytes;
}

static struct kd_sched_pool_stats pool_stats(struct fixture *f)
{
    struct kd_sched_pool_stats st;
    assert_int_equal(kd_sched_pool_stats(f->s, "cpu", &st), 0);
    return st;
}

static void nap_ms(long ms)
{
    nanosleep(&(struct timespec){.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000}, NULL);
}

/* Polls (up to a minute, however slow the machine) until a trim after `after` trims has left
 * the cpu pool empty. */
static void wait_for_trim(struct fixture *f, uint64_t after)
{
    for (int i = 0; i < 12000; i++) {
        struct kd_sched_pool_stats st = pool_stats(f);
        if (st.trims > after && cached_bytes(f) == 0)
            return;
        nap_ms(5);
    }
    fail_msg("no idle trim after %llu: %llu trims, %llu cached bytes", (unsigned long long)after,
             (unsigned long long)pool_stats(f).trims, (unsigned long long)cached_bytes(f));
}

static void test_idle_device_pool_is_trimmed(void **state)
{
    (void)state;
    struct fixture f;
    fixture_open(&f, true, 20);
    assert_int_equal(kd_sched_pool_stats(f.s, "cuda:7", &(struct kd_sched_pool_stats){0}), -1);
    load_fixture(&f, false);
    infer(&f);
    wait_for_trim(&f, 0);
    struct kd_sched_pool_stats st = pool_stats(&f);
    assert_true(st.released_bytes > 0);
    /* more work, another idle stretch, another trim */
    uint64_t trims = st.trims;
    infer(&f);
    wait_for_trim(&f, trims);
    assert_true(pool_stats(&f).released_bytes > st.released_bytes);
    fixture_close(&f);
}

/* The trim is the worker's only when nothing else uses its device: a training job holding it
 * keeps the pool (its steps reuse it), and the trim follows the job's end. */
static void test_training_job_defers_the_trim(void **state)
{
    (void)state;
    struct fixture f;
    fixture_open(&f, true, 20);
    load_fixture(&f, false);
    struct kd_sched_training t;
    assert_int_equal(kd_sched_training_begin(f.s, "cpu", NULL, &t), 0);
    infer(&f);
    uint64_t trims = pool_stats(&f).trims;
    assert_true(cached_bytes(&f) > 0);
    nap_ms(200); /* ten times the idle time: a trim would have come */
    assert_int_equal(pool_stats(&f).trims, trims);
    assert_true(cached_bytes(&f) > 0);
    kd_sched_training_end(&t);
    wait_for_trim(&f, trims);
    fixture_close(&f);
}

/* pool_idle_trim_ms 0: the pool keeps what inference freed. */
static void test_trim_off_keeps_the_pool(void **state)
{
    (void)state;
    struct fixture f;
    fixture_open(&f, true, 0);
    load_fixture(&f, false);
    infer(&f);
    assert_true(cached_bytes(&f) > 0);
    nap_ms(100);
    assert_int_equal(pool_stats(&f).trims, 0);
    assert_true(cached_bytes(&f) > 0);
    fixture_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unbatched_model_is_logged_through_the_hook),
        cmocka_unit_test(test_corrupt_autotune_file_is_logged_through_the_hook),
        cmocka_unit_test(test_without_a_hook_warnings_go_to_stderr),
        cmocka_unit_test(test_idle_device_pool_is_trimmed),
        cmocka_unit_test(test_training_job_defers_the_trim),
        cmocka_unit_test(test_trim_off_keeps_the_pool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
