/*
 * tests/unit/test_http_conn.c — the HTTP connection logic driven directly, without a socket:
 * keep-alive, pipelining, chunked bodies, size limits (431/413), malformed input (400), unknown
 * routes and methods (404/405), timeouts (408), drain, random bytes that must never crash, and
 * the body of a deferred request outliving its connection.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "endpoints.h"
#include "http-conn-util.h"
#include "http-conn.h"
#include "responses.h"

struct fixture {
    struct kd_metrics *metrics;
    struct kd_api api;
    struct kd_http_service svc;
    struct kd_http_conn conn;
    int observed[600];
};

static void observe(void *ctx, size_t route, int status, uint64_t ns)
{
    (void)route, (void)ns;
    struct fixture *f = ctx;
    if (status >= 0 && status < 600)
        f->observed[status]++;
}

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    f->metrics = kd_metrics_new();
    assert_int_equal(kd_api_init(&f->api, f->metrics, (const char *const[]){"model_repository", NULL}), 0);
    f->svc = (struct kd_http_service){
        .router = f->api.router,
        .ctx = &f->api,
        .max_header_bytes = 1024,
        .max_body_bytes = 100,
        .observe = observe,
        .observe_ctx = f,
    };
    kd_http_conn_init(&f->conn, &f->svc);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    kd_http_conn_free(&f->conn);
    kd_api_free(&f->api);
    kd_metrics_free(f->metrics);
    free(f);
    return 0;
}

static void feed(struct fixture *f, const char *s)
{
    conn_feed(&f->conn, s);
}

static char *take(struct fixture *f)
{
    return conn_take(&f->conn);
}

static void test_keep_alive(void **state)
{
    struct fixture *f = *state;
    feed(f, "GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n");
    char *r = take(f);
    expect_status(r, 200);
    assert_non_null(strstr(r, "Content-Length: 0\r\n"));
    assert_non_null(strstr(r, "Connection: keep-alive\r\n"));
    assert_false(f->conn.closing);
    feed(f, "GET /v2 HTTP/1.1\r\n\r\n");
    r = take(f);
    expect_status(r, 200);
    assert_non_null(strstr(r, "{\"name\":\"kiln\",\"version\":\"" KILN_VERSION "\",\"extensions\":[\"model_repository\"]}"));
    assert_false(f->conn.closing);
    assert_int_equal(f->observed[200], 2);
}

/* RFC 9112 section 3.2.2: a server accepts the absolute form and routes its path (and query). */
static void test_absolute_form(void **state)
{
    struct fixture *f = *state;
    feed(f, "GET http://localhost:8000/v2 HTTP/1.1\r\nHost: localhost:8000\r\n\r\n");
    char *r = take(f);
    expect_status(r, 200);
    assert_non_null(strstr(r, "\"name\":\"kiln\""));
    feed(f, "GET HTTP://example.com/v2/health/live?verbose=1 HTTP/1.1\r\nHost: example.com\r\n\r\n");
    expect_status(take(f), 200);
    /* no path at all is "/", which kilnd does not serve: a 404 naming "/" */
    feed(f, "GET http://example.com?x=1 HTTP/1.1\r\nHost: example.com\r\n\r\n");
    r = take(f);
    expect_json_error(r, 404);
    assert_non_null(strstr(r, "no route for /\""));
    feed(f, "GET http://example.com/nope HTTP/1.1\r\n\r\n");
    r = take(f);
    expect_json_error(r, 404);
    assert_non_null(strstr(r, "no route for /nope\""));
    assert_false(f->conn.closing);
}

static void test_readiness_follows_state(void **state)
{
    struct fixture *f = *state;
    feed(f, "GET /v2/health/ready HTTP/1.1\r\n\r\n");
    char *r = take(f);
    expect_json_error(r, 503);
    assert_non_null(strstr(r, "starting"));
    assert_int_equal(kd_api_set_ready(&f->api, true, "ready"), 0);
    feed(f, "GET /v2/health/ready HTTP/1.1\r\n\r\n");
    expect_status(take(f), 200);
    assert_int_equal(kd_api_set_ready(&f->api, false, "draining"), 0);
    feed(f, "GET /v2/health/ready HTTP/1.1\r\n\r\n");
    r = take(f);
    expect_json_error(r, 503);
    assert_non_null(strstr(r, "draining"));
}

