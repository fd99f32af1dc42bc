/*
 * onnx_fused.c — the loader's epilogue fusion (kiln_onnx_options.fuse_epilogues) and the
 * Conv weight packs it brings must not change a model's outputs.
 *
 *     onnx_fused DIR MODEL[:IO[,IO...]][@FLAGS] ...
 *     onnx_fused --train MODEL.onnx
 *
 * The first form loads DIR/MODEL.onnx on cpu twice, fusion on and off, feeds both the
 * "in.<name>" tensors of each DIR/IO.io.safetensors in turn (IO defaults to MODEL; a
 * later IO runs on the models the earlier ones ran on, so a pack made for one batch size
 * serves the next), runs the fused model a second time (its packs then exist already)
 * and compares every output. FLAGS: 'b' = fused and unfused must agree to the bit (else
 * within 1e-6 of the output's largest magnitude), 'f' = fusion must remove nodes.
 *
 * --train: the packs are copies of the weights. A fused and an unfused load of MODEL run
 * once frozen (the fused one packs its Conv weights), are trained alike for a few Adam
 * steps (their losses must agree to the bit: while training, fused nodes run as the
 * separate ops), are frozen again and run: their outputs must agree to the bit, and
 * differ from the first run's, so a stale pack would show.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

#define MAXT 16

/* got and want in f64 (exact for f32): 0 when every element has the same bits (any NaN
 * matches any NaN), else max|got - want| / max|want| (inf for NaN against a number or a
 * shape mismatch). */
static double diff(kiln_tensor *got, kiln_tensor *want, bool *bitwise) {
    *bitwise = false;
    int64_t n = kiln_tensor_numel(want);
    if (!got || kiln_tensor_ndim(got) != kiln_tensor_ndim(want) || kiln_tensor_dtype(got) != kiln_tensor_dtype(want))
        return INFINITY;
    for (int d = 0; d < kiln_tensor_ndim(want); d++)
        if (kiln_tensor_dim(got, d) != kiln_tensor_dim(want, d)) return INFINITY;
    double *a = malloc((size_t)(n + 1) * sizeof *a), *b = malloc((size_t)(n + 1) * sizeof *b);
    kiln_tensor *ga = kiln_cast(got, KILN_F64), *wb = kiln_cast(want, KILN_F64);
    double err = INFINITY;
    if (a && b && ga && wb && !kiln_to_data(ga, a, (size_t)n * sizeof *a) &&
        !kiln_to_data(wb, b, (size_t)n * sizeof *b)) {
        double md = 0, mb = 0;
        *bitwise = true;
        for (int64_t i = 0; i < n; i++) {
            if (isnan(a[i]) || isnan(b[i])) {
                if (!(isnan(a[i]) && isnan(b[i]))) { md = INFINITY; *bitwise = false; }
                continue;
            }
            if (memcmp(&a[i], &b[i], sizeof a[i])) *bitwise = false;
            if (fabs(a[i] - b[i]) > md) md = fabs(a[i] - b[i]);
            if (fabs(b[i]) > mb) mb = fabs(b[i]);
        }
        err = *bitwise ? 0 : md / (mb > 1e-30 ? mb : 1.0);
    }
    kiln_tensor_release(ga);
    kiln_tensor_release(wb);
    free(a);
    free(b);
    return err;
}

static kiln_onnx_model *load(const char *path, kiln_device *dev, bool fuse, bool fold_bn) {
    kiln_onnx_options o = kiln_onnx_options_default();
    o.fuse_epilogues = fuse;
    o.fold_batchnorm = fold_bn;
    kiln_onnx_model *m = kiln_onnx_load(path, dev, &o);
    if (!m) printf("FAIL load %s (fusion %s): %s\n", path, fuse ? "on" : "off", kiln_error());
    return m;
}

static int run(kiln_onnx_model *m, int nin, const char **names, kiln_tensor **ins, kiln_tensor **outs) {
    int nout = kiln_onnx_output_count(m);
    if (nout > MAXT) nout = MAXT;
    if (kiln_onnx_run(m, nin, names, ins, nout, outs)) {
        printf("FAIL run: %s\n", kiln_error());
        return -1;
    }
    return nout;
}

static void release_all(kiln_tensor **ts) {
    for (int i = 0; i < MAXT; i++) { kiln_tensor_release(ts[i]); ts[i] = NULL; }
}

