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

static int h(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    (void)ctx, (void)req, (void)out;
    return 200;
}

static const struct kd_route routes[] = {
    {"/v2", KD_HTTP_GET, h, NULL},
    {"/v2/health/live", KD_HTTP_GET, h, NULL},
    {"/v1/jobs", KD_HTTP_GET | KD_HTTP_POST, h, NULL},
};
static const struct kd_router router = {routes, 3};

static enum kd_route_result match(unsigned m, const char *path, size_t *idx)
{
    return kd_router_match(&router, m, path, strlen(path), idx);
}

static void test_found(void **state)
{
    (void)state;
    size_t idx;
    assert_int_equal(match(KD_HTTP_GET, "/v2", &idx), KD_ROUTE_FOUND);
    assert_int_equal(idx, 0);
    assert_int_equal(match(KD_HTTP_GET, "/v2/health/live", &idx), KD_ROUTE_FOUND);
    assert_int_equal(idx, 1);
    assert_int_equal(match(KD_HTTP_POST, "/v1/jobs", &idx), KD_ROUTE_FOUND);
    assert_int_equal(idx, 2);
}

static void test_not_found_is_exact(void **state)
{
    (void)state;
    size_t idx;
    const char *misses[] = {"/", "", "/v", "/v2/", "/v2/health", "/v2/health/live/", "/V2", "/v2x"};
    for (size_t i = 0; i < sizeof misses / sizeof misses[0]; i++) {
        assert_int_equal(match(KD_HTTP_GET, misses[i], &idx), KD_ROUTE_NOT_FOUND);
        assert_int_equal(idx, router.count);
    }
    /* A path with an embedded NUL must not match its prefix. */
    assert_int_equal(kd_router_match(&router, KD_HTTP_GET, "/v2\0x", 5, &idx), KD_ROUTE_NOT_FOUND);
}

static void test_method_not_allowed_and_allow(void **state)
{
    (void)state;
    size_t idx;
    char allow[64];
    assert_int_equal(match(KD_HTTP_POST, "/v2", &idx), KD_ROUTE_METHOD_NOT_ALLOWED);
    kd_router_allow(&router, idx, "/v2", 3, allow, sizeof allow);
    assert_string_equal(allow, "GET, HEAD");
    assert_int_equal(match(KD_HTTP_DELETE, "/v1/jobs", &idx), KD_ROUTE_METHOD_NOT_ALLOWED);
    kd_router_allow(&router, idx, "/v1/jobs", 8, allow, sizeof allow);
    assert_string_equal(allow, "GET, HEAD, POST");
    assert_int_equal(match(KD_HTTP_OTHER, "/v2", &idx), KD_ROUTE_METHOD_NOT_ALLOWED);
    kd_router_allow(&router, router.count, "/x", 2, allow, sizeof allow);
    assert_string_equal(allow, "");
}

/* A prefix route with methods_at: each path under it has its own methods and Allow list; a
 * shape methods_at does not know falls back to the route's methods. */
static unsigned items_methods(const char *rest, size_t len)
{
    if (len > 4 && memcmp(rest + len - 4, "/run", 4) == 0)
        return KD_HTTP_POST;
    return memchr(rest, '/', len) ? 0 : KD_HTTP_GET | KD_HTTP_DELETE;
}

static const struct kd_route prefix_routes[] = {
    {"/items/*", KD_HTTP_GET | KD_HTTP_POST | KD_HTTP_DELETE, h, items_methods},
};
static const struct kd_router prefix_router = {prefix_routes, 1};

static void test_methods_at(void **state)
{
    (void)state;
    size_t idx;
    char allow[64];
    struct {
        unsigned method;
        const char *path;
        enum kd_route_result want;
        const char *allow;
    } cases[] = {
        {KD_HTTP_GET, "/items/a", KD_ROUTE_FOUND, "GET, HEAD, DELETE"},
        {KD_HTTP_HEAD, "/items/a", KD_ROUTE_FOUND, "GET, HEAD, DELETE"},
        {KD_HTTP_POST, "/items/a", KD_ROUTE_METHOD_NOT_ALLOWED, "GET, HEAD, DELETE"},
        {KD_HTTP_POST, "/items/a/run", KD_ROUTE_FOUND, "POST"},
        {KD_HTTP_GET, "/items/a/run", KD_ROUTE_METHOD_NOT_ALLOWED, "POST"},
        {KD_HTTP_HEAD, "/items/a/run", KD_ROUTE_METHOD_NOT_ALLOWED, "POST"},
        {KD_HTTP_POST, "/items/a/b", KD_ROUTE_FOUND, "GET, HEAD, POST, DELETE"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = strlen(cases[i].path);
        assert_int_equal(kd_router_match(&prefix_router, cases[i].method, cases[i].path, n, &idx), cases[i].want);
        kd_router_allow(&prefix_router, idx, cases[i].path, n, allow, sizeof allow);
        assert_string_equal(allow, cases[i].allow);
    }
}

/* HEAD goes wherever GET goes, though no table lists it, and nowhere else. */
static void test_head_with_get(void **state)
{
    (void)state;
    size_t idx;
    assert_int_equal(match(KD_HTTP_HEAD, "/v2", &idx), KD_ROUTE_FOUND);
    assert_int_equal(idx, 0);
    assert_int_equal(match(KD_HTTP_HEAD, "/v1/jobs", &idx), KD_ROUTE_FOUND);
    assert_int_equal(match(KD_HTTP_HEAD, "/nope", &idx), KD_ROUTE_NOT_FOUND);
    static const struct kd_route post_only[] = {{"/post", KD_HTTP_POST, h, NULL}};
    const struct kd_router r = {post_only, 1};
    assert_int_equal(kd_router_match(&r, KD_HTTP_HEAD, "/post", 5, &idx), KD_ROUTE_METHOD_NOT_ALLOWED);
    assert_int_equal(kd_router_methods(&r, 0, "/post", 5), KD_HTTP_POST);
    assert_int_equal(kd_http_method_from_name("HEAD", 4), KD_HTTP_HEAD);
}

static void test_method_names(void **state)
{
    (void)state;
    assert_int_equal(kd_http_method_from_name("GET", 3), KD_HTTP_GET);
    assert_int_equal(kd_http_method_from_name("DELETE", 6), KD_HTTP_DELETE);
    assert_int_equal(kd_http_method_from_name("get", 3), KD_HTTP_OTHER);
    assert_int_equal(kd_http_method_from_name("GETX", 4), KD_HTTP_OTHER);
    assert_int_equal(kd_http_method_from_name("PROPFIND", 8), KD_HTTP_OTHER);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_found),
        cmocka_unit_test(test_not_found_is_exact),
        cmocka_unit_test(test_method_not_allowed_and_allow),
        cmocka_unit_test(test_methods_at),
        cmocka_unit_test(test_head_with_get),
        cmocka_unit_test(test_method_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
