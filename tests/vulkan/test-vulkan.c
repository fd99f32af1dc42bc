/*
 * tests/vulkan/test-vulkan.c — what the Vulkan backend promises beyond the conformance
 * cases: buffers come from a few large blocks (vkAllocateMemory is counted), a bad device
 * index and a missing driver are refused with messages, a buffer past
 * maxStorageBufferRange is refused, the pipeline cache is written to the data directory
 * and a corrupt one is ignored, and work queued on one queue is ordered for another by an
 * event.
 *
 * Exit 77 (skipped) only when the machine has no Vulkan device at all.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/vulkan/vk-impl.h"
#include "common/philox.h"
#include "kiln/tensor.h"

const kiln_backend_iface *kiln_backend_vulkan(void);

static int failures;
#define CHECK(cond, ...)                                                                                          \
    do {                                                                                                          \
        if (!(cond)) {                                                                                            \
            failures++;                                                                                           \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                  \
            fprintf(stderr, __VA_ARGS__);                                                                         \
            fprintf(stderr, "\n");                                                                                \
        }                                                                                                         \
    } while (0)

static void test_allocations_reuse_blocks(const kiln_backend_iface *be)
{
    kvk_device *d = be->open(0);
    CHECK(d, "open: %s", kiln_error());
    if (!d)
        return;
    kvk_queue *q = be->queue_open(d);
    uint64_t before = d->alloc.memory_allocations;
    kiln_buffer *bufs[64];
    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < 64; i++) {
            bufs[i] = be->buffer_alloc(q, (size_t)(1000 + 37 * i + round));
            CHECK(bufs[i], "alloc %d: %s", i, kiln_error());
        }
        for (int i = 0; i < 64; i++)
            if (bufs[i])
                be->buffer_free(q, bufs[i]);
    }
    uint64_t used = d->alloc.memory_allocations - before;
    CHECK(used <= 1, "1280 allocations made %llu vkAllocateMemory calls (want at most 1)",
          (unsigned long long)used);
    /* a freed buffer of a class comes back before new memory is carved */
    kiln_buffer *a = be->buffer_alloc(q, 4096);
    VkDeviceSize off = a ? a->offset : 0;
    be->buffer_free(q, a);
    kiln_buffer *b = be->buffer_alloc(q, 4000);
    CHECK(b && b->offset == off && b->vkbuf == a->vkbuf, "a buffer of the same class was not reused");
    be->buffer_free(q, b);

    /* past maxStorageBufferRange: refused, naming the limit */
    size_t too_big = (size_t)d->feat.max_range + 1;
    kiln_buffer *huge = be->buffer_alloc(q, too_big);
    CHECK(!huge && strstr(kiln_error(), "maxStorageBufferRange"), "a %zu-byte buffer: %s", too_big,
          huge ? "allocated" : kiln_error());
    be->sync(q);
    be->queue_close(q);
    be->close(d);
}

static void test_bad_index(const kiln_backend_iface *be)
{
    (void)be;
    kiln_device *dev = kiln_device_open("vulkan:99");
    CHECK(!dev, "vulkan:99 opened");
    CHECK(strstr(kiln_error(), "no device 99"), "message: %s", kiln_error());
    kiln_device_close(dev);
}

/* In a child (the loader reads VK_ICD_FILENAMES when it builds an instance): a driver
 * list that names nothing gives a message, not a crash. */
static void test_missing_driver(const kiln_backend_iface *be)
{
    (void)be;
    pid_t pid = fork();
    if (pid == 0) {
        setenv("VK_ICD_FILENAMES", "/nonexistent/kiln-no-such-icd.json", 1);
        setenv("VK_DRIVER_FILES", "/nonexistent/kiln-no-such-icd.json", 1);
        execl("/proc/self/exe", "test-vulkan", "--missing-driver-child", (char *)NULL);
        _exit(2);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "missing driver: status %d", status);
}

