/*
 * tests/autodiff/test-grad-ops.c — gradient checks of the elementwise, reduction,
 * shape/layout, indexing and matrix ops against central differences, on ref and cpu,
 * with broadcast operands and non-contiguous (permuted, strided, expanded) inputs.
 */
#include "gradcheck.h"

typedef kiln_tensor *(*unary_fn)(kiln_tensor *);
typedef kiln_tensor *(*binary_fn)(kiln_tensor *, kiln_tensor *);

static kiln_tensor *apply_unary(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    return (*(const unary_fn *)ud)(in[0]);
}

/* The same op on a permuted (non-contiguous) view of the input. */
static kiln_tensor *apply_unary_t(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    return (*(const unary_fn *)ud)(kiln_transpose(in[0], 0, 1));
}

static void test_unary(void **state)
{
    (void)state;
    static const struct { const char *name; unary_fn f; int kind; } ops[] = {
        {"neg", kiln_neg, GC_NORMAL},       {"abs", kiln_abs, GC_NORMAL},
        {"exp", kiln_exp, GC_NORMAL},       {"log", kiln_log, GC_POSITIVE},
        {"log1p", kiln_log1p, GC_POSITIVE}, {"expm1", kiln_expm1, GC_NORMAL},
        {"sqrt", kiln_sqrt, GC_POSITIVE},   {"rsqrt", kiln_rsqrt, GC_POSITIVE},
        {"square", kiln_square, GC_NORMAL}, {"reciprocal", kiln_reciprocal, GC_POSITIVE},
        {"sin", kiln_sin, GC_NORMAL},       {"cos", kiln_cos, GC_NORMAL},
        {"tanh", kiln_tanh, GC_NORMAL},     {"sigmoid", kiln_sigmoid, GC_NORMAL},
        {"relu", kiln_relu, GC_NORMAL},     {"silu", kiln_silu, GC_NORMAL},
        {"erf", kiln_erf, GC_NORMAL},       {"sign", kiln_sign, GC_NORMAL},
        {"floor", kiln_floor, GC_NORMAL},   {"ceil", kiln_ceil, GC_NORMAL},
        {"round", kiln_round, GC_NORMAL},
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        gc_in in = {KILN_SHAPE(3, 4), ops[i].kind};
        gradcheck(ops[i].name, apply_unary, &ops[i].f, 1, &in);
        gradcheck(ops[i].name, apply_unary_t, &ops[i].f, 1, &in);
    }
}

static kiln_tensor *u_leaky(kiln_tensor *t) { return kiln_leaky_relu(t, 0.1); }
static kiln_tensor *u_elu(kiln_tensor *t) { return kiln_elu(t, 0.7); }
static kiln_tensor *u_gelu(kiln_tensor *t) { return kiln_gelu(t, false); }
static kiln_tensor *u_gelu_tanh(kiln_tensor *t) { return kiln_gelu(t, true); }
static kiln_tensor *u_softplus(kiln_tensor *t) { return kiln_softplus(kiln_mul_scalar(t, 3), 2, 4); }
static kiln_tensor *u_clamp(kiln_tensor *t) { return kiln_clamp(t, -0.5, 0.7); }
static kiln_tensor *u_pow(kiln_tensor *t) { return kiln_pow_scalar(t, 2.5); }
static kiln_tensor *u_pow3(kiln_tensor *t) { return kiln_pow_scalar(kiln_neg(t), 3); }
static kiln_tensor *u_scalars(kiln_tensor *t) { return kiln_add_scalar(kiln_mul_scalar(t, -1.5), 2); }

static void test_unary_params(void **state)
{
    (void)state;
    static const struct { const char *name; unary_fn f; int kind; } ops[] = {
        {"leaky_relu", u_leaky, GC_NORMAL}, {"elu", u_elu, GC_NORMAL},
        {"gelu", u_gelu, GC_NORMAL},        {"gelu_tanh", u_gelu_tanh, GC_NORMAL},
        {"softplus", u_softplus, GC_NORMAL},{"clamp", u_clamp, GC_NORMAL},
        {"pow_scalar", u_pow, GC_POSITIVE}, {"pow_scalar3", u_pow3, GC_NORMAL},
        {"add/mul_scalar", u_scalars, GC_NORMAL},
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        gc_in in = {KILN_SHAPE(2, 5), ops[i].kind};
        gradcheck(ops[i].name, apply_unary, &ops[i].f, 1, &in);
    }
}

