/*
 * scheduler/scheduler.c — worker threads, per-model queues, the dynamic batcher and the
 * completion path back to the I/O loop.
 *
 * One mutex guards every queue, instance list and control list. That is deliberate: the work
 * done under it is a few pointer moves per request, and a run takes far longer than any
 * contention could, so finer locks would buy nothing and cost clarity. Each worker sleeps on its
 * own condition variable, with a timeout when a batch is waiting to fill.
 *
 * A worker first runs control tasks (load or free an instance: these touch the device, so they
 * run on the thread that owns it), then looks for a model whose queue is ready:
 *   - the model does not batch: one request, at once;
 *   - the rows queued (the compatible prefix of the queue) reach max_batch_size, or the next
 *     request cannot join (other trailing dims, too many rows): run what can go;
 *   - a preferred batch size can be formed exactly: the largest such;
 *   - the oldest request has waited max_queue_delay_us (or no delay is set), or the deadline of
 *     one of the requests that would go is near (deadline_lead): run what there is.
 * Requests whose client left or whose deadline passed are dropped as they are taken. A worker
 * with nothing to run trims its device's pool once the device has been idle long enough
 * (sched-pool.c).
 *
 * Training does not run here: a job's thread asks the device's training gate (sched-gate.c) for
 * the device around each step, and the gate reads the queues and the workers' running flags
 * kept below. A worker that finishes a run or goes to sleep wakes the trainers waiting on it.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sched-impl.h"

const char *kd_sched_outcome_to_str(enum kd_sched_outcome o)
{
    switch (o) {
    case KD_SCHED_OK: return "success";
    case KD_SCHED_FAILED: return "failed";
    case KD_SCHED_TIMEOUT: return "timeout";
    case KD_SCHED_CANCELLED: return "cancelled";
    case KD_SCHED_SHUTDOWN: return "shutdown";
    }
    return "?";
}

void kd_sched_logf(const struct kd_sched *s, enum kd_log_level level, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (s->opts.log)
        s->opts.log(s->opts.log_ud, level, msg);
    else if (level <= KD_LOG_WARN) /* a bare scheduler's stderr gets what needs attention only */
        fprintf(stderr, "kilnd: %s: %s\n", kd_log_level_to_str(level), msg);
}

/* ---- completions: workers -> loop ---------------------------------------------------------- */

/* Queues n finished requests for the loop at once: one lock and at most one wake-up for all. */
void kd_sched_post_done_n(struct kd_sched *s, struct kd_sched_request **rs, int n)
{
    if (n <= 0)
        return;
    for (int i = 0; i < n; i++)
        rs[i]->next = i + 1 < n ? rs[i + 1] : NULL;
    pthread_mutex_lock(&s->done_mu);
    if (s->done_tail)
        s->done_tail->next = rs[0];
    else
        s->done_head = rs[0];
    s->done_tail = rs[n - 1];
    pthread_mutex_unlock(&s->done_mu);
    if (s->async_open)
        uv_async_send(&s->async);
}

static void post_done(struct kd_sched *s, struct kd_sched_request *r)
{
    kd_sched_post_done_n(s, &r, 1);
}

static void drain_done(struct kd_sched *s)
{
    pthread_mutex_lock(&s->done_mu);
    struct kd_sched_request *r = s->done_head;
    s->done_head = s->done_tail = NULL;
    pthread_mutex_unlock(&s->done_mu);
    while (r) {
        struct kd_sched_request *next = r->next;
        r->done(r);
        r = next;
    }
}

static void on_async(uv_async_t *h)
{
    drain_done(h->data);
}

/* ---- control tasks --------------------------------------------------------------------------- */

static int post_ctl(struct kd_sched_worker *w, void (*fn)(struct kd_sched_worker *, void *), void *arg)
{
    struct kd_sched_ctl *c = calloc(1, sizeof *c);
    if (!c)
        return -1;
    c->fn = fn;
    c->arg = arg;
    if (w->ctl_tail)
        w->ctl_tail->next = c;
    else
        w->ctl_head = c;
    w->ctl_tail = c;
    pthread_cond_signal(&w->cv);
    return 0;
}

static void free_model_struct(struct kd_sched_model *m)
{
    kd_repository_config_free(&m->cfg);
    free(m->inst);
    free(m->name);
    free(m->path);
    free(m);
}

