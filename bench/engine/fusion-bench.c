/*
 * bench/engine/fusion-bench.c — kiln with automatic fusion ("cpu?fusion=on") beside kiln
 * without it ("cpu"), the same work in the same process, alternating the two every
 * repetition. Prints bench/run's lines directly (ratio = unfused ms / fused ms), and
 * checks before timing that both devices give the same answer.
 *
 *   fusion-bench [FILTER]     rows whose name contains FILTER (all when absent)
 *
 * Each step runs in a scope, as a program would write it (tensor.h's example): the
 * result is kept, the scope ends (the intermediates die, so the fused device never
 * stores them), and a read of the result's first element ends the step (the point where
 * a program would read it, which makes the fused device run its pending group).
 *
 * KILN_BENCH_SECONDS (default 1.5) bounds the time per row; KILN_BENCH_CLOCK=cpu measures
 * CPU time instead of wall time (see now_ms); KILN_FUSION_BENCH_SPECS="FUSED,UNFUSED"
 * replaces the two device specs (bench/gpu/cuda_fusion.bench: "fused:cuda:0,cuda:0"); rows of
 * a device other than cpu are named "fusion/<unfused spec> <row>" and carry no target (the
 * targets are the cpu's). Training-step rows time forward, loss, backward and an
 * Adam step of models built with the C API; the inference rows, a ResNet-50 built with the
 * C API (bench-resnet.c) classifying a batch of one or eight images without gradients.
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln/autodiff.h"
#include "kiln/loss.h"
#include "kiln/nn.h"
#include "kiln/optim.h"
#include "kiln/tensor.h"

#include "bench-resnet.h"

#define WARMUP 12 /* steps before timing: see time_pair */

/* The unfused device's spec (the peer) and, for a device other than cpu, the prefix of
 * every row's name ("cuda:0 "), whose cpu targets then do not apply. */
static char peer_spec[128] = "cpu", row_prefix[136] = "";

/* KILN_BENCH_CLOCK=cpu times process CPU time instead of wall time: with
 * KILN_CPU_THREADS=1 that is the work alone, steady on a shared, loaded machine. */
