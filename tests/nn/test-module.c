/*
 * tests/nn/test-module.c — the module tree: names and counts as PyTorch reports them,
 * containers, train/eval and freeze propagation, state dict export and import (strict,
 * lenient, shape and dtype handling), config JSON round trips, forward errors that
 * name the layer (extra inputs among them), 0-d inputs, the modules' generators, and a
 * Sequential releasing each child's output once the next has taken it.
 */
#include "nn-test-util.h"

static void test_linear_names_and_count(void **state)
{
    (void)state;
    kiln_generator gen = kiln_generator_make(1);
    kiln_linear_config c = kiln_linear_config_default();
    c.in_features = 10;
    c.out_features = 5;
    kiln_module *fc = kiln_linear_init(&c, test_dev, &gen);
    assert_non_null(fc);
    assert_int_equal(kiln_module_parameter_count(fc, false), 55);
    EXPECT_NAMES(fc, false, "weight bias");
    assert_string_equal(kiln_module_type(fc), "Linear");

    c.bias = false;
    kiln_module *nb = kiln_linear_init(&c, test_dev, &gen);
    assert_int_equal(kiln_module_parameter_count(nb, false), 50);
    kiln_module_free(nb);

    kiln_scope_begin();
    kiln_tensor *x = kiln_ones(test_dev, KILN_F32, KILN_SHAPE(3, 10));
    kiln_tensor *y = kiln_module_forward(fc, x);
    EXPECT_SHAPE(y, 3, 5);
    /* Wrong input width: NULL and a message naming the layer. */
    kiln_tensor *bad = kiln_ones(test_dev, KILN_F32, KILN_SHAPE(3, 7));
    assert_null(kiln_module_forward(fc, bad));
    expect_error("Linear");
    expect_error("in_features = 10");
    kiln_scope_end();
    kiln_module_free(fc);
}

static kiln_module *mlp(kiln_generator *gen)
{
    kiln_module *seq = kiln_sequential_new();
    kiln_linear_config c = kiln_linear_config_default();
    c.in_features = 4;
    c.out_features = 8;
    kiln_sequential_append(seq, kiln_linear_init(&c, test_dev, gen));
    kiln_empty_config e = kiln_relu_config_default();
    kiln_sequential_append(seq, kiln_relu_init(&e, test_dev, gen));
    kiln_dropout_config d = kiln_dropout_config_default();
    kiln_sequential_append(seq, kiln_dropout_init(&d, test_dev, gen));
    c.in_features = 8;
    c.out_features = 3;
    kiln_sequential_append(seq, kiln_linear_init(&c, test_dev, gen));
    return seq;
}

static void test_sequential_tree(void **state)
{
    (void)state;
    kiln_generator gen = kiln_generator_make(2);
    kiln_module *seq = mlp(&gen);
    EXPECT_NAMES(seq, false, "0.weight 0.bias 3.weight 3.bias");
    assert_int_equal(kiln_module_parameter_count(seq, false), 4 * 8 + 8 + 8 * 3 + 3);
    assert_int_equal(kiln_module_child_count(seq), 4);
    kiln_module *l3 = kiln_module_find(seq, "3");
    assert_non_null(l3);
    assert_string_equal(kiln_module_path(l3), "3");
    assert_non_null(kiln_module_lookup(seq, "3.bias"));
    assert_null(kiln_module_lookup(seq, "3.nope"));

    /* Train/eval propagates; eval makes dropout the identity, so forward is repeatable. */
    assert_true(kiln_module_is_training(l3));
    kiln_module_train(seq, false);
    assert_false(kiln_module_is_training(l3));
    kiln_scope_begin();
    kiln_tensor *x = kiln_rand_normal(test_dev, KILN_F32, KILN_SHAPE(5, 4), 0, 1, &gen);
    kiln_tensor *y1 = kiln_module_forward(seq, x);
    kiln_tensor *y2 = kiln_module_forward(seq, x);
    float a[15], b[15];
    read_f32(y1, a, 15);
    read_f32(y2, b, 15);
    assert_memory_equal(a, b, sizeof a);
    /* A wrong shape deep inside names the innermost layer by its path. */
    kiln_tensor *bad = kiln_ones(test_dev, KILN_F32, KILN_SHAPE(5, 6));
    assert_null(kiln_module_forward(seq, bad));
    expect_error("Linear '0'");
    kiln_scope_end();

    /* Freeze: the trainable count drops to zero and comes back. */
    assert_int_equal(kiln_module_freeze(seq, true), 0);
    assert_int_equal(kiln_module_parameter_count(seq, true), 0);
    assert_int_equal(kiln_module_freeze(seq, false), 0);
    assert_int_equal(kiln_module_parameter_count(seq, true), 67);
    kiln_module_free(seq);
}

