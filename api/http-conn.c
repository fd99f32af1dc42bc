/*
 * api/http-conn.c — turning a byte stream into requests and responses with llhttp.
 *
 * llhttp enforces no size limits of its own, so the callbacks count the request line and header
 * bytes and the body bytes as they stream in; a limit is enforced the moment it is crossed, even
 * when the oversized part arrives a byte at a time. A callback that refuses a request records
 * the status and returns -1, which stops the parser; feed then answers with that status and the
 * connection closes. Pipelined requests are answered in order, each appended whole to out, so the
 * socket layer can send a whole batch in one write.
 *
 * Content codings (http-codec.c) sit at the two ends: a gzip or deflate body is inflated, within
 * the body limit, before its handler runs, and a response is compressed after its handler (or,
 * for a deferred one, kd_http_pending_finish) wrote it, when the request's Accept-Encoding asks.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "http-codec.h"
#include "http-conn.h"
#include "http-fields.h"
#include "responses.h"

/* Input stashed while a response is pending; past this, reading stops until it is answered. */
#define STASH_MAX (1u << 20)

/* Request bodies larger than this are not kept between requests, so one big upload does not pin memory. */
#define BODY_KEEP_CAP (256u * 1024u)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static struct kd_http_conn *conn_of(llhttp_t *p)
{
    return p->data;
}

static int reject(struct kd_http_conn *c, int status, const char *msg)
{
    c->reject_status = status;
    c->reject_msg = msg;
    return -1;
}

/* 413 naming the limit and the setting, so whoever meets it knows what to send or to raise */
static int reject_too_large(struct kd_http_conn *c)
{
    snprintf(c->reject_text, sizeof c->reject_text,
             "request body exceeds limits.max_body_bytes (%llu bytes): send less, or raise the setting",
             (unsigned long long)c->svc->max_body_bytes);
    return reject(c, 413, c->reject_text);
}

static int count_header_bytes(struct kd_http_conn *c, size_t n)
{
    c->header_bytes += n;
    if (c->header_bytes > c->svc->max_header_bytes)
        return reject(c, 431, "request header block exceeds max_header_bytes");
    return 0;
}

static int on_message_begin(llhttp_t *p)
{
    struct kd_http_conn *c = conn_of(p);
    c->in_message = true;
    c->head = false;
    c->started_ns = now_ns();
    c->header_bytes = 0;
    c->body_bytes = 0;
    c->url.len = 0;
    kd_http_fields_reset(c);
    c->header_name.len = 0;
    c->header_in_value = false;
    if (c->body.cap > BODY_KEEP_CAP)
        kd_buf_free(&c->body);
    c->body.len = 0;
    return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t n)
{
    struct kd_http_conn *c = conn_of(p);
    /* The method is parsed by now: even a refusal of this request (431) goes without a body. */
    c->head = llhttp_get_method(p) == HTTP_HEAD;
    if (count_header_bytes(c, n) != 0)
        return -1;
    if (kd_buf_append(&c->url, at, n) != 0) {
        c->failed = true;
        return -1;
    }
    return 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t n)
{
    struct kd_http_conn *c = conn_of(p);
    /* +2 stands for the ": " or CRLF around each span, so many empty headers still add up. */
    if (count_header_bytes(c, n + 2) != 0)
        return -1;
    if (c->header_in_value) {
        c->header_in_value = false;
        c->header_name.len = 0;
    }
    /* Names longer than any kept one need not be stored: they match nothing. */
    if (c->header_name.len + n > 40) {
        c->header_name.len = 41;
        return 0;
    }
    if (kd_buf_append(&c->header_name, at, n) != 0) {
        c->failed = true;
        return -1;
    }
    return 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t n)
{
    struct kd_http_conn *c = conn_of(p);
    if (count_header_bytes(c, n + 2) != 0)
        return -1;
    bool line_start = !c->header_in_value;
    c->header_in_value = true;
    if (kd_http_fields_add(c, at, n, line_start) != 0) {
        c->failed = true;
        return -1;
    }
    return 0;
}