static void test_pipelined_burst(void **state)
{
    struct fixture *f = *state;
    char burst[100 * 40 + 1] = "";
    for (int i = 0; i < 100; i++)
        strcat(burst, i % 2 ? "GET /v2/health/live HTTP/1.1\r\n\r\n" : "GET /nope HTTP/1.1\r\n\r\n");
    feed(f, burst);
    char *r = take(f);
    assert_int_equal(count(r, "HTTP/1.1 "), 100);
    assert_int_equal(count(r, "HTTP/1.1 200 "), 50);
    assert_int_equal(count(r, "HTTP/1.1 404 "), 50);
    expect_status(r, 404); /* in order: the first request was /nope */
    assert_false(f->conn.closing);
}

static void test_byte_at_a_time(void **state)
{
    struct fixture *f = *state;
    const char *req = "GET /v2/health/live HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n";
    for (size_t i = 0; req[i]; i++) {
        kd_http_conn_feed(&f->conn, &req[i], 1);
        assert_int_equal(f->conn.out.len == 0, req[i + 1] != '\0');
    }
    expect_status(take(f), 200);
}

static void test_chunked_body_accepted(void **state)
{
    struct fixture *f = *state;
    feed(f, "GET /v2/health/live HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
            "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n"
            "GET /v2 HTTP/1.1\r\n\r\n");
    char *r = take(f);
    assert_int_equal(count(r, "HTTP/1.1 200 "), 2);
    assert_int_equal(f->conn.body.len, 0); /* the second request had no body */
    assert_false(f->conn.closing);
}

static void test_body_kept_for_handlers(void **state)
{
    struct fixture *f = *state;
    feed(f, "GET /v2 HTTP/1.1\r\nContent-Length: 5\r\n\r\nab");
    assert_int_equal(f->conn.out.len, 0);
    assert_true(f->conn.in_message);
    feed(f, "cde");
    expect_status(take(f), 200);
    assert_int_equal(f->conn.body.len, 5);
    assert_memory_equal(f->conn.body.data, "abcde", 5);
}

static void test_content_length_over_limit(void **state)
{
    struct fixture *f = *state;
    /* Refused at the headers, before any body byte arrives. */
    feed(f, "GET /v2 HTTP/1.1\r\nContent-Length: 101\r\n\r\n");
    char *r = take(f);
    expect_json_error(r, 413);
    assert_non_null(strstr(r, "Connection: close\r\n"));
    assert_true(f->conn.closing);
    feed(f, "GET /v2 HTTP/1.1\r\n\r\n"); /* nothing more is answered */
    assert_int_equal(f->conn.out.len, 0);
}

static void test_chunked_over_limit(void **state)
{
    struct fixture *f = *state;
    feed(f, "GET /v2 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n40\r\n");
    for (int i = 0; i < 2; i++) /* 64 bytes twice: the second chunk crosses 100 */
        feed(f, "0123456789abcdef0123456789abcdef");
    feed(f, "\r\n40\r\n");
    assert_false(f->conn.closing);
    for (int i = 0; i < 2 && !f->conn.closing; i++)
        feed(f, "0123456789abcdef0123456789abcdef");
    expect_json_error(take(f), 413);
    assert_true(f->conn.closing);
}

static void test_header_over_limit(void **state)
{
    struct fixture *f = *state;
    char big[2048];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    feed(f, "GET /v2 HTTP/1.1\r\nX-Big: ");
    feed(f, big);
    char *r = take(f);
    expect_json_error(r, 431);
    assert_true(f->conn.closing);
}

static void test_header_over_limit_dripped(void **state)
{
    struct fixture *f = *state;
    feed(f, "GET /v2 HTTP/1.1\r\n");
    /* Many small headers add up even though each is tiny. */
    for (int i = 0; i < 200 && !f->conn.closing; i++)
        feed(f, "X-A: b\r\n");
    expect_json_error(take(f), 431);
}

static void test_long_url_is_431(void **state)
{
    struct fixture *f = *state;
    feed(f, "GET /");
    for (int i = 0; i < 100 && !f->conn.closing; i++)
        feed(f, "aaaaaaaaaaaaaaaaaaaa");
    expect_json_error(take(f), 431);
}

