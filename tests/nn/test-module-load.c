/*
 * tests/nn/test-module-load.c — loading weights writes into the module's own tensors
 * (kiln_module_load_state_dict, under kiln_module_load_safetensors too): an optimizer
 * created before the load (PyTorch's usual order) trains the loaded weights exactly as one
 * created after it and zeroes the module's gradients; sources sharing memory with the
 * module (its own tensors, swapped) load as if copied first; an optimizer whose parameters
 * a device move replaced refuses to step, naming the parameter; a JSON model gives back
 * its spec; a lenient load passes over an extra entry of a dtype kiln cannot hold.
 */
#include "nn-test-util.h"

#include "kiln/loss.h"
#include "kiln/optim.h"

/* Two square Linears, so that two weights of one shape can be swapped. */
static const char NET[] =
    "{\"inputs\": [\"x\"], \"nodes\": ["
    "{\"name\": \"fc1\", \"layer\": \"Linear\", \"config\": {\"in_features\": 4, \"out_features\": 4}, "
    "\"inputs\": [\"x\"]},"
    "{\"name\": \"a\", \"op\": \"relu\", \"inputs\": [\"fc1\"]},"
    "{\"name\": \"fc2\", \"layer\": \"Linear\", \"config\": {\"in_features\": 4, \"out_features\": 4}, "
    "\"inputs\": [\"a\"]}"
    "], \"outputs\": [\"fc2\"]}";

enum {
    NWEIGHTS = 16 + 4 + 16 + 4
};

static kiln_module *net(uint64_t seed)
{
    kiln_generator g = kiln_generator_make(seed);
    kiln_module *m = kiln_model_from_json(NET, test_dev, &g);
    if (!m)
        fail_msg("model: %s", kiln_error());
    return m;
}

/* Every parameter of m, in state-dict order, into out[NWEIGHTS]. */
static void weights(kiln_module *m, float *out)
{
    kiln_named_tensor nt[4];
    assert_int_equal(kiln_module_parameters(m, nt, 4), 4);
    size_t used = 0;
    for (int i = 0; i < 4; i++) {
        size_t n = (size_t)kiln_tensor_numel(nt[i].tensor);
        read_f32(nt[i].tensor, out + used, n);
        used += n;
    }
    assert_int_equal(used, NWEIGHTS);
}

/* Five SGD steps on the same seeded batches, each followed by the optimizer's zero_grad. */
static void train_five(kiln_module *m, kiln_optim *o)
{
    kiln_generator data = kiln_generator_make(77);
    for (int step = 0; step < 5; step++) {
        kiln_scope_begin();
        kiln_tensor *x = kiln_rand_normal(test_dev, KILN_F32, KILN_SHAPE(8, 4), 0, 1, &data);
        kiln_tensor *y = kiln_rand_int(test_dev, KILN_I64, KILN_SHAPE(8), 0, 4, &data);
        kiln_tensor *loss = kiln_loss_cross_entropy(kiln_module_forward(m, x), y, NULL);
        assert_non_null(loss);
        assert_int_equal(kiln_backward(loss, NULL), 0);
        int rc = kiln_optim_step(o);
        if (rc != 1)
            fail_msg("optim_step returned %d: %s", rc, kiln_error());
        kiln_optim_zero_grad(o);
        kiln_scope_end();
    }
}

/* No gradient left on any of m's parameters, or only zeros. */
static void expect_no_grads(kiln_module *m)
{
    kiln_named_tensor nt[4];
    assert_int_equal(kiln_module_parameters(m, nt, 4), 4);
    for (int i = 0; i < 4; i++) {
        kiln_scope_begin();
        kiln_tensor *g = kiln_grad(nt[i].tensor);
        if (g && kiln_item(kiln_sum(kiln_abs(g), KILN_ALL_DIMS, false)) != 0)
            fail_msg("%s still has a gradient after the optimizer's zero_grad", nt[i].name);
        kiln_scope_end();
    }
}

/* The trial's order: model, optimizer, then the load. Five steps must train the loaded weights
 * bit for bit as with the optimizer made after the load; the load used to swap in new tensors,
 * so every step reported an update while the model never changed. */
