/*
 * engine/tensor-impl.h — the private bodies of devices, storages and tensors, and the
 * helpers the op files share.
 *
 * A tensor is a strided view (shape, strides and offset in elements) of a storage; a
 * storage owns one backend buffer and keeps its device alive. Views share the storage
 * and hold a reference on it, so the buffer goes back to the backend when the last view
 * is released.
 *
 * Internal helpers named kiln__* return new references that no scope holds; only the
 * public entry points hand their result to kiln__ret(), which gives it to the innermost
 * scope. That keeps temporaries inside an op out of the caller's scope.
 */
#ifndef KILN_TENSOR_IMPL_H
#define KILN_TENSOR_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "error-impl.h"
#include "kiln/tensor.h"

#define KILN_SPEC_MAX 256
#define KILN__QUEUE_USERS 4

struct kiln_device {
    char spec[KILN_SPEC_MAX];          /* canonical spec: "cpu", "cuda:0" */
    const kiln_backend_iface *be;
    void *ctx;                         /* what be->open returned */
    /* the opener's, plus one per storage and queue that names it: taken and dropped without
     * a lock (device.c), which a tensor made or freed per op would otherwise take twice */
    atomic_int refcount;
    kiln_backend_caps caps;
    struct kiln_device *next;          /* registry list */
    /* Queues (queue.c). default_q serves threads that chose none; its ctx is ctx itself
     * for a backend without queue_open. track: the backend orders queues only through
     * events (queue_open and event_wait set), so the engine orders each storage's uses
     * across queues (kiln__queue_touch). */
    struct kiln_queue *default_q;
    bool multi_queue;                  /* be->queue_open set */
    bool track;
    uint64_t entries;                  /* bit e: the backend fills entry e (kiln__supports' fast path) */
    pthread_mutex_t queue_lock;        /* the queue list and every storage's users */
    struct kiln_queue *queues;         /* open queues, default_q included */
    /* Deferred errors (queue-checks.c; asynchronous devices only). clock orders writes and
     * the points where a queue was seen to finish its work; failures lists the stretches of
     * the clock whose writes an error spoiled, newest first (under queue_lock). A storage
     * stamped outside [spoiled_from, spoiled_below) is not spoiled, which is what nearly
     * every check finds without the lock. */
    _Atomic uint64_t clock;
    struct kiln__failure *failures;
    _Atomic uint64_t spoiled_from, spoiled_below;
};

typedef struct kiln_storage {
    atomic_int refcount;
    kiln_device *dev;                  /* one device reference per storage */
    kiln_buffer *buf;
    size_t nbytes;
    /* Bumped by every engine write into existing memory (kiln__copy_into, kiln__fill, the
     * fused optimizer step), so a derived copy (a packed weight) can tell it is stale, and
     * backward can tell that a tensor autograd saved was overwritten since (autograd.c).
     * Shared by every view of the storage. */
    atomic_uint version;
    /* The allocation hook that saw this storage made (its tag, 0 for none) and the
     * number it gave it: the hook hears of the storage's death while it is installed. */
    uint64_t hook_tag;
    uint32_t hook_seq;
    /* Tracked devices only (kiln_device.track): the queue that made the storage (its
     * frees are ordered there) and the other queues that used it since, each holding a
     * queue reference; guarded by the device's queue_lock. */
    struct kiln_queue *home;
    struct kiln_queue *users[KILN__QUEUE_USERS];
    /* users[0] != NULL, written under queue_lock and read without it: a storage used only
     * on its home queue (nearly all) is touched without taking the lock */
    atomic_bool has_users;
    /* The device clock when the storage was made or last written by the engine in place
     * (asynchronous devices): a failure whose stretch holds it spoiled its contents. */
    uint64_t stamp;
} kiln_storage;

struct kiln_tensor {
    atomic_int refcount;
    kiln_storage *storage;
    kiln_dtype dtype;
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    int64_t strides[KILN_MAX_DIMS];    /* in elements; 0 for broadcast dims */
    int64_t offset;                    /* in elements */
    /* How many scope entries hold a reference to this tensor. Scopes are per thread;
     * the count lets kiln_tensor_release skip the scope search in the common case. */
    atomic_int scope_refs;
    /* Reserved for the autodiff tape. */
    bool requires_grad;
    void *autograd;
};

