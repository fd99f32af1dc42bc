/*
 * backends/cpu/cpu-fused.c — the cpu's fused_run: a kiln_fused_program
 * (backends/fused-program.h) evaluated per cache-sized block with the unfused kernels.
 *
 * The element range is cut into one chunk per thread and each chunk into blocks of a
 * few thousand elements. For a block, every instruction runs as one call of the kernel
 * table's vectorized unary_f32 / binary_f32 (the AVX2 / AVX-512 math of cpu-math*.h)
 * over registers that are block-long scratch arrays, so a chain's intermediates live in
 * L1/L2 and only the program's loads and stores touch memory. Using the very kernels of
 * the unfused entries makes the fused result equal to the unfused one to the bit.
 *
 * Why a block interpreter rather than C generated and compiled at run time: per block
 * the interpretation costs one indirect call per instruction (~10 ns) against thousands
 * of elements of work, under 1% of a memory-bound chain, while a run-time compiler costs
 * tens of milliseconds per new program and would still call libm or re-implement the
 * vector math. docs/architecture.md ("Fusion") has the measurement.
 *
 * Registers cost no copies where they need none: a contiguous load points into its
 * input, a broadcast scalar (every stride 0) and a constant are one element read with
 * stride 0 (binary_f32 takes strides 0 or 1), and the last op of a value that is stored
 * once writes straight into its output block. Only strided views are gathered. Scratch
 * registers are reused once their value is dead, so a long chain needs few of them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cpu-fused-impl.h"

static void normalize(fin *f, const kiln_tdesc *d)
{
    f->is_bool = d->dtype == KILN_BOOL;
    f->dtype = d->dtype;
    f->base = d->dtype == KILN_F32 ? (const float *)kiln__cpu_ptr(d) : NULL;
    f->bytes = d->dtype == KILN_F32 ? NULL : (const uint8_t *)kiln__cpu_ptr(d);
    f->nd = 0;
    for (int i = 0; i < d->ndim; i++) {
        if (d->shape[i] == 1)
            continue;
        if (f->nd > 0 && f->strides[f->nd - 1] == d->strides[i] * d->shape[i]) {
            f->shape[f->nd - 1] *= d->shape[i];
            f->strides[f->nd - 1] = d->strides[i];
            continue;
        }
        f->shape[f->nd] = d->shape[i];
        f->strides[f->nd++] = d->strides[i];
    }
    if (f->nd == 0) { /* one element */
        f->shape[0] = 1;
        f->strides[0] = 0;
        f->nd = 1;
    }
    bool all_zero = true;
    for (int i = 0; i < f->nd; i++)
        all_zero = all_zero && f->strides[i] == 0;
    if (f->dtype != KILN_F32)
        f->kind = IN_GATHER;
    else if (all_zero)
        f->kind = IN_SCALAR;
    else if (f->nd == 1 && f->strides[0] == 1)
        f->kind = IN_CONTIG;
    else
        f->kind = IN_GATHER;
}

int64_t kiln__cpu_fused_offset_of(const fin *f, int64_t i0)
{
    int64_t off = 0;
    for (int d = f->nd - 1; d >= 0; d--) {
        off += (i0 % f->shape[d]) * f->strides[d];
        i0 /= f->shape[d];
    }
    return off;
}

/* Elements [i0, i0 + m) of a strided input into t. */
static void gather(const kiln__cpu_kernels *k, const fin *f, float *restrict t, int64_t i0, int64_t m)
{
    int64_t idx[KILN_MAX_DIMS], rem = i0, off = 0;
    for (int d = f->nd - 1; d >= 0; d--) {
        idx[d] = rem % f->shape[d];
        rem /= f->shape[d];
        off += idx[d] * f->strides[d];
    }
    int last = f->nd - 1;
    int64_t s = f->strides[last];
    while (m > 0) {
        int64_t run = f->shape[last] - idx[last];
        if (run > m)
            run = m;
        if (f->is_bool) {
            const uint8_t *restrict src = f->bytes + off;
            if (s == 1)
                for (int64_t j = 0; j < run; j++)
                    t[j] = src[j] ? 1.0f : 0.0f;
            else
                for (int64_t j = 0; j < run; j++)
                    t[j] = src[j * s] ? 1.0f : 0.0f;
        } else if (f->dtype == KILN_F16 && s == 1) {
            k->f16_to_f32(t, (const uint16_t *)f->bytes + off, run);
        } else if (f->dtype == KILN_F16 || f->dtype == KILN_BF16) {
            const uint16_t *src = (const uint16_t *)f->bytes + off;
            for (int64_t j = 0; j < run; j++)
                t[j] = f->dtype == KILN_BF16 ? kiln_bf16_to_f32(src[j * s]) : kiln_f16_to_f32(src[j * s]);
        } else if (s == 1) {
            memcpy(t, f->base + off, (size_t)run * sizeof *t);
        } else if (s == 0) {
            k->fill_f32(t, f->base[off], run);
        } else {
            const float *src = f->base + off;
            for (int64_t j = 0; j < run; j++)
                t[j] = src[j * s];
        }
        t += run;
        m -= run;
        off += run * s;
        idx[last] += run;
        for (int d = last; d > 0 && idx[d] == f->shape[d]; d--) {
            off -= idx[d] * f->strides[d];
            idx[d] = 0;
            idx[d - 1]++;
            off += f->strides[d - 1];
        }
    }
}

