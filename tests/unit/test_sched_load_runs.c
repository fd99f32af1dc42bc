/*
 * tests/unit/test_sched_load_runs.c — how often a load runs an ONNX model on zeros (its dry runs),
 * counted on a counting device ("counting:cpu"): a run of these graphs makes one matmul, so the
 * device's matmul calls during a load are the load's runs (an inference first shows what one run
 * costs there).
 *
 *   - a model that batches runs three times, whether config.json lists its outputs or not: the
 *     batching check's runs (batch 2 and 3) also give the outputs, with one at batch 1, where an
 *     output may lose a dim (a Squeeze without axes: refused, as before);
 *   - one that does not batch runs twice (every free dim at 1, then at 2), listed outputs or not;
 *   - the loads of a model's other instances run nothing;
 *   - a model whose inputs have a free dim beside the batch (a sequence) and whose outputs are
 *     not listed runs four times: the batch runs hold that dim at 1, so one run more learns
 *     which outputs follow it; with the outputs listed it runs three times, and a fourth only
 *     where config.json fixes a dim the batch runs saw at 1.
 *
 *   - a model that fails at batch 2 runs twice (batch 1, then 2): refused with the message that
 *     says to list its outputs, or, with them listed, served unbatched.
 *
 * The models are written here: "dense" (x [batch, 4] · w [4, 3] -> y), "tokens" (the same y,
 * and z = t + t for an input t [batch, seq]) and "one row" (y reshaped to [1, 3]).
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
#include <sys/stat.h>

#include "sched-loop-util.h"
#include "scheduler.h"
#include "tests/onnx/onnx-build.h"

/* ---- the models, written into a repository folder ----------------------------------------- */

/* A graph value (field 11: an input, 12: an output) of type FLOAT whose dims are sizes, or -1
 * for a symbolic dim named names[d]. */
static void typed_value(pb *g, int field, const char *name, int ndim, const int64_t *dims,
                        const char *const *names)
{
    pb shape = {.n = 0}, tt = {.n = 0}, ty = {.n = 0}, vi = {.n = 0};
    for (int i = 0; i < ndim; i++) {
        pb d = {.n = 0};
        if (dims[i] >= 0)
            pb_int(&d, 1, (uint64_t)dims[i]);
        else
            pb_str(&d, 2, names[i]);
        pb_msg(&shape, 1, &d);
    }
    pb_int(&tt, 1, OB_FLOAT);
    pb_msg(&tt, 2, &shape);
    pb_msg(&ty, 1, &tt);
    pb_str(&vi, 1, name);
    pb_msg(&vi, 2, &ty);
    pb_msg(g, field, &vi);
}

static void input(pb *g, const char *name, int ndim, const int64_t *dims, const char *const *names)
{
    typed_value(g, 11, name, ndim, dims, names);
}

enum kind {
    DENSE,
    TOKENS,       /* with the sequence input t and its output z beside y */
    BATCH_OF_ONE, /* y reshaped to [1, 3]: a run at any other batch fails */
    SQUEEZED,     /* y squeezed without axes: [3] at batch 1, [batch, 3] above */
    PAIRS         /* y reshaped to [-1, 6], declared so: only even batches run */
};

