/*
 * api/listener.h — a listening TCP socket on a libuv loop that accepts connections itself and
 * hands each accepted descriptor to its owner (the HTTP server, the gRPC service).
 *
 * It does not use uv_listen because of what libuv does when accept fails for lack of file
 * descriptors (EMFILE, ENFILE): it closes a spare descriptor, accepts and at once closes every
 * waiting connection, and reopens the spare; when the spare cannot be reopened (the descriptor
 * limit was lowered below it, or another thread took the slot) it calls accept again in a loop
 * that never returns to the event loop, reporting each failure. This listener instead stops
 * watching the socket, logs once, and tries again on a timer: waiting clients stay in the
 * kernel's listen backlog and are served once descriptors are free, and the loop keeps serving
 * the connections already open.
 *
 * Thread affinity: every call runs on the thread that runs the loop.
 *
 *     struct kd_listener l;
 *     kd_listener_open(&l, loop, "127.0.0.1", 0, "HTTP", on_accept, srv, log, log_ud, &port, err, sizeof err);
 *     ... uv_run ...  // on_accept(srv, fd): the callee owns fd (uv_tcp_open it, or close it)
 *     kd_listener_close(&l, on_closed, srv);  // on_closed runs once the socket is closed
 */
#ifndef KD_API_LISTENER_H
#define KD_API_LISTENER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "logf.h"

/* How long accepting pauses after it failed for lack of file descriptors. */
#define KD_LISTENER_RETRY_MS 250u

struct kd_listener {
    uv_loop_t *loop;
    uv_poll_t poll;   /* readable: connections wait to be accepted */
    uv_timer_t retry; /* ends a pause */
    int fd;
    int open_handles; /* 2 from kd_listener_open until both handles have closed */
    bool closing;
    const char *what; /* "HTTP", "gRPC": names the listener in log lines */
    void (*on_accept)(void *ud, int fd);
    void *ud;
    kd_log_sink_fn log;
    void *log_ud;
    void (*closed)(void *ud);
    void *closed_ud;
    /* A pause for lack of descriptors: when it began (0: not paused) and how many accept
     * attempts failed since, for the line that says accepting resumed. */
    uint64_t exhausted_since_ns;
    uint64_t exhausted_attempts;
};

/*
 * Resolves host and listens on it (port 0 picks a free port, written to *bound_port). 0, or a
 * libuv error code with err filled in; on failure nothing needs closing.
 */
int kd_listener_open(struct kd_listener *l, uv_loop_t *loop, const char *host, int port, const char *what,
                     void (*on_accept)(void *ud, int fd), void *ud, kd_log_sink_fn log, void *log_ud,
                     int *bound_port, char *err, size_t errlen);
/* Stops accepting and closes the socket; closed (may be NULL) runs once it is closed. Once only. */
void kd_listener_close(struct kd_listener *l, void (*closed)(void *ud), void *ud);
/* A connection closed, so a descriptor is free: a paused listener tries again now. */
void kd_listener_descriptor_freed(struct kd_listener *l);

#endif /* KD_API_LISTENER_H */
