/*
 * engine/queue.c — queues (streams), events, the calling thread's current queue, and
 * how the engine orders one storage's uses across queues.
 *
 * Every device has a default queue; a thread that drives a device opens its own
 * (kiln_queue_open) and makes it current (kiln_queue_use), and from then on every op,
 * upload and download it makes on that device is submitted with that queue's backend
 * context. A backend without queue_open has one queue: every engine queue then shares
 * the device context, and nothing below costs more than a field test.
 *
 * Ordering across queues (only for "tracked" devices, whose backend has queue_open and
 * event_wait: a GPU's streams). A storage remembers the queue that made it (home) and
 * the other queues that used it since (users, up to KILN__QUEUE_USERS). Before a use on
 * queue q, q waits on an event recorded on home and on every user other than q, so the
 * use follows every earlier one, whatever the thread; q then joins the users. When the
 * user list is full, the oldest user is folded into home (home waits on it), which
 * keeps "home's order covers it" true. A free is submitted on home after home waited on
 * every user, so a stream-ordered allocator may reuse the buffer on home at once. This
 * is conservative (two queues that only read a weight wait on each other's events);
 * events are cheap on a GPU next to a kernel, and the rule needs no per-op analysis.
 *
 * The thread's bindings: a small fixed array per thread (a thread drives a device or
 * two), so finding the current queue is a short loop without a lock. Per-thread state
 * is what the engine otherwise avoids; a queue is a property of the thread that submits,
 * which is exactly what this state describes.
 */
#include <stdlib.h>
#include <string.h>

#include "tensor-impl.h"

#define BINDINGS 4

static _Thread_local struct binding {
    kiln_device *dev;
    kiln_queue *q;
} bindings[BINDINGS];

struct kiln_event {
    kiln_queue *q;                     /* holds a reference */
    kiln_backend_event *ev;            /* NULL: complete at record (no event entries) */
};

/* ------------------------------------------------------------ queue objects */

static kiln_queue *queue_new(kiln_device *dev, bool is_default)
{
    kiln_queue *q = calloc(1, sizeof *q);
    if (!q) {
        kiln__error_set("kiln_queue_open: out of memory");
        return NULL;
    }
    q->dev = dev;
    q->is_default = is_default;
    atomic_init(&q->refcount, 1);
    if (dev->be->queue_open) {
        kiln_error_clear();
        q->ctx = dev->be->queue_open(dev->ctx);
        if (!q->ctx) {
            free(q);
            if (!kiln_error()[0])
                kiln__error_set("kiln_queue_open: %s: the backend opened no queue", dev->spec);
            return NULL;
        }
    } else {
        q->ctx = dev->ctx;
    }
    pthread_mutex_lock(&dev->queue_lock);
    q->next = dev->queues;
    dev->queues = q;
    pthread_mutex_unlock(&dev->queue_lock);
    if (!is_default)
        kiln__device_retain(dev);
    return q;
}

static void queue_unref(kiln_queue *q)
{
    if (atomic_fetch_sub(&q->refcount, 1) != 1)
        return;
    kiln_device *dev = q->dev;
    if (dev->be->queue_open) {
        if (dev->be->sync)
            dev->be->sync(q->ctx);
        if (dev->be->queue_close)
            dev->be->queue_close(q->ctx);
    }
    pthread_mutex_lock(&dev->queue_lock);
    for (kiln_queue **p = &dev->queues; *p; p = &(*p)->next)
        if (*p == q) {
            *p = q->next;
            break;
        }
    pthread_mutex_unlock(&dev->queue_lock);
    bool is_default = q->is_default;
    kiln__checks_drop(q);
    free(q);
    if (!is_default)
        kiln__device_release(dev);
}

int kiln__queue_init_device(kiln_device *dev)
{
    pthread_mutex_init(&dev->queue_lock, NULL);
    dev->multi_queue = dev->be->queue_open != NULL;
    dev->track = dev->multi_queue && dev->be->event_wait && dev->be->event_record;
    _Static_assert(KILN_ENTRY_COUNT <= 64, "kiln_device.entries holds one bit per entry");
    for (int e = 0; e < KILN_ENTRY_COUNT; e++)
        if (kiln__iface_has(dev->be, (kiln_entry)e))
            dev->entries |= 1ull << e;
    dev->default_q = queue_new(dev, true);
    if (!dev->default_q) {
        pthread_mutex_destroy(&dev->queue_lock);
        return -1;
    }
    return 0;
}

void kiln__queue_fini_device(kiln_device *dev)
{
    /* user queues hold device references, so only the default queue is left */
    if (dev->default_q)
        queue_unref(dev->default_q);
    dev->default_q = NULL;
    kiln__failures_free(dev);
    pthread_mutex_destroy(&dev->queue_lock);
}

