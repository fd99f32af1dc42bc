/*
 * api/grpc/grpc.h — the KServe v2 gRPC service (inference.GRPCInferenceService) on its own port.
 *
 * HTTP/2 is nghttp2's, messages are protobuf-c's, generated at build time from api/proto/. The
 * service runs on the daemon's libuv loop and serves the same model table (api/serving.h) through
 * the same scheduler as the HTTP endpoints: after a request is decoded, the path is the same.
 * Plain-text HTTP/2 only (prior knowledge, as gRPC clients speak it): TLS is the ingress's job.
 *
 * Thread affinity: every call runs on the loop thread.
 *
 *     struct kiln_grpc *g;
 *     kiln_grpc_new(&g, loop, &opts);            // opts.serving: the model table
 *     kiln_grpc_listen(g, err, sizeof err);      // then kiln_grpc_port(g)
 *     ... uv_run ...
 *     kiln_grpc_drain(g, on_drained, ud);        // on SIGTERM; close_all at the deadline
 *     kiln_grpc_free(g);                         // after the loop delivered the closes
 */
#ifndef KILN_API_GRPC_H
#define KILN_API_GRPC_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "config.h"
#include "serving.h"

struct kiln_grpc_options {
    const char *host;
    int port;                           /* 0 picks a free port */
    struct kiln_serving *serving;       /* borrowed; NULL answers every model call UNAVAILABLE */
    uint64_t max_message_bytes;         /* a message's length prefix past this is RESOURCE_EXHAUSTED */
    uint32_t max_concurrent_streams;    /* SETTINGS_MAX_CONCURRENT_STREAMS, per connection */
    size_t max_header_bytes;            /* a stream's header block past this is refused */
    uint64_t idle_timeout_ms;           /* a connection with no open stream closes after this */
    const char *const *extensions;      /* ServerMetadata's list */
    void (*log)(void *ud, enum kiln_log_level level, const char *msg);
    void *log_ud;
};

struct kiln_grpc;

int kiln_grpc_new(struct kiln_grpc **out, uv_loop_t *loop, const struct kiln_grpc_options *o);
/* Binds and listens; on failure writes the reason to err and returns a negative libuv code. */
int kiln_grpc_listen(struct kiln_grpc *g, char *err, size_t errlen);
int kiln_grpc_port(const struct kiln_grpc *g);
/*
 * Stops accepting and sends GOAWAY on every connection: streams open now finish, and each
 * connection closes when its last one has. done (may be NULL) runs once every one has closed.
 */
void kiln_grpc_drain(struct kiln_grpc *g, void (*done)(void *ud), void *ud);
/* Open connections. */
size_t kiln_grpc_connections(const struct kiln_grpc *g);
/* Closes the listener and every connection now (their queued requests are cancelled). */
void kiln_grpc_close_all(struct kiln_grpc *g);
/* Frees the service; close_all first and run the loop so the handles have closed. */
void kiln_grpc_free(struct kiln_grpc *g);

/*
 * For the fuzzer and tests: a connection with no socket, fed bytes as if they came from one;
 * what it would send is dropped. Returns -1 once the connection would have closed.
 */
struct kiln_grpc_conn;
struct kiln_grpc_conn *kiln_grpc_conn_detached(struct kiln_grpc *g);
int kiln_grpc_conn_feed(struct kiln_grpc_conn *c, const uint8_t *data, size_t len);
void kiln_grpc_conn_free(struct kiln_grpc_conn *c);

#endif /* KILN_API_GRPC_H */
