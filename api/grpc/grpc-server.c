/*
 * api/grpc/grpc-server.c — the gRPC service's transport: a listener on the daemon's loop, one
 * nghttp2 server session per connection, gRPC message framing and the status trailers.
 *
 * Limits, all checked before anything is kept: SETTINGS_MAX_CONCURRENT_STREAMS per connection
 * (nghttp2 refuses streams past it), a header block per stream (max_header_bytes: the stream is
 * reset), a message's length prefix against max_message_bytes (RESOURCE_EXHAUSTED before its
 * body is buffered; a gzip or deflate message again as it inflates), a request must arrive
 * within its grpc-timeout, and a connection with no stream for idle_timeout_ms is sent GOAWAY
 * and closed. nghttp2 answers PINGs (keepalive) and does HTTP/2 flow control; the windows are
 * opened wider than the 64 KiB default so that one round trip carries a whole tensor, and kilnd
 * gives them back itself (held while a stream's answers back up). Against a hostile client: a
 * rate of stream resets (rapid reset) and a stall limit (answers that the client neither reads nor
 * opens its window for, idle_timeout_ms) end the connection with GOAWAY, logged with the reason.
 * A connection past limits.max_connections (HTTP's and gRPC's together, conn-limit.h) is sent
 * a lone GOAWAY ENHANCE_YOUR_CALM and closed (refuse() says why no SETTINGS come first). A call
 * answered while its client is still sending is reset with NO_ERROR once its status is out.
 *
 * Sending (the write path, replies and status trailers) is in grpc-send.c; the request headers
 * and the refusals they decide (405, 415, an unknown method) in grpc-headers.c.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "grpc-impl.h"
#include "http-codec.h"
#include "logf.h"
#include "server.h"

#define WINDOW_BYTES (1 << 20)       /* per stream */
#define CONN_WINDOW_BYTES (16 << 20) /* per connection */
/* Client resets (RST_STREAM) a connection may send: RESET_BURST at once, RESETS_PER_SECOND after. */
#define RESET_BURST 200
#define RESETS_PER_SECOND 50
#define RESET_RATE_TEXT "200 at once or 50 a second"
/* SETTINGS and PING acks nghttp2 may hold unsent (one read's worth, as kilnd sends after each
 * read); a client that provokes more in one read is cut (nghttp2's flood detection). */
#define MAX_OUTBOUND_ACKS 1000

#define glog(g, level, ...) kd_api_logf((g)->o.log, (g)->o.log_ud, (level), __VA_ARGS__)

enum grpc_code kd_grpc_code_of_http(int status)
{
    switch (status) {
    case 400: return GRPC_INVALID_ARGUMENT;
    case 401: return GRPC_UNAUTHENTICATED;
    case 403: return GRPC_PERMISSION_DENIED;
    case 404: return GRPC_NOT_FOUND;
    case 409: return GRPC_ALREADY_EXISTS;
    case 429: return GRPC_RESOURCE_EXHAUSTED;
    case 408: return GRPC_DEADLINE_EXCEEDED;
    case 413: return GRPC_RESOURCE_EXHAUSTED;
    case 501: return GRPC_UNIMPLEMENTED;
    case 503: return GRPC_UNAVAILABLE;
    default: return status >= 200 && status < 300 ? GRPC_OK : GRPC_INTERNAL;
    }
}

/* ---- call metrics ----------------------------------------------------------------------------- */

/* The names grpc/doc/statuscodes.md gives the codes, as the code label's values. */
static const char *const code_names[KD_GRPC_CODES] = {
    "OK",        "CANCELLED",       "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS",  "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",    "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED",
};

/* Families in the model table's registry, beside the HTTP ones (kiln_http_requests_total,
 * kiln_http_request_duration_seconds) and named alike. 0, or -1 when out of memory. */
