/*
 * api/tensor-session.c — remote tensor sessions on the loop thread: the /v1/tensor upgrade, the
 * per-session queue, the hop to the session's device worker and back, and teardown.
 *
 * A session's messages are copied into its pending queue as they arrive. When no task of the
 * session is on its worker, everything pending leaves as one task (a pipelined client gets many
 * ops per hop); the worker runs them in order and collects the replies, which the done callback
 * sends. So at most one task per session is ever in flight, and the session's device state
 * (backends/remote/remote-exec.c) is touched by its worker only — never by two threads at once. A hop stops
 * once its replies pass remote.max_message_bytes, or after 20 ms of work (inference on the same
 * worker runs between hops), and leaves the rest for the next one, so a
 * queue of large DOWNLOADs never piles up all its DATA in memory at once. Nor across hops: no hop
 * starts while the session's unsent replies (kd_ws_unsent) are over out_high; the session waits
 * until its client has read them down to half that, so a client that does not read holds at most
 * out_high plus one hop. Meanwhile the socket layer stops reading the connection (ws.h), so TCP
 * pushes back on the client; one that reads nothing for stall_timeout_ms is closed with 1008.
 * Nothing here polls: the replies move as the socket layer writes them, and the session hears
 * (on_drained) when they are down to the mark, both on the socket's events (ws.h).
 *
 * The loop checks each WebSocket message's framing before queueing any of it (a violation gets
 * an ERROR and closes the session) and admits its protocol messages against the queue limits;
 * messages past a limit are answered with QUOTA in their place in the sequence, so replies always
 * go out in the order of the messages they answer.
 *
 * Teardown: when the connection goes, the session stops taking input; its pending messages are
 * dropped; if a task is in flight it stops at its next message and the session waits for it,
 * then sends one last task that frees every buffer it held on its device. Only when that task is
 * back is the session freed. If the scheduler has stopped (daemon shutdown), its workers are
 * joined and the buffers are freed on the loop thread instead, before the devices close.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "auth.h"
#include "common/bytes.h"
#include "logf.h"
#include "remote-exec.h"
#include "responses.h"
#include "tensor-devices.h"
#include "tensor.h"
#include "wire.h"
#include "ws.h"

/* The longest a hop runs a session's ops before the worker turns to other work (at least one
 * op runs per hop). */
#define HOP_TIME_NS (20u * 1000u * 1000u)

/* One WebSocket message's worth of protocol messages waiting for the worker. */
struct pmsg {
    struct pmsg *next;
    size_t len;
    size_t off;   /* bytes the worker already ran */
    bool refused; /* headers only: each gets a QUOTA error */
    uint8_t data[];
};

struct session {
    struct kd_tensor_service *svc;
    struct kd_ws *ws;
    struct session *prev, *next;
    int worker;       /* -1 until the hello named a device */
    uint16_t version; /* negotiated; 0 before the HELLO */
    uint64_t hello_seq;
    bool hello_sent;            /* the HELLO went to the worker */
    bool hello_done;            /* the WELCOME went out: messages may flow */
    unsigned id;                /* for the log: sessions are numbered from 1 as they open */
    char device[64];            /* the device its HELLO named, for the log */
    uint64_t ran_total;         /* protocol messages run, for the log line at its close */
    atomic_bool gone;           /* the connection is gone (the worker reads it too: its hop stops) */
    bool freeing;               /* the last task (free everything) is out */
    bool fatal;                 /* out of memory on the worker: closing */
    bool stalled;               /* unsent replies over out_high: no hop until they drain */
    struct kiln__tstate *state; /* its worker's, between hops */
    uint64_t live_bytes, ids;   /* the state's figures after the last hop (for /metrics) */
    /* messages waiting for the next hop */
    struct pmsg *head, *tail;
    size_t queued; /* protocol messages pending + in flight */
    uint64_t queued_bytes;
    uint64_t refused_bytes; /* headers of refused messages waiting for their errors */
    /* the hop in flight */
    bool busy;
    struct kd_sched_task task;
    struct pmsg *batch;
    size_t ran; /* what the hop ran, for the loop to account */
    uint64_t ran_bytes, ran_refused;
    kiln_wire_buf replies;
};

