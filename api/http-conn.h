/*
 * api/http-conn.h — one HTTP/1.1 connection's protocol logic, without a socket.
 *
 * Bytes go in through kd_http_conn_feed; complete responses come out appended to conn->out, and
 * so does the interim "100 Continue" a request with "Expect: 100-continue" gets once its header
 * block is accepted (before its body, which the client holds back until then).
 * The socket layer (server.c) only moves bytes and runs the timers, so the parser, the limits,
 * pipelining and every error response can be driven directly by unit tests.
 *
 *     struct kd_http_conn c;
 *     kd_http_conn_init(&c, &service);
 *     kd_http_conn_feed(&c, "GET /v2 HTTP/1.1\r\n\r\n", 20);
 *     write(fd, c.out.data, c.out.len); c.out.len = 0;
 *     if (c.closing) ... close once out is written ...
 *     kd_http_conn_free(&c);
 */
#ifndef KD_API_HTTP_CONN_H
#define KD_API_HTTP_CONN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <llhttp.h>

#include "buf.h"
#include "router.h"

/* One line of the access log: what was asked, what was answered, for whom. */
struct kd_http_access {
    const char *method; /* "GET"; "-" when the request line did not parse */
    const char *target; /* the request target as sent, query included */
    size_t target_len;
    int status;
    uint64_t elapsed_ns;    /* from the first byte of the request to the response */
    uint64_t bytes_in;      /* the request body, after de-chunking */
    const char *request_id; /* X-Request-Id as given, or the one generated for it */
    const char *peer;       /* "ip:port" of the client */
};

/* What every connection of one server shares; read-only once connections exist. */
struct kd_http_service {
    struct kd_router router;
    void *ctx;               /* handed to every route handler */
    size_t max_header_bytes; /* request line + headers */
    uint64_t max_body_bytes; /* after de-chunking */
    /* Called once per response, errors included; route == router.count when none matched, and
     * router.count + 1 for a request to split_route whose path ends with split_suffix. */
    void (*observe)(void *ctx, size_t route, int status, uint64_t elapsed_ns);
    /* Optional (NULL: none): a route whose requests ending with this suffix are observed apart
     * (inference under the models route, so its latency is not averaged with readiness probes
     * and metadata reads). */
    const char *split_suffix;
    size_t split_route;
    void *observe_ctx;
    /*
     * Optional access log, called once per response after observe. When set, a request without a
     * usable X-Request-Id gets one generated before its handler runs (so the id a handler echoes
     * and the logged id are the same): "kiln-<pid>-<connection>-<n>".
     */
    void (*access)(void *ctx, const struct kd_http_access *a);
    void *access_ctx;
    int pid; /* for generated request ids */
};

/*
 * A response that a handler promised to produce later (an inference that went to a worker).
 * While one is outstanding the connection parses no further request: bytes that arrive are
 * stashed (bounded), so pipelined requests are still answered in order. The connection may
 * close first (peer gone, drain deadline): conn then becomes NULL and cancelled is set, which
 * a worker reads to drop the job before it runs. Whoever completes the job calls
 * kd_http_pending_finish exactly once, on the loop thread, which frees it.
 */
struct kd_http_pending {
    struct kd_http_conn *conn; /* loop thread only */
    atomic_bool cancelled;     /* read by any thread */
    /*
     * The request's body, moved here from the connection by kd_http_defer (the connection gets
     * it back, for reuse, when the response is finished). req->body keeps pointing at it, and it
     * outlives the connection, so a worker may read it until kd_http_pending_finish.
     */
    struct kd_buf body;
    size_t route;
    uint64_t started_ns;
    bool keep_alive;
    bool head;   /* a HEAD request: the late response's body is cut at finish */
    int coding;  /* enum kd_http_coding the response is compressed with */
    size_t mark; /* where the response begins in conn->out (set by kd_http_pending_out) */
    bool marked;
};

/*
 * A protocol that takes a connection over after its handler answered 101 (the WebSocket at
 * /v1/tensor). From then on every byte read goes to feed; the protocol writes into conn->out,
 * sets conn->closing when it is done, and calls conn->wake after output it produced outside feed
 * or output_taken. When the connection ends is the protocol's decision: a drain leaves it alone.
 */
struct kd_http_upgrade_ops {
    void (*feed)(void *ud, const char *data, size_t len);
    void (*eof)(void *ud);    /* the peer closed its side; the connection closes */
    void (*detach)(void *ud); /* the connection is being freed: never touch it again */
    /*
     * Optional: the socket layer took everything in conn->out (wrote it, or handed it to a write
     * in flight), so there is room for more. A protocol that hands its output over a bounded
     * piece at a time refills conn->out here; the socket layer writes it when this returns.
     */
    void (*output_taken)(void *ud);
};

/* How many header fields a connection keeps (http-fields.c lists them). */
#define KD_HTTP_KEPT_FIELDS 13

