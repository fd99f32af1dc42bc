/*
 * tests/onnx/onnx_rnn_stale.c — an LSTM's or GRU's pre-packed W and R (made at the first run
 * without grad, onnx-ops-rnn.c) must follow each weight however it changes.
 *
 *     onnx_rnn_stale DIR MODEL [MODEL...]   (DIR/MODEL.onnx and DIR/MODEL.io.safetensors)
 *
 * Each model is loaded on cpu (the fused layer, over packed weights) and on ref (composed
 * ops, no packing). Both run without grad; then one f32 weight at a time (those not all
 * zero) gets the same SGD step on both, and after each step the cpu outputs must move and still agree with
 * ref's within 1e-5 of their largest magnitude. A pack left stale by a change to W alone,
 * or to R alone, would keep the cpu's output where it was. The cpu device is opened through
 * the counting decorator, which must pass the pack entries on: a second run with unchanged
 * weights packs nothing (a decorator that hid them would make every run pack again).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kiln/kiln.h"

#define MAXN 8
#define TOL 1e-5

typedef struct side {
    kiln_onnx_model *m;
    int nin;
    const char *names[MAXN];
    kiln_tensor *in[MAXN];
} side;

static int side_open(side *s, kiln_device *dev, const char *dir, const char *name)
{
    char path[1024], key[300];
    snprintf(path, sizeof path, "%s/%s.onnx", dir, name);
    if (!(s->m = kiln_onnx_load(path, dev, NULL)))
        return -1;
    snprintf(path, sizeof path, "%s/%s.io.safetensors", dir, name);
    kiln_safetensors *st = kiln_safetensors_open(path);
    if (!st)
        return -1;
    s->nin = kiln_onnx_input_count(s->m);
    int rc = s->nin > MAXN ? -1 : 0;
    for (int i = 0; !rc && i < s->nin; i++) {
        s->names[i] = kiln_onnx_input_name(s->m, i);
        snprintf(key, sizeof key, "in.%s", s->names[i]);
        if (!(s->in[i] = kiln_safetensors_load(st, key, dev)))
            rc = -1;
    }
    kiln_safetensors_close(st);
    return rc;
}

static void side_close(side *s)
{
    for (int i = 0; i < s->nin && i < MAXN; i++)
        kiln_tensor_release(s->in[i]);
    kiln_onnx_free(s->m);
}

/* The first output, without grad, as host floats (malloc'd, n of them), or NULL. */
static float *run(side *s, size_t *n)
{
    kiln_tensor *out = NULL;
    float *v = NULL;
    kiln_no_grad_begin();
    if (kiln_onnx_run(s->m, s->nin, s->names, s->in, 1, &out) != 0)
        printf("run: %s\n", kiln_error());
    kiln_no_grad_end();
    if (out) {
        *n = (size_t)kiln_tensor_numel(out);
        v = malloc(*n * sizeof *v + 1);
        if (v && kiln_to_data(out, v, *n * sizeof *v) != 0) {
            free(v);
            v = NULL;
        }
    }
    kiln_tensor_release(out);
    return v;
}

/* p -= 0.05 · d(sum p²)/dp, that is p scaled by 0.9, through the optimizer (a write that
 * moves p's storage version). */
static void sgd_step(kiln_tensor *p)
{
    kiln_requires_grad(p, true);
    kiln_scope_begin();
    kiln_backward(kiln_sum(kiln_mul(p, p), KILN_ALL_DIMS, false), NULL);
    kiln_scope_end();
    kiln_optim_config cfg = kiln_optim_config_default(KILN_OPTIM_SGD);
    cfg.lr = 0.05;
    const char *nm = "p";
    kiln_optim *opt = kiln_optim_create(&cfg, 1, &p, &nm);
    kiln_optim_step(opt);
    kiln_optim_free(opt);
    kiln_zero_grad(p);
    kiln_requires_grad(p, false);
}

