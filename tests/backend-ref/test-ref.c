/*
 * tests/backend-ref/test-ref.c — the ref backend's own tests: life cycle, buffers,
 * creation, copy, rng, elementwise ops and reductions, each on hand-built layouts
 * (transposed, broadcast 0-stride, negative-stride, empty and size-1 dims) with
 * NaN cases. test-ref-ops.c covers indexing, linear algebra and the nn primitives.
 */
#include <stdint.h>
#include <time.h>

#include "common/philox.h"
#include "test-ref.h"

const kiln_backend_iface *R;
void *C;
int test_failures;

static kiln_buffer *live[4096];
static int nlive;

kiln_buffer *tbuf(const void *data, size_t n)
{
    kiln_buffer *b = R->buffer_alloc(C, n);
    if (!b) {
        fprintf(stderr, "buffer_alloc failed\n");
        exit(1);
    }
    if (data && n)
        R->buffer_upload(C, b, 0, data, n);
    if (nlive < N_(live))
        live[nlive++] = b;
    return b;
}

void tfree_all(void)
{
    for (int i = 0; i < nlive; i++)
        R->buffer_free(C, live[i]);
    nlive = 0;
}

static size_t dsize(kiln_dtype dt)
{
    static const size_t s[] = {4, 8, 2, 2, 8, 4, 1, 1};
    return s[dt];
}

kiln_tdesc tdesc(kiln_buffer *b, kiln_dtype dt, int64_t offset, int ndim, const int64_t *shape,
                 const int64_t *strides)
{
    kiln_tdesc t = {.buf = b, .offset = offset, .dtype = dt, .ndim = ndim};
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        t.shape[d] = shape[d];
        t.strides[d] = strides ? strides[d] : s;
        s *= shape[d];
    }
    return t;
}

kiln_tdesc tnew(kiln_dtype dt, int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    return tdesc(tbuf(NULL, (size_t)n * dsize(dt)), dt, 0, ndim, shape, NULL);
}

double tget(const kiln_tdesc *t, int64_t i)
{
    const unsigned char *p = R->buffer_host_ptr(C, t->buf);
    switch (t->dtype) {
    case KILN_F32: return ((const float *)p)[i];
    case KILN_F64: return ((const double *)p)[i];
    case KILN_F16: return kiln_f16_to_f32(((const uint16_t *)p)[i]);
    case KILN_BF16: return kiln_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return (double)tgeti(t, i);
    }
}

int64_t tgeti(const kiln_tdesc *t, int64_t i)
{
    const unsigned char *p = R->buffer_host_ptr(C, t->buf);
    switch (t->dtype) {
    case KILN_I64: return ((const int64_t *)p)[i];
    case KILN_I32: return ((const int32_t *)p)[i];
    case KILN_U8: case KILN_BOOL: return p[i];
    default: return (int64_t)tget(t, i);
    }
}

/* ------------------------------------------------------------------------------ */

