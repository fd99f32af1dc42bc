/*
 * tests/engine/test-fused.c — the fused producers of engine/ops-fused.c on the cpu device:
 * kiln__conv_fused (with and without a kiln__conv_pack weight), kiln__epilogue and the
 * fallbacks they take for anything the one-pass path does not serve (the epilogue after a
 * matmul: test-fused-epilogue.c; the shared helpers: test-fused.h).
 *
 * The fused ops promise the unfused ops' arithmetic, so every result is held against two
 * things: the composed public ops on the ref device (an independent implementation, within
 * a tolerance that grows with the reduction), and the composed public ops on cpu, which
 * share the kernels and so must agree to the bit wherever the fused call takes the same
 * convolution path (the packed tile sums in the direct tile's order, so there too).
 */
#include "test-fused.h"

kiln_device *cpu_dev, *group_ref_dev;

static int group_setup(void **state)
{
    /* the packed tile on every layer it can serve, not only where the cpu backend's cost
     * model would pick it: these tests are about its results */
    setenv("KILN_CPU_CONV", "packed", 1);
    if (test_group_setup(state))
        return -1;
    group_ref_dev = test_dev;
    cpu_dev = kiln_device_open("cpu");
    if (!cpu_dev)
        fprintf(stderr, "cannot open cpu: %s\n", kiln_error());
    return cpu_dev ? 0 : -1;
}

static int group_teardown(void **state)
{
    kiln_device_close(cpu_dev);
    cpu_dev = NULL;
    return test_group_teardown(state);
}

/* ------------------------------------------------------------------ convolutions */

typedef struct conv_case {
    const char *name;
    int64_t N, C, H, W, O, K, stride, pad, dil, groups;
} conv_case;

static const conv_case convs[] = {
    /* the output maps of a network's last stages, the packed path's target */
    {"1x1 16->32 7x7", 1, 16, 7, 7, 32, 1, 1, 0, 1, 1},
    {"3x3 p1 70->45 14x14 b3", 3, 70, 14, 14, 45, 3, 1, 1, 1, 1},
    {"3x3 s2 p1 16->64 14x14->7x7", 1, 16, 14, 14, 64, 3, 2, 1, 1, 1},
    {"5x5 p2 3->8 13x11 b3", 3, 3, 13, 11, 8, 5, 1, 2, 1, 1},
    {"3x3 d2 p2 16->45 13x11", 1, 16, 13, 11, 45, 3, 1, 2, 2, 1},
    {"3x3 s2 p1 3->45 26x22->13x11", 1, 3, 26, 22, 45, 3, 2, 1, 1, 1},
    {"1x1 s2 16->32 14x14->7x7 b3", 3, 16, 14, 14, 32, 1, 2, 0, 1, 1},
    {"1x1 16->64 14x14", 1, 16, 14, 14, 64, 1, 1, 0, 1, 1},
    {"3x3 p1 70->64 7x7 b3", 3, 70, 7, 7, 64, 3, 1, 1, 1, 1},
    {"3x3 1->45 16x16->14x14", 1, 1, 16, 16, 45, 3, 1, 0, 1, 1},
    {"5x5 s2 p2 16->32 14x14->7x7", 1, 16, 14, 14, 32, 5, 2, 2, 1, 1},
    /* 1x1 maps: squeeze-excitation and classifier convolutions */
    {"1x1 70->64 1x1 b3", 3, 70, 1, 1, 64, 1, 1, 0, 1, 1},
    {"3x3 16->45 3x3->1x1", 1, 16, 3, 3, 45, 3, 1, 0, 1, 1},
    {"1x1 p1 3->8 1x1->3x3", 1, 3, 1, 1, 8, 1, 1, 1, 1, 1},
    /* above the packed path's 1024 positions: the direct path serves them */
    {"3x3 p1 3->32 40x40", 1, 3, 40, 40, 32, 3, 1, 1, 1, 1},
    {"5x5 s2 p1 1->8 81x81->40x40", 1, 1, 81, 81, 8, 5, 2, 1, 1, 1},
    {"1x1 16->45 40x40 b3", 3, 16, 40, 40, 45, 1, 1, 0, 1, 1},
    /* depthwise and grouped */
    {"dw 3x3 p1 32 14x14 b3", 3, 32, 14, 14, 32, 3, 1, 1, 1, 32},
    {"dw 5x5 s2 p2 16->32 14x14->7x7", 1, 16, 14, 14, 32, 5, 2, 2, 1, 16},
    {"dw 3x3 d2 p2 8 13x11", 1, 8, 13, 11, 8, 3, 1, 2, 2, 8},
    /* rows wider than one vector, ragged row blocks, a multiplier, an even stride-2 map */
    {"dw 5x5 p2 24 37x35 b2", 2, 24, 37, 35, 24, 5, 1, 2, 1, 24},
    {"dw 7x7 p3 8->16 9x40", 1, 8, 9, 40, 16, 7, 1, 3, 1, 8},
    {"dw 3x3 s2 p1 16 34x33", 1, 16, 34, 33, 16, 3, 2, 1, 1, 16},
    /* the channel-lane kernel: a partial last block of channels, rows of 3, 9, 14 and 60
     * outputs (each width of its position groups), strides 2 and 3, dilation with
     * stride, padding wider than the kernel, and a map tall enough to be cut in bands */
    {"dw 3x3 p1 20 9x9 b2", 2, 20, 9, 9, 20, 3, 1, 1, 1, 20},
    {"dw 3x3 p1 8 6x3", 1, 8, 6, 3, 8, 3, 1, 1, 1, 8},
    {"dw 5x5 s2 p2 40 28x28", 1, 40, 28, 28, 40, 5, 2, 2, 1, 40},
    {"dw 3x3 s3 p1 24 23x19", 1, 24, 23, 19, 24, 3, 3, 1, 1, 24},
    {"dw 3x3 s2 d2 p2 16 21x17", 1, 16, 21, 17, 16, 3, 2, 2, 2, 16},
    {"dw 3x3 p4 8 5x5", 1, 8, 5, 5, 8, 3, 1, 4, 1, 8},
    {"dw 3x3 p1 16 100x60", 1, 16, 100, 60, 16, 3, 1, 1, 1, 16},
    {"g4 3x3 p1 16->32 7x7", 1, 16, 7, 7, 32, 3, 1, 1, 1, 4},
    {"g2 1x1 70->8 13x11 b3", 3, 70, 13, 11, 8, 1, 1, 0, 1, 2},
};
#define NCONVS ((int)(sizeof convs / sizeof convs[0]))

