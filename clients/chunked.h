/*
 * clients/chunked.h — decoding an HTTP/1.1 chunked body (RFC 9112 section 7.1) as it arrives.
 *
 * kilnd itself never sends one, but a reverse proxy in front of it may (nginx re-frames a stream
 * that has no length, such as a job's events, for an HTTP/1.1 client), and a chunk boundary may
 * fall anywhere, inside an event's line too.
 */
#ifndef KILN_CLIENTS_CHUNKED_H
#define KILN_CLIENTS_CHUNKED_H

#include <stdbool.h>
#include <stddef.h>

struct kiln_dechunk {
    int state;          /* where in the framing the next byte falls */
    size_t left;        /* bytes of the current chunk still to come */
    size_t size_digits; /* hex digits read of the current size line */
    bool done;          /* the last chunk (size 0) has been read */
};

/* Whether the response headers in [headers, end) say Transfer-Encoding: chunked. */
bool kiln_is_chunked(const char *headers, const char *end);
/* Decodes in[0, n) into out (which may be in: the payload never runs ahead of its framing);
 * the payload bytes written, or -1 for framing that is not chunked encoding. */
long kiln_dechunk(struct kiln_dechunk *d, const char *in, size_t n, char *out);

#endif /* KILN_CLIENTS_CHUNKED_H */
