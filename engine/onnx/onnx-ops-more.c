/*
 * onnx-ops-more.c — ONNX operators PyTorch exports that the other operator files lack:
 * ScatterElements (and the deprecated Scatter), PRelu, ReduceL1, ReduceL2,
 * ReduceSumSquare, ReduceLogSum, ReduceLogSumExp, DepthToSpace, SpaceToDepth, the
 * activations Mish, Selu, Celu, Softsign and ThresholdedRelu, and the inverse and
 * hyperbolic trigonometric functions.
 *
 * Everything is composed from kiln tensor ops, so it runs on every device and, except
 * ScatterElements' mul/max/min reductions (no engine op, computed on the host like
 * ScatterND's), is differentiable. The trigonometric functions kiln has no op for are
 * built from exp/expm1/log1p/sqrt and, for the inverse circular ones, Cephes' rational
 * approximation of atan; each formula is chosen to avoid cancellation near zero and
 * overflow near the ends of the range (tests/onnx/onnx_more.c checks them within 1e-6
 * relative of libm's double over their domains, edges included). Branches that are
 * selected with where() get inputs clamped to their own range, so the branch not taken
 * never makes an inf whose zero gradient would turn into NaN.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error-impl.h"
#include "onnx-impl.h"

#define MAXI 64

static bool is_float(const kiln_tensor *t)
{
    return kiln_dtype_is_float(kiln_tensor_dtype(t));
}

/* A 0-d tensor of x's dtype on x's device, to compare or combine x with. */
static kiln_tensor *scalar_like(kiln_tensor *x, double v)
{
    return kiln_full(kiln_tensor_device(x), kiln_tensor_dtype(x), 0, NULL, v);
}

/* --------------------------------------------------------- ScatterElements */

enum {
    RED_NONE,
    RED_ADD,
    RED_MUL,
    RED_MAX,
    RED_MIN
};

/* mul / max / min on the host: no engine op does them. Integers (and bool) as i64 and
 * floats as f64, so both are exact. off[i] is update i's flat position in data. */
#define HOST_REDUCE(T, KT)                                                                                        \
    static kiln_tensor *host_reduce_##T(const kiln__onnx_node *n, kiln_tensor *data, kiln_tensor *upd,            \
                                        const int64_t *off, int64_t nupd, int red)                                \
    {                                                                                                             \
        int64_t total = kiln_tensor_numel(data);                                                                  \
        T *dv = malloc((size_t)(total > 0 ? total : 1) * sizeof *dv);                                             \
        T *uv = malloc((size_t)(nupd > 0 ? nupd : 1) * sizeof *uv);                                               \
        kiln_tensor *dc = kiln_cast(data, KT), *uc = kiln_cast(upd, KT), *y = NULL;                               \
        if (!dv || !uv) {                                                                                         \
            kiln__onnx_fail(n, "out of memory");                                                                  \
        } else if (dc && uc && !kiln_to_data(dc, dv, (size_t)total * sizeof *dv) &&                               \
                   !kiln_to_data(uc, uv, (size_t)nupd * sizeof *uv)) {                                            \
            for (int64_t i = 0; i < nupd; i++) {                                                                  \
                T *d = dv + off[i], s = uv[i];                                                                    \
                *d = red == RED_MUL ? *d * s : red == RED_MAX ? (s > *d ? s : *d) : (s < *d ? s : *d);            \
            }                                                                                                     \
            y = kiln_from_data(kiln_tensor_device(data), KT, kiln_tensor_ndim(data), kiln_tensor_shape(data), dv, \
                               (size_t)total * sizeof *dv);                                                       \
        }                                                                                                         \
        free(dv);                                                                                                 \
        free(uv);                                                                                                 \
        return y ? kiln_cast(y, kiln_tensor_dtype(data)) : NULL;                                                  \
    }
HOST_REDUCE(double, KILN_F64)
HOST_REDUCE(int64_t, KILN_I64)

/* ScatterElements (opset 11+, reduction from 16, max/min from 18) and Scatter (9-10, no
 * reduction). Every index is read and checked on the host first, so one out of range
 * fails the node by name instead of reaching outside the data; negative ones wrap. */
