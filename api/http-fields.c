/*
 * api/http-fields.c — the request header fields kilnd reads, kept whole up to the header block's
 * bound. Fixed-size slots used to answer 431 for an Authorization past 512 bytes or an
 * X-Request-Id past 128, far below max_header_bytes, which is the only header limit kilnd
 * documents; now a value's only bound is the block's.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "http-fields.h"

/*
 * The header fields kilnd reads; any other is counted and skipped. Each value is gathered whole
 * into the connection's buffer for it (the header block's bound, max_header_bytes, bounds them
 * all), then handed to handlers when the block is complete (kd_http_fields_keep): free-form values as
 * pointers, fixed-shape ones copied into their arrays, where a value too long to be valid is
 * dropped (size given, status 0) or refused with the status a wrong value gets.
 */
enum {
    K_PTR,
    K_ARRAY,
    K_CONN
}; /* K_CONN: the connection's own (Expect, Transfer-Encoding) */
static const struct {
    const char *name;
    int kind;
    size_t offset, size;
    int status; /* K_ARRAY: 0 drops a value too long for it, else refuses the request */
    const char *msg;
} kept_headers[] = {
    {"authorization", K_PTR, offsetof(struct kd_http_headers, authorization), 0, 0, NULL},
    {"content-type", K_PTR, offsetof(struct kd_http_headers, content_type), 0, 0, NULL},
    {"accept-encoding", K_PTR, offsetof(struct kd_http_headers, accept_encoding), 0, 0, NULL},
    {"connection", K_PTR, offsetof(struct kd_http_headers, connection), 0, 0, NULL},
    {"x-request-id", K_ARRAY, offsetof(struct kd_http_headers, request_id), KD_HTTP_SHORT_HEADER_MAX, 0, NULL},
    {"inference-header-content-length", K_ARRAY, offsetof(struct kd_http_headers, inference_header_length), 32,
     400, "Inference-Header-Content-Length is not a valid length"},
    {"last-event-id", K_ARRAY, offsetof(struct kd_http_headers, last_event_id), 32, 400,
     "Last-Event-ID is not an event id kilnd sent"},
    {"content-encoding", K_ARRAY, offsetof(struct kd_http_headers, content_encoding), 32, 415,
     "unsupported Content-Encoding: kilnd takes gzip, deflate or identity"},
    {"upgrade", K_ARRAY, offsetof(struct kd_http_headers, upgrade), 32, 0, NULL},
    {"sec-websocket-key", K_ARRAY, offsetof(struct kd_http_headers, ws_key), 64, 0, NULL},
    {"sec-websocket-version", K_ARRAY, offsetof(struct kd_http_headers, ws_version), 16, 0, NULL},
    {"expect", K_CONN, 0, 0, 0, NULL},
    {"transfer-encoding", K_CONN, 0, 0, 0, NULL},
};
#define NKEPT (sizeof kept_headers / sizeof kept_headers[0])
#define EXPECT_SLOT (NKEPT - 2)
#define TE_SLOT (NKEPT - 1)
_Static_assert(NKEPT == KD_HTTP_KEPT_FIELDS, "one buffer per kept header field");
_Static_assert(EXPECT_SLOT == KD_FIELD_EXPECT && TE_SLOT == KD_FIELD_TRANSFER_ENCODING, "slot order");

/* A kept field's buffer larger than this is let go between requests, as for bodies. */
#define FIELD_KEEP_CAP 4096u

static const char *field(const struct kd_http_conn *c, size_t slot)
{
    return c->kept[slot].len ? c->kept[slot].data : "";
}

const char *kd_http_field(const struct kd_http_conn *c, enum kd_http_field_id id)
{
    return field(c, (size_t)id);
}

