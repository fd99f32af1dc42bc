/*
 * api/router.h — the request as handlers see it, and a small table-driven router.
 *
 * A route table is static data: a path, the methods it takes and a handler. Matching is exact
 * on the path (the query string is split off first), except that a path ending in '*' matches
 * every path with that prefix (the handler parses the rest); a path that exists under other methods
 * answers 405 with an Allow header built from the table.
 *
 *     static const struct kiln_route routes[] = {
 *         {"/v2/health/live", KILN_HTTP_GET, handle_live},
 *     };
 *     struct kiln_router r = {routes, 1};
 */
#ifndef KILN_API_ROUTER_H
#define KILN_API_ROUTER_H

#include <stdbool.h>
#include <stddef.h>

#include "buf.h"

/* Method bits; a route's methods field is their union. */
enum kiln_http_method {
    KILN_HTTP_OTHER = 0,
    KILN_HTTP_GET = 1u << 0,
    KILN_HTTP_HEAD = 1u << 1,
    KILN_HTTP_POST = 1u << 2,
    KILN_HTTP_PUT = 1u << 3,
    KILN_HTTP_DELETE = 1u << 4,
    KILN_HTTP_PATCH = 1u << 5,
    KILN_HTTP_OPTIONS = 1u << 6,
};

/*
 * The request headers handlers use, kept with bounded sizes (a longer value is refused with
 * 431 before anything is sized by it). Each value is NUL-terminated; "" when absent.
 */
#define KILN_HTTP_AUTH_MAX 512
#define KILN_HTTP_SHORT_HEADER_MAX 128
struct kiln_http_headers {
    char authorization[KILN_HTTP_AUTH_MAX];
    char content_type[KILN_HTTP_SHORT_HEADER_MAX];
    char request_id[KILN_HTTP_SHORT_HEADER_MAX];
    char inference_header_length[32];   /* Inference-Header-Content-Length */
    char last_event_id[32];             /* Last-Event-ID (server-sent events) */
    char content_encoding[32];          /* the request body's coding (gzip, deflate) */
    char accept_encoding[256];          /* the codings the client takes for the response */
    /* A WebSocket handshake (GET /v1/tensor) */
    char upgrade[32];
    char connection[KILN_HTTP_SHORT_HEADER_MAX];
    char ws_key[64];                    /* Sec-WebSocket-Key */
    char ws_version[16];                /* Sec-WebSocket-Version */
};

struct kiln_http_conn;

/* A handler's return value when it will answer later through kiln_http_defer. */
#define KILN_HTTP_DEFERRED 0

struct kiln_request {
    unsigned method;            /* one enum kiln_http_method bit */
    const char *path;           /* not NUL-terminated */
    size_t path_len;
    const char *query;          /* after '?', or NULL */
    size_t query_len;
    const char *body;
    size_t body_len;
    bool keep_alive;            /* the response must say "Connection: close" when false */
    const struct kiln_http_headers *headers;
    struct kiln_http_conn *conn;    /* for kiln_http_defer */
};

/*
 * A handler appends one complete response (status line, headers, body) to out and returns its
 * status code, or -1 when it ran out of memory (the connection is then closed), or
 * KILN_HTTP_DEFERRED after kiln_http_defer when the response comes later.
 */
typedef int (*kiln_route_handler)(void *ctx, const struct kiln_request *req, struct kiln_buf *out);

struct kiln_route {
    const char *path;
    unsigned methods;
    kiln_route_handler handler;
    /*
     * Optional, prefix routes only: the methods one path under the prefix takes (rest is the path
     * after the prefix), so a wrong method gets 405 with that path's own Allow list rather than
     * the union over every path the handler serves. 0 means "not a shape this knows": the route's
     * methods apply and the handler answers (its own 400 or 404).
     */
    unsigned (*methods_at)(const char *rest, size_t len);
};

struct kiln_router {
    const struct kiln_route *routes;
    size_t count;
};

enum kiln_route_result {
    KILN_ROUTE_FOUND,
    KILN_ROUTE_NOT_FOUND,
    KILN_ROUTE_METHOD_NOT_ALLOWED,
};

/*
 * Finds the route for (method, path). *index is the matching route's index (also for 405, so
 * the Allow header can be built), or the route count for an unknown path.
 */
enum kiln_route_result kiln_router_match(const struct kiln_router *r, unsigned method,
                                         const char *path, size_t len, size_t *index);

/* The methods routes[index] takes at path (its methods_at when it has one). */
unsigned kiln_router_methods(const struct kiln_router *r, size_t index, const char *path, size_t path_len);

/* "GET, POST" for the methods routes[index] takes at path. */
void kiln_router_allow(const struct kiln_router *r, size_t index, const char *path, size_t path_len, char *buf,
                       size_t len);

unsigned kiln_http_method_from_name(const char *name, size_t len);

#endif /* KILN_API_ROUTER_H */
