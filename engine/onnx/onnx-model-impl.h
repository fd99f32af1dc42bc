/*
 * onnx-model-impl.h — the planned model, shared by the loader (onnx-model.c: value naming,
 * topological order, folding, fusion, the weight-derived marking, the queries) and the executor
 * (onnx-run.c: kiln_onnx_run, the weight-derived cache, the profile).
 */
#ifndef KILN_ONNX_MODEL_IMPL_H
#define KILN_ONNX_MODEL_IMPL_H

#include <stdbool.h>

#include "onnx-impl.h"

typedef struct kiln__onnx_graphs kiln__onnx_graphs;
typedef struct kiln__onnx_if kiln__onnx_if;

/* One node of the plan. */
typedef struct kiln__onnx_mnode {
    kiln__onnx_node info;
    kiln__onnx_op_fn fn;
    int nin, nout;
    int *in, *out;        /* value ids; -1 for an absent optional one */
    int nin_op;           /* the inputs the operator is told of: the node's own, which
                              * the epilogue fusion's operands follow in `in` (so a Conv
                              * without a bias never reads a residual as its bias) */
    bool dead;            /* folded away */
    bool derived;         /* reads only weights (constants) and other derived values: run
                              * once and cached outside grad mode (see refresh_derived) */
    char label[48];       /* op type plus what was fused into it, for the profile */
    kiln__onnx_pack pack; /* Conv: its pre-packed weight */
    int inplace;          /* KILN__ONNX_IP_* kind: may overwrite a dying input */
    bool host;            /* shape arithmetic run on the model's host device (onnx-host.c) */
} kiln__onnx_mnode;

struct kiln_onnx_model {
    kiln_device *dev;
    kiln__onnx_pmodel *pm;
    int nvalues, vcap;
    char **vnames; /* borrowed from pm, or owned when in vowned */
    bool *vowned;
    kiln_tensor **consts; /* owned; NULL for non-constants */
    int *last_use;
    int nnodes;
    kiln__onnx_mnode *nodes; /* topological order */
    int ninputs, *input_vals;
    kiln__onnx_pvalue **input_info;
    int noutputs, *output_vals;
    int nparams, *param_vals;
    int live_nodes;
    /* KILN_ONNX_PROFILE set at load: time spent in each node over all runs, printed by
     * kiln_onnx_free per op type (a tool for finding where a model's time goes). */
    double *prof_ms;
    int prof_runs;
    bool prof_nodes;
    kiln__onnx_arenas *arenas; /* the planned activation arena (onnx-arena.c) */
    /* Weight-derived values: exporters rearrange large weights with graph nodes (torch's
     * dynamo exporter slices and concatenates each LSTM/GRU weight in the graph), which
     * would run on every inference. Outside grad mode their results are computed once and
     * lent to the run like constants, until a write to one of the weights they read (an
     * optimizer step, a copy) changes its storage's version; in grad mode they run as
     * ordinary nodes so training reaches the weights. */
    int nderived;               /* nodes with derived set */
    kiln_tensor **derived_vals; /* per value: consts, plus the cached derived outputs */
    const void **derived_src;   /* per value read by a derived node: the storage and */
    unsigned *derived_ver;      /* version it had when the cache was made */
    bool derived_fresh;
    /* Shape arithmetic on the host for a device without host memory (onnx-host.c): the cpu
     * device it runs on (NULL when no node is host), which values it makes, and cpu copies
     * of the constants it reads, with the storage version each was copied at. */
    kiln_device *host_dev;
    bool *host_vals;
    kiln_tensor **host_consts;
    unsigned *host_const_ver;
    kiln__onnx_graphs *graphs; /* recorded graphs per input signature (onnx-graph.c) */
    /* An If's branch (onnx-ops-control.c): its decoded graph belongs to the If's attribute,
     * it has no arena or graphs of its own (the enclosing run's cover it), and it caches no
     * weight-derived values (a refresh inside the enclosing run would land in its arena). */
    bool branch;
    int max_nin; /* the most inputs a live node reads: an If may read more than 64 */
    /* A live If, here or in a branch a constant condition always takes, that reads its
     * condition on the host at run time, or a live Loop: no graph is recorded (onnx-graph.c). */
    const kiln__onnx_mnode *reads_cond;
};

/** Sets the error "onnx: node NAME (OP) what: <the current error>" and returns it (negative). */
int kiln__onnx_node_fail(const kiln__onnx_mnode *n, const char *what);

/**
 * Runs node n on the values in vals (indexed by value id) inside its own scope; its outputs go
 * to the empty slots of vals as new references. 0, or negative with the error naming the node.
 */
int kiln__onnx_run_node(kiln_onnx_model *m, const kiln__onnx_mnode *n, kiln_tensor **vals);

/** Puts the run's inputs (given, in the model's input order) into vals, copied to the
 *  model's device when they live elsewhere. 0, or -1 with a message. */
int kiln__onnx_bind_inputs(kiln_onnx_model *m, kiln_tensor *const *given, kiln_tensor **vals);

