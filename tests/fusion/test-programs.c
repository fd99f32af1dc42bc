/*
 * tests/fusion/test-programs.c — kiln_fused_program run by the cpu backend's fused_run,
 * checked against the same program interpreted with the backend's own unfused entries
 * (copy for a load, fill for a constant, unary and binary over whole tensors): the two
 * must agree to the bit. Hand-written programs cover each input layout (contiguous,
 * broadcast scalar, row broadcast read in place, permuted gather, a flipped view), the
 * streamed path for large outputs, register reuse over a long chain and an in-place
 * update; random programs cover the rest. Malformed programs must be refused with
 * KILN_ENOTSUP, never run.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "fused-program.h"
#include "fusion-test.h"
#include "kiln/tensor.h"

static const kiln_backend_iface *be;
static void *ctx;

static kiln_buffer *buf_of(int64_t n, const float *data)
{
    kiln_buffer *b = be->buffer_alloc(ctx, (size_t)n * sizeof(float));
    if (b && data)
        be->buffer_upload(ctx, b, 0, data, (size_t)n * sizeof(float));
    return b;
}

static kiln_tdesc desc(kiln_buffer *b, int64_t offset, int ndim, const int64_t *shape, const int64_t *strides)
{
    kiln_tdesc d = {.buf = b, .offset = offset, .dtype = KILN_F32, .ndim = ndim};
    for (int i = 0; i < ndim; i++) {
        d.shape[i] = shape[i];
        d.strides[i] = strides[i];
    }
    return d;
}

static kiln_tdesc flat(kiln_buffer *b, int64_t n)
{
    return desc(b, 0, 1, (int64_t[]){n}, (int64_t[]){1});
}

static void fill_random(float *p, int64_t n, uint64_t seed)
{
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)((double)test_rand(&seed) / (double)(1ull << 31) * 4.0 - 2.0);
}

/* Interpret p with the unfused entries; outputs land in ref_out[k] (n floats each). */
static int interpret(const kiln_fused_program *p, float **ref_out)
{
    int64_t n = p->n;
    kiln_buffer **regs = calloc((size_t)p->nregs, sizeof *regs);
    int rc = 0;
    for (int i = 0; i < p->ninstrs && rc == 0; i++) {
        const kiln_fused_instr *in = &p->instrs[i];
        if (in->code == KILN_FUSED_STORE) {
            rc = be->buffer_download(ctx, regs[in->a], 0, ref_out[in->arg], (size_t)n * sizeof(float));
            continue;
        }
        regs[in->dst] = buf_of(n, NULL);
        kiln_tdesc o = flat(regs[in->dst], n);
        kiln_tdesc src = in->code == KILN_FUSED_LOAD ? p->inputs[in->arg] : flat(regs[in->a], n);
        if (in->code == KILN_FUSED_LOAD) {
            /* the load's own shape, written contiguously */
            kiln_tdesc oc = src;
            oc.buf = regs[in->dst];
            oc.offset = 0;
            for (int d = oc.ndim - 1, s = 1; d >= 0; d--) {
                oc.strides[d] = s;
                s *= (int)oc.shape[d];
            }
            rc = be->copy(ctx, &oc, &src);
        } else if (in->code == KILN_FUSED_CONST) {
            rc = be->fill(ctx, &o, in->alpha);
        } else if (in->code == KILN_FUSED_UNARY) {
            rc = be->unary(ctx, (kiln_unary_op)in->op, &o, &src, in->alpha, in->beta);
        } else {
            kiln_tdesc b = flat(regs[in->b], n);
            rc = be->binary(ctx, (kiln_binary_op)in->op, &o, &src, &b);
        }
    }
    for (int r = 0; r < p->nregs; r++)
        if (regs[r])
            be->buffer_free(ctx, regs[r]);
    free(regs);
    return rc;
}

