/*
 * onnx-ops-nn.c — ONNX's network operators: convolutions, Gemm/MatMul, the
 * normalizations (LRN, Lp and mean-variance ones too), pooling (Lp pooling too), softmax,
 * reductions and arg/top-k, on kiln's nn
 * primitives. ONNX allows asymmetric padding (pads = begin..., end...) and auto_pad;
 * kiln's convolution and pooling pad symmetrically, so an asymmetric pad is applied
 * first with kiln_pad (with -inf for max pooling) and the op then runs unpadded.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error-impl.h"
#include "kiln/autodiff.h"
#include "onnx-impl.h"
#include "tensor-impl.h"

#define MAXI 64

typedef struct window {
    int nsp;                              /* spatial dims */
    int64_t k[3], s[3], d[3], lo[3], hi[3];
} window;

/* kernel, strides, dilations, pads / auto_pad for a spatial op on x. */
static int get_window(const kiln__onnx_node *n, kiln_tensor *x, const int64_t *kshape, window *w) {
    int r = kiln_tensor_ndim(x);
    w->nsp = r - 2;
    if (w->nsp < 1 || w->nsp > 3) return kiln__onnx_fail(n, "%d spatial dims not supported", w->nsp);
    int64_t v[MAXI];
    for (int i = 0; i < w->nsp; i++) { w->k[i] = kshape[i]; w->s[i] = 1; w->d[i] = 1; w->lo[i] = w->hi[i] = 0; }
    int c = kiln__onnx_attr_ints(n, "strides", v, MAXI);
    for (int i = 0; i < c && i < w->nsp; i++) w->s[i] = v[i];
    c = kiln__onnx_attr_ints(n, "dilations", v, MAXI);
    for (int i = 0; i < c && i < w->nsp; i++) w->d[i] = v[i];
    const char *ap = kiln__onnx_attr_str(n, "auto_pad", "NOTSET");
    if (!strcmp(ap, "SAME_UPPER") || !strcmp(ap, "SAME_LOWER")) {
        for (int i = 0; i < w->nsp; i++) {
            int64_t in = kiln_tensor_dim(x, 2 + i), o = (in + w->s[i] - 1) / w->s[i];
            int64_t tot = (o - 1) * w->s[i] + (w->k[i] - 1) * w->d[i] + 1 - in;
            if (tot < 0) tot = 0;
            w->lo[i] = !strcmp(ap, "SAME_UPPER") ? tot / 2 : tot - tot / 2;
            w->hi[i] = tot - w->lo[i];
        }
    } else if (!strcmp(ap, "NOTSET")) {
        c = kiln__onnx_attr_ints(n, "pads", v, MAXI);
        if (c >= 0 && c != 2 * w->nsp) return kiln__onnx_fail(n, "pads has %d entries", c);
        for (int i = 0; c > 0 && i < w->nsp; i++) { w->lo[i] = v[i]; w->hi[i] = v[i + w->nsp]; }
    } else if (strcmp(ap, "VALID")) {
        return kiln__onnx_fail(n, "auto_pad '%s' not supported", ap);
    }
    for (int i = 0; i < w->nsp; i++)
        if (w->s[i] < 1 || w->d[i] < 1 || w->k[i] < 1 || w->lo[i] < 0 || w->hi[i] < 0)
            return kiln__onnx_fail(n, "invalid kernel, stride, dilation or pad");
    return 0;
}

static bool symmetric(const window *w) {
    for (int i = 0; i < w->nsp; i++)
        if (w->lo[i] != w->hi[i]) return false;
    return true;
}

/* Apply the window's pads explicitly (value fills). */
static kiln_tensor *pad_explicit(kiln_tensor *x, const window *w, double value) {
    int64_t p[6];
    for (int i = 0; i < w->nsp; i++) {
        p[2 * (w->nsp - 1 - i)] = w->lo[i];
        p[2 * (w->nsp - 1 - i) + 1] = w->hi[i];
    }
    return kiln_pad(x, 2 * w->nsp, p, KILN_PAD_CONSTANT, value);
}

