/*
 * tests/fusion/test-jit.c — the cpu's compiled fused loops (backends/cpu/cpu-fused-jit.c).
 *
 *   test-jit DIR            the checks below, with DIR as the data directory
 *   test-jit DIR --again    the same programs in a fresh process over DIR's cache
 *
 * On every vector kernel table this CPU runs (auto: avx512 where it has it; avx2), large programs of every op
 * the loops cover (row-broadcast, contiguous and scalar inputs, two outputs, a length
 * that leaves a tail, a matrix product's and a convolution's epilogue; rows taken whole:
 * softmax, layer norm, a row's sum read back or stored, a value per row, a product's
 * epilogue with a norm) give the unfused device's results element for element, and the
 * row programs' loops were compiled, not interpreted. The loops
 * land in DIR/cache/cpu-jit as shared objects; a second process loads them without
 * compiling (their files keep their times), and after every one is overwritten with junk
 * a third process still gets the right results and makes them again; with
 * KILN_CPU_JIT_KEEP=2 a process keeps only the two loops it used last and removes an old
 * build's headers and an old temporary file. With
 * KILN_CPU_JIT_CC naming no compiler, or the option jit=off, the results are the same (the
 * block interpreter) and nothing is compiled; a bad jit value is refused. Without a C
 * compiler on the machine the cache checks are skipped, saying so.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fusion-test.h"
#include "kiln/kiln.h"

int fusion_passed, fusion_failed;

#define ROWS 1031
#define COLS 1024 /* ROWS x COLS: over 2^20 elements, and not a multiple of 16 once sliced */

/* One program: out0 (and out1 when two) of inputs x [n], a b c [COLS] (one row each). */
typedef struct program {
    const char *name;
    int noutputs;
    void (*build)(kiln_tensor *x, kiln_tensor *a, kiln_tensor *b, kiln_tensor *c, kiln_tensor **out);
} program;

static void chain(kiln_tensor *x, kiln_tensor *a, kiln_tensor *b, kiln_tensor *c, kiln_tensor **out)
{
    out[0] = kiln_mul(kiln_gelu(kiln_add(kiln_mul(x, a), b), false), c);
}

static void every_unary(kiln_tensor *x, kiln_tensor *a, kiln_tensor *b, kiln_tensor *c, kiln_tensor **out)
{
    (void)b;
    (void)c;
    kiln_tensor *t = kiln_tanh(kiln_exp(kiln_mul_scalar(kiln_abs(kiln_neg(x)), -0.25)));
    t = kiln_add(t, kiln_sigmoid(kiln_relu(kiln_add_scalar(x, -0.5))));
    t = kiln_add(t, kiln_erf(kiln_square(kiln_mul_scalar(x, 0.5))));
    t = kiln_add(t, kiln_silu(kiln_gelu(x, true)));
    out[0] = kiln_mul(t, a);
}

static void two_outputs(kiln_tensor *x, kiln_tensor *a, kiln_tensor *b, kiln_tensor *c, kiln_tensor **out)
{
    kiln_tensor *s = kiln_sub(kiln_div(x, kiln_add_scalar(kiln_abs(b), 0.5)), c);
    out[0] = s;
    out[1] = kiln_mul(kiln_gelu(s, false), kiln_add_scalar(a, 2.0));
}

/* The exact ops: square roots of negative lanes give NaN, which maximum, minimum, sign and
 * clamp must carry as the unfused kernels do; rounding in three directions; pow by the
 * exponents the kernels special-case, and by 3 (powf: that program stays interpreted). */
