/*
 * tests/conformance/cases-basic.c — creation (including the counter-based random
 * draws), shape and view ops, casts, and every unary and binary elementwise op.
 */
#include <math.h>
#include <string.h>

#include "conformance.h"

#define ALL_DT_COUNT 8
static const kiln_dtype all_dt[ALL_DT_COUNT] = {KILN_F32, KILN_F64, KILN_F16, KILN_BF16,
                                                KILN_I64, KILN_I32, KILN_U8,  KILN_BOOL};
static const kiln_dtype float_dt[4] = {KILN_F32, KILN_F64, KILN_F16, KILN_BF16};

static int one(kiln_tensor **out, kiln_tensor *t)
{
    out[0] = t;
    return t ? 1 : -1;
}

/* ------------------------------------------------------------------ creation */

static const int64_t cshape[] = {5, 7, 3};

static int b_create(const conf_case *c, kiln_device *dev, kiln_tensor **in, kiln_tensor **out)
{
    switch (c->p[0]) {
    case 0: return one(out, kiln_zeros(dev, c->dt, 3, cshape));
    case 1: return one(out, kiln_ones(dev, c->dt, 3, cshape));
    case 2: return one(out, kiln_full(dev, c->dt, 3, cshape, c->d[0]));
    case 3: return one(out, kiln_arange(dev, c->dt, c->d[0], c->d[1], c->d[2]));
    case 4: return one(out, kiln_linspace(dev, c->dt, c->d[0], c->d[1], c->p[1]));
    case 5: return one(out, kiln_eye(dev, c->dt, c->p[1], c->p[2]));
    case 6: return one(out, kiln_full_like(kiln_empty(dev, c->dt, 3, cshape), c->d[0]));
    case 7: return one(out, kiln_zeros_like(in[0]));
    case 8: return one(out, kiln_ones_like(in[0]));
    case 9: return one(out, kiln_full_like(in[0], c->d[0]));
    case 10: return one(out, kiln_clone(in[0])); /* upload + download round trip */
    case 11: { /* kiln_item on a one-element tensor */
        double v = kiln_item(in[0]);
        return one(out, kiln_from_data(dev, KILN_F64, KILN_SHAPE(1), &v, sizeof v));
    }
    }
    return -1;
}

static int b_rand(const conf_case *c, kiln_device *dev, kiln_tensor **in, kiln_tensor **out)
{
    kiln_generator g = kiln_generator_make((uint64_t)c->p[1]);
    g.offset = (uint64_t)c->p[2];
    const int64_t shape[] = {c->p[3], c->p[4]};
    for (int draw = 0; draw < 2; draw++) {
        kiln_tensor *t = NULL;
        switch (c->p[0]) {
        case 0: t = kiln_rand_uniform(dev, c->dt, 2, shape, c->d[0], c->d[1], &g); break;
        case 1: t = kiln_rand_normal(dev, c->dt, 2, shape, c->d[0], c->d[1], &g); break;
        case 2: t = kiln_rand_bernoulli(dev, c->dt, 2, shape, c->d[0], &g); break;
        case 3: t = kiln_rand_int(dev, c->dt, 2, shape, (int64_t)c->d[0], (int64_t)c->d[1], &g); break;
        }
        if (!t)
            return -1;
        out[draw] = t;
    }
    int64_t state[2] = {(int64_t)g.seed, (int64_t)g.offset};
    out[2] = kiln_from_data(dev, KILN_I64, KILN_SHAPE(2), state, sizeof state);
    return out[2] ? 3 : -1;
}

