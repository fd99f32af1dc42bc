/*
 * tests/engine/test-device-trim.c — kiln_device_trim hands a device's cached buffers back to
 * the system, largest first, and kiln_device_memory_get shows it: on cpu a freed tensor's
 * buffer is parked (cached bytes go up, a tensor of the same size reuses it without a new
 * allocation), a trim of one byte releases the largest parked buffer only, a trim of
 * SIZE_MAX the rest, and the cached bytes are then 0; through a decorator (counting:cpu) the
 * same. Mid-size buffers carved from shared chunks keep their values through a trim of
 * their neighbours. ref parks nothing (its frees go straight back), so a trim there
 * releases 0. A NULL device is refused with a message. kiln_device_memory_reset_peak starts
 * the peak again from the bytes in use (cpu, through decorators), refused on ref.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "kiln/tensor.h"

#define MIB ((uint64_t)1 << 20)

/* A tensor of mib MiB of f32 on dev, freed at once: its buffer goes to the pool. */
static void make_and_free(kiln_device *dev, uint64_t mib)
{
    kiln_tensor *t = kiln_full(dev, KILN_F32, 1, (int64_t[]){(int64_t)(mib * MIB / 4)}, 1.0);
    if (!t)
        fail_msg("kiln_full on %s: %s", kiln_device_name(dev), kiln_error());
    kiln_tensor_release(t);
}

static void memory(kiln_device *dev, kiln_device_memory *out)
{
    if (kiln_device_memory_get(dev, out) != 0)
        fail_msg("kiln_device_memory_get on %s: %s", kiln_device_name(dev), kiln_error());
}

/* The pool of dev (cpu, or a decorator over it) emptied first, then filled with a 1 MiB and a
 * 4 MiB buffer (sizes that are exact size classes, so the figures can be compared exactly). */
static void trims_largest_first(const char *spec)
{
    kiln_device *dev = kiln_device_open(spec);
    if (!dev)
        fail_msg("open %s: %s", spec, kiln_error());
    kiln_device_trim(dev, SIZE_MAX);
    kiln_device_memory m0, m1, m2, m3, m4;
    memory(dev, &m0);
    assert_int_equal(m0.cached_bytes, 0);

    make_and_free(dev, 4);
    memory(dev, &m1);
    assert_int_equal(m1.cached_bytes, 4 * MIB);
    assert_int_equal(m1.in_use_bytes, m0.in_use_bytes);
    assert_int_equal(m1.reserved_bytes, m1.in_use_bytes + m1.cached_bytes);
    assert_true(m1.peak_in_use_bytes >= m0.in_use_bytes + 4 * MIB);
    assert_int_equal(m1.device_allocs, m0.device_allocs + 1);

    /* the same size again takes the parked buffer: a reuse, no new allocation */
    make_and_free(dev, 4);
    memory(dev, &m2);
    assert_int_equal(m2.reuses, m1.reuses + 1);
    assert_int_equal(m2.device_allocs, m1.device_allocs);
    assert_int_equal(m2.cached_bytes, 4 * MIB);

    make_and_free(dev, 1);
    memory(dev, &m2);
    assert_int_equal(m2.cached_bytes, 5 * MIB);

    /* asked for one byte, the trim releases one buffer, the largest */
    assert_int_equal(kiln_device_trim(dev, 1), 4 * MIB);
    memory(dev, &m3);
    assert_int_equal(m3.cached_bytes, 1 * MIB);
    assert_int_equal(m3.reserved_bytes, m3.in_use_bytes + 1 * MIB);

    assert_int_equal(kiln_device_trim(dev, 0), 0);
    assert_int_equal(kiln_device_trim(dev, SIZE_MAX), 1 * MIB);
    memory(dev, &m4);
    assert_int_equal(m4.cached_bytes, 0);
    assert_int_equal(m4.in_use_bytes, m0.in_use_bytes);
    assert_int_equal(kiln_device_trim(dev, SIZE_MAX), 0);
    kiln_device_close(dev);
}

static void test_cpu(void **state)
{
    (void)state;
    trims_largest_first("cpu");
}

static void test_decorated_cpu(void **state)
{
    (void)state;
    trims_largest_first("counting:cpu");
}

