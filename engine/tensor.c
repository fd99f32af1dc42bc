/*
 * engine/tensor.c — tensor lifetime, introspection, the dtype table and scopes.
 *
 * Reference counts are atomic because the engine is used from several threads on
 * distinct tensors that may still share a storage (a view handed to another thread).
 * Scopes are per thread: one growing array of held references plus a stack of marks,
 * one per open scope. An entry removed early (kiln_keep, or a release of a held
 * tensor) becomes a hole, so marks never move.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd-impl.h"
#include "tensor-impl.h"

/* ------------------------------------------------------------------------ dtypes */

static const struct {
    const char *name;
    size_t size;
    bool is_float;
} dtype_table[KILN_DTYPE_COUNT] = {
    [KILN_F32] = {"f32", 4, true},  [KILN_F64] = {"f64", 8, true},
    [KILN_F16] = {"f16", 2, true},  [KILN_BF16] = {"bf16", 2, true},
    [KILN_I64] = {"i64", 8, false}, [KILN_I32] = {"i32", 4, false},
    [KILN_U8] = {"u8", 1, false},   [KILN_BOOL] = {"bool", 1, false},
};
_Static_assert(KILN_DTYPE_COUNT == 8, "update dtype_table and kiln_promote_types");

static bool dtype_valid(kiln_dtype dt) { return (unsigned)dt < KILN_DTYPE_COUNT; }

const char *kiln_dtype_name(kiln_dtype dt)
{
    return dtype_valid(dt) ? dtype_table[dt].name : "?";
}

int kiln_dtype_from_name(const char *name)
{
    if (!name)
        return -1;
    for (int i = 0; i < KILN_DTYPE_COUNT; i++)
        if (strcmp(name, dtype_table[i].name) == 0)
            return i;
    return -1;
}

size_t kiln_dtype_size(kiln_dtype dt)
{
    return dtype_valid(dt) ? dtype_table[dt].size : 0;
}

bool kiln_dtype_is_float(kiln_dtype dt)
{
    return dtype_valid(dt) && dtype_table[dt].is_float;
}

bool kiln__dtype_int_range(kiln_dtype dt, double *lo, double *hi)
{
    switch (dt) {
    case KILN_U8: *lo = 0, *hi = 256; return true;
    case KILN_I32: *lo = -2147483648.0, *hi = 2147483648.0; return true;
    case KILN_I64: *lo = -9223372036854775808.0, *hi = 9223372036854775808.0; return true;
    case KILN_F16: *lo = -65504, *hi = 65505; return true;
    default: return false;
    }
}

/* Rank within a category: wider types rank higher. */
static int float_rank(kiln_dtype dt)
{
    switch (dt) {
    case KILN_F16: case KILN_BF16: return 1;
    case KILN_F32: return 2;
    case KILN_F64: return 3;
    default: return 0;
    }
}

static int int_rank(kiln_dtype dt)
{
    switch (dt) {
    case KILN_U8: return 1;
    case KILN_I32: return 2;
    case KILN_I64: return 3;
    default: return 0;
    }
}

kiln_dtype kiln_promote_types(kiln_dtype a, kiln_dtype b)
{
    if (a == b)
        return a;
    if (a == KILN_BOOL)
        return b;
    if (b == KILN_BOOL)
        return a;
    bool fa = kiln_dtype_is_float(a), fb = kiln_dtype_is_float(b);
    if (fa && fb) {
        if ((a == KILN_F16 && b == KILN_BF16) || (a == KILN_BF16 && b == KILN_F16))
            return KILN_F32;
        return float_rank(a) >= float_rank(b) ? a : b;
    }
    if (fa)
        return a;
    if (fb)
        return b;
    /* Both integers: u8 with a signed type gives that signed type, which is always wide
     * enough here because the only signed types are i32 and i64. */
    return int_rank(a) >= int_rank(b) ? a : b;
}

/* ------------------------------------------------------------------ shape helpers */

bool kiln__numel_ok(int ndim, const int64_t *shape, int64_t *numel)
{
    int64_t n = 1;
    bool ok = true;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return false;
        if (shape[i] == 0) {
            n = 0;
            ok = true;
            break;
        }
        if (__builtin_mul_overflow(n, shape[i], &n))
            ok = false;
    }
    if (numel)
        *numel = ok ? n : -1;
    return ok;
}