/* Under the lock: forget the model and take its instances off their workers' lists. */
static void unlink_model(struct kd_sched *s, struct kd_sched_model *m)
{
    if (m->prev)
        m->prev->next = m->next;
    else if (s->models == m)
        s->models = m->next;
    if (m->next)
        m->next->prev = m->prev;
    m->prev = m->next = NULL;
    for (int i = 0; i < m->ninst; i++) {
        struct kd_sched_instance *in = &m->inst[i];
        if (!in->linked)
            continue;
        struct kd_sched_worker *w = in->worker;
        for (struct kd_sched_instance **pp = &w->insts; *pp; pp = &(*pp)->wnext) {
            if (*pp == in) {
                *pp = in->wnext;
                break;
            }
        }
        if (w->rr == in)
            w->rr = NULL;
        in->linked = false;
    }
}

static void ctl_free_instance(struct kd_sched_worker *w, void *arg)
{
    (void)w;
    struct kd_sched_instance *in = arg;
    struct kd_sched_model *m = in->model;
    kd_sched_unbuild(&in->exec);
    if (atomic_fetch_sub(&m->pending, 1) == 1)
        free_model_struct(m);
}

static void load_finished(struct kd_sched_request *r)
{
    struct kd_sched_model *m = r->ud;
    bool ok = m->why[0] == '\0';
    m->load_done(m->load_ud, ok ? m : NULL, ok ? NULL : m->why);
    if (!ok)
        kd_sched_model_release(m);
}

static void ctl_load_instance(struct kd_sched_worker *w, void *arg)
{
    struct kd_sched_instance *in = arg;
    struct kd_sched_model *m = in->model;
    struct kd_sched *s = w->sched;
    char why[256] = "";
    struct kd_sched_exec ex = {0};
    int rc = kd_sched_build(m, w->dev, &ex, why, sizeof why);
    pthread_mutex_lock(&s->mu);
    if (rc == 0) {
        in->exec = ex;
        in->linked = true;
        in->wnext = w->insts;
        w->insts = in;
    } else if (m->why[0] == '\0') {
        snprintf(m->why, sizeof m->why, "%s", why);
    }
    pthread_mutex_unlock(&s->mu);
    if (atomic_fetch_sub(&m->pending, 1) == 1) {
        m->load_req.done = load_finished;
        m->load_req.ud = m;
        post_done(s, &m->load_req);
    }
}

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Counts a run of rows in the statistics' entry of that batch size, made in order if new. */
static void count_batch(struct kd_sched_stats *st, int64_t rows, uint64_t ns)
{
    int i = 0;
    while (i < st->nbatches && st->batches[i].size < rows)
        i++;
    if (i == st->nbatches || st->batches[i].size != rows) {
        if (st->nbatches == KD_SCHED_BATCH_SIZES)
            return; /* not listed: execution_count has it */
        memmove(&st->batches[i + 1], &st->batches[i], (size_t)(st->nbatches - i) * sizeof st->batches[0]);
        st->batches[i] = (struct kd_sched_batch_stat){.size = rows};
        st->nbatches++;
    }
    st->batches[i].count++;
    st->batches[i].compute_ns += ns;
}