/*
 * RFC 9110 10.1.1. A client that sends "Expect: 100-continue" holds its body back until a 100
 * (Continue) comes, or for a while (curl: one second, for bodies over 1 MiB). Called once the
 * header block has passed every check that could refuse it: when a body is still to come, the
 * 100 is written now, so the client sends it at once. (A refused request was answered without
 * one, and the connection closes.) An expectation other than 100-continue is one this server
 * cannot meet: 417. An HTTP/1.0 request's expectation is ignored, as the RFC says.
 */
static int meet_expectation(struct kd_http_conn *c, llhttp_t *p)
{
    const char *expect = kd_http_field(c, KD_FIELD_EXPECT);
    if (!expect[0] || (llhttp_get_http_major(p) == 1 && llhttp_get_http_minor(p) == 0))
        return 0;
    static const char only[] = "this server meets no expectation but Expect: 100-continue";
    bool cont = false;
    for (const char *m = expect; *m;) {
        const char *end = m + strcspn(m, ","), *next = *end ? end + 1 : end;
        while (m < end && (*m == ' ' || *m == '\t'))
            m++;
        while (end > m && (end[-1] == ' ' || end[-1] == '\t'))
            end--;
        if (end - m == 12 && strncasecmp(m, "100-continue", 12) == 0)
            cont = true;
        else if (end > m) /* empty list members are allowed, and mean nothing */
            return reject(c, 417, only);
        m = next;
    }
    bool body_to_come = (p->flags & F_CHUNKED) || ((p->flags & F_CONTENT_LENGTH) && p->content_length > 0);
    if (cont && body_to_come && kd_buf_puts(&c->out, "HTTP/1.1 100 Continue\r\n\r\n") != 0) {
        c->failed = true;
        return -1;
    }
    return 0;
}

static int on_headers_complete(llhttp_t *p)
{
    struct kd_http_conn *c = conn_of(p);
    const char *why = NULL;
    int st = kd_http_fields_keep(c, &why);
    if (st < 0) {
        c->failed = true;
        return -1;
    }
    if (st > 0)
        return reject(c, st, why);
    if ((p->flags & F_CONTENT_LENGTH) && p->content_length > c->svc->max_body_bytes)
        return reject_too_large(c);
    if (kd_http_coding_of(c->headers.content_encoding) == KD_CODING_UNKNOWN)
        return reject(c, 415, "unsupported Content-Encoding: kilnd takes gzip, deflate or identity");
    return meet_expectation(c, p);
}

static int on_body(llhttp_t *p, const char *at, size_t n)
{
    struct kd_http_conn *c = conn_of(p);
    c->body_bytes += n;
    if (c->body_bytes > c->svc->max_body_bytes)
        return reject_too_large(c);
    if (kd_buf_append(&c->body, at, n) != 0) {
        /* Out of memory for the body (kilnd under a memory limit): what was held goes back at
         * once and the client is told why, rather than its connection reset without an answer. */
        kd_buf_free(&c->body);
        return reject(c, 503,
                      "kilnd ran out of memory holding the request body; retry later or send a smaller "
                      "request");
    }
    return 0;
}

/*
 * One response, counted (observe) and logged (access): for a request answered inline, and for a
 * deferred one when kd_http_pending_finish wrote its answer. The connection still holds the
 * request's target and headers either way: nothing more is parsed while a response is pending.
 */
static void account(struct kd_http_conn *c, size_t route, int status, uint64_t started_ns, uint64_t bytes_in)
{
    const struct kd_http_service *s = c->svc;
    uint64_t elapsed = started_ns ? now_ns() - started_ns : 0;
    if (s->observe)
        s->observe(s->observe_ctx, route, status, elapsed);
    if (s->access) {
        bool parsed = c->url.len > 0;
        struct kd_http_access a = {
            .method = parsed ? llhttp_method_name((llhttp_method_t)llhttp_get_method(&c->parser)) : "-",
            .target = parsed ? c->url.data : "-",
            .target_len = parsed ? c->url.len : 1,
            .status = status,
            .elapsed_ns = elapsed,
            .bytes_in = bytes_in,
            .request_id = c->headers.request_id[0] ? c->headers.request_id : "-",
            .peer = c->peer[0] ? c->peer : "-",
        };
        s->access(s->access_ctx, &a);
    }
}

static void observe(struct kd_http_conn *c, size_t route, int status)
{
    account(c, route, status, c->started_ns, c->body.len);
}

