/*
 * tests/jobs/test_trainer_resume.c — a training job's run resumed in-process
 * (scheduler/trainer.h's kd_trainer_run) from a checkpoint folder whose newest checkpoint is
 * damaged (one byte of its optimizer record flipped, as after a crash and a bad disk): the run
 * continues from the checkpoint before, and says which one it passed over and why, as a "log"
 * event with "level": "warning" and through the warn hook (kilnd's log). Its checkpoints hold
 * the job's model spec, so a checkpoint alone builds the model again.
 *
 * The data are a CSV of four features and three classes in a temporary folder.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kiln/kiln.h"
#include "kiln/record.h"
#include "trainer.h"

static char root[] = "/tmp/kiln-trainer-resume-XXXXXX";
static char csv[300], named[300];

static const char MODEL[] =
    "{\"inputs\": [\"x\"], \"nodes\": ["
    "{\"name\": \"fc1\", \"layer\": \"Linear\", \"config\": {\"in_features\": 4, \"out_features\": 8}, "
    "\"inputs\": [\"x\"]},"
    "{\"name\": \"a\", \"op\": \"relu\", \"inputs\": [\"fc1\"]},"
    "{\"name\": \"fc2\", \"layer\": \"Linear\", \"config\": {\"in_features\": 8, \"out_features\": 3}, "
    "\"inputs\": [\"a\"]}], \"outputs\": [\"fc2\"]}";

static int make_data(void **state)
{
    (void)state;
    if (!mkdtemp(root))
        return -1;
    snprintf(csv, sizeof csv, "%s/blobs.csv", root);
    FILE *f = fopen(csv, "w");
    if (!f)
        return -1;
    fputs("a,b,c,d,label\n", f);
    for (int i = 0; i < 24; i++)
        fprintf(f, "%d,%d,%d,%d,%d\n", i % 3, (i * 7) % 5, (i * 3) % 4, i % 2, i % 3);
    if (fclose(f) != 0)
        return -1;
    /* the same items with names for labels: classes numbered in order of first appearance */
    static const char *const names[] = {"owl", "cat", "dog"};
    snprintf(named, sizeof named, "%s/named.csv", root);
    if (!(f = fopen(named, "w")))
        return -1;
    fputs("a,b,c,d,label\n", f);
    for (int i = 0; i < 24; i++)
        fprintf(f, "%d,%d,%d,%d,%s\n", i % 3, (i * 7) % 5, (i * 3) % 4, i % 2, names[i % 3]);
    return fclose(f);
}

static int remove_data(void **state)
{
    (void)state;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : -1;
}

/* What the hooks saw. */
struct seen {
    char logs[8192];  /* every "log" event's JSON, one a line */
    char warns[4096]; /* every warn hook message, one a line */
};

static void on_event(void *ud, const char *type, const char *json)
{
    struct seen *s = ud;
    if (strcmp(type, "log") == 0 && strlen(s->logs) + strlen(json) + 2 < sizeof s->logs) {
        strcat(s->logs, json);
        strcat(s->logs, "\n");
    }
}

static void on_warn(void *ud, const char *message)
{
    struct seen *s = ud;
    if (strlen(s->warns) + strlen(message) + 2 < sizeof s->warns) {
        strcat(s->warns, message);
        strcat(s->warns, "\n");
    }
}

/* One run of epochs epochs on the CSV at data into ckdir, resuming from resume_dir when given. */
static void run_on(const char *data, int epochs, const char *ckdir, const char *resume_dir, struct seen *seen,
                   struct kd_trainer_result *res)
{
    char spec_text[2000], problems[2048];
    snprintf(spec_text, sizeof spec_text,
             "{\"model\": %s, \"data\": {\"type\": \"csv\", \"train\": \"%s\"}, \"epochs\": %d, "
             "\"batch_size\": 8, \"device\": \"cpu\", \"seed\": 3, \"checkpoint\": {\"keep_last\": 5}}",
             MODEL, data, epochs);
    const char *roots[] = {root};
    struct kd_jobspec_env env = {roots, 1, NULL, true, NULL, NULL};
    struct kd_jobspec spec;
    if (kd_jobspec_parse(spec_text, &env, &spec, problems, sizeof problems) != 0)
        fail_msg("spec refused: %s", problems);
    atomic_bool cancel = false;
    struct kd_trainer_run run = {.spec = &spec,
                                 .checkpoint_dir = ckdir,
                                 .resume_dir = resume_dir,
                                 .cancel = &cancel,
                                 .hooks = {.ud = seen, .event = on_event, .warn = on_warn}};
    if (kd_trainer_run(&run, res) != 0)
        fail_msg("run: %s", res->error);
    kd_jobspec_free(&spec);
}

