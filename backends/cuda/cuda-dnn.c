/*
 * backends/cuda/cuda-dnn.c — convolutions and their gradients through cuDNN.
 *
 * Each queue has its own cuDNN handle (a handle must not be used from two threads at
 * once), bound to the queue's stream. The algorithm for a convolution is chosen once per
 * geometry (direction, dtype, shapes, stride, padding, dilation, groups, TF32 or not) by
 * timing cuDNN's candidates on the call's operands (cudnnFind*Ex, as PyTorch's
 * cudnn.benchmark) in up to conv_workspace_mb of scratch (1 GiB by default: the fastest
 * algorithms of large batches often need more than the queue's 128 MiB workspace, which then
 * grows), and kept in a device-wide cache; the heuristics decide where timing fails. A 1-d
 * convolution runs as a 2-d one over a trailing dim of size 1 (cuDNN wants four dims or more). Operands with strides cuDNN does not take (negative or zero) are
 * copied to contiguous scratch first.
 *
 * An algorithm cuDNN lists and then refuses to run (BAD_PARAM or NOT_SUPPORTED at run time) gives
 * way to the heuristics' next ones; a half-precision geometry none of them runs is computed in
 * f32 and rounded once (run_conv_f32), as the ref backend rounds.
 *
 * Math: f32 uses FMA kernels only (exact f32) unless the device was opened with tf32=on;
 * f16 and bf16 use tensor cores and accumulate in f32; f64 computes in f64.
 */
#include <cudnn.h>
#include <stdlib.h>
#include <string.h>

#include "autotune-impl.h"
#include "cuda-impl.h"
#include "cuda-libs.h"
#include "fused-codegen.h"

enum {
    DIR_FWD = 0,
    DIR_BWD_DATA,
    DIR_BWD_FILTER
};

typedef struct conv_key {
    int dir, dtype, nspatial, tf32;
    int64_t x[5], w[5], y[5];
    int64_t stride[3], pad[3], dil[3], groups;
} conv_key;

struct kiln__cuda_conv_cache {
    conv_key key;
    int algo;
    size_t ws;
    struct kiln__cuda_conv_cache *next;
};

static int dnn_fail(kiln_cuda_queue *q, cudnnStatus_t st, const char *op, const char *what)
{
    if (st == CUDNN_STATUS_ALLOC_FAILED) {
        return kiln__error_set_code(KILN_ENOMEM, "%s on %s: out of memory in cuDNN (%s)", op, q->dev->name, what);
    }
    cudaError_t e = cudaPeekAtLastError();
    if (e != cudaSuccess)
        return kiln__cuda_fail(q->dev, e, op);
    return kiln__error_set_code(KILN_EDEVICE, "%s on %s: cuDNN %s failed: %s", op, q->dev->name, what,
                                cudnnGetErrorString(st));
}

bool kiln__cuda_conv_supports(const kiln_conv_params *p, kiln_dtype dt)
{
    return p->nspatial >= 1 && p->nspatial <= 3 && p->groups >= 1 &&
           (dt == KILN_F32 || dt == KILN_F64 || dt == KILN_F16 || dt == KILN_BF16);
}

void kiln__cuda_dnn_queue_fini(kiln_cuda_queue *q)
{
    if (q->dnn)
        cudnnDestroy((cudnnHandle_t)q->dnn);
    q->dnn = NULL;
}

void kiln__cuda_dnn_device_fini(kiln_cuda_device *dev)
{
    kiln__cuda_conv_cache *c = dev->conv_cache;
    while (c) {
        kiln__cuda_conv_cache *next = c->next;
        free(c);
        c = next;
    }
    dev->conv_cache = NULL;
}

static cudnnDataType_t dnn_type(kiln_dtype dt)
{
    switch (dt) {
    case KILN_F64: return CUDNN_DATA_DOUBLE;
    case KILN_F16: return CUDNN_DATA_HALF;
    case KILN_BF16: return CUDNN_DATA_BFLOAT16;
    default: return CUDNN_DATA_FLOAT;
    }
}

