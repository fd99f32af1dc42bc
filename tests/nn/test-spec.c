/*
 * tests/nn/test-spec.c — JSON models (the four example specs build and run, invalid
 * specs are refused naming the node), a tiny MLP from a spec trained with plain SGD,
 * initializer statistics, and default configs of every layer round-tripping JSON.
 */
#include "nn-test-util.h"

#define SPEC_DIR KILN_SOURCE_ROOT "/examples/specs/"

static void run_example(const char *file, kiln_tensor *x, int64_t rows, int64_t cols, const char *first_param)
{
    kiln_generator gen = kiln_generator_make(11);
    kiln_module *m = kiln_model_from_json_file(file, test_dev, &gen);
    if (!m)
        fail_msg("%s: %s", file, kiln_error());
    assert_non_null(kiln_module_lookup(m, first_param));
    assert_true(kiln_module_parameter_count(m, false) > 0);
    kiln_scope_begin();
    kiln_tensor *y = kiln_module_forward(m, x);
    if (!y)
        fail_msg("%s forward: %s", file, kiln_error());
    EXPECT_SHAPE(y, rows, cols);
    kiln_module_train(m, false);
    EXPECT_SHAPE(kiln_module_forward(m, x), rows, cols);
    kiln_scope_end();
    kiln_module_free(m);
}

static void test_examples(void **state)
{
    (void)state;
    kiln_generator gen = kiln_generator_make(3);
    kiln_scope_begin();
    run_example(SPEC_DIR "mlp.json", kiln_rand_normal(test_dev, KILN_F32, KILN_SHAPE(5, 16), 0, 1, &gen), 5, 4,
                "fc1.weight");
    run_example(SPEC_DIR "cnn.json", kiln_rand_normal(test_dev, KILN_F32, KILN_SHAPE(2, 1, 16, 16), 0, 1, &gen), 2,
                10, "bn1.running_mean");
    run_example(SPEC_DIR "resnet_small.json", kiln_rand_normal(test_dev, KILN_F32, KILN_SHAPE(2, 3, 16, 16), 0, 1, &gen),
                2, 10, "b2_down_bn.weight");
    run_example(SPEC_DIR "transformer_classifier.json",
                kiln_rand_int(test_dev, KILN_I64, KILN_SHAPE(3, 10), 0, 100, &gen), 3, 3,
                "enc1.self_attn.in_proj_weight");
    kiln_scope_end();
}

static void expect_refused(const char *json, const char *needle1, const char *needle2)
{
    kiln_generator gen = kiln_generator_make(1);
    kiln_module *m = kiln_model_from_json(json, test_dev, &gen);
    if (m) {
        kiln_module_free(m);
        fail_msg("spec accepted: %s", json);
    }
    expect_error(needle1);
    if (needle2)
        expect_error(needle2);
}

#define HEAD "{\"inputs\": [\"x\"], \"outputs\": [\"b\"], \"nodes\": ["
#define LIN(name, in, i, o) \
    "{\"name\": \"" name "\", \"layer\": \"Linear\", \"config\": {\"in_features\": " #i ", \"out_features\": " #o "}, \"inputs\": [\"" in "\"]}"

