/*
 * common/utf8.h — where a byte string stops being well-formed UTF-8.
 *
 * JSON text is UTF-8 (RFC 8259 section 8.1), but a JSON reader copies other bytes into its
 * strings as they are; a server that echoes such a string (an inference id, a problem
 * quoting a value) would send a body that is not valid JSON. The callers refuse such input.
 */
#ifndef KILN_COMMON_UTF8_H
#define KILN_COMMON_UTF8_H

#include <stddef.h>

/* Length (1..4) of the well-formed UTF-8 sequence that starts t[0, n) (RFC 3629: no overlong
 * forms, no surrogates, nothing past U+10FFFF), or 0 when t[0] starts none, or the end cuts it. */
static inline size_t kiln_utf8_sequence_len(const unsigned char *t, size_t n)
{
    if (n == 0)
        return 0;
    unsigned char c = t[0];
    unsigned more = c < 0x80                 ? 0
                    : c >= 0xc2 && c <= 0xdf ? 1
                    : c >= 0xe0 && c <= 0xef ? 2
                    : c >= 0xf0 && c <= 0xf4 ? 3
                                             : 4;
    if (more == 4 || more >= n) /* not a lead byte, or a sequence the end cuts */
        return 0;
    /* the second byte's range rules out overlong forms, surrogates and values past U+10FFFF */
    unsigned lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80;
    unsigned hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
    for (unsigned k = 1; k <= more; k++, lo = 0x80, hi = 0xbf)
        if (t[k] < lo || t[k] > hi)
            return 0;
    return more + 1;
}

/* Offset of the first byte of t[0, n) that does not start or continue a well-formed UTF-8
 * sequence (a sequence cut by the end counts as malformed), or -1 when all n bytes are well
 * formed. */
static inline long kiln_utf8_invalid_at(const unsigned char *t, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t len = kiln_utf8_sequence_len(t + i, n - i);
        if (len == 0)
            return (long)i;
        i += len;
    }
    return -1;
}

#endif /* KILN_COMMON_UTF8_H */
