/*
 * tests/engine/test-device-open.c — which handle kiln_device_open gives back: the options in
 * effect (the spec's, kiln_device_defaults_set's, the environment's) decide whether an open
 * shares a device already open, so a changed default is neither ignored nor accepted unchecked
 * while a device with the same spec is held; and a spec that names the fusion decorator while
 * turning fusion off is refused. Internal: which backend a device runs (fused or not) is read
 * from its interface.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tensor-impl.h"

static void expect_error(const char *part)
{
    if (!strstr(kiln_error(), part))
        fail_msg("error '%s' does not contain '%s'", kiln_error(), part);
}

static const char *backend_of(const kiln_device *dev)
{
    return kiln__device_iface(dev)->name;
}

/* The sum of four ones computed on dev: the device works. */
static double sum_of_ones(kiln_device *dev)
{
    kiln_tensor *t = kiln_ones(dev, KILN_F32, KILN_SHAPE(4));
    kiln_tensor *s = kiln_sum(t, KILN_ALL_DIMS, false);
    double v = s ? kiln_item(s) : -1.0;
    kiln_tensor_release(s);
    kiln_tensor_release(t);
    return v;
}

static int clean_environment(void **state)
{
    (void)state;
    unsetenv("KILN_CPU_THREADS");
    unsetenv("KILN_CPU_CONV");
    unsetenv("KILN_CPU_FUSION");
    return kiln_device_defaults_set("cpu", NULL);
}

static void test_defaults_decide_identity(void **state)
{
    (void)state;
    kiln_device *plain = kiln_device_open("cpu");
    assert_non_null(plain);

    /* a bad default is refused by the open that sees it, while "cpu" is held */
    assert_int_equal(kiln_device_defaults_set("cpu", "threads=1&conv=bogus"), 0);
    kiln_error_clear();
    assert_null(kiln_device_open("cpu"));
    expect_error(
        "kiln_device_open: cannot open 'cpu': cpu: option conv (from device_options) must be auto, packed or "
        "direct, got 'bogus'");

    /* a good one gives a device opened with it, shared by the opens that see the same */
    assert_int_equal(kiln_device_defaults_set("cpu", "threads=1"), 0);
    kiln_device *one = kiln_device_open("cpu");
    assert_non_null(one);
    assert_ptr_not_equal(one, plain);
    assert_string_equal(kiln_device_name(one), "cpu");
    assert_ptr_equal(kiln_device_open("cpu"), one);
    kiln_device_close(one);
    assert_true(sum_of_ones(one) == 4.0);

    /* back to no defaults: the first device again */
    assert_int_equal(kiln_device_defaults_set("cpu", NULL), 0);
    assert_ptr_equal(kiln_device_open("cpu"), plain);
    kiln_device_close(plain);
    kiln_device_close(one);
    kiln_device_close(plain);
}

static void test_environment_decides_identity(void **state)
{
    (void)state;
    kiln_device *plain = kiln_device_open("cpu");
    assert_non_null(plain);

    setenv("KILN_CPU_THREADS", "0", 1);
    kiln_error_clear();
    assert_null(kiln_device_open("cpu"));
    expect_error("option threads (from KILN_CPU_THREADS) must be a whole number from 1 to 256, got '0'");

    setenv("KILN_CPU_THREADS", "2", 1);
    kiln_device *two = kiln_device_open("cpu");
    assert_non_null(two);
    assert_ptr_not_equal(two, plain);
    assert_true(sum_of_ones(two) == 4.0);
    /* the spec's value wins: the variable does not make it another device */
    kiln_device *spelled = kiln_device_open("cpu?threads=3");
    setenv("KILN_CPU_THREADS", "1", 1);
    assert_ptr_equal(kiln_device_open("cpu?threads=3"), spelled);
    kiln_device_close(spelled);

    unsetenv("KILN_CPU_THREADS");
    assert_ptr_equal(kiln_device_open("cpu"), plain);
    kiln_device_close(plain);
    kiln_device_close(spelled);
    kiln_device_close(two);
    kiln_device_close(plain);
}