static void exact_ops(kiln_tensor *x, kiln_tensor *a, kiln_tensor *b, kiln_tensor *c, kiln_tensor **out)
{
    (void)c;
    kiln_tensor *s = kiln_sqrt(x); /* NaN where x < 0 */
    kiln_tensor *t = kiln_add(kiln_maximum(s, a),
                              kiln_minimum(kiln_clamp(x, -1.5, 2.5), kiln_floor(kiln_mul_scalar(x, 1.7))));
    t = kiln_add(t, kiln_add(kiln_ceil(x), kiln_round(kiln_mul_scalar(x, 2.5))));
    t = kiln_add(t, kiln_add(kiln_leaky_relu(x, 0.1), kiln_sign(kiln_minimum(s, b))));
    t = kiln_add(t, kiln_add(kiln_pow_scalar(x, 2.0), kiln_pow_scalar(kiln_abs(x), 0.5)));
    t = kiln_add(t, kiln_add(kiln_pow_scalar(kiln_add_scalar(kiln_abs(x), 0.5), -0.5), kiln_pow_scalar(x, 1.0)));
    t = kiln_add(t, kiln_add(kiln_reciprocal(x), kiln_rsqrt(kiln_add_scalar(kiln_abs(x), 0.25))));
    out[0] = kiln_add(t, kiln_clamp(x, -6.0, 0.0));
    out[1] = kiln_mul(kiln_pow_scalar(x, 3.0), a);
}

/* A product's epilogue (bias per column, gelu, scale), the product itself kept too: the
 * loop reads the product from its own slot. W = a bᵀ / 64, an outer product made first. */
static void product_epilogue(kiln_tensor *x, kiln_tensor *a, kiln_tensor *b, kiln_tensor *c, kiln_tensor **out)
{
    kiln_tensor *w = kiln_mul_scalar(kiln_mul(kiln_reshape(a, 2, (int64_t[]){COLS, 1}), b), 1.0 / 64);
    kiln_tensor *prod = kiln_matmul(x, w);
    out[0] = kiln_mul(kiln_gelu(kiln_add(prod, a), false), c);
    out[1] = prod;
}

/* A convolution's epilogue (its bias inside the producer, then gelu and a scale): the
 * loop reads each chunk of images from the product's slot. x as 1031 images of 32 x 32,
 * four 3 x 3 filters and their bias from a: 1031 x 4 x 30 x 30 outputs. */
static void conv_epilogue(kiln_tensor *x, kiln_tensor *a, kiln_tensor *b, kiln_tensor *c, kiln_tensor **out)
{
    (void)b;
    (void)c;
    kiln_tensor *img = kiln_reshape(x, 4, (int64_t[]){ROWS, 1, 32, 32});
    kiln_tensor *w = kiln_mul_scalar(kiln_reshape(kiln_slice(a, 0, 0, 36, 1), 4, (int64_t[]){4, 1, 3, 3}), 0.25);
    kiln_tensor *bias = kiln_slice(a, 0, 36, 40, 1);
    out[0] = kiln_mul_scalar(kiln_gelu(kiln_conv2d(img, w, bias, NULL), false), 1.5);
}

/* The six comparisons as where's conditions: NaN lanes among them (sqrt of the negative
 * x), ties (values rounded to whole numbers, where < and <= part), and zeros of both signs
 * (x · 0 against a · 0: all equal). Two programs, each short enough to be one group: a
 * longer one was cut where its comparisons were still alive, and a stored bool keeps a
 * group interpreted. */
static void compare_where(kiln_tensor *x, kiln_tensor *a, kiln_tensor *b, kiln_tensor *c, kiln_tensor **out)
{
    kiln_tensor *s = kiln_round(kiln_sqrt(x)), *ra = kiln_round(a);
    kiln_tensor *t = kiln_add(kiln_where(kiln_eq(s, ra), x, a), kiln_where(kiln_ne(s, ra), b, c));
    out[0] = kiln_add(t, kiln_where(kiln_lt(s, ra), x, b));
}

static void compare_where2(kiln_tensor *x, kiln_tensor *a, kiln_tensor *b, kiln_tensor *c, kiln_tensor **out)
{
    kiln_tensor *s = kiln_round(kiln_sqrt(x)), *rb = kiln_round(b);
    kiln_tensor *t = kiln_add(kiln_where(kiln_le(s, rb), c, a), kiln_where(kiln_gt(s, rb), a, x));
    out[0] = kiln_add(t, kiln_where(kiln_ge(s, rb), x, c));
    out[1] = kiln_where(kiln_ge(kiln_mul_scalar(x, 0.0), kiln_mul_scalar(a, 0.0)), x, b);
}

