/*
 * tests/fusion/test-conv-chain.c — a convolution's epilogue chained into the convolution
 * on the cpu (cpu-fused-chain.c): a batch norm in eval mode ((v - mean) · scale + shift,
 * one value per channel), a residual add and a ReLU applied to each tile as it is stored.
 *
 * A fused program's result takes the pool's most recently parked block of its size
 * (kiln__cpu_buffer_refresh), unless its address was handed out.
 *
 * The planner: programs that are chains are taken (each op's code and operand kind as
 * expected), those that are not are left to the second pass (a stored intermediate, the
 * running value used twice, an op with no chain form, an operand per position, an
 * in-place residual). End to end, on every kernel table this CPU runs: convolutions whose
 * geometry takes each path of the conv entry (tiles stored in place, tiles through a
 * buffer with padding or strides, packed weights on a large batch, depthwise, the GEMM
 * lowering), with every op form, NaN and signed zeros in the input, must give the unfused
 * device's bits, run inside a fused program, and stay near ref.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu-fused-impl.h"
#include "fusion-test.h"
#include "kiln/autodiff.h"
#include "kiln/tensor.h"

/* ------------------------------------------------------------------ the planner */

static kiln_tdesc tdesc(kiln_buffer *b, int ndim, const int64_t *shape, const int64_t *strides)
{
    kiln_tdesc d = {.buf = b, .dtype = KILN_F32, .ndim = ndim};
    for (int i = 0; i < ndim; i++) {
        d.shape[i] = shape[i];
        d.strides[i] = strides[i];
    }
    return d;
}

/* A program: conv(x, w) [N=2, O=4, 3x3 outputs from 5x5 inputs, 3x3 kernel], then the
 * given instructions after it; planned, then asked whether it is a chain. */
typedef struct chain_case {
    const char *what;
    bool chained;
    int nops;
    int codes[6];
    int kinds[6]; /* 0 scalar, 1 per plane, 2 full */
} chain_case;

static struct kiln_buffer bufs[8];

static void plan_case(const chain_case *c, const kiln_fused_instr *ins, int nins, const kiln_tdesc *extra,
                      int nextra, int out_buf)
{
    static const kiln_conv_params conv = {
        .nspatial = 2, .stride = {1, 1}, .padding = {0, 0}, .dilation = {1, 1}, .groups = 1};
    static float mem[8][512];
    for (int i = 0; i < 8; i++)
        bufs[i].data = mem[i];
    kiln_tdesc inputs[8];
    inputs[0] = tdesc(&bufs[0], 4, (int64_t[]){2, 3, 5, 5}, (int64_t[]){75, 25, 5, 1});
    inputs[1] = tdesc(&bufs[1], 4, (int64_t[]){4, 3, 3, 3}, (int64_t[]){27, 9, 3, 1});
    for (int i = 0; i < nextra; i++)
        inputs[2 + i] = extra[i];
    kiln_tdesc out = tdesc(&bufs[out_buf], 1, (int64_t[]){72}, (int64_t[]){1});
    kiln_fused_instr all[16];
    all[0] = (kiln_fused_instr){.code = KILN_FUSED_CONV, .dst = 0, .arg = 0, .arg2 = 1, .arg3 = -1};
    memcpy(all + 1, ins, (size_t)nins * sizeof *ins);
    kiln_fused_program p = {.dtype = KILN_F32,
                            .n = 72,
                            .ninputs = 2 + nextra,
                            .noutputs = 1,
                            .ninstrs = 1 + nins,
                            .nregs = 16,
                            .inputs = inputs,
                            .outputs = &out,
                            .instrs = all,
                            .conv = &conv};
    fplan *pl = calloc(1, sizeof *pl);
    int rc = kiln__cpu_fused_plan(pl, &p);
    CHECK(rc == 0, "%s: planned (%d)", c->what, rc);
    pl->p = &p;
    bool got = rc == 0 && kiln__cpu_fused_chain_plan(pl);
    CHECK(got == c->chained, "%s: %s a chain", c->what, c->chained ? "is" : "is not");
    if (got && got == c->chained) {
        CHECK(pl->chain.nops == c->nops, "%s: %d ops (got %d)", c->what, c->nops, pl->chain.nops);
        for (int k = 0; k < c->nops && k < pl->chain.nops; k++) {
            const kiln__cpu_chain_op *op = &pl->chain.ops[k];
            int kind = op->full ? 2 : pl->chain_plane[k] >= 0 ? 1 : 0;
            CHECK(op->code == c->codes[k] && kind == c->kinds[k], "%s: op %d is code %d kind %d (got %d, %d)",
                  c->what, k, c->codes[k], c->kinds[k], op->code, kind);
        }
    }
    free(pl);
}

