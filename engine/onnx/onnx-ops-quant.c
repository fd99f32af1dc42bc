/*
 * onnx-ops-quant.c — ONNX's linear quantization: QuantizeLinear and DequantizeLinear, which
 * make up the QDQ format (ONNX Runtime's quantize_static writes it by default: int8 weights
 * stored with a DequantizeLinear each, activations passed through a QuantizeLinear and a
 * DequantizeLinear pair), per tensor, per axis and (opset 21) per block; DynamicQuantizeLinear
 * with MatMulInteger, which quantize_dynamic writes for each MatMul; and QLinearConv and
 * QLinearMatMul, the standard operators of the QOperator format.
 *
 * kiln runs such a model as its float computation with the quantization steps in it: each
 * pair rounds an activation to the grid of its scale and zero point, each weight is its
 * stored integers times its scale, so the outputs are the ones the quantized model defines
 * (ONNX Runtime's own run without graph rewriting, within float rounding), not a faster
 * integer path.
 *
 * kiln holds int8, int16 and uint16 as i32 (onnx-proto.c), so a QuantizeLinear cannot tell
 * its output type from its zero point's tensor: the loader records the zero point's ONNX
 * type in the node (kiln__onnx_declared_type), and the saturation bounds follow from it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error-impl.h"
#include "onnx-impl.h"

int kiln__onnx_declared_type(const kiln__onnx_pmodel *pm, const char *name)
{
    if (!name || !*name)
        return 0;
    for (int i = 0; i < pm->ninits; i++)
        if (!strcmp(pm->inits[i].name, name))
            return pm->inits[i].onnx_type;
    for (int i = 0; i < pm->ninputs; i++)
        if (!strcmp(pm->inputs[i].name, name))
            return pm->inputs[i].elem_type;
    for (int k = 0; k < pm->nnodes; k++) {
        const kiln__onnx_pnode *pn = &pm->nodes[k];
        if (strcmp(pn->op_type, "Constant") || pn->noutputs < 1 || strcmp(pn->outputs[0], name))
            continue;
        for (int a = 0; a < pn->nattrs; a++)
            if (!strcmp(pn->attrs[a].name, "value") && pn->attrs[a].t)
                return pn->attrs[a].t->onnx_type;
    }
    return 0;
}

/* The integer range of a quantized ONNX type; false for a type kiln does not quantize to. */
static bool quant_range(int onnx_type, double *lo, double *hi)
{
    switch (onnx_type) {
    case KILN__ONNX_UINT8: *lo = 0, *hi = 255; return true;
    case KILN__ONNX_INT8: *lo = -128, *hi = 127; return true;
    case KILN__ONNX_UINT16: *lo = 0, *hi = 65535; return true;
    case KILN__ONNX_INT16: *lo = -32768, *hi = 32767; return true;
    default: return false;
    }
}

/* The ONNX type a quantizing node writes: its zero point's (the loader's record of it, or for
 * a zero point another node computes, uint8 when its kiln dtype says so: the other types
 * share i32), without_zp when it has none; 0 when unknown. */
static int output_type(const kiln__onnx_node *n, kiln_tensor *zp, int without_zp)
{
    if (!zp)
        return without_zp;
    if (n->quant_type)
        return n->quant_type;
    return kiln_tensor_dtype(zp) == KILN_U8 ? KILN__ONNX_UINT8 : 0;
}

/* scale (or zero point) shaped to broadcast against x: a scalar as it is, a 1-D one along
 * axis, a blocked one (opset 21: x's shape with ceil(dim / block) along axis) repeated
 * block times along axis and cut to x's dim. NULL with a message naming what does not fit. */
