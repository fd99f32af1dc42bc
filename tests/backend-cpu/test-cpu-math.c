/*
 * tests/backend-cpu/test-cpu-math.c — the accuracy of the cpu's vector math, table by table.
 *
 * Each kernel table this CPU can run (base, AVX2, AVX-512) evaluates gelu, erf, tanh, exp
 * and sigmoid on a dense sweep of f32 inputs (every 4099th bit pattern in a band, about
 * 250 000 values per band), and the worst relative error against the function evaluated
 * in double on the same f32 input is held to the bound stated for that band. The bounds
 * are those the kernels' comments promise; the bands are where the functions matter
 * (gelu's negative tail keeps its relative accuracy down to 1e-30). Results below the
 * smallest normal f32 are not judged: there f32 itself cannot hold relative accuracy.
 */
#include <float.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "common/philox.h"
#include "cpu-impl.h"

static int failures, checks;

typedef double (*ref_fn)(double);

static double ref_gelu(double x)
{
    return 0.5 * x * erfc(-x / sqrt(2.0));
}
static double ref_erf(double x)
{
    return erf(x);
}
static double ref_tanh(double x)
{
    return tanh(x);
}
static double ref_exp(double x)
{
    return exp(x);
}
static double ref_sigmoid(double x)
{
    return 1.0 / (1.0 + exp(-x));
}

struct band {
    const char *fn;
    int op;
    ref_fn ref;
    float lo, hi; /* |x| in [lo, hi] */
    double max_rel;
};

static const struct band bands[] = {
    {"gelu", KILN_UNARY_GELU, ref_gelu, 1e-3f, 3.0f, 1.5e-6},
    {"gelu", KILN_UNARY_GELU, ref_gelu, 3.0f, 6.0f, 5e-6},
    {"gelu", KILN_UNARY_GELU, ref_gelu, 6.0f, 12.0f, 2e-5},
    {"erf", KILN_UNARY_ERF, ref_erf, 1e-3f, 4.0f, 1e-6},
    {"tanh", KILN_UNARY_TANH, ref_tanh, 1e-3f, 9.0f, 1e-6},
    {"exp", KILN_UNARY_EXP, ref_exp, 1e-3f, 80.0f, 1e-6},
    {"sigmoid", KILN_UNARY_SIGMOID, ref_sigmoid, 1e-3f, 80.0f, 1e-6},
};

/* Every 4099th f32 with lo <= |x| <= hi, both signs. */
static float *sweep(float lo, float hi, int64_t *n)
{
    uint32_t a, b;
    memcpy(&a, &lo, 4);
    memcpy(&b, &hi, 4);
    int64_t per_sign = (int64_t)(b - a) / 4099 + 1;
    float *x = malloc((size_t)(2 * per_sign) * sizeof *x);
    int64_t k = 0;
    for (uint32_t bits = a; bits <= b && k < per_sign; bits += 4099, k++) {
        float v;
        memcpy(&v, &bits, 4);
        x[2 * k] = v;
        x[2 * k + 1] = -v;
    }
    *n = 2 * k;
    return x;
}

/* The table's Philox draws equal kiln_rng_uniform01's to the bit: counters that carry
 * into the high word inside a run or between runs, seeds with both halves set, runs
 * that end mid-vector. */
static void check_philox(const char *name, const kiln__cpu_kernels *k)
{
    static const uint64_t counters[] = {
        0, 1000, 0xFFFFFF90ull, 0xFFFFFFF5ull, 0x123456789ABCDEF0ull, UINT64_MAX - 20};
    static const uint64_t seeds[] = {0, 42, 0xDEADBEEFCAFEF00Dull};
    static const int64_t lens[] = {1, 15, 16, 17, 64, 65, 100, 200};
    int64_t bad = 0, total = 0;
    double u[200];
    for (size_t c = 0; c < sizeof counters / sizeof counters[0]; c++)
        for (size_t s = 0; s < sizeof seeds / sizeof seeds[0]; s++)
            for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
                k->philox_u01(u, counters[c], seeds[s], lens[l]);
                for (int64_t i = 0; i < lens[l]; i++, total++)
                    if (u[i] != kiln_rng_uniform01(counters[c] + (uint64_t)i, seeds[s]))
                        bad++;
            }
    checks++;
    printf("%s %-8s philox draws equal kiln_rng_uniform01's: %lld of %lld differ\n", bad ? "FAIL" : "ok  ", name,
           (long long)bad, (long long)total);
    if (bad)
        failures++;
}

/* The table's column sum equals adding each row into a double, one after another: row
 * counts that leave 0 to 3 rows after the groups of four, widths that end mid-vector, a
 * row stride wider than the width, values whose sum rounds differently in another order. */
