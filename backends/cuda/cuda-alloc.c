/*
 * backends/cuda/cuda-alloc.c — the caching device allocator (cuda-alloc.h).
 *
 * Parked blocks sit on one list per size class. A request takes a block of its own class
 * that its stream freed (free to use at once: the stream runs in order), else one another
 * stream freed, after ordering the two streams through the hook, else asks the device.
 * When the device says no, the whole cache goes back (raw_free, which in CUDA waits for
 * the device, so blocks still read by queued work are safe to release) and the request
 * is tried once more: fragmentation across classes is the usual reason for a failure
 * while memory is parked.
 *
 * A stream that records a graph allocates from its graph's pool first (cuda-alloc.h,
 * "Graphs"), then from blocks of the shared cache that need no ordering, then from the
 * device; a block it frees goes back to that pool, never to the shared cache.
 */
#include "cuda-alloc.h"

#include <stdlib.h>
#include <string.h>

#define SMALL_STEP 512u
#define SMALL_LIMIT 4096u

int kiln__cuda_alloc_class(size_t n, size_t *cap)
{
    if (n <= SMALL_LIMIT) {
        size_t c = n == 0 ? SMALL_STEP : (n + SMALL_STEP - 1) / SMALL_STEP * SMALL_STEP;
        *cap = c;
        return (int)(c / SMALL_STEP) - 1; /* 0..7 */
    }
    int k = 63 - __builtin_clzll((unsigned long long)(n - 1)); /* 2^k < n <= 2^(k+1) */
    size_t base = (size_t)1 << k;
    size_t step = base / 4;
    size_t q = (n - base + step - 1) / step; /* 1..4 */
    int cls = 8 + (k - 12) * 4 + (int)(q - 1);
    if (cls >= KILN_CUDA_ALLOC_NCLASSES)
        return -1;
    *cap = base + q * step;
    return cls;
}

void kiln__cuda_alloc_init(kiln_cuda_alloc *a, const kiln_cuda_alloc_hooks *hooks)
{
    memset(a, 0, sizeof *a);
    a->hooks = *hooks;
    pthread_mutex_init(&a->mu, NULL);
}

static void release_block(kiln_cuda_alloc *a, kiln_cuda_block *b)
{
    a->hooks.raw_free(a->hooks.ud, b->ptr);
    a->stats.raw_frees++;
    a->stats.reserved_bytes -= b->size;
    free(b);
}

/* Releases parked blocks, largest class first; the caller holds the lock. */
static size_t trim_locked(kiln_cuda_alloc *a, size_t bytes)
{
    size_t released = 0;
    for (int c = KILN_CUDA_ALLOC_NCLASSES - 1; c >= 0 && released < bytes; c--) {
        while (a->parked[c] && released < bytes) {
            kiln_cuda_block *b = a->parked[c];
            a->parked[c] = b->next;
            a->stats.cached_bytes -= b->size;
            released += b->size;
            release_block(a, b);
        }
    }
    return released;
}

void kiln__cuda_alloc_destroy(kiln_cuda_alloc *a)
{
    pthread_mutex_lock(&a->mu);
    trim_locked(a, SIZE_MAX);
    pthread_mutex_unlock(&a->mu);
    pthread_mutex_destroy(&a->mu);
}

/* Unlinks and returns a parked block of class cls, preferring one stream freed; with
 * unordered_only, only one that stream freed or an idle one (no ordering needed). */
static kiln_cuda_block *take_parked(kiln_cuda_alloc *a, int cls, void *stream, bool unordered_only)
{
    kiln_cuda_block **link = unordered_only ? NULL : &a->parked[cls];
    for (kiln_cuda_block **p = &a->parked[cls]; *p; p = &(*p)->next) {
        if ((*p)->stream == stream) {
            link = p;
            break;
        }
        if (unordered_only && !link && !(*p)->stream)
            link = p;
    }
    if (!link)
        return NULL;
    kiln_cuda_block *b = *link;
    if (b)
        *link = b->next;
    return b;
}

static void count_in_use(kiln_cuda_alloc *a, size_t size)
{
    a->stats.in_use_bytes += size;
    if (a->stats.in_use_bytes > a->stats.peak_in_use_bytes)
        a->stats.peak_in_use_bytes = a->stats.in_use_bytes;
}

static kiln_cuda_graph_pool *recording_pool(kiln_cuda_alloc *a, void *stream)
{
    for (kiln_cuda_graph_pool *p = a->recording; p; p = p->next_recording)
        if (p->stream == stream)
            return p;
    return NULL;
}

static void pool_adopt(kiln_cuda_alloc *a, kiln_cuda_graph_pool *p, kiln_cuda_block *b)
{
    b->pool = p;
    b->pool_all = p->all;
    p->all = b;
    p->bytes += b->size;
    a->stats.graph_bytes += b->size;
}

