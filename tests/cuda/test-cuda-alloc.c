/*
 * tests/cuda/test-cuda-alloc.c — the cuda backend's caching allocator
 * (backends/cuda/cuda-alloc.c) driven through fake device hooks: malloc'd "device"
 * memory with a capacity, streams that are plain tokens, and a record of every ordering
 * the allocator asks for. No GPU or toolkit is needed.
 *
 * Checked: the size classes (capacity >= request, at most a quarter wasted past 4 KiB);
 * a steady state that never reaches the device; reuse on the freeing stream without an
 * ordering and on another stream only after one; the freeing stream's own block preferred;
 * a failed device allocation retried once after the cache is handed back; a failed
 * ordering never hands a block out; a forgotten stream's blocks reused without ordering;
 * trim largest first; the figures; concurrent use from several threads; and a graph's
 * pool: a recording stream takes its own or idle blocks and never one that needs an
 * ordering, its blocks never reach another hand until the pool is released, a recording
 * never trims the cache, and a released pool's blocks come back to the shared cache.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-alloc.h"

static int failures, checks;

#define CHECK(cond, ...)                                                                                          \
    do {                                                                                                          \
        checks++;                                                                                                 \
        if (!(cond)) {                                                                                            \
            failures++;                                                                                           \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                       \
            fprintf(stderr, __VA_ARGS__);                                                                         \
            fprintf(stderr, "\n");                                                                                \
        }                                                                                                         \
    } while (0)

/* ------------------------------------------------------------ the fake device */

typedef struct fake_device {
    pthread_mutex_t mu;
    size_t capacity, used;
    int allocs, frees, orders, order_fail;
    void *last_from, *last_to;
} fake_device;

typedef struct fake_header {
    size_t n;
} fake_header;

static void *fake_alloc(void *ud, size_t n)
{
    fake_device *d = ud;
    pthread_mutex_lock(&d->mu);
    if (d->used + n > d->capacity) {
        pthread_mutex_unlock(&d->mu);
        return NULL;
    }
    d->used += n;
    d->allocs++;
    pthread_mutex_unlock(&d->mu);
    fake_header *h = malloc(sizeof *h + n);
    if (!h)
        return NULL;
    h->n = n;
    memset(h + 1, 0xA5, n < 64 ? n : 64); /* touch it, so a bad pointer shows under ASan */
    return h + 1;
}

static void fake_free(void *ud, void *ptr)
{
    fake_device *d = ud;
    fake_header *h = (fake_header *)ptr - 1;
    pthread_mutex_lock(&d->mu);
    d->used -= h->n;
    d->frees++;
    pthread_mutex_unlock(&d->mu);
    free(h);
}

static int fake_order(void *ud, void *from, void *to)
{
    fake_device *d = ud;
    pthread_mutex_lock(&d->mu);
    d->orders++;
    d->last_from = from;
    d->last_to = to;
    int fail = d->order_fail;
    pthread_mutex_unlock(&d->mu);
    return fail ? -1 : 0;
}

static void setup(kiln_cuda_alloc *a, fake_device *d, size_t capacity)
{
    memset(d, 0, sizeof *d);
    pthread_mutex_init(&d->mu, NULL);
    d->capacity = capacity;
    kiln_cuda_alloc_hooks h = {.ud = d, .raw_alloc = fake_alloc, .raw_free = fake_free, .order = fake_order};
    kiln__cuda_alloc_init(a, &h);
}

static void teardown(kiln_cuda_alloc *a, fake_device *d)
{
    kiln__cuda_alloc_destroy(a);
    CHECK(d->used == 0, "device memory left after destroy: %zu bytes", d->used);
    pthread_mutex_destroy(&d->mu);
}

/* Streams are opaque tokens to the allocator. */
static char stream_a, stream_b, stream_c;
#define SA ((void *)&stream_a)
#define SB ((void *)&stream_b)
#define SC ((void *)&stream_c)