/* ------------------------------------------------------------- devices (device.c) */
void kiln__device_retain(kiln_device *dev);
void kiln__device_release(kiln_device *dev);
/** -1 with a message naming the first option the backend left unused (device-opts.c). */
int kiln__device_opts_check_used(const char *backend, const kiln_device_opts *opts);
/** The options as "k=v&k=v", sorted by key (how a spec with options is canonical). */
void kiln__device_opts_canon(const kiln_device_opts *o, char *buf, size_t len);
/** Whether name is a backend or decorator a spec may name (compiled in or not), so that
 *  device options may be kept for it: one of KILN__BACKEND_NAMES. */
bool kiln__backend_name_known(const char *name);
#define KILN__BACKEND_NAMES "cpu, ref, cuda, vulkan, hip, remote, counting or fused"

/* -------------------------------------------------------------- queues (queue.c) */
struct kiln_queue {
    kiln_device *dev;
    void *ctx;                         /* the backend's queue context (dev->ctx without queues) */
    atomic_int refcount;               /* the opener's, plus one per storage that names it */
    bool is_default;                   /* dev->default_q: holds no device reference */
    struct kiln_queue *next;           /* dev->queues */
    /* range checks waiting for the next read (queue-checks.c): written under its lock, read
     * without it by a drain asking whether there are any */
    _Atomic(struct pending_check *) checks;
    /* The device clock when this queue was last seen to have finished its work without an
     * error: writes stamped before it are good (queue-checks.c). */
    _Atomic uint64_t clean_since;
    /* An op on this queue read a spoiled storage: the message of the failure it carries
     * over ("" for none; under the device's queue_lock). The queue's next drain fails with
     * it, whatever the device says, spoiling what the queue wrote meanwhile. */
    char tainted[KILN_ERROR_MAX];
    int tainted_code; /* kiln_error_code() of the failure tainted restates */
};
/** Make dev's default queue (device.c calls it once the backend opened). */
int kiln__queue_init_device(kiln_device *dev);
/** Close every queue of dev (its last reference went). */
void kiln__queue_fini_device(kiln_device *dev);
/** The calling thread's current queue for dev. */
struct kiln_queue *kiln__queue_cur(const kiln_device *dev);
/** The backend context work for dev is submitted with on this thread. */
static inline void *kiln__qctx(const kiln_device *dev)
{
    return dev->multi_queue ? kiln__queue_cur(dev)->ctx : dev->ctx;
}
/** A new storage on dev: its home queue (tracked devices). */
void kiln__queue_adopt_slow(kiln_storage *st);
static inline void kiln__queue_adopt(kiln_storage *st)
{
    if (st->dev->track)
        kiln__queue_adopt_slow(st);
}
/** Before st is used on this thread's queue: order that use after every other queue's
 *  (tracked devices; a no-op otherwise). */
void kiln__queue_touch_slow(kiln_storage *st);
static inline void kiln__queue_touch(kiln_storage *st)
{
    if (st->dev->track)
        kiln__queue_touch_slow(st);
}
/** Park a range check of index on the current queue: its extremes are computed on the
 *  device now and read at the next read or sync of the queue (queue-checks.c). */
int kiln__check_defer(kiln_tensor *index, int64_t lo, int64_t hi, const char *op, const char *noun);
/** Read q's parked checks (one read for all); -1 with the first violation's message. */
int kiln__checks_run(struct kiln_queue *q);
/** Forget q's parked checks (the queue is going). */
void kiln__checks_drop(struct kiln_queue *q);

/*
 * Deferred errors on asynchronous devices (queue-checks.c). An op that fails on the device
 * is only reported at the next drain of its queue (a sync or a read); by then later ops may
 * have used its result. So the error spoils every storage its queue wrote since the queue
 * last drained cleanly: reading one fails with the error, however often it is read, and an
 * op that reads one spoils its own queue's stretch in turn.
 */
/** Stamp st as written now (a new storage, or an in-place write by the engine). */
static inline void kiln__stamp(kiln_storage *st)
{
    if (st->dev->caps.async)
        st->stamp = atomic_load_explicit(&st->dev->clock, memory_order_relaxed);
}
/** Stamp st as holding a value that depends on no other storage (a whole upload or fill):
 *  no earlier error can have spoiled it. */
static inline void kiln__stamp_source(kiln_storage *st)
{
    if (st->dev->caps.async)
        st->stamp = UINT64_MAX;
}
/** An op on this thread's queue reads or writes st (kiln__desc): a spoiled st spoils the
 *  queue's stretch. */
