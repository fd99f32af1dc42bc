/*
 * api/server.c — libuv TCP server around http_conn.
 *
 * Each connection owns a TCP handle and one timer. The timer is the idle timeout while no request
 * is in progress and the request timeout from a request's first byte until its response, so a
 * client dripping bytes cannot hold a connection forever. Responses accumulate in the
 * connection's out buffer and leave with one uv_try_write per read (the rest, if the socket is
 * full, in one uv_write); while a write is pending and the backlog is large, reading stops. An
 * upgraded protocol is told each time its output was taken, so it can hand over the next piece.
 * A connection that answered an error is shut down for writing and then lingers briefly, reading
 * and discarding, so the client receives the error instead of a reset.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <sys/socket.h>

#include "conn-limit.h"
#include "listener.h"
#include "logf.h"
#include "server.h"

#define READ_BUF_SIZE (64u * 1024u)
#define BACKLOG_HIGH (1u << 20)     /* stop reading while this much output is unsent */
#define LINGER_MS 1000
/* How long a request still arriving when the drain starts may take to arrive whole (capped
 * by request_timeout_ms): enough for a client mid-upload, short enough that a stalled one
 * does not hold the stop (kd_http_conn_drain). */
#define KD_DRAIN_ARRIVAL_MS 1000u
#define MAX_STATUS_SLOTS 16

struct status_slot {
    int code;
    struct kd_metric_series *series;
};

struct route_metrics {
    const char *label;
    struct status_slot slots[MAX_STATUS_SLOTS];
    struct kd_metric_series *latency;
};

struct conn {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_write_t wreq;
    uv_shutdown_t sreq;
    struct kd_http_conn http;
    struct kd_buf wbuf; /* bytes handed to uv_write, kept alive until its callback */
    struct kd_server *srv;
    struct conn *prev, *next;
    unsigned last_responses;
    int open_handles;
    bool writing;
    bool reading;
    bool timer_is_request;
    bool peer_eof;
    bool close_armed;               /* the timer now bounds how long the last bytes may take */
    bool lingering;
    bool closed;
    enum kd_conn_admission admission; /* served, or refused for the connection limit */
};

struct kd_server {
    uv_loop_t *loop;
    struct kd_listener listener;
    bool listener_open;
    struct kd_server_options opts;
    struct conn *conns;
    size_t nconns;
    uint64_t accepted;              /* connections ever accepted: their ids */
    int port;
    bool draining;
    void (*drained)(void *ud);
    void *drained_ud;
    struct kd_metric_family *requests;
    struct kd_metric_family *latency;
    struct route_metrics *rm; /* router.count + 2 entries: "other", then the split route's */
    char *split_label;        /* that last entry's label (kd_http_service.split_suffix), made here */
    char readbuf[READ_BUF_SIZE];
};

