/*
 * kiln/onnx.h — load an ONNX model file and run it (or train through it) on any device.
 *
 *     kiln_device *dev = kiln_device_open("cpu");
 *     kiln_onnx_model *m = kiln_onnx_load("model.onnx", dev, NULL);
 *     if (!m) { fprintf(stderr, "%s\n", kiln_error()); return 1; }
 *     const char *in_names[] = {"input"};
 *     kiln_tensor *in[] = {x};
 *     kiln_tensor *out[1];
 *     kiln_no_grad_begin();   // inference: no tape, the activation arena and cached weight forms
 *     if (kiln_onnx_run(m, 1, in_names, in, 1, out) != 0) ...   // out[0] is owned by the caller
 *     kiln_no_grad_end();
 *     kiln_tensor_release(out[0]);
 *     kiln_onnx_free(m);
 *
 * Run inference with grad mode off (kiln/autodiff.h): with it on (the default) every run
 * records for a backward that never comes and skips the activation arena and the weight
 * forms prepared once (a packed convolution, a transposed matrix): slower, and its arena
 * statistics show no recorded run.
 * The file is untrusted input: the protobuf decoder checks every length against the bytes
 * left, bounds nesting and counts, and refuses external data that points outside the
 * model's folder. Loading orders the graph topologically (a cycle is an error naming a
 * node on it), folds constant subgraphs (shape arithmetic), and refuses an operator kiln
 * does not implement with its op type and node name. docs/onnx.md lists the operators.
 *
 * Running plans nothing new per call: the node order and the last use of every value are
 * computed once at load, and each intermediate is released right after its last reader.
 * Graph outputs are returned as references owned by the caller (never scoped).
 *
 * Training: kiln_onnx_set_trainable marks the floating initializers as autodiff leaves;
 * run the model with grad mode on, take a loss and call kiln_backward. Load with
 * fold_batchnorm = false when the exact initializers must stay addressable by name.
 *
 * Threads: a model may be run from one thread at a time. (The activation arena itself
 * is taken by one run at a time; a run that finds it taken runs without it.)
 */
#ifndef KILN_ONNX_H
#define KILN_ONNX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

KILN_API_BEGIN

typedef struct kiln_onnx_model kiln_onnx_model;

/** Load options; NULL means the defaults (kiln_onnx_options_default). */
typedef struct kiln_onnx_options {
    /** Fold BatchNormalization that follows a Conv into the Conv's weight and bias. */
    bool fold_batchnorm;
    /** Fold the Add (a residual, or a bias after MatMul) and the activation (Relu,
     *  LeakyRelu, Clip, HardSigmoid, HardSwish, Sigmoid) that follow a Conv, MatMul or
     *  Gemm into that node, so the result is written once. The epilogue's arithmetic is
     *  the separate ops' own, bit for bit; a frozen Conv also gets a pre-packed weight,
     *  whose path sums in the order of the direct convolution path but not of BLAS, so a
     *  1x1 Conv over a small map (which unfused goes to BLAS) can differ in the last bits
     *  (MobileNetV3-small: 1.3e-7 relative). Training through the graph still works: a
     *  fused node runs as the separate ops whenever autodiff must record. */
    bool fuse_epilogues;
    /** The largest model file accepted, in bytes (0: 2 GiB). */
    size_t max_file_bytes;
    /** Planned activation arena: the first run without grad of an input signature
     *  (the dtypes and shapes of all inputs) records its intermediate allocations, and
     *  later runs of that signature without grad place them at planned offsets in one
     *  block of host memory, lifetimes that overlap never sharing bytes. Only on devices
     *  whose buffers are host memory; never while autodiff records. Outputs are the
     *  caller's own memory as without it. KILN_ONNX_ARENA=0 or 1 in the environment at
     *  load overrides this. See docs/onnx.md. */
    bool arena;
    /** Graphs: on a device that records them (cuda), the first run without grad of an
     *  input signature runs op by op, the second is recorded as one graph (the inputs
     *  copied into buffers the graph keeps), and later runs of that signature copy their
     *  inputs in, launch the graph and copy the outputs out: one launch instead of one per
     *  op. A run that cannot be recorded (it reads device data on the host, ...) runs op
     *  by op instead, never failing for it; kiln_onnx_graph_stats_get says which
     *  happened and why. KILN_ONNX_GRAPHS=0 or 1 in the environment at load overrides
     *  this. See docs/onnx.md. */
    bool graphs;
    /** Common subexpressions: a node with the same op type, attributes and inputs as an
     *  earlier one is dropped and its readers read the earlier one's outputs; small equal
     *  constants (not float parameters) count as the same input. Exporters repeat shape
     *  arithmetic and mask conversions in every layer (the 2-layer test encoder: 145 of
     *  429 nodes). Results are unchanged. KILN_ONNX_CSE=0 or 1 in the environment at load
     *  overrides this. See docs/onnx.md. */
    bool common_subexpressions;
} kiln_onnx_options;

kiln_onnx_options kiln_onnx_options_default(void);

/** Load and plan a model from a file; external data files are looked up beside it. */
kiln_onnx_model *kiln_onnx_load(const char *path, kiln_device *dev, const kiln_onnx_options *opts);
/** Load from bytes in memory (copied as needed; external data is refused). */
kiln_onnx_model *kiln_onnx_load_memory(const void *data, size_t len, kiln_device *dev,
                                       const kiln_onnx_options *opts);
