/*
 * backends/remote/remote-impl.h — what the remote backend's two halves share: the connection
 * (remote-conn.c: TCP, the WebSocket upgrade and wslay's client-side framing, all with timeouts)
 * and the backend proper (remote.c: ids, batching, replies).
 *
 * Thread affinity: a connection is used by one thread at a time; the backend holds its device's
 * mutex around every call into it.
 */
#ifndef KILN_REMOTE_IMPL_H
#define KILN_REMOTE_IMPL_H

#include <stddef.h>
#include <stdint.h>

struct kiln__rconn;

/** Called once per complete binary WebSocket message; p is valid during the call only. */
typedef void (*kiln__rconn_msg_fn)(void *ud, const uint8_t *p, size_t n);

/**
 * Connects to host:port (TCP_NODELAY), upgrades GET /v1/tensor to a WebSocket, sending
 * "Authorization: Bearer token" when token is non-empty. timeout_ms bounds the connect and every
 * later wait for the peer. NULL with why set (naming the address and what failed).
 */
struct kiln__rconn *kiln__rconn_open(const char *host, int port, const char *token, int timeout_ms,
                                     kiln__rconn_msg_fn on_msg, void *ud, char *why, size_t why_len);

/** Sends one binary message, framed by wslay and written with one write call where the socket
 *  takes it. 0, or -1 with why set (the connection is then unusable). */
int kiln__rconn_send(struct kiln__rconn *c, const uint8_t *p, size_t n, char *why, size_t why_len);

/**
 * Reads what the peer sent and hands complete messages to on_msg. With wait set it blocks until
 * at least some bytes arrive (at most the timeout); without, it only takes what is already there.
 * 0, or -1 with why set: timeout, the peer closed (its close reason included), a socket or
 * framing error. After -1 the connection is unusable.
 */
int kiln__rconn_pump(struct kiln__rconn *c, int wait, char *why, size_t why_len);

/** Sends a close frame where possible and frees everything. NULL is fine. */
void kiln__rconn_close(struct kiln__rconn *c);


#endif /* KILN_REMOTE_IMPL_H */
