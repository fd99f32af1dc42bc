/*
 * backends/cuda/cuda-blas.c — matmul through cuBLASLt.
 *
 * kiln's matrices are row-major; cuBLASLt's are column-major. A row-major M×N product
 * C = A·B is the column-major N×M product Cᵀ = Bᵀ·Aᵀ, and a row-major matrix read as
 * column-major is its transpose, so the call passes b as cuBLASLt's first operand and a
 * as its second with no data movement. An operand whose last two strides are neither
 * row-major nor column-major (or whose batch dims do not fold into one batch stride) is
 * first copied to a contiguous scratch block.
 *
 * f32 computes in exact f32 unless the device was opened with tf32=on (then
 * CUBLAS_COMPUTE_32F_FAST_TF32); f16 and bf16 accumulate in f32; f64 in f64. Integer
 * dtypes are not offered (supports() says so and the engine reports it).
 *
 * matmul_fused hands the epilogue to cuBLASLt: a bias over the output's last dim (the
 * rows of the column-major product, so one bias vector shared by every batch) through
 * CUBLASLT_EPILOGUE_BIAS, relu through CUBLASLT_EPILOGUE_RELU(_BIAS), and a residual as
 * the C operand with beta 1 (D = relu(A·B + C + bias)). Other activations are refused
 * (KILN_ENOTSUP without a message): the engine then runs matmul and the epilogue kernel.
 * cuBLASLt's GELU epilogue is the tanh approximation, which kiln's epilogue has no
 * activation for (its Gelu is the erf form), so it is not used.
 *
 * The algorithm: cuBLASLt's heuristics are asked once per geometry and the answer kept per
 * device (lt_recall, lt_keep). A product of 1e8 flops or more times the heuristics' first
 * eight candidates under the full workspace, and under 4 MiB and none (they rank differently
 * there), once, and keeps the fastest, also in the autotune file (lt_tune), so a later
 * process recalls it without timing; inside a graph recording only a stored winner is
 * taken (timing waits), else the heuristics' first, kept for that call alone.
 *
 * A HIP build runs this file on hipBLASLt, whose API matches cuBLASLt name for name
 * (vendor-hip-libs.h maps the spellings); hipBLASLt takes no alignment preferences, and
 * tf32 is refused when the device opens (cuda-backend.c).
 */
#if !KILN_CUDA_HIP /* a HIP build's hipBLASLt declarations come with cuda-libs.h */
#include <cublasLt.h>
#include <cublas_api.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autotune-impl.h"
#include "cuda-impl.h"
#include "cuda-libs.h"

int kiln__cuda_blas_init(kiln_cuda_device *dev)
{
    cublasLtHandle_t lt = NULL;
    cublasStatus_t st = cublasLtCreate(&lt);
    if (st != CUBLAS_STATUS_SUCCESS) {
        kiln__error_set("%s: cannot start cuBLASLt (%s)", dev->name, cublasLtGetStatusString(st));
        return -1;
    }
    dev->blas_lt = lt;
    /* the device as the autotune file names a timed matmul choice: the GPU, its compute
     * capability, the driver and CUDA runtime versions (made here, outside any recording) */
    int driver = 0, runtime = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess || cudaRuntimeGetVersion(&runtime) != cudaSuccess)
        (void)cudaGetLastError();
    int n = snprintf(dev->blas_tune_dev, sizeof dev->blas_tune_dev, "cuda/%.40s/sm%d%d/drv%d/rt%d/lt", dev->gpu,
                     dev->cc_major, dev->cc_minor, driver, runtime);
    if (n < 0 || (size_t)n >= sizeof dev->blas_tune_dev)
        dev->blas_tune_dev[0] = 0; /* choices then live in this process only */
    return 0;
}

void kiln__cuda_blas_fini(kiln_cuda_device *dev)
{
    if (dev->blas_lt)
        cublasLtDestroy((cublasLtHandle_t)dev->blas_lt);
    dev->blas_lt = NULL;
    free(dev->lt_cache);
    dev->lt_cache = NULL;
    free(dev->ep_ways);
    dev->ep_ways = NULL;
}

static int blas_fail(kiln_cuda_queue *q, cublasStatus_t st, const char *what)
{
    if (st == CUBLAS_STATUS_ALLOC_FAILED) {
        return kiln__error_set_code(KILN_ENOMEM, "matmul on %s: out of memory in %s", q->dev->name, what);
    }
    /* an execution failure may hide a sticky CUDA error: let the runtime say */
    cudaError_t e = cudaPeekAtLastError();
    if (st == CUBLAS_STATUS_EXECUTION_FAILED && e != cudaSuccess)
        return kiln__cuda_fail(q->dev, e, "matmul");
    return kiln__error_set_code(KILN_EDEVICE, "matmul on %s: %s failed: %s", q->dev->name, what,
                                cublasLtGetStatusString(st));
}