static void write_model(const char *path, enum kind kind)
{
    static pb g, m;
    g.n = 0;
    const int64_t xd[2] = {-1, 4}, td[2] = {-1, -1}, wd[2] = {4, 3}, two = 2, one_row[2] = {1, 3},
                  pairs[2] = {-1, 6};
    const float w[12] = {1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1};
    input(&g, "x", 2, xd, (const char *[]){"batch", NULL});
    if (kind == TOKENS)
        input(&g, "t", 2, td, (const char *[]){"batch", "seq"});
    ob_init(&g, "w", OB_FLOAT, 2, wd, w, sizeof w);
    if (kind == BATCH_OF_ONE) {
        ob_init(&g, "one_row", OB_INT64, 1, &two, one_row, sizeof one_row);
        ob_node(&g, "MatMul", "project", (const char *[]){"x", "w", NULL}, (const char *[]){"p", NULL}, NULL);
        ob_node(&g, "Reshape", "to_one_row", (const char *[]){"p", "one_row", NULL}, (const char *[]){"y", NULL},
                NULL);
    } else if (kind == PAIRS) {
        ob_init(&g, "pairs", OB_INT64, 1, &two, pairs, sizeof pairs);
        ob_node(&g, "MatMul", "project", (const char *[]){"x", "w", NULL}, (const char *[]){"p", NULL}, NULL);
        ob_node(&g, "Reshape", "to_pairs", (const char *[]){"p", "pairs", NULL}, (const char *[]){"y", NULL},
                NULL);
    } else if (kind == SQUEEZED) {
        ob_node(&g, "MatMul", "project", (const char *[]){"x", "w", NULL}, (const char *[]){"p", NULL}, NULL);
        ob_node(&g, "Squeeze", "drop_ones", (const char *[]){"p", NULL}, (const char *[]){"y", NULL}, NULL);
    } else {
        ob_node(&g, "MatMul", "project", (const char *[]){"x", "w", NULL}, (const char *[]){"y", NULL}, NULL);
    }
    if (kind == PAIRS)
        typed_value(&g, 12, "y", 2, pairs, (const char *[]){"half", NULL});
    else
        ob_output(&g, "y");
    if (kind == TOKENS) {
        ob_node(&g, "Add", "twice", (const char *[]){"t", "t", NULL}, (const char *[]){"z", NULL}, NULL);
        ob_output(&g, "z");
    }
    ob_model(&m, &g, 17);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(m.b, 1, m.n, f), m.n);
    assert_int_equal(fclose(f), 0);
}

static const char *const X = "{\"name\": \"x\", \"datatype\": \"FP32\", \"shape\": [-1, 4]}";
static const char *const T = "{\"name\": \"t\", \"datatype\": \"FP32\", \"shape\": [-1, -1]}";
static const char *const Y = "{\"name\": \"y\", \"datatype\": \"FP32\", \"shape\": [-1, 3]}";
static const char *const Z = "{\"name\": \"z\", \"datatype\": \"FP32\", \"shape\": [-1, -1]}";

static char root[] = "/tmp/kiln-load-runs-XXXXXX";

/* Version 1 of name: the model, and a config.json of the keys in config (printf-style) on the
 * scheduler's device. */
static void add_model(const char *name, enum kind kind, const char *config, ...)
{
    char dir[256], path[320];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    assert_int_equal(mkdir(dir, 0777), 0);
    snprintf(dir, sizeof dir, "%s/%s/1", root, name);
    assert_int_equal(mkdir(dir, 0777), 0);
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    write_model(path, kind);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    char keys[1024];
    va_list ap;
    va_start(ap, config);
    vsnprintf(keys, sizeof keys, config, ap);
    va_end(ap);
    fprintf(f, "{\"device\": \"counting:cpu\"%s%s}", keys[0] ? ", " : "", keys);
    assert_int_equal(fclose(f), 0);
}

static void remove_models(void)
{
    static const char *const names[] = {"learned",
                                        "declared",
                                        "declared_wrong",
                                        "unbatched",
                                        "declared_unbatched",
                                        "instances",
                                        "tokens_learned",
                                        "tokens_declared",
                                        "tokens_fixed_seq",
                                        "one_row_learned",
                                        "one_row_declared",
                                        "squeezed",
                                        "pairs"};
    char path[320];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s/1/model.onnx", root, names[i]);
        unlink(path);
        snprintf(path, sizeof path, "%s/%s/1/config.json", root, names[i]);
        unlink(path);
        snprintf(path, sizeof path, "%s/%s/1", root, names[i]);
        rmdir(path);
        snprintf(path, sizeof path, "%s/%s", root, names[i]);
        rmdir(path);
    }
    rmdir(root);
}

/* ---- a scheduler on counting:cpu ----------------------------------------------------------- */