void conf_cases_create(void)
{
    static const char *names[] = {"zeros", "ones", "full", "arange", "linspace", "eye", "empty",
                                  "zeros_like", "ones_like", "full_like", "from_data", "item"};
    for (int i = 0; i < ALL_DT_COUNT; i++) {
        kiln_dtype dt = all_dt[i];
        for (int k = 0; k < 3; k++) {
            conf_case c = conf_make(names[k], dt, b_create);
            c.p[0] = k;
            c.d[0] = dt == KILN_BOOL ? 1 : 7;
            c.tol = TOL_EXACT;
            conf_push(&c, NULL);
        }
        conf_case c = conf_make("empty", dt, b_create);
        c.p[0] = 6;
        c.d[0] = 1;
        c.tol = TOL_EXACT;
        conf_push(&c, "then full_like");
        for (int k = 7; k <= 10; k++) {
            c = conf_make(names[k], dt, b_create);
            c.p[0] = k;
            c.d[0] = dt == KILN_BOOL ? 1 : 3;
            c.tol = TOL_EXACT;
            conf_in(&c, -1, KILN_SHAPE(4, 6), dt == KILN_BOOL ? G_BOOL : G_INT, 0, 100, k == 10 ? V_NONE : V_T);
            conf_push(&c, NULL);
        }
        c = conf_make("item", dt, b_create);
        c.p[0] = 11;
        c.tol = TOL_EXACT;
        conf_in(&c, -1, KILN_SHAPE(1, 1), dt == KILN_BOOL ? G_BOOL : G_INT, 1, 100, V_NONE);
        conf_push(&c, NULL);
        if (dt == KILN_BOOL || dt == KILN_U8)
            continue;
        static const double ar[][3] = {{0, 10, 1}, {-3, 5, 0.5}, {10, 0, -3}, {0, 0, 1}, {1, 2, 0.25}};
        for (int k = 0; k < 5; k++) {
            if (!kiln_dtype_is_float(dt) && (k == 1 || k == 4))
                continue;
            c = conf_make("arange", dt, b_create);
            c.p[0] = 3;
            memcpy(c.d, ar[k], sizeof ar[k]);
            c.tol = TOL_REL;
            c.tol_a = 1e-6;
            conf_push(&c, "(%g, %g, %g)", ar[k][0], ar[k][1], ar[k][2]);
        }
        static const double ls[][3] = {{0, 1, 7}, {-5, 5, 1}, {2, 2, 0}, {-1, 3, 33}};
        for (int k = 0; k < 4; k++) {
            if (!kiln_dtype_is_float(dt) && k != 1)
                continue;
            c = conf_make("linspace", dt, b_create);
            c.p[0] = 4;
            c.d[0] = ls[k][0];
            c.d[1] = ls[k][1];
            c.p[1] = (int64_t)ls[k][2];
            c.tol = TOL_REL;
            c.tol_a = 1e-6;
            c.tol_b = 1e-6;
            conf_push(&c, "(%g, %g, %g)", ls[k][0], ls[k][1], ls[k][2]);
        }
        static const int64_t ey[][2] = {{4, 4}, {3, 5}, {0, 3}, {6, 2}};
        for (int k = 0; k < 4; k++) {
            c = conf_make("eye", dt, b_create);
            c.p[0] = 5;
            c.p[1] = ey[k][0];
            c.p[2] = ey[k][1];
            c.tol = TOL_EXACT;
            conf_push(&c, "(%lld, %lld)", (long long)ey[k][0], (long long)ey[k][1]);
        }
    }

    /* Random draws: the same generator state gives the same numbers on every device. */
    static const char *rnames[] = {"rand_uniform", "rand_normal", "rand_bernoulli", "rand_int"};
    for (int kind = 0; kind < 4; kind++)
        for (int i = 0; i < 7; i++) {
            kiln_dtype dt = all_dt[i];
            if (kind < 2 && !kiln_dtype_is_float(dt))
                continue;
            if (kind == 3 && dt == KILN_BOOL)
                continue;
            static const int64_t shapes[][2] = {{37, 29}, {1, 1}, {0, 5}, {64, 64}};
            for (int s = 0; s < 4; s++) {
                if (s > 0 && dt != KILN_F32 && dt != KILN_I64)
                    continue;
                conf_case c = conf_make(rnames[kind], dt, b_rand);
                c.p[0] = kind;
                c.p[1] = 1234 + s;
                c.p[2] = s == 3 ? 1001 : 0; /* odd starting offset */
                c.p[3] = shapes[s][0];
                c.p[4] = shapes[s][1];
                c.d[0] = kind == 0 ? -2 : kind == 1 ? 0.5 : kind == 2 ? 0.3 : (dt == KILN_U8 ? 3 : -7);
                c.d[1] = kind == 0 ? 3 : kind == 1 ? 2 : kind == 2 ? 0 : 50;
                c.tol = kind == 1 ? TOL_REL : TOL_EXACT;
                c.tol_a = 1e-6;
                c.tol_b = 1e-6;
                conf_push(&c, "[%lld, %lld] seed %lld offset %lld, two draws + state",
                          (long long)shapes[s][0], (long long)shapes[s][1], (long long)c.p[1],
                          (long long)c.p[2]);
            }
        }
}

/* ------------------------------------------------------------- shape ops */

static int b_shape(const conf_case *c, kiln_device *dev, kiln_tensor **in, kiln_tensor **out)
{
    kiln_tensor *x = in[0];
    const int64_t *p = c->p;
    switch (p[0]) {
    case 0: return one(out, kiln_reshape(x, (int)p[1], p + 2));
    case 1: return one(out, kiln_flatten(x, (int)p[1], (int)p[2]));
    case 2: return one(out, kiln_unflatten(x, (int)p[1], (int)p[2], p + 3));
    case 3: return one(out, kiln_squeeze(x, (int)p[1]));
    case 4: return one(out, kiln_squeeze_all(x));
    case 5: return one(out, kiln_unsqueeze(x, (int)p[1]));
    case 6: {
        int order[KILN_MAX_DIMS];
        for (int i = 0; i < p[1]; i++)
            order[i] = (int)p[2 + i];
        return one(out, kiln_permute(x, (int)p[1], order));
    }
    case 7: return one(out, kiln_transpose(x, (int)p[1], (int)p[2]));
    case 8: return one(out, kiln_expand(x, (int)p[1], p + 2));
    case 9: return one(out, kiln_slice(x, (int)p[1], p[2], p[3], p[4]));
    case 10: return one(out, kiln_narrow(x, (int)p[1], p[2], p[3]));
    case 11:
    case 12: {
        kiln_tensor *parts[CONF_MAX_OUT] = {0};
        int n = p[0] == 11 ? kiln_split(x, p[1], (int)p[2], parts, CONF_MAX_OUT)
                           : kiln_chunk(x, (int)p[1], (int)p[2], parts, CONF_MAX_OUT);
        if (n < 0)
            return -1;
        for (int i = 0; i < n; i++)
            out[i] = parts[i];
        return n;
    }
    case 13: return one(out, kiln_cat(in, c->nin, (int)p[1]));
    case 14: return one(out, kiln_stack(in, c->nin, (int)p[1]));
    case 15: return one(out, kiln_repeat(x, (int)p[1], p + 2));
    case 16: {
        int dims[KILN_MAX_DIMS];
        for (int i = 0; i < p[1]; i++)
            dims[i] = (int)p[2 + i];
        return one(out, kiln_flip(x, (int)p[1], dims));
    }
    case 17: return one(out, kiln_pad(x, (int)p[1], p + 3, (kiln_pad_mode)p[2], c->d[0]));
    case 18: return one(out, kiln_tril(x, p[1]));
    case 19: return one(out, kiln_triu(x, p[1]));
    case 20: return one(out, kiln_contiguous(x));
    case 21: return one(out, kiln_clone(x));
    case 22: return one(out, kiln_cast(x, (kiln_dtype)p[1]));
    case 23: { /* to the other device and back */
        kiln_device *o = conf_other_device(dev);
        if (!o)
            return one(out, kiln_clone(x));
        return one(out, kiln_to_device(kiln_add_scalar(kiln_to_device(x, o), 1), dev));
    }
    case 24: /* an op applied to a view result: catches wrong strides/offsets of views */
        return one(out, kiln_add_scalar(kiln_slice(kiln_transpose(x, 0, 1), 1, 1, 9, 3), 0.5));
    }
    return -1;
}

