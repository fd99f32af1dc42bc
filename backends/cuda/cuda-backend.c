/*
 * backends/cuda/cuda-backend.c — the cuda backend's device, queues, events and buffers,
 * and its interface table (kiln_backend_cuda).
 *
 * "cuda:N" opens GPU N. Without a usable GPU (no driver, no device, a device older than
 * compute capability 8.0, which the kernels are not built for) the open fails with a
 * message saying which, and every other backend keeps working. Options
 * (docs/configuration.md): tf32=off|on (default off: f32 matmul and convolution are
 * exact f32; on lets cuBLASLt and cuDNN use TF32 tensor cores), conv_workspace_mb (the
 * convolution algorithm search's scratch), profile=off|on (GPU time by entry on stderr
 * when each queue closes: cuda-profile.c).
 *
 * A HIP build of this file (KILN_CUDA_HIP, vendor-hip-host.h) drives an AMD GPU the same way
 * and keeps the device name "cuda:N" (one vendor per build: the engine knows one backend of
 * this name). It has no compute capability floor (the HIP runtime refuses a kernel that has
 * no code object for the GPU at its first launch), and refuses tf32=on: AMD GPUs have no
 * TF32, and silently computing exact f32 would misstate what the option asked for.
 *
 * Queues are CUDA streams (non-blocking, so they never order against the legacy default
 * stream). Uploads of ordinary (pageable) host memory go through pinned staging chunks
 * and return once the bytes are staged, without waiting for the device; uploads from
 * host_alloc memory are copied by DMA directly. buffer_download, sync and event_sync are
 * the only entries that wait.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-fused.h"
#include "cuda-impl.h"
#include "cuda-libs.h"

#if KILN_CUDA_HIP
#define KILN_CUDA_VENDOR "HIP (AMD GPU)"
#else
#define KILN_CUDA_VENDOR "CUDA"
#endif

/* ------------------------------------------------------------------ errors */

static bool sticky(cudaError_t e)
{
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
#if !KILN_CUDA_HIP /* HIP reports these faults as a launch failure or an illegal address */
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorDevicesUnavailable:
#endif
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorContextIsDestroyed:
    case cudaErrorCudartUnloading: return true;
    default: return false;
    }
}

int kiln__cuda_fail(kiln_cuda_device *dev, int status, const char *op)
{
    cudaError_t e = (cudaError_t)status;
    cudaGetLastError(); /* clear a non-sticky error so the next call starts clean */
    if (e == cudaErrorMemoryAllocation) {
        return kiln__error_set_code(KILN_ENOMEM, "%s on %s: out of device memory (%s)", op, dev->name,
                                    cudaGetErrorString(e));
    }
    if (sticky(e)) {
        pthread_mutex_lock(&dev->mu);
        if (!atomic_load(&dev->lost))
            snprintf(dev->lost_why, sizeof dev->lost_why, "%s: %s: %s", op, cudaGetErrorName(e),
                     cudaGetErrorString(e));
        atomic_store(&dev->lost, true);
        pthread_mutex_unlock(&dev->mu);
        return kiln__error_set_code(KILN_EDEVICE,
                                    "%s on %s: %s: %s (the device is lost: its work and memory are gone)", op,
                                    dev->name, cudaGetErrorName(e), cudaGetErrorString(e));
    }
    return kiln__error_set_code(KILN_EDEVICE, "%s on %s: %s: %s", op, dev->name, cudaGetErrorName(e),
                                cudaGetErrorString(e));
}

int kiln__cuda_lost_check(kiln_cuda_device *dev, const char *op)
{
    if (!atomic_load(&dev->lost))
        return 0;
    pthread_mutex_lock(&dev->mu);
    int rc = kiln__error_set_code(KILN_EDEVICE, "%s: device %s was lost earlier (%s)", op, dev->name,
                                  dev->lost_why);
    pthread_mutex_unlock(&dev->mu);
    return rc;
}

const char *kiln__cuda_device_lost(kiln_cuda_device *dev)
{
    return atomic_load(&dev->lost) ? dev->lost_why : NULL;
}

