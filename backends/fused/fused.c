/*
 * backends/fused/fused.c — the "fused" decorator: automatic kernel fusion over any
 * backend ("fused:cpu", "fused:counting:cpu"; the engine also applies it to a device
 * opened with the option fusion=on).
 *
 * Elementwise calls (fill, copy, unary, binary, where) are not run when they arrive: each
 * queue records them into a pending group (fused-group.c), which a matmul or a
 * convolution may head (its consumers become its epilogue) and a softmax, layer norm or
 * row reduction may join. Any other entry, an upload,
 * a download, a host pointer, a sync, an event, or a call that cannot join the group
 * flushes it first: the group becomes one kiln_fused_program that the inner backend's
 * fused_run (its code generator hook) runs as one kernel, or, where the inner backend
 * has none, is replayed call by call. Buffers are the inner backend's own handles, so
 * every entry that is not recorded forwards its descriptors untouched; a buffer freed
 * while the group is pending is never stored into and returns to the inner backend
 * after the flush.
 *
 * Like the counting decorator it always has queues and events of its own (a queue wraps
 * the inner backend's queue, or its device context when it has none), because recording
 * an event must flush that queue's group before another queue relies on its work.
 *
 * Option codegen=off keeps the recording and the flushes but replays every group, so a
 * test or a measurement can compare the two with everything else equal. Option
 * min_elements=N: a call whose operands all have fewer elements than N, arriving with no
 * group pending, runs as it is (default: the inner backend's fusion_min_elements, 65536
 * on the cpu, 0 elsewhere; 0 records every call). Other options go to the inner device.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error-impl.h"
#include "fused-impl.h"

/* An event: the inner one, or none when the inner backend has no events (complete). */
struct kiln_backend_event {
    kiln_backend_event *inner;
};

/* ------------------------------------------------------------------ life cycle */

static void *fused_open_opts(const char *spec, int index, kiln_device_opts *o)
{
    (void)index;
    fdev *d = calloc(1, sizeof *d);
    if (!d) {
        kiln__error_set("fused: out of memory");
        return NULL;
    }
    /* What the inner device is opened with: the options not yet used, and the defaults and
     * environment of its own backend (kiln_device_defaults_set("vulkan", "codegen=off") is
     * meant for vulkan's fused devices), from which this decorator takes its keys first; the
     * inner open finds them there, used, and adds nothing over them. */
    kiln_device_opts inner = {0};
    for (int i = 0; i < o->n; i++)
        if (!o->kv[i].used) {
            inner.kv[inner.n] = o->kv[i];
            inner.kv[inner.n++].used = false;
            o->kv[i].used = true;
        }
    const char *inner_spec = spec + strlen("fused:");
    char inner_backend[32];
    snprintf(inner_backend, sizeof inner_backend, "%.*s", (int)strcspn(inner_spec, ":?"), inner_spec);
    static const char *const on_off[] = {"on", "off"};
    int codegen = 0;
    long min_elements = -1;
    if (kiln__device_opts_env(inner_backend, &inner) < 0 ||
        kiln__device_opt_choice(&inner, "fused", "codegen", on_off, 2, &codegen) < 0 ||
        kiln__device_opt_long(&inner, "fused", "min_elements", 0, 1L << 40, &min_elements) < 0) {
        free(d);
        return NULL;
    }
    d->replay = codegen == 1;
    kiln__fused_bufset_init(&d->wrapped);
    kiln__fused_bufset_init(&d->lent);
    d->ictx = kiln__backend_open(inner_spec, &inner, &d->in);
    if (!d->ictx) {
        kiln__fused_bufset_destroy(&d->wrapped);
        kiln__fused_bufset_destroy(&d->lent);
        free(d);
        return NULL;
    }
    kiln_backend_caps caps = {0};
    if (d->in->caps)
        d->in->caps(d->ictx, &caps);
    d->min_elements = min_elements >= 0 ? min_elements : caps.fusion_min_elements;
    d->row_reduce = caps.fused_row_reduce;
    d->strided_products = caps.matmul_strided_out;
    return d;
}

