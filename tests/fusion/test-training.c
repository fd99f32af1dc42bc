/*
 * tests/fusion/test-training.c — autodiff through fused groups, and kernel launches of
 * whole training steps. Gradients of an expression whose forward and backward both fuse
 * must equal the unfused ones to the bit; a training step (forward, loss, backward,
 * Adam) of the Fashion-MNIST CNN and of a Transformer encoder block, built with the C
 * API, must reach the kernels in far fewer calls fused ("fused:counting:cpu?min_elements=0") than
 * unfused ("counting:cpu"), with the same loss and the same updated weights.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fusion-test.h"
#include "kiln/autodiff.h"
#include "kiln/loss.h"
#include "kiln/nn.h"
#include "kiln/optim.h"
#include "kiln/tensor.h"

/* The entries a training step reaches, for the per-entry breakdown printed beside the counts. */
static const char *const step_entries[] = {"fill",
                                           "copy",
                                           "unary",
                                           "binary",
                                           "where",
                                           "reduce",
                                           "matmul",
                                           "conv",
                                           "conv_backward_input",
                                           "conv_backward_weight",
                                           "pool",
                                           "pool_backward",
                                           "softmax",
                                           "layer_norm",
                                           "adam_step",
                                           "fused",
                                           "gather",
                                           "scatter",
                                           "rng",
                                           "arg_reduce",
                                           "index_select",
                                           "index_add",
                                           "epilogue",
                                           "conv_fused"};
#define NSTEP_ENTRIES (sizeof step_entries / sizeof *step_entries)

static void entry_counts(kiln_device *dev, uint64_t *out)
{
    kiln_device_counters c;
    for (size_t i = 0; i < NSTEP_ENTRIES; i++)
        kiln_device_counters_get(dev, &c, step_entries[i], &out[i]);
}

static uint64_t total_calls(kiln_device *d)
{
    kiln_device_counters c;
    return kiln_device_counters_get(d, &c, NULL, NULL) < 0 ? 0 : c.calls;
}

static uint64_t fused_calls(kiln_device *d)
{
    kiln_device_counters c;
    uint64_t n = 0;
    kiln_device_counters_get(d, &c, "fused", &n);
    return n;
}