/* The handle of q, made and bound to q's stream on first use. */
static cudnnHandle_t handle_of(kiln_cuda_queue *q, const char *op, int *rc)
{
    if (!q->dnn) {
        cudnnHandle_t h = NULL;
        cudnnStatus_t st = cudnnCreate(&h);
        if (st == CUDNN_STATUS_SUCCESS)
            st = cudnnSetStream(h, q->stream);
        if (st != CUDNN_STATUS_SUCCESS) {
            if (h)
                cudnnDestroy(h);
            *rc = dnn_fail(q, st, op, "starting");
            return NULL;
        }
        q->dnn = h;
    }
    return (cudnnHandle_t)q->dnn;
}

/* A descriptor's dims: shape with a trailing 1 for 1-d convolutions. */
static int dims_of(const kiln_tdesc *t, int nspatial, int *dims, int *strides)
{
    int n = 0;
    for (int d = 0; d < t->ndim; d++) {
        dims[n] = (int)t->shape[d];
        strides[n] = (int)t->strides[d];
        n++;
    }
    if (nspatial == 1) {
        dims[n] = 1;
        strides[n] = 1;
        n++;
    }
    return n;
}

typedef struct conv_call {
    kiln_cuda_queue *q;
    const char *op;
    cudnnHandle_t h;
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    kiln__cuda_operands ops; /* packed copies of strided operands */
} conv_call;

static void call_fini(conv_call *c)
{
    if (c->xd)
        cudnnDestroyTensorDescriptor(c->xd);
    if (c->yd)
        cudnnDestroyTensorDescriptor(c->yd);
    if (c->wd)
        cudnnDestroyFilterDescriptor(c->wd);
    if (c->cd)
        cudnnDestroyConvolutionDescriptor(c->cd);
    kiln__cuda_operands_release(&c->ops);
}

/* Descriptors for x [N, C, S...], w [O, C/g, K...] and y [N, O, S'...]. */
static int call_init(conv_call *c, const kiln_conv_params *p, const kiln_tdesc *x, const kiln_tdesc *w,
                     const kiln_tdesc *y)
{
    int rc = 0;
    c->h = handle_of(c->q, c->op, &rc);
    if (!c->h)
        return rc;
    kiln_dtype dt = y->dtype;
    cudnnDataType_t type = dnn_type(dt);
    cudnnDataType_t compute = dt == KILN_F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    int dims[6], strides[6], n;
    const char *what = "describing tensors";
    cudnnStatus_t st = cudnnCreateTensorDescriptor(&c->xd);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnCreateTensorDescriptor(&c->yd);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnCreateFilterDescriptor(&c->wd);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnCreateConvolutionDescriptor(&c->cd);
    if (st == CUDNN_STATUS_SUCCESS) {
        n = dims_of(x, p->nspatial, dims, strides);
        st = cudnnSetTensorNdDescriptor(c->xd, type, n, dims, strides);
    }
    if (st == CUDNN_STATUS_SUCCESS) {
        n = dims_of(y, p->nspatial, dims, strides);
        st = cudnnSetTensorNdDescriptor(c->yd, type, n, dims, strides);
    }
    if (st == CUDNN_STATUS_SUCCESS) {
        n = dims_of(w, p->nspatial, dims, strides);
        st = cudnnSetFilterNdDescriptor(c->wd, type, CUDNN_TENSOR_NCHW, n, dims);
    }
    if (st == CUDNN_STATUS_SUCCESS) {
        what = "describing the convolution";
        int ns = p->nspatial == 1 ? 2 : p->nspatial;
        int pad[3] = {0, 0, 0}, stride[3] = {1, 1, 1}, dil[3] = {1, 1, 1};
        for (int i = 0; i < p->nspatial; i++) {
            pad[i] = (int)p->padding[i];
            stride[i] = (int)p->stride[i];
            dil[i] = (int)p->dilation[i];
        }
        st = cudnnSetConvolutionNdDescriptor(c->cd, ns, pad, stride, dil, CUDNN_CROSS_CORRELATION, compute);
        if (st == CUDNN_STATUS_SUCCESS)
            st = cudnnSetConvolutionGroupCount(c->cd, (int)p->groups);
        cudnnMathType_t math = dt == KILN_F16 || dt == KILN_BF16   ? CUDNN_TENSOR_OP_MATH
                               : dt == KILN_F32 && c->q->dev->tf32 ? CUDNN_DEFAULT_MATH
                                                                   : CUDNN_FMA_MATH;
        if (st == CUDNN_STATUS_SUCCESS)
            st = cudnnSetConvolutionMathType(c->cd, math);
    }
    return st == CUDNN_STATUS_SUCCESS ? 0 : dnn_fail(c->q, st, c->op, what);
}

