/*
 * backends/remote/remote.c — the "remote" backend: a device that lives in a kilnd, driven over
 * the remote tensor protocol (backends/remote/wire.h, docs/remote-protocol.md).
 *
 * kiln_device_open("remote://host:port/cpu") connects, says HELLO for the server's device "cpu"
 * and gets WELCOME with the negotiated version, the dtypes the device computes and the session's
 * limits. From then on every buffer is a client-chosen id, and buffer_alloc/upload/free and every
 * primitive are encoded into an outgoing batch without waiting: the protocol runs messages in
 * order, so nothing needs an answer until the program reads data back. The batch goes out as one
 * WebSocket message when it is large, and at buffer_download and sync, the only calls that wait.
 *
 * Errors the server reports for pipelined messages arrive later, carrying the failed message's
 * sequence number; the first is kept and the next download or sync fails with its text and the
 * op's name (after which the session goes on). A lost connection makes every later call fail with
 * the reason; every wait is bounded by the timeout_ms option (KILN_REMOTE_TIMEOUT_MS, default
 * 30000), and a wait that runs out says where its timeout was set. Queues: all of a device's
 * queues are its one session (see "queues and events").
 *
 * Flow control: the server queues a bounded number of messages and bytes per session
 * (max_queued_ops, max_message_bytes in WELCOME), so a batch sent because it grew large ends in a
 * SYNC whose answer tells how far the server has got, and the client waits for answers before it
 * would have more than half the queue outstanding. Buffers (remote-buffers.c) are counted against
 * the session's max_live_bytes and max_ids as the server counts them, so an allocation that cannot
 * fit fails at once; freed ones are kept in a small pool by exact size and their ids reused, which
 * saves an ALLOC and a RELEASE per temporary of a training step.
 *
 * One device may be used from several threads: a mutex guards the connection and the batch.
 *
 * This file holds the device (batching, replies, waits), its life cycle, downloads, sync, queues
 * and events; remote-buffers.c the buffers; remote-checks.c the range checks of indices (read with
 * the next download or sync); remote-ops.c encodes the primitives and holds the interface table.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "error-impl.h"
#include "remote-impl.h"
#include "remote-spec.h"
#include "wire.h"

/* ---- errors --------------------------------------------------------------------------------------- */

int kiln__rdev_die(rdev *d, const char *why)
{
    if (!d->dead) {
        d->dead = true;
        snprintf(d->dead_why, sizeof d->dead_why, "%.120s: connection lost: %.360s", d->spec, why);
        atomic_store(&d->lost, true);
    }
    return KILN_EIO;
}

/* The error of a call on a dead device. Call without holding the lock (the message is copied). */
int kiln__rdev_dead_error(const char *what, const char *why)
{
    return kiln__error_set_code(KILN_EIO, "%s: %s", what, why);
}

static const char *name_of(const rdev *d, uint64_t seq)
{
    const char *w = d->names[seq % NAME_RING].seq == seq ? d->names[seq % NAME_RING].what : NULL;
    return w ? w : "message";
}

/* ---- replies -------------------------------------------------------------------------------------- */

static void acked(rdev *d, uint64_t seq)
{
    if (seq <= d->acked_seq || seq > d->sent_seq)
        return;
    d->acked_seq = seq;
    while (d->ring_n && d->ring[d->ring_head].last_seq <= seq) {
        d->bytes_acked = d->ring[d->ring_head].end_bytes;
        d->ring_head = (d->ring_head + 1) % FLUSH_RING;
        d->ring_n--;
    }
}

static struct pend *pend_of(rdev *d, uint64_t seq)
{
    for (size_t i = 0; i < d->npend; i++)
        if (d->pend[i].seq == seq)
            return &d->pend[i];
    return NULL;
}

