/*
 * backends/cuda/hip-miopen.c — convolutions and their gradients through MIOpen: the HIP
 * build's implementation of the convolution entries cuda-dnn.c implements with cuDNN
 * (cuda-impl.h, "cuda-dnn.c" section).
 *
 * MIOpen's API is shaped differently from cuDNN's, hence a file of its own rather than a
 * mapping: filters are plain tensor descriptors, a convolution descriptor is initialised
 * once with its mode, there is no math-type switch, and an algorithm is chosen only by
 * Find (MIOpen times its candidates on the call's operands; it has no heuristic query in
 * this API). As in cuda-dnn.c, each queue has its own handle bound to its stream, and Find
 * runs once per geometry (direction, dtype, shapes, stride, padding, dilation, groups)
 * within the queue's workspace, its choice kept in the device's cache
 * (kiln_cuda_device.conv_cache) for every later call. MIOpen documents a Find result as
 * reusable within the lifetime of the handle that found it, so the cache is keyed by the
 * handle as well: a second queue runs Find once for the same geometry (MIOpen's own find
 * database answers it without timing again), and a queue's entries go with its handle.
 *
 * A 1-d convolution runs as a 2-d one over a trailing dim of size 1; operands with strides
 * MIOpen does not take (not packed) are copied to contiguous scratch first. f32, f16 and
 * bf16 are offered (f16 and bf16 accumulate in f32); MIOpen does not convolve f64, so
 * supports() says no for it and the engine reports it.
 *
 * Never run: no AMD GPU was available where this was written; the `hip` build check
 * compiles and links it against vendor-hip-libs.h's declarations.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda-impl.h"
#include "cuda-libs.h"

enum {
    DIR_FWD = 0,
    DIR_BWD_DATA,
    DIR_BWD_WEIGHTS
};

/* Everything that makes MIOpen choose differently: the cache is searched by this. */
typedef struct conv_key {
    uintptr_t handle; /* the queue's MIOpen handle: a Find result is valid for it alone */
    int dir, dtype, nspatial;
    int64_t x[5], w[5], y[5];
    int64_t stride[3], pad[3], dil[3], groups;
} conv_key;

struct kiln__cuda_conv_cache {
    conv_key key;
    int algo;
    size_t ws;
    struct kiln__cuda_conv_cache *next;
};

static int miopen_fail(kiln_cuda_queue *q, miopenStatus_t st, const char *op, const char *what)
{
    if (st == miopenStatusAllocFailed) {
        return kiln__error_set_code(KILN_ENOMEM, "%s on %s: out of memory in MIOpen (%s)", op, q->dev->name, what);
    }
    /* a failed launch inside MIOpen leaves its cause with the runtime */
    cudaError_t e = cudaPeekAtLastError();
    if (e != cudaSuccess)
        return kiln__cuda_fail(q->dev, e, op);
    return kiln__error_set_code(KILN_EDEVICE, "%s on %s: MIOpen %s failed: %s", op, q->dev->name, what,
                                miopenGetErrorString(st));
}

bool kiln__cuda_conv_supports(const kiln_conv_params *p, kiln_dtype dt)
{
    return p->nspatial >= 1 && p->nspatial <= 3 && p->groups >= 1 &&
           (dt == KILN_F32 || dt == KILN_F16 || dt == KILN_BF16);
}

void kiln__cuda_dnn_queue_fini(kiln_cuda_queue *q)
{
    if (!q->dnn)
        return;
    /* the handle's entries go first: a later handle may be given the same address */
    kiln_cuda_device *dev = q->dev;
    pthread_mutex_lock(&dev->mu);
    for (kiln__cuda_conv_cache **at = &dev->conv_cache; *at;) {
        kiln__cuda_conv_cache *c = *at;
        if (c->key.handle == (uintptr_t)q->dnn) {
            *at = c->next;
            free(c);
        } else {
            at = &c->next;
        }
    }
    pthread_mutex_unlock(&dev->mu);
    miopenDestroy((miopenHandle_t)q->dnn);
    q->dnn = NULL;
}