static void test_optimizer_before_load_trains_loaded_weights(void **state)
{
    (void)state;
    /* The weights to load: another model's state dict, as f64 (converted on load). */
    kiln_module *source = net(2);
    float loaded[NWEIGHTS];
    weights(source, loaded);
    kiln_named_tensor sd[4];
    assert_int_equal(kiln_module_state_dict(source, sd, 4), 4);
    const char *names[4];
    kiln_tensor *values[4];
    for (int i = 0; i < 4; i++) {
        names[i] = sd[i].name;
        values[i] = kiln_keep(kiln_cast(sd[i].tensor, KILN_F64));
    }

    kiln_optim_config c = kiln_optim_config_default(KILN_OPTIM_SGD);
    c.lr = 0.1;
    c.momentum = 0.9;
    kiln_module *before = net(1), *after = net(1);
    kiln_optim *ob = kiln_optim_create_module(&c, before);
    assert_non_null(ob);
    kiln_tensor *held = kiln_optim_param(ob, 0);
    assert_int_equal(kiln_module_load_state_dict(before, 4, names, values, true, NULL), 0);
    assert_int_equal(kiln_module_load_state_dict(after, 4, names, values, true, NULL), 0);
    kiln_optim *oa = kiln_optim_create_module(&c, after);
    assert_non_null(oa);
    /* the optimizer's tensor is still the module's, and holds the loaded values */
    assert_ptr_equal(kiln_module_lookup(before, "fc1.weight"), held);
    float w[NWEIGHTS];
    weights(before, w);
    assert_memory_equal(w, loaded, sizeof w);

    train_five(before, ob);
    train_five(after, oa);
    float wb[NWEIGHTS], wa[NWEIGHTS];
    weights(before, wb);
    weights(after, wa);
    if (memcmp(wa, loaded, sizeof wa) == 0)
        fail_msg("five SGD steps left the weights as loaded");
    for (int i = 0; i < NWEIGHTS; i++)
        if (memcmp(&wb[i], &wa[i], sizeof wb[i]) != 0)
            fail_msg("weight %d: %.9g with the optimizer made before the load, %.9g after it", i, (double)wb[i],
                     (double)wa[i]);
    expect_no_grads(before);
    expect_no_grads(after);
    for (int i = 0; i < 4; i++)
        kiln_tensor_release(values[i]);
    kiln_optim_free(ob);
    kiln_optim_free(oa);
    kiln_module_free(source);
    kiln_module_free(before);
    kiln_module_free(after);
}

/* Sources that are the module's own tensors, swapped: each must read the value from before
 * the load, not one an earlier write of the same load put there. f64 sources are converted
 * into the module's f32 tensors, which stay the same objects. */
static void test_load_from_own_tensors_swapped(void **state)
{
    (void)state;
    kiln_module *m = net(3);
    kiln_tensor *w1 = kiln_module_lookup(m, "fc1.weight"), *w2 = kiln_module_lookup(m, "fc2.weight");
    float a[16], b[16];
    read_f32(w1, a, 16);
    read_f32(w2, b, 16);
    const char *names[2] = {"fc1.weight", "fc2.weight"};
    kiln_tensor *swapped[2] = {w2, w1};
    kiln_load_report rep;
    assert_int_equal(kiln_module_load_state_dict(m, 2, names, swapped, false, &rep), 0);
    assert_int_equal(rep.missing, 2); /* the biases */
    assert_ptr_equal(kiln_module_lookup(m, "fc1.weight"), w1);
    assert_ptr_equal(kiln_module_lookup(m, "fc2.weight"), w2);
    float got1[16], got2[16];
    read_f32(w1, got1, 16);
    read_f32(w2, got2, 16);
    assert_memory_equal(got1, b, sizeof b);
    assert_memory_equal(got2, a, sizeof a);

    kiln_tensor *f64[2] = {kiln_keep(kiln_cast(w1, KILN_F64)), kiln_keep(kiln_cast(w2, KILN_F64))};
    const char *back[2] = {"fc2.weight", "fc1.weight"};
    assert_int_equal(kiln_module_load_state_dict(m, 2, back, f64, false, NULL), 0);
    assert_int_equal(kiln_tensor_dtype(w1), KILN_F32);
    assert_true(kiln_tensor_requires_grad(w1));
    read_f32(w1, got1, 16);
    read_f32(w2, got2, 16);
    assert_memory_equal(got1, a, sizeof a);
    assert_memory_equal(got2, b, sizeof b);
    kiln_tensor_release(f64[0]);
    kiln_tensor_release(f64[1]);
    kiln_module_free(m);
}

/* kiln_module_to_device replaces the tensors (here a move onto the same device, which makes
 * new ones too): an optimizer made before it holds tensors no model uses, and its step is an
 * error naming the first one, with nothing changed, where it used to report an update. */