static void shape_case(const char *op, kiln_dtype dt, int ndim, const int64_t *shape, conf_view v,
                       const int64_t *p, int np, const char *extra)
{
    conf_case c = conf_make(op, dt, b_shape);
    memcpy(c.p, p, (size_t)np * sizeof *p);
    c.tol = TOL_EXACT;
    conf_in(&c, -1, ndim, shape, dt == KILN_BOOL ? G_BOOL : G_UNI, -50, 50, v);
    conf_push(&c, "%s", extra);
}

#define P(...) (const int64_t[]){__VA_ARGS__}, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t))

void conf_cases_shape(void)
{
    for (int i = 0; i < ALL_DT_COUNT; i++) {
        kiln_dtype dt = all_dt[i];
        bool main_dt = dt == KILN_F32;
        for (int v = 0; v < (main_dt ? 3 : 1); v++) {
            conf_view view = v == 0 ? V_NONE : v == 1 ? V_T : V_STEP;
            shape_case("reshape", dt, KILN_SHAPE(5, 6, 7), view, P(0, 2, 6, 35), "-> [6, 35]");
            shape_case("reshape", dt, KILN_SHAPE(5, 6, 7), view, P(0, 3, -1, 3, 7), "-> [-1, 3, 7]");
            shape_case("flatten", dt, KILN_SHAPE(2, 3, 4, 5), view, P(1, 1, -1), "(1, -1)");
            shape_case("unflatten", dt, KILN_SHAPE(4, 6, 5), view, P(2, 1, 2, 2, 3), "(1, [2, 3])");
            shape_case("permute", dt, KILN_SHAPE(3, 4, 5), view, P(6, 3, 2, 0, 1), "(2, 0, 1)");
            shape_case("transpose", dt, KILN_SHAPE(3, 4, 5), view, P(7, 0, 2), "(0, 2)");
            shape_case("slice", dt, KILN_SHAPE(7, 11), view, P(9, 1, 1, 10, 3), "(1, 1:10:3)");
            shape_case("slice", dt, KILN_SHAPE(7, 11), view, P(9, 0, -5, 100, 2), "(0, -5:100:2)");
            shape_case("narrow", dt, KILN_SHAPE(7, 11), view, P(10, -1, 3, 4), "(-1, 3, 4)");
            shape_case("split", dt, KILN_SHAPE(7, 11), view, P(11, 3, 1), "(3, dim 1)");
            shape_case("chunk", dt, KILN_SHAPE(7, 11), view, P(12, 3, 0), "(3, dim 0)");
            shape_case("repeat", dt, KILN_SHAPE(3, 4), view, P(15, 3, 2, 1, 3), "(2, 1, 3)");
            shape_case("flip", dt, KILN_SHAPE(3, 4, 5), view, P(16, 2, 0, 2), "(0, 2)");
            shape_case("tril", dt, KILN_SHAPE(6, 6), view, P(18, 0), "(0)");
            shape_case("triu", dt, KILN_SHAPE(5, 8), view, P(19, 1), "(1)");
            shape_case("contiguous", dt, KILN_SHAPE(5, 8), view, P(20), "");
            shape_case("clone", dt, KILN_SHAPE(5, 8), view, P(21), "");
        }
        shape_case("squeeze", dt, KILN_SHAPE(3, 1, 4), V_NONE, P(3, 1), "(1)");
        shape_case("squeeze", dt, KILN_SHAPE(3, 1, 4), V_NONE, P(3, 0), "(0) no-op");
        shape_case("squeeze_all", dt, KILN_SHAPE(1, 3, 1, 4, 1), V_NONE, P(4), "");
        shape_case("unsqueeze", dt, KILN_SHAPE(3, 4), V_T, P(5, -1), "(-1)");
        shape_case("expand", dt, KILN_SHAPE(1, 7), V_NONE, P(8, 2, 5, 7), "-> [5, 7]");
        shape_case("expand", dt, KILN_SHAPE(7), V_NONE, P(8, 3, 3, 2, 7), "-> [3, 2, 7]");
        shape_case("tril", dt, KILN_SHAPE(2, 5, 7), V_NONE, P(18, -2), "(-2) batched");
        shape_case("triu", dt, KILN_SHAPE(2, 7, 5), V_NONE, P(19, 3), "(3) batched");
        shape_case("to_device", dt == KILN_BOOL ? KILN_F32 : dt, KILN_SHAPE(4, 9), V_STEP, P(23),
                   "round trip via the other device");
        shape_case("view_chain", dt == KILN_BOOL ? KILN_F32 : dt, KILN_SHAPE(10, 12), V_FLIP, P(24),
                   "transpose -> slice -> add_scalar");
        if (main_dt) {
            shape_case("reshape", dt, KILN_SHAPE(0, 4), V_NONE, P(0, 2, 4, 0), "empty -> [4, 0]");
            shape_case("slice", dt, KILN_SHAPE(7, 11), V_NONE, P(9, 1, 5, 5, 1), "empty slice");
            shape_case("flip", dt, KILN_SHAPE(5, 7, 11, 13), V_PERM, P(16, 3, 0, 1, 3), "(0, 1, 3)");
            shape_case("repeat", dt, KILN_SHAPE(2, 3), V_NONE, P(15, 3, 2, 2, 2), "adds a dim");
            shape_case("split", dt, KILN_SHAPE(6, 5), V_NONE, P(11, 10, 0), "one piece");
        }
        /* cat and stack: three inputs with mixed views. */
        for (int dim = 0; dim < 2; dim++) {
            conf_case c = conf_make("cat", dt, b_shape);
            c.p[0] = 13;
            c.p[1] = dim;
            c.tol = TOL_EXACT;
            conf_gen g = dt == KILN_BOOL ? G_BOOL : G_UNI;
            if (dim == 0) {
                conf_in(&c, -1, KILN_SHAPE(3, 5), g, -9, 9, V_NONE);
                conf_in(&c, -1, KILN_SHAPE(4, 5), g, -9, 9, V_T);
                conf_in(&c, -1, KILN_SHAPE(0, 5), g, -9, 9, V_NONE);
            } else {
                conf_in(&c, -1, KILN_SHAPE(3, 5), g, -9, 9, V_STEP);
                conf_in(&c, -1, KILN_SHAPE(3, 1), g, -9, 9, V_NONE);
                conf_in(&c, -1, KILN_SHAPE(3, 6), g, -9, 9, V_FLIP);
            }
            conf_push(&c, "dim %d", dim);
            c = conf_make("stack", dt, b_shape);
            c.p[0] = 14;
            c.p[1] = dim ? -1 : 0;
            c.tol = TOL_EXACT;
            conf_in(&c, -1, KILN_SHAPE(3, 5), g, -9, 9, V_NONE);
            conf_in(&c, -1, KILN_SHAPE(3, 5), g, -9, 9, V_T);
            conf_push(&c, "dim %d", dim ? -1 : 0);
        }
        /* pad: constant, reflect, replicate over 1 and 2 trailing dims. */
        if (dt == KILN_BOOL)
            continue;
        for (int mode = 0; mode < 3; mode++) {
            if (mode && !(dt == KILN_F32 || dt == KILN_F64 || dt == KILN_F16 || dt == KILN_BF16 || dt == KILN_I64))
                continue;
            static const char *mn[] = {"constant", "reflect", "replicate"};
            conf_case c = conf_make("pad", dt, b_shape);
            c.p[0] = 17;
            c.p[1] = 4;
            c.p[2] = mode;
            c.p[3] = 2; c.p[4] = 1; c.p[5] = 0; c.p[6] = 3;
            c.d[0] = mode == 0 ? 2.5 : 0;
            c.tol = TOL_EXACT;
            conf_in(&c, -1, KILN_SHAPE(2, 3, 5, 6), G_UNI, -9, 9, main_dt ? V_T : V_NONE);
            conf_push(&c, "%s (2, 1, 0, 3)", mn[mode]);
            c = conf_make("pad", dt, b_shape);
            c.p[0] = 17;
            c.p[1] = 2;
            c.p[2] = mode;
            c.p[3] = 3; c.p[4] = 2;
            c.tol = TOL_EXACT;
            conf_in(&c, -1, KILN_SHAPE(2, 7), G_UNI, -9, 9, V_NONE);
            conf_push(&c, "%s (3, 2)", mn[mode]);
        }
    }

    /* casts between every pair of dtypes, with values each target can hold. */
    for (int i = 0; i < ALL_DT_COUNT; i++)
        for (int j = 0; j < ALL_DT_COUNT; j++) {
            kiln_dtype from = all_dt[i], to = all_dt[j];
            conf_case c = conf_make("cast", from, b_shape);
            c.p[0] = 22;
            c.p[1] = to;
            c.tol = TOL_EXACT;
            bool to_unsigned = to == KILN_U8 || to == KILN_BOOL;
            if (from == KILN_BOOL)
                conf_in(&c, -1, KILN_SHAPE(5, 9), G_BOOL, 0, 1, V_T);
            else if (kiln_dtype_is_float(from) && kiln_dtype_is_float(to))
                conf_in(&c, -1, KILN_SHAPE(5, 9), G_SPECIAL, -300, 300, V_T);
            else
                conf_in(&c, -1, KILN_SHAPE(5, 9), G_UNI, to_unsigned || from == KILN_U8 ? 0 : -120, 120, V_T);
            conf_push(&c, "-> %s", kiln_dtype_name(to));
        }
}