static void run_job(int epochs, const char *ckdir, const char *resume_dir, struct seen *seen,
                    struct kd_trainer_result *res)
{
    run_on(csv, epochs, ckdir, resume_dir, seen, res);
}

static void flip_byte(const char *path, long at)
{
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, at, SEEK_SET), 0);
    int c = fgetc(f);
    assert_true(c != EOF);
    assert_int_equal(fseek(f, at, SEEK_SET), 0);
    fputc(c ^ 0x5a, f);
    assert_int_equal(fclose(f), 0);
}

static void test_damaged_newest_checkpoint_reported(void **state)
{
    (void)state;
    char first[400], second[400];
    snprintf(first, sizeof first, "%s/ck-first", root);
    snprintf(second, sizeof second, "%s/ck-second", root);
    struct seen seen = {0};
    struct kd_trainer_result res;
    run_job(2, first, NULL, &seen, &res); /* 3 steps an epoch: step-3 and step-6 */
    assert_string_equal(res.stop_reason, "completed");
    free(res.metrics_json);
    assert_null(strstr(seen.logs, "\"level\""));
    assert_null(strstr(seen.logs, "classes:")); /* numeric labels: no names to tell */
    assert_string_equal(seen.warns, "");

    /* the checkpoint holds the job's model: its spec builds it, its tensors fill it */
    char newest[450], file[500];
    snprintf(newest, sizeof newest, "%s/step-000000006", first);
    kiln_ckpt *ck = kiln_ckpt_open(newest);
    assert_non_null(ck);
    kiln_device *dev = kiln_device_open("cpu");
    kiln_module *m = kiln_model_from_json(kiln_record_config(kiln_ckpt_model(ck)), dev, NULL);
    if (!m)
        fail_msg("the checkpoint's model config builds no model: %s", kiln_error());
    assert_int_equal(kiln_module_parameters(m, NULL, 0), 4);
    kiln_module_free(m);
    kiln_device_close(dev);
    kiln_ckpt_close(ck);

    snprintf(file, sizeof file, "%s/optimizer.kiln", newest);
    flip_byte(file, 40);
    run_job(3, second, first, &seen, &res);
    assert_true(res.resumed);
    assert_int_equal(res.resumed_step, 3);
    free(res.metrics_json);
    char want[600];
    snprintf(want, sizeof want, "passed over checkpoint %s: ", newest);
    if (!strstr(seen.warns, want) || !strstr(seen.warns, "optimizer.kiln"))
        fail_msg("the warn hook did not get \"%s...optimizer.kiln...\": %s", want, seen.warns);
    if (!strstr(seen.logs, want) || !strstr(seen.logs, "\"level\":\"warning\""))
        fail_msg("no warning log event \"%s...\": %s", want, seen.logs);
    assert_non_null(
        strstr(seen.logs, "resumed from checkpoint at step 3 (1 epoch completed; training goes on in epoch 2)"));
}

/* Labels that are names: the job's log says which class index stands for which name (a
 * registered model answers with indices, and nothing else records the mapping). */
static void test_class_names_logged(void **state)
{
    (void)state;
    char ck[400];
    snprintf(ck, sizeof ck, "%s/ck-named", root);
    struct seen seen = {0};
    struct kd_trainer_result res;
    run_on(named, 1, ck, NULL, &seen, &res);
    assert_string_equal(res.stop_reason, "completed");
    free(res.metrics_json);
    if (!strstr(seen.logs, "classes: 0 = owl, 1 = cat, 2 = dog\""))
        fail_msg("no class-name log line: %s", seen.logs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_damaged_newest_checkpoint_reported),
        cmocka_unit_test(test_class_names_logged),
    };
    return cmocka_run_group_tests_name("trainer-resume", tests, make_data, remove_data);
}
