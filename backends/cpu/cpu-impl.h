/*
 * backends/cpu/cpu-impl.h — what the files of the cpu backend share: the device
 * context (thread pool, buffer pool, the kernel table picked for this CPU), the buffer
 * layout, element load/store helpers for the generic strided paths, and the strided
 * iterator that turns any set of same-shaped operands into runs of rows.
 *
 * The shape of the backend: every entry first looks for the common contiguous case and
 * runs a tight kernel on it; everything else goes through a generic path that loads
 * elements as double (or int64 for integer dtypes, so i64 keeps all 64 bits), which is
 * slower but obviously right for any stride, including 0 and negative ones.
 */
#ifndef KILN_CPU_IMPL_H
#define KILN_CPU_IMPL_H

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "backend.h"
#include "common/half.h"
#include "error-impl.h"

/* ------------------------------------------------------------------ buffers */

struct kiln_buffer {
    void *data;          /* 64-byte aligned */
    size_t nbytes;       /* what the caller asked for */
    size_t cap;          /* the size class actually reserved */
    int cls;             /* size-class index, -1 when too large to cache */
    bool mapped;         /* came from mmap rather than aligned_alloc */
    struct kiln__cpu_chunk *chunk; /* the huge-page chunk it was carved from (cpu-alloc.c), or NULL */
    struct kiln_buffer *next; /* free-list link while cached */
    /* Set for buffer_wrap_host buffers: the memory is the caller's (a mapped file), is
     * never pooled or freed here, and goes back through release(release_ud) when the
     * caller gave one (it may be NULL: then the caller keeps it without being told). */
    bool wrapped;
    void (*release)(void *);
    void *release_ud;
    /* its address was handed out (buffer_host_ptr): its block never changes */
    bool exported;
    /* its block went back to the pool (kiln__cpu_buffer_detach): data is NULL until
     * kiln__cpu_buffer_reattach gives it one again */
    bool detached;
};

#define KILN_CPU_NCLASSES 160

/* Calls under the fusion decorator ("cpu?fusion=on") whose operands all have fewer
 * elements than this run as they are instead of starting a group (kiln_backend_caps):
 * such operands sit in L2 already, so a fused pass saves little, while recording and
 * planning cost more than the call. The ONNX test encoder (all operands small) ran
 * 0.145 ms fused without the bound, 0.132 with it, 0.113 unfused; the training steps
 * of bench/engine/fusion-bench were the same with and without it. */
#define KILN_CPU_FUSION_MIN_ELEMENTS ((int64_t)1 << 16)

/* Which convolution tile serves the layers both can (KILN_CPU_CONV): the cost model of
 * cpu-conv.c (cv_preferred), or always one of them, for tests and measurements. */
typedef enum kiln__cpu_conv_path {
    KILN__CPU_CONV_AUTO,
    KILN__CPU_CONV_PACKED,
    KILN__CPU_CONV_DIRECT,
} kiln__cpu_conv_path;

/* A convolution's elementwise epilogue as a chain: each op combines the running value v
 * with an operand and gives the next v, in order (a batch norm's (v - mean) · scale +
 * shift, a residual add, a ReLU). Applied to each tile of outputs as the convolution
 * stores it (chain_rows_f32), with the roundings of the separate ops, so the result has
 * their bits. Built from a fused program by cpu-fused-chain.c. */
typedef enum kiln__cpu_chain_code {
    KILN__CHAIN_ADD,  /* v + s */
    KILN__CHAIN_SUB,  /* v - s */
    KILN__CHAIN_RSUB, /* s - v */
    KILN__CHAIN_MUL,  /* v · s */
    KILN__CHAIN_DIV,  /* v / s */
    KILN__CHAIN_RDIV, /* s / v */
    KILN__CHAIN_RELU, /* v < 0 ? 0 : v, the unary relu's bits (NaN and -0 kept) */
} kiln__cpu_chain_code;

typedef struct kiln__cpu_chain_op {
    int code;           /* a kiln__cpu_chain_code */
    const float *full;  /* an operand laid out as the output: s = full[flat index], or NULL */
    const float *plane; /* else one value per output plane (image · channels + channel), or NULL */
    float scalar;       /* else this value */
} kiln__cpu_chain_op;

#define KILN__CHAIN_MAX_OPS 16
typedef struct kiln__cpu_chain {
    int nops;
    kiln__cpu_chain_op ops[KILN__CHAIN_MAX_OPS];
} kiln__cpu_chain;

/* Which depthwise kernel serves one-channel-per-group convolutions (KILN_CPU_DEPTHWISE):
 * channels in the vector lanes where the table has it and the layer suits it, or always
 * the per-plane kernels, for tests and measurements. */
typedef enum kiln__cpu_dw_path {
    KILN__CPU_DW_AUTO,
    KILN__CPU_DW_PLANES,
} kiln__cpu_dw_path;

/* One call of dwconv_c16_f32: a block of nc <= 16 channels of one image of a depthwise
 * convolution (one input channel and one output channel per group), 2-D, any stride,
 * padding and dilation. */
