/*
 * tests/remote/wire-test.c — the remote tensor protocol's encoder and decoder
 * (backends/remote/wire.c): every message type round-trips; every truncation of a valid message
 * and every malformed header or payload is refused with the right class of error; the shape and
 * view checks that stand between untrusted operands and the backends hold at their edges.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"
#include "wire.h"
#include "ws-key.h"

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static kiln_wire_td td_of(uint64_t id, kiln_dtype dt, int ndim, const int64_t *shape)
{
    kiln_wire_td t = {.id = id, .dtype = dt, .ndim = ndim};
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        t.shape[d] = shape[d];
        t.strides[d] = s;
        s *= shape[d] ? shape[d] : 1;
    }
    return t;
}

/* Encodes m alone into b (cleared first). */
static void enc(kiln_wire_buf *b, const kiln_wire_msg *m)
{
    char why[128];
    b->len = 0;
    assert_int_equal(kiln_wire_encode(b, m, why, sizeof why), 0);
}

static void dec_ok(const kiln_wire_buf *b, uint16_t version, kiln_wire_msg *out)
{
    size_t used = 0;
    char why[256] = "";
    int rc = kiln_wire_decode(b->p, b->len, version, out, &used, why, sizeof why);
    if (rc != 0)
        fail_msg("decode: %s", why);
    assert_int_equal(used, b->len);
}

/* ---- a sample of every message type ---- */