static bool overlaps_input(const kiln_fused_program *p, const kiln_tdesc *o)
{
    for (int i = 0; i < p->ninputs; i++)
        if (p->inputs[i].buf == o->buf)
            return true;
    return false;
}

/* v rounded to dtype and back (f16, bf16), as a value stored in a tensor of it reads. */
static float round_to(kiln_dtype dtype, float v)
{
    if (dtype == KILN_F16)
        return kiln_f16_to_f32(kiln_f32_to_f16(v));
    if (dtype == KILN_BF16)
        return kiln_bf16_to_f32(kiln_f32_to_bf16(v));
    return v;
}

/* v[0, m) rounded to dtype and back in place: an f16/bf16 program's result of each op, as
 * the unfused op stores it and the next one loads it. */
static void round_run(const kiln__cpu_kernels *k, kiln_dtype dtype, float *v, int64_t m)
{
    uint16_t h[256];
    for (int64_t j0 = 0; j0 < m; j0 += 256) {
        int64_t n = m - j0 < 256 ? m - j0 : 256;
        if (dtype == KILN_F16) {
            k->f32_to_f16(h, v + j0, n);
            k->f16_to_f32(v + j0, h, n);
        } else {
            for (int64_t j = 0; j < n; j++)
                v[j0 + j] = kiln_bf16_to_f32(kiln_f32_to_bf16(v[j0 + j]));
        }
    }
}