/* A max pooling's gradient (2 x 2 windows over 1031 images of 32 x 32) with a relu's
 * backward as its epilogue: x's gradient for sum(max_pool(relu(x)) · w). */
static void pool_gradient(kiln_tensor *x, kiln_tensor *a, kiln_tensor *b, kiln_tensor *c, kiln_tensor **out)
{
    (void)b;
    (void)c;
    kiln_tensor *img = kiln_requires_grad(kiln_contiguous(kiln_reshape(x, 4, (int64_t[]){ROWS, 1, 32, 32})), true);
    kiln_pool_opts o = {.kernel = {2, 2}, .stride = {2, 2}};
    kiln_tensor *p = kiln_max_pool2d(kiln_relu(img), &o, NULL);
    kiln_tensor *w = kiln_reshape(kiln_slice(a, 0, 0, 256, 1), 4, (int64_t[]){1, 1, 16, 16});
    kiln_tensor *loss = kiln_sum(kiln_mul(p, w), 0, NULL, false);
    out[0] = loss && kiln_backward(loss, NULL) == 0 ? kiln_grad(img) : NULL;
}

/* Rows taken whole (cpu-fused-jit-rows.c): a softmax of x·a (a broadcast over the rows)
 * and its backward's form y (g - sum(g y)), a row's sum read back. */
static void softmax_rows(kiln_tensor *x, kiln_tensor *a, kiln_tensor *b, kiln_tensor *c, kiln_tensor **out)
{
    kiln_tensor *y = kiln_softmax(kiln_mul(x, a), -1);
    kiln_tensor *g = kiln_mul(kiln_mul(y, c), b);
    out[0] = kiln_mul(y, kiln_sub(g, kiln_sum(kiln_mul(g, y), KILN_DIMS(1), true)));
    out[1] = kiln_log_softmax(kiln_add_scalar(x, 0.5), -1);
}

/* A layer norm (weight a, bias c: rows read in place) of x / 2 + b, then a value per row
 * made apart (x's row means, broadcast along each row) and a per-row sum stored (1031
 * values). */
static void norm_rows(kiln_tensor *x, kiln_tensor *a, kiln_tensor *b, kiln_tensor *c, kiln_tensor **out)
{
    kiln_tensor *m = kiln_mean(x, KILN_DIMS(1), true);
    kiln_tensor *n = kiln_layer_norm(kiln_add(kiln_mul_scalar(x, 0.5), b), 1, a, c, 1e-5);
    kiln_tensor *d = kiln_mul(kiln_sub(n, m), kiln_gelu(n, false));
    out[0] = d;
    out[1] = kiln_mean(kiln_mul(d, x), KILN_DIMS(1), false);
}

/* A product's epilogue with a layer norm: linear, residual, norm, as a Transformer block's
 * sublayer ends. */
static void product_norm(kiln_tensor *x, kiln_tensor *a, kiln_tensor *b, kiln_tensor *c, kiln_tensor **out)
{
    kiln_tensor *w = kiln_mul_scalar(kiln_mul(kiln_reshape(a, 2, (int64_t[]){COLS, 1}), b), 1.0 / 64);
    kiln_tensor *prod = kiln_matmul(x, w);
    out[0] = kiln_layer_norm(kiln_add(kiln_add(prod, b), x), 1, a, c, 1e-5);
}

/* Rows of a program far larger than the caches (x three times over: 3.2M elements),
 * whose loop streams: inputs prefetched, outputs written with non-temporal stores, the
 * norm into a row buffer first. */