static double now_ms(void)
{
    static int clock_id = -1;
    if (clock_id < 0) {
        const char *c = getenv("KILN_BENCH_CLOCK");
        clock_id = c && !strcmp(c, "cpu") ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC;
    }
    struct timespec ts;
    clock_gettime(clock_id, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void die(const char *what)
{
    fprintf(stderr, "fusion-bench: %s: %s\n", what, kiln_error());
    exit(1);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One benchmark: its inputs on one device, and a step that returns the result. */
typedef struct workload {
    kiln_tensor *in[4];
    kiln_generator gen;
} workload;

typedef kiln_tensor *(*step_fn)(workload *w);

static float first_of(kiln_tensor *t)
{
    /* a one-element view read to the host: the end of the step for either device */
    kiln_tensor *flat = kiln_reshape(t, 1, (int64_t[]){-1});
    kiln_tensor *one = kiln_slice(flat, 0, 0, 1, 1);
    float v = 0;
    if (!one || kiln_to_data(one, &v, sizeof v) < 0)
        die("read");
    return v;
}

static double run_step(step_fn step, workload *w)
{
    double s = now_ms();
    kiln_scope_begin();
    kiln_tensor *y = kiln_keep(step(w));
    kiln_scope_end();
    if (!y)
        die("step");
    kiln_scope_begin();
    (void)first_of(y);
    kiln_scope_end();
    kiln_tensor_release(y);
    return now_ms() - s;
}

/* Alternates fused and unfused runs (each first in turn) and prints the row; budget_s
 * bounds the timed part. WARMUP runs of each first: the first calls of a shape class try
 * the tuning candidates (an elementwise program's block sizes, five candidates twice:
 * cpu-fused.c; a product's or convolution's: cpu-fused-product.c), the steady state is
 * what is measured. */
static void time_pair(const char *name, double (*run)(void *), void *fused, void *plain, double budget_s,
                      double target)
{
    for (int i = 0; i < WARMUP; i++) {
        run(fused);
        run(plain);
    }
    double per = run(fused) + run(plain);
    int reps = (int)(budget_s * 1e3 / (per > 1e-3 ? per : 1e-3));
    reps = reps < 5 ? 5 : reps > 51 ? 51 : reps;
    double ft[51], pt[51];
    for (int r = 0; r < reps; r++) {
        if (r % 2) {
            ft[r] = run(fused);
            pt[r] = run(plain);
        } else {
            pt[r] = run(plain);
            ft[r] = run(fused);
        }
    }
    qsort(ft, (size_t)reps, sizeof *ft, cmp_double);
    qsort(pt, (size_t)reps, sizeof *pt, cmp_double);
    double fm = ft[reps / 2], pm = pt[reps / 2];
    printf("{\"name\": \"fusion/%s%s\", \"unit\": \"ms\", \"kiln\": %.4f, \"peer\": %.4f, "
           "\"peer_name\": \"kiln unfused (%s)\", \"ratio\": %.3f",
           row_prefix, name, fm, pm, peer_spec, pm / fm);
    if (target > 0 && !row_prefix[0])
        printf(", \"target\": %.2f", target);
    printf("}\n");
    fflush(stdout);
}

/* The time budget of a row: KILN_BENCH_SECONDS (default 1.5) times scale. */
static double bench_seconds(double scale)
{
    const char *env = getenv("KILN_BENCH_SECONDS");
    return scale * (env && atof(env) > 0 ? atof(env) : 1.5);
}

/* An op row's step on one device, for time_pair. */
typedef struct stepped {
    step_fn step;
    workload *w;
} stepped;

static double run_stepped(void *arg)
{
    const stepped *s = arg;
    return run_step(s->step, s->w);
}

static void measure(const char *name, step_fn step, workload *fused, workload *plain, double target)
{
    stepped f = {step, fused}, p = {step, plain};
    time_pair(name, run_stepped, &f, &p, bench_seconds(1), target);
}

/* The largest |fused - unfused| over the whole result, before any timing. */
static void check_same(const char *name, step_fn step, workload *fused, workload *plain, double tol)
{
    kiln_scope_begin();
    kiln_tensor *a = step(fused), *b = step(plain);
    if (!a || !b)
        die(name);
    int64_t n = kiln_tensor_numel(a);
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    if (!x || !y || kiln_to_data(a, x, (size_t)n * sizeof *x) < 0 || kiln_to_data(b, y, (size_t)n * sizeof *y) < 0)
        die("check");
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)x[i] - (double)y[i]) / (fabs((double)y[i]) + 1);
        worst = d > worst ? d : worst;
    }
    fprintf(stderr, "fusion-bench: %s: largest relative difference fused vs unfused %.3g\n", name, worst);
    if (worst > tol) {
        fprintf(stderr, "fusion-bench: %s: fused and unfused results differ\n", name);
        exit(1);
    }
    free(x);
    free(y);
    kiln_scope_end();
}

/* ------------------------------------------------------------------ workloads */

#define ROWS 4096
#define COLS 4096 /* 4096 x 4096 f32: 64 MiB */

/* y = gelu(x * a + b) * c, a, b, c per column (broadcast over rows) */
static kiln_tensor *chain_bcast(workload *w)
{
    return kiln_mul(kiln_gelu(kiln_add(kiln_mul(w->in[0], w->in[1]), w->in[2]), false), w->in[3]);
}

/* the same chain with a, b, c full tensors of x's shape (five 64 MiB streams fused) */
static kiln_tensor *chain_full(workload *w)
{
    return chain_bcast(w);
}

/* layer_norm(x + r) then dropout(p = 0.1): the residual add before a norm */
static kiln_tensor *ln_residual_dropout(workload *w)
{
    kiln_tensor *h = kiln_layer_norm(kiln_add(w->in[0], w->in[1]), 1, w->in[2], w->in[3], 1e-5);
    w->gen = kiln_generator_make(7);
    return kiln_dropout(h, 0.1, true, &w->gen);
}

