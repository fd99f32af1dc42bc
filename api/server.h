/*
 * api/server.h — the HTTP server on a libuv loop: listening socket, connections, timers, writes.
 * Protocol decisions live in http-conn.c; this layer moves bytes, enforces the idle and request
 * timeouts, applies write back-pressure and closes connections cleanly.
 *
 * Thread affinity: every call runs on the thread that runs the loop.
 *
 *     struct kd_server *srv;
 *     kd_server_new(&srv, loop, &opts);       // opts.service holds the router and limits
 *     kd_server_listen(srv, err, sizeof err); // then kd_server_port(srv)
 *     ... uv_run ...
 *     kd_server_drain(srv, on_drained, ud);   // on SIGTERM
 *     kd_server_free(srv);                    // after its handles have closed
 */
#ifndef KD_API_SERVER_H
#define KD_API_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "config.h"
#include "conn-limit.h"
#include "http-conn.h"
#include "metrics.h"

struct kd_server_options {
    const char *host;
    int port;                       /* 0 picks a free port */
    uint64_t idle_timeout_ms;
    uint64_t request_timeout_ms;
    struct kd_http_service service; /* observe is filled in by the server */
    struct kd_metrics *metrics;     /* borrowed; the server registers its families */
    struct kd_conn_limit *conn_limit; /* borrowed, shared with the gRPC service; NULL: no limit */
    void (*log)(void *ud, enum kd_log_level level, const char *msg);
    void *log_ud;
    enum kd_log_level log_level;
};

struct kd_server;

int kd_server_new(struct kd_server **out, uv_loop_t *loop, const struct kd_server_options *opts);
/* Binds and listens; on failure writes the reason to err and returns a negative libuv code. */
int kd_server_listen(struct kd_server *srv, char *err, size_t errlen);
int kd_server_port(const struct kd_server *srv);
size_t kd_server_connections(const struct kd_server *srv);

/*
 * Stops accepting, closes idle connections and lets busy ones finish their current request.
 * done runs once the listener and every connection have closed.
 */
void kd_server_drain(struct kd_server *srv, void (*done)(void *ud), void *ud);
/* Closes every connection now (the drain deadline passed). */
void kd_server_close_all(struct kd_server *srv);
/* Frees the server; its handles must have closed (run the loop after drain). */
void kd_server_free(struct kd_server *srv);

/* tcp's peer as "ip:port" ("[ip]:port" for IPv6; "-" when unknown), for logs. Also the gRPC service's. */
void kd_server_peer_name(uv_tcp_t *tcp, char *out, size_t n);
/* The same for a socket descriptor, before it has a handle (a connection being refused). */
void kd_peer_name(int fd, char *out, size_t n);

#endif /* KD_API_SERVER_H */