static kiln_tensor *broadcast_param(const kiln__onnx_node *n, kiln_tensor *p, kiln_tensor *x, int axis,
                                    int64_t block, const char *what)
{
    int r = kiln_tensor_ndim(x);
    int64_t len = r ? kiln_tensor_dim(x, axis) : 1;
    if (kiln_tensor_numel(p) == 1 && block == 0)
        return kiln_reshape(p, 0, NULL);
    if (block == 0) {
        if (kiln_tensor_ndim(p) != 1 || kiln_tensor_dim(p, 0) != len) {
            kiln__onnx_fail(n, "%s has %lld elements; per-axis quantization along axis %d needs %lld", what,
                            (long long)kiln_tensor_numel(p), axis, (long long)len);
            return NULL;
        }
        int64_t shape[KILN_MAX_DIMS];
        for (int d = 0; d < r; d++)
            shape[d] = d == axis ? len : 1;
        return kiln_reshape(p, r, shape);
    }
    bool fits = kiln_tensor_ndim(p) == r;
    for (int d = 0; fits && d < r; d++)
        fits = kiln_tensor_dim(p, d) == (d == axis ? (len + block - 1) / block : kiln_tensor_dim(x, d));
    if (!fits) {
        kiln__onnx_fail(n, "%s does not have the shape of x with ceil(%lld / %lld) along axis %d", what,
                        (long long)len, (long long)block, axis);
        return NULL;
    }
    int64_t *idx = malloc((size_t)(len ? len : 1) * sizeof *idx);
    if (!idx) {
        kiln__onnx_fail(n, "out of memory");
        return NULL;
    }
    for (int64_t i = 0; i < len; i++)
        idx[i] = i / block;
    kiln_tensor *it = kiln_from_data(kiln_tensor_device(p), KILN_I64, 1, &len, idx, (size_t)len * sizeof *idx);
    free(idx);
    return kiln_index_select(p, axis, it);
}

/* The axis and block size of a per-axis or blocked quantization node (neither matters, and
 * the axis is not checked, for a scalar scale: ONNX Runtime ignores it then). */
static int quant_axis(const kiln__onnx_node *n, kiln_tensor *x, kiln_tensor *scale, int *axis, int64_t *block)
{
    int r = kiln_tensor_ndim(x);
    *block = n->opset >= 21 ? kiln__onnx_attr_int(n, "block_size", 0) : 0;
    if (*block < 0)
        return kiln__onnx_fail(n, "block_size %lld is negative", (long long)*block);
    if (r == 0 || (*block == 0 && kiln_tensor_numel(scale) == 1)) {
        *axis = 0;
        return 0;
    }
    return kiln__onnx_axis(n, kiln__onnx_attr_int(n, "axis", 1), r, axis);
}

/* y = saturate(round_half_even(x / scale) + zero_point), in the zero point's type (uint8 when
 * there is none, or opset 21's output_dtype). */
static int op_quantize_linear(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout,
                              kiln_tensor **out)
{
    KILN__ONNX_NEED(2);
    kiln_tensor *x = in[0], *scale = in[1], *zp = nin > 2 ? in[2] : NULL;
    if (!kiln_dtype_is_float(kiln_tensor_dtype(x)) && kiln_tensor_dtype(x) != KILN_I32)
        return kiln__onnx_fail(n, "x must be float or int32, not %s", kiln_dtype_name(kiln_tensor_dtype(x)));
    int qtype = output_type(
        n, zp,
        (int)(n->opset >= 21 ? kiln__onnx_attr_int(n, "output_dtype", KILN__ONNX_UINT8) : KILN__ONNX_UINT8));
    double lo, hi;
    if (!quant_range(qtype, &lo, &hi))
        return kiln__onnx_fail(n,
                               "quantizing to ONNX type %d is not supported (uint8, int8, uint16 and int16 are; "
                               "a zero point computed by the graph must be uint8)",
                               qtype);
    if (n->opset >= 19 && !kiln__onnx_attr_int(n, "saturate", 1))
        return kiln__onnx_fail(n, "saturate=0 applies to float8 outputs only, which kiln does not have");
    int axis;
    int64_t block;
    if (quant_axis(n, x, scale, &axis, &block))
        return -1;
    kiln_dtype fdt = kiln_tensor_dtype(x) == KILN_F64 ? KILN_F64 : KILN_F32;
    kiln_tensor *s = broadcast_param(n, kiln_cast(scale, fdt), x, axis, block, "y_scale");
    if (!s)
        return -1;
    kiln_tensor *q = kiln_round(kiln_div(kiln_cast(x, fdt), s));
    /* NaN quantizes to the zero point (0.0's code): the integer cast of NaN means nothing */
    q = kiln_where(kiln_isnan(q), kiln_zeros_like(q), q);
    if (zp) {
        kiln_tensor *z = broadcast_param(n, kiln_cast(zp, fdt), x, axis, block, "y_zero_point");
        if (!z)
            return -1;
        q = kiln_add(q, z);
    }
    q = kiln_clamp(q, lo, hi);
    out[0] = kiln_cast(q, qtype == KILN__ONNX_UINT8 ? KILN_U8 : KILN_I32);
    return kiln__onnx_ok(out);
}

