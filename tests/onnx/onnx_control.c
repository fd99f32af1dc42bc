/*
 * onnx_control.c — the If operator through what surrounds a run: the activation arena,
 * autodiff, training and shape inference, on tests/fixtures/onnx/branchy.onnx (a
 * torch.jit.script'ed module exported by the TorchScript exporter: a data-dependent If,
 * another nested in its then branch, the branches reading the input, an intermediate and
 * the layers' weights from the enclosing graph). Its io sets take each path: branchy.pos
 * (then, then), branchy.pos_else (then, else), branchy.neg (else), all of one shape.
 *
 *     onnx_control DIR DEVICE
 *
 * - arena: runs that alternate between the paths (one input signature, so one plan that
 *   a run taking the other branch leaves) give, to the bit, what a load without the arena
 *   gives (on a device without host memory, which has no arena, the same runs);
 * - autodiff: with grad, the gradient reaches the input and the weights of the branches the
 *   run took, and no other weight; the input's gradient matches central differences;
 * - training: Adam through the model on batches of both branches lowers each one's loss;
 * - shape inference (a dry run) goes through a branch.
 * And the Loop operator on loopy.onnx (torch.jit.script'ed: a Loop over the input's rows, its
 * body reading the recurrent weight w and the projected rows from the enclosing graph; io
 * sets loopy.t3 and loopy.t7, of 3 and 7 rows): runs with the arena, alternating the two
 * lengths, give to the bit what runs without it give; with grad, w and the outer layers
 * receive gradients and the input's matches central differences.
 * Exits 77 (skip) when DEVICE cannot be opened.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

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

static const char *const paths[] = {"branchy.pos", "branchy.pos_else", "branchy.neg"};

static kiln_onnx_model *load_model(const char *dir, const char *name, kiln_device *dev, bool arena)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.onnx", dir, name);
    kiln_onnx_options o = kiln_onnx_options_default();
    o.arena = arena;
    kiln_onnx_model *m = kiln_onnx_load(path, dev, &o);
    CHECK(m != NULL, "load %s", path);
    return m;
}

static kiln_onnx_model *load(const char *dir, kiln_device *dev, bool arena)
{
    return load_model(dir, "branchy", dev, arena);
}

/* The input x of DIR/IO.io.safetensors on dev (a new reference), or NULL. */
static kiln_tensor *read_x(const char *dir, const char *io, kiln_device *dev)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.io.safetensors", dir, io);
    kiln_safetensors *st = kiln_safetensors_open(path);
    kiln_tensor *x = st ? kiln_safetensors_load(st, "in.x", dev) : NULL;
    CHECK(x != NULL, "read %s", path);
    kiln_safetensors_close(st);
    return x;
}

/* The model's output on x (a new reference), or NULL. */
static kiln_tensor *run(kiln_onnx_model *m, kiln_tensor *x)
{
    const char *name = "x";
    kiln_tensor *y = NULL;
    CHECK(kiln_onnx_run(m, 1, &name, &x, 1, &y) == 0, "run");
    return y;
}

static bool same_bits(kiln_tensor *a, kiln_tensor *b)
{
    int64_t n = a && b ? kiln_tensor_numel(a) : -1;
    if (n < 0 || n != kiln_tensor_numel(b) || kiln_tensor_dtype(a) != KILN_F32 || kiln_tensor_dtype(b) != KILN_F32)
        return false;
    float *x = malloc((size_t)n * sizeof *x + 1), *y = malloc((size_t)n * sizeof *y + 1);
    bool same = x && y && !kiln_to_data(a, x, (size_t)n * sizeof *x) &&
                !kiln_to_data(b, y, (size_t)n * sizeof *y) && !memcmp(x, y, (size_t)n * sizeof *x);
    free(x);
    free(y);
    return same;
}

/* sum(t * w), read as a double; NAN on error. */
static double dot(kiln_tensor *t, kiln_tensor *w)
{
    kiln_scope_begin();
    double v = kiln_item(kiln_sum(kiln_mul(t, w), KILN_ALL_DIMS, false));
    kiln_scope_end();
    return v;
}

