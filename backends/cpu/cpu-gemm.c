/*
 * backends/cpu/cpu-gemm.c — matmul on OpenBLAS, threaded by our pool.
 *
 * Plain GEMM runs at the same ~93% of peak in every library, so the work here is not
 * to copy: when the last two dims of an operand are contiguous in either order (a
 * plain matrix, or a transposed view of one) the strides map straight onto
 * cblas_?gemm's transpose flags and leading dimension, and each batch is one call on
 * the original memory. Only operands that fit neither order (negative or two non-unit
 * strides) are copied to contiguous scratch first, one batch at a time.
 *
 * Threads: OpenBLAS runs single-threaded and our pool splits each large product into
 * blocks of rows (or columns), one BLAS call per worker; a batch of small products is
 * spread over the pool a batch per call. OpenBLAS's own threads wait for work by
 * spinning on sched_yield between calls, which on a busy machine (or between the
 * elementwise ops of a training step) takes cores from our workers; with one set of
 * threads nothing competes. KILN_CPU_BLAS=openblas restores OpenBLAS's threading.
 *
 * f16/bf16 convert to f32 and use sgemm (PyTorch CPU accumulates half types in f32 as
 * well); integer dtypes use a straightforward i-k-j loop in int64 with wrap-around.
 */
#include <cblas.h>
#include <stdlib.h>

#include "cpu-impl.h"

/* How an operand of logical shape rows x cols can be passed to BLAS. */
static bool blas_layout(int64_t rows, int64_t cols, int64_t srow, int64_t scol, bool *trans,
                        int64_t *ld)
{
    int64_t r = rows > 1 ? rows : 1, c = cols > 1 ? cols : 1;
    if ((scol == 1 || cols <= 1) && (rows <= 1 || srow >= c)) {
        *trans = false;
        *ld = rows <= 1 ? c : srow;
        return *ld >= c;
    }
    if ((srow == 1 || rows <= 1) && (cols <= 1 || scol >= r)) {
        *trans = true;
        *ld = cols <= 1 ? r : scol;
        return *ld >= r;
    }
    return false;
}

static int64_t batch_offset(const kiln_tdesc *shape_of, const kiln_tdesc *d, int64_t bi)
{
    int nb = shape_of->ndim - 2;
    int off_dims = (d->ndim - 2) - nb; /* d may have fewer batch dims (they broadcast) */
    int64_t off = 0;
    for (int i = nb - 1; i >= 0; i--) {
        int64_t n = shape_of->shape[i];
        int64_t idx = bi % n;
        bi /= n;
        int di = i + off_dims;
        if (di >= 0 && d->shape[di] != 1)
            off += idx * d->strides[di];
    }
    return off;
}

/* ------------------------------------------------------------------ threaded GEMM */

typedef struct gemm_job {
    bool dbl, ta, tb, split_rows;
    int64_t M, N, K, lda, ldb, ldc, chunk;
    const char *A, *B;
    char *C;
    double beta;
} gemm_job;

static void blas_call(bool dbl, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A,
                      int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc)
{
    /* One row (or column) of C is a matrix-vector product. sgemm would pack the whole
     * matrix into its panel format first, a copy as large as the read itself: for a
     * classifier at batch 1 that copy was most of the layer's time. */
    if (M == 1 && N > 1 && K > 0) { /* C[1, N] = op(B)^T applied to A's one row */
        int64_t incx = ta ? lda : 1;
        if (dbl)
            cblas_dgemv(CblasRowMajor, tb ? CblasNoTrans : CblasTrans, (blasint)(tb ? N : K), (blasint)(tb ? K : N),
                        1.0, B, (blasint)ldb, A, (blasint)incx, beta, C, 1);
        else
            cblas_sgemv(CblasRowMajor, tb ? CblasNoTrans : CblasTrans, (blasint)(tb ? N : K), (blasint)(tb ? K : N),
                        1.0f, B, (blasint)ldb, A, (blasint)incx, (float)beta, C, 1);
        return;
    }
    if (N == 1 && M > 1 && K > 0) { /* C[M, 1] = op(A) times B's one column */
        int64_t incx = tb ? 1 : ldb;
        if (dbl)
            cblas_dgemv(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, (blasint)(ta ? K : M), (blasint)(ta ? M : K),
                        1.0, A, (blasint)lda, B, (blasint)incx, beta, C, (blasint)ldc);
        else
            cblas_sgemv(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, (blasint)(ta ? K : M), (blasint)(ta ? M : K),
                        1.0f, A, (blasint)lda, B, (blasint)incx, (float)beta, C, (blasint)ldc);
        return;
    }
    if (dbl)
        cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    (blasint)M, (blasint)N, (blasint)K, 1.0, A, (blasint)lda, B, (blasint)ldb, beta,
                    C, (blasint)ldc);
    else
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    (blasint)M, (blasint)N, (blasint)K, 1.0f, A, (blasint)lda, B, (blasint)ldb,
                    (float)beta, C, (blasint)ldc);
}

