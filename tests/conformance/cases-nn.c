/*
 * tests/conformance/cases-nn.c — matmul and linear, convolutions (1-3 spatial dims,
 * transposed 1-2), pooling (with indices, ceil_mode), adaptive pooling, interpolation,
 * softmax/log_softmax, layer/batch/group norm, dropout and scaled dot-product attention.
 */
#include <math.h>
#include <string.h>

#include "conformance.h"
#include "kiln/autodiff.h"

static int one(kiln_tensor **out, kiln_tensor *t)
{
    out[0] = t;
    return t ? 1 : -1;
}

static const kiln_dtype float_dt[4] = {KILN_F32, KILN_F64, KILN_F16, KILN_BF16};

/* ---------------------------------------------------------- linear algebra */

static int b_matmul(const conf_case *c, kiln_device *dev, kiln_tensor **in, kiln_tensor **out)
{
    if (c->p[0] == 0)
        return one(out, kiln_matmul(in[0], in[1]));
    return one(out, kiln_linear(in[0], in[1], c->nin > 2 ? in[2] : NULL));
}

static void mm_case(kiln_dtype dt, int na, const int64_t *a, conf_view va, int nb, const int64_t *b,
                    conf_view vb, const char *extra)
{
    conf_case c = conf_make("matmul", dt, b_matmul);
    bool isf = kiln_dtype_is_float(dt);
    conf_in(&c, -1, na, a, isf ? G_UNI : G_INT, -3, 3, va);
    conf_in(&c, -1, nb, b, isf ? G_UNI : G_INT, -3, 3, vb);
    c.tol = TOL_NMSE;
    conf_push(&c, "%s", extra);
}

static void linear_case(kiln_dtype dt, int nx, const int64_t *x, int64_t out_f, bool bias, conf_view vw)
{
    conf_case c = conf_make("linear", dt, b_matmul);
    c.p[0] = 1;
    int64_t in_f = x[nx - 1];
    conf_in(&c, -1, nx, x, G_UNI, -2, 2, V_NONE);
    conf_in(&c, -1, KILN_SHAPE(out_f, in_f), G_UNI, -1, 1, vw);
    if (bias)
        conf_in(&c, -1, KILN_SHAPE(out_f), G_UNI, -1, 1, V_NONE);
    c.tol = TOL_NMSE;
    conf_push(&c, "%s", bias ? "with bias" : "no bias");
}

void conf_cases_linalg(void)
{
    mm_case(KILN_F32, KILN_SHAPE(33, 47), V_NONE, KILN_SHAPE(47, 29), V_NONE, "odd");
    mm_case(KILN_F32, KILN_SHAPE(64, 64), V_NONE, KILN_SHAPE(64, 64), V_NONE, "square");
    mm_case(KILN_F32, KILN_SHAPE(128, 96), V_NONE, KILN_SHAPE(96, 80), V_NONE, "");
    mm_case(KILN_F32, KILN_SHAPE(4, 17, 23), V_NONE, KILN_SHAPE(4, 23, 19), V_NONE, "batched");
    mm_case(KILN_F32, KILN_SHAPE(2, 1, 9, 8), V_NONE, KILN_SHAPE(3, 8, 5), V_NONE, "broadcast batch");
    mm_case(KILN_F32, KILN_SHAPE(9, 8), V_NONE, KILN_SHAPE(3, 8, 5), V_NONE, "2-D x 3-D");
    mm_case(KILN_F32, KILN_SHAPE(3, 9, 8), V_NONE, KILN_SHAPE(8, 5), V_NONE, "3-D x 2-D");
    mm_case(KILN_F32, KILN_SHAPE(8), V_NONE, KILN_SHAPE(8, 5), V_NONE, "1-D x 2-D");
    mm_case(KILN_F32, KILN_SHAPE(9, 8), V_NONE, KILN_SHAPE(8), V_NONE, "2-D x 1-D");
    mm_case(KILN_F32, KILN_SHAPE(37), V_NONE, KILN_SHAPE(37), V_NONE, "dot");
    mm_case(KILN_F32, KILN_SHAPE(3, 9, 8), V_NONE, KILN_SHAPE(8), V_NONE, "3-D x 1-D");
    mm_case(KILN_F32, KILN_SHAPE(8), V_NONE, KILN_SHAPE(2, 8, 5), V_NONE, "1-D x 3-D");
    mm_case(KILN_F32, KILN_SHAPE(33, 47), V_T, KILN_SHAPE(47, 29), V_NONE, "a transposed");
    mm_case(KILN_F32, KILN_SHAPE(33, 47), V_NONE, KILN_SHAPE(47, 29), V_T, "b transposed");
    mm_case(KILN_F32, KILN_SHAPE(4, 17, 23), V_T, KILN_SHAPE(4, 23, 19), V_T, "both transposed, batched");
    mm_case(KILN_F32, KILN_SHAPE(5, 9, 8), V_STEP, KILN_SHAPE(8, 6), V_NARROW, "step and narrow");
    mm_case(KILN_F32, KILN_SHAPE(3, 9, 8), V_EXPAND, KILN_SHAPE(3, 8, 6), V_FLIP, "expand and flip");
    mm_case(KILN_F32, KILN_SHAPE(3, 4, 5), V_PERM, KILN_SHAPE(3, 5, 2), V_NONE, "permuted");
    mm_case(KILN_F32, KILN_SHAPE(1, 1), V_NONE, KILN_SHAPE(1, 1), V_NONE, "1x1");
    mm_case(KILN_F32, KILN_SHAPE(3, 0), V_NONE, KILN_SHAPE(0, 4), V_NONE, "K = 0");
    mm_case(KILN_F32, KILN_SHAPE(0, 5), V_NONE, KILN_SHAPE(5, 4), V_NONE, "M = 0");
    mm_case(KILN_F32, KILN_SHAPE(1, 300), V_NONE, KILN_SHAPE(300, 70), V_NONE, "row vector");
    /* one row or one column of C goes to gemv on cpu: every operand layout, and a B wide
     * enough to be split across threads */
    mm_case(KILN_F32, KILN_SHAPE(1, 300), V_T, KILN_SHAPE(300, 70), V_T, "row vector, both transposed");
    mm_case(KILN_F32, KILN_SHAPE(1, 300), V_NONE, KILN_SHAPE(300, 70), V_T, "row vector, b transposed");
    mm_case(KILN_F32, KILN_SHAPE(70, 300), V_NONE, KILN_SHAPE(300, 1), V_NONE, "column vector");
    mm_case(KILN_F32, KILN_SHAPE(70, 300), V_T, KILN_SHAPE(300, 1), V_T, "column vector, both transposed");
    mm_case(KILN_F32, KILN_SHAPE(1, 640), V_NONE, KILN_SHAPE(640, 520), V_T, "row vector, wide b");
    mm_case(KILN_F32, KILN_SHAPE(2, 1, 640), V_NONE, KILN_SHAPE(640, 520), V_NONE, "row vectors, wide b");
    mm_case(KILN_F64, KILN_SHAPE(1, 300), V_T, KILN_SHAPE(300, 70), V_NONE, "row vector, a transposed");
    mm_case(KILN_F64, KILN_SHAPE(70, 300), V_NONE, KILN_SHAPE(300, 1), V_T, "column vector, b transposed");
    mm_case(KILN_F32, KILN_SHAPE(257, 300), V_NONE, KILN_SHAPE(300, 129), V_NONE, "large odd");
    mm_case(KILN_F32, KILN_SHAPE(6, 65, 130), V_T, KILN_SHAPE(130, 67), V_NONE, "large batched");
    /* cpu folds batches of stacked rows times one B into a single GEMM */
    mm_case(KILN_F32, KILN_SHAPE(2, 3, 9, 8), V_NONE, KILN_SHAPE(8, 5), V_T, "4-D x 2-D, folded");
    mm_case(KILN_F32, KILN_SHAPE(4, 1, 8), V_NONE, KILN_SHAPE(8, 6), V_NONE, "one row per batch, folded");
    mm_case(KILN_F32, KILN_SHAPE(3, 9, 8), V_STEP, KILN_SHAPE(8, 5), V_NONE, "strided batches, not folded");
    mm_case(KILN_F32, KILN_SHAPE(3, 9, 8), V_NONE, KILN_SHAPE(1, 8, 5), V_EXPAND, "B expanded over batches");
    mm_case(KILN_F64, KILN_SHAPE(5, 7, 11), V_NONE, KILN_SHAPE(11, 3), V_NONE, "3-D x 2-D, folded");
    for (int i = 1; i < 4; i++) {
        mm_case(float_dt[i], KILN_SHAPE(33, 47), V_NONE, KILN_SHAPE(47, 29), V_NONE, "odd");
        mm_case(float_dt[i], KILN_SHAPE(2, 1, 9, 8), V_T, KILN_SHAPE(3, 8, 5), V_NONE, "broadcast, a transposed");
        mm_case(float_dt[i], KILN_SHAPE(16), V_NONE, KILN_SHAPE(16, 5), V_NONE, "1-D x 2-D");
    }
    mm_case(KILN_I64, KILN_SHAPE(9, 8), V_NONE, KILN_SHAPE(8, 7), V_NONE, "integer");
    mm_case(KILN_I32, KILN_SHAPE(2, 9, 8), V_NONE, KILN_SHAPE(8, 7), V_T, "integer");

    for (int i = 0; i < 4; i++) {
        linear_case(float_dt[i], KILN_SHAPE(7, 13), 9, true, V_NONE);
        linear_case(float_dt[i], KILN_SHAPE(2, 5, 13), 9, false, V_NONE);
    }
    linear_case(KILN_F32, KILN_SHAPE(2, 5, 13), 9, true, V_T);
    linear_case(KILN_F32, KILN_SHAPE(13), 9, true, V_NONE);
    linear_case(KILN_F32, KILN_SHAPE(1, 1024), 1000, true, V_NONE); /* a classifier at batch 1 */
    linear_case(KILN_F32, KILN_SHAPE(64, 256), 128, true, V_NONE);
}

