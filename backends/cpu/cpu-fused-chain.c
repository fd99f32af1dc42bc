/*
 * backends/cpu/cpu-fused-chain.c — a convolution's epilogue applied inside the
 * convolution: the common programs after a CONV (a batch norm in eval mode, (v - mean) ·
 * scale + shift with one value per channel, then a residual add and a ReLU) are linear
 * chains, each op combining the running value with a constant or a loaded operand. Such
 * a chain is handed to the conv entry (kiln__cpu_conv_chain), whose direct path applies
 * it to each tile of outputs right after computing it, while the tile is in L1, and
 * stores it once into the program's output.
 *
 * Otherwise the convolution's output goes to scratch and the program runs over it as a
 * second pass (cpu-fused-product.c): at batch 1 the image fits in L2, and that pass,
 * interpreted, cost about what the unfused ops' own passes did, so a fused ResNet-50 was
 * slower than an unfused one (docs/performance.md). Each op rounds as the separate op
 * does, so the results keep the unfused bits.
 */
#include <string.h>

#include "cpu-fused-impl.h"

/* Whether input f holds one value per output plane of osz elements (a per-channel
 * parameter expanded over the spatial dims): its trailing stride-0 dims span a multiple
 * of a plane, so the offset of element i depends only on i / osz. */
static bool per_plane(const fin *f, int64_t osz)
{
    int64_t span = 1;
    for (int d = f->nd - 1; d >= 0 && f->strides[d] == 0; d--)
        span *= f->shape[d];
    return osz > 0 && span % osz == 0;
}

/* The chain op for a binary op between the running value and operand register other
 * (rev: the running value is the right operand); false when it is not one. */
static bool chain_op(fplan *pl, const kiln_fused_instr *in, int other, bool rev, const int *load_of,
                     const bool *is_const, const float *cval, int64_t osz)
{
    kiln__cpu_chain *c = &pl->chain;
    if (c->nops == KILN__CHAIN_MAX_OPS)
        return false;
    kiln__cpu_chain_op *op = &c->ops[c->nops];
    memset(op, 0, sizeof *op);
    switch (in->op) {
    case KILN_BINARY_ADD: op->code = KILN__CHAIN_ADD; break;
    case KILN_BINARY_SUB: op->code = rev ? KILN__CHAIN_RSUB : KILN__CHAIN_SUB; break;
    case KILN_BINARY_MUL: op->code = KILN__CHAIN_MUL; break;
    case KILN_BINARY_DIV: op->code = rev ? KILN__CHAIN_RDIV : KILN__CHAIN_DIV; break;
    default: return false;
    }
    pl->chain_plane[c->nops] = -1;
    if (is_const[other]) {
        op->scalar = cval[other];
    } else if (load_of[other] >= 0) {
        const fin *f = &pl->in[load_of[other]];
        /* copy_in: the input shares the output's buffer (an in-place add), where the
         * convolution stores a tile before the chain would read the operand there */
        if (f->kind == IN_OPERAND || f->copy_in || f->is_bool || f->dtype != KILN_F32)
            return false;
        if (f->kind == IN_SCALAR)
            op->scalar = f->base[0];
        else if (f->kind == IN_CONTIG)
            op->full = f->base;
        else if (per_plane(f, osz))
            pl->chain_plane[c->nops] = load_of[other]; /* gathered by chain_run */
        else
            return false;
    } else {
        return false; /* a value the program computed: not a chain */
    }
    c->nops++;
    return true;
}

