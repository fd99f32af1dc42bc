/*
 * api/buf.c — the growable byte buffer used for request and response bytes and for
 * rendered metrics.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"

int kd_buf_reserve(struct kd_buf *b, size_t extra)
{
    if (b->cap - b->len >= extra)
        return 0;
    if (extra > SIZE_MAX / 2 - b->len)
        return -1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < extra)
        cap *= 2;
    char *grown = realloc(b->data, cap);
    if (!grown)
        return -1;
    b->data = grown;
    b->cap = cap;
    return 0;
}

int kd_buf_append(struct kd_buf *b, const void *p, size_t n)
{
    if (kd_buf_reserve(b, n) != 0)
        return -1;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

int kd_buf_puts(struct kd_buf *b, const char *s)
{
    return kd_buf_append(b, s, strlen(s));
}

int kd_buf_printf(struct kd_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = b->cap - b->len;
    int n = vsnprintf(b->data ? b->data + b->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n < 0)
        return -1;
    if ((size_t)n >= room) {
        if (kd_buf_reserve(b, (size_t)n + 1) != 0)
            return -1;
        va_start(ap, fmt);
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
    return 0;
}

int kd_buf_json_escape(struct kd_buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    if (kd_buf_reserve(b, n) != 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[6];
        size_t len = 0;
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            len = 2;
        } else if (c < 0x20 || c == 0x7f) {
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            len = 6;
        }
        /* Bytes >= 0x80 pass through: callers only hand in text they produced or validated. */
        if (len ? kd_buf_append(b, esc, len) : kd_buf_append(b, &s[i], 1))
            return -1;
    }
    return 0;
}

void kd_buf_free(struct kd_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}