/* ------------------------------------------------------------- unary ops */

typedef kiln_tensor *(*unary_fn)(kiln_tensor *);
static kiln_tensor *u_leaky(kiln_tensor *t) { return kiln_leaky_relu(t, 0.1); }
static kiln_tensor *u_elu(kiln_tensor *t) { return kiln_elu(t, 1.0); }
static kiln_tensor *u_elu2(kiln_tensor *t) { return kiln_elu(t, 0.7); }
static kiln_tensor *u_gelu(kiln_tensor *t) { return kiln_gelu(t, false); }
static kiln_tensor *u_gelu_tanh(kiln_tensor *t) { return kiln_gelu(t, true); }
static kiln_tensor *u_softplus(kiln_tensor *t) { return kiln_softplus(t, 1, 20); }
static kiln_tensor *u_softplus2(kiln_tensor *t) { return kiln_softplus(t, 2, 5); }
static kiln_tensor *u_clamp(kiln_tensor *t) { return kiln_clamp(t, -1, 2); }
static kiln_tensor *u_clamp_hi(kiln_tensor *t) { return kiln_clamp(t, -INFINITY, 0.5); }
static kiln_tensor *u_pow2(kiln_tensor *t) { return kiln_pow_scalar(t, 2); }
static kiln_tensor *u_pow3(kiln_tensor *t) { return kiln_pow_scalar(t, 3); }
static kiln_tensor *u_pow_half(kiln_tensor *t) { return kiln_pow_scalar(t, 0.5); }
static kiln_tensor *u_pow_m1(kiln_tensor *t) { return kiln_pow_scalar(t, -1.5); }
static kiln_tensor *u_add_s(kiln_tensor *t) { return kiln_add_scalar(t, 2.5); }
static kiln_tensor *u_add_si(kiln_tensor *t) { return kiln_add_scalar(t, -3); }
static kiln_tensor *u_mul_s(kiln_tensor *t) { return kiln_mul_scalar(t, 3); }
static kiln_tensor *u_mul_sf(kiln_tensor *t) { return kiln_mul_scalar(t, -0.25); }

