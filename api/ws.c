/*
 * api/ws.c — WebSocket connections on top of http_conn, with wslay doing the framing.
 *
 * wslay's event API is fed from memory: feed points it at the bytes just read and runs
 * wslay_event_recv, whose receive callback hands those bytes out and then says "would block";
 * its send callback appends frames to the connection's output buffer, which the socket layer
 * writes, a bounded piece at a time: each time the socket layer took the piece (output_taken),
 * the next one follows (ws.h, "Output flow control"). Nothing here ever waits. A connection is
 * finished once wslay wants neither to read (close received, a protocol error, or our own close)
 * nor to write (the close frame is out); the socket layer then shuts it down.
 *
 * The handshake's Sec-WebSocket-Accept is base64(SHA-1(key + GUID)) (RFC 6455 section 4.2.2);
 * SHA-1 is written out here from FIPS 180-4 rather than pulling a crypto library in for 20 bytes
 * of handshake.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <wslay/wslay.h>

#include "ws-key.h"

#include "responses.h"
#include "ws.h"

/*
 * The frame headers in the byte stream, followed beside wslay. wslay checks a frame's declared
 * length against the message limit only once some of its payload has arrived, so a peer could
 * announce a huge frame and leave the connection waiting; this sees the length in the header and
 * closes with 1009 at once.
 */
struct frame_watch {
    uint8_t hdr[14]; /* the header being read (2 to 14 bytes) */
    size_t have, need;
    uint64_t payload_left; /* payload bytes of the current frame still to pass */
    uint64_t msg_bytes;    /* declared so far for the data message being reassembled */
    bool refused;          /* a frame was refused: nothing more is looked at */
    bool bad_control;      /* ... being a control frame RFC 6455 forbids, not one too big */
};

struct kd_ws {
    wslay_event_context_ptr ctx;
    uint64_t max_message_bytes;
    struct frame_watch watch;
    struct kd_http_conn *conn; /* NULL once the connection is gone */
    const struct kd_ws_handler *h;
    void *ud;
    const char *in; /* during feed: bytes not yet given to wslay */
    size_t in_len;
    /* inside feed or output_taken: the socket layer writes what was queued once the call
     * returns, so it is not woken from within */
    bool in_conn_call;
    bool gone_sent;
    /* output flow control (ws.h) */
    bool uncapped; /* closing: what is queued goes out whole, the close frame after it */
    bool waiting;  /* kd_ws_wait_drain: on_drained is due at low_water */
    uint64_t low_water, stall_ms;
    uv_timer_t *stall_timer; /* fires stall_ms after the wait began or output last moved; NULL
                              * without a loop or once the connection is gone */
};

/* ---- handshake ------------------------------------------------------------------------------ */

void kd_ws_accept_key(const char *key, char out[29])
{
    kiln__ws_accept_key(key, out);
}

static bool has_token(const char *list, const char *token)
{
    size_t tn = strlen(token);
    for (const char *p = list; *p;) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        const char *end = p;
        while (*end && *end != ',')
            end++;
        const char *e = end;
        while (e > p && (e[-1] == ' ' || e[-1] == '\t'))
            e--;
        if ((size_t)(e - p) == tn && strncasecmp(p, token, tn) == 0)
            return true;
        p = end;
    }
    return false;
}

/* A key is base64 of 16 bytes: 22 characters of the alphabet and "==". */
static bool key_valid(const char *k)
{
    if (strlen(k) != 24 || strcmp(k + 22, "==") != 0)
        return false;
    for (int i = 0; i < 22; i++)
        if (!isalnum((unsigned char)k[i]) && k[i] != '+' && k[i] != '/')
            return false;
    return true;
}

int kd_ws_handshake(const struct kd_request *req, struct kd_buf *out)
{
    const struct kd_http_headers *h = req->headers;
    if (!h || strcasecmp(h->upgrade, "websocket") != 0 || !has_token(h->connection, "upgrade"))
        return kd_resp_error(out, 400,
                             "/v1/tensor is a WebSocket: send Upgrade: websocket and Connection: Upgrade",
                             req->keep_alive, NULL);
    if (strcmp(h->ws_version, "13") != 0)
        return kd_resp_error(out, 426, "unsupported Sec-WebSocket-Version; kilnd speaks 13", req->keep_alive,
                             "Sec-WebSocket-Version: 13\r\n");
    if (!key_valid(h->ws_key))
        return kd_resp_error(out, 400, "Sec-WebSocket-Key must be 16 bytes in base64", req->keep_alive, NULL);
    char accept[29];
    kd_ws_accept_key(h->ws_key, accept);
    if (kd_buf_printf(out,
                      "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      "Sec-WebSocket-Accept: %s\r\n\r\n",
                      accept) != 0)
        return -1;
    return 101;
}