/* Run p fused and interpreted; every output must match to the bit (NaN with NaN). */
static void check_program(const char *what, const kiln_fused_program *p)
{
    int64_t n = p->n;
    float *ref[KILN_FUSED_MAX_OUTPUTS], got[1];
    (void)got;
    for (int k = 0; k < p->noutputs; k++)
        ref[k] = malloc((size_t)n * sizeof(float));
    int rc_ref = interpret(p, ref);
    CHECK(rc_ref == 0, "%s: interpreting failed: %s", what, kiln_error());
    int rc = be->fused_run(ctx, p);
    CHECK(rc == 0, "%s: fused_run returned %d: %s", what, rc, kiln_error());
    float *out = malloc((size_t)n * sizeof(float));
    for (int k = 0; k < p->noutputs; k++) {
        be->buffer_download(ctx, p->outputs[k].buf, (size_t)p->outputs[k].offset * sizeof(float), out,
                            (size_t)n * sizeof(float));
        int64_t bad = -1;
        for (int64_t i = 0; i < n && bad < 0; i++)
            if (memcmp(&out[i], &ref[k][i], sizeof(float)) && !(isnan(out[i]) && isnan(ref[k][i])))
                bad = i;
        CHECK(bad < 0, "%s: output %d element %lld: fused %.9g, unfused %.9g", what, k, (long long)bad,
              bad >= 0 ? out[bad] : 0.0, bad >= 0 ? ref[k][bad] : 0.0);
        free(ref[k]);
    }
    free(out);
}

#define LOAD(r, i)                                                                                                \
    {                                                                                                             \
        .code = KILN_FUSED_LOAD, .dst = (r), .arg = (i)                                                           \
    }
#define CONST(r, v)                                                                                               \
    {                                                                                                             \
        .code = KILN_FUSED_CONST, .dst = (r), .alpha = (v)                                                        \
    }
#define UN(r, o, x)                                                                                               \
    {                                                                                                             \
        .code = KILN_FUSED_UNARY, .op = (o), .dst = (r), .a = (x)                                                 \
    }
#define UN2(r, o, x, al, bt)                                                                                      \
    {                                                                                                             \
        .code = KILN_FUSED_UNARY, .op = (o), .dst = (r), .a = (x), .alpha = (al), .beta = (bt)                    \
    }
#define BIN(r, o, x, y)                                                                                           \
    {                                                                                                             \
        .code = KILN_FUSED_BINARY, .op = (o), .dst = (r), .a = (x), .b = (y)                                      \
    }
#define STORE(x, i)                                                                                               \
    {                                                                                                             \
        .code = KILN_FUSED_STORE, .a = (x), .arg = (i)                                                            \
    }

static kiln_fused_program program(int64_t n, int ni, const kiln_tdesc *in, int no, const kiln_tdesc *out,
                                  int ninstr, const kiln_fused_instr *ins, int nregs)
{
    return (kiln_fused_program){.dtype = KILN_F32,
                                .n = n,
                                .ninputs = ni,
                                .noutputs = no,
                                .ninstrs = ninstr,
                                .nregs = nregs,
                                .inputs = in,
                                .outputs = out,
                                .instrs = ins};
}

/* gelu(x * a + b) * c with a a row vector (read in place), b a scalar, c a small row
 * (gathered), over rows x cols; plus x permuted and flipped as a second output. */