int64_t kiln__numel(const kiln_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

void kiln__contig_strides(int ndim, const int64_t *shape, int64_t *strides)
{
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i] > 0 ? shape[i] : 1;
    }
}

char *kiln__shape_str(int ndim, const int64_t *shape, char *buf, size_t len)
{
    size_t used = 0;
    if (len == 0)
        return buf;
    buf[0] = '\0';
    int n = snprintf(buf, len, "[");
    used = n > 0 ? (size_t)n : 0;
    for (int i = 0; i < ndim && used < len; i++) {
        n = snprintf(buf + used, len - used, "%s%" PRId64, i ? ", " : "", shape[i]);
        if (n < 0)
            break;
        used += (size_t)n;
    }
    if (used < len)
        snprintf(buf + used, len - used, "]");
    return buf;
}

char *kiln__describe(const kiln_tensor *t, char *buf, size_t len)
{
    if (len == 0)
        return buf;
    if (!t) {
        snprintf(buf, len, "(null)");
        return buf;
    }
    char shape[160];
    kiln__shape_str(t->ndim, t->shape, shape, sizeof shape);
    snprintf(buf, len, "%s%s", kiln_dtype_name(t->dtype), shape);
    return buf;
}

char *kiln_tensor_describe(const kiln_tensor *t, char *buf, size_t len)
{
    return kiln__describe(t, buf, len);
}

int kiln__wrap_dim(int dim, int ndim, const char *op)
{
    int lo = ndim > 0 ? -ndim : -1, hi = ndim > 0 ? ndim - 1 : 0;
    if (dim < lo || dim > hi)
        return kiln__error_set("%s: dim %d out of range for a %d-d tensor (expected %d..%d)", op, dim,
                               ndim, lo, hi);
    return dim < 0 ? dim + (ndim > 0 ? ndim : 1) : dim;
}

int kiln__same_device(const kiln_tensor *a, const kiln_tensor *b, const char *op)
{
    if (kiln__dev(a) == kiln__dev(b))
        return 0;
    return kiln__error_set("%s: tensors on different devices (%s, %s)", op, kiln__dev(a)->spec,
                           kiln__dev(b)->spec);
}

/* Where each entry sits in the interface, to test it for NULL. */
#define ENTRY(e, f) [e] = offsetof(kiln_backend_iface, f)
/* clang-format off */
static const size_t entry_offset[KILN_ENTRY_COUNT] = {
    ENTRY(KILN_ENTRY_FILL, fill), ENTRY(KILN_ENTRY_ARANGE, arange), ENTRY(KILN_ENTRY_COPY, copy),
    ENTRY(KILN_ENTRY_RNG, rng), ENTRY(KILN_ENTRY_UNARY, unary), ENTRY(KILN_ENTRY_BINARY, binary),
    ENTRY(KILN_ENTRY_WHERE, where), ENTRY(KILN_ENTRY_REDUCE, reduce), ENTRY(KILN_ENTRY_ARG_REDUCE, arg_reduce),
    ENTRY(KILN_ENTRY_CUMSUM, cumsum), ENTRY(KILN_ENTRY_SORT, sort), ENTRY(KILN_ENTRY_GATHER, gather),
    ENTRY(KILN_ENTRY_SCATTER, scatter), ENTRY(KILN_ENTRY_INDEX_SELECT, index_select),
    ENTRY(KILN_ENTRY_INDEX_ADD, index_add), ENTRY(KILN_ENTRY_MATMUL, matmul), ENTRY(KILN_ENTRY_CONV, conv),
    ENTRY(KILN_ENTRY_CONV_BACKWARD_INPUT, conv_backward_input),
    ENTRY(KILN_ENTRY_CONV_BACKWARD_WEIGHT, conv_backward_weight), ENTRY(KILN_ENTRY_CONV_FUSED, conv_fused),
    ENTRY(KILN_ENTRY_CONV_PACK, conv_pack), ENTRY(KILN_ENTRY_EPILOGUE, epilogue), ENTRY(KILN_ENTRY_POOL, pool),
    ENTRY(KILN_ENTRY_POOL_BACKWARD, pool_backward), ENTRY(KILN_ENTRY_ADAPTIVE_AVG_POOL, adaptive_avg_pool),
    ENTRY(KILN_ENTRY_ADAPTIVE_AVG_POOL_BACKWARD, adaptive_avg_pool_backward),
    ENTRY(KILN_ENTRY_INTERPOLATE, interpolate), ENTRY(KILN_ENTRY_INTERPOLATE_BACKWARD, interpolate_backward),
    ENTRY(KILN_ENTRY_PAD, pad), ENTRY(KILN_ENTRY_SOFTMAX, softmax), ENTRY(KILN_ENTRY_LAYER_NORM, layer_norm),
    ENTRY(KILN_ENTRY_ADAM_STEP, adam_step), ENTRY(KILN_ENTRY_INDEX_CHECK, index_check), ENTRY(KILN_ENTRY_RNN, rnn),
    ENTRY(KILN_ENTRY_RNN_PACK, rnn_pack),
    ENTRY(KILN_ENTRY_FUSED, fused_run),
};
/* clang-format on */
#undef ENTRY
_Static_assert(KILN_ENTRY_COUNT == 36, "a new kiln_entry needs its slot in entry_offset");

