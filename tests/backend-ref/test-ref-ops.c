/*
 * tests/backend-ref/test-ref-ops.c — ref's indexing, linear-algebra and nn primitives
 * against hand-computed values, plus one identity check: the convolution gradients
 * must be the adjoints of the forward, <conv(x, w), g> = <x, dX(g, w)> = <w, dW(x, g)>,
 * on odd geometries (groups, stride, padding, dilation, 1 to 3 spatial dims).
 */
#include "test-ref.h"

static size_t dsz(kiln_dtype dt)
{
    return dt == KILN_F64 || dt == KILN_I64 ? 8 : dt == KILN_F32 || dt == KILN_I32 ? 4
           : dt == KILN_F16 || dt == KILN_BF16 ? 2 : 1;
}

/* A contiguous tensor of the given shape holding data. */
static kiln_tdesc mk(kiln_dtype dt, const void *data, int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    return tdesc(tbuf(data, (size_t)n * dsz(dt)), dt, 0, ndim, shape, NULL);
}

#define SHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

static void check_vec(const kiln_tdesc *t, const double *want, int n, double tol)
{
    for (int i = 0; i < n; i++)
        CHECK_NEAR(tget(t, i), want[i], tol);
}

static void test_indexing(void)
{
    /* gather along dim 1 of [[1 2] [3 4]], stored transposed (column-major). */
    int64_t cm[] = {1, 3, 2, 4};
    kiln_tdesc in = tdesc(tbuf(cm, sizeof cm), KILN_I64, 0, 2, (int64_t[]){2, 2}, (int64_t[]){1, 2});
    int64_t ix[] = {0, 0, 1, 0};
    kiln_tdesc idx = mk(KILN_I64, ix, SHAPE(2, 2)), out = tnew(KILN_I64, SHAPE(2, 2));
    CHECK_OK(R->gather(C, &out, &in, 1, &idx));
    check_vec(&out, (double[]){1, 1, 4, 3}, 4, 0);

    /* scatter_add with duplicates; plain scatter into a strided (every other) view. */
    float src[] = {1, 2, 3};
    int64_t si[] = {0, 2, 0};
    kiln_tdesc ts = mk(KILN_F32, src, SHAPE(3)), tsi = mk(KILN_I64, si, SHAPE(3));
    kiln_tdesc acc = tnew(KILN_F32, SHAPE(3));
    CHECK_OK(R->scatter(C, &acc, 0, &tsi, &ts, true));
    check_vec(&acc, (double[]){4, 0, 2}, 3, 0);
    kiln_tdesc wide = tnew(KILN_F32, SHAPE(6));
    kiln_tdesc every2 = tdesc(wide.buf, KILN_F32, 1, 1, (int64_t[]){3}, (int64_t[]){2});
    int64_t si2[] = {2, 0};
    kiln_tdesc tsi2 = mk(KILN_I64, si2, SHAPE(2));
    CHECK_OK(R->scatter(C, &every2, 0, &tsi2, &ts, false)); /* src longer than index: ok */
    check_vec(&wide, (double[]){0, 2, 0, 0, 0, 1}, 6, 0);

    /* index_select rows of [[1 2] [3 4] [5 6]] in i32; index given reversed (stride -1). */
    int32_t m[] = {1, 2, 3, 4, 5, 6};
    int64_t rows[] = {2, 0, 2};
    kiln_tdesc tm = mk(KILN_I32, m, SHAPE(3, 2));
    kiln_tdesc tr = tdesc(tbuf(rows, sizeof rows), KILN_I64, 2, 1, (int64_t[]){3}, (int64_t[]){-1});
    kiln_tdesc sel = tnew(KILN_I32, SHAPE(3, 2));
    CHECK_OK(R->index_select(C, &sel, &tm, 0, &tr));
    check_vec(&sel, (double[]){5, 6, 1, 2, 5, 6}, 6, 0);

    /* index_add along dim 1 with a repeated index. */
    double s2[] = {1, 2, 3, 4, 5, 6};
    int64_t ia[] = {1, 1, 0};
    kiln_tdesc ts2 = mk(KILN_F64, s2, SHAPE(2, 3)), tia = mk(KILN_I64, ia, SHAPE(3));
    kiln_tdesc ao = tnew(KILN_F64, SHAPE(2, 2));
    CHECK_OK(R->index_add(C, &ao, 1, &tia, &ts2));
    check_vec(&ao, (double[]){3, 3, 6, 9}, 4, 0);

    /* pad: reflect, replicate, constant with a negative (cropping) side. */
    int32_t v[] = {1, 2, 3};
    kiln_tdesc tv = mk(KILN_I32, v, SHAPE(1, 3)), po = tnew(KILN_I32, SHAPE(1, 6));
    int64_t pads[] = {0, 0, 2, 1};
    CHECK_OK(R->pad(C, KILN_PAD_REFLECT, &po, &tv, pads, 0));
    check_vec(&po, (double[]){3, 2, 1, 2, 3, 2}, 6, 0);
    CHECK_OK(R->pad(C, KILN_PAD_REPLICATE, &po, &tv, pads, 0));
    check_vec(&po, (double[]){1, 1, 1, 2, 3, 3}, 6, 0);
    kiln_tdesc pc = tnew(KILN_I32, SHAPE(2, 3));
    int64_t pads2[] = {1, 0, 1, -1};
    CHECK_OK(R->pad(C, KILN_PAD_CONSTANT, &pc, &tv, pads2, 9));
    check_vec(&pc, (double[]){9, 9, 9, 9, 1, 2}, 6, 0);
}