static void test_state_dict_roundtrip(void **state)
{
    (void)state;
    kiln_generator g1 = kiln_generator_make(3), g2 = kiln_generator_make(4);
    kiln_module *a = mlp(&g1), *b = mlp(&g2);
    kiln_module_train(a, false);
    kiln_module_train(b, false);
    int n = kiln_module_state_dict(a, NULL, 0);
    assert_int_equal(n, 4);
    kiln_named_tensor nt[4];
    assert_int_equal(kiln_module_state_dict(a, nt, 4), 4);
    const char *names[4];
    kiln_tensor *ts[4];
    for (int i = 0; i < 4; i++) {
        names[i] = nt[i].name;
        /* f64 sources are converted to the module's f32 on load. */
        ts[i] = kiln_keep(kiln_cast(nt[i].tensor, KILN_F64));
    }
    kiln_load_report rep;
    assert_int_equal(kiln_module_load_state_dict(b, 4, names, ts, true, &rep), 0);
    assert_int_equal(rep.missing + rep.unexpected, 0);
    assert_int_equal(kiln_tensor_dtype(kiln_module_lookup(b, "0.weight")), KILN_F32);

    kiln_scope_begin();
    kiln_tensor *x = kiln_rand_normal(test_dev, KILN_F32, KILN_SHAPE(2, 4), 0, 1, &g1);
    float ya[6], yb[6];
    read_f32(kiln_module_forward(a, x), ya, 6);
    read_f32(kiln_module_forward(b, x), yb, 6);
    for (int i = 0; i < 6; i++)
        assert_near(ya[i], yb[i], 1e-6);
    kiln_scope_end();

    /* Strict: a missing key is an error that names it; lenient reports it. */
    assert_int_equal(kiln_module_load_state_dict(b, 3, names, ts, true, &rep), -1);
    expect_error("3.bias");
    assert_int_equal(kiln_module_load_state_dict(b, 3, names, ts, false, &rep), 0);
    assert_int_equal(rep.missing, 1);
    assert_non_null(strstr(rep.text, "3.bias"));
    const char *names2[4] = {names[0], names[1], names[2], "extra.weight"};
    assert_int_equal(kiln_module_load_state_dict(b, 4, names2, ts, false, &rep), 0);
    assert_int_equal(rep.unexpected, 1);
    assert_int_equal(rep.missing, 1);
    assert_non_null(strstr(rep.text, "extra.weight"));

    /* Shape mismatch: an error naming the key, even when lenient. */
    const char *swapped[2] = {"0.weight", "3.weight"};
    kiln_tensor *wrong[2] = {ts[2], ts[0]};
    assert_int_equal(kiln_module_load_state_dict(b, 2, swapped, wrong, false, &rep), -1);
    expect_error("0.weight");

    /* A NULL name was skipped silently, and a key given twice loaded the first tensor and
     * called the second "unexpected": both are refused in either mode, naming them, and
     * nothing is written. */
    float before[32];
    read_f32(kiln_module_lookup(b, "0.weight"), before, 32);
    const char *with_null[4] = {names[0], NULL, names[2], names[3]};
    for (int strict = 0; strict < 2; strict++) {
        assert_int_equal(kiln_module_load_state_dict(b, 4, with_null, ts, strict, &rep), -1);
        expect_error("load_state_dict: name 1 is NULL");
    }
    const char *twice[4] = {names[2], names[1], names[2], names[3]};
    kiln_tensor *twice_ts[4] = {ts[2], ts[1], ts[2], ts[3]};
    for (int strict = 0; strict < 2; strict++) {
        assert_int_equal(kiln_module_load_state_dict(b, 4, twice, twice_ts, strict, &rep), -1);
        char want[96];
        snprintf(want, sizeof want, "load_state_dict: key \"%s\" is given twice (names 0 and 2)", names[2]);
        expect_error(want);
    }
    float after[32];
    read_f32(kiln_module_lookup(b, "0.weight"), after, 32);
    assert_memory_equal(before, after, sizeof before);
    for (int i = 0; i < 4; i++)
        kiln_tensor_release(ts[i]);

    /* Through a safetensors file. */
    char path[] = "/tmp/kiln-nn-sdXXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(kiln_module_save_safetensors(a, path), 0);
    kiln_generator g3 = kiln_generator_make(9);
    kiln_module *c = mlp(&g3);
    assert_int_equal(kiln_module_load_safetensors(c, path, true, NULL), 0);
    float w1[32], w2[32];
    read_f32(kiln_module_lookup(a, "0.weight"), w1, 32);
    read_f32(kiln_module_lookup(c, "0.weight"), w2, 32);
    assert_memory_equal(w1, w2, sizeof w1);
    unlink(path);
    kiln_module_free(a);
    kiln_module_free(b);
    kiln_module_free(c);
}

