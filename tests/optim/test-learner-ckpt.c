/*
 * tests/optim/test-learner-ckpt.c — what a Learner's checkpoint holds and what a resume
 * from it reports (suite 'training'):
 *   - a finished run resumed reports the same final metrics and confusion matrix (they used
 *     to read NaN and zeros: the resume restored neither);
 *   - the model record's config is the model's JSON spec, from which kiln_model_from_json and
 *     the record's tensors rebuild a model giving the trained one's outputs;
 *   - a damaged newest checkpoint passed over for an older one is reported, with its reason,
 *     on the learner's progress stream;
 *   - a checkpoint of another model is refused naming the first tensor that differs and both
 *     shapes, not a count of modules.
 *
 *     learner-ckpt [device]   (default "cpu?threads=1")
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <cjson/cJSON.h>

#include "kiln/kiln.h"
#include "kiln/record.h"

#include "learner-fixture.h"

static const char MLP[] =
    "{\"inputs\": [\"x\"], \"nodes\": ["
    "{\"name\": \"fc1\", \"layer\": \"Linear\", \"config\": {\"in_features\": 4, \"out_features\": 16}, "
    "\"inputs\": [\"x\"]},"
    "{\"name\": \"a\", \"op\": \"relu\", \"inputs\": [\"fc1\"]},"
    "{\"name\": \"fc2\", \"layer\": \"Linear\", \"config\": {\"in_features\": 16, \"out_features\": 3}, "
    "\"inputs\": [\"a\"]}"
    "], \"outputs\": [\"fc2\"]}";

/* The same names with another width: fc1.weight is [8, 4] here, [16, 4] in MLP. */
static const char NARROW_MLP[] =
    "{\"inputs\": [\"x\"], \"nodes\": ["
    "{\"name\": \"fc1\", \"layer\": \"Linear\", \"config\": {\"in_features\": 4, \"out_features\": 8}, "
    "\"inputs\": [\"x\"]},"
    "{\"name\": \"a\", \"op\": \"relu\", \"inputs\": [\"fc1\"]},"
    "{\"name\": \"fc2\", \"layer\": \"Linear\", \"config\": {\"in_features\": 8, \"out_features\": 3}, "
    "\"inputs\": [\"a\"]}"
    "], \"outputs\": [\"fc2\"]}";

/* A small CNN: more modules than MLP (conv, pool, fc and the root), other tensor names. */
static const char CNN[] =
    "{\"inputs\": [\"x\"], \"nodes\": ["
    "{\"name\": \"seq\", \"op\": \"reshape\", \"shape\": [-1, 1, 4], \"inputs\": [\"x\"]},"
    "{\"name\": \"conv\", \"layer\": \"Conv1d\", \"config\": {\"in_channels\": 1, \"out_channels\": 2, "
    "\"kernel_size\": 3, \"padding\": 1}, \"inputs\": [\"seq\"]},"
    "{\"name\": \"pool\", \"layer\": \"MaxPool1d\", \"config\": {\"kernel_size\": 2}, \"inputs\": [\"conv\"]},"
    "{\"name\": \"flat\", \"op\": \"flatten\", \"inputs\": [\"pool\"]},"
    "{\"name\": \"fc\", \"layer\": \"Linear\", \"config\": {\"in_features\": 4, \"out_features\": 3}, "
    "\"inputs\": [\"flat\"]}"
    "], \"outputs\": [\"fc\"]}";

static int setup(void **state)
{
    (void)state;
    return learner_fixture_open(96, 40, "learner-ckpt");
}

typedef struct run {
    kiln_module *m;
    kiln_optim *o;
    kiln_loader *tl, *vl;
    kiln_learner *L;
} run;

static void make_run(run *r, const char *net, const char *ckdir, int64_t epochs, FILE *progress)
{
    memset(r, 0, sizeof *r);
    kiln_generator g = kiln_generator_make(11);
    r->m = kiln_model_from_json(net, dev, &g);
    assert_non_null(r->m);
    kiln_optim_config oc = kiln_optim_config_default(KILN_OPTIM_ADAM);
    oc.lr = 0.01;
    r->o = kiln_optim_create_module(&oc, r->m);
    kiln_loader_config lc = kiln_loader_config_default();
    lc.batch_size = 16;
    lc.seed = 3;
    r->tl = kiln_loader_create(train_ds, &lc, dev);
    lc.shuffle = false;
    r->vl = kiln_loader_create(valid_ds, &lc, dev);
    kiln_learner_config c = kiln_learner_config_default();
    c.epochs = epochs;
    c.num_classes = 3;
    c.topk = 2;
    c.seed = 99;
    c.checkpoint_dir = ckdir;
    c.keep_last = 10;
    c.best_metric = "valid_accuracy";
    c.progress = progress;
    r->L = kiln_learner_create(&c, r->m, r->o, NULL, r->tl, r->vl);
    if (!r->L)
        fail_msg("learner_create: %s", kiln_error());
}