static void test_invalid_specs(void **state)
{
    (void)state;
    expect_refused("{not json", "malformed", NULL);
    /* Text after the spec (a paste gone wrong, two specs run together) used to be ignored and
     * the first value built; whitespace after it is still fine. */
    expect_refused(HEAD LIN("b", "x", 4, 2) "]} this is not JSON {", "text after the JSON value, at byte 147",
                   "\"this is not JSON {\"");
    expect_refused(HEAD LIN("b", "x", 4, 2) "]}{}", "text after the JSON value", "\"{}\"");
    {
        kiln_module *ok = kiln_model_from_json(HEAD LIN("b", "x", 4, 2) "]}\n\t \n", test_dev, NULL);
        if (!ok)
            fail_msg("spec with trailing whitespace: %s", kiln_error());
        kiln_module_free(ok);
    }
    expect_refused(HEAD LIN("a", "x", 4, 4) ", {\"name\": \"b\", \"layer\": \"Lineer\", \"inputs\": [\"a\"]}]}", "'b'",
                   "Lineer");
    expect_refused(HEAD "{\"name\": \"b\", \"layer\": \"Linear\", \"config\": {\"in_features\": 4, \"out_features\": 2, "
                        "\"bais\": true}, \"inputs\": [\"x\"]}]}",
                   "'b'", "bais");
    expect_refused(HEAD LIN("b", "y", 4, 4) "]}", "'b'", "\"y\"");
    expect_refused(HEAD LIN("a", "b", 4, 4) ", " LIN("b", "a", 4, 4) "]}", "cycle", NULL);
    expect_refused(HEAD LIN("a", "x", 4, 4) ", {\"name\": \"b\", \"op\": \"frobnicate\", \"inputs\": [\"a\"]}]}", "'b'",
                   "frobnicate");
    expect_refused(HEAD LIN("a", "x", 4, 4) ", {\"name\": \"b\", \"op\": \"relu\", \"dim\": 1, \"inputs\": [\"a\"]}]}",
                   "'b'", "dim");
    expect_refused(HEAD LIN("a", "x", 4, 4) ", " LIN("a", "x", 4, 4) "]}", "'a'", NULL);
    /* Shapes that cannot connect: caught by the dry forward, naming the layer node. */
    expect_refused(HEAD LIN("a", "x", 4, 8) ", " LIN("b", "a", 6, 2) "], \"example_inputs\": {\"x\": {\"shape\": [2, 4]}}}",
                   "'b'", "in_features = 6");
    expect_refused(HEAD LIN("a", "x", 4, 8) ", {\"name\": \"b\", \"op\": \"add\", \"inputs\": [\"a\", \"x\"]}], "
                        "\"example_inputs\": {\"x\": {\"shape\": [2, 4]}}}",
                   "'b'", "add");
    expect_refused("{\"inputs\": [\"x\"], \"outputs\": [\"x\"], \"nodes\": [], \"extra\": 1}", "extra", NULL);
    /* A key given twice (cJSON would read the first, other tools the last), at the top and
     * deep in a node's config; the same spec without the repeat builds. */
    expect_refused(HEAD LIN("a", "x", 4, 4) "], \"outputs\": [\"x\"]}", "'outputs' is given twice", "the spec");
    expect_refused(
        HEAD "{\"name\": \"b\", \"layer\": \"Linear\", \"config\": {\"in_features\": 4, \"out_features\": 2, "
             "\"in_features\": 3}, \"inputs\": [\"x\"]}]}",
        "'in_features' is given twice", "nodes[0].config");

    /* A layer node given more (or fewer) inputs than its layer takes: an extra one would
     * never reach the layer. The op check names the op. */
    expect_refused(
        HEAD "{\"name\": \"b\", \"layer\": \"Linear\", \"config\": {\"in_features\": 4, \"out_features\": 2}, "
             "\"inputs\": [\"x\", \"x\"]}]}",
        "node 'b'", "layer Linear takes 1 input (got 2)");
    expect_refused(HEAD "{\"name\": \"b\", \"layer\": \"TransformerDecoderLayer\", \"config\": {\"d_model\": 4, "
                        "\"nhead\": 1}, \"inputs\": [\"x\"]}]}",
                   "node 'b'", "layer TransformerDecoderLayer takes 2 to 6 inputs (got 1)");
    expect_refused(HEAD
                   "{\"name\": \"b\", \"layer\": \"GRU\", \"config\": {\"input_size\": 4, \"hidden_size\": 2}, "
                   "\"inputs\": [\"x\", \"x\", \"x\"]}]}",
                   "node 'b'", "layer GRU takes 1 to 2 inputs (got 3)");
    expect_refused(HEAD "{\"name\": \"b\", \"op\": \"relu\", \"inputs\": [\"x\", \"x\"]}]}", "node 'b'",
                   "op relu takes 1 input (got 2)");
    expect_refused(HEAD "{\"name\": \"b\", \"op\": \"sub\", \"inputs\": [\"x\"]}]}", "node 'b'",
                   "op sub takes 2 inputs (got 1)");
    expect_refused(HEAD "{\"name\": \"b\", \"op\": \"add\", \"inputs\": [\"x\"]}]}", "node 'b'",
                   "op add takes 2 to 64 inputs (got 1)");
    {
        /* A one-input model given three inputs refuses them; (x, NULL) is one input. */
        kiln_module *one = kiln_model_from_json(HEAD LIN("b", "x", 2, 1) "]}", test_dev, NULL);
        assert_non_null(one);
        kiln_scope_begin();
        kiln_tensor *x = TF32(KILN_SHAPE(1, 2), 1.0f, 2.0f), *o[2];
        assert_int_equal(kiln_module_forward_n(one, 3, (kiln_tensor *[]){x, x, x}, 2, o), -1);
        expect_error("Model '(root)': takes 1 input (got 3)");
        assert_int_equal(kiln_module_forward_n(one, 2, (kiln_tensor *[]){x, NULL}, 2, o), 1);
        float w[2], bias;
        read_f32(kiln_module_lookup(one, "b.weight"), w, 2);
        read_f32(kiln_module_lookup(one, "b.bias"), &bias, 1);
        EXPECT_F32(o[0], 1e-6, w[0] + 2 * w[1] + bias);
        kiln_scope_end();
        kiln_module_free(one);
    }

    /* Multi-output nodes: "name:k". */
    kiln_generator gen = kiln_generator_make(2);
    kiln_module *m = kiln_model_from_json(
        "{\"inputs\": [\"x\"], \"outputs\": [\"rnn:1\", \"fc\"], \"nodes\": ["
        "{\"name\": \"rnn\", \"layer\": \"GRU\", \"config\": {\"input_size\": 3, \"hidden_size\": 4, \"batch_first\": true},"
        " \"inputs\": [\"x\"], \"outputs\": 2},"
        "{\"name\": \"last\", \"op\": \"select\", \"dim\": 1, \"index\": -1, \"inputs\": [\"rnn\"]},"
        "{\"name\": \"fc\", \"layer\": \"Linear\", \"config\": {\"in_features\": 4, \"out_features\": 2}, \"inputs\": [\"last\"]}],"
        " \"example_inputs\": {\"x\": {\"shape\": [2, 5, 3]}}}",
        test_dev, &gen);
    if (!m)
        fail_msg("%s", kiln_error());
    EXPECT_NAMES(m, false, "rnn.weight_ih_l0 rnn.weight_hh_l0 rnn.bias_ih_l0 rnn.bias_hh_l0 fc.weight fc.bias");
    kiln_scope_begin();
    kiln_tensor *x = kiln_zeros(test_dev, KILN_F32, KILN_SHAPE(2, 5, 3)), *out[2];
    assert_int_equal(kiln_module_forward_n(m, 1, &x, 2, out), 2);
    EXPECT_SHAPE(out[0], 1, 2, 4);
    EXPECT_SHAPE(out[1], 2, 2);
    kiln_scope_end();
    kiln_module_free(m);
}

