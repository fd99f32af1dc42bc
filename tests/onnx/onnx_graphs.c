/*
 * onnx_graphs.c — the ONNX executor's recorded graphs (kiln_onnx_options.graphs) must not
 * change what a model computes, must take each run's own inputs, must hand the caller
 * outputs that later runs leave alone, and must say whether a graph served a run.
 *
 *     onnx_graphs DIR DEVICE
 *
 * DIR holds the committed fixtures (tests/fixtures/onnx). Each model is loaded on DEVICE
 * with graphs on and off and on cpu, and run RUNS times per input set with inputs that
 * change from run to run (float inputs scaled): every output of the graphs-on load must
 * equal the graphs-off load's on the same device (same kernels: to 1e-6) and the cpu's
 * (to 1e-3 of its largest magnitude). On a device without graphs (cpu, ref) the stats
 * must say none was used; on one with graphs (cuda) the CNN must be served by graphs from
 * its second run on, and every other model either is or says why its recording broke; a
 * model with an If that reads its condition every run (branchy) is never recorded.
 * Exits 77 (skip) when DEVICE cannot be opened.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

#define MAXT 16
#define RUNS 5

static int failures;

#define CHECK(cond, ...)                                                                                          \
    do {                                                                                                          \
        if (!(cond)) {                                                                                            \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                                \
            printf(__VA_ARGS__);                                                                                  \
            printf(" (last error: %s)\n", kiln_error());                                                          \
            failures++;                                                                                           \
        }                                                                                                         \
    } while (0)

static kiln_onnx_model *load(const char *dir, const char *model, kiln_device *dev, bool graphs)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.onnx", dir, model);
    kiln_onnx_options o = kiln_onnx_options_default();
    o.graphs = graphs;
    kiln_onnx_model *m = kiln_onnx_load(path, dev, &o);
    CHECK(m != NULL, "load %s", path);
    return m;
}

static kiln_onnx_graph_stats stats(kiln_onnx_model *m)
{
    kiln_onnx_graph_stats s;
    if (kiln_onnx_graph_stats_get(m, &s))
        memset(&s, 0, sizeof s);
    return s;
}

/* The inputs "in.<name>" of DIR/IO.io.safetensors, on cpu, in the model's input order. */
static int read_inputs(const char *dir, const char *io, kiln_onnx_model *m, kiln_device *cpu, const char **names,
                       kiln_tensor **ins)
{
    char path[1024], key[300];
    snprintf(path, sizeof path, "%s/%s.io.safetensors", dir, io);
    kiln_safetensors *st = kiln_safetensors_open(path);
    if (!st) {
        CHECK(st != NULL, "open %s", path);
        return -1;
    }
    int n = kiln_onnx_input_count(m);
    for (int i = 0; i < n && i < MAXT; i++) {
        names[i] = kiln_onnx_input_name(m, i);
        snprintf(key, sizeof key, "in.%s", names[i]);
        ins[i] = kiln_safetensors_load(st, key, cpu);
        if (!ins[i]) {
            CHECK(ins[i] != NULL, "%s %s", path, key);
            n = -1;
            break;
        }
    }
    kiln_safetensors_close(st);
    return n;
}

static void release_all(kiln_tensor **ts, int n)
{
    for (int i = 0; i < n; i++) {
        kiln_tensor_release(ts[i]);
        ts[i] = NULL;
    }
}

/* A run without grad on inputs moved to dev; outs gets every output (new references). */
static int run(kiln_onnx_model *m, kiln_device *dev, int nin, const char **names, kiln_tensor **ins,
               kiln_tensor **outs)
{
    int nout = kiln_onnx_output_count(m);
    if (nout > MAXT)
        nout = MAXT;
    kiln_tensor *on[MAXT] = {0};
    kiln_scope_begin();
    for (int i = 0; i < nin; i++)
        on[i] = kiln_to_device(ins[i], dev);
    kiln_no_grad_begin();
    int rc = kiln_onnx_run(m, nin, names, on, nout, outs);
    kiln_no_grad_end();
    kiln_scope_end();
    CHECK(rc == 0, "run");
    return rc ? -1 : nout;
}