static int cache_file_valid(const char *path, const kvk_device *d)
{
    unsigned char h[32];
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    size_t n = fread(h, 1, sizeof h, f);
    fclose(f);
    uint32_t hlen, version, vendor, device;
    if (n < 32)
        return 0;
    memcpy(&hlen, h, 4);
    memcpy(&version, h + 4, 4);
    memcpy(&vendor, h + 8, 4);
    memcpy(&device, h + 12, 4);
    return hlen >= 32 && version == VK_PIPELINE_CACHE_HEADER_VERSION_ONE && vendor == d->props.vendorID &&
           device == d->props.deviceID && memcmp(h + 16, d->props.pipelineCacheUUID, VK_UUID_SIZE) == 0;
}

static int fill_and_read(kiln_device *dev, float *out)
{
    int64_t shape[1] = {1000};
    kiln_tensor *t = kiln_full(dev, KILN_F32, 1, shape, 1.5);
    if (!t)
        return -1;
    float buf[1000];
    int rc = kiln_to_data(t, buf, sizeof buf);
    kiln_tensor_release(t);
    *out = buf[999];
    return rc;
}

/* The backend itself, without the fusion decorator vulkan:0 has by default: the tests
 * that reach into its context (kiln__device_ctx) open this. */
#define RAW_VULKAN "vulkan:0?fusion=off"

static void test_pipeline_cache(const kiln_backend_iface *be)
{
    (void)be;
    char dir[] = "/tmp/kiln-vk-cacheXXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    setenv("KILN_DATA_DIR", dir, 1);
    char path[1024] = "";
    kiln_device *dev = kiln_device_open(RAW_VULKAN);
    CHECK(dev, "open: %s", kiln_error());
    if (!dev)
        return;
    float v = 0;
    CHECK(fill_and_read(dev, &v) == 0 && v == 1.5f, "fill: %s", kiln_error());
    /* the device's cache path and identity, through the internals */
    kvk_device ident;
    {
        kvk_queue *q = kiln__device_ctx(dev);
        snprintf(path, sizeof path, "%s", q->d->cache_path);
        ident.props = q->d->props;
    }
    kiln_device_close(dev);
    CHECK(strncmp(path, dir, strlen(dir)) == 0, "cache path %s is not under %s", path, dir);
    CHECK(cache_file_valid(path, &ident), "no pipeline cache written at %s", path);

    /* a corrupt file: ignored (a line on stderr), the device works, a good file replaces it */
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs("this is not a pipeline cache, whatever its name says", f);
        fclose(f);
    }
    dev = kiln_device_open(RAW_VULKAN);
    CHECK(dev, "open with a corrupt cache: %s", kiln_error());
    if (dev) {
        kvk_queue *q = kiln__device_ctx(dev);
        CHECK(!q->d->cache_loaded, "a corrupt cache was loaded");
        CHECK(fill_and_read(dev, &v) == 0 && v == 1.5f, "fill with a corrupt cache: %s", kiln_error());
        kiln_device_close(dev);
    }
    CHECK(cache_file_valid(path, &ident), "the corrupt cache was not replaced");
    dev = kiln_device_open(RAW_VULKAN);
    if (dev) {
        kvk_queue *q = kiln__device_ctx(dev);
        CHECK(q->d->cache_loaded, "the rewritten cache was not loaded");
        kiln_device_close(dev);
    }
    unlink(path);
    char sub[1100];
    snprintf(sub, sizeof sub, "%s/cache", dir);
    rmdir(sub);
    rmdir(dir);
    unsetenv("KILN_DATA_DIR");
}

/* Two queues: an upload and a fill on one, ordered for a copy on the other by an event. */
static void test_event_orders_queues(const kiln_backend_iface *be)
{
    kvk_device *d = be->open(0);
    if (!d)
        return;
    kvk_queue *q1 = be->queue_open(d), *q2 = be->queue_open(d);
    size_t n = 1 << 16;
    kiln_buffer *a = be->buffer_alloc(q1, n * 4), *b = be->buffer_alloc(q1, n * 4);
    kiln_tdesc ta = {.buf = a, .dtype = KILN_F32, .ndim = 1, .shape = {(int64_t)n}, .strides = {1}};
    kiln_tdesc tb = ta;
    tb.buf = b;
    CHECK(be->fill(q1, &ta, 7.0) == 0, "fill: %s", kiln_error());
    kiln_backend_event *ev = be->event_record(q1);
    CHECK(ev, "event_record: %s", kiln_error());
    CHECK(be->event_wait(q2, ev) == 0, "event_wait");
    CHECK(be->copy(q2, &tb, &ta) == 0, "copy: %s", kiln_error());
    float *host = malloc(n * 4);
    CHECK(be->buffer_download(q2, b, 0, host, n * 4) == 0, "download: %s", kiln_error());
    CHECK(host[0] == 7.0f && host[n - 1] == 7.0f, "copy after the event read %g, %g", host[0], host[n - 1]);
    CHECK(be->event_query(q1, ev) == 1, "event not complete after the wait");
    be->event_free(q1, ev);
    free(host);
    be->buffer_free(q1, a);
    be->buffer_free(q1, b);
    be->sync(q1);
    be->sync(q2);
    be->queue_close(q1);
    be->queue_close(q2);
    be->close(d);
}