void kiln__spoil_check_slow(kiln_storage *st);
static inline void kiln__spoil_check(kiln_storage *st)
{
    if (st->stamp < atomic_load_explicit(&st->dev->spoiled_below, memory_order_acquire) &&
        st->stamp >= atomic_load_explicit(&st->dev->spoiled_from, memory_order_relaxed))
        kiln__spoil_check_slow(st);
}
/** -1 with the error that spoiled st (op names the reader), 0 when st is good. */
int kiln__spoiled(const kiln_storage *st, const char *op);
/** Where a drain of q starts: what kiln__drain_end needs (the clock, and q's clean point). */
typedef struct kiln__drain {
    uint64_t started, clean_before;
} kiln__drain;
kiln__drain kiln__drain_begin(struct kiln_queue *q);
/** After a drain of q that returned rc: a clean drain moves q's clean point; a failed one (or
 *  a clean one while q is tainted) records the stretch it spoiled. Returns rc, or -1 with the
 *  taint's message. */
int kiln__drain_end(struct kiln_queue *q, kiln__drain d, int rc);
/** Free dev's failure list (the device is going). */
void kiln__failures_free(kiln_device *dev);
/** Free st's buffer, ordered after every queue that used it. */
void kiln__queue_free_buffer(kiln_storage *st);

/* -------------------------------------------------------------- graphs (queue.c) */
/** A recording of one queue's work (the backend's graph entries), holding that queue. */
typedef struct kiln__graph kiln__graph;
/** Whether dev's backend records graphs (fills all four graph entries). */
bool kiln__graph_supported(const kiln_device *dev);
/** Start recording the calling thread's current queue of dev: 0, or -1 with a message
 *  (KILN_ENOTSUP's when the backend records none). */
int kiln__graph_capture_begin(kiln_device *dev);
/** Stop recording that queue: the graph, or NULL with the message saying what broke it. */
kiln__graph *kiln__graph_capture_end(kiln_device *dev);
/** Whether g was recorded on the calling thread's current queue of its device (the only
 *  queue it may be launched on). */
bool kiln__graph_on_current_queue(const kiln__graph *g);
/** Queue one run of g on the queue that recorded it (the calling thread's current one). */
int kiln__graph_launch(kiln__graph *g);
void kiln__graph_free(kiln__graph *g);

/* -------------------------------------------------------- tensors (tensor.c) */

/** A new contiguous tensor with fresh storage; checks sizes. op names the caller in
 *  error messages. Not registered in any scope. */
kiln_tensor *kiln__alloc(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape,
                         const char *op);
/** True when dev can use host memory in place: buffer_wrap_host over host-memory buffers. */
bool kiln__can_wrap_host(const kiln_device *dev);
/** A contiguous tensor over ptr (64-byte aligned, writable, numel × dtype size bytes)
 *  without copying; release(release_ud) runs when its storage dies. On failure release
 *  is not called: the caller still owns the memory. Not registered in any scope. */
kiln_tensor *kiln__alloc_wrapped(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape, void *ptr,
                                 void (*release)(void *), void *release_ud, const char *op);
/** A new view of base's storage. */
kiln_tensor *kiln__view(const kiln_tensor *base, int ndim, const int64_t *shape,
                        const int64_t *strides, int64_t offset);
/** Fill a backend descriptor from t. */
void kiln__desc(const kiln_tensor *t, kiln_tdesc *d);
/** Hand t to the innermost open scope (if any) and return it; NULL passes through. */
kiln_tensor *kiln__ret(kiln_tensor *t);
/** Close the innermost scope (a composite's private one) keeping only r, which goes to
 *  the enclosing scope; returns r (NULL passes through). */
kiln_tensor *kiln__scope_end_keep(kiln_tensor *r);
/** Product of sizes; false when it overflows int64. */
bool kiln__numel_ok(int ndim, const int64_t *shape, int64_t *numel);
int64_t kiln__numel(const kiln_tensor *t);
/** Contiguous row-major strides for shape. */
void kiln__contig_strides(int ndim, const int64_t *shape, int64_t *strides);
/** "f32[2, 3]" into buf. */
char *kiln__describe(const kiln_tensor *t, char *buf, size_t len);
/** "[2, 3]" into buf. */
char *kiln__shape_str(int ndim, const int64_t *shape, char *buf, size_t len);
/** Normalise a possibly negative dim for a rank-ndim tensor; -1 + error when out of range. */
int kiln__wrap_dim(int dim, int ndim, const char *op);
/** Error unless a and b live on the same device. */
int kiln__same_device(const kiln_tensor *a, const kiln_tensor *b, const char *op);
/** The error of an op whose device lacks the entry it needs (a NULL slot, a dtype
 *  outside caps, or supports() saying no): names the op, entry, sub-op, dtype and device. */
