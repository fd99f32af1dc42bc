/*
 * tests/conformance/cases-errors.c — bad input to the front end: each case must return
 * NULL (or a negative count) with a message that names the op, on every device.
 */
#include <string.h>

#include "conformance.h"

static int fail_if_null(kiln_tensor *t, kiln_tensor **out)
{
    out[0] = t;
    return t ? 1 : -1;
}

static int b_err(const conf_case *c, kiln_device *dev, kiln_tensor **in, kiln_tensor **out)
{
    kiln_tensor *x = in[0];
    switch (c->p[0]) {
    case 0: return fail_if_null(kiln_add(in[0], in[1]), out);
    case 1: return fail_if_null(kiln_mul(in[0], in[1]), out);
    case 2: return fail_if_null(kiln_sum(x, KILN_DIMS(3), false), out);
    case 3: return fail_if_null(kiln_softmax(x, 5), out);
    case 4: return fail_if_null(kiln_transpose(x, 0, -4), out);
    case 5: return fail_if_null(kiln_gather(in[0], 0, in[1]), out);
    case 6: return fail_if_null(kiln_index_select(in[0], 0, in[1]), out);
    case 7: return fail_if_null(kiln_embedding(in[0], in[1]), out);
    case 8: { /* operands on two devices */
        kiln_device *o = conf_other_device(dev);
        if (!o) /* only one device here: nothing to mix; fake the expected failure */
            return fail_if_null(kiln_add(x, kiln_zeros(dev, KILN_F32, KILN_SHAPE(9))), out);
        return fail_if_null(kiln_add(x, kiln_zeros(o, KILN_F32, KILN_SHAPE(3, 4))), out);
    }
    case 9: return fail_if_null(kiln_matmul(in[0], in[1]), out);
    case 10: return fail_if_null(kiln_conv2d(in[0], in[1], NULL, NULL), out);
    case 11: return fail_if_null(kiln_reshape(x, KILN_SHAPE(5, 5)), out);
    case 12: {
        kiln_tensor *ts[2] = {in[0], in[1]};
        return fail_if_null(kiln_cat(ts, 2, 0), out);
    }
    case 13: {
        float host[5] = {0};
        return fail_if_null(kiln_from_data(dev, KILN_F32, KILN_SHAPE(2, 3), host, sizeof host), out);
    }
    case 14: { /* a NULL operand propagates without replacing the first cause */
        kiln_tensor *bad = kiln_add(in[0], in[1]);
        return fail_if_null(kiln_softmax(kiln_relu(bad), -1), out);
    }
    case 15: return fail_if_null(kiln_gather(in[0], 0, in[1]), out);  /* index out of range */
    case 16: return fail_if_null(kiln_one_hot(in[0], 3, KILN_I64), out);
    case 17: return fail_if_null(kiln_max(x, KILN_DIMS(0), false), out); /* empty reduction */
    case 18: {
        kiln_tensor *parts[4];
        int n = kiln_split(x, 0, 0, parts, 4);
        return n < 0 ? -1 : 0;
    }
    case 19: return fail_if_null(kiln_layer_norm(in[0], 1, in[1], NULL, 1e-5), out);
    case 20: return fail_if_null(kiln_expand(x, KILN_SHAPE(3, 5)), out);
    case 21: return fail_if_null(kiln_permute(x, KILN_DIMS(0, 0)), out);
    case 22: /* unary ops with no meaning on bool: refused on every device alike */
        switch (c->p[1]) {
        case 0: return fail_if_null(kiln_abs(x), out);
        case 1: return fail_if_null(kiln_relu(x), out);
        case 2: return fail_if_null(kiln_floor(x), out);
        case 3: return fail_if_null(kiln_ceil(x), out);
        case 4: return fail_if_null(kiln_round(x), out);
        case 5: return fail_if_null(kiln_clamp(x, 0, 1), out);
        case 6: return fail_if_null(kiln_clamp(x, -0.5, 0.5), out);
        default: return fail_if_null(kiln_neg(x), out);
        }
    case 23: return fail_if_null(c->p[1] ? kiln_pow(in[0], in[1]) : kiln_remainder(in[0], in[1]), out);
    }
    return -1;
}

static void err_case(int kind, const char *expect, const char *what, int nin, const conf_input *ins)
{
    conf_case c = conf_make("bad_input", KILN_F32, b_err);
    c.p[0] = kind;
    c.expect_error = expect;
    for (int i = 0; i < nin; i++)
        c.in[c.nin++] = ins[i];
    conf_label(&c, "%s (message must name \"%s\")", what, expect);
    conf_add(&c);
}

