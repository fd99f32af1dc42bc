/*
 * scheduler/sched-expire.c — queued requests answered at their deadline.
 *
 * A worker drops a request whose deadline (limits.infer_timeout_ms, a gRPC grpc-timeout) has
 * passed when it takes it off the queue. Behind a long run, that is when the run ends: a client
 * promised an answer after 1 s waited for the run, 30 s for a slow model. A timer on the loop,
 * armed for the earliest deadline queued, takes such requests off their queues when it comes and
 * answers them as timed out; what stays is armed for next.
 */
#include <stdio.h>

#include "sched-impl.h"

static void on_expire(uv_timer_t *t)
{
    struct kd_sched *s = t->data;
    s->expire_due_ns = 0;
    uint64_t now = uv_hrtime(), next = 0;
    enum {
        BATCH = 256
    };
    struct kd_sched_request *expired[BATCH];
    int n = 0;
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        return; /* the stop answers what is queued */
    }
    for (struct kd_sched_model *m = s->models; m; m = m->next) {
        struct kd_sched_request *prev = NULL;
        for (struct kd_sched_request *r = m->head, *after; r; r = after) {
            after = r->next;
            bool due = r->deadline_ns && now > r->deadline_ns;
            if (!due || n == BATCH) {
                if (r->deadline_ns && (!next || r->deadline_ns < next))
                    next = due ? now : r->deadline_ns; /* a full batch: the rest at once */
                prev = r;
                continue;
            }
            if (prev)
                prev->next = after;
            else
                m->head = after;
            if (m->tail == r)
                m->tail = prev;
            m->queued--;
            r->next = NULL;
            r->started_ns = r->finished_ns = now;
            r->outcome = KD_SCHED_TIMEOUT;
            snprintf(r->error, sizeof r->error, "request timed out after waiting %.1f ms in the queue",
                     (double)(now - r->enqueued_ns) / 1e6);
            /* as a worker counts the ones it drops: taken off the queue, waited, failed */
            m->stats.queue_count++;
            m->stats.queue_ns += now - r->enqueued_ns;
            m->stats.fail_count++;
            m->stats.fail_ns += now - r->enqueued_ns;
            expired[n++] = r;
        }
    }
    pthread_mutex_unlock(&s->mu);
    /* their statistics are taken: once posted, the loop may free them */
    kd_sched_post_done_n(s, expired, n);
    if (next)
        kd_sched_expire_arm(s, next);
}

void kd_sched_expire_init(struct kd_sched *s, uv_loop_t *loop)
{
    uv_timer_init(loop, &s->expire);
    s->expire.data = s;
    /* never what keeps the loop running: the requests' connections do */
    uv_unref((uv_handle_t *)&s->expire);
    s->expire_open = true;
}

void kd_sched_expire_arm(struct kd_sched *s, uint64_t deadline_ns)
{
    if (!s->expire_open || uv_is_closing((uv_handle_t *)&s->expire))
        return;
    if (s->expire_due_ns && s->expire_due_ns <= deadline_ns)
        return; /* it fires sooner, and arms for this one then */
    uint64_t now = uv_hrtime();
    /* the first millisecond after the deadline: the timer counts whole ones */
    uint64_t wait_ms = deadline_ns > now ? (deadline_ns - now) / 1000000u + 1 : 0;
    s->expire_due_ns = deadline_ns;
    uv_timer_start(&s->expire, on_expire, wait_ms, 0);
}

void kd_sched_expire_close(struct kd_sched *s)
{
    if (s->expire_open && !uv_is_closing((uv_handle_t *)&s->expire))
        uv_close((uv_handle_t *)&s->expire, NULL);
}