static int64_t out_dim(int64_t in, const conv_case *c)
{
    return (in + 2 * c->pad - c->dil * (c->K - 1) - 1) / c->stride + 1;
}

static kiln_conv_opts opts_of(const conv_case *c)
{
    kiln_conv_opts o = {0};
    for (int i = 0; i < 2; i++) {
        o.stride[i] = c->stride;
        o.padding[i] = c->pad;
        o.dilation[i] = c->dil;
    }
    o.groups = c->groups;
    return o;
}

/* Whether plain kiln_conv2d on cpu takes the direct tile path (backends/cpu/cpu-conv.c,
 * dconv_ok), the one the packed tile matches bit for bit. A 1x1 kernel over fewer
 * positions than one 48-wide tile goes to the GEMM lowering instead. */
static bool unfused_is_tiled(const conv_case *c, int64_t osz)
{
    return c->groups == 1 && !(c->K == 1 && osz < 48);
}

typedef struct conv_data {
    int64_t xshape[4], wshape[4], oshape[4], bshape[1];
    int64_t xn, wn, on, k;
    float *x, *w, *b, *r;
} conv_data;

static void conv_data_make(conv_data *d, const conv_case *c, bool specials)
{
    int64_t OH = out_dim(c->H, c), OW = out_dim(c->W, c);
    int64_t xs[4] = {c->N, c->C, c->H, c->W}, ws[4] = {c->O, c->C / c->groups, c->K, c->K};
    int64_t os[4] = {c->N, c->O, OH, OW};
    memcpy(d->xshape, xs, sizeof xs);
    memcpy(d->wshape, ws, sizeof ws);
    memcpy(d->oshape, os, sizeof os);
    d->bshape[0] = c->O;
    d->xn = c->N * c->C * c->H * c->W;
    d->wn = ws[0] * ws[1] * ws[2] * ws[3];
    d->on = c->N * c->O * OH * OW;
    d->k = ws[1] * ws[2] * ws[3];
    d->x = host_rand(d->xn, 1.0f);
    /* outputs of about unit size, so every activation's bends are crossed */
    d->w = host_rand(d->wn, (float)(1.7 / sqrt((double)d->k)));
    d->b = host_rand(c->O, 0.5f);
    d->r = host_rand(d->on, 1.0f);
    if (specials) {
        /* spread over the batch and channels, some in the padding-adjacent border */
        d->x[0] = NAN;
        d->x[d->xn / 3] = INFINITY;
        d->x[d->xn / 2 + 1] = -INFINITY;
        d->x[d->xn - 1] = INFINITY;
        d->r[1] = NAN;
        d->r[d->on / 4] = INFINITY;
        d->r[d->on / 2] = -INFINITY;
        d->r[d->on - 2] = NAN;
    }
}

static void conv_data_free(conv_data *d)
{
    free(d->x);
    free(d->w);
    free(d->b);
    free(d->r);
}

static double worst_ref_ratio;

/* One geometry: every activation, with and without a residual and a bias, fused with and
 * without the pack, against the ref composition and the cpu composition. */