static void layouts(int64_t rows, int64_t cols, const char *what)
{
    int64_t n = rows * cols;
    float *hx = malloc((size_t)n * sizeof(float)), ha[4096], hb = 0.25f, hc[8];
    fill_random(hx, n, 1);
    fill_random(ha, cols, 2);
    fill_random(hc, 8, 3);
    kiln_buffer *x = buf_of(n, hx), *a = buf_of(cols, ha), *b = buf_of(1, &hb), *c = buf_of(8, hc);
    kiln_buffer *o0 = buf_of(n, NULL), *o1 = buf_of(n, NULL);
    kiln_tdesc in[5] = {
        flat(x, n),
        desc(a, 0, 2, (int64_t[]){rows, cols}, (int64_t[]){0, 1}),
        desc(b, 0, 2, (int64_t[]){rows, cols}, (int64_t[]){0, 0}),
        /* c repeats every 8 elements: [n / 8, 8] with strides [0, 1] (n is a multiple of 8) */
        desc(c, 0, 2, (int64_t[]){n / 8, 8}, (int64_t[]){0, 1}),
        /* x transposed and its rows flipped: the view [cols, rows] with strides [1, -cols] */
        desc(x, (rows - 1) * cols, 2, (int64_t[]){cols, rows}, (int64_t[]){1, -cols}),
    };
    kiln_tdesc out[2] = {flat(o0, n), flat(o1, n)};
    kiln_fused_instr ins[] = {
        LOAD(0, 0),
        LOAD(1, 1),
        BIN(2, KILN_BINARY_MUL, 0, 1),
        LOAD(3, 2),
        BIN(4, KILN_BINARY_ADD, 2, 3),
        UN(5, KILN_UNARY_GELU, 4),
        LOAD(6, 3),
        BIN(7, KILN_BINARY_MUL, 5, 6),
        STORE(7, 0),
        LOAD(8, 4),
        UN2(9, KILN_UNARY_CLAMP, 8, -1.0, 1.5),
        STORE(9, 1),
    };
    kiln_fused_program p = program(n, 5, in, 2, out, (int)(sizeof ins / sizeof *ins), ins, 10);
    check_program(what, &p);
    be->buffer_free(ctx, x);
    be->buffer_free(ctx, a);
    be->buffer_free(ctx, b);
    be->buffer_free(ctx, c);
    be->buffer_free(ctx, o0);
    be->buffer_free(ctx, o1);
    free(hx);
}

/* 40 unary ops in a row: registers are reused, the result matches op by op. */
static void long_chain(void)
{
    int64_t n = 5 * 7 * 11 * 13;
    float *hx = malloc((size_t)n * sizeof(float));
    fill_random(hx, n, 4);
    kiln_buffer *x = buf_of(n, hx), *o = buf_of(n, NULL);
    kiln_tdesc in[1] = {flat(x, n)}, out[1] = {flat(o, n)};
    static const int ops[] = {KILN_UNARY_TANH, KILN_UNARY_SIGMOID, KILN_UNARY_GELU_TANH, KILN_UNARY_SILU,
                              KILN_UNARY_NEG,  KILN_UNARY_EXP,     KILN_UNARY_LOG1P,     KILN_UNARY_SQUARE};
    kiln_fused_instr ins[KILN_FUSED_MAX_INSTRS];
    int k = 0;
    ins[k++] = (kiln_fused_instr)LOAD(0, 0);
    for (int i = 0; i < 40; i++)
        ins[k++] = (kiln_fused_instr)UN(i + 1, ops[i % 8], i);
    ins[k++] = (kiln_fused_instr)BIN(41, KILN_BINARY_ADD, 40, 0);
    ins[k++] = (kiln_fused_instr)STORE(41, 0);
    kiln_fused_program p = program(n, 1, in, 1, out, k, ins, 42);
    check_program("40 unary ops in a row", &p);
    be->buffer_free(ctx, x);
    be->buffer_free(ctx, o);
    free(hx);
}

