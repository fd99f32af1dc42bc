/*
 * tests/vulkan/test-vulkan-long-dims.c — cumsum, sort, argsort and topk on vulkan:0 over
 * lanes long enough to need more than one thread's loop or more than one workgroup
 * (cumsum past 65535 elements and past one block level of 1024 x 1024, sort past one
 * shared-memory tile of 1024 and past 2049, where an O(len^2) kernel's loops once ran out),
 * against the cpu backend: sort values bit for bit (NaN and -0 included) and indices
 * exactly, in both directions, with ties, for f32, f64 and i64; integer-valued cumsums
 * exactly, others within a rounding bound; last and non-last dims, strided inputs, many
 * short lanes and few long ones. Then the other kernels whose loops once grew with a dim
 * past what llvmpipe runs (it stops every shader loop after 65535 iterations, silently):
 * reductions and argmax over 9M elements, scatters along 70000, a matmul with K = 50000
 * against the cpu, and a few that refuse there instead (test_long_loops).
 *
 * test-vulkan-long-dims [cumsum | sort | loops]: every part, or the one named.
 * Exit 77 (skipped) when the machine has no Vulkan device.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/tensor.h"

#define RAW_VULKAN "vulkan:0?fusion=off"

static int failures;
#define CHECK(cond, ...)                                                                                          \
    do {                                                                                                          \
        if (!(cond)) {                                                                                            \
            failures++;                                                                                           \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                  \
            fprintf(stderr, __VA_ARGS__);                                                                         \
            fprintf(stderr, "\n");                                                                                \
        }                                                                                                         \
    } while (0)

static kiln_device *gpu, *cpu;

/* t's elements row-major in a fresh host buffer (NULL on failure, with the error set). */
static void *host_copy(kiln_tensor *t, size_t *nbytes)
{
    if (!t)
        return NULL;
    size_t n = (size_t)kiln_tensor_numel(t) * kiln_dtype_size(kiln_tensor_dtype(t));
    void *h = malloc(n ? n : 1);
    if (h && kiln_to_data(t, h, n) != 0) {
        free(h);
        h = NULL;
    }
    *nbytes = n;
    return h;
}

/* The first element where got and want differ in their bytes, or -1. */
static int64_t first_difference(kiln_tensor *got, kiln_tensor *want)
{
    size_t ng = 0, nw = 0;
    unsigned char *g = host_copy(got, &ng), *w = host_copy(want, &nw);
    int64_t at = -2;
    if (g && w && ng == nw) {
        size_t es = kiln_dtype_size(kiln_tensor_dtype(want));
        at = -1;
        for (size_t i = 0; i < nw; i += es)
            if (memcmp(g + i, w + i, es) != 0) {
                at = (int64_t)(i / es);
                break;
            }
    }
    free(g);
    free(w);
    return at;
}

/* The largest |got - want| / (1 + running sum of |x| up to that element) over a cumsum's
 * elements, computed on the cpu in f64: the bound a sum in any order keeps. */
static double cumsum_error(kiln_tensor *got, kiln_tensor *want, kiln_tensor *x_cpu, int dim)
{
    kiln_tensor *scale = kiln_add_scalar(kiln_cumsum(kiln_abs(kiln_cast(x_cpu, KILN_F64)), dim), 1.0);
    kiln_tensor *diff = kiln_abs(
        kiln_sub(kiln_cast(kiln_to_device(got, cpu), KILN_F64), kiln_cast(want, KILN_F64)));
    kiln_tensor *rel = scale && diff ? kiln_max(kiln_div(diff, scale), KILN_ALL_DIMS, false) : NULL;
    return rel ? kiln_item(rel) : INFINITY;
}

/* ---------------------------------------------------------------- cumsum */

typedef struct cumsum_case {
    const char *name;
    kiln_dtype dt;
    int ndim;
    int64_t shape[3];
    int dim;
    bool integers;  /* small integers: every partial sum is exact, so the result is too */
    bool transpose; /* the input is the transpose of a contiguous one (dims 0 and 1) */
} cumsum_case;