typedef struct kiln__cpu_dw16 {
    const float *x;         /* the block's first input plane (H x W); planes xstride apart */
    float *out;             /* the block's first output plane (OH x OW); planes ostride apart */
    const float *res;       /* residual laid out as out, or NULL */
    int64_t xstride, ostride;
    int64_t H, W, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw;
    const float *w;         /* [nc][KH·KW]: the block's weights */
    const float *bias;      /* nc, or NULL */
    int nc, act;            /* act: a kiln_epilogue_act, as epilogue_f32 */
    float a, b;
    float *scratch;         /* kiln__cpu_dw16_scratch(this, rows) floats, 64-byte aligned */
} kiln__cpu_dw16;

/* The transposed band's row pitch in positions: the Wp columns the outputs read plus
 * DW16_OVER·sw, what the last position group of a row may read past them (its unused
 * lanes are computed and never stored). */
#define KILN__DW16_OVER 7
static inline int64_t kiln__cpu_dw16_pitch(const kiln__cpu_dw16 *p)
{
    return (p->OW - 1) * p->sw + (p->KW - 1) * p->dw + 1 + KILN__DW16_OVER * p->sw;
}

/** Floats of scratch dwconv_c16_f32 needs for bands of up to rows output rows: the
 *  band's input rows, channels innermost, then the block's weights, taps outermost. */
static inline int64_t kiln__cpu_dw16_scratch(const kiln__cpu_dw16 *p, int64_t rows)
{
    int64_t band = (rows - 1) * p->sh + (p->KH - 1) * p->dh + 1;
    return (band * kiln__cpu_dw16_pitch(p) + p->KH * p->KW) * 16;
}

/* A 2 MiB-aligned run of huge pages that mid-size blocks are carved from (cpu-alloc.c). */
typedef struct kiln__cpu_chunk {
    void *map; /* what mmap returned (with the alignment slack) */
    size_t map_len;
    char *base;     /* the aligned start */
    size_t used;    /* bytes carved so far, from base */
    int64_t carved; /* blocks carved and not given back to the system */
    int64_t live;   /* of those, the ones handed out now */
    bool detached;  /* off the list, to be unmapped (set under the pool's lock) */
    struct kiln__cpu_chunk *next;
} kiln__cpu_chunk;

typedef struct kiln__cpu_alloc {
    pthread_mutex_t mu;
    struct kiln_buffer *free_list[KILN_CPU_NCLASSES];
    kiln__cpu_chunk *chunks; /* every chunk, the one being carved first */
    size_t cached_bytes;
    size_t max_cached_bytes;
    /* the figures kiln_device_memory_get reports, by capacity (wrapped buffers are the
     * caller's memory and not counted) */
    size_t in_use_bytes, peak_in_use_bytes;
    uint64_t system_allocs; /* blocks taken from the system (aligned_alloc or mmap) */
    uint64_t reuses;        /* allocations served from a free list */
    uint64_t refreshes;     /* blocks traded by kiln__cpu_buffer_refresh */
} kiln__cpu_alloc;

/* ------------------------------------------------------------------ threads */

typedef struct kiln__cpu_pool kiln__cpu_pool;

/** A parallel job: run chunk `job` of `njobs`. */
typedef void (*kiln__cpu_job_fn)(void *arg, int job, int njobs);
/** A range task: process elements [begin, end). */
typedef void (*kiln__cpu_range_fn)(void *arg, int64_t begin, int64_t end);

/** Inside a job of kiln__cpu_pool_run: the slot, below the pool's size, of the thread
 *  running it among the threads running that region. Jobs that run at the same time have
 *  different slots, so a region can give each thread its own scratch while keeping more
 *  jobs than threads for balance. */
int kiln__cpu_pool_slot(void);

/** A pool of nthreads (the caller included) whose idle threads poll spin_ns before sleeping. */
kiln__cpu_pool *kiln__cpu_pool_create(int nthreads, int64_t spin_ns);
void kiln__cpu_pool_destroy(kiln__cpu_pool *pool);
int kiln__cpu_pool_size(const kiln__cpu_pool *pool);
/** Run fn for job = 0..njobs-1 across the pool; returns when all are done. */
void kiln__cpu_pool_run(kiln__cpu_pool *pool, int njobs, kiln__cpu_job_fn fn, void *arg);

/* ------------------------------------------------------------------ kernels */

/* The hot f32 kernels exist three times: a portable build, an AVX2+FMA+F16C build and
 * (x86-64) an AVX-512 build; open picks one table with __builtin_cpu_supports. Strides
 * sa/sb of binary are 0 or 1. */
