/*
 * backends/remote/remote-checks.c — index_check on a remote device: the engine's range check of an
 * index, run on the server, read with the next download or sync, and reported under the engine's
 * op.
 *
 * The engine checks an index before every indexing op (gather, embedding, one_hot, a loss's
 * target classes) and names its own op in the error ("embedding: index 9 is out of bounds for
 * size 2"). The server checks index operands as well, but it only sees the primitive the op was
 * lowered to (embedding runs index_select), and one_hot's comparison has no index operand at all.
 * So a check is two reductions on the server, the index's min and max, into a slot of a small
 * scratch buffer: no wait. The next download or sync, which waits anyway, reads the slots in the
 * same batch (one more DOWNLOAD, no round trip of its own) and reports the first violation, as a
 * GPU's device-side assert does. The check comes before the op that used the index, so its
 * violation is reported rather than that op's failure on the server; an earlier failure still
 * comes first. When the slots are full, a check waits for the server to read the others.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "error-impl.h"
#include "remote-impl.h"
#include "wire.h"

#define SLOT_BYTES 16 /* a check's min and max, 8 bytes each whatever the index's dtype */

/* Appends the reduction writing index's min (or max) into slot of the scratch buffer; what names
 * it in messages (the engine's op). */
static int append_extreme(rdev *d, int slot, bool max, const kiln_tdesc *index, const char *what)
{
    kiln_wire_msg m = {.h = {.type = KILN_WIRE_OP}};
    kiln_wire_op *op = &m.u.op;
    op->prim = KILN_WIRE_P_REDUCE;
    op->sub = max ? KILN_REDUCE_MAX : KILN_REDUCE_MIN;
    size_t esize = kiln_dtype_size(index->dtype);
    kiln_wire_td *out = &op->td[op->ntd++];
    out->id = d->check_buf->id;
    out->offset = (int64_t)(((size_t)slot * SLOT_BYTES + (max ? 8 : 0)) / esize);
    out->dtype = index->dtype;
    out->ndim = index->ndim;
    kiln_wire_td *in = &op->td[op->ntd++];
    in->id = index->buf->id;
    in->offset = index->offset;
    in->dtype = index->dtype;
    in->ndim = index->ndim;
    for (int i = 0; i < index->ndim; i++) {
        out->shape[i] = out->strides[i] = 1;
        in->shape[i] = index->shape[i];
        in->strides[i] = index->strides[i];
    }
    op->i[op->ni++] = index->ndim ? (int64_t)((1u << index->ndim) - 1) : 0;
    op->f[op->nf++] = 0.0;
    return kiln__rdev_append(d, &m, what);
}

