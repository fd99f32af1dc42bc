/*
 * tests/cuda/test-cuda-fused.c — fused programs generated as CUDA C without a GPU: the
 * source written for each of several programs (backends/cuda/cuda-fused.c over the
 * shared emitter, backends/fused/fused-codegen.c) compiles with NVRTC to PTX for
 * compute_80 and compute_90 and has the kernel's entry; the source depends on the
 * program's key only (shapes and parameters apart); programs the generator does not
 * write are refused with KILN_ENOTSUP and bad names with a message; the PTX cache on
 * disk is written once per source and architecture, read back, and a corrupt file is
 * ignored and rewritten.
 *
 * Built with KILN_CUDA_HIP (by tests/cuda/hip-build-check.sh, against the HIP build of the
 * backend's host files), the same programs compile with hipRTC to code objects for gfx90a
 * and gfx1030 instead, which also needs no GPU; that build keeps no disk cache.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-fused.h"
#include "cuda-rtc.h"
#include "fused-codegen.h"
#include "kiln/kiln.h"

static int failures, checks;

#define CHECK(cond, ...)                                                                                          \
    do {                                                                                                          \
        checks++;                                                                                                 \
        if (!(cond)) {                                                                                            \
            failures++;                                                                                           \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                       \
            fprintf(stderr, __VA_ARGS__);                                                                         \
            fprintf(stderr, " (last error: %s)\n", kiln_error());                                                 \
        }                                                                                                         \
    } while (0)

static kiln_tdesc view(kiln_dtype dt, int ndim, const int64_t *shape, const int64_t *strides, int64_t offset)
{
    kiln_tdesc d = {.buf = NULL, .offset = offset, .dtype = dt, .ndim = ndim};
    for (int i = 0; i < ndim; i++) {
        d.shape[i] = shape[i];
        d.strides[i] = strides[i];
    }
    return d;
}

#define LOAD(r, k)                                                                                                \
    {                                                                                                             \
        .code = KILN_FUSED_LOAD, .dst = (r), .arg = (k)                                                           \
    }
#define UN(r, o, x, al, be)                                                                                       \
    {                                                                                                             \
        .code = KILN_FUSED_UNARY, .op = (o), .dst = (r), .a = (x), .alpha = (al), .beta = (be)                    \
    }
#define BIN(r, o, x, y)                                                                                           \
    {                                                                                                             \
        .code = KILN_FUSED_BINARY, .op = (o), .dst = (r), .a = (x), .b = (y)                                      \
    }
#define STORE(x, k)                                                                                               \
    {                                                                                                             \
        .code = KILN_FUSED_STORE, .a = (x), .arg = (k)                                                            \
    }

/* Generates p's kernel, compiles it for 8.0 and 9.0 and checks the PTX. */
static void compile_program(const char *what, const kiln_fused_program *p)
{
    int why = 0;
    char *src = kiln__cuda_fused_source(p, "kf_test", &why);
    CHECK(src != NULL, "%s: generated (why %d)", what, why);
    if (!src)
        return;
    CHECK(strstr(src, "__global__ void __launch_bounds__(256) kf_test(const kf_params P)") != NULL,
          "%s: the kernel's signature", what);
#if KILN_CUDA_HIP
    const char *gfx[] = {"gfx90a:sramecc+:xnack-", "gfx1030"};
    for (int a = 0; a < 2; a++) {
        char *code = NULL;
        size_t len = 0;
        int rc = kiln__cuda_rtc_compile_gfx(src, "kf_test", gfx[a], &code, &len);
        CHECK(rc == 0 && code, "%s: compiles for %s", what, gfx[a]);
        if (rc != 0 || getenv("KILN_TEST_SHOW_SOURCE"))
            fprintf(stderr, "---- source of %s ----\n%s\n", what, src);
        /* a code object is an ELF file (or an offload bundle holding one) naming the kernel */
        CHECK(!code || (len > 4 && (memcmp(code,
                                           "\x7f"
                                           "ELF",
                                           4) == 0 ||
                                    memcmp(code, "__CLANG_OFFLOAD_BUNDLE__", 24) == 0)),
              "%s: a code object for %s", what, gfx[a]);
        CHECK(!code || memmem(code, len, "kf_test", 7) != NULL, "%s: the code object has the kernel", what);
        free(code);
    }
#else
    int archs[][2] = {{8, 0}, {9, 0}};
    for (int a = 0; a < 2; a++) {
        char *ptx = NULL;
        int rc = kiln__cuda_rtc_compile(src, "kf_test", archs[a][0], archs[a][1], &ptx, NULL);
        CHECK(rc == 0 && ptx, "%s: compiles for %d.%d", what, archs[a][0], archs[a][1]);
        if (rc != 0 || getenv("KILN_TEST_SHOW_SOURCE"))
            fprintf(stderr, "---- source of %s ----\n%s\n", what, src);
        CHECK(!ptx || strstr(ptx, ".entry kf_test") != NULL, "%s: the PTX has the entry", what);
        free(ptx);
    }
#endif
    free(src);
}