kiln_queue *kiln__queue_cur(const kiln_device *dev)
{
    for (int i = 0; i < BINDINGS; i++)
        if (bindings[i].dev == dev)
            return bindings[i].q;
    return dev->default_q;
}

/* --------------------------------------------------------------- public queues */

kiln_queue *kiln_queue_open(kiln_device *dev)
{
    if (!dev) {
        kiln__error_set("kiln_queue_open: device is NULL");
        return NULL;
    }
    return queue_new(dev, false);
}

kiln_queue *kiln_queue_use(kiln_device *dev, kiln_queue *q)
{
    if (!dev || (q && q->dev != dev)) {
        kiln__error_set("kiln_queue_use: %s", !dev ? "device is NULL" : "the queue belongs to another device");
        return NULL;
    }
    kiln_queue *prev = NULL;
    int slot = -1, empty = -1;
    for (int i = 0; i < BINDINGS; i++) {
        if (bindings[i].dev == dev)
            slot = i;
        else if (!bindings[i].dev && empty < 0)
            empty = i;
    }
    if (slot >= 0) {
        prev = bindings[slot].q;
        if (!q)
            bindings[slot] = (struct binding){NULL, NULL};
        else
            bindings[slot].q = q;
        return prev;
    }
    if (q && empty >= 0)
        bindings[empty] = (struct binding){dev, q};
    else if (q)
        kiln__error_set("kiln_queue_use: a thread may choose queues on at most %d devices", BINDINGS);
    return NULL;
}

kiln_queue *kiln_queue_current(kiln_device *dev)
{
    return dev ? kiln__queue_cur(dev) : NULL;
}

/* Waits through the backend context ctx, then reports the device-side checks parked on q: the
 * device's own error comes first, and the checks parked before it go with it. */
static int sync_and_check(kiln_queue *q, void *ctx)
{
    kiln__drain d = kiln__drain_begin(q);
    int rc = q->dev->be->sync ? q->dev->be->sync(ctx) : 0;
    if (rc == 0)
        rc = kiln__checks_run(q);
    else
        kiln__checks_drop(q);
    rc = kiln__drain_end(q, d, rc);
    return rc < 0 ? rc : 0;
}

int kiln_queue_sync(kiln_queue *q)
{
    if (!q)
        return kiln__error_set("kiln_queue_sync: queue is NULL");
    return sync_and_check(q, q->ctx);
}

void kiln_queue_close(kiln_queue *q)
{
    if (!q || q->is_default)
        return;
    kiln_queue_sync(q);
    for (int i = 0; i < BINDINGS; i++)
        if (bindings[i].q == q)
            bindings[i] = (struct binding){NULL, NULL};
    queue_unref(q);
}

int kiln_device_sync(kiln_device *dev)
{
    if (!dev)
        return kiln__error_set("kiln_device_sync: device is NULL");
    if (!dev->multi_queue)
        return sync_and_check(dev->default_q, dev->ctx);
    /* every queue; the list is copied (with references) so that no lock is held while
     * the device works */
    pthread_mutex_lock(&dev->queue_lock);
    int n = 0;
    for (kiln_queue *q = dev->queues; q; q = q->next)
        n++;
    kiln_queue **qs = malloc(((size_t)n + 1) * sizeof *qs);
    if (!qs) {
        pthread_mutex_unlock(&dev->queue_lock);
        return kiln__error_set("kiln_device_sync: out of memory");
    }
    n = 0;
    for (kiln_queue *q = dev->queues; q; q = q->next) {
        /* A queue whose last reference is gone stays listed while queue_unref syncs and
         * closes it: taking a reference from 0 would close and free it a second time (and
         * release the device once too often). Such a queue drains itself; it is passed over. */
        int held = atomic_load(&q->refcount);
        while (held > 0 && !atomic_compare_exchange_weak(&q->refcount, &held, held + 1))
            ;
        if (held > 0)
            qs[n++] = q;
    }
    pthread_mutex_unlock(&dev->queue_lock);
    int rc = 0;
    for (int i = 0; i < n; i++) {
        int r = sync_and_check(qs[i], qs[i]->ctx);
        if (r < 0 && rc == 0)
            rc = r;
    }
    for (int i = 0; i < n; i++)
        queue_unref(qs[i]);
    free(qs);
    return rc;
}

/* ---------------------------------------------------------------------- events */