static conv_key key_of(int dir, const kiln_conv_params *p, const kiln_tdesc *x, const kiln_tdesc *w,
                       const kiln_tdesc *y, bool tf32)
{
    conv_key k;
    memset(&k, 0, sizeof k);
    k.dir = dir;
    k.dtype = (int)y->dtype;
    k.nspatial = p->nspatial;
    k.tf32 = tf32;
    for (int d = 0; d < x->ndim && d < 5; d++) {
        k.x[d] = x->shape[d];
        k.w[d] = w->shape[d];
        k.y[d] = y->shape[d];
    }
    for (int i = 0; i < 3; i++) {
        k.stride[i] = p->stride[i];
        k.pad[i] = p->padding[i];
        k.dil[i] = p->dilation[i];
    }
    k.groups = p->groups;
    return k;
}

/* The cached algorithm for key, or -1. */
static int cache_find(kiln_cuda_device *dev, const conv_key *key, size_t *ws)
{
    int algo = -1;
    pthread_mutex_lock(&dev->mu);
    for (kiln__cuda_conv_cache *c = dev->conv_cache; c; c = c->next) {
        if (memcmp(&c->key, key, sizeof *key) == 0) {
            algo = c->algo;
            *ws = c->ws;
            break;
        }
    }
    pthread_mutex_unlock(&dev->mu);
    return algo;
}

static void cache_add(kiln_cuda_device *dev, const conv_key *key, int algo, size_t ws)
{
    kiln__cuda_conv_cache *c = malloc(sizeof *c);
    if (!c)
        return; /* the next call chooses again */
    c->key = *key;
    c->algo = algo;
    c->ws = ws;
    pthread_mutex_lock(&dev->mu);
    c->next = dev->conv_cache;
    dev->conv_cache = c;
    pthread_mutex_unlock(&dev->mu);
}

#define MAX_ALGOS 16

/* The fastest of cuDNN's algorithms for one direction, timed on the call's own operands (as
 * PyTorch's cudnn.benchmark does): the first success in Find's list, which is sorted by time,
 * that fits ws_size bytes of scratch at ws. Writes only the direction's output, which the
 * real run overwrites. Returns -1 when Find fails or offers nothing (the heuristics decide
 * then). */
static int find_fastest(conv_call *c, int dir, void *x, void *w, void *y, void *ws, size_t ws_size,
                        size_t *ws_used)
{
    int found = 0;
    cudnnStatus_t st;
    if (dir == DIR_FWD) {
        cudnnConvolutionFwdAlgoPerf_t perf[MAX_ALGOS];
        st = cudnnFindConvolutionForwardAlgorithmEx(c->h, c->xd, x, c->wd, w, c->cd, c->yd, y, MAX_ALGOS, &found,
                                                    perf, ws, ws_size);
        for (int i = 0; st == CUDNN_STATUS_SUCCESS && i < found; i++)
            if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= ws_size) {
                *ws_used = perf[i].memory;
                return (int)perf[i].algo;
            }
    } else if (dir == DIR_BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t perf[MAX_ALGOS];
        st = cudnnFindConvolutionBackwardDataAlgorithmEx(c->h, c->wd, w, c->yd, y, c->cd, c->xd, x, MAX_ALGOS,
                                                         &found, perf, ws, ws_size);
        for (int i = 0; st == CUDNN_STATUS_SUCCESS && i < found; i++)
            if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= ws_size) {
                *ws_used = perf[i].memory;
                return (int)perf[i].algo;
            }
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[MAX_ALGOS];
        st = cudnnFindConvolutionBackwardFilterAlgorithmEx(c->h, c->xd, x, c->yd, y, c->cd, c->wd, w, MAX_ALGOS,
                                                           &found, perf, ws, ws_size);
        for (int i = 0; st == CUDNN_STATUS_SUCCESS && i < found; i++)
            if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= ws_size) {
                *ws_used = perf[i].memory;
                return (int)perf[i].algo;
            }
    }
    /* a failed Find leaves no sticky CUDA error behind it; clear the cuDNN-level one */
    (void)cudaGetLastError();
    return -1;
}

