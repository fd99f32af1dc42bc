/*
 * backends/cpu/cpu-reduce.c — reduce (every kiln_reduce_op), arg_reduce and cumsum.
 *
 * A reduction splits the input's dims into kept ones (one output element per position)
 * and reduced ones (walked for each output). Reduced dims are merged where their
 * strides allow, so reducing the trailing dims of a contiguous tensor is one long run
 * per output, which the inner loops take with several independent accumulators.
 *
 * Floating sums accumulate in double: the oracle accumulates in double too, and a
 * float accumulator over a million elements drifts well past 1e-6 relative. Variance
 * and std take two passes (mean, then squared deviations), logsumexp two (max, then
 * sum of exp(x - max)), so neither cancels. Integer sum/prod/max/min accumulate in int64
 * with wrap-around. Outputs are threaded across the pool; a reduction to few outputs
 * over many elements instead splits each output's range across threads and combines
 * the partial results in a fixed order.
 */
#include <stdlib.h>

#include "cpu-impl.h"

typedef struct rplan {
    const kiln_tdesc *in, *out;
    kiln_reduce_op op;
    double param;
    bool int_acc;                 /* integer accumulation (int in, int out) */
    int nk, nr;
    int64_t kshape[KILN_MAX_DIMS], kin[KILN_MAX_DIMS], kout[KILN_MAX_DIMS];
    int64_t rshape[KILN_MAX_DIMS], rstride[KILN_MAX_DIMS];
    int64_t rcount;               /* elements reduced per output */
    int64_t inner;                /* rshape[nr-1] */
} rplan;

/* State carried over the runs of one output (or one part of it). */
typedef struct racc {
    double s;        /* sum / prod / max / min / count / sum of |x|^p */
    int64_t is;      /* integer accumulator */
    bool any;        /* whether any element was seen (max/min) */
} racc;

typedef enum pass { P_MAIN, P_DEV } pass;

/* Fold one run of n elements at p (stride st elements) into acc. */
static void fold_run(const rplan *pl, pass ps, double center, const char *p, int64_t st, int64_t n,
                     racc *acc)
{
    kiln_dtype dt = pl->in->dtype;
    int64_t es = (int64_t)kiln__cpu_esize(dt);
    int64_t bst = st * es;
    if (pl->int_acc) {
        int64_t a = acc->is;
        for (int64_t i = 0; i < n; i++) {
            int64_t v = kiln__cpu_ldi(p + i * bst, dt);
            switch (pl->op) {
            case KILN_REDUCE_PROD: a = (int64_t)((uint64_t)a * (uint64_t)v); break;
            case KILN_REDUCE_MAX: a = (!acc->any || v > a) ? v : a; acc->any = true; break;
            case KILN_REDUCE_MIN: a = (!acc->any || v < a) ? v : a; acc->any = true; break;
            default: a = (int64_t)((uint64_t)a + (uint64_t)v); break;
            }
        }
        acc->is = a;
        return;
    }
    kiln_reduce_op op = pl->op;
    if (ps == P_DEV) { /* var/std second pass, logsumexp second pass */
        double s = 0;
        if (op == KILN_REDUCE_LOGSUMEXP) {
            for (int64_t i = 0; i < n; i++)
                s += exp(kiln__cpu_ld(p + i * bst, dt) - center);
        } else {
            for (int64_t i = 0; i < n; i++) {
                double d = kiln__cpu_ld(p + i * bst, dt) - center;
                s += d * d;
            }
        }
        acc->s += s;
        return;
    }
    switch (op) {
    case KILN_REDUCE_SUM: case KILN_REDUCE_MEAN: case KILN_REDUCE_VAR: case KILN_REDUCE_STD: {
        if (dt == KILN_F32 && st == 1) {
            const float *f = (const float *)p;
            double a[8] = {0};
            int64_t i = 0;
            for (; i + 8 <= n; i += 8)
                for (int k = 0; k < 8; k++)
                    a[k] += f[i + k];
            double s = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
            for (; i < n; i++)
                s += f[i];
            acc->s += s;
        } else {
            double s = 0;
            for (int64_t i = 0; i < n; i++)
                s += kiln__cpu_ld(p + i * bst, dt);
            acc->s += s;
        }
        break;
    }
    case KILN_REDUCE_PROD:
        for (int64_t i = 0; i < n; i++)
            acc->s *= kiln__cpu_ld(p + i * bst, dt);
        break;
    case KILN_REDUCE_MAX: case KILN_REDUCE_LOGSUMEXP:
        for (int64_t i = 0; i < n; i++) {
            double v = kiln__cpu_ld(p + i * bst, dt);
            if (!acc->any || v > acc->s || v != v)
                acc->s = (acc->s != acc->s && acc->any) ? acc->s : v;
            acc->any = true;
        }
        break;
    case KILN_REDUCE_MIN:
        for (int64_t i = 0; i < n; i++) {
            double v = kiln__cpu_ld(p + i * bst, dt);
            if (!acc->any || v < acc->s || v != v)
                acc->s = (acc->s != acc->s && acc->any) ? acc->s : v;
            acc->any = true;
        }
        break;
    case KILN_REDUCE_NORM: {
        double pp = pl->param, s = acc->s;
        for (int64_t i = 0; i < n; i++) {
            double v = fabs(kiln__cpu_ld(p + i * bst, dt));
            if (pp == 0)
                s += v != 0;
            else if (pp == INFINITY)
                s = (!acc->any || v > s || v != v) ? ((s != s && acc->any) ? s : v) : s;
            else if (pp == -INFINITY)
                s = (!acc->any || v < s || v != v) ? ((s != s && acc->any) ? s : v) : s;
            else if (pp == 1)
                s += v;
            else if (pp == 2)
                s += v * v;
            else
                s += pow(v, pp);
            acc->any = true;
        }
        acc->s = s;
        break;
    }
    case KILN_REDUCE_ANY:
        for (int64_t i = 0; i < n && acc->s == 0; i++)
            if (kiln__cpu_ld(p + i * bst, dt) != 0)
                acc->s = 1;
        break;
    case KILN_REDUCE_ALL:
        for (int64_t i = 0; i < n && acc->s != 0; i++)
            if (kiln__cpu_ld(p + i * bst, dt) == 0)
                acc->s = 0;
        break;
    default:
        break;
    }
}

