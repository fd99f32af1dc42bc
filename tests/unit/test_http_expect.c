/*
 * tests/unit/test_http_expect.c — the HTTP connection logic around a request's life that the
 * socket does not show: Expect (RFC 9110 10.1.1: the interim 100 Continue before the body, 413
 * without it, 417 for an expectation kilnd cannot meet, HTTP/1.0 ignored) and the access log of
 * a response that a handler finished later (an inference answered by a worker).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "http-conn.h"
#include "responses.h"

#define CONTINUE "HTTP/1.1 100 Continue\r\n\r\n"

static struct kd_http_pending *later;

/* Answers 200 with the number of body bytes it got. */
static int echo_handler(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    (void)ctx;
    char text[32];
    int n = snprintf(text, sizeof text, "%zu", req->body_len);
    return kd_resp_append(out, 200, "text/plain", text, (size_t)n, req->keep_alive, NULL);
}

static int later_handler(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    (void)ctx, (void)out;
    later = kd_http_defer(req);
    return KD_HTTP_DEFERRED;
}

struct fixture {
    struct kd_http_service svc;
    struct kd_http_conn conn;
    int observed, logged;
    struct kd_http_access last; /* the strings are copied into the fields below */
    char method[16], target[64], request_id[64];
};

static void observe(void *ctx, size_t route, int status, uint64_t ns)
{
    (void)route, (void)status, (void)ns;
    ((struct fixture *)ctx)->observed++;
}

static void access_log(void *ctx, const struct kd_http_access *a)
{
    struct fixture *f = ctx;
    f->logged++;
    f->last = *a;
    snprintf(f->method, sizeof f->method, "%s", a->method);
    snprintf(f->target, sizeof f->target, "%.*s", (int)a->target_len, a->target);
    snprintf(f->request_id, sizeof f->request_id, "%s", a->request_id);
}

static const struct kd_route routes[] = {
    {"/echo", KD_HTTP_POST, echo_handler, NULL},
    {"/later", KD_HTTP_POST, later_handler, NULL},
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    f->svc = (struct kd_http_service){
        .router = {routes, 2},
        .max_header_bytes = 1024,
        .max_body_bytes = 100,
        .observe = observe,
        .observe_ctx = f,
        .access = access_log,
        .access_ctx = f,
        .pid = 7,
    };
    kd_http_conn_init(&f->conn, &f->svc);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    kd_http_conn_free(&f->conn);
    free(f);
    return 0;
}

static void feed(struct fixture *f, const char *s)
{
    kd_http_conn_feed(&f->conn, s, strlen(s));
}

/* The out buffer as a NUL-terminated string, consumed. */
static char *take(struct fixture *f)
{
    static char copy[4096];
    struct kd_buf *out = &f->conn.out;
    assert_true(out->len < sizeof copy);
    if (out->len)
        memcpy(copy, out->data, out->len);
    copy[out->len] = '\0';
    out->len = 0;
    return copy;
}

static void expect_status(const char *resp, int status)
{
    char line[32];
    snprintf(line, sizeof line, "HTTP/1.1 %d ", status);
    if (strncmp(resp, line, strlen(line)) != 0)
        fail_msg("expected %d, got: %.80s", status, resp);
}

static const char *body_of(const char *resp)
{
    const char *b = strstr(resp, "\r\n\r\n");
    return b ? b + 4 : "";
}