static const uint8_t payload[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
static const char errtext[] = "unknown id 7";
static uint8_t release_ids[24];

enum { NSAMPLES = 12 };

static kiln_wire_msg sample(int k)
{
    kiln_wire_msg m = {.h = {.version = 1, .seq = 100u + (uint64_t)k}};
    switch (k) {
    case 0:
        m.h.type = KILN_WIRE_HELLO;
        m.u.hello.min_version = 1;
        m.u.hello.max_version = 3;
        strcpy(m.u.hello.device, "cuda:0");
        break;
    case 1:
        m.h.type = KILN_WIRE_ALLOC;
        m.u.alloc.id = 7;
        m.u.alloc.nbytes = sizeof payload;
        m.u.alloc.has_data = true;
        m.u.alloc.data = payload;
        break;
    case 2:
        m.h.type = KILN_WIRE_ALLOC;
        m.u.alloc.id = UINT64_MAX;
        m.u.alloc.nbytes = 1u << 20;
        break;
    case 3:
        m.h.type = KILN_WIRE_UPLOAD;
        m.u.upload.id = 9;
        m.u.upload.offset = 4;
        m.u.upload.length = 8;
        m.u.upload.data = payload;
        break;
    case 4: {
        m.h.type = KILN_WIRE_OP;
        kiln_wire_op *op = &m.u.op;
        op->prim = KILN_WIRE_P_BINARY;
        op->sub = KILN_BINARY_MUL;
        op->ntd = 3;
        int64_t sh[2] = {2, 3};
        op->td[0] = td_of(1, KILN_F32, 2, sh);
        op->td[1] = td_of(2, KILN_F32, 2, sh);
        op->td[2] = td_of(3, KILN_F32, 2, sh);
        op->td[2].strides[0] = 0; /* broadcast rows */
        op->td[1].offset = 5;
        break;
    }
    case 5: {
        m.h.type = KILN_WIRE_OP;
        kiln_wire_op *op = &m.u.op;
        op->prim = KILN_WIRE_P_CONV;
        op->ntd = 4;
        op->ni = 11;
        int64_t o[4] = {1, 2, 3, 3}, x[4] = {1, 1, 5, 5}, w[4] = {2, 1, 3, 3};
        op->td[0] = td_of(1, KILN_F32, 4, o);
        op->td[1] = td_of(2, KILN_F32, 4, x);
        op->td[2] = td_of(3, KILN_F32, 4, w);
        /* operand 3 (bias) absent */
        int64_t p[11] = {2, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1};
        memcpy(op->i, p, sizeof p);
        break;
    }
    case 6:
        m.h.type = KILN_WIRE_DOWNLOAD;
        m.u.download.id = 3;
        m.u.download.offset = 8;
        m.u.download.length = 16;
        break;
    case 7:
        m.h.type = KILN_WIRE_RELEASE;
        m.u.release.count = 3;
        put64(release_ids, 1);
        put64(release_ids + 8, 99);
        put64(release_ids + 16, UINT64_MAX);
        m.u.release.ids = release_ids;
        break;
    case 8:
        m.h.type = KILN_WIRE_SYNC;
        break;
    case 9:
        m.h.type = KILN_WIRE_WELCOME;
        m.u.welcome.version = 1;
        m.u.welcome.dtype_mask = 0xff;
        m.u.welcome.max_message_bytes = 1u << 26;
        m.u.welcome.max_live_bytes = 1ull << 33;
        m.u.welcome.max_ids = 65536;
        m.u.welcome.max_queued_ops = 4096;
        m.u.welcome.ndevices = 2;
        strcpy(m.u.welcome.devices[0], "cpu");
        strcpy(m.u.welcome.devices[1], "cuda:0");
        break;
    case 10:
        m.h.type = KILN_WIRE_DATA;
        m.u.data.length = sizeof payload;
        m.u.data.data = payload;
        break;
    case 11:
        m.h.type = KILN_WIRE_ERROR;
        m.u.error.code = KILN_WIRE_ERR_BAD_ID;
        m.u.error.failed_type = KILN_WIRE_OP;
        m.u.error.text_len = (uint16_t)strlen(errtext);
        m.u.error.text = (const uint8_t *)errtext;
        break;
    }
    return m;
}

static void same_td(const kiln_wire_td *a, const kiln_wire_td *b)
{
    assert_int_equal(a->id, b->id);
    if (!a->id)
        return;
    assert_int_equal(a->offset, b->offset);
    assert_int_equal(a->dtype, b->dtype);
    assert_int_equal(a->ndim, b->ndim);
    for (int d = 0; d < a->ndim; d++) {
        assert_int_equal(a->shape[d], b->shape[d]);
        assert_int_equal(a->strides[d], b->strides[d]);
    }
}

static void same_msg(const kiln_wire_msg *a, const kiln_wire_msg *b)
{
    assert_int_equal(a->h.type, b->h.type);
    assert_int_equal(a->h.seq, b->h.seq);
    assert_int_equal(a->h.version, b->h.version);
    switch (a->h.type) {
    case KILN_WIRE_HELLO:
        assert_int_equal(a->u.hello.min_version, b->u.hello.min_version);
        assert_int_equal(a->u.hello.max_version, b->u.hello.max_version);
        assert_string_equal(a->u.hello.device, b->u.hello.device);
        break;
    case KILN_WIRE_ALLOC:
        assert_int_equal(a->u.alloc.id, b->u.alloc.id);
        assert_int_equal(a->u.alloc.nbytes, b->u.alloc.nbytes);
        assert_int_equal(a->u.alloc.has_data, b->u.alloc.has_data);
        if (a->u.alloc.has_data)
            assert_memory_equal(a->u.alloc.data, b->u.alloc.data, a->u.alloc.nbytes);
        break;
    case KILN_WIRE_UPLOAD:
        assert_int_equal(a->u.upload.id, b->u.upload.id);
        assert_int_equal(a->u.upload.offset, b->u.upload.offset);
        assert_int_equal(a->u.upload.length, b->u.upload.length);
        assert_memory_equal(a->u.upload.data, b->u.upload.data, a->u.upload.length);
        break;
    case KILN_WIRE_OP:
        assert_int_equal(a->u.op.prim, b->u.op.prim);
        assert_int_equal(a->u.op.sub, b->u.op.sub);
        assert_int_equal(a->u.op.flags, b->u.op.flags);
        assert_int_equal(a->u.op.ntd, b->u.op.ntd);
        assert_int_equal(a->u.op.nf, b->u.op.nf);
        assert_int_equal(a->u.op.ni, b->u.op.ni);
        for (int k = 0; k < a->u.op.ntd; k++)
            same_td(&a->u.op.td[k], &b->u.op.td[k]);
        for (int k = 0; k < a->u.op.nf; k++)
            assert_true(a->u.op.f[k] == b->u.op.f[k]);
        for (int k = 0; k < a->u.op.ni; k++)
            assert_int_equal(a->u.op.i[k], b->u.op.i[k]);
        break;
    case KILN_WIRE_DOWNLOAD:
        assert_int_equal(a->u.download.id, b->u.download.id);
        assert_int_equal(a->u.download.offset, b->u.download.offset);
        assert_int_equal(a->u.download.length, b->u.download.length);
        break;
    case KILN_WIRE_RELEASE:
        assert_int_equal(a->u.release.count, b->u.release.count);
        for (uint32_t i = 0; i < a->u.release.count; i++)
            assert_int_equal(kiln_wire_release_id(a, i), kiln_wire_release_id(b, i));
        break;
    case KILN_WIRE_WELCOME:
        assert_int_equal(a->u.welcome.version, b->u.welcome.version);
        assert_int_equal(a->u.welcome.dtype_mask, b->u.welcome.dtype_mask);
        assert_int_equal(a->u.welcome.max_message_bytes, b->u.welcome.max_message_bytes);
        assert_int_equal(a->u.welcome.max_live_bytes, b->u.welcome.max_live_bytes);
        assert_int_equal(a->u.welcome.max_ids, b->u.welcome.max_ids);
        assert_int_equal(a->u.welcome.max_queued_ops, b->u.welcome.max_queued_ops);
        assert_int_equal(a->u.welcome.ndevices, b->u.welcome.ndevices);
        for (int k = 0; k < a->u.welcome.ndevices; k++)
            assert_string_equal(a->u.welcome.devices[k], b->u.welcome.devices[k]);
        break;
    case KILN_WIRE_DATA:
        assert_int_equal(a->u.data.length, b->u.data.length);
        assert_memory_equal(a->u.data.data, b->u.data.data, a->u.data.length);
        break;
    case KILN_WIRE_ERROR:
        assert_int_equal(a->u.error.code, b->u.error.code);
        assert_int_equal(a->u.error.failed_type, b->u.error.failed_type);
        assert_int_equal(a->u.error.text_len, b->u.error.text_len);
        assert_memory_equal(a->u.error.text, b->u.error.text, a->u.error.text_len);
        break;
    default:
        break;
    }
}

static void test_round_trip(void **state)
{
    (void)state;
    kiln_wire_buf b = {0};
    for (int k = 0; k < NSAMPLES; k++) {
        kiln_wire_msg m = sample(k), d;
        enc(&b, &m);
        dec_ok(&b, k == 0 ? 0 : 1, &d);
        same_msg(&m, &d);
    }
    kiln_wire_buf_free(&b);
}

/* Several messages back to back in one buffer decode one after the other. */
static void test_back_to_back(void **state)
{
    (void)state;
    kiln_wire_buf b = {0};
    char why[128];
    for (int k = 1; k < NSAMPLES; k++) {
        kiln_wire_msg m = sample(k);
        assert_int_equal(kiln_wire_encode(&b, &m, why, sizeof why), 0);
    }
    size_t off = 0;
    for (int k = 1; k < NSAMPLES; k++) {
        kiln_wire_msg m = sample(k), d;
        size_t used;
        assert_int_equal(kiln_wire_decode(b.p + off, b.len - off, 1, &d, &used, why, sizeof why), 0);
        same_msg(&m, &d);
        off += used;
    }
    assert_int_equal(off, b.len);
    kiln_wire_buf_free(&b);
}

/* Every proper prefix of a valid message is refused: as a framing error while the header or
 * the announced payload is incomplete, never as a message that decodes. */
static void test_truncations(void **state)
{
    (void)state;
    kiln_wire_buf b = {0};
    for (int k = 0; k < NSAMPLES; k++) {
        kiln_wire_msg m = sample(k), d;
        enc(&b, &m);
        for (size_t n = 0; n < b.len; n++) {
            size_t used = 99;
            char why[160];
            int rc = kiln_wire_decode(b.p, n, k == 0 ? 0 : 1, &d, &used, why, sizeof why);
            assert_int_equal(rc, KILN_WIRE_EFRAME);
            assert_int_equal(used, 0);
            assert_true(why[0] != '\0');
        }
        /* A payload cut short while the header's length agrees with it: the message is
         * malformed (EMSG) unless the type has a free-form payload. */
        if (b.len > KILN_WIRE_HEADER_SIZE && m.h.type != KILN_WIRE_DATA) {
            for (size_t cut = 1; cut <= b.len - KILN_WIRE_HEADER_SIZE; cut++) {
                size_t n = b.len - cut, used;
                put32(b.p + 20, (uint32_t)(n - KILN_WIRE_HEADER_SIZE));
                char why[160];
                int rc = kiln_wire_decode(b.p, n, k == 0 ? 0 : 1, &d, &used, why, sizeof why);
                assert_int_equal(rc, KILN_WIRE_EMSG);
                assert_int_equal(used, n);
            }
        }
    }
    kiln_wire_buf_free(&b);
}

static int dec_rc(const kiln_wire_buf *b, uint16_t version)
{
    kiln_wire_msg d;
    size_t used;
    char why[160];
    return kiln_wire_decode(b->p, b->len, version, &d, &used, why, sizeof why);
}

static void test_bad_headers(void **state)
{
    (void)state;
    kiln_wire_buf b = {0};
    kiln_wire_msg m = sample(8); /* SYNC */
    enc(&b, &m);
    assert_int_equal(dec_rc(&b, 1), 0);
    b.p[0] ^= 1; /* magic */
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EFRAME);
    b.p[0] ^= 1;
    b.p[4] = 2; /* version other than the negotiated one */
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EFRAME);
    assert_int_equal(dec_rc(&b, 0), KILN_WIRE_EFRAME); /* and not a supported one before HELLO */
    b.p[4] = 1;
    b.p[9] = 1; /* reserved flags */
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EFRAME);
    b.p[9] = 0;
    uint16_t bad_types[] = {0, 8, 0x80, 0x85, 0xffff};
    for (size_t i = 0; i < sizeof bad_types / sizeof bad_types[0]; i++) {
        b.p[6] = (uint8_t)bad_types[i];
        b.p[7] = (uint8_t)(bad_types[i] >> 8);
        assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EFRAME);
    }
    b.p[6] = KILN_WIRE_SYNC;
    b.p[7] = 0;
    put32(b.p + 20, 0xffffffffu); /* length past the buffer */
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EFRAME);
    put32(b.p + 20, 0);
    /* A HELLO is accepted whatever its header version; its own range must make sense. */
    m = sample(0);
    m.h.version = 77;
    enc(&b, &m);
    assert_int_equal(dec_rc(&b, 0), 0);
    b.p[KILN_WIRE_HEADER_SIZE] = 0; /* min_version 0 */
    assert_int_equal(dec_rc(&b, 0), KILN_WIRE_EMSG);
    m = sample(0);
    m.u.hello.min_version = 4; /* min > max */
    enc(&b, &m);
    assert_int_equal(dec_rc(&b, 0), KILN_WIRE_EMSG);
    m = sample(0);
    strcpy(m.u.hello.device, "cpu\n");
    enc(&b, &m);
    assert_int_equal(dec_rc(&b, 0), KILN_WIRE_EMSG);
    /* SYNC with a payload */
    m = sample(8);
    enc(&b, &m);
    uint8_t extra[KILN_WIRE_HEADER_SIZE + 1];
    memcpy(extra, b.p, KILN_WIRE_HEADER_SIZE);
    extra[KILN_WIRE_HEADER_SIZE] = 0;
    put32(extra + 20, 1);
    kiln_wire_buf e = {.p = extra, .len = sizeof extra, .cap = sizeof extra};
    assert_int_equal(dec_rc(&e, 1), KILN_WIRE_EMSG);
    kiln_wire_buf_free(&b);
}

