/*
 * onnx_rnn.c — the cpu device's fused LSTM/GRU layer (backends/cpu/cpu-rnn.c) against the
 * composed one (engine/onnx/onnx-ops-rnn.c), on the recurrent fixtures of
 * tests/fixtures/gen_onnx_rnn.py.
 *
 *     onnx_rnn DIR MODEL...
 *
 * Each DIR/MODEL.onnx is run on the inputs of DIR/MODEL.io.safetensors (normal draws of the
 * declared shapes when there is no such file: layers large enough to run their directions
 * and batch rows on several threads, too large to commit with outputs) three ways: on cpu
 * without grad (the fused entry takes every layer), on cpu with its weights trainable and
 * grad mode on (the layers are unrolled into tensor ops, which record gradients), and on
 * the ref device (no entry: the composed ops, accumulating in double). Every output of
 * the fused run must agree with both within 1e-5 of the output's largest magnitude; the
 * parity runner compares all of them with ONNX Runtime. Then the first model is fed an X
 * one column too wide and must refuse it before running, naming the input and the size
 * the model declares, and run correctly again afterwards.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

#define TOL 1e-5
#define MAXT 8

typedef struct outputs {
    int n;
    kiln_tensor *t[MAXT];
} outputs;

static void outputs_clear(outputs *o) {
    for (int i = 0; i < MAXT; i++) kiln_tensor_release(o->t[i]);
    memset(o, 0, sizeof *o);
}

/* max|a - b| / max|b| in f64; inf on a shape mismatch or a NaN in one only. */
static double rel_diff(kiln_tensor *a, kiln_tensor *b) {
    int64_t n = kiln_tensor_numel(b);
    if (!a || kiln_tensor_numel(a) != n || kiln_tensor_ndim(a) != kiln_tensor_ndim(b)) return INFINITY;
    for (int d = 0; d < kiln_tensor_ndim(b); d++)
        if (kiln_tensor_dim(a, d) != kiln_tensor_dim(b, d)) return INFINITY;
    double *x = malloc((size_t)(n + 1) * sizeof *x), *y = malloc((size_t)(n + 1) * sizeof *y);
    kiln_tensor *ca = kiln_cast(a, KILN_F64), *cb = kiln_cast(b, KILN_F64);
    double err = INFINITY;
    if (x && y && ca && cb && !kiln_to_data(ca, x, (size_t)n * sizeof *x) && !kiln_to_data(cb, y, (size_t)n * sizeof *y)) {
        double md = 0, mb = 0;
        for (int64_t i = 0; i < n; i++) {
            if (isnan(x[i]) != isnan(y[i])) { md = INFINITY; break; }
            if (fabs(x[i] - y[i]) > md) md = fabs(x[i] - y[i]);
            if (fabs(y[i]) > mb) mb = fabs(y[i]);
        }
        err = md / (mb > 1e-12 ? mb : 1.0);
    }
    kiln_tensor_release(ca);
    kiln_tensor_release(cb);
    free(x);
    free(y);
    return err;
}

typedef struct inputs {
    int n;
    char buf[MAXT][128];     /* the names, kept past the model they came from */
    const char *names[MAXT];
    kiln_tensor *t[MAXT];
} inputs;

static void inputs_clear(inputs *in) {
    for (int i = 0; i < MAXT; i++) kiln_tensor_release(in->t[i]);
    memset(in, 0, sizeof *in);
}

/* m's inputs on dev: the "in.<name>" tensors of DIR/MODEL.io.safetensors, or, for a model
 * without that file (one too large to commit with its outputs), normal draws of the
 * declared shapes. 0, or -1 with kiln_error(). */
static int load_inputs(const char *dir, const char *model, kiln_onnx_model *m, kiln_device *dev, inputs *in) {
    char path[1024], key[300];
    snprintf(path, sizeof path, "%s/%s.io.safetensors", dir, model);
    FILE *f = fopen(path, "rb");
    kiln_safetensors *st = NULL;
    if (f) {
        fclose(f);
        if (!(st = kiln_safetensors_open(path))) return -1;
    }
    int rc = 0;
    in->n = kiln_onnx_input_count(m);
    if (in->n > MAXT) rc = -1;
    for (int i = 0; !rc && i < in->n; i++) {
        snprintf(in->buf[i], sizeof in->buf[i], "%s", kiln_onnx_input_name(m, i));
        in->names[i] = in->buf[i];
        snprintf(key, sizeof key, "in.%s", in->names[i]);
        int ndim = 0;
        int64_t shape[KILN_MAX_DIMS];
        if (st) in->t[i] = kiln_safetensors_load(st, key, dev);
        else if (kiln_onnx_input_info(m, i, &ndim, shape) == KILN_F32)
            in->t[i] = kiln_rand_normal(dev, KILN_F32, ndim, shape, 0.0, 1.0, NULL);
        if (!in->t[i]) rc = -1;
    }
    kiln_safetensors_close(st);
    return rc;
}