/* ------------------------------------------------------------ convolution */

static kiln_conv_opts conv_opts(const conf_case *c)
{
    kiln_conv_opts o;
    memset(&o, 0, sizeof o);
    for (int i = 0; i < 3; i++) {
        o.stride[i] = c->p[2 + i];
        o.padding[i] = c->p[5 + i];
        o.dilation[i] = c->p[8 + i];
        o.output_padding[i] = c->p[12 + i];
    }
    o.groups = c->p[11];
    return o;
}

static int b_conv(const conf_case *c, kiln_device *dev, kiln_tensor **in, kiln_tensor **out)
{
    kiln_conv_opts o = conv_opts(c);
    kiln_tensor *bias = c->p[1] ? in[2] : NULL;
    const kiln_conv_opts *op = c->p[15] ? NULL : &o;
    switch (c->p[0]) {
    case 1: return one(out, kiln_conv1d(in[0], in[1], bias, op));
    case 2: return one(out, kiln_conv2d(in[0], in[1], bias, op));
    case 3: return one(out, kiln_conv3d(in[0], in[1], bias, op));
    case 4: return one(out, kiln_conv_transpose1d(in[0], in[1], bias, op));
    case 5: return one(out, kiln_conv_transpose2d(in[0], in[1], bias, op));
    }
    return -1;
}

/* Gradients of a convolution (the cpu backend's conv_backward_input and
 * conv_backward_weight, including its image-parallel weight gradient): loss =
 * sum(y^2) / 2, so the upstream gradient is y itself; outputs dx, dw (and db). */
static int b_conv_grad(const conf_case *c, kiln_device *dev, kiln_tensor **in, kiln_tensor **out)
{
    kiln_conv_opts o = conv_opts(c);
    kiln_tensor *x = kiln_requires_grad(kiln_clone(in[0]), true);
    kiln_tensor *w = kiln_requires_grad(kiln_clone(in[1]), true);
    kiln_tensor *b = c->p[1] ? kiln_requires_grad(kiln_clone(in[2]), true) : NULL;
    if (!x || !w || (c->p[1] && !b))
        return -1;
    kiln_tensor *y = c->p[0] == 1 ? kiln_conv1d(x, w, b, &o) : kiln_conv2d(x, w, b, &o);
    kiln_tensor *loss = y ? kiln_mul_scalar(kiln_sum(kiln_square(y), 0, NULL, false), 0.5) : NULL;
    if (!loss || kiln_backward(loss, NULL) < 0)
        return -1;
    out[0] = kiln_grad(x);
    out[1] = kiln_grad(w);
    if (b)
        out[2] = kiln_grad(b);
    for (int i = 0; i < (b ? 3 : 2); i++)
        if (!out[i])
            return -1;
    return b ? 3 : 2;
}

static void conv_grad_case(int kind, kiln_dtype dt, int nx, const int64_t *x, int nw, const int64_t *w,
                           bool bias, int64_t stride, int64_t pad, int64_t dil, int64_t groups, conf_view vx)
{
    conf_case c = conf_make(kind == 1 ? "conv1d_grad" : "conv2d_grad", dt, b_conv_grad);
    c.p[0] = kind;
    c.p[1] = bias;
    for (int i = 0; i < 3; i++) {
        c.p[2 + i] = stride;
        c.p[5 + i] = pad;
        c.p[8 + i] = dil;
    }
    c.p[11] = groups;
    conf_in(&c, -1, nx, x, G_UNI, -2, 2, vx);
    conf_in(&c, -1, nw, w, G_UNI, -1, 1, V_NONE);
    if (bias)
        conf_in(&c, -1, KILN_SHAPE(w[0]), G_UNI, -1, 1, V_NONE);
    c.tol = TOL_NMSE;
    conf_push(&c, "stride %lld pad %lld dil %lld groups %lld%s", (long long)stride, (long long)pad,
              (long long)dil, (long long)groups, bias ? ", bias" : "");
}

/* kind: 1-3 conv{1,2,3}d, 4-5 conv_transpose{1,2}d. geo: stride, padding, dilation, groups,
 * output_padding, each one value for every spatial dim unless s2 gives a second. */