void kd_http_fields_reset(struct kd_http_conn *c)
{
    memset(&c->headers, 0, sizeof c->headers);
    for (size_t i = 0; i < NKEPT; i++) {
        if (c->kept[i].cap > FIELD_KEEP_CAP)
            kd_buf_free(&c->kept[i]);
        c->kept[i].len = 0;
        if (kept_headers[i].kind == K_PTR)
            *(const char **)((char *)&c->headers + kept_headers[i].offset) = "";
    }
    c->fields_done = false;
}

/*
 * NUL-terminates every kept value and fills c->headers. Trailer fields that follow a chunked body
 * are not kept (RFC 9110 6.5.1: they may not stand in for header fields), so these values cannot
 * change under a handler.
 */
static int keep_fields(struct kd_http_conn *c, const char **why)
{
    c->fields_done = true;
    for (size_t i = 0; i < NKEPT; i++) {
        struct kd_buf *b = &c->kept[i];
        size_t n = b->len;
        if (n == 0)
            continue;
        if (kd_buf_append(b, "", 1) != 0)
            return -1;
        b->len = n; /* the NUL stays just past the value */
        char *dst = (char *)&c->headers + kept_headers[i].offset;
        if (kept_headers[i].kind == K_PTR)
            *(const char **)dst = b->data;
        else if (kept_headers[i].kind == K_ARRAY && n < kept_headers[i].size)
            memcpy(dst, b->data, n + 1);
        else if (kept_headers[i].kind == K_ARRAY && kept_headers[i].status) {
            *why = kept_headers[i].msg;
            return kept_headers[i].status;
        }
    }
    return 0;
}

/*
 * RFC 9112 6.1: chunked is the only transfer coding kilnd undoes, so any other is one it does not
 * understand and gets 501, as the RFC asks, rather than being passed on still coded. That holds
 * for "identity" too, which RFC 7230 removed from the transfer codings. llhttp already refused a
 * request whose last coding is not chunked, and chunked twice is a malformed message (400).
 */
static int check_transfer_coding(const struct kd_http_conn *c, const char **why)
{
    /* Static: read by feed (fail_with) right after the parser stops, on the one loop thread. */
    static char msg[160];
    int chunked = 0;
    for (const char *m = field(c, TE_SLOT); *m;) {
        const char *end = m + strcspn(m, ","), *next = *end ? end + 1 : end;
        while (m < end && (*m == ' ' || *m == '\t'))
            m++;
        while (end > m && (end[-1] == ' ' || end[-1] == '\t'))
            end--;
        if (end - m == 7 && strncasecmp(m, "chunked", 7) == 0) {
            chunked++;
        } else if (end > m) {
            int n = (int)(end - m);
            snprintf(msg, sizeof msg, "unsupported Transfer-Encoding '%.*s%s': kilnd takes chunked only",
                     n > 40 ? 40 : n, m, n > 40 ? "..." : "");
            *why = msg;
            return 501;
        }
        m = next;
    }
    *why = "Transfer-Encoding names chunked more than once";
    return chunked > 1 ? 400 : 0;
}

int kd_http_fields_add(struct kd_http_conn *c, const char *at, size_t n, bool line_start)
{
    if (line_start) {
        c->header_slot = NKEPT;
        for (size_t i = 0; i < NKEPT && c->header_name.len <= 40 && !c->fields_done; i++)
            if (strlen(kept_headers[i].name) == c->header_name.len &&
                strncasecmp(kept_headers[i].name, c->header_name.data, c->header_name.len) == 0)
                c->header_slot = i;
    }
    if (c->header_slot >= NKEPT)
        return 0;
    struct kd_buf *b = &c->kept[c->header_slot];
    /* A field given on several lines is one list (RFC 9110 5.3). */
    if (line_start && b->len && kd_buf_append(b, ", ", 2) != 0)
        return -1;
    return kd_buf_append(b, at, n);
}

int kd_http_fields_keep(struct kd_http_conn *c, const char **why)
{
    int st = keep_fields(c, why);
    return st != 0 ? st : check_transfer_coding(c, why);
}
