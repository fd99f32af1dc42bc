/*
 * backends/cuda/cuda-graph.c — recording a queue's work as a CUDA graph and launching it
 * again (backend.h, "graphs").
 *
 * capture_begin starts stream capture on the queue's stream (thread-local mode: an
 * unsafe runtime call from this thread invalidates the capture instead of another
 * thread's) and points the allocator at the graph's own pool (cuda-alloc.h, "Graphs"),
 * so every buffer the recorded kernels address stays the graph's until graph_free.
 * Entries that cannot be recorded (waits, orderings between queues) refuse while the
 * stream records and mark the recording broken; capture_end always ends the capture and,
 * when nothing broke it, instantiates the graph. A graph is launched only on the queue
 * that recorded it: the queue's workspace is addressed by the recorded kernels.
 *
 * An upload while recording copies its host bytes into pinned memory the graph keeps and
 * records the copy from there: every launch uploads the bytes the recording saw (the
 * shape tensors and constants an executor makes from host data its input shapes decide).
 * Pinned memory and device memory taken while recording are allocated with the thread's
 * capture mode relaxed for that call: neither is recorded, and both live with the graph.
 *
 * Index checks recorded in a graph write to the graph's own slots (zeroed by the graph
 * itself before its first check, at every launch). A launch puts the graph on the queue's
 * pending list, and the queue's next report (sync, download) reads its slots with its own:
 * an out-of-range index inside a launched graph is reported exactly as outside one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-impl.h"

int kiln__cuda_refuse_recording(kiln_cuda_queue *q, const char *op, const char *why)
{
    if (!q->broken[0])
        snprintf(q->broken, sizeof q->broken, "%s %s", op, why);
    kiln__error_set("%s on %s: %s while the queue records a graph", op, q->dev->name, why);
    return KILN_ENOTSUP;
}

/* n bytes of pinned memory kept by g (16-byte aligned), or NULL. */
static void *graph_host(kiln_backend_graph *g, size_t n)
{
    size_t at = (g->host_used + 15) & ~(size_t)15;
    if (g->nhost && at + n <= g->host_size) {
        g->host_used = at + n;
        return (char *)g->host[g->nhost - 1] + at;
    }
    if (g->nhost == g->host_cap) {
        int cap = g->host_cap ? 2 * g->host_cap : 8;
        void **h = realloc(g->host, (size_t)cap * sizeof *h);
        if (!h)
            return NULL;
        g->host = h;
        g->host_cap = cap;
    }
    size_t size = n > KILN_CUDA_GRAPH_HOST_CHUNK ? n : KILN_CUDA_GRAPH_HOST_CHUNK;
    void *p = NULL;
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudaError_t e = cudaHostAlloc(&p, size, cudaHostAllocPortable);
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    g->host[g->nhost++] = p;
    g->host_size = size;
    g->host_used = n;
    return p;
}

/* Frees what g holds on the host and gives its pool back (nothing of it is queued). */
static void graph_destroy(kiln_cuda_queue *q, kiln_backend_graph *g)
{
    for (int i = 0; i < g->nhost; i++)
        cudaFreeHost(g->host[i]);
    free(g->host);
    kiln__cuda_alloc_pool_release(&q->dev->alloc, &g->pool);
    free(g);
}

int kiln__cuda_graph_upload(kiln_cuda_queue *q, void *dst, const void *src, size_t n)
{
    void *h = graph_host(q->recording, n);
    if (!h)
        return kiln__cuda_refuse_recording(q, "buffer_upload", "cannot get pinned memory for recorded host data");
    memcpy(h, src, n);
    return kiln__cuda_check(q, cudaMemcpyAsync(dst, h, n, cudaMemcpyHostToDevice, q->stream), "buffer_upload");
}

int kiln__cuda_graph_index_check(kiln_cuda_queue *q, const kiln_tdesc *index, int64_t lo, int64_t hi,
                                 const char *op, const char *noun)
{
    kiln_backend_graph *g = q->recording;
    if (g->nchecks == KILN_CUDA_CHECK_SLOTS)
        return kiln__cuda_refuse_recording(q, op, "cannot record more index checks in one graph");
    if (!g->check_blk) {
        /* taken while recording: the graph's own; the memset is recorded with the rest */
        bool oom = false;
        size_t bytes = KILN_CUDA_CHECK_SLOTS * sizeof(kcu_index_flag);
        g->check_blk = kiln__cuda_alloc_get(&q->dev->alloc, q->stream, bytes, &oom);
        if (!g->check_blk)
            return oom ? kiln__error_set_code(KILN_ENOMEM, "%s on %s: out of device memory for index checks", op,
                                              q->dev->name)
                       : KILN_EDEVICE;
        int rc = kiln__cuda_check(q, cudaMemsetAsync(g->check_blk->ptr, 0, bytes, q->stream), "index_check");
        if (rc)
            return rc;
    }
    int slot = g->nchecks++;
    g->checks[slot] = (kiln_cuda_check_slot){.op = op, .noun = noun, .lo = lo, .hi = hi};
    kcu_view v = kiln__cuda_view(index);
    kcu_index_flag *flags = g->check_blk->ptr;
    return kiln__cuda_check(q, kcu_index_check(q->stream, &v, lo, hi, flags + slot), op);
}

