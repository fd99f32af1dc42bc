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
 *     struct kd_grpc *g;
 *     kd_grpc_new(&g, loop, &opts);            // opts.serving: the model table
 *     kd_grpc_listen(g, err, sizeof err);      // then kd_grpc_port(g)
 *     ... uv_run ...
 *     kd_grpc_drain(g, on_drained, ud);        // on SIGTERM; close_all at the deadline
 *     kd_grpc_free(g);                         // after the loop delivered the closes
 */
#ifndef KD_API_GRPC_H
#define KD_API_GRPC_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "config.h"
#include "conn-limit.h"
#include "serving.h"

struct kd_grpc_options {
    const char *host;
    int port;                           /* 0 picks a free port */
    struct kd_serving *serving;         /* borrowed; NULL answers every model call UNAVAILABLE */
    uint64_t max_message_bytes;         /* a message's length prefix past this is RESOURCE_EXHAUSTED */
    uint32_t max_concurrent_streams;    /* SETTINGS_MAX_CONCURRENT_STREAMS, per connection */
    size_t max_header_bytes;            /* a stream's header block past this is refused */
    uint64_t idle_timeout_ms;           /* a connection with no open stream closes after this */
    struct kd_conn_limit *conn_limit;   /* borrowed, shared with the HTTP server; NULL: no limit */
    const char *const *extensions;      /* ServerMetadata's list */
    void (*log)(void *ud, enum kd_log_level level, const char *msg);
    void *log_ud;
    /* log_access: one info line per call as it ends, as HTTP's access log has per response:
     * `access grpc <method> <code> <ms>ms peer=<ip:port>` */
    bool log_access;
};

struct kd_grpc;

int kd_grpc_new(struct kd_grpc **out, uv_loop_t *loop, const struct kd_grpc_options *o);
/* Binds and listens; on failure writes the reason to err and returns a negative libuv code. */
int kd_grpc_listen(struct kd_grpc *g, char *err, size_t errlen);
int kd_grpc_port(const struct kd_grpc *g);
/*
 * Stops accepting and sends GOAWAY on every connection: streams open now finish, and each
 * connection closes when its last one has. done (may be NULL) runs once every one has closed.
 */
void kd_grpc_drain(struct kd_grpc *g, void (*done)(void *ud), void *ud);
/* Open connections. */
size_t kd_grpc_connections(const struct kd_grpc *g);
/* Closes the listener and every connection now (their queued requests are cancelled). */
void kd_grpc_close_all(struct kd_grpc *g);
/* Frees the service; close_all first and run the loop so the handles have closed. */
void kd_grpc_free(struct kd_grpc *g);

/*
 * For the fuzzer and tests: a connection with no socket, fed bytes as if they came from one;
 * what it would send is dropped. Returns -1 once the connection would have closed.
 */
struct kd_grpc_conn;
struct kd_grpc_conn *kd_grpc_conn_detached(struct kd_grpc *g);
int kd_grpc_conn_feed(struct kd_grpc_conn *c, const uint8_t *data, size_t len);
void kd_grpc_conn_free(struct kd_grpc_conn *c);

#endif /* KD_API_GRPC_H */