/* One operand as cuBLASLt sees it: rows × cols column-major with leading dim ld,
 * transposed or not, batch stride in elements. */
typedef struct lt_operand {
    const void *ptr;
    cublasOperation_t op;
    uint64_t rows, cols;
    int64_t ld, batch_stride;
} lt_operand;

/* Folds the batch dims (all but the last two) into one stride; false when they do not
 * fold (then the caller copies the operand). */
static bool batch_stride(const kiln_tdesc *t, int64_t *stride)
{
    int nb = t->ndim - 2;
    int64_t s = 0, span = 0; /* span: elements covered by the inner batch dims so far */
    bool have = false;
    for (int d = nb - 1; d >= 0; d--) {
        if (t->shape[d] == 1)
            continue;
        if (!have) {
            s = t->strides[d];
            span = t->shape[d];
            have = true;
            continue;
        }
        if (t->strides[d] != s * span)
            return false;
        span *= t->shape[d];
    }
    *stride = have ? s : 0;
    return true;
}

/* Describes t (shape [..., R, C] row-major semantics) as cuBLASLt's view of tᵀ:
 * column-major C × R. false when its layout needs a copy first. */
static bool describe(const kiln_tdesc *t, lt_operand *o)
{
    int64_t r = t->shape[t->ndim - 2], c = t->shape[t->ndim - 1];
    int64_t sr = t->strides[t->ndim - 2], sc = t->strides[t->ndim - 1];
    if (c == 1)
        sc = 1;
    if (r == 1)
        sr = c;
    if (!batch_stride(t, &o->batch_stride))
        return false;
    if (sc == 1 && sr >= (c > 1 ? c : 1)) {
        /* row-major R×C with row stride sr: column-major C×R, ld sr, as is */
        o->op = CUBLAS_OP_N;
        o->rows = (uint64_t)c;
        o->cols = (uint64_t)r;
        o->ld = sr;
        return true;
    }
    if (sr == 1 && sc >= (r > 1 ? r : 1)) {
        /* column-major R×C (a transposed view): stored R×C column-major, ld sc, used transposed */
        o->op = CUBLAS_OP_T;
        o->rows = (uint64_t)r;
        o->cols = (uint64_t)c;
        o->ld = sc;
        return true;
    }
    return false;
}

/* t as cuBLASLt's operand: itself, or a packed copy (kept in ops until released) when its
 * layout is none cuBLASLt reads. */
static int operand(kiln__cuda_operands *ops, const kiln_tdesc *t, lt_operand *o)
{
    const kiln_tdesc *use = t;
    if (!describe(t, o)) {
        int rc = kiln__cuda_operand_packed(ops, t, &use);
        if (rc)
            return rc;
        if (!describe(use, o))
            return kiln__error_set("%s on %s: an operand's layout cuBLASLt cannot read", ops->op,
                                   ops->q->dev->name),
                   KILN_EINVAL;
    }
    o->ptr = kiln__cuda_ptr(use);
    return 0;
}
static int run_lt(kiln_cuda_queue *q, const kiln_tdesc *out, const lt_operand *oa, const lt_operand *ob, int64_t m,
                  int64_t n, int64_t k, int64_t batch, const kiln_epilogue *ep);
static int run_with_epilogue(kiln_cuda_queue *q, const kiln_tdesc *out, const lt_operand *first,
                             const lt_operand *second, int64_t m, int64_t n, int64_t k, int64_t batch,
                             const kiln_epilogue *ep);

static int matmul(kiln_cuda_queue *q, const kiln_tdesc *out, const kiln_tdesc *a, const kiln_tdesc *b,
                  const kiln_epilogue *ep);

/* a or b as a view of out's ndim: batch dims aligned from the right, stride 0 where they
 * broadcast, the last two dims as they are */
static kcu_view aligned_view(const kiln_tdesc *t, const kiln_tdesc *out)
{
    kcu_view v = kiln__cuda_view(t);
    int nd = out->ndim, shift = nd - t->ndim;
    v.ndim = nd;
    for (int d = nd - 1; d >= 0; d--) {
        int dt = d - shift;
        if (d >= nd - 2) {
            v.shape[d] = t->shape[dt];
            v.strides[d] = t->strides[dt];
        } else {
            v.shape[d] = out->shape[d];
            v.strides[d] = dt >= 0 && t->shape[dt] != 1 ? t->strides[dt] : 0;
        }
    }
    return v;
}