kiln_event *kiln_event_record(kiln_queue *q)
{
    if (!q) {
        kiln__error_set("kiln_event_record: queue is NULL");
        return NULL;
    }
    kiln_event *e = calloc(1, sizeof *e);
    if (!e) {
        kiln__error_set("kiln_event_record: out of memory");
        return NULL;
    }
    if (q->dev->be->event_record) {
        kiln_error_clear();
        e->ev = q->dev->be->event_record(q->ctx);
        if (!e->ev) {
            free(e);
            if (!kiln_error()[0])
                kiln__error_set("kiln_event_record: %s: the backend recorded no event", q->dev->spec);
            return NULL;
        }
    }
    atomic_fetch_add(&q->refcount, 1);
    e->q = q;
    return e;
}

int kiln_event_wait(kiln_queue *q, kiln_event *ev)
{
    if (!q || !ev)
        return kiln__error_set("kiln_event_wait: queue or event is NULL");
    if (!ev->ev || q == ev->q)
        return 0;
    if (q->dev != ev->q->dev) {
        /* another device: the host waits (no device-side wait across backends) */
        return kiln_event_sync(ev);
    }
    if (!q->dev->be->event_wait)
        return 0;   /* one order for all of the device's queues */
    int rc = q->dev->be->event_wait(q->ctx, ev->ev);
    return rc < 0 ? rc : 0;
}

int kiln_event_sync(kiln_event *ev)
{
    if (!ev)
        return kiln__error_set("kiln_event_sync: event is NULL");
    if (!ev->ev)
        return 0;
    const kiln_backend_iface *be = ev->q->dev->be;
    int rc = be->event_sync ? be->event_sync(ev->q->ctx, ev->ev) : be->sync ? be->sync(ev->q->ctx) : 0;
    return rc < 0 ? rc : 0;
}

int kiln_event_query(kiln_event *ev)
{
    if (!ev)
        return kiln__error_set("kiln_event_query: event is NULL");
    if (!ev->ev || !ev->q->dev->be->event_query)
        return ev->ev ? kiln_event_sync(ev) == 0 : 1;
    return ev->q->dev->be->event_query(ev->q->ctx, ev->ev);
}

void kiln_event_free(kiln_event *ev)
{
    if (!ev)
        return;
    if (ev->ev && ev->q->dev->be->event_free)
        ev->q->dev->be->event_free(ev->q->ctx, ev->ev);
    queue_unref(ev->q);
    free(ev);
}

/* ---------------------------------------------- ordering a storage's uses */

/* Under dev->queue_lock: `waiter` waits for the work queued on `on` so far. An event
 * that cannot be recorded (a device in trouble) falls back to the host waiting on `on`,
 * which orders as well, only slower. */
static void order_after(kiln_device *dev, kiln_queue *waiter, kiln_queue *on)
{
    if (waiter == on)
        return;
    kiln_backend_event *ev = dev->be->event_record(on->ctx);
    if (!ev || dev->be->event_wait(waiter->ctx, ev) < 0) {
        if (dev->be->sync)
            dev->be->sync(on->ctx);
    }
    if (ev && dev->be->event_free)
        dev->be->event_free(on->ctx, ev);
}

/* A storage holds a reference to its home queue, except to the device's default queue: that
 * one lives as long as the device, which the storage holds (two atomics saved per tensor on
 * the queue nearly all work uses). */
static void home_unref(kiln_storage *st)
{
    if (st->home != st->dev->default_q)
        queue_unref(st->home);
    st->home = NULL;
}

void kiln__queue_adopt_slow(kiln_storage *st)
{
    kiln_device *dev = st->dev;
    kiln_queue *q = kiln__queue_cur(dev);
    if (q != dev->default_q)
        atomic_fetch_add(&q->refcount, 1);
    st->home = q;
}

void kiln__queue_touch_slow(kiln_storage *st)
{
    kiln_device *dev = st->dev;
    kiln_queue *q = kiln__queue_cur(dev);
    /* a use that must be ordered after another queue's happened after that use, which
     * set has_users first: home's own uses need no lock (a lock per touch cost a small
     * model a tenth of its run on the fused cpu device) */
    if (q == st->home && !atomic_load(&st->has_users))
        return;
    pthread_mutex_lock(&dev->queue_lock);
    if (q == st->home && !st->users[0]) {
        pthread_mutex_unlock(&dev->queue_lock);
        return;
    }
    bool listed = false;
    order_after(dev, q, st->home);
    for (int i = 0; i < KILN__QUEUE_USERS && st->users[i]; i++) {
        if (st->users[i] == q)
            listed = true;
        else
            order_after(dev, q, st->users[i]);
    }
    if (!listed && q != st->home) {
        if (st->users[KILN__QUEUE_USERS - 1]) {
            /* full: fold the oldest user into home, whose order then covers it */
            kiln_queue *old = st->users[0];
            order_after(dev, st->home, old);
            memmove(st->users, st->users + 1, (KILN__QUEUE_USERS - 1) * sizeof *st->users);
            st->users[KILN__QUEUE_USERS - 1] = NULL;
            pthread_mutex_unlock(&dev->queue_lock);
            queue_unref(old);
            pthread_mutex_lock(&dev->queue_lock);
        }
        int i = 0;
        while (st->users[i])
            i++;
        atomic_fetch_add(&q->refcount, 1);
        st->users[i] = q;
        atomic_store(&st->has_users, true);
    }
    pthread_mutex_unlock(&dev->queue_lock);
}