/* y = (x - zero_point) * scale, the difference taken exactly in integers, in the scale's type. */
static int op_dequantize_linear(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout,
                                kiln_tensor **out)
{
    KILN__ONNX_NEED(2);
    kiln_tensor *x = in[0], *scale = in[1], *zp = nin > 2 ? in[2] : NULL;
    kiln_dtype xdt = kiln_tensor_dtype(x);
    if (xdt != KILN_U8 && xdt != KILN_I32)
        return kiln__onnx_fail(n, "x must be an 8, 16 or 32-bit integer, not %s", kiln_dtype_name(xdt));
    if (!kiln_dtype_is_float(kiln_tensor_dtype(scale)))
        return kiln__onnx_fail(n, "x_scale must be floating point, not %s",
                               kiln_dtype_name(kiln_tensor_dtype(scale)));
    int axis;
    int64_t block;
    if (quant_axis(n, x, scale, &axis, &block))
        return -1;
    kiln_tensor *s = broadcast_param(n, scale, x, axis, block, "x_scale");
    if (!s)
        return -1;
    kiln_tensor *v = kiln_cast(x, KILN_I32);
    if (zp) {
        kiln_tensor *z = broadcast_param(n, kiln_cast(zp, KILN_I32), x, axis, block, "x_zero_point");
        if (!z)
            return -1;
        v = kiln_sub(v, z);
    }
    out[0] = kiln_mul(kiln_cast(v, kiln_tensor_dtype(scale)), s);
    return kiln__onnx_ok(out);
}

/* DynamicQuantizeLinear: x to uint8 over the range [min(x, 0), max(x, 0)], the scale and the
 * zero point computed from x on the device (the spec's formulas; an x of zeros gets scale 1,
 * as ONNX Runtime gives it, where the formula divides by 0). quantize_dynamic puts one before
 * every MatMulInteger. */
static int op_dynamic_quantize_linear(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout,
                                      kiln_tensor **out)
{
    KILN__ONNX_NEED(1);
    kiln_tensor *x = in[0];
    if (kiln_tensor_dtype(x) != KILN_F32)
        return kiln__onnx_fail(n, "x must be float32, not %s", kiln_dtype_name(kiln_tensor_dtype(x)));
    if (kiln_tensor_numel(x) == 0)
        return kiln__onnx_fail(n, "x is empty: it has no range to quantize over");
    kiln_tensor *zero = kiln_zeros(kiln_tensor_device(x), KILN_F32, 0, NULL);
    kiln_tensor *lo = kiln_minimum(kiln_min(x, 0, NULL, false), zero);
    kiln_tensor *hi = kiln_maximum(kiln_max(x, 0, NULL, false), zero);
    kiln_tensor *range = kiln_sub(hi, lo);
    kiln_tensor *scale = kiln_where(kiln_eq(range, zero), kiln_full_like(range, 1),
                                    kiln_div(range, kiln_full_like(range, 255)));
    kiln_tensor *zp = kiln_round(kiln_clamp(kiln_sub(zero, kiln_div(lo, scale)), 0, 255));
    kiln_tensor *q = kiln_round(kiln_div(x, scale));
    q = kiln_where(kiln_isnan(q), kiln_zeros_like(q), q);
    out[0] = kiln_cast(kiln_clamp(kiln_add(q, zp), 0, 255), KILN_U8);
    if (nout > 1)
        out[1] = scale;
    if (nout > 2)
        out[2] = kiln_cast(zp, KILN_U8);
    for (int i = 0; i < nout && i < 3; i++)
        if (!out[i])
            return -1;
    return 0;
}

/* MatMulInteger: (A - a_zero_point) @ (B - b_zero_point) in int32. The products are summed in
 * double, exact for any depth under 2^37 (each term is below 2^16 in magnitude), and rounded
 * back: the engine's matmuls are floating point. a_zero_point may be per row of a
 * 2-D A, b_zero_point per column of B. */