static void slog(struct kd_server *s, enum kd_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void slog(struct kd_server *s, enum kd_log_level level, const char *fmt, ...)
{
    if (level > s->opts.log_level) /* skip the formatting of lines nobody keeps (per-connection debug) */
        return;
    va_list ap;
    va_start(ap, fmt);
    kd_api_logv(s->opts.log, s->opts.log_ud, level, fmt, ap);
    va_end(ap);
}

/* ---- metrics ----------------------------------------------------------------------------- */

static double open_connections(void *ctx)
{
    return (double)((struct kd_server *)ctx)->nconns;
}

static struct kd_metric_series *status_series(struct kd_server *s, struct route_metrics *rm, int code)
{
    for (size_t i = 0; i < MAX_STATUS_SLOTS; i++) {
        if (rm->slots[i].code == code)
            return rm->slots[i].series;
        if (rm->slots[i].code == 0) {
            char text[16];
            snprintf(text, sizeof text, "%d", code);
            struct kd_metric_series *series = kd_metrics_series(s->requests,
                                                                (const char *const[]){rm->label, text, NULL});
            if (series)
                rm->slots[i] = (struct status_slot){code, series};
            return series;
        }
    }
    char text[16];
    snprintf(text, sizeof text, "%d", code);
    return kd_metrics_series(s->requests, (const char *const[]){rm->label, text, NULL});
}

static void observe(void *ctx, size_t route, int status, uint64_t elapsed_ns)
{
    struct kd_server *s = ctx;
    struct route_metrics *rm = &s->rm[route];
    struct kd_metric_series *count = status_series(s, rm, status);
    if (count)
        kd_metric_add(count, 1);
    if (rm->latency)
        kd_metric_observe(rm->latency, (double)elapsed_ns / 1e9);
}

static void free_route_metrics(struct kd_server *s)
{
    free(s->split_label);
    free(s->rm);
    s->split_label = NULL;
    s->rm = NULL;
}

static int register_metrics(struct kd_server *s)
{
    struct kd_metrics *m = s->opts.metrics;
    const struct kd_router *r = &s->opts.service.router;
    /* the routes, "other", then the split route's requests (kd_http_service.split_suffix) */
    s->rm = calloc(r->count + 2, sizeof *s->rm);
    if (!s->rm)
        return -1;
    s->requests = kd_metrics_family(m, "kiln_http_requests_total",
                                    "HTTP responses sent, by route and status code.", KD_METRIC_COUNTER,
                                    (const char *const[]){"route", "code", NULL}, NULL, 0);
    s->latency = kd_metrics_family(m, "kiln_http_request_duration_seconds",
                                   "Time from a request's first byte to its response, by route.",
                                   KD_METRIC_HISTOGRAM, (const char *const[]){"route", NULL},
                                   kd_metrics_request_seconds_buckets, KD_METRICS_REQUEST_SECONDS_NBUCKETS);
    if (!s->requests || !s->latency)
        return -1;
    if (kd_metrics_gauge_fn(m, "kiln_http_open_connections", "Client connections currently open.",
                            open_connections, s) != 0)
        return -1;
    const struct kd_http_service *svc = &s->opts.service;
    for (size_t i = 0; i < r->count + 2; i++) {
        if (i == r->count + 1) {
            if (!svc->split_suffix || svc->split_route >= r->count)
                continue; /* nothing is observed under it */
            char label[256];
            snprintf(label, sizeof label, "%s%s", r->routes[svc->split_route].path, svc->split_suffix);
            s->rm[i].label = s->split_label = strdup(label);
            if (!s->rm[i].label)
                return -1;
        } else {
            s->rm[i].label = i < r->count ? r->routes[i].path : "other";
        }
        s->rm[i].latency = kd_metrics_series(s->latency, (const char *const[]){s->rm[i].label, NULL});
        if (!s->rm[i].latency)
            return -1;
    }
    return 0;
}

/* ---- connections ------------------------------------------------------------------------- */

static void maybe_drained(struct kd_server *s)
{
    if (s->draining && s->nconns == 0 && !s->listener_open && s->drained) {
        void (*done)(void *) = s->drained;
        s->drained = NULL;
        done(s->drained_ud);
    }
}

static void on_handle_closed(uv_handle_t *h)
{
    struct conn *c = h->data;
    if (--c->open_handles > 0)
        return;
    struct kd_server *s = c->srv;
    kd_conn_limit_release(s->opts.conn_limit, c->admission);
    kd_http_conn_free(&c->http);
    kd_buf_free(&c->wbuf);
    free(c);
    s->nconns--;
    if (s->listener_open)
        kd_listener_descriptor_freed(&s->listener);
    maybe_drained(s);
}

static void conn_close(struct conn *c)
{
    if (c->closed)
        return;
    c->closed = true;
    if (c->prev)
        c->prev->next = c->next;
    else
        c->srv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
}

static void on_timer(uv_timer_t *t);
static void after_input(struct conn *c);

static void on_shutdown(uv_shutdown_t *req, int status)
{
    struct conn *c = req->data;
    if (status < 0 && !c->closed)
        conn_close(c);
}

/* All output is out and no more input will be answered: close, or linger if the peer may still send. */
static void conn_finish(struct conn *c)
{
    if (c->closed || c->lingering)
        return;
    if (c->peer_eof || c->srv->draining) {
        conn_close(c);
        return;
    }
    c->lingering = true;
    c->sreq.data = c;
    if (uv_shutdown(&c->sreq, (uv_stream_t *)&c->tcp, on_shutdown) != 0) {
        conn_close(c);
        return;
    }
    uv_timer_start(&c->timer, on_timer, LINGER_MS, 0);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    struct conn *c = h->data;
    /* One buffer for the whole loop: data is consumed (copied or parsed) before the next read. */
    *buf = uv_buf_init(c->srv->readbuf, READ_BUF_SIZE);
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    struct conn *c = stream->data;
    if (c->closed)
        return;
    if (nread > 0) {
        if (!c->lingering)
            kd_http_conn_feed(&c->http, buf->base, (size_t)nread);
    } else if (nread == UV_EOF) {
        c->peer_eof = true;
        if (c->lingering) {
            conn_close(c);
            return;
        }
        uv_read_stop(stream);
        c->reading = false;
        kd_http_conn_eof(&c->http);
    } else if (nread < 0) {
        conn_close(c);
        return;
    }
    after_input(c);
}

static void on_write(uv_write_t *req, int status);

static void flush(struct conn *c)
{
    struct kd_buf *out = &c->http.out;
    if (c->writing || out->len == 0 || c->closed)
        return;
    uv_buf_t b = uv_buf_init(out->data, (unsigned)out->len);
    int n = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
    if (n == (int)out->len) {
        out->len = 0;
        return;
    }
    if (n < 0 && n != UV_EAGAIN) {
        conn_close(c);
        return;
    }
    size_t sent = n > 0 ? (size_t)n : 0;
    /* Hand the unsent tail to uv_write from a buffer of its own, so out can keep filling. */
    struct kd_buf tmp = c->wbuf;
    c->wbuf = *out;
    *out = tmp;
    out->len = 0;
    memmove(c->wbuf.data, c->wbuf.data + sent, c->wbuf.len - sent);
    c->wbuf.len -= sent;
    uv_buf_t rest = uv_buf_init(c->wbuf.data, (unsigned)c->wbuf.len);
    c->wreq.data = c;
    if (uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &rest, 1, on_write) != 0) {
        conn_close(c);
        return;
    }
    c->writing = true;
}

