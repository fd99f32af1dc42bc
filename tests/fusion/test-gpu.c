/*
 * tests/fusion/test-gpu.c — fusion over the GPU backends, whose fused_run generates a
 * kernel per program (CUDA C through NVRTC, GLSL through shaderc): random expression
 * graphs on "fused:counting:<gpu>" (fused), "counting:<gpu>" (the same device unfused)
 * and "ref" (the oracle), for cuda:0 and vulkan:0. Each is skipped, saying why, where
 * its device does not open.
 *
 * Generated kernels round at every op as the unfused kernels do, but the compilers may
 * evaluate one op's formula (gelu, tanh) differently from the prebuilt kernels, so fused
 * and unfused results are compared within a few ulps (rel 1e-5) instead of to the bit,
 * and both within 1e-4 of ref. Also: the fused device reaches its kernels in fewer calls
 * and actually ran generated programs (its "fused" count), a chain runs as one fused
 * call, softmax and a mean over rows join a group, the ops with parameters, rounding,
 * remainder, pow, a flipped view and a bool result agree, and a group the backend cannot
 * generate (more buffers than a Vulkan kernel binds) falls back to the unfused ops with
 * the same results. On vulkan:0, the SPIR-V cache on disk: one file per kernel, shared
 * by shapes, and a corrupt file is ignored and replaced.
 */
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "fusion-test.h"
#include "kiln/tensor.h"

#define NDEV 3
static kiln_device *devs[NDEV]; /* fused, unfused, ref */
static const char *gpu;         /* the device under test, for messages */
static bool generates;          /* its backend has a fused_run (else every group replays) */

/* fused within rel_tol (relative, plus as much absolute) of unfused, both within 1e-4 of ref. */
static void compare(const char *what, kiln_tensor *const t[NDEV], double rel_tol)
{
    for (int d = 0; d < NDEV; d++)
        CHECK(t[d] != NULL, "%s %s: device %d: %s", gpu, what, d, kiln_error());
    if (!t[0] || !t[1] || !t[2])
        return;
    int64_t n = kiln_tensor_numel(t[0]);
    float *v[NDEV];
    for (int d = 0; d < NDEV; d++) {
        v[d] = malloc((size_t)n * sizeof(float) + 1);
        CHECK(kiln_to_data(t[d], v[d], (size_t)n * sizeof(float)) == 0, "%s %s: read: %s", gpu, what,
              kiln_error());
    }
    int64_t bad = -1, far = -1;
    for (int64_t i = 0; i < n; i++) {
        bool both_nan = isnan(v[0][i]) && isnan(v[1][i]);
        if (bad < 0 && !both_nan &&
            !(fabs((double)v[0][i] - v[1][i]) <= rel_tol * fabs((double)v[1][i]) + rel_tol))
            bad = i;
        bool ref_nan = isnan(v[0][i]) && isnan(v[2][i]);
        if (far < 0 && !ref_nan && !(fabs((double)v[0][i] - v[2][i]) <= 1e-4 * fabs((double)v[2][i]) + 1e-4))
            far = i;
    }
    CHECK(bad < 0, "%s %s: element %lld fused %.9g, unfused %.9g", gpu, what, (long long)bad,
          bad >= 0 ? v[0][bad] : 0.0, bad >= 0 ? v[1][bad] : 0.0);
    CHECK(far < 0, "%s %s: element %lld fused %.9g, ref %.9g", gpu, what, (long long)far,
          far >= 0 ? v[0][far] : 0.0, far >= 0 ? v[2][far] : 0.0);
    for (int d = 0; d < NDEV; d++)
        free(v[d]);
}

/* The same uniform values in [-2, 2) on every device. */
static void from_host(kiln_tensor *out[NDEV], const int64_t *shape, int ndim, uint64_t *s)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    float *host = malloc((size_t)n * sizeof(float) + 1);
    for (int64_t i = 0; i < n; i++)
        host[i] = (float)((double)test_rand(s) / (double)(1ull << 31) * 4.0 - 2.0);
    for (int d = 0; d < NDEV; d++)
        out[d] = kiln_from_data(devs[d], KILN_F32, ndim, shape, host, (size_t)n * sizeof(float));
    free(host);
}

