/*
 * backends/fused/fused-group.c — a queue's pending group: recording elementwise calls,
 * and at a flush turning them into one kiln_fused_program.
 *
 * A call joins the group when it is a fill, copy, unary (not the bool-valued ones),
 * arithmetic binary, comparison (a bool output) or where (a bool condition) whose values
 * have the group's dtype (f32, f16 or bf16; every register rounds to it, as each unfused
 * op does) and whose output is contiguous with the group's element count, and when
 * the group can run it per element without changing what any call reads. The group runs
 * as per-block straight-line code, so the one hazard is a buffer read and written by
 * the group through different element mappings; the rule that rules it out: a buffer
 * the group writes is read and written only through the very same contiguous view (the
 * same offset). A read of it then takes the register its last write produced, and an
 * in-place update reads element i before it stores it. Buffers the group only reads may
 * be seen through any view. A call that breaks the rule ends the group first.
 *
 * A softmax over the last dim of a value the group wrote joins it (its rows are
 * evaluated whole, and later calls may use its result); a sum, mean, max or min over
 * trailing dims whose input is a value the group wrote (contiguous) joins it too, reading
 * that value from a register as it is computed. On an inner backend that takes
 * ROW_REDUCE (caps.fused_row_reduce) a sum or mean over rows of at most 8192 elements
 * lets the group go on, and later calls may read its result broadcast over the rows
 * (softmax's backward y (g - sum(g y)), layer norm's): the group needs no store and no
 * second pass for it. Otherwise nothing joins after a reduction.
 *
 * A matmul of f32 operands with a contiguous f32 product starts a group of its own (when
 * the inner backend's fused_run takes a MATMUL): the calls that join after it are its
 * epilogue, which the backend applies to each panel of the product's rows as it is
 * computed, and a product that dies before the flush is never stored. Nothing in the
 * group may write the product's operands, and a softmax or reduction joining it must have
 * rows that divide the product's.
 *
 * A copy of a matmul's product into a permuted layout (attention's head merging) joins a
 * group of that product alone and ends it; when the product is dead at the flush, the
 * matmul writes straight into the copy's output (fused-permute.c).
 *
 * At the flush, outputs whose buffer was freed meanwhile (dead intermediates) are never
 * stored, and a value overwritten later in the group is stored only once. A group of one
 * call, or one the inner backend cannot fuse, is replayed call by call: the same
 * results, never an error.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error-impl.h"
#include "fused-codegen.h"
#include "fused-impl.h"

/* The same elements in the same order: same buffer and offset, both contiguous. */
static bool same_flat(const kiln_tdesc *a, const kiln_tdesc *b)
{
    return a->buf == b->buf && a->offset == b->offset && kiln__fused_contiguous(a) && kiln__fused_contiguous(b);
}

static bool same_view(const kiln_tdesc *a, const kiln_tdesc *b)
{
    if (a->buf != b->buf || a->offset != b->offset || a->dtype != b->dtype || a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i] || (a->shape[i] != 1 && a->strides[i] != b->strides[i]))
            return false;
    return true;
}

/* The longest row a softmax, a layer norm or a row sum read back may have in a group: the
 * cpu's blocks hold such rows whole (and its planner refuses longer ones). */
#define FUSED_ROW_MAX 8192

/* Whether d reads reduction red's result broadcast over the group's rows: n elements,
 * element i taking red's output element i / red->inner (a keepdim sum expanded back, or
 * read through broadcasting, as softmax's backward reads sum(g y)). */
static bool row_broadcast(const fq *q, const frec *red, const kiln_tdesc *d)
{
    if (!red->row_value || d->buf != red->out.buf || d->offset != red->out.offset || d->dtype != red->out.dtype ||
        kiln__fused_numel(d) != q->n)
        return false;
    int64_t inner = 1, expect = 1;
    int dim = d->ndim - 1;
    for (; dim >= 0 && inner < red->inner; dim--) { /* the row: broadcast dims */
        if (d->shape[dim] != 1 && d->strides[dim] != 0)
            return false;
        inner *= d->shape[dim];
    }
    if (inner != red->inner)
        return false;
    for (; dim >= 0; dim--) { /* the rows: contiguous, in order */
        if (d->shape[dim] == 1)
            continue;
        if (d->strides[dim] != expect)
            return false;
        expect *= d->shape[dim];
    }
    return true;
}