static int op_conv(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(2);
    kiln_tensor *x = in[0], *wt = in[1], *b = nin > 2 ? in[2] : NULL;
    window w;
    int64_t ks[3];
    for (int i = 0; i < kiln_tensor_ndim(wt) - 2 && i < 3; i++) ks[i] = kiln_tensor_dim(wt, 2 + i);
    if (kiln_tensor_ndim(wt) != kiln_tensor_ndim(x)) return kiln__onnx_fail(n, "weight rank differs from input rank");
    if (get_window(n, x, ks, &w)) return -1;
    kiln_conv_opts o = {.groups = kiln__onnx_attr_int(n, "group", 1)};
    if (!symmetric(&w)) x = pad_explicit(x, &w, 0.0);
    for (int i = 0; i < w.nsp; i++) {
        o.stride[i] = w.s[i];
        o.dilation[i] = w.d[i];
        o.padding[i] = symmetric(&w) ? w.lo[i] : 0;
    }
    kiln_tensor *res = n->fuse_residual >= 0 ? in[n->fuse_residual] : NULL;
    kiln_tensor *pk = NULL;
    /* a frozen weight is packed once, at the first run, for the geometry it then has;
     * a trainable one is read as it is (it changes under the optimizer) */
    if (n->pack && !kiln_tensor_requires_grad(wt)) {
        unsigned version = atomic_load(&wt->storage->version);
        if (n->pack->tried && (n->pack->storage != wt->storage || n->pack->version != version)) {
            kiln_tensor_release(n->pack->t);
            *n->pack = (kiln__onnx_pack){0};
        }
        if (!n->pack->tried) {
            kiln_no_grad_begin();
            n->pack->t = kiln_keep(kiln__conv_pack(wt, x, &o, w.nsp));
            kiln_no_grad_end();
            n->pack->tried = true;
            n->pack->storage = wt->storage;
            n->pack->version = version;
        }
        pk = n->pack->t;
    }
    if (n->fuse_act != KILN_EPI_NONE || res || pk)
        out[0] = kiln__conv_fused(x, wt, pk, b, &o, w.nsp, res, (kiln_epilogue_act)n->fuse_act, n->fuse_alpha,
                                  n->fuse_beta);
    else
        out[0] = w.nsp == 1 ? kiln_conv1d(x, wt, b, &o) : w.nsp == 2 ? kiln_conv2d(x, wt, b, &o) : kiln_conv3d(x, wt, b, &o);
    return kiln__onnx_ok(out);
}

static int op_conv_transpose(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(2);
    kiln_tensor *x = in[0], *wt = in[1], *b = nin > 2 ? in[2] : NULL;
    window w;
    int64_t ks[3], op[MAXI] = {0};
    for (int i = 0; i < kiln_tensor_ndim(wt) - 2 && i < 3; i++) ks[i] = kiln_tensor_dim(wt, 2 + i);
    if (get_window(n, x, ks, &w)) return -1;
    if (w.nsp > 2) return kiln__onnx_fail(n, "3-D transposed convolution not supported");
    if (!symmetric(&w) || kiln__onnx_attr_get(n, "output_shape"))
        return kiln__onnx_fail(n, "asymmetric pads and output_shape not supported");
    kiln__onnx_attr_ints(n, "output_padding", op, MAXI);
    kiln_conv_opts o = {.groups = kiln__onnx_attr_int(n, "group", 1)};
    for (int i = 0; i < w.nsp; i++) {
        o.stride[i] = w.s[i];
        o.dilation[i] = w.d[i];
        o.padding[i] = w.lo[i];
        o.output_padding[i] = op[i];
    }
    out[0] = w.nsp == 1 ? kiln_conv_transpose1d(x, wt, b, &o) : kiln_conv_transpose2d(x, wt, b, &o);
    return kiln__onnx_ok(out);
}

