/*
 * backends/remote/remote-impl.h — what the remote backend's parts share: the connection
 * (remote-conn.c: TCP, the WebSocket upgrade and wslay's client-side framing, all with timeouts),
 * the device (remote.c: batching, replies, waits, events; remote-buffers.c: buffer ids, the pool
 * of freed buffers and the session's limits; remote-checks.c: range checks of indices) and the
 * primitives with the interface table (remote-ops.c).
 *
 * Thread affinity: a connection is used by one thread at a time; the backend holds its device's
 * mutex around every call into it.
 */
#ifndef KILN_REMOTE_IMPL_H
#define KILN_REMOTE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "error-impl.h"
#include "wire.h"

struct kiln__rconn;

/** Called once per complete binary WebSocket message; p is valid during the call only. */
typedef void (*kiln__rconn_msg_fn)(void *ud, const uint8_t *p, size_t n);

/**
 * Connects to host:port (TCP_NODELAY), upgrades GET /v1/tensor to a WebSocket, sending
 * "Authorization: Bearer token" when token is non-empty. timeout_ms bounds the connect and every
 * later wait for the peer; timeout_from says where it was set ("timeout_ms from the spec"), for
 * the message of a wait that runs out. NULL with why set (naming the address and what failed).
 */
struct kiln__rconn *kiln__rconn_open(const char *host, int port, const char *token, int timeout_ms,
                                     const char *timeout_from, kiln__rconn_msg_fn on_msg, void *ud, char *why,
                                     size_t why_len);

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

/* ---- the device (remote.c, remote-buffers.c) ---------------------------------------------------- */

/* A buffer is a client-chosen id on the server; freed ones wait in the device's pool. */
struct kiln_buffer {
    uint64_t id;
    size_t nbytes;
    struct kiln_buffer *next; /* in a pool bucket */
};

#define NAME_RING 1024 /* what each recent seq was, for error messages */
#define FLUSH_RING 256 /* batches sent and not yet answered */
#define POOL_BUCKETS 256
#define CHECKS_MAX 256 /* range checks between two reads (remote-checks.c) */

/* A DOWNLOAD waiting for its DATA. */
struct pend {
    uint64_t seq;
    uint8_t *dst;
    size_t n;
    bool done;
};

typedef struct rdev {
    pthread_mutex_t mu;
    struct kiln__rconn *conn;
    char spec[256];
    char device[KILN_WIRE_NAME_MAX + 1];
    int timeout_ms;
    /* WELCOME */
    uint16_t version;
    uint32_t dtype_mask;
    uint64_t max_message_bytes, max_live_bytes;
    uint32_t max_ids, max_queued_ops;
    bool welcomed;
    /* derived limits */
    size_t flush_bytes, chunk_bytes, rel_max;
    uint64_t window_msgs, flush_msgs;
    /* the batch being built */
    kiln_wire_buf batch;
    uint64_t batch_msgs;
    bool batch_answered; /* its last message gets an answer (DOWNLOAD, SYNC) */
    uint64_t seq;        /* last seq given to a message */
    uint64_t next_id;
    uint64_t *rel; /* ids to release with the next RELEASE */
    size_t nrel;
    uint64_t rel_bytes; /* their bytes */
    /* What the session holds on the server once every message appended so far has run (ids
     * in the pool included), the way the server counts it against max_live_bytes and max_ids:
     * so an ALLOC that cannot fit is refused here, at once, instead of failing on the server
     * and being reported at some later read. An ALLOC the server refused anyway is taken off
     * when its ERROR arrives. */
    uint64_t live_bytes, live_ids;
    /* what is on the wire */
    uint64_t sent_seq, acked_seq;
    uint64_t bytes_sent, bytes_acked;
    struct {
        uint64_t last_seq, end_bytes;
    } ring[FLUSH_RING];
    size_t ring_head, ring_n;
    /* waits */
    struct pend *pend;
    size_t npend, pend_cap;
    uint64_t sync_seq;
    bool sync_done;
    bool wait_failed;
    char wait_err[KILN_ERROR_MAX];
    /* the first error of a pipelined message (deferred_seq: that message's), reported by the next
     * download or sync */
    bool deferred;
    uint64_t deferred_seq;
    char deferred_err[KILN_ERROR_MAX];
    /* range checks (remote-checks.c): each writes its index's min and max into a slot of
     * check_buf; the next download or sync reads the slots (checks_read_seq) into check_vals */
    struct kiln_buffer *check_buf;
    int check_slots, nchecks, checks_reading;
    struct {
        uint64_t last_seq;
        int64_t lo, hi;
        kiln_dtype dtype;
        const char *op, *noun;
    } checks[CHECKS_MAX];
    uint64_t checks_read_seq;
    bool checks_read_ok;
    uint8_t check_vals[16 * CHECKS_MAX];
    struct {
        uint64_t seq;
        const char *what;
        uint64_t id, nbytes;
    } names[NAME_RING];
    /* ids whose ALLOC the server refused: never released nor pooled (usually none) */
    uint64_t *failed_ids;
    size_t nfailed, failed_cap;
    /* a lost connection or a broken protocol: every later call fails. lost mirrors dead for
     * kiln_device_lost, which reads it without the lock; dead_why is final once set. */
    bool dead;
    atomic_bool lost;
    char dead_why[KILN_ERROR_MAX];
    /* freed buffers kept for reuse, by exact size */
    struct kiln_buffer *pool[POOL_BUCKETS];
    uint64_t pool_bytes, pool_count, pool_max_bytes, pool_max_count;
} rdev;