static kiln_tensor *apply_binary(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    return (*(const binary_fn *)ud)(in[0], in[1]);
}

/* b strided (every other column) and a permuted. */
static kiln_tensor *apply_binary_nc(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    return (*(const binary_fn *)ud)(kiln_permute(in[0], KILN_DIMS(1, 0)), kiln_slice(in[1], 1, 0, 8, 2));
}

static void test_binary(void **state)
{
    (void)state;
    static const struct { const char *name; binary_fn f; int ka, kb; } ops[] = {
        {"add", kiln_add, GC_NORMAL, GC_NORMAL}, {"sub", kiln_sub, GC_NORMAL, GC_NORMAL},
        {"mul", kiln_mul, GC_NORMAL, GC_NORMAL}, {"div", kiln_div, GC_NORMAL, GC_POSITIVE},
        {"pow", kiln_pow, GC_POSITIVE, GC_NORMAL}, {"maximum", kiln_maximum, GC_NORMAL, GC_NORMAL},
        {"minimum", kiln_minimum, GC_NORMAL, GC_NORMAL}, {"remainder", kiln_remainder, GC_NORMAL, GC_POSITIVE},
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        /* same shapes, then broadcasting both ways */
        gc_in same[2] = {{KILN_SHAPE(2, 3), ops[i].ka}, {KILN_SHAPE(2, 3), ops[i].kb}};
        gradcheck(ops[i].name, apply_binary, &ops[i].f, 2, same);
        gc_in bc[2] = {{KILN_SHAPE(2, 1, 3), ops[i].ka}, {KILN_SHAPE(4, 1), ops[i].kb}};
        gradcheck(ops[i].name, apply_binary, &ops[i].f, 2, bc);
        gc_in nc[2] = {{KILN_SHAPE(4, 3), ops[i].ka}, {KILN_SHAPE(3, 8), ops[i].kb}};
        gradcheck(ops[i].name, apply_binary_nc, &ops[i].f, 2, nc);
    }
}

/* maximum/minimum split ties evenly, as PyTorch does. */
static void test_maximum_ties(void **state)
{
    (void)state;
    kiln_device *dev = kiln_device_open("ref");
    kiln_scope_begin();
    double av[3] = {1, 2, 3}, bv[3] = {1, 5, 0};
    kiln_tensor *a = kiln_requires_grad(kiln_from_data(dev, KILN_F64, KILN_SHAPE(3), av, sizeof av), true);
    kiln_tensor *b = kiln_requires_grad(kiln_from_data(dev, KILN_F64, KILN_SHAPE(3), bv, sizeof bv), true);
    assert_int_equal(kiln_backward(kiln_sum(kiln_maximum(a, b), KILN_ALL_DIMS, false), NULL), 0);
    double ga[3], gb[3];
    assert_int_equal(kiln_to_data(kiln_grad(a), ga, sizeof ga), 0);
    assert_int_equal(kiln_to_data(kiln_grad(b), gb, sizeof gb), 0);
    assert_true(ga[0] == 0.5 && ga[1] == 0 && ga[2] == 1);
    assert_true(gb[0] == 0.5 && gb[1] == 1 && gb[2] == 0);
    kiln_scope_end();
    kiln_device_close(dev);
}

static kiln_tensor *f_where(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)ud;
    kiln_tensor *cond = kiln_gt(in[2], kiln_zeros(dev, KILN_F64, 0, NULL));
    return kiln_where(cond, in[0], in[1]);
}

static kiln_tensor *f_masked_fill(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)ud;
    return kiln_masked_fill(in[0], kiln_lt(in[1], kiln_zeros(dev, KILN_F64, 0, NULL)), 2.5);
}

static kiln_tensor *f_tril(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    (void)ud;
    return kiln_add(kiln_tril(in[0], 0), kiln_mul_scalar(kiln_triu(in[0], 1), 3));
}

static void test_selection(void **state)
{
    (void)state;
    GRADCHECK("where", f_where, NULL, GC_IN(2, 3), GC_IN(3), GC_IN(2, 1));
    GRADCHECK("masked_fill", f_masked_fill, NULL, GC_IN(3, 4), GC_IN(4));
    GRADCHECK("tril/triu", f_tril, NULL, GC_IN(2, 3, 4));
}