static void gemm_block(void *argp, int job, int njobs)
{
    const gemm_job *j = argp;
    int64_t es = j->dbl ? 8 : 4, total = j->split_rows ? j->M : j->N;
    int64_t lo = job * j->chunk, hi = lo + j->chunk < total ? lo + j->chunk : total;
    if (lo >= hi)
        return;
    if (j->split_rows) /* rows of C are rows of op(A): row r of A, or column r when A^T */
        blas_call(j->dbl, j->ta, j->tb, hi - lo, j->N, j->K, j->A + (j->ta ? lo : lo * j->lda) * es, j->lda,
                  j->B, j->ldb, j->beta, j->C + lo * j->ldc * es, j->ldc);
    else /* columns of C are columns of op(B): column c of B, or row c when B^T */
        blas_call(j->dbl, j->ta, j->tb, j->M, hi - lo, j->K, j->A, j->lda,
                  j->B + (j->tb ? lo * j->ldb : lo) * es, j->ldb, j->beta, j->C + lo * es, j->ldc);
}

/* Below this many multiply-adds a product is not worth waking the pool for. */
#define GEMM_SPLIT_MIN (1 << 20)
/* ...unless B alone has this many elements */
#define GEMM_WIDE_B (1 << 18)

/* How kiln__cpu_gemm cuts C[M,N] into blocks for the pool: the number of blocks into *nb
 * (1: one call on the calling thread) and the job gemm_block runs for each. The fused
 * products (cpu-fused-product.c) run the same blocks one after another on one thread,
 * which gives the same bits as the pool running them. */
static void gemm_plan(const kiln__cpu_ctx *ctx, bool dbl, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                      const void *A, int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc,
                      gemm_job *j, int *nb)
{
    int T = ctx->nthreads;
    *j = (gemm_job){dbl, ta, tb, M >= N, M, N, K, lda, ldb, ldc, 0, A, B, C, beta};
    *nb = 1;
    /* a few rows times a large B (a classifier at batch 1) is bound by reading B, not by
     * arithmetic: split it anyway, so each core streams half of it (a 1024 x 1000 layer
     * took 0.8 ms on one core) */
    bool wide_b = (double)N * (double)K >= GEMM_WIDE_B;
    if (ctx->blas_own_threads || T <= 1 || ((double)M * (double)N * (double)K < GEMM_SPLIT_MIN && !wide_b))
        return;
    int64_t total = j->split_rows ? M : N;
    /* whole register tiles per block (16 rows / columns), at most one block per worker */
    int64_t chunk = (total + T - 1) / T;
    chunk = (chunk + 15) / 16 * 16;
    j->chunk = chunk;
    *nb = (int)((total + chunk - 1) / chunk);
}

static void gemm_run(kiln__cpu_ctx *ctx, gemm_job *j, int nb, bool on_pool)
{
    if (nb <= 1)
        blas_call(j->dbl, j->ta, j->tb, j->M, j->N, j->K, j->A, j->lda, j->B, j->ldb, j->beta, j->C, j->ldc);
    else if (on_pool)
        kiln__cpu_pool_run(ctx->pool, nb, gemm_block, j);
    else
        for (int b = 0; b < nb; b++)
            gemm_block(j, b, nb);
}