/* Byte offset of operand k's descriptor in an encoded OP (after the header). */
static size_t td_pos(const kiln_wire_op *op, int k)
{
    size_t pos = KILN_WIRE_HEADER_SIZE + 8 + 8 * (size_t)(op->nf + op->ni);
    for (int j = 0; j < k; j++)
        pos += 24 + (op->td[j].id ? 16 * (size_t)op->td[j].ndim : 0);
    return pos;
}

static void test_bad_payloads(void **state)
{
    (void)state;
    kiln_wire_buf b = {0};
    kiln_wire_msg m = sample(4); /* binary mul on three [2,3] operands */
    size_t p1 = td_pos(&m.u.op, 1);
    enc(&b, &m);
    assert_int_equal(dec_rc(&b, 1), 0);
    b.p[p1 + 16] = KILN_DTYPE_COUNT; /* dtype */
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EMSG);
    b.p[p1 + 16] = 0xff;
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EMSG);
    enc(&b, &m);
    b.p[p1 + 17] = KILN_MAX_DIMS + 1; /* ndim */
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EMSG);
    enc(&b, &m);
    put64(b.p + p1 + 24, (uint64_t)-3); /* negative shape */
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EMSG);
    enc(&b, &m);
    put64(b.p + p1 + 8, (uint64_t)-1); /* negative offset */
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EMSG);
    enc(&b, &m);
    b.p[p1 + 20] = 1; /* reserved */
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EMSG);
    enc(&b, &m);
    put64(b.p + p1, 0); /* required operand absent */
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EMSG);
    enc(&b, &m);
    b.p[KILN_WIRE_HEADER_SIZE + 2] = KILN_BINARY_COUNT; /* sub-op */
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EMSG);
    enc(&b, &m);
    b.p[KILN_WIRE_HEADER_SIZE + 3] = KILN_WIRE_OPF_LOG; /* a flag binary does not take */
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EMSG);
    enc(&b, &m);
    b.p[KILN_WIRE_HEADER_SIZE + 4] = 2; /* operand count */
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EMSG);
    enc(&b, &m);
    b.p[KILN_WIRE_HEADER_SIZE] = 99; /* primitive */
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EMSG);
    enc(&b, &m);
    b.p[KILN_WIRE_HEADER_SIZE + 7] = 1; /* reserved */
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EMSG);
    /* an absent operand with fields set */
    m = sample(5);
    size_t p3 = td_pos(&m.u.op, 3);
    enc(&b, &m);
    assert_int_equal(dec_rc(&b, 1), 0);
    b.p[p3 + 16] = 1;
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EMSG);
    /* ALLOC: id 0, bad mode, data length disagreeing with nbytes */
    m = sample(1);
    enc(&b, &m);
    put64(b.p + KILN_WIRE_HEADER_SIZE, 0);
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EMSG);
    enc(&b, &m);
    b.p[KILN_WIRE_HEADER_SIZE + 16] = 2;
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EMSG);
    enc(&b, &m);
    put64(b.p + KILN_WIRE_HEADER_SIZE + 8, UINT64_MAX);
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EMSG);
    /* DOWNLOAD: offset + length overflows */
    m = sample(6);
    m.u.download.offset = UINT64_MAX - 3;
    enc(&b, &m);
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EMSG);
    /* RELEASE: count disagreeing with the payload, id 0 */
    m = sample(7);
    enc(&b, &m);
    put32(b.p + KILN_WIRE_HEADER_SIZE, 4);
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EMSG);
    put32(b.p + KILN_WIRE_HEADER_SIZE, 3);
    put64(b.p + KILN_WIRE_HEADER_SIZE + 16, 0);
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EMSG);
    /* ERROR: unknown code; WELCOME: unknown dtype bits */
    m = sample(11);
    m.u.error.code = KILN_WIRE_ERR_COUNT;
    enc(&b, &m);
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EMSG);
    m = sample(9);
    m.u.welcome.dtype_mask = 1u << KILN_DTYPE_COUNT;
    enc(&b, &m);
    assert_int_equal(dec_rc(&b, 1), KILN_WIRE_EMSG);
    kiln_wire_buf_free(&b);
}

