/*
 * onnx-impl.h — what the ONNX loader's files share: the decoded protobuf messages
 * (plain structs owning their memory), the planned model, and the operator table.
 *
 * The decoder (onnx-proto.c) turns bytes into kiln__onnx_pmodel and never touches a
 * device; the loader (onnx-model.c) turns that into a kiln_onnx_model with tensors,
 * a node order and liveness (onnx-model-impl.h); the executor (onnx-run.c, with
 * onnx-inplace.c and the activation arena of onnx-arena.c) walks it; the onnx-ops-*.c
 * files map each ONNX operator onto kiln tensor ops.
 */
#ifndef KILN_ONNX_IMPL_H
#define KILN_ONNX_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/onnx.h"
#include "kiln/tensor.h"

/* ONNX TensorProto.DataType values (onnx.proto). */
enum {
    KILN__ONNX_FLOAT = 1, KILN__ONNX_UINT8 = 2, KILN__ONNX_INT8 = 3, KILN__ONNX_UINT16 = 4,
    KILN__ONNX_INT16 = 5, KILN__ONNX_INT32 = 6, KILN__ONNX_INT64 = 7, KILN__ONNX_STRING = 8,
    KILN__ONNX_BOOL = 9, KILN__ONNX_FLOAT16 = 10, KILN__ONNX_DOUBLE = 11, KILN__ONNX_UINT32 = 12,
    KILN__ONNX_UINT64 = 13, KILN__ONNX_BFLOAT16 = 16,
};

/* AttributeProto.AttributeType values. */
enum {
    KILN__ONNX_ATTR_FLOAT = 1, KILN__ONNX_ATTR_INT = 2, KILN__ONNX_ATTR_STRING = 3,
    KILN__ONNX_ATTR_TENSOR = 4, KILN__ONNX_ATTR_GRAPH = 5, KILN__ONNX_ATTR_FLOATS = 6,
    KILN__ONNX_ATTR_INTS = 7, KILN__ONNX_ATTR_STRINGS = 8,
};

/* A decoded TensorProto: data already converted to the kiln dtype, row-major. */
typedef struct kiln__onnx_ptensor {
    char *name;
    int onnx_type;
    int kdtype;              /* kiln_dtype, or -1 when ONNX's type has no kiln form */
    int ndim;
    int64_t dims[KILN_MAX_DIMS];
    int64_t numel;
    void *data;              /* numel * kiln dtype size bytes; NULL when external */
    size_t nbytes;
    bool external;
    char *ext_location;
    int64_t ext_offset, ext_length; /* length -1: to the end of the tensor's bytes */
} kiln__onnx_ptensor;

struct kiln__onnx_pmodel;

typedef struct kiln__onnx_attr {
    char *name;
    int type;
    double f;
    int64_t i;
    char *s;                 /* NUL-terminated copy of the bytes */
    size_t slen;
    kiln__onnx_ptensor *t;
    int nfloats, nints, nstrings;
    double *floats;
    int64_t *ints;
    char **strings;
    struct kiln__onnx_pmodel *g; /* a GRAPH attribute (an If's branches); NULL otherwise */
} kiln__onnx_attr;

typedef struct kiln__onnx_pnode {
    char *name, *op_type, *domain;
    int ninputs, noutputs, nattrs;
    char **inputs, **outputs;
    kiln__onnx_attr *attrs;
} kiln__onnx_pnode;

typedef struct kiln__onnx_pvalue {
    char *name;
    int elem_type;           /* ONNX type; 0 when not given */
    int ndim;                /* -1 when the shape is not given */
    int64_t dims[KILN_MAX_DIMS]; /* -1 for symbolic/unknown */
} kiln__onnx_pvalue;

/* A decoded ModelProto, or a GraphProto held by a GRAPH attribute: a branch of an If takes
 * its parent's opset, and its inputs are the names it reads from enclosing graphs
 * (kiln__onnx_scope_branches). */