struct fixture {
    uv_loop_t loop;
    uv_timer_t tick; /* keeps the loop polling while a test waits on it */
    struct kd_sched *s;
    kd_repository *repo;
    struct kd_sched_model *m;
    bool loaded;
    char why[512]; /* why the last load failed */
};

static struct fixture fx;

static void run_until(const bool *flag)
{
    sched_test_run_until(&fx.loop, &fx.tick, flag);
}

static void on_loaded(void *ud, struct kd_sched_model *m, const char *why)
{
    (void)ud;
    snprintf(fx.why, sizeof fx.why, "%s", m ? "" : why);
    fx.m = m;
    fx.loaded = true;
}

static void read_matmuls(void *ctx, const char *spec, kiln_device *dev)
{
    (void)spec;
    kiln_device_counters c;
    if (kiln_device_counters_get(dev, &c, "matmul", ctx) != 0)
        fail_msg("kiln_device_counters_get: %s", kiln_error());
}

static uint64_t matmuls(void)
{
    uint64_t n = 0;
    kd_sched_each_device(fx.s, read_matmuls, &n);
    return n;
}

/* Loads version 1 of name (replacing the model loaded before) and returns the matmul calls the
 * load made; a load that fails leaves fx.m NULL and says why in fx.why. */
static uint64_t try_load(const char *name)
{
    if (fx.m)
        kd_sched_model_release(fx.m);
    fx.m = NULL;
    const kd_model_info *info = kd_repository_find(fx.repo, name);
    assert_non_null(info);
    uint64_t before = matmuls();
    fx.loaded = false;
    assert_int_equal(kd_sched_model_load(fx.s, name, &info->versions[0], on_loaded, NULL), 0);
    run_until(&fx.loaded);
    return matmuls() - before;
}

static uint64_t load(const char *name)
{
    uint64_t calls = try_load(name);
    if (!fx.m)
        fail_msg("load %s failed: %s", name, fx.why);
    return calls;
}

struct infer {
    struct kd_sched_request r;
    bool done;
};

static void infer_done(struct kd_sched_request *r)
{
    ((struct infer *)r->ud)->done = true;
}

/* The matmul calls of one run of the dense model (the one loaded), through an inference. */
static uint64_t matmuls_of_one_run(void)
{
    struct infer in;
    memset(&in, 0, sizeof in);
    in.r.model = kd_sched_model_retain(fx.m);
    in.r.ninputs = 1;
    struct kd_sched_tensor *t = &in.r.inputs[0];
    t->dtype = KILN_F32;
    t->ndim = 2;
    t->shape[0] = 1;
    t->shape[1] = 4;
    t->nbytes = 4 * sizeof(float);
    t->data = calloc(4, sizeof(float));
    assert_non_null(t->data);
    in.r.done = infer_done;
    in.r.ud = &in;
    uint64_t before = matmuls();
    assert_int_equal(kd_sched_submit(fx.s, &in.r), 0);
    run_until(&in.done);
    assert_int_equal(in.r.outcome, KD_SCHED_OK);
    kd_sched_request_clear(&in.r);
    kd_sched_model_release(in.r.model);
    return matmuls() - before;
}

