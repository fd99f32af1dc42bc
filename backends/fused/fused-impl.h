/*
 * backends/fused/fused-impl.h — what the files of the fusion decorator share: the
 * device and queue contexts, the pending group of one queue, and the small predicates
 * over its recorded calls that both the recording and the flush ask.
 *
 * fused.c is the decorator's shell (life cycle, queues, events, buffers, and the entries
 * that flush and forward); fused-group.c records elementwise calls into a queue's
 * pending group and defers the buffers freed under it; fused-flush.c turns a group into a
 * kiln_fused_program at a flush and runs it on the inner backend's fused_run, or replays
 * the recorded calls where it has none; fused-permute.c lets a matmul write straight into
 * a permuted copy of its product.
 */
#ifndef KILN_FUSED_IMPL_H
#define KILN_FUSED_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "backend.h"
#include "fused-codegen.h"
#include "fused-program.h"

/* The most calls one group records; with at most two loads per call and one store per
 * output this keeps a program within KILN_FUSED_MAX_INSTRS (16 loads + 20 ops + 20
 * stores). */
#define FUSED_MAX_RECS 20

/* A set of buffer handles (fused-bufset.c). mu guards slots, n, cap and stale; any (n > 0) and
 * filter (one bit of each member's hash, or'ed; bits of removed members linger until the next
 * rebuild) are read without it, so that a question about a buffer that is surely not there
 * (none lent, or its bit unset) takes no lock. */
typedef struct fused_bufset {
    pthread_mutex_t mu;
    kiln_buffer **slots;
    int n, cap;
    int stale; /* removals since the filter was last rebuilt */
    _Atomic bool any;
    _Atomic uint64_t filter;
} fused_bufset;

/** b's bit in a set's filter: high bits of the pointer's multiplicative hash. */
static inline uint64_t kiln__fused_filter_bit(const kiln_buffer *b)
{
    uint64_t h = (uint64_t)(uintptr_t)b * 0x9E3779B97F4A7C15ull;
    return 1ull << (h >> 58);
}

/** Whether b may be in s: false is sure, and asked without the lock. */
static inline bool kiln__fused_bufset_may_hold(fused_bufset *s, const kiln_buffer *b)
{
    return atomic_load_explicit(&s->any, memory_order_acquire) &&
           (atomic_load_explicit(&s->filter, memory_order_acquire) & kiln__fused_filter_bit(b));
}

void kiln__fused_bufset_init(fused_bufset *s);
void kiln__fused_bufset_destroy(fused_bufset *s);
/** Room for one more entry (mu held): false when out of memory. */
bool kiln__fused_bufset_room(fused_bufset *s);
/** Adds b (mu held, room made). */
void kiln__fused_bufset_put(fused_bufset *s, kiln_buffer *b);
/** The lookups under mu behind kiln__fused_bufset_remove and _has. */
bool kiln__fused_bufset_remove_locked(fused_bufset *s, const kiln_buffer *b);
bool kiln__fused_bufset_has_locked(fused_bufset *s, const kiln_buffer *b);

/** Removes b; whether it was there. Inline up to the filter, so that a free of a buffer never
 *  lent (an ONNX arena's intermediate, on every op) costs two loads while a few are lent; a
 *  set of many fills the filter and every question takes the lock. */
static inline bool kiln__fused_bufset_remove(fused_bufset *s, const kiln_buffer *b)
{
    return kiln__fused_bufset_may_hold(s, b) && kiln__fused_bufset_remove_locked(s, b);
}

/** Whether b (NULL: no) is there; inline up to the filter, as remove. */
static inline bool kiln__fused_bufset_has(fused_bufset *s, const kiln_buffer *b)
{
    return b && kiln__fused_bufset_may_hold(s, b) && kiln__fused_bufset_has_locked(s, b);
}

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
    /* the buffers buffer_wrap_host made and not yet freed (the caller's memory), kept only
     * over an inner backend without buffer_is_wrapped */
    fused_bufset wrapped;
    /* the buffers buffer_lend_host made and not yet freed: memory the caller reads and
     * writes between calls, so a recorded call touching one runs before it returns */
    fused_bufset lent;
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

/** The same elements in the same order: same buffer and offset, both contiguous. */
static inline bool kiln__fused_same_flat(const kiln_tdesc *a, const kiln_tdesc *b)
{
    return a->buf == b->buf && a->offset == b->offset && kiln__fused_contiguous(a) && kiln__fused_contiguous(b);
}

/** The same view: buffer, offset, dtype, shape, and strides wherever a dim is not 1. */
static inline bool kiln__fused_same_view(const kiln_tdesc *a, const kiln_tdesc *b)
{
    if (a->buf != b->buf || a->offset != b->offset || a->dtype != b->dtype || a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i] || (a->shape[i] != 1 && a->strides[i] != b->strides[i]))
            return false;
    return true;
}

/** How many operands r reads (x, y, z in that order; a NULL buf: an absent one). */
static inline int kiln__fused_rec_inputs(const frec *r)
{
    switch (r->entry) {
    case KILN_ENTRY_REDUCE:
    case KILN_ENTRY_SOFTMAX: return 1;
    case KILN_ENTRY_FILL: return 0;
    case KILN_ENTRY_BINARY:
    case KILN_ENTRY_MATMUL:
    case KILN_ENTRY_POOL_BACKWARD: return 2;
    case KILN_ENTRY_WHERE:
    case KILN_ENTRY_CONV:                 /* (an absent bias: a NULL buf) */
    case KILN_ENTRY_LAYER_NORM: return 3; /* (a layer norm's absent weight or bias: a NULL buf) */
    default: return 1;
    }
}