static void test_to_device(void **state)
{
    (void)state;
    kiln_device *cpu = kiln_device_open("cpu");
    if (!cpu)
        skip();
    kiln_generator gen = kiln_generator_make(5);
    kiln_module *m = mlp(&gen);
    assert_int_equal(kiln_module_to_device(m, cpu), 0);
    kiln_named_tensor nt[4];
    assert_int_equal(kiln_module_parameters(m, nt, 4), 4);
    for (int i = 0; i < 4; i++)
        assert_ptr_equal(kiln_tensor_device(nt[i].tensor), cpu);
    kiln_module_free(m);
    kiln_device_close(cpu);
}

static void test_config_json(void **state)
{
    (void)state;
    kiln_linear_config c = kiln_linear_config_default();
    assert_true(c.bias);
    c.in_features = 7;
    c.out_features = 2;
    char *j = kiln_linear_config_to_json(&c);
    assert_non_null(j);
    kiln_linear_config d;
    assert_int_equal(kiln_linear_config_from_json(j, &d), 0);
    assert_memory_equal(&c, &d, sizeof c);
    free(j);

    assert_int_equal(kiln_linear_config_from_json("{\"in_features\": 3, \"out_feature\": 2}", &d), -1);
    expect_error("out_feature");
    assert_int_equal(kiln_linear_config_from_json("{\"in_features\": 3.5}", &d), -1);
    expect_error("in_features");
    assert_int_equal(kiln_linear_config_from_json("{\"bias\": 1}", &d), -1);
    expect_error("bias");

    kiln_gelu_config g;
    assert_int_equal(kiln_gelu_config_from_json("{\"approximate\": \"tanh\"}", &g), 0);
    assert_int_equal(g.approximate, KILN_GELU_TANH);
    assert_int_equal(kiln_gelu_config_from_json("{\"approximate\": \"fast\"}", &g), -1);
    expect_error("approximate");

    /* Every registered layer round-trips its default config. */
    for (int i = 0; i < kiln_layer_count(); i++) {
        kiln_module *m = NULL;
        (void)m;
        assert_non_null(kiln_layer_name(i));
    }
    assert_null(kiln_layer_from_json("Linearr", "{}", test_dev, NULL));
    expect_error("Linearr");
    /* a config followed by more text was read as the config alone */
    assert_null(kiln_layer_from_json("Linear", "{\"in_features\": 2, \"out_features\": 1} x", test_dev, NULL));
    expect_error("Linear config: text after the JSON value, at byte 38: \"x\"");
    assert_null(kiln_layer_from_json("Linear", "{\"in_features\": 2,", test_dev, NULL));
    expect_error("Linear config: malformed JSON at byte");
}