/* index_check: nothing at the call, the first offending element (in index order) at the
 * next sync, with the op's name; the sync after is clean again. */
static void test_index_check_at_sync(const kiln_backend_iface *be)
{
    kvk_device *d = be->open(0);
    if (!d)
        return;
    kvk_queue *q = be->queue_open(d);
    int64_t idx[6] = {0, 3, 9, 2, 5, 1};
    kiln_buffer *b = be->buffer_alloc(q, sizeof idx);
    CHECK(b && be->buffer_upload(q, b, 0, idx, sizeof idx) == 0, "upload: %s", kiln_error());
    kiln_tdesc t = {.buf = b, .dtype = KILN_I64, .ndim = 1, .shape = {6}, .strides = {1}};
    CHECK(be->index_check(q, &t, 0, 4, "gather", "index") == 0, "index_check failed at the call: %s",
          kiln_error());
    CHECK(be->index_check(q, &t, -1, 10, "index_select", "index") == 0, "second check: %s", kiln_error());
    int rc = be->sync(q);
    CHECK(rc == KILN_EINVAL && strstr(kiln_error(), "gather: index 9 is out of bounds for size 4"),
          "sync after a violation: %d %s", rc, kiln_error());
    CHECK(be->sync(q) == 0, "the violation was reported twice: %s", kiln_error());
    be->buffer_free(q, b);
    be->sync(q);
    be->queue_close(q);
    be->close(d);
}

/* A lost device (as vkQueueSubmit or a wait reports it) fails every later call with a
 * message naming the device; an out-of-memory result maps to KILN_ENOMEM. */
static void test_device_lost_and_oom(const kiln_backend_iface *be)
{
    kvk_device *d = be->open(0);
    if (!d)
        return;
    kvk_queue *q = be->queue_open(d);
    CHECK(kvk_vk_error(d, "matmul", "vkAllocateMemory", VK_ERROR_OUT_OF_DEVICE_MEMORY) == KILN_ENOMEM &&
              strstr(kiln_error(), "out of device memory") && strstr(kiln_error(), "vulkan:0"),
          "oom, naming the device: %s", kiln_error());
    CHECK(!atomic_load(&d->lost), "oom marked the device lost");
    CHECK(kvk_vk_error(d, "sync", "vkWaitSemaphores", VK_ERROR_DEVICE_LOST) == KILN_EDEVICE, "lost code");
    CHECK(be->buffer_alloc(q, 64) == NULL && strstr(kiln_error(), "lost"), "alloc on a lost device: %s",
          kiln_error());
    int rc = be->sync(q);
    CHECK(rc == KILN_EDEVICE && strstr(kiln_error(), "VK_ERROR_DEVICE_LOST"), "sync on a lost device: %d %s", rc,
          kiln_error());
    kiln_tdesc t = {.buf = d->dummy, .dtype = KILN_F32, .ndim = 1, .shape = {4}, .strides = {1}};
    CHECK(be->fill(q, &t, 1.0) < 0 && strstr(kiln_error(), "lost"), "fill on a lost device: %s", kiln_error());
    be->queue_close(q);
    be->close(d);
}

/* kiln_device_list names vulkan:0 as the device opens it; kiln_device_lost names
 * negative, with a message, once the device is lost. */
