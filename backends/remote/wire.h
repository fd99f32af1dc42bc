/*
 * backends/remote/wire.h — the remote tensor protocol's messages (docs/remote-protocol.md).
 *
 * One WebSocket binary message carries one or more protocol messages back to back, each a
 * 24-byte header followed by its payload; all integers are little-endian. The encoder appends
 * messages to a growable byte buffer; the decoder turns one message into a plain struct without
 * allocating. Byte payloads (upload data, download data, error text) stay in the input buffer:
 * the decoded struct points into it, so it is valid only as long as that buffer is.
 *
 * The decoder checks structure only: magic, version, type, lengths, counts, enum ranges, dtypes,
 * ndim <= KILN_MAX_DIMS, non-negative shapes. Whether an id exists, whether a view fits its
 * buffer, whether shapes agree and whether a session stays within its limits is the server's
 * business (kiln_wire_op_check_shapes does the part that needs no session).
 */
#ifndef KILN_REMOTE_WIRE_H
#define KILN_REMOTE_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_WIRE_MAGIC 0x544e4c4bu /* "KLNT" as bytes on the wire */
#define KILN_WIRE_VERSION_MIN 1
#define KILN_WIRE_VERSION_MAX 1
#define KILN_WIRE_HEADER_SIZE 24
/** Longest error text, device name and device list the protocol carries. */
#define KILN_WIRE_TEXT_MAX 1024
#define KILN_WIRE_NAME_MAX 63
#define KILN_WIRE_MAX_DEVICES 16
/** The most operands, float and integer parameters one OP carries. */
#define KILN_WIRE_MAX_TD 6
#define KILN_WIRE_MAX_F 2
#define KILN_WIRE_MAX_I (2 * KILN_MAX_DIMS)

/** Message types. Client to server below 0x80, server to client from 0x80. */
typedef enum kiln_wire_type {
    KILN_WIRE_HELLO = 1,     /* client: versions it speaks, device it wants */
    KILN_WIRE_ALLOC = 2,     /* client: new buffer id, zeroed or from data */
    KILN_WIRE_UPLOAD = 3,    /* client: bytes into a buffer range */
    KILN_WIRE_OP = 4,        /* client: one backend primitive on buffer ids */
    KILN_WIRE_DOWNLOAD = 5,  /* client: read a buffer range (answered by DATA) */
    KILN_WIRE_RELEASE = 6,   /* client: free buffer ids */
    KILN_WIRE_SYNC = 7,      /* client: wait for all earlier work (answered by SYNC_DONE) */
    KILN_WIRE_WELCOME = 0x81,   /* server: chosen version and capabilities */
    KILN_WIRE_DATA = 0x82,      /* server: bytes of a DOWNLOAD */
    KILN_WIRE_SYNC_DONE = 0x83, /* server: all work up to the SYNC is done */
    KILN_WIRE_ERROR = 0x84,     /* server: a message failed */
} kiln_wire_type;

/** Primitive numbers of an OP message: one per kiln_backend_iface compute entry. */
typedef enum kiln_wire_prim {
    KILN_WIRE_P_FILL = 1,
    KILN_WIRE_P_ARANGE,
    KILN_WIRE_P_COPY,
    KILN_WIRE_P_RNG,
    KILN_WIRE_P_UNARY,
    KILN_WIRE_P_BINARY,
    KILN_WIRE_P_WHERE,
    KILN_WIRE_P_REDUCE,
    KILN_WIRE_P_ARG_REDUCE,
    KILN_WIRE_P_CUMSUM,
    KILN_WIRE_P_SORT,
    KILN_WIRE_P_GATHER,
    KILN_WIRE_P_SCATTER,
    KILN_WIRE_P_INDEX_SELECT,
    KILN_WIRE_P_INDEX_ADD,
    KILN_WIRE_P_MATMUL,
    KILN_WIRE_P_CONV,
    KILN_WIRE_P_CONV_BWD_INPUT,
    KILN_WIRE_P_CONV_BWD_WEIGHT,
    KILN_WIRE_P_POOL,
    KILN_WIRE_P_POOL_BWD,
    KILN_WIRE_P_ADAPTIVE_AVG_POOL,
    KILN_WIRE_P_ADAPTIVE_AVG_POOL_BWD,
    KILN_WIRE_P_INTERPOLATE,
    KILN_WIRE_P_INTERPOLATE_BWD,
    KILN_WIRE_P_PAD,
    KILN_WIRE_P_SOFTMAX,
    KILN_WIRE_P_LAYER_NORM,
    KILN_WIRE_P_COUNT
} kiln_wire_prim;

