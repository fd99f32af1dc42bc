/*
 * bench/nn/train-step.c — one training step (forward, cross-entropy, backward, AdamW
 * update) of a model built from a JSON spec, timed on the cpu device; the twin of
 * torch_train_step.py, which builds the same models in PyTorch.
 *
 *     train-step transformer|cnn [STEPS]
 *
 * Prints one JSON line: {"name", "ms" (median step), "rss_mb" (peak resident set of
 * this process)}. One workload per process, so the peak memory is that workload's.
 * Each step is one scope, as a real training loop is written, so buffers are reused.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "kiln/kiln.h"
#include "kiln/loss.h"
#include "kiln/nn.h"
#include "kiln/optim.h"

/* 4 post-norm encoder layers, d_model 256, 4 heads, feed-forward 1024, no dropout (so
 * both frameworks do the same arithmetic), mean over the sequence, a 10-way head. */
static const char transformer_spec[] =
    "{\"inputs\": [\"x\"], \"nodes\": ["
    "{\"name\": \"enc0\", \"layer\": \"TransformerEncoderLayer\", \"config\": %s, \"inputs\": [\"x\"]},"
    "{\"name\": \"enc1\", \"layer\": \"TransformerEncoderLayer\", \"config\": %s, \"inputs\": [\"enc0\"]},"
    "{\"name\": \"enc2\", \"layer\": \"TransformerEncoderLayer\", \"config\": %s, \"inputs\": [\"enc1\"]},"
    "{\"name\": \"enc3\", \"layer\": \"TransformerEncoderLayer\", \"config\": %s, \"inputs\": [\"enc2\"]},"
    "{\"name\": \"pooled\", \"op\": \"mean\", \"dims\": [1], \"inputs\": [\"enc3\"]},"
    "{\"name\": \"head\", \"layer\": \"Linear\", \"config\": {\"in_features\": 256, \"out_features\": 10}, "
    "\"inputs\": [\"pooled\"]}], \"outputs\": [\"head\"]}";
static const char encoder_config[] =
    "{\"d_model\": 256, \"nhead\": 4, \"dim_feedforward\": 1024, \"dropout\": 0.0, "
    "\"batch_first\": true, \"activation\": \"relu\", \"norm_first\": false}";

