/*
 * backends/cpu/cpu-fused-jit.h — fused programs compiled at run time by the system's C
 * compiler: flat elementwise ones into one vector loop (cpu-fused-jit.c), those that take
 * their rows whole into a loop over rows (cpu-fused-jit-rows.c).
 */
#ifndef KILN_CPU_FUSED_JIT_H
#define KILN_CPU_FUSED_JIT_H

#include <stddef.h>
#include <stdint.h>

/** A header the compiled loops #include, embedded at build time (backends/embed-text.py). */
typedef struct kiln__cpu_jit_header {
    const char *name;
    const char *text;
    size_t len;
} kiln__cpu_jit_header;

/** The embedded headers, ended by an entry with a NULL name. */
extern const kiln__cpu_jit_header kiln__cpu_jit_headers[];

/** One compiled loop: elements [0, n) of every input (in[k]: contiguous, or one value
 *  when the program reads it as a scalar) through the program into out[k] (contiguous);
 *  k[2i], k[2i+1]: instruction i's constant or alpha, and beta. stream: write the
 *  outputs with non-temporal stores (every out[k] 64-byte aligned). A program that takes
 *  its rows whole runs n / row rows: a REDUCE's out[k] is one float per row, a layer
 *  norm's weight or bias row in[k] the same for every row, and fn holds the kernel
 *  table's softmax_row_f32 and layer_norm_row_f32. */
typedef void (*kiln__cpu_jit_loop)(int64_t n, const float *const *in, float *const *out, const float *k,
                                   int stream, void (*const *fn)(void));

/** Programs over fewer elements run in the block interpreter: compiling costs a tenth
 *  of a second once per program (once per machine: the cache directory keeps it), and a
 *  small program's blocks already sit in the caches. 2^20 until the epilogues of a
 *  Transformer block's 2 MiB products (a bias, a dropout's mask) showed the interpreter's
 *  passes: its training step fused went from 1.258 to 1.268 times the unfused one. */
#define KILN_CPU_JIT_MIN_ELEMENTS ((int64_t)1 << 18)

/** A program that takes its rows whole (cpu-fused-jit-rows.c) is compiled from this many
 *  elements on: the interpreter makes a pass over the block per instruction and
 *  broadcasts each row's sum over a block-long register, costs the caches do not hide. */
#define KILN_CPU_JIT_MIN_ROW_ELEMENTS ((int64_t)1 << 16)

#endif /* KILN_CPU_FUSED_JIT_H */