typedef struct kiln__onnx_pmodel {
    int64_t ir_version;
    int64_t opset;           /* default domain; 0 when absent */
    int nnodes, ninits, ninputs, noutputs;
    /* A Loop body: the inputs it declares (iteration number, condition, loop-carried values),
     * before the names it reads from enclosing graphs; 0 for the main graph and an If branch. */
    int ndeclared;
    kiln__onnx_pnode *nodes;
    kiln__onnx_ptensor *inits;
    kiln__onnx_pvalue *inputs, *outputs;
} kiln__onnx_pmodel;

/* Decode a ModelProto; returns NULL plus a message on malformed input. */
kiln__onnx_pmodel *kiln__onnx_decode(const uint8_t *buf, size_t len);
/* The same, for bytes in a private anonymous mapping the caller owns: the pages of each
 * tensor's raw_data are given back to the system (they read as zeros after) once the tensor
 * is decoded, so a model's bytes and its tensors are not resident together. On failure only
 * the first bytes are read again (to say what the file is). */
kiln__onnx_pmodel *kiln__onnx_decode_consuming(uint8_t *buf, size_t len);
void kiln__onnx_pmodel_free(kiln__onnx_pmodel *pm);
void kiln__onnx_ptensor_clear(kiln__onnx_ptensor *t);
/* Gives every If branch and Loop body of pm (at any depth) as inputs the names it reads from
 * enclosing graphs (after a body's declared inputs), and appends those names to its node's
 * inputs, after the condition (a Loop's: after its loop-carried values): a value a
 * branch reads is then an input of the If node to every pass that plans the graph (order,
 * liveness, the arena, in-place updates, common subexpressions). Refuses, naming the node
 * and the branch, an If without its two graphs, with other inputs than a condition, with a
 * branch that declares inputs or reads a name no enclosing graph defines, and a Loop without
 * a body, with a body declaring other inputs than its node's, or with neither a trip count
 * nor a condition. 0, or -1 with a message (onnx-ops-control.c). */
int kiln__onnx_scope_branches(kiln__onnx_pmodel *pm);

/* ----------------------------------------------------------------- operators */

/* What an operator sees of its node. */
typedef struct kiln__onnx_node {
    const char *name, *op_type;
    int64_t opset;
    int nattrs;
    const kiln__onnx_attr *attrs;
    kiln_device *dev;
    /* What the load-time fusion pass folded into this node (onnx-model.c): an
     * activation (a kiln_epilogue_act, with its alpha and beta) applied to the result,
     * and the positions in the node's inputs of a residual to add before it and of a
     * bias over the last dim (MatMul); -1 when absent. Those operands come after the
     * node's own inputs: the operator's nin counts only its own, so an optional input
     * it lacks (a Conv's bias) stays absent, and it reads these at their positions. */
    int fuse_act;
    double fuse_alpha, fuse_beta;
    int fuse_residual, fuse_bias;
    /* Gather and GatherElements: the index is a constant with no negative value (onnx-cse.c
     * checks at load), so it needs no wrapping of negatives: five ops less a node (a zeros
     * fill, a compare, an add and a where on the device), on every run. */
    bool index_nonneg;
    /* Gather: the constant index is a single non-negative value (0-d), kept here: the
     * result is then a view (narrow and squeeze), no op at all; torch's exporter picks each
     * attention layer's q, k and v from the packed projection so */
    bool has_index_scalar;
    int64_t index_scalar;
    /* QuantizeLinear, QLinearConv, QLinearMatMul: the ONNX type of the output's zero point,
     * which sets the output's type and range (kiln holds int8, int16 and uint16 alike as
     * i32); 0 when unknown or absent. */
    int quant_type;
    /* A Conv's pre-packed weight, or an LSTM's or GRU's W and R, made at its first run
     * without grad (onnx-ops-nn.c, onnx-ops-rnn.c) and dropped by kiln_onnx_set_trainable;
     * NULL for other nodes. */
    struct kiln__onnx_pack *pack;
    /* An If or a Loop: its branches or body, planned at load as models of their own
     * (onnx-ops-control.c); NULL for other nodes. */
    struct kiln__onnx_if *ctl;
} kiln__onnx_node;

