/*
 * onnx-arena.c — the executor's planned activation arena.
 *
 * A graph run with the same input shapes makes the same allocations in the same order,
 * each dying at the same point. So the first run without grad of an input signature (the
 * dtypes, shapes and placement of every input) records them through the allocation hook
 * (tensor-impl.h): each fresh storage on the model's device, its size, and the events
 * (allocations and deaths counted together) at which it is made and dies. A storage still
 * alive when the run ends (a graph output, anything an operator keeps, a weight pack) is
 * left out of the plan: it must outlive the arena's next use. The rest are placed in one
 * block, greedily by size: the largest first, each at the lowest 64-byte aligned offset
 * where it overlaps in memory no placed allocation whose lifetime overlaps its own.
 *
 * Later runs of that signature without grad hand the i-th allocation a storage over the
 * block at its planned offset (backend buffer_wrap_host, so only devices whose buffers are
 * synchronous host memory qualify). A request whose size is not the plan's, one past the
 * plan's end, or one whose bytes are still in use by a live arena storage (the run did not
 * go as recorded) stops the replay: the rest of the run allocates as usual and the plan is
 * dropped, to be recorded again. The in-place path (onnx-inplace.c) needs no planning of
 * its own: it hands a buffer on without allocating, and it decides the same way each time
 * because the references it tests are the same.
 *
 * Memory safety does not rest on the plan being right. Every arena storage holds a
 * reference on its block and clears its slot's live flag when it dies; a run reuses the
 * model's block only when the model holds the sole reference (no storage of an earlier run
 * is alive, an output someone kept for instance), else it takes a fresh block and the old
 * one goes with its last storage. One run at a time holds a model's arena (trylock); a
 * concurrent run goes without. A model keeps at most MAX_PLANS signatures, the least
 * recently used dropped first, and one block sized for the largest of them.
 */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kiln/autodiff.h"
#include "onnx-impl.h"
#include "tensor-impl.h"

#define MAX_PLANS 4
/* plan offsets of entries that are not placed: a graph output (made every run) and an
 * allocation something other than the caller kept (made once, a weight pack) */
#define OUTPUT (-1)
#define ONCE (-2)
#define ALIGN 64
/* Blocks this large are mapped with MADV_HUGEPAGE, as the cpu backend's pool maps its
 * large buffers, so first touch faults once per 2 MiB where the kernel allows it. */
#define MAP_MIN ((size_t)2 << 20)

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

/* ------------------------------------------------------------------ blocks */

typedef struct arena_block arena_block;

typedef struct arena_slot {
    arena_block *block;
    atomic_bool live;            /* an arena storage over this slot is alive */
} arena_slot;

struct arena_block {
    atomic_int refs;             /* the model's, plus one per live storage */
    char *base;
    size_t bytes;
    bool mapped;
    int nslots;
    arena_slot *slots;           /* indexed by trace position */
};

static arena_block *block_new(size_t bytes, int nslots) {
    arena_block *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->slots = calloc((size_t)nslots + 1, sizeof *b->slots);
    bytes = round_up(bytes ? bytes : ALIGN, 4096);
    if (bytes >= MAP_MIN) {
        void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        b->base = p == MAP_FAILED ? NULL : p;
        b->mapped = true;
#ifdef MADV_HUGEPAGE
        if (b->base) madvise(b->base, bytes, MADV_HUGEPAGE);
#endif
    } else {
        b->base = aligned_alloc(ALIGN, bytes);
    }
    if (!b->slots || !b->base) {
        if (b->base && !b->mapped) free(b->base);
        if (b->base && b->mapped) munmap(b->base, bytes);
        free(b->slots);
        free(b);
        return NULL;
    }
    b->bytes = bytes;
    b->nslots = nslots;
    for (int i = 0; i < nslots; i++) {
        b->slots[i].block = b;
        atomic_init(&b->slots[i].live, false);
    }
    atomic_init(&b->refs, 1);
    return b;
}

