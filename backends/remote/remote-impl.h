/*
 * backends/remote/remote-impl.h — what the remote backend's parts share: the connection
 * (remote-conn.c: TCP, the WebSocket upgrade and wslay's client-side framing, all with timeouts),
 * the device (remote.c: ids, batching, replies, buffers, events) and the primitives with the
 * interface table (remote-ops.c).
 *
 * Thread affinity: a connection is used by one thread at a time; the backend holds its device's
 * mutex around every call into it.
 */
#ifndef KILN_REMOTE_IMPL_H
#define KILN_REMOTE_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "wire.h"

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

/* ---- the device (remote.c) ------------------------------------------------------------------------ */

/* A buffer is a client-chosen id on the server; freed ones wait in the device's pool. */
struct kiln_buffer {
    uint64_t id;
    size_t nbytes;
    struct kiln_buffer *next; /* in a pool bucket */
};

/* The device's interface entries (remote.c); ctx is the device. */
void *kiln__remote_open_opts(const char *spec, int index, kiln_device_opts *o);
void *kiln__remote_open(int index);
void kiln__remote_close(void *ctx);
void kiln__remote_caps(void *ctx, kiln_backend_caps *out);
/** Why the connection is gone ("remote://host:port/dev: connection lost: ..."), or NULL. */
const char *kiln__remote_lost(void *ctx);
kiln_buffer *kiln__remote_buffer_alloc(void *ctx, size_t nbytes);
void kiln__remote_buffer_free(void *ctx, kiln_buffer *b);
int kiln__remote_buffer_upload(void *ctx, kiln_buffer *dst, size_t off, const void *src, size_t n);
int kiln__remote_buffer_download(void *ctx, kiln_buffer *src, size_t off, void *dst, size_t n);
int kiln__remote_sync(void *ctx);
void *kiln__remote_queue_open(void *ctx);
kiln_backend_event *kiln__remote_event_record(void *ctx);
int kiln__remote_event_query(void *ctx, kiln_backend_event *e);
int kiln__remote_event_sync(void *ctx, kiln_backend_event *e);
void kiln__remote_event_free(void *ctx, kiln_backend_event *e);

/**
 * Queues one OP message on the device ctx without waiting. The op's own errors come back later
 * (the next download or sync reports them); only a dead connection fails here: KILN_EIO with the
 * error set naming the primitive.
 */
int kiln__remote_submit(void *ctx, kiln_wire_msg *m);

#endif /* KILN_REMOTE_IMPL_H */
