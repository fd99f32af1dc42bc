/*
 * backends/remote/remote-buffers.c — the remote device's buffers: ids chosen here, a pool of freed
 * buffers reused by exact size, and the session's limits.
 *
 * An ALLOC, like every message, is pipelined: the server's answer to one it refuses arrives with
 * the next read. But the server's limits are known from WELCOME (max_live_bytes, max_ids) and the
 * client sees every ALLOC and RELEASE it sends in the order the server runs them, so it counts
 * what the session holds exactly as the server will (rdev.live_bytes, live_ids) and refuses an
 * allocation that cannot fit at once, naming its size and the limit, rather than handing back a
 * buffer that fails at some later read. Before refusing it makes what room it can: it sends the
 * releases it holds back and gives up the pool; and where messages are still unanswered it waits
 * for their answers, since one may be the refusal of an earlier ALLOC that the count still holds.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "error-impl.h"
#include "remote-impl.h"
#include "wire.h"

static size_t bucket_of(size_t nbytes)
{
    return (size_t)((nbytes * 0x9E3779B97F4A7C15ull) >> 56) % POOL_BUCKETS;
}

void kiln__rdev_pool_free(rdev *d)
{
    for (int b = 0; b < POOL_BUCKETS; b++) {
        while (d->pool[b]) {
            struct kiln_buffer *x = d->pool[b];
            d->pool[b] = x->next;
            free(x);
        }
    }
    d->pool_bytes = d->pool_count = 0;
}

/* Holds b's id back for the next RELEASE (sending one when the list is full). A failure here
 * surfaces at the next call that can report it; should the list stay full (out of memory), the
 * id is simply left to the session's end and stays counted. Frees b. */
static void release_later(rdev *d, struct kiln_buffer *b)
{
    if (d->nrel == d->rel_max && kiln__rdev_append_release(d) == 0)
        (void)kiln__rdev_maybe_flush(d);
    if (d->nrel < d->rel_max) {
        d->rel[d->nrel++] = b->id;
        d->rel_bytes += b->nbytes;
    }
    free(b);
}

static bool fits(const rdev *d, size_t nbytes)
{
    return d->live_ids < d->max_ids && d->live_bytes <= d->max_live_bytes - nbytes;
}

/*
 * Whether an ALLOC of nbytes fits the session's limits, making room first where it can. 0, or a
 * negative code with why set: KILN_ETOOLARGE when the one buffer is more than the session may ever
 * hold, KILN_ENOMEM naming the limit the buffers held now would pass (or saying the client ran out
 * of memory), KILN_EIO when the connection died on the way.
 */
static int admit(rdev *d, size_t nbytes, char *why, size_t wl)
{
    if (nbytes > d->max_live_bytes) {
        snprintf(why, wl,
                 "%.120s: %zu bytes is more than the server lets a session hold (%" PRIu64
                 " bytes, its remote.max_live_bytes)",
                 d->spec, nbytes, d->max_live_bytes);
        return KILN_ETOOLARGE;
    }
    if (fits(d, nbytes))
        return 0;
    int rc = kiln__rdev_append_release(d);
    for (int k = 0; rc == 0 && k < POOL_BUCKETS && !fits(d, nbytes); k++) {
        while (d->pool[k]) {
            struct kiln_buffer *b = d->pool[k];
            d->pool[k] = b->next;
            d->pool_bytes -= b->nbytes;
            d->pool_count--;
            release_later(d, b);
        }
        rc = kiln__rdev_append_release(d);
    }
    if (rc == 0 && !fits(d, nbytes) && (d->batch_msgs || d->acked_seq < d->sent_seq))
        rc = kiln__rdev_settle(d);
    if (rc != 0) {
        snprintf(why, wl, "%s", d->dead ? d->dead_why : "buffer_alloc: out of memory");
        return d->dead ? KILN_EIO : rc;
    }
    if (d->live_ids >= d->max_ids) {
        snprintf(why, wl,
                 "%.120s: the session holds %" PRIu64 " buffers, the most the server allows (%" PRIu32
                 ", its remote.max_ids)",
                 d->spec, d->live_ids, d->max_ids);
        return KILN_ENOMEM;
    }
    if (!fits(d, nbytes)) {
        snprintf(why, wl,
                 "%.120s: %zu bytes more would take the session past the %" PRIu64
                 " bytes the server lets it hold (its remote.max_live_bytes; %" PRIu64 " in use)",
                 d->spec, nbytes, d->max_live_bytes, d->live_bytes);
        return KILN_ENOMEM;
    }
    return 0;
}