/* Takes n requests off m's queue, runs the live ones on in, and posts every one back. */
static void run_batch(struct kd_sched_worker *w, struct kd_sched_instance *in, int n)
{
    struct kd_sched *s = w->sched;
    struct kd_sched_model *m = in->model;
    struct kd_sched_request *taken[256];
    if (n > 256)
        n = 256;
    for (int i = 0; i < n; i++) {
        taken[i] = m->head;
        m->head = m->head->next;
        m->queued--;
    }
    if (!m->head)
        m->tail = NULL;
    pthread_mutex_unlock(&s->mu);

    uint64_t now = uv_hrtime();
    int live = 0, dropped = 0;
    uint64_t drop_waited_ns = 0, drop_failed_ns = 0;
    int64_t rows = 0;
    struct kd_sched_request *drop[256];
    for (int i = 0; i < n; i++) {
        struct kd_sched_request *r = taken[i];
        r->started_ns = now;
        if (r->cancelled && atomic_load(r->cancelled)) {
            r->outcome = KD_SCHED_CANCELLED;
        } else if (r->deadline_ns && now > r->deadline_ns) {
            r->outcome = KD_SCHED_TIMEOUT;
            snprintf(r->error, sizeof r->error, "request timed out after waiting %.1f ms in the queue",
                     (double)(now - r->enqueued_ns) / 1e6);
        } else if (r->prepare && r->prepare(r) != 0) {
            r->outcome = KD_SCHED_FAILED;
        } else {
            taken[live++] = r;
            rows += kd_sched_rows_of(m, r);
            continue;
        }
        r->finished_ns = uv_hrtime();
        drop_waited_ns += now - r->enqueued_ns;
        drop_failed_ns += r->finished_ns - r->enqueued_ns;
        drop[dropped++] = r;
    }
    /* before the run: their answers need not wait for it (and once posted, the loop may free
     * them: their statistics were taken above) */
    kd_sched_post_done_n(s, drop, dropped);
    if (live > 0)
        kd_sched_run(m, &in->exec, w->dev, taken, live, rows);
    uint64_t end = uv_hrtime();
    for (int i = 0; i < live; i++)
        if (taken[i]->finish)
            taken[i]->finish(taken[i]);

    pthread_mutex_lock(&s->mu);
    struct kd_sched_stats *st = &m->stats;
    bool succeeded = false;
    /* the dropped ones (timed out, cancelled, refused by the worker) waited and failed */
    st->queue_count += (uint64_t)dropped;
    st->queue_ns += drop_waited_ns;
    st->fail_count += (uint64_t)dropped;
    st->fail_ns += drop_failed_ns;
    for (int i = 0; i < live; i++) {
        struct kd_sched_request *r = taken[i];
        r->finished_ns = end;
        r->batch_size = (int)rows;
        st->queue_count++;
        st->queue_ns += now - r->enqueued_ns;
        if (r->outcome == KD_SCHED_OK) {
            succeeded = true;
            st->success_count++;
            st->inference_count += (uint64_t)kd_sched_rows_of(m, r);
            st->success_ns += end - r->enqueued_ns;
            st->compute_count++;
            st->compute_request_ns += end - now;
        } else {
            st->fail_count++;
            st->fail_ns += end - r->enqueued_ns;
        }
    }
    if (live > 0) {
        st->runs++;
        st->compute_ns += end - now;
        st->last_inference_ms = wall_ms();
    }
    if (succeeded) {
        st->execution_count++;
        count_batch(st, rows, end - now);
    }
    pthread_mutex_unlock(&s->mu);
    kd_sched_post_done_n(s, taken, live);
    pthread_mutex_lock(&s->mu);
}

