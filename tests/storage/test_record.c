/*
 * tests/storage/test_record.c — records (tensors + JSON config in one file): round trips,
 * plain and zstd-compressed, strict and lenient loading, dtype conversion on load, the
 * shape mismatch message, and I/O faults injected at every write/fsync/rename.
 */
#include <dirent.h>
#include <fcntl.h>
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
static char dir[64];

static int setup(void **state)
{
    (void)state;
    dev = kiln_device_open("cpu");
    snprintf(dir, sizeof dir, "/tmp/kiln-record-XXXXXX");
    return dev && mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    kiln__remove_tree(dir);
    kiln_device_close(dev);
    return 0;
}

static int count_entries(const char *d)
{
    DIR *h = opendir(d);
    int n = 0;
    struct dirent *de;
    while (h && (de = readdir(h)) != NULL)
        n += de->d_name[0] != '.';
    if (h)
        closedir(h);
    return n;
}

/* Two tensors: w f16 [2, 3] = 0..5 and b f32 [3] = 10, 11, 12. */
static void save_sample(const char *path, unsigned flags)
{
    float wv[6] = {0, 1, 2, 3, 4, 5};
    float bv[3] = {10, 11, 12};
    kiln_tensor *w32 = kiln_from_data(dev, KILN_F32, KILN_SHAPE(2, 3), wv, sizeof wv);
    kiln_tensor *w = kiln_cast(w32, KILN_F16);
    kiln_tensor *b = kiln_from_data(dev, KILN_F32, KILN_SHAPE(3), bv, sizeof bv);
    const char *names[] = {"fc.weight", "fc.bias"};
    kiln_tensor *ts[] = {w, b};
    assert_int_equal(kiln_record_save(path, 2, names, ts, "{\"in\": 3, \"out\": 2}", flags), 0);
    kiln_tensor_release(w32);
    kiln_tensor_release(w);
    kiln_tensor_release(b);
}

static void round_trip(unsigned flags)
{
    char path[128];
    snprintf(path, sizeof path, "%s/m.kiln", dir);
    save_sample(path, flags);
    kiln_record *rec = kiln_record_open(path);
    assert_non_null(rec);
    assert_int_equal(kiln_record_compressed(rec), (flags & KILN_RECORD_ZSTD) != 0);
    assert_non_null(strstr(kiln_record_config(rec), "\"out\""));
    assert_int_equal(kiln_safetensors_count(kiln_record_tensors(rec)), 2);
    /* f16 in the file, f32 asked: converted and reported. */
    kiln_record_slot slots[] = {
        {.name = "fc.weight", .dtype = KILN_F32, .ndim = 2, .shape = {2, 3}},
        {.name = "fc.bias", .dtype = -1, .ndim = 1, .shape = {3}},
    };
    kiln_tensor *out[2];
    kiln_record_report rep;
    assert_int_equal(kiln_record_load_slots(rec, 2, slots, dev, KILN_RECORD_STRICT, out, &rep), 0);
    assert_int_equal(rep.nconverted, 1);
    assert_string_equal(rep.converted[0], "fc.weight");
    assert_int_equal(kiln_tensor_dtype(out[0]), KILN_F32);
    float w[6], b[3];
    assert_int_equal(kiln_to_data(out[0], w, sizeof w), 0);
    assert_int_equal(kiln_to_data(out[1], b, sizeof b), 0);
    for (int i = 0; i < 6; i++)
        assert_true(w[i] == (float)i);
    assert_true(b[2] == 12.0f);
    kiln_record_report_free(&rep);
    kiln_tensor_release(out[0]);
    kiln_tensor_release(out[1]);
    kiln_record_close(rec);
    assert_int_equal(count_entries(dir), 1); /* no temporary siblings left behind */
}

static void test_round_trip_plain(void **state)
{
    (void)state;
    round_trip(0);
}

static void test_round_trip_zstd(void **state)
{
    (void)state;
    round_trip(KILN_RECORD_ZSTD);
}