static void test_stale_optimizer_refuses_to_step(void **state)
{
    (void)state;
    kiln_module *m = net(4);
    kiln_optim_config c = kiln_optim_config_default(KILN_OPTIM_SGD);
    c.lr = 0.1;
    kiln_optim *stale = kiln_optim_create_module(&c, m);
    assert_int_equal(kiln_module_to_device(m, test_dev), 0);
    kiln_optim *fresh = kiln_optim_create_module(&c, m);
    float w0[NWEIGHTS], w1[NWEIGHTS];
    weights(m, w0);
    kiln_scope_begin();
    kiln_tensor *x = kiln_ones(test_dev, KILN_F32, KILN_SHAPE(2, 4));
    kiln_tensor *loss = kiln_sum(kiln_module_forward(m, x), KILN_ALL_DIMS, false);
    assert_int_equal(kiln_backward(loss, NULL), 0);
    assert_int_equal(kiln_optim_step(stale), -1);
    expect_error("parameter \"fc1.weight\"");
    expect_error("kiln_module_to_device");
    weights(m, w1);
    assert_memory_equal(w0, w1, sizeof w0);
    assert_int_equal(kiln_optim_step(fresh), 1);
    weights(m, w1);
    assert_memory_not_equal(w0, w1, sizeof w0);
    kiln_scope_end();
    kiln_optim_free(stale);
    kiln_optim_free(fresh);
    kiln_module_free(m);
}

/* A JSON model's spec builds the same structure again; other modules have none. */
static void test_model_spec_json(void **state)
{
    (void)state;
    kiln_module *m = net(5);
    char *spec = kiln_model_spec_json(m);
    assert_non_null(spec);
    kiln_generator g = kiln_generator_make(6);
    kiln_module *again = kiln_model_from_json(spec, test_dev, &g);
    assert_non_null(again);
    char *want = param_names(m, false);
    EXPECT_NAMES(again, false, want);
    free(want);
    free(spec);
    kiln_module_free(again);

    kiln_linear_config lc = kiln_linear_config_default();
    lc.in_features = 2;
    lc.out_features = 2;
    kiln_module *fc = kiln_linear_init(&lc, test_dev, NULL);
    assert_null(kiln_model_spec_json(fc));
    expect_error("Linear was not built from a JSON model spec");
    assert_null(kiln_model_spec_json(NULL));
    kiln_module_free(fc);
    kiln_module_free(m);
}

/* A safetensors file with fc1.bias = {1, 2, 3, 4} (F32) and an int8 entry kiln holds no dtype
 * for, written byte by byte as the format defines it (8-byte header length, JSON, data). */
static void write_file_with_int8_extra(const char *path)
{
    const char header[] = "{\"fc1.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                          "\"extra_int8_scale\":{\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[16,18]}}";
    uint64_t hlen = sizeof header - 1;
    const float bias[4] = {1, 2, 3, 4};
    const int8_t scale[2] = {-3, 7};
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(&hlen, 8, 1, f), 1);
    assert_int_equal(fwrite(header, 1, hlen, f), hlen);
    assert_int_equal(fwrite(bias, 4, 4, f), 4);
    assert_int_equal(fwrite(scale, 1, 2, f), 2);
    assert_int_equal(fclose(f), 0);
}

/* A lenient load reports an extra tensor as unexpected without reading it, whatever its dtype:
 * a file with an int8 entry failed the whole load ("dtype I8, which kiln does not support"). */
static void test_lenient_load_skips_unsupported_extra(void **state)
{
    (void)state;
    char path[] = "/tmp/kiln-module-load-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_file_with_int8_extra(path);
    kiln_module *m = net(8);
    kiln_load_report rep;
    assert_int_equal(kiln_module_load_safetensors(m, path, false, &rep), 0);
    assert_int_equal(rep.missing, 3);
    assert_int_equal(rep.unexpected, 1);
    assert_non_null(strstr(rep.text, "unexpected: extra_int8_scale"));
    float w[NWEIGHTS];
    weights(m, w);
    for (int i = 0; i < 4; i++) /* fc1.weight (16) then fc1.bias */
        assert_float_equal(w[16 + i], (float)(i + 1), 0);

    /* strict still refuses, naming what is missing and unexpected; the module is unchanged */
    assert_int_equal(kiln_module_load_safetensors(m, path, true, &rep), -1);
    expect_error("unexpected: extra_int8_scale");
    float again[NWEIGHTS];
    weights(m, again);
    assert_memory_equal(w, again, sizeof w);
    kiln_module_free(m);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_optimizer_before_load_trains_loaded_weights),
        cmocka_unit_test(test_load_from_own_tensors_swapped),
        cmocka_unit_test(test_stale_optimizer_refuses_to_step),
        cmocka_unit_test(test_model_spec_json),
        cmocka_unit_test(test_lenient_load_skips_unsupported_extra),
    };
    return cmocka_run_group_tests_name("nn-module-load", tests, test_group_setup, test_group_teardown);
}