/* layer_norm(x + r) alone: the residual add fused into the norm's reads */
static kiln_tensor *ln_residual(workload *w)
{
    return kiln_layer_norm(kiln_add(w->in[0], w->in[1]), 1, w->in[2], w->in[3], 1e-5);
}

/* gelu(x w + b): a linear layer's matmul with its bias and activation as the epilogue
 * (inference: the product dies before the read, so the fused device never stores it) */
static kiln_tensor *linear_gelu(workload *w)
{
    return kiln_gelu(kiln_add(kiln_matmul(w->in[0], w->in[1]), w->in[2]), false);
}

/* softmax(q kᵀ / √d) over [B·H, S, S] scores */
static kiln_tensor *attn_scores(workload *w)
{
    kiln_tensor *s = kiln_matmul(w->in[0], kiln_transpose(w->in[1], -2, -1));
    return kiln_softmax(kiln_mul_scalar(s, 1.0 / 8.0), -1);
}

static void make(workload *w, kiln_device *dev, int n, const int64_t (*shapes)[3], const int *ndims)
{
    memset(w, 0, sizeof *w);
    kiln_generator g = kiln_generator_make(42);
    for (int i = 0; i < n; i++) {
        w->in[i] = kiln_keep(kiln_rand_uniform(dev, KILN_F32, ndims[i], shapes[i], -2, 2, &g));
        if (!w->in[i])
            die("inputs");
    }
}

static void drop(workload *w)
{
    for (int i = 0; i < 4; i++)
        if (w->in[i])
            kiln_tensor_release(w->in[i]);
}

/* tol: the largest relative difference fused vs unfused allowed (1e-5: elementwise and row
 * ops give the same bits or add in double; a product's panels may round differently from
 * the whole product, by about K ulps) */
static void row_tol(const char *filter, const char *name, step_fn step, kiln_device *fd, kiln_device *pd, int n,
                    const int64_t (*shapes)[3], const int *ndims, double target, double tol)
{
    if (filter && !strstr(name, filter))
        return;
    workload f, p;
    make(&f, fd, n, shapes, ndims);
    make(&p, pd, n, shapes, ndims);
    check_same(name, step, &f, &p, tol);
    measure(name, step, &f, &p, target);
    drop(&f);
    drop(&p);
}

static void row(const char *filter, const char *name, step_fn step, kiln_device *fd, kiln_device *pd, int n,
                const int64_t (*shapes)[3], const int *ndims, double target)
{
    row_tol(filter, name, step, fd, pd, n, shapes, ndims, target, 1e-5);
}

/* ------------------------------------------------------------------ training steps */

static const char cnn_spec[] =
    "{\"inputs\": [\"x\"], \"nodes\": ["
    "{\"name\": \"c1\", \"layer\": \"Conv2d\", \"config\": {\"in_channels\": 1, \"out_channels\": 32, "
    "\"kernel_size\": 3, \"padding\": 1}, \"inputs\": [\"x\"]},"
    "{\"name\": \"r1\", \"op\": \"relu\", \"inputs\": [\"c1\"]},"
    "{\"name\": \"p1\", \"layer\": \"MaxPool2d\", \"config\": {\"kernel_size\": 2}, \"inputs\": [\"r1\"]},"
    "{\"name\": \"c2\", \"layer\": \"Conv2d\", \"config\": {\"in_channels\": 32, \"out_channels\": 64, "
    "\"kernel_size\": 3, \"padding\": 1}, \"inputs\": [\"p1\"]},"
    "{\"name\": \"r2\", \"op\": \"relu\", \"inputs\": [\"c2\"]},"
    "{\"name\": \"p2\", \"layer\": \"MaxPool2d\", \"config\": {\"kernel_size\": 2}, \"inputs\": [\"r2\"]},"
    "{\"name\": \"f\", \"op\": \"flatten\", \"start_dim\": 1, \"inputs\": [\"p2\"]},"
    "{\"name\": \"fc1\", \"layer\": \"Linear\", \"config\": {\"in_features\": 3136, \"out_features\": 128}, "
    "\"inputs\": [\"f\"]},"
    "{\"name\": \"r3\", \"op\": \"relu\", \"inputs\": [\"fc1\"]},"
    "{\"name\": \"fc2\", \"layer\": \"Linear\", \"config\": {\"in_features\": 128, \"out_features\": 10}, "
    "\"inputs\": [\"r3\"]}"
    "], \"outputs\": [\"fc2\"]}";