/* The characters a request id may hold (the same rule the handlers apply when echoing one). */
static bool request_id_usable(const char *id)
{
    if (!id[0])
        return false;
    for (const char *p = id; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("-_.:", *p))
            return false;
    return true;
}

/*
 * RFC 9110 9.3.2: the answer to HEAD is GET's status and header fields, Content-Length included,
 * without the content. Cuts the body of the one whole response at out->data + mark.
 */
static void cut_body(struct kd_buf *out, size_t mark)
{
    for (size_t i = mark; i + 4 <= out->len; i++)
        if (memcmp(out->data + i, "\r\n\r\n", 4) == 0) {
            out->len = i + 4;
            return;
        }
}

/* Whether a whole header block has been written since mark. */
static bool header_written(const struct kd_buf *out, size_t mark)
{
    for (size_t i = mark; i + 4 <= out->len; i++)
        if (memcmp(out->data + i, "\r\n\r\n", 4) == 0)
            return true;
    return false;
}

/*
 * A HEAD whose handler wrote its response's header block and deferred the rest (an event
 * stream): that header block is the whole answer. The pending response is let go as when the
 * client leaves (whoever streams into it finds it gone and stops), and the connection closes
 * when that header said so. Returns the response's status.
 */
static int head_of_stream(struct kd_http_conn *c, size_t mark)
{
    struct kd_http_pending *p = c->pending;
    if (!kd_http_pending_keep_alive(p))
        c->closing = true;
    c->pending = NULL;
    p->conn = NULL;
    atomic_store(&p->cancelled, true);
    cut_body(&c->out, mark);
    const char *st = c->out.data + mark + 9; /* "HTTP/1.1 NNN" */
    return (st[0] - '0') * 100 + (st[1] - '0') * 10 + (st[2] - '0');
}

/*
 * The request target as path and query. An absolute-form target ("http://host:8000/v2?x=1",
 * RFC 9112 section 3.2.2) must be accepted by a server, which then ignores its authority; its
 * path is the one routed ("/" when it has none). Origin-form targets pass through unchanged.
 */
static void origin_form(const char *url, size_t len, struct kd_request *req)
{
    req->path = len ? url : "";
    req->path_len = len;
    if (!len)
        return;
    size_t at = 0; /* where the path (or the query of a path-less target) starts */
    if (len > 7 && strncasecmp(url, "http://", 7) == 0)
        at = 7;
    else if (len > 8 && strncasecmp(url, "https://", 8) == 0)
        at = 8;
    if (at) {
        while (at < len && url[at] != '/' && url[at] != '?')
            at++; /* the authority */
        bool has_path = at < len && url[at] == '/';
        req->path = has_path ? url + at : "/";
        req->path_len = has_path ? len - at : 1;
    }
    const char *q = memchr(url + at, '?', len - at);
    if (q) {
        if (req->path == url + at) /* not the "/" of a path-less absolute target */
            req->path_len = (size_t)(q - req->path);
        req->query = q + 1;
        req->query_len = (size_t)(url + len - q - 1);
    }
}