/* Shared by the device's files (remote.c, remote-buffers.c, remote-checks.c); called with d->mu
 * held unless said otherwise. */

/** Appends m to the batch with the next seq (what names it in error messages). 0, or a
 *  negative code with the error set. */
int kiln__rdev_append(rdev *d, kiln_wire_msg *m, const char *what);
/** Appends a RELEASE of the ids held back in d->rel, if any. 0 or a negative code. */
int kiln__rdev_append_release(rdev *d);
/** Sends the batch (waiting while the server's queue is full). 0 or a negative code (KILN_EIO:
 *  the device died). */
int kiln__rdev_flush(rdev *d);
/** Sends the batch when it has grown large. 0 or a negative code (KILN_EIO: the device died). */
int kiln__rdev_maybe_flush(rdev *d);
/** Sends the batch and waits until the server has answered everything sent, keeping the errors
 *  of pipelined messages for the next download or sync. 0 or KILN_EIO (the device died). */
int kiln__rdev_settle(rdev *d);
/** Marks the device lost (why: what happened); returns KILN_EIO. */
int kiln__rdev_die(rdev *d, const char *why);
/** Sets the error of a call (what) on a lost device (why: its dead_why, copied); KILN_EIO. Called
 *  without d->mu held. */
int kiln__rdev_dead_error(const char *what, const char *why);
/** Frees the pool of freed buffers (remote-buffers.c), at close. */
void kiln__rdev_pool_free(rdev *d);
/** Appends the read of the range checks queued since the last wait (remote-checks.c), for a
 *  download or sync about to wait. 0 or a negative code. */
int kiln__rdev_checks_request(rdev *d);
/** The checks' values arrived (m: the DATA answering checks_read_seq). */
void kiln__rdev_checks_data(rdev *d, const kiln_wire_msg *m);
/** After the wait: the first violation among the checks read becomes the pending error, unless
 *  an earlier message failed first. */
void kiln__rdev_checks_verdict(rdev *d);

/* The device's interface entries (remote.c, remote-buffers.c); ctx is the device. */
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
int kiln__remote_index_check(void *ctx, const kiln_tdesc *index, int64_t lo, int64_t hi, const char *op,
                             const char *noun);

/**
 * Queues one OP message on the device ctx without waiting. The op's own errors come back later
 * (the next download or sync reports them); only a dead connection fails here: KILN_EIO with the
 * error set naming the primitive.
 */
int kiln__remote_submit(void *ctx, kiln_wire_msg *m);

#endif /* KILN_REMOTE_IMPL_H */