static int op_gemm(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(2);
    kiln_tensor *a = in[0], *b = in[1], *c = nin > 2 ? in[2] : NULL;
    double alpha = kiln__onnx_attr_float(n, "alpha", 1.0), beta = kiln__onnx_attr_float(n, "beta", 1.0);
    bool ta = kiln__onnx_attr_int(n, "transA", 0), tb = kiln__onnx_attr_int(n, "transB", 0);
    if (kiln_tensor_ndim(a) != 2 || kiln_tensor_ndim(b) != 2) return kiln__onnx_fail(n, "A and B must be 2-D");
    if (ta) a = kiln_transpose(a, 0, 1);
    kiln_tensor *y;
    bool linear = tb && alpha == 1.0 && (!c || (beta == 1.0 && kiln_tensor_ndim(c) == 1)) && !ta;
    if (linear && n->fuse_act != KILN_EPI_NONE && !kiln_grad_enabled()) {
        /* x Wᵀ + b then the activation, in the product where the device fuses them */
        out[0] = kiln__matmul_epilogue(a, kiln_transpose(b, 0, 1), c, NULL, (kiln_epilogue_act)n->fuse_act,
                                       n->fuse_alpha, n->fuse_beta);
        return kiln__onnx_ok(out);
    }
    if (linear)
        y = kiln_linear(a, b, c);                 /* the common Linear layer: x Wᵀ + b */
    else {
        y = kiln_matmul(a, tb ? kiln_transpose(b, 0, 1) : b);
        if (alpha != 1.0) y = kiln_mul_scalar(y, alpha);
        if (c) y = kiln_add(y, beta == 1.0 ? c : kiln_mul_scalar(c, beta));
    }
    if (n->fuse_act != KILN_EPI_NONE) y = kiln__epilogue(y, NULL, NULL, (kiln_epilogue_act)n->fuse_act, n->fuse_alpha, n->fuse_beta);
    out[0] = (y);
    return kiln__onnx_ok(out);
}

/* A stack of matrices times one matrix (x [..., M, K] @ W [K, N], a weight) is one GEMM
 * of (batch*M) rows, not batch GEMMs of M rows: each BLAS call packs all of W, so the
 * batched form packs the weight batch times over. Exporters write Linear layers of
 * sequence-first models this way with M = 1 (x [seq, 1, d] after a Transpose), where the
 * packing outweighed the arithmetic several times over. Reshaping x copies only when its
 * batch dims cannot be merged as a view, and an activation is far smaller than a weight. */
static int op_matmul(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(2);
    kiln_tensor *a = in[0], *b = in[1];
    kiln_tensor *bias = n->fuse_bias >= 0 ? in[n->fuse_bias] : NULL;
    kiln_tensor *res = n->fuse_residual >= 0 ? in[n->fuse_residual] : NULL;
    bool fused = bias || res || n->fuse_act != KILN_EPI_NONE;
    kiln_epilogue_act act = (kiln_epilogue_act)n->fuse_act;
    int ra = kiln_tensor_ndim(a);
    if (ra >= 3 && kiln_tensor_ndim(b) == 2) {
        int64_t k = kiln_tensor_dim(a, ra - 1), rows = 1, shape[KILN_MAX_DIMS];
        for (int d = 0; d < ra - 1; d++) { shape[d] = kiln_tensor_dim(a, d); rows *= shape[d]; }
        shape[ra - 1] = kiln_tensor_dim(b, 1);
        int64_t flat[2] = {rows, k}, oflat[2] = {rows, shape[ra - 1]};
        /* the epilogue runs on the flat result (in the product itself where the device
         * fuses it); a residual of the full shape is flattened alike (a bias broadcasts
         * over rows either way) */
        bool res_flat = res && kiln_tensor_ndim(res) == ra;
        for (int d = 0; res_flat && d < ra; d++) res_flat = kiln_tensor_dim(res, d) == shape[d];
        kiln_tensor *y;
        if (fused && (!res || res_flat))
            y = kiln__matmul_epilogue(kiln_reshape(a, 2, flat), b, bias, res ? kiln_reshape(res, 2, oflat) : NULL,
                                      act, n->fuse_alpha, n->fuse_beta);
        else {
            y = kiln_matmul(kiln_reshape(a, 2, flat), b);
            if (y && fused)
                y = kiln__epilogue(kiln_reshape(y, ra, shape), bias, res, act, n->fuse_alpha, n->fuse_beta);
        }
        out[0] = y && kiln_tensor_ndim(y) != ra ? kiln_reshape(y, ra, shape) : y;
        return kiln__onnx_ok(out);
    }
    out[0] = fused ? kiln__matmul_epilogue(a, b, bias, res, act, n->fuse_alpha, n->fuse_beta) : kiln_matmul(a, b);
    return kiln__onnx_ok(out);
}