kiln_cuda_block *kiln__cuda_alloc_get(kiln_cuda_alloc *a, void *stream, size_t n, bool *oom)
{
    *oom = false;
    size_t cap;
    int cls = kiln__cuda_alloc_class(n, &cap);
    if (cls < 0) {
        *oom = true;
        return NULL;
    }
    pthread_mutex_lock(&a->mu);
    kiln_cuda_graph_pool *pool = recording_pool(a, stream);
    if (pool && pool->kept[cls]) {
        kiln_cuda_block *k = pool->kept[cls];
        pool->kept[cls] = k->next;
        k->next = NULL;
        a->stats.reuses++; /* still counted in use: the graph's all along */
        pthread_mutex_unlock(&a->mu);
        return k;
    }
    kiln_cuda_block *b = take_parked(a, cls, stream, pool != NULL);
    if (b) {
        a->stats.cached_bytes -= b->size;
        if (b->stream && b->stream != stream) {
            if (a->hooks.order(a->hooks.ud, b->stream, stream) < 0) {
                /* The device failed; a block whose last use cannot be ordered is not
                 * safe to hand out, and releasing it waits for that use. */
                release_block(a, b);
                pthread_mutex_unlock(&a->mu);
                return NULL;
            }
            a->stats.cross_stream_reuses++;
        }
        a->stats.reuses++;
        b->next = NULL;
        count_in_use(a, b->size);
        if (pool)
            pool_adopt(a, pool, b);
        pthread_mutex_unlock(&a->mu);
        return b;
    }
    b = malloc(sizeof *b);
    if (!b) {
        pthread_mutex_unlock(&a->mu);
        *oom = true;
        return NULL;
    }
    void *ptr = a->hooks.raw_alloc(a->hooks.ud, cap);
    if (!ptr && !pool && a->stats.cached_bytes > 0) {
        a->stats.oom_retries++;
        trim_locked(a, SIZE_MAX);
        ptr = a->hooks.raw_alloc(a->hooks.ud, cap);
    }
    if (!ptr) {
        free(b);
        pthread_mutex_unlock(&a->mu);
        *oom = true;
        return NULL;
    }
    a->stats.raw_allocs++;
    a->stats.reserved_bytes += cap;
    *b = (kiln_cuda_block){.ptr = ptr, .size = cap, .stream = stream, .cls = cls};
    count_in_use(a, cap);
    if (pool)
        pool_adopt(a, pool, b);
    pthread_mutex_unlock(&a->mu);
    return b;
}

void kiln__cuda_alloc_put(kiln_cuda_alloc *a, void *stream, kiln_cuda_block *blk)
{
    if (!blk)
        return;
    pthread_mutex_lock(&a->mu);
    if (blk->pool) {
        /* the graph addresses it at every launch: kept for its own recording only */
        kiln_cuda_graph_pool *p = blk->pool;
        blk->next = p->kept[blk->cls];
        p->kept[blk->cls] = blk; /* stays in use: the graph writes it at every launch */
        pthread_mutex_unlock(&a->mu);
        return;
    }
    blk->stream = stream;
    blk->next = a->parked[blk->cls];
    a->parked[blk->cls] = blk;
    a->stats.in_use_bytes -= blk->size;
    a->stats.cached_bytes += blk->size;
    pthread_mutex_unlock(&a->mu);
}

void kiln__cuda_alloc_forget_stream(kiln_cuda_alloc *a, void *stream)
{
    pthread_mutex_lock(&a->mu);
    for (int c = 0; c < KILN_CUDA_ALLOC_NCLASSES; c++)
        for (kiln_cuda_block *b = a->parked[c]; b; b = b->next)
            if (b->stream == stream)
                b->stream = NULL;
    pthread_mutex_unlock(&a->mu);
}

size_t kiln__cuda_alloc_trim(kiln_cuda_alloc *a, size_t bytes)
{
    pthread_mutex_lock(&a->mu);
    size_t r = trim_locked(a, bytes);
    pthread_mutex_unlock(&a->mu);
    return r;
}

int kiln__cuda_alloc_capture_begin(kiln_cuda_alloc *a, kiln_cuda_graph_pool *p, void *stream)
{
    pthread_mutex_lock(&a->mu);
    if (recording_pool(a, stream)) {
        pthread_mutex_unlock(&a->mu);
        return -1;
    }
    p->stream = stream;
    p->recording = true;
    p->next_recording = a->recording;
    a->recording = p;
    a->stats.graph_pools++;
    pthread_mutex_unlock(&a->mu);
    return 0;
}

void kiln__cuda_alloc_capture_end(kiln_cuda_alloc *a, kiln_cuda_graph_pool *p)
{
    pthread_mutex_lock(&a->mu);
    for (kiln_cuda_graph_pool **l = &a->recording; *l; l = &(*l)->next_recording)
        if (*l == p) {
            *l = p->next_recording;
            break;
        }
    p->recording = false;
    p->next_recording = NULL;
    pthread_mutex_unlock(&a->mu);
}

void kiln__cuda_alloc_pool_release(kiln_cuda_alloc *a, kiln_cuda_graph_pool *p)
{
    if (p->recording)
        kiln__cuda_alloc_capture_end(a, p);
    pthread_mutex_lock(&a->mu);
    /* kept blocks go to the shared cache, parked on the graph's stream (whose launches
     * of the graph precede any later work there); the rest are handed out and return
     * to the shared cache when freed */
    for (kiln_cuda_block *b = p->all, *next; b; b = next) {
        next = b->pool_all;
        b->pool = NULL;
        b->pool_all = NULL;
    }
    for (int c = 0; c < KILN_CUDA_ALLOC_NCLASSES; c++)
        while (p->kept[c]) {
            kiln_cuda_block *b = p->kept[c];
            p->kept[c] = b->next;
            b->stream = p->stream;
            b->next = a->parked[c];
            a->parked[c] = b;
            a->stats.in_use_bytes -= b->size;
            a->stats.cached_bytes += b->size;
        }
    a->stats.graph_bytes -= p->bytes;
    a->stats.graph_pools--;
    p->all = NULL;
    p->bytes = 0;
    pthread_mutex_unlock(&a->mu);
}

void kiln__cuda_alloc_reset_peak(kiln_cuda_alloc *a)
{
    pthread_mutex_lock(&a->mu);
    a->stats.peak_in_use_bytes = a->stats.in_use_bytes;
    pthread_mutex_unlock(&a->mu);
}

void kiln__cuda_alloc_stats_get(kiln_cuda_alloc *a, kiln_cuda_alloc_stats *out)
{
    pthread_mutex_lock(&a->mu);
    *out = a->stats;
    pthread_mutex_unlock(&a->mu);
}
