/*
 * tests/vulkan-nn/test-onnx-host.c — the ONNX executor keeps shape arithmetic on the host
 * for a device whose buffers are not host memory (engine/onnx/onnx-host.c).
 *
 * The encoder fixture (a Transformer encoder exported by PyTorch) computes its reshapes from
 * Shape -> Gather -> Unsqueeze -> Concat chains: 18 Shape nodes, 28 Reshapes, 9 Slices. Run
 * on counting:vulkan:0, a planned run must make no download at all (before, every Reshape
 * and Slice read its integer arguments back from the device, each read a wait), and its
 * outputs must still match ONNX Runtime's within 1e-4.
 *
 * Usage: test-onnx-host FIXTURES_DIR [DEVICE]; exit 77 when the device does not open.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/autodiff.h"
#include "kiln/kiln.h"

static int failures;

#define CHECK(cond, ...)                                                                                          \
    do {                                                                                                          \
        if (!(cond)) {                                                                                            \
            failures++;                                                                                           \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                                           \
            printf(__VA_ARGS__);                                                                                  \
            printf(" (last error: %s)\n", kiln_error());                                                          \
        }                                                                                                         \
    } while (0)

/* max |got - want| / max |want| */
static double rel_error(kiln_tensor *got, kiln_tensor *want)
{
    int64_t n = kiln_tensor_numel(want);
    if (kiln_tensor_numel(got) != n)
        return INFINITY;
    float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
    kiln_tensor *ga = kiln_cast(got, KILN_F32), *gb = kiln_cast(want, KILN_F32);
    double e = INFINITY;
    if (a && b && ga && gb && kiln_to_data(ga, a, (size_t)n * sizeof *a) == 0 &&
        kiln_to_data(gb, b, (size_t)n * sizeof *b) == 0) {
        double diff = 0, scale = 0;
        for (int64_t i = 0; i < n; i++) {
            diff = fmax(diff, fabs((double)a[i] - b[i]));
            scale = fmax(scale, fabs((double)b[i]));
        }
        e = diff / (scale > 0 ? scale : 1);
    }
    kiln_tensor_release(ga);
    kiln_tensor_release(gb);
    free(a);
    free(b);
    return e;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s FIXTURES_DIR [DEVICE]\n", argv[0]);
        return 2;
    }
    const char *inner = argc > 2 ? argv[2] : "vulkan:0";
    kiln_device *probe = kiln_device_open(inner);
    if (!probe) {
        printf("skipped: %s does not open: %s\n", inner, kiln_error());
        return 77;
    }
    kiln_device_close(probe);
    char spec[128], path[1024], io[1024];
    snprintf(spec, sizeof spec, "counting:%s", inner);
    snprintf(path, sizeof path, "%s/encoder.onnx", argv[1]);
    snprintf(io, sizeof io, "%s/encoder.io.safetensors", argv[1]);
    kiln_device *dev = kiln_device_open(spec);
    kiln_onnx_model *m = dev ? kiln_onnx_load(path, dev, NULL) : NULL;
    kiln_safetensors *st = m ? kiln_safetensors_open(io) : NULL;
    if (!st) {
        printf("FAIL: cannot set up %s on %s: %s\n", path, spec, kiln_error());
        return 1;
    }
    enum {
        MAX_IO = 8
    };
    int nin = kiln_onnx_input_count(m), nout = kiln_onnx_output_count(m);
    kiln_tensor *ins[MAX_IO] = {0}, *outs[MAX_IO] = {0};
    const char *names[MAX_IO];
    char key[300];
    CHECK(nin <= MAX_IO && nout <= MAX_IO, "at most %d inputs and outputs", MAX_IO);
    for (int i = 0; i < nin && i < MAX_IO; i++) {
        names[i] = kiln_onnx_input_name(m, i);
        snprintf(key, sizeof key, "in.%s", names[i]);
        ins[i] = kiln_safetensors_load(st, key, dev);
        CHECK(ins[i], "input %s loads", key);
    }
    kiln_no_grad_begin();
    /* the first run plans the activation arena; the second is what every later one does */
    int rc = kiln_onnx_run(m, nin, names, ins, nout, outs);
    CHECK(rc == 0, "the first run");
    for (int i = 0; i < nout; i++) {
        kiln_tensor_release(outs[i]);
        outs[i] = NULL;
    }
    kiln_device_counters before, after;
    CHECK(kiln_device_counters_get(dev, &before, NULL, NULL) == 0, "counters before");
    rc = kiln_onnx_run(m, nin, names, ins, nout, outs);
    CHECK(rc == 0, "the second run");
    CHECK(kiln_device_counters_get(dev, &after, NULL, NULL) == 0, "counters after");
    uint64_t downloads = after.downloads - before.downloads, syncs = after.syncs - before.syncs;
    printf("one run of the encoder on %s: %llu primitive calls, %llu uploads, %llu downloads, %llu syncs\n", spec,
           (unsigned long long)(after.calls - before.calls), (unsigned long long)(after.uploads - before.uploads),
           (unsigned long long)downloads, (unsigned long long)syncs);
    CHECK(downloads == 0, "a run reads nothing back from the device (%llu downloads)",
          (unsigned long long)downloads);
    CHECK(syncs == 0, "a run waits for nothing (%llu syncs)", (unsigned long long)syncs);
    for (int i = 0; rc == 0 && i < nout; i++) {
        snprintf(key, sizeof key, "out.%s", kiln_onnx_output_name(m, i));
        kiln_tensor *want = kiln_safetensors_load(st, key, dev);
        double e = want ? rel_error(outs[i], want) : INFINITY;
        printf("output %s: relative error %.3g against ONNX Runtime\n", key, e);
        CHECK(e <= 1e-4, "output %s within 1e-4 of ONNX Runtime's (%.3g)", key, e);
        kiln_tensor_release(want);
    }
    kiln_no_grad_end();
    for (int i = 0; i < MAX_IO; i++) {
        kiln_tensor_release(ins[i]);
        kiln_tensor_release(outs[i]);
    }
    kiln_safetensors_close(st);
    kiln_onnx_free(m);
    kiln_device_close(dev);
    printf("test-onnx-host: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