#define LOAD(r, i)                                                                                                \
    {                                                                                                             \
        .code = KILN_FUSED_LOAD, .dst = (r), .arg = (i)                                                           \
    }
#define BIN(op_, r, a_, b_)                                                                                       \
    {                                                                                                             \
        .code = KILN_FUSED_BINARY, .op = (op_), .dst = (r), .a = (a_), .b = (b_)                                  \
    }
#define RELU(r, a_)                                                                                               \
    {                                                                                                             \
        .code = KILN_FUSED_UNARY, .op = KILN_UNARY_RELU, .dst = (r), .a = (a_)                                    \
    }
#define STORE(a_)                                                                                                 \
    {                                                                                                             \
        .code = KILN_FUSED_STORE, .a = (a_), .arg = 0                                                             \
    }

static void planner(void)
{
    /* per channel: [1, 4, 1, 1] expanded to [2, 4, 3, 3]; full: the output's layout; per
     * position: [1, 1, 3, 3] expanded (not one value per plane) */
    kiln_tdesc chan = tdesc(&bufs[2], 4, (int64_t[]){2, 4, 3, 3}, (int64_t[]){0, 1, 0, 0});
    kiln_tdesc chan2 = tdesc(&bufs[3], 4, (int64_t[]){2, 4, 3, 3}, (int64_t[]){0, 1, 0, 0});
    kiln_tdesc full = tdesc(&bufs[4], 4, (int64_t[]){2, 4, 3, 3}, (int64_t[]){36, 9, 3, 1});
    kiln_tdesc scalar = tdesc(&bufs[5], 4, (int64_t[]){2, 4, 3, 3}, (int64_t[]){0, 0, 0, 0});
    kiln_tdesc pos = tdesc(&bufs[6], 4, (int64_t[]){2, 4, 3, 3}, (int64_t[]){0, 0, 3, 1});
    {
        const kiln_tdesc ex[] = {chan, chan2, full};
        const kiln_fused_instr ins[] = {
            LOAD(1, 2), BIN(KILN_BINARY_SUB, 2, 0, 1), LOAD(3, 3), BIN(KILN_BINARY_MUL, 4, 2, 3),
            LOAD(5, 4), BIN(KILN_BINARY_ADD, 6, 5, 4), RELU(7, 6), STORE(7)};
        chain_case c = {"batch norm, residual, relu",
                        true,
                        4,
                        {KILN__CHAIN_SUB, KILN__CHAIN_MUL, KILN__CHAIN_ADD, KILN__CHAIN_RELU},
                        {1, 1, 2, 0}};
        plan_case(&c, ins, 8, ex, 3, 7);
        /* the same with the residual's buffer as the output: an in-place add */
        chain_case inplace = {"residual added in place", false, 0, {0}, {0}};
        plan_case(&inplace, ins, 8, ex, 3, 4);
    }
    {
        const kiln_tdesc ex[] = {chan, scalar};
        const kiln_fused_instr ins[] = {LOAD(1, 2),
                                        BIN(KILN_BINARY_SUB, 2, 1, 0),
                                        LOAD(3, 3),
                                        BIN(KILN_BINARY_DIV, 4, 3, 2),
                                        {.code = KILN_FUSED_CONST, .dst = 5, .alpha = 0.5},
                                        BIN(KILN_BINARY_DIV, 6, 4, 5),
                                        STORE(6)};
        chain_case c = {"reversed operands and a constant",
                        true,
                        3,
                        {KILN__CHAIN_RSUB, KILN__CHAIN_RDIV, KILN__CHAIN_DIV},
                        {1, 0, 0}};
        plan_case(&c, ins, 7, ex, 2, 7);
    }
    {
        const kiln_tdesc ex[] = {chan};
        const kiln_fused_instr two_stores[] = {LOAD(1, 2), BIN(KILN_BINARY_ADD, 2, 0, 1), STORE(0), STORE(2)};
        chain_case c = {"the convolution stored too", false, 0, {0}, {0}};
        plan_case(&c, two_stores, 4, ex, 1, 7);
        const kiln_fused_instr squared[] = {BIN(KILN_BINARY_MUL, 1, 0, 0), STORE(1)};
        chain_case c2 = {"the running value twice", false, 0, {0}, {0}};
        plan_case(&c2, squared, 2, ex, 1, 7);
        const kiln_fused_instr sigmoid[] = {{.code = KILN_FUSED_UNARY, .op = KILN_UNARY_SIGMOID, .dst = 1, .a = 0},
                                            STORE(1)};
        chain_case c3 = {"a sigmoid", false, 0, {0}, {0}};
        plan_case(&c3, sigmoid, 2, ex, 1, 7);
        const kiln_fused_instr maxed[] = {LOAD(1, 2), BIN(KILN_BINARY_MAXIMUM, 2, 0, 1), STORE(2)};
        chain_case c4 = {"a maximum", false, 0, {0}, {0}};
        plan_case(&c4, maxed, 3, ex, 1, 7);
    }
    {
        const kiln_tdesc ex[] = {pos};
        const kiln_fused_instr ins[] = {LOAD(1, 2), BIN(KILN_BINARY_ADD, 2, 0, 1), STORE(2)};
        chain_case c = {"an operand per position", false, 0, {0}, {0}};
        plan_case(&c, ins, 3, ex, 1, 7);
    }
}

