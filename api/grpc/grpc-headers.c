/*
 * api/grpc/grpc-headers.c — a call's request headers: what kilnd reads from them (the path, the
 * method, content-type, authorization, grpc-timeout, the codings) and the refusals decided once
 * they are complete, before any message is read (gRPC over HTTP/2, grpc/doc/PROTOCOL-HTTP2.md):
 *
 *   - a :method other than POST: HTTP 405 with "allow: POST";
 *   - a content-type other than application/grpc (or application/grpc+... / ;...): HTTP 415;
 *   - a path that names no method of the service: UNIMPLEMENTED (HTTP 200, as gRPC servers do).
 *
 * The 405 and 415 carry grpc-status and grpc-message too, as grpc-go's do: a gRPC client prefers
 * them to the HTTP status (grpc/doc/http-grpc-status-mapping.md) and so shows kilnd's reason,
 * while any other HTTP client reads the HTTP status. A client still sending is then told to stop
 * with RST_STREAM(NO_ERROR) once the answer is out (grpc-server.c).
 *
 * "te: trailers" is not required: RFC 9113 lets a request go without it, grpc-go and grpc-java
 * serve such requests, and refusing them would refuse clients and proxies that work today (every
 * gRPC library sends it; the check is meant to catch proxies that drop trailers, which kilnd
 * cannot detect from its side anyway). A te with any other value is malformed HTTP/2 (RFC 9113
 * section 8.2.2): nghttp2 resets that stream (PROTOCOL_ERROR) before its headers reach kilnd.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc-impl.h"
#include "http-codec.h"

/* "<digits><unit>" with at most 8 digits (the gRPC spec's grpc-timeout); 0 when malformed.
 * 8 digits of hours pass 2^64 ns: a product that would wrap is UINT64_MAX (no deadline). */
static uint64_t parse_timeout_ns(const uint8_t *v, size_t n)
{
    if (n < 2 || n > 9)
        return 0;
    uint64_t x = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        if (v[i] < '0' || v[i] > '9')
            return 0;
        x = x * 10 + (uint64_t)(v[i] - '0');
    }
    static const struct {
        char unit;
        uint64_t ns;
    } units[] = {{'H', 3600000000000ull}, {'M', 60000000000ull}, {'S', 1000000000ull},
                 {'m', 1000000ull},       {'u', 1000ull},        {'n', 1ull}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (v[n - 1] == units[i].unit)
            return !x ? 1 : x > UINT64_MAX / units[i].ns ? UINT64_MAX : x * units[i].ns;
    return 0;
}

static bool header_is(const uint8_t *name, size_t n, const char *want)
{
    return n == strlen(want) && memcmp(name, want, n) == 0;
}

/* grpc-accept-encoding: a comma-separated list; only the codings kilnd can send matter. */
static unsigned accepted_codings(const uint8_t *value, size_t valuelen)
{
    unsigned codings = 0;
    for (size_t i = 0; i < valuelen;) {
        size_t j = i;
        while (j < valuelen && value[j] != ',')
            j++;
        size_t a = i, b = j;
        while (a < b && value[a] == ' ')
            a++;
        while (b > a && value[b - 1] == ' ')
            b--;
        char tok[16];
        if (b - a < sizeof tok) {
            memcpy(tok, value + a, b - a);
            tok[b - a] = '\0';
            enum kd_http_coding k = kd_http_coding_of(tok);
            if (k == KD_CODING_GZIP || k == KD_CODING_DEFLATE)
                codings |= 1u << k;
        }
        i = j + 1;
    }
    return codings;
}

int kd_grpc_on_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name, size_t namelen,
                      const uint8_t *value, size_t valuelen, uint8_t flags, void *user_data)
{
    (void)flags;
    struct kd_grpc_conn *c = user_data;
    struct grpc_stream *s = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
    if (!s || frame->hd.type != NGHTTP2_HEADERS)
        return 0;
    if (frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0; /* trailers from the client carry nothing gRPC uses */
    s->header_bytes += namelen + valuelen + 32;
    if (s->header_bytes > c->g->o.max_header_bytes) {
        s->header_overflow = true;
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* the stream is reset */
    }
    if (header_is(name, namelen, ":path")) {
        if (valuelen < sizeof s->path) {
            memcpy(s->path, value, valuelen);
            s->path[valuelen] = '\0';
        }
    } else if (header_is(name, namelen, ":method")) {
        s->method_post = valuelen == 4 && memcmp(value, "POST", 4) == 0;
    } else if (header_is(name, namelen, "content-type")) {
        s->grpc_content_type = valuelen >= 16 && memcmp(value, "application/grpc", 16) == 0 &&
                               (valuelen == 16 || value[16] == '+' || value[16] == ';');
    } else if (header_is(name, namelen, "authorization")) {
        /* kept whole, as over HTTP: a token is bounded by max_header_bytes only (a fixed
         * array had made long tokens work over HTTP and not here) */
        free(s->authorization);
        s->authorization = strndup((const char *)value, valuelen);
        if (!s->authorization)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* out of memory: the stream is reset */
    } else if (header_is(name, namelen, "grpc-timeout")) {
        uint64_t ns = parse_timeout_ns(value, valuelen);
        /* a timeout past the clock's range (thousands of years) is no deadline, not a wrapped one */
        if (ns && ns <= UINT64_MAX - s->opened_ns)
            s->deadline_ns = s->opened_ns + ns;
    } else if (header_is(name, namelen, "grpc-accept-encoding")) {
        s->accept_codings |= accepted_codings(value, valuelen);
    } else if (header_is(name, namelen, "grpc-encoding")) {
        size_t n = valuelen < sizeof s->coding_name - 1 ? valuelen : sizeof s->coding_name - 1;
        memcpy(s->coding_name, value, n);
        s->coding_name[n] = '\0';
        s->coding = valuelen < sizeof s->coding_name ? (int)kd_http_coding_of(s->coding_name) : KD_CODING_UNKNOWN;
    }
    return 0;
}

void kd_grpc_check_call(struct grpc_stream *s)
{
    if (!s->method_post) {
        kd_grpc_refuse_http(s, 405, GRPC_UNIMPLEMENTED, "a gRPC call is an HTTP POST");
        return;
    }
    if (!s->grpc_content_type) {
        kd_grpc_refuse_http(s, 415, GRPC_INVALID_ARGUMENT, "content-type must be application/grpc");
        return;
    }
    /* at once, not after the request message: a client need not upload a tensor to learn this */
    if (kd_grpc_refuse_unknown_method(s))
        return;
    s->streaming = kd_grpc_is_streaming(s->path);
    /* Answers are compressed only for a client that compresses its own requests and accepts the
     * same coding back: compressing costs more than it saves on the loopback and in a cluster
     * network, so a client asks for it by using it. */
    if ((s->coding == KD_CODING_GZIP || s->coding == KD_CODING_DEFLATE) && (s->accept_codings & (1u << s->coding)))
        s->resp_coding = s->coding;
}
