/*
 * scheduler/sched-pool.c — an idle device's buffer pool handed back to the system.
 *
 * A device keeps the buffers its work frees for reuse (libkiln's caching pools) and gives them
 * back only when an allocation fails. kilnd may run one large batch or training job and then sit
 * idle for hours, holding that memory all along; so once a device has had no work for
 * pool_idle_trim_ms, one of its workers trims its pool (kiln_device_trim). The worker is the
 * thread that owns the device, so the trim goes through its own queue as its batches do.
 *
 * Work is whatever allocates or frees on the device: a batch, a task, a control task (an
 * instance built or freed) and a training job, from the slot it takes to its end. The idle time
 * runs from the end of the last of them; a trim is due once per idle stretch (nothing more is
 * freed into the pool until work comes again). A worker times it when it runs out of work, so
 * the inference path pays one timestamp per run and nothing else.
 */
#include <stdint.h>
#include <string.h>

#include "sched-impl.h"

void kd_sched_pool_work_ended(struct kd_sched_gate *g)
{
    g->work_ended_ns = uv_hrtime();
    g->pool_trimmed = false;
}

uint64_t kd_sched_pool_trim_due(const struct kd_sched *s, const struct kd_sched_worker *w)
{
    const struct kd_sched_gate *g = w->gate;
    if (s->opts.pool_idle_trim_ms <= 0 || g->pool_trimmed || g->jobs > 0 || kd_sched_gate_busy(s, g))
        return 0;
    return g->work_ended_ns + (uint64_t)s->opts.pool_idle_trim_ms * 1000000u;
}

void kd_sched_pool_trim(struct kd_sched *s, struct kd_sched_worker *w)
{
    struct kd_sched_gate *g = w->gate;
    g->pool_trimmed = true; /* the device's other workers leave it to this one */
    pthread_mutex_unlock(&s->mu);
    size_t released = kiln_device_trim(w->dev, SIZE_MAX);
    if (released > 0)
        kd_sched_logf(s, KD_LOG_DEBUG, "device %s: idle for %lld ms; %zu bytes of cached buffers released",
                      kiln_device_name(w->dev), (long long)s->opts.pool_idle_trim_ms, released);
    pthread_mutex_lock(&s->mu);
    g->pool.trims++;
    g->pool.released_bytes += released;
}

void kd_sched_pool_wake(struct kd_sched *s, struct kd_sched_gate *g)
{
    if (s->opts.pool_idle_trim_ms <= 0)
        return;
    for (size_t i = 0; i < s->nworkers; i++)
        if (s->workers[i].gate == g)
            pthread_cond_signal(&s->workers[i].cv);
}

int kd_sched_pool_stats(struct kd_sched *s, const char *device, struct kd_sched_pool_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!s || !device)
        return -1;
    pthread_mutex_lock(&s->mu);
    const struct kd_sched_gate *g = kd_sched_gate_for(s, device);
    if (g)
        *out = g->pool;
    pthread_mutex_unlock(&s->mu);
    return g ? 0 : -1;
}
