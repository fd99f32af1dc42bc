/*
 * api/grpc/grpc-impl.h — what the gRPC service's files share: the connection and stream
 * structs (grpc-server.c owns them), the sending side (grpc-send.c), the method dispatch
 * (grpc-methods.c), the request headers and the refusals decided from them (grpc-headers.c) and
 * inference (grpc-infer.c).
 *
 * A stream is one call. Its request bytes are gathered message by message (the 5-byte gRPC
 * prefix is read first and its length checked against the limit before anything is kept);
 * each complete message goes to kd_grpc_dispatch. Answers are queued on the stream with
 * kd_grpc_reply (framed messages) and end with kd_grpc_finish (the status trailers).
 * When nghttp2 closes a stream (RST_STREAM, or its connection goes) every request it has queued
 * is marked cancelled and detached, so a completion that arrives later is only counted and freed.
 */
#ifndef KD_API_GRPC_IMPL_H
#define KD_API_GRPC_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <nghttp2/nghttp2.h>
#include <protobuf-c/protobuf-c.h>

#include "buf.h"
#include "conn-limit.h"
#include "grpc.h"
#include "listener.h"
#include "metrics.h"

/* gRPC status codes (grpc/doc/statuscodes.md). */
enum grpc_code {
    GRPC_OK = 0,
    GRPC_CANCELLED = 1,
    GRPC_UNKNOWN = 2,
    GRPC_INVALID_ARGUMENT = 3,
    GRPC_DEADLINE_EXCEEDED = 4,
    GRPC_NOT_FOUND = 5,
    GRPC_ALREADY_EXISTS = 6,
    GRPC_PERMISSION_DENIED = 7,
    GRPC_RESOURCE_EXHAUSTED = 8,
    GRPC_FAILED_PRECONDITION = 9,
    GRPC_UNIMPLEMENTED = 12,
    GRPC_INTERNAL = 13,
    GRPC_UNAVAILABLE = 14,
    GRPC_UNAUTHENTICATED = 16,
};
#define KD_GRPC_CODES 17

/* A stream's backlog (kd_grpc_backlog: answers waiting, requests still running) past which the
 * client's further request bytes are not given back to its window until it drains to half: a
 * client that sends faster than it reads, or than its requests run, is held to its window
 * instead of growing kilnd's memory. */
#define KD_GRPC_BACKLOG_BYTES (4u << 20)

/* The call metrics' method slots: every method the service knows, then one for any other path. */
#define KD_GRPC_METHOD_SLOTS 16

struct kd_grpc {
    struct kd_grpc_options o;
    uv_loop_t *loop;
    struct kd_listener listener;
    bool listener_open, draining;
    int port;
    struct kd_grpc_conn *conns;
    void (*drain_done)(void *ud);   /* once draining and every connection has closed */
    void *drain_ud;
    /* /metrics: calls by method and status code, and their durations (NULL without a model
     * table, whose registry they are in); a series is resolved the first time it is needed. */
    struct kd_metric_family *f_calls, *f_seconds;
    struct kd_metric_series *calls[KD_GRPC_METHOD_SLOTS][KD_GRPC_CODES];
    struct kd_metric_series *seconds[KD_GRPC_METHOD_SLOTS];
};

struct grpc_job;

/* A model load in progress for a call; s is cleared when the call goes first. */
struct grpc_load {
    struct grpc_stream *s;
};

