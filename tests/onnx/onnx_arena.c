/*
 * onnx_arena.c — the planned activation arena (kiln_onnx_options.arena) must not change
 * what a model computes, must give each input signature its own plan, must never hand a
 * caller's output or a training run arena memory, and must plan something worth having.
 *
 *     onnx_arena DIR DEVICE
 *
 * DIR holds the committed fixtures (tests/fixtures/onnx). Every model is loaded twice,
 * arena on and off, and every output of a run with the arena must equal, to the bit, the
 * output of the same inputs without it. Exits 77 (skip) when DEVICE cannot be opened.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

#define MAXT 16
#define RUNS 4

static int failures;

#define CHECK(cond, ...)                                                                                  \
    do {                                                                                                  \
        if (!(cond)) {                                                                                    \
            printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                        \
            printf(__VA_ARGS__);                                                                          \
            printf("\n");                                                                                 \
            failures++;                                                                                   \
        }                                                                                                 \
    } while (0)

static kiln_onnx_model *load(const char *dir, const char *model, kiln_device *dev, bool arena) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.onnx", dir, model);
    kiln_onnx_options o = kiln_onnx_options_default();
    o.arena = arena;
    kiln_onnx_model *m = kiln_onnx_load(path, dev, &o);
    CHECK(m != NULL, "load %s: %s", path, kiln_error());
    return m;
}

static kiln_onnx_arena_stats stats(kiln_onnx_model *m) {
    kiln_onnx_arena_stats s;
    if (kiln_onnx_arena_stats_get(m, &s)) memset(&s, 0, sizeof s);
    return s;
}

/* The inputs "in.<name>" of DIR/IO.io.safetensors, in the model's input order. */
static int read_inputs(const char *dir, const char *io, kiln_onnx_model *m, kiln_device *dev, const char **names,
                       kiln_tensor **ins) {
    char path[1024], key[300];
    snprintf(path, sizeof path, "%s/%s.io.safetensors", dir, io);
    kiln_safetensors *st = kiln_safetensors_open(path);
    if (!st) { CHECK(st != NULL, "%s: %s", path, kiln_error()); return -1; }
    int n = kiln_onnx_input_count(m);
    for (int i = 0; i < n && i < MAXT; i++) {
        names[i] = kiln_onnx_input_name(m, i);
        snprintf(key, sizeof key, "in.%s", names[i]);
        ins[i] = kiln_safetensors_load(st, key, dev);
        if (!ins[i]) { CHECK(ins[i] != NULL, "%s %s: %s", path, key, kiln_error()); n = -1; break; }
    }
    kiln_safetensors_close(st);
    return n;
}

/* A run without grad; outs gets every graph output (new references). */
static int run(kiln_onnx_model *m, int nin, const char **names, kiln_tensor **ins, kiln_tensor **outs) {
    int nout = kiln_onnx_output_count(m);
    if (nout > MAXT) nout = MAXT;
    kiln_no_grad_begin();
    int rc = kiln_onnx_run(m, nin, names, ins, nout, outs);
    kiln_no_grad_end();
    CHECK(rc == 0, "run: %s", kiln_error());
    return rc ? -1 : nout;
}

static void release_all(kiln_tensor **ts, int n) {
    for (int i = 0; i < n; i++) { kiln_tensor_release(ts[i]); ts[i] = NULL; }
}

/* t's bytes, row-major, in a new buffer of *len bytes. */
static unsigned char *bytes_of(kiln_tensor *t, size_t *len) {
    *len = (size_t)kiln_tensor_numel(t) * kiln_dtype_size(kiln_tensor_dtype(t));
    unsigned char *b = malloc(*len + 1);
    if (b && kiln_to_data(t, b, *len)) { free(b); b = NULL; }
    return b;
}

/* Same dtype, shape and bits. */
static bool same_bits(kiln_tensor *a, kiln_tensor *b) {
    if (!a || !b || kiln_tensor_dtype(a) != kiln_tensor_dtype(b) || kiln_tensor_ndim(a) != kiln_tensor_ndim(b))
        return false;
    for (int d = 0; d < kiln_tensor_ndim(a); d++)
        if (kiln_tensor_dim(a, d) != kiln_tensor_dim(b, d)) return false;
    size_t la, lb;
    unsigned char *ba = bytes_of(a, &la), *bb = bytes_of(b, &lb);
    bool same = ba && bb && la == lb && !memcmp(ba, bb, la);
    free(ba);
    free(bb);
    return same;
}