static void random_graph(int seed)
{
    uint64_t s = (uint64_t)seed * 7919 + 11;
    int64_t R = 1 + test_pick(&s, 37), C = 1 + test_pick(&s, seed % 4 == 0 ? 900 : 45);
    kiln_tensor *v[NDEV][40];
    int n = 0;
    kiln_scope_begin();
    kiln_tensor *full[NDEV], *row[NDEV], *col[NDEV], *tr[NDEV], *wide[NDEV];
    from_host(full, (int64_t[]){R, C}, 2, &s);
    from_host(row, (int64_t[]){C, 1}, 1, &s);
    from_host(col, (int64_t[]){R, 1}, 2, &s);
    from_host(tr, (int64_t[]){C, R}, 2, &s);
    from_host(wide, (int64_t[]){R, 2 * C}, 2, &s);
    uint8_t *bits = malloc((size_t)C);
    for (int64_t i = 0; i < C; i++)
        bits[i] = (uint8_t)(test_rand(&s) & 1);
    kiln_tensor *mask[NDEV];
    for (int d = 0; d < NDEV; d++) {
        v[d][0] = full[d];
        v[d][1] = row[d];
        v[d][2] = col[d];
        v[d][3] = kiln_full(devs[d], KILN_F32, KILN_SHAPE(1), 0.75);
        v[d][4] = kiln_transpose(tr[d], 0, 1);
        v[d][5] = kiln_slice(wide[d], 1, 1, 2 * C, 2);
        mask[d] = kiln_from_data(devs[d], KILN_BOOL, KILN_SHAPE(C), bits, (size_t)C);
    }
    free(bits);
    n = 6;
    uint64_t before[2] = {fusion_calls_of(devs[0], NULL), fusion_calls_of(devs[1], NULL)};
    int nops = 3 + test_pick(&s, 14);
    for (int i = 0; i < nops && n < 39; i++) {
        int kind = test_pick(&s, 10), a = test_pick(&s, n), b = test_pick(&s, n);
        int u = test_pick(&s, 10), bo = test_pick(&s, 6);
        for (int d = 0; d < NDEV; d++) {
            kiln_tensor *r;
            if (kind < 5)
                r = fusion_binary_of(v[d][a], v[d][b], bo);
            else if (kind < 7)
                r = fusion_unary_of(v[d][a], u);
            else if (kind == 7)
                r = kiln_where(kiln_gt(v[d][a], v[d][b]), kiln_where(mask[d], v[d][a], v[d][1]), v[d][b]);
            else if (kind == 8)
                r = kiln_reshape(kiln_reshape(kiln_add(v[d][a], v[d][0]), KILN_SHAPE(-1)), KILN_SHAPE(R, C));
            else
                r = kiln_transpose(kiln_contiguous(kiln_transpose(kiln_mul(v[d][a], v[d][0]), 0, 1)), 0, 1);
            v[d][n] = r;
        }
        n++;
    }
    kiln_tensor *res[NDEV], *red[NDEV], *sm[NDEV];
    for (int d = 0; d < NDEV; d++) {
        res[d] = kiln_add(v[d][n - 1], v[d][0]);
        red[d] = kiln_mean(kiln_mul(res[d], res[d]), KILN_DIMS(-1), true);
        sm[d] = kiln_mul_scalar(kiln_softmax(kiln_sub(res[d], v[d][2]), -1), 3.0);
    }
    char what[96];
    snprintf(what, sizeof what, "graph %d [%lld, %lld] result", seed, (long long)R, (long long)C);
    compare(what, res, 1e-5);
    snprintf(what, sizeof what, "graph %d mean over rows", seed);
    compare(what, red, 1e-5);
    snprintf(what, sizeof what, "graph %d softmax", seed);
    compare(what, sm, 1e-5);
    uint64_t fused_calls = fusion_calls_of(devs[0], NULL) - before[0],
             plain_calls = fusion_calls_of(devs[1], NULL) - before[1];
    CHECK(!generates || fused_calls < plain_calls, "%s graph %d: fused made %llu calls, unfused %llu", gpu, seed,
          (unsigned long long)fused_calls, (unsigned long long)plain_calls);
    kiln_scope_end();
}