static int op_scatter_elements(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout,
                               kiln_tensor **out)
{
    KILN__ONNX_NEED(3);
    kiln_tensor *data = in[0], *idx = in[1], *upd = in[2];
    const char *rs = kiln__onnx_attr_str(n, "reduction", "none");
    int red = !strcmp(rs, "none")  ? RED_NONE
              : !strcmp(rs, "add") ? RED_ADD
              : !strcmp(rs, "mul") ? RED_MUL
              : !strcmp(rs, "max") ? RED_MAX
              : !strcmp(rs, "min") ? RED_MIN
                                   : -1;
    if (red < 0)
        return kiln__onnx_fail(n, "reduction '%s' not supported (none, add, mul, max, min)", rs);
    if (is_float(idx) || kiln_tensor_dtype(idx) == KILN_BOOL)
        return kiln__onnx_fail(n, "indices must be integers");
    int r = kiln_tensor_ndim(data), a;
    if (r < 1)
        return kiln__onnx_fail(n, "data must have rank >= 1");
    if (kiln_tensor_ndim(idx) != r || kiln_tensor_ndim(upd) != r)
        return kiln__onnx_fail(n, "indices have rank %d and updates %d; data has %d, all must be equal",
                               kiln_tensor_ndim(idx), kiln_tensor_ndim(upd), r);
    if (kiln__onnx_axis(n, kiln__onnx_attr_int(n, "axis", 0), r, &a))
        return -1;
    for (int i = 0; i < r; i++) {
        int64_t di = kiln_tensor_dim(idx, i);
        if (kiln_tensor_dim(upd, i) != di)
            return kiln__onnx_fail(n, "updates dim %d is %lld, indices have %lld", i,
                                   (long long)kiln_tensor_dim(upd, i), (long long)di);
        if (i != a && di > kiln_tensor_dim(data, i))
            return kiln__onnx_fail(n, "indices dim %d is %lld, more than the data's %lld", i, (long long)di,
                                   (long long)kiln_tensor_dim(data, i));
    }
    int64_t nupd = kiln_tensor_numel(idx), size = kiln_tensor_dim(data, a);
    if (nupd == 0) {
        out[0] = data;
        return 0;
    }
    int64_t *iv = malloc((size_t)nupd * sizeof *iv);
    if (!iv)
        return kiln__onnx_fail(n, "out of memory");
    kiln_tensor *ic = kiln_cast(idx, KILN_I64);
    if (!ic || kiln_to_data(ic, iv, (size_t)nupd * sizeof *iv)) {
        free(iv);
        return -1;
    }
    for (int64_t i = 0; i < nupd; i++) {
        if (iv[i] < -size || iv[i] >= size) {
            long long v = (long long)iv[i];
            free(iv);
            return kiln__onnx_fail(n, "index %lld out of range for axis %d of size %lld (element %lld)", v, a,
                                   (long long)size, (long long)i);
        }
        if (iv[i] < 0)
            iv[i] += size;
    }
    kiln_tensor *y = NULL;
    if (red == RED_NONE || red == RED_ADD) {
        kiln_tensor *ix = kiln_from_data(kiln_tensor_device(data), KILN_I64, r, kiln_tensor_shape(idx), iv,
                                         (size_t)nupd * sizeof *iv);
        kiln_tensor *u = kiln_cast(upd, kiln_tensor_dtype(data));
        y = red == RED_NONE ? kiln_scatter(data, a, ix, u) : kiln_scatter_add(data, a, ix, u);
    } else {
        /* each update's flat position in data: its own position with the axis index replaced */
        const int64_t *ds = kiln_tensor_shape(data), *is = kiln_tensor_shape(idx);
        for (int64_t i = 0; i < nupd; i++) {
            int64_t rest = i, off = 0, stride = 1;
            for (int d = r - 1; d >= 0; d--) {
                int64_t c = rest % is[d];
                rest /= is[d];
                off += (d == a ? iv[i] : c) * stride;
                stride *= ds[d];
            }
            iv[i] = off;
        }
        y = is_float(data) ? host_reduce_double(n, data, upd, iv, nupd, red)
                           : host_reduce_int64_t(n, data, upd, iv, nupd, red);
    }
    free(iv);
    out[0] = y;
    return kiln__onnx_ok(out);
}

/* -------------------------------------------------------------------- PRelu */

/* y = x < 0 ? slope * x : x, slope broadcast to x one way (NumPy's rules, right-aligned;
 * the result always has x's shape). */
