/*
 * tests/fusion/test-epilogue.c — matrix products and convolutions with their elementwise
 * consumers fused as an epilogue (a MATMUL or CONV heading the program), and row ops that take a fused value in their
 * reads (max and min beside sum and mean; layer norm beside softmax), and f16/bf16 groups.
 *
 * Random products (odd and round sizes, batch dims that broadcast, transposed operands,
 * a kept or a dead product) followed by random epilogue chains run on "fused:counting:cpu?min_elements=0",
 * "counting:cpu" and "ref": fused must equal unfused to the bit (the product is the matmul
 * entry's, a convolution's the conv entry's image by image; convolutions are checked
 * within 1e-5 of |value| + 1) and be near ref, and
 * the fused device must have run the product inside a fused program. Gradients through a
 * linear layer with a fused epilogue equal the unfused ones. A product copied into a
 * permuted layout (attention's head merging) is written there by the matmul itself.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fusion-test.h"
#include "kiln/autodiff.h"
#include "kiln/tensor.h"

#define NDEV 3
static kiln_device *devs[NDEV]; /* fused, unfused, ref */

/* The largest relative difference of a against b (NaN where they disagree on NaN), and
 * whether both could be read. */
static double worst_rel(kiln_tensor *a, kiln_tensor *b, double floor)
{
    if (!a || !b || kiln_tensor_numel(a) != kiln_tensor_numel(b))
        return INFINITY;
    int64_t n = kiln_tensor_numel(a);
    float *x = malloc((size_t)n * sizeof *x + 1), *y = malloc((size_t)n * sizeof *y + 1);
    double worst = 0;
    if (kiln_to_data(a, x, (size_t)n * sizeof *x) < 0 || kiln_to_data(b, y, (size_t)n * sizeof *y) < 0)
        worst = INFINITY;
    for (int64_t i = 0; i < n && worst < INFINITY; i++) {
        if (isnan(x[i]) || isnan(y[i])) {
            worst = isnan(x[i]) && isnan(y[i]) ? worst : INFINITY;
            continue;
        }
        double d = fabs((double)x[i] - (double)y[i]) / (fabs((double)y[i]) + floor);
        worst = d > worst ? d : worst;
    }
    free(x);
    free(y);
    return worst;
}

static kiln_tensor *upload(kiln_device *d, int ndim, const int64_t *shape, const float *host)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return kiln_from_data(d, KILN_F32, ndim, shape, host, (size_t)n * sizeof(float));
}

static kiln_tensor *act_of(kiln_tensor *t, int which)
{
    switch (which) {
    case 0: return kiln_relu(t);
    case 1: return kiln_gelu(t, false);
    case 2: return kiln_tanh(t);
    case 3: return kiln_sigmoid(kiln_mul_scalar(t, 0.5));
    default: return kiln_add_scalar(t, 0.125);
    }
}