static int dispatch(struct kd_http_conn *c, bool keep_alive)
{
    const struct kd_router *r = &c->svc->router;
    struct kd_request req = {
        .method = KD_HTTP_OTHER,
        .body = c->body.data,
        .body_len = c->body.len,
        .keep_alive = keep_alive,
        .headers = &c->headers,
        .conn = c,
    };
    origin_form(c->url.data, c->url.len, &req);
    const char *mname = llhttp_method_name((llhttp_method_t)llhttp_get_method(&c->parser));
    req.method = kd_http_method_from_name(mname, strlen(mname));
    size_t mark = c->out.len;
    c->requests++;
    if (c->svc->access && !request_id_usable(c->headers.request_id))
        snprintf(c->headers.request_id, sizeof c->headers.request_id, "kiln-%d-%llu-%llu", c->svc->pid,
                 (unsigned long long)c->conn_id, (unsigned long long)c->requests);

    size_t idx = r->count, observed = SIZE_MAX; /* observed: the split route, when the request is one of its */
    int status;
    /* Percent-encoded octets are decoded once, here, so routes and names are matched and checked
     * as the characters they stand for (RFC 3986 6.2.2.2); the query stays for handlers to split. */
    const char *why = NULL;
    c->path.len = 0;
    if (kd_buf_reserve(&c->path, req.path_len + 1) != 0)
        return -1;
    if (kd_http_path_decode(req.path, req.path_len, c->path.data, &c->path.len, &why) != 0) {
        status = kd_resp_error(&c->out, 400, why, keep_alive, NULL);
        goto answered;
    }
    req.path = c->path.data;
    req.path_len = c->path.len;
    switch (kd_router_match(r, req.method, req.path, req.path_len, &idx)) {
    case KD_ROUTE_FOUND: {
        c->route = idx;
        if (c->svc->split_suffix && idx == c->svc->split_route) {
            size_t n = strlen(c->svc->split_suffix);
            if (req.path_len > n && memcmp(req.path + req.path_len - n, c->svc->split_suffix, n) == 0)
                c->route = observed = r->count + 1;
        }
        if (c->head) {
            /* Handlers answer GET; the body is cut below. A HEAD never switches protocols
             * (RFC 9110 7.8 lets a server ignore Upgrade): GET's answer without one is given. */
            req.method = KD_HTTP_GET;
            req.head = true;
            c->headers.upgrade[0] = '\0';
        }
        c->dispatching = true;
        c->finished_inline = false;
        status = r->routes[idx].handler(c->svc->ctx, &req, &c->out);
        c->dispatching = false;
        if (status == KD_HTTP_DEFERRED && c->head && c->pending && header_written(&c->out, mark))
            status = head_of_stream(c, mark);
        else if (status == KD_HTTP_DEFERRED && (c->pending || c->finished_inline))
            return 0; /* counted and observed when it finishes */
        else if (status == KD_HTTP_DEFERRED)
            status = kd_resp_error(&c->out, 500, "handler deferred without a pending response", keep_alive, NULL);
        else if (status > 0 && kd_http_compress_response(&c->out, mark,
                                                         kd_http_coding_accepted(c->headers.accept_encoding)) != 0)
            status = -1;
        break;
    }
    case KD_ROUTE_METHOD_NOT_ALLOWED: {
        char allow[96], hdr[128], msg[160];
        kd_router_allow(r, idx, req.path, req.path_len, allow, sizeof allow);
        snprintf(hdr, sizeof hdr, "Allow: %s\r\n", allow);
        snprintf(msg, sizeof msg, "method %s not allowed here; use %s", mname, allow);
        status = kd_resp_error(&c->out, 405, msg, keep_alive, hdr);
        break;
    }
    default: {
        char msg[256];
        snprintf(msg, sizeof msg, "no route for %.*s", (int)(req.path_len > 200 ? 200 : req.path_len), req.path);
        status = kd_resp_error(&c->out, 404, msg, keep_alive, NULL);
        break;
    }
    }
answered:
    if (status < 0)
        return -1;
    if (c->head)
        cut_body(&c->out, mark);
    c->responses++;
    observe(c, observed != SIZE_MAX ? observed : idx, status);
    return 0;
}

/*
 * A gzip or deflate body is inflated before any handler sees it, within max_body_bytes. 0 to go
 * on with the request, 1 when it was answered with an error instead, -1 when out of memory.
 */
static int decode_body(struct kd_http_conn *c, bool keep_alive)
{
    enum kd_http_coding coding = kd_http_coding_of(c->headers.content_encoding);
    if (coding == KD_CODING_IDENTITY)
        return 0;
    struct kd_buf coded = c->body;
    c->body = (struct kd_buf){0};
    const char *why = "out of memory";
    int st = kd_http_inflate(coding, coded.data ? coded.data : "", coded.len, c->svc->max_body_bytes, &c->body,
                             &why);
    kd_buf_free(&coded);
    if (st == 0)
        return 0;
    size_t mark = c->out.len;
    if (st < 0 || (st = kd_resp_error(&c->out, st, why, keep_alive, NULL)) < 0)
        return -1;
    if (c->head)
        cut_body(&c->out, mark);
    c->requests++;
    c->responses++;
    observe(c, c->svc->router.count, st);
    return 1;
}