static void test_list_and_health(const kiln_backend_iface *be)
{
    (void)be;
    kiln_device_info info[8];
    int n = kiln_device_list(info, 8);
    CHECK(n >= 1, "kiln_device_list: %d (%s)", n, n < 0 ? kiln_error() : "no device");
    int k = -1;
    for (int i = 0; i < n && i < 8; i++)
        if (strcmp(info[i].spec, "vulkan:0") == 0)
            k = i;
    CHECK(k >= 0, "vulkan:0 is not listed");
    kiln_device *dev = kiln_device_open(RAW_VULKAN);
    if (!dev || k < 0) {
        kiln_device_close(dev);
        return;
    }
    kvk_queue *q = kiln__device_ctx(dev);
    CHECK(strcmp(info[k].name, q->d->name) == 0, "listed name '%s', device '%s'", info[k].name, q->d->name);
    CHECK(info[k].driver[0] && info[k].memory_bytes > 0, "driver '%s', memory %llu", info[k].driver,
          (unsigned long long)info[k].memory_bytes);
    CHECK(kiln_device_lost(dev) == NULL, "a working device reported lost");
    atomic_store(&q->d->lost, true);
    const char *why = kiln_device_lost(dev);
    CHECK(why && strstr(why, "VK_ERROR_DEVICE_LOST"), "a lost device: %s", why ? why : "(NULL)");
    kiln_device_close(dev);
}

/* More dispatches than one command buffer takes (several batches, each with its own
 * parameters in the staging ring): every one lands. */
static void test_many_batches(const kiln_backend_iface *be)
{
    kvk_device *d = be->open(0);
    if (!d)
        return;
    kvk_queue *q = be->queue_open(d);
    enum {
        N = 3 * KVK_BATCH_MAX + 17
    };
    kiln_buffer *b = be->buffer_alloc(q, N * sizeof(float));
    for (int i = 0; i < N && b; i++) {
        kiln_tdesc t = {.buf = b, .offset = i, .dtype = KILN_F32, .ndim = 1, .shape = {1}, .strides = {1}};
        if (be->fill(q, &t, (double)i * 0.5) != 0) {
            CHECK(0, "fill %d: %s", i, kiln_error());
            break;
        }
    }
    float *host = malloc(N * sizeof(float));
    CHECK(b && host && be->buffer_download(q, b, 0, host, N * sizeof(float)) == 0, "download: %s", kiln_error());
    int wrong = 0;
    for (int i = 0; host && i < N; i++)
        wrong += host[i] != (float)i * 0.5f;
    CHECK(wrong == 0, "%d of %d fills missing or wrong", wrong, N);
    free(host);
    be->buffer_free(q, b);
    be->sync(q);
    be->queue_close(q);
    be->close(d);
}

/* Through the engine and the counting decorator: an index out of range costs no read at
 * the op (the check runs on the device) and is reported, with the op's name, by the next
 * read; later reads of what it spoiled fail too, new work goes on. */
static void test_engine_index_checks(const kiln_backend_iface *be)
{
    (void)be;
    kiln_device *dev = kiln_device_open("counting:vulkan:0");
    CHECK(dev, "counting:vulkan:0: %s", kiln_error());
    if (!dev)
        return;
    kiln_scope_begin();
    kiln_tensor *t = kiln_arange(dev, KILN_F32, 0, 6, 1);
    int64_t good[2] = {1, 5}, bad[2] = {1, 6};
    kiln_tensor *ig = kiln_from_data(dev, KILN_I64, 1, (int64_t[]){2}, good, sizeof good);
    kiln_tensor *ib = kiln_from_data(dev, KILN_I64, 1, (int64_t[]){2}, bad, sizeof bad);
    kiln_device_counters c0, c1;
    CHECK(kiln_device_counters_get(dev, &c0, NULL, NULL) == 0, "counters: %s", kiln_error());
    kiln_tensor *g = kiln_index_select(t, 0, ig);
    kiln_tensor *x = kiln_index_select(t, 0, ib);
    CHECK(kiln_device_counters_get(dev, &c1, NULL, NULL) == 0, "counters");
    CHECK(g && x && c1.downloads == c0.downloads, "the ops read nothing back (%llu reads)",
          (unsigned long long)(c1.downloads - c0.downloads));
    float v[2] = {0};
    CHECK(kiln_to_data(g, v, sizeof v) < 0 &&
              strstr(kiln_error(), "index_select: index 6 is out of bounds for size 6"),
          "the next read reports the violation: %s", kiln_error());
    /* g was written in the stretch the error spoiled (tests/backend-iface/test-deferred-errors.c);
     * the same op made again afterwards reads as it should */
    CHECK(kiln_to_data(g, v, sizeof v) < 0 && strstr(kiln_error(), "lost to an earlier error"),
          "a value from the failing stretch stays spoiled: %s", kiln_error());
    kiln_tensor *g2 = kiln_index_select(t, 0, ig);
    CHECK(kiln_to_data(g2, v, sizeof v) == 0 && v[0] == 1.0f && v[1] == 5.0f, "then reads go on (%g %g): %s", v[0],
          v[1], kiln_error());
    kiln_scope_end();
    kiln_device_close(dev);
}

