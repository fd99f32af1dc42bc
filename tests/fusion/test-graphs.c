/*
 * tests/fusion/test-graphs.c — random expression graphs through the public API on three
 * devices: "fused:counting:cpu?min_elements=0" (fused), "counting:cpu" (the same kernels unfused) and
 * "ref" (the oracle). Graphs mix elementwise ops, broadcasts (row, column and scalar
 * operands), views (transpose, slice, reshape), reductions and matmuls with elementwise
 * epilogues; every result must equal the unfused one to the bit and ref's within 1e-4,
 * and the fused device must reach its kernels in fewer calls. Intermediates are released
 * at random points, as a model's are. Also: the device options
 * (fusion=on, codegen=off) and their refusals.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "fusion-test.h"
#include "kiln/tensor.h"

#define NDEV 3
static kiln_device *devs[NDEV]; /* fused, unfused, ref */

typedef struct graph_vals {
    kiln_tensor *v[NDEV][48];
    int n;
} graph_vals;

/* Compare a result on the three devices: fused == unfused bit for bit (within rel_tol
 * when that is not 0: a fused reduction adds its blocks in another order, in double),
 * both near ref. */
static void compare_tol(const char *what, kiln_tensor *const t[NDEV], double rel_tol)
{
    for (int d = 0; d < NDEV; d++)
        CHECK(t[d] != NULL, "%s: device %d: %s", what, d, kiln_error());
    if (!t[0] || !t[1] || !t[2])
        return;
    int64_t n = kiln_tensor_numel(t[0]);
    float *v[NDEV];
    for (int d = 0; d < NDEV; d++) {
        v[d] = malloc((size_t)n * sizeof(float) + 1);
        CHECK(kiln_to_data(t[d], v[d], (size_t)n * sizeof(float)) == 0, "%s: read: %s", what, kiln_error());
    }
    int64_t bad = -1, far = -1;
    for (int64_t i = 0; i < n; i++) {
        if (bad < 0 && memcmp(&v[0][i], &v[1][i], sizeof(float)) && !(isnan(v[0][i]) && isnan(v[1][i])) &&
            !(fabs((double)v[0][i] - v[1][i]) <= rel_tol * fabs((double)v[1][i])))
            bad = i;
        if (far < 0 && !(fabs((double)v[0][i] - v[2][i]) <= 1e-4 * fabs((double)v[2][i]) + 1e-4))
            far = i;
    }
    CHECK(bad < 0, "%s: element %lld fused %.9g != unfused %.9g", what, (long long)bad, bad >= 0 ? v[0][bad] : 0.0,
          bad >= 0 ? v[1][bad] : 0.0);
    CHECK(far < 0, "%s: element %lld fused %.9g, ref %.9g", what, (long long)far, far >= 0 ? v[0][far] : 0.0,
          far >= 0 ? v[2][far] : 0.0);
    for (int d = 0; d < NDEV; d++)
        free(v[d]);
}

static void compare(const char *what, kiln_tensor *const t[NDEV])
{
    compare_tol(what, t, 0);
}

/* A random index below n whose value is alive (index 0, an input, always is). */
static int pick_alive(uint64_t *s, const bool *alive, int n)
{
    int k = test_pick(s, n);
    while (!alive[k])
        k--;
    return k;
}