static void acc_init(const rplan *pl, racc *a)
{
    memset(a, 0, sizeof *a);
    if (pl->op == KILN_REDUCE_PROD) {
        a->s = 1;
        a->is = 1;
    }
    if (pl->op == KILN_REDUCE_ALL)
        a->s = 1;
}

/* Walk reduced positions [rb, re) of the output whose input base is base. */
static void walk(const rplan *pl, pass ps, double center, const char *base, int64_t rb, int64_t re,
                 racc *acc)
{
    int nr = pl->nr;
    int64_t es = (int64_t)kiln__cpu_esize(pl->in->dtype);
    int64_t inner = pl->inner, ist = pl->rstride[nr - 1];
    int64_t pos = rb;
    while (pos < re) {
        int64_t rem = pos / inner, i0 = pos % inner;
        int64_t off = i0 * ist;
        for (int d = nr - 2; d >= 0; d--) {
            off += (rem % pl->rshape[d]) * pl->rstride[d];
            rem /= pl->rshape[d];
        }
        int64_t n = inner - i0;
        if (n > re - pos)
            n = re - pos;
        fold_run(pl, ps, center, base + off * es, ist, n, acc);
        pos += n;
    }
}

static void combine(const rplan *pl, racc *into, const racc *a)
{
    switch (pl->op) {
    case KILN_REDUCE_PROD:
        into->s *= a->s;
        into->is = (int64_t)((uint64_t)into->is * (uint64_t)a->is);
        break;
    case KILN_REDUCE_MAX: case KILN_REDUCE_LOGSUMEXP: case KILN_REDUCE_MIN:
        if (pl->int_acc) {
            if (a->any && (!into->any || (pl->op == KILN_REDUCE_MIN ? a->is < into->is : a->is > into->is)))
                into->is = a->is;
        } else if (a->any && (!into->any || a->s != a->s ||
                              (into->s == into->s &&
                               (pl->op == KILN_REDUCE_MIN ? a->s < into->s : a->s > into->s)))) {
            into->s = a->s;
        }
        into->any |= a->any;
        break;
    case KILN_REDUCE_NORM:
        if (pl->param == INFINITY || pl->param == -INFINITY) {
            bool mx = pl->param > 0;
            if (a->any && (!into->any || a->s != a->s ||
                           (into->s == into->s && (mx ? a->s > into->s : a->s < into->s))))
                into->s = a->s;
            into->any |= a->any;
        } else {
            into->s += a->s;
        }
        break;
    case KILN_REDUCE_ANY: into->s = (into->s != 0 || a->s != 0); break;
    case KILN_REDUCE_ALL: into->s = (into->s != 0 && a->s != 0); break;
    default:
        into->s += a->s;
        into->is = (int64_t)((uint64_t)into->is + (uint64_t)a->is);
        break;
    }
}