/* Every entry starts here: the device is made current for this thread (CUDA's current
 * device is per thread) and a lost device refuses the work. */
int kiln__cuda_enter(kiln_cuda_device *dev, const char *op)
{
    int rc = kiln__cuda_lost_check(dev, op);
    if (rc)
        return rc;
    cudaError_t e = cudaSetDevice(dev->index);
    return e == cudaSuccess ? 0 : kiln__cuda_fail(dev, e, op);
}

/* ------------------------------------------------------- allocator hooks */

static void *raw_alloc(void *ud, size_t n)
{
    kiln_cuda_device *dev = ud;
    void *p = NULL;
    /* A stream of this thread may be recording a graph: cudaMalloc is not recorded, and
     * the allocator gives the block to that graph for as long as it lives, so the call
     * is safe here; relaxed mode lets it through without invalidating the capture. */
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudaError_t e = cudaSetDevice(dev->index);
    if (e == cudaSuccess)
        e = cudaMalloc(&p, n);
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* out of memory is not sticky: clear it */
        return NULL;
    }
    return p;
}

static void raw_free(void *ud, void *ptr)
{
    kiln_cuda_device *dev = ud;
    cudaSetDevice(dev->index);
    cudaFree(ptr); /* waits for the device: queued work may still read a parked block */
}

static int order_streams(void *ud, void *from, void *to)
{
    kiln_cuda_device *dev = ud;
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) {
        e = cudaEventRecord(ev, (cudaStream_t)from);
        if (e == cudaSuccess)
            e = cudaStreamWaitEvent((cudaStream_t)to, ev, 0);
        cudaEventDestroy(ev); /* released once the recorded work completes */
    }
    if (e != cudaSuccess) {
        kiln__cuda_fail(dev, e, "buffer_alloc (ordering a reused block between queues)");
        return -1;
    }
    return 0;
}

/* --------------------------------------------------------------- the device */

#define NCHOICES(a) ((int)(sizeof a / sizeof *a))

static void *cuda_open_opts(const char *spec, int index, kiln_device_opts *o)
{
    static const char *const onoff[] = {"off", "on"};
    int tf32 = 0;
    if (kiln__device_opt_choice(o, "cuda", "tf32", onoff, NCHOICES(onoff), &tf32) < 0)
        return NULL;
    long conv_ws_mb = -1;
    if (kiln__device_opt_long(o, "cuda", "conv_workspace_mb", 0, 65536, &conv_ws_mb) < 0)
        return NULL;
    int profile = 0;
    if (kiln__device_opt_choice(o, "cuda", "profile", onoff, NCHOICES(onoff), &profile) < 0)
        return NULL;
#if KILN_CUDA_HIP
    if (tf32 == 1) {
        kiln__error_set("%s: tf32=on is not available in a HIP build (AMD GPUs have no TF32; f32 is always "
                        "exact f32)",
                        spec);
        return NULL;
    }
#endif
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();
        kiln__error_set("%s: no %s device is available (%s)", spec, KILN_CUDA_VENDOR,
                        e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports none");
        return NULL;
    }
    if (index < 0 || index >= count) {
        kiln__error_set("%s: no such device (this machine has %d %s device%s: cuda:0..cuda:%d)", spec, count,
                        KILN_CUDA_VENDOR, count == 1 ? "" : "s", count - 1);
        return NULL;
    }
    struct cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, index);
    if (e == cudaSuccess)
        e = cudaSetDevice(index);
    if (e != cudaSuccess) {
        cudaGetLastError();
        kiln__error_set("%s: cannot use the device: %s", spec, cudaGetErrorString(e));
        return NULL;
    }
#if !KILN_CUDA_HIP
    if (prop.major < 8) {
        kiln__error_set("%s (%s) has compute capability %d.%d; kiln's CUDA kernels are built for 8.0 and newer",
                        spec, prop.name, prop.major, prop.minor);
        return NULL;
    }
