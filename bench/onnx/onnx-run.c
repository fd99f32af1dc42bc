/*
 * bench/onnx/onnx-run.c — time kiln_onnx_run on one exported model, on the cpu device
 * (or the device KILN_BENCH_DEVICE names, such as cuda:0; each run ends with a device sync).
 *
 *     onnx-run MODEL.onnx IO.safetensors [RUNS]
 *
 * Feeds the "in.<name>" tensors of IO (written by tests/fixtures/gen_onnx_models.py),
 * runs twice to warm up (the first run faults in every buffer; timing it would measure the
 * kernel's page faulting, not the model), then RUNS more (default 10), and prints one JSON
 * line: {"ms": median run, "min_ms", "rss_mb": peak resident set of this process, "err":
 * max|kiln - ort| / max|ort| over the outputs, against the "out.<name>" tensors that ONNX
 * Runtime computed, "graph": whether the timed runs launched a recorded graph
 * (kiln_onnx_options.graphs, on a device that records them; KILN_ONNX_GRAPHS=0 turns them
 * off), "graph_broken": what broke the recording when one broke}. The error travels with
 * the time so that a fast wrong answer cannot pass the bench. One model per process, so the
 * peak memory is that model's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "kiln/kiln.h"

#define MAX_IO 16

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* max|got - want| / max|want|; infinity on a shape mismatch or a NaN in one only. */
static double rel_error(kiln_tensor *got, kiln_tensor *want) {
    int64_t n = kiln_tensor_numel(want);
    if (kiln_tensor_numel(got) != n) return INFINITY;
    float *a = malloc((size_t)(n + 1) * sizeof *a), *b = malloc((size_t)(n + 1) * sizeof *b);
    kiln_tensor *ga = kiln_cast(got, KILN_F32), *wb = kiln_cast(want, KILN_F32);
    double err = INFINITY;
    if (a && b && ga && wb && !kiln_to_data(ga, a, (size_t)n * sizeof *a) &&
        !kiln_to_data(wb, b, (size_t)n * sizeof *b)) {
        double md = 0, mb = 0;
        for (int64_t i = 0; i < n; i++) {
            if (isnan(a[i]) != isnan(b[i])) { md = INFINITY; break; }
            if (fabs((double)a[i] - b[i]) > md) md = fabs((double)a[i] - b[i]);
            if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
        }
        err = md / (mb > 1e-12 ? mb : 1.0);
    }
    kiln_tensor_release(ga);
    kiln_tensor_release(wb);
    free(a);
    free(b);
    return err;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.onnx IO.safetensors [RUNS]\n", argv[0]);
        return 2;
    }
    int runs = argc > 3 ? atoi(argv[3]) : 10;
    if (runs < 1) runs = 1;
    const char *spec = getenv("KILN_BENCH_DEVICE");
    kiln_device *dev = kiln_device_open(spec && *spec ? spec : "cpu");
    if (!dev) { fprintf(stderr, "onnx-run: %s\n", kiln_error()); return 1; }
    /* KILN_BENCH_FUSE=0 turns the load-time epilogue fusion off, to measure what it buys */
    kiln_onnx_options opts = kiln_onnx_options_default();
    const char *fuse = getenv("KILN_BENCH_FUSE");
    if (fuse && !strcmp(fuse, "0"))
        opts.fuse_epilogues = false;
    kiln_onnx_model *m = kiln_onnx_load(argv[1], dev, &opts);
    kiln_safetensors *st = m ? kiln_safetensors_open(argv[2]) : NULL;
    if (!m || !st) { fprintf(stderr, "onnx-run: %s\n", kiln_error()); return 1; }
    int nin = kiln_onnx_input_count(m), nout = kiln_onnx_output_count(m);
    if (nin > MAX_IO || nout > MAX_IO) { fprintf(stderr, "onnx-run: too many inputs/outputs\n"); return 1; }
    kiln_tensor *ins[MAX_IO] = {0}, *outs[MAX_IO] = {0};
    const char *names[MAX_IO];
    char key[300];
    for (int i = 0; i < nin; i++) {
        names[i] = kiln_onnx_input_name(m, i);
        snprintf(key, sizeof key, "in.%s", names[i]);
        if (!(ins[i] = kiln_safetensors_load(st, key, dev))) { fprintf(stderr, "onnx-run: %s\n", kiln_error()); return 1; }
    }
    kiln_no_grad_begin();
    double *t = malloc((size_t)runs * sizeof *t);
    if (!t) return 1;
    for (int r = -2; r < runs; r++) {
        for (int i = 0; i < nout; i++) { kiln_tensor_release(outs[i]); outs[i] = NULL; }
        double t0 = now_ms();
        if (kiln_onnx_run(m, nin, names, ins, nout, outs) || kiln_device_sync(dev)) {
            fprintf(stderr, "onnx-run: %s\n", kiln_error());
            return 1;
        }
        if (r >= 0) t[r] = now_ms() - t0;
    }
    kiln_no_grad_end();
    double err = 0;
    for (int i = 0; i < nout; i++) {
        snprintf(key, sizeof key, "out.%s", kiln_onnx_output_name(m, i));
        kiln_tensor *want = kiln_safetensors_load(st, key, dev);
        double e = want ? rel_error(outs[i], want) : INFINITY;
        if (!(e <= err)) err = e;
        kiln_tensor_release(want);
    }
    qsort(t, (size_t)runs, sizeof *t, cmp_double);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    kiln_onnx_graph_stats gs;
    if (kiln_onnx_graph_stats_get(m, &gs))
        memset(&gs, 0, sizeof gs);
    /* the reason as a JSON string: quotes, backslashes and control bytes left out */
    char why[sizeof gs.last_broken];
    size_t w = 0;
    for (const char *c = gs.last_broken; *c && w + 1 < sizeof why; c++)
        if (*c != '"' && *c != '\\' && (unsigned char)*c >= 0x20)
            why[w++] = *c;
    why[w] = 0;
    printf("{\"ms\": %.3f, \"min_ms\": %.3f, \"rss_mb\": %.1f, \"err\": %.3g, \"graph\": %s, "
           "\"graph_launches\": %llu, \"graph_broken\": \"%s\"}\n",
           t[runs / 2], t[0], ru.ru_maxrss / 1024.0, isfinite(err) ? err : 1e30,
           gs.last_run_graph && gs.launched >= (uint64_t)runs ? "true" : "false", (unsigned long long)gs.launched,
           why);
    free(t);
    for (int i = 0; i < MAX_IO; i++) { kiln_tensor_release(ins[i]); kiln_tensor_release(outs[i]); }
    kiln_safetensors_close(st);
    kiln_onnx_free(m);
    kiln_device_close(dev);
    return 0;
}