static void block_release(arena_block *b) {
    if (!b || atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) != 1) return;
    if (b->mapped) munmap(b->base, b->bytes);
    else free(b->base);
    free(b->slots);
    free(b);
}

/* The release callback of an arena storage's buffer; may run on any thread. */
static void slot_release(void *ud) {
    arena_slot *s = ud;
    atomic_store_explicit(&s->live, false, memory_order_release);
    block_release(s->block);
}

/* ------------------------------------------------------------------ plans */

typedef struct plan {
    int64_t *sig;                /* the input signature */
    int nsig;
    int n;                       /* allocations the recorded run made, in order */
    size_t *size;                /* their requested bytes */
    int64_t *offset;             /* their place in the block, or OUTPUT or ONCE */
    int placed;
    size_t arena_bytes, alloc_bytes;
    uint64_t used;               /* LRU clock */
} plan;

static void plan_clear(plan *p) {
    free(p->sig);
    free(p->size);
    free(p->offset);
    memset(p, 0, sizeof *p);
}

struct kiln__onnx_arenas {
    pthread_mutex_t mu;          /* held by the run using the arena, start to end */
    bool enabled;
    int nplans;
    plan plans[MAX_PLANS];
    uint64_t clock;
    arena_block *block;          /* the model's reference */
    uint64_t recorded, replayed, dropped;
    int last_allocs;
    size_t last_planned, last_alloc_bytes;
};

typedef struct trace_entry {
    size_t size;
    int64_t start, end;          /* events; end -1 while alive */
    bool output;                 /* alive at the end as (the storage of) a graph output */
} trace_entry;

struct kiln__onnx_arena_run {
    kiln__alloc_hook hook;       /* first: the hook pointer is the run's */
    kiln__onnx_arenas *a;
    kiln_device *dev;
    int64_t *sig;
    int nsig;
    bool recording;
    /* recording */
    trace_entry *ent;
    int n, cap;
    int64_t event;
    bool broken;                 /* out of memory while recording: no plan */
    /* replaying */
    plan *p;
    arena_block *block;
    int next;                    /* the trace position the next request should match */
    bool stopped;
    int *live, nlive;            /* positions handed out and not yet seen dead */
};

static atomic_uint_fast64_t next_tag = 1;

static kiln_buffer *record_alloc(kiln__alloc_hook *h, size_t nbytes, uint32_t *seq) {
    kiln__onnx_arena_run *r = (kiln__onnx_arena_run *)h;
    *seq = UINT32_MAX;
    if (r->broken) return NULL;
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 256;
        trace_entry *e = cap < INT_MAX / 4 ? realloc(r->ent, (size_t)cap * sizeof *e) : NULL;
        if (!e) { r->broken = true; return NULL; }
        r->ent = e;
        r->cap = cap;
    }
    r->ent[r->n] = (trace_entry){.size = nbytes, .start = r->event++, .end = -1, .output = false};
    *seq = (uint32_t)r->n++;
    return NULL;
}

static void record_freed(kiln__alloc_hook *h, uint32_t seq) {
    kiln__onnx_arena_run *r = (kiln__onnx_arena_run *)h;
    if (seq < (uint32_t)r->n && r->ent[seq].end < 0) r->ent[seq].end = r->event++;
}