/* ------------------------------------------------------------------ the tests */

static void test_classes(void)
{
    size_t cap = 0;
    CHECK(kiln__cuda_alloc_class(0, &cap) == 0 && cap == 512, "0 bytes: class 0 of 512, got cap %zu", cap);
    CHECK(kiln__cuda_alloc_class(1, &cap) == 0 && cap == 512, "1 byte: cap %zu", cap);
    CHECK(kiln__cuda_alloc_class(512, &cap) == 0 && cap == 512, "512: cap %zu", cap);
    CHECK(kiln__cuda_alloc_class(513, &cap) == 1 && cap == 1024, "513: cap %zu", cap);
    CHECK(kiln__cuda_alloc_class(4096, &cap) == 7 && cap == 4096, "4096: cap %zu", cap);
    CHECK(kiln__cuda_alloc_class(4097, &cap) == 8 && cap == 5120, "4097: cap %zu", cap);
    CHECK(kiln__cuda_alloc_class(8192, &cap) == 11 && cap == 8192, "8192: cap %zu", cap);
    CHECK(kiln__cuda_alloc_class(8193, &cap) == 12 && cap == 10240, "8193: cap %zu", cap);
    CHECK(kiln__cuda_alloc_class((size_t)1 << 62, &cap) == -1, "2^62 bytes must be refused");
    /* a sweep: capacity covers the request, classes grow with it, little waste */
    int prev = -1;
    size_t prev_cap = 0;
    for (size_t n = 1; n < ((size_t)1 << 34); n += n / 7 + 1) {
        int c = kiln__cuda_alloc_class(n, &cap);
        CHECK(c >= 0 && c < KILN_CUDA_ALLOC_NCLASSES, "class of %zu out of range: %d", n, c);
        CHECK(cap >= n, "cap %zu below request %zu", cap, n);
        CHECK(n <= 4096 || (double)(cap - n) <= 0.25 * (double)n, "request %zu wastes %zu", n, cap - n);
        CHECK(c >= prev && (c != prev || cap == prev_cap), "class %d of %zu goes backwards from %d", c, n, prev);
        prev = c;
        prev_cap = cap;
    }
}

static void test_steady_state(void)
{
    kiln_cuda_alloc a;
    fake_device d;
    setup(&a, &d, (size_t)1 << 30);
    enum {
        N = 100
    };
    kiln_cuda_block *blk[N];
    bool oom;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) {
            blk[i] = kiln__cuda_alloc_get(&a, SA, (size_t)(i * 1000 + 1), &oom);
            CHECK(blk[i] && blk[i]->size >= (size_t)(i * 1000 + 1), "round %d block %d", round, i);
        }
        for (int i = 0; i < N; i++)
            kiln__cuda_alloc_put(&a, SA, blk[i]);
    }
    kiln_cuda_alloc_stats st;
    kiln__cuda_alloc_stats_get(&a, &st);
    /* sizes that share a class share a block only after a free, so the first round may
     * ask the device at most N times, and later rounds never */
    CHECK(d.allocs <= N && st.raw_allocs == (uint64_t)d.allocs, "device allocations: %d", d.allocs);
    CHECK(st.reuses == (uint64_t)(3 * N - d.allocs), "reuses %llu, expected %d", (unsigned long long)st.reuses,
          3 * N - d.allocs);
    CHECK(d.orders == 0 && st.cross_stream_reuses == 0, "one stream needs no ordering (got %d)", d.orders);
    CHECK(st.in_use_bytes == 0 && st.cached_bytes == st.reserved_bytes && st.reserved_bytes == d.used,
          "in use %zu, cached %zu, reserved %zu, device %zu", st.in_use_bytes, st.cached_bytes, st.reserved_bytes,
          d.used);
    teardown(&a, &d);
}