static int op_prelu(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out)
{
    KILN__ONNX_NEED(2);
    kiln_tensor *x = in[0], *s = in[1];
    int rx = kiln_tensor_ndim(x), rs = kiln_tensor_ndim(s);
    bool fits = rs <= rx;
    for (int i = 1; fits && i <= rs; i++) {
        int64_t ds = kiln_tensor_dim(s, -i);
        fits = ds == 1 || ds == kiln_tensor_dim(x, -i);
    }
    if (!fits) {
        char dx[160], dsl[160];
        return kiln__onnx_fail(n, "slope %s does not broadcast to x %s", kiln_tensor_describe(s, dsl, sizeof dsl),
                               kiln_tensor_describe(x, dx, sizeof dx));
    }
    if (kiln_tensor_dtype(s) != kiln_tensor_dtype(x))
        s = kiln_cast(s, kiln_tensor_dtype(x));
    out[0] = kiln_where(kiln_lt(x, scalar_like(x, 0.0)), kiln_mul(x, s), x);
    return kiln__onnx_ok(out);
}

/* -------------------------------------------------------------- reductions */

enum {
    R_L1,
    R_L2,
    R_SUM_SQUARE,
    R_LOG_SUM,
    R_LOG_SUM_EXP
};

/* axes: the attribute before opset 18, the second input from 18 (either is taken at any
 * opset, as the other Reduce* do). noop_with_empty_axes with no axes reduces over no
 * axis: the elementwise part alone (|x|, x², log x...), as ONNX Runtime does. Integer
 * inputs: L1 and SumSquare in integers, the others in f64 truncated back; f16 and bf16
 * are computed in f32, where x² and the sums do not overflow as early. */
static int reduce_more(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, kiln_tensor **out, int kind)
{
    KILN__ONNX_NEED(1);
    kiln_tensor *x = in[0];
    kiln_dtype dt = kiln_tensor_dtype(x);
    int r = kiln_tensor_ndim(x), dims[KILN_MAX_DIMS];
    int64_t ax[MAXI];
    int k = nin > 1 && in[1] ? kiln__onnx_read_ints(n, in[1], ax, MAXI)
                             : kiln__onnx_attr_ints(n, "axes", ax, MAXI);
    if (nin > 1 && in[1] && k < 0)
        return -1;
    bool keep = kiln__onnx_attr_int(n, "keepdims", 1) != 0;
    bool noop = k <= 0 && kiln__onnx_attr_int(n, "noop_with_empty_axes", 0) != 0;
    if (k > r && r > 0)
        return kiln__onnx_fail(n, "%d axes for rank %d", k, r);
    for (int i = 0; i < k; i++) {
        if (kiln__onnx_axis(n, ax[i], r, &dims[i]))
            return -1;
        for (int j = 0; j < i; j++)
            if (dims[j] == dims[i])
                return kiln__onnx_fail(n, "axis %d given twice", dims[i]);
    }
    if (k <= 0) {
        k = r;
        for (int i = 0; i < r; i++)
            dims[i] = i;
    }
    bool exact_int = kind == R_L1 || kind == R_SUM_SQUARE;
    if (!is_float(x))
        x = kiln_cast(x, exact_int ? KILN_I64 : KILN_F64);
    else if (dt == KILN_F16 || dt == KILN_BF16)
        x = kiln_cast(x, KILN_F32);
    kiln_tensor *y;
    if (noop || r == 0) {
        y = kind == R_L1 || kind == R_L2 ? kiln_abs(x)
            : kind == R_SUM_SQUARE       ? kiln_mul(x, x)
            : kind == R_LOG_SUM          ? kiln_log(x)
                                         : x;
    } else if (kind == R_LOG_SUM_EXP) {
        y = kiln_logsumexp(x, k, dims, keep);
    } else {
        kiln_tensor *t = kind == R_L1 ? kiln_abs(x) : kind == R_LOG_SUM ? x : kiln_mul(x, x);
        y = kiln_sum(t, k, dims, keep);
        if (kind == R_L2)
            y = kiln_sqrt(y);
        else if (kind == R_LOG_SUM)
            y = kiln_log(y);
    }
    out[0] = kiln_cast(y, dt);
    return kiln__onnx_ok(out);
}

