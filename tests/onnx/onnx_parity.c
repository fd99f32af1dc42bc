/*
 * onnx_parity.c — run ONNX models exported from PyTorch and compare with ONNX Runtime.
 *
 *     onnx_parity DIR DEVICE MODEL[:IO] ...
 *
 * For each MODEL, loads DIR/MODEL.onnx on DEVICE, feeds the "in.<name>" tensors of
 * DIR/IO.io.safetensors (IO defaults to MODEL) and compares every graph output with
 * "out.<name>" there, which ONNX Runtime computed (tests/fixtures/gen_onnx_models.py).
 * The error is max|kiln - ort| / max|ort| per output and must stay under 1e-4. Exits 77
 * (skip) when DEVICE cannot be opened.
 *
 * A MODEL written "!MODEL=TEXT[|TEXT...]" is a graph kiln must refuse: loading or running
 * it has to fail, and the error message has to contain every TEXT (typically the node's
 * name and what was wrong with its inputs).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

#define TOL 1e-4

static double compare(kiln_tensor *got, kiln_tensor *want) {
    int64_t n = kiln_tensor_numel(want);
    if (kiln_tensor_numel(got) != n || kiln_tensor_ndim(got) != kiln_tensor_ndim(want)) return INFINITY;
    for (int d = 0; d < kiln_tensor_ndim(want); d++)
        if (kiln_tensor_dim(got, d) != kiln_tensor_dim(want, d)) return INFINITY;
    double *a = malloc((size_t)(n + 1) * sizeof *a), *b = malloc((size_t)(n + 1) * sizeof *b);
    kiln_tensor *ga = kiln_cast(got, KILN_F64), *wb = kiln_cast(want, KILN_F64);
    double err = INFINITY;
    if (a && b && ga && wb && !kiln_to_data(ga, a, (size_t)n * sizeof *a) && !kiln_to_data(wb, b, (size_t)n * sizeof *b)) {
        double md = 0, mb = 0;
        for (int64_t i = 0; i < n; i++) {
            if (isnan(a[i]) != isnan(b[i])) { md = INFINITY; break; }
            if (fabs(a[i] - b[i]) > md) md = fabs(a[i] - b[i]);
            if (fabs(b[i]) > mb) mb = fabs(b[i]);
        }
        err = md / (mb > 1e-12 ? mb : 1.0);
    }
    kiln_tensor_release(ga);
    kiln_tensor_release(wb);
    free(a);
    free(b);
    return err;
}

/* Load and run DIR/MODEL.onnx on the inputs of DIR/MODEL.io.safetensors expecting an
 * error that mentions each '|'-separated part of want. */
static int expect_failure(const char *dir, kiln_device *dev, const char *spec) {
    char model[256], want[512], path[1024], key[300];
    snprintf(model, sizeof model, "%s", spec + 1);
    char *eq = strchr(model, '=');
    if (!eq) { printf("FAIL %s: no expected text\n", spec); return 1; }
    *eq = 0;
    snprintf(want, sizeof want, "%s", eq + 1);
    snprintf(path, sizeof path, "%s/%s.onnx", dir, model);
    char err[1024] = "";
    kiln_onnx_model *m = kiln_onnx_load(path, dev, NULL);
    kiln_tensor *ins[16] = {0}, *outs[16] = {0};
    if (!m) {
        snprintf(err, sizeof err, "%s", kiln_error());
    } else {
        snprintf(path, sizeof path, "%s/%s.io.safetensors", dir, model);
        kiln_safetensors *st = kiln_safetensors_open(path);
        int nin = kiln_onnx_input_count(m), nout = kiln_onnx_output_count(m);
        const char *names[16];
        for (int i = 0; st && i < nin && i < 16; i++) {
            names[i] = kiln_onnx_input_name(m, i);
            snprintf(key, sizeof key, "in.%s", names[i]);
            ins[i] = kiln_safetensors_load(st, key, dev);
        }
        if (!st) printf("FAIL %s: %s\n", spec, kiln_error());
        else if (kiln_onnx_run(m, nin, names, ins, nout < 16 ? nout : 16, outs) != 0)
            snprintf(err, sizeof err, "%s", kiln_error());
        /* an asynchronous device reports a check it made while the work ran (an index out
         * of range) at the next sync or read, as documented: that is where it must show */
        else if (kiln_device_sync(dev) != 0)
            snprintf(err, sizeof err, "%s", kiln_error());
        else
            err[0] = 0;
        kiln_safetensors_close(st);
        kiln_onnx_free(m);
        if (!st) return 1;
    }
    for (int i = 0; i < 16; i++) { kiln_tensor_release(ins[i]); kiln_tensor_release(outs[i]); }
    if (!err[0]) { printf("FAIL %s: ran without an error\n", model); return 1; }
    for (char *part = strtok(want, "|"); part; part = strtok(NULL, "|"))
        if (!strstr(err, part)) { printf("FAIL %s: error \"%s\" does not mention \"%s\"\n", model, err, part); return 1; }
    printf("ok   %s refused: %s\n", model, err);
    return 0;
}

