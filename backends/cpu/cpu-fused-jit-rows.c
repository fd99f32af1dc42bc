/*
 * backends/cpu/cpu-fused-jit-rows.c — the compiled form of a fused program that takes its
 * rows whole: a softmax, a layer norm, a row sum read back (ROW_REDUCE) or a per-row sum
 * stored (REDUCE), with the elementwise work around them. cpu-fused-jit.c compiles and
 * loads it like a flat loop; this file decides which such programs it covers and writes
 * their source.
 *
 * Why: the block interpreter runs every instruction as one pass over a block of rows,
 * so a layer norm's backward (about twenty instructions) makes twenty passes, each a
 * call into the kernel table and a trip of the block through L1; and a row's sum read back
 * is first broadcast into a block-long register. Compiled, each stretch of elementwise
 * instructions between two row operations is one vector loop over the row, its values in
 * registers, a row's sum one scalar.
 *
 * What: row lengths that are a multiple of 16 (whole vectors in either table), the
 * elementwise instructions the flat loop takes, SOFTMAX, LAYER_NORM whose weight and bias
 * are rows read in place or absent, ROW_REDUCE, and REDUCE by sum or mean; inputs
 * contiguous, scalar, one row broadcast over the rows (a bias) or one value per row
 * broadcast along it (a mean saved by the forward).
 * Softmax and layer norm are the kernel table's own functions (softmax_row_f32,
 * layer_norm_row_f32), passed to the loop as pointers; a row's sum is sum_run_f32's
 * (eight double lanes, lane q adding elements q, q + 8, ..., combined pairwise), added up
 * in the loop (kj_sum_add in the prelude); and every elementwise step is the flat loop's.
 * So the results equal the interpreter's to the bit.
 *
 * How: the program is cut into stretches at its row operations. A value a later stretch
 * or a row operation reads is kept in a row-long buffer on the stack (a load, a constant,
 * the product or a row's sum is read again instead); the row operations read their input
 * in place where it is an input's or the product's row. Per row, each stretch is one loop
 * over the row's vectors, then the row operation that ends it. A value summed over its
 * row is added up by the very loop that computes it (a layer norm's backward sums two
 * products it needs nowhere else: no buffer, no second pass), and each value's sum is
 * made once however many reductions read it: called per row, sum_run_f32's chain of
 * dependent adds (about 130 cycles for a row of 256) ran four times per row there.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu-fused-impl.h"
#include "fused/fused-codegen.h"

/* Row buffers on one loop's stack at most: whatever thread runs a job (the pool's, or a
 * caller's with a smaller stack than the default 8 MiB) has this to spare. */
#define ROW_BUFFER_BYTES ((int64_t)64 << 10)

static bool is_row_op(int code)
{
    return code == KILN_FUSED_SOFTMAX || code == KILN_FUSED_LAYER_NORM || code == KILN_FUSED_ROW_REDUCE ||
           code == KILN_FUSED_REDUCE;
}

static bool elementwise(int code)
{
    return code == KILN_FUSED_UNARY || code == KILN_FUSED_BINARY || code == KILN_FUSED_WHERE;
}

/* Where each register comes from, for reading it again in a later stretch. */
enum {
    SRC_NONE,
    SRC_LOAD,    /* a contiguous input: read again */
    SRC_SCALAR,  /* an input read as one value: its vector, set once */
    SRC_ROWVEC,  /* a layer norm's weight or bias row: never read elementwise */
    SRC_ROW,     /* one row broadcast over the rows (a bias): read again at the row's start */
    SRC_PERROW,  /* one value per row broadcast along it (a row's mean): read again */
    SRC_CONST,   /* a constant: its vector, set once */
    SRC_PRODUCT, /* the producer's values: read again */
    SRC_ROWSUM,  /* a ROW_REDUCE: one float per row */
    SRC_VALUE    /* computed: kept in a row buffer where a later stretch or a row op reads it */
};

typedef struct rows_plan {
    int src[KILN_FUSED_MAX_INSTRS * 2];         /* by register */
    int def[KILN_FUSED_MAX_INSTRS * 2];         /* defining instruction, by register */
    int stretch[KILN_FUSED_MAX_INSTRS];         /* by instruction: row operations before it */
    bool buffered[KILN_FUSED_MAX_INSTRS * 2];   /* by register: kept in row buffer b<reg> */
    bool summed[KILN_FUSED_MAX_INSTRS * 2];     /* by register: its row's sum s<reg> is read */
    bool inline_sum[KILN_FUSED_MAX_INSTRS * 2]; /* ... added up as its stretch computes it */
    int direct[KILN_FUSED_MAX_INSTRS * 2];      /* by register: the output a row operation writes, -1 */
} rows_plan;