static const struct unary_def {
    const char *name;
    unary_fn fn;
    double lo, hi;  /* domain for the plain cases */
    bool ints;      /* also run on integer dtypes */
    const char *args; /* the parameters, for labels */
} unary_ops[] = {
    {"neg", kiln_neg, -5, 5, true, NULL},
    {"abs", kiln_abs, -5, 5, true, NULL},
    {"sign", kiln_sign, -5, 5, true, NULL},
    {"exp", kiln_exp, -10, 10, true, NULL},
    {"log", kiln_log, 0.01, 100, true, NULL},
    {"log1p", kiln_log1p, -0.9, 10, false, NULL},
    {"expm1", kiln_expm1, -5, 5, false, NULL},
    {"sqrt", kiln_sqrt, 0, 100, true, NULL},
    {"rsqrt", kiln_rsqrt, 0.01, 100, false, NULL},
    {"square", kiln_square, -10, 10, true, NULL},
    {"reciprocal", kiln_reciprocal, 0.1, 10, false, NULL},
    {"sin", kiln_sin, -10, 10, false, NULL},
    {"cos", kiln_cos, -10, 10, false, NULL},
    {"tanh", kiln_tanh, -5, 5, false, NULL},
    {"sigmoid", kiln_sigmoid, -10, 10, true, NULL},
    {"relu", kiln_relu, -5, 5, true, NULL},
    {"leaky_relu", u_leaky, -5, 5, false, "(0.1)"},
    {"elu", u_elu, -5, 5, false, "(1)"},
    {"elu", u_elu2, -5, 5, false, "(0.7)"},
    {"gelu", u_gelu, -6, 6, false, "(erf)"},
    {"gelu_tanh", u_gelu_tanh, -6, 6, false, "(tanh)"},
    {"silu", kiln_silu, -8, 8, false, NULL},
    {"softplus", u_softplus, -30, 30, false, "(1, 20)"},
    {"softplus", u_softplus2, -8, 8, false, "(2, 5)"},
    {"erf", kiln_erf, -3, 3, false, NULL},
    {"floor", kiln_floor, -10, 10, true, NULL},
    {"ceil", kiln_ceil, -10, 10, true, NULL},
    {"round", kiln_round, -10, 10, true, NULL},
    {"clamp", u_clamp, -3, 3, true, "(-1, 2)"},
    {"clamp", u_clamp_hi, -3, 3, false, "(-inf, 0.5)"},
    {"pow_scalar", u_pow2, -4, 4, true, "(2)"},
    {"pow_scalar", u_pow3, -4, 4, false, "(3)"},
    {"pow_scalar", u_pow_half, 0, 9, false, "(0.5)"},
    {"pow_scalar", u_pow_m1, 0.1, 9, false, "(-1.5)"},
    {"add_scalar", u_add_s, -5, 5, true, "(2.5)"},
    {"add_scalar", u_add_si, -5, 5, true, "(-3)"},
    {"mul_scalar", u_mul_s, -5, 5, true, "(3)"},
    {"mul_scalar", u_mul_sf, -5, 5, false, "(-0.25)"},
    {"isnan", kiln_isnan, -5, 5, true, NULL},
    {"isinf", kiln_isinf, -5, 5, true, NULL},
    {"logical_not", kiln_logical_not, -1, 2, true, NULL},
};
#define N_UNARY ((int)(sizeof unary_ops / sizeof unary_ops[0]))

static int b_unary(const conf_case *c, kiln_device *dev, kiln_tensor **in, kiln_tensor **out)
{
    return one(out, unary_ops[c->p[0]].fn(in[0]));
}