#endif
    kiln_cuda_device *dev = calloc(1, sizeof *dev);
    if (!dev) {
        kiln__error_set("%s: out of memory opening the device", spec);
        return NULL;
    }
    dev->index = index;
    snprintf(dev->name, sizeof dev->name, "cuda:%d", index);
    snprintf(dev->gpu, sizeof dev->gpu, "%s", prop.name);
    dev->cc_major = prop.major;
    dev->cc_minor = prop.minor;
#if KILN_CUDA_HIP
    snprintf(dev->arch, sizeof dev->arch, "%.63s", prop.gcnArchName); /* "gfx90a:sramecc+:xnack-" */
#endif
    dev->total_mem = prop.totalGlobalMem;
    dev->tf32 = tf32 == 1;
    dev->profile = profile == 1;
    /* PyTorch's cudnn.benchmark offers cuDNN as much scratch as it can allocate; a fixed
     * default keeps a small GPU usable: 1 GiB, at most an eighth of its memory */
    if (conv_ws_mb < 0) {
        size_t cap = dev->total_mem / 8;
        dev->conv_search_bytes = cap < ((size_t)1 << 30) ? cap : (size_t)1 << 30;
    } else {
        dev->conv_search_bytes = (size_t)conv_ws_mb << 20;
    }
    pthread_mutex_init(&dev->mu, NULL);
    atomic_init(&dev->lost, false);
    /* cuBLASLt and cuDNN are loaded at the first open (cuda-libs.h), so that libkiln
     * itself neither needs them nor pays their loading time */
    if (kiln__cuda_libs_load(KILN_CUDA_LIB_LT | KILN_CUDA_LIB_DNN, spec) < 0) {
        pthread_mutex_destroy(&dev->mu);
        free(dev);
        return NULL;
    }
    kiln_cuda_alloc_hooks hooks = {
        .ud = dev, .raw_alloc = raw_alloc, .raw_free = raw_free, .order = order_streams};
    kiln__cuda_alloc_init(&dev->alloc, &hooks);
    if (kiln__cuda_blas_init(dev) < 0) {
        kiln__cuda_alloc_destroy(&dev->alloc);
        pthread_mutex_destroy(&dev->mu);
        free(dev);
        return NULL;
    }
    return dev;
}

static void *cuda_open(int index)
{
    kiln_device_opts o = {0};
    if (kiln__device_opts_env("cuda", &o) < 0)
        return NULL;
    char spec[24];
    snprintf(spec, sizeof spec, "cuda:%d", index);
    return cuda_open_opts(spec, index, &o);
}

static void cuda_close(void *ctx)
{
    kiln_cuda_device *dev = ctx;
    if (!dev)
        return;
    cudaSetDevice(dev->index);
    cudaDeviceSynchronize();
    cudaGetLastError();
    kiln__cuda_dnn_device_fini(dev);
    kiln__cuda_fused_fini(dev);
    kiln__cuda_blas_fini(dev);
    kiln__cuda_alloc_destroy(&dev->alloc);
    pthread_mutex_destroy(&dev->mu);
    free(dev);
}

static void cuda_caps(void *ctx, kiln_backend_caps *out)
{
    memset(out, 0, sizeof *out);
    for (int i = 0; i < KILN_DTYPE_COUNT; i++)
        out->dtype[i] = true;
    out->async = true;
}

/* ------------------------------------------------------------------- queues */

static void *cuda_queue_open(void *ctx)
{
    kiln_cuda_device *dev = ctx;
    if (kiln__cuda_enter(dev, "queue_open") < 0)
        return NULL;
    kiln_cuda_queue *q = calloc(1, sizeof *q);
    if (!q) {
        kiln__error_set("queue_open on %s: out of memory", dev->name);
        return NULL;
    }
    q->dev = dev;
    cudaError_t e = cudaStreamCreateWithFlags(&q->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        kiln__cuda_fail(dev, e, "queue_open");
        free(q);
        return NULL;
    }
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&q->lock, &attr);
    pthread_mutexattr_destroy(&attr);
    for (int i = 0; i < KILN_CUDA_STAGES; i++) {
        e = cudaEventCreateWithFlags(&q->stage_ev[i], cudaEventDisableTiming);
        if (e != cudaSuccess) {
            kiln__cuda_fail(dev, e, "queue_open");
            for (int j = 0; j < i; j++)
                cudaEventDestroy(q->stage_ev[j]);
            cudaStreamDestroy(q->stream);
            pthread_mutex_destroy(&q->lock);
            free(q);
            return NULL;
        }
    }
    return q;
}

