/*
 * onnx_rnn.c — the cpu device's fused LSTM/GRU layer (backends/cpu/cpu-rnn.c) against the
 * composed one (engine/onnx/onnx-ops-rnn.c), on the recurrent fixtures of
 * tests/fixtures/gen_onnx_rnn.py.
 *
 *     onnx_rnn DIR MODEL...
 *
 * Each DIR/MODEL.onnx is run on the inputs of DIR/MODEL.io.safetensors three ways: on cpu
 * without grad (the fused entry takes every layer), on cpu with its weights trainable and
 * grad mode on (the layers are unrolled into tensor ops, which record gradients), and on
 * the ref device (no entry: the composed ops, accumulating in double). Every output of
 * the fused run must agree with both within 1e-5 of the output's largest magnitude; the
 * parity runner compares all of them with ONNX Runtime. Then the first model is fed an X
 * one column too wide and must refuse it with a message naming the node and the input size,
 * and run correctly again afterwards.
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

/* Runs DIR/MODEL.onnx on dev (trainable: weights as autodiff leaves, grad mode on), with
 * X widened by one column when widen; 0 with the outputs in out, -1 with kiln_error(). */
static int run_model(const char *dir, const char *model, kiln_device *dev, bool trainable, bool widen, outputs *out) {
    char path[1024], key[300];
    snprintf(path, sizeof path, "%s/%s.onnx", dir, model);
    kiln_onnx_model *m = kiln_onnx_load(path, dev, NULL);
    snprintf(path, sizeof path, "%s/%s.io.safetensors", dir, model);
    kiln_safetensors *st = m ? kiln_safetensors_open(path) : NULL;
    if (!m || !st) { kiln_onnx_free(m); return -1; }
    int nin = kiln_onnx_input_count(m), rc = 0;
    out->n = kiln_onnx_output_count(m);
    kiln_tensor *ins[MAXT] = {0};
    const char *names[MAXT];
    if (nin > MAXT || out->n > MAXT) rc = -1;
    for (int i = 0; !rc && i < nin; i++) {
        names[i] = kiln_onnx_input_name(m, i);
        snprintf(key, sizeof key, "in.%s", names[i]);
        if (!(ins[i] = kiln_safetensors_load(st, key, dev))) rc = -1;
        if (!rc && widen && i == 0) { /* one more column of input features */
            kiln_tensor *parts[2] = {ins[0], kiln_narrow(ins[0], -1, 0, 1)};
            kiln_tensor *w = kiln_cat(parts, 2, -1);
            kiln_tensor_release(parts[1]);
            kiln_tensor_release(ins[0]);
            ins[0] = w;
            if (!w) rc = -1;
        }
    }
    if (!rc && trainable && kiln_onnx_set_trainable(m, true)) rc = -1;
    if (!rc) {
        if (!trainable) kiln_no_grad_begin();
        rc = kiln_onnx_run(m, nin, names, ins, out->n, out->t) ? -1 : 0;
        if (!trainable) kiln_no_grad_end();
    }
    for (int i = 0; i < MAXT; i++) kiln_tensor_release(ins[i]);
    kiln_safetensors_close(st);
    kiln_onnx_free(m);
    return rc;
}

static int check_model(const char *dir, const char *model, kiln_device *cpu, kiln_device *ref) {
    outputs fast = {0}, comp = {0}, oracle = {0};
    int fails = 0;
    if (run_model(dir, model, cpu, false, false, &fast) || run_model(dir, model, cpu, true, false, &comp) ||
        run_model(dir, model, ref, false, false, &oracle)) {
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
    return fails;
}

/* X one column too wide: a clear refusal, and the same model runs again afterwards. */
static int check_bad_width(const char *dir, const char *model, kiln_device *cpu) {
    outputs o = {0};
    int fails = 0;
    if (!run_model(dir, model, cpu, false, true, &o)) {
        printf("FAIL %s: an X one column too wide ran\n", model);
        fails = 1;
    } else if (!strstr(kiln_error(), "node '") || !strstr(kiln_error(), "input features")) {
        printf("FAIL %s: the error \"%s\" names neither the node nor the input size\n", model, kiln_error());
        fails = 1;
    } else {
        printf("ok   %s refuses a wide X: %s\n", model, kiln_error());
    }
    outputs_clear(&o);
    if (run_model(dir, model, cpu, false, false, &o)) {
        printf("FAIL %s after the refusal: %s\n", model, kiln_error());
        fails++;
    }
    outputs_clear(&o);
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