static bool same_host(kiln_tensor *t, const unsigned char *want, size_t len) {
    size_t l;
    unsigned char *b = bytes_of(t, &l);
    bool same = b && l == len && !memcmp(b, want, len);
    free(b);
    return same;
}

/*
 * MODEL through each IO in turn (the last may repeat an earlier one): the arena load runs
 * RUNS times per IO, every output bitwise equal to the plain load's. Each new signature
 * records a plan and its later runs follow it; a multi-layer model's plan must be smaller
 * than the sum of what it places.
 */
static void check_model(const char *dir, kiln_device *dev, const char *model, int nio, const char *const *ios,
                        bool multi_layer) {
    kiln_onnx_model *mon = load(dir, model, dev, true), *moff = load(dir, model, dev, false);
    if (!mon || !moff) goto out;
    int distinct = 0;
    for (int k = 0; k < nio; k++) {
        bool seen = false;
        for (int j = 0; j < k; j++) seen |= !strcmp(ios[j], ios[k]);
        distinct += !seen;
        const char *names[MAXT];
        kiln_tensor *ins[MAXT] = {0}, *ref[MAXT] = {0};
        int nin = read_inputs(dir, ios[k], mon, dev, names, ins);
        int nref = nin < 0 ? -1 : run(moff, nin, names, ins, ref);
        for (int r = 0; nref > 0 && r < RUNS; r++) {
            kiln_tensor *got[MAXT] = {0};
            if (run(mon, nin, names, ins, got) != nref) break;
            for (int i = 0; i < nref; i++)
                CHECK(same_bits(got[i], ref[i]), "%s %s run %d: output %s differs with the arena", model, ios[k], r,
                      kiln_onnx_output_name(mon, i));
            release_all(got, nref);
        }
        kiln_onnx_arena_stats s = stats(mon);
        printf("%s %s: %d runs; plan of %d allocations, %zu bytes of %zu (%.0f%%); recorded %llu, replayed %llu\n",
               model, ios[k], RUNS, s.allocs, s.planned_bytes, s.alloc_bytes,
               s.alloc_bytes ? 100.0 * (double)s.planned_bytes / (double)s.alloc_bytes : 0.0,
               (unsigned long long)s.recorded, (unsigned long long)s.replayed);
        CHECK(s.enabled, "%s: arena not enabled", model);
        CHECK(s.recorded == (uint64_t)distinct, "%s %s: %llu plans recorded, want %d", model, ios[k],
              (unsigned long long)s.recorded, distinct);
        CHECK(s.replayed == (uint64_t)((k + 1) * RUNS - distinct), "%s %s: %llu runs followed a plan", model,
              ios[k], (unsigned long long)s.replayed);
        CHECK(s.dropped == 0, "%s %s: %llu plans dropped", model, ios[k], (unsigned long long)s.dropped);
        CHECK(s.plans == distinct, "%s: %d plans kept, want %d", model, s.plans, distinct);
        CHECK(s.reserved_bytes >= s.planned_bytes, "%s: block of %zu bytes for a plan of %zu", model,
              s.reserved_bytes, s.planned_bytes);
        if (multi_layer)
            CHECK(s.allocs > 2 && s.planned_bytes < s.alloc_bytes,
                  "%s %s: the plan (%zu bytes) must be smaller than its %d allocations (%zu bytes)", model, ios[k],
                  s.planned_bytes, s.allocs, s.alloc_bytes);
        release_all(ins, MAXT);
        release_all(ref, MAXT);
    }
    kiln_onnx_arena_stats off = stats(moff);
    CHECK(!off.enabled && off.recorded == 0 && off.replayed == 0 && off.reserved_bytes == 0,
          "%s: the arena-off load used the arena", model);
out:
    kiln_onnx_free(mon);
    kiln_onnx_free(moff);
}

/* An output the caller keeps across later runs (which follow the plan) keeps its values,
 * and those runs are right too. */