static int rec_inputs(const frec *r)
{
    switch (r->entry) {
    case KILN_ENTRY_REDUCE:
    case KILN_ENTRY_SOFTMAX: return 1;
    case KILN_ENTRY_FILL: return 0;
    case KILN_ENTRY_BINARY:
    case KILN_ENTRY_MATMUL:
    case KILN_ENTRY_POOL_BACKWARD: return 2;
    case KILN_ENTRY_WHERE:
    case KILN_ENTRY_CONV:                 /* (an absent bias: a NULL buf) */
    case KILN_ENTRY_LAYER_NORM: return 3; /* (a layer norm's absent weight or bias: a NULL buf) */
    default: return 1;
    }
}

static const kiln_tdesc *rec_input(const frec *r, int k)
{
    return k == 0 ? &r->x : k == 1 ? &r->y : &r->z;
}

static bool is_comparison(const frec *r)
{
    return r->entry == KILN_ENTRY_BINARY && r->op >= KILN_BINARY_EQ && r->op <= KILN_BINARY_GE;
}

/* The row length of the matrix product that heads q's group (the product's last dim),
 * 0 when no product heads it: a softmax or reduction joining after one must have rows
 * that divide it, so that the tiles of whole product rows hold whole rows of theirs. */
static int64_t product_row(const fq *q)
{
    if (q->nrec == 0 || q->rec[0].entry != KILN_ENTRY_MATMUL)
        return 0;
    return q->rec[0].out.shape[q->rec[0].out.ndim - 1];
}

/* Whether a producer (matmul, conv, a max pooling's gradient) heads q's group. */
static bool has_producer(const fq *q)
{
    return q->nrec > 0 && (q->rec[0].entry == KILN_ENTRY_MATMUL || q->rec[0].entry == KILN_ENTRY_CONV ||
                           q->rec[0].entry == KILN_ENTRY_POOL_BACKWARD);
}

/* A convolution or a pooling gradient heading the group takes no row op after it (its
 * tiles are images or planes, not rows). */
static bool conv_head(const fq *q)
{
    return q->nrec > 0 && (q->rec[0].entry == KILN_ENTRY_CONV || q->rec[0].entry == KILN_ENTRY_POOL_BACKWARD);
}

/* Whether a reduction r can end q's group: sum or mean of f32 over trailing dims of a
 * value the group wrote, into a buffer the group does not touch. */
static bool reduce_fits(const fq *q, frec *r)
{
    if (q->nrec == 0 || q->closed || q->dtype != KILN_F32 ||
        (r->op != KILN_REDUCE_SUM && r->op != KILN_REDUCE_MEAN && r->op != KILN_REDUCE_MAX &&
         r->op != KILN_REDUCE_MIN) ||
        r->entry != KILN_ENTRY_REDUCE || r->x.dtype != KILN_F32 || r->out.dtype != KILN_F32 ||
        !kiln__fused_contiguous(&r->out) || kiln__fused_numel(&r->x) != q->n || q->n == 0)
        return false;
    bool written = false;
    for (int i = 0; i < q->nrec; i++) {
        written = written || same_flat(&q->rec[i].out, &r->x);
        if (q->rec[i].out.buf == r->out.buf)
            return false;
        for (int k = 0; k < rec_inputs(&q->rec[i]); k++)
            if (rec_input(&q->rec[i], k)->buf == r->out.buf)
                return false;
    }
    if (!written)
        return false;
    /* the reduced dims (size-1 dims either way) must be a suffix */
    int64_t inner = 1;
    bool in_suffix = true;
    for (int d = r->x.ndim - 1; d >= 0; d--) {
        bool reduced = (r->mask >> d) & 1u;
        if (r->x.shape[d] == 1)
            continue;
        if (reduced && !in_suffix)
            return false;
        if (reduced)
            inner *= r->x.shape[d];
        else
            in_suffix = false;
    }
    if (kiln__fused_numel(&r->out) * inner != q->n || (q->row && q->row != inner) ||
        (product_row(q) && product_row(q) % inner) || conv_head(q))
        return false;
    /* a fused row runs as one block: a few long rows would keep most of the device (or the
     * cpu's threads) idle, where the backend's own reduction splits a row; the group then
     * runs without it and the reduction after it */
    if (inner > KILN__FUSED_LONG_ROW && q->n / inner < KILN__FUSED_FEW_ROWS)
        return false;
    r->inner = inner;
    return true;
}

