/*
 * backends/cpu/cpu-rnn.c — one LSTM or GRU layer in one call (the rnn entry of
 * backends/backend.h), for inference.
 *
 * Composed from tensor ops, a layer of T steps costs a dozen ops a step, each allocating
 * its result and most of them too small to be worth a thread: for a 64-unit GRU that
 * bookkeeping was nearly all the time. Here:
 *  - the input projections of every step are made up front, x·Wᵀ for all T·B rows of a
 *    direction at once, starting from the biases that do not meet the recurrence (the
 *    vector kernels of cpu-rnn-dot.c over Wᵀ on AVX-512, sgemm elsewhere);
 *  - each step is one product of the hidden state with Rᵀ (two for a GRU whose reset gate
 *    applies before the product), over Rᵀ made once per call where the device has the
 *    kernel (cpu-rnn-dot.c), into per-job scratch, then the gate arithmetic row by row,
 *    sigmoid and tanh through the device's vector kernels; the scratch is taken once per
 *    call, never per step;
 *  - a large layer runs its directions at the same time, and spreads its batch rows over
 *    threads left over (rows never interact); a small one stays on the calling thread,
 *    where a parallel region would cost more than the layer.
 * The arithmetic is ONNX's (onnx.ai LSTM and GRU), gate for gate, in f32.
 */
#include <stdlib.h>

#include "cpu-impl.h"

/* Multiply-adds per direction (projections and recurrence) from which the directions and
 * batch rows are spread over the pool: about 0.1 ms of work on one core. */
#define RNN_PARALLEL_MIN (4.0 * 1024 * 1024)
/* ...and those of one step's product from which a lone direction splits it by columns. */
#define RNN_STEP_SPLIT_MIN (256.0 * 1024)

typedef struct rnn_job {
    kiln__cpu_ctx *ctx;
    const kiln_rnn_params *p;
    int G, nbc;                 /* gates; batch chunks per direction */
    int64_t bchunk;             /* rows per chunk */
    float *xw;                  /* [T·B, D·G·H]: input projections plus biases */
    const float *x, *w, *bias;  /* the operands */
    bool project_in_job;        /* each job makes its direction's xw first */
    bool use_dot;               /* the step's product over Rᵀ in job scratch (cpu-rnn-dot.c) */
    bool split_cols;            /* one job on the calling thread: its products may use the pool */
    const float *r, *rbn;       /* [D, G·H, H]; GRU linear_before_reset: Rbh per direction, [D, H] */
    const float *peep, *h0, *c0;
    float *y, *yh, *yc;
    float *scratch;             /* per job: job_floats */
    int64_t job_floats;
} rnn_job;

static inline void clip_run(float *v, int64_t n, float clip)
{
    if (clip > 0)
        for (int64_t i = 0; i < n; i++)
            v[i] = v[i] > clip ? clip : v[i] < -clip ? -clip : v[i];
}

/* One LSTM row: g holds h·Rᵀ for this row, x its input projection with both biases. */
static void lstm_row(const kiln__cpu_kernels *k, float *g, const float *x, float *h, float *c, const float *peep,
                     float *tmp, int64_t H, float clip)
{
    int64_t G = 4 * H;
    for (int64_t j = 0; j < G; j++)
        g[j] += x[j];
    if (peep)
        for (int64_t j = 0; j < H; j++) {
            g[j] += peep[j] * c[j];              /* i */
            g[2 * H + j] += peep[2 * H + j] * c[j]; /* f */
        }
    clip_run(g, G, clip);
    k->unary_f32(KILN_UNARY_SIGMOID, g, g, peep ? H : 3 * H, 0, 0);
    if (peep)
        k->unary_f32(KILN_UNARY_SIGMOID, g + 2 * H, g + 2 * H, H, 0, 0);
    k->unary_f32(KILN_UNARY_TANH, g + 3 * H, g + 3 * H, H, 0, 0);
    for (int64_t j = 0; j < H; j++)
        c[j] = g[2 * H + j] * c[j] + g[j] * g[3 * H + j];
    if (peep) {
        for (int64_t j = 0; j < H; j++)
            g[H + j] += peep[H + j] * c[j];     /* o sees the new cell */
        clip_run(g + H, H, clip);
        k->unary_f32(KILN_UNARY_SIGMOID, g + H, g + H, H, 0, 0);
    }
    k->unary_f32(KILN_UNARY_TANH, tmp, c, H, 0, 0);
    for (int64_t j = 0; j < H; j++)
        h[j] = g[H + j] * tmp[j];
}