static void cuda_queue_close(void *vq)
{
    kiln_cuda_queue *q = vq;
    if (!q)
        return;
    kiln_cuda_device *dev = q->dev;
    cudaSetDevice(dev->index);
    if (q->recording) {
        /* closed while recording (an error path): end the capture and drop the graph */
        kiln_backend_graph *g = kiln__cuda_capture_end(q);
        kiln__cuda_graph_free(q, g);
    }
    cudaStreamSynchronize(q->stream);
    cudaGetLastError();
    kiln__cuda_prof_report(q);
    kiln__cuda_dnn_queue_fini(q);
    if (q->workspace)
        kiln__cuda_alloc_put(&dev->alloc, q->stream, q->workspace);
    while (q->retired_ws) {
        kiln_cuda_block *next = q->retired_ws->next;
        kiln__cuda_alloc_put(&dev->alloc, q->stream, q->retired_ws);
        q->retired_ws = next;
    }
    if (q->check_blk)
        kiln__cuda_alloc_put(&dev->alloc, q->stream, q->check_blk);
    kiln__cuda_alloc_forget_stream(&dev->alloc, q->stream);
    for (int i = 0; i < KILN_CUDA_STAGES; i++) {
        cudaEventDestroy(q->stage_ev[i]);
        if (q->stage[i])
            cudaFreeHost(q->stage[i]);
    }
    cudaStreamDestroy(q->stream);
    pthread_mutex_destroy(&q->lock);
    free(q);
}

/* ------------------------------------------------------------------- events */

static kiln_backend_event *cuda_event_record(void *vq)
{
    kiln_cuda_queue *q = vq;
    if (kiln__cuda_enter(q->dev, "event_record") < 0 ||
        kiln__cuda_not_recording(q, "event_record", "cannot order another queue after a recorded point") < 0)
        return NULL;
    kiln_backend_event *ev = malloc(sizeof *ev);
    if (!ev) {
        kiln__error_set("event_record on %s: out of memory", q->dev->name);
        return NULL;
    }
    cudaError_t e = cudaEventCreateWithFlags(&ev->ev, cudaEventDisableTiming);
    if (e == cudaSuccess) {
        e = cudaEventRecord(ev->ev, q->stream);
        if (e != cudaSuccess)
            cudaEventDestroy(ev->ev);
    }
    if (e != cudaSuccess) {
        kiln__cuda_fail(q->dev, e, "event_record");
        free(ev);
        return NULL;
    }
    return ev;
}

static int cuda_event_wait(void *vq, kiln_backend_event *ev)
{
    kiln_cuda_queue *q = vq;
    int rc = kiln__cuda_enter(q->dev, "event_wait");
    if (!rc)
        rc = kiln__cuda_not_recording(q, "event_wait", "cannot wait on another queue's work");
    return rc ? rc : kiln__cuda_check(q, cudaStreamWaitEvent(q->stream, ev->ev, 0), "event_wait");
}

static int cuda_event_sync(void *vq, kiln_backend_event *ev)
{
    kiln_cuda_queue *q = vq;
    int rc = kiln__cuda_enter(q->dev, "event_sync");
    if (!rc)
        rc = kiln__cuda_not_recording(q, "event_sync", "cannot wait for the device");
    if (rc)
        return rc;
    /* parked index violations stay parked for the next sync or download, which wait
     * for the whole queue; an event may mark an earlier point */
    cudaError_t e = cudaEventSynchronize(ev->ev);
    return e == cudaSuccess ? 0 : kiln__cuda_fail(q->dev, e, q->last_op ? q->last_op : "event_sync");
}