static void random_graph(int seed)
{
    uint64_t s = (uint64_t)seed * 7919 + 3;
    int64_t R = 1 + test_pick(&s, 37), C = 1 + test_pick(&s, seed % 4 == 0 ? 600 : 45);
    graph_vals g = {.n = 0};
    kiln_scope_begin();
    /* inputs: full, row [C], column [R, 1], scalar [1], a transposed [C, R] source, a
     * slice of a wider [R, 2C] source; the same host values on every device */
    int64_t nmax = R * C * 2;
    float *host = malloc((size_t)nmax * sizeof(float));
    for (int64_t i = 0; i < nmax; i++)
        host[i] = (float)((double)test_rand(&s) / (double)(1ull << 31) * 4.0 - 2.0);
    for (int d = 0; d < NDEV; d++) {
        kiln_device *dev = devs[d];
        g.v[d][0] = kiln_from_data(dev, KILN_F32, KILN_SHAPE(R, C), host, (size_t)(R * C) * sizeof(float));
        g.v[d][1] = kiln_from_data(dev, KILN_F32, KILN_SHAPE(C), host + 1, (size_t)C * sizeof(float));
        g.v[d][2] = kiln_from_data(dev, KILN_F32, KILN_SHAPE(R, 1), host + 2, (size_t)R * sizeof(float));
        g.v[d][3] = kiln_from_data(dev, KILN_F32, KILN_SHAPE(1), host + 3, sizeof(float));
        g.v[d][4] = kiln_transpose(
            kiln_from_data(dev, KILN_F32, KILN_SHAPE(C, R), host + 5, (size_t)(R * C) * sizeof(float)), 0, 1);
        g.v[d][5] = kiln_slice(
            kiln_from_data(dev, KILN_F32, KILN_SHAPE(R, 2 * C), host, (size_t)(2 * R * C) * sizeof(float)), 1, 1,
            2 * C, 2);
    }
    /* a bool mask per column kept apart from the values (where's condition, read from
     * memory and broadcast over the rows) */
    kiln_tensor *mask[NDEV];
    uint8_t *bits = malloc((size_t)C);
    for (int64_t i = 0; i < C; i++)
        bits[i] = (uint8_t)(test_rand(&s) & 1);
    for (int d = 0; d < NDEV; d++)
        mask[d] = kiln_from_data(devs[d], KILN_BOOL, KILN_SHAPE(C), bits, (size_t)C);
    free(bits);
    free(host);
    g.n = 6;
    uint64_t before[2] = {fusion_calls_of(devs[0], NULL), fusion_calls_of(devs[1], NULL)};
    int nops = 3 + test_pick(&s, 14);
    /* intermediates are released at random points on every device alike (a released one
     * is read no more): one freed while its group is pending gives its memory back early
     * (test-dead-memory.c), which must not change a bit of what the group computes */
    bool alive[48] = {0};
    for (int i = 0; i < 6; i++)
        alive[i] = true;
    for (int i = 0; i < nops && g.n < 47; i++) {
        int kind = test_pick(&s, 10);
        int a = pick_alive(&s, alive, g.n), b = pick_alive(&s, alive, g.n);
        int u = test_pick(&s, 10), bo = test_pick(&s, 6);
        for (int d = 0; d < NDEV; d++) {
            kiln_tensor *r;
            if (kind < 5) {
                r = fusion_binary_of(g.v[d][a], g.v[d][b], bo);
            } else if (kind < 8) {
                r = fusion_unary_of(g.v[d][a], u);
            } else if (kind == 7 && u < 7) {
                /* where with a mask from memory, and one compared in the group */
                kiln_tensor *m2 = kiln_gt(g.v[d][a], g.v[d][b]);
                r = kiln_where(m2, kiln_where(mask[d], g.v[d][a], g.v[d][1]), g.v[d][b]);
            } else if (kind == 8) {
                /* a view in the middle of a chain: reshape to the flat shape and back */
                kiln_tensor *full = kiln_add(g.v[d][a], g.v[d][0]);
                r = kiln_reshape(kiln_reshape(full, KILN_SHAPE(-1)), KILN_SHAPE(R, C));
            } else {
                /* a transposed intermediate read by the next ops */
                kiln_tensor *full = kiln_mul(g.v[d][a], g.v[d][0]);
                r = kiln_transpose(kiln_contiguous(kiln_transpose(full, 0, 1)), 0, 1);
            }
            g.v[d][g.n] = r;
        }
        alive[g.n++] = true;
        int victim = 6 + test_pick(&s, g.n); /* past g.n - 2: none this time */
        if (test_pick(&s, 2) == 0 && victim < g.n - 1 && alive[victim]) {
            for (int d = 0; d < NDEV; d++)
                kiln_tensor_release(kiln_keep(g.v[d][victim]));
            alive[victim] = false;
        }
    }
    /* the result broadcast to [R, C], then a reduction of it and a matmul with an
     * elementwise epilogue after it */
    kiln_tensor *res[NDEV], *red[NDEV], *mm[NDEV];
    for (int d = 0; d < NDEV; d++) {
        res[d] = kiln_add(g.v[d][g.n - 1], g.v[d][0]);
        red[d] = kiln_sum(kiln_mul(res[d], res[d]), KILN_DIMS(-1), true);
        mm[d] = kiln_relu(kiln_add_scalar(kiln_matmul(kiln_tanh(res[d]), kiln_transpose(g.v[d][0], 0, 1)), 0.1));
    }
    char what[96];
    snprintf(what, sizeof what, "graph %d [%lld, %lld] result", seed, (long long)R, (long long)C);
    compare(what, res);
    snprintf(what, sizeof what, "graph %d reduction", seed);
    compare_tol(what, red, 1e-6);
    snprintf(what, sizeof what, "graph %d matmul epilogue", seed);
    compare(what, mm);
    uint64_t fused_calls = fusion_calls_of(devs[0], NULL) - before[0],
             plain_calls = fusion_calls_of(devs[1], NULL) - before[1];
    CHECK(fused_calls < plain_calls, "graph %d: fused made %llu calls, unfused %llu", seed,
          (unsigned long long)fused_calls, (unsigned long long)plain_calls);
    kiln_scope_end();
}

