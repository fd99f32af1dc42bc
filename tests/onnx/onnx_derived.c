/*
 * tests/onnx/onnx_derived.c — weight-derived values (nodes that only rearrange weights, such
 * as the Slice/Concat chains torch's dynamo exporter puts in front of an LSTM's weights) are
 * computed once and reused outside grad mode, and must follow their weights however those
 * are updated.
 *
 *     onnx_derived DIR MODEL [MODEL...]   (DIR/MODEL.onnx and DIR/MODEL.io.safetensors)
 *
 * For each model: a no-grad run (the cache is made) and a second one (the cache is used)
 * equal a run in grad mode (where the derived nodes run as ordinary nodes) to the bit and
 * match ONNX Runtime's stored outputs; then every float weight gets an SGD step, and the next
 * no-grad run must equal a grad-mode run again, to the bit, and differ from the first.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

#define MAXN 4

struct io {
    int nin;
    const char *names[MAXN];
    kiln_tensor *in[MAXN];
    kiln_tensor *want;
};

static kiln_tensor *run(kiln_onnx_model *m, struct io *io, bool grad) {
    kiln_tensor *out = NULL;
    if (!grad)
        kiln_no_grad_begin();
    if (kiln_onnx_run(m, io->nin, io->names, io->in, 1, &out) != 0)
        printf("run: %s\n", kiln_error());
    if (!grad)
        kiln_no_grad_end();
    return out;
}

/* Largest |a - b| over the elements, or INFINITY when the shapes differ or a read fails. */
static double max_diff(kiln_tensor *a, kiln_tensor *b) {
    if (!a || !b || kiln_tensor_numel(a) != kiln_tensor_numel(b))
        return INFINITY;
    size_t n = (size_t)kiln_tensor_numel(a);
    float *x = malloc(n * sizeof *x + 1), *y = malloc(n * sizeof *y + 1);
    double d = INFINITY;
    if (x && y && kiln_to_data(a, x, n * sizeof *x) == 0 && kiln_to_data(b, y, n * sizeof *y) == 0) {
        d = 0;
        for (size_t i = 0; i < n; i++)
            d = fmax(d, isnan(x[i]) != isnan(y[i]) ? INFINITY : fabs((double)x[i] - y[i]));
    }
    free(x);
    free(y);
    return d;
}

static void sgd_step_every_weight(kiln_onnx_model *m) {
    for (int i = 0; i < kiln_onnx_param_count(m); i++) {
        kiln_tensor *p = kiln_onnx_param(m, i);
        if (!kiln_dtype_is_float(kiln_tensor_dtype(p)))
            continue;
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
}

static int check_model(kiln_device *dev, const char *dir, const char *name) {
    char path[1024], key[300];
    snprintf(path, sizeof path, "%s/%s.onnx", dir, name);
    kiln_onnx_model *m = kiln_onnx_load(path, dev, NULL);
    snprintf(path, sizeof path, "%s/%s.io.safetensors", dir, name);
    kiln_safetensors *st = m ? kiln_safetensors_open(path) : NULL;
    if (!st) {
        printf("FAIL %s: %s\n", name, kiln_error());
        kiln_onnx_free(m);
        return 1;
    }
    struct io io = {.nin = kiln_onnx_input_count(m)};
    int bad = io.nin > MAXN;
    for (int i = 0; !bad && i < io.nin; i++) {
        io.names[i] = kiln_onnx_input_name(m, i);
        snprintf(key, sizeof key, "in.%s", io.names[i]);
        bad = !(io.in[i] = kiln_safetensors_load(st, key, dev));
    }
    snprintf(key, sizeof key, "out.%s", kiln_onnx_output_name(m, 0));
    io.want = bad ? NULL : kiln_safetensors_load(st, key, dev);
    kiln_safetensors_close(st);
    int rc = 1;
    if (!io.want) {
        printf("FAIL %s: fixture: %s\n", name, kiln_error());
        goto out;
    }
    kiln_tensor *first = run(m, &io, false), *again = run(m, &io, false), *graded = run(m, &io, true);
    double d_again = max_diff(first, again), d_grad = max_diff(first, graded), d_ort = max_diff(first, io.want);
    sgd_step_every_weight(m);
    kiln_tensor *after = run(m, &io, false), *after_grad = run(m, &io, true);
    double d_after = max_diff(after, after_grad), moved = max_diff(after, first);
    bool ok = d_again == 0 && d_grad == 0 && d_ort < 1e-4 && d_after == 0 && moved > 1e-6 && isfinite(moved);
    printf("%s %s: cached vs cached %g, cached vs grad mode %g, vs ONNX Runtime %g; after an SGD step on every "
           "weight: cached vs grad mode %g, moved by %g\n",
           ok ? "ok  " : "FAIL", name, d_again, d_grad, d_ort, d_after, moved);
    rc = ok ? 0 : 1;
    kiln_tensor_release(first);
    kiln_tensor_release(again);
    kiln_tensor_release(graded);
    kiln_tensor_release(after);
    kiln_tensor_release(after_grad);
out:
    for (int i = 0; i < io.nin && i < MAXN; i++)
        kiln_tensor_release(io.in[i]);
    kiln_tensor_release(io.want);
    kiln_onnx_free(m);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: onnx_derived DIR MODEL [MODEL...]\n");
        return 2;
    }
    kiln_device *dev = kiln_device_open("cpu");
    if (!dev) {
        fprintf(stderr, "cpu: %s\n", kiln_error());
        return 1;
    }
    int failures = 0;
    for (int i = 2; i < argc; i++)
        failures += check_model(dev, argv[1], argv[i]);
    kiln_device_close(dev);
    return failures ? 1 : 0;
}