static int cuda_event_query(void *vq, kiln_backend_event *ev)
{
    kiln_cuda_queue *q = vq;
    int rc = kiln__cuda_enter(q->dev, "event_query");
    if (!rc)
        rc = kiln__cuda_not_recording(q, "event_query", "cannot query the device");
    if (rc)
        return rc;
    cudaError_t e = cudaEventQuery(ev->ev);
    if (e == cudaSuccess)
        return 1;
    if (e == cudaErrorNotReady) {
        cudaGetLastError();
        return 0;
    }
    return kiln__cuda_fail(q->dev, e, q->last_op ? q->last_op : "event_query");
}

static void cuda_event_free(void *vq, kiln_backend_event *ev)
{
    if (!ev)
        return;
    cudaEventDestroy(ev->ev);
    free(ev);
}

/* ------------------------------------------------------------------ buffers */

static kiln_buffer *cuda_buffer_alloc(void *vq, size_t nbytes)
{
    kiln_cuda_queue *q = vq;
    kiln_cuda_device *dev = q->dev;
    if (kiln__cuda_enter(dev, "buffer_alloc") < 0)
        return NULL;
    kiln_buffer *buf = malloc(sizeof *buf);
    if (!buf) {
        kiln__error_set_code(KILN_ENOMEM, "buffer_alloc on %s: out of host memory", dev->name);
        return NULL;
    }
    bool oom = false;
    buf->blk = kiln__cuda_alloc_get(&dev->alloc, q->stream, nbytes, &oom);
    if (!buf->blk) {
        free(buf);
        if (oom) {
            kiln_cuda_alloc_stats st;
            kiln__cuda_alloc_stats_get(&dev->alloc, &st);
            kiln__error_set_code(KILN_ENOMEM,
                                 "buffer_alloc on %s: out of device memory allocating %zu bytes (%zu MiB in use, "
                                 "%zu MiB on the device)",
                                 dev->name, nbytes, st.in_use_bytes >> 20, dev->total_mem >> 20);
        }
        return NULL;
    }
    buf->nbytes = nbytes;
    return buf;
}

static void cuda_buffer_free(void *vq, kiln_buffer *buf)
{
    kiln_cuda_queue *q = vq;
    if (!buf)
        return;
    kiln__cuda_alloc_put(&q->dev->alloc, q->stream, buf->blk);
    free(buf);
}

static bool pinned(const void *p)
{
    struct cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
#if KILN_CUDA_HIP && HIP_VERSION_MAJOR < 6
    return attr.memoryType == cudaMemoryTypeHost; /* the field's name before ROCm 6 */
#else
    return attr.type == cudaMemoryTypeHost;
#endif
}

static int cuda_buffer_upload(void *vq, kiln_buffer *dst, size_t dst_offset, const void *src, size_t n)
{
    kiln_cuda_queue *q = vq;
    int rc = kiln__cuda_enter(q->dev, "buffer_upload");
    if (rc || n == 0)
        return rc;
    char *d = (char *)dst->blk->ptr + dst_offset;
    if (q->recording)
        return kiln__cuda_graph_upload(q, d, src, n);
    if (pinned(src))
        return kiln__cuda_check(q, cudaMemcpyAsync(d, src, n, cudaMemcpyHostToDevice, q->stream), "buffer_upload");
    /* pageable memory: copy into a free staging chunk, then DMA from there; a chunk is
     * reused once its event says the copy out of it finished */
    for (size_t done = 0; done < n;) {
        int i = q->stage_next;
        if (!q->stage[i]) {
            cudaError_t e = cudaHostAlloc(&q->stage[i], KILN_CUDA_STAGE_BYTES, cudaHostAllocPortable);
            if (e != cudaSuccess) {
                q->stage[i] = NULL;
                return kiln__cuda_fail(q->dev, e, "buffer_upload (pinned staging memory)");
            }
        } else if (q->stage_used[i]) {
            cudaError_t e = cudaEventSynchronize(q->stage_ev[i]);
            if (e != cudaSuccess)
                return kiln__cuda_fail(q->dev, e, q->last_op ? q->last_op : "buffer_upload");
        }
        size_t len = n - done < KILN_CUDA_STAGE_BYTES ? n - done : KILN_CUDA_STAGE_BYTES;
        memcpy(q->stage[i], (const char *)src + done, len);
        cudaError_t e = cudaMemcpyAsync(d + done, q->stage[i], len, cudaMemcpyHostToDevice, q->stream);
        if (e == cudaSuccess)
            e = cudaEventRecord(q->stage_ev[i], q->stream);
        if (e != cudaSuccess)
            return kiln__cuda_fail(q->dev, e, "buffer_upload");
        q->stage_used[i] = true;
        q->stage_next = (i + 1) % KILN_CUDA_STAGES;
        done += len;
    }
    q->last_op = "buffer_upload";
    return 0;
}