static void conv_case(int kind, kiln_dtype dt, int nx, const int64_t *x, int nw, const int64_t *w,
                      bool bias, int64_t stride, int64_t pad, int64_t dil, int64_t groups, int64_t outpad,
                      conf_view vx, bool null_opts)
{
    static const char *names[] = {"", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d"};
    conf_case c = conf_make(names[kind], dt, b_conv);
    c.p[0] = kind;
    c.p[1] = bias;
    for (int i = 0; i < 3; i++) {
        c.p[2 + i] = stride;
        c.p[5 + i] = pad;
        c.p[8 + i] = dil;
        c.p[12 + i] = outpad;
    }
    c.p[11] = groups;
    c.p[15] = null_opts;
    conf_in(&c, -1, nx, x, G_UNI, -2, 2, vx);
    conf_in(&c, -1, nw, w, G_UNI, -1, 1, V_NONE);
    int64_t oc = kind >= 4 ? w[1] * (groups ? groups : 1) : w[0];
    if (bias)
        conf_in(&c, -1, KILN_SHAPE(oc), G_UNI, -1, 1, V_NONE);
    c.tol = TOL_NMSE;
    if (null_opts)
        conf_push(&c, "default options%s", bias ? ", bias" : "");
    else
        conf_push(&c, "stride %lld pad %lld dil %lld groups %lld outpad %lld%s", (long long)stride,
                  (long long)pad, (long long)dil, (long long)groups, (long long)outpad, bias ? ", bias" : "");
}

static void conv_asym_case(void)
{
    conf_case c = conf_make("conv2d", KILN_F32, b_conv);
    c.p[0] = 2;
    c.p[1] = 1;
    c.p[2] = 2; c.p[3] = 1;  /* stride */
    c.p[5] = 0; c.p[6] = 2;  /* padding */
    c.p[8] = 1; c.p[9] = 2;  /* dilation */
    c.p[11] = 1;
    conf_in(&c, -1, KILN_SHAPE(2, 3, 12, 10), G_UNI, -2, 2, V_NONE);
    conf_in(&c, -1, KILN_SHAPE(5, 3, 5, 3), G_UNI, -1, 1, V_NONE);
    conf_in(&c, -1, KILN_SHAPE(5), G_UNI, -1, 1, V_NONE);
    c.tol = TOL_NMSE;
    conf_push(&c, "stride (2, 1) pad (0, 2) dil (1, 2)");
}

/* ----------------------------------------------------------------- pooling */

static int b_pool(const conf_case *c, kiln_device *dev, kiln_tensor **in, kiln_tensor **out)
{
    kiln_pool_opts o;
    memset(&o, 0, sizeof o);
    for (int i = 0; i < 3; i++) {
        o.kernel[i] = c->p[2 + i];
        o.stride[i] = c->p[5 + i];
        o.padding[i] = c->p[8 + i];
        o.dilation[i] = c->p[11 + i];
    }
    o.ceil_mode = c->p[14] != 0;
    o.count_include_pad = c->p[15] != 0;
    kiln_tensor *idx = NULL, *x = c->d[0] != 0 ? kiln_log(in[0]) : in[0];
    switch (c->p[0]) {
    case 0:
        out[0] = kiln_max_pool1d(x, &o, c->p[1] ? &idx : NULL);
        break;
    case 1:
        out[0] = kiln_max_pool2d(x, &o, c->p[1] ? &idx : NULL);
        break;
    case 2: return one(out, kiln_avg_pool1d(x, &o));
    case 3: return one(out, kiln_avg_pool2d(x, &o));
    case 4: return one(out, kiln_adaptive_avg_pool1d(in[0], c->p[2]));
    case 5: return one(out, kiln_adaptive_avg_pool2d(in[0], c->p[2], c->p[3]));
    case 6: return one(out, kiln_interpolate(in[0], c->p[2], c->p[3], (kiln_interp_mode)c->p[4], c->p[5] != 0));
    }
    if (!out[0])
        return -1;
    if (!c->p[1])
        return 1;
    out[1] = idx;
    return idx ? 2 : -1;
}

static void pool_case(int kind, kiln_dtype dt, int nx, const int64_t *x, conf_view v, int64_t k,
                      int64_t s, int64_t pad, int64_t dil, bool ceil, bool cip, bool with_idx, conf_gen g)
{
    static const char *names[] = {"max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d"};
    conf_case c = conf_make(names[kind], dt, b_pool);
    c.p[0] = kind;
    c.p[1] = with_idx;
    for (int i = 0; i < 3; i++) {
        c.p[2 + i] = k;
        c.p[5 + i] = s;
        c.p[8 + i] = pad;
        c.p[11 + i] = dil;
    }
    c.p[14] = ceil;
    c.p[15] = cip;
    conf_in(&c, -1, nx, x, g, -5, 5, v);
    c.tol = kind <= 1 ? TOL_EXACT : TOL_DEFAULT;
    conf_push(&c, "k %lld s %lld pad %lld dil %lld%s%s%s%s", (long long)k, (long long)s, (long long)pad,
              (long long)dil, ceil ? " ceil_mode" : "", kind >= 2 ? (cip ? " count_include_pad" : " exclude_pad") : "",
              with_idx ? " indices" : "", g == G_SPECIAL ? " NaN/Inf" : "");
}

/* Max (kind 0, 1) or average (2, 3) pooling over 1 or 2 spatial dims with window k, stride
 * s and padding pad per dim, the input drawn by g in [lo, hi); with log_in the input goes
 * through log first, so G_INT's 0 and 1 become -inf and 0. */
static void pool_case_hw(int kind, kiln_dtype dt, int nx, const int64_t *x, conf_view v, const int64_t *k,
                         const int64_t *s, const int64_t *pad, int64_t dil, bool ceil, bool cip, bool with_idx,
                         conf_gen g, double lo, double hi, bool log_in)
{
    static const char *names[] = {"max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d"};
    conf_case c = conf_make(names[kind], dt, b_pool);
    c.p[0] = kind;
    c.p[1] = with_idx;
    for (int i = 0; i < 2; i++) {
        c.p[2 + i] = k[i];
        c.p[5 + i] = s[i];
        c.p[8 + i] = pad[i];
        c.p[11 + i] = dil;
    }
    c.p[14] = ceil;
    c.p[15] = cip;
    c.d[0] = log_in;
    conf_in(&c, -1, nx, x, g, lo, hi, v);
    c.tol = kind <= 1 ? TOL_EXACT : TOL_DEFAULT;
    conf_push(&c, "k %lldx%lld s %lldx%lld pad %lldx%lld dil %lld%s%s%s%s%s", (long long)k[0], (long long)k[1],
              (long long)s[0], (long long)s[1], (long long)pad[0], (long long)pad[1], (long long)dil,
              ceil ? " ceil_mode" : "", kind >= 2 ? (cip ? " count_include_pad" : " exclude_pad") : "",
              with_idx ? " indices" : "", g == G_SPECIAL ? " NaN/Inf" : g == G_INT ? " ties" : "",
              log_in ? " log(input)" : "");
}

static void adaptive_case(int kind, kiln_dtype dt, int nx, const int64_t *x, int64_t oh, int64_t ow,
                          conf_view v)
{
    conf_case c = conf_make(kind == 4 ? "adaptive_avg_pool1d" : "adaptive_avg_pool2d", dt, b_pool);
    c.p[0] = kind;
    c.p[2] = oh;
    c.p[3] = ow;
    conf_in(&c, -1, nx, x, G_UNI, -5, 5, v);
    conf_push(&c, "-> %lld x %lld", (long long)oh, (long long)ow);
}

static void interp_case(kiln_dtype dt, int nx, const int64_t *x, int64_t oh, int64_t ow, int mode,
                        bool align, conf_view v)
{
    conf_case c = conf_make("interpolate", dt, b_pool);
    c.p[0] = 6;
    c.p[2] = oh;
    c.p[3] = ow;
    c.p[4] = mode;
    c.p[5] = align;
    conf_in(&c, -1, nx, x, G_UNI, -5, 5, v);
    conf_push(&c, "%s -> %lld x %lld%s", mode ? "bilinear" : "nearest", (long long)oh, (long long)ow,
              align ? " align_corners" : "");
}

/* ---------------------------------------------------------- normalization */

static int b_norm(const conf_case *c, kiln_device *dev, kiln_tensor **in, kiln_tensor **out)
{
    switch (c->p[0]) {
    case 0: return one(out, kiln_softmax(in[0], (int)c->p[1]));
    case 1: return one(out, kiln_log_softmax(in[0], (int)c->p[1]));
    case 2:
        return one(out, kiln_layer_norm(in[0], (int)c->p[1], c->p[2] ? in[1] : NULL,
                                        c->p[2] ? in[2] : NULL, c->d[0]));
    case 3: { /* batch_norm: x, running_mean, running_var, [weight, bias] */
        bool stats = c->p[3] != 0, affine = c->p[2] != 0;
        kiln_tensor *rm = stats ? in[1] : NULL, *rv = stats ? in[2] : NULL;
        kiln_tensor *w = affine ? in[stats ? 3 : 1] : NULL, *b = affine ? in[stats ? 4 : 2] : NULL;
        out[0] = kiln_batch_norm(in[0], rm, rv, w, b, c->p[1] != 0, c->d[1], c->d[0]);
        if (!out[0])
            return -1;
        if (!stats)
            return 1;
        out[1] = rm; /* updated in place when training */
        out[2] = rv;
        return 3;
    }
    case 4:
        return one(out, kiln_group_norm(in[0], c->p[1], c->p[2] ? in[1] : NULL, c->p[2] ? in[2] : NULL,
                                        c->d[0]));
    case 5: {
        kiln_generator g = kiln_generator_make(77);
        out[0] = kiln_dropout(in[0], c->d[0], c->p[1] != 0, &g);
        if (!out[0])
            return -1;
        out[1] = kiln_dropout(in[0], c->d[0], c->p[1] != 0, &g); /* second draw differs */
        int64_t st[2] = {(int64_t)g.seed, (int64_t)g.offset};
        out[2] = kiln_from_data(dev, KILN_I64, KILN_SHAPE(2), st, sizeof st);
        return out[1] && out[2] ? 3 : -1;
    }
    case 6: {
        kiln_tensor *mask = c->p[1] ? in[3] : NULL;
        return one(out, kiln_scaled_dot_product_attention(in[0], in[1], in[2], mask, c->p[2] != 0, c->d[0]));
    }
    }
    return -1;
}

static void softmax_case(int log, kiln_dtype dt, int nx, const int64_t *x, int dim, conf_view v,
                         conf_gen g, double lo, double hi)
{
    conf_case c = conf_make(log ? "log_softmax" : "softmax", dt, b_norm);
    c.p[0] = log;
    c.p[1] = dim;
    conf_in(&c, -1, nx, x, g, lo, hi, v);
    c.tol = TOL_REL;
    c.tol_a = 1e-5;
    c.tol_b = log ? 1e-5 : 1e-7;
    conf_push(&c, "dim %d values %g..%g%s", dim, lo, hi, g == G_SPECIAL ? " NaN/Inf" : "");
}

static void layer_norm_case(kiln_dtype dt, int nx, const int64_t *x, int nnorm, bool affine, conf_view v,
                            double lo, double hi)
{
    conf_case c = conf_make("layer_norm", dt, b_norm);
    c.p[0] = 2;
    c.p[1] = nnorm;
    c.p[2] = affine;
    c.d[0] = 1e-5;
    conf_in(&c, -1, nx, x, G_UNI, lo, hi, v);
    if (affine) {
        conf_in(&c, -1, nnorm, x + nx - nnorm, G_UNI, 0.5, 1.5, V_NONE);
        conf_in(&c, -1, nnorm, x + nx - nnorm, G_UNI, -1, 1, V_NONE);
    }
    c.tol = TOL_REL;
    c.tol_a = hi > 100 ? 1e-3 : 1e-4;
    c.tol_b = hi > 100 ? 1e-3 : 1e-5;
    conf_push(&c, "over %d dims%s values %g..%g", nnorm, affine ? " affine" : "", lo, hi);
}

static void batch_norm_case(kiln_dtype dt, int nx, const int64_t *x, bool training, bool stats, bool affine,
                            conf_view v)
{
    conf_case c = conf_make("batch_norm", dt, b_norm);
    c.p[0] = 3;
    c.p[1] = training;
    c.p[2] = affine;
    c.p[3] = stats;
    c.d[0] = 1e-5;
    c.d[1] = 0.1;
    int64_t ch = x[1];
    conf_in(&c, -1, nx, x, G_UNI, -3, 5, v);
    if (stats) {
        conf_in(&c, -1, KILN_SHAPE(ch), G_UNI, -1, 1, V_NONE);
        conf_in(&c, -1, KILN_SHAPE(ch), G_UNI, 0.5, 2, V_NONE);
        c.in[1].mutated = c.in[2].mutated = training;
    }
    if (affine) {
        conf_in(&c, -1, KILN_SHAPE(ch), G_UNI, 0.5, 1.5, V_NONE);
        conf_in(&c, -1, KILN_SHAPE(ch), G_UNI, -1, 1, V_NONE);
    }
    c.tol = TOL_REL;
    c.tol_a = 1e-4;
    c.tol_b = 1e-5;
    conf_push(&c, "%s%s%s", training ? "training" : "eval", stats ? " running stats" : "",
              affine ? " affine" : "");
}

static void group_norm_case(kiln_dtype dt, int nx, const int64_t *x, int64_t groups, bool affine, conf_view v)
{
    conf_case c = conf_make("group_norm", dt, b_norm);
    c.p[0] = 4;
    c.p[1] = groups;
    c.p[2] = affine;
    c.d[0] = 1e-5;
    conf_in(&c, -1, nx, x, G_UNI, -3, 5, v);
    if (affine) {
        conf_in(&c, -1, KILN_SHAPE(x[1]), G_UNI, 0.5, 1.5, V_NONE);
        conf_in(&c, -1, KILN_SHAPE(x[1]), G_UNI, -1, 1, V_NONE);
    }
    c.tol = TOL_REL;
    c.tol_a = 1e-4;
    c.tol_b = 1e-5;
    conf_push(&c, "groups %lld%s", (long long)groups, affine ? " affine" : "");
}

static void sdpa_case(kiln_dtype dt, int nd, int64_t b, int64_t h, int64_t l, int64_t s, int64_t d,
                      int64_t dv, int mask, bool causal, double scale, conf_view vq)
{
    conf_case c = conf_make("sdpa", dt, b_norm);
    c.p[0] = 6;
    c.p[1] = mask != 0;
    c.p[2] = causal;
    c.d[0] = scale;
    int64_t q[4] = {b, h, l, d}, k[4] = {b, h, s, d}, v[4] = {b, h, s, dv};
    int off = 4 - nd;
    conf_in(&c, -1, nd, q + off, G_UNI, -2, 2, vq);
    conf_in(&c, -1, nd, k + off, G_UNI, -2, 2, V_NONE);
    conf_in(&c, -1, nd, v + off, G_UNI, -2, 2, V_NONE);
    if (mask == 1)
        conf_in(&c, KILN_BOOL, KILN_SHAPE(l, s), G_CAUSAL, 0, 1, V_NONE);
    else if (mask == 2)
        conf_in(&c, -1, KILN_SHAPE(1, 1, l, s), G_UNI, -3, 0, V_NONE);
    c.tol = TOL_REL;
    c.tol_a = 1e-4;
    c.tol_b = 1e-5;
    conf_push(&c, "%s%s scale %g", mask == 1 ? "bool mask" : mask == 2 ? "float mask" : "no mask",
              causal ? " causal" : "", scale);
}

void conf_cases_nn(void)
{
    /* convolutions */
    for (int i = 0; i < 4; i++) {
        kiln_dtype dt = float_dt[i];
        conv_case(2, dt, KILN_SHAPE(2, 3, 9, 11), KILN_SHAPE(4, 3, 3, 3), true, 1, 0, 1, 1, 0, V_NONE, false);
        conv_case(1, dt, KILN_SHAPE(2, 4, 20), KILN_SHAPE(6, 4, 5), true, 2, 2, 1, 1, 0, V_NONE, false);
        conv_case(5, dt, KILN_SHAPE(2, 4, 5, 6), KILN_SHAPE(4, 3, 3, 3), true, 2, 1, 1, 1, 1, V_NONE, false);
        if (i)
            continue;
        conv_case(2, dt, KILN_SHAPE(2, 3, 9, 11), KILN_SHAPE(4, 3, 3, 3), true, 1, 0, 1, 1, 0, V_NONE, true);
        conv_case(2, dt, KILN_SHAPE(2, 3, 9, 11), KILN_SHAPE(4, 3, 3, 3), false, 2, 1, 1, 1, 0, V_NONE, false);
        conv_case(2, dt, KILN_SHAPE(2, 3, 9, 11), KILN_SHAPE(4, 3, 3, 3), true, 1, 2, 2, 1, 0, V_NONE, false);
        conv_case(2, dt, KILN_SHAPE(2, 4, 8, 8), KILN_SHAPE(6, 2, 3, 3), true, 1, 1, 1, 2, 0, V_NONE, false);
        conv_case(2, dt, KILN_SHAPE(1, 6, 7, 7), KILN_SHAPE(6, 1, 3, 3), true, 1, 1, 1, 6, 0, V_NONE, false);
        conv_case(2, dt, KILN_SHAPE(2, 16, 5, 5), KILN_SHAPE(8, 16, 1, 1), false, 1, 0, 1, 1, 0, V_NONE, false);
        conv_case(2, dt, KILN_SHAPE(2, 3, 9, 11), KILN_SHAPE(4, 3, 3, 3), true, 1, 1, 1, 1, 0, V_T, false);
        conv_case(2, dt, KILN_SHAPE(2, 3, 9, 11), KILN_SHAPE(4, 3, 3, 3), true, 3, 1, 2, 1, 0, V_STEP, false);
        conv_case(2, dt, KILN_SHAPE(2, 8, 16, 16), KILN_SHAPE(16, 8, 3, 3), true, 1, 1, 1, 1, 0, V_NONE, false);
        conv_case(2, dt, KILN_SHAPE(1, 2, 3, 3), KILN_SHAPE(3, 2, 3, 3), true, 1, 0, 1, 1, 0, V_NONE, false);
        conv_case(2, dt, KILN_SHAPE(2, 32, 28, 28), KILN_SHAPE(32, 32, 3, 3), true, 1, 1, 1, 1, 0, V_NONE, false);
        conv_asym_case();
        /* the cpu backend's direct paths: a 1x1 kernel read in place (odd channel counts,
         * a partial last block of output channels), strided kernels on stride phases, a
         * 7x7 stride-2 stem, dilation with stride, enough positions for packed weights,
         * a strided 1-D convolution, non-contiguous inputs */
        conv_case(2, dt, KILN_SHAPE(2, 13, 12, 10), KILN_SHAPE(11, 13, 1, 1), true, 1, 0, 1, 1, 0, V_NONE, false);
        conv_case(2, dt, KILN_SHAPE(1, 16, 24, 24), KILN_SHAPE(20, 16, 1, 1), false, 2, 0, 1, 1, 0, V_NONE, false);
        conv_case(2, dt, KILN_SHAPE(2, 5, 17, 19), KILN_SHAPE(9, 5, 3, 3), true, 2, 1, 1, 1, 0, V_NONE, false);
        conv_case(2, dt, KILN_SHAPE(2, 5, 17, 19), KILN_SHAPE(9, 5, 3, 3), true, 2, 1, 1, 1, 0, V_STEP, false);
        conv_case(2, dt, KILN_SHAPE(1, 3, 30, 30), KILN_SHAPE(10, 3, 7, 7), true, 2, 3, 1, 1, 0, V_NONE, false);
        conv_case(2, dt, KILN_SHAPE(1, 4, 21, 21), KILN_SHAPE(6, 4, 3, 3), true, 2, 2, 2, 1, 0, V_NONE, false);
        conv_case(2, dt, KILN_SHAPE(1, 4, 22, 20), KILN_SHAPE(12, 4, 5, 5), true, 3, 2, 1, 1, 0, V_T, false);
        conv_case(2, dt, KILN_SHAPE(2, 3, 64, 64), KILN_SHAPE(5, 3, 3, 3), true, 1, 1, 1, 1, 0, V_NONE, false);
        conv_case(1, dt, KILN_SHAPE(2, 4, 200), KILN_SHAPE(6, 4, 5), true, 2, 2, 1, 1, 0, V_NONE, false);
        /* depthwise: groups = channels, strides, 5x5, a channel multiplier, dilation, 1-D,
         * non-contiguous inputs */
        conv_case(2, dt, KILN_SHAPE(2, 7, 13, 11), KILN_SHAPE(7, 1, 5, 5), true, 2, 2, 1, 7, 0, V_NONE, false);
        conv_case(2, dt, KILN_SHAPE(1, 5, 9, 9), KILN_SHAPE(10, 1, 3, 3), true, 1, 1, 1, 5, 0, V_NONE, false);
        conv_case(2, dt, KILN_SHAPE(1, 6, 10, 10), KILN_SHAPE(6, 1, 3, 3), false, 1, 2, 2, 6, 0, V_NONE, false);
        conv_case(2, dt, KILN_SHAPE(2, 8, 9, 9), KILN_SHAPE(8, 1, 3, 3), true, 2, 1, 1, 8, 0, V_STEP, false);
        conv_case(2, dt, KILN_SHAPE(1, 9, 40, 37), KILN_SHAPE(9, 1, 3, 3), true, 1, 0, 1, 9, 0, V_T, false);
        conv_case(1, dt, KILN_SHAPE(2, 6, 30), KILN_SHAPE(6, 1, 3), true, 2, 1, 1, 6, 0, V_NONE, false);
        conv_case(1, dt, KILN_SHAPE(2, 4, 20), KILN_SHAPE(6, 2, 3), true, 1, 1, 1, 2, 0, V_NONE, false);
        conv_case(1, dt, KILN_SHAPE(2, 4, 20), KILN_SHAPE(6, 4, 3), false, 1, 3, 3, 1, 0, V_FLIP, false);
        conv_case(1, dt, KILN_SHAPE(3, 5, 1), KILN_SHAPE(2, 5, 1), true, 1, 0, 1, 1, 0, V_NONE, false);
        conv_case(3, dt, KILN_SHAPE(1, 2, 6, 7, 5), KILN_SHAPE(4, 2, 3, 3, 3), true, 1, 1, 1, 1, 0, V_NONE, false);
        conv_case(3, dt, KILN_SHAPE(2, 2, 6, 7, 5), KILN_SHAPE(4, 2, 2, 2, 2), false, 2, 0, 1, 1, 0, V_NONE, false);
        conv_case(3, dt, KILN_SHAPE(1, 4, 6, 6, 6), KILN_SHAPE(4, 2, 3, 3, 3), true, 1, 2, 2, 2, 0, V_NONE, false);
        conv_case(4, dt, KILN_SHAPE(2, 4, 9), KILN_SHAPE(4, 3, 4), true, 2, 1, 1, 1, 1, V_NONE, false);
        conv_case(4, dt, KILN_SHAPE(2, 4, 9), KILN_SHAPE(4, 3, 3), false, 1, 0, 1, 2, 0, V_NONE, false);
        conv_case(4, dt, KILN_SHAPE(2, 4, 9), KILN_SHAPE(4, 3, 3), true, 3, 2, 2, 1, 2, V_STEP, false);
        conv_case(5, dt, KILN_SHAPE(2, 4, 5, 6), KILN_SHAPE(4, 3, 3, 3), false, 1, 0, 1, 1, 0, V_NONE, true);
        conv_case(5, dt, KILN_SHAPE(2, 4, 5, 6), KILN_SHAPE(4, 2, 3, 3), true, 2, 1, 2, 2, 1, V_NONE, false);
        conv_case(5, dt, KILN_SHAPE(1, 4, 5, 6), KILN_SHAPE(4, 3, 2, 2), true, 2, 0, 1, 1, 0, V_T, false);
    }

    /* convolution gradients: the Fashion-MNIST layers (batch above the thread count, so the
     * weight gradient splits by image), one image (split per GEMM), odd sizes, stride,
     * padding, dilation, groups, depthwise, 1x1, a strided input, f64 */
    for (int i = 0; i < 2; i++) {
        kiln_dtype dt = float_dt[i];
        conv_grad_case(2, dt, KILN_SHAPE(8, 1, 28, 28), KILN_SHAPE(32, 1, 3, 3), true, 1, 1, 1, 1, V_NONE);
        conv_grad_case(2, dt, KILN_SHAPE(5, 32, 14, 14), KILN_SHAPE(64, 32, 3, 3), true, 1, 1, 1, 1, V_NONE);
        conv_grad_case(2, dt, KILN_SHAPE(1, 3, 9, 11), KILN_SHAPE(4, 3, 3, 3), true, 1, 0, 1, 1, V_NONE);
        conv_grad_case(2, dt, KILN_SHAPE(3, 3, 9, 11), KILN_SHAPE(4, 3, 3, 3), false, 2, 1, 1, 1, V_NONE);
        conv_grad_case(2, dt, KILN_SHAPE(3, 3, 10, 9), KILN_SHAPE(5, 3, 3, 2), true, 1, 2, 2, 1, V_STEP);
        conv_grad_case(2, dt, KILN_SHAPE(4, 4, 8, 7), KILN_SHAPE(6, 2, 3, 3), true, 1, 1, 1, 2, V_NONE);
        conv_grad_case(2, dt, KILN_SHAPE(3, 6, 7, 7), KILN_SHAPE(6, 1, 3, 3), true, 2, 1, 1, 6, V_T);
        conv_grad_case(2, dt, KILN_SHAPE(3, 16, 5, 6), KILN_SHAPE(8, 16, 1, 1), false, 1, 0, 1, 1, V_NONE);
        conv_grad_case(1, dt, KILN_SHAPE(5, 4, 17), KILN_SHAPE(6, 4, 5), true, 2, 2, 1, 1, V_NONE);
    }

    /* pooling */
    for (int i = 0; i < 4; i++) {
        kiln_dtype dt = float_dt[i];
        pool_case(1, dt, KILN_SHAPE(2, 3, 11, 13), V_NONE, 2, 0, 0, 0, false, true, true, G_UNI);
        pool_case(3, dt, KILN_SHAPE(2, 3, 11, 13), V_NONE, 3, 2, 1, 0, false, true, false, G_UNI);
        if (i)
            continue;
        pool_case(1, dt, KILN_SHAPE(2, 3, 11, 13), V_NONE, 3, 2, 1, 0, false, true, true, G_UNI);
        pool_case(1, dt, KILN_SHAPE(2, 3, 11, 13), V_NONE, 3, 2, 1, 0, true, true, true, G_UNI);
        pool_case(1, dt, KILN_SHAPE(2, 3, 11, 13), V_NONE, 2, 1, 0, 2, false, true, true, G_UNI);
        pool_case(1, dt, KILN_SHAPE(2, 3, 11, 13), V_T, 2, 2, 1, 1, true, true, false, G_UNI);
        pool_case(1, dt, KILN_SHAPE(2, 3, 10, 12), V_NONE, 2, 0, 0, 0, false, true, true, G_SPECIAL);
        pool_case(1, dt, KILN_SHAPE(4, 32, 32), V_NONE, 2, 0, 0, 0, false, true, true, G_UNI);
        /* the cpu 2x2 training path: ties (first maximum's index wins), a strided view */
        pool_case(1, dt, KILN_SHAPE(3, 5, 8, 9), V_NONE, 2, 0, 0, 0, false, true, true, G_INT);
        pool_case(1, dt, KILN_SHAPE(3, 5, 8, 9), V_STEP, 2, 0, 0, 0, false, true, true, G_UNI);
        /* rows of 8 windows and more, which the cpu takes a vector at a time: ties, and
         * NaN/inf in some vectors and not others */
        pool_case(1, dt, KILN_SHAPE(2, 3, 6, 41), V_NONE, 2, 0, 0, 0, false, true, true, G_INT);
        pool_case(1, dt, KILN_SHAPE(2, 3, 6, 41), V_NONE, 2, 0, 0, 0, false, true, true, G_SPECIAL);
        pool_case(1, dt, KILN_SHAPE(2, 16, 64, 66), V_NONE, 2, 0, 0, 0, false, true, false, G_UNI);
        pool_case(3, dt, KILN_SHAPE(2, 16, 64, 66), V_NONE, 2, 0, 0, 0, false, true, false, G_UNI);
        pool_case(0, dt, KILN_SHAPE(2, 3, 17), V_NONE, 3, 2, 1, 0, false, true, true, G_UNI);
        pool_case(0, dt, KILN_SHAPE(2, 3, 17), V_NONE, 3, 2, 0, 0, true, true, true, G_UNI);
        pool_case(0, dt, KILN_SHAPE(2, 3, 17), V_STEP, 2, 0, 0, 2, false, true, false, G_UNI);
        pool_case(3, dt, KILN_SHAPE(2, 3, 11, 13), V_NONE, 3, 2, 1, 0, false, false, false, G_UNI);
        pool_case(3, dt, KILN_SHAPE(2, 3, 11, 13), V_NONE, 3, 2, 1, 0, true, true, false, G_UNI);
        pool_case(3, dt, KILN_SHAPE(2, 3, 11, 13), V_NONE, 3, 2, 1, 0, true, false, false, G_UNI);
        pool_case(3, dt, KILN_SHAPE(2, 3, 11, 13), V_NONE, 2, 0, 0, 0, true, true, false, G_UNI);
        pool_case(3, dt, KILN_SHAPE(2, 3, 11, 13), V_FLIP, 2, 2, 0, 0, false, true, false, G_UNI);
        pool_case(2, dt, KILN_SHAPE(2, 3, 17), V_NONE, 3, 2, 1, 0, false, true, false, G_UNI);
        pool_case(2, dt, KILN_SHAPE(2, 3, 17), V_NONE, 4, 3, 2, 0, true, false, false, G_UNI);
        /* the cpu f32 row path: ResNet's 3x3 stride-2 pad-1 max pool on odd and even
         * sizes and on rows wider than one block of outputs, ties (the first maximum's
         * index), NaN/Inf, windows of -inf only (padding never wins; the index is the
         * window's first element inside the input), 2x2 with padding, kernels larger than
         * the stride, strides 1 and 3, dilation, ceil_mode, a non-square window, a strided
         * view, and average pooling, which takes the same path */
        pool_case(1, dt, KILN_SHAPE(2, 5, 15, 17), V_NONE, 3, 2, 1, 0, false, true, true, G_UNI);
        pool_case(1, dt, KILN_SHAPE(1, 4, 16, 18), V_NONE, 3, 2, 1, 0, false, true, false, G_UNI);
        pool_case(1, dt, KILN_SHAPE(1, 3, 9, 600), V_NONE, 3, 2, 1, 0, false, true, true, G_UNI);
        pool_case(1, dt, KILN_SHAPE(1, 3, 9, 600), V_NONE, 3, 2, 1, 0, false, true, false, G_UNI);
        pool_case(1, dt, KILN_SHAPE(2, 3, 13, 40), V_NONE, 3, 2, 1, 0, false, true, true, G_INT);
        pool_case(1, dt, KILN_SHAPE(2, 3, 13, 40), V_NONE, 3, 2, 1, 0, false, true, true, G_SPECIAL);
        pool_case(1, dt, KILN_SHAPE(2, 3, 13, 40), V_NONE, 3, 2, 1, 0, false, true, false, G_SPECIAL);
        {
            static const int64_t k33[2] = {3, 3}, s22[2] = {2, 2}, p11[2] = {1, 1};
            static const int64_t k32[2] = {3, 2}, s21[2] = {2, 1}, p10[2] = {1, 0};
            pool_case_hw(1, dt, KILN_SHAPE(2, 3, 12, 37), V_NONE, k33, s22, p11, 1, false, true, true, G_INT, 0, 1,
                         true);
            pool_case_hw(1, dt, KILN_SHAPE(2, 3, 12, 37), V_NONE, k33, s22, p11, 1, false, true, false, G_INT, 0, 1,
                         true);
            pool_case_hw(1, dt, KILN_SHAPE(2, 3, 12, 37), V_NONE, k33, s22, p11, 1, true, true, true, G_INT, 0, 2,
                         true);
            pool_case_hw(1, dt, KILN_SHAPE(2, 3, 15, 41), V_NONE, k32, s21, p10, 1, false, true, true, G_UNI, -5, 5,
                         false);
            pool_case_hw(3, dt, KILN_SHAPE(2, 3, 15, 41), V_NONE, k32, s21, p10, 1, true, false, false, G_UNI, -5,
                         5, false);
        }
        pool_case(1, dt, KILN_SHAPE(2, 3, 15, 17), V_NONE, 2, 2, 1, 0, false, true, true, G_UNI);
        pool_case(1, dt, KILN_SHAPE(2, 3, 15, 41), V_NONE, 5, 2, 2, 0, false, true, true, G_UNI);
        pool_case(1, dt, KILN_SHAPE(2, 3, 15, 41), V_NONE, 3, 1, 1, 0, false, true, true, G_UNI);
        pool_case(1, dt, KILN_SHAPE(2, 3, 15, 50), V_NONE, 3, 3, 1, 0, false, true, true, G_UNI);
        pool_case(1, dt, KILN_SHAPE(2, 3, 15, 41), V_NONE, 3, 2, 1, 2, false, true, true, G_UNI);
        pool_case(1, dt, KILN_SHAPE(2, 3, 16, 42), V_NONE, 3, 2, 1, 0, true, true, true, G_UNI);
        pool_case(1, dt, KILN_SHAPE(2, 3, 16, 42), V_NONE, 3, 2, 0, 0, true, true, true, G_UNI);
        pool_case(1, dt, KILN_SHAPE(2, 3, 15, 41), V_STEP, 3, 2, 1, 0, false, true, true, G_UNI);
        pool_case(0, dt, KILN_SHAPE(2, 3, 700), V_NONE, 3, 2, 1, 0, false, true, true, G_UNI);
        pool_case(3, dt, KILN_SHAPE(2, 3, 15, 41), V_NONE, 3, 2, 1, 0, false, true, false, G_UNI);
        pool_case(3, dt, KILN_SHAPE(2, 3, 15, 41), V_NONE, 3, 2, 1, 0, false, false, false, G_UNI);
        pool_case(3, dt, KILN_SHAPE(2, 3, 16, 42), V_NONE, 3, 2, 1, 0, true, false, false, G_UNI);
        pool_case(3, dt, KILN_SHAPE(1, 3, 9, 600), V_NONE, 3, 1, 1, 0, false, true, false, G_UNI);
        pool_case(3, dt, KILN_SHAPE(2, 3, 13, 40), V_NONE, 3, 2, 1, 0, false, true, false, G_SPECIAL);
    }
    for (int i = 0; i < 4; i++) {
        kiln_dtype dt = float_dt[i];
        adaptive_case(5, dt, KILN_SHAPE(2, 3, 11, 13), 4, 5, V_NONE);
        if (i)
            continue;
        adaptive_case(5, dt, KILN_SHAPE(2, 3, 11, 13), 1, 1, V_NONE);
        adaptive_case(5, dt, KILN_SHAPE(2, 3, 11, 13), 11, 13, V_T);
        adaptive_case(5, dt, KILN_SHAPE(2, 3, 7, 6), 10, 3, V_NONE);
        adaptive_case(5, dt, KILN_SHAPE(2, 16, 8, 8), 2, 2, V_STEP);
        adaptive_case(4, dt, KILN_SHAPE(2, 3, 17), 5, 0, V_NONE);
        adaptive_case(4, dt, KILN_SHAPE(2, 3, 17), 1, 0, V_FLIP);
        adaptive_case(4, dt, KILN_SHAPE(2, 3, 5), 8, 0, V_NONE);
    }
    for (int i = 0; i < 4; i++) {
        kiln_dtype dt = float_dt[i];
        for (int mode = 0; mode < 2; mode++)
            for (int align = 0; align < (mode ? 2 : 1); align++) {
                interp_case(dt, KILN_SHAPE(2, 3, 11, 13), 22, 26, mode, align, V_NONE);
                if (i)
                    continue;
                interp_case(dt, KILN_SHAPE(2, 3, 11, 13), 5, 6, mode, align, V_NONE);
                interp_case(dt, KILN_SHAPE(2, 3, 11, 13), 17, 9, mode, align, V_T);
                interp_case(dt, KILN_SHAPE(1, 2, 1, 1), 3, 4, mode, align, V_NONE);
                interp_case(dt, KILN_SHAPE(1, 2, 6, 6), 6, 6, mode, align, V_FLIP);
            }
    }

    /* softmax and log_softmax */
    for (int log = 0; log < 2; log++) {
        softmax_case(log, KILN_F32, KILN_SHAPE(5, 7, 11), -1, V_NONE, G_UNI, -5, 5);
        softmax_case(log, KILN_F32, KILN_SHAPE(5, 7, 11), 0, V_NONE, G_UNI, -5, 5);
        softmax_case(log, KILN_F32, KILN_SHAPE(5, 7, 11), 1, V_NONE, G_UNI, -5, 5);
        softmax_case(log, KILN_F32, KILN_SHAPE(16, 1000), -1, V_NONE, G_UNI, -5, 5);
        softmax_case(log, KILN_F32, KILN_SHAPE(256, 2049), -1, V_NONE, G_UNI, -8, 8);
        softmax_case(log, KILN_F32, KILN_SHAPE(64, 33, 40), 1, V_NONE, G_UNI, -8, 8);
        softmax_case(log, KILN_F32, KILN_SHAPE(8, 100), -1, V_NONE, G_UNI, 500, 1000);
        softmax_case(log, KILN_F32, KILN_SHAPE(8, 100), -1, V_NONE, G_UNI, -1000, -500);
        softmax_case(log, KILN_F32, KILN_SHAPE(9, 10), -1, V_T, G_UNI, -5, 5);
        softmax_case(log, KILN_F32, KILN_SHAPE(9, 10), 0, V_STEP, G_UNI, -5, 5);
        softmax_case(log, KILN_F32, KILN_SHAPE(3, 9, 10), 1, V_EXPAND, G_UNI, -5, 5);
        softmax_case(log, KILN_F32, KILN_SHAPE(7, 9), -1, V_NONE, G_SPECIAL, -5, 5);
        softmax_case(log, KILN_F32, KILN_SHAPE(7, 1), -1, V_NONE, G_UNI, -5, 5);
        softmax_case(log, KILN_F32, KILN_SHAPE(0, 4), -1, V_NONE, G_UNI, -5, 5);
        for (int i = 1; i < 4; i++)
            softmax_case(log, float_dt[i], KILN_SHAPE(5, 7, 33), -1, V_NONE, G_UNI, -5, 5);
    }
    for (int i = 0; i < 4; i++) {
        kiln_dtype dt = float_dt[i];
        layer_norm_case(dt, KILN_SHAPE(4, 7, 33), 1, true, V_NONE, -3, 5);
        if (i)
            continue;
        layer_norm_case(dt, KILN_SHAPE(4, 7, 33), 2, true, V_NONE, -3, 5);
        layer_norm_case(dt, KILN_SHAPE(4, 7, 33), 1, false, V_NONE, -3, 5);
        layer_norm_case(dt, KILN_SHAPE(4, 7, 33), 1, true, V_T, -3, 5);
        layer_norm_case(dt, KILN_SHAPE(64, 1024), 1, true, V_NONE, -3, 5);
        layer_norm_case(dt, KILN_SHAPE(512, 1023), 1, true, V_NONE, -3, 5);
        layer_norm_case(dt, KILN_SHAPE(8, 256), 1, true, V_NONE, 1000, 1001);
        layer_norm_case(dt, KILN_SHAPE(5, 1), 1, true, V_NONE, -3, 5);
    }
    for (int i = 0; i < 4; i++) {
        kiln_dtype dt = float_dt[i];
        batch_norm_case(dt, KILN_SHAPE(4, 3, 5, 6), true, true, true, V_NONE);
        batch_norm_case(dt, KILN_SHAPE(4, 3, 5, 6), false, true, true, V_NONE);
        if (i)
            continue;
        batch_norm_case(dt, KILN_SHAPE(8, 5), true, true, true, V_NONE);
        batch_norm_case(dt, KILN_SHAPE(8, 5), false, true, false, V_NONE);
        batch_norm_case(dt, KILN_SHAPE(4, 3, 5, 6), true, false, true, V_NONE);
        batch_norm_case(dt, KILN_SHAPE(4, 3, 5, 6), true, false, false, V_T);
        batch_norm_case(dt, KILN_SHAPE(2, 4, 7), true, true, false, V_STEP);
    }
    for (int i = 0; i < 4; i++) {
        kiln_dtype dt = float_dt[i];
        group_norm_case(dt, KILN_SHAPE(2, 6, 5, 4), 3, true, V_NONE);
        if (i)
            continue;
        group_norm_case(dt, KILN_SHAPE(2, 6, 5, 4), 1, true, V_NONE);
        group_norm_case(dt, KILN_SHAPE(2, 6, 5, 4), 6, false, V_NONE);
        group_norm_case(dt, KILN_SHAPE(3, 4, 10), 2, true, V_T);
        group_norm_case(dt, KILN_SHAPE(2, 8, 16, 16), 4, true, V_NONE);
    }
    static const double ps[] = {0.3, 0.0, 1.0, 0.5};
    for (int i = 0; i < 4; i++)
        for (int tr = 0; tr < 2; tr++) {
            conf_case c = conf_make("dropout", i == 3 ? KILN_F16 : KILN_F32, b_norm);
            c.p[0] = 5;
            c.p[1] = tr;
            c.d[0] = ps[i];
            conf_in(&c, -1, KILN_SHAPE(33, 65), G_UNI, -3, 3, i == 0 ? V_T : V_NONE);
            c.tol = TOL_REL;
            c.tol_a = 1e-6;
            c.tol_b = 0;
            conf_push(&c, "p %g %s, two draws + state", ps[i], tr ? "training" : "eval");
        }

    /* attention */
    for (int i = 0; i < 4; i++) {
        kiln_dtype dt = float_dt[i];
        sdpa_case(dt, 4, 2, 3, 5, 7, 8, 6, 0, false, 0, V_NONE);
        sdpa_case(dt, 4, 2, 3, 6, 6, 8, 8, 0, true, 0, V_NONE);
        if (i)
            continue;
        sdpa_case(dt, 4, 2, 3, 5, 7, 8, 6, 1, false, 0, V_NONE);
        sdpa_case(dt, 4, 2, 3, 5, 7, 8, 6, 2, false, 0, V_NONE);
        sdpa_case(dt, 4, 2, 3, 5, 7, 8, 6, 0, true, 0, V_NONE);
        sdpa_case(dt, 4, 2, 3, 6, 6, 8, 8, 2, true, 0.3, V_NONE);
        sdpa_case(dt, 3, 1, 4, 9, 9, 16, 16, 0, true, 0, V_NONE);
        sdpa_case(dt, 4, 2, 3, 6, 6, 8, 8, 0, false, 0, V_T);
        sdpa_case(dt, 4, 1, 2, 1, 1, 4, 4, 0, true, 0, V_NONE);
        sdpa_case(dt, 4, 2, 4, 32, 32, 16, 16, 0, true, 0, V_NONE);
    }
}
