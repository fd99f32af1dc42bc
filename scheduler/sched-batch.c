/*
 * scheduler/sched-batch.c — the dynamic batcher's decision: how many requests from the head of
 * a model's queue run now, and when to look again (the rules are listed at the top of
 * scheduler.c, which calls it under the scheduler's lock).
 */
#include "sched-impl.h"

int64_t kd_sched_rows_of(const struct kd_sched_model *m, const struct kd_sched_request *r)
{
    return m->cfg.max_batch_size > 0 && r->ninputs > 0 && r->inputs[0].ndim > 0 ? r->inputs[0].shape[0] : 1;
}

/* Whether b can share a run with a: same inputs, same dims past the batch dim. */
static bool compatible(const struct kd_sched_request *a, const struct kd_sched_request *b)
{
    if (a->ninputs != b->ninputs)
        return false;
    for (int i = 0; i < a->ninputs; i++) {
        const struct kd_sched_tensor *x = &a->inputs[i], *y = &b->inputs[i];
        if (x->dtype != y->dtype || x->ndim != y->ndim)
            return false;
        for (int d = 1; d < x->ndim; d++)
            if (x->shape[d] != y->shape[d])
                return false;
    }
    return true;
}

/* The floor of deadline_lead: under it, a worker's wake-up jitter could miss the deadline. */
#define DEADLINE_LEAD_MIN_NS 1000000u

/*
 * Under the lock: how long before r's deadline its batch must go, so that it starts (and, for a
 * client that stops waiting at its deadline, finishes) in time: twice the model's mean run so
 * far, and at least a tenth of the time r was given (the first run's length is not known yet)
 * and DEADLINE_LEAD_MIN_NS.
 */
static uint64_t deadline_lead(const struct kd_sched_model *m, const struct kd_sched_request *r)
{
    const struct kd_sched_stats *st = &m->stats;
    uint64_t lead = st->runs ? 2 * (st->compute_ns / st->runs) : 0;
    uint64_t tenth = r->deadline_ns > r->enqueued_ns ? (r->deadline_ns - r->enqueued_ns) / 10 : 0;
    if (lead < tenth)
        lead = tenth;
    return lead < DEADLINE_LEAD_MIN_NS ? DEADLINE_LEAD_MIN_NS : lead;
}

/*
 * Under the lock: how many requests from the head of m's queue should run now (0: not yet; then
 * *wake_ns says when to look again, 0 for never).
 */
int kd_sched_batch_ready(const struct kd_sched_model *m, uint64_t now, uint64_t *wake_ns)
{
    const struct kd_sched_request *h = m->head;
    if (!h)
        return 0;
    const kd_model_config *c = &m->cfg;
    if (c->max_batch_size <= 0)
        return 1;
    int64_t rows = 0, best_pref = 0;
    int n = 0, n_pref = 0;
    bool blocked = false;
    uint64_t urgent = UINT64_MAX; /* when the first deadline among these requests needs them to go */
    for (const struct kd_sched_request *r = h; r; r = r->next) {
        int64_t b = kd_sched_rows_of(m, r);
        if ((r != h && !compatible(h, r)) || rows + b > c->max_batch_size) {
            blocked = true;
            break;
        }
        rows += b;
        n++;
        if (r->deadline_ns) {
            uint64_t lead = deadline_lead(m, r);
            uint64_t go = r->deadline_ns > lead ? r->deadline_ns - lead : 0;
            if (go < urgent)
                urgent = go;
        }
        for (int p = 0; p < c->npreferred; p++)
            if (c->preferred_batch_sizes[p] == rows && rows > best_pref) {
                best_pref = rows;
                n_pref = n;
            }
    }
    if (n == 0)
        return 1; /* the head alone exceeds the batch limit: let the run report it */
    if (blocked || rows >= c->max_batch_size)
        return n;
    if (n_pref && best_pref == rows)
        return n;
    /* A request's deadline may come before the delay is up (a delay longer than
     * limits.infer_timeout_ms, a gRPC client's short grpc-timeout): waiting for the batch to fill
     * must not turn into a timeout, so the batch goes early for the first deadline in it. */
    uint64_t due = h->enqueued_ns + (uint64_t)c->max_queue_delay_us * 1000u;
    if (urgent < due)
        due = urgent;
    if (c->max_queue_delay_us <= 0 || now >= due)
        return n;
    if (n_pref)
        return n_pref; /* a preferred size is at hand; waiting would only hold it back */
    *wake_ns = due;
    return 0;
}