static int op_batch_norm(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(5);
    if (kiln__onnx_attr_int(n, "training_mode", 0)) return kiln__onnx_fail(n, "training_mode=1 not supported");
    out[0] = kiln_batch_norm(in[0], in[3], in[4], in[1], in[2], false, 0.1,
                             kiln__onnx_attr_float(n, "epsilon", 1e-5));
    return kiln__onnx_ok(out);
}

/* LayerNormalization's optional Mean and InvStdDev outputs: per the spec, in the stash_type
 * precision (f32 by default, whatever x is, as ONNX Runtime gives them) and of x's shape with
 * the normalized dims kept as 1. Only nodes that declare them pay for the two reductions; Y
 * keeps the engine's one-pass layer norm (its backend entry can give the row statistics, but
 * only to kiln_layer_norm, which returns Y alone). */
static int stats(const kiln__onnx_node *n, kiln_tensor *x, int a, double eps, int nout, kiln_tensor **out)
{
    int64_t st = kiln__onnx_attr_int(n, "stash_type", KILN__ONNX_FLOAT);
    int dt = kiln__onnx_kdtype((int)st);
    if (dt < 0 || !kiln_dtype_is_float((kiln_dtype)dt))
        return kiln__onnx_fail(n, "stash_type %lld is not a floating type", (long long)st);
    int r = kiln_tensor_ndim(x), dims[KILN_MAX_DIMS];
    for (int i = a; i < r; i++)
        dims[i - a] = i;
    kiln_tensor *xs = kiln_cast(x, (kiln_dtype)dt);
    out[1] = kiln_mean(xs, r - a, dims, true);
    if (nout > 2)
        out[2] = kiln_rsqrt(kiln_add_scalar(kiln_var(xs, r - a, dims, 0, true), eps));
    return out[1] && (nout < 3 || out[2]) ? 0 : -1;
}

static int op_layer_norm(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(1);
    int r = kiln_tensor_ndim(in[0]), a;
    if (kiln__onnx_axis(n, kiln__onnx_attr_int(n, "axis", -1), r, &a)) return -1;
    double eps = kiln__onnx_attr_float(n, "epsilon", 1e-5);
    kiln_tensor *sc = nin > 1 ? in[1] : NULL, *bi = nin > 2 ? in[2] : NULL;
    /* The usual case — scale and bias of exactly the normalized shape — goes to the
     * engine's layer norm in one pass; other broadcastable forms are applied after. */
    bool direct = true;
    for (int i = 0; i < 2; i++) {
        kiln_tensor *p = i ? bi : sc;
        if (!p) continue;
        direct = direct && kiln_tensor_ndim(p) == r - a;
        for (int d = 0; direct && d < r - a; d++) direct = kiln_tensor_dim(p, d) == kiln_tensor_dim(in[0], a + d);
    }
    kiln_tensor *y;
    if (direct) {
        y = kiln_layer_norm(in[0], r - a, sc, bi, eps);
    } else {
        y = kiln_layer_norm(in[0], r - a, NULL, NULL, eps);
        if (sc) y = kiln_mul(y, sc);
        if (bi) y = kiln_add(y, bi);
    }
    out[0] = (y);
    if (out[0] && nout > 1 && stats(n, in[0], a, eps, nout, out))
        return -1;
    return kiln__onnx_ok(out);
}

static int op_instance_norm(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(3);
    out[0] = kiln_group_norm(in[0], kiln_tensor_dim(in[0], 1), in[1], in[2], kiln__onnx_attr_float(n, "epsilon", 1e-5));
    return kiln__onnx_ok(out);
}

static int op_group_norm(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(3);
    int64_t g = kiln__onnx_attr_int(n, "num_groups", 0), c = kiln_tensor_dim(in[0], 1);
    if (g < 1 || kiln_tensor_numel(in[1]) != c)
        return kiln__onnx_fail(n, "per-channel scale and a positive num_groups are required");
    out[0] = kiln_group_norm(in[0], g, in[1], in[2], kiln__onnx_attr_float(n, "epsilon", 1e-5));
    return kiln__onnx_ok(out);
}