/* One random product and epilogue: out = act(op(a) @ op(b) + bias) [* c] [+ residual]. */
static void random_product(int seed)
{
    uint64_t s = (uint64_t)seed * 104729 + 11;
    static const int64_t sizes[] = {1, 2, 3, 7, 16, 17, 33, 64, 100, 129, 256};
    int64_t M = sizes[test_pick(&s, 11)], N = sizes[1 + test_pick(&s, 10)], K = sizes[test_pick(&s, 11)];
    int nb = test_pick(&s, 3); /* batch dims: 0, [B] or [B1, B2] with b broadcast */
    int64_t B1 = 1 + test_pick(&s, 3), B2 = 1 + test_pick(&s, 2);
    bool ta = test_pick(&s, 3) == 0, tb = test_pick(&s, 2) == 0, keep = test_pick(&s, 2) == 0;
    bool bcast_b = nb > 0 && test_pick(&s, 2) == 0;
    int act = test_pick(&s, 5), extra = test_pick(&s, 3);
    int64_t ash[4], bsh[4], na = 0, nbd = 0;
    if (nb >= 1)
        ash[na++] = B1, bsh[nbd++] = bcast_b ? 1 : B1;
    if (nb == 2)
        ash[na++] = B2, bsh[nbd++] = B2;
    /* stored transposed when ta/tb: the matmul then sees a transposed view */
    ash[na++] = ta ? K : M;
    ash[na++] = ta ? M : K;
    bsh[nbd++] = tb ? N : K;
    bsh[nbd++] = tb ? K : N;
    int64_t an = 1, bn = 1, outn = M * N * (nb >= 1 ? B1 : 1) * (nb == 2 ? B2 : 1);
    for (int i = 0; i < na; i++)
        an *= ash[i];
    for (int i = 0; i < nbd; i++)
        bn *= bsh[i];
    float *host = malloc((size_t)(an + bn + N + outn) * sizeof(float));
    for (int64_t i = 0; i < an + bn + N + outn; i++)
        host[i] = (float)((double)test_rand(&s) / (double)(1ull << 31) * 2.0 - 1.0);
    kiln_tensor *res[NDEV], *prod[NDEV];
    uint64_t f0 = fusion_calls_of(devs[0], "fused"), m0 = fusion_calls_of(devs[0], "matmul");
    kiln_scope_begin();
    for (int d = 0; d < NDEV; d++) {
        kiln_tensor *a = upload(devs[d], (int)na, ash, host), *b = upload(devs[d], (int)nbd, bsh, host + an);
        if (ta)
            a = kiln_transpose(a, -2, -1);
        if (tb)
            b = kiln_transpose(b, -2, -1);
        kiln_tensor *bias = upload(devs[d], 1, (int64_t[]){N}, host + an + bn);
        int64_t osh[4], no = 0;
        if (nb >= 1)
            osh[no++] = B1;
        if (nb == 2)
            osh[no++] = B2;
        osh[no++] = M;
        osh[no++] = N;
        kiln_tensor *resid = upload(devs[d], (int)no, osh, host + an + bn + N);
        kiln_scope_begin();
        kiln_tensor *p = kiln_matmul(a, b);
        kiln_tensor *y = act_of(kiln_add(p, bias), act);
        if (extra == 1)
            y = kiln_add(y, resid);
        else if (extra == 2)
            y = kiln_mul(y, kiln_sub(p, resid));
        res[d] = kiln_keep(y);
        prod[d] = keep ? kiln_keep(p) : NULL;
        kiln_scope_end();
    }
    char what[160];
    snprintf(what, sizeof what, "product %d: [%s%lld%s] %lldx%lldx%lld%s%s act %d extra %d %s", seed,
             nb ? "batch " : "", (long long)nb, bcast_b ? " b broadcast" : "", (long long)M, (long long)N,
             (long long)K, ta ? " a^T" : "", tb ? " b^T" : "", act, extra, keep ? "kept" : "dead");
    double fu = worst_rel(res[0], res[1], 1.0), fr = worst_rel(res[0], res[2], 1.0);
    CHECK(fu == 0, "%s: fused vs unfused %.3g (%s)", what, fu, res[0] ? "" : kiln_error());
    CHECK(fr <= 1e-4, "%s: fused vs ref %.3g", what, fr);
    if (keep) {
        double pu = worst_rel(prod[0], prod[1], 1.0);
        CHECK(pu == 0, "%s: the kept product, fused vs unfused %.3g", what, pu);
    }
    CHECK(fusion_calls_of(devs[0], "fused") > f0 && fusion_calls_of(devs[0], "matmul") == m0,
          "%s: the product ran inside a fused program (%llu fused, %llu matmul calls)", what,
          (unsigned long long)(fusion_calls_of(devs[0], "fused") - f0),
          (unsigned long long)(fusion_calls_of(devs[0], "matmul") - m0));
    for (int d = 0; d < NDEV; d++) {
        kiln_tensor_release(res[d]);
        if (prod[d])
            kiln_tensor_release(prod[d]);
    }
    kiln_scope_end();
    free(host);
}

/* softmax(q kᵀ · scale) and a row max of a product: the product, the scale and the
 * row-wise op in one program. */