/* Waits for q and reports what its work left: a fault (naming the op queued last, since
 * the device does not say which kernel faulted) or a parked index violation. */
static int wait_queue(kiln_cuda_queue *q, const char *op)
{
    cudaError_t e = cudaStreamSynchronize(q->stream);
    if (e != cudaSuccess) {
        char what[160];
        snprintf(what, sizeof what, "%s (failed in work queued before it; the last op queued was %s)", op,
                 q->last_op ? q->last_op : "none");
        return kiln__cuda_fail(q->dev, e, what);
    }
    if (q->prof)
        kiln__cuda_prof_resolve(q); /* every pending pair has completed: no further wait */
    return kiln__cuda_checks_report(q);
}

static int cuda_buffer_download(void *vq, kiln_buffer *src, size_t src_offset, void *dst, size_t n)
{
    kiln_cuda_queue *q = vq;
    int rc = kiln__cuda_enter(q->dev, "buffer_download");
    if (!rc)
        rc = kiln__cuda_not_recording(q, "buffer_download", "cannot read device data on the host");
    if (rc)
        return rc;
    if (n > 0) {
        cudaError_t e = cudaMemcpyAsync(dst, (const char *)src->blk->ptr + src_offset, n, cudaMemcpyDeviceToHost,
                                        q->stream);
        if (e != cudaSuccess)
            return kiln__cuda_fail(q->dev, e, "buffer_download");
    }
    return wait_queue(q, "buffer_download");
}

static int cuda_sync(void *vq)
{
    kiln_cuda_queue *q = vq;
    int rc = kiln__cuda_enter(q->dev, "sync");
    if (!rc)
        rc = kiln__cuda_not_recording(q, "sync", "cannot wait for the device");
    return rc ? rc : wait_queue(q, "sync");
}

static void *cuda_host_alloc(void *vq, size_t nbytes)
{
    kiln_cuda_queue *q = vq;
    if (kiln__cuda_enter(q->dev, "host_alloc") < 0 ||
        kiln__cuda_not_recording(q, "host_alloc", "cannot allocate pinned memory") < 0)
        return NULL;
    void *p = NULL;
    cudaError_t e = cudaHostAlloc(&p, nbytes ? nbytes : 1, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        kiln__cuda_fail(q->dev, e, "host_alloc (pinned host memory)");
        return NULL;
    }
    return p;
}

static void cuda_host_free(void *vq, void *ptr)
{
    if (ptr)
        cudaFreeHost(ptr);
}

static size_t cuda_buffer_trim(void *vq, size_t bytes)
{
    kiln_cuda_queue *q = vq;
    return kiln__cuda_alloc_trim(&q->dev->alloc, bytes);
}