static void test_matmul(void)
{
    double a[] = {1, 2, 3, 4, 5, 6}, b[] = {7, 8, 9, 10, 11, 12};
    kiln_tdesc ta = mk(KILN_F64, a, SHAPE(2, 3)), tb = mk(KILN_F64, b, SHAPE(3, 2));
    kiln_tdesc o = tnew(KILN_F64, SHAPE(2, 2));
    CHECK_OK(R->matmul(C, &o, &ta, &tb));
    check_vec(&o, (double[]){58, 64, 139, 154}, 4, 0);
    /* Batch of 2: a is a transposed view, b is broadcast over the batch with stride 0. */
    double at[] = {1, 4, 2, 5, 3, 6}; /* a^T stored: [3][2] */
    kiln_tdesc tat = tdesc(tbuf(at, sizeof at), KILN_F64, 0, 3, (int64_t[]){2, 2, 3},
                           (int64_t[]){0, 1, 2});
    kiln_tdesc tbb = tdesc(tb.buf, KILN_F64, 0, 3, (int64_t[]){2, 3, 2}, (int64_t[]){0, 2, 1});
    kiln_tdesc ob = tnew(KILN_F64, SHAPE(2, 2, 2));
    CHECK_OK(R->matmul(C, &ob, &tat, &tbb));
    check_vec(&ob, (double[]){58, 64, 139, 154, 58, 64, 139, 154}, 8, 0);
    /* Integers wrap; bool is refused. */
    int32_t ia[] = {65536, 1}, ib[] = {65536, 5};
    kiln_tdesc xa = mk(KILN_I32, ia, SHAPE(1, 2)), xb = mk(KILN_I32, ib, SHAPE(2, 1));
    kiln_tdesc xo = tnew(KILN_I32, SHAPE(1, 1));
    CHECK_OK(R->matmul(C, &xo, &xa, &xb));
    CHECK(tgeti(&xo, 0) == 5); /* 2^32 wraps to 0 */
    kiln_tdesc bo = tnew(KILN_BOOL, SHAPE(1, 1));
    CHECK(R->matmul(C, &bo, &bo, &bo) == KILN_ENOTSUP);
    kiln_tdesc ek = tnew(KILN_F32, SHAPE(2, 0)), ek2 = tnew(KILN_F32, SHAPE(0, 3));
    kiln_tdesc eo = tnew(KILN_F32, SHAPE(2, 3));
    CHECK_OK(R->fill(C, &eo, 7));
    CHECK_OK(R->matmul(C, &eo, &ek, &ek2)); /* K = 0: zeros */
    CHECK(tget(&eo, 5) == 0);
}

