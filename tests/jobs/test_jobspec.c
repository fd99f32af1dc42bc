/*
 * tests/jobs/test_jobspec.c — the job spec's checks (scheduler/trainer.h) in-process: what a
 * submission is refused for, every problem at once, before anything trains.
 *
 *   the device: one of the devices kilnd drives (a real scheduler's workers), by configured
 *     spelling or the device's own name, kept as configured; none given takes the first;
 *   settings that would be ignored: grad_accum's value, an optimizer's or scheduler's setting
 *     of another kind, a loss kind that is not a name;
 *   what only a dry run shows: nesterov without momentum, a model whose first Linear does not
 *     take the data's items, fewer class scores than the data has classes (IDX labels), wider
 *     ones (fine), a CSV's feature count from its header line;
 *   register_as past the name length limit.
 *
 * The data are tiny files written to a temporary folder: an IDX pair in the Fashion-MNIST layout
 * (two 28x28 images, labels 0 and 9) and a CSV of four features.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <zlib.h>

#include "scheduler.h"
#include "trainer.h"

static char root[] = "/tmp/kiln-jobspec-XXXXXX";
static char fashion[300], csv[300], three_labels[300];

static void write_gz(const char *path, const unsigned char *header, size_t hlen, const unsigned char *data,
                     size_t dlen)
{
    gzFile f = gzopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(gzwrite(f, header, (unsigned)hlen), (int)hlen);
    assert_int_equal(gzwrite(f, data, (unsigned)dlen), (int)dlen);
    assert_int_equal(gzclose(f), Z_OK);
}

static int make_data(void **state)
{
    (void)state;
    if (!mkdtemp(root))
        return -1;
    snprintf(fashion, sizeof fashion, "%s/fashion", root);
    snprintf(csv, sizeof csv, "%s/four.csv", root);
    char path[400];
    if (mkdir(fashion, 0755) != 0)
        return -1;
    static const unsigned char images[] = {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 28, 0, 0, 0, 28};
    static const unsigned char labels[] = {0, 0, 8, 1, 0, 0, 0, 2};
    static unsigned char pixels[2 * 28 * 28];
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", fashion);
    write_gz(path, images, sizeof images, pixels, sizeof pixels);
    snprintf(path, sizeof path, "%s/train-labels-idx1-ubyte.gz", fashion);
    write_gz(path, labels, sizeof labels, (const unsigned char[]){0, 9}, 2);
    snprintf(three_labels, sizeof three_labels, "%s/three-labels-idx1-ubyte.gz", root);
    static const unsigned char three[] = {0, 0, 8, 1, 0, 0, 0, 3};
    write_gz(three_labels, three, sizeof three, (const unsigned char[]){0, 1, 2}, 3);
    FILE *f = fopen(csv, "w");
    if (!f)
        return -1;
    fputs("a,b,c,d,label\n1,2,3,4,0\n4,3,2,1,2\n", f);
    return fclose(f);
}

static int remove_data(void **state)
{
    (void)state;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : -1;
}

/* A Linear of in features to out class scores after a flatten, as a model spec. */
static void linear_model(char *out, size_t len, int in, int width)
{
    snprintf(out, len,
             "{\"inputs\": [\"x\"], \"nodes\": ["
             "{\"name\": \"flat\", \"op\": \"flatten\", \"start_dim\": 1, \"end_dim\": -1, \"inputs\": [\"x\"]},"
             "{\"name\": \"fc\", \"layer\": \"Linear\", \"config\": {\"in_features\": %d, \"out_features\": %d}, "
             "\"inputs\": [\"flat\"]}], \"outputs\": [\"fc\"]}",
             in, width);
}

/* A spec of model on Fashion-MNIST-shaped data, with the extra fields given ("" for none). */
static void fashion_spec(char *out, size_t len, const char *model, const char *extra)
{
    snprintf(out, len, "{\"model\": %s, \"data\": {\"type\": \"fashion_mnist\", \"path\": \"%s\"}%s%s}", model,
             fashion, *extra ? ", " : "", extra);
}

/* Parsed (and, when it parses, checked as a submission is); the problems, "" when none. */
static int submit(const char *json, struct kd_jobspec *s, char *problems, size_t len)
{
    const char *roots[] = {root};
    struct kd_jobspec_env env = {roots, 1, NULL, true, NULL, NULL};
    if (kd_jobspec_parse(json, &env, s, problems, len) != 0)
        return -1;
    int rc = kd_jobspec_check_runnable(s, problems, len);
    if (rc != 0)
        kd_jobspec_free(s);
    return rc;
}