static void test_zstd_smaller_and_detected(void **state)
{
    (void)state;
    char a[128], b[128];
    snprintf(a, sizeof a, "%s/plain.kiln", dir);
    snprintf(b, sizeof b, "%s/z.kiln", dir);
    kiln_tensor *z = kiln_zeros(dev, KILN_F32, KILN_SHAPE(256, 256));
    const char *names[] = {"zeros"};
    assert_int_equal(kiln_record_save(a, 1, names, &z, NULL, 0), 0);
    assert_int_equal(kiln_record_save(b, 1, names, &z, NULL, KILN_RECORD_ZSTD), 0);
    kiln_tensor_release(z);
    char *pa, *pb;
    size_t la, lb;
    assert_int_equal(kiln__read_file(a, 1 << 30, &pa, &la), 0);
    assert_int_equal(kiln__read_file(b, 1 << 30, &pb, &lb), 0);
    assert_true(lb * 20 < la);
    assert_memory_equal(pb, "KILNZSTD", 8);
    /* A damaged compressed record is refused with a message, never a crash. */
    pb[lb / 2] ^= 0x55;
    pb[lb - 3] ^= 0x55;
    kiln_record *rec = kiln_record_open_memory(pb, lb);
    if (rec) { /* zstd without checksum might still decode: then the image must still validate */
        assert_int_equal(kiln_safetensors_count(kiln_record_tensors(rec)), 1);
        kiln_record_close(rec);
    }
    rec = kiln_record_open_memory(pb, 20);
    assert_null(rec);
    assert_non_null(strstr(kiln_error(), "corrupt"));
    free(pa);
    free(pb);
}

static void test_strict_and_lenient(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/m.kiln", dir);
    save_sample(path, 0);
    kiln_record *rec = kiln_record_open(path);
    assert_non_null(rec);
    /* The code now expects fc.weight and a new fc.scale; the file's fc.bias is stale. */
    kiln_record_slot slots[] = {
        {.name = "fc.weight", .dtype = KILN_F16, .ndim = 2, .shape = {2, 3}},
        {.name = "fc.scale", .dtype = KILN_F32, .ndim = -1},
    };
    kiln_tensor *out[2] = {NULL, NULL};
    kiln_record_report rep;
    assert_int_not_equal(kiln_record_load_slots(rec, 2, slots, dev, KILN_RECORD_STRICT, out, &rep), 0);
    assert_non_null(strstr(kiln_error(), "missing"));
    assert_non_null(strstr(kiln_error(), "fc.scale"));
    assert_null(out[0]);
    kiln_record_report_free(&rep);

    /* Optional missing slot: strict now fails only on the unexpected key. */
    slots[1].optional = true;
    assert_int_not_equal(kiln_record_load_slots(rec, 2, slots, dev, KILN_RECORD_STRICT, out, NULL), 0);
    assert_non_null(strstr(kiln_error(), "unexpected"));
    assert_non_null(strstr(kiln_error(), "fc.bias"));

    assert_int_equal(kiln_record_load_slots(rec, 2, slots, dev, KILN_RECORD_LENIENT, out, &rep), 0);
    assert_non_null(out[0]);
    assert_null(out[1]);
    assert_int_equal(rep.nmissing, 1);
    assert_string_equal(rep.missing[0], "fc.scale");
    assert_int_equal(rep.nunexpected, 1);
    assert_string_equal(rep.unexpected[0], "fc.bias");
    assert_int_equal(rep.nconverted, 0);
    kiln_record_report_free(&rep);
    kiln_tensor_release(out[0]);
    kiln_record_close(rec);
}

static void test_shape_mismatch_names_key(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/m.kiln", dir);
    save_sample(path, KILN_RECORD_ZSTD);
    kiln_record *rec = kiln_record_open(path);
    kiln_record_slot slots[] = {
        {.name = "fc.weight", .dtype = KILN_F32, .ndim = 2, .shape = {3, 2}},
        {.name = "fc.bias", .dtype = KILN_F32, .ndim = 1, .shape = {3}},
    };
    kiln_tensor *out[2];
    assert_int_not_equal(kiln_record_load_slots(rec, 2, slots, dev, KILN_RECORD_LENIENT, out, NULL), 0);
    assert_non_null(strstr(kiln_error(), "'fc.weight'"));
    assert_non_null(strstr(kiln_error(), "[2, 3]"));
    assert_non_null(strstr(kiln_error(), "[3, 2]"));
    assert_null(out[0]);
    assert_null(out[1]);
    kiln_record_close(rec);
}