/* The missing-driver case runs in a fresh process (the parent's driver is loaded for
 * good once a device opened), started as "test-vulkan --missing-driver-child". */
static int missing_driver_child(void)
{
    kiln_device *dev = kiln_device_open("vulkan:0");
    if (dev) {
        fprintf(stderr, "opened vulkan:0 without a driver\n");
        return 1;
    }
    const char *e = kiln_error();
    bool ok = strstr(e, "no Vulkan driver") || strstr(e, "no Vulkan device");
    if (!ok)
        fprintf(stderr, "missing driver message: %s\n", e);
    return ok ? 0 : 1;
}

/* kiln_device_memory_get on vulkan:0: tensors held count as in use, released ones as
 * cached, the same shape again is a reuse and no new device allocation. */
static void test_memory_figures(const kiln_backend_iface *be)
{
    (void)be;
    kiln_device *dev = kiln_device_open("vulkan:0");
    CHECK(dev, "open: %s", kiln_error());
    if (!dev)
        return;
    kiln_device_memory m0, m1, m2, m3;
    CHECK(kiln_device_memory_get(dev, &m0) == 0, "memory figures: %s", kiln_error());
    const int64_t shape[2] = {256, 1024}; /* 1 MiB of f32 */
    kiln_tensor *t = kiln_full(dev, KILN_F32, 2, shape, 1.0);
    CHECK(t, "full: %s", kiln_error());
    CHECK(kiln_device_memory_get(dev, &m1) == 0, "memory figures: %s", kiln_error());
    CHECK(m1.in_use_bytes >= m0.in_use_bytes + (1u << 20),
          "in use went from %llu to %llu with a 1 MiB tensor held", (unsigned long long)m0.in_use_bytes,
          (unsigned long long)m1.in_use_bytes);
    CHECK(m1.reserved_bytes >= m1.in_use_bytes && m1.peak_in_use_bytes >= m1.in_use_bytes,
          "reserved %llu and peak %llu must cover in use %llu", (unsigned long long)m1.reserved_bytes,
          (unsigned long long)m1.peak_in_use_bytes, (unsigned long long)m1.in_use_bytes);
    kiln_tensor_release(t);
    kiln_device_sync(dev);
    CHECK(kiln_device_memory_get(dev, &m2) == 0, "memory figures: %s", kiln_error());
    CHECK(m2.in_use_bytes + (1u << 20) <= m1.in_use_bytes && m2.cached_bytes >= (1u << 20),
          "after the release: in use %llu (was %llu), cached %llu", (unsigned long long)m2.in_use_bytes,
          (unsigned long long)m1.in_use_bytes, (unsigned long long)m2.cached_bytes);
    t = kiln_full(dev, KILN_F32, 2, shape, 2.0);
    CHECK(kiln_device_memory_get(dev, &m3) == 0, "memory figures: %s", kiln_error());
    CHECK(m3.reuses > m2.reuses && m3.device_allocs == m2.device_allocs,
          "the same tensor again: reuses %llu -> %llu, device allocations %llu -> %llu",
          (unsigned long long)m2.reuses, (unsigned long long)m3.reuses, (unsigned long long)m2.device_allocs,
          (unsigned long long)m3.device_allocs);
    kiln_tensor_release(t);
    kiln_device_close(dev);

    /* a decorator shows its inner device's figures; over ref, which keeps none, it says so */
    kiln_device *counted = kiln_device_open("counting:vulkan:0");
    kiln_device *counted_ref = kiln_device_open("counting:ref");
    CHECK(counted && counted_ref, "open counting devices: %s", kiln_error());
    if (counted && counted_ref) {
        t = kiln_full(counted, KILN_F32, 2, shape, 3.0);
        kiln_device_memory mc;
        CHECK(kiln_device_memory_get(counted, &mc) == 0 && mc.in_use_bytes >= (1u << 20),
              "counting:vulkan:0 memory figures: %s", kiln_error());
        CHECK(kiln_device_memory_get(counted_ref, &mc) == KILN_ENOTSUP && strstr(kiln_error(), "ref"),
              "counting:ref keeps no memory figures: %s", kiln_error());
        kiln_tensor_release(t);
    }
    kiln_device_close(counted);
    kiln_device_close(counted_ref);
}

