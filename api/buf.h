/*
 * api/buf.h — a growable byte buffer. Connections keep theirs for their whole life, so
 * steady-state request handling reuses capacity instead of allocating.
 */
#ifndef KILN_API_BUF_H
#define KILN_API_BUF_H

#include <stddef.h>

struct kiln_buf {
    char *data;
    size_t len;
    size_t cap;
};

/* Each returns 0, or -1 when memory runs out (the buffer is then unchanged). */
int kiln_buf_reserve(struct kiln_buf *b, size_t extra);
int kiln_buf_append(struct kiln_buf *b, const void *p, size_t n);
int kiln_buf_puts(struct kiln_buf *b, const char *s);
int kiln_buf_printf(struct kiln_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s as the inside of a JSON string (quotes not included). */
int kiln_buf_json_escape(struct kiln_buf *b, const char *s, size_t n);
void kiln_buf_free(struct kiln_buf *b);

#endif /* KILN_API_BUF_H */