static void test_td_span(void **state)
{
    (void)state;
    int64_t lo, hi;
    bool empty;
    int64_t sh[2] = {3, 4};
    kiln_wire_td t = td_of(1, KILN_F32, 2, sh);
    t.offset = 2;
    assert_int_equal(kiln_wire_td_span(&t, &lo, &hi, &empty), 0);
    assert_false(empty);
    assert_int_equal(lo, 2);
    assert_int_equal(hi, 2 + 11);
    /* negative stride: reaches below the offset */
    t.strides[0] = -4;
    t.offset = 8;
    assert_int_equal(kiln_wire_td_span(&t, &lo, &hi, &empty), 0);
    assert_int_equal(lo, 0);
    assert_int_equal(hi, 11);
    t.offset = 7;
    assert_int_equal(kiln_wire_td_span(&t, &lo, &hi, &empty), 0);
    assert_int_equal(lo, -1); /* the caller refuses lo < 0 */
    /* zero strides: one element however large the shape */
    t.strides[0] = 0;
    t.strides[1] = 0;
    t.shape[0] = INT64_MAX;
    t.offset = 5;
    assert_int_equal(kiln_wire_td_span(&t, &lo, &hi, &empty), 0);
    assert_int_equal(lo, 5);
    assert_int_equal(hi, 5);
    /* overflow of (shape - 1) * stride, and of the sum */
    t = td_of(1, KILN_F32, 2, sh);
    t.shape[0] = INT64_MAX / 2;
    t.strides[0] = 3;
    assert_int_equal(kiln_wire_td_span(&t, &lo, &hi, &empty), -1);
    t.shape[0] = 2;
    t.strides[0] = INT64_MAX;
    t.offset = 1;
    assert_int_equal(kiln_wire_td_span(&t, &lo, &hi, &empty), -1);
    t.strides[0] = INT64_MIN;
    t.offset = 0;
    assert_int_equal(kiln_wire_td_span(&t, &lo, &hi, &empty), 0);
    assert_int_equal(lo, INT64_MIN);
    t.offset = -1;
    assert_int_equal(kiln_wire_td_span(&t, &lo, &hi, &empty), -1);
    /* an empty dim makes the view touch nothing, whatever the other dims say */
    t = td_of(1, KILN_F32, 2, sh);
    t.shape[1] = 0;
    t.shape[0] = INT64_MAX;
    t.strides[0] = INT64_MAX;
    assert_int_equal(kiln_wire_td_span(&t, &lo, &hi, &empty), 0);
    assert_true(empty);
    /* a scalar */
    t = td_of(1, KILN_F32, 0, sh);
    t.offset = 9;
    assert_int_equal(kiln_wire_td_span(&t, &lo, &hi, &empty), 0);
    assert_int_equal(lo, 9);
    assert_int_equal(hi, 9);
}