/* ------------------------------------------------ the persistent choice (autotune) */

/* The device as the autotune cache names it: the GPU, its compute capability, the driver
 * and cuDNN versions (a choice timed under one of them says nothing of another). */
static void tune_device(const kiln_cuda_device *dev, char *out, size_t len)
{
    int driver = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess)
        (void)cudaGetLastError();
    snprintf(out, len, "cuda/%.40s/sm%d%d/drv%d/cudnn%zu", dev->gpu, dev->cc_major, dev->cc_minor, driver,
             cudnnGetVersion());
}

/* The geometry as a cache key: direction, dtype, TF32, x and w shapes (y follows from
 * them), stride, padding, dilation, groups. 0 when it does not fit the cache's key length
 * (the choice then lives in this process only). */
static int tune_key(const conv_key *k, int xnd, char *out, size_t len)
{
    static const char *const dirs[] = {"fwd", "bwd_data", "bwd_filter"};
    kiln__sbuf b = {.ok = true};
    kiln__sbuf_printf(&b, "conv/%s/%s%s/x", dirs[k->dir], kiln_dtype_name((kiln_dtype)k->dtype),
                      k->tf32 ? "/tf32" : "");
    for (int d = 0; d < xnd; d++)
        kiln__sbuf_printf(&b, "%s%lld", d ? "." : "", (long long)k->x[d]);
    kiln__sbuf_printf(&b, "/w");
    for (int d = 0; d < xnd; d++)
        kiln__sbuf_printf(&b, "%s%lld", d ? "." : "", (long long)k->w[d]);
    for (int i = 0; i < k->nspatial; i++)
        kiln__sbuf_printf(&b, "%s%lld,%lld,%lld", i ? ";" : "/spd", (long long)k->stride[i], (long long)k->pad[i],
                          (long long)k->dil[i]);
    kiln__sbuf_printf(&b, "/g%lld", (long long)k->groups);
    int fits = b.ok && b.len < len;
    if (fits)
        memcpy(out, b.p, b.len + 1);
    free(b.p);
    return fits;
}

/* The workspace algo needs on c's descriptors, or false when cuDNN refuses it there (a
 * stored choice from a file that no longer fits: it is timed again). */
static bool algo_fits(conv_call *c, int dir, int algo, size_t *ws)
{
    cudnnStatus_t st;
    if (dir == DIR_FWD)
        st = cudnnGetConvolutionForwardWorkspaceSize(c->h, c->xd, c->wd, c->cd, c->yd,
                                                     (cudnnConvolutionFwdAlgo_t)algo, ws);
    else if (dir == DIR_BWD_DATA)
        st = cudnnGetConvolutionBackwardDataWorkspaceSize(c->h, c->wd, c->yd, c->cd, c->xd,
                                                          (cudnnConvolutionBwdDataAlgo_t)algo, ws);
    else
        st = cudnnGetConvolutionBackwardFilterWorkspaceSize(c->h, c->xd, c->yd, c->cd, c->wd,
                                                            (cudnnConvolutionBwdFilterAlgo_t)algo, ws);
    (void)cudaGetLastError();
    return st == CUDNN_STATUS_SUCCESS;
}