static int register_metrics(struct kd_grpc *g)
{
    if (!g->o.serving)
        return 0; /* no registry (the fuzzer's service) */
    struct kd_metrics *m = kd_serving_limits(g->o.serving)->metrics;
    if (!m)
        return 0;
    g->f_calls = kd_metrics_family(m, "kiln_grpc_requests_total", "gRPC calls ended, by method and status code.",
                                   KD_METRIC_COUNTER, (const char *const[]){"method", "code", NULL}, NULL, 0);
    g->f_seconds = kd_metrics_family(m, "kiln_grpc_request_duration_seconds",
                                     "Time from a gRPC call's headers to its status, by method.",
                                     KD_METRIC_HISTOGRAM, (const char *const[]){"method", NULL},
                                     kd_metrics_request_seconds_buckets, KD_METRICS_REQUEST_SECONDS_NBUCKETS);
    return g->f_calls && g->f_seconds ? 0 : -1;
}

void kd_grpc_count_call(struct grpc_stream *s, enum grpc_code code)
{
    struct kd_grpc *g = s->conn->g;
    const char *method;
    int slot = kd_grpc_method_slot(s->path, &method);
    unsigned k = (unsigned)code < KD_GRPC_CODES ? (unsigned)code : GRPC_UNKNOWN;
    if (g->o.log_access && g->o.log) {
        char line[256];
        snprintf(line, sizeof line, "access grpc %s %s %.3fms peer=%s", method, code_names[k],
                 (double)(uv_hrtime() - s->opened_ns) / 1e6, s->conn->peer[0] ? s->conn->peer : "-");
        g->o.log(g->o.log_ud, KD_LOG_INFO, line);
    }
    if (!g->f_calls)
        return;
    struct kd_metric_series **calls = &g->calls[slot][k], **seconds = &g->seconds[slot];
    if (!*calls)
        *calls = kd_metrics_series(g->f_calls, (const char *const[]){method, code_names[k], NULL});
    if (!*seconds)
        *seconds = kd_metrics_series(g->f_seconds, (const char *const[]){method, NULL});
    if (*calls)
        kd_metric_add(*calls, 1);
    if (*seconds)
        kd_metric_observe(*seconds, (double)(uv_hrtime() - s->opened_ns) / 1e9);
}

/* ---- receiving ------------------------------------------------------------------------------ */

static struct grpc_stream *stream_of(struct kd_grpc_conn *c, int32_t id)
{
    return nghttp2_session_get_stream_user_data(c->session, id);
}

