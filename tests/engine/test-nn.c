/*
 * tests/engine/test-nn.c — nn ops of the front end on the ref backend: convolution
 * geometry and values (against a plain loop), transposed convolution, pooling output
 * sizes, softmax, the normalizations (running statistics included), dropout and
 * attention (against its definition written out by hand).
 */
#include "test-util.h"

/* Plain 2-d convolution, x [N, C, H, W], w [O, C/g, KH, KW]. */
static void naive_conv2d(const float *x, const float *w, const float *b, float *y, int N, int C, int H,
                         int W, int O, int KH, int KW, int s, int p, int d, int g, int OH, int OW)
{
    int cg = C / g, og = O / g;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++)
            for (int oh = 0; oh < OH; oh++)
                for (int ow = 0; ow < OW; ow++) {
                    double acc = b ? b[o] : 0;
                    int grp = o / og;
                    for (int c = 0; c < cg; c++)
                        for (int kh = 0; kh < KH; kh++)
                            for (int kw = 0; kw < KW; kw++) {
                                int ih = oh * s - p + kh * d, iw = ow * s - p + kw * d;
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W)
                                    continue;
                                int ci = grp * cg + c;
                                acc += (double)x[((n * C + ci) * H + ih) * W + iw] *
                                       w[((o * cg + c) * KH + kh) * KW + kw];
                            }
                    y[((n * O + o) * OH + oh) * OW + ow] = (float)acc;
                }
}

static void test_conv2d(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_generator gen = kiln_generator_make(11);
    kiln_tensor *x = kiln_rand_normal(test_dev, KILN_F32, KILN_SHAPE(2, 4, 7, 6), 0, 1, &gen);
    kiln_tensor *w = kiln_rand_normal(test_dev, KILN_F32, KILN_SHAPE(6, 2, 3, 3), 0, 1, &gen);
    kiln_tensor *b = kiln_rand_normal(test_dev, KILN_F32, KILN_SHAPE(6), 0, 1, &gen);
    kiln_conv_opts o = {.stride = {2, 2}, .padding = {1, 1}, .dilation = {0, 0}, .groups = 2};
    kiln_tensor *y = kiln_conv2d(x, w, b, &o);
    /* (7 + 2 - 3) / 2 + 1 = 4, (6 + 2 - 3) / 2 + 1 = 3 */
    EXPECT_SHAPE(y, 2, 6, 4, 3);
    float hx[2 * 4 * 7 * 6], hw[6 * 2 * 9], hb[6], want[2 * 6 * 4 * 3];
    read_f32(x, hx, sizeof hx / sizeof hx[0]);
    read_f32(w, hw, sizeof hw / sizeof hw[0]);
    read_f32(b, hb, 6);
    naive_conv2d(hx, hw, hb, want, 2, 4, 7, 6, 6, 3, 3, 2, 1, 1, 2, 4, 3);
    expect_f32(y, want, sizeof want / sizeof want[0], 1e-5);

    /* Dilation 2, no padding, defaults elsewhere; unbatched input [C, H, W]. */
    kiln_conv_opts od = {.dilation = {2, 2}, .groups = 2};
    kiln_tensor *x0 = kiln_narrow(x, 0, 0, 1);
    kiln_tensor *xs = kiln_squeeze(x0, 0);
    kiln_tensor *y2 = kiln_conv2d(xs, w, NULL, &od);
    EXPECT_SHAPE(y2, 6, 3, 2); /* 7 - 4 = 3, 6 - 4 = 2 */
    float want2[6 * 3 * 2];
    naive_conv2d(hx, hw, NULL, want2, 1, 4, 7, 6, 6, 3, 3, 1, 0, 2, 2, 3, 2);
    expect_f32(y2, want2, 36, 1e-5);

    assert_null(kiln_conv2d(x, w, NULL, NULL)); /* groups 1: weight has 2 channels, input 4 */
    expect_error("conv2d: weight f32[6, 2, 3, 3] does not fit input f32[2, 4, 7, 6] with groups 1");
    kiln_conv_opts big = {.dilation = {4, 4}, .groups = 2};
    assert_null(kiln_conv2d(x, w, NULL, &big));
    expect_error("larger than the padded input");
    kiln_scope_end();
}