/* Times the candidates (find_fastest) in as much scratch as the device option
 * conv_workspace_mb allows: a block of that size taken for the search, which becomes the
 * queue's workspace when the winner needs more than the workspace has, and goes back to the
 * allocator otherwise. Without that much free memory the search runs in the workspace. */
static int search(conv_call *c, int dir, void *x, void *w, void *y, size_t *ws_used)
{
    kiln_cuda_queue *q = c->q;
    size_t have = kiln__cuda_workspace_size(q);
    if (q->dev->conv_search_bytes <= have)
        return find_fastest(c, dir, x, w, y, q->workspace->ptr, have, ws_used);
    bool oom = false;
    kiln_cuda_block *blk = kiln__cuda_alloc_get(&q->dev->alloc, q->stream, q->dev->conv_search_bytes, &oom);
    if (!blk) {
        (void)cudaGetLastError();
        return find_fastest(c, dir, x, w, y, q->workspace->ptr, have, ws_used);
    }
    int algo = find_fastest(c, dir, x, w, y, blk->ptr, blk->size, ws_used);
    if (algo >= 0 && *ws_used > have)
        kiln__cuda_workspace_adopt(q, blk);
    else
        kiln__cuda_alloc_put(&q->dev->alloc, q->stream, blk);
    return algo;
}

/* cuDNN's heuristics' list for one direction, best first: the algorithms it says run on c's
 * descriptors, with the workspace each needs. */
static cudnnStatus_t heuristic_algos(conv_call *c, int dir, int *algos, size_t *wss, int *n)
{
    int found = 0;
    cudnnStatus_t st;
    *n = 0;
    if (dir == DIR_FWD) {
        cudnnConvolutionFwdAlgoPerf_t perf[MAX_ALGOS];
        st = cudnnGetConvolutionForwardAlgorithm_v7(c->h, c->xd, c->wd, c->cd, c->yd, MAX_ALGOS, &found, perf);
        for (int i = 0; st == CUDNN_STATUS_SUCCESS && i < found; i++)
            if (perf[i].status == CUDNN_STATUS_SUCCESS) {
                algos[*n] = (int)perf[i].algo;
                wss[(*n)++] = perf[i].memory;
            }
    } else if (dir == DIR_BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t perf[MAX_ALGOS];
        st = cudnnGetConvolutionBackwardDataAlgorithm_v7(c->h, c->wd, c->yd, c->cd, c->xd, MAX_ALGOS, &found,
                                                         perf);
        for (int i = 0; st == CUDNN_STATUS_SUCCESS && i < found; i++)
            if (perf[i].status == CUDNN_STATUS_SUCCESS) {
                algos[*n] = (int)perf[i].algo;
                wss[(*n)++] = perf[i].memory;
            }
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[MAX_ALGOS];
        st = cudnnGetConvolutionBackwardFilterAlgorithm_v7(c->h, c->xd, c->yd, c->cd, c->wd, MAX_ALGOS, &found,
                                                           perf);
        for (int i = 0; st == CUDNN_STATUS_SUCCESS && i < found; i++)
            if (perf[i].status == CUDNN_STATUS_SUCCESS) {
                algos[*n] = (int)perf[i].algo;
                wss[(*n)++] = perf[i].memory;
            }
    }
    return st;
}

/* Chooses the algorithm of one direction for a geometry the device's cache lacks: timed once (search),
 * else (while the queue records a graph, which a search's synchronization would break, or
 * when the search fails) the heuristics' first choice whose workspace fits the queue's. The
 * chosen algorithm may need more than the queue's workspace holds (another queue's search
 * chose it): the caller grows it. */
