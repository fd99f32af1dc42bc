/*
 * bench/engine/engine-ops.c — times kiln ops on the "cpu" device, and, where the peer is
 * a C routine, that peer in the same process, alternating the two every repetition.
 *
 *   engine-ops GROUP      GROUP: matmul | elementwise | norm | conv2d | max_pool2d
 *
 * Prints one JSON object per measurement on stdout:
 *   {"name": "...", "kiln": ms, "peer": ms, "peer_name": "..."}   (peer only when in-process)
 * driver.py adds the PyTorch figures, ratios and targets. Progress goes to stderr.
 *
 * kiln is used as a real program would: inputs made once, each step inside a scope so
 * the output buffer goes back to the device's pool and is reused by the next step, and a
 * device sync before the clock stops. Each figure is the median of the repetitions after
 * warm-up; KILN_BENCH_SECONDS (default 1.5) bounds the time spent per figure.
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "kiln/tensor.h"
#include "plain-loops.h"

static kiln_device *g_dev;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void die(const char *what)
{
    fprintf(stderr, "engine-ops: %s: %s\n", what, kiln_error());
    exit(1);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef void (*step_fn)(void *ctx);

/* Time kiln (and the peer when given), alternating; medians into *kiln_ms, *peer_ms. */
/*
 * OpenBLAS threads for the peer's steps (0: leave as is). Opening kiln's cpu device sets OpenBLAS
 * to one thread process-wide, because kiln's own pool splits its GEMMs; the sgemm peer runs at its
 * best, a thread per core, so measure() switches before each peer step and gives kiln its setting
 * back after, both outside the timed interval.
 */
static int g_peer_blas_threads;

static void peer_blas_enter(int *saved)
{
    *saved = openblas_get_num_threads();
    if (g_peer_blas_threads > 0)
        openblas_set_num_threads(g_peer_blas_threads);
}

static void peer_blas_leave(int saved)
{
    if (g_peer_blas_threads > 0)
        openblas_set_num_threads(saved);
}

static void measure(step_fn kiln_step, void *kctx, step_fn peer_step, void *pctx, double *kiln_ms,
                    double *peer_ms)
{
    int saved = 0;
    double budget = 1.5;
    const char *env = getenv("KILN_BENCH_SECONDS");
    if (env && atof(env) > 0)
        budget = atof(env);
    /* warm-up: two steps each, and an estimate of one step */
    double t0 = now_ms();
    for (int i = 0; i < 2; i++) {
        kiln_step(kctx);
        if (peer_step) {
            peer_blas_enter(&saved);
            peer_step(pctx);
            peer_blas_leave(saved);
        }
    }
    double per = (now_ms() - t0) / 2;
    int reps = (int)(budget * 1e3 / (per > 1e-3 ? per : 1e-3));
    reps = reps < 5 ? 5 : reps > 51 ? 51 : reps;
    double *kt = malloc((size_t)reps * sizeof *kt), *pt = malloc((size_t)reps * sizeof *pt);
    for (int r = 0; r < reps; r++) {
        double s = now_ms();
        kiln_step(kctx);
        kt[r] = now_ms() - s;
        if (peer_step) {
            peer_blas_enter(&saved);
            s = now_ms();
            peer_step(pctx);
            pt[r] = now_ms() - s;
            peer_blas_leave(saved);
        }
    }
    *kiln_ms = median(kt, reps);
    *peer_ms = peer_step ? median(pt, reps) : 0;
    free(kt);
    free(pt);
}

static void emit(const char *name, double kiln_ms, double peer_ms, const char *peer_name)
{
    if (peer_name)
        printf("{\"name\": \"%s\", \"kiln\": %.4f, \"peer\": %.4f, \"peer_name\": \"%s\"}\n", name, kiln_ms,
               peer_ms, peer_name);
    else
        printf("{\"name\": \"%s\", \"kiln\": %.4f}\n", name, kiln_ms);
    fflush(stdout);
}

static float *host_random(size_t n, uint64_t seed, float lo, float hi)
{
    float *p = malloc(n * sizeof *p);
    if (!p) {
        fprintf(stderr, "engine-ops: out of memory\n");
        exit(1);
    }
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = lo + (hi - lo) * (float)((s >> 40) * 0x1.0p-24);
    }
    return p;
}

static kiln_tensor *upload(const float *host, int ndim, const int64_t *shape)
{
    size_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= (size_t)shape[i];
    kiln_tensor *t = kiln_from_data(g_dev, KILN_F32, ndim, shape, host, n * sizeof(float));
    if (!t)
        die("upload");
    return t;
}