typedef struct kiln__cpu_kernels {
    const char *name;
    int stream_floats; /* floats per non-temporal store this table's CPU has: 16, 8 or 4 (SSE2) */
    void (*unary_f32)(int op, float *o, const float *x, int64_t n, float alpha, float beta);
    void (*binary_f32)(int op, float *o, const float *a, int64_t sa, const float *b, int64_t sb,
                       int64_t n);
    void (*f16_to_f32)(float *o, const uint16_t *x, int64_t n);
    void (*f32_to_f16)(uint16_t *o, const float *x, int64_t n);
    void (*softmax_row_f32)(float *o, const float *x, int64_t n, bool want_log);
    void (*layer_norm_row_f32)(float *o, const float *x, int64_t n, const float *w, const float *b,
                               double eps, double *mean, double *rstd);
    /* 2x2 stride-2 max pool over one output row: reads two input rows of width 2*ow. */
    void (*maxpool2x2_row_f32)(float *o, const float *r0, const float *r1, int64_t ow);
    /* The same with each maximum's flat in-plane index: the row pair starts at in-plane
     * index base, rows are w wide; the generic loop's rule (first maximum, NaN wins). */
    void (*maxpool2x2_idx_row_f32)(float *o, int64_t *ix, const float *r0, const float *r1, int64_t ow,
                                   int64_t base, int64_t w);
    /* Direct stride-1 convolution tile (cpu-conv.c): with TO = conv_tile_o and TQ =
     * conv_tile_q, tile[TO][TQ] = for output channels j < TO and positions q < nq <= TQ
     * of the padded grid, the sum over c < C and k < nk of
     * wpack[(c·nk + k)·TO + j] · x[c·cstride + offs[k] + q]. NULL in tables without it;
     * TO <= 8 and TQ <= 48 always. */
    void (*conv_tile_f32)(float *tile, const float *x, int64_t cstride, int64_t C,
                          const int64_t *offs, int64_t nk, const float *wpack, int nq);
    /* The same sums with channel j's weights read in place from w + j·wrs, (c, k) at
     * c·nk + k (an [O, C, KH, KW] tensor needs no packing), and rows j < nrows stored
     * at out + j·ostride, plus bias[j] when bias is not NULL, in their first nq lanes
     * only, then res[j·ostride + i] added (res optional) and the activation act (a
     * kiln_epilogue_act, as epilogue_f32) applied. Present with conv_tile_f32. */
    void (*conv_tile_rows_f32)(float *out, int64_t ostride, const float *bias, int nrows, const float *x,
                               int64_t cstride, int64_t C, const int64_t *offs, int64_t nk, const float *w,
                               int64_t wrs, int nq, const float *res, int act, float alpha, float beta);
    /* conv_tile_rows_f32's sums stored through chain instead of res and act, in
     * registers: row j is output plane plane + j, at flat index at + j·ostride. NULL in
     * tables without it (the caller runs chain_rows_f32 over the stored tile). */
    void (*conv_tile_rows_chain_f32)(float *out, int64_t ostride, const float *bias, int nrows, const float *x,
                                     int64_t cstride, int64_t C, const int64_t *offs, int64_t nk, const float *w,
                                     int64_t wrs, int nq, const kiln__cpu_chain *chain, int64_t at, int64_t plane);
    int conv_tile_o, conv_tile_q;
    /* The channel-vectorized tile (cpu-conv.c, packed path): for CV_NP = 14 positions
     * whose input offsets are pos[i] and 32 output channels, the sum over c < C and
     * k < nk of wpack[(c·nk + k)·32 + j] · x[c·cstride + offs[k] + pos[i]]. Output
     * channels sit in the vector lanes and positions are broadcast, so any set of
     * positions (the real outputs of a 7x7 map, nothing of the padded grid) fills the
     * tile. Channel j < jn, position i < nq is stored at out[j·ostride + i] as
     * act(sum + bias[j] + res[j·ostride + i]) (bias, res optional; act as epilogue_f32).
     * NULL in tables without it. */
    void (*cvconv_f32)(float *out, const float *res, int64_t ostride, int nq, int jn, const float *bias, int act,
                       float a, float b, const float *x, int64_t cstride, int64_t C, const int64_t *offs,
                       int64_t nk, const int64_t *pos, const float *wpack);
    /* A fused epilogue over n consecutive outputs (kiln_epilogue): o[i] = act(o[i] +
     * bias[i] + res[i]), bias and res optional, act a kiln_epilogue_act with its alpha
     * and beta. In every table. */
    void (*epilogue_f32)(float *o, const float *res, const float *bias, int64_t n, int act, float alpha,
                         float beta);
    /* A tile's run into its plane in one pass: o[i] = act((src[i] + bias) + res[i]), res
     * optional, with the roundings of a bias add followed by epilogue_f32. In every table. */
    void (*bias_act_f32)(float *o, const float *src, int64_t n, float bias, const float *res, int act, float alpha,
                         float beta);
    /* Rows r < rows of n outputs through chain c: o[r·ld + i] = chain(src[r·sld + i] +
     * bias[r]) (no add without bias; src may be o itself). Row r is output plane
     * plane + r, its first element at flat index at + r·ld (where full operands are
     * read). In every table. */
    void (*chain_rows_f32)(float *o, int64_t ld, const float *src, int64_t sld, const float *bias, int rows,
                           int64_t n, const kiln__cpu_chain *c, int64_t at, int64_t plane);
    /* One output plane of a depthwise convolution (cpu-conv.c): out[oh·OW + ow] =
     * act(bias + sum over k < nk of w[k] · xg[offs[k] + oh·Wg + ow] + res[oh·OW + ow]),
     * the taps added in k order with one rounding each, res optional, act as
     * epilogue_f32; xg readable up to max(offs) + OH·Wg (the caller pads it). In every
     * table. */
    void (*dwconv_plane_f32)(float *out, const float *res, const float *xg, int64_t Wg, int64_t OH, int64_t OW,
                             const int64_t *offs, const float *w, int64_t nk, float bias, int act, float a,
                             float b);
    /* The same plane for stride 1, read from the unpadded H x W input x with padding
     * (ph, pw) and dilation (dh, dw), the taps in (kh, kw) order: the bits
     * dwconv_plane_f32 gives on the padded grid. KW <= dwconv_s1_maxk; NULL in tables
     * without it. */
    void (*dwconv_s1_f32)(float *out, const float *res, const float *x, int64_t H, int64_t W, int64_t OH,
                          int64_t OW, int64_t KH, int64_t KW, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                          const float *w, float bias, int act, float a, float b);
    int64_t dwconv_s1_maxk;
    /* Output rows [oh0, oh1) of a block of channels (kiln__cpu_dw16): out[c][oh][ow] =
     * act(bias[c] + sum over (kh, kw) in that order of w[c][kh·KW + kw] · X(c, oh·sh +
     * kh·dh - ph, ow·sw + kw·dw - pw) + res[c][oh][ow]), X zero outside the plane: the
     * bits of dwconv_plane_f32. The input rows the band reads are transposed into the
     * scratch with the channels innermost, so each multiply-add serves 16 channels of
     * one position, whatever the plane's width. NULL in tables without it. */
    void (*dwconv_c16_f32)(const kiln__cpu_dw16 *p, int64_t oh0, int64_t oh1);
    /* One input row of W floats into the two column phases of a stride-2 padded grid
     * (cpu-conv.c): ph0[j] = X(2j - pw), ph1[j] = X(2j + 1 - pw) for j < Wg, X(w) =
     * src[w] for 0 <= w < W and 0 elsewhere. NULL in tables without it. */
    void (*pad_row_s2_f32)(float *ph0, float *ph1, const float *src, int64_t W, int64_t pw, int64_t Wg);
    /* The sum of a contiguous run, and the sum of its squared deviations from c, both in
     * double over eight lanes in a fixed order, so every table gives the same bits
     * (cpu-reduce.c's f32 path). In every table. */
    double (*sum_run_f32)(const float *x, int64_t n);
    double (*sqdev_run_f32)(const float *x, int64_t n, double c);
    /* s[i] += x[a·ld + i] for rows a = 0 .. rows - 1 in order and i < m: a sum over leading
     * dims, each column's adds in row order (the same bits in every table). In every table. */
    void (*colsum_f32)(double *s, const float *x, int64_t rows, int64_t ld, int64_t m);
    /* o[j] = (a[j·sa] op b[j·sb]) ? 1 : 0 for a comparison op (KILN_BINARY_EQ..GE), and
     * o[j] = c[j·sc] != 0 ? a[j·sa] : b[j·sb] (the bits of a or b); strides 0 or 1
     * (cpu-kernels-select.inc). In every table. */
    void (*compare_f32)(int op, float *o, const float *a, int64_t sa, const float *b, int64_t sb, int64_t n);
    void (*where_f32)(float *o, const float *c, int64_t sc, const float *a, int64_t sa, const float *b, int64_t sb,
                      int64_t n);
    /* o[0, n) = v (+0 by memset). In every table. */
    void (*fill_f32)(float *o, float v, int64_t n);
    /* u[i] = kiln_rng_uniform01(counter + i, seed) for i < n (common/philox.h's stream,
     * bit for bit), many counters at once so the multiplies vectorize. In every table. */
    void (*philox_u01)(double *u, uint64_t counter, uint64_t seed, int64_t n);
} kiln__cpu_kernels;

