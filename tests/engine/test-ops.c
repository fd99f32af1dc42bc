/*
 * tests/engine/test-ops.c — values of the front end's ops on the ref backend:
 * creation, elementwise with broadcasting and promotion, reductions, sorting, layout
 * ops, indexing and matmul. Expected values are worked out by hand or by a plain loop.
 */
#include "test-util.h"

#define REL(...) do { kiln_tensor *rel_[] = {__VA_ARGS__}; \
    for (size_t i_ = 0; i_ < sizeof rel_ / sizeof rel_[0]; i_++) kiln_tensor_release(rel_[i_]); } while (0)

static void test_creation(void **state)
{
    (void)state;
    kiln_scope_begin();
    EXPECT_F32(kiln_arange(test_dev, KILN_F32, 0, 1, 0.25), 0, 0, 0.25, 0.5, 0.75);
    EXPECT_F32(kiln_arange(test_dev, KILN_I64, 5, 0, -2), 0, 5, 3, 1);
    EXPECT_F32(kiln_linspace(test_dev, KILN_F32, -1, 1, 5), 1e-7, -1, -0.5, 0, 0.5, 1);
    EXPECT_F32(kiln_eye(test_dev, KILN_F32, 2, 3), 0, 1, 0, 0, 0, 1, 0);
    kiln_tensor *f = kiln_full(test_dev, KILN_I32, KILN_SHAPE(2), 7.9);
    assert_int_equal(kiln_tensor_dtype(f), KILN_I32);
    EXPECT_F32(f, 0, 7, 7);
    kiln_tensor *ol = kiln_ones_like(f);
    EXPECT_F32(ol, 0, 1, 1);
    assert_null(kiln_arange(test_dev, KILN_F32, 0, 1, -1));
    expect_error("arange");
    kiln_tensor *h = kiln_from_data(test_dev, KILN_F16, KILN_SHAPE(2), (uint16_t[]){0x3c00, 0xc000}, 4);
    EXPECT_F32(h, 0, 1, -2);
    assert_near(kiln_item(kiln_sum(h, KILN_ALL_DIMS, false)), -1, 0);
    kiln_scope_end();
}

static void test_unary(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *x = TF32(KILN_SHAPE(4), -2, -0.5, 0.5, 2.5);
    EXPECT_F32(kiln_relu(x), 0, 0, 0, 0.5, 2.5);
    EXPECT_F32(kiln_abs(x), 0, 2, 0.5, 0.5, 2.5);
    EXPECT_F32(kiln_round(x), 0, -2, -0, 0, 2); /* half to even */
    EXPECT_F32(kiln_clamp(x, -1, 1), 0, -1, -0.5, 0.5, 1);
    EXPECT_F32(kiln_leaky_relu(x, 0.1), 1e-7, -0.2, -0.05, 0.5, 2.5);
    EXPECT_F32(kiln_pow_scalar(x, 2), 1e-7, 4, 0.25, 0.25, 6.25);
    EXPECT_F32(kiln_sigmoid(x), 1e-6, 1 / (1 + exp(2)), 1 / (1 + exp(0.5)), 1 / (1 + exp(-0.5)), 1 / (1 + exp(-2.5)));
    EXPECT_F32(kiln_gelu(x, false), 1e-6, -2 * 0.5 * (1 + erf(-2 / sqrt(2))), -0.5 * 0.5 * (1 + erf(-0.5 / sqrt(2))),
               0.5 * 0.5 * (1 + erf(0.5 / sqrt(2))), 2.5 * 0.5 * (1 + erf(2.5 / sqrt(2))));
    EXPECT_F32(kiln_softplus(x, 1, 20), 1e-6, log1p(exp(-2)), log1p(exp(-0.5)), log1p(exp(0.5)), log1p(exp(2.5)));

    /* Integer inputs: floating functions give f32, the rest keep the dtype. */
    kiln_tensor *i = kiln_from_data(test_dev, KILN_I32, KILN_SHAPE(3), (int32_t[]){-3, 0, 4}, 12);
    kiln_tensor *e = kiln_exp(i);
    assert_int_equal(kiln_tensor_dtype(e), KILN_F32);
    EXPECT_F32(e, 1e-6, exp(-3), 1, exp(4));
    kiln_tensor *r = kiln_relu(i);
    assert_int_equal(kiln_tensor_dtype(r), KILN_I32);
    EXPECT_F32(r, 0, 0, 0, 4);
    kiln_tensor *a1 = kiln_add_scalar(i, 2);
    assert_int_equal(kiln_tensor_dtype(a1), KILN_I32);
    kiln_tensor *a2 = kiln_add_scalar(i, 0.5);
    assert_int_equal(kiln_tensor_dtype(a2), KILN_F32);
    EXPECT_F32(a2, 0, -2.5, 0.5, 4.5);
    kiln_tensor *m = kiln_mul_scalar(i, -2);
    EXPECT_F32(m, 0, 6, 0, -8);

    kiln_tensor *b = kiln_from_data(test_dev, KILN_BOOL, KILN_SHAPE(2), (uint8_t[]){1, 0}, 2);
    assert_null(kiln_neg(b));
    expect_error("neg: negation of a bool tensor");
    EXPECT_F32(kiln_logical_not(b), 0, 0, 1);

    kiln_tensor *n = TF32(KILN_SHAPE(3), NAN, INFINITY, 1);
    kiln_tensor *isn = kiln_isnan(n);
    assert_int_equal(kiln_tensor_dtype(isn), KILN_BOOL);
    EXPECT_F32(isn, 0, 1, 0, 0);
    EXPECT_F32(kiln_isinf(n), 0, 0, 1, 0);
    kiln_scope_end();
}