static int on_begin_headers(nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
{
    struct kd_grpc_conn *c = user_data;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    struct grpc_stream *s = calloc(1, sizeof *s);
    if (!s)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    s->conn = c;
    s->id = frame->hd.stream_id;
    s->opened_ns = uv_hrtime();
    s->next = c->streams;
    if (c->streams)
        c->streams->prev = s;
    c->streams = s;
    nghttp2_session_set_stream_user_data(session, s->id, s);
    return 0;
}

/*
 * The whole message in s->in to its method, inflated first when its flag says it is compressed
 * (the inflated size held to the same limit: nothing larger is allocated).
 */
static void dispatch_message(struct grpc_stream *s)
{
    const uint8_t *p = (const uint8_t *)s->in.data;
    if (p[0] == 0) {
        kd_grpc_dispatch(s, p + 5, s->in.len - 5, &s->in);
        return;
    }
    struct kd_buf plain = {0};
    const char *why = "";
    int st = kd_http_inflate((enum kd_http_coding)s->coding, (const char *)p + 5, s->in.len - 5,
                             s->conn->g->o.max_message_bytes, &plain, &why);
    if (st == 0)
        kd_grpc_dispatch(s, (const uint8_t *)(plain.data ? plain.data : ""), plain.len, &plain);
    else if (st == 413)
        kd_grpc_finish(s, GRPC_RESOURCE_EXHAUSTED, "inflated message is larger than limits.max_body_bytes (%llu)",
                       (unsigned long long)s->conn->g->o.max_message_bytes);
    else
        kd_grpc_finish(s, st == 400 ? GRPC_INVALID_ARGUMENT : GRPC_RESOURCE_EXHAUSTED, "%s message: %s",
                       s->coding_name, st == 400 ? why : "out of memory");
    kd_buf_free(&plain);
}

/* Takes what arrived for s: gathers messages, checks each prefix, dispatches each whole one. */
static int take_data(struct grpc_stream *s, const uint8_t *data, size_t len)
{
    struct kd_grpc *g = s->conn->g;
    while (len && !s->finished) {
        if (!s->streaming && s->messages > 0) {
            kd_grpc_finish(s, GRPC_INVALID_ARGUMENT, "a unary call carries one request message");
            return 0;
        }
        if (!s->need) {
            size_t want = 5 - s->in.len, n = len < want ? len : want;
            if (kd_buf_append(&s->in, data, n) != 0)
                return -1;
            data += n;
            len -= n;
            if (s->in.len < 5)
                return 0;
            const uint8_t *p = (const uint8_t *)s->in.data;
            uint64_t body = (uint64_t)p[1] << 24 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 8 | p[4];
            if (p[0] > 1 || (p[0] == 1 && s->coding == KD_CODING_IDENTITY)) {
                kd_grpc_finish(s, GRPC_INTERNAL, "a message marked compressed without a grpc-encoding");
                return 0;
            }
            if (p[0] == 1 && s->coding == KD_CODING_UNKNOWN) {
                kd_grpc_finish(s, GRPC_UNIMPLEMENTED,
                               "grpc-encoding '%.24s' is not supported: use gzip, deflate "
                               "or identity",
                               s->coding_name);
                return 0;
            }
            if (body > g->o.max_message_bytes) {
                kd_grpc_finish(s, GRPC_RESOURCE_EXHAUSTED,
                               "message of %llu bytes is larger than limits.max_body_bytes (%llu)",
                               (unsigned long long)body, (unsigned long long)g->o.max_message_bytes);
                return 0;
            }
            s->need = 5 + body;
            if (kd_buf_reserve(&s->in, (size_t)body) != 0)
                return -1;
        }
        size_t want = (size_t)(s->need - s->in.len), n = len < want ? len : want;
        if (kd_buf_append(&s->in, data, n) != 0)
            return -1;
        data += n;
        len -= n;
        if (s->in.len == s->need) {
            s->messages++;
            s->need = 0;
            if (s->streaming)
                dispatch_message(s);
            s->in.len = s->streaming ? 0 : s->in.len;
        }
    }
    return 0;
}

static int on_data_chunk(nghttp2_session *session, uint8_t flags, int32_t id, const uint8_t *data, size_t len,
                         void *user_data)
{
    struct kd_grpc_conn *c = user_data;
    struct grpc_stream *s = stream_of(c, id);
    if (s && take_data(s, data, len) != 0)
        kd_grpc_finish(s, GRPC_RESOURCE_EXHAUSTED, "out of memory for the request");
    /* The bytes go back to the client's windows now, unless answers already wait on this stream
     * past the backlog limit: then once they drain (grpc-send.c), so a streaming call whose
     * client sends and does not read is held to its window. */
    if (s && kd_grpc_backlog(s) >= KD_GRPC_BACKLOG_BYTES) {
        c->held_streams += s->unconsumed == 0;
        s->unconsumed += len;
    } else {
        nghttp2_session_consume(session, id, len);
    }
    return 0;
}

static void end_of_request(struct grpc_stream *s)
{
    s->client_done = true;
    if (s->finished)
        return;
    if (s->need || (s->in.len && (s->streaming || s->messages == 0))) {
        kd_grpc_finish(s, GRPC_INVALID_ARGUMENT, "the request ended inside a message");
        return;
    }
    if (s->streaming) {
        kd_grpc_stream_maybe_end(s);
        return;
    }
    if (s->messages != 1) {
        kd_grpc_finish(s, GRPC_INVALID_ARGUMENT, "a unary call carries one request message");
        return;
    }
    dispatch_message(s);
}

/* Ends c's session with GOAWAY code, once, logging why (reason completes the sentence). */
static void cut(struct kd_grpc_conn *c, uint32_t code, const char *reason)
{
    if (c->cut_logged)
        return;
    c->cut_logged = true;
    glog(c->g, KD_LOG_WARN, "gRPC connection from %s closed (GOAWAY %s): %s", c->peer,
         nghttp2_http2_strerror(code), reason);
    nghttp2_session_terminate_session(c->session, code);
}

/* One more RST_STREAM from the client: a token bucket, RESET_BURST deep, refilled at
 * RESETS_PER_SECOND. Each reset call may have queued work (cancelled, yet accepted and freed):
 * a client that resets faster is cut (rapid reset, CVE-2023-44487). */
static void count_reset(struct kd_grpc_conn *c)
{
    uint64_t now = uv_hrtime();
    c->reset_tokens += (double)(now - c->reset_refill_ns) * RESETS_PER_SECOND / 1e9;
    c->reset_refill_ns = now;
    if (c->reset_tokens > RESET_BURST)
        c->reset_tokens = RESET_BURST;
    if (c->reset_tokens < 1.0)
        cut(c, NGHTTP2_ENHANCE_YOUR_CALM, "the client reset streams faster than " RESET_RATE_TEXT);
    else
        c->reset_tokens -= 1.0;
}

static int on_frame_recv(nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
{
    struct kd_grpc_conn *c = user_data;
    if (frame->hd.type == NGHTTP2_RST_STREAM)
        count_reset(c);
    struct grpc_stream *s = stream_of(c, frame->hd.stream_id);
    if (!s)
        return 0;
    if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST)
        kd_grpc_check_call(s);
    if ((frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
        (frame->hd.flags & NGHTTP2_FLAG_END_STREAM))
        end_of_request(s);
    return 0;
}

static void stream_free(struct kd_grpc_conn *c, struct grpc_stream *s)
{
    if (!s->finished) /* reset (by the client, or for its headers) or its connection went: no status */
        kd_grpc_count_call(s, GRPC_CANCELLED);
    if (s->unconsumed) { /* the stream is gone: what it held goes back to the connection's window */
        c->held_streams--;
        if (c->session && !c->closing)
            nghttp2_session_consume_connection(c->session, s->unconsumed);
    }
    kd_grpc_detach_jobs(s);
    if (s->load)
        s->load->s = NULL;
    if (s->prev)
        s->prev->next = s->next;
    else
        c->streams = s->next;
    if (s->next)
        s->next->prev = s->prev;
    kd_buf_free(&s->in);
    kd_buf_free(&s->out);
    free(s->authorization);
    free(s);
}

static int on_stream_close(nghttp2_session *session, int32_t id, uint32_t error_code, void *user_data)
{
    struct kd_grpc_conn *c = user_data;
    struct grpc_stream *s = stream_of(c, id);
    if (s) {
        nghttp2_session_set_stream_user_data(session, id, NULL);
        stream_free(c, s);
    }
    c->last_active_ns = uv_hrtime();
    return 0;
}

/*
 * A call answered whole (its status sent, END_STREAM) while its client is still sending, as after
 * a refusal: RST_STREAM(NO_ERROR) tells it to stop (RFC 9113 section 8.1, as grpc-go does), so
 * the rest of its request is not sent only to be dropped. A GOAWAY nghttp2 sent for the client's
 * fault (a protocol or flow-control error, a flood) is logged with the reason nghttp2 gave it.
 */
static int on_frame_send(nghttp2_session *session, const nghttp2_frame *frame, void *user_data)
{
    struct kd_grpc_conn *c = user_data;
    if (frame->hd.type == NGHTTP2_HEADERS && (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) &&
        nghttp2_session_get_stream_remote_close(session, frame->hd.stream_id) == 0) {
        /* queued behind the END_STREAM just sent; an error only means the stream is gone */
        nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, frame->hd.stream_id, NGHTTP2_NO_ERROR);
        return 0;
    }
    if (frame->hd.type != NGHTTP2_GOAWAY || frame->goaway.error_code == NGHTTP2_NO_ERROR || c->cut_logged)
        return 0;
    c->cut_logged = true;
    const nghttp2_goaway *ga = &frame->goaway;
    const char *why = ga->opaque_data_len ? (const char *)ga->opaque_data : "the client broke the protocol";
    int why_len = ga->opaque_data_len ? (int)ga->opaque_data_len : (int)strlen(why);
    glog(c->g, KD_LOG_WARN, "gRPC connection from %s closed (GOAWAY %s): %.*s", c->peer,
         nghttp2_http2_strerror(ga->error_code), why_len, why);
    return 0;
}

/* ---- connections ------------------------------------------------------------------------------ */

static void maybe_drained(struct kd_grpc *g)
{
    if (g->draining && !g->conns && g->drain_done) {
        void (*done)(void *) = g->drain_done;
        g->drain_done = NULL;
        done(g->drain_ud);
    }
}

static void conn_handle_closed(uv_handle_t *h)
{
    struct kd_grpc_conn *c = h->data;
    if (--c->handles_open == 0) {
        struct kd_grpc *g = c->g;
        kd_conn_limit_release(g->o.conn_limit, c->admission);
        free(c);
        if (g->listener_open)
            kd_listener_descriptor_freed(&g->listener);
        maybe_drained(g);
    }
}

static void conn_release(struct kd_grpc_conn *c)
{
    while (c->streams)
        stream_free(c, c->streams);
    nghttp2_session_del(c->session);
    c->session = NULL;
    struct kd_grpc *g = c->g;
    if (c->prev)
        c->prev->next = c->next;
    else if (g->conns == c)
        g->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
}

void kd_grpc_conn_close(struct kd_grpc_conn *c)
{
    if (c->closing)
        return;
    c->closing = true;
    if (c->detached)
        return; /* kd_grpc_conn_free releases it */
    conn_release(c);
    c->handles_open = 2;
    uv_close((uv_handle_t *)&c->tcp, conn_handle_closed);
    uv_close((uv_handle_t *)&c->timer, conn_handle_closed);
}

static int session_new(struct kd_grpc_conn *c)
{
    nghttp2_session_callbacks *cb;
    nghttp2_option *opt;
    if (nghttp2_session_callbacks_new(&cb) != 0)
        return -1;
    c->reset_tokens = RESET_BURST;
    c->reset_refill_ns = uv_hrtime();
    snprintf(c->peer, sizeof c->peer, "-"); /* a socket's connection names its peer once accepted */
    if (nghttp2_option_new(&opt) != 0) {
        nghttp2_session_callbacks_del(cb);
        return -1;
    }
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cb, kd_grpc_on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data_chunk);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
    nghttp2_session_callbacks_set_on_frame_send_callback(cb, on_frame_send);
    nghttp2_option_set_max_settings(opt, 64);
    nghttp2_option_set_max_outbound_ack(opt, MAX_OUTBOUND_ACKS);
    nghttp2_option_set_no_auto_window_update(opt, 1); /* on_data_chunk gives the windows back */
    int rc = nghttp2_session_server_new2(&c->session, cb, c, opt);
    nghttp2_session_callbacks_del(cb);
    nghttp2_option_del(opt);
    if (rc != 0)
        return -1;
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, c->g->o.max_concurrent_streams},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, WINDOW_BYTES},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, (uint32_t)c->g->o.max_header_bytes},
    };
    if (nghttp2_submit_settings(c->session, NGHTTP2_FLAG_NONE, iv, sizeof iv / sizeof iv[0]) != 0 ||
        nghttp2_session_set_local_window_size(c->session, NGHTTP2_FLAG_NONE, 0, CONN_WINDOW_BYTES) != 0)
        return -1;
    return 0;
}