void kiln__queue_free_buffer(kiln_storage *st)
{
    kiln_device *dev = st->dev;
    if (!dev->track) {
        dev->be->buffer_free(kiln__qctx(dev), st->buf);
        return;
    }
    if (!atomic_load(&st->has_users)) { /* used on its home queue only: nothing to order */
        dev->be->buffer_free(st->home->ctx, st->buf);
        home_unref(st);
        return;
    }
    kiln_queue *users[KILN__QUEUE_USERS];
    pthread_mutex_lock(&dev->queue_lock);
    for (int i = 0; i < KILN__QUEUE_USERS; i++) {
        users[i] = st->users[i];
        if (users[i])
            order_after(dev, st->home, users[i]);
        st->users[i] = NULL;
    }
    atomic_store(&st->has_users, false);
    pthread_mutex_unlock(&dev->queue_lock);
    dev->be->buffer_free(st->home->ctx, st->buf);
    for (int i = 0; i < KILN__QUEUE_USERS; i++)
        if (users[i])
            queue_unref(users[i]);
    home_unref(st);
}

/* ------------------------------------------------------------------ host memory */

void *kiln_host_alloc(kiln_device *dev, size_t nbytes)
{
    if (!dev) {
        kiln__error_set("kiln_host_alloc: device is NULL");
        return NULL;
    }
    if (dev->be->host_alloc)
        return dev->be->host_alloc(kiln__qctx(dev), nbytes ? nbytes : 1);
    size_t n = (nbytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, n ? n : 64);
    if (!p)
        kiln__error_set("kiln_host_alloc: out of memory for %zu bytes", nbytes);
    return p;
}

void kiln_host_free(kiln_device *dev, void *ptr)
{
    if (!dev || !ptr)
        return;
    if (dev->be->host_alloc && dev->be->host_free)
        dev->be->host_free(kiln__qctx(dev), ptr);
    else
        free(ptr);
}

/* ------------------------------------------------------------------- graphs */

struct kiln__graph {
    kiln_queue *q; /* the recording queue, referenced: it lives as long as the graph */
    kiln_backend_graph *g;
};

bool kiln__graph_supported(const kiln_device *dev)
{
    const kiln_backend_iface *be = dev->be;
    return be->capture_begin && be->capture_end && be->graph_launch && be->graph_free &&
           (!be->graphs || be->graphs(dev->ctx));
}

int kiln__graph_capture_begin(kiln_device *dev)
{
    if (!kiln__graph_supported(dev)) {
        kiln__error_set("graph capture: device '%s' (backend %s) does not record graphs", dev->spec,
                        dev->be->name);
        return KILN_ENOTSUP;
    }
    int rc = dev->be->capture_begin(kiln__qctx(dev));
    return rc < 0 ? rc : 0;
}

kiln__graph *kiln__graph_capture_end(kiln_device *dev)
{
    if (!kiln__graph_supported(dev)) {
        kiln__error_set("graph capture: device '%s' (backend %s) does not record graphs", dev->spec,
                        dev->be->name);
        return NULL;
    }
    kiln_queue *q = kiln__queue_cur(dev);
    kiln__graph *g = malloc(sizeof *g);
    kiln_backend_graph *bg = dev->be->capture_end(q->ctx);
    if (!bg || !g) {
        if (bg)
            dev->be->graph_free(q->ctx, bg);
        if (!g)
            kiln__error_set("graph capture on '%s': out of memory", dev->spec);
        free(g);
        return NULL;
    }
    atomic_fetch_add(&q->refcount, 1);
    g->q = q;
    g->g = bg;
    return g;
}

bool kiln__graph_on_current_queue(const kiln__graph *g)
{
    return g && kiln__queue_cur(g->q->dev) == g->q;
}

int kiln__graph_launch(kiln__graph *g)
{
    if (!kiln__graph_on_current_queue(g))
        return kiln__error_set("graph launch on '%s': the calling thread's queue is not the one that recorded it",
                               g ? g->q->dev->spec : "?");
    int rc = g->q->dev->be->graph_launch(g->q->ctx, g->g);
    return rc < 0 ? rc : 0;
}

void kiln__graph_free(kiln__graph *g)
{
    if (!g)
        return;
    g->q->dev->be->graph_free(g->q->ctx, g->g);
    queue_unref(g->q);
    free(g);
}