static void test_cross_stream(void)
{
    kiln_cuda_alloc a;
    fake_device d;
    setup(&a, &d, (size_t)1 << 30);
    bool oom;
    kiln_cuda_block *x = kiln__cuda_alloc_get(&a, SA, 100000, &oom);
    void *ptr = x->ptr;
    kiln__cuda_alloc_put(&a, SA, x);
    kiln_cuda_block *y = kiln__cuda_alloc_get(&a, SB, 100000, &oom);
    CHECK(y && y->ptr == ptr, "the parked block is reused on another stream");
    CHECK(d.orders == 1 && d.last_from == SA && d.last_to == SB, "one ordering from A to B (got %d)", d.orders);
    kiln__cuda_alloc_put(&a, SB, y);
    /* B freed it: B reuses it at once */
    kiln_cuda_block *z = kiln__cuda_alloc_get(&a, SB, 99000, &oom);
    CHECK(z && z->ptr == ptr && d.orders == 1, "same-stream reuse orders nothing (orders %d)", d.orders);

    /* with blocks of one class parked by A and by C, C gets its own */
    kiln_cuda_block *pa = kiln__cuda_alloc_get(&a, SA, 100000, &oom);
    kiln_cuda_block *pc = kiln__cuda_alloc_get(&a, SC, 100000, &oom);
    void *cptr = pc->ptr;
    kiln__cuda_alloc_put(&a, SC, pc);
    kiln__cuda_alloc_put(&a, SA, pa);
    kiln_cuda_block *w = kiln__cuda_alloc_get(&a, SC, 100000, &oom);
    CHECK(w && w->ptr == cptr && d.orders == 1, "stream C takes the block it freed (orders %d)", d.orders);

    /* a forgotten stream's blocks are idle: no ordering */
    kiln__cuda_alloc_forget_stream(&a, SA);
    kiln_cuda_block *v = kiln__cuda_alloc_get(&a, SB, 100000, &oom);
    CHECK(v && d.orders == 1, "a block of a forgotten stream needs no ordering (orders %d)", d.orders);
    kiln_cuda_alloc_stats st;
    kiln__cuda_alloc_stats_get(&a, &st);
    CHECK(st.cross_stream_reuses == 1, "cross-stream reuses %llu", (unsigned long long)st.cross_stream_reuses);
    kiln__cuda_alloc_put(&a, SB, z);
    kiln__cuda_alloc_put(&a, SC, w);
    kiln__cuda_alloc_put(&a, SB, v);
    teardown(&a, &d);
}

static void test_order_failure(void)
{
    kiln_cuda_alloc a;
    fake_device d;
    setup(&a, &d, (size_t)1 << 30);
    bool oom = true;
    kiln_cuda_block *x = kiln__cuda_alloc_get(&a, SA, 5000, &oom);
    kiln__cuda_alloc_put(&a, SA, x);
    d.order_fail = 1;
    kiln_cuda_block *y = kiln__cuda_alloc_get(&a, SB, 5000, &oom);
    CHECK(!y && !oom, "a block that cannot be ordered is not handed out, and it is no out-of-memory");
    CHECK(d.frees == 1 && d.used == 0, "the unorderable block went back to the device (frees %d)", d.frees);
    d.order_fail = 0;
    y = kiln__cuda_alloc_get(&a, SB, 5000, &oom);
    CHECK(y != NULL, "allocating works again");
    kiln__cuda_alloc_put(&a, SB, y);
    teardown(&a, &d);
}