static void check_conv_case(const conv_case *c, bool specials)
{
    conv_data d;
    conv_data_make(&d, c, specials);
    kiln_conv_opts o = opts_of(c);
    int64_t osz = d.oshape[2] * d.oshape[3];
    float *ax = host_abs(d.x, d.xn), *aw = host_abs(d.w, d.wn), *ab = host_abs(d.b, c->O),
          *ar = host_abs(d.r, d.on);

    kiln_scope_begin();
    kiln_tensor *xr = mk(test_dev, 4, d.xshape, d.x), *wr = mk(test_dev, 4, d.wshape, d.w);
    kiln_tensor *br = mk(test_dev, 1, d.bshape, d.b), *rr = mk(test_dev, 4, d.oshape, d.r);
    kiln_tensor *xc = mk(cpu_dev, 4, d.xshape, d.x), *wc = mk(cpu_dev, 4, d.wshape, d.w);
    kiln_tensor *bc = mk(cpu_dev, 1, d.bshape, d.b), *rc = mk(cpu_dev, 4, d.oshape, d.r);
    kiln_tensor *pk = kiln__conv_pack(wc, xc, &o, 2);
    /* the packed path's own limits: plain 2-D convolutions, up to 1024 output positions */
    if (c->groups != 1 || osz > 1024)
        assert_null(pk);
    else
        assert_non_null(pk);
    /* the ref device has no packed form */
    assert_null(kiln__conv_pack(wr, xr, &o, 2));

    for (int withb = 0; withb < 2; withb++) {
        kiln_scope_begin();
        /* the magnitude of the terms of each output: conv(|x|, |w|) + |b| + |r| */
        kiln_tensor *mconv = kiln_conv2d(mk(test_dev, 4, d.xshape, ax), mk(test_dev, 4, d.wshape, aw),
                                         withb ? mk(test_dev, 1, d.bshape, ab) : NULL, &o);
        kiln_tensor *mres = kiln_add(mconv, mk(test_dev, 4, d.oshape, ar));
        float *mag_nores = host_of(mconv), *mag_res = host_of(mres);
        kiln_tensor *yref = kiln_conv2d(xr, wr, withb ? br : NULL, &o);
        kiln_tensor *yrefr = kiln_add(yref, rr);
        kiln_tensor *ycpu = kiln_conv2d(xc, wc, withb ? bc : NULL, &o);
        kiln_tensor *ycpur = kiln_add(ycpu, rc);
        for (int withr = 0; withr < 2; withr++)
            for (int ai = 0; ai < NACTS; ai++) {
                const act_case *a = &acts[ai];
                char label[200];
                snprintf(label, sizeof label, "%s%s, %s%s%s", c->name, specials ? " (NaN/inf)" : "",
                         withb ? "bias, " : "", withr ? "residual, " : "", a->name);
                kiln_scope_begin();
                kiln_tensor *want = compose_act(withr ? yrefr : yref, a);
                kiln_tensor *unf = compose_act(withr ? ycpur : ycpu, a);
                kiln_tensor *fp = kiln__conv_fused(xc, wc, pk, withb ? bc : NULL, &o, 2, withr ? rc : NULL, a->act,
                                                   a->alpha, a->beta);
                kiln_tensor *fn = kiln__conv_fused(xc, wc, NULL, withb ? bc : NULL, &o, 2, withr ? rc : NULL,
                                                   a->act, a->alpha, a->beta);
                expect_dims(fp, 4, d.oshape);
                expect_dims(fn, 4, d.oshape);
                assert_int_equal(kiln_tensor_dtype(fp), KILN_F32);
                float *hw = host_of(want), *hu = host_of(unf), *hp = host_of(fp), *hn = host_of(fn);
                const float *mag = withr ? mag_res : mag_nores;
                double wr1 = expect_close("fused+pack vs ref", label, hp, hw, mag, d.on, d.k, 1e-5);
                double wr2 = expect_close("fused vs ref", label, hn, hw, mag, d.on, d.k, 1e-5);
                worst_ref_ratio = fmax(worst_ref_ratio, fmax(wr1, wr2));
                /* without a pack the fused call takes the unfused call's path and applies
                 * the same roundings: the bits must agree */
                expect_bitwise("fused vs unfused cpu", label, hn, hu, d.on);
                if (!pk || unfused_is_tiled(c, osz)) {
                    expect_bitwise("fused+pack vs unfused cpu", label, hp, hu, d.on);
                } else {
                    /* packed tile against the GEMM lowering: different summation order */
                    expect_close("fused+pack vs unfused cpu", label, hp, hu, mag, d.on, 1, 1e-6);
                    expect_close("fused+pack vs fused", label, hp, hn, mag, d.on, 1, 1e-6);
                }
                free(hw);
                free(hu);
                free(hp);
                free(hn);
                kiln_scope_end();
            }
        free(mag_nores);
        free(mag_res);
        kiln_scope_end();
    }
    kiln_scope_end();
    free(ax);
    free(aw);
    free(ab);
    free(ar);
    conv_data_free(&d);
}

static void test_conv_fused_geometries(void **state)
{
    (void)state;
    rng_state = 1;
    for (int i = 0; i < NCONVS; i++)
        check_conv_case(&convs[i], false);
    /* how close the tolerance came to being used up, to see the margin in the log */
    printf("conv_fused vs ref: worst error / tolerance %.3g\n", worst_ref_ratio);
}

/* Every bias, residual and activation combination of one depthwise case on cpu_dev,
 * copied to the host in a fixed order. */