/* (x * a + b) -> gelu -> tanh -> * scalar, a comparison stored as bool; a a row
 * broadcast, b a transposed gather, s a broadcast scalar. */
static void elementwise(void)
{
    int64_t sh[] = {37, 45};
    kiln_tdesc in[4] = {
        view(KILN_F32, 2, sh, (int64_t[]){45, 1}, 0),
        view(KILN_F32, 2, sh, (int64_t[]){0, 1}, 3),
        view(KILN_F32, 2, sh, (int64_t[]){1, 37}, 0),
        view(KILN_F32, 2, sh, (int64_t[]){0, 0}, 7),
    };
    kiln_tdesc out[2] = {view(KILN_F32, 1, (int64_t[]){37 * 45}, (int64_t[]){1}, 0),
                         view(KILN_BOOL, 1, (int64_t[]){37 * 45}, (int64_t[]){1}, 0)};
    kiln_fused_instr ins[] = {
        LOAD(0, 0),
        LOAD(1, 1),
        LOAD(2, 2),
        LOAD(3, 3),
        BIN(4, KILN_BINARY_MUL, 0, 1),
        BIN(5, KILN_BINARY_ADD, 4, 2),
        UN(6, KILN_UNARY_GELU, 5, 0, 0),
        UN(7, KILN_UNARY_TANH, 6, 0, 0),
        BIN(8, KILN_BINARY_MUL, 7, 3),
        UN(9, KILN_UNARY_CLAMP, 8, -0.25, 0.75),
        STORE(9, 0),
        BIN(10, KILN_BINARY_GT, 9, 0),
        STORE(10, 1),
    };
    kiln_fused_program p = {.dtype = KILN_F32,
                            .n = 37 * 45,
                            .ninputs = 4,
                            .noutputs = 2,
                            .ninstrs = (int)(sizeof ins / sizeof *ins),
                            .nregs = 11,
                            .inputs = in,
                            .outputs = out,
                            .instrs = ins};
    compile_program("elementwise chain", &p);

    /* the same program over other shapes, strides, offsets and parameters: the same text */
    int why = 0;
    char *a = kiln__cuda_fused_source(&p, "kf_same", &why);
    int64_t sh2[] = {3, 1000};
    kiln_tdesc in2[4] = {
        view(KILN_F32, 2, sh2, (int64_t[]){1000, 1}, 5),
        view(KILN_F32, 2, sh2, (int64_t[]){0, 1}, 0),
        view(KILN_F32, 2, sh2, (int64_t[]){2, 2000}, 1),
        view(KILN_F32, 1, (int64_t[]){3000}, (int64_t[]){0}, 0),
    };
    kiln_fused_instr ins2[sizeof ins / sizeof *ins];
    memcpy(ins2, ins, sizeof ins);
    ins2[9].alpha = -3;
    ins2[9].beta = 9;
    kiln_fused_program p2 = p;
    p2.n = 3000;
    p2.inputs = in2;
    p2.instrs = ins2;
    char *b = kiln__cuda_fused_source(&p2, "kf_same", &why);
    CHECK(a && b && !strcmp(a, b), "a program with another shape and parameters has the same source");
    char k1[4096], k2[4096];
    CHECK(!strcmp(kiln__fused_codegen_key(&p, k1, sizeof k1), kiln__fused_codegen_key(&p2, k2, sizeof k2)),
          "and the same key: '%s' / '%s'", k1, k2);
    /* a contiguous input where there was a gather: another key */
    in2[2] = view(KILN_F32, 2, sh2, (int64_t[]){1000, 1}, 0);
    CHECK(strcmp(k1, kiln__fused_codegen_key(&p2, k2, sizeof k2)) != 0, "a layout change changes the key");
    /* a bool output where there was an f32 one: another key too */
    kiln_tdesc out3[2] = {out[1], out[1]};
    kiln_fused_program p3 = p;
    p3.outputs = out3;
    CHECK(strcmp(k1, kiln__fused_codegen_key(&p3, k2, sizeof k2)) != 0, "an output dtype change changes the key");
    free(a);
    free(b);
}

