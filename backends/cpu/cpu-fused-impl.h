/*
 * backends/cpu/cpu-fused-impl.h — what the cpu's fused_run shares between its two files:
 * cpu-fused.c plans a kiln_fused_program and runs it per block over an element range;
 * cpu-fused-product.c runs a program headed by a producer (MATMUL, CONV, POOL_GRAD): the
 * producer by its own entry (or by planes), then the rest of the program over its output.
 */
#ifndef KILN_CPU_FUSED_IMPL_H
#define KILN_CPU_FUSED_IMPL_H

#include "cpu-fused-jit.h"
#include "cpu-impl.h"
#include "fused-program.h"

/* IN_ROWS: strided, but contiguous along a last dim of pl->row elements, which the
 * blocks never cross, so a block reads it in place (a row-broadcast bias, a slice). */
enum {
    IN_CONTIG,
    IN_SCALAR,
    IN_GATHER,
    IN_ROWS,
    IN_OPERAND, /* a product's operand: read by the product, never loaded */
    IN_ROWVEC   /* one row broadcast over all rows, read only by LAYER_NORM: read in place */
};

typedef struct fin {
    int kind;
    bool copy_in;         /* also an output: always copied into scratch when loaded */
    bool is_bool;         /* bool elements, loaded as 1 or 0 (always gathered) */
    kiln_dtype dtype;     /* f32, bool, or f16/bf16 (converted to f32 as gathered) */
    const float *base;    /* the element at index 0 of every dim (f32 inputs) */
    const uint8_t *bytes; /* the same for the others */
    int nd;               /* dims after size-1 dims dropped and mergeable ones merged */
    int64_t shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
} fin;

typedef struct fplan {
    const kiln_fused_program *p;
    const kiln__cpu_kernels *k;
    fin in[KILN_FUSED_MAX_INPUTS];
    float *out[KILN_FUSED_MAX_OUTPUTS];
    uint8_t *out_bool[KILN_FUSED_MAX_OUTPUTS];  /* set for bool outputs (out[] NULL) */
    uint16_t *out_half[KILN_FUSED_MAX_OUTPUTS]; /* set for f16/bf16 outputs (out[] NULL) */
    bool half;                         /* an f16 or bf16 program: f32 registers, each value rounded to the dtype */
    int slot[KILN_FUSED_MAX_INSTRS];   /* scratch slot of the instruction's dst, -1 none */
    int direct[KILN_FUSED_MAX_INSTRS]; /* output the instruction writes into, -1 none */
    bool stored_direct[KILN_FUSED_MAX_INSTRS]; /* a STORE already done by a direct write */
    bool scalar[KILN_FUSED_MAX_INSTRS * 2];    /* by register: one value for every element */
    bool rowvec[KILN_FUSED_MAX_INSTRS * 2];    /* by register: an IN_ROWVEC load (one row) */
    float consts[KILN_FUSED_MAX_INSTRS];
    int nslots;
    int64_t block;
    int64_t row;    /* blocks end at multiples of this (0: anywhere) */
    int64_t lo, hi; /* the element range the jobs split */
    bool stream;    /* outputs far larger than the caches: non-temporal stores */
    bool prefetch;  /* one or two contiguous inputs: prefetch the next block's */
    int nheavy;     /* unary instructions computing a transcendental (kiln__cpu_fused_heavy) */
    bool whole_rows; /* a SOFTMAX, LAYER_NORM or ROW_REDUCE: blocks hold whole rows */
    bool has_reduce;
    char *scratch; /* njobs slabs of nslots * block floats */
    int njobs;
    /* the program's compiled loop (a product's epilogue too), NULL: the block interpreter */
    kiln__cpu_jit_loop jit;
    /* a program headed by a producer (instruction 0) */
    bool product;
    int product_out;   /* the output the product is computed straight into, -1: scratch */
    kiln_tdesc mm_out; /* a MATMUL's product shape (no buffer: only its shape is read) */
    bool conv;         /* the producer is a CONV; its output shape in conv_out */
    kiln_tdesc conv_out;
    /* the producer is a POOL_GRAD over planes of plane_in elements, each from plane_out
     * elements of grad_out and indices */
    bool pool_grad;
    int64_t planes, plane_in, plane_out;
    /* a CONV whose epilogue is a chain (cpu-fused-chain.c): stored into output chain_out
     * by the convolution itself; chain_plane[k] is the input of op k's per-plane values */
    bool chained;
    int chain_out;
    int chain_plane[KILN__CHAIN_MAX_OPS];
    kiln__cpu_chain chain;
} fplan;

/** o[0, m) = src[0, m) with non-temporal stores where the CPU has them (pl->stream). */
void kiln__cpu_fused_store_stream(const fplan *pl, float *o, const float *src, int64_t m);