bool kiln__cpu_fused_chain_plan(fplan *pl)
{
    const kiln_fused_program *p = pl->p;
    pl->chained = false;
    pl->chain.nops = 0;
    if (!pl->conv || pl->half || p->reduce_inner || p->nregs > KILN_FUSED_MAX_INSTRS * 2)
        return false;
    int64_t planes = pl->conv_out.shape[0] * pl->conv_out.shape[1];
    int64_t osz = planes > 0 ? p->n / planes : 0;
    int load_of[KILN_FUSED_MAX_INSTRS * 2];
    bool is_const[KILN_FUSED_MAX_INSTRS * 2] = {false};
    float cval[KILN_FUSED_MAX_INSTRS * 2];
    for (int r = 0; r < p->nregs; r++)
        load_of[r] = -1;
    int acc = p->instrs[0].dst, stored = -1;
    for (int i = 1; i < p->ninstrs; i++) {
        const kiln_fused_instr *in = &p->instrs[i];
        if (stored >= 0)
            return false; /* the store ends the chain */
        bool dst_ok = in->code == KILN_FUSED_STORE || (unsigned)in->dst < (unsigned)p->nregs;
        if (!dst_ok)
            return false;
        switch (in->code) {
        case KILN_FUSED_LOAD:
            if ((unsigned)in->arg >= (unsigned)p->ninputs)
                return false;
            load_of[in->dst] = in->arg;
            break;
        case KILN_FUSED_CONST:
            is_const[in->dst] = true;
            cval[in->dst] = (float)in->alpha;
            break;
        case KILN_FUSED_UNARY:
            if (in->a != acc || in->op != KILN_UNARY_RELU || pl->chain.nops == KILN__CHAIN_MAX_OPS)
                return false;
            pl->chain_plane[pl->chain.nops] = -1;
            pl->chain.ops[pl->chain.nops++] = (kiln__cpu_chain_op){.code = KILN__CHAIN_RELU};
            acc = in->dst;
            break;
        case KILN_FUSED_BINARY:
            if ((unsigned)in->a >= (unsigned)p->nregs || (unsigned)in->b >= (unsigned)p->nregs)
                return false;
            if (in->a == acc && in->b != acc) {
                if (!chain_op(pl, in, in->b, false, load_of, is_const, cval, osz))
                    return false;
            } else if (in->b == acc && in->a != acc) {
                if (!chain_op(pl, in, in->a, true, load_of, is_const, cval, osz))
                    return false;
            } else {
                return false;
            }
            acc = in->dst;
            break;
        case KILN_FUSED_STORE:
            if (in->a != acc || (unsigned)in->arg >= (unsigned)p->noutputs || !pl->out[in->arg])
                return false;
            stored = in->arg;
            break;
        default: return false;
        }
    }
    if (stored < 0 || p->noutputs != 1)
        return false;
    pl->chain_out = stored;
    pl->chained = true;
    return true;
}

int kiln__cpu_fused_chain_run(kiln__cpu_ctx *ctx, fplan *pl)
{
    const kiln_fused_program *p = pl->p;
    const kiln_fused_instr *pr = &p->instrs[0];
    int64_t planes = pl->conv_out.shape[0] * pl->conv_out.shape[1], osz = p->n / planes;
    int nplane = 0;
    for (int k = 0; k < pl->chain.nops; k++)
        nplane += pl->chain_plane[k] >= 0;
    struct kiln_buffer *h = NULL;
    float *vals = NULL;
    if (nplane) {
        vals = kiln__cpu_scratch_get(ctx, (size_t)(nplane * planes) * sizeof(float), &h);
        if (!vals)
            return kiln__cpu_enomem("fused");
    }
    /* each per-plane operand's value for every plane, gathered once */
    kiln__cpu_chain chain = pl->chain;
    float *next = vals;
    for (int k = 0; k < chain.nops; k++) {
        if (pl->chain_plane[k] < 0)
            continue;
        const fin *f = &pl->in[pl->chain_plane[k]];
        for (int64_t q = 0; q < planes; q++)
            next[q] = f->base[kiln__cpu_fused_offset_of(f, q * osz)];
        chain.ops[k].plane = next;
        next += planes;
    }
    /* the convolution stores straight into the program's result */
    kiln_tdesc os = pl->conv_out;
    struct kiln_buffer fake = {.data = pl->out[pl->chain_out]};
    os.buf = &fake;
    os.offset = 0;
    int rc = kiln__cpu_conv_chain(ctx, p->conv, &os, &p->inputs[pr->arg], &p->inputs[pr->arg2],
                                  pr->arg3 >= 0 ? &p->inputs[pr->arg3] : NULL, &chain);
    kiln__cpu_scratch_put(ctx, h);
    return rc;
}
