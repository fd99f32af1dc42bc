/*
 * api/tensor_session.c — remote tensor sessions on the loop thread: the /v1/tensor upgrade, the
 * per-session queue, the hop to the session's device worker and back, and teardown.
 *
 * A session's messages are copied into its pending queue as they arrive. When no task of the
 * session is on its worker, everything pending leaves as one task (a pipelined client gets many
 * ops per hop); the worker runs them in order and collects the replies, which the done callback
 * sends. So at most one task per session is ever in flight, and the session's device state
 * (api/tensor_exec.c) is touched by its worker only — never by two threads at once.
 *
 * Teardown: when the connection goes, the session stops taking input; its pending messages are
 * dropped; if a task is in flight the session waits for it, then sends one last task that frees
 * every buffer it held on its device. Only when that task is back is the session freed. If the
 * scheduler has stopped (daemon shutdown), its workers are joined and the buffers are freed on the
 * loop thread instead, before the devices close.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "responses.h"
#include "tensor.h"
#include "tensor_exec.h"
#include "wire.h"
#include "ws.h"

enum scope { SCOPE_NONE = 0, SCOPE_READ = 1, SCOPE_ADMIN = 2 };

struct pmsg {
    struct pmsg *next;
    size_t len;
    uint8_t data[];
};

struct session {
    struct kiln_tensor_service *svc;
    struct kiln_ws *ws;
    struct session *prev, *next;
    int worker;                     /* -1 until the hello named a device */
    bool hello_done;
    bool gone;                      /* the connection is gone */
    bool freeing;                   /* the last task (free everything) is out */
    struct kiln__tstate *state;     /* its worker's, between hops */
    /* messages waiting for the next hop */
    struct pmsg *head, *tail;
    size_t queued;                  /* pending + in flight */
    uint64_t queued_bytes;
    /* the hop in flight */
    bool busy;
    struct kiln_sched_task task;
    struct pmsg *batch;
    size_t batch_n;
    uint64_t batch_bytes;
    struct kiln_buf replies;
};

struct kiln_tensor_service {
    struct kiln_tensor_options o;
    int ntokens;
    char **token;
    enum scope *token_scope;
    bool accepting;
    struct session *sessions;
    size_t nsessions;
    unsigned next_hint;
    struct kiln_metric_series *m_opened, *m_refused, *m_messages, *m_errors;
};

