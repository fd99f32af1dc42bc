/*
 * engine/ops-names.c — printable names for the op enums of backends/backend.h.
 *
 * Error messages use these names, and so will the wire protocol and the fusion layer.
 * Each table is guarded by a static assert on its enum's COUNT, so adding an op breaks
 * the build here until its name is added.
 */
#include <string.h>

#include "tensor-impl.h"

static const char *const unary_names[] = {
    [KILN_UNARY_NEG] = "neg",
    [KILN_UNARY_ABS] = "abs",
    [KILN_UNARY_SIGN] = "sign",
    [KILN_UNARY_EXP] = "exp",
    [KILN_UNARY_LOG] = "log",
    [KILN_UNARY_LOG1P] = "log1p",
    [KILN_UNARY_EXPM1] = "expm1",
    [KILN_UNARY_SQRT] = "sqrt",
    [KILN_UNARY_RSQRT] = "rsqrt",
    [KILN_UNARY_SQUARE] = "square",
    [KILN_UNARY_RECIPROCAL] = "reciprocal",
    [KILN_UNARY_SIN] = "sin",
    [KILN_UNARY_COS] = "cos",
    [KILN_UNARY_TANH] = "tanh",
    [KILN_UNARY_SIGMOID] = "sigmoid",
    [KILN_UNARY_RELU] = "relu",
    [KILN_UNARY_LEAKY_RELU] = "leaky_relu",
    [KILN_UNARY_ELU] = "elu",
    [KILN_UNARY_GELU] = "gelu",
    [KILN_UNARY_GELU_TANH] = "gelu_tanh",
    [KILN_UNARY_SILU] = "silu",
    [KILN_UNARY_SOFTPLUS] = "softplus",
    [KILN_UNARY_ERF] = "erf",
    [KILN_UNARY_FLOOR] = "floor",
    [KILN_UNARY_CEIL] = "ceil",
    [KILN_UNARY_ROUND] = "round",
    [KILN_UNARY_CLAMP] = "clamp",
    [KILN_UNARY_POW_SCALAR] = "pow_scalar",
    [KILN_UNARY_ADD_SCALAR] = "add_scalar",
    [KILN_UNARY_MUL_SCALAR] = "mul_scalar",
    [KILN_UNARY_ISNAN] = "isnan",
    [KILN_UNARY_ISINF] = "isinf",
    [KILN_UNARY_LOGICAL_NOT] = "logical_not",
};
_Static_assert(KILN_UNARY_COUNT == 33, "add the new unary op to unary_names");
_Static_assert(sizeof unary_names / sizeof unary_names[0] == KILN_UNARY_COUNT, "unary_names size");

static const char *const binary_names[] = {
    [KILN_BINARY_ADD] = "add",
    [KILN_BINARY_SUB] = "sub",
    [KILN_BINARY_MUL] = "mul",
    [KILN_BINARY_DIV] = "div",
    [KILN_BINARY_REMAINDER] = "remainder",
    [KILN_BINARY_POW] = "pow",
    [KILN_BINARY_MAXIMUM] = "maximum",
    [KILN_BINARY_MINIMUM] = "minimum",
    [KILN_BINARY_EQ] = "eq",
    [KILN_BINARY_NE] = "ne",
    [KILN_BINARY_LT] = "lt",
    [KILN_BINARY_LE] = "le",
    [KILN_BINARY_GT] = "gt",
    [KILN_BINARY_GE] = "ge",
    [KILN_BINARY_LOGICAL_AND] = "logical_and",
    [KILN_BINARY_LOGICAL_OR] = "logical_or",
    [KILN_BINARY_LOGICAL_XOR] = "logical_xor",
};
_Static_assert(KILN_BINARY_COUNT == 17, "add the new binary op to binary_names");
_Static_assert(sizeof binary_names / sizeof binary_names[0] == KILN_BINARY_COUNT, "binary_names size");

static const char *const reduce_names[] = {
    [KILN_REDUCE_SUM] = "sum",
    [KILN_REDUCE_MEAN] = "mean",
    [KILN_REDUCE_PROD] = "prod",
    [KILN_REDUCE_MAX] = "max",
    [KILN_REDUCE_MIN] = "min",
    [KILN_REDUCE_VAR] = "var",
    [KILN_REDUCE_STD] = "std",
    [KILN_REDUCE_LOGSUMEXP] = "logsumexp",
    [KILN_REDUCE_NORM] = "norm",
    [KILN_REDUCE_ANY] = "any",
    [KILN_REDUCE_ALL] = "all",
};
_Static_assert(KILN_REDUCE_COUNT == 11, "add the new reduction to reduce_names");
_Static_assert(sizeof reduce_names / sizeof reduce_names[0] == KILN_REDUCE_COUNT, "reduce_names size");

static const char *const rng_names[] = {
    [KILN_RNG_UNIFORM] = "uniform",
    [KILN_RNG_NORMAL] = "normal",
    [KILN_RNG_BERNOULLI] = "bernoulli",
    [KILN_RNG_INT] = "int",
};
_Static_assert(KILN_RNG_COUNT == 4, "add the new distribution to rng_names");
_Static_assert(sizeof rng_names / sizeof rng_names[0] == KILN_RNG_COUNT, "rng_names size");

