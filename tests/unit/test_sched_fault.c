/*
 * tests/unit/test_sched_fault.c — whose fault a failed run is (kd_sched_fault_of, scheduler.h),
 * decided by the engine's code: an engine allocation that really fails on cpu is the memory fault
 * (503 with Retry-After, RESOURCE_EXHAUSTED) by its code, KILN_ENOMEM, even with its words taken
 * away; each code gives its fault whatever its message says; only a failure without a code is
 * read by its words, as before codes travelled.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kiln/tensor.h"
#include "scheduler.h"

/* Under AddressSanitizer an allocation this large is an error report unless the allocator may
 * say no; options given in the environment still win. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "allocator_may_return_null=1";
}

static void engine_out_of_memory_is_the_memory_fault_by_its_code(void **state)
{
    (void)state;
    kiln_device *cpu = kiln_device_open("cpu");
    assert_non_null(cpu);
    kiln_error_clear();
    /* 2^47 bytes: past what any process can map, so the allocation fails on every machine */
    assert_null(kiln_empty(cpu, KILN_U8, KILN_SHAPE((int64_t)1 << 47)));
    int code = kiln_error_code();
    assert_int_equal(code, KILN_ENOMEM);
    assert_int_equal(kd_sched_fault_of(code, kiln_error()), KD_SCHED_FAULT_MEMORY);
    /* the code decides, not the words: the same failure with a message that names no memory */
    assert_int_equal(kd_sched_fault_of(code, "zeros: the request was refused"), KD_SCHED_FAULT_MEMORY);
    kiln_error_clear();
    kiln_device_close(cpu);
}

static void each_code_gives_its_fault_whatever_the_message(void **state)
{
    (void)state;
    /* messages chosen to say the opposite of their code, so that only the code can decide */
    assert_int_equal(kd_sched_fault_of(KILN_ENOMEM, "index 7 is out of bounds for size 3"), KD_SCHED_FAULT_MEMORY);
    assert_int_equal(kd_sched_fault_of(KILN_ETOOLARGE, "cannot allocate 8 bytes: out of memory"),
                     KD_SCHED_FAULT_TOO_LARGE);
    assert_int_equal(kd_sched_fault_of(KILN_EINVAL, "matmul: out of device memory"), KD_SCHED_FAULT_INPUT);
    assert_int_equal(kd_sched_fault_of(KILN_ENOTSUP, "out of memory"), KD_SCHED_FAULT_INTERNAL);
    assert_int_equal(kd_sched_fault_of(KILN_EDEVICE, "a shape the model refuses"), KD_SCHED_FAULT_INTERNAL);
    assert_int_equal(kd_sched_fault_of(KILN_EIO, "too large to address"), KD_SCHED_FAULT_INTERNAL);
}

static void a_failure_without_a_code_is_read_by_its_words(void **state)
{
    (void)state;
    assert_int_equal(kd_sched_fault_of(0, "linear: cannot allocate f32[4096, 4096] (67108864 bytes): cpu: cannot "
                                          "allocate 67108864 bytes"),
                     KD_SCHED_FAULT_MEMORY);
    assert_int_equal(kd_sched_fault_of(0, "remote://h:1/cpu: alloc (message 9) failed on the server (device): "
                                          "cannot allocate 1024 bytes: out of device memory"),
                     KD_SCHED_FAULT_MEMORY);
    assert_int_equal(kd_sched_fault_of(0, "cannot allocate u8[8] (8 bytes): buffer_alloc: a buffer of 8 bytes "
                                          "exceeds the device's maxStorageBufferRange of 4 bytes"),
                     KD_SCHED_FAULT_TOO_LARGE);
    assert_int_equal(kd_sched_fault_of(0, "relu: device 'x' (backend y) does not support unary (relu) on f16"),
                     KD_SCHED_FAULT_INTERNAL);
    assert_int_equal(kd_sched_fault_of(0, "gather: index 7 is out of bounds for size 3"), KD_SCHED_FAULT_INPUT);
    assert_int_equal(kd_sched_fault_of(0, NULL), KD_SCHED_FAULT_INPUT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(engine_out_of_memory_is_the_memory_fault_by_its_code),
        cmocka_unit_test(each_code_gives_its_fault_whatever_the_message),
        cmocka_unit_test(a_failure_without_a_code_is_read_by_its_words),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