/* A live tensor's buffer is not the pool's: a trim leaves it, and its data, alone. */
static void test_cpu_keeps_live_buffers(void **state)
{
    (void)state;
    kiln_device *dev = kiln_device_open("cpu");
    assert_non_null(dev);
    kiln_device_trim(dev, SIZE_MAX);
    kiln_device_memory m0, m1;
    memory(dev, &m0);
    kiln_tensor *live = kiln_full(dev, KILN_F32, 1, (int64_t[]){(int64_t)(2 * MIB / 4)}, 3.0);
    assert_non_null(live);
    make_and_free(dev, 1);
    assert_int_equal(kiln_device_trim(dev, SIZE_MAX), 1 * MIB);
    memory(dev, &m1);
    assert_int_equal(m1.cached_bytes, 0);
    assert_int_equal(m1.in_use_bytes, m0.in_use_bytes + 2 * MIB);
    kiln_tensor *s = kiln_sum(live, KILN_ALL_DIMS, false);
    assert_non_null(s);
    assert_true(kiln_item(s) == 3.0 * (double)(2 * MIB / 4));
    kiln_tensor_release(s);
    kiln_tensor_release(live);
    kiln_device_trim(dev, SIZE_MAX);
    kiln_device_close(dev);
}

/* Mid-size buffers (64 KiB up to 2 MiB) are carved side by side from chunks of huge pages
 * (backends/cpu/cpu-alloc.c): forty of 256 KiB span two chunks. Each holds its own values
 * (no two overlap), freed ones are reused by their size, and a trim that gives back the
 * parked ones (their pages returned while a live neighbour keeps the chunk) leaves the
 * live ones' values as they were; new ones after the trim are right too. */
static void test_cpu_carved_neighbours(void **state)
{
    (void)state;
    enum {
        NT = 40
    };
    const int64_t n = 256 * 1024 / 4;
    kiln_device *dev = kiln_device_open("cpu");
    assert_non_null(dev);
    kiln_device_trim(dev, SIZE_MAX);
    kiln_tensor *t[NT];
    for (int i = 0; i < NT; i++) {
        t[i] = kiln_full(dev, KILN_F32, 1, (int64_t[]){n}, (double)(i + 1));
        assert_non_null(t[i]);
    }
    kiln_device_memory m0, m1;
    memory(dev, &m0);
    for (int i = 0; i < NT; i += 2) { /* every other one freed, then made again */
        kiln_tensor_release(t[i]);
        t[i] = NULL;
    }
    for (int i = 0; i < NT; i += 4) {
        t[i] = kiln_full(dev, KILN_F32, 1, (int64_t[]){n}, (double)(100 + i));
        assert_non_null(t[i]);
    }
    memory(dev, &m1);
    assert_int_equal(m1.reuses - m0.reuses, NT / 4);
    assert_int_equal(m1.device_allocs, m0.device_allocs);
    assert_true(kiln_device_trim(dev, SIZE_MAX) >= (uint64_t)(NT / 4) * 256 * 1024);
    memory(dev, &m1);
    assert_int_equal(m1.cached_bytes, 0);
    for (int i = 0; i < NT; i++) {
        if (!t[i])
            continue;
        double want = i % 4 == 0 ? 100 + i : i + 1;
        kiln_tensor *s = kiln_sum(t[i], KILN_ALL_DIMS, false);
        assert_non_null(s);
        if (kiln_item(s) != want * (double)n)
            fail_msg("buffer %d holds %g per element after the trim, not %g", i, kiln_item(s) / (double)n, want);
        kiln_tensor_release(s);
    }
    kiln_tensor *fresh = kiln_full(dev, KILN_F32, 1, (int64_t[]){n}, 7.0);
    assert_non_null(fresh);
    kiln_tensor *s = kiln_sum(fresh, KILN_ALL_DIMS, false);
    assert_true(kiln_item(s) == 7.0 * (double)n);
    kiln_tensor_release(s);
    kiln_tensor_release(fresh);
    for (int i = 0; i < NT; i++)
        kiln_tensor_release(t[i]);
    kiln_device_trim(dev, SIZE_MAX);
    memory(dev, &m1);
    assert_int_equal(m1.cached_bytes, 0);
    kiln_device_close(dev);
}