static void unary_case(int op, kiln_dtype dt, int ndim, const int64_t *shape, conf_gen g, conf_view v)
{
    const struct unary_def *u = &unary_ops[op];
    conf_case c = conf_make(u->name, dt, b_unary);
    c.p[0] = op;
    double lo = u->lo, hi = u->hi;
    if (!kiln_dtype_is_float(dt) && lo < 0 && (dt == KILN_U8 || dt == KILN_BOOL))
        lo = 0;
    if (g == G_INT && hi - lo < 2)
        hi = lo + 3;
    if (g == G_SPECIAL) {
        lo = -4;
        hi = 4;
    }
    conf_in(&c, -1, ndim, shape, dt == KILN_BOOL ? G_BOOL : g, lo, hi, v);
    /* sin/cos of huge arguments: range reduction is where implementations differ. */
    if (g == G_SPECIAL && (op == 11 || op == 12)) {
        c.tol = TOL_REL;
        c.tol_a = 1e-5;
        c.tol_b = 1e-5;
    }
    conf_push(&c, "%s%s", u->args ? u->args : "", g == G_SPECIAL ? " with NaN/Inf/huge values" : "");
}

/* ------------------------------------------------------------ binary ops */

typedef kiln_tensor *(*binary_fn)(kiln_tensor *, kiln_tensor *);
static const struct binary_def {
    const char *name;
    binary_fn fn;
    double alo, ahi, blo, bhi;
    int kind; /* 0 arithmetic, 1 comparison, 2 logical */
} binary_ops[] = {
    {"add", kiln_add, -10, 10, -10, 10, 0},
    {"sub", kiln_sub, -10, 10, -10, 10, 0},
    {"mul", kiln_mul, -10, 10, -10, 10, 0},
    {"div", kiln_div, -10, 10, 0.5, 5, 0},
    {"remainder", kiln_remainder, -20, 20, 1, 6, 0},
    {"pow", kiln_pow, 0.1, 3, -2, 3, 0},
    {"maximum", kiln_maximum, -10, 10, -10, 10, 0},
    {"minimum", kiln_minimum, -10, 10, -10, 10, 0},
    {"eq", kiln_eq, -3, 3, -3, 3, 1},
    {"ne", kiln_ne, -3, 3, -3, 3, 1},
    {"lt", kiln_lt, -3, 3, -3, 3, 1},
    {"le", kiln_le, -3, 3, -3, 3, 1},
    {"gt", kiln_gt, -3, 3, -3, 3, 1},
    {"ge", kiln_ge, -3, 3, -3, 3, 1},
    {"logical_and", kiln_logical_and, -1, 2, -1, 2, 2},
    {"logical_or", kiln_logical_or, -1, 2, -1, 2, 2},
    {"logical_xor", kiln_logical_xor, -1, 2, -1, 2, 2},
};
#define N_BINARY ((int)(sizeof binary_ops / sizeof binary_ops[0]))

static int b_binary(const conf_case *c, kiln_device *dev, kiln_tensor **in, kiln_tensor **out)
{
    return one(out, binary_ops[c->p[0]].fn(in[0], in[1]));
}

typedef struct bshape {
    int na;
    int64_t a[4];
    int nb;
    int64_t b[4];
    conf_view va, vb;
} bshape;

static const bshape bshapes[] = {
    {4, {5, 7, 11, 13}, 4, {5, 7, 11, 13}, V_NONE, V_NONE},
    {2, {64, 64}, 1, {64}, V_NONE, V_NONE},
    {4, {5, 1, 11, 1}, 3, {7, 1, 13}, V_NONE, V_NONE},
    {2, {3, 4}, 0, {0}, V_NONE, V_NONE},
    {2, {0, 4}, 1, {4}, V_NONE, V_NONE},
    {1, {1}, 1, {1}, V_NONE, V_NONE},
    {3, {6, 9, 10}, 3, {6, 9, 10}, V_T, V_STEP},
    {3, {6, 9, 10}, 3, {6, 9, 10}, V_FLIP, V_EXPAND},
    {3, {4, 5, 6}, 2, {5, 6}, V_PERM, V_NARROW},
    {2, {517, 613}, 2, {517, 613}, V_NONE, V_NONE},
    {2, {517, 613}, 1, {613}, V_T, V_NONE},
    {3, {3, 301, 259}, 3, {3, 1, 259}, V_NONE, V_STEP},
};

static void binary_case(int op, kiln_dtype da, kiln_dtype db, const bshape *s, conf_gen g)
{
    const struct binary_def *bd = &binary_ops[op];
    conf_case c = conf_make(bd->name, da, b_binary);
    c.p[0] = op;
    double alo = bd->alo, ahi = bd->ahi, blo = bd->blo, bhi = bd->bhi;
    conf_gen ga = g, gb = g;
    if (bd->kind == 1 || bd->kind == 2) {
        ga = gb = G_INT;
    }
    if (da == KILN_U8 || da == KILN_BOOL) {
        alo = alo < 0 ? 0 : alo;
    }
    if (db == KILN_U8 || db == KILN_BOOL) {
        blo = blo < 0 ? 0 : blo;
    }
    if (!kiln_dtype_is_float(da) || !kiln_dtype_is_float(db)) {
        if (op == 5) { /* integer pow: small non-negative */
            alo = 0; ahi = 5; blo = 0; bhi = 4;
            ga = gb = G_INT;
        }
        if (op == 3 || op == 4) { /* no division by zero in integers */
            gb = G_INT;
            blo = 1;
            bhi = 7;
        }
    }
    if (g == G_SPECIAL) {
        alo = blo = -4;
        ahi = bhi = 4;
    }
    if (da == KILN_BOOL)
        ga = G_BOOL;
    if (db == KILN_BOOL)
        gb = G_BOOL;
    conf_in(&c, da, s->na, s->a, ga, alo, ahi, s->va);
    conf_in(&c, db, s->nb, s->b, gb, blo, bhi, s->vb);
    if (op == 5 && kiln_dtype_is_float(kiln_promote_types(da, db))) {
        c.tol = TOL_REL;
        c.tol_a = 2e-5;
        c.tol_b = 1e-6;
    }
    conf_push(&c, "%s", g == G_SPECIAL ? "with NaN/Inf/huge values" : "");
}