/* i32, i64 and u8 matrices: a plain kernel, wrapping as the reference does */
static int int_matmul(kiln_cuda_queue *q, const kiln_tdesc *out, const kiln_tdesc *a, const kiln_tdesc *b)
{
    if (out->ndim > KCU_MAX_DIMS)
        return kiln__error_set("matmul on %s: more than %d dims", q->dev->name, KCU_MAX_DIMS), KILN_ENOTSUP;
    kcu_view ov = kiln__cuda_view(out), av = aligned_view(a, out), bv = aligned_view(b, out);
    return kiln__cuda_check(q, kcu_matmul_int(q->stream, &ov, &av, &bv, a->shape[a->ndim - 1]), "matmul");
}

static bool int_dtype(kiln_dtype dt)
{
    return dt == KILN_I32 || dt == KILN_I64 || dt == KILN_U8;
}

int kiln__cuda_matmul(void *vq, const kiln_tdesc *out, const kiln_tdesc *a, const kiln_tdesc *b)
{
    kiln_cuda_queue *q = vq;
    int rc = kiln__cuda_enter(q->dev, "matmul");
    return rc ? rc : matmul(q, out, a, b, NULL);
}

int kiln__cuda_matmul_fused(void *vq, const kiln_tdesc *out, const kiln_tdesc *a, const kiln_tdesc *b,
                            const kiln_epilogue *ep)
{
    kiln_cuda_queue *q = vq;
    int rc = kiln__cuda_enter(q->dev, "matmul_fused");
    if (rc)
        return rc;
    if (out->dtype != KILN_F32 || (ep->act != KILN_EPI_NONE && ep->act != KILN_EPI_RELU))
        return KILN_ENOTSUP; /* the engine runs matmul and the epilogue kernel */
    return matmul(q, out, a, b, ep);
}

static int matmul(kiln_cuda_queue *q, const kiln_tdesc *out, const kiln_tdesc *a, const kiln_tdesc *b,
                  const kiln_epilogue *ep)
{
    int rc = 0;
    kiln_dtype dt = out->dtype;
    if (int_dtype(dt) && int_dtype(a->dtype) && int_dtype(b->dtype) && out->ndim >= 2 && a->ndim >= 2 &&
        b->ndim >= 2)
        return int_matmul(q, out, a, b);
    if (!(dt == KILN_F32 || dt == KILN_F64 || dt == KILN_F16 || dt == KILN_BF16) || a->dtype != dt ||
        b->dtype != dt || out->ndim < 2)
        return kiln__error_set("matmul on %s: only f32, f64, f16, bf16, i32, i64 and u8 matrices are supported",
                               q->dev->name),
               KILN_ENOTSUP;
    int nd = out->ndim;
    int64_t m = out->shape[nd - 2], n = out->shape[nd - 1], k = a->shape[nd - 1];
    int64_t batch = 1;
    for (int d = 0; d < nd - 2; d++)
        batch *= out->shape[d];
    if (m == 0 || n == 0 || batch == 0)
        return 0;
    if (k == 0) { /* an empty sum, then the epilogue over zeros */
        rc = kiln__cuda_fill(q, out, 0.0);
        return rc || !ep ? rc : kiln__cuda_epilogue(q, out, ep);
    }
    if (batch > INT32_MAX)
        return kiln__error_set("matmul on %s: %lld batches exceed cuBLASLt's limit", q->dev->name,
                               (long long)batch),
               KILN_ENOTSUP;

    kiln__cuda_operands ops = {.q = q, .op = "matmul"};
    lt_operand oa, ob;
    /* cuBLASLt's first operand is b (N×K as it sees it), its second a */
    rc = operand(&ops, b, &ob);
    if (!rc)
        rc = operand(&ops, a, &oa);
    if (rc)
        goto done;
    /* a weight shared by every batch (b's batch stride 0) times row-major a whose batches
     * follow one another row after row: one GEMM of batch·m rows, not batch small ones (a
     * Transformer's [B, S, D] · [D, F] projections; cuBLASLt tiles one tall product better) */
    if (batch > 1 && ob.batch_stride == 0 && oa.op == CUBLAS_OP_N && oa.batch_stride == m * oa.ld) {
        oa.cols = (uint64_t)(m * batch);
        m *= batch;
        batch = 1;
    }
    rc = ep ? run_with_epilogue(q, out, &ob, &oa, m, n, k, batch, ep)
            : run_lt(q, out, &ob, &oa, m, n, k, batch, NULL);
done:
    kiln__cuda_operands_release(&ops);
    return rc;
}

/* The largest power of two (at most 256) that divides p: cuBLASLt's heuristic assumes
 * 256-byte aligned operands unless told otherwise, and a view's offset may break that. */
