/*
 * backends/fused/fused-codegen.h — the part of a GPU backend's fused_run that CUDA C and
 * GLSL share: checking that a kiln_fused_program (backends/fused-program.h) can be
 * generated, naming its kernel by a hash of its shape-independent key, and writing the
 * kernel's body.
 *
 * The two languages are close enough that one emitter writes the body for both: the body
 * is C-like statements over `float` registers, loops, ternaries and calls. Everything a
 * language spells its own way is a name the body uses and the language's prelude
 * defines (backends/cuda/cuda-fused.c, backends/vulkan/vk-fused.c):
 *
 *   KF_IDX                   the index type (64-bit in CUDA, 32-bit in GLSL)
 *   KF_ACC                   the accumulator type of softmax and reductions (double)
 *   KF_N, KF_INNER           the program's element count and row length (run-time values)
 *   KF_GID, KF_GSTRIDE       this thread's first element and the grid's stride
 *   KF_GROUP, KF_NGROUPS     this group (block / workgroup) and the group count
 *   KF_LID, KF_LSIZE         the thread within its group and the group's size
 *   KF_K(j)                  float parameter j: alpha of instruction i at 2i, beta at 2i+1
 *   KF_LD<k>(idx), KF_ST<k>(idx, v)   load input k / store output k at element idx (a
 *                            bool input loads 1 or 0, a bool output stores v != 0)
 *   kf_gather_off_<k>(i)     where element i of the strided input k lives
 *   ku_<op>(x, A, B), kb_<op>(a, b)   the ops, after the unfused kernels' formulas
 *   kf_acc(x), kf_acc_n(idx), kf_acc_exp, kf_acc_log, kf_group_max, kf_group_sum,
 *   KF_NEG_INF               row statistics in KF_ACC
 *   KF_FN, KF_PDECL, KF_PARG, KF_NDIM(k), KF_SHAPE(k, d), KF_STRIDE(k, d)   helper functions
 *                            (their qualifier and how they receive the parameters) and the
 *                            views of strided inputs
 *   KF_KERNEL_BEGIN, KF_KERNEL_END   the kernel function around the body
 *
 * Rows. A program with a softmax or a reduction runs one group per row (reduce_inner
 * elements): for each softmax the group first evaluates the instructions feeding it to
 * find the row's maximum, again for the sum of exponentials, then evaluates the whole
 * program and stores; the values before a softmax are recomputed rather than kept, so
 * rows of any length fit without shared memory. A reduction's accumulator is summed
 * over the group and written by its thread 0.
 */
#ifndef KILN_FUSED_CODEGEN_H
#define KILN_FUSED_CODEGEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fused-program.h"

/** A growing string; ok turns false on the first allocation failure. */
typedef struct kiln__sbuf {
    char *p;
    size_t len, cap;
    bool ok;
} kiln__sbuf;

/** Appends printf-formatted text (sets b->ok false when memory runs out). */
void kiln__sbuf_printf(kiln__sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/** How a generated kernel reads an input (part of the cache key). */
typedef enum kiln__fused_layout {
    KILN__FUSED_CONTIG = 0, /* element i at offset i */
    KILN__FUSED_SCALAR,     /* one element for every i */
    KILN__FUSED_GATHER      /* element i through its shape and strides */
} kiln__fused_layout;

kiln__fused_layout kiln__fused_layout_of(const kiln_tdesc *d);
/** Whether d's elements lie at offsets 0, 1, 2, ... in row-major order (size-1 dims aside). */
bool kiln__fused_contiguous(const kiln_tdesc *d);

/** Rows longer than this, fewer than KILN__FUSED_FEW_ROWS of them: left unfused. */
#define KILN__FUSED_LONG_ROW 4096
#define KILN__FUSED_FEW_ROWS 256

/** 0 when the program can be generated; KILN_ENOTSUP (no message) for what the generator
 *  does not write (a dtype other than f32 registers, a bool-valued unary, a logical op,
 *  an index or offset that does not fit max_index, a malformed program) or should not
 *  (fewer than KILN__FUSED_FEW_ROWS rows of more than KILN__FUSED_LONG_ROW elements: one
 *  group per row would leave most of the GPU idle). */
int kiln__fused_codegen_check(const kiln_fused_program *p, int64_t max_index);

/** The program's cache key: kiln__fused_key plus what it leaves out that the generated
 *  code depends on (output dtypes, whether there are rows), into buf; returns buf. */
char *kiln__fused_codegen_key(const kiln_fused_program *p, char *buf, size_t len);

/** A 64-bit FNV-1a hash of text (the kernel's name, "kf_<16 hex digits>"). */
uint64_t kiln__fused_hash(const char *text);

/** The directory where generated kernels are kept between runs, the one the Vulkan
 *  pipeline cache uses: $KILN_DATA_DIR/cache, else $XDG_CACHE_HOME/kiln, else
 *  $HOME/.cache/kiln, into dir; made (with its parents) when create is set. false when
 *  none is known or it cannot be made. */
bool kiln__fused_cache_dir(char *dir, size_t len, bool create);

/** Writes the kernel's body (see the file comment) into b. The program must have passed
 *  kiln__fused_codegen_check. */
void kiln__fused_emit_body(kiln__sbuf *b, const kiln_fused_program *p);

/** The unary op's function name in the preludes ("ku_tanh"), NULL where not generated. */
const char *kiln__fused_unary_name(int op);

#endif /* KILN_FUSED_CODEGEN_H */
