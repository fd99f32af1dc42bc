/*
 * tests/fuzz/fuzz_grpc.c — libFuzzer target for the gRPC service's decoding path: arbitrary
 * bytes, after the HTTP/2 client preface, go into one connection of api/grpc as if they came
 * from its socket — nghttp2's frame and HPACK decoding, the stream bookkeeping, gRPC message
 * framing with its length-prefix checks, method dispatch and protobuf-c unpacking of every
 * request message (the service has no model table here, so each call is unpacked and answered
 * UNAVAILABLE). The input is fed in two pieces, split where its first byte says, so partial
 * frames and prefixes are taken as they would be from a socket. Whatever the input, the
 * connection must answer or close without touching memory it does not own, and free
 * everything (leak checks on).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "grpc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint8_t preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    static struct kd_grpc *g; /* made once: the fuzzer calls this millions of times */
    if (!g) {
        struct kd_grpc_options o = {
            .host = "127.0.0.1",
            .max_message_bytes = 1 << 16,
            .max_concurrent_streams = 16,
            .max_header_bytes = 4096,
            .idle_timeout_ms = 1000,
        };
        if (kd_grpc_new(&g, NULL, &o) != 0)
            return 0;
    }
    struct kd_grpc_conn *c = kd_grpc_conn_detached(g);
    if (!c)
        return 0;
    size_t split = size ? data[0] % (size + 1) : 0;
    if (kd_grpc_conn_feed(c, preface, sizeof preface - 1) == 0 && kd_grpc_conn_feed(c, data, split) == 0)
        kd_grpc_conn_feed(c, data + split, size - split);
    kd_grpc_conn_free(c);
    return 0;
}
