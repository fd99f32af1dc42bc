/*
 * tests/nn/test-reference.c — layer outputs against PyTorch. The fixture
 * (tests/fixtures/nn/reference.safetensors, from gen_nn_reference.py) holds each
 * case's state_dict, inputs and outputs; the weights load into the kiln layer by
 * name, so this also checks that parameter names match PyTorch's.
 */
#include "nn-test-util.h"

#define REF_PATH KILN_SOURCE_ROOT "/tests/fixtures/nn/reference.safetensors"

static kiln_safetensors *ref;

static int setup(void **state)
{
    if (test_group_setup(state) < 0)
        return -1;
    ref = kiln_safetensors_open(REF_PATH);
    if (!ref)
        fprintf(stderr, "cannot open %s: %s\n", REF_PATH, kiln_error());
    return ref ? 0 : -1;
}

static int teardown(void **state)
{
    kiln_safetensors_close(ref);
    return test_group_teardown(state);
}

static kiln_tensor *ref_get(const char *cas, const char *what)
{
    char name[128];
    snprintf(name, sizeof name, "%s.%s", cas, what);
    if (kiln_safetensors_find(ref, name) < 0)
        return NULL;
    kiln_tensor *t = kiln_safetensors_load(ref, name, test_dev);
    if (!t)
        fail_msg("load %s: %s", name, kiln_error());
    return t;
}

/* Load every "case.<key>" that is not an input/output into m, strictly. */
static void load_weights(kiln_module *m, const char *cas)
{
    int n = kiln_safetensors_count(ref);
    const char **names = calloc((size_t)n, sizeof *names);
    kiln_tensor **ts = calloc((size_t)n, sizeof *ts);
    int k = 0;
    size_t plen = strlen(cas);
    for (int i = 0; i < n; i++) {
        const char *nm = kiln_safetensors_name(ref, i);
        if (strncmp(nm, cas, plen) || nm[plen] != '.')
            continue;
        const char *key = nm + plen + 1;
        if ((!strncmp(key, "in", 2) && key[2] >= '0' && key[2] <= '9') ||
            (!strncmp(key, "out", 3) && key[3] >= '0' && key[3] <= '9') ||
            !strncmp(key, "after_", 6) || !strncmp(key, "causal_", 7))
            continue;
        names[k] = key;
        ts[k] = kiln_safetensors_load(ref, nm, test_dev);
        assert_non_null(ts[k]);
        k++;
    }
    kiln_load_report rep;
    if (kiln_module_load_state_dict(m, k, names, ts, true, &rep) < 0)
        fail_msg("load %s: %s", cas, kiln_error());
    for (int i = 0; i < k; i++)
        kiln_tensor_release(ts[i]);
    free(names);
    free(ts);
}

static void expect_close(kiln_tensor *got, kiln_tensor *want, double tol)
{
    assert_non_null(want);
    if (!got)
        fail_msg("forward failed: %s", kiln_error());
    assert_int_equal(kiln_tensor_ndim(got), kiln_tensor_ndim(want));
    for (int i = 0; i < kiln_tensor_ndim(want); i++)
        assert_int_equal(kiln_tensor_dim(got, i), kiln_tensor_dim(want, i));
    size_t n = (size_t)kiln_tensor_numel(want);
    float *w = calloc(n + 1, sizeof *w);
    read_f32(want, w, n);
    /* read_f32 releases its cast; a module-owned tensor must not be the one released
     * inside a scope (the scope would drop the module's reference), so read a copy. */
    expect_f32(kiln_clone(got), w, n, tol);
    free(w);
}

/* Forward with the case's inputs in0.. (max 6) and compare out0.. */
static void run_case(kiln_module *m, const char *cas, int n_in, int n_out, double tol)
{
    kiln_scope_begin();
    kiln_tensor *in[6] = {0}, *out[4] = {0};
    char key[16];
    for (int i = 0; i < n_in; i++) {
        snprintf(key, sizeof key, "in%d", i);
        in[i] = ref_get(cas, key);
    }
    int got = kiln_module_forward_n(m, n_in, in, 4, out);
    if (got < n_out)
        fail_msg("%s: forward gave %d outputs: %s", cas, got, kiln_error());
    for (int i = 0; i < n_out; i++) {
        snprintf(key, sizeof key, "out%d", i);
        expect_close(out[i], ref_get(cas, key), tol);
    }
    kiln_scope_end();
}