/*
 * Writes the connection's output. Each time the socket layer took all of it, an upgraded protocol
 * may refill it (a WebSocket hands over its queue a bounded piece at a time, ws.h): while the
 * socket takes each piece whole, the next one follows; once a write is in flight, the next piece
 * waits in out until on_write, so output moves on events alone, never on a timer.
 */
static void send_output(struct conn *c)
{
    while (!c->closed && !c->writing && c->http.out.len > 0) {
        flush(c);
        if (c->closed)
            return;
        kd_http_conn_output_taken(&c->http);
    }
}

static void on_write(uv_write_t *req, int status)
{
    struct conn *c = req->data;
    c->writing = false;
    c->wbuf.len = 0;
    if (c->closed)
        return;
    if (status < 0) {
        conn_close(c);
        return;
    }
    after_input(c);
}

static uint64_t s_idle(const struct conn *c)
{
    return c->srv->opts.idle_timeout_ms;
}

static void update_timer(struct conn *c)
{
    struct kd_server *s = c->srv;
    if (c->http.upgraded) {
        /* A WebSocket is idle only when nothing moved either way for idle_timeout_ms. */
        uv_timer_start(&c->timer, on_timer, s->opts.idle_timeout_ms, 0);
        return;
    }
    if (c->http.in_message) {
        if (!c->timer_is_request) {
            c->timer_is_request = true;
            uv_timer_start(&c->timer, on_timer, s->opts.request_timeout_ms, 0);
        }
    } else if (c->timer_is_request || c->http.responses != c->last_responses) {
        c->timer_is_request = false;
        c->last_responses = c->http.responses;
        uv_timer_start(&c->timer, on_timer, s->opts.idle_timeout_ms, 0);
    }
}

