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
 *    applies before the product), over R's panels made once per call where the device has
 *    the kernel (cpu-rnn-dot.c), gate by gate, into per-job scratch, then the gate
 *    arithmetic, sigmoid and tanh through the device's vector kernels; the scratch is
 *    taken once per call, never per step;
 *  - a large layer runs its directions at the same time, and spreads its batch rows over
 *    threads left over (rows never interact); a lone large direction splits each step by
 *    hidden units instead, every thread making its units' share of every gate and their
 *    gate arithmetic (so each streams only its share of R, and the arithmetic no longer
 *    waits on one thread); a small layer stays on the calling thread, where a parallel
 *    region would cost more than the layer.
 * The arithmetic is ONNX's (onnx.ai LSTM and GRU), gate for gate, in f32.
 */
#include <stdlib.h>

#include "cpu-impl.h"

/* Multiply-adds per direction (projections and recurrence) from which the directions and
 * batch rows are spread over the pool: about 0.1 ms of work on one core. */
#define RNN_PARALLEL_MIN (4.0 * 1024 * 1024)
/* ...and those of one step's product from which a lone direction splits each step by
 * hidden units. */
#define RNN_STEP_SPLIT_MIN (256.0 * 1024)
/* The largest R (bytes, one direction) that threads taking batch rows each read every step. */
#define RNN_ROWS_MAX_R (8.0 * 1024 * 1024)

typedef struct rnn_job {
    kiln__cpu_ctx *ctx;
    const kiln_rnn_params *p;
    int G, nbc;                 /* gates; batch chunks per direction */
    int64_t bchunk;             /* rows per chunk */
    float *xw;                  /* [T·B, D·G·H]: input projections plus biases */
    const float *x, *w, *bias;  /* the operands */
    const float *binit;         /* [D, G·H]: the biases every projection row starts from */
    const float *wp;            /* W's panels per direction (wp_floats each), or NULL: BLAS */
    const float *rp;            /* R's panels per direction (rp_floats each: one block of
                                 * rseg_floats per gate), or NULL: BLAS */
    int64_t wp_floats, rp_floats, rseg_floats;
    bool project_in_job;        /* each job makes its direction's xw first */
    bool split_units;           /* one job on the calling thread: each step splits its hidden
                                 * units over the pool */
    const float *r, *rbn;       /* [D, G·H, H]; GRU linear_before_reset: Rbh per direction, [D, H] */
    const float *peep, *h0, *c0;
    float *y, *yh, *yc;
    float *scratch;             /* per job: job_floats */
    int64_t job_floats;
} rnn_job;

/* The state of one direction over one chunk of batch rows as its steps run: h (read by
 * this step's products) and hn (written by it) swap after every step, so that a step may
 * be split by hidden units over threads, each reading all of h and writing its share. */
typedef struct rnn_state {
    const rnn_job *J;
    int d;
    int64_t b0, bn, t;
    float *h, *hn, *c, *g, *tmp;
} rnn_state;

/* Where W's and R's panels go in a block of packed weights: every direction's W panels
 * (wp_floats each, when the projections run over panels), then every direction's R panels
 * (rp_floats each: one block of rseg_floats per gate, when the recurrent product does). */
typedef struct rnn_layout {
    int64_t wp_floats, rp_floats, rseg_floats;
} rnn_layout;

static rnn_layout layout_for(const kiln_rnn_params *p, bool with_w, bool with_r)
{
    int64_t H = p->hidden, GH = (p->cell == KILN_RNN_LSTM ? 4 : 3) * H;
    rnn_layout L = {0};
    L.wp_floats = with_w ? (kiln__cpu_rnn_panels_size(GH, p->input) + 15) / 16 * 16 : 0;
    L.rseg_floats = with_r ? kiln__cpu_rnn_panels_size(H, H) : 0;
    L.rp_floats = ((GH / H) * L.rseg_floats + 15) / 16 * 16;
    return L;
}

static inline void clip_run(float *v, int64_t n, float clip)
{
    if (clip > 0)
        for (int64_t i = 0; i < n; i++)
            v[i] = v[i] > clip ? clip : v[i] < -clip ? -clip : v[i];
}

/* op over gates [q0, q1) of a row g (gates H apart), units [u0, u0 + n) of each: one call
 * when those units are the whole gate. */