struct grpc_stream {
    struct kd_grpc_conn *conn;
    int32_t id;
    char path[96];
    char *authorization; /* the metadata's value (NULL: none), as long as max_header_bytes lets it be */
    bool method_post;    /* :method is POST */
    bool grpc_content_type;
    int coding; /* grpc-encoding: enum kd_http_coding (identity when absent) */
    char coding_name[24];
    unsigned accept_codings;        /* grpc-accept-encoding: a bit per enum kd_http_coding */
    int resp_coding;                /* what answers are compressed with (identity: not compressed) */
    uint64_t deadline_ns;           /* from grpc-timeout; 0: none */
    uint64_t opened_ns;
    size_t header_bytes;
    bool header_overflow;
    /* the request side */
    struct kd_buf in;               /* the message being gathered, prefix included */
    size_t unconsumed;              /* request bytes taken but not yet given back to the client's
                                     * window: held while this stream's answers wait (grpc-send.c) */
    uint64_t need;                  /* its whole length once the prefix is read; 0 before */
    int messages;                   /* complete messages so far */
    bool client_done;               /* END_STREAM received */
    bool streaming;                 /* ModelStreamInfer */
    /* the response side */
    bool headers_sent, finished, trailers_sent;
    struct kd_buf out;
    size_t out_off;
    int code;
    int http_status;                    /* a refusal's HTTP status (405, 415); 0: 200, a gRPC answer */
    char message[1024];                 /* a run's failure whole (scheduler.h's error is 1024 too) */
    struct grpc_job *jobs, *jobs_tail;  /* queued inference, in request order */
    size_t running_bytes;               /* their request messages' bytes, until each is answered */
    struct grpc_load *load;             /* RepositoryModelLoad waiting for its load */
    struct grpc_stream *prev, *next;
};

struct kd_grpc_conn {
    struct kd_grpc *g;
    uv_tcp_t tcp;
    uv_timer_t timer;
    bool detached;                  /* no socket (the fuzzer) */
    bool closing, in_recv, read_paused;
    enum kd_conn_admission admission; /* served, or refused for limits.max_connections */
    bool lingering;                   /* refused: GOAWAY sent, input dropped until the close */
    uv_shutdown_t shutdown_req;       /* a refused connection's write side */
    int handles_open;               /* while closing: the handles whose close is still to come */
    nghttp2_session *session;
    struct grpc_stream *streams;
    uint64_t last_active_ns;
    size_t unsent;                  /* bytes handed to uv_write and not yet written */
    /* For the stall limit: the last time a write to the socket completed (or none waited), and
     * the last time nghttp2 took a stream's answers, which the client's windows allow (or none
     * waited). PINGs and other frames the client provokes do not count. */
    uint64_t socket_progress_ns, window_progress_ns;
    size_t write_queue_seen; /* the socket's write queue at the last tick */
    int held_streams;        /* streams whose unconsumed bytes are held */
    double reset_tokens;     /* client resets (RST_STREAM) still allowed: a token bucket */
    uint64_t reset_refill_ns;
    bool cut_logged; /* the session's end for the client's doing is logged (once) */
    char peer[64];   /* "ip:port", for the log */
    char rbuf[65536];
    struct kd_grpc_conn *prev, *next;
};

/* ---- grpc-server.c ---- */
/* The gRPC status an HTTP status from the serving layer means. */
enum grpc_code kd_grpc_code_of_http(int status);
/* Counts s's call in /metrics under code, once it has ended (answered, or gone unanswered). */
void kd_grpc_count_call(struct grpc_stream *s, enum grpc_code code);
/* Closes the connection once, its streams with it (a detached one is left to kd_grpc_conn_free). */
void kd_grpc_conn_close(struct kd_grpc_conn *c);
/* The connection's libuv read callbacks, also used to resume reading once a client catches up. */
void kd_grpc_on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
void kd_grpc_on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf);

/* ---- grpc-headers.c ---- */
/* nghttp2's on_header callback: what a request's header block says, into its stream. */
int kd_grpc_on_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                      const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data);
/* The request headers are complete: refuses now what cannot be served (a method other than POST,
 * a content-type other than gRPC's, an unknown method), else reads what the call will be. */
void kd_grpc_check_call(struct grpc_stream *s);

