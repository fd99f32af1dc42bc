/*
 * tests/storage/test_torch_import.c — the PyTorch (.pt) reader against files written by
 * torch.save (tests/fixtures/gen_torch_files.py) and against hostile pickles and archives.
 *
 * Every tensor read from a fixture is compared bit for bit with the same tensor written
 * by PyTorch's safetensors beside it, so dtype handling, strides, offsets and shared
 * storages are checked against what PyTorch itself held.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <zip.h>

#include "kiln/kiln.h"
#include "kiln/record.h"
#include "pickle-impl.h"
#include "pickle-test.h"

#define FIX(name) KILN_FIXTURES "/torch/" name

static kiln_device *dev;
static char tmp_dir[] = "/tmp/kiln-pt-XXXXXX"; /* made on first use (temp_path) */
static bool tmp_made;

static int setup(void **state)
{
    (void)state;
    dev = kiln_device_open("ref");
    return dev ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    kiln_device_close(dev);
    if (tmp_made)
        rmdir(tmp_dir); /* each test removes its own files */
    return 0;
}

/* Every tensor of the reference must load from pt under the same name, bit-identical. */
static void compare_with_reference(kiln_torch_file *pt, const char *ref_path)
{
    kiln_safetensors *ref = kiln_safetensors_open(ref_path);
    assert_non_null(ref);
    assert_int_equal(kiln_torch_count(pt), kiln_safetensors_count(ref));
    for (int i = 0; i < kiln_safetensors_count(ref); i++) {
        const char *name = kiln_safetensors_name(ref, i);
        kiln_tensor *a = kiln_torch_load(pt, name, dev);
        if (!a)
            fail_msg("%s: %s", name, kiln_error());
        kiln_tensor *b = kiln_safetensors_load(ref, name, dev);
        assert_non_null(b);
        char da[200], db[200];
        kiln_tensor_describe(a, da, sizeof da);
        kiln_tensor_describe(b, db, sizeof db);
        if (strcmp(da, db) != 0)
            fail_msg("%s: kiln read %s, PyTorch held %s", name, da, db);
        assert_true(kiln_tensor_is_contiguous(a));
        size_t n = (size_t)kiln_tensor_numel(a) * kiln_dtype_size(kiln_tensor_dtype(a));
        unsigned char *x = malloc(n + 1), *y = malloc(n + 1);
        assert_int_equal(kiln_to_data(a, x, n), 0);
        assert_int_equal(kiln_to_data(b, y, n), 0);
        if (memcmp(x, y, n) != 0)
            fail_msg("%s (%s): bytes differ from PyTorch's", name, da);
        free(x);
        free(y);
        kiln_tensor_release(a);
        kiln_tensor_release(b);
    }
    kiln_safetensors_close(ref);
}

static void test_small_cnn(void **state)
{
    (void)state;
    kiln_torch_file *pt = kiln_torch_open(FIX("small_cnn.pt"), NULL);
    if (!pt)
        fail_msg("%s", kiln_error());
    compare_with_reference(pt, FIX("small_cnn.safetensors"));
    /* file order is the module's order */
    assert_string_equal(kiln_torch_name(pt, 0), "conv1.weight");
    int i = kiln_torch_find(pt, "bn1.num_batches_tracked"), dtype, ndim;
    int64_t shape[KILN_MAX_DIMS];
    assert_true(i >= 0);
    assert_int_equal(kiln_torch_info(pt, i, &dtype, &ndim, shape), 0);
    assert_int_equal(dtype, KILN_I64);
    assert_int_equal(ndim, 0);
    i = kiln_torch_find(pt, "conv1.weight");
    assert_int_equal(kiln_torch_info(pt, i, &dtype, &ndim, shape), 0);
    assert_int_equal(dtype, KILN_F32);
    assert_int_equal(ndim, 4);
    assert_int_equal(shape[0], 8);
    assert_int_equal(shape[1], 3);
    assert_string_equal(kiln_torch_storage_type(pt, i), "FloatStorage");
    assert_int_equal(kiln_torch_other_count(pt), 0);
    assert_null(kiln_torch_load(pt, "no.such.tensor", dev));
    assert_non_null(strstr(kiln_error(), "no tensor named 'no.such.tensor'"));
    kiln_torch_close(pt);
}

