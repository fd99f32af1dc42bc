/*
 * backends/cpu/cpu-alloc.c — the cpu backend's pooled buffers.
 *
 * Freshly mapped memory costs a page fault per 4 KiB page on first touch (about
 * 3 GB/s here, slower than the arithmetic of most elementwise ops), and glibc hands
 * large blocks back to the kernel on free, so an allocator that reuses blocks turns a
 * fault-bound op into a memory-bound one. Buffers are rounded up to a size class and,
 * when freed, parked on that class's free list; an allocation takes a parked buffer of
 * its class before asking the system.
 *
 * Classes: 64-byte steps up to 4 KiB, then four steps per power of two (2^k, 1.25·2^k,
 * 1.5·2^k, 1.75·2^k), so rounding wastes at most a quarter. The parked total is
 * bounded (the pool_mb option, KILN_CPU_POOL_MB, default 2048 MiB); a buffer that would pass the bound goes
 * back to the system. Blocks of 2 MiB and more are mmapped with MADV_HUGEPAGE, which
 * cuts their first-touch faults 512-fold where transparent huge pages are on request.
 * MAP_POPULATE is not used: it faults the block in on one thread up front, which costs
 * the same time, and the pool exists precisely so that this happens once.
 *
 * Mid-size blocks (64 KiB up to 2 MiB: a layer's weights, their gradients and Adam's
 * moments) are carved one after another from 8 MiB chunks of huge pages (2 MiB-aligned,
 * MADV_HUGEPAGE) instead of coming from malloc's 4 KiB pages. Streaming over them (an
 * optimizer step reads a parameter, its gradient and two moments per element) missed the
 * TLB at every page, and on a virtual machine each miss walks two page tables: the Adam
 * step of a Transformer block's 0.79 M parameters took 4.5 ms of each training step from
 * malloc's pages and 1.1 ms from huge pages (docs/performance.md). A carved block parks and is reused like
 * any other; given back to the system (trim, or a full pool) its pages are returned
 * with MADV_DONTNEED, and a chunk whose blocks have all gone is unmapped. Sanitizer
 * builds keep malloc for these sizes, whose redzones catch overruns.
 *
 * The pool keeps what it parks until an allocation fails (the engine then trims it and
 * retries) or its owner trims it (kiln_device_trim: kilnd does once a device has been idle).
 * Its figures (in use, parked, blocks from the system, reuses) are kept under the same lock
 * for kiln_device_memory_get.
 */
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "cpu-impl.h"

#define SMALL_LIMIT 4096u
#define MAP_THRESHOLD (2u << 20)
#define CHUNK_MIN (64u << 10)  /* blocks from this size up to MAP_THRESHOLD are carved from chunks */
#define CHUNK_BYTES (8u << 20) /* a chunk: four huge pages */

#if defined(__SANITIZE_ADDRESS__)
#define USE_CHUNKS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define USE_CHUNKS 0
#endif
#endif
#ifndef USE_CHUNKS
#define USE_CHUNKS 1
#endif

/* Class index and capacity for a request of n bytes. */
static int size_class(size_t n, size_t *cap)
{
    if (n <= SMALL_LIMIT) {
        size_t c = n <= 64 ? 64 : (n + 63) & ~(size_t)63;
        *cap = c;
        return (int)(c / 64) - 1; /* 0..63 */
    }
    int k = 63 - __builtin_clzll((unsigned long long)(n - 1)); /* 2^k < n <= 2^(k+1) */
    size_t base = (size_t)1 << k;
    size_t step = base / 4;
    size_t q = (n - base + step - 1) / step; /* 1..4 */
    *cap = base + q * step;
    int cls = 64 + (k - 12) * 4 + (int)(q - 1);
    return cls < KILN_CPU_NCLASSES ? cls : -1;
}

void kiln__cpu_alloc_init(kiln__cpu_alloc *a, size_t max_cached_bytes)
{
    memset(a, 0, sizeof *a);
    pthread_mutex_init(&a->mu, NULL);
    a->max_cached_bytes = max_cached_bytes;
}

