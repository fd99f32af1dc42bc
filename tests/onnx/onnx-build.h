/*
 * tests/onnx/onnx-build.h — small ONNX graphs built byte by byte for a test (with the
 * protobuf writer of onnx-pb.h): graph inputs with fixed, symbolic or unknown dims,
 * initializers, nodes with int, float and string attributes, and the ModelProto around them.
 */
#ifndef KILN_TESTS_ONNX_BUILD_H
#define KILN_TESTS_ONNX_BUILD_H

#include "onnx-pb.h"

/* ONNX TensorProto data types */
enum {
    OB_FLOAT = 1,
    OB_INT64 = 7
};

/* A graph input (ValueInfoProto). dims: a size, or -1 for a symbolic dim (named by sym, one
 * name for all) or -2 for a dim with neither value nor name; ndim -1: no shape at all. */
static inline void ob_input(pb *g, const char *name, int type, int ndim, const int64_t *dims, const char *sym)
{
    pb shape = {.n = 0}, tt = {.n = 0}, ty = {.n = 0}, vi = {.n = 0};
    for (int i = 0; i < ndim; i++) {
        pb d = {.n = 0};
        if (dims[i] >= 0)
            pb_int(&d, 1, (uint64_t)dims[i]);
        else if (dims[i] == -1)
            pb_str(&d, 2, sym ? sym : "n");
        pb_msg(&shape, 1, &d);
    }
    pb_int(&tt, 1, (uint64_t)type);
    if (ndim >= 0)
        pb_msg(&tt, 2, &shape);
    pb_msg(&ty, 1, &tt);
    pb_str(&vi, 1, name);
    pb_msg(&vi, 2, &ty);
    pb_msg(g, 11, &vi);
}

/* An initializer: TensorProto with raw data. */
static inline void ob_init(pb *g, const char *name, int type, int ndim, const int64_t *dims, const void *data,
                           size_t n)
{
    pb t = {.n = 0};
    for (int i = 0; i < ndim; i++)
        pb_int(&t, 1, (uint64_t)dims[i]);
    pb_int(&t, 2, (uint64_t)type);
    pb_str(&t, 8, name);
    pb_bytes(&t, 9, data, n);
    pb_msg(g, 5, &t);
}

static inline void ob_output(pb *g, const char *name)
{
    pb o = {.n = 0};
    pb_str(&o, 1, name);
    pb_msg(g, 12, &o);
}

static inline void ob_attr_int(pb *attrs, const char *name, int64_t v)
{
    pb a = {.n = 0};
    pb_str(&a, 1, name);
    pb_int(&a, 20, 2);
    pb_int(&a, 3, (uint64_t)v);
    pb_msg(attrs, 5, &a);
}

static inline void ob_attr_float(pb *attrs, const char *name, float v)
{
    pb a = {.n = 0};
    pb_str(&a, 1, name);
    pb_int(&a, 20, 1);
    pb_f32(&a, 2, v);
    pb_msg(attrs, 5, &a);
}

static inline void ob_attr_str(pb *attrs, const char *name, const char *v)
{
    pb a = {.n = 0};
    pb_str(&a, 1, name);
    pb_int(&a, 20, 3);
    pb_str(&a, 4, v);
    pb_msg(attrs, 5, &a);
}

/* ins and outs NULL-ended; "" is an absent input. attrs: attribute fields or NULL. */
static inline void ob_node(pb *g, const char *op, const char *name, const char *const *ins,
                           const char *const *outs, const pb *attrs)
{
    pb n = {.n = 0};
    for (int i = 0; ins[i]; i++)
        pb_str(&n, 1, ins[i]);
    for (int i = 0; outs[i]; i++)
        pb_str(&n, 2, outs[i]);
    pb_str(&n, 3, name);
    pb_str(&n, 4, op);
    if (attrs) {
        memcpy(n.b + n.n, attrs->b, attrs->n);
        n.n += attrs->n;
    }
    pb_msg(g, 1, &n);
}

/* The ModelProto of graph g at opset (ir_version 8) into model. */
static inline void ob_model(pb *model, const pb *g, int opset)
{
    pb ops = {.n = 0};
    model->n = 0;
    pb_int(model, 1, 8);
    pb_int(&ops, 2, (uint64_t)opset);
    pb_msg(model, 8, &ops);
    pb_msg(model, 7, g);
}

#endif /* KILN_TESTS_ONNX_BUILD_H */