static void test_binary(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *a = TF32(KILN_SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
    kiln_tensor *row = TF32(KILN_SHAPE(3), 10, 20, 30);
    kiln_tensor *col = TF32(KILN_SHAPE(2, 1), 100, 200);
    EXPECT_F32(kiln_add(a, row), 0, 11, 22, 33, 14, 25, 36);
    EXPECT_F32(kiln_sub(col, a), 0, 99, 98, 97, 196, 195, 194);
    kiln_tensor *outer = kiln_mul(col, row); /* [2, 1] * [3] -> [2, 3] */
    EXPECT_SHAPE(outer, 2, 3);
    EXPECT_F32(outer, 0, 1000, 2000, 3000, 2000, 4000, 6000);

    /* Integer true division gives f32; remainder takes the divisor's sign. */
    kiln_tensor *p = kiln_from_data(test_dev, KILN_I64, KILN_SHAPE(4), (int64_t[]){7, -7, 7, -7}, 32);
    kiln_tensor *q = kiln_from_data(test_dev, KILN_I64, KILN_SHAPE(4), (int64_t[]){2, 3, -3, -2}, 32);
    kiln_tensor *d = kiln_div(p, q);
    assert_int_equal(kiln_tensor_dtype(d), KILN_F32);
    EXPECT_F32(d, 1e-7, 3.5, -7.0 / 3, -7.0 / 3, 3.5);
    kiln_tensor *rm = kiln_remainder(p, q);
    assert_int_equal(kiln_tensor_dtype(rm), KILN_I64);
    EXPECT_F32(rm, 0, 1, 2, -2, -1);

    /* Mixed dtypes promote: i32 + f16 -> f16; u8 + i32 -> i32. */
    kiln_tensor *i32 = kiln_full(test_dev, KILN_I32, KILN_SHAPE(2), 3);
    kiln_tensor *h = kiln_full(test_dev, KILN_F16, KILN_SHAPE(2), 0.5);
    kiln_tensor *u8 = kiln_full(test_dev, KILN_U8, KILN_SHAPE(2), 250);
    kiln_tensor *s1 = kiln_add(i32, h);
    assert_int_equal(kiln_tensor_dtype(s1), KILN_F16);
    EXPECT_F32(s1, 0, 3.5, 3.5);
    kiln_tensor *s2 = kiln_add(u8, i32);
    assert_int_equal(kiln_tensor_dtype(s2), KILN_I32);
    EXPECT_F32(s2, 0, 253, 253);

    kiln_tensor *lt = kiln_lt(a, row);
    assert_int_equal(kiln_tensor_dtype(lt), KILN_BOOL);
    kiln_tensor *ge = kiln_ge(a, TF32(KILN_SHAPE(1), 3));
    EXPECT_F32(ge, 0, 0, 0, 1, 1, 1, 1);
    EXPECT_F32(kiln_logical_xor(ge, kiln_gt(a, TF32(KILN_SHAPE(1), 4))), 0, 0, 0, 1, 1, 0, 0);
    EXPECT_F32(kiln_maximum(a, TF32(KILN_SHAPE(1), 3.5)), 0, 3.5, 3.5, 3.5, 4, 5, 6);
    EXPECT_F32(kiln_pow(a, TF32(KILN_SHAPE(1), 2)), 1e-7, 1, 4, 9, 16, 25, 36);

    /* where broadcasts all three; masked_fill writes where the mask is true. */
    kiln_tensor *w = kiln_where(ge, a, kiln_neg(row));
    EXPECT_F32(w, 0, -10, -20, 3, 4, 5, 6);
    EXPECT_F32(kiln_masked_fill(a, kiln_lt(row, TF32(KILN_SHAPE(1), 15)), -1), 0, -1, 2, 3, -1, 5, 6);
    assert_null(kiln_where(a, a, a));
    expect_error("where: condition must be bool");
    kiln_scope_end();
}

static void test_reductions(void **state)
{
    (void)state;
    kiln_scope_begin();
    /* x[i][j][k] = i*12 + j*4 + k over [2, 3, 4] */
    kiln_tensor *x = kiln_reshape(kiln_arange(test_dev, KILN_F32, 0, 24, 1), KILN_SHAPE(2, 3, 4));
    kiln_tensor *s = kiln_sum(x, KILN_DIMS(0, 2), false);
    EXPECT_SHAPE(s, 3);
    float want[3] = {0};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 4; k++)
                want[j] += (float)(i * 12 + j * 4 + k);
    expect_f32(s, want, 3, 0);
    kiln_tensor *sk = kiln_sum(x, KILN_DIMS(-1), true);
    EXPECT_SHAPE(sk, 2, 3, 1);
    EXPECT_F32(sk, 0, 6, 22, 38, 54, 70, 86);
    EXPECT_F32(kiln_mean(x, KILN_DIMS(1), false), 1e-6, 4, 5, 6, 7, 16, 17, 18, 19);
    EXPECT_F32(kiln_max(x, KILN_DIMS(0, 1), false), 0, 20, 21, 22, 23);
    kiln_tensor *v = TF32(KILN_SHAPE(4), 1, 2, 3, 4);
    assert_near(kiln_item(kiln_var(v, KILN_ALL_DIMS, 1, false)), 5.0 / 3, 1e-6);
    assert_near(kiln_item(kiln_var(v, KILN_ALL_DIMS, 0, false)), 1.25, 1e-6);
    assert_near(kiln_item(kiln_std(v, KILN_ALL_DIMS, 1, false)), sqrt(5.0 / 3), 1e-6);
    assert_near(kiln_item(kiln_prod(v, KILN_ALL_DIMS, false)), 24, 0);
    assert_near(kiln_item(kiln_logsumexp(v, KILN_ALL_DIMS, false)), log(exp(1) + exp(2) + exp(3) + exp(4)), 1e-5);
    assert_near(kiln_item(kiln_norm(v, 2, KILN_ALL_DIMS, false)), sqrt(30), 1e-5);
    assert_near(kiln_item(kiln_norm(v, INFINITY, KILN_ALL_DIMS, false)), 4, 0);
    /* Integer sums give i64; integer means give f32. */
    kiln_tensor *iv = kiln_from_data(test_dev, KILN_I32, KILN_SHAPE(3), (int32_t[]){1, 2, 4}, 12);
    kiln_tensor *is = kiln_sum(iv, KILN_ALL_DIMS, false);
    assert_int_equal(kiln_tensor_dtype(is), KILN_I64);
    assert_int_equal(kiln_tensor_ndim(is), 0);
    assert_near(kiln_item(is), 7, 0);
    kiln_tensor *im = kiln_mean(iv, KILN_ALL_DIMS, false);
    assert_int_equal(kiln_tensor_dtype(im), KILN_F32);
    assert_near(kiln_item(im), 7.0 / 3, 1e-6);
    /* ... computed in f64: 2^24 + 1 has no f32 (an f32 copy made this mean 2^24, the tie
     * of 2^24 + 1 rounded to even), and a variance of values near 2^40 is exact. */
    int64_t t24 = INT64_C(1) << 24, t40 = INT64_C(1) << 40;
    kiln_tensor *bm = kiln_from_data(test_dev, KILN_I64, KILN_SHAPE(4),
                                     (int64_t[]){t24 + 1, t24 + 1, t24 + 2, t24 + 2}, 32);
    assert_near(kiln_item(kiln_mean(bm, KILN_ALL_DIMS, false)), 16777218, 0);
    kiln_tensor *bv = kiln_from_data(test_dev, KILN_I64, KILN_SHAPE(3), (int64_t[]){t40, t40 + 1, t40 + 2}, 24);
    assert_near(kiln_item(kiln_var(bv, KILN_ALL_DIMS, 1, false)), 1, 0);
    assert_int_equal(kiln_tensor_dtype(kiln_std(bv, KILN_ALL_DIMS, 1, false)), KILN_F32);
    kiln_tensor *b = kiln_gt(x, TF32(KILN_SHAPE(1), 22));
    EXPECT_F32(kiln_any(b, KILN_DIMS(2), false), 0, 0, 0, 0, 0, 0, 1);
    EXPECT_F32(kiln_all(kiln_ge(x, TF32(KILN_SHAPE(1), 0)), KILN_ALL_DIMS, false), 0, 1);

    kiln_tensor *y = TF32(KILN_SHAPE(2, 3), 3, 9, 1, 7, 7, 2);
    kiln_tensor *am = kiln_argmax(y, 1, false);
    assert_int_equal(kiln_tensor_dtype(am), KILN_I64);
    EXPECT_F32(am, 0, 1, 0); /* first of equal maxima */
    EXPECT_F32(kiln_argmin(y, 0, true), 0, 0, 1, 0);
    EXPECT_F32(kiln_cumsum(y, 1), 0, 3, 12, 13, 7, 14, 16);
    EXPECT_F32(kiln_cumsum(y, 0), 0, 3, 9, 1, 10, 16, 3);

    kiln_tensor *vals, *idx;
    assert_int_equal(kiln_sort(y, 1, false, &vals, &idx), 0);
    EXPECT_F32(vals, 0, 1, 3, 9, 2, 7, 7);
    EXPECT_F32(idx, 0, 2, 0, 1, 2, 0, 1); /* stable: the two 7s keep their order */
    EXPECT_F32(kiln_argsort(y, 0, true), 0, 1, 0, 1, 0, 1, 0);
    assert_int_equal(kiln_topk(y, 2, -1, true, &vals, &idx), 0);
    EXPECT_SHAPE(vals, 2, 2);
    EXPECT_F32(vals, 0, 9, 3, 7, 7);
    EXPECT_F32(idx, 0, 1, 0, 0, 1);
    assert_int_equal(kiln_topk(y, 1, 0, false, &vals, NULL), 0);
    EXPECT_F32(vals, 0, 3, 7, 1);
    assert_int_equal(kiln_topk(y, 4, 1, true, &vals, &idx), -1);
    expect_error("topk: k 4 out of range");
    kiln_scope_end();
}

