/*
 * backends/fused/fused-flush.c — a pending group at its flush: compiled into one
 * kiln_fused_program for the inner backend's fused_run, or replayed call by call.
 *
 * The compiler gives every recorded call's result a register: an operand is the latest
 * earlier write of its view in the group, else one load per distinct view. Each live
 * buffer's last value is stored once; a buffer freed while the group was pending (a dead
 * intermediate) is never stored. A program the compiler cannot make (too many inputs,
 * outputs or instructions) or one the backend refuses runs as a replay, which gives the
 * same results: a group never fails for being fused. A group headed by a producer (matmul,
 * convolution, a max pooling's gradient) whose backend does not generate that producer
 * runs it alone and fuses the rest as an elementwise group.
 */
#include <stdlib.h>
#include <string.h>

#include "fused-codegen.h"
#include "fused-impl.h"

/* A replay runs the recorded calls as they were, except those that only write a detached
 * buffer nothing reads: a detached buffer a call reads needs memory again. */
static int reattach_freed(fq *q)
{
    for (int i = 0; i < q->nfreed; i++) {
        if (!q->freed[i].detached || !kiln__fused_group_reads(q, q->freed[i].buf))
            continue;
        int rc = q->d->in->buffer_reattach(q->iq, q->freed[i].buf);
        if (rc < 0)
            return rc;
        q->freed[i].detached = false;
    }
    return 0;
}

/* Whether r's output is a detached buffer (one nothing reads, after reattach_freed). */
static bool writes_detached(const fq *q, const frec *r)
{
    for (int i = 0; i < q->nfreed; i++)
        if (q->freed[i].buf == r->out.buf)
            return q->freed[i].detached;
    return false;
}

/* ------------------------------------------------------------------ compile */

typedef struct compiler {
    kiln_fused_instr ins[KILN_FUSED_MAX_INSTRS];
    kiln_tdesc inputs[KILN_FUSED_MAX_INPUTS], outputs[KILN_FUSED_MAX_OUTPUTS];
    int load_reg[KILN_FUSED_MAX_INPUTS];
    bool operand_only[KILN_FUSED_MAX_INPUTS]; /* a product's operand: never loaded */
    int ninstrs, ninputs, noutputs, nregs;
    int64_t reduce_inner;
    const kiln_conv_params *conv; /* a CONV's geometry */
    const kiln_pool_params *pool; /* a POOL_GRAD's geometry, and its gradient's shape */
    const kiln_tdesc *pool_grad_x;
    int from; /* the first recorded call compiled (1: without the producer) */
    /* the register holding each recorded call's result, by call */
    int value[FUSED_MAX_RECS];
    /* a row-value reduction's input register, until a ROW_REDUCE reading it is emitted */
    int row_src[FUSED_MAX_RECS];
} compiler;

static int emit(compiler *c, kiln_fused_instr in)
{
    if (c->ninstrs == KILN_FUSED_MAX_INSTRS)
        return -1;
    c->ins[c->ninstrs++] = in;
    return 0;
}

/* The register of operand d of call i: the latest earlier write of its view, else a
 * load (one per distinct view). */
static int operand(compiler *c, const fq *q, int i, const kiln_tdesc *d)
{
    for (int j = i - 1; j >= c->from; j--) {
        if (kiln__fused_same_flat(&q->rec[j].out, d))
            return c->value[j];
        if (kiln__fused_row_broadcast(q, &q->rec[j], d)) {
            if (c->value[j] < 0) { /* its first reader: the row's value as a register */
                int r = c->nregs++;
                if (emit(c,
                         (kiln_fused_instr){
                             .code = KILN_FUSED_ROW_REDUCE, .op = q->rec[j].op, .dst = r, .a = c->row_src[j]}) < 0)
                    return -1;
                c->value[j] = r;
            }
            return c->value[j];
        }
    }
    for (int k = 0; k < c->ninputs; k++)
        if (!c->operand_only[k] && kiln__fused_same_view(&c->inputs[k], d))
            return c->load_reg[k];
    if (c->ninputs == KILN_FUSED_MAX_INPUTS)
        return -1;
    int r = c->nregs++;
    c->inputs[c->ninputs] = *d;
    c->load_reg[c->ninputs] = r;
    if (emit(c, (kiln_fused_instr){.code = KILN_FUSED_LOAD, .dst = r, .arg = c->ninputs}) < 0)
        return -1;
    c->ninputs++;
    return r;
}

