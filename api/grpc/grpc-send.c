/*
 * api/grpc/grpc-send.c — the gRPC transport's sending side: nghttp2's frames are gathered with
 * nghttp2_session_mem_send and written in one pass, straight to the socket when nothing is
 * waiting (uv_try_write), the rest through uv_write; never from inside an nghttp2 callback (the
 * read path sends after it). A client that does not read what it is sent is not read from until
 * it catches up. Also here: response headers, message framing, replies and the status trailers.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc-impl.h"
#include "http-codec.h"

#define UNSENT_HIGH (8u << 20) /* bytes written and not yet taken: stop reading past it */

struct write_req {
    uv_write_t req;
    struct kd_grpc_conn *c;
    size_t len;
    char *data; /* the gathered frames, owned */
};

/* ---- sending -------------------------------------------------------------------------------- */

static void on_written(uv_write_t *req, int status)
{
    struct write_req *w = (struct write_req *)req;
    struct kd_grpc_conn *c = w->c;
    c->unsent -= w->len;
    free(w->data);
    free(w);
    if (status != 0) {
        kd_grpc_conn_close(c);
        return;
    }
    c->socket_progress_ns = uv_hrtime();
    if (c->read_paused && !c->closing && c->unsent < UNSENT_HIGH / 2) {
        c->read_paused = false;
        uv_read_start((uv_stream_t *)&c->tcp, kd_grpc_on_alloc, kd_grpc_on_read);
    }
}

size_t kd_grpc_backlog(const struct grpc_stream *s)
{
    return s->out.len - s->out_off + s->running_bytes;
}

bool kd_grpc_streams_waiting(const struct kd_grpc_conn *c)
{
    for (const struct grpc_stream *s = c->streams; s; s = s->next)
        if (s->out.len > s->out_off || (s->finished && !s->trailers_sent))
            return true;
    return false;
}

/* Gives back to the client's windows the request bytes held on streams whose answers have
 * drained to half the backlog limit (grpc-server.c holds them). Whether any were. */
static bool release_windows(struct kd_grpc_conn *c)
{
    bool released = false;
    for (struct grpc_stream *s = c->streams; s && c->held_streams; s = s->next)
        if (s->unconsumed && kd_grpc_backlog(s) < KD_GRPC_BACKLOG_BYTES / 2) {
            nghttp2_session_consume(c->session, s->id, s->unconsumed);
            s->unconsumed = 0;
            c->held_streams--;
            released = true;
        }
    return released;
}

/* Appends every frame the session has ready to b. 0, or -1 when the session failed or out of memory. */
static int gather(struct kd_grpc_conn *c, struct kd_buf *b)
{
    for (;;) {
        const uint8_t *p;
        ssize_t n = nghttp2_session_mem_send(c->session, &p);
        if (n < 0)
            return -1;
        if (n == 0)
            return 0;
        if (kd_buf_append(b, p, (size_t)n) != 0)
            return -1;
    }
}

void kd_grpc_flush(struct kd_grpc_conn *c)
{
    if (c->in_recv || c->closing || c->lingering) /* a refused connection has no session */
        return;
    struct kd_buf b = {0};
    /* answers taken may bring a held stream under its limit: its WINDOW_UPDATE goes in this pass */
    if (gather(c, &b) != 0 || (c->held_streams && release_windows(c) && gather(c, &b) != 0)) {
        kd_buf_free(&b);
        kd_grpc_conn_close(c);
        return;
    }
    size_t done = 0;
    if (b.len && !c->detached && c->unsent == 0) {
        /* Straight to the socket when nothing is waiting (most answers): no request, no
         * callback, no change to the poll set. */
        uv_buf_t ub = uv_buf_init(b.data, (unsigned)b.len);
        int n = uv_try_write((uv_stream_t *)&c->tcp, &ub, 1);
        if (n < 0 && n != UV_EAGAIN) {
            kd_buf_free(&b);
            kd_grpc_conn_close(c);
            return;
        }
        done = n > 0 ? (size_t)n : 0;
    }
    if (b.len > done && !c->detached) {
        /* the rest is written from where the socket stopped: no move of what can be megabytes */
        struct write_req *w = malloc(sizeof *w);
        if (!w) {
            kd_buf_free(&b);
            kd_grpc_conn_close(c);
            return;
        }
        w->c = c;
        w->len = b.len - done;
        w->data = b.data; /* the write owns the frames now */
        b = (struct kd_buf){0};
        uv_buf_t ub = uv_buf_init(w->data + done, (unsigned)w->len);
        if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &ub, 1, on_written) != 0) {
            free(w->data);
            free(w);
            kd_grpc_conn_close(c);
            return;
        }
        c->unsent += w->len;
        /* A client that sends but does not read (answers, PING and SETTINGS acks pile up) is
         * not read from until it has taken most of what is waiting. */
        if (c->unsent > UNSENT_HIGH && !c->read_paused) {
            c->read_paused = true;
            uv_read_stop((uv_stream_t *)&c->tcp);
        }
    }
    kd_buf_free(&b);
    if (!nghttp2_session_want_read(c->session) && !nghttp2_session_want_write(c->session))
        kd_grpc_conn_close(c);
}