/* A chain whose intermediates die before the read: one fused call replaces the chain. */
/* One expression's [300, 517] result on the fused and the unfused device: equal to the
 * bit. Counts the zeros of the fused one into zeros (when given); releases both. */
static void pair_same_bits(const char *what, kiln_tensor *r[2], int64_t *zeros)
{
    const int64_t n = 300 * 517;
    float *u = malloc((size_t)n * sizeof(float)), *v = malloc((size_t)n * sizeof(float));
    CHECK(u && v && kiln_to_data(r[0], u, (size_t)n * sizeof(float)) == 0 &&
              kiln_to_data(r[1], v, (size_t)n * sizeof(float)) == 0 && !memcmp(u, v, (size_t)n * sizeof(float)),
          "%s fused equals unfused to the bit", what);
    for (int64_t i = 0; zeros && u && i < n; i++)
        *zeros += u[i] == 0;
    free(u);
    free(v);
    kiln_tensor_release(r[0]);
    kiln_tensor_release(r[1]);
}

static void chain_counts(void)
{
    kiln_scope_begin();
    kiln_generator gen = kiln_generator_make(5);
    kiln_tensor *x = kiln_rand_uniform(devs[0], KILN_F32, KILN_SHAPE(300, 517), -2, 2, &gen);
    kiln_tensor *a = kiln_rand_uniform(devs[0], KILN_F32, KILN_SHAPE(517), -2, 2, &gen);
    kiln_device_sync(devs[0]);
    uint64_t f0 = fusion_calls_of(devs[0], "fused"), u0 = fusion_calls_of(devs[0], "unary"),
             b0 = fusion_calls_of(devs[0], "binary");
    kiln_scope_begin();
    kiln_tensor *y = kiln_keep(kiln_mul(kiln_gelu(kiln_add(kiln_mul(x, a), a), false), a));
    kiln_scope_end();
    float first[4];
    CHECK(kiln_to_data(kiln_slice(kiln_reshape(y, KILN_SHAPE(-1)), 0, 0, 4, 1), first, sizeof first) == 0,
          "chain: read: %s", kiln_error());
    CHECK(fusion_calls_of(devs[0], "fused") - f0 == 1, "gelu(x*a+a)*a ran as one fused call (%llu)",
          (unsigned long long)(fusion_calls_of(devs[0], "fused") - f0));
    CHECK(fusion_calls_of(devs[0], "unary") == u0 && fusion_calls_of(devs[0], "binary") == b0,
          "no unfused elementwise call reached the kernels");
    kiln_tensor_release(y);

    /* a chain that reads the same two inputs again and again (as a gelu's backward reads
     * x): 18 calls, 36 operand reads, two distinct loads: one fused call, the unfused bits */
    {
        kiln_tensor *r[2];
        for (int d = 0; d < 2; d++) {
            kiln_generator g2 = kiln_generator_make(5);
            kiln_tensor *xd = kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(300, 517), -1, 1, &g2);
            kiln_tensor *ad = kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(517), -1, 1, &g2);
            kiln_device_sync(devs[d]);
            if (d == 0)
                f0 = fusion_calls_of(devs[0], "fused"), b0 = fusion_calls_of(devs[0], "binary");
            kiln_scope_begin();
            kiln_tensor *v = xd;
            for (int i = 0; i < 9; i++)
                v = kiln_add(kiln_mul(v, xd), ad);
            r[d] = kiln_keep(v);
            kiln_scope_end();
        }
        pair_same_bits("(v * x + a) nine times", r, NULL);
        CHECK(fusion_calls_of(devs[0], "fused") - f0 == 1 && fusion_calls_of(devs[0], "binary") == b0,
              "(v * x + a) nine times ran as one fused call (%llu fused, %llu binary)",
              (unsigned long long)(fusion_calls_of(devs[0], "fused") - f0),
              (unsigned long long)(fusion_calls_of(devs[0], "binary") - b0));
    }

    /* a dropout after a softmax: its mask's draws run ahead of the pending group, and its
     * multiply and scale join the softmax's group (the draws used to flush it) */
    {
        kiln_tensor *r[2];
        uint64_t rng0 = 0;
        for (int d = 0; d < 2; d++) {
            kiln_generator g2 = kiln_generator_make(5);
            kiln_tensor *xd = kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(300, 517), -2, 2, &g2);
            kiln_tensor *ad = kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(517), -2, 2, &g2);
            kiln_device_sync(devs[d]);
            if (d == 0)
                f0 = fusion_calls_of(devs[0], "fused"), b0 = fusion_calls_of(devs[0], "binary"),
                rng0 = fusion_calls_of(devs[0], "rng");
            kiln_generator dg = kiln_generator_make(11);
            kiln_scope_begin();
            r[d] = kiln_keep(kiln_dropout(kiln_softmax(kiln_mul(xd, ad), -1), 0.25, true, &dg));
            kiln_scope_end();
        }
        int64_t zeros = 0;
        pair_same_bits("dropout(softmax(x * a))", r, &zeros);
        CHECK(zeros > 300 * 517 / 5 && zeros < 300 * 517 * 3 / 10, "dropout(p = 0.25) zeroed %lld of %d",
              (long long)zeros, 300 * 517);
        CHECK(fusion_calls_of(devs[0], "rng") - rng0 == 1 && fusion_calls_of(devs[0], "fused") - f0 == 1 &&
                  fusion_calls_of(devs[0], "binary") == b0,
              "softmax then dropout ran as one draw and one fused call (%llu draws, %llu fused, %llu binary)",
              (unsigned long long)(fusion_calls_of(devs[0], "rng") - rng0),
              (unsigned long long)(fusion_calls_of(devs[0], "fused") - f0),
              (unsigned long long)(fusion_calls_of(devs[0], "binary") - b0));
    }

    /* a sum over the rows read back broadcast (softmax's backward, y (g - sum(g y))): one
     * fused call, the row sums never leaving it, the unfused bits */
    {
        kiln_tensor *r[2];
        uint64_t r0 = 0;
        for (int d = 0; d < 2; d++) {
            kiln_generator g2 = kiln_generator_make(7);
            kiln_tensor *yd = kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(300, 517), 0, 1, &g2);
            kiln_tensor *gd = kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(300, 517), -1, 1, &g2);
            kiln_device_sync(devs[d]);
            if (d == 0)
                f0 = fusion_calls_of(devs[0], "fused"), b0 = fusion_calls_of(devs[0], "binary"),
                r0 = fusion_calls_of(devs[0], "reduce");
            kiln_scope_begin();
            kiln_tensor *s = kiln_sum(kiln_mul(gd, yd), KILN_DIMS(-1), true);
            r[d] = kiln_keep(kiln_mul(yd, kiln_sub(gd, s)));
            kiln_scope_end();
        }
        pair_same_bits("y (g - sum(g y))", r, NULL);
        CHECK(fusion_calls_of(devs[0], "fused") - f0 == 1 && fusion_calls_of(devs[0], "binary") == b0 &&
                  fusion_calls_of(devs[0], "reduce") == r0,
              "y (g - sum(g y)) ran as one fused call (%llu fused, %llu binary, %llu reduce)",
              (unsigned long long)(fusion_calls_of(devs[0], "fused") - f0),
              (unsigned long long)(fusion_calls_of(devs[0], "binary") - b0),
              (unsigned long long)(fusion_calls_of(devs[0], "reduce") - r0));
    }

    /* where over a bool mask per column (read in place beside a row-broadcast operand) */
    uint8_t bits[517];
    for (int j = 0; j < 517; j++)
        bits[j] = (uint8_t)(j % 3 == 0);
    kiln_tensor *mk = kiln_from_data(devs[0], KILN_BOOL, KILN_SHAPE(517), bits, sizeof bits);
    kiln_scope_begin();
    kiln_tensor *w = kiln_keep(kiln_where(mk, kiln_mul(x, a), kiln_neg(a)));
    kiln_scope_end();
    float wv[2 * 517], xv[2 * 517], av[517];
    CHECK(kiln_to_data(kiln_slice(w, 0, 0, 2, 1), wv, sizeof wv) == 0 &&
              kiln_to_data(kiln_slice(x, 0, 0, 2, 1), xv, sizeof xv) == 0 && kiln_to_data(a, av, sizeof av) == 0,
          "where: read: %s", kiln_error());
    int wbad = -1;
    for (int i = 0; i < 2 * 517 && wbad < 0; i++)
        if (wv[i] != (bits[i % 517] ? xv[i] * av[i % 517] : -av[i % 517]))
            wbad = i;
    CHECK(wbad < 0, "where(mask per column, x * a, -a): element %d wrong", wbad);
    kiln_tensor_release(w);

    /* softmax and log-softmax over the last dim of a fused value join the group, and an
     * op after them too; the same bits as unfused */
    {
        kiln_tensor *sm[2], *ls[2];
        uint64_t s0 = fusion_calls_of(devs[0], "softmax");
        f0 = fusion_calls_of(devs[0], "fused");
        for (int d = 0; d < 2; d++) {
            kiln_generator g2 = kiln_generator_make(5);
            kiln_tensor *xd = kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(300, 517), -2, 2, &g2);
            kiln_tensor *ad = kiln_rand_uniform(devs[d], KILN_F32, KILN_SHAPE(517), -2, 2, &g2);
            kiln_device_sync(devs[d]);
            if (d == 0)
                f0 = fusion_calls_of(devs[0], "fused"), s0 = fusion_calls_of(devs[0], "softmax");
            kiln_scope_begin();
            sm[d] = kiln_keep(kiln_mul_scalar(kiln_softmax(kiln_mul(xd, ad), -1), 2.0));
            ls[d] = kiln_keep(kiln_log_softmax(kiln_add(xd, ad), -1));
            kiln_scope_end();
        }
        float *u = malloc(300 * 517 * sizeof(float)), *v = malloc(300 * 517 * sizeof(float));
        bool same = kiln_to_data(sm[0], u, 300 * 517 * sizeof(float)) == 0 &&
                    kiln_to_data(sm[1], v, 300 * 517 * sizeof(float)) == 0 &&
                    !memcmp(u, v, 300 * 517 * sizeof(float));
        CHECK(same, "softmax(x * a) * 2 fused equals unfused to the bit");
        same = kiln_to_data(ls[0], u, 300 * 517 * sizeof(float)) == 0 &&
               kiln_to_data(ls[1], v, 300 * 517 * sizeof(float)) == 0 && !memcmp(u, v, 300 * 517 * sizeof(float));
        CHECK(same, "log_softmax(x + a) fused equals unfused to the bit");
        /* both join one group: the rows have one length */
        CHECK(fusion_calls_of(devs[0], "softmax") == s0 && fusion_calls_of(devs[0], "fused") - f0 == 1,
              "both softmaxes ran inside fused groups (%llu softmax, %llu fused calls)",
              (unsigned long long)(fusion_calls_of(devs[0], "softmax") - s0),
              (unsigned long long)(fusion_calls_of(devs[0], "fused") - f0));
        free(u);
        free(v);
        for (int d = 0; d < 2; d++) {
            kiln_tensor_release(sm[d]);
            kiln_tensor_release(ls[d]);
        }
    }

    /* a mean over the last dim of a fused value: the reduction joins the group */
    uint64_t r0 = fusion_calls_of(devs[0], "reduce");
    f0 = fusion_calls_of(devs[0], "fused");
    kiln_scope_begin();
    kiln_tensor *m = kiln_keep(kiln_mean(kiln_square(kiln_sub(x, a)), KILN_DIMS(-1), false));
    kiln_scope_end();
    float got[300];
    CHECK(kiln_to_data(m, got, sizeof got) == 0, "mean: read: %s", kiln_error());
    CHECK(fusion_calls_of(devs[0], "fused") - f0 == 1 && fusion_calls_of(devs[0], "reduce") == r0,
          "mean((x - a)^2, -1) ran as one fused call with its reduction");
    float xs[300 * 517], as[517];
    kiln_to_data(x, xs, sizeof xs);
    kiln_to_data(a, as, sizeof as);
    double worst = 0;
    for (int r = 0; r < 300; r++) {
        double sum = 0;
        for (int j = 0; j < 517; j++) {
            float d = xs[r * 517 + j] - as[j];
            sum += (double)(d * d);
        }
        double want = sum / 517;
        worst = fmax(worst, fabs(got[r] - want) / want);
    }
    CHECK(worst < 1e-6, "fused mean of squares within 1e-6 of a double sum (%.3g)", worst);
    kiln_tensor_release(m);
    kiln_scope_end();
}