/* ---------------------------------------------------------------- reductions */

typedef struct red_case {
    const char *name;
    int op;          /* index into the switch below */
    int ndims;
    int dims[2];
    bool keepdim;
    double param;
} red_case;

static kiln_tensor *f_reduce(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    const red_case *c = ud;
    kiln_tensor *x = c->keepdim ? in[0] : kiln_transpose(in[0], 0, 2); /* non-contiguous too */
    const int *d = c->ndims ? c->dims : NULL;
    switch (c->op) {
    case 0: return kiln_sum(x, c->ndims, d, c->keepdim);
    case 1: return kiln_mean(x, c->ndims, d, c->keepdim);
    case 2: return kiln_prod(x, c->ndims, d, c->keepdim);
    case 3: return kiln_max(x, c->ndims, d, c->keepdim);
    case 4: return kiln_min(x, c->ndims, d, c->keepdim);
    case 5: return kiln_var(x, c->ndims, d, c->param, c->keepdim);
    case 6: return kiln_std(x, c->ndims, d, c->param, c->keepdim);
    case 7: return kiln_logsumexp(x, c->ndims, d, c->keepdim);
    default: return kiln_norm(x, c->param, c->ndims, d, c->keepdim);
    }
}

static void test_reductions(void **state)
{
    (void)state;
    static const red_case cases[] = {
        {"sum", 0, 0, {0}, false, 0},        {"sum dims", 0, 2, {0, 2}, true, 0},
        {"mean", 1, 1, {1}, false, 0},       {"mean all", 1, 0, {0}, true, 0},
        {"prod", 2, 1, {2}, true, 0},        {"prod all", 2, 0, {0}, false, 0},
        {"max", 3, 1, {1}, true, 0},         {"max all", 3, 0, {0}, false, 0},
        {"min", 4, 2, {0, 1}, false, 0},     {"var", 5, 1, {2}, true, 1},
        {"var c0", 5, 2, {0, 1}, false, 0},  {"std", 6, 1, {1}, false, 1},
        {"logsumexp", 7, 1, {2}, true, 0},   {"logsumexp all", 7, 0, {0}, false, 0},
        {"norm2", 8, 1, {2}, true, 2},       {"norm1", 8, 0, {0}, false, 1},
        {"norm3", 8, 1, {1}, false, 3},      {"norm inf", 8, 1, {2}, true, INFINITY},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        GRADCHECK(cases[i].name, f_reduce, &cases[i], GC_IN(2, 3, 4));
}

/* prod with zeros: one zero gets the product of the rest; two zeros give nothing. */
static void test_prod_zeros(void **state)
{
    (void)state;
    for (size_t d = 0; d < 2; d++) {
        kiln_device *dev = kiln_device_open(gc_devices[d]);
        kiln_scope_begin();
        double v[6] = {2, 0, 3, 0, 0, 5};
        kiln_tensor *x = kiln_requires_grad(kiln_from_data(dev, KILN_F64, KILN_SHAPE(2, 3), v, sizeof v), true);
        assert_int_equal(kiln_backward(kiln_sum(kiln_prod(x, KILN_DIMS(1), false), KILN_ALL_DIMS, false), NULL), 0);
        double g[6];
        assert_int_equal(kiln_to_data(kiln_grad(x), g, sizeof g), 0);
        assert_true(g[0] == 0 && g[1] == 6 && g[2] == 0);
        assert_true(g[3] == 0 && g[4] == 0 && g[5] == 0);
        kiln_scope_end();
        kiln_device_close(dev);
    }
}

/* max over ties spreads the gradient evenly. */
static void test_max_ties(void **state)
{
    (void)state;
    kiln_device *dev = kiln_device_open("cpu");
    kiln_scope_begin();
    double v[4] = {3, 1, 3, 3};
    kiln_tensor *x = kiln_requires_grad(kiln_from_data(dev, KILN_F64, KILN_SHAPE(4), v, sizeof v), true);
    assert_int_equal(kiln_backward(kiln_max(x, KILN_ALL_DIMS, false), NULL), 0);
    double g[4];
    assert_int_equal(kiln_to_data(kiln_grad(x), g, sizeof g), 0);
    assert_true(fabs(g[0] - 1.0 / 3) < 1e-15 && g[1] == 0 && fabs(g[3] - 1.0 / 3) < 1e-15);
    kiln_scope_end();
    kiln_device_close(dev);
}

static kiln_tensor *f_cumsum(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    (void)ud;
    return kiln_add(kiln_cumsum(in[0], 1), kiln_cumsum(kiln_transpose(in[0], 0, 1), 0));
}

static kiln_tensor *f_sort(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    (void)ud;
    kiln_tensor *v = NULL, *tv = NULL;
    kiln_sort(in[0], 1, true, &v, NULL);
    kiln_topk(in[0], 2, 0, false, &tv, NULL);
    return kiln_add(kiln_sum(v, KILN_DIMS(0), false), kiln_sum(tv, KILN_DIMS(0), false));
}

static void test_scan_sort(void **state)
{
    (void)state;
    GRADCHECK("cumsum", f_cumsum, NULL, GC_IN(3, 3));
    GRADCHECK("sort/topk", f_sort, NULL, GC_IN(3, 4));
}

/* ---------------------------------------------------------------- shape, layout */

static kiln_tensor *f_views(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    (void)ud;
    kiln_tensor *x = in[0];                                    /* [2, 3, 4] */
    kiln_tensor *a = kiln_reshape(kiln_permute(x, KILN_DIMS(2, 0, 1)), KILN_SHAPE(4, 6)); /* copy */
    kiln_tensor *b = kiln_flatten(kiln_unsqueeze(x, 1), 1, 3);  /* [2, 12] */
    kiln_tensor *c = kiln_unflatten(b, 1, KILN_SHAPE(3, 4));
    kiln_tensor *d = kiln_squeeze(kiln_narrow(c, 1, 1, 1), 1); /* [2, 4] */
    kiln_tensor *e = kiln_squeeze_all(kiln_slice(x, 2, 1, 4, 2)); /* [2, 3, 2] */
    kiln_tensor *s1 = kiln_sum(kiln_mul(a, a), KILN_DIMS(0), false);  /* [6] */
    kiln_tensor *s2 = kiln_sum(kiln_mul(kiln_unsqueeze(d, 1), kiln_narrow(x, 2, -4, 4)), KILN_DIMS(1), false); /* [2, 4] */
    kiln_tensor *s3 = kiln_sum(kiln_exp(e), KILN_ALL_DIMS, false);
    kiln_tensor *s4 = kiln_sum(kiln_transpose(c, 0, 2), KILN_DIMS(1), false); /* [4, 3] */
    return kiln_add(kiln_add(kiln_sum(s1, KILN_ALL_DIMS, false), kiln_sum(s2, KILN_ALL_DIMS, false)),
                    kiln_add(s3, kiln_sum(kiln_square(s4), KILN_ALL_DIMS, false)));
}

static kiln_tensor *f_expand(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    (void)ud;
    kiln_tensor *e = kiln_expand(in[0], KILN_SHAPE(2, 3, -1)); /* [3, 1] -> [2, 3, 1] */
    kiln_tensor *f = kiln_expand(e, KILN_SHAPE(2, 3, 4));
    return kiln_mul(f, in[1]);
}

static kiln_tensor *f_split(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    (void)ud;
    kiln_tensor *p[4], *q[4];
    int n = kiln_split(in[0], 2, 1, p, 4);  /* 5 -> 2, 2, 1 */
    int m = kiln_chunk(in[0], 2, 0, q, 4);  /* 3 -> 2, 1 */
    assert_int_equal(n, 3);
    assert_int_equal(m, 2);
    kiln_tensor *a = kiln_mul(p[0], kiln_exp(p[1]));
    kiln_tensor *b = kiln_sum(kiln_square(p[2]), KILN_ALL_DIMS, false);
    kiln_tensor *c = kiln_sum(kiln_sin(q[1]), KILN_ALL_DIMS, false);
    return kiln_add(kiln_add(a, b), kiln_add(c, kiln_sum(q[0], KILN_ALL_DIMS, false)));
}

static kiln_tensor *f_cat_stack(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    (void)ud;
    kiln_tensor *c = kiln_cat((kiln_tensor *[]){in[0], in[1], in[0]}, 3, 1);      /* [2, 7] */
    kiln_tensor *s = kiln_stack((kiln_tensor *[]){in[0], kiln_exp(in[0])}, 2, -1); /* [2, 2, 2] */
    return kiln_add(kiln_sum(kiln_square(c), KILN_DIMS(1), false), kiln_sum(s, KILN_DIMS(1, 2), false));
}

static kiln_tensor *f_repeat_flip(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    (void)ud;
    kiln_tensor *r = kiln_repeat(in[0], KILN_SHAPE(2, 1, 3)); /* [2, 3] -> [2, 2, 9] */
    kiln_tensor *f = kiln_flip(kiln_transpose(in[0], 0, 1), KILN_DIMS(0, 1));
    kiln_tensor *m = kiln_mul(r, kiln_reshape(kiln_arange(dev, KILN_F64, 0, 36, 1), KILN_SHAPE(2, 2, 9)));
    return kiln_add(kiln_sum(m, KILN_ALL_DIMS, false), kiln_sum(kiln_mul(f, f), KILN_ALL_DIMS, false));
}

typedef struct pad_case {
    kiln_pad_mode mode;
    int npads;
    int64_t pads[4];
} pad_case;

static kiln_tensor *f_pad(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    const pad_case *c = ud;
    return kiln_pad(in[0], c->npads, c->pads, c->mode, 0.5);
}

static kiln_tensor *f_copies(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)ud;
    kiln_tensor *a = kiln_contiguous(kiln_transpose(in[0], 0, 1));
    kiln_tensor *b = kiln_clone(in[0]);
    kiln_tensor *c = kiln_cast(kiln_cast(in[0], KILN_F32), KILN_F64); /* through f32: tolerance */
    kiln_device *r = kiln_device_open("ref");
    kiln_tensor *d = kiln_to_device(kiln_exp(kiln_to_device(in[0], r)), dev);
    kiln_device_close(r);
    return kiln_add(kiln_add(kiln_sum(kiln_square(a), KILN_ALL_DIMS, false), kiln_sum(kiln_mul(b, d), KILN_ALL_DIMS, false)),
                    kiln_mul_scalar(kiln_sum(c, KILN_ALL_DIMS, false), 1e-3));
}