/* Runs DIR/MODEL.onnx on dev (trainable: weights as autodiff leaves, grad mode on) with in,
 * its first input widened by one column when widen; 0 with the outputs in out, -1 with
 * kiln_error(). */
static int run_model(const char *dir, const char *model, kiln_device *dev, bool trainable, bool widen,
                     const inputs *in, outputs *out) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.onnx", dir, model);
    kiln_onnx_model *m = kiln_onnx_load(path, dev, NULL);
    if (!m) return -1;
    out->n = kiln_onnx_output_count(m);
    int rc = out->n > MAXT ? -1 : 0;
    kiln_tensor *feed[MAXT] = {0};
    for (int i = 0; i < in->n; i++) feed[i] = in->t[i];
    kiln_tensor *wide = NULL;
    if (!rc && widen) { /* one more column of input features */
        kiln_tensor *parts[2] = {in->t[0], kiln_narrow(in->t[0], -1, 0, 1)};
        wide = kiln_cat(parts, 2, -1);
        kiln_tensor_release(parts[1]);
        feed[0] = wide;
        if (!wide) rc = -1;
    }
    if (!rc && trainable && kiln_onnx_set_trainable(m, true)) rc = -1;
    if (!rc) {
        if (!trainable) kiln_no_grad_begin();
        rc = kiln_onnx_run(m, in->n, in->names, feed, out->n, out->t) ? -1 : 0;
        if (!trainable) kiln_no_grad_end();
    }
    kiln_tensor_release(wide);
    kiln_onnx_free(m);
    return rc;
}

/* The model's inputs on cpu, for every run of it. */
static int model_inputs(const char *dir, const char *model, kiln_device *cpu, inputs *in) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.onnx", dir, model);
    kiln_onnx_model *m = kiln_onnx_load(path, cpu, NULL);
    int rc = m ? load_inputs(dir, model, m, cpu, in) : -1;
    kiln_onnx_free(m);
    return rc;
}

static int check_model(const char *dir, const char *model, kiln_device *cpu, kiln_device *ref) {
    outputs fast = {0}, comp = {0}, oracle = {0};
    inputs in = {0};
    int fails = 0;
    if (model_inputs(dir, model, cpu, &in) || run_model(dir, model, cpu, false, false, &in, &fast) ||
        run_model(dir, model, cpu, true, false, &in, &comp) || run_model(dir, model, ref, false, false, &in, &oracle)) {
        printf("FAIL %s: %s\n", model, kiln_error());
        fails = 1;
    }
    for (int i = 0; !fails && i < fast.n; i++) {
        double e1 = rel_diff(fast.t[i], comp.t[i]), e2 = rel_diff(fast.t[i], oracle.t[i]);
        bool ok = e1 <= TOL && e2 <= TOL;
        printf("%s %s output %d: fused vs composed on cpu %.3g, vs ref %.3g\n", ok ? "ok  " : "FAIL", model, i, e1, e2);
        fails += !ok;
    }
    outputs_clear(&fast);
    outputs_clear(&comp);
    outputs_clear(&oracle);
    inputs_clear(&in);
    return fails;
}

/* X one column too wide: a clear refusal, and the same model runs again afterwards. */
static int check_bad_width(const char *dir, const char *model, kiln_device *cpu) {
    outputs o = {0};
    inputs in = {0};
    int fails = 0;
    if (model_inputs(dir, model, cpu, &in)) {
        printf("FAIL %s: %s\n", model, kiln_error());
        return 1;
    }
    if (!run_model(dir, model, cpu, false, true, &in, &o)) {
        printf("FAIL %s: an X one column too wide ran\n", model);
        fails = 1;
    } else if (!strstr(kiln_error(), "input '") || !strstr(kiln_error(), "the model expects")) {
        /* the declared X is [seq, batch, features]: the run refuses the wide X up front */
        printf("FAIL %s: the error \"%s\" names neither the input nor the size the model expects\n", model,
               kiln_error());
        fails = 1;
    } else {
        printf("ok   %s refuses a wide X: %s\n", model, kiln_error());
    }
    outputs_clear(&o);
    if (run_model(dir, model, cpu, false, false, &in, &o)) {
        printf("FAIL %s after the refusal: %s\n", model, kiln_error());
        fails++;
    }
    outputs_clear(&o);
    inputs_clear(&in);
    return fails;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s DIR MODEL...\n", argv[0]);
        return 2;
    }
    kiln_device *cpu = kiln_device_open("cpu"), *ref = kiln_device_open("ref");
    if (!cpu || !ref) {
        printf("FAIL: %s\n", kiln_error());
        return 1;
    }
    int fails = 0;
    for (int i = 2; i < argc; i++) fails += check_model(argv[1], argv[i], cpu, ref);
    fails += check_bad_width(argv[1], argv[2], cpu);
    kiln_device_close(cpu);
    kiln_device_close(ref);
    return fails ? 1 : 0;
}