#if !KILN_CUDA_HIP
static uint32_t alignment(const void *p)
{
    uintptr_t v = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && v % al)
        al /= 2;
    return al;
}
#endif

/* ------------------------------------------------ the heuristics' choices, kept */

/* cuBLASLt's heuristic query (cublasLtMatmulAlgoGetHeuristic) costs more host time than the
 * product itself on small matrices, and a model asks the same few geometries every run (a
 * training step, a model run op by op), so each device keeps the answer per geometry: the
 * dtypes, operations, shapes, leading dims, batch strides, epilogue and the operands'
 * alignments, everything the query saw. */
typedef struct lt_key {
    int32_t type, compute, op_first, op_second, epilogue, residual;
    uint64_t rows_first, cols_first, rows_second, cols_second;
    int64_t ld_first, ld_second, m, n, batch, stride_first, stride_second;
    uint32_t align[4];
} lt_key;

typedef struct lt_choice {
    lt_key key;
    cublasLtMatmulAlgo_t algo;
    bool used;
} lt_choice;

#define LT_SLOTS 512 /* per device; a geometry past them evicts one in its probe window */
#define LT_PROBES 8

struct kiln__cuda_lt_cache {
    lt_choice slot[LT_SLOTS];
};

static uint32_t lt_hash(const lt_key *k)
{
    const unsigned char *p = (const unsigned char *)k;
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < sizeof *k; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

static bool lt_recall(kiln_cuda_device *dev, const lt_key *k, cublasLtMatmulAlgo_t *algo)
{
    bool hit = false;
    uint32_t h = lt_hash(k);
    pthread_mutex_lock(&dev->mu);
    for (int i = 0; dev->lt_cache && i < LT_PROBES && !hit; i++) {
        const lt_choice *c = &dev->lt_cache->slot[(h + (uint32_t)i) % LT_SLOTS];
        if (c->used && !memcmp(&c->key, k, sizeof *k)) {
            *algo = c->algo;
            hit = true;
        }
    }
    pthread_mutex_unlock(&dev->mu);
    return hit;
}

static void lt_keep(kiln_cuda_device *dev, const lt_key *k, const cublasLtMatmulAlgo_t *algo)
{
    uint32_t h = lt_hash(k);
    pthread_mutex_lock(&dev->mu);
    if (!dev->lt_cache)
        dev->lt_cache = calloc(1, sizeof *dev->lt_cache); /* NULL: nothing kept, the query runs each call */
    if (dev->lt_cache) {
        lt_choice *c = &dev->lt_cache->slot[h % LT_SLOTS];
        for (int i = 0; i < LT_PROBES; i++) {
            lt_choice *t = &dev->lt_cache->slot[(h + (uint32_t)i) % LT_SLOTS];
            if (!t->used) {
                c = t;
                break;
            }
        }
        c->key = *k;
        c->algo = *algo;
        c->used = true;
    }
    pthread_mutex_unlock(&dev->mu);
}

/* ------------------------------------------------ timing the candidates (autotune) */

#define LT_CANDIDATES 8
#define LT_TUNE_MIN_FLOPS 1e8 /* below it, timing noise outweighs what a better kernel saves */

typedef struct lt_call {
    kiln_cuda_queue *q;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    const void *alpha, *beta, *first, *second, *cin;
    void *c, *ws;
    size_t ws_bytes;
} lt_call;

/* The geometry as the autotune file names it (the key's fields); 0 when it does not fit.
 * The device's name there (dev->blas_tune_dev) is made when cuBLASLt starts. */
static int lt_key_name(const lt_key *k, char *tkey, size_t klen)
{
    int m = snprintf(tkey, klen,
                     "matmul/t%d/c%d/o%d%d/%llux%llu:%lld/%llux%llu:%lld/%lldx%lld/b%lld:%lld:%lld/e%d/r%d/"
                     "a%u.%u.%u.%u",
                     k->type, k->compute, k->op_first, k->op_second, (unsigned long long)k->rows_first,
                     (unsigned long long)k->cols_first, (long long)k->ld_first, (unsigned long long)k->rows_second,
                     (unsigned long long)k->cols_second, (long long)k->ld_second, (long long)k->m, (long long)k->n,
                     (long long)k->batch, (long long)k->stride_first, (long long)k->stride_second, k->epilogue,
                     k->residual, k->align[0], k->align[1], k->align[2], k->align[3]);
    return m > 0 && (size_t)m < klen;
}

/* Which of the heuristics' candidates runs this product fastest: recalled from the autotune
 * file, else each timed once here (a warm-up run, then three on the queue's stream between
 * two events; the output is written, which the real run then overwrites) and the winner
 * stored. Candidates that fail to run are passed over; 0 (the heuristics' first) when
 * nothing could be timed. While the queue records a graph nothing is timed (the waits
 * would break the recording): without a stored winner it answers 0 with *decided false. */
static int lt_tune(const lt_call *c, const lt_key *key, const cublasLtMatmulHeuristicResult_t *cand, int found,
                   bool *decided)
{
    char tkey[256];
    const char *tdev = c->q->dev->blas_tune_dev;
    bool named = tdev[0] && lt_key_name(key, tkey, sizeof tkey);
    int64_t stored = 0;
    *decided = true;
    if (named && kiln__autotune_lookup(tdev, tkey, &stored) && stored >= 1 && stored <= found)
        return (int)stored - 1;
    if (c->q->recording) {
        *decided = false;
        return 0;
    }
    cudaEvent_t ev[2] = {NULL, NULL};
    if (cudaEventCreate(&ev[0]) != cudaSuccess || cudaEventCreate(&ev[1]) != cudaSuccess) {
        (void)cudaGetLastError();
        if (ev[0])
            cudaEventDestroy(ev[0]);
        return 0;
    }
    cublasLtHandle_t h = (cublasLtHandle_t)c->q->dev->blas_lt;
    int pick = -1;
    float best = 0;
    for (int i = 0; i < found; i++) {
        if (cand[i].workspaceSize > c->ws_bytes)
            continue;
        cublasStatus_t st = cublasLtMatmul(h, c->op, c->alpha, c->first, c->la, c->second, c->lb, c->beta, c->cin,
                                           c->lc, c->c, c->lc, &cand[i].algo, c->ws, c->ws_bytes, c->q->stream);
        if (st == CUBLAS_STATUS_SUCCESS && cudaEventRecord(ev[0], c->q->stream) == cudaSuccess) {
            for (int r = 0; r < 3 && st == CUBLAS_STATUS_SUCCESS; r++)
                st = cublasLtMatmul(h, c->op, c->alpha, c->first, c->la, c->second, c->lb, c->beta, c->cin, c->lc,
                                    c->c, c->lc, &cand[i].algo, c->ws, c->ws_bytes, c->q->stream);
        }
        float ms = 0;
        if (st != CUBLAS_STATUS_SUCCESS || cudaEventRecord(ev[1], c->q->stream) != cudaSuccess ||
            cudaEventSynchronize(ev[1]) != cudaSuccess || cudaEventElapsedTime(&ms, ev[0], ev[1]) != cudaSuccess) {
            (void)cudaGetLastError();
            continue;
        }
        if (pick < 0 || ms < best) {
            pick = i;
            best = ms;
        }
    }
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    if (pick < 0)
        return 0;
    if (named)
        kiln__autotune_store(tdev, tkey, pick + 1);
    return pick;
}

static int run_lt(kiln_cuda_queue *q, const kiln_tdesc *out, const lt_operand *first, const lt_operand *second,
                  int64_t m, int64_t n, int64_t k, int64_t batch, const kiln_epilogue *ep)
{
    kiln_dtype dt = out->dtype;
    cudaDataType_t type = dt == KILN_F32   ? CUDA_R_32F
                          : dt == KILN_F64 ? CUDA_R_64F
                          : dt == KILN_F16 ? CUDA_R_16F
                                           : CUDA_R_16BF;
    cublasComputeType_t compute = dt == KILN_F64                     ? CUBLAS_COMPUTE_64F
                                  : (dt == KILN_F32 && q->dev->tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                     : CUBLAS_COMPUTE_32F;
    cudaDataType_t scale = dt == KILN_F64 ? CUDA_R_64F : CUDA_R_32F;
    void *ws = kiln__cuda_workspace(q, "matmul");
    if (!ws)
        return KILN_ENOMEM;
    size_t ws_bytes = KILN_CUDA_WORKSPACE_BYTES;

    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    int rc = 0;
    cublasStatus_t st = cublasLtMatmulDescCreate(&op, compute, scale);
    const char *what = "cublasLtMatmulDescCreate";
    int32_t nb = (int32_t)batch;
    int64_t c_stride = m * n;
    /* column-major view: C' is N×M (ld N) = op(first) N×K · op(second) K×M */
    if (st == CUBLAS_STATUS_SUCCESS) {
        what = "setting the operation";
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &first->op, sizeof first->op);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &second->op, sizeof second->op);
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
        what = "describing the matrices";
        st = cublasLtMatrixLayoutCreate(&la, type, first->rows, first->cols, first->ld);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatrixLayoutCreate(&lb, type, second->rows, second->cols, second->ld);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatrixLayoutCreate(&lc, type, (uint64_t)n, (uint64_t)m, n);
    }
    void *c = kiln__cuda_ptr(out);
    const void *cin = ep && ep->residual ? kiln__cuda_ptr(ep->residual) : c;
    if (st == CUBLAS_STATUS_SUCCESS && ep) {
        what = "setting the epilogue";
        bool relu = ep->act == KILN_EPI_RELU;
        cublasLtEpilogue_t epi = ep->bias ? (relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                                          : (relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
        st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
        if (st == CUBLAS_STATUS_SUCCESS && ep->bias) {
            const void *bias = kiln__cuda_ptr(ep->bias);
            st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
        }
    }
    if (st == CUBLAS_STATUS_SUCCESS && batch > 1) {
        cublasLtMatrixLayout_t ls[3] = {la, lb, lc};
        int64_t strides[3] = {first->batch_stride, second->batch_stride, c_stride};
        for (int i = 0; i < 3 && st == CUBLAS_STATUS_SUCCESS; i++) {
            st = cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &nb, sizeof nb);
            if (st == CUBLAS_STATUS_SUCCESS)
                st = cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                      &strides[i], sizeof strides[i]);
        }
    }
    float one_f = 1.0f, zero_f = 0.0f;
    double one_d = 1.0, zero_d = 0.0;
    const void *alpha = dt == KILN_F64 ? (const void *)&one_d : (const void *)&one_f;
    /* beta 1 adds the residual (C); 0 ignores C, which is then the output itself */
    bool res = ep && ep->residual;
    const void *beta = dt == KILN_F64 ? (const void *)(res ? &one_d : &zero_d)
                                      : (const void *)(res ? &one_f : &zero_f);
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    lt_key key;
    memset(&key, 0, sizeof key); /* padding too: keys compare as bytes */
    key.type = (int32_t)type;
    key.compute = (int32_t)compute;
    key.op_first = (int32_t)first->op;
    key.op_second = (int32_t)second->op;
    key.epilogue = ep ? (int32_t)ep->act + 1 + (ep->bias ? 100 : 0) : 0;
    key.residual = ep && ep->residual;
    key.rows_first = first->rows;
    key.cols_first = first->cols;
    key.rows_second = second->rows;
    key.cols_second = second->cols;
    key.ld_first = first->ld;
    key.ld_second = second->ld;
    key.m = m;
    key.n = n;
    key.batch = batch;
    key.stride_first = batch > 1 ? first->batch_stride : 0;
    key.stride_second = batch > 1 ? second->batch_stride : 0;
#if !KILN_CUDA_HIP
    key.align[0] = alignment(first->ptr);
    key.align[1] = alignment(second->ptr);
    key.align[2] = alignment(cin);
    key.align[3] = alignment(c);
#endif
    bool recalled = st == CUBLAS_STATUS_SUCCESS && lt_recall(q->dev, &key, &heur.algo);
    if (st == CUBLAS_STATUS_SUCCESS && !recalled) {
        what = "choosing an algorithm";
        st = cublasLtMatmulPreferenceCreate(&pref);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                      sizeof ws_bytes);
#if !KILN_CUDA_HIP
        cublasLtMatmulPreferenceAttributes_t which[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++)
            st = cublasLtMatmulPreferenceSetAttribute(pref, which[i], &key.align[i], sizeof key.align[i]);
#endif
        /* large products time the heuristics' first candidates once (lt_tune), or recall
         * the winner from the autotune file; small ones take its first */
        bool tune = 2.0 * (double)m * (double)n * (double)k * (double)batch >= LT_TUNE_MIN_FLOPS;
        cublasLtMatmulHeuristicResult_t cand[3 * LT_CANDIDATES];
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)q->dev->blas_lt, op, la, lb, lc, lc, pref,
                                                tune ? LT_CANDIDATES : 1, cand, &found);
        if (st == CUBLAS_STATUS_SUCCESS && found == 0)
            st = CUBLAS_STATUS_NOT_SUPPORTED;
        /* the heuristics rank differently under a smaller workspace (without the split
         * reductions a large one allows), and their first there can beat every candidate of
         * the large one: those join the timing too, each once */
        static const size_t smaller_ws[2] = {(size_t)4 << 20, 0};
        for (int w = 0; tune && st == CUBLAS_STATUS_SUCCESS && w < 2; w++) {
            int more = 0;
            if (cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &smaller_ws[w],
                                                     sizeof smaller_ws[w]) != CUBLAS_STATUS_SUCCESS ||
                cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)q->dev->blas_lt, op, la, lb, lc, lc, pref,
                                               LT_CANDIDATES, cand + found, &more) != CUBLAS_STATUS_SUCCESS)
                break;
            int first_new = found, end = found + more;
            for (int i = first_new; i < end; i++) {
                bool seen = false;
                for (int j = 0; j < found && !seen; j++)
                    seen = !memcmp(&cand[j].algo, &cand[i].algo, sizeof cand[i].algo);
                if (!seen)
                    cand[found++] = cand[i];
            }
        }
        if (st == CUBLAS_STATUS_SUCCESS) {
            lt_call call = {q, op, la, lb, lc, alpha, beta, first->ptr, second->ptr, cin, c, ws, ws_bytes};
            bool decided = true;
            heur = cand[found > 1 ? lt_tune(&call, &key, cand, found, &decided) : 0];
            /* a large product met first inside a recording (which timing would break) and
             * not in the autotune file runs the heuristics' first and keeps nothing: the
             * next call outside a recording times the candidates */
            if (decided)
                lt_keep(q->dev, &key, &heur.algo);
        }
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
        what = "cublasLtMatmul";
        st = cublasLtMatmul((cublasLtHandle_t)q->dev->blas_lt, op, alpha, first->ptr, la, second->ptr, lb, beta,
                            cin, lc, c, lc, &heur.algo, ws, ws_bytes, q->stream);
    }
    if (ep && st == CUBLAS_STATUS_NOT_SUPPORTED && !strcmp(what, "choosing an algorithm"))
        rc = KILN_ENOTSUP; /* no kernel with this epilogue: the engine runs matmul, then the epilogue */
    else if (st != CUBLAS_STATUS_SUCCESS)
        rc = blas_fail(q, st, what);
    else
        q->last_op = ep ? "matmul_fused" : "matmul";
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (lc)
        cublasLtMatrixLayoutDestroy(lc);
    if (lb)
        cublasLtMatrixLayoutDestroy(lb);
    if (la)
        cublasLtMatrixLayoutDestroy(la);
    if (op)
        cublasLtMatmulDescDestroy(op);
    return rc;
}

