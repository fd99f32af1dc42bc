/*
 * backends/fused-program.h — the program a fused group becomes: what the fusion layer
 * (backends/fused) hands to a backend's fused_run entry, its code generator hook.
 *
 * A program computes n elements at once. Element i of every output is produced from
 * element i of the program's loads, so a backend may cut [0, n) into blocks of any size,
 * run them in any order or in parallel, and evaluate the instructions of one block in
 * order (a loop over registers of block length, the cpu backend's way) or emit them as
 * one expression per element (generated C, CUDA via NVRTC, a Vulkan shader): the
 * program is straight-line code over virtual registers with no control flow.
 *
 * Operands. Each input is a kiln_tdesc of n elements whose own shape and strides say
 * where element i lives: i is unravelled row-major in that input's shape, then dotted
 * with its strides (0 for a broadcast dim, negative for a flip). Views — reshape,
 * permute, slice, expand — are thereby folded into index arithmetic, and two inputs of
 * one program may have different shapes with the same element count. Each output is
 * contiguous with n elements. No output overlaps an input except exactly (the same
 * buffer, offset and a contiguous layout: an in-place update, whose element i is read
 * before it is written).
 *
 * Instructions. Register r is written by exactly one instruction, before any read:
 *   LOAD   r = inputs[arg][i]
 *   CONST  r = alpha                     (the value of a fill)
 *   UNARY  r = op(a; alpha, beta)        (a kiln_unary_op, its backend.h semantics)
 *   BINARY r = op(a, b)                  (a kiln_binary_op; a comparison gives 1 or 0)
 *   WHERE  r = a != 0 ? b : c            (a: a comparison's result or a bool load)
 *   STORE  outputs[arg][i] = a           (r unused)
 *   REDUCE outputs[arg][i / inner] = op over the inner consecutive elements of a
 *          (op KILN_REDUCE_SUM or KILN_REDUCE_MEAN, accumulated in double; KILN_REDUCE_MAX
 *          or KILN_REDUCE_MIN, NaN propagating as the unfused reduce does; r unused)
 *   SOFTMAX r = softmax (op 1: log-softmax) of a over each row of inner consecutive
 *          elements
 *   MATMUL r = element i of inputs[arg] @ inputs[arg2] (the matmul entry's semantics:
 *          operands [B..., M, K] and [B..., K, N], batch dims broadcast to the n
 *          elements [B..., M, N] of the product, i unravelled row-major in them). Only
 *          as the program's first instruction, once: the program is then the epilogue
 *          of a matrix product, which a backend applies to each tile of the product as
 *          it is computed (rows of N elements are never cut). Its two inputs are the
 *          product's operands, not n-element inputs, and no other instruction loads
 *          them. MATMUL's dtype is the program's.
 *   CONV   r = element i of the convolution of inputs[arg] by inputs[arg2] plus
 *          inputs[arg3] per output channel where arg3 >= 0 (the conv entry's semantics
 *          with the program's conv geometry): n elements [N, O, S'...]. Only as the first
 *          instruction, once, like MATMUL: the program is the convolution's epilogue,
 *          which a backend applies to each image (or group of images) as it is computed.
 *          Its inputs are the convolution's operands, loaded by no other instruction.
 *   POOL_GRAD r = element i of the gradient a max pooling passes back to its input:
 *          the pool_backward entry's semantics into a zeroed grad_x of the program's
 *          pool_grad_x shape [N, C, S...] (n elements), from grad_out inputs[arg] and
 *          the forward's indices inputs[arg2] (i64, flat within each input plane), with
 *          the program's pool geometry. Only as the first instruction, once, like CONV:
 *          the program is then the gradient's epilogue (a relu's backward, say), which a
 *          backend applies to each plane (or group of planes) as it is scattered, so the
 *          zero fill and the scatter stay in the caches. Its inputs are operands, loaded
 *          by no other instruction.
 *   ROW_REDUCE r = op (KILN_REDUCE_SUM or KILN_REDUCE_MEAN) over the row of inner
 *          consecutive elements of a that element i lies in, every element of a row
 *          holding its row's value (accumulated in double and rounded once, as REDUCE):
 *          a reduction whose result the rest of the program reads back broadcast over the
 *          rows (softmax's backward, y (g - sum(g y))). Rows are whole, as for SOFTMAX.
 *          Only for a backend whose caps say fused_row_reduce.
 *   LAYER_NORM r = a normalized over each row of inner consecutive elements as the
 *          layer_norm entry does (mean and variance in double, eps = alpha), times
 *          register b and plus register c where those are >= 0 (the weight and the bias:
 *          element i holds the value for row position i % inner); rows are whole, as
 *          for SOFTMAX
 * Every register holds the program's dtype (f32 today): each instruction rounds to it,
 * as the unfused op did, so a backend that evaluates the instructions with its unfused
 * kernels gives the unfused results to the bit. Inputs and outputs have that dtype or
 * bool: a bool load gives 1 or 0, a store to a bool output writes value != 0 (the
 * fusion layer stores only comparison results there). A REDUCE's output has n / inner
 * elements (inner = reduce_inner, which divides n): a reduction over trailing dims takes
 * the group's last values in its reads instead of reading them back from memory.
 *
 * A backend refuses (KILN_ENOTSUP) a program holding a code or a REDUCE op it does not
 * generate; the fusion layer then replays the group's calls, so codes added later never
 * reach a generator that predates them with a wrong result. It asks before it records a
 * producer too: supports() for KILN_ENTRY_FUSED with op KILN_FUSED_MATMUL, KILN_FUSED_CONV or
 * KILN_FUSED_POOL_GRAD.
 *
 * A backend that generates code caches it by the program's shape: the instruction list
 * (codes, ops, registers, args; alpha and beta may be baked in or passed), the dtype, and
 * per input its layout class (contiguous, broadcast scalar, strided). kiln__fused_key
 * gives such a key.
 */