/* vulkan:0 runs through the fusion decorator by default (where the backend generates
 * kernels) and keeps its name; fusion=off in
 * the spec or KILN_VULKAN_FUSION=off opens the backend itself, and a bad value is refused
 * naming where it came from. Results agree either way. */
static void test_default_fusion(const kiln_backend_iface *be)
{
    kiln_device *fused = kiln_device_open("vulkan:0"), *raw = kiln_device_open(RAW_VULKAN);
    CHECK(fused && raw, "open vulkan:0 and %s: %s", RAW_VULKAN, kiln_error());
    if (fused && raw) {
        /* (a build without the shader compiler generates no kernels and is not fused) */
        const kiln_backend_iface *want = be->fused_run ? kiln_backend_fused() : be;
        CHECK(kiln__device_iface(fused) == want && !strcmp(kiln_device_name(fused), "vulkan:0"),
              "vulkan:0 is fused by default where kernels are generated, and keeps its name (%s)",
              kiln_device_name(fused));
        CHECK(kiln__device_iface(raw) == be, "fusion=off opens the backend itself");
        float v[2] = {0, 0};
        kiln_device *d[2] = {fused, raw};
        for (int k = 0; k < 2; k++) {
            kiln_scope_begin();
            kiln_tensor *x = kiln_arange(d[k], KILN_F32, 0, 4096, 1);
            kiln_tensor *y = kiln_sum(kiln_gelu(kiln_add_scalar(kiln_mul_scalar(x, 1.0 / 1024), -2), false), 0,
                                      NULL, false);
            CHECK(y && kiln_to_data(y, &v[k], sizeof v[k]) == 0, "chain on device %d: %s", k, kiln_error());
            kiln_scope_end();
        }
        CHECK(fabsf(v[0] - v[1]) <= 1e-5f * fabsf(v[1]), "fused %.9g and unfused %.9g agree", (double)v[0],
              (double)v[1]);
    }
    kiln_device_close(fused);
    kiln_device_close(raw);
    setenv("KILN_VULKAN_FUSION", "off", 1); /* read at the open: vulkan:0 is closed again by now */
    kiln_device *d0 = kiln_device_open("vulkan:0");
    CHECK(d0 && kiln__device_iface(d0) == be, "KILN_VULKAN_FUSION=off opens the backend itself");
    kiln_device_close(d0);
    setenv("KILN_VULKAN_FUSION", "sometimes", 1);
    d0 = kiln_device_open("vulkan:0");
    CHECK(!d0 && strstr(kiln_error(), "KILN_VULKAN_FUSION") && strstr(kiln_error(), "sometimes"),
          "a bad KILN_VULKAN_FUSION is refused naming it: %s", d0 ? "(opened)" : kiln_error());
    kiln_device_close(d0);
    unsetenv("KILN_VULKAN_FUSION");
}

/* Sums and means of few outputs over long runs split each run among workgroups and add the
 * partial sums in a second pass (vk-reduce.c): against the cpu on contiguous, strided and
 * transposed runs, f32, f16 and f64, sum and mean, one output and several. */