static void on_error_reply(rdev *d, const kiln_wire_msg *m)
{
    char text[KILN_WIRE_TEXT_MAX + 1];
    size_t n = m->u.error.text_len;
    memcpy(text, m->u.error.text, n);
    text[n] = '\0';
    uint64_t seq = m->h.seq;
    if (!d->welcomed) {
        /* refused at HELLO: no version in common, or no such device */
        d->wait_failed = true;
        if (m->u.error.code == KILN_WIRE_ERR_VERSION && strstr(text, "version"))
            snprintf(d->wait_err, sizeof d->wait_err, "the server refused the session: %.380s (this client speaks "
                     "protocol versions %d..%d)", text, KILN_WIRE_VERSION_MIN, KILN_WIRE_VERSION_MAX);
        else
            snprintf(d->wait_err, sizeof d->wait_err, "the server refused the session: %.440s", text);
        return;
    }
    struct pend *p = seq ? pend_of(d, seq) : NULL;
    if (p || (seq && seq == d->sync_seq)) {
        d->wait_failed = true;
        snprintf(d->wait_err, sizeof d->wait_err, "%.120s: %s failed on the server (%s): %.300s", d->spec,
                 p ? "download" : "sync", kiln_wire_err_name(m->u.error.code), text);
        if (p)
            p->done = true;
        else
            d->sync_done = true;
        return;
    }
    if (seq && seq == d->checks_read_seq)
        d->checks_read_seq = 0; /* the checks go unread; the error says why, as any other */
    if (m->u.error.failed_type == KILN_WIRE_ALLOC && d->names[seq % NAME_RING].seq == seq &&
        d->names[seq % NAME_RING].id) {
        /* the server holds nothing for it: off the session's count (which may already have let
         * the id go, should the program have freed it before the ERROR came) */
        uint64_t nb = d->names[seq % NAME_RING].nbytes;
        d->live_ids -= d->live_ids ? 1 : 0;
        d->live_bytes -= nb < d->live_bytes ? nb : d->live_bytes;
        if (d->nfailed == d->failed_cap) {
            size_t nc = d->failed_cap ? 2 * d->failed_cap : 16;
            uint64_t *nf = realloc(d->failed_ids, nc * sizeof *nf);
            if (nf)
                d->failed_ids = nf, d->failed_cap = nc;
        }
        if (d->nfailed < d->failed_cap)
            d->failed_ids[d->nfailed++] = d->names[seq % NAME_RING].id;
    }
    if (!d->deferred) {
        d->deferred = true;
        d->deferred_seq = seq;
        snprintf(d->deferred_err, sizeof d->deferred_err, "%.120s: %s (message %" PRIu64 ") failed on the server (%s): %.280s",
                 d->spec, name_of(d, seq), seq, kiln_wire_err_name(m->u.error.code), text);
    }
}

static void on_message(void *ud, const uint8_t *p, size_t n)
{
    rdev *d = ud;
    size_t off = 0;
    while (off < n && !d->dead) {
        kiln_wire_msg m;
        size_t used = 0;
        char why[256];
        int rc = kiln_wire_decode(p + off, n - off, d->welcomed ? d->version : 0, &m, &used, why, sizeof why);
        if (rc != 0) {
            char msg[300];
            snprintf(msg, sizeof msg, "the server sent a malformed message: %s", why);
            kiln__rdev_die(d, msg);
            return;
        }
        off += used;
        switch (m.h.type) {
        case KILN_WIRE_WELCOME:
            if (d->welcomed) {
                kiln__rdev_die(d, "the server sent WELCOME twice");
                return;
            }
            d->version = m.u.welcome.version;
            d->dtype_mask = m.u.welcome.dtype_mask;
            d->max_message_bytes = m.u.welcome.max_message_bytes;
            d->max_live_bytes = m.u.welcome.max_live_bytes;
            d->max_ids = m.u.welcome.max_ids;
            d->max_queued_ops = m.u.welcome.max_queued_ops;
            d->welcomed = true;
            break;
        case KILN_WIRE_DATA: {
            if (m.h.seq && m.h.seq == d->checks_read_seq) {
                kiln__rdev_checks_data(d, &m);
                acked(d, m.h.seq);
                break;
            }
            struct pend *q = pend_of(d, m.h.seq);
            if (!q || q->done) {
                kiln__rdev_die(d, "the server sent DATA nobody asked for");
                return;
            }
            if (m.u.data.length != q->n) {
                d->wait_failed = true;
                snprintf(d->wait_err, sizeof d->wait_err, "%s: download of %zu bytes answered with %" PRIu64,
                         d->spec, q->n, m.u.data.length);
            } else if (q->n) {
                memcpy(q->dst, m.u.data.data, q->n);
            }
            q->done = true;
            acked(d, m.h.seq);
            break;
        }
        case KILN_WIRE_SYNC_DONE:
            if (m.h.seq == d->sync_seq)
                d->sync_done = true;
            acked(d, m.h.seq);
            break;
        case KILN_WIRE_ERROR:
            on_error_reply(d, &m);
            acked(d, m.h.seq);
            break;
        default: {
            char msg[96];
            snprintf(msg, sizeof msg, "the server sent %s, which only a client sends", kiln_wire_type_name(m.h.type));
            kiln__rdev_die(d, msg);
            return;
        }
        }
    }
}

