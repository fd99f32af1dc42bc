/*
 * scheduler/sched-gate.c — the training gate: how a training job, running on its own thread,
 * takes turns with inference on a device (the contract is in scheduler.h).
 *
 * The gate holds no device and no queue of its own. Whether a device is busy is read, under the
 * scheduler lock, from what the workers already keep: the queues of the models whose instances
 * live on it, each worker's running flag and its task queue. That keeps the inference path free
 * of any new bookkeeping: a worker only broadcasts the gate's condition variable when it runs out
 * of work while a trainer waits.
 *
 * Waits are timed: the starvation bound ends them, and so does a cancel flag, which the job's
 * canceller sets without knowing about the gate, so a waiter looks at it at least every
 * POLL_NS. A sleep that slice long costs nothing next to a training step.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "sched-impl.h"

#define POLL_NS 10000000ull   /* 10 ms */

struct kd_sched_gate *kd_sched_gate_for(struct kd_sched *s, const char *spec)
{
    for (size_t i = 0; i < s->ngates; i++)
        if (strcmp(s->gates[i].spec, spec) == 0)
            return &s->gates[i];
    /* the device's own name for itself ("vulkan:0" for one configured as "vulkan") */
    for (size_t i = 0; i < s->nworkers; i++)
        if (s->workers[i].dev && strcmp(kiln_device_name(s->workers[i].dev), spec) == 0)
            return s->workers[i].gate;
    return NULL;
}

bool kd_sched_gate_busy(const struct kd_sched *s, const struct kd_sched_gate *g)
{
    for (size_t i = 0; i < s->nworkers; i++) {
        const struct kd_sched_worker *w = &s->workers[i];
        if (w->gate == g && (w->running || w->task_head))
            return true;
    }
    for (const struct kd_sched_model *m = s->models; m; m = m->next)
        if (m->gate == g && m->queued > 0)
            return true;
    return false;
}

static bool cancelled(const struct kd_sched_training *t)
{
    return t->cancel && atomic_load(t->cancel);
}

/* Under the lock: sleeps on g until woken, the next poll, or until (0: no limit). */
static void gate_wait(struct kd_sched *s, struct kd_sched_gate *g, uint64_t until)
{
    uint64_t wake = uv_hrtime() + POLL_NS;
    if (until && until < wake)
        wake = until;
    struct timespec ts = {.tv_sec = (time_t)(wake / 1000000000u), .tv_nsec = (long)(wake % 1000000000u)};
    g->waiting++;
    pthread_cond_timedwait(&g->cv, &s->mu, &ts);
    g->waiting--;
}

static int max_jobs(const struct kd_sched *s)
{
    return s->opts.training_max_jobs > 0 ? s->opts.training_max_jobs : 1;
}

/* The calling thread at nice n or lower priority (Linux: a thread's own nice value). */
static void lower_priority(int n)
{
    if (n <= 0)
        return;
    id_t tid = (id_t)gettid();
    errno = 0;
    int cur = getpriority(PRIO_PROCESS, tid);
    if (errno == 0 && cur < n)
        setpriority(PRIO_PROCESS, tid, n); /* best effort: a failure leaves the thread as it was */
}

int kd_sched_training_begin(struct kd_sched *s, const char *device, const atomic_bool *cancel,
                            struct kd_sched_training *t)
{
    memset(t, 0, sizeof *t);
    t->sched = s;
    t->cancel = cancel;
    t->dev = -1;
    if (!s || !device)
        return 0;
    lower_priority(s->opts.training_nice);
    pthread_mutex_lock(&s->mu);
    struct kd_sched_gate *g = kd_sched_gate_for(s, device);
    if (!g) {
        pthread_mutex_unlock(&s->mu);
        return 0;
    }
    while (g->jobs >= max_jobs(s)) {
        if (s->stopping || cancelled(t)) {
            pthread_mutex_unlock(&s->mu);
            return 1;
        }
        gate_wait(s, g, 0);
    }
    g->jobs++;
    g->stats.jobs = g->jobs;
    t->dev = (int)(g - s->gates);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int kd_sched_training_acquire(struct kd_sched_training *t)
{
    if (cancelled(t))
        return 1;
    if (t->dev < 0) {
        t->holding = true;
        return 0;
    }
    struct kd_sched *s = t->sched;
    struct kd_sched_gate *g = &s->gates[t->dev];
    pthread_mutex_lock(&s->mu);
    int64_t bound_ms = s->opts.training_max_wait_ms;
    int rc = 0;
    if (bound_ms > 0 && !s->stopping && kd_sched_gate_busy(s, g)) {
        uint64_t start = uv_hrtime(), until = start + (uint64_t)bound_ms * 1000000u;
        bool forced = false;
        for (;;) {
            if (s->stopping || cancelled(t)) {
                rc = 1;
                break;
            }
            if (!kd_sched_gate_busy(s, g))
                break;
            if (uv_hrtime() >= until) {
                forced = true;
                break;
            }
            gate_wait(s, g, until);
        }
        uint64_t waited = uv_hrtime() - start;
        g->stats.yields++;
        g->stats.forced += forced;
        g->stats.wait_ns += waited;
        t->yields++;
        t->forced += forced;
        t->wait_ns += waited;
    } else if (s->stopping) {
        rc = 1; /* as in the wait: a stopping scheduler means the daemon is going down */
    }
    if (rc == 0)
        t->holding = true;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* A step is counted when it gives the device back: an acquire is not always followed by one
 * (the acquire after a job's last step is ended by kd_sched_training_end), which had counted
 * every job one step more than it ran. */
void kd_sched_training_release(struct kd_sched_training *t)
{
    if (t->holding && t->dev >= 0) {
        struct kd_sched *s = t->sched;
        pthread_mutex_lock(&s->mu);
        s->gates[t->dev].stats.steps++;
        pthread_mutex_unlock(&s->mu);
    }
    t->holding = false;
}

void kd_sched_training_end(struct kd_sched_training *t)
{
    t->holding = false; /* held for a step that never ran */
    if (t->dev < 0)
        return;
    struct kd_sched *s = t->sched;
    struct kd_sched_gate *g = &s->gates[t->dev];
    pthread_mutex_lock(&s->mu);
    g->jobs--;
    g->stats.jobs = g->jobs;
    /* A job waiting for the slot takes it now. */
    if (g->waiting)
        pthread_cond_broadcast(&g->cv);
    /* what the job freed stays in the device's pool: its idle time starts now */
    kd_sched_pool_work_ended(g);
    kd_sched_pool_wake(s, g);
    pthread_mutex_unlock(&s->mu);
    t->dev = -1;
}

void kd_sched_training_wake(struct kd_sched *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->ngates; i++)
        pthread_cond_broadcast(&s->gates[i].cv);
    pthread_mutex_unlock(&s->mu);
}

void kd_sched_training_stats(struct kd_sched *s, struct kd_sched_training_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->ngates; i++) {
        const struct kd_sched_training_stats *g = &s->gates[i].stats;
        out->steps += g->steps;
        out->yields += g->yields;
        out->forced += g->forced;
        out->wait_ns += g->wait_ns;
        out->jobs += g->jobs;
        out->waiting += s->gates[i].waiting;
    }
    pthread_mutex_unlock(&s->mu);
}
