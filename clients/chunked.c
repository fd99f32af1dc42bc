/*
 * clients/chunked.c — the chunked-body decoder of clients/chunked.h: a small state machine fed
 * whatever bytes recv() returned, so that neither the whole response nor a whole chunk has to be
 * held before its payload is passed on.
 */
#include "chunked.h"

#include <ctype.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

enum {
    SIZE,      /* hex digits of a chunk's size */
    EXTENSION, /* ";name=value" after the size, skipped to the line's end */
    SIZE_LF,   /* the '\n' ending the size line */
    DATA,      /* the chunk's bytes */
    DATA_CR,   /* the "\r\n" after them */
    DATA_LF,
    TRAILER, /* after the last chunk: trailer lines up to an empty one, skipped */
};

bool kiln_is_chunked(const char *headers, const char *end)
{
    static const char name[] = "\r\ntransfer-encoding:";
    for (const char *p = headers; p + sizeof name - 1 < end; p++) {
        if (strncasecmp(p, name, sizeof name - 1) != 0)
            continue;
        const char *v = p + sizeof name - 1, *eol = v;
        while (eol < end && *eol != '\r')
            eol++;
        /* chunked is the last coding whenever it is there at all (RFC 9112 section 6.1) */
        while (eol > v && (eol[-1] == ' ' || eol[-1] == '\t'))
            eol--;
        return eol - v >= 7 && strncasecmp(eol - 7, "chunked", 7) == 0;
    }
    return false;
}

long kiln_dechunk(struct kiln_dechunk *d, const char *in, size_t n, char *out)
{
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        char c = in[i];
        switch (d->state) {
        case SIZE:
            if (isxdigit((unsigned char)c)) {
                int v = isdigit((unsigned char)c) ? c - '0' : (tolower((unsigned char)c) - 'a' + 10);
                if (d->left > (SIZE_MAX >> 4) || ++d->size_digits > 15)
                    return -1;
                d->left = d->left * 16 + (size_t)v;
            } else if (d->size_digits && (c == ';' || c == ' ' || c == '\t')) {
                d->state = EXTENSION;
            } else if (d->size_digits && c == '\r') {
                d->state = SIZE_LF;
            } else {
                return -1;
            }
            i++;
            break;
        case EXTENSION:
            if (c == '\r')
                d->state = SIZE_LF;
            i++;
            break;
        case SIZE_LF:
            if (c != '\n')
                return -1;
            d->size_digits = 0;
            d->state = d->left ? DATA : TRAILER;
            i++;
            break;
        case DATA: {
            size_t take = n - i < d->left ? n - i : d->left;
            memmove(out + w, in + i, take);
            w += take;
            i += take;
            d->left -= take;
            if (!d->left)
                d->state = DATA_CR;
            break;
        }
        case DATA_CR:
            if (c != '\r')
                return -1;
            d->state = DATA_LF;
            i++;
            break;
        case DATA_LF:
            if (c != '\n')
                return -1;
            d->state = SIZE;
            i++;
            break;
        case TRAILER:
            /* the trailer section ends at an empty line; what is in it is not used */
            if (c == '\n' && d->left == 0)
                d->done = true;
            d->left = c == '\r' ? d->left : (c == '\n' ? 0 : d->left + 1);
            i++;
            break;
        }
    }
    return (long)w;
}
