/*
 * tests/unit/test_auth.c — the bearer-token rules (api/auth.c) that serving, training jobs and
 * the remote tensor endpoint share: token parsing, scopes, the 401/403 answers, the secret
 * comparison, and when kilnd may listen without tokens.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "auth.h"

static struct kd_auth *make(const char *const *items, size_t n)
{
    struct kd_strlist l = {(char **)items, n};
    char err[128] = "";
    struct kd_auth *a = kd_auth_new(&l, err, sizeof err);
    assert_non_null(a);
    assert_string_equal(err, "");
    return a;
}

/* Runs kd_auth_require with the given Authorization value; returns the status and keeps the response. */
static int ask(const struct kd_auth *a, const char *authorization, enum kd_auth_scope need, char *resp, size_t cap)
{
    struct kd_http_headers h;
    memset(&h, 0, sizeof h);
    h.authorization = authorization; /* kept whole by the connection: a pointer to its value */
    struct kd_request req = {
        .method = KD_HTTP_GET, .path = "/x", .path_len = 2, .keep_alive = true, .headers = &h};
    struct kd_buf out = {0};
    int st = kd_auth_require(a, &req, need, "needs admin", &out);
    snprintf(resp, cap, "%.*s", (int)out.len, out.data ? out.data : "");
    if (st == 0)
        assert_int_equal(out.len, 0); /* allowed: nothing is answered */
    kd_buf_free(&out);
    return st;
}

static void test_no_tokens_allows_everything(void **state)
{
    (void)state;
    struct kd_auth *a = make(NULL, 0);
    char r[1024];
    assert_false(kd_auth_enabled(a));
    assert_int_equal(ask(a, "", KD_AUTH_ADMIN, r, sizeof r), 0);
    assert_int_equal(ask(a, "Basic Zm9v", KD_AUTH_ADMIN, r, sizeof r), 0);
    assert_null(kd_auth_admin_secret(a));
    kd_auth_free(a);
}

static void test_missing_and_wrong_scheme(void **state)
{
    (void)state;
    struct kd_auth *a = make((const char *const[]){"admin:adm1n", "read:r3ad"}, 2);
    char r[1024];
    const char *cases[] = {"", "Basic YWRtMW4=", "adm1n", "Bearer", "Token adm1n"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(ask(a, cases[i], KD_AUTH_READ, r, sizeof r), 401);
        assert_non_null(strstr(r, "WWW-Authenticate: Bearer\r\n"));
        assert_non_null(strstr(r, "{\"error\":\"a bearer token is required\"}"));
    }
    kd_auth_free(a);
}

static void test_scopes(void **state)
{
    (void)state;
    struct kd_auth *a = make((const char *const[]){"admin:adm1n", "read:r3ad", "plain"}, 3);
    char r[1024];
    assert_true(kd_auth_enabled(a));
    assert_string_equal(kd_auth_admin_secret(a), "adm1n");
    /* read: the read, bare and admin tokens; the scheme name in any case */
    assert_int_equal(ask(a, "Bearer r3ad", KD_AUTH_READ, r, sizeof r), 0);
    assert_int_equal(ask(a, "bearer plain", KD_AUTH_READ, r, sizeof r), 0);
    assert_int_equal(ask(a, "BEARER adm1n", KD_AUTH_READ, r, sizeof r), 0);
    /* admin: only the admin token; the others are known (403), not invalid (401) */
    assert_int_equal(ask(a, "Bearer adm1n", KD_AUTH_ADMIN, r, sizeof r), 0);
    assert_int_equal(ask(a, "Bearer r3ad", KD_AUTH_ADMIN, r, sizeof r), 403);
    assert_non_null(strstr(r, "{\"error\":\"needs admin\"}"));
    assert_non_null(strstr(r, "error=\"insufficient_scope\""));
    assert_int_equal(ask(a, "Bearer plain", KD_AUTH_ADMIN, r, sizeof r), 403);
    /* the prefixes name scopes; they are not part of the secret */
    const char *bad[] = {"Bearer admin:adm1n", "Bearer read:r3ad", "Bearer wrong",
                         "Bearer adm1",        "Bearer adm1nx",    "Bearer ",
                         "Bearer  \t",         "Bearer r3ad x",    "Bearer r3a d"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(ask(a, bad[i], KD_AUTH_READ, r, sizeof r), 401);
        assert_non_null(strstr(r, "WWW-Authenticate: Bearer error=\"invalid_token\"\r\n"));
    }
    /* RFC 9110 5.5: whitespace after a field value is not part of it (the parser leaves it in) */
    assert_int_equal(ask(a, "Bearer r3ad ", KD_AUTH_READ, r, sizeof r), 0);
    assert_int_equal(ask(a, "Bearer adm1n \t ", KD_AUTH_ADMIN, r, sizeof r), 0);
    assert_int_equal(ask(a, "Bearer r3ad\t", KD_AUTH_ADMIN, r, sizeof r), 403);
    assert_int_equal(kd_auth_scope_of(a, "Bearer adm1n"), KD_AUTH_ADMIN);
    assert_int_equal(kd_auth_scope_of(a, "Bearer plain"), KD_AUTH_READ);
    assert_int_equal(kd_auth_scope_of(a, "Bearer nope"), KD_AUTH_NONE);
    assert_int_equal(kd_auth_scope_of(a, NULL), KD_AUTH_NONE);
    kd_auth_free(a);
}