static void test_malformed(void **state)
{
    const char *bad[] = {
        "GARBAGE\r\n\r\n",
        "GET / HTTP/9.9\r\n\r\n",
        "GET /v2 HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
        "GET /v2 HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        "GET /v2 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "GET /v2 HTTP/1.1\r\nBad Header\r\n\r\n",
        "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
        "GET /v2\x01 HTTP/1.1\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct fixture *f = *state;
        kd_http_conn_free(&f->conn);
        kd_http_conn_init(&f->conn, &f->svc);
        feed(f, bad[i]);
        char *r = take(f);
        if (strncmp(r, "HTTP/1.1 400 ", 13) != 0)
            fail_msg("case %zu: %.60s", i, r);
        expect_json_error(r, 400);
        assert_true(f->conn.closing);
    }
}

static void test_not_found_and_method(void **state)
{
    struct fixture *f = *state;
    feed(f, "GET /v3?x=\"1\" HTTP/1.1\r\n\r\n");
    char *r = take(f);
    expect_json_error(r, 404);
    assert_non_null(strstr(r, "no route for /v3\"}"));
    assert_false(f->conn.closing);
    feed(f, "DELETE /v2/health/live HTTP/1.1\r\n\r\n");
    r = take(f);
    expect_json_error(r, 405);
    assert_non_null(strstr(r, "\r\nAllow: GET, HEAD\r\n"));
    feed(f, "GET /v2/health/live?verbose=1 HTTP/1.1\r\n\r\n");
    expect_status(take(f), 200);
    assert_false(f->conn.closing);
}

/* A request line with a method the parser does not know is a 405 with the path's Allow list
 * (404 for no such path), not a 400; the connection closes after it. */