int kd_grpc_conn_feed(struct kd_grpc_conn *c, const uint8_t *data, size_t len)
{
    if (c->closing)
        return -1;
    c->in_recv = true;
    ssize_t n = nghttp2_session_mem_recv(c->session, data, len);
    c->in_recv = false;
    c->last_active_ns = uv_hrtime();
    if (n < 0) {
        if (!c->cut_logged && n != NGHTTP2_ERR_BAD_CLIENT_MAGIC) /* not HTTP/2 at all: nothing to say */
            glog(c->g, KD_LOG_WARN, "gRPC connection from %s closed: %s", c->peer, nghttp2_strerror((int)n));
        kd_grpc_conn_close(c);
        return -1;
    }
    kd_grpc_flush(c);
    return c->closing ? -1 : 0;
}

void kd_grpc_on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct kd_grpc_conn *c = h->data;
    *buf = uv_buf_init(c->rbuf, sizeof c->rbuf);
}

void kd_grpc_on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
    struct kd_grpc_conn *c = st->data;
    if (n < 0) {
        kd_grpc_conn_close(c);
        return;
    }
    if (c->lingering)
        return; /* a refused connection: what the client sends is dropped */
    if (n > 0)
        kd_grpc_conn_feed(c, (const uint8_t *)buf->base, (size_t)n);
}

