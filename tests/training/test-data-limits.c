/*
 * tests/training/test-data-limits.c — the data sets' bounds against hostile sizes and
 * labels: index transforms whose start + count overflows, feature shapes whose element
 * count overflows (arrays, windows, image folders), IDX headers that overflow or promise
 * more data than the file holds (raw and gzipped, refused before allocating), the CSV
 * label rule of data.h (numeric labels kept as written, never renumbered), and the good
 * paths next to each.
 */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "kiln/kiln.h"

static char dir[256];

static void path_of(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s", dir, name);
}

static void expect_error(const char *part)
{
    if (!strstr(kiln_error(), part))
        fail_msg("error '%s' does not contain '%s'", kiln_error(), part);
}

static void write_bytes(const char *name, const void *p, size_t n, bool gz)
{
    char path[512];
    path_of(path, sizeof path, name);
    if (gz) {
        gzFile f = gzopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(gzwrite(f, p, (unsigned)n), (int)n);
        gzclose(f);
    } else {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(p, 1, n, f), n);
        fclose(f);
    }
}

/* Four items of one feature: x = 10, 20, 30, 40, labels 0, 1, 0, 1. */
static kiln_dataset *four(void)
{
    kiln_dataset *ds = kiln_dataset_from_arrays(4, 1, (int64_t[]){1}, (float[]){10, 20, 30, 40},
                                                (int64_t[]){0, 1, 0, 1}, 2, NULL, 0);
    assert_non_null(ds);
    return ds;
}

static float item_x(kiln_dataset *ds, int64_t i)
{
    float x[8];
    double t[2];
    if (kiln_dataset_get(ds, i, x, t, 0) < 0)
        fail_msg("get %lld: %s", (long long)i, kiln_error());
    return x[0];
}

/* ------------------------------------------------------------- index transforms */

static void test_range_subset_split(void **state)
{
    (void)state;
    kiln_dataset *ds = four();
    /* start + count overflows int64: refused, not a wrapped allocation */
    assert_null(kiln_dataset_range(ds, 2, INT64_MAX));
    expect_error("start 2, count 9223372036854775807");
    assert_null(kiln_dataset_range(ds, INT64_MAX, 1));
    assert_null(kiln_dataset_range(ds, 5, 0));
    assert_null(kiln_dataset_range(ds, 2, 3));
    assert_null(kiln_dataset_range(ds, -1, 1));
    kiln_dataset *r = kiln_dataset_range(ds, 1, 3);
    assert_non_null(r);
    assert_int_equal(kiln_dataset_length(r), 3);
    assert_true(item_x(r, 0) == 20 && item_x(r, 2) == 40);
    kiln_dataset_free(r);
    r = kiln_dataset_range(ds, 4, 0);
    assert_non_null(r);
    assert_int_equal(kiln_dataset_length(r), 0);
    kiln_dataset_free(r);

    /* a count whose index table cannot be addressed is refused before indices is read */
    assert_null(kiln_dataset_subset(ds, (int64_t)1 << 61, (int64_t[]){0}));
    expect_error("too many");
    assert_null(kiln_dataset_subset(ds, -1, (int64_t[]){0}));
    kiln_dataset *s = kiln_dataset_subset(ds, 2, (int64_t[]){3, 0});
    assert_non_null(s);
    assert_true(item_x(s, 0) == 40 && item_x(s, 1) == 10);
    kiln_dataset_free(s);

    kiln_dataset *tr, *va;
    assert_int_equal(kiln_dataset_split(ds, 1.0, 3, &tr, &va), 0);
    assert_int_equal(kiln_dataset_length(va), 4);
    assert_int_equal(kiln_dataset_length(tr), 0);
    kiln_dataset_free(tr);
    kiln_dataset_free(va);
    assert_int_equal(kiln_dataset_split(ds, 0.5, 3, &tr, &va), 0);
    assert_int_equal(kiln_dataset_length(va), 2);
    assert_int_equal(kiln_dataset_length(tr), 2);
    kiln_dataset_free(tr);
    kiln_dataset_free(va);

    kiln_dataset *sh = kiln_dataset_shuffle(ds, 9);
    assert_non_null(sh);
    float sum = 0;
    for (int i = 0; i < 4; i++)
        sum += item_x(sh, i);
    assert_true(sum == 100);
    kiln_dataset_free(sh);
    kiln_dataset_free(ds);
}