static void product_rows(void)
{
    kiln_tensor *sm[NDEV], *mx[NDEV], *mn[NDEV];
    uint64_t f0 = 0, m0 = 0, s0 = 0, r0 = 0;
    for (int d = 0; d < NDEV; d++) {
        kiln_generator g = kiln_generator_make(21);
        kiln_tensor *q = kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(6, 40, 16), -1, 1, &g);
        kiln_tensor *k = kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(6, 40, 16), -1, 1, &g);
        kiln_device_sync(devs[d]);
        if (d == 0)
            f0 = fusion_calls_of(devs[0], "fused"), m0 = fusion_calls_of(devs[0], "matmul"),
            s0 = fusion_calls_of(devs[0], "softmax"), r0 = fusion_calls_of(devs[0], "reduce");
        kiln_scope_begin();
        sm[d] = kiln_keep(kiln_softmax(kiln_mul_scalar(kiln_matmul(q, kiln_transpose(k, -2, -1)), 0.25), -1));
        mx[d] = kiln_keep(
            kiln_max(kiln_add_scalar(kiln_matmul(q, kiln_transpose(k, -2, -1)), 1.0), KILN_DIMS(-1), false));
        mn[d] = kiln_keep(kiln_min(kiln_tanh(kiln_matmul(q, kiln_transpose(k, -2, -1))), KILN_DIMS(-1), true));
        kiln_scope_end();
    }
    double a = worst_rel(sm[0], sm[1], 1.0), b = worst_rel(mx[0], mx[1], 1.0), c = worst_rel(mn[0], mn[1], 1.0);
    CHECK(a <= 1e-5 && worst_rel(sm[0], sm[2], 1.0) <= 1e-4, "softmax(q k^T / 4): fused vs unfused %.3g", a);
    CHECK(b <= 1e-5 && worst_rel(mx[0], mx[2], 1.0) <= 1e-4, "max(q k^T + 1, -1): fused vs unfused %.3g", b);
    CHECK(c <= 1e-5 && worst_rel(mn[0], mn[2], 1.0) <= 1e-4, "min(tanh(q k^T), -1): fused vs unfused %.3g", c);
    CHECK(fusion_calls_of(devs[0], "fused") - f0 == 3 && fusion_calls_of(devs[0], "matmul") == m0 &&
              fusion_calls_of(devs[0], "softmax") == s0 && fusion_calls_of(devs[0], "reduce") == r0,
          "each of the three ran as one fused program (%llu fused, %llu matmul, %llu softmax, %llu reduce)",
          (unsigned long long)(fusion_calls_of(devs[0], "fused") - f0),
          (unsigned long long)(fusion_calls_of(devs[0], "matmul") - m0),
          (unsigned long long)(fusion_calls_of(devs[0], "softmax") - s0),
          (unsigned long long)(fusion_calls_of(devs[0], "reduce") - r0));
    for (int d = 0; d < NDEV; d++) {
        kiln_tensor_release(sm[d]);
        kiln_tensor_release(mx[d]);
        kiln_tensor_release(mn[d]);
    }
    /* the same over a plain 2-d product of an odd row count, its rows split over jobs */
    kiln_tensor *s2[NDEV], *m2[NDEV];
    for (int d = 0; d < NDEV; d++) {
        kiln_generator g = kiln_generator_make(22);
        kiln_tensor *x = kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(301, 48), -1, 1, &g);
        kiln_tensor *w = kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(48, 196), -1, 1, &g);
        kiln_scope_begin();
        s2[d] = kiln_keep(kiln_softmax(kiln_mul_scalar(kiln_matmul(x, w), 0.5), -1));
        m2[d] = kiln_keep(kiln_max(kiln_matmul(x, w), KILN_DIMS(-1), false));
        kiln_scope_end();
    }
    CHECK(worst_rel(s2[0], s2[1], 1.0) == 0 && worst_rel(s2[0], s2[2], 1.0) <= 1e-4,
          "softmax(x w / 2) over 301 rows of 196: fused equals unfused");
    CHECK(worst_rel(m2[0], m2[1], 1.0) == 0 && worst_rel(m2[0], m2[2], 1.0) <= 1e-4,
          "max(x w, -1) over 301 rows of 196: fused equals unfused");
    for (int d = 0; d < NDEV; d++) {
        kiln_tensor_release(s2[d]);
        kiln_tensor_release(m2[d]);
    }
    /* max with a NaN in a row: the row's result is NaN, the others are not */
    kiln_tensor *nm[2];
    for (int d = 0; d < 2; d++) {
        float v[4 * 5];
        for (int i = 0; i < 20; i++)
            v[i] = (float)i - 7.5f;
        v[7] = NAN;
        kiln_tensor *x = kiln_from_data(devs[d], KILN_F32, KILN_SHAPE(4, 5), v, sizeof v);
        kiln_scope_begin();
        nm[d] = kiln_keep(kiln_max(kiln_mul_scalar(kiln_add_scalar(x, 1.0), 2.0), KILN_DIMS(-1), false));
        kiln_scope_end();
    }
    float got[2][4];
    CHECK(kiln_to_data(nm[0], got[0], sizeof got[0]) == 0 && kiln_to_data(nm[1], got[1], sizeof got[1]) == 0,
          "max with a NaN: read: %s", kiln_error());
    CHECK(isnan(got[0][1]) && isnan(got[1][1]) && got[0][0] == got[1][0] && got[0][2] == got[1][2] &&
              got[0][3] == got[1][3] && got[0][0] == 2.0f * (4 - 7.5f + 1),
          "a fused row max propagates NaN as unfused (%g %g %g %g)", got[0][0], got[0][1], got[0][2], got[0][3]);
    kiln_tensor_release(nm[0]);
    kiln_tensor_release(nm[1]);
}

/* layer_norm(x + r) [* w + b] then an op on its result: the add, the norm and the op in
 * one program; rows of several lengths, with and without weight and bias. */