static int choose(conv_call *c, int dir, const conv_key *key, void *x, void *w, void *y, int *algo,
                  size_t *ws_bytes)
{
    /* a choice timed by an earlier process on this GPU, driver and cuDNN (the autotune
     * file in the data directory): value = workspace bytes << 8 | (algorithm + 1) */
    char tdev[96], tkey[96];
    bool keyed = key->nspatial >= 1 && tune_key(key, key->nspatial + 2, tkey, sizeof tkey);
    if (keyed)
        tune_device(c->q->dev, tdev, sizeof tdev);
    int64_t stored = 0;
    if (keyed && kiln__autotune_lookup(tdev, tkey, &stored) && stored > 0 && (stored & 0xff) >= 1 &&
        (stored & 0xff) <= MAX_ALGOS && algo_fits(c, dir, (int)(stored & 0xff) - 1, ws_bytes)) {
        *algo = (int)(stored & 0xff) - 1;
        cache_add(c->q->dev, key, *algo, *ws_bytes);
        return 0;
    }
    if (!c->q->recording && (*algo = search(c, dir, x, w, y, ws_bytes)) >= 0) {
        if (keyed)
            kiln__autotune_store(tdev, tkey, (int64_t)*ws_bytes << 8 | (*algo + 1));
        cache_add(c->q->dev, key, *algo, *ws_bytes);
        return 0;
    }
    int algos[MAX_ALGOS], n = 0;
    size_t wss[MAX_ALGOS];
    cudnnStatus_t st = heuristic_algos(c, dir, algos, wss, &n);
    *algo = -1;
    for (int i = 0; i < n && *algo < 0; i++)
        if (wss[i] <= kiln__cuda_workspace_size(c->q)) {
            *algo = algos[i];
            *ws_bytes = wss[i];
        }
    if (st != CUDNN_STATUS_SUCCESS)
        return dnn_fail(c->q, st, c->op, "choosing an algorithm");
    if (*algo < 0) {
        kiln__error_set("%s on %s: cuDNN offers no algorithm for this convolution within a %zu MiB workspace",
                        c->op, c->q->dev->name, kiln__cuda_workspace_size(c->q) >> 20);
        return KILN_ENOTSUP;
    }
    cache_add(c->q->dev, key, *algo, *ws_bytes);
    return 0;
}

/* A cache entry's algorithm for a geometry no cuDNN algorithm runs in its own half precision:
 * the convolution is computed in f32 (run_conv_f32). */
#define ALGO_VIA_F32 1000

/* One run of algo with ws_bytes of scratch at ws. */
static cudnnStatus_t run_algo(conv_call *c, int dir, int algo, void *ws, size_t ws_bytes, const kiln_tdesc *x,
                              const kiln_tdesc *w, const kiln_tdesc *y)
{
    float one_f = 1, zero_f = 0;
    double one_d = 1, zero_d = 0;
    bool f64 = y->dtype == KILN_F64;
    const void *one = f64 ? (const void *)&one_d : (const void *)&one_f;
    const void *zero = f64 ? (const void *)&zero_d : (const void *)&zero_f;
    if (dir == DIR_FWD)
        return cudnnConvolutionForward(c->h, one, c->xd, kiln__cuda_ptr(x), c->wd, kiln__cuda_ptr(w), c->cd,
                                       (cudnnConvolutionFwdAlgo_t)algo, ws, ws_bytes, zero, c->yd,
                                       kiln__cuda_ptr(y));
    if (dir == DIR_BWD_DATA)
        return cudnnConvolutionBackwardData(c->h, one, c->wd, kiln__cuda_ptr(w), c->yd, kiln__cuda_ptr(y), c->cd,
                                            (cudnnConvolutionBwdDataAlgo_t)algo, ws, ws_bytes, zero, c->xd,
                                            kiln__cuda_ptr(x));
    return cudnnConvolutionBackwardFilter(c->h, one, c->xd, kiln__cuda_ptr(x), c->yd, kiln__cuda_ptr(y), c->cd,
                                          (cudnnConvolutionBwdFilterAlgo_t)algo, ws, ws_bytes, zero, c->wd,
                                          kiln__cuda_ptr(w));
}