static void test_oom(void)
{
    kiln_cuda_alloc a;
    fake_device d;
    setup(&a, &d, (size_t)3 << 20);
    bool oom = false;
    kiln_cuda_block *x = kiln__cuda_alloc_get(&a, SA, (size_t)2 << 20, &oom);
    CHECK(x != NULL, "2 MiB fits in 3");
    kiln__cuda_alloc_put(&a, SA, x);
    /* another class: the device is full of the parked block, which goes back first */
    kiln_cuda_block *y = kiln__cuda_alloc_get(&a, SA, (size_t)3 << 19, &oom);
    kiln_cuda_alloc_stats st;
    kiln__cuda_alloc_stats_get(&a, &st);
    CHECK(y != NULL && st.oom_retries == 1 && d.frees == 1, "retried after emptying the cache (retries %llu)",
          (unsigned long long)st.oom_retries);
    kiln_cuda_block *z = kiln__cuda_alloc_get(&a, SA, (size_t)4 << 20, &oom);
    CHECK(!z && oom, "4 MiB on a 3 MiB device is out of memory");
    z = kiln__cuda_alloc_get(&a, SA, (size_t)1 << 62, &oom);
    CHECK(!z && oom, "a request past the largest class is out of memory");
    kiln__cuda_alloc_stats_get(&a, &st);
    CHECK(st.in_use_bytes == y->size && st.peak_in_use_bytes == ((size_t)2 << 20), "in use %zu, peak %zu",
          st.in_use_bytes, st.peak_in_use_bytes);
    kiln__cuda_alloc_put(&a, SA, y);
    teardown(&a, &d);
}

static void test_trim(void)
{
    kiln_cuda_alloc a;
    fake_device d;
    setup(&a, &d, (size_t)1 << 30);
    bool oom;
    kiln_cuda_block *big = kiln__cuda_alloc_get(&a, SA, (size_t)1 << 20, &oom);
    kiln_cuda_block *small = kiln__cuda_alloc_get(&a, SA, 8000, &oom);
    size_t small_size = small->size;
    kiln__cuda_alloc_put(&a, SA, small);
    kiln__cuda_alloc_put(&a, SA, big);
    size_t r = kiln__cuda_alloc_trim(&a, 1);
    CHECK(r == ((size_t)1 << 20), "trim(1) releases the largest block first: %zu", r);
    kiln_cuda_alloc_stats st;
    kiln__cuda_alloc_stats_get(&a, &st);
    CHECK(st.cached_bytes == small_size && st.reserved_bytes == small_size && d.used == small_size,
          "cached %zu reserved %zu", st.cached_bytes, st.reserved_bytes);
    r = kiln__cuda_alloc_trim(&a, SIZE_MAX);
    CHECK(r == small_size && d.used == 0, "trim everything: %zu", r);
    CHECK(kiln__cuda_alloc_trim(&a, SIZE_MAX) == 0, "nothing left to trim");
    teardown(&a, &d);
}

typedef struct worker_arg {
    kiln_cuda_alloc *a;
    void *stream;
    int errors;
} worker_arg;

static void *worker(void *p)
{
    worker_arg *w = p;
    kiln_cuda_block *held[8] = {0};
    unsigned seed = (unsigned)(uintptr_t)w->stream;
    for (int i = 0; i < 2000; i++) {
        int slot = (int)(rand_r(&seed) % 8);
        if (held[slot]) {
            kiln__cuda_alloc_put(w->a, w->stream, held[slot]);
            held[slot] = NULL;
        } else {
            bool oom;
            size_t n = 1 + rand_r(&seed) % 200000;
            held[slot] = kiln__cuda_alloc_get(w->a, w->stream, n, &oom);
            if (!held[slot] || held[slot]->size < n)
                w->errors++;
            else
                memset(held[slot]->ptr, i & 0xff, 16);
        }
    }
    for (int s = 0; s < 8; s++)
        kiln__cuda_alloc_put(w->a, w->stream, held[s]);
    return NULL;
}