static void layer_norms(void)
{
    static const int64_t inners[] = {7, 64, 768, 1000};
    for (int t = 0; t < 8; t++) {
        int64_t inner = inners[t % 4], rows = 3 + 17 * (t % 3);
        bool affine = t < 4;
        kiln_tensor *out[NDEV];
        uint64_t f0 = 0, l0 = 0;
        for (int d = 0; d < NDEV; d++) {
            kiln_generator g = kiln_generator_make(40 + (uint64_t)t);
            kiln_tensor *x = kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(rows, inner), -2, 2, &g);
            kiln_tensor *r = kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(rows, inner), -2, 2, &g);
            kiln_tensor *w = kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(inner), 0.5, 1.5, &g);
            kiln_tensor *b = kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(inner), -1, 1, &g);
            kiln_device_sync(devs[d]);
            if (d == 0)
                f0 = fusion_calls_of(devs[0], "fused"), l0 = fusion_calls_of(devs[0], "layer_norm");
            kiln_scope_begin();
            kiln_tensor *h = kiln_layer_norm(kiln_add(x, r), 1, affine ? w : NULL, affine ? b : NULL, 1e-5);
            out[d] = kiln_keep(kiln_mul(kiln_relu(h), x));
            kiln_scope_end();
        }
        char what[96];
        snprintf(what, sizeof what, "relu(layer_norm(x + r)%s) * x, [%lld, %lld]", affine ? " * w + b" : "",
                 (long long)rows, (long long)inner);
        double u = worst_rel(out[0], out[1], 1.0), f = worst_rel(out[0], out[2], 1.0);
        CHECK(u == 0 && f <= 1e-4, "%s: fused vs unfused %.3g (the same bits), vs ref %.3g", what, u, f);
        CHECK(fusion_calls_of(devs[0], "layer_norm") == l0 && fusion_calls_of(devs[0], "fused") - f0 == 1,
              "%s ran as one fused program (%llu fused, %llu layer_norm calls)", what,
              (unsigned long long)(fusion_calls_of(devs[0], "fused") - f0),
              (unsigned long long)(fusion_calls_of(devs[0], "layer_norm") - l0));
        for (int d = 0; d < NDEV; d++)
            kiln_tensor_release(out[d]);
    }
    /* gradients through a fused layer norm equal the unfused ones */
    kiln_tensor *gx[2], *gw[2];
    for (int d = 0; d < 2; d++) {
        kiln_generator g = kiln_generator_make(50);
        kiln_tensor *x = kiln_requires_grad(kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(9, 96), -2, 2, &g),
                                            true);
        kiln_tensor *r = kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(9, 96), -2, 2, &g);
        kiln_tensor *w = kiln_requires_grad(kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(96), 0.5, 1.5, &g),
                                            true);
        kiln_scope_begin();
        kiln_tensor *h = kiln_layer_norm(kiln_add(x, r), 1, w, NULL, 1e-5);
        kiln_tensor *loss = kiln_sum(kiln_mul(h, kiln_tanh(h)), KILN_ALL_DIMS, false);
        CHECK(loss && kiln_backward(loss, NULL) == 0, "layer norm backward: %s", kiln_error());
        kiln_scope_end();
        gx[d] = kiln_grad(x);
        gw[d] = kiln_grad(w);
    }
    double a = worst_rel(gx[0], gx[1], 1.0), b = worst_rel(gw[0], gw[1], 1.0);
    CHECK(a <= 1e-6 && b <= 1e-6, "layer_norm(x + r) gradients fused vs unfused: x %.3g w %.3g", a, b);
}

/* Random elementwise chains in f16 and bf16: the group runs in f32 registers rounded to
 * the dtype after each op, so fused must equal unfused to the bit. */
