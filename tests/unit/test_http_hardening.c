/*
 * tests/unit/test_http_hardening.c — the connection's defences against malformed and hostile requests, driven
 * without a socket: chunk data not followed by CRLF (request smuggling, a hang until the request
 * timeout), header fields kilnd reads kept whole up to max_header_bytes (no 431 below it), a
 * request still arriving when the drain starts (503 once the drain's grace for it ends), transfer codings other than chunked
 * (501), and percent-encoded path segments (decoded once; %2F and %00 refused). Each test fails
 * on the code before its fix.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "http-conn-util.h"
#include "http-conn.h"
#include "responses.h"

/* What the handler saw of the last request it was given. */
struct seen {
    int calls;
    char path[256];
    size_t auth_len, ctype_len, conn_len, ae_len;
    char request_id[KD_HTTP_SHORT_HEADER_MAX];
    char body[64];
};
static struct seen seen;

static int record(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    (void)ctx;
    seen.calls++;
    snprintf(seen.path, sizeof seen.path, "%.*s", (int)req->path_len, req->path);
    seen.auth_len = strlen(req->headers->authorization);
    seen.ctype_len = strlen(req->headers->content_type);
    seen.conn_len = strlen(req->headers->connection);
    seen.ae_len = strlen(req->headers->accept_encoding);
    snprintf(seen.request_id, sizeof seen.request_id, "%s", req->headers->request_id);
    snprintf(seen.body, sizeof seen.body, "%.*s", (int)req->body_len, req->body ? req->body : "");
    return kd_resp_append(out, 200, "text/plain", "ok", 2, req->keep_alive, NULL);
}

static const struct kd_route routes[] = {
    {"/v2/health/live", KD_HTTP_GET, record, NULL},
    {"/in", KD_HTTP_POST, record, NULL},
    {"/v2/models/*", KD_HTTP_GET | KD_HTTP_POST, record, NULL},
};

struct fixture {
    struct kd_http_service svc;
    struct kd_http_conn conn;
    char logged_id[KD_HTTP_SHORT_HEADER_MAX];
};

static void access_log(void *ctx, const struct kd_http_access *a)
{
    struct fixture *f = ctx;
    snprintf(f->logged_id, sizeof f->logged_id, "%s", a->request_id);
}

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    f->svc = (struct kd_http_service){
        .router = {routes, sizeof routes / sizeof routes[0]},
        .max_header_bytes = 8192,
        .max_body_bytes = 1000,
        .access = access_log,
        .access_ctx = f,
        .pid = 7,
    };
    kd_http_conn_init(&f->conn, &f->svc);
    memset(&seen, 0, sizeof seen);
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

static void reset(struct fixture *f)
{
    kd_http_conn_free(&f->conn);
    kd_http_conn_init(&f->conn, &f->svc);
    memset(&seen, 0, sizeof seen);
}

static void feed(struct fixture *f, const char *s)
{
    conn_feed(&f->conn, s);
}

static char *take(struct fixture *f)
{
    return conn_take(&f->conn);
}

static char *repeat(char ch, size_t n)
{
    char *s = malloc(n + 1);
    memset(s, ch, n);
    s[n] = '\0';
    return s;
}

/* ---- 1: chunk data must be followed by CRLF ------------------------------------------------ */

static void test_chunk_overrun_smuggles_nothing(void **state)
{
    struct fixture *f = *state;
    /* "XX" stood in for the CRLF after "{}", and the request after the body was answered too */
    feed(f, "POST /in HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n"
            "GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n");
    char *r = take(f);
    expect_json_error(r, 400);
    assert_int_equal(count(r, "HTTP/1.1 "), 1);
    assert_int_equal(seen.calls, 0);
    assert_true(f->conn.closing);
}

static void test_chunk_longer_than_size_is_400_at_once(void **state)
{
    struct fixture *f = *state;
    feed(f, "POST /in HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcdef\r\n0\r\n\r\n");
    expect_json_error(take(f), 400); /* was: nothing, until the request timeout */
    assert_true(f->conn.closing);
    reset(f);
    feed(f, "POST /in HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY");
    expect_json_error(take(f), 400);
    assert_true(f->conn.closing);
}