kiln_buffer *kiln__remote_buffer_alloc(void *ctx, size_t nbytes)
{
    rdev *d = ctx;
    char why[KILN_ERROR_MAX];
    pthread_mutex_lock(&d->mu);
    if (d->dead) {
        snprintf(why, sizeof why, "%s", d->dead_why);
        pthread_mutex_unlock(&d->mu);
        kiln__rdev_dead_error("buffer_alloc", why);
        return NULL;
    }
    struct kiln_buffer **pp = &d->pool[bucket_of(nbytes)];
    for (; *pp; pp = &(*pp)->next) {
        if ((*pp)->nbytes == nbytes) {
            struct kiln_buffer *b = *pp;
            *pp = b->next;
            d->pool_bytes -= nbytes;
            d->pool_count--;
            pthread_mutex_unlock(&d->mu);
            return b;
        }
    }
    int rc = admit(d, nbytes, why, sizeof why);
    struct kiln_buffer *b = rc == 0 ? malloc(sizeof *b) : NULL;
    if (b) {
        b->id = ++d->next_id;
        b->nbytes = nbytes;
        kiln_wire_msg m = {.h = {.type = KILN_WIRE_ALLOC}};
        m.u.alloc.id = b->id;
        m.u.alloc.nbytes = nbytes;
        rc = kiln__rdev_append(d, &m, "alloc");
        if (rc == 0)
            rc = kiln__rdev_maybe_flush(d);
        if (rc != 0)
            snprintf(why, sizeof why, "%s", d->dead ? d->dead_why : "buffer_alloc: out of memory");
    } else if (rc == 0) {
        rc = KILN_ENOMEM;
        snprintf(why, sizeof why, "buffer_alloc: out of memory");
    }
    if (rc != 0) {
        free(b);
        b = NULL;
    }
    bool dead = d->dead;
    pthread_mutex_unlock(&d->mu);
    if (!b && dead)
        kiln__rdev_dead_error("buffer_alloc", why);
    else if (!b)
        kiln__error_set_code(rc, "%s", why);
    return b;
}

void kiln__remote_buffer_free(void *ctx, kiln_buffer *b)
{
    rdev *d = ctx;
    if (!b)
        return;
    pthread_mutex_lock(&d->mu);
    bool refused = false;
    for (size_t i = 0; i < d->nfailed && !refused; i++) {
        if (d->failed_ids[i] == b->id) {
            d->failed_ids[i] = d->failed_ids[--d->nfailed];
            refused = true;
        }
    }
    if (d->dead || refused) {
        free(b);
    } else if (d->pool_count < d->pool_max_count && b->nbytes <= d->pool_max_bytes - d->pool_bytes) {
        size_t k = bucket_of(b->nbytes);
        b->next = d->pool[k];
        d->pool[k] = b;
        d->pool_bytes += b->nbytes;
        d->pool_count++;
    } else {
        release_later(d, b);
    }
    pthread_mutex_unlock(&d->mu);
}

int kiln__remote_buffer_upload(void *ctx, kiln_buffer *dst, size_t off, const void *src, size_t n)
{
    rdev *d = ctx;
    int rc = 0;
    pthread_mutex_lock(&d->mu);
    const uint8_t *p = src;
    for (size_t done = 0; rc == 0 && !d->dead && (done < n || n == 0);) {
        size_t k = n - done < d->chunk_bytes ? n - done : d->chunk_bytes;
        /* a large piece starts a batch of its own rather than making one too big */
        if (d->batch.len && d->batch.len + k > d->flush_bytes && (rc = kiln__rdev_flush(d)) != 0)
            break;
        kiln_wire_msg m = {.h = {.type = KILN_WIRE_UPLOAD}};
        m.u.upload.id = dst->id;
        m.u.upload.offset = off + done;
        m.u.upload.length = k;
        m.u.upload.data = p + done;
        if ((rc = kiln__rdev_append(d, &m, "upload")) == 0)
            rc = kiln__rdev_maybe_flush(d);
        done += k;
        if (n == 0)
            break;
    }
    char why[KILN_ERROR_MAX];
    bool dead = d->dead;
    if (dead)
        snprintf(why, sizeof why, "%s", d->dead_why);
    pthread_mutex_unlock(&d->mu);
    return dead ? kiln__rdev_dead_error("buffer_upload", why) : rc;
}