struct kd_http_conn {
    llhttp_t parser;
    const struct kd_http_service *svc;
    struct kd_buf url;
    struct kd_buf body;
    struct kd_buf out; /* responses not yet handed to the socket */
    size_t header_bytes;
    uint64_t body_bytes;
    uint64_t started_ns; /* first byte of the current request */
    int reject_status;   /* set by a callback that refuses the request */
    const char *reject_msg;
    char reject_text[160];          /* a refusal's message that names a figure (reject_msg points here) */
    unsigned responses;             /* responses produced so far */
    bool in_message;                /* a request has started and not yet completed */
    bool closing;                   /* no more input is read; close once out is written */
    bool draining;                  /* finish the current request, then close */
    bool failed;                    /* out of memory: close without a response */
    bool head;                      /* the current request is HEAD: no response to it has a body */
    struct kd_http_headers headers; /* of the current request */
    /* The values of the fields kilnd reads (headers points into some), Expect and
     * Transfer-Encoding included: each whole, so bounded only by max_header_bytes. */
    struct kd_buf kept[KD_HTTP_KEPT_FIELDS];
    bool fields_done;   /* the header block is complete: trailer fields are not kept */
    struct kd_buf path; /* the request path, percent-decoded, as handlers see it */
    size_t header_slot; /* which kept field the value being parsed goes to */
    bool header_in_value;
    struct kd_buf header_name;
    size_t route; /* route of the request being dispatched */
    struct kd_http_pending *pending;
    bool dispatching;                         /* inside a route handler */
    bool finished_inline;                     /* a deferred response was finished before the handler returned */
    struct kd_buf stash;                      /* input that arrived while a response was pending, or
                                                 while out held KD_HTTP_OUT_HIGH */
    bool out_paused;                          /* parsing stopped for out to be written (pipelining) */
    bool input_ended;                         /* the peer half-closed while requests waited in the stash */
    char peer[64];                            /* "ip:port", set by the socket layer (access log) */
    uint64_t conn_id;                         /* set by the socket layer; generated request ids use it */
    uint64_t requests;                        /* requests dispatched on this connection */
    const struct kd_http_upgrade_ops *up_ops; /* set by kd_http_upgrade */
    void *up_ud;
    bool upgraded; /* the 101 went out: input goes to up_ops */
    /* Called after a pending response was finished, so the socket layer can send it. */
    void (*wake)(void *ud);
    void *wake_ud;
};

void kd_http_conn_init(struct kd_http_conn *c, const struct kd_http_service *svc);
void kd_http_conn_free(struct kd_http_conn *c);

/* Parses bytes, answering each complete request into c->out. Ignored once c->closing is set. */
void kd_http_conn_feed(struct kd_http_conn *c, const char *data, size_t len);

/* The peer closed its side: a request cut short gets 400; the connection closes. */
void kd_http_conn_eof(struct kd_http_conn *c);

/* The socket layer took everything in c->out: an upgraded protocol may refill it (output_taken). */
void kd_http_conn_output_taken(struct kd_http_conn *c);

/*
 * Pipelined requests are answered into c->out as they are parsed; once out holds this much, the
 * rest of the input waits in the stash (out_paused) until the socket has taken all of it, so a
 * client that sends many small requests and reads nothing (GET /metrics, some 30 KB an answer,
 * 26 bytes a request) cannot make the server hold its answers by the hundred megabytes.
 */
#define KD_HTTP_OUT_HIGH (1u << 20)

/* The output that paused parsing has all been written (!writing, out empty): parse the stash,
 * which may answer into out and pause again. No-op unless out_paused. */
void kd_http_conn_output_room(struct kd_http_conn *c);

/* The timer fired: a started request gets 408; the connection closes either way. */
void kd_http_conn_timeout(struct kd_http_conn *c);

/*
 * Daemon shutdown: an idle connection closes now, a busy one (a request being handled) after its
 * current response, and a request still arriving may finish arriving (a client mid-upload at
 * SIGTERM gets its answer, with Connection: close). The server gives such a request a short
 * grace (KD_DRAIN_ARRIVAL_MS), then calls kd_http_conn_drain_cut. An upgraded connection is left
 * to its protocol, which has no request to finish and its own way to end (a tensor session is
 * sent 1001 by kd_tensor_service_set_accepting and closes once that is written).
 */
void kd_http_conn_drain(struct kd_http_conn *c);

/*
 * The drain's grace for a request still arriving is over: it is answered 503 with Connection:
 * close (a header block not yet complete too: the status line and a JSON error can always be
 * written), so a stalled client does not hold the stop for drain_timeout_ms. No-op otherwise.
 */
void kd_http_conn_drain_cut(struct kd_http_conn *c);

/*
 * The connection is refused before any request is read (the connection limit, conn-limit.h): the
 * error response (extra_headers: whole lines, or NULL) goes out with Connection: close, and
 * nothing the client sends is parsed. It is no request's answer, so it is not observed: the
 * limit counts its refusals itself.
 */
void kd_http_conn_refuse(struct kd_http_conn *c, int status, const char *msg, const char *extra_headers);

/* False while a response is pending or output paused parsing and the stash is full. */
bool kd_http_conn_wants_input(const struct kd_http_conn *c);

/*
 * From a route handler: the response comes later. The handler then returns KD_HTTP_DEFERRED.
 * Returns NULL when out of memory (the handler answers 500 instead).
 */
struct kd_http_pending *kd_http_defer(const struct kd_request *req);

/*
 * From a route handler that appends a 101 response: once the request is complete the connection
 * belongs to ops (ud is theirs). 0, or -1 when the connection cannot switch (a response pending).
 */
int kd_http_upgrade(const struct kd_request *req, const struct kd_http_upgrade_ops *ops, void *ud);

/* Where the late response goes (append one whole response), or NULL when the client is gone. */
struct kd_buf *kd_http_pending_out(struct kd_http_pending *p);
/* Whether the late response may say keep-alive (false once the daemon is draining). */
bool kd_http_pending_keep_alive(const struct kd_http_pending *p);
/* The late response is in place (status, or -1 when none could be written); frees p. */
void kd_http_pending_finish(struct kd_http_pending *p, int status);

#endif /* KD_API_HTTP_CONN_H */