/* Reduce one output over reduced range parts; nparts > 1 only for few-output reductions. */
typedef struct rjob {
    const rplan *pl;
    kiln__cpu_ctx *ctx;
    /* split mode */
    const char *base;
    pass ps;
    double center;
    racc *parts;
} rjob;

static void part_job(void *argp, int job, int njobs)
{
    rjob *j = argp;
    int64_t n = j->pl->rcount;
    acc_init(j->pl, &j->parts[job]);
    walk(j->pl, j->ps, j->center, j->base, n * job / njobs, n * (job + 1) / njobs, &j->parts[job]);
}

static racc reduce_range(rjob *j, const char *base, pass ps, double center, bool split)
{
    const rplan *pl = j->pl;
    racc acc;
    acc_init(pl, &acc);
    if (!split) {
        walk(pl, ps, center, base, 0, pl->rcount, &acc);
        return acc;
    }
    racc parts[64];
    int np = j->ctx->nthreads < 64 ? j->ctx->nthreads : 64;
    rjob sub = *j;
    sub.base = base;
    sub.ps = ps;
    sub.center = center;
    sub.parts = parts;
    kiln__cpu_pool_run(j->ctx->pool, np, part_job, &sub);
    for (int i = 0; i < np; i++) {
        if (ps == P_DEV)
            acc.s += parts[i].s; /* second passes are plain sums */
        else
            combine(pl, &acc, &parts[i]);
    }
    return acc;
}

static void reduce_one(rjob *j, int64_t oi, bool split)
{
    const rplan *pl = j->pl;
    int64_t ioff = 0, ooff = 0, rem = oi;
    for (int d = pl->nk - 1; d >= 0; d--) {
        int64_t idx = rem % pl->kshape[d];
        rem /= pl->kshape[d];
        ioff += idx * pl->kin[d];
        ooff += idx * pl->kout[d];
    }
    const char *base = (const char *)kiln__cpu_ptr(pl->in) + ioff * (int64_t)kiln__cpu_esize(pl->in->dtype);
    char *op = (char *)kiln__cpu_ptr(pl->out) + ooff * (int64_t)kiln__cpu_esize(pl->out->dtype);
    kiln_dtype od = pl->out->dtype;
    double n = (double)pl->rcount;
    if (pl->int_acc) {
        racc a = reduce_range(j, base, P_MAIN, 0, split);
        kiln__cpu_sti(op, od, a.is);
        return;
    }
    racc a = reduce_range(j, base, P_MAIN, 0, split);
    double r;
    switch (pl->op) {
    case KILN_REDUCE_MEAN: r = a.s / n; break;
    case KILN_REDUCE_MAX: case KILN_REDUCE_MIN: r = a.any ? a.s : NAN; break;
    case KILN_REDUCE_VAR: case KILN_REDUCE_STD: {
        double mean = a.s / n;
        racc d = reduce_range(j, base, P_DEV, mean, split);
        double den = n - pl->param;
        if (den < 0)
            den = 0;
        r = d.s / den;
        if (pl->op == KILN_REDUCE_STD)
            r = sqrt(r);
        break;
    }
    case KILN_REDUCE_LOGSUMEXP: {
        if (!a.any) {
            r = -INFINITY;
        } else if (a.s != a.s || isinf(a.s)) {
            r = a.s; /* NaN, +inf, or every element -inf */
        } else {
            racc d = reduce_range(j, base, P_DEV, a.s, split);
            r = a.s + log(d.s);
        }
        break;
    }
    case KILN_REDUCE_NORM: {
        double p = pl->param;
        if (p == 0 || p == 1 || isinf(p))
            r = a.s;
        else if (p == 2)
            r = sqrt(a.s);
        else
            r = pow(a.s, 1.0 / p);
        break;
    }
    default: r = a.s; break;
    }
    kiln__cpu_st(op, od, r);
}

static void out_range(void *argp, int64_t b, int64_t e)
{
    rjob *j = argp;
    for (int64_t i = b; i < e; i++)
        reduce_one(j, i, false);
}

/* ------------------------------------------------------------------ f32 fast path */