/* gelu(x * a + a) * a as one fused call, no unfused elementwise call. */
static void chain(void)
{
    kiln_scope_begin();
    uint64_t s = 99;
    kiln_tensor *x[NDEV], *a[NDEV], *y[NDEV];
    from_host(x, (int64_t[]){300, 517}, 2, &s);
    from_host(a, (int64_t[]){517, 1}, 1, &s);
    kiln_device_sync(devs[0]);
    uint64_t f0 = fusion_calls_of(devs[0], "fused"), u0 = fusion_calls_of(devs[0], "unary"),
             b0 = fusion_calls_of(devs[0], "binary");
    for (int d = 0; d < NDEV; d++)
        y[d] = kiln_mul(kiln_gelu(kiln_add(kiln_mul(x[d], a[d]), a[d]), false), a[d]);
    compare("gelu(x * a + a) * a", y, 1e-5);
    CHECK(!generates || fusion_calls_of(devs[0], "fused") - f0 == 1, "%s: the chain ran as one fused call (%llu)",
          gpu, (unsigned long long)(fusion_calls_of(devs[0], "fused") - f0));
    CHECK(!generates || (fusion_calls_of(devs[0], "unary") == u0 && fusion_calls_of(devs[0], "binary") == b0),
          "%s: no unfused elementwise call reached the kernels", gpu);
    /* log-softmax and a sum over rows of a fused value, inside groups */
    uint64_t sm0 = fusion_calls_of(devs[0], "softmax"), r0 = fusion_calls_of(devs[0], "reduce");
    kiln_tensor *ls[NDEV], *sum[NDEV];
    for (int d = 0; d < NDEV; d++) {
        ls[d] = kiln_log_softmax(kiln_add(x[d], a[d]), -1);
        sum[d] = kiln_sum(kiln_square(kiln_sub(x[d], a[d])), KILN_DIMS(-1), false);
    }
    compare("log_softmax(x + a)", ls, 1e-5);
    compare("sum((x - a)^2, -1)", sum, 1e-5);
    CHECK(!generates || (fusion_calls_of(devs[0], "softmax") == sm0 && fusion_calls_of(devs[0], "reduce") == r0),
          "%s: the softmax and the sum ran inside fused groups", gpu);
    /* a sum over a few long rows ends the group instead of joining it (a fused row runs as
     * one block; the backend's own reduction splits a long row over many): the chain is one
     * fused call, the sum one reduction */
    kiln_tensor *lx[NDEV], *lsum[NDEV];
    from_host(lx, (int64_t[]){4, 65536}, 2, &s);
    kiln_device_sync(devs[0]);
    uint64_t f1 = fusion_calls_of(devs[0], "fused"), r1 = fusion_calls_of(devs[0], "reduce");
    uint64_t u1 = fusion_calls_of(devs[0], "unary"), b1 = fusion_calls_of(devs[0], "binary");
    for (int d = 0; d < NDEV; d++)
        lsum[d] = kiln_sum(kiln_square(kiln_add_scalar(kiln_tanh(lx[d]), 0.5)), KILN_DIMS(-1), false);
    compare("sum((tanh(x) + 0.5)^2, -1) over 4 rows of 65536", lsum, 1e-5);
    CHECK(!generates ||
              (fusion_calls_of(devs[0], "fused") - f1 == 1 && fusion_calls_of(devs[0], "reduce") - r1 == 1 &&
               fusion_calls_of(devs[0], "unary") == u1 && fusion_calls_of(devs[0], "binary") == b1),
          "%s: a few long rows: the chain fused (%llu fused calls), the sum by itself (%llu reductions)", gpu,
          (unsigned long long)(fusion_calls_of(devs[0], "fused") - f1),
          (unsigned long long)(fusion_calls_of(devs[0], "reduce") - r1));
    kiln_scope_end();
}

/* The ops with parameters, rounding, remainder and pow (left to the unfused kernels on
 * Vulkan), a flipped view, and a comparison kept as a bool tensor. */
