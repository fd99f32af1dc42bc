/*
 * backends/remote/wire.c — encoder and strict decoder of the remote tensor protocol (the shape
 * checks of a decoded op are in wire-check.c).
 *
 * Everything is read and written byte by byte in little-endian order, so the code neither
 * depends on the host's byte order nor on the alignment of the input. The decoder never
 * allocates: counts read from the wire only index fixed-size arrays after being checked
 * against them, and byte payloads are handed out as pointers into the input.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "common/bytes.h"
#include "wire.h"

/* ---- little-endian access */

static double getf64(const uint8_t *p)
{
    uint64_t u = kiln_le64(p);
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

int kiln__wire_fail(int rc, char *why, size_t why_len, const char *fmt, ...)
{
    if (why && why_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_len, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* ---- tables */

#define OPT(k) (1u << (k))

static const kiln_wire_prim_info prims[KILN_WIRE_P_COUNT] = {
    [KILN_WIRE_P_FILL] = {"fill", 1, 1, 0, 1, 0, 0},
    [KILN_WIRE_P_ARANGE] = {"arange", 1, 2, 0, 1, 0, 0},
    [KILN_WIRE_P_COPY] = {"copy", 2, 0, 0, 1, 0, 0},
    [KILN_WIRE_P_RNG] = {"rng", 1, 2, 2, KILN_RNG_COUNT, 0, 0},
    [KILN_WIRE_P_UNARY] = {"unary", 2, 2, 0, KILN_UNARY_COUNT, 0, 0},
    [KILN_WIRE_P_BINARY] = {"binary", 3, 0, 0, KILN_BINARY_COUNT, 0, 0},
    [KILN_WIRE_P_WHERE] = {"where", 4, 0, 0, 1, 0, 0},
    [KILN_WIRE_P_REDUCE] = {"reduce", 2, 1, 1, KILN_REDUCE_COUNT, 0, 0},
    [KILN_WIRE_P_ARG_REDUCE] = {"arg_reduce", 2, 0, 1, 1, KILN_WIRE_OPF_IS_MAX, 0},
    [KILN_WIRE_P_CUMSUM] = {"cumsum", 2, 0, 1, 1, 0, 0},
    [KILN_WIRE_P_SORT] = {"sort", 3, 0, 1, 1, KILN_WIRE_OPF_DESCENDING, 0},
    [KILN_WIRE_P_GATHER] = {"gather", 3, 0, 1, 1, 0, 0},
    [KILN_WIRE_P_SCATTER] = {"scatter", 3, 0, 1, 1, KILN_WIRE_OPF_ACCUMULATE, 0},
    [KILN_WIRE_P_INDEX_SELECT] = {"index_select", 3, 0, 1, 1, 0, 0},
    [KILN_WIRE_P_INDEX_ADD] = {"index_add", 3, 0, 1, 1, 0, 0},
    [KILN_WIRE_P_MATMUL] = {"matmul", 3, 0, 0, 1, 0, 0},
    [KILN_WIRE_P_CONV] = {"conv", 4, 0, 11, 1, 0, OPT(3)},
    [KILN_WIRE_P_CONV_BWD_INPUT] = {"conv_backward_input", 3, 0, 11, 1, 0, 0},
    [KILN_WIRE_P_CONV_BWD_WEIGHT] = {"conv_backward_weight", 3, 0, 11, 1, 0, 0},
    [KILN_WIRE_P_POOL] = {"pool", 3, 0, 13, KILN_POOL_COUNT, KILN_WIRE_OPF_COUNT_PAD, OPT(1)},
    [KILN_WIRE_P_POOL_BWD] = {"pool_backward", 3, 0, 13, KILN_POOL_COUNT, KILN_WIRE_OPF_COUNT_PAD, OPT(2)},
    [KILN_WIRE_P_ADAPTIVE_AVG_POOL] = {"adaptive_avg_pool", 2, 0, 1, 1, 0, 0},
    [KILN_WIRE_P_ADAPTIVE_AVG_POOL_BWD] = {"adaptive_avg_pool_backward", 2, 0, 1, 1, 0, 0},
    [KILN_WIRE_P_INTERPOLATE] = {"interpolate", 2, 0, 0, 2, KILN_WIRE_OPF_ALIGN_CORNERS, 0},
    [KILN_WIRE_P_INTERPOLATE_BWD] = {"interpolate_backward", 2, 0, 0, 2, KILN_WIRE_OPF_ALIGN_CORNERS, 0},
    [KILN_WIRE_P_PAD] = {"pad", 2, 1, -1, 3, 0, 0},
    [KILN_WIRE_P_SOFTMAX] = {"softmax", 2, 0, 1, 1, KILN_WIRE_OPF_LOG, 0},
    [KILN_WIRE_P_LAYER_NORM] = {"layer_norm", 6, 1, 1, 1, 0, OPT(1) | OPT(2) | OPT(4) | OPT(5)},
};

const kiln_wire_prim_info *kiln_wire_prim_lookup(uint32_t prim)
{
    if (prim == 0 || prim >= KILN_WIRE_P_COUNT)
        return NULL;
    return &prims[prim];
}

size_t kiln_wire_dtype_size(kiln_dtype dt)
{
    switch (dt) {
    case KILN_F64:
    case KILN_I64: return 8;
    case KILN_F32:
    case KILN_I32: return 4;
    case KILN_F16:
    case KILN_BF16: return 2;
    case KILN_U8:
    case KILN_BOOL: return 1;
    default: return 0;
    }
}

const char *kiln_wire_type_name(uint16_t type)
{
    switch (type) {
    case KILN_WIRE_HELLO: return "HELLO";
    case KILN_WIRE_ALLOC: return "ALLOC";
    case KILN_WIRE_UPLOAD: return "UPLOAD";
    case KILN_WIRE_OP: return "OP";
    case KILN_WIRE_DOWNLOAD: return "DOWNLOAD";
    case KILN_WIRE_RELEASE: return "RELEASE";
    case KILN_WIRE_SYNC: return "SYNC";
    case KILN_WIRE_WELCOME: return "WELCOME";
    case KILN_WIRE_DATA: return "DATA";
    case KILN_WIRE_SYNC_DONE: return "SYNC_DONE";
    case KILN_WIRE_ERROR: return "ERROR";
    default: return "unknown";
    }
}

const char *kiln_wire_err_name(uint32_t code)
{
    static const char *const names[KILN_WIRE_ERR_COUNT] = {
        [KILN_WIRE_ERR_MALFORMED] = "malformed",   [KILN_WIRE_ERR_BAD_ID] = "bad id",
        [KILN_WIRE_ERR_BAD_RANGE] = "bad range",   [KILN_WIRE_ERR_BAD_SHAPE] = "bad shape",
        [KILN_WIRE_ERR_QUOTA] = "quota",           [KILN_WIRE_ERR_NOT_SUPPORTED] = "not supported",
        [KILN_WIRE_ERR_DEVICE] = "device",         [KILN_WIRE_ERR_VERSION] = "version",
        [KILN_WIRE_ERR_PROTOCOL] = "protocol",
    };
    return code > 0 && code < KILN_WIRE_ERR_COUNT ? names[code] : "unknown";
}

static bool known_type(uint16_t t)
{
    return (t >= KILN_WIRE_HELLO && t <= KILN_WIRE_SYNC) || (t >= KILN_WIRE_WELCOME && t <= KILN_WIRE_ERROR);
}

/* Device names: what kiln_device_open's specs are made of, nothing that could confuse a log. */
static bool name_ok(const uint8_t *p, size_t n)
{
    if (n == 0 || n > KILN_WIRE_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = p[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == ':' ||
              c == '_' || c == '-' || c == '.'))
            return false;
    }
    return true;
}

static bool zeros(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

/* ---- decoding */

#define TD_FIXED 24 /* id, offset, dtype, ndim, 6 reserved */
#define OP_FIXED 8  /* prim u16, sub u8, flags u8, ntd, nf, ni, reserved */

static int decode_op(const uint8_t *p, uint32_t len, kiln_wire_op *op, char *why, size_t wl)
{
    if (len < OP_FIXED)
        return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "OP: payload of %u bytes is shorter than its fixed part",
                               len);
    memset(op, 0, sizeof *op);
    uint16_t prim = kiln_le16(p);
    const kiln_wire_prim_info *info = kiln_wire_prim_lookup(prim);
    if (!info)
        return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "OP: unknown primitive %u", prim);
    op->prim = (kiln_wire_prim)prim;
    op->sub = p[2];
    op->flags = p[3];
    unsigned ntd = p[4], nf = p[5], ni = p[6];
    if (p[7])
        return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "OP %s: reserved byte is not 0", info->name);
    if (op->sub >= info->nsub)
        return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "OP %s: sub-op %u out of range (< %u)", info->name,
                               op->sub, info->nsub);
    if (op->flags & ~info->flags)
        return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "OP %s: flags 0x%x not allowed", info->name, op->flags);
    if ((int)ntd != info->ntd || (int)nf != info->nf || (info->ni >= 0 && (int)ni != info->ni) ||
        ni > KILN_WIRE_MAX_I)
        return kiln__wire_fail(KILN_WIRE_EMSG, why, wl,
                               "OP %s: takes %d operands, %d floats, %d ints; got %u, %u, %u", info->name,
                               info->ntd, info->nf, info->ni, ntd, nf, ni);
    size_t pos = OP_FIXED;
    size_t need = pos + 8u * nf + 8u * ni;
    if (need > len)
        return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "OP %s: parameters run past the payload", info->name);
    for (unsigned k = 0; k < nf; k++, pos += 8)
        op->f[k] = getf64(p + pos);
    for (unsigned k = 0; k < ni; k++, pos += 8)
        op->i[k] = (int64_t)kiln_le64(p + pos);
    op->ntd = (int)ntd;
    op->nf = (int)nf;
    op->ni = (int)ni;
    for (unsigned k = 0; k < ntd; k++) {
        kiln_wire_td *td = &op->td[k];
        if (len - pos < TD_FIXED)
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "OP %s: operand %u runs past the payload", info->name,
                                   k);
        td->id = kiln_le64(p + pos);
        td->offset = (int64_t)kiln_le64(p + pos + 8);
        uint8_t dt = p[pos + 16], nd = p[pos + 17];
        if (!zeros(p + pos + 18, 6))
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "OP %s: operand %u: reserved bytes are not 0",
                                   info->name, k);
        pos += TD_FIXED;
        if (td->id == 0) {
            if (!(info->optional & OPT(k)))
                return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "OP %s: operand %u is required (id 0)", info->name,
                                       k);
            if (td->offset || dt || nd)
                return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "OP %s: absent operand %u has fields set",
                                       info->name, k);
            continue;
        }
        if (dt >= KILN_DTYPE_COUNT)
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "OP %s: operand %u: unknown dtype %u", info->name, k,
                                   dt);
        if (nd > KILN_MAX_DIMS)
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "OP %s: operand %u: ndim %u > %d", info->name, k, nd,
                                   KILN_MAX_DIMS);
        if (td->offset < 0)
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "OP %s: operand %u: negative offset", info->name, k);
        td->dtype = (kiln_dtype)dt;
        td->ndim = nd;
        if (len - pos < 16u * nd)
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "OP %s: operand %u: dims run past the payload",
                                   info->name, k);
        for (unsigned d = 0; d < nd; d++) {
            td->shape[d] = (int64_t)kiln_le64(p + pos + 8 * d);
            td->strides[d] = (int64_t)kiln_le64(p + pos + 8 * (nd + d));
            if (td->shape[d] < 0)
                return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "OP %s: operand %u: negative size in dim %u",
                                       info->name, k, d);
        }
        pos += 16u * nd;
    }
    if (pos != len)
        return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "OP %s: %zu bytes left over after the operands",
                               info->name, (size_t)len - pos);
    if (info->ni < 0 && (op->td[0].id == 0 || (int)ni != 2 * op->td[0].ndim))
        return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "OP %s: takes 2 ints per dim of operand 0, got %u",
                               info->name, ni);
    return 0;
}