/* Strict parsing still takes every valid form: extensions, trailers, 1.0, pipelining, 100-continue. */
static void test_strict_parser_takes_valid_requests(void **state)
{
    struct fixture *f = *state;
    feed(f, "POST /in HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2;ext=1\r\n{}\r\n1;q=\"a b\"\r\n!\r\n"
            "0\r\nX-Trailer: 1\r\nAuthorization: Bearer late\r\n\r\n"
            "GET /v2/health/live HTTP/1.1\r\n\r\nGET /v2/health/live HTTP/1.1\r\n\r\n");
    char *r = take(f);
    assert_int_equal(count(r, "HTTP/1.1 200 "), 3);
    assert_int_equal(seen.calls, 3);
    assert_false(f->conn.closing);
    reset(f);
    feed(f,
         "POST /in HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n2\r\n{}\r\n0\r\nAuthorization: Bearer x\r\n\r\n");
    assert_int_equal(count(take(f), "HTTP/1.1 200 "), 1);
    assert_string_equal(seen.body, "{}");
    assert_int_equal(seen.auth_len, 0); /* a trailer field never stands in for a header field */
    reset(f);
    feed(f, "POST /in HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n");
    assert_string_equal(take(f), "HTTP/1.1 100 Continue\r\n\r\n");
    feed(f, "{}");
    assert_int_equal(count(take(f), "HTTP/1.1 200 "), 1);
    reset(f);
    feed(f, "GET /v2/health/live HTTP/1.0\r\n\r\n");
    char *r10 = take(f);
    assert_int_equal(count(r10, " 200 "), 1);
    assert_true(f->conn.closing);
}

/* ---- 2: kept fields up to max_header_bytes --------------------------------------------------- */

static void test_long_kept_fields_are_kept_whole(void **state)
{
    struct fixture *f = *state;
    char *auth = repeat('t', 3000), *ctype = repeat('c', 300), *conn = repeat('k', 300), *ae = repeat('g', 600);
    char req[8192];
    snprintf(req, sizeof req,
             "GET /v2/health/live HTTP/1.1\r\nAuthorization: Bearer %s\r\nContent-Type: application/json; x=%s\r\n"
             "Connection: keep-alive, %s\r\nAccept-Encoding: gzip;q=1, %s\r\n\r\n",
             auth, ctype, conn, ae);
    feed(f, req);
    char *r = take(f);
    if (strncmp(r, "HTTP/1.1 200 ", 13) != 0)
        fail_msg("expected 200, got: %.120s", r);
    assert_int_equal(seen.auth_len, 7 + 3000);
    assert_int_equal(seen.ctype_len, strlen("application/json; x=") + 300);
    assert_int_equal(seen.conn_len, strlen("keep-alive, ") + 300);
    assert_int_equal(seen.ae_len, strlen("gzip;q=1, ") + 600);
    /* a field on two lines is one list */
    feed(f, "GET /v2/health/live HTTP/1.1\r\nConnection: keep-alive\r\nConnection: x\r\n\r\n");
    take(f);
    assert_int_equal(seen.conn_len, strlen("keep-alive, x"));
    /* the block's bound still holds, and is the only one */
    char *big = repeat('b', 8200);
    reset(f);
    feed(f, "GET /v2/health/live HTTP/1.1\r\nAuthorization: Bearer ");
    feed(f, big);
    expect_json_error(take(f), 431);
    free(auth), free(ctype), free(conn), free(ae), free(big);
}

static void test_request_id_too_long_is_replaced(void **state)
{
    struct fixture *f = *state;
    char *id128 = repeat('r', KD_HTTP_REQUEST_ID_MAX), *id129 = repeat('r', KD_HTTP_REQUEST_ID_MAX + 1);
    char req[1024];
    snprintf(req, sizeof req, "GET /v2/health/live HTTP/1.1\r\nX-Request-Id: %s\r\n\r\n", id128);
    feed(f, req);
    assert_int_equal(count(take(f), "HTTP/1.1 200 "), 1);
    assert_string_equal(seen.request_id, id128);
    assert_string_equal(f->logged_id, id128);
    snprintf(req, sizeof req, "GET /v2/health/live HTTP/1.1\r\nX-Request-Id: %s\r\n\r\n", id129);
    feed(f, req);
    assert_int_equal(count(take(f), "HTTP/1.1 200 "), 1); /* was 431 */
    assert_string_equal(seen.request_id, "kiln-7-0-2");
    assert_string_equal(f->logged_id, "kiln-7-0-2");
    free(id128), free(id129);
}

static void test_long_fixed_shape_fields_get_their_own_errors(void **state)
{
    struct fixture *f = *state;
    char *v = repeat('9', 40);
    char req[512];
    snprintf(req, sizeof req,
             "POST /in HTTP/1.1\r\nInference-Header-Content-Length: %s\r\nContent-Length: 0\r\n\r\n", v);
    feed(f, req);
    expect_json_error(take(f), 400);
    reset(f);
    snprintf(req, sizeof req, "POST /in HTTP/1.1\r\nContent-Encoding: gzip%s\r\nContent-Length: 0\r\n\r\n", v);
    feed(f, req);
    expect_json_error(take(f), 415);
    free(v);
}