/* Largest |a - b| / (|b| + 1) over n floats, for a sanity check of kiln's answer. */
static double max_err(const kiln_tensor *t, const float *ref, size_t n)
{
    float *got = malloc(n * sizeof *got);
    if (kiln_to_data(t, got, n * sizeof *got) < 0)
        die("download");
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]) / (fabs((double)ref[i]) + 1);
        if (!(e <= worst))
            worst = e;
    }
    free(got);
    return worst;
}

/* ------------------------------------------------------------------ kiln steps */

typedef struct kstep {
    int op;
    kiln_tensor *a, *b, *c;
    const kiln_conv_opts *conv; /* K_CONV2D: stride, padding, groups */
    kiln_tensor *last; /* kept result of the final step, for checking */
    bool keep;
    kiln_generator gen; /* K_BERNOULLI's draws */
} kstep;

enum {
    K_MATMUL,
    K_ADD,
    K_GELU,
    K_SOFTMAX,
    K_LAYER_NORM,
    K_CONV2D,
    K_MAXPOOL2D,
    K_MAXPOOL2D_IDX,
    K_BERNOULLI
};

static void kiln_step(void *p)
{
    kstep *k = p;
    kiln_scope_begin();
    kiln_tensor *y = NULL;
    switch (k->op) {
    case K_MATMUL: y = kiln_matmul(k->a, k->b); break;
    case K_ADD: y = kiln_add(k->a, k->b); break;
    case K_GELU: y = kiln_gelu(k->a, false); break;
    case K_SOFTMAX: y = kiln_softmax(k->a, -1); break;
    case K_LAYER_NORM: y = kiln_layer_norm(k->a, 1, k->b, k->c, 1e-5); break;
    case K_CONV2D: y = kiln_conv2d(k->a, k->b, k->c, k->conv); break;
    case K_MAXPOOL2D:
    case K_MAXPOOL2D_IDX: { /* the latter as training runs it: the maximum's index kept too */
        kiln_pool_opts o = {.kernel = {2, 2}};
        kiln_tensor *ix = NULL;
        y = kiln_max_pool2d(k->a, &o, k->op == K_MAXPOOL2D_IDX ? &ix : NULL);
        break;
    }
    case K_BERNOULLI: /* dropout's mask: keep with probability 0.9, one stream over the steps */
        y = kiln_rand_bernoulli(g_dev, KILN_F32, kiln_tensor_ndim(k->a), kiln_tensor_shape(k->a), 0.9, &k->gen);
        break;
    }
    if (!y)
        die("op");
    if (kiln_device_sync(g_dev) < 0)
        die("sync");
    if (k->keep) {
        kiln_tensor_release(k->last);
        k->last = kiln_keep(y);
    }
    kiln_scope_end();
}

/* ------------------------------------------------------------------ peers */

typedef struct sgemm_ctx {
    int batch, n;
    const float *a, *b;
    float *c;
} sgemm_ctx;

static void sgemm_step(void *p)
{
    sgemm_ctx *s = p;
    size_t nn = (size_t)s->n * (size_t)s->n;
    for (int i = 0; i < s->batch; i++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->n, s->n, s->n, 1.0f, s->a + i * nn, s->n,
                    s->b + i * nn, s->n, 0.0f, s->c + i * nn, s->n);
}

typedef struct loop_ctx {
    int op;
    const float *a, *b;
    float *out;
    size_t n;
} loop_ctx;

static void loop_step(void *p)
{
    loop_ctx *l = p;
    if (l->op == K_ADD)
        plain_add_f32(l->out, l->a, l->b, l->n);
    else
        plain_gelu_f32(l->out, l->a, l->n);
}

/* ------------------------------------------------------------------ groups */

static void group_matmul(void)
{
    g_peer_blas_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    static const int sizes[] = {256, 512, 1024, 2048};
    for (int si = 0; si < 5; si++) {
        int batch = si < 4 ? 1 : 8, n = si < 4 ? sizes[si] : 512;
        size_t total = (size_t)batch * (size_t)n * (size_t)n;
        float *a = host_random(total, 1, -1, 1), *b = host_random(total, 2, -1, 1);
        float *c = calloc(total, sizeof *c);
        kiln_tensor *ka, *kb;
        if (batch == 1) {
            ka = upload(a, KILN_SHAPE(n, n));
            kb = upload(b, KILN_SHAPE(n, n));
        } else {
            ka = upload(a, KILN_SHAPE(batch, n, n));
            kb = upload(b, KILN_SHAPE(batch, n, n));
        }
        kstep k = {.op = K_MATMUL, .a = ka, .b = kb};
        sgemm_ctx s = {.batch = batch, .n = n, .a = a, .b = b, .c = c};
        double km, pm;
        measure(kiln_step, &k, sgemm_step, &s, &km, &pm);
        k.keep = true; /* one more step whose result is kept for the check */
        kiln_step(&k);
        double err = max_err(k.last, c, total);
        if (err > 1e-3)
            fprintf(stderr, "engine-ops: warning: kiln matmul differs from sgemm by %g\n", err);
        char name[64];
        if (batch == 1)
            snprintf(name, sizeof name, "matmul_f32_%d", n);
        else
            snprintf(name, sizeof name, "matmul_f32_batched_%dx%d", batch, n);
        emit(name, km, pm, "cblas_sgemm (OpenBLAS, same process)");
        kiln_tensor_release(k.last);
        kiln_tensor_release(ka);
        kiln_tensor_release(kb);
        free(a);
        free(b);
        free(c);
    }
}