typedef struct trainer {
    kiln_module *m;
    kiln_optim *opt;
    kiln_tensor *x, *y;
    bool cnn;
} trainer;

static void trainer_make(trainer *t, kiln_device *dev, bool cnn)
{
    kiln_generator g = kiln_generator_make(3);
    t->cnn = cnn;
    if (cnn) {
        t->m = kiln_model_from_json(cnn_spec, dev, &g);
    } else {
        kiln_transformer_config tc = kiln_transformer_encoder_layer_config_default();
        tc.d_model = 256;
        tc.nhead = 4;
        tc.dim_feedforward = 1024;
        tc.dropout = 0.1;
        tc.batch_first = true;
        tc.activation = KILN_ACT_GELU;
        t->m = kiln_transformer_encoder_layer_init(&tc, dev, &g);
    }
    if (!t->m)
        die("model");
    kiln_optim_config oc = kiln_optim_config_default(KILN_OPTIM_ADAM);
    oc.lr = 1e-3;
    t->opt = kiln_optim_create_module(&oc, t->m);
    kiln_generator dg = kiln_generator_make(9);
    t->x = kiln_keep(cnn ? kiln_rand_uniform(dev, KILN_F32, 4, (int64_t[]){64, 1, 28, 28}, 0, 1, &dg)
                         : kiln_rand_normal(dev, KILN_F32, 3, (int64_t[]){16, 128, 256}, 0, 1, &dg));
    t->y = kiln_keep(kiln_rand_int(dev, KILN_I64, 1, (int64_t[]){64}, 0, 10, &dg));
    if (!t->opt || !t->x || !t->y)
        die("trainer");
}

static double train_step(trainer *t)
{
    double s = now_ms();
    kiln_scope_begin();
    kiln_tensor *out = kiln_module_forward(t->m, t->x), *loss;
    if (t->cnn) {
        kiln_loss_ce_opts o = kiln_loss_ce_opts_default();
        loss = kiln_loss_cross_entropy(out, t->y, &o);
    } else {
        loss = kiln_mean(kiln_square(out), 0, NULL, false);
    }
    if (!loss || kiln_backward(loss, NULL) < 0 || kiln_optim_step(t->opt) < 0)
        die("train step");
    kiln_optim_zero_grad(t->opt);
    (void)kiln_item(loss);
    kiln_scope_end();
    return now_ms() - s;
}

static double train_step_run(void *t)
{
    return train_step(t);
}

/* The memory one run of step takes above what was in use before it (the weights, the
 * inputs, an optimizer's state), fused (f on fd) and unfused (p on pd), on stderr. */
static void report_peaks(const char *name, const char *what, double (*step)(void *), void *f, kiln_device *fd,
                         void *p, kiln_device *pd)
{
    double peak_mb[2];
    for (int k = 0; k < 2; k++) {
        kiln_device *dev = k ? pd : fd;
        kiln_device_memory m;
        if (kiln_device_memory_get(dev, &m) < 0 || kiln_device_memory_reset_peak(dev) < 0) {
            peak_mb[k] = -1;
            continue;
        }
        uint64_t before = m.in_use_bytes;
        (void)step(k ? p : f);
        peak_mb[k] = kiln_device_memory_get(dev, &m) < 0 ? -1 : (double)(m.peak_in_use_bytes - before) / 1e6;
    }
    fprintf(stderr,
            "fusion-bench: %s: peak memory of %s above what was in use before: fused %.1f MB, unfused %.1f MB\n",
            name, what, peak_mb[0], peak_mb[1]);
}