/* ref keeps no pool and no figures: a trim has nothing to release. */
static void test_ref(void **state)
{
    (void)state;
    kiln_device *dev = kiln_device_open("ref");
    assert_non_null(dev);
    make_and_free(dev, 4);
    assert_int_equal(kiln_device_trim(dev, SIZE_MAX), 0);
    kiln_device_memory m;
    assert_int_equal(kiln_device_memory_get(dev, &m), KILN_ENOTSUP);
    assert_non_null(strstr(kiln_error(), "'ref'"));
    kiln_device_close(dev);
}

/* kiln_device_memory_reset_peak: the peak starts again from what is in use, then follows
 * the next allocations; through decorators too; refused by name on ref. */
static void test_reset_peak(void **state)
{
    (void)state;
    const char *specs[] = {"cpu", "counting:cpu", "cpu?fusion=on"};
    for (int s = 0; s < 3; s++) {
        kiln_device *dev = kiln_device_open(specs[s]);
        assert_non_null(dev);
        make_and_free(dev, 4); /* a 4 MiB peak, nothing in use after */
        kiln_device_memory m;
        memory(dev, &m);
        assert_true(m.peak_in_use_bytes >= 4 * MIB);
        uint64_t in_use = m.in_use_bytes;
        assert_int_equal(kiln_device_memory_reset_peak(dev), 0);
        memory(dev, &m);
        assert_int_equal(m.peak_in_use_bytes, in_use);
        make_and_free(dev, 1);
        memory(dev, &m);
        assert_int_equal(m.peak_in_use_bytes, in_use + 1 * MIB);
        kiln_device_close(dev);
    }
    kiln_device *ref = kiln_device_open("ref");
    assert_non_null(ref);
    /* the code returned is the one kiln_error_code() keeps (callers decide by it) */
    assert_int_equal(kiln_device_memory_reset_peak(ref), KILN_ENOTSUP);
    assert_non_null(strstr(kiln_error(), "'ref'"));
    assert_int_equal(kiln_error_code(), KILN_ENOTSUP);
    kiln_device_memory m;
    assert_int_equal(kiln_device_memory_get(ref, &m), KILN_ENOTSUP);
    assert_int_equal(kiln_error_code(), KILN_ENOTSUP);
    kiln_device_close(ref);
    kiln_device *fused_ref = kiln_device_open("fused:ref");
    assert_non_null(fused_ref);
    assert_int_equal(kiln_device_memory_reset_peak(fused_ref), KILN_ENOTSUP);
    assert_non_null(strstr(kiln_error(), "no memory figures"));
    assert_int_equal(kiln_error_code(), KILN_ENOTSUP);
    assert_int_equal(kiln_device_memory_get(fused_ref, &m), KILN_ENOTSUP);
    assert_int_equal(kiln_error_code(), KILN_ENOTSUP);
    kiln_device_close(fused_ref);
    kiln_device *counting_ref = kiln_device_open("counting:ref");
    assert_non_null(counting_ref);
    assert_int_equal(kiln_device_memory_get(counting_ref, &m), KILN_ENOTSUP);
    assert_int_equal(kiln_error_code(), KILN_ENOTSUP);
    kiln_device_close(counting_ref);
    assert_int_equal(kiln_device_memory_reset_peak(NULL), KILN_EINVAL);
    assert_non_null(strstr(kiln_error(), "device is NULL"));
    assert_int_equal(kiln_error_code(), KILN_EINVAL);
    assert_int_equal(kiln_device_memory_get(NULL, &m), KILN_EINVAL);
    assert_int_equal(kiln_error_code(), KILN_EINVAL);
}

static void test_null_device(void **state)
{
    (void)state;
    kiln_error_clear();
    assert_int_equal(kiln_device_trim(NULL, SIZE_MAX), 0);
    assert_non_null(strstr(kiln_error(), "kiln_device_trim: device is NULL"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu),
        cmocka_unit_test(test_decorated_cpu),
        cmocka_unit_test(test_cpu_keeps_live_buffers),
        cmocka_unit_test(test_cpu_carved_neighbours),
        cmocka_unit_test(test_ref),
        cmocka_unit_test(test_reset_peak),
        cmocka_unit_test(test_null_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
