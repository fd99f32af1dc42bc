/*
 * backends/fused/fused-buffers.c — the fused decorator's buffer entries: allocation and frees
 * (a free while a group is pending waits for it), the transfers and host pointers that run the
 * pending group first, and the host memory it wraps or is lent (kept in sets: fused-bufset.c).
 */
#include <stdlib.h>

#include "error-impl.h"
#include "fused-impl.h"

kiln_buffer *kiln__fused_buffer_alloc(void *qctx, size_t nbytes)
{
    fq *q = qctx;
    return q->d->in->buffer_alloc(q->iq, nbytes);
}

void kiln__fused_buffer_free(void *qctx, kiln_buffer *b)
{
    fq *q = qctx;
    const kiln_backend_iface *in = q->d->in;
    /* an inner backend that says which buffers are wrapped is asked only when it matters */
    bool wrapped = !in->buffer_is_wrapped && kiln__fused_bufset_remove(&q->d->wrapped, b);
    (void)kiln__fused_bufset_remove(&q->d->lent, b);
    if (!atomic_load(&q->pending)) { /* no group that could read it */
        in->buffer_free(q->iq, b);
        return;
    }
    pthread_mutex_lock(&q->mu);
    if (in->buffer_is_wrapped)
        wrapped = in->buffer_is_wrapped(q->iq, b);
    kiln__fused_free(q, b, wrapped);
    kiln__fused_unlock_group(q);
}

int kiln__fused_buffer_upload(void *qctx, kiln_buffer *dst, size_t off, const void *src, size_t n)
{
    fq *q = qctx;
    KILN__FUSED_FLUSH(q);
    return q->d->in->buffer_upload(q->iq, dst, off, src, n);
}

int kiln__fused_buffer_download(void *qctx, kiln_buffer *src, size_t off, void *dst, size_t n)
{
    fq *q = qctx;
    KILN__FUSED_FLUSH(q);
    return q->d->in->buffer_download(q->iq, src, off, dst, n);
}

int kiln__fused_sync(void *qctx)
{
    fq *q = qctx;
    KILN__FUSED_FLUSH(q);
    return q->d->in->sync ? q->d->in->sync(q->iq) : 0;
}

void *kiln__fused_buffer_host_ptr(void *qctx, kiln_buffer *b)
{
    fq *q = qctx;
    if (!q->d->in->buffer_host_ptr || kiln__fused_flush_pending(q) < 0)
        return NULL;
    return q->d->in->buffer_host_ptr(q->iq, b);
}

void *kiln__fused_host_alloc(void *qctx, size_t n)
{
    fq *q = qctx;
    if (q->d->in->host_alloc)
        return q->d->in->host_alloc(q->iq, n);
    void *p = aligned_alloc(64, (n + 63) & ~(size_t)63);
    if (!p)
        kiln__error_set_code(KILN_ENOMEM, "fused: out of host memory for %zu bytes", n);
    return p;
}

void kiln__fused_host_free(void *qctx, void *p)
{
    fq *q = qctx;
    if (q->d->in->host_alloc && q->d->in->host_free)
        q->d->in->host_free(q->iq, p);
    else
        free(p);
}

int kiln__fused_buffer_copy_peer(void *qctx, kiln_buffer *dst, size_t doff, void *src_q, kiln_buffer *src,
                                 size_t soff, size_t n)
{
    fq *q = qctx, *s = src_q;
    if (!q->d->in->buffer_copy_peer || s->d->in != q->d->in)
        return KILN_ENOTSUP;
    KILN__FUSED_FLUSH(q);
    KILN__FUSED_FLUSH(s);
    return q->d->in->buffer_copy_peer(q->iq, dst, doff, s->iq, src, soff, n);
}

/* A wrap, kept in set (when given) for the buffer's life; the inner backend's own wrap when
 * it says which of its buffers are wrapped and no set is asked for. */
static kiln_buffer *wrap_into(fq *q, fused_bufset *set, void *ptr, size_t n, void (*release)(void *), void *ud)
{
    fdev *d = q->d;
    if (!d->in->buffer_wrap_host) {
        kiln__error_set("fused: the inner device cannot use host memory in place");
        return NULL;
    }
    if (!set)
        return d->in->buffer_wrap_host(q->iq, ptr, n, release, ud);
    pthread_mutex_lock(&set->mu);
    /* room first: a wrapped buffer made and then dropped would call the owner's release,
     * which a caller told of the failure releases again */
    if (!kiln__fused_bufset_room(set)) {
        pthread_mutex_unlock(&set->mu);
        kiln__error_set("fused: out of memory");
        return NULL;
    }
    kiln_buffer *b = d->in->buffer_wrap_host(q->iq, ptr, n, release, ud);
    if (b)
        kiln__fused_bufset_put(set, b);
    pthread_mutex_unlock(&set->mu);
    return b;
}

kiln_buffer *kiln__fused_buffer_wrap_host(void *qctx, void *ptr, size_t n, void (*release)(void *), void *ud)
{
    fq *q = qctx;
    /* the inner backend knows its wrapped buffers: no set */
    return wrap_into(q, q->d->in->buffer_is_wrapped ? NULL : &q->d->wrapped, ptr, n, release, ud);
}

/* Memory the caller reads and writes between calls (kiln_from_host_memory). Besides the
 * wrapped set (a lent buffer is wrapped memory too, over an inner backend that cannot say so)
 * it joins the lent set, which makes every recorded call touching it run before it returns. */
kiln_buffer *kiln__fused_buffer_lend_host(void *qctx, void *ptr, size_t n, void (*release)(void *), void *ud)
{
    fq *q = qctx;
    fused_bufset *lent = &q->d->lent;
    /* held across the wrap (lock order: lent, then wrapped), so that the room made is there
     * for the put: a wrap made and then dropped would call the owner's release */
    pthread_mutex_lock(&lent->mu);
    kiln_buffer *b = NULL;
    if (!kiln__fused_bufset_room(lent))
        kiln__error_set("fused: out of memory");
    else if ((b = kiln__fused_buffer_wrap_host(qctx, ptr, n, release, ud)) != NULL)
        kiln__fused_bufset_put(lent, b);
    pthread_mutex_unlock(&lent->mu);
    return b;
}

/* The pending group runs first: the buffers freed under it go back to the inner backend
 * only at its flush, and are what a trim (an allocation that failed, most often) needs. */
size_t kiln__fused_buffer_trim(void *qctx, size_t bytes)
{
    fq *q = qctx;
    if (kiln__fused_flush_pending(q) < 0)
        return 0;
    return q->d->in->buffer_trim ? q->d->in->buffer_trim(q->iq, bytes) : 0;
}