/* Under a->mu: b (of capacity cap) is handed out. */
static void count_in_use(kiln__cpu_alloc *a, size_t cap)
{
    a->in_use_bytes += cap;
    if (a->in_use_bytes > a->peak_in_use_bytes)
        a->peak_in_use_bytes = a->in_use_bytes;
}

/* Under a->mu: cap bytes carved from the current chunk, or from a new one; NULL when the
 * system has no chunk to give (the caller then uses malloc). */
static char *carve(kiln__cpu_alloc *a, size_t cap, kiln__cpu_chunk **chunk)
{
    kiln__cpu_chunk *c = a->chunks;
    if (c && c->used + cap > CHUNK_BYTES && c->carved == 0) { /* every block of it gone already */
        a->chunks = c->next;
        munmap(c->map, c->map_len);
        free(c);
        c = a->chunks;
    }
    if (!c || c->used + cap > CHUNK_BYTES) {
        size_t len = CHUNK_BYTES + MAP_THRESHOLD; /* room to start on a 2 MiB boundary */
        void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            return NULL;
        if (!(c = calloc(1, sizeof *c))) {
            munmap(m, len);
            return NULL;
        }
        c->map = m;
        c->map_len = len;
        c->base = (char *)(((uintptr_t)m + MAP_THRESHOLD - 1) & ~(uintptr_t)(MAP_THRESHOLD - 1));
#ifdef MADV_HUGEPAGE
        madvise(c->base, CHUNK_BYTES, MADV_HUGEPAGE);
#endif
        c->next = a->chunks;
        a->chunks = c;
    }
    char *p = c->base + c->used;
    c->used += cap;
    c->carved++;
    *chunk = c;
    return p;
}

/* Under a->mu: carved block b leaves the pool for good. When that empties its chunk, the
 * chunk leaves the list for *dead (linked through next), marked detached: the caller
 * unmaps it. */