static kiln_module *from_json(const char *layer, const char *cfg)
{
    kiln_generator gen = kiln_generator_make(7);
    kiln_module *m = kiln_layer_from_json(layer, cfg, test_dev, &gen);
    if (!m)
        fail_msg("%s: %s", layer, kiln_error());
    return m;
}

static void test_linear_conv(void **state)
{
    (void)state;
    kiln_module *m = from_json("Linear", "{\"in_features\": 6, \"out_features\": 4}");
    load_weights(m, "linear");
    run_case(m, "linear", 1, 1, 1e-5);
    kiln_module_free(m);

    m = from_json("Conv2d", "{\"in_channels\": 3, \"out_channels\": 4, \"kernel_size\": 3, \"stride\": 2, \"padding\": 1}");
    load_weights(m, "conv2d");
    run_case(m, "conv2d", 1, 1, 1e-5);
    kiln_module_free(m);

    m = from_json("ConvTranspose2d", "{\"in_channels\": 4, \"out_channels\": 2, \"kernel_size\": [3, 3], "
                                     "\"stride\": 2, \"padding\": 1, \"output_padding\": 1}");
    load_weights(m, "convt2d");
    run_case(m, "convt2d", 1, 1, 1e-5);
    kiln_module_free(m);
}

static void test_norms(void **state)
{
    (void)state;
    kiln_module *m = from_json("LayerNorm", "{\"normalized_shape\": 5}");
    load_weights(m, "layernorm");
    run_case(m, "layernorm", 1, 1, 1e-5);
    kiln_module_free(m);

    m = from_json("GroupNorm", "{\"num_groups\": 2, \"num_channels\": 4}");
    load_weights(m, "groupnorm");
    run_case(m, "groupnorm", 1, 1, 1e-5);
    kiln_module_free(m);

    /* Training mode: batch statistics, and the running stats move with momentum 0.1. */
    m = from_json("BatchNorm2d", "{\"num_features\": 3}");
    load_weights(m, "bn_train");
    run_case(m, "bn_train", 1, 1, 1e-5);
    kiln_scope_begin();
    expect_close(kiln_module_get(m, "running_mean"), ref_get("bn_train", "after_running_mean"), 1e-5);
    expect_close(kiln_module_get(m, "running_var"), ref_get("bn_train", "after_running_var"), 1e-5);
    assert_int_equal((int)kiln_item(kiln_module_get(m, "num_batches_tracked")), 1);
    kiln_scope_end();
    kiln_module_free(m);

    m = from_json("BatchNorm1d", "{\"num_features\": 3}");
    load_weights(m, "bn_eval");
    kiln_module_train(m, false);
    run_case(m, "bn_eval", 1, 1, 1e-5);
    kiln_module_free(m);
}

static void test_attention(void **state)
{
    (void)state;
    kiln_module *m = from_json("MultiheadAttention", "{\"embed_dim\": 8, \"num_heads\": 2, \"batch_first\": true}");
    load_weights(m, "mha");
    kiln_module_train(m, false);
    run_case(m, "mha", 4, 1, 1e-5);
    /* A boolean attn_mask (true = blocked) equals the causal flag. */
    kiln_scope_begin();
    kiln_tensor *q = ref_get("mha", "in0");
    kiln_tensor *want = ref_get("mha", "causal_out0");
    kiln_tensor *blocked = kiln_triu(kiln_ones(test_dev, KILN_BOOL, KILN_SHAPE(5, 5)), 1);
    kiln_tensor *args[5] = {q, q, q, NULL, blocked}, *y;
    assert_int_equal(kiln_module_forward_n(m, 5, args, 1, &y), 1);
    expect_close(y, want, 1e-5);
    kiln_scope_end();
    kiln_module_free(m);

    kiln_module *c = from_json("MultiheadAttention",
                               "{\"embed_dim\": 8, \"num_heads\": 2, \"batch_first\": true, \"causal\": true}");
    load_weights(c, "mha");
    kiln_scope_begin();
    q = ref_get("mha", "in0");
    expect_close(kiln_module_forward(c, q), ref_get("mha", "causal_out0"), 1e-5);
    kiln_scope_end();
    kiln_module_free(c);
}

