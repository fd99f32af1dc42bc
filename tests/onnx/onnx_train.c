/*
 * onnx_train.c — training through an imported graph: the Fashion-MNIST-style CNN loaded
 * from ONNX, its initializers marked as parameters, fine-tuned with Adam on a fixed
 * synthetic batch (labels from a fixed rule, so the loss has something to learn) until
 * the loss falls, then its weights exported to safetensors and read back.
 *
 *     onnx_train MODEL.onnx OUT.safetensors
 */
#include <stdio.h>
#include <stdlib.h>

#include "kiln/kiln.h"

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: %s MODEL.onnx OUT.safetensors\n", argv[0]); return 2; }
    kiln_device *dev = kiln_device_open("cpu");
    kiln_onnx_options o = kiln_onnx_options_default();
    o.fold_batchnorm = false;               /* keep every initializer addressable by name */
    kiln_onnx_model *m = dev ? kiln_onnx_load(argv[1], dev, &o) : NULL;
    if (!m || kiln_onnx_set_trainable(m, true)) { printf("FAIL load: %s\n", kiln_error()); return 1; }
    int np = kiln_onnx_param_count(m);
    kiln_tensor *params[64];
    const char *names[64];
    int n = 0;
    for (int i = 0; i < np && n < 64; i++)
        if (kiln_dtype_is_float(kiln_tensor_dtype(kiln_onnx_param(m, i)))) {
            params[n] = kiln_onnx_param(m, i);
            names[n++] = kiln_onnx_param_name(m, i);
        }
    kiln_generator g = kiln_generator_make(7);
    /* inputs are made in a scope so the temporaries of the label chain go back */
    kiln_scope_begin();
    kiln_tensor *x = kiln_keep(kiln_rand_normal(dev, KILN_F32, KILN_SHAPE(32, 1, 28, 28), 0, 1, &g));
    /* label = which of 10 horizontal bands holds the largest mean: learnable from pixels */
    kiln_tensor *y = kiln_keep(kiln_argmax(
        kiln_mean(kiln_reshape(kiln_narrow(kiln_reshape(x, KILN_SHAPE(32, 784)), 1, 0, 780), KILN_SHAPE(32, 10, 78)),
                  KILN_DIMS(2), false),
        1, false));
    kiln_scope_end();
    (void)y;
    kiln_optim_config cfg = kiln_optim_config_default(KILN_OPTIM_ADAM);
    cfg.lr = 3e-3;
    kiln_optim *opt = kiln_optim_create(&cfg, n, params, names);
    if (!opt) { printf("FAIL optim: %s\n", kiln_error()); return 1; }
    double first = 0, last = 0;
    const char *in_name = kiln_onnx_input_name(m, 0);
    for (int step = 0; step < 30; step++) {
        kiln_scope_begin();
        kiln_tensor *logits = NULL;
        if (kiln_onnx_run(m, 1, &in_name, &x, 1, &logits)) { printf("FAIL run: %s\n", kiln_error()); return 1; }
        kiln_tensor *loss = kiln_loss_cross_entropy(logits, y, NULL);
        double l = kiln_item(loss);
        if (!loss) { printf("FAIL loss: %s\n", kiln_error()); return 1; }
        if (kiln_backward(loss, NULL)) { printf("FAIL backward (loss requires grad: %d): %s\n", kiln_tensor_requires_grad(loss), kiln_error()); return 1; }
        if (kiln_optim_step(opt) < 0) { printf("FAIL step: %s\n", kiln_error()); return 1; }
        kiln_optim_zero_grad(opt);
        kiln_tensor_release(logits);
        kiln_scope_end();
        if (step == 0) first = l;
        last = l;
    }
    printf("loss %.4f -> %.4f over 30 steps\n", first, last);
    int rc = last < 0.5 * first ? 0 : 1;
    if (kiln_onnx_save_params(m, argv[2])) { printf("FAIL save: %s\n", kiln_error()); rc = 1; }
    kiln_safetensors *st = kiln_safetensors_open(argv[2]);
    if (!st || kiln_safetensors_count(st) != n) { printf("FAIL reading back %s\n", argv[2]); rc = 1; }
    else printf("exported %d tensors\n", n);
    kiln_safetensors_close(st);
    kiln_optim_free(opt);
    kiln_tensor_release(x);
    kiln_tensor_release(y);
    kiln_onnx_free(m);
    kiln_device_close(dev);
    return rc;
}
