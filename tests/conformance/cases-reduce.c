/*
 * tests/conformance/cases-reduce.c — reductions over one and several dims (with and
 * without keepdim), argmax/argmin, cumsum, sort/argsort/topk, and the indexing ops
 * (gather, scatter, scatter_add, index_select, slice_assign, one_hot, embedding).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "conformance.h"

static int one(kiln_tensor **out, kiln_tensor *t)
{
    out[0] = t;
    return t ? 1 : -1;
}

static const kiln_dtype float_dt[4] = {KILN_F32, KILN_F64, KILN_F16, KILN_BF16};
static const kiln_dtype int_dt[3] = {KILN_I64, KILN_I32, KILN_U8};

/* ------------------------------------------------------------ reductions */

enum { R_SUM, R_MEAN, R_PROD, R_MAX, R_MIN, R_VAR, R_STD, R_LSE, R_NORM, R_ANY, R_ALL, R_COUNT };
static const char *rnames[R_COUNT] = {"sum", "mean", "prod", "max", "min", "var",
                                      "std", "logsumexp", "norm", "any", "all"};

static int b_reduce(const conf_case *c, kiln_device *dev, kiln_tensor **in, kiln_tensor **out)
{
    int dims[KILN_MAX_DIMS];
    int nd = (int)c->p[1];
    for (int i = 0; i < nd; i++)
        dims[i] = (int)c->p[2 + i];
    const int *dp = nd ? dims : NULL;
    bool keep = c->p[10] != 0;
    kiln_tensor *x = in[0];
    switch (c->p[0]) {
    case R_SUM: return one(out, kiln_sum(x, nd, dp, keep));
    case R_MEAN: return one(out, kiln_mean(x, nd, dp, keep));
    case R_PROD: return one(out, kiln_prod(x, nd, dp, keep));
    case R_MAX: return one(out, kiln_max(x, nd, dp, keep));
    case R_MIN: return one(out, kiln_min(x, nd, dp, keep));
    case R_VAR: return one(out, kiln_var(x, nd, dp, c->d[0], keep));
    case R_STD: return one(out, kiln_std(x, nd, dp, c->d[0], keep));
    case R_LSE: return one(out, kiln_logsumexp(x, nd, dp, keep));
    case R_NORM: return one(out, kiln_norm(x, c->d[0], nd, dp, keep));
    case R_ANY: return one(out, kiln_any(x, nd, dp, keep));
    case R_ALL: return one(out, kiln_all(x, nd, dp, keep));
    }
    return -1;
}

typedef struct rdims {
    int n;
    int d[3];
} rdims;

static void reduce_case(int op, kiln_dtype dt, int ndim, const int64_t *shape, conf_view v, rdims rd,
                        bool keep, double param, conf_gen g)
{
    conf_case c = conf_make(rnames[op], dt, b_reduce);
    c.p[0] = op;
    c.p[1] = rd.n;
    for (int i = 0; i < rd.n; i++)
        c.p[2 + i] = rd.d[i];
    c.p[10] = keep;
    c.d[0] = param;
    double lo = -3, hi = 3;
    if (op == R_PROD) {
        lo = 0.6;
        hi = 1.5;
    }
    if (op == R_ANY || op == R_ALL) {
        lo = 0;
        hi = 2; /* ints 0/1, more likely to be all-true along short dims */
        g = dt == KILN_BOOL ? G_BOOL : G_INT;
    }
    if (!kiln_dtype_is_float(dt) && g != G_BOOL) {
        g = G_INT;
        lo = dt == KILN_U8 ? 0 : -5;
        hi = op == R_PROD ? 3 : 9;
        if (op == R_PROD && dt != KILN_U8)
            lo = -2;
    }
    conf_in(&c, -1, ndim, shape, g, lo, hi, v);
    if (op != R_MAX && op != R_MIN && op != R_ANY && op != R_ALL) {
        c.tol = TOL_NMSE;
        if (dt == KILN_F16 || dt == KILN_BF16) { /* results are rounded to 8 or 11 bits */
            c.tol = TOL_REL;
            c.tol_a = dt == KILN_F16 ? 2e-3 : 1.6e-2;
            c.tol_b = op == R_SUM || op == R_MEAN ? 0.05 : 1e-3;
        }
    } else {
        c.tol = TOL_EXACT;
    }
    char dims[40] = "all";
    if (rd.n) {
        int n = snprintf(dims, sizeof dims, "(");
        for (int i = 0; i < rd.n; i++)
            n += snprintf(dims + n, sizeof dims - (size_t)n, i ? ", %d" : "%d", rd.d[i]);
        snprintf(dims + n, sizeof dims - (size_t)n, ")");
    }
    conf_push(&c, "dims %s%s%s param %g", dims, keep ? " keepdim" : "",
              g == G_SPECIAL ? " with NaN/Inf" : "", param);
}