static int run_one(const char *dir, kiln_device *dev, const char *spec) {
    if (spec[0] == '!') return expect_failure(dir, dev, spec);
    char model[256], io[256], path[1024];
    snprintf(model, sizeof model, "%s", spec);
    char *colon = strchr(model, ':');
    if (colon) { *colon = 0; snprintf(io, sizeof io, "%s", colon + 1); }
    else snprintf(io, sizeof io, "%s", model);
    snprintf(path, sizeof path, "%s/%s.onnx", dir, model);
    kiln_onnx_model *m = kiln_onnx_load(path, dev, NULL);
    if (!m) { printf("FAIL %s: %s\n", spec, kiln_error()); return 1; }
    snprintf(path, sizeof path, "%s/%s.io.safetensors", dir, io);
    kiln_safetensors *st = kiln_safetensors_open(path);
    if (!st) { printf("FAIL %s: %s\n", spec, kiln_error()); kiln_onnx_free(m); return 1; }
    int nin = kiln_onnx_input_count(m), nout = kiln_onnx_output_count(m), rc = 0;
    kiln_tensor *ins[16] = {0}, *outs[16] = {0};
    const char *names[16];
    char key[300];
    for (int i = 0; i < nin && i < 16; i++) {
        names[i] = kiln_onnx_input_name(m, i);
        snprintf(key, sizeof key, "in.%s", names[i]);
        ins[i] = kiln_safetensors_load(st, key, dev);
        if (!ins[i]) { printf("FAIL %s: %s\n", spec, kiln_error()); rc = 1; }
    }
    if (!rc && kiln_onnx_run(m, nin, names, ins, nout, outs)) {
        printf("FAIL %s on %s: %s\n", spec, kiln_device_name(dev), kiln_error());
        rc = 1;
    }
    for (int i = 0; !rc && i < nout; i++) {
        snprintf(key, sizeof key, "out.%s", kiln_onnx_output_name(m, i));
        kiln_tensor *want = kiln_safetensors_load(st, key, dev);
        double err = want ? compare(outs[i], want) : INFINITY;
        printf("%s %s on %s output %s: error %.3g (%d nodes)\n", err <= TOL ? "ok  " : "FAIL", spec,
               kiln_device_name(dev), kiln_onnx_output_name(m, i), err, kiln_onnx_node_count(m));
        if (!(err <= TOL)) rc = 1;
        kiln_tensor_release(want);
    }
    for (int i = 0; i < 16; i++) { kiln_tensor_release(ins[i]); kiln_tensor_release(outs[i]); }
    kiln_safetensors_close(st);
    kiln_onnx_free(m);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s DIR DEVICE MODEL[:IO]...\n", argv[0]);
        return 2;
    }
    kiln_device *dev = kiln_device_open(argv[2]);
    if (!dev) { printf("skip: %s\n", kiln_error()); return 77; }
    int fails = 0;
    for (int i = 3; i < argc; i++) fails += run_one(argv[1], dev, argv[i]);
    kiln_device_close(dev);
    return fails ? 1 : 0;
}