static void test_layout(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *a = TF32(KILN_SHAPE(2, 2), 1, 2, 3, 4);
    kiln_tensor *b = TF32(KILN_SHAPE(2, 1), 5, 6);
    kiln_tensor *c = kiln_cat((kiln_tensor *[]){a, b}, 2, 1);
    EXPECT_F32(c, 0, 1, 2, 5, 3, 4, 6);
    kiln_tensor *ci = kiln_cat((kiln_tensor *[]){a, kiln_full(test_dev, KILN_I64, KILN_SHAPE(1, 2), 9)}, 2, 0);
    assert_int_equal(kiln_tensor_dtype(ci), KILN_F32);
    EXPECT_F32(ci, 0, 1, 2, 3, 4, 9, 9);
    assert_null(kiln_cat((kiln_tensor *[]){a, b}, 2, 0));
    expect_error("cat: f32[2, 2] and f32[2, 1] differ outside dim 0");
    kiln_tensor *s = kiln_stack((kiln_tensor *[]){a, a}, 2, 2);
    EXPECT_SHAPE(s, 2, 2, 2);
    EXPECT_F32(s, 0, 1, 1, 2, 2, 3, 3, 4, 4);
    EXPECT_F32(kiln_repeat(b, KILN_SHAPE(2, 2)), 0, 5, 5, 6, 6, 5, 5, 6, 6);
    kiln_tensor *r3 = kiln_repeat(a, KILN_SHAPE(2, 1, 1));
    EXPECT_SHAPE(r3, 2, 2, 2);
    EXPECT_F32(r3, 0, 1, 2, 3, 4, 1, 2, 3, 4);
    EXPECT_F32(kiln_flip(a, KILN_DIMS(0)), 0, 3, 4, 1, 2);
    EXPECT_F32(kiln_flip(a, KILN_DIMS(0, 1)), 0, 4, 3, 2, 1);
    kiln_tensor *t = kiln_transpose(a, 0, 1);
    EXPECT_F32(kiln_flip(t, KILN_DIMS(1)), 0, 3, 1, 4, 2);

    kiln_tensor *row = TF32(KILN_SHAPE(1, 3), 1, 2, 3);
    EXPECT_F32(kiln_pad(row, 2, (int64_t[]){2, 1}, KILN_PAD_CONSTANT, -1), 0, -1, -1, 1, 2, 3, -1);
    EXPECT_F32(kiln_pad(row, 2, (int64_t[]){2, 2}, KILN_PAD_REFLECT, 0), 0, 3, 2, 1, 2, 3, 2, 1);
    EXPECT_F32(kiln_pad(row, 2, (int64_t[]){1, 2}, KILN_PAD_REPLICATE, 0), 0, 1, 1, 2, 3, 3, 3);
    EXPECT_F32(kiln_pad(row, 4, (int64_t[]){-1, 0, 0, 1}, KILN_PAD_CONSTANT, 0), 0, 2, 3, 0, 0);
    assert_null(kiln_pad(row, 2, (int64_t[]){3, 0}, KILN_PAD_REFLECT, 0));
    expect_error("reflect padding");

    kiln_tensor *m = kiln_reshape(kiln_arange(test_dev, KILN_F32, 1, 10, 1), KILN_SHAPE(3, 3));
    EXPECT_F32(kiln_tril(m, 0), 0, 1, 0, 0, 4, 5, 0, 7, 8, 9);
    EXPECT_F32(kiln_triu(m, 1), 0, 0, 2, 3, 0, 0, 6, 0, 0, 0);
    EXPECT_F32(kiln_tril(m, -1), 0, 0, 0, 0, 4, 0, 0, 7, 8, 0);

    kiln_tensor *cl = kiln_clone(a);
    assert_false(kiln_tensor_shares_storage(cl, a));
    kiln_tensor *h = kiln_cast(a, KILN_BF16);
    assert_int_equal(kiln_tensor_dtype(h), KILN_BF16);
    EXPECT_F32(h, 0, 1, 2, 3, 4);
    kiln_tensor *same = kiln_to_device(a, test_dev);
    EXPECT_F32(same, 0, 1, 2, 3, 4);
    if (strstr(kiln_backends_compiled(), "cpu")) {
        kiln_device *cpu = kiln_device_open("cpu");
        if (cpu) {
            kiln_tensor *on = kiln_to_device(t, cpu);
            assert_ptr_equal(kiln_tensor_device(on), cpu);
            EXPECT_F32(on, 0, 1, 3, 2, 4);
            assert_null(kiln_add(on, a));
            expect_error("add: tensors on different devices (cpu, ref)");
            kiln_tensor_release(kiln_keep(on));
            kiln_device_close(cpu);
        }
    }
    kiln_scope_end();
}

