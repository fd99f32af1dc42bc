/*
 * engine/queue-checks.c — range checks that wait for the next read, for asynchronous
 * devices whose backend has no index_check entry (the remote one).
 *
 * Reading an index's extremes to the host before every gather costs a round trip per
 * indexing op, which is what an asynchronous device exists to avoid. Instead the
 * extremes are computed on the device (a min and a max, stacked as f64: a few queued ops,
 * no wait) and the pair is parked on the queue, with the op's name and the bounds. The
 * next read from that queue (a download, kiln_queue_sync, kiln_device_sync) first reads
 * every parked pair at once — one extra read, however many checks — and fails with the
 * first violation's message, as a GPU framework's device-side assert does. The work that
 * used the bad index has run by then: such a device must not go out of its buffers
 * whatever an index holds (the remote server checks indices itself before its kernels).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor-impl.h"

typedef struct pending_check {
    kiln_tensor *extremes;   /* f64 [2]: min, max */
    const char *op, *noun;
    int64_t lo, hi;
    struct pending_check *next;
} pending_check;

/* Parked checks, per queue; guarded by one lock (checks are rare next to ops, and the
 * default queue may be shared by several threads). */
static pthread_mutex_t checks_lock = PTHREAD_MUTEX_INITIALIZER;

int kiln__check_defer(kiln_tensor *index, int64_t lo, int64_t hi, const char *op, const char *noun)
{
    kiln_device *dev = kiln__dev(index);
    pending_check *c = calloc(1, sizeof *c);
    if (!c)
        return kiln__error_set("%s: out of memory", op);
    kiln_scope_begin();
    kiln_tensor *pair[2] = {kiln_cast(kiln_min(index, KILN_ALL_DIMS, false), KILN_F64),
                            kiln_cast(kiln_max(index, KILN_ALL_DIMS, false), KILN_F64)};
    c->extremes = pair[0] && pair[1] ? kiln_keep(kiln_stack(pair, 2, 0)) : NULL;
    kiln_scope_end();
    if (!c->extremes) {
        free(c);
        return -1;
    }
    c->op = op;
    c->noun = noun;
    c->lo = lo;
    c->hi = hi;
    kiln_queue *q = kiln__queue_cur(dev);
    pthread_mutex_lock(&checks_lock);
    c->next = q->checks;
    q->checks = c;
    pthread_mutex_unlock(&checks_lock);
    return 0;
}

static pending_check *take(kiln_queue *q)
{
    pthread_mutex_lock(&checks_lock);
    pending_check *c = q->checks;
    q->checks = NULL;
    pthread_mutex_unlock(&checks_lock);
    return c;
}

static void drop(pending_check *c)
{
    while (c) {
        pending_check *next = c->next;
        kiln_tensor_release(c->extremes);
        free(c);
        c = next;
    }
}

int kiln__checks_run(kiln_queue *q)
{
    if (!q->checks)
        return 0;
    pending_check *list = take(q);
    /* oldest first, so the first violation reported is the first one made */
    pending_check *rev = NULL;
    int n = 0;
    while (list) {
        pending_check *next = list->next;
        list->next = rev;
        rev = list;
        list = next;
        n++;
    }
    kiln_tensor **parts = calloc((size_t)n, sizeof *parts);
    double *v = calloc((size_t)n * 2, sizeof *v);
    int rc = parts && v ? 0 : kiln__error_set("sync: out of memory");
    int k = 0;
    for (pending_check *c = rev; c; c = c->next)
        if (parts)
            parts[k++] = c->extremes;
    if (rc == 0) {
        kiln_scope_begin();
        kiln_tensor *all = kiln_cat(parts, n, 0);
        rc = all ? kiln_to_data(all, v, (size_t)n * 2 * sizeof *v) : -1;
        kiln_scope_end();
    }
    k = 0;
    for (pending_check *c = rev; rc == 0 && c; c = c->next, k++) {
        if (v[2 * k] < (double)c->lo)
            rc = kiln__index_error(c->op, c->noun, (int64_t)v[2 * k], c->lo, c->hi);
        else if (v[2 * k + 1] >= (double)c->hi)
            rc = kiln__index_error(c->op, c->noun, (int64_t)v[2 * k + 1], c->lo, c->hi);
    }
    free(parts);
    free(v);
    drop(rev);
    return rc < 0 ? -1 : 0;
}

void kiln__checks_drop(kiln_queue *q)
{
    drop(take(q));
}

/* ------------------------------------------------------------ deferred errors */

/* A stretch of the device clock whose writes an error spoiled: [lo, hi). */
struct kiln__failure {
    uint64_t lo, hi;
    char message[KILN_ERROR_MAX];
    int code; /* kiln_error_code() of the failure, kept for each restatement of it */
    struct kiln__failure *next;
};