int kiln__cuda_capture_begin(void *vq)
{
    kiln_cuda_queue *q = vq;
    int rc = kiln__cuda_enter(q->dev, "capture_begin");
    if (rc)
        return rc;
    if (q->recording) {
        kiln__error_set("capture_begin on %s: the queue already records a graph", q->dev->name);
        return KILN_EINVAL;
    }
    kiln_backend_graph *g = calloc(1, sizeof *g);
    if (!g) {
        return kiln__error_set_code(KILN_ENOMEM, "capture_begin on %s: out of memory", q->dev->name);
    }
    g->q = q;
    if (kiln__cuda_alloc_capture_begin(&q->dev->alloc, &g->pool, q->stream) < 0) {
        free(g);
        kiln__error_set("capture_begin on %s: the queue's stream already records", q->dev->name);
        return KILN_EINVAL;
    }
    cudaError_t e = cudaStreamBeginCapture(q->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        kiln__cuda_alloc_pool_release(&q->dev->alloc, &g->pool);
        free(g);
        return kiln__cuda_fail(q->dev, e, "capture_begin");
    }
    q->recording = g;
    q->broken[0] = 0;
    return 0;
}

kiln_backend_graph *kiln__cuda_capture_end(void *vq)
{
    kiln_cuda_queue *q = vq;
    kiln_backend_graph *g = q->recording;
    if (!g) {
        kiln__error_set("capture_end on %s: the queue does not record a graph", q->dev->name);
        return NULL;
    }
    cudaSetDevice(q->dev->index);
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(q->stream, &graph);
    q->recording = NULL;
    kiln__cuda_alloc_capture_end(&q->dev->alloc, &g->pool);
    if (q->broken[0] || e != cudaSuccess || !graph) {
        char why[256];
        if (q->broken[0])
            snprintf(why, sizeof why, "%s", q->broken);
        else
            snprintf(why, sizeof why, "%s: %s", e != cudaSuccess ? cudaGetErrorName(e) : "no graph",
                     e != cudaSuccess ? cudaGetErrorString(e) : "the capture returned none");
        cudaGetLastError(); /* an invalidated capture is not a device fault */
        if (graph)
            cudaGraphDestroy(graph);
        /* nothing recorded ran, and nothing will: the pool's blocks are free now */
        graph_destroy(q, g);
        kiln__error_set("capture_end on %s: the recording broke: %s", q->dev->name, why);
        return NULL;
    }
    e = cudaGraphInstantiate(&g->exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        graph_destroy(q, g);
        kiln__cuda_fail(q->dev, e, "capture_end (instantiating the graph)");
        return NULL;
    }
    return g;
}

int kiln__cuda_graph_launch(void *vq, kiln_backend_graph *g)
{
    kiln_cuda_queue *q = vq;
    int rc = kiln__cuda_enter(q->dev, "graph_launch");
    if (rc)
        return rc;
    if (!g || g->q != q) {
        kiln__error_set("graph_launch on %s: a graph runs on the queue that recorded it", q->dev->name);
        return KILN_ENOTSUP;
    }
    if (q->recording)
        return kiln__cuda_refuse_recording(q, "graph_launch", "cannot launch a graph");
    if (g->nchecks && (g->pending || q->npending == KILN_CUDA_PENDING_GRAPHS)) {
        /* the launch would overwrite checks nobody read yet: read them first (a wait) */
        rc = kiln__cuda_checks_report(q);
        if (rc)
            return rc;
    }
    rc = kiln__cuda_check(q, cudaGraphLaunch(g->exec, q->stream), "graph_launch");
    if (rc == 0 && g->nchecks) {
        g->pending = true;
        q->pending[q->npending++] = g;
    }
    return rc;
}

void kiln__cuda_graph_free(void *vq, kiln_backend_graph *g)
{
    (void)vq;
    if (!g)
        return;
    kiln_cuda_queue *q = g->q;
    cudaSetDevice(q->dev->index);
    /* launches still queued read the graph and its blocks: let them finish first (a
     * graph is freed when its model or plan goes, not on the hot path) */
    cudaStreamSynchronize(q->stream);
    cudaGetLastError();
    if (g->pending) {
        /* its last launch's checks were not read yet: keep a violation for the report */
        kcu_index_flag flags[KILN_CUDA_CHECK_SLOTS];
        size_t bytes = (size_t)g->nchecks * sizeof *flags;
        if (cudaMemcpy(flags, g->check_blk->ptr, bytes, cudaMemcpyDeviceToHost) == cudaSuccess)
            for (int i = 0; i < g->nchecks && !q->kept; i++)
                if (flags[i].flag) {
                    q->kept = true;
                    q->kept_check = g->checks[i];
                    q->kept_value = flags[i].value;
                }
        cudaGetLastError();
        int j = 0;
        for (int i = 0; i < q->npending; i++)
            if (q->pending[i] != g)
                q->pending[j++] = q->pending[i];
        q->npending = j;
    }
    cudaGraphExecDestroy(g->exec);
    graph_destroy(q, g);
}
