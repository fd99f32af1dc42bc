/*
 * tests/storage/test_safetensors.c — the safetensors reader against well-formed and
 * hostile files, and round trips through the writer on every dtype.
 */
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
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

#include <cjson/cJSON.h>

#include "kiln/kiln.h"
#include "kiln/record.h"

/* A file image: 8-byte length, the header text, then data_len bytes of pattern. */
typedef struct image {
    unsigned char *bytes;
    size_t len;
} image;

static image make_image(const char *header, size_t data_len)
{
    size_t hlen = strlen(header);
    image im = {malloc(8 + hlen + data_len + 1), 8 + hlen + data_len};
    uint64_t h = hlen;
    memcpy(im.bytes, &h, 8);
    memcpy(im.bytes + 8, header, hlen);
    for (size_t i = 0; i < data_len; i++)
        im.bytes[8 + hlen + i] = (unsigned char)(i * 7 + 1);
    return im;
}

/* Opening must fail and the message must contain `needle`. */
static void expect_reject(const char *header, size_t data_len, const char *needle)
{
    image im = make_image(header, data_len);
    kiln_error_clear();
    kiln_safetensors *st = kiln_safetensors_open_memory(im.bytes, im.len);
    if (st)
        fail_msg("accepted a malformed header: %s", header);
    if (!strstr(kiln_error(), needle))
        fail_msg("message '%s' lacks '%s' for header %s", kiln_error(), needle, header);
    free(im.bytes);
}

static void test_valid_file_and_accessors(void **state)
{
    (void)state;
    const char *h = "{\"__metadata__\":{\"format\":\"pt\",\"epoch\":\"3\"},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[24,32]},"
                    "\"a\":{\"dtype\":\"I16\",\"shape\":[3,4],\"data_offsets\":[0,24]}}";
    image im = make_image(h, 32);
    kiln_safetensors *st = kiln_safetensors_open_memory(im.bytes, im.len);
    assert_non_null(st);
    assert_int_equal(kiln_safetensors_count(st), 2);
    assert_string_equal(kiln_safetensors_name(st, 0), "b");
    assert_int_equal(kiln_safetensors_find(st, "a"), 1);
    assert_int_equal(kiln_safetensors_find(st, "zz"), -1);
    int dtype, ndim;
    int64_t shape[KILN_MAX_DIMS];
    assert_int_equal(kiln_safetensors_info(st, 1, &dtype, &ndim, shape), 0);
    assert_int_equal(dtype, -1); /* I16 validates but has no kiln dtype */
    assert_int_equal(ndim, 2);
    assert_int_equal(shape[0], 3);
    assert_int_equal(shape[1], 4);
    assert_string_equal(kiln_safetensors_dtype_string(st, 1), "I16");
    assert_string_equal(kiln_safetensors_metadata(st, "format"), "pt");
    assert_string_equal(kiln_safetensors_metadata(st, "epoch"), "3");
    assert_null(kiln_safetensors_metadata(st, "missing"));
    assert_int_equal(kiln_safetensors_metadata_count(st), 2);
    kiln_safetensors_close(st);
    free(im.bytes);
}

static void test_rejects_malformed_headers(void **state)
{
    (void)state;
    expect_reject("[1,2]", 0, "JSON object");
    expect_reject("{\"a\":", 0, "not valid JSON");
    expect_reject("{\"a\":5}", 0, "not an object");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "data_offsets");
    expect_reject("{\"a\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "shape[0]");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, "shape[0]");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,4]}}", 4, "shape[0]");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
                  "9 dims");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "outside");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "outside");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "needs 12");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
                  "\"data_offsets\":[0,8]}}", 8, "overflows");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                  "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "overlaps");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "belong to no");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, "belong to no");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "duplicate");
    expect_reject("{\"__metadata__\":{\"k\":1}}", 0, "not a string");
    expect_reject("{\"__metadata__\":[]}", 0, "not an object");
    expect_reject("{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "empty name");
    expect_reject("{}", 4, "no tensors");
}