/* ---- framing -------------------------------------------------------------------------------- */

static ssize_t recv_cb(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, int flags, void *user)
{
    (void)flags;
    struct kd_ws *ws = user;
    if (ws->in_len == 0) {
        wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
        return -1;
    }
    size_t n = len < ws->in_len ? len : ws->in_len;
    memcpy(buf, ws->in, n);
    ws->in += n;
    ws->in_len -= n;
    return (ssize_t)n;
}

static ssize_t send_cb(wslay_event_context_ptr ctx, const uint8_t *data, size_t len, int flags, void *user)
{
    (void)flags;
    struct kd_ws *ws = user;
    if (ws->conn && !ws->uncapped) {
        /* Past the cap the rest waits in wslay's queue (counted by kd_ws_unsent); wslay keeps
         * a frame's unsent tail and offers it again on the next wslay_event_send. */
        size_t used = ws->conn->out.len;
        if (used >= KD_WS_OUT_CAP) {
            wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
            return -1;
        }
        if (len > KD_WS_OUT_CAP - used)
            len = KD_WS_OUT_CAP - used;
    }
    if (!ws->conn || kd_buf_append(&ws->conn->out, data, len) != 0) {
        wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
        return -1;
    }
    return (ssize_t)len;
}

static void on_msg(wslay_event_context_ptr ctx, const struct wslay_event_on_msg_recv_arg *arg, void *user)
{
    struct kd_ws *ws = user;
    if (!ws->conn || !wslay_event_get_read_enabled(ctx))
        return;
    if (arg->opcode == WSLAY_BINARY_FRAME)
        ws->h->on_message(ws->ud, arg->msg, arg->msg_length);
    else if (arg->opcode == WSLAY_TEXT_FRAME)
        kd_ws_close(ws, KD_WS_UNSUPPORTED_DATA, "text frames are not accepted: send binary messages");
    /* ping, pong and close are wslay's own business */
}

static const struct wslay_event_callbacks callbacks = {
    .recv_callback = recv_cb,
    .send_callback = send_cb,
    .on_msg_recv_callback = on_msg,
};

/* Writes what wslay queued and decides whether the connection is finished. */
static void pump(struct kd_ws *ws)
{
    if (!ws->conn)
        return;
    if (wslay_event_want_write(ws->ctx) && wslay_event_send(ws->ctx) != 0) {
        ws->conn->failed = true; /* out of memory: close without ceremony */
        return;
    }
    if (!wslay_event_want_read(ws->ctx) && !wslay_event_want_write(ws->ctx))
        ws->conn->closing = true;
}

/* A complete header: true when its frame would take the message past max, or is a control
 * frame over 125 bytes or fragmented (RFC 6455 5.5; bad_control is set): refused with a close
 * frame saying which, where wslay would drop the connection without one. */
static bool frame_refused(struct frame_watch *w, uint64_t max)
{
    const uint8_t *h = w->hdr;
    uint64_t len = h[1] & 0x7f;
    if (len == 126)
        len = (uint64_t)h[2] << 8 | h[3];
    else if (len == 127)
        for (int i = 2; i < 10; i++)
            len = (i == 2 ? 0 : len << 8) | h[i];
    w->payload_left = len;
    unsigned opcode = h[0] & 0x0f;
    if (opcode >= 8) {
        w->bad_control = len > 125 || !(h[0] & 0x80);
        return w->bad_control;
    }
    if (opcode != 0)
        w->msg_bytes = 0; /* a new message; 0 continues the current one */
    if (len > max - w->msg_bytes)
        return true;
    w->msg_bytes = h[0] & 0x80 ? 0 : w->msg_bytes + len;
    return false;
}

/*
 * Follows the frames in data. Returns how many bytes precede a frame whose header declares more
 * than max (the header may have begun in an earlier call: then 0), or len when none does.
 */