static void train_row(const char *filter, const char *name, kiln_device *fd, kiln_device *pd, bool cnn,
                      double target)
{
    if (filter && !strstr(name, filter))
        return;
    trainer f, p;
    trainer_make(&f, fd, cnn);
    trainer_make(&p, pd, cnn);
    train_step(&f); /* the optimizer's moments exist from the first step on */
    train_step(&p);
    report_peaks(name, "one step", train_step_run, &f, fd, &p, pd);
    time_pair(name, train_step_run, &f, &p, bench_seconds(2), target);
    for (int k = 0; k < 2; k++) {
        trainer *t = k ? &p : &f;
        kiln_tensor_release(t->x);
        kiln_tensor_release(t->y);
        kiln_optim_free(t->opt);
        kiln_module_free(t->m);
    }
}

/* ------------------------------------------------------------------ inference */

#define RESNET_CLASSES 1000

/* ResNet-50 (bench-resnet.c) in eval mode, batch norms calibrated on a batch of two, and
 * the image it classifies */
typedef struct classifier {
    kiln_module *m;
    kiln_tensor *x;
    float logits[RESNET_CLASSES];
} classifier;

static void classifier_make(classifier *c, kiln_device *dev, int64_t batch)
{
    kiln_generator g = kiln_generator_make(3), dg = kiln_generator_make(11);
    c->m = bench_resnet50(dev, &g, RESNET_CLASSES);
    if (!c->m)
        die("resnet50");
    kiln_scope_begin();
    kiln_tensor *calib = kiln_rand_normal(dev, KILN_F32, 4, (int64_t[]){2, 3, 224, 224}, 0, 1, &dg);
    if (bench_resnet_calibrate(c->m, calib) < 0)
        die("resnet50 calibration");
    kiln_scope_end();
    c->x = kiln_keep(kiln_rand_normal(dev, KILN_F32, 4, (int64_t[]){batch, 3, 224, 224}, 0, 1, &dg));
    if (!c->x)
        die("resnet50 input");
}

/* one forward without gradients; the first image's logits read back end it */
static double classify(void *ctx)
{
    classifier *c = ctx;
    double s = now_ms();
    kiln_no_grad_begin();
    kiln_scope_begin();
    kiln_tensor *y = kiln_module_forward(c->m, c->x);
    kiln_tensor *first = y ? kiln_slice(y, 0, 0, 1, 1) : NULL;
    if (!first || kiln_to_data(first, c->logits, sizeof c->logits) < 0)
        die("resnet50 forward");
    kiln_scope_end();
    kiln_no_grad_end();
    return now_ms() - s;
}

static void infer_row(const char *filter, const char *name, kiln_device *fd, kiln_device *pd, int64_t batch)
{
    if (filter && !strstr(name, filter))
        return;
    classifier f, p;
    classifier_make(&f, fd, batch);
    classifier_make(&p, pd, batch);
    classify(&f);
    classify(&p);
    /* conv epilogues (the batch norm's scale and shift, the residual add, the ReLU) round
     * as the unfused ops do; the convolutions' sums may be split differently */
    double worst = 0, scale = 0;
    for (int i = 0; i < RESNET_CLASSES; i++) {
        double d = fabs((double)f.logits[i] - (double)p.logits[i]);
        worst = d > worst ? d : worst;
        scale = fabs((double)p.logits[i]) > scale ? fabs((double)p.logits[i]) : scale;
    }
    fprintf(stderr, "fusion-bench: %s: largest difference fused vs unfused %.3g (largest logit %.3g)\n", name,
            worst, scale);
    if (!(worst <= 1e-3 * (scale + 1))) {
        fprintf(stderr, "fusion-bench: %s: fused and unfused results differ\n", name);
        exit(1);
    }
    report_peaks(name, "one forward", classify, &f, fd, &p, pd);
    time_pair(name, classify, &f, &p, bench_seconds(2), 0);
    for (int k = 0; k < 2; k++) {
        classifier *c = k ? &p : &f;
        kiln_tensor_release(c->x);
        kiln_module_free(c->m);
    }
}