bool kiln__iface_has(const kiln_backend_iface *be, kiln_entry e)
{
    if ((unsigned)e >= KILN_ENTRY_COUNT)
        return false;
    void *const *slot = (void *const *)((const char *)be + entry_offset[e]);
    return *slot != NULL;
}

bool kiln__supports_slow(const kiln_device *dev, kiln_entry entry, int subop, kiln_dtype dt, const void *params)
{
    if (!kiln__iface_has(dev->be, entry))
        return false;
    if ((unsigned)dt < KILN_DTYPE_COUNT && !dev->caps.dtype[dt])
        return false;
    if (!dev->be->supports)
        return true;
    kiln_op_query q = {.entry = entry, .op = subop, .dtype = dt, .params = params};
    return dev->be->supports(kiln__qctx(dev), &q);
}

int kiln__unsupported(const kiln_device *dev, const char *op, kiln_entry entry, int subop, kiln_dtype dt)
{
    char sub[48] = "";
    const char *subname = kiln__entry_subop_name(entry, subop);
    if (subname)
        snprintf(sub, sizeof sub, " (%s)", subname);
    /* the code is kept for kiln_error_code(); the return stays -1, which the ops' callers
     * treat as a plain failure rather than as "try another way" (KILN_ENOTSUP from a backend) */
    kiln__error_set_code(KILN_ENOTSUP, "%s: device '%s' (backend %s) does not support %s%s on %s", op, dev->spec,
                         dev->be->name, kiln__entry_name(entry), sub, kiln_dtype_name(dt));
    return -1;
}

int kiln__require(const kiln_device *dev, const char *op, kiln_entry entry, int subop, kiln_dtype dt,
                  const void *params)
{
    return kiln__supports(dev, entry, subop, dt, params) ? 0 : kiln__unsupported(dev, op, entry, subop, dt);
}

/* --------------------------------------------------------------- construction */

/* The allocation hook (tensor-impl.h). Per-thread state is what the engine otherwise
 * avoids; it is acceptable here because the one user installs it around a single call
 * (kiln_onnx_run) on the thread that makes every allocation it wants to see, and removes
 * it before returning, so no other thread and no other call can observe it. Unset, it
 * costs one thread-local load per allocation and one field test per storage death. */
static _Thread_local kiln__alloc_hook *alloc_hook;

kiln__alloc_hook *kiln__alloc_hook_swap(kiln__alloc_hook *h)
{
    kiln__alloc_hook *old = alloc_hook;
    alloc_hook = h;
    return old;
}

/* ------------------------------------------------- tensor and storage records, reused */

/* Every op makes a tensor record and a storage record and frees two when its inputs die;
 * a small model run op by op spends a tenth of its time in malloc and free for them (the
 * ONNX test encoder on the cpu: 0.073 ms a run with glibc's malloc, 0.064 with jemalloc
 * preloaded). Each thread keeps up to RECORDS_KEPT freed records of each kind and hands
 * them out again, zeroed as calloc would. A record freed on another thread than the one
 * that made it joins the freeing thread's list; a thread's lists are freed when it ends.
 * Under AddressSanitizer nothing is kept, so a use after free is still caught. */
#if defined(__SANITIZE_ADDRESS__)
#define RECORDS_KEPT 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RECORDS_KEPT 0
#endif
#endif
#ifndef RECORDS_KEPT
#define RECORDS_KEPT 64
#endif

