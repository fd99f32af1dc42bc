/*
 * onnx_calls.c — what the loader's planning saves, counted: the backend calls one run of a
 * model makes through the counting decorator.
 *
 *     onnx_calls MODEL.onnx IO.safetensors DEVICE MAX_CALLS ENTRY=MAX ...
 *
 * Loads MODEL on DEVICE (a counting one, "counting:cpu"), runs it twice on the "in.<name>"
 * tensors of IO, and requires the second run to make at most MAX_CALLS backend calls in all
 * and at most MAX calls of each named entry. The limits sit just above what the current
 * planning makes, so a change that brings work back (common subexpressions kept, constant
 * Gather indices wrapped again) fails here instead of only slowing models down.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

#define MAXT 16

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL.onnx IO.safetensors DEVICE MAX_CALLS [ENTRY=MAX ...]\n", argv[0]);
        return 2;
    }
    kiln_device *dev = kiln_device_open(argv[3]);
    if (!dev) {
        printf("%s does not open here (%s): skipped\n", argv[3], kiln_error());
        return 77;
    }
    kiln_onnx_model *m = kiln_onnx_load(argv[1], dev, NULL);
    kiln_safetensors *st = m ? kiln_safetensors_open(argv[2]) : NULL;
    if (!m || !st) {
        printf("FAIL %s: %s\n", argv[1], kiln_error());
        return 1;
    }
    int nin = kiln_onnx_input_count(m), nout = kiln_onnx_output_count(m);
    nout = nout > MAXT ? MAXT : nout;
    kiln_tensor *ins[MAXT] = {0}, *outs[MAXT] = {0};
    const char *names[MAXT];
    char key[300];
    for (int i = 0; i < nin && i < MAXT; i++) {
        names[i] = kiln_onnx_input_name(m, i);
        snprintf(key, sizeof key, "in.%s", names[i]);
        ins[i] = kiln_safetensors_load(st, key, dev);
    }
    int failures = 0;
    kiln_no_grad_begin();
    kiln_device_counters before, after;
    int nlimits = argc - 5;
    uint64_t *at = calloc((size_t)nlimits + 1, sizeof *at);
    for (int r = 0; r < 2; r++) {
        if (r == 1) {
            kiln_device_counters_get(dev, &before, NULL, NULL);
            for (int i = 0; i < nlimits; i++) {
                char entry[64];
                snprintf(entry, sizeof entry, "%.*s", (int)strcspn(argv[5 + i], "="), argv[5 + i]);
                kiln_device_counters_get(dev, &before, entry, &at[i]);
            }
        }
        for (int i = 0; i < MAXT; i++) {
            kiln_tensor_release(outs[i]);
            outs[i] = NULL;
        }
        if (kiln_onnx_run(m, nin, names, ins, nout, outs)) {
            printf("FAIL run: %s\n", kiln_error());
            return 1;
        }
        kiln_device_sync(dev);
    }
    kiln_no_grad_end();
    kiln_device_counters_get(dev, &after, NULL, NULL);
    uint64_t calls = after.calls - before.calls;
    long max_calls = atol(argv[4]);
    bool ok = calls <= (uint64_t)max_calls;
    printf("%s %s on %s: %llu backend calls a run (at most %ld)\n", ok ? "ok  " : "FAIL", argv[1], argv[3],
           (unsigned long long)calls, max_calls);
    failures += !ok;
    for (int i = 0; i < nlimits; i++) {
        char entry[64];
        snprintf(entry, sizeof entry, "%.*s", (int)strcspn(argv[5 + i], "="), argv[5 + i]);
        const char *eq = strchr(argv[5 + i], '=');
        long max = eq ? atol(eq + 1) : 0;
        uint64_t now = 0;
        kiln_device_counters_get(dev, &after, entry, &now);
        ok = now - at[i] <= (uint64_t)max;
        printf("%s   %s: %llu a run (at most %ld)\n", ok ? "ok  " : "FAIL", entry,
               (unsigned long long)(now - at[i]), max);
        failures += !ok;
    }
    free(at);
    for (int i = 0; i < MAXT; i++) {
        kiln_tensor_release(ins[i]);
        kiln_tensor_release(outs[i]);
    }
    kiln_safetensors_close(st);
    kiln_onnx_free(m);
    kiln_device_close(dev);
    return failures ? 1 : 0;
}