int kiln__unsupported(const kiln_device *dev, const char *op, kiln_entry entry, int subop, kiln_dtype dt);
/** Whether dev may be given entry (non-NULL, dtype in caps, supports() agrees). Inline
 *  for the common case (no supports entry): a bit test and a dtype test per op. */
bool kiln__supports_slow(const kiln_device *dev, kiln_entry entry, int subop, kiln_dtype dt, const void *params);
static inline bool kiln__supports(const kiln_device *dev, kiln_entry entry, int subop, kiln_dtype dt,
                                  const void *params)
{
    if (!dev->be->supports && (unsigned)entry < KILN_ENTRY_COUNT && (unsigned)dt < KILN_DTYPE_COUNT)
        return ((dev->entries >> entry) & 1u) && dev->caps.dtype[dt];
    return kiln__supports_slow(dev, entry, subop, dt, params);
}
/** 0 when supported, else kiln__unsupported's error. */
int kiln__require(const kiln_device *dev, const char *op, kiln_entry entry, int subop, kiln_dtype dt,
                  const void *params);

static inline kiln_device *kiln__dev(const kiln_tensor *t) { return t->storage->dev; }
static inline const kiln_backend_iface *kiln__be(const kiln_tensor *t) { return t->storage->dev->be; }
/** The queue context work on t's device goes to from this thread. */
static inline void *kiln__ctx(const kiln_tensor *t) { return kiln__qctx(t->storage->dev); }

/* ------------------------------------------------ allocation hook (tensor.c) */

/*
 * A per-thread observer of storage allocations, for an executor that plans its memory
 * (engine/onnx/onnx-arena.c). While installed on a thread, every fresh storage that
 * thread makes on dev (host memory wrapped by kiln__alloc_wrapped excepted) first asks
 * alloc(h, nbytes, &seq): a buffer it returns is used as the storage's buffer (it must
 * come from dev's buffer_wrap_host), NULL means a regular buffer_alloc. When freed is set
 * the storage remembers (tag, seq), and its death on this thread while h is still
 * installed calls freed(h, seq). tag must be nonzero and never reused, so a storage
 * from an earlier hook dying under a later one is not mistaken for its own.
 */
typedef struct kiln__alloc_hook kiln__alloc_hook;
struct kiln__alloc_hook {
    const kiln_device *dev;
    uint64_t tag;
    kiln_buffer *(*alloc)(kiln__alloc_hook *h, size_t nbytes, uint32_t *seq);
    void (*freed)(kiln__alloc_hook *h, uint32_t seq);
};
/** Install h (NULL: none) on the calling thread; returns the hook it replaces. */
kiln__alloc_hook *kiln__alloc_hook_swap(kiln__alloc_hook *h);

/* ------------------------------------------------------- shared internal ops */

/** out-of-place strided copy with conversion: a new contiguous tensor of dtype dt. */
kiln_tensor *kiln__copy_as(kiln_tensor *t, kiln_dtype dt, const char *op);
/** t itself (retained) when it already has dtype dt, else a converted copy. */
kiln_tensor *kiln__cast(kiln_tensor *t, kiln_dtype dt, const char *op);
/** t retained when contiguous, else a contiguous copy. */
kiln_tensor *kiln__contiguous(kiln_tensor *t, const char *op);
/** Copy in into the (possibly strided) view out; shapes equal. */
int kiln__copy_into(kiln_tensor *out, kiln_tensor *in, const char *op);
/** Fill t (any view) with value. */
int kiln__fill(kiln_tensor *t, double value, const char *op);
/** Reshape without scope registration (view when strides allow, else copy). */
kiln_tensor *kiln__reshape(kiln_tensor *t, int ndim, const int64_t *shape, const char *op);
/** A view of t expanded to shape (right-aligned broadcast); error when incompatible. */
kiln_tensor *kiln__expand(kiln_tensor *t, int ndim, const int64_t *shape, const char *op);
/** Broadcast shape of a and b into out; returns out's ndim or -1 with an error. */
int kiln__broadcast_shape(int an, const int64_t *as, int bn, const int64_t *bs, int64_t *out,
                          const char *op, const kiln_tensor *a, const kiln_tensor *b);
/** Views used by several files (ops-shape.c). */
kiln_tensor *kiln__slice(kiln_tensor *t, int dim, int64_t start, int64_t end, int64_t step,
                         const char *op);