static void retire(kiln__cpu_alloc *a, struct kiln_buffer *b, kiln__cpu_chunk **dead)
{
    kiln__cpu_chunk *c = b->chunk;
    if (--c->carved > 0 || (c == a->chunks && c->used < CHUNK_BYTES))
        return; /* (the chunk being carved stays for the blocks to come) */
    for (kiln__cpu_chunk **pp = &a->chunks; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    c->detached = true;
    c->next = *dead;
    *dead = c;
}

/* Outside the lock: the memory of blocks that left the pool, then the chunks they
 * emptied. A carved block's pages go back while its chunk stays mapped for its
 * neighbours; a detached chunk goes whole. */
static void release_blocks(struct kiln_buffer *list, kiln__cpu_chunk *dead)
{
    for (struct kiln_buffer *b = list, *next; b; b = next) {
        next = b->next;
        if (b->chunk) {
#ifdef MADV_DONTNEED
            if (!b->chunk->detached)
                madvise(b->data, b->cap, MADV_DONTNEED);
#endif
        } else if (b->mapped) {
            munmap(b->data, b->cap);
        } else {
            free(b->data);
        }
        free(b);
    }
    while (dead) {
        kiln__cpu_chunk *next = dead->next;
        munmap(dead->map, dead->map_len);
        free(dead);
        dead = next;
    }
}

void kiln__cpu_alloc_fini(kiln__cpu_alloc *a)
{
    for (int c = 0; c < KILN_CPU_NCLASSES; c++) {
        struct kiln_buffer *b = a->free_list[c];
        while (b) {
            struct kiln_buffer *next = b->next;
            if (b->chunk)
                free(b); /* its chunk goes below */
            else {
                b->next = NULL;
                release_blocks(b, NULL);
            }
            b = next;
        }
        a->free_list[c] = NULL;
    }
    /* a chunk still holding a block someone kept past the device's close stays mapped
     * (as a malloc'd block would stay allocated) */
    for (kiln__cpu_chunk *c = a->chunks, *next; c; c = next) {
        next = c->next;
        if (c->live == 0) {
            munmap(c->map, c->map_len);
            free(c);
        }
    }
    a->chunks = NULL;
    a->cached_bytes = 0;
    pthread_mutex_destroy(&a->mu);
}

struct kiln_buffer *kiln__cpu_buffer_get(kiln__cpu_ctx *ctx, size_t nbytes)
{
    kiln__cpu_alloc *a = &ctx->alloc;
    size_t cap;
    int cls = size_class(nbytes, &cap);
    if (cls < 0)
        cap = (nbytes + 4095) & ~(size_t)4095;
    if (cls >= 0) {
        pthread_mutex_lock(&a->mu);
        struct kiln_buffer *b = a->free_list[cls];
        if (b) {
            a->free_list[cls] = b->next;
            a->cached_bytes -= b->cap;
            a->reuses++;
            count_in_use(a, b->cap);
            if (b->chunk)
                b->chunk->live++;
        }
        pthread_mutex_unlock(&a->mu);
        if (b) {
            b->next = NULL;
            b->nbytes = nbytes;
            return b;
        }
    }
    struct kiln_buffer *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    if (USE_CHUNKS && cls >= 0 && cap >= CHUNK_MIN && cap < MAP_THRESHOLD) {
        pthread_mutex_lock(&a->mu);
        b->data = carve(a, cap, &b->chunk);
        if (b->data)
            b->chunk->live++;
        pthread_mutex_unlock(&a->mu);
    }
    if (!b->data && cap >= MAP_THRESHOLD) { /* (b->data: carved above) */
        void *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            free(b);
            return NULL;
        }
#ifdef MADV_HUGEPAGE
        madvise(p, cap, MADV_HUGEPAGE);
#endif
        b->data = p;
        b->mapped = true;
    } else if (!b->data) {
        b->data = aligned_alloc(64, cap);
        if (!b->data) {
            free(b);
            return NULL;
        }
    }
    b->nbytes = nbytes;
    b->cap = cap;
    b->cls = cls;
    pthread_mutex_lock(&a->mu);
    a->system_allocs++;
    count_in_use(a, cap);
    pthread_mutex_unlock(&a->mu);
    return b;
}

void kiln__cpu_buffer_put(kiln__cpu_ctx *ctx, struct kiln_buffer *b)
{
    if (!b)
        return;
    if (b->detached) { /* its block is the pool's already */
        free(b);
        return;
    }
    kiln__cpu_alloc *a = &ctx->alloc;
    kiln__cpu_chunk *dead = NULL;
    pthread_mutex_lock(&a->mu);
    a->in_use_bytes -= b->cap;
    if (b->chunk)
        b->chunk->live--;
    if (b->cls >= 0 && a->cached_bytes + b->cap <= a->max_cached_bytes) {
        b->next = a->free_list[b->cls];
        a->free_list[b->cls] = b;
        a->cached_bytes += b->cap;
        b = NULL;
    } else if (b->chunk) {
        retire(a, b, &dead);
    }
    pthread_mutex_unlock(&a->mu);
    if (b) {
        b->next = NULL;
        release_blocks(b, dead);
    }
}

void kiln__cpu_buffer_refresh(kiln__cpu_ctx *ctx, struct kiln_buffer *b)
{
    if (!b || b->wrapped || b->exported || b->cls < 0)
        return;
    kiln__cpu_alloc *a = &ctx->alloc;
    pthread_mutex_lock(&a->mu);
    struct kiln_buffer *top = a->free_list[b->cls];
    if (top && top->cap == b->cap) {
        /* the blocks change owners: a chunk counts the blocks of it in use */
        void *data = b->data;
        bool mapped = b->mapped;
        kiln__cpu_chunk *chunk = b->chunk;
        if (chunk)
            chunk->live--;
        if (top->chunk)
            top->chunk->live++;
        b->data = top->data, b->mapped = top->mapped, b->chunk = top->chunk;
        top->data = data, top->mapped = mapped, top->chunk = chunk;
        a->refreshes++;
    }
    pthread_mutex_unlock(&a->mu);
}