static void test_shape_ops(void **state)
{
    (void)state;
    GRADCHECK("views", f_views, NULL, GC_IN(2, 3, 4));
    GRADCHECK("expand", f_expand, NULL, GC_IN(3, 1), GC_IN(2, 3, 4));
    GRADCHECK("split/chunk", f_split, NULL, GC_IN(3, 5));
    GRADCHECK("cat/stack", f_cat_stack, NULL, GC_IN(2, 2), GC_IN(2, 3));
    GRADCHECK("repeat/flip", f_repeat_flip, NULL, GC_IN(2, 3));
    static const pad_case pads[] = {
        {KILN_PAD_CONSTANT, 4, {1, 2, 0, 1}}, {KILN_PAD_CONSTANT, 2, {-1, 2}},
        {KILN_PAD_REFLECT, 4, {2, 1, 1, 2}},  {KILN_PAD_REPLICATE, 4, {3, 1, 0, 2}},
    };
    for (size_t i = 0; i < sizeof pads / sizeof pads[0]; i++)
        GRADCHECK("pad", f_pad, &pads[i], GC_IN(2, 3, 4));
    gc_in in = GC_IN(3, 2);
    gradcheck_tol("contiguous/clone/cast/to_device", f_copies, NULL, 1, &in, 1e-6, 1e-5);
}