static bool cuda_supports(void *vq, const kiln_op_query *query)
{
    bool fl = query->dtype == KILN_F32 || query->dtype == KILN_F64 || query->dtype == KILN_F16 ||
              query->dtype == KILN_BF16;
    switch (query->entry) {
    case KILN_ENTRY_MATMUL:
        return fl || query->dtype == KILN_I32 || query->dtype == KILN_I64 || query->dtype == KILN_U8;
    case KILN_ENTRY_SOFTMAX:
    case KILN_ENTRY_LAYER_NORM:
    case KILN_ENTRY_ADAM_STEP:
    case KILN_ENTRY_EPILOGUE:
    case KILN_ENTRY_POOL:
    case KILN_ENTRY_POOL_BACKWARD:
    case KILN_ENTRY_ADAPTIVE_AVG_POOL:
    case KILN_ENTRY_ADAPTIVE_AVG_POOL_BACKWARD: return fl;
    case KILN_ENTRY_CONV_FUSED:
        return query->dtype == KILN_F32 && (!query->params || kiln__cuda_conv_supports(query->params, KILN_F32));
    case KILN_ENTRY_CONV:
    case KILN_ENTRY_CONV_BACKWARD_INPUT:
    case KILN_ENTRY_CONV_BACKWARD_WEIGHT:
        /* the engine asks before it has the parameters (params NULL): the dtype decides
         * then, and the op itself checks the parameters */
        return query->params ? kiln__cuda_conv_supports(query->params, query->dtype) : fl;
    default: return true;
    }
}

/* ------------------------------------------------------------- operands */

static const size_t dtype_size[KILN_DTYPE_COUNT] = {4, 8, 2, 2, 8, 4, 1, 1};

kcu_view kiln__cuda_view(const kiln_tdesc *t)
{
    kcu_view v;
    memset(&v, 0, sizeof v);
    v.base = t->buf ? t->buf->blk->ptr : NULL;
    v.offset = t->offset;
    v.ndim = t->ndim;
    v.dtype = (int32_t)t->dtype;
    for (int d = 0; d < t->ndim; d++) {
        v.shape[d] = t->shape[d];
        v.strides[d] = t->strides[d];
    }
    return v;
}

kcu_view kiln__cuda_view_opt(const kiln_tdesc *t)
{
    if (t)
        return kiln__cuda_view(t);
    kcu_view v;
    memset(&v, 0, sizeof v);
    return v;
}

void *kiln__cuda_ptr(const kiln_tdesc *t)
{
    return (char *)t->buf->blk->ptr + (size_t)t->offset * dtype_size[t->dtype];
}

void *kiln__cuda_workspace(kiln_cuda_queue *q, const char *op)
{
    if (!q->workspace) {
        bool oom = false;
        q->workspace = kiln__cuda_alloc_get(&q->dev->alloc, q->stream, KILN_CUDA_WORKSPACE_BYTES, &oom);
        if (!q->workspace) {
            if (oom)
                kiln__error_set_code(KILN_ENOMEM, "%s on %s: out of device memory for the %zu MiB workspace", op,
                                     q->dev->name, KILN_CUDA_WORKSPACE_BYTES >> 20);
            return NULL;
        }
    }
    return q->workspace->ptr;
}

void *kiln__cuda_workspace_grow(kiln_cuda_queue *q, size_t bytes, const char *op)
{
    if (!kiln__cuda_workspace(q, op))
        return NULL;
    if (q->workspace->size >= bytes)
        return q->workspace->ptr;
    bool oom = false;
    kiln_cuda_block *blk = kiln__cuda_alloc_get(&q->dev->alloc, q->stream, bytes, &oom);
    if (!blk) {
        if (oom)
            kiln__error_set_code(KILN_ENOMEM, "%s on %s: out of device memory for a %zu MiB workspace", op,
                                 q->dev->name, bytes >> 20);
        return NULL;
    }
    kiln__cuda_workspace_adopt(q, blk);
    return blk->ptr;
}

void kiln__cuda_workspace_adopt(kiln_cuda_queue *q, kiln_cuda_block *blk)
{
    if (q->workspace) {
        /* graphs recorded on this queue may address the old block: it is kept, not freed */
        q->workspace->next = q->retired_ws;
        q->retired_ws = q->workspace;
    }
    q->workspace = blk;
}

size_t kiln__cuda_workspace_size(const kiln_cuda_queue *q)
{
    return q->workspace ? q->workspace->size : 0;
}

