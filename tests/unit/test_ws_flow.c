/*
 * tests/unit/test_ws_flow.c — a WebSocket connection's output flow control (api/ws.h), driven
 * without a socket: the test plays the socket layer, taking all of conn->out and saying so
 * (kd_http_conn_output_taken), as server.c does after each write. Output moves on those events
 * alone, a bounded piece at a time and in order; on_drained fires at the first event that brings
 * the unsent output down to the low-water mark, never before and only once; what on_drained sends
 * follows what was queued before it; the stall limit is one one-shot loop timer (no polling),
 * which closes the connection with 1008 after the queued messages; and a drain leaves an
 * upgraded connection to its protocol.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <uv.h>

#include "http-conn-util.h"
#include "http-conn.h"
#include "ws.h"

#define MSG_BYTES (1u << 20)
#define NMSG 10
#define LOW_WATER (3u << 20)
#define MARKER 0xee /* the fill of the message on_drained sends */

struct fixture {
    uv_loop_t loop;
    bool with_loop; /* kd_ws_new gets the loop: the stall limit applies */
    struct kd_http_service svc;
    struct kd_http_conn conn;
    struct kd_ws *ws;
    int drained, gone;
    bool send_on_drained;
    struct kd_buf wire; /* everything the socket layer took since the 101 */
};

static void on_message(void *ud, const uint8_t *msg, size_t len)
{
    (void)ud, (void)msg, (void)len;
}

static void on_gone(void *ud)
{
    ((struct fixture *)ud)->gone++;
}

static void on_drained(void *ud)
{
    struct fixture *f = ud;
    f->drained++;
    if (f->send_on_drained) {
        static uint8_t marker[64];
        memset(marker, MARKER, sizeof marker);
        assert_int_equal(kd_ws_send(f->ws, marker, sizeof marker), 0);
    }
}

static const struct kd_ws_handler handler = {
    .on_message = on_message,
    .on_gone = on_gone,
    .on_drained = on_drained,
};

static int handle_upgrade(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    struct fixture *f = ctx;
    int st = kd_ws_handshake(req, out);
    if (st == 101) {
        f->ws = kd_ws_new(req, f->with_loop ? &f->loop : NULL, 1u << 24, &handler, f);
        assert_non_null(f->ws);
    }
    return st;
}

static const struct kd_route routes[] = {{"/v1/tensor", KD_HTTP_GET, handle_upgrade, NULL}};

static int setup_with(void **state, bool with_loop)
{
    struct fixture *f = calloc(1, sizeof *f);
    assert_int_equal(uv_loop_init(&f->loop), 0);
    f->with_loop = with_loop;
    f->svc = (struct kd_http_service){
        .router = {routes, 1},
        .ctx = f,
        .max_header_bytes = 1024,
        .max_body_bytes = 100,
    };
    kd_http_conn_init(&f->conn, &f->svc);
    conn_feed(&f->conn, "GET /v1/tensor HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n");
    assert_true(f->conn.upgraded);
    assert_non_null(f->ws);
    expect_status(conn_take(&f->conn), 101);
    kd_http_conn_output_taken(&f->conn);
    *state = f;
    return 0;
}

static int setup(void **state)
{
    return setup_with(state, false);
}

static int setup_loop(void **state)
{
    return setup_with(state, true);
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    kd_http_conn_free(&f->conn); /* the connection goes first, as when its socket closes */
    assert_int_equal(f->gone, 1);
    kd_ws_free(f->ws);
    assert_int_equal(uv_run(&f->loop, UV_RUN_DEFAULT), 0); /* the stall timer's close */
    assert_int_equal(uv_loop_close(&f->loop), 0);
    kd_buf_free(&f->wire);
    free(f);
    return 0;
}

/* What the socket layer does once it wrote all of conn->out (server.c, send_output). */
static void socket_takes_all(struct fixture *f)
{
    assert_int_equal(kd_buf_append(&f->wire, f->conn.out.data, f->conn.out.len), 0);
    f->conn.out.len = 0;
    kd_http_conn_output_taken(&f->conn);
}

static void queue_messages(struct fixture *f)
{
    static uint8_t msg[MSG_BYTES];
    for (int i = 0; i < NMSG; i++) {
        memset(msg, i, sizeof msg);
        assert_int_equal(kd_ws_send(f->ws, msg, sizeof msg), 0);
        assert_true(f->conn.out.len <= KD_WS_OUT_CAP);
    }
    assert_true(kd_ws_unsent(f->ws) > LOW_WATER);
}

