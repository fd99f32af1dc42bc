/*
 * tests/storage/test_checkpoint.c — checkpoints: a full round trip of every part, listing,
 * "latest good" passing over damaged and partial folders (truncated file, flipped byte,
 * missing manifest, leftover temporary folder) with the reason for each, retention (keep
 * last K, keep best by a metric), and I/O faults injected at every durable call.
 */
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "kiln/kiln.h"
#include "kiln/record.h"
#include "storage-impl.h"

static kiln_device *dev;
static char root[64];

static int setup(void **state)
{
    (void)state;
    dev = kiln_device_open("cpu");
    snprintf(root, sizeof root, "/tmp/kiln-ckpt-XXXXXX");
    return dev && mkdtemp(root) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    kiln__remove_tree(root);
    kiln_device_close(dev);
    return 0;
}

/* Save a checkpoint whose tensors hold `step` and whose metrics are loss = 10 - step and
 * acc = step % 3 (so the best accuracy is not the newest). */
static void save_step(int64_t step, unsigned flags)
{
    kiln_tensor *w = kiln_full(dev, KILN_F32, KILN_SHAPE(4, 8), (double)step);
    kiln_tensor *m = kiln_full(dev, KILN_F16, KILN_SHAPE(4, 8), (double)step / 2);
    const char *mn[] = {"w"}, *on[] = {"w.exp_avg"};
    kiln_generator g[2] = {kiln_generator_make(42), {.seed = UINT64_MAX, .offset = (uint64_t)step}};
    const char *metric_names[] = {"loss", "acc"};
    double metric_values[] = {10.0 - (double)step, (double)(step % 3)};
    kiln_ckpt_state s = {
        .step = step, .epoch = step / 2,
        .model_n = 1, .model_names = mn, .model_tensors = &w, .model_config = "{\"kind\":\"linear\"}",
        .optim_n = 1, .optim_names = on, .optim_tensors = &m, .optim_config = "{\"lr\":0.001}",
        .scheduler_json = "{\"last_epoch\": 3}", .rng_n = 2, .rng = g,
        .metrics_json = "[{\"step\":1,\"loss\":9}]",
        .metric_n = 2, .metric_names = metric_names, .metric_values = metric_values,
        .record_flags = flags,
    };
    char path[256];
    if (kiln_ckpt_save(root, &s, path, sizeof path) != 0)
        fail_msg("save step %lld: %s", (long long)step, kiln_error());
    assert_non_null(strstr(path, "step-"));
    kiln_tensor_release(w);
    kiln_tensor_release(m);
}

static void test_round_trip(void **state)
{
    (void)state;
    save_step(1200, KILN_RECORD_ZSTD);
    char dir[128];
    snprintf(dir, sizeof dir, "%s/step-000001200", root);
    kiln_ckpt *ck = kiln_ckpt_open(dir);
    if (!ck)
        fail_msg("%s", kiln_error());
    assert_int_equal(kiln_ckpt_step(ck), 1200);
    assert_int_equal(kiln_ckpt_epoch(ck), 600);
    assert_non_null(strstr(kiln_record_config(kiln_ckpt_model(ck)), "linear"));
    assert_non_null(strstr(kiln_record_config(kiln_ckpt_optimizer(ck)), "0.001"));
    assert_non_null(strstr(kiln_ckpt_scheduler(ck), "last_epoch"));
    assert_non_null(strstr(kiln_ckpt_metrics_history(ck), "loss"));
    kiln_generator g[4];
    assert_int_equal(kiln_ckpt_rng(ck, g, 4), 2);
    assert_true(g[0].seed == 42 && g[0].offset == 0);
    assert_true(g[1].seed == UINT64_MAX && g[1].offset == 1200);
    double loss;
    assert_int_equal(kiln_ckpt_metric(ck, "loss", &loss), 0);
    assert_true(loss == 10.0 - 1200);
    assert_int_equal(kiln_ckpt_metric(ck, "nope", &loss), -1);
    kiln_record_slot slot = {.name = "w.exp_avg", .dtype = KILN_F32, .ndim = 2, .shape = {4, 8}};
    kiln_tensor *m;
    assert_int_equal(kiln_record_load_slots(kiln_ckpt_optimizer(ck), 1, &slot, dev, KILN_RECORD_STRICT, &m, NULL), 0);
    float v[32];
    kiln_to_data(m, v, sizeof v);
    assert_true(v[31] == 600.0f);
    kiln_tensor_release(m);
    kiln_ckpt_close(ck);

    /* Saving the same step again replaces it. */
    save_step(1200, 0);
    kiln_ckpt_info *list;
    int n;
    assert_int_equal(kiln_ckpt_list(root, true, NULL, &list, &n), 0);
    assert_int_equal(n, 1);
    assert_true(list[0].valid);
    kiln_ckpt_list_free(list, n);
}