static float **dw_outputs(const conv_case *c, const conv_data *d)
{
    kiln_conv_opts o = opts_of(c);
    float **outs = calloc(4 * NACTS, sizeof *outs);
    assert_non_null(outs);
    kiln_scope_begin();
    kiln_tensor *x = mk(cpu_dev, 4, d->xshape, d->x), *w = mk(cpu_dev, 4, d->wshape, d->w);
    kiln_tensor *b = mk(cpu_dev, 1, d->bshape, d->b), *r = mk(cpu_dev, 4, d->oshape, d->r);
    for (int i = 0; i < 4 * NACTS; i++) {
        const act_case *a = &acts[i % NACTS];
        bool withb = i / NACTS % 2, withr = i / NACTS / 2;
        kiln_tensor *y = kiln__conv_fused(x, w, NULL, withb ? b : NULL, &o, 2, withr ? r : NULL, a->act, a->alpha,
                                          a->beta);
        outs[i] = host_of(y);
    }
    kiln_scope_end();
    return outs;
}

static void cpu_dev_reopen(const char *depthwise)
{
    kiln_device_close(cpu_dev);
    if (depthwise)
        setenv("KILN_CPU_DEPTHWISE", depthwise, 1);
    else
        unsetenv("KILN_CPU_DEPTHWISE");
    cpu_dev = kiln_device_open("cpu");
    unsetenv("KILN_CPU_DEPTHWISE");
    if (!cpu_dev)
        fail_msg("cannot reopen cpu: %s", kiln_error());
}

/* The cpu backend's two depthwise kernels, channels in the lanes (the default where it
 * applies) and per plane (KILN_CPU_DEPTHWISE=planes), add the same terms in the same
 * order: their outputs agree bit for bit on every depthwise geometry, NaN and infinity
 * included. The device is reopened between the two, since the choice is read at open. */
static void test_conv_depthwise_kernels_agree(void **state)
{
    (void)state;
    rng_state = 3;
    int compared = 0;
    for (int ci = 0; ci < NCONVS; ci++) {
        const conv_case *c = &convs[ci];
        if (c->groups != c->C || c->O != c->C)
            continue;
        for (int specials = 0; specials < 2; specials++) {
            conv_data d;
            conv_data_make(&d, c, specials);
            float **lanes = dw_outputs(c, &d);
            cpu_dev_reopen("planes");
            float **planes = dw_outputs(c, &d);
            cpu_dev_reopen(NULL);
            for (int i = 0; i < 4 * NACTS; i++) {
                char label[200];
                snprintf(label, sizeof label, "%s%s, %s%s%s", c->name, specials ? " (NaN/inf)" : "",
                         i / NACTS % 2 ? "bias, " : "", i / NACTS / 2 ? "residual, " : "", acts[i % NACTS].name);
                expect_bitwise("channel lanes vs per-plane depthwise", label, lanes[i], planes[i], d.on);
                free(lanes[i]);
                free(planes[i]);
                compared++;
            }
            free(lanes);
            free(planes);
            conv_data_free(&d);
        }
    }
    assert_true(compared >= 10 * 4 * NACTS);
}

static void test_conv_fused_nan_inf(void **state)
{
    (void)state;
    rng_state = 2;
    for (int i = 0; i < NCONVS; i++)
        check_conv_case(&convs[i], true);
}

/* A pack is a copy of the weight at the time it was made: a second weight of the same
 * shape gets its own, and the fused call reads the pack it is handed. */
static void test_conv_pack_is_per_weight(void **state)
{
    (void)state;
    rng_state = 3;
    const conv_case *c = &convs[2];
    conv_data d1, d2;
    conv_data_make(&d1, c, false);
    conv_data_make(&d2, c, false);
    kiln_conv_opts o = opts_of(c);
    kiln_scope_begin();
    kiln_tensor *x = mk(cpu_dev, 4, d1.xshape, d1.x);
    kiln_tensor *w1 = mk(cpu_dev, 4, d1.wshape, d1.w), *w2 = mk(cpu_dev, 4, d2.wshape, d2.w);
    kiln_tensor *p1 = kiln__conv_pack(w1, x, &o, 2), *p2 = kiln__conv_pack(w2, x, &o, 2);
    assert_non_null(p1);
    assert_non_null(p2);
    float *f1 = host_of(kiln__conv_fused(x, w1, p1, NULL, &o, 2, NULL, KILN_EPI_RELU, 0, 0));
    float *f2 = host_of(kiln__conv_fused(x, w2, p2, NULL, &o, 2, NULL, KILN_EPI_RELU, 0, 0));
    float *u1 = host_of(kiln_relu(kiln_conv2d(x, w1, NULL, &o)));
    float *u2 = host_of(kiln_relu(kiln_conv2d(x, w2, NULL, &o)));
    expect_bitwise("w1", c->name, f1, u1, d1.on);
    expect_bitwise("w2", c->name, f2, u2, d1.on);
    /* a pack made over a small map still serves a batch of three (its size depends on
     * the weight alone) */
    int64_t xs3[4] = {3, c->C, c->H, c->W};
    float *x3 = host_rand(3 * d1.xn, 1.0f);
    kiln_tensor *xb = mk(cpu_dev, 4, xs3, x3);
    kiln_tensor *fb = kiln__conv_fused(xb, w1, p1, NULL, &o, 2, NULL, KILN_EPI_SIGMOID, 0, 0);
    float *hf = host_of(fb), *hu = host_of(kiln_sigmoid(kiln_conv2d(xb, w1, NULL, &o)));
    expect_bitwise("batch 3 with a batch-1 pack", c->name, hf, hu, 3 * d1.on);
    free(x3);
    free(hf);
    free(hu);
    free(f1);
    free(f2);
    free(u1);
    free(u2);
    kiln_scope_end();
    conv_data_free(&d1);
    conv_data_free(&d2);
}

