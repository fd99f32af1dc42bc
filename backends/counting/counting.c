/*
 * backends/counting/counting.c — the "counting" decorator: a backend that wraps any other
 * ("counting:cpu", "counting:remote://host:port/cpu"), exposes the same interface, passes
 * every call through, and counts calls per entry, bytes uploaded and downloaded, downloads
 * (host reads, each a wait), syncs and events (kiln_device_counters_get reads them).
 *
 * It proves that decorators compose: every entry, queue context included, goes through
 * it, so an engine path that handed a backend the wrong context or skipped the interface
 * would show here. It always has queues and events of its own (a queue wraps the inner
 * backend's queue, or its device context when it has none), so the engine's cross-queue
 * ordering runs over it even on ref and cpu.
 *
 * Option hide=ENTRY,ENTRY,DTYPE... (e.g. "counting:ref?hide=softmax,matmul,f16") makes the
 * device refuse those entries and dtypes in supports(), for tests of the engine's
 * fallbacks and of its "does not support" errors. Option async=1 makes it report
 * caps.async, so the engine treats it as an asynchronous device (range checks without an
 * index_check entry wait for the next read); the inner kernels still run as they are, so
 * over ref or cpu it suits checks whose index reaches no kernel unchecked (one_hot). Option
 * lose_on=ENTRY makes the device lost at the first call of that entry: the call and every
 * later one fail, and the lost entry says why, as a GPU's would after a fault — so that
 * what kilnd does with a lost device is tested on any machine. Other options go to the
 * inner device.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "error-impl.h"

typedef struct cdev {
    const kiln_backend_iface *in;
    void *ictx;
    bool hide_entry[KILN_ENTRY_COUNT];
    bool hide_dtype[KILN_DTYPE_COUNT];
    bool async;
    int lose_on; /* the entry whose first call loses the device; -1: none */
    atomic_bool lost;
    _Atomic uint64_t calls[KILN_ENTRY_COUNT];
    _Atomic uint64_t uploads, upload_bytes, downloads, download_bytes, syncs, peer_copies, peer_copy_bytes;
    _Atomic uint64_t allocs, frees, events_recorded, event_waits, event_syncs;
} cdev;

/* The context every entry after open receives. */
typedef struct cq {
    cdev *d;
    void *iq;      /* the inner queue context */
    bool owned;    /* opened with the inner queue_open */
} cq;

/* An event: the inner one, or none when the inner backend has no events (complete). */
struct kiln_backend_event {
    kiln_backend_event *inner;
};

#define BUMP(x) atomic_fetch_add_explicit(&(x), 1, memory_order_relaxed)
#define ADD(x, n) atomic_fetch_add_explicit(&(x), (n), memory_order_relaxed)

/* ------------------------------------------------------------------ life cycle */

static int parse_hide(cdev *d, const char *list, const char *source)
{
    while (list && *list) {
        const char *end = strchr(list, ',');
        size_t n = end ? (size_t)(end - list) : strlen(list);
        bool found = false;
        for (int e = 0; e < KILN_ENTRY_COUNT && !found; e++)
            if (strlen(kiln__entry_name((kiln_entry)e)) == n && !strncmp(kiln__entry_name((kiln_entry)e), list, n))
                d->hide_entry[e] = found = true;
        for (int t = 0; t < KILN_DTYPE_COUNT && !found; t++)
            if (strlen(kiln_dtype_name((kiln_dtype)t)) == n && !strncmp(kiln_dtype_name((kiln_dtype)t), list, n))
                d->hide_dtype[t] = found = true;
        if (!found)
            return kiln__error_set("counting: option hide (from %s): '%.*s' is neither an entry nor a dtype", source,
                                   (int)n, list);
        list += n + (end ? 1 : 0);
    }
    return 0;
}