/* MaxPool, AveragePool, and (POOL_SUM) the window sums LpPool takes of |x|^p: an average over
 * the whole window, zero pads counted, times its size. */
enum {
    POOL_AVG,
    POOL_MAX,
    POOL_SUM
};
static int pool(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, kiln_tensor **out, int kind)
{
    bool max = kind == POOL_MAX;
    KILN__ONNX_NEED(1);
    int64_t ks[MAXI];
    int c = kiln__onnx_attr_ints(n, "kernel_shape", ks, MAXI);
    kiln_tensor *x = in[0];
    window w;
    if (c != kiln_tensor_ndim(x) - 2) return kiln__onnx_fail(n, "kernel_shape does not match the input");
    if (get_window(n, x, ks, &w)) return -1;
    if (w.nsp > 2) return kiln__onnx_fail(n, "3-D pooling not supported");
    bool cip = kind == POOL_SUM || kiln__onnx_attr_int(n, "count_include_pad", 0) != 0;
    kiln_pool_opts o = {.ceil_mode = kiln__onnx_attr_int(n, "ceil_mode", 0) != 0, .count_include_pad = cip};
    bool sym = symmetric(&w);
    if (!sym) {
        if (!max && !cip) return kiln__onnx_fail(n, "asymmetric pads without count_include_pad not supported");
        x = pad_explicit(x, &w, max ? -INFINITY : 0.0);
    }
    for (int i = 0; i < w.nsp; i++) {
        o.kernel[i] = w.k[i];
        o.stride[i] = w.s[i];
        o.dilation[i] = w.d[i];
        o.padding[i] = sym ? w.lo[i] : 0;
    }
    if (!max && (w.d[0] != 1 || (w.nsp > 1 && w.d[1] != 1))) return kiln__onnx_fail(n, "dilated average pooling");
    if (max) out[0] = w.nsp == 1 ? kiln_max_pool1d(x, &o, NULL) : kiln_max_pool2d(x, &o, NULL);
    else out[0] = w.nsp == 1 ? kiln_avg_pool1d(x, &o) : kiln_avg_pool2d(x, &o);
    if (kind == POOL_SUM)
        out[0] = kiln_mul_scalar(out[0], (double)(w.k[0] * (w.nsp > 1 ? w.k[1] : 1)));
    return kiln__onnx_ok(out);
}
/* LpPool: (sum over the window of |x|^p)^(1/p), zero pads adding nothing. */
static int op_lp_pool(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out)
{
    KILN__ONNX_NEED(1);
    double p = (double)kiln__onnx_attr_int(n, "p", 2);
    if (!(p >= 1))
        return kiln__onnx_fail(n, "p must be at least 1, not %g", p);
    kiln_tensor *xp = kiln_pow_scalar(kiln_abs(in[0]), p);
    if (!xp || pool(n, 1, &xp, out, POOL_SUM))
        return -1;
    out[0] = kiln_pow_scalar(out[0], 1.0 / p);
    return kiln__onnx_ok(out);
}
static int op_global_lp_pool(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout,
                             kiln_tensor **out)
{
    KILN__ONNX_NEED(1);
    int r = kiln_tensor_ndim(in[0]), dims[KILN_MAX_DIMS];
    double p = (double)kiln__onnx_attr_int(n, "p", 2);
    if (r < 3)
        return kiln__onnx_fail(n, "input needs spatial dims");
    if (!(p >= 1))
        return kiln__onnx_fail(n, "p must be at least 1, not %g", p);
    for (int i = 2; i < r; i++)
        dims[i - 2] = i;
    out[0] = kiln_pow_scalar(kiln_sum(kiln_pow_scalar(kiln_abs(in[0]), p), r - 2, dims, true), 1.0 / p);
    return kiln__onnx_ok(out);
}

/* LRN across channels: x / (bias + alpha / size * sum of x^2 over the channels from
 * c - floor((size - 1) / 2) to c + ceil((size - 1) / 2))^beta; the window sum is size shifted
 * slices of the zero-padded squares. */