/* host: the device keeps its buffers in host memory, where runs without grad use the arena */
static void check_arena(const char *dir, kiln_device *dev, bool host)
{
    kiln_onnx_model *mon = load(dir, dev, true), *moff = load(dir, dev, false);
    static const int order[] = {0, 0, 2, 1, 2, 2, 0, 1, 1, 0};
    int nruns = (int)(sizeof order / sizeof *order);
    kiln_no_grad_begin();
    for (int r = 0; mon && moff && r < nruns; r++) {
        kiln_tensor *x = read_x(dir, paths[order[r]], dev);
        kiln_tensor *got = x ? run(mon, x) : NULL, *want = x ? run(moff, x) : NULL;
        CHECK(same_bits(got, want), "run %d (%s): the arena changed the output", r, paths[order[r]]);
        kiln_tensor_release(x);
        kiln_tensor_release(got);
        kiln_tensor_release(want);
    }
    kiln_no_grad_end();
    kiln_onnx_arena_stats s = {0};
    if (mon)
        kiln_onnx_arena_stats_get(mon, &s);
    printf("arena over %d runs changing branches: recorded %llu, replayed %llu, dropped %llu\n", nruns,
           (unsigned long long)s.recorded, (unsigned long long)s.replayed, (unsigned long long)s.dropped);
    /* the repeats of one path follow a plan; a run that takes another branch leaves it */
    CHECK(!host || (s.recorded >= 1 && s.replayed >= 1), "no plan was followed");
    kiln_onnx_free(mon);
    kiln_onnx_free(moff);
}

static kiln_tensor *param(kiln_onnx_model *m, const char *name)
{
    for (int i = 0; i < kiln_onnx_param_count(m); i++)
        if (!strcmp(kiln_onnx_param_name(m, i), name))
            return kiln_onnx_param(m, i);
    CHECK(0, "no parameter %s", name);
    return NULL;
}

/* Whether t has an accumulated gradient with a nonzero element. */
static bool has_grad(kiln_tensor *t)
{
    kiln_tensor *g = t ? kiln_grad(t) : NULL;
    kiln_scope_begin();
    bool nz = g && kiln_item(kiln_sum(kiln_abs(g), KILN_ALL_DIMS, false)) > 0;
    kiln_scope_end();
    kiln_tensor_release(g);
    return nz;
}

/* The gradient gx of sum(run(m, x) * w) with respect to x, along three random directions,
 * against central differences (steps of 1e-3, small enough for the models here). */
static void check_directions(kiln_onnx_model *m, kiln_tensor *x, kiln_tensor *w, kiln_tensor *gx,
                             kiln_generator *g, const char *what)
{
    kiln_no_grad_begin();
    for (int k = 0; k < 3; k++) {
        const double eps = 1e-3;
        kiln_tensor *d = kiln_rand_normal(kiln_tensor_device(x), KILN_F32, kiln_tensor_ndim(x),
                                          kiln_tensor_shape(x), 0, 1, g);
        kiln_tensor *xp = kiln_add(x, kiln_mul_scalar(d, eps)), *xm = kiln_add(x, kiln_mul_scalar(d, -eps));
        kiln_tensor *yp = run(m, xp), *ym = run(m, xm);
        double fd = (dot(yp, w) - dot(ym, w)) / (2 * eps), an = dot(gx, d);
        double scale = fmax(fmax(fabs(fd), fabs(an)), 1e-3);
        CHECK(fabs(fd - an) <= 2e-2 * scale, "%s direction %d: gradient %g, central difference %g", what, k, an,
              fd);
        kiln_tensor_release(yp);
        kiln_tensor_release(ym);
    }
    kiln_no_grad_end();
}

