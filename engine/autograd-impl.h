/*
 * engine/autograd-impl.h — the private side of reverse-mode autodiff: tape nodes, the
 * hooks the op files call to record them, and the helpers backward functions share.
 *
 * Ownership, in one paragraph: a tensor that requires grad carries a small meta block
 * (t->autograd). For the output of a recorded op the meta holds one reference on the
 * op's node; the node holds references on the nodes of its inputs (edges) or, for a
 * leaf input, on the leaf tensor itself, whose meta keeps the accumulated .grad. So the
 * tape is a DAG owned from its outputs towards its leaves: dropping the last output
 * that reaches a node frees it, whether or not backward ever ran. Saved tensors are
 * plain aliases (views without a meta), so saving an op's own output makes no cycle.
 *
 * Backward functions run with recording off, inside a private scope opened by the
 * engine, so they may use the public ops freely; the engine keeps only the gradients
 * they write to gin[] (cast to each input's dtype and checked against its shape).
 */
#ifndef KILN_AUTOGRAD_IMPL_H
#define KILN_AUTOGRAD_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "kiln/autodiff.h"
#include "tensor-impl.h"

typedef struct kiln__node kiln__node;

/** Compute the gradients of a node's inputs from gout (the gradient of its output).
 *  Write gin[i] for every input i with kiln__ad_needs(n, i); leave the rest NULL (NULL
 *  also means "no contribution"). Returns 0 or -1 with an error set. */
typedef int (*kiln__backward_fn)(kiln__node *n, kiln_tensor *gout, kiln_tensor **gin);

typedef struct kiln__edge {
    kiln__node *node;       /* the input's own node (retained), or NULL */
    kiln_tensor *leaf;      /* a leaf input that requires grad (retained), or NULL */
    kiln_dtype dtype;       /* the input's dtype and shape: what its gradient must be */
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
} kiln__edge;

/* Per-tensor autograd state; allocated only for tensors that require grad. */
typedef struct kiln__meta {
    kiln__node *node;       /* grad_fn: NULL for a leaf */
    kiln_tensor *grad;      /* accumulated gradient (owned, outside every scope) */
    bool retain;            /* kiln_retain_grad on a non-leaf */
} kiln__meta;

#define KILN__AD_SAVED_MAX 6

struct kiln__node {
    atomic_int refcount;
    const char *name;               /* the op, for error messages */
    kiln__backward_fn backward;     /* NULL: the op has no backward */
    int nin;
    kiln__edge *edges;
    kiln_tensor *saved[KILN__AD_SAVED_MAX]; /* aliases; freed once backward has used them */
    kiln_tensor **xsaved;           /* more aliases (checkpoint inputs), nxsaved of them */
    int nxsaved;
    /* Each saved alias's storage version when it was saved (kiln_storage.version): backward
     * refuses to run when an in-place write has moved one on since. */
    unsigned saved_version[KILN__AD_SAVED_MAX];
    unsigned *xsaved_version;       /* one per xsaved entry */
    bool freed;                     /* saved tensors released by a backward pass */
    kiln_dtype out_dtype;
    int out_ndim;
    int64_t out_shape[KILN_MAX_DIMS];
    /* Op parameters, as the recording hook chooses to use them. */
    int64_t iv[3 * KILN_MAX_DIMS];
    double dv[4];
    void *pv[2];
    unsigned char blob[160];        /* a params struct (conv, pool) copied verbatim */
    /* A non-leaf output marked with kiln_retain_grad (weak: cleared when it dies). */
    kiln__meta *retain_meta;
    /* Scratch of the backward pass that is visiting this node. */
    uint64_t task;
    int deps;
    kiln_tensor *acc;
    kiln__node *free_next;          /* release list, so long chains free without recursion */
};

/* ------------------------------------------------------------- grad mode (autograd.c) */

extern _Thread_local int kiln__no_grad_depth;

/** True when an op with this input should record: t requires grad and grad mode is on. */
static inline bool kiln__ad_want(const kiln_tensor *t)
{
    return t && t->requires_grad && kiln__no_grad_depth == 0;
}
bool kiln__ad_want_n(int n, kiln_tensor *const *ts);

/**
 * Record a node for out, computed by op name from the n inputs (NULL entries allowed;
 * they get no gradient). Does nothing (returns NULL, no error) when out is not floating
 * or is one of the inputs; otherwise out requires grad afterwards. On allocation failure
 * returns NULL with an error and sets *failed.
 */
kiln__node *kiln__ad_record(kiln_tensor *out, const char *name, kiln__backward_fn fn, int n,
                            kiln_tensor *const *ins, bool *failed);
/** Keep an alias of t (shares storage, no graph) as saved slot k, with its storage's
 *  version now: a later in-place write to that storage makes backward fail. -1 on failure. */
int kiln__ad_save(kiln__node *node, int k, kiln_tensor *t);
/** True when input i of the node needs a gradient. */
static inline bool kiln__ad_needs(const kiln__node *n, int i)
{
    return i < n->nin && (n->edges[i].node || n->edges[i].leaf);
}
/** Release out and return NULL when recording failed; out otherwise. */
static inline kiln_tensor *kiln__ad_fail(kiln_tensor *out, bool failed)
{
    if (failed) {
        kiln_tensor_release(out);
        return NULL;
    }
    return out;
}
/** Free t's autograd meta (called when t dies). */
void kiln__ad_free_meta(kiln_tensor *t);

/* --------------------------------------------------- helpers for backward functions */
/* All of these use public ops, so they only run inside a backward (private scope). */