static int op_lrn(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out)
{
    KILN__ONNX_NEED(1);
    kiln_tensor *x = in[0];
    int r = kiln_tensor_ndim(x);
    int64_t size = kiln__onnx_attr_int(n, "size", 0), ch = r > 1 ? kiln_tensor_dim(x, 1) : 0;
    if (r < 3)
        return kiln__onnx_fail(n, "x must have shape (N, C, D1, ...), not rank %d", r);
    if (size < 1 || size > 4096)
        return kiln__onnx_fail(n, "size %lld is out of range (1 to 4096)", (long long)size);
    double alpha = kiln__onnx_attr_float(n, "alpha", 1e-4), beta = kiln__onnx_attr_float(n, "beta", 0.75);
    double bias = kiln__onnx_attr_float(n, "bias", 1.0);
    int64_t pads[2 * KILN_MAX_DIMS] = {0};
    pads[2 * (r - 2)] = (size - 1) / 2; /* kiln_pad lists the last dim first: dim 1 is pair r - 2 */
    pads[2 * (r - 2) + 1] = size / 2;
    kiln_tensor *sq = kiln_pad(kiln_mul(x, x), 2 * (r - 1), pads, KILN_PAD_CONSTANT, 0), *sum = NULL;
    for (int64_t k = 0; sq && k < size; k++) {
        kiln_tensor *part = kiln_narrow(sq, 1, k, ch);
        sum = sum ? kiln_add(sum, part) : part;
    }
    out[0] = kiln_div(x, kiln_pow_scalar(kiln_add_scalar(kiln_mul_scalar(sum, alpha / (double)size), bias), beta));
    return kiln__onnx_ok(out);
}

/* LpNormalization: x over its p-norm (p 1 or 2) along axis; a zero vector stays zero (ONNX
 * Runtime's answer, where the division would give NaN). */
static int op_lp_normalization(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout,
                               kiln_tensor **out)
{
    KILN__ONNX_NEED(1);
    int a;
    int64_t p = kiln__onnx_attr_int(n, "p", 2);
    if (p != 1 && p != 2)
        return kiln__onnx_fail(n, "p must be 1 or 2, not %lld", (long long)p);
    if (kiln__onnx_axis(n, kiln__onnx_attr_int(n, "axis", -1), kiln_tensor_ndim(in[0]), &a))
        return -1;
    kiln_tensor *norm = kiln_norm(in[0], (double)p, 1, &a, true);
    kiln_tensor *zero = kiln_eq(norm, kiln_zeros_like(norm));
    out[0] = kiln_where(zero, kiln_zeros_like(in[0]),
                        kiln_div(in[0], kiln_where(zero, kiln_full_like(norm, 1), norm)));
    return kiln__onnx_ok(out);
}

/* MeanVarianceNormalization as the spec's function body writes it: (x - E[x]) over
 * (sqrt(E[x^2] - E[x]^2) + 1e-9), the expectations over axes (default 0, 2, 3). */
static int op_mean_variance_normalization(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout,
                                          kiln_tensor **out)
{
    KILN__ONNX_NEED(1);
    kiln_tensor *x = in[0];
    int r = kiln_tensor_ndim(x), dims[KILN_MAX_DIMS];
    int64_t ax[KILN_MAX_DIMS];
    int na = kiln__onnx_attr_ints(n, "axes", ax, KILN_MAX_DIMS);
    if (na < 0) {
        if (r < 4)
            return kiln__onnx_fail(n, "the default axes (0, 2, 3) need rank 4, not %d", r);
        na = 3;
        ax[0] = 0, ax[1] = 2, ax[2] = 3;
    }
    for (int i = 0; i < na; i++)
        if (kiln__onnx_axis(n, ax[i], r, &dims[i]))
            return -1;
    kiln_tensor *mean = kiln_mean(x, na, dims, true);
    kiln_tensor *var = kiln_sub(kiln_mean(kiln_mul(x, x), na, dims, true), kiln_mul(mean, mean));
    out[0] = kiln_div(kiln_sub(x, mean), kiln_add_scalar(kiln_sqrt(var), 1e-9));
    return kiln__onnx_ok(out);
}

/* MaxPool on integers (opset 12+: the quantized models' uint8 and int8 activations) runs on
 * their values as floats, exactly (u8 in f32, wider integers in f64), and casts back: the
 * devices' pooling kernels are floating point, and padding an integer tensor with -inf, as an
 * asymmetric pad does, has no integer meaning. */
