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

void kiln__jobs_stream_end(struct kiln_jobs *j, struct kiln__jobs_stream *s)
{
    for (struct kiln__jobs_stream **pp = &j->streams; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    kiln_http_pending_finish(s->p, 200);
    free(s);
}

static void stream_wake(struct kiln_http_pending *p)
{
    /* The socket layer sends what sits in the connection's output when woken; a pending
     * response that has not finished is exactly what a stream is. */
    if (p->conn && p->conn->wake)
        p->conn->wake(p->conn->wake_ud);
}

bool kiln__jobs_final_state(const char *s)
{
    return s && (!strcmp(s, KILN_JOB_SUCCEEDED) || !strcmp(s, KILN_JOB_FAILED) || !strcmp(s, KILN_JOB_CANCELLED));
}

/*
 * Append the events of job id after *last_seq in SSE form; true when the job is final and
 * every one of its events is in out. The state is read in the same locked section as the last
 * events, after them, so an event appended later is seen by the next call; a job's state and
 * its "state" event are stored in one transaction (kiln__jobs_transition), so a job read final
 * here has its final event among those read.
 */
static bool append_events(struct kiln_jobs *j, int64_t id, int64_t *last_seq, struct kiln_buf *out)
{
    bool final = false;
    for (;;) {
        struct kiln_job_event *ev = NULL;
        int n = 0;
        struct kiln_job job;
        kiln__jobs_store_lock(j);
        int rc = kiln_jobstore_events_since(j->o.store, id, *last_seq, 500, &ev, &n, NULL, 0);
        int grc = n < 500 ? kiln_jobstore_job_get(j->o.store, id, &job, NULL, 0) : 1;
        kiln__jobs_store_unlock(j);
        for (int i = 0; rc == 0 && i < n; i++) {
            kiln_buf_printf(out, "id: %lld\nevent: %s\ndata: %s\n\n", (long long)ev[i].seq, ev[i].type,
                            ev[i].payload);
            *last_seq = ev[i].seq;
        }
        kiln_jobstore_events_free(ev, n);
        if (grc == 0) {
            final = kiln__jobs_final_state(job.state);
            kiln_jobstore_job_clear(&job);
        }
        if (rc != 0 || n < 500)
            return final;
    }
}

/* Send what the stream has not seen; end it when its job is over. Returns false when ended. */
static bool stream_pump(struct kiln_jobs *j, struct kiln__jobs_stream *s)
{
    struct kiln_buf *out = kiln_http_pending_out(s->p);
    if (!out || out->len > STREAM_OUT_MAX) {
        kiln__jobs_stream_end(j, s);
        return false;
    }
    if (append_events(j, s->job_id, &s->last_seq, out)) {
        kiln__jobs_stream_end(j, s);
        return false;
    }
    stream_wake(s->p);
    return true;
}

void kiln__jobs_on_async(uv_async_t *a)
{
    struct kiln_jobs *j = a->data;
    kiln__jobs_take_finishes(j);
    for (struct kiln__jobs_stream *s = j->streams, *next; s; s = next) {
        next = s->next;
        stream_pump(j, s);
    }
}

void kiln__jobs_on_ping(uv_timer_t *t)
{
    struct kiln_jobs *j = t->data;
    /* A comment line keeps proxies from timing the stream out and finds clients that left. */
    for (struct kiln__jobs_stream *s = j->streams, *next; s; s = next) {
        next = s->next;
        struct kiln_buf *out = kiln_http_pending_out(s->p);
        if (!out) {
            kiln__jobs_stream_end(j, s);
            continue;
        }
        kiln_buf_puts(out, ": ping\n\n");
        stream_wake(s->p);
    }
}
int kiln__jobs_handle_events(struct kiln_jobs *j, int64_t id, const struct kiln_request *req, struct kiln_buf *out)
{
    struct kiln_job job;
    int st = kiln__jobs_get_job(j, id, &job, req, out);
    if (st)
        return st;
    kiln_jobstore_job_clear(&job);
    int64_t after = 0;
    char num[32];
    if (req->headers && req->headers->last_event_id[0] && !kiln__jobs_parse_i64(req->headers->last_event_id, &after))
        return kiln__jobs_errorf(out, req, 400, "Last-Event-ID: must be an event id");
    if (kiln__jobs_query_param(req, "after", num, sizeof num) && !kiln__jobs_parse_i64(num, &after))
        return kiln__jobs_errorf(out, req, 400, "after: must be an event id");
    /* A finished job's stream is known whole: one ordinary response, and the connection stays
     * usable. */
    struct kiln_buf body = {0};
    kiln_buf_puts(&body, "retry: 1000\n\n");
    int64_t last = after;
    if (append_events(j, id, &last, &body)) {
        st = kiln_resp_append(out, 200, "text/event-stream", body.data, body.len, req->keep_alive,
                              "Cache-Control: no-cache\r\n");
        kiln_buf_free(&body);
        return st;
    }
    struct kiln__jobs_stream *s = calloc(1, sizeof *s);
    struct kiln_http_pending *p = s ? kiln_http_defer(req) : NULL;
    if (!p) {
        free(s);
        kiln_buf_free(&body);
        return kiln__jobs_errorf(out, req, 500, "out of memory");
    }
    /* The body runs until the connection closes, so the connection cannot be reused. */
    p->keep_alive = false;
    *s = (struct kiln__jobs_stream){j, id, last, p, j->streams};
    j->streams = s;
    /* The events so far go out with the header. Whatever the training thread appends from now
     * on comes with an async wake-up, so nothing is pumped here (a stream must not finish
     * inside its own handler). */
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                               "X-Accel-Buffering: no\r\nConnection: close\r\n\r\n";
    kiln_buf_append(out, head, sizeof head - 1);
    kiln_buf_append(out, body.data, body.len);
    kiln_buf_free(&body);
    return KILN_HTTP_DEFERRED;
}