/* Whether t holds a nonzero value (a step scales it, so zeros do not move). */
static bool nonzero(kiln_tensor *t)
{
    size_t n = (size_t)kiln_tensor_numel(t);
    float *v = malloc(n * sizeof *v + 1);
    bool any = false;
    if (v && kiln_to_data(t, v, n * sizeof *v) == 0)
        for (size_t i = 0; i < n && !any; i++)
            any = v[i] != 0.0f;
    free(v);
    return any;
}

/* max |a - b| / max |b| over n values; INFINITY on a NaN mismatch. */
static double rel_diff(const float *a, const float *b, size_t n)
{
    double d = 0, scale = 1e-12;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) != isnan(b[i]))
            return INFINITY;
        d = fmax(d, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    return d / scale;
}

static int check_model(kiln_device *cpu, kiln_device *ref, const char *dir, const char *name)
{
    side c = {0}, r = {0};
    int bad = 0, steps = 0;
    if (side_open(&c, cpu, dir, name) || side_open(&r, ref, dir, name)) {
        printf("FAIL %s: %s\n", name, kiln_error());
        side_close(&c);
        side_close(&r);
        return 1;
    }
    size_t n = 0, nr = 0;
    float *before = run(&c, &n), *want = run(&r, &nr);
    bad = !before || !want || n != nr || !(rel_diff(before, want, n) <= TOL);
    uint64_t packs_first = 0, packs_again = 0;
    kiln_device_counters counters;
    if (!bad && kiln_device_counters_get(cpu, &counters, "rnn_pack", &packs_first) != 0) {
        printf("FAIL %s: counters: %s\n", name, kiln_error());
        bad = 1;
    } else if (!bad) {
        float *again = run(&c, &n);
        free(again);
        kiln_device_counters_get(cpu, &counters, "rnn_pack", &packs_again);
        if (!again || packs_first == 0 || packs_again != packs_first) {
            printf("FAIL %s: packs after the first run %llu, after a second with the same weights %llu\n", name,
                   (unsigned long long)packs_first, (unsigned long long)packs_again);
            bad = 1;
        }
    }
    int np = kiln_onnx_param_count(c.m);
    for (int i = 0; !bad && i < np; i++) {
        kiln_tensor *pc = kiln_onnx_param(c.m, i), *pr = kiln_onnx_param(r.m, i);
        if (kiln_tensor_dtype(pc) != KILN_F32 || !nonzero(pc)) /* zeros (a zero initial state) */
            continue;
        sgd_step(pc);
        sgd_step(pr);
        free(want);
        float *after = run(&c, &n);
        want = run(&r, &nr);
        double d = after && want && n == nr ? rel_diff(after, want, n) : INFINITY;
        double moved = after && before ? rel_diff(after, before, n) : 0;
        if (!(d <= TOL) || !(moved > 1e-6)) {
            printf("FAIL %s: after a step on weight %d (%s): cpu vs ref %g, moved by %g\n", name, i,
                   kiln_onnx_param_name(c.m, i), d, moved);
            bad = 1;
        }
        free(before);
        before = after;
        steps++;
    }
    if (!bad)
        printf("ok   %s: cpu (packed weights) follows ref after a step on each of %d weights\n", name, steps);
    else if (!steps)
        printf("FAIL %s: first run: %s\n", name, kiln_error());
    free(before);
    free(want);
    side_close(&c);
    side_close(&r);
    return bad || !steps;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: onnx_rnn_stale DIR MODEL [MODEL...]\n");
        return 2;
    }
    kiln_device *cpu = kiln_device_open("counting:cpu"), *ref = cpu ? kiln_device_open("ref") : NULL;
    if (!ref) {
        fprintf(stderr, "devices: %s\n", kiln_error());
        kiln_device_close(cpu);
        return 1;
    }
    int failures = 0;
    for (int i = 2; i < argc; i++)
        failures += check_model(cpu, ref, argv[1], argv[i]);
    kiln_device_close(ref);
    kiln_device_close(cpu);
    return failures ? 1 : 0;
}
