/*
 * tests/nn/test-layer-edges.c — layer behaviours PyTorch defines at their edges, on every
 * backend that opens here (ref, cpu, cpu with fusion, vulkan:0): Embedding's padding_idx
 * row gets no gradient (PyTorch: its rows of weight.grad are 0), and MultiheadAttention
 * in f16/bf16 stays in that dtype with bool or float masks (an f32 mask promoted the
 * attention to f32), with the masks doing what they say; so does an f16
 * scaled_dot_product_attention given an f32 float mask. Dropout with p = 1 in training
 * gives zeros that keep the graph (x * 0, as PyTorch): a zero gradient, not none.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kiln/autodiff.h"
#include "kiln/nn.h"
#include "kiln/tensor.h"

#include "edge-devices.h"

/* t (any float dtype) as n doubles. */
static void read_values(const char *spec, const char *what, kiln_tensor *t, int64_t n, double *out)
{
    if (!t)
        fail_msg("%s on %s: no tensor (%s)", what, spec, kiln_error());
    assert_int_equal(kiln_tensor_numel(t), n);
    assert_int_equal(kiln_to_data(kiln_cast(t, KILN_F64), out, (size_t)n * sizeof(double)), 0);
}

/* ---------------------------------------------------------------------- Embedding */

static kiln_tensor *indices(kiln_device *dev, kiln_dtype dt, int n, const int64_t *v)
{
    kiln_tensor *t = kiln_from_data(dev, KILN_I64, KILN_SHAPE(n), v, (size_t)n * sizeof(int64_t));
    assert_non_null(t);
    return kiln_cast(t, dt);
}

static void embedding_cases(kiln_device *dev, const char *spec)
{
    static const kiln_dtype index_dtypes[2] = {KILN_I64, KILN_I32};
    for (int k = 0; k < 2; k++) {
        /* num_embeddings 4, dim 2, padding_idx 0; forward {0, 1, 0} and backward of the
         * sum: torch's weight.grad is [[0, 0], [1, 1], [0, 0], [0, 0]] */
        kiln_generator gen = kiln_generator_make(3);
        kiln_embedding_config c = kiln_embedding_config_default();
        c.num_embeddings = 4;
        c.embedding_dim = 2;
        c.padding_idx = 0;
        kiln_module *m = kiln_embedding_init(&c, dev, &gen);
        assert_non_null(m);
        kiln_tensor *w = kiln_module_get(m, "weight");
        double wv[8], y[6], g[8];
        read_values(spec, "embedding weight", w, 8, wv);
        assert_true(wv[0] == 0 && wv[1] == 0); /* the padding row starts at zero */
        kiln_tensor *out = kiln_module_forward(m, indices(dev, index_dtypes[k], 3, (const int64_t[]){0, 1, 0}));
        read_values(spec, "embedding output", out, 6, y);
        static const int64_t rows[3] = {0, 1, 0};
        for (int i = 0; i < 6; i++)
            assert_true(y[i] == wv[rows[i / 2] * 2 + i % 2]);
        assert_int_equal(kiln_backward(kiln_sum(out, KILN_ALL_DIMS, false), NULL), 0);
        kiln_tensor *gw = kiln_grad(w);
        read_values(spec, "embedding weight grad", gw, 8, g);
        static const double expect[8] = {0, 0, 1, 1, 0, 0, 0, 0};
        for (int i = 0; i < 8; i++)
            if (g[i] != expect[i])
                fail_msg("embedding (%s indices) weight grad on %s: element %d is %g, expected %g",
                         kiln_dtype_name(index_dtypes[k]), spec, i, g[i], expect[i]);
        kiln_tensor_release(gw);
        kiln_module_free(m);
    }

    /* padding_idx 2, indices [[2, 3], [1, 2]] and loss sum(y * [1..8]): each looked-up
     * row gets the weights of its positions, row 2 nothing (torch: [[0, 0], [5, 6],
     * [0, 0], [3, 4]]) */
    kiln_generator gen = kiln_generator_make(4);
    kiln_embedding_config c = kiln_embedding_config_default();
    c.num_embeddings = 4;
    c.embedding_dim = 2;
    c.padding_idx = 2;
    kiln_module *m = kiln_embedding_init(&c, dev, &gen);
    assert_non_null(m);
    int64_t iv[4] = {2, 3, 1, 2};
    kiln_tensor *idx = kiln_from_data(dev, KILN_I64, KILN_SHAPE(2, 2), iv, sizeof iv);
    kiln_tensor *out = kiln_module_forward(m, idx);
    assert_non_null(out);
    kiln_tensor *scale = kiln_reshape(kiln_arange(dev, KILN_F32, 1, 9, 1), KILN_SHAPE(2, 2, 2));
    assert_int_equal(kiln_backward(kiln_sum(kiln_mul(out, scale), KILN_ALL_DIMS, false), NULL), 0);
    double g[8];
    kiln_tensor *gw = kiln_grad(kiln_module_get(m, "weight"));
    read_values(spec, "embedding weight grad (padding 2)", gw, 8, g);
    static const double expect[8] = {0, 0, 5, 6, 0, 0, 3, 4};
    for (int i = 0; i < 8; i++)
        if (g[i] != expect[i])
            fail_msg("embedding padding_idx 2 weight grad on %s: element %d is %g, expected %g", spec, i, g[i],
                     expect[i]);
    kiln_tensor_release(gw);
    kiln_module_free(m);
}