typedef struct record_cache {
    void *tensors[RECORDS_KEPT + 1];
    void *storages[RECORDS_KEPT + 1];
    int ntensors, nstorages;
} record_cache;

static _Thread_local record_cache *thread_records;
static pthread_key_t records_key;
static bool records_key_made; /* written once, under records_once */
static pthread_once_t records_once = PTHREAD_ONCE_INIT;

/* The key's destructor, in the ending thread: later frees in that thread (another key's
 * destructor releasing a tensor) make a fresh list, which the next destructor round frees. */
static void records_free(void *p)
{
    record_cache *c = p;
    thread_records = NULL;
    for (int i = 0; i < c->ntensors; i++)
        free(c->tensors[i]);
    for (int i = 0; i < c->nstorages; i++)
        free(c->storages[i]);
    free(c);
}

static void records_key_make(void)
{
    records_key_made = pthread_key_create(&records_key, records_free) == 0;
}

/* The calling thread's lists, made on first use; NULL when caching is off or failed. */
static record_cache *records(void)
{
    if (RECORDS_KEPT == 0)
        return NULL;
    if (thread_records)
        return thread_records;
    pthread_once(&records_once, records_key_make);
    if (!records_key_made)
        return NULL; /* without a key a thread's lists could not be freed when it ends */
    record_cache *c = calloc(1, sizeof *c);
    if (!c || pthread_setspecific(records_key, c) != 0) {
        free(c);
        return NULL;
    }
    thread_records = c;
    return c;
}

/* A record from the list is zeroed as calloc would, each kind with its own constant size:
 * gcc makes a memset of a run-time size a `rep stos` or a loop, and that cost 4-6% of a small
 * model's run, where constant sizes become a few vector stores (meson.build). */
static void *record_take(bool storage)
{
    record_cache *c = records();
    if (c && (storage ? c->nstorages : c->ntensors) > 0) {
        if (storage)
            return memset(c->storages[--c->nstorages], 0, sizeof(kiln_storage));
        return memset(c->tensors[--c->ntensors], 0, sizeof(kiln_tensor));
    }
    return calloc(1, storage ? sizeof(kiln_storage) : sizeof(kiln_tensor));
}

static void record_give(void *p, bool storage)
{
    if (!p)
        return;
    record_cache *c = records();
    if (c && (storage ? c->nstorages : c->ntensors) < RECORDS_KEPT) {
        if (storage)
            c->storages[c->nstorages++] = p;
        else
            c->tensors[c->ntensors++] = p;
        return;
    }
    free(p);
}

/* The one place storages are made. wrap_ptr NULL: a fresh backend buffer; otherwise a
 * buffer over the caller's host memory (see kiln__alloc_wrapped). */