static kiln_buffer *replay_alloc(kiln__alloc_hook *h, size_t nbytes, uint32_t *seq) {
    kiln__onnx_arena_run *r = (kiln__onnx_arena_run *)h;
    const plan *p = r->p;
    *seq = 0;
    if (r->stopped) return NULL;
    /* The request is the next entry that recurs, or else one of the entries made once
     * (a weight pack) before it, which this run may or may not make again. */
    int j = r->next, i = -1;
    while (j < p->n && p->offset[j] == ONCE) j++;
    if (j < p->n && p->size[j] == nbytes) i = j;
    for (int k = r->next; i < 0 && k < j; k++)
        if (p->size[k] == nbytes) i = k;
    if (i < 0) {
        r->stopped = true;
        return NULL;
    }
    r->next = i + 1;
    if (p->offset[i] < 0) return NULL;
    size_t lo = (size_t)p->offset[i], hi = lo + round_up(nbytes, ALIGN);
    arena_block *b = r->block;
    int k = 0;
    bool clash = false;
    for (int l = 0; l < r->nlive; l++) {
        int s = r->live[l];
        if (!atomic_load_explicit(&b->slots[s].live, memory_order_acquire)) continue;
        r->live[k++] = s;
        size_t slo = (size_t)p->offset[s], shi = slo + round_up(p->size[s], ALIGN);
        if (slo < hi && lo < shi) clash = true;
    }
    r->nlive = k;
    if (clash) {
        r->stopped = true;
        return NULL;
    }
    arena_slot *s = &b->slots[i];
    atomic_store_explicit(&s->live, true, memory_order_relaxed);
    atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
    kiln_buffer *buf = r->dev->be->buffer_wrap_host(kiln__qctx(r->dev), b->base + lo, nbytes, slot_release, s);
    if (!buf) {
        /* the model still holds the block, so this is never its last reference */
        atomic_store_explicit(&s->live, false, memory_order_relaxed);
        block_release(b);
        kiln_error_clear();
        r->stopped = true;
        return NULL;
    }
    r->live[r->nlive++] = i;
    return buf;
}

/* Greedy placement, largest first (ties by first use, for a stable layout). */
typedef struct place {
    int idx;
    size_t size;
    int64_t start, end, off;
} place;

static int by_size_desc(const void *x, const void *y) {
    const place *a = x, *b = y;
    if (a->size != b->size) return a->size < b->size ? 1 : -1;
    return (a->start > b->start) - (a->start < b->start);
}

static int by_offset(const void *x, const void *y) {
    const place *a = *(const place *const *)x, *b = *(const place *const *)y;
    return (a->off > b->off) - (a->off < b->off);
}

/* Fills p->offset, placed, arena_bytes and alloc_bytes from the trace; -1 when out of memory. */
static int plan_place(plan *p, const trace_entry *ent, int n) {
    place *pl = malloc(((size_t)n + 1) * sizeof *pl);
    const place **near = malloc(((size_t)n + 1) * sizeof *near);
    if (!pl || !near) { free(pl); free(near); return -1; }
    int np = 0;
    for (int i = 0; i < n; i++) {
        p->offset[i] = ent[i].output ? OUTPUT : ONCE;
        if (ent[i].end >= 0)
            pl[np++] = (place){.idx = i, .size = round_up(ent[i].size, ALIGN), .start = ent[i].start,
                               .end = ent[i].end, .off = -1};
    }
    qsort(pl, (size_t)np, sizeof *pl, by_size_desc);
    size_t top = 0, sum = 0;
    for (int i = 0; i < np; i++) {
        int nn = 0;
        for (int j = 0; j < i; j++)
            if (pl[j].start < pl[i].end && pl[i].start < pl[j].end) near[nn++] = &pl[j];
        qsort(near, (size_t)nn, sizeof *near, by_offset);
        size_t off = 0;
        for (int j = 0; j < nn; j++) {
            if (off + pl[i].size <= (size_t)near[j]->off) break;
            size_t e = (size_t)near[j]->off + near[j]->size;
            if (e > off) off = e;
        }
        pl[i].off = (int64_t)off;
        p->offset[pl[i].idx] = (int64_t)off;
        if (off + pl[i].size > top) top = off + pl[i].size;
        sum += pl[i].size;
    }
    p->placed = np;
    p->arena_bytes = top;
    p->alloc_bytes = sum;
    free(pl);
    free(near);
    return 0;
}

/* ------------------------------------------------------------------ model side */

kiln__onnx_arenas *kiln__onnx_arenas_new(bool enabled) {
    kiln__onnx_arenas *a = calloc(1, sizeof *a);
    if (!a || pthread_mutex_init(&a->mu, NULL)) {
        free(a);
        kiln__error_set("onnx: out of memory");
        return NULL;
    }
    a->enabled = enabled;
    return a;
}