/* The calls from `from` on as a program (from 1: the group without its producer, which ran
 * on its own, its product then an input like any other). */
static int compile(compiler *c, const fq *q, int from)
{
    memset(c, 0, sizeof *c);
    c->from = from;
    for (int i = from; i < q->nrec; i++) {
        const frec *r = &q->rec[i];
        int a = -1, b = -1, z = -1;
        if (r->entry == KILN_ENTRY_MATMUL) { /* the group's first call (record) */
            if (c->ninputs + 2 > KILN_FUSED_MAX_INPUTS)
                return -1;
            int dst = c->nregs++;
            c->inputs[c->ninputs] = r->x;
            c->inputs[c->ninputs + 1] = r->y;
            c->operand_only[c->ninputs] = c->operand_only[c->ninputs + 1] = true;
            c->load_reg[c->ninputs] = c->load_reg[c->ninputs + 1] = -1;
            if (emit(c, (kiln_fused_instr){
                            .code = KILN_FUSED_MATMUL, .dst = dst, .arg = c->ninputs, .arg2 = c->ninputs + 1}) < 0)
                return -1;
            c->ninputs += 2;
            c->value[i] = dst;
            continue;
        }
        if (r->entry == KILN_ENTRY_CONV) { /* the group's first call (record) */
            int nops = r->z.buf ? 3 : 2, at = c->ninputs;
            if (at + nops > KILN_FUSED_MAX_INPUTS)
                return -1;
            const kiln_tdesc *ops[3] = {&r->x, &r->y, &r->z};
            for (int k = 0; k < nops; k++) {
                c->inputs[at + k] = *ops[k];
                c->operand_only[at + k] = true;
                c->load_reg[at + k] = -1;
            }
            int dst = c->nregs++;
            c->conv = &r->conv;
            if (emit(c, (kiln_fused_instr){.code = KILN_FUSED_CONV,
                                           .dst = dst,
                                           .arg = at,
                                           .arg2 = at + 1,
                                           .arg3 = r->z.buf ? at + 2 : -1}) < 0)
                return -1;
            c->ninputs += nops;
            c->value[i] = dst;
            continue;
        }
        if (r->entry == KILN_ENTRY_POOL_BACKWARD) { /* the group's first call (record_pool_grad) */
            int at = c->ninputs;
            if (at + 2 > KILN_FUSED_MAX_INPUTS)
                return -1;
            c->inputs[at] = r->x;
            c->inputs[at + 1] = r->y;
            c->operand_only[at] = c->operand_only[at + 1] = true;
            c->load_reg[at] = c->load_reg[at + 1] = -1;
            int dst = c->nregs++;
            c->pool = &r->pool;
            c->pool_grad_x = &r->out;
            if (emit(c, (kiln_fused_instr){
                            .code = KILN_FUSED_POOL_GRAD, .dst = dst, .arg = at, .arg2 = at + 1, .arg3 = -1}) < 0)
                return -1;
            c->ninputs += 2;
            c->value[i] = dst;
            continue;
        }
        if (kiln__fused_rec_inputs(r) > 0 && (a = operand(c, q, i, &r->x)) < 0)
            return -1;
        if (kiln__fused_rec_inputs(r) > 1 && r->entry != KILN_ENTRY_LAYER_NORM &&
            (b = operand(c, q, i, &r->y)) < 0)
            return -1;
        if (kiln__fused_rec_inputs(r) > 2 && r->entry != KILN_ENTRY_LAYER_NORM &&
            (z = operand(c, q, i, &r->z)) < 0)
            return -1;
        if (r->entry == KILN_ENTRY_COPY) {
            c->value[i] = a; /* a copy is its source's value */
            continue;
        }
        if (r->entry == KILN_ENTRY_LAYER_NORM) {
            /* weight and bias loaded as [rows, inner] broadcasts of their one row */
            int wb[2] = {-1, -1};
            for (int k = 0; k < 2; k++) {
                const kiln_tdesc *v = k ? &r->z : &r->y;
                if (!v->buf)
                    continue;
                kiln_tdesc rows = *v;
                rows.ndim = 2;
                rows.shape[0] = q->n / r->inner;
                rows.shape[1] = r->inner;
                rows.strides[0] = 0;
                rows.strides[1] = 1;
                if ((wb[k] = operand(c, q, i, &rows)) < 0)
                    return -1;
            }
            int dst = c->nregs++;
            c->reduce_inner = r->inner;
            if (emit(c, (kiln_fused_instr){.code = KILN_FUSED_LAYER_NORM,
                                           .dst = dst,
                                           .a = a,
                                           .b = wb[0],
                                           .c = wb[1],
                                           .alpha = r->alpha}) < 0)
                return -1;
            c->value[i] = dst;
            continue;
        }
        if (r->entry == KILN_ENTRY_SOFTMAX) {
            int dst = c->nregs++;
            c->reduce_inner = r->inner;
            if (emit(c, (kiln_fused_instr){.code = KILN_FUSED_SOFTMAX, .op = r->op, .dst = dst, .a = a}) < 0)
                return -1;
            c->value[i] = dst;
            continue;
        }
        if (r->entry == KILN_ENTRY_REDUCE) {
            c->value[i] = -1;
            c->row_src[i] = a;
            c->reduce_inner = r->inner;
            if (c->noutputs == KILN_FUSED_MAX_OUTPUTS)
                return -1;
            c->outputs[c->noutputs] = r->out;
            if (emit(c, (kiln_fused_instr){.code = KILN_FUSED_REDUCE, .op = r->op, .a = a, .arg = c->noutputs}) <
                0)
                return -1;
            c->noutputs++;
            continue;
        }
        int dst = c->nregs++;
        kiln_fused_instr in = {
            .dst = dst, .a = a, .b = b, .c = z, .op = r->op, .alpha = r->alpha, .beta = r->beta};
        in.code = r->entry == KILN_ENTRY_FILL    ? KILN_FUSED_CONST
                  : r->entry == KILN_ENTRY_UNARY ? KILN_FUSED_UNARY
                  : r->entry == KILN_ENTRY_WHERE ? KILN_FUSED_WHERE
                                                 : KILN_FUSED_BINARY;
        if (emit(c, in) < 0)
            return -1;
        c->value[i] = dst;
    }
    /* store each live buffer's last value once */
    for (int i = from; i < q->nrec; i++) {
        const frec *r = &q->rec[i];
        if (r->entry == KILN_ENTRY_REDUCE)
            continue;
        bool overwritten = false;
        for (int j = i + 1; j < q->nrec && !overwritten; j++)
            overwritten = kiln__fused_same_flat(&q->rec[j].out, &r->out);
        if (overwritten || kiln__fused_was_freed(q, r->out.buf))
            continue;
        if (c->noutputs == KILN_FUSED_MAX_OUTPUTS)
            return -1;
        c->outputs[c->noutputs] = r->out;
        if (emit(c, (kiln_fused_instr){.code = KILN_FUSED_STORE, .a = c->value[i], .arg = c->noutputs}) < 0)
            return -1;
        c->noutputs++;
    }
    return 0;
}