static ssize_t read_out(nghttp2_session *session, int32_t id, uint8_t *buf, size_t length, uint32_t *flags,
                        nghttp2_data_source *source, void *user_data);

static int send_headers(struct grpc_stream *s)
{
    const char *coding = kd_http_coding_name((enum kd_http_coding)s->resp_coding);
    const nghttp2_nv nva[] = {
        {(uint8_t *)":status", (uint8_t *)"200", 7, 3, NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)"content-type", (uint8_t *)"application/grpc", 12, 16, NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)"grpc-accept-encoding", (uint8_t *)"identity,deflate,gzip", 20, 21, NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)"grpc-encoding", (uint8_t *)coding, 13, strlen(coding), NGHTTP2_NV_FLAG_NONE},
    };
    nghttp2_data_provider prd = {.source.ptr = s, .read_callback = read_out};
    s->headers_sent = true;
    size_t n = s->resp_coding == KD_CODING_IDENTITY ? 3 : 4;
    return nghttp2_submit_response(s->conn->session, s->id, nva, n, &prd) == 0 ? 0 : -1;
}

/* grpc-message is percent-encoded: bytes outside printable ASCII, and '%' itself. */
static void percent_encode(const char *in, char *out, size_t cap)
{
    size_t k = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p && k + 4 < cap; p++) {
        if (*p < 0x20 || *p > 0x7e || *p == '%')
            k += (size_t)snprintf(out + k, cap - k, "%%%02X", *p);
        else
            out[k++] = (char)*p;
    }
    out[k] = '\0';
}

static int submit_status(struct grpc_stream *s, bool trailers_only)
{
    char code[16], msg[3 * sizeof s->message]; /* percent-encoding at most triples it */
    if (s->code >= 0 && s->code < 100) { /* every gRPC status: two digits at most, no snprintf per call */
        int k = 0;
        if (s->code >= 10)
            code[k++] = (char)('0' + s->code / 10);
        code[k++] = (char)('0' + s->code % 10);
        code[k] = '\0';
    } else {
        snprintf(code, sizeof code, "%d", s->code);
    }
    percent_encode(s->message, msg, sizeof msg);
    char http_status[8] = "200";
    if (trailers_only && s->http_status) /* a refusal at the HTTP level */
        snprintf(http_status, sizeof http_status, "%d", s->http_status);
    nghttp2_nv nva[5];
    size_t n = 0;
#define NV(name, value)                                                                                           \
    nva[n++] = (nghttp2_nv)                                                                                       \
    {                                                                                                             \
        (uint8_t *)(name), (uint8_t *)(value), strlen(name), strlen(value), 0                                     \
    }
    if (trailers_only) {
        NV(":status", http_status);
        NV("content-type", "application/grpc");
        if (s->http_status == 405)
            NV("allow", "POST");
    }
    NV("grpc-status", code);
    if (msg[0])
        NV("grpc-message", msg);
#undef NV
    s->trailers_sent = true;
    if (trailers_only)
        return nghttp2_submit_response(s->conn->session, s->id, nva, n, NULL);
    return nghttp2_submit_trailer(s->conn->session, s->id, nva, n);
}

static ssize_t read_out(nghttp2_session *session, int32_t id, uint8_t *buf, size_t length, uint32_t *flags,
                        nghttp2_data_source *source, void *user_data)
{
    struct grpc_stream *s = source->ptr;
    size_t left = s->out.len - s->out_off;
    if (left || s->finished)
        s->conn->window_progress_ns = uv_hrtime(); /* the client's windows let answers through */
    if (left) {
        size_t n = left < length ? left : length;
        memcpy(buf, s->out.data + s->out_off, n);
        s->out_off += n;
        if (s->out_off == s->out.len)
            s->out.len = s->out_off = 0;
        if (!s->out.len && s->finished) {
            /* the last of it: the trailers follow this frame */
            *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
            if (submit_status(s, false) != 0)
                return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        }
        return (ssize_t)n;
    }
    if (!s->finished)
        return NGHTTP2_ERR_DEFERRED;
    *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
    if (submit_status(s, false) != 0)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    return 0;
}