/* The z and r gates of a GRU row: g[0, 2H) += x, clipped, sigmoid. */
static void gru_zr(const kiln__cpu_kernels *k, float *g, const float *x, int64_t H, float clip)
{
    for (int64_t j = 0; j < 2 * H; j++)
        g[j] += x[j];
    clip_run(g, 2 * H, clip);
    k->unary_f32(KILN_UNARY_SIGMOID, g, g, 2 * H, 0, 0);
}

/* h = (1 - z) n + z h, written as n + z (h - n); n = tanh(pre), pre in g[2H, 3H). */
static void gru_finish(const kiln__cpu_kernels *k, float *g, float *h, int64_t H, float clip)
{
    float *n = g + 2 * H;
    clip_run(n, H, clip);
    k->unary_f32(KILN_UNARY_TANH, n, n, H, 0, 0);
    for (int64_t j = 0; j < H; j++)
        h[j] = n[j] + g[j] * (h[j] - n[j]);
}

/* Direction d's biases that do not meet the recurrence, into row: Wb + Rb for every gate,
 * but for a GRU with linear_before_reset only Wbh on its h gate (Rbh goes inside r's
 * product). */
static void fold_bias(const rnn_job *J, int d, float *row)
{
    const kiln_rnn_params *p = J->p;
    int64_t GH = J->G * p->hidden, H = p->hidden;
    const float *wb = J->bias + d * 2 * GH, *rb = wb + GH;
    bool lbr = p->cell == KILN_RNN_GRU && p->linear_before_reset;
    for (int64_t j = 0; j < GH; j++)
        row[j] = wb[j] + (lbr && j >= 2 * H ? 0.0f : rb[j]);
}

/* Rows [r0, r1) of direction d's input projections: x·W_dᵀ plus the folded biases, with
 * the vector kernel over Wᵀ where the device has one that beats BLAS, else sgemm onto rows
 * holding the biases. */
static void project(const rnn_job *J, int d, int64_t r0, int64_t r1)
{
    const kiln_rnn_params *p = J->p;
    int64_t GH = J->G * p->hidden, ld = p->ndir * GH, In = p->input;
    float *xw = J->xw + r0 * ld + d * GH;
    const float *W = J->w + d * GH * In, *x = J->x + r0 * In;
    if (r1 <= r0)
        return;
    if (kiln__cpu_rnn_project_ok(J->ctx)) {
        struct kiln_buffer *hd = NULL;
        float *wt = kiln__cpu_scratch_get(J->ctx, (size_t)(GH * In + GH) * sizeof(float), &hd);
        if (wt) {
            float *init = J->bias ? wt + GH * In : NULL;
            if (init)
                fold_bias(J, d, init);
            kiln__cpu_rnn_pack(J->ctx, W, GH, In, wt);
            kiln__cpu_rnn_project(J->ctx, wt, GH, In, x, r1 - r0, xw, ld, init);
            kiln__cpu_scratch_put(J->ctx, hd);
            return;
        }
    }
    double beta = 0.0;
    if (J->bias) {
        fold_bias(J, d, xw);
        for (int64_t i = 1; i < r1 - r0; i++)
            memcpy(xw + i * ld, xw, (size_t)GH * sizeof *xw);
        beta = 1.0;
    }
    kiln__cpu_gemm(J->ctx, false, false, true, r1 - r0, GH, In, x, In, W, In, beta, xw, ld);
}

/* The projections up front, split over the pool: blocks of rows of one direction each. */
static void project_job(void *argp, int job, int njobs)
{
    const rnn_job *J = argp;
    int per = njobs / J->p->ndir, d = job / per, k = job % per;
    int64_t rows = J->p->steps * J->p->batch, chunk = (rows + per - 1) / per;
    project(J, d, k * chunk, (k + 1) * chunk < rows ? (k + 1) * chunk : rows);
}

/* g[b][j] = h[b] · R[c0 + j] for b < bn, j < N (g rows ldg apart): with the vector
 * kernels over Rᵀ (RT, made once per layer) where the device has them for this many rows,
 * else BLAS. (sgemm packs R again at every call: 4 MB a step for a 512-unit LSTM, which
 * took more time than the arithmetic.) */
typedef struct cols_job {
    const rnn_job *J;
    const float *RT, *h;
    int64_t N, bn, ldg, chunk;
    float *g;
} cols_job;

static void cols_run(void *argp, int job, int njobs)
{
    (void)njobs;
    const cols_job *c = argp;
    int64_t H = c->J->p->hidden, j0 = job * c->chunk, n = c->N - j0 < c->chunk ? c->N - j0 : c->chunk;
    if (n > 0)
        kiln__cpu_rnn_dot(c->J->ctx, c->RT + j0, c->J->G * H, n, H, c->h, c->bn, c->g + j0, c->ldg);
}