static void half_groups(void)
{
    static const kiln_dtype dts[2] = {KILN_F16, KILN_BF16};
    for (int t = 0; t < 16; t++) {
        kiln_dtype dt = dts[t % 2];
        uint64_t s = 900 + (uint64_t)t;
        int64_t R = 1 + test_pick(&s, 40), C = 1 + test_pick(&s, t % 4 == 0 ? 3000 : 70);
        kiln_tensor *out[NDEV];
        uint64_t f0 = 0;
        for (int d = 0; d < NDEV; d++) {
            kiln_generator g = kiln_generator_make(60 + (uint64_t)t);
            kiln_scope_begin();
            kiln_tensor *x = kiln_cast(kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(R, C), -2, 2, &g), dt);
            kiln_tensor *a = kiln_cast(kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(C), -2, 2, &g), dt);
            kiln_tensor *c = kiln_cast(kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(R, 1), -2, 2, &g), dt);
            kiln_device_sync(devs[d]);
            if (d == 0)
                f0 = fusion_calls_of(devs[0], "fused");
            uint64_t ops = s;
            kiln_tensor *v = x;
            for (int k = 0; k < 6; k++) {
                switch (test_pick(&ops, 7)) {
                case 0: v = kiln_add(v, a); break;
                case 1: v = kiln_mul(v, c); break;
                case 2: v = kiln_gelu(v, false); break;
                case 3: v = kiln_tanh(kiln_mul_scalar(v, 0.75)); break;
                case 4: v = kiln_where(kiln_gt(v, a), v, kiln_neg(x)); break;
                case 5: v = kiln_sub(kiln_maximum(v, x), c); break;
                default: v = kiln_add_scalar(kiln_sigmoid(v), -0.3); break;
                }
            }
            out[d] = kiln_keep(kiln_cast(v, KILN_F32));
            kiln_scope_end();
        }
        char what[96];
        snprintf(what, sizeof what, "%s chain %d [%lld, %lld]", dt == KILN_F16 ? "f16" : "bf16", t, (long long)R,
                 (long long)C);
        double u = worst_rel(out[0], out[1], 1.0), r = worst_rel(out[0], out[2], 1.0);
        CHECK(u == 0, "%s: fused vs unfused %.3g (the same bits)", what, u);
        CHECK(r <= (dt == KILN_F16 ? 2e-2 : 1e-1), "%s: fused vs ref %.3g", what, r);
        CHECK(fusion_calls_of(devs[0], "fused") > f0, "%s ran fused", what);
        for (int d = 0; d < NDEV; d++)
            kiln_tensor_release(out[d]);
    }
}

/* Random convolutions (1-d and 2-d, strides, padding, dilation, groups, with and without
 * a bias, kept or dead) with an epilogue, and one large enough to be timed. */
static void random_convs(void)
{
    for (int t = 0; t < 24; t++) {
        uint64_t s = 7000 + (uint64_t)t;
        bool two = t % 3 != 0, keep = test_pick(&s, 2) == 0, has_bias = test_pick(&s, 3) != 0;
        int64_t g = 1 + test_pick(&s, 2), N = 1 + test_pick(&s, 9), C = g * (1 + test_pick(&s, 4)),
                O = g * (1 + test_pick(&s, 5)), H = 5 + test_pick(&s, 12), W = 5 + test_pick(&s, 12),
                K = 1 + test_pick(&s, 3);
        kiln_conv_opts o = {.groups = g};
        o.stride[0] = o.stride[1] = 1 + test_pick(&s, 2);
        o.padding[0] = o.padding[1] = test_pick(&s, 2);
        o.dilation[0] = o.dilation[1] = 1 + test_pick(&s, 2);
        int act = test_pick(&s, 5);
        kiln_tensor *out[NDEV], *prod[NDEV];
        uint64_t f0 = 0, c0 = 0;
        for (int d = 0; d < NDEV; d++) {
            kiln_generator gen = kiln_generator_make(300 + (uint64_t)t);
            kiln_tensor *x = two ? kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(N, C, H, W), -1, 1, &gen)
                                 : kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(N, C, W), -1, 1, &gen);
            kiln_tensor *w = two ? kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(O, C / g, K, K), -1, 1, &gen)
                                 : kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(O, C / g, K), -1, 1, &gen);
            kiln_tensor *b = kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(O), -1, 1, &gen);
            kiln_device_sync(devs[d]);
            if (d == 0)
                f0 = fusion_calls_of(devs[0], "fused"), c0 = fusion_calls_of(devs[0], "conv");
            kiln_scope_begin();
            kiln_tensor *y = two ? kiln_conv2d(x, w, has_bias ? b : NULL, &o)
                                 : kiln_conv1d(x, w, has_bias ? b : NULL, &o);
            kiln_tensor *e = act_of(y, act);
            out[d] = kiln_keep(kiln_add(e, kiln_mul_scalar(y, 0.5)));
            prod[d] = keep ? kiln_keep(y) : NULL;
            kiln_scope_end();
        }
        char what[160];
        snprintf(what, sizeof what, "conv %d: %s N%lld C%lld O%lld g%lld K%lld s%lld p%lld d%lld%s act %d %s", t,
                 two ? "2-d" : "1-d", (long long)N, (long long)C, (long long)O, (long long)g, (long long)K,
                 (long long)o.stride[0], (long long)o.padding[0], (long long)o.dilation[0],
                 has_bias ? " bias" : "", act, keep ? "kept" : "dead");
        double u = worst_rel(out[0], out[1], 1.0), r = worst_rel(out[0], out[2], 1.0);
        CHECK(u <= 1e-5, "%s: fused vs unfused %.3g (%s)", what, u, out[0] ? "" : kiln_error());
        CHECK(r <= 1e-4, "%s: fused vs ref %.3g", what, r);
        if (keep)
            CHECK(worst_rel(prod[0], prod[1], 1.0) <= 1e-5, "%s: the kept convolution equals unfused", what);
        CHECK(fusion_calls_of(devs[0], "fused") > f0 && fusion_calls_of(devs[0], "conv") == c0,
              "%s: the convolution ran inside a fused program", what);
        for (int d = 0; d < NDEV; d++) {
            kiln_tensor_release(out[d]);
            if (prod[d])
                kiln_tensor_release(prod[d]);
        }
    }
    /* a convolution large enough for its chunk size to be tried on whole calls: an untimed
     * first call, then one call per candidate (the whole batch, 16, 4 and 1 images), each
     * checked against unfused */
    kiln_tensor *xs[2], *ws[2], *bs[2];
    for (int d = 0; d < 2; d++) {
        kiln_generator gen = kiln_generator_make(77);
        xs[d] = kiln_keep(kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(18, 16, 32, 32), -1, 1, &gen));
        ws[d] = kiln_keep(kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(32, 16, 3, 3), -1, 1, &gen));
        bs[d] = kiln_keep(kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(32), -1, 1, &gen));
    }
    for (int call = 0; call < 5; call++) {
        kiln_tensor *big[2];
        for (int d = 0; d < 2; d++) {
            kiln_conv_opts o = {.padding = {1, 1}};
            kiln_scope_begin();
            big[d] = kiln_keep(kiln_relu(kiln_add_scalar(kiln_conv2d(xs[d], ws[d], bs[d], &o), 0.25 * call)));
            kiln_scope_end();
        }
        CHECK(worst_rel(big[0], big[1], 1.0) <= 1e-5,
              "relu(conv2d(x, w, b) + c), 18 images, call %d of the chunk trials: fused vs unfused", call);
        kiln_tensor_release(big[0]);
        kiln_tensor_release(big[1]);
    }
    for (int d = 0; d < 2; d++) {
        kiln_tensor_release(xs[d]);
        kiln_tensor_release(ws[d]);
        kiln_tensor_release(bs[d]);
    }
}