static void tlog(struct kiln_tensor_service *ts, enum kiln_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void tlog(struct kiln_tensor_service *ts, enum kiln_log_level level, const char *fmt, ...)
{
    if (!ts->o.log)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ts->o.log(ts->o.log_ud, level, msg);
}

/* ---- auth ------------------------------------------------------------------------------------ */

static bool same_secret(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    unsigned char diff = na != nb;
    for (size_t i = 0; i < na; i++)
        diff |= (unsigned char)(a[i] ^ b[i % (nb ? nb : 1)]);
    return diff == 0; /* time independent of where the first difference is */
}

/* Remote work needs the read scope, as inference does. 0, or the status of the answer given. */
static int authorize(struct kiln_tensor_service *ts, const struct kiln_request *req, struct kiln_buf *out)
{
    if (ts->ntokens == 0)
        return 0;
    const char *h = req->headers ? req->headers->authorization : "";
    if (strncasecmp(h, "Bearer ", 7) != 0)
        return kiln_resp_error(out, 401, "a bearer token is required", req->keep_alive,
                               "WWW-Authenticate: Bearer\r\n");
    enum scope have = SCOPE_NONE;
    for (int i = 0; i < ts->ntokens; i++)
        if (same_secret(h + 7, ts->token[i]) && ts->token_scope[i] > have)
            have = ts->token_scope[i];
    if (have < SCOPE_READ)
        return kiln_resp_error(out, 401, "invalid bearer token", req->keep_alive,
                               "WWW-Authenticate: Bearer error=\"invalid_token\"\r\n");
    return 0;
}

/* ---- replies --------------------------------------------------------------------------------- */

static void send_error(struct session *s, uint64_t seq, int code, const char *msg)
{
    struct kiln_buf b = {0};
    if (kiln_wire_encode_error(&b, seq, code, msg) == 0)
        kiln_ws_send(s->ws, b.data, b.len);
    kiln_buf_free(&b);
    if (s->svc->m_errors)
        kiln_metric_add(s->svc->m_errors, 1);
}

/* Sends each length-prefixed reply a hop collected. */
static void send_replies(struct session *s, const struct kiln_buf *r)
{
    size_t off = 0;
    while (off + 4 <= r->len) {
        const uint8_t *p = (const uint8_t *)r->data + off;
        size_t n = (size_t)p[0] | (size_t)p[1] << 8 | (size_t)p[2] << 16 | (size_t)p[3] << 24;
        if (n > r->len - off - 4)
            break;
        kiln_ws_send(s->ws, p + 4, n);
        off += 4 + n;
    }
}

/* ---- hops ------------------------------------------------------------------------------------ */

static void free_msgs(struct pmsg *m)
{
    while (m) {
        struct pmsg *next = m->next;
        free(m);
        m = next;
    }
}

static void session_unlink_free(struct session *s)
{
    struct kiln_tensor_service *ts = s->svc;
    if (s->prev)
        s->prev->next = s->next;
    else
        ts->sessions = s->next;
    if (s->next)
        s->next->prev = s->prev;
    ts->nsessions--;
    free_msgs(s->head);
    free_msgs(s->batch);
    kiln_buf_free(&s->replies);
    kiln_ws_free(s->ws);
    free(s);
}

static void run_batch(struct kiln_sched_task *t, kiln_device *dev)
{
    struct session *s = t->ud;
    for (struct pmsg *m = s->batch; m; m = m->next)
        if (kiln__tstate_exec(s->state, dev, m->data, m->len, &s->replies) != 0)
            break; /* out of memory for replies: the rest would go unanswered too */
}

static void run_free(struct kiln_sched_task *t, kiln_device *dev)
{
    struct session *s = t->ud;
    kiln__tstate_free(s->state, dev);
    s->state = NULL;
}

static void kick(struct session *s);

static void free_done(struct kiln_sched_task *t)
{
    struct session *s = t->ud;
    if (s->state) {
        /* The scheduler stopped first: its workers are joined, so this thread may free. */
        kiln__tstate_free(s->state, NULL);
        s->state = NULL;
    }
    session_unlink_free(s);
}

/* The connection is gone and nothing is in flight: free the device side, then the session. */
static void teardown(struct session *s)
{
    if (s->freeing)
        return;
    s->freeing = true;
    free_msgs(s->head);
    s->head = s->tail = NULL;
    if (!s->state) {
        session_unlink_free(s);
        return;
    }
    s->task = (struct kiln_sched_task){.run = run_free, .done = free_done, .ud = s};
    if (kiln_sched_task_submit(s->svc->o.sched, s->worker, &s->task) != 0)
        free_done(&s->task);
}

static void batch_done(struct kiln_sched_task *t)
{
    struct session *s = t->ud;
    s->busy = false;
    if (t->shutdown && !s->gone) {
        /* The daemon is stopping: say so and end the session. */
        kiln_ws_close(s->ws, KILN_WS_GOING_AWAY, "the server is shutting down");
    } else if (!s->gone) {
        send_replies(s, &s->replies);
    }
    s->replies.len = 0;
    free_msgs(s->batch);
    s->batch = NULL;
    s->queued -= s->batch_n;
    s->queued_bytes -= s->batch_bytes;
    s->batch_n = 0;
    s->batch_bytes = 0;
    if (s->gone || t->shutdown) {
        if (s->gone)
            teardown(s);
        return;
    }
    kick(s);
}

static void kick(struct session *s)
{
    if (s->busy || s->gone || !s->head)
        return;
    s->batch = s->head;
    s->head = s->tail = NULL;
    s->batch_n = 0;
    s->batch_bytes = 0;
    for (struct pmsg *m = s->batch; m; m = m->next) {
        s->batch_n++;
        s->batch_bytes += m->len;
    }
    s->task = (struct kiln_sched_task){.run = run_batch, .done = batch_done, .ud = s};
    s->busy = true;
    if (kiln_sched_task_submit(s->svc->o.sched, s->worker, &s->task) != 0) {
        s->busy = false;
        free_msgs(s->batch);
        s->batch = NULL;
        s->queued -= s->batch_n;
        s->queued_bytes -= s->batch_bytes;
        kiln_ws_close(s->ws, KILN_WS_GOING_AWAY, "the server is shutting down");
    }
}

/* ---- messages -------------------------------------------------------------------------------- */

static bool device_allowed(struct kiln_tensor_service *ts, const char *dev)
{
    for (size_t i = 0; i < ts->o.devices->count; i++)
        if (strcmp(ts->o.devices->items[i], dev) == 0)
            return true;
    return false;
}

static void on_hello(struct session *s, const uint8_t *msg, size_t len)
{
    struct kiln_tensor_service *ts = s->svc;
    struct kiln_wire_hello h;
    char why[160];
    if (kiln_wire_decode_hello(msg, len, &h, why, sizeof why) != 0) {
        kiln_ws_close(s->ws, KILN_WS_PROTOCOL_ERROR, why);
        return;
    }
    if (!kiln_wire_version_supported(&h)) {
        char m[160];
        snprintf(m, sizeof m, "unsupported protocol version: kilnd speaks %u", (unsigned)KILN_WIRE_VERSION);
        send_error(s, 0, KILN_WIRE_E_VERSION, m);
        kiln_ws_close(s->ws, KILN_WS_POLICY_VIOLATION, "unsupported protocol version");
        return;
    }
    if (!device_allowed(ts, h.device) ||
        (s->worker = kiln_sched_worker_for(ts->o.sched, h.device, ts->next_hint++)) < 0) {
        char m[200];
        snprintf(m, sizeof m, "device '%.64s' is not one this server drives", h.device);
        send_error(s, 0, KILN_WIRE_E_DEVICE, m);
        kiln_ws_close(s->ws, KILN_WS_POLICY_VIOLATION, "unknown device");
        return;
    }
    struct kiln__tstate_limits lim = {
        .max_live_bytes = (uint64_t)ts->o.limits.max_live_bytes,
        .max_ids = (uint64_t)ts->o.limits.max_ids,
    };
    s->state = kiln__tstate_new(&lim);
    if (!s->state) {
        kiln_ws_close(s->ws, KILN_WS_INTERNAL_ERROR, "out of memory");
        return;
    }
    struct kiln_buf b = {0};
    struct kiln_wire_limits wl = {
        .max_message_bytes = (uint64_t)ts->o.limits.max_message_bytes,
        .max_live_bytes = (uint64_t)ts->o.limits.max_live_bytes,
        .max_ids = (uint64_t)ts->o.limits.max_ids,
        .max_queued_ops = (uint64_t)ts->o.limits.max_queued_ops,
    };
    if (kiln_wire_encode_welcome(&b, h.device, &wl) != 0 || kiln_ws_send(s->ws, b.data, b.len) != 0) {
        kiln_buf_free(&b);
        kiln_ws_close(s->ws, KILN_WS_INTERNAL_ERROR, "out of memory");
        return;
    }
    kiln_buf_free(&b);
    s->hello_done = true;
}

static void on_message(void *ud, const uint8_t *msg, size_t len)
{
    struct session *s = ud;
    struct kiln_tensor_service *ts = s->svc;
    if (ts->m_messages)
        kiln_metric_add(ts->m_messages, 1);
    struct kiln_wire_header h;
    char why[160];
    if (kiln_wire_decode_header(msg, len, &h, why, sizeof why) != 0) {
        kiln_ws_close(s->ws, KILN_WS_PROTOCOL_ERROR, why);
        return;
    }
    if (!s->hello_done) {
        if (h.type != KILN_WIRE_HELLO) {
            kiln_ws_close(s->ws, KILN_WS_PROTOCOL_ERROR, "the first message must be a hello");
            return;
        }
        on_hello(s, msg, len);
        return;
    }
    if (h.type == KILN_WIRE_HELLO) {
        kiln_ws_close(s->ws, KILN_WS_PROTOCOL_ERROR, "hello sent twice");
        return;
    }
    uint64_t byte_cap = (uint64_t)ts->o.limits.max_live_bytes > (uint64_t)ts->o.limits.max_message_bytes
                            ? (uint64_t)ts->o.limits.max_live_bytes
                            : (uint64_t)ts->o.limits.max_message_bytes;
    if (s->queued >= (size_t)ts->o.limits.max_queued_ops) {
        send_error(s, h.seq, KILN_WIRE_E_QUOTA, "too many queued ops: the session exceeds remote.max_queued_ops");
        return;
    }
    if (s->queued_bytes + len > byte_cap) {
        send_error(s, h.seq, KILN_WIRE_E_QUOTA, "too much queued data: wait for earlier work (sync) first");
        return;
    }
    struct pmsg *m = malloc(sizeof *m + len);
    if (!m) {
        send_error(s, h.seq, KILN_WIRE_E_NOMEM, "out of memory queueing the message");
        return;
    }
    m->next = NULL;
    m->len = len;
    memcpy(m->data, msg, len);
    if (s->tail)
        s->tail->next = m;
    else
        s->head = m;
    s->tail = m;
    s->queued++;
    s->queued_bytes += len;
    kick(s);
}

static void on_gone(void *ud)
{
    struct session *s = ud;
    s->gone = true;
    if (!s->busy)
        teardown(s);
}

static const struct kiln_ws_handler ws_handler = {
    .on_message = on_message,
    .on_gone = on_gone,
};

int kiln_tensor_handle(void *ctx, const struct kiln_request *req, struct kiln_buf *out)
{
    struct kiln_tensor_service *ts = ctx;
    int st = authorize(ts, req, out);
    if (st != 0)
        return st;
    if (!ts->accepting)
        return kiln_resp_error(out, 503, "the server is shutting down", req->keep_alive, NULL);
    if (ts->nsessions >= (size_t)ts->o.limits.max_sessions) {
        if (ts->m_refused)
            kiln_metric_add(ts->m_refused, 1);
        return kiln_resp_error(out, 503, "too many remote tensor sessions (remote.max_sessions)", req->keep_alive,
                               "Retry-After: 1\r\n");
    }
    size_t mark = out->len;
    st = kiln_ws_handshake(req, out);
    if (st != 101)
        return st;
    struct session *s = calloc(1, sizeof *s);
    if (s)
        s->ws = kiln_ws_new(req, (uint64_t)ts->o.limits.max_message_bytes, &ws_handler, s);
    if (!s || !s->ws) {
        free(s);
        out->len = mark;
        return kiln_resp_error(out, 500, "out of memory opening a session", req->keep_alive, NULL);
    }
    s->svc = ts;
    s->worker = -1;
    s->next = ts->sessions;
    if (ts->sessions)
        ts->sessions->prev = s;
    ts->sessions = s;
    ts->nsessions++;
    if (ts->m_opened)
        kiln_metric_add(ts->m_opened, 1);
    return 101;
}

/* ---- service --------------------------------------------------------------------------------- */

static double open_sessions(void *ctx)
{
    return (double)((struct kiln_tensor_service *)ctx)->nsessions;
}

static struct kiln_metric_series *counter(struct kiln_metrics *m, const char *name, const char *help)
{
    struct kiln_metric_family *f = kiln_metrics_family(m, name, help, KILN_METRIC_COUNTER, NULL, NULL, 0);
    return f ? kiln_metrics_series(f, NULL) : NULL;
}

struct kiln_tensor_service *kiln_tensor_new(const struct kiln_tensor_options *o, char *err, size_t errlen)
{
    struct kiln_tensor_service *ts = calloc(1, sizeof *ts);
    size_t nt = o->tokens ? o->tokens->count : 0;
    if (ts) {
        ts->o = *o;
        ts->accepting = true;
        ts->token = calloc(nt + 1, sizeof *ts->token);
        ts->token_scope = calloc(nt + 1, sizeof *ts->token_scope);
    }
    if (!ts || !ts->token || !ts->token_scope) {
        snprintf(err, errlen, "out of memory");
        kiln_tensor_free(ts);
        return NULL;
    }
    for (size_t i = 0; i < nt; i++) {
        const char *t = o->tokens->items[i];
        enum scope sc = SCOPE_READ;
        if (strncmp(t, "admin:", 6) == 0) {
            sc = SCOPE_ADMIN;
            t += 6;
        } else if (strncmp(t, "read:", 5) == 0) {
            t += 5;
        }
        if (!*t || !(ts->token[ts->ntokens] = strdup(t))) {
            snprintf(err, errlen, *t ? "out of memory" : "api_tokens: entry %zu has an empty token", i + 1);
            kiln_tensor_free(ts);
            return NULL;
        }
        ts->token_scope[ts->ntokens++] = sc;
    }
    if (o->metrics) {
        ts->m_opened = counter(o->metrics, "kiln_remote_sessions_opened_total", "Remote tensor sessions opened.");
        ts->m_refused = counter(o->metrics, "kiln_remote_sessions_refused_total",
                                "Remote tensor sessions refused because remote.max_sessions were open.");
        ts->m_messages = counter(o->metrics, "kiln_remote_messages_total", "Messages received by remote tensor sessions.");
        ts->m_errors = counter(o->metrics, "kiln_remote_errors_total",
                               "Error messages the loop sent to remote tensor sessions (quota, protocol).");
        if (kiln_metrics_gauge_fn(o->metrics, "kiln_remote_sessions", "Remote tensor sessions open.", open_sessions,
                                  ts) != 0) {
            snprintf(err, errlen, "out of memory");
            kiln_tensor_free(ts);
            return NULL;
        }
    }
    tlog(ts, KILN_LOG_DEBUG, "remote tensor endpoint up: at most %lld sessions", (long long)o->limits.max_sessions);
    return ts;
}

void kiln_tensor_free(struct kiln_tensor_service *ts)
{
    if (!ts)
        return;
    /* Connections are closed by now; a session still listed waited on a task that never came back. */
    while (ts->sessions) {
        struct session *s = ts->sessions;
        if (s->state)
            kiln__tstate_free(s->state, NULL);
        s->state = NULL;
        session_unlink_free(s);
    }
    for (int i = 0; i < ts->ntokens; i++)
        free(ts->token[i]);
    free(ts->token);
    free(ts->token_scope);
    free(ts);
}

void kiln_tensor_set_accepting(struct kiln_tensor_service *ts, bool accepting)
{
    if (ts)
        ts->accepting = accepting;
}

size_t kiln_tensor_sessions(const struct kiln_tensor_service *ts)
{
    return ts ? ts->nsessions : 0;
}