int kiln__cpu_fused_plan(fplan *pl, const kiln_fused_program *p)
{
    if ((p->dtype != KILN_F32 && p->dtype != KILN_F16 && p->dtype != KILN_BF16) ||
        p->ninstrs > KILN_FUSED_MAX_INSTRS || p->ninputs > KILN_FUSED_MAX_INPUTS ||
        p->noutputs > KILN_FUSED_MAX_OUTPUTS || p->nregs > KILN_FUSED_MAX_INSTRS * 2 || p->n < 0)
        return KILN_ENOTSUP;
    /* f16 and bf16 programs: elementwise instructions only (rows and products stay f32) */
    pl->half = p->dtype != KILN_F32;
    for (int i = 0; i < p->ninstrs && pl->half; i++)
        if (kiln__cpu_fused_producer(p->instrs[i].code) || p->instrs[i].code == KILN_FUSED_SOFTMAX ||
            p->instrs[i].code == KILN_FUSED_LAYER_NORM || p->instrs[i].code == KILN_FUSED_REDUCE ||
            p->instrs[i].code == KILN_FUSED_ROW_REDUCE)
            return KILN_ENOTSUP;
    int prc = kiln__cpu_fused_plan_product(pl, p);
    if (prc < 0)
        return prc;
    pl->product = prc > 0;
    for (int i = 0; i < p->ninputs; i++) {
        if (pl->product &&
            (i == p->instrs[0].arg || i == p->instrs[0].arg2 || (pl->conv && i == p->instrs[0].arg3))) {
            pl->in[i].kind = IN_OPERAND;
            continue;
        }
        if (p->inputs[i].dtype != p->dtype && p->inputs[i].dtype != KILN_BOOL)
            return KILN_ENOTSUP;
        normalize(&pl->in[i], &p->inputs[i]);
        /* an input the program also writes (an in-place update) is copied into scratch
         * when loaded, so a store to it cannot change a value that is still to be read */
        for (int k = 0; k < p->noutputs; k++)
            if (p->outputs[k].buf == p->inputs[i].buf)
                pl->in[i].kind = IN_GATHER, pl->in[i].copy_in = true;
    }
    /* strided inputs contiguous along one common last dim of a few hundred elements or
     * more are read in place, blocks cut at its row boundaries */
    /* a reduction's rows fix the row length (blocks and jobs never cross one) */
    if (p->reduce_inner < 0 || (p->reduce_inner > 0 && p->n % p->reduce_inner))
        return KILN_ENOTSUP;
    pl->row = p->reduce_inner;
    for (int i = 0; i < p->ninstrs; i++) {
        pl->whole_rows = pl->whole_rows || p->instrs[i].code == KILN_FUSED_SOFTMAX ||
                         p->instrs[i].code == KILN_FUSED_LAYER_NORM ||
                         p->instrs[i].code == KILN_FUSED_ROW_REDUCE; /* (all take rows whole) */
        pl->has_reduce = pl->has_reduce || p->instrs[i].code == KILN_FUSED_REDUCE;
    }
    /* blocks of several whole rows (a program with a softmax) cross the rows that IN_ROWS
     * inputs are read in place along, so those are gathered instead */
    bool multi_row = pl->whole_rows;
    for (int i = 0; i < p->ninputs && !p->reduce_inner; i++) {
        const fin *f = &pl->in[i];
        if (f->kind != IN_GATHER || f->copy_in || f->dtype != KILN_F32 || f->strides[f->nd - 1] != 1 ||
            f->shape[f->nd - 1] < 256)
            continue;
        if (pl->row == 0)
            pl->row = f->shape[f->nd - 1];
        else if (pl->row != f->shape[f->nd - 1])
            pl->row = -1;
    }
    if (pl->row < 0)
        pl->row = 0;
    for (int i = 0; i < p->ninputs && pl->row && !multi_row; i++)
        if (pl->in[i].kind == IN_GATHER && !pl->in[i].copy_in && pl->in[i].dtype == KILN_F32 &&
            pl->in[i].strides[pl->in[i].nd - 1] == 1 && pl->in[i].shape[pl->in[i].nd - 1] == pl->row)
            pl->in[i].kind = IN_ROWS;
    for (int i = 0; i < p->noutputs; i++) {
        if ((p->outputs[i].dtype != p->dtype && p->outputs[i].dtype != KILN_BOOL) ||
            !kiln__cpu_contig(&p->outputs[i]))
            return KILN_ENOTSUP;
        if (p->outputs[i].dtype == KILN_BOOL)
            pl->out_bool[i] = kiln__cpu_ptr(&p->outputs[i]);
        else if (pl->half)
            pl->out_half[i] = kiln__cpu_ptr(&p->outputs[i]);
        else
            pl->out[i] = kiln__cpu_ptr(&p->outputs[i]);
    }
    /* Outputs of this size would only evict each other from the caches: they are
     * written with non-temporal stores from a scratch register, which also saves the
     * read-for-ownership of every output line (the unfused kernels stream from the same
     * size on). */
    pl->stream = p->n >= ((int64_t)1 << 21);
    int contiguous_inputs = 0;
    for (int i = 0; i < p->ninputs; i++)
        contiguous_inputs += pl->in[i].kind == IN_CONTIG;
    pl->prefetch = pl->stream && contiguous_inputs > 0 && contiguous_inputs <= 2;
    for (int i = 0; i < p->ninstrs; i++)
        pl->nheavy += p->instrs[i].code == KILN_FUSED_UNARY && kiln__cpu_fused_heavy(p->instrs[i].op);
    /* the instruction defining each register, its last reader, and how often it is stored */
    int def[KILN_FUSED_MAX_INSTRS * 2], last_use[KILN_FUSED_MAX_INSTRS * 2], stores[KILN_FUSED_MAX_INSTRS * 2];
    for (int r = 0; r < p->nregs; r++)
        def[r] = last_use[r] = -1, stores[r] = 0;
    for (int i = 0; i < p->ninstrs; i++) {
        const kiln_fused_instr *in = &p->instrs[i];
        bool ln = in->code == KILN_FUSED_LAYER_NORM;
        bool row_reduce = in->code == KILN_FUSED_ROW_REDUCE;
        bool reads_a = in->code == KILN_FUSED_UNARY || in->code == KILN_FUSED_BINARY ||
                       in->code == KILN_FUSED_WHERE || in->code == KILN_FUSED_STORE ||
                       in->code == KILN_FUSED_REDUCE || in->code == KILN_FUSED_SOFTMAX || ln || row_reduce;
        bool reads_b = in->code == KILN_FUSED_BINARY || in->code == KILN_FUSED_WHERE || (ln && in->b >= 0);
        bool reads_c = in->code == KILN_FUSED_WHERE || (ln && in->c >= 0);
        if ((unsigned)in->code >= KILN_FUSED_CODE_COUNT ||
            (reads_a && ((unsigned)in->a >= (unsigned)p->nregs || def[in->a] < 0)) ||
            (reads_b && ((unsigned)in->b >= (unsigned)p->nregs || def[in->b] < 0)) ||
            (reads_c && ((unsigned)in->c >= (unsigned)p->nregs || def[in->c] < 0)))
            return KILN_ENOTSUP;
        if (in->code == KILN_FUSED_UNARY && ((unsigned)in->op >= KILN_UNARY_COUNT || in->op == KILN_UNARY_ISNAN ||
                                             in->op == KILN_UNARY_ISINF || in->op == KILN_UNARY_LOGICAL_NOT))
            return KILN_ENOTSUP;
        if (in->code == KILN_FUSED_BINARY && (unsigned)in->op > KILN_BINARY_GE)
            return KILN_ENOTSUP;
        if (in->code == KILN_FUSED_LOAD && (unsigned)in->arg >= (unsigned)p->ninputs)
            return KILN_ENOTSUP;
        if ((in->code == KILN_FUSED_STORE || in->code == KILN_FUSED_REDUCE) &&
            (unsigned)in->arg >= (unsigned)p->noutputs)
            return KILN_ENOTSUP;
        if ((in->code == KILN_FUSED_SOFTMAX || ln || row_reduce) &&
            (p->reduce_inner <= 0 || p->reduce_inner > 8192))
            return KILN_ENOTSUP;
        if (row_reduce && in->op != KILN_REDUCE_SUM && in->op != KILN_REDUCE_MEAN)
            return KILN_ENOTSUP;
        if (in->code == KILN_FUSED_REDUCE && ((in->op != KILN_REDUCE_SUM && in->op != KILN_REDUCE_MEAN &&
                                               in->op != KILN_REDUCE_MAX && in->op != KILN_REDUCE_MIN) ||
                                              p->reduce_inner <= 0 || p->outputs[in->arg].dtype != KILN_F32))
            return KILN_ENOTSUP;
        if (reads_a)
            last_use[in->a] = i;
        if (reads_b)
            last_use[in->b] = i;
        if (reads_c)
            last_use[in->c] = i;
        if (in->code == KILN_FUSED_STORE) {
            stores[in->a]++;
        } else if (in->code == KILN_FUSED_REDUCE) {
            stores[in->a] += 2; /* read in place, never written straight to an output */
        } else {
            if ((unsigned)in->dst >= (unsigned)p->nregs || def[in->dst] >= 0)
                return KILN_ENOTSUP;
            def[in->dst] = i;
        }
    }
    /* A layer norm's weight or bias, a row broadcast over the rows that nothing else reads,
     * is read in place (one row serves every row) instead of gathered block-long. */
    for (int i = 0; i < p->ninstrs; i++) {
        const kiln_fused_instr *ld = &p->instrs[i];
        if (ld->code != KILN_FUSED_LOAD)
            continue;
        fin *f = &pl->in[ld->arg];
        if (f->kind != IN_GATHER || f->copy_in || f->dtype != KILN_F32 || f->nd != 2 || f->strides[0] != 0 ||
            f->strides[1] != 1 || f->shape[1] != p->reduce_inner)
            continue;
        bool only_norms = true;
        for (int j = 0; j < p->ninstrs && only_norms; j++) {
            const kiln_fused_instr *u = &p->instrs[j];
            switch (u->code) {
            case KILN_FUSED_LOAD:
            case KILN_FUSED_CONST:
            case KILN_FUSED_MATMUL:
            case KILN_FUSED_CONV:
            case KILN_FUSED_POOL_GRAD: break;
            case KILN_FUSED_LAYER_NORM: only_norms = u->a != ld->dst; break;
            case KILN_FUSED_BINARY: only_norms = u->a != ld->dst && u->b != ld->dst; break;
            case KILN_FUSED_WHERE: only_norms = u->a != ld->dst && u->b != ld->dst && u->c != ld->dst; break;
            default: only_norms = u->a != ld->dst; break;
            }
        }
        if (only_norms) {
            f->kind = IN_ROWVEC;
            pl->rowvec[ld->dst] = true;
        }
    }
    /* scalar-ness, direct writes and scratch slots, in program order */
    int free_slots[KILN_FUSED_MAX_INSTRS], nfree = 0;
    pl->nslots = 0;
    for (int i = 0; i < p->ninstrs; i++) {
        const kiln_fused_instr *in = &p->instrs[i];
        pl->slot[i] = pl->direct[i] = -1;
        pl->stored_direct[i] = false;
        if (in->code == KILN_FUSED_STORE) {
            pl->stored_direct[i] = pl->direct[def[in->a]] == in->arg;
        } else if (in->code == KILN_FUSED_REDUCE) {
            /* nothing to set up: its accumulator lives in the job */
        } else {
            bool sc = in->code == KILN_FUSED_CONST ||
                      (in->code == KILN_FUSED_LOAD && pl->in[in->arg].kind == IN_SCALAR) ||
                      (in->code == KILN_FUSED_UNARY && pl->scalar[in->a]) ||
                      (in->code == KILN_FUSED_BINARY && pl->scalar[in->a] && pl->scalar[in->b]) ||
                      (in->code == KILN_FUSED_WHERE && pl->scalar[in->a] && pl->scalar[in->b] &&
                       pl->scalar[in->c]);
            bool rows = in->code == KILN_FUSED_SOFTMAX || in->code == KILN_FUSED_LAYER_NORM ||
                        in->code == KILN_FUSED_ROW_REDUCE;
            if (rows &&
                (pl->scalar[in->a] || (in->code == KILN_FUSED_LAYER_NORM &&
                                       ((in->b >= 0 && pl->scalar[in->b]) || (in->c >= 0 && pl->scalar[in->c])))))
                return KILN_ENOTSUP; /* a row of one repeated value: left to the unfused entry */
            if (rows)
                sc = false;
            pl->scalar[in->dst] = sc;
            if (in->code == KILN_FUSED_CONST)
                pl->consts[i] = round_to(p->dtype, (float)in->alpha);
            bool computes = in->code == KILN_FUSED_UNARY || in->code == KILN_FUSED_BINARY ||
                            in->code == KILN_FUSED_WHERE || rows;
            if (computes && !sc && stores[in->dst] == 1 && !pl->stream) {
                for (int j = i + 1; j < p->ninstrs; j++)
                    if (p->instrs[j].code == KILN_FUSED_STORE && p->instrs[j].a == in->dst &&
                        pl->out[p->instrs[j].arg] && !overlaps_input(p, &p->outputs[p->instrs[j].arg]))
                        pl->direct[i] = p->instrs[j].arg;
            }
            bool needs_slot = (computes && pl->direct[i] < 0) ||
                              (in->code == KILN_FUSED_LOAD && pl->in[in->arg].kind == IN_GATHER);
            if (needs_slot)
                pl->slot[i] = nfree ? free_slots[--nfree] : pl->nslots++;
            /* a stored product is computed straight into its output (its first store) */
            for (int j = i + 1; kiln__cpu_fused_producer(in->code) && j < p->ninstrs && pl->direct[i] < 0; j++)
                if (p->instrs[j].code == KILN_FUSED_STORE && p->instrs[j].a == in->dst &&
                    pl->out[p->instrs[j].arg] && !overlaps_input(p, &p->outputs[p->instrs[j].arg]))
                    pl->direct[i] = pl->product_out = p->instrs[j].arg;
        }
        /* registers read here for the last time give their slots back (after dst took one,
         * so an instruction never writes the scratch it reads: unary_f32 is restrict) */
        int reads[3] = {-1, -1, -1};
        if (in->code != KILN_FUSED_LOAD && in->code != KILN_FUSED_CONST && !kiln__cpu_fused_producer(in->code))
            reads[0] = in->a;
        bool ln = in->code == KILN_FUSED_LAYER_NORM;
        if ((in->code == KILN_FUSED_BINARY || in->code == KILN_FUSED_WHERE || ln) && in->b != in->a)
            reads[1] = in->b;
        if ((in->code == KILN_FUSED_WHERE || ln) && in->c != in->a && in->c != in->b)
            reads[2] = in->c;
        for (int k = 0; k < 3; k++)
            if (reads[k] >= 0 && last_use[reads[k]] == i && pl->slot[def[reads[k]]] >= 0)
                free_slots[nfree++] = pl->slot[def[reads[k]]];
    }
    return 0;
}