static void streamed_rows(kiln_tensor *x, kiln_tensor *a, kiln_tensor *b, kiln_tensor *c, kiln_tensor **out)
{
    kiln_tensor *xs[3] = {x, kiln_mul_scalar(x, -0.5), kiln_add_scalar(x, 1.0)};
    kiln_tensor *big = kiln_cat(xs, 3, 0);
    kiln_tensor *n = kiln_layer_norm(kiln_add(kiln_mul_scalar(big, 0.5), b), 1, a, c, 1e-5);
    out[0] = n;
    out[1] = kiln_mul(kiln_softmax(big, -1), kiln_gelu(n, false));
}

static const program programs[] = {
    {"comparisons and where, NaN lanes", 1, compare_where},
    {"more comparisons and where, signed zeros", 2, compare_where2},
    {"a max pooling's gradient with a relu's backward", 1, pool_gradient},
    {"softmax rows, a row's sum read back", 2, softmax_rows},
    {"layer norm rows, a value per row, a per-row mean stored", 2, norm_rows},
    {"a product's epilogue with a layer norm", 1, product_norm},
    {"streamed rows: a norm and a softmax over 3.2M elements", 2, streamed_rows},
    {"gelu(x*a+b)*c", 1, chain},
    {"every covered unary", 1, every_unary},
    {"two outputs, sub and div", 2, two_outputs},
    {"exact ops with NaN lanes", 2, exact_ops},
    {"a product's epilogue", 2, product_epilogue},
    {"a convolution's epilogue", 1, conv_epilogue},
};
#define NPROGRAMS (int)(sizeof programs / sizeof *programs)

/* Program p on dev over inputs made from seed; its outputs into out (n floats each at
 * most, lens[k] of output k). */
static int run(kiln_device *dev, const program *p, float *out[2], int64_t n, int64_t lens[2])
{
    kiln_scope_begin();
    kiln_generator g = kiln_generator_make(5);
    int64_t shape[2] = {ROWS, COLS}, row = COLS;
    kiln_tensor *x = kiln_rand_uniform(dev, KILN_F32, 2, shape, -6, 6, &g);
    kiln_tensor *a = kiln_rand_uniform(dev, KILN_F32, 1, &row, -2, 2, &g);
    kiln_tensor *b = kiln_rand_uniform(dev, KILN_F32, 1, &row, -2, 2, &g);
    kiln_tensor *c = kiln_rand_uniform(dev, KILN_F32, 1, &row, -2, 2, &g);
    kiln_device_sync(dev);
    kiln_tensor *o[2] = {NULL, NULL};
    kiln_scope_begin();
    p->build(x, a, b, c, o);
    for (int k = 0; k < p->noutputs; k++)
        o[k] = kiln_keep(o[k]);
    kiln_scope_end();
    int rc = 0;
    for (int k = 0; k < p->noutputs; k++) {
        /* a view of n elements from the second one (fewer for a per-row output): a length
         * and start no vector fits */
        kiln_tensor *flat = kiln_reshape(o[k], 1, (int64_t[]){-1});
        int64_t m = flat && kiln_tensor_numel(flat) - 1 < n ? kiln_tensor_numel(flat) - 1 : n;
        lens[k] = m;
        rc = rc || !flat || kiln_to_data(kiln_slice(flat, 0, 1, m + 1, 1), out[k], (size_t)m * sizeof(float)) < 0;
        kiln_tensor_release(o[k]);
    }
    kiln_scope_end();
    return rc ? -1 : 0;
}