/* ------------------------------------------------------------------ run */

/* Run calls [from, to) one by one. */
static int replay(fq *q, int from, int to)
{
    const kiln_backend_iface *in = q->d->in;
    int reattached = reattach_freed(q);
    if (reattached < 0)
        return reattached;
    for (int i = from; i < to; i++) {
        const frec *r = &q->rec[i];
        if (writes_detached(q, r)) /* a dead value nothing reads */
            continue;
        int rc;
        switch (r->entry) {
        case KILN_ENTRY_FILL: rc = in->fill(q->iq, &r->out, r->alpha); break;
        case KILN_ENTRY_COPY: rc = in->copy(q->iq, &r->out, &r->x); break;
        case KILN_ENTRY_UNARY:
            rc = in->unary(q->iq, (kiln_unary_op)r->op, &r->out, &r->x, r->alpha, r->beta);
            break;
        case KILN_ENTRY_WHERE: rc = in->where(q->iq, &r->out, &r->x, &r->y, &r->z); break;
        case KILN_ENTRY_REDUCE:
            rc = in->reduce(q->iq, (kiln_reduce_op)r->op, &r->out, &r->x, r->mask, r->alpha);
            break;
        case KILN_ENTRY_SOFTMAX: rc = in->softmax(q->iq, r->op != 0, &r->out, &r->x, (int)r->mask); break;
        case KILN_ENTRY_MATMUL: rc = in->matmul(q->iq, &r->out, &r->x, &r->y); break;
        case KILN_ENTRY_CONV:
            rc = in->conv(q->iq, &r->conv, &r->out, &r->x, &r->y, r->z.buf ? &r->z : NULL);
            break;
        case KILN_ENTRY_POOL_BACKWARD: /* its zero fill was dropped when it was recorded */
            rc = in->fill(q->iq, &r->out, 0);
            if (rc == 0)
                rc = in->pool_backward(q->iq, &r->pool, &r->out, &r->x, &r->y);
            break;
        case KILN_ENTRY_LAYER_NORM:
            rc = in->layer_norm(q->iq, &r->out, NULL, NULL, &r->x, r->y.buf ? &r->y : NULL,
                                r->z.buf ? &r->z : NULL, r->inner, r->alpha);
            break;
        default: rc = in->binary(q->iq, (kiln_binary_op)r->op, &r->out, &r->x, &r->y); break;
        }
        if (rc < 0)
            return rc;
    }
    if (to > from)
        atomic_fetch_add_explicit(&q->d->groups_replayed, 1, memory_order_relaxed);
    return 0;
}