/* The largest (max) or smallest of acc and x[0, m) (stride 0: x[0] m times), NaN once any
 * is NaN, as the unfused reduce gives. */
static double extreme_run(const float *x, int64_t stride, int64_t m, bool max, double acc)
{
    if (acc != acc)
        return acc;
    if (stride == 0)
        m = m > 0 ? 1 : 0;
    float best = (float)acc;
    bool nan = false;
    if (max)
        for (int64_t j = 0; j < m; j++) {
            nan |= x[j] != x[j];
            best = x[j] > best ? x[j] : best;
        }
    else
        for (int64_t j = 0; j < m; j++) {
            nan |= x[j] != x[j];
            best = x[j] < best ? x[j] : best;
        }
    return nan ? (double)NAN : (double)best;
}

static void run_block(const fplan *pl, float *scratch, freg *regs, double *acc, int64_t i0, int64_t m,
                      const float *prod, kiln__cpu_prefetcher *pf)
{
    const kiln_fused_program *p = pl->p;
    int heavy_seen = 0; /* heavy ops run so far: each asks for its share of the next block */
    for (int i = 0; i < p->ninstrs; i++) {
        const kiln_fused_instr *in = &p->instrs[i];
        float *dst = pl->direct[i] >= 0 ? pl->out[pl->direct[i]] + i0
                     : pl->slot[i] >= 0 ? scratch + (int64_t)pl->slot[i] * pl->block
                                        : NULL;
        switch (in->code) {
        case KILN_FUSED_LOAD: {
            const fin *f = &pl->in[in->arg];
            if (f->kind == IN_CONTIG)
                regs[in->dst] = (freg){f->base + i0, 1};
            else if (f->kind == IN_SCALAR)
                regs[in->dst] = (freg){f->base, 0};
            else if (f->kind == IN_ROWS)
                regs[in->dst] = (freg){f->base + kiln__cpu_fused_offset_of(f, i0), 1};
            else if (f->kind == IN_ROWVEC)
                regs[in->dst] = (freg){f->base, 1};
            else {
                gather(pl->k, f, dst, i0, m);
                regs[in->dst] = (freg){dst, 1};
            }
            break;
        }
        case KILN_FUSED_CONST: regs[in->dst] = (freg){&pl->consts[i], 0}; break;
        case KILN_FUSED_MATMUL:
        case KILN_FUSED_CONV:
        case KILN_FUSED_POOL_GRAD: regs[in->dst] = (freg){prod, 1}; break;
        case KILN_FUSED_UNARY: {
            freg a = regs[in->a];
            if (pf->issued < pf->bytes && a.stride && kiln__cpu_fused_heavy(in->op)) {
                int64_t share = (pf->bytes + pl->nheavy - 1) / pl->nheavy, first = share * heavy_seen++;
                for (int64_t j = 0; j < m; j += KILN_CPU_PREFETCH_CHUNK) {
                    int64_t c = m - j < KILN_CPU_PREFETCH_CHUNK ? m - j : KILN_CPU_PREFETCH_CHUNK;
                    pl->k->unary_f32(in->op, dst + j, a.p + j, c, (float)in->alpha, (float)in->beta);
                    kiln__cpu_fused_prefetch_upto(pf, first + share * (j + c) / m);
                }
            } else
                pl->k->unary_f32(in->op, dst, a.p, a.stride ? m : 1, (float)in->alpha, (float)in->beta);
            if (pl->half)
                round_run(pl->k, p->dtype, dst, a.stride ? m : 1);
            regs[in->dst] = (freg){dst, a.stride};
            break;
        }
        case KILN_FUSED_BINARY: {
            freg a = regs[in->a], b = regs[in->b];
            int64_t s = a.stride || b.stride;
            if (in->op <= KILN_BINARY_MINIMUM) {
                pl->k->binary_f32(in->op, dst, a.p, a.stride, b.p, b.stride, s ? m : 1);
                if (pl->half)
                    round_run(pl->k, p->dtype, dst, s ? m : 1);
            } else
                pl->k->compare_f32(in->op, dst, a.p, a.stride, b.p, b.stride, s ? m : 1);
            regs[in->dst] = (freg){dst, s};
            break;
        }
        case KILN_FUSED_WHERE: {
            freg c = regs[in->a], a = regs[in->b], b = regs[in->c];
            int64_t s = a.stride || b.stride || c.stride;
            pl->k->where_f32(dst, c.p, c.stride, a.p, a.stride, b.p, b.stride, s ? m : 1);
            regs[in->dst] = (freg){dst, s};
            break;
        }
        case KILN_FUSED_SOFTMAX: {
            /* blocks hold whole rows here */
            freg a = regs[in->a];
            int64_t row = p->reduce_inner;
            for (int64_t r = 0; r < m; r += row)
                pl->k->softmax_row_f32(dst + r, a.p + r, row, in->op != 0);
            regs[in->dst] = (freg){dst, 1};
            break;
        }
        case KILN_FUSED_LAYER_NORM: {
            /* blocks hold whole rows; row r's weight and bias start at element r of theirs */
            freg a = regs[in->a];
            int64_t row = p->reduce_inner;
            const float *w = in->b >= 0 ? regs[in->b].p : NULL, *b = in->c >= 0 ? regs[in->c].p : NULL;
            for (int64_t r = 0; r < m; r += row) {
                double mean, rstd;
                const float *wr = !w ? NULL : pl->rowvec[in->b] ? w : w + r;
                const float *br = !b ? NULL : pl->rowvec[in->c] ? b : b + r;
                pl->k->layer_norm_row_f32(dst + r, a.p + r, row, wr, br, in->alpha, &mean, &rstd);
            }
            regs[in->dst] = (freg){dst, 1};
            break;
        }
        case KILN_FUSED_REDUCE: {
            /* a block is part of one row or holds whole rows (a program with a softmax):
             * add each row's part, store at the row's end */
            freg a = regs[in->a];
            int64_t inner = p->reduce_inner;
            bool extreme = in->op == KILN_REDUCE_MAX || in->op == KILN_REDUCE_MIN;
            for (int64_t j = 0, part; j < m; j += part) {
                part = inner - (i0 + j) % inner < m - j ? inner - (i0 + j) % inner : m - j;
                const float *v = a.p + j * a.stride;
                if (extreme && (i0 + j) % inner == 0)
                    acc[i] = in->op == KILN_REDUCE_MAX ? -INFINITY : INFINITY;
                if (extreme)
                    acc[i] = extreme_run(v, a.stride, part, in->op == KILN_REDUCE_MAX, acc[i]);
                else
                    acc[i] += a.stride ? pl->k->sum_run_f32(v, part) : (double)v[0] * (double)part;
                if ((i0 + j + part) % inner == 0) {
                    double r = in->op == KILN_REDUCE_MEAN ? acc[i] / (double)inner : acc[i];
                    pl->out[in->arg][(i0 + j + part) / inner - 1] = (float)r;
                    acc[i] = 0; /* (max and min start their rows afresh) */
                }
            }
            break;
        }
        case KILN_FUSED_ROW_REDUCE: {
            /* blocks hold whole rows; each row's sum as REDUCE takes it, over the row */
            freg a = regs[in->a];
            int64_t row = p->reduce_inner;
            for (int64_t r = 0; r < m; r += row) {
                double sum = pl->k->sum_run_f32(a.p + r, row);
                float v = (float)(in->op == KILN_REDUCE_MEAN ? sum / (double)row : sum);
                pl->k->fill_f32(dst + r, v, row);
            }
            regs[in->dst] = (freg){dst, 1};
            break;
        }
        default: { /* STORE */
            if (pl->stored_direct[i])
                break;
            freg a = regs[in->a];
            if (pl->out_half[in->arg]) {
                uint16_t *restrict oh = pl->out_half[in->arg] + i0;
                if (a.stride && p->dtype == KILN_F16)
                    pl->k->f32_to_f16(oh, a.p, m);
                else if (p->dtype == KILN_F16)
                    for (int64_t j = 0; j < m; j++)
                        oh[j] = kiln_f32_to_f16(a.p[0]);
                else
                    for (int64_t j = 0; j < m; j++)
                        oh[j] = kiln_f32_to_bf16(a.p[j * a.stride]);
                break;
            }
            if (pl->out_bool[in->arg]) {
                uint8_t *restrict ob = pl->out_bool[in->arg] + i0;
                const float *restrict v = a.p;
                if (a.stride)
                    for (int64_t j = 0; j < m; j++)
                        ob[j] = v[j] != 0;
                else
                    memset(ob, v[0] != 0, (size_t)m);
                break;
            }
            float *o = pl->out[in->arg] + i0;
            if (a.stride == 0)
                pl->k->fill_f32(o, a.p[0], m);
            else if (pl->stream)
                kiln__cpu_fused_store_stream(pl, o, a.p, m);
            else if (a.p != o)
                memmove(o, a.p, (size_t)m * sizeof *o);
            break;
        }
        }
    }
}

