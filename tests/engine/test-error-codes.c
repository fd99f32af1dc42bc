/*
 * tests/engine/test-error-codes.c — kiln_error_code(): the kind of the calling thread's last
 * failure, beside kiln_error()'s message, so that the caller of a tensor op (which returns NULL)
 * can tell memory that ran out from a buffer past a limit or an index out of range without
 * reading the words. A real allocation that cannot succeed on cpu (2^47 bytes and more: past the
 * address space, whatever the overcommit policy) is KILN_ENOMEM, its message unchanged ("cannot
 * allocate ..."); a Linear layer whose output cannot be allocated restates the failure with its
 * name and keeps the code; a shape too large to address is KILN_ETOOLARGE; an index out of range
 * KILN_EINVAL, and so is an op with no meaning on bool (abs, remainder). A later failure without a code does not inherit the earlier one's,
 * kiln_error_clear clears it, and another thread has its own.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "kiln/nn.h"
#include "kiln/tensor.h"

/* Under AddressSanitizer an allocation this large is an error report unless the allocator may
 * say no, which is what the test is about (the cpu pool's large blocks are mmapped, so this
 * matters only where a path mallocs); options given in the environment still win. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "allocator_may_return_null=1";
}

/* 2^47 bytes of u8: no process can map that much, so the allocation fails on every machine. */
#define UNMAPPABLE ((int64_t)1 << 47)

static kiln_device *cpu;

static int setup(void **state)
{
    (void)state;
    cpu = kiln_device_open("cpu");
    return cpu ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    kiln_device_close(cpu);
    return 0;
}

static void allocation_that_fails_is_enomem(void **state)
{
    (void)state;
    kiln_error_clear();
    assert_null(kiln_empty(cpu, KILN_U8, KILN_SHAPE(UNMAPPABLE)));
    assert_int_equal(kiln_error_code(), KILN_ENOMEM);
    assert_non_null(strstr(kiln_error(), "cannot allocate"));
}

static void layer_restating_the_failure_keeps_its_code(void **state)
{
    (void)state;
    kiln_generator gen = kiln_generator_make(1);
    kiln_linear_config cfg = kiln_linear_config_default();
    cfg.in_features = 1;
    cfg.out_features = 4;
    kiln_module *fc = kiln_linear_init(&cfg, cpu, &gen);
    assert_non_null(fc);
    kiln_scope_begin();
    /* one value seen as 2^45 rows (a view): the layer's output, 2^49 bytes, cannot be had */
    kiln_tensor *one = kiln_zeros(cpu, KILN_F32, KILN_SHAPE(1, 1));
    kiln_tensor *rows = kiln_expand(one, KILN_SHAPE((int64_t)1 << 45, 1));
    assert_non_null(rows);
    kiln_error_clear();
    assert_null(kiln_module_forward(fc, rows));
    assert_int_equal(kiln_error_code(), KILN_ENOMEM);
    assert_non_null(strstr(kiln_error(), "Linear '(root)'"));
    kiln_scope_end();
    kiln_module_free(fc);
}

static void shape_too_large_to_address_is_etoolarge(void **state)
{
    (void)state;
    assert_null(kiln_empty(cpu, KILN_F32, KILN_SHAPE(INT64_C(1) << 40, INT64_C(1) << 40)));
    assert_int_equal(kiln_error_code(), KILN_ETOOLARGE);
    assert_non_null(strstr(kiln_error(), "too large to address"));
}

static void index_out_of_range_is_einval(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *a = kiln_zeros(cpu, KILN_F32, KILN_SHAPE(2, 3));
    kiln_tensor *idx = kiln_from_data(cpu, KILN_I64, KILN_SHAPE(2), (int64_t[]){0, 2}, 16);
    assert_null(kiln_index_select(a, 0, idx));
    assert_int_equal(kiln_error_code(), KILN_EINVAL);
    assert_non_null(strstr(kiln_error(), "index 2 is out of bounds for size 2"));
    kiln_scope_end();
}

/* ops with no meaning on bool are the caller's mistake, named with the op and the dtype */
static void op_undefined_on_bool_is_einval(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *m = kiln_ones(cpu, KILN_BOOL, KILN_SHAPE(3));
    kiln_error_clear();
    assert_null(kiln_abs(m));
    assert_int_equal(kiln_error_code(), KILN_EINVAL);
    assert_non_null(strstr(kiln_error(), "abs"));
    assert_non_null(strstr(kiln_error(), "bool"));
    assert_null(kiln_clamp(m, 0, 1));
    assert_int_equal(kiln_error_code(), KILN_EINVAL);
    assert_non_null(strstr(kiln_error(), "clamp"));
    kiln_error_clear();
    assert_null(kiln_remainder(m, m));
    assert_int_equal(kiln_error_code(), KILN_EINVAL);
    assert_non_null(strstr(kiln_error(), "remainder"));
    assert_non_null(strstr(kiln_error(), "bool"));
    /* what is defined stays: sign is the identity, add is or, square counts in i64 */
    assert_non_null(kiln_sign(m));
    assert_non_null(kiln_add(m, m));
    assert_non_null(kiln_square(m));
    kiln_scope_end();
}

static void a_later_failure_without_a_code_does_not_inherit_one(void **state)
{
    (void)state;
    assert_null(kiln_empty(cpu, KILN_U8, KILN_SHAPE(UNMAPPABLE)));
    assert_int_equal(kiln_error_code(), KILN_ENOMEM);
    kiln_scope_begin();
    kiln_tensor *a = kiln_zeros(cpu, KILN_F32, KILN_SHAPE(2));
    kiln_tensor *b = kiln_zeros(cpu, KILN_F32, KILN_SHAPE(3));
    assert_null(kiln_add(a, b));
    assert_non_null(strstr(kiln_error(), "broadcast"));
    assert_int_not_equal(kiln_error_code(), KILN_ENOMEM);
    kiln_scope_end();
    kiln_error_clear();
    assert_int_equal(kiln_error_code(), 0);
    assert_string_equal(kiln_error(), "");
}

static void *code_seen_by_another_thread(void *out)
{
    *(int *)out = kiln_error_code();
    return NULL;
}

static void the_code_is_per_thread(void **state)
{
    (void)state;
    assert_null(kiln_empty(cpu, KILN_U8, KILN_SHAPE(UNMAPPABLE)));
    int other = -100;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, code_seen_by_another_thread, &other), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(other, 0);
    assert_int_equal(kiln_error_code(), KILN_ENOMEM);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(allocation_that_fails_is_enomem),
        cmocka_unit_test(layer_restating_the_failure_keeps_its_code),
        cmocka_unit_test(shape_too_large_to_address_is_etoolarge),
        cmocka_unit_test(index_out_of_range_is_einval),
        cmocka_unit_test(op_undefined_on_bool_is_einval),
        cmocka_unit_test(a_later_failure_without_a_code_does_not_inherit_one),
        cmocka_unit_test(the_code_is_per_thread),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