#define F32(...) {.dt = KILN_F32, SHAPE(__VA_ARGS__), .gen = G_UNI, .lo = -1, .hi = 1}
#define BOOL(...)                                                                                                 \
    {                                                                                                             \
        .dt = KILN_BOOL, SHAPE(__VA_ARGS__), .gen = G_BOOL, .lo = 0, .hi = 1                                      \
    }
#define I64(n, ...) {.dt = KILN_I64, SHAPE(__VA_ARGS__), .gen = G_INT, .lo = 0, .hi = n}

void conf_cases_errors(void)
{
    err_case(0, "add", "broadcast mismatch [2, 3] + [4]", 2, (conf_input[]){F32(2, 3), F32(4)});
    err_case(1, "mul", "broadcast mismatch [5, 7] * [6, 7]", 2, (conf_input[]){F32(5, 7), F32(6, 7)});
    err_case(2, "sum", "dim 3 of a 2-D tensor", 1, (conf_input[]){F32(3, 4)});
    err_case(3, "softmax", "dim 5 of a 2-D tensor", 1, (conf_input[]){F32(3, 4)});
    err_case(4, "transpose", "dim -4 of a 3-D tensor", 1, (conf_input[]){F32(2, 3, 4)});
    err_case(5, "gather", "f32 index", 2, (conf_input[]){F32(4, 5), F32(2, 5)});
    err_case(6, "index_select", "f32 index", 2, (conf_input[]){F32(4, 5), F32(3)});
    err_case(7, "embedding", "f32 indices", 2, (conf_input[]){F32(10, 4), F32(3)});
    err_case(8, "add", "operands on different devices", 1, (conf_input[]){F32(3, 4)});
    err_case(9, "matmul", "inner dims 4 vs 5", 2, (conf_input[]){F32(3, 4), F32(5, 6)});
    err_case(10, "conv2d", "3 input channels, weight wants 2", 2,
             (conf_input[]){F32(1, 3, 8, 8), F32(4, 2, 3, 3)});
    err_case(11, "reshape", "12 elements into [5, 5]", 1, (conf_input[]){F32(3, 4)});
    err_case(12, "cat", "[2, 3] with [2, 4] along dim 0", 2, (conf_input[]){F32(2, 3), F32(2, 4)});
    err_case(13, "from_data", "a host buffer shorter than the shape", 0, NULL);
    err_case(14, "add", "NULL through relu and softmax keeps the first cause", 2,
             (conf_input[]){F32(2, 3), F32(4)});
    err_case(15, "gather", "index 9 out of range for size 4", 2, (conf_input[]){F32(4, 5), I64(10, 2, 5)});
    {
        conf_input idx[] = {I64(0, 6)};
        idx[0].gen = G_INT;
        idx[0].lo = 3;
        idx[0].hi = 6;
        err_case(16, "one_hot", "class 3..5 with 3 classes", 1, idx);
    }
    err_case(17, "max", "max over an empty dim", 1, (conf_input[]){F32(0, 4)});
    err_case(18, "split", "split size 0", 1, (conf_input[]){F32(4, 4)});
    err_case(19, "layer_norm", "weight of the wrong length", 2, (conf_input[]){F32(3, 8), F32(7)});
    err_case(20, "expand", "[4, 5] to [3, 5]", 1, (conf_input[]){F32(4, 5)});
    err_case(21, "permute", "repeated dim", 1, (conf_input[]){F32(4, 5)});
    static const char *const bool_unary[] = {"abs", "relu", "floor", "ceil", "round", "clamp", "clamp", "neg"};
    for (int k = 0; k < 8; k++) {
        conf_case c = conf_make("bad_input", KILN_BOOL, b_err);
        c.p[0] = 22;
        c.p[1] = k;
        c.expect_error = bool_unary[k];
        c.in[c.nin++] = (conf_input)BOOL(5, 7);
        conf_label(&c, "%s%s of a bool tensor (message must name \"%s\")", bool_unary[k],
                   k == 6 ? " (-0.5, 0.5)" : "", bool_unary[k]);
        conf_add(&c);
    }
    for (int k = 0; k < 2; k++) {
        const char *name = k ? "pow" : "remainder";
        conf_case c = conf_make("bad_input", KILN_BOOL, b_err);
        c.p[0] = 23;
        c.p[1] = k;
        c.expect_error = name;
        c.in[c.nin++] = (conf_input)BOOL(5, 7);
        c.in[c.nin++] = (conf_input)BOOL(7);
        conf_label(&c, "%s of bool tensors (message must name \"%s\")", name, name);
        conf_add(&c);
    }
}