/* Every second: requests that did not arrive in time, and connections idle too long. */
static void on_tick(uv_timer_t *t)
{
    struct kd_grpc_conn *c = t->data;
    uint64_t now = uv_hrtime();
    for (struct grpc_stream *s = c->streams; s; s = s->next)
        if (!s->client_done && !s->finished && s->deadline_ns && now > s->deadline_ns)
            kd_grpc_finish(s, GRPC_DEADLINE_EXCEEDED, "the deadline passed before the request arrived");
    uint64_t limit_ns = c->g->o.idle_timeout_ms * 1000000u;
    if (!c->streams && now - c->last_active_ns > limit_ns) {
        nghttp2_session_terminate_session(c->session, NGHTTP2_NO_ERROR);
    }
    /* The stall limit: answers that wait idle_timeout_ms on a client that does not read them (the
     * socket) or does not open its windows for them. Its calls are cut, their memory freed. */
    /* a write partly taken counts too: a slow reader is not a stalled one */
    size_t queued = c->detached ? 0 : uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp);
    if (!c->unsent || queued < c->write_queue_seen)
        c->socket_progress_ns = now;
    c->write_queue_seen = queued;
    if (!kd_grpc_streams_waiting(c))
        c->window_progress_ns = now;
    bool socket_stalled = now - c->socket_progress_ns > limit_ns;
    if (socket_stalled || now - c->window_progress_ns > limit_ns) {
        cut(c, NGHTTP2_ENHANCE_YOUR_CALM,
            socket_stalled ? "its client read none of the answers for limits.idle_timeout_ms"
                           : "its client's flow-control windows let no answer through for limits.idle_timeout_ms");
        kd_grpc_flush(c); /* the GOAWAY, if the socket takes it */
        kd_grpc_conn_close(c);
        return;
    }
    kd_grpc_flush(c);
}