/* y = x · w_true + noise-free; an MLP from JSON, SGD inside no-grad, loss must fall. */
static void test_train_mlp(void **state)
{
    (void)state;
    const char *spec = "{\"inputs\": [\"x\"], \"outputs\": [\"out\"], \"nodes\": ["
                       "{\"name\": \"fc1\", \"layer\": \"Linear\", \"config\": {\"in_features\": 4, \"out_features\": 16}, \"inputs\": [\"x\"]},"
                       "{\"name\": \"act\", \"layer\": \"Tanh\", \"inputs\": [\"fc1\"]},"
                       "{\"name\": \"out\", \"layer\": \"Linear\", \"config\": {\"in_features\": 16, \"out_features\": 1}, \"inputs\": [\"act\"]}]}";
    kiln_generator gen = kiln_generator_make(21);
    kiln_module *m = kiln_model_from_json(spec, test_dev, &gen);
    if (!m)
        fail_msg("%s", kiln_error());
    kiln_tensor *x = kiln_keep(kiln_rand_normal(test_dev, KILN_F32, KILN_SHAPE(64, 4), 0, 1, &gen));
    kiln_tensor *w = kiln_keep(kiln_from_data(test_dev, KILN_F32, KILN_SHAPE(4, 1),
                                              (const float[]){0.5f, -1.0f, 0.25f, 2.0f}, 4 * sizeof(float)));
    kiln_tensor *y = kiln_keep(kiln_matmul(x, w));
    int np = kiln_module_parameters(m, NULL, 0);
    assert_int_equal(np, 4);
    double first = 0, last = 0;
    for (int step = 0; step < 30; step++) {
        kiln_scope_begin();
        kiln_tensor *pred = kiln_module_forward(m, x);
        kiln_tensor *loss = kiln_mean(kiln_square(kiln_sub(pred, y)), KILN_ALL_DIMS, false);
        double lv = kiln_item(loss);
        if (step == 0)
            first = lv;
        last = lv;
        assert_int_equal(kiln_backward(loss, NULL), 0);
        kiln_named_tensor ps[4];
        kiln_module_parameters(m, ps, 4);
        kiln_no_grad_begin();
        const char *names[4];
        kiln_tensor *next[4];
        for (int i = 0; i < 4; i++) {
            kiln_tensor *g = kiln_grad(ps[i].tensor);
            if (!g)
                fail_msg("no gradient for %s", ps[i].name);
            names[i] = ps[i].name;
            next[i] = kiln_sub(ps[i].tensor, kiln_mul_scalar(g, 0.1));
        }
        kiln_no_grad_end();
        /* kiln has no in-place update: load the stepped values back by name. */
        assert_int_equal(kiln_module_load_state_dict(m, 4, names, next, true, NULL), 0);
        kiln_scope_end();
    }
    if (!(last < 0.5 * first))
        fail_msg("loss did not fall: %g -> %g", first, last);
    kiln_tensor_release(x);
    kiln_tensor_release(w);
    kiln_tensor_release(y);
    kiln_module_free(m);
}