/* Whether a softmax r over the last dim of a value the group wrote joins q's group (rows
 * of at most 8192 elements, which a block holds whole); later calls may join after it. */
static bool softmax_fits(const fq *q, frec *r)
{
    const kiln_tdesc *in = &r->x;
    if (q->nrec == 0 || q->closed || q->dtype != KILN_F32 || q->nrec >= FUSED_MAX_RECS - 1 ||
        in->dtype != KILN_F32 || r->out.dtype != KILN_F32 || !kiln__fused_contiguous(&r->out) ||
        kiln__fused_numel(in) != q->n || q->n == 0 || kiln__fused_numel(&r->out) != q->n ||
        (int)r->mask != in->ndim - 1)
        return false;
    int64_t inner = in->shape[in->ndim - 1];
    if (inner < 1 || inner > FUSED_ROW_MAX || (q->row && q->row != inner) ||
        (product_row(q) && product_row(q) % inner) || conv_head(q))
        return false;
    bool written = false;
    for (int i = 0; i < q->nrec; i++) {
        written = written || same_flat(&q->rec[i].out, in);
        if (q->rec[i].out.buf == r->out.buf)
            return false;
        for (int k = 0; k < rec_inputs(&q->rec[i]); k++)
            if (rec_input(&q->rec[i], k)->buf == r->out.buf)
                return false;
    }
    if (!written)
        return false;
    r->inner = inner;
    return true;
}

/* Whether a layer norm r over the last `inner` elements of a value the group wrote joins
 * q's group, as a softmax does: f32, rows of 2 to 8192 elements, a weight and bias (each
 * optional) of `inner` contiguous elements the group does not write. */
static bool layer_norm_fits(const fq *q, frec *r)
{
    const kiln_tdesc *in = &r->x;
    if (q->nrec == 0 || q->closed || q->dtype != KILN_F32 || q->nrec >= FUSED_MAX_RECS - 1 ||
        in->dtype != KILN_F32 || r->out.dtype != KILN_F32 || !kiln__fused_contiguous(&r->out) ||
        kiln__fused_numel(in) != q->n || kiln__fused_numel(&r->out) != q->n || r->inner < 2 ||
        r->inner > FUSED_ROW_MAX || q->n % r->inner || (q->row && q->row != r->inner) ||
        (product_row(q) && product_row(q) % r->inner) || conv_head(q))
        return false;
    for (int k = 1; k < 3; k++) {
        const kiln_tdesc *p = rec_input(r, k);
        if (p->buf && (p->dtype != KILN_F32 || !kiln__fused_contiguous(p) || kiln__fused_numel(p) != r->inner))
            return false;
    }
    bool written = false;
    for (int i = 0; i < q->nrec; i++) {
        written = written || same_flat(&q->rec[i].out, in);
        if (q->rec[i].out.buf == r->out.buf || (r->y.buf && q->rec[i].out.buf == r->y.buf) ||
            (r->z.buf && q->rec[i].out.buf == r->z.buf))
            return false;
        for (int k = 0; k < rec_inputs(&q->rec[i]); k++)
            if (rec_input(&q->rec[i], k)->buf == r->out.buf)
                return false;
    }
    return written;
}

/* The dtype of an elementwise call's values: its output's, or a comparison's operands'. */
static kiln_dtype value_dtype(const frec *r)
{
    return is_comparison(r) ? r->x.dtype : r->out.dtype;
}