/* ------------------------------------ a product with an epilogue: two ways, timed */

/* cuBLASLt offers fewer kernels with a bias epilogue than without one, and for some shapes
 * (BERT's K = 768 linears on an H200 ran at 0.69-0.76 of PyTorch with every bias-epilogue
 * candidate) the best plain product followed by a pass of the epilogue kernel is faster.
 * A product large enough to time its candidates (LT_TUNE_MIN_FLOPS) without a residual
 * (which the plain product's output may share memory with) times both ways once per
 * geometry, each whole, and keeps the faster: in the autotune file under a name of its own,
 * and per device by that name's 64-bit hash (a collision could only pick the slower of two
 * correct ways). Either way computes act(a·b + bias) in f32; the separate way rounds the
 * product to f32 before adding the bias, as the unfused engine does. */

#define EP_WAY_SLOTS 256

typedef struct ep_way {
    uint64_t hash; /* 0: empty */
    int way;       /* KILN_CUDA_EP_FUSED or KILN_CUDA_EP_SEPARATE */
} ep_way;

struct kiln__cuda_ep_ways {
    ep_way slot[EP_WAY_SLOTS];
};

static uint64_t name_hash(const char *s)
{
    uint64_t h = 14695981039346656037ull; /* FNV-1a, 64 bits */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h ? h : 1;
}