/* The reductions training runs every step — a bias gradient (sum over the rows of a
 * [rows, features] matrix), batch-norm statistics (sum/mean/var over N, H, W of an NCHW
 * tensor) — reduce a contiguous f32 tensor whose kept dims form one block: in canonical
 * form it is [A, K, B] with the K outputs in the middle. The generic walk above visits
 * each output's elements with stride K*B, one load at a time through the dtype switch;
 * here a B == 1 reduction adds whole rows into a row of double accumulators (unit
 * stride, vectorized), and a B > 1 one sums contiguous runs of B with eight independent
 * lanes. Accumulation stays in double as everywhere else in this file. */
typedef struct fplan {
    const kiln__cpu_kernels *k; /* sum_run_f32 / sqdev_run_f32, vectorized per table */
    const float *x;
    char *out;
    kiln_dtype od;
    kiln_reduce_op op;
    double param;
    int64_t A, K, B;
} fplan;

enum { FCHUNK = 256 };

static void fast_store(const fplan *f, int64_t k, double sum, double dev)
{
    double n = (double)(f->A * f->B), r;
    switch (f->op) {
    case KILN_REDUCE_MEAN: r = sum / n; break;
    case KILN_REDUCE_VAR: case KILN_REDUCE_STD: {
        double den = n - f->param;
        r = dev / (den < 0 ? 0 : den);
        if (f->op == KILN_REDUCE_STD)
            r = sqrt(r);
        break;
    }
    default: r = sum; break;
    }
    kiln__cpu_st(f->out + k * (int64_t)kiln__cpu_esize(f->od), f->od, r);
}

static bool fast_two_pass(const fplan *f)
{
    return f->op == KILN_REDUCE_VAR || f->op == KILN_REDUCE_STD;
}

/* Outputs [k0, k1) in chunks of FCHUNK. */
static void fast_range(void *argp, int64_t k0, int64_t k1)
{
    const fplan *f = argp;
    double s[FCHUNK], d[FCHUNK], c[FCHUNK];
    double n = (double)(f->A * f->B);
    for (int64_t kb = k0; kb < k1; kb += FCHUNK) {
        int64_t m = k1 - kb < FCHUNK ? k1 - kb : FCHUNK;
        for (int64_t i = 0; i < m; i++)
            s[i] = d[i] = 0;
        if (f->B == 1) {
            f->k->colsum_f32(s, f->x + kb, f->A, f->K, m);
            if (fast_two_pass(f)) {
                for (int64_t i = 0; i < m; i++)
                    c[i] = s[i] / n;
                for (int64_t a = 0; a < f->A; a++) {
                    const float *row = f->x + a * f->K + kb;
                    for (int64_t i = 0; i < m; i++) {
                        double v = row[i] - c[i];
                        d[i] += v * v;
                    }
                }
            }
        } else {
            for (int64_t i = 0; i < m; i++) {
                if (!fast_two_pass(f)) {
                    for (int64_t a = 0; a < f->A; a++)
                        s[i] += f->k->sum_run_f32(f->x + (a * f->K + kb + i) * f->B, f->B);
                    continue;
                }
                /* Variance in one trip through memory: each run's two passes (sum, then
                 * squared deviations from the run's mean) hit cache, and the runs are
                 * merged with the pairwise update (Chan et al.), which does not cancel. */
                double cnt = 0, mean = 0, m2 = 0, nb = (double)f->B;
                for (int64_t a = 0; a < f->A; a++) {
                    const float *run = f->x + (a * f->K + kb + i) * f->B;
                    double rs = f->k->sum_run_f32(run, f->B);
                    double rm = rs / nb, rd = f->k->sqdev_run_f32(run, f->B, rm);
                    double tot = cnt + nb, delta = rm - mean;
                    mean += delta * nb / tot;
                    m2 += rd + delta * delta * cnt * nb / tot;
                    cnt = tot;
                    s[i] += rs;
                }
                d[i] = m2;
            }
        }
        for (int64_t i = 0; i < m; i++)
            fast_store(f, kb + i, s[i], d[i]);
    }
}