static void check_grad(const char *dir, kiln_device *dev)
{
    kiln_onnx_model *m = load(dir, dev, true);
    if (!m || kiln_onnx_set_trainable(m, true)) {
        CHECK(0, "trainable");
        kiln_onnx_free(m);
        return;
    }
    /* which branch layers each path runs: a (then), c (then, then), b (else) */
    static const bool runs[3][3] = {{true, false, true}, {true, false, false}, {false, true, false}};
    const char *layers[3] = {"a.weight", "b.weight", "c.weight"};
    kiln_generator g = kiln_generator_make(3);
    for (int p = 0; p < 3; p++) {
        for (int i = 0; i < kiln_onnx_param_count(m); i++)
            kiln_zero_grad(kiln_onnx_param(m, i));
        kiln_tensor *x = read_x(dir, paths[p], dev);
        if (!x)
            continue;
        kiln_requires_grad(x, true);
        kiln_scope_begin();
        kiln_tensor *w = kiln_rand_normal(dev, KILN_F32, KILN_SHAPE(4, 3), 0, 1, &g);
        kiln_tensor *y = run(m, x);
        kiln_tensor *f = y ? kiln_sum(kiln_mul(y, w), KILN_ALL_DIMS, false) : NULL;
        CHECK(f && kiln_backward(f, NULL) == 0, "%s: backward", paths[p]);
        kiln_tensor_release(y);
        for (int l = 0; l < 3; l++)
            CHECK(has_grad(param(m, layers[l])) == runs[p][l], "%s: %s %s a gradient", paths[p], layers[l],
                  runs[p][l] ? "lacks" : "has");
        CHECK(has_grad(param(m, "inp.weight")) && has_grad(param(m, "out.weight")), "%s: outer layers", paths[p]);
        /* the input's gradient along random directions against central differences (steps
         * small enough that no ReLU of the first layer changes side) */
        kiln_tensor *gx = kiln_grad(x);
        CHECK(gx != NULL, "%s: no gradient for the input", paths[p]);
        if (gx)
            check_directions(m, x, w, gx, &g, paths[p]);
        kiln_tensor_release(gx);
        kiln_scope_end();
        kiln_tensor_release(x);
    }
    kiln_onnx_free(m);
}

/* Adam through the model on the batches of two branches: each one's loss falls. */
static void check_train(const char *dir, kiln_device *dev)
{
    kiln_onnx_model *m = load(dir, dev, true);
    if (!m || kiln_onnx_set_trainable(m, true)) {
        CHECK(0, "trainable");
        kiln_onnx_free(m);
        return;
    }
    int np = kiln_onnx_param_count(m), n = 0;
    kiln_tensor **params = calloc((size_t)np + 1, sizeof *params);
    const char **names = calloc((size_t)np + 1, sizeof *names);
    for (int i = 0; params && names && i < np; i++)
        if (kiln_dtype_is_float(kiln_tensor_dtype(kiln_onnx_param(m, i)))) {
            params[n] = kiln_onnx_param(m, i);
            names[n++] = kiln_onnx_param_name(m, i);
        }
    kiln_optim_config cfg = kiln_optim_config_default(KILN_OPTIM_ADAM);
    cfg.lr = 1e-2;
    kiln_optim *opt = n ? kiln_optim_create(&cfg, n, params, names) : NULL;
    CHECK(opt != NULL, "optimizer");
    kiln_generator g = kiln_generator_make(9);
    kiln_tensor *xs[2] = {read_x(dir, "branchy.pos", dev), read_x(dir, "branchy.neg", dev)};
    kiln_tensor *ts[2] = {kiln_keep(kiln_rand_normal(dev, KILN_F32, KILN_SHAPE(4, 3), 0, 1, &g)),
                          kiln_keep(kiln_rand_normal(dev, KILN_F32, KILN_SHAPE(4, 3), 0, 1, &g))};
    double first[2] = {0}, last[2] = {0};
    for (int step = 0; opt && xs[0] && xs[1] && step < 60; step++) {
        int b = step % 2;
        kiln_scope_begin();
        kiln_tensor *y = run(m, xs[b]);
        kiln_tensor *loss = y ? kiln_loss_mse(y, ts[b], KILN_REDUCTION_MEAN) : NULL;
        double l = loss ? kiln_item(loss) : NAN;
        int rc = loss ? kiln_backward(loss, NULL) : -1;
        rc = rc ? rc : kiln_optim_step(opt) < 0 ? -1 : 0;
        kiln_optim_zero_grad(opt);
        kiln_tensor_release(y);
        kiln_scope_end();
        if (rc) {
            CHECK(0, "training step %d", step);
            break;
        }
        if (step < 2)
            first[b] = l;
        last[b] = l;
    }
    printf("training through the If: loss %.4f -> %.4f (then branch), %.4f -> %.4f (else branch)\n", first[0],
           last[0], first[1], last[1]);
    CHECK(last[0] < 0.5 * first[0] && last[1] < 0.5 * first[1], "the losses did not fall");
    for (int b = 0; b < 2; b++) {
        kiln_tensor_release(xs[b]);
        kiln_tensor_release(ts[b]);
    }
    kiln_optim_free(opt);
    free(params);
    free(names);
    kiln_onnx_free(m);
}