static void moments(kiln_tensor *t, double *mean, double *std)
{
    size_t n = (size_t)kiln_tensor_numel(t);
    float *v = calloc(n, sizeof *v);
    read_f32(t, v, n);
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; i++) {
        s += v[i];
        s2 += (double)v[i] * v[i];
    }
    *mean = s / (double)n;
    *std = sqrt(s2 / (double)n - *mean * *mean);
    free(v);
}

static void test_init_statistics(void **state)
{
    (void)state;
    kiln_generator gen = kiln_generator_make(99);
    double mean, std;
    kiln_scope_begin();
    /* [out 256, in 512]: fan_in 512, fan_out 256. */
    moments(kiln_init_kaiming_normal(test_dev, KILN_SHAPE(256, 512), 0, KILN_FAN_IN, KILN_GAIN_RELU, &gen), &mean, &std);
    assert_near(mean, 0, 0.005);
    assert_near(std, sqrt(2.0 / 512), 0.02 * sqrt(2.0 / 512));
    moments(kiln_init_kaiming_uniform(test_dev, KILN_SHAPE(256, 512), 0, KILN_FAN_OUT, KILN_GAIN_RELU, &gen), &mean, &std);
    assert_near(std, sqrt(2.0 / 256), 0.02 * sqrt(2.0 / 256));
    moments(kiln_init_xavier_uniform(test_dev, KILN_SHAPE(256, 512), 1.0, &gen), &mean, &std);
    assert_near(std, sqrt(2.0 / 768), 0.02 * sqrt(2.0 / 768));
    moments(kiln_init_xavier_normal(test_dev, KILN_SHAPE(256, 512), kiln_init_gain(KILN_GAIN_TANH, 0), &gen), &mean,
            &std);
    assert_near(std, 5.0 / 3.0 * sqrt(2.0 / 768), 0.02 * 5.0 / 3.0 * sqrt(2.0 / 768));
    /* Conv weights count the receptive field: [64, 32, 3, 3] has fan_in 288. */
    moments(kiln_init_kaiming_normal(test_dev, KILN_SHAPE(64, 32, 3, 3), 0, KILN_FAN_IN, KILN_GAIN_LINEAR, &gen), &mean,
            &std);
    assert_near(std, sqrt(1.0 / 288), 0.03 * sqrt(1.0 / 288));
    assert_near(kiln_init_gain(KILN_GAIN_LEAKY_RELU, 0.2), sqrt(2.0 / 1.04), 1e-12);
    /* PyTorch's Linear default: uniform(±1/sqrt(fan_in)) has std 1/sqrt(3 fan_in). */
    kiln_linear_config lc = {.in_features = 300, .out_features = 400, .bias = true};
    kiln_module *fc = kiln_linear_init(&lc, test_dev, &gen);
    moments(kiln_module_get(fc, "weight"), &mean, &std);
    assert_near(std, 1 / sqrt(900.0), 0.02 / sqrt(900.0));
    kiln_module_free(fc);
    /* Orthogonal: W Wᵀ = I for a wide matrix, scaled by gain². */
    kiln_tensor *q = kiln_init_orthogonal(test_dev, KILN_SHAPE(8, 20), 2.0, &gen);
    kiln_tensor *qq = kiln_matmul(q, kiln_transpose(q, 0, 1));
    float v[64];
    read_f32(qq, v, 64);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 8; j++)
            assert_near(v[i * 8 + j], i == j ? 4.0 : 0.0, 1e-4);
    kiln_scope_end();
}