/* Whether r's kind of call fuses at all (dtype, op, layout), before any hazard. */
static bool fusable(const frec *r)
{
    kiln_dtype vt = value_dtype(r);
    if ((vt != KILN_F32 && vt != KILN_F16 && vt != KILN_BF16) ||
        r->out.dtype != (is_comparison(r) ? KILN_BOOL : vt) || !kiln__fused_contiguous(&r->out))
        return false;
    for (int k = 0; k < rec_inputs(r); k++) {
        kiln_dtype want = r->entry == KILN_ENTRY_WHERE && k == 0 ? KILN_BOOL : vt;
        if (rec_input(r, k)->dtype != want || kiln__fused_numel(rec_input(r, k)) != kiln__fused_numel(&r->out))
            return false;
    }
    switch (r->entry) {
    case KILN_ENTRY_FILL:
    case KILN_ENTRY_COPY: return true;
    case KILN_ENTRY_UNARY:
        return r->op >= 0 && r->op < KILN_UNARY_COUNT && r->op != KILN_UNARY_ISNAN && r->op != KILN_UNARY_ISINF &&
               r->op != KILN_UNARY_LOGICAL_NOT;
    case KILN_ENTRY_BINARY: return r->op >= 0 && r->op <= KILN_BINARY_GE;
    case KILN_ENTRY_WHERE: return true;
    default: return false;
    }
}

/* The inputs the program of q's group plus r would take, counted as compile() makes them:
 * a producer's operands, then one load per distinct view not written earlier in the group
 * (a value the group wrote is read from its register). Counting every operand of every
 * call instead ended a gelu's backward (x read four times, each step reading the last)
 * after 12 calls, so its 11 intermediates, alive until the node's backward returned,
 * were all stored. */
static int program_inputs(const fq *q, const frec *r)
{
    const kiln_tdesc *seen[KILN_FUSED_MAX_INPUTS + 1];
    int nseen = 0, operands = 0;
    for (int i = 0; i <= q->nrec; i++) {
        const frec *p = i < q->nrec ? &q->rec[i] : r;
        bool producer = p->entry == KILN_ENTRY_MATMUL || p->entry == KILN_ENTRY_CONV ||
                        p->entry == KILN_ENTRY_POOL_BACKWARD;
        for (int k = 0; k < rec_inputs(p); k++) {
            const kiln_tdesc *d = rec_input(p, k);
            if (!d->buf)
                continue;
            if (producer) {
                operands++;
                continue;
            }
            /* a layer norm's weight and bias are loaded as row broadcasts: never a value
             * the group wrote */
            bool known = false;
            for (int j = i - 1; j >= 0 && !known && !(p->entry == KILN_ENTRY_LAYER_NORM && k > 0); j--)
                known = same_flat(&q->rec[j].out, d) || row_broadcast(q, &q->rec[j], d);
            for (int s = 0; s < nseen && !known; s++)
                known = same_view(seen[s], d);
            if (known)
                continue;
            if (nseen == KILN_FUSED_MAX_INPUTS)
                return KILN_FUSED_MAX_INPUTS + 1;
            seen[nseen++] = d;
        }
    }
    return nseen + operands;
}

/* Whether r may join q's group (see the file comment's rule). */
static bool fits(const fq *q, const frec *r)
{
    if (q->nrec == 0)
        return true;
    if (q->closed || q->nrec >= FUSED_MAX_RECS - 1 || kiln__fused_numel(&r->out) != q->n ||
        value_dtype(r) != q->dtype)
        return false;
    /* a product's operands are read while its tiles are computed: never written */
    if (has_producer(q) && (r->out.buf == q->rec[0].x.buf || r->out.buf == q->rec[0].y.buf ||
                            (q->rec[0].z.buf && r->out.buf == q->rec[0].z.buf)))
        return false;
    for (int i = 0; i < q->nrec; i++) {
        const frec *p = &q->rec[i];
        /* r reads what the group wrote: only through the write's own view */
        for (int k = 0; k < rec_inputs(r); k++)
            if (rec_input(r, k)->buf == p->out.buf && !same_flat(rec_input(r, k), &p->out) &&
                !row_broadcast(q, p, rec_input(r, k)))
                return false;
        /* r writes what the group wrote or read: only through the same view */
        if (r->out.buf == p->out.buf && !same_flat(&r->out, &p->out))
            return false;
        for (int k = 0; k < rec_inputs(p); k++)
            if (rec_input(p, k)->buf == r->out.buf && !same_flat(rec_input(p, k), &r->out))
                return false;
    }
    return program_inputs(q, r) <= KILN_FUSED_MAX_INPUTS;
}