static void check_infer(const char *dir, kiln_device *dev)
{
    kiln_onnx_model *m = load(dir, dev, true);
    int nd = 0;
    int64_t shape[1][KILN_MAX_DIMS];
    CHECK(m && kiln_onnx_infer_shapes(m, 5, 1, &nd, shape) == 0 && nd == 2 && shape[0][0] == 5 && shape[0][1] == 3,
          "inferred shape");
    kiln_onnx_free(m);
}

static void check_loop(const char *dir, kiln_device *dev)
{
    static const char *const lens[] = {"loopy.t3", "loopy.t7", "loopy.t3", "loopy.t7"};
    kiln_onnx_model *ma = load_model(dir, "loopy", dev, true), *mp = load_model(dir, "loopy", dev, false);
    kiln_no_grad_begin();
    for (int r = 0; ma && mp && r < 4; r++) {
        kiln_tensor *x = read_x(dir, lens[r], dev);
        kiln_tensor *a = x ? run(ma, x) : NULL, *b = x ? run(mp, x) : NULL;
        CHECK(same_bits(a, b), "loop run %d (%s): arena and plain runs differ", r, lens[r]);
        kiln_tensor_release(a);
        kiln_tensor_release(b);
        kiln_tensor_release(x);
    }
    kiln_no_grad_end();
    kiln_onnx_free(mp);
    if (!ma || kiln_onnx_set_trainable(ma, true)) {
        CHECK(0, "loop: trainable");
        kiln_onnx_free(ma);
        return;
    }
    kiln_generator g = kiln_generator_make(4);
    for (int p = 0; p < 2; p++) {
        for (int i = 0; i < kiln_onnx_param_count(ma); i++)
            kiln_zero_grad(kiln_onnx_param(ma, i));
        kiln_tensor *x = read_x(dir, lens[p], dev);
        if (!x)
            continue;
        kiln_requires_grad(x, true);
        kiln_scope_begin();
        kiln_tensor *w = kiln_rand_normal(dev, KILN_F32, KILN_SHAPE(3), 0, 1, &g);
        kiln_tensor *y = run(ma, x);
        kiln_tensor *f = y ? kiln_sum(kiln_mul(y, w), KILN_ALL_DIMS, false) : NULL;
        CHECK(f && kiln_backward(f, NULL) == 0, "%s: backward", lens[p]);
        kiln_tensor_release(y);
        CHECK(has_grad(param(ma, "w")) && has_grad(param(ma, "inp.weight")), "%s: loop weights", lens[p]);
        kiln_tensor *gx = kiln_grad(x);
        CHECK(gx != NULL, "%s: no gradient for the input", lens[p]);
        if (gx)
            check_directions(ma, x, w, gx, &g, lens[p]);
        kiln_tensor_release(gx);
        kiln_scope_end();
        kiln_tensor_release(x);
    }
    kiln_onnx_free(ma);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s DIR DEVICE\n", argv[0]);
        return 2;
    }
    unsetenv("KILN_ONNX_ARENA");
    kiln_device *dev = kiln_device_open(argv[2]);
    if (!dev) {
        printf("skip: %s\n", kiln_error());
        return 77;
    }
    check_arena(argv[1], dev, !strncmp(argv[2], "cpu", 3) || !strncmp(argv[2], "ref", 3));
    check_grad(argv[1], dev);
    check_train(argv[1], dev);
    check_infer(argv[1], dev);
    check_loop(argv[1], dev);
    kiln_device_close(dev);
    printf("onnx_control %s: %d failures\n", argv[2], failures);
    return failures ? 1 : 0;
}