static void recur(const rnn_job *J, const float *R, const float *RT, int64_t c0, int64_t N, const float *h,
                  int64_t bn, float *g, int64_t ldg)
{
    int64_t H = J->p->hidden;
    int T = J->ctx->nthreads;
    if (RT && J->split_cols && T > 1 && (double)bn * (double)N * (double)H >= RNN_STEP_SPLIT_MIN) {
        /* one layer alone on the pool: each thread takes a share of the columns, so it
         * streams only its share of Rᵀ (splitting the batch rows instead had each thread
         * stream all of it, and a large Rᵀ comes from memory every step) */
        int64_t chunk = ((N + T - 1) / T + 63) / 64 * 64;
        cols_job c = {J, RT + c0, h, N, bn, ldg, chunk, g};
        kiln__cpu_pool_run(J->ctx->pool, (int)((N + chunk - 1) / chunk), cols_run, &c);
    } else if (RT) {
        kiln__cpu_rnn_dot(J->ctx, RT + c0, J->G * H, N, H, h, bn, g, ldg);
    } else {
        kiln__cpu_gemm(J->ctx, false, false, true, bn, N, H, h, H, R + c0 * H, H, 0.0, g, ldg);
    }
}

static void rnn_job_run(void *argp, int job, int njobs)
{
    (void)njobs;
    const rnn_job *J = argp;
    const kiln_rnn_params *p = J->p;
    const kiln__cpu_kernels *k = J->ctx->k;
    int d = job / J->nbc, G = J->G, D = p->ndir;
    int64_t T = p->steps, B = p->batch, H = p->hidden, GH = G * H;
    int64_t b0 = (job % J->nbc) * J->bchunk, b1 = b0 + J->bchunk < B ? b0 + J->bchunk : B, bn = b1 - b0;
    if (J->project_in_job)
        project(J, d, 0, T * B);
    if (bn <= 0)
        return;
    bool lstm = p->cell == KILN_RNN_LSTM, lbr = p->linear_before_reset;
    bool reverse = D == 2 ? d == 1 : p->reverse;
    float clip = (float)p->clip;
    float *h = J->scratch + job * J->job_floats, *c = h + bn * H, *g = c + bn * H, *tmp = g + bn * GH;
    const float *R = J->r + d * GH * H, *peep = J->peep ? J->peep + d * 3 * H : NULL;
    const float *rbn = J->rbn ? J->rbn + d * H : NULL;
    float *RT = J->use_dot ? tmp + bn * H : NULL;
    if (RT)
        kiln__cpu_rnn_pack(J->ctx, R, GH, H, RT);
    for (int64_t b = 0; b < bn; b++) {
        int64_t src = (d * B + b0 + b) * H;
        for (int64_t j = 0; j < H; j++) {
            h[b * H + j] = J->h0 ? J->h0[src + j] : 0.0f;
            c[b * H + j] = J->c0 ? J->c0[src + j] : 0.0f;
        }
    }
    for (int64_t s = 0; s < T; s++) {
        int64_t t = reverse ? T - 1 - s : s;
        /* rows past their length keep their state and give zeros; their products are
         * computed with the others and dropped */
        if (lstm || lbr) {
            recur(J, R, RT, 0, GH, h, bn, g, GH);
        } else {
            recur(J, R, RT, 0, 2 * H, h, bn, g, GH);
            for (int64_t b = 0; b < bn; b++) {
                gru_zr(k, g + b * GH, J->xw + ((t * B + b0 + b) * D + d) * GH, H, clip);
                for (int64_t j = 0; j < H; j++) /* r ⊙ h, then its product with Rh */
                    tmp[b * H + j] = g[b * GH + H + j] * h[b * H + j];
            }
            recur(J, R, RT, 2 * H, H, tmp, bn, g + 2 * H, GH);
        }
        for (int64_t b = 0; b < bn; b++) {
            float *yrow = J->y + ((t * D + d) * B + b0 + b) * H;
            if (p->seq_lens && t >= p->seq_lens[b0 + b]) {
                memset(yrow, 0, (size_t)H * sizeof *yrow);
                continue;
            }
            const float *x = J->xw + ((t * B + b0 + b) * D + d) * GH;
            float *gb = g + b * GH, *hb = h + b * H;
            if (lstm) {
                lstm_row(k, gb, x, hb, c + b * H, peep, tmp + b * H, H, clip);
            } else if (lbr) {
                gru_zr(k, gb, x, H, clip);
                for (int64_t j = 0; j < H; j++)
                    gb[2 * H + j] = x[2 * H + j] + gb[H + j] * (gb[2 * H + j] + (rbn ? rbn[j] : 0.0f));
                gru_finish(k, gb, hb, H, clip);
            } else {
                for (int64_t j = 0; j < H; j++)
                    gb[2 * H + j] += x[2 * H + j];
                gru_finish(k, gb, hb, H, clip);
            }
            memcpy(yrow, hb, (size_t)H * sizeof *yrow);
        }
    }
    memcpy(J->yh + (d * B + b0) * H, h, (size_t)(bn * H) * sizeof *h);
    if (J->yc)
        memcpy(J->yc + (d * B + b0) * H, c, (size_t)(bn * H) * sizeof *c);
}