static void test_life_cycle(void)
{
    CHECK(strcmp(R->name, "ref") == 0);
    CHECK(R->open(1) == NULL);
    kiln_backend_caps caps;
    R->caps(C, &caps);
    for (int d = 0; d < KILN_DTYPE_COUNT; d++)
        CHECK(caps.dtype[d]);
    CHECK(caps.host_memory && !caps.async);
    /* Every entry is filled: ref is the oracle, nothing may be left to composition. The
     * exceptions: open_spec (only backends addressed by a whole spec, remote://..., have
     * one) and the fused fast paths (conv_fused, epilogue, conv_pack_size, conv_pack, rnn,
     * rnn_pack_size, rnn_pack, fused_run, matmul_fused), whose meaning is defined as the
     * composed ops: ref computing them by composition is what makes it the oracle for the
     * backends that fuse. */
    const void *const *slots = (const void *const *)&R->open;
    size_t nslots = (sizeof *R - offsetof(kiln_backend_iface, open)) / sizeof(void *);
    size_t spec_slot = (offsetof(kiln_backend_iface, open_spec) - offsetof(kiln_backend_iface, open)) / sizeof(void *);
    CHECK(R->open_spec == NULL);
    CHECK(R->conv_fused == NULL && R->epilogue == NULL && R->conv_pack_size == NULL && R->conv_pack == NULL);
    CHECK(R->rnn == NULL && R->rnn_pack_size == NULL && R->rnn_pack == NULL);
    CHECK(R->fused_run == NULL && R->matmul_fused == NULL);
    CHECK(R->capture_begin == NULL && R->capture_end == NULL && R->graph_launch == NULL && R->graph_free == NULL &&
          R->graphs == NULL);
#define SLOT(f) ((offsetof(kiln_backend_iface, f) - offsetof(kiln_backend_iface, open)) / sizeof(void *))
    /* and the entries a backend that finishes work at submission has no use for: queues
     * and events, pinned host memory, device-to-device copies, options, capability
     * refinements, counters, device state and recorded graphs (backends/backend.h gives each
     * its default) */
    const size_t fused_slots[] = {
        SLOT(conv_fused),  SLOT(epilogue),         SLOT(conv_pack_size), SLOT(conv_pack),     SLOT(rnn),
        SLOT(open_opts),   SLOT(queue_open),       SLOT(queue_close),    SLOT(event_record),  SLOT(event_wait),
        SLOT(event_sync),  SLOT(event_query),      SLOT(event_free),     SLOT(supports),      SLOT(host_alloc),
        SLOT(host_free),   SLOT(buffer_copy_peer), SLOT(counters),       SLOT(rnn_pack_size), SLOT(rnn_pack),
        SLOT(fused_run),   SLOT(memory),           SLOT(lost),           SLOT(matmul_fused),  SLOT(capture_begin),
        SLOT(capture_end), SLOT(graph_launch),     SLOT(graph_free),     SLOT(graphs),
    };
    /* and the pool's early release of a dead buffer (ref pools nothing), its peak figure's
     * reset (it keeps no figures), and lent memory (ref runs every call at once: a wrap) */
    const size_t pool_slots[] = {SLOT(buffer_detach), SLOT(buffer_reattach), SLOT(memory_reset_peak),
                                 SLOT(buffer_lend_host)};
    /* and device enumeration (kiln_device_list): ref is one host device */
    const size_t list_slot = SLOT(list);
#undef SLOT
    for (size_t i = 0; i < nslots; i++) {
        bool fused = false;
        for (size_t f = 0; f < sizeof fused_slots / sizeof *fused_slots; f++)
            fused = fused || fused_slots[f] == i;
        for (size_t f = 0; f < sizeof pool_slots / sizeof *pool_slots; f++)
            fused = fused || pool_slots[f] == i;
        fused = fused || i == list_slot;
        if (i != spec_slot && !fused && slots[i] == NULL) {
            fprintf(stderr, "ref leaves interface slot %zu empty\n", i);
            CHECK(slots[i] != NULL);
        }
    }

    float src[4] = {1, 2, 3, 4}, dst[4] = {0};
    kiln_buffer *b = tbuf(NULL, 16);
    CHECK_OK(R->buffer_upload(C, b, 4, src, 8));
    CHECK_OK(R->buffer_download(C, b, 0, dst, 16));
    CHECK(dst[0] == 0 && dst[1] == 1 && dst[2] == 2 && dst[3] == 0);
    CHECK(R->buffer_download(C, b, 12, dst, 8) < 0);
    CHECK_OK(R->sync(C));
    kiln_buffer *e = R->buffer_alloc(C, 0);
    CHECK(e != NULL);
    R->buffer_free(C, e);
}