void kiln_onnx_free(kiln_onnx_model *m);

/** The opset of the default ("ai.onnx") domain the model was exported with. */
int64_t kiln_onnx_opset(const kiln_onnx_model *m);
/** Number of graph nodes after constant folding and fusion. */
int kiln_onnx_node_count(const kiln_onnx_model *m);

/** Graph inputs that the caller feeds (initializers excluded). */
int kiln_onnx_input_count(const kiln_onnx_model *m);
const char *kiln_onnx_input_name(const kiln_onnx_model *m, int i);
/**
 * Declared shape of input i: rank in *ndim, dims in shape (KILN_MAX_DIMS entries); a
 * symbolic or unknown dim is -1. Returns the kiln dtype, or -1 when i is out of range.
 */
int kiln_onnx_input_info(const kiln_onnx_model *m, int i, int *ndim, int64_t *shape);
int kiln_onnx_output_count(const kiln_onnx_model *m);
const char *kiln_onnx_output_name(const kiln_onnx_model *m, int i);
/**
 * What the file declares for output i (its graph output's type): rank in *ndim (-1 when
 * the file gives no shape), dims in shape (KILN_MAX_DIMS entries; a symbolic or unknown dim
 * is -1). Returns the kiln dtype; -1 when i is out of range or the file declares no type
 * kiln holds. A declaration, not a run: kiln_onnx_infer_shapes runs the graph.
 */
int kiln_onnx_output_info(const kiln_onnx_model *m, int i, int *ndim, int64_t *shape);

/**
 * Run the graph. Inputs are matched by name (every graph input must be given, once; a
 * tensor on another device is copied over) and must have the dtype the graph declares for
 * them (kiln_onnx_input_info; no implicit cast: token ids as f32 are refused, naming the
 * input and both dtypes). out receives noutputs new references, in graph-output order. On
 * error returns -1 and the message names the input, or the node (op type and name).
 */
int kiln_onnx_run(kiln_onnx_model *m, int ninputs, const char *const *input_names,
                  kiln_tensor *const *inputs, int noutputs, kiln_tensor **out);

/**
 * Shape inference by a dry run: runs the graph on zero-filled inputs of the declared
 * shapes, with every symbolic dim set to sym_value (>= 1), and writes the output shapes.
 * Returns 0, or -1 with a message naming the first node that failed (op type and name).
 */
int kiln_onnx_infer_shapes(kiln_onnx_model *m, int64_t sym_value, int noutputs, int *ndims,
                           int64_t (*shapes)[KILN_MAX_DIMS]);

/** What the activation arena (kiln_onnx_options.arena) has done for a model. */
typedef struct kiln_onnx_arena_stats {
    bool enabled;            /* the option, after KILN_ONNX_ARENA */
    int plans;               /* input signatures with a plan now (at most 4, least recently used dropped) */
    uint64_t recorded;       /* runs that recorded a plan */
    uint64_t replayed;       /* runs that placed their intermediates by a plan to the end */
    uint64_t dropped;        /* runs that found their plan did not fit and dropped it */
    /* The plan the latest run recorded or followed: */
    int allocs;              /* allocations it places (those outliving the run excluded) */
    size_t planned_bytes;    /* its arena size */
    size_t alloc_bytes;      /* the sum of those allocations' sizes (64-byte rounded) */
    size_t reserved_bytes;   /* arena memory the model holds now */
} kiln_onnx_arena_stats;

/** Fill *out for m. 0, or -1 with a message on NULL arguments. */
int kiln_onnx_arena_stats_get(kiln_onnx_model *m, kiln_onnx_arena_stats *out);

/** What the graphs (kiln_onnx_options.graphs) have done for a model. */
typedef struct kiln_onnx_graph_stats {
    bool enabled;          /* the option, after KILN_ONNX_GRAPHS */
    bool supported;        /* the model's device records graphs */
    int graphs;            /* input signatures with a recorded graph now (at most 4) */
    uint64_t recorded;     /* recordings that made a graph */
    uint64_t launched;     /* runs served by launching a recorded graph */
    uint64_t broken;       /* recordings that broke: their signature runs op by op */
    uint64_t eager;        /* runs without grad that went op by op (first runs included) */
    bool last_run_graph;   /* the latest run without grad launched a graph */
    char last_broken[256]; /* what broke the latest broken recording; "" when none did */
} kiln_onnx_graph_stats;

/** Fill *out for m. 0, or -1 with a message on NULL arguments. */
int kiln_onnx_graph_stats_get(kiln_onnx_model *m, kiln_onnx_graph_stats *out);

/** Number of initializers (weights) the model holds, and the i-th name and tensor
 *  (borrowed: valid until kiln_onnx_free). */
int kiln_onnx_param_count(const kiln_onnx_model *m);
const char *kiln_onnx_param_name(const kiln_onnx_model *m, int i);
kiln_tensor *kiln_onnx_param(const kiln_onnx_model *m, int i);
/** Mark (or unmark) every floating initializer as requiring gradients. 0 or -1. */
int kiln_onnx_set_trainable(kiln_onnx_model *m, bool on);
/** Save every floating initializer (the weights) to a safetensors file. 0 or negative. */
int kiln_onnx_save_params(const kiln_onnx_model *m, const char *path);

KILN_API_END

#ifdef __cplusplus
}
#endif
#endif /* KILN_ONNX_H */