#define REDUCE_OP(NAME, KIND)                                                                                     \
    static int NAME(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out)       \
    {                                                                                                             \
        return reduce_more(n, nin, in, out, KIND);                                                                \
    }
REDUCE_OP(op_reduce_l1, R_L1)
REDUCE_OP(op_reduce_l2, R_L2)
REDUCE_OP(op_reduce_sum_square, R_SUM_SQUARE)
REDUCE_OP(op_reduce_log_sum, R_LOG_SUM)
REDUCE_OP(op_reduce_log_sum_exp, R_LOG_SUM_EXP)

/* ------------------------------------------------- DepthToSpace, SpaceToDepth */

static int block_args(const kiln__onnx_node *n, kiln_tensor *x, int64_t *b, int64_t *c, int64_t *h, int64_t *w)
{
    if (kiln_tensor_ndim(x) != 4)
        return kiln__onnx_fail(n, "input must have rank 4 [N, C, H, W], got rank %d", kiln_tensor_ndim(x));
    *b = kiln__onnx_attr_int(n, "blocksize", 0);
    if (*b < 1)
        return kiln__onnx_fail(n, "blocksize %lld must be at least 1", (long long)*b);
    *c = kiln_tensor_dim(x, 1);
    *h = kiln_tensor_dim(x, 2);
    *w = kiln_tensor_dim(x, 3);
    return 0;
}

/* [N, C, H, W] -> [N, C/b², H b, W b]. DCR: the depth splits as (b, b, C/b²), the
 * default; CRD: as (C/b², b, b), PixelShuffle's order. */
static int op_depth_to_space(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout,
                             kiln_tensor **out)
{
    KILN__ONNX_NEED(1);
    kiln_tensor *x = in[0];
    int64_t b, c, h, w, nb = kiln_tensor_ndim(x) == 4 ? kiln_tensor_dim(x, 0) : 0;
    if (block_args(n, x, &b, &c, &h, &w))
        return -1;
    const char *mode = kiln__onnx_attr_str(n, "mode", "DCR");
    bool dcr = !strcmp(mode, "DCR");
    if (!dcr && strcmp(mode, "CRD"))
        return kiln__onnx_fail(n, "mode '%s' not supported (DCR, CRD)", mode);
    if (c % (b * b))
        return kiln__onnx_fail(n, "channels %lld are not a multiple of blocksize² %lld", (long long)c,
                               (long long)(b * b));
    int64_t cb = c / (b * b);
    kiln_tensor *t = dcr ? kiln_reshape(x, 6, (const int64_t[]){nb, b, b, cb, h, w})
                         : kiln_reshape(x, 6, (const int64_t[]){nb, cb, b, b, h, w});
    t = dcr ? kiln_permute(t, 6, (const int[]){0, 3, 4, 1, 5, 2})
            : kiln_permute(t, 6, (const int[]){0, 1, 4, 2, 5, 3});
    out[0] = kiln_reshape(kiln_contiguous(t), 4, (const int64_t[]){nb, cb, h * b, w * b});
    return kiln__onnx_ok(out);
}

/* [N, C, H, W] -> [N, C b², H/b, W/b], the inverse of DepthToSpace's DCR. */
static int op_space_to_depth(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout,
                             kiln_tensor **out)
{
    KILN__ONNX_NEED(1);
    kiln_tensor *x = in[0];
    int64_t b, c, h, w, nb = kiln_tensor_ndim(x) == 4 ? kiln_tensor_dim(x, 0) : 0;
    if (block_args(n, x, &b, &c, &h, &w))
        return -1;
    if (h % b || w % b)
        return kiln__onnx_fail(n, "height %lld and width %lld must be multiples of blocksize %lld", (long long)h,
                               (long long)w, (long long)b);
    kiln_tensor *t = kiln_reshape(x, 6, (const int64_t[]){nb, c, h / b, b, w / b, b});
    t = kiln_permute(t, 6, (const int[]){0, 3, 5, 1, 2, 4});
    out[0] = kiln_reshape(kiln_contiguous(t), 4, (const int64_t[]){nb, c * b * b, h / b, w / b});
    return kiln__onnx_ok(out);
}

/* -------------------------------------------------------------- activations */

/* The spec types these floats only; kiln's unary ops would quietly give f32 for integers. */
static int need_float(const kiln__onnx_node *n, kiln_tensor *x)
{
    if (is_float(x))
        return 0;
    return kiln__onnx_fail(n, "input must be a float tensor, got %s", kiln_dtype_name(kiln_tensor_dtype(x)));
}