static void test_conv1d_and_transpose(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *x = TF32(KILN_SHAPE(1, 1, 4), 1, 2, 3, 4);
    kiln_tensor *w = TF32(KILN_SHAPE(1, 1, 2), 1, -1);
    EXPECT_F32(kiln_conv1d(x, w, NULL, NULL), 0, -1, -1, -1);
    kiln_conv_opts pad = {.padding = {1}};
    EXPECT_F32(kiln_conv1d(x, w, TF32(KILN_SHAPE(1), 10), &pad), 0, 9, 9, 9, 9, 14);

    /* Transposed: each input spreads w over the output at stride s. */
    kiln_tensor *xt = TF32(KILN_SHAPE(1, 1, 2), 1, 2);
    kiln_tensor *wt = TF32(KILN_SHAPE(1, 1, 2), 1, 1);
    EXPECT_F32(kiln_conv_transpose1d(xt, wt, NULL, NULL), 0, 1, 3, 2);
    kiln_conv_opts s2 = {.stride = {2}};
    EXPECT_F32(kiln_conv_transpose1d(xt, wt, NULL, &s2), 0, 1, 1, 2, 2);
    kiln_conv_opts s2op = {.stride = {2}, .output_padding = {1}};
    kiln_tensor *yo = kiln_conv_transpose1d(xt, wt, TF32(KILN_SHAPE(1), 0.5), &s2op);
    EXPECT_SHAPE(yo, 1, 1, 5);
    EXPECT_F32(yo, 0, 1.5, 1.5, 2.5, 2.5, 0.5);
    /* 2-d, two output channels: w [C_in=1, C_out=2, 1, 1] scales per channel. */
    kiln_tensor *x2 = TF32(KILN_SHAPE(1, 1, 1, 2), 3, 4);
    kiln_tensor *w2 = TF32(KILN_SHAPE(1, 2, 1, 1), 1, -2);
    EXPECT_F32(kiln_conv_transpose2d(x2, w2, NULL, NULL), 0, 3, 4, -6, -8);
    kiln_conv_opts bad = {.stride = {1}, .output_padding = {1}};
    assert_null(kiln_conv_transpose1d(xt, wt, NULL, &bad));
    expect_error("output_padding");
    kiln_scope_end();
}

static void test_pooling(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *x = kiln_reshape(kiln_arange(test_dev, KILN_F32, 0, 25, 1), KILN_SHAPE(1, 1, 5, 5));
    kiln_pool_opts o = {.kernel = {2, 2}};
    kiln_tensor *ix = NULL;
    kiln_tensor *m = kiln_max_pool2d(x, &o, &ix);
    EXPECT_SHAPE(m, 1, 1, 2, 2);
    EXPECT_F32(m, 0, 6, 8, 16, 18);
    EXPECT_F32(ix, 0, 6, 8, 16, 18);
    o.ceil_mode = true; /* 5 with k 2, s 2: ceil gives 3 */
    kiln_tensor *mc = kiln_max_pool2d(x, &o, NULL);
    EXPECT_SHAPE(mc, 1, 1, 3, 3);
    EXPECT_F32(mc, 0, 6, 8, 9, 16, 18, 19, 21, 23, 24);
    /* ceil_mode never starts a window in the right padding: 4 with k 2, s 2, p 1 -> 3 */
    kiln_pool_opts o2 = {.kernel = {2}, .padding = {1}, .ceil_mode = true};
    kiln_tensor *r = TF32(KILN_SHAPE(1, 1, 4), 1, 5, 2, 3);
    EXPECT_F32(kiln_max_pool1d(r, &o2, NULL), 0, 1, 5, 3);
    kiln_pool_opts a1 = {.kernel = {3}, .stride = {1}, .padding = {1}, .count_include_pad = true};
    EXPECT_F32(kiln_avg_pool1d(r, &a1), 1e-6, 6.0 / 3, 8.0 / 3, 10.0 / 3, 5.0 / 3);
    a1.count_include_pad = false;
    EXPECT_F32(kiln_avg_pool1d(r, &a1), 1e-6, 3, 8.0 / 3, 10.0 / 3, 2.5);
    EXPECT_F32(kiln_adaptive_avg_pool2d(x, 1, 1), 1e-6, 12);
    EXPECT_F32(kiln_adaptive_avg_pool1d(r, 2), 1e-6, 3, 2.5);
    kiln_pool_opts badp = {.kernel = {2}, .padding = {2}};
    assert_null(kiln_max_pool1d(r, &badp, NULL));
    expect_error("padding must be at most half the kernel");
    assert_null(kiln_avg_pool1d(r, NULL));
    expect_error("kernel size");

    kiln_tensor *s = TF32(KILN_SHAPE(1, 1, 2, 2), 1, 2, 3, 4);
    kiln_tensor *up = kiln_interpolate(s, 4, 4, KILN_INTERP_NEAREST, false);
    EXPECT_F32(up, 0, 1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4);
    kiln_tensor *bl = kiln_interpolate(s, 3, 3, KILN_INTERP_BILINEAR, true);
    EXPECT_F32(bl, 1e-6, 1, 1.5, 2, 2, 2.5, 3, 3, 3.5, 4);
    kiln_scope_end();
}

