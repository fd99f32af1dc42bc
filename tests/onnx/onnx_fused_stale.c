/*
 * tests/onnx/onnx_fused_stale.c — a Conv's pre-packed weight must follow its weight however
 * the weight is updated. The cnn fixture is loaded fused and unfused, run once (the fused
 * load packs its weights), then every float weight gets an SGD step while requires_grad is
 * toggled on and off by hand (as kiln_module_add_parameter and kiln_module_freeze do)
 * rather than through kiln_onnx_set_trainable; the next runs must agree bit for bit.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "kiln/kiln.h"

static kiln_onnx_model *load(const char *p, kiln_device *d, bool fuse) {
    kiln_onnx_options o = kiln_onnx_options_default();
    o.fuse_epilogues = fuse;
    o.fold_batchnorm = false;
    return kiln_onnx_load(p, d, &o);
}

static kiln_tensor *infer(kiln_onnx_model *m, kiln_tensor *x) {
    const char *in = kiln_onnx_input_name(m, 0);
    kiln_tensor *out = NULL;
    if (kiln_onnx_run(m, 1, &in, &x, 1, &out)) printf("run: %s\n", kiln_error());
    return out;
}

int main(int argc, char **argv) {
    kiln_device *dev = kiln_device_open("cpu");
    kiln_onnx_model *mf = load(argv[1], dev, true), *mu = load(argv[1], dev, false);
    kiln_generator g = kiln_generator_make(3);
    kiln_tensor *x = kiln_rand_normal(dev, KILN_F32, KILN_SHAPE(2, 1, 28, 28), 0, 1, &g);
    kiln_tensor_release(infer(mf, x)); /* packs made from the loaded weights */
    kiln_onnx_model *ms[2] = {mf, mu};
    for (int k = 0; k < 2; k++) {
        /* a plain update of every float weight, under no_grad as an optimizer does */
        for (int i = 0; i < kiln_onnx_param_count(ms[k]); i++) {
            kiln_tensor *p = kiln_onnx_param(ms[k], i);
            if (!kiln_dtype_is_float(kiln_tensor_dtype(p))) continue;
            kiln_requires_grad(p, true);
            kiln_tensor *loss = kiln_sum(kiln_mul(p, p), KILN_ALL_DIMS, false);
            kiln_backward(loss, NULL);
            kiln_optim_config cfg = kiln_optim_config_default(KILN_OPTIM_SGD);
            cfg.lr = 0.1;
            const char *nm = "p";
            kiln_optim *opt = kiln_optim_create(&cfg, 1, &p, &nm);
            kiln_optim_step(opt);
            kiln_optim_free(opt);
            kiln_tensor_release(loss);
            kiln_requires_grad(p, false);
        }
    }
    kiln_tensor *yf = infer(mf, x), *yu = infer(mu, x);
    float a[20], b[20];
    kiln_to_data(yf, a, sizeof a);
    kiln_to_data(yu, b, sizeof b);
    double md = 0;
    for (int i = 0; i < 20; i++) md = fmax(md, fabs(a[i] - b[i]));
    printf("after updating the weights (requires_grad on, SGD step, off): fused vs unfused max diff %g\n", md);
    printf("fused   %g %g %g %g\nunfused %g %g %g %g\n", a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]);
    return md == 0 ? 0 : 1;
}
