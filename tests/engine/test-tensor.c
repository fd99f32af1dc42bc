/*
 * tests/engine/test-tensor.c — the front end's bookkeeping: dtype table and promotion,
 * devices, views and strides, scopes, error propagation, size limits and RNG state.
 */
#include <pthread.h>

#include "test-util.h"

static void test_dtype_table(void **state)
{
    (void)state;
    assert_string_equal(kiln_dtype_name(KILN_BF16), "bf16");
    assert_string_equal(kiln_dtype_name((kiln_dtype)99), "?");
    assert_int_equal(kiln_dtype_from_name("i32"), KILN_I32);
    assert_int_equal(kiln_dtype_from_name("float"), -1);
    assert_int_equal(kiln_dtype_size(KILN_F64), 8);
    assert_int_equal(kiln_dtype_size(KILN_F16), 2);
    assert_int_equal(kiln_dtype_size(KILN_BOOL), 1);
    assert_true(kiln_dtype_is_float(KILN_BF16));
    assert_false(kiln_dtype_is_float(KILN_I64));
}

static void test_promotion(void **state)
{
    (void)state;
    struct { kiln_dtype a, b, want; } cases[] = {
        {KILN_F16, KILN_BF16, KILN_F32}, {KILN_BF16, KILN_F16, KILN_F32},
        {KILN_U8, KILN_I32, KILN_I32},   {KILN_I64, KILN_U8, KILN_I64},
        {KILN_I32, KILN_I64, KILN_I64},  {KILN_BOOL, KILN_U8, KILN_U8},
        {KILN_BOOL, KILN_F16, KILN_F16}, {KILN_I64, KILN_F16, KILN_F16},
        {KILN_F32, KILN_F64, KILN_F64},  {KILN_F16, KILN_F32, KILN_F32},
        {KILN_I64, KILN_BF16, KILN_BF16}, {KILN_BOOL, KILN_BOOL, KILN_BOOL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(kiln_promote_types(cases[i].a, cases[i].b), cases[i].want);
        assert_int_equal(kiln_promote_types(cases[i].b, cases[i].a), cases[i].want);
    }
}

static void test_device_open(void **state)
{
    (void)state;
    kiln_device *a = kiln_device_open("ref");
    assert_ptr_equal(a, test_dev); /* same spec, same handle */
    assert_string_equal(kiln_device_name(a), "ref");
    kiln_device_close(a);
    assert_non_null(strstr(kiln_backends_compiled(), "ref"));

    assert_null(kiln_device_open("tpu:0"));
    expect_error("unknown device spec 'tpu:0'");
    assert_null(kiln_device_open("cuda:x"));
    expect_error("bad device index");
    assert_null(kiln_device_open("remote://host/cpu"));
    expect_error("malformed remote spec");
    assert_null(kiln_device_open("remote://host:99999/cpu"));
    expect_error("the port is out of range 1..65535");
    /* Each malformed part is named (backends/remote/remote-spec.c, shared with the backend). */
    static const struct {
        const char *spec, *why;
    } bad_remote[] = {
        {"remote://host:8x/cpu", "the port is not a number"},
        {"remote://host:/cpu", "no port"},
        {"remote://host:80", "no device after the port"},
        {"remote://host:80/", "no device after the port"},
        {"remote://:80/cpu", "no host and port"},
        {"remote://[]:80/cpu", "an IPv6 address goes in brackets before the port"},
        {"remote://[::1]/cpu", "an IPv6 address goes in brackets before the port"},
        {"remote://host:80/cpu/extra", "the device is one name after the port"},
        {"remote://host:80/a234567890123456789012345678901234567890123456789012345678901234",
         "the device name is longer than 63 characters"},
        {"remote://host:0/cpu", "the port is out of range"},
    };
    for (size_t i = 0; i < sizeof bad_remote / sizeof bad_remote[0]; i++) {
        assert_null(kiln_device_open(bad_remote[i].spec));
        expect_error(bad_remote[i].why);
        expect_error("remote://[::1]:8080/cpu"); /* the form is shown */
    }
    /* No HIP backend in this build: the message names it and what is compiled. */
    assert_null(kiln_device_open("hip:0"));
    expect_error("backend 'hip' is not compiled into this build (compiled: ");
    assert_int_equal(kiln_device_sync(test_dev), 0);
}

/* Threads opening, using and closing one spec at once: a device reference is an atomic count,
 * and an open never brings back a device whose last reference went (under AddressSanitizer a
 * device used after its close would be reported). */
#define OPENERS 4
static void *open_use_close(void *arg)
{
    long failures = 0;
    for (int i = 0; i < 300; i++) {
        kiln_device *d = kiln_device_open((const char *)arg);
        kiln_tensor *t = d ? kiln_full(d, KILN_F32, KILN_SHAPE(4), 1.5) : NULL;
        kiln_tensor *u = t ? kiln_add(t, t) : NULL;
        float v[4] = {0};
        if (!u || kiln_to_data(u, v, sizeof v) != 0 || v[3] != 3.0f)
            failures++;
        kiln_tensor_release(u);
        kiln_tensor_release(t);
        kiln_device_close(d); /* often the last reference: the next open makes a new device */
    }
    return (void *)failures;
}

static void test_device_refs_across_threads(void **state)
{
    (void)state;
    pthread_t th[OPENERS];
    for (int i = 0; i < OPENERS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, open_use_close, "cpu?threads=1"), 0);
    long failures = 0;
    for (int i = 0; i < OPENERS; i++) {
        void *r;
        pthread_join(th[i], &r);
        failures += (long)r;
    }
    assert_int_equal(failures, 0);
}