/* A layer given more inputs than it takes refuses them, naming itself and the counts
 * (PyTorch raises on an extra argument); trailing NULLs mean "not given", and the good
 * path still gives the same numbers. */
static void test_extra_inputs_refused(void **state)
{
    (void)state;
    kiln_generator gen = kiln_generator_make(9);
    kiln_module *fc = kiln_layer_from_json("Linear", "{\"in_features\": 2, \"out_features\": 1}", test_dev, &gen);
    kiln_module *relu = kiln_layer_from_json("ReLU", NULL, test_dev, NULL);
    kiln_module *gru = kiln_layer_from_json("GRU", "{\"input_size\": 2, \"hidden_size\": 3}", test_dev, &gen);
    kiln_module *lstm = kiln_layer_from_json("LSTM", "{\"input_size\": 2, \"hidden_size\": 3}", test_dev, &gen);
    kiln_module *mha = kiln_layer_from_json("MultiheadAttention", "{\"embed_dim\": 2, \"num_heads\": 1}", test_dev,
                                            &gen);
    assert_true(fc && relu && gru && lstm && mha);
    kiln_scope_begin();
    float w[2], b;
    read_f32(kiln_module_get(fc, "weight"), w, 2);
    read_f32(kiln_module_get(fc, "bias"), &b, 1);
    kiln_tensor *x = TF32(KILN_SHAPE(1, 2), 1.5f, -2.0f), *junk = kiln_ones(test_dev, KILN_F32, KILN_SHAPE(7, 7));
    kiln_tensor *out[4];
    assert_int_equal(kiln_module_forward_n(fc, 2, (kiln_tensor *[]){x, junk}, 4, out), -1);
    assert_null(out[0]);
    expect_error("Linear '(root)'");
    expect_error("takes 1 input (got 2)");
    assert_int_equal(kiln_module_forward_n(relu, 3, (kiln_tensor *[]){x, junk, junk}, 4, out), -1);
    expect_error("ReLU '(root)': takes 1 input (got 3)");
    /* x, NULL: the NULL is "not given"; the answer is w·x + b. */
    assert_int_equal(kiln_module_forward_n(fc, 2, (kiln_tensor *[]){x, NULL}, 4, out), 1);
    EXPECT_F32(out[0], 1e-6, 1.5f * w[0] - 2.0f * w[1] + b);
    assert_int_equal(kiln_module_forward_n(relu, 1, &x, 4, out), 1);
    EXPECT_F32(out[0], 0, 1.5f, 0.0f);
    /* Multi-input layers: up to their own count. */
    kiln_tensor *seq = kiln_ones(test_dev, KILN_F32, KILN_SHAPE(4, 1, 2)),
                *h = kiln_zeros(test_dev, KILN_F32, KILN_SHAPE(1, 1, 3));
    assert_int_equal(kiln_module_forward_n(gru, 3, (kiln_tensor *[]){seq, h, h}, 4, out), -1);
    expect_error("GRU '(root)': takes 1 to 2 inputs (got 3)");
    assert_int_equal(kiln_module_forward_n(gru, 2, (kiln_tensor *[]){seq, h}, 4, out), 2);
    assert_int_equal(kiln_module_forward_n(lstm, 3, (kiln_tensor *[]){seq, h, h}, 4, out), 3);
    assert_int_equal(kiln_module_forward_n(mha, 6, (kiln_tensor *[]){seq, seq, seq, NULL, NULL, seq}, 4, out), -1);
    expect_error("takes 1 to 5 inputs (got 6)");
    assert_int_equal(kiln_module_forward_n(mha, 5, (kiln_tensor *[]){seq, seq, seq, NULL, NULL}, 4, out), 1);
    EXPECT_SHAPE(out[0], 4, 1, 2);
    /* Containers: Sequential hands every input to its first child, which refuses; an empty
     * Sequential and a Residual take one. */
    kiln_module *net = mlp(&gen);
    kiln_tensor *x4 = kiln_ones(test_dev, KILN_F32, KILN_SHAPE(1, 4));
    assert_int_equal(kiln_module_forward_n(net, 2, (kiln_tensor *[]){x4, x4}, 4, out), -1);
    expect_error("Linear '0': takes 1 input (got 2)");
    kiln_module *empty = kiln_sequential_new();
    assert_int_equal(kiln_module_forward_n(empty, 2, (kiln_tensor *[]){x4, x4}, 4, out), -1);
    expect_error("Sequential '(root)'");
    kiln_module *res = kiln_residual_new(kiln_layer_from_json("ReLU", NULL, test_dev, NULL), NULL);
    assert_int_equal(kiln_module_forward_n(res, 2, (kiln_tensor *[]){x, x}, 4, out), -1);
    expect_error("Residual '(root)': takes 1 input (got 2)");
    assert_int_equal(kiln_module_forward_n(res, 1, &x, 4, out), 1);
    EXPECT_F32(out[0], 0, 3.0f, -2.0f);
    kiln_scope_end();
    kiln_module_free(res);
    kiln_module_free(empty);
    kiln_module_free(net);
    kiln_module_free(mha);
    kiln_module_free(lstm);
    kiln_module_free(gru);
    kiln_module_free(relu);
    kiln_module_free(fc);
}