/* where over a bool input, a constant, every unary and binary op the generator writes. */
static void every_op(void)
{
    int64_t n = 1000;
    kiln_tdesc in[2] = {view(KILN_F32, 1, &n, (int64_t[]){1}, 0), view(KILN_BOOL, 1, &n, (int64_t[]){1}, 0)};
    kiln_tdesc out[1] = {view(KILN_F32, 1, &n, (int64_t[]){1}, 0)};
    kiln_fused_instr ins[KILN_FUSED_MAX_INSTRS];
    int ni = 0, r = 0;
    ins[ni++] = (kiln_fused_instr)LOAD(r++, 0);
    ins[ni++] = (kiln_fused_instr)LOAD(r++, 1);
    ins[ni++] = (kiln_fused_instr){.code = KILN_FUSED_CONST, .dst = r++, .alpha = 0.5};
    ins[ni++] = (kiln_fused_instr){.code = KILN_FUSED_WHERE, .dst = r, .a = 1, .b = 0, .c = 2};
    r++;
    int last = r - 1;
    for (int op = 0; op < KILN_UNARY_COUNT && ni < KILN_FUSED_MAX_INSTRS - 10; op++) {
        if (!kiln__fused_unary_name(op))
            continue;
        ins[ni++] = (kiln_fused_instr)UN(r, op, last, 0.25, 3.0);
        last = r++;
    }
    kiln_fused_program p = {.dtype = KILN_F32,
                            .n = n,
                            .ninputs = 2,
                            .noutputs = 1,
                            .ninstrs = 0,
                            .nregs = 0,
                            .inputs = in,
                            .outputs = out,
                            .instrs = ins};
    ins[ni++] = (kiln_fused_instr)STORE(last, 0);
    p.ninstrs = ni;
    p.nregs = r;
    compile_program("every unary op, where, a constant", &p);

    ni = 0;
    r = 0;
    ins[ni++] = (kiln_fused_instr)LOAD(r++, 0);
    last = 0;
    for (int op = 0; op <= KILN_BINARY_GE; op++) {
        ins[ni++] = (kiln_fused_instr)BIN(r, op, last, 0);
        last = r++;
    }
    ins[ni++] = (kiln_fused_instr)STORE(last, 0);
    p.ninputs = 1;
    p.ninstrs = ni;
    p.nregs = r;
    compile_program("every binary op", &p);
}

/* softmax, then log-softmax of its scaled value; and a mean and a sum over rows. */
static void rows(void)
{
    int64_t sh[] = {300, 517};
    kiln_tdesc in[2] = {view(KILN_F32, 2, sh, (int64_t[]){517, 1}, 0),
                        view(KILN_F32, 2, sh, (int64_t[]){0, 1}, 0)};
    kiln_tdesc out[3] = {view(KILN_F32, 2, sh, (int64_t[]){517, 1}, 0),
                         view(KILN_F32, 2, sh, (int64_t[]){517, 1}, 0),
                         view(KILN_F32, 1, (int64_t[]){300}, (int64_t[]){1}, 0)};
    kiln_fused_instr ins[] = {
        LOAD(0, 0),
        LOAD(1, 1),
        BIN(2, KILN_BINARY_MUL, 0, 1),
        {.code = KILN_FUSED_SOFTMAX, .op = 0, .dst = 3, .a = 2},
        UN(4, KILN_UNARY_MUL_SCALAR, 3, 2.0, 0),
        STORE(4, 0),
        {.code = KILN_FUSED_SOFTMAX, .op = 1, .dst = 5, .a = 4},
        STORE(5, 1),
    };
    kiln_fused_program p = {.dtype = KILN_F32,
                            .n = 300 * 517,
                            .reduce_inner = 517,
                            .ninputs = 2,
                            .noutputs = 2,
                            .ninstrs = 8,
                            .nregs = 6,
                            .inputs = in,
                            .outputs = out,
                            .instrs = ins};
    compile_program("softmax and log-softmax", &p);

    kiln_fused_instr red[] = {
        LOAD(0, 0),
        LOAD(1, 1),
        BIN(2, KILN_BINARY_SUB, 0, 1),
        UN(3, KILN_UNARY_SQUARE, 2, 0, 0),
        STORE(3, 0),
        {.code = KILN_FUSED_REDUCE, .op = KILN_REDUCE_MEAN, .a = 3, .arg = 2},
    };
    p.instrs = red;
    p.ninstrs = 6;
    p.nregs = 4;
    p.noutputs = 3;
    compile_program("mean of squares over rows", &p);
    red[5].op = KILN_REDUCE_SUM;
    compile_program("sum over rows", &p);
}