static kiln_tensor *alloc_impl(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape,
                               const char *op, void *wrap_ptr, void (*release)(void *), void *release_ud)
{
    char sh[160];
    if (!dev) {
        kiln__error_set("%s: device is NULL", op);
        return NULL;
    }
    if (!dtype_valid(dt)) {
        kiln__error_set("%s: invalid dtype %d", op, (int)dt);
        return NULL;
    }
    if (ndim < 0 || ndim > KILN_MAX_DIMS || (ndim > 0 && !shape)) {
        kiln__error_set("%s: rank %d is not supported (0..%d)", op, ndim, KILN_MAX_DIMS);
        return NULL;
    }
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            kiln__error_set("%s: negative size in shape %s", op, kiln__shape_str(ndim, shape, sh, sizeof sh));
            return NULL;
        }
    }
    int64_t numel = 0;
    size_t nbytes = 0;
    if (!kiln__numel_ok(ndim, shape, &numel) ||
        __builtin_mul_overflow((size_t)numel, kiln_dtype_size(dt), &nbytes) ||
        nbytes > (size_t)PTRDIFF_MAX) {
        kiln__error_set_code(KILN_ETOOLARGE, "%s: shape %s of %s is too large to address", op,
                             kiln__shape_str(ndim, shape, sh, sizeof sh), kiln_dtype_name(dt));
        return NULL;
    }
    kiln_storage *st = record_take(true);
    kiln_tensor *t = record_take(false);
    if (!st || !t) {
        record_give(st, true);
        record_give(t, false);
        kiln__error_set_code(KILN_ENOMEM, "%s: out of memory", op);
        return NULL;
    }
    /* Empty tensors still get a (tiny) buffer so backends never see a NULL handle. */
    kiln_error_clear();
    kiln__alloc_hook *hook = wrap_ptr ? NULL : alloc_hook;
    if (hook && hook->dev == dev) {
        uint32_t seq = 0;
        st->buf = hook->alloc(hook, nbytes ? nbytes : 1, &seq);
        if (hook->freed) {
            st->hook_tag = hook->tag;
            st->hook_seq = seq;
        }
    }
    /* the caller's memory, which it may touch between any two ops: lent where the backend
     * defers calls (so they run before the op returns), else wrapped */
    kiln_buffer *(*wrap)(void *, void *, size_t, void (*)(void *), void *) = dev->be->buffer_lend_host
                                                                                 ? dev->be->buffer_lend_host
                                                                                 : dev->be->buffer_wrap_host;
    if (!st->buf)
        st->buf = wrap_ptr ? wrap(kiln__qctx(dev), wrap_ptr, nbytes, release, release_ud)
                           : dev->be->buffer_alloc(kiln__qctx(dev), nbytes ? nbytes : 1);
    if (!st->buf && !wrap_ptr && dev->be->buffer_trim) {
        /* The backend's pool may hold freed buffers of other sizes that together would make
         * room: hand them back to the system and try once more, so that a request smaller
         * than one that just ran does not fail for memory the pool keeps idle */
        char first[KILN_ERROR_MAX];
        snprintf(first, sizeof first, "%s", kiln_error());
        int first_code = kiln_error_code();
        if (dev->be->buffer_trim(kiln__qctx(dev), SIZE_MAX) > 0) {
            kiln_error_clear();
            st->buf = dev->be->buffer_alloc(kiln__qctx(dev), nbytes ? nbytes : 1);
        } else {
            kiln__error_set_code(first_code, "%s", first);
        }
    }
    if (!st->buf) {
        char why[KILN_ERROR_MAX];
        snprintf(why, sizeof why, "%s", kiln_error()[0] ? kiln_error() : "out of device memory");
        /* The backend's code when it gave one (a buffer past a device limit, a lost device);
         * a buffer the backend could not have is otherwise memory that ran out. */
        int code = kiln_error_code() ? kiln_error_code() : KILN_ENOMEM;
        record_give(st, true);
        record_give(t, false);
        kiln__error_set_code(code, "%s: cannot allocate %s%s (%zu bytes): %s", op, kiln_dtype_name(dt),
                             kiln__shape_str(ndim, shape, sh, sizeof sh), nbytes, why);
        return NULL;
    }
    atomic_init(&st->refcount, 1);
    st->dev = dev;
    st->nbytes = nbytes;
    kiln__device_retain(dev);
    kiln__queue_adopt(st);
    kiln__stamp(st);

    atomic_init(&t->refcount, 1);
    atomic_init(&t->scope_refs, 0);
    t->storage = st;
    t->dtype = dt;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    kiln__contig_strides(ndim, t->shape, t->strides);
    t->offset = 0;
    return t;
}

kiln_tensor *kiln__alloc(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape,
                         const char *op)
{
    return alloc_impl(dev, dt, ndim, shape, op, NULL, NULL, NULL);
}

const kiln_backend_iface *kiln__device_iface(const kiln_device *dev)
{
    return dev->be;
}

void *kiln__device_ctx(const kiln_device *dev)
{
    return kiln__qctx(dev);
}

const kiln_backend_caps *kiln__device_caps(const kiln_device *dev)
{
    return &dev->caps;
}

/* caps.host_memory too: a decorator (fused, counting) has the entry whatever its inner
 * device is, and only a device whose buffers are host memory can take the caller's */
bool kiln__can_wrap_host(const kiln_device *dev)
{
    return dev && dev->be->buffer_wrap_host && dev->caps.host_memory;
}

kiln_tensor *kiln__alloc_wrapped(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape, void *ptr,
                                 void (*release)(void *), void *release_ud, const char *op)
{
    if (!ptr) {
        kiln__error_set("%s: data is NULL", op);
        return NULL;
    }
    if (!kiln__can_wrap_host(dev)) {
        kiln__error_set("%s: device %s cannot use host memory in place (its tensors live in its own memory); "
                        "copy the data in with kiln_from_data",
                        op, kiln_device_name(dev));
        return NULL;
    }
    return alloc_impl(dev, dt, ndim, shape, op, ptr, release, release_ud);
}