/* The Fashion-MNIST CNN: two conv + batch norm + pooling blocks, two linear layers. */
static const char cnn_spec[] =
    "{\"inputs\": [\"image\"], \"nodes\": ["
    "{\"name\": \"conv1\", \"layer\": \"Conv2d\", \"config\": {\"in_channels\": 1, \"out_channels\": 32, "
    "\"kernel_size\": 3, \"padding\": 1}, \"inputs\": [\"image\"]},"
    "{\"name\": \"bn1\", \"layer\": \"BatchNorm2d\", \"config\": {\"num_features\": 32}, \"inputs\": [\"conv1\"]},"
    "{\"name\": \"relu1\", \"op\": \"relu\", \"inputs\": [\"bn1\"]},"
    "{\"name\": \"pool1\", \"layer\": \"MaxPool2d\", \"config\": {\"kernel_size\": 2}, \"inputs\": [\"relu1\"]},"
    "{\"name\": \"conv2\", \"layer\": \"Conv2d\", \"config\": {\"in_channels\": 32, \"out_channels\": 64, "
    "\"kernel_size\": 3, \"padding\": 1}, \"inputs\": [\"pool1\"]},"
    "{\"name\": \"bn2\", \"layer\": \"BatchNorm2d\", \"config\": {\"num_features\": 64}, \"inputs\": [\"conv2\"]},"
    "{\"name\": \"relu2\", \"op\": \"relu\", \"inputs\": [\"bn2\"]},"
    "{\"name\": \"pool2\", \"layer\": \"MaxPool2d\", \"config\": {\"kernel_size\": 2}, \"inputs\": [\"relu2\"]},"
    "{\"name\": \"flat\", \"op\": \"flatten\", \"start_dim\": 1, \"inputs\": [\"pool2\"]},"
    "{\"name\": \"fc1\", \"layer\": \"Linear\", \"config\": {\"in_features\": 3136, \"out_features\": 128}, "
    "\"inputs\": [\"flat\"]},"
    "{\"name\": \"relu3\", \"op\": \"relu\", \"inputs\": [\"fc1\"]},"
    "{\"name\": \"fc2\", \"layer\": \"Linear\", \"config\": {\"in_features\": 128, \"out_features\": 10}, "
    "\"inputs\": [\"relu3\"]}], \"outputs\": [\"fc2\"]}";

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int fail(const char *what)
{
    fprintf(stderr, "train-step: %s: %s\n", what, kiln_error());
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 2 || (strcmp(argv[1], "transformer") && strcmp(argv[1], "cnn"))) {
        fprintf(stderr, "usage: %s transformer|cnn [STEPS]\n", argv[0]);
        return 2;
    }
    bool tf = strcmp(argv[1], "transformer") == 0;
    int steps = argc > 2 ? atoi(argv[2]) : (tf ? 10 : 20);
    if (steps < 1)
        steps = 1;
    kiln_device *dev = kiln_device_open("cpu");
    if (!dev)
        return fail("open cpu");
    kiln_generator gen = kiln_generator_make(1);

    char *spec;
    if (tf) {
        size_t n = sizeof transformer_spec + 4 * sizeof encoder_config;
        spec = malloc(n);
        snprintf(spec, n, transformer_spec, encoder_config, encoder_config, encoder_config, encoder_config);
    } else {
        spec = strdup(cnn_spec);
    }
    kiln_module *model = kiln_model_from_json(spec, dev, &gen);
    free(spec);
    if (!model)
        return fail("build the model");
    kiln_optim_config cfg = kiln_optim_config_default(KILN_OPTIM_ADAMW);
    cfg.lr = 1e-4;
    kiln_optim *opt = kiln_optim_create_module(&cfg, model);
    if (!opt)
        return fail("create AdamW");

    kiln_tensor *x = tf ? kiln_rand_normal(dev, KILN_F32, KILN_SHAPE(16, 64, 256), 0, 1, &gen)
                        : kiln_rand_normal(dev, KILN_F32, KILN_SHAPE(64, 1, 28, 28), 0, 1, &gen);
    kiln_tensor *y = kiln_rand_int(dev, KILN_I64, KILN_SHAPE(tf ? 16 : 64), 0, 10, &gen);
    if (!x || !y)
        return fail("make inputs");

    enum { WARMUP = 3 };
    double *t = calloc((size_t)steps, sizeof *t);
    double last_loss = 0;
    for (int s = 0; s < WARMUP + steps; s++) {
        double t0 = now_ms();
        kiln_scope_begin();
        const char *stage = "forward";
        kiln_tensor *logits = kiln_module_forward(model, x);
        kiln_tensor *loss = kiln_loss_cross_entropy(logits, y, NULL);
        int rc = loss ? 0 : -1;
        if (rc == 0 && (rc = kiln_backward(loss, NULL)) != 0)
            stage = "backward";
        if (rc == 0 && kiln_optim_step(opt) < 0) { /* 1 = updated */
            rc = -1;
            stage = "optimizer step";
        }
        kiln_optim_zero_grad(opt);
        if (rc == 0)
            last_loss = kiln_item(loss);
        kiln_scope_end();
        if (rc != 0)
            return fail(stage);
        if (s >= WARMUP)
            t[s - WARMUP] = now_ms() - t0;
    }
    qsort(t, (size_t)steps, sizeof *t, cmp_double);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("{\"name\": \"%s_train_step\", \"ms\": %.4f, \"rss_mb\": %.1f, \"loss\": %.5f}\n",
           argv[1], t[steps / 2], ru.ru_maxrss / 1024.0, last_loss);
    free(t);
    kiln_tensor_release(x);
    kiln_tensor_release(y);
    kiln_optim_free(opt);
    kiln_module_free(model);
    kiln_device_close(dev);
    return 0;
}