/* ---- grpc-send.c ---- */
/* Queues one framed message m on s (sending response headers first). 0, or -1 out of memory. */
int kd_grpc_reply(struct grpc_stream *s, const ProtobufCMessage *m);
/* Queues framed messages already packed (prefix included); the buffer may be taken over (left empty). */
int kd_grpc_reply_buf(struct grpc_stream *s, struct kd_buf *framed);
/* Ends the call with code and message (after what was queued). */
void kd_grpc_finish(struct grpc_stream *s, enum grpc_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Ends the call before it began, at the HTTP level: response headers with :status http_status
 * (405 also says "allow: POST") carrying the gRPC code and message for gRPC clients. */
void kd_grpc_refuse_http(struct grpc_stream *s, int http_status, enum grpc_code code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Ends the call with OK and no message (every successful call: no formatting). */
void kd_grpc_finish_ok(struct grpc_stream *s);
/* Sends what the session has queued, unless called from inside nghttp2 (the read path sends after). */
void kd_grpc_flush(struct kd_grpc_conn *c);
/* Answers queued on s and not yet taken by nghttp2 (the client's windows hold them back), and the
 * requests of s's still being run, whose answers are to come (about as large, as a rule). */
size_t kd_grpc_backlog(const struct grpc_stream *s);
/* Whether a stream of c's has answers (data or trailers) waiting for the client's window. */
bool kd_grpc_streams_waiting(const struct kd_grpc_conn *c);
/* Frames a message: the 5-byte prefix then the packed bytes, appended to b. 0 or -1. */
int kd_grpc_frame(struct kd_buf *b, const ProtobufCMessage *m);
/* As kd_grpc_frame, compressed with coding (enum kd_http_coding) when that is not identity and the
 * result is smaller (the prefix's flag says which). Any thread. 0 or -1. */
int kd_grpc_frame_coded(struct kd_buf *b, const ProtobufCMessage *m, int coding);

/* ---- grpc-methods.c ---- */
/* One complete request message for the method s->path names; msg lies in holder's bytes, which a
 * method may take over (leaving holder empty) to keep pointing into them after it returns. */
void kd_grpc_dispatch(struct grpc_stream *s, const uint8_t *msg, size_t len, struct kd_buf *holder);
/* When s->path names no method kilnd serves: ends the call UNIMPLEMENTED, saying why, and true. */
bool kd_grpc_refuse_unknown_method(struct grpc_stream *s);
/* Whether path names a method that streams requests (each message dispatched as it comes). */
bool kd_grpc_is_streaming(const char *path);
/* The call metrics' slot for path's method (KD_GRPC_METHOD_SLOTS - 1: not a method the service
 * knows) and, in *label, the method's name ("other" for the last slot). */
int kd_grpc_method_slot(const char *path, const char **label);

/* ---- grpc-shm.c: the system shared-memory methods (the messages are grpc_service.pb-c.h's) ---- */
struct Inference__SystemSharedMemoryStatusRequest;
struct Inference__SystemSharedMemoryRegisterRequest;
struct Inference__SystemSharedMemoryUnregisterRequest;
void kd_grpc_shm_status(struct grpc_stream *s, const struct Inference__SystemSharedMemoryStatusRequest *q);
void kd_grpc_shm_register(struct grpc_stream *s, const struct Inference__SystemSharedMemoryRegisterRequest *q);
void kd_grpc_shm_unregister(struct grpc_stream *s, const struct Inference__SystemSharedMemoryUnregisterRequest *q);

/* ---- grpc-infer.c ---- */
/* ModelInfer / one ModelStreamInfer message: decode, queue; the answer comes later. */
void kd_grpc_infer(struct grpc_stream *s, const uint8_t *msg, size_t len, struct kd_buf *holder);
/*
 * A ModelInferRequest (as ModelInfer gets it): raw_input_contents as up to KD_SCHED_MAX_IO views
 * into msg, holder's buffer moved into *held, and the rest unpacked, when the message's top-level
 * fields walk cleanly (*split true); otherwise the whole message unpacked, views unused. NULL when
 * malformed. The caller frees the message, and *held once nothing uses the views.
 */
struct Inference__ModelInferRequest;
struct Inference__ModelInferRequest *kd_grpc_infer_unpack(const uint8_t *msg, size_t len, struct kd_buf *holder,
                                                          struct kd_buf *held, ProtobufCBinaryData *views,
                                                          size_t *nviews, bool *split);
/* The stream is going away: its queued requests are cancelled and forgotten. */
void kd_grpc_detach_jobs(struct grpc_stream *s);
/* Why a streaming call ends at a stop (UNAVAILABLE): its answers were all sent. */
extern const char kd_grpc_drain_stream_end[];
/* For a streaming call whose client finished: ends it once no request is pending; while the
 * server drains, ends any streaming call once no request is pending. */
void kd_grpc_stream_maybe_end(struct grpc_stream *s);

#endif /* KD_API_GRPC_IMPL_H */