static void test_dtypes_views_and_shared_storage(void **state)
{
    (void)state;
    kiln_torch_file *pt = kiln_torch_open(FIX("dtypes.pt"), NULL);
    if (!pt)
        fail_msg("%s", kiln_error());
    compare_with_reference(pt, FIX("dtypes.safetensors"));
    static const struct {
        const char *name;
        int dtype;
    } want[] = {{"f32", KILN_F32}, {"f64", KILN_F64}, {"f16", KILN_F16}, {"bf16", KILN_BF16},
                {"i64", KILN_I64}, {"i32", KILN_I32}, {"u8", KILN_U8},   {"bool", KILN_BOOL}};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        int dtype, ndim;
        int64_t shape[KILN_MAX_DIMS];
        assert_int_equal(kiln_torch_info(pt, kiln_torch_find(pt, want[k].name), &dtype, &ndim, shape), 0);
        assert_int_equal(dtype, want[k].dtype);
    }
    int dtype, ndim;
    int64_t shape[KILN_MAX_DIMS];
    assert_int_equal(kiln_torch_info(pt, kiln_torch_find(pt, "transposed"), &dtype, &ndim, shape), 0);
    assert_int_equal(ndim, 2);
    assert_int_equal(shape[0], 7);
    assert_int_equal(shape[1], 5);
    /* shared.b = arange(24)[6:].view(6, 3)[::2]: rows start at 6, 12, 18 */
    kiln_tensor *b = kiln_torch_load(pt, "shared.b", dev);
    float v[9];
    assert_int_equal(kiln_to_data(b, v, sizeof v), 0);
    assert_true(v[0] == 6.0f && v[1] == 7.0f && v[3] == 12.0f && v[8] == 20.0f);
    kiln_tensor_release(b);
    kiln_torch_close(pt);
}

static void test_checkpoint_nesting_and_other_values(void **state)
{
    (void)state;
    kiln_torch_file *pt = kiln_torch_open(FIX("checkpoint.pt"), NULL);
    if (!pt)
        fail_msg("%s", kiln_error());
    compare_with_reference(pt, FIX("checkpoint.safetensors"));
    assert_true(kiln_torch_find(pt, "model.conv1.weight") >= 0);
    assert_true(kiln_torch_find(pt, "optimizer.state.0.momentum_buffer") >= 0);
    static const struct {
        const char *name, *value;
    } want[] = {{"epoch", "3"},
                {"lr", "0.5"},
                {"note", "'warm start'"},
                {"optimizer.param_groups.0.momentum", "0.9"}, /* as Python prints 0.9 */
                {"optimizer.param_groups.0.nesterov", "False"},
                {"optimizer.param_groups.0.params.1", "1"}};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        int found = 0;
        for (int i = 0; i < kiln_torch_other_count(pt); i++)
            if (strcmp(kiln_torch_other_name(pt, i), want[k].name) == 0) {
                assert_string_equal(kiln_torch_other_value(pt, i), want[k].value);
                found = 1;
            }
        if (!found)
            fail_msg("no value named %s", want[k].name);
    }
    kiln_torch_close(pt);
}