/* max |a - b| / max(max |b|, 1e-12), read through the host; INFINITY when unreadable. */
static double rel_err(kiln_tensor *a, kiln_tensor *b)
{
    int64_t n = a && b ? kiln_tensor_numel(a) : -1;
    if (n < 0 || n != kiln_tensor_numel(b))
        return INFINITY;
    float *x = malloc((size_t)(n + 1) * sizeof *x), *y = malloc((size_t)(n + 1) * sizeof *y);
    double err = INFINITY;
    kiln_scope_begin();
    kiln_tensor *fa = kiln_cast(a, KILN_F32), *fb = kiln_cast(b, KILN_F32);
    if (x && y && fa && fb && !kiln_to_data(fa, x, (size_t)n * sizeof *x) &&
        !kiln_to_data(fb, y, (size_t)n * sizeof *y)) {
        double md = 0, mb = 0;
        for (int64_t i = 0; i < n; i++) {
            double d = fabs((double)x[i] - (double)y[i]);
            md = d > md || isnan(d) ? d : md;
            mb = fabs((double)y[i]) > mb ? fabs((double)y[i]) : mb;
        }
        err = isnan(md) ? INFINITY : md / (mb > 1e-12 ? mb : 1.0);
    }
    kiln_scope_end();
    free(x);
    free(y);
    return err;
}

/* Run r's inputs: float inputs scaled by (1 - r/8), so a run that read an earlier run's
 * inputs (a graph launched without copying the new ones in) gives other outputs. */
static void vary(kiln_tensor **ins, int nin, int r, kiln_tensor **out)
{
    for (int i = 0; i < nin; i++) {
        kiln_dtype dt = kiln_tensor_dtype(ins[i]);
        out[i] = dt == KILN_F32 || dt == KILN_F64 ? kiln_mul_scalar(ins[i], 1.0 - r / 8.0)
                                                  : kiln_tensor_retain(ins[i]);
    }
}

/* MODEL over each io set: graphs on against off (same device) and against cpu. Returns
 * whether graphs served its later runs. */
static bool check_model(const char *dir, kiln_device *dev, kiln_device *cpu, const char *model, int nio,
                        const char *const *ios)
{
    kiln_onnx_model *mon = load(dir, model, dev, true), *moff = load(dir, model, dev, false),
                    *mcpu = load(dir, model, cpu, false);
    bool served = false;
    if (!mon || !moff || !mcpu)
        goto out;
    for (int k = 0; k < nio; k++) {
        const char *names[MAXT];
        kiln_tensor *ins[MAXT] = {0};
        int nin = read_inputs(dir, ios[k], mon, cpu, names, ins);
        for (int r = 0; nin > 0 && r < RUNS; r++) {
            kiln_tensor *x[MAXT] = {0}, *got[MAXT] = {0}, *ref[MAXT] = {0}, *host[MAXT] = {0};
            vary(ins, nin, r, x);
            int n = run(mon, dev, nin, names, x, got);
            if (n > 0 && run(moff, dev, nin, names, x, ref) == n && run(mcpu, cpu, nin, names, x, host) == n)
                for (int i = 0; i < n; i++) {
                    double same = rel_err(got[i], ref[i]), vs_cpu = rel_err(got[i], host[i]);
                    CHECK(same <= 1e-6, "%s %s run %d output %s: graphs on against off %g", model, ios[k], r,
                          kiln_onnx_output_name(mon, i), same);
                    CHECK(vs_cpu <= 1e-3, "%s %s run %d output %s: against cpu %g", model, ios[k], r,
                          kiln_onnx_output_name(mon, i), vs_cpu);
                }
            release_all(x, MAXT);
            release_all(got, MAXT);
            release_all(ref, MAXT);
            release_all(host, MAXT);
        }
        release_all(ins, MAXT);
    }
    kiln_onnx_graph_stats s = stats(mon), off = stats(moff);
    printf("%s on %s: graphs %s; recorded %llu, launched %llu, broken %llu, op by op %llu%s%s\n", model,
           kiln_device_name(dev), s.supported ? "supported" : "not supported", (unsigned long long)s.recorded,
           (unsigned long long)s.launched, (unsigned long long)s.broken, (unsigned long long)s.eager,
           s.last_broken[0] ? "; broken by: " : "", s.last_broken);
    CHECK(s.enabled && !off.enabled, "%s: the option is kept", model);
    CHECK(off.recorded == 0 && off.launched == 0 && !off.last_run_graph, "%s: graphs off used a graph", model);
    if (!s.supported) {
        CHECK(s.recorded == 0 && s.launched == 0 && s.broken == 0 && !s.last_run_graph && s.graphs == 0,
              "%s: a device without graphs used one", model);
    } else {
        served = s.launched == (uint64_t)nio * (RUNS - 1) && s.recorded == (uint64_t)nio && s.broken == 0;
        CHECK(served || (s.broken > 0 && s.last_broken[0]), "%s: graphs neither served the runs nor said why",
              model);
        CHECK(served == s.last_run_graph, "%s: last_run_graph %d", model, (int)s.last_run_graph);
    }
out:
    kiln_onnx_free(mon);
    kiln_onnx_free(moff);
    kiln_onnx_free(mcpu);
    return served;
}