/* Reads answers until pred(d) holds. 0, or KILN_EIO with the device dead. */
static int wait_until(rdev *d, bool (*pred)(const rdev *))
{
    while (!pred(d)) {
        if (d->dead)
            return KILN_EIO;
        char why[KILN_ERROR_MAX - 64];
        if (kiln__rconn_pump(d->conn, 1, why, sizeof why) != 0)
            return kiln__rdev_die(d, why);
    }
    return d->dead ? KILN_EIO : 0;
}

/* ---- sending -------------------------------------------------------------------------------------- */

/* Appends m to the batch with the next seq. 0, or a negative code with the error set. */
int kiln__rdev_append(rdev *d, kiln_wire_msg *m, const char *what)
{
    m->h.version = d->version;
    m->h.seq = d->seq + 1;
    char why[256];
    if (kiln_wire_encode(&d->batch, m, why, sizeof why) != 0) {
        return kiln__error_set_code(KILN_ENOMEM, "%s: %s: %s", d->spec, what, why);
    }
    d->seq++;
    d->batch_msgs++;
    d->names[d->seq % NAME_RING].seq = d->seq;
    d->names[d->seq % NAME_RING].what = what;
    d->names[d->seq % NAME_RING].id = m->h.type == KILN_WIRE_ALLOC ? m->u.alloc.id : 0;
    d->names[d->seq % NAME_RING].nbytes = m->h.type == KILN_WIRE_ALLOC ? m->u.alloc.nbytes : 0;
    if (m->h.type == KILN_WIRE_ALLOC) {
        d->live_ids++;
        d->live_bytes += m->u.alloc.nbytes;
    }
    d->batch_answered = m->h.type == KILN_WIRE_DOWNLOAD || m->h.type == KILN_WIRE_SYNC;
    return 0;
}

int kiln__rdev_append_release(rdev *d)
{
    if (!d->nrel)
        return 0;
    uint8_t ids[8 * 512];
    for (size_t i = 0; i < d->nrel; i++)
        for (int b = 0; b < 8; b++)
            ids[8 * i + (size_t)b] = (uint8_t)(d->rel[i] >> (8 * b)); /* little-endian on the wire */
    kiln_wire_msg m = {.h = {.type = KILN_WIRE_RELEASE}};
    m.u.release.count = (uint32_t)d->nrel;
    m.u.release.ids = ids;
    int rc = kiln__rdev_append(d, &m, "release");
    if (rc == 0) {
        d->live_ids -= d->nrel < d->live_ids ? d->nrel : d->live_ids;
        d->live_bytes -= d->rel_bytes < d->live_bytes ? d->rel_bytes : d->live_bytes;
        d->nrel = 0;
        d->rel_bytes = 0;
    }
    return rc;
}

static bool window_ok(const rdev *d)
{
    uint64_t out_msgs = d->sent_seq - d->acked_seq, out_bytes = d->bytes_sent - d->bytes_acked;
    if (out_msgs == 0)
        return true;
    return out_msgs + d->batch_msgs <= d->window_msgs && out_bytes + d->batch.len <= d->max_message_bytes &&
           d->ring_n < FLUSH_RING;
}

/*
 * Sends the batch as one WebSocket message. A batch whose last message gets no answer is given a
 * SYNC, so that the answer says when the server is through it (flow control).
 */