/* Whether a matrix product r may head a group: f32 operands the inner backend's fused_run
 * takes as a MATMUL, and a contiguous f32 product of at least one element. */
static bool product_fits(const fq *q, const frec *r)
{
    const kiln_backend_iface *in = q->d->in;
    if (q->d->replay || !in->fused_run || r->out.dtype != KILN_F32 || r->x.dtype != KILN_F32 ||
        r->y.dtype != KILN_F32 || !kiln__fused_contiguous(&r->out) || r->out.ndim < 2 ||
        kiln__fused_numel(&r->out) == 0 || r->x.shape[r->x.ndim - 1] == 0)
        return false;
    if (r->entry == KILN_ENTRY_CONV &&
        (r->out.ndim < 3 || (r->z.buf && (r->z.dtype != KILN_F32 || !kiln__fused_contiguous(&r->z)))))
        return false;
    kiln_op_query query = {.entry = KILN_ENTRY_FUSED,
                           .op = r->entry == KILN_ENTRY_CONV ? KILN_FUSED_CONV : KILN_FUSED_MATMUL,
                           .dtype = KILN_F32};
    return !in->supports || in->supports(q->iq, &query);
}

/* Run what q has pending, then start a group headed by producer r (f32): 1, or an error. */
static int head_group(fq *q, const frec *r)
{
    int rc = kiln__fused_flush(q);
    if (rc < 0)
        return rc;
    q->n = kiln__fused_numel(&r->out);
    q->dtype = KILN_F32;
    q->rec[q->nrec++] = *r;
    return 1;
}

/* Whether r neither reads a buffer q's group writes nor writes one it reads or writes:
 * then r may run before the group's calls with the same results. */
static bool independent(const fq *q, const frec *r)
{
    for (int i = 0; i < q->nrec; i++) {
        const frec *p = &q->rec[i];
        if (r->out.buf == p->out.buf)
            return false;
        for (int k = 0; k < rec_inputs(r); k++)
            if (rec_input(r, k)->buf && rec_input(r, k)->buf == p->out.buf)
                return false;
        for (int k = 0; k < rec_inputs(p); k++)
            if (rec_input(p, k)->buf == r->out.buf)
                return false;
    }
    return true;
}

int kiln__fused_record(fq *q, const frec *r, bool small)
{
    /* a small call that cannot join, and shares no buffer with the group, runs as it is
     * and leaves the group pending (a relu's backward makes its zero constant between a
     * pooling gradient and the select that consumes it) */
    int cannot_join = small && q->nrec > 0 && independent(q, r) ? 2 : 0;
    if (r->entry == KILN_ENTRY_MATMUL || r->entry == KILN_ENTRY_CONV) {
        /* a product starts a group of its own: its elementwise consumers become the
         * epilogue applied to its tiles */
        if (!product_fits(q, r))
            return cannot_join;
        return head_group(q, r);
    }
    if (r->entry == KILN_ENTRY_REDUCE) {
        frec red = *r;
        if (!reduce_fits(q, &red))
            return cannot_join;
        /* where the inner backend reads a row's sum back (ROW_REDUCE), later calls may
         * use it broadcast over the rows and the group goes on; else it ends here */
        red.row_value = q->d->row_reduce && (red.op == KILN_REDUCE_SUM || red.op == KILN_REDUCE_MEAN) &&
                        red.inner > 1 && red.inner <= FUSED_ROW_MAX;
        q->rec[q->nrec++] = red; /* fits leaves room: the bound is checked before each call */
        q->closed = !red.row_value;
        q->row = red.inner;
        return 1;
    }
    if (r->entry == KILN_ENTRY_LAYER_NORM) {
        frec ln = *r;
        if (!layer_norm_fits(q, &ln))
            return cannot_join;
        q->rec[q->nrec++] = ln;
        q->row = ln.inner;
        return 1;
    }
    if (r->entry == KILN_ENTRY_SOFTMAX) {
        frec sm = *r;
        if (!softmax_fits(q, &sm))
            return cannot_join;
        q->rec[q->nrec++] = sm;
        q->row = sm.inner;
        return 1;
    }
    kiln_tdesc store;
    if (r->entry == KILN_ENTRY_COPY && q->nrec == 1 && q->d->strided_products && !q->d->replay &&
        kiln__fused_permuted_store(&q->rec[0], r, &store)) {
        /* a product copied into a permuted layout: written there when it dies before the
         * flush (fused-permute.c) */
        q->rec[q->nrec++] = *r;
        q->closed = q->product_copy = true;
        return 1;
    }
    if (!fusable(r))
        return cannot_join;
    if (!fits(q, r)) {
        if (cannot_join)
            return cannot_join;
        int rc = kiln__fused_flush(q);
        if (rc < 0)
            return rc;
    }
    if (q->nrec == 0) {
        q->n = kiln__fused_numel(&r->out);
        q->dtype = value_dtype(r);
    }
    q->rec[q->nrec++] = *r;
    return 1;
}