static void op_coverage(void)
{
    kiln_scope_begin();
    uint64_t s = 23;
    kiln_tensor *x[NDEV], *y[NDEV], *r[NDEV], *q[NDEV], *c[NDEV];
    from_host(x, (int64_t[]){33, 70}, 2, &s);
    from_host(y, (int64_t[]){33, 70}, 2, &s);
    for (int d = 0; d < NDEV; d++) {
        kiln_tensor *t = kiln_leaky_relu(kiln_mul_scalar(x[d], 1.5), 0.1);
        t = kiln_add(kiln_elu(t, 0.7), kiln_softplus(y[d], 2.0, 10.0));
        t = kiln_add(kiln_clamp(t, -0.5, 0.8), kiln_floor(kiln_mul_scalar(y[d], 3.0)));
        t = kiln_add(t, kiln_round(kiln_mul_scalar(x[d], 2.5)));
        t = kiln_mul(t, kiln_flip(y[d], 1, (int[]){1}));
        r[d] = kiln_sub(t, kiln_sigmoid(kiln_neg(kiln_abs(x[d]))));
        q[d] = kiln_add(kiln_remainder(x[d], kiln_add_scalar(kiln_abs(y[d]), 0.5)),
                        kiln_pow(kiln_abs(x[d]), kiln_pow_scalar(y[d], 2.0)));
        c[d] = kiln_le(kiln_add(x[d], y[d]), kiln_mul(x[d], y[d]));
    }
    compare("parametric ops, rounding and a flipped view", r, 1e-5);
    compare("remainder and pow", q, 1e-5);
    uint8_t b[NDEV][33 * 70];
    for (int d = 0; d < NDEV; d++)
        CHECK(c[d] && kiln_to_data(c[d], b[d], sizeof b[d]) == 0, "%s bool result %d: %s", gpu, d, kiln_error());
    CHECK(!memcmp(b[0], b[1], sizeof b[0]) && !memcmp(b[0], b[2], sizeof b[0]),
          "%s: x + y <= x * y kept as bool agrees with unfused and ref", gpu);
    kiln_scope_end();
}

/* A group over ten distinct buffers: a Vulkan kernel binds at most eight, so there the
 * group is replayed unfused; the results are the same either way. */
static void wide_group(void)
{
    kiln_scope_begin();
    uint64_t s = 7;
    kiln_tensor *in[10][NDEV], *acc[NDEV];
    for (int k = 0; k < 10; k++)
        from_host(in[k], (int64_t[]){64, 33}, 2, &s);
    for (int d = 0; d < NDEV; d++) {
        acc[d] = in[0][d];
        for (int k = 1; k < 10; k++)
            acc[d] = kiln_add(kiln_mul_scalar(acc[d], 0.5), in[k][d]);
    }
    compare("a chain over ten inputs", acc, 1e-5);
    kiln_scope_end();
}

static void run_on(const char *spec)
{
    char specs[NDEV][64];
    snprintf(specs[0], sizeof specs[0], "fused:counting:%s", spec);
    snprintf(specs[1], sizeof specs[1], "counting:%s", spec);
    snprintf(specs[2], sizeof specs[2], "ref");
    gpu = spec;
    for (int d = 0; d < NDEV; d++) {
        devs[d] = kiln_device_open(specs[d]);
        if (!devs[d]) {
            printf("fusion on %s: skipped: %s does not open here (%s)\n", spec, specs[d], kiln_error());
            for (int k = 0; k < d; k++)
                kiln_device_close(devs[k]);
            return;
        }
    }
    /* a backend built without its generator (vulkan without shaderc) has no fused_run:
     * its groups replay, which must give the same results; the counts are not checked */
    char raw[80];
    snprintf(raw, sizeof raw, "%s?fusion=off", spec); /* the backend itself (vulkan:0 is fused by default) */
    kiln_device *plain = kiln_device_open(raw);
    generates = plain && kiln__device_iface(plain)->fused_run != NULL;
    kiln_device_close(plain);
    if (!generates)
        printf("fusion on %s: its backend generates no kernels (built without its compiler): groups replay, "
               "launch counts not checked\n",
               spec);
    int failed_before = fusion_failed;
    for (int seed = 0; seed < 24; seed++)
        random_graph(seed);
    chain();
    op_coverage();
    wide_group();
    CHECK(!generates || fusion_calls_of(devs[0], "fused") > 0, "%s ran generated programs (%llu fused calls)",
          spec, (unsigned long long)fusion_calls_of(devs[0], "fused"));
    printf("fusion on %s: %s\n", spec, fusion_failed == failed_before ? "passed" : "FAILED");
    for (int d = 0; d < NDEV; d++)
        kiln_device_close(devs[d]);
}

/* The vulkan-fused-*.spv files in dir, and the path of the first into first. */
static int spv_files(const char *dir, char *first, size_t len)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d)
        return 0;
    for (struct dirent *e; (e = readdir(d));)
        if (!strncmp(e->d_name, "vulkan-fused-", 13) && strstr(e->d_name, ".spv")) {
            if (n++ == 0)
                snprintf(first, len, "%.200s/%.200s", dir, e->d_name);
        }
    closedir(d);
    return n;
}