static void check_kept_output(const char *dir, kiln_device *dev) {
    kiln_onnx_model *mon = load(dir, "cnn", dev, true), *moff = load(dir, "cnn", dev, false);
    const char *names[MAXT];
    kiln_tensor *ins[MAXT] = {0}, *o0[MAXT] = {0}, *o1[MAXT] = {0}, *o2[MAXT] = {0}, *o3[MAXT] = {0},
                *ref2[MAXT] = {0}, *x2[MAXT] = {0};
    unsigned char *h1 = NULL;
    size_t l1 = 0;
    int nin = mon && moff ? read_inputs(dir, "cnn.b1", mon, dev, names, ins) : -1;
    if (nin != 1) goto out;
    kiln_scope_begin();
    x2[0] = kiln_keep(kiln_add_scalar(kiln_mul_scalar(ins[0], -0.5), 0.25));
    kiln_scope_end();
    CHECK(x2[0] != NULL, "x2: %s", kiln_error());
    int n = run(mon, nin, names, ins, o0);           /* records */
    if (n < 1 || !x2[0] || run(mon, nin, names, ins, o1) != n) goto out;
    h1 = bytes_of(o1[0], &l1);
    if (run(mon, nin, names, x2, o2) != n || run(moff, nin, names, x2, ref2) != n) goto out;
    CHECK(h1 && same_host(o1[0], h1, l1), "a kept output changed under the next run");
    CHECK(same_bits(o2[0], ref2[0]), "the run after a kept output differs with the arena");
    CHECK(!same_bits(o2[0], o1[0]), "other inputs gave the same output: the check proves nothing");
    if (run(mon, nin, names, ins, o3) != n) goto out;
    CHECK(same_bits(o3[0], o1[0]) && same_host(o1[0], h1, l1) && same_bits(o2[0], ref2[0]),
          "outputs kept over two more runs changed");
    kiln_onnx_arena_stats s = stats(mon);
    CHECK(s.recorded == 1 && s.replayed == 3 && s.dropped == 0, "kept outputs: recorded %llu, replayed %llu",
          (unsigned long long)s.recorded, (unsigned long long)s.replayed);
    printf("kept outputs: unchanged over 3 runs that followed the plan\n");
out:
    free(h1);
    release_all(ins, MAXT);
    release_all(x2, MAXT);
    release_all(o0, MAXT);
    release_all(o1, MAXT);
    release_all(o2, MAXT);
    release_all(o3, MAXT);
    release_all(ref2, MAXT);
    kiln_onnx_free(mon);
    kiln_onnx_free(moff);
}

/* NonZero's result size depends on the data, not the input shape: a run with the same
 * signature whose allocations differ from the plan's must give the plan up, allocate as
 * usual and stay right; the signature is then recorded again. */
static void check_fallback(const char *dir, kiln_device *dev) {
    char ops[1024];
    snprintf(ops, sizeof ops, "%s/ops", dir);
    kiln_onnx_model *mon = load(ops, "nonzero_bool", dev, true), *moff = load(ops, "nonzero_bool", dev, false);
    if (!mon || !moff) goto out;
    unsigned char a[24], b[24];
    for (int i = 0; i < 24; i++) {
        a[i] = i % 3 == 0;
        b[i] = i % 2 == 0;
    }
    kiln_tensor *xa = kiln_from_data(dev, KILN_BOOL, KILN_SHAPE(2, 3, 4), a, sizeof a);
    kiln_tensor *xb = kiln_from_data(dev, KILN_BOOL, KILN_SHAPE(2, 3, 4), b, sizeof b);
    const char *name = kiln_onnx_input_name(mon, 0);
    /* a a b b b a: record, follow, give up, record, follow, give up */
    kiln_tensor *seq[] = {xa, xa, xb, xb, xb, xa};
    const uint64_t want_dropped[] = {0, 0, 1, 1, 1, 2};
    for (int k = 0; xa && xb && k < 6; k++) {
        kiln_tensor *got[MAXT] = {0}, *ref[MAXT] = {0};
        int n = run(mon, 1, &name, &seq[k], got);
        if (n < 1 || run(moff, 1, &name, &seq[k], ref) != n) { release_all(got, MAXT); break; }
        CHECK(same_bits(got[0], ref[0]), "nonzero run %d differs with the arena", k);
        kiln_onnx_arena_stats s = stats(mon);
        CHECK(s.dropped == want_dropped[k], "nonzero run %d: %llu plans dropped, want %llu", k,
              (unsigned long long)s.dropped, (unsigned long long)want_dropped[k]);
        release_all(got, MAXT);
        release_all(ref, MAXT);
    }
    kiln_onnx_arena_stats s = stats(mon);
    CHECK(s.recorded == 2 && s.replayed == 2, "nonzero: recorded %llu, replayed %llu (want 2, 2)",
          (unsigned long long)s.recorded, (unsigned long long)s.replayed);
    printf("nonzero: a run whose sizes left the plan fell back and stayed right (%llu dropped)\n",
           (unsigned long long)s.dropped);
    kiln_tensor_release(xa);
    kiln_tensor_release(xb);
out:
    kiln_onnx_free(mon);
    kiln_onnx_free(moff);
}