static int on_message_complete(llhttp_t *p)
{
    struct kd_http_conn *c = conn_of(p);
    /* An Upgrade this server does not take (h2c, a refused WebSocket) or CONNECT: the parser
     * reads nothing after it, so its answer says the connection closes. */
    bool keep_alive = llhttp_should_keep_alive(p) && !c->draining && !p->upgrade;
    c->in_message = false;
    int decoded = decode_body(c, keep_alive);
    if (decoded < 0 || (decoded == 0 && dispatch(c, keep_alive) != 0)) {
        c->failed = true;
        return -1;
    }
    c->started_ns = 0;
    c->head = false; /* what follows (garbage, say) is not this request's to answer bodiless */
    if (c->up_ops)
        return 0; /* llhttp stops with HPE_PAUSED_UPGRADE; feed hands the rest over */
    if (c->pending)
        return HPE_PAUSED; /* nothing more is parsed until the pending response is out */
    if (!keep_alive || c->closing) {
        c->closing = true;
        return HPE_PAUSED; /* whatever follows on this connection is not read */
    }
    if (c->out.len >= KD_HTTP_OUT_HIGH) {
        c->out_paused = true;
        return HPE_PAUSED; /* the next request waits for these answers to be written */
    }
    return 0;
}

static const llhttp_settings_t settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

void kd_http_conn_init(struct kd_http_conn *c, const struct kd_http_service *svc)
{
    memset(c, 0, sizeof *c);
    c->svc = svc;
    llhttp_init(&c->parser, HTTP_REQUEST, &settings);
    c->parser.data = c;
    kd_http_fields_reset(c);
}

void kd_http_conn_free(struct kd_http_conn *c)
{
    if (c->up_ops) {
        const struct kd_http_upgrade_ops *ops = c->up_ops;
        c->up_ops = NULL;
        ops->detach(c->up_ud);
    }
    if (c->pending) {
        /* The job still runs or waits somewhere; it finds the connection gone. */
        c->pending->conn = NULL;
        atomic_store(&c->pending->cancelled, true);
        c->pending = NULL;
    }
    kd_buf_free(&c->stash);
    for (size_t i = 0; i < KD_HTTP_KEPT_FIELDS; i++)
        kd_buf_free(&c->kept[i]);
    kd_buf_free(&c->path);
    kd_buf_free(&c->header_name);
    kd_buf_free(&c->url);
    kd_buf_free(&c->body);
    kd_buf_free(&c->out);
}

/*
 * Whether the parser stopped (at err) inside an upper-case method token that is followed by one
 * space and an origin-form target: a real request with a method the parser does not know
 * (QUERY, say). On true, *path and *path_len are the target without its query.
 */
static bool unknown_method_request(const char *data, size_t len, const char *err, const char **path,
                                   size_t *path_len)
{
    if (!err || err < data || err >= data + len)
        return false;
    const char *p = err, *start = err, *end = data + len;
    while (start > data && start[-1] >= 'A' && start[-1] <= 'Z')
        start--;
    while (p < end && ((*p >= 'A' && *p <= 'Z') || *p == '-' || *p == '_'))
        p++;
    if (p == start || p + 1 >= end || *p != ' ' || p[1] != '/')
        return false;
    const char *t = p + 1, *q = t;
    while (q < end && *q != ' ' && *q != '?' && *q != '\r' && *q != '\n')
        q++;
    *path = t;
    *path_len = (size_t)(q - t);
    return true;
}

static void fail_with(struct kd_http_conn *c, int status, const char *msg)
{
    c->closing = true;
    if (c->failed)
        return;
    size_t mark = c->out.len;
    if (kd_resp_error(&c->out, status, msg, false, NULL) < 0) {
        c->failed = true;
        return;
    }
    if (c->head)
        cut_body(&c->out, mark);
    c->responses++;
    observe(c, c->svc->router.count, status);
}

