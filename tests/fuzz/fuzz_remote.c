/*
 * tests/fuzz/fuzz_remote.c — libFuzzer target for the remote tensor protocol's server side:
 * arbitrary bytes, as one WebSocket message of an established session, go through the decoder
 * and every check of backends/remote/remote-exec.c onto the ref device.
 *
 * Each input runs in a fresh session that already holds a few buffers (f32 data, i64 indices
 * with values in and out of range), so ops, views and index checks get real ids to work on;
 * small quotas keep a lucky input from allocating or computing for long. Whatever the input,
 * the session must answer or refuse it without reading or writing outside its buffers, and free
 * everything at the end (leak checks on).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kiln/kiln.h"
#include "remote-exec.h"
#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void add_alloc(kiln_wire_buf *b, uint64_t seq, uint64_t id, const void *bytes, size_t n)
{
    kiln_wire_msg m = {.h = {.version = 1, .type = KILN_WIRE_ALLOC, .seq = seq}};
    m.u.alloc.id = id;
    m.u.alloc.nbytes = n;
    m.u.alloc.has_data = true;
    m.u.alloc.data = bytes;
    char why[64];
    kiln_wire_encode(b, &m, why, sizeof why);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kiln_device *dev; /* opened once: the fuzzer calls this millions of times */
    static kiln_wire_buf setup;
    if (!dev) {
        dev = kiln_device_open("ref");
        float f[64];
        for (int i = 0; i < 64; i++)
            f[i] = (float)(i - 20) * 0.25f;
        int64_t idx[16] = {0, 1, 2, 3, 7, -1, 5, 4, 100, 0, 2, 2, 1, 0, 3, 1};
        uint8_t flags[16] = {1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 1, 0, 0, 1, 0};
        add_alloc(&setup, 1, 1, f, sizeof f);
        add_alloc(&setup, 2, 2, f, 128);
        add_alloc(&setup, 3, 3, idx, sizeof idx);
        add_alloc(&setup, 4, 4, flags, sizeof flags);
    }
    if (!dev)
        return 0;
    struct kiln__tstate_limits lim = {.max_live_bytes = 1u << 16, .max_ids = 16, .max_data_bytes = 1u << 16};
    struct kiln__tstate *st = kiln__tstate_new(&lim, 1);
    if (!st)
        return 0;
    kiln_wire_buf replies = {0};
    kiln__tstate_exec(st, dev, setup.p, setup.len, &replies);
    replies.len = 0;
    kiln__tstate_exec(st, dev, data, size, &replies);
    /* Every reply the session produced must itself decode. */
    size_t off = 0;
    while (off < replies.len) {
        kiln_wire_msg m;
        size_t used;
        char why[128];
        if (kiln_wire_decode(replies.p + off, replies.len - off, 1, &m, &used, why, sizeof why) != 0)
            __builtin_trap();
        off += used;
    }
    kiln_wire_buf_free(&replies);
    kiln__tstate_free(st);
    return 0;
}