extern const kiln__cpu_kernels kiln__cpu_kernels_base;
#if defined(__x86_64__)
extern const kiln__cpu_kernels kiln__cpu_kernels_avx2;
extern const kiln__cpu_kernels kiln__cpu_kernels_avx512;
#endif

/* ------------------------------------------------------------------ context */

typedef struct kiln__cpu_ctx {
    kiln__cpu_pool *pool;
    kiln__cpu_alloc alloc;
    const kiln__cpu_kernels *k;
    int nthreads;
    bool blas_own_threads;   /* KILN_CPU_BLAS=openblas: OpenBLAS threads each call itself */
    int conv_path;           /* KILN_CPU_CONV: a kiln__cpu_conv_path */
    int dw_path;             /* KILN_CPU_DEPTHWISE: a kiln__cpu_dw_path */
    bool jit;                /* KILN_CPU_JIT: fused groups may be compiled (cpu-fused-jit.c) */
} kiln__cpu_ctx;

/** C[M,N] = op(A) op(B) + beta C, row-major, f32 (dbl false) or f64 (cpu-gemm.c): large
 *  products split over the pool in blocks of rows or columns, one single-threaded BLAS
 *  call per block; small ones run on the calling thread. */
void kiln__cpu_gemm(kiln__cpu_ctx *ctx, bool dbl, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                    const void *A, int64_t lda, const void *B, int64_t ldb, double beta, void *C,
                    int64_t ldc);

