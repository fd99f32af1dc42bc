/*
 * tests/unit/test_router.c — route matching, 405 Allow lists and method names.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "router.h"

static int h(void *ctx, const struct kiln_request *req, struct kiln_buf *out)
{
    (void)ctx, (void)req, (void)out;
    return 200;
}

static const struct kiln_route routes[] = {
    {"/v2", KILN_HTTP_GET, h},
    {"/v2/health/live", KILN_HTTP_GET, h},
    {"/v1/jobs", KILN_HTTP_GET | KILN_HTTP_POST, h},
};
static const struct kiln_router router = {routes, 3};

static enum kiln_route_result match(unsigned m, const char *path, size_t *idx)
{
    return kiln_router_match(&router, m, path, strlen(path), idx);
}

static void test_found(void **state)
{
    (void)state;
    size_t idx;
    assert_int_equal(match(KILN_HTTP_GET, "/v2", &idx), KILN_ROUTE_FOUND);
    assert_int_equal(idx, 0);
    assert_int_equal(match(KILN_HTTP_GET, "/v2/health/live", &idx), KILN_ROUTE_FOUND);
    assert_int_equal(idx, 1);
    assert_int_equal(match(KILN_HTTP_POST, "/v1/jobs", &idx), KILN_ROUTE_FOUND);
    assert_int_equal(idx, 2);
}

static void test_not_found_is_exact(void **state)
{
    (void)state;
    size_t idx;
    const char *misses[] = {"/", "", "/v", "/v2/", "/v2/health", "/v2/health/live/", "/V2", "/v2x"};
    for (size_t i = 0; i < sizeof misses / sizeof misses[0]; i++) {
        assert_int_equal(match(KILN_HTTP_GET, misses[i], &idx), KILN_ROUTE_NOT_FOUND);
        assert_int_equal(idx, router.count);
    }
    /* A path with an embedded NUL must not match its prefix. */
    assert_int_equal(kiln_router_match(&router, KILN_HTTP_GET, "/v2\0x", 5, &idx), KILN_ROUTE_NOT_FOUND);
}

static void test_method_not_allowed_and_allow(void **state)
{
    (void)state;
    size_t idx;
    char allow[64];
    assert_int_equal(match(KILN_HTTP_POST, "/v2", &idx), KILN_ROUTE_METHOD_NOT_ALLOWED);
    kiln_router_allow(&router, idx, allow, sizeof allow);
    assert_string_equal(allow, "GET");
    assert_int_equal(match(KILN_HTTP_DELETE, "/v1/jobs", &idx), KILN_ROUTE_METHOD_NOT_ALLOWED);
    kiln_router_allow(&router, idx, allow, sizeof allow);
    assert_string_equal(allow, "GET, POST");
    assert_int_equal(match(KILN_HTTP_OTHER, "/v2", &idx), KILN_ROUTE_METHOD_NOT_ALLOWED);
    kiln_router_allow(&router, router.count, allow, sizeof allow);
    assert_string_equal(allow, "");
}

static void test_method_names(void **state)
{
    (void)state;
    assert_int_equal(kiln_http_method_from_name("GET", 3), KILN_HTTP_GET);
    assert_int_equal(kiln_http_method_from_name("DELETE", 6), KILN_HTTP_DELETE);
    assert_int_equal(kiln_http_method_from_name("get", 3), KILN_HTTP_OTHER);
    assert_int_equal(kiln_http_method_from_name("GETX", 4), KILN_HTTP_OTHER);
    assert_int_equal(kiln_http_method_from_name("PROPFIND", 8), KILN_HTTP_OTHER);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_found),
        cmocka_unit_test(test_not_found_is_exact),
        cmocka_unit_test(test_method_not_allowed_and_allow),
        cmocka_unit_test(test_method_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