static void test_softmax_and_norms(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *x = TF32(KILN_SHAPE(2, 3), 1, 2, 3, 1000, 1000, 1000);
    double z = exp(1) + exp(2) + exp(3);
    EXPECT_F32(kiln_softmax(x, -1), 1e-6, exp(1) / z, exp(2) / z, exp(3) / z, 1.0 / 3, 1.0 / 3, 1.0 / 3);
    EXPECT_F32(kiln_log_softmax(x, 1), 1e-6, 1 - log(z), 2 - log(z), 3 - log(z), -log(3), -log(3), -log(3));
    kiln_tensor *col = kiln_softmax(x, 0);
    EXPECT_F32(col, 1e-6, 0, 0, 0, 1, 1, 1);

    /* layer_norm over the last dim, with an affine */
    kiln_tensor *v = TF32(KILN_SHAPE(2, 4), 1, 2, 3, 4, 2, 2, 2, 2);
    kiln_tensor *w = TF32(KILN_SHAPE(4), 1, 2, 1, 1);
    kiln_tensor *b = TF32(KILN_SHAPE(4), 0, 0, 1, 0);
    double sd = sqrt(1.25 + 1e-5);
    EXPECT_F32(kiln_layer_norm(v, 1, w, b, 1e-5), 1e-5, -1.5 / sd, 2 * -0.5 / sd, 0.5 / sd + 1, 1.5 / sd, 0, 0, 1, 0);
    /* over both dims: mean 2.25, var (1.5625+0.0625+0.5625+3.0625+4*0.0625)/8 = 0.6875 */
    kiln_tensor *ln2 = kiln_layer_norm(v, 2, NULL, NULL, 0);
    double s2 = sqrt(0.6875);
    EXPECT_F32(ln2, 1e-5, -1.25 / s2, -0.25 / s2, 0.75 / s2, 1.75 / s2, -0.25 / s2, -0.25 / s2, -0.25 / s2, -0.25 / s2);
    assert_null(kiln_layer_norm(v, 1, TF32(KILN_SHAPE(3), 1, 1, 1), NULL, 1e-5));
    expect_error("layer_norm: weight f32[3] must have shape [4]");

    /* batch_norm training: x [2, 2, 2], channel 0 = {1, 2, 3, 4}, channel 1 = {0, 0, 4, 4} */
    kiln_tensor *bx = TF32(KILN_SHAPE(2, 2, 2), 1, 2, 0, 0, 3, 4, 4, 4);
    kiln_tensor *rm = kiln_keep(kiln_zeros(test_dev, KILN_F32, KILN_SHAPE(2)));
    kiln_tensor *rv = kiln_keep(kiln_ones(test_dev, KILN_F32, KILN_SHAPE(2)));
    kiln_tensor *y = kiln_batch_norm(bx, rm, rv, NULL, NULL, true, 0.1, 0);
    double s0 = sqrt(1.25);
    EXPECT_F32(y, 1e-5, -1.5 / s0, -0.5 / s0, -1, -1, 0.5 / s0, 1.5 / s0, 1, 1);
    /* running_mean = 0.9*0 + 0.1*mean; running_var = 0.9*1 + 0.1*unbiased var */
    EXPECT_F32(rm, 1e-6, 0.25, 0.2);
    EXPECT_F32(rv, 1e-6, 0.9 + 0.1 * 5.0 / 3, 0.9 + 0.1 * 16.0 / 3);
    /* eval uses the running statistics, with weight and bias */
    kiln_tensor *ye = kiln_batch_norm(bx, rm, rv, TF32(KILN_SHAPE(2), 2, 1), TF32(KILN_SHAPE(2), 0, 1), false, 0.1, 0);
    double rv0 = 0.9 + 0.1 * 5.0 / 3, rv1 = 0.9 + 0.1 * 16.0 / 3;
    EXPECT_F32(ye, 1e-5, 2 * 0.75 / sqrt(rv0), 2 * 1.75 / sqrt(rv0), -0.2 / sqrt(rv1) + 1, -0.2 / sqrt(rv1) + 1,
               2 * 2.75 / sqrt(rv0), 2 * 3.75 / sqrt(rv0), 3.8 / sqrt(rv1) + 1, 3.8 / sqrt(rv1) + 1);
    kiln_tensor_release(rm);
    kiln_tensor_release(rv);

    /* group_norm with 2 groups of 2 channels: group 0 = {1, 2, 3, 4}, group 1 = {5, 5, 7, 7} */
    kiln_tensor *gx = TF32(KILN_SHAPE(1, 4, 2), 1, 2, 3, 4, 5, 5, 7, 7);
    kiln_tensor *gn = kiln_group_norm(gx, 2, TF32(KILN_SHAPE(4), 1, 1, 1, 2), NULL, 0);
    EXPECT_F32(gn, 1e-5, -1.5 / s0, -0.5 / s0, 0.5 / s0, 1.5 / s0, -1, -1, 2, 2);
    assert_null(kiln_group_norm(gx, 3, NULL, NULL, 0));
    expect_error("divisible by groups 3");
    kiln_scope_end();
}