static int b_arg(const conf_case *c, kiln_device *dev, kiln_tensor **in, kiln_tensor **out)
{
    kiln_tensor *x = in[0];
    int dim = (int)c->p[1];
    switch (c->p[0]) {
    case 0: return one(out, kiln_argmax(x, dim, c->p[2] != 0));
    case 1: return one(out, kiln_argmin(x, dim, c->p[2] != 0));
    case 2: return one(out, kiln_cumsum(x, dim));
    case 3: {
        kiln_tensor *v = NULL, *idx = NULL;
        if (kiln_sort(x, dim, c->p[2] != 0, &v, &idx) < 0)
            return -1;
        out[0] = v;
        out[1] = idx;
        kiln_tensor *v2 = NULL;
        if (kiln_sort(x, dim, c->p[2] != 0, &v2, NULL) < 0) /* indices optional */
            return -1;
        out[2] = v2;
        return 3;
    }
    case 4: return one(out, kiln_argsort(x, dim, c->p[2] != 0));
    case 5: {
        kiln_tensor *v = NULL, *idx = NULL;
        if (kiln_topk(x, c->p[3], dim, c->p[2] != 0, &v, &idx) < 0)
            return -1;
        out[0] = v;
        out[1] = idx;
        return 2;
    }
    }
    return -1;
}

static void arg_case(const char *name, int kind, kiln_dtype dt, int ndim, const int64_t *shape,
                     conf_view v, int dim, int flag, int64_t k, conf_gen g, double lo, double hi)
{
    conf_case c = conf_make(name, dt, b_arg);
    c.p[0] = kind;
    c.p[1] = dim;
    c.p[2] = flag;
    c.p[3] = k;
    conf_in(&c, -1, ndim, shape, g, lo, hi, v);
    c.tol = kind == 2 ? TOL_NMSE : TOL_EXACT;
    if (kind == 2 && (dt == KILN_F16 || dt == KILN_BF16)) {
        c.tol = TOL_REL;
        c.tol_a = dt == KILN_F16 ? 4e-3 : 3e-2;
        c.tol_b = 0.05;
    }
    conf_push(&c, "dim %d %s%s k %lld", dim,
              kind <= 1 || kind == 5 ? (flag ? "keepdim/largest" : "") : (flag ? "descending" : ""),
              g == G_INT ? " with ties" : "", (long long)k);
}