static void test_bad_config_and_missing_file(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/m.kiln", dir);
    kiln_tensor *t = kiln_zeros(dev, KILN_F32, KILN_SHAPE(2));
    const char *names[] = {"t"};
    assert_int_not_equal(kiln_record_save(path, 1, names, &t, "{not json", 0), 0);
    assert_non_null(strstr(kiln_error(), "JSON"));
    kiln_tensor_release(t);
    assert_null(kiln_record_open(path));
    assert_non_null(strstr(kiln_error(), path));
}

/* The config is one JSON object: text after it ("{} trailing") or another kind of value was
 * stored and read back as a config no parser accepts. */
static void test_config_is_one_object(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/c.kiln", dir);
    kiln_tensor *t = kiln_zeros(dev, KILN_F32, KILN_SHAPE(2));
    const char *names[] = {"t"};
    assert_int_not_equal(kiln_record_save(path, 1, names, &t, "{} trailing", 0), 0);
    assert_non_null(strstr(kiln_error(), "not valid JSON (at byte 3)"));
    assert_int_not_equal(kiln_record_save(path, 1, names, &t, "{\"a\":1}{\"b\":2}", 0), 0);
    assert_non_null(strstr(kiln_error(), "not valid JSON"));
    assert_int_not_equal(kiln_record_save(path, 1, names, &t, "[1, 2]", KILN_RECORD_ZSTD), 0);
    assert_non_null(strstr(kiln_error(), "must be a JSON object"));
    assert_int_equal(count_entries(dir), 0);
    assert_int_equal(kiln_record_save(path, 1, names, &t, " {\"in\": 3}\n", 0), 0); /* whitespace is fine */
    kiln_record *rec = kiln_record_open(path);
    assert_non_null(rec);
    assert_string_equal(kiln_record_config(rec), " {\"in\": 3}\n");
    kiln_record_close(rec);
    kiln_tensor_release(t);
}

/* A slot's dtype is a kiln dtype or -1 ("as stored"); -7 was taken for "as stored". */
static void test_slot_dtype_checked(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/m.kiln", dir);
    save_sample(path, 0);
    kiln_record *rec = kiln_record_open(path);
    assert_non_null(rec);
    kiln_record_slot slots[] = {{.name = "fc.weight", .dtype = -7, .ndim = -1},
                                {.name = "fc.bias", .dtype = -1, .ndim = -1}};
    kiln_tensor *out[2] = {NULL, NULL};
    assert_int_not_equal(kiln_record_load_slots(rec, 2, slots, dev, KILN_RECORD_STRICT, out, NULL), 0);
    assert_non_null(strstr(kiln_error(), "slot 'fc.weight' asks for dtype -7"));
    assert_null(out[0]);
    assert_null(out[1]);
    slots[0].dtype = KILN_DTYPE_COUNT;
    assert_int_not_equal(kiln_record_load_slots(rec, 2, slots, dev, KILN_RECORD_STRICT, out, NULL), 0);
    assert_non_null(strstr(kiln_error(), "asks for dtype"));
    slots[0].dtype = -1; /* as stored: f16 */
    assert_int_equal(kiln_record_load_slots(rec, 2, slots, dev, KILN_RECORD_STRICT, out, NULL), 0);
    assert_int_equal(kiln_tensor_dtype(out[0]), KILN_F16);
    assert_int_equal(kiln_tensor_dtype(out[1]), KILN_F32);
    kiln_tensor_release(out[0]);
    kiln_tensor_release(out[1]);
    kiln_record_close(rec);
}

/* A slot's ndim is -1 or 0..KILN_MAX_DIMS: 64 made the shape compare and the message read
 * 64 entries of an 8-entry shape, leaking stack bytes into kiln_error(). */