static int op_matmul_integer(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout,
                             kiln_tensor **out)
{
    KILN__ONNX_NEED(2);
    kiln_tensor *a = in[0], *b = in[1];
    for (int i = 0; i < 2; i++) {
        kiln_dtype dt = kiln_tensor_dtype(in[i]);
        if (dt != KILN_U8 && dt != KILN_I32)
            return kiln__onnx_fail(n, "%s must be an 8-bit integer, not %s", i ? "B" : "A", kiln_dtype_name(dt));
    }
    kiln_tensor *af = kiln_cast(a, KILN_F64), *bf = kiln_cast(b, KILN_F64);
    if (nin > 2 && in[2]) {
        kiln_tensor *z = kiln_cast(in[2], KILN_F64);
        int64_t rows = kiln_tensor_ndim(a) >= 2 ? kiln_tensor_dim(a, kiln_tensor_ndim(a) - 2) : 1;
        if (kiln_tensor_numel(in[2]) != 1) {
            if (kiln_tensor_ndim(a) != 2 || kiln_tensor_ndim(in[2]) != 1 || kiln_tensor_dim(in[2], 0) != rows)
                return kiln__onnx_fail(n, "a_zero_point must be a scalar, or one per row of a 2-D A");
            z = kiln_reshape(z, 2, (int64_t[]){rows, 1});
        }
        af = kiln_sub(af, z);
    }
    if (nin > 3 && in[3]) {
        int64_t cols = kiln_tensor_ndim(b) ? kiln_tensor_dim(b, kiln_tensor_ndim(b) - 1) : 1;
        if (kiln_tensor_numel(in[3]) != 1 && (kiln_tensor_ndim(in[3]) != 1 || kiln_tensor_dim(in[3], 0) != cols))
            return kiln__onnx_fail(n, "b_zero_point must be a scalar, or one per column of B");
        bf = kiln_sub(bf, kiln_cast(in[3], KILN_F64));
    }
    out[0] = kiln_cast(kiln_round(kiln_matmul(af, bf)), KILN_I32);
    return kiln__onnx_ok(out);
}

/* The int32 accumulator acc (exact, in f64) brought to the output's codes as ONNX Runtime
 * requantizes: acc as float times the float multiplier (x_scale * w_scale / y_scale), rounded
 * half to even, plus the zero point, saturated to the type of y_zero_point. */
static kiln_tensor *requantize(const kiln__onnx_node *n, kiln_tensor *acc, kiln_tensor *mult, kiln_tensor *y_zp)
{
    int qtype = output_type(n, y_zp, KILN__ONNX_UINT8);
    double lo, hi;
    if (!quant_range(qtype, &lo, &hi)) {
        kiln__onnx_fail(n, "an output of ONNX type %d is not supported (uint8 and int8 are)", qtype);
        return NULL;
    }
    kiln_tensor *q = kiln_round(kiln_mul(kiln_cast(acc, KILN_F32), mult));
    if (y_zp)
        q = kiln_add(q, kiln_cast(y_zp, KILN_F32));
    return kiln_cast(kiln_clamp(q, lo, hi), qtype == KILN__ONNX_UINT8 ? KILN_U8 : KILN_I32);
}

/* x - zero_point as exact integers in f64, the zero point scalar or (per_axis >= 0) one per
 * index of that dim of x. */
static kiln_tensor *centered(const kiln__onnx_node *n, kiln_tensor *x, kiln_tensor *zp, int per_axis,
                             const char *what)
{
    kiln_dtype dt = kiln_tensor_dtype(x);
    if (dt != KILN_U8 && dt != KILN_I32) {
        kiln__onnx_fail(n, "%s must be an 8-bit integer, not %s", what, kiln_dtype_name(dt));
        return NULL;
    }
    kiln_tensor *v = kiln_cast(x, KILN_F64);
    if (!zp)
        return v;
    kiln_tensor *z = kiln_cast(zp, KILN_F64);
    if (kiln_tensor_numel(zp) != 1) {
        int r = kiln_tensor_ndim(x);
        if (per_axis < 0 || kiln_tensor_ndim(zp) != 1 || kiln_tensor_dim(zp, 0) != kiln_tensor_dim(x, per_axis)) {
            kiln__onnx_fail(n, "the zero point of %s must be a scalar%s", what,
                            per_axis < 0 ? "" : ", or one per output channel");
            return NULL;
        }
        int64_t shape[KILN_MAX_DIMS];
        for (int d = 0; d < r; d++)
            shape[d] = d == per_axis ? kiln_tensor_dim(x, d) : 1;
        z = kiln_reshape(z, r, shape);
    }
    return kiln_sub(v, z);
}