#ifndef KILN_FUSED_PROGRAM_H
#define KILN_FUSED_PROGRAM_H

#include <stdint.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kiln_fused_code {
    KILN_FUSED_LOAD = 0,
    KILN_FUSED_CONST,
    KILN_FUSED_UNARY,
    KILN_FUSED_BINARY,
    KILN_FUSED_WHERE,
    KILN_FUSED_STORE,
    KILN_FUSED_REDUCE,
    KILN_FUSED_SOFTMAX,
    KILN_FUSED_MATMUL,
    KILN_FUSED_LAYER_NORM,
    KILN_FUSED_CONV,
    KILN_FUSED_POOL_GRAD,
    KILN_FUSED_ROW_REDUCE,
    KILN_FUSED_CODE_COUNT
} kiln_fused_code;

/** Bounds a program stays within (the fusion layer flushes a group before passing them). */
#define KILN_FUSED_MAX_INSTRS 64
#define KILN_FUSED_MAX_INPUTS 16
#define KILN_FUSED_MAX_OUTPUTS 16

typedef struct kiln_fused_instr {
    kiln_fused_code code;
    int op;             /* UNARY: a kiln_unary_op; BINARY: a kiln_binary_op */
    int dst, a, b, c;   /* registers (dst unused by STORE; a, b, c where the code reads them) */
    int arg;            /* LOAD: input index; STORE: output index */
    double alpha, beta; /* UNARY's parameters; CONST's value in alpha */
    int arg2;           /* MATMUL: the input index of the right operand (arg: the left); CONV:
                           the weight's (arg: the input's); POOL_GRAD: the indices' (arg:
                           grad_out's) */
    int arg3;           /* CONV: the bias's input index, -1 for none */
} kiln_fused_instr;

struct kiln_fused_program {
    kiln_dtype dtype;     /* of every register; inputs and outputs: it or bool */
    int64_t n;            /* elements */
    int64_t reduce_inner; /* elements per REDUCE output element (0: no REDUCE) */
    int ninputs, noutputs, ninstrs, nregs;
    const kiln_tdesc *inputs;  /* ninputs, each of n elements */
    const kiln_tdesc *outputs; /* noutputs, contiguous, n elements each (REDUCE's: n / reduce_inner) */
    const kiln_fused_instr *instrs;
    const kiln_conv_params *conv; /* CONV's geometry (NULL without a CONV) */
    const kiln_pool_params *pool; /* POOL_GRAD's geometry (NULL without a POOL_GRAD) */
    const kiln_tdesc *pool_grad_x; /* POOL_GRAD's gradient: its shape [N, C, S...] only (the
                                      outputs say where values are stored) */
};

/** A text naming the program's shape for a code cache (see the file comment) into buf
 *  (truncated to len); returns buf. */
char *kiln__fused_key(const kiln_fused_program *p, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* KILN_FUSED_PROGRAM_H */
