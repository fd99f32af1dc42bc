/*
 * common/bytes.h — reading the byte encodings kiln decodes from untrusted input: fixed-width
 * little-endian integers (the remote tensor protocol) and protobuf varints (ONNX files, and
 * kilnd's fine-tuning writer). Byte by byte, so neither the host's byte order nor the input's
 * alignment matters. Header-only: a decoder compiled into a fuzz target or a daemon library
 * needs nothing else.
 */
#ifndef KILN_COMMON_BYTES_H
#define KILN_COMMON_BYTES_H

#include <stdint.h>

static inline uint16_t kiln_le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static inline uint32_t kiln_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t kiln_le64(const uint8_t *p)
{
    return (uint64_t)kiln_le32(p) | (uint64_t)kiln_le32(p + 4) << 32;
}

/** What kiln_varint_read found. */
enum kiln_varint_status {
    KILN_VARINT_OK = 0,
    KILN_VARINT_TRUNCATED = -1, /* the input ended inside the varint */
    KILN_VARINT_TOO_LONG = -2,  /* more than the 10 bytes a 64-bit value needs */
};

/** One protobuf varint from [*p, end) into *v; *p moves past what was read. */
static inline enum kiln_varint_status kiln_varint_read(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (*p >= end)
            return KILN_VARINT_TRUNCATED;
        uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return KILN_VARINT_OK;
        }
    }
    return KILN_VARINT_TOO_LONG;
}

#endif /* KILN_COMMON_BYTES_H */
