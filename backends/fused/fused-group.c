/*
 * backends/fused/fused-group.c — a queue's pending group: recording elementwise calls
 * (at a flush, fused-flush.c turns them into one kiln_fused_program), and the buffers
 * freed while it is pending.
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
#include <stdlib.h>

#include "fused-impl.h"

/* The longest row a softmax, a layer norm or a row sum read back may have in a group: the
 * cpu's blocks hold such rows whole (and its planner refuses longer ones). */
#define FUSED_ROW_MAX 8192

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
        written = written || kiln__fused_same_flat(&q->rec[i].out, &r->x);
        if (q->rec[i].out.buf == r->out.buf)
            return false;
        for (int k = 0; k < kiln__fused_rec_inputs(&q->rec[i]); k++)
            if (kiln__fused_rec_input(&q->rec[i], k)->buf == r->out.buf)
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
        written = written || kiln__fused_same_flat(&q->rec[i].out, in);
        if (q->rec[i].out.buf == r->out.buf)
            return false;
        for (int k = 0; k < kiln__fused_rec_inputs(&q->rec[i]); k++)
            if (kiln__fused_rec_input(&q->rec[i], k)->buf == r->out.buf)
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
        const kiln_tdesc *p = kiln__fused_rec_input(r, k);
        if (p->buf && (p->dtype != KILN_F32 || !kiln__fused_contiguous(p) || kiln__fused_numel(p) != r->inner))
            return false;
    }
    bool written = false;
    for (int i = 0; i < q->nrec; i++) {
        written = written || kiln__fused_same_flat(&q->rec[i].out, in);
        if (q->rec[i].out.buf == r->out.buf || (r->y.buf && q->rec[i].out.buf == r->y.buf) ||
            (r->z.buf && q->rec[i].out.buf == r->z.buf))
            return false;
        for (int k = 0; k < kiln__fused_rec_inputs(&q->rec[i]); k++)
            if (kiln__fused_rec_input(&q->rec[i], k)->buf == r->out.buf)
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
    for (int k = 0; k < kiln__fused_rec_inputs(r); k++) {
        kiln_dtype want = r->entry == KILN_ENTRY_WHERE && k == 0 ? KILN_BOOL : vt;
        if (kiln__fused_rec_input(r, k)->dtype != want ||
            kiln__fused_numel(kiln__fused_rec_input(r, k)) != kiln__fused_numel(&r->out))
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
        for (int k = 0; k < kiln__fused_rec_inputs(p); k++) {
            const kiln_tdesc *d = kiln__fused_rec_input(p, k);
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
                known = kiln__fused_same_flat(&q->rec[j].out, d) || kiln__fused_row_broadcast(q, &q->rec[j], d);
            for (int s = 0; s < nseen && !known; s++)
                known = kiln__fused_same_view(seen[s], d);
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
    if (kiln__fused_has_producer(q) && (r->out.buf == q->rec[0].x.buf || r->out.buf == q->rec[0].y.buf ||
                                        (q->rec[0].z.buf && r->out.buf == q->rec[0].z.buf)))
        return false;
    for (int i = 0; i < q->nrec; i++) {
        const frec *p = &q->rec[i];
        /* r reads what the group wrote: only through the write's own view */
        for (int k = 0; k < kiln__fused_rec_inputs(r); k++)
            if (kiln__fused_rec_input(r, k)->buf == p->out.buf &&
                !kiln__fused_same_flat(kiln__fused_rec_input(r, k), &p->out) &&
                !kiln__fused_row_broadcast(q, p, kiln__fused_rec_input(r, k)))
                return false;
        /* r writes what the group wrote or read: only through the same view */
        if (r->out.buf == p->out.buf && !kiln__fused_same_flat(&r->out, &p->out))
            return false;
        for (int k = 0; k < kiln__fused_rec_inputs(p); k++)
            if (kiln__fused_rec_input(p, k)->buf == r->out.buf &&
                !kiln__fused_same_flat(kiln__fused_rec_input(p, k), &r->out))
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
        for (int k = 0; k < kiln__fused_rec_inputs(r); k++)
            if (kiln__fused_rec_input(r, k)->buf && kiln__fused_rec_input(r, k)->buf == p->out.buf)
                return false;
        for (int k = 0; k < kiln__fused_rec_inputs(p); k++)
            if (kiln__fused_rec_input(p, k)->buf == r->out.buf)
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
        !kiln__fused_same_flat(&fill->out, &r->out) || kiln__fused_numel(&fill->out) != kiln__fused_numel(&r->out))
        return 0;
    /* the fill's buffer is fresh: nothing before it in the group may touch it, or the
     * dropped fill would change what that call saw */
    for (int i = 0; i < q->nrec - 1; i++) {
        if (q->rec[i].out.buf == r->out.buf)
            return 0;
        for (int k = 0; k < kiln__fused_rec_inputs(&q->rec[i]); k++)
            if (kiln__fused_rec_input(&q->rec[i], k)->buf == r->out.buf)
                return 0;
    }
    kiln_op_query query = {.entry = KILN_ENTRY_FUSED, .op = KILN_FUSED_POOL_GRAD, .dtype = KILN_F32};
    if (in->supports && !in->supports(q->iq, &query))
        return 0;
    q->nrec--; /* the gradient writes every element of grad_x itself */
    return head_group(q, r);
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
        for (int k = 0; k < kiln__fused_rec_inputs(r); k++)
            if (kiln__fused_rec_input(r, k)->buf == b && !written)
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

bool kiln__fused_group_uses(const fq *q, const kiln_buffer *b)
{
    for (int i = 0; i < q->nrec; i++)
        if (q->rec[i].out.buf == b)
            return true;
    return kiln__fused_group_reads(q, b);
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