typedef struct kiln__onnx_pack {
    kiln_tensor *t;          /* owned; NULL when not made (yet) */
    bool tried;              /* made, or found not to be worth making */
    const void *storage;     /* the weight's storage and its write version when made: */
    unsigned version;        /* an optimizer step or copy into the weight makes it stale */
    const void *storage2;    /* the same for a second weight (R of a recurrent layer) */
    unsigned version2;
} kiln__onnx_pack;

/*
 * An operator: in[i] is NULL for an absent optional input; writes nout new references
 * (absent outputs may be left NULL). Returns 0, or -1 with a message set.
 */
typedef int (*kiln__onnx_op_fn)(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout,
                                kiln_tensor **out);

typedef struct kiln__onnx_op {
    const char *op_type;
    kiln__onnx_op_fn fn;
} kiln__onnx_op;

/* Each operator file exports its table, terminated by {NULL, NULL}. */
extern const kiln__onnx_op kiln__onnx_ops_elementwise[];
extern const kiln__onnx_op kiln__onnx_ops_shape[];
extern const kiln__onnx_op kiln__onnx_ops_nn[];
extern const kiln__onnx_op kiln__onnx_ops_rnn[];
extern const kiln__onnx_op kiln__onnx_ops_index[];
extern const kiln__onnx_op kiln__onnx_ops_more[];
extern const kiln__onnx_op kiln__onnx_ops_sample[];
extern const kiln__onnx_op kiln__onnx_ops_quant[];
extern const kiln__onnx_op kiln__onnx_ops_select[];
extern const kiln__onnx_op kiln__onnx_ops_roi[];
extern const kiln__onnx_op kiln__onnx_ops_control[];

kiln__onnx_op_fn kiln__onnx_find_op(const char *op_type);

/* The executor's in-place path (onnx-inplace.c). */
enum {
    KILN__ONNX_IP_NONE = 0, KILN__ONNX_IP_RELU, KILN__ONNX_IP_LEAKY_RELU, KILN__ONNX_IP_HARD_SIGMOID,
    KILN__ONNX_IP_HARD_SWISH, KILN__ONNX_IP_CLIP, KILN__ONNX_IP_SIGMOID,
    KILN__ONNX_IP_ADD, KILN__ONNX_IP_SUB, KILN__ONNX_IP_MUL, KILN__ONNX_IP_DIV, /* binary from ADD on */
};
/* The in-place kind of an operator, KILN__ONNX_IP_NONE when it has none. */
int kiln__onnx_inplace_kind(const char *op_type);
/*
 * Computes node n over the input it may overwrite: dies[i] says in[i] is read by no later
 * node. Returns 1 with *consumed = the index of the input that now holds the result (the
 * caller moves that reference to the output), 0 when the node must run its operator
 * instead, -1 with a message on error.
 */
int kiln__onnx_inplace(const kiln__onnx_node *n, int kind, int nin, kiln_tensor *const *in, const bool *dies,
                       int *consumed);

/* The planned activation arena (onnx-arena.c): a model's plans per input signature and
 * its block of memory. */
typedef struct kiln__onnx_arenas kiln__onnx_arenas;
typedef struct kiln__onnx_arena_run kiln__onnx_arena_run;
/* NULL with a message when out of memory. */
kiln__onnx_arenas *kiln__onnx_arenas_new(bool enabled);
void kiln__onnx_arenas_free(kiln__onnx_arenas *a);
int kiln__onnx_arenas_stats(kiln__onnx_arenas *a, kiln_onnx_arena_stats *out);
/* Called by a run on dev with its n inputs (in the model's input order), asking for nout
 * outputs, before it
 * allocates anything: records or follows the signature's plan until kiln__onnx_arena_end,
 * on this thread. NULL (and nothing to end) when the run goes without the arena: grad
 * mode on, disabled, a device that is not host memory, another run holding it. */