/* Outputs a caller keeps are copies: later launches leave them alone. Dropping the graphs
 * (kiln_onnx_set_trainable) makes the next run op by op and the one after record again. */
static void check_kept_and_dropped(const char *dir, kiln_device *dev, kiln_device *cpu)
{
    kiln_onnx_model *m = load(dir, "cnn", dev, true);
    const char *names[MAXT];
    kiln_tensor *ins[MAXT] = {0}, *x1[MAXT] = {0}, *o[RUNS][MAXT] = {{0}}, *first = NULL;
    int nin = m ? read_inputs(dir, "cnn.b1", m, cpu, names, ins) : -1;
    for (int r = 0; nin == 1 && r < RUNS; r++) {
        vary(ins, nin, r, x1);
        run(m, dev, nin, names, x1, o[r]);
        release_all(x1, MAXT);
        if (r == 1 && o[1][0])
            first = kiln_to_device(o[1][0], cpu); /* what the recorded run gave, copied away */
    }
    if (first && o[1][0]) {
        CHECK(rel_err(o[1][0], first) == 0.0, "an output kept by the caller changed under later runs");
        CHECK(rel_err(o[RUNS - 1][0], first) > 0.0, "other inputs gave the same output: the check proves nothing");
    }
    kiln_onnx_graph_stats before = m ? stats(m) : (kiln_onnx_graph_stats){0};
    if (m && before.supported && before.launched > 0) {
        CHECK(kiln_onnx_set_trainable(m, false) == 0, "set_trainable");
        CHECK(stats(m).graphs == 0, "set_trainable drops the recorded graphs");
        kiln_tensor *a[MAXT] = {0}, *b[MAXT] = {0};
        run(m, dev, nin, names, ins, a);
        kiln_onnx_graph_stats s1 = stats(m);
        CHECK(!s1.last_run_graph && s1.eager == before.eager + 1, "after the drop the first run goes op by op");
        run(m, dev, nin, names, ins, b);
        kiln_onnx_graph_stats s2 = stats(m);
        CHECK(s2.last_run_graph && s2.recorded == before.recorded + 1, "and the next one records again");
        CHECK(a[0] && b[0] && rel_err(a[0], b[0]) <= 1e-6, "recorded again, same result");
        release_all(a, MAXT);
        release_all(b, MAXT);
    }
    for (int r = 0; r < RUNS; r++)
        release_all(o[r], MAXT);
    release_all(ins, MAXT);
    kiln_tensor_release(first);
    kiln_onnx_free(m);
}