/* x = relu(x) * 2 in place, plus a constant and a copy stored. */
static void in_place(void)
{
    int64_t n = 3000;
    float *hx = malloc((size_t)n * sizeof(float));
    fill_random(hx, n, 5);
    kiln_buffer *x = buf_of(n, hx), *o = buf_of(n, NULL), *o2 = buf_of(n, NULL);
    kiln_tdesc in[1] = {flat(x, n)}, out[3] = {flat(x, n), flat(o, n), flat(o2, n)};
    kiln_fused_instr ins[] = {LOAD(0, 0),    UN(1, KILN_UNARY_RELU, 0),
                              CONST(2, 2.0), BIN(3, KILN_BINARY_MUL, 1, 2),
                              STORE(3, 0),   STORE(2, 1),
                              STORE(0, 2)};
    kiln_fused_program p = program(n, 1, in, 3, out, 7, ins, 4);
    /* the interpreted reference reads x before the fused run changes it */
    float *want = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        want[i] = (hx[i] > 0 ? hx[i] : 0.0f) * 2.0f;
    CHECK(be->fused_run(ctx, &p) == 0, "in place: %s", kiln_error());
    float *got = malloc((size_t)n * sizeof(float)), *got2 = malloc((size_t)n * sizeof(float));
    be->buffer_download(ctx, x, 0, got, (size_t)n * sizeof(float));
    be->buffer_download(ctx, o2, 0, got2, (size_t)n * sizeof(float));
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++)
        if (got[i] != want[i] || got2[i] != hx[i])
            bad = i;
    CHECK(bad < 0, "in place: element %lld wrong", (long long)bad);
    be->buffer_download(ctx, o, 0, got, (size_t)n * sizeof(float));
    CHECK(got[0] == 2.0f && got[n - 1] == 2.0f, "in place: constant store wrong (%g)", got[0]);
    be->buffer_free(ctx, x);
    be->buffer_free(ctx, o);
    be->buffer_free(ctx, o2);
    free(hx);
    free(want);
    free(got);
    free(got2);
}

/* Random straight-line programs over random layouts. */
static void random_programs(void)
{
    uint64_t s = 77;
    for (int t = 0; t < 60; t++) {
        int64_t rows = 1 + test_pick(&s, 40), cols = 1 + test_pick(&s, t % 3 == 0 ? 700 : 60);
        int64_t n = rows * cols;
        float *hx = malloc((size_t)n * sizeof(float)), *hrow = malloc((size_t)cols * sizeof(float)), hs = 1.5f;
        fill_random(hx, n, s);
        fill_random(hrow, cols, s + 1);
        kiln_buffer *x = buf_of(n, hx), *row = buf_of(cols, hrow), *sc = buf_of(1, &hs);
        kiln_buffer *o[3] = {buf_of(n, NULL), buf_of(n, NULL), buf_of(n, NULL)};
        kiln_tdesc in[4] = {
            flat(x, n), desc(row, 0, 2, (int64_t[]){rows, cols}, (int64_t[]){0, 1}),
            desc(sc, 0, 1, (int64_t[]){n}, (int64_t[]){0}),
            desc(x, 0, 2, (int64_t[]){cols, rows}, (int64_t[]){1, cols}), /* transposed */
        };
        kiln_tdesc out[3] = {flat(o[0], n), flat(o[1], n), flat(o[2], n)};
        kiln_fused_instr ins[KILN_FUSED_MAX_INSTRS];
        int k = 0, nregs = 0;
        for (int i = 0; i < 4; i++)
            ins[k++] = (kiln_fused_instr)LOAD(nregs++, i);
        int nops = 2 + test_pick(&s, 20);
        static const int uops[] = {
            KILN_UNARY_TANH, KILN_UNARY_RELU,       KILN_UNARY_GELU,       KILN_UNARY_SIGMOID, KILN_UNARY_ABS,
            KILN_UNARY_NEG,  KILN_UNARY_MUL_SCALAR, KILN_UNARY_ADD_SCALAR, KILN_UNARY_SQUARE,  KILN_UNARY_ELU};
        static const int bops[] = {KILN_BINARY_ADD,     KILN_BINARY_SUB,     KILN_BINARY_MUL,
                                   KILN_BINARY_MAXIMUM, KILN_BINARY_MINIMUM, KILN_BINARY_DIV};
        for (int i = 0; i < nops; i++) {
            int r = nregs++;
            int c = test_pick(&s, 3);
            if (c == 0)
                ins[k++] = (kiln_fused_instr)UN2(r, uops[test_pick(&s, 10)], test_pick(&s, r), 0.5, 0.0);
            else if (c == 1)
                ins[k++] = (kiln_fused_instr)BIN(r, bops[test_pick(&s, 6)], test_pick(&s, r), test_pick(&s, r));
            else
                ins[k++] = (kiln_fused_instr)CONST(r, -0.75);
        }
        for (int i = 0; i < 3; i++)
            ins[k++] = (kiln_fused_instr)STORE(i == 0 ? nregs - 1 : test_pick(&s, nregs), i);
        kiln_fused_program p = program(n, 4, in, 3, out, k, ins, nregs);
        char what[64];
        snprintf(what, sizeof what, "random program %d (%lld x %lld)", t, (long long)rows, (long long)cols);
        check_program(what, &p);
        be->buffer_free(ctx, x);
        be->buffer_free(ctx, row);
        be->buffer_free(ctx, sc);
        for (int i = 0; i < 3; i++)
            be->buffer_free(ctx, o[i]);
        free(hx);
        free(hrow);
    }
}