/* 0-d inputs as torch.nn: PReLU keeps the shape; Flatten wraps dims as if the input had
 * one dim, so the default start_dim 1 is an error and Flatten(0, -1) gives [1]. */
static void test_zero_dim_inputs(void **state)
{
    (void)state;
    kiln_module *prelu = kiln_layer_from_json("PReLU", NULL, test_dev, NULL);
    kiln_module *prelu3 = kiln_layer_from_json("PReLU", "{\"num_parameters\": 3, \"init\": 0.5}", test_dev, NULL);
    kiln_module *flat = kiln_layer_from_json("Flatten", NULL, test_dev, NULL);
    kiln_module *flat0 = kiln_layer_from_json("Flatten", "{\"start_dim\": 0}", test_dev, NULL);
    kiln_module *flat_bad = kiln_layer_from_json("Flatten", "{\"start_dim\": 2, \"end_dim\": 1}", test_dev, NULL);
    kiln_module *flat_mid = kiln_layer_from_json("Flatten", "{\"start_dim\": 0, \"end_dim\": -2}", test_dev, NULL);
    assert_true(prelu && prelu3 && flat && flat0 && flat_bad && flat_mid);
    kiln_scope_begin();
    kiln_tensor *neg = tf32(0, NULL, (const float[]){-2.0f}, 1), *pos = tf32(0, NULL, (const float[]){3.0f}, 1);
    kiln_tensor *y = kiln_module_forward(prelu, neg);
    expect_shape(y, 0, NULL);
    EXPECT_F32(y, 0, -0.5f);
    y = kiln_module_forward(prelu, pos);
    expect_shape(y, 0, NULL);
    EXPECT_F32(y, 0, 3.0f);
    /* Other ranks are unchanged. */
    y = kiln_module_forward(prelu, TF32(KILN_SHAPE(2), -4.0f, 1.0f));
    EXPECT_SHAPE(y, 2);
    EXPECT_F32(y, 0, -1.0f, 1.0f);
    y = kiln_module_forward(prelu3, TF32(KILN_SHAPE(1, 3), -2.0f, 2.0f, -4.0f));
    EXPECT_F32(y, 0, -1.0f, 2.0f, -2.0f);
    assert_null(kiln_module_forward(prelu3, neg));
    expect_error("PReLU");

    assert_null(kiln_module_forward(flat, pos));
    expect_error("Flatten '(root)'");
    expect_error("start_dim 1 is out of range (expected in [-1, 0])");
    assert_null(kiln_module_forward(flat, TF32(KILN_SHAPE(2), 1.0f, 2.0f)));
    expect_error("start_dim 1 is out of range (expected in [-1, 0])");
    y = kiln_module_forward(flat0, pos);
    EXPECT_SHAPE(y, 1);
    EXPECT_F32(y, 0, 3.0f);
    kiln_tensor *x = kiln_reshape(
        TF32(KILN_SHAPE(24), 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23),
        KILN_SHAPE(2, 3, 4));
    assert_null(kiln_module_forward(flat_bad, x));
    expect_error("start_dim 2 comes after end_dim 1");
    y = kiln_module_forward(flat, x);
    EXPECT_SHAPE(y, 2, 12);
    EXPECT_F32(kiln_narrow(y, 1, 11, 1), 0, 11.0f, 23.0f);
    y = kiln_module_forward(flat_mid, x);
    EXPECT_SHAPE(y, 6, 4);
    EXPECT_F32(kiln_narrow(y, 0, 5, 1), 0, 20.0f, 21.0f, 22.0f, 23.0f);
    kiln_scope_end();
    kiln_module_free(flat_mid);
    kiln_module_free(flat_bad);
    kiln_module_free(flat0);
    kiln_module_free(flat);
    kiln_module_free(prelu3);
    kiln_module_free(prelu);
}