/* Takes the reduction when it fits the [A, K, B] form; false leaves it to the walk. */
static bool reduce_fast_f32(kiln__cpu_ctx *ctx, kiln_reduce_op op, const kiln_tdesc *out,
                            const kiln_tdesc *in, uint32_t mask, double param)
{
    if (in->dtype != KILN_F32 || (out->dtype != KILN_F32 && out->dtype != KILN_F64) ||
        (op != KILN_REDUCE_SUM && op != KILN_REDUCE_MEAN && op != KILN_REDUCE_VAR &&
         op != KILN_REDUCE_STD) ||
        !kiln__cpu_contig(in))
        return false;
    /* Dims of size 1 are neither; the kept ones must form one block, contiguous in out. */
    int64_t A = 1, K = 1, B = 1, ostride = 1;
    int state = 0; /* 0: leading reduced, 1: kept block, 2: trailing reduced */
    for (int d = in->ndim - 1; d >= 0; d--) {
        if (in->shape[d] == 1)
            continue;
        bool red = (mask >> d) & 1u;
        if (red) {
            if (state == 0)
                B *= in->shape[d];
            else {
                state = 2;
                A *= in->shape[d];
            }
        } else {
            if (state == 2)
                return false;
            state = 1;
            if (out->strides[d] != ostride)
                return false;
            ostride *= in->shape[d];
            K *= in->shape[d];
        }
    }
    int64_t total = A * K * B;
    if (total == 0 || A * B == 1 || K < ctx->nthreads)
        return false;
    fplan f = {ctx->k, kiln__cpu_ptr(in), kiln__cpu_ptr(out), out->dtype, op, param, A, K, B};
    int64_t per = A * B * (fast_two_pass(&f) ? 2 : 1);
    int64_t grain = per >= 16384 ? 1 : 16384 / per;
    if (B == 1 && grain < 16)
        grain = 16; /* rows of at least 16 accumulators keep the row loop vectorized */
    kiln__cpu_parallel_for(ctx, K, grain, fast_range, &f);
    return true;
}

int kiln__cpu_reduce(void *vctx, kiln_reduce_op op, const kiln_tdesc *out, const kiln_tdesc *in,
                     uint32_t mask, double param)
{
    kiln__cpu_ctx *ctx = vctx;
    if ((unsigned)op >= KILN_REDUCE_COUNT)
        return kiln__error_set("cpu reduce: unknown op %d", (int)op), KILN_EINVAL;
    if (reduce_fast_f32(ctx, op, out, in, mask, param))
        return 0;
    rplan pl;
    memset(&pl, 0, sizeof pl);
    pl.in = in;
    pl.out = out;
    pl.op = op;
    pl.param = param;
    pl.int_acc = kiln__cpu_is_int(in->dtype) && kiln__cpu_is_int(out->dtype) &&
                 (op == KILN_REDUCE_SUM || op == KILN_REDUCE_PROD || op == KILN_REDUCE_MAX ||
                  op == KILN_REDUCE_MIN);
    pl.rcount = 1;
    int64_t nout = 1;
    for (int d = 0; d < in->ndim; d++) {
        bool red = (mask >> d) & 1u;
        if (red) {
            pl.rcount *= in->shape[d];
            if (in->shape[d] == 1)
                continue;
            if (pl.nr > 0 && pl.rstride[pl.nr - 1] == in->strides[d] * in->shape[d]) {
                pl.rshape[pl.nr - 1] *= in->shape[d];
                pl.rstride[pl.nr - 1] = in->strides[d];
            } else {
                pl.rshape[pl.nr] = in->shape[d];
                pl.rstride[pl.nr] = in->strides[d];
                pl.nr++;
            }
        } else {
            nout *= in->shape[d];
            pl.kshape[pl.nk] = in->shape[d];
            pl.kin[pl.nk] = in->strides[d];
            pl.kout[pl.nk] = out->strides[d];
            pl.nk++;
        }
    }
    if (pl.nr == 0) {
        pl.rshape[0] = 1;
        pl.rstride[0] = 1;
        pl.nr = 1;
        if (pl.rcount == 0)
            pl.rshape[0] = 0;
    }
    pl.inner = pl.rshape[pl.nr - 1];
    if (nout == 0)
        return 0;
    rjob j = {.pl = &pl, .ctx = ctx};
    if (pl.inner == 0) {
        /* nothing to reduce over: the identity of each op */
        for (int64_t i = 0; i < nout; i++)
            reduce_one(&j, i, false);
        return 0;
    }
    if (nout < ctx->nthreads && pl.rcount >= 65536) {
        for (int64_t i = 0; i < nout; i++)
            reduce_one(&j, i, true);
        return 0;
    }
    int64_t grain = pl.rcount >= 16384 ? 1 : 16384 / pl.rcount;
    kiln__cpu_parallel_for(ctx, nout, grain, out_range, &j);
    return 0;
}