#define FLOAT_UNARY(NAME, EXPR)                                                                                   \
    static int NAME(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out)       \
    {                                                                                                             \
        KILN__ONNX_NEED(1);                                                                                       \
        kiln_tensor *x = in[0];                                                                                   \
        if (need_float(n, x))                                                                                     \
            return -1;                                                                                            \
        out[0] = (EXPR);                                                                                          \
        return kiln__onnx_ok(out);                                                                                \
    }

/* x tanh(softplus(x)); kiln's softplus is linear above 20, where tanh is 1 in f32 and f64 alike */
FLOAT_UNARY(op_mish, kiln_mul(x, kiln_tanh(kiln_softplus(x, 1.0, 20.0))))
/* gamma (x > 0 ? x : alpha (e^x - 1)) = gamma elu(x, alpha); ONNX's defaults are f32 roundings */
FLOAT_UNARY(op_selu, kiln_mul_scalar(kiln_elu(x, kiln__onnx_attr_float(n, "alpha", 1.67326319217681884765625)),
                                     kiln__onnx_attr_float(n, "gamma", 1.05070102214813232421875)))
FLOAT_UNARY(op_softsign, kiln_div(x, kiln_add_scalar(kiln_abs(x), 1.0)))

/* max(0, x) + min(0, alpha (e^(x/alpha) - 1)): the second term is exactly 0 for x > 0 and
 * the first for x <= 0, so x passes unchanged; expm1 keeps small negative x accurate. */
static int op_celu(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out)
{
    KILN__ONNX_NEED(1);
    kiln_tensor *x = in[0];
    if (need_float(n, x))
        return -1;
    double alpha = kiln__onnx_attr_float(n, "alpha", 1.0);
    if (alpha == 0)
        return kiln__onnx_fail(n, "alpha must not be 0");
    kiln_tensor *neg = kiln_clamp(x, -INFINITY, 0.0);
    out[0] = kiln_add(kiln_relu(x), kiln_mul_scalar(kiln_expm1(kiln_mul_scalar(neg, 1.0 / alpha)), alpha));
    return kiln__onnx_ok(out);
}

/* x > alpha ? x : 0 (NaN gives 0, as the comparison is false) */
static int op_thresholded_relu(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout,
                               kiln_tensor **out)
{
    KILN__ONNX_NEED(1);
    kiln_tensor *x = in[0];
    if (need_float(n, x))
        return -1;
    kiln_tensor *alpha = scalar_like(x, kiln__onnx_attr_float(n, "alpha", 1.0));
    out[0] = kiln_where(kiln_gt(x, alpha), x, scalar_like(x, 0.0));
    return kiln__onnx_ok(out);
}

/* ------------------------------------------------------------ trigonometry */

/* Halves are computed in f32 and rounded once; f32 and f64 in their own dtype. */
static kiln_tensor *widen(kiln_tensor *x)
{
    kiln_dtype dt = kiln_tensor_dtype(x);
    return dt == KILN_F16 || dt == KILN_BF16 ? kiln_cast(x, KILN_F32) : x;
}

/* where(x < 0, -r, r): the sign of an odd function put back on its value at |x|. */
static kiln_tensor *odd(kiln_tensor *x, kiln_tensor *r)
{
    return kiln_where(kiln_lt(x, scalar_like(x, 0.0)), kiln_neg(r), r);
}

/* Above this |x| the hyperbolic functions drop e^-|x| (relative 1e-17 at 20) and the
 * inverse ones use log(2|x|), whose neglected term 1/(4x²) is below 1e-17 at 2^28. */
#define HYP_BIG 20.0
#define AHYP_BIG 268435456.0

/* sinh |x| = (u + u / (u + 1)) / 2 with u = expm1|x|: no cancellation near 0. Above 20,
 * (e/2) e with e = exp(|x|/2), which stays finite up to sinh's own overflow (expm1 |x|
 * overflows first). */