static size_t watch_frames(struct frame_watch *w, const uint8_t *data, size_t len, uint64_t max)
{
    size_t i = 0, start = 0;
    while (i < len && !w->refused) {
        if (w->payload_left) {
            size_t skip = w->payload_left < len - i ? (size_t)w->payload_left : len - i;
            i += skip;
            w->payload_left -= skip;
            continue;
        }
        if (w->have == 0) {
            start = i;
            w->need = 2;
        }
        w->hdr[w->have++] = data[i++];
        if (w->have == 2)
            w->need = 2 +
                      ((w->hdr[1] & 0x7f) == 126   ? 2
                       : (w->hdr[1] & 0x7f) == 127 ? 8
                                                   : 0) +
                      (w->hdr[1] & 0x80 ? 4 : 0);
        if (w->have < w->need)
            continue;
        w->have = 0;
        if (frame_refused(w, max)) {
            w->refused = true;
            return start;
        }
    }
    return len;
}

static void up_feed(void *ud, const char *data, size_t len)
{
    struct kd_ws *ws = ud;
    size_t ok = ws->watch.refused ? len
                                  : watch_frames(&ws->watch, (const uint8_t *)data, len, ws->max_message_bytes);
    ws->in = data;
    ws->in_len = ok;
    ws->in_conn_call = true;
    int rc = wslay_event_recv(ws->ctx);
    if (rc == 0 && ok < len && ws->watch.bad_control)
        kd_ws_close(ws, KD_WS_PROTOCOL_ERROR, "a control frame is at most 125 bytes and not fragmented");
    else if (rc == 0 && ok < len)
        kd_ws_close(ws, KD_WS_TOO_BIG, "message larger than the session allows");
    ws->in_conn_call = false;
    ws->in_len = 0;
    if (rc != 0 && ws->conn) {
        ws->conn->failed = true;
        return;
    }
    pump(ws);
}

/* ---- output flow control (ws.h) -------------------------------------------------------------- */

static void free_timer(uv_handle_t *h)
{
    free(h);
}

/* The timer is its own allocation, so ws may be freed before the timer's close completes. */
static void close_stall_timer(struct kd_ws *ws)
{
    if (ws->stall_timer) {
        uv_close((uv_handle_t *)ws->stall_timer, free_timer);
        ws->stall_timer = NULL;
    }
}

static void stop_waiting(struct kd_ws *ws)
{
    ws->waiting = false;
    if (ws->stall_timer)
        uv_timer_stop(ws->stall_timer);
}

static void on_stall(uv_timer_t *t)
{
    struct kd_ws *ws = t->data;
    if (!ws->waiting)
        return;
    char why[100];
    snprintf(why, sizeof why, "the client read none of its replies for %llu ms; closing",
             (unsigned long long)ws->stall_ms);
    kd_ws_close(ws, KD_WS_POLICY_VIOLATION, why);
}

/* (Re)starts the stall clock of a wait: output moved, or the wait began. */
static void arm_stall(struct kd_ws *ws)
{
    if (ws->stall_timer && ws->stall_ms)
        uv_timer_start(ws->stall_timer, on_stall, ws->stall_ms, 0);
}

/*
 * The socket layer took all of conn->out: hand it the next piece from wslay's queue. That is
 * progress for a wait, which ends here once the unsent output is down to its low-water mark.
 */
static void up_output_taken(void *ud)
{
    struct kd_ws *ws = ud;
    ws->in_conn_call = true;
    pump(ws);
    if (ws->conn && ws->waiting && kd_ws_unsent(ws) <= ws->low_water) {
        stop_waiting(ws);
        if (ws->h->on_drained)
            ws->h->on_drained(ws->ud);
    } else if (ws->conn && ws->waiting) {
        arm_stall(ws);
    }
    ws->in_conn_call = false;
    pump(ws); /* whatever on_drained queued */
}

void kd_ws_wait_drain(struct kd_ws *ws, uint64_t low_water, uint64_t stall_ms)
{
    if (!ws->conn)
        return;
    ws->waiting = true;
    ws->low_water = low_water;
    ws->stall_ms = stall_ms;
    if (ws->stall_timer)
        uv_timer_stop(ws->stall_timer);
    arm_stall(ws);
}

/* ---- lifetime ------------------------------------------------------------------------------- */

static void gone(struct kd_ws *ws)
{
    stop_waiting(ws);
    close_stall_timer(ws);
    ws->conn = NULL;
    if (!ws->gone_sent) {
        ws->gone_sent = true;
        ws->h->on_gone(ws->ud);
    }
}

