/*
 * api/http_conn.h — one HTTP/1.1 connection's protocol logic, without a socket.
 *
 * Bytes go in through kiln_http_conn_feed; complete responses come out appended to conn->out.
 * The socket layer (server.c) only moves bytes and runs the timers, so the parser, the limits,
 * pipelining and every error response can be driven directly by unit tests.
 *
 *     struct kiln_http_conn c;
 *     kiln_http_conn_init(&c, &service);
 *     kiln_http_conn_feed(&c, "GET /v2 HTTP/1.1\r\n\r\n", 20);
 *     write(fd, c.out.data, c.out.len); c.out.len = 0;
 *     if (c.closing) ... close once out is written ...
 *     kiln_http_conn_free(&c);
 */
#ifndef KILN_API_HTTP_CONN_H
#define KILN_API_HTTP_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <llhttp.h>

#include "buf.h"
#include "router.h"

/* What every connection of one server shares; read-only once connections exist. */
struct kiln_http_service {
    struct kiln_router router;
    void *ctx;                      /* handed to every route handler */
    size_t max_header_bytes;        /* request line + headers */
    uint64_t max_body_bytes;        /* after de-chunking */
    /* Called once per response, errors included; route == router.count when none matched. */
    void (*observe)(void *ctx, size_t route, int status, uint64_t elapsed_ns);
    void *observe_ctx;
};

struct kiln_http_conn {
    llhttp_t parser;
    const struct kiln_http_service *svc;
    struct kiln_buf url;
    struct kiln_buf body;
    struct kiln_buf out;            /* responses not yet handed to the socket */
    size_t header_bytes;
    uint64_t body_bytes;
    uint64_t started_ns;            /* first byte of the current request */
    int reject_status;              /* set by a callback that refuses the request */
    const char *reject_msg;
    unsigned responses;             /* responses produced so far */
    bool in_message;                /* a request has started and not yet completed */
    bool closing;                   /* no more input is read; close once out is written */
    bool draining;                  /* finish the current request, then close */
    bool failed;                    /* out of memory: close without a response */
};

void kiln_http_conn_init(struct kiln_http_conn *c, const struct kiln_http_service *svc);
void kiln_http_conn_free(struct kiln_http_conn *c);

/* Parses bytes, answering each complete request into c->out. Ignored once c->closing is set. */
void kiln_http_conn_feed(struct kiln_http_conn *c, const char *data, size_t len);

/* The peer closed its side: a request cut short gets 400; the connection closes. */
void kiln_http_conn_eof(struct kiln_http_conn *c);

/* The timer fired: a started request gets 408; the connection closes either way. */
void kiln_http_conn_timeout(struct kiln_http_conn *c);

/* Daemon shutdown: an idle connection closes now, a busy one after its current response. */
void kiln_http_conn_drain(struct kiln_http_conn *c);

#endif /* KILN_API_HTTP_CONN_H */