static void damage(const char *step_dir, const char *file, int how)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s/%s", root, step_dir, file);
    if (how == 0) { /* truncate */
        struct stat sb;
        assert_int_equal(stat(p, &sb), 0);
        assert_int_equal(truncate(p, sb.st_size / 2), 0);
    } else if (how == 1) { /* flip one byte in the middle */
        int fd = open(p, O_RDWR);
        struct stat sb;
        fstat(fd, &sb);
        unsigned char c;
        assert_int_equal(pread(fd, &c, 1, sb.st_size / 2), 1);
        c ^= 0x01;
        assert_int_equal(pwrite(fd, &c, 1, sb.st_size / 2), 1);
        close(fd);
    } else { /* remove */
        assert_int_equal(unlink(p), 0);
    }
}

typedef struct skips {
    int n;
    char why[8][256];
    char path[8][256];
} skips;

static void on_skip(const char *path, const char *why, void *user)
{
    skips *s = user;
    if (s->n < 8) {
        snprintf(s->path[s->n], sizeof s->path[0], "%s", path);
        snprintf(s->why[s->n], sizeof s->why[0], "%s", why);
    }
    s->n++;
}

static void test_latest_good_skips_damage(void **state)
{
    (void)state;
    for (int s = 1; s <= 6; s++)
        save_step(s, s % 2 ? KILN_RECORD_ZSTD : 0);
    damage("step-000000006", "model.kiln", 0);     /* truncated */
    damage("step-000000005", "optimizer.kiln", 1); /* flipped byte */
    damage("step-000000004", "MANIFEST", 2);       /* missing manifest */
    damage("step-000000003", "MANIFEST", 1);       /* damaged manifest */
    /* A save interrupted before its rename. */
    char tmp[128];
    snprintf(tmp, sizeof tmp, "%s/.tmp-step-000000007-abcdef", root);
    assert_int_equal(mkdir(tmp, 0755), 0);
    snprintf(tmp, sizeof tmp, "%s/.tmp-step-000000007-abcdef/model.kiln", root);
    assert_int_equal(kiln__write_file_atomic(tmp, "partial", 7), 0);

    skips sk = {0};
    kiln_ckpt *ck = kiln_ckpt_open_latest(root, on_skip, &sk);
    if (!ck)
        fail_msg("%s", kiln_error());
    assert_int_equal(kiln_ckpt_step(ck), 2);
    kiln_ckpt_close(ck);
    assert_int_equal(sk.n, 5);
    assert_non_null(strstr(sk.path[0], ".tmp-step-000000007"));
    assert_non_null(strstr(sk.why[0], "partial"));
    assert_non_null(strstr(sk.why[1], "model.kiln"));      /* truncated: size differs */
    assert_non_null(strstr(sk.why[1], "truncated"));
    assert_non_null(strstr(sk.why[2], "optimizer.kiln"));  /* flipped: checksum */
    assert_non_null(strstr(sk.why[2], "checksum"));
    assert_non_null(strstr(sk.why[3], "manifest"));
    assert_non_null(strstr(sk.why[4], "manifest"));

    /* Listing without verification sees 5 and 6 as fine (manifest only); with it, not. */
    kiln_ckpt_info *list;
    int n;
    assert_int_equal(kiln_ckpt_list(root, false, "loss", &list, &n), 0);
    assert_int_equal(n, 7);
    assert_true(list[5].valid && list[4].valid && !list[3].valid && !list[2].valid && !list[6].valid);
    assert_true(list[0].has_metric && list[0].metric == 9.0);
    kiln_ckpt_list_free(list, n);
    assert_int_equal(kiln_ckpt_list(root, true, NULL, &list, &n), 0);
    int valid = 0;
    for (int i = 0; i < n; i++)
        valid += list[i].valid;
    assert_int_equal(valid, 2);
    kiln_ckpt_list_free(list, n);

    /* Retention that removes damage leaves exactly the good ones it keeps. */
    kiln_ckpt_retention keep = {.keep_last = 5, .remove_damaged = true};
    int removed;
    assert_int_equal(kiln_ckpt_retain(root, &keep, &removed), 0);
    assert_int_equal(removed, 5);
    assert_int_equal(kiln_ckpt_list(root, true, NULL, &list, &n), 0);
    assert_int_equal(n, 2);
    assert_true(list[0].step == 1 && list[1].step == 2);
    kiln_ckpt_list_free(list, n);
}