int kiln__cpu_rnn(void *vctx, const kiln_rnn_params *p, const kiln_rnn_operands *o)
{
    kiln__cpu_ctx *ctx = vctx;
    int G = p->cell == KILN_RNN_LSTM ? 4 : 3, D = p->ndir;
    int64_t T = p->steps, B = p->batch, In = p->input, H = p->hidden, GH = G * H;
    bool lbr = p->cell == KILN_RNN_GRU && p->linear_before_reset;
    /* Directions side by side, spare threads over batch rows, when each direction has
     * enough work to pay for waking the pool: below that a region costs more than it
     * saves (a worker that is slow to arrive, on a busy machine, holds the whole layer). */
    double work = (double)(T * B) * (double)GH * (double)(H + In);
    /* one direction keeps its rows together and splits each step's product by columns */
    int nbc = work >= RNN_PARALLEL_MIN && ctx->nthreads > 1 && D > 1 ? ctx->nthreads / D : 1;
    bool parallel = nbc >= 1 && work >= RNN_PARALLEL_MIN && ctx->nthreads > 1;
    if (nbc < 1)
        nbc = 1;
    if (nbc > B)
        nbc = (int)B;
    int64_t bchunk = (B + nbc - 1) / nbc;
    nbc = (int)((B + bchunk - 1) / bchunk);
    int njobs = D * nbc;
    bool use_dot = kiln__cpu_rnn_dot_ok(ctx, bchunk);
    int64_t job_floats = (2 * bchunk * H + bchunk * GH + bchunk * H + (use_dot ? GH * H : 0) + 15) / 16 * 16;
    size_t nxw = (size_t)(T * B * D * GH);
    size_t total = nxw + (size_t)(D * H) + (size_t)(njobs * job_floats);
    struct kiln_buffer *hd = NULL;
    float *xw = kiln__cpu_scratch_get(ctx, total * sizeof(float), &hd);
    if (!xw)
        return kiln__cpu_enomem("rnn");
    float *rbn = xw + nxw, *scratch = rbn + D * H;
    const float *bias = o->bias ? kiln__cpu_ptr(o->bias) : NULL;
    if (lbr && bias)
        for (int d = 0; d < D; d++)
            memcpy(rbn + d * H, bias + d * 2 * GH + GH + 2 * H, (size_t)H * sizeof *rbn);
    rnn_job J = {
        .ctx = ctx, .p = p, .G = G, .nbc = nbc, .bchunk = bchunk, .xw = xw, .x = kiln__cpu_ptr(o->x),
        .w = kiln__cpu_ptr(o->w), .bias = bias, .r = kiln__cpu_ptr(o->r), .rbn = lbr && bias ? rbn : NULL,
        .peep = o->peep ? kiln__cpu_ptr(o->peep) : NULL, .h0 = o->h0 ? kiln__cpu_ptr(o->h0) : NULL,
        .c0 = o->c0 ? kiln__cpu_ptr(o->c0) : NULL, .y = kiln__cpu_ptr(o->y), .yh = kiln__cpu_ptr(o->yh),
        .yc = o->yc ? kiln__cpu_ptr(o->yc) : NULL, .scratch = scratch, .job_floats = job_floats, .use_dot = use_dot,
        .split_cols = parallel && njobs == 1,
    };
    /* With one job per direction running side by side, each makes its own projections
     * (the directions' products overlap for free); otherwise they come first, split by
     * rows over the pool when the layer is large. A single job, or jobs run in turn, stay
     * on this thread, so each step's product may use the pool instead. */
    J.project_in_job = parallel && D > 1 && nbc == 1;
    if (!J.project_in_job && parallel)
        kiln__cpu_pool_run(ctx->pool, D * ctx->nthreads, project_job, &J);
    else if (!J.project_in_job)
        for (int d = 0; d < D; d++)
            project(&J, d, 0, T * B);
    if (parallel && njobs > 1)
        kiln__cpu_pool_run(ctx->pool, njobs, rnn_job_run, &J);
    else
        for (int j = 0; j < njobs; j++)
            rnn_job_run(&J, j, njobs);
    kiln__cpu_scratch_put(ctx, hd);
    return 0;
}