static void test_embedding_padding_row_untrained(void **state)
{
    (void)state;
    on_each_device(embedding_cases);
}

/* ------------------------------------------------------------------------ dropout */

static void dropout_all_cases(kiln_device *dev, const char *spec)
{
    kiln_scope_begin();
    kiln_generator gen = kiln_generator_make(5);
    kiln_tensor *x = kiln_requires_grad(kiln_from_data(dev, KILN_F32, KILN_SHAPE(3), (float[]){1, -2, 3}, 12),
                                        true);
    kiln_tensor *y = kiln_dropout(x, 1.0, true, &gen);
    if (!y || !kiln_tensor_requires_grad(y))
        fail_msg("%s: dropout(p = 1) in training must keep the graph: %s", spec, y ? "no grad" : kiln_error());
    float v[3];
    assert_int_equal(kiln_to_data(y, v, sizeof v), 0);
    assert_true(v[0] == 0 && v[1] == 0 && v[2] == 0);
    assert_int_equal(kiln_backward(kiln_sum(kiln_mul_scalar(y, 2), KILN_ALL_DIMS, false), NULL), 0);
    kiln_tensor *g = kiln_grad(x);
    assert_non_null(g);
    assert_int_equal(kiln_to_data(g, v, sizeof v), 0);
    if (!(v[0] == 0 && v[1] == 0 && v[2] == 0))
        fail_msg("%s: dropout(p = 1) gradient %g %g %g, want zeros", spec, v[0], v[1], v[2]);
    kiln_scope_end();
}

static void test_dropout_all_keeps_graph(void **state)
{
    (void)state;
    on_each_device(dropout_all_cases);
}

/* ------------------------------------------------------------- MultiheadAttention */

static kiln_tensor *cast_param(void *ud, const char *name, kiln_tensor *t, bool is_buffer)
{
    (void)name;
    (void)is_buffer;
    return kiln_keep(kiln_detach(kiln_cast(t, *(const kiln_dtype *)ud)));
}

static kiln_module *mha(kiln_device *dev, kiln_dtype dt)
{
    kiln_generator gen = kiln_generator_make(11);
    kiln_mha_config c = kiln_mha_config_default();
    c.embed_dim = 4;
    c.num_heads = 2;
    c.batch_first = true;
    kiln_module *m = kiln_mha_init(&c, dev, &gen);
    assert_non_null(m);
    if (dt != KILN_F32)
        assert_int_equal(kiln_module_map(m, cast_param, &dt), 0);
    return m;
}

static kiln_tensor *attend(const char *spec, kiln_module *m, kiln_tensor *q, kiln_tensor *kv, kiln_tensor *kpm,
                           kiln_tensor *am)
{
    kiln_tensor *in[5] = {q, kv, kv, kpm, am}, *out[1] = {NULL};
    if (kiln_module_forward_n(m, 5, in, 1, out) != 1)
        fail_msg("MultiheadAttention forward on %s: %s", spec, kiln_error());
    return out[0];
}