static void *worker_main(void *arg)
{
    struct kd_sched_worker *w = arg;
    struct kd_sched *s = w->sched;
    /* this thread's own queue on its device: its batches and tasks overlap other workers'
     * and a trainer's on an async device (on cpu it is the device itself); without one
     * (out of queues) the device's default queue serves */
    kiln_queue *q = kiln_queue_open(w->dev);
    if (q)
        kiln_queue_use(w->dev, q);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (w->ctl_head) {
            struct kd_sched_ctl *c = w->ctl_head;
            w->ctl_head = c->next;
            if (!w->ctl_head)
                w->ctl_tail = NULL;
            pthread_mutex_unlock(&s->mu);
            c->fn(w, c->arg);
            free(c);
            pthread_mutex_lock(&s->mu);
            kd_sched_pool_work_ended(w->gate);
            continue;
        }
        if (s->stopping)
            break;
        uint64_t now = uv_hrtime(), wake = 0;
        struct kd_sched_instance *pick = NULL;
        int n = 0;
        /* Round robin over this worker's instances, so one busy model cannot starve another. */
        struct kd_sched_instance *start = w->rr && w->rr->linked ? w->rr : w->insts;
        for (struct kd_sched_instance *in = start; in && !pick;) {
            uint64_t due = 0;
            n = kd_sched_batch_ready(in->model, now, &due);
            if (n > 0)
                pick = in;
            else if (due && (!wake || due < wake))
                wake = due;
            in = in->wnext ? in->wnext : w->insts;
            if (in == start)
                break;
        }
        if (w->task_head && (!pick || w->task_turn)) {
            struct kd_sched_task *t = w->task_head;
            w->task_head = t->next;
            if (!w->task_head)
                w->task_tail = NULL;
            w->task_turn = false;
            w->running = true;
            pthread_mutex_unlock(&s->mu);
            t->run(t, w->dev);
            post_done(s, &t->carrier);
            pthread_mutex_lock(&s->mu);
            w->running = false;
            kd_sched_pool_work_ended(w->gate);
            continue;
        }
        if (pick) {
            w->rr = pick->wnext;
            w->task_turn = true;
            w->running = true;
            run_batch(w, pick, n);
            w->running = false;
            kd_sched_pool_work_ended(w->gate);
            continue;
        }
        /* Nothing to run now: a trainer waiting for this device may find it free. */
        if (w->gate->waiting)
            pthread_cond_broadcast(&w->gate->cv);
        uint64_t trim_at = kd_sched_pool_trim_due(s, w);
        if (trim_at && trim_at <= now) {
            kd_sched_pool_trim(s, w);
            continue;
        }
        if (trim_at && (!wake || trim_at < wake))
            wake = trim_at;
        if (wake) {
            /* uv_hrtime is CLOCK_MONOTONIC; the condition variable is set to the same clock. */
            struct timespec ts = {.tv_sec = (time_t)(wake / 1000000000u), .tv_nsec = (long)(wake % 1000000000u)};
            pthread_cond_timedwait(&w->cv, &s->mu, &ts);
        } else {
            pthread_cond_wait(&w->cv, &s->mu);
        }
    }
    /* Stopping: the instances die with the thread that owns their device. */
    for (struct kd_sched_instance *in = w->insts; in; in = in->wnext)
        kd_sched_unbuild(&in->exec);
    pthread_mutex_unlock(&s->mu);
    kiln_queue_close(q);
    return NULL;
}

/* ---- public ---------------------------------------------------------------------------------- */

int kd_sched_new(struct kd_sched **out, const struct kd_sched_options *o, char *err, size_t errlen)
{
    struct kd_sched *s = calloc(1, sizeof *s);
    int per = o->workers_per_device > 0 ? o->workers_per_device : 1;
    if (!s || o->ndevices == 0) {
        snprintf(err, errlen, s ? "no devices configured" : "out of memory");
        free(s);
        return -1;
    }
    s->opts = *o;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->done_mu, NULL);
    uv_async_init(o->loop, &s->async, on_async);
    s->async.data = s;
    s->async_open = true;
    /* Completions only matter while something else (a connection) waits for them. */
    uv_unref((uv_handle_t *)&s->async);
    kd_sched_expire_init(s, o->loop);
    *out = s;
    s->workers = calloc(o->ndevices * (size_t)per, sizeof *s->workers);
    s->gates = calloc(o->ndevices, sizeof *s->gates);
    if (!s->workers || !s->gates) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (size_t d = 0; d < o->ndevices; d++) {
        kiln_device *dev = kiln_device_open(o->devices[d]);
        /* a configured spec may hold a secret (a remote token): messages show it masked */
        char shown[512], other[512];
        kiln_device_spec_redact(o->devices[d], shown, sizeof shown);
        if (!dev) {
            snprintf(err, errlen, "device '%s': %s", shown, kiln_error());
            return -1;
        }
        /* two spellings of one device ("vulkan" and "vulkan:0", or one listed twice) would
         * split its models and training slots between two names */
        for (size_t i = 0; i < s->nworkers; i++)
            if (s->workers[i].dev == dev) {
                snprintf(err, errlen, "devices: '%s' and '%s' are the same device (%s); list it once",
                         kiln_device_spec_redact(s->workers[i].spec, other, sizeof other), shown,
                         kiln_device_name(dev));
                kiln_device_close(dev);
                return -1;
            }
        struct kd_sched_gate *gate = kd_sched_gate_for(s, o->devices[d]);
        if (!gate) {
            gate = &s->gates[s->ngates];
            gate->spec = strdup(o->devices[d]);
            if (!gate->spec) {
                kiln_device_close(dev);
                snprintf(err, errlen, "out of memory");
                return -1;
            }
            pthread_condattr_t ca;
            pthread_condattr_init(&ca);
            pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
            pthread_cond_init(&gate->cv, &ca);
            pthread_condattr_destroy(&ca);
            gate->pool_trimmed = true; /* nothing in the pool before any work */
            s->ngates++;
        }
        for (int k = 0; k < per; k++) {
            struct kd_sched_worker *w = &s->workers[s->nworkers++];
            w->sched = s;
            w->gate = gate;
            w->dev = k == 0 ? dev : kiln_device_open(o->devices[d]);
            w->spec = strdup(o->devices[d]);
            pthread_condattr_t ca;
            pthread_condattr_init(&ca);
            pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
            pthread_cond_init(&w->cv, &ca);
            pthread_condattr_destroy(&ca);
            if (!w->spec || pthread_create(&w->thread, NULL, worker_main, w) != 0) {
                snprintf(err, errlen, "cannot start a worker thread for '%s'", shown);
                return -1;
            }
            w->started = true;
        }
    }
    return 0;
}