static void *counting_open_opts(const char *spec, int index, kiln_device_opts *o)
{
    cdev *d = calloc(1, sizeof *d);
    if (!d) {
        kiln__error_set("counting: out of memory");
        return NULL;
    }
    const char *src = NULL;
    const char *hide = kiln__device_opts_take(o, "hide", &src);
    static const char *const no_yes[] = {"0", "1"};
    int async = 0;
    if (parse_hide(d, hide, src) < 0 || kiln__device_opt_choice(o, "counting", "async", no_yes, 2, &async) < 0) {
        free(d);
        return NULL;
    }
    d->async = async == 1;
    d->lose_on = -1;
    const char *lose = kiln__device_opts_take(o, "lose_on", &src);
    for (int e = 0; lose && e < KILN_ENTRY_COUNT; e++)
        if (strcmp(kiln__entry_name((kiln_entry)e), lose) == 0)
            d->lose_on = e;
    if (lose && d->lose_on < 0) {
        kiln__error_set("counting: option lose_on (from %s): '%s' is not an entry", src, lose);
        free(d);
        return NULL;
    }
    atomic_init(&d->lost, false);
    /* the rest of the options are the inner device's */
    kiln_device_opts inner = {0};
    for (int i = 0; i < o->n; i++)
        if (!o->kv[i].used) {
            inner.kv[inner.n] = o->kv[i];
            inner.kv[inner.n++].used = false;
            o->kv[i].used = true;
        }
    d->ictx = kiln__backend_open(spec + strlen("counting:"), &inner, &d->in);
    if (!d->ictx) {
        free(d);
        return NULL;
    }
    return d;
}

static void counting_close(void *ctx)
{
    cdev *d = ctx;
    if (d->in->close)
        d->in->close(d->ictx);
    free(d);
}

/* A lost inner device is a lost decorated one. */
static const char *counting_lost(void *ctx)
{
    cdev *d = ctx;
    if (atomic_load(&d->lost))
        return "counting: the device was lost (option lose_on)";
    return d->in->lost ? d->in->lost(d->ictx) : NULL;
}

static void counting_caps(void *ctx, kiln_backend_caps *out)
{
    cdev *d = ctx;
    memset(out, 0, sizeof *out);
    if (d->in->caps)
        d->in->caps(d->ictx, out);
    for (int t = 0; t < KILN_DTYPE_COUNT; t++)
        out->dtype[t] = out->dtype[t] && !d->hide_dtype[t];
    out->async = out->async || d->async;
}

/* ----------------------------------------------------------- queues and events */

static void *counting_queue_open(void *ctx)
{
    cdev *d = ctx;
    cq *q = calloc(1, sizeof *q);
    if (!q) {
        kiln__error_set("counting: out of memory");
        return NULL;
    }
    q->d = d;
    q->iq = d->ictx;
    if (d->in->queue_open) {
        q->iq = d->in->queue_open(d->ictx);
        q->owned = true;
        if (!q->iq) {
            free(q);
            return NULL;
        }
    }
    return q;
}

static void counting_queue_close(void *qctx)
{
    cq *q = qctx;
    if (q->owned && q->d->in->queue_close)
        q->d->in->queue_close(q->iq);
    free(q);
}

static kiln_backend_event *counting_event_record(void *qctx)
{
    cq *q = qctx;
    kiln_backend_event *e = calloc(1, sizeof *e);
    if (!e) {
        kiln__error_set("counting: out of memory");
        return NULL;
    }
    BUMP(q->d->events_recorded);
    if (q->d->in->event_record && !(e->inner = q->d->in->event_record(q->iq))) {
        free(e);
        return NULL;
    }
    return e;
}

static int counting_event_wait(void *qctx, kiln_backend_event *e)
{
    cq *q = qctx;
    BUMP(q->d->event_waits);
    return e->inner && q->d->in->event_wait ? q->d->in->event_wait(q->iq, e->inner) : 0;
}

static int counting_event_sync(void *qctx, kiln_backend_event *e)
{
    cq *q = qctx;
    BUMP(q->d->event_syncs);
    if (!e->inner)
        return 0;
    if (q->d->in->event_sync)
        return q->d->in->event_sync(q->iq, e->inner);
    return q->d->in->sync ? q->d->in->sync(q->iq) : 0;
}

static int counting_event_query(void *qctx, kiln_backend_event *e)
{
    cq *q = qctx;
    if (!e->inner)
        return 1;
    return q->d->in->event_query ? q->d->in->event_query(q->iq, e->inner) : counting_event_sync(qctx, e) == 0;
}

static void counting_event_free(void *qctx, kiln_backend_event *e)
{
    cq *q = qctx;
    if (e->inner && q->d->in->event_free)
        q->d->in->event_free(q->iq, e->inner);
    free(e);
}

static bool counting_supports(void *qctx, const kiln_op_query *query)
{
    cq *q = qctx;
    if ((unsigned)query->entry >= KILN_ENTRY_COUNT || q->d->hide_entry[query->entry] ||
        !kiln__iface_has(q->d->in, query->entry))
        return false;
    if ((unsigned)query->dtype < KILN_DTYPE_COUNT && q->d->hide_dtype[query->dtype])
        return false;
    return q->d->in->supports ? q->d->in->supports(q->iq, query) : true;
}