int kd_grpc_frame(struct kd_buf *b, const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    if (n > UINT32_MAX || kd_buf_reserve(b, 5 + n) != 0)
        return -1;
    uint8_t *p = (uint8_t *)b->data + b->len;
    p[0] = 0;
    p[1] = (uint8_t)(n >> 24);
    p[2] = (uint8_t)(n >> 16);
    p[3] = (uint8_t)(n >> 8);
    p[4] = (uint8_t)n;
    protobuf_c_message_pack(m, p + 5);
    b->len += 5 + n;
    return 0;
}

int kd_grpc_frame_coded(struct kd_buf *b, const ProtobufCMessage *m, int coding)
{
    size_t start = b->len;
    if (kd_grpc_frame(b, m) != 0)
        return -1;
    if (coding != KD_CODING_GZIP && coding != KD_CODING_DEFLATE)
        return 0;
    size_t n = b->len - start - 5;
    struct kd_buf z = {0};
    if (kd_http_deflate((enum kd_http_coding)coding, b->data + start + 5, n, &z) != 0) {
        kd_buf_free(&z);
        b->len = start;
        return -1;
    }
    if (z.len < n) { /* otherwise it goes uncompressed, flag 0, as gRPC allows per message */
        uint8_t *p = (uint8_t *)b->data + start;
        p[0] = 1;
        p[1] = (uint8_t)(z.len >> 24);
        p[2] = (uint8_t)(z.len >> 16);
        p[3] = (uint8_t)(z.len >> 8);
        p[4] = (uint8_t)z.len;
        memcpy(p + 5, z.data, z.len);
        b->len = start + 5 + z.len;
    }
    kd_buf_free(&z);
    return 0;
}

/* Something was queued on s: the response starts, or its deferred data source is woken. */
static int queued(struct grpc_stream *s)
{
    if (!s->headers_sent)
        return send_headers(s);
    nghttp2_session_resume_data(s->conn->session, s->id); /* an error only means it was not deferred */
    return 0;
}

int kd_grpc_reply(struct grpc_stream *s, const ProtobufCMessage *m)
{
    if (s->finished || kd_grpc_frame_coded(&s->out, m, s->resp_coding) != 0)
        return -1;
    return queued(s);
}

int kd_grpc_reply_buf(struct grpc_stream *s, struct kd_buf *framed)
{
    if (s->finished)
        return -1;
    if (s->out.len == s->out_off) {
        /* nothing waiting: the stream takes the buffer as it is */
        kd_buf_free(&s->out);
        s->out = *framed;
        s->out_off = 0;
        *framed = (struct kd_buf){0};
    } else if (kd_buf_append(&s->out, framed->data, framed->len) != 0) {
        return -1;
    }
    return queued(s);
}

static void finish_now(struct grpc_stream *s);

static __attribute__((format(printf, 3, 0))) void finish_v(struct grpc_stream *s, enum grpc_code code,
                                                           const char *fmt, va_list ap)
{
    s->code = (int)code;
    vsnprintf(s->message, sizeof s->message, fmt, ap);
    finish_now(s);
}

void kd_grpc_finish(struct grpc_stream *s, enum grpc_code code, const char *fmt, ...)
{
    if (s->finished)
        return;
    va_list ap;
    va_start(ap, fmt);
    finish_v(s, code, fmt, ap);
    va_end(ap);
}

void kd_grpc_refuse_http(struct grpc_stream *s, int http_status, enum grpc_code code, const char *fmt, ...)
{
    if (s->finished || s->headers_sent)
        return; /* only a call that has answered nothing can answer with another HTTP status */
    s->http_status = http_status;
    va_list ap;
    va_start(ap, fmt);
    finish_v(s, code, fmt, ap);
    va_end(ap);
}

void kd_grpc_finish_ok(struct grpc_stream *s)
{
    if (s->finished)
        return;
    s->code = GRPC_OK;
    s->message[0] = '\0';
    finish_now(s);
}

/* The status (code, message) is set: the trailers go after what was queued. */
static void finish_now(struct grpc_stream *s)
{
    s->finished = true;
    kd_grpc_count_call(s, (enum grpc_code)s->code);
    if (!s->headers_sent) {
        s->headers_sent = true;
        if (submit_status(s, true) != 0)
            nghttp2_submit_rst_stream(s->conn->session, NGHTTP2_FLAG_NONE, s->id, NGHTTP2_INTERNAL_ERROR);
    } else {
        nghttp2_session_resume_data(s->conn->session, s->id);
    }
}