static void test_slot_ndim_checked(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/m.kiln", dir);
    save_sample(path, 0);
    kiln_record *rec = kiln_record_open(path);
    assert_non_null(rec);
    kiln_record_slot slots[] = {{.name = "fc.weight", .dtype = -1, .ndim = 64},
                                {.name = "fc.bias", .dtype = -1, .ndim = -1}};
    kiln_tensor *out[2] = {NULL, NULL};
    assert_int_equal(kiln_record_load_slots(rec, 2, slots, dev, KILN_RECORD_STRICT, out, NULL), KILN_EINVAL);
    assert_non_null(strstr(kiln_error(), "slot 'fc.weight' has ndim 64"));
    assert_non_null(strstr(kiln_error(), "0..8 (KILN_MAX_DIMS)"));
    assert_null(out[0]);
    assert_null(out[1]);
    slots[0].ndim = -2;
    assert_int_equal(kiln_record_load_slots(rec, 2, slots, dev, KILN_RECORD_LENIENT, out, NULL), KILN_EINVAL);
    assert_non_null(strstr(kiln_error(), "has ndim -2"));
    /* checked even for a name the file lacks */
    kiln_record_slot absent = {.name = "nope", .dtype = -1, .ndim = KILN_MAX_DIMS + 1, .optional = true};
    assert_int_equal(kiln_record_load_slots(rec, 1, &absent, dev, KILN_RECORD_LENIENT, out, NULL), KILN_EINVAL);
    assert_non_null(strstr(kiln_error(), "slot 'nope' has ndim 9"));
    slots[0].ndim = 2;
    slots[0].shape[0] = 2;
    slots[0].shape[1] = 3;
    assert_int_equal(kiln_record_load_slots(rec, 2, slots, dev, KILN_RECORD_STRICT, out, NULL), 0);
    kiln_tensor_release(out[0]);
    kiln_tensor_release(out[1]);
    kiln_record_close(rec);
}

/* A record holding a tensor of a dtype kiln has no equivalent of (I8, as quantized models
 * carry scales) opens; lenient loading of the other slots lists it as unexpected; only a
 * slot that asks for it fails, naming the dtype. */
static void test_unsupported_extra_tensor(void **state)
{
    (void)state;
    const char *header = "{\"__metadata__\":{\"kiln.record\":\"1\",\"kiln.config\":\"{}\"},"
                         "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                         "\"extra_int8_scale\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[8,12]}}";
    size_t hlen = strlen(header);
    unsigned char img[512];
    uint64_t h = hlen;
    float w[2] = {1.5f, -2.0f};
    memcpy(img, &h, 8);
    memcpy(img + 8, header, hlen);
    memcpy(img + 8 + hlen, w, 8);
    memcpy(img + 16 + hlen, "\x01\x02\x03\x04", 4);
    kiln_record *rec = kiln_record_open_memory(img, 8 + hlen + 12);
    if (!rec)
        fail_msg("%s", kiln_error());
    int dtype = 0;
    const kiln_safetensors *st = kiln_record_tensors(rec);
    assert_int_equal(kiln_safetensors_info(st, kiln_safetensors_find(st, "extra_int8_scale"), &dtype, NULL, NULL),
                     0);
    assert_int_equal(dtype, -1);
    kiln_record_slot slot = {.name = "w", .dtype = -1, .ndim = 1, .shape = {2}};
    kiln_tensor *out = NULL;
    kiln_record_report rep;
    assert_int_equal(kiln_record_load_slots(rec, 1, &slot, dev, KILN_RECORD_LENIENT, &out, &rep), 0);
    float got[2];
    assert_int_equal(kiln_to_data(out, got, sizeof got), 0);
    assert_true(got[0] == 1.5f && got[1] == -2.0f);
    assert_int_equal(rep.nunexpected, 1);
    assert_string_equal(rep.unexpected[0], "extra_int8_scale");
    kiln_record_report_free(&rep);
    kiln_tensor_release(out);
    kiln_record_slot wants = {.name = "extra_int8_scale", .dtype = -1, .ndim = -1};
    assert_int_not_equal(kiln_record_load_slots(rec, 1, &wants, dev, KILN_RECORD_LENIENT, &out, NULL), 0);
    assert_non_null(strstr(kiln_error(), "dtype I8, which kiln does not support"));
    kiln_record_close(rec);
}