/* One frame the server wrote (unmasked); returns its length on the wire. */
static size_t next_frame(const uint8_t *p, size_t avail, unsigned *opcode, const uint8_t **payload, uint64_t *len)
{
    assert_true(avail >= 2);
    assert_true(p[0] & 0x80); /* FIN: kiln sends every message in one frame */
    assert_false(p[1] & 0x80);
    *opcode = p[0] & 0x0f;
    uint64_t n = p[1] & 0x7f;
    size_t hdr = 2;
    if (n == 126) {
        n = (uint64_t)p[2] << 8 | p[3];
        hdr = 4;
    } else if (n == 127) {
        n = 0;
        for (int i = 2; i < 10; i++)
            n = n << 8 | p[i];
        hdr = 10;
    }
    assert_true(avail >= hdr + n);
    *payload = p + hdr;
    *len = n;
    return hdr + (size_t)n;
}

/* The NMSG messages, whole and in order, at the start of the wire; returns where they end. */
static size_t expect_messages(const struct fixture *f)
{
    const uint8_t *w = (const uint8_t *)f->wire.data;
    size_t off = 0;
    for (int i = 0; i < NMSG; i++) {
        unsigned op;
        const uint8_t *pl;
        uint64_t n;
        off += next_frame(w + off, f->wire.len - off, &op, &pl, &n);
        assert_int_equal(op, 2); /* binary */
        assert_int_equal(n, MSG_BYTES);
        assert_int_equal(pl[0], i);
        assert_int_equal(pl[MSG_BYTES - 1], i);
    }
    return off;
}

static void test_drained_exactly_at_low_water(void **state)
{
    struct fixture *f = *state;
    queue_messages(f);
    kd_ws_wait_drain(f->ws, LOW_WATER, 0);
    assert_int_equal(f->drained, 0); /* never from within the call */
    int events = 0, drained_at = 0;
    while (f->conn.out.len > 0) {
        socket_takes_all(f);
        events++;
        assert_true(f->conn.out.len <= KD_WS_OUT_CAP);
        /* due from the first event that leaves the unsent output at the mark, and only once */
        assert_int_equal(f->drained, kd_ws_unsent(f->ws) <= LOW_WATER ? 1 : 0);
        if (f->drained && !drained_at)
            drained_at = events;
    }
    assert_true(drained_at > 1); /* the first pieces left more than the mark */
    assert_int_equal(f->drained, 1);
    assert_int_equal(kd_ws_unsent(f->ws), 0);
    assert_int_equal(expect_messages(f), f->wire.len);
}

/* Nothing moves without the socket layer: the queue stays put until conn->out is taken. */
static void test_output_moves_only_when_taken(void **state)
{
    struct fixture *f = *state;
    queue_messages(f);
    uint64_t unsent = kd_ws_unsent(f->ws);
    size_t piece = f->conn.out.len;
    assert_true(piece > 0 && piece <= KD_WS_OUT_CAP);
    kd_ws_wait_drain(f->ws, LOW_WATER, 0);
    assert_int_equal(kd_ws_unsent(f->ws), unsent);
    assert_int_equal(f->conn.out.len, piece);
    socket_takes_all(f);
    assert_true(kd_ws_unsent(f->ws) < unsent);
    assert_true(f->conn.out.len > 0); /* the next piece, handed over at once */
}

/* A message on_drained sends goes out after everything queued before it. */
static void test_send_from_on_drained_keeps_order(void **state)
{
    struct fixture *f = *state;
    f->send_on_drained = true;
    queue_messages(f);
    kd_ws_wait_drain(f->ws, LOW_WATER, 0);
    while (f->conn.out.len > 0)
        socket_takes_all(f);
    assert_int_equal(f->drained, 1);
    size_t off = expect_messages(f);
    unsigned op;
    const uint8_t *pl;
    uint64_t n;
    off += next_frame((const uint8_t *)f->wire.data + off, f->wire.len - off, &op, &pl, &n);
    assert_int_equal(op, 2);
    assert_int_equal(n, 64);
    assert_int_equal(pl[0], MARKER);
    assert_int_equal(off, f->wire.len);
}