int kiln_wire_decode(const uint8_t *p, size_t n, uint16_t version, kiln_wire_msg *out, size_t *consumed,
                     char *why, size_t wl)
{
    *consumed = 0;
    memset(out, 0, sizeof *out);
    if (n < KILN_WIRE_HEADER_SIZE)
        return kiln__wire_fail(KILN_WIRE_EFRAME, why, wl,
                               "message of %zu bytes is shorter than the %d-byte header", n,
                               KILN_WIRE_HEADER_SIZE);
    kiln_wire_header *h = &out->h;
    h->magic = kiln_le32(p);
    h->version = kiln_le16(p + 4);
    h->type = kiln_le16(p + 6);
    h->flags = kiln_le32(p + 8);
    h->seq = kiln_le64(p + 12);
    h->length = kiln_le32(p + 20);
    if (h->magic != KILN_WIRE_MAGIC)
        return kiln__wire_fail(KILN_WIRE_EFRAME, why, wl, "bad magic 0x%08x", h->magic);
    if (version ? h->version != version
                : (h->version < KILN_WIRE_VERSION_MIN || h->version > KILN_WIRE_VERSION_MAX) &&
                      h->type != KILN_WIRE_HELLO)
        return kiln__wire_fail(KILN_WIRE_EFRAME, why, wl, "header version %u (expected %u)", h->version,
                               version ? version : KILN_WIRE_VERSION_MAX);
    if (h->flags)
        return kiln__wire_fail(KILN_WIRE_EFRAME, why, wl, "reserved header flags 0x%x set", h->flags);
    if (!known_type(h->type))
        return kiln__wire_fail(KILN_WIRE_EFRAME, why, wl, "unknown message type 0x%x", h->type);
    if (h->length > n - KILN_WIRE_HEADER_SIZE)
        return kiln__wire_fail(KILN_WIRE_EFRAME, why, wl,
                               "%s payload of %u bytes runs past the %zu left in the frame",
                               kiln_wire_type_name(h->type), h->length, n - KILN_WIRE_HEADER_SIZE);
    *consumed = KILN_WIRE_HEADER_SIZE + (size_t)h->length;
    const uint8_t *q = p + KILN_WIRE_HEADER_SIZE;
    uint32_t len = h->length;
    const char *tn = kiln_wire_type_name(h->type);

    switch (h->type) {
    case KILN_WIRE_HELLO: {
        if (len < 5 || len != 5u + q[4])
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "HELLO: payload length %u does not match its name",
                                   len);
        out->u.hello.min_version = kiln_le16(q);
        out->u.hello.max_version = kiln_le16(q + 2);
        if (out->u.hello.min_version == 0 || out->u.hello.min_version > out->u.hello.max_version)
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "HELLO: bad version range %u..%u",
                                   out->u.hello.min_version, out->u.hello.max_version);
        if (!name_ok(q + 5, q[4]))
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "HELLO: bad device name");
        memcpy(out->u.hello.device, q + 5, q[4]);
        return 0;
    }
    case KILN_WIRE_ALLOC: {
        if (len < 24)
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "ALLOC: payload of %u bytes, expected at least 24",
                                   len);
        out->u.alloc.id = kiln_le64(q);
        out->u.alloc.nbytes = kiln_le64(q + 8);
        uint8_t mode = q[16];
        if (mode > 1 || !zeros(q + 17, 7))
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "ALLOC: bad mode %u or reserved bytes set", mode);
        if (out->u.alloc.id == 0)
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "ALLOC: id 0 is reserved");
        out->u.alloc.has_data = mode == 1;
        uint64_t want = 24 + (mode ? out->u.alloc.nbytes : 0);
        if (len != want)
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "ALLOC: payload of %u bytes, expected %llu", len,
                                   (unsigned long long)want);
        out->u.alloc.data = mode ? q + 24 : NULL;
        return 0;
    }
    case KILN_WIRE_UPLOAD:
    case KILN_WIRE_DOWNLOAD: {
        if (len < 24)
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "%s: payload of %u bytes, expected at least 24", tn,
                                   len);
        uint64_t id = kiln_le64(q), off = kiln_le64(q + 8), cnt = kiln_le64(q + 16);
        if (id == 0)
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "%s: id 0 is reserved", tn);
        if (off > UINT64_MAX - cnt)
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "%s: offset + length overflows", tn);
        if (h->type == KILN_WIRE_DOWNLOAD) {
            if (len != 24)
                return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "DOWNLOAD: payload of %u bytes, expected 24", len);
            out->u.download.id = id;
            out->u.download.offset = off;
            out->u.download.length = cnt;
        } else {
            if (len - 24u != cnt)
                return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "UPLOAD: %llu data bytes announced, %u sent",
                                       (unsigned long long)cnt, len - 24u);
            out->u.upload.id = id;
            out->u.upload.offset = off;
            out->u.upload.length = cnt;
            out->u.upload.data = q + 24;
        }
        return 0;
    }
    case KILN_WIRE_OP:
        return decode_op(q, len, &out->u.op, why, wl);
    case KILN_WIRE_RELEASE: {
        if (len < 8 || kiln_le32(q + 4) || (len - 8u) % 8u || (len - 8u) / 8u != kiln_le32(q))
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "RELEASE: payload of %u bytes does not hold its count",
                                   len);
        out->u.release.count = kiln_le32(q);
        out->u.release.ids = q + 8;
        for (uint32_t i = 0; i < out->u.release.count; i++)
            if (kiln_le64(q + 8 + 8 * (size_t)i) == 0)
                return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "RELEASE: id 0 is reserved");
        return 0;
    }
    case KILN_WIRE_SYNC:
    case KILN_WIRE_SYNC_DONE:
        if (len)
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "%s: payload must be empty, got %u bytes", tn, len);
        return 0;
    case KILN_WIRE_WELCOME: {
        if (len < 40)
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "WELCOME: payload of %u bytes, expected at least 40",
                                   len);
        out->u.welcome.version = kiln_le16(q);
        out->u.welcome.dtype_mask = kiln_le32(q + 4);
        out->u.welcome.max_message_bytes = kiln_le64(q + 8);
        out->u.welcome.max_live_bytes = kiln_le64(q + 16);
        out->u.welcome.max_ids = kiln_le32(q + 24);
        out->u.welcome.max_queued_ops = kiln_le32(q + 28);
        unsigned nd = q[32];
        if (kiln_le16(q + 2) || !zeros(q + 33, 7))
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "WELCOME: reserved bytes set");
        if (out->u.welcome.version < KILN_WIRE_VERSION_MIN || out->u.welcome.version > KILN_WIRE_VERSION_MAX)
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "WELCOME: version %u not spoken here",
                                   out->u.welcome.version);
        if (out->u.welcome.dtype_mask >> KILN_DTYPE_COUNT)
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "WELCOME: unknown dtypes in mask 0x%x",
                                   out->u.welcome.dtype_mask);
        if (nd > KILN_WIRE_MAX_DEVICES)
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "WELCOME: %u devices (at most %d)", nd,
                                   KILN_WIRE_MAX_DEVICES);
        size_t pos = 40;
        for (unsigned k = 0; k < nd; k++) {
            if (pos >= len || len - pos - 1 < q[pos] || !name_ok(q + pos + 1, q[pos]))
                return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "WELCOME: device name %u malformed", k);
            memcpy(out->u.welcome.devices[k], q + pos + 1, q[pos]);
            pos += 1u + q[pos];
        }
        if (pos != len)
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "WELCOME: %zu bytes left over", (size_t)len - pos);
        out->u.welcome.ndevices = (int)nd;
        return 0;
    }
    case KILN_WIRE_DATA:
        out->u.data.length = len;
        out->u.data.data = q;
        return 0;
    case KILN_WIRE_ERROR: {
        if (len < 8 || len != 8u + kiln_le16(q + 6))
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "ERROR: payload length %u does not match its text",
                                   len);
        out->u.error.code = kiln_le32(q);
        out->u.error.failed_type = kiln_le16(q + 4);
        out->u.error.text_len = kiln_le16(q + 6);
        out->u.error.text = q + 8;
        if (out->u.error.code == 0 || out->u.error.code >= KILN_WIRE_ERR_COUNT)
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "ERROR: unknown code %u", out->u.error.code);
        if (out->u.error.text_len > KILN_WIRE_TEXT_MAX)
            return kiln__wire_fail(KILN_WIRE_EMSG, why, wl, "ERROR: text of %u bytes (at most %d)",
                                   out->u.error.text_len, KILN_WIRE_TEXT_MAX);
        return 0;
    }
    default: return kiln__wire_fail(KILN_WIRE_EFRAME, why, wl, "unknown message type 0x%x", h->type);
    }
}