int kiln__rdev_flush(rdev *d)
{
    if (d->dead)
        return KILN_EIO;
    int rc = kiln__rdev_append_release(d);
    if (rc != 0)
        return rc;
    if (!d->batch_msgs)
        return 0;
    if (!d->batch_answered) {
        kiln_wire_msg s = {.h = {.type = KILN_WIRE_SYNC}};
        if ((rc = kiln__rdev_append(d, &s, "sync")) != 0)
            return rc;
    }
    if ((rc = wait_until(d, window_ok)) != 0)
        return rc;
    char why[KILN_ERROR_MAX - 64];
    if (kiln__rconn_send(d->conn, d->batch.p, d->batch.len, why, sizeof why) != 0)
        return kiln__rdev_die(d, why);
    d->bytes_sent += d->batch.len;
    d->sent_seq = d->seq;
    size_t slot = (d->ring_head + d->ring_n) % FLUSH_RING;
    d->ring[slot].last_seq = d->seq;
    d->ring[slot].end_bytes = d->bytes_sent;
    d->ring_n++;
    d->batch.len = 0;
    d->batch_msgs = 0;
    d->batch_answered = false;
    return 0;
}

/* After appending: send when the batch has grown large. */
int kiln__rdev_maybe_flush(rdev *d)
{
    if (d->batch.len < d->flush_bytes && d->batch_msgs < d->flush_msgs)
        return 0;
    int rc = kiln__rdev_flush(d);
    if (rc == 0 && d->ring_n > 1) {
        /* take answers that are already here, without waiting, so the window stays open */
        char why[KILN_ERROR_MAX - 64];
        if (kiln__rconn_pump(d->conn, 0, why, sizeof why) != 0)
            rc = kiln__rdev_die(d, why);
    }
    return rc;
}

/* The pending error of a pipelined message, if any: reported once. */
static int take_deferred(rdev *d, char *out, size_t outlen)
{
    if (!d->deferred)
        return 0;
    d->deferred = false;
    snprintf(out, outlen, "%s", d->deferred_err);
    return KILN_EDEVICE;
}

/* ---- life cycle ----------------------------------------------------------------------------------- */

static bool is_welcomed(const rdev *d)
{
    return d->welcomed || d->wait_failed;
}