int main(int argc, char **argv)
{
    const char *filter = argc > 1 ? argv[1] : NULL;
    /* KILN_FUSION_BENCH_SPECS="FUSED,UNFUSED" replaces the two device specs */
    char fspec[128] = "cpu?fusion=on", pspec[128] = "cpu";
    const char *specs = getenv("KILN_FUSION_BENCH_SPECS");
    if (specs && strchr(specs, ',')) {
        snprintf(fspec, sizeof fspec, "%.*s", (int)(strchr(specs, ',') - specs), specs);
        snprintf(pspec, sizeof pspec, "%s", strchr(specs, ',') + 1);
        /* other devices' rows carry the device in their names, and no cpu target */
        if (strcmp(pspec, "cpu") != 0)
            snprintf(row_prefix, sizeof row_prefix, "%s ", pspec);
    }
    snprintf(peer_spec, sizeof peer_spec, "%s", pspec);
    /* the cpu's matrix products are OpenBLAS's, whose kernels (its core: detected, or
     * OPENBLAS_CORETYPE's) decide most of a training step: stated beside the figures */
    fprintf(stderr, "fusion-bench: OpenBLAS core %s (%s)\n", openblas_get_corename(), openblas_get_config());
    kiln_device *fd = kiln_device_open(fspec);
    kiln_device *pd = kiln_device_open(pspec);
    if (!fd || !pd)
        die("open");
    {
        const int64_t s[4][3] = {{ROWS, COLS}, {COLS}, {COLS}, {COLS}};
        const int nd[4] = {2, 1, 1, 1};
        row(filter, "gelu(x*a+b)*c 64MiB, a b c per column", chain_bcast, fd, pd, 4, s, nd, 2.5);
    }
    {
        const int64_t s[4][3] = {{ROWS, COLS}, {ROWS, COLS}, {ROWS, COLS}, {ROWS, COLS}};
        const int nd[4] = {2, 2, 2, 2};
        row(filter, "gelu(x*a+b)*c 64MiB, a b c full", chain_full, fd, pd, 4, s, nd, 0);
    }
    {
        const int64_t s[4][3] = {{8192, 768}, {8192, 768}, {768}, {768}};
        const int nd[4] = {2, 2, 1, 1};
        row(filter, "layer_norm(x+r)+dropout [8192,768]", ln_residual_dropout, fd, pd, 4, s, nd, 0);
        row(filter, "layer_norm(x+r) [8192,768]", ln_residual, fd, pd, 4, s, nd, 0);
    }
    {
        const int64_t s[2][3] = {{96, 128, 64}, {96, 128, 64}};
        const int nd[2] = {3, 3};
        row(filter, "softmax(QK^T/sqrt(d)) [96,128,128]", attn_scores, fd, pd, 2, s, nd, 0);
    }
    {
        const int64_t s[3][3] = {{2048, 1024}, {1024, 4096}, {4096}};
        const int nd[3] = {2, 2, 1};
        row_tol(filter, "gelu(x@W+b) [2048,1024]x[1024,4096]", linear_gelu, fd, pd, 3, s, nd, 0, 1e-3);
    }
    train_row(filter, "train step Fashion-MNIST CNN b64 Adam", fd, pd, true, 1.25);
    train_row(filter, "train step Transformer block d256 s128 b16 Adam", fd, pd, false, 1.25);
    infer_row(filter, "inference ResNet-50 b1 224x224", fd, pd, 1);
    infer_row(filter, "inference ResNet-50 b8 224x224", fd, pd, 8);
    kiln_device_close(fd);
    kiln_device_close(pd);
    return 0;
}