/* ---------------------------------------------------------------------- indexing */

static kiln_tensor *idx(kiln_device *dev, int ndim, const int64_t *shape, const int64_t *v, size_t n)
{
    return kiln_from_data(dev, KILN_I64, ndim, shape, v, n * sizeof(int64_t));
}

static kiln_tensor *f_gather_scatter(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)ud;
    kiln_tensor *ix = idx(dev, KILN_SHAPE(2, 3), (const int64_t[]){0, 2, 2, 1, 0, 1}, 6);
    kiln_tensor *g = kiln_gather(in[0], 1, ix);                   /* [2, 3] */
    /* scatter with distinct targets (duplicates would make the result order-dependent);
     * scatter_add with a duplicate, which must accumulate */
    kiln_tensor *ixs = idx(dev, KILN_SHAPE(2, 2), (const int64_t[]){1, 0, 3, 2}, 4);
    kiln_tensor *ixa = idx(dev, KILN_SHAPE(2, 2), (const int64_t[]){1, 0, 3, 3}, 4);
    kiln_tensor *s = kiln_scatter(in[0], 1, ixs, in[1]);          /* in[1] [2, 3], index [2, 2] */
    kiln_tensor *sa = kiln_scatter_add(in[0], 1, ixa, kiln_exp(in[1]));
    return kiln_add(kiln_sum(kiln_square(g), KILN_ALL_DIMS, false),
                    kiln_add(kiln_sum(kiln_square(s), KILN_ALL_DIMS, false), kiln_sum(kiln_square(sa), KILN_ALL_DIMS, false)));
}