static void options(void)
{
    kiln_device *d = kiln_device_open("counting:cpu?fusion=on");
    CHECK(d && !strcmp(kiln_device_name(d), "counting:cpu?fusion=on"), "the device keeps its name (%s)",
          d ? kiln_device_name(d) : kiln_error());
    if (d) { /* large enough for the cpu's fusion_min_elements */
        kiln_scope_begin();
        kiln_tensor *x = kiln_full(d, KILN_F32, KILN_SHAPE(512, 512), 0.5);
        float v = 0;
        kiln_to_data(kiln_slice(kiln_reshape(kiln_relu(kiln_mul(kiln_add(x, x), x)), KILN_SHAPE(-1)), 0, 0, 1, 1),
                     &v, sizeof v);
        CHECK(v == 0.5f && fusion_calls_of(d, "fused") == 1, "fusion=on fuses (%g, %llu fused calls)", v,
              (unsigned long long)fusion_calls_of(d, "fused"));
        kiln_scope_end();
    }
    kiln_device_close(d);
    d = kiln_device_open("counting:cpu?fusion=off");
    if (d) {
        kiln_scope_begin();
        kiln_tensor *x = kiln_full(d, KILN_F32, KILN_SHAPE(64, 64), 0.5);
        float v = 0;
        kiln_to_data(kiln_slice(kiln_reshape(kiln_relu(kiln_mul(kiln_add(x, x), x)), KILN_SHAPE(-1)), 0, 0, 1, 1),
                     &v, sizeof v);
        CHECK(v == 0.5f && fusion_calls_of(d, "fused") == 0, "fusion=off does not fuse");
        kiln_scope_end();
    }
    kiln_device_close(d);
    /* small calls: unfused under the cpu's default bound, fused with min_elements=0 */
    for (int k = 0; k < 2; k++) {
        d = kiln_device_open(k ? "fused:counting:cpu?min_elements=0" : "fused:counting:cpu");
        CHECK(d != NULL, "open: %s", kiln_error());
        if (!d)
            continue;
        kiln_scope_begin();
        kiln_tensor *x = kiln_full(d, KILN_F32, KILN_SHAPE(64, 64), 0.5);
        float v = 0;
        /* (the device may be shared with the tests above: count from here) */
        uint64_t fused0 = fusion_calls_of(d, "fused"), binary0 = fusion_calls_of(d, "binary");
        kiln_to_data(kiln_slice(kiln_reshape(kiln_relu(kiln_mul(kiln_add(x, x), x)), KILN_SHAPE(-1)), 0, 0, 1, 1),
                     &v, sizeof v);
        uint64_t fused = fusion_calls_of(d, "fused") - fused0, binary = fusion_calls_of(d, "binary") - binary0;
        CHECK(v == 0.5f && fused == (uint64_t)k && binary == (k ? 0u : 2u),
              "%s: %g, %llu fused calls, %llu binary", k ? "min_elements=0" : "the default bound", v,
              (unsigned long long)fused, (unsigned long long)binary);
        kiln_scope_end();
        kiln_device_close(d);
    }
    d = kiln_device_open("fused:cpu?min_elements=-3");
    CHECK(!d && strstr(kiln_error(), "min_elements") && strstr(kiln_error(), "-3"),
          "a bad min_elements is refused naming the option: '%s'", kiln_error());
    d = kiln_device_open("cpu?fusion=maybe");
    CHECK(!d && strstr(kiln_error(), "fusion") && strstr(kiln_error(), "maybe"),
          "a bad fusion value is refused naming the option: '%s'", kiln_error());
    d = kiln_device_open("fused:cpu?codegen=sometimes");
    CHECK(!d && strstr(kiln_error(), "codegen"), "a bad codegen value is refused: '%s'", kiln_error());
    d = kiln_device_open("fused:nowhere");
    CHECK(!d && strstr(kiln_error(), "nowhere"), "an unknown inner spec is refused: '%s'", kiln_error());
    d = kiln_device_open("fused:cpu");
    kiln_device_counters c;
    CHECK(d && kiln_device_counters_get(d, &c, NULL, NULL) < 0 && strstr(kiln_error(), "counters"),
          "fused:cpu keeps no counters and says so: '%s'", kiln_error());
    kiln_device_close(d);
    /* codegen=off: the same results, no fused call */
    d = kiln_device_open("fused:counting:cpu?codegen=off&min_elements=0");
    CHECK(d != NULL, "fused:counting:cpu?codegen=off opens: %s", kiln_error());
    if (d) {
        kiln_scope_begin();
        kiln_tensor *x = kiln_full(d, KILN_F32, KILN_SHAPE(64, 64), 0.5);
        float v = 0;
        kiln_to_data(kiln_slice(kiln_reshape(kiln_relu(kiln_mul(kiln_add(x, x), x)), KILN_SHAPE(-1)), 0, 0, 1, 1),
                     &v, sizeof v);
        CHECK(v == 0.5f && fusion_calls_of(d, "fused") == 0, "codegen=off replays (%g, %llu fused calls)", v,
              (unsigned long long)fusion_calls_of(d, "fused"));
        kiln_scope_end();
        kiln_device_close(d);
    }
    /* the environment's default, which the spec overrides */
    setenv("KILN_CPU_FUSION", "on", 1);
    d = kiln_device_open("cpu?threads=1");
    CHECK(d && kiln__device_iface(d) == kiln_backend_fused(), "KILN_CPU_FUSION=on applies (%s)",
          d ? kiln_device_name(d) : kiln_error());
    kiln_device_close(d);
    d = kiln_device_open("cpu?threads=1&fusion=off");
    CHECK(d && kiln__device_iface(d) == kiln_backend_cpu(), "the spec's fusion=off wins over the environment");
    kiln_device_close(d);
    unsetenv("KILN_CPU_FUSION");
}

void test_graphs(void)
{
    const char *specs[NDEV] = {"fused:counting:cpu?min_elements=0", "counting:cpu", "ref"};
    for (int d = 0; d < NDEV; d++) {
        devs[d] = kiln_device_open(specs[d]);
        CHECK(devs[d] != NULL, "open %s: %s", specs[d], kiln_error());
        if (!devs[d])
            return;
    }
    for (int seed = 0; seed < 40; seed++)
        random_graph(seed);
    chain_counts();
    options();
    for (int d = 0; d < NDEV; d++)
        kiln_device_close(devs[d]);
}
