/*
 * api/jobs-events.c — GET /v1/jobs/{id}/events: server-sent events read from the job store.
 *
 * A live stream is a deferred response that never finishes while the job runs: the handler
 * writes the SSE header, and each time the training thread appends events (uv_async) the loop
 * appends the rows after the stream's last id to the connection's output and wakes it. A
 * stream ends once its job is final and every event is out; Last-Event-ID (or ?after=) resumes
 * one after a reconnect.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "jobs-impl.h"

/* ---- event streams ------------------------------------------------------------------------- */

void kd_jobs_stream_end(struct kd_jobs *j, struct kd_jobs_stream *s)
{
    for (struct kd_jobs_stream **pp = &j->streams; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    kd_http_pending_finish(s->p, 200);
    free(s);
}

static void stream_wake(struct kd_http_pending *p)
{
    /* The socket layer sends what sits in the connection's output when woken; a pending
     * response that has not finished is exactly what a stream is. */
    if (p->conn && p->conn->wake)
        p->conn->wake(p->conn->wake_ud);
}

bool kd_jobs_final_state(const char *s)
{
    return s && (!strcmp(s, KD_JOB_SUCCEEDED) || !strcmp(s, KD_JOB_FAILED) || !strcmp(s, KD_JOB_CANCELLED));
}

/* What a read of a job's events found. */
enum events_read {
    EVENTS_MORE,   /* the job runs on: more may come */
    EVENTS_ALL,    /* the job is final and every one of its events is out */
    EVENTS_FAILED, /* the store failed a read: why is in err; what was appended is whole events */
};

/*
 * Append the events of job id after *last_seq in SSE form. The state is read in the same locked
 * section as the last events, after them, so an event appended later is seen by the next call;
 * a job's state and its "state" event are stored in one transaction (kd_jobs_transition), so a
 * job read final here has its final event among those read.
 */
static enum events_read append_events(struct kd_jobs *j, int64_t id, int64_t *last_seq, struct kd_buf *out,
                                      char *err, size_t errlen)
{
    for (;;) {
        struct kd_job_event *ev = NULL;
        int n = 0;
        struct kd_job job;
        kd_jobs_store_lock(j);
        int rc = kd_jobstore_events_since(j->o.store, id, *last_seq, 500, &ev, &n, err, errlen);
        int grc = rc == 0 && n < 500 ? kd_jobstore_job_get(j->o.store, id, &job, err, errlen) : 1;
        kd_jobs_store_unlock(j);
        for (int i = 0; rc == 0 && i < n; i++) {
            kd_buf_printf(out, "id: %lld\nevent: %s\ndata: %s\n\n", (long long)ev[i].seq, ev[i].type,
                          ev[i].payload);
            *last_seq = ev[i].seq;
        }
        kd_jobstore_events_free(ev, n);
        if (rc != 0)
            return EVENTS_FAILED;
        if (n == 500)
            continue;
        if (grc == 0) {
            bool final = kd_jobs_final_state(job.state);
            kd_jobstore_job_clear(&job);
            return final ? EVENTS_ALL : EVENTS_MORE;
        }
        /* purged (it had ended): nothing more will come */
        return grc == KD_JOBSTORE_NOT_FOUND ? EVENTS_ALL : EVENTS_FAILED;
    }
}

/* Send what the stream has not seen; end it when its job is over. Returns false when ended. */
static bool stream_pump(struct kd_jobs *j, struct kd_jobs_stream *s)
{
    struct kd_buf *out = kd_http_pending_out(s->p);
    if (!out || out->len > STREAM_OUT_MAX) {
        kd_jobs_stream_end(j, s);
        return false;
    }
    char err[256] = "";
    enum events_read r = append_events(j, s->job_id, &s->last_seq, out, err, sizeof err);
    if (r == EVENTS_FAILED)
        /* Ended rather than left waiting for a wake-up that may not come: the client reconnects
         * after the stream's retry time with Last-Event-ID, and misses nothing. */
        kd_jobs_log(j, KD_LOG_WARN, "job %lld: event stream ended after event %lld: job store: %s",
                    (long long)s->job_id, (long long)s->last_seq, err);
    if (r != EVENTS_MORE) {
        kd_jobs_stream_end(j, s);
        return false;
    }
    stream_wake(s->p);
    return true;
}

void kd_jobs_on_async(uv_async_t *a)
{
    struct kd_jobs *j = a->data;
    kd_jobs_take_finishes(j);
    pthread_mutex_lock(&j->mu);
    bool unsaved = j->unsaved != NULL;
    pthread_mutex_unlock(&j->mu);
    if (unsaved && j->handles_open && !uv_is_active((uv_handle_t *)&j->retry))
        uv_timer_start(&j->retry, kd_jobs_on_retry, RETRY_MS, RETRY_MS);
    for (struct kd_jobs_stream *s = j->streams, *next; s; s = next) {
        next = s->next;
        stream_pump(j, s);
    }
}

void kd_jobs_on_ping(uv_timer_t *t)
{
    struct kd_jobs *j = t->data;
    /* A comment line keeps proxies from timing the stream out and finds clients that left. */
    for (struct kd_jobs_stream *s = j->streams, *next; s; s = next) {
        next = s->next;
        struct kd_buf *out = kd_http_pending_out(s->p);
        if (!out) {
            kd_jobs_stream_end(j, s);
            continue;
        }
        kd_buf_puts(out, ": ping\n\n");
        stream_wake(s->p);
    }
}
int kd_jobs_handle_events(struct kd_jobs *j, int64_t id, const struct kd_request *req, struct kd_buf *out)
{
    struct kd_job job;
    int st = kd_jobs_get_job(j, id, &job, req, out);
    if (st)
        return st;
    kd_jobstore_job_clear(&job);
    static const char *const params[] = {"after", NULL};
    struct kd_jobs_query q;
    if ((st = kd_jobs_query_read(req, params, &q, out)) != 0)
        return st;
    int64_t after = 0;
    const char *num = kd_jobs_query_get(&q, "after");
    /* RFC 9110 section 5.5: a field value's surrounding whitespace (OWS) is not part of it. */
    const char *lei = req->headers ? req->headers->last_event_id : "";
    lei += strspn(lei, " \t");
    size_t lei_len = strlen(lei);
    while (lei_len && (lei[lei_len - 1] == ' ' || lei[lei_len - 1] == '\t'))
        lei_len--;
    if (lei_len) {
        char idbuf[32];
        if (lei_len >= sizeof idbuf)
            return kd_jobs_errorf(out, req, 400, "Last-Event-ID: must be an event id");
        memcpy(idbuf, lei, lei_len);
        idbuf[lei_len] = '\0';
        if (!kd_jobs_parse_i64(idbuf, &after))
            return kd_jobs_errorf(out, req, 400, "Last-Event-ID: must be an event id");
    }
    if (num && !kd_jobs_parse_i64(num, &after))
        return kd_jobs_errorf(out, req, 400, "after: must be an event id");
    /* A finished job's stream is known whole: one ordinary response, and the connection stays
     * usable. */
    struct kd_buf body = {0};
    kd_buf_puts(&body, "retry: 1000\n\n");
    int64_t last = after;
    char err[256] = "";
    enum events_read r = append_events(j, id, &last, &body, err, sizeof err);
    if (r == EVENTS_FAILED) {
        kd_buf_free(&body);
        return kd_jobs_store_errorf(j, out, req, KD_JOBSTORE_FAILED, 500, "job store: %s", err);
    }
    if (r == EVENTS_ALL) {
        st = kd_resp_append(out, 200, "text/event-stream", body.data, body.len, req->keep_alive,
                            "Cache-Control: no-cache\r\n");
        kd_buf_free(&body);
        return st;
    }
    struct kd_jobs_stream *s = calloc(1, sizeof *s);
    struct kd_http_pending *p = s ? kd_http_defer(req) : NULL;
    if (!p) {
        free(s);
        kd_buf_free(&body);
        return kd_jobs_errorf(out, req, 500, "out of memory");
    }
    /* The body runs until the connection closes, so the connection cannot be reused. */
    p->keep_alive = false;
    *s = (struct kd_jobs_stream){j, id, last, p, j->streams};
    j->streams = s;
    /* The events so far go out with the header. Whatever the training thread appends from now
     * on comes with an async wake-up, so nothing is pumped here (a stream must not finish
     * inside its own handler). */
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                               "X-Accel-Buffering: no\r\nConnection: close\r\n\r\n";
    kd_buf_append(out, head, sizeof head - 1);
    kd_buf_append(out, body.data, body.len);
    kd_buf_free(&body);
    return KD_HTTP_DEFERRED;
}