/* Grad mode never touches the arena; training through the graph gives the same loss and
 * gradients with the option on, and frozen runs afterwards use it and agree. */
static void check_grad(const char *dir, kiln_device *dev) {
    kiln_onnx_model *mon = load(dir, "cnn", dev, true), *moff = load(dir, "cnn", dev, false);
    const char *names[MAXT];
    kiln_tensor *ins[MAXT] = {0};
    int nin = mon && moff ? read_inputs(dir, "cnn.b3", mon, dev, names, ins) : -1;
    if (nin < 1 || kiln_onnx_set_trainable(mon, true) || kiln_onnx_set_trainable(moff, true)) {
        CHECK(nin < 1, "set_trainable: %s", kiln_error());
        goto out;
    }
    for (int step = 0; step < 3; step++) {
        kiln_onnx_model *ms[2] = {mon, moff};
        double loss[2] = {0, 0};
        for (int k = 0; k < 2; k++) {
            kiln_scope_begin();
            kiln_tensor *o = NULL;
            int rc = kiln_onnx_run(ms[k], nin, names, ins, 1, &o);
            CHECK(rc == 0, "grad run: %s", kiln_error());
            kiln_tensor *l = rc ? NULL : kiln_mean(kiln_square(o), KILN_ALL_DIMS, false);
            loss[k] = kiln_item(l);
            CHECK(l && kiln_backward(l, NULL) == 0, "backward: %s", kiln_error());
            kiln_tensor_release(o);
            kiln_scope_end();
        }
        CHECK(!memcmp(&loss[0], &loss[1], sizeof loss[0]), "step %d: loss %.9g with the arena, %.9g without",
              step, loss[0], loss[1]);
    }
    for (int i = 0; i < kiln_onnx_param_count(mon); i++) {
        kiln_tensor *p = kiln_onnx_param(mon, i), *q = kiln_onnx_param(moff, i);
        if (!kiln_dtype_is_float(kiln_tensor_dtype(p))) continue;
        kiln_scope_begin();
        kiln_tensor *gp = kiln_grad(p), *gq = kiln_grad(q);
        CHECK(gp && gq && same_bits(gp, gq), "gradient of %s differs with the arena", kiln_onnx_param_name(mon, i));
        kiln_scope_end();
    }
    kiln_onnx_arena_stats s = stats(mon);
    CHECK(s.recorded == 0 && s.replayed == 0 && s.reserved_bytes == 0, "grad mode used the arena");
    /* frozen again: the arena comes in, and the outputs still agree */
    for (int r = 0; r < 3; r++) {
        kiln_tensor *a[MAXT] = {0}, *b[MAXT] = {0};
        int n = run(mon, nin, names, ins, a);
        if (n > 0 && run(moff, nin, names, ins, b) == n)
            for (int i = 0; i < n; i++) CHECK(same_bits(a[i], b[i]), "after training, run %d differs", r);
        release_all(a, MAXT);
        release_all(b, MAXT);
    }
    s = stats(mon);
    CHECK(s.recorded == 1 && s.replayed == 2, "no-grad runs after training: recorded %llu, replayed %llu",
          (unsigned long long)s.recorded, (unsigned long long)s.replayed);
    printf("grad mode: 3 training steps left the arena alone; 3 frozen runs then used it\n");
out:
    release_all(ins, MAXT);
    kiln_onnx_free(mon);
    kiln_onnx_free(moff);
}

/* Two threads running one model at once: one holds the arena, the other runs without it
 * (the trylock); both get the right answers every time. */
typedef struct racer {
    kiln_onnx_model *m;
    int nin;
    const char **names;
    kiln_tensor **ins;
    kiln_tensor *ref;
    int wrong;
} racer;