static void gates_unary(const kiln__cpu_kernels *k, int op, float *g, int q0, int q1, int64_t H, int64_t u0,
                        int64_t n, float clip)
{
    if (n == H) {
        clip_run(g + q0 * H, (q1 - q0) * H, clip);
        k->unary_f32(op, g + q0 * H, g + q0 * H, (q1 - q0) * H, 0, 0);
        return;
    }
    for (int q = q0; q < q1; q++) {
        clip_run(g + q * H + u0, n, clip);
        k->unary_f32(op, g + q * H + u0, g + q * H + u0, n, 0, 0);
    }
}

/* Units [u0, u0 + n) of one LSTM row: g holds h·Rᵀ for this row, x its input projection
 * with both biases, h the state before the step, hn the one after. */
static void lstm_units(const kiln__cpu_kernels *k, float *g, const float *x, const float *h, float *hn, float *c,
                       const float *peep, int64_t H, int64_t u0, int64_t n, float clip)
{
    for (int q = 0; q < 4; q++)
        for (int64_t j = q * H + u0; j < q * H + u0 + n; j++)
            g[j] += x[j];
    if (peep)
        for (int64_t j = u0; j < u0 + n; j++) {
            g[j] += peep[j] * c[j];                 /* i */
            g[2 * H + j] += peep[2 * H + j] * c[j]; /* f */
        }
    if (peep) {
        gates_unary(k, KILN_UNARY_SIGMOID, g, 0, 1, H, u0, n, clip);
        gates_unary(k, KILN_UNARY_SIGMOID, g, 2, 3, H, u0, n, clip);
    } else {
        gates_unary(k, KILN_UNARY_SIGMOID, g, 0, 3, H, u0, n, clip);
    }
    gates_unary(k, KILN_UNARY_TANH, g, 3, 4, H, u0, n, clip);
    for (int64_t j = u0; j < u0 + n; j++)
        c[j] = g[2 * H + j] * c[j] + g[j] * g[3 * H + j];
    if (peep) {
        for (int64_t j = u0; j < u0 + n; j++)
            g[H + j] += peep[H + j] * c[j]; /* o sees the new cell */
        gates_unary(k, KILN_UNARY_SIGMOID, g, 1, 2, H, u0, n, clip);
    }
    /* the c gate's values are spent: tanh(c) goes there */
    k->unary_f32(KILN_UNARY_TANH, g + 3 * H + u0, c + u0, n, 0, 0);
    for (int64_t j = u0; j < u0 + n; j++)
        hn[j] = g[H + j] * g[3 * H + j];
}

/* n = tanh(pre) over units [u0, u0 + n) with pre in g[2H, 3H); then
 * hn = (1 - z) n + z h, written as n + z (h - n). */
static void gru_finish(const kiln__cpu_kernels *k, float *g, const float *h, float *hn, int64_t H, int64_t u0,
                       int64_t n, float clip)
{
    gates_unary(k, KILN_UNARY_TANH, g, 2, 3, H, u0, n, clip);
    const float *nn = g + 2 * H;
    for (int64_t j = u0; j < u0 + n; j++)
        hn[j] = nn[j] + g[j] * (h[j] - nn[j]);
}

/* Direction d's biases that do not meet the recurrence, into row: Wb + Rb for every gate,
 * but for a GRU with linear_before_reset only Wbh on its h gate (Rbh goes inside r's
 * product). */
static void fold_bias(const kiln_rnn_params *p, const float *bias, int d, float *row)
{
    int64_t H = p->hidden, GH = (p->cell == KILN_RNN_LSTM ? 4 : 3) * H;
    const float *wb = bias + d * 2 * GH, *rb = wb + GH;
    bool lbr = p->cell == KILN_RNN_GRU && p->linear_before_reset;
    for (int64_t j = 0; j < GH; j++)
        row[j] = wb[j] + (lbr && j >= 2 * H ? 0.0f : rb[j]);
}

/* Rows [r0, r1) of direction d's input projections: x·W_dᵀ plus the folded biases, with
 * the vector kernel over W's panels where the device has one that beats BLAS, else sgemm
 * onto rows holding the biases. */