/* A model with an If reading its condition at run time is never recorded (a recording
 * would keep one branch): its second run of a signature says so, naming the node. */
static void check_if_refused(const char *dir, kiln_device *dev, kiln_device *cpu)
{
    kiln_onnx_model *m = load(dir, "branchy", dev, true);
    const char *names[MAXT];
    kiln_tensor *ins[MAXT] = {0};
    int nin = m ? read_inputs(dir, "branchy.pos", m, cpu, names, ins) : -1;
    for (int r = 0; nin > 0 && r < 3; r++) {
        kiln_tensor *o[MAXT] = {0};
        run(m, dev, nin, names, ins, o);
        release_all(o, MAXT);
    }
    kiln_onnx_graph_stats s = m ? stats(m) : (kiln_onnx_graph_stats){0};
    if (m && s.supported)
        CHECK(s.recorded == 0 && s.launched == 0 && s.broken == 1 && strstr(s.last_broken, "(If)"),
              "branchy: recorded %llu, launched %llu, broken %llu (%s)", (unsigned long long)s.recorded,
              (unsigned long long)s.launched, (unsigned long long)s.broken, s.last_broken);
    release_all(ins, MAXT);
    kiln_onnx_free(m);
}

/* KILN_ONNX_GRAPHS=0 at load turns them off whatever the options say. */
static void check_env(const char *dir, kiln_device *dev)
{
    setenv("KILN_ONNX_GRAPHS", "0", 1);
    kiln_onnx_model *m = load(dir, "cnn", dev, true);
    unsetenv("KILN_ONNX_GRAPHS");
    CHECK(m && !stats(m).enabled, "KILN_ONNX_GRAPHS=0 turns graphs off");
    kiln_onnx_graph_stats s;
    CHECK(kiln_onnx_graph_stats_get(NULL, &s) < 0 && strstr(kiln_error(), "NULL"), "NULL model refused");
    CHECK(m && kiln_onnx_graph_stats_get(m, NULL) < 0, "NULL stats refused");
    kiln_onnx_free(m);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s DIR DEVICE\n", argv[0]);
        return 2;
    }
    kiln_device *dev = kiln_device_open(argv[2]);
    if (!dev) {
        printf("onnx_graphs: %s cannot be opened (%s): skipped\n", argv[2], kiln_error());
        return 77;
    }
    kiln_device *cpu = kiln_device_open("cpu");
    const char *cnn_ios[] = {"cnn.b1", "cnn.b3"}, *enc_ios[] = {"encoder"}, *mob_ios[] = {"mobilenetv3"};
    bool cnn = check_model(argv[1], dev, cpu, "cnn", 2, cnn_ios);
    check_model(argv[1], dev, cpu, "encoder", 1, enc_ios);
    check_model(argv[1], dev, cpu, "mobilenetv3", 1, mob_ios);
    const char *branchy_ios[] = {"branchy.pos", "branchy.pos_else", "branchy.neg"};
    check_model(argv[1], dev, cpu, "branchy", 3, branchy_ios);
    check_if_refused(argv[1], dev, cpu);
    kiln_onnx_graph_stats probe = {0};
    kiln_onnx_model *m = load(argv[1], "cnn", dev, true);
    if (m)
        probe = stats(m);
    kiln_onnx_free(m);
    if (probe.supported)
        CHECK(cnn, "the CNN (convolutions, pooling, matmul, elementwise) must be served by graphs");
    check_kept_and_dropped(argv[1], dev, cpu);
    check_env(argv[1], dev);
    kiln_device_close(cpu);
    kiln_device_close(dev);
    printf("onnx_graphs %s: %d failures\n", argv[2], failures);
    return failures ? 1 : 0;
}