/* One IO file through both loads; fused twice. */
static int check_io(const char *spec, const char *path, kiln_device *dev, kiln_onnx_model *mf, kiln_onnx_model *mu,
                    bool want_bitwise) {
    kiln_safetensors *st = kiln_safetensors_open(path);
    if (!st) { printf("FAIL %s: %s\n", spec, kiln_error()); return 1; }
    int nin = kiln_onnx_input_count(mf), rc = 0;
    kiln_tensor *ins[MAXT] = {0}, *ou[MAXT] = {0}, *of1[MAXT] = {0}, *of2[MAXT] = {0};
    const char *names[MAXT];
    char key[300];
    for (int i = 0; i < nin && i < MAXT; i++) {
        names[i] = kiln_onnx_input_name(mf, i);
        snprintf(key, sizeof key, "in.%s", names[i]);
        ins[i] = kiln_safetensors_load(st, key, dev);
        if (!ins[i]) { printf("FAIL %s: %s\n", spec, kiln_error()); rc = 1; }
    }
    int nu = rc ? -1 : run(mu, nin, names, ins, ou);
    int n1 = nu < 0 ? -1 : run(mf, nin, names, ins, of1);
    int n2 = n1 < 0 ? -1 : run(mf, nin, names, ins, of2);
    if (nu < 0 || n1 != nu || n2 != nu) rc = 1;
    for (int i = 0; !rc && i < nu; i++) {
        bool bw, bw2;
        double err = diff(of1[i], ou[i], &bw);
        diff(of2[i], of1[i], &bw2);
        bool ok = want_bitwise ? bw : err <= 1e-6;
        printf("%s %s output %s: fused vs unfused %s (%.3g), second fused run %s\n", ok && bw2 ? "ok  " : "FAIL",
               spec, kiln_onnx_output_name(mf, i), bw ? "bitwise" : "differ", err, bw2 ? "bitwise" : "differs");
        if (!ok || !bw2) rc = 1;
    }
    release_all(ins);
    release_all(ou);
    release_all(of1);
    release_all(of2);
    kiln_safetensors_close(st);
    return rc;
}

static int check_model(const char *dir, kiln_device *dev, const char *spec) {
    char model[256], ios[512], flags[32] = "", path[1024];
    snprintf(model, sizeof model, "%s", spec);
    char *at = strchr(model, '@');
    if (at) { snprintf(flags, sizeof flags, "%s", at + 1); *at = 0; }
    char *colon = strchr(model, ':');
    if (colon) { snprintf(ios, sizeof ios, "%s", colon + 1); *colon = 0; }
    else snprintf(ios, sizeof ios, "%s", model);
    snprintf(path, sizeof path, "%s/%s.onnx", dir, model);
    kiln_onnx_model *mf = load(path, dev, true, true), *mu = load(path, dev, false, true);
    int rc = !mf || !mu;
    if (!rc) {
        int cf = kiln_onnx_node_count(mf), cu = kiln_onnx_node_count(mu);
        bool fewer = cf < cu;
        printf("%s %s: %d nodes fused, %d unfused\n", fewer || !strchr(flags, 'f') ? "ok  " : "FAIL", model, cf, cu);
        if (strchr(flags, 'f') && !fewer) rc = 1;
        if (cf > cu) rc = 1;
    }
    for (char *io = strtok(ios, ","); !rc && io; io = strtok(NULL, ",")) {
        snprintf(path, sizeof path, "%s/%s.io.safetensors", dir, io);
        char label[600];
        snprintf(label, sizeof label, "%s on %s", model, io);
        rc |= check_io(label, path, dev, mf, mu, strchr(flags, 'b') != NULL);
    }
    kiln_onnx_free(mf);
    kiln_onnx_free(mu);
    return rc;
}

/* ------------------------------------------------------------------ --train */

typedef struct trainee {
    kiln_onnx_model *m;
    kiln_optim *opt;
} trainee;

static int trainee_start(trainee *t) {
    if (kiln_onnx_set_trainable(t->m, true)) { printf("FAIL set_trainable: %s\n", kiln_error()); return -1; }
    kiln_tensor *params[64];
    const char *names[64];
    int n = 0;
    for (int i = 0; i < kiln_onnx_param_count(t->m) && n < 64; i++)
        if (kiln_dtype_is_float(kiln_tensor_dtype(kiln_onnx_param(t->m, i)))) {
            params[n] = kiln_onnx_param(t->m, i);
            names[n++] = kiln_onnx_param_name(t->m, i);
        }
    kiln_optim_config cfg = kiln_optim_config_default(KILN_OPTIM_ADAM);
    cfg.lr = 3e-3;
    t->opt = kiln_optim_create(&cfg, n, params, names);
    if (!t->opt) { printf("FAIL optim: %s\n", kiln_error()); return -1; }
    return n;
}

/* One Adam step on (x, y); the loss, or NAN on a failure. */
static double trainee_step(trainee *t, kiln_tensor *x, kiln_tensor *y) {
    const char *in_name = kiln_onnx_input_name(t->m, 0);
    kiln_scope_begin();
    kiln_tensor *logits = NULL;
    double l = NAN;
    if (kiln_onnx_run(t->m, 1, &in_name, &x, 1, &logits) == 0) {
        kiln_tensor *loss = kiln_loss_cross_entropy(logits, y, NULL);
        if (loss && kiln_tensor_requires_grad(loss) && !kiln_backward(loss, NULL) && kiln_optim_step(t->opt) >= 0)
            l = kiln_item(loss);
        kiln_optim_zero_grad(t->opt);
    }
    if (isnan(l)) printf("FAIL training step: %s\n", kiln_error());
    kiln_tensor_release(logits);
    kiln_scope_end();
    return l;
}