/* ------------------------------------------------------------------ conv fallbacks */

static void test_conv_fused_fallbacks(void **state)
{
    (void)state;
    rng_state = 7;
    const conv_case *c = &convs[2]; /* [1,16,14,14] -> [1,64,7,7] */
    conv_data d;
    conv_data_make(&d, c, false);
    kiln_conv_opts o = opts_of(c);
    kiln_scope_begin();
    kiln_tensor *x = mk(cpu_dev, 4, d.xshape, d.x), *w = mk(cpu_dev, 4, d.wshape, d.w);
    kiln_tensor *b = mk(cpu_dev, 1, d.bshape, d.b);
    kiln_tensor *pk = kiln__conv_pack(w, x, &o, 2);
    assert_non_null(pk);
    kiln_tensor *y = kiln_conv2d(x, w, b, &o);
    const act_case *clip = &acts[3];

    /* residual [O,1,1]: broadcast */
    kiln_tensor *rb = mk(cpu_dev, KILN_SHAPE(c->O, 1, 1), d.r);
    float *hg = host_of(kiln__conv_fused(x, w, pk, b, &o, 2, rb, clip->act, clip->alpha, clip->beta));
    float *hw = host_of(compose_act(kiln_add(y, rb), clip));
    expect_bitwise("residual [O,1,1]", "conv fallback", hg, hw, d.on);
    free(hg);
    free(hw);

    /* residual with a batch of 3 over an output of batch 1: broadcast the other way */
    int64_t r3[4] = {3, c->O, d.oshape[2], d.oshape[3]};
    float *hr3 = host_rand(3 * d.on, 1.0f);
    kiln_tensor *rbig = mk(cpu_dev, 4, r3, hr3);
    kiln_tensor *g = kiln__conv_fused(x, w, pk, b, &o, 2, rbig, KILN_EPI_RELU, 0, 0);
    expect_dims(g, 4, r3);
    hg = host_of(g);
    hw = host_of(kiln_relu(kiln_add(y, rbig)));
    expect_bitwise("residual of batch 3", "conv fallback", hg, hw, 3 * d.on);
    free(hg);
    free(hw);
    free(hr3);

    /* residual f64: the result is promoted */
    kiln_tensor *r64 = kiln_cast(mk(cpu_dev, 4, d.oshape, d.r), KILN_F64);
    g = kiln__conv_fused(x, w, pk, b, &o, 2, r64, KILN_EPI_HARD_SIGMOID, 0.2, 0.5);
    assert_non_null(g);
    assert_int_equal(kiln_tensor_dtype(g), KILN_F64);
    hg = host_of(g);
    hw = host_of(compose_act(kiln_add(y, r64), &acts[6]));
    expect_bitwise("residual f64", "conv fallback", hg, hw, d.on);
    free(hg);
    free(hw);

    /* residual f16 and i32: promoted to the f32 output */
    kiln_tensor *r16 = kiln_cast(mk(cpu_dev, 4, d.oshape, d.r), KILN_F16);
    g = kiln__conv_fused(x, w, pk, b, &o, 2, r16, KILN_EPI_SIGMOID, 0, 0);
    assert_int_equal(kiln_tensor_dtype(g), KILN_F32);
    hg = host_of(g);
    hw = host_of(kiln_sigmoid(kiln_add(y, r16)));
    expect_bitwise("residual f16", "conv fallback", hg, hw, d.on);
    free(hg);
    free(hw);
    kiln_tensor *ri = kiln_cast(kiln_mul_scalar(mk(cpu_dev, 4, d.oshape, d.r), 4), KILN_I32);
    g = kiln__conv_fused(x, w, pk, b, &o, 2, ri, KILN_EPI_NONE, 0, 0);
    assert_int_equal(kiln_tensor_dtype(g), KILN_F32);
    hg = host_of(g);
    hw = host_of(kiln_add(y, ri));
    expect_bitwise("residual i32", "conv fallback", hg, hw, d.on);
    free(hg);
    free(hw);

    /* a residual of the right shape that is a strided view: the one-pass path reads it
     * through its strides */
    int64_t ts[4] = {c->N, c->O, d.oshape[3], d.oshape[2]};
    kiln_tensor *rt = kiln_transpose(mk(cpu_dev, 4, ts, d.r), 2, 3);
    assert_false(kiln_tensor_is_contiguous(rt));
    hg = host_of(kiln__conv_fused(x, w, pk, b, &o, 2, rt, KILN_EPI_LEAKY_RELU, 0.1, 0));
    hw = host_of(kiln_leaky_relu(kiln_add(y, rt), 0.1));
    expect_bitwise("transposed residual", "conv fallback", hg, hw, d.on);
    free(hg);
    free(hw);

    /* a strided input and weight */
    kiln_tensor *xt = kiln_transpose(kiln_contiguous(kiln_transpose(x, 2, 3)), 2, 3);
    kiln_tensor *wt = kiln_transpose(kiln_contiguous(kiln_transpose(w, 0, 1)), 0, 1);
    assert_false(kiln_tensor_is_contiguous(xt));
    assert_false(kiln_tensor_is_contiguous(wt));
    hg = host_of(kiln__conv_fused(xt, wt, NULL, b, &o, 2, NULL, KILN_EPI_RELU, 0, 0));
    hw = host_of(kiln_relu(y));
    expect_bitwise("strided x and w", "conv fallback", hg, hw, d.on);
    free(hg);
    free(hw);

    /* an f64 input: the separate ops, in f64 */
    kiln_tensor *x64 = kiln_cast(x, KILN_F64), *w64 = kiln_cast(w, KILN_F64), *b64 = kiln_cast(b, KILN_F64);
    g = kiln__conv_fused(x64, w64, pk, b64, &o, 2, NULL, KILN_EPI_RELU, 0, 0);
    assert_non_null(g);
    assert_int_equal(kiln_tensor_dtype(g), KILN_F64);
    double *g64 = malloc((size_t)d.on * sizeof *g64), *w64h = malloc((size_t)d.on * sizeof *w64h);
    assert_int_equal(kiln_to_data(g, g64, (size_t)d.on * sizeof *g64), 0);
    assert_int_equal(kiln_to_data(kiln_relu(kiln_conv2d(x64, w64, b64, &o)), w64h, (size_t)d.on * sizeof *w64h), 0);
    for (int64_t i = 0; i < d.on; i++)
        assert_true(g64[i] == w64h[i]);
    free(g64);
    free(w64h);

    /* geometry and shape faults: errors from the separate ops, never a crash */
    kiln_error_clear();
    assert_null(kiln__conv_fused(x, w, pk, b, &o, 2, mk(cpu_dev, KILN_SHAPE(5), d.r), KILN_EPI_RELU, 0, 0));
    assert_true(kiln_error()[0] != 0);
    kiln_error_clear();
    assert_null(kiln__conv_fused(x, w, pk, mk(cpu_dev, KILN_SHAPE(3), d.b), &o, 2, NULL, KILN_EPI_RELU, 0, 0));
    assert_true(kiln_error()[0] != 0);
    kiln_error_clear();
    kiln_tensor *wbad = mk(cpu_dev, KILN_SHAPE(c->O, 3, 3, 3), d.w);
    assert_null(kiln__conv_fused(x, wbad, NULL, NULL, &o, 2, NULL, KILN_EPI_RELU, 0, 0));
    assert_true(kiln_error()[0] != 0);
    kiln_error_clear();
    kiln_conv_opts big = o;
    big.padding[0] = big.padding[1] = 0;
    kiln_tensor *tiny = mk(cpu_dev, KILN_SHAPE(1, c->C, 2, 2), d.x);
    assert_null(kiln__conv_fused(tiny, w, NULL, NULL, &big, 2, NULL, KILN_EPI_SIGMOID, 0, 0));
    assert_true(kiln_error()[0] != 0);
    kiln_error_clear();
    kiln_tensor *xref = mk(test_dev, 4, d.oshape, d.r);
    assert_null(kiln__conv_fused(x, w, pk, b, &o, 2, xref, KILN_EPI_RELU, 0, 0)); /* residual on ref */
    assert_true(kiln_error()[0] != 0);
    assert_null(kiln__conv_fused(NULL, w, pk, b, &o, 2, NULL, KILN_EPI_RELU, 0, 0));
    assert_null(kiln__conv_pack(NULL, x, &o, 2));
    /* a pack of another weight's size is not read */
    kiln_tensor *w32 = mk(cpu_dev, KILN_SHAPE(32, c->C, 3, 3), d.w);
    kiln_tensor *pk32 = kiln__conv_pack(w32, x, &o, 2);
    assert_non_null(pk32);
    hg = host_of(kiln__conv_fused(x, w, pk32, b, &o, 2, NULL, KILN_EPI_RELU, 0, 0));
    hw = host_of(kiln_relu(y));
    expect_bitwise("pack of a smaller weight", "conv fallback", hg, hw, d.on);
    free(hg);
    free(hw);

    /* on the ref device (no fused entry) the call is exactly the composed ops */
    kiln_tensor *xr = mk(test_dev, 4, d.xshape, d.x), *wr = mk(test_dev, 4, d.wshape, d.w);
    kiln_tensor *br = mk(test_dev, 1, d.bshape, d.b), *rr = mk(test_dev, 4, d.oshape, d.r);
    for (int ai = 0; ai < NACTS; ai++) {
        hg = host_of(kiln__conv_fused(xr, wr, NULL, br, &o, 2, rr, acts[ai].act, acts[ai].alpha, acts[ai].beta));
        hw = host_of(compose_act(kiln_add(kiln_conv2d(xr, wr, br, &o), rr), &acts[ai]));
        expect_bitwise("on ref", acts[ai].name, hg, hw, d.on);
        free(hg);
        free(hw);
    }
    kiln_scope_end();
    conv_data_free(&d);
}