void kd_http_conn_feed(struct kd_http_conn *c, const char *data, size_t len)
{
    if (c->closing || len == 0)
        return;
    if (c->upgraded) {
        if (c->up_ops)
            c->up_ops->feed(c->up_ud, data, len);
        return;
    }
    if (c->pending || c->out_paused) {
        if (kd_buf_append(&c->stash, data, len) != 0)
            c->failed = true;
        return;
    }
    llhttp_errno_t e = llhttp_execute(&c->parser, data, len);
    if (c->up_ops && (e == HPE_OK || e == HPE_PAUSED_UPGRADE)) {
        /* The 101 is in out; whatever followed the request already belongs to the new protocol. */
        const char *pos = e == HPE_PAUSED_UPGRADE ? llhttp_get_error_pos(&c->parser) : NULL;
        size_t used = pos && pos >= data && pos <= data + len ? (size_t)(pos - data) : len;
        c->upgraded = true;
        if (used < len)
            c->up_ops->feed(c->up_ud, data + used, len - used);
        return;
    }
    if (e == HPE_OK)
        return;
    if (e == HPE_PAUSED && (c->pending || c->out_paused)) {
        /* Keep what follows the deferred request (or the answers that filled out) for later. */
        const char *pos = llhttp_get_error_pos(&c->parser);
        size_t used = pos && pos >= data && pos <= data + len ? (size_t)(pos - data) : len;
        if (kd_buf_append(&c->stash, data + used, len - used) != 0)
            c->failed = true;
        return;
    }
    if (e == HPE_PAUSED || e == HPE_PAUSED_UPGRADE) {
        /* Paused by on_message_complete to close, or an Upgrade this server does not speak. */
        c->closing = true;
        return;
    }
    if (c->reject_status) {
        fail_with(c, c->reject_status, c->reject_msg);
        return;
    }
    char msg[160];
    const char *upath;
    size_t upath_len;
    if (e == HPE_INVALID_METHOD && !c->failed &&
        unknown_method_request(data, len, llhttp_get_error_pos(&c->parser), &upath, &upath_len)) {
        /* A request line whose method the parser does not know: answered as for any other method
         * the path does not take (405 with its Allow list, 404 for no such path), so a client
         * learns what it may send. The parser cannot go on, so the connection closes after it.
         * Garbage (a TLS hello, a bare word) stays a 400 below. */
        size_t idx = 0;
        const struct kd_router *r = &c->svc->router;
        int st;
        c->closing = true;
        if (kd_router_match(r, KD_HTTP_OTHER, upath, upath_len, &idx) == KD_ROUTE_METHOD_NOT_ALLOWED) {
            char allow[96], hdr[128];
            kd_router_allow(r, idx, upath, upath_len, allow, sizeof allow);
            snprintf(hdr, sizeof hdr, "Allow: %s\r\n", allow);
            char why[160];
            snprintf(why, sizeof why, "method not allowed here (not one this server knows); use %s", allow);
            st = kd_resp_error(&c->out, 405, why, false, hdr);
            if (st > 0) {
                c->responses++;
                observe(c, idx, st);
            }
        } else {
            st = kd_resp_error(&c->out, 404, "no route for this path", false, NULL);
            if (st > 0) {
                c->responses++;
                observe(c, r->count, st);
            }
        }
        if (st < 0)
            c->failed = true;
        return;
    }
    snprintf(msg, sizeof msg, "malformed HTTP request: %s", llhttp_get_error_reason(&c->parser));
    fail_with(c, 400, msg);
}

void kd_http_conn_eof(struct kd_http_conn *c)
{
    if (c->upgraded) {
        if (c->up_ops)
            c->up_ops->eof(c->up_ud);
        c->closing = true;
        return;
    }
    if (c->pending) /* the client left before its answer: drop the job if it has not run */
        atomic_store(&c->pending->cancelled, true);
    if (c->closing)
        return;
    if (c->out_paused) {
        /* Requests that arrived whole before the half-close wait in the stash for their
         * answers to be written: they are answered, then the connection closes. */
        c->input_ended = true;
        return;
    }
    if (c->in_message)
        fail_with(c, 400, "connection closed in the middle of a request");
    c->closing = true;
}

void kd_http_conn_timeout(struct kd_http_conn *c)
{
    if (c->closing)
        return;
    if (c->in_message)
        fail_with(c, 408, "request not received within request_timeout_ms");
    c->closing = true;
}

void kd_http_conn_output_taken(struct kd_http_conn *c)
{
    if (c->upgraded && c->up_ops && c->up_ops->output_taken)
        c->up_ops->output_taken(c->up_ud);
}

void kd_http_conn_drain(struct kd_http_conn *c)
{
    if (c->upgraded)
        return; /* the protocol decides when it ends (http-conn.h) */
    c->draining = true;
    if (!c->in_message && !c->pending)
        c->closing = true;
}