/* The same secret listed under both scopes grants the higher one, whatever the order. */
static void test_highest_scope_wins(void **state)
{
    (void)state;
    struct kd_auth *a = make((const char *const[]){"read:same", "admin:same"}, 2);
    assert_int_equal(kd_auth_scope_of(a, "Bearer same"), KD_AUTH_ADMIN);
    kd_auth_free(a);
}

static void test_empty_secret_refused(void **state)
{
    (void)state;
    const char *const cases[][2] = {{"admin:", "ok"}, {"ok", "read:"}, {"", "ok"}};
    for (size_t i = 0; i < 3; i++) {
        struct kd_strlist l = {(char **)cases[i], 2};
        char err[128] = "";
        assert_null(kd_auth_new(&l, err, sizeof err));
        assert_non_null(strstr(err, "has an empty token"));
    }
}

static void test_same_secret(void **state)
{
    (void)state;
    assert_true(kd_auth_same_secret("abc", "abc"));
    assert_true(kd_auth_same_secret("", ""));
    assert_false(kd_auth_same_secret("abc", "abd"));
    assert_false(kd_auth_same_secret("abc", "abcd"));
    assert_false(kd_auth_same_secret("abcd", "abc"));
    assert_false(kd_auth_same_secret("", "abc"));
    assert_false(kd_auth_same_secret("abc", ""));
    /* a repeated shorter secret is not a match */
    assert_false(kd_auth_same_secret("abab", "ab"));
    /* a difference in the first byte and in the last are both found */
    assert_false(kd_auth_same_secret("xbcdefgh", "abcdefgh"));
    assert_false(kd_auth_same_secret("abcdefgx", "abcdefgh"));
}

static void test_listen_rules(void **state)
{
    (void)state;
    const char *loop[] = {"127.0.0.1", "127.1.2.3", "::1", "localhost", "::ffff:127.0.0.1", "0:0:0:0:0:0:0:1"};
    for (size_t i = 0; i < sizeof loop / sizeof loop[0]; i++) {
        assert_true(kd_auth_host_is_loopback(loop[i]));
        assert_true(kd_auth_listen_allowed(loop[i], 0));
    }
    const char *open[] = {"0.0.0.0", "::", "10.0.0.1", "192.168.1.1", "127.evil.example", "localhost.example",
                          "::ffff:10.0.0.1", "", "1.127.0.0"};
    for (size_t i = 0; i < sizeof open / sizeof open[0]; i++) {
        assert_false(kd_auth_host_is_loopback(open[i]));
        assert_false(kd_auth_listen_allowed(open[i], 0));
        assert_true(kd_auth_listen_allowed(open[i], 1)); /* with a token, anywhere */
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_tokens_allows_everything),
        cmocka_unit_test(test_missing_and_wrong_scheme),
        cmocka_unit_test(test_scopes),
        cmocka_unit_test(test_highest_scope_wins),
        cmocka_unit_test(test_empty_secret_refused),
        cmocka_unit_test(test_same_secret),
        cmocka_unit_test(test_listen_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