kiln_tensor *kiln__narrow(kiln_tensor *t, int dim, int64_t start, int64_t length, const char *op);
/** Descriptor of t broadcast (right-aligned) to shape: 0 strides on stretched dims. */
void kiln__bcast_desc(const kiln_tensor *t, int ndim, const int64_t *shape, kiln_tdesc *d);
/** The integers dt holds without overflow, as [*lo, *hi) (exact in double: the bounds are
 *  powers of two or small): an integer dtype's range, f16's finite one. false for f32, f64
 *  and bf16 (any int64 stays finite) and bool (any value is true or false). */
bool kiln__dtype_int_range(kiln_dtype dt, double *lo, double *hi);
/** 0 when value (its fraction dropped) fits integer dtype dt, else -1 and "op: what VALUE
 *  does not fit DT"; floating dtypes and bool take any value. */
int kiln__check_int_value(kiln_dtype dt, double value, const char *op, const char *what);
/** A 0-d tensor holding value on dev. */
kiln_tensor *kiln__scalar(kiln_device *dev, kiln_dtype dt, double value, const char *op);
/** Check that every value of an integer index tensor lies in [lo, hi): on the device
 *  through index_check when the backend has it (an async device reports a violation at
 *  its next sync), else by reading the extremes. op and noun ("gather", "index") are
 *  static strings naming the caller and the thing checked in the message. */
int kiln__check_range(kiln_tensor *index, int64_t lo, int64_t hi, const char *op, const char *noun);
/** Copy t into out (same shape and dtype, out contiguous and fresh) across devices. */
int kiln__copy_across(kiln_tensor *out, kiln_tensor *t, const char *op);
/** Read the whole tensor to host as doubles (for small internal reads). */
int kiln__read_f64(kiln_tensor *t, double *out, int64_t n, const char *op);
/** Draw from gen (or the process default when NULL); returns the offset to use. */
uint64_t kiln__gen_take(kiln_generator *gen, uint64_t n, uint64_t *seed);

/* Elementwise internals used by composite ops (ops-elementwise.c). */
/* Fused producers (ops-fused.c), for graph executors. Called like the public ops (the
 * result belongs to the innermost scope). kiln__conv_fused = act(conv(x, w, bias) +
 * residual), one pass when the backend can (reading wpacked, w's kiln__conv_pack form, when
 * given and the backend's chosen path uses it); kiln__epilogue = act(y + bias + residual),
 * in place and returning y itself when y is a plain f32 result nobody shares, else as
 * separate ops; kiln__act_apply = the activation alone, as separate ops (t itself for
 * KILN_EPI_NONE). residual, bias may be NULL. */
kiln_tensor *kiln__conv_fused(kiln_tensor *x, kiln_tensor *w, kiln_tensor *wpacked, kiln_tensor *bias,
                              const kiln_conv_opts *opts, int nspatial, kiln_tensor *residual,
                              kiln_epilogue_act act, double alpha, double beta);
/* w's pre-packed form for kiln__conv_fused (wpacked), or NULL without a message when the
 * device has none for it or would not use it for a convolution (opts) over inputs shaped
 * like x. Valid until w changes. */
kiln_tensor *kiln__conv_pack(kiln_tensor *w, kiln_tensor *x, const kiln_conv_opts *opts, int nspatial);
kiln_tensor *kiln__epilogue(kiln_tensor *y, kiln_tensor *bias, kiln_tensor *residual, kiln_epilogue_act act,
                            double alpha, double beta);
kiln_tensor *kiln__act_apply(kiln_tensor *t, kiln_epilogue_act act, double alpha, double beta);
/* act(a·b + bias + residual) (ops-linalg.c): in one backend call when the backend fuses
 * this epilogue into its matmul (matmul_fused: f32, nothing requiring grad, a bias [N], a
 * residual of the product's shape), else kiln_matmul then kiln__epilogue. */
kiln_tensor *kiln__matmul_epilogue(kiln_tensor *a, kiln_tensor *b, kiln_tensor *bias, kiln_tensor *residual,
                                   kiln_epilogue_act act, double alpha, double beta);
kiln_tensor *kiln__unary(kiln_unary_op op, kiln_tensor *t, double alpha, double beta);
kiln_tensor *kiln__binary(kiln_binary_op op, kiln_tensor *a, kiln_tensor *b);

/* Name tables (ops-names.c); the unary and binary ones are in backend.h. */
const char *kiln__reduce_name(kiln_reduce_op op);
const char *kiln__rng_name(kiln_rng_kind k);
const char *kiln__pool_name(kiln_pool_kind k);
int kiln__entry_by_name(const char *name);
/** The name of an entry's sub-op (unary "exp", reduce "sum"...), NULL when it has none. */
const char *kiln__entry_subop_name(kiln_entry e, int subop);

#endif /* KILN_TENSOR_IMPL_H */