void kiln__cpu_gemm(kiln__cpu_ctx *ctx, bool dbl, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A,
                    int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc)
{
    gemm_job j;
    int nb;
    gemm_plan(ctx, dbl, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, &j, &nb);
    gemm_run(ctx, &j, nb, true);
}

/* A batch of small products, a range of batches per worker (operands already laid out). */
typedef struct batch_job {
    const kiln_tdesc *out, *a, *b;
    bool dbl, ta, tb;
    int64_t M, N, K, lda, ldb, ldc;
} batch_job;

static void batch_range(void *argp, int64_t b0, int64_t b1)
{
    const batch_job *j = argp;
    int64_t es = j->dbl ? 8 : 4;
    for (int64_t bi = b0; bi < b1; bi++) {
        const char *ap = (const char *)kiln__cpu_ptr(j->a) + batch_offset(j->out, j->a, bi) * es;
        const char *bp = (const char *)kiln__cpu_ptr(j->b) + batch_offset(j->out, j->b, bi) * es;
        char *op = (char *)kiln__cpu_ptr(j->out) + batch_offset(j->out, j->out, bi) * es;
        blas_call(j->dbl, j->ta, j->tb, j->M, j->N, j->K, ap, j->lda, bp, j->ldb, 0.0, op, j->ldc);
    }
}

/* A linear layer on [batch, seq, features] (and its input gradient) multiplies every
 * batch by the same B. When A's batches are stacked rows (batch stride M * lda), that is
 * one GEMM of nbatch * M rows: B is packed once instead of per batch, and OpenBLAS gets
 * a size it threads well. */
static bool folds(const kiln_tdesc *out, const kiln_tdesc *a, const kiln_tdesc *b, int64_t nbatch, int64_t M,
                  int64_t lda, bool ta)
{
    if (ta)
        return false;
    for (int64_t bi = 0; bi < nbatch; bi++)
        if (batch_offset(out, b, bi) != batch_offset(out, b, 0) || batch_offset(out, a, bi) != bi * M * lda)
            return false;
    return true;
}

/* Attention's per-head products: too small to split, so the pool splits the batch and
 * each product is one BLAS call. */
static bool batch_split(const kiln__cpu_ctx *ctx, int64_t M, int64_t N, int64_t K)
{
    return !ctx->blas_own_threads && ctx->nthreads > 1 && (double)M * (double)N * (double)K < GEMM_SPLIT_MIN;
}

bool kiln__cpu_matmul_batches(const kiln__cpu_ctx *ctx, const kiln_tdesc *out, const kiln_tdesc *a,
                              const kiln_tdesc *b, kiln__cpu_mm_batches *mb)
{
    int nd = out->ndim;
    if (out->dtype != KILN_F32 || nd < 3)
        return false;
    int64_t M = out->shape[nd - 2], N = out->shape[nd - 1], K = a->shape[a->ndim - 1];
    int64_t nbatch = 1;
    for (int i = 0; i < nd - 2; i++)
        nbatch *= out->shape[i];
    bool ta, tb;
    int64_t lda, ldb;
    if (nbatch < 2 || M == 0 || N == 0 || K == 0 ||
        !blas_layout(M, K, a->strides[a->ndim - 2], a->strides[a->ndim - 1], &ta, &lda) ||
        !blas_layout(K, N, b->strides[b->ndim - 2], b->strides[b->ndim - 1], &tb, &ldb) ||
        folds(out, a, b, nbatch, M, lda, ta))
        return false;
    *mb = (kiln__cpu_mm_batches){.out = out,
                                 .a = a,
                                 .b = b,
                                 .ta = ta,
                                 .tb = tb,
                                 .one_call = batch_split(ctx, M, N, K),
                                 .M = M,
                                 .N = N,
                                 .K = K,
                                 .lda = lda,
                                 .ldb = ldb,
                                 .nbatch = nbatch};
    return true;
}