static void test_fusion_variable_while_open(void **state)
{
    (void)state;
    kiln_device *plain = kiln_device_open("cpu");
    assert_non_null(plain);
    assert_string_equal(backend_of(plain), "cpu");

    /* KILN_CPU_FUSION=on was ignored while an unfused "cpu" was open */
    setenv("KILN_CPU_FUSION", "on", 1);
    kiln_device *fused = kiln_device_open("cpu");
    assert_non_null(fused);
    assert_ptr_not_equal(fused, plain);
    assert_string_equal(backend_of(fused), "fused");
    assert_string_equal(kiln_device_name(fused), "cpu");
    assert_true(sum_of_ones(fused) == 4.0);
    /* the variable is about cpu devices, decorated ones too, as the spec's fusion=on is */
    kiln_device *counted = kiln_device_open("counting:cpu");
    assert_non_null(counted);
    assert_string_equal(backend_of(counted), "fused");
    assert_string_equal(kiln_device_name(counted), "counting:cpu");
    kiln_device_close(counted);
    setenv("KILN_CPU_FUSION", "maybe", 1);
    kiln_error_clear();
    assert_null(kiln_device_open("cpu"));
    expect_error(
        "kiln_device_open: cannot open 'cpu': option fusion (from KILN_CPU_FUSION) must be on or off, not "
        "'maybe'");

    unsetenv("KILN_CPU_FUSION");
    /* a bad value in the spec reads as an unknown option does: "cannot open 'SPEC': ..." (it
     * lacked the prefix) */
    kiln_error_clear();
    assert_null(kiln_device_open("cpu?fusion=of"));
    expect_error("kiln_device_open: cannot open 'cpu?fusion=of': option fusion (from spec) must be on or off, "
                 "not 'of'");
    assert_null(kiln_device_open("cpu?fusio=on"));
    expect_error("kiln_device_open: cannot open 'cpu?fusio=on': unknown option 'fusio' for backend cpu");
    kiln_device *again = kiln_device_open("cpu");
    assert_ptr_equal(again, plain);
    kiln_device_close(again);
    kiln_device_close(fused);
    kiln_device_close(plain);
}

static void test_fused_with_fusion_off(void **state)
{
    (void)state;
    kiln_error_clear();
    assert_null(kiln_device_open("fused:cpu?fusion=off"));
    expect_error(
        "kiln_device_open: cannot open 'fused:cpu?fusion=off': 'fused:cpu' names the fusion decorator while "
        "option fusion=off (from spec) turns fusion off");
    kiln_error_clear();
    assert_null(kiln_device_open_opts("fused:cpu", "fusion=off"));
    expect_error("fusion=off (from options)");
    kiln_error_clear();
    assert_null(kiln_device_open("counting:fused:ref?fusion=off"));
    expect_error("'counting:fused:ref' names the fusion decorator");

    /* fusion=on beside the decorator says the same twice: one decorator, not two */
    kiln_device *d = kiln_device_open("fused:cpu?fusion=on");
    assert_non_null(d);
    assert_string_equal(backend_of(d), "fused");
    assert_string_equal(kiln_device_name(d), "fused:cpu?fusion=on");
    kiln_device_close(d);
    d = kiln_device_open("counting:fused:ref?fusion=on");
    assert_non_null(d);
    assert_string_equal(backend_of(d), "counting");
    assert_true(sum_of_ones(d) == 4.0);
    kiln_device_close(d);
    /* the option alone still fuses, under the name asked for */
    d = kiln_device_open("cpu?fusion=on");
    assert_non_null(d);
    assert_string_equal(backend_of(d), "fused");
    assert_string_equal(kiln_device_name(d), "cpu?fusion=on");
    kiln_device_close(d);
}

/* The fusion decorator's keys (codegen, min_elements) set as defaults for a backend reach that
 * backend's fused devices (they were refused as unknown to the backend below the decorator);
 * a device opened without fusion ignores them from the defaults and refuses them from its spec. */
static void test_decorator_keys_from_defaults(void **state)
{
    (void)state;
    assert_int_equal(kiln_device_defaults_set("counting", "codegen=off&min_elements=0"), 0);
    kiln_device *d = kiln_device_open("fused:counting:cpu");
    if (!d)
        fail_msg("fused:counting:cpu with the decorator's keys as counting's defaults: %s", kiln_error());
    /* min_elements=0: even four elements record; codegen=off: the group replays call by call,
     * so the device below sees the fill and the sum and never a fused program */
    assert_true(sum_of_ones(d) == 4.0);
    uint64_t fused_calls = 1, fills = 0;
    kiln_device_counters c;
    assert_int_equal(kiln_device_counters_get(d, &c, "fused", &fused_calls), 0);
    assert_int_equal(kiln_device_counters_get(d, &c, "fill", &fills), 0);
    assert_int_equal(fused_calls, 0);
    assert_true(fills >= 1);
    kiln_device_close(d);
    assert_int_equal(kiln_device_defaults_set("counting", NULL), 0);

    assert_int_equal(kiln_device_defaults_set("cpu", "codegen=off"), 0);
    d = kiln_device_open("cpu"); /* unfused: the default does not apply */
    if (!d)
        fail_msg("cpu with codegen=off among cpu's defaults: %s", kiln_error());
    assert_string_equal(backend_of(d), "cpu");
    kiln_device_close(d);
    d = kiln_device_open("cpu?fusion=on");
    assert_non_null(d);
    assert_true(sum_of_ones(d) == 4.0);
    kiln_device_close(d);
    assert_int_equal(kiln_device_defaults_set("cpu", NULL), 0);
    kiln_error_clear();
    assert_null(kiln_device_open("cpu?min_elements=5"));
    expect_error("option min_elements (from spec) belongs to the fusion decorator, and this cpu device opens "
                 "without fusion");
    assert_int_equal(kiln_error_code(), KILN_EINVAL);
}