/* The registers instruction in reads (-1 where none). */
static void reads_of(const kiln_fused_instr *in, int r[3])
{
    r[0] = r[1] = r[2] = -1;
    switch (in->code) {
    case KILN_FUSED_LOAD:
    case KILN_FUSED_CONST:
    case KILN_FUSED_MATMUL:
    case KILN_FUSED_CONV: break;
    case KILN_FUSED_BINARY:
        r[0] = in->a;
        r[1] = in->b;
        break;
    case KILN_FUSED_WHERE:
    case KILN_FUSED_LAYER_NORM:
        r[0] = in->a;
        r[1] = in->b;
        r[2] = in->c;
        break;
    default: r[0] = in->a; break;
    }
}

/* How input a is read: SRC_NONE when not in a form the loop takes. A strided input seen
 * as [rows, R] (normalized) is a row broadcast (strides 0, 1) or a value per row
 * (strides s, 0). */
static int input_source(const fplan *pl, int a)
{
    const fin *f = &pl->in[a];
    if (f->dtype != KILN_F32 || f->is_bool || f->copy_in)
        return SRC_NONE;
    switch (f->kind) {
    case IN_CONTIG: return SRC_LOAD;
    case IN_SCALAR: return SRC_SCALAR;
    case IN_ROWVEC: return SRC_ROWVEC;
    case IN_GATHER:
        if (f->nd != 2 || f->shape[1] != pl->p->reduce_inner)
            return SRC_NONE;
        if (f->strides[0] == 0 && f->strides[1] == 1)
            return SRC_ROW;
        return f->strides[1] == 0 ? SRC_PERROW : SRC_NONE;
    default: return SRC_NONE;
    }
}

static bool plan_rows(const fplan *pl, rows_plan *rp)
{
    const kiln_fused_program *p = pl->p;
    for (int r = 0; r < p->nregs; r++)
        rp->src[r] = SRC_NONE, rp->def[r] = rp->direct[r] = -1,
        rp->buffered[r] = rp->summed[r] = rp->inline_sum[r] = false;
    int stretch = 0;
    for (int i = 0; i < p->ninstrs; i++) {
        const kiln_fused_instr *in = &p->instrs[i];
        rp->stretch[i] = stretch;
        int r[3];
        reads_of(in, r);
        for (int k = 0; k < 3; k++) {
            if (r[k] < 0)
                continue;
            if ((unsigned)r[k] >= (unsigned)p->nregs || rp->def[r[k]] < 0)
                return false;
            int d = rp->def[r[k]];
            bool sum = in->code == KILN_FUSED_REDUCE || in->code == KILN_FUSED_ROW_REDUCE;
            if (sum && !rp->summed[r[k]]) {
                rp->summed[r[k]] = true;
                /* a value this stretch computes is added up as it is computed */
                rp->inline_sum[r[k]] = rp->src[r[k]] == SRC_VALUE && !is_row_op(p->instrs[d].code) &&
                                       rp->stretch[d] == stretch;
            }
            if (sum && rp->inline_sum[r[k]])
                continue;
            /* read by a row operation, or by a later stretch than the one computing it */
            if (rp->src[r[k]] == SRC_VALUE &&
                (is_row_op(in->code) || rp->stretch[d] != stretch || is_row_op(p->instrs[d].code)))
                rp->buffered[r[k]] = true;
        }
        if (in->code == KILN_FUSED_STORE || in->code == KILN_FUSED_REDUCE) {
            if (in->code == KILN_FUSED_REDUCE)
                stretch++;
            continue;
        }
        if ((unsigned)in->dst >= (unsigned)p->nregs)
            return false;
        rp->def[in->dst] = i;
        switch (in->code) {
        case KILN_FUSED_LOAD: rp->src[in->dst] = input_source(pl, in->arg); break;
        case KILN_FUSED_CONST: rp->src[in->dst] = SRC_CONST; break;
        case KILN_FUSED_MATMUL:
        case KILN_FUSED_CONV: rp->src[in->dst] = SRC_PRODUCT; break;
        case KILN_FUSED_ROW_REDUCE: rp->src[in->dst] = SRC_ROWSUM; break;
        default: rp->src[in->dst] = SRC_VALUE; break;
        }
        if (in->code == KILN_FUSED_SOFTMAX || in->code == KILN_FUSED_LAYER_NORM) {
            /* the row operation writes the output its value goes to, else a buffer */
            for (int j = i + 1; j < p->ninstrs && rp->direct[in->dst] < 0 && !pl->stream; j++)
                if (p->instrs[j].code == KILN_FUSED_STORE && p->instrs[j].a == in->dst)
                    rp->direct[in->dst] = p->instrs[j].arg;
            rp->buffered[in->dst] = rp->direct[in->dst] < 0;
        }
        if (is_row_op(in->code))
            stretch++;
    }
    return true;
}

