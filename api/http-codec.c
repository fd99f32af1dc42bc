/*
 * api/http-codec.c — gzip and deflate for HTTP bodies, through zlib (see http-codec.h).
 *
 * Inflating grows the output in steps and stops the moment it would pass the body limit, so a
 * few kilobytes that expand to gigabytes cost at most the limit. Compressing rewrites one
 * response already in the output buffer: the header block is kept, Content-Length replaced.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <zlib.h>

#include "http-codec.h"

/* windowBits for zlib: 15 is the zlib format (HTTP "deflate"), +16 the gzip format. */
static int window_bits(enum kd_http_coding c)
{
    return c == KD_CODING_GZIP ? 15 + 16 : 15;
}

/* Whether [p, p+n) is token, case-insensitively. */
static bool token_is(const char *p, size_t n, const char *token)
{
    return n == strlen(token) && strncasecmp(p, token, n) == 0;
}

enum kd_http_coding kd_http_coding_of(const char *v)
{
    while (*v == ' ' || *v == '\t')
        v++;
    size_t n = strlen(v);
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    if (n == 0 || token_is(v, n, "identity"))
        return KD_CODING_IDENTITY;
    if (token_is(v, n, "gzip") || token_is(v, n, "x-gzip"))
        return KD_CODING_GZIP;
    if (token_is(v, n, "deflate"))
        return KD_CODING_DEFLATE;
    return KD_CODING_UNKNOWN; /* another coding, or several stacked ("gzip, gzip") */
}

/* The q value of one Accept-Encoding element's parameters ("q=0.5"); 1 when absent, -1 when malformed. */
static double q_value(const char *p, const char *end)
{
    while (p < end) {
        while (p < end && (*p == ';' || *p == ' ' || *p == '\t'))
            p++;
        if (end - p >= 2 && (p[0] == 'q' || p[0] == 'Q') && p[1] == '=') {
            char num[8] = "";
            size_t n = (size_t)(end - p - 2) < sizeof num - 1 ? (size_t)(end - p - 2) : sizeof num - 1;
            memcpy(num, p + 2, n);
            char *stop;
            double q = strtod(num, &stop);
            return stop == num || q < 0 || q > 1 ? -1 : q;
        }
        while (p < end && *p != ';')
            p++;
    }
    return 1;
}

enum kd_http_coding kd_http_coding_accepted(const char *v)
{
    double q_gzip = -1, q_deflate = -1, q_any = -1;
    for (const char *p = v; *p;) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        const char *end = p;
        while (*end && *end != ',')
            end++;
        const char *name_end = p;
        while (name_end < end && *name_end != ';' && *name_end != ' ' && *name_end != '\t')
            name_end++;
        double q = q_value(name_end, end);
        size_t n = (size_t)(name_end - p);
        if (token_is(p, n, "gzip") || token_is(p, n, "x-gzip"))
            q_gzip = q;
        else if (token_is(p, n, "deflate"))
            q_deflate = q;
        else if (token_is(p, n, "*"))
            q_any = q;
        p = end;
    }
    if (q_gzip < 0)
        q_gzip = q_any; /* "*" stands for every coding not named */
    if (q_deflate < 0)
        q_deflate = q_any;
    if (q_gzip > 0 && q_gzip >= q_deflate)
        return KD_CODING_GZIP;
    return q_deflate > 0 ? KD_CODING_DEFLATE : KD_CODING_IDENTITY;
}

const char *kd_http_coding_name(enum kd_http_coding c)
{
    return c == KD_CODING_GZIP ? "gzip" : c == KD_CODING_DEFLATE ? "deflate" : "identity";
}

int kd_http_inflate(enum kd_http_coding c, const char *in, size_t n, uint64_t max, struct kd_buf *out,
                    const char **why)
{
    out->len = 0;
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, window_bits(c)) != Z_OK)
        return -1;
    z.next_in = (Bytef *)(uintptr_t)in;
    size_t left = n;     /* input not yet handed to zlib */
    unsigned char probe; /* one byte of room past the limit: output there means too large */
    int rc = 0;
    for (;;) {
        size_t limit = out->cap < max ? out->cap : (size_t)max;
        if (out->len == limit && limit < max) {
            /* doubling, but never past the limit: a bomb costs at most max bytes */
            size_t cap = out->cap < 4096 ? 4096 : out->cap * 2;
            if (cap > max)
                cap = (size_t)max;
            char *grown = realloc(out->data, cap);
            if (!grown) {
                rc = -1;
                break;
            }
            out->data = grown;
            out->cap = cap;
            continue;
        }
        bool at_limit = out->len == limit;
        z.next_out = at_limit ? &probe : (Bytef *)out->data + out->len;
        z.avail_out = at_limit ? 1 : limit - out->len > UINT32_MAX ? UINT32_MAX : (uInt)(limit - out->len);
        uInt out_before = z.avail_out;
        if (z.avail_in == 0) {
            z.avail_in = left > UINT32_MAX ? UINT32_MAX : (uInt)left;
            left -= z.avail_in;
        }
        int zr = inflate(&z, Z_NO_FLUSH);
        size_t produced = out_before - z.avail_out;
        if (at_limit && produced) {
            *why = "request body exceeds max_body_bytes once decompressed";
            rc = 413;
            break;
        }
        out->len += at_limit ? 0 : produced;
        if (zr == Z_STREAM_END)
            break;
        if (zr == Z_MEM_ERROR) {
            rc = -1;
            break;
        }
        if (zr != Z_OK && zr != Z_BUF_ERROR) {
            *why = "request body is not a valid compressed stream";
            rc = 400;
            break;
        }
        if (z.avail_in == 0 && left == 0 && z.avail_out > 0) {
            /* every byte given, room to spare, and still no end of stream */
            *why = "request body ends inside its compressed stream";
            rc = 400;
            break;
        }
    }
    if (rc == 0 && (z.avail_in > 0 || left > 0)) {
        *why = "request body has bytes after its compressed stream";
        rc = 400;
    }
    inflateEnd(&z);
    if (rc != 0)
        out->len = 0;
    return rc;
}