static void test_indexing(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *x = TF32(KILN_SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
    kiln_tensor *gi = kiln_from_data(test_dev, KILN_I64, KILN_SHAPE(2, 2), (int64_t[]){2, 0, 1, 1}, 32);
    EXPECT_F32(kiln_gather(x, 1, gi), 0, 3, 1, 5, 5);
    kiln_tensor *g0 = kiln_from_data(test_dev, KILN_I32, KILN_SHAPE(1, 3), (int32_t[]){1, 0, 1}, 12);
    EXPECT_F32(kiln_gather(x, 0, g0), 0, 4, 2, 6);

    kiln_tensor *src = TF32(KILN_SHAPE(2, 2), 10, 20, 30, 40);
    EXPECT_F32(kiln_scatter(x, 1, gi, src), 0, 20, 2, 10, 4, 40, 6);
    EXPECT_F32(kiln_scatter_add(x, 1, gi, src), 0, 21, 2, 13, 4, 75, 6);
    EXPECT_F32(x, 0, 1, 2, 3, 4, 5, 6); /* unchanged */

    kiln_tensor *ii = kiln_from_data(test_dev, KILN_I64, KILN_SHAPE(3), (int64_t[]){2, 2, 0}, 24);
    EXPECT_F32(kiln_index_select(x, 1, ii), 0, 3, 3, 1, 6, 6, 4);
    kiln_tensor *bad = kiln_from_data(test_dev, KILN_I64, KILN_SHAPE(1), (int64_t[]){-1}, 8);
    assert_null(kiln_gather(x, 1, kiln_reshape(bad, KILN_SHAPE(1, 1))));
    expect_error("gather: index -1 is out of bounds for size 3");

    kiln_tensor *sa = kiln_slice_assign(x, 1, 0, 3, 2, TF32(KILN_SHAPE(2, 1), -1, -2));
    EXPECT_F32(sa, 0, -1, 2, -1, -2, 5, -2);

    kiln_tensor *cls = kiln_from_data(test_dev, KILN_I64, KILN_SHAPE(3), (int64_t[]){0, 2, 1}, 24);
    kiln_tensor *oh = kiln_one_hot(cls, 3, KILN_F32);
    EXPECT_SHAPE(oh, 3, 3);
    EXPECT_F32(oh, 0, 1, 0, 0, 0, 0, 1, 0, 1, 0);
    kiln_tensor *oh2 = kiln_one_hot(cls, -1, KILN_I64);
    EXPECT_SHAPE(oh2, 3, 3);
    assert_null(kiln_one_hot(cls, 2, KILN_F32));
    expect_error("one_hot: index 2 is out of bounds for size 2");

    kiln_tensor *w = TF32(KILN_SHAPE(4, 2), 0, 1, 10, 11, 20, 21, 30, 31);
    kiln_tensor *e = kiln_embedding(w, kiln_from_data(test_dev, KILN_I32, KILN_SHAPE(2, 2), (int32_t[]){3, 0, 1, 3}, 16));
    EXPECT_SHAPE(e, 2, 2, 2);
    EXPECT_F32(e, 0, 30, 31, 0, 1, 10, 11, 30, 31);
    kiln_scope_end();
}

/* Plain matmul of row-major a [m, k] and b [k, n]. */
static void naive_mm(const float *a, const float *b, float *c, int m, int k, int n)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int p = 0; p < k; p++)
                s += (double)a[i * k + p] * b[p * n + j];
            c[i * n + j] = (float)s;
        }
}