/** r's operand k (0: x, 1: y, 2: z). */
static inline const kiln_tdesc *kiln__fused_rec_input(const frec *r, int k)
{
    return k == 0 ? &r->x : k == 1 ? &r->y : &r->z;
}

/** Whether a producer (matmul, conv, a max pooling's gradient) heads q's group. */
static inline bool kiln__fused_has_producer(const fq *q)
{
    return q->nrec > 0 && (q->rec[0].entry == KILN_ENTRY_MATMUL || q->rec[0].entry == KILN_ENTRY_CONV ||
                           q->rec[0].entry == KILN_ENTRY_POOL_BACKWARD);
}

/** Whether d reads reduction red's result broadcast over the group's rows: n elements,
 * element i taking red's output element i / red->inner (a keepdim sum expanded back, or
 * read through broadcasting, as softmax's backward reads sum(g y)). */
static inline bool kiln__fused_row_broadcast(const fq *q, const frec *red, const kiln_tdesc *d)
{
    if (!red->row_value || d->buf != red->out.buf || d->offset != red->out.offset || d->dtype != red->out.dtype ||
        kiln__fused_numel(d) != q->n)
        return false;
    int64_t inner = 1, expect = 1;
    int dim = d->ndim - 1;
    for (; dim >= 0 && inner < red->inner; dim--) { /* the row: broadcast dims */
        if (d->shape[dim] != 1 && d->strides[dim] != 0)
            return false;
        inner *= d->shape[dim];
    }
    if (inner != red->inner)
        return false;
    for (; dim >= 0; dim--) { /* the rows: contiguous, in order */
        if (d->shape[dim] == 1)
            continue;
        if (d->strides[dim] != expect)
            return false;
        expect *= d->shape[dim];
    }
    return true;
}

/** Whether a call of q's group reads b. */
static inline bool kiln__fused_group_reads(const fq *q, const kiln_buffer *b)
{
    for (int i = 0; i < q->nrec; i++)
        for (int k = 0; k < kiln__fused_rec_inputs(&q->rec[i]); k++)
            if (kiln__fused_rec_input(&q->rec[i], k)->buf == b)
                return true;
    return false;
}

/** Whether b was freed while q's group was pending (its stores are dead). */
static inline bool kiln__fused_was_freed(const fq *q, const kiln_buffer *b)
{
    for (int i = 0; i < q->nfreed; i++)
        if (q->freed[i].buf == b)
            return true;
    return false;
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
/** Run q's pending group (fused or replayed) and hand its freed buffers back (fused-flush.c). */
int kiln__fused_flush(fq *q);

/** Let go of q's group (q->mu held), publishing whether one is pending (fq.pending). */
static inline void kiln__fused_unlock_group(fq *q)
{
    atomic_store(&q->pending, q->nrec > 0);
    pthread_mutex_unlock(&q->mu);
}

/** Run q's group when one is pending (takes q->mu). 0, or negative on an error. */
static inline int kiln__fused_flush_pending(fq *q)
{
    if (!atomic_load(&q->pending))
        return 0;
    pthread_mutex_lock(&q->mu);
    int rc = kiln__fused_flush(q);
    kiln__fused_unlock_group(q);
    return rc;
}

/* Runs q's pending group, returning the error from the calling entry when it fails. */
#define KILN__FUSED_FLUSH(q)                                                                                      \
    do {                                                                                                          \
        int flush_rc = kiln__fused_flush_pending(q);                                                              \
        if (flush_rc < 0)                                                                                         \
            return flush_rc;                                                                                      \
    } while (0)

/* The buffer entries of the decorator's interface (fused-buffers.c). */
kiln_buffer *kiln__fused_buffer_alloc(void *qctx, size_t nbytes);
void kiln__fused_buffer_free(void *qctx, kiln_buffer *b);
int kiln__fused_buffer_upload(void *qctx, kiln_buffer *dst, size_t off, const void *src, size_t n);
int kiln__fused_buffer_download(void *qctx, kiln_buffer *src, size_t off, void *dst, size_t n);
int kiln__fused_sync(void *qctx);
void *kiln__fused_buffer_host_ptr(void *qctx, kiln_buffer *b);
void *kiln__fused_host_alloc(void *qctx, size_t n);
void kiln__fused_host_free(void *qctx, void *p);
int kiln__fused_buffer_copy_peer(void *qctx, kiln_buffer *dst, size_t doff, void *src_q, kiln_buffer *src,
                                 size_t soff, size_t n);
kiln_buffer *kiln__fused_buffer_wrap_host(void *qctx, void *ptr, size_t n, void (*release)(void *), void *ud);
kiln_buffer *kiln__fused_buffer_lend_host(void *qctx, void *ptr, size_t n, void (*release)(void *), void *ud);
size_t kiln__fused_buffer_trim(void *qctx, size_t bytes);
/** Buffer b was freed on q: deferred while the pending group uses it, unless it wraps
 *  the caller's memory (buffer_wrap_host), which runs the group first. */
void kiln__fused_free(fq *q, kiln_buffer *b, bool wrapped);

/** Whether copy (a COPY call) reads the product of matmul product through a permutation
 *  of its dims into a contiguous output whose rows stay whole: then *store is that output
 *  seen in the product's index order (fused-permute.c), for the matmul to write. */
bool kiln__fused_permuted_store(const frec *product, const frec *copy, kiln_tdesc *store);

#endif /* KILN_FUSED_IMPL_H */