int kiln__fused_record_pool_grad(fq *q, const frec *r)
{
    const kiln_backend_iface *in = q->d->in;
    if (q->nrec == 0 || q->d->replay || !in->fused_run || r->pool.kind != KILN_POOL_MAX || !r->y.buf ||
        r->out.dtype != KILN_F32 || r->x.dtype != KILN_F32 || r->y.dtype != KILN_I64 ||
        !kiln__fused_contiguous(&r->out) || !kiln__fused_contiguous(&r->x) || !kiln__fused_contiguous(&r->y) ||
        r->out.ndim != r->pool.nspatial + 2 || r->x.ndim != r->out.ndim ||
        kiln__fused_numel(&r->x) != kiln__fused_numel(&r->y) || kiln__fused_numel(&r->out) == 0 ||
        kiln__fused_numel(&r->x) == 0)
        return 0;
    const frec *fill = &q->rec[q->nrec - 1];
    if (fill->entry != KILN_ENTRY_FILL || fill->alpha != 0 || fill->out.dtype != KILN_F32 ||
        !same_flat(&fill->out, &r->out) || kiln__fused_numel(&fill->out) != kiln__fused_numel(&r->out))
        return 0;
    /* the fill's buffer is fresh: nothing before it in the group may touch it, or the
     * dropped fill would change what that call saw */
    for (int i = 0; i < q->nrec - 1; i++) {
        if (q->rec[i].out.buf == r->out.buf)
            return 0;
        for (int k = 0; k < rec_inputs(&q->rec[i]); k++)
            if (rec_input(&q->rec[i], k)->buf == r->out.buf)
                return 0;
    }
    kiln_op_query query = {.entry = KILN_ENTRY_FUSED, .op = KILN_FUSED_POOL_GRAD, .dtype = KILN_F32};
    if (in->supports && !in->supports(q->iq, &query))
        return 0;
    q->nrec--; /* the gradient writes every element of grad_x itself */
    return head_group(q, r);
}

/* Whether a call of q's group reads b. */
static bool group_reads(const fq *q, const kiln_buffer *b)
{
    for (int i = 0; i < q->nrec; i++)
        for (int k = 0; k < rec_inputs(&q->rec[i]); k++)
            if (rec_input(&q->rec[i], k)->buf == b)
                return true;
    return false;
}

static bool freed(const fq *q, const kiln_buffer *b)
{
    for (int i = 0; i < q->nfreed; i++)
        if (q->freed[i].buf == b)
            return true;
    return false;
}