static kiln_tensor *sinh_t(kiln_tensor *x)
{
    kiln_tensor *a = kiln_abs(x);
    kiln_tensor *u = kiln_expm1(kiln_clamp(a, 0.0, HYP_BIG));
    kiln_tensor *s = kiln_mul_scalar(kiln_add(u, kiln_div(u, kiln_add_scalar(u, 1.0))), 0.5);
    kiln_tensor *e = kiln_exp(kiln_mul_scalar(kiln_clamp(a, HYP_BIG, INFINITY), 0.5));
    kiln_tensor *big = kiln_mul(kiln_mul_scalar(e, 0.5), e);
    return odd(x, kiln_where(kiln_gt(a, scalar_like(a, HYP_BIG)), big, s));
}

/* cosh x = (e/2) e + 1 / (2 e e) with e = exp(|x|/2): a sum of positives, finite up to
 * cosh's own overflow (e e overflowing only makes the second term 0). */
static kiln_tensor *cosh_t(kiln_tensor *x)
{
    kiln_tensor *e = kiln_exp(kiln_mul_scalar(kiln_abs(x), 0.5));
    return kiln_add(kiln_mul(kiln_mul_scalar(e, 0.5), e), kiln_mul_scalar(kiln_reciprocal(kiln_mul(e, e)), 0.5));
}

static kiln_tensor *tan_t(kiln_tensor *x)
{
    return kiln_div(kiln_sin(x), kiln_cos(x));
}

/* asinh |x| = log1p(a + a² / (1 + sqrt(1 + a²))) (no cancellation near 0), log(2a) above
 * 2^28, where a² would overflow first. */
static kiln_tensor *asinh_t(kiln_tensor *x)
{
    kiln_tensor *a = kiln_abs(x);
    kiln_tensor *s = kiln_clamp(a, 0.0, AHYP_BIG), *s2 = kiln_mul(s, s);
    kiln_tensor *small = kiln_log1p(
        kiln_add(s, kiln_div(s2, kiln_add_scalar(kiln_sqrt(kiln_add_scalar(s2, 1.0)), 1.0))));
    kiln_tensor *big = kiln_add_scalar(kiln_log(kiln_clamp(a, AHYP_BIG, INFINITY)), M_LN2);
    return odd(x, kiln_where(kiln_gt(a, scalar_like(a, AHYP_BIG)), big, small));
}

/* acosh x = log1p(t + sqrt(t (t + 2))) with t = x - 1 (exact near 1, where the log's
 * argument is small), log(2x) above 2^28; NaN below 1. */
static kiln_tensor *acosh_t(kiln_tensor *x)
{
    kiln_tensor *t = kiln_add_scalar(kiln_clamp(x, 1.0, AHYP_BIG), -1.0);
    kiln_tensor *small = kiln_log1p(kiln_add(t, kiln_sqrt(kiln_mul(t, kiln_add_scalar(t, 2.0)))));
    kiln_tensor *big = kiln_add_scalar(kiln_log(kiln_clamp(x, AHYP_BIG, INFINITY)), M_LN2);
    kiln_tensor *y = kiln_where(kiln_gt(x, scalar_like(x, AHYP_BIG)), big, small);
    /* not x >= 1: NaN too gives NaN */
    return kiln_masked_fill(y, kiln_logical_not(kiln_ge(x, scalar_like(x, 1.0))), NAN);
}

/* atanh |x| = log1p(2a / (1 - a)) / 2: 1 - a is exact near 1; inf at 1, NaN above. */
static kiln_tensor *atanh_t(kiln_tensor *x)
{
    kiln_tensor *a = kiln_abs(x);
    kiln_tensor *q = kiln_div(kiln_mul_scalar(a, 2.0), kiln_add_scalar(kiln_neg(a), 1.0));
    return odd(x, kiln_mul_scalar(kiln_log1p(q), 0.5));
}

/* Horner's rule for c[0] z^(k-1) + ... + c[k-1], plus z^k when monic. */
static kiln_tensor *poly(kiln_tensor *z, const double *c, int k, bool monic)
{
    kiln_tensor *p = monic ? kiln_add_scalar(z, c[0]) : kiln_add_scalar(kiln_mul_scalar(z, c[0]), c[1]);
    for (int i = monic ? 1 : 2; i < k; i++)
        p = kiln_add_scalar(kiln_mul(p, z), c[i]);
    return p;
}

/* atan |x| by Cephes' atan.c (double precision, relative error about 1e-16): reduced to
 * |t| <= 0.66 by atan a = pi/2 + atan(-1/a) above tan(3pi/8) and pi/4 + atan((a-1)/(a+1))
 * above 0.66, then t + t z P(z)/Q(z) with z = t². */