static void on_refusal_over(uv_timer_t *t)
{
    kd_grpc_conn_close(t->data);
}

static void on_refusal_shut(uv_shutdown_t *req, int status)
{
    struct kd_grpc_conn *c = req->data;
    if (status != 0 && !c->closing)
        kd_grpc_conn_close(c);
}

/* The debug text of a refused connection's GOAWAY. */
#define REFUSAL_TEXT "limits.max_connections client connections are open"

/*
 * A connection past limits.max_connections gets one frame, GOAWAY ENHANCE_YOUR_CALM naming no
 * stream, and no session: nghttp2 is not involved, and no SETTINGS precede it. That is on
 * purpose. A gRPC client takes a connection whose first frame is SETTINGS as established, and a
 * GOAWAY on an established connection as a reason to reconnect at once, without backoff
 * (grpcio reconnected about 25 times a second so, until its call's deadline); a first frame
 * that is not SETTINGS fails the connection attempt instead (RFC 9113 section 3.4), so the
 * client's call fails UNAVAILABLE at once and its channel backs off before trying again. The
 * GOAWAY still says why, to whoever reads the frames. Then the write side is shut and what the
 * client sends is read and dropped until it closes or KD_CONN_REFUSAL_LINGER_MS pass: closing
 * with the client's preface unread would reset the connection, and a reset may discard the
 * GOAWAY before the client reads it.
 */