/* A batched f32 product as kiln__cpu_matmul computes it: batch by batch, each batch's
 * product depending on that batch's operands alone (cpu-gemm.c). */
typedef struct kiln__cpu_mm_batches {
    const kiln_tdesc *out, *a, *b; /* out: only its shape is read */
    bool ta, tb;
    bool one_call; /* each batch one BLAS call (the pool splits the batch), else kiln__cpu_gemm's blocks */
    int64_t M, N, K, lda, ldb, nbatch;
} kiln__cpu_mm_batches;

/* Whether a matmul's f32/f64 out with unit stride along its rows and no two elements in
 * one place is written in place (ldc its row stride) rather than through scratch. */
bool kiln__cpu_matmul_rows_out(const kiln_tdesc *out);
/** Whether kiln__cpu_matmul computes out = a @ b (f32, out contiguous) batch by batch,
 *  without copying operands or folding the batches into one GEMM: then *mb says how. */
bool kiln__cpu_matmul_batches(const kiln__cpu_ctx *ctx, const kiln_tdesc *out, const kiln_tdesc *a,
                              const kiln_tdesc *b, kiln__cpu_mm_batches *mb);
/** Batch bi of mb into dst (M x N contiguous) on the calling thread: the very BLAS calls
 *  kiln__cpu_matmul makes for that batch, so the same bits. */
void kiln__cpu_matmul_batch(kiln__cpu_ctx *ctx, const kiln__cpu_mm_batches *mb, int64_t bi, float *dst);

/* Buffers (cpu-alloc.c). */
void kiln__cpu_alloc_init(kiln__cpu_alloc *a, size_t max_cached_bytes);
void kiln__cpu_alloc_fini(kiln__cpu_alloc *a);
struct kiln_buffer *kiln__cpu_buffer_get(kiln__cpu_ctx *ctx, size_t nbytes);
void kiln__cpu_buffer_put(kiln__cpu_ctx *ctx, struct kiln_buffer *b);
/* b's contents are about to be overwritten whole and are read by nothing before: b trades
 * its block for the one parked last in its size class (the most recently used memory, so
 * the likeliest to be in the caches), which parks b's block instead. Nothing for a
 * buffer that is wrapped, exported, too large to pool, or alone in its class. */
void kiln__cpu_buffer_refresh(kiln__cpu_ctx *ctx, struct kiln_buffer *b);
/** Hand b's block back to the pool while b stays a valid handle (the fusion decorator's
 *  dead intermediates: freed while their group is pending, never read or written by it);
 *  false, keeping the block, for a buffer that is wrapped or exported, or when no record
 *  for the block could be allocated. */
bool kiln__cpu_buffer_detach(kiln__cpu_ctx *ctx, struct kiln_buffer *b);
/** Give detached b a block of its size again (contents undefined): 0, or KILN_ENOMEM. */
int kiln__cpu_buffer_reattach(kiln__cpu_ctx *ctx, struct kiln_buffer *b);
/** Release parked buffers, largest first, until at least bytes are gone; returns how many. */
size_t kiln__cpu_alloc_trim(kiln__cpu_ctx *ctx, size_t bytes);
/** The pool's figures (kiln_device_memory_get). */
void kiln__cpu_alloc_figures(kiln__cpu_ctx *ctx, kiln_device_memory *out);
/** The peak in use starts again from what is in use now (kiln_device_memory_reset_peak). */
void kiln__cpu_alloc_reset_peak(kiln__cpu_ctx *ctx);
/** Scratch memory from the pool (64-byte aligned); release with kiln__cpu_scratch_put. */
void *kiln__cpu_scratch_get(kiln__cpu_ctx *ctx, size_t nbytes, struct kiln_buffer **handle);
void kiln__cpu_scratch_put(kiln__cpu_ctx *ctx, struct kiln_buffer *handle);

/** Split [0, n) into chunks of at least grain elements and run them on the pool. */
void kiln__cpu_parallel_for(kiln__cpu_ctx *ctx, int64_t n, int64_t grain, kiln__cpu_range_fn fn,
                            void *arg);

/* ------------------------------------------------------------------ descriptors */

static inline size_t kiln__cpu_esize(kiln_dtype dt)
{
    switch (dt) {
    case KILN_F64: case KILN_I64: return 8;
    case KILN_F32: case KILN_I32: return 4;
    case KILN_F16: case KILN_BF16: return 2;
    default: return 1;
    }
}

static inline bool kiln__cpu_is_int(kiln_dtype dt)
{
    return dt == KILN_I64 || dt == KILN_I32 || dt == KILN_U8 || dt == KILN_BOOL;
}

static inline int64_t kiln__cpu_numel(const kiln_tdesc *d)
{
    int64_t n = 1;
    for (int i = 0; i < d->ndim; i++)
        n *= d->shape[i];
    return n;
}

static inline bool kiln__cpu_contig(const kiln_tdesc *d)
{
    int64_t s = 1;
    for (int i = d->ndim - 1; i >= 0; i--) {
        if (d->shape[i] != 1 && d->strides[i] != s)
            return false;
        s *= d->shape[i];
    }
    return true;
}