void kd_sched_stop(struct kd_sched *s)
{
    if (!s || s->stopped)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    for (size_t i = 0; i < s->nworkers; i++)
        pthread_cond_signal(&s->workers[i].cv);
    for (size_t i = 0; i < s->ngates; i++)
        pthread_cond_broadcast(&s->gates[i].cv);
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < s->nworkers; i++)
        if (s->workers[i].started)
            pthread_join(s->workers[i].thread, NULL);
    s->stopped = true;
    /* Everything still queued gets its answer now, on this (the loop's) thread. */
    for (size_t i = 0; i < s->nworkers; i++) {
        struct kd_sched_worker *w = &s->workers[i];
        while (w->task_head) {
            struct kd_sched_task *t = w->task_head;
            w->task_head = t->next;
            t->shutdown = true;
            post_done(s, &t->carrier);
        }
        w->task_tail = NULL;
    }
    for (struct kd_sched_model *m = s->models; m; m = m->next) {
        while (m->head) {
            struct kd_sched_request *r = m->head;
            m->head = r->next;
            r->outcome = KD_SCHED_SHUTDOWN;
            snprintf(r->error, sizeof r->error, "the server is shutting down");
            post_done(s, r);
        }
        m->tail = NULL;
        m->queued = 0;
    }
    drain_done(s);
}

void kd_sched_close(struct kd_sched *s)
{
    if (s && s->async_open && !uv_is_closing((uv_handle_t *)&s->async))
        uv_close((uv_handle_t *)&s->async, NULL);
    if (s)
        kd_sched_expire_close(s);
}

void kd_sched_destroy(struct kd_sched *s)
{
    if (!s)
        return;
    kd_sched_stop(s);
    for (size_t i = 0; i < s->nworkers; i++) {
        struct kd_sched_worker *w = &s->workers[i];
        while (w->ctl_head) {
            struct kd_sched_ctl *c = w->ctl_head;
            w->ctl_head = c->next;
            free(c);
        }
        if (w->dev)
            kiln_device_close(w->dev);
        free(w->spec);
        pthread_cond_destroy(&w->cv);
    }
    free(s->workers);
    for (size_t i = 0; i < s->ngates; i++) {
        free(s->gates[i].spec);
        pthread_cond_destroy(&s->gates[i].cv);
    }
    free(s->gates);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->done_mu);
    free(s);
}

/* Whether a model's device spec names worker w's device: as configured, or as the device
 * calls itself ("vulkan:0" for a device configured as "vulkan"). */
static bool worker_is(const struct kd_sched_worker *w, const char *spec)
{
    return strcmp(w->spec, spec) == 0 || (w->dev && strcmp(kiln_device_name(w->dev), spec) == 0);
}