struct kd_tensor_service {
    struct kd_tensor_service_options o;
    struct kd_offered_devices offered; /* what HELLOs may name (tensor-devices.h) */
    struct kd_auth *auth;
    bool accepting;
    struct session *sessions;
    size_t nsessions;
    unsigned next_hint;
    unsigned next_id;
    uint64_t refused_run; /* sessions refused at remote.max_sessions since the warning (0: none) */
    struct kd_metric_series *m_opened, *m_refused, *m_messages, *m_errors, *m_dropped;
};

#define tlog(ts, level, ...) kd_api_logf((ts)->o.log, (ts)->o.log_ud, (level), __VA_ARGS__)

/* ---- replies --------------------------------------------------------------------------------- */

/* An ERROR from the loop itself (protocol violations, before the session has a device state). */
static void send_error(struct session *s, uint64_t seq, uint16_t failed_type, kiln_wire_err code, const char *text)
{
    kiln_wire_buf b = {0};
    kiln_wire_msg m = {
        .h = {.version = s->version ? s->version : KILN_WIRE_VERSION_MAX, .type = KILN_WIRE_ERROR, .seq = seq}};
    size_t n = strlen(text);
    m.u.error.code = (uint32_t)code;
    m.u.error.failed_type = failed_type;
    m.u.error.text_len = (uint16_t)(n > KILN_WIRE_TEXT_MAX ? KILN_WIRE_TEXT_MAX : n);
    m.u.error.text = (const uint8_t *)text;
    char why[96];
    if (kiln_wire_encode(&b, &m, why, sizeof why) == 0)
        kd_ws_send(s->ws, b.p, b.len);
    kiln_wire_buf_free(&b);
    if (s->svc->m_errors)
        kd_metric_add(s->svc->m_errors, 1);
}

/* A protocol violation: say why, then close. Nothing of the offending WebSocket message runs. */
static void violation(struct session *s, uint64_t seq, uint16_t type, const char *why)
{
    tlog(s->svc, KD_LOG_WARN, "remote session %u: protocol violation, closing: %s", s->id, why);
    send_error(s, seq, type, KILN_WIRE_ERR_PROTOCOL, why);
    kd_ws_close(s->ws, KD_WS_PROTOCOL_ERROR, why);
}

