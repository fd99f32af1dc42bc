/*
 * onnx-ops-quant.c — ONNX's linear quantization: QuantizeLinear and DequantizeLinear, which
 * make up the QDQ format (ONNX Runtime's quantize_static writes it by default: int8 weights
 * stored with a DequantizeLinear each, activations passed through a QuantizeLinear and a
 * DequantizeLinear pair), per tensor, per axis and (opset 21) per block.
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

#define NEED(k)                                                                                                   \
    do {                                                                                                          \
        if (nin < (k) || !in[(k)-1])                                                                              \
            return kiln__onnx_fail(n, "needs %d inputs", (k));                                                    \
    } while (0)

static int ok(kiln_tensor **out)
{
    return out[0] ? 0 : -1;
}

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
static bool quant_range(int onnx_type, double *lo, double *hi, const char **name)
{
    switch (onnx_type) {
    case KILN__ONNX_UINT8: *lo = 0, *hi = 255, *name = "uint8"; return true;
    case KILN__ONNX_INT8: *lo = -128, *hi = 127, *name = "int8"; return true;
    case KILN__ONNX_UINT16: *lo = 0, *hi = 65535, *name = "uint16"; return true;
    case KILN__ONNX_INT16: *lo = -32768, *hi = 32767, *name = "int16"; return true;
    default: return false;
    }
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
    NEED(2);
    kiln_tensor *x = in[0], *scale = in[1], *zp = nin > 2 ? in[2] : NULL;
    if (!kiln_dtype_is_float(kiln_tensor_dtype(x)) && kiln_tensor_dtype(x) != KILN_I32)
        return kiln__onnx_fail(n, "x must be float or int32, not %s", kiln_dtype_name(kiln_tensor_dtype(x)));
    int qtype = zp ? n->quant_type
                   : (int)(n->opset >= 21 ? kiln__onnx_attr_int(n, "output_dtype", KILN__ONNX_UINT8)
                                          : KILN__ONNX_UINT8);
    if (!qtype && zp) /* a zero point made by another node: only its kiln dtype is known */
        qtype = kiln_tensor_dtype(zp) == KILN_U8 ? KILN__ONNX_UINT8 : 0;
    double lo, hi;
    const char *tname;
    if (!quant_range(qtype, &lo, &hi, &tname))
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
    return ok(out);
}

/* y = (x - zero_point) * scale, the difference taken exactly in integers, in the scale's type. */
static int op_dequantize_linear(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout,
                                kiln_tensor **out)
{
    NEED(2);
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
    return ok(out);
}

const kiln__onnx_op kiln__onnx_ops_quant[] = {
    {"QuantizeLinear", op_quantize_linear},
    {"DequantizeLinear", op_dequantize_linear},
    {NULL, NULL},
};