/* Headers the reader once misread: a dim past 2^53 called "not a non-negative integer", text
 * after the header's object accepted, a name with \u0000 read cut short. */
static void test_header_edges(void **state)
{
    (void)state;
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,0]}}", 0,
                  "shape[0] 4.61169e+18 is too large");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1e400],\"data_offsets\":[0,4]}}", 4, "too large");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[18446744073709551615,3]}}", 4,
                  "data_offsets are too large");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} trailing", 4,
                  "other than whitespace after its JSON object");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}{}", 4, "after its JSON");
    expect_reject("{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "NUL");
    expect_reject("{\"__metadata__\":{\"k\":\"v\\u0000w\"}}", 0, "NUL");
    expect_reject("{\"\\u0000\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "NUL");

    /* what the format allows still opens: whitespace padding after the object, an escaped
     * backslash before "u0000" (a name holding the text \u0000, no NUL) */
    const char *ok[] = {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}    \n\t ",
                        "{\"a\\\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}"};
    const char *names[] = {"a", "a\\u0000b"};
    for (int i = 0; i < 2; i++) {
        image im = make_image(ok[i], 4);
        kiln_safetensors *st = kiln_safetensors_open_memory(im.bytes, im.len);
        if (!st)
            fail_msg("refused %s: %s", ok[i], kiln_error());
        assert_string_equal(kiln_safetensors_name(st, 0), names[i]);
        kiln_device *dev = kiln_device_open("cpu");
        kiln_tensor *t = kiln_safetensors_load(st, names[i], dev);
        float v = 0, want;
        memcpy(&want, im.bytes + im.len - 4, 4);
        assert_true(t && kiln_to_data(t, &v, 4) == 0 && memcmp(&v, &want, 4) == 0);
        kiln_tensor_release(t);
        kiln_device_close(dev);
        kiln_safetensors_close(st);
        free(im.bytes);
    }
}

static void test_rejects_bad_lengths(void **state)
{
    (void)state;
    unsigned char tiny[5] = {1, 2, 3, 4, 5};
    assert_null(kiln_safetensors_open_memory(tiny, sizeof tiny));
    assert_non_null(strstr(kiln_error(), "too short"));

    image im = make_image("{}", 0);
    uint64_t huge = 1ull << 40;
    memcpy(im.bytes, &huge, 8);
    assert_null(kiln_safetensors_open_memory(im.bytes, im.len));
    assert_non_null(strstr(kiln_error(), "limit"));
    uint64_t past = 100;
    memcpy(im.bytes, &past, 8);
    assert_null(kiln_safetensors_open_memory(im.bytes, im.len));
    assert_non_null(strstr(kiln_error(), "past the end"));
    free(im.bytes);

    assert_null(kiln_safetensors_open("/nonexistent/kiln/file.safetensors"));
    assert_non_null(strstr(kiln_error(), "No such file"));
}

/* Every prefix of a valid file is either refused or (for the full length) accepted:
 * truncation can never be read past. */
static void test_truncated_prefixes(void **state)
{
    (void)state;
    image im = make_image("{\"w\":{\"dtype\":\"F64\",\"shape\":[2,2],\"data_offsets\":[0,32]}}", 32);
    for (size_t n = 0; n < im.len; n++) {
        unsigned char *copy = malloc(n ? n : 1);
        memcpy(copy, im.bytes, n);
        kiln_safetensors *st = kiln_safetensors_open_memory(copy, n);
        assert_null(st);
        free(copy);
    }
    kiln_safetensors *st = kiln_safetensors_open_memory(im.bytes, im.len);
    assert_non_null(st);
    kiln_safetensors_close(st);
    free(im.bytes);
}