/* Sends each protocol message a hop collected as its own WebSocket message. */
static void send_replies(struct session *s, const kiln_wire_buf *r)
{
    size_t off = 0;
    while (r->len - off >= KILN_WIRE_HEADER_SIZE) {
        size_t n = KILN_WIRE_HEADER_SIZE + (size_t)kiln_le32(r->p + off + 20);
        if (n > r->len - off)
            break;
        kd_ws_send(s->ws, r->p + off, n);
        off += n;
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
    struct kd_tensor_service *ts = s->svc;
    if (s->prev)
        s->prev->next = s->next;
    else
        ts->sessions = s->next;
    if (s->next)
        s->next->prev = s->prev;
    ts->nsessions--;
    if (ts->refused_run && ts->accepting) {
        tlog(ts, KD_LOG_INFO, "remote sessions accepted again; %llu were refused at remote.max_sessions",
             (unsigned long long)ts->refused_run);
        ts->refused_run = 0;
    }
    free_msgs(s->head);
    free_msgs(s->batch);
    kiln_wire_buf_free(&s->replies);
    kd_ws_free(s->ws);
    free(s);
}

/* Worker: the session's device state, and the WELCOME that describes the device. */
static void run_hello(struct kd_sched_task *t, kiln_device *dev)
{
    struct session *s = t->ud;
    struct kd_tensor_service *ts = s->svc;
    uint64_t maxmsg = (uint64_t)ts->o.limits.max_message_bytes;
    struct kiln__tstate_limits lim = {
        .max_live_bytes = (uint64_t)ts->o.limits.max_live_bytes,
        .max_ids = (uint64_t)ts->o.limits.max_ids,
        .max_data_bytes = maxmsg - KILN_WIRE_HEADER_SIZE,
    };
    s->state = kiln__tstate_new(&lim, s->version);
    if (!s->state) {
        s->fatal = true;
        return;
    }
    kiln_wire_msg m = {.h = {.version = s->version, .type = KILN_WIRE_WELCOME, .seq = s->hello_seq}};
    m.u.welcome.version = s->version;
    m.u.welcome.dtype_mask = kiln__tstate_dtype_mask(dev);
    m.u.welcome.max_message_bytes = maxmsg;
    m.u.welcome.max_live_bytes = (uint64_t)ts->o.limits.max_live_bytes;
    m.u.welcome.max_ids = (uint32_t)ts->o.limits.max_ids;
    m.u.welcome.max_queued_ops = (uint32_t)ts->o.limits.max_queued_ops;
    for (size_t i = 0; i < ts->offered.n && m.u.welcome.ndevices < KILN_WIRE_MAX_DEVICES; i++)
        strcpy(m.u.welcome.devices[m.u.welcome.ndevices++], ts->offered.v[i].name);
    char why[96];
    if (kiln_wire_encode(&s->replies, &m, why, sizeof why) != 0)
        s->fatal = true;
}

/*
 * Worker: runs the batch's messages in order, one protocol message at a time, until the replies
 * collected pass the hop's budget; what is left goes back to the queue for the next hop.
 */
static void run_batch(struct kd_sched_task *t, kiln_device *dev)
{
    struct session *s = t->ud;
    size_t budget = (size_t)s->svc->o.limits.max_message_bytes;
    /* A hop also ends after HOP_TIME_NS of work: the worker takes inference between hops, so a
     * session that queued seconds of ops delays a request by one hop, not by all of them. And it
     * ends when the client has gone, whose remaining ops are dropped, not run. */
    uint64_t deadline = uv_hrtime() + HOP_TIME_NS;
    size_t ran = 0;
    for (struct pmsg *m = s->batch; m && !s->fatal; m = m->next) {
        while (m->off < m->len) {
            if (s->replies.len >= budget || atomic_load_explicit(&s->gone, memory_order_relaxed) ||
                (ran > 0 && uv_hrtime() >= deadline))
                return;
            ran++;
            const uint8_t *h = m->data + m->off;
            if (m->refused) {
                /* Only the header was kept: answer it in its place in the sequence. */
                kiln_wire_msg r = {
                    .h = {.version = s->version, .type = KILN_WIRE_ERROR, .seq = kiln_le64(h + 12)}};
                static const char text[] = "not queued: the session has remote.max_queued_ops messages (or "
                                           "their bytes) waiting; sync before sending more";
                r.u.error.code = KILN_WIRE_ERR_QUOTA;
                r.u.error.failed_type = kiln_le16(h + 6);
                r.u.error.text_len = (uint16_t)(sizeof text - 1);
                r.u.error.text = (const uint8_t *)text;
                char why[96];
                if (kiln_wire_encode(&s->replies, &r, why, sizeof why) != 0) {
                    s->fatal = true;
                    return;
                }
                m->off += KILN_WIRE_HEADER_SIZE;
                s->ran_refused += KILN_WIRE_HEADER_SIZE;
                continue;
            }
            size_t n = KILN_WIRE_HEADER_SIZE + (size_t)kiln_le32(h + 20); /* checked on the loop */
            if (kiln__tstate_exec(s->state, dev, h, n, &s->replies) != 0) {
                s->fatal = true; /* out of memory for the replies */
                return;
            }
            m->off += n;
            s->ran++;
            s->ran_bytes += n;
        }
    }
}

static void run_free(struct kd_sched_task *t, kiln_device *dev)
{
    (void)dev;
    struct session *s = t->ud;
    kiln__tstate_free(s->state);
    s->state = NULL;
}

static void kick(struct session *s);

static void free_done(struct kd_sched_task *t)
{
    struct session *s = t->ud;
    if (s->state) {
        /* The scheduler stopped first: its workers are joined, so this thread may free. */
        kiln__tstate_free(s->state);
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
    if (s->svc->m_dropped && s->queued) /* what the client sent and left before it ran */
        kd_metric_add(s->svc->m_dropped, (double)s->queued);
    if (s->hello_done)
        tlog(s->svc, KD_LOG_INFO, "remote session %u on %s closed: %llu messages run, %llu left unrun", s->id,
             s->device, (unsigned long long)s->ran_total, (unsigned long long)s->queued);
    free_msgs(s->head);
    s->head = s->tail = NULL;
    s->live_bytes = 0;
    if (!s->state) {
        session_unlink_free(s);
        return;
    }
    s->task = (struct kd_sched_task){.run = run_free, .done = free_done, .ud = s};
    if (kd_sched_task_submit(s->svc->o.sched, s->worker, &s->task) != 0)
        free_done(&s->task);
}

static void hop_finished(struct session *s, bool shutdown)
{
    s->busy = false;
    if (s->state) {
        /* The worker is done with the state until the next hop: its figures are safe to read. */
        s->live_bytes = kiln__tstate_live_bytes(s->state);
        s->ids = kiln__tstate_ids(s->state);
    }
    if (shutdown && !s->gone)
        kd_ws_close(s->ws, KD_WS_GOING_AWAY, "the server is shutting down");
    else if (!s->gone)
        send_replies(s, &s->replies); /* past what the socket takes at once, they follow as it writes */
    s->replies.len = 0;
    if (s->fatal && !s->gone)
        kd_ws_close(s->ws, KD_WS_INTERNAL_ERROR, "out of memory running the session");
}

static void hello_done(struct kd_sched_task *t)
{
    struct session *s = t->ud;
    hop_finished(s, t->shutdown);
    if (s->gone) {
        teardown(s);
        return;
    }
    if (!t->shutdown && !s->fatal) {
        s->hello_done = true;
        tlog(s->svc, KD_LOG_INFO, "remote session %u opened on %s (%zu open)", s->id, s->device,
             s->svc->nsessions);
    }
}

static void batch_done(struct kd_sched_task *t)
{
    struct session *s = t->ud;
    hop_finished(s, t->shutdown);
    /* Whatever the hop did not reach goes back in front of what arrived meanwhile. */
    while (s->batch && s->batch->off >= s->batch->len) {
        struct pmsg *m = s->batch;
        s->batch = m->next;
        free(m);
    }
    if (s->batch) {
        struct pmsg *last = s->batch;
        while (last->next)
            last = last->next;
        last->next = s->head;
        if (!s->head)
            s->tail = last;
        s->head = s->batch;
        s->batch = NULL;
    }
    s->queued -= s->ran;
    s->ran_total += s->ran;
    s->queued_bytes -= s->ran_bytes;
    s->refused_bytes -= s->ran_refused;
    s->ran = s->ran_bytes = s->ran_refused = 0;
    if (s->gone) {
        teardown(s);
        return;
    }
    if (t->shutdown || s->fatal)
        return;
    kick(s);
}

/* The unsent replies past which a session runs no more hops: remote.max_message_bytes, but
 * never so low that the socket layer's cap (ws.h) could leave it reading a stalled client. */
static uint64_t out_high(const struct kd_tensor_service *ts)
{
    uint64_t m = (uint64_t)ts->o.limits.max_message_bytes;
    return m > 2ull * KD_WS_OUT_CAP ? m : 2ull * KD_WS_OUT_CAP;
}

static void kick(struct session *s)
{
    if (s->busy || s->gone || s->fatal || !s->head || s->stalled)
        return;
    if (kd_ws_unsent(s->ws) > out_high(s->svc)) {
        s->stalled = true;
        kd_ws_wait_drain(s->ws, out_high(s->svc) / 2, s->svc->o.stall_timeout_ms);
        return;
    }
    s->batch = s->head;
    s->head = s->tail = NULL;
    s->ran = s->ran_bytes = s->ran_refused = 0;
    s->task = (struct kd_sched_task){.run = run_batch, .done = batch_done, .ud = s};
    s->busy = true;
    if (kd_sched_task_submit(s->svc->o.sched, s->worker, &s->task) != 0) {
        s->busy = false;
        kd_ws_close(s->ws, KD_WS_GOING_AWAY, "the server is shutting down");
    }
}

/* ---- messages -------------------------------------------------------------------------------- */

/* The first WebSocket message: exactly one HELLO. The WELCOME comes from the device's worker. */
static void on_hello(struct session *s, const uint8_t *msg, size_t len)
{
    struct kd_tensor_service *ts = s->svc;
    kiln_wire_msg m;
    size_t used;
    char why[256];
    int rc = kiln_wire_decode(msg, len, 0, &m, &used, why, sizeof why);
    if (rc == KILN_WIRE_EFRAME) {
        violation(s, 0, 0, why);
        return;
    }
    if (m.h.type != KILN_WIRE_HELLO) {
        violation(s, m.h.seq, m.h.type, "the first message must be a HELLO");
        return;
    }
    if (rc != 0) {
        violation(s, m.h.seq, m.h.type, why);
        return;
    }
    if (used != len) {
        violation(s, m.h.seq, m.h.type, "a HELLO travels alone in its WebSocket message; wait for the WELCOME");
        return;
    }
    uint16_t lo = m.u.hello.min_version > KILN_WIRE_VERSION_MIN ? m.u.hello.min_version : KILN_WIRE_VERSION_MIN;
    uint16_t hi = m.u.hello.max_version < KILN_WIRE_VERSION_MAX ? m.u.hello.max_version : KILN_WIRE_VERSION_MAX;
    if (lo > hi) {
        snprintf(why, sizeof why, "no common protocol version: the client speaks %u..%u, kilnd %u..%u",
                 (unsigned)m.u.hello.min_version, (unsigned)m.u.hello.max_version, (unsigned)KILN_WIRE_VERSION_MIN,
                 (unsigned)KILN_WIRE_VERSION_MAX);
        tlog(ts, KD_LOG_INFO, "remote session %u refused: %s", s->id, why);
        send_error(s, m.h.seq, KILN_WIRE_HELLO, KILN_WIRE_ERR_VERSION, why);
        kd_ws_close(s->ws, KD_WS_POLICY_VIOLATION, "no common protocol version");
        return;
    }
    s->version = hi;
    snprintf(s->device, sizeof s->device, "%s", m.u.hello.device);
    const struct kd_offered_device *od = kd_offered_named(&ts->offered, m.u.hello.device);
    if (!od || (s->worker = kd_sched_worker_for(ts->o.sched, od->spec, ts->next_hint++)) < 0) {
        /* name the devices it does offer, so the client's error says what to ask for */
        char list[96] = "";
        size_t used_l = 0;
        for (size_t i = 0; i < ts->offered.n && used_l < sizeof list; i++) {
            int n = snprintf(list + used_l, sizeof list - used_l, "%s%s", i ? ", " : "", ts->offered.v[i].name);
            if (n < 0)
                break;
            used_l += (size_t)n;
        }
        if (ts->offered.n)
            snprintf(why, sizeof why,
                     "device '%s' is not one this server drives for remote sessions (it drives: %.80s)",
                     m.u.hello.device, list);
        else
            snprintf(why, sizeof why,
                     "device '%s' is not one this server drives for remote sessions (it offers none: devices "
                     "configured with options, or remote ones, are not offered)",
                     m.u.hello.device);
        tlog(ts, KD_LOG_INFO, "remote session %u refused: %s", s->id, why);
        send_error(s, m.h.seq, KILN_WIRE_HELLO, KILN_WIRE_ERR_VERSION, why);
        kd_ws_close(s->ws, KD_WS_POLICY_VIOLATION, "unknown device");
        return;
    }
    s->hello_seq = m.h.seq;
    s->hello_sent = true;
    s->task = (struct kd_sched_task){.run = run_hello, .done = hello_done, .ud = s};
    s->busy = true;
    if (kd_sched_task_submit(ts->o.sched, s->worker, &s->task) != 0) {
        s->busy = false;
        kd_ws_close(s->ws, KD_WS_GOING_AWAY, "the server is shutting down");
    }
}

static struct pmsg *new_pmsg(const uint8_t *data, size_t len, bool refused)
{
    struct pmsg *m = malloc(sizeof *m + len);
    if (!m)
        return NULL;
    m->next = NULL;
    m->len = len;
    m->off = 0;
    m->refused = refused;
    if (data && len)
        memcpy(m->data, data, len);
    return m;
}

static void enqueue(struct session *s, struct pmsg *m)
{
    if (s->tail)
        s->tail->next = m;
    else
        s->head = m;
    s->tail = m;
}

static void on_message(void *ud, const uint8_t *msg, size_t len)
{
    struct session *s = ud;
    struct kd_tensor_service *ts = s->svc;
    if (s->gone || s->freeing || s->fatal)
        return;
    if (!s->hello_sent) {
        if (ts->m_messages)
            kd_metric_add(ts->m_messages, 1);
        on_hello(s, msg, len);
        return;
    }
    if (!s->hello_done) {
        violation(s, 0, 0, "wait for the WELCOME before sending more");
        return;
    }
    /*
     * Framing first, for the whole WebSocket message: a header that does not hold, a type a
     * client may not send, or a payload running past the message closes the session and
     * nothing of it runs. Payloads are decoded (and their errors answered) on the worker.
     */
    size_t off = 0, count = 0;
    while (off < len) {
        kiln_wire_msg m;
        size_t used;
        char why[200];
        int rc = kiln_wire_decode(msg + off, len - off, s->version, &m, &used, why, sizeof why);
        if (rc == KILN_WIRE_EFRAME) {
            violation(s, m.h.seq, m.h.type, why);
            return;
        }
        if (m.h.type == KILN_WIRE_HELLO || m.h.type >= KILN_WIRE_WELCOME) {
            snprintf(why, sizeof why, "a client may not send %s after the handshake",
                     kiln_wire_type_name(m.h.type));
            violation(s, m.h.seq, m.h.type, why);
            return;
        }
        off += used;
        count++;
    }
    /* protocol messages, as the dropped and error counters and the session's log lines count */
    if (ts->m_messages)
        kd_metric_add(ts->m_messages, (double)count);
    /*
     * Admission: messages are queued in order while the session stays within its queue limits;
     * from the first one that does not fit, the rest of this WebSocket message is refused. A
     * refused message keeps only its header, so its QUOTA error goes out in sequence order.
     */
    uint64_t byte_cap = (uint64_t)ts->o.limits.max_live_bytes > (uint64_t)ts->o.limits.max_message_bytes
                            ? (uint64_t)ts->o.limits.max_live_bytes
                            : (uint64_t)ts->o.limits.max_message_bytes;
    size_t admitted = 0, nadmit = 0;
    while (admitted < len) {
        size_t n = KILN_WIRE_HEADER_SIZE + (size_t)kiln_le32(msg + admitted + 20);
        if (s->queued + nadmit >= (size_t)ts->o.limits.max_queued_ops || s->queued_bytes + admitted + n > byte_cap)
            break;
        admitted += n;
        nadmit++;
    }
    size_t nrefused = count - nadmit;
    if (nrefused && s->refused_bytes + nrefused * KILN_WIRE_HEADER_SIZE > byte_cap) {
        /* A client that ignores its QUOTA errors this long is not going to stop. */
        send_error(s, 0, 0, KILN_WIRE_ERR_QUOTA, "the session keeps sending past its queue limits");
        kd_ws_close(s->ws, KD_WS_POLICY_VIOLATION, "queue limits ignored");
        return;
    }
    if (admitted) {
        struct pmsg *m = new_pmsg(msg, admitted, false);
        if (!m) {
            kd_ws_close(s->ws, KD_WS_INTERNAL_ERROR, "out of memory queueing messages");
            return;
        }
        enqueue(s, m);
        s->queued += nadmit;
        s->queued_bytes += admitted;
    }
    if (nrefused) {
        struct pmsg *m = new_pmsg(NULL, nrefused * KILN_WIRE_HEADER_SIZE, true);
        if (!m) {
            kd_ws_close(s->ws, KD_WS_INTERNAL_ERROR, "out of memory queueing messages");
            return;
        }
        for (size_t o = admitted, k = 0; o < len; k++) {
            memcpy(m->data + k * KILN_WIRE_HEADER_SIZE, msg + o, KILN_WIRE_HEADER_SIZE);
            o += KILN_WIRE_HEADER_SIZE + (size_t)kiln_le32(msg + o + 20);
        }
        enqueue(s, m);
        s->refused_bytes += nrefused * KILN_WIRE_HEADER_SIZE;
        if (ts->m_errors)
            kd_metric_add(ts->m_errors, (double)nrefused);
    }
    kick(s);
}

static void on_gone(void *ud)
{
    struct session *s = ud;
    s->gone = true;
    if (!s->busy)
        teardown(s);
}

static void on_drained(void *ud)
{
    struct session *s = ud;
    s->stalled = false;
    kick(s);
}

static const struct kd_ws_handler ws_handler = {
    .on_message = on_message,
    .on_gone = on_gone,
    .on_drained = on_drained,
};

int kd_tensor_service_handle(void *ctx, const struct kd_request *req, struct kd_buf *out)
{
    struct kd_tensor_service *ts = ctx;
    /* Remote work needs the read scope, as inference does. */
    int st = kd_auth_require(ts->auth, req, KD_AUTH_READ, NULL, out);
    if (st != 0)
        return st;
    /* remote.max_sessions 0 turns the endpoint off for the life of the process: 404, as Triton and
     * KServe servers answer for a feature they were started without (its routes are not served),
     * and without Retry-After. A 503 would say "try again later", and clients and proxies that
     * retry 503s would do so forever. */
    if (ts->o.limits.max_sessions == 0)
        return kd_resp_error(out, 404,
                             "remote tensor sessions are turned off on this server (remote.max_sessions is 0)",
                             req->keep_alive, NULL);
    if (!ts->accepting)
        return kd_resp_error(out, 503, "the server is shutting down", req->keep_alive, NULL);
    if (ts->nsessions >= (size_t)ts->o.limits.max_sessions) {
        if (ts->m_refused)
            kd_metric_add(ts->m_refused, 1);
        /* one warning for a run of refusals, and a line when one is taken again (session_unlink_free) */
        if (ts->refused_run++ == 0)
            tlog(ts, KD_LOG_WARN, "remote.max_sessions (%lld) sessions open: refusing new ones with 503",
                 (long long)ts->o.limits.max_sessions);
        return kd_resp_error(out, 503, "too many remote tensor sessions (remote.max_sessions)", req->keep_alive,
                             "Retry-After: 1\r\n");
    }
    size_t mark = out->len;
    st = kd_ws_handshake(req, out);
    if (st != 101)
        return st;
    struct session *s = calloc(1, sizeof *s);
    if (s)
        atomic_init(&s->gone, false);
    if (s)
        s->ws = kd_ws_new(req, ts->o.loop, (uint64_t)ts->o.limits.max_message_bytes, &ws_handler, s);
    if (!s || !s->ws) {
        free(s);
        out->len = mark;
        return kd_resp_error(out, 500, "out of memory opening a session", req->keep_alive, NULL);
    }
    s->svc = ts;
    s->id = ++ts->next_id;
    s->worker = -1;
    s->next = ts->sessions;
    if (ts->sessions)
        ts->sessions->prev = s;
    ts->sessions = s;
    ts->nsessions++;
    if (ts->m_opened)
        kd_metric_add(ts->m_opened, 1);
    return 101;
}

/* ---- service --------------------------------------------------------------------------------- */

static double open_sessions(void *ctx)
{
    return (double)((struct kd_tensor_service *)ctx)->nsessions;
}

/* As of each session's last completed hop; a closed session counts 0 at once. */
static double live_bytes(void *ctx)
{
    double n = 0;
    for (const struct session *s = ((struct kd_tensor_service *)ctx)->sessions; s; s = s->next)
        n += (double)s->live_bytes;
    return n;
}

static double live_ids(void *ctx)
{
    double n = 0;
    for (const struct session *s = ((struct kd_tensor_service *)ctx)->sessions; s; s = s->next)
        n += s->freeing ? 0 : (double)s->ids;
    return n;
}

static double unsent_bytes(void *ctx)
{
    double n = 0;
    for (const struct session *s = ((struct kd_tensor_service *)ctx)->sessions; s; s = s->next)
        n += s->gone ? 0 : (double)kd_ws_unsent(s->ws);
    return n;
}

static struct kd_metric_series *counter(struct kd_metrics *m, const char *name, const char *help)
{
    struct kd_metric_family *f = kd_metrics_family(m, name, help, KD_METRIC_COUNTER, NULL, NULL, 0);
    return f ? kd_metrics_series(f, NULL) : NULL;
}

struct kd_tensor_service *kd_tensor_service_new(const struct kd_tensor_service_options *o, char *err,
                                                size_t errlen)
{
    struct kd_tensor_service *ts = calloc(1, sizeof *ts);
    if (!ts) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    ts->o = *o;
    ts->accepting = true;
    if (kd_offered_init(&ts->offered, o->devices->count) != 0) {
        snprintf(err, errlen, "out of memory");
        kd_tensor_service_free(ts);
        return NULL;
    }
    kd_sched_each_device(o->sched, kd_offered_add, &ts->offered);
    ts->auth = kd_auth_new(o->tokens, err, errlen);
    if (!ts->auth) {
        kd_tensor_service_free(ts);
        return NULL;
    }
    if (o->metrics) {
        ts->m_opened = counter(
            o->metrics, "kiln_remote_sessions_opened_total",
            "Remote tensor sessions opened (WebSocket upgrades; a HELLO refused later counts too).");
        ts->m_refused = counter(o->metrics, "kiln_remote_sessions_refused_total",
                                "Remote tensor sessions refused because remote.max_sessions were open.");
        ts->m_messages = counter(o->metrics, "kiln_remote_messages_total",
                                 "Protocol messages received by remote tensor sessions (one WebSocket "
                                 "message may carry several).");
        ts->m_errors = counter(o->metrics, "kiln_remote_errors_total",
                               "Error messages the loop sent to remote tensor sessions (quota, protocol).");
        ts->m_dropped = counter(o->metrics, "kiln_remote_messages_dropped_total",
                                "Protocol messages of remote tensor sessions whose client left before they ran, "
                                "not run.");
        if (kd_metrics_gauge_fn(o->metrics, "kiln_remote_sessions", "Remote tensor sessions open.", open_sessions,
                                ts) != 0 ||
            kd_metrics_gauge_fn(o->metrics, "kiln_remote_live_bytes",
                                "Bytes of device memory remote tensor sessions hold in live tensors.", live_bytes,
                                ts) != 0 ||
            kd_metrics_gauge_fn(o->metrics, "kiln_remote_live_ids", "Tensor ids remote tensor sessions hold.",
                                live_ids, ts) != 0 ||
            kd_metrics_gauge_fn(o->metrics, "kiln_remote_unsent_bytes",
                                "Bytes of replies remote tensor sessions have queued that their clients have "
                                "not read yet.",
                                unsent_bytes, ts) != 0) {
            snprintf(err, errlen, "out of memory");
            kd_tensor_service_free(ts);
            return NULL;
        }
    }
    if (o->limits.max_sessions == 0)
        tlog(ts, KD_LOG_DEBUG, "remote tensor endpoint off (remote.max_sessions is 0)");
    else
        tlog(ts, KD_LOG_DEBUG, "remote tensor endpoint up: at most %lld sessions",
             (long long)o->limits.max_sessions);
    return ts;
}

void kd_tensor_service_free(struct kd_tensor_service *ts)
{
    if (!ts)
        return;
    /* Connections are closed by now; a session still listed waited on a task that never came back. */
    while (ts->sessions) {
        struct session *s = ts->sessions;
        kiln__tstate_free(s->state);
        s->state = NULL;
        session_unlink_free(s);
    }
    kd_auth_free(ts->auth);
    kd_offered_free(&ts->offered);
    free(ts);
}

void kd_tensor_service_set_accepting(struct kd_tensor_service *ts, bool accepting)
{
    if (!ts)
        return;
    ts->accepting = accepting;
    if (accepting)
        return;
    /* Draining: sessions have no request boundary to finish at; tell each one why it ends. */
    for (struct session *s = ts->sessions; s; s = s->next)
        if (!s->gone)
            kd_ws_close(s->ws, KD_WS_GOING_AWAY, "the server is shutting down");
}

size_t kd_tensor_service_sessions(const struct kd_tensor_service *ts)
{
    return ts ? ts->nsessions : 0;
}