static void free_run(run *r)
{
    kiln_learner_free(r->L);
    kiln_loader_free(r->tl);
    kiln_loader_free(r->vl);
    kiln_optim_free(r->o);
    kiln_module_free(r->m);
}

static void path_in_root(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", root, name);
}

static const char *const METRICS[] = {
    "epoch",           "train_loss",   "train_accuracy", "valid_loss", "valid_accuracy", "valid_top2_accuracy",
    "valid_precision", "valid_recall", "valid_f1",       "lr",         "items_per_sec",  "epoch_seconds",
    "peak_rss_mb"};
enum {
    NMETRICS = sizeof METRICS / sizeof *METRICS
};

/* The report's "valid_confusion" as compact JSON (malloc'd). */
static char *confusion_of(const kiln_learner *L)
{
    char *report = kiln_learner_report_json(L);
    assert_non_null(report);
    cJSON *r = cJSON_Parse(report);
    const cJSON *cm = cJSON_GetObjectItemCaseSensitive(r, "valid_confusion");
    assert_true(cJSON_IsArray(cm));
    char *text = cJSON_PrintUnformatted(cm);
    cJSON_Delete(r);
    free(report);
    return text;
}

/* Two epochs, then the same command resumed: fit has nothing left to train, and the metrics
 * and the confusion matrix are the finished run's, bit for bit. */
static void test_finished_run_resumed_keeps_metrics(void **state)
{
    (void)state;
    char dir[300];
    path_in_root(dir, sizeof dir, "finished");
    run r;
    make_run(&r, MLP, dir, 2, NULL);
    assert_int_equal(kiln_learner_fit(r.L), 0);
    double want[NMETRICS];
    for (int i = 0; i < NMETRICS; i++) {
        want[i] = kiln_learner_metric(r.L, METRICS[i]);
        if (!isfinite(want[i]))
            fail_msg("the run recorded no %s", METRICS[i]);
    }
    char *want_cm = confusion_of(r.L);
    assert_non_null(strstr(want_cm, "[[")); /* 3 rows of counts */
    assert_null(strstr(want_cm, "[[0,0,0],[0,0,0],[0,0,0]]"));
    free_run(&r);

    make_run(&r, MLP, dir, 2, NULL);
    if (kiln_learner_resume(r.L, dir) < 0)
        fail_msg("resume: %s", kiln_error());
    assert_int_equal(kiln_learner_epoch(r.L), 2);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < NMETRICS; i++) {
            /* the history keeps numbers as cJSON prints them: 15 digits where those read back
             * within its epsilon, so a value may come back one or two ulps away */
            double got = kiln_learner_metric(r.L, METRICS[i]);
            if (!(fabs(got - want[i]) <= 1e-14 * fabs(want[i])))
                fail_msg("%s %s: %.17g, the finished run reported %.17g", pass ? "after fit" : "resumed",
                         METRICS[i], got, want[i]);
        }
        char *got_cm = confusion_of(r.L);
        assert_string_equal(got_cm, want_cm);
        free(got_cm);
        if (pass == 0) {
            assert_int_equal(kiln_learner_fit(r.L), 0);
            assert_string_equal(kiln_learner_stop_reason(r.L), "completed");
            assert_int_equal(kiln_learner_epoch(r.L), 2);
        }
    }
    free(want_cm);
    free_run(&r);
}

/* The checkpoint alone makes the model: its spec from the record's config, its tensors from
 * the record, and the same outputs as the model that trained. */