static kiln_tensor *atan_t(kiln_tensor *x)
{
    static const double P[] = {-8.750608600031904122785E-1, -1.615753718733365076637E1, -7.500855792314704667340E1,
                               -1.228866684490136173410E2, -6.485021904942025371773E1};
    static const double Q[] = {2.485846490142306297962E1, 1.650270098316988542046E2, 4.328810604912902668951E2,
                               4.853903996359136964868E2, 1.945506571482613964425E2};
    const double t3p8 = 2.41421356237309504880, lo = 0.66;
    kiln_tensor *a = kiln_abs(x);
    kiln_tensor *big = kiln_gt(a, scalar_like(a, t3p8)), *mid = kiln_gt(a, scalar_like(a, lo));
    kiln_tensor *m = kiln_clamp(a, lo, t3p8);
    kiln_tensor *t = kiln_where(big, kiln_neg(kiln_reciprocal(kiln_clamp(a, t3p8, INFINITY))),
                                kiln_where(mid, kiln_div(kiln_add_scalar(m, -1.0), kiln_add_scalar(m, 1.0)), a));
    kiln_tensor *z = kiln_mul(t, t);
    kiln_tensor *r = kiln_add(t, kiln_mul(kiln_mul(t, z), kiln_div(poly(z, P, 5, false), poly(z, Q, 5, true))));
    kiln_tensor *y0 = kiln_where(big, scalar_like(a, M_PI_2),
                                 kiln_where(mid, scalar_like(a, M_PI_4), scalar_like(a, 0)));
    return odd(x, kiln_add(y0, r));
}

/* asin x = atan(x / sqrt((1 - x)(1 + x))): the factors are exact near ±1, atan of inf is
 * pi/2 there, and |x| > 1 takes the square root of a negative: NaN. */
static kiln_tensor *asin_t(kiln_tensor *x)
{
    kiln_tensor *d = kiln_mul(kiln_add_scalar(kiln_neg(x), 1.0), kiln_add_scalar(x, 1.0));
    return atan_t(kiln_div(x, kiln_sqrt(d)));
}

/* acos x = 2 atan(sqrt((1 - x) / (1 + x))): small and accurate near 1, pi at -1. */
static kiln_tensor *acos_t(kiln_tensor *x)
{
    kiln_tensor *q = kiln_div(kiln_add_scalar(kiln_neg(x), 1.0), kiln_add_scalar(x, 1.0));
    return kiln_mul_scalar(atan_t(kiln_sqrt(q)), 2.0);
}

#define TRIG(NAME, FN) FLOAT_UNARY(NAME, kiln_cast(FN(widen(x)), kiln_tensor_dtype(x)))
TRIG(op_sinh, sinh_t)
TRIG(op_cosh, cosh_t)
TRIG(op_tan, tan_t)
TRIG(op_asinh, asinh_t)
TRIG(op_acosh, acosh_t)
TRIG(op_atanh, atanh_t)
TRIG(op_atan, atan_t)
TRIG(op_asin, asin_t)
TRIG(op_acos, acos_t)

const kiln__onnx_op kiln__onnx_ops_more[] = {
    {"ScatterElements", op_scatter_elements},
    {"Scatter", op_scatter_elements},
    {"PRelu", op_prelu},
    {"ReduceL1", op_reduce_l1},
    {"ReduceL2", op_reduce_l2},
    {"ReduceSumSquare", op_reduce_sum_square},
    {"ReduceLogSum", op_reduce_log_sum},
    {"ReduceLogSumExp", op_reduce_log_sum_exp},
    {"DepthToSpace", op_depth_to_space},
    {"SpaceToDepth", op_space_to_depth},
    {"Mish", op_mish},
    {"Selu", op_selu},
    {"Celu", op_celu},
    {"Softsign", op_softsign},
    {"ThresholdedRelu", op_thresholded_relu},
    {"Sinh", op_sinh},
    {"Cosh", op_cosh},
    {"Tan", op_tan},
    {"Asinh", op_asinh},
    {"Acosh", op_acosh},
    {"Atanh", op_atanh},
    {"Atan", op_atan},
    {"Asin", op_asin},
    {"Acos", op_acos},
    {NULL, NULL},
};