static void refuse(struct kd_grpc_conn *c)
{
    /* the frame header (length, type, flags, stream 0), then last stream id 0, the error code
     * and the debug text; every number big-endian, and those not set here 0 */
    uint8_t goaway[9 + 8 + sizeof REFUSAL_TEXT - 1] = {0};
    size_t payload = sizeof goaway - 9;
    goaway[0] = (uint8_t)(payload >> 16);
    goaway[1] = (uint8_t)(payload >> 8);
    goaway[2] = (uint8_t)payload;
    goaway[3] = NGHTTP2_GOAWAY;
    goaway[16] = NGHTTP2_ENHANCE_YOUR_CALM;
    memcpy(goaway + 17, REFUSAL_TEXT, sizeof REFUSAL_TEXT - 1);
    c->lingering = true;
    uv_buf_t b = uv_buf_init((char *)goaway, sizeof goaway);
    /* a new socket's send buffer has room for it: a socket that takes less is not worth a wait */
    c->shutdown_req.data = c;
    if (uv_try_write((uv_stream_t *)&c->tcp, &b, 1) != (int)sizeof goaway ||
        uv_shutdown(&c->shutdown_req, (uv_stream_t *)&c->tcp, on_refusal_shut) != 0) {
        kd_grpc_conn_close(c);
        return;
    }
    uv_timer_start(&c->timer, on_refusal_over, KD_CONN_REFUSAL_LINGER_MS, 0);
}

