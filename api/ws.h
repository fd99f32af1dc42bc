/*
 * api/ws.h — the WebSocket side of a connection (RFC 6455), framed by wslay.
 *
 * kd_ws_handshake checks an upgrade request and appends the 101 answer; kd_ws_new then takes
 * the connection over (kd_http_upgrade). wslay does the framing: masking, fragmented messages
 * reassembled, ping answered with pong, the close handshake, and the message size limit. wslay
 * applies that limit only once a frame's payload starts to arrive, so ws.c also reads each frame
 * header's declared length as it comes: a frame that would take its message past the limit is
 * closed with 1009 at its header. Only complete binary messages reach the handler; a text frame
 * closes the connection with 1003.
 *
 * Lifetime: the connection may go away at any time (peer gone, daemon stopping); the handler's
 * gone callback then runs once and kd_ws_send quietly fails from there on. Whoever owns the
 * handler frees the kd_ws with kd_ws_free when it is done with it, which may be later (a
 * session whose work is still on a device worker).
 *
 * Thread affinity: everything here runs on the I/O loop thread.
 */
#ifndef KD_API_WS_H
#define KD_API_WS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "buf.h"
#include "http-conn.h"
#include "router.h"

/* Close codes kiln sends (RFC 6455 section 7.4.1). */
#define KD_WS_NORMAL 1000
#define KD_WS_GOING_AWAY 1001
#define KD_WS_PROTOCOL_ERROR 1002
#define KD_WS_UNSUPPORTED_DATA 1003
#define KD_WS_POLICY_VIOLATION 1008
#define KD_WS_TOO_BIG 1009
#define KD_WS_INTERNAL_ERROR 1011

struct kd_ws_handler {
    /* One complete binary message; msg is valid only during the call. */
    void (*on_message)(void *ud, const uint8_t *msg, size_t len);
    /* The connection is gone (closed by either side or cut); called exactly once. */
    void (*on_gone)(void *ud);
    /* Optional: the unsent output fell to the mark kd_ws_wait_drain named (see there). */
    void (*on_drained)(void *ud);
};

/*
 * Output flow control. The socket layer takes a connection's output from conn->out whenever it
 * can write, and stops reading the connection while more than its backlog (server.c's
 * BACKLOG_HIGH, 1 MiB) is unsent. ws.c hands it at most KD_WS_OUT_CAP at a time, above that
 * backlog, so a peer that does not read stops being read; the rest waits in wslay's queue, where
 * kd_ws_unsent counts it. Each time the socket layer took all of conn->out (output_taken in
 * http-conn.h) ws.c hands it the next piece and checks kd_ws_wait_drain's low-water mark, so
 * output moves on socket events alone; the only timer is a waiting connection's stall deadline.
 */
#define KD_WS_OUT_CAP (4u << 20)

struct kd_ws;

/*
 * Checks that req is a WebSocket upgrade (GET, Upgrade: websocket, Connection: upgrade, version
 * 13, a 16-byte base64 key). On success appends the 101 response and returns 101; otherwise
 * appends the 400 (426 for another version) JSON error and returns its status, or -1 when out of
 * memory.
 */
int kd_ws_handshake(const struct kd_request *req, struct kd_buf *out);

/*
 * Takes req's connection over after kd_ws_handshake returned 101. Messages larger than
 * max_message_bytes close the connection with 1009. loop runs the stall deadline of
 * kd_ws_wait_drain (NULL: no stall limit). NULL when out of memory.
 */
struct kd_ws *kd_ws_new(const struct kd_request *req, uv_loop_t *loop, uint64_t max_message_bytes,
                        const struct kd_ws_handler *h, void *ud);

/* Queues one binary message. 0, or -1 when the connection is gone or closing. */
int kd_ws_send(struct kd_ws *ws, const void *msg, size_t len);

/* Bytes of queued messages not yet taken by the socket layer (wslay's queue and conn->out). */
uint64_t kd_ws_unsent(const struct kd_ws *ws);

/*
 * Asks for on_drained once kd_ws_unsent is at most low_water; call it only while it is above
 * (on_drained comes when the socket layer takes output, never from within this call). If no
 * output moves for stall_ms meanwhile (0: no limit; counted from this call and again from each
 * move), the connection is closed with 1008 and a reason saying so. Replaces an earlier wait.
 */
void kd_ws_wait_drain(struct kd_ws *ws, uint64_t low_water, uint64_t stall_ms);

/* Starts the close handshake with code and reason (shorter than 123 bytes); no more input is read. */
void kd_ws_close(struct kd_ws *ws, uint16_t code, const char *reason);

/* Whether the connection still exists and is not closing. */
bool kd_ws_open(const struct kd_ws *ws);

/* Frees ws; cuts the connection first if it still exists (without calling on_gone). */
void kd_ws_free(struct kd_ws *ws);

/* The Sec-WebSocket-Accept value for key (28 characters and a NUL). Exposed for the tests. */
void kd_ws_accept_key(const char *key, char out[29]);

#endif /* KD_API_WS_H */