static int setup(void **state)
{
    (void)state;
    assert_non_null(mkdtemp(root));
    add_model("learned", DENSE, "\"max_batch_size\": 4");
    add_model("declared", DENSE, "\"inputs\": [%s], \"outputs\": [%s], \"max_batch_size\": 4", X, Y);
    add_model(
        "declared_wrong", DENSE,
        "\"outputs\": [{\"name\": \"y\", \"datatype\": \"FP32\", \"shape\": [-1, 7]}], \"max_batch_size\": 4");
    add_model("unbatched", DENSE, "");
    add_model("declared_unbatched", DENSE, "\"inputs\": [%s], \"outputs\": [%s]", X, Y);
    add_model("instances", DENSE, "\"max_batch_size\": 4, \"instance_count\": 3");
    add_model("tokens_learned", TOKENS, "\"max_batch_size\": 4");
    add_model("tokens_declared", TOKENS, "\"inputs\": [%s, %s], \"outputs\": [%s, %s], \"max_batch_size\": 4", X,
              T, Y, Z);
    /* z declared with its seq dim fixed (5): the batch runs give 1 there, one run more shows it
     * follows seq, and a dim that varies fits any declared size */
    add_model(
        "tokens_fixed_seq", TOKENS,
        "\"outputs\": [%s, {\"name\": \"z\", \"datatype\": \"FP32\", \"shape\": [-1, 5]}], \"max_batch_size\": 4",
        Y);
    add_model("one_row_learned", BATCH_OF_ONE, "\"max_batch_size\": 4");
    add_model("squeezed", SQUEEZED, "\"max_batch_size\": 4");
    add_model("pairs", PAIRS, "\"max_batch_size\": 4");
    add_model(
        "one_row_declared", BATCH_OF_ONE,
        "\"outputs\": [{\"name\": \"y\", \"datatype\": \"FP32\", \"shape\": [1, 3]}], \"max_batch_size\": 4");

    memset(&fx, 0, sizeof fx);
    assert_int_equal(uv_loop_init(&fx.loop), 0);
    uv_timer_init(&fx.loop, &fx.tick);
    const char *devs[] = {"counting:cpu"};
    struct kd_sched_options o = {
        .loop = &fx.loop,
        .devices = devs,
        .ndevices = 1,
        .workers_per_device = 1,
        .max_queue = 16,
        .training_max_wait_ms = 100,
    };
    char err[256];
    assert_int_equal(kd_sched_new(&fx.s, &o, err, sizeof err), 0);
    fx.repo = kd_repository_open(root);
    assert_non_null(fx.repo);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kd_sched_stop(fx.s);
    if (fx.m)
        kd_sched_model_release(fx.m);
    kd_sched_close(fx.s);
    uv_close((uv_handle_t *)&fx.tick, NULL);
    uv_run(&fx.loop, UV_RUN_DEFAULT);
    kd_sched_destroy(fx.s);
    assert_int_equal(uv_loop_close(&fx.loop), 0);
    kd_repository_close(fx.repo);
    remove_models();
    return 0;
}

/* ---- the counts ---------------------------------------------------------------------------- */

/* The matmul calls of one run, learned once through an inference of the dense model. */
static uint64_t per_run(void)
{
    static uint64_t calls;
    if (!calls) {
        load("learned");
        calls = matmuls_of_one_run();
        assert_true(calls > 0);
    }
    return calls;
}

/* The dry runs of loading name (whether the load succeeds or not). */
static uint64_t runs_of(const char *name)
{
    uint64_t one = per_run(), calls = try_load(name);
    assert_int_equal(calls % one, 0);
    fprintf(stderr, "  %s: %llu dry run(s) at load\n", name, (unsigned long long)(calls / one));
    return calls / one;
}

static void test_a_model_that_batches_runs_three_times(void **state)
{
    (void)state;
    /* (a) outputs learned: the runs at batch 2 and 3 give them and the check's verdict, with one
     * at batch 1 */
    assert_int_equal(runs_of("learned"), 3);
    const kd_model_config *c = kd_sched_model_config(fx.m);
    assert_int_equal(c->max_batch_size, 4);
    assert_int_equal(c->noutputs, 1);
    assert_int_equal(c->outputs[0].ndim, 2);
    assert_int_equal(c->outputs[0].shape[0], -1);
    assert_int_equal(c->outputs[0].shape[1], 3);
    /* (b) outputs listed: the same runs check them */
    assert_int_equal(runs_of("declared"), 3);
    assert_int_equal(kd_sched_model_config(fx.m)->max_batch_size, 4);
    assert_int_equal(runs_of("declared_wrong"), 3);
    assert_null(fx.m);
    assert_string_equal(fx.why,
                        "config.json output 'y' has shape [-1, 7]; model.onnx gives [-1, 3] (-1: varies with "
                        "the input)");
}

static void test_a_model_that_does_not_batch_runs_twice(void **state)
{
    (void)state;
    /* (c) the outputs' dims at 1 and 2, listed or not */
    assert_int_equal(runs_of("unbatched"), 2);
    assert_int_equal(kd_sched_model_config(fx.m)->max_batch_size, 0);
    assert_int_equal(runs_of("declared_unbatched"), 2);
}