/* A fresh path in a fresh temporary folder. */
static char *temp_path(const char *name)
{
    static char dir[] = "/tmp/kiln-st-XXXXXX";
    static bool made;
    if (!made) {
        assert_non_null(mkdtemp(dir));
        made = true;
    }
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

/* Save one tensor per dtype (including a non-contiguous view) with metadata, reopen,
 * and compare bytes. */
static void test_round_trip_every_dtype(void **state)
{
    (void)state;
    kiln_device *dev = kiln_device_open("ref");
    assert_non_null(dev);
    kiln_tensor *ts[KILN_DTYPE_COUNT + 1];
    char names[KILN_DTYPE_COUNT + 1][32];
    const char *name_ptrs[KILN_DTYPE_COUNT + 1];
    for (int dt = 0; dt < KILN_DTYPE_COUNT; dt++) {
        kiln_tensor *f = kiln_arange(dev, KILN_F64, -5, 7, 1); /* 12 values */
        kiln_tensor *r = kiln_reshape(f, KILN_SHAPE(3, 4));
        ts[dt] = kiln_cast(r, (kiln_dtype)dt);
        assert_non_null(ts[dt]);
        kiln_tensor_release(r);
        kiln_tensor_release(f);
        snprintf(names[dt], sizeof names[dt], "t.%s", kiln_dtype_name((kiln_dtype)dt));
        name_ptrs[dt] = names[dt];
    }
    /* a transposed view must be written in logical (row-major) order */
    ts[KILN_DTYPE_COUNT] = kiln_transpose(ts[KILN_F32], 0, 1);
    snprintf(names[KILN_DTYPE_COUNT], 32, "view");
    name_ptrs[KILN_DTYPE_COUNT] = names[KILN_DTYPE_COUNT];

    const char *keys[] = {"format", "note"}, *vals[] = {"kiln", "round trip"};
    char *path = temp_path("all.safetensors");
    assert_int_equal(kiln_safetensors_save(path, KILN_DTYPE_COUNT + 1, name_ptrs, ts, 2, keys, vals), 0);

    kiln_safetensors *st = kiln_safetensors_open(path);
    assert_non_null(st);
    assert_int_equal(kiln_safetensors_count(st), KILN_DTYPE_COUNT + 1);
    assert_string_equal(kiln_safetensors_metadata(st, "note"), "round trip");
    for (int i = 0; i <= KILN_DTYPE_COUNT; i++) {
        kiln_tensor *back = kiln_safetensors_load(st, name_ptrs[i], dev);
        assert_non_null(back);
        assert_int_equal(kiln_tensor_dtype(back), kiln_tensor_dtype(ts[i]));
        assert_int_equal(kiln_tensor_ndim(back), 2);
        assert_int_equal(kiln_tensor_dim(back, 0), kiln_tensor_dim(ts[i], 0));
        size_t n = (size_t)kiln_tensor_numel(back) * kiln_dtype_size(kiln_tensor_dtype(back));
        unsigned char *want = malloc(n), *got = malloc(n);
        assert_int_equal(kiln_to_data(ts[i], want, n), 0);
        assert_int_equal(kiln_to_data(back, got, n), 0);
        assert_memory_equal(want, got, n);
        free(want);
        free(got);
        kiln_tensor_release(back);
    }
    /* values, not just bytes: the view's first row is column 0 of the original */
    kiln_tensor *v = kiln_safetensors_load(st, "view", dev);
    float row[3];
    kiln_tensor *r0 = kiln_narrow(v, 0, 0, 1);
    assert_int_equal(kiln_to_data(r0, row, sizeof row), 0);
    assert_true(row[0] == -5.0f && row[1] == -1.0f && row[2] == 3.0f);
    kiln_tensor_release(r0);
    kiln_tensor_release(v);
    kiln_safetensors_close(st);
    for (int i = 0; i <= KILN_DTYPE_COUNT; i++)
        kiln_tensor_release(ts[i]);
    unlink(path);
    free(path);
    kiln_device_close(dev);
}

/* Bool bytes other than 0/1 in a file are normalized, and unsupported dtypes name
 * themselves on load. */
static void test_load_bool_and_unsupported(void **state)
{
    (void)state;
    kiln_device *dev = kiln_device_open("ref");
    image im = make_image("{\"m\":{\"dtype\":\"BOOL\",\"shape\":[4],\"data_offsets\":[0,4]},"
                          "\"q\":{\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[4,6]}}", 6);
    im.bytes[im.len - 6] = 0;
    im.bytes[im.len - 5] = 2;
    im.bytes[im.len - 4] = 255;
    im.bytes[im.len - 3] = 1;
    kiln_safetensors *st = kiln_safetensors_open_memory(im.bytes, im.len);
    assert_non_null(st);
    kiln_tensor *m = kiln_safetensors_load(st, "m", dev);
    assert_non_null(m);
    unsigned char b[4];
    assert_int_equal(kiln_to_data(m, b, 4), 0);
    assert_true(b[0] == 0 && b[1] == 1 && b[2] == 1 && b[3] == 1);
    kiln_tensor_release(m);
    assert_null(kiln_safetensors_load(st, "q", dev));
    assert_non_null(strstr(kiln_error(), "I8"));
    assert_null(kiln_safetensors_load(st, "nope", dev));
    assert_non_null(strstr(kiln_error(), "no tensor named 'nope'"));
    /* a NULL device or handle gave NULL with no message of its own */
    kiln_error_clear();
    assert_null(kiln_safetensors_load(st, "m", NULL));
    assert_non_null(strstr(kiln_error(), ": load 'm': the device (dev) is NULL"));
    kiln_error_clear();
    assert_null(kiln_safetensors_load(NULL, "m", dev));
    assert_non_null(strstr(kiln_error(), "safetensors load 'm': the file handle (st) is NULL"));
    kiln_safetensors_close(st);
    free(im.bytes);
    kiln_device_close(dev);
}

/* A failed save leaves an existing file untouched and no temporary behind. */
static void test_failed_save_keeps_old_file(void **state)
{
    (void)state;
    kiln_device *dev = kiln_device_open("ref");
    kiln_tensor *a = kiln_ones(dev, KILN_F32, KILN_SHAPE(2));
    char *path = temp_path("keep.safetensors");
    const char *n1[] = {"a"};
    assert_int_equal(kiln_safetensors_save(path, 1, n1, &a, 0, NULL, NULL), 0);
    kiln_tensor *two[] = {a, a};
    const char *dup[] = {"x", "x"};
    assert_true(kiln_safetensors_save(path, 2, dup, two, 0, NULL, NULL) < 0);
    assert_non_null(strstr(kiln_error(), "duplicate name 'x'"));
    kiln_tensor *withnull[] = {a, NULL};
    const char *n2[] = {"a", "b"};
    assert_true(kiln_safetensors_save(path, 2, n2, withnull, 0, NULL, NULL) < 0);
    assert_true(kiln_safetensors_save("/nonexistent-dir/x.safetensors", 1, n1, &a, 0, NULL, NULL) < 0);
    kiln_safetensors *st = kiln_safetensors_open(path);
    assert_non_null(st);
    assert_int_equal(kiln_safetensors_count(st), 1);
    kiln_safetensors_close(st);
    /* no temporary file left behind in the folder */
    char *dir = strdup(path);
    *strrchr(dir, '/') = '\0';
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *ent;
    while ((ent = readdir(d)))
        assert_null(strstr(ent->d_name, ".tmp."));
    closedir(d);
    free(dir);
    unlink(path);
    free(path);
    kiln_tensor_release(a);
    kiln_device_close(dev);
}

/* A file written by PyTorch's safetensors package (tests/fixtures/gen_safetensors.py):
 * every dtype kiln has, and random values checked against the exact numbers the
 * generator stored in the metadata. */
static void test_reads_file_written_by_torch(void **state)
{
    (void)state;
    kiln_device *dev = kiln_device_open("ref");
    kiln_safetensors *st = kiln_safetensors_open(KILN_FIXTURES "/safetensors/torch_small.safetensors");
    if (!st)
        fail_msg("%s", kiln_error());
    assert_string_equal(kiln_safetensors_metadata(st, "format"), "pt");
    for (int dt = 0; dt < KILN_DTYPE_COUNT; dt++) {
        char name[32];
        snprintf(name, sizeof name, "t.%s", kiln_dtype_name((kiln_dtype)dt));
        kiln_tensor *t = kiln_safetensors_load(st, name, dev);
        if (!t)
            fail_msg("%s: %s", name, kiln_error());
        assert_int_equal(kiln_tensor_dtype(t), dt);
        kiln_tensor *d = kiln_cast(t, KILN_F64);
        double got[12];
        assert_int_equal(kiln_to_data(d, got, sizeof got), 0);
        for (int i = 0; i < 12; i++) {
            int v = i - 5;
            double want = v;
            if (dt == KILN_U8)
                want = (uint8_t)v;
            else if (dt == KILN_BOOL)
                want = ((v % 3) + 3) % 3 == 0;
            if (got[i] != want)
                fail_msg("%s[%d] = %g, torch wrote %g", name, i, got[i], want);
        }
        kiln_tensor_release(d);
        kiln_tensor_release(t);
    }
    cJSON *vals = cJSON_Parse(kiln_safetensors_metadata(st, "randn_values"));
    assert_non_null(vals);
    kiln_tensor *r = kiln_safetensors_load(st, "randn", dev);
    assert_int_equal(kiln_tensor_ndim(r), 3);
    float got[30];
    assert_int_equal(cJSON_GetArraySize(vals), 30);
    assert_int_equal(kiln_to_data(r, got, sizeof got), 0);
    for (int i = 0; i < 30; i++)
        assert_true(got[i] == (float)cJSON_GetArrayItem(vals, i)->valuedouble);
    cJSON_Delete(vals);
    kiln_tensor_release(r);
    kiln_safetensors_close(st);
    kiln_device_close(dev);
}

/* Tensors from a file opened with kiln_safetensors_open_mapped are used in place (once per
 * entry), stay valid after the handle closes, and a second load of the same entry is an
 * independent copy. */
static void test_zero_copy_load(void **state)
{
    (void)state;
    const char *devs[] = {"ref", "cpu"};
    for (int d = 0; d < 2; d++) {
        kiln_device *dev = kiln_device_open(devs[d]);
        assert_non_null(dev);
        kiln_tensor *w = kiln_arange(dev, KILN_F32, 0, 48, 1);   /* 192 bytes */
        kiln_tensor *b = kiln_arange(dev, KILN_F64, 0, 4, 0.5);  /* 8 values, 64 bytes */
        kiln_tensor *ts[] = {w, b};
        const char *names[] = {"w", "b"};
        char *path = temp_path(d ? "zc-cpu.safetensors" : "zc-ref.safetensors");
        assert_int_equal(kiln_safetensors_save(path, 2, names, ts, 0, NULL, NULL), 0);
        kiln_safetensors *st = kiln_safetensors_open_mapped(path);
        assert_non_null(st);
        kiln_tensor *w1 = kiln_safetensors_load(st, "w", dev);
        kiln_tensor *b1 = kiln_safetensors_load(st, "b", dev);
        assert_int_equal(kiln_safetensors_zero_copy_count(st), 2);
        kiln_tensor *w2 = kiln_safetensors_load(st, "w", dev); /* second load: a copy */
        assert_int_equal(kiln_safetensors_zero_copy_count(st), 2);
        assert_false(kiln_tensor_shares_storage(w1, w2));
        kiln_safetensors_close(st); /* the lent tensors keep the mapping alive */
        float wv[48];
        double bv[8];
        assert_int_equal(kiln_to_data(w1, wv, sizeof wv), 0);
        assert_int_equal(kiln_to_data(b1, bv, sizeof bv), 0);
        assert_true(wv[0] == 0.0f && wv[47] == 47.0f && bv[7] == 3.5);
        kiln_scope_begin(); /* compute on it */
        assert_true(kiln_item(kiln_sum(kiln_add(w1, w2), KILN_ALL_DIMS, false)) == 2 * (47.0 * 48 / 2));
        kiln_scope_end();
        kiln_tensor_release(w1);
        kiln_tensor_release(w2);
        kiln_tensor_release(b1); /* last user: the mapping goes (ASan checks the order) */
        kiln_tensor_release(w);
        kiln_tensor_release(b);
        unlink(path);
        free(path);
        kiln_device_close(dev);
    }
}

/* Overwrite bytes [at, at + n) of path in place with 0xff (what `cp` or Python's save_file
 * over an existing file does: same inode, new bytes). */
static void overwrite_in_place(const char *path, off_t at, size_t n)
{
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    unsigned char *junk = malloc(n);
    memset(junk, 0xff, n);
    assert_int_equal(pwrite(fd, junk, n, at), (ssize_t)n);
    assert_int_equal(fsync(fd), 0);
    close(fd);
    free(junk);
}

/* A loaded tensor owns its memory: rewriting the file in place leaves its values alone, and
 * truncating the file neither changes them nor kills the process (SIGBUS, when tensors
 * were the file's mapped pages). A load after the truncation is a clean error. */
static void test_loads_survive_file_changes(void **state)
{
    (void)state;
    const char *devs[] = {"cpu", "ref"};
    for (int d = 0; d < 2; d++) {
        kiln_device *dev = kiln_device_open(devs[d]);
        const int N = 1 << 16; /* 256 KiB: many pages */
        kiln_tensor *w = kiln_arange(dev, KILN_F32, 0, N, 1);
        kiln_tensor *b = kiln_arange(dev, KILN_I64, 0, 8, 1);
        kiln_tensor *ts[] = {w, b};
        const char *names[] = {"w", "b"};
        char *path = temp_path("changing.safetensors");
        assert_int_equal(kiln_safetensors_save(path, 2, names, ts, 0, NULL, NULL), 0);
        kiln_safetensors *st = kiln_safetensors_open(path);
        assert_non_null(st);
        kiln_tensor *w1 = kiln_safetensors_load(st, "w", dev);
        assert_non_null(w1);
        struct stat sb;
        assert_int_equal(stat(path, &sb), 0);
        overwrite_in_place(path, 4096, (size_t)sb.st_size - 4096 - 64); /* w's bytes, b's kept */
        float *v = malloc(N * sizeof *v);
        assert_int_equal(kiln_to_data(w1, v, N * sizeof *v), 0);
        for (int i = 0; i < N; i++)
            if (v[i] != (float)i)
                fail_msg("%s: w[%d] = %g after the file was rewritten in place, not %d", devs[d], i, v[i], i);
        assert_int_equal(truncate(path, 100), 0);
        memset(v, 0, N * sizeof *v);
        assert_int_equal(kiln_to_data(w1, v, N * sizeof *v), 0);
        for (int i = 0; i < N; i++)
            if (v[i] != (float)i)
                fail_msg("%s: w[%d] = %g after the file was truncated, not %d", devs[d], i, v[i], i);
        kiln_scope_begin();
        assert_true(kiln_item(kiln_sum(w1, KILN_ALL_DIMS, false)) == (double)N * (N - 1) / 2);
        kiln_scope_end();
        assert_int_equal(kiln_safetensors_zero_copy_count(st), 0);
        /* the file no longer holds b's bytes: an error, not garbage or a signal */
        kiln_error_clear();
        assert_null(kiln_safetensors_load(st, "b", dev));
        assert_non_null(strstr(kiln_error(), "reading tensor 'b'"));
        assert_non_null(strstr(kiln_error(), "ended early"));
        kiln_safetensors_close(st);
        kiln_tensor_release(w1);
        free(v);
        kiln_tensor_release(w);
        kiln_tensor_release(b);
        unlink(path);
        free(path);
        kiln_device_close(dev);
    }
}

/* Python reads __metadata__ into a dict (the last of two equal keys wins) and refuses a
 * header that is not UTF-8; kiln's reader took the first key. Both are refused, on write
 * and on read, naming the key. */
static void test_metadata_keys_and_utf8(void **state)
{
    (void)state;
    kiln_device *dev = kiln_device_open("ref");
    kiln_tensor *a = kiln_ones(dev, KILN_F32, KILN_SHAPE(2));
    char *path = temp_path("utf8.safetensors");
    const char *n1[] = {"a"};
    const char *dupk[] = {"k", "other", "k"}, *dupv[] = {"1", "2", "3"};
    assert_true(kiln_safetensors_save(path, 1, n1, &a, 3, dupk, dupv) < 0);
    assert_non_null(strstr(kiln_error(), "metadata key 'k' is given more than once"));
    const char *badname[] = {"w\xc3("}; /* a lead byte without its continuation */
    assert_true(kiln_safetensors_save(path, 1, badname, &a, 0, NULL, NULL) < 0);
    assert_non_null(strstr(kiln_error(), "tensor name 'w\\xc3(' is not valid UTF-8"));
    const char *badkey[] = {"\xed\xa0\x80"}, *okval[] = {"v"}; /* an encoded surrogate */
    assert_true(kiln_safetensors_save(path, 1, n1, &a, 1, badkey, okval) < 0);
    assert_non_null(strstr(kiln_error(), "metadata key '\\xed\\xa0\\x80' is not valid UTF-8"));
    const char *okkey[] = {"note"}, *badval[] = {"\xc0\xaf"}; /* an overlong '/' */
    assert_true(kiln_safetensors_save(path, 1, n1, &a, 1, okkey, badval) < 0);
    assert_non_null(strstr(kiln_error(), "value of metadata key 'note' is not valid UTF-8"));
    assert_int_equal(access(path, F_OK), -1); /* nothing was written */
    /* real UTF-8 (2, 3 and 4 bytes) round-trips */
    const char *uname[] = {"uni.\xe5\xb1\x82/\xc3\xb1"}, *ukey[] = {"\xf0\x9f\x94\xa5"},
               *uval[] = {"\xc3\xa9t\xc3\xa9"};
    assert_int_equal(kiln_safetensors_save(path, 1, uname, &a, 1, ukey, uval), 0);
    kiln_safetensors *st = kiln_safetensors_open(path);
    assert_non_null(st);
    assert_string_equal(kiln_safetensors_name(st, 0), uname[0]);
    assert_string_equal(kiln_safetensors_metadata(st, ukey[0]), uval[0]);
    kiln_safetensors_close(st);
    unlink(path);
    free(path);
    kiln_tensor_release(a);
    kiln_device_close(dev);

    expect_reject("{\"__metadata__\":{\"k\":\"1\",\"j\":\"2\",\"k\":\"3\"}}", 0,
                  "__metadata__ key 'k' appears more than once");
    expect_reject("{\"w\xc3(\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                  "entry name 'w\\xc3(' is not valid UTF-8");
    expect_reject("{\"__metadata__\":{\"\xff\":\"v\"}}", 0, "__metadata__ key '\\xff' is not valid UTF-8");
    expect_reject("{\"__metadata__\":{\"k\":\"\xf4\x90\x80\x80\"}}", 0, /* past U+10FFFF */
                  "__metadata__ value for 'k' is not valid UTF-8");
    expect_reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":\"\xe0\x80\x80\"}}", 4,
                  "header is not valid UTF-8");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_file_and_accessors),
        cmocka_unit_test(test_rejects_malformed_headers),
        cmocka_unit_test(test_header_edges),
        cmocka_unit_test(test_rejects_bad_lengths),
        cmocka_unit_test(test_truncated_prefixes),
        cmocka_unit_test(test_round_trip_every_dtype),
        cmocka_unit_test(test_load_bool_and_unsupported),
        cmocka_unit_test(test_failed_save_keeps_old_file),
        cmocka_unit_test(test_reads_file_written_by_torch),
        cmocka_unit_test(test_zero_copy_load),
        cmocka_unit_test(test_loads_survive_file_changes),
        cmocka_unit_test(test_metadata_keys_and_utf8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