void conf_cases_reduce(void)
{
    static const rdims dsets[] = {{0, {0}}, {1, {0}}, {1, {-1}}, {2, {0, 2}}, {1, {1}}, {3, {0, 1, 2}}};
    for (int op = 0; op < R_COUNT; op++) {
        double param = op == R_VAR || op == R_STD ? 1 : op == R_NORM ? 2 : 0;
        for (int s = 0; s < 6; s++)
            for (int keep = 0; keep < 2; keep++)
                reduce_case(op, KILN_F32, KILN_SHAPE(5, 7, 11), V_NONE, dsets[s], keep, param, G_UNI);
        reduce_case(op, KILN_F32, KILN_SHAPE(64, 333), V_NONE, (rdims){1, {1}}, false, param, G_UNI);
        reduce_case(op, KILN_F32, KILN_SHAPE(333, 64), V_NONE, (rdims){1, {0}}, false, param, G_UNI);
        reduce_case(op, KILN_F32, KILN_SHAPE(1000, 513), V_NONE, (rdims){1, {1}}, false, param, G_UNI);
        reduce_case(op, KILN_F32, KILN_SHAPE(1000, 513), V_NONE, (rdims){1, {0}}, true, param, G_UNI);
        reduce_case(op, KILN_F32, KILN_SHAPE(513, 1000), V_T, (rdims){0, {0}}, false, param, G_UNI);
        reduce_case(op, KILN_F32, KILN_SHAPE(6, 9, 10), V_T, (rdims){1, {-1}}, true, param, G_UNI);
        reduce_case(op, KILN_F32, KILN_SHAPE(6, 9, 10), V_STEP, (rdims){2, {0, -1}}, false, param, G_UNI);
        reduce_case(op, KILN_F32, KILN_SHAPE(6, 9, 10), V_FLIP, (rdims){1, {1}}, false, param, G_UNI);
        reduce_case(op, KILN_F32, KILN_SHAPE(5, 1, 4, 3), V_EXPAND, (rdims){1, {0}}, false, param, G_UNI);
        reduce_case(op, KILN_F32, KILN_SHAPE(2, 3, 4, 5), V_PERM, (rdims){2, {1, 3}}, true, param, G_UNI);
        reduce_case(op, KILN_F32, KILN_SHAPE(1, 1), V_NONE, (rdims){0, {0}}, false, param, G_UNI);
        reduce_case(op, KILN_F32, KILN_SHAPE(7, 9), V_NONE, (rdims){1, {1}}, false, param, G_SPECIAL);
        if (op != R_MAX && op != R_MIN) /* reducing an empty dim: identity (max/min are errors) */
            reduce_case(op, KILN_F32, KILN_SHAPE(0, 5), V_NONE, (rdims){1, {0}}, false, param, G_UNI);
        reduce_case(op, KILN_F32, KILN_SHAPE(0, 5), V_NONE, (rdims){1, {1}}, true, param, G_UNI);
        for (int i = 1; i < 4; i++) {
            reduce_case(op, float_dt[i], KILN_SHAPE(5, 7, 11), V_NONE, (rdims){2, {0, 2}}, false, param, G_UNI);
            reduce_case(op, float_dt[i], KILN_SHAPE(6, 40), V_T, (rdims){0, {0}}, false, param, G_UNI);
        }
        if (op == R_SUM || op == R_PROD || op == R_MAX || op == R_MIN || op == R_ANY || op == R_ALL ||
            op == R_MEAN)
            for (int i = 0; i < 3; i++) {
                if (op == R_MEAN) /* mean of integers is an error in PyTorch; skip */
                    break;
                reduce_case(op, int_dt[i], KILN_SHAPE(5, 7, 11), V_NONE, (rdims){1, {1}}, false, param, G_INT);
                reduce_case(op, int_dt[i], KILN_SHAPE(6, 9), V_T, (rdims){0, {0}}, true, param, G_INT);
            }
        if (op == R_ANY || op == R_ALL) {
            reduce_case(op, KILN_BOOL, KILN_SHAPE(5, 3, 2), V_NONE, (rdims){1, {2}}, false, param, G_BOOL);
            reduce_case(op, KILN_BOOL, KILN_SHAPE(5, 3, 2), V_T, (rdims){0, {0}}, false, param, G_BOOL);
        }
    }
    /* mean, var and std of large integers: computed in f64 (an f32 copy holds integers only
     * to 2^24), the result f32 */
    static const int stat_ops[] = {R_MEAN, R_VAR, R_STD};
    for (int k = 0; k < 3; k++) {
        int op = stat_ops[k];
        for (int i = 0; i < 2; i++) {
            kiln_dtype dt = i ? KILN_I32 : KILN_I64;
            conf_case c = conf_make(rnames[op], dt, b_reduce);
            c.p[0] = op;
            c.p[1] = 1;
            c.p[2] = 1;
            c.d[0] = op == R_MEAN ? 0 : 1;
            c.tol = TOL_REL;
            c.tol_a = 2e-7;
            double base = i ? 1073741824.0 : 1099511627776.0; /* 2^30, 2^40 */
            conf_in(&c, -1, KILN_SHAPE(7, 301), G_INT, base, base + 1000, V_NONE);
            conf_push(&c, "dims (1) of integers near %g", base);
        }
    }
    /* The cpu backend's [A, K, B] f32 path (kept dims one block in the middle): batch-norm
     * statistics over N, H, W; bias gradients over rows; a unit dim inside the kept block;
     * runs shorter and longer than its 8 lanes and chunks of 256 outputs; NaN/Inf. */
    static const int ak_ops[] = {R_SUM, R_MEAN, R_VAR, R_STD};
    for (int i = 0; i < 4; i++) {
        int op = ak_ops[i];
        double param = op == R_VAR || op == R_STD ? 1 : 0;
        reduce_case(op, KILN_F32, KILN_SHAPE(8, 13, 5, 7), V_NONE, (rdims){3, {0, 2, 3}}, true, param, G_UNI);
        reduce_case(op, KILN_F32, KILN_SHAPE(3, 33, 1, 3), V_NONE, (rdims){2, {0, 3}}, false, param, G_UNI);
        reduce_case(op, KILN_F32, KILN_SHAPE(2, 9, 1, 4, 19), V_NONE, (rdims){2, {0, 4}}, false, param, G_UNI);
        reduce_case(op, KILN_F32, KILN_SHAPE(37, 600), V_NONE, (rdims){1, {0}}, false, param, G_UNI);
        reduce_case(op, KILN_F32, KILN_SHAPE(4, 5, 3), V_NONE, (rdims){2, {0, 1}}, true, param, G_UNI);
        reduce_case(op, KILN_F32, KILN_SHAPE(7, 3, 9), V_NONE, (rdims){2, {0, 2}}, false, param, G_SPECIAL);
        reduce_case(op, KILN_F32, KILN_SHAPE(9, 40), V_NONE, (rdims){1, {0}}, false, param, G_SPECIAL);
    }
    reduce_case(R_VAR, KILN_F32, KILN_SHAPE(6, 12, 4, 4), V_NONE, (rdims){3, {0, 2, 3}}, false, 0, G_UNI);
    /* var/std corrections and norm orders */
    static const double corr[] = {0, 2};
    for (int i = 0; i < 2; i++) {
        reduce_case(R_VAR, KILN_F32, KILN_SHAPE(5, 7, 11), V_NONE, (rdims){1, {1}}, true, corr[i], G_UNI);
        reduce_case(R_STD, KILN_F64, KILN_SHAPE(5, 7, 11), V_T, (rdims){2, {0, 1}}, false, corr[i], G_UNI);
    }
    static const double ps[] = {1, 3, INFINITY, 0.5};
    for (int i = 0; i < 4; i++) {
        reduce_case(R_NORM, KILN_F32, KILN_SHAPE(5, 7, 11), V_NONE, (rdims){1, {-1}}, false, ps[i], G_UNI);
        reduce_case(R_NORM, KILN_F32, KILN_SHAPE(6, 9, 10), V_STEP, (rdims){0, {0}}, false, ps[i], G_UNI);
    }
    /* logsumexp on large values (must not overflow) */
    reduce_case(R_LSE, KILN_F32, KILN_SHAPE(8, 100), V_NONE, (rdims){1, {1}}, false, 0, G_UNI);
    {
        conf_case c = conf_make("logsumexp", KILN_F32, b_reduce);
        c.p[0] = R_LSE;
        c.p[1] = 1;
        c.p[2] = -1;
        conf_in(&c, -1, KILN_SHAPE(8, 100), G_UNI, 500, 1000, V_NONE);
        c.tol = TOL_NMSE;
        conf_push(&c, "values 500..1000");
    }

    /* argmax/argmin (first index on ties), cumsum, sort, argsort, topk */
    for (int kind = 0; kind < 2; kind++) {
        const char *nm = kind ? "argmin" : "argmax";
        for (int keep = 0; keep < 2; keep++) {
            arg_case(nm, kind, KILN_F32, KILN_SHAPE(5, 7, 11), V_NONE, 1, keep, 0, G_UNI, -3, 3);
            arg_case(nm, kind, KILN_F32, KILN_SHAPE(5, 7, 11), V_NONE, -1, keep, 0, G_INT, -3, 3);
        }
        arg_case(nm, kind, KILN_F32, KILN_SHAPE(33, 400), V_NONE, 1, 0, 0, G_UNI, -3, 3);
        arg_case(nm, kind, KILN_F32, KILN_SHAPE(9, 10), V_T, 0, 0, 0, G_UNI, -3, 3);
        arg_case(nm, kind, KILN_F32, KILN_SHAPE(9, 10), V_FLIP, 1, 0, 0, G_INT, -3, 3);
        arg_case(nm, kind, KILN_F32, KILN_SHAPE(7, 9), V_NONE, 1, 0, 0, G_SPECIAL, -3, 3);
        for (int i = 1; i < 4; i++)
            arg_case(nm, kind, float_dt[i], KILN_SHAPE(6, 9, 10), V_NONE, 2, 0, 0, G_INT, -20, 20);
        for (int i = 0; i < 3; i++)
            arg_case(nm, kind, int_dt[i], KILN_SHAPE(6, 9, 10), V_STEP, 1, 1, 0, G_INT, 0, 20);
    }
    arg_case("cumsum", 2, KILN_F32, KILN_SHAPE(5, 7, 11), V_NONE, 0, 0, 0, G_UNI, -3, 3);
    arg_case("cumsum", 2, KILN_F32, KILN_SHAPE(5, 7, 11), V_NONE, -1, 0, 0, G_UNI, -3, 3);
    arg_case("cumsum", 2, KILN_F32, KILN_SHAPE(4, 1000), V_NONE, 1, 0, 0, G_UNI, -3, 3);
    arg_case("cumsum", 2, KILN_F32, KILN_SHAPE(300, 517), V_NONE, 0, 0, 0, G_UNI, -3, 3);
    arg_case("argmax", 0, KILN_F32, KILN_SHAPE(300, 517), V_NONE, 0, 0, 0, G_UNI, -3, 3);
    arg_case("sort", 3, KILN_F32, KILN_SHAPE(64, 1031), V_NONE, 1, 0, 0, G_INT, -100, 100);
    arg_case("cumsum", 2, KILN_F32, KILN_SHAPE(9, 10), V_T, 1, 0, 0, G_UNI, -3, 3);
    arg_case("cumsum", 2, KILN_F32, KILN_SHAPE(9, 10), V_FLIP, 0, 0, 0, G_UNI, -3, 3);
    arg_case("cumsum", 2, KILN_F32, KILN_SHAPE(0, 3), V_NONE, 0, 0, 0, G_UNI, -3, 3);
    for (int i = 1; i < 4; i++)
        arg_case("cumsum", 2, float_dt[i], KILN_SHAPE(6, 30), V_NONE, 1, 0, 0, G_UNI, -3, 3);
    for (int i = 0; i < 3; i++)
        arg_case("cumsum", 2, int_dt[i], KILN_SHAPE(6, 30), V_STEP, 1, 0, 0, G_INT, 0, 9);
    for (int desc = 0; desc < 2; desc++) {
        arg_case("sort", 3, KILN_F32, KILN_SHAPE(5, 7, 11), V_NONE, -1, desc, 0, G_UNI, -3, 3);
        arg_case("sort", 3, KILN_F32, KILN_SHAPE(5, 7, 11), V_NONE, 1, desc, 0, G_INT, -3, 3);
        arg_case("sort", 3, KILN_F32, KILN_SHAPE(3, 700), V_NONE, 1, desc, 0, G_INT, -50, 50);
        arg_case("sort", 3, KILN_F32, KILN_SHAPE(9, 10), V_T, 0, desc, 0, G_UNI, -3, 3);
        arg_case("sort", 3, KILN_F32, KILN_SHAPE(7, 9), V_NONE, 1, desc, 0, G_SPECIAL, -3, 3);
        for (int i = 1; i < 4; i++)
            arg_case("sort", 3, float_dt[i], KILN_SHAPE(6, 20), V_STEP, 1, desc, 0, G_INT, -10, 10);
        for (int i = 0; i < 3; i++)
            arg_case("sort", 3, int_dt[i], KILN_SHAPE(6, 20), V_NONE, 1, desc, 0, G_INT, 0, 10);
        arg_case("argsort", 4, KILN_F32, KILN_SHAPE(5, 7, 11), V_FLIP, 1, desc, 0, G_INT, -3, 3);
        arg_case("argsort", 4, KILN_I64, KILN_SHAPE(5, 70), V_NONE, -1, desc, 0, G_INT, -3, 3);
        for (int k = 0; k < 4; k++) {
            static const int64_t ks[] = {1, 3, 11, 0};
            arg_case("topk", 5, KILN_F32, KILN_SHAPE(5, 7, 11), V_NONE, -1, desc, ks[k], G_DISTINCT, 0.25, 40);
        }
        arg_case("topk", 5, KILN_F32, KILN_SHAPE(5, 7, 11), V_T, 1, desc, 4, G_DISTINCT, 0.5, 100);
        arg_case("topk", 5, KILN_F32, KILN_SHAPE(4, 1000), V_NONE, 1, desc, 10, G_DISTINCT, 0.01, 20);
        arg_case("topk", 5, KILN_F64, KILN_SHAPE(6, 50), V_NONE, 1, desc, 5, G_DISTINCT, 0.5, 10);
        arg_case("topk", 5, KILN_I32, KILN_SHAPE(6, 50), V_NONE, 1, desc, 5, G_DISTINCT, 1, 100);
        arg_case("topk", 5, KILN_F16, KILN_SHAPE(6, 20), V_NONE, 1, desc, 5, G_DISTINCT, 1, 60);
        arg_case("topk", 5, KILN_BF16, KILN_SHAPE(6, 20), V_NONE, 1, desc, 5, G_DISTINCT, 1, 60);
    }
}