static int op_max_pool(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    if (nout > 1) return kiln__onnx_fail(n, "the Indices output is not supported");
    kiln_dtype dt = nin > 0 && in[0] ? kiln_tensor_dtype(in[0]) : KILN_F32;
    if (kiln_dtype_is_float(dt))
        return pool(n, nin, in, out, true);
    if (dt == KILN_BOOL)
        return kiln__onnx_fail(n, "x must be numeric, not bool");
    kiln_tensor *xf = kiln_cast(in[0], dt == KILN_U8 ? KILN_F32 : KILN_F64);
    if (!xf || pool(n, 1, &xf, out, true))
        return -1;
    out[0] = kiln_cast(out[0], dt);
    return kiln__onnx_ok(out);
}
static int op_avg_pool(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    return pool(n, nin, in, out, POOL_AVG);
}

static int global_pool(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, kiln_tensor **out, bool max) {
    KILN__ONNX_NEED(1);
    int r = kiln_tensor_ndim(in[0]), dims[KILN_MAX_DIMS];
    if (r < 3) return kiln__onnx_fail(n, "input needs spatial dims");
    for (int i = 2; i < r; i++) dims[i - 2] = i;
    out[0] = max ? kiln_max(in[0], r - 2, dims, true) : kiln_mean(in[0], r - 2, dims, true);
    return kiln__onnx_ok(out);
}
static int op_gap(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    return global_pool(n, nin, in, out, false);
}
static int op_gmp(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    return global_pool(n, nin, in, out, true);
}

/* Before opset 13, Softmax flattened the input to 2-D at axis (default 1). */
static int softmax_like(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, kiln_tensor **out, bool log) {
    KILN__ONNX_NEED(1);
    int r = kiln_tensor_ndim(in[0]), a;
    if (kiln__onnx_axis(n, kiln__onnx_attr_int(n, "axis", n->opset < 13 ? 1 : -1), r, &a)) return -1;
    kiln_tensor *x = in[0];
    if (n->opset < 13 && a != r - 1) {
        int64_t p = 1, q = 1;
        for (int i = 0; i < r; i++) *(i < a ? &p : &q) *= kiln_tensor_dim(x, i);
        kiln_tensor *y = kiln_reshape(x, 2, (const int64_t[]){p, q});
        y = log ? kiln_log_softmax(y, 1) : kiln_softmax(y, 1);
        out[0] = kiln_reshape(y, r, kiln_tensor_shape(x));
        return kiln__onnx_ok(out);
    }
    out[0] = log ? kiln_log_softmax(x, a) : kiln_softmax(x, a);
    return kiln__onnx_ok(out);
}
static int op_softmax(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    return softmax_like(n, nin, in, out, false);
}
static int op_log_softmax(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    return softmax_like(n, nin, in, out, true);
}

typedef kiln_tensor *(*reduce_fn)(kiln_tensor *, int, const int *, bool);

/* axes: attribute, or the second input (ReduceSum from opset 13, the others from 18). */
static int reduce(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, kiln_tensor **out, reduce_fn f) {
    KILN__ONNX_NEED(1);
    int64_t ax[MAXI];
    int r = kiln_tensor_ndim(in[0]);
    int k = nin > 1 && in[1] ? kiln__onnx_read_ints(n, in[1], ax, MAXI) : kiln__onnx_attr_ints(n, "axes", ax, MAXI);
    bool keep = kiln__onnx_attr_int(n, "keepdims", 1) != 0;
    if (k <= 0 && kiln__onnx_attr_int(n, "noop_with_empty_axes", 0)) {
        out[0] = (in[0]);
        return kiln__onnx_ok(out);
    }
    int dims[KILN_MAX_DIMS];
    if (k > KILN_MAX_DIMS) return kiln__onnx_fail(n, "too many axes");
    for (int i = 0; i < k; i++)
        if (kiln__onnx_axis(n, ax[i], r, &dims[i])) return -1;
    if (k <= 0) {
        k = r;
        for (int i = 0; i < r; i++) dims[i] = i;
    }
    out[0] = r == 0 ? (in[0]) : f(in[0], k, dims, keep);
    return kiln__onnx_ok(out);
}
static int op_reduce_mean(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    return reduce(n, nin, in, out, kiln_mean);
}
static int op_reduce_sum(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    return reduce(n, nin, in, out, kiln_sum);
}
static int op_reduce_max(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    return reduce(n, nin, in, out, kiln_max);
}
static int op_reduce_min(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    return reduce(n, nin, in, out, kiln_min);
}
static int op_reduce_prod(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    return reduce(n, nin, in, out, kiln_prod);
}