kiln__onnx_arena_run *kiln__onnx_arena_begin(kiln__onnx_arenas *a, kiln_device *dev, int n,
                                             kiln_tensor *const *in, int nout);
/* After the run has released every intermediate; ok: the run succeeded, and out holds
 * its nout results (a recording tells an allocation made for a result, made every run,
 * from one something kept, made once). */
void kiln__onnx_arena_end(kiln__onnx_arena_run *r, bool ok, int nout, kiln_tensor *const *out);

/* An operator's check that its first k inputs are present: fails the node naming the count. */
#define KILN__ONNX_NEED(k)                                                                                        \
    do {                                                                                                          \
        if (nin < (k) || !in[(k)-1])                                                                              \
            return kiln__onnx_fail(n, "needs %d inputs", (k));                                                    \
    } while (0)

/* An operator's return: 0 when it made out[0], else -1 (the op that failed set the error). */
static inline int kiln__onnx_ok(kiln_tensor **out)
{
    return out[0] ? 0 : -1;
}

/* x (N, C, spatial...) as a table of rows, one per (image, pixel) with its C channels (one
 * transposed copy), then a row of zeros and (nan_row) one of NaNs: the resampling operators
 * read their taps as row gathers, an outside tap pointing at the zero row (onnx-ops-sample.c). */
kiln_tensor *kiln__onnx_pixel_rows(kiln_tensor *x, bool nan_row);

/* The FNV-1a hash of a name, for the loader's hash tables of value names. */
static inline uint64_t kiln__onnx_name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    while (*s)
        h = (h ^ (uint8_t)*s++) * 1099511628211ull;
    return h;
}

/* Attribute helpers (onnx-attr.c). */
const kiln__onnx_attr *kiln__onnx_attr_get(const kiln__onnx_node *n, const char *name);
int64_t kiln__onnx_attr_int(const kiln__onnx_node *n, const char *name, int64_t dflt);
double kiln__onnx_attr_float(const kiln__onnx_node *n, const char *name, double dflt);
const char *kiln__onnx_attr_str(const kiln__onnx_node *n, const char *name, const char *dflt);
/* Copies up to max ints; returns the count, or -1 when absent. */
int kiln__onnx_attr_ints(const kiln__onnx_node *n, const char *name, int64_t *out, int max);
/* Reads a small integer tensor (any integer or float dtype) into out; returns the
 * element count, or -1 with a message when it holds more than max. */
int kiln__onnx_read_ints(const kiln__onnx_node *n, kiln_tensor *t, int64_t *out, int max);
/** Whether t is a shape value the executor may read and make on the host at no cost: int64,
 *  at most max elements, on dev, whose buffers are synchronous host memory (the cpu, and
 *  the cpu device that runs a GPU model's shape arithmetic). */
bool kiln__onnx_small_host_ints(const kiln_tensor *t, const kiln_device *dev, int64_t max);
/* Reads a one-element tensor as double. */
int kiln__onnx_read_scalar(const kiln__onnx_node *n, kiln_tensor *t, double *out);
/* Normalizes a possibly negative axis against rank; -1 with a message when out of range. */
int kiln__onnx_axis(const kiln__onnx_node *n, int64_t axis, int rank, int *out);
int kiln__onnx_fail(const kiln__onnx_node *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* kiln dtype for an ONNX type (-1 when none). */
int kiln__onnx_kdtype(int onnx_type);
/* The ONNX element type pm declares for the value name (an initializer, a graph input or a
 * Constant node's value); 0 when none says (onnx-ops-quant.c). */
int kiln__onnx_declared_type(const kiln__onnx_pmodel *pm, const char *name);
/* A tensor from a decoded TensorProto on dev. */
kiln_tensor *kiln__onnx_ptensor_to_tensor(const kiln__onnx_ptensor *pt, kiln_device *dev);

#endif /* KILN_ONNX_IMPL_H */
