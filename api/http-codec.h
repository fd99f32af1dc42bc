/*
 * api/http-codec.h — HTTP content codings (RFC 9110 section 8.4): gzip and deflate request
 * bodies inflated, and responses compressed for a client whose Accept-Encoding asks for it,
 * through zlib. "deflate" is the zlib format, as RFC 9110 defines it and as tritonclient sends it.
 *
 * Thread affinity: none; every call works on the buffers it is given.
 */
#ifndef KD_API_HTTP_CODEC_H
#define KD_API_HTTP_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"

enum kd_http_coding {
    KD_CODING_IDENTITY = 0,
    KD_CODING_GZIP,
    KD_CODING_DEFLATE,
    KD_CODING_UNKNOWN, /* a Content-Encoding kilnd cannot decode: 415 */
};

/* The coding a Content-Encoding value names ("" and "identity" are identity). */
enum kd_http_coding kd_http_coding_of(const char *content_encoding);

/*
 * The coding to answer with for an Accept-Encoding value: gzip or deflate when acceptable (q > 0,
 * explicitly or through "*"), gzip preferred at equal q; identity otherwise.
 */
enum kd_http_coding kd_http_coding_accepted(const char *accept_encoding);

/* "gzip", "deflate" or "identity". */
const char *kd_http_coding_name(enum kd_http_coding c);

/*
 * Inflates in (coded with c) into out, which is emptied first. Refuses, with why filled, as soon
 * as the output would pass max bytes (413: nothing larger than max is ever allocated), or for a
 * stream that is corrupt, truncated or followed by other bytes (400). 0, 400, 413, or -1 when out
 * of memory.
 */
int kd_http_inflate(enum kd_http_coding c, const char *in, size_t n, uint64_t max, struct kd_buf *out,
                    const char **why);

/* Appends in (n bytes) compressed with c (gzip or deflate) to out. 0, or -1 (out of memory, or c
 * not a compressing coding); out keeps its length on failure. */
int kd_http_deflate(enum kd_http_coding c, const void *in, size_t n, struct kd_buf *out);

/*
 * Compresses, with c, the body of the one whole response at out->data + start (as responses.c
 * writes them: a Content-Length header and that many body bytes), fixing Content-Length and
 * adding Content-Encoding and Vary. Left as it is: a response that is not 2xx (errors stay
 * readable by any client), has an empty body, no Content-Length, or a Content-Encoding already.
 * 0, or -1 when out of memory (the response is then unchanged).
 */
int kd_http_compress_response(struct kd_buf *out, size_t start, enum kd_http_coding c);

#endif /* KD_API_HTTP_CODEC_H */