static void test_fill_arange_copy(void)
{
    int64_t s3[] = {3};
    kiln_tdesc h = tnew(KILN_F16, 1, s3), bf = tnew(KILN_BF16, 1, s3), i8 = tnew(KILN_U8, 1, s3);
    CHECK_OK(R->fill(C, &h, 0.1));
    CHECK_NEAR(tget(&h, 2), 0.0999755859375, 0); /* nearest f16 to 0.1 */
    CHECK_OK(R->fill(C, &bf, 1.0 / 3));
    CHECK_NEAR(tget(&bf, 0), 0.333984375, 0);
    CHECK_OK(R->fill(C, &i8, -1)); /* wraps */
    CHECK(tgeti(&i8, 1) == 255);
    kiln_tdesc bo = tnew(KILN_BOOL, 1, s3);
    CHECK_OK(R->fill(C, &bo, NAN));
    CHECK(tgeti(&bo, 0) == 1);

    int64_t s4[] = {4};
    kiln_tdesc ai = tnew(KILN_I64, 1, s4), af = tnew(KILN_F32, 1, s4);
    CHECK_OK(R->arange(C, &ai, 4611686018427387904.0, 3));
    CHECK(tgeti(&ai, 3) == INT64_C(4611686018427387913));
    CHECK_OK(R->arange(C, &af, 1, -0.5));
    CHECK_NEAR(tget(&af, 3), -0.5, 0);

    /* 2x3 transposed view of a 3x2 buffer, flipped along the column, into i32. */
    float src[6] = {0, 1, 2, 3, 4, 5}; /* rows [0 1] [2 3] [4 5] */
    int64_t s23[] = {2, 3}, st[] = {1, 2}, stneg[] = {1, -2};
    kiln_tdesc in = tdesc(tbuf(src, sizeof src), KILN_F32, 0, 2, s23, st);
    kiln_tdesc out = tnew(KILN_I32, 2, s23);
    CHECK_OK(R->copy(C, &out, &in)); /* in^T = [[0 2 4] [1 3 5]] */
    CHECK(tgeti(&out, 0) == 0 && tgeti(&out, 1) == 2 && tgeti(&out, 5) == 5);
    kiln_tdesc flip = tdesc(in.buf, KILN_F32, 4, 2, s23, stneg); /* [[4 2 0] [5 3 1]] */
    CHECK_OK(R->copy(C, &out, &flip));
    CHECK(tgeti(&out, 0) == 4 && tgeti(&out, 2) == 0 && tgeti(&out, 3) == 5);
    /* Broadcast one value through 0 strides; write into a strided (column) view. */
    double one = -2.75;
    int64_t z[] = {0, 0};
    kiln_tdesc bc = tdesc(tbuf(&one, 8), KILN_F64, 0, 2, s23, z);
    kiln_tdesc wide = tnew(KILN_F32, 2, (int64_t[]){2, 6});
    kiln_tdesc view = tdesc(wide.buf, KILN_F32, 1, 2, s23, (int64_t[]){6, 2});
    CHECK_OK(R->copy(C, &view, &bc));
    CHECK(tget(&wide, 0) == 0 && tget(&wide, 1) == -2.75 && tget(&wide, 2) == 0 &&
          tget(&wide, 11) == -2.75);
    kiln_tdesc o8 = tnew(KILN_U8, 2, s23);
    CHECK_OK(R->copy(C, &o8, &bc)); /* -2.75 -> -2 -> 254 */
    CHECK(tgeti(&o8, 4) == 254);
    /* i64 beyond 2^53 to f32 must round once, not twice. */
    int64_t big = (INT64_C(1) << 60) + (INT64_C(1) << 36) + 1;
    kiln_tdesc bi = tdesc(tbuf(&big, 8), KILN_I64, 0, 1, (int64_t[]){1}, NULL);
    kiln_tdesc bfo = tnew(KILN_F32, 1, (int64_t[]){1});
    CHECK_OK(R->copy(C, &bfo, &bi));
    CHECK(tget(&bfo, 0) == (double)(float)big);
    /* Empty copies do nothing. */
    int64_t s0[] = {0, 3};
    kiln_tdesc e0 = tnew(KILN_F32, 2, s0);
    CHECK_OK(R->copy(C, &e0, &e0));
}

static void test_rng(void)
{
    int64_t s[] = {2, 5};
    kiln_tdesc u = tnew(KILN_F64, 2, s), u2 = tnew(KILN_F64, 1, (int64_t[]){3});
    CHECK_OK(R->rng(C, KILN_RNG_UNIFORM, &u, 42, 100, -1, 3));
    for (int i = 0; i < 10; i++) {
        CHECK_NEAR(tget(&u, i), -1 + 4 * kiln_rng_uniform01(100 + (uint64_t)i, 42), 0);
        CHECK(tget(&u, i) >= -1 && tget(&u, i) < 3);
    }
    CHECK_OK(R->rng(C, KILN_RNG_UNIFORM, &u2, 42, 107, -1, 3));
    CHECK(tget(&u2, 0) == tget(&u, 7)); /* counter = offset + i */
    kiln_tdesc nrm = tnew(KILN_F32, 2, s);
    CHECK_OK(R->rng(C, KILN_RNG_NORMAL, &nrm, 7, 0, 1, 2));
    CHECK_NEAR(tget(&nrm, 3), (float)(1 + 2 * kiln_rng_normal01(3, 7)), 0);
    kiln_tdesc bern = tnew(KILN_BOOL, 2, s), ri = tnew(KILN_I32, 2, s);
    CHECK_OK(R->rng(C, KILN_RNG_BERNOULLI, &bern, 7, 0, 0.5, 0));
    for (int i = 0; i < 10; i++)
        CHECK(tgeti(&bern, i) == (kiln_rng_uniform01((uint64_t)i, 7) < 0.5));
    CHECK_OK(R->rng(C, KILN_RNG_INT, &ri, 9, 5, -3, 4));
    for (int i = 0; i < 10; i++) {
        CHECK(tgeti(&ri, i) == kiln_rng_int(5 + (uint64_t)i, 9, -3, 4));
        CHECK(tgeti(&ri, i) >= -3 && tgeti(&ri, i) < 4);
    }
    CHECK(R->rng(C, KILN_RNG_INT, &ri, 9, 5, 4, 4) < 0);
}

/* Apply a unary op to a small f64 vector and return out element i. */
static double un(kiln_unary_op op, double x, double alpha, double beta, kiln_dtype dt)
{
    int64_t s1[] = {1};
    double xs = x;
    kiln_tdesc in = tdesc(tbuf(&xs, 8), KILN_F64, 0, 1, s1, NULL), out = tnew(dt, 1, s1);
    CHECK_OK(R->unary(C, op, &out, &in, alpha, beta));
    return tget(&out, 0);
}