void kiln__cpu_matmul_batch(kiln__cpu_ctx *ctx, const kiln__cpu_mm_batches *mb, int64_t bi, float *dst)
{
    const float *ap = (const float *)kiln__cpu_ptr(mb->a) + batch_offset(mb->out, mb->a, bi);
    const float *bp = (const float *)kiln__cpu_ptr(mb->b) + batch_offset(mb->out, mb->b, bi);
    if (mb->one_call) { /* as batch_range */
        blas_call(false, mb->ta, mb->tb, mb->M, mb->N, mb->K, ap, mb->lda, bp, mb->ldb, 0.0, dst, mb->N);
        return;
    }
    gemm_job j; /* as kiln__cpu_gemm, its blocks one after another */
    int nb;
    gemm_plan(ctx, false, mb->ta, mb->tb, mb->M, mb->N, mb->K, ap, mb->lda, bp, mb->ldb, 0.0, dst, mb->N, &j, &nb);
    gemm_run(ctx, &j, nb, false);
}

/* Whether out's rows are whole (unit stride along them) and no two elements share a
 * place (its dims sorted by stride each step past the last), so BLAS can write each
 * batch's matrix in place with ldc = its row stride: the permuted outputs the fusion layer
 * folds a head-merging copy into (backends/fused/fused-group.c). */
bool kiln__cpu_matmul_rows_out(const kiln_tdesc *out)
{
    int nd = out->ndim;
    if (nd < 2 || (out->shape[nd - 1] > 1 && out->strides[nd - 1] != 1) ||
        (out->shape[nd - 2] > 1 && out->strides[nd - 2] < out->shape[nd - 1]))
        return false;
    int order[KILN_MAX_DIMS], n = 0;
    for (int d = 0; d < nd; d++)
        if (out->shape[d] > 1) {
            int k = n++;
            while (k > 0 && out->strides[order[k - 1]] > out->strides[d]) {
                order[k] = order[k - 1];
                k--;
            }
            order[k] = d;
        }
    int64_t reach = 1; /* elements the dims so far span */
    for (int k = 0; k < n; k++) {
        if (out->strides[order[k]] < reach)
            return false;
        reach = out->strides[order[k]] * out->shape[order[k]];
    }
    return true;
}