/** Address of element 0 of the view (offset applied). */
static inline void *kiln__cpu_ptr(const kiln_tdesc *d)
{
    return (char *)d->buf->data + d->offset * (int64_t)kiln__cpu_esize(d->dtype);
}

/* ------------------------------------------------------------------ scalar access */

static inline double kiln__cpu_ld(const void *p, kiln_dtype dt)
{
    switch (dt) {
    case KILN_F32: return *(const float *)p;
    case KILN_F64: return *(const double *)p;
    case KILN_F16: return kiln_f16_to_f32(*(const uint16_t *)p);
    case KILN_BF16: return kiln_bf16_to_f32(*(const uint16_t *)p);
    case KILN_I64: return (double)*(const int64_t *)p;
    case KILN_I32: return *(const int32_t *)p;
    case KILN_U8: return *(const uint8_t *)p;
    default: return *(const uint8_t *)p != 0;
    }
}

/** Float to integer: truncate toward zero, NaN gives 0, out-of-range saturates at
 *  int64 and then wraps to the narrower type as a C cast from int64 does. */
static inline int64_t kiln__cpu_d2i(double v)
{
    if (v != v)
        return 0;
    if (v >= 9.2233720368547758e18)
        return INT64_MAX;
    if (v <= -9.2233720368547758e18)
        return INT64_MIN;
    return (int64_t)v;
}

static inline int64_t kiln__cpu_ldi(const void *p, kiln_dtype dt)
{
    switch (dt) {
    case KILN_I64: return *(const int64_t *)p;
    case KILN_I32: return *(const int32_t *)p;
    case KILN_U8: return *(const uint8_t *)p;
    case KILN_BOOL: return *(const uint8_t *)p != 0;
    default: return kiln__cpu_d2i(kiln__cpu_ld(p, dt));
    }
}

static inline void kiln__cpu_sti(void *p, kiln_dtype dt, int64_t v)
{
    switch (dt) {
    case KILN_I64: *(int64_t *)p = v; break;
    case KILN_I32: *(int32_t *)p = (int32_t)(uint32_t)(uint64_t)v; break;
    case KILN_U8: *(uint8_t *)p = (uint8_t)(uint64_t)v; break;
    case KILN_BOOL: *(uint8_t *)p = v != 0; break;
    case KILN_F32: *(float *)p = (float)v; break;
    case KILN_F64: *(double *)p = (double)v; break;
    case KILN_F16: *(uint16_t *)p = kiln_f32_to_f16((float)v); break;
    default: *(uint16_t *)p = kiln_f32_to_bf16((float)v); break;
    }
}

static inline void kiln__cpu_st(void *p, kiln_dtype dt, double v)
{
    switch (dt) {
    case KILN_F32: *(float *)p = (float)v; break;
    case KILN_F64: *(double *)p = v; break;
    case KILN_F16: *(uint16_t *)p = kiln_f32_to_f16((float)v); break;
    case KILN_BF16: *(uint16_t *)p = kiln_f32_to_bf16((float)v); break;
    case KILN_BOOL: *(uint8_t *)p = v != 0; break;
    default: kiln__cpu_sti(p, dt, kiln__cpu_d2i(v)); break;
    }
}

/* ------------------------------------------------------------------ lines along a dim */

/** Number of lines along dim (product of the other dims). */
static inline int64_t kiln__cpu_nlines(const kiln_tdesc *d, int dim)
{
    int64_t n = 1;
    for (int i = 0; i < d->ndim; i++)
        if (i != dim)
            n *= d->shape[i];
    return n;
}

/** Element offset (relative to the view's start) of line l along dim, the other dims
 *  taken in row-major order. Two descriptors with the same shape outside dim agree on
 *  which line is l. */
static inline int64_t kiln__cpu_line_offset(const kiln_tdesc *d, int dim, int64_t l)
{
    int64_t off = 0;
    for (int i = d->ndim - 1; i >= 0; i--) {
        if (i == dim)
            continue;
        int64_t n = d->shape[i];
        off += (l % n) * d->strides[i];
        l /= n;
    }
    return off;
}

/* ------------------------------------------------------------------ strided iteration */

#define KILN_CPU_MAXOPS 4

/** Same-shaped operands (op 0 gives the shape), dims of size 1 dropped and adjacent
 *  dims merged where every operand allows, so contiguous operands become one row. */
typedef struct kiln__cpu_iter {
    int nops;
    int ndim;
    int64_t numel;
    int64_t shape[KILN_MAX_DIMS];
    int64_t stride[KILN_CPU_MAXOPS][KILN_MAX_DIMS]; /* elements */
    char *base[KILN_CPU_MAXOPS];
    size_t esize[KILN_CPU_MAXOPS];
} kiln__cpu_iter;

/** A run of n elements; ptrs[i] advance by strides[i] elements (times esize). */
typedef void (*kiln__cpu_row_fn)(void *arg, char *const *ptrs, const int64_t *strides, int64_t n);