static int arg(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, kiln_tensor **out, bool max) {
    KILN__ONNX_NEED(1);
    int a;
    if (kiln__onnx_attr_int(n, "select_last_index", 0)) return kiln__onnx_fail(n, "select_last_index not supported");
    if (kiln__onnx_axis(n, kiln__onnx_attr_int(n, "axis", 0), kiln_tensor_ndim(in[0]), &a)) return -1;
    bool keep = kiln__onnx_attr_int(n, "keepdims", 1) != 0;
    out[0] = max ? kiln_argmax(in[0], a, keep) : kiln_argmin(in[0], a, keep);
    return kiln__onnx_ok(out);
}
static int op_argmax(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    return arg(n, nin, in, out, true);
}
static int op_argmin(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    return arg(n, nin, in, out, false);
}

static int op_topk(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(2);
    int64_t k;
    int a;
    if (kiln__onnx_read_ints(n, in[1], &k, 1) != 1) return -1;
    if (kiln__onnx_axis(n, kiln__onnx_attr_int(n, "axis", -1), kiln_tensor_ndim(in[0]), &a)) return -1;
    kiln_tensor *idx = NULL;
    if (kiln_topk(in[0], k, a, kiln__onnx_attr_int(n, "largest", 1) != 0, &out[0], &idx) != 0) return -1;
    if (nout > 1) out[1] = idx;
    (void)idx; /* scoped: released with the node's scope */
    return kiln__onnx_ok(out);
}

static int op_cumsum(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(2);
    int64_t ax;
    int a;
    if (kiln__onnx_read_ints(n, in[1], &ax, 1) != 1) return -1;
    if (kiln__onnx_axis(n, ax, kiln_tensor_ndim(in[0]), &a)) return -1;
    kiln_tensor *x = in[0];
    bool rev = kiln__onnx_attr_int(n, "reverse", 0) != 0;
    if (rev) x = kiln_flip(x, 1, (const int[]){a});
    kiln_tensor *y = kiln_cumsum(x, a);
    if (kiln__onnx_attr_int(n, "exclusive", 0)) y = kiln_sub(y, x);
    if (rev) y = kiln_flip(y, 1, (const int[]){a});
    out[0] = (y);
    return kiln__onnx_ok(out);
}

const kiln__onnx_op kiln__onnx_ops_nn[] = {
    {"Conv", op_conv},
    {"ConvTranspose", op_conv_transpose},
    {"Gemm", op_gemm},
    {"MatMul", op_matmul},
    {"BatchNormalization", op_batch_norm},
    {"LayerNormalization", op_layer_norm},
    {"InstanceNormalization", op_instance_norm},
    {"GroupNormalization", op_group_norm},
    {"MaxPool", op_max_pool},
    {"AveragePool", op_avg_pool},
    {"GlobalAveragePool", op_gap},
    {"GlobalMaxPool", op_gmp},
    {"Softmax", op_softmax},
    {"LogSoftmax", op_log_softmax},
    {"ReduceMean", op_reduce_mean},
    {"ReduceSum", op_reduce_sum},
    {"ReduceMax", op_reduce_max},
    {"ReduceMin", op_reduce_min},
    {"ReduceProd", op_reduce_prod},
    {"ArgMax", op_argmax},
    {"ArgMin", op_argmin},
    {"TopK", op_topk},
    {"CumSum", op_cumsum},
    {"LpPool", op_lp_pool},
    {"GlobalLpPool", op_global_lp_pool},
    {"LRN", op_lrn},
    {"LpNormalization", op_lp_normalization},
    {"MeanVarianceNormalization", op_mean_variance_normalization},
    {NULL, NULL},
};