/* A product large enough to be spread over the threads, kept and dead, five calls each
 * against the unfused device (the same bits: the product is the matmul entry's). */
static void tuned_product(void)
{
    for (int keep = 0; keep < 2; keep++) {
        kiln_tensor *x[2], *w[2], *b[2];
        for (int d = 0; d < 2; d++) {
            kiln_generator g = kiln_generator_make(77);
            x[d] = kiln_keep(kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(640, 384), -1, 1, &g));
            w[d] = kiln_keep(kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(384, 320), -1, 1, &g));
            b[d] = kiln_keep(kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(320), -1, 1, &g));
        }
        for (int call = 0; call < 5; call++) {
            kiln_tensor *out[2], *prod[2] = {NULL, NULL};
            for (int d = 0; d < 2; d++) {
                kiln_scope_begin();
                kiln_tensor *p = kiln_matmul(x[d], w[d]);
                out[d] = kiln_keep(kiln_mul(kiln_gelu(kiln_add(p, b[d]), false), b[d]));
                if (keep)
                    prod[d] = kiln_keep(p);
                kiln_scope_end();
            }
            double a = worst_rel(out[0], out[1], 1.0);
            CHECK(a == 0, "gelu(x @ w + b) * b, 640x320x384, product %s, call %d: fused vs unfused %.3g",
                  keep ? "kept" : "dead", call, a);
            if (keep)
                CHECK(worst_rel(prod[0], prod[1], 1.0) == 0,
                      "the kept 640x320x384 product, call %d, equals unfused", call);
            for (int d = 0; d < 2; d++) {
                kiln_tensor_release(out[d]);
                if (prod[d])
                    kiln_tensor_release(prod[d]);
            }
        }
        for (int d = 0; d < 2; d++) {
            kiln_tensor_release(x[d]);
            kiln_tensor_release(w[d]);
            kiln_tensor_release(b[d]);
        }
    }
}

/* Gradients of a linear layer with a fused epilogue, forward and backward, against the
 * unfused device. */
/* Batched products whose batches fit the caches run batch by batch, each batch's
 * epilogue right after its product (cpu-fused-product.c, batched_product): the same bits
 * as the unfused product and ops. Two sizes: per-head products too small to split (one
 * BLAS call each) and ones the cpu splits into row blocks when it has several threads;
 * a softmax over the product (dead), and an epilogue over a product that is kept. */