static void fused_close(void *ctx)
{
    fdev *d = ctx;
    if (d->in->close)
        d->in->close(d->ictx);
    kiln__fused_bufset_destroy(&d->wrapped);
    kiln__fused_bufset_destroy(&d->lent);
    free(d);
}

static void fused_caps(void *ctx, kiln_backend_caps *out)
{
    fdev *d = ctx;
    memset(out, 0, sizeof *out);
    if (d->in->caps)
        d->in->caps(d->ictx, out);
}

/* ----------------------------------------------------------- queues and events */

static void *fused_queue_open(void *ctx)
{
    fdev *d = ctx;
    fq *q = calloc(1, sizeof *q);
    if (!q) {
        kiln__error_set("fused: out of memory");
        return NULL;
    }
    pthread_mutex_init(&q->mu, NULL);
    q->d = d;
    q->iq = d->ictx;
    if (d->in->queue_open) {
        q->iq = d->in->queue_open(d->ictx);
        q->owned = true;
        if (!q->iq) {
            pthread_mutex_destroy(&q->mu);
            free(q);
            return NULL;
        }
    }
    return q;
}

static void fused_queue_close(void *qctx)
{
    fq *q = qctx;
    (void)kiln__fused_flush_pending(q); /* the engine synced first: nothing is pending */
    free(q->freed);
    pthread_mutex_destroy(&q->mu);
    if (q->owned && q->d->in->queue_close)
        q->d->in->queue_close(q->iq);
    free(q);
}

static kiln_backend_event *fused_event_record(void *qctx)
{
    fq *q = qctx;
    if (kiln__fused_flush_pending(q) < 0)
        return NULL;
    kiln_backend_event *e = calloc(1, sizeof *e);
    if (!e) {
        kiln__error_set("fused: out of memory");
        return NULL;
    }
    if (q->d->in->event_record && !(e->inner = q->d->in->event_record(q->iq))) {
        free(e);
        return NULL;
    }
    return e;
}

static int fused_event_wait(void *qctx, kiln_backend_event *e)
{
    fq *q = qctx;
    return e->inner && q->d->in->event_wait ? q->d->in->event_wait(q->iq, e->inner) : 0;
}

static int fused_event_sync(void *qctx, kiln_backend_event *e)
{
    fq *q = qctx;
    if (!e->inner)
        return 0;
    if (q->d->in->event_sync)
        return q->d->in->event_sync(q->iq, e->inner);
    return q->d->in->sync ? q->d->in->sync(q->iq) : 0;
}

static int fused_event_query(void *qctx, kiln_backend_event *e)
{
    fq *q = qctx;
    if (!e->inner)
        return 1;
    return q->d->in->event_query ? q->d->in->event_query(q->iq, e->inner) : fused_event_sync(qctx, e) == 0;
}

static void fused_event_free(void *qctx, kiln_backend_event *e)
{
    fq *q = qctx;
    if (e->inner && q->d->in->event_free)
        q->d->in->event_free(q->iq, e->inner);
    free(e);
}

static bool fused_supports(void *qctx, const kiln_op_query *query)
{
    fq *q = qctx;
    if (!kiln__iface_has(q->d->in, query->entry))
        return false;
    return q->d->in->supports ? q->d->in->supports(q->iq, query) : true;
}

static int fused_counters(void *ctx, kiln_backend_counters *out)
{
    fdev *d = ctx;
    if (!d->in->counters)
        return kiln__error_set("fused: the inner device %s keeps no counters (open \"fused:counting:...\")",
                               d->in->name);
    return d->in->counters(d->ictx, out);
}

static int fused_memory(void *ctx, kiln_device_memory *out)
{
    fdev *d = ctx;
    if (!d->in->memory) {
        return kiln__error_set_code(KILN_ENOTSUP, "fused: the inner device %s keeps no memory figures",
                                    d->in->name);
    }
    return d->in->memory(d->ictx, out);
}