/* Ask for the next block's contiguous inputs while this one computes, where the program
 * has heavy ops (erf, tanh, gelu...): such a block is compute-bound, and without this its
 * loads only start when the next block does. The requests are spread over the heavy ops
 * (run_block asks for a share after each KILN_CPU_PREFETCH_CHUNK elements of one) rather
 * than issued all at once when the block starts: a whole block's lines in one burst
 * outrun the core's outstanding misses, so the later ones only went out once the first
 * arrived. Measured on gelu(x·a+b)·c over 64 MiB with a, b, c per column, one thread, CPU
 * time, three alternating runs each: 7.3-7.7 ms with the burst, 6.2-6.7 ms spread. A
 * program without heavy ops asks for nothing: it streams at memory speed, which the
 * hardware prefetchers keep up with, and a burst only got in the way (layer_norm(x + r)
 * on [8192, 768], one thread: 2.72-2.80 ms without, 3.55 with; unfused 3.05-3.15). Only
 * for one or two contiguous inputs (pl->prefetch): with four (gelu(x·a+b)·c with a, b, c
 * full) the hardware prefetchers are busy already. The stores were tried the same way (a block's streamed output kept
 * aside and written out in shares during the next block's heavy op): 7.3 ms against 6.2,
 * so they are not deferred. */

typedef struct kiln__cpu_prefetcher {
    const char *base[2]; /* the next block's first element of each contiguous input */
    int nbase;
    int64_t bytes;  /* the next block's bytes per input */
    int64_t issued; /* bytes of each already asked for */
} kiln__cpu_prefetcher;

/* Elements of a heavy op between two shares of prefetches. */
#define KILN_CPU_PREFETCH_CHUNK 256

/* Ask for each input's lines up to byte upto of the next block (those not asked yet).
 * Inline, as the setup below: called per block, where blocks may be one short row. */
static inline void kiln__cpu_fused_prefetch_upto(kiln__cpu_prefetcher *pf, int64_t upto)
{
    if (upto > pf->bytes)
        upto = pf->bytes;
    for (int k = 0; k < pf->nbase; k++)
        for (int64_t b = pf->issued; b < upto; b += 64)
            __builtin_prefetch(pf->base[k] + b, 0, 3);
    if (upto > pf->issued)
        pf->issued = upto;
}

/* The length of the block that starts at i0 of a span ending at end: at most pl->block
 * elements, whole rows where the program takes them whole (spans start on a row; block >=
 * row), else cut at a row's end. */
static inline int64_t kiln__cpu_fused_block_len(const fplan *pl, int64_t i0, int64_t end)
{
    int64_t m = end - i0 < pl->block ? end - i0 : pl->block;
    if (pl->whole_rows)
        m -= m % pl->row;
    else if (pl->row && m > pl->row - i0 % pl->row)
        m = pl->row - i0 % pl->row;
    return m;
}

/* Set pf up for the block after [i0, i0 + m) of a span ending at end. Nothing to ask for
 * unless pl->prefetch and the program has heavy ops, which ask (run_block). */
static inline void kiln__cpu_fused_prefetch_next(const fplan *pl, int64_t i0, int64_t m, int64_t end,
                                                 kiln__cpu_prefetcher *pf)
{
    int64_t next = i0 + m, len = next < end ? kiln__cpu_fused_block_len(pl, next, end) : 0;
    pf->nbase = 0;
    pf->bytes = pf->issued = 0;
    if (len <= 0 || !pl->prefetch || pl->nheavy == 0)
        return;
    for (int k = 0; k < pl->p->ninputs && pf->nbase < 2; k++)
        if (pl->in[k].kind == IN_CONTIG)
            pf->base[pf->nbase++] = (const char *)(pl->in[k].base + next);
    pf->bytes = len * (int64_t)sizeof(float);
}

/* Whether unary op costs many vector instructions per element (exp, erf, tanh, ...):
 * the next block's prefetch is spread over such ops. */
static inline bool kiln__cpu_fused_heavy(int op)
{
    switch (op) {
    case KILN_UNARY_EXP:
    case KILN_UNARY_LOG:
    case KILN_UNARY_LOG1P:
    case KILN_UNARY_EXPM1:
    case KILN_UNARY_SIN:
    case KILN_UNARY_COS:
    case KILN_UNARY_TANH:
    case KILN_UNARY_SIGMOID:
    case KILN_UNARY_ELU:
    case KILN_UNARY_GELU:
    case KILN_UNARY_GELU_TANH:
    case KILN_UNARY_SILU:
    case KILN_UNARY_SOFTPLUS:
    case KILN_UNARY_ERF:
    case KILN_UNARY_POW_SCALAR: return true;
    default: return false;
    }
}

/* Whether code is a producer heading a program (MATMUL, CONV, POOL_GRAD). */
static inline bool kiln__cpu_fused_producer(int code)
{
    return code == KILN_FUSED_MATMUL || code == KILN_FUSED_CONV || code == KILN_FUSED_POOL_GRAD;
}

