/*
 * tests/fuzz/fuzz_chunked.c — libFuzzer target for the CLI's chunked-body decoder
 * (clients/chunked.c), which reads whatever a proxy in front of kilnd sends.
 *
 * Any byte string decodes without reading or writing out of bounds, in place as the CLI runs
 * it. Fed in pieces (the split points come from the input's first byte), the decoder must give
 * the payload it gives fed whole, or fail as it does: a chunk boundary or a recv() boundary may
 * fall anywhere. And the rest of the input, framed as chunks of sizes it names, must decode
 * back to itself.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chunked.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t step = (size_t)data[0] % 7 + 1;
    const char *in = (const char *)data + 1;
    size_t n = size - 1;

    char *whole = malloc(n + 1), *pieces = malloc(n + 1);
    if (!whole || !pieces)
        abort();
    memcpy(whole, in, n);
    memcpy(pieces, in, n);
    struct kiln_dechunk a = {0}, b = {0};
    long got_whole = kiln_dechunk(&a, whole, n, whole);
    if (got_whole > (long)n)
        abort();
    /* in pieces of step bytes, each decoded in place after what was decoded before */
    long got_pieces = 0;
    for (size_t off = 0; off < n && got_pieces >= 0; off += step) {
        size_t take = n - off < step ? n - off : step;
        long w = kiln_dechunk(&b, pieces + off, take, pieces + got_pieces);
        got_pieces = w < 0 ? -1 : got_pieces + w;
    }
    if ((got_whole < 0) != (got_pieces < 0))
        abort();
    if (got_whole >= 0 &&
        (got_whole != got_pieces || memcmp(whole, pieces, (size_t)got_whole) != 0 || a.done != b.done))
        abort();

    /* round trip: the payload framed in chunks of 1..step*3 bytes, with one trailer */
    char *framed = malloc(n * 24 + 64);
    if (!framed)
        abort();
    size_t f = 0;
    for (size_t off = 0, k = 1; off < n; k++) {
        size_t len = n - off < k % (step * 3) + 1 ? n - off : k % (step * 3) + 1;
        f += (size_t)sprintf(framed + f, "%zx\r\n", len);
        memcpy(framed + f, in + off, len);
        f += len;
        memcpy(framed + f, "\r\n", 2);
        f += 2;
        off += len;
    }
    f += (size_t)sprintf(framed + f, "0\r\nX: y\r\n\r\n");
    struct kiln_dechunk c = {0};
    long back = kiln_dechunk(&c, framed, f, framed);
    if (back != (long)n || memcmp(framed, in, n) != 0 || !c.done)
        abort();
    free(framed);
    free(whole);
    free(pieces);
    return 0;
}