static kiln_tensor *f_index_select(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)ud;
    kiln_tensor *ix = idx(dev, KILN_SHAPE(4), (const int64_t[]){2, 0, 2, 1}, 4);
    kiln_tensor *a = kiln_index_select(kiln_transpose(in[0], 0, 1), 1, ix); /* [4, 4] */
    kiln_tensor *ixe = idx(dev, KILN_SHAPE(2, 2), (const int64_t[]){1, 1, 0, 2}, 4);
    kiln_tensor *e = kiln_embedding(in[1], ixe);                            /* [2, 2, 3] */
    return kiln_add(kiln_sum(kiln_square(a), KILN_ALL_DIMS, false), kiln_sum(kiln_exp(e), KILN_ALL_DIMS, false));
}

static kiln_tensor *f_slice_assign(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    (void)ud;
    kiln_tensor *a = kiln_slice_assign(in[0], 1, 0, 5, 2, in[1]);        /* [4, 5], src [4, 3] */
    kiln_tensor *b = kiln_slice_assign(in[0], 0, 1, 3, 1, in[2]);        /* src [5] broadcast */
    return kiln_add(kiln_square(a), kiln_exp(b));
}

static void test_indexing(void **state)
{
    (void)state;
    GRADCHECK("gather/scatter", f_gather_scatter, NULL, GC_IN(2, 4), GC_IN(2, 3));
    GRADCHECK("index_select/embedding", f_index_select, NULL, GC_IN(4, 3), GC_IN(3, 3));
    GRADCHECK("slice_assign", f_slice_assign, NULL, GC_IN(4, 5), GC_IN(4, 3), GC_IN(5));
}

/* ---------------------------------------------------------------------- matmul */

static kiln_tensor *f_matmul(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    (void)ud;
    return kiln_matmul(in[0], in[1]);
}

static kiln_tensor *f_matmul_nc(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    (void)ud;
    return kiln_matmul(kiln_transpose(in[0], -1, -2), kiln_slice(in[1], 0, 0, 5, 2));
}

static kiln_tensor *f_linear(kiln_device *dev, kiln_tensor **in, const void *ud)
{
    (void)dev;
    return kiln_linear(in[0], in[1], ud ? in[2] : NULL);
}

static void test_matmul(void **state)
{
    (void)state;
    GRADCHECK("matmul 2x2", f_matmul, NULL, GC_IN(2, 3), GC_IN(3, 4));
    GRADCHECK("matmul batch bcast", f_matmul, NULL, GC_IN(2, 1, 2, 3), GC_IN(3, 3, 2));
    GRADCHECK("matmul 1-d left", f_matmul, NULL, GC_IN(3), GC_IN(2, 3, 2));
    GRADCHECK("matmul 1-d right", f_matmul, NULL, GC_IN(2, 2, 3), GC_IN(3));
    GRADCHECK("matmul 1-d both", f_matmul, NULL, GC_IN(4), GC_IN(4));
    GRADCHECK("matmul strided", f_matmul_nc, NULL, GC_IN(3, 2), GC_IN(5, 4));
    GRADCHECK("linear", f_linear, "bias", GC_IN(2, 3, 4), GC_IN(5, 4), GC_IN(5));
    GRADCHECK("linear 1-d no bias", f_linear, NULL, GC_IN(4), GC_IN(3, 4));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unary),
        cmocka_unit_test(test_unary_params),
        cmocka_unit_test(test_binary),
        cmocka_unit_test(test_maximum_ties),
        cmocka_unit_test(test_selection),
        cmocka_unit_test(test_reductions),
        cmocka_unit_test(test_prod_zeros),
        cmocka_unit_test(test_max_ties),
        cmocka_unit_test(test_scan_sort),
        cmocka_unit_test(test_shape_ops),
        cmocka_unit_test(test_indexing),
        cmocka_unit_test(test_matmul),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