/* Every program on every table, fused against unfused, bit for bit. */
static void compare_all(void)
{
    const char *tables[2] = {"auto", "avx2"}; /* auto: avx512 where the CPU has it */
    int64_t n = (int64_t)ROWS * COLS - 3;
    float *want[2], *got[2];
    for (int k = 0; k < 2; k++) {
        want[k] = malloc((size_t)n * sizeof(float));
        got[k] = malloc((size_t)n * sizeof(float));
    }
    for (int t = 0; t < 2; t++) {
        char fspec[64], pspec[64];
        snprintf(fspec, sizeof fspec, "cpu?fusion=on&kernels=%s", tables[t]);
        snprintf(pspec, sizeof pspec, "cpu?kernels=%s", tables[t]);
        kiln_device *fd = kiln_device_open(fspec), *pd = kiln_device_open(pspec);
        if (!fd || !pd) { /* this CPU lacks the table */
            printf("test-jit: %s does not open here (%s): skipped\n", tables[t], kiln_error());
            kiln_device_close(fd);
            kiln_device_close(pd);
            continue;
        }
        for (int i = 0; i < NPROGRAMS; i++) {
            const program *p = &programs[i];
            int64_t glen[2], wlen[2];
            int rc = run(fd, p, got, n, glen) | run(pd, p, want, n, wlen);
            CHECK(rc == 0, "%s on %s: %s", p->name, tables[t], kiln_error());
            for (int k = 0; k < p->noutputs && rc == 0; k++) {
                int64_t bad = glen[k] == wlen[k] ? -1 : 0;
                for (int64_t j = 0; j < wlen[k] && bad < 0; j++)
                    if (memcmp(&got[k][j], &want[k][j], sizeof(float)) != 0)
                        bad = j;
                CHECK(bad < 0, "%s on %s, output %d: element %lld is %.9g fused, %.9g unfused", p->name, tables[t],
                      k, (long long)bad, bad < 0 ? 0.0 : (double)got[k][bad],
                      bad < 0 ? 0.0 : (double)want[k][bad]);
            }
        }
        kiln_device_close(fd);
        kiln_device_close(pd);
    }
    for (int k = 0; k < 2; k++) {
        free(want[k]);
        free(got[k]);
    }
}

/* Whether file starts as an ELF object does. */
static bool is_elf(const char *file)
{
    char magic[4] = {0};
    FILE *f = fopen(file, "rb");
    size_t got = f ? fread(magic, 1, 4, f) : 0;
    if (f)
        fclose(f);
    return got == 4 && !memcmp(magic,
                               "\x7f"
                               "ELF",
                               4);
}

/* Calls fn(file, arg) for every shared object in dir/cache/cpu-jit. */
static void each_library(const char *dir, void (*fn)(const char *file, void *arg), void *arg)
{
    char path[512];
    snprintf(path, sizeof path, "%s/cache/cpu-jit", dir);
    DIR *d = opendir(path);
    for (struct dirent *e = d ? readdir(d) : NULL; e; e = readdir(d)) {
        size_t len = strlen(e->d_name);
        if (len < 4 || strcmp(e->d_name + len - 3, ".so") != 0)
            continue;
        char file[800];
        snprintf(file, sizeof file, "%s/%s", path, e->d_name);
        fn(file, arg);
    }
    if (d)
        closedir(d);
}

typedef struct elf_count {
    int n;
    double newest; /* the latest change time among them */
} elf_count;