static int fused_memory_reset_peak(void *ctx)
{
    fdev *d = ctx;
    if (!d->in->memory_reset_peak) {
        return kiln__error_set_code(KILN_ENOTSUP, "fused: the inner device %s keeps no memory figures",
                                    d->in->name);
    }
    return d->in->memory_reset_peak(d->ictx);
}

static const char *fused_lost(void *ctx)
{
    fdev *d = ctx;
    return d->in->lost ? d->in->lost(d->ictx) : NULL;
}

/* -------------------------------------------------------------------- buffers: fused-buffers.c */

/* ------------------------------------------------------------------ primitives */

/* Whether a call with these operands (NULL or a NULL buf: none) is too small to start a
 * group on this device (kiln_backend_caps): every operand under min_elements. */
static bool too_small(const fq *q, const kiln_tdesc *a, const kiln_tdesc *b, const kiln_tdesc *c,
                      const kiln_tdesc *d)
{
    int64_t m = q->d->min_elements;
    const kiln_tdesc *ops[4] = {a, b, c, d};
    for (int i = 0; i < 4 && m > 0; i++)
        if (ops[i] && ops[i]->buf && kiln__fused_numel(ops[i]) >= m)
            return false;
    return m > 0;
}

static bool below_fusion_size(const fq *q, const frec *r)
{
    return too_small(q, &r->out, &r->x, &r->y, &r->z);
}

/* A fill of at most this many elements (a constant the engine makes between two calls
 * of a chain: the zero of a relu's backward) never holds a group back: when it cannot
 * join a pending group and shares no buffer with it, it runs ahead of it, whatever the
 * device's min_elements. Other tiny calls still flush and start a group of their own,
 * which on a GPU saves the launches a run of them would cost. */
#define FUSED_TINY_FILL 256

static bool tiny_fill(const frec *r)
{
    return r->entry == KILN_ENTRY_FILL && kiln__fused_numel(&r->out) <= FUSED_TINY_FILL;
}

/* Whether such a call goes straight to the inner backend: no group pending and too small.
 * Checked before a record is built, since most calls of a small model take this path and
 * the record (four descriptors) costs more to fill than the call it describes. */
static bool idle_and_small(const fq *q, const kiln_tdesc *a, const kiln_tdesc *b, const kiln_tdesc *c,
                           const kiln_tdesc *d)
{
    return !atomic_load_explicit(&q->pending, memory_order_acquire) && too_small(q, a, b, c, d);
}

/* Whether r reads or writes a buffer the caller lent (buffer_lend_host): then it runs before
 * its entry returns, with the group it joined, so that the caller's next write to its memory
 * cannot reach it and its result is in that memory, as on a backend that runs calls at once. */
static bool touches_lent(fq *q, const frec *r)
{
    fused_bufset *lent = &q->d->lent;
    return kiln__fused_bufset_has(lent, r->out.buf) || kiln__fused_bufset_has(lent, r->x.buf) ||
           kiln__fused_bufset_has(lent, r->y.buf) || kiln__fused_bufset_has(lent, r->z.buf);
}