/* ------------------------------------------------------------------ feature shapes */

static void test_shapes(void **state)
{
    (void)state;
    float feat[4] = {1, 2, 3, 4};
    int64_t lab[2] = {0, 1};
    /* 2^40 x 2^40 overflows int64 (it used to wrap to feature_numel 0) */
    assert_null(kiln_dataset_from_arrays(2, 2, (int64_t[]){1LL << 40, 1LL << 40}, feat, lab, 2, NULL, 0));
    expect_error("[1099511627776, 1099511627776]");
    /* the element count fits, n times it does not */
    assert_null(kiln_dataset_from_arrays(4, 2, (int64_t[]){1LL << 31, 1LL << 30}, feat, lab, 2, NULL, 0));
    expect_error("too large to address");
    assert_null(kiln_dataset_from_arrays(2, 1, (int64_t[]){2}, feat, NULL, 0, feat, -1));
    kiln_dataset *ds = kiln_dataset_from_arrays(2, 1, (int64_t[]){2}, feat, lab, 2, NULL, 0);
    assert_non_null(ds);
    kiln_dataset_info in = kiln_dataset_get_info(ds);
    assert_int_equal(in.feature_numel, 2);
    float x[2];
    double t;
    assert_int_equal(kiln_dataset_get(ds, 1, x, &t, 0), 0);
    assert_true(x[0] == 3 && x[1] == 4 && t == 1);

    /* windows of 2^62 items of 2 features: the window's shape overflows */
    assert_null(kiln_dataset_windows(ds, (int64_t)1 << 62, 1));
    expect_error("too large to address");
    kiln_dataset *w = kiln_dataset_windows(ds, 2, 1);
    assert_non_null(w);
    in = kiln_dataset_get_info(w);
    assert_true(in.length == 1 && in.feature_numel == 4);
    kiln_dataset_free(w);

    /* a batch_size far past the data set: one batch of every item, no huge slot */
    kiln_device *dev = kiln_device_open("cpu?threads=1");
    assert_non_null(dev);
    kiln_loader_config lc = kiln_loader_config_default();
    lc.batch_size = INT64_MAX;
    lc.shuffle = false;
    kiln_loader *ld = kiln_loader_create(ds, &lc, dev);
    if (!ld)
        fail_msg("loader: %s", kiln_error());
    assert_int_equal(kiln_loader_batches(ld), 1);
    assert_int_equal(kiln_loader_start(ld, 0, 0), 0);
    kiln_batch b;
    kiln_scope_begin();
    assert_int_equal(kiln_loader_next(ld, &b), 1);
    assert_int_equal(b.n, 2);
    float bx[4];
    assert_int_equal(kiln_to_data(b.x, bx, sizeof bx), 0);
    assert_true(bx[0] == 1 && bx[3] == 4);
    kiln_scope_end();
    assert_int_equal(kiln_loader_next(ld, &b), 0);
    kiln_loader_free(ld);
    kiln_device_close(dev);
    kiln_dataset_free(ds);

    /* an image folder of INT_MAX x INT_MAX RGB images: 3 * 2^62 overflows */
    char root[512], cls[600];
    path_of(root, sizeof root, "images");
    snprintf(cls, sizeof cls, "%s/a", root);
    mkdir(root, 0700);
    mkdir(cls, 0700);
    assert_null(kiln_dataset_image_folder(root, 3, INT_MAX, INT_MAX));
    expect_error("too large to address");
    rmdir(cls);
    rmdir(root);
}

/* ---------------------------------------------------------------------------- IDX */