bool kiln__cpu_jit_rows_compilable(const fplan *pl)
{
    const kiln_fused_program *p = pl->p;
    int64_t row = p->reduce_inner;
    if (!pl->whole_rows || row <= 0 || row % 16 || row > 8192 || p->nregs > KILN_FUSED_MAX_INSTRS * 2)
        return false;
    for (int k = 0; k < p->ninputs; k++)
        if (pl->in[k].kind != IN_OPERAND && input_source(pl, k) == SRC_NONE)
            return false;
    rows_plan rp;
    if (!plan_rows(pl, &rp))
        return false;
    int nbuffers = 0;
    kiln__sbuf scratch = {0};
    bool ok = true;
    for (int i = 0; i < p->ninstrs && ok; i++) {
        const kiln_fused_instr *in = &p->instrs[i];
        int r[3];
        reads_of(in, r);
        switch (in->code) {
        case KILN_FUSED_LOAD:
        case KILN_FUSED_CONST: break;
        case KILN_FUSED_STORE: ok = pl->out[in->arg] != NULL && rp.src[in->a] != SRC_ROWVEC; break;
        case KILN_FUSED_MATMUL:
        case KILN_FUSED_CONV: ok = i == 0 && pl->product; break;
        case KILN_FUSED_UNARY:
        case KILN_FUSED_BINARY:
        case KILN_FUSED_WHERE:
            ok = kiln__cpu_jit_emit_value(&scratch, in, i);
            for (int k = 0; k < 3 && ok; k++)
                ok = r[k] < 0 || rp.src[r[k]] != SRC_ROWVEC;
            break;
        case KILN_FUSED_SOFTMAX:
        case KILN_FUSED_ROW_REDUCE:
            /* a row of one repeated value never comes here (the plan refuses it) */
            ok = rp.src[in->a] == SRC_LOAD || rp.src[in->a] == SRC_PRODUCT || rp.src[in->a] == SRC_VALUE ||
                 rp.src[in->a] == SRC_ROW;
            break;
        case KILN_FUSED_REDUCE:
            ok = (in->op == KILN_REDUCE_SUM || in->op == KILN_REDUCE_MEAN) && pl->out[in->arg] != NULL &&
                 (rp.src[in->a] == SRC_LOAD || rp.src[in->a] == SRC_PRODUCT || rp.src[in->a] == SRC_VALUE);
            break;
        case KILN_FUSED_LAYER_NORM:
            ok = (rp.src[in->a] == SRC_LOAD || rp.src[in->a] == SRC_PRODUCT || rp.src[in->a] == SRC_VALUE) &&
                 (in->b < 0 || rp.src[in->b] == SRC_ROWVEC || rp.src[in->b] == SRC_ROW) &&
                 (in->c < 0 || rp.src[in->c] == SRC_ROWVEC || rp.src[in->c] == SRC_ROW);
            break;
        default: ok = false;
        }
    }
    free(scratch.p);
    for (int r = 0; r < p->nregs; r++)
        nbuffers += rp.buffered[r];
    return ok && (int64_t)nbuffers * row * (int64_t)sizeof(float) <= ROW_BUFFER_BYTES;
}

