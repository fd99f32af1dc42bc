/*
 * tests/unit/test_shm.c — the table of system shared-memory regions (api/shm.c) on real POSIX
 * shared-memory objects: registration checks (names, keys, sizes against the object, offsets not
 * on a page boundary, overflow, duplicates, the region limit), slices checked against their
 * region, a slice that keeps its mapping readable and writable after its region is unregistered
 * (and the table freed), and an object shrunk after registering refused rather than touched. Run
 * under ASan, a mapping freed too early or never would show.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shm.h"

static char key[64];

/* A fresh object of size bytes holding 0, 1, 2, ... (mod 251) under key. */
static void make_object(size_t size)
{
    snprintf(key, sizeof key, "/kiln_unit_shm_%d", (int)getpid());
    shm_unlink(key);
    int fd = shm_open(key, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    uint8_t buf[4096];
    for (size_t at = 0; at < size; at += sizeof buf) {
        size_t n = size - at < sizeof buf ? size - at : sizeof buf;
        for (size_t i = 0; i < n; i++)
            buf[i] = (uint8_t)((at + i) % 251);
        assert_int_equal(pwrite(fd, buf, n, (off_t)at), (ssize_t)n);
    }
    close(fd);
}

static int teardown(void **state)
{
    (void)state;
    shm_unlink(key);
    return 0;
}

static void test_register_checks(void **state)
{
    (void)state;
    make_object(10000);
    struct kd_shm_table *t = kd_shm_table_new();
    char msg[320];
    assert_int_equal(kd_shm_register(t, "bad name", key, 0, 16, msg, sizeof msg), 400);
    assert_int_equal(kd_shm_register(t, "", key, 0, 16, msg, sizeof msg), 400);
    assert_int_equal(kd_shm_register(t, "a", "no-slash", 0, 16, msg, sizeof msg), 400);
    assert_int_equal(kd_shm_register(t, "a", "/x/y", 0, 16, msg, sizeof msg), 400);
    assert_int_equal(kd_shm_register(t, "a", "/..", 0, 16, msg, sizeof msg), 400);
    assert_int_equal(kd_shm_register(t, "a", "/kiln_unit_shm_missing", 0, 16, msg, sizeof msg), 400);
    assert_non_null(strstr(msg, "unable to open"));
    assert_int_equal(kd_shm_register(t, "a", key, 0, 0, msg, sizeof msg), 400);
    assert_int_equal(kd_shm_register(t, "a", key, 0, 10001, msg, sizeof msg), 400);
    assert_non_null(strstr(msg, "fewer than offset + byte_size"));
    assert_int_equal(kd_shm_register(t, "a", key, 9999, 2, msg, sizeof msg), 400);
    assert_int_equal(kd_shm_register(t, "a", key, UINT64_MAX - 1, 4, msg, sizeof msg), 400);
    assert_int_equal(kd_shm_count(t), 0);
    /* an offset inside a page: the region starts exactly there */
    assert_int_equal(kd_shm_register(t, "a", key, 4097, 5000, msg, sizeof msg), 0);
    assert_int_equal(kd_shm_register(t, "a", key, 0, 16, msg, sizeof msg), 409);
    struct kd_shm_slice s = {0};
    assert_int_equal(kd_shm_slice_get(t, "a", 3, 10, "input 'x'", &s, msg, sizeof msg), 0);
    const uint8_t *p = kd_shm_slice_ptr(&s, msg, sizeof msg);
    assert_non_null(p);
    for (int i = 0; i < 10; i++)
        assert_int_equal(p[i], (4097 + 3 + i) % 251);
    kd_shm_slice_release(&s);
    assert_null(s.region);
    /* slices past the region, or overflowing */
    assert_int_equal(kd_shm_slice_get(t, "a", 4991, 10, "input 'x'", &s, msg, sizeof msg), 400);
    assert_non_null(strstr(msg, "past the end of region 'a'"));
    assert_int_equal(kd_shm_slice_get(t, "a", UINT64_MAX, 2, "input 'x'", &s, msg, sizeof msg), 400);
    assert_int_equal(kd_shm_slice_get(t, "nosuch", 0, 1, "input 'x'", &s, msg, sizeof msg), 400);
    assert_null(s.region);
    assert_int_equal(kd_shm_slice_get(t, "a", 0, 5000, "input 'x'", &s, msg, sizeof msg), 0);
    kd_shm_slice_release(&s);
    kd_shm_table_free(t);
}

static void count_row(void *ud, const char *name, const char *k, uint64_t offset, uint64_t byte_size)
{
    (void)name, (void)k, (void)offset, (void)byte_size;
    ++*(int *)ud;
}

static void test_limit_status_unregister(void **state)
{
    (void)state;
    make_object(64);
    struct kd_shm_table *t = kd_shm_table_new();
    char msg[320], name[32];
    for (int i = 0; i < KD_SHM_MAX_REGIONS; i++) {
        snprintf(name, sizeof name, "r%d", i);
        assert_int_equal(kd_shm_register(t, name, key, 0, 64, msg, sizeof msg), 0);
    }
    assert_int_equal(kd_shm_register(t, "one_more", key, 0, 64, msg, sizeof msg), 429);
    int rows = 0;
    assert_int_equal(kd_shm_status(t, NULL, count_row, &rows, msg, sizeof msg), 0);
    assert_int_equal(rows, KD_SHM_MAX_REGIONS);
    rows = 0;
    assert_int_equal(kd_shm_status(t, "r7", count_row, &rows, msg, sizeof msg), 0);
    assert_int_equal(rows, 1);
    assert_int_equal(kd_shm_status(t, "nosuch", count_row, &rows, msg, sizeof msg), 404);
    assert_int_equal(kd_shm_unregister(t, "r7", msg, sizeof msg), 0);
    assert_int_equal(kd_shm_unregister(t, "r7", msg, sizeof msg), 404);
    assert_int_equal(kd_shm_count(t), KD_SHM_MAX_REGIONS - 1);
    assert_int_equal(kd_shm_unregister(t, "", msg, sizeof msg), 0);
    assert_int_equal(kd_shm_count(t), 0);
    kd_shm_table_free(t);
}

/* A request's slice outlives its region's registration and the table itself. */
static void test_slice_outlives_unregister(void **state)
{
    (void)state;
    make_object(8192);
    struct kd_shm_table *t = kd_shm_table_new();
    char msg[320];
    assert_int_equal(kd_shm_register(t, "a", key, 0, 8192, msg, sizeof msg), 0);
    struct kd_shm_use use = {0};
    assert_int_equal(kd_shm_slice_get(t, "a", 0, 100, "input 'x'", &use.in[0], msg, sizeof msg), 0);
    assert_int_equal(kd_shm_slice_get(t, "a", 4096, 100, "output 'y'", &use.out[1], msg, sizeof msg), 0);
    assert_true(kd_shm_use_any(&use));
    assert_int_equal(kd_shm_unregister(t, "a", msg, sizeof msg), 0);
    assert_int_equal(kd_shm_slice_get(t, "a", 0, 1, "input 'x'", &use.in[1], msg, sizeof msg), 400);
    kd_shm_table_free(t);
    uint8_t *out = kd_shm_slice_ptr(&use.out[1], msg, sizeof msg);
    assert_non_null(out);
    memset(out, 0xAB, 100); /* still mapped, and shared: the object sees it */
    assert_string_equal(kd_shm_slice_region_name(&use.in[0]), "a");
    kd_shm_use_release(&use);
    assert_false(kd_shm_use_any(&use));
    int fd = shm_open(key, O_RDONLY, 0);
    assert_true(fd >= 0);
    uint8_t b = 0;
    assert_int_equal(pread(fd, &b, 1, 4096 + 99), 1);
    assert_int_equal(b, 0xAB);
    close(fd);
}

static void test_shrunk_object(void **state)
{
    (void)state;
    make_object(8192);
    struct kd_shm_table *t = kd_shm_table_new();
    char msg[320];
    assert_int_equal(kd_shm_register(t, "a", key, 100, 8000, msg, sizeof msg), 0);
    struct kd_shm_slice s = {0};
    assert_int_equal(kd_shm_slice_get(t, "a", 0, 8000, "input 'x'", &s, msg, sizeof msg), 0);
    int fd = shm_open(key, O_RDWR, 0);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 4096), 0);
    assert_null(kd_shm_slice_ptr(&s, msg, sizeof msg));
    assert_non_null(strstr(msg, "shrunk"));
    assert_int_equal(ftruncate(fd, 8192), 0);
    close(fd);
    assert_non_null(kd_shm_slice_ptr(&s, msg, sizeof msg));
    kd_shm_slice_release(&s);
    kd_shm_table_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_register_checks, teardown),
        cmocka_unit_test_teardown(test_limit_status_unregister, teardown),
        cmocka_unit_test_teardown(test_slice_outlives_unregister, teardown),
        cmocka_unit_test_teardown(test_shrunk_object, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
