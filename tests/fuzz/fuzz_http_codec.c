/*
 * tests/fuzz/fuzz_http_codec.c — libFuzzer target for kilnd's HTTP content codings
 * (api/http-codec.c), which every client reaches: Content-Encoding and Accept-Encoding values
 * read as headers, a gzip or deflate request body inflated under a size limit, and a response
 * compressed for the client.
 *
 * Layout of an input: byte 0 picks the coding and the limit, byte 1 how many of the following
 * bytes are a header value; the rest is a body. The body is inflated as received (it must be
 * refused with 400 or 413 and a reason, or inflate to at most the limit), then compressed and
 * inflated back, which must give it unchanged; the header value goes through both parsers.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http-codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    enum kd_http_coding c = (data[0] & 1) ? KD_CODING_GZIP : KD_CODING_DEFLATE;
    uint64_t max = (uint64_t)(data[0] >> 1) * 97; /* 0 .. 12 KB: small limits are the edge cases */
    size_t hlen = data[1] < size - 2 ? data[1] : size - 2;
    char header[256];
    memcpy(header, data + 2, hlen);
    header[hlen] = '\0';
    enum kd_http_coding of = kd_http_coding_of(header), acc = kd_http_coding_accepted(header);
    if ((unsigned)of > KD_CODING_UNKNOWN || (unsigned)acc > KD_CODING_DEFLATE)
        __builtin_trap();
    const char *body = (const char *)data + 2 + hlen;
    size_t n = size - 2 - hlen;

    struct kd_buf out = {0};
    const char *why = NULL;
    int rc = kd_http_inflate(c, body, n, max, &out, &why);
    if (rc == 0 && out.len > max)
        __builtin_trap(); /* never more than the limit */
    if (rc > 0 && (!why || (rc != 400 && rc != 413) || out.len != 0))
        __builtin_trap(); /* a refusal says why and leaves nothing behind */

    /* a round trip gives the bytes back */
    struct kd_buf packed = {0};
    if (kd_http_deflate(c, body, n, &packed) == 0) {
        rc = kd_http_inflate(c, packed.data, packed.len, n, &out, &why);
        if (rc == 0 && (out.len != n || (n && memcmp(out.data, body, n) != 0)))
            __builtin_trap();
        if (rc > 0)
            __builtin_trap(); /* its own output at exactly its size must inflate */
    }
    kd_buf_free(&packed);
    kd_buf_free(&out);
    return 0;
}
