/*
 * onnx-inplace.c — the executor's in-place path for activations and elementwise
 * arithmetic, when the tensor they read dies at them.
 *
 * A Relu after a Conv, the HardSwish after a depthwise convolution, the bias Add after a
 * MatMul, the residual Add of a ResNet block: each reads a value nobody reads again. Run
 * as engine ops they allocate a fresh output and (HardSwish, HardSigmoid) take up to four
 * passes and four allocations through the backend's dispatch. Here the executor writes the
 * result over its dying input instead, with no allocation: activations in one pass on the
 * host, arithmetic through one call of the device's binary op with the dying input as its
 * output. The activation becomes the producer's epilogue in all but name, and the buffer
 * is handed on to the next op.
 *
 * Only when it is safe: an f32 contiguous tensor in host memory that the executor holds
 * the only reference to (not a constant, not a graph input, no view sharing its storage,
 * not saved by an autodiff tape, which would hold a reference) and that does not require
 * grad. Anything else runs the node's regular operator.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/autodiff.h"
#include "onnx-impl.h"
#include "tensor-impl.h"

int kiln__onnx_inplace_kind(const char *op_type) {
    static const char *const names[] = {
        [KILN__ONNX_IP_RELU] = "Relu",       [KILN__ONNX_IP_LEAKY_RELU] = "LeakyRelu",
        [KILN__ONNX_IP_HARD_SIGMOID] = "HardSigmoid", [KILN__ONNX_IP_HARD_SWISH] = "HardSwish",
        [KILN__ONNX_IP_CLIP] = "Clip",       [KILN__ONNX_IP_SIGMOID] = "Sigmoid",
        [KILN__ONNX_IP_ADD] = "Add",         [KILN__ONNX_IP_SUB] = "Sub",
        [KILN__ONNX_IP_MUL] = "Mul",         [KILN__ONNX_IP_DIV] = "Div",
    };
    for (int i = 1; i < (int)(sizeof names / sizeof *names); i++)
        if (names[i] && !strcmp(names[i], op_type)) return i;
    return KILN__ONNX_IP_NONE;
}

/* Host address of t's first element, or NULL when its device has no host memory. */
static float *host_f32(const kiln_tensor *t) {
    const kiln_device *dev = kiln__dev(t);
    if (!dev->caps.host_memory || !dev->be->buffer_host_ptr || t->dtype != KILN_F32) return NULL;
    char *p = dev->be->buffer_host_ptr(kiln__qctx(dev), t->storage->buf);
    return p ? (float *)(void *)p + t->offset : NULL;
}

static bool contiguous(const kiln_tensor *t) {
    int64_t want = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->strides[d] != want) return false;
        want *= t->shape[d];
    }
    return true;
}

/* The executor may overwrite t: it holds the only reference, to the only view. */
static bool writable(const kiln_tensor *t) {
    return atomic_load(&t->refcount) == 1 && atomic_load(&t->scope_refs) == 0 &&
           atomic_load(&t->storage->refcount) == 1 && !t->requires_grad && !t->autograd && contiguous(t) &&
           host_f32(t);
}

static bool needs_grad(const kiln_tensor *t) {
    return kiln_grad_enabled() && (t->requires_grad || t->autograd);
}

static void unary(int kind, float *x, int64_t n, float a, float b) {
    switch (kind) {
    case KILN__ONNX_IP_RELU:
        for (int64_t i = 0; i < n; i++) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
        break;
    case KILN__ONNX_IP_LEAKY_RELU:
        for (int64_t i = 0; i < n; i++) x[i] = x[i] >= 0.0f ? x[i] : x[i] * a;
        break;
    case KILN__ONNX_IP_HARD_SIGMOID:
        for (int64_t i = 0; i < n; i++) x[i] = fminf(fmaxf(x[i] * a + b, 0.0f), 1.0f);
        break;
    case KILN__ONNX_IP_HARD_SWISH:
        for (int64_t i = 0; i < n; i++) x[i] = x[i] * fminf(fmaxf(x[i] * (1.0f / 6.0f) + 0.5f, 0.0f), 1.0f);
        break;
    case KILN__ONNX_IP_CLIP:
        for (int64_t i = 0; i < n; i++) x[i] = x[i] < a ? a : x[i] > b ? b : x[i];   /* NaN stays NaN */
        break;
    case KILN__ONNX_IP_SIGMOID:
        for (int64_t i = 0; i < n; i++) x[i] = 1.0f / (1.0f + expf(-x[i]));
        break;
    default:
        break;
    }
}