kiln_tensor *kiln__view(const kiln_tensor *base, int ndim, const int64_t *shape,
                        const int64_t *strides, int64_t offset)
{
    kiln_tensor *t = record_take(false);
    if (!t) {
        kiln__error_set("view: out of memory");
        return NULL;
    }
    atomic_init(&t->refcount, 1);
    atomic_init(&t->scope_refs, 0);
    t->storage = base->storage;
    atomic_fetch_add(&t->storage->refcount, 1);
    t->dtype = base->dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->strides[i] = strides[i];
    }
    t->offset = offset;
    return t;
}

void kiln__desc(const kiln_tensor *t, kiln_tdesc *d)
{
    memset(d, 0, sizeof *d);
    kiln__queue_touch(t->storage);
    kiln__spoil_check(t->storage);
    d->buf = t->storage->buf;
    d->offset = t->offset;
    d->dtype = t->dtype;
    d->ndim = t->ndim;
    for (int i = 0; i < t->ndim; i++) {
        d->shape[i] = t->shape[i];
        d->strides[i] = t->strides[i];
    }
}

/* ----------------------------------------------------------------- lifetime */

static void storage_release(kiln_storage *st)
{
    if (atomic_fetch_sub(&st->refcount, 1) != 1)
        return;
    if (st->hook_tag && alloc_hook && alloc_hook->tag == st->hook_tag && alloc_hook->freed)
        alloc_hook->freed(alloc_hook, st->hook_seq);
    kiln_device *dev = st->dev;
    if (dev->track)
        kiln__queue_free_buffer(st);   /* ordered after every queue that used it */
    else
        dev->be->buffer_free(kiln__qctx(dev), st->buf);
    record_give(st, true);
    kiln__device_release(dev);
}

static void tensor_drop(kiln_tensor *t)
{
    if (atomic_fetch_sub(&t->refcount, 1) != 1)
        return;
    /* The tape hangs off the tensors that require grad: their death frees it. */
    if (t->autograd)
        kiln__ad_free_meta(t);
    storage_release(t->storage);
    record_give(t, false);
}

kiln_tensor *kiln_tensor_retain(kiln_tensor *t)
{
    if (t)
        atomic_fetch_add(&t->refcount, 1);
    return t;
}

/* ------------------------------------------------------------------- scopes */

typedef struct scope_stack {
    kiln_tensor **items;
    size_t n, cap;
    size_t *marks;
    size_t nmarks, markcap;
    size_t lost;   /* scopes begun while out of memory: ended without releasing */
} scope_stack;

static _Thread_local scope_stack scopes;

void kiln_scope_begin(void)
{
    if (scopes.lost || scopes.nmarks == scopes.markcap) {
        size_t cap = scopes.markcap ? 2 * scopes.markcap : 16;
        size_t *m = scopes.lost ? NULL : realloc(scopes.marks, cap * sizeof *m);
        if (!m) {
            /* Later tensors land in the enclosing scope (or none); still balanced. */
            scopes.lost++;
            kiln__error_set("kiln_scope_begin: out of memory");
            return;
        }
        scopes.marks = m;
        scopes.markcap = cap;
    }
    scopes.marks[scopes.nmarks++] = scopes.n;
}

static void scope_trim(void)
{
    size_t floor = scopes.nmarks ? scopes.marks[scopes.nmarks - 1] : 0;
    while (scopes.n > floor && scopes.items[scopes.n - 1] == NULL)
        scopes.n--;
}

void kiln_scope_end(void)
{
    if (scopes.lost) {
        scopes.lost--;
        return;
    }
    if (scopes.nmarks == 0)
        return;
    size_t mark = scopes.marks[--scopes.nmarks];
    /* Release newest first: a composite's temporaries go before the views they feed. */
    while (scopes.n > mark) {
        kiln_tensor *t = scopes.items[--scopes.n];
        if (t) {
            atomic_fetch_sub(&t->scope_refs, 1);
            tensor_drop(t);
        }
    }
    if (scopes.nmarks == 0 && scopes.n == 0) {
        free(scopes.items);
        free(scopes.marks);
        memset(&scopes, 0, sizeof scopes);
    }
}