/* cuDNN may list an algorithm for a geometry, time it in Find, and then refuse to run it
 * (seen: bf16 1-d backward data with stride 2, CUDNN_STATUS_BAD_PARAM, cuDNN 9 on Hopper).
 * The heuristics' other algorithms are tried in turn; the first that runs becomes the
 * geometry's choice. Returns the last status; *algo is the one that ran. */
static cudnnStatus_t run_another(conv_call *c, int dir, const conv_key *key, int *algo, const kiln_tdesc *x,
                                 const kiln_tdesc *w, const kiln_tdesc *y, cudnnStatus_t st)
{
    int algos[MAX_ALGOS], n = 0;
    size_t wss[MAX_ALGOS];
    if (heuristic_algos(c, dir, algos, wss, &n) != CUDNN_STATUS_SUCCESS)
        return st;
    int failed = *algo;
    for (int i = 0; i < n; i++) {
        if (algos[i] == failed)
            continue;
        void *ws = kiln__cuda_workspace_grow(c->q, wss[i], c->op);
        if (!ws)
            return CUDNN_STATUS_ALLOC_FAILED;
        st = run_algo(c, dir, algos[i], ws, wss[i], x, w, y);
        (void)cudaGetLastError(); /* a refusal leaves no sticky error; clear any cuDNN-level one */
        if (st == CUDNN_STATUS_SUCCESS) {
            *algo = algos[i];
            cache_add(c->q->dev, key, algos[i], wss[i]);
            return st;
        }
    }
    return st;
}

static int run_conv(void *vq, int dir, const char *op, const kiln_conv_params *p, const kiln_tdesc *x,
                    const kiln_tdesc *w, const kiln_tdesc *y, const kiln_tdesc *bias);

/* The convolution of a half-precision geometry that no cuDNN algorithm runs, computed in f32:
 * f32 copies of the read operands, an f32 result rounded once into the written operand (the
 * ref backend's rounding: compute in f32, round on store). */
static int run_conv_f32(kiln_cuda_queue *q, int dir, const char *op, const kiln_conv_params *p,
                        const kiln_tdesc *x, const kiln_tdesc *w, const kiln_tdesc *y)
{
    kiln__cuda_operands ops = {.q = q, .op = op};
    const kiln_tdesc *x32 = NULL, *w32 = NULL, *y32 = NULL;
    int rc = kiln__cuda_operand_as(&ops, x, KILN_F32, dir != DIR_BWD_DATA, &x32);
    if (!rc)
        rc = kiln__cuda_operand_as(&ops, w, KILN_F32, dir != DIR_BWD_FILTER, &w32);
    if (!rc)
        rc = kiln__cuda_operand_as(&ops, y, KILN_F32, dir != DIR_FWD, &y32);
    if (!rc)
        rc = run_conv(q, dir, op, p, x32, w32, y32, NULL);
    if (!rc) {
        const kiln_tdesc *to = dir == DIR_FWD ? y : dir == DIR_BWD_DATA ? x : w;
        const kiln_tdesc *from = dir == DIR_FWD ? y32 : dir == DIR_BWD_DATA ? x32 : w32;
        kcu_view tv = kiln__cuda_view(to), fv = kiln__cuda_view(from);
        rc = kiln__cuda_check(q, kcu_copy(q->stream, &tv, &fv), op);
    }
    kiln__cuda_operands_release(&ops);
    return rc;
}