/* A whole-number option takes digits only: strtol alone took " 5" and "+5" as 5. A device
 * without counters asked for them answers in the function's name, with the device's spec. */
static void test_number_options_and_counters(void **state)
{
    (void)state;
    static const char *const bad[] = {"fused:cpu?min_elements=+5", "fused:cpu?min_elements=%205",
                                      "fused:cpu?min_elements=5x", "fused:cpu?min_elements="};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kiln_error_clear();
        kiln_device *d = kiln_device_open(bad[i]);
        if (d)
            fail_msg("'%s' opened", bad[i]);
        expect_error("option min_elements (from spec) must be a whole number from 0");
    }
    kiln_device *d = kiln_device_open("fused:cpu?min_elements=5");
    assert_non_null(d);
    kiln_device_counters c;
    assert_true(kiln_device_counters_get(d, &c, NULL, NULL) < 0);
    expect_error("kiln_device_counters_get: device 'fused:cpu?min_elements=5': fused: the inner device");
    expect_error("keeps no counters");
    kiln_device_close(d);
}

/* A key named twice in one text says two things; it is refused rather than the last one taken
 * ("cpu?fusion=on&fusion=off" had opened unfused), while a later source still overrides an
 * earlier one (the spec over the defaults). */
static void test_key_given_twice(void **state)
{
    (void)state;
    kiln_error_clear();
    assert_null(kiln_device_open("cpu?fusion=on&fusion=off"));
    expect_error("option fusion is given twice (spec)");
    assert_int_equal(kiln_error_code(), KILN_EINVAL);
    assert_null(kiln_device_open_opts("cpu", "threads=1&threads=2"));
    expect_error("option threads is given twice (options)");
    assert_true(kiln_device_defaults_set("cpu", "threads=1&threads=2") < 0);
    expect_error("option threads is given twice (device_options)");
    assert_int_equal(kiln_device_defaults_set("cpu", "threads=2"), 0);
    kiln_device *d = kiln_device_open("cpu?threads=1");
    assert_non_null(d);
    assert_string_equal(kiln_device_name(d), "cpu?threads=1");
    kiln_device_close(d);
    assert_int_equal(kiln_device_defaults_set("cpu", NULL), 0);
}

/* A configured spec shown in a program's logs: secrets masked as kiln_device_name masks
 * them, everything else as written, decorators and option order kept. */
static void test_spec_redact(void **state)
{
    (void)state;
    char out[256];
    assert_string_equal(kiln_device_spec_redact("remote://10.0.0.5:8080/cpu?token=s3cret", out, sizeof out),
                        "remote://10.0.0.5:8080/cpu?token=***");
    assert_string_equal(
        kiln_device_spec_redact("counting:remote://h:1/vulkan:0?timeout_ms=5&token=a=b&x=1", out, sizeof out),
        "counting:remote://h:1/vulkan:0?timeout_ms=5&token=***&x=1");
    assert_string_equal(kiln_device_spec_redact("cpu?threads=2", out, sizeof out), "cpu?threads=2");
    assert_string_equal(kiln_device_spec_redact("cuda:0", out, sizeof out), "cuda:0");
    assert_string_equal(kiln_device_spec_redact(NULL, out, sizeof out), "");
    char tiny[8];
    assert_string_equal(kiln_device_spec_redact("remote://h:1/cpu?token=s3cret", tiny, sizeof tiny), "remote:");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_defaults_decide_identity, clean_environment),
        cmocka_unit_test_setup(test_environment_decides_identity, clean_environment),
        cmocka_unit_test_setup(test_fusion_variable_while_open, clean_environment),
        cmocka_unit_test_setup(test_fused_with_fusion_off, clean_environment),
        cmocka_unit_test_setup(test_decorator_keys_from_defaults, clean_environment),
        cmocka_unit_test_setup(test_key_given_twice, clean_environment),
        cmocka_unit_test_setup(test_number_options_and_counters, clean_environment),
        cmocka_unit_test(test_spec_redact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