static int counting_counters(void *ctx, kiln_backend_counters *out)
{
    cdev *d = ctx;
    memset(out, 0, sizeof *out);
    for (int e = 0; e < KILN_ENTRY_COUNT; e++)
        out->calls[e] = atomic_load(&d->calls[e]);
    out->uploads = atomic_load(&d->uploads);
    out->upload_bytes = atomic_load(&d->upload_bytes);
    out->downloads = atomic_load(&d->downloads);
    out->download_bytes = atomic_load(&d->download_bytes);
    out->syncs = atomic_load(&d->syncs);
    out->peer_copies = atomic_load(&d->peer_copies);
    out->peer_copy_bytes = atomic_load(&d->peer_copy_bytes);
    out->allocs = atomic_load(&d->allocs);
    out->frees = atomic_load(&d->frees);
    out->events_recorded = atomic_load(&d->events_recorded);
    out->event_waits = atomic_load(&d->event_waits);
    out->event_syncs = atomic_load(&d->event_syncs);
    return 0;
}

/* -------------------------------------------------------------------- buffers */

static kiln_buffer *counting_buffer_alloc(void *qctx, size_t nbytes)
{
    cq *q = qctx;
    BUMP(q->d->allocs);
    return q->d->in->buffer_alloc(q->iq, nbytes);
}

static void counting_buffer_free(void *qctx, kiln_buffer *b)
{
    cq *q = qctx;
    BUMP(q->d->frees);
    q->d->in->buffer_free(q->iq, b);
}

static int counting_buffer_upload(void *qctx, kiln_buffer *dst, size_t off, const void *src, size_t n)
{
    cq *q = qctx;
    BUMP(q->d->uploads);
    ADD(q->d->upload_bytes, n);
    return q->d->in->buffer_upload(q->iq, dst, off, src, n);
}

static int counting_buffer_download(void *qctx, kiln_buffer *src, size_t off, void *dst, size_t n)
{
    cq *q = qctx;
    BUMP(q->d->downloads);
    ADD(q->d->download_bytes, n);
    return q->d->in->buffer_download(q->iq, src, off, dst, n);
}

static int counting_sync(void *qctx)
{
    cq *q = qctx;
    BUMP(q->d->syncs);
    return q->d->in->sync ? q->d->in->sync(q->iq) : 0;
}

static void *counting_buffer_host_ptr(void *qctx, kiln_buffer *b)
{
    cq *q = qctx;
    return q->d->in->buffer_host_ptr ? q->d->in->buffer_host_ptr(q->iq, b) : NULL;
}

static void *counting_host_alloc(void *qctx, size_t n)
{
    cq *q = qctx;
    if (q->d->in->host_alloc)
        return q->d->in->host_alloc(q->iq, n);
    void *p = aligned_alloc(64, (n + 63) & ~(size_t)63);
    if (!p)
        kiln__error_set_code(KILN_ENOMEM, "counting: out of host memory for %zu bytes", n);
    return p;
}

static void counting_host_free(void *qctx, void *p)
{
    cq *q = qctx;
    if (q->d->in->host_alloc && q->d->in->host_free)
        q->d->in->host_free(q->iq, p);
    else
        free(p);
}

static int counting_buffer_copy_peer(void *qctx, kiln_buffer *dst, size_t doff, void *src_q, kiln_buffer *src,
                                     size_t soff, size_t n)
{
    cq *q = qctx, *s = src_q;
    if (!q->d->in->buffer_copy_peer || s->d->in != q->d->in)
        return KILN_ENOTSUP;
    int rc = q->d->in->buffer_copy_peer(q->iq, dst, doff, s->iq, src, soff, n);
    if (rc == 0) {
        BUMP(q->d->peer_copies);
        ADD(q->d->peer_copy_bytes, n);
    }
    return rc;
}

static kiln_buffer *counting_buffer_wrap_host(void *qctx, void *ptr, size_t n, void (*release)(void *), void *ud)
{
    cq *q = qctx;
    if (!q->d->in->buffer_wrap_host) {
        kiln__error_set("counting: the inner device cannot use host memory in place");
        return NULL;
    }
    BUMP(q->d->allocs);
    return q->d->in->buffer_wrap_host(q->iq, ptr, n, release, ud);
}