typedef struct freg {
    const float *p;
    int64_t stride; /* 0: one value for every element */
} freg;

/** The compiled loop for planned program pl (cpu-fused-jit.c), or NULL when it runs in
 *  the block interpreter (the device's option jit=off, not a program the loops cover, or
 *  no compiler). */
kiln__cpu_jit_loop kiln__cpu_jit_get(const kiln__cpu_ctx *ctx, const fplan *pl);

struct kiln__sbuf;
/** The vector expression of unary op on register a (instruction i's constants k<2i>,
 *  k[2i], k[2i + 1]) into b; false when the op has none in the compiled loops. */
bool kiln__cpu_jit_emit_unary(struct kiln__sbuf *b, int op, int i, int a, double alpha);
/** Whether the unary op reads its alpha as the vector k<2i>. */
bool kiln__cpu_jit_unary_uses_alpha(int op);
/** The vector expression of elementwise instruction in (number i) into b: a UNARY,
 *  a BINARY (arithmetic or a comparison, 1 or 0) or a WHERE; false when the compiled
 *  loops have none for it. */
bool kiln__cpu_jit_emit_value(struct kiln__sbuf *b, const kiln_fused_instr *in, int i);
/** "kj_v r<dst> = <its expression>;" for elementwise instruction in, after indent. */
void kiln__cpu_jit_emit_assign(struct kiln__sbuf *b, const kiln_fused_instr *in, int i, const char *indent);
/** Whether planned program pl, which takes its rows whole, has a compiled form
 *  (cpu-fused-jit-rows.c), and that form's kiln_fused_loop appended to b (after the
 *  prelude): false when it cannot be written. */
bool kiln__cpu_jit_rows_compilable(const fplan *pl);
bool kiln__cpu_jit_rows_source(struct kiln__sbuf *b, const fplan *pl);

/** Plan p into pl (zeroed by the caller); KILN_ENOTSUP for a program the cpu does not run. */
int kiln__cpu_fused_plan(fplan *pl, const kiln_fused_program *p);
/** Where element i0 of strided input f lives, relative to its base. */
int64_t kiln__cpu_fused_offset_of(const fin *f, int64_t i0);
/** Run the program over elements [begin, end) of one job: through its compiled loop where
 *  it has one (pl->jit), else in blocks of at most pl->block
 *  (whole rows where the program has rows): scratch is the job's nslots * block floats,
 *  acc its reduction accumulators. A product's values for elements [prod_lo, end) are at
 *  prod (NULL without a product). */
void kiln__cpu_fused_span(const fplan *pl, float *scratch, double *acc, int64_t begin, int64_t end,
                          const float *prod, int64_t prod_lo);
/** The producer heading p, if any, into pl (product_out, mm or conv): 1 when there is one,
 *  0 when there is none, KILN_ENOTSUP when it is not one the cpu runs. */
int kiln__cpu_fused_plan_product(fplan *pl, const kiln_fused_program *p);
/** Run a program headed by a producer (planned, pl->product set): 0, or a negative error. */
int kiln__cpu_fused_product(kiln__cpu_ctx *ctx, fplan *pl);

/** Whether planned program pl (a CONV heading it) is a chain: after the convolution
 *  only binary ops between the running value and a constant or a load (a scalar, one
 *  value per output plane, or a contiguous tensor no output overlaps), relus, and one
 *  store of the last value. Fills pl->chain, chain_out and chain_plane, sets pl->chained. */
bool kiln__cpu_fused_chain_plan(fplan *pl);
/** Run a chained program: the convolution straight into the output, the chain applied
 *  to each tile as it is stored (kiln__cpu_conv_chain): 0, or a negative error. */
int kiln__cpu_fused_chain_run(kiln__cpu_ctx *ctx, fplan *pl);

/* The block size of programs too small to tune and of product epilogues (elements). */
#define KILN_CPU_FUSED_BLOCK 2048

/* One run's block-size choice (cpu-fused-tune.c): the class's cached winner, or the
 * candidate this run times while the class is being tuned. */
typedef struct kiln__cpu_fused_tuning {
    char device[64], key[112], id[184];
    int candidate; /* -1: not timed */
    double start_ns;
} kiln__cpu_fused_tuning;
/** The block size to run planned program pl with (t filled for kiln__cpu_fused_block_end). */
int64_t kiln__cpu_fused_block_begin(const kiln__cpu_ctx *ctx, const fplan *pl, kiln__cpu_fused_tuning *t);
/** After the run: record its time when it tuned a candidate (the last one stores the winner). */
void kiln__cpu_fused_block_end(const kiln__cpu_fused_tuning *t);

#endif /* KILN_CPU_FUSED_IMPL_H */