static kiln_tensor *infer(kiln_onnx_model *m, kiln_tensor *x) {
    const char *in_name = kiln_onnx_input_name(m, 0);
    kiln_tensor *out = NULL;
    if (kiln_onnx_run(m, 1, &in_name, &x, 1, &out)) printf("FAIL run: %s\n", kiln_error());
    return out;
}

static int check_train(const char *path) {
    kiln_device *dev = kiln_device_open("cpu");
    if (!dev) { printf("skip: %s\n", kiln_error()); return 77; }
    /* every initializer stays a parameter, as in onnx_train.c */
    trainee tf = {load(path, dev, true, false), NULL}, tu = {load(path, dev, false, false), NULL};
    int rc = !tf.m || !tu.m;
    kiln_generator g = kiln_generator_make(11);
    kiln_scope_begin();
    kiln_tensor *x = kiln_keep(kiln_rand_normal(dev, KILN_F32, KILN_SHAPE(8, 1, 28, 28), 0, 1, &g));
    kiln_tensor *y = kiln_keep(kiln_argmax(
        kiln_mean(kiln_reshape(kiln_narrow(kiln_reshape(x, KILN_SHAPE(8, 784)), 1, 0, 780), KILN_SHAPE(8, 10, 78)),
                  KILN_DIMS(2), false),
        1, false));
    kiln_scope_end();
    kiln_tensor *before_f = NULL, *before_u = NULL, *after_f = NULL, *after_u = NULL, *again_f = NULL;
    bool bw = false;
    if (!rc) {
        /* frozen: the fused load packs its Conv weights here */
        before_f = infer(tf.m, x);
        before_u = infer(tu.m, x);
        double e = before_f && before_u ? diff(before_f, before_u, &bw) : INFINITY;
        printf("%s frozen, before training: fused vs unfused %s (%.3g)\n", bw ? "ok  " : "FAIL",
               bw ? "bitwise" : "differ", e);
        if (!bw) rc = 1;
    }
    if (!rc && (trainee_start(&tf) < 0 || trainee_start(&tu) < 0)) rc = 1;
    for (int step = 0; !rc && step < 4; step++) {
        double lf = trainee_step(&tf, x, y), lu = trainee_step(&tu, x, y);
        bool same = lf == lu;
        printf("%s training step %d: loss fused %.9g, unfused %.9g\n", same ? "ok  " : "FAIL", step, lf, lu);
        if (!same) rc = 1;
    }
    if (!rc && (kiln_onnx_set_trainable(tf.m, false) || kiln_onnx_set_trainable(tu.m, false))) {
        printf("FAIL set_trainable(false): %s\n", kiln_error());
        rc = 1;
    }
    if (!rc) {
        after_f = infer(tf.m, x);
        after_u = infer(tu.m, x);
        again_f = infer(tf.m, x);
        rc = !after_f || !after_u || !again_f;
    }
    if (!rc) {
        bool moved;
        double e = diff(after_f, after_u, &bw), d = diff(after_u, before_u, &moved);
        printf("%s frozen again, after training: fused vs unfused %s (%.3g)\n", bw ? "ok  " : "FAIL",
               bw ? "bitwise" : "differ", e);
        /* the check above only sees a stale pack if training moved the outputs */
        printf("%s training moved the outputs by %.3g\n", !moved && d > 1e-4 ? "ok  " : "FAIL", d);
        bool bw2;
        diff(again_f, after_f, &bw2);
        printf("%s second frozen run of the fused load %s\n", bw2 ? "ok  " : "FAIL", bw2 ? "bitwise" : "differs");
        if (!bw || moved || !(d > 1e-4) || !bw2) rc = 1;
    }
    kiln_tensor *ts[] = {before_f, before_u, after_f, after_u, again_f, x, y};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) kiln_tensor_release(ts[i]);
    kiln_optim_free(tf.opt);
    kiln_optim_free(tu.opt);
    kiln_onnx_free(tf.m);
    kiln_onnx_free(tu.m);
    kiln_device_close(dev);
    return rc;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--train")) return check_train(argv[2]);
    if (argc < 3) {
        fprintf(stderr, "usage: %s DIR MODEL[:IO[,IO...]][@FLAGS]...\n       %s --train MODEL.onnx\n", argv[0], argv[0]);
        return 2;
    }
    kiln_device *dev = kiln_device_open("cpu");
    if (!dev) { printf("skip: %s\n", kiln_error()); return 77; }
    int fails = 0;
    for (int i = 2; i < argc; i++) fails += check_model(argv[1], dev, argv[i]);
    kiln_device_close(dev);
    return fails ? 1 : 0;
}