static void test_dropout(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *x = kiln_ones(test_dev, KILN_F32, KILN_SHAPE(1000));
    kiln_generator g = kiln_generator_make(3);
    kiln_tensor *y = kiln_dropout(x, 0.25, true, &g);
    float h[1000];
    read_f32(y, h, 1000);
    int zeros = 0;
    for (int i = 0; i < 1000; i++) {
        if (h[i] == 0)
            zeros++;
        else
            assert_near(h[i], 1 / 0.75, 1e-6);
    }
    assert_true(zeros > 180 && zeros < 320);
    /* Same generator state, same mask. */
    kiln_generator g2 = kiln_generator_make(3);
    kiln_tensor *y2 = kiln_dropout(x, 0.25, true, &g2);
    assert_near(kiln_item(kiln_sum(kiln_ne(y, y2), KILN_ALL_DIMS, false)), 0, 0);
    kiln_tensor *id = kiln_dropout(x, 0.5, false, &g); /* eval: x's values, shared */
    assert_true(kiln_tensor_shares_storage(id, x));
    EXPECT_F32(kiln_sum(kiln_dropout(x, 1, true, &g), KILN_ALL_DIMS, false), 0, 0);
    kiln_scope_end();
}

static void test_attention(void **state)
{
    (void)state;
    kiln_scope_begin();
    /* One head, L = 2, S = 3, D = 2; written out: softmax(q k^T / sqrt 2) v. */
    float q[4] = {1, 0, 0, 1}, k[6] = {1, 0, 0, 1, 1, 1}, v[6] = {1, 2, 3, 4, 5, 6};
    kiln_tensor *Q = kiln_from_data(test_dev, KILN_F32, KILN_SHAPE(1, 2, 2), q, sizeof q);
    kiln_tensor *K = kiln_from_data(test_dev, KILN_F32, KILN_SHAPE(1, 3, 2), k, sizeof k);
    kiln_tensor *V = kiln_from_data(test_dev, KILN_F32, KILN_SHAPE(1, 3, 2), v, sizeof v);
    float want[4], want_causal[4];
    for (int i = 0; i < 2; i++) {
        for (int causal = 0; causal < 2; causal++) {
            double sc[3], mx = -INFINITY, z = 0;
            for (int j = 0; j < 3; j++) {
                sc[j] = (q[i * 2] * k[j * 2] + q[i * 2 + 1] * k[j * 2 + 1]) / sqrt(2.0);
                if (causal && j > i)
                    sc[j] = -INFINITY;
                mx = fmax(mx, sc[j]);
            }
            for (int j = 0; j < 3; j++)
                z += exp(sc[j] - mx);
            for (int c = 0; c < 2; c++) {
                double acc = 0;
                for (int j = 0; j < 3; j++)
                    acc += exp(sc[j] - mx) / z * v[j * 2 + c];
                (causal ? want_causal : want)[i * 2 + c] = (float)acc;
            }
        }
    }
    kiln_tensor *o = kiln_scaled_dot_product_attention(Q, K, V, NULL, false, 0);
    EXPECT_SHAPE(o, 1, 2, 2);
    expect_f32(o, want, 4, 1e-5);
    expect_f32(kiln_scaled_dot_product_attention(Q, K, V, NULL, true, 0), want_causal, 4, 1e-5);
    /* The same causal mask given as a bool mask, and as an additive float mask. */
    kiln_tensor *keep = kiln_from_data(test_dev, KILN_BOOL, KILN_SHAPE(2, 3), (uint8_t[]){1, 0, 0, 1, 1, 0}, 6);
    expect_f32(kiln_scaled_dot_product_attention(Q, K, V, keep, false, 0), want_causal, 4, 1e-5);
    kiln_tensor *add = TF32(KILN_SHAPE(2, 3), 0, -INFINITY, -INFINITY, 0, 0, -INFINITY);
    expect_f32(kiln_scaled_dot_product_attention(Q, K, V, add, false, 0), want_causal, 4, 1e-5);
    kiln_tensor *K3 = kiln_ones(test_dev, KILN_F32, KILN_SHAPE(1, 3, 3));
    assert_null(kiln_scaled_dot_product_attention(Q, K3, V, NULL, false, 0));
    expect_error("scaled_dot_product_attention");
    kiln_scope_end();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv2d),
        cmocka_unit_test(test_conv1d_and_transpose),
        cmocka_unit_test(test_pooling),
        cmocka_unit_test(test_softmax_and_norms),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_attention),
    };
    return cmocka_run_group_tests(tests, test_group_setup, test_group_teardown);
}