static void test_matmul(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *a = TF32(KILN_SHAPE(2, 3), 1, 2, 3, 4, 5, 6);
    kiln_tensor *b = TF32(KILN_SHAPE(3, 2), 7, 8, 9, 10, 11, 12);
    EXPECT_F32(kiln_matmul(a, b), 0, 58, 64, 139, 154);
    kiln_tensor *v = TF32(KILN_SHAPE(3), 1, 0, -1);
    kiln_tensor *av = kiln_matmul(a, v);
    EXPECT_SHAPE(av, 2);
    EXPECT_F32(av, 0, -2, -2);
    kiln_tensor *va = kiln_matmul(TF32(KILN_SHAPE(2), 1, -1), a);
    EXPECT_SHAPE(va, 3);
    EXPECT_F32(va, 0, -3, -3, -3);
    kiln_tensor *dot = kiln_matmul(v, v);
    assert_int_equal(kiln_tensor_ndim(dot), 0);
    assert_near(kiln_item(dot), 2, 0);
    assert_null(kiln_matmul(a, a));
    expect_error("matmul: f32[2, 3] and f32[2, 3] cannot be multiplied (3 != 2)");

    /* Batch broadcast [2, 1, 2, 3] x [3, 3, 2] -> [2, 3, 2, 2] against a plain loop. */
    kiln_generator g = kiln_generator_make(5);
    kiln_tensor *A = kiln_rand_normal(test_dev, KILN_F32, KILN_SHAPE(2, 1, 2, 3), 0, 1, &g);
    kiln_tensor *B = kiln_rand_normal(test_dev, KILN_F32, KILN_SHAPE(3, 3, 2), 0, 1, &g);
    kiln_tensor *C = kiln_matmul(A, B);
    EXPECT_SHAPE(C, 2, 3, 2, 2);
    float ha[12], hb[18], want[24];
    read_f32(A, ha, 12);
    read_f32(B, hb, 18);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            naive_mm(ha + i * 6, hb + j * 6, want + (i * 3 + j) * 4, 2, 3, 2);
    expect_f32(C, want, 24, 1e-5);
    /* A transposed (non-contiguous) operand and an integer one. */
    kiln_tensor *bt = kiln_transpose(TF32(KILN_SHAPE(2, 3), 7, 9, 11, 8, 10, 12), 0, 1);
    EXPECT_F32(kiln_matmul(a, bt), 0, 58, 64, 139, 154);
    kiln_tensor *ai = kiln_cast(a, KILN_I64);
    kiln_tensor *ci = kiln_matmul(ai, b);
    assert_int_equal(kiln_tensor_dtype(ci), KILN_F32);
    EXPECT_F32(ci, 0, 58, 64, 139, 154);

    /* linear: x [2, 3] . W^T [3, 2] + b */
    kiln_tensor *W = TF32(KILN_SHAPE(2, 3), 7, 9, 11, 8, 10, 12);
    EXPECT_F32(kiln_linear(a, W, TF32(KILN_SHAPE(2), 1, -1)), 0, 59, 63, 140, 153);
    assert_null(kiln_linear(a, b, NULL));
    expect_error("linear");
    kiln_scope_end();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_creation),
        cmocka_unit_test(test_unary),
        cmocka_unit_test(test_binary),
        cmocka_unit_test(test_reductions),
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_indexing),
        cmocka_unit_test(test_matmul),
    };
    return cmocka_run_group_tests(tests, test_group_setup, test_group_teardown);
}