static void batched_products(void)
{
    static const int64_t shapes[2][4] = {{6, 40, 16, 40}, {3, 128, 64, 128}}; /* B, M, K, N */
    for (int t = 0; t < 2; t++) {
        const int64_t *sh = shapes[t];
        kiln_tensor *sm[NDEV], *kept[NDEV], *ep[NDEV];
        uint64_t m0 = 0, f0 = 0;
        for (int d = 0; d < NDEV; d++) {
            kiln_generator g = kiln_generator_make(31 + (uint64_t)t);
            kiln_tensor *q = kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(sh[0], sh[1], sh[2]), -1, 1, &g);
            kiln_tensor *k = kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(sh[0], sh[3], sh[2]), -1, 1, &g);
            kiln_device_sync(devs[d]);
            if (d == 0)
                m0 = fusion_calls_of(devs[0], "matmul"), f0 = fusion_calls_of(devs[0], "fused");
            kiln_scope_begin();
            sm[d] = kiln_keep(kiln_softmax(kiln_mul_scalar(kiln_matmul(q, kiln_transpose(k, -2, -1)), 0.125), -1));
            kept[d] = kiln_keep(kiln_matmul(q, kiln_transpose(k, -2, -1)));
            ep[d] = kiln_keep(kiln_add_scalar(kiln_relu(kept[d]), 1.0));
            kiln_scope_end();
            kiln_device_sync(devs[d]);
        }
        double a = worst_rel(sm[0], sm[1], 1.0), b = worst_rel(kept[0], kept[1], 1.0),
               c = worst_rel(ep[0], ep[1], 1.0);
        CHECK(a == 0 && b == 0 && c == 0 && worst_rel(sm[0], sm[2], 1.0) <= 1e-4 &&
                  worst_rel(ep[0], ep[2], 1.0) <= 1e-4,
              "[%lld, %lld, %lld] products by batches: fused vs unfused %.3g, %.3g, %.3g (the same bits)",
              (long long)sh[0], (long long)sh[1], (long long)sh[3], a, b, c);
        CHECK(fusion_calls_of(devs[0], "matmul") == m0 && fusion_calls_of(devs[0], "fused") - f0 == 2,
              "[%lld, %lld, %lld]: two fused programs and no matmul call (%llu, %llu)", (long long)sh[0],
              (long long)sh[1], (long long)sh[3], (unsigned long long)(fusion_calls_of(devs[0], "fused") - f0),
              (unsigned long long)(fusion_calls_of(devs[0], "matmul") - m0));
        for (int d = 0; d < NDEV; d++) {
            kiln_tensor_release(sm[d]);
            kiln_tensor_release(kept[d]);
            kiln_tensor_release(ep[d]);
        }
    }
}

/* Attention's head merging: ctx = w @ v per head ([N, H, L, D]), then
 * reshape(transpose(ctx, 1, 2)) into [N, L, H·D], a copy through a permutation. When ctx
 * dies with its scope the fused device writes the product straight into the merged layout:
 * one matmul call and no copy. Kept, or permuted so that its rows break (the last two dims
 * swapped), the copy runs as recorded. Each the same bits as unfused. */