static int ep_way_recall(kiln_cuda_device *dev, uint64_t h)
{
    int way = KILN_CUDA_EP_TIMED;
    pthread_mutex_lock(&dev->mu);
    for (int i = 0; dev->ep_ways && i < LT_PROBES && !way; i++) {
        const ep_way *w = &dev->ep_ways->slot[(h + (uint64_t)i) % EP_WAY_SLOTS];
        if (w->hash == h)
            way = w->way;
    }
    pthread_mutex_unlock(&dev->mu);
    return way;
}

static void ep_way_keep(kiln_cuda_device *dev, uint64_t h, int way)
{
    pthread_mutex_lock(&dev->mu);
    if (!dev->ep_ways)
        dev->ep_ways = calloc(1, sizeof *dev->ep_ways); /* NULL: nothing kept, both ways timed again */
    if (dev->ep_ways) {
        ep_way *w = &dev->ep_ways->slot[h % EP_WAY_SLOTS];
        for (int i = 0; i < LT_PROBES; i++) {
            ep_way *t = &dev->ep_ways->slot[(h + (uint64_t)i) % EP_WAY_SLOTS];
            if (!t->hash || t->hash == h) {
                w = t;
                break;
            }
        }
        w->hash = h;
        w->way = way;
    }
    pthread_mutex_unlock(&dev->mu);
}