/* Slots loaded from a plain record own their memory: rewriting the file in place and then
 * truncating it changes nothing (the tensors were the file's mapped pages: values changed,
 * then SIGBUS). */
static void test_loaded_slots_survive_file_changes(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/big.kiln", dir);
    const int N = 1 << 16;
    kiln_tensor *t = kiln_arange(dev, KILN_F32, 0, N, 1);
    const char *names[] = {"w"};
    assert_int_equal(kiln_record_save(path, 1, names, &t, NULL, 0), 0);
    kiln_tensor_release(t);
    kiln_record *rec = kiln_record_open(path);
    assert_non_null(rec);
    kiln_record_slot slot = {.name = "w", .dtype = -1, .ndim = 1, .shape = {N}};
    kiln_tensor *out = NULL;
    assert_int_equal(kiln_record_load_slots(rec, 1, &slot, dev, KILN_RECORD_STRICT, &out, NULL), 0);
    kiln_record_close(rec);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    size_t n = (size_t)sb.st_size - 4096;
    unsigned char *junk = malloc(n);
    memset(junk, 0x7f, n);
    assert_int_equal(pwrite(fd, junk, n, 4096), (ssize_t)n);
    close(fd);
    free(junk);
    float *v = malloc(N * sizeof *v);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            assert_int_equal(truncate(path, 64), 0);
        assert_int_equal(kiln_to_data(out, v, N * sizeof *v), 0);
        for (int i = 0; i < N; i++)
            if (v[i] != (float)i)
                fail_msg("w[%d] = %g after the file was %s, not %d", i, v[i], pass ? "truncated" : "rewritten", i);
    }
    free(v);
    kiln_tensor_release(out);
}

/* Fail the 1st, 2nd, ... durable call of a save (once, then persistently): each failure is a
 * clean error, the old record is intact and nothing else is left in the folder. */
static void test_fault_injection(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/m.kiln", dir);
    save_sample(path, 0);
    kiln_tensor *t = kiln_ones(dev, KILN_F32, KILN_SHAPE(4, 4));
    const char *names[] = {"other"};
    for (int persistent = 0; persistent < 2; persistent++) {
        for (long nth = 1;; nth++) {
            kiln__io_fault_set(nth, persistent);
            kiln_error_clear();
            int rc = kiln_record_save(path, 1, names, &t, NULL, KILN_RECORD_ZSTD);
            long calls = kiln__io_fault_calls();
            kiln__io_fault_set(0, 0);
            if (rc == 0) {
                assert_true(calls < nth); /* succeeded only because the fault was never reached */
                break;
            }
            assert_true(strlen(kiln_error()) > 0);
            assert_int_equal(count_entries(dir), 1);
            /* The destination holds the old record or, when only the final folder fsync
             * failed (the rename already happened), the complete new one; never a torn one. */
            kiln_record *rec = kiln_record_open(path);
            assert_non_null(rec);
            const kiln_safetensors *st = kiln_record_tensors(rec);
            bool old = kiln_safetensors_find(st, "fc.weight") >= 0;
            bool fresh = kiln_safetensors_find(st, "other") >= 0;
            if (!old && !(fresh && strstr(kiln_error(), "fsync folder")))
                fail_msg("fault at call %ld left neither the old record nor the new one (%s)", nth, kiln_error());
            kiln_record_close(rec);
            if (fresh)
                save_sample(path, 0);
            assert_true(nth < 100);
        }
        save_sample(path, 0); /* back to the original for the persistent pass */
    }
    kiln_tensor_release(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip_plain, setup, teardown),
        cmocka_unit_test_setup_teardown(test_round_trip_zstd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_zstd_smaller_and_detected, setup, teardown),
        cmocka_unit_test_setup_teardown(test_strict_and_lenient, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shape_mismatch_names_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_config_and_missing_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fault_injection, setup, teardown),
        cmocka_unit_test_setup_teardown(test_config_is_one_object, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slot_dtype_checked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slot_ndim_checked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unsupported_extra_tensor, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loaded_slots_survive_file_changes, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