/** Boolean parameters of an OP (the flags byte). */
#define KILN_WIRE_OPF_IS_MAX        0x01u /* arg_reduce */
#define KILN_WIRE_OPF_DESCENDING    0x02u /* sort */
#define KILN_WIRE_OPF_ACCUMULATE    0x04u /* scatter */
#define KILN_WIRE_OPF_COUNT_PAD     0x08u /* pool, pool_backward: count_include_pad */
#define KILN_WIRE_OPF_ALIGN_CORNERS 0x10u /* interpolate, interpolate_backward */
#define KILN_WIRE_OPF_LOG           0x20u /* softmax: log-softmax */

/** Error codes of an ERROR message. */
typedef enum kiln_wire_err {
    KILN_WIRE_ERR_MALFORMED = 1, /* the message's payload did not decode */
    KILN_WIRE_ERR_BAD_ID,        /* unknown id, or ALLOC of an id in use */
    KILN_WIRE_ERR_BAD_RANGE,     /* a view or byte range outside its buffer */
    KILN_WIRE_ERR_BAD_SHAPE,     /* operands that do not fit the primitive */
    KILN_WIRE_ERR_QUOTA,         /* a session limit would be exceeded */
    KILN_WIRE_ERR_NOT_SUPPORTED, /* the device cannot do this op or dtype */
    KILN_WIRE_ERR_DEVICE,        /* the primitive itself failed on the device */
    KILN_WIRE_ERR_VERSION,       /* no common protocol version, or unknown device */
    KILN_WIRE_ERR_PROTOCOL,      /* a framing violation; the server closes after this */
    KILN_WIRE_ERR_COUNT
} kiln_wire_err;

typedef struct kiln_wire_header {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    uint32_t flags;     /* reserved, 0 in version 1 */
    uint64_t seq;       /* client: strictly increasing per session; server: the request answered */
    uint32_t length;    /* payload bytes after the header */
} kiln_wire_header;

/** One operand: a strided view of a buffer id (element strides and offset, as kiln_tdesc). */
typedef struct kiln_wire_td {
    uint64_t id;        /* 0 = absent (only where the primitive's operand is optional) */
    int64_t offset;
    kiln_dtype dtype;
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    int64_t strides[KILN_MAX_DIMS];
} kiln_wire_td;

typedef struct kiln_wire_op {
    kiln_wire_prim prim;
    uint32_t sub;       /* the op/kind/mode enum of the primitive family, else 0 */
    uint32_t flags;     /* KILN_WIRE_OPF_* */
    int ntd, nf, ni;
    kiln_wire_td td[KILN_WIRE_MAX_TD];
    double f[KILN_WIRE_MAX_F];
    int64_t i[KILN_WIRE_MAX_I];
} kiln_wire_op;

typedef struct kiln_wire_msg {
    kiln_wire_header h;
    union {
        struct { uint16_t min_version, max_version; char device[KILN_WIRE_NAME_MAX + 1]; } hello;
        struct { uint64_t id, nbytes; bool has_data; const uint8_t *data; } alloc;
        struct { uint64_t id, offset, length; const uint8_t *data; } upload;
        kiln_wire_op op;
        struct { uint64_t id, offset, length; } download;
        struct { uint32_t count; const uint8_t *ids; } release; /* kiln_wire_release_id */
        struct {
            uint16_t version;
            uint32_t dtype_mask;          /* bit d: the device computes kiln_dtype d */
            uint64_t max_message_bytes, max_live_bytes;
            uint32_t max_ids, max_queued_ops;
            int ndevices;
            char devices[KILN_WIRE_MAX_DEVICES][KILN_WIRE_NAME_MAX + 1];
        } welcome;
        struct { uint64_t length; const uint8_t *data; } data;
        struct { uint32_t code; uint16_t failed_type; uint16_t text_len; const uint8_t *text; } error;
    } u;
} kiln_wire_msg;