/** Runs every live node on vals (inputs bound; consts the constants, with the cached
 *  weight-derived values when use_derived) and writes noutputs new references to out.
 *  Intermediates are released after their last reader; the caller releases what is left
 *  in vals. 0, or -1 with the error naming the node. */
int kiln__onnx_run_plan(kiln_onnx_model *m, kiln_tensor **vals, kiln_tensor *const *consts, bool use_derived,
                        int noutputs, kiln_tensor **out);

/* Graphs (onnx-graph.c): on a device that records them (kiln__graph_supported), the first
 * run without grad of an input signature runs as usual, the second is recorded and every
 * later one launches the recording. */
/** NULL with a message when out of memory; enabled false keeps every run eager. */
kiln__onnx_graphs *kiln__onnx_graphs_new(bool enabled);
/** Frees the recorded graphs (the model's device and queues still open). */
void kiln__onnx_graphs_free(kiln__onnx_graphs *g);
/** Drops every recorded graph: the weights they address changed (kiln_onnx_set_trainable). */
void kiln__onnx_graphs_drop(kiln__onnx_graphs *g);
int kiln__onnx_graphs_stats(const kiln__onnx_graphs *g, kiln_onnx_graph_stats *out);
/** Serves a run from a recorded graph when it can: 1 with out filled (new references),
 *  0 when the caller must run the plan itself (nothing done that it would notice: a
 *  broken recording is left behind without an error), -1 with a message on an error the
 *  run would have met anyway (copying an input in, launching). */
int kiln__onnx_graph_run(kiln_onnx_model *m, kiln_tensor *const *given, kiln_tensor *const *consts,
                         bool use_derived, int noutputs, kiln_tensor **out);

/** Releases the cached weight-derived values (not the constants lent beside them) and marks the
 *  cache stale. Safe on a model without derived nodes. */
void kiln__onnx_derived_drop(kiln_onnx_model *m);

/** Marks the nodes that run on the host (shape arithmetic) when m's device keeps its buffers
 *  outside host memory, and opens the cpu device they run on. 0, or negative with the error. */
int kiln__onnx_plan_host(kiln_onnx_model *m);

/** Drops the live nodes that repeat an earlier node on the same inputs (onnx-cse.c), after
 *  constant folding; *merged (when not NULL) receives how many. 0, or -1 with a message. */
int kiln__onnx_cse(kiln_onnx_model *m, int *merged);

/** Marks the Gather and GatherElements nodes whose index is a constant without negative
 *  values (kiln__onnx_node.index_nonneg; onnx-cse.c). */
void kiln__onnx_mark_index_nonneg(kiln_onnx_model *m);

/** Whether device node n reads its input `input` only as integer or scalar arguments, so a
 *  host value may be passed there as it is. */
bool kiln__onnx_reads_int_arg(const kiln__onnx_mnode *n, int input);

/** Whether node n reads constant input `input` as its cpu copy: a host node always, a device
 *  node where it reads a small constant as integer arguments. */
bool kiln__onnx_reads_host_const(const kiln_onnx_model *m, const kiln__onnx_mnode *n, int input);

/** The cpu copy of constant v for host nodes, made on first use (and again after a write to
 *  the constant); NULL with the error set on failure. */
kiln_tensor *kiln__onnx_host_const(kiln_onnx_model *m, int v);

/** Releases the host plan's copies and closes its cpu device. */
void kiln__onnx_host_free(kiln_onnx_model *m);

/* If and Loop (onnx-ops-control.c). */
/** Plans decoded graph g (an If's branch, after kiln__onnx_scope_branches) as a model on dev:
 *  its inputs are the names it reads from enclosing graphs. NULL with the error. */
kiln_onnx_model *kiln__onnx_branch_load(kiln_device *dev, kiln__onnx_pmodel *g, const kiln_onnx_options *o);
/** Runs branch m on given (one per input of m, the If node's inputs at their positions) and
 *  writes noutputs new references to out. 0, or -1 with the error naming the node. */
int kiln__onnx_run_branch(kiln_onnx_model *m, kiln_tensor *const *given, int noutputs, kiln_tensor **out);
/** Plans If node n's branches, or Loop node n's body (pn is its decoded node). 0, or -1 with
 *  the error naming the node and the branch. */
int kiln__onnx_if_setup(kiln_onnx_model *m, kiln__onnx_mnode *n, const kiln__onnx_pnode *pn,
                        const kiln_onnx_options *o);
/** After folding: an If whose condition is now a constant takes its branch at load; sets
 *  m->reads_cond (a live Loop always reads on the host). */
void kiln__onnx_if_settle(kiln_onnx_model *m);
/** False for an If with a random op in a branch (never folded or cached); true otherwise. */
bool kiln__onnx_if_pure(const kiln__onnx_node *n);
/** Drops the packed weights of the nodes in c's branches (kiln_onnx_set_trainable). */
void kiln__onnx_if_drop_packs(kiln__onnx_if *c);
void kiln__onnx_if_free(kiln__onnx_if *c);

/** Prints the KILN_ONNX_PROFILE summary (per op type, and per node when asked) to stderr. */
void kiln__onnx_print_profile(const kiln_onnx_model *m);

#endif /* KILN_ONNX_MODEL_IMPL_H */
