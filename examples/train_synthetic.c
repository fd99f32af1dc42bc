/*
 * examples/train_synthetic.c — train a small MLP on a seeded synthetic classification
 * problem (Gaussian blobs) with each of kiln's optimizers and print the loss per epoch.
 *
 *     train_synthetic [device] [epochs]        e.g. train_synthetic cpu 15
 *
 * epochs (12) is a whole number from 1 to 100000; anything else prints the usage and exits
 * with status 2.
 *
 * The model is written directly with kiln_linear and parameters created here, so the
 * example needs nothing but libkiln: two hidden layers of 32 ReLU units, cross-entropy
 * on the logits, mini-batches of 32, gradient clipping at norm 5, and a cosine learning
 * rate schedule with a short linear warm-up. Each optimizer starts from the same
 * initial weights, so their curves can be compared line by line.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "kiln/loss.h"
#include "kiln/optim.h"

enum { N_POINTS = 600, N_FEATURES = 2, N_CLASSES = 4, HIDDEN = 32, BATCH = 32, NPARAM = 6 };

/* Four blobs on a circle of radius 2.5, unit spread; labels 0..3. */
static int make_blobs(kiln_device *dev, kiln_tensor **x, kiln_tensor **y)
{
    kiln_generator gen = kiln_generator_make(2024);
    kiln_scope_begin();
    kiln_tensor *noise = kiln_rand_normal(dev, KILN_F32, KILN_SHAPE(N_POINTS, N_FEATURES), 0, 1, &gen);
    kiln_tensor *labels = kiln_rand_int(dev, KILN_I64, KILN_SHAPE(N_POINTS), 0, N_CLASSES, &gen);
    float centers[N_CLASSES * N_FEATURES];
    for (int c = 0; c < N_CLASSES; c++) {
        centers[c * 2] = (float)(2.5 * cos(2 * M_PI * c / N_CLASSES));
        centers[c * 2 + 1] = (float)(2.5 * sin(2 * M_PI * c / N_CLASSES));
    }
    kiln_tensor *ct = kiln_from_data(dev, KILN_F32, KILN_SHAPE(N_CLASSES, N_FEATURES), centers, sizeof centers);
    *x = kiln_keep(kiln_add(noise, kiln_embedding(ct, labels)));
    *y = kiln_keep(labels);
    kiln_scope_end();
    return *x && *y ? 0 : -1;
}

/* Kaiming-uniform-like weights and zero biases, from a fixed seed. */
static int init_params(kiln_device *dev, kiln_tensor **p)
{
    kiln_generator gen = kiln_generator_make(7);
    const int64_t dims[4] = {N_FEATURES, HIDDEN, HIDDEN, N_CLASSES};
    for (int l = 0; l < 3; l++) {
        double bound = 1 / sqrt((double)dims[l]);
        p[2 * l] = kiln_rand_uniform(dev, KILN_F32, KILN_SHAPE(dims[l + 1], dims[l]), -bound, bound, &gen);
        p[2 * l + 1] = kiln_zeros(dev, KILN_F32, KILN_SHAPE(dims[l + 1]));
        if (!p[2 * l] || !p[2 * l + 1])
            return -1;
    }
    return 0;
}

static kiln_tensor *forward(kiln_tensor *const *p, kiln_tensor *x)
{
    kiln_tensor *h = kiln_relu(kiln_linear(x, p[0], p[1]));
    h = kiln_relu(kiln_linear(h, p[2], p[3]));
    return kiln_linear(h, p[4], p[5]);
}

static double accuracy(kiln_tensor *const *p, kiln_tensor *x, kiln_tensor *y)
{
    kiln_no_grad_begin();
    kiln_scope_begin();
    kiln_tensor *hit = kiln_eq(kiln_argmax(forward(p, x), 1, false), y);
    double acc = kiln_item(kiln_mean(kiln_cast(hit, KILN_F32), KILN_ALL_DIMS, false));
    kiln_scope_end();
    kiln_no_grad_end();
    return acc;
}