/* Lent memory goes to the inner backend as lent where it takes it (a fused device below), else
 * as a plain wrap, counted either way. */
static kiln_buffer *counting_buffer_lend_host(void *qctx, void *ptr, size_t n, void (*release)(void *), void *ud)
{
    cq *q = qctx;
    if (!q->d->in->buffer_lend_host)
        return counting_buffer_wrap_host(qctx, ptr, n, release, ud);
    BUMP(q->d->allocs);
    return q->d->in->buffer_lend_host(q->iq, ptr, n, release, ud);
}

static size_t counting_buffer_trim(void *qctx, size_t bytes)
{
    cq *q = qctx;
    return q->d->in->buffer_trim ? q->d->in->buffer_trim(q->iq, bytes) : 0;
}

/* A detached buffer is neither freed nor allocated: not counted. */
static bool counting_buffer_detach(void *qctx, kiln_buffer *b)
{
    cq *q = qctx;
    return q->d->in->buffer_detach && q->d->in->buffer_reattach ? q->d->in->buffer_detach(q->iq, b) : false;
}

static int counting_buffer_reattach(void *qctx, kiln_buffer *b)
{
    cq *q = qctx;
    return q->d->in->buffer_reattach(q->iq, b);
}

/* ------------------------------------------------------------------ primitives */

/* One wrapper per primitive: count, then call the inner entry with the inner queue. Every
 * slot is filled, so supports() answers for the inner backend's NULL entries, and the
 * engine asks it before each optional one; a call that still arrives gets an error. */
/* Whether a call of entry finds the device lost (lose_on reached now or before). */
static bool lost_at(cdev *d, int entry)
{
    if (entry == d->lose_on)
        atomic_store(&d->lost, true);
    return atomic_load(&d->lost);
}