uint64_t kiln_wire_release_id(const kiln_wire_msg *m, uint32_t i)
{
    return kiln_le64(m->u.release.ids + 8 * (size_t)i);
}

/* ---- encoding */

int kiln_wire_buf_reserve(kiln_wire_buf *b, size_t n)
{
    if (b->cap - b->len >= n)
        return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap - b->len < n) {
        if (cap > SIZE_MAX / 2)
            return -1;
        cap *= 2;
    }
    uint8_t *p = realloc(b->p, cap);
    if (!p)
        return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

void kiln_wire_buf_free(kiln_wire_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

static size_t payload_size(const kiln_wire_msg *m, char *why, size_t wl, bool *ok)
{
    *ok = true;
    switch (m->h.type) {
    case KILN_WIRE_HELLO: return 5 + strlen(m->u.hello.device);
    case KILN_WIRE_ALLOC: return 24 + (m->u.alloc.has_data ? m->u.alloc.nbytes : 0);
    case KILN_WIRE_UPLOAD: return 24 + m->u.upload.length;
    case KILN_WIRE_DOWNLOAD: return 24;
    case KILN_WIRE_RELEASE: return 8 + 8 * (size_t)m->u.release.count;
    case KILN_WIRE_SYNC:
    case KILN_WIRE_SYNC_DONE: return 0;
    case KILN_WIRE_DATA: return m->u.data.length;
    case KILN_WIRE_ERROR: return 8 + (size_t)m->u.error.text_len;
    case KILN_WIRE_WELCOME: {
        size_t n = 40;
        for (int k = 0; k < m->u.welcome.ndevices; k++)
            n += 1 + strlen(m->u.welcome.devices[k]);
        return n;
    }
    case KILN_WIRE_OP: {
        const kiln_wire_op *op = &m->u.op;
        size_t n = OP_FIXED + 8 * (size_t)(op->nf + op->ni);
        for (int k = 0; k < op->ntd; k++)
            n += TD_FIXED + (op->td[k].id ? 16 * (size_t)op->td[k].ndim : 0);
        return n;
    }
    default:
        *ok = false;
        kiln__wire_fail(-1, why, wl, "cannot encode message type 0x%x", m->h.type);
        return 0;
    }
}

int kiln_wire_encode(kiln_wire_buf *b, const kiln_wire_msg *m, char *why, size_t wl)
{
    bool ok;
    size_t len = payload_size(m, why, wl, &ok);
    if (!ok)
        return -1;
    if (len > UINT32_MAX)
        return kiln__wire_fail(-1, why, wl, "%s payload of %zu bytes is too large", kiln_wire_type_name(m->h.type),
                               len);
    if (m->h.type == KILN_WIRE_OP) {
        const kiln_wire_op *op = &m->u.op;
        if (op->ntd < 0 || op->ntd > KILN_WIRE_MAX_TD || op->nf < 0 || op->nf > KILN_WIRE_MAX_F || op->ni < 0 ||
            op->ni > KILN_WIRE_MAX_I || op->sub > 255 || op->flags > 255 || (unsigned)op->prim > 0xffff)
            return kiln__wire_fail(-1, why, wl, "OP does not fit the protocol");
        for (int k = 0; k < op->ntd; k++)
            if (op->td[k].ndim < 0 || op->td[k].ndim > KILN_MAX_DIMS)
                return kiln__wire_fail(-1, why, wl, "OP operand %d: ndim %d", k, op->td[k].ndim);
    }
    if (m->h.type == KILN_WIRE_WELCOME && (m->u.welcome.ndevices < 0 || m->u.welcome.ndevices > KILN_WIRE_MAX_DEVICES))
        return kiln__wire_fail(-1, why, wl, "WELCOME: %d devices", m->u.welcome.ndevices);
    if (kiln_wire_buf_reserve(b, KILN_WIRE_HEADER_SIZE + len) < 0)
        return kiln__wire_fail(-1, why, wl, "out of memory encoding %s", kiln_wire_type_name(m->h.type));
    uint8_t *p = b->p + b->len;
    put32(p, KILN_WIRE_MAGIC);
    put16(p + 4, m->h.version);
    put16(p + 6, m->h.type);
    put32(p + 8, 0);
    put64(p + 12, m->h.seq);
    put32(p + 20, (uint32_t)len);
    uint8_t *q = p + KILN_WIRE_HEADER_SIZE;
    memset(q, 0, len < 64 ? len : 64); /* reserved fields sit in the first bytes */
    switch (m->h.type) {
    case KILN_WIRE_HELLO: {
        size_t nl = strlen(m->u.hello.device);
        put16(q, m->u.hello.min_version);
        put16(q + 2, m->u.hello.max_version);
        q[4] = (uint8_t)nl;
        memcpy(q + 5, m->u.hello.device, nl);
        break;
    }
    case KILN_WIRE_ALLOC:
        put64(q, m->u.alloc.id);
        put64(q + 8, m->u.alloc.nbytes);
        q[16] = m->u.alloc.has_data ? 1 : 0;
        if (m->u.alloc.has_data && m->u.alloc.nbytes)
            memcpy(q + 24, m->u.alloc.data, m->u.alloc.nbytes);
        break;
    case KILN_WIRE_UPLOAD:
        put64(q, m->u.upload.id);
        put64(q + 8, m->u.upload.offset);
        put64(q + 16, m->u.upload.length);
        if (m->u.upload.length)
            memcpy(q + 24, m->u.upload.data, m->u.upload.length);
        break;
    case KILN_WIRE_DOWNLOAD:
        put64(q, m->u.download.id);
        put64(q + 8, m->u.download.offset);
        put64(q + 16, m->u.download.length);
        break;
    case KILN_WIRE_RELEASE:
        put32(q, m->u.release.count);
        if (m->u.release.count)
            memcpy(q + 8, m->u.release.ids, 8 * (size_t)m->u.release.count);
        break;
    case KILN_WIRE_SYNC:
    case KILN_WIRE_SYNC_DONE:
        break;
    case KILN_WIRE_DATA:
        if (m->u.data.length)
            memcpy(q, m->u.data.data, m->u.data.length);
        break;
    case KILN_WIRE_ERROR:
        put32(q, m->u.error.code);
        put16(q + 4, m->u.error.failed_type);
        put16(q + 6, m->u.error.text_len);
        if (m->u.error.text_len)
            memcpy(q + 8, m->u.error.text, m->u.error.text_len);
        break;
    case KILN_WIRE_WELCOME: {
        put16(q, m->u.welcome.version);
        put32(q + 4, m->u.welcome.dtype_mask);
        put64(q + 8, m->u.welcome.max_message_bytes);
        put64(q + 16, m->u.welcome.max_live_bytes);
        put32(q + 24, m->u.welcome.max_ids);
        put32(q + 28, m->u.welcome.max_queued_ops);
        q[32] = (uint8_t)m->u.welcome.ndevices;
        size_t pos = 40;
        for (int k = 0; k < m->u.welcome.ndevices; k++) {
            size_t nl = strlen(m->u.welcome.devices[k]);
            q[pos] = (uint8_t)nl;
            memcpy(q + pos + 1, m->u.welcome.devices[k], nl);
            pos += 1 + nl;
        }
        break;
    }
    case KILN_WIRE_OP: {
        const kiln_wire_op *op = &m->u.op;
        put16(q, (uint16_t)op->prim);
        q[2] = (uint8_t)op->sub;
        q[3] = (uint8_t)op->flags;
        q[4] = (uint8_t)op->ntd;
        q[5] = (uint8_t)op->nf;
        q[6] = (uint8_t)op->ni;
        q[7] = 0;
        size_t pos = OP_FIXED;
        for (int k = 0; k < op->nf; k++, pos += 8) {
            uint64_t u;
            memcpy(&u, &op->f[k], sizeof u);
            put64(q + pos, u);
        }
        for (int k = 0; k < op->ni; k++, pos += 8)
            put64(q + pos, (uint64_t)op->i[k]);
        for (int k = 0; k < op->ntd; k++) {
            const kiln_wire_td *td = &op->td[k];
            memset(q + pos, 0, TD_FIXED);
            if (!td->id) {
                pos += TD_FIXED;
                continue;
            }
            put64(q + pos, td->id);
            put64(q + pos + 8, (uint64_t)td->offset);
            q[pos + 16] = (uint8_t)td->dtype;
            q[pos + 17] = (uint8_t)td->ndim;
            pos += TD_FIXED;
            for (int d = 0; d < td->ndim; d++) {
                put64(q + pos + 8 * (size_t)d, (uint64_t)td->shape[d]);
                put64(q + pos + 8 * (size_t)(td->ndim + d), (uint64_t)td->strides[d]);
            }
            pos += 16 * (size_t)td->ndim;
        }
        break;
    }
    default:
        break;
    }
    b->len += KILN_WIRE_HEADER_SIZE + len;
    return 0;
}