static void test_views_share_storage(void **state)
{
    (void)state;
    kiln_tensor *x = kiln_arange(test_dev, KILN_F32, 0, 24, 1);
    kiln_tensor *r = kiln_reshape(x, KILN_SHAPE(2, 3, 4));
    assert_true(kiln_tensor_shares_storage(x, r));
    assert_int_equal(kiln_tensor_strides(r)[0], 12);
    assert_int_equal(kiln_tensor_strides(r)[1], 4);
    assert_int_equal(kiln_tensor_strides(r)[2], 1);

    kiln_tensor *p = kiln_permute(r, KILN_DIMS(2, 0, 1));
    EXPECT_SHAPE(p, 4, 2, 3);
    assert_int_equal(kiln_tensor_strides(p)[0], 1);
    assert_int_equal(kiln_tensor_strides(p)[1], 12);
    assert_int_equal(kiln_tensor_strides(p)[2], 4);
    assert_false(kiln_tensor_is_contiguous(p));
    assert_true(kiln_tensor_shares_storage(p, x));

    /* slice with step: elements 1, 3 of dim 2 -> strides double, offset moves */
    kiln_tensor *s = kiln_slice(r, 2, 1, 100, 2);
    EXPECT_SHAPE(s, 2, 3, 2);
    assert_int_equal(kiln_tensor_strides(s)[2], 2);
    assert_true(kiln_tensor_shares_storage(s, x));
    EXPECT_F32(s, 0, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23);

    kiln_tensor *s2 = kiln_slice(r, -1, -2, 4, 1); /* Python-style negative start */
    EXPECT_F32(s2, 0, 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23);

    kiln_tensor *n = kiln_narrow(r, 1, 1, 2);
    EXPECT_SHAPE(n, 2, 2, 4);
    EXPECT_F32(n, 0, 4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 20, 21, 22, 23);

    kiln_tensor *u = kiln_unsqueeze(r, 1);
    EXPECT_SHAPE(u, 2, 1, 3, 4);
    kiln_tensor *q = kiln_squeeze(u, 1);
    EXPECT_SHAPE(q, 2, 3, 4);
    kiln_tensor *q2 = kiln_squeeze(u, 0); /* size 2: unchanged, as PyTorch */
    EXPECT_SHAPE(q2, 2, 1, 3, 4);

    kiln_tensor *ar = kiln_arange(test_dev, KILN_F32, 0, 3, 1);
    kiln_tensor *col = kiln_reshape(ar, KILN_SHAPE(3, 1));
    kiln_tensor_release(ar); /* col keeps the storage */
    kiln_tensor *e = kiln_expand(col, KILN_SHAPE(2, -1, 4));
    EXPECT_SHAPE(e, 2, 3, 4);
    assert_int_equal(kiln_tensor_strides(e)[0], 0);
    assert_int_equal(kiln_tensor_strides(e)[2], 0);
    EXPECT_F32(e, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2);

    kiln_tensor *t = kiln_transpose(r, 0, 2);
    EXPECT_SHAPE(t, 4, 3, 2);
    kiln_tensor *f = kiln_flatten(r, 1, -1);
    EXPECT_SHAPE(f, 2, 12);
    assert_true(kiln_tensor_shares_storage(f, x));
    kiln_tensor *uf = kiln_unflatten(f, 1, KILN_SHAPE(-1, 6));
    EXPECT_SHAPE(uf, 2, 2, 6);

    kiln_tensor *parts[4];
    assert_int_equal(kiln_split(x, 10, 0, parts, 4), 3);
    EXPECT_SHAPE(parts[2], 4);
    assert_true(kiln_tensor_shares_storage(parts[2], x));
    EXPECT_F32(parts[2], 0, 20, 21, 22, 23);
    for (int i = 0; i < 3; i++)
        kiln_tensor_release(parts[i]);
    assert_int_equal(kiln_split(x, 10, 0, NULL, 0), 3); /* query */
    assert_int_equal(kiln_split(x, 10, 0, parts, 2), -1);
    assert_int_equal(kiln_chunk(r, 2, 1, parts, 4), 2); /* ceil(3/2) = 2 -> sizes 2, 1 */
    EXPECT_SHAPE(parts[0], 2, 2, 4);
    EXPECT_SHAPE(parts[1], 2, 1, 4);
    EXPECT_F32(parts[1], 0, 8, 9, 10, 11, 20, 21, 22, 23);
    kiln_tensor_release(parts[0]);
    kiln_tensor_release(parts[1]);

    kiln_tensor *all[] = {x, r, p, s, s2, n, u, q, q2, col, e, t, f, uf};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        kiln_tensor_release(all[i]);
}