/* After any input, timeout or completed write: send what is ready, then decide what comes next. */
static void after_input(struct conn *c)
{
    if (c->closed)
        return;
    if (c->http.failed) {
        conn_close(c);
        return;
    }
    send_output(c);
    /* Pipelined requests held while their answers were written: the next ones, as long as the
     * socket takes their answers at once (else on_write comes back here). */
    while (!c->closed && !c->lingering && c->http.out_paused && !c->writing && c->http.out.len == 0) {
        kd_http_conn_output_room(&c->http);
        send_output(c);
    }
    if (c->closed || c->lingering)
        return;
    if (c->http.failed) { /* an upgraded protocol ran out of memory refilling its output */
        conn_close(c);
        return;
    }
    bool backlog = c->writing && c->http.out.len + c->wbuf.len > BACKLOG_HIGH;
    bool want_read = !c->http.closing && !c->peer_eof && !backlog && kd_http_conn_wants_input(&c->http);
    if (want_read && !c->reading) {
        if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) {
            conn_close(c);
            return;
        }
        c->reading = true;
    } else if (!want_read && c->reading && !c->http.closing) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = false;
    }
    if (c->http.closing) {
        /* A pending response keeps the connection until it is written, also once the peer has
         * half-closed (shutdown(SHUT_WR) after its request): the request may have done something
         * (a job submitted, a model loaded) whose answer the client still reads. A peer that is
         * gone fails the write; the scheduler bounds how long the answer takes. */
        if (!c->writing && c->http.out.len == 0 && !c->http.pending) {
            conn_finish(c);
        } else if (!c->close_armed) {
            c->close_armed = true;
            uv_timer_start(&c->timer, on_timer, s_idle(c), 0);
        }
        return;
    }
    update_timer(c);
}

static void on_timer(uv_timer_t *t)
{
    struct conn *c = t->data;
    /* Lingering is over, or the client stopped reading what it asked for: cut it off. */
    if (c->lingering || c->http.closing || c->writing) {
        if (c->writing && !c->lingering) /* said, as a refusal is: the client may be stuck, not gone */
            slog(c->srv, KD_LOG_INFO,
                 "closing a connection whose client did not read its answers (%zu bytes unsent) within "
                 "idle_timeout_ms (%llu)",
                 c->wbuf.len + c->http.out.len, (unsigned long long)s_idle(c));
        conn_close(c);
        return;
    }
    if (c->http.pending) {
        /* The scheduler bounds a pending request's time; the idle clock waits for it. */
        uv_timer_start(&c->timer, on_timer, s_idle(c), 0);
        return;
    }
    if (c->srv->draining && c->http.in_message) {
        /* the drain's grace for a request still arriving is over */
        kd_http_conn_drain_cut(&c->http);
        after_input(c);
        return;
    }
    if (c->http.in_message)
        slog(c->srv, KD_LOG_DEBUG, "request timed out; closing connection");
    kd_http_conn_timeout(&c->http);
    after_input(c);
}

static void wake_conn(void *ud)
{
    after_input(ud);
}

void kd_peer_name(int fd, char *out, size_t n)
{
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    char ip[INET6_ADDRSTRLEN] = "";
    snprintf(out, n, "-");
    if (getpeername(fd, (struct sockaddr *)&sa, &len) != 0)
        return;
    if (sa.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&sa;
        uv_ip4_name(a, ip, sizeof ip);
        snprintf(out, n, "%s:%d", ip, ntohs(a->sin_port));
    } else if (sa.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&sa;
        uv_ip6_name(a, ip, sizeof ip);
        snprintf(out, n, "[%s]:%d", ip, ntohs(a->sin6_port));
    }
}

void kd_server_peer_name(uv_tcp_t *tcp, char *out, size_t n)
{
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)tcp, &fd) != 0) {
        snprintf(out, n, "-");
        return;
    }
    kd_peer_name(fd, out, n);
}