/* The value of dtype dt at p (an integer index's). */
static int64_t value_at(const uint8_t *p, kiln_dtype dt)
{
    switch (dt) {
    case KILN_I32: {
        int32_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    case KILN_U8:
    case KILN_BOOL: return *p;
    default: {
        int64_t v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    }
}

int kiln__rdev_checks_request(rdev *d)
{
    if (!d->nchecks)
        return 0;
    kiln_wire_msg m = {.h = {.type = KILN_WIRE_DOWNLOAD}};
    m.u.download.id = d->check_buf->id;
    m.u.download.length = (uint64_t)d->nchecks * SLOT_BYTES;
    int rc = kiln__rdev_append(d, &m, "range check");
    if (rc == 0) {
        d->checks_read_seq = d->seq;
        d->checks_reading = d->nchecks;
        d->checks_read_ok = false;
    }
    return rc;
}

void kiln__rdev_checks_data(rdev *d, const kiln_wire_msg *m)
{
    if (m->u.data.length == (uint64_t)d->checks_reading * SLOT_BYTES) {
        memcpy(d->check_vals, m->u.data.data, (size_t)m->u.data.length);
        d->checks_read_ok = true;
    }
}

void kiln__rdev_checks_verdict(rdev *d)
{
    int n = d->checks_reading;
    bool read = d->checks_read_ok;
    d->checks_reading = 0;
    d->checks_read_ok = false;
    d->checks_read_seq = 0;
    /* unread (the connection died, or the read failed and its error is pending): dropped, the
     * error says why */
    for (int k = 0; k < n && read; k++) {
        const uint8_t *slot = d->check_vals + (size_t)k * SLOT_BYTES;
        int64_t least = value_at(slot, d->checks[k].dtype), most = value_at(slot + 8, d->checks[k].dtype);
        int64_t bad;
        if (least < d->checks[k].lo)
            bad = least;
        else if (most >= d->checks[k].hi)
            bad = most;
        else
            continue;
        if (!d->deferred || d->deferred_seq > d->checks[k].last_seq) {
            /* the engine's wording; the thread's own error is left as it was */
            char saved[KILN_ERROR_MAX];
            snprintf(saved, sizeof saved, "%s", kiln_error());
            int saved_code = kiln_error_code();
            kiln__index_error(d->checks[k].op, d->checks[k].noun, bad, d->checks[k].lo, d->checks[k].hi);
            d->deferred = true;
            d->deferred_seq = d->checks[k].last_seq;
            snprintf(d->deferred_err, sizeof d->deferred_err, "%.120s: %.300s", d->spec, kiln_error());
            if (saved[0])
                kiln__error_set_code(saved_code, "%s", saved);
            else
                kiln_error_clear();
        }
        break;
    }
    memmove(d->checks, d->checks + n, (size_t)(d->nchecks - n) * sizeof d->checks[0]);
    d->nchecks -= n;
}

int kiln__remote_index_check(void *ctx, const kiln_tdesc *index, int64_t lo, int64_t hi, const char *op,
                             const char *noun)
{
    rdev *d = ctx;
    for (int i = 0; i < index->ndim; i++)
        if (index->shape[i] == 0)
            return 0; /* no values */
    pthread_mutex_lock(&d->mu);
    bool need_buf = !d->check_buf;
    uint64_t slots = d->max_live_bytes / 1024;
    pthread_mutex_unlock(&d->mu);
    if (need_buf) {
        /* the scratch buffer, once, under the session's limits like any other */
        slots = slots < 1 ? 1 : slots > CHECKS_MAX ? CHECKS_MAX : slots;
        kiln_buffer *b = kiln__remote_buffer_alloc(d, (size_t)slots * SLOT_BYTES);
        if (!b) {
            char why[KILN_ERROR_MAX];
            snprintf(why, sizeof why, "%s", kiln_error());
            return kiln__error_set("%s: checking the index: %s", op, why);
        }
        pthread_mutex_lock(&d->mu);
        bool lost_race = d->check_buf != NULL;
        if (!lost_race) {
            d->check_buf = b;
            d->check_slots = (int)slots;
        }
        pthread_mutex_unlock(&d->mu);
        if (lost_race)
            kiln__remote_buffer_free(d, b);
    }
    pthread_mutex_lock(&d->mu);
    int rc = d->dead ? KILN_EIO : 0;
    if (rc == 0 && d->nchecks == d->check_slots) {
        /* full: the server reads these now; a violation waits for the next download or sync */
        rc = kiln__rdev_checks_request(d);
        if (rc == 0)
            rc = kiln__rdev_settle(d);
        kiln__rdev_checks_verdict(d);
    }
    int slot = d->nchecks;
    if (rc == 0 && (rc = append_extreme(d, slot, false, index, op)) == 0 &&
        (rc = append_extreme(d, slot, true, index, op)) == 0) {
        d->checks[slot].last_seq = d->seq;
        d->checks[slot].lo = lo;
        d->checks[slot].hi = hi;
        d->checks[slot].dtype = index->dtype;
        d->checks[slot].op = op;
        d->checks[slot].noun = noun;
        d->nchecks++;
        rc = kiln__rdev_maybe_flush(d);
    }
    char why[KILN_ERROR_MAX];
    bool dead = d->dead;
    if (dead)
        snprintf(why, sizeof why, "%s", d->dead_why);
    pthread_mutex_unlock(&d->mu);
    return dead ? kiln__rdev_dead_error(op, why) : rc;
}