/* ------------------------------------------------------------------ refreshed results */

/* kiln__cpu_buffer_refresh: a buffer takes the block parked last in its class, which
 * parks its own; an exported, wrapped or lone buffer keeps its block. */
static void refresh(void)
{
    kiln_device *dev = kiln_device_open("cpu");
    CHECK(dev != NULL, "open cpu: %s", kiln_error());
    if (!dev)
        return;
    kiln__cpu_ctx *ctx = kiln__device_ctx(dev);
    const size_t n = 300000; /* a class of its own in this test */
    struct kiln_buffer *a = kiln__cpu_buffer_get(ctx, n), *b = kiln__cpu_buffer_get(ctx, n);
    CHECK(a && b, "two buffers");
    if (!a || !b)
        return;
    void *a_block = a->data, *b_block = b->data;
    kiln__cpu_buffer_refresh(ctx, b); /* nothing parked in the class yet */
    CHECK(b->data == b_block, "a buffer alone in its class keeps its block");
    kiln__cpu_buffer_put(ctx, a);
    uint64_t refreshes = ctx->alloc.refreshes;
    kiln__cpu_buffer_refresh(ctx, b);
    CHECK(b->data == a_block && ctx->alloc.refreshes == refreshes + 1,
          "the refreshed buffer took the parked block");
    struct kiln_buffer *c = kiln__cpu_buffer_get(ctx, n);
    CHECK(c && c->data == b_block, "its old block was parked in its place and is handed out next");
    kiln__cpu_buffer_put(ctx, c);
    b->exported = true;
    void *kept = b->data;
    kiln__cpu_buffer_refresh(ctx, b);
    CHECK(b->data == kept, "an exported buffer keeps its block");
    kiln__cpu_buffer_put(ctx, b);
    kiln_device_close(dev);
}

/* ------------------------------------------------------------------ end to end */

#define NDEV 3
static kiln_device *devs[NDEV]; /* fused, unfused, ref */

