/*
 * tests/unit/test_http_codec.c — gzip and deflate bodies through a connection (api/http-codec.c
 * inside api/http-conn.c): compressed requests reach handlers inflated, the body limit applies to
 * the inflated size (a small bomb is 413 and never allocated whole), corrupt or truncated streams
 * are 400, unknown codings 415, and responses are compressed as Accept-Encoding asks, deferred
 * ones included, while errors stay plain.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <zlib.h>

#include "http-codec.h"
#include "http-conn.h"
#include "responses.h"

#define MAX_BODY (1u << 20)

static struct kd_buf seen; /* the body the last handler saw */
static struct kd_http_pending *deferred;

/* Answers with the body it was given. */
static int echo(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    (void)ctx;
    seen.len = 0;
    kd_buf_append(&seen, req->body ? req->body : "", req->body_len);
    return kd_resp_append(out, 200, "application/octet-stream", req->body, req->body_len, req->keep_alive, NULL);
}

static int later(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    (void)ctx, (void)out;
    deferred = kd_http_defer(req);
    return KD_HTTP_DEFERRED;
}

static const struct kd_route routes[] = {
    {"/echo", KD_HTTP_POST, echo, NULL},
    {"/later", KD_HTTP_POST, later, NULL},
};
static const struct kd_http_service svc = {
    .router = {routes, 2}, .max_header_bytes = 4096, .max_body_bytes = MAX_BODY};

/* Compresses in with zlib (windowBits 15+16 for gzip, 15 for deflate). */
static size_t pack(const void *in, size_t n, bool gzip, unsigned char *out, size_t cap)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    assert_int_equal(deflateInit2(&z, 9, Z_DEFLATED, gzip ? 31 : 15, 9, Z_DEFAULT_STRATEGY), Z_OK);
    z.next_in = (Bytef *)(uintptr_t)in;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    assert_int_equal(deflate(&z, Z_FINISH), Z_STREAM_END);
    size_t got = z.total_out;
    deflateEnd(&z);
    return got;
}

/* Sends one POST with the given extra headers and body; returns the response (kept in out). */
static const char *post(struct kd_http_conn *c, const char *path, const char *headers, const void *body, size_t n)
{
    char head[512];
    snprintf(head, sizeof head, "POST %s HTTP/1.1\r\nContent-Length: %zu\r\n%s\r\n", path, n, headers);
    c->out.len = 0;
    kd_http_conn_feed(c, head, strlen(head));
    kd_http_conn_feed(c, body, n);
    kd_buf_append(&c->out, "", 1);
    c->out.len--;
    return c->out.data ? c->out.data : "";
}

static void expect_status(const char *r, int status)
{
    char line[32];
    snprintf(line, sizeof line, "HTTP/1.1 %d ", status);
    if (strncmp(r, line, strlen(line)) != 0)
        fail_msg("expected %d, got: %.200s", status, r);
}

static void test_compressed_requests(void **state)
{
    (void)state;
    static unsigned char packed[1 << 16];
    const char *text = "{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[3],\"data\":[1,2,3]}]}";
    for (int gzip = 0; gzip <= 1; gzip++) {
        struct kd_http_conn c;
        kd_http_conn_init(&c, &svc);
        size_t n = pack(text, strlen(text), gzip, packed, sizeof packed);
        const char *r = post(&c, "/echo", gzip ? "Content-Encoding: gzip\r\n" : "Content-Encoding: deflate\r\n",
                             packed, n);
        expect_status(r, 200);
        assert_int_equal(seen.len, strlen(text));
        assert_memory_equal(seen.data, text, seen.len);
        /* the coding names are case-insensitive; identity is no coding at all */
        r = post(&c, "/echo", gzip ? "Content-Encoding: GZIP\r\n" : "Content-Encoding: identity\r\n",
                 gzip ? (const void *)packed : text, gzip ? n : strlen(text));
        expect_status(r, 200);
        assert_int_equal(seen.len, strlen(text));
        assert_false(c.closing);
        kd_http_conn_free(&c);
    }
}