static void test_split_reductions(const kiln_backend_iface *be)
{
    (void)be;
    kiln_device *gpu = kiln_device_open(RAW_VULKAN), *cpu = kiln_device_open("cpu");
    CHECK(gpu && cpu, "open %s and cpu: %s", RAW_VULKAN, kiln_error());
    if (!gpu || !cpu) {
        kiln_device_close(gpu);
        kiln_device_close(cpu);
        return;
    }
    kiln_generator g = kiln_generator_make(5);
    struct {
        const char *name;
        kiln_dtype dt;
        int ndim;
        int64_t shape[4];
        int ndims;
        int dims[3];
        bool mean, transpose;
    } cases[] = {
        {"f32 sum of [3, 100000] over dim 1", KILN_F32, 2, {3, 100000}, 1, {1}, false, false},
        {"f32 sum of everything in [1000, 1000]", KILN_F32, 2, {1000, 1000}, 2, {0, 1}, false, false},
        {"f32 mean of [32, 8, 20, 20] over 0, 2, 3 (a bias gradient)",
         KILN_F32,
         4,
         {32, 8, 20, 20},
         3,
         {0, 2, 3},
         true,
         false},
        {"f32 sum over dim 0 of a transposed [4, 50000]", KILN_F32, 2, {4, 50000}, 1, {0}, false, true},
        {"f16 mean of [2, 40000] over dim 1", KILN_F16, 2, {2, 40000}, 1, {1}, true, false},
        {"f64 sum of [5, 30000] over dim 1", KILN_F64, 2, {5, 30000}, 1, {1}, false, false},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        if (!kiln__device_caps(gpu)->dtype[cases[c].dt])
            continue;
        kiln_scope_begin();
        kiln_tensor *x_cpu = kiln_rand_normal(cpu, KILN_F32, cases[c].ndim, cases[c].shape, 0.5, 1, &g);
        x_cpu = kiln_cast(x_cpu, cases[c].dt);
        kiln_tensor *x = kiln_to_device(x_cpu, gpu);
        if (cases[c].transpose) {
            x_cpu = kiln_transpose(x_cpu, 0, 1);
            x = kiln_transpose(x, 0, 1);
        }
        kiln_tensor *(*reduce)(kiln_tensor *, int, const int *, bool) = cases[c].mean ? kiln_mean : kiln_sum;
        kiln_tensor *want = kiln_cast(reduce(kiln_cast(x_cpu, KILN_F64), cases[c].ndims, cases[c].dims, false),
                                      KILN_F64);
        kiln_tensor *got = kiln_cast(kiln_to_device(reduce(x, cases[c].ndims, cases[c].dims, false), cpu),
                                     KILN_F64);
        /* the scale of each output: its run's mean magnitude (mean) or sum of magnitudes (sum) */
        kiln_tensor *scale = reduce(kiln_abs(kiln_cast(x_cpu, KILN_F64)), cases[c].ndims, cases[c].dims, false);
        double tol = cases[c].dt == KILN_F16 ? 1e-3 : cases[c].dt == KILN_F64 ? 1e-12 : 1e-5;
        kiln_tensor *rel = got && want && scale
                               ? kiln_max(kiln_div(kiln_abs(kiln_sub(got, want)), scale), KILN_ALL_DIMS, false)
                               : NULL;
        double e = rel ? kiln_item(rel) : -1;
        CHECK(rel && e >= 0 && e < tol, "%s: relative error %g (tolerance %g): %s", cases[c].name, e, tol,
              rel ? "" : kiln_error());
        /* the partial sums are added in a fixed order: the same input gives the same bits */
        kiln_tensor *again = kiln_cast(kiln_to_device(reduce(x, cases[c].ndims, cases[c].dims, false), cpu),
                                       KILN_F64);
        kiln_tensor *diff = got && again ? kiln_max(kiln_abs(kiln_sub(got, again)), KILN_ALL_DIMS, false) : NULL;
        CHECK(diff && kiln_item(diff) == 0.0, "%s: a second run gives the same result", cases[c].name);
        kiln_scope_end();
    }
    kiln_device_close(gpu);
    kiln_device_close(cpu);
}

static int host_releases;
static void count_release(void *ud)
{
    (void)ud;
    host_releases++;
}