static void *race(void *arg) {
    racer *r = arg;
    for (int k = 0; k < 8; k++) {
        kiln_tensor *o = NULL;
        kiln_no_grad_begin();
        int rc = kiln_onnx_run(r->m, r->nin, r->names, r->ins, 1, &o);
        kiln_no_grad_end();
        if (rc || !same_bits(o, r->ref)) r->wrong++;
        kiln_tensor_release(o);
    }
    return NULL;
}

static void check_threads(const char *dir, kiln_device *dev) {
    kiln_onnx_model *mon = load(dir, "cnn", dev, true), *moff = load(dir, "cnn", dev, false);
    const char *names[MAXT];
    kiln_tensor *ins[MAXT] = {0}, *ref[MAXT] = {0}, *warm[MAXT] = {0};
    int nin = mon && moff ? read_inputs(dir, "cnn.b3", mon, dev, names, ins) : -1;
    /* the first run makes the model's one-time state (weight packs), which is not meant to
     * be made by two threads at once */
    if (nin < 1 || run(moff, nin, names, ins, ref) < 1 || run(mon, nin, names, ins, warm) < 1) goto out;
    racer rs[2] = {{mon, nin, names, ins, ref[0], 0}, {mon, nin, names, ins, ref[0], 0}};
    pthread_t th[2];
    int started = 0;
    for (int i = 0; i < 2; i++) started += pthread_create(&th[i], NULL, race, &rs[i]) == 0;
    CHECK(started == 2, "could not start the threads");
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    CHECK(rs[0].wrong == 0 && rs[1].wrong == 0, "concurrent runs: %d and %d wrong", rs[0].wrong, rs[1].wrong);
    kiln_onnx_arena_stats s = stats(mon);
    CHECK(s.replayed >= 1 && s.replayed <= 16 && s.dropped == 0, "concurrent runs: replayed %llu, dropped %llu",
          (unsigned long long)s.replayed, (unsigned long long)s.dropped);
    printf("threads: 16 concurrent runs right, %llu of them on the arena\n", (unsigned long long)s.replayed);
out:
    release_all(ins, MAXT);
    release_all(ref, MAXT);
    release_all(warm, MAXT);
    kiln_onnx_free(mon);
    kiln_onnx_free(moff);
}

/* KILN_ONNX_ARENA=0 at load turns the option off, =1 on. */
static void check_env(const char *dir, kiln_device *dev) {
    setenv("KILN_ONNX_ARENA", "0", 1);
    kiln_onnx_model *m0 = load(dir, "cnn", dev, true);
    setenv("KILN_ONNX_ARENA", "1", 1);
    kiln_onnx_model *m1 = load(dir, "cnn", dev, false);
    unsetenv("KILN_ONNX_ARENA");
    if (m0 && m1) {
        CHECK(!stats(m0).enabled, "KILN_ONNX_ARENA=0 left the arena on");
        CHECK(stats(m1).enabled, "KILN_ONNX_ARENA=1 left the arena off");
    }
    kiln_onnx_arena_stats s;
    CHECK(kiln_onnx_arena_stats_get(NULL, &s) == -1 && strstr(kiln_error(), "NULL"), "NULL model accepted");
    kiln_onnx_free(m0);
    kiln_onnx_free(m1);
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: %s DIR DEVICE\n", argv[0]); return 2; }
    unsetenv("KILN_ONNX_ARENA");    /* the tests set the option themselves */
    const char *dir = argv[1];
    kiln_device *dev = kiln_device_open(argv[2]);
    if (!dev) { printf("skip: %s\n", kiln_error()); return 77; }
    check_model(dir, dev, "cnn", 3, (const char *[]){"cnn.b1", "cnn.b3", "cnn.b1"}, true);
    check_model(dir, dev, "mobilenetv3", 1, (const char *[]){"mobilenetv3"}, true);
    check_model(dir, dev, "encoder", 1, (const char *[]){"encoder"}, true);
    check_model(dir, dev, "lstm", 1, (const char *[]){"lstm"}, false);
    check_model(dir, dev, "gru", 1, (const char *[]){"gru"}, false);
    check_kept_output(dir, dev);
    check_fallback(dir, dev);
    check_grad(dir, dev);
    check_threads(dir, dev);
    check_env(dir, dev);
    kiln_device_close(dev);
    printf("%s\n", failures ? "FAILED" : "all arena checks passed");
    return failures ? 1 : 0;
}
