/*
 * bench/onnx/onnx-train-step.c — time one SGD training step through an exported ONNX model
 * on the cpu device (or the device KILN_BENCH_DEVICE names, such as cuda:0).
 *
 *     onnx-train-step MODEL.onnx IO.safetensors [RUNS]
 *
 * The model's floating initializers become parameters (kiln_onnx_set_trainable; batch norm
 * stays in the inference form the exporter wrote, folded into nothing, so every initializer
 * trains); a step is the forward run on the "in.<name>" tensors of IO, cross-entropy against
 * fixed labels (i mod classes), backward, and SGD with momentum 0.9, lr 1e-3, ending with a
 * device sync. Two warm-up steps, then RUNS timed ones (default 10). Prints one JSON line:
 * {"ms": median step, "min_ms", "loss_first", "loss_last"}; the loss must fall over the steps,
 * else the program fails (a fast step that does not train would be no figure).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kiln/kiln.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define MAX_PARAMS 1024

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.onnx IO.safetensors [RUNS]\n", argv[0]);
        return 2;
    }
    int runs = argc > 3 ? atoi(argv[3]) : 10;
    if (runs < 1)
        runs = 1;
    const char *spec = getenv("KILN_BENCH_DEVICE");
    kiln_device *dev = kiln_device_open(spec && *spec ? spec : "cpu");
    kiln_onnx_options o = kiln_onnx_options_default();
    o.fold_batchnorm = false; /* every initializer stays a parameter */
    kiln_onnx_model *m = dev ? kiln_onnx_load(argv[1], dev, &o) : NULL;
    kiln_safetensors *st = m ? kiln_safetensors_open(argv[2]) : NULL;
    if (!st || kiln_onnx_set_trainable(m, true) || kiln_onnx_input_count(m) != 1) {
        fprintf(stderr, "onnx-train-step: %s\n", st ? kiln_error() : "a model of one input is needed");
        return 1;
    }
    kiln_tensor *params[MAX_PARAMS];
    const char *pnames[MAX_PARAMS];
    int np = 0;
    for (int i = 0; i < kiln_onnx_param_count(m) && np < MAX_PARAMS; i++)
        if (kiln_dtype_is_float(kiln_tensor_dtype(kiln_onnx_param(m, i)))) {
            params[np] = kiln_onnx_param(m, i);
            pnames[np++] = kiln_onnx_param_name(m, i);
        }
    const char *in_name = kiln_onnx_input_name(m, 0);
    char key[300];
    snprintf(key, sizeof key, "in.%s", in_name);
    kiln_tensor *x = kiln_safetensors_load(st, key, dev);
    if (!x) {
        fprintf(stderr, "onnx-train-step: %s\n", kiln_error());
        return 1;
    }
    kiln_optim_config cfg = kiln_optim_config_default(KILN_OPTIM_SGD);
    cfg.lr = 1e-3;
    cfg.momentum = 0.9;
    kiln_optim *opt = kiln_optim_create(&cfg, np, params, pnames);
    if (!opt) {
        fprintf(stderr, "onnx-train-step: %s\n", kiln_error());
        return 1;
    }
    kiln_tensor *labels = NULL;
    double *t = malloc((size_t)runs * sizeof *t), loss_first = NAN, loss_last = NAN;
    if (!t)
        return 1;
    for (int r = -2; r < runs; r++) {
        double t0 = now_ms();
        kiln_scope_begin();
        kiln_tensor *logits = NULL;
        if (kiln_onnx_run(m, 1, &in_name, &x, 1, &logits)) {
            fprintf(stderr, "onnx-train-step: %s\n", kiln_error());
            return 1;
        }
        if (!labels) { /* i mod classes, made once */
            int64_t b = kiln_tensor_shape(logits)[0], classes = kiln_tensor_shape(logits)[1];
            int64_t *y = malloc((size_t)b * sizeof *y);
            for (int64_t i = 0; y && i < b; i++)
                y[i] = i % classes;
            labels = y ? kiln_keep(kiln_from_data(dev, KILN_I64, 1, (int64_t[]){b}, y, (size_t)b * sizeof *y))
                       : NULL;
            free(y);
        }
        kiln_tensor *loss = labels ? kiln_loss_cross_entropy(logits, labels, NULL) : NULL;
        if (!loss || kiln_backward(loss, NULL) || kiln_optim_step(opt) < 0) {
            fprintf(stderr, "onnx-train-step: %s\n", kiln_error());
            return 1;
        }
        kiln_optim_zero_grad(opt);
        /* the loss is read only at the first and last steps: a read waits for the device */
        if (r == -2 || r == runs - 1) {
            double l = kiln_item(loss);
            if (r == -2)
                loss_first = l;
            else
                loss_last = l;
        }
        kiln_tensor_release(logits);
        kiln_scope_end();
        if (kiln_device_sync(dev)) {
            fprintf(stderr, "onnx-train-step: %s\n", kiln_error());
            return 1;
        }
        if (r >= 0)
            t[r] = now_ms() - t0;
    }
    qsort(t, (size_t)runs, sizeof *t, cmp_double);
    printf("{\"ms\": %.3f, \"min_ms\": %.3f, \"loss_first\": %.6g, \"loss_last\": %.6g}\n", t[runs / 2], t[0],
           loss_first, loss_last);
    int rc = loss_last < loss_first ? 0 : 1;
    if (rc)
        fprintf(stderr, "onnx-train-step: the loss did not fall (%g -> %g)\n", loss_first, loss_last);
    free(t);
    kiln_tensor_release(labels);
    kiln_tensor_release(x);
    kiln_optim_free(opt);
    kiln_safetensors_close(st);
    kiln_onnx_free(m);
    kiln_device_close(dev);
    return rc;
}
