/*
 * tests/onnx/onnx-pb.h — a protobuf writer just big enough to build small ONNX graphs in a
 * test, byte by byte (field numbers from onnx.proto): a fixed buffer, varints, 32-bit
 * floats, length-delimited fields and nested messages. Overflowing the buffer is the test's bug, not an
 * input case, so it is not checked.
 */
#ifndef KILN_TESTS_ONNX_PB_H
#define KILN_TESTS_ONNX_PB_H

#include <stdint.h>
#include <string.h>

typedef struct pb {
    uint8_t b[4096];
    size_t n;
} pb;

static inline void pb_varint(pb *p, uint64_t v)
{
    do {
        p->b[p->n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
}
static inline void pb_int(pb *p, int field, uint64_t v)
{
    pb_varint(p, (uint64_t)field << 3);
    pb_varint(p, v);
}
/* A float field (wire type 5: four bytes, little-endian, as x86 and ARM store them). */
static inline void pb_f32(pb *p, int field, float v)
{
    pb_varint(p, (uint64_t)field << 3 | 5);
    memcpy(p->b + p->n, &v, 4);
    p->n += 4;
}
static inline void pb_bytes(pb *p, int field, const void *d, size_t n)
{
    pb_varint(p, (uint64_t)field << 3 | 2);
    pb_varint(p, n);
    memcpy(p->b + p->n, d, n);
    p->n += n;
}
static inline void pb_str(pb *p, int field, const char *s)
{
    pb_bytes(p, field, s, strlen(s));
}
static inline void pb_msg(pb *p, int field, const pb *m)
{
    pb_bytes(p, field, m->b, m->n);
}

#endif /* KILN_TESTS_ONNX_PB_H */