/* kiln_module_generators lists one stream per module, by path; putting a saved state
 * back makes Dropout draw the same mask again. */
static void test_module_generators(void **state)
{
    (void)state;
    kiln_generator gen = kiln_generator_make(6);
    kiln_module *net = mlp(&gen);
    assert_int_equal(kiln_module_generators(net, NULL, NULL, 0), 5);
    kiln_generator *g[5];
    const char *paths[5];
    assert_int_equal(kiln_module_generators(net, g, paths, 5), 5);
    const char *want[5] = {"", "0", "1", "2", "3"};
    for (int i = 0; i < 5; i++)
        assert_string_equal(paths[i], want[i]);
    kiln_module *drop = kiln_module_find(net, "2");
    kiln_generator *dg;
    assert_int_equal(kiln_module_generators(drop, &dg, NULL, 1), 1);
    assert_ptr_equal(dg, g[3]);
    kiln_generator saved = *dg;
    kiln_scope_begin();
    kiln_tensor *x = kiln_ones(test_dev, KILN_F32, KILN_SHAPE(1, 64));
    float a[64], b[64], c[64];
    read_f32(kiln_module_forward(drop, x), a, 64);
    read_f32(kiln_module_forward(drop, x), b, 64);
    assert_memory_not_equal(a, b, sizeof a);
    *dg = saved;
    read_f32(kiln_module_forward(drop, x), c, 64);
    assert_memory_equal(a, c, sizeof a);
    kiln_scope_end();
    assert_int_equal(kiln_module_generators(NULL, NULL, NULL, 0), -1);
    kiln_module_free(net);
}

/* A Sequential lets each child's output go once the next child has taken it: eight
 * ReLUs over 1 MiB hold about two at a time, not eight; a child that fails midway leaves
 * nothing behind (the pool's in-use figure is back where it was), with an error naming
 * it; and gradients through the Sequential equal those of the same children called one
 * by one with every output kept. Memory measured on the cpu, whose pool reports its peak. */