#define FWD(entry, fn, params, args)                                                                              \
    static int counting_##fn params                                                                               \
    {                                                                                                             \
        cq *q = qctx;                                                                                             \
        BUMP(q->d->calls[entry]);                                                                                 \
        if (lost_at(q->d, entry))                                                                                 \
            return kiln__error_set("%s: the device was lost (counting: option lose_on)", #fn);                    \
        if (!q->d->in->fn)                                                                                        \
            return kiln__error_set("counting: the inner backend %s has no %s", q->d->in->name, #fn);              \
        return q->d->in->fn args;                                                                                 \
    }

#define T const kiln_tdesc *
FWD(KILN_ENTRY_FILL, fill, (void *qctx, T out, double v), (q->iq, out, v))
FWD(KILN_ENTRY_ARANGE, arange, (void *qctx, T out, double a, double b), (q->iq, out, a, b))
FWD(KILN_ENTRY_COPY, copy, (void *qctx, T out, T in), (q->iq, out, in))
FWD(KILN_ENTRY_RNG, rng, (void *qctx, kiln_rng_kind k, T out, uint64_t s, uint64_t o, double a, double b),
    (q->iq, k, out, s, o, a, b))
FWD(KILN_ENTRY_UNARY, unary, (void *qctx, kiln_unary_op op, T out, T in, double a, double b),
    (q->iq, op, out, in, a, b))
FWD(KILN_ENTRY_BINARY, binary, (void *qctx, kiln_binary_op op, T out, T a, T b), (q->iq, op, out, a, b))
FWD(KILN_ENTRY_WHERE, where, (void *qctx, T out, T c, T a, T b), (q->iq, out, c, a, b))
FWD(KILN_ENTRY_REDUCE, reduce, (void *qctx, kiln_reduce_op op, T out, T in, uint32_t m, double p),
    (q->iq, op, out, in, m, p))
FWD(KILN_ENTRY_ARG_REDUCE, arg_reduce, (void *qctx, bool mx, T out, T in, int dim), (q->iq, mx, out, in, dim))
FWD(KILN_ENTRY_CUMSUM, cumsum, (void *qctx, T out, T in, int dim), (q->iq, out, in, dim))
FWD(KILN_ENTRY_SORT, sort, (void *qctx, T v, T i, T in, int dim, bool desc), (q->iq, v, i, in, dim, desc))
FWD(KILN_ENTRY_INDEX_CHECK, index_check, (void *qctx, T ix, int64_t lo, int64_t hi, const char *op, const char *n),
    (q->iq, ix, lo, hi, op, n))
FWD(KILN_ENTRY_GATHER, gather, (void *qctx, T out, T in, int dim, T ix), (q->iq, out, in, dim, ix))
FWD(KILN_ENTRY_SCATTER, scatter, (void *qctx, T out, int dim, T ix, T src, bool acc), (q->iq, out, dim, ix, src, acc))
FWD(KILN_ENTRY_INDEX_SELECT, index_select, (void *qctx, T out, T in, int dim, T ix), (q->iq, out, in, dim, ix))
FWD(KILN_ENTRY_INDEX_ADD, index_add, (void *qctx, T out, int dim, T ix, T src), (q->iq, out, dim, ix, src))
FWD(KILN_ENTRY_MATMUL, matmul, (void *qctx, T out, T a, T b), (q->iq, out, a, b))
FWD(KILN_ENTRY_CONV, conv, (void *qctx, const kiln_conv_params *p, T out, T x, T w, T b), (q->iq, p, out, x, w, b))
FWD(KILN_ENTRY_CONV_BACKWARD_INPUT, conv_backward_input, (void *qctx, const kiln_conv_params *p, T gx, T go, T w),
    (q->iq, p, gx, go, w))
FWD(KILN_ENTRY_CONV_BACKWARD_WEIGHT, conv_backward_weight, (void *qctx, const kiln_conv_params *p, T gw, T x, T go),
    (q->iq, p, gw, x, go))
FWD(KILN_ENTRY_CONV_FUSED, conv_fused,
    (void *qctx, const kiln_conv_params *p, T out, T x, T w, T wp, T b, const kiln_epilogue *ep),
    (q->iq, p, out, x, w, wp, b, ep))
FWD(KILN_ENTRY_CONV_PACK, conv_pack, (void *qctx, T packed, T w), (q->iq, packed, w))
FWD(KILN_ENTRY_EPILOGUE, epilogue, (void *qctx, T out, const kiln_epilogue *ep), (q->iq, out, ep))
FWD(KILN_ENTRY_POOL, pool, (void *qctx, const kiln_pool_params *p, T out, T ix, T x), (q->iq, p, out, ix, x))
FWD(KILN_ENTRY_POOL_BACKWARD, pool_backward, (void *qctx, const kiln_pool_params *p, T gx, T go, T ix),
    (q->iq, p, gx, go, ix))
FWD(KILN_ENTRY_ADAPTIVE_AVG_POOL, adaptive_avg_pool, (void *qctx, int ns, T out, T x), (q->iq, ns, out, x))
FWD(KILN_ENTRY_ADAPTIVE_AVG_POOL_BACKWARD, adaptive_avg_pool_backward, (void *qctx, int ns, T gx, T go),
    (q->iq, ns, gx, go))
FWD(KILN_ENTRY_INTERPOLATE, interpolate, (void *qctx, kiln_interp_mode m, bool ac, T out, T x),
    (q->iq, m, ac, out, x))
FWD(KILN_ENTRY_INTERPOLATE_BACKWARD, interpolate_backward, (void *qctx, kiln_interp_mode m, bool ac, T gx, T go),
    (q->iq, m, ac, gx, go))
FWD(KILN_ENTRY_PAD, pad, (void *qctx, kiln_pad_mode m, T out, T in, const int64_t *pads, double v),
    (q->iq, m, out, in, pads, v))
FWD(KILN_ENTRY_SOFTMAX, softmax, (void *qctx, bool lg, T out, T in, int dim), (q->iq, lg, out, in, dim))
FWD(KILN_ENTRY_LAYER_NORM, layer_norm, (void *qctx, T out, T mean, T rstd, T x, T w, T b, int64_t inner, double eps),
    (q->iq, out, mean, rstd, x, w, b, inner, eps))
FWD(KILN_ENTRY_ADAM_STEP, adam_step, (void *qctx, const kiln_adam_params *p, T prm, T g, T m, T v, T vmax),
    (q->iq, p, prm, g, m, v, vmax))
FWD(KILN_ENTRY_RNN, rnn, (void *qctx, const kiln_rnn_params *p, const kiln_rnn_operands *o), (q->iq, p, o))
FWD(KILN_ENTRY_RNN_PACK, rnn_pack, (void *qctx, const kiln_rnn_params *p, T packed, T w, T r),
    (q->iq, p, packed, w, r))
FWD(KILN_ENTRY_FUSED, fused_run, (void *qctx, const kiln_fused_program *p), (q->iq, p))
#undef T

static int64_t counting_conv_pack_size(void *qctx, const kiln_conv_params *p, const kiln_tdesc *x,
                                       const kiln_tdesc *w)
{
    cq *q = qctx;
    return q->d->in->conv_pack_size ? q->d->in->conv_pack_size(q->iq, p, x, w) : 0;
}

/* Not counted, as conv_pack_size is not: a size query launches nothing. */
static int64_t counting_rnn_pack_size(void *qctx, const kiln_rnn_params *p)
{
    cq *q = qctx;
    return q->d->in->rnn_pack_size ? q->d->in->rnn_pack_size(q->iq, p) : 0;
}

/* The inner device's allocator figures: counting allocates nothing of its own. */
static int counting_memory(void *ctx, kiln_device_memory *out)
{
    cdev *d = ctx;
    if (!d->in->memory) {
        return kiln__error_set_code(KILN_ENOTSUP, "counting: the inner backend %s keeps no memory figures",
                                    d->in->name);
    }
    return d->in->memory(d->ictx, out);
}

static int counting_memory_reset_peak(void *ctx)
{
    cdev *d = ctx;
    if (!d->in->memory_reset_peak) {
        return kiln__error_set_code(KILN_ENOTSUP, "counting: the inner backend %s keeps no memory figures",
                                    d->in->name);
    }
    return d->in->memory_reset_peak(d->ictx);
}

static const kiln_backend_iface counting_iface = {
    .name = "counting",
    .open_opts = counting_open_opts,
    .close = counting_close,
    .caps = counting_caps,
    .lost = counting_lost,
    .memory = counting_memory,
    .memory_reset_peak = counting_memory_reset_peak,
    .queue_open = counting_queue_open,
    .queue_close = counting_queue_close,
    .event_record = counting_event_record,
    .event_wait = counting_event_wait,
    .event_sync = counting_event_sync,
    .event_query = counting_event_query,
    .event_free = counting_event_free,
    .supports = counting_supports,
    .counters = counting_counters,
    .buffer_alloc = counting_buffer_alloc,
    .buffer_free = counting_buffer_free,
    .buffer_upload = counting_buffer_upload,
    .buffer_download = counting_buffer_download,
    .buffer_host_ptr = counting_buffer_host_ptr,
    .sync = counting_sync,
    .host_alloc = counting_host_alloc,
    .host_free = counting_host_free,
    .buffer_copy_peer = counting_buffer_copy_peer,
    .buffer_wrap_host = counting_buffer_wrap_host,
    .buffer_lend_host = counting_buffer_lend_host,
    .buffer_trim = counting_buffer_trim,
    .buffer_detach = counting_buffer_detach,
    .buffer_reattach = counting_buffer_reattach,
    .fill = counting_fill,
    .arange = counting_arange,
    .copy = counting_copy,
    .rng = counting_rng,
    .unary = counting_unary,
    .binary = counting_binary,
    .where = counting_where,
    .reduce = counting_reduce,
    .arg_reduce = counting_arg_reduce,
    .cumsum = counting_cumsum,
    .sort = counting_sort,
    .index_check = counting_index_check,
    .gather = counting_gather,
    .scatter = counting_scatter,
    .index_select = counting_index_select,
    .index_add = counting_index_add,
    .matmul = counting_matmul,
    .conv = counting_conv,
    .conv_backward_input = counting_conv_backward_input,
    .conv_backward_weight = counting_conv_backward_weight,
    .conv_fused = counting_conv_fused,
    .conv_pack_size = counting_conv_pack_size,
    .conv_pack = counting_conv_pack,
    .epilogue = counting_epilogue,
    .pool = counting_pool,
    .pool_backward = counting_pool_backward,
    .adaptive_avg_pool = counting_adaptive_avg_pool,
    .adaptive_avg_pool_backward = counting_adaptive_avg_pool_backward,
    .interpolate = counting_interpolate,
    .interpolate_backward = counting_interpolate_backward,
    .pad = counting_pad,
    .softmax = counting_softmax,
    .layer_norm = counting_layer_norm,
    .adam_step = counting_adam_step,
    .rnn = counting_rnn,
    .rnn_pack_size = counting_rnn_pack_size,
    .rnn_pack = counting_rnn_pack,
    .fused_run = counting_fused_run,
};

const kiln_backend_iface *kiln_backend_counting(void)
{
    return &counting_iface;
}