/* -------------------------------------------------------------- indexing */

static int b_index(const conf_case *c, kiln_device *dev, kiln_tensor **in, kiln_tensor **out)
{
    int dim = (int)c->p[1];
    switch (c->p[0]) {
    case 0: return one(out, kiln_gather(in[0], dim, in[1]));
    case 1: return one(out, kiln_scatter(in[0], dim, in[1], in[2]));
    case 2: return one(out, kiln_scatter_add(in[0], dim, in[1], in[2]));
    case 3: return one(out, kiln_index_select(in[0], dim, in[1]));
    case 4: return one(out, kiln_slice_assign(in[0], dim, c->p[2], c->p[3], c->p[4], in[1]));
    case 5: return one(out, kiln_one_hot(in[0], c->p[2], (kiln_dtype)c->p[3]));
    case 6: return one(out, kiln_embedding(in[0], in[1]));
    }
    return -1;
}

static conf_case index_case(const char *name, int kind, kiln_dtype dt, int dim)
{
    conf_case c = conf_make(name, dt, b_index);
    c.p[0] = kind;
    c.p[1] = dim;
    c.tol = TOL_EXACT;
    return c;
}

void conf_cases_index(void)
{
    static const kiln_dtype dts[] = {KILN_F32, KILN_F64, KILN_F16, KILN_BF16, KILN_I64, KILN_I32, KILN_U8, KILN_BOOL};
    for (int i = 0; i < 8; i++) {
        kiln_dtype dt = dts[i];
        conf_gen g = dt == KILN_BOOL ? G_BOOL : G_UNI;
        bool main_dt = dt == KILN_F32;
        conf_case c;
        /* gather */
        c = index_case("gather", 0, dt, 0);
        conf_in(&c, -1, KILN_SHAPE(5, 7), g, 0, 50, V_NONE);
        conf_in(&c, KILN_I64, KILN_SHAPE(4, 7), G_INT, 0, 5, V_NONE);
        conf_push(&c, "dim 0");
        c = index_case("gather", 0, dt, 1);
        conf_in(&c, -1, KILN_SHAPE(5, 7), g, 0, 50, main_dt ? V_T : V_NONE);
        conf_in(&c, KILN_I64, KILN_SHAPE(3, 9), G_INT, 0, 7, V_NONE);
        conf_push(&c, "dim 1, smaller leading index dim, repeated indices");
        if (main_dt) {
            c = index_case("gather", 0, dt, -1);
            conf_in(&c, -1, KILN_SHAPE(4, 5, 6), g, 0, 50, V_FLIP);
            conf_in(&c, KILN_I64, KILN_SHAPE(4, 5, 10), G_INT, 0, 6, V_STEP);
            conf_push(&c, "dim -1");
        }
        /* scatter (distinct targets) and scatter_add (duplicates accumulate) */
        c = index_case("scatter", 1, dt, 0);
        conf_in(&c, -1, KILN_SHAPE(6, 5), g, 0, 50, main_dt ? V_T : V_NONE);
        conf_in(&c, KILN_I64, KILN_SHAPE(4, 5), G_UIDX, 0, 6, V_NONE);
        conf_in(&c, -1, KILN_SHAPE(4, 5), g, 0, 50, V_NONE);
        conf_push(&c, "dim 0");
        c = index_case("scatter", 1, dt, 1);
        conf_in(&c, -1, KILN_SHAPE(5, 8), g, 0, 50, V_NONE);
        conf_in(&c, KILN_I64, KILN_SHAPE(3, 4), G_UIDX, 1, 8, V_NONE);
        conf_in(&c, -1, KILN_SHAPE(5, 6), g, 0, 50, main_dt ? V_STEP : V_NONE);
        conf_push(&c, "dim 1, src larger than index");
        if (dt != KILN_BOOL) {
            c = index_case("scatter_add", 2, dt, 0);
            conf_in(&c, -1, KILN_SHAPE(6, 5), G_INT, 0, 9, V_NONE);
            conf_in(&c, KILN_I64, KILN_SHAPE(9, 5), G_INT, 0, 6, V_NONE);
            conf_in(&c, -1, KILN_SHAPE(9, 5), G_INT, 0, 9, main_dt ? V_T : V_NONE);
            conf_push(&c, "dim 0, duplicates");
            c = index_case("scatter_add", 2, dt, -1);
            conf_in(&c, -1, KILN_SHAPE(3, 4, 6), g, -5, 5, V_NONE);
            conf_in(&c, KILN_I64, KILN_SHAPE(3, 4, 10), G_INT, 0, 6, V_NONE);
            conf_in(&c, -1, KILN_SHAPE(3, 4, 10), g, -5, 5, V_NONE);
            c.tol = kiln_dtype_is_float(dt) ? TOL_REL : TOL_EXACT;
            c.tol_a = 1e-5;
            c.tol_b = 1e-5;
            conf_push(&c, "dim -1, duplicates");
        }
        /* index_select */
        c = index_case("index_select", 3, dt, 0);
        conf_in(&c, -1, KILN_SHAPE(6, 5), g, 0, 50, main_dt ? V_T : V_NONE);
        conf_in(&c, KILN_I64, KILN_SHAPE(9), G_INT, 0, 6, V_NONE);
        conf_push(&c, "dim 0, repeats");
        c = index_case("index_select", 3, dt, 1);
        conf_in(&c, -1, KILN_SHAPE(4, 6, 5), g, 0, 50, V_NONE);
        conf_in(&c, KILN_I32, KILN_SHAPE(3), G_INT, 0, 6, V_NONE);
        conf_push(&c, "dim 1, i32 index");
        c = index_case("index_select", 3, dt, 1);
        conf_in(&c, -1, KILN_SHAPE(4, 6), g, 0, 50, V_NONE);
        conf_in(&c, KILN_I64, KILN_SHAPE(0), G_INT, 0, 6, V_NONE);
        conf_push(&c, "empty index");
        /* slice_assign */
        c = index_case("slice_assign", 4, dt, 1);
        c.p[2] = 1;
        c.p[3] = 9;
        c.p[4] = 3;
        conf_in(&c, -1, KILN_SHAPE(5, 10), g, 0, 50, V_NONE);
        conf_in(&c, -1, KILN_SHAPE(5, 3), g, 0, 50, main_dt ? V_T : V_NONE);
        conf_push(&c, "[1:9:3] of dim 1");
        c = index_case("slice_assign", 4, dt, 0);
        c.p[2] = -3;
        c.p[3] = 100;
        c.p[4] = 1;
        conf_in(&c, -1, KILN_SHAPE(7, 4), g, 0, 50, main_dt ? V_STEP : V_NONE);
        conf_in(&c, -1, KILN_SHAPE(4), g, 0, 50, V_NONE);
        conf_push(&c, "[-3:] of dim 0, broadcast src");
    }
    /* one_hot and embedding */
    static const kiln_dtype oh_dt[] = {KILN_I64, KILN_F32, KILN_BOOL, KILN_U8};
    for (int i = 0; i < 4; i++) {
        conf_case c = index_case("one_hot", 5, KILN_I64, 0);
        c.p[2] = 7;
        c.p[3] = oh_dt[i];
        conf_in(&c, KILN_I64, KILN_SHAPE(3, 5), G_INT, 0, 7, i == 1 ? V_T : V_NONE);
        conf_push(&c, "7 classes -> %s", kiln_dtype_name(oh_dt[i]));
    }
    {
        conf_case c = index_case("one_hot", 5, KILN_I32, 0);
        c.p[2] = 4;
        c.p[3] = KILN_F32;
        conf_in(&c, KILN_I32, KILN_SHAPE(6), G_INT, 0, 4, V_NONE);
        conf_push(&c, "i32 classes");
    }
    for (int i = 0; i < 4; i++) {
        conf_case c = index_case("embedding", 6, float_dt[i], 0);
        conf_in(&c, -1, KILN_SHAPE(11, 6), G_UNI, -2, 2, i == 0 ? V_T : V_NONE);
        conf_in(&c, KILN_I64, KILN_SHAPE(3, 4), G_INT, 0, 11, V_NONE);
        conf_push(&c, NULL);
    }
    {
        conf_case c = index_case("embedding", 6, KILN_F32, 0);
        conf_in(&c, -1, KILN_SHAPE(50, 16), G_UNI, -2, 2, V_NONE);
        conf_in(&c, KILN_I32, KILN_SHAPE(2, 3, 4), G_INT, 0, 50, V_FLIP);
        conf_push(&c, "i32 indices, 3-D");
        c = index_case("embedding", 6, KILN_F32, 0);
        conf_in(&c, -1, KILN_SHAPE(50, 16), G_UNI, -2, 2, V_NONE);
        conf_in(&c, KILN_I64, 0, NULL, G_INT, 0, 50, V_NONE);
        conf_push(&c, "0-d index");
    }
}