/* x * a + tanh(x) over [rows, cols] on a fresh fused:vulkan:0; 0 when every element is right. */
static int disk_chain(int64_t rows, int64_t cols)
{
    kiln_device *d = kiln_device_open("fused:vulkan:0");
    if (!d)
        return -1;
    int bad = 0;
    kiln_scope_begin();
    int64_t n = rows * cols;
    float *x = malloc((size_t)n * sizeof(float)), *a = malloc((size_t)cols * sizeof(float));
    float *y = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(i % 13) * 0.25f - 1.5f;
    for (int64_t j = 0; j < cols; j++)
        a[j] = (float)(j % 5) * 0.5f - 1.0f;
    kiln_tensor *tx = kiln_from_data(d, KILN_F32, KILN_SHAPE(rows, cols), x, (size_t)n * sizeof(float));
    kiln_tensor *ta = kiln_from_data(d, KILN_F32, KILN_SHAPE(cols), a, (size_t)cols * sizeof(float));
    kiln_tensor *ty = kiln_add(kiln_mul(tx, ta), kiln_tanh(tx));
    if (!ty || kiln_to_data(ty, y, (size_t)n * sizeof(float)) < 0)
        bad = 1;
    for (int64_t i = 0; i < n && !bad; i++) {
        double want = (double)x[i] * a[i % cols] + tanh((double)x[i]);
        bad = fabs(y[i] - want) > 1e-5 * fabs(want) + 1e-5;
    }
    kiln_scope_end();
    free(x);
    free(a);
    free(y);
    kiln_device_close(d);
    return bad;
}

static void vulkan_disk_cache(void)
{
    kiln_device *probe = kiln_device_open("vulkan:0?fusion=off");
    bool generates_here = probe && kiln__device_iface(probe)->fused_run != NULL;
    kiln_device_close(probe);
    if (!generates_here) {
        printf("vulkan fused kernel cache on disk: skipped: no vulkan:0 with generated kernels here\n");
        return;
    }
    char dir[] = "/tmp/kiln-fused-spvXXXXXX", cache[64], first[512] = "";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(cache, sizeof cache, "%s/cache", dir);
    const char *old = getenv("KILN_DATA_DIR");
    char *saved = old ? strdup(old) : NULL;
    setenv("KILN_DATA_DIR", dir, 1);
    CHECK(disk_chain(3, 40) == 0, "vulkan disk cache: first run: %s", kiln_error());
    CHECK(disk_chain(3, 40) == 0, "vulkan disk cache: second run: %s", kiln_error());
    int n1 = spv_files(cache, first, sizeof first);
    CHECK(n1 >= 1, "the generated kernel was written under %s (%d files)", cache, n1);
    CHECK(disk_chain(70, 333) == 0, "vulkan disk cache: another shape: %s", kiln_error());
    int n2 = spv_files(cache, first, sizeof first);
    CHECK(n2 == n1, "another shape of the same program adds no kernel (%d files, then %d)", n1, n2);
    /* the file starts with the program's key; a corrupt one is ignored and rewritten */
    FILE *f = fopen(first, "rb");
    char head[8] = "";
    CHECK(f && fread(head, 1, 4, f) == 4 && !memcmp(head, "f32 ", 4), "%s starts with the key", first);
    if (f)
        fclose(f);
    f = fopen(first, "wb");
    if (f) {
        fputs("f32 i0:c not a kernel", f);
        fclose(f);
    }
    CHECK(disk_chain(3, 40) == 0, "a corrupt cache file is ignored: %s", kiln_error());
    CHECK(disk_chain(3, 40) == 0, "and replaced: %s", kiln_error());
    struct stat st;
    CHECK(stat(first, &st) == 0 && st.st_size > 100, "the corrupt file was rewritten (%lld bytes)",
          (long long)st.st_size);
    if (saved) {
        setenv("KILN_DATA_DIR", saved, 1);
        free(saved);
    } else {
        unsetenv("KILN_DATA_DIR");
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "removing %s", dir);
}

void test_gpu(void)
{
    run_on("cuda:0");
    run_on("vulkan:0");
    vulkan_disk_cache();
}