void kiln__cpu_iter_init(kiln__cpu_iter *it, int nops, const kiln_tdesc *const *ops);
/** Run fn over every row of the iteration, threaded when numel >= 2 * grain. */
void kiln__cpu_iter_run(kiln__cpu_ctx *ctx, const kiln__cpu_iter *it, int64_t grain,
                        kiln__cpu_row_fn fn, void *arg);

/** A contiguous copy of d converted to dtype want (f32 or f64), or d's own memory when it
 *  already is one. *handle is set when scratch was taken (release it after use). */
void *kiln__cpu_materialize(kiln__cpu_ctx *ctx, const kiln_tdesc *d, kiln_dtype want,
                            struct kiln_buffer **handle);
/** Write contiguous data of dtype have into the (possibly strided) view out. */
void kiln__cpu_writeback(kiln__cpu_ctx *ctx, const kiln_tdesc *out, const void *src, kiln_dtype have);
/** A contiguous descriptor of the given shape over scratch memory. */
void kiln__cpu_desc_contig(kiln_tdesc *d, struct kiln_buffer *buf, kiln_dtype dt, int ndim,
                           const int64_t *shape);

/** The compute dtype for float-only ops: f64 stays f64, everything else computes in f32. */
static inline kiln_dtype kiln__cpu_fdt(kiln_dtype dt) { return dt == KILN_F64 ? KILN_F64 : KILN_F32; }

/* ------------------------------------------------------------------ entries */

int kiln__cpu_fill(void *ctx, const kiln_tdesc *out, double value);
int kiln__cpu_arange(void *ctx, const kiln_tdesc *out, double start, double step);
int kiln__cpu_copy(void *ctx, const kiln_tdesc *out, const kiln_tdesc *in);
int kiln__cpu_rng(void *ctx, kiln_rng_kind kind, const kiln_tdesc *out, uint64_t seed,
                  uint64_t offset, double p0, double p1);
int kiln__cpu_unary(void *ctx, kiln_unary_op op, const kiln_tdesc *out, const kiln_tdesc *in,
                    double alpha, double beta);
int kiln__cpu_binary(void *ctx, kiln_binary_op op, const kiln_tdesc *out, const kiln_tdesc *a,
                     const kiln_tdesc *b);
int kiln__cpu_where(void *ctx, const kiln_tdesc *out, const kiln_tdesc *cond, const kiln_tdesc *a,
                    const kiln_tdesc *b);
int kiln__cpu_reduce(void *ctx, kiln_reduce_op op, const kiln_tdesc *out, const kiln_tdesc *in,
                     uint32_t mask, double param);
int kiln__cpu_arg_reduce(void *ctx, bool is_max, const kiln_tdesc *out, const kiln_tdesc *in, int dim);
int kiln__cpu_cumsum(void *ctx, const kiln_tdesc *out, const kiln_tdesc *in, int dim);
int kiln__cpu_sort(void *ctx, const kiln_tdesc *values, const kiln_tdesc *indices,
                   const kiln_tdesc *in, int dim, bool descending);
int kiln__cpu_gather(void *ctx, const kiln_tdesc *out, const kiln_tdesc *in, int dim,
                     const kiln_tdesc *index);
int kiln__cpu_scatter(void *ctx, const kiln_tdesc *out, int dim, const kiln_tdesc *index,
                      const kiln_tdesc *src, bool accumulate);
int kiln__cpu_index_check(void *ctx, const kiln_tdesc *index, int64_t lo, int64_t hi, const char *op,
                          const char *noun);
int kiln__cpu_index_select(void *ctx, const kiln_tdesc *out, const kiln_tdesc *in, int dim,
                           const kiln_tdesc *index);
int kiln__cpu_index_add(void *ctx, const kiln_tdesc *out, int dim, const kiln_tdesc *index,
                        const kiln_tdesc *src);
int kiln__cpu_matmul(void *ctx, const kiln_tdesc *out, const kiln_tdesc *a, const kiln_tdesc *b);
int kiln__cpu_conv_fused(void *ctx, const kiln_conv_params *p, const kiln_tdesc *out, const kiln_tdesc *x,
                         const kiln_tdesc *w, const kiln_tdesc *wpacked, const kiln_tdesc *bias,
                         const kiln_epilogue *ep);
/* The convolution with chain applied to its outputs as they are stored (f32 only): the
 * fused path's convolution epilogue (cpu-fused-product.c). */
int kiln__cpu_conv_chain(kiln__cpu_ctx *ctx, const kiln_conv_params *p, const kiln_tdesc *out, const kiln_tdesc *x,
                         const kiln_tdesc *w, const kiln_tdesc *bias, const kiln__cpu_chain *chain);
int64_t kiln__cpu_conv_pack_size(void *ctx, const kiln_conv_params *p, const kiln_tdesc *x, const kiln_tdesc *w);
int kiln__cpu_conv_pack(void *ctx, const kiln_tdesc *packed, const kiln_tdesc *w);
int kiln__cpu_epilogue(void *ctx, const kiln_tdesc *out, const kiln_epilogue *ep);
int kiln__cpu_rnn(void *ctx, const kiln_rnn_params *p, const kiln_rnn_operands *o);
int kiln__cpu_fused_run(void *ctx, const kiln_fused_program *p);
int64_t kiln__cpu_rnn_pack_size(void *ctx, const kiln_rnn_params *p);
int kiln__cpu_rnn_pack_weights(void *ctx, const kiln_rnn_params *p, const kiln_tdesc *packed, const kiln_tdesc *w,
                               const kiln_tdesc *r);
