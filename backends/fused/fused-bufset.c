/*
 * backends/fused/fused-bufset.c — a set of buffer handles the fusion decorator keeps: the
 * buffers that wrap host memory (over an inner backend that cannot say which they are) and
 * the buffers a caller lent, whose calls run before they return.
 *
 * Open addressing with linear probing over pointers: capacity a power of two, at most half
 * full, NULL marking a free slot. An ONNX model's planned arena wraps every intermediate, so
 * an insertion and a removal come with almost every op: a list searched on each free had
 * cost the test encoder 9% of its run. A removal shifts the rest of its probe run back, so no
 * slot stays marked and lookups stay short.
 */
#include <stdlib.h>

#include "fused-impl.h"

void kiln__fused_bufset_init(fused_bufset *s)
{
    pthread_mutex_init(&s->mu, NULL);
    s->slots = NULL;
    s->n = s->cap = s->stale = 0;
    atomic_init(&s->any, false);
    atomic_init(&s->filter, 0);
}

void kiln__fused_bufset_destroy(fused_bufset *s)
{
    pthread_mutex_destroy(&s->mu);
    free(s->slots);
}

/* The slot where b's probe starts (a multiplicative hash of the pointer). */
static int home_slot(const fused_bufset *s, const kiln_buffer *b)
{
    uint64_t h = (uint64_t)(uintptr_t)b * 0x9E3779B97F4A7C15ull;
    return (int)(h >> 32) & (s->cap - 1);
}

bool kiln__fused_bufset_room(fused_bufset *s)
{
    if (2 * (s->n + 1) <= s->cap)
        return true;
    int cap = s->cap ? s->cap * 2 : 64;
    kiln_buffer **old = s->slots;
    int oldcap = s->cap;
    kiln_buffer **grown = calloc((size_t)cap, sizeof *grown);
    if (!grown)
        return false;
    s->slots = grown;
    s->cap = cap;
    for (int i = 0; i < oldcap; i++)
        if (old[i]) {
            int k = home_slot(s, old[i]);
            while (s->slots[k])
                k = (k + 1) & (cap - 1);
            s->slots[k] = old[i];
        }
    free(old);
    return true;
}

void kiln__fused_bufset_put(fused_bufset *s, kiln_buffer *b)
{
    int k = home_slot(s, b);
    while (s->slots[k])
        k = (k + 1) & (s->cap - 1);
    s->slots[k] = b;
    s->n++;
    atomic_fetch_or(&s->filter, kiln__fused_filter_bit(b));
    atomic_store(&s->any, true);
}

/* The filter of what is there (mu held). */
static void rebuild_filter(fused_bufset *s)
{
    uint64_t filter = 0;
    for (int i = 0; i < s->cap; i++)
        filter |= s->slots[i] ? kiln__fused_filter_bit(s->slots[i]) : 0;
    atomic_store(&s->filter, filter);
    s->stale = 0;
}

bool kiln__fused_bufset_remove_locked(fused_bufset *s, const kiln_buffer *b)
{
    pthread_mutex_lock(&s->mu);
    int mask = s->cap - 1, k = home_slot(s, b);
    while (s->slots[k] && s->slots[k] != b)
        k = (k + 1) & mask;
    bool found = s->slots[k] == b;
    if (found) {
        s->slots[k] = NULL;
        s->n--;
        /* move back each later entry of the run whose home slot the hole now precedes */
        for (int j = (k + 1) & mask; s->slots[j]; j = (j + 1) & mask) {
            int home = home_slot(s, s->slots[j]);
            bool between = k <= j ? (k < home && home <= j) : (k < home || home <= j);
            if (!between) {
                s->slots[k] = s->slots[j];
                s->slots[j] = NULL;
                k = j;
            }
        }
        /* a removed member's bit only costs a lock taken in vain: the filter is rebuilt once
         * removals reach an eighth of the slots (a few slot reads a removal, amortized, where the
         * arena's wrapped set removes on every op), and cleared with the last member */
        if (s->n == 0) {
            atomic_store(&s->filter, 0);
            s->stale = 0;
        } else if (++s->stale * 8 >= s->cap) {
            rebuild_filter(s);
        }
    }
    atomic_store(&s->any, s->n > 0);
    pthread_mutex_unlock(&s->mu);
    return found;
}

bool kiln__fused_bufset_has_locked(fused_bufset *s, const kiln_buffer *b)
{
    pthread_mutex_lock(&s->mu);
    bool found = false;
    if (s->cap) {
        int mask = s->cap - 1, k = home_slot(s, b);
        while (s->slots[k] && s->slots[k] != b)
            k = (k + 1) & mask;
        found = s->slots[k] == b;
    }
    pthread_mutex_unlock(&s->mu);
    return found;
}
