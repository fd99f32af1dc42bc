/*
 * tests/unit/http-conn-util.h — what the connection tests (test_http_conn.c,
 * test_http_hardening.c) share: feeding a kd_http_conn text and reading back what it wrote,
 * and checks on a response. Include after <cmocka.h>.
 */
#ifndef KILN_TESTS_HTTP_CONN_UTIL_H
#define KILN_TESTS_HTTP_CONN_UTIL_H

#include <stdio.h>
#include <string.h>

#include "http-conn.h"

static inline void conn_feed(struct kd_http_conn *c, const char *s)
{
    kd_http_conn_feed(c, s, strlen(s));
}

/* The connection's out buffer as a NUL-terminated string, consumed (valid until the next call). */
static inline char *conn_take(struct kd_http_conn *c)
{
    static char copy[1 << 16];
    struct kd_buf *out = &c->out;
    assert_true(out->len < sizeof copy);
    if (out->len)
        memcpy(copy, out->data, out->len);
    copy[out->len] = '\0';
    out->len = 0;
    return copy;
}

static inline int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

static inline void expect_status(const char *resp, int status)
{
    /* no response fails the check as a wrong one does, and never reaches %s as NULL */
    const char *got = resp ? resp : "(no response)";
    char line[32];
    snprintf(line, sizeof line, "HTTP/1.1 %d ", status);
    if (strncmp(got, line, strlen(line)) != 0)
        fail_msg("expected %d, got: %.120s", status, got);
}

static inline void expect_json_error(const char *resp, int status)
{
    expect_status(resp, status);
    assert_non_null(strstr(resp, "Content-Type: application/json\r\n"));
    assert_non_null(strstr(resp, "\r\n\r\n{\"error\":\""));
}

#endif /* KILN_TESTS_HTTP_CONN_UTIL_H */