/** The products of a fused LSTM/GRU layer (cpu-rnn-dot.c) run over weights transposed into
 *  column panels: a matrix M [N, K] (R or W as ONNX stores them, one row per gate unit)
 *  becomes ceil(N / RNN_PANEL) panels of K rows of RNN_PANEL floats, panel p row k column
 *  c holding M[p·RNN_PANEL + c][k] (zero past N). _panels_size is that length in floats,
 *  _pack writes it. _dot_ok: whether the device's kernel table has the recurrent product
 *  for that many rows; _dot: g[b·ldg + j] = the sum over k < K of h[b·ldh + k] · M[j][k],
 *  b < bn, j < N, from the panels P (only when _dot_ok said yes). */
#define RNN_PANEL 64
bool kiln__cpu_rnn_dot_ok(const kiln__cpu_ctx *ctx, int64_t rows);
int64_t kiln__cpu_rnn_panels_size(int64_t N, int64_t K);
void kiln__cpu_rnn_pack(const kiln__cpu_ctx *ctx, const float *M, int64_t N, int64_t K, float *P);
void kiln__cpu_rnn_dot(const kiln__cpu_ctx *ctx, const float *P, int64_t N, int64_t K, const float *h, int64_t ldh,
                       int64_t bn, float *g, int64_t ldg);
/** out[m·ldo + j] = init[j] (0 when NULL) + the sum over k < K of x[m·K + k] · W[j][k],
 *  m < M, j < N: a layer's input projections over W's panels, only where _project_ok says
 *  the device's table has a kernel for it that beats BLAS (AVX-512). */
bool kiln__cpu_rnn_project_ok(const kiln__cpu_ctx *ctx);
void kiln__cpu_rnn_project(const kiln__cpu_ctx *ctx, const float *WP, int64_t N, int64_t K, const float *x,
                           int64_t M, float *out, int64_t ldo, const float *init);
int kiln__cpu_conv(void *ctx, const kiln_conv_params *p, const kiln_tdesc *out, const kiln_tdesc *x,
                   const kiln_tdesc *w, const kiln_tdesc *bias);
int kiln__cpu_conv_backward_input(void *ctx, const kiln_conv_params *p, const kiln_tdesc *grad_x,
                                  const kiln_tdesc *grad_out, const kiln_tdesc *w);
int kiln__cpu_conv_backward_weight(void *ctx, const kiln_conv_params *p, const kiln_tdesc *grad_w,
                                   const kiln_tdesc *x, const kiln_tdesc *grad_out);
int kiln__cpu_pooling(void *ctx, const kiln_pool_params *p, const kiln_tdesc *out,
                   const kiln_tdesc *indices, const kiln_tdesc *x);
int kiln__cpu_pooling_backward(void *ctx, const kiln_pool_params *p, const kiln_tdesc *grad_x,
                            const kiln_tdesc *grad_out, const kiln_tdesc *indices);
int kiln__cpu_adaptive_avg_pool(void *ctx, int nspatial, const kiln_tdesc *out, const kiln_tdesc *x);
int kiln__cpu_adaptive_avg_pool_backward(void *ctx, int nspatial, const kiln_tdesc *grad_x,
                                         const kiln_tdesc *grad_out);
int kiln__cpu_interpolate(void *ctx, kiln_interp_mode mode, bool align_corners,
                          const kiln_tdesc *out, const kiln_tdesc *x);
int kiln__cpu_interpolate_backward(void *ctx, kiln_interp_mode mode, bool align_corners,
                                   const kiln_tdesc *grad_x, const kiln_tdesc *grad_out);
int kiln__cpu_pad(void *ctx, kiln_pad_mode mode, const kiln_tdesc *out, const kiln_tdesc *in,
                  const int64_t *pads, double value);
int kiln__cpu_adam_step(void *ctx, const kiln_adam_params *p, const kiln_tdesc *param,
                        const kiln_tdesc *grad, const kiln_tdesc *exp_avg, const kiln_tdesc *exp_avg_sq,
                        const kiln_tdesc *max_exp_avg_sq);
int kiln__cpu_softmax(void *ctx, bool want_log, const kiln_tdesc *out, const kiln_tdesc *in, int dim);
int kiln__cpu_layer_norm(void *ctx, const kiln_tdesc *out, const kiln_tdesc *mean,
                         const kiln_tdesc *rstd, const kiln_tdesc *x, const kiln_tdesc *weight,
                         const kiln_tdesc *bias, int64_t inner, double eps);

/** Report an allocation failure for op and return KILN_ENOMEM. */
static inline int kiln__cpu_enomem(const char *op)
{
    return kiln__error_set_code(KILN_ENOMEM, "cpu %s: out of memory", op);
}

#endif /* KILN_CPU_IMPL_H */