/* The one routine behind the three entries: dir says which operand is written. */
static int run_conv(void *vq, int dir, const char *op, const kiln_conv_params *p, const kiln_tdesc *x,
                    const kiln_tdesc *w, const kiln_tdesc *y, const kiln_tdesc *bias)
{
    kiln_cuda_queue *q = vq;
    int rc = kiln__cuda_enter(q->dev, op);
    if (rc)
        return rc;
    if (!kiln__cuda_conv_supports(p, y->dtype))
        return kiln__error_set("%s on %s: %d-d convolutions of dtype %d are not supported (f32, f64, f16 and "
                               "bf16 over 1 to 3 spatial dims are)",
                               op, q->dev->name, p->nspatial, (int)y->dtype),
               KILN_ENOTSUP;
    bool half = y->dtype == KILN_F16 || y->dtype == KILN_BF16;
    conv_key key = key_of(dir, p, x, w, y, q->dev->tf32);
    size_t ws_bytes = 0;
    int algo = cache_find(q->dev, &key, &ws_bytes);
    if (algo == ALGO_VIA_F32) {
        rc = run_conv_f32(q, dir, op, p, x, w, y);
        return !rc && bias ? kiln__cuda_conv_add_bias(q, y, bias, op) : rc;
    }
    conv_call c;
    memset(&c, 0, sizeof c);
    c.q = q;
    c.op = op;
    c.ops = (kiln__cuda_operands){.q = q, .op = op};
    /* the written operand is fresh and contiguous; the read ones may be views */
    const kiln_tdesc *xc = x, *wc = w, *yc = y;
    if (dir != DIR_BWD_DATA)
        rc = kiln__cuda_operand_packed(&c.ops, x, &xc);
    if (!rc && dir != DIR_BWD_FILTER)
        rc = kiln__cuda_operand_packed(&c.ops, w, &wc);
    if (!rc && dir != DIR_FWD)
        rc = kiln__cuda_operand_packed(&c.ops, y, &yc);
    if (!rc)
        rc = call_init(&c, p, xc, wc, yc);
    /* the queue's workspace: made once, kept; the algorithm search times candidates in it
     * (or in a larger block that then becomes it), and the chosen algorithm may want it
     * larger still (another queue's search chose it) */
    void *ws = NULL;
    if (!rc && !kiln__cuda_workspace(q, op))
        rc = KILN_ENOMEM;
    if (!rc && algo < 0)
        rc = choose(&c, dir, &key, kiln__cuda_ptr(xc), kiln__cuda_ptr(wc), kiln__cuda_ptr(yc), &algo, &ws_bytes);
    if (!rc && !(ws = kiln__cuda_workspace_grow(q, ws_bytes, op)))
        rc = KILN_ENOMEM;
    bool via_f32 = false;
    if (!rc) {
        cudnnStatus_t st = run_algo(&c, dir, algo, ws, ws_bytes, xc, wc, yc);
        if (st == CUDNN_STATUS_BAD_PARAM || st == CUDNN_STATUS_NOT_SUPPORTED) {
            (void)cudaGetLastError();
            st = run_another(&c, dir, &key, &algo, xc, wc, yc, st);
            via_f32 = half && (st == CUDNN_STATUS_BAD_PARAM || st == CUDNN_STATUS_NOT_SUPPORTED);
        }
        if (via_f32)
            cache_add(q->dev, &key, ALGO_VIA_F32, 0);
        else if (st != CUDNN_STATUS_SUCCESS)
            rc = dnn_fail(q, st, op, "running the convolution");
        q->last_op = op;
    }
    call_fini(&c);
    if (via_f32)
        rc = run_conv_f32(q, dir, op, p, x, w, y);
    if (!rc && bias)
        rc = kiln__cuda_conv_add_bias(q, y, bias, op);
    return rc;
}

int kiln__cuda_conv(void *q, const kiln_conv_params *p, const kiln_tdesc *out, const kiln_tdesc *x,
                    const kiln_tdesc *w, const kiln_tdesc *bias)
{
    return run_conv(q, DIR_FWD, "conv", p, x, w, out, bias);
}

int kiln__cuda_conv_backward_input(void *q, const kiln_conv_params *p, const kiln_tdesc *grad_x,
                                   const kiln_tdesc *grad_out, const kiln_tdesc *w)
{
    return run_conv(q, DIR_BWD_DATA, "conv_backward_input", p, grad_x, w, grad_out, NULL);
}

int kiln__cuda_conv_backward_weight(void *q, const kiln_conv_params *p, const kiln_tdesc *grad_w,
                                    const kiln_tdesc *x, const kiln_tdesc *grad_out)
{
    return run_conv(q, DIR_BWD_FILTER, "conv_backward_weight", p, x, grad_w, grad_out, NULL);
}