/* Whether b, just freed, is a value only q's group makes: its first call touching b
 * writes it and reads nothing of it, and every call writing it is one whose dead store the
 * program drops: elementwise, a softmax, a layer norm, or a producer heading the group
 * (the cpu computes a dead product or pooling gradient into scratch; a POOL_GRAD's
 * pool_grad_x is read for its shape only). A reduction's output is written even when
 * dead, and a product copied into a permuted layout may be written straight into the
 * copy's output. The fused program then never touches b's memory, which can go back to
 * the inner backend before the flush. */
static bool made_in_group(const fq *q, const kiln_buffer *b)
{
    if (q->product_copy)
        return false;
    bool written = false;
    for (int i = 0; i < q->nrec; i++) {
        const frec *r = &q->rec[i];
        for (int k = 0; k < rec_inputs(r); k++)
            if (rec_input(r, k)->buf == b && !written)
                return false;
        if (r->out.buf != b)
            continue;
        switch (r->entry) {
        case KILN_ENTRY_FILL:
        case KILN_ENTRY_COPY:
        case KILN_ENTRY_UNARY:
        case KILN_ENTRY_BINARY:
        case KILN_ENTRY_WHERE:
        case KILN_ENTRY_SOFTMAX:
        case KILN_ENTRY_LAYER_NORM:
        case KILN_ENTRY_MATMUL:
        case KILN_ENTRY_CONV:
        case KILN_ENTRY_POOL_BACKWARD: written = true; break;
        default: return false;
        }
    }
    return written;
}

/* A replay runs the recorded calls as they were, except those that only write a detached
 * buffer nothing reads: a detached buffer a call reads needs memory again. */
static int reattach_freed(fq *q)
{
    for (int i = 0; i < q->nfreed; i++) {
        if (!q->freed[i].detached || !group_reads(q, q->freed[i].buf))
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

bool kiln__fused_group_uses(const fq *q, const kiln_buffer *b)
{
    for (int i = 0; i < q->nrec; i++)
        if (q->rec[i].out.buf == b)
            return true;
    return group_reads(q, b);
}

void kiln__fused_free(fq *q, kiln_buffer *b, bool wrapped)
{
    if (!kiln__fused_group_uses(q, b)) {
        q->d->in->buffer_free(q->iq, b);
        return;
    }
    if (wrapped) {
        /* the caller's memory: its owner may reuse it as soon as the release callback
         * runs, so the group runs now and the buffer goes at once */
        (void)kiln__fused_flush(q);
        q->d->in->buffer_free(q->iq, b);
        return;
    }
    if (q->nfreed == q->capfreed) {
        int cap = q->capfreed ? q->capfreed * 2 : 16;
        struct fused_freed *grown = realloc(q->freed, (size_t)cap * sizeof *grown);
        if (!grown) {
            /* no room to defer: run the group now, then the buffer is free to go */
            (void)kiln__fused_flush(q);
            q->d->in->buffer_free(q->iq, b);
            return;
        }
        q->freed = grown;
        q->capfreed = cap;
    }
    const kiln_backend_iface *in = q->d->in;
    bool detached = in->buffer_detach && in->buffer_reattach && made_in_group(q, b) && in->buffer_detach(q->iq, b);
    q->freed[q->nfreed++] = (struct fused_freed){.buf = b, .detached = detached};
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
    int from;                     /* the first recorded call compiled (1: without the producer) */
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
        if (same_flat(&q->rec[j].out, d))
            return c->value[j];
        if (row_broadcast(q, &q->rec[j], d)) {
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
        if (!c->operand_only[k] && same_view(&c->inputs[k], d))
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
        if (rec_inputs(r) > 0 && (a = operand(c, q, i, &r->x)) < 0)
            return -1;
        if (rec_inputs(r) > 1 && r->entry != KILN_ENTRY_LAYER_NORM && (b = operand(c, q, i, &r->y)) < 0)
            return -1;
        if (rec_inputs(r) > 2 && r->entry != KILN_ENTRY_LAYER_NORM && (z = operand(c, q, i, &r->z)) < 0)
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
            overwritten = same_flat(&q->rec[j].out, &r->out);
        if (overwritten || freed(q, r->out.buf))
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
    if (q->product_copy && freed(q, q->rec[0].out.buf) &&
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
    if (rc == KILN_ENOTSUP && has_producer(q)) {
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