/* Elements [begin, end) through the program's compiled loop: one call per stretch that
 * crosses no row of a row-broadcast input (each call's inputs start where the stretch
 * does). A producer's values for elements [prod_lo, end) are at prod. */
static void jit_span(const fplan *pl, int64_t begin, int64_t end, const float *prod, int64_t prod_lo)
{
    const kiln_fused_program *p = pl->p;
    const float *in[KILN_FUSED_MAX_INPUTS + 1]; /* the inputs, then a producer's values */
    float *out[KILN_FUSED_MAX_OUTPUTS];
    float k[2 * KILN_FUSED_MAX_INSTRS];
    for (int i = 0; i < p->ninstrs; i++) {
        const kiln_fused_instr *ins = &p->instrs[i];
        k[2 * i] = ins->code == KILN_FUSED_CONST ? pl->consts[i] : (float)ins->alpha;
        k[2 * i + 1] = (float)ins->beta;
    }
    void (*fn[2])(void) = {(void (*)(void))pl->k->softmax_row_f32, (void (*)(void))pl->k->layer_norm_row_f32};
    if (pl->whole_rows) { /* one call for the span's rows; a REDUCE's output has one per row */
        for (int a = 0; a < p->ninputs; a++)
            in[a] = pl->in[a].kind == IN_CONTIG   ? pl->in[a].base + begin
                    : pl->in[a].kind == IN_GATHER ? pl->in[a].base + kiln__cpu_fused_offset_of(&pl->in[a], begin)
                                                  : pl->in[a].base;
        in[p->ninputs] = prod ? prod + (begin - prod_lo) : NULL;
        bool per_row[KILN_FUSED_MAX_OUTPUTS] = {false};
        for (int i = 0; i < p->ninstrs; i++) /* a REDUCE's output: one value per row */
            if (p->instrs[i].code == KILN_FUSED_REDUCE)
                per_row[p->instrs[i].arg] = true;
        bool aligned = (pl->row & 15) == 0; /* every row of every output on a 64-byte line */
        for (int o = 0; o < p->noutputs; o++) {
            out[o] = per_row[o] ? pl->out[o] + begin / pl->row : pl->out[o] + begin;
            aligned = aligned && (per_row[o] || ((uintptr_t)out[o] & 63) == 0);
        }
        pl->jit(end - begin, in, out, k, pl->stream && aligned, fn);
        return;
    }
    for (int64_t i0 = begin, m; i0 < end; i0 += m) {
        m = end - i0;
        if (pl->row && m > pl->row - i0 % pl->row)
            m = pl->row - i0 % pl->row;
        if (pl->stream && i0 % 16 && m > 16 - i0 % 16)
            m = 16 - i0 % 16; /* up to where 64-byte stores line up (a job's start, say) */
        for (int a = 0; a < p->ninputs; a++) {
            const fin *f = &pl->in[a];
            in[a] = f->kind == IN_CONTIG ? f->base + i0
                    : f->kind == IN_ROWS ? f->base + kiln__cpu_fused_offset_of(f, i0)
                                         : f->base;
        }
        in[p->ninputs] = prod ? prod + (i0 - prod_lo) : NULL;
        bool aligned = true;
        for (int o = 0; o < p->noutputs; o++) {
            out[o] = pl->out[o] + i0;
            aligned = aligned && ((uintptr_t)out[o] & 63) == 0;
        }
        pl->jit(m, in, out, k, pl->stream && aligned, fn);
    }
}