/* The recorded entries: join the group, or flush and forward. */
static int record_or_run(fq *q, const frec *r)
{
    int rc = 0;
    bool recorded = false;
    /* a small call with no group pending runs as it is; one after a pending group joins
     * it, where it may end a chain (a reduction's small output) */
    if (atomic_load(&q->pending) || !below_fusion_size(q, r)) {
        pthread_mutex_lock(&q->mu);
        bool small = below_fusion_size(q, r);
        rc = q->nrec == 0 && small ? 0 : kiln__fused_record(q, r, small || tiny_fill(r));
        recorded = rc == 1;
        if (rc == 0 || (recorded && touches_lent(q, r)))
            rc = kiln__fused_flush(q);
        else if (rc == 2)
            rc = 0; /* runs now, ahead of the group it shares nothing with */
        kiln__fused_unlock_group(q);
    }
    if (rc < 0)
        return rc;
    if (recorded)
        return 0;
    const kiln_backend_iface *in = q->d->in;
    switch (r->entry) {
    case KILN_ENTRY_FILL: return in->fill(q->iq, &r->out, r->alpha);
    case KILN_ENTRY_COPY: return in->copy(q->iq, &r->out, &r->x);
    case KILN_ENTRY_UNARY: return in->unary(q->iq, (kiln_unary_op)r->op, &r->out, &r->x, r->alpha, r->beta);
    case KILN_ENTRY_WHERE: return in->where(q->iq, &r->out, &r->x, &r->y, &r->z);
    case KILN_ENTRY_REDUCE: return in->reduce(q->iq, (kiln_reduce_op)r->op, &r->out, &r->x, r->mask, r->alpha);
    case KILN_ENTRY_SOFTMAX: return in->softmax(q->iq, r->op != 0, &r->out, &r->x, (int)r->mask);
    case KILN_ENTRY_MATMUL: return in->matmul(q->iq, &r->out, &r->x, &r->y);
    case KILN_ENTRY_CONV: return in->conv(q->iq, &r->conv, &r->out, &r->x, &r->y, r->z.buf ? &r->z : NULL);
    case KILN_ENTRY_LAYER_NORM:
        return in->layer_norm(q->iq, &r->out, NULL, NULL, &r->x, r->y.buf ? &r->y : NULL, r->z.buf ? &r->z : NULL,
                              r->inner, r->alpha);
    default: return in->binary(q->iq, (kiln_binary_op)r->op, &r->out, &r->x, &r->y);
    }
}

static int fused_reduce(void *qctx, kiln_reduce_op op, const kiln_tdesc *out, const kiln_tdesc *in, uint32_t mask,
                        double param)
{
    fq *q = qctx;
    if (idle_and_small(q, out, in, NULL, NULL))
        return q->d->in->reduce(q->iq, op, out, in, mask, param);
    frec r = {.entry = KILN_ENTRY_REDUCE, .op = (int)op, .out = *out, .x = *in, .mask = mask, .alpha = param};
    return record_or_run(qctx, &r);
}

static int fused_softmax(void *qctx, bool log, const kiln_tdesc *out, const kiln_tdesc *in, int dim)
{
    fq *q = qctx;
    if (idle_and_small(q, out, in, NULL, NULL))
        return q->d->in->softmax(q->iq, log, out, in, dim);
    frec r = {.entry = KILN_ENTRY_SOFTMAX, .op = log, .out = *out, .x = *in, .mask = (uint32_t)dim};
    return record_or_run(qctx, &r);
}

static int fused_matmul(void *qctx, const kiln_tdesc *out, const kiln_tdesc *a, const kiln_tdesc *b)
{
    fq *q = qctx;
    if (!q->d->in->matmul)
        return kiln__error_set("fused: the inner backend %s has no matmul", q->d->in->name);
    if (idle_and_small(q, out, a, b, NULL))
        return q->d->in->matmul(q->iq, out, a, b);
    frec r = {.entry = KILN_ENTRY_MATMUL, .out = *out, .x = *a, .y = *b};
    return record_or_run(qctx, &r);
}

/* A layer norm without mean and rstd outputs may join the group as a row op; with them
 * (or without an inner entry) it flushes and forwards. */
static int fused_layer_norm(void *qctx, const kiln_tdesc *out, const kiln_tdesc *mean, const kiln_tdesc *rstd,
                            const kiln_tdesc *x, const kiln_tdesc *w, const kiln_tdesc *b, int64_t inner,
                            double eps)
{
    fq *q = qctx;
    if (mean || rstd || !q->d->in->layer_norm) {
        KILN__FUSED_FLUSH(q);
        if (!q->d->in->layer_norm)
            return kiln__error_set("fused: the inner backend %s has no layer_norm", q->d->in->name);
        return q->d->in->layer_norm(q->iq, out, mean, rstd, x, w, b, inner, eps);
    }
    if (idle_and_small(q, out, x, w, b))
        return q->d->in->layer_norm(q->iq, out, NULL, NULL, x, w, b, inner, eps);
    frec r = {.entry = KILN_ENTRY_LAYER_NORM, .out = *out, .x = *x, .inner = inner, .alpha = eps};
    if (w)
        r.y = *w;
    if (b)
        r.z = *b;
    return record_or_run(qctx, &r);
}