/* 0 when a and b hold the same values (NaN where the other has NaN, signed zeros
 * alike), else the largest difference relative to |b| + 1 (INFINITY on a mismatch of
 * NaN or sign of zero, or a failed read). */
static double difference(kiln_tensor *a, kiln_tensor *b)
{
    if (!a || !b || kiln_tensor_numel(a) != kiln_tensor_numel(b))
        return INFINITY;
    int64_t n = kiln_tensor_numel(a);
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    double worst = 0;
    if (!x || !y || kiln_to_data(a, x, (size_t)n * sizeof *x) < 0 || kiln_to_data(b, y, (size_t)n * sizeof *y) < 0)
        worst = INFINITY;
    for (int64_t i = 0; i < n && worst < INFINITY; i++) {
        if (isnan(x[i]) || isnan(y[i]) || (x[i] == 0 && y[i] == 0)) {
            bool same = isnan(x[i]) ? isnan(y[i]) : !isnan(y[i]) && signbit(x[i]) == signbit(y[i]);
            worst = same ? worst : INFINITY;
            continue;
        }
        double d = fabs((double)x[i] - (double)y[i]) / (fabs((double)y[i]) + 1);
        worst = d > worst ? d : worst;
    }
    free(x);
    free(y);
    return worst;
}

typedef struct conv_case {
    const char *what;
    int64_t N, C, O, H, K, stride, pad, groups;
    bool bias, residual;
    int form; /* 0 batch norm; 1 reversed ops and a scalar tensor; 2 a divide by a channel value */
} conv_case;

static kiln_tensor *run_case(kiln_device *d, const conv_case *c, uint64_t seed)
{
    kiln_generator g = kiln_generator_make(seed);
    int64_t OH = (c->H + 2 * c->pad - c->K) / c->stride + 1;
    kiln_tensor *x = kiln_rand_uniform(d, KILN_F32, KILN_SHAPE(c->N, c->C, c->H, c->H), -1, 1, &g);
    /* NaN and signed zeros through the ReLU and the arithmetic */
    float specials[4] = {NAN, -0.0f, 0.0f, -0.0f};
    kiln_tensor *sp = kiln_from_data(d, KILN_F32, KILN_SHAPE(4), specials, sizeof specials);
    x = kiln_cat((kiln_tensor *[]){kiln_slice(kiln_reshape(x, KILN_SHAPE(-1)), 0, 4, INT64_MAX, 1), sp}, 2, 0);
    x = kiln_reshape(x, KILN_SHAPE(c->N, c->C, c->H, c->H));
    kiln_tensor *w = kiln_rand_uniform(d, KILN_F32, KILN_SHAPE(c->O, c->C / c->groups, c->K, c->K), -0.5, 0.5, &g);
    kiln_tensor *b = c->bias ? kiln_rand_uniform(d, KILN_F32, KILN_SHAPE(c->O), -1, 1, &g) : NULL;
    kiln_tensor *mean = kiln_rand_uniform(d, KILN_F32, KILN_SHAPE(1, c->O, 1, 1), -0.5, 0.5, &g);
    kiln_tensor *scale = kiln_rand_uniform(d, KILN_F32, KILN_SHAPE(c->O, 1, 1), 0.5, 2, &g);
    kiln_tensor *shift = kiln_rand_uniform(d, KILN_F32, KILN_SHAPE(1, c->O, 1, 1), -0.5, 0.5, &g);
    kiln_tensor *res = c->residual ? kiln_rand_uniform(d, KILN_F32, KILN_SHAPE(c->N, c->O, OH, OH), -1, 1, &g)
                                   : NULL;
    kiln_tensor *two = kiln_full(d, KILN_F32, KILN_SHAPE(1), 2.0);
    kiln_device_sync(d);
    kiln_conv_opts o = {.groups = c->groups};
    o.stride[0] = o.stride[1] = c->stride;
    o.padding[0] = o.padding[1] = c->pad;
    /* the intermediates die in the inner scope before the result is read */
    kiln_scope_begin();
    kiln_tensor *v = kiln_conv2d(x, w, b, &o);
    if (c->form == 0)
        v = kiln_add(kiln_mul(kiln_sub(v, mean), scale), shift);
    else if (c->form == 1)
        v = kiln_div(two, kiln_sub(shift, v)); /* s - v, then s / v with a one-element tensor */
    else
        v = kiln_mul_scalar(kiln_div(v, scale), 0.75);
    if (res)
        v = kiln_add(v, res);
    v = kiln_keep(kiln_relu(v));
    kiln_scope_end();
    return v;
}