static void test_checkpoint_holds_model_spec(void **state)
{
    (void)state;
    char dir[300];
    path_in_root(dir, sizeof dir, "spec");
    run r;
    make_run(&r, MLP, dir, 1, NULL);
    assert_int_equal(kiln_learner_fit(r.L), 0);
    kiln_ckpt *ck = kiln_ckpt_open_latest(dir, NULL, NULL);
    assert_non_null(ck);
    const kiln_record *rec = kiln_ckpt_model(ck);
    const char *spec = kiln_record_config(rec);
    kiln_generator g = kiln_generator_make(500);
    kiln_module *m = kiln_model_from_json(spec, dev, &g);
    if (!m)
        fail_msg("the checkpoint's model config \"%.80s\" builds no model: %s", spec, kiln_error());
    const kiln_safetensors *st = kiln_record_tensors(rec);
    int n = kiln_safetensors_count(st);
    const char *names[8];
    kiln_tensor *ts[8];
    assert_true(n == 4);
    for (int i = 0; i < n; i++) {
        names[i] = kiln_safetensors_name(st, i);
        ts[i] = kiln_safetensors_load(st, names[i], dev);
        assert_non_null(ts[i]);
    }
    assert_int_equal(kiln_module_load_state_dict(m, n, names, ts, true, NULL), 0);
    kiln_module_train(m, false);
    kiln_module_train(r.m, false);
    kiln_scope_begin();
    kiln_generator xg = kiln_generator_make(8);
    kiln_tensor *x = kiln_rand_normal(dev, KILN_F32, KILN_SHAPE(5, 4), 0, 1, &xg);
    float want[15], got[15];
    assert_int_equal(kiln_to_data(kiln_module_forward(r.m, x), want, sizeof want), 0);
    assert_int_equal(kiln_to_data(kiln_module_forward(m, x), got, sizeof got), 0);
    assert_memory_equal(got, want, sizeof want);
    kiln_scope_end();
    for (int i = 0; i < n; i++)
        kiln_tensor_release(ts[i]);
    kiln_module_free(m);
    kiln_ckpt_close(ck);
    free_run(&r);
}

/* Flip one byte of the newest checkpoint's optimizer record: the resume continues from the
 * epoch before and says which checkpoint it passed over and why. */
static void test_damaged_newest_is_reported(void **state)
{
    (void)state;
    char dir[300];
    path_in_root(dir, sizeof dir, "damaged");
    run r;
    make_run(&r, MLP, dir, 2, NULL);
    assert_int_equal(kiln_learner_fit(r.L), 0);
    int64_t last = kiln_learner_step(r.L);
    free_run(&r);
    char newest[400], file[450];
    snprintf(newest, sizeof newest, "%s/step-%09lld", dir, (long long)last);
    snprintf(file, sizeof file, "%s/optimizer.kiln", newest);
    FILE *f = fopen(file, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, 40, SEEK_SET), 0);
    int c = fgetc(f);
    assert_int_equal(fseek(f, 40, SEEK_SET), 0);
    fputc(c ^ 0x5a, f);
    fclose(f);

    FILE *note = tmpfile();
    assert_non_null(note);
    make_run(&r, MLP, NULL, 2, note);
    if (kiln_learner_resume(r.L, dir) < 0)
        fail_msg("resume: %s", kiln_error());
    assert_int_equal(kiln_learner_epoch(r.L), 1);
    char text[4096] = {0};
    rewind(note);
    size_t got = fread(text, 1, sizeof text - 1, note);
    text[got] = 0;
    char want[500];
    snprintf(want, sizeof want, "passed over %s: ", newest);
    if (!strstr(text, want) || !strstr(text, "optimizer.kiln"))
        fail_msg("the notes do not report %s and its damaged file:\n%s", newest, text);
    fclose(note);
    free_run(&r);
}

static void expect_refused(const char *net, const char *dir, const char *const *needles, const char *absent)
{
    run r;
    make_run(&r, net, NULL, 2, NULL);
    assert_int_equal(kiln_learner_resume(r.L, dir), -1);
    for (int i = 0; needles[i]; i++)
        if (!strstr(kiln_error(), needles[i]))
            fail_msg("error \"%s\" lacks \"%s\"", kiln_error(), needles[i]);
    if (absent && strstr(kiln_error(), absent))
        fail_msg("error \"%s\" should not be about \"%s\"", kiln_error(), absent);
    assert_int_equal(kiln_learner_epoch(r.L), 0);
    free_run(&r);
}

/* An MLP's checkpoint resumed into a CNN (or an MLP of another width) names the first model
 * tensor that differs with both shapes, where it used to speak of generator counts. */
static void test_other_model_names_the_tensor(void **state)
{
    (void)state;
    char dir[300];
    path_in_root(dir, sizeof dir, "mlp");
    run r;
    make_run(&r, MLP, dir, 1, NULL);
    assert_int_equal(kiln_learner_fit(r.L), 0);
    free_run(&r);
    expect_refused(CNN, dir,
                   (const char *const[]){"model tensor 'conv.weight' f32[2, 1, 3] is not in the checkpoint",
                                         "(whose tensors include 'fc", "not in the model)", NULL},
                   "generators");
    expect_refused(NARROW_MLP, dir,
                   (const char *const[]){"'fc1.weight': checkpoint f32[16, 4], model f32[8, 4]", NULL}, NULL);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        dev_spec = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_finished_run_resumed_keeps_metrics),
        cmocka_unit_test(test_checkpoint_holds_model_spec),
        cmocka_unit_test(test_damaged_newest_is_reported),
        cmocka_unit_test(test_other_model_names_the_tensor),
    };
    return cmocka_run_group_tests_name("learner-ckpt", tests, setup, learner_fixture_close);
}