static int matmul_float(kiln__cpu_ctx *ctx, const kiln_tdesc *out, const kiln_tdesc *a,
                        const kiln_tdesc *b)
{
    bool dbl = out->dtype == KILN_F64;
    size_t es = dbl ? 8 : 4;
    int nd = out->ndim;
    int64_t M = out->shape[nd - 2], N = out->shape[nd - 1], K = a->shape[a->ndim - 1];
    int64_t nbatch = 1;
    for (int i = 0; i < nd - 2; i++)
        nbatch *= out->shape[i];
    if (M == 0 || N == 0 || nbatch == 0)
        return 0;
    if (K == 0)
        return kiln__cpu_fill(ctx, out, 0.0);
    bool contig = kiln__cpu_contig(out);
    int64_t ldc = contig || M == 1 ? N : out->strides[nd - 2];
    int64_t as_r = a->strides[a->ndim - 2], as_c = a->strides[a->ndim - 1];
    int64_t bs_r = b->strides[b->ndim - 2], bs_c = b->strides[b->ndim - 1];
    bool ta, tb;
    int64_t lda, ldb;
    bool a_ok = blas_layout(M, K, as_r, as_c, &ta, &lda);
    bool b_ok = blas_layout(K, N, bs_r, bs_c, &tb, &ldb);
    struct kiln_buffer *ha = NULL, *hb = NULL;
    char *abuf = NULL, *bbuf = NULL;
    if (!a_ok) {
        abuf = kiln__cpu_scratch_get(ctx, (size_t)(M * K) * es, &ha);
        ta = false;
        lda = K;
    }
    if (!b_ok) {
        bbuf = kiln__cpu_scratch_get(ctx, (size_t)(K * N) * es, &hb);
        tb = false;
        ldb = N;
    }
    if ((!a_ok && !abuf) || (!b_ok && !bbuf)) {
        kiln__cpu_scratch_put(ctx, ha);
        kiln__cpu_scratch_put(ctx, hb);
        return kiln__cpu_enomem("matmul");
    }
    if (nbatch > 1 && a_ok && b_ok && contig && folds(out, a, b, nbatch, M, lda, ta)) {
        M *= nbatch;
        nbatch = 1;
    }
    if (nbatch > 1 && a_ok && b_ok && batch_split(ctx, M, N, K)) {
        /* attention's per-head products: too small to split, so split the batch */
        batch_job bj = {out, a, b, dbl, ta, tb, M, N, K, lda, ldb, ldc};
        double per = (double)M * (double)N * (double)K;
        int64_t grain = per >= 65536 ? 1 : (int64_t)(65536 / (per + 1)) + 1;
        kiln__cpu_parallel_for(ctx, nbatch, grain, batch_range, &bj);
        return 0;
    }
    char *ob = kiln__cpu_ptr(out);
    for (int64_t bi = 0; bi < nbatch; bi++) {
        const char *ap = (const char *)kiln__cpu_ptr(a) + batch_offset(out, a, bi) * (int64_t)es;
        const char *bp = (const char *)kiln__cpu_ptr(b) + batch_offset(out, b, bi) * (int64_t)es;
        if (!a_ok) {
            /* copy this batch's matrix to contiguous scratch */
            kiln_tdesc src = {.buf = a->buf, .dtype = a->dtype, .ndim = 2,
                              .shape = {M, K}, .strides = {as_r, as_c}};
            src.offset = (ap - (const char *)a->buf->data) / (int64_t)es;
            struct kiln_buffer fake = {.data = abuf};
            kiln_tdesc dst;
            kiln__cpu_desc_contig(&dst, &fake, a->dtype, 2, src.shape);
            kiln__cpu_copy(ctx, &dst, &src);
            ap = abuf;
        }
        if (!b_ok) {
            kiln_tdesc src = {.buf = b->buf, .dtype = b->dtype, .ndim = 2,
                              .shape = {K, N}, .strides = {bs_r, bs_c}};
            src.offset = (bp - (const char *)b->buf->data) / (int64_t)es;
            struct kiln_buffer fake = {.data = bbuf};
            kiln_tdesc dst;
            kiln__cpu_desc_contig(&dst, &fake, b->dtype, 2, src.shape);
            kiln__cpu_copy(ctx, &dst, &src);
            bp = bbuf;
        }
        char *op = ob + batch_offset(out, out, bi) * (int64_t)es;
        kiln__cpu_gemm(ctx, dbl, ta, tb, M, N, K, ap, lda, bp, ldb, 0.0, op, ldc);
    }
    kiln__cpu_scratch_put(ctx, ha);
    kiln__cpu_scratch_put(ctx, hb);
    return 0;
}

typedef struct imm_job {
    const kiln_tdesc *out, *a, *b;
    int64_t M, N, K;
} imm_job;