static void mha_cases(kiln_device *dev, const char *spec)
{
    kiln_generator gen = kiln_generator_make(12);
    kiln_tensor *q = kiln_rand_normal(dev, KILN_F32, KILN_SHAPE(1, 3, 4), 0, 1, &gen);
    kiln_tensor *kv = kiln_rand_normal(dev, KILN_F32, KILN_SHAPE(1, 3, 4), 0, 1, &gen);
    /* key 2 is padding: as a bool mask (true = ignore) and as its float (additive) form */
    uint8_t pad[3] = {0, 0, 1};
    kiln_tensor *kpm_bool = kiln_from_data(dev, KILN_BOOL, KILN_SHAPE(1, 3), pad, sizeof pad);
    kiln_tensor *kpm_float = kiln_masked_fill(kiln_zeros(dev, KILN_F32, KILN_SHAPE(1, 3)), kpm_bool, -INFINITY);
    /* query 0 may not see key 1: bool and float attn_mask */
    uint8_t block[9] = {0, 1, 0, 0, 0, 0, 0, 0, 0};
    kiln_tensor *am_bool = kiln_from_data(dev, KILN_BOOL, KILN_SHAPE(3, 3), block, sizeof block);
    kiln_tensor *am_float = kiln_masked_fill(kiln_zeros(dev, KILN_F32, KILN_SHAPE(3, 3)), am_bool, -INFINITY);

    /* In f32 the masks do what they say: ignoring key 2 equals attending over keys 0
     * and 1 alone. */
    kiln_module *m32 = mha(dev, KILN_F32);
    double a[12], b[12];
    read_values(spec, "mha f32 key_padding_mask", attend(spec, m32, q, kv, kpm_bool, NULL), 12, a);
    read_values(spec, "mha f32 keys 0-1", attend(spec, m32, q, kiln_narrow(kv, 1, 0, 2), NULL, NULL), 12, b);
    for (int i = 0; i < 12; i++)
        if (!(fabs(a[i] - b[i]) <= 1e-5 * (1 + fabs(b[i]))))
            fail_msg("mha f32 on %s: masked key 2 gives %g at %d, keys 0-1 alone %g", spec, a[i], i, b[i]);

    static const kiln_dtype halves[2] = {KILN_F16, KILN_BF16};
    kiln_tensor *variants[4][2] = {{kpm_bool, NULL}, {kpm_float, NULL}, {NULL, am_bool}, {kpm_bool, am_float}};
    static const char *const names[4] = {"bool key_padding_mask", "float key_padding_mask", "bool attn_mask",
                                         "bool key_padding_mask + float attn_mask"};
    for (int h = 0; h < 2; h++) {
        kiln_dtype dt = halves[h];
        double tol = dt == KILN_F16 ? 1e-2 : 6e-2;
        kiln_module *mh = mha(dev, dt);
        for (int v = 0; v < 4; v++) {
            kiln_tensor *yh = attend(spec, mh, kiln_cast(q, dt), kiln_cast(kv, dt), variants[v][0],
                                     variants[v][1]);
            if (kiln_tensor_dtype(yh) != dt)
                fail_msg("mha %s with %s on %s: output is %s", kiln_dtype_name(dt), names[v], spec,
                         kiln_dtype_name(kiln_tensor_dtype(yh)));
            /* the same attention as the f32 module's, to the half dtype's rounding */
            read_values(spec, "mha half", yh, 12, a);
            read_values(spec, "mha f32", attend(spec, m32, q, kv, variants[v][0], variants[v][1]), 12, b);
            for (int i = 0; i < 12; i++)
                if (!(fabs(a[i] - b[i]) <= tol * (1 + fabs(b[i]))))
                    fail_msg("mha %s with %s on %s: element %d is %g, f32 gives %g", kiln_dtype_name(dt), names[v],
                             spec, i, a[i], b[i]);
        }
        kiln_module_free(mh);
    }

    /* scaled_dot_product_attention itself: an f32 float mask leaves f16 q, k, v in f16,
     * with the f32 result to f16's rounding */
    kiln_tensor *q16 = kiln_cast(q, KILN_F16), *kv16 = kiln_cast(kv, KILN_F16);
    kiln_tensor *s16 = kiln_scaled_dot_product_attention(q16, kv16, kv16, am_float, false, 0);
    assert_non_null(s16);
    if (kiln_tensor_dtype(s16) != KILN_F16)
        fail_msg("sdpa f16 with an f32 mask on %s: output is %s", spec, kiln_dtype_name(kiln_tensor_dtype(s16)));
    read_values(spec, "sdpa f16", s16, 12, a);
    read_values(spec, "sdpa f32",
                kiln_scaled_dot_product_attention(kiln_cast(q16, KILN_F32), kiln_cast(kv16, KILN_F32),
                                                  kiln_cast(kv16, KILN_F32), am_float, false, 0),
                12, b);
    for (int i = 0; i < 12; i++)
        if (!(fabs(a[i] - b[i]) <= 1e-2 * (1 + fabs(b[i]))))
            fail_msg("sdpa f16 on %s: element %d is %g, f32 gives %g", spec, i, a[i], b[i]);

    /* a mask that is neither bool nor floating is refused, naming it */
    kiln_tensor *bad = kiln_zeros(dev, KILN_I64, KILN_SHAPE(1, 3));
    kiln_tensor *in[4] = {q, kv, kv, bad}, *out[1] = {NULL};
    assert_int_equal(kiln_module_forward_n(m32, 4, in, 1, out), -1);
    assert_non_null(strstr(kiln_error(), "key_padding_mask"));
    kiln_module_free(m32);
}

static void test_mha_half_masks(void **state)
{
    (void)state;
    on_each_device(mha_cases);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding_padding_row_untrained),
        cmocka_unit_test(test_mha_half_masks),
        cmocka_unit_test(test_dropout_all_keeps_graph),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