/* The row of register x as a pointer (a row operation's operand). */
static void row_pointer(kiln__sbuf *b, const fplan *pl, const rows_plan *rp, int x)
{
    const kiln_fused_instr *d = &pl->p->instrs[rp->def[x]];
    if (rp->src[x] == SRC_LOAD)
        kiln__sbuf_printf(b, "in%d + e", d->arg);
    else if (rp->src[x] == SRC_ROWVEC || rp->src[x] == SRC_ROW)
        kiln__sbuf_printf(b, "in%d", d->arg);
    else if (rp->src[x] == SRC_PRODUCT)
        kiln__sbuf_printf(b, "prod + e");
    else if (rp->direct[x] >= 0)
        kiln__sbuf_printf(b, "out%d + e", rp->direct[x]);
    else
        kiln__sbuf_printf(b, "b%d", x);
}

/* Register x read again in a stretch after the one defining it. */
static void reread(kiln__sbuf *b, const fplan *pl, const rows_plan *rp, int x)
{
    const kiln_fused_instr *d = &pl->p->instrs[rp->def[x]];
    /* streamed (a program far larger than the caches): each row input asked for 4 KiB
     * ahead, as the flat loop does */
    if (pl->stream && rp->src[x] == SRC_LOAD)
        kiln__sbuf_printf(b, "            __builtin_prefetch(in%d + e + j + 1024, 0, 3);\n", d->arg);
    if (pl->stream && rp->src[x] == SRC_PRODUCT)
        kiln__sbuf_printf(b, "            __builtin_prefetch(prod + e + j + 1024, 0, 3);\n");
    switch (rp->src[x]) {
    case SRC_LOAD: kiln__sbuf_printf(b, "            kj_v r%d = KJ_LD(in%d + e + j);\n", x, d->arg); break;
    case SRC_SCALAR: kiln__sbuf_printf(b, "            kj_v r%d = s%d;\n", x, d->arg); break;
    case SRC_ROW: kiln__sbuf_printf(b, "            kj_v r%d = KJ_LD(in%d + j);\n", x, d->arg); break;
    case SRC_PERROW:
        kiln__sbuf_printf(b, "            kj_v r%d = KJ_SET(in%d[r * %lld]);\n", x, d->arg,
                          (long long)pl->in[d->arg].strides[0]);
        break;
    case SRC_CONST: kiln__sbuf_printf(b, "            kj_v r%d = k%d;\n", x, 2 * rp->def[x]); break;
    case SRC_PRODUCT: kiln__sbuf_printf(b, "            kj_v r%d = KJ_LD(prod + e + j);\n", x); break;
    case SRC_ROWSUM: kiln__sbuf_printf(b, "            kj_v r%d = KJ_SET(q%d);\n", x, x); break;
    default:
        if (rp->direct[x] >= 0)
            kiln__sbuf_printf(b, "            kj_v r%d = KJ_LD(out%d + e + j);\n", x, rp->direct[x]);
        else
            kiln__sbuf_printf(b, "            kj_v r%d = KJ_LD(b%d + j);\n", x, x);
        break;
    }
}

/* Whether STORE i is written where it stands: an elementwise value is stored where it is
 * computed, a row operation writes its first output itself, and a product kept is
 * computed straight into its output already. */
static bool store_in_place(const fplan *pl, const rows_plan *rp, int i)
{
    const kiln_fused_program *p = pl->p;
    const kiln_fused_instr *in = &p->instrs[i];
    if (pl->product && in->a == p->instrs[0].dst && in->arg == pl->product_out)
        return false;
    if (elementwise(p->instrs[rp->def[in->a]].code))
        return false;
    return rp->direct[in->a] != in->arg;
}