static void refusals(void)
{
    int64_t n = 16;
    kiln_tdesc in[1] = {view(KILN_F32, 1, &n, (int64_t[]){1}, 0)};
    kiln_tdesc out[1] = {view(KILN_F32, 1, &n, (int64_t[]){1}, 0)};
    kiln_fused_instr ins[] = {LOAD(0, 0), UN(1, KILN_UNARY_ISNAN, 0, 0, 0), STORE(1, 0)};
    kiln_fused_program p = {.dtype = KILN_F32,
                            .n = n,
                            .ninputs = 1,
                            .noutputs = 1,
                            .ninstrs = 3,
                            .nregs = 2,
                            .inputs = in,
                            .outputs = out,
                            .instrs = ins};
    int why = 0;
    char *src = kiln__cuda_fused_source(&p, "kf", &why);
    CHECK(!src && why == KILN_ENOTSUP, "isnan (a bool result) is left to the unfused ops");
    ins[1] = (kiln_fused_instr)BIN(1, KILN_BINARY_LOGICAL_AND, 0, 0);
    src = kiln__cuda_fused_source(&p, "kf", &why);
    CHECK(!src && why == KILN_ENOTSUP, "a logical op is left to the unfused ops");
    ins[1] = (kiln_fused_instr)UN(1, KILN_UNARY_EXP, 0, 0, 0);
    p.dtype = KILN_F64;
    src = kiln__cuda_fused_source(&p, "kf", &why);
    CHECK(!src && why == KILN_ENOTSUP, "f64 registers are not generated");
    p.dtype = KILN_F32;
    ins[1] = (kiln_fused_instr)UN(1, KILN_UNARY_EXP, 5, 0, 0);
    src = kiln__cuda_fused_source(&p, "kf", &why);
    CHECK(!src && why == KILN_ENOTSUP, "a read of an undefined register is refused");
    ins[1] = (kiln_fused_instr){.code = KILN_FUSED_SOFTMAX, .dst = 1, .a = 0};
    src = kiln__cuda_fused_source(&p, "kf", &why);
    CHECK(!src && why == KILN_ENOTSUP, "a softmax without rows is refused");
    /* a sum of 8 rows of 100,000 elements: left to the unfused reduction */
    kiln_fused_instr sum[] = {LOAD(0, 0), {.code = KILN_FUSED_REDUCE, .op = KILN_REDUCE_SUM, .a = 0, .arg = 0}};
    kiln_fused_program few = {.dtype = KILN_F32,
                              .n = 800000,
                              .reduce_inner = 100000,
                              .ninputs = 1,
                              .noutputs = 1,
                              .ninstrs = 2,
                              .nregs = 1,
                              .inputs = in,
                              .outputs = out,
                              .instrs = sum};
    src = kiln__cuda_fused_source(&few, "kf", &why);
    CHECK(!src && why == KILN_ENOTSUP, "a few long rows are left to the unfused ops");
    few.n = 300 * 4096;
    few.reduce_inner = 4096;
    src = kiln__cuda_fused_source(&few, "kf", &why);
    CHECK(src != NULL, "rows of 4096 are generated");
    free(src);
    ins[1] = (kiln_fused_instr)UN(1, KILN_UNARY_EXP, 0, 0, 0);
    src = kiln__cuda_fused_source(&p, "1kf", &why);
    CHECK(!src && why == KILN_EINVAL && strstr(kiln_error(), "not a C identifier"), "a bad name is refused");
    src = kiln__cuda_fused_source(&p, "kf", &why);
    CHECK(src != NULL && why == 0, "the corrected program generates");
    free(src);
    /* the entry itself refuses without touching a device */
    ins[1] = (kiln_fused_instr)UN(1, KILN_UNARY_ISINF, 0, 0, 0);
    CHECK(kiln__cuda_fused_run(NULL, &p) == KILN_ENOTSUP, "fused_run answers KILN_ENOTSUP first");
}