void kiln__cpu_fused_span(const fplan *pl, float *scratch, double *acc, int64_t begin, int64_t end,
                          const float *prod, int64_t prod_lo)
{
    if (pl->jit) {
        jit_span(pl, begin, end, prod, prod_lo);
        return;
    }
    freg regs[KILN_FUSED_MAX_INSTRS * 2];
    for (int64_t i0 = begin, m; i0 < end; i0 += m) {
        m = kiln__cpu_fused_block_len(pl, i0, end);
        kiln__cpu_prefetcher pf;
        kiln__cpu_fused_prefetch_next(pl, i0, m, end, &pf);
        run_block(pl, scratch, regs, acc, i0, m, prod ? prod + (i0 - prod_lo) : NULL, &pf);
        kiln__cpu_fused_prefetch_upto(&pf, pf.bytes); /* a heavy op skipped (a scalar operand) */
    }
}

static void run_job(void *arg, int job, int njobs)
{
    const fplan *pl = arg;
    int64_t n = pl->hi - pl->lo;
    int64_t begin = pl->lo + n * job / njobs, end = pl->lo + n * (job + 1) / njobs;
    if (pl->p->reduce_inner > 0) { /* whole rows per job */
        int64_t r = pl->p->reduce_inner, rows = n / r;
        begin = pl->lo + rows * job / njobs * r;
        end = pl->lo + rows * (job + 1) / njobs * r;
    }
    if (pl->jit) {
        jit_span(pl, begin, end, NULL, 0);
        return;
    }
    double acc[KILN_FUSED_MAX_INSTRS] = {0};
    float *scratch = (float *)(pl->scratch + (size_t)job * (size_t)pl->nslots * (size_t)pl->block * sizeof(float));
    kiln__cpu_fused_span(pl, scratch, acc, begin, end, NULL, 0);
#if defined(__x86_64__)
    if (pl->stream)
        _mm_sfence(); /* the streamed lines are visible before the job reports done */
#endif
}