static void up_eof(void *ud)
{
    (void)ud; /* the connection closes; detach follows */
}

static void up_detach(void *ud)
{
    gone(ud);
}

static const struct kd_http_upgrade_ops upgrade_ops = {
    .feed = up_feed,
    .eof = up_eof,
    .detach = up_detach,
    .output_taken = up_output_taken,
};

struct kd_ws *kd_ws_new(const struct kd_request *req, uv_loop_t *loop, uint64_t max_message_bytes,
                        const struct kd_ws_handler *h, void *ud)
{
    struct kd_ws *ws = calloc(1, sizeof *ws);
    if (!ws)
        return NULL;
    if (wslay_event_context_server_init(&ws->ctx, &callbacks, ws) != 0) {
        free(ws);
        return NULL;
    }
    if (loop) {
        ws->stall_timer = malloc(sizeof *ws->stall_timer);
        if (!ws->stall_timer) {
            wslay_event_context_free(ws->ctx);
            free(ws);
            return NULL;
        }
        uv_timer_init(loop, ws->stall_timer);
        ws->stall_timer->data = ws;
    }
    wslay_event_config_set_max_recv_msg_length(ws->ctx, max_message_bytes);
    ws->max_message_bytes = max_message_bytes;
    ws->h = h;
    ws->ud = ud;
    ws->conn = req->conn;
    if (kd_http_upgrade(req, &upgrade_ops, ws) != 0) {
        close_stall_timer(ws);
        wslay_event_context_free(ws->ctx);
        free(ws);
        return NULL;
    }
    return ws;
}

int kd_ws_send(struct kd_ws *ws, const void *msg, size_t len)
{
    if (!kd_ws_open(ws))
        return -1;
    struct wslay_event_msg m = {.opcode = WSLAY_BINARY_FRAME, .msg = msg, .msg_length = len};
    if (wslay_event_queue_msg(ws->ctx, &m) != 0)
        return -1;
    if (!ws->in_conn_call) {
        pump(ws);
        if (ws->conn && ws->conn->wake)
            ws->conn->wake(ws->conn->wake_ud);
    }
    return 0;
}

void kd_ws_close(struct kd_ws *ws, uint16_t code, const char *reason)
{
    if (!ws->conn || !wslay_event_get_write_enabled(ws->ctx))
        return;
    size_t n = reason ? strlen(reason) : 0;
    if (n > 122)
        n = 122;
    if (wslay_event_get_read_enabled(ws->ctx))
        wslay_event_shutdown_read(ws->ctx);
    stop_waiting(ws);
    /* What is queued is bounded by its sender's wait for drain (tensor-session.c); it goes out
     * whole, so that nothing queued before the close is dropped behind it. */
    ws->uncapped = true;
    /* wslay sends control frames before queued messages: write what is queued (an ERROR saying
     * why) first, or the close would overtake it and the message would be dropped. */
    if (wslay_event_want_write(ws->ctx) && wslay_event_send(ws->ctx) != 0) {
        ws->conn->failed = true;
        return;
    }
    if (!wslay_event_get_close_sent(ws->ctx))
        wslay_event_queue_close(ws->ctx, code, (const uint8_t *)reason, n);
    if (!ws->in_conn_call) {
        pump(ws);
        if (ws->conn && ws->conn->wake)
            ws->conn->wake(ws->conn->wake_ud);
    }
}

bool kd_ws_open(const struct kd_ws *ws)
{
    return ws && ws->conn && !ws->conn->closing && wslay_event_get_write_enabled(ws->ctx) &&
           !wslay_event_get_close_sent(ws->ctx);
}

void kd_ws_free(struct kd_ws *ws)
{
    if (!ws)
        return;
    close_stall_timer(ws);
    if (ws->conn) {
        /* The connection outlives us: it must not call back into freed memory. */
        ws->conn->up_ops = NULL;
        ws->conn->closing = true;
        if (ws->conn->wake)
            ws->conn->wake(ws->conn->wake_ud);
    }
    wslay_event_context_free(ws->ctx);
    free(ws);
}

uint64_t kd_ws_unsent(const struct kd_ws *ws)
{
    if (!ws || !ws->conn)
        return 0;
    return (uint64_t)wslay_event_get_queued_msg_length(ws->ctx) + ws->conn->out.len;
}