static void refused(const char *json, const char *const *want)
{
    struct kd_jobspec s;
    char problems[4096];
    assert_int_equal(submit(json, &s, problems, sizeof problems), -1);
    for (int i = 0; want[i]; i++)
        if (!strstr(problems, want[i]))
            fail_msg("'%s' is not among the problems:\n%s", want[i], problems);
}

static void accepted(const char *json, struct kd_jobspec *s)
{
    char problems[4096];
    if (submit(json, s, problems, sizeof problems) != 0)
        fail_msg("refused: %s", problems);
}

/* ---- the device ---------------------------------------------------------------------------- */

struct sched_fixture {
    uv_loop_t loop;
    struct kd_sched *s;
};

static void sched_start(struct sched_fixture *f, const char *const *devices, size_t n)
{
    assert_int_equal(uv_loop_init(&f->loop), 0);
    struct kd_sched_options o = {
        .loop = &f->loop, .devices = devices, .ndevices = n, .workers_per_device = 1, .max_queue = 8};
    char err[256];
    if (kd_sched_new(&f->s, &o, err, sizeof err) != 0)
        fail_msg("kd_sched_new: %s", err);
    kd_jobspec_set_devices(f->s);
}

static void sched_stop(struct sched_fixture *f)
{
    kd_jobspec_set_devices(NULL);
    kd_sched_stop(f->s);
    kd_sched_close(f->s);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    kd_sched_destroy(f->s);
    assert_int_equal(uv_loop_close(&f->loop), 0);
}

static void device_of(const char *device_field, const char *want)
{
    char model[600], spec[1200];
    linear_model(model, sizeof model, 784, 10);
    fashion_spec(spec, sizeof spec, model, device_field);
    struct kd_jobspec s;
    accepted(spec, &s);
    assert_string_equal(s.device, want);
    kd_jobspec_free(&s);
}

static void test_device_without_scheduler(void **state)
{
    (void)state;
    device_of("", "cpu");
    device_of("\"device\": \"ref\"", "ref");
}

static void test_device_configured(void **state)
{
    (void)state;
    struct sched_fixture f;
    /* "ref:0" calls itself "ref": either spelling names it, and the spec keeps the configured one */
    const char *const devices[] = {"ref:0"};
    sched_start(&f, devices, 1);
    device_of("", "ref:0");
    device_of("\"device\": \"ref\"", "ref:0");
    device_of("\"device\": \"ref:0\"", "ref:0");
    char model[600], spec[1200];
    linear_model(model, sizeof model, 784, 10);
    fashion_spec(spec, sizeof spec, model, "\"device\": \"cpu\"");
    refused(spec, (const char *const[]){"device: 'cpu' is not one of the devices kilnd drives (ref:0: the devices "
                                        "setting)",
                                        NULL});
    sched_stop(&f);

    const char *const cpu[] = {"cpu"};
    sched_start(&f, cpu, 1);
    fashion_spec(spec, sizeof spec, model, "\"device\": \"cpu?threads=1\"");
    refused(spec,
            (const char *const[]){"device: 'cpu?threads=1' is not one of the devices kilnd drives (cpu:", NULL});
    device_of("\"device\": \"cpu\"", "cpu");
    sched_stop(&f);
}

/* ---- settings that would be ignored -------------------------------------------------------- */

static void test_ignored_settings_all_at_once(void **state)
{
    (void)state;
    char model[600], spec[2000];
    linear_model(model, sizeof model, 784, 10);
    fashion_spec(
        spec, sizeof spec, model,
        "\"optimizer\": {\"kind\": \"adam\", \"momentum\": 0.9, \"grad_accum\": \"banana\"}, "
        "\"loss\": {\"kind\": 5}, \"scheduler\": {\"kind\": \"cosine\", \"gamma\": 0.5, \"step_size\": 3}");
    refused(spec,
            (const char *const[]){"optimizer.grad_accum: must be an integer",
                                  "optimizer.momentum: adam has no momentum (it is a setting of sgd, rmsprop)",
                                  "loss.kind: must be a loss name",
                                  "scheduler.gamma: cosine has no gamma (it is a setting of step, exponential)",
                                  "scheduler.step_size: cosine has no step_size (it is a setting of step)", NULL});
}