/* Integer matmul: rows of all batches spread over the pool. */
static void imm_range(void *argp, int64_t r0, int64_t r1)
{
    const imm_job *j = argp;
    const kiln_tdesc *out = j->out, *a = j->a, *b = j->b;
    int nd = out->ndim;
    int64_t M = j->M, N = j->N, K = j->K;
    int64_t aes = (int64_t)kiln__cpu_esize(a->dtype), bes = (int64_t)kiln__cpu_esize(b->dtype);
    int64_t oes = (int64_t)kiln__cpu_esize(out->dtype);
    int64_t asr = a->strides[a->ndim - 2], asc = a->strides[a->ndim - 1];
    int64_t bsr = b->strides[b->ndim - 2], bsc = b->strides[b->ndim - 1];
    int64_t osr = out->strides[nd - 2], osc = out->strides[nd - 1];
    uint64_t acc[256];
    for (int64_t r = r0; r < r1; r++) {
        int64_t bi = r / M, i = r % M;
        const char *ap = (const char *)kiln__cpu_ptr(a) + (batch_offset(out, a, bi) + i * asr) * aes;
        const char *bp = (const char *)kiln__cpu_ptr(b) + batch_offset(out, b, bi) * bes;
        char *op = (char *)kiln__cpu_ptr(out) + (batch_offset(out, out, bi) + i * osr) * oes;
        for (int64_t j0 = 0; j0 < N; j0 += 256) {
            int64_t nn = N - j0 < 256 ? N - j0 : 256;
            memset(acc, 0, sizeof acc);
            for (int64_t k = 0; k < K; k++) {
                uint64_t av = (uint64_t)kiln__cpu_ldi(ap + k * asc * aes, a->dtype);
                const char *brow = bp + (k * bsr + j0 * bsc) * bes;
                for (int64_t jj = 0; jj < nn; jj++)
                    acc[jj] += av * (uint64_t)kiln__cpu_ldi(brow + jj * bsc * bes, b->dtype);
            }
            for (int64_t jj = 0; jj < nn; jj++)
                kiln__cpu_sti(op + (j0 + jj) * osc * oes, out->dtype, (int64_t)acc[jj]);
        }
    }
}

int kiln__cpu_matmul(void *vctx, const kiln_tdesc *out, const kiln_tdesc *a, const kiln_tdesc *b)
{
    kiln__cpu_ctx *ctx = vctx;
    if (out->ndim < 2 || a->ndim < 2 || b->ndim < 2)
        return kiln__error_set("cpu matmul: operands need at least 2 dims"), KILN_EINVAL;
    kiln_dtype dt = out->dtype;
    if (kiln__cpu_is_int(dt) || kiln__cpu_is_int(a->dtype)) {
        int nd = out->ndim;
        imm_job j = {out, a, b, out->shape[nd - 2], out->shape[nd - 1], a->shape[a->ndim - 1]};
        int64_t rows = kiln__cpu_numel(out) / (j.N ? j.N : 1);
        if (j.N == 0)
            return 0;
        kiln__cpu_parallel_for(ctx, rows, 1 + 65536 / (j.N * (j.K + 1)), imm_range, &j);
        return 0;
    }
    bool direct = (dt == KILN_F32 || dt == KILN_F64) && a->dtype == dt && b->dtype == dt &&
                  (kiln__cpu_contig(out) || kiln__cpu_matmul_rows_out(out));
    if (direct)
        return matmul_float(ctx, out, a, b);
    /* half types (or a strided output): compute in f32/f64 on contiguous copies */
    kiln_dtype ct = kiln__cpu_fdt(dt);
    struct kiln_buffer *ha, *hb, *ho;
    void *ap = kiln__cpu_materialize(ctx, a, ct, &ha);
    void *bp = kiln__cpu_materialize(ctx, b, ct, &hb);
    void *op = kiln__cpu_scratch_get(ctx, (size_t)kiln__cpu_numel(out) * kiln__cpu_esize(ct), &ho);
    int rc = KILN_ENOMEM;
    if (ap && bp && op) {
        struct kiln_buffer fa = {.data = ap}, fb = {.data = bp};
        kiln_tdesc ta, tb, to;
        kiln__cpu_desc_contig(&ta, &fa, ct, a->ndim, a->shape);
        kiln__cpu_desc_contig(&tb, &fb, ct, b->ndim, b->shape);
        kiln__cpu_desc_contig(&to, ho, ct, out->ndim, out->shape);
        rc = matmul_float(ctx, &to, &ta, &tb);
        if (rc == 0)
            kiln__cpu_writeback(ctx, out, op, ct);
    } else {
        kiln__cpu_enomem("matmul");
    }
    kiln__cpu_scratch_put(ctx, ha);
    kiln__cpu_scratch_put(ctx, hb);
    kiln__cpu_scratch_put(ctx, ho);
    return rc;
}