static void test_threads(void)
{
    kiln_cuda_alloc a;
    fake_device d;
    setup(&a, &d, (size_t)1 << 32);
    static char tokens[4];
    pthread_t th[4];
    worker_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (worker_arg){.a = &a, .stream = &tokens[i]};
        pthread_create(&th[i], NULL, worker, &args[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(args[i].errors == 0, "thread %d saw %d failed allocations", i, args[i].errors);
    }
    kiln_cuda_alloc_stats st;
    kiln__cuda_alloc_stats_get(&a, &st);
    CHECK(st.in_use_bytes == 0 && st.cached_bytes == st.reserved_bytes && st.reserved_bytes == d.used,
          "after the threads: in use %zu, cached %zu, reserved %zu, device %zu", st.in_use_bytes, st.cached_bytes,
          st.reserved_bytes, d.used);
    CHECK(st.reuses > 0, "threads reused blocks");
    teardown(&a, &d);
}

static void test_graph_pool(void)
{
    kiln_cuda_alloc a;
    fake_device d;
    setup(&a, &d, (size_t)1 << 20);
    bool oom;
    /* the shared cache holds one block parked by SA and one parked by SB */
    kiln_cuda_block *own = kiln__cuda_alloc_get(&a, SA, 4096, &oom);
    kiln_cuda_block *other = kiln__cuda_alloc_get(&a, SB, 4096, &oom);
    kiln__cuda_alloc_put(&a, SA, own);
    kiln__cuda_alloc_put(&a, SB, other);
    int allocs0 = d.allocs;

    kiln_cuda_graph_pool pool;
    memset(&pool, 0, sizeof pool);
    CHECK(kiln__cuda_alloc_capture_begin(&a, &pool, SA) == 0, "recording starts");
    kiln_cuda_graph_pool again;
    memset(&again, 0, sizeof again);
    CHECK(kiln__cuda_alloc_capture_begin(&a, &again, SA) < 0, "a stream records one graph at a time");

    kiln_cuda_block *x = kiln__cuda_alloc_get(&a, SA, 4000, &oom);
    CHECK(x == own && x->pool == &pool, "the recording takes the block its own stream parked");
    kiln_cuda_block *y = kiln__cuda_alloc_get(&a, SA, 4000, &oom);
    CHECK(y && y != other && d.orders == 0 && d.allocs == allocs0 + 1,
          "a block another stream parked needs an ordering, which a recording cannot make (orders %d)", d.orders);
    kiln__cuda_alloc_put(&a, SA, x);
    kiln_cuda_block *x2 = kiln__cuda_alloc_get(&a, SA, 4000, &oom);
    CHECK(x2 == x, "a block freed while recording is reused by the same recording");
    kiln__cuda_alloc_put(&a, SA, x2);
    /* another stream meanwhile never gets the graph's blocks */
    kiln_cuda_block *z = kiln__cuda_alloc_get(&a, SB, 4000, &oom);
    CHECK(z == other && !z->pool, "another stream takes from the shared cache only");
    kiln__cuda_alloc_put(&a, SB, z);

    /* out of memory while recording: the cache is not trimmed (that would wait) */
    int frees0 = d.frees;
    kiln_cuda_block *big = kiln__cuda_alloc_get(&a, SA, (size_t)2 << 20, &oom);
    CHECK(!big && oom && d.frees == frees0, "no trim while recording (frees %d -> %d)", frees0, d.frees);

    kiln__cuda_alloc_capture_end(&a, &pool);
    kiln_cuda_alloc_stats st;
    kiln__cuda_alloc_stats_get(&a, &st);
    CHECK(st.graph_pools == 1 && st.graph_bytes == x->size + y->size, "graph bytes %zu", st.graph_bytes);
    CHECK(st.in_use_bytes == x->size + y->size && st.reserved_bytes == st.in_use_bytes + st.cached_bytes,
          "a graph's blocks count as in use, freed or not (in use %zu, cached %zu, reserved %zu)", st.in_use_bytes,
          st.cached_bytes, st.reserved_bytes);
    /* after the recording, its kept blocks stay the graph's: SA gets another */
    kiln_cuda_block *w = kiln__cuda_alloc_get(&a, SA, 4000, &oom);
    CHECK(w && w != x && w != y && !w->pool, "a recorded graph's blocks stay out of the shared cache");
    /* y is still handed out (a graph output, say): freed now, it stays the graph's */
    kiln__cuda_alloc_put(&a, SA, y);
    kiln_cuda_block *w2 = kiln__cuda_alloc_get(&a, SA, 4000, &oom);
    CHECK(w2 != y, "a graph's block freed after the recording stays the graph's");
    kiln__cuda_alloc_put(&a, SA, w2);

    kiln__cuda_alloc_pool_release(&a, &pool);

    /* a block the graph owns, handed out when the pool goes, returns to the shared cache */
    kiln_cuda_graph_pool pool2;
    memset(&pool2, 0, sizeof pool2);
    CHECK(kiln__cuda_alloc_capture_begin(&a, &pool2, SA) == 0, "a second recording on the stream");
    kiln_cuda_block *v = kiln__cuda_alloc_get(&a, SA, 100, &oom);
    CHECK(v && v->pool == &pool2, "the second recording's block");
    kiln__cuda_alloc_pool_release(&a, &pool2);
    CHECK(!v->pool, "released: the block belongs to no graph");
    kiln__cuda_alloc_put(&a, SA, v);
    kiln_cuda_block *v2 = kiln__cuda_alloc_get(&a, SA, 100, &oom);
    CHECK(v2 == v, "and is reused from the shared cache once freed");
    kiln__cuda_alloc_put(&a, SA, v2);
    kiln__cuda_alloc_put(&a, SA, w);
    kiln__cuda_alloc_stats_get(&a, &st);
    CHECK(st.graph_bytes == 0 && st.graph_pools == 0 && st.in_use_bytes == 0 &&
              st.cached_bytes == st.reserved_bytes,
          "every block back in the shared cache (graph %zu, in use %zu, cached %zu, reserved %zu)", st.graph_bytes,
          st.in_use_bytes, st.cached_bytes, st.reserved_bytes);
    teardown(&a, &d);
}

static void test_graph_pool_release(void)
{
    kiln_cuda_alloc a;
    fake_device d;
    setup(&a, &d, (size_t)1 << 20);
    bool oom;
    kiln_cuda_graph_pool pool;
    memset(&pool, 0, sizeof pool);
    kiln__cuda_alloc_capture_begin(&a, &pool, SA);
    kiln_cuda_block *x = kiln__cuda_alloc_get(&a, SA, 8192, &oom);
    kiln__cuda_alloc_put(&a, SA, x);
    kiln__cuda_alloc_capture_end(&a, &pool);
    kiln__cuda_alloc_pool_release(&a, &pool);
    kiln_cuda_alloc_stats st;
    kiln__cuda_alloc_stats_get(&a, &st);
    CHECK(st.graph_bytes == 0 && st.graph_pools == 0 && st.cached_bytes == x->size,
          "released kept blocks are cached (graph %zu, cached %zu)", st.graph_bytes, st.cached_bytes);
    int allocs0 = d.allocs;
    kiln_cuda_block *y = kiln__cuda_alloc_get(&a, SA, 8192, &oom);
    CHECK(y == x && d.allocs == allocs0 && d.orders == 0, "the graph's stream reuses it without an ordering");
    kiln__cuda_alloc_put(&a, SA, y);
    y = kiln__cuda_alloc_get(&a, SB, 8192, &oom);
    CHECK(y == x && d.orders == 1 && d.last_from == SA && d.last_to == SB,
          "another stream reuses it after an ordering on the graph's stream");
    kiln__cuda_alloc_put(&a, SB, y);
    teardown(&a, &d);
}

int main(void)
{
    test_classes();
    test_steady_state();
    test_cross_stream();
    test_order_failure();
    test_oom();
    test_trim();
    test_threads();
    test_graph_pool();
    test_graph_pool_release();
    printf("test-cuda-alloc: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