static void count_elf(const char *file, void *arg)
{
    elf_count *c = arg;
    struct stat st;
    if (!is_elf(file) || stat(file, &st) != 0)
        return;
    double t = (double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec * 1e-9;
    c->newest = t > c->newest ? t : c->newest;
    c->n++;
}

/* The compiled libraries in dir/cache/cpu-jit that are ELF objects: how many, and the
 * newest change time. */
static int libraries(const char *dir, double *newest)
{
    elf_count c = {0, 0};
    each_library(dir, count_elf, &c);
    *newest = c.newest;
    return c.n;
}

/* Overwrite one library with junk: a new file renamed over the old one, since this
 * process still maps the old one and truncating a mapped library in place would fault
 * its later reads. */
static void spoil_one(const char *file, void *arg)
{
    (void)arg;
    char tmp[820];
    snprintf(tmp, sizeof tmp, "%s.junk", file);
    FILE *f = fopen(tmp, "w");
    if (f) {
        fputs("not a shared object\n", f);
        fclose(f);
        rename(tmp, file);
    }
}

/* This program again, in a fresh process, with extra environment settings; its status. */
static int again(const char *self, const char *dir, const char *env)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (env)
            putenv((char *)env);
        execl(self, self, dir, "--again", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* What the row loops' sources in dir/cache/cpu-jit hold: every row operation, and every
 * way of reading a row (the product's, a row broadcast, a value per row), each in some
 * compiled loop, so the programs above did not all fall back to the interpreter. */
typedef struct row_forms {
    bool softmax, layer_norm, row_sum, reduce, product, row_broadcast, per_row;
} row_forms;

static void scan_source(const char *lib, void *arg)
{
    row_forms *f = arg;
    char src[800];
    snprintf(src, sizeof src, "%.*s.c", (int)(strlen(lib) - 3), lib);
    FILE *fp = fopen(src, "rb");
    if (!fp)
        return;
    static char text[1 << 16];
    size_t len = fread(text, 1, sizeof text - 1, fp);
    fclose(fp);
    text[len] = 0;
    if (!strstr(text, "kj_softmax_fn"))
        return; /* a flat loop */
    f->softmax |= strstr(text, "softmax_row(") != NULL;
    f->layer_norm |= strstr(text, "layer_norm_row(") != NULL;
    f->row_sum |= strstr(text, "KJ_SET(q") != NULL;
    f->reduce |= strstr(text, "[r] = (float)((0.0 + s") != NULL;
    f->product |= strstr(text, "KJ_LD(prod + e + j)") != NULL;
    f->per_row |= strstr(text, "r * ") != NULL && strstr(text, "KJ_SET(in") != NULL;
    for (const char *q = strstr(text, "KJ_LD(in"); q && !f->row_broadcast; q = strstr(q + 1, "KJ_LD(in")) {
        q += 8;
        while (*q >= '0' && *q <= '9')
            q++;
        f->row_broadcast = strncmp(q, " + j)", 5) == 0;
    }
}

/* Writes text into path with a change time two days back. */
static void plant_old(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    struct timeval old[2];
    gettimeofday(&old[0], NULL);
    old[0].tv_sec -= 2 * 24 * 3600;
    old[1] = old[0];
    utimes(path, old);
}

/* KILN_CPU_JIT_KEEP=2: a process that compiles every program keeps the two loops it used
 * last; a header folder of another build and a temporary file, both two days old, go. */
static void bounded_cache(const char *self, const char *dir)
{
    char small[512], jit[600], inc[700], header[800], tmp[700];
    snprintf(small, sizeof small, "%s/keep", dir);
    snprintf(jit, sizeof jit, "%s/cache/cpu-jit", small);
    snprintf(inc, sizeof inc, "%s/include-0000000000000000", jit);
    snprintf(header, sizeof header, "%s/cpu-math.h", inc);
    snprintf(tmp, sizeof tmp, "%s/kj-0000000000000000.so.1.tmp", jit);
    mkdir(small, 0700);
    snprintf(header, sizeof header, "%s/cache", small);
    mkdir(header, 0700);
    mkdir(jit, 0700);
    mkdir(inc, 0700);
    snprintf(header, sizeof header, "%s/cpu-math.h", inc);
    plant_old(header, "/* an older build's header */\n");
    plant_old(tmp, "half a library\n");
    struct timeval old[2];
    gettimeofday(&old[0], NULL);
    old[0].tv_sec -= 2 * 24 * 3600;
    old[1] = old[0];
    utimes(inc, old);
    CHECK(again(self, small, "KILN_CPU_JIT_KEEP=2") == 0, "with KILN_CPU_JIT_KEEP=2 the results are the same");
    double newest;
    int kept = libraries(small, &newest);
    CHECK(kept == 2, "the cache kept the 2 most recently used loops (%d there)", kept);
    struct stat st;
    CHECK(stat(inc, &st) != 0, "the old header folder was removed");
    CHECK(stat(tmp, &st) != 0, "the old temporary file was removed");
    /* a value that is no positive number: said on stderr, and the default bound applies */
    char junk[600];
    snprintf(junk, sizeof junk, "%s/keep-junk", dir);
    CHECK(again(self, junk, "KILN_CPU_JIT_KEEP=lots") == 0,
          "with KILN_CPU_JIT_KEEP=lots the results are the same");
    kept = libraries(junk, &newest);
    CHECK(kept >= NPROGRAMS, "KILN_CPU_JIT_KEEP=lots keeps the default bound (%d loops there)", kept);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test-jit DIR [--again]\n");
        return 2;
    }
    const char *dir = argv[1];
    if (argc == 2) {
        /* a fresh cache: libraries left by an earlier run (of other programs, before a
         * change to the fusion layer) would upset the counts below */
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (strchr(dir, '\'') == NULL && system(cmd) != 0)
            fprintf(stderr, "test-jit: could not empty %s\n", dir);
    }
    mkdir(dir, 0700);
    setenv("KILN_DATA_DIR", dir, 1);
    if (argc > 2) { /* a fresh process over the cache */
        compare_all();
        return fusion_failed ? 1 : 0;
    }
    bool compiler = system("${KILN_CPU_JIT_CC:-cc} --version >/dev/null 2>&1") == 0;
    compare_all();
    double t0, t1, t2;
    int made = libraries(dir, &t0);
    if (!compiler) {
        printf("test-jit: no C compiler here: the results came from the block interpreter; cache checks "
               "skipped\n");
    } else {
        CHECK(made >= NPROGRAMS, "%d compiled loops in %s/cache/cpu-jit, expected at least %d", made, dir,
              NPROGRAMS);
        row_forms f = {0};
        each_library(dir, scan_source, &f);
        CHECK(f.softmax && f.layer_norm && f.row_sum && f.reduce && f.product && f.row_broadcast && f.per_row,
              "row loops compiled with a softmax %d, a layer norm %d, a row's sum read back %d, a per-row sum "
              "stored %d, the product %d, a row broadcast %d, a value per row %d",
              f.softmax, f.layer_norm, f.row_sum, f.reduce, f.product, f.row_broadcast, f.per_row);
        sleep(1); /* so that a library made again would show a later time */
        CHECK(again(argv[0], dir, NULL) == 0, "a second process over the cache got the same results");
        int kept = libraries(dir, &t1);
        CHECK(kept == made && t1 == t0, "the second process loaded the loops without compiling (%d -> %d, %s)",
              made, kept, t1 == t0 ? "same times" : "newer files");
        each_library(dir, spoil_one, NULL);
        CHECK(libraries(dir, &t2) == 0, "every library spoiled");
        CHECK(again(argv[0], dir, NULL) == 0, "a process over spoiled libraries got the same results");
        CHECK(libraries(dir, &t2) == made && t2 > t1, "the spoiled libraries were made again");
        bounded_cache(argv[0], dir);
    }
    /* no compiler: the same results, nothing compiled */
    char empty[512];
    snprintf(empty, sizeof empty, "%s/no-compiler", dir);
    CHECK(again(argv[0], empty, "KILN_CPU_JIT_CC=/nonexistent/cc") == 0,
          "without a compiler the block interpreter gives the same results");
    double tn;
    CHECK(libraries(empty, &tn) == 0, "without a compiler nothing was compiled");
    /* the option off (here from the environment): the same results, nothing compiled */
    char off[512];
    snprintf(off, sizeof off, "%s/jit-off", dir);
    CHECK(again(argv[0], off, "KILN_CPU_JIT=off") == 0,
          "with jit=off the block interpreter gives the same results");
    CHECK(libraries(off, &tn) == 0, "with jit=off nothing was compiled");
    kiln_device *bad = kiln_device_open("cpu?jit=maybe");
    CHECK(!bad && strstr(kiln_error(), "jit") && strstr(kiln_error(), "maybe"),
          "a bad jit value is refused naming the option and the value: '%s'", kiln_error());
    kiln_device_close(bad);
    printf("test-jit: %d passed, %d failed\n", fusion_passed, fusion_failed);
    return fusion_failed ? 1 : 0;
}
