/*
 * tests/nn/test-module.c — the module tree: names and counts as PyTorch reports them,
 * containers, train/eval and freeze propagation, state dict export and import (strict,
 * lenient, shape and dtype handling), config JSON round trips, and forward errors that
 * name the layer.
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
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear_names_and_count),
        cmocka_unit_test(test_sequential_tree),
        cmocka_unit_test(test_state_dict_roundtrip),
        cmocka_unit_test(test_to_device),
        cmocka_unit_test(test_config_json),
    };
    return cmocka_run_group_tests_name("nn-module", tests, test_group_setup, test_group_teardown);
}