/* ---- 3: the drain answers a request still arriving once its grace is over ---------------------- */

static void test_drain_answers_partial_requests(void **state)
{
    struct fixture *f = *state;
    feed(f, "GET /v2/health/live HTTP/1.1\r\nHost: x\r\n"); /* mid-header */
    kd_http_conn_drain(&f->conn);
    assert_string_equal(take(f), ""); /* it may still finish arriving */
    kd_http_conn_drain_cut(&f->conn); /* the server's grace is over */
    char *r = take(f);
    expect_json_error(r, 503);
    assert_non_null(strstr(r, "Connection: close\r\n"));
    assert_true(f->conn.closing);
    reset(f);
    feed(f, "POST /in HTTP/1.1\r\nContent-Length: 100\r\n\r\n{"); /* mid-body */
    kd_http_conn_drain(&f->conn);
    kd_http_conn_drain_cut(&f->conn);
    r = take(f);
    expect_json_error(r, 503);
    assert_non_null(strstr(r, "Connection: close\r\n"));
    assert_true(f->conn.closing);
    assert_int_equal(seen.calls, 0);
    feed(f, "more");
    assert_string_equal(take(f), "");
    reset(f);
    feed(f, "GET /v2/health/live HTTP/1.1\r\n\r\n"); /* answered, then idle */
    take(f);
    kd_http_conn_drain(&f->conn);
    assert_string_equal(take(f), "");
    assert_true(f->conn.closing);
}

/* ---- 4: transfer codings other than chunked ---------------------------------------------------- */

static void test_unknown_transfer_coding_is_501(void **state)
{
    struct fixture *f = *state;
    feed(f, "POST /in HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n");
    char *r = take(f);
    expect_json_error(r, 501);
    assert_non_null(strstr(r, "gzip"));
    assert_int_equal(seen.calls, 0);
    assert_true(f->conn.closing);
    reset(f);
    feed(f, "POST /in HTTP/1.1\r\nTransfer-Encoding: identity, chunked\r\n\r\n0\r\n\r\n");
    expect_json_error(take(f), 501);
    reset(f);
    feed(f, "POST /in HTTP/1.1\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
    expect_json_error(take(f), 501);
    reset(f);
    feed(f, "POST /in HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n");
    expect_json_error(take(f), 400);
}

/* ---- 5: percent-encoded paths -------------------------------------------------------------------- */

static void test_path_is_percent_decoded_once(void **state)
{
    struct fixture *f = *state;
    feed(f, "GET /v2/models/c%6en/ready?x=%41 HTTP/1.1\r\n\r\n");
    assert_int_equal(count(take(f), "HTTP/1.1 200 "), 1);
    assert_string_equal(seen.path, "/v2/models/cnn/ready");
    feed(f, "GET /v2/health/%6c%69%76%65 HTTP/1.1\r\n\r\n"); /* routes match the decoded path */
    assert_int_equal(count(take(f), "HTTP/1.1 200 "), 1);
    feed(f, "GET /v2/models/%252F HTTP/1.1\r\n\r\n"); /* once only */
    assert_int_equal(count(take(f), "HTTP/1.1 200 "), 1);
    assert_string_equal(seen.path, "/v2/models/%2F");
    feed(f, "GET /v2/models/%2e%2e HTTP/1.1\r\n\r\n"); /* a name check sees ".." and refuses it */
    take(f);
    assert_string_equal(seen.path, "/v2/models/..");
    assert_false(f->conn.closing);
}

static void test_path_encodings_refused(void **state)
{
    struct fixture *f = *state;
    static const char *const bad[] = {"/v2/models/%2e%2e%2fx", "/v2/models/a%2Fb", "/v2/models/a%00",
                                      "/v2/models/%zz",        "/v2/models/a%4",   "/v2/models/a%"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char req[128];
        snprintf(req, sizeof req, "GET %s HTTP/1.1\r\n\r\n", bad[i]);
        feed(f, req);
        expect_json_error(take(f), 400);
        assert_false(f->conn.closing); /* a well-framed request: the connection goes on */
    }
    assert_int_equal(seen.calls, 0);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_chunk_overrun_smuggles_nothing),     T(test_chunk_longer_than_size_is_400_at_once),
        T(test_strict_parser_takes_valid_requests), T(test_long_kept_fields_are_kept_whole),
        T(test_request_id_too_long_is_replaced),    T(test_long_fixed_shape_fields_get_their_own_errors),
        T(test_drain_answers_partial_requests),     T(test_unknown_transfer_coding_is_501),
        T(test_path_is_percent_decoded_once),       T(test_path_encodings_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