static int run_way(kiln_cuda_queue *q, int way, const kiln_tdesc *out, const lt_operand *first,
                   const lt_operand *second, int64_t m, int64_t n, int64_t k, int64_t batch,
                   const kiln_epilogue *ep)
{
    if (way != KILN_CUDA_EP_SEPARATE)
        return run_lt(q, out, first, second, m, n, k, batch, ep);
    int rc = run_lt(q, out, first, second, m, n, k, batch, NULL);
    if (!rc)
        rc = kiln__cuda_epilogue(q, out, ep);
    if (!rc)
        q->last_op = "matmul_fused";
    return rc;
}

/* Milliseconds of three runs of one way after an untimed one (which also times that way's
 * cuBLASLt candidates the first time); negative when it did not run. */
static float time_way(kiln_cuda_queue *q, int way, cudaEvent_t ev[2], const kiln_tdesc *out,
                      const lt_operand *first, const lt_operand *second, int64_t m, int64_t n, int64_t k,
                      int64_t batch, const kiln_epilogue *ep)
{
    int rc = run_way(q, way, out, first, second, m, n, k, batch, ep);
    if (rc || cudaEventRecord(ev[0], q->stream) != cudaSuccess)
        return -1;
    for (int r = 0; r < 3 && !rc; r++)
        rc = run_way(q, way, out, first, second, m, n, k, batch, ep);
    float ms = 0;
    if (rc || cudaEventRecord(ev[1], q->stream) != cudaSuccess || cudaEventSynchronize(ev[1]) != cudaSuccess ||
        cudaEventElapsedTime(&ms, ev[0], ev[1]) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return ms;
}

static int run_with_epilogue(kiln_cuda_queue *q, const kiln_tdesc *out, const lt_operand *first,
                             const lt_operand *second, int64_t m, int64_t n, int64_t k, int64_t batch,
                             const kiln_epilogue *ep)
{
    kiln_cuda_device *dev = q->dev;
    if (dev->ep_way_forced)
        return run_way(q, dev->ep_way_forced, out, first, second, m, n, k, batch, ep);
    if (ep->residual || 2.0 * (double)m * (double)n * (double)k * (double)batch < LT_TUNE_MIN_FLOPS)
        return run_lt(q, out, first, second, m, n, k, batch, ep);
    char name[256];
    int len = snprintf(name, sizeof name,
                       "matmul-epilogue/d%d/t%d/o%d%d/%lldx%lldx%lld/l%lld.%lld/b%lld:%lld:%lld/a%d/b%d",
                       (int)out->dtype, (int)dev->tf32, (int)first->op, (int)second->op, (long long)m,
                       (long long)n, (long long)k, (long long)first->ld, (long long)second->ld, (long long)batch,
                       (long long)(batch > 1 ? first->batch_stride : 0),
                       (long long)(batch > 1 ? second->batch_stride : 0), (int)ep->act, ep->bias != NULL);
    if (len <= 0 || (size_t)len >= sizeof name)
        return run_lt(q, out, first, second, m, n, k, batch, ep);
    uint64_t h = name_hash(name);
    int way = ep_way_recall(dev, h);
    if (!way) {
        int64_t stored = 0;
        if (dev->blas_tune_dev[0] && kiln__autotune_lookup(dev->blas_tune_dev, name, &stored) &&
            (stored == KILN_CUDA_EP_FUSED || stored == KILN_CUDA_EP_SEPARATE)) {
            way = (int)stored;
            ep_way_keep(dev, h, way);
        }
    }
    if (way)
        return run_way(q, way, out, first, second, m, n, k, batch, ep);
    if (q->recording) /* timing would break the recording: the epilogue, nothing kept */
        return run_lt(q, out, first, second, m, n, k, batch, ep);
    cudaEvent_t ev[2] = {NULL, NULL};
    if (cudaEventCreate(&ev[0]) != cudaSuccess || cudaEventCreate(&ev[1]) != cudaSuccess) {
        (void)cudaGetLastError();
        if (ev[0])
            cudaEventDestroy(ev[0]);
        return run_lt(q, out, first, second, m, n, k, batch, ep);
    }
    float fused = time_way(q, KILN_CUDA_EP_FUSED, ev, out, first, second, m, n, k, batch, ep);
    float separate = time_way(q, KILN_CUDA_EP_SEPARATE, ev, out, first, second, m, n, k, batch, ep);
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    if (fused >= 0 || separate >= 0) {
        way = separate >= 0 && (fused < 0 || separate < fused) ? KILN_CUDA_EP_SEPARATE : KILN_CUDA_EP_FUSED;
        ep_way_keep(dev, h, way);
        if (dev->blas_tune_dev[0])
            kiln__autotune_store(dev->blas_tune_dev, name, way);
    }
    /* the result, by the chosen way (or cuBLASLt's epilogue, which then reports its error) */
    return run_way(q, way ? way : KILN_CUDA_EP_FUSED, out, first, second, m, n, k, batch, ep);
}