static void run_range(kiln__cpu_ctx *ctx, fplan *pl, int64_t lo, int64_t hi, int64_t block)
{
    pl->lo = lo;
    pl->hi = hi;
    pl->block = block;
    if (hi <= lo)
        return;
    if (pl->njobs == 1)
        run_job(pl, 0, 1);
    else
        kiln__cpu_pool_run(ctx->pool, pl->njobs, run_job, pl);
}

/* Every output is written whole (each of its elements by a STORE or a REDUCE), so one
 * whose buffer it covers, and which no input or other output shares, takes the pool's most
 * recently parked block of its size (kiln__cpu_buffer_refresh), likely still in the caches.
 * The group recorded it before the group before it was flushed and gave its dead buffers
 * back, so its own block is usually one nothing touched for a while, where each unfused
 * op's output gets the block freed just before it. A 1x1 convolution 64 -> 256 on 56x56
 * with its batch norm and ReLU chained: 0.57 ms into the recorded block, 0.52-0.54 refreshed
 * (ResNet-50 as a whole did not move beyond the noise: docs/performance.md). */
static void refresh_outputs(kiln__cpu_ctx *ctx, const kiln_fused_program *p)
{
    for (int k = 0; k < p->noutputs; k++) {
        const kiln_tdesc *o = &p->outputs[k];
        int64_t n = kiln__cpu_numel(o); /* p->n, or n / reduce_inner for a REDUCE's */
        if (!o->buf || o->offset != 0 || (size_t)n * kiln__cpu_esize(o->dtype) < o->buf->nbytes)
            continue;
        bool shared = false;
        for (int i = 0; i < p->ninputs && !shared; i++)
            shared = p->inputs[i].buf == o->buf;
        for (int j = 0; j < p->noutputs && !shared; j++)
            shared = j != k && p->outputs[j].buf == o->buf;
        if (!shared)
            kiln__cpu_buffer_refresh(ctx, o->buf);
    }
}