/* 1-D and 3-D convolutions go through kiln__conv_fused too (the onnx Conv of any rank). */
static void test_conv_fused_1d_3d(void **state)
{
    (void)state;
    rng_state = 8;
    float *hx = host_rand(3 * 8 * 30, 1.0f), *hw = host_rand(16 * 8 * 3, 0.3f), *hr = host_rand(3 * 16 * 30, 1.0f);
    kiln_scope_begin();
    kiln_conv_opts o = {.padding = {1, 1, 1}};
    kiln_tensor *x = mk(cpu_dev, KILN_SHAPE(3, 8, 30), hx), *w = mk(cpu_dev, KILN_SHAPE(16, 8, 3), hw);
    kiln_tensor *r = mk(cpu_dev, KILN_SHAPE(3, 16, 30), hr);
    assert_null(kiln__conv_pack(w, x, &o, 1));
    float *hg = host_of(kiln__conv_fused(x, w, NULL, NULL, &o, 1, r, KILN_EPI_HARD_SWISH, 0, 0));
    float *hu = host_of(compose_act(kiln_add(kiln_conv1d(x, w, NULL, &o), r), &acts[8]));
    expect_bitwise("conv1d", "hard_swish", hg, hu, 3 * 16 * 30);
    free(hg);
    free(hu);
    kiln_tensor *x3 = mk(cpu_dev, KILN_SHAPE(1, 8, 3, 5, 6), hx);
    kiln_tensor *w3 = mk(cpu_dev, KILN_SHAPE(2, 8, 3, 1, 3), hw);
    kiln_tensor *r3 = mk(cpu_dev, KILN_SHAPE(1, 2, 3, 7, 6), hr);
    hg = host_of(kiln__conv_fused(x3, w3, NULL, NULL, &o, 3, r3, KILN_EPI_CLAMP, -0.5, 0.5));
    hu = host_of(kiln_clamp(kiln_add(kiln_conv3d(x3, w3, NULL, &o), r3), -0.5, 0.5));
    expect_bitwise("conv3d", "clip", hg, hu, 2 * 3 * 7 * 6);
    free(hg);
    free(hu);
    kiln_scope_end();
    free(hx);
    free(hw);
    free(hr);
}

