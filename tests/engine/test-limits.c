/*
 * tests/engine/test-limits.c — arguments at the edges of their ranges: slices whose step
 * overflowed the length arithmetic, random integers whose bounds a double cannot carry or
 * a dtype cannot hold, fill values an integer dtype cannot hold, eye's sizes, and the
 * device specs and defaults a program may get wrong. Runs on ref, and on cpu where the
 * backends once disagreed.
 */
#include <stdint.h>

#include "common/philox.h"
#include "kiln/autodiff.h"
#include "test-util.h"

/* ------------------------------------------------------------------- slicing */

static void test_slice_huge_step(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *a = TF32(KILN_SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
    /* Python: a[:, ::huge] is the first column; (e - s + step - 1) / step overflowed */
    kiln_tensor *s = kiln_slice(a, 1, 0, INT64_MAX, INT64_MAX);
    EXPECT_SHAPE(s, 2, 1);
    EXPECT_F32(s, 0, 1, 4);
    EXPECT_F32(kiln_sum(s, KILN_ALL_DIMS, false), 0, 5);
    EXPECT_F32(kiln_contiguous(s), 0, 1, 4);
    s = kiln_slice(a, 1, 1, 3, INT64_MAX - 1);
    EXPECT_SHAPE(s, 2, 1);
    EXPECT_F32(s, 0, 2, 5);
    s = kiln_slice(a, 0, INT64_MIN, INT64_MAX, INT64_MAX);
    EXPECT_SHAPE(s, 1, 3);
    EXPECT_F32(s, 0, 1, 2, 3);
    /* ordinary steps still count as before */
    EXPECT_F32(kiln_slice(a, 1, 0, 3, 2), 0, 1, 3, 4, 6);
    EXPECT_F32(kiln_slice(a, 1, -2, INT64_MAX, 1), 0, 2, 3, 5, 6);
    EXPECT_SHAPE(kiln_slice(a, 1, 3, INT64_MAX, INT64_MAX), 2, 0);
    EXPECT_SHAPE(kiln_slice(a, 1, 2, 1, 5), 2, 0);

    /* slice_assign and the slice's backward use the same count */
    kiln_tensor *nine = kiln_full(test_dev, KILN_F32, 0, NULL, 9);
    EXPECT_F32(kiln_slice_assign(a, 1, 0, INT64_MAX, INT64_MAX, nine), 0, 9, 2, 3, 9, 5, 6);
    EXPECT_F32(kiln_slice_assign(a, 1, 2, INT64_MAX, INT64_MAX, nine), 0, 1, 2, 9, 4, 5, 9);
    kiln_tensor *w = TF32(KILN_SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
    kiln_requires_grad(w, true);
    kiln_tensor *l = kiln_sum(kiln_mul_scalar(kiln_slice(w, 1, 1, INT64_MAX, INT64_MAX), 3), KILN_ALL_DIMS, false);
    assert_int_equal(kiln_backward(l, NULL), 0);
    EXPECT_F32(kiln_grad(w), 0, 0, 3, 0, 0, 3, 0);
    kiln_scope_end();
}

/* An expanded view whose element count an int64 cannot hold is refused: 2^31 x 2^31 x 4 wrapped
 * to 0, and reshape, sum and mean then took the view for an empty one. */
static void test_expand_past_int64(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *one = kiln_ones(test_dev, KILN_F32, KILN_SHAPE(1, 1, 1));
    kiln_error_clear();
    assert_null(kiln_expand(one, KILN_SHAPE((int64_t)1 << 31, (int64_t)1 << 31, 4)));
    assert_int_equal(kiln_error_code(), KILN_ETOOLARGE);
    if (!strstr(kiln_error(), "expand: f32[1, 1, 1] expanded to [2147483648, 2147483648, 4] has more elements"))
        fail_msg("expand past int64: %s", kiln_error());
    assert_null(kiln_expand(kiln_ones(test_dev, KILN_F32, KILN_SHAPE(1, 1)), KILN_SHAPE((int64_t)1 << 62, 8)));
    assert_int_equal(kiln_error_code(), KILN_ETOOLARGE);
    /* large but countable stays a view; a zero anywhere makes it empty, not an overflow */
    EXPECT_SHAPE(kiln_expand(one, KILN_SHAPE((int64_t)1 << 31, (int64_t)1 << 31, 1)), (int64_t)1 << 31,
                 (int64_t)1 << 31, 1);
    EXPECT_SHAPE(kiln_expand(one, KILN_SHAPE((int64_t)1 << 62, 0, 8)), (int64_t)1 << 62, 0, 8);
    kiln_scope_end();
}

/* ------------------------------------------------------------ random integers */

static void draw_ints(kiln_device *dev, kiln_dtype dt, int64_t lo, int64_t hi, int64_t *out, int n)
{
    kiln_generator g = kiln_generator_make(77);
    kiln_tensor *t = kiln_rand_int(dev, dt, KILN_SHAPE(n), lo, hi, &g);
    if (!t)
        fail_msg("rand_int [%lld, %lld): %s", (long long)lo, (long long)hi, kiln_error());
    kiln_tensor *c = kiln_cast(t, KILN_I64);
    assert_int_equal(kiln_to_data(c, out, (size_t)n * sizeof *out), 0);
    kiln_tensor_release(c);
    kiln_tensor_release(t);
}

static void test_rand_int_bounds(void **state)
{
    (void)state;
    kiln_device *cpu = kiln_device_open("cpu");
    assert_non_null(cpu);
    kiln_device *devs[2] = {test_dev, cpu};
    const int64_t big = (int64_t)1 << 53;
    /* ranges at the edge of what a double carries exactly: the same numbers on every
     * backend, each Philox's draw for its counter, all inside the range */
    const int64_t ranges[][2] = {{big - 3, big}, {-big, -big + 2}, {-big, big}, {-10, 10}};
    for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++)
        for (int k = 0; k < 2; k++) {
            int64_t v[64];
            draw_ints(devs[k], KILN_I64, ranges[r][0], ranges[r][1], v, 64);
            for (int i = 0; i < 64; i++) {
                int64_t want = kiln_rng_int((uint64_t)i, 77, ranges[r][0], ranges[r][1]);
                if (v[i] != want || v[i] < ranges[r][0] || v[i] >= ranges[r][1])
                    fail_msg("device %d range %zu element %d: %lld, want %lld", k, r, i, (long long)v[i],
                             (long long)want);
            }
        }

    /* bounds a double cannot carry: once a range the caller never asked for (ref and
     * vulkan) or every element low (cpu); now refused on every backend alike */
    kiln_generator g = kiln_generator_make(1);
    const int64_t wide[][2] = {{big + 1, big + 3}, {INT64_MIN, INT64_MAX}, {-10, INT64_MAX}, {-big - 1, 0}};
    for (size_t r = 0; r < sizeof wide / sizeof wide[0]; r++)
        for (int k = 0; k < 2; k++) {
            assert_null(kiln_rand_int(devs[k], KILN_I64, KILN_SHAPE(4), wide[r][0], wide[r][1], &g));
            expect_error("rand_int");
            expect_error("2^53");
        }
    assert_int_equal(g.offset, 0); /* nothing drawn */

    /* ranges the dtype cannot hold wrapped (u8 [0, 1000) gave 0..255) */
    assert_null(kiln_rand_int(test_dev, KILN_U8, KILN_SHAPE(4), 0, 1000, &g));
    expect_error("does not fit u8");
    assert_null(kiln_rand_int(test_dev, KILN_U8, KILN_SHAPE(4), -10, 0, &g));
    expect_error("[-10, 0) does not fit u8");
    assert_null(kiln_rand_int(test_dev, KILN_I32, KILN_SHAPE(4), 0, ((int64_t)1 << 31) + 1, &g));
    expect_error("does not fit i32");
    assert_null(kiln_rand_int(test_dev, KILN_F16, KILN_SHAPE(4), 0, 70000, &g));
    expect_error("does not fit f16");
    /* the whole of a dtype is fine */
    int64_t v[256];
    draw_ints(test_dev, KILN_U8, 0, 256, v, 256);
    int64_t mn = 255, mx = 0;
    for (int i = 0; i < 256; i++) {
        mn = v[i] < mn ? v[i] : mn;
        mx = v[i] > mx ? v[i] : mx;
        assert_int_equal(v[i], kiln_rng_int((uint64_t)i, 77, 0, 256));
    }
    assert_true(mn >= 0 && mx <= 255 && mx - mn > 200);
    draw_ints(test_dev, KILN_I32, INT32_MIN, (int64_t)INT32_MAX + 1, v, 8);
    for (int i = 0; i < 8; i++)
        assert_int_equal(v[i], kiln_rng_int((uint64_t)i, 77, INT32_MIN, (int64_t)INT32_MAX + 1));
    draw_ints(test_dev, KILN_F16, -65504, 65505, v, 8);
    for (int i = 0; i < 8; i++)
        assert_true(v[i] >= -65504 && v[i] <= 65504);
    kiln_device_close(cpu);
}

/* ------------------------------------------------------------- fill values */

static void test_fill_value_range(void **state)
{
    (void)state;
    kiln_scope_begin();
    /* out of range, NaN and infinities wrapped or came out arbitrary (u8 300 -> 44) */
    assert_null(kiln_full(test_dev, KILN_U8, KILN_SHAPE(3), 300));
    expect_error("full: value 300 does not fit u8");
    assert_null(kiln_full(test_dev, KILN_U8, KILN_SHAPE(3), -1));
    expect_error("value -1 does not fit u8");
    assert_null(kiln_full(test_dev, KILN_I32, KILN_SHAPE(3), 1e12));
    expect_error("does not fit i32");
    assert_null(kiln_full(test_dev, KILN_I32, KILN_SHAPE(3), NAN));
    expect_error("value nan does not fit i32");
    assert_null(kiln_full(test_dev, KILN_I64, KILN_SHAPE(3), INFINITY));
    expect_error("does not fit i64");
    assert_null(kiln_full(test_dev, KILN_I64, KILN_SHAPE(3), 9223372036854775808.0));
    expect_error("does not fit i64");
    kiln_tensor *u = kiln_zeros(test_dev, KILN_U8, KILN_SHAPE(2));
    assert_null(kiln_full_like(u, 256));
    expect_error("does not fit u8");
    assert_null(kiln_masked_fill(u, kiln_ones(test_dev, KILN_BOOL, KILN_SHAPE(2)), 300));
    expect_error("masked_fill: value 300");
    assert_null(kiln_arange(test_dev, KILN_U8, 250, 260, 1));
    expect_error("arange: last value 259");
    assert_null(kiln_arange(test_dev, KILN_I32, -3e9, 0, 1e9));
    expect_error("arange: start");
    assert_null(kiln_linspace(test_dev, KILN_U8, 0, 300, 4));
    expect_error("linspace: end 300");

    /* what fits still fills, the fraction dropped as PyTorch does */
    EXPECT_F32(kiln_full(test_dev, KILN_U8, KILN_SHAPE(2), 255.9), 0, 255, 255);
    EXPECT_F32(kiln_full(test_dev, KILN_U8, KILN_SHAPE(2), -0.5), 0, 0, 0);
    EXPECT_F32(kiln_full(test_dev, KILN_I32, KILN_SHAPE(2), -2147483648.0), 0, -2147483648.0f, -2147483648.0f);
    EXPECT_F32(kiln_full(test_dev, KILN_I32, KILN_SHAPE(2), -2.5), 0, -2, -2);
    int64_t i64[1];
    assert_int_equal(kiln_to_data(kiln_full(test_dev, KILN_I64, 0, NULL, -9223372036854775808.0), i64, 8), 0);
    assert_true(i64[0] == INT64_MIN);
    EXPECT_F32(kiln_full(test_dev, KILN_BOOL, KILN_SHAPE(2), 300), 0, 1, 1);    /* bool: nonzero is true */
    EXPECT_F32(kiln_full(test_dev, KILN_F16, KILN_SHAPE(1), 1e6), 0, INFINITY); /* floats round */
    EXPECT_F32(kiln_full_like(u, 7), 0, 7, 7);
    EXPECT_F32(kiln_masked_fill(u, kiln_cast(TF32(KILN_SHAPE(2), 0, 1), KILN_BOOL), 200), 0, 0, 200);
    EXPECT_F32(kiln_arange(test_dev, KILN_U8, 250, 256, 2), 0, 250, 252, 254);
    EXPECT_F32(kiln_linspace(test_dev, KILN_U8, 0, 255, 3), 0, 0, 127, 255);
    kiln_scope_end();
}

/* ------------------------------------------------------------------ eye */

static void test_eye_sizes(void **state)
{
    (void)state;
    kiln_scope_begin();
    EXPECT_F32(kiln_eye(test_dev, KILN_F32, 2, 3), 0, 1, 0, 0, 0, 1, 0);
    EXPECT_SHAPE(kiln_eye(test_dev, KILN_F32, 0, 3), 0, 3);
    /* m = -1 once silently meant m = n */
    assert_null(kiln_eye(test_dev, KILN_F32, 3, -1));
    expect_error("eye: n 3 and m -1 must be non-negative");
    assert_null(kiln_eye(test_dev, KILN_F32, -1, 3));
    expect_error("must be non-negative");
    kiln_scope_end();
}

/* -------------------------------------------------------------- devices */

static void test_device_specs(void **state)
{
    (void)state;
    const char *bare[] = {"fused:", "counting:", "counting:fused:"};
    for (int i = 0; i < 3; i++) {
        kiln_error_clear();
        assert_null(kiln_device_open(bare[i]));
        expect_error("needs a device spec after it");
    }
    assert_null(kiln_device_open("fused:"));
    expect_error("decorator 'fused:'");
    assert_null(kiln_device_open("nope"));
    expect_error("unknown device spec 'nope'");
    expect_error("counting:SPEC, fused:SPEC");
    kiln_device *d = kiln_device_open("counting:fused:ref");
    assert_non_null(d);
    kiln_device_close(d);
}

static void test_defaults_set(void **state)
{
    (void)state;
    /* an unknown backend was accepted and its options never read */
    assert_int_equal(kiln_device_defaults_set("nope", "threads=2"), -1);
    expect_error("kiln_device_defaults_set: unknown backend 'nope'");
    assert_int_equal(kiln_device_defaults_set("cpu:0", "threads=2"), -1);
    expect_error("unknown backend 'cpu:0'");
    /* its own errors name it, not kiln_device_open */
    assert_int_equal(kiln_device_defaults_set("cpu", "threads"), -1);
    expect_error("kiln_device_defaults_set: option 'threads' has no value");
    assert_int_equal(kiln_device_defaults_set("cpu", "=2"), -1);
    expect_error("kiln_device_defaults_set: bad option name");
    /* every backend and decorator, compiled in or not, may hold defaults */
    const char *known[] = {"cpu", "ref", "cuda", "vulkan", "hip", "remote", "counting", "fused"};
    for (int i = 0; i < 8; i++) {
        assert_int_equal(kiln_device_defaults_set(known[i], "x=1"), 0);
        assert_int_equal(kiln_device_defaults_set(known[i], NULL), 0);
    }
    /* and they still reach an open */
    assert_int_equal(kiln_device_defaults_set("cpu", "threads=1"), 0);
    kiln_device *d = kiln_device_open("cpu?spin_us=0");
    assert_non_null(d);
    kiln_device_close(d);
    assert_int_equal(kiln_device_defaults_set("cpu", "bogus=1"), 0);
    assert_null(kiln_device_open("cpu?spin_us=1"));
    expect_error("unknown option 'bogus'");
    assert_int_equal(kiln_device_defaults_set("cpu", NULL), 0);
}

static void test_host_memory_messages(void **state)
{
    (void)state;
    /* NULL data was "device cannot use host memory in place" on devices that can */
    const char *specs[] = {"ref", "cpu", "fused:cpu", "counting:ref"};
    for (int i = 0; i < 4; i++) {
        kiln_device *d = kiln_device_open(specs[i]);
        assert_non_null(d);
        assert_null(kiln_from_host_memory(d, KILN_F32, KILN_SHAPE(4), NULL, NULL, NULL));
        expect_error("from_host_memory: data is NULL");
        static _Alignas(64) float data[4] = {1, 2, 3, 4};
        kiln_tensor *t = kiln_from_host_memory(d, KILN_F32, KILN_SHAPE(4), data, NULL, NULL);
        kiln_tensor *s = kiln_sum(t, KILN_ALL_DIMS, false);
        assert_true(s && kiln_item(s) == 10.0);
        kiln_tensor_release(s);
        kiln_tensor_release(t);
        kiln_device_close(d);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slice_huge_step),      cmocka_unit_test(test_rand_int_bounds),
        cmocka_unit_test(test_fill_value_range),     cmocka_unit_test(test_eye_sizes),
        cmocka_unit_test(test_device_specs),         cmocka_unit_test(test_defaults_set),
        cmocka_unit_test(test_host_memory_messages), cmocka_unit_test(test_expand_past_int64),
    };
    return cmocka_run_group_tests(tests, test_group_setup, test_group_teardown);
}
