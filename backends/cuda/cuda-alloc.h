/*
 * backends/cuda/cuda-alloc.h — the cuda backend's caching device allocator.
 *
 * cudaMalloc and cudaFree are slow (cudaFree synchronizes the whole device), so a buffer
 * the engine frees is parked on its size class and handed out again; in a steady state
 * (a training loop, a served model) no allocation reaches the driver. Reuse is stream
 * ordered, as backend.h's buffer_free rule asks: a block freed on stream S is reused at
 * once by work on S (S runs in order), and by another stream T only after T was made to
 * wait for S's work so far (the `order` hook: an event recorded on S that T waits on, on
 * the device, with no host wait).
 *
 * Graphs. While a stream records a graph (kiln__cuda_alloc_capture_begin), the blocks
 * its work takes belong to that graph's pool: the graph's kernels address them at
 * every launch, so once freed they are reused only by later work of the same recording
 * (ordered: one stream), and they stay out of every other hand until the pool is
 * released with the graph. A recording takes from the shared cache only blocks its own
 * stream parked or idle ones (an ordering between streams cannot be recorded) and never
 * trims the cache (handing memory back waits for the device, which a recording must not).
 *
 * The allocator knows nothing of CUDA: device memory and stream ordering come through
 * hooks, so the same code runs under unit tests with plain malloc and a fake stream
 * model (tests/cuda/test-cuda-alloc.c) and under HIP.
 */
#ifndef KILN_CUDA_ALLOC_H
#define KILN_CUDA_ALLOC_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** What the allocator asks of the device. Streams are opaque pointers. */
typedef struct kiln_cuda_alloc_hooks {
    void *ud;
    /** n bytes of device memory, or NULL when the device has none left. */
    void *(*raw_alloc)(void *ud, size_t n);
    void (*raw_free)(void *ud, void *ptr);
    /** Make work queued on `to` from now on run after the work queued on `from` so
     *  far. 0, or negative when the device failed (the block is then not reused). */
    int (*order)(void *ud, void *from, void *to);
} kiln_cuda_alloc_hooks;

typedef struct kiln_cuda_graph_pool kiln_cuda_graph_pool;

/** One device allocation, in use or parked. */
typedef struct kiln_cuda_block {
    void *ptr;
    size_t size;  /* the class's capacity, >= the request */
    void *stream; /* the stream that last freed it (parked blocks); NULL: idle */
    int cls;
    struct kiln_cuda_block *next;
    kiln_cuda_graph_pool *pool;       /* the graph that owns it; NULL: the shared cache */
    struct kiln_cuda_block *pool_all; /* the pool's list of every block it owns */
} kiln_cuda_block;

/** Memory figures, for /metrics and the tests. */
typedef struct kiln_cuda_alloc_stats {
    size_t reserved_bytes; /* held from the device: in use + cached */
    size_t in_use_bytes;   /* handed out (class capacities) */
    size_t cached_bytes;   /* parked for reuse */
    size_t peak_in_use_bytes;
    uint64_t raw_allocs, raw_frees; /* calls that reached the device */
    uint64_t reuses;                /* allocations served from the cache */
    uint64_t cross_stream_reuses;   /* of which needed an order() between streams */
    uint64_t oom_retries;           /* raw_alloc failures retried after emptying the cache */
    size_t graph_bytes;             /* held by graphs' pools, counted in use: a graph writes its
                                     * blocks at every launch, freed or not */
    uint64_t graph_pools;           /* pools alive now (graphs recorded or recording) */
} kiln_cuda_alloc_stats;

/** Classes: 512-byte steps up to 4 KiB, then four per power of two up to 2^47. */
#define KILN_CUDA_ALLOC_NCLASSES (8 + 4 * 36)

/** The memory of one graph (see "Graphs" above). Embedded in the graph's object; the
 *  allocator links it while its stream records. */
struct kiln_cuda_graph_pool {
    void *stream; /* the recording stream */
    bool recording;
    kiln_cuda_block *kept[KILN_CUDA_ALLOC_NCLASSES]; /* freed blocks, reused by the recording only */
    kiln_cuda_block *all;                            /* every block it owns, via pool_all */
    size_t bytes;
    struct kiln_cuda_graph_pool *next_recording;
};

typedef struct kiln_cuda_alloc {
    kiln_cuda_alloc_hooks hooks;
    pthread_mutex_t mu;
    kiln_cuda_block *parked[KILN_CUDA_ALLOC_NCLASSES];
    kiln_cuda_graph_pool *recording; /* pools whose stream records now */
    kiln_cuda_alloc_stats stats;
} kiln_cuda_alloc;

/** The class index of a request of n bytes and its capacity; -1 when too large. */
int kiln__cuda_alloc_class(size_t n, size_t *cap);
void kiln__cuda_alloc_init(kiln_cuda_alloc *a, const kiln_cuda_alloc_hooks *hooks);
/** Frees every parked block (the caller synchronized the device first: none may be in use
 *  by queued work); blocks still handed out are the caller's to return first. */
void kiln__cuda_alloc_destroy(kiln_cuda_alloc *a);
/** A block of at least n bytes usable by work queued on stream from now on, or NULL when
 *  the device is out of memory even after the cache was handed back (*oom set true) or
 *  the ordering failed (*oom false). n 0 takes the smallest class. */
kiln_cuda_block *kiln__cuda_alloc_get(kiln_cuda_alloc *a, void *stream, size_t n, bool *oom);
/** Parks blk: work queued on stream before this call may still use it. */
void kiln__cuda_alloc_put(kiln_cuda_alloc *a, void *stream, kiln_cuda_block *blk);
/** Stream is going away after a sync: its parked blocks become free for any stream
 *  without ordering (their stream reads NULL). */
void kiln__cuda_alloc_forget_stream(kiln_cuda_alloc *a, void *stream);
/** Hands parked blocks back to the device, largest first, until `bytes` were released
 *  or none are left; returns the bytes released. SIZE_MAX empties the cache. */
size_t kiln__cuda_alloc_trim(kiln_cuda_alloc *a, size_t bytes);
/** From now on blocks taken for work on stream belong to pool p (zeroed by the caller);
 *  -1 when stream already records. */
int kiln__cuda_alloc_capture_begin(kiln_cuda_alloc *a, kiln_cuda_graph_pool *p, void *stream);
/** The recording ended: p takes no new blocks, and keeps the ones it has. */
void kiln__cuda_alloc_capture_end(kiln_cuda_alloc *a, kiln_cuda_graph_pool *p);
/** The graph is gone (no launch of it is queued before work queued on p's stream from
 *  now on): p's kept blocks are parked on its stream in the shared cache, and the
 *  blocks it owns still handed out return there when freed. */
void kiln__cuda_alloc_pool_release(kiln_cuda_alloc *a, kiln_cuda_graph_pool *p);
void kiln__cuda_alloc_stats_get(kiln_cuda_alloc *a, kiln_cuda_alloc_stats *out);
/** The peak in use starts again from what is in use now. */
void kiln__cuda_alloc_reset_peak(kiln_cuda_alloc *a);

#ifdef __cplusplus
}
#endif
#endif /* KILN_CUDA_ALLOC_H */