static void count_active(uv_handle_t *h, void *arg)
{
    int *timers = arg;
    if (!uv_is_active(h))
        return;
    assert_int_equal(h->type, UV_TIMER);
    assert_int_equal(uv_timer_get_repeat((uv_timer_t *)h), 0); /* one-shot: a deadline, not a poll */
    (*timers)++;
}

/* A client that reads nothing: one one-shot timer at the stall deadline, then 1008 after the queue. */
static void test_stall_closes_after_queued(void **state)
{
    struct fixture *f = *state;
    queue_messages(f);
    socket_takes_all(f); /* one piece is taken, then the client stops reading */
    kd_ws_wait_drain(f->ws, LOW_WATER, 20);
    int timers = 0;
    uv_walk(&f->loop, count_active, &timers);
    assert_int_equal(timers, 1);
    /* The loop runs until it has nothing left to wait for: the deadline passes once. */
    assert_int_equal(uv_run(&f->loop, UV_RUN_DEFAULT), 0);
    assert_int_equal(f->drained, 0);
    assert_false(kd_ws_open(f->ws));
    assert_true(f->conn.closing); /* read shut down and the close frame handed over */
    assert_int_equal(kd_buf_append(&f->wire, f->conn.out.data, f->conn.out.len), 0);
    f->conn.out.len = 0;
    size_t off = expect_messages(f);
    unsigned op;
    const uint8_t *pl;
    uint64_t n;
    off += next_frame((const uint8_t *)f->wire.data + off, f->wire.len - off, &op, &pl, &n);
    assert_int_equal(op, 8); /* close */
    assert_true(n > 2);
    assert_int_equal(pl[0] << 8 | pl[1], KD_WS_POLICY_VIOLATION);
    char reason[128];
    snprintf(reason, sizeof reason, "%.*s", (int)(n - 2), (const char *)pl + 2);
    assert_non_null(strstr(reason, "read none of its replies for 20 ms"));
    assert_int_equal(off, f->wire.len);
}

/* A wait that ends in on_drained leaves no timer behind: its deadline goes with it. */
static void test_drained_wait_leaves_no_timer(void **state)
{
    struct fixture *f = *state;
    queue_messages(f);
    kd_ws_wait_drain(f->ws, LOW_WATER, 60000);
    while (f->conn.out.len > 0)
        socket_takes_all(f);
    assert_int_equal(f->drained, 1);
    int timers = 0;
    uv_walk(&f->loop, count_active, &timers);
    assert_int_equal(timers, 0);
    assert_int_equal(uv_run(&f->loop, UV_RUN_NOWAIT), 0);
    assert_true(kd_ws_open(f->ws));
}

/* The drain leaves an upgraded connection open: its protocol says when it ends. */
static void test_drain_leaves_upgraded_alone(void **state)
{
    struct fixture *f = *state;
    kd_http_conn_drain(&f->conn);
    assert_false(f->conn.closing);
    assert_true(kd_ws_open(f->ws));
    static const uint8_t hi[] = {1, 2, 3};
    assert_int_equal(kd_ws_send(f->ws, hi, sizeof hi), 0);
    kd_ws_close(f->ws, KD_WS_GOING_AWAY, "the server is shutting down");
    assert_true(f->conn.closing); /* once the close frame is handed over */
    socket_takes_all(f);
    unsigned op;
    const uint8_t *pl;
    uint64_t n;
    size_t off = next_frame((const uint8_t *)f->wire.data, f->wire.len, &op, &pl, &n);
    assert_int_equal(op, 2);
    next_frame((const uint8_t *)f->wire.data + off, f->wire.len - off, &op, &pl, &n);
    assert_int_equal(op, 8);
    assert_int_equal(pl[0] << 8 | pl[1], KD_WS_GOING_AWAY);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_drained_exactly_at_low_water, setup, teardown),
        cmocka_unit_test_setup_teardown(test_output_moves_only_when_taken, setup, teardown),
        cmocka_unit_test_setup_teardown(test_send_from_on_drained_keeps_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stall_closes_after_queued, setup_loop, teardown),
        cmocka_unit_test_setup_teardown(test_drained_wait_leaves_no_timer, setup_loop, teardown),
        cmocka_unit_test_setup_teardown(test_drain_leaves_upgraded_alone, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