static void conv_cases(const char *table)
{
    static const conv_case cases[] = {
        /* 1x1 on 56x56 at batch 1: tiles stored in place (the chain in registers) */
        {"1x1 in place", 1, 16, 24, 20, 1, 1, 0, 1, false, true, 0},
        {"1x1 in place, bias, reversed ops", 1, 8, 20, 14, 1, 1, 0, 1, true, false, 1},
        /* padding: tiles through a buffer, the runs copied out (per-channel chain in
         * the tile, a residual per run) */
        {"3x3 padded", 1, 8, 16, 15, 3, 1, 1, 1, false, false, 0},
        {"3x3 padded, residual", 2, 6, 12, 11, 3, 1, 1, 1, true, true, 2},
        {"3x3 stride 2", 1, 8, 12, 17, 3, 2, 1, 1, false, true, 0},
        /* a large batch: packed weights */
        {"3x3 packed weights", 12, 4, 8, 28, 3, 1, 1, 1, true, true, 0},
        {"1x1 packed weights, divide", 12, 4, 10, 28, 1, 1, 0, 1, false, false, 2},
        /* the other paths: one pass after the convolution */
        {"depthwise", 2, 8, 8, 12, 3, 1, 1, 8, true, true, 0},
        {"1x1 on a 4x4 map (GEMM)", 2, 16, 12, 4, 1, 1, 0, 1, false, true, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const conv_case *c = &cases[i];
        uint64_t f0 = fusion_calls_of(devs[0], "fused"), c0 = fusion_calls_of(devs[0], "conv");
        kiln_tensor *out[NDEV];
        for (int d = 0; d < NDEV; d++) {
            kiln_scope_begin();
            out[d] = run_case(devs[d], c, 500 + i);
            kiln_scope_end();
        }
        double u = difference(out[0], out[1]), r = difference(out[0], out[2]);
        CHECK(u == 0, "%s, %s: fused vs unfused %.3g (the same bits; %s)", table, c->what, u,
              out[0] ? "" : kiln_error());
        /* (2 / (s - v) magnifies the convolution's rounding where s - v is near 0) */
        CHECK(r <= (c->form == 1 ? 1e-3 : 1e-4), "%s, %s: fused vs ref %.3g", table, c->what, r);
        CHECK(fusion_calls_of(devs[0], "fused") > f0 && fusion_calls_of(devs[0], "conv") == c0,
              "%s, %s: the convolution ran inside a fused program", table, c->what);
        for (int d = 0; d < NDEV; d++)
            kiln_tensor_release(out[d]);
    }
}

void test_conv_chains(void)
{
    planner();
    refresh();
    static const char *const tables[] = {"auto", "avx2", "base"};
    for (int t = 0; t < 3; t++) {
        char fspec[96], pspec[96];
        snprintf(fspec, sizeof fspec, "fused:counting:cpu?min_elements=0&kernels=%s", tables[t]);
        snprintf(pspec, sizeof pspec, "counting:cpu?kernels=%s", tables[t]);
        const char *specs[NDEV] = {fspec, pspec, "ref"};
        bool ok = true;
        for (int d = 0; d < NDEV; d++) {
            devs[d] = kiln_device_open(specs[d]);
            ok = ok && devs[d];
        }
        /* (a table wider than the CPU runs is capped to one it does, never refused) */
        CHECK(ok, "open %s: %s", fspec, kiln_error());
        if (ok)
            conv_cases(tables[t]);
        for (int d = 0; d < NDEV; d++)
            if (devs[d])
                kiln_device_close(devs[d]);
    }
}