static void test_unary(void)
{
    const double tol = 1e-15;
    CHECK_NEAR(un(KILN_UNARY_ROUND, 0.5, 0, 0, KILN_F64), 0, 0);
    CHECK_NEAR(un(KILN_UNARY_ROUND, 1.5, 0, 0, KILN_F64), 2, 0);
    CHECK_NEAR(un(KILN_UNARY_ROUND, 2.5, 0, 0, KILN_F64), 2, 0);
    CHECK_NEAR(un(KILN_UNARY_ROUND, -2.5, 0, 0, KILN_F32), -2, 0);
    CHECK_NEAR(un(KILN_UNARY_SIGN, NAN, 0, 0, KILN_F64), 0, 0);
    CHECK_NEAR(un(KILN_UNARY_SIGN, -0.0, 0, 0, KILN_F64), 0, 0);
    CHECK_NEAR(un(KILN_UNARY_SIGN, -3, 0, 0, KILN_F64), -1, 0);
    CHECK(isnan(un(KILN_UNARY_RELU, NAN, 0, 0, KILN_F64)));
    CHECK_NEAR(un(KILN_UNARY_RELU, -1, 0, 0, KILN_F64), 0, 0);
    CHECK_NEAR(un(KILN_UNARY_GELU, 1, 0, 0, KILN_F64), 0.8413447460685429, tol);
    CHECK_NEAR(un(KILN_UNARY_GELU_TANH, 1, 0, 0, KILN_F64), 0.8411919906082768, tol);
    CHECK_NEAR(un(KILN_UNARY_SOFTPLUS, 1, 2, 1, KILN_F64), 1, 0);       /* 2 > 1: linear */
    CHECK_NEAR(un(KILN_UNARY_SOFTPLUS, 0.25, 2, 1, KILN_F64), 0.48703849209005334, tol);
    CHECK_NEAR(un(KILN_UNARY_ELU, -1, 1, 0, KILN_F64), -0.6321205588285577, tol);
    CHECK_NEAR(un(KILN_UNARY_LEAKY_RELU, -2, 0.1, 0, KILN_F64), -0.2, tol);
    CHECK_NEAR(un(KILN_UNARY_SIGMOID, 0, 0, 0, KILN_F64), 0.5, 0);
    CHECK_NEAR(un(KILN_UNARY_SILU, 1, 0, 0, KILN_F64), 0.7310585786300049, tol);
    CHECK_NEAR(un(KILN_UNARY_RSQRT, 4, 0, 0, KILN_F64), 0.5, 0);
    CHECK_NEAR(un(KILN_UNARY_CLAMP, 5, -1, 2, KILN_F64), 2, 0);
    CHECK_NEAR(un(KILN_UNARY_CLAMP, 0, 3, 2, KILN_F64), 2, 0); /* lo > hi gives hi */
    CHECK(isnan(un(KILN_UNARY_CLAMP, NAN, -1, 2, KILN_F64)));
    CHECK_NEAR(un(KILN_UNARY_POW_SCALAR, 9, 0.5, 0, KILN_F64), 3, 0);
    CHECK_NEAR(un(KILN_UNARY_EXP, 1, 0, 0, KILN_BF16), 2.71875, 0);
    CHECK_NEAR(un(KILN_UNARY_ISNAN, NAN, 0, 0, KILN_BOOL), 1, 0);
    CHECK_NEAR(un(KILN_UNARY_ISINF, -INFINITY, 0, 0, KILN_BOOL), 1, 0);
    CHECK_NEAR(un(KILN_UNARY_LOGICAL_NOT, NAN, 0, 0, KILN_BOOL), 0, 0);

    /* Integer formulas: wrap, stay exact. */
    int32_t iv[4] = {INT32_MIN, -7, 0, 9};
    int64_t s4[] = {4};
    kiln_tdesc in = tdesc(tbuf(iv, sizeof iv), KILN_I32, 0, 1, s4, NULL), out = tnew(KILN_I32, 1, s4);
    CHECK_OK(R->unary(C, KILN_UNARY_NEG, &out, &in, 0, 0));
    CHECK(tgeti(&out, 0) == INT32_MIN && tgeti(&out, 1) == 7);
    CHECK_OK(R->unary(C, KILN_UNARY_ABS, &out, &in, 0, 0));
    CHECK(tgeti(&out, 1) == 7 && tgeti(&out, 3) == 9);
    CHECK_OK(R->unary(C, KILN_UNARY_POW_SCALAR, &out, &in, 3, 0));
    CHECK(tgeti(&out, 1) == -343 && tgeti(&out, 3) == 729);
    CHECK(R->unary(C, KILN_UNARY_POW_SCALAR, &out, &in, -1, 0) == KILN_ENOTSUP);
    CHECK(R->unary(C, KILN_UNARY_EXP, &out, &in, 0, 0) == KILN_ENOTSUP);
    CHECK_OK(R->unary(C, KILN_UNARY_CLAMP, &out, &in, -2.5, 4.5));
    CHECK(tgeti(&out, 0) == -2 && tgeti(&out, 3) == 4);
    /* i64 clamp compares in int64: 2^53 + 1 is above a bound of 2^53 (a double reads the
     * two as equal), -2^53 - 1 below -2^53. */
    int64_t two53 = INT64_C(1) << 53, big[3] = {two53 + 1, -two53 - 1, 5};
    int64_t s3[] = {3};
    kiln_tdesc bgi = tdesc(tbuf(big, sizeof big), KILN_I64, 0, 1, s3, NULL), bgo = tnew(KILN_I64, 1, s3);
    CHECK_OK(R->unary(C, KILN_UNARY_CLAMP, &bgo, &bgi, -(double)two53, (double)two53));
    CHECK(tgeti(&bgo, 0) == two53 && tgeti(&bgo, 1) == -two53 && tgeti(&bgo, 2) == 5);
    /* An op with no bool formula is refused with its name and KILN_ENOTSUP as the code. */
    uint8_t bv[4] = {1, 0, 1, 1};
    kiln_tdesc bi = tdesc(tbuf(bv, sizeof bv), KILN_BOOL, 0, 1, s4, NULL), bo = tnew(KILN_BOOL, 1, s4);
    kiln_error_clear();
    CHECK(R->unary(C, KILN_UNARY_ABS, &bo, &bi, 0, 0) == KILN_ENOTSUP);
    CHECK(kiln_error_code() == KILN_ENOTSUP && strstr(kiln_error(), "abs"));
    CHECK(R->binary(C, KILN_BINARY_REMAINDER, &bo, &bi, &bi) == KILN_ENOTSUP);
    CHECK(kiln_error_code() == KILN_ENOTSUP && strstr(kiln_error(), "remainder"));
    kiln_tdesc fo = tnew(KILN_F32, 1, s4); /* integer in, float out: computed in double */
    CHECK_OK(R->unary(C, KILN_UNARY_SQRT, &fo, &in, 0, 0));
    CHECK_NEAR(tget(&fo, 3), 3, 0);
    CHECK(isnan(tget(&fo, 1)));
}