static void group_elementwise(void)
{
    const size_t n = (size_t)16 << 20;
    float *a = host_random(n, 3, -4, 4), *b = host_random(n, 4, -4, 4), *out = malloc(n * sizeof *out);
    memset(out, 0, n * sizeof *out); /* fault the peer's output buffer in once, as kiln's pool is */
    kiln_tensor *ka = upload(a, KILN_SHAPE((int64_t)n)), *kb = upload(b, KILN_SHAPE((int64_t)n));
    for (int op = K_ADD; op <= K_GELU; op++) {
        kstep k = {.op = op, .a = ka, .b = kb};
        loop_ctx l = {.op = op, .a = a, .b = b, .out = out, .n = n};
        double km, pm;
        measure(kiln_step, &k, loop_step, &l, &km, &pm);
        k.keep = true;
        kiln_step(&k);
        double err = max_err(k.last, out, n);
        if (err > 1e-5)
            fprintf(stderr, "engine-ops: warning: kiln %s differs from the plain loop by %g\n",
                    op == K_ADD ? "add" : "gelu", err);
        emit(op == K_ADD ? "add_f32_16M" : "gelu_f32_16M", km, pm, "plain C loop, -O3 -march=native");
        kiln_tensor_release(k.last);
    }
    {
        kstep k = {.op = K_BERNOULLI, .a = ka, .gen = kiln_generator_make(7)};
        double km, pm;
        measure(kiln_step, &k, NULL, NULL, &km, &pm);
        emit("bernoulli_f32_16M", km, 0, NULL);
    }
    kiln_tensor_release(ka);
    kiln_tensor_release(kb);
    free(a);
    free(b);
    free(out);
}

static void group_norm(void)
{
    float *x = host_random((size_t)4096 * 1024, 5, -4, 4), *w = host_random(1024, 6, 0.5f, 1.5f),
          *b = host_random(1024, 7, -1, 1);
    kiln_tensor *kx = upload(x, KILN_SHAPE(4096, 1024)), *kw = upload(w, KILN_SHAPE(1024)),
                *kb = upload(b, KILN_SHAPE(1024));
    double km, pm;
    kstep k = {.op = K_SOFTMAX, .a = kx};
    measure(kiln_step, &k, NULL, NULL, &km, &pm);
    emit("softmax_f32_4096x1024", km, 0, NULL);
    k = (kstep){.op = K_LAYER_NORM, .a = kx, .b = kw, .c = kb};
    measure(kiln_step, &k, NULL, NULL, &km, &pm);
    emit("layer_norm_f32_4096x1024", km, 0, NULL);
    kiln_tensor_release(kx);
    kiln_tensor_release(kw);
    kiln_tensor_release(kb);
    free(x);
    free(w);
    free(b);
}

/* The 3x3 64-channel batch-8 layer, then the convolutions of ResNet-50 and
 * MobileNetV3-small at batch 1 (the shapes an ONNX model runs one request at a time);
 * torch_ops.py lists the same table. */
typedef struct conv_shape {
    const char *name;
    int64_t n, c, o, h, w, k, stride, pad, groups;
} conv_shape;