/* A connection the listener accepted: fd is ours, closed with the connection's handle. */
static void on_connection(void *ud, int fd)
{
    struct kd_server *s = ud;
    enum kd_conn_admission admission = kd_conn_limit_admit(s->opts.conn_limit, "HTTP", fd);
    if (admission == KD_CONN_DROP) {
        close(fd);
        return;
    }
    struct conn *c = calloc(1, sizeof *c);
    if (!c) {
        slog(s, KD_LOG_ERROR, "out of memory accepting a connection");
        kd_conn_limit_release(s->opts.conn_limit, admission);
        close(fd);
        return;
    }
    c->srv = s;
    c->admission = admission;
    uv_tcp_init(s->loop, &c->tcp);
    uv_timer_init(s->loop, &c->timer);
    c->tcp.data = c->timer.data = c;
    c->open_handles = 2;
    s->nconns++;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    kd_http_conn_init(&c->http, &s->opts.service);
    c->http.wake = wake_conn;
    c->http.wake_ud = c;
    c->http.conn_id = ++s->accepted;
    int rc = uv_tcp_open(&c->tcp, fd);
    if (rc != 0)
        close(fd);
    if (rc == 0 && s->opts.service.access)
        kd_server_peer_name(&c->tcp, c->http.peer, sizeof c->http.peer);
    if (rc == 0)
        rc = uv_tcp_nodelay(&c->tcp, 1);
    if (rc == 0)
        rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (rc != 0) {
        slog(s, KD_LOG_WARN, "setting up a connection failed: %s", uv_strerror(rc));
        conn_close(c);
        return;
    }
    c->reading = true;
    if (admission == KD_CONN_REFUSE) {
        /* answered before its request is read; conn_finish then lingers, reading and dropping
         * what the client sends, so that the close does not reset the answer away */
        char msg[160];
        snprintf(msg, sizeof msg,
                 "kilnd has limits.max_connections (%zu) client connections open; try again later",
                 s->opts.conn_limit->max);
        kd_http_conn_refuse(&c->http, 503, msg, "Retry-After: 1\r\n");
        after_input(c);
        return;
    }
    uv_timer_start(&c->timer, on_timer, s->opts.idle_timeout_ms, 0);
}

/* ---- server ------------------------------------------------------------------------------ */

int kd_server_new(struct kd_server **out, uv_loop_t *loop, const struct kd_server_options *opts)
{
    struct kd_server *s = calloc(1, sizeof *s);
    if (!s)
        return UV_ENOMEM;
    s->loop = loop;
    s->opts = *opts;
    s->opts.service.observe = observe;
    s->opts.service.observe_ctx = s;
    s->opts.service.pid = (int)getpid();
    if (register_metrics(s) != 0) {
        free_route_metrics(s);
        free(s);
        return UV_ENOMEM;
    }
    *out = s;
    return 0;
}

int kd_server_listen(struct kd_server *s, char *err, size_t errlen)
{
    int rc = kd_listener_open(&s->listener, s->loop, s->opts.host, s->opts.port, "HTTP", on_connection, s,
                              s->opts.log, s->opts.log_ud, &s->port, err, errlen);
    s->listener_open = rc == 0;
    return rc;
}

int kd_server_port(const struct kd_server *s)
{
    return s->port;
}

size_t kd_server_connections(const struct kd_server *s)
{
    return s->nconns;
}

static void on_listener_closed(void *ud)
{
    struct kd_server *s = ud;
    s->listener_open = false;
    maybe_drained(s);
}

void kd_server_drain(struct kd_server *s, void (*done)(void *ud), void *ud)
{
    s->draining = true;
    s->drained = done;
    s->drained_ud = ud;
    if (s->listener_open)
        kd_listener_close(&s->listener, on_listener_closed, s);
    for (struct conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        kd_http_conn_drain(&c->http);
        if (c->http.in_message && !c->http.closing && !c->http.upgraded) {
            /* a request still arriving: a client mid-upload finishes within the grace, a
             * stalled one is answered 503 when it ends (on_timer) instead of holding the stop
             * for drain_timeout_ms */
            uint64_t grace = KD_DRAIN_ARRIVAL_MS < s->opts.request_timeout_ms ? KD_DRAIN_ARRIVAL_MS
                                                                              : s->opts.request_timeout_ms;
            c->timer_is_request = true;
            uv_timer_start(&c->timer, on_timer, grace, 0);
        }
        after_input(c);
    }
    maybe_drained(s);
}

void kd_server_close_all(struct kd_server *s)
{
    for (struct conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        conn_close(c);
    }
}

void kd_server_free(struct kd_server *s)
{
    if (!s)
        return;
    free_route_metrics(s);
    free(s);
}