#if !KILN_CUDA_HIP /* the CUDA build keeps PTX on disk; the HIP build compiles each process */
/* cuda-fused-*.ptx files in dir; the first's path into first. */
static int ptx_files(const char *dir, char *first, size_t len)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d)
        return 0;
    for (struct dirent *e; (e = readdir(d));)
        if (!strncmp(e->d_name, "cuda-fused-", 11) && strstr(e->d_name, ".ptx") && n++ == 0)
            snprintf(first, len, "%.200s/%.200s", dir, e->d_name);
    closedir(d);
    return n;
}

static void disk_cache(void)
{
    char dir[] = "/tmp/kiln-fused-ptxXXXXXX", cache[64], first[512] = "";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(cache, sizeof cache, "%s/cache", dir);
    const char *old = getenv("KILN_DATA_DIR");
    char *saved = old ? strdup(old) : NULL;
    setenv("KILN_DATA_DIR", dir, 1);
    int64_t n = 4096;
    kiln_tdesc in[1] = {view(KILN_F32, 1, &n, (int64_t[]){1}, 0)};
    kiln_tdesc out[1] = {view(KILN_F32, 1, &n, (int64_t[]){1}, 0)};
    kiln_fused_instr ins[] = {LOAD(0, 0), UN(1, KILN_UNARY_TANH, 0, 0, 0), BIN(2, KILN_BINARY_MUL, 1, 0),
                              STORE(2, 0)};
    kiln_fused_program p = {.dtype = KILN_F32,
                            .n = n,
                            .ninputs = 1,
                            .noutputs = 1,
                            .ninstrs = 4,
                            .nregs = 3,
                            .inputs = in,
                            .outputs = out,
                            .instrs = ins};
    char key[4096];
    kiln__fused_codegen_key(&p, key, sizeof key);
    bool disk = true;
    int rc = 0;
    char *a = kiln__cuda_fused_ptx(&p, key, "kf_disk", 9, 0, &disk, &rc);
    CHECK(a && !disk && strstr(a, ".entry kf_disk"), "first: compiled (rc %d)", rc);
    CHECK(ptx_files(cache, first, sizeof first) == 1, "one PTX file under %s", cache);
    char *b = kiln__cuda_fused_ptx(&p, key, "kf_disk", 9, 0, &disk, &rc);
    CHECK(b && disk && a && !strcmp(a, b), "second: read back from disk, the same PTX");
    /* another architecture is another file */
    char *c = kiln__cuda_fused_ptx(&p, key, "kf_disk", 8, 0, &disk, &rc);
    CHECK(c && !disk && ptx_files(cache, first, sizeof first) == 2, "compute_80 gets a file of its own");
    free(b);
    free(c);
    /* every file corrupted: ignored, compiled again and rewritten */
    DIR *d = opendir(cache);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strncmp(e->d_name, "cuda-fused-", 11))
            continue;
        char path[512];
        snprintf(path, sizeof path, "%.200s/%.200s", cache, e->d_name);
        FILE *f = fopen(path, "wb");
        if (f) {
            fprintf(f, "%s\n.version 1.0 cut short", key);
            fclose(f);
        }
    }
    if (d)
        closedir(d);
    b = kiln__cuda_fused_ptx(&p, key, "kf_disk", 9, 0, &disk, &rc);
    CHECK(b && !disk && a && !strcmp(a, b), "a corrupt file is ignored and the kernel compiled again");
    free(b);
    b = kiln__cuda_fused_ptx(&p, key, "kf_disk", 9, 0, &disk, &rc);
    CHECK(b && disk, "and the file was rewritten");
    free(b);
    /* a file with another key at its head (a hash collision) is a miss */
    b = kiln__cuda_fused_ptx(&p, "f32 another key", "kf_disk", 9, 0, &disk, &rc);
    CHECK(b && !disk, "a file whose key differs is not used");
    free(b);
    free(a);
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

#endif
int main(void)
{
    elementwise();
    every_op();
    rows();
    refusals();
#if !KILN_CUDA_HIP
    disk_cache();
#endif
    printf("cuda-fused: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