static void check_colsum(const char *name, const kiln__cpu_kernels *k)
{
    enum {
        LD = 53
    };
    static const int64_t rows_list[] = {1, 3, 4, 7, 130};
    static const int64_t widths[] = {1, 9, 31, 53};
    float *x = malloc((size_t)(130 * LD) * sizeof *x);
    uint32_t state = 12345;
    for (int64_t i = 0; i < 130 * LD; i++) {
        state = state * 1664525u + 1013904223u;
        x[i] = ldexpf((float)(state >> 8), (int)(state % 40) - 40) * ((state & 1) ? -1.0f : 1.0f);
    }
    int64_t bad = 0, total = 0;
    for (size_t r = 0; r < sizeof rows_list / sizeof rows_list[0]; r++)
        for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++) {
            double s[LD], want[LD];
            for (int64_t i = 0; i < LD; i++)
                s[i] = want[i] = 0.25 * (double)i;
            k->colsum_f32(s, x, rows_list[r], LD, widths[w]);
            for (int64_t a = 0; a < rows_list[r]; a++)
                for (int64_t i = 0; i < widths[w]; i++)
                    want[i] += x[a * LD + i];
            for (int64_t i = 0; i < LD; i++, total++)
                if (memcmp(&s[i], &want[i], sizeof s[i]) != 0)
                    bad++;
        }
    free(x);
    checks++;
    printf("%s %-8s column sums equal row-by-row double adds: %lld of %lld differ\n", bad ? "FAIL" : "ok  ", name,
           (long long)bad, (long long)total);
    if (bad)
        failures++;
}

static void check_table(const char *name, const kiln__cpu_kernels *k)
{
    for (size_t i = 0; i < sizeof bands / sizeof bands[0]; i++) {
        const struct band *bd = &bands[i];
        int64_t n;
        float *x = sweep(bd->lo, bd->hi, &n);
        float *y = malloc((size_t)n * sizeof *y);
        k->unary_f32(bd->op, y, x, n, 0, 0);
        double worst = 0;
        float worst_x = 0;
        for (int64_t j = 0; j < n; j++) {
            double r = bd->ref((double)x[j]);
            if (fabs(r) < FLT_MIN || fabs(r) > FLT_MAX)
                continue;
            double e = fabs((double)y[j] - r) / fabs(r);
            if (!(e <= worst)) { /* NaN counts as worst */
                worst = e;
                worst_x = x[j];
            }
        }
        checks++;
        bool ok = worst <= bd->max_rel;
        printf("%s %-8s %s |x| in [%g, %g]: worst relative error %.3g at %.9g (bound %.3g)\n",
               ok ? "ok  " : "FAIL", name, bd->fn, (double)bd->lo, (double)bd->hi, worst, (double)worst_x,
               bd->max_rel);
        if (!ok)
            failures++;
        free(x);
        free(y);
    }
    /* the values every form must get exactly */
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 20.0f, -20.0f, 1e-30f, -1e-30f};
    float gy[9];
    k->unary_f32(KILN_UNARY_GELU, gy, special, 9, 0, 0);
    checks++;
    bool ok = gy[0] == 0 && gy[1] == 0 && gy[2] == INFINITY && isnan(gy[3]) && isnan(gy[4]) && gy[5] == 20.0f &&
              gy[6] > -1e-37f && gy[6] <= 0 && gy[7] == 0.5e-30f && gy[8] == -0.5e-30f;
    printf("%s %-8s gelu of 0, -0, inf, -inf, NaN, 20, -20, 1e-30, -1e-30: %g %g %g %g %g %g %g %g %g\n",
           ok ? "ok  " : "FAIL", name, (double)gy[0], (double)gy[1], (double)gy[2], (double)gy[3], (double)gy[4],
           (double)gy[5], (double)gy[6], (double)gy[7], (double)gy[8]);
    if (!ok)
        failures++;
    check_philox(name, k);
    check_colsum(name, k);
}

int main(void)
{
    check_table("base", &kiln__cpu_kernels_base);
#if defined(__x86_64__)
    __builtin_cpu_init();
    unsigned a, b, c, d; /* F16C from cpuid: not every compiler's __builtin_cpu_supports knows it */
    bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c)
        check_table("avx2", &kiln__cpu_kernels_avx2);
    else
        printf("skip avx2: this CPU lacks AVX2, FMA or F16C\n");
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
        check_table("avx512", &kiln__cpu_kernels_avx512);
    else
        printf("skip avx512: this CPU lacks AVX-512 F/DQ/BW/VL\n");
#endif
    printf("cpu-math: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