int kiln__cpu_fused_run(void *vctx, const kiln_fused_program *p)
{
    kiln__cpu_ctx *ctx = vctx;
    refresh_outputs(ctx, p);
    fplan *pl = calloc(1, sizeof *pl);
    if (!pl)
        return kiln__cpu_enomem("fused");
    int rc = kiln__cpu_fused_plan(pl, p);
    if (rc < 0) {
        free(pl);
        return rc;
    }
    pl->p = p;
    pl->k = ctx->k;
    if (pl->product) {
        pl->block = p->reduce_inner > KILN_CPU_FUSED_BLOCK ? p->reduce_inner : KILN_CPU_FUSED_BLOCK;
        /* a convolution's chain runs inside it; any other epilogue as a compiled loop,
         * or NULL: interpreted */
        if (!kiln__cpu_fused_chain_plan(pl))
            pl->jit = kiln__cpu_jit_get(ctx, pl);
        rc = kiln__cpu_fused_product(ctx, pl);
        free(pl);
        return rc;
    }
    int64_t grain = 16384;
    int64_t jobs = p->n / grain;
    pl->njobs = jobs < 1 ? 1 : jobs > ctx->nthreads ? ctx->nthreads : (int)jobs;
    if (p->reduce_inner > 0) {
        int64_t rows = p->n / p->reduce_inner;
        /* a large reduction into fewer rows than threads runs better unfused (the cpu's
         * reduce splits a row over threads) */
        if (rows < pl->njobs && p->n >= ((int64_t)1 << 18)) {
            free(pl);
            return KILN_ENOTSUP;
        }
        if (rows < pl->njobs)
            pl->njobs = (int)rows;
    }
    if ((pl->jit = kiln__cpu_jit_get(ctx, pl)) != NULL) {
        run_range(ctx, pl, 0, p->n, KILN_CPU_FUSED_BLOCK);
        free(pl);
        return 0;
    }
    kiln__cpu_fused_tuning tuning;
    int64_t block = kiln__cpu_fused_block_begin(ctx, pl, &tuning);
    if (pl->whole_rows && block < p->reduce_inner)
        block = p->reduce_inner; /* a block holds a whole row (at most 8192) */
    size_t slab = (size_t)pl->nslots * (size_t)block * sizeof(float);
    if (slab && !(pl->scratch = aligned_alloc(64, slab * (size_t)pl->njobs))) {
        free(pl);
        return kiln__cpu_enomem("fused");
    }
    run_range(ctx, pl, 0, p->n, block);
    kiln__cpu_fused_block_end(&tuning);
    free(pl->scratch);
    free(pl);
    return 0;
}
