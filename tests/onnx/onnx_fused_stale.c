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
    if (argc != 2) {
        fprintf(stderr, "usage: onnx_fused_stale MODEL.onnx\n");
        return 2;
    }
    kiln_device *dev = kiln_device_open("cpu");
    kiln_onnx_model *mf = dev ? load(argv[1], dev, true) : NULL, *mu = mf ? load(argv[1], dev, false) : NULL;
    if (!mu) {
        fprintf(stderr, "load: %s\n", kiln_error());
        return 1;
    }
    kiln_generator g = kiln_generator_make(3);
    kiln_tensor *x = kiln_rand_normal(dev, KILN_F32, KILN_SHAPE(2, 1, 28, 28), 0, 1, &g);
    kiln_tensor *y0 = infer(mf, x); /* packs made from the loaded weights */
    kiln_onnx_model *ms[2] = {mf, mu};
    for (int k = 0; k < 2; k++) {
        /* a plain update of every float weight, requires_grad toggled by hand */
        for (int i = 0; i < kiln_onnx_param_count(ms[k]); i++) {
            kiln_tensor *p = kiln_onnx_param(ms[k], i);
            if (!kiln_dtype_is_float(kiln_tensor_dtype(p))) continue;
            kiln_requires_grad(p, true);
            kiln_scope_begin();
            kiln_tensor *loss = kiln_sum(kiln_mul(p, p), KILN_ALL_DIMS, false);
            kiln_backward(loss, NULL);
            kiln_scope_end();
            kiln_optim_config cfg = kiln_optim_config_default(KILN_OPTIM_SGD);
            cfg.lr = 0.1;
            const char *nm = "p";
            kiln_optim *opt = kiln_optim_create(&cfg, 1, &p, &nm);
            kiln_optim_step(opt);
            kiln_optim_free(opt);
            kiln_zero_grad(p);
            kiln_requires_grad(p, false);
        }
    }
    kiln_tensor *yf = infer(mf, x), *yu = infer(mu, x);
    int rc = 1;
    if (y0 && yf && yu) {
        float a[20], b[20], c[20];
        kiln_to_data(yf, a, sizeof a);
        kiln_to_data(yu, b, sizeof b);
        kiln_to_data(y0, c, sizeof c);
        double md = 0, moved = 0;
        for (int i = 0; i < 20; i++) {
            md = fmax(md, fabs(a[i] - b[i]));
            moved = fmax(moved, fabs(a[i] - c[i]));
        }
        printf("after updating the weights (requires_grad on, SGD step, off): fused vs unfused max diff %g, "
               "outputs moved by %g\n", md, moved);
        rc = md == 0 && moved > 0 ? 0 : 1;
    }
    kiln_tensor_release(y0);
    kiln_tensor_release(yf);
    kiln_tensor_release(yu);
    kiln_tensor_release(x);
    kiln_onnx_free(mf);
    kiln_onnx_free(mu);
    kiln_device_close(dev);
    return rc;
}
