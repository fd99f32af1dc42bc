/*
 * tests/storage/test_safetensors.c — the safetensors reader against well-formed and
 * hostile files, and round trips through the writer on every dtype.
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_file_and_accessors),
        cmocka_unit_test(test_rejects_malformed_headers),
        cmocka_unit_test(test_rejects_bad_lengths),
        cmocka_unit_test(test_truncated_prefixes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
