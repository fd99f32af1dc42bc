/*
 * onnx-ops-sample.c — ONNX's resampling operators: Resize (nearest, linear and cubic, any
 * rank) and the older Upsample, GridSample and AffineGrid, computed with kiln's tensor ops (index_select, gather and
 * elementwise arithmetic), so every device runs them and autodiff goes through them.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error-impl.h"
#include "onnx-impl.h"

#define MAXI 64

/* ------------------------------------------------------------------ Resize */

/* coordinate_transformation_mode: every one the spec has but tf_crop_and_resize (which needs
 * roi and extrapolation_value). */
static const char *const ct_names[] = {"half_pixel", "pytorch_half_pixel",   "align_corners",
                                       "asymmetric", "tf_half_pixel_for_nn", "half_pixel_symmetric",
                                       NULL};
enum {
    CT_HALF_PIXEL,
    CT_PYTORCH_HALF_PIXEL,
    CT_ALIGN_CORNERS,
    CT_ASYMMETRIC,
    CT_TF_HALF_PIXEL_FOR_NN,
    CT_HP_SYMMETRIC
};
/* nearest_mode; NM_SIMPLE is opset 10's rule (no attribute then): ceil when downsampling,
 * else truncate, as ONNX Runtime does. */
static const char *const nm_names[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil", NULL};
enum {
    NM_ROUND_PREFER_FLOOR,
    NM_ROUND_PREFER_CEIL,
    NM_FLOOR,
    NM_CEIL,
    NM_SIMPLE
};

static int find_name(const char *s, const char *const *names)
{
    for (int i = 0; names[i]; i++)
        if (!strcmp(s, names[i]))
            return i;
    return -1;
}

/* The source coordinate of output index o along a dim resized from in to out elements at
 * scale: the spec's formula for the mode, evaluated step by step in float as ONNX Runtime
 * (and PyTorch's nearest) do. Not in double: 3 / 0.6f is 4.9999998 in double and 5 in float,
 * and nearest's floor then picks another source pixel. */
static float src_coord(int ct, float o, float scale, float out, float in)
{
    switch (ct) {
    case CT_HALF_PIXEL: return (o + 0.5f) / scale - 0.5f;
    case CT_PYTORCH_HALF_PIXEL: return out > 1 ? (o + 0.5f) / scale - 0.5f : 0.0f;
    case CT_ALIGN_CORNERS: return out == 1 ? 0.0f : o * (in - 1) / (out - 1);
    case CT_ASYMMETRIC: return o / scale;
    case CT_TF_HALF_PIXEL_FOR_NN: return (o + 0.5f) / scale;
    default: { /* half_pixel_symmetric: half_pixel about the centre of the input (the last
                * sum in double, as ONNX Runtime writes it) */
        float adjustment = out / (scale * in), center = in / 2, offset = center * (1 - adjustment);
        return (float)(offset + ((double)o + 0.5) / scale - 0.5);
    }
    }
}

static int64_t nearest_index(int nm, float x, bool down, int64_t in)
{
    /* clamped first: the coordinate always lies within a pixel or two of [0, in - 1], and
     * the conversion to int64 of a float out of its range is undefined */
    float lim = (float)in;
    x = x < -1.0f ? -1.0f : x > lim ? lim : x;
    int64_t i;
    switch (nm) {
    case NM_ROUND_PREFER_FLOOR: i = x == (float)(int64_t)x + 0.5f ? (int64_t)x : (int64_t)roundf(x); break;
    case NM_ROUND_PREFER_CEIL: i = (int64_t)roundf(x); break;
    case NM_FLOOR: i = (int64_t)floorf(x); break;
    case NM_CEIL: i = (int64_t)ceilf(x); break;
    default: i = down ? (int64_t)ceilf(x) : (int64_t)x; break;
    }
    return i < 0 ? 0 : i > in - 1 ? in - 1 : i;
}

/* A host vector as a tensor on x's device: i64 indices, or weights in x's dtype shaped to
 * broadcast along dim d. */
static kiln_tensor *host_vec(kiln_tensor *x, int d, bool weights, const void *v, int64_t len)
{
    kiln_device *dev = kiln_tensor_device(x);
    if (!weights)
        return kiln_from_data(dev, KILN_I64, 1, &len, v, (size_t)len * sizeof(int64_t));
    int64_t shape[KILN_MAX_DIMS];
    int r = kiln_tensor_ndim(x);
    for (int i = 0; i < r; i++)
        shape[i] = i == d ? len : 1;
    kiln_tensor *w = kiln_from_data(dev, KILN_F32, r, shape, v, (size_t)len * sizeof(float));
    return kiln_tensor_dtype(x) == KILN_F32 ? w : kiln_cast(w, kiln_tensor_dtype(x));
}

/* The interpolation a Resize runs: its mode, and for cubic the kernel's a and whether taps
 * outside the input are dropped (their weight given to the others) instead of repeating
 * the edge. */
enum {
    RM_NEAREST,
    RM_LINEAR,
    RM_CUBIC
};
typedef struct resize_mode {
    int kind, ct, nm;
    float cubic_a;
    bool exclude_outside;
} resize_mode;

/* The four cubic convolution weights for a coordinate t in [0, 1) past its left tap, for
 * the taps at -1, 0, 1 and 2 (Keys' kernel with parameter a; the spec's formulas, in
 * float as ONNX Runtime evaluates them). */
static void cubic_weights(float t, float a, float w[4])
{
    float d0 = t + 1, d1 = t, d2 = 1 - t, d3 = 2 - t;
    w[0] = ((a * d0 - 5 * a) * d0 + 8 * a) * d0 - 4 * a;
    w[1] = ((a + 2) * d1 - (a + 3)) * d1 * d1 + 1;
    w[2] = ((a + 2) * d2 - (a + 3)) * d2 * d2 + 1;
    w[3] = ((a * d3 - 5 * a) * d3 + 8 * a) * d3 - 4 * a;
}

/* The taps and weights of output index o of a dim resized from in elements, at source
 * coordinate x_orig: linear's two (ONNX Runtime's: the coordinate clamped into the input,
 * the same pixel twice at the edge, each weighted 0.5) or cubic's four (indices past an
 * edge repeat it, or with exclude_outside weigh nothing, the rest scaled to sum to 1). */
static int interp_taps(const resize_mode *rm, float x_orig, int64_t in, int64_t idx[4], float w[4])
{
    if (rm->kind == RM_LINEAR) {
        float c = x_orig < 0 ? 0 : x_orig > (float)(in - 1) ? (float)(in - 1) : x_orig;
        idx[0] = (int64_t)c < in - 1 ? (int64_t)c : in - 1;
        idx[1] = idx[0] + 1 < in - 1 ? idx[0] + 1 : in - 1;
        w[1] = idx[0] == idx[1] ? 0.5f : fabsf(c - (float)idx[0]);
        w[0] = idx[0] == idx[1] ? 0.5f : fabsf(c - (float)idx[1]);
        return 2;
    }
    /* a coordinate far outside (a huge scale's rounding) is clamped before the int
     * conversion, whose result is undefined out of range; the taps then all sit on one
     * edge either way */
    float lim = (float)in + 2;
    float xc = x_orig < -lim ? -lim : x_orig > lim ? lim : x_orig;
    float fl = floorf(xc);
    int64_t left = (int64_t)fl;
    cubic_weights(xc - fl, rm->cubic_a, w);
    float kept = 0;
    for (int k = 0; k < 4; k++) {
        int64_t i = left - 1 + k;
        bool outside = i < 0 || i > in - 1;
        if (outside && rm->exclude_outside)
            w[k] = 0;
        kept += w[k];
        idx[k] = i < 0 ? 0 : i > in - 1 ? in - 1 : i;
    }
    if (rm->exclude_outside)
        for (int k = 0; k < 4; k++)
            w[k] /= kept;
    return 4;
}

/* x resized along dim d to out elements: the source indices (and for linear and cubic the
 * taps and their weights) computed on the host per output index, then gathered with
 * index_select and weighted, so every device computes what the spec says with ops it has.
 * NULL with a message on error. */
static kiln_tensor *resize_dim(kiln_tensor *x, int d, int64_t out, float scale, const resize_mode *rm)
{
    int64_t in = kiln_tensor_dim(x, d);
    /* interpolation at scale 1 is the identity in ONNX Runtime whatever the mode (its
     * shortcut; cubic's weights are exactly 0, 1, 0, 0 there anyway) */
    if (rm->kind != RM_NEAREST && scale == 1.0f && out == in)
        return x;
    int64_t *idx = malloc((size_t)out * 4 * sizeof *idx);
    float *w = malloc((size_t)out * 4 * sizeof *w);
    kiln_tensor *y = NULL;
    if (!idx || !w) {
        kiln__error_set("Resize: out of memory");
        goto done;
    }
    /* tap k of every output index together: idx[k * out + o], w[k * out + o] */
    bool identity = out == in;
    int taps = 1;
    for (int64_t o = 0; o < out; o++) {
        float x_orig = src_coord(rm->ct, (float)o, scale, (float)out, (float)in);
        if (rm->kind == RM_NEAREST) {
            idx[o] = nearest_index(rm->nm, x_orig, scale < 1.0f, in);
            identity = identity && idx[o] == o;
            continue;
        }
        int64_t ti[4];
        float tw[4];
        taps = interp_taps(rm, x_orig, in, ti, tw);
        for (int k = 0; k < taps; k++) {
            idx[k * out + o] = ti[k];
            w[k * out + o] = tw[k];
        }
    }
    if (rm->kind == RM_NEAREST) {
        y = identity ? x : kiln_index_select(x, d, host_vec(x, d, false, idx, out));
        goto done;
    }
    for (int k = 0; k < taps; k++) {
        kiln_tensor *tap = kiln_mul(kiln_index_select(x, d, host_vec(x, d, false, idx + k * out, out)),
                                    host_vec(x, d, true, w + k * out, out));
        y = k ? kiln_add(y, tap) : tap;
    }
done:
    free(idx);
    free(w);
    return y;
}

static bool whole(float s, float max)
{
    return s >= 1.0f && s <= max && s == floorf(s);
}

/* Resize, any rank, nearest, linear or cubic (separable: one dim after another, the last
 * first for cubic, as ONNX Runtime sums a 2-D cubic's rows before its columns), by scales
 * or sizes.
 * PyTorch's interpolate exports with integer scale factors keep to kiln_interpolate, which
 * maps by the size ratio: that is the spec's 1/scale exactly when the ratio is the scale
 * (nearest: a power of two, whose reciprocal is exact in any precision). */
static int op_resize(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out)
{
    KILN__ONNX_NEED(1);
    kiln_tensor *x = in[0];
    int r = kiln_tensor_ndim(x);
    if (r < 1)
        return kiln__onnx_fail(n, "a scalar input cannot be resized");
    const char *mode = kiln__onnx_attr_str(n, "mode", "nearest");
    resize_mode rm = {.kind = !strcmp(mode, "linear")  ? RM_LINEAR
                              : !strcmp(mode, "cubic") ? RM_CUBIC
                                                       : RM_NEAREST};
    bool linear = rm.kind == RM_LINEAR;
    if (rm.kind == RM_NEAREST && strcmp(mode, "nearest"))
        return kiln__onnx_fail(n, "mode '%s' is not supported (nearest, linear and cubic are)", mode);
    if (rm.kind == RM_CUBIC && n->opset < 11)
        return kiln__onnx_fail(n, "mode 'cubic' needs opset 11 or later (this model has opset %lld)",
                               (long long)n->opset);
    /* before opset 11 there are no modes: asymmetric coordinates, and "simple" rounding */
    const char *cts = n->opset >= 11 ? kiln__onnx_attr_str(n, "coordinate_transformation_mode", "half_pixel")
                                     : "asymmetric";
    int ct = find_name(cts, ct_names);
    if (ct < 0)
        return kiln__onnx_fail(n, "coordinate_transformation_mode '%s' is not supported (%s)", cts,
                               "half_pixel, pytorch_half_pixel, align_corners, asymmetric, tf_half_pixel_for_nn "
                               "and half_pixel_symmetric are");
    int nm = NM_SIMPLE;
    if (n->opset >= 11) {
        const char *nms = kiln__onnx_attr_str(n, "nearest_mode", "round_prefer_floor");
        nm = find_name(nms, nm_names);
        if (nm < 0)
            return kiln__onnx_fail(n, "nearest_mode '%s' is not supported", nms);
    }
    rm.ct = ct;
    rm.nm = nm;
    rm.cubic_a = (float)kiln__onnx_attr_float(n, "cubic_coeff_a", -0.75);
    rm.exclude_outside = kiln__onnx_attr_int(n, "exclude_outside", 0) != 0;
    if (rm.kind != RM_NEAREST && kiln__onnx_attr_int(n, "antialias", 0))
        return kiln__onnx_fail(n, "antialias=1 is not supported");
    if (rm.kind != RM_NEAREST && !kiln_dtype_is_float(kiln_tensor_dtype(x)))
        return kiln__onnx_fail(n, "%s mode needs a floating-point input, not %s", mode,
                               kiln_dtype_name(kiln_tensor_dtype(x)));
    if (!isfinite(rm.cubic_a))
        return kiln__onnx_fail(n, "cubic_coeff_a must be finite");
    /* the dims the scales or sizes are given for (opset 18's axes), in their order */
    int64_t ax[MAXI];
    int na = kiln__onnx_attr_ints(n, "axes", ax, MAXI), axis[KILN_MAX_DIMS];
    if (na > r)
        return kiln__onnx_fail(n, "axes has %d entries for a rank-%d input", na, r);
    for (int i = 0; i < (na < 0 ? r : na); i++)
        if (na < 0)
            axis[i] = i;
        else if (kiln__onnx_axis(n, ax[i], r, &axis[i]))
            return -1;
    if (na < 0)
        na = r;
    float scale[KILN_MAX_DIMS];
    int64_t osz[KILN_MAX_DIMS], isz[KILN_MAX_DIMS];
    for (int d = 0; d < r; d++) {
        isz[d] = osz[d] = kiln_tensor_dim(x, d);
        scale[d] = 1.0f;
    }
    kiln_tensor *scales = n->opset >= 11 ? (nin > 2 ? in[2] : NULL) : (nin > 1 ? in[1] : NULL);
    kiln_tensor *sizes = n->opset >= 11 && nin > 3 ? in[3] : NULL;
    if (sizes && kiln_tensor_numel(sizes) > 0) {
        const char *policy = kiln__onnx_attr_str(n, "keep_aspect_ratio_policy", "stretch");
        if (strcmp(policy, "stretch"))
            return kiln__onnx_fail(n, "keep_aspect_ratio_policy '%s' is not supported", policy);
        int64_t sz[MAXI];
        int c = kiln__onnx_read_ints(n, sizes, sz, MAXI);
        if (c < 0)
            return -1;
        if (c != na)
            return kiln__onnx_fail(n, "sizes has %d entries for %d dims", c, na);
        for (int i = 0; i < na; i++) {
            int d = axis[i];
            if (sz[i] < 1 || isz[d] < 1)
                return kiln__onnx_fail(n, "cannot resize dim %d from %lld to %lld", d, (long long)isz[d],
                                       (long long)sz[i]);
            osz[d] = sz[i];
            scale[d] = (float)sz[i] / (float)isz[d]; /* the spec's scale, in float as ONNX Runtime */
        }
    } else if (scales && kiln_tensor_numel(scales) > 0) {
        float sc[MAXI];
        int64_t c = kiln_tensor_numel(scales);
        if (c != na)
            return kiln__onnx_fail(n, "scales has %lld entries for %d dims", (long long)c, na);
        kiln_tensor *s32 = kiln_cast(scales, KILN_F32);
        if (!s32 || kiln_to_data(s32, sc, (size_t)c * sizeof *sc))
            return -1;
        for (int i = 0; i < na; i++) {
            int d = axis[i];
            /* the output size as ONNX Runtime computes it (float product, truncated): in double,
             * 5 * 1.4f is 6.99999990 and gives 6 where it gives 7 */
            float o = sc[i] * (float)isz[d];
            if (!(sc[i] > 0) || !(o < 2147483648.0f) || (int64_t)o < 1)
                return kiln__onnx_fail(n, "scale %g for dim %d of size %lld gives no usable output size",
                                       (double)sc[i], d, (long long)isz[d]);
            osz[d] = (int64_t)o;
            scale[d] = sc[i];
        }
    } else {
        return kiln__onnx_fail(n, "needs scales or sizes");
    }
    bool fast = rm.kind != RM_CUBIC && r == 4 && osz[0] == isz[0] && osz[1] == isz[1] && scale[0] == 1.0f &&
                scale[1] == 1.0f;
    for (int d = 2; fast && d < 4; d++) {
        bool ratio = (float)osz[d] == (float)isz[d] * scale[d];
        if (!linear)
            fast = ratio && ct == CT_ASYMMETRIC && (nm == NM_FLOOR || nm == NM_SIMPLE) && whole(scale[d], 64) &&
                   !((int)scale[d] & ((int)scale[d] - 1));
        else /* align_corners maps by the sizes alone */
            fast = ct == CT_ALIGN_CORNERS ||
                   (ratio && (ct == CT_HALF_PIXEL || ct == CT_PYTORCH_HALF_PIXEL) && whole(scale[d], 1 << 20));
    }
    if (fast) {
        out[0] = kiln_interpolate(x, osz[2], osz[3], linear ? KILN_INTERP_BILINEAR : KILN_INTERP_NEAREST,
                                  ct == CT_ALIGN_CORNERS);
        return kiln__onnx_ok(out);
    }
    kiln_tensor *y = x;
    for (int k = 0; y && k < r; k++) {
        int d = rm.kind == RM_CUBIC ? r - 1 - k : k;
        if (osz[d] != isz[d] || scale[d] != 1.0f)
            y = resize_dim(y, d, osz[d], scale[d], &rm);
    }
    out[0] = y;
    return kiln__onnx_ok(out);
}

/* Upsample (opsets 7 to 9, deprecated by Resize at 10): opset 10's Resize, whose asymmetric
 * coordinates and rounding are Upsample's, with the scales from the attribute (opset 7) or
 * the second input (opset 9). */
static int op_upsample(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out)
{
    KILN__ONNX_NEED(1);
    kiln__onnx_node as_resize = *n;
    as_resize.opset = 10;
    const char *mode = kiln__onnx_attr_str(n, "mode", "nearest");
    if (strcmp(mode, "nearest") && strcmp(mode, "linear"))
        return kiln__onnx_fail(n, "mode '%s' is not supported (nearest, linear)", mode);
    kiln_tensor *scales = nin > 1 ? in[1] : NULL;
    if (!scales) {
        const kiln__onnx_attr *a = kiln__onnx_attr_get(n, "scales");
        if (!a || a->nfloats != kiln_tensor_ndim(in[0]))
            return kiln__onnx_fail(n, "needs a scales attribute with one entry per dim of x");
        float f[KILN_MAX_DIMS];
        for (int i = 0; i < a->nfloats; i++)
            f[i] = (float)a->floats[i];
        int64_t len = a->nfloats;
        scales = kiln_from_data(kiln_tensor_device(in[0]), KILN_F32, 1, &len, f, (size_t)len * sizeof *f);
    }
    return op_resize(&as_resize, 2, (kiln_tensor *[]){in[0], scales}, nout, out);
}

/* ------------------------------------------------------------------ GridSample */

/* GridSample (opset 16's bilinear/nearest/bicubic, opset 20's linear/nearest/cubic and its
 * volumetric inputs) as the spec's reference computes it: each grid value denormalized to a
 * pixel coordinate; nearest rounds it half to even; a coordinate beyond the padding bounds
 * (the outer pixel edges, or the outer centres with align_corners) is clamped (border, but
 * for cubic) or reflected (reflection); then the taps (1, 2 or 4 per dim) are read, a tap outside the
 * input reading 0 (zeros), the edge (border) or its reflection, and interpolated innermost
 * dim first. Everything is tensor ops on the grid and row gathers from X, so it runs on
 * every device and gradients reach both X and the grid.
 *
 * X is read as a table of rows, one per (image, pixel), its channels in a row (one
 * transposed copy of X), with two more rows: zeros and NaNs. A tap then gathers whole
 * rows with one index per point, not one per point and channel, and a tap outside the
 * input under zeros padding (or at a NaN coordinate) simply points at the zero (or NaN)
 * row, where masking the gathered values would take a select over the whole output per
 * tap. On X [1, 32, 112, 112] and a grid of as many points, one thread: bilinear 14 ms
 * gathering per channel with masks, 4.2 ms by rows (ONNX Runtime 1.2); nearest 7.4 -> 1.5
 * (ONNX Runtime 3.3); bicubic 52 -> 19 (ONNX Runtime 17). */
enum {
    GS_NEAREST,
    GS_LINEAR,
    GS_CUBIC
};
enum {
    GS_ZEROS,
    GS_BORDER,
    GS_REFLECTION
};

/* The taps along one spatial dim: for each, an i64 index into the dim (clamped into it),
 * the weight in the sampled dtype, and (zeros padding) whether the tap lies inside. */
typedef struct gs_dim {
    int ntaps;
    int64_t size;
    kiln_tensor *index[4], *weight[4], *inside[4];
    kiln_tensor *nan; /* where the coordinate is NaN: the output is NaN there */
} gs_dim;

/* X as rows: [N * cells + 2, C], the last two rows zeros and NaNs. */
typedef struct gs_table {
    kiln_tensor *rows;
    int64_t zero_row, npoints; /* the zero row's index (the NaN row follows); N * P */
    kiln_tensor *nan;          /* bool [N, P]: a point with a NaN coordinate in any dim */
} gs_table;

kiln_tensor *kiln__onnx_pixel_rows(kiln_tensor *x, bool nan_row)
{
    int r = kiln_tensor_ndim(x), perm[KILN_MAX_DIMS] = {0};
    int64_t ch = kiln_tensor_dim(x, 1), rows = kiln_tensor_numel(x) / (ch ? ch : 1);
    for (int d = 2; d < r; d++)
        perm[d - 1] = d;
    perm[r - 1] = 1;
    kiln_device *dev = kiln_tensor_device(x);
    kiln_dtype dt = kiln_tensor_dtype(x);
    kiln_tensor *pieces[3] = {kiln_reshape(kiln_contiguous(kiln_permute(x, r, perm)), 2, (int64_t[]){rows, ch}),
                              kiln_full(dev, dt, 2, (int64_t[]){1, ch}, 0),
                              kiln_full(dev, dt, 2, (int64_t[]){1, ch}, NAN)};
    return kiln_cat(pieces, nan_row ? 3 : 2, 0);
}

/* v reflected about the bounds [lo, hi] until it lies within them (the spec's rule: the
 * number of whole spans past the near bound decides which bound the rest counts from). */
static kiln_tensor *gs_reflect(kiln_tensor *v, double lo, double hi)
{
    double span = hi - lo;
    if (!(span > 0)) /* a one-pixel dim with align_corners: every reflection lands on it */
        return kiln_mul_scalar(v, 0.0);
    kiln_tensor *below = kiln_lt(v, kiln_full_like(v, lo));
    kiln_tensor *past = kiln_where(below, kiln_add_scalar(kiln_mul_scalar(v, -1), lo), kiln_add_scalar(v, -hi));
    kiln_tensor *spans = kiln_floor(kiln_mul_scalar(past, 1.0 / span));
    kiln_tensor *rest = kiln_sub(past, kiln_mul_scalar(spans, span));
    kiln_tensor *even = kiln_eq(kiln_remainder(spans, kiln_full_like(spans, 2)), kiln_zeros_like(spans));
    /* below with an even count, or above with an odd one, counts from lo */
    kiln_tensor *from_lo = kiln_eq(below, even);
    return kiln_where(from_lo, kiln_add_scalar(rest, lo), kiln_add_scalar(kiln_mul_scalar(rest, -1), hi));
}

static kiln_tensor *gs_outside(kiln_tensor *v, double lo, double hi)
{
    return kiln_logical_or(kiln_lt(v, kiln_full_like(v, lo)), kiln_gt(v, kiln_full_like(v, hi)));
}

/* Keys' cubic weights (a = -0.75) for the taps at -1, 0, 1, 2 past floor, t the fraction. */
static void gs_cubic_weights(kiln_tensor *t, kiln_tensor *w[4])
{
    const double a = -0.75;
    kiln_tensor *d[4] = {kiln_add_scalar(t, 1), t, kiln_add_scalar(kiln_mul_scalar(t, -1), 1),
                         kiln_add_scalar(kiln_mul_scalar(t, -1), 2)};
    for (int k = 0; k < 4; k++) {
        kiln_tensor *x = d[k];
        if (k == 1 || k == 2) /* ((a + 2) x - (a + 3)) x x + 1 */
            w[k] = kiln_add_scalar(kiln_mul(kiln_mul(kiln_add_scalar(kiln_mul_scalar(x, a + 2), -(a + 3)), x), x),
                                   1);
        else /* ((a x - 5 a) x + 8 a) x - 4 a */
            w[k] = kiln_add_scalar(
                kiln_mul(kiln_add_scalar(kiln_mul(kiln_add_scalar(kiln_mul_scalar(x, a), -5 * a), x), 8 * a), x),
                -4 * a);
    }
}

/* The taps of one spatial dim of size n from grid values g (normalized, in the grid's dtype). */
static int gs_dim_taps(kiln_tensor *g, int64_t n, int mode, int padding, bool align, kiln_dtype wdt, gs_dim *out)
{
    /* denormalize in the spec's order of float operations */
    kiln_tensor *x = align ? kiln_mul_scalar(kiln_mul_scalar(kiln_add_scalar(g, 1), 0.5), (double)(n - 1))
                           : kiln_mul_scalar(
                                 kiln_add_scalar(kiln_mul_scalar(kiln_add_scalar(g, 1), (double)n), -1), 0.5);
    double lo = align ? 0 : -0.5, hi = align ? (double)(n - 1) : (double)n - 0.5;
    if (mode == GS_NEAREST)
        x = kiln_round(x);
    /* border clamps the coordinate, except for cubic: there ONNX Runtime and PyTorch clamp
     * only the taps (the spec's reference clamps both, which changes the weights near an
     * edge; every exporter of GridSample is PyTorch, so theirs is the meaning kept) */
    if (padding == GS_BORDER && mode != GS_CUBIC)
        x = kiln_where(gs_outside(x, lo, hi), kiln_clamp(x, 0, (double)(n - 1)), x);
    else if (padding == GS_REFLECTION)
        x = kiln_where(gs_outside(x, lo, hi), gs_reflect(x, lo, hi), x);
    /* A coordinate further out than every tap can reach samples what the bound would, so
     * infinities act as limits (0 with zeros, the edge with border) instead of giving
     * inf - inf weights and indices no integer holds. NaN (a NaN grid value, or an infinite
     * one reflected) stays NaN: its output is NaN, and its taps read index 0. */
    x = kiln_clamp(x, -3, (double)n + 2);
    out->nan = kiln_isnan(x);
    kiln_tensor *base = mode == GS_NEAREST ? x : kiln_floor(x), *w[4] = {NULL};
    out->size = n;
    out->ntaps = mode == GS_NEAREST ? 1 : mode == GS_LINEAR ? 2 : 4;
    if (mode == GS_LINEAR) {
        kiln_tensor *t = kiln_sub(x, base);
        w[0] = kiln_add_scalar(kiln_mul_scalar(t, -1), 1);
        w[1] = t;
    } else if (mode == GS_CUBIC) {
        gs_cubic_weights(kiln_sub(x, base), w);
    }
    int first = mode == GS_CUBIC ? -1 : 0;
    for (int k = 0; k < out->ntaps; k++) {
        kiln_tensor *i = k + first ? kiln_add_scalar(base, k + first) : base;
        out->inside[k] = padding == GS_ZEROS ? kiln_logical_not(gs_outside(i, 0, (double)(n - 1))) : NULL;
        if (padding == GS_REFLECTION)
            i = kiln_where(gs_outside(i, lo, hi), kiln_floor(gs_reflect(i, lo, hi)), i);
        /* clamped for every mode: border reads the edge, zeros masks the tap afterwards,
         * and the gather must never see an index out of range */
        i = kiln_where(out->nan, kiln_zeros_like(i), kiln_clamp(i, 0, (double)(n - 1)));
        out->index[k] = kiln_cast(i, KILN_I64);
        out->weight[k] = w[k] ? kiln_cast(w[k], wdt) : NULL;
        if (!out->nan || !out->index[k] || (w[k] && !out->weight[k]) || (padding == GS_ZEROS && !out->inside[k]))
            return -1;
    }
    return 0;
}

/* The interpolated rows over dims d.. (points [N, P], rows [N * P, C]), the taps of the
 * outer dims already chosen: offset (i64 [N, P]: the row of the tap within the table) and
 * mask (bool [N, P], or NULL: whether every tap so far lies inside the input). */
static kiln_tensor *gs_interp(const gs_table *tb, const gs_dim *dims, int nsp, int d, kiln_tensor *offset,
                              kiln_tensor *mask)
{
    if (d == nsp) {
        kiln_tensor *row = mask ? kiln_where(mask, offset, kiln_full_like(offset, (double)tb->zero_row)) : offset;
        row = kiln_where(tb->nan, kiln_full_like(row, (double)tb->zero_row + 1), row);
        return kiln_index_select(tb->rows, 0, kiln_reshape(row, 1, (int64_t[]){tb->npoints}));
    }
    int64_t stride = 1;
    for (int k = d + 1; k < nsp; k++)
        stride *= dims[k].size;
    kiln_tensor *acc = NULL;
    for (int k = 0; k < dims[d].ntaps; k++) {
        kiln_tensor *off = kiln_add(offset, kiln_mul_scalar(dims[d].index[k], (double)stride));
        kiln_tensor *m = dims[d].inside[k] ? (mask ? kiln_logical_and(mask, dims[d].inside[k]) : dims[d].inside[k])
                                           : mask;
        kiln_tensor *v = gs_interp(tb, dims, nsp, d + 1, off, m);
        if (dims[d].weight[k])
            v = kiln_mul(kiln_reshape(dims[d].weight[k], 2, (int64_t[]){tb->npoints, 1}), v);
        acc = acc ? kiln_add(acc, v) : v;
    }
    return acc;
}

static int op_grid_sample(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out)
{
    KILN__ONNX_NEED(2);
    kiln_tensor *x = in[0], *grid = in[1];
    int r = kiln_tensor_ndim(x), nsp = r - 2;
    bool v20 = n->opset >= 20;
    if (nsp < 1 || nsp > 3 || (!v20 && nsp != 2))
        return kiln__onnx_fail(n, "X has rank %d; GridSample takes %s", r,
                               v20 ? "ranks 3 to 5 (1 to 3 spatial dims)" : "rank 4 (N, C, H, W) before opset 20");
    if (!kiln_dtype_is_float(kiln_tensor_dtype(x)) || !kiln_dtype_is_float(kiln_tensor_dtype(grid)))
        return kiln__onnx_fail(n, "X and grid must be floating point, not %s and %s",
                               kiln_dtype_name(kiln_tensor_dtype(x)), kiln_dtype_name(kiln_tensor_dtype(grid)));
    if (kiln_tensor_ndim(grid) != r || kiln_tensor_dim(grid, 0) != kiln_tensor_dim(x, 0) ||
        kiln_tensor_dim(grid, r - 1) != nsp)
        return kiln__onnx_fail(n, "grid must have shape (N, out dims..., %d) with N = %lld for X of rank %d", nsp,
                               (long long)kiln_tensor_dim(x, 0), r);
    const char *ms = kiln__onnx_attr_str(n, "mode", v20 ? "linear" : "bilinear");
    int mode = !strcmp(ms, v20 ? "linear" : "bilinear") ? GS_LINEAR
               : !strcmp(ms, "nearest")                 ? GS_NEAREST
               : !strcmp(ms, v20 ? "cubic" : "bicubic") ? GS_CUBIC
                                                        : -1;
    if (mode < 0)
        return kiln__onnx_fail(n, "mode '%s' is not supported (%s)", ms,
                               v20 ? "linear, nearest and cubic at opset 20" : "bilinear, nearest and bicubic");
    if (mode == GS_CUBIC && nsp != 2)
        return kiln__onnx_fail(n, "cubic mode takes 2 spatial dims, not %d", nsp);
    const char *ps = kiln__onnx_attr_str(n, "padding_mode", "zeros");
    int padding = !strcmp(ps, "zeros")        ? GS_ZEROS
                  : !strcmp(ps, "border")     ? GS_BORDER
                  : !strcmp(ps, "reflection") ? GS_REFLECTION
                                              : -1;
    if (padding < 0)
        return kiln__onnx_fail(n, "padding_mode '%s' is not supported (zeros, border, reflection)", ps);
    bool align = kiln__onnx_attr_int(n, "align_corners", 0) != 0;
    int64_t batch = kiln_tensor_dim(x, 0), ch = kiln_tensor_dim(x, 1), points = 1, cells = 1;
    int64_t yshape[KILN_MAX_DIMS] = {batch, ch};
    for (int d = 0; d < nsp; d++) {
        points *= kiln_tensor_dim(grid, 1 + d);
        cells *= kiln_tensor_dim(x, 2 + d);
        yshape[2 + d] = kiln_tensor_dim(grid, 1 + d);
    }
    if (cells == 0 && points > 0)
        return kiln__onnx_fail(n, "X has an empty spatial dim to sample from");
    /* coordinates in f32 at least (a half-precision grid loses whole pixels past 2048) */
    kiln_dtype gdt = kiln_tensor_dtype(grid) == KILN_F64 ? KILN_F64 : KILN_F32;
    kiln_tensor *g = kiln_reshape(kiln_cast(grid, gdt), 2, (int64_t[]){batch, points * nsp});
    gs_dim dims[3];
    for (int d = 0; d < nsp; d++) {
        /* the grid's last dim lists the coordinates innermost dim first: (x, y[, z]) */
        kiln_tensor *gd = kiln_slice(g, 1, nsp - 1 - d, points * nsp, nsp);
        if (!gd ||
            gs_dim_taps(gd, kiln_tensor_dim(x, 2 + d), mode, padding, align, kiln_tensor_dtype(x), &dims[d]))
            return -1;
    }
    gs_table tb = {.rows = kiln__onnx_pixel_rows(x, true),
                   .zero_row = batch * cells,
                   .npoints = batch * points,
                   .nan = dims[0].nan};
    for (int d = 1; d < nsp; d++)
        tb.nan = kiln_logical_or(tb.nan, dims[d].nan);
    /* each image's rows start at n * cells */
    kiln_tensor *first = kiln_reshape(
        kiln_arange(kiln_tensor_device(x), KILN_I64, 0, (double)(batch * cells), (double)(cells ? cells : 1)), 2,
        (int64_t[]){batch, 1});
    kiln_tensor *y = tb.rows && tb.nan && first ? gs_interp(&tb, dims, nsp, 0, first, NULL) : NULL;
    /* [N * P, C] -> [N, P, C] -> [N, C, out dims...] */
    int operm[KILN_MAX_DIMS] = {0, r - 1};
    for (int d = 0; d < nsp; d++)
        operm[2 + d] = 1 + d;
    int64_t pshape[KILN_MAX_DIMS] = {batch};
    for (int d = 0; d < nsp; d++)
        pshape[1 + d] = yshape[2 + d];
    pshape[r - 1] = ch;
    out[0] = y ? kiln_contiguous(kiln_permute(kiln_reshape(y, r, pshape), r, operm)) : NULL;
    return kiln__onnx_ok(out);
}

/* ------------------------------------------------------------------ AffineGrid */

/* AffineGrid (opset 20; PyTorch's affine_grid exports as it from opset 20): the grid of
 * normalized coordinates (x, y[, z], 1) over an output of the given size, each mapped by
 * theta [N, r, r + 1]. The base coordinates of a dim of n pixels are the pixel centres,
 * (2 i + 1) / n - 1, or with align_corners the corners' spacing, -1 + 2 i / (n - 1) (-1 for
 * n = 1), computed on the host in double as the spec's reference does; the product runs on
 * the device, so gradients reach theta. */
static int op_affine_grid(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out)
{
    KILN__ONNX_NEED(2);
    kiln_tensor *theta = in[0];
    int r = kiln_tensor_ndim(theta) == 3 ? (int)kiln_tensor_dim(theta, 1) : 0;
    if ((r != 2 && r != 3) || kiln_tensor_dim(theta, 2) != r + 1)
        return kiln__onnx_fail(n, "theta must have shape (N, 2, 3) or (N, 3, 4)");
    if (!kiln_dtype_is_float(kiln_tensor_dtype(theta)))
        return kiln__onnx_fail(n, "theta must be floating point, not %s",
                               kiln_dtype_name(kiln_tensor_dtype(theta)));
    int64_t size[8];
    int c = kiln__onnx_read_ints(n, in[1], size, 8);
    if (c < 0)
        return -1;
    if (c != r + 2)
        return kiln__onnx_fail(n, "size has %d entries; theta of shape (N, %d, %d) needs %d (N, C, spatial dims)",
                               c, r, r + 1, r + 2);
    if (size[0] != kiln_tensor_dim(theta, 0))
        return kiln__onnx_fail(n, "size gives N = %lld, theta has %lld", (long long)size[0],
                               (long long)kiln_tensor_dim(theta, 0));
    /* the points, bounded so that the host's base grid stays a plain allocation */
    int64_t points = 1;
    for (int d = 0; d < r; d++) {
        if (size[2 + d] < 1 || size[2 + d] > ((int64_t)1 << 31) / points)
            return kiln__onnx_fail(n, "spatial size %lld of dim %d is out of range (1 to 2^31 points in all)",
                                   (long long)size[2 + d], d);
        points *= size[2 + d];
    }
    bool align = kiln__onnx_attr_int(n, "align_corners", 0) != 0;
    float *base = malloc((size_t)points * (size_t)(r + 1) * sizeof *base);
    if (!base)
        return kiln__onnx_fail(n, "out of memory for a base grid of %lld points", (long long)points);
    for (int64_t p = 0; p < points; p++) {
        int64_t rest = p;
        /* dims from the last (x) to the first, which is also the order of the coordinates */
        for (int k = 0; k < r; k++) {
            int64_t dn = size[2 + r - 1 - k], i = rest % dn;
            rest /= dn;
            double v = align ? (dn > 1 ? -1.0 + (double)i * (2.0 / (double)(dn - 1)) : -1.0)
                             : -1.0 + 1.0 / (double)dn + (double)i * (2.0 / (double)dn);
            base[p * (r + 1) + k] = (float)v;
        }
        base[p * (r + 1) + r] = 1.0f;
    }
    kiln_tensor *bt = kiln_from_data(kiln_tensor_device(theta), KILN_F32, 3, (int64_t[]){1, points, r + 1}, base,
                                     (size_t)points * (size_t)(r + 1) * sizeof *base);
    free(base);
    if (bt && kiln_tensor_dtype(theta) != KILN_F32)
        bt = kiln_cast(bt, kiln_tensor_dtype(theta));
    int64_t gshape[5] = {size[0]};
    for (int d = 0; d < r; d++)
        gshape[1 + d] = size[2 + d];
    gshape[1 + r] = r;
    kiln_tensor *grid = kiln_matmul(bt, kiln_transpose(theta, 1, 2));
    out[0] = grid ? kiln_reshape(grid, r + 2, gshape) : NULL;
    return kiln__onnx_ok(out);
}

const kiln__onnx_op kiln__onnx_ops_sample[] = {
    {"Resize", op_resize},
    {"Upsample", op_upsample},
    {"GridSample", op_grid_sample},
    {"AffineGrid", op_affine_grid},
    {NULL, NULL},
};