static void test_rename_and_skip_rules(void **state)
{
    (void)state;
    const char *from[] = {"^model\\.", "^(conv[0-9])\\.(weight|bias)$", "bn"};
    const char *to[] = {"", "\\2_of_\\1", "norm"};
    const char *skip[] = {"^optimizer\\.", "num_batches_tracked$"};
    kiln_torch_options o = {.n_renames = 3, .rename_patterns = from, .rename_replacements = to,
                            .n_skips = 2, .skip_patterns = skip};
    kiln_torch_file *pt = kiln_torch_open(FIX("checkpoint.pt"), &o);
    if (!pt)
        fail_msg("%s", kiln_error());
    /* 10 model tensors minus num_batches_tracked; optimizer state skipped */
    assert_int_equal(kiln_torch_count(pt), 9);
    int i = kiln_torch_find(pt, "weight_of_conv1");
    assert_true(i >= 0);
    assert_string_equal(kiln_torch_source_name(pt, i), "model.conv1.weight");
    assert_true(kiln_torch_find(pt, "norm1.running_mean") >= 0);
    assert_true(kiln_torch_find(pt, "fc.bias") >= 0);
    assert_int_equal(kiln_torch_find(pt, "model.fc.bias"), -1);
    kiln_tensor *w = kiln_torch_load(pt, "weight_of_conv1", dev);
    assert_non_null(w);
    assert_int_equal(kiln_tensor_dim(w, 0), 8);
    kiln_tensor_release(w);
    /* non-tensor leaves are renamed and skipped too */
    assert_int_equal(kiln_torch_other_count(pt), 3); /* epoch, lr, note */
    kiln_torch_close(pt);

    /* two names renamed onto one is an error naming both */
    const char *all[] = {".*"}, *one[] = {"x"};
    kiln_torch_options clash = {.n_renames = 1, .rename_patterns = all, .rename_replacements = one};
    assert_null(kiln_torch_open(FIX("small_cnn.pt"), &clash));
    assert_non_null(strstr(kiln_error(), "both end up named 'x'"));

    const char *bad[] = {"(unclosed"};
    kiln_torch_options badre = {.n_skips = 1, .skip_patterns = bad};
    assert_null(kiln_torch_open(FIX("small_cnn.pt"), &badre));
    assert_non_null(strstr(kiln_error(), "is not a valid regex"));

    /* an empty-matching pattern inserts between characters and terminates */
    const char *empty[] = {"x*"}, *dash[] = {"-"};
    kiln_torch_options ins = {.n_renames = 1, .rename_patterns = empty, .rename_replacements = dash};
    pt = kiln_torch_open(FIX("small_cnn.pt"), &ins);
    assert_non_null(pt);
    assert_true(kiln_torch_find(pt, "-f-c-.-b-i-a-s-") >= 0);
    kiln_torch_close(pt);
}

static void test_refused_files(void **state)
{
    (void)state;
    assert_null(kiln_torch_open(FIX("malicious.pt"), NULL));
    assert_non_null(strstr(kiln_error(), "pickle: global 'posix.system' is not allowed in a weights file"));
    assert_null(kiln_torch_open(FIX("legacy.pt"), NULL));
    assert_non_null(strstr(kiln_error(), "legacy (pre-1.6, non-zip)"));
    assert_null(kiln_torch_open(FIX("bigendian.pt"), NULL));
    assert_non_null(strstr(kiln_error(), "big-endian"));
    assert_null(kiln_torch_open(FIX("small_cnn.safetensors"), NULL));
    assert_non_null(strstr(kiln_error(), "not a zip archive"));
    assert_null(kiln_torch_open(FIX("no-such-file.pt"), NULL));
    assert_non_null(strstr(kiln_error(), "no-such-file.pt"));
}

/* Flip bytes and cut the file short all over a real .pt: every variant must either open
 * and load cleanly or be refused with a message; the sanitizer build catches the rest. */
static void test_mutated_archives(void **state)
{
    (void)state;
    FILE *f = fopen(FIX("dtypes.pt"), "rb");
    assert_non_null(f);
    static unsigned char buf[1 << 16];
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    assert_true(len > 1000 && len < sizeof buf);
    unsigned char *copy = malloc(len);
    int opened = 0, refused = 0;
    for (size_t at = 0; at < len; at += 3) {
        for (int variant = 0; variant < 2; variant++) {
            memcpy(copy, buf, len);
            size_t n = len;
            if (variant == 0)
                copy[at] ^= 0x5a;
            else
                n = at;
            kiln_torch_file *pt = kiln_torch_open_memory(copy, n, NULL);
            if (!pt) {
                assert_true(kiln_error()[0] != 0);
                refused++;
                continue;
            }
            opened++;
            for (int i = 0; i < kiln_torch_count(pt); i++)
                kiln_tensor_release(kiln_torch_load(pt, kiln_torch_name(pt, i), dev));
            kiln_torch_close(pt);
        }
    }
    assert_true(opened > 0 && refused > 0);
    free(copy);
}

/* ------------------------------------------------------- archives built in the test */