/* One stretch's loop over the row: instructions [from, to), elementwise all. */
static void emit_stretch(kiln__sbuf *b, const fplan *pl, const rows_plan *rp, int from, int to)
{
    const kiln_fused_program *p = pl->p;
    bool any = false;
    for (int i = from; i < to && !any; i++)
        any = elementwise(p->instrs[i].code) ||
              (p->instrs[i].code == KILN_FUSED_STORE && store_in_place(pl, rp, i));
    if (!any)
        return;
    kiln__sbuf_printf(b, "        for (int64_t j = 0; j < R; j += KJ_W) {\n");
    /* values from earlier stretches this one reads, once each */
    bool have[KILN_FUSED_MAX_INSTRS * 2] = {false};
    for (int i = from; i < to; i++) {
        const kiln_fused_instr *in = &p->instrs[i];
        if (!elementwise(in->code) && !(in->code == KILN_FUSED_STORE && store_in_place(pl, rp, i)))
            continue;
        int r[3];
        reads_of(in, r);
        for (int k = 0; k < 3; k++)
            if (r[k] >= 0 && !have[r[k]] && rp->def[r[k]] < from) {
                reread(b, pl, rp, r[k]);
                have[r[k]] = true;
            }
    }
    for (int i = from; i < to; i++) {
        const kiln_fused_instr *in = &p->instrs[i];
        switch (in->code) {
        case KILN_FUSED_LOAD:
        case KILN_FUSED_CONST:
        case KILN_FUSED_MATMUL:
        case KILN_FUSED_CONV:
            /* read where used: inputs, constants and the product cost nothing to read again */
            if (rp->src[in->dst] != SRC_ROWVEC) {
                bool used = false;
                for (int j = i + 1; j < to && !used; j++) {
                    int r[3];
                    reads_of(&p->instrs[j], r);
                    used = !is_row_op(p->instrs[j].code) &&
                           (r[0] == in->dst || r[1] == in->dst || r[2] == in->dst);
                }
                if (used && !have[in->dst]) {
                    reread(b, pl, rp, in->dst);
                    have[in->dst] = true;
                }
            }
            break;
        case KILN_FUSED_UNARY:
        case KILN_FUSED_BINARY:
        case KILN_FUSED_WHERE:
            kiln__cpu_jit_emit_assign(b, in, i, "            ");
            have[in->dst] = true;
            break;
        default: /* STORE */
            if (store_in_place(pl, rp, i))
                kiln__sbuf_printf(b, "            KJ_OUT(out%d + e + j, r%d);\n", in->arg, in->a);
            break;
        }
        for (int j = i + 1; elementwise(in->code) && j < p->ninstrs; j++)
            if (p->instrs[j].code == KILN_FUSED_STORE && p->instrs[j].a == in->dst)
                kiln__sbuf_printf(b, "            KJ_OUT(out%d + e + j, r%d);\n", p->instrs[j].arg, in->dst);
        if (elementwise(in->code) && rp->buffered[in->dst])
            kiln__sbuf_printf(b, "            KJ_ST(b%d + j, r%d);\n", in->dst, in->dst);
        if (elementwise(in->code) && rp->inline_sum[in->dst])
            kiln__sbuf_printf(b, "            l%d = kj_sum_add(l%d, r%d);\n", in->dst, in->dst, in->dst);
    }
    kiln__sbuf_printf(b, "        }\n");
}

/* The row operation instruction i. */
static void emit_row_op(kiln__sbuf *b, const fplan *pl, const rows_plan *rp, int i, bool *done)
{
    const kiln_fused_instr *in = &pl->p->instrs[i];
    switch (in->code) {
    case KILN_FUSED_SOFTMAX:
        kiln__sbuf_printf(b, "        softmax_row(");
        row_pointer(b, pl, rp, in->dst);
        kiln__sbuf_printf(b, ", ");
        row_pointer(b, pl, rp, in->a);
        kiln__sbuf_printf(b, ", R, %d);\n", in->op != 0);
        break;
    case KILN_FUSED_LAYER_NORM:
        kiln__sbuf_printf(b, "        { double mean, rstd;\n          layer_norm_row(");
        row_pointer(b, pl, rp, in->dst);
        kiln__sbuf_printf(b, ", ");
        row_pointer(b, pl, rp, in->a);
        kiln__sbuf_printf(b, ", R, ");
        if (in->b >= 0)
            row_pointer(b, pl, rp, in->b);
        else
            kiln__sbuf_printf(b, "0");
        kiln__sbuf_printf(b, ", ");
        if (in->c >= 0)
            row_pointer(b, pl, rp, in->c);
        else
            kiln__sbuf_printf(b, "0");
        kiln__sbuf_printf(b, ", %a, &mean, &rstd); }\n", in->alpha);
        break;
    default: { /* ROW_REDUCE and REDUCE: the row's sum s<a>, once per value */
        int x = in->a;
        if (!*done) {
            if (!rp->inline_sum[x]) { /* an input's row, the product's, or a buffered value */
                kiln__sbuf_printf(
                    b, "        for (int64_t j = 0; j < R; j += KJ_W)\n            l%d = kj_sum_add(l%d, KJ_LD(",
                    x, x);
                row_pointer(b, pl, rp, x);
                kiln__sbuf_printf(b, " + j));\n");
            }
            kiln__sbuf_printf(b, "        s%d = kj_sum_total(l%d);\n", x, x);
            *done = true;
        }
        const char *mean = in->op == KILN_REDUCE_MEAN ? " / (double)R" : "";
        if (in->code == KILN_FUSED_ROW_REDUCE) /* as the interpreter: rounded once to f32 */
            kiln__sbuf_printf(b, "        q%d = (float)(s%d%s);\n", in->dst, x, mean);
        else /* a block holding whole rows: the row's sum added to a zero */
            kiln__sbuf_printf(b, "        out%d[r] = (float)((0.0 + s%d)%s);\n", in->arg, x, mean);
        break;
    }
    }
}