static int shapes(const kiln_wire_op *op)
{
    char why[200];
    return kiln_wire_op_check_shapes(op, why, sizeof why);
}

static void test_check_shapes(void **state)
{
    (void)state;
    kiln_wire_msg m = sample(4);
    assert_int_equal(shapes(&m.u.op), 0);
    m.u.op.td[2].shape[1] = 4; /* b's shape differs */
    assert_int_equal(shapes(&m.u.op), -1);
    m = sample(4);
    m.u.op.td[2].dtype = KILN_F64; /* a, b dtypes differ */
    assert_int_equal(shapes(&m.u.op), -1);
    /* element count overflow */
    m = sample(4);
    for (int k = 0; k < 3; k++) {
        m.u.op.td[k].shape[0] = INT64_MAX / 2;
        m.u.op.td[k].shape[1] = 4;
    }
    assert_int_equal(shapes(&m.u.op), -1);
    /* conv: the sample fits; wrong output size, bad groups and nspatial do not */
    m = sample(5);
    assert_int_equal(shapes(&m.u.op), 0);
    m.u.op.td[0].shape[2] = 4;
    assert_int_equal(shapes(&m.u.op), -1);
    m = sample(5);
    m.u.op.i[10] = 0;
    assert_int_equal(shapes(&m.u.op), -1);
    m = sample(5);
    m.u.op.i[0] = 4;
    assert_int_equal(shapes(&m.u.op), -1);
    m = sample(5);
    m.u.op.i[1] = 0; /* stride 0 */
    assert_int_equal(shapes(&m.u.op), -1);
    /* reduce: mask naming a missing dim, output not keepdim */
    kiln_wire_op r = {.prim = KILN_WIRE_P_REDUCE, .ntd = 2, .nf = 1, .ni = 1};
    int64_t in[2] = {3, 4}, out[2] = {3, 1};
    r.td[0] = td_of(1, KILN_F32, 2, out);
    r.td[1] = td_of(2, KILN_F32, 2, in);
    r.i[0] = 2;
    assert_int_equal(shapes(&r), 0);
    r.i[0] = 4;
    assert_int_equal(shapes(&r), -1);
    r.i[0] = -1;
    assert_int_equal(shapes(&r), -1);
    r.i[0] = 1;
    assert_int_equal(shapes(&r), -1);
    /* gather: dim out of range; index not i64 */
    kiln_wire_op g = {.prim = KILN_WIRE_P_GATHER, .ntd = 3, .ni = 1};
    int64_t go[1] = {4}, gi[1] = {8};
    g.td[0] = td_of(1, KILN_F32, 1, go);
    g.td[1] = td_of(2, KILN_F32, 1, gi);
    g.td[2] = td_of(3, KILN_I64, 1, go);
    assert_int_equal(shapes(&g), 0);
    g.i[0] = 1;
    assert_int_equal(shapes(&g), -1);
    g.i[0] = -1;
    assert_int_equal(shapes(&g), -1);
    g.i[0] = 0;
    g.td[2].dtype = KILN_I32;
    assert_int_equal(shapes(&g), -1);
    /* matmul: inner sizes */
    kiln_wire_op mm = {.prim = KILN_WIRE_P_MATMUL, .ntd = 3};
    int64_t mo[2] = {2, 5}, ma[2] = {2, 3}, mb[2] = {3, 5};
    mm.td[0] = td_of(1, KILN_F32, 2, mo);
    mm.td[1] = td_of(2, KILN_F32, 2, ma);
    mm.td[2] = td_of(3, KILN_F32, 2, mb);
    assert_int_equal(shapes(&mm), 0);
    mm.td[2].shape[0] = 4;
    assert_int_equal(shapes(&mm), -1);
    /* a non-contiguous output where one is required */
    mm.td[2].shape[0] = 3;
    mm.td[0].strides[0] = 6;
    assert_int_equal(shapes(&mm), -1);
    /* pad: output size must be in + lo + hi; reflect padding no larger than the input */
    kiln_wire_op pd = {.prim = KILN_WIRE_P_PAD, .ntd = 2, .nf = 1, .ni = 2, .sub = KILN_PAD_REFLECT};
    int64_t po[1] = {6}, pi[1] = {4};
    pd.td[0] = td_of(1, KILN_F32, 1, po);
    pd.td[1] = td_of(2, KILN_F32, 1, pi);
    pd.i[0] = 1;
    pd.i[1] = 1;
    assert_int_equal(shapes(&pd), 0);
    pd.i[0] = 4;
    pd.i[1] = -2;
    assert_int_equal(shapes(&pd), -1);
    pd.sub = KILN_PAD_CONSTANT;
    assert_int_equal(shapes(&pd), 0);
    pd.i[0] = INT64_MAX;
    pd.i[1] = INT64_MIN + 10;
    assert_int_equal(shapes(&pd), -1);
}