/* The block of record `from` becomes record `to`'s (from keeps its fields: the caller
 * clears or frees it). */
static void take_block(struct kiln_buffer *to, const struct kiln_buffer *from)
{
    to->data = from->data, to->cap = from->cap, to->cls = from->cls;
    to->mapped = from->mapped, to->chunk = from->chunk;
}

bool kiln__cpu_buffer_detach(kiln__cpu_ctx *ctx, struct kiln_buffer *b)
{
    if (!b || b->wrapped || b->exported || b->detached)
        return false;
    /* the pool's free lists link block records: the block leaves under a record of its
     * own, so that b stays the caller's handle */
    struct kiln_buffer *block = calloc(1, sizeof *block);
    if (!block)
        return false;
    take_block(block, b);
    block->nbytes = b->nbytes;
    b->data = NULL, b->chunk = NULL, b->mapped = false;
    b->detached = true;
    kiln__cpu_buffer_put(ctx, block);
    return true;
}

int kiln__cpu_buffer_reattach(kiln__cpu_ctx *ctx, struct kiln_buffer *b)
{
    if (!b->detached)
        return 0;
    struct kiln_buffer *block = kiln__cpu_buffer_get(ctx, b->nbytes);
    if (!block)
        return kiln__error_set_code(KILN_ENOMEM, "cpu: cannot allocate %zu bytes again for a buffer", b->nbytes);
    take_block(b, block);
    b->detached = false;
    free(block);
    return 0;
}

size_t kiln__cpu_alloc_trim(kiln__cpu_ctx *ctx, size_t bytes)
{
    kiln__cpu_alloc *a = &ctx->alloc;
    struct kiln_buffer *out = NULL;
    kiln__cpu_chunk *dead = NULL;
    size_t released = 0;
    pthread_mutex_lock(&a->mu);
    for (int c = KILN_CPU_NCLASSES - 1; c >= 0 && released < bytes; c--)
        while (a->free_list[c] && released < bytes) {
            struct kiln_buffer *b = a->free_list[c];
            a->free_list[c] = b->next;
            a->cached_bytes -= b->cap;
            released += b->cap;
            if (b->chunk)
                retire(a, b, &dead);
            b->next = out;
            out = b;
        }
    pthread_mutex_unlock(&a->mu);
    release_blocks(out, dead); /* the system calls outside the lock */
    return released;
}

void kiln__cpu_alloc_figures(kiln__cpu_ctx *ctx, kiln_device_memory *out)
{
    kiln__cpu_alloc *a = &ctx->alloc;
    pthread_mutex_lock(&a->mu);
    out->in_use_bytes = a->in_use_bytes;
    out->cached_bytes = a->cached_bytes;
    out->reserved_bytes = (uint64_t)a->in_use_bytes + a->cached_bytes;
    out->peak_in_use_bytes = a->peak_in_use_bytes;
    out->device_allocs = a->system_allocs;
    out->reuses = a->reuses;
    pthread_mutex_unlock(&a->mu);
}

void kiln__cpu_alloc_reset_peak(kiln__cpu_ctx *ctx)
{
    kiln__cpu_alloc *a = &ctx->alloc;
    pthread_mutex_lock(&a->mu);
    a->peak_in_use_bytes = a->in_use_bytes;
    pthread_mutex_unlock(&a->mu);
}

void *kiln__cpu_scratch_get(kiln__cpu_ctx *ctx, size_t nbytes, struct kiln_buffer **handle)
{
    struct kiln_buffer *b = kiln__cpu_buffer_get(ctx, nbytes ? nbytes : 1);
    *handle = b;
    return b ? b->data : NULL;
}

void kiln__cpu_scratch_put(kiln__cpu_ctx *ctx, struct kiln_buffer *handle)
{
    kiln__cpu_buffer_put(ctx, handle);
}