static void test_cumsum(void)
{
    const cumsum_case cases[] = {
        {"f32 ones [70000]", KILN_F32, 1, {70000}, 0, true, false},
        {"f32 integers [200000]", KILN_F32, 1, {200000}, 0, true, false},
        {"f32 normal [70000]", KILN_F32, 1, {70000}, 0, false, false},
        {"i64 integers [70000]", KILN_I64, 1, {70000}, 0, true, false},
        {"i64 integers [1100000]: three block levels", KILN_I64, 1, {1100000}, 0, true, false},
        {"f32 integers [70000, 3] over dim 0", KILN_F32, 2, {70000, 3}, 0, true, false},
        {"f32 normal [3, 70000] over dim 1", KILN_F32, 2, {3, 70000}, 1, false, false},
        {"i64 integers [2, 70000, 2] over dim 1", KILN_I64, 3, {2, 70000, 2}, 1, true, false},
        {"f32 integers, transposed [3, 70000] over dim 1", KILN_F32, 2, {3, 70000}, 1, true, true},
        {"f64 normal [70000]", KILN_F64, 1, {70000}, 0, false, false},
        {"f32 normal [400, 200] over dim 1: short lanes", KILN_F32, 2, {400, 200}, 1, false, false},
        {"f32 normal [40, 3000] over dim 1", KILN_F32, 2, {40, 3000}, 1, false, false},
    };
    kiln_generator g = kiln_generator_make(11);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const cumsum_case *k = &cases[c];
        kiln_scope_begin();
        int64_t shape[3];
        memcpy(shape, k->shape, sizeof shape);
        if (k->transpose) {
            shape[0] = k->shape[1];
            shape[1] = k->shape[0];
        }
        kiln_tensor *x_cpu = !k->integers ? kiln_rand_normal(cpu, KILN_F64, k->ndim, shape, 0.5, 1, &g)
                             : strstr(k->name, "ones")
                                 ? kiln_ones(cpu, KILN_F64, k->ndim, shape)
                                 : kiln_cast(kiln_rand_int(cpu, KILN_I64, k->ndim, shape, -5, 6, &g), KILN_F64);
        x_cpu = kiln_cast(x_cpu, k->dt);
        kiln_tensor *x = kiln_to_device(x_cpu, gpu);
        if (!x && k->dt == KILN_F64) { /* a device without shaderFloat64 */
            kiln_scope_end();
            continue;
        }
        if (k->transpose) {
            x_cpu = kiln_transpose(x_cpu, 0, 1);
            x = kiln_transpose(x, 0, 1);
        }
        kiln_tensor *want = kiln_cumsum(x_cpu, k->dim), *got = kiln_cumsum(x, k->dim);
        CHECK(want && got, "cumsum %s: %s", k->name, kiln_error());
        if (want && got && k->integers) {
            int64_t at = first_difference(got, want);
            CHECK(at == -1, "cumsum %s: element %lld differs from the cpu's", k->name, (long long)at);
        } else if (want && got) {
            double e = cumsum_error(got, want, x_cpu, k->dim);
            double tol = k->dt == KILN_F64 ? 1e-13 : 1e-5;
            CHECK(e < tol, "cumsum %s: relative error %g (tolerance %g)", k->name, e, tol);
            /* the same input gives the same bits: the blocks' order is fixed */
            CHECK(first_difference(kiln_cumsum(x, k->dim), got) == -1, "cumsum %s: a second run differs", k->name);
        }
        kiln_scope_end();
    }
}

/* ---------------------------------------------------------------- sort, argsort, topk */

typedef enum {
    VALUES_PERMUTATION,
    VALUES_FEW,
    VALUES_NAN,
    VALUES_NORMAL
} values_kind;

/* n values of dt on the cpu: a shuffled 0..n-1, few distinct values (ties everywhere),
 * ties with NaN, -0 and +0 and infinities mixed in, or normal draws. */