static kiln_tdesc vec(kiln_dtype dt, const void *data, int64_t n)
{
    return tdesc(tbuf(data, (size_t)n * dsize(dt)), dt, 0, 1, (int64_t[]){n}, NULL);
}

static void test_binary_where(void)
{
    double a[] = {-3, 3, 5.5, NAN, 1, -0.0}, b[] = {2, -2, 2, 1, NAN, 0.0};
    kiln_tdesc ta = vec(KILN_F64, a, 6), tb = vec(KILN_F64, b, 6), o = tnew(KILN_F64, 1, (int64_t[]){6});
    CHECK_OK(R->binary(C, KILN_BINARY_REMAINDER, &o, &ta, &tb));
    CHECK_NEAR(tget(&o, 0), 1, 0);
    CHECK_NEAR(tget(&o, 1), -1, 0);
    CHECK_NEAR(tget(&o, 2), 1.5, 0);
    CHECK_OK(R->binary(C, KILN_BINARY_MAXIMUM, &o, &ta, &tb));
    CHECK(isnan(tget(&o, 3)) && isnan(tget(&o, 4)) && tget(&o, 0) == 2);
    CHECK_OK(R->binary(C, KILN_BINARY_MINIMUM, &o, &ta, &tb));
    CHECK(isnan(tget(&o, 3)) && isnan(tget(&o, 4)) && tget(&o, 1) == -2);
    kiln_tdesc ob = tnew(KILN_BOOL, 1, (int64_t[]){6});
    CHECK_OK(R->binary(C, KILN_BINARY_NE, &ob, &ta, &tb));
    CHECK(tgeti(&ob, 3) == 1 && tgeti(&ob, 4) == 1 && tgeti(&ob, 5) == 0);
    CHECK_OK(R->binary(C, KILN_BINARY_GE, &ob, &ta, &tb));
    CHECK(tgeti(&ob, 3) == 0 && tgeti(&ob, 5) == 1 && tgeti(&ob, 1) == 1);
    CHECK_OK(R->binary(C, KILN_BINARY_LOGICAL_AND, &ob, &ta, &tb));
    CHECK(tgeti(&ob, 3) == 1 && tgeti(&ob, 5) == 0);

    /* Integers: floor division, Python remainder, zero divisor gives 0. */
    int64_t ia[] = {-7, 7, 7, INT64_MIN, 5, 2}, ib[] = {2, -2, 0, -1, 0, -2};
    kiln_tdesc xa = vec(KILN_I64, ia, 6), xb = vec(KILN_I64, ib, 6), xo = tnew(KILN_I64, 1, (int64_t[]){6});
    CHECK_OK(R->binary(C, KILN_BINARY_DIV, &xo, &xa, &xb));
    CHECK(tgeti(&xo, 0) == -4 && tgeti(&xo, 1) == -4 && tgeti(&xo, 2) == 0 &&
          tgeti(&xo, 3) == INT64_MIN && tgeti(&xo, 4) == 0);
    CHECK_OK(R->binary(C, KILN_BINARY_REMAINDER, &xo, &xa, &xb));
    CHECK(tgeti(&xo, 0) == 1 && tgeti(&xo, 1) == -1 && tgeti(&xo, 2) == 0 && tgeti(&xo, 3) == 0);
    CHECK_OK(R->binary(C, KILN_BINARY_POW, &xo, &xa, &xb));
    CHECK(tgeti(&xo, 0) == 49 && tgeti(&xo, 2) == 1 && tgeti(&xo, 5) == 0);

    /* Broadcast: a [2,3] transposed view plus b [3] broadcast by a 0 stride, in u8. */
    uint8_t u[] = {250, 1, 2, 3, 4, 5}, v[] = {10, 20, 30};
    int64_t s23[] = {2, 3};
    kiln_tdesc ua = tdesc(tbuf(u, 6), KILN_U8, 0, 2, s23, (int64_t[]){1, 2});
    kiln_tdesc ub = tdesc(tbuf(v, 3), KILN_U8, 0, 2, s23, (int64_t[]){0, 1});
    kiln_tdesc uo = tnew(KILN_U8, 2, s23);
    CHECK_OK(R->binary(C, KILN_BINARY_ADD, &uo, &ua, &ub)); /* [[250 2 4] [1 3 5]] + v */
    CHECK(tgeti(&uo, 0) == 4 && tgeti(&uo, 1) == 22 && tgeti(&uo, 5) == 35);
    kiln_tdesc bo = tnew(KILN_BOOL, 2, s23);
    CHECK(R->binary(C, KILN_BINARY_SUB, &bo, &ua, &ub) == KILN_ENOTSUP);

    /* where with a broadcast condition column. */
    uint8_t cond[] = {1, 0};
    kiln_tdesc tc = tdesc(tbuf(cond, 2), KILN_BOOL, 0, 2, s23, (int64_t[]){1, 0});
    CHECK_OK(R->where(C, &uo, &tc, &ua, &ub));
    CHECK(tgeti(&uo, 0) == 250 && tgeti(&uo, 2) == 4 && tgeti(&uo, 3) == 10 && tgeti(&uo, 5) == 30);
}