static void test_empty_root(void **state)
{
    (void)state;
    char missing[128];
    snprintf(missing, sizeof missing, "%s/none", root);
    assert_null(kiln_ckpt_open_latest(missing, NULL, NULL));
    assert_non_null(strstr(kiln_error(), "no usable checkpoint"));
}

static void test_retention(void **state)
{
    (void)state;
    for (int s = 1; s <= 9; s++)
        save_step(s, 0);
    /* keep the last 2 (8, 9) and the best 2 by acc = step % 3, max: acc 2 is steps 2, 5 and
     * 8; ties go to the newer, so 8 and 5. */
    kiln_ckpt_retention p = {.keep_last = 2, .best_metric = "acc", .best_max = true, .keep_best = 2};
    int removed;
    assert_int_equal(kiln_ckpt_retain(root, &p, &removed), 0);
    assert_int_equal(removed, 6);
    kiln_ckpt_info *list;
    int n;
    assert_int_equal(kiln_ckpt_list(root, true, NULL, &list, &n), 0);
    assert_int_equal(n, 3);
    assert_true(list[0].step == 5 && list[1].step == 8 && list[2].step == 9);
    kiln_ckpt_list_free(list, n);
    /* Best by loss (min) is the newest: keep_last 0 still keeps the newest. */
    kiln_ckpt_retention q = {.keep_last = 0, .best_metric = "loss"};
    assert_int_equal(kiln_ckpt_retain(root, &q, &removed), 0);
    assert_int_equal(removed, 2);
    assert_int_equal(kiln_ckpt_list(root, true, NULL, &list, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(list[0].step, 9);
    kiln_ckpt_list_free(list, n);
}

/* The newest checkpoint's model file damaged after it was written, and retention without
 * remove_damaged: the manifest alone said step 3 was fine, so keep_last = 1 kept it and removed
 * 1 and 2, leaving nothing that opens. Now the newest that verifies (2) is kept. */
static void test_retention_keeps_newest_that_verifies(void **state)
{
    (void)state;
    for (int s = 1; s <= 3; s++)
        save_step(s, 0);
    damage("step-000000003", "model.kiln", 1);
    kiln_ckpt_retention keep = {.keep_last = 1};
    int removed = -1;
    assert_int_equal(kiln_ckpt_retain(root, &keep, &removed), 0);
    assert_int_equal(removed, 1); /* step 1; the damaged 3 is left, as remove_damaged is off */
    kiln_ckpt *ck = kiln_ckpt_open_latest(root, NULL, NULL);
    if (!ck)
        fail_msg("no usable checkpoint left: %s", kiln_error());
    assert_int_equal(kiln_ckpt_step(ck), 2);
    kiln_record_slot slot = {.name = "w", .dtype = KILN_F32, .ndim = 2, .shape = {4, 8}};
    kiln_tensor *w = NULL;
    assert_int_equal(kiln_record_load_slots(kiln_ckpt_model(ck), 1, &slot, dev, KILN_RECORD_STRICT, &w, NULL), 0);
    float v[32];
    assert_int_equal(kiln_to_data(w, v, sizeof v), 0);
    assert_true(v[0] == 2.0f && v[31] == 2.0f);
    kiln_tensor_release(w);
    kiln_ckpt_close(ck);
    kiln_ckpt_info *list;
    int n;
    assert_int_equal(kiln_ckpt_list(root, false, NULL, &list, &n), 0);
    assert_int_equal(n, 2);
    assert_true(list[0].step == 2 && list[1].step == 3);
    kiln_ckpt_list_free(list, n);
    /* with remove_damaged the damaged one goes and 2 stays */
    keep.remove_damaged = true;
    assert_int_equal(kiln_ckpt_retain(root, &keep, &removed), 0);
    assert_int_equal(removed, 1);
    ck = kiln_ckpt_open_latest(root, NULL, NULL);
    assert_non_null(ck);
    assert_int_equal(kiln_ckpt_step(ck), 2);
    kiln_ckpt_close(ck);
}

/* A save the manifest reader could never take back is refused up front: epoch -1, a step
 * past 2^53 (JSON numbers are doubles), and JSON with text after its value. */
static void test_save_refuses_unreadable_state(void **state)
{
    (void)state;
    kiln_tensor *w = kiln_full(dev, KILN_F32, KILN_SHAPE(2), 1);
    const char *mn[] = {"w"};
    kiln_ckpt_state s = {.step = 1, .epoch = -1, .model_n = 1, .model_names = mn, .model_tensors = &w};
    assert_int_not_equal(kiln_ckpt_save(root, &s, NULL, 0), 0);
    assert_non_null(strstr(kiln_error(), "epoch -1 is outside 0..2^53"));
    s.epoch = 0;
    s.step = ((int64_t)1 << 53) + 1;
    assert_int_not_equal(kiln_ckpt_save(root, &s, NULL, 0), 0);
    assert_non_null(strstr(kiln_error(), "step 9007199254740993 is outside 0..2^53"));
    s.step = INT64_MAX;
    assert_int_not_equal(kiln_ckpt_save(root, &s, NULL, 0), 0);
    assert_non_null(strstr(kiln_error(), "outside 0..2^53"));
    s.step = 5;
    s.scheduler_json = "{\"last_epoch\": 3} trailing";
    assert_int_not_equal(kiln_ckpt_save(root, &s, NULL, 0), 0);
    assert_non_null(strstr(kiln_error(), "not valid JSON"));
    kiln_ckpt_info *list;
    int n;
    assert_int_equal(kiln_ckpt_list(root, false, NULL, &list, &n), 0);
    assert_int_equal(n, 0); /* nothing was written, not even a temporary folder */
    kiln_ckpt_list_free(list, n);
    /* the largest step a manifest holds saves and reads back */
    s.scheduler_json = NULL;
    s.step = (int64_t)1 << 53;
    s.epoch = (int64_t)1 << 53;
    assert_int_equal(kiln_ckpt_save(root, &s, NULL, 0), 0);
    skips sk = {0};
    kiln_ckpt *ck = kiln_ckpt_open_latest(root, on_skip, &sk);
    if (!ck)
        fail_msg("%s (%s)", kiln_error(), sk.n ? sk.why[0] : "");
    assert_true(kiln_ckpt_step(ck) == (int64_t)1 << 53 && kiln_ckpt_epoch(ck) == (int64_t)1 << 53);
    kiln_ckpt_close(ck);
    kiln_tensor_release(w);
}

/* A checkpoint folder and its files get the umask's modes (mkdtemp made every folder 0700,
 * and every file was 0644 whatever the umask). */
static void test_modes_follow_umask(void **state)
{
    (void)state;
    mode_t old = umask(027);
    char path[256];
    kiln_tensor *w = kiln_full(dev, KILN_F32, KILN_SHAPE(2), 1);
    const char *mn[] = {"w"};
    kiln_ckpt_state s = {.step = 4, .model_n = 1, .model_names = mn, .model_tensors = &w};
    int rc = kiln_ckpt_save(root, &s, path, sizeof path);
    umask(old);
    assert_int_equal(rc, 0);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0750);
    char file[300];
    snprintf(file, sizeof file, "%s/model.kiln", path);
    assert_int_equal(stat(file, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0640);
    kiln_tensor_release(w);
}

/* A checkpoint whose only metric, "loss", is v. */
static void save_loss(int64_t step, double v)
{
    kiln_tensor *w = kiln_full(dev, KILN_F32, KILN_SHAPE(2), 1);
    const char *mn[] = {"w"}, *names[] = {"loss"};
    kiln_ckpt_state s = {.step = step,
                         .model_n = 1,
                         .model_names = mn,
                         .model_tensors = &w,
                         .metric_n = 1,
                         .metric_names = names,
                         .metric_values = &v};
    if (kiln_ckpt_save(root, &s, NULL, 0) != 0)
        fail_msg("save step %lld: %s", (long long)step, kiln_error());
    kiln_tensor_release(w);
}

/* inf and NaN were written as JSON null and read back as "no metric", so a diverged loss
 * dropped out of keep-best unseen: now they round-trip, and NaN ranks worst. */
static void test_non_finite_metrics(void **state)
{
    (void)state;
    kiln_tensor *w = kiln_full(dev, KILN_F32, KILN_SHAPE(2), 1);
    const char *mn[] = {"w"}, *names[] = {"pinf", "ninf", "nan", "big", "plain"};
    double vals[] = {INFINITY, -INFINITY, NAN, 1e308, -0.25};
    kiln_ckpt_state s = {.step = 1,
                         .model_n = 1,
                         .model_names = mn,
                         .model_tensors = &w,
                         .metric_n = 5,
                         .metric_names = names,
                         .metric_values = vals};
    assert_int_equal(kiln_ckpt_save(root, &s, NULL, 0), 0);
    kiln_tensor_release(w);
    kiln_ckpt *ck = kiln_ckpt_open_latest(root, NULL, NULL);
    assert_non_null(ck);
    double v[5];
    for (int i = 0; i < 5; i++)
        if (kiln_ckpt_metric(ck, names[i], &v[i]) != 0)
            fail_msg("metric %s is missing", names[i]);
    assert_true(isinf(v[0]) && v[0] > 0 && isinf(v[1]) && v[1] < 0 && isnan(v[2]));
    assert_true(v[3] == 1e308 && v[4] == -0.25);
    assert_int_equal(kiln_ckpt_metric(ck, "absent", NULL), -1);
    kiln_ckpt_close(ck);
    kiln_ckpt_info *list;
    int n;
    assert_int_equal(kiln_ckpt_list(root, false, "nan", &list, &n), 0);
    assert_true(n == 1 && list[0].has_metric && isnan(list[0].metric));
    kiln_ckpt_list_free(list, n);

    /* keep-best by loss (min), one kept: step 3's 0.5 wins over inf, and NaN (a diverged
     * run) is never best, even beside +inf; step 6 is kept as the newest */
    save_loss(2, INFINITY);
    save_loss(3, 0.5);
    save_loss(4, NAN);
    save_loss(5, 2.0);
    save_loss(6, NAN);
    kiln_ckpt_retention p = {.keep_last = 0, .best_metric = "loss", .keep_best = 1};
    int removed;
    assert_int_equal(kiln_ckpt_retain(root, &p, &removed), 0);
    assert_int_equal(kiln_ckpt_list(root, false, "loss", &list, &n), 0);
    assert_int_equal(n, 2);
    assert_true(list[0].step == 3 && list[0].metric == 0.5 && list[1].step == 6 && isnan(list[1].metric));
    kiln_ckpt_list_free(list, n);
    /* max: +inf is best, NaN still worst */
    save_loss(7, INFINITY);
    save_loss(8, NAN);
    kiln_ckpt_retention q = {.keep_last = 0, .best_metric = "loss", .best_max = true, .keep_best = 1};
    assert_int_equal(kiln_ckpt_retain(root, &q, &removed), 0);
    assert_int_equal(kiln_ckpt_list(root, false, "loss", &list, &n), 0);
    assert_int_equal(n, 2);
    assert_true(list[0].step == 7 && isinf(list[0].metric) && list[1].step == 8);
    kiln_ckpt_list_free(list, n);
}

/* Only step-000000001 and (optionally) step-000000002 exist, both valid; no debris. */
static void expect_clean_root(bool with_two)
{
    DIR *d = opendir(root);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        if (strcmp(de->d_name, "step-000000001") != 0 && !(with_two && strcmp(de->d_name, "step-000000002") == 0))
            fail_msg("left behind: %s (%s)", de->d_name, kiln_error());
        n++;
    }
    closedir(d);
    kiln_ckpt *ck = kiln_ckpt_open_latest(root, NULL, NULL);
    assert_non_null(ck);
    assert_int_equal(kiln_ckpt_step(ck), with_two ? 2 : 1);
    kiln_ckpt_close(ck);
}

static void test_fault_injection(void **state)
{
    (void)state;
    save_step(1, 0);
    int failures = 0;
    for (int persistent = 0; persistent < 2; persistent++)
        for (int flags = 0; flags <= KILN_RECORD_ZSTD; flags += KILN_RECORD_ZSTD) {
            for (long nth = 1;; nth++) {
                kiln__io_fault_set(nth, persistent);
                kiln_error_clear();
                kiln_tensor *w = kiln_full(dev, KILN_F32, KILN_SHAPE(16), 2.0);
                const char *names[] = {"w"};
                kiln_ckpt_state s = {.step = 2, .model_n = 1, .model_names = names, .model_tensors = &w,
                                     .record_flags = (unsigned)flags};
                int rc = kiln_ckpt_save(root, &s, NULL, 0);
                long calls = kiln__io_fault_calls();
                kiln__io_fault_set(0, 0);
                kiln_tensor_release(w);
                if (rc == 0) {
                    assert_true(calls < nth);
                    expect_clean_root(true);
                    char two[128];
                    snprintf(two, sizeof two, "%s/step-000000002", root);
                    assert_int_equal(kiln__remove_tree(two), 0);
                    break;
                }
                failures++;
                assert_true(strlen(kiln_error()) > 0);
                expect_clean_root(false);
                assert_true(nth < 200);
            }
        }
    assert_true(failures > 20);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_latest_good_skips_damage, setup, teardown),
        cmocka_unit_test_setup_teardown(test_empty_root, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retention, setup, teardown),
        cmocka_unit_test_setup_teardown(test_non_finite_metrics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fault_injection, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retention_keeps_newest_that_verifies, setup, teardown),
        cmocka_unit_test_setup_teardown(test_save_refuses_unreadable_state, setup, teardown),
        cmocka_unit_test_setup_teardown(test_modes_follow_umask, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