bool kiln__cpu_jit_rows_source(kiln__sbuf *b, const fplan *pl)
{
    const kiln_fused_program *p = pl->p;
    rows_plan rp;
    if (!plan_rows(pl, &rp))
        return false;
    kiln__sbuf_printf(b,
                      "typedef void (*kj_softmax_fn)(float *, const float *, int64_t, _Bool);\n"
                      "typedef void (*kj_layer_norm_fn)(float *, const float *, int64_t, const float *, "
                      "const float *, double, double *, double *);\n"

                      "void kiln_fused_loop(int64_t n, const float *const *in, float *const *out, const float *k, "
                      "int stream, void (*const *fn)(void))\n{\n"
                      "    (void)in; (void)out; (void)k;\n"
                      "    const kj_softmax_fn softmax_row = (kj_softmax_fn)fn[0];\n"
                      "    const kj_layer_norm_fn layer_norm_row = (kj_layer_norm_fn)fn[1];\n"
                      "    (void)softmax_row; (void)layer_norm_row;\n"
                      "    enum { R = %lld };\n"
                      /* streamed: outputs far larger than the caches, non-temporal stores (every
                       * output row 64-byte aligned) */
                      "#define KJ_OUT(p, v) do { if (stream) KJ_NT((p), (v)); else KJ_ST((p), (v)); } while (0)\n",
                      (long long)p->reduce_inner);
    for (int a = 0; a < p->ninputs; a++) {
        if (pl->in[a].kind == IN_SCALAR)
            kiln__sbuf_printf(b, "    const kj_v s%d = KJ_SET(in[%d][0]);\n", a, a);
        else if (pl->in[a].kind != IN_OPERAND)
            kiln__sbuf_printf(b, "    const float *in%d = in[%d];\n", a, a);
    }
    if (pl->product)
        kiln__sbuf_printf(b, "    const float *prod = in[%d];\n", p->ninputs);
    for (int o = 0; o < p->noutputs; o++)
        kiln__sbuf_printf(b, "    float *out%d = out[%d];\n", o, o);
    for (int i = 0; i < p->ninstrs; i++) {
        const kiln_fused_instr *in = &p->instrs[i];
        if (in->code == KILN_FUSED_CONST ||
            (in->code == KILN_FUSED_UNARY && kiln__cpu_jit_unary_uses_alpha(in->op)))
            kiln__sbuf_printf(b, "    const kj_v k%d = KJ_SET(k[%d]);\n", 2 * i, 2 * i);
    }
    for (int r = 0; r < p->nregs; r++)
        if (rp.buffered[r])
            kiln__sbuf_printf(b, "    float b%d[R] __attribute__((aligned(64)));\n", r);
    kiln__sbuf_printf(b, "    for (int64_t r = 0; r < n / R; r++) {\n        const int64_t e = r * R;\n"
                         "        (void)e;\n");
    for (int r = 0; r < p->nregs; r++) {
        if (rp.src[r] == SRC_ROWSUM)
            kiln__sbuf_printf(b, "        float q%d;\n", r);
        if (rp.summed[r])
            kiln__sbuf_printf(b, "        kj_sum l%d = kj_sum_zero();\n        double s%d;\n", r, r);
    }
    bool done[KILN_FUSED_MAX_INSTRS * 2] = {false}; /* by register: s<reg> made */
    int from = 0;
    for (int i = 0; i < p->ninstrs; i++) {
        if (!is_row_op(p->instrs[i].code))
            continue;
        emit_stretch(b, pl, &rp, from, i);
        emit_row_op(b, pl, &rp, i, &done[p->instrs[i].a]);
        from = i + 1;
    }
    emit_stretch(b, pl, &rp, from, p->ninstrs);
    kiln__sbuf_printf(b, "    }\n    if (stream)\n        KJ_FENCE();\n}\n");
    return b->ok;
}