static void free_dev(rdev *d)
{
    kiln__rconn_close(d->conn);
    kiln__rdev_pool_free(d);
    kiln_wire_buf_free(&d->batch);
    free(d->check_buf);
    free(d->rel);
    free(d->pend);
    free(d->failed_ids);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

void *kiln__remote_open_opts(const char *spec, int index, kiln_device_opts *o)
{
    (void)index;
    kiln_remote_addr addr;
    char spec_why[200];
    if (kiln_remote_spec_parse(spec, &addr, spec_why, sizeof spec_why) != 0) {
        kiln__error_set("malformed remote spec '%s': %s", spec, spec_why);
        return NULL;
    }
    rdev *d = calloc(1, sizeof *d);
    if (!d) {
        kiln__error_set("out of memory");
        return NULL;
    }
    pthread_mutex_init(&d->mu, NULL);
    atomic_init(&d->lost, false);
    snprintf(d->spec, sizeof d->spec, "%s", spec);
    snprintf(d->device, sizeof d->device, "%s", addr.device);
    /* options (docs/configuration.md; defaults from KILN_REMOTE_TIMEOUT_MS and
     * KILN_REMOTE_TOKEN or KILN_TOKEN through the engine's one table) */
    long timeout_ms = 30000;
    if (kiln__device_opt_long(o, "remote", "timeout_ms", 1, 86400000L, &timeout_ms) < 0) {
        free_dev(d);
        return NULL;
    }
    d->timeout_ms = (int)timeout_ms;
    /* a wait that runs out names where its timeout was set, so the right knob gets turned */
    const char *timeout_src = NULL;
    (void)kiln__device_opts_take(o, "timeout_ms", &timeout_src);
    char timeout_from[96];
    if (!timeout_src)
        snprintf(timeout_from, sizeof timeout_from,
                 "the default timeout_ms; set ?timeout_ms= or KILN_REMOTE_TIMEOUT_MS");
    else
        snprintf(timeout_from, sizeof timeout_from, "timeout_ms from %s%s",
                 strcmp(timeout_src, "spec") && strcmp(timeout_src, "options") ? "" : "the ", timeout_src);
    const char *token = kiln__device_opts_take(o, "token", NULL);
    char why[KILN_ERROR_MAX - 64] = "out of memory";
    d->conn = kiln__rconn_open(addr.host, addr.port, token, d->timeout_ms, timeout_from, on_message, d, why,
                               sizeof why);
    if (!d->conn) {
        free_dev(d);
        kiln__error_set("%s", why);
        return NULL;
    }
    /* HELLO alone, then WELCOME (or the ERROR saying why not) */
    kiln_wire_msg h = {.h = {.type = KILN_WIRE_HELLO}};
    h.u.hello.min_version = KILN_WIRE_VERSION_MIN;
    h.u.hello.max_version = KILN_WIRE_VERSION_MAX;
    snprintf(h.u.hello.device, sizeof h.u.hello.device, "%s", d->device);
    d->version = KILN_WIRE_VERSION_MAX;
    if (kiln__rdev_append(d, &h, "hello") != 0 ||
        kiln__rconn_send(d->conn, d->batch.p, d->batch.len, why, sizeof why) != 0) {
        free_dev(d);
        kiln__error_set("%s", why);
        return NULL;
    }
    d->batch.len = 0;
    d->batch_msgs = 0;
    d->sent_seq = d->acked_seq = d->seq;
    if (wait_until(d, is_welcomed) != 0 || d->wait_failed) {
        if (d->wait_failed) {
            /* the server closes after refusing; its ERROR is the better explanation */
            kiln__error_set("%s", d->wait_err);
        } else {
            const char *w = d->dead_why + strlen(d->spec);
            kiln__error_set("no WELCOME from the server%s", w);
        }
        free_dev(d);
        return NULL;
    }
    /* Limits from WELCOME: batches well inside a message, half the queue outstanding. */
    uint64_t mm = d->max_message_bytes ? d->max_message_bytes : 1024;
    d->max_message_bytes = mm;
    d->flush_bytes = (size_t)(mm / 4 < 512 * 1024 ? mm / 4 : 512 * 1024);
    d->chunk_bytes = (size_t)(mm / 4 < 8u * 1024 * 1024 ? mm / 4 : 8u * 1024 * 1024);
    if (d->chunk_bytes < 64)
        d->chunk_bytes = 64;
    d->rel_max = (size_t)(mm / 64 < 512 ? mm / 64 : 512);
    if (d->rel_max < 1)
        d->rel_max = 1;
    d->window_msgs = d->max_queued_ops / 2 ? d->max_queued_ops / 2 : 1;
    d->flush_msgs = d->window_msgs / 2 ? d->window_msgs / 2 : 1;
    d->pool_max_bytes = d->max_live_bytes / 8 < (256u << 20) ? d->max_live_bytes / 8 : (256u << 20);
    d->pool_max_count = d->max_ids / 8 < 4096 ? d->max_ids / 8 : 4096;
    d->rel = malloc(d->rel_max * sizeof *d->rel);
    if (!d->rel) {
        free_dev(d);
        kiln__error_set("out of memory");
        return NULL;
    }
    return d;
}

void *kiln__remote_open(int index)
{
    kiln__error_set("remote devices are opened by spec: remote://host:port/device");
    return NULL;
}

void kiln__remote_close(void *ctx)
{
    free_dev(ctx);
}

/* kiln_device_lost. An idle device first looks, without waiting, whether the server closed
 * the connection, so a dead server is reported before an op fails; while another thread
 * holds the device it is talking to the server and will find out itself. */
const char *kiln__remote_lost(void *ctx)
{
    rdev *d = ctx;
    if (!atomic_load(&d->lost) && pthread_mutex_trylock(&d->mu) == 0) {
        char why[KILN_ERROR_MAX - 64];
        if (!d->dead && kiln__rconn_pump(d->conn, 0, why, sizeof why) != 0)
            kiln__rdev_die(d, why);
        pthread_mutex_unlock(&d->mu);
    }
    return atomic_load(&d->lost) ? d->dead_why : NULL;
}

void kiln__remote_caps(void *ctx, kiln_backend_caps *out)
{
    rdev *d = ctx;
    memset(out, 0, sizeof *out);
    for (int t = 0; t < KILN_DTYPE_COUNT; t++)
        out->dtype[t] = (d->dtype_mask >> t) & 1u;
    out->host_memory = false;
    out->async = true;
}

/* ---- downloads and sync ---------------------------------------------------------------------------- */

static bool downloads_done(const rdev *d)
{
    for (size_t i = 0; i < d->npend; i++)
        if (!d->pend[i].done)
            return false;
    return true;
}

/*
 * How a wait for the server (a download or a sync) ended, in order of what matters most: the
 * connection is gone; an earlier pipelined op failed (reported now, at the first wait after it);
 * the awaited reply itself was an error; or rc is a local failure (out of memory). 0 or a KILN_E*
 * code with why filled. Called with d->mu held; clears the per-wait error.
 */
static int wait_outcome(rdev *d, int rc, char *why, size_t wl)
{
    if (d->dead) {
        snprintf(why, wl, "%s", d->dead_why);
        rc = KILN_EIO;
    } else if (rc == 0 && (rc = take_deferred(d, why, wl)) != 0) {
    } else if (rc == 0 && d->wait_failed) {
        snprintf(why, wl, "%s", d->wait_err);
        rc = KILN_EDEVICE;
    } else if (rc != 0) {
        snprintf(why, wl, "%s: out of memory", d->spec);
    }
    d->wait_failed = false;
    return rc;
}

int kiln__remote_buffer_download(void *ctx, kiln_buffer *src, size_t off, void *dst, size_t n)
{
    rdev *d = ctx;
    char why[KILN_ERROR_MAX];
    int rc = 0;
    pthread_mutex_lock(&d->mu);
    size_t chunks = n ? (n + d->chunk_bytes - 1) / d->chunk_bytes : 1;
    if (d->dead) {
        rc = KILN_EIO;
    } else if (chunks > d->pend_cap) {
        struct pend *np = realloc(d->pend, chunks * sizeof *np);
        if (!np)
            rc = KILN_ENOMEM;
        else
            d->pend = np, d->pend_cap = chunks;
    }
    d->npend = 0;
    d->wait_failed = false;
    if (rc == 0)
        rc = kiln__rdev_append_release(d);
    if (rc == 0)
        rc = kiln__rdev_checks_request(d);
    /* one DOWNLOAD per chunk, all in flight at once, each answered by its DATA */
    for (size_t c = 0; rc == 0 && c < chunks; c++) {
        size_t o = c * d->chunk_bytes, k = n - o < d->chunk_bytes ? n - o : d->chunk_bytes;
        if (n == 0)
            o = k = 0;
        kiln_wire_msg m = {.h = {.type = KILN_WIRE_DOWNLOAD}};
        m.u.download.id = src->id;
        m.u.download.offset = off + o;
        m.u.download.length = k;
        if ((rc = kiln__rdev_append(d, &m, "download")) != 0)
            break;
        d->pend[d->npend++] = (struct pend){.seq = d->seq, .dst = (uint8_t *)dst + o, .n = k};
    }
    if (rc == 0)
        rc = kiln__rdev_flush(d);
    if (rc == 0)
        rc = wait_until(d, downloads_done);
    d->npend = 0;
    kiln__rdev_checks_verdict(d);
    rc = wait_outcome(d, rc, why, sizeof why); /* an earlier op's failure: what was read may be garbage */
    pthread_mutex_unlock(&d->mu);
    if (rc != 0)
        kiln__error_set("buffer_download: %s", why);
    return rc;
}

static bool sync_finished(const rdev *d)
{
    return d->sync_done;
}

int kiln__remote_sync(void *ctx)
{
    rdev *d = ctx;
    char why[KILN_ERROR_MAX];
    int rc = 0;
    pthread_mutex_lock(&d->mu);
    d->wait_failed = false;
    d->sync_done = false;
    if (d->dead) {
        rc = KILN_EIO;
    } else {
        rc = kiln__rdev_append_release(d);
        if (rc == 0)
            rc = kiln__rdev_checks_request(d);
        kiln_wire_msg m = {.h = {.type = KILN_WIRE_SYNC}};
        if (rc == 0 && (rc = kiln__rdev_append(d, &m, "sync")) == 0) {
            d->sync_seq = d->seq;
            if ((rc = kiln__rdev_flush(d)) == 0)
                rc = wait_until(d, sync_finished);
        }
    }
    d->sync_seq = 0;
    kiln__rdev_checks_verdict(d);
    rc = wait_outcome(d, rc, why, sizeof why);
    pthread_mutex_unlock(&d->mu);
    if (rc != 0)
        kiln__error_set("sync: %s", why);
    return rc;
}

/* Used where the session's counts must be exact (remote-buffers.c, before refusing an ALLOC): the
 * answers to everything sent, ERRORs of refused ALLOCs included, arrive by the SYNC_DONE. */
int kiln__rdev_settle(rdev *d)
{
    int rc = d->dead ? KILN_EIO : kiln__rdev_append_release(d);
    kiln_wire_msg m = {.h = {.type = KILN_WIRE_SYNC}};
    if (rc == 0 && (rc = kiln__rdev_append(d, &m, "sync")) == 0) {
        d->sync_seq = d->seq;
        d->sync_done = false;
        d->wait_failed = false;
        if ((rc = kiln__rdev_flush(d)) == 0)
            rc = wait_until(d, sync_finished);
    }
    d->sync_seq = 0;
    /* an ERROR in place of the SYNC_DONE (a queue limit) still comes after every earlier answer */
    d->wait_failed = false;
    return d->dead ? KILN_EIO : rc;
}

/* ---- queues and events ---------------------------------------------------------------------------- */
/*
 * A remote device runs every message of its session in order, so all its queues are the session
 * itself: queue_open hands back the device context, and no event_wait is needed (the interface's
 * "one order for all queues"). An event is the sequence number of the last message appended so
 * far; it has finished once the server answered that message or a later one.
 */
struct kiln_backend_event {
    uint64_t seq;
};

void *kiln__remote_queue_open(void *ctx)
{
    return ctx;
}

kiln_backend_event *kiln__remote_event_record(void *ctx)
{
    rdev *d = ctx;
    kiln_backend_event *e = malloc(sizeof *e);
    if (!e) {
        kiln__error_set("event_record: out of memory");
        return NULL;
    }
    pthread_mutex_lock(&d->mu);
    e->seq = d->seq;
    pthread_mutex_unlock(&d->mu);
    return e;
}

int kiln__remote_event_query(void *ctx, kiln_backend_event *e)
{
    rdev *d = ctx;
    pthread_mutex_lock(&d->mu);
    int done = d->dead ? KILN_EIO : d->acked_seq >= e->seq;
    pthread_mutex_unlock(&d->mu);
    if (done < 0)
        kiln__error_set("event_query: %s", d->dead_why);
    return done;
}

int kiln__remote_event_sync(void *ctx, kiln_backend_event *e)
{
    /* a SYNC answers for everything before it: one round trip unless already answered */
    int done = kiln__remote_event_query(ctx, e);
    return done == 1 ? 0 : kiln__remote_sync(ctx);
}

void kiln__remote_event_free(void *ctx, kiln_backend_event *e)
{
    free(e);
}

/* ---- primitives (encoded in remote-ops.c) ------------------------------------------------------------ */

/* Queues one OP. The op's own errors come back later; only a dead connection fails here. */
int kiln__remote_submit(void *ctx, kiln_wire_msg *m)
{
    rdev *d = ctx;
    const kiln_wire_prim_info *pi = kiln_wire_prim_lookup(m->u.op.prim);
    /* The server refuses an operand with more elements than the session may hold bytes (a
     * zero-stride view could name endless work): known here, so refused here, at once. */
    for (int k = 0; k < m->u.op.ntd; k++) {
        const kiln_wire_td *t = &m->u.op.td[k];
        uint64_t numel = 1;
        bool too_many = false;
        for (int i = 0; t->id && i < t->ndim && !too_many; i++)
            too_many = __builtin_mul_overflow(numel, (uint64_t)t->shape[i], &numel) || numel > d->max_live_bytes;
        if (t->id && (too_many || numel > d->max_live_bytes)) {
            kiln__error_set(
                "%.120s: %s: operand %d has more elements than the server lets an operand have (%" PRIu64
                ", its remote.max_live_bytes)",
                d->spec, pi ? pi->name : "op", k, d->max_live_bytes);
            return KILN_EINVAL;
        }
    }
    char why[KILN_ERROR_MAX];
    pthread_mutex_lock(&d->mu);
    int rc = d->dead ? KILN_EIO : kiln__rdev_append(d, m, pi ? pi->name : "op");
    if (rc == 0)
        rc = kiln__rdev_maybe_flush(d);
    bool dead = d->dead;
    if (dead)
        snprintf(why, sizeof why, "%s", d->dead_why);
    pthread_mutex_unlock(&d->mu);
    return dead ? kiln__rdev_dead_error(pi ? pi->name : "op", why) : rc;
}