/* The handshake's key arithmetic shared by kilnd and the remote backend: RFC 6455's own example,
 * RFC 4648's base64 vectors, and keys long enough to need SHA-1's second padding block (values
 * from Python's hashlib). */
static void test_ws_keys(void **state)
{
    (void)state;
    char out[29], b[16];
    kiln__ws_accept_key("dGhlIHNhbXBsZSBub25jZQ==", out);
    assert_string_equal(out, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    static const struct { const char *in, *want; } b64[] = {
        {"", ""}, {"f", "Zg=="}, {"fo", "Zm8="}, {"foo", "Zm9v"}, {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="},
        {"foobar", "Zm9vYmFy"},
    };
    for (size_t i = 0; i < sizeof b64 / sizeof b64[0]; i++) {
        kiln__ws_base64((const uint8_t *)b64[i].in, strlen(b64[i].in), b);
        assert_string_equal(b, b64[i].want);
    }
    char key[129];
    static const struct { char c; size_t n; const char *want; } longer[] = {
        {'x', 20, "7jD6MP55bPPoLSNhT1mD/AE8sjc="},
        {'y', 60, "+4lZb90Dd+3LXf1PleMtM41cYs0="},
        {'z', 128, "8j8HGxGGxF+PGUZMZU3IKcO4+Sc="},
    };
    for (size_t i = 0; i < sizeof longer / sizeof longer[0]; i++) {
        memset(key, longer[i].c, longer[i].n);
        key[longer[i].n] = '\0';
        kiln__ws_accept_key(key, out);
        assert_string_equal(out, longer[i].want);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_back_to_back),
        cmocka_unit_test(test_truncations),
        cmocka_unit_test(test_bad_headers),
        cmocka_unit_test(test_bad_payloads),
        cmocka_unit_test(test_td_span),
        cmocka_unit_test(test_check_shapes),
        cmocka_unit_test(test_ws_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