/* 16 MiB of zeros packs into ~16 KiB: 413 at the 1 MiB limit, the buffer never past it. */
static void test_bomb_is_413(void **state)
{
    (void)state;
    size_t big = 16u << 20;
    unsigned char *zeros = calloc(1, big);
    static unsigned char packed[1 << 18];
    size_t n = pack(zeros, big, true, packed, sizeof packed);
    assert_true(n < MAX_BODY);
    struct kd_http_conn c;
    kd_http_conn_init(&c, &svc);
    seen.len = 0;
    const char *r = post(&c, "/echo", "Content-Encoding: gzip\r\n", packed, n);
    expect_status(r, 413);
    assert_non_null(strstr(r, "max_body_bytes once decompressed"));
    assert_int_equal(seen.len, 0); /* no handler ran */
    assert_true(c.body.cap <= MAX_BODY);
    /* the request was read whole, so the connection goes on */
    assert_false(c.closing);
    expect_status(post(&c, "/echo", "", "ok", 2), 200);
    kd_http_conn_free(&c);
    /* exactly at the limit is fine; one byte past it is not */
    for (size_t extra = 0; extra <= 1; extra++) {
        kd_http_conn_init(&c, &svc);
        n = pack(zeros, MAX_BODY + extra, false, packed, sizeof packed);
        r = post(&c, "/echo", "Content-Encoding: deflate\r\n", packed, n);
        expect_status(r, extra ? 413 : 200);
        if (!extra)
            assert_int_equal(seen.len, MAX_BODY);
        kd_http_conn_free(&c);
    }
    free(zeros);
}

static void test_corrupt_streams_are_400(void **state)
{
    (void)state;
    static unsigned char packed[4096];
    const char *text = "hello hello hello hello hello hello";
    size_t n = pack(text, strlen(text), true, packed, sizeof packed);
    struct kd_http_conn c;
    kd_http_conn_init(&c, &svc);
    expect_status(post(&c, "/echo", "Content-Encoding: gzip\r\n", "not gzip at all", 15), 400);
    expect_status(post(&c, "/echo", "Content-Encoding: gzip\r\n", packed, n - 6), 400);    /* truncated */
    const char *r = post(&c, "/echo", "Content-Encoding: gzip\r\n", packed, n / 2);
    expect_status(r, 400);
    assert_non_null(strstr(r, "ends inside its compressed stream"));
    unsigned char flipped[4096];
    memcpy(flipped, packed, n);
    flipped[n - 5] ^= 0x55; /* the length in the trailer no longer matches */
    expect_status(post(&c, "/echo", "Content-Encoding: gzip\r\n", flipped, n), 400);
    memcpy(flipped, packed, n);
    memcpy(flipped + n, "junk", 4);
    r = post(&c, "/echo", "Content-Encoding: gzip\r\n", flipped, n + 4);
    expect_status(r, 400);
    assert_non_null(strstr(r, "bytes after its compressed stream"));
    /* gzip data declared as deflate is the wrong format */
    expect_status(post(&c, "/echo", "Content-Encoding: deflate\r\n", packed, n), 400);
    expect_status(post(&c, "/echo", "Content-Encoding: gzip\r\n", "", 0), 400);
    assert_false(c.closing);
    expect_status(post(&c, "/echo", "Content-Encoding: gzip\r\n", packed, n), 200);
    kd_http_conn_free(&c);
}

static void test_unknown_coding_is_415(void **state)
{
    (void)state;
    const char *codings[] = {"br", "compress", "gzip, gzip", "zstd"};
    for (size_t i = 0; i < 4; i++) {
        struct kd_http_conn c;
        kd_http_conn_init(&c, &svc);
        char h[64];
        snprintf(h, sizeof h, "Content-Encoding: %s\r\n", codings[i]);
        const char *r = post(&c, "/echo", h, "abc", 3);
        expect_status(r, 415);
        assert_non_null(strstr(r, "\"error\":\"unsupported Content-Encoding"));
        kd_http_conn_free(&c);
    }
}

/* The body of the one response in r, inflated (gzip or zlib format, told apart by zlib). */
static size_t unpack_response(const char *r, size_t rlen, char *out, size_t cap)
{
    const char *body = strstr(r, "\r\n\r\n") + 4;
    z_stream z;
    memset(&z, 0, sizeof z);
    assert_int_equal(inflateInit2(&z, 15 + 32), Z_OK);
    z.next_in = (Bytef *)(uintptr_t)body;
    z.avail_in = (uInt)(r + rlen - body);
    z.next_out = (Bytef *)out;
    z.avail_out = (uInt)cap;
    assert_int_equal(inflate(&z, Z_FINISH), Z_STREAM_END);
    size_t n = z.total_out;
    inflateEnd(&z);
    return n;
}