static int fused_conv(void *qctx, const kiln_conv_params *p, const kiln_tdesc *out, const kiln_tdesc *x,
                      const kiln_tdesc *w, const kiln_tdesc *b)
{
    fq *q = qctx;
    if (!q->d->in->conv)
        return kiln__error_set("fused: the inner backend %s has no conv", q->d->in->name);
    if (idle_and_small(q, out, x, w, b))
        return q->d->in->conv(q->iq, p, out, x, w, b);
    frec r = {.entry = KILN_ENTRY_CONV, .out = *out, .x = *x, .y = *w, .conv = *p};
    if (b)
        r.z = *b;
    return record_or_run(qctx, &r);
}

static int fused_where(void *qctx, const kiln_tdesc *out, const kiln_tdesc *c, const kiln_tdesc *a,
                       const kiln_tdesc *b)
{
    fq *q = qctx;
    if (idle_and_small(q, out, c, a, b))
        return q->d->in->where(q->iq, out, c, a, b);
    frec r = {.entry = KILN_ENTRY_WHERE, .out = *out, .x = *c, .y = *a, .z = *b};
    return record_or_run(qctx, &r);
}

static int fused_fill(void *qctx, const kiln_tdesc *out, double v)
{
    fq *q = qctx;
    if (idle_and_small(q, out, NULL, NULL, NULL))
        return q->d->in->fill(q->iq, out, v);
    frec r = {.entry = KILN_ENTRY_FILL, .out = *out, .alpha = v};
    return record_or_run(qctx, &r);
}

static int fused_copy(void *qctx, const kiln_tdesc *out, const kiln_tdesc *in)
{
    fq *q = qctx;
    if (idle_and_small(q, out, in, NULL, NULL))
        return q->d->in->copy(q->iq, out, in);
    frec r = {.entry = KILN_ENTRY_COPY, .out = *out, .x = *in};
    return record_or_run(qctx, &r);
}

static int fused_unary(void *qctx, kiln_unary_op op, const kiln_tdesc *out, const kiln_tdesc *in, double a,
                       double b)
{
    fq *q = qctx;
    if (idle_and_small(q, out, in, NULL, NULL))
        return q->d->in->unary(q->iq, op, out, in, a, b);
    frec r = {.entry = KILN_ENTRY_UNARY, .op = (int)op, .out = *out, .x = *in, .alpha = a, .beta = b};
    return record_or_run(qctx, &r);
}

static int fused_binary(void *qctx, kiln_binary_op op, const kiln_tdesc *out, const kiln_tdesc *a,
                        const kiln_tdesc *b)
{
    fq *q = qctx;
    if (idle_and_small(q, out, a, b, NULL))
        return q->d->in->binary(q->iq, op, out, a, b);
    frec r = {.entry = KILN_ENTRY_BINARY, .op = (int)op, .out = *out, .x = *a, .y = *b};
    return record_or_run(qctx, &r);
}

/* A max pooling's gradient after the zero fill of its grad_x heads a group (the fill
 * dropped, its consumers fused as its epilogue); anything else flushes and forwards. */
static int fused_pool_backward(void *qctx, const kiln_pool_params *p, const kiln_tdesc *gx, const kiln_tdesc *go,
                               const kiln_tdesc *ix)
{
    fq *q = qctx;
    if (!q->d->in->pool_backward)
        return kiln__error_set("fused: the inner backend %s has no pool_backward", q->d->in->name);
    if (atomic_load(&q->pending)) {
        frec r = {.entry = KILN_ENTRY_POOL_BACKWARD, .out = *gx, .x = *go, .pool = *p};
        if (ix)
            r.y = *ix;
        pthread_mutex_lock(&q->mu);
        int rc = kiln__fused_record_pool_grad(q, &r);
        if (rc == 0) {
            rc = kiln__fused_flush(q);
        } else if (rc == 1 && touches_lent(q, &r)) {
            int flushed = kiln__fused_flush(q);
            rc = flushed < 0 ? flushed : rc;
        }
        kiln__fused_unlock_group(q);
        if (rc != 0)
            return rc > 0 ? 0 : rc; /* recorded, or an error */
    }
    return q->d->in->pool_backward(q->iq, p, gx, go, ix);
}