static double red(kiln_reduce_op op, const double *x, int64_t n, double param)
{
    kiln_tdesc in = vec(KILN_F64, x, n), out = tnew(KILN_F64, 1, (int64_t[]){1});
    CHECK_OK(R->reduce(C, op, &out, &in, 1, param));
    return tget(&out, 0);
}

static void test_reduce(void)
{
    double x[] = {1, 2, 3, 4}, nanv[] = {1, NAN, 3}, ninf[] = {-INFINITY, -INFINITY};
    double neg[] = {3, -4, 0};
    CHECK_NEAR(red(KILN_REDUCE_VAR, x, 4, 1), 5.0 / 3, 1e-15);
    CHECK_NEAR(red(KILN_REDUCE_STD, x, 4, 0), sqrt(1.25), 1e-15);
    CHECK(isnan(red(KILN_REDUCE_VAR, x, 1, 1)));       /* 0 / 0 */
    CHECK(isinf(red(KILN_REDUCE_VAR, x, 2, 2)));       /* 0.5 / 0 */
    CHECK(isinf(red(KILN_REDUCE_VAR, x, 2, 3)));       /* denominator clamps at 0 */
    CHECK(isnan(red(KILN_REDUCE_MAX, nanv, 3, 0)));
    CHECK(isnan(red(KILN_REDUCE_MIN, nanv, 3, 0)));
    CHECK_NEAR(red(KILN_REDUCE_LOGSUMEXP, x, 4, 0), 4.440189698561196, 1e-14);
    CHECK_NEAR(red(KILN_REDUCE_LOGSUMEXP, ninf, 2, 0), -INFINITY, 0);
    CHECK_NEAR(red(KILN_REDUCE_NORM, neg, 3, 2), 5, 0);
    CHECK_NEAR(red(KILN_REDUCE_NORM, neg, 3, 1), 7, 0);
    CHECK_NEAR(red(KILN_REDUCE_NORM, neg, 3, 0), 2, 0);
    CHECK_NEAR(red(KILN_REDUCE_NORM, neg, 3, INFINITY), 4, 0);
    CHECK_NEAR(red(KILN_REDUCE_NORM, neg, 3, -INFINITY), 0, 0);
    CHECK_NEAR(red(KILN_REDUCE_NORM, neg, 3, 3), cbrt(91), 1e-14);
    CHECK_NEAR(red(KILN_REDUCE_PROD, x, 4, 0), 24, 0);
    CHECK_NEAR(red(KILN_REDUCE_SUM, x, 0, 0), 0, 0);
    CHECK(isnan(red(KILN_REDUCE_MEAN, x, 0, 0)));
    CHECK_NEAR(red(KILN_REDUCE_ANY, nanv, 3, 0), 1, 0);
    CHECK_NEAR(red(KILN_REDUCE_ALL, neg, 3, 0), 0, 0);

    /* Sum over dims 0 and 2 of a [2,3,2] tensor seen through permuted strides. */
    float d[12];
    for (int i = 0; i < 12; i++)
        d[i] = (float)i; /* storage is [3][2][2] (c, a, b) */
    int64_t s[] = {2, 3, 2}, st[] = {2, 4, 1};
    kiln_tdesc in = tdesc(tbuf(d, sizeof d), KILN_F32, 0, 3, s, st);
    kiln_tdesc out = tnew(KILN_F32, 3, (int64_t[]){1, 3, 1});
    CHECK_OK(R->reduce(C, KILN_REDUCE_SUM, &out, &in, 0x5, 0));
    CHECK_NEAR(tget(&out, 0), 0 + 1 + 2 + 3, 0);
    CHECK_NEAR(tget(&out, 2), 8 + 9 + 10 + 11, 0);
    kiln_tdesc omax = tnew(KILN_F32, 3, (int64_t[]){2, 1, 1});
    CHECK_OK(R->reduce(C, KILN_REDUCE_MAX, &omax, &in, 0x6, 0));
    CHECK_NEAR(tget(&omax, 0), 9, 0);
    CHECK_NEAR(tget(&omax, 1), 11, 0);

    /* Integer sums wrap in int64; bool sums count. */
    int32_t iv[] = {INT32_MAX, 1};
    kiln_tdesc ti = vec(KILN_I32, iv, 2), to = tnew(KILN_I32, 1, (int64_t[]){1});
    kiln_tdesc t64 = tnew(KILN_I64, 1, (int64_t[]){1});
    CHECK_OK(R->reduce(C, KILN_REDUCE_SUM, &to, &ti, 1, 0));
    CHECK(tgeti(&to, 0) == INT32_MIN);
    CHECK_OK(R->reduce(C, KILN_REDUCE_SUM, &t64, &ti, 1, 0));
    CHECK(tgeti(&t64, 0) == (int64_t)INT32_MAX + 1);
    kiln_tdesc e = tnew(KILN_F32, 2, (int64_t[]){0, 3}), eo = tnew(KILN_F32, 2, (int64_t[]){1, 3});
    CHECK_OK(R->reduce(C, KILN_REDUCE_SUM, &eo, &e, 1, 0));
    CHECK(tget(&eo, 2) == 0);
    CHECK(R->reduce(C, KILN_REDUCE_MAX, &eo, &e, 1, 0) < 0);
}

