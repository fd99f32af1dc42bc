/*
 * onnx-attr.c — small helpers the operator files share: attribute lookup with defaults,
 * reading small integer tensors (the shape, axes and pads inputs of newer opsets) into
 * host arrays, axis normalization, error messages that name the node, and the lookup of
 * an operator by its op type across the per-area tables.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error-impl.h"
#include "onnx-impl.h"
#include "tensor-impl.h"

const kiln__onnx_attr *kiln__onnx_attr_get(const kiln__onnx_node *n, const char *name) {
    for (int i = 0; i < n->nattrs; i++)
        if (!strcmp(n->attrs[i].name, name)) return &n->attrs[i];
    return NULL;
}

int64_t kiln__onnx_attr_int(const kiln__onnx_node *n, const char *name, int64_t dflt) {
    const kiln__onnx_attr *a = kiln__onnx_attr_get(n, name);
    return a ? a->i : dflt;
}

double kiln__onnx_attr_float(const kiln__onnx_node *n, const char *name, double dflt) {
    const kiln__onnx_attr *a = kiln__onnx_attr_get(n, name);
    return a ? a->f : dflt;
}

const char *kiln__onnx_attr_str(const kiln__onnx_node *n, const char *name, const char *dflt) {
    const kiln__onnx_attr *a = kiln__onnx_attr_get(n, name);
    return a && a->s ? a->s : dflt;
}

int kiln__onnx_attr_ints(const kiln__onnx_node *n, const char *name, int64_t *out, int max) {
    const kiln__onnx_attr *a = kiln__onnx_attr_get(n, name);
    if (!a) return -1;
    int k = a->nints < max ? a->nints : max;
    memcpy(out, a->ints, (size_t)k * sizeof *out);
    return a->nints > max ? max : k;
}

int kiln__onnx_fail(const kiln__onnx_node *n, const char *fmt, ...) {
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln__error_set("onnx: %s: %s", n->op_type, msg);
}

int kiln__onnx_read_ints(const kiln__onnx_node *n, kiln_tensor *t, int64_t *out, int max) {
    int64_t k = kiln_tensor_numel(t);
    if (k > max) return kiln__onnx_fail(n, "an integer input holds %lld values (at most %d)", (long long)k, max);
    kiln_tensor *c = kiln_tensor_dtype(t) == KILN_I64 ? kiln_tensor_retain(t) : kiln_cast(t, KILN_I64);
    if (!c) return -1;
    int rc = kiln_to_data(c, out, (size_t)k * sizeof *out);
    kiln_tensor_release(c);
    return rc < 0 ? -1 : (int)k;
}

bool kiln__onnx_small_host_ints(const kiln_tensor *t, const kiln_device *dev, int64_t max)
{
    return dev->caps.host_memory && !dev->caps.async && kiln__dev(t) == dev && t->dtype == KILN_I64 &&
           kiln_tensor_numel(t) <= max;
}

int kiln__onnx_read_scalar(const kiln__onnx_node *n, kiln_tensor *t, double *out) {
    if (kiln_tensor_numel(t) != 1) return kiln__onnx_fail(n, "expected a one-element input");
    *out = kiln_item(t);
    return 0;
}

int kiln__onnx_axis(const kiln__onnx_node *n, int64_t axis, int rank, int *out) {
    if (axis < -(int64_t)rank || axis >= rank) {
        if (!(rank == 0 && (axis == 0 || axis == -1)))
            return kiln__onnx_fail(n, "axis %lld out of range for rank %d", (long long)axis, rank);
        *out = 0;
        return 0;
    }
    *out = (int)(axis < 0 ? axis + rank : axis);
    return 0;
}

kiln__onnx_op_fn kiln__onnx_find_op(const char *op_type) {
    const kiln__onnx_op *tables[] = {kiln__onnx_ops_elementwise, kiln__onnx_ops_shape,  kiln__onnx_ops_nn,
                                     kiln__onnx_ops_rnn,         kiln__onnx_ops_index,  kiln__onnx_ops_more,
                                     kiln__onnx_ops_sample,      kiln__onnx_ops_quant,  kiln__onnx_ops_select,
                                     kiln__onnx_ops_roi,         kiln__onnx_ops_control};
    for (size_t t = 0; t < sizeof tables / sizeof *tables; t++)
        for (const kiln__onnx_op *o = tables[t]; o->op_type; o++)
            if (!strcmp(o->op_type, op_type)) return o->fn;
    return NULL;
}

kiln_tensor *kiln__onnx_ptensor_to_tensor(const kiln__onnx_ptensor *pt, kiln_device *dev) {
    return kiln_from_data(dev, (kiln_dtype)pt->kdtype, pt->ndim, pt->dims, pt->data, pt->nbytes);
}