/** g summed down to shape (the inverse of broadcasting g's operand to g's shape). */
kiln_tensor *kiln__sum_to(kiln_tensor *g, int ndim, const int64_t *shape);
/** A 0-d constant like t's dtype and device. */
kiln_tensor *kiln__const_like(const kiln_tensor *t, double v);
/** Add src into a zero tensor of shape (dim d of size size) at index map idx[j] for
 *  each j along d of src: the backward of an index along one dim. */
kiln_tensor *kiln__index_add_dim(kiln_tensor *src, int d, int64_t size, kiln_tensor *idx1d);

/* ---------------------------------------------------------- recording hooks (grad-*.c) */
/* Each takes the op's freshly computed result (a reference not yet in any scope),
 * records it when its inputs ask for that, and returns it (NULL on failure, with the
 * result released). Call them only when kiln__ad_want*() said yes. */

/* grad-elementwise.c */
kiln_tensor *kiln__grad_unary(kiln_tensor *out, kiln_unary_op op, kiln_tensor *t, double alpha, double beta);
kiln_tensor *kiln__grad_binary(kiln_tensor *out, kiln_binary_op op, kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln__grad_where(kiln_tensor *out, kiln_tensor *cond, kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln__grad_masked_fill(kiln_tensor *out, kiln_tensor *t, kiln_tensor *mask);
kiln_tensor *kiln__grad_tri(kiln_tensor *out, kiln_tensor *t, int64_t diagonal, bool lower);

/* grad-shape.c */
kiln_tensor *kiln__grad_reshape(kiln_tensor *out, kiln_tensor *t, const char *name);
kiln_tensor *kiln__grad_permute(kiln_tensor *out, kiln_tensor *t, int ndim, const int *order);
kiln_tensor *kiln__grad_expand(kiln_tensor *out, kiln_tensor *t);
kiln_tensor *kiln__grad_slice(kiln_tensor *out, kiln_tensor *t, int dim, int64_t start, int64_t end,
                              int64_t step, const char *name);
kiln_tensor *kiln__grad_cat(kiln_tensor *out, kiln_tensor *const *ts, int n, int dim, bool stack);
kiln_tensor *kiln__grad_repeat(kiln_tensor *out, kiln_tensor *t, int ndim, const int64_t *repeats);
kiln_tensor *kiln__grad_flip(kiln_tensor *out, kiln_tensor *t, int ndims, const int *dims);
kiln_tensor *kiln__grad_pad(kiln_tensor *out, kiln_tensor *t, int npads, const int64_t *pads,
                            kiln_pad_mode mode);
kiln_tensor *kiln__grad_identity(kiln_tensor *out, kiln_tensor *t, const char *name);
kiln_tensor *kiln__grad_to_device(kiln_tensor *out, kiln_tensor *t);
kiln_tensor *kiln__grad_gather(kiln_tensor *out, kiln_tensor *t, int dim, kiln_tensor *index);
kiln_tensor *kiln__grad_scatter(kiln_tensor *out, kiln_tensor *t, int dim, kiln_tensor *index,
                                kiln_tensor *src, bool accumulate);
kiln_tensor *kiln__grad_index_select(kiln_tensor *out, kiln_tensor *t, int dim, kiln_tensor *index);
kiln_tensor *kiln__grad_slice_assign(kiln_tensor *out, kiln_tensor *t, int dim, int64_t start,
                                     int64_t end, int64_t step, kiln_tensor *src);
kiln_tensor *kiln__grad_embedding(kiln_tensor *out, kiln_tensor *weight, kiln_tensor *indices);

/* grad-reduce.c */
kiln_tensor *kiln__grad_reduce(kiln_tensor *out, kiln_reduce_op op, kiln_tensor *t, int ndims,
                               const int *dims, bool keepdim, double param);
kiln_tensor *kiln__grad_cumsum(kiln_tensor *out, kiln_tensor *t, int dim);
kiln_tensor *kiln__grad_sort(kiln_tensor *values, kiln_tensor *t, int dim, kiln_tensor *indices,
                             const char *name);
kiln_tensor *kiln__grad_matmul(kiln_tensor *out, kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln__grad_linear(kiln_tensor *out, kiln_tensor *x, kiln_tensor *w, kiln_tensor *bias);

/* grad-nn.c */
/* cx, cw: the batched input and the weight as the op computed with them. */
kiln_tensor *kiln__grad_conv(kiln_tensor *out, kiln_tensor *x, kiln_tensor *w, kiln_tensor *bias,
                             const kiln_conv_params *p, kiln_tensor *cx, kiln_tensor *cw, bool transposed,
                             const char *name);
/* indices: the batched max-pool indices (NULL for average pooling). */
kiln_tensor *kiln__grad_pool(kiln_tensor *out, kiln_tensor *x, const kiln_pool_params *p,
                             kiln_tensor *indices, const char *name);
kiln_tensor *kiln__grad_adaptive(kiln_tensor *out, kiln_tensor *x, int ns, const char *name);
kiln_tensor *kiln__grad_interpolate(kiln_tensor *out, kiln_tensor *x, kiln_interp_mode mode,
                                    bool align_corners);
kiln_tensor *kiln__grad_softmax(kiln_tensor *out, kiln_tensor *t, int dim, bool log);
kiln_tensor *kiln__grad_layer_norm(kiln_tensor *out, kiln_tensor *x, int nnorm, kiln_tensor *weight,
                                   kiln_tensor *bias, double eps);
kiln_tensor *kiln__grad_batch_norm(kiln_tensor *out, kiln_tensor *x, kiln_tensor *weight, kiln_tensor *bias,
                                   kiln_tensor *mean, kiln_tensor *rstd);

#endif /* KILN_AUTOGRAD_IMPL_H */