/* x_scale * w_scale / y_scale in float, w_scale scalar or one per channel along dim axis of a
 * rank-r output. */
static kiln_tensor *multiplier(kiln_tensor *xs, kiln_tensor *ws, kiln_tensor *ys, int r, int axis)
{
    kiln_tensor *w = kiln_cast(ws, KILN_F32);
    if (kiln_tensor_numel(ws) != 1) {
        int64_t shape[KILN_MAX_DIMS];
        for (int d = 0; d < r; d++)
            shape[d] = d == axis ? kiln_tensor_numel(ws) : 1;
        w = kiln_reshape(w, r, shape);
    } else {
        w = kiln_reshape(w, 0, NULL);
    }
    return kiln_div(kiln_mul(kiln_reshape(kiln_cast(xs, KILN_F32), 0, NULL), w),
                    kiln_reshape(kiln_cast(ys, KILN_F32), 0, NULL));
}

/* QLinearConv: the convolution of the centered integers, summed exactly in f64 by the Conv
 * operator itself (same attributes: pads, strides, dilations, group, auto_pad), plus the
 * int32 bias, requantized. */
static int op_qlinear_conv(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out)
{
    KILN__ONNX_NEED(8);
    kiln_tensor *x = centered(n, in[0], in[2], -1, "x"), *w = centered(n, in[3], in[5], 0, "w");
    if (!x || !w)
        return -1;
    if (kiln_tensor_numel(in[4]) != 1 && kiln_tensor_numel(in[4]) != kiln_tensor_dim(in[3], 0))
        return kiln__onnx_fail(n, "w_scale has %lld elements for %lld output channels",
                               (long long)kiln_tensor_numel(in[4]), (long long)kiln_tensor_dim(in[3], 0));
    kiln_tensor *conv_in[3] = {x, w, nin > 8 && in[8] ? kiln_cast(in[8], KILN_F64) : NULL}, *acc = NULL;
    kiln__onnx_op_fn conv = kiln__onnx_find_op("Conv");
    if (conv(n, conv_in[2] ? 3 : 2, conv_in, 1, &acc))
        return -1;
    out[0] = requantize(n, acc, multiplier(in[1], in[4], in[6], kiln_tensor_ndim(acc), 1), in[7]);
    return kiln__onnx_ok(out);
}

/* QLinearMatMul: the product of the centered integers, exact in f64, requantized; b's scale
 * and zero point may be per column. */
static int op_qlinear_matmul(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout,
                             kiln_tensor **out)
{
    KILN__ONNX_NEED(8);
    kiln_tensor *a = centered(n, in[0], in[2], -1, "a");
    int rb = kiln_tensor_ndim(in[3]);
    kiln_tensor *b = centered(n, in[3], in[5], rb - 1, "b");
    if (!a || !b)
        return -1;
    kiln_tensor *acc = kiln_matmul(a, b);
    if (!acc)
        return -1;
    if (kiln_tensor_numel(in[4]) != 1 && (rb < 1 || kiln_tensor_numel(in[4]) != kiln_tensor_dim(in[3], rb - 1)))
        return kiln__onnx_fail(n, "b_scale must be a scalar or one per column of b");
    out[0] = requantize(n, acc, multiplier(in[1], in[4], in[6], kiln_tensor_ndim(acc), kiln_tensor_ndim(acc) - 1),
                        in[7]);
    return kiln__onnx_ok(out);
}

const kiln__onnx_op kiln__onnx_ops_quant[] = {
    {"QuantizeLinear", op_quantize_linear},
    {"DequantizeLinear", op_dequantize_linear},
    {"DynamicQuantizeLinear", op_dynamic_quantize_linear},
    {"MatMulInteger", op_matmul_integer},
    {"QLinearConv", op_qlinear_conv},
    {"QLinearMatMul", op_qlinear_matmul},
    {NULL, NULL},
};