static int cuda_memory(void *ctx, kiln_device_memory *out)
{
    kiln_cuda_device *dev = ctx;
    kiln_cuda_alloc_stats st;
    kiln__cuda_alloc_stats_get(&dev->alloc, &st);
    *out = (kiln_device_memory){.in_use_bytes = st.in_use_bytes,
                                .cached_bytes = st.cached_bytes,
                                .reserved_bytes = st.reserved_bytes,
                                .peak_in_use_bytes = st.peak_in_use_bytes,
                                .device_allocs = st.raw_allocs,
                                .reuses = st.reuses};
    return 0;
}

static int cuda_memory_reset_peak(void *ctx)
{
    kiln_cuda_device *dev = ctx;
    kiln__cuda_alloc_reset_peak(&dev->alloc);
    return 0;
}

static const char *cuda_lost(void *ctx)
{
    return kiln__cuda_device_lost(ctx);
}

#include "cuda-serial.inc"

static const kiln_backend_iface cuda_iface = {
    .name = "cuda",
    .open = cuda_open,
    .open_opts = cuda_open_opts,
    .close = cuda_close,
    .caps = cuda_caps,
    .queue_open = cuda_queue_open,
    .queue_close = cuda_queue_close,
    .event_record = serial_cuda_event_record,
    .event_wait = serial_cuda_event_wait,
    .event_sync = serial_cuda_event_sync,
    .event_query = serial_cuda_event_query,
    .event_free = serial_cuda_event_free,
    .supports = cuda_supports,
    .buffer_alloc = cuda_buffer_alloc,
    .buffer_free = cuda_buffer_free,
    .buffer_upload = serial_cuda_buffer_upload,
    .buffer_download = serial_cuda_buffer_download,
    .sync = serial_cuda_sync,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .buffer_trim = cuda_buffer_trim,
    .fill = serial_kiln__cuda_fill,
    .arange = serial_kiln__cuda_arange,
    .copy = serial_kiln__cuda_copy,
    .rng = serial_kiln__cuda_rng,
    .unary = serial_kiln__cuda_unary,
    .binary = serial_kiln__cuda_binary,
    .where = serial_kiln__cuda_where,
    .reduce = serial_kiln__cuda_reduce,
    .arg_reduce = serial_kiln__cuda_arg_reduce,
    .cumsum = serial_kiln__cuda_cumsum,
    .sort = serial_kiln__cuda_sort,
    .index_check = serial_kiln__cuda_index_check,
    .gather = serial_kiln__cuda_gather,
    .scatter = serial_kiln__cuda_scatter,
    .index_select = serial_kiln__cuda_index_select,
    .index_add = serial_kiln__cuda_index_add,
    .matmul = serial_kiln__cuda_matmul,
    .matmul_fused = serial_kiln__cuda_matmul_fused,
    .conv = serial_kiln__cuda_conv,
    .conv_fused = serial_kiln__cuda_conv_fused,
    .conv_backward_input = serial_kiln__cuda_conv_backward_input,
    .conv_backward_weight = serial_kiln__cuda_conv_backward_weight,
    .epilogue = serial_kiln__cuda_epilogue,
    .pad = serial_kiln__cuda_pad,
    .pool = serial_kiln__cuda_pool,
    .pool_backward = serial_kiln__cuda_pool_backward,
    .adaptive_avg_pool = serial_kiln__cuda_adaptive_avg_pool,
    .adaptive_avg_pool_backward = serial_kiln__cuda_adaptive_avg_pool_backward,
    .interpolate = serial_kiln__cuda_interpolate,
    .interpolate_backward = serial_kiln__cuda_interpolate_backward,
    .softmax = serial_kiln__cuda_softmax,
    .layer_norm = serial_kiln__cuda_layer_norm,
    .adam_step = serial_kiln__cuda_adam_step,
    .memory = cuda_memory,
    .memory_reset_peak = cuda_memory_reset_peak,
    .lost = cuda_lost,
    .capture_begin = serial_kiln__cuda_capture_begin,
    .capture_end = serial_kiln__cuda_capture_end,
    .graph_launch = serial_kiln__cuda_graph_launch,
    .graph_free = serial_kiln__cuda_graph_free,
    .fused_run = serial_kiln__cuda_fused_run,
};

const kiln_backend_iface *kiln_backend_cuda(void)
{
    return &cuda_iface;
}