/* ------------------------------------------------------------------ arg_reduce */

typedef struct line_job {
    const kiln_tdesc *out, *in;
    int dim;
    bool flag;
} line_job;

static void argred_range(void *argp, int64_t b, int64_t e)
{
    const line_job *j = argp;
    const kiln_tdesc *in = j->in, *out = j->out;
    int dim = j->dim;
    int64_t n = in->shape[dim], st = in->strides[dim];
    int64_t es = (int64_t)kiln__cpu_esize(in->dtype);
    const char *ib = kiln__cpu_ptr(in);
    int64_t *ob = kiln__cpu_ptr(out);
    bool is_int = kiln__cpu_is_int(in->dtype);
    for (int64_t l = b; l < e; l++) {
        const char *p = ib + kiln__cpu_line_offset(in, dim, l) * es;
        int64_t best = 0;
        if (is_int) {
            int64_t bv = n ? kiln__cpu_ldi(p, in->dtype) : 0;
            for (int64_t i = 1; i < n; i++) {
                int64_t v = kiln__cpu_ldi(p + i * st * es, in->dtype);
                if (j->flag ? v > bv : v < bv) {
                    bv = v;
                    best = i;
                }
            }
        } else {
            double bv = n ? kiln__cpu_ld(p, in->dtype) : 0;
            for (int64_t i = 1; i < n && bv == bv; i++) {
                double v = kiln__cpu_ld(p + i * st * es, in->dtype);
                if (v != v || (j->flag ? v > bv : v < bv)) {
                    bv = v;
                    best = i;
                }
            }
        }
        ob[kiln__cpu_line_offset(out, dim, l)] = best;
    }
}

int kiln__cpu_arg_reduce(void *vctx, bool is_max, const kiln_tdesc *out, const kiln_tdesc *in, int dim)
{
    if (dim < 0 || dim >= in->ndim)
        return kiln__error_set("cpu arg_reduce: dim %d out of range", dim), KILN_EINVAL;
    line_job j = {out, in, dim, is_max};
    int64_t n = in->shape[dim] ? in->shape[dim] : 1;
    kiln__cpu_parallel_for(vctx, kiln__cpu_nlines(in, dim), 1 + 16384 / n, argred_range, &j);
    return 0;
}

/* ------------------------------------------------------------------ cumsum */

static void cumsum_range(void *argp, int64_t b, int64_t e)
{
    const line_job *j = argp;
    const kiln_tdesc *in = j->in, *out = j->out;
    int dim = j->dim;
    int64_t n = in->shape[dim], ist = in->strides[dim], ost = out->strides[dim];
    int64_t ies = (int64_t)kiln__cpu_esize(in->dtype), oes = (int64_t)kiln__cpu_esize(out->dtype);
    const char *ib = kiln__cpu_ptr(in);
    char *ob = kiln__cpu_ptr(out);
    bool ints = kiln__cpu_is_int(in->dtype) && kiln__cpu_is_int(out->dtype);
    for (int64_t l = b; l < e; l++) {
        const char *p = ib + kiln__cpu_line_offset(in, dim, l) * ies;
        char *q = ob + kiln__cpu_line_offset(out, dim, l) * oes;
        if (ints) {
            uint64_t s = 0;
            for (int64_t i = 0; i < n; i++) {
                s += (uint64_t)kiln__cpu_ldi(p + i * ist * ies, in->dtype);
                kiln__cpu_sti(q + i * ost * oes, out->dtype, (int64_t)s);
            }
        } else {
            double s = 0;
            for (int64_t i = 0; i < n; i++) {
                s += kiln__cpu_ld(p + i * ist * ies, in->dtype);
                kiln__cpu_st(q + i * ost * oes, out->dtype, s);
            }
        }
    }
}

int kiln__cpu_cumsum(void *vctx, const kiln_tdesc *out, const kiln_tdesc *in, int dim)
{
    if (dim < 0 || dim >= in->ndim)
        return kiln__error_set("cpu cumsum: dim %d out of range", dim), KILN_EINVAL;
    line_job j = {out, in, dim, false};
    int64_t n = in->shape[dim] ? in->shape[dim] : 1;
    kiln__cpu_parallel_for(vctx, kiln__cpu_nlines(in, dim), 1 + 16384 / n, cumsum_range, &j);
    return 0;
}