static bool inner_fuses(const fq *q)
{
    const kiln_backend_iface *in = q->d->in;
    if (q->d->replay || !in->fused_run)
        return false;
    kiln_op_query query = {.entry = KILN_ENTRY_FUSED, .op = -1, .dtype = q->dtype};
    return !in->supports || in->supports(q->iq, &query);
}

/* Compile the calls from `from` on and hand them to the inner fused_run: 0, an error, or
 * KILN_ENOTSUP when the program cannot be made or the backend refuses it. */
static int run_program(fq *q, compiler *c, int from)
{
    if (compile(c, q, from) < 0)
        return KILN_ENOTSUP;
    kiln_fused_program p = {
        .dtype = q->dtype,
        .n = q->n,
        .reduce_inner = c->reduce_inner,
        .ninputs = c->ninputs,
        .noutputs = c->noutputs,
        .ninstrs = c->ninstrs,
        .nregs = c->nregs,
        .inputs = c->inputs,
        .outputs = c->outputs,
        .instrs = c->ins,
        .conv = c->conv,
        .pool = c->pool,
        .pool_grad_x = c->pool_grad_x,
    };
    int rc = c->noutputs == 0 ? 0 : q->d->in->fused_run(q->iq, &p);
    if (rc == 0) {
        atomic_fetch_add_explicit(&q->d->groups_run, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&q->d->calls_fused, (uint64_t)(q->nrec - from), memory_order_relaxed);
    }
    return rc;
}

static int run_group(fq *q)
{
    kiln_tdesc store;
    if (q->product_copy && kiln__fused_was_freed(q, q->rec[0].out.buf) &&
        kiln__fused_permuted_store(&q->rec[0], &q->rec[1], &store)) {
        int rc = q->d->in->matmul(q->iq, &store, &q->rec[0].x, &q->rec[0].y);
        if (rc == 0) {
            atomic_fetch_add_explicit(&q->d->groups_run, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&q->d->calls_fused, 2, memory_order_relaxed);
        }
        return rc;
    }
    if (q->product_copy) /* the product is read again later: as recorded */
        return replay(q, 0, q->nrec);
    if (q->nrec < 2 || !inner_fuses(q))
        return replay(q, 0, q->nrec);
    compiler *c = malloc(sizeof *c);
    if (!c)
        return replay(q, 0, q->nrec);
    int rc = run_program(q, c, 0);
    if (rc == KILN_ENOTSUP && kiln__fused_has_producer(q)) {
        /* a backend that does not generate this producer (a GPU's generator has no
         * MATMUL): the producer alone, then its consumers still fused as elementwise */
        rc = replay(q, 0, 1);
        if (rc == 0)
            rc = q->nrec > 2 ? run_program(q, c, 1) : KILN_ENOTSUP;
        if (rc == KILN_ENOTSUP)
            rc = replay(q, 1, q->nrec);
    } else if (rc == KILN_ENOTSUP) {
        rc = replay(q, 0, q->nrec);
    }
    free(c);
    return rc;
}

int kiln__fused_flush(fq *q)
{
    int rc = q->nrec ? run_group(q) : 0;
    q->nrec = 0;
    q->closed = q->product_copy = false;
    q->row = 0;
    for (int i = 0; i < q->nfreed; i++)
        q->d->in->buffer_free(q->iq, q->freed[i].buf);
    q->nfreed = 0;
    return rc;
}