static void test_compressed_responses(void **state)
{
    (void)state;
    char text[2000], got[4096];
    for (size_t i = 0; i < sizeof text; i++)
        text[i] = (char)('a' + i % 7);
    const struct {
        const char *accept;
        const char *coding; /* NULL: not compressed */
    } cases[] = {
        {"gzip", "gzip"}, {"deflate", "deflate"}, {"gzip, deflate", "gzip"}, {"gzip;q=0.5, deflate", "deflate"},
        {"gzip;q=0, deflate;q=0.1", "deflate"}, {"*", "gzip"}, {"br, *;q=0.2", "gzip"}, {"identity", NULL},
        {"*;q=0", NULL}, {"br", NULL}, {"", NULL},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct kd_http_conn c;
        kd_http_conn_init(&c, &svc);
        char h[128];
        snprintf(h, sizeof h, "%s%s%s", cases[k].accept[0] ? "Accept-Encoding: " : "", cases[k].accept,
                 cases[k].accept[0] ? "\r\n" : "");
        const char *r = post(&c, "/echo", h, text, sizeof text);
        expect_status(r, 200);
        if (!cases[k].coding) {
            assert_null(strstr(r, "Content-Encoding"));
            assert_non_null(strstr(r, "Content-Length: 2000\r\n"));
        } else {
            char want[64];
            snprintf(want, sizeof want, "Content-Encoding: %s\r\n", cases[k].coding);
            if (!strstr(r, want))
                fail_msg("Accept-Encoding '%s': expected %s in %.300s", cases[k].accept, want, r);
            assert_non_null(strstr(r, "Vary: Accept-Encoding\r\n"));
            const char *body = strstr(r, "\r\n\r\n") + 4;
            size_t blen = c.out.len - (size_t)(body - r);
            char cl[48];
            snprintf(cl, sizeof cl, "Content-Length: %zu\r\n", blen);
            assert_non_null(strstr(r, cl));
            assert_true(blen < sizeof text);
            assert_int_equal(unpack_response(r, c.out.len, got, sizeof got), sizeof text);
            assert_memory_equal(got, text, sizeof text);
            /* the format is the one named: gzip starts 1f 8b, zlib's deflate does not */
            assert_int_equal((unsigned char)body[0] == 0x1f && (unsigned char)body[1] == 0x8b,
                             strcmp(cases[k].coding, "gzip") == 0);
        }
        /* errors stay plain, whatever was accepted */
        r = post(&c, "/nope", h, "x", 1);
        expect_status(r, 404);
        assert_null(strstr(r, "Content-Encoding"));
        assert_non_null(strstr(r, "{\"error\":"));
        kd_http_conn_free(&c);
    }
}

/* A response written later (an inference a worker ran) is compressed when it is finished. */
static void test_deferred_response_compressed(void **state)
{
    (void)state;
    char text[500], got[1024];
    memset(text, 'z', sizeof text);
    struct kd_http_conn c;
    kd_http_conn_init(&c, &svc);
    post(&c, "/later", "Accept-Encoding: gzip\r\nContent-Encoding: identity\r\n", "", 0);
    assert_non_null(deferred);
    assert_int_equal(c.out.len, 0);
    struct kd_buf *out = kd_http_pending_out(deferred);
    kd_http_pending_finish(deferred, kd_resp_append(out, 200, "application/json", text, sizeof text, true, NULL));
    deferred = NULL;
    kd_buf_append(&c.out, "", 1);
    c.out.len--;
    expect_status(c.out.data, 200);
    assert_non_null(strstr(c.out.data, "Content-Encoding: gzip\r\n"));
    assert_int_equal(unpack_response(c.out.data, c.out.len, got, sizeof got), sizeof text);
    assert_memory_equal(got, text, sizeof text);
    kd_http_conn_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compressed_requests),   cmocka_unit_test(test_bomb_is_413),
        cmocka_unit_test(test_corrupt_streams_are_400), cmocka_unit_test(test_unknown_coding_is_415),
        cmocka_unit_test(test_compressed_responses), cmocka_unit_test(test_deferred_response_compressed),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kd_buf_free(&seen);
    return rc;
}