static void test_optimizer_settings_per_kind(void **state)
{
    (void)state;
    char model[600], spec[2000];
    linear_model(model, sizeof model, 784, 10);
    /* the default kind is adam */
    fashion_spec(spec, sizeof spec, model, "\"optimizer\": {\"grad_accum\": -7, \"momentum\": 0.5}");
    refused(spec, (const char *const[]){"optimizer.grad_accum: -7 is out of range [1, ",
                                        "optimizer.momentum: adam has no momentum", NULL});
    fashion_spec(spec, sizeof spec, model, "\"optimizer\": {\"kind\": \"sgd\", \"beta1\": 0.8, \"eps\": 1e-6}");
    refused(spec,
            (const char *const[]){"optimizer.beta1: sgd has no beta1", "optimizer.eps: sgd has no eps", NULL});
    fashion_spec(spec, sizeof spec, model,
                 "\"optimizer\": {\"kind\": \"rmsprop\", \"momentum\": 0.9, \"eps\": 1e-6}");
    struct kd_jobspec s;
    accepted(spec, &s);
    kd_jobspec_free(&s);
}

/* Integers as JSON carries them: a huge one is said in short, and one past 2^53 (which a double
 * does not hold exactly: ...993 reads as ...992) is refused rather than taken rounded. */
static void test_integers_past_exact_range(void **state)
{
    (void)state;
    char model[600], spec[2000];
    linear_model(model, sizeof model, 784, 10);
    fashion_spec(spec, sizeof spec, model, "\"seed\": 9007199254740993, \"epochs\": 1e308");
    refused(spec, (const char *const[]){"seed: 9.0072e+15 is past 2^53, where a JSON number is not read exactly",
                                        "epochs: 1e+308 is out of range [1, ", NULL});
    fashion_spec(spec, sizeof spec, model, "\"seed\": 9223372036854775807");
    refused(spec, (const char *const[]){"seed: 9.22337e+18 is past 2^53", NULL});
    fashion_spec(spec, sizeof spec, model, "\"seed\": 9007199254740991");
    struct kd_jobspec s;
    accepted(spec, &s);
    kd_jobspec_free(&s);
}

static void test_grad_accum_parsed(void **state)
{
    (void)state;
    char model[600], spec[2000];
    linear_model(model, sizeof model, 784, 10);
    fashion_spec(spec, sizeof spec, model,
                 "\"optimizer\": {\"kind\": \"sgd\", \"grad_accum\": 4}, \"scheduler\": {\"kind\": \"step\", "
                 "\"step_size\": 2, \"gamma\": 0.5}");
    struct kd_jobspec s;
    accepted(spec, &s);
    assert_int_equal(s.grad_accum, 4);
    kd_jobspec_free(&s);
}

/* ---- what a dry run shows ------------------------------------------------------------------ */

static void test_nesterov_without_momentum(void **state)
{
    (void)state;
    char model[600], spec[2000];
    linear_model(model, sizeof model, 784, 10);
    fashion_spec(spec, sizeof spec, model, "\"optimizer\": {\"kind\": \"sgd\", \"nesterov\": true}");
    refused(spec, (const char *const[]){"optimizer.nesterov: needs momentum > 0", NULL});
}

static void test_model_does_not_take_items(void **state)
{
    (void)state;
    char model[600], spec[2000];
    /* a Linear of 100 inputs after flattening 784 */
    linear_model(model, sizeof model, 100, 10);
    fashion_spec(spec, sizeof spec, model, "");
    refused(spec, (const char *const[]){
                      "model: does not take the data's items (one item is a [1, 1, 28, 28] input)", NULL});
    /* a CSV's items: its header's columns but the label */
    linear_model(model, sizeof model, 5, 3);
    snprintf(spec, sizeof spec, "{\"model\": %s, \"data\": {\"type\": \"csv\", \"train\": \"%s\"}}", model, csv);
    refused(spec,
            (const char *const[]){"model: does not take the data's items (one item is a [1, 4] input)", NULL});
    linear_model(model, sizeof model, 4, 3);
    snprintf(spec, sizeof spec, "{\"model\": %s, \"data\": {\"type\": \"csv\", \"train\": \"%s\"}}", model, csv);
    struct kd_jobspec s;
    accepted(spec, &s);
    kd_jobspec_free(&s);
}