static void project(const rnn_job *J, int d, int64_t r0, int64_t r1)
{
    const kiln_rnn_params *p = J->p;
    int64_t GH = J->G * p->hidden, ld = p->ndir * GH, In = p->input;
    float *xw = J->xw + r0 * ld + d * GH;
    const float *W = J->w + d * GH * In, *x = J->x + r0 * In;
    if (r1 <= r0)
        return;
    const float *init = J->binit ? J->binit + d * GH : NULL;
    if (J->wp) {
        kiln__cpu_rnn_project(J->ctx, J->wp + d * J->wp_floats, GH, In, x, r1 - r0, xw, ld, init);
        return;
    }
    double beta = 0.0;
    if (init) {
        for (int64_t i = 0; i < r1 - r0; i++)
            memcpy(xw + i * ld, init, (size_t)GH * sizeof *xw);
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

/* Job 2d packs direction d's W, job 2d + 1 its R, gate by gate (so that a share of a
 * gate's units starts at a panel). */
static void pack_job(void *argp, int job, int njobs)
{
    (void)njobs;
    const rnn_job *J = argp;
    const kiln_rnn_params *p = J->p;
    int d = job / 2;
    int64_t H = p->hidden, GH = J->G * H;
    if (job % 2 == 0 && J->wp)
        kiln__cpu_rnn_pack(J->ctx, J->w + d * GH * p->input, GH, p->input, (float *)J->wp + d * J->wp_floats);
    if (job % 2 == 1 && J->rp)
        for (int q = 0; q < J->G; q++)
            kiln__cpu_rnn_pack(J->ctx, J->r + (d * GH + q * H) * H, H, H,
                               (float *)J->rp + d * J->rp_floats + q * J->rseg_floats);
}

/* g[b][q·H + j] = hin[b] · R_q[j] for gates [q0, q1), units j in [u0, u1), b < bn: over R's
 * panels where the device has the kernel (u0 a multiple of RNN_PANEL), else BLAS. */
static void gate_products(const rnn_state *S, int q0, int q1, int64_t u0, int64_t u1, const float *hin)
{
    const rnn_job *J = S->J;
    int64_t H = J->p->hidden, GH = J->G * H;
    const float *R = J->r + S->d * GH * H;
    if (!J->rp && u0 == 0 && u1 == H) { /* the gates' rows are contiguous in R */
        kiln__cpu_gemm(J->ctx, false, false, true, S->bn, (q1 - q0) * H, H, hin, H, R + q0 * H * H, H, 0.0,
                       S->g + q0 * H, GH);
        return;
    }
    for (int q = q0; q < q1; q++) {
        if (J->rp)
            kiln__cpu_rnn_dot(J->ctx, J->rp + S->d * J->rp_floats + q * J->rseg_floats + u0 * H, u1 - u0, H, hin,
                              H, S->bn, S->g + q * H + u0, GH);
        else
            kiln__cpu_gemm(J->ctx, false, false, true, S->bn, u1 - u0, H, hin, H, R + (q * H + u0) * H, H, 0.0,
                           S->g + q * H + u0, GH);
    }
}

static bool row_done(const rnn_state *S, int64_t b)
{
    const int64_t *lens = S->J->p->seq_lens;
    return lens && S->t >= lens[S->b0 + b];
}

/* Units [u0, u1) of step t, every row of the chunk: the products, the gate arithmetic, the
 * new state into hn and y. For a GRU whose reset gate applies before its product, phase 1
 * makes z, r and r ⊙ h (in tmp), phase 2 the rest, once every unit of tmp is ready. */
static void step_units(const rnn_state *S, int phase, int64_t u0, int64_t u1)
{
    const rnn_job *J = S->J;
    const kiln_rnn_params *p = J->p;
    const kiln__cpu_kernels *k = J->ctx->k;
    int G = J->G, D = p->ndir, d = S->d;
    int64_t B = p->batch, H = p->hidden, GH = G * H, n = u1 - u0, t = S->t;
    bool lstm = p->cell == KILN_RNN_LSTM, lbr = p->linear_before_reset;
    float clip = (float)p->clip;
    const float *peep = J->peep ? J->peep + d * 3 * H : NULL, *rbn = J->rbn ? J->rbn + d * H : NULL;
    if (!lstm && !lbr && phase == 1) {
        gate_products(S, 0, 2, u0, u1, S->h);
        for (int64_t b = 0; b < S->bn; b++) {
            float *gb = S->g + b * GH;
            const float *x = J->xw + ((t * B + S->b0 + b) * D + d) * GH;
            for (int q = 0; q < 2; q++)
                for (int64_t j = q * H + u0; j < q * H + u1; j++)
                    gb[j] += x[j];
            gates_unary(k, KILN_UNARY_SIGMOID, gb, 0, 2, H, u0, n, clip);
            for (int64_t j = u0; j < u1; j++) /* r ⊙ h, for the h gate's product */
                S->tmp[b * H + j] = gb[H + j] * S->h[b * H + j];
        }
        return;
    }
    /* rows past their length keep their state and give zeros; their products are
     * computed with the others and dropped */
    if (lstm || lbr)
        gate_products(S, 0, G, u0, u1, S->h);
    else
        gate_products(S, 2, 3, u0, u1, S->tmp);
    for (int64_t b = 0; b < S->bn; b++) {
        float *yrow = J->y + ((t * D + d) * B + S->b0 + b) * H;
        const float *hb = S->h + b * H;
        float *hnb = S->hn + b * H;
        if (row_done(S, b)) {
            memset(yrow + u0, 0, (size_t)n * sizeof *yrow);
            memcpy(hnb + u0, hb + u0, (size_t)n * sizeof *hnb);
            continue;
        }
        const float *x = J->xw + ((t * B + S->b0 + b) * D + d) * GH;
        float *gb = S->g + b * GH;
        if (lstm) {
            lstm_units(k, gb, x, hb, hnb, S->c + b * H, peep, H, u0, n, clip);
        } else if (lbr) {
            for (int q = 0; q < 2; q++)
                for (int64_t j = q * H + u0; j < q * H + u1; j++)
                    gb[j] += x[j];
            gates_unary(k, KILN_UNARY_SIGMOID, gb, 0, 2, H, u0, n, clip);
            for (int64_t j = u0; j < u1; j++)
                gb[2 * H + j] = x[2 * H + j] + gb[H + j] * (gb[2 * H + j] + (rbn ? rbn[j] : 0.0f));
            gru_finish(k, gb, hb, hnb, H, u0, n, clip);
        } else {
            for (int64_t j = 2 * H + u0; j < 2 * H + u1; j++)
                gb[j] += x[j];
            gru_finish(k, gb, hb, hnb, H, u0, n, clip);
        }
        memcpy(yrow + u0, hnb + u0, (size_t)n * sizeof *yrow);
    }
}

/* One step of a lone direction split by hidden units over the pool: each job takes a share
 * of the units (a whole number of panels) of every gate, so the gate arithmetic runs
 * beside the products and each thread streams only its share of R's panels. */
typedef struct units_job {
    const rnn_state *S;
    int phase;
    int64_t chunk;
} units_job;

static void units_run(void *argp, int job, int njobs)
{
    (void)njobs;
    const units_job *u = argp;
    int64_t H = u->S->J->p->hidden, u0 = job * u->chunk, u1 = u0 + u->chunk < H ? u0 + u->chunk : H;
    if (u1 > u0)
        step_units(u->S, u->phase, u0, u1);
}

static void step(const rnn_state *S)
{
    const rnn_job *J = S->J;
    int T = J->ctx->nthreads, phases = J->p->cell == KILN_RNN_GRU && !J->p->linear_before_reset ? 2 : 1;
    int64_t H = J->p->hidden;
    for (int phase = 1; phase <= phases; phase++) {
        if (J->split_units) {
            units_job u = {S, phase, ((H + T - 1) / T + RNN_PANEL - 1) / RNN_PANEL * RNN_PANEL};
            kiln__cpu_pool_run(J->ctx->pool, (int)((H + u.chunk - 1) / u.chunk), units_run, &u);
        } else {
            step_units(S, phase, 0, H);
        }
    }
}

static void rnn_job_run(void *argp, int job, int njobs)
{
    (void)njobs;
    const rnn_job *J = argp;
    const kiln_rnn_params *p = J->p;
    int d = job / J->nbc, D = p->ndir;
    int64_t T = p->steps, B = p->batch, H = p->hidden, GH = J->G * H;
    int64_t b0 = (job % J->nbc) * J->bchunk, b1 = b0 + J->bchunk < B ? b0 + J->bchunk : B, bn = b1 - b0;
    if (J->project_in_job)
        project(J, d, 0, T * B);
    if (bn <= 0)
        return;
    bool reverse = D == 2 ? d == 1 : p->reverse;
    float *h = J->scratch + job * J->job_floats;
    rnn_state S = {.J = J,
                   .d = d,
                   .b0 = b0,
                   .bn = bn,
                   .h = h,
                   .hn = h + bn * H,
                   .c = h + 2 * bn * H,
                   .g = h + 3 * bn * H,
                   .tmp = h + 3 * bn * H + bn * GH};
    for (int64_t b = 0; b < bn; b++) {
        int64_t src = (d * B + b0 + b) * H;
        for (int64_t j = 0; j < H; j++) {
            S.h[b * H + j] = J->h0 ? J->h0[src + j] : 0.0f;
            S.c[b * H + j] = J->c0 ? J->c0[src + j] : 0.0f;
        }
    }
    for (int64_t s = 0; s < T; s++) {
        S.t = reverse ? T - 1 - s : s;
        step(&S);
        float *was = S.h;
        S.h = S.hn, S.hn = was;
    }
    memcpy(J->yh + (d * B + b0) * H, S.h, (size_t)(bn * H) * sizeof *S.h);
    if (J->yc)
        memcpy(J->yc + (d * B + b0) * H, S.c, (size_t)(bn * H) * sizeof *S.c);
}

int kiln__cpu_rnn(void *vctx, const kiln_rnn_params *p, const kiln_rnn_operands *o)
{
    kiln__cpu_ctx *ctx = vctx;
    int G = p->cell == KILN_RNN_LSTM ? 4 : 3, D = p->ndir;
    int64_t T = p->steps, B = p->batch, In = p->input, H = p->hidden, GH = G * H;
    bool lbr = p->cell == KILN_RNN_GRU && p->linear_before_reset;
    /* Directions side by side, threads left over (all of them, for one direction) over
     * batch rows, when each direction has enough work to pay for waking the pool: below
     * that a region costs more than it saves (a worker that is slow to arrive, on a busy
     * machine, holds the whole layer). Rows never interact, so a thread runs every step of
     * its rows with no barrier between steps; each streams all of R every step, which
     * pays while R stays in L3 and each thread has rows enough for the four-row kernel
     * (where the table has no kernel for that many rows, BLAS packs R again at every
     * product, per thread: under AVX2 a 512-unit LSTM of 16 rows ran about 15% slower by
     * rows than by units).
     * Otherwise a lone direction splits each step by hidden units, a region per step (a
     * 512-unit LSTM of 16 rows ran 3-5% faster by rows on a quiet machine, and under load
     * a late worker held only its own rows, not every step). */
    double work = (double)(T * B) * (double)GH * (double)(H + In);
    bool parallel = work >= RNN_PARALLEL_MIN && ctx->nthreads > 1;
    int per_dir = parallel && ctx->nthreads / D > 1 ? ctx->nthreads / D : 1;
    bool by_rows = D > 1 || (B >= 4 * per_dir && (double)GH * (double)H * sizeof(float) <= RNN_ROWS_MAX_R &&
                             kiln__cpu_rnn_dot_ok(ctx, (B + per_dir - 1) / per_dir));
    int nbc = parallel && by_rows ? per_dir : 1;
    if (nbc > B)
        nbc = (int)B;
    int64_t bchunk = (B + nbc - 1) / nbc;
    nbc = (int)((B + bchunk - 1) / bchunk);
    int njobs = D * nbc;
    bool use_dot = kiln__cpu_rnn_dot_ok(ctx, bchunk), use_project = kiln__cpu_rnn_project_ok(ctx);
    /* weights packed ahead (kiln__cpu_rnn_pack_weights, the layout for every kernel the
     * table has), else packed here into scratch for the kernels this call uses */
    rnn_layout ahead = layout_for(p, use_project, kiln__cpu_rnn_dot_ok(ctx, 1));
    const float *packed = o->packed && kiln__cpu_numel(o->packed) == D * (ahead.wp_floats + ahead.rp_floats)
                              ? kiln__cpu_ptr(o->packed)
                              : NULL;
    rnn_layout L = packed ? (rnn_layout){0} : layout_for(p, use_project, use_dot);
    int64_t wp_floats = L.wp_floats, rp_floats = L.rp_floats;
    int64_t job_floats = (3 * bchunk * H + bchunk * GH + bchunk * H + 15) / 16 * 16;
    size_t nxw = (size_t)(T * B * D * GH + 15) / 16 * 16;
    int64_t nbinit = (D * GH + 15) / 16 * 16;
    size_t total = nxw + (size_t)(D * (wp_floats + rp_floats)) + (size_t)((D * H + 15) / 16 * 16) +
                   (size_t)nbinit + (size_t)(njobs * job_floats);
    struct kiln_buffer *hd = NULL;
    float *xw = kiln__cpu_scratch_get(ctx, total * sizeof(float), &hd);
    if (!xw)
        return kiln__cpu_enomem("rnn");
    float *wp = xw + nxw, *rp = wp + D * wp_floats, *rbn = rp + D * rp_floats;
    float *binit = rbn + (D * H + 15) / 16 * 16, *scratch = binit + nbinit;
    const float *bias = o->bias ? kiln__cpu_ptr(o->bias) : NULL;
    for (int d = 0; bias && d < D; d++)
        fold_bias(p, bias, d, binit + d * GH);
    if (lbr && bias)
        for (int d = 0; d < D; d++)
            memcpy(rbn + d * H, bias + d * 2 * GH + GH + 2 * H, (size_t)H * sizeof *rbn);
    rnn_job J = {
        .ctx = ctx,
        .p = p,
        .G = G,
        .nbc = nbc,
        .bchunk = bchunk,
        .xw = xw,
        .x = kiln__cpu_ptr(o->x),
        .w = kiln__cpu_ptr(o->w),
        .bias = bias,
        .binit = bias ? binit : NULL,
        .r = kiln__cpu_ptr(o->r),
        .rbn = lbr && bias ? rbn : NULL,
        .peep = o->peep ? kiln__cpu_ptr(o->peep) : NULL,
        .h0 = o->h0 ? kiln__cpu_ptr(o->h0) : NULL,
        .c0 = o->c0 ? kiln__cpu_ptr(o->c0) : NULL,
        .y = kiln__cpu_ptr(o->y),
        .yh = kiln__cpu_ptr(o->yh),
        .yc = o->yc ? kiln__cpu_ptr(o->yc) : NULL,
        .scratch = scratch,
        .job_floats = job_floats,
        .wp = use_project ? wp : NULL,
        .rp = use_dot ? rp : NULL,
        .wp_floats = wp_floats,
        .rp_floats = rp_floats,
        .rseg_floats = L.rseg_floats,
        .split_units = parallel && D == 1 && nbc == 1 && H > RNN_PANEL &&
                       (double)bchunk * (double)GH * (double)H >= RNN_STEP_SPLIT_MIN,
    };
    if (packed) {
        J.wp = use_project ? packed : NULL;
        J.rp = use_dot ? packed + D * ahead.wp_floats : NULL;
        J.wp_floats = ahead.wp_floats, J.rp_floats = ahead.rp_floats, J.rseg_floats = ahead.rseg_floats;
    } else if (use_dot || use_project) {
        if (parallel)
            kiln__cpu_pool_run(ctx->pool, 2 * D, pack_job, &J);
        else
            for (int j = 0; j < 2 * D; j++)
                pack_job(&J, j, 2 * D);
    }
    /* With one job per direction running side by side, each makes its own projections
     * (the directions' products overlap for free); otherwise they come first, split by
     * rows over the pool when the layer is large. A single job, or jobs run in turn, stay
     * on this thread, so each step may use the pool instead. */
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

int64_t kiln__cpu_rnn_pack_size(void *vctx, const kiln_rnn_params *p)
{
    const kiln__cpu_ctx *ctx = vctx;
    bool with_w = kiln__cpu_rnn_project_ok(ctx), with_r = kiln__cpu_rnn_dot_ok(ctx, 1);
    rnn_layout L = layout_for(p, with_w, with_r);
    return with_w || with_r ? p->ndir * (L.wp_floats + L.rp_floats) : 0;
}

int kiln__cpu_rnn_pack_weights(void *vctx, const kiln_rnn_params *p, const kiln_tdesc *packed, const kiln_tdesc *w,
                               const kiln_tdesc *r)
{
    kiln__cpu_ctx *ctx = vctx;
    int64_t n = kiln__cpu_rnn_pack_size(ctx, p);
    if (n <= 0 || kiln__cpu_numel(packed) != n)
        return kiln__error_set("cpu rnn_pack: a buffer of %lld floats for weights that pack into %lld",
                               (long long)kiln__cpu_numel(packed), (long long)n);
    rnn_layout L = layout_for(p, kiln__cpu_rnn_project_ok(ctx), kiln__cpu_rnn_dot_ok(ctx, 1));
    float *out = kiln__cpu_ptr(packed);
    rnn_job J = {
        .ctx = ctx,
        .p = p,
        .G = p->cell == KILN_RNN_LSTM ? 4 : 3,
        .w = kiln__cpu_ptr(w),
        .r = kiln__cpu_ptr(r),
        .wp = L.wp_floats ? out : NULL,
        .rp = L.rseg_floats ? out + p->ndir * L.wp_floats : NULL,
        .wp_floats = L.wp_floats,
        .rp_floats = L.rp_floats,
        .rseg_floats = L.rseg_floats,
    };
    kiln__cpu_pool_run(ctx->pool, 2 * p->ndir, pack_job, &J);
    return 0;
}