static void test_transformer(void **state)
{
    (void)state;
    const char *cfg = "{\"d_model\": 8, \"nhead\": 2, \"dim_feedforward\": 16, \"dropout\": 0.0, \"batch_first\": true}";
    kiln_module *m = from_json("TransformerEncoderLayer", cfg);
    load_weights(m, "encoder");
    kiln_module_train(m, false);
    run_case(m, "encoder", 1, 1, 1e-5);
    kiln_module_free(m);

    m = from_json("TransformerEncoderLayer", "{\"d_model\": 8, \"nhead\": 2, \"dim_feedforward\": 16, \"dropout\": 0.0, "
                                             "\"batch_first\": true, \"norm_first\": true, \"activation\": \"gelu\"}");
    load_weights(m, "encoder_pre");
    kiln_module_train(m, false);
    run_case(m, "encoder_pre", 1, 1, 1e-5);
    kiln_module_free(m);

    m = from_json("TransformerDecoderLayer", cfg);
    load_weights(m, "decoder");
    kiln_module_train(m, false);
    run_case(m, "decoder", 2, 1, 1e-5);
    kiln_module_free(m);
}

static void test_rnn(void **state)
{
    (void)state;
    kiln_module *m = from_json("LSTM", "{\"input_size\": 4, \"hidden_size\": 5, \"num_layers\": 2, \"bidirectional\": true}");
    load_weights(m, "lstm");
    run_case(m, "lstm", 1, 3, 1e-5);
    kiln_module_free(m);

    m = from_json("GRU", "{\"input_size\": 4, \"hidden_size\": 5, \"batch_first\": true}");
    load_weights(m, "gru");
    run_case(m, "gru", 2, 2, 1e-5);
    kiln_module_free(m);
}

/* Names and counts equal PyTorch's for the same architecture. */
static void expect_arch(const char *cas, const char *layer, const char *cfg)
{
    char key[64];
    snprintf(key, sizeof key, "names.%s", cas);
    const char *want = kiln_safetensors_metadata(ref, key);
    assert_non_null(want);
    snprintf(key, sizeof key, "count.%s", cas);
    long long count = atoll(kiln_safetensors_metadata(ref, key));
    kiln_module *m = from_json(layer, cfg);
    /* PyTorch's state_dict lists a module's parameters and buffers together. */
    int n = kiln_module_state_dict(m, NULL, 0);
    kiln_named_tensor *nt = calloc((size_t)n, sizeof *nt);
    kiln_module_state_dict(m, nt, n);
    char got[2048] = "";
    char *w = strdup(want);
    /* Compare as sets: kiln lists parameters before buffers. */
    int nwant = 0;
    for (char *tok = strtok(w, " "); tok; tok = strtok(NULL, " ")) {
        nwant++;
        bool found = false;
        for (int i = 0; i < n; i++)
            found |= !strcmp(nt[i].name, tok);
        if (!found) {
            for (int i = 0; i < n; i++) {
                strcat(got, " ");
                strcat(got, nt[i].name);
            }
            fail_msg("%s: PyTorch name %s missing; kiln has%s", cas, tok, got);
        }
    }
    assert_int_equal(n, nwant);
    assert_int_equal(kiln_module_parameter_count(m, false), count);
    free(w);
    free(nt);
    kiln_module_free(m);
}

static void test_names_and_counts(void **state)
{
    (void)state;
    expect_arch("lstm_8_16_2_bi", "LSTM", "{\"input_size\": 8, \"hidden_size\": 16, \"num_layers\": 2, \"bidirectional\": true}");
    expect_arch("gru_8_16_1", "GRU", "{\"input_size\": 8, \"hidden_size\": 16}");
    expect_arch("mha_16_4", "MultiheadAttention", "{\"embed_dim\": 16, \"num_heads\": 4}");
    expect_arch("bn2d_3", "BatchNorm2d", "{\"num_features\": 3}");
    expect_arch("conv2d_3_8_3", "Conv2d", "{\"in_channels\": 3, \"out_channels\": 8, \"kernel_size\": 3}");
    expect_arch("encoder", "TransformerEncoderLayer", "{\"d_model\": 8, \"nhead\": 2, \"dim_feedforward\": 16}");
    expect_arch("decoder", "TransformerDecoderLayer", "{\"d_model\": 8, \"nhead\": 2, \"dim_feedforward\": 16}");
    /* The LSTM lists in PyTorch's order exactly. */
    kiln_module *m = from_json("LSTM", "{\"input_size\": 8, \"hidden_size\": 16, \"num_layers\": 2, \"bidirectional\": true}");
    EXPECT_NAMES(m, false, kiln_safetensors_metadata(ref, "names.lstm_8_16_2_bi"));
    kiln_module_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear_conv),
        cmocka_unit_test(test_norms),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_transformer),
        cmocka_unit_test(test_rnn),
        cmocka_unit_test(test_names_and_counts),
    };
    return cmocka_run_group_tests_name("nn-reference", tests, setup, teardown);
}