/* What the data's headers tell at submission: a label column the CSV does not have, images and
 * labels of different counts (each was a job that failed when it started). */
static void test_data_headers(void **state)
{
    (void)state;
    char model[600], spec[2000], want[1000];
    linear_model(model, sizeof model, 4, 3);
    snprintf(spec, sizeof spec,
             "{\"model\": %s, \"data\": {\"type\": \"csv\", \"train\": \"%s\", \"label_column\": \"Species\"}}",
             model, csv);
    snprintf(want, sizeof want,
             "data.label_column: 'Species' is not a column of %s (its header has 'a', 'b', 'c', 'd', 'label')",
             csv);
    refused(spec, (const char *const[]){want, NULL});
    linear_model(model, sizeof model, 784, 10);
    char images[400];
    snprintf(images, sizeof images, "%s/train-images-idx3-ubyte.gz", fashion);
    snprintf(spec, sizeof spec,
             "{\"model\": %s, \"data\": {\"type\": \"idx\", \"train_images\": \"%s\", \"train_labels\": "
             "\"%s\"}}",
             model, images, three_labels);
    snprintf(want, sizeof want, "data: %s holds 2 items but %s holds 3 labels", images, three_labels);
    refused(spec, (const char *const[]){want, NULL});
    /* the same images with their own labels: accepted */
    char labels[400];
    snprintf(labels, sizeof labels, "%s/train-labels-idx1-ubyte.gz", fashion);
    snprintf(spec, sizeof spec,
             "{\"model\": %s, \"data\": {\"type\": \"idx\", \"train_images\": \"%s\", \"train_labels\": "
             "\"%s\"}}",
             model, images, labels);
    struct kd_jobspec s;
    accepted(spec, &s);
    kd_jobspec_free(&s);
}

/* A body that is not JSON says where it stops being JSON; text after the object is refused too
 * (it was read as the object alone). */
static void test_body_not_json(void **state)
{
    (void)state;
    refused("{\"epochs\": 2 x}", (const char *const[]){"body: is not valid JSON (at byte 13)", NULL});
    refused("{\"epochs\": 2} {\"epochs\": 3}",
            (const char *const[]){"body: is not valid JSON (at byte 14)", NULL});
    refused("[1, 2]", (const char *const[]){"body: must be a JSON object", NULL});
    /* a NUL in a string would cut a path short unseen */
    refused("{\"data\": {\"type\": \"csv\", \"train\": \"/srv/a.csv\\u0000/../b\"}}",
            (const char *const[]){"body: holds \\u0000 (a NUL character) in a string at byte 45", NULL});
}

static void test_class_scores(void **state)
{
    (void)state;
    char model[600], spec[2000];
    /* 5 scores for labels up to 9 */
    linear_model(model, sizeof model, 784, 5);
    fashion_spec(spec, sizeof spec, model, "");
    refused(spec, (const char *const[]){"model: gives 5 class scores an item but the data has 10 classes", NULL});
    /* wider than the classes: fine */
    linear_model(model, sizeof model, 784, 12);
    fashion_spec(spec, sizeof spec, model, "");
    struct kd_jobspec s;
    accepted(spec, &s);
    kd_jobspec_free(&s);
}

static void test_register_as_length(void **state)
{
    (void)state;
    char model[600], spec[2000], extra[300];
    linear_model(model, sizeof model, 784, 10);
    snprintf(extra, sizeof extra, "\"register_as\": \"%0200d\"", 0);
    fashion_spec(spec, sizeof spec, model, extra);
    refused(spec,
            (const char *const[]){"register_as: is 200 characters long; a model name has at most 128", NULL});
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_without_scheduler),
        cmocka_unit_test(test_device_configured),
        cmocka_unit_test(test_ignored_settings_all_at_once),
        cmocka_unit_test(test_optimizer_settings_per_kind),
        cmocka_unit_test(test_integers_past_exact_range),
        cmocka_unit_test(test_grad_accum_parsed),
        cmocka_unit_test(test_nesterov_without_momentum),
        cmocka_unit_test(test_model_does_not_take_items),
        cmocka_unit_test(test_data_headers),
        cmocka_unit_test(test_body_not_json),
        cmocka_unit_test(test_class_scores),
        cmocka_unit_test(test_register_as_length),
    };
    return cmocka_run_group_tests(tests, make_data, remove_data);
}
