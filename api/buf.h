/*
 * api/buf.h — a growable byte buffer. Connections keep theirs for their whole life, so
 * steady-state request handling reuses capacity instead of allocating.
 */
#ifndef KD_API_BUF_H
#define KD_API_BUF_H

#include <stddef.h>

struct kd_buf {
    char *data;
    size_t len;
    size_t cap;
};

/* Each returns 0, or -1 when memory runs out (the buffer is then unchanged). */
int kd_buf_reserve(struct kd_buf *b, size_t extra);
int kd_buf_append(struct kd_buf *b, const void *p, size_t n);
int kd_buf_puts(struct kd_buf *b, const char *s);
int kd_buf_printf(struct kd_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s as the inside of a JSON string (quotes not included). */
int kd_buf_json_escape(struct kd_buf *b, const char *s, size_t n);
void kd_buf_free(struct kd_buf *b);

#endif /* KD_API_BUF_H */