/* ------------------------------------------------------------------ autograd */

/* Anything that requires grad takes the separate ops, so gradients flow as through the
 * composed ops: same loss, same gradients, to the bit. A pack handed along is ignored
 * (it may be stale: the weight is being trained). */
static void check_grad(const act_case *a, bool grad_x, bool grad_res)
{
    rng_state = 9;
    const conv_case *c = &convs[0]; /* 1x1 16->32 7x7, a packed-path shape */
    conv_data d;
    conv_data_make(&d, c, false);
    kiln_conv_opts o = opts_of(c);
    float *stale = host_rand(d.wn, 1.0f);
    float *g_out = host_rand(d.on, 1.0f);
    float *grads[2][4] = {{0}};
    float loss[2];
    kiln_scope_begin();
    kiln_tensor *xs = mk(cpu_dev, 4, d.xshape, d.x);
    kiln_tensor *pk = kiln__conv_pack(mk(cpu_dev, 4, d.wshape, stale), xs, &o, 2);
    assert_non_null(pk);
    kiln_tensor *go = mk(cpu_dev, 4, d.oshape, g_out);
    for (int fused = 0; fused < 2; fused++) {
        kiln_scope_begin();
        kiln_tensor *x = mk(cpu_dev, 4, d.xshape, d.x), *w = mk(cpu_dev, 4, d.wshape, d.w);
        kiln_tensor *b = mk(cpu_dev, 1, d.bshape, d.b), *r = mk(cpu_dev, 4, d.oshape, d.r);
        assert_non_null(kiln_requires_grad(w, true));
        assert_non_null(kiln_requires_grad(b, true));
        if (grad_x)
            assert_non_null(kiln_requires_grad(x, true));
        if (grad_res)
            assert_non_null(kiln_requires_grad(r, true));
        kiln_tensor *y = fused ? kiln__conv_fused(x, w, pk, b, &o, 2, r, a->act, a->alpha, a->beta)
                               : compose_act(kiln_add(kiln_conv2d(x, w, b, &o), r), a);
        assert_non_null(y);
        assert_true(kiln_tensor_requires_grad(y));
        kiln_tensor *l = kiln_sum(kiln_mul(y, go), KILN_ALL_DIMS, false);
        loss[fused] = (float)kiln_item(l);
        assert_int_equal(kiln_backward(l, NULL), 0);
        kiln_tensor *leaves[4] = {w, b, x, r};
        for (int i = 0; i < 4; i++) {
            kiln_tensor *g = kiln_grad(leaves[i]);
            if (i == 2 && !grad_x)
                assert_null(g);
            else if (i == 3 && !grad_res)
                assert_null(g);
            else
                grads[fused][i] = host_of(g);
        }
        kiln_scope_end();
    }
    char label[120];
    snprintf(label, sizeof label, "%s%s%s", a->name, grad_x ? ", x requires grad" : "",
             grad_res ? ", residual requires grad" : "");
    assert_true(same_bits(loss[0], loss[1]));
    int64_t n[4] = {d.wn, c->O, d.xn, d.on};
    const char *names[4] = {"grad w", "grad b", "grad x", "grad residual"};
    for (int i = 0; i < 4; i++)
        if (grads[0][i]) {
            expect_bitwise(names[i], label, grads[1][i], grads[0][i], n[i]);
            free(grads[0][i]);
            free(grads[1][i]);
        }
    kiln_scope_end();
    free(stale);
    free(g_out);
    conv_data_free(&d);
}

