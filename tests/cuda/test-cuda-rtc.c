/*
 * tests/cuda/test-cuda-rtc.c — run-time kernel generation without a GPU: the source
 * generated for a fused elementwise chain (backends/cuda/cuda-rtc.c) compiles with NVRTC
 * to PTX for compute_80 and compute_90, carries the kernel's entry and each op's
 * formula, and the generator and compiler refuse what they should with a message. Also the
 * run-time loader of the CUDA libraries (cuda-libs.c), NVRTC being one of them: a missing
 * library and a library without a function are refused naming them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-libs.h"
#include "cuda-rtc.h"
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

static void test_chain(void)
{
    kiln_unary_op ops[] = {KILN_UNARY_EXP, KILN_UNARY_RELU, KILN_UNARY_GELU, KILN_UNARY_CLAMP,
                           KILN_UNARY_MUL_SCALAR};
    double alpha[] = {0, 0, 0, -0.25, 3.5}, beta[] = {0, 0, 0, 0.75, 0};
    char *src = kiln__cuda_codegen_unary_chain("kiln_fused_chain", ops, alpha, beta, 5);
    CHECK(src != NULL, "generating a five-op chain");
    if (!src)
        return;
    CHECK(strstr(src, "extern \"C\" __global__ void kiln_fused_chain(float *out, const float *in, long long n)"),
          "the kernel's signature:\n%s", src);
    CHECK(strstr(src, "expf(x)") && strstr(src, "erff(") && strstr(src, "-0.25") && strstr(src, "0.75") &&
              strstr(src, "3.5"),
          "each op and its parameters appear:\n%s", src);
    /* the ops in order: exp before gelu before the clamp */
    const char *e = strstr(src, "expf(x)"), *g = strstr(src, "erff("), *c = strstr(src, "-0.25");
    CHECK(e && g && c && e < g && g < c, "ops in chain order");

    int archs[][2] = {{8, 0}, {9, 0}};
    for (int i = 0; i < 2; i++) {
        char *ptx = NULL;
        size_t len = 0;
        int rc = kiln__cuda_rtc_compile(src, "kiln_fused_chain", archs[i][0], archs[i][1], &ptx, &len);
        CHECK(rc == 0 && ptx && len == strlen(ptx), "compiling for %d.%d: rc %d", archs[i][0], archs[i][1], rc);
        if (!ptx)
            continue;
        char target[32];
        snprintf(target, sizeof target, ".target sm_%d%d", archs[i][0], archs[i][1]);
        CHECK(strstr(ptx, target) != NULL, "PTX targets %s", target);
        CHECK(strstr(ptx, ".entry kiln_fused_chain") != NULL, "PTX has the kernel's entry");
        CHECK(strstr(ptx, "ex2.approx") != NULL || strstr(ptx, "ex2") != NULL, "PTX computes an exponential");
        free(ptx);
    }
    free(src);
}

static void test_refusals(void)
{
    kiln_unary_op bad[] = {KILN_UNARY_RELU, KILN_UNARY_ISNAN};
    char *src = kiln__cuda_codegen_unary_chain("k", bad, NULL, NULL, 2);
    CHECK(!src && strstr(kiln_error(), "cannot be fused"), "isnan (a bool result) is not fusable");
    free(src);
    kiln_unary_op one[] = {KILN_UNARY_TANH};
    src = kiln__cuda_codegen_unary_chain("1k", one, NULL, NULL, 1);
    CHECK(!src && strstr(kiln_error(), "not a C identifier"), "a name starting with a digit is refused");
    src = kiln__cuda_codegen_unary_chain("k; system(x)", one, NULL, NULL, 1);
    CHECK(!src, "a name carrying code is refused");
    src = kiln__cuda_codegen_unary_chain("k", one, NULL, NULL, 0);
    CHECK(!src && strstr(kiln_error(), "at least one op"), "an empty chain is refused");

    char *ptx = (char *)1;
    int rc = kiln__cuda_rtc_compile("extern \"C\" __global__ void broken(float *o) { o[0] = undefined_name; }",
                                    "broken", 8, 0, &ptx, NULL);
    CHECK(rc < 0 && ptx == NULL, "a broken source fails to compile");
    CHECK(strstr(kiln_error(), "undefined_name") != NULL, "the message quotes NVRTC's log");
    rc = kiln__cuda_rtc_compile("extern \"C\" __global__ void k(void) {}", "k", 2, 0, &ptx, NULL);
    CHECK(rc < 0 && strstr(kiln_error(), "out of range"), "compute capability 2.0 is refused");
}

static void test_loader(void)
{
    void *fns[2] = {NULL, NULL};
    const char *const names[] = {"cos", "kiln_no_such_function"};
    int rc = kiln__cuda_lib_open("libkiln-absent.so.7", names, fns, 1, "cuda:0");
    CHECK(rc < 0 && strstr(kiln_error(), "cuda:0: cannot load libkiln-absent.so.7"),
          "a missing library is named: %s", kiln_error());
    rc = kiln__cuda_lib_open("libm.so.6", names, fns, 2, "cuda:0");
    CHECK(rc < 0 && strstr(kiln_error(), "kiln_no_such_function") && strstr(kiln_error(), "libm.so.6") && !fns[0],
          "a missing function is named, and nothing is written: %s", kiln_error());
    rc = kiln__cuda_lib_open("libm.so.6", names, fns, 1, "cuda:0");
    CHECK(rc == 0 && fns[0] && ((double (*)(double))fns[0])(0.0) == 1.0, "a function found is called");
    CHECK(kiln__cuda_libs_load(KILN_CUDA_LIB_NVRTC, "test") == 0, "NVRTC loads by its soname");
    /* every function the backend calls resolves in the libraries installed here (a name
     * missing from them would make every cuda:N open fail on a GPU machine) */
    CHECK(kiln__cuda_libs_load(KILN_CUDA_LIB_LT | KILN_CUDA_LIB_DNN, "test") == 0,
          "cuBLASLt and cuDNN load with every function the backend calls: %s", kiln_error());
}

int main(void)
{
    test_loader();
    test_chain();
    test_refusals();
    printf("test-cuda-rtc: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