/* t (writable, the full output shape) = t op other, or other op t when t is on the right;
 * other broadcasts into t's shape through its strides. The device's own binary op does
 * the work with t as both an operand and the output (backend.h allows exactly that
 * overlap), so the update is vectorized and split over the device's threads: the host
 * loop this replaced ran a squeeze-excitation block's channel scale on the executor's
 * thread alone, reading a map the other cores had just written. */
static int binary(int kind, kiln_tensor *t, bool t_left, kiln_tensor *other) {
    static const kiln_binary_op ops[] = {
        [KILN__ONNX_IP_ADD] = KILN_BINARY_ADD, [KILN__ONNX_IP_SUB] = KILN_BINARY_SUB,
        [KILN__ONNX_IP_MUL] = KILN_BINARY_MUL, [KILN__ONNX_IP_DIV] = KILN_BINARY_DIV,
    };
    const kiln_backend_iface *be = kiln__be(t);
    if (kiln__dev(other) != kiln__dev(t) || !be->binary) return 0;
    kiln_tdesc td, od;
    kiln__desc(t, &td);
    kiln__bcast_desc(other, t->ndim, t->shape, &od);
    if (kiln__numel(t) == 0) return 1;
    int rc = t_left ? be->binary(kiln__ctx(t), ops[kind], &td, &td, &od)
                    : be->binary(kiln__ctx(t), ops[kind], &td, &od, &td);
    return rc < 0 ? -1 : 1;
}

int kiln__onnx_inplace(const kiln__onnx_node *n, int kind, int nin, kiln_tensor *const *in, const bool *dies,
                       int *consumed) {
    if (kind == KILN__ONNX_IP_NONE || nin < 1 || !in[0]) return 0;
    if (kind >= KILN__ONNX_IP_ADD) {
        if (nin != 2 || !in[1] || in[0]->dtype != KILN_F32 || in[1]->dtype != KILN_F32) return 0;
        if (needs_grad(in[0]) || needs_grad(in[1]) || in[0]->storage == in[1]->storage) return 0;
        for (int side = 0; side < 2; side++) {
            kiln_tensor *t = in[side], *o = in[1 - side];
            if (!dies[side] || !writable(t) || o->ndim > t->ndim) continue;
            bool full = true;   /* t has the broadcast shape: o fits into it */
            for (int dd = 0; dd < o->ndim; dd++) {
                int64_t od = o->shape[o->ndim - 1 - dd], td = t->shape[t->ndim - 1 - dd];
                full = full && (od == td || od == 1);
            }
            if (!full) continue;
            int rc = binary(kind, t, side == 0, o);
            if (rc < 0) return -1;
            if (rc) {
                *consumed = side;
                return 1;
            }
        }
        return 0;
    }
    kiln_tensor *t = in[0];
    if (!dies[0] || !writable(t) || needs_grad(t)) return 0;
    float a = 0, b = 0;
    if (kind == KILN__ONNX_IP_LEAKY_RELU) a = (float)kiln__onnx_attr_float(n, "alpha", 0.01);
    if (kind == KILN__ONNX_IP_HARD_SIGMOID) {
        a = (float)kiln__onnx_attr_float(n, "alpha", 0.2);
        b = (float)kiln__onnx_attr_float(n, "beta", 0.5);
    }
    if (kind == KILN__ONNX_IP_CLIP) {
        double lo = -INFINITY, hi = INFINITY;
        if (n->opset < 11) {
            lo = kiln__onnx_attr_float(n, "min", -INFINITY);
            hi = kiln__onnx_attr_float(n, "max", INFINITY);
        } else {
            if (nin > 1 && in[1] && kiln__onnx_read_scalar(n, in[1], &lo)) return -1;
            if (nin > 2 && in[2] && kiln__onnx_read_scalar(n, in[2], &hi)) return -1;
        }
        if (lo > hi) return 0;   /* the operator reports it, as kiln_clamp does */
        a = (float)lo;
        b = (float)hi;
    }
    unary(kind, host_f32(t), kiln__numel(t), a, b);
    *consumed = 0;
    return 1;
}
