/*
 * backends/fused/fused-impl.h — what the two files of the fusion decorator share: the
 * device and queue contexts and the pending group of one queue.
 *
 * fused.c is the decorator's shell (life cycle, queues, events, buffers, and the entries
 * that flush and forward); fused-group.c records elementwise calls into a queue's
 * pending group, turns a group into a kiln_fused_program at a flush and runs it on the
 * inner backend's fused_run, or replays the recorded calls where it has none.
 */
#ifndef KILN_FUSED_IMPL_H
#define KILN_FUSED_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "backend.h"
#include "fused-program.h"

/* The most calls one group records; with at most two loads per call and one store per
 * output this keeps a program within KILN_FUSED_MAX_INSTRS (16 loads + 20 ops + 20
 * stores). */
#define FUSED_MAX_RECS 20

typedef struct fdev {
    const kiln_backend_iface *in;
    void *ictx;
    bool replay;                      /* option codegen=off: groups replay their calls */
    int64_t min_elements;             /* a call smaller than this starts no group (caps) */
    bool row_reduce;                  /* the inner fused_run takes ROW_REDUCE (caps) */
    bool strided_products;            /* the inner matmul writes permuted outputs (caps) */
    _Atomic uint64_t groups_run;      /* programs handed to the inner fused_run */
    _Atomic uint64_t calls_fused;     /* recorded calls those programs replaced */
    _Atomic uint64_t groups_replayed; /* groups that ran call by call */
    /* the buffers buffer_wrap_host made and not yet freed (the caller's memory): a set of
     * pointers, open addressing with linear probing (capwrapped a power of two, at most half
     * full; NULL marks a free slot). An ONNX model's planned arena wraps every intermediate,
     * so a wrap and a free come with almost every op: a list searched on each free cost the
     * encoder 9% of its run */
    pthread_mutex_t wrapped_mu;
    kiln_buffer **wrapped;
    int nwrapped, capwrapped;
    _Atomic bool any_wrapped; /* nwrapped > 0, read without the lock on every free */
} fdev;

/* One recorded call: fill (out), copy and unary (out, x), binary (out, x, y), where
 * (out, x = cond, y, z), reduce (out, x; op, mask, alpha = param), softmax (out, x; op =
 * log, mask = dim), matmul (out, x, y), layer_norm (out, x, y = weight, z = bias, either
 * with a NULL buf when absent; alpha = eps, inner). */
typedef struct frec {
    kiln_entry entry;
    int op;
    double alpha, beta;
    kiln_tdesc out, x, y, z;
    uint32_t mask;         /* reduce: the reduced dims */
    kiln_conv_params conv; /* conv: the geometry (x, y = weight, z = bias or a NULL buf) */
    kiln_pool_params pool; /* pool_backward (max): the geometry (out = grad_x, x = grad_out, y = indices) */
    int64_t inner; /* reduce: elements per output element */
    bool row_value; /* reduce: later calls may read its result broadcast over the rows */
} frec;

/* A queue. Threads that never chose a queue of their own share the device's default one,
 * so its group is guarded by mu (taken by fused.c around recording, freeing and flushing;
 * forwarded calls run outside it). */
typedef struct fq {
    pthread_mutex_t mu;
    /* nrec > 0, written under mu: a call that finds no group pending forwards without
     * taking mu (uncontended locks around every call cost the decorator a fifth of a
     * small model's run). A thread that frees a buffer a group reads got it after the
     * recording thread let go of it, so it sees the flag set. */
    _Atomic bool pending;
    fdev *d;
    void *iq;   /* the inner queue context */
    bool owned; /* opened with the inner queue_open */
    /* the pending group */
    int nrec;
    int64_t n;        /* element count every call of the group shares */
    kiln_dtype dtype; /* the values' dtype every call of the group shares (f32, f16, bf16) */
    bool closed; /* a reduction ended the group: the next call flushes it */
    bool product_copy; /* the group: a matmul, then a copy of its product into a permuted layout */
    int64_t row; /* the row length of a softmax or reduction in the group (0: none) */
    frec rec[FUSED_MAX_RECS];
    /* buffers freed while the group was pending: their stores are dead, and their handles
     * go back to the inner backend only after the flush (so it cannot hand them out again
     * to a call the group still reads from). One the group writes before anything reads
     * it has its memory detached at once (inner buffer_detach), which the next allocation
     * takes; a replay reattaches it first */
    struct fused_freed {
        kiln_buffer *buf;
        bool detached;
    } * freed;
    int nfreed, capfreed;
} fq;

/** The element count of d's shape. */
static inline int64_t kiln__fused_numel(const kiln_tdesc *d)
{
    int64_t n = 1;
    for (int i = 0; i < d->ndim; i++)
        n *= d->shape[i];
    return n;
}

/** Record the call into q's group when it fuses (returns 1); 2 when it is small (the
 *  caller's judgement: under the device's fusion size, or a constant's tiny fill), cannot
 *  join and shares no buffer with the group (the caller forwards it and the group stays
 *  pending); else 0 (the caller flushes and forwards it); negative on an error. */
int kiln__fused_record(fq *q, const frec *r, bool small);
/** A max pooling's backward into grad_x r->out: when the group's last call zero-fills that
 *  very view (the engine's kiln_zeros before pool_backward), the fill is dropped and the
 *  gradient heads a group of its own, its consumers (a relu's backward) as its epilogue
 *  (returns 1); else 0 (the caller flushes and forwards it); negative on an error. */
int kiln__fused_record_pool_grad(fq *q, const frec *r);
/** Whether q's pending group reads or writes buffer b (under q->mu). */
bool kiln__fused_group_uses(const fq *q, const kiln_buffer *b);
/** Run q's pending group (fused or replayed) and hand its freed buffers back. */
int kiln__fused_flush(fq *q);
/** Buffer b was freed on q: deferred while the pending group uses it, unless it wraps
 *  the caller's memory (buffer_wrap_host), which runs the group first. */
void kiln__fused_free(fq *q, kiln_buffer *b, bool wrapped);

/** Whether copy (a COPY call) reads the product of matmul product through a permutation
 *  of its dims into a contiguous output whose rows stay whole: then *store is that output
 *  seen in the product's index order (fused-permute.c), for the matmul to write. */
bool kiln__fused_permuted_store(const frec *product, const frec *copy, kiln_tdesc *store);

#endif /* KILN_FUSED_IMPL_H */