static kiln_tensor *sort_input(kiln_dtype dt, int ndim, const int64_t *shape, values_kind kind, uint64_t seed)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    double *h = malloc((size_t)n * sizeof *h);
    if (!h)
        return NULL;
    uint64_t s = seed * 2654435761u + 1;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t r = s >> 33;
        switch (kind) {
        case VALUES_PERMUTATION: h[i] = (double)((i * 7919) % n); break;
        case VALUES_FEW: h[i] = (double)(r % 17) - 8; break;
        case VALUES_NAN: {
            static const double special[] = {NAN, -0.0, 0.0, INFINITY, -INFINITY, 1.5, -1.5, 2};
            h[i] = r % 3 == 0 ? special[r % 8] : (double)(r % 101) / 4 - 12;
            break;
        }
        case VALUES_NORMAL: h[i] = (double)(int64_t)(r % 2000001) / 1000 - 1000; break;
        }
    }
    kiln_tensor *t = kiln_cast(kiln_from_data(cpu, KILN_F64, ndim, shape, h, (size_t)n * sizeof *h), dt);
    free(h);
    return t;
}

typedef struct sort_case {
    const char *name;
    kiln_dtype dt;
    int ndim;
    int64_t shape[3];
    int dim;
    values_kind kind;
} sort_case;

static void compare_sort(const sort_case *k, kiln_tensor *x_cpu, kiln_tensor *x, bool descending)
{
    const char *dir = descending ? "descending" : "ascending";
    kiln_tensor *wv = NULL, *wi = NULL, *gv = NULL, *gi = NULL;
    int rw = kiln_sort(x_cpu, k->dim, descending, &wv, &wi);
    int rg = kiln_sort(x, k->dim, descending, &gv, &gi);
    CHECK(rw == 0 && rg == 0, "sort %s %s: %s", k->name, dir, kiln_error());
    if (rw == 0 && rg == 0) {
        int64_t v = first_difference(gv, wv), i = first_difference(gi, wi);
        CHECK(v == -1 && i == -1, "sort %s %s: first value differing from the cpu's at %lld, first index at %lld",
              k->name, dir, (long long)v, (long long)i);
    }
    kiln_tensor *ga = kiln_argsort(x, k->dim, descending);
    CHECK(ga && wi && first_difference(ga, wi) == -1, "argsort %s %s differs from sort's indices on the cpu: %s",
          k->name, dir, ga ? "" : kiln_error());
    kiln_tensor_release(wv);
    kiln_tensor_release(wi);
    kiln_tensor_release(gv);
    kiln_tensor_release(gi);
    kiln_tensor_release(ga);
    const int64_t ks[] = {1, 3, 100};
    for (int j = 0; j < 3; j++) {
        int64_t kk = ks[j] < k->shape[k->dim] ? ks[j] : k->shape[k->dim];
        kiln_tensor *tv = NULL, *ti = NULL, *cv = NULL, *ci = NULL;
        int rt = kiln_topk(x, kk, k->dim, descending, &tv, &ti);
        int rc = kiln_topk(x_cpu, kk, k->dim, descending, &cv, &ci);
        CHECK(rt == 0 && rc == 0, "topk %lld %s %s: %s", (long long)kk, k->name, dir, kiln_error());
        if (rt == 0 && rc == 0) {
            int64_t v = first_difference(tv, cv), i = first_difference(ti, ci);
            CHECK(v == -1 && i == -1, "topk k=%lld %s of %s: first value differing at %lld, index at %lld",
                  (long long)kk, descending ? "largest" : "smallest", k->name, (long long)v, (long long)i);
        }
        kiln_tensor_release(tv);
        kiln_tensor_release(ti);
        kiln_tensor_release(cv);
        kiln_tensor_release(ci);
    }
}