static bool scope_remove(kiln_tensor *t)
{
    for (size_t i = scopes.n; i-- > 0;) {
        if (scopes.items[i] == t) {
            scopes.items[i] = NULL;
            atomic_fetch_sub(&t->scope_refs, 1);
            scope_trim();
            return true;
        }
    }
    return false;
}

/* An op that has nothing to do (a cast to the same dtype, contiguous of a contiguous
 * tensor, to_device onto the same device) computes its result as its input with one
 * more reference. Handing that same object back would leave two owners — the caller's
 * earlier reference and this result, possibly held by a scope — of one object, and no
 * way to tell which one a later kiln_tensor_release gives back. So the public result
 * is always an object of its own: a view over the same storage, linked to the input
 * in the autodiff graph like any other op's output. */
static kiln_tensor *own_object(kiln_tensor *t)
{
    if (atomic_load(&t->refcount) <= 1)
        return t;
    kiln_tensor *v = kiln__view(t, t->ndim, t->shape, t->strides, t->offset);
    if (v && kiln__ad_want(t))
        v = kiln__grad_identity(v, t, "alias");
    tensor_drop(t);
    return v;
}

kiln_tensor *kiln__ret(kiln_tensor *t)
{
    if (t)
        t = own_object(t);
    if (!t || scopes.nmarks == 0)
        return t;
    if (scopes.n == scopes.cap) {
        size_t cap = scopes.cap ? 2 * scopes.cap : 64;
        kiln_tensor **items = realloc(scopes.items, cap * sizeof *items);
        if (!items) {
            tensor_drop(t);
            kiln__error_set("scope: out of memory registering a tensor");
            return NULL;
        }
        scopes.items = items;
        scopes.cap = cap;
    }
    scopes.items[scopes.n++] = t;
    atomic_fetch_add(&t->scope_refs, 1);
    return t;
}

kiln_tensor *kiln__scope_end_keep(kiln_tensor *r)
{
    kiln_keep(r);
    kiln_scope_end();
    return kiln__ret(r);
}

kiln_tensor *kiln_keep(kiln_tensor *t)
{
    if (t && atomic_load(&t->scope_refs) > 0)
        scope_remove(t);
    return t;
}

void kiln_tensor_release(kiln_tensor *t)
{
    if (!t)
        return;
    /* When every reference is held by scopes, the caller is giving back one a scope
     * would have released: forget that entry so scope_end does not release it again.
     * Otherwise an unscoped reference (a retain) is being dropped and the scopes keep
     * theirs, which is what lets internal code retain and release scope-held tensors. */
    int held = atomic_load(&t->scope_refs);
    if (held > 0 && atomic_load(&t->refcount) <= held)
        scope_remove(t);
    tensor_drop(t);
}

/* -------------------------------------------------------------- introspection */

int kiln_tensor_ndim(const kiln_tensor *t) { return t ? t->ndim : -1; }

int64_t kiln_tensor_dim(const kiln_tensor *t, int d)
{
    if (!t)
        return -1;
    int w = kiln__wrap_dim(d, t->ndim, "kiln_tensor_dim");
    if (w < 0)
        return -1;
    return t->ndim == 0 ? 1 : t->shape[w];
}

const int64_t *kiln_tensor_shape(const kiln_tensor *t) { return t ? t->shape : NULL; }
const int64_t *kiln_tensor_strides(const kiln_tensor *t) { return t ? t->strides : NULL; }
int64_t kiln_tensor_numel(const kiln_tensor *t) { return t ? kiln__numel(t) : -1; }
kiln_dtype kiln_tensor_dtype(const kiln_tensor *t) { return t ? t->dtype : KILN_DTYPE_COUNT; }
kiln_device *kiln_tensor_device(const kiln_tensor *t) { return t ? kiln__dev(t) : NULL; }

bool kiln_tensor_is_contiguous(const kiln_tensor *t)
{
    if (!t)
        return false;
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] == 0)
            return true;
        if (t->shape[i] != 1 && t->strides[i] != expect)
            return false;
        expect *= t->shape[i];
    }
    return true;
}

bool kiln_tensor_shares_storage(const kiln_tensor *a, const kiln_tensor *b)
{
    return a && b && a->storage == b->storage;
}
