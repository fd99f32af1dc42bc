/*
 * clients/sse.h — a server-sent events reader for the kiln CLI. The socket is non-blocking so
 * the dashboard can poll() it beside the keyboard; the plain watcher polls it alone.
 */
#ifndef KILN_CLIENTS_SSE_H
#define KILN_CLIENTS_SSE_H

#include <stdbool.h>
#include <stddef.h>

#include "chunked.h"
#include "cli.h"

struct kiln_sse {
    int fd;               /* -1 when not connected */
    int status;           /* the HTTP status once the headers are in, else 0 */
    char *buf;            /* bytes not yet parsed */
    size_t len, cap;
    char type[64];        /* the event being assembled */
    char *data;
    size_t dlen;
    bool chunked; /* the body comes in chunks (a proxy re-framed it), decoded as it arrives */
    struct kiln_dechunk dechunk;
    char last_id[32];     /* the newest event id seen: sent as Last-Event-ID on reconnection */
    char error[320];      /* why the stream failed, for the user */
};

typedef void (*kiln_sse_event_fn)(void *ctx, const char *type, const char *data);

void kiln_sse_init(struct kiln_sse *s);
/* Connects and sends GET PATH (with Last-Event-ID when an event was seen before); 0, or -1
 * with s->error set. */
int kiln_sse_open(struct kiln_sse *s, const struct kiln_client *cl, const char *path);
/* Reads what the socket has and calls FN for every complete event. 1: the stream goes on;
 * 0: the server closed it; -1: it failed or the server refused it (s->error says why). */
int kiln_sse_pump(struct kiln_sse *s, kiln_sse_event_fn fn, void *ctx);
/* Closes the connection; last_id is kept for the next kiln_sse_open. */
void kiln_sse_close(struct kiln_sse *s);

#endif /* KILN_CLIENTS_SSE_H */