static bool same_bits(kiln_tensor *a, kiln_tensor *b, const char *what)
{
    int64_t n = kiln_tensor_numel(a);
    float *x = malloc((size_t)n * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
    bool ok = kiln_to_data(a, x, (size_t)n * sizeof(float)) == 0 &&
              kiln_to_data(b, y, (size_t)n * sizeof(float)) == 0;
    int64_t bad = -1;
    for (int64_t i = 0; ok && i < n && bad < 0; i++)
        if (memcmp(&x[i], &y[i], sizeof(float)))
            bad = i;
    CHECK(ok && bad < 0, "%s: element %lld differs (%.9g vs %.9g)", what, (long long)bad, bad >= 0 ? x[bad] : 0.0,
          bad >= 0 ? y[bad] : 0.0);
    free(x);
    free(y);
    return ok && bad < 0;
}

/* loss = mean((gelu(x w + b) * s + tanh(x w)) ^ 2): its backward is a chain of
 * elementwise ops (gelu', tanh', the products of the chain rule) that fuses too. */
static void gradients(void)
{
    kiln_device *dev[2] = {kiln_device_open("fused:counting:cpu?min_elements=0"),
                           kiln_device_open("counting:cpu")};
    kiln_tensor *gw[2], *gb[2], *gs[2];
    uint64_t fused_in_backward = 0;
    for (int d = 0; d < 2; d++) {
        kiln_scope_begin();
        kiln_generator g = kiln_generator_make(11);
        kiln_tensor *x = kiln_rand_uniform(dev[d], KILN_F32, KILN_SHAPE(32, 48), -1, 1, &g);
        kiln_tensor *w = kiln_requires_grad(kiln_rand_uniform(dev[d], KILN_F32, KILN_SHAPE(48, 64), -0.3, 0.3, &g),
                                            true);
        kiln_tensor *b = kiln_requires_grad(kiln_rand_uniform(dev[d], KILN_F32, KILN_SHAPE(64), -0.3, 0.3, &g),
                                            true);
        kiln_tensor *s = kiln_requires_grad(kiln_rand_uniform(dev[d], KILN_F32, KILN_SHAPE(32, 1), 0.5, 1.5, &g),
                                            true);
        kiln_tensor *xw = kiln_matmul(x, w);
        kiln_tensor *h = kiln_add(kiln_mul(kiln_gelu(kiln_add(xw, b), false), s), kiln_tanh(xw));
        kiln_tensor *loss = kiln_mean(kiln_square(h), KILN_ALL_DIMS, false);
        kiln_device_sync(dev[d]);
        uint64_t f0 = fused_calls(dev[d]);
        CHECK(kiln_backward(loss, NULL) == 0, "backward: %s", kiln_error());
        kiln_device_sync(dev[d]);
        if (d == 0)
            fused_in_backward = fused_calls(dev[d]) - f0;
        gw[d] = kiln_keep(kiln_grad(w));
        gb[d] = kiln_keep(kiln_grad(b));
        gs[d] = kiln_keep(kiln_grad(s));
        kiln_scope_end();
    }
    CHECK(fused_in_backward > 0, "the backward pass ran fused groups (%llu)",
          (unsigned long long)fused_in_backward);
    same_bits(gw[0], gw[1], "grad w fused vs unfused");
    same_bits(gb[0], gb[1], "grad b fused vs unfused");
    same_bits(gs[0], gs[1], "grad s fused vs unfused");
    for (int d = 0; d < 2; d++) {
        kiln_tensor_release(gw[d]);
        kiln_tensor_release(gb[d]);
        kiln_tensor_release(gs[d]);
        kiln_device_close(dev[d]);
    }
}

static uint64_t entry_calls(kiln_device *d, const char *entry)
{
    kiln_device_counters c;
    uint64_t n = 0;
    kiln_device_counters_get(d, &c, entry, &n);
    return n;
}

/* A product's backward makes its first input's gradient last, and the engine runs that
 * input's node next, so the node's ops join the product as its epilogue: the product is
 * never written out and read back. Two cases, each against the unfused device, with the
 * inner backend's matmul and reduce calls counted over the backward alone:
 *   - tanh then linear then gelu: the linear's input gradient heads a group with tanh's
 *     backward (one matmul call fused, the weight's; two unfused);
 *   - softmax(q kT) v: the attention weights' gradient heads a group with softmax's
 *     backward and its row sum (no reduce call fused). */
static void products_head_backward_groups(void)
{
    kiln_device *dev[2] = {kiln_device_open("fused:counting:cpu?min_elements=0"),
                           kiln_device_open("counting:cpu")};
    kiln_tensor *grads[2][5];
    uint64_t mm[2][2], red[2][2];
    for (int d = 0; d < 2; d++) {
        kiln_scope_begin();
        kiln_generator g = kiln_generator_make(21);
        kiln_tensor *x0 = kiln_requires_grad(kiln_rand_uniform(dev[d], KILN_F32, KILN_SHAPE(96, 40), -1, 1, &g),
                                             true);
        kiln_tensor *w = kiln_requires_grad(kiln_rand_uniform(dev[d], KILN_F32, KILN_SHAPE(56, 40), -0.3, 0.3, &g),
                                            true);
        kiln_tensor *b = kiln_requires_grad(kiln_rand_uniform(dev[d], KILN_F32, KILN_SHAPE(56), -0.3, 0.3, &g),
                                            true);
        kiln_tensor *c = kiln_rand_uniform(dev[d], KILN_F32, KILN_SHAPE(96, 56), -1, 1, &g);
        kiln_tensor *loss = kiln_sum(kiln_mul(kiln_gelu(kiln_linear(kiln_tanh(x0), w, b), false), c),
                                     KILN_ALL_DIMS, false);
        kiln_device_sync(dev[d]);
        uint64_t m0 = entry_calls(dev[d], "matmul");
        CHECK(kiln_backward(loss, NULL) == 0, "backward: %s", kiln_error());
        kiln_device_sync(dev[d]);
        mm[d][0] = entry_calls(dev[d], "matmul") - m0;
        grads[d][0] = kiln_keep(kiln_grad(x0));
        grads[d][1] = kiln_keep(kiln_grad(w));

        kiln_tensor *q = kiln_requires_grad(kiln_rand_uniform(dev[d], KILN_F32, KILN_SHAPE(4, 64, 32), -1, 1, &g),
                                            true);
        kiln_tensor *k = kiln_requires_grad(kiln_rand_uniform(dev[d], KILN_F32, KILN_SHAPE(4, 64, 32), -1, 1, &g),
                                            true);
        kiln_tensor *v = kiln_requires_grad(kiln_rand_uniform(dev[d], KILN_F32, KILN_SHAPE(4, 64, 32), -1, 1, &g),
                                            true);
        kiln_tensor *co = kiln_rand_uniform(dev[d], KILN_F32, KILN_SHAPE(4, 64, 32), -1, 1, &g);
        kiln_tensor *p = kiln_softmax(kiln_matmul(q, kiln_transpose(k, 1, 2)), -1);
        loss = kiln_sum(kiln_mul(kiln_matmul(p, v), co), KILN_ALL_DIMS, false);
        kiln_device_sync(dev[d]);
        m0 = entry_calls(dev[d], "matmul");
        uint64_t r0 = entry_calls(dev[d], "reduce");
        CHECK(kiln_backward(loss, NULL) == 0, "backward: %s", kiln_error());
        kiln_device_sync(dev[d]);
        mm[d][1] = entry_calls(dev[d], "matmul") - m0;
        red[d][1] = entry_calls(dev[d], "reduce") - r0;
        grads[d][2] = kiln_keep(kiln_grad(q));
        grads[d][3] = kiln_keep(kiln_grad(k));
        grads[d][4] = kiln_keep(kiln_grad(v));
        kiln_scope_end();
    }
    CHECK(mm[0][0] == 1 && mm[1][0] == 2,
          "linear's backward: the input's gradient joined tanh's backward (matmul calls fused %llu, unfused %llu)",
          (unsigned long long)mm[0][0], (unsigned long long)mm[1][0]);
    CHECK(mm[0][1] == 2 && mm[1][1] == 4 && red[0][1] == 0 && red[1][1] > 0,
          "attention's backward: the weights' gradient joined softmax's backward (matmul calls fused %llu, "
          "unfused %llu; reduce calls fused %llu, unfused %llu)",
          (unsigned long long)mm[0][1], (unsigned long long)mm[1][1], (unsigned long long)red[0][1],
          (unsigned long long)red[1][1]);
    static const char *const names[5] = {"grad x0", "grad w", "grad q", "grad k", "grad v"};
    char what[64];
    for (int i = 0; i < 5; i++) {
        snprintf(what, sizeof what, "%s fused vs unfused", names[i]);
        same_bits(grads[0][i], grads[1][i], what);
        kiln_tensor_release(grads[0][i]);
        kiln_tensor_release(grads[1][i]);
    }
    for (int d = 0; d < 2; d++)
        kiln_device_close(dev[d]);
}

static const char cnn_spec[] =
    "{\"inputs\": [\"x\"], \"nodes\": ["
    "{\"name\": \"c1\", \"layer\": \"Conv2d\", \"config\": {\"in_channels\": 1, \"out_channels\": 8, "
    "\"kernel_size\": 3}, \"inputs\": [\"x\"]},"
    "{\"name\": \"r1\", \"op\": \"relu\", \"inputs\": [\"c1\"]},"
    "{\"name\": \"p1\", \"layer\": \"MaxPool2d\", \"config\": {\"kernel_size\": 2}, \"inputs\": [\"r1\"]},"
    "{\"name\": \"c2\", \"layer\": \"Conv2d\", \"config\": {\"in_channels\": 8, \"out_channels\": 16, "
    "\"kernel_size\": 3}, \"inputs\": [\"p1\"]},"
    "{\"name\": \"r2\", \"op\": \"relu\", \"inputs\": [\"c2\"]},"
    "{\"name\": \"p2\", \"layer\": \"MaxPool2d\", \"config\": {\"kernel_size\": 2}, \"inputs\": [\"r2\"]},"
    "{\"name\": \"f\", \"op\": \"flatten\", \"start_dim\": 1, \"inputs\": [\"p2\"]},"
    "{\"name\": \"fc1\", \"layer\": \"Linear\", \"config\": {\"in_features\": 400, \"out_features\": 64}, "
    "\"inputs\": [\"f\"]},"
    "{\"name\": \"r3\", \"op\": \"relu\", \"inputs\": [\"fc1\"]},"
    "{\"name\": \"fc2\", \"layer\": \"Linear\", \"config\": {\"in_features\": 64, \"out_features\": 10}, "
    "\"inputs\": [\"r3\"]}"
    "], \"outputs\": [\"fc2\"]}";

typedef struct step_result {
    uint64_t calls, fused;
    uint64_t per_entry[NSTEP_ENTRIES];
    float loss;
    kiln_tensor *param; /* the first parameter after the steps (kept) */
} step_result;

/* Two training steps of model m (built by make on dev) with AdamW; the second is counted. */
static step_result train_steps(kiln_device *dev, bool cnn)
{
    step_result r = {0};
    kiln_generator g = kiln_generator_make(3);
    kiln_module *m = NULL;
    if (cnn) {
        m = kiln_model_from_json(cnn_spec, dev, &g);
    } else {
        kiln_transformer_config tc = kiln_transformer_encoder_layer_config_default();
        tc.d_model = 64;
        tc.nhead = 4;
        tc.dim_feedforward = 128;
        tc.dropout = 0.0;
        tc.batch_first = true;
        tc.activation = KILN_ACT_GELU;
        m = kiln_transformer_encoder_layer_init(&tc, dev, &g);
    }
    CHECK(m != NULL, "build the %s: %s", cnn ? "CNN" : "Transformer block", kiln_error());
    if (!m)
        return r;
    kiln_optim_config oc = kiln_optim_config_default(KILN_OPTIM_ADAMW);
    oc.lr = 1e-3;
    kiln_optim *opt = kiln_optim_create_module(&oc, m);
    kiln_generator dg = kiln_generator_make(9);
    kiln_tensor *x = kiln_keep(cnn ? kiln_rand_uniform(dev, KILN_F32, KILN_SHAPE(16, 1, 28, 28), 0, 1, &dg)
                                   : kiln_rand_normal(dev, KILN_F32, KILN_SHAPE(8, 16, 64), 0, 1, &dg));
    kiln_tensor *y = kiln_keep(kiln_rand_int(dev, KILN_I64, KILN_SHAPE(16), 0, 10, &dg));
    for (int step = 0; step < 2; step++) {
        kiln_device_sync(dev);
        uint64_t c0 = total_calls(dev), f0 = fused_calls(dev), e0[NSTEP_ENTRIES];
        entry_counts(dev, e0);
        kiln_scope_begin();
        kiln_tensor *out = kiln_module_forward(m, x);
        kiln_tensor *loss;
        if (cnn) {
            kiln_loss_ce_opts o = kiln_loss_ce_opts_default();
            loss = kiln_loss_cross_entropy(out, y, &o);
        } else {
            loss = kiln_mean(kiln_square(out), KILN_ALL_DIMS, false);
        }
        CHECK(kiln_backward(loss, NULL) == 0, "backward: %s", kiln_error());
        kiln_optim_step(opt);
        kiln_optim_zero_grad(opt);
        r.loss = (float)kiln_item(loss);
        kiln_scope_end();
        kiln_device_sync(dev);
        r.calls = total_calls(dev) - c0;
        r.fused = fused_calls(dev) - f0;
        entry_counts(dev, r.per_entry);
        for (size_t i = 0; i < NSTEP_ENTRIES; i++)
            r.per_entry[i] -= e0[i];
    }
    r.param = kiln_keep(kiln_contiguous(kiln_optim_param(opt, 0)));
    kiln_tensor_release(x);
    kiln_tensor_release(y);
    kiln_optim_free(opt);
    kiln_module_free(m);
    return r;
}

static void launch_counts(bool cnn)
{
    const char *name = cnn ? "Fashion-MNIST CNN" : "Transformer encoder block";
    kiln_device *fd = kiln_device_open("fused:counting:cpu?min_elements=0"),
                *pd = kiln_device_open("counting:cpu");
    step_result f = train_steps(fd, cnn), p = train_steps(pd, cnn);
    fprintf(stderr,
            "%s training step: %llu kernel calls fused (%llu of them fused groups), %llu unfused (%.2fx fewer)\n",
            name, (unsigned long long)f.calls, (unsigned long long)f.fused, (unsigned long long)p.calls,
            f.calls ? (double)p.calls / (double)f.calls : 0.0);
    for (int k = 0; k < 2; k++) {
        fprintf(stderr, "  %s:", k ? "unfused" : "fused");
        for (size_t i = 0; i < NSTEP_ENTRIES; i++)
            if ((k ? p : f).per_entry[i])
                fprintf(stderr, " %s %llu", step_entries[i], (unsigned long long)(k ? p : f).per_entry[i]);
        fprintf(stderr, "\n");
    }
    CHECK(f.fused > 0, "%s: the step ran fused groups", name);
    /* measured: the CNN 62 against 77 (its step is mostly convolutions, pooling, GEMMs
     * and Adam, which no elementwise group absorbs), the Transformer block 94 against 138 */
    uint64_t at_most = cnn ? p.calls * 85 / 100 : p.calls * 75 / 100;
    CHECK(f.calls <= at_most, "%s: fused step made %llu calls, unfused %llu: expected at most %llu", name,
          (unsigned long long)f.calls, (unsigned long long)p.calls, (unsigned long long)at_most);
    CHECK(memcmp(&f.loss, &p.loss, sizeof f.loss) == 0, "%s: loss fused %.9g, unfused %.9g", name, f.loss, p.loss);
    if (f.param && p.param)
        same_bits(f.param, p.param, cnn ? "CNN weights after two steps" : "Transformer weights after two steps");
    kiln_tensor_release(f.param);
    kiln_tensor_release(p.param);
    kiln_device_close(fd);
    kiln_device_close(pd);
}

void test_training(void)
{
    gradients();
    products_head_backward_groups();
    launch_counts(true);
    launch_counts(false);
}