static void test_other_instances_run_nothing(void **state)
{
    (void)state;
    assert_int_equal(runs_of("instances"), 3);
    assert_int_equal(kd_sched_model_config(fx.m)->max_batch_size, 4);
}

static void test_a_sequence_dim_takes_one_run_more_to_learn(void **state)
{
    (void)state;
    assert_int_equal(runs_of("tokens_learned"), 4);
    const kd_model_config *c = kd_sched_model_config(fx.m);
    assert_int_equal(c->max_batch_size, 4);
    assert_int_equal(c->noutputs, 2);
    assert_string_equal(c->outputs[1].name, "z");
    assert_int_equal(c->outputs[1].shape[0], -1);
    assert_int_equal(c->outputs[1].shape[1], -1); /* follows seq, which the batch runs hold at 1 */
    assert_int_equal(runs_of("tokens_declared"), 3);
    assert_int_equal(kd_sched_model_config(fx.m)->max_batch_size, 4);
    assert_int_equal(runs_of("tokens_fixed_seq"), 4);
    assert_non_null(fx.m);
    assert_int_equal(kd_sched_model_config(fx.m)->max_batch_size, 4);
}

/* A model that fails at a batch above 1: the run at batch 2 says so for both purposes, after
 * the one at batch 1. */
static void test_a_model_that_fails_at_batch_2_says_so(void **state)
{
    (void)state;
    /* outputs not listed: refused, saying how to load it */
    assert_int_equal(runs_of("one_row_learned"), 2);
    assert_null(fx.m);
    assert_non_null(
        strstr(fx.why, "model.onnx dry run on zeros (to learn its outputs; or list them in config.json)"));
    assert_non_null(strstr(fx.why, "to_one_row"));
    /* outputs listed: served unbatched (the warning names the run at batch 2) */
    assert_int_equal(runs_of("one_row_declared"), 2);
    assert_non_null(fx.m);
    assert_int_equal(kd_sched_model_config(fx.m)->max_batch_size, 0);
}

/* A graph no dry run at sizes 1 and 2 runs (only even batches do) that declares its output:
 * served with the output as declared, unbatched (the run at batch 3 fails too), where it had
 * been refused; config.json lists nothing. */
static void test_outputs_taken_as_declared_when_runs_fail(void **state)
{
    (void)state;
    runs_of("pairs");
    if (!fx.m)
        fail_msg("pairs refused: %s", fx.why);
    const kd_model_config *c = kd_sched_model_config(fx.m);
    assert_int_equal(c->noutputs, 1);
    assert_string_equal(c->outputs[0].name, "y");
    assert_string_equal(c->outputs[0].datatype, "FP32");
    assert_int_equal(c->outputs[0].ndim, 2);
    assert_int_equal(c->outputs[0].shape[0], -1);
    assert_int_equal(c->outputs[0].shape[1], 6);
    assert_int_equal(c->max_batch_size, 0);
}

/* An output that loses a dim at batch 1 only (a Squeeze without axes): the batcher runs single
 * rows, so the run at batch 1 is kept to refuse it. */
static void test_a_rank_change_at_batch_1_is_refused(void **state)
{
    (void)state;
    assert_int_equal(runs_of("squeezed"), 3);
    assert_null(fx.m);
    assert_non_null(strstr(fx.why, "output 'y' changes rank with the input size"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_model_that_batches_runs_three_times),
        cmocka_unit_test(test_a_model_that_does_not_batch_runs_twice),
        cmocka_unit_test(test_other_instances_run_nothing),
        cmocka_unit_test(test_a_sequence_dim_takes_one_run_more_to_learn),
        cmocka_unit_test(test_a_model_that_fails_at_batch_2_says_so),
        cmocka_unit_test(test_a_rank_change_at_batch_1_is_refused),
        cmocka_unit_test(test_outputs_taken_as_declared_when_runs_fail),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