/* Random draws into a buffer the pending group does not touch (a fresh one: dropout's
 * mask) run ahead of the group and leave it pending, so the product or softmax before a
 * dropout and the dropout's multiply that reads the mask stay one group. Flushing here
 * instead stored every value the group had made, live or not, and read the last back. */
static int fused_rng(void *qctx, kiln_rng_kind kind, const kiln_tdesc *out, uint64_t seed, uint64_t offset,
                     double a, double b)
{
    fq *q = qctx;
    if (!q->d->in->rng)
        return kiln__error_set("fused: the inner backend %s has no rng", q->d->in->name);
    if (atomic_load(&q->pending)) {
        pthread_mutex_lock(&q->mu);
        int rc = kiln__fused_group_uses(q, out->buf) ? kiln__fused_flush(q) : 0;
        kiln__fused_unlock_group(q);
        if (rc < 0)
            return rc;
    }
    return q->d->in->rng(q->iq, kind, out, seed, offset, a, b);
}

/* Every other primitive: flush the group, then forward. Every slot is filled, so
 * supports() answers for the inner backend's NULL entries. */
#define FWD(fn, params, args)                                                                                     \
    static int fused_##fn params                                                                                  \
    {                                                                                                             \
        fq *q = qctx;                                                                                             \
        KILN__FUSED_FLUSH(q);                                                                                     \
        if (!q->d->in->fn)                                                                                        \
            return kiln__error_set("fused: the inner backend %s has no %s", q->d->in->name, #fn);                 \
        return q->d->in->fn args;                                                                                 \
    }

#define T const kiln_tdesc *
FWD(arange, (void *qctx, T out, double a, double b), (q->iq, out, a, b))
FWD(arg_reduce, (void *qctx, bool mx, T out, T in, int dim), (q->iq, mx, out, in, dim))
FWD(cumsum, (void *qctx, T out, T in, int dim), (q->iq, out, in, dim))
FWD(sort, (void *qctx, T v, T i, T in, int dim, bool desc), (q->iq, v, i, in, dim, desc))
FWD(index_check, (void *qctx, T ix, int64_t lo, int64_t hi, const char *op, const char *n),
    (q->iq, ix, lo, hi, op, n))
FWD(gather, (void *qctx, T out, T in, int dim, T ix), (q->iq, out, in, dim, ix))
FWD(scatter, (void *qctx, T out, int dim, T ix, T src, bool acc), (q->iq, out, dim, ix, src, acc))
FWD(index_select, (void *qctx, T out, T in, int dim, T ix), (q->iq, out, in, dim, ix))
FWD(index_add, (void *qctx, T out, int dim, T ix, T src), (q->iq, out, dim, ix, src))
FWD(conv_backward_input, (void *qctx, const kiln_conv_params *p, T gx, T go, T w), (q->iq, p, gx, go, w))
FWD(conv_backward_weight, (void *qctx, const kiln_conv_params *p, T gw, T x, T go), (q->iq, p, gw, x, go))
FWD(conv_fused, (void *qctx, const kiln_conv_params *p, T out, T x, T w, T wp, T b, const kiln_epilogue *ep),
    (q->iq, p, out, x, w, wp, b, ep))
FWD(conv_pack, (void *qctx, T packed, T w), (q->iq, packed, w))
FWD(epilogue, (void *qctx, T out, const kiln_epilogue *ep), (q->iq, out, ep))
FWD(pool, (void *qctx, const kiln_pool_params *p, T out, T ix, T x), (q->iq, p, out, ix, x))
FWD(adaptive_avg_pool, (void *qctx, int ns, T out, T x), (q->iq, ns, out, x))
FWD(adaptive_avg_pool_backward, (void *qctx, int ns, T gx, T go), (q->iq, ns, gx, go))
FWD(interpolate, (void *qctx, kiln_interp_mode m, bool ac, T out, T x), (q->iq, m, ac, out, x))
FWD(interpolate_backward, (void *qctx, kiln_interp_mode m, bool ac, T gx, T go), (q->iq, m, ac, gx, go))
FWD(pad, (void *qctx, kiln_pad_mode m, T out, T in, const int64_t *pads, double v), (q->iq, m, out, in, pads, v))
FWD(adam_step, (void *qctx, const kiln_adam_params *p, T prm, T g, T m, T v, T vmax),
    (q->iq, p, prm, g, m, v, vmax))
FWD(rnn, (void *qctx, const kiln_rnn_params *p, const kiln_rnn_operands *o), (q->iq, p, o))
FWD(fused_run, (void *qctx, const kiln_fused_program *p), (q->iq, p))
#undef T

static int fused_rnn_pack(void *qctx, const kiln_rnn_params *p, const kiln_tdesc *packed, const kiln_tdesc *w,
                          const kiln_tdesc *r)
{
    fq *q = qctx;
    KILN__FUSED_FLUSH(q);
    if (!q->d->in->rnn_pack)
        return kiln__error_set("fused: the inner backend %s has no rnn_pack", q->d->in->name);
    return q->d->in->rnn_pack(q->iq, p, packed, w, r);
}

/* The product with its epilogue applied as it is stored, by the inner backend's GEMM (a
 * group's MATMUL producer fuses only on a backend whose generator emits producers, and
 * the ONNX executor calls this entry directly). Without the inner entry: KILN_ENOTSUP
 * and no message, so the engine runs matmul and then the epilogue, as it does for a
 * backend without it. */
static int fused_matmul_fused(void *qctx, const kiln_tdesc *out, const kiln_tdesc *a, const kiln_tdesc *b,
                              const kiln_epilogue *ep)
{
    fq *q = qctx;
    if (!q->d->in->matmul_fused)
        return KILN_ENOTSUP;
    KILN__FUSED_FLUSH(q);
    return q->d->in->matmul_fused(q->iq, out, a, b, ep);
}

/* Graphs: the inner device's, with the pending group flushed into the recording before
 * it ends (and before it starts or launches, so that no call recorded earlier lands in
 * it or runs after it). The fused kernels of the recorded groups are then part of the
 * graph, launched with it. */
static bool fused_graphs(void *ctx)
{
    fdev *d = ctx;
    const kiln_backend_iface *in = d->in;
    return in->capture_begin && in->capture_end && in->graph_launch && in->graph_free &&
           (!in->graphs || in->graphs(d->ictx));
}

static int fused_capture_begin(void *qctx)
{
    fq *q = qctx;
    if (!fused_graphs(q->d))
        return kiln__error_set("fused: the inner backend %s records no graphs", q->d->in->name);
    KILN__FUSED_FLUSH(q);
    return q->d->in->capture_begin(q->iq);
}

static kiln_backend_graph *fused_capture_end(void *qctx)
{
    fq *q = qctx;
    if (!fused_graphs(q->d)) {
        kiln__error_set("fused: the inner backend %s records no graphs", q->d->in->name);
        return NULL;
    }
    int rc = kiln__fused_flush_pending(q);
    char why[KILN_ERROR_MAX];
    if (rc < 0)
        snprintf(why, sizeof why, "%s", kiln_error());
    kiln_backend_graph *g = q->d->in->capture_end(q->iq); /* always: the queue stops recording */
    if (rc < 0 && g) {
        q->d->in->graph_free(q->iq, g);
        kiln__error_set("%s", why);
        return NULL;
    }
    return g;
}

static int fused_graph_launch(void *qctx, kiln_backend_graph *g)
{
    fq *q = qctx;
    KILN__FUSED_FLUSH(q);
    return q->d->in->graph_launch(q->iq, g);
}

static void fused_graph_free(void *qctx, kiln_backend_graph *g)
{
    fq *q = qctx;
    (void)kiln__fused_flush_pending(q);
    q->d->in->graph_free(q->iq, g);
}

static int64_t fused_rnn_pack_size(void *qctx, const kiln_rnn_params *p)
{
    fq *q = qctx;
    return q->d->in->rnn_pack_size ? q->d->in->rnn_pack_size(q->iq, p) : 0;
}

static int64_t fused_conv_pack_size(void *qctx, const kiln_conv_params *p, const kiln_tdesc *x,
                                    const kiln_tdesc *w)
{
    fq *q = qctx;
    return q->d->in->conv_pack_size ? q->d->in->conv_pack_size(q->iq, p, x, w) : 0;
}

static const kiln_backend_iface fused_iface = {
    .name = "fused",
    .open_opts = fused_open_opts,
    .close = fused_close,
    .caps = fused_caps,
    .queue_open = fused_queue_open,
    .queue_close = fused_queue_close,
    .event_record = fused_event_record,
    .event_wait = fused_event_wait,
    .event_sync = fused_event_sync,
    .event_query = fused_event_query,
    .event_free = fused_event_free,
    .supports = fused_supports,
    .counters = fused_counters,
    .memory = fused_memory,
    .memory_reset_peak = fused_memory_reset_peak,
    .lost = fused_lost,
    .buffer_alloc = kiln__fused_buffer_alloc,
    .buffer_free = kiln__fused_buffer_free,
    .buffer_upload = kiln__fused_buffer_upload,
    .buffer_download = kiln__fused_buffer_download,
    .buffer_host_ptr = kiln__fused_buffer_host_ptr,
    .sync = kiln__fused_sync,
    .host_alloc = kiln__fused_host_alloc,
    .host_free = kiln__fused_host_free,
    .buffer_copy_peer = kiln__fused_buffer_copy_peer,
    .buffer_wrap_host = kiln__fused_buffer_wrap_host,
    .buffer_lend_host = kiln__fused_buffer_lend_host,
    .buffer_trim = kiln__fused_buffer_trim,
    .fill = fused_fill,
    .arange = fused_arange,
    .copy = fused_copy,
    .rng = fused_rng,
    .unary = fused_unary,
    .binary = fused_binary,
    .where = fused_where,
    .reduce = fused_reduce,
    .arg_reduce = fused_arg_reduce,
    .cumsum = fused_cumsum,
    .sort = fused_sort,
    .index_check = fused_index_check,
    .gather = fused_gather,
    .scatter = fused_scatter,
    .index_select = fused_index_select,
    .index_add = fused_index_add,
    .matmul = fused_matmul,
    .conv = fused_conv,
    .conv_backward_input = fused_conv_backward_input,
    .conv_backward_weight = fused_conv_backward_weight,
    .conv_fused = fused_conv_fused,
    .matmul_fused = fused_matmul_fused,
    .conv_pack_size = fused_conv_pack_size,
    .conv_pack = fused_conv_pack,
    .epilogue = fused_epilogue,
    .pool = fused_pool,
    .pool_backward = fused_pool_backward,
    .adaptive_avg_pool = fused_adaptive_avg_pool,
    .adaptive_avg_pool_backward = fused_adaptive_avg_pool_backward,
    .interpolate = fused_interpolate,
    .interpolate_backward = fused_interpolate_backward,
    .pad = fused_pad,
    .softmax = fused_softmax,
    .layer_norm = fused_layer_norm,
    .adam_step = fused_adam_step,
    .rnn = fused_rnn,
    .rnn_pack_size = fused_rnn_pack_size,
    .rnn_pack = fused_rnn_pack,
    .fused_run = fused_fused_run,
    .capture_begin = fused_capture_begin,
    .capture_end = fused_capture_end,
    .graph_launch = fused_graph_launch,
    .graph_free = fused_graph_free,
    .graphs = fused_graphs,
};

const kiln_backend_iface *kiln_backend_fused(void)
{
    return &fused_iface;
}