int kd_sched_model_load(struct kd_sched *s, const char *name, const kd_model_version *v,
                        void (*done)(void *ud, struct kd_sched_model *m, const char *why), void *ud)
{
    const char *dev = v->config.device ? v->config.device : "cpu";
    int count = v->config.instance_count > 0 ? v->config.instance_count : 1;
    size_t nw = 0;
    for (size_t i = 0; i < s->nworkers; i++)
        nw += worker_is(&s->workers[i], dev);
    if (s->stopping)
        return -3;
    if (nw == 0)
        return -2; /* the device is not one this daemon drives */
    struct kd_sched_model *m = calloc(1, sizeof *m);
    if (!m)
        return -1;
    m->sched = s;
    m->name = strdup(name);
    m->path = strdup(v->path);
    m->version = v->version;
    m->format = v->format ? v->format : "kiln";
    m->inst = calloc((size_t)count, sizeof *m->inst);
    m->ninst = count;
    atomic_init(&m->refs, 1);
    atomic_init(&m->pending, count);
    atomic_init(&m->split_warned, false);
    m->load_done = done;
    m->load_ud = ud;
    m->gate = kd_sched_gate_for(s, dev);
    if (!m->name || !m->path || !m->inst || kd_sched_config_copy(&m->cfg, &v->config) != 0) {
        free_model_struct(m);
        return -1;
    }
    pthread_mutex_lock(&s->mu);
    m->next = s->models;
    if (s->models)
        s->models->prev = m;
    s->models = m;
    size_t k = 0;
    for (size_t i = 0; i < s->nworkers && k < (size_t)count; i = (i + 1) % s->nworkers) {
        if (!worker_is(&s->workers[i], dev))
            continue;
        m->inst[k].model = m;
        m->inst[k].worker = &s->workers[i];
        if (post_ctl(&s->workers[i], ctl_load_instance, &m->inst[k]) != 0) {
            /* Count the instance as failed so the completion still fires once. */
            snprintf(m->why, sizeof m->why, "out of memory");
            atomic_fetch_sub(&m->pending, 1);
        }
        k++;
    }
    pthread_mutex_unlock(&s->mu);
    return 0;
}

struct kd_sched_model *kd_sched_model_retain(struct kd_sched_model *m)
{
    atomic_fetch_add(&m->refs, 1);
    return m;
}

void kd_sched_model_release(struct kd_sched_model *m)
{
    if (!m || atomic_fetch_sub(&m->refs, 1) != 1)
        return;
    struct kd_sched *s = m->sched;
    pthread_mutex_lock(&s->mu);
    unlink_model(s, m);
    if (s->stopped) {
        /* The workers are gone (or going, and free their instances themselves). */
        pthread_mutex_unlock(&s->mu);
        free_model_struct(m);
        return;
    }
    atomic_store(&m->pending, m->ninst);
    int direct = 0;
    for (int i = 0; i < m->ninst; i++) {
        if (!m->inst[i].worker || post_ctl(m->inst[i].worker, ctl_free_instance, &m->inst[i]) != 0)
            direct++;
    }
    bool last = direct > 0 && atomic_fetch_sub(&m->pending, direct) == direct;
    pthread_mutex_unlock(&s->mu);
    if (last)
        free_model_struct(m);
}

const char *kd_sched_model_name(const struct kd_sched_model *m)
{
    return m->name;
}

int64_t kd_sched_model_version(const struct kd_sched_model *m)
{
    return m->version;
}

/* Whether w's device was lost; if so, why names it ("device 'SPEC': <the backend's words>"),
 * as both the server's readiness and a model's say it. */
static bool worker_lost(const struct kd_sched_worker *w, char *why, size_t whylen)
{
    const char *lost = w && w->dev ? kiln_device_lost(w->dev) : NULL;
    if (lost)
        snprintf(why, whylen, "device '%s': %s", kiln_device_name(w->dev), lost);
    return lost != NULL;
}

int kd_sched_model_lost(const struct kd_sched_model *m, char *why, size_t whylen)
{
    for (int i = 0; i < m->ninst; i++)
        if (worker_lost(m->inst[i].worker, why, whylen))
            return 1;
    return 0;
}

const kd_model_config *kd_sched_model_config(const struct kd_sched_model *m)
{
    return &m->cfg;
}

const char *kd_sched_model_format(const struct kd_sched_model *m)
{
    return m->format;
}

size_t kd_sched_model_queued(const struct kd_sched_model *m)
{
    pthread_mutex_lock(&m->sched->mu);
    size_t n = m->queued;
    pthread_mutex_unlock(&m->sched->mu);
    return n;
}

void kd_sched_model_stats(const struct kd_sched_model *m, struct kd_sched_stats *out)
{
    pthread_mutex_lock(&m->sched->mu);
    *out = m->stats;
    pthread_mutex_unlock(&m->sched->mu);
}