static void test_reshape_noncontiguous_copies(void **state)
{
    (void)state;
    kiln_tensor *ar = kiln_arange(test_dev, KILN_F32, 0, 6, 1);
    kiln_tensor *x = kiln_reshape(ar, KILN_SHAPE(2, 3));
    kiln_tensor_release(ar);
    kiln_tensor *t = kiln_transpose(x, 0, 1);            /* [3, 2]: 0 3 1 4 2 5 */
    kiln_tensor *flat = kiln_reshape(t, KILN_SHAPE(-1)); /* cannot be a view */
    assert_false(kiln_tensor_shares_storage(flat, x));
    assert_true(kiln_tensor_is_contiguous(flat));
    EXPECT_F32(flat, 0, 0, 3, 1, 4, 2, 5);
    /* Splitting a dim of a transposed tensor is still a view. */
    kiln_tensor *v = kiln_reshape(t, KILN_SHAPE(3, 2, 1));
    assert_true(kiln_tensor_shares_storage(v, x));
    kiln_tensor *c = kiln_contiguous(t);
    assert_false(kiln_tensor_shares_storage(c, x));
    EXPECT_F32(c, 0, 0, 3, 1, 4, 2, 5);
    kiln_tensor *c2 = kiln_contiguous(c); /* already contiguous: a view, no copy */
    assert_ptr_not_equal(c2, c);
    assert_true(kiln_tensor_shares_storage(c2, c));
    /* Wrong counts name the op and both shapes. */
    assert_null(kiln_reshape(x, KILN_SHAPE(4, 2)));
    expect_error("reshape: cannot reshape f32[2, 3] into [4, 2]");
    assert_null(kiln_reshape(x, KILN_SHAPE(-1, -1)));
    expect_error("only one dimension can be -1");
    kiln_tensor *all[] = {x, t, flat, v, c, c2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        kiln_tensor_release(all[i]);
}

/* An object owned outside the scope (a module's buffer, say) passed through ops that
 * have nothing to do: releasing their results early, inside the scope, must not take
 * the owner's reference (this used to free the buffer at scope end). */
static void test_no_op_results_have_their_own_owner(void **state)
{
    (void)state;
    kiln_device *dev = kiln_device_open("ref");
    kiln_tensor *owned = kiln_arange(dev, KILN_F32, 0, 6, 1); /* outside any scope */
    kiln_scope_begin();
    kiln_tensor *same_dtype = kiln_cast(owned, KILN_F32);
    kiln_tensor *same_device = kiln_to_device(owned, dev);
    kiln_tensor *already = kiln_contiguous(owned);
    assert_ptr_not_equal(same_dtype, owned);
    assert_ptr_not_equal(same_device, owned);
    assert_ptr_not_equal(already, owned);
    assert_true(kiln_tensor_shares_storage(same_dtype, owned));
    kiln_tensor_release(same_dtype);
    kiln_tensor_release(same_device);
    kiln_scope_end(); /* releases `already`; `owned` keeps its one reference */
    float v[6];
    assert_int_equal(kiln_to_data(owned, v, sizeof v), 0);
    assert_true(v[0] == 0.0f && v[5] == 5.0f);
    kiln_tensor_release(owned);
    kiln_device_close(dev);
}

static void test_scopes(void **state)
{
    (void)state;
    kiln_tensor *kept, *inner_kept;
    kiln_scope_begin();
    kiln_tensor *a = kiln_ones(test_dev, KILN_F32, KILN_SHAPE(3));
    kiln_tensor *b = kiln_add(a, a);
    kiln_scope_begin();
    kiln_tensor *c = kiln_mul(b, b);       /* 4 */
    inner_kept = kiln_keep(kiln_add(c, a)); /* 5: survives both scopes */
    kiln_scope_end();
    kept = kiln_keep(kiln_sum(b, KILN_ALL_DIMS, false)); /* 6 */
    kiln_tensor *d = kiln_neg(b);
    kiln_tensor_release(d); /* a release of a scope-held tensor is tolerated */
    kiln_tensor *e = kiln_contiguous(b); /* a view of b's storage: an object of its own */
    assert_ptr_not_equal(e, b);
    assert_true(kiln_tensor_shares_storage(e, b));
    kiln_scope_end();
    /* a, b, c, d, e are gone (ASan reports a leak or double free otherwise). */
    assert_near(kiln_item(kept), 6.0, 0);
    EXPECT_F32(inner_kept, 0, 5, 5, 5);
    kiln_tensor_release(kept);
    kiln_tensor_release(inner_kept);
    /* Unbalanced end is harmless. */
    kiln_scope_end();
}

static void test_null_propagation(void **state)
{
    (void)state;
    kiln_error_clear();
    kiln_scope_begin();
    kiln_tensor *a = kiln_ones(test_dev, KILN_F32, KILN_SHAPE(2, 3));
    kiln_tensor *b = kiln_ones(test_dev, KILN_F32, KILN_SHAPE(4));
    kiln_tensor *bad = kiln_add(a, b);
    assert_null(bad);
    expect_error("add: cannot broadcast f32[2, 3] with f32[4]");
    char first[512];
    snprintf(first, sizeof first, "%s", kiln_error());
    kiln_tensor *y = kiln_softmax(kiln_relu(kiln_matmul(bad, a)), -1);
    assert_null(y);
    assert_string_equal(kiln_error(), first); /* the first cause survives the chain */
    assert_null(kiln_sum(NULL, KILN_ALL_DIMS, false));
    assert_null(kiln_cat((kiln_tensor *[]){a, NULL}, 2, 0));
    assert_int_equal(kiln_sort(NULL, 0, false, &y, NULL), -1);
    assert_null(y);
    assert_string_equal(kiln_error(), first);
    kiln_scope_end();
}

static void test_broadcast_errors_and_dims(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *a = kiln_zeros(test_dev, KILN_F32, KILN_SHAPE(2, 3));
    kiln_tensor *b = kiln_zeros(test_dev, KILN_I64, KILN_SHAPE(3, 1, 2));
    assert_null(kiln_mul(a, b));
    expect_error("mul: cannot broadcast f32[2, 3] with i64[3, 1, 2]");
    /* A good broadcast: [2, 3] + [3, 1, 1] -> [3, 2, 3], promoted to f32 */
    kiln_tensor *c = kiln_add(a, kiln_ones(test_dev, KILN_I64, KILN_SHAPE(3, 1, 1)));
    EXPECT_SHAPE(c, 3, 2, 3);
    assert_int_equal(kiln_tensor_dtype(c), KILN_F32);
    assert_null(kiln_sum(a, KILN_DIMS(2), false));
    expect_error("sum: dim 2 out of range for a 2-d tensor");
    assert_null(kiln_sum(a, KILN_DIMS(0, -2), false));
    expect_error("appears twice");
    assert_null(kiln_permute(a, KILN_DIMS(0, 0)));
    expect_error("permute");
    assert_null(kiln_expand(a, KILN_SHAPE(4, 3)));
    expect_error("expand: cannot expand f32[2, 3] to [4, 3]");
    kiln_tensor *idx = kiln_from_data(test_dev, KILN_F32, KILN_SHAPE(1), (float[]){0}, 4);
    assert_null(kiln_index_select(a, 0, idx));
    expect_error("index_select: index must be i64 or i32, got f32[1]");
    kiln_tensor *oob = kiln_from_data(test_dev, KILN_I64, KILN_SHAPE(2), (int64_t[]){0, 2}, 16);
    assert_null(kiln_index_select(a, 0, oob));
    expect_error("index 2 is out of bounds for size 2");
    kiln_scope_end();
}

static void test_size_limits(void **state)
{
    (void)state;
    assert_null(kiln_empty(test_dev, KILN_F32, KILN_SHAPE(INT64_C(1) << 40, INT64_C(1) << 40)));
    expect_error("too large");
    assert_null(kiln_empty(test_dev, KILN_F64, KILN_SHAPE(INT64_C(1) << 61)));
    expect_error("too large");
    assert_null(kiln_zeros(test_dev, KILN_F32, KILN_SHAPE(2, -1)));
    expect_error("negative size");
    assert_null(kiln_zeros(test_dev, KILN_F32, 9, (int64_t[9]){1, 1, 1, 1, 1, 1, 1, 1, 1}));
    expect_error("rank 9");
    kiln_tensor *x = kiln_zeros(test_dev, KILN_F32, KILN_SHAPE(2, 3));
    float small[5];
    assert_int_equal(kiln_to_data(x, small, sizeof small), -1);
    expect_error("to_data: f32[2, 3] holds 24 bytes, buffer has 20");
    assert_null(kiln_from_data(test_dev, KILN_F32, KILN_SHAPE(2, 3), small, sizeof small));
    expect_error("needs 24 bytes, got 20");
    assert_true(isnan(kiln_item(x)));
    expect_error("item");
    /* Empty tensors are fine. */
    kiln_tensor *z = kiln_zeros(test_dev, KILN_F32, KILN_SHAPE(0, 3));
    kiln_tensor *s = kiln_sum(z, KILN_DIMS(0), false);
    EXPECT_F32(s, 0, 0, 0, 0);
    kiln_tensor *m = kiln_max(z, KILN_DIMS(0), false);
    assert_null(m);
    expect_error("max: cannot reduce f32[0, 3] over an empty dim");
    kiln_tensor_release(x);
    kiln_tensor_release(z);
    kiln_tensor_release(s);
}

static void test_describe(void **state)
{
    (void)state;
    char buf[64];
    kiln_tensor *x = kiln_zeros(test_dev, KILN_BF16, KILN_SHAPE(2, 3));
    assert_string_equal(kiln_tensor_describe(x, buf, sizeof buf), "bf16[2, 3]");
    kiln_tensor *s = kiln_full(test_dev, KILN_I32, 0, NULL, 7);
    assert_string_equal(kiln_tensor_describe(s, buf, sizeof buf), "i32[]");
    assert_near(kiln_item(s), 7.0, 0);
    assert_int_equal(kiln_tensor_dim(x, -1), 3);
    assert_int_equal(kiln_tensor_numel(x), 6);
    assert_ptr_equal(kiln_tensor_device(x), test_dev);
    kiln_tensor_release(x);
    kiln_tensor_release(s);
}

static void test_rng_determinism(void **state)
{
    (void)state;
    kiln_generator g1 = kiln_generator_make(42), g2 = kiln_generator_make(42);
    kiln_tensor *a = kiln_rand_uniform(test_dev, KILN_F64, KILN_SHAPE(10), -1, 1, &g1);
    assert_int_equal(g1.offset, 10);
    /* The same ten numbers drawn as 4 + 6. */
    kiln_tensor *b1 = kiln_rand_uniform(test_dev, KILN_F64, KILN_SHAPE(4), -1, 1, &g2);
    kiln_tensor *b2 = kiln_rand_uniform(test_dev, KILN_F64, KILN_SHAPE(6), -1, 1, &g2);
    double va[10], vb[10];
    assert_int_equal(kiln_to_data(a, va, sizeof va), 0);
    assert_int_equal(kiln_to_data(b1, vb, 4 * sizeof(double)), 0);
    assert_int_equal(kiln_to_data(b2, vb + 4, 6 * sizeof(double)), 0);
    double lo = 1, hi = -1;
    for (int i = 0; i < 10; i++) {
        assert_near(va[i], vb[i], 0);
        lo = fmin(lo, va[i]);
        hi = fmax(hi, va[i]);
    }
    assert_true(lo >= -1 && hi < 1 && hi > lo);
    /* A different seed gives different numbers. */
    kiln_generator g3 = kiln_generator_make(43);
    kiln_tensor *c = kiln_rand_uniform(test_dev, KILN_F64, KILN_SHAPE(10), -1, 1, &g3);
    double vc[10];
    assert_int_equal(kiln_to_data(c, vc, sizeof vc), 0);
    int same = 0;
    for (int i = 0; i < 10; i++)
        same += va[i] == vc[i];
    assert_true(same < 10);
    /* Integers stay in range; bernoulli(0) and (1) are constant. */
    kiln_generator g4 = kiln_generator_make(7);
    kiln_tensor *ri = kiln_rand_int(test_dev, KILN_I64, KILN_SHAPE(1000), 3, 6, &g4);
    kiln_tensor *mn = kiln_min(ri, KILN_ALL_DIMS, false), *mx = kiln_max(ri, KILN_ALL_DIMS, false);
    assert_near(kiln_item(mn), 3, 0);
    assert_near(kiln_item(mx), 5, 0);
    kiln_tensor *b0 = kiln_rand_bernoulli(test_dev, KILN_F32, KILN_SHAPE(50), 0, &g4);
    kiln_tensor *s0 = kiln_sum(b0, KILN_ALL_DIMS, false);
    assert_near(kiln_item(s0), 0, 0);
    kiln_tensor *nrm = kiln_rand_normal(test_dev, KILN_F32, KILN_SHAPE(4000), 2, 3, &g4);
    kiln_tensor *mean = kiln_mean(nrm, KILN_ALL_DIMS, false), *sd = kiln_std(nrm, KILN_ALL_DIMS, 1, false);
    assert_true(fabs(kiln_item(mean) - 2) < 0.2);
    assert_true(fabs(kiln_item(sd) - 3) < 0.2);
    assert_null(kiln_rand_uniform(test_dev, KILN_I32, KILN_SHAPE(2), 0, 1, &g4));
    expect_error("rand_uniform");
    kiln_tensor *all[] = {a, b1, b2, c, ri, mn, mx, b0, s0, nrm, mean, sd};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        kiln_tensor_release(all[i]);
}

static void test_refcounts_across_views(void **state)
{
    (void)state;
    /* The storage outlives the base tensor while a view holds it. */
    kiln_tensor *x = kiln_arange(test_dev, KILN_I32, 0, 6, 1);
    kiln_tensor *v = kiln_narrow(x, 0, 4, 2);
    kiln_tensor_release(x);
    EXPECT_F32(v, 0, 4, 5);
    kiln_tensor *r = kiln_tensor_retain(v);
    kiln_tensor_release(v);
    EXPECT_F32(r, 0, 4, 5);
    kiln_tensor_release(r);
    kiln_tensor_release(NULL);
    /* A device closed by the caller stays alive while tensors use it. */
    kiln_device *d = kiln_device_open("ref");
    kiln_tensor *t = kiln_ones(d, KILN_F32, KILN_SHAPE(2));
    kiln_device_close(d);
    EXPECT_F32(t, 0, 1, 1);
    kiln_tensor_release(t);
}

static int host_memory_releases;

static void count_host_release(void *ud)
{
    host_memory_releases++;
    free(ud);
}

static void test_from_host_memory(void **state)
{
    (void)state;
    /* ref keeps tensors in host memory: the caller's floats are the tensor's storage. */
    float *data = aligned_alloc(64, 64);
    assert_non_null(data);
    for (int i = 0; i < 6; i++)
        data[i] = (float)i;
    host_memory_releases = 0;
    kiln_tensor *t = kiln_from_host_memory(test_dev, KILN_F32, KILN_SHAPE(2, 3), data, count_host_release, data);
    assert_non_null(t);
    data[4] = 40.0f; /* no copy was made: the tensor sees the write */
    EXPECT_F32(t, 0, 0, 1, 2, 3, 40, 5);
    kiln_tensor *v = kiln_narrow(t, 1, 1, 2);
    kiln_tensor_release(t);
    assert_int_equal(host_memory_releases, 0); /* the view still holds the storage */
    kiln_tensor_release(v);
    assert_int_equal(host_memory_releases, 1);

    /* Refusals leave the memory with the caller and name what was wrong. */
    char *raw = aligned_alloc(64, 128);
    assert_non_null(raw);
    assert_null(kiln_from_host_memory(test_dev, KILN_F32, KILN_SHAPE(2), raw + 4, count_host_release, NULL));
    assert_non_null(strstr(kiln_error(), "not 64-byte aligned"));
    assert_null(kiln_from_host_memory(NULL, KILN_F32, KILN_SHAPE(2), raw, count_host_release, NULL));
    assert_non_null(strstr(kiln_error(), "device is NULL"));
    assert_null(kiln_from_host_memory(test_dev, KILN_F32, KILN_SHAPE(-2), raw, count_host_release, NULL));
    assert_non_null(strstr(kiln_error(), "negative size"));
    assert_null(kiln_from_host_memory(test_dev, KILN_F32, KILN_SHAPE(2), NULL, count_host_release, NULL));
    assert_non_null(strstr(kiln_error(), "data is NULL"));
    assert_int_equal(host_memory_releases, 1);
    free(raw);

    /* release may be NULL: the memory stays the caller's (here not even from the heap), on
     * ref and on the cpu alike, and the tensor's death leaves it alone */
    static _Alignas(64) float fixed[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    kiln_device *cpu = kiln_device_open("cpu");
    assert_non_null(cpu);
    kiln_device *devs[2] = {test_dev, cpu};
    for (int k = 0; k < 2; k++) {
        kiln_tensor *f = kiln_from_host_memory(devs[k], KILN_F32, KILN_SHAPE(8), fixed, NULL, NULL);
        assert_non_null(f);
        kiln_tensor *doubled = kiln_mul_scalar(f, 2.0);
        float out[8];
        assert_int_equal(kiln_to_data(doubled, out, sizeof out), 0);
        assert_true(out[7] == 16.0f);
        kiln_tensor_release(doubled);
        kiln_tensor_release(f);
    }
    kiln_device_close(cpu);
    assert_true(fixed[0] == 1.0f && fixed[7] == 8.0f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_table),
        cmocka_unit_test(test_promotion),
        cmocka_unit_test(test_device_open),
        cmocka_unit_test(test_device_refs_across_threads),
        cmocka_unit_test(test_views_share_storage),
        cmocka_unit_test(test_reshape_noncontiguous_copies),
        cmocka_unit_test(test_scopes),
        cmocka_unit_test(test_no_op_results_have_their_own_owner),
        cmocka_unit_test(test_null_propagation),
        cmocka_unit_test(test_broadcast_errors_and_dims),
        cmocka_unit_test(test_size_limits),
        cmocka_unit_test(test_describe),
        cmocka_unit_test(test_rng_determinism),
        cmocka_unit_test(test_refcounts_across_views),
        cmocka_unit_test(test_from_host_memory),
    };
    return cmocka_run_group_tests(tests, test_group_setup, test_group_teardown);
}