/* ---- decoding. Results: 0, or one of these (why gets a message naming the problem). */
#define KILN_WIRE_EFRAME (-1) /* header or framing unusable: the connection must close */
#define KILN_WIRE_EMSG   (-2) /* header fine, payload malformed: answer ERROR, skip `consumed` */

/**
 * Decode the message at p (n bytes available, the rest of the WebSocket message). On 0 or
 * KILN_WIRE_EMSG, *consumed is header + payload length, so the caller can go on with the next
 * message; on KILN_WIRE_EFRAME nothing after the failure can be trusted.
 * `version` is the negotiated version, or 0 before HELLO/WELCOME (any supported version is
 * accepted then). The caller checks which direction's types it accepts.
 */
int kiln_wire_decode(const uint8_t *p, size_t n, uint16_t version, kiln_wire_msg *out, size_t *consumed,
                     char *why, size_t why_len);

/** The i-th id of a decoded RELEASE (i < count). */
uint64_t kiln_wire_release_id(const kiln_wire_msg *m, uint32_t i);

/** Bytes one element of dtype takes (1 for bool and u8), 0 for an unknown dtype. */
size_t kiln_wire_dtype_size(kiln_dtype dt);

/** The operand counts a primitive takes, and which operands may be absent (bit per operand). */
typedef struct kiln_wire_prim_info {
    const char *name;
    int ntd, nf, ni;    /* ni = -1: 2 * ndim of operand 0 (pad) */
    uint32_t nsub;      /* sub must be < nsub (1 when unused) */
    uint32_t flags;     /* KILN_WIRE_OPF_* bits allowed */
    uint32_t optional;  /* operand bits that may have id 0 */
} kiln_wire_prim_info;

/** NULL when prim is not a primitive number. */
const kiln_wire_prim_info *kiln_wire_prim_lookup(uint32_t prim);

/**
 * The shape preconditions backends/backend.h states for op's primitive (operand shapes and
 * dtypes agree, dims in range, geometry consistent), on a decoded op. Needs no session: the
 * server still checks ids and that every view lies inside its buffer (kiln_wire_td_span).
 * 0, or -1 with why set.
 */
int kiln_wire_op_check_shapes(const kiln_wire_op *op, char *why, size_t why_len);

/**
 * The element range a view touches: on success *lo and *hi (inclusive, in elements from the
 * buffer start) bound every element; an empty view (some dim 0) sets *empty. -1 when the
 * arithmetic overflows.
 */
int kiln_wire_td_span(const kiln_wire_td *td, int64_t *lo, int64_t *hi, bool *empty);

/* ---- encoding */
typedef struct kiln_wire_buf {
    uint8_t *p;
    size_t len, cap;
} kiln_wire_buf;

/** Append m (its header's version, type and seq are used; magic and length are filled in).
 *  0, or -1 when out of memory or m does not fit the protocol (why set). */
int kiln_wire_encode(kiln_wire_buf *b, const kiln_wire_msg *m, char *why, size_t why_len);
/** Reserve room for n more bytes. 0 or -1. */
int kiln_wire_buf_reserve(kiln_wire_buf *b, size_t n);
void kiln_wire_buf_free(kiln_wire_buf *b);

const char *kiln_wire_type_name(uint16_t type);
const char *kiln_wire_err_name(uint32_t code);

/* Internal to wire.c and wire-check.c: format why (when given) and return rc. */
int kiln__wire_fail(int rc, char *why, size_t why_len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#ifdef __cplusplus
}
#endif
#endif /* KILN_REMOTE_WIRE_H */
