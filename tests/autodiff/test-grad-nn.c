/*
 * tests/autodiff/test-grad-nn.c — gradient checks of the nn primitives on ref and cpu:
 * convolutions (1-3 spatial dims, stride/padding/dilation/groups, bias, unbatched),
 * transposed convolutions, pooling, adaptive pooling, interpolation, softmax and
 * log_softmax, the normalizations, dropout and attention.
 */
#include "gradcheck.h"

typedef struct conv_case {
    const char *name;
    int ns;
    bool transposed, bias;
    kiln_conv_opts o;
} conv_case;

static kiln_tensor *f_conv(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    const conv_case *c = ud;
    kiln_tensor *b = c->bias ? in[2] : NULL;
    if (c->transposed)
        return c->ns == 1 ? kiln_conv_transpose1d(in[0], in[1], b, &c->o) : kiln_conv_transpose2d(in[0], in[1], b, &c->o);
    switch (c->ns) {
    case 1: return kiln_conv1d(in[0], in[1], b, &c->o);
    case 2: return kiln_conv2d(in[0], in[1], b, &c->o);
    default: return kiln_conv3d(in[0], in[1], b, &c->o);
    }
}

static void test_conv(void **state)
{
    (void)state;
    static const conv_case c1 = {"conv1d", 1, false, true, {.stride = {2}, .padding = {1}}};
    GRADCHECK(c1.name, f_conv, &c1, GC_IN(2, 2, 7), GC_IN(3, 2, 3), GC_IN(3));
    static const conv_case c1g = {"conv1d groups dilation", 1, false, false, {.dilation = {2}, .groups = 2}};
    GRADCHECK(c1g.name, f_conv, &c1g, GC_IN(1, 4, 6), GC_IN(2, 2, 2));
    static const conv_case c1u = {"conv1d unbatched", 1, false, true, {.padding = {1}}};
    GRADCHECK(c1u.name, f_conv, &c1u, GC_IN(2, 5), GC_IN(2, 2, 3), GC_IN(2));
    static const conv_case c2 = {"conv2d", 2, false, true, {.stride = {1, 2}, .padding = {1, 0}}};
    GRADCHECK(c2.name, f_conv, &c2, GC_IN(1, 2, 4, 5), GC_IN(2, 2, 3, 2), GC_IN(2));
    static const conv_case c3 = {"conv3d", 3, false, true, {.padding = {0, 1, 0}}};
    GRADCHECK(c3.name, f_conv, &c3, GC_IN(1, 1, 3, 3, 3), GC_IN(2, 1, 2, 2, 2), GC_IN(2));
    static const conv_case t1 = {"conv_transpose1d", 1, true, true, {.stride = {2}, .padding = {1}, .output_padding = {1}}};
    GRADCHECK(t1.name, f_conv, &t1, GC_IN(2, 2, 4), GC_IN(2, 3, 3), GC_IN(3));
    static const conv_case t2 = {"conv_transpose2d groups", 2, true, false, {.stride = {2, 1}, .groups = 2}};
    GRADCHECK(t2.name, f_conv, &t2, GC_IN(1, 2, 3, 3), GC_IN(2, 1, 2, 2));
}

typedef struct pool_case {
    const char *name;
    int kind;  /* 0 max1d, 1 max2d, 2 avg1d, 3 avg2d, 4 adaptive1d, 5 adaptive2d */
    kiln_pool_opts o;
} pool_case;

static kiln_tensor *f_pool(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    const pool_case *c = ud;
    kiln_tensor *ix = NULL;
    switch (c->kind) {
    case 0: return kiln_max_pool1d(in[0], &c->o, NULL);
    case 1: return kiln_max_pool2d(kiln_transpose(in[0], 2, 3), &c->o, &ix);
    case 2: return kiln_avg_pool1d(in[0], &c->o);
    case 3: return kiln_avg_pool2d(in[0], &c->o);
    case 4: return kiln_adaptive_avg_pool1d(in[0], 3);
    default: return kiln_adaptive_avg_pool2d(kiln_transpose(in[0], 2, 3), 2, 3);
    }
}

static void test_pool(void **state)
{
    (void)state;
    static const pool_case cases[] = {
        {"max_pool1d", 0, {.kernel = {3}, .stride = {2}, .padding = {1}}},
        {"max_pool1d dilation ceil", 0, {.kernel = {2}, .dilation = {2}, .ceil_mode = true}},
        {"max_pool2d", 1, {.kernel = {2, 2}, .stride = {1, 2}}},
        {"avg_pool1d", 2, {.kernel = {3}, .stride = {1}, .padding = {1}, .count_include_pad = true}},
        {"avg_pool1d exclude pad", 2, {.kernel = {3}, .stride = {2}, .padding = {1}}},
        {"avg_pool2d", 3, {.kernel = {2, 3}, .stride = {1, 1}}},
        {"adaptive_avg_pool1d", 4, {.kernel = {1}}},
        {"adaptive_avg_pool2d", 5, {.kernel = {1}}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].kind == 0 || cases[i].kind == 2 || cases[i].kind == 4)
            GRADCHECK(cases[i].name, f_pool, &cases[i], GC_IN(2, 2, 7));
        else
            GRADCHECK(cases[i].name, f_pool, &cases[i], GC_IN(1, 2, 5, 4));
    }
    /* unbatched max pooling */
    static const pool_case u = {"max_pool1d unbatched", 0, {.kernel = {2}}};
    GRADCHECK(u.name, f_pool, &u, GC_IN(3, 6));
}