static void test_idx(void **state)
{
    (void)state;
    char p[512];
    /* three 0xffffffff dims: the product overflows int64 */
    unsigned char ovf[28] = {0, 0, 8, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    write_bytes("ovf.idx", ovf, sizeof ovf, false);
    path_of(p, sizeof p, "ovf.idx");
    assert_null(kiln_dataset_idx(p, NULL));
    expect_error("implausibly large");

    /* [4e9, 4] u8 is under the plausibility limit but the file has 12 bytes: refused by
     * length, before the 16 GB (and 128 GB of decoded values) are allocated */
    unsigned char big[12] = {0, 0, 8, 2, 0xee, 0x6b, 0x28, 0x00, 0, 0, 0, 4};
    for (int gz = 0; gz < 2; gz++) {
        write_bytes(gz ? "big.idx.gz" : "big.idx", big, sizeof big, gz);
        path_of(p, sizeof p, gz ? "big.idx.gz" : "big.idx");
        assert_null(kiln_dataset_idx(p, NULL));
        expect_error(gz ? "truncated: header says 16000000012 bytes, file has 12 (decompressed)"
                        : "truncated: header says 16000000012 bytes, file has 12");
    }

    /* [3, 2, 2] u8 with 10 of its 12 data bytes; then the whole of it, raw and gzipped */
    unsigned char im[28] = {0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 2};
    for (int k = 0; k < 12; k++)
        im[16 + k] = (unsigned char)(k * 20);
    unsigned char lb[11] = {0, 0, 8, 1, 0, 0, 0, 3, 2, 0, 1};
    write_bytes("lb.idx", lb, sizeof lb, false);
    char lp[512];
    path_of(lp, sizeof lp, "lb.idx");
    write_bytes("short.idx", im, 26, false);
    path_of(p, sizeof p, "short.idx");
    assert_null(kiln_dataset_idx(p, lp));
    expect_error("short.idx: truncated: header says 28 bytes, file has 26");
    for (int gz = 0; gz < 2; gz++) {
        write_bytes(gz ? "im.idx.gz" : "im.idx", im, sizeof im, gz);
        path_of(p, sizeof p, gz ? "im.idx.gz" : "im.idx");
        kiln_dataset *ds = kiln_dataset_idx(p, lp);
        if (!ds)
            fail_msg("%s: %s", p, kiln_error());
        kiln_dataset_info in = kiln_dataset_get_info(ds);
        assert_true(in.length == 3 && in.feature_numel == 4 && in.num_classes == 3);
        float x[4];
        double t;
        assert_int_equal(kiln_dataset_get(ds, 2, x, &t, 0), 0);
        assert_true(t == 1);
        assert_true(x[3] == (float)(11 * 20 / 255.0));
        kiln_dataset_free(ds);
    }
}

/* ---------------------------------------------------------------------------- CSV */

static kiln_dataset *csv(const char *name, const char *text)
{
    char p[512];
    path_of(p, sizeof p, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return kiln_dataset_csv(p, "label", 0, NULL);
}

/* The labels of ds's items, and its class count. */
static void expect_labels(kiln_dataset *ds, int64_t classes, int n, const double *want)
{
    if (!ds)
        fail_msg("csv: %s", kiln_error());
    kiln_dataset_info in = kiln_dataset_get_info(ds);
    assert_int_equal(in.num_classes, classes);
    assert_int_equal(in.length, n);
    for (int i = 0; i < n; i++) {
        float x[4];
        double t;
        assert_int_equal(kiln_dataset_get(ds, i, x, &t, 0), 0);
        if (t != want[i])
            fail_msg("item %d: label %g, want %g", i, t, want[i]);
    }
    kiln_dataset_free(ds);
}

static void test_csv_labels(void **state)
{
    (void)state;
    /* one odd label used to turn the column into strings, renumbering class 2 as 0 */
    assert_null(csv("mix.csv", "a,label\n1,2\n2,0\n3,1\n4,-1\n"));
    expect_error("line 5, column 2: label '-1' is not a class index");
    /* "1.0" and "01" are class 1, not new classes */
    expect_labels(csv("one.csv", "a,label\n1,2\n2,0\n3,1\n4,1.0\n5,01\n"), 3, 5, (double[]){2, 0, 1, 1, 1});
    /* numbers are kept as written, gaps included */
    expect_labels(csv("gap.csv", "a,label\n1,3\n2,0\n"), 4, 2, (double[]){3, 0});
    assert_null(csv("frac.csv", "a,label\n1,0\n2,1.5\n"));
    expect_error("line 3, column 2: label '1.5'");
    assert_null(csv("word.csv", "a,label\n1,0\n2,cat\n"));
    expect_error("label 'cat' is not a class index");
    assert_null(csv("huge.csv", "a,label\n1,99999999999\n"));
    expect_error("[0, 1000000)");
    assert_null(csv("empty.csv", "a,label\n1,0\n2,\n"));
    expect_error("line 3: empty label");
    /* names, in order of first appearance; a name that looks like a number is a name */
    expect_labels(csv("names.csv", "a,label\n1,dog\n2,cat\n3,dog\n4,1\n"), 3, 4, (double[]){0, 1, 0, 2});
    /* the names stay with the data set (a trained model's class 0 means something), through a split
     * to its halves; numeric labels have none */
    kiln_dataset *named = csv("names.csv", "a,label\n1,dog\n2,cat\n3,dog\n4,1\n");
    assert_non_null(named);
    assert_string_equal(kiln_dataset_class_name(named, 0), "dog");
    assert_string_equal(kiln_dataset_class_name(named, 1), "cat");
    assert_string_equal(kiln_dataset_class_name(named, 2), "1");
    assert_null(kiln_dataset_class_name(named, 3));
    assert_null(kiln_dataset_class_name(named, -1));
    kiln_dataset *train = NULL, *valid = NULL;
    assert_int_equal(kiln_dataset_split(named, 0.5, 7, &train, &valid), 0);
    kiln_dataset_free(named);
    assert_string_equal(kiln_dataset_class_name(train, 1), "cat");
    assert_string_equal(kiln_dataset_class_name(valid, 2), "1");
    kiln_dataset_free(train);
    kiln_dataset_free(valid);
    kiln_dataset *numbered = csv("gap.csv", "a,label\n1,3\n2,0\n");
    assert_non_null(numbered);
    assert_null(kiln_dataset_class_name(numbered, 0));
    kiln_dataset_free(numbered);
    assert_null(kiln_dataset_class_name(NULL, 0));
    /* header only: no classes */
    expect_labels(csv("hdr.csv", "a,label\n"), 0, 0, NULL);

    char p[512];
    path_of(p, sizeof p, "one.csv");
    assert_null(kiln_dataset_csv(p, "label", -1, NULL));
    expect_error("nfeatures -1");
}

/* Features are f32: 1e40 is a finite double and was stored as inf. */
static void test_csv_feature_f32_range(void **state)
{
    (void)state;
    assert_null(csv("f32.csv", "a,b,label\n1,2,0\n3,1e40,1\n"));
    expect_error("f32.csv: line 3, column 2: '1e40' is outside the f32 range");
    assert_null(csv("f32.csv", "a,b,label\n-1e39,2,0\n"));
    expect_error("line 2, column 1: '-1e39' is outside the f32 range");
    /* the largest f32 and tiny values (which round to 0) are fine */
    kiln_dataset *ds = csv("f32.csv", "a,b,label\n3.4e38,1e-50,0\n");
    if (!ds)
        fail_msg("csv: %s", kiln_error());
    float x[2];
    double t;
    assert_int_equal(kiln_dataset_get(ds, 0, x, &t, 0), 0);
    assert_true(x[0] == 3.4e38f && x[1] == 0.0f);
    kiln_dataset_free(ds);
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/kiln-data-limits-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    static const char *const files[] = {"ovf.idx",   "big.idx",   "big.idx.gz", "lb.idx",  "short.idx", "im.idx",
                                        "im.idx.gz", "mix.csv",   "one.csv",    "gap.csv", "frac.csv",  "word.csv",
                                        "huge.csv",  "empty.csv", "names.csv",  "hdr.csv", "f32.csv"};
    char p[512];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        path_of(p, sizeof p, files[i]);
        unlink(p);
    }
    path_of(p, sizeof p, "images/a"); /* left by a failed test_shapes */
    rmdir(p);
    path_of(p, sizeof p, "images");
    rmdir(p);
    rmdir(dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_range_subset_split),
        cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_idx),
        cmocka_unit_test(test_csv_labels),
        cmocka_unit_test(test_csv_feature_f32_range),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