static const conv_shape conv_shapes[] = {
    {"conv2d_f32_3x3_b8_64to64_56x56", 8, 64, 64, 56, 56, 3, 1, 1, 1},
    {"conv2d_f32_1x1_b1_64to256_56x56", 1, 64, 256, 56, 56, 1, 1, 0, 1},
    {"conv2d_f32_1x1_b1_256to64_56x56", 1, 256, 64, 56, 56, 1, 1, 0, 1},
    {"conv2d_f32_1x1_s2_b1_256to512_56x56", 1, 256, 512, 56, 56, 1, 2, 0, 1},
    {"conv2d_f32_1x1_b1_1024to256_14x14", 1, 1024, 256, 14, 14, 1, 1, 0, 1},
    {"conv2d_f32_3x3_b1_64to64_56x56", 1, 64, 64, 56, 56, 3, 1, 1, 1},
    {"conv2d_f32_3x3_b1_128to128_28x28", 1, 128, 128, 28, 28, 3, 1, 1, 1},
    {"conv2d_f32_3x3_s2_b1_128to128_56x56", 1, 128, 128, 56, 56, 3, 2, 1, 1},
    {"conv2d_f32_3x3_b1_256to256_14x14", 1, 256, 256, 14, 14, 3, 1, 1, 1},
    {"conv2d_f32_7x7_s2_b1_3to64_224x224", 1, 3, 64, 224, 224, 7, 2, 3, 1},
    {"conv2d_f32_3x3_s2_b1_3to16_224x224", 1, 3, 16, 224, 224, 3, 2, 1, 1},
    {"conv2d_f32_dw3x3_s2_b1_16_112x112", 1, 16, 16, 112, 112, 3, 2, 1, 16},
    {"conv2d_f32_dw3x3_b1_88_28x28", 1, 88, 88, 28, 28, 3, 1, 1, 88},
    {"conv2d_f32_dw5x5_s2_b1_96_28x28", 1, 96, 96, 28, 28, 5, 2, 2, 96},
    {"conv2d_f32_dw5x5_b1_240_14x14", 1, 240, 240, 14, 14, 5, 1, 2, 240},
    {"conv2d_f32_dw5x5_b1_576_7x7", 1, 576, 576, 7, 7, 5, 1, 2, 576},
};

static void group_conv2d(void)
{
    /* KILN_BENCH_FILTER=substring runs only the shapes whose name contains it (profiling) */
    const char *only = getenv("KILN_BENCH_FILTER");
    for (size_t i = 0; i < sizeof conv_shapes / sizeof conv_shapes[0]; i++) {
        const conv_shape *cs = &conv_shapes[i];
        if (only && !strstr(cs->name, only))
            continue;
        int64_t cg = cs->c / cs->groups;
        float *x = host_random((size_t)(cs->n * cs->c * cs->h * cs->w), 8, -1, 1),
              *w = host_random((size_t)(cs->o * cg * cs->k * cs->k), 9, -0.1f, 0.1f),
              *b = host_random((size_t)cs->o, 10, -1, 1);
        kiln_tensor *kx = upload(x, KILN_SHAPE(cs->n, cs->c, cs->h, cs->w)),
                    *kw = upload(w, KILN_SHAPE(cs->o, cg, cs->k, cs->k)), *kb = upload(b, KILN_SHAPE(cs->o));
        kiln_conv_opts o = {.stride = {cs->stride, cs->stride}, .padding = {cs->pad, cs->pad}, .groups = cs->groups};
        double km, pm;
        kstep k = {.op = K_CONV2D, .a = kx, .b = kw, .c = kb, .conv = &o};
        measure(kiln_step, &k, NULL, NULL, &km, &pm);
        emit(cs->name, km, 0, NULL);
        kiln_tensor_release(kx);
        kiln_tensor_release(kw);
        kiln_tensor_release(kb);
        free(x);
        free(w);
        free(b);
    }
}

static void group_max_pool2d(void)
{
    float *x = host_random((size_t)2 * 32 * 512 * 512, 11, -1, 1);
    kiln_tensor *kx = upload(x, KILN_SHAPE(2, 32, 512, 512));
    double km, pm;
    kstep k = {.op = K_MAXPOOL2D, .a = kx};
    measure(kiln_step, &k, NULL, NULL, &km, &pm);
    emit("max_pool2d_f32_2x2_2x32x512x512", km, 0, NULL);
    k.op = K_MAXPOOL2D_IDX;
    measure(kiln_step, &k, NULL, NULL, &km, &pm);
    emit("max_pool2d_indices_f32_2x2_2x32x512x512", km, 0, NULL);
    kiln_tensor_release(kx);
    free(x);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: engine-ops matmul|elementwise|norm|conv2d|max_pool2d\n");
        return 2;
    }
    g_dev = kiln_device_open("cpu");
    if (!g_dev)
        die("opening the cpu device");
    const char *g = argv[1];
    if (strcmp(g, "matmul") == 0)
        group_matmul();
    else if (strcmp(g, "elementwise") == 0)
        group_elementwise();
    else if (strcmp(g, "norm") == 0)
        group_norm();
    else if (strcmp(g, "conv2d") == 0)
        group_conv2d();
    else if (strcmp(g, "max_pool2d") == 0)
        group_max_pool2d();
    else {
        fprintf(stderr, "engine-ops: unknown group %s\n", g);
        return 2;
    }
    kiln_device_close(g_dev);
    return 0;
}