typedef struct interp_case {
    kiln_interp_mode mode;
    bool align;
    int64_t h, w;
} interp_case;

static kiln_tensor *f_interp(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    const interp_case *c = ud;
    return kiln_interpolate(in[0], c->h, c->w, c->mode, c->align);
}

static void test_interpolate(void **state)
{
    (void)state;
    static const interp_case cases[] = {
        {KILN_INTERP_NEAREST, false, 5, 3}, {KILN_INTERP_BILINEAR, false, 5, 7},
        {KILN_INTERP_BILINEAR, true, 4, 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        GRADCHECK("interpolate", f_interp, &cases[i], GC_IN(1, 2, 3, 4));
}

static kiln_tensor *f_softmax(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    (void)ud;
    kiln_tensor *a = kiln_softmax(in[0], 1);
    kiln_tensor *b = kiln_log_softmax(kiln_transpose(in[0], 0, 2), -1);
    return kiln_add(kiln_sum(kiln_square(a), KILN_ALL_DIMS, false), kiln_sum(kiln_mul(b, b), KILN_ALL_DIMS, false));
}

static kiln_tensor *f_layer_norm(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    int mode = *(const int *)ud;
    if (mode == 0)
        return kiln_layer_norm(in[0], 2, in[1], in[2], 1e-5);
    return kiln_layer_norm(kiln_transpose(in[0], 0, 1), 1, NULL, NULL, 1e-3);
}

static kiln_tensor *f_batch_norm(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    bool training = *(const bool *)ud;
    kiln_tensor *rm = kiln_zeros(dev, KILN_F64, KILN_SHAPE(3));
    kiln_tensor *rv = kiln_full(dev, KILN_F64, KILN_SHAPE(3), 1.5);
    return kiln_batch_norm(in[0], rm, rv, in[1], in[2], training, 0.1, 1e-5);
}

/* NCHW with no running statistics and no affine parameters (the one-node backward's
 * other branches), and the input reached through a strided view. */
static kiln_tensor *f_batch_norm_plain(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    return kiln_batch_norm(kiln_transpose(in[0], 2, 3), NULL, NULL, NULL, NULL, true, 0.1, 1e-3);
}

static kiln_tensor *f_batch_norm_weight(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    return kiln_batch_norm(in[0], NULL, NULL, in[1], NULL, true, 0.1, 1e-5);
}

static kiln_tensor *f_group_norm(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    (void)ud;
    return kiln_group_norm(in[0], 2, in[1], in[2], 1e-5);
}

static kiln_tensor *f_dropout(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    (void)ud;
    kiln_generator gen = kiln_generator_make(5); /* the same mask on every evaluation */
    return kiln_dropout(in[0], 0.4, true, &gen);
}

static kiln_tensor *f_attention(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    int mode = *(const int *)ud;
    if (mode == 0)
        return kiln_scaled_dot_product_attention(in[0], in[1], in[2], NULL, true, 0);
    /* a float mask, then a bool mask with batch dims */
    kiln_tensor *fm = kiln_mul_scalar(kiln_ones(dev, KILN_F64, KILN_SHAPE(3, 4)), 0.3);
    kiln_tensor *y = kiln_scaled_dot_product_attention(in[0], in[1], in[2], fm, false, 0.7);
    uint8_t mv[12] = {1, 1, 0, 1, 0, 1, 1, 1, 1, 0, 0, 1};
    kiln_tensor *bm = kiln_from_data(dev, KILN_BOOL, KILN_SHAPE(1, 3, 4), mv, sizeof mv);
    return kiln_add(y, kiln_scaled_dot_product_attention(in[0], in[1], in[2], bm, false, 0));
}

static void test_norms_and_attention(void **state)
{
    (void)state;
    GRADCHECK("softmax/log_softmax", f_softmax, NULL, GC_IN(2, 3, 4));
    static const int ln0 = 0, ln1 = 1;
    GRADCHECK("layer_norm affine", f_layer_norm, &ln0, GC_IN(2, 3, 4), GC_IN(3, 4), GC_IN(3, 4));
    GRADCHECK("layer_norm plain", f_layer_norm, &ln1, GC_IN(3, 2, 5));
    static const bool train = true, eval = false;
    GRADCHECK("batch_norm train", f_batch_norm, &train, GC_IN(4, 3, 2), GC_IN(3), GC_IN(3));
    GRADCHECK("batch_norm eval", f_batch_norm, &eval, GC_IN(4, 3, 2), GC_IN(3), GC_IN(3));
    GRADCHECK("batch_norm train NCHW plain", f_batch_norm_plain, NULL, GC_IN(3, 2, 4, 3));
    GRADCHECK("batch_norm train weight only", f_batch_norm_weight, NULL, GC_IN(2, 3, 2, 2), GC_IN(3));
    GRADCHECK("group_norm", f_group_norm, NULL, GC_IN(2, 4, 3), GC_IN(4), GC_IN(4));
    GRADCHECK("dropout", f_dropout, NULL, GC_IN(3, 5));
    static const int causal = 0, masked = 1;
    GRADCHECK("attention causal", f_attention, &causal, GC_IN(2, 3, 4), GC_IN(2, 4, 4), GC_IN(2, 4, 2));
    GRADCHECK("attention masks", f_attention, &masked, GC_IN(2, 3, 4), GC_IN(2, 4, 4), GC_IN(2, 4, 2));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv),
        cmocka_unit_test(test_pool),
        cmocka_unit_test(test_interpolate),
        cmocka_unit_test(test_norms_and_attention),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