static void test_conv_fused_autograd(void **state)
{
    (void)state;
    for (int ai = 0; ai < NACTS; ai++)
        check_grad(&acts[ai], ai % 2 == 0, ai % 3 == 0);
}

/* Under no_grad a trainable weight is just data: the one-pass path may run, and gives
 * the unfused bits. */
static void test_conv_fused_no_grad(void **state)
{
    (void)state;
    rng_state = 10;
    const conv_case *c = &convs[1];
    conv_data d;
    conv_data_make(&d, c, false);
    kiln_conv_opts o = opts_of(c);
    kiln_scope_begin();
    kiln_tensor *x = mk(cpu_dev, 4, d.xshape, d.x), *w = mk(cpu_dev, 4, d.wshape, d.w);
    kiln_tensor *r = mk(cpu_dev, 4, d.oshape, d.r);
    assert_non_null(kiln_requires_grad(w, true));
    kiln_no_grad_begin();
    kiln_tensor *pk = kiln__conv_pack(w, x, &o, 2);
    kiln_tensor *y = kiln__conv_fused(x, w, pk, NULL, &o, 2, r, KILN_EPI_RELU, 0, 0);
    kiln_tensor *u = kiln_relu(kiln_add(kiln_conv2d(x, w, NULL, &o), r));
    kiln_no_grad_end();
    assert_non_null(pk);
    assert_false(kiln_tensor_requires_grad(y));
    float *hy = host_of(y), *hu = host_of(u);
    expect_bitwise("no_grad", c->name, hy, hu, d.on);
    free(hy);
    free(hu);
    kiln_scope_end();
    conv_data_free(&d);
}

/* A clamp with lo above hi is kiln_clamp's error on every path: the one-pass path must not
 * quietly answer hi where the fallback refuses. */
static void test_clip_lo_above_hi(void **state)
{
    (void)state;
    rng_state = 11;
    const conv_case *c = &convs[0]; /* 1x1 16->32 7x7 */
    conv_data d;
    conv_data_make(&d, c, false);
    kiln_conv_opts o = opts_of(c);
    kiln_scope_begin();
    kiln_tensor *x = mk(cpu_dev, 4, d.xshape, d.x), *w = mk(cpu_dev, 4, d.wshape, d.w);
    kiln_tensor *r = mk(cpu_dev, 4, d.oshape, d.r), *rb = mk(cpu_dev, KILN_SHAPE(c->O, 1, 1), d.r);
    assert_null(kiln_clamp(kiln_add(kiln_conv2d(x, w, NULL, &o), r), 6, -1));
    assert_null(kiln__conv_fused(x, w, NULL, NULL, &o, 2, rb, KILN_EPI_CLAMP, 6, -1));
    assert_null(kiln__conv_fused(x, w, NULL, NULL, &o, 2, r, KILN_EPI_CLAMP, 6, -1));
    assert_non_null(strstr(kiln_error(), "clamp"));
    kiln_tensor *y = kiln_matmul(mk(cpu_dev, KILN_SHAPE(4, 16), d.x), mk(cpu_dev, KILN_SHAPE(16, 8), d.w));
    assert_non_null(y);
    assert_null(kiln__epilogue(y, NULL, NULL, KILN_EPI_CLAMP, 6, -1));
    kiln_scope_end();
    conv_data_free(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_fused_geometries),
        cmocka_unit_test(test_conv_fused_nan_inf),
        cmocka_unit_test(test_conv_depthwise_kernels_agree),
        cmocka_unit_test(test_conv_pack_is_per_weight),
        cmocka_unit_test(test_conv_fused_fallbacks),
        cmocka_unit_test(test_conv_fused_1d_3d),
        cmocka_unit_test(test_conv_fused_autograd),
        cmocka_unit_test(test_clip_lo_above_hi),
        cmocka_unit_test(test_conv_fused_no_grad),
        cmocka_unit_test_setup(test_epilogue_matmul, epilogue_setup),
        cmocka_unit_test_setup(test_epilogue_shared, epilogue_setup),
        cmocka_unit_test_setup(test_epilogue_fallbacks, epilogue_setup),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