/* Host memory on a device that keeps its own: refused naming the device the caller opened
 * (once the fused decorator's "fused: the inner device ..." leaked through vulkan:0's
 * message), pointing at kiln_from_data, the memory left with the caller. And kiln_rand_int
 * at the edge of 2^53 draws the numbers cpu and ref draw, past it is refused alike. */
static void test_host_memory_and_rand_int(const kiln_backend_iface *be)
{
    (void)be;
    static _Alignas(64) float data[16];
    const char *specs[] = {"vulkan:0", RAW_VULKAN};
    for (int i = 0; i < 2; i++) {
        kiln_device *d = kiln_device_open(specs[i]);
        CHECK(d, "open %s: %s", specs[i], kiln_error());
        if (!d)
            continue;
        host_releases = 0;
        kiln_tensor *t = kiln_from_host_memory(d, KILN_F32, KILN_SHAPE(4, 4), data, count_release, NULL);
        const char *e = kiln_error();
        CHECK(!t && strstr(e, "from_host_memory: device vulkan:0") &&
                  strstr(e, "cannot use host memory in place") && strstr(e, "kiln_from_data") &&
                  !strstr(e, "fused") && host_releases == 0,
              "%s: host memory refused by name (%s)", specs[i], t ? "made" : e);
        kiln_tensor_release(t);
        const int64_t big = (int64_t)1 << 53;
        const int64_t ranges[][2] = {{big - 3, big}, {-big, big}, {-7, 50}};
        for (int r = 0; r < 3; r++) {
            kiln_generator g = kiln_generator_make(5);
            g.offset = 11;
            int64_t v[32];
            kiln_tensor *x = kiln_rand_int(d, KILN_I64, KILN_SHAPE(32), ranges[r][0], ranges[r][1], &g);
            CHECK(x && kiln_to_data(x, v, sizeof v) == 0, "%s rand_int range %d: %s", specs[i], r, kiln_error());
            for (int k = 0; x && k < 32; k++)
                CHECK(v[k] == kiln_rng_int(11 + (uint64_t)k, 5, ranges[r][0], ranges[r][1]),
                      "%s rand_int range %d element %d: %lld", specs[i], r, k, (long long)v[k]);
            kiln_tensor_release(x);
        }
        kiln_generator g = kiln_generator_make(5);
        CHECK(!kiln_rand_int(d, KILN_I64, KILN_SHAPE(4), big + 1, big + 3, &g) && strstr(kiln_error(), "2^53"),
              "%s: a range past 2^53 is refused (%s)", specs[i], kiln_error());
        kiln_device_close(d);
    }
}

static const struct {
    const char *name;
    void (*run)(const kiln_backend_iface *be);
} tests[] = {
    {"host-memory-rand-int", test_host_memory_and_rand_int},
    {"split-reductions", test_split_reductions},
    {"default-fusion", test_default_fusion},
    {"allocations", test_allocations_reuse_blocks},
    {"bad-index", test_bad_index},
    {"missing-driver", test_missing_driver},
    {"pipeline-cache", test_pipeline_cache},
    {"event", test_event_orders_queues},
    {"index-check", test_index_check_at_sync},
    {"lost", test_device_lost_and_oom},
    {"list-health", test_list_and_health},
    {"engine-index-checks", test_engine_index_checks},
    {"batches", test_many_batches},
    {"memory", test_memory_figures},
};

/* test-vulkan [NAME...]: every test, or the named ones. */
int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--missing-driver-child") == 0)
        return missing_driver_child();
    const kiln_backend_iface *be = kiln_backend_vulkan();
    kiln_device *probe = kiln_device_open("vulkan:0");
    if (!probe) {
        const char *e = kiln_error();
        if (strstr(e, "no Vulkan device") || strstr(e, "no Vulkan driver")) {
            printf("skipped: %s\n", e);
            return 77;
        }
        fprintf(stderr, "FAIL: vulkan:0 does not open: %s\n", e);
        return 1;
    }
    kiln_device_close(probe);
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
        bool run = argc < 2;
        for (int k = 1; k < argc; k++)
            run = run || strcmp(argv[k], tests[i].name) == 0;
        if (run)
            tests[i].run(be);
    }
    printf("test-vulkan: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