void kd_http_conn_drain_cut(struct kd_http_conn *c)
{
    if (c->in_message && !c->closing)
        fail_with(c, 503, "kilnd is shutting down and this request had not fully arrived; send it again");
}

int kd_http_upgrade(const struct kd_request *req, const struct kd_http_upgrade_ops *ops, void *ud)
{
    struct kd_http_conn *c = req->conn;
    if (!c || c->pending || c->up_ops || c->head)
        return -1;
    c->up_ops = ops;
    c->up_ud = ud;
    return 0;
}

void kd_http_conn_refuse(struct kd_http_conn *c, int status, const char *msg, const char *extra_headers)
{
    c->closing = true;
    if (!c->failed && kd_resp_error(&c->out, status, msg, false, extra_headers) < 0)
        c->failed = true;
}

bool kd_http_conn_wants_input(const struct kd_http_conn *c)
{
    return (!c->pending && !c->out_paused) || c->stash.len < STASH_MAX;
}

/* Parses what arrived while parsing was held; it may hold again and stash the rest anew. */
static void replay_stash(struct kd_http_conn *c)
{
    llhttp_resume(&c->parser);
    struct kd_buf in = c->stash;
    c->stash = (struct kd_buf){0};
    if (in.len)
        kd_http_conn_feed(c, in.data, in.len);
    kd_buf_free(&in);
}

void kd_http_conn_output_room(struct kd_http_conn *c)
{
    if (!c->out_paused) /* (never with a pending response: nothing is parsed while out is held) */
        return;
    c->out_paused = false;
    if (!c->closing)
        replay_stash(c);
    if (c->input_ended && !c->out_paused) { /* the stash is spent, and nothing follows it */
        c->input_ended = false;
        kd_http_conn_eof(c);
    }
}

struct kd_http_pending *kd_http_defer(const struct kd_request *req)
{
    struct kd_http_conn *c = req->conn;
    if (!c || c->pending)
        return NULL;
    struct kd_http_pending *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->conn = c;
    atomic_init(&p->cancelled, false);
    p->route = c->route;
    p->started_ns = c->started_ns;
    p->keep_alive = req->keep_alive;
    p->head = c->head;
    p->coding = kd_http_coding_accepted(c->headers.accept_encoding);
    p->body = c->body;
    c->body = (struct kd_buf){0};
    c->pending = p;
    return p;
}

struct kd_buf *kd_http_pending_out(struct kd_http_pending *p)
{
    if (!p->conn)
        return NULL;
    p->mark = p->conn->out.len; /* the response starts here, for compressing it at finish */
    p->marked = true;
    return &p->conn->out;
}

bool kd_http_pending_keep_alive(const struct kd_http_pending *p)
{
    /* closing: the peer half-closed meanwhile, so nothing follows this answer */
    return p->keep_alive && p->conn && !p->conn->draining && !p->conn->closing;
}

void kd_http_pending_finish(struct kd_http_pending *p, int status)
{
    struct kd_http_conn *c = p->conn;
    bool keep_alive = kd_http_pending_keep_alive(p);
    size_t route = p->route;
    uint64_t started = p->started_ns;
    struct kd_buf body = p->body;
    uint64_t body_len = body.len;
    if (c && status > 0 && p->marked && kd_http_compress_response(&c->out, p->mark, p->coding) != 0)
        status = -1;
    if (c && status > 0 && p->marked && p->head)
        cut_body(&c->out, p->mark);
    free(p);
    if (!c) {
        kd_buf_free(&body);
        return;
    }
    if (!c->body.data)
        c->body = body; /* its capacity serves the connection's next request */
    else
        kd_buf_free(&body);
    c->pending = NULL;
    if (status < 0) {
        c->failed = true;
    } else {
        c->responses++;
        account(c, route, status, started, body_len);
    }
    if (c->dispatching) {
        /* Finished before its handler returned: the parser is still inside its callback,
         * which carries on by itself. */
        c->finished_inline = true;
        return;
    }
    if (!keep_alive || c->failed) {
        c->closing = true;
    } else {
        replay_stash(c); /* what arrived meanwhile */
    }
    if (c->wake)
        c->wake(c->wake_ud);
}