static void test_sort(void)
{
    const sort_case cases[] = {
        {"f32 permutation [4096]", KILN_F32, 1, {4096}, 0, VALUES_PERMUTATION},
        {"f32 permutation [9000]", KILN_F32, 1, {9000}, 0, VALUES_PERMUTATION},
        {"f32 ties [9000]", KILN_F32, 1, {9000}, 0, VALUES_FEW},
        {"f32 NaN, -0, inf [9000]", KILN_F32, 1, {9000}, 0, VALUES_NAN},
        {"f32 normal [70000]", KILN_F32, 1, {70000}, 0, VALUES_NORMAL},
        {"i64 permutation [3000]", KILN_I64, 1, {3000}, 0, VALUES_PERMUTATION},
        {"i64 ties [9000]", KILN_I64, 1, {9000}, 0, VALUES_FEW},
        {"i64 normal [4096]", KILN_I64, 1, {4096}, 0, VALUES_NORMAL},
        {"f64 NaN, -0, inf [5000]", KILN_F64, 1, {5000}, 0, VALUES_NAN},
        {"f32 ties [3, 5000] over dim 1", KILN_F32, 2, {3, 5000}, 1, VALUES_FEW},
        {"f32 NaN [5000, 3] over dim 0", KILN_F32, 2, {5000, 3}, 0, VALUES_NAN},
        {"i64 ties [2, 4100, 2] over dim 1", KILN_I64, 3, {2, 4100, 2}, 1, VALUES_FEW},
        {"f32 NaN [700, 5] over dim 1: many lanes to a tile", KILN_F32, 2, {700, 5}, 1, VALUES_NAN},
        {"i64 ties [300, 600] over dim 1", KILN_I64, 2, {300, 600}, 1, VALUES_FEW},
        {"f32 ties [1]", KILN_F32, 1, {1}, 0, VALUES_FEW},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const sort_case *k = &cases[c];
        kiln_scope_begin();
        kiln_tensor *x_cpu = sort_input(k->dt, k->ndim, k->shape, k->kind, c + 1);
        kiln_tensor *x = kiln_to_device(x_cpu, gpu);
        if (!x && k->dt == KILN_F64) { /* a device without shaderFloat64 */
            kiln_scope_end();
            continue;
        }
        CHECK(x_cpu && x, "sort input %s: %s", k->name, kiln_error());
        if (x_cpu && x) {
            compare_sort(k, x_cpu, x, false);
            compare_sort(k, x_cpu, x, true);
        }
        kiln_scope_end();
    }
    /* a strided view: sort the transpose of a contiguous [9000, 2] along its long dim */
    kiln_scope_begin();
    const int64_t shape[2] = {9000, 2};
    kiln_tensor *x_cpu = sort_input(KILN_F32, 2, shape, VALUES_NAN, 99);
    kiln_tensor *x = kiln_to_device(x_cpu, gpu);
    sort_case k = {"f32 NaN, transposed [2, 9000] over dim 1", KILN_F32, 2, {2, 9000}, 1, VALUES_NAN};
    compare_sort(&k, kiln_transpose(x_cpu, 0, 1), kiln_transpose(x, 0, 1), true);
    kiln_scope_end();
}

/* ---------------------------------------------------------------- other long loops */

/* got agrees with want (both on their devices) within tol relative to want's largest
 * magnitude; where may_refuse, NULL got with a message naming the device's loop limit
 * counts as a refusal, which only a driver with such a limit (llvmpipe) may give. */
static void check_close(const char *name, kiln_tensor *got, kiln_tensor *want, double tol, bool may_refuse)
{
    if (!got && may_refuse) {
        const char *e = kiln_error();
        CHECK(strstr(e, "stops every shader loop") && strstr(e, "llvmpipe"), "%s: %s", name, e);
        return;
    }
    kiln_tensor *w = kiln_cast(want, KILN_F64);
    kiln_tensor *diff = kiln_max(kiln_abs(kiln_sub(kiln_cast(kiln_to_device(got, cpu), KILN_F64), w)),
                                 KILN_ALL_DIMS, false);
    kiln_tensor *scale = kiln_max(kiln_abs(w), KILN_ALL_DIMS, false);
    double e = diff && scale ? kiln_item(diff) : INFINITY, sc = scale ? kiln_item(scale) : 0;
    CHECK(e <= tol * sc, "%s: largest difference from the cpu %g (scale %g, tolerance %g) %s", name, e, sc, tol,
          got ? "" : kiln_error());
}