static void test_unknown_method(void **state)
{
    struct {
        const char *req;
        int status;
        const char *allow;
    } cases[] = {
        {"QUERY /v2 HTTP/1.1\r\nHost: t\r\n\r\n", 405, "\r\nAllow: GET, HEAD\r\n"},
        {"BREW /coffee?x=1 HTTP/1.1\r\n\r\n", 404, NULL},
        {"GET /v2 HTTP/1.1\r\n\r\nQUERY /v2/health/live HTTP/1.1\r\n\r\n", 405, "\r\nAllow: GET, HEAD\r\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct fixture *f = *state;
        kd_http_conn_free(&f->conn);
        kd_http_conn_init(&f->conn, &f->svc);
        feed(f, cases[i].req);
        char *r = take(f);
        char want[16];
        snprintf(want, sizeof want, "HTTP/1.1 %d ", cases[i].status);
        char *last = strstr(r, want);
        if (!last)
            fail_msg("case %zu: %.80s", i, r);
        expect_json_error(last, cases[i].status);
        if (cases[i].allow)
            assert_non_null(strstr(last, cases[i].allow));
        assert_true(f->conn.closing);
    }
}

/* Every status kilnd answers with has its phrase on the status line ("HTTP/1.1 426 Unknown" once
 * reached clients that print the line): the list is every status kilnd sends, and the other
 * server errors (502, 504, 507) so that a path that starts sending one cannot bring "Unknown" back. */
static void test_reason_phrases(void **state)
{
    (void)state;
    static const struct {
        int status;
        const char *reason;
    } phrases[] = {
        {100, "Continue"},
        {101, "Switching Protocols"},
        {200, "OK"},
        {201, "Created"},
        {202, "Accepted"},
        {204, "No Content"},
        {400, "Bad Request"},
        {401, "Unauthorized"},
        {403, "Forbidden"},
        {404, "Not Found"},
        {405, "Method Not Allowed"},
        {408, "Request Timeout"},
        {409, "Conflict"},
        {411, "Length Required"},
        {413, "Content Too Large"},
        {414, "URI Too Long"},
        {415, "Unsupported Media Type"},
        {417, "Expectation Failed"},
        {422, "Unprocessable Content"},
        {426, "Upgrade Required"},
        {429, "Too Many Requests"},
        {431, "Request Header Fields Too Large"},
        {500, "Internal Server Error"},
        {501, "Not Implemented"},
        {502, "Bad Gateway"},
        {503, "Service Unavailable"},
        {504, "Gateway Timeout"},
        {505, "HTTP Version Not Supported"},
        {507, "Insufficient Storage"},
    };
    for (size_t i = 0; i < sizeof phrases / sizeof phrases[0]; i++) {
        if (strcmp(kd_http_reason(phrases[i].status), phrases[i].reason) != 0)
            fail_msg("%d: \"%s\", expected \"%s\"", phrases[i].status, kd_http_reason(phrases[i].status),
                     phrases[i].reason);
    }
    /* and on the wire, as a refused WebSocket version is answered */
    struct kd_buf out = {0};
    assert_int_equal(kd_resp_error(&out, 426, "unsupported Sec-WebSocket-Version; kilnd speaks 13", true,
                                   "Sec-WebSocket-Version: 13\r\n"),
                     426);
    const char *line = "HTTP/1.1 426 Upgrade Required\r\n";
    assert_true(out.len > strlen(line));
    assert_memory_equal(out.data, line, strlen(line));
    kd_buf_free(&out);
}

static void test_connection_close(void **state)
{
    struct fixture *f = *state;
    feed(f, "GET /v2 HTTP/1.1\r\nConnection: close\r\n\r\nGET /v2 HTTP/1.1\r\n\r\n");
    char *r = take(f);
    assert_int_equal(count(r, "HTTP/1.1 "), 1);
    assert_non_null(strstr(r, "Connection: close\r\n"));
    assert_true(f->conn.closing);
}

static void test_http10(void **state)
{
    struct fixture *f = *state;
    feed(f, "GET /v2/health/live HTTP/1.0\r\n\r\n");
    char *r = take(f);
    expect_status(r, 200);
    assert_non_null(strstr(r, "Connection: close\r\n"));
    assert_true(f->conn.closing);
}

static void test_timeouts(void **state)
{
    struct fixture *f = *state;
    kd_http_conn_timeout(&f->conn); /* idle: no response, just close */
    assert_int_equal(f->conn.out.len, 0);
    assert_true(f->conn.closing);

    kd_http_conn_free(&f->conn);
    kd_http_conn_init(&f->conn, &f->svc);
    feed(f, "GET /v2 HTTP/1.1\r\nHost: slow");
    assert_true(f->conn.in_message);
    kd_http_conn_timeout(&f->conn);
    expect_json_error(take(f), 408);
    assert_true(f->conn.closing);
}

static void test_eof(void **state)
{
    struct fixture *f = *state;
    feed(f, "GET /v2 HTTP/1.1\r\n");
    kd_http_conn_eof(&f->conn);
    expect_json_error(take(f), 400);
    assert_true(f->conn.closing);
}

static void test_drain(void **state)
{
    struct fixture *f = *state;
    kd_http_conn_drain(&f->conn);
    assert_true(f->conn.closing); /* idle: closes at once */

    kd_http_conn_free(&f->conn);
    kd_http_conn_init(&f->conn, &f->svc);
    feed(f, "GET /v2 HTTP/1.1\r\n");
    kd_http_conn_drain(&f->conn);
    assert_false(f->conn.closing); /* busy: the request may finish */
    feed(f, "\r\n");
    char *r = take(f);
    expect_status(r, 200);
    assert_non_null(strstr(r, "Connection: close\r\n"));
    assert_true(f->conn.closing);

    /* a request that stalls: when the server's grace ends, 503 with Connection: close */
    kd_http_conn_free(&f->conn);
    kd_http_conn_init(&f->conn, &f->svc);
    feed(f, "POST /v2 HTTP/1.1\r\nContent-Length: 10\r\n\r\n{");
    kd_http_conn_drain(&f->conn);
    assert_false(f->conn.closing);
    kd_http_conn_drain_cut(&f->conn);
    r = take(f);
    expect_json_error(r, 503);
    assert_non_null(strstr(r, "Connection: close\r\n"));
    assert_true(f->conn.closing);
}

static void test_metrics_endpoint(void **state)
{
    struct fixture *f = *state;
    struct kd_metric_family *fam = kd_metrics_family(f->metrics, "t_total", "A \\test\nhelp.", KD_METRIC_COUNTER,
                                                     (const char *const[]){"k", NULL}, NULL, 0);
    kd_metric_add(kd_metrics_series(fam, (const char *const[]){"a\"b", NULL}), 3);
    const double b[] = {0.1, 1};
    struct kd_metric_family *h = kd_metrics_family(f->metrics, "t_seconds", "Hist.", KD_METRIC_HISTOGRAM, NULL, b,
                                                   2);
    struct kd_metric_series *hs = kd_metrics_series(h, NULL);
    kd_metric_observe(hs, 0.05);
    kd_metric_observe(hs, 0.5);
    kd_metric_observe(hs, 5);
    feed(f, "GET /metrics HTTP/1.1\r\n\r\n");
    char *r = take(f);
    expect_status(r, 200);
    assert_non_null(strstr(r, "Content-Type: text/plain; version=0.0.4"));
    assert_non_null(strstr(r, "# HELP t_total A \\\\test\\nhelp.\n# TYPE t_total counter\nt_total{k=\"a\\\"b\"} 3\n"));
    assert_non_null(strstr(r, "t_seconds_bucket{le=\"0.1\"} 1\nt_seconds_bucket{le=\"1\"} 2\n"
                              "t_seconds_bucket{le=\"+Inf\"} 3\nt_seconds_sum 5.55\nt_seconds_count 3\n"));
}

/* Random and mutated input in random slices: the parser must answer or close, never crash. */
static void test_random_bytes(void **state)
{
    struct fixture *f = *state;
    const char *seed = "GET /v2/health/ready HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    unsigned rng = 12345;
    char buf[512];
    for (int iter = 0; iter < 3000; iter++) {
        kd_http_conn_free(&f->conn);
        kd_http_conn_init(&f->conn, &f->svc);
        size_t n = strlen(seed);
        memcpy(buf, seed, n);
        int flips = iter % 8;
        for (int k = 0; k < flips; k++) {
            rng = rng * 1103515245u + 12345u;
            buf[(rng >> 8) % n] = (char)(rng >> 16);
        }
        if (iter % 5 == 4)
            for (size_t k = 0; k < n; k++)
                buf[k] = (char)((rng = rng * 1103515245u + 12345u) >> 16);
        size_t at = 0;
        while (at < n) {
            rng = rng * 1103515245u + 12345u;
            size_t step = 1 + (rng >> 8) % 17;
            if (step > n - at)
                step = n - at;
            kd_http_conn_feed(&f->conn, buf + at, step);
            at += step;
        }
        if (iter % 3 == 0)
            kd_http_conn_eof(&f->conn);
        else if (iter % 3 == 1)
            kd_http_conn_timeout(&f->conn);
        f->conn.out.len = 0;
    }
}

/* A handler that answers later, as inference does, keeping what a worker would keep. */
static struct kd_http_pending *deferred;
static const char *deferred_body;

static int defer_handler(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    (void)ctx, (void)out;
    deferred = kd_http_defer(req);
    deferred_body = req->body;
    return KD_HTTP_DEFERRED;
}

/* The body of a deferred request stays readable until its response is finished, even when the
 * connection goes first (a worker may still be reading it), and then goes back to the connection. */
static void test_deferred_body_outlives_connection(void **state)
{
    (void)state;
    static const struct kd_route routes[] = {{"/later", KD_HTTP_POST, defer_handler, NULL}};
    struct kd_http_service svc = {.router = {routes, 1}, .max_header_bytes = 1024, .max_body_bytes = 100};
    for (int gone = 0; gone <= 1; gone++) {
        struct kd_http_conn c;
        kd_http_conn_init(&c, &svc);
        const char *req = "POST /later HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello";
        kd_http_conn_feed(&c, req, strlen(req));
        assert_non_null(deferred);
        assert_memory_equal(deferred_body, "hello", 5);
        if (gone) {
            kd_http_conn_free(&c); /* the client left */
            assert_memory_equal(deferred_body, "hello", 5);
            assert_null(kd_http_pending_out(deferred));
            kd_http_pending_finish(deferred, -1);
        } else {
            struct kd_buf *out = kd_http_pending_out(deferred);
            assert_non_null(out);
            kd_http_pending_finish(deferred, kd_resp_append(out, 200, NULL, "", 0, true, NULL));
            assert_ptr_equal(c.body.data, deferred_body); /* its capacity is reused */
            assert_int_equal(c.body.len, 5);
            kd_http_conn_free(&c);
        }
        deferred = NULL;
    }
}

/* The body of the one response r holds: what follows its header block. */
static const char *body_of(const char *r)
{
    const char *end = strstr(r, "\r\n\r\n");
    assert_non_null(end);
    return end + 4;
}

/* HEAD is answered wherever GET is, with GET's status and headers (Content-Length of GET's
 * body) and no body, so the next response on a keep-alive connection starts where it should. */
static void test_head(void **state)
{
    struct fixture *f = *state;
    feed(f, "GET /v2 HTTP/1.1\r\n\r\n");
    static char get[1 << 16]; /* as large as take's copy */
    snprintf(get, sizeof get, "%s", take(f));
    expect_status(get, 200);
    char length[64];
    snprintf(length, sizeof length, "Content-Length: %zu\r\n", strlen(body_of(get)));
    assert_non_null(strstr(get, length));

    feed(f, "HEAD /v2 HTTP/1.1\r\nHost: x\r\n\r\nGET /v2/health/live HTTP/1.1\r\n\r\n");
    char *r = take(f);
    expect_status(r, 200);
    assert_non_null(strstr(r, length));
    assert_non_null(strstr(r, "Content-Type: application/json\r\n"));
    /* the HEAD's header block is followed at once by the next response */
    expect_status(body_of(r), 200);
    assert_int_equal(count(r, "HTTP/1.1 "), 2);
    assert_string_equal(body_of(body_of(r)), "");
    assert_false(f->conn.closing);
    assert_int_equal(f->observed[200], 3);

    /* /metrics is rendered per request: its HEAD still says how long the GET's body would be */
    feed(f, "HEAD /metrics HTTP/1.1\r\n\r\n");
    r = take(f);
    expect_status(r, 200);
    assert_string_equal(body_of(r), "");
    assert_non_null(strstr(r, "Content-Length: "));
    assert_null(strstr(r, "Content-Length: 0\r\n"));
}

/* No response to a HEAD carries a body: not a 404, a 405, nor a refusal of the request. */
static void test_head_errors_have_no_body(void **state)
{
    struct fixture *f = *state;
    feed(f, "HEAD /nope HTTP/1.1\r\n\r\n");
    char *r = take(f);
    expect_status(r, 404);
    assert_non_null(strstr(r, "Content-Type: application/json\r\n"));
    assert_null(strstr(r, "Content-Length: 0\r\n")); /* GET's length, not the HEAD's */
    assert_string_equal(body_of(r), "");
    assert_false(f->conn.closing);

    feed(f, "DELETE /v2 HTTP/1.1\r\n\r\n");
    r = take(f);
    expect_json_error(r, 405);
    assert_non_null(strstr(r, "\r\nAllow: GET, HEAD\r\n"));

    /* a path that takes POST only does not take HEAD either */
    static const struct kd_route routes[] = {{"/post", KD_HTTP_POST, NULL, NULL}};
    struct kd_http_service svc = {.router = {routes, 1}, .max_header_bytes = 1024, .max_body_bytes = 100};
    struct kd_http_conn c;
    kd_http_conn_init(&c, &svc);
    const char *req = "HEAD /post HTTP/1.1\r\n\r\nGET /post HTTP/1.1\r\n\r\n";
    kd_http_conn_feed(&c, req, strlen(req));
    char copy[1024];
    assert_true(c.out.len < sizeof copy);
    memcpy(copy, c.out.data, c.out.len);
    copy[c.out.len] = '\0';
    expect_status(copy, 405);
    assert_non_null(strstr(copy, "\r\nAllow: POST\r\n"));
    expect_json_error(body_of(copy), 405); /* the GET's 405 comes next, with its body */
    kd_http_conn_free(&c);

    char big[1100];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    feed(f, "HEAD /v2 HTTP/1.1\r\nX-Big: ");
    feed(f, big);
    r = take(f);
    expect_status(r, 431);
    assert_string_equal(body_of(r), "");
    assert_true(f->conn.closing);
}

static void test_head_body_over_limit(void **state)
{
    struct fixture *f = *state;
    feed(f, "HEAD /v2 HTTP/1.1\r\nContent-Length: 1000\r\n\r\n");
    char *r = take(f);
    expect_status(r, 413);
    assert_string_equal(body_of(r), "");
    assert_true(f->conn.closing);
}

/* Handlers that answer later: one writes its whole response at finish (cut there for a HEAD),
 * one writes its header block at once and streams the rest (an event stream: a HEAD gets the
 * header block and the stream is let go). */
static struct kd_http_pending *later, *streaming;

static int later_handler(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    (void)ctx, (void)out;
    assert_int_equal(req->method, KD_HTTP_GET);
    later = kd_http_defer(req);
    return KD_HTTP_DEFERRED;
}

static int stream_handler(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    (void)ctx;
    streaming = kd_http_defer(req);
    streaming->keep_alive = false;
    kd_buf_puts(out,
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\nretry: 1\n\n");
    return KD_HTTP_DEFERRED;
}

static void test_head_deferred(void **state)
{
    (void)state;
    static const struct kd_route routes[] = {
        {"/later", KD_HTTP_GET, later_handler, NULL},
        {"/stream", KD_HTTP_GET, stream_handler, NULL},
    };
    struct kd_http_service svc = {.router = {routes, 2}, .max_header_bytes = 1024, .max_body_bytes = 100};
    struct kd_http_conn c;
    kd_http_conn_init(&c, &svc);
    const char *req = "HEAD /later HTTP/1.1\r\n\r\nGET /later HTTP/1.1\r\n\r\n";
    kd_http_conn_feed(&c, req, strlen(req));
    for (int i = 0; i < 2; i++) {
        /* the pipelined GET is parsed once the HEAD's answer is out, and defers in turn */
        struct kd_http_pending *p = later;
        assert_non_null(p);
        later = NULL;
        kd_http_pending_finish(p,
                               kd_resp_append(kd_http_pending_out(p), 200, "text/plain", "hello", 5, true, NULL));
    }
    assert_null(later);
    char out[1024];
    assert_true(c.out.len < sizeof out);
    memcpy(out, c.out.data, c.out.len);
    out[c.out.len] = '\0';
    c.out.len = 0;
    expect_status(out, 200);
    assert_int_equal(count(out, "Content-Length: 5\r\n"), 2);
    expect_status(body_of(out), 200); /* no "hello" between the two */
    assert_string_equal(body_of(body_of(out)), "hello");

    req = "HEAD /stream HTTP/1.1\r\n\r\n";
    kd_http_conn_feed(&c, req, strlen(req));
    assert_non_null(streaming);
    assert_null(c.pending);
    assert_true(c.closing); /* its header said Connection: close */
    assert_true(c.out.len < sizeof out);
    memcpy(out, c.out.data, c.out.len);
    out[c.out.len] = '\0';
    expect_status(out, 200);
    assert_string_equal(body_of(out), "");
    /* the streamer finds its client gone, as when a GET's client leaves */
    assert_null(kd_http_pending_out(streaming));
    assert_true(atomic_load(&streaming->cancelled));
    kd_http_pending_finish(streaming, -1);
    streaming = NULL;
    kd_http_conn_free(&c);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_keep_alive),
        T(test_absolute_form),
        T(test_readiness_follows_state),
        T(test_pipelined_burst),
        T(test_byte_at_a_time),
        T(test_chunked_body_accepted),
        T(test_body_kept_for_handlers),
        T(test_content_length_over_limit),
        T(test_chunked_over_limit),
        T(test_header_over_limit),
        T(test_header_over_limit_dripped),
        T(test_long_url_is_431),
        T(test_malformed),
        T(test_not_found_and_method),
        T(test_unknown_method),
        T(test_connection_close),
        T(test_http10),
        T(test_timeouts),
        T(test_eof),
        T(test_drain),
        T(test_metrics_endpoint),
        T(test_random_bytes),
        cmocka_unit_test(test_deferred_body_outlives_connection),
        cmocka_unit_test(test_reason_phrases),
    };
    /* HEAD: answered as GET without the body (RFC 9110 9.3.2) */
    const struct CMUnitTest head_tests[] = {
        T(test_head),
        T(test_head_errors_have_no_body),
        T(test_head_body_over_limit),
        cmocka_unit_test(test_head_deferred),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    return failed + cmocka_run_group_tests(head_tests, NULL, NULL);
}