/* A device keeps its newest failures only: a long-running server that meets an error now
 * and then must not grow without bound. A storage spoiled by a forgotten failure was
 * written before that many later failures, so it is nearly always freed long since. */
enum {
    FAILURES_KEPT = 256
};

/* Whether stamp lies in a failure's stretch; its message copied into message and its code
 * into *code when so. */
static bool failure_at(kiln_device *dev, uint64_t stamp, char *message, size_t len, int *code)
{
    if (stamp >= atomic_load_explicit(&dev->spoiled_below, memory_order_acquire) ||
        stamp < atomic_load_explicit(&dev->spoiled_from, memory_order_acquire))
        return false;
    bool found = false;
    pthread_mutex_lock(&dev->queue_lock);
    for (const struct kiln__failure *f = dev->failures; f && !found; f = f->next)
        if (stamp >= f->lo && stamp < f->hi) {
            snprintf(message, len, "%s", f->message);
            *code = f->code;
            found = true;
        }
    pthread_mutex_unlock(&dev->queue_lock);
    return found;
}

void kiln__spoil_check_slow(kiln_storage *st)
{
    char message[KILN_ERROR_MAX];
    int code = 0;
    if (!failure_at(st->dev, st->stamp, message, sizeof message, &code))
        return;
    kiln_queue *q = kiln__queue_cur(st->dev);
    pthread_mutex_lock(&st->dev->queue_lock);
    if (!q->tainted[0]) {
        snprintf(q->tainted, sizeof q->tainted, "%s", message);
        q->tainted_code = code;
    }
    pthread_mutex_unlock(&st->dev->queue_lock);
}

int kiln__spoiled(const kiln_storage *st, const char *op)
{
    char message[KILN_ERROR_MAX];
    int code = 0;
    if (!failure_at(st->dev, st->stamp, message, sizeof message, &code))
        return 0;
    return kiln__error_set_code(code, "%s: the tensor's value was lost to an earlier error on %s: %s", op,
                                st->dev->spec, message);
}

kiln__drain kiln__drain_begin(kiln_queue *q)
{
    kiln__drain d = {0, 0};
    if (q->dev->caps.async) {
        /* writes stamped from here on may still be running when the drain ends */
        d.started = atomic_fetch_add(&q->dev->clock, 1) + 1;
        d.clean_before = atomic_load(&q->clean_since);
    }
    return d;
}

/* Record [lo, hi) as spoiled by kiln_error()'s message; under the device's queue lock. */
static void failure_add(kiln_device *dev, uint64_t lo, uint64_t hi)
{
    struct kiln__failure *f = calloc(1, sizeof *f);
    if (!f)
        return;
    f->lo = lo;
    f->hi = hi;
    snprintf(f->message, sizeof f->message, "%s", kiln_error());
    f->code = kiln_error_code();
    f->next = dev->failures;
    dev->failures = f;
    uint64_t from = lo, below = hi;
    int kept = 1;
    for (struct kiln__failure *g = f; g->next; g = g->next, kept++) {
        if (kept == FAILURES_KEPT) {
            struct kiln__failure *old = g->next;
            g->next = NULL;
            while (old) {
                struct kiln__failure *next = old->next;
                free(old);
                old = next;
            }
            break;
        }
        from = g->next->lo < from ? g->next->lo : from;
        below = g->next->hi > below ? g->next->hi : below;
    }
    atomic_store_explicit(&dev->spoiled_from, from, memory_order_release);
    atomic_store_explicit(&dev->spoiled_below, below, memory_order_release);
}

int kiln__drain_end(kiln_queue *q, kiln__drain d, int rc)
{
    kiln_device *dev = q->dev;
    if (!dev->caps.async)
        return rc;
    pthread_mutex_lock(&dev->queue_lock);
    if (rc >= 0 && !q->tainted[0]) {
        /* everything stamped before the drain started is known good (a nested drain, such
         * as the parked checks' read, may have moved the point further already) */
        if (atomic_load(&q->clean_since) < d.started)
            atomic_store(&q->clean_since, d.started);
        pthread_mutex_unlock(&dev->queue_lock);
        return rc;
    }
    if (rc >= 0)
        rc = kiln__error_set_code(q->tainted_code, "%s", q->tainted);
    q->tainted[0] = 0;
    /* from the last clean point before this drain began (not one a nested drain set) to
     * now: the failing op and everything after it on this queue */
    uint64_t hi = atomic_fetch_add(&dev->clock, 1) + 1;
    failure_add(dev, d.clean_before, hi);
    atomic_store(&q->clean_since, hi);
    pthread_mutex_unlock(&dev->queue_lock);
    return rc;
}

void kiln__failures_free(kiln_device *dev)
{
    struct kiln__failure *f = dev->failures;
    while (f) {
        struct kiln__failure *next = f->next;
        free(f);
        f = next;
    }
    dev->failures = NULL;
}