static int train(kiln_device *dev, kiln_optim_config cfg, int epochs, kiln_tensor *x, kiln_tensor *y)
{
    static const char *const names[NPARAM] = {"fc1.weight", "fc1.bias", "fc2.weight",
                                              "fc2.bias",   "fc3.weight", "fc3.bias"};
    kiln_tensor *p[NPARAM] = {0};
    int rc = init_params(dev, p);
    for (int i = 0; rc == 0 && i < NPARAM; i++)
        if (!kiln_requires_grad(p[i], true))
            rc = -1;
    kiln_optim *opt = rc == 0 ? kiln_optim_create(&cfg, NPARAM, p, names) : NULL;
    int64_t steps_per_epoch = N_POINTS / BATCH;
    kiln_sched_config sc = kiln_sched_config_default(KILN_SCHED_COSINE);
    sc.t_max = epochs * steps_per_epoch;
    sc.warmup_steps = steps_per_epoch;
    sc.warmup_start_factor = 0.1;
    kiln_sched *sched = opt ? kiln_sched_create(&sc, opt) : NULL;
    if (!sched)
        rc = -1;
    printf("%-8s", kiln_optim_kind_name(cfg.kind));
    for (int e = 0; rc == 0 && e < epochs; e++) {
        double total = 0;
        for (int64_t b = 0; rc == 0 && b < steps_per_epoch; b++) {
            kiln_scope_begin();
            kiln_tensor *xb = kiln_narrow(x, 0, b * BATCH, BATCH);
            kiln_tensor *yb = kiln_narrow(y, 0, b * BATCH, BATCH);
            kiln_tensor *loss = kiln_loss_cross_entropy(forward(p, xb), yb, NULL);
            double l = kiln_item(loss);
            if (!loss || kiln_backward(loss, NULL) < 0 || kiln_optim_clip_grad_norm(opt, 5.0, 2.0) < 0 ||
                kiln_optim_step(opt) < 0)
                rc = -1;
            kiln_optim_zero_grad(opt);
            kiln_scope_end();
            kiln_sched_step(sched);
            total += l;
        }
        printf(" %6.4f", total / (double)steps_per_epoch);
        fflush(stdout);
    }
    if (rc == 0)
        printf("   accuracy %.1f%%\n", 100 * accuracy(p, x, y));
    else
        printf("\nerror: %s\n", kiln_error());
    kiln_sched_free(sched);
    kiln_optim_free(opt);
    for (int i = 0; i < NPARAM; i++)
        kiln_tensor_release(p[i]);
    return rc;
}

static int usage(FILE *to, const char *prog)
{
    fprintf(to,
            "usage: %s [device] [epochs]\n"
            "  device  a device spec: cpu (the default), ref, vulkan:0, cuda:0, remote://host:port/cpu\n"
            "  epochs  a whole number from 1 to 100000 (12)\n",
            prog);
    return 2;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout, argv[0]);
            return 0;
        }
    const char *spec = argc > 1 ? argv[1] : "cpu";
    int epochs = 12;
    if (argc > 3) {
        fprintf(stderr, "train_synthetic: unexpected argument \"%s\"\n", argv[3]);
        return usage(stderr, argv[0]);
    }
    if (argc > 2) {
        char *end;
        errno = 0;
        long v = strtol(argv[2], &end, 10);
        if (end == argv[2] || *end || errno == ERANGE || v < 1 || v > 100000) {
            fprintf(stderr, "train_synthetic: epochs \"%s\" is not a whole number from 1 to 100000\n", argv[2]);
            return usage(stderr, argv[0]);
        }
        epochs = (int)v;
    }
    kiln_device *dev = kiln_device_open(spec);
    if (!dev) {
        fprintf(stderr, "cannot open %s: %s\n", spec, kiln_error());
        return 1;
    }
    kiln_tensor *x = NULL, *y = NULL;
    if (make_blobs(dev, &x, &y) < 0) {
        fprintf(stderr, "data: %s\n", kiln_error());
        return 1;
    }
    printf("%d points, %d classes, %d epochs on %s; mean training loss per epoch:\n", N_POINTS, N_CLASSES, epochs,
           kiln_device_name(dev));

    kiln_optim_config cfgs[5];
    cfgs[0] = kiln_optim_config_default(KILN_OPTIM_SGD);
    cfgs[0].lr = 0.05;
    cfgs[0].momentum = 0.9;
    cfgs[0].nesterov = true;
    cfgs[1] = kiln_optim_config_default(KILN_OPTIM_ADAM);
    cfgs[1].lr = 0.01;
    cfgs[2] = kiln_optim_config_default(KILN_OPTIM_ADAMW);
    cfgs[2].lr = 0.01;
    cfgs[3] = kiln_optim_config_default(KILN_OPTIM_RMSPROP);
    cfgs[3].lr = 0.003;
    cfgs[4] = kiln_optim_config_default(KILN_OPTIM_ADAGRAD);
    cfgs[4].lr = 0.1;
    int rc = 0;
    for (int i = 0; i < 5; i++)
        if (train(dev, cfgs[i], epochs, x, y) < 0)
            rc = 1;
    kiln_tensor_release(x);
    kiln_tensor_release(y);
    kiln_device_close(dev);
    return rc;
}
