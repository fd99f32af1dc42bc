/*
 * onnx_cse.c — the loader's common-subexpression pass (kiln_onnx_options.
 * common_subexpressions) must not change a model's outputs, and must drop the repeats it is
 * there for.
 *
 *     onnx_cse DIR DEVICE MODEL[@IO][:MIN] ...
 *
 * Loads DIR/MODEL.onnx on DEVICE with the pass on and off, feeds both the "in.<name>" tensors
 * of DIR/IO.io.safetensors (IO defaults to MODEL) and requires every output equal to the bit (any NaN matching
 * any NaN), and the pass to have dropped at least MIN nodes (default 0). Then checks that
 * KILN_ONNX_CSE=0 in the environment turns the pass off at load, as the option does.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

#define MAXT 16

static int failures;

/* true when got and want have the same dtype, shape and bytes (NaNs compared as NaN) */
static bool same_bits(kiln_tensor *got, kiln_tensor *want)
{
    if (!got || !want || kiln_tensor_ndim(got) != kiln_tensor_ndim(want) ||
        kiln_tensor_dtype(got) != kiln_tensor_dtype(want))
        return false;
    for (int d = 0; d < kiln_tensor_ndim(want); d++)
        if (kiln_tensor_dim(got, d) != kiln_tensor_dim(want, d))
            return false;
    int64_t n = kiln_tensor_numel(want);
    kiln_tensor *ga = kiln_cast(got, KILN_F64), *wa = kiln_cast(want, KILN_F64);
    double *a = malloc((size_t)(n + 1) * sizeof *a), *b = malloc((size_t)(n + 1) * sizeof *b);
    bool same = a && b && ga && wa && !kiln_to_data(ga, a, (size_t)n * sizeof *a) &&
                !kiln_to_data(wa, b, (size_t)n * sizeof *b);
    for (int64_t i = 0; same && i < n; i++)
        same = (isnan(a[i]) && isnan(b[i])) || !memcmp(&a[i], &b[i], sizeof a[i]);
    kiln_tensor_release(ga);
    kiln_tensor_release(wa);
    free(a);
    free(b);
    return same;
}

static kiln_onnx_model *load(const char *path, kiln_device *dev, bool cse)
{
    kiln_onnx_options o = kiln_onnx_options_default();
    o.common_subexpressions = cse;
    kiln_onnx_model *m = kiln_onnx_load(path, dev, &o);
    if (!m) {
        printf("FAIL load %s (cse %s): %s\n", path, cse ? "on" : "off", kiln_error());
        failures++;
    }
    return m;
}

static void check_model(const char *dir, const char *spec, kiln_device *dev)
{
    char name[256], path[600], io[600];
    snprintf(name, sizeof name, "%s", spec);
    int min_dropped = 0;
    char *colon = strchr(name, ':');
    if (colon) {
        *colon = '\0';
        min_dropped = atoi(colon + 1);
    }
    const char *io_name = name;
    char *at = strchr(name, '@');
    if (at) {
        *at = '\0';
        io_name = at + 1;
    }
    snprintf(path, sizeof path, "%s/%s.onnx", dir, name);
    snprintf(io, sizeof io, "%s/%s.io.safetensors", dir, io_name);
    kiln_onnx_model *on = load(path, dev, true), *off = load(path, dev, false);
    kiln_safetensors *st = on && off ? kiln_safetensors_open(io) : NULL;
    if (!st) {
        if (on && off) {
            printf("FAIL %s: %s\n", io, kiln_error());
            failures++;
        }
        kiln_onnx_free(on);
        kiln_onnx_free(off);
        return;
    }
    int nodes_on = kiln_onnx_node_count(on), nodes_off = kiln_onnx_node_count(off);
    int dropped = nodes_off - nodes_on;
    bool enough = dropped >= min_dropped && dropped >= 0;
    printf("%s %s: %d nodes with the pass, %d without (%d dropped, at least %d wanted)\n",
           enough ? "ok  " : "FAIL", name, nodes_on, nodes_off, dropped, min_dropped);
    if (!enough)
        failures++;
    int nin = kiln_onnx_input_count(on), nout = kiln_onnx_output_count(on);
    if (nout > MAXT)
        nout = MAXT;
    kiln_tensor *ins[MAXT] = {0}, *a[MAXT] = {0}, *b[MAXT] = {0};
    const char *names[MAXT];
    char key[300];
    bool ok = true;
    for (int i = 0; i < nin && i < MAXT; i++) {
        names[i] = kiln_onnx_input_name(on, i);
        snprintf(key, sizeof key, "in.%s", names[i]);
        ins[i] = kiln_safetensors_load(st, key, dev);
        ok = ok && ins[i];
    }
    kiln_no_grad_begin();
    /* twice each: a second run takes the paths a first one prepares (arena, caches) */
    for (int r = 0; ok && r < 2; r++) {
        for (int i = 0; i < MAXT; i++) {
            kiln_tensor_release(a[i]);
            kiln_tensor_release(b[i]);
            a[i] = b[i] = NULL;
        }
        if (kiln_onnx_run(on, nin, names, ins, nout, a) || kiln_onnx_run(off, nin, names, ins, nout, b)) {
            printf("FAIL %s run %d: %s\n", name, r, kiln_error());
            ok = false;
            break;
        }
        for (int i = 0; i < nout; i++)
            if (!same_bits(a[i], b[i])) {
                printf("FAIL %s run %d output %s: differs with the pass\n", name, r, kiln_onnx_output_name(on, i));
                ok = false;
            }
    }
    kiln_no_grad_end();
    printf("%s %s: %d outputs equal to the bit with and without the pass\n", ok ? "ok  " : "FAIL", name, nout);
    if (!ok)
        failures++;
    for (int i = 0; i < MAXT; i++) {
        kiln_tensor_release(ins[i]);
        kiln_tensor_release(a[i]);
        kiln_tensor_release(b[i]);
    }
    kiln_safetensors_close(st);

    /* the environment's 0 wins over the option's default */
    setenv("KILN_ONNX_CSE", "0", 1);
    kiln_onnx_model *env_off = load(path, dev, true);
    unsetenv("KILN_ONNX_CSE");
    if (env_off) {
        int n = kiln_onnx_node_count(env_off);
        bool same = n == nodes_off;
        printf("%s %s: KILN_ONNX_CSE=0 loads %d nodes (the pass off: %d)\n", same ? "ok  " : "FAIL", name, n,
               nodes_off);
        if (!same)
            failures++;
    }
    kiln_onnx_free(env_off);
    kiln_onnx_free(on);
    kiln_onnx_free(off);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s DIR DEVICE MODEL[@IO][:MIN] ...\n", argv[0]);
        return 2;
    }
    kiln_device *dev = kiln_device_open(argv[2]);
    if (!dev) {
        printf("%s does not open here (%s): skipped\n", argv[2], kiln_error());
        return 77;
    }
    for (int i = 3; i < argc; i++)
        check_model(argv[1], argv[i], dev);
    kiln_device_close(dev);
    printf("onnx_cse %s: %d failures\n", argv[2], failures);
    return failures ? 1 : 0;
}