static void test_sequential_releases_outputs(void **state)
{
    (void)state;
    kiln_device *cpu = kiln_device_open("cpu");
    assert_non_null(cpu);
    kiln_generator gen = kiln_generator_make(12);
    kiln_module *relus = kiln_sequential_new();
    kiln_empty_config e = kiln_relu_config_default();
    for (int i = 0; i < 8; i++)
        assert_int_equal(kiln_sequential_append(relus, kiln_relu_init(&e, cpu, &gen)), 0);
    const int64_t mib = 1 << 20;
    kiln_tensor *x = kiln_keep(kiln_rand_normal(cpu, KILN_F32, KILN_SHAPE(256, 1024), 0, 1, &gen));
    kiln_device_memory before, after;
    assert_int_equal(kiln_device_memory_get(cpu, &before), 0);
    kiln_no_grad_begin();
    kiln_scope_begin();
    kiln_tensor *y = kiln_module_forward(relus, x);
    assert_non_null(y);
    float xs[4], ys[4];
    read_f32(kiln_narrow(kiln_reshape(x, KILN_SHAPE(-1)), 0, 0, 4), xs, 4);
    read_f32(kiln_narrow(kiln_reshape(y, KILN_SHAPE(-1)), 0, 0, 4), ys, 4);
    for (int i = 0; i < 4; i++)
        assert_float_equal(ys[i], xs[i] > 0 ? xs[i] : 0, 0);
    kiln_scope_end();
    assert_int_equal(kiln_device_memory_get(cpu, &after), 0);
    uint64_t grew = after.peak_in_use_bytes - before.in_use_bytes;
    if (grew > (uint64_t)(3 * mib))
        fail_msg("eight ReLUs' peak grew by %.2f MiB: outputs were held past the next child",
                 (double)grew / (double)mib);
    /* a Linear of the wrong width after two ReLUs: NULL, the layer named, nothing kept */
    kiln_linear_config lc = kiln_linear_config_default();
    lc.in_features = 5;
    lc.out_features = 2;
    kiln_module *broken = kiln_sequential_new();
    assert_int_equal(kiln_sequential_append(broken, kiln_relu_init(&e, cpu, &gen)), 0);
    assert_int_equal(kiln_sequential_append(broken, kiln_relu_init(&e, cpu, &gen)), 0);
    assert_int_equal(kiln_sequential_append(broken, kiln_linear_init(&lc, cpu, &gen)), 0);
    assert_int_equal(kiln_device_memory_get(cpu, &before), 0);
    kiln_scope_begin();
    assert_null(kiln_module_forward(broken, x));
    expect_error("Linear '2'");
    kiln_scope_end();
    assert_int_equal(kiln_device_memory_get(cpu, &after), 0);
    assert_int_equal(after.in_use_bytes, before.in_use_bytes);
    kiln_no_grad_end();
    kiln_tensor_release(x);
    kiln_module_free(broken);
    kiln_module_free(relus);
    kiln_device_close(cpu);

    /* gradients: the Sequential against its children called one by one */
    kiln_module *net = mlp(&gen);
    kiln_module_train(net, false); /* no dropout draws */
    float through[32], by_hand[32];
    for (int pass = 0; pass < 2; pass++) {
        kiln_zero_grad(kiln_module_lookup(net, "0.weight"));
        kiln_scope_begin();
        kiln_tensor *in = TF32(KILN_SHAPE(2, 4), 0.5f, -1.0f, 2.0f, 0.25f, -0.75f, 1.5f, 0.1f, -2.0f);
        kiln_tensor *out = in;
        if (pass == 0)
            out = kiln_module_forward(net, in);
        else
            for (int i = 0; i < 4; i++)
                out = kiln_module_forward(kiln_module_child_at(net, i), out);
        assert_int_equal(kiln_backward(kiln_sum(kiln_square(out), 0, NULL, false), NULL), 0);
        read_f32(kiln_grad(kiln_module_lookup(net, "0.weight")), pass == 0 ? through : by_hand, 32);
        kiln_scope_end();
    }
    assert_memory_equal(through, by_hand, sizeof through);
    kiln_module_free(net);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear_names_and_count),
        cmocka_unit_test(test_sequential_tree),
        cmocka_unit_test(test_state_dict_roundtrip),
        cmocka_unit_test(test_to_device),
        cmocka_unit_test(test_config_json),
        cmocka_unit_test(test_extra_inputs_refused),
        cmocka_unit_test(test_zero_dim_inputs),
        cmocka_unit_test(test_module_generators),
        cmocka_unit_test(test_sequential_releases_outputs),
    };
    return cmocka_run_group_tests_name("nn-module", tests, test_group_setup, test_group_teardown);
}