static kiln_conv_params conv1(int64_t stride, int64_t pad, int64_t dil, int64_t groups)
{
    kiln_conv_params p = {.nspatial = 1, .groups = groups};
    p.stride[0] = stride, p.padding[0] = pad, p.dilation[0] = dil;
    return p;
}

static void test_conv_values(void)
{
    float x[] = {1, 2, 3, 4, 5}, w[] = {1, 0, -1}, bias[] = {10};
    kiln_tdesc tx = mk(KILN_F32, x, SHAPE(1, 1, 5)), tw = mk(KILN_F32, w, SHAPE(1, 1, 3));
    kiln_tdesc tbias = mk(KILN_F32, bias, SHAPE(1)), o = tnew(KILN_F32, SHAPE(1, 1, 5));
    kiln_conv_params p = conv1(1, 1, 1, 1);
    CHECK_OK(R->conv(C, &p, &o, &tx, &tw, NULL));
    check_vec(&o, (double[]){-2, -2, -2, -2, 4}, 5, 0);
    CHECK_OK(R->conv(C, &p, &o, &tx, &tw, &tbias));
    check_vec(&o, (double[]){8, 8, 8, 8, 14}, 5, 0);
    kiln_tdesc o1 = tnew(KILN_F32, SHAPE(1, 1, 1));
    p = conv1(1, 0, 2, 1);
    CHECK_OK(R->conv(C, &p, &o1, &tx, &tw, NULL));
    CHECK(tget(&o1, 0) == -4); /* taps 0, 2, 4 */

    /* Two groups of one channel each. */
    double gx[] = {1, 2, 3, 4, 5, 6}, gw[] = {1, 1, 1, -1};
    kiln_tdesc tgx = mk(KILN_F64, gx, SHAPE(1, 2, 3)), tgw = mk(KILN_F64, gw, SHAPE(2, 1, 2));
    kiln_tdesc go = tnew(KILN_F64, SHAPE(1, 2, 2));
    p = conv1(1, 0, 1, 2);
    CHECK_OK(R->conv(C, &p, &go, &tgx, &tgw, NULL));
    check_vec(&go, (double[]){3, 5, -1, -1}, 4, 0);

    /* 2-d, diagonal kernel. */
    double x2[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w2[] = {1, 0, 0, 1};
    kiln_tdesc tx2 = mk(KILN_F64, x2, SHAPE(1, 1, 3, 3)), tw2 = mk(KILN_F64, w2, SHAPE(1, 1, 2, 2));
    kiln_tdesc o2 = tnew(KILN_F64, SHAPE(1, 1, 2, 2));
    kiln_conv_params p2 = {.nspatial = 2, .stride = {1, 1}, .dilation = {1, 1}, .groups = 1};
    CHECK_OK(R->conv(C, &p2, &o2, &tx2, &tw2, NULL));
    check_vec(&o2, (double[]){6, 8, 12, 14}, 4, 0);

    /* Transposed-conv forward with output_padding: grad_x has 4 positions, 2 of output. */
    double tw3[] = {1, 2, 3}, gy[] = {1, 10};
    kiln_tdesc ttw = mk(KILN_F64, tw3, SHAPE(1, 1, 3)), tgy = mk(KILN_F64, gy, SHAPE(1, 1, 2));
    kiln_tdesc gxo = tnew(KILN_F64, SHAPE(1, 1, 4));
    CHECK_OK(R->fill(C, &gxo, 99)); /* overwritten, not accumulated */
    p = conv1(2, 1, 1, 1);
    CHECK_OK(R->conv_backward_input(C, &p, &gxo, &tgy, &ttw));
    check_vec(&gxo, (double[]){2, 13, 20, 30}, 4, 0);
    double xx[] = {1, 2, 3, 4};
    kiln_tdesc txx = mk(KILN_F64, xx, SHAPE(1, 1, 4)), gwo = tnew(KILN_F64, SHAPE(1, 1, 3));
    CHECK_OK(R->conv_backward_weight(C, &p, &gwo, &txx, &tgy));
    check_vec(&gwo, (double[]){20, 31, 42}, 3, 0);
    kiln_tdesc ix = tnew(KILN_I32, SHAPE(1, 1, 4));
    CHECK(R->conv(C, &p, &ix, &ix, &ix, NULL) == KILN_ENOTSUP);
}

static uint64_t lcg = 12345;
static double rnd(void)
{
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(lcg >> 11) / 9007199254740992.0 - 0.5;
}

static kiln_tdesc rnd_t(int ndim, const int64_t *shape)
{
    kiln_tdesc t = tnew(KILN_F64, ndim, shape);
    double *p = R->buffer_host_ptr(C, t.buf);
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    for (int64_t i = 0; i < n; i++)
        p[i] = rnd();
    return t;
}

static double dot(const kiln_tdesc *a, const kiln_tdesc *b, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += tget(a, i) * tget(b, i);
    return s;
}

static void conv_adjoint(int ns, const int64_t *xs, const int64_t *ws, const int64_t *ys,
                         const kiln_conv_params *p)
{
    int nd = ns + 2;
    int64_t nx = 1, nw = 1, ny = 1;
    for (int d = 0; d < nd; d++)
        nx *= xs[d], nw *= ws[d], ny *= ys[d];
    kiln_tdesc x = rnd_t(nd, xs), w = rnd_t(nd, ws), g = rnd_t(nd, ys);
    kiln_tdesc y = tnew(KILN_F64, nd, ys), dx = tnew(KILN_F64, nd, xs), dw = tnew(KILN_F64, nd, ws);
    CHECK_OK(R->conv(C, p, &y, &x, &w, NULL));
    CHECK_OK(R->conv_backward_input(C, p, &dx, &g, &w));
    CHECK_OK(R->conv_backward_weight(C, p, &dw, &x, &g));
    double a = dot(&y, &g, ny), b = dot(&x, &dx, nx), c = dot(&w, &dw, nw);
    CHECK_NEAR(b, a, 1e-12);
    CHECK_NEAR(c, a, 1e-12);
    CHECK(fabs(a) > 1e-6);
}

static void test_conv_adjoint(void)
{
    kiln_conv_params p1 = conv1(2, 2, 2, 3);
    /* L=11, k=3, s=2, p=2, d=2: (11 + 4 - 4 - 1) / 2 + 1 = 6 */
    conv_adjoint(1, (int64_t[]){2, 6, 11}, (int64_t[]){9, 2, 3}, (int64_t[]){2, 9, 6}, &p1);
    kiln_conv_params p2 = {.nspatial = 2, .stride = {2, 1}, .padding = {1, 0},
                           .dilation = {1, 2}, .groups = 2};
    /* H=7: (7+2-3)/2+1 = 4; W=5, k=2, d=2: (5-2-1)/1+1 = 3 */
    conv_adjoint(2, (int64_t[]){1, 4, 7, 5}, (int64_t[]){6, 2, 3, 2}, (int64_t[]){1, 6, 4, 3}, &p2);
    kiln_conv_params p3 = {.nspatial = 3, .stride = {1, 2, 1}, .padding = {1, 1, 0},
                           .dilation = {1, 1, 1}, .groups = 1};
    /* D=3,k=3,p=1: 3; H=5,k=2,s=2,p=1: (5+2-2)/2+1 = 3; W=4,k=2: 3 */
    conv_adjoint(3, (int64_t[]){2, 2, 3, 5, 4}, (int64_t[]){3, 2, 3, 2, 2},
                 (int64_t[]){2, 3, 3, 3, 3}, &p3);
}

static void test_pool(void)
{
    double x[9] = {1, NAN, 3, 4, 5, 6, 7, 8, 9};
    kiln_tdesc tx = mk(KILN_F64, x, SHAPE(1, 1, 3, 3));
    kiln_tdesc o = tnew(KILN_F64, SHAPE(1, 1, 2, 2)), ix = tnew(KILN_I64, SHAPE(1, 1, 2, 2));
    kiln_pool_params p = {.nspatial = 2, .kind = KILN_POOL_MAX, .kernel = {2, 2},
                          .stride = {1, 1}, .dilation = {1, 1}};
    CHECK_OK(R->pool(C, &p, &o, &ix, &tx));
    check_vec(&o, (double[]){NAN, NAN, 8, 9}, 4, 0);
    check_vec(&ix, (double[]){1, 1, 7, 8}, 4, 0);
    kiln_tdesc g1 = tnew(KILN_F64, SHAPE(1, 1, 2, 2)), gx = tnew(KILN_F64, SHAPE(1, 1, 3, 3));
    CHECK_OK(R->fill(C, &g1, 1));
    CHECK_OK(R->pool_backward(C, &p, &gx, &g1, &ix));
    check_vec(&gx, (double[]){0, 2, 0, 0, 0, 0, 0, 1, 1}, 9, 0);

    /* 1-d max with dilation, and with padding (indices within the unpadded input). */
    float v[] = {1, 5, 2, 4, 3};
    kiln_tdesc tv = mk(KILN_F32, v, SHAPE(1, 5)); /* [C, L]: no batch dim */
    kiln_tdesc ov = tnew(KILN_F32, SHAPE(1, 3)), iv = tnew(KILN_I64, SHAPE(1, 3));
    kiln_pool_params pd = {.nspatial = 1, .kind = KILN_POOL_MAX, .kernel = {2},
                           .stride = {1}, .dilation = {2}};
    CHECK_OK(R->pool(C, &pd, &ov, &iv, &tv));
    check_vec(&ov, (double[]){2, 5, 3}, 3, 0);
    check_vec(&iv, (double[]){2, 1, 4}, 3, 0);
    kiln_pool_params pp = {.nspatial = 1, .kind = KILN_POOL_MAX, .kernel = {2},
                           .stride = {2}, .padding = {1}, .dilation = {1}};
    kiln_tdesc op2 = tnew(KILN_F32, SHAPE(1, 3)), ip2 = tnew(KILN_I64, SHAPE(1, 3));
    CHECK_OK(R->pool(C, &pp, &op2, &ip2, &tv)); /* windows {-1,0} {1,2} {3,4} */
    check_vec(&op2, (double[]){1, 5, 4}, 3, 0);
    check_vec(&ip2, (double[]){0, 1, 3}, 3, 0);

    /* avg, ceil mode with padding: [1 2 3 4 5], k3 s2 p1 -> 3 windows. */
    double a[] = {1, 2, 3, 4, 5};
    kiln_tdesc ta = mk(KILN_F64, a, SHAPE(1, 1, 5)), oa = tnew(KILN_F64, SHAPE(1, 1, 3));
    kiln_pool_params pa = {.nspatial = 1, .kind = KILN_POOL_AVG, .kernel = {3}, .stride = {2},
                           .padding = {1}, .dilation = {1}, .count_include_pad = true};
    CHECK_OK(R->pool(C, &pa, &oa, NULL, &ta));
    check_vec(&oa, (double[]){1, 3, 3}, 3, 1e-15);
    kiln_tdesc ga = tnew(KILN_F64, SHAPE(1, 1, 3)), gxa = tnew(KILN_F64, SHAPE(1, 1, 5));
    CHECK_OK(R->fill(C, &ga, 1));
    CHECK_OK(R->pool_backward(C, &pa, &gxa, &ga, NULL));
    check_vec(&gxa, (double[]){1.0 / 3, 2.0 / 3, 1.0 / 3, 2.0 / 3, 1.0 / 3}, 5, 1e-15);
    pa.count_include_pad = false;
    CHECK_OK(R->pool(C, &pa, &oa, NULL, &ta));
    check_vec(&oa, (double[]){1.5, 3, 4.5}, 3, 1e-15);
    /* A ceil-mode window overhanging the end without padding: divisor 2, not 3. */
    kiln_tdesc t4 = mk(KILN_F64, a, SHAPE(1, 1, 4)), o4 = tnew(KILN_F64, SHAPE(1, 1, 2));
    kiln_pool_params pc = {.nspatial = 1, .kind = KILN_POOL_AVG, .kernel = {3}, .stride = {2},
                           .dilation = {1}, .count_include_pad = true};
    CHECK_OK(R->pool(C, &pc, &o4, NULL, &t4));
    check_vec(&o4, (double[]){2, 3.5}, 2, 1e-15);

    /* adaptive: 5 -> 3 with windows [0,2) [1,4) [3,5). */
    kiln_tdesc ad = tnew(KILN_F64, SHAPE(1, 1, 3));
    CHECK_OK(R->adaptive_avg_pool(C, 1, &ad, &ta));
    check_vec(&ad, (double[]){1.5, 3, 4.5}, 3, 1e-15);
    CHECK_OK(R->adaptive_avg_pool_backward(C, 1, &gxa, &ga));
    check_vec(&gxa, (double[]){0.5, 0.5 + 1.0 / 3, 1.0 / 3, 1.0 / 3 + 0.5, 0.5}, 5, 1e-15);
    kiln_tdesc ad2 = tnew(KILN_F64, SHAPE(1, 1, 1, 1));
    CHECK_OK(R->adaptive_avg_pool(C, 2, &ad2, &tx)); /* global average with a NaN */
    CHECK(isnan(tget(&ad2, 0)));
}

static void test_interpolate(void)
{
    float x[] = {10, 20, 30};
    kiln_tdesc tx = mk(KILN_F32, x, SHAPE(1, 1, 1, 3)), o = tnew(KILN_F32, SHAPE(1, 1, 1, 5));
    CHECK_OK(R->interpolate(C, KILN_INTERP_NEAREST, false, &o, &tx));
    check_vec(&o, (double[]){10, 10, 20, 20, 30}, 5, 0);
    kiln_tdesc gx = tnew(KILN_F32, SHAPE(1, 1, 1, 3));
    CHECK_OK(R->fill(C, &o, 1));
    CHECK_OK(R->interpolate_backward(C, KILN_INTERP_NEAREST, false, &gx, &o));
    check_vec(&gx, (double[]){2, 2, 1}, 3, 0);

    double y[] = {0, 4};
    kiln_tdesc ty = mk(KILN_F64, y, SHAPE(1, 1, 1, 2)), o4 = tnew(KILN_F64, SHAPE(1, 1, 1, 4));
    CHECK_OK(R->interpolate(C, KILN_INTERP_BILINEAR, false, &o4, &ty));
    check_vec(&o4, (double[]){0, 1, 3, 4}, 4, 1e-15);
    CHECK_OK(R->interpolate(C, KILN_INTERP_BILINEAR, true, &o4, &ty));
    check_vec(&o4, (double[]){0, 4.0 / 3, 8.0 / 3, 4}, 4, 1e-15);
    double g[] = {1, 2, 3, 4};
    kiln_tdesc tg = mk(KILN_F64, g, SHAPE(1, 1, 1, 4)), gy = tnew(KILN_F64, SHAPE(1, 1, 1, 2));
    CHECK_OK(R->interpolate_backward(C, KILN_INTERP_BILINEAR, false, &gy, &tg));
    check_vec(&gy, (double[]){3.25, 6.75}, 2, 1e-15);
    /* 2-d bilinear on a 2x2 -> 3x3 grid with align_corners: the centre is the mean. */
    double q[] = {0, 2, 4, 6};
    kiln_tdesc tq = mk(KILN_F64, q, SHAPE(1, 1, 2, 2)), o9 = tnew(KILN_F64, SHAPE(1, 1, 3, 3));
    CHECK_OK(R->interpolate(C, KILN_INTERP_BILINEAR, true, &o9, &tq));
    check_vec(&o9, (double[]){0, 1, 2, 2, 3, 4, 4, 5, 6}, 9, 1e-15);
}

static void test_softmax_layer_norm(void)
{
    /* Softmax along dim 0 of a [3, 2] view that is the transpose of [[1 2 3] [-inf x3]]. */
    double x[] = {1, 2, 3, -INFINITY, -INFINITY, -INFINITY};
    kiln_tdesc tx = tdesc(tbuf(x, sizeof x), KILN_F64, 0, 2, (int64_t[]){3, 2}, (int64_t[]){1, 3});
    kiln_tdesc o = tnew(KILN_F64, SHAPE(3, 2));
    CHECK_OK(R->softmax(C, false, &o, &tx, 0));
    check_vec(&o, (double[]){0.09003057317038046, NAN, 0.24472847105479767, NAN,
                             0.6652409557748219, NAN}, 6, 1e-15);
    CHECK_OK(R->softmax(C, true, &o, &tx, 0));
    CHECK_NEAR(tget(&o, 0), -2.4076059644443806, 1e-14);
    CHECK_NEAR(tget(&o, 4), -0.4076059644443803, 1e-14);
    kiln_tdesc h = tnew(KILN_F16, SHAPE(3, 2));
    CHECK_OK(R->softmax(C, false, &h, &tx, 0));
    CHECK_NEAR(tget(&h, 4), 0.6650390625, 0); /* 1362 * 2^-11, the f16 nearest 0.66524 */

    /* layer_norm over the last dim of [[1 3] [2 2]] with weight, bias, mean, rstd. */
    double l[] = {1, 3, 2, 2}, w[] = {2, 3}, b[] = {0.5, 0};
    kiln_tdesc tl = mk(KILN_F64, l, SHAPE(2, 2)), tw = mk(KILN_F64, w, SHAPE(2));
    kiln_tdesc tb = mk(KILN_F64, b, SHAPE(2)), lo = tnew(KILN_F64, SHAPE(2, 2));
    kiln_tdesc mean = tnew(KILN_F32, SHAPE(2, 1)), rstd = tnew(KILN_F32, SHAPE(2, 1));
    const double eps = 1e-5, r0 = 1 / sqrt(1 + eps);
    CHECK_OK(R->layer_norm(C, &lo, &mean, &rstd, &tl, &tw, &tb, 2, eps));
    check_vec(&lo, (double[]){-2 * r0 + 0.5, 3 * r0, 0.5, 0}, 4, 1e-15);
    CHECK_NEAR(tget(&mean, 0), 2, 0);
    CHECK_NEAR(tget(&rstd, 1), (float)(1 / sqrt(eps)), 0);
    CHECK_OK(R->layer_norm(C, &lo, NULL, NULL, &tl, NULL, NULL, 4, eps));
    CHECK_NEAR(tget(&lo, 0), -1 / sqrt(0.5 + eps), 1e-15); /* mean 2, var 2/4 */
}

void test_ref_ops(void)
{
    test_indexing();
    test_matmul();
    test_conv_values();
    test_conv_adjoint();
    test_pool();
    test_interpolate();
    test_softmax_layer_norm();
}