static void test_all_configs_roundtrip(void **state)
{
    (void)state;
    /* Defaults and one non-default value per type survive JSON; the JSON of every layer's
     * defaults parses back through kiln_layer_from_json's path. */
    for (int i = 0; i < kiln_layer_count(); i++) {
        const char *name = kiln_layer_name(i);
        assert_non_null(name);
        kiln_module *m = kiln_layer_from_json(name, "{\"definitely_not_a_key\": 1}", test_dev, NULL);
        assert_null(m);
        expect_error("definitely_not_a_key");
    }
    kiln_conv_config c = kiln_conv2d_config_default(), d;
    c.in_channels = 3;
    c.out_channels = 6;
    c.kernel_size[0] = 3;
    c.kernel_size[1] = 5;
    c.groups = 3;
    char *j = kiln_conv2d_config_to_json(&c);
    memset(&d, 0x5a, sizeof d);
    assert_int_equal(kiln_conv2d_config_from_json(j, &d), 0);
    assert_int_equal(d.kernel_size[1], 5);
    assert_int_equal(d.groups, 3);
    assert_true(d.bias);
    free(j);
    kiln_layer_norm_config ln;
    assert_int_equal(kiln_layer_norm_config_from_json("{\"normalized_shape\": [4, 5], \"eps\": 1e-6}", &ln), 0);
    assert_int_equal(ln.ndim, 2);
    j = kiln_layer_norm_config_to_json(&ln);
    assert_non_null(strstr(j, "[4,5]"));
    free(j);
    kiln_transformer_config tc;
    assert_int_equal(kiln_transformer_encoder_layer_config_from_json("{\"activation\": \"gelu\"}", &tc), 0);
    assert_int_equal(tc.activation, KILN_ACT_GELU);
    assert_int_equal(tc.dim_feedforward, 2048);
    /* A module remembers its config. */
    kiln_module *m = kiln_layer_from_json("Conv1d", "{\"in_channels\": 2, \"out_channels\": 4, \"kernel_size\": 3}",
                                          test_dev, NULL);
    assert_non_null(m);
    j = kiln_module_config_json(m);
    assert_non_null(strstr(j, "\"kernel_size\":[3]"));
    free(j);
    kiln_module_free(m);
}