void kd_sched_model_carry_stats(struct kd_sched_model *to, const struct kd_sched_model *from)
{
    /* one lock: both models belong to this scheduler, and to takes no requests yet */
    pthread_mutex_lock(&to->sched->mu);
    to->stats = from->stats;
    pthread_mutex_unlock(&to->sched->mu);
}

void kd_sched_model_count_refused(struct kd_sched_model *m, uint64_t waited_ns)
{
    pthread_mutex_lock(&m->sched->mu);
    m->stats.fail_count++;
    m->stats.fail_ns += waited_ns;
    pthread_mutex_unlock(&m->sched->mu);
}

int kd_sched_submit(struct kd_sched *s, struct kd_sched_request *r)
{
    struct kd_sched_model *m = r->model;
    r->next = NULL;
    r->outcome = KD_SCHED_OK;
    r->fault = KD_SCHED_FAULT_INPUT; /* what a prepare that refuses the request means */
    r->error[0] = '\0';
    r->noutputs = 0;
    r->enqueued_ns = uv_hrtime();
    pthread_mutex_lock(&s->mu);
    if (s->stopping || m->queued >= s->opts.max_queue) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    if (m->tail)
        m->tail->next = r;
    else
        m->head = r;
    m->tail = r;
    m->queued++;
    /* Wake every worker holding an instance of this model; the first free one takes it. */
    for (int i = 0; i < m->ninst; i++)
        if (m->inst[i].linked)
            pthread_cond_signal(&m->inst[i].worker->cv);
    pthread_mutex_unlock(&s->mu);
    if (r->deadline_ns)
        kd_sched_expire_arm(s, r->deadline_ns);
    return 0;
}

static void task_finished(struct kd_sched_request *r)
{
    struct kd_sched_task *t = r->ud;
    t->done(t);
}

int kd_sched_device_health(struct kd_sched *s, char *why, size_t whylen)
{
    for (size_t i = 0; s && i < s->nworkers; i++)
        if (worker_lost(&s->workers[i], why, whylen))
            return -1;
    return 0;
}

int kd_sched_device_lost(struct kd_sched *s, const char *device, char *why, size_t whylen)
{
    for (size_t i = 0; s && i < s->nworkers; i++)
        if (worker_is(&s->workers[i], device) && worker_lost(&s->workers[i], why, whylen))
            return 1;
    return 0;
}

void kd_sched_each_device(struct kd_sched *s, void (*fn)(void *ctx, const char *spec, kiln_device *dev), void *ctx)
{
    for (size_t i = 0; s && i < s->nworkers; i++) {
        kiln_device *dev = s->workers[i].dev;
        bool seen = false;
        for (size_t j = 0; j < i && !seen; j++)
            seen = s->workers[j].dev == dev;
        if (dev && !seen)
            fn(ctx, s->workers[i].spec, dev);
    }
}

int kd_sched_worker_for(struct kd_sched *s, const char *device, unsigned hint)
{
    size_t n = 0;
    for (size_t i = 0; i < s->nworkers; i++)
        n += worker_is(&s->workers[i], device);
    if (n == 0)
        return -1;
    size_t k = hint % n;
    for (size_t i = 0; i < s->nworkers; i++)
        if (worker_is(&s->workers[i], device) && k-- == 0)
            return (int)i;
    return -1;
}

int kd_sched_task_submit(struct kd_sched *s, int worker, struct kd_sched_task *t)
{
    if (worker < 0 || (size_t)worker >= s->nworkers)
        return -1;
    struct kd_sched_worker *w = &s->workers[worker];
    t->next = NULL;
    t->shutdown = false;
    t->carrier = (struct kd_sched_request){.done = task_finished, .ud = t};
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    if (w->task_tail)
        w->task_tail->next = t;
    else
        w->task_head = t;
    w->task_tail = t;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void kd_sched_request_clear(struct kd_sched_request *r)
{
    for (int i = 0; i < r->ninputs; i++) {
        if (!r->inputs[i].borrowed)
            free(r->inputs[i].data);
        r->inputs[i].data = NULL;
        r->inputs[i].borrowed = false;
    }
    for (int i = 0; i < r->noutputs; i++) {
        free(r->outputs[i].data);
        r->outputs[i].data = NULL;
    }
    r->ninputs = r->noutputs = 0;
}