/* The 100 goes out once the header block is in, before any body byte; the answer after the body. */
static void test_continue_before_body(void **state)
{
    struct fixture *f = *state;
    feed(f, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n");
    assert_string_equal(take(f), CONTINUE);
    assert_int_equal(f->observed, 0); /* an interim answer is not the request's response */
    feed(f, "hello");
    char *r = take(f);
    expect_status(r, 200);
    assert_string_equal(body_of(r), "5");
    assert_false(f->conn.closing);
    /* the expectation is the request's own: the next one on the connection gets no 100 */
    feed(f, "POST /echo HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi");
    r = take(f);
    expect_status(r, 200);
    assert_string_equal(body_of(r), "2");
}

/* The value is a case-insensitive token, possibly a list with empty members, across field lines. */
static void test_continue_spellings(void **state)
{
    struct fixture *f = *state;
    feed(f, "POST /echo HTTP/1.1\r\nExpect: 100-Continue \r\nTransfer-Encoding: chunked\r\n\r\n");
    assert_string_equal(take(f), CONTINUE);
    feed(f, "3\r\nabc\r\n0\r\n\r\n");
    char *r = take(f);
    expect_status(r, 200);
    assert_string_equal(body_of(r), "3");
    feed(f, "POST /echo HTTP/1.1\r\nExpect: ,100-continue,\r\nExpect: \r\nContent-Length: 1\r\n\r\n");
    assert_string_equal(take(f), CONTINUE);
    feed(f, "x");
    expect_status(take(f), 200);
}

/* No body to come: nothing to wait for, so no 100 (the framing says there is no content). */
static void test_no_body_no_continue(void **state)
{
    struct fixture *f = *state;
    feed(f, "POST /echo HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n");
    char *r = take(f);
    expect_status(r, 200);
    assert_string_equal(body_of(r), "0");
    feed(f, "POST /echo HTTP/1.1\r\nExpect: 100-continue\r\n\r\n");
    expect_status(take(f), 200);
}

/* A declared body over the limit: 413 at once, without the 100, and the connection closes. */
static void test_too_large_refused_without_continue(void **state)
{
    struct fixture *f = *state;
    feed(f, "POST /echo HTTP/1.1\r\nContent-Length: 101\r\nExpect: 100-continue\r\n\r\n");
    char *r = take(f);
    expect_status(r, 413);
    assert_null(strstr(r, "100 Continue"));
    assert_non_null(strstr(r, "{\"error\":\"request body exceeds limits.max_body_bytes (100 bytes): send less, or "
                              "raise the setting\"}"));
    assert_true(f->conn.closing);
    assert_int_equal(f->observed, 1);
    assert_int_equal(f->logged, 1);
}

/* A Content-Encoding kilnd cannot decode is refused before the 100 too. */
static void test_bad_encoding_refused_without_continue(void **state)
{
    struct fixture *f = *state;
    feed(f, "POST /echo HTTP/1.1\r\nContent-Length: 5\r\nContent-Encoding: br\r\nExpect: 100-continue\r\n\r\n");
    char *r = take(f);
    expect_status(r, 415);
    assert_null(strstr(r, "100 Continue"));
    assert_true(f->conn.closing);
}

/* Any other expectation cannot be met: 417, with a JSON error, and the connection closes. */
static void test_other_expectation_is_417(void **state)
{
    static const char *const values[] = {"102-processing", "100-continue, foo", "100-continuex",
                                         "a-very-long-expectation-that-no-server-knows-anything-about-at-all"};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        struct fixture *f = *state;
        kd_http_conn_free(&f->conn);
        kd_http_conn_init(&f->conn, &f->svc);
        char req[256];
        snprintf(req, sizeof req, "POST /echo HTTP/1.1\r\nContent-Length: 5\r\nExpect: %s\r\n\r\nhello",
                 values[i]);
        feed(f, req);
        char *r = take(f);
        expect_status(r, 417);
        assert_null(strstr(r, "100 Continue"));
        assert_non_null(strstr(r, "{\"error\":\"this server meets no expectation but Expect: 100-continue\"}"));
        assert_true(f->conn.closing);
    }
}

/* RFC 9110: a server ignores a 100-continue expectation in an HTTP/1.0 request. */
static void test_http10_ignored(void **state)
{
    struct fixture *f = *state;
    feed(f, "POST /echo HTTP/1.0\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n");
    assert_int_equal(f->conn.out.len, 0);
    feed(f, "hello");
    char *r = take(f);
    assert_non_null(strstr(r, " 200 "));
    assert_string_equal(body_of(r), "5");
}

/* A response finished after its handler returned is counted and logged, once, with the request's
 * method, target, request id and body size. */
static void test_deferred_response_logged(void **state)
{
    struct fixture *f = *state;
    feed(f, "POST /later?x=1 HTTP/1.1\r\nX-Request-Id: abc-1\r\nContent-Length: 4\r\n\r\nbody");
    assert_non_null(later);
    assert_int_equal(f->observed, 0);
    assert_int_equal(f->logged, 0);
    struct kd_http_pending *p = later;
    later = NULL;
    kd_http_pending_finish(p, kd_resp_append(kd_http_pending_out(p), 201, "text/plain", "ok", 2, true, NULL));
    expect_status(take(f), 201);
    assert_int_equal(f->observed, 1);
    assert_int_equal(f->logged, 1);
    assert_int_equal(f->last.status, 201);
    assert_string_equal(f->method, "POST");
    assert_string_equal(f->target, "/later?x=1");
    assert_string_equal(f->request_id, "abc-1");
    assert_int_equal(f->last.bytes_in, 4);
    /* without a usable id, the one generated for the request is logged */
    feed(f, "POST /later HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
    p = later;
    later = NULL;
    assert_non_null(p);
    kd_http_pending_finish(p, kd_resp_error(kd_http_pending_out(p), 503, "busy", true, NULL));
    expect_status(take(f), 503);
    assert_int_equal(f->logged, 2);
    assert_int_equal(f->last.status, 503);
    assert_string_equal(f->request_id, "kiln-7-0-2");
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_continue_before_body),
        T(test_continue_spellings),
        T(test_no_body_no_continue),
        T(test_too_large_refused_without_continue),
        T(test_bad_encoding_refused_without_continue),
        T(test_other_expectation_is_417),
        T(test_http10_ignored),
        T(test_deferred_response_logged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