static void test_arg_cumsum_sort(void)
{
    double x[] = {1, 5, 5, NAN, 2, NAN}; /* as [2,3]: [[1 5 5] [NaN 2 NaN]] */
    int64_t s23[] = {2, 3};
    kiln_tdesc in = tdesc(tbuf(x, sizeof x), KILN_F64, 0, 2, s23, NULL);
    kiln_tdesc am = tnew(KILN_I64, 2, (int64_t[]){2, 1});
    CHECK_OK(R->arg_reduce(C, true, &am, &in, 1));
    CHECK(tgeti(&am, 0) == 1 && tgeti(&am, 1) == 0);
    CHECK_OK(R->arg_reduce(C, false, &am, &in, 1));
    CHECK(tgeti(&am, 0) == 0 && tgeti(&am, 1) == 0);
    kiln_tdesc am0 = tnew(KILN_I64, 2, (int64_t[]){1, 3});
    CHECK_OK(R->arg_reduce(C, true, &am0, &in, 0));
    CHECK(tgeti(&am0, 0) == 1 && tgeti(&am0, 1) == 0 && tgeti(&am0, 2) == 1);

    kiln_tdesc cs = tnew(KILN_F64, 2, s23);
    CHECK_OK(R->cumsum(C, &cs, &in, 1));
    CHECK(tget(&cs, 2) == 11 && isnan(tget(&cs, 4)));
    uint8_t bv[] = {1, 1, 0, 1};
    kiln_tdesc tb = tdesc(tbuf(bv, 4), KILN_BOOL, 3, 1, (int64_t[]){4}, (int64_t[]){-1});
    kiln_tdesc ci = tnew(KILN_I64, 1, (int64_t[]){4});
    CHECK_OK(R->cumsum(C, &ci, &tb, 0)); /* reversed: 1 0 1 1 */
    CHECK(tgeti(&ci, 0) == 1 && tgeti(&ci, 1) == 1 && tgeti(&ci, 3) == 3);

    /* Stable sort, NaN largest; ties keep their order (indices tell). */
    float v[] = {3, NAN, 1, 3, -0.0f, 0.0f, NAN, 1};
    kiln_tdesc tv = vec(KILN_F32, v, 8), sv = tnew(KILN_F32, 1, (int64_t[]){8});
    kiln_tdesc si = tnew(KILN_I64, 1, (int64_t[]){8});
    CHECK_OK(R->sort(C, &sv, &si, &tv, 0, false));
    int64_t want[] = {4, 5, 2, 7, 0, 3, 1, 6};
    for (int i = 0; i < 8; i++)
        CHECK(tgeti(&si, i) == want[i]);
    CHECK(signbit(tget(&sv, 0)) && isnan(tget(&sv, 7)) && tget(&sv, 5) == 3);
    CHECK_OK(R->sort(C, &sv, &si, &tv, 0, true));
    int64_t wantd[] = {1, 6, 0, 3, 2, 7, 4, 5};
    for (int i = 0; i < 8; i++)
        CHECK(tgeti(&si, i) == wantd[i]);
    int64_t iv[] = {INT64_MAX, INT64_MAX - 1, -5};
    kiln_tdesc ti = vec(KILN_I64, iv, 3), so = tnew(KILN_I64, 1, (int64_t[]){3});
    CHECK_OK(R->sort(C, &so, NULL, &ti, 0, false));
    CHECK(tgeti(&so, 0) == -5 && tgeti(&so, 1) == INT64_MAX - 1 && tgeti(&so, 2) == INT64_MAX);
}