static const char *const pool_names[] = {
    [KILN_POOL_MAX] = "max_pool",
    [KILN_POOL_AVG] = "avg_pool",
};
_Static_assert(KILN_POOL_COUNT == 2, "add the new pooling kind to pool_names");
_Static_assert(sizeof pool_names / sizeof pool_names[0] == KILN_POOL_COUNT, "pool_names size");

const char *kiln__unary_name(kiln_unary_op op)
{
    return (unsigned)op < KILN_UNARY_COUNT ? unary_names[op] : "unary?";
}

const char *kiln__binary_name(kiln_binary_op op)
{
    return (unsigned)op < KILN_BINARY_COUNT ? binary_names[op] : "binary?";
}

const char *kiln__reduce_name(kiln_reduce_op op)
{
    return (unsigned)op < KILN_REDUCE_COUNT ? reduce_names[op] : "reduce?";
}

const char *kiln__rng_name(kiln_rng_kind k)
{
    return (unsigned)k < KILN_RNG_COUNT ? rng_names[k] : "rng?";
}

const char *kiln__pool_name(kiln_pool_kind k)
{
    return (unsigned)k < KILN_POOL_COUNT ? pool_names[k] : "pool?";
}

static const char *const entry_names[] = {
    [KILN_ENTRY_FILL] = "fill",
    [KILN_ENTRY_ARANGE] = "arange",
    [KILN_ENTRY_COPY] = "copy",
    [KILN_ENTRY_RNG] = "rng",
    [KILN_ENTRY_UNARY] = "unary",
    [KILN_ENTRY_BINARY] = "binary",
    [KILN_ENTRY_WHERE] = "where",
    [KILN_ENTRY_REDUCE] = "reduce",
    [KILN_ENTRY_ARG_REDUCE] = "arg_reduce",
    [KILN_ENTRY_CUMSUM] = "cumsum",
    [KILN_ENTRY_SORT] = "sort",
    [KILN_ENTRY_GATHER] = "gather",
    [KILN_ENTRY_SCATTER] = "scatter",
    [KILN_ENTRY_INDEX_SELECT] = "index_select",
    [KILN_ENTRY_INDEX_ADD] = "index_add",
    [KILN_ENTRY_MATMUL] = "matmul",
    [KILN_ENTRY_CONV] = "conv",
    [KILN_ENTRY_CONV_BACKWARD_INPUT] = "conv_backward_input",
    [KILN_ENTRY_CONV_BACKWARD_WEIGHT] = "conv_backward_weight",
    [KILN_ENTRY_CONV_FUSED] = "conv_fused",
    [KILN_ENTRY_CONV_PACK] = "conv_pack",
    [KILN_ENTRY_EPILOGUE] = "epilogue",
    [KILN_ENTRY_POOL] = "pool",
    [KILN_ENTRY_POOL_BACKWARD] = "pool_backward",
    [KILN_ENTRY_ADAPTIVE_AVG_POOL] = "adaptive_avg_pool",
    [KILN_ENTRY_ADAPTIVE_AVG_POOL_BACKWARD] = "adaptive_avg_pool_backward",
    [KILN_ENTRY_INTERPOLATE] = "interpolate",
    [KILN_ENTRY_INTERPOLATE_BACKWARD] = "interpolate_backward",
    [KILN_ENTRY_PAD] = "pad",
    [KILN_ENTRY_SOFTMAX] = "softmax",
    [KILN_ENTRY_LAYER_NORM] = "layer_norm",
    [KILN_ENTRY_ADAM_STEP] = "adam_step",
    [KILN_ENTRY_INDEX_CHECK] = "index_check",
    [KILN_ENTRY_RNN] = "rnn",
    [KILN_ENTRY_RNN_PACK] = "rnn_pack",
};
_Static_assert(KILN_ENTRY_COUNT == 35, "add the new entry to entry_names");
_Static_assert(sizeof entry_names / sizeof entry_names[0] == KILN_ENTRY_COUNT, "entry_names size");

const char *kiln__entry_name(kiln_entry e)
{
    return (unsigned)e < KILN_ENTRY_COUNT ? entry_names[e] : "?";
}

const char *kiln__entry_subop_name(kiln_entry e, int subop)
{
    if (subop < 0)
        return NULL;
    switch (e) {
    case KILN_ENTRY_UNARY: return subop < KILN_UNARY_COUNT ? kiln__unary_name((kiln_unary_op)subop) : NULL;
    case KILN_ENTRY_BINARY: return subop < KILN_BINARY_COUNT ? kiln__binary_name((kiln_binary_op)subop) : NULL;
    case KILN_ENTRY_REDUCE: return subop < KILN_REDUCE_COUNT ? kiln__reduce_name((kiln_reduce_op)subop) : NULL;
    case KILN_ENTRY_RNG: return subop < KILN_RNG_COUNT ? kiln__rng_name((kiln_rng_kind)subop) : NULL;
    case KILN_ENTRY_POOL:
    case KILN_ENTRY_POOL_BACKWARD: return subop < KILN_POOL_COUNT ? kiln__pool_name((kiln_pool_kind)subop) : NULL;
    case KILN_ENTRY_RNN: return subop == KILN_RNN_LSTM ? "lstm" : subop == KILN_RNN_GRU ? "gru" : NULL;
    default: return NULL;
    }
}

/* kiln_device_counters_get's entry lookup */
int kiln__entry_by_name(const char *name)
{
    for (int i = 0; name && i < KILN_ENTRY_COUNT; i++)
        if (!strcmp(entry_names[i], name))
            return i;
    return -1;
}