/* A connection the listener accepted: fd is ours, closed with the connection's handle. */
static void on_connection(void *ud, int fd)
{
    struct kd_grpc *g = ud;
    enum kd_conn_admission admission = g->draining ? KD_CONN_DROP
                                                   : kd_conn_limit_admit(g->o.conn_limit, "gRPC", fd);
    struct kd_grpc_conn *c = admission == KD_CONN_DROP ? NULL : calloc(1, sizeof *c);
    if (!c) {
        if (admission != KD_CONN_DROP) /* out of memory */
            kd_conn_limit_release(g->o.conn_limit, admission);
        close(fd);
        return;
    }
    c->g = g;
    c->admission = admission;
    uv_tcp_init(g->loop, &c->tcp);
    uv_timer_init(g->loop, &c->timer);
    c->tcp.data = c->timer.data = c;
    int opened = uv_tcp_open(&c->tcp, fd);
    if (opened != 0)
        close(fd);
    if (opened != 0 || (admission == KD_CONN_SERVE && session_new(c) != 0)) {
        if (c->session)
            nghttp2_session_del(c->session);
        c->session = NULL;
        c->handles_open = 2;
        uv_close((uv_handle_t *)&c->tcp, conn_handle_closed);
        uv_close((uv_handle_t *)&c->timer, conn_handle_closed);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    kd_server_peer_name(&c->tcp, c->peer, sizeof c->peer);
    c->next = g->conns;
    if (g->conns)
        g->conns->prev = c;
    g->conns = c;
    c->last_active_ns = c->socket_progress_ns = c->window_progress_ns = uv_hrtime();
    uv_read_start((uv_stream_t *)&c->tcp, kd_grpc_on_alloc, kd_grpc_on_read);
    if (admission == KD_CONN_REFUSE) {
        refuse(c);
        return;
    }
    uv_timer_start(&c->timer, on_tick, 1000, 1000);
    kd_grpc_flush(c);
}

/* ---- the service ------------------------------------------------------------------------------ */

int kd_grpc_new(struct kd_grpc **out, uv_loop_t *loop, const struct kd_grpc_options *o)
{
    struct kd_grpc *g = calloc(1, sizeof *g);
    if (!g)
        return -1;
    g->o = *o;
    g->loop = loop;
    if (!g->o.max_concurrent_streams)
        g->o.max_concurrent_streams = 100;
    if (!g->o.max_header_bytes)
        g->o.max_header_bytes = 8192;
    if (!g->o.idle_timeout_ms)
        g->o.idle_timeout_ms = 60000;
    if (register_metrics(g) != 0) {
        free(g);
        return -1;
    }
    *out = g;
    return 0;
}

int kd_grpc_listen(struct kd_grpc *g, char *err, size_t errlen)
{
    char why[384];
    int rc = kd_listener_open(&g->listener, g->loop, g->o.host, g->o.port, "gRPC", on_connection, g, g->o.log,
                              g->o.log_ud, &g->port, why, sizeof why);
    g->listener_open = rc == 0;
    if (rc != 0)
        snprintf(err, errlen, "gRPC: %s", why);
    return rc;
}

int kd_grpc_port(const struct kd_grpc *g)
{
    return g->port;
}

size_t kd_grpc_connections(const struct kd_grpc *g)
{
    size_t n = 0;
    for (const struct kd_grpc_conn *c = g->conns; c; c = c->next)
        n++;
    return n;
}

static void close_listener(struct kd_grpc *g)
{
    if (g->listener_open)
        kd_listener_close(&g->listener, NULL, NULL);
}

void kd_grpc_drain(struct kd_grpc *g, void (*done)(void *ud), void *ud)
{
    g->draining = true;
    g->drain_done = done;
    g->drain_ud = ud;
    close_listener(g);
    for (struct kd_grpc_conn *c = g->conns; c; c = c->next) {
        if (c->lingering)
            continue; /* refused: told already, and closing on its own within the linger */
        nghttp2_submit_shutdown_notice(c->session);
        nghttp2_submit_goaway(c->session, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(c->session),
                              NGHTTP2_NO_ERROR, NULL, 0);
        /* A streaming call lasts as long as its client wants: one with nothing in flight would
         * hold the stop for all of drain_timeout_ms. It ends now, one with requests in flight
         * once they are answered (kd_grpc_stream_maybe_end), with UNAVAILABLE, which tells a
         * client to go to another server. */
        for (struct grpc_stream *s = c->streams; s; s = s->next)
            if (s->streaming && !s->finished && !s->client_done && !s->jobs && s->in.len == 0)
                kd_grpc_finish(s, GRPC_UNAVAILABLE, "%s", kd_grpc_drain_stream_end);
    }
    for (struct kd_grpc_conn *c = g->conns, *next; c; c = next) {
        next = c->next;
        if (!c->lingering)
            kd_grpc_flush(c);
    }
    maybe_drained(g);
}

void kd_grpc_close_all(struct kd_grpc *g)
{
    g->draining = true;
    close_listener(g);
    while (g->conns)
        kd_grpc_conn_close(g->conns);
}

void kd_grpc_free(struct kd_grpc *g)
{
    free(g);
}

struct kd_grpc_conn *kd_grpc_conn_detached(struct kd_grpc *g)
{
    struct kd_grpc_conn *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->g = g;
    c->detached = true;
    if (session_new(c) != 0) {
        if (c->session)
            nghttp2_session_del(c->session);
        free(c);
        return NULL;
    }
    return c;
}

void kd_grpc_conn_free(struct kd_grpc_conn *c)
{
    if (!c)
        return;
    conn_release(c);
    free(c);
}