/* clamp of i64 values near +-2^53 (d[0]) to bounds a few units either side: a double holds
 * only the even integers there, so a comparison through one reads 2^53 + 1 as 2^53. The
 * shift is two exact integer add_scalars (a scalar operand is integral only below 2^53). */
static int b_clamp_i64(const conf_case *c, kiln_device *dev, kiln_tensor **in, kiln_tensor **out)
{
    double half = c->d[0] / 2;
    kiln_tensor *y = kiln_add_scalar(kiln_add_scalar(in[0], half), half);
    return one(out, kiln_clamp(y, c->d[0] + c->d[1], c->d[0] + c->d[2]));
}

static int b_where(const conf_case *c, kiln_device *dev, kiln_tensor **in, kiln_tensor **out)
{
    if (c->p[0] == 0)
        return one(out, kiln_where(in[0], in[1], in[2]));
    return one(out, kiln_masked_fill(in[0], in[1], c->d[0]));
}

void conf_cases_elementwise(void)
{
    for (int op = 0; op < N_UNARY; op++) {
        /* f32 across shapes and views. */
        unary_case(op, KILN_F32, KILN_SHAPE(5, 7, 11, 13), G_UNI, V_NONE);
        unary_case(op, KILN_F32, KILN_SHAPE(64, 64), G_UNI, V_NONE);
        unary_case(op, KILN_F32, KILN_SHAPE(0, 3), G_UNI, V_NONE);
        unary_case(op, KILN_F32, KILN_SHAPE(1), G_UNI, V_NONE);
        unary_case(op, KILN_F32, 0, NULL, G_UNI, V_NONE);
        unary_case(op, KILN_F32, KILN_SHAPE(13, 11), G_UNI, V_T);
        unary_case(op, KILN_F32, KILN_SHAPE(9, 10), G_UNI, V_STEP);
        unary_case(op, KILN_F32, KILN_SHAPE(9, 10), G_UNI, V_FLIP);
        unary_case(op, KILN_F32, KILN_SHAPE(6, 9, 10), G_UNI, V_EXPAND);
        unary_case(op, KILN_F32, KILN_SHAPE(3, 4, 5), G_UNI, V_PERM);
        unary_case(op, KILN_F32, KILN_SHAPE(3, 4, 1023), G_UNI, V_NONE);
        unary_case(op, KILN_F32, KILN_SHAPE(17, 19), G_SPECIAL, V_NONE);
        /* big enough for a backend's threaded and vectorized paths, with odd tails */
        unary_case(op, KILN_F32, KILN_SHAPE(517, 613), G_UNI, V_NONE);
        unary_case(op, KILN_F32, KILN_SHAPE(613, 517), G_UNI, V_T);
        unary_case(op, KILN_F16, KILN_SHAPE(301, 259), G_UNI, V_NONE);
        for (int i = 1; i < 4; i++) {
            unary_case(op, float_dt[i], KILN_SHAPE(5, 7, 11), G_UNI, V_NONE);
            unary_case(op, float_dt[i], KILN_SHAPE(9, 10), G_UNI, V_T);
            unary_case(op, float_dt[i], KILN_SHAPE(17, 19), G_SPECIAL, V_NONE);
        }
        if (unary_ops[op].ints)
            for (int i = 4; i < ALL_DT_COUNT; i++) {
                if (all_dt[i] == KILN_BOOL && strcmp(unary_ops[op].name, "logical_not") != 0 &&
                    strcmp(unary_ops[op].name, "isnan") != 0)
                    continue;
                unary_case(op, all_dt[i], KILN_SHAPE(5, 7, 11), G_INT, V_NONE);
                unary_case(op, all_dt[i], KILN_SHAPE(9, 10), G_INT, V_STEP);
            }
    }
    /* round: exact halves, ties to even. */
    {
        conf_case c = conf_make("round", KILN_F32, b_unary);
        c.p[0] = 27;
        conf_in(&c, -1, KILN_SHAPE(8, 10), G_DISTINCT, 0.5, 20, V_NONE);
        c.tol = TOL_EXACT;
        conf_push(&c, "exact halves");
    }

    for (int op = 0; op < N_BINARY; op++) {
        for (int s = 0; s < (int)(sizeof bshapes / sizeof bshapes[0]); s++)
            binary_case(op, KILN_F32, KILN_F32, &bshapes[s], G_UNI);
        binary_case(op, KILN_F32, KILN_F32, &bshapes[0], G_SPECIAL);
        for (int i = 1; i < ALL_DT_COUNT; i++) {
            kiln_dtype dt = all_dt[i];
            if (dt == KILN_BOOL && binary_ops[op].kind == 0 && op != 6 && op != 7)
                continue;
            binary_case(op, dt, dt, &bshapes[2], G_UNI);
            binary_case(op, dt, dt, &bshapes[6], G_UNI);
            if (kiln_dtype_is_float(dt))
                binary_case(op, dt, dt, &bshapes[1], G_SPECIAL);
        }
        /* promotion */
        static const kiln_dtype mixed[][2] = {{KILN_F32, KILN_I64}, {KILN_I32, KILN_U8},
                                              {KILN_F16, KILN_BF16}, {KILN_BOOL, KILN_I32},
                                              {KILN_U8, KILN_I64},   {KILN_F64, KILN_F32},
                                              {KILN_I32, KILN_F16}};
        for (int m = 0; m < 7; m++) {
            if (binary_ops[op].kind == 0 && op != 6 && op != 7 &&
                (mixed[m][0] == KILN_BOOL || mixed[m][1] == KILN_BOOL) && op != 0 && op != 2)
                continue;
            binary_case(op, mixed[m][0], mixed[m][1], &bshapes[2], G_UNI);
        }
    }
    for (int sign = -1; sign <= 1; sign += 2) {
        conf_case c = conf_make("clamp", KILN_I64, b_clamp_i64);
        c.d[0] = sign * 9007199254740992.0; /* 2^53 */
        c.d[1] = -20;
        c.d[2] = 20;
        c.tol = TOL_EXACT;
        /* 512 draws of 64 values: each bound's neighbours come up */
        conf_in(&c, -1, KILN_SHAPE(512), G_INT, -32, 32, V_NONE);
        conf_push(&c, "(%+g - 20, %+g + 20) of values %+g +- 32", c.d[0], c.d[0], c.d[0]);
    }
    /* remainder with negative divisors (Python sign rule). */
    for (int i = 0; i < 6; i++) {
        kiln_dtype dt = all_dt[i];
        conf_case c = conf_make("remainder", dt, b_binary);
        c.p[0] = 4;
        conf_in(&c, -1, KILN_SHAPE(6, 7), G_INT, -20, 20, V_NONE);
        conf_in(&c, -1, KILN_SHAPE(7), G_INT, -6, -1, V_NONE);
        conf_push(&c, "negative divisors");
        if (kiln_dtype_is_float(dt)) {
            c = conf_make("remainder", dt, b_binary);
            c.p[0] = 4;
            conf_in(&c, -1, KILN_SHAPE(6, 7), G_UNI, -20, 20, V_NONE);
            conf_in(&c, -1, KILN_SHAPE(6, 7), G_UNI, -4, -0.5, V_NONE);
            conf_push(&c, "negative divisors");
        }
    }

    /* where and masked_fill */
    for (int i = 0; i < ALL_DT_COUNT; i++) {
        kiln_dtype dt = all_dt[i];
        conf_gen g = dt == KILN_BOOL ? G_BOOL : G_UNI;
        conf_case c = conf_make("where", dt, b_where);
        conf_in(&c, KILN_BOOL, KILN_SHAPE(5, 1, 11), G_BOOL, 0, 1, V_NONE);
        conf_in(&c, -1, KILN_SHAPE(7, 11), g, -9, 9, V_NONE);
        conf_in(&c, -1, KILN_SHAPE(5, 7, 1), g, -9, 9, V_NONE);
        conf_push(&c, NULL);
        c = conf_make("where", dt, b_where);
        conf_in(&c, KILN_BOOL, KILN_SHAPE(9, 10), G_BOOL, 0, 1, V_T);
        conf_in(&c, -1, KILN_SHAPE(9, 10), g, -9, 9, V_STEP);
        conf_in(&c, -1, KILN_SHAPE(9, 10), g, -9, 9, V_FLIP);
        conf_push(&c, NULL);
        c = conf_make("masked_fill", dt, b_where);
        c.p[0] = 1;
        c.d[0] = dt == KILN_BOOL ? 1 : dt == KILN_U8 ? 200 : -7;
        conf_in(&c, -1, KILN_SHAPE(5, 7, 11), g, -9, 9, i == 0 ? V_PERM : V_NONE);
        conf_in(&c, KILN_BOOL, KILN_SHAPE(7, 1), G_BOOL, 0, 1, V_NONE);
        conf_push(&c, "value %g", c.d[0]);
    }
    {
        /* the relu-gradient form: a strided mask selecting a tensor or a broadcast zero */
        conf_case c = conf_make("where", KILN_F32, b_where);
        conf_in(&c, KILN_BOOL, KILN_SHAPE(13, 40), G_BOOL, 0, 1, V_STEP);
        conf_in(&c, -1, KILN_SHAPE(13, 40), G_SPECIAL, -9, 9, V_NONE);
        conf_in(&c, -1, KILN_SHAPE(1), G_UNI, -9, 9, V_NONE);
        conf_push(&c, "broadcast scalar operand");
    }
    {
        conf_case c = conf_make("masked_fill", KILN_F32, b_where);
        c.p[0] = 1;
        c.d[0] = -INFINITY;
        conf_in(&c, -1, KILN_SHAPE(4, 6), G_UNI, -9, 9, V_NONE);
        conf_in(&c, KILN_BOOL, KILN_SHAPE(4, 6), G_CAUSAL, 0, 1, V_NONE);
        conf_push(&c, "value -inf");
    }
}