/* Programs the cpu cannot run are refused, not run. */
static void refused(void)
{
    kiln_buffer *x = buf_of(16, NULL), *o = buf_of(16, NULL);
    kiln_tdesc in[1] = {flat(x, 16)}, out[1] = {flat(o, 16)};
    kiln_fused_instr read_early[] = {UN(1, KILN_UNARY_RELU, 0), LOAD(0, 0), STORE(1, 0)};
    kiln_fused_program p = program(16, 1, in, 1, out, 3, read_early, 2);
    CHECK(be->fused_run(ctx, &p) == KILN_ENOTSUP, "a register read before it is written must be refused");
    kiln_fused_instr bad_arg[] = {LOAD(0, 3), STORE(0, 0)};
    p = program(16, 1, in, 1, out, 2, bad_arg, 1);
    CHECK(be->fused_run(ctx, &p) == KILN_ENOTSUP, "a load of a missing input must be refused");
    kiln_fused_instr boolean[] = {LOAD(0, 0), UN(1, KILN_UNARY_ISNAN, 0), STORE(1, 0)};
    p = program(16, 1, in, 1, out, 3, boolean, 2);
    CHECK(be->fused_run(ctx, &p) == KILN_ENOTSUP, "a bool-valued op must be refused");
    kiln_fused_instr twice[] = {LOAD(0, 0), LOAD(0, 0), STORE(0, 0)};
    p = program(16, 1, in, 1, out, 3, twice, 1);
    CHECK(be->fused_run(ctx, &p) == KILN_ENOTSUP, "a register written twice must be refused");
    /* a row sum read back: rows of 4; a max, or rows not given, is refused */
    kiln_fused_instr row_sum[] = {
        LOAD(0, 0), {.code = KILN_FUSED_ROW_REDUCE, .op = KILN_REDUCE_SUM, .dst = 1, .a = 0}, STORE(1, 0)};
    p = program(16, 1, in, 1, out, 3, row_sum, 2);
    p.reduce_inner = 4;
    float xs[16], got[16];
    fill_random(xs, 16, 3);
    be->buffer_upload(ctx, x, 0, xs, sizeof xs);
    CHECK(be->fused_run(ctx, &p) == 0, "a row sum read back runs: %s", kiln_error());
    be->buffer_download(ctx, o, 0, got, sizeof got);
    int bad_row = -1;
    for (int i = 0; i < 16 && bad_row < 0; i++) {
        int r = i / 4 * 4;
        float want = (float)((double)xs[r] + xs[r + 1] + xs[r + 2] + xs[r + 3]);
        if (fabsf(got[i] - want) > 1e-6f * fabsf(want) + 1e-7f)
            bad_row = i;
    }
    CHECK(bad_row < 0, "row sums broadcast over their rows (element %d)", bad_row);
    row_sum[1].op = KILN_REDUCE_MAX;
    CHECK(be->fused_run(ctx, &p) == KILN_ENOTSUP, "a row max read back must be refused");
    row_sum[1].op = KILN_REDUCE_SUM;
    p.reduce_inner = 0;
    CHECK(be->fused_run(ctx, &p) == KILN_ENOTSUP, "a row sum without rows must be refused");
    kiln_fused_instr fine[] = {LOAD(0, 0), STORE(0, 0)};
    p = program(16, 1, in, 1, out, 2, fine, 1);
    p.dtype = KILN_F64;
    CHECK(be->fused_run(ctx, &p) == KILN_ENOTSUP, "an f64 program must be refused on cpu");
    /* products: 4x4 = [4, 2] @ [2, 4] over x's and o's memory */
    kiln_tdesc ops[3] = {desc(x, 0, 2, (int64_t[]){4, 2}, (int64_t[]){2, 1}),
                         desc(x, 8, 2, (int64_t[]){2, 4}, (int64_t[]){4, 1}), flat(o, 16)};
    kiln_fused_instr mm[] = {{.code = KILN_FUSED_MATMUL, .dst = 0, .arg = 0, .arg2 = 1}, STORE(0, 0)};
    p = program(16, 2, ops, 1, out, 2, mm, 1);
    CHECK(be->fused_run(ctx, &p) == 0, "a product stored as it is runs: %s", kiln_error());
    kiln_tdesc self_out[1] = {flat(x, 16)};
    p = program(16, 2, ops, 1, self_out, 2, mm, 1);
    CHECK(be->fused_run(ctx, &p) == KILN_ENOTSUP, "a product stored over its own operand must be refused");
    kiln_fused_instr late[] = {
        LOAD(0, 2), {.code = KILN_FUSED_MATMUL, .dst = 1, .arg = 0, .arg2 = 1}, STORE(1, 0)};
    p = program(16, 3, ops, 1, out, 3, late, 2);
    CHECK(be->fused_run(ctx, &p) == KILN_ENOTSUP, "a product that is not the first instruction must be refused");
    kiln_fused_instr loaded[] = {
        {.code = KILN_FUSED_MATMUL, .dst = 0, .arg = 0, .arg2 = 1}, LOAD(1, 0), STORE(0, 0)};
    p = program(16, 2, ops, 1, out, 3, loaded, 2);
    CHECK(be->fused_run(ctx, &p) == KILN_ENOTSUP, "a product operand loaded as an element input must be refused");
    ops[1].shape[0] = 3;
    p = program(16, 2, ops, 1, out, 2, mm, 1);
    CHECK(be->fused_run(ctx, &p) == KILN_ENOTSUP, "a product of mismatched inner dims must be refused");
    kiln_fused_instr conv[] = {{.code = KILN_FUSED_CONV, .dst = 0, .arg = 0, .arg2 = 1, .arg3 = -1}, STORE(0, 0)};
    p = program(16, 2, ops, 1, out, 2, conv, 1);
    CHECK(be->fused_run(ctx, &p) == KILN_ENOTSUP, "a convolution without its geometry must be refused");
    be->buffer_free(ctx, x);
    be->buffer_free(ctx, o);
}

void test_programs(void)
{
    kiln_device *dev = kiln_device_open("cpu");
    CHECK(dev != NULL, "open cpu: %s", kiln_error());
    if (!dev)
        return;
    be = kiln__device_iface(dev);
    ctx = kiln__device_ctx(dev);
    CHECK(be->fused_run != NULL, "the cpu backend has a fused_run entry");
    layouts(64, 40, "layouts, small");
    layouts(7, 4096 - 8, "layouts, long rows read in place");
    layouts(1024, 2048 + 8, "layouts, 2M elements (streamed stores)");
    long_chain();
    in_place();
    random_programs();
    refused();
    char key[256];
    kiln_tdesc in[1] = {flat(NULL, 8)};
    kiln_fused_instr ins[] = {LOAD(0, 0), UN(1, KILN_UNARY_RELU, 0), STORE(1, 0)};
    kiln_fused_program p = program(8, 1, in, 1, in, 3, ins, 2);
    kiln__fused_key(&p, key, sizeof key);
    CHECK(strstr(key, "f32") == key && strstr(key, "i0:c"), "program key names dtype and layouts: '%s'", key);
    kiln_device_close(dev);
}