/* A node's output goes once its last reader has run: a chain of eight relus over 1 MiB
 * holds about two at a time, not eight (a branch read twice stays until its second
 * reader). Measured on the cpu, whose pool reports its peak in use. */
static void test_values_released_after_last_use(void **state)
{
    (void)state;
    static const char spec[] = "{\"inputs\": [\"x\"], \"nodes\": ["
                               "{\"name\": \"a\", \"op\": \"relu\", \"inputs\": [\"x\"]},"
                               "{\"name\": \"b\", \"op\": \"relu\", \"inputs\": [\"a\"]},"
                               "{\"name\": \"c\", \"op\": \"relu\", \"inputs\": [\"b\"]},"
                               "{\"name\": \"d\", \"op\": \"relu\", \"inputs\": [\"c\"]},"
                               "{\"name\": \"e\", \"op\": \"relu\", \"inputs\": [\"d\"]},"
                               "{\"name\": \"f\", \"op\": \"relu\", \"inputs\": [\"e\"]},"
                               "{\"name\": \"g\", \"op\": \"relu\", \"inputs\": [\"f\"]},"
                               "{\"name\": \"h\", \"op\": \"add\", \"inputs\": [\"g\", \"d\"]}"
                               "], \"outputs\": [\"h\"]}";
    kiln_device *cpu = kiln_device_open("cpu");
    assert_non_null(cpu);
    kiln_generator gen = kiln_generator_make(5);
    kiln_module *m = kiln_model_from_json(spec, cpu, &gen);
    if (!m)
        fail_msg("%s", kiln_error());
    const int64_t mib = 1 << 20;
    kiln_tensor *x = kiln_keep(kiln_rand_normal(cpu, KILN_F32, KILN_SHAPE(256, 1024), 0, 1, &gen));
    float xs[4];
    kiln_scope_begin();
    assert_int_equal(kiln_to_data(kiln_narrow(kiln_reshape(x, KILN_SHAPE(-1)), 0, 0, 4), xs, sizeof xs), 0);
    kiln_scope_end();
    kiln_device_memory before, after;
    assert_int_equal(kiln_device_memory_get(cpu, &before), 0);
    kiln_no_grad_begin();
    kiln_scope_begin();
    kiln_tensor *y = kiln_module_forward(m, x);
    if (!y)
        fail_msg("forward: %s", kiln_error());
    float ys[4];
    assert_int_equal(kiln_to_data(kiln_narrow(kiln_reshape(y, KILN_SHAPE(-1)), 0, 0, 4), ys, sizeof ys), 0);
    kiln_scope_end();
    kiln_no_grad_end();
    assert_int_equal(kiln_device_memory_get(cpu, &after), 0);
    for (int i = 0; i < 4; i++) /* relu^7(x) + relu^4(x) = 2 relu(x) */
        assert_float_equal(ys[i], xs[i] > 0 ? 2 * xs[i] : 0, 1e-6);
    uint64_t grew = after.peak_in_use_bytes - before.in_use_bytes;
    if (grew > (uint64_t)(4 * mib))
        fail_msg("the forward's peak grew by %.2f MiB: values were held past their last reader",
                 (double)grew / (double)mib);
    kiln_tensor_release(x);
    kiln_module_free(m);
    kiln_device_close(cpu);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_examples),
        cmocka_unit_test(test_invalid_specs),
        cmocka_unit_test(test_train_mlp),
        cmocka_unit_test(test_init_statistics),
        cmocka_unit_test(test_all_configs_roundtrip),
        cmocka_unit_test(test_values_released_after_last_use),
    };
    return cmocka_run_group_tests_name("nn-spec", tests, test_group_setup, test_group_teardown);
}