static void test_scalars_and_halves(void)
{
    /* 0-d operands with dim 0 behave as one-element lanes. */
    float one = 3;
    kiln_tdesc s = tdesc(tbuf(&one, 4), KILN_F32, 0, 0, NULL, NULL);
    kiln_tdesc si = tnew(KILN_I64, 0, NULL), so = tnew(KILN_F32, 0, NULL);
    CHECK_OK(R->arg_reduce(C, true, &si, &s, 0));
    CHECK(tgeti(&si, 0) == 0);
    CHECK_OK(R->softmax(C, false, &so, &s, 0));
    CHECK(tget(&so, 0) == 1);
    CHECK_OK(R->cumsum(C, &so, &s, 0));
    CHECK(tget(&so, 0) == 3);
    CHECK_OK(R->reduce(C, KILN_REDUCE_SUM, &so, &s, 0, 0));
    CHECK(tget(&so, 0) == 3);

    /* f16 sums accumulate in double: 2048 + 1 + 1 is 2050 (a running f16 sum sticks at
     * 2048, since 2049 is not representable and ties round to even). */
    uint16_t h[] = {kiln_f32_to_f16(2048), kiln_f32_to_f16(1), kiln_f32_to_f16(1)};
    kiln_tdesc th = vec(KILN_F16, h, 3), ho = tnew(KILN_F16, 1, (int64_t[]){1});
    CHECK_OK(R->reduce(C, KILN_REDUCE_SUM, &ho, &th, 1, 0));
    CHECK(tget(&ho, 0) == 2050);
    kiln_tdesc hc = tnew(KILN_BF16, 1, (int64_t[]){3});
    CHECK_OK(R->cumsum(C, &hc, &th, 0)); /* bf16 has 8 bits: 2049 rounds to 2048 */
    CHECK(tget(&hc, 1) == 2048 && tget(&hc, 2) == 2048);
}

static void test_speed(void)
{
    /* Linear cost: a million-element strided op has to stay well under a second. */
    int64_t s[] = {1000, 1000};
    kiln_tdesc a = tnew(KILN_F32, 2, s), o = tnew(KILN_F32, 2, s);
    kiln_tdesc at = tdesc(a.buf, KILN_F32, 0, 2, s, (int64_t[]){1, 1000});
    clock_t t0 = clock();
    CHECK_OK(R->binary(C, KILN_BINARY_ADD, &o, &at, &a));
    kiln_tdesc r = tnew(KILN_F32, 2, (int64_t[]){1000, 1});
    CHECK_OK(R->reduce(C, KILN_REDUCE_SUM, &r, &at, 2, 0));
    double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
    CHECK(secs < 1.0);
}

int main(void)
{
    R = kiln_backend_ref();
    C = R->open(0);
    if (!C) {
        fprintf(stderr, "open failed\n");
        return 1;
    }
    test_life_cycle();
    test_fill_arange_copy();
    test_rng();
    test_unary();
    test_binary_where();
    test_reduce();
    test_arg_cumsum_sort();
    test_scalars_and_halves();
    test_speed();
    tfree_all();
    test_ref_ops();
    tfree_all();
    R->close(C);
    if (test_failures) {
        fprintf(stderr, "%d check(s) failed\n", test_failures);
        return 1;
    }
    printf("backend-ref: all checks passed\n");
    return 0;
}