void kiln__onnx_arenas_free(kiln__onnx_arenas *a) {
    if (!a) return;
    for (int i = 0; i < a->nplans; i++) plan_clear(&a->plans[i]);
    block_release(a->block);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

int kiln__onnx_arenas_stats(kiln__onnx_arenas *a, kiln_onnx_arena_stats *out) {
    memset(out, 0, sizeof *out);
    if (!a) return 0;
    pthread_mutex_lock(&a->mu);
    out->enabled = a->enabled;
    out->plans = a->nplans;
    out->recorded = a->recorded;
    out->replayed = a->replayed;
    out->dropped = a->dropped;
    out->allocs = a->last_allocs;
    out->planned_bytes = a->last_planned;
    out->alloc_bytes = a->last_alloc_bytes;
    out->reserved_bytes = a->block ? a->block->bytes : 0;
    pthread_mutex_unlock(&a->mu);
    return 0;
}

static plan *find_plan(kiln__onnx_arenas *a, const int64_t *sig, int nsig) {
    for (int i = 0; i < a->nplans; i++)
        if (a->plans[i].nsig == nsig && !memcmp(a->plans[i].sig, sig, (size_t)nsig * sizeof *sig))
            return &a->plans[i];
    return NULL;
}

static void drop_plan(kiln__onnx_arenas *a, plan *p) {
    plan_clear(p);
    *p = a->plans[--a->nplans];
    memset(&a->plans[a->nplans], 0, sizeof *p);
}

/* A block for p: the model's when nothing else uses it and it is large enough, else a
 * fresh one sized for every plan kept, so signatures that alternate share it. A fresh
 * block takes over what the backend's pool parked when the recording run freed its
 * intermediates, so the pool's parked buffers go back to the system (buffer_trim), or
 * the process would hold that memory twice: ResNet-50 at batch 8 peaked at 411 MB with
 * the arena against 356 MB without; with the trim it is 341. Everything parked goes, not
 * just the block's size, since size classes round up and the kernels' scratch buffers
 * are parked there too (trimming only the block's size left 385 MB); what a later run
 * still needs, a few MB of scratch, comes back at one page fault per page, once. This
 * happens only when a block is made, not per run. */
static arena_block *block_for(kiln__onnx_arenas *a, const plan *p, kiln_device *dev) {
    arena_block *b = a->block;
    if (b && atomic_load_explicit(&b->refs, memory_order_acquire) == 1 && b->bytes >= p->arena_bytes &&
        b->nslots >= p->n)
        return b;
    size_t bytes = 0;
    int nslots = 0;
    for (int i = 0; i < a->nplans; i++) {
        if (a->plans[i].arena_bytes > bytes) bytes = a->plans[i].arena_bytes;
        if (a->plans[i].n > nslots) nslots = a->plans[i].n;
    }
    arena_block *nb = block_new(bytes, nslots);
    if (!nb) return NULL;
    block_release(b);
    a->block = nb;
    if (dev->be->buffer_trim) dev->be->buffer_trim(kiln__qctx(dev), SIZE_MAX);
    return nb;
}

/* The input signature: the outputs asked for (one not asked for dies in the run), and per
 * input its dtype, whether it is on the model's device (a copy made by the run is one
 * allocation more), its rank and dims. */
static int64_t *signature(kiln_device *dev, int n, kiln_tensor *const *in, int nout, int *nsig) {
    int64_t *sig = malloc(((size_t)n * (3 + KILN_MAX_DIMS) + 1) * sizeof *sig);
    if (!sig) return NULL;
    int k = 0;
    sig[k++] = nout;
    for (int i = 0; i < n; i++) {
        const kiln_tensor *t = in[i];
        sig[k++] = t->dtype;
        sig[k++] = kiln__dev(t) == dev;
        sig[k++] = t->ndim;
        for (int d = 0; d < t->ndim; d++) sig[k++] = t->shape[d];
    }
    *nsig = k;
    return sig;
}

kiln__onnx_arena_run *kiln__onnx_arena_begin(kiln__onnx_arenas *a, kiln_device *dev, int n,
                                             kiln_tensor *const *in, int nout) {
    if (!a || !a->enabled || !dev || kiln_grad_enabled()) return NULL;
    if (!dev->be->buffer_wrap_host || !dev->caps.host_memory || dev->caps.async) return NULL;
    /* a run nested in another's hook (a model run from inside an operator) goes without */
    kiln__alloc_hook *outer = kiln__alloc_hook_swap(NULL);
    kiln__alloc_hook_swap(outer);
    if (outer) return NULL;
    kiln__onnx_arena_run *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->sig = signature(dev, n, in, nout, &r->nsig);
    if (!r->sig || pthread_mutex_trylock(&a->mu)) {
        free(r->sig);
        free(r);
        return NULL;
    }
    r->a = a;
    r->dev = dev;
    r->hook.dev = dev;
    r->hook.tag = atomic_fetch_add(&next_tag, 1);
    plan *p = find_plan(a, r->sig, r->nsig);
    if (p) {
        r->p = p;
        p->used = ++a->clock;
        r->block = p->placed ? block_for(a, p, dev) : NULL;
        r->live = malloc(((size_t)p->n + 1) * sizeof *r->live);
        if ((p->placed && !r->block) || !r->live) {
            pthread_mutex_unlock(&a->mu);
            free(r->live);
            free(r->sig);
            free(r);
            return NULL;
        }
        r->hook.alloc = replay_alloc;
    } else {
        r->recording = true;
        r->hook.alloc = record_alloc;
        r->hook.freed = record_freed;
    }
    kiln__alloc_hook_swap(&r->hook);
    return r;
}

static void finish_recording(kiln__onnx_arenas *a, kiln__onnx_arena_run *r) {
    plan p = {.sig = r->sig, .nsig = r->nsig, .n = r->n};
    p.size = malloc(((size_t)r->n + 1) * sizeof *p.size);
    p.offset = malloc(((size_t)r->n + 1) * sizeof *p.offset);
    if (!p.size || !p.offset || plan_place(&p, r->ent, r->n)) {
        free(p.size);
        free(p.offset);
        return;                  /* out of memory: the next run records again */
    }
    for (int i = 0; i < r->n; i++) p.size[i] = r->ent[i].size;
    r->sig = NULL;               /* the plan owns it now */
    if (a->nplans == MAX_PLANS) {
        int lru = 0;
        for (int i = 1; i < a->nplans; i++)
            if (a->plans[i].used < a->plans[lru].used) lru = i;
        drop_plan(a, &a->plans[lru]);
    }
    p.used = ++a->clock;
    a->plans[a->nplans++] = p;
    a->recorded++;
    a->last_allocs = p.placed;
    a->last_planned = p.arena_bytes;
    a->last_alloc_bytes = p.alloc_bytes;
}

void kiln__onnx_arena_end(kiln__onnx_arena_run *r, bool ok, int nout, kiln_tensor *const *out) {
    if (!r) return;
    kiln__alloc_hook_swap(NULL);
    kiln__onnx_arenas *a = r->a;
    if (r->recording) {
        for (int i = 0; ok && !r->broken && i < nout; i++) {
            const kiln_storage *st = out[i] ? out[i]->storage : NULL;
            if (st && st->hook_tag == r->hook.tag && st->hook_seq < (uint32_t)r->n) r->ent[st->hook_seq].output = true;
        }
        if (ok && !r->broken) finish_recording(a, r);
    } else {
        plan *p = r->p;
        bool rest_planned = false;
        for (int i = r->next; i < p->n && !rest_planned; i++) rest_planned = p->offset[i] >= 0;
        if (r->stopped || (ok && rest_planned)) {
            drop_plan(a, p);
            a->dropped++;
        } else if (ok) {
            a->replayed++;
            a->last_allocs = p->placed;
            a->last_planned = p->arena_bytes;
            a->last_alloc_bytes = p->alloc_bytes;
        }
    }
    pthread_mutex_unlock(&a->mu);
    free(r->ent);
    free(r->live);
    free(r->sig);
    free(r);
}
