/*
 * api/router.h — the request as handlers see it, and a small table-driven router.
 *
 * A route table is static data: a path, the methods it takes and a handler. Matching is exact
 * on the path (the query string is split off first), except that a path ending in '*' matches
 * every path with that prefix (the handler parses the rest); a path that exists under other methods
 * answers 405 with an Allow header built from the table. A path that takes GET takes HEAD too
 * (the table never lists it): its handler runs as for GET and the connection drops the body.
 *
 *     static const struct kd_route routes[] = {
 *         {"/v2/health/live", KD_HTTP_GET, handle_live},
 *     };
 *     struct kd_router r = {routes, 1};
 */
#ifndef KD_API_ROUTER_H
#define KD_API_ROUTER_H

#include <stdbool.h>
#include <stddef.h>

#include "buf.h"

/* Method bits; a route's methods field is their union. */
enum kd_http_method {
    KD_HTTP_OTHER = 0,
    KD_HTTP_GET = 1u << 0,
    KD_HTTP_HEAD = 1u << 1,
    KD_HTTP_POST = 1u << 2,
    KD_HTTP_PUT = 1u << 3,
    KD_HTTP_DELETE = 1u << 4,
    KD_HTTP_PATCH = 1u << 5,
    KD_HTTP_OPTIONS = 1u << 6,
};

/*
 * The request headers handlers use. Each value is NUL-terminated, "" when absent (a field line
 * given more than once is joined with ", ", RFC 9110 5.3). Free-form values are kept whole, up to
 * limits.max_header_bytes (the only bound a request's header block has: past it the whole request
 * gets 431), in storage the connection owns until its next request; they are pointers, never NULL
 * when set by the connection (a handler test that zeroes the struct sets the ones it reads).
 * Values with a fixed shape are kept in small arrays; a longer one cannot be valid, and is
 * dropped (X-Request-Id: a generated id replaces it; Upgrade and the Sec-WebSocket fields: the
 * handshake is refused as for a wrong value) or refused by the connection with the status a
 * wrong value gets (Inference-Header-Content-Length and Last-Event-ID: 400, Content-Encoding: 415).
 */
/* The longest X-Request-Id kept (characters); a longer or unusable one is replaced by a generated one. */
#define KD_HTTP_REQUEST_ID_MAX 128
/* A buffer that holds any request id kilnd uses, the NUL included. */
#define KD_HTTP_SHORT_HEADER_MAX (KD_HTTP_REQUEST_ID_MAX + 1)
struct kd_http_headers {
    const char *authorization;
    const char *content_type;
    const char *accept_encoding; /* the codings the client takes for the response */
    const char *connection;
    char request_id[KD_HTTP_SHORT_HEADER_MAX];
    char inference_header_length[32]; /* Inference-Header-Content-Length */
    char last_event_id[32];           /* Last-Event-ID (server-sent events) */
    char content_encoding[32];        /* the request body's coding (gzip, deflate) */
    /* A WebSocket handshake (GET /v1/tensor) */
    char upgrade[32];
    char ws_key[64];     /* Sec-WebSocket-Key */
    char ws_version[16]; /* Sec-WebSocket-Version */
};

struct kd_http_conn;

/* A handler's return value when it will answer later through kd_http_defer. */
#define KD_HTTP_DEFERRED 0

struct kd_request {
    unsigned method;  /* one enum kd_http_method bit; KD_HTTP_GET for a HEAD request */
    bool head;        /* a HEAD request: answered as GET, its body dropped afterwards */
    const char *path; /* not NUL-terminated */
    size_t path_len;
    const char *query; /* after '?', or NULL */
    size_t query_len;
    const char *body;
    size_t body_len;
    bool keep_alive; /* the response must say "Connection: close" when false */
    const struct kd_http_headers *headers;
    struct kd_http_conn *conn; /* for kd_http_defer */
};

/*
 * A handler appends one complete response (status line, headers, body) to out and returns its
 * status code, or -1 when it ran out of memory (the connection is then closed), or
 * KD_HTTP_DEFERRED after kd_http_defer when the response comes later.
 */
typedef int (*kd_route_handler)(void *ctx, const struct kd_request *req, struct kd_buf *out);

struct kd_route {
    const char *path;
    unsigned methods;
    kd_route_handler handler;
    /*
     * Optional, prefix routes only: the methods one path under the prefix takes (rest is the path
     * after the prefix), so a wrong method gets 405 with that path's own Allow list rather than
     * the union over every path the handler serves. 0 means "not a shape this knows": the route's
     * methods apply and the handler answers (its own 400 or 404).
     */
    unsigned (*methods_at)(const char *rest, size_t len);
};

struct kd_router {
    const struct kd_route *routes;
    size_t count;
};

enum kd_route_result {
    KD_ROUTE_FOUND,
    KD_ROUTE_NOT_FOUND,
    KD_ROUTE_METHOD_NOT_ALLOWED,
};

/*
 * Finds the route for (method, path). *index is the matching route's index (also for 405, so
 * the Allow header can be built), or the route count for an unknown path.
 */
enum kd_route_result kd_router_match(const struct kd_router *r, unsigned method, const char *path, size_t len,
                                     size_t *index);

/* The methods routes[index] takes at path (its methods_at when it has one), HEAD with GET. */
unsigned kd_router_methods(const struct kd_router *r, size_t index, const char *path, size_t path_len);

/* "GET, POST" for the methods routes[index] takes at path. */
void kd_router_allow(const struct kd_router *r, size_t index, const char *path, size_t path_len, char *buf,
                     size_t len);

unsigned kd_http_method_from_name(const char *name, size_t len);

/*
 * Percent-decodes a request path (RFC 3986 2.1) once, into out (room for len bytes: decoding never
 * lengthens). Refused, 0 returned with *why set: a '%' not followed by two hex digits, and an
 * encoded '/' (%2F, which would turn one segment into two and so route or name something other
 * than what was sent) or NUL (%00). 0 with *out_len set, or -1 with *why set.
 */
int kd_http_path_decode(const char *path, size_t len, char *out, size_t *out_len, const char **why);

#endif /* KD_API_ROUTER_H */