/* A fresh path in a folder of this run's own. */
static char *temp_path(const char *name)
{
    if (!tmp_made) {
        assert_non_null(mkdtemp(tmp_dir));
        tmp_made = true;
    }
    char *p = malloc(strlen(tmp_dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", tmp_dir, name);
    return p;
}

typedef struct member {
    const char *name;
    const void *data;
    size_t len;
} member;

/* A torch.save-style zip at path: each member stored (uncompressed), as torch writes them. */
static void write_zip(const char *path, const member *m, int n)
{
    int err = 0;
    zip_t *z = zip_open(path, ZIP_CREATE | ZIP_TRUNCATE, &err);
    assert_non_null(z);
    for (int i = 0; i < n; i++) {
        zip_source_t *src = zip_source_buffer(z, m[i].data, m[i].len, 0);
        assert_non_null(src);
        zip_int64_t idx = zip_file_add(z, m[i].name, src, ZIP_FL_OVERWRITE);
        assert_true(idx >= 0);
        assert_int_equal(zip_set_file_compression(z, (zip_uint64_t)idx, ZIP_CM_STORE, 0), 0);
    }
    assert_int_equal(zip_close(z), 0);
}

static unsigned char *read_whole(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static unsigned char buf[1 << 16];
    *len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    unsigned char *copy = malloc(*len);
    memcpy(copy, buf, *len);
    return copy;
}

/* data.pkl of torch.save({"u16": torch.arange(4).to(torch.uint16), "f8": torch.tensor([0.5,
 * 1]).to(torch.float8_e4m3fn), "c64": torch.tensor([1, 1j]).to(torch.complex64)}), exactly as
 * PyTorch 2.5 wrote it: the new dtypes go through _rebuild_tensor_v3 on an UntypedStorage. */
static const char newdtypes_pkl[] = "\x80\x02}q\x00(X\x03\x00\x00\x00u16q\x01"
                                    "ctorch._utils\x0a_rebuild_tensor_v3\x0aq\x02((X\x07"
                                    "\x00\x00\x00storageq\x03"
                                    "ctorch.storage\x0aUntypedStorage\x0aq\x04X\x01\x00\x00\x00"
                                    "0q\x05"
                                    "X\x03\x00\x00\x00"
                                    "cpuq\x06K\x08tq\x07QK\x00K\x04\x85q\x08K\x01\x85q\x09\x89"
                                    "ccollection"
                                    "s\x0aOrderedDict\x0aq\x0a)Rq\x0b"
                                    "ctorch\x0auint16\x0aq\x0ctq\x0dRq\x0eX\x02\x00\x00\x00"
                                    "f"
                                    "8q\x0fh\x02((h\x03h\x04X\x01\x00\x00\x00"
                                    "1q\x10h\x06K\x02tq\x11QK\x00K\x02\x85q\x12K\x01\x85"
                                    "q\x13\x89h\x0a)Rq\x14"
                                    "ctorch\x0a"
                                    "float8_e4m3fn\x0aq\x15tq\x16Rq\x17X\x03\x00\x00\x00"
                                    "c"
                                    "64q\x18"
                                    "ctorch._utils\x0a_rebuild_tensor_v2\x0aq\x19((h\x03"
                                    "ctorch\x0a"
                                    "ComplexFloatSt"
                                    "orage\x0aq\x1aX\x01\x00\x00\x00"
                                    "2q\x1bh\x06K\x02tq\x1cQK\x00K\x02\x85q\x1dK\x01\x85q\x1e\x89"
                                    "h\x0a)Rq\x1ftq Rq!u.";

/* torch >= 2.1 saves uint16/32/64 and float8 tensors through _rebuild_tensor_v3, which was
 * refused as a disallowed global, taking the whole file with it. Now such a file opens, the
 * tensors are listed with dtype -1 and their storage, and only loading one of them fails. */
static void test_rebuild_tensor_v3(void **state)
{
    (void)state;
    static const unsigned char u16[8] = {0, 0, 1, 0, 2, 0, 3, 0}, f8[2] = {0x38, 0x38},
                               c64[16] = {0, 0, 0x80, 0x3f, 0, 0, 0, 0, 0, 0, 0x80, 0x3f, 0, 0, 0, 0};
    const member m[] = {{"newdtypes/data.pkl", newdtypes_pkl, sizeof newdtypes_pkl - 1},
                        {"newdtypes/byteorder", "little", 6},
                        {"newdtypes/data/0", u16, sizeof u16},
                        {"newdtypes/data/1", f8, sizeof f8},
                        {"newdtypes/data/2", c64, sizeof c64},
                        {"newdtypes/version", "3\n", 2}};
    char *path = temp_path("newdtypes.pt");
    write_zip(path, m, 6);
    kiln_torch_file *pt = kiln_torch_open(path, NULL);
    if (!pt)
        fail_msg("%s", kiln_error());
    assert_int_equal(kiln_torch_count(pt), 3);
    static const struct {
        const char *name, *storage;
        int64_t n;
    } want[] = {{"u16", "UntypedStorage(uint16)", 4},
                {"f8", "UntypedStorage(float8_e4m3fn)", 2},
                {"c64", "ComplexFloatStorage", 2}};
    for (int k = 0; k < 3; k++) {
        int i = kiln_torch_find(pt, want[k].name), dtype = 0, ndim = 0;
        int64_t shape[KILN_MAX_DIMS];
        assert_true(i >= 0);
        assert_int_equal(kiln_torch_info(pt, i, &dtype, &ndim, shape), 0);
        assert_int_equal(dtype, -1);
        assert_int_equal(ndim, 1);
        assert_int_equal(shape[0], want[k].n);
        assert_string_equal(kiln_torch_storage_type(pt, i), want[k].storage);
    }
    assert_null(kiln_torch_load(pt, "u16", dev));
    assert_non_null(
        strstr(kiln_error(), "'u16' is stored as UntypedStorage(uint16), a dtype kiln does not support"));
    kiln_torch_close(pt);
    unlink(path);
    free(path);
}

#define PKL_V3_HEAD                                                                                               \
    "\x80\x02}(X\x01\x00\x00\x00w"                                                                                \
    "ctorch._utils\n_rebuild_tensor_v3\n((X\x07\x00\x00\x00storage"                                               \
    "ctorch.storage\nUntypedStorage\nX\x01\x00\x00\x00"                                                           \
    "0X\x03\x00\x00\x00"                                                                                          \
    "cpuK\x08tQK\x00K\x02\x85K\x01\x85\x89}"

/* _rebuild_tensor_v3 with a dtype kiln has reads the untyped bytes as that dtype; one whose
 * bytes are not a whole number of elements, or a v3 call on a typed storage, is refused. */
static void test_rebuild_tensor_v3_supported_dtype(void **state)
{
    (void)state;
    static const char ok[] = PKL_V3_HEAD "ctorch\nfloat32\ntRu.", odd[] = PKL_V3_HEAD "ctorch\nfloat64\ntRu.";
    const float vals[2] = {1.5f, -2.25f};
    member m[] = {{"a/data.pkl", ok, sizeof ok - 1}, {"a/data/0", vals, sizeof vals}};
    char *path = temp_path("v3f32.pt");
    write_zip(path, m, 2);
    kiln_torch_file *pt = kiln_torch_open(path, NULL);
    if (!pt)
        fail_msg("%s", kiln_error());
    kiln_tensor *w = kiln_torch_load(pt, "w", dev);
    if (!w)
        fail_msg("%s", kiln_error());
    float got[2];
    assert_int_equal(kiln_tensor_dtype(w), KILN_F32);
    assert_int_equal(kiln_to_data(w, got, sizeof got), 0);
    assert_true(got[0] == 1.5f && got[1] == -2.25f);
    kiln_tensor_release(w);
    kiln_torch_close(pt);
    m[0] = (member){"a/data.pkl", odd, sizeof odd - 1}; /* 8 bytes as f64: one element, not two */
    write_zip(path, m, 2);
    assert_null(kiln_torch_open(path, NULL));
    assert_non_null(strstr(kiln_error(), "reaches element 1 of storage '0', which holds 1"));
    unlink(path);
    free(path);
    REJECT("\x80\x02"
           "ctorch._utils\n_rebuild_tensor_v3\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\n"
           "X\x01\x00\x00\x00"
           "0X\x03\x00\x00\x00"
           "cpuK\x02tQK\x00K\x02\x85K\x01\x85\x89}ctorch\nfloat32\ntR.",
           "_rebuild_tensor_v3 called on FloatStorage, not an UntypedStorage");
    REJECT("\x80\x02"
           "ctorch._utils\n_rebuild_tensor_v3\n((X\x07\x00\x00\x00storagectorch.storage\nUntypedStorage\n"
           "X\x01\x00\x00\x00"
           "0X\x03\x00\x00\x00"
           "cpuK\x03tQK\x00K\x01\x85K\x01\x85\x89}ctorch\nint16\ntR.",
           "untyped storage '0' holds 3 bytes, not a whole number of int16 elements");
    REJECT("\x80\x02"
           "ctorch._utils\n_rebuild_tensor_v3\n((X\x07\x00\x00\x00storagectorch.storage\nUntypedStorage\n"
           "X\x01\x00\x00\x00"
           "0X\x03\x00\x00\x00"
           "cpuK\x04tQK\x00K\x01\x85K\x01\x85\x89}ctorch\nFloatStorage\ntR.",
           "dtype argument is not a torch dtype");
    REJECT("\x80\x02"
           "ctorch\nsystem\n.",
           "global 'torch.system' is not allowed");
}

/* Integers past int64 (2**70, a LONG1 of 9 bytes) refused the whole file; they are values to
 * list, as Python prints them. */
static void test_large_integers_listed(void **state)
{
    (void)state;
    static const struct {
        const char *pickle;
        size_t len;
        const char *want;
        int kind;
    } cases[] = {
        {"\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00@.", 14, "1180591620717411303424", KILN__PK_BIGINT},
        {"\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\xc0.", 14, "-1180591620717411303424", KILN__PK_BIGINT},
        {"\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00.", 14, "9223372036854775808", KILN__PK_BIGINT},
        {"\x80\x02\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80.", 13, "-9223372036854775808", KILN__PK_INT},
        {"\x8a\x09"
         "123456789.",
         12, "1055515178193424429617", KILN__PK_BIGINT},
        {"\x8a\x02\x00\x01.", 5, "256", KILN__PK_INT}, /* not minimal, still an int */
        {"\x8a\x02\x7f\xff.", 5, "-129", KILN__PK_INT},
        {"L1180591620717411303424L\n.", 26, "1180591620717411303424", KILN__PK_BIGINT},
        {"I-000009223372036854775809\n.", 28, "-9223372036854775809", KILN__PK_BIGINT},
        {"I9223372036854775807\n.", 22, "9223372036854775807", KILN__PK_INT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_int_equal(expect_pickle_describes(cases[i].pickle, cases[i].len, cases[i].want, i), cases[i].kind);
    /* 2**600 (76 bytes): past 64 bytes the size is listed, not the digits */
    unsigned char big[80] = {0x8a, 76};
    big[2 + 75] = 0x01;
    big[2 + 76] = '.';
    kiln__pickle *p = kiln__pickle_load(big, 79, "test", NULL);
    assert_non_null(p);
    char text[64];
    kiln__pk_describe(kiln__pickle_root(p), text, sizeof text);
    assert_string_equal(text, "<integer of 76 bytes>");
    kiln__pickle_free(p);
    REJECT("L12a4L\n.", "malformed text integer");
    /* in a file: listed beside the tensors; as a storage size it is still refused */
    static const char pkl[] = "\x80\x02}(X\x03\x00\x00\x00"
                              "big\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00@u.";
    member m[] = {{"a/data.pkl", pkl, sizeof pkl - 1}};
    char *path = temp_path("big.pt");
    write_zip(path, m, 1);
    kiln_torch_file *pt = kiln_torch_open(path, NULL);
    if (!pt)
        fail_msg("%s", kiln_error());
    assert_int_equal(kiln_torch_other_count(pt), 1);
    assert_string_equal(kiln_torch_other_name(pt, 0), "big");
    assert_string_equal(kiln_torch_other_value(pt, 0), "1180591620717411303424");
    kiln_torch_close(pt);
    unlink(path);
    free(path);
    REJECT(REBUILD "(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00"
                   "0X\x03\x00\x00\x00"
                   "cpu\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00@tQ",
           "no valid element count");
}

/* The zip's CRC-32 of each record was never checked (reads stopped at the tensor's last byte,
 * before libzip's check at the record's end): a flipped bit loaded as a wrong value. */
static void test_crc_checked(void **state)
{
    (void)state;
    const float vals[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    /* w views floats 0-1 and v floats 2-3 of one storage record */
    static const char pkl[] = "\x80\x02}(X\x01\x00\x00\x00w"
                              "ctorch._utils\n_rebuild_tensor_v2\n(" STORAGE4 "K\x00K\x02\x85K\x01\x85\x89}tR"
                              "X\x01\x00\x00\x00v"
                              "ctorch._utils\n_rebuild_tensor_v2\n(" STORAGE4 "K\x02K\x02\x85K\x01\x85\x89}tRu.";
    member m[] = {{"a/data.pkl", pkl, sizeof pkl - 1}, {"a/data/0", vals, sizeof vals}};
    char *path = temp_path("crc.pt");
    write_zip(path, m, 2);
    size_t len;
    unsigned char *bytes = read_whole(path, &len);
    kiln_torch_file *pt = kiln_torch_open_memory(bytes, len, NULL);
    if (!pt)
        fail_msg("%s", kiln_error());
    kiln_tensor *w = kiln_torch_load(pt, "w", dev);
    assert_non_null(w);
    kiln_tensor_release(w);
    kiln_torch_close(pt);
    /* flip one bit of the third float (3.0f = 00 00 40 40), which view w does not even cover */
    unsigned char *at = NULL;
    for (size_t i = 0; i + sizeof vals <= len && !at; i++)
        if (memcmp(bytes + i, vals, sizeof vals) == 0)
            at = bytes + i;
    assert_non_null(at);
    at[8] ^= 0x01;
    pt = kiln_torch_open_memory(bytes, len, NULL);
    assert_non_null(pt); /* the pickle is intact */
    kiln_error_clear();
    assert_null(kiln_torch_load(pt, "w", dev));
    assert_non_null(strstr(kiln_error(), "record 'a/data/0' of tensor 'w' fails its CRC-32 check"));
    assert_null(kiln_torch_load(pt, "v", dev)); /* every load of that record, not only the first */
    assert_non_null(strstr(kiln_error(), "fails its CRC-32 check"));
    kiln_torch_close(pt);
    at[8] ^= 0x01;
    /* a flipped bit in data.pkl that still parses: the key 'v' becomes 'u' */
    unsigned char *key = NULL;
    for (size_t i = 0; i + 6 <= len && !key; i++)
        if (memcmp(bytes + i, "X\x01\x00\x00\x00v", 6) == 0)
            key = bytes + i + 5;
    assert_non_null(key);
    *key ^= 0x03; /* 'v' -> 'u' */
    assert_null(kiln_torch_open_memory(bytes, len, NULL));
    assert_non_null(strstr(kiln_error(), "a/data.pkl fails its CRC-32 check"));
    free(bytes);
    unlink(path);
    free(path);
}

/* A replacement naming a group its pattern does not have ("\\9" with one group) gave an empty
 * name without a word; it is refused when the rules are compiled, naming both. */
static void test_rename_group_checked(void **state)
{
    (void)state;
    const char *from[] = {"^(conv)1\\."}, *to[] = {"\\9"};
    kiln_torch_options o = {.n_renames = 1, .rename_patterns = from, .rename_replacements = to};
    assert_null(kiln_torch_open(FIX("small_cnn.pt"), &o));
    assert_non_null(strstr(kiln_error(), "rename replacement 0 '\\9' refers to group 9"));
    assert_non_null(strstr(kiln_error(), "has 1 group"));
    to[0] = "\\2";
    assert_null(kiln_torch_open(FIX("small_cnn.pt"), &o));
    assert_non_null(strstr(kiln_error(), "refers to group 2"));
    /* \\ is a backslash, not a group; \0 and \1 exist */
    to[0] = "\\\\\\1\\0";
    kiln_torch_file *pt = kiln_torch_open(FIX("small_cnn.pt"), &o);
    if (!pt)
        fail_msg("%s", kiln_error());
    assert_true(kiln_torch_find(pt, "\\convconv1.weight") >= 0);
    kiln_torch_close(pt);
    /* a rule that renames a name to nothing is refused too, naming the entry */
    const char *all[] = {"^fc\\.bias$"}, *none[] = {""};
    kiln_torch_options empty = {.n_renames = 1, .rename_patterns = all, .rename_replacements = none};
    assert_null(kiln_torch_open(FIX("small_cnn.pt"), &empty));
    assert_non_null(strstr(kiln_error(), "renaming 'fc.bias' gives an empty name"));
}

/* One expand()ed tensor or one 9-d tensor used to refuse the whole file, naming a storage
 * id ("tensor view of storage '0' has 12 elements..."); now the file opens, the others load
 * and only those two fail, naming their key and the reason. */
static void test_unloadable_views_deferred(void **state)
{
    (void)state;
    kiln_torch_file *pt = kiln_torch_open(FIX("unloadable.pt"), NULL);
    if (!pt)
        fail_msg("%s", kiln_error());
    assert_int_equal(kiln_torch_count(pt), 4);
    kiln_tensor *w = kiln_torch_load(pt, "w", dev), *b = kiln_torch_load(pt, "b", dev);
    if (!w || !b)
        fail_msg("%s", kiln_error());
    float wv[6], bv[2];
    assert_true(!kiln_to_data(w, wv, sizeof wv) && !kiln_to_data(b, bv, sizeof bv));
    assert_true(wv[0] == 0 && wv[5] == 5 && bv[0] == 1.5f && bv[1] == -2.0f);
    kiln_tensor_release(w);
    kiln_tensor_release(b);
    int dtype = 0, ndim = 0;
    int64_t shape[KILN_MAX_DIMS];
    assert_int_equal(kiln_torch_info(pt, kiln_torch_find(pt, "expanded"), &dtype, &ndim, shape), 0);
    assert_int_equal(dtype, KILN_F32);
    assert_int_equal(ndim, 2);
    assert_true(shape[0] == 3 && shape[1] == 4);
    assert_null(kiln_torch_load(pt, "expanded", dev));
    assert_non_null(strstr(kiln_error(),
                           "unloadable.pt: tensor 'expanded' is a view with 12 elements of a storage "
                           "of 3 (an expand()ed tensor), which kiln does not load; save "
                           "x.contiguous() instead"));
    assert_int_equal(kiln_torch_info(pt, kiln_torch_find(pt, "deep"), &dtype, &ndim, shape), -1);
    assert_non_null(strstr(kiln_error(), "tensor 'deep' has 9 dimensions, more than the 8 kiln supports"));
    assert_null(kiln_torch_load(pt, "deep", dev));
    assert_non_null(strstr(kiln_error(), "unloadable.pt: tensor 'deep' has 9 dimensions, more than the 8"));
    assert_int_equal(kiln_torch_info(pt, 4, &dtype, &ndim, shape), -1);
    assert_non_null(strstr(kiln_error(), "no tensor at index 4"));
    kiln_torch_close(pt);

    /* torch.save(model): refused, saying what to save instead */
    assert_null(kiln_torch_open(FIX("whole_model.pt"), NULL));
    assert_non_null(strstr(kiln_error(), "is not allowed in a weights file"));
    assert_non_null(strstr(kiln_error(), "save model.state_dict() instead"));
}

/* A NULL device or handle gave NULL with no message of its own. */
static void test_load_null_arguments(void **state)
{
    (void)state;
    kiln_torch_file *pt = kiln_torch_open(FIX("small_cnn.pt"), NULL);
    if (!pt)
        fail_msg("%s", kiln_error());
    kiln_error_clear();
    assert_null(kiln_torch_load(pt, "conv1.weight", NULL));
    assert_non_null(strstr(kiln_error(), "small_cnn.pt: load 'conv1.weight': the device (dev) is NULL"));
    kiln_error_clear();
    assert_null(kiln_torch_load(pt, "no.such", NULL)); /* the device is named before the lookup */
    assert_non_null(strstr(kiln_error(), "the device (dev) is NULL"));
    kiln_error_clear();
    assert_null(kiln_torch_load(NULL, "conv1.weight", dev));
    assert_non_null(strstr(kiln_error(), "torch load 'conv1.weight': the file handle (pt) is NULL"));
    kiln_torch_close(pt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_cnn),
        cmocka_unit_test(test_dtypes_views_and_shared_storage),
        cmocka_unit_test(test_checkpoint_nesting_and_other_values),
        cmocka_unit_test(test_rename_and_skip_rules),
        cmocka_unit_test(test_refused_files),
        cmocka_unit_test(test_mutated_archives),
        cmocka_unit_test(test_rebuild_tensor_v3),
        cmocka_unit_test(test_rebuild_tensor_v3_supported_dtype),
        cmocka_unit_test(test_large_integers_listed),
        cmocka_unit_test(test_crc_checked),
        cmocka_unit_test(test_rename_group_checked),
        cmocka_unit_test(test_unloadable_views_deferred),
        cmocka_unit_test(test_load_null_arguments),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