/* The value of header name in the block [h, end), or NULL; *len is its length. */
static const char *header_value(const char *h, const char *end, const char *name, size_t *len)
{
    size_t nl = strlen(name);
    for (const char *line = h; line < end;) {
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (!eol)
            eol = end;
        if ((size_t)(eol - line) > nl && strncasecmp(line, name, nl) == 0 && line[nl] == ':') {
            const char *v = line + nl + 1;
            while (v < eol && *v == ' ')
                v++;
            const char *ve = eol > v && eol[-1] == '\r' ? eol - 1 : eol;
            *len = (size_t)(ve - v);
            return v;
        }
        line = eol + 1;
    }
    return NULL;
}

int kd_http_deflate(enum kd_http_coding c, const void *in, size_t n, struct kd_buf *out)
{
    if ((c != KD_CODING_GZIP && c != KD_CODING_DEFLATE) || n > UINT32_MAX)
        return -1;
    z_stream z;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, window_bits(c), 8, Z_DEFAULT_STRATEGY) != Z_OK)
        return -1;
    uLong bound = deflateBound(&z, (uLong)n);
    if (bound > UINT32_MAX || kd_buf_reserve(out, (size_t)bound) != 0) {
        deflateEnd(&z);
        return -1;
    }
    z.next_in = (Bytef *)(uintptr_t)in;
    z.avail_in = (uInt)n;
    z.next_out = (Bytef *)out->data + out->len;
    z.avail_out = (uInt)bound;
    int zr = deflate(&z, Z_FINISH);
    size_t produced = (size_t)z.total_out;
    deflateEnd(&z);
    if (zr != Z_STREAM_END)
        return -1;
    out->len += produced;
    return 0;
}

int kd_http_compress_response(struct kd_buf *out, size_t start, enum kd_http_coding c)
{
    if ((c != KD_CODING_GZIP && c != KD_CODING_DEFLATE) || out->len <= start)
        return 0;
    const char *r = out->data + start, *end = out->data + out->len;
    if (end - r < 12 || memcmp(r, "HTTP/1.1 2", 10) != 0)
        return 0;
    const char *hend = memmem(r, (size_t)(end - r), "\r\n\r\n", 4);
    if (!hend)
        return 0;
    hend += 2; /* the block's last CRLF stays with the headers */
    size_t cl_len, ce_len;
    const char *cl = header_value(r, hend, "Content-Length", &cl_len);
    if (!cl || header_value(r, hend, "Content-Encoding", &ce_len))
        return 0;
    char num[24] = "";
    if (cl_len == 0 || cl_len >= sizeof num)
        return 0;
    memcpy(num, cl, cl_len);
    char *stop;
    unsigned long long body_len = strtoull(num, &stop, 10);
    const char *body = hend + 2;
    if (*stop || body_len == 0 || body_len != (unsigned long long)(end - body))
        return 0;

    struct kd_buf packed = {0};
    if (kd_http_deflate(c, body, (size_t)body_len, &packed) != 0) {
        kd_buf_free(&packed);
        return -1;
    }

    /* The new response: the headers up to Content-Length's value, the new length, the rest of the
     * headers, the coding headers, the blank line and the compressed body. */
    struct kd_buf nr = {0};
    size_t head_to_cl = (size_t)(cl - r);
    const char *after_cl = cl + cl_len;
    int rc = kd_buf_append(&nr, r, head_to_cl);
    rc |= kd_buf_printf(&nr, "%zu", packed.len);
    rc |= kd_buf_append(&nr, after_cl, (size_t)(hend - after_cl));
    rc |= kd_buf_printf(&nr, "Content-Encoding: %s\r\nVary: Accept-Encoding\r\n\r\n", kd_http_coding_name(c));
    rc |= kd_buf_append(&nr, packed.data, packed.len);
    kd_buf_free(&packed);
    /* Room first, so that a failure leaves the original response whole. */
    if (rc == 0 && (rc = kd_buf_reserve(out, nr.len)) == 0) {
        memcpy(out->data + start, nr.data, nr.len);
        out->len = start + nr.len;
    }
    kd_buf_free(&nr);
    return rc == 0 ? 0 : -1;
}