void kiln__cuda_dnn_device_fini(kiln_cuda_device *dev)
{
    for (kiln__cuda_conv_cache *c = dev->conv_cache, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    dev->conv_cache = NULL;
}

static miopenDataType_t miopen_type(kiln_dtype dt)
{
    return dt == KILN_F16 ? miopenHalf : dt == KILN_BF16 ? miopenBFloat16 : miopenFloat;
}

/* q's handle, made and bound to q's stream on first use. */
static miopenHandle_t queue_handle(kiln_cuda_queue *q, const char *op, int *rc)
{
    if (!q->dnn) {
        miopenHandle_t h = NULL;
        miopenStatus_t st = miopenCreate(&h);
        if (st == miopenStatusSuccess)
            st = miopenSetStream(h, q->stream);
        if (st != miopenStatusSuccess) {
            if (h)
                miopenDestroy(h);
            *rc = miopen_fail(q, st, op, "starting");
            return NULL;
        }
        q->dnn = h;
    }
    return (miopenHandle_t)q->dnn;
}

/* One call's descriptors and the scratch copies of its operands. */
typedef struct conv_call {
    kiln_cuda_queue *q;
    const char *op;
    miopenHandle_t h;
    miopenTensorDescriptor_t xd, wd, yd;
    miopenConvolutionDescriptor_t cd;
    kiln__cuda_operands ops; /* packed copies of strided operands */
} conv_call;

static void call_fini(conv_call *c)
{
    if (c->xd)
        miopenDestroyTensorDescriptor(c->xd);
    if (c->wd)
        miopenDestroyTensorDescriptor(c->wd);
    if (c->yd)
        miopenDestroyTensorDescriptor(c->yd);
    if (c->cd)
        miopenDestroyConvolutionDescriptor(c->cd);
    kiln__cuda_operands_release(&c->ops);
}

/* Describes a packed t, with a trailing dim of 1 for a 1-d convolution. */
static miopenStatus_t describe(miopenTensorDescriptor_t desc, const kiln_tdesc *t, int nspatial)
{
    int dims[6], strides[6], n = 0;
    for (int d = 0; d < t->ndim; d++, n++) {
        dims[n] = (int)t->shape[d];
        strides[n] = (int)t->strides[d];
    }
    if (nspatial == 1) {
        dims[n] = 1;
        strides[n] = 1;
        n++;
    }
    return miopenSetTensorDescriptor(desc, miopen_type(t->dtype), n, dims, strides);
}

/* Descriptors for x [N, C, S...], w [O, C/g, K...] and y [N, O, S'...]. */
static int call_init(conv_call *c, const kiln_conv_params *p, const kiln_tdesc *x, const kiln_tdesc *w,
                     const kiln_tdesc *y)
{
    int rc = 0;
    c->h = queue_handle(c->q, c->op, &rc);
    if (!c->h)
        return rc;
    const char *what = "describing tensors";
    miopenStatus_t st = miopenCreateTensorDescriptor(&c->xd);
    if (st == miopenStatusSuccess)
        st = miopenCreateTensorDescriptor(&c->wd);
    if (st == miopenStatusSuccess)
        st = miopenCreateTensorDescriptor(&c->yd);
    if (st == miopenStatusSuccess)
        st = miopenCreateConvolutionDescriptor(&c->cd);
    if (st == miopenStatusSuccess)
        st = describe(c->xd, x, p->nspatial);
    if (st == miopenStatusSuccess)
        st = describe(c->wd, w, p->nspatial);
    if (st == miopenStatusSuccess)
        st = describe(c->yd, y, p->nspatial);
    if (st == miopenStatusSuccess) {
        what = "describing the convolution";
        int pad[3] = {0, 0, 0}, stride[3] = {1, 1, 1}, dil[3] = {1, 1, 1};
        for (int i = 0; i < p->nspatial; i++) {
            pad[i] = (int)p->padding[i];
            stride[i] = (int)p->stride[i];
            dil[i] = (int)p->dilation[i];
        }
        st = miopenInitConvolutionNdDescriptor(c->cd, p->nspatial == 1 ? 2 : p->nspatial, pad, stride, dil,
                                               miopenConvolution);
        if (st == miopenStatusSuccess)
            st = miopenSetConvolutionGroupCount(c->cd, (int)p->groups);
    }
    return st == miopenStatusSuccess ? 0 : miopen_fail(c->q, st, c->op, what);
}

static conv_key key_of(miopenHandle_t h, int dir, const kiln_conv_params *p, const kiln_tdesc *x,
                       const kiln_tdesc *w, const kiln_tdesc *y)
{
    conv_key k;
    memset(&k, 0, sizeof k); /* compared with memcmp: the padding too */
    k.handle = (uintptr_t)h;
    k.dir = dir;
    k.dtype = (int)y->dtype;
    k.nspatial = p->nspatial;
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

static bool cache_get(kiln_cuda_device *dev, const conv_key *key, int *algo, size_t *ws)
{
    bool hit = false;
    pthread_mutex_lock(&dev->mu);
    for (kiln__cuda_conv_cache *c = dev->conv_cache; c && !hit; c = c->next) {
        if (memcmp(&c->key, key, sizeof *key) == 0) {
            *algo = c->algo;
            *ws = c->ws;
            hit = true;
        }
    }
    pthread_mutex_unlock(&dev->mu);
    return hit;
}

static void cache_put(kiln_cuda_device *dev, const conv_key *key, int algo, size_t ws)
{
    kiln__cuda_conv_cache *c = malloc(sizeof *c);
    if (!c)
        return; /* the next call of this geometry runs Find again */
    *c = (kiln__cuda_conv_cache){.key = *key, .algo = algo, .ws = ws};
    pthread_mutex_lock(&dev->mu);
    c->next = dev->conv_cache;
    dev->conv_cache = c;
    pthread_mutex_unlock(&dev->mu);
}

#define MAX_ALGOS 8

/* Runs Find for one direction on the call's operands (it writes only the direction's
 * output, which the real run overwrites) and takes the fastest algorithm that fits the
 * workspace; the entries come sorted by time. */
static int find_fastest(conv_call *c, int dir, void *x, void *w, void *y, void *ws, int *algo, size_t *ws_used)
{
    miopenConvAlgoPerf_t perf[MAX_ALGOS];
    int found = 0;
    size_t need = 0;
    miopenStatus_t st;
    if (dir == DIR_FWD) {
        st = miopenConvolutionForwardGetWorkSpaceSize(c->h, c->wd, c->xd, c->cd, c->yd, &need);
        if (st == miopenStatusSuccess)
            st = miopenFindConvolutionForwardAlgorithm(c->h, c->xd, x, c->wd, w, c->cd, c->yd, y, MAX_ALGOS,
                                                       &found, perf, ws, KILN_CUDA_WORKSPACE_BYTES, false);
    } else if (dir == DIR_BWD_DATA) {
        st = miopenConvolutionBackwardDataGetWorkSpaceSize(c->h, c->yd, c->wd, c->cd, c->xd, &need);
        if (st == miopenStatusSuccess)
            st = miopenFindConvolutionBackwardDataAlgorithm(c->h, c->yd, y, c->wd, w, c->cd, c->xd, x, MAX_ALGOS,
                                                            &found, perf, ws, KILN_CUDA_WORKSPACE_BYTES, false);
    } else {
        st = miopenConvolutionBackwardWeightsGetWorkSpaceSize(c->h, c->yd, c->xd, c->cd, c->wd, &need);
        if (st == miopenStatusSuccess)
            st = miopenFindConvolutionBackwardWeightsAlgorithm(c->h, c->yd, y, c->xd, x, c->cd, c->wd, w,
                                                               MAX_ALGOS, &found, perf, ws,
                                                               KILN_CUDA_WORKSPACE_BYTES, false);
    }
    if (st != miopenStatusSuccess)
        return miopen_fail(c->q, st, c->op, "choosing an algorithm");
    for (int i = 0; i < found; i++) {
        if (perf[i].memory <= KILN_CUDA_WORKSPACE_BYTES) {
            *algo = dir == DIR_FWD        ? (int)perf[i].fwd_algo
                    : dir == DIR_BWD_DATA ? (int)perf[i].bwd_data_algo
                                          : (int)perf[i].bwd_weights_algo;
            *ws_used = perf[i].memory;
            return 0;
        }
    }
    kiln__error_set("%s on %s: MIOpen offers no algorithm for this convolution within a %zu MiB workspace "
                    "(its candidates ask up to %zu MiB)",
                    c->op, c->q->dev->name, KILN_CUDA_WORKSPACE_BYTES >> 20, need >> 20);
    return KILN_ENOTSUP;
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
        return kiln__error_set("%s on %s: %d-d convolutions of dtype %d are not supported (f32, f16 and bf16 "
                               "over 1 to 3 spatial dims are; MIOpen has no f64 convolutions)",
                               op, q->dev->name, p->nspatial, (int)y->dtype),
               KILN_ENOTSUP;
    conv_call c;
    memset(&c, 0, sizeof c);
    c.q = q;
    c.op = op;
    c.ops = (kiln__cuda_operands){.q = q, .op = op};
    /* the written operand is fresh and packed; the read ones may be views */
    const kiln_tdesc *xc = x, *wc = w, *yc = y;
    if (dir != DIR_BWD_DATA)
        rc = kiln__cuda_operand_packed(&c.ops, x, &xc);
    if (!rc && dir != DIR_BWD_WEIGHTS)
        rc = kiln__cuda_operand_packed(&c.ops, w, &wc);
    if (!rc && dir != DIR_FWD)
        rc = kiln__cuda_operand_packed(&c.ops, y, &yc);
    if (!rc)
        rc = call_init(&c, p, xc, wc, yc);
    void *ws = NULL;
    if (!rc && !(ws = kiln__cuda_workspace(q, op)))
        rc = KILN_ENOMEM;
    void *xp = rc ? NULL : kiln__cuda_ptr(xc), *wp = rc ? NULL : kiln__cuda_ptr(wc),
         *yp = rc ? NULL : kiln__cuda_ptr(yc);
    conv_key key = key_of(c.h, dir, p, x, w, y);
    int algo = 0;
    size_t ws_bytes = 0;
    if (!rc && !cache_get(q->dev, &key, &algo, &ws_bytes)) {
        rc = find_fastest(&c, dir, xp, wp, yp, ws, &algo, &ws_bytes);
        if (!rc)
            cache_put(q->dev, &key, algo, ws_bytes);
    }
    if (!rc) {
        /* alpha and beta are f32 for every dtype offered here */
        const float one = 1.0f, zero = 0.0f;
        miopenStatus_t st;
        if (dir == DIR_FWD)
            st = miopenConvolutionForward(c.h, &one, c.xd, xp, c.wd, wp, c.cd, (miopenConvFwdAlgorithm_t)algo,
                                          &zero, c.yd, yp, ws, ws_bytes);
        else if (dir == DIR_BWD_DATA)
            st = miopenConvolutionBackwardData(c.h, &one, c.yd, yp, c.wd, wp, c.cd,
                                               (miopenConvBwdDataAlgorithm_t)algo, &zero, c.xd, xp, ws, ws_bytes);
        else
            st = miopenConvolutionBackwardWeights(c.h, &one, c.yd, yp, c.xd, xp, c.cd,
                                                  (miopenConvBwdWeightsAlgorithm_t)algo, &zero, c.wd, wp, ws,
                                                  ws_bytes);
        if (st != miopenStatusSuccess)
            rc = miopen_fail(q, st, op, "running the convolution");
        q->last_op = op;
    }
    if (!rc && bias)
        rc = kiln__cuda_conv_add_bias(q, y, bias, op);
    call_fini(&c);
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
    return run_conv(q, DIR_BWD_WEIGHTS, "conv_backward_weight", p, x, grad_w, grad_out, NULL);
}