static void permuted_products(void)
{
    static const int64_t shapes[2][4] = {{2, 3, 5, 8}, {4, 4, 32, 16}}; /* N, H, L, D */
    for (int t = 0; t < 2; t++) {
        const int64_t *sh = shapes[t];
        int64_t N = sh[0], H = sh[1], L = sh[2], D = sh[3];
        kiln_tensor *merged[NDEV], *kept[NDEV], *merged2[NDEV], *swapped[NDEV];
        uint64_t m[3] = {0}, c[3] = {0};
        for (int d = 0; d < NDEV; d++) {
            kiln_generator g = kiln_generator_make(41 + (uint64_t)t);
            kiln_tensor *w = kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(N, H, L, L), -1, 1, &g);
            /* v as split_heads makes it: [N, L, H·D] seen as [N, H, L, D] */
            kiln_tensor *vp = kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(N, L, H * D), -1, 1, &g);
            kiln_tensor *v = kiln_transpose(kiln_reshape(vp, KILN_SHAPE(N, L, H, D)), 1, 2);
            kiln_device_sync(devs[d]);
            if (d == 0)
                m[0] = fusion_calls_of(devs[0], "matmul"), c[0] = fusion_calls_of(devs[0], "copy");
            kiln_scope_begin();
            kiln_tensor *ctx = kiln_matmul(w, v);
            merged[d] = kiln_keep(kiln_reshape(kiln_transpose(ctx, 1, 2), KILN_SHAPE(N, L, H * D)));
            kiln_scope_end();
            kiln_device_sync(devs[d]);
            if (d == 0)
                m[1] = fusion_calls_of(devs[0], "matmul"), c[1] = fusion_calls_of(devs[0], "copy");
            kiln_scope_begin();
            kept[d] = kiln_keep(kiln_matmul(w, v));
            merged2[d] = kiln_keep(kiln_reshape(kiln_transpose(kept[d], 1, 2), KILN_SHAPE(N, L, H * D)));
            swapped[d] = kiln_keep(
                kiln_contiguous(kiln_transpose(kiln_matmul(v, kiln_transpose(v, -2, -1)), 2, 3)));
            kiln_scope_end();
            kiln_device_sync(devs[d]);
            if (d == 0)
                m[2] = fusion_calls_of(devs[0], "matmul"), c[2] = fusion_calls_of(devs[0], "copy");
        }
        double a = worst_rel(merged[0], merged[1], 1.0), b = worst_rel(merged2[0], merged2[1], 1.0),
               k = worst_rel(kept[0], kept[1], 1.0), s2 = worst_rel(swapped[0], swapped[1], 1.0);
        CHECK(a == 0 && b == 0 && k == 0 && s2 == 0 && worst_rel(merged[0], merged[2], 1.0) <= 1e-4 &&
                  worst_rel(swapped[0], swapped[2], 1.0) <= 1e-4,
              "[%lld, %lld, %lld, %lld] heads merged: fused vs unfused %.3g, kept %.3g %.3g, rows swapped %.3g",
              (long long)N, (long long)H, (long long)L, (long long)D, a, k, b, s2);
        CHECK(m[1] - m[0] == 1 && c[1] - c[0] == 0,
              "[%lld, %lld, %lld, %lld] a dead product merged: one matmul call (%llu) and no copy (%llu)",
              (long long)N, (long long)H, (long long)L, (long long)D, (unsigned long long)(m[1] - m[0]),
              (unsigned long long)(c[1] - c[0]));
        CHECK(
            m[2] - m[1] == 2 && c[2] - c[1] == 2,
            "[%lld, %lld, %lld, %lld] a kept product and a swapped one: two matmuls (%llu) and two copies (%llu)",
            (long long)N, (long long)H, (long long)L, (long long)D, (unsigned long long)(m[2] - m[1]),
            (unsigned long long)(c[2] - c[1]));
        for (int d = 0; d < NDEV; d++) {
            kiln_tensor_release(merged[d]);
            kiln_tensor_release(kept[d]);
            kiln_tensor_release(merged2[d]);
            kiln_tensor_release(swapped[d]);
        }
    }
}

static void linear_gradients(void)
{
    kiln_tensor *gw[2], *gb[2], *gx[2];
    for (int d = 0; d < 2; d++) {
        kiln_generator g = kiln_generator_make(31);
        kiln_tensor *x = kiln_requires_grad(kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(4, 37, 48), -1, 1, &g),
                                            true);
        kiln_tensor *w = kiln_requires_grad(kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(65, 48), -1, 1, &g),
                                            true);
        kiln_tensor *b = kiln_requires_grad(kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(65), -1, 1, &g), true);
        kiln_scope_begin();
        kiln_tensor *y = kiln_gelu(kiln_linear(x, w, b), false);
        kiln_tensor *loss = kiln_mean(kiln_mul(y, kiln_tanh(y)), KILN_ALL_DIMS, false);
        CHECK(loss && kiln_backward(loss, NULL) == 0, "linear backward: %s", kiln_error());
        kiln_scope_end();
        gw[d] = kiln_grad(w);
        gb[d] = kiln_grad(b);
        gx[d] = kiln_grad(x);
    }
    double a = worst_rel(gw[0], gw[1], 1.0), b = worst_rel(gb[0], gb[1], 1.0), c = worst_rel(gx[0], gx[1], 1.0);
    CHECK(a <= 1e-5 && b <= 1e-5 && c <= 1e-5, "gelu(linear) gradients fused vs unfused: w %.3g b %.3g x %.3g", a,
          b, c);
}

void test_epilogue(void)
{
    const char *specs[NDEV] = {"fused:counting:cpu?min_elements=0", "counting:cpu", "ref"};
    for (int d = 0; d < NDEV; d++) {
        devs[d] = kiln_device_open(specs[d]);
        CHECK(devs[d] != NULL, "open %s: %s", specs[d], kiln_error());
        if (!devs[d])
            return;
    }
    kiln_scope_begin();
    for (int seed = 0; seed < 60; seed++)
        random_product(seed);
    product_rows();
    batched_products();
    permuted_products();
    tuned_product();
    layer_norms();
    half_groups();
    random_convs();
    linear_gradients();
    kiln_scope_end();
    for (int d = 0; d < NDEV; d++)
        kiln_device_close(devs[d]);
}