/* Reductions over runs past 128 x 65535 elements (one workgroup's loop once ran out on
 * llvmpipe there: now split into chunks), scatters along dims past 16384 (one thread's
 * loop: now walked by several dispatches in turn), a matmul whose K is past the limit
 * (walked by several dispatches there), and kernels that still give one thread a loop as
 * long as a dim: right values, or on llvmpipe a refusal naming its limit. */
static void test_long_loops(void)
{
    const int64_t n = 9000000;
    kiln_generator g = kiln_generator_make(23);
    kiln_scope_begin();
    kiln_tensor *x_cpu = kiln_rand_normal(cpu, KILN_F32, KILN_SHAPE(n), 0, 1, &g), *x = kiln_to_device(x_cpu, gpu);
    kiln_tensor *(*const extremes[2])(kiln_tensor *, int, const int *, bool) = {kiln_max, kiln_min};
    for (int k = 0; k < 2; k++) {
        kiln_tensor *got = extremes[k](x, KILN_ALL_DIMS, false), *want = extremes[k](x_cpu, KILN_ALL_DIMS, false);
        CHECK(got && want && first_difference(got, want) == -1, "%s of 9M f32: %s", k ? "min" : "max",
              got ? "differs from the cpu's" : kiln_error());
        got = k ? kiln_argmin(x, 0, false) : kiln_argmax(x, 0, false);
        want = k ? kiln_argmin(x_cpu, 0, false) : kiln_argmax(x_cpu, 0, false);
        CHECK(got && want && first_difference(got, want) == -1, "%s of 9M f32: %s", k ? "argmin" : "argmax",
              got ? "differs from the cpu's" : kiln_error());
    }
    kiln_tensor *xi_cpu = kiln_rand_int(cpu, KILN_I64, KILN_SHAPE(n), -1000, 1000, &g);
    kiln_tensor *si = kiln_sum(kiln_to_device(xi_cpu, gpu), KILN_ALL_DIMS, false);
    CHECK(si && first_difference(si, kiln_sum(xi_cpu, KILN_ALL_DIMS, false)) == -1, "sum of 9M i64: %s",
          si ? "differs from the cpu's" : kiln_error());
    kiln_tensor *pos = kiln_gt(x, kiln_full(gpu, KILN_F32, 0, NULL, 4.5));
    kiln_tensor *pos_cpu = kiln_gt(x_cpu, kiln_full(cpu, KILN_F32, 0, NULL, 4.5));
    kiln_tensor *any = kiln_any(pos, 1, (int[]){0}, false),
                *all = kiln_all(kiln_logical_not(pos), 1, (int[]){0}, false);
    CHECK(any && all && first_difference(any, kiln_any(pos_cpu, 1, (int[]){0}, false)) == -1 &&
              first_difference(all, kiln_all(kiln_logical_not(pos_cpu), 1, (int[]){0}, false)) == -1,
          "any and all of 9M: %s", any && all ? "differ from the cpu's" : kiln_error());
    check_close("1-norm of 9M f32", kiln_norm(x, 1, 1, (int[]){0}, false),
                kiln_norm(x_cpu, 1, 1, (int[]){0}, false), 1e-5, false);
    check_close("var of 9M f32 (no split)", kiln_var(x, 1, (int[]){0}, 1, false),
                kiln_var(x_cpu, 1, (int[]){0}, 1, false), 1e-4, true);
    kiln_scope_end();

    /* scatter and scatter_add of 70000 positions along dim 1 of [2, 70000] into [2, 10] */
    kiln_scope_begin();
    kiln_tensor *idx_cpu = kiln_rand_int(cpu, KILN_I64, KILN_SHAPE(2, 70000), 0, 10, &g);
    kiln_tensor *src_cpu = kiln_reshape(kiln_arange(cpu, KILN_F32, 0, 140000, 1), KILN_SHAPE(2, 70000));
    kiln_tensor *z_cpu = kiln_zeros(cpu, KILN_F32, KILN_SHAPE(2, 10));
    kiln_tensor *idx = kiln_to_device(idx_cpu, gpu), *src = kiln_to_device(src_cpu, gpu),
                *z = kiln_to_device(z_cpu, gpu);
    kiln_tensor *sc = kiln_scatter(z, 1, idx, src), *sa = kiln_scatter_add(z, 1, idx, kiln_ones_like(src));
    CHECK(sc && first_difference(sc, kiln_scatter(z_cpu, 1, idx_cpu, src_cpu)) == -1, "scatter along 70000: %s",
          sc ? "the last write differs from the cpu's" : kiln_error());
    CHECK(sa && first_difference(sa, kiln_scatter_add(z_cpu, 1, idx_cpu, kiln_ones_like(src_cpu))) == -1,
          "scatter_add along 70000: %s", sa ? "the counts differ from the cpu's" : kiln_error());
    kiln_scope_end();

    kiln_scope_begin();
    kiln_tensor *row_cpu = kiln_rand_normal(cpu, KILN_F32, KILN_SHAPE(2, 1500000), 0, 1, &g);
    check_close("softmax over rows of 1.5M", kiln_softmax(kiln_to_device(row_cpu, gpu), 1),
                kiln_softmax(row_cpu, 1), 1e-4, true);
    kiln_tensor *a_cpu = kiln_rand_normal(cpu, KILN_F32, KILN_SHAPE(2, 50000), 0, 1, &g);
    kiln_tensor *b_cpu = kiln_rand_normal(cpu, KILN_F32, KILN_SHAPE(50000, 3), 0, 1, &g);
    /* a K past the loop limit is walked by several dispatches in turn there */
    check_close("matmul with K = 50000", kiln_matmul(kiln_to_device(a_cpu, gpu), kiln_to_device(b_cpu, gpu)),
                kiln_matmul(a_cpu, b_cpu), 1e-4, false);
    kiln_tensor *img_cpu = kiln_add_scalar(kiln_rand_normal(cpu, KILN_F32, KILN_SHAPE(1, 2, 300, 300), 0, 1, &g),
                                           1);
    check_close("adaptive_avg_pool2d of 300 x 300 to 1 x 1",
                kiln_adaptive_avg_pool2d(kiln_to_device(img_cpu, gpu), 1, 1),
                kiln_adaptive_avg_pool2d(img_cpu, 1, 1), 1e-4, true);
    kiln_scope_end();
}

int main(int argc, char **argv)
{
    gpu = kiln_device_open(RAW_VULKAN);
    if (!gpu) {
        const char *e = kiln_error();
        if (strstr(e, "no Vulkan device") || strstr(e, "no Vulkan driver")) {
            printf("skipped: %s\n", e);
            return 77;
        }
        fprintf(stderr, "FAIL: %s does not open: %s\n", RAW_VULKAN, e);
        return 1;
    }
    cpu = kiln_device_open("cpu");
    CHECK(cpu, "open cpu: %s", kiln_error());
    if (cpu) {
        if (argc < 2 || strcmp(argv[1], "cumsum") == 0)
            test_cumsum();
        if (argc < 2 || strcmp(argv[1], "sort") == 0)
            test_sort();
        if (argc < 2 || strcmp(argv[1], "loops") == 0)
            test_long_loops();
    }
    kiln_device_close(gpu);
    kiln_device_close(cpu);
    printf("test-vulkan-long-dims: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
