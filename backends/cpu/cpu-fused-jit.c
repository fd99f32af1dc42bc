/*
 * backends/cpu/cpu-fused-jit.c — a flat elementwise fused program compiled at run time
 * into one vector loop by the system's C compiler, where the block interpreter
 * (cpu-fused.c) would run it instruction by instruction.
 *
 * Why: the interpreter runs each instruction over a block in L1, one pass per
 * instruction, so a chain pays those passes on top of the memory stream it overlaps;
 * one loop keeps every intermediate in registers. Measured on gelu(x·a+b)·c with a, b,
 * c per column over 64 MiB, one thread, CPU time, in the same process: see
 * docs/architecture.md ("The cpu's compiled loops").
 *
 * What: programs of loads (contiguous, row-broadcast or scalar f32 inputs), constants,
 * the unary ops that have a vector form in the kernel tables (exp, tanh, sigmoid, erf,
 * gelu, gelu_tanh, silu) or an exact one (neg, abs, relu, leaky_relu, sign, square, sqrt,
 * rsqrt, reciprocal, floor, ceil, round, clamp, add/mul by a scalar, pow by 2, 1, 0.5 or
 * -0.5), add, sub, mul, div, maximum and minimum, the six comparisons (1 or 0) and a
 * where on them, and stores into contiguous f32 outputs, over at least
 * KILN_CPU_JIT_MIN_ELEMENTS elements, on the avx2 and avx512 kernel tables; the epilogue
 * of a product, a convolution or a max pooling's gradient too; and, through
 * cpu-fused-jit-rows.c, programs that take their rows whole. The loop
 * #includes the kernel tables' own math headers (embedded at build time) and is
 * compiled with the flags of that table and without contraction of multiply-adds, so its
 * results equal the interpreter's and the unfused kernels' to the bit (the fusion tests
 * compare them element by element).
 *
 * How: the source is written into the cache directory (kiln__fused_cache_dir, "cpu-jit/")
 * beside the headers, compiled with $KILN_CPU_JIT_CC (default "cc") into a shared object
 * under a temporary name and renamed into place, then dlopened. The file name is a hash
 * of the source, the headers, the compiler and its flags, so a later process (a kilnd
 * restart) loads it without compiling, and a changed header never meets a stale loop.
 * Anything that fails (no compiler, a compile error, an unreadable cache) leaves the
 * program to the interpreter, never an error; a failed key is not tried again in the
 * process (stderr says so once). The device option jit=off (KILN_CPU_JIT=off) turns
 * compiling off.
 *
 * The cache stays bounded (a long-running kilnd meets new programs with every new model):
 * a library loaded from it has its access time set (explicitly: noatime and relatime
 * mounts do not keep one), and after each compile the directory keeps the
 * $KILN_CPU_JIT_KEEP (default 512) most recently used libraries, with their sources;
 * header folders of other kiln builds and temporary files older than a day go as well.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cpu-fused-impl.h"
#include "cpu-fused-jit.h"
#include "error-impl.h"
#include "fused/fused-codegen.h"
#include "kiln_build_config.h"

extern char **environ;

/* ------------------------------------------------------------------ source */

/* What differs between the two tables: the vector type, loads, stores, arithmetic and
 * the names of the math functions (cpu-math512.h: kz_*, cpu-math.h: kv_*). */
static const char prelude_avx512[] =
    "#include <math.h>\n#include <stdint.h>\n#include \"cpu-math512.h\"\n"
    "#define KJ_W 16\n"
    "typedef __m512 kj_v;\n"
    "#define KJ_LD(p) _mm512_loadu_ps(p)\n"
    "#define KJ_ST(p, v) _mm512_storeu_ps((p), (v))\n"
    "#define KJ_NT(p, v) _mm512_stream_ps((p), (v))\n"
    "#define KJ_SET(x) _mm512_set1_ps(x)\n"
    "#define KJ_ADD _mm512_add_ps\n#define KJ_SUB _mm512_sub_ps\n"
    "#define KJ_MUL _mm512_mul_ps\n#define KJ_DIV _mm512_div_ps\n"
    "#define KJ_NEG(v) _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), "
    "_mm512_set1_epi32((int)0x80000000u)))\n"
    "#define KJ_ABS(v) kz_abs(v)\n"
    "#define KJ_RELU(v) _mm512_mask_blend_ps(_mm512_cmp_ps_mask((v), _mm512_setzero_ps(), _CMP_LT_OQ), (v), "
    "_mm512_setzero_ps())\n"
    "#define KJ_EXP kz_exp\n#define KJ_TANH kz_tanh\n#define KJ_SIGMOID kz_sigmoid\n#define KJ_ERF kz_erf\n"
    "#define KJ_GELU kz_gelu\n#define KJ_GELU_TANH kz_gelu_tanh\n#define KJ_SILU kz_silu\n"
    "#define KJ_FENCE() _mm_sfence()\n"
    "#define KJ_GT(a, b) _mm512_cmp_ps_mask((a), (b), _CMP_GT_OQ)\n"
    "#define KJ_LT(a, b) _mm512_cmp_ps_mask((a), (b), _CMP_LT_OQ)\n"
    "#define KJ_UNORD(a, b) _mm512_cmp_ps_mask((a), (b), _CMP_UNORD_Q)\n"
    "#define KJ_PICK(m, a, b) _mm512_mask_blend_ps((m), (a), (b))\n"
    "#define KJ_CMP(a, b, pred) _mm512_cmp_ps_mask((a), (b), (pred))\n"
    "#define KJ_SQRT _mm512_sqrt_ps\n"
    "#define KJ_ROUND(v, mode) _mm512_roundscale_ps((v), (mode) | _MM_FROUND_NO_EXC)\n"
    /* 1 / sqrt in double, rounded once to f32, as the unfused kernel computes it */
    "static inline kj_v kj_rsqrt(kj_v v)\n{\n"
    "    __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v)), hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, "
    "1));\n"
    "    lo = _mm512_div_pd(_mm512_set1_pd(1.0), _mm512_sqrt_pd(lo));\n"
    "    hi = _mm512_div_pd(_mm512_set1_pd(1.0), _mm512_sqrt_pd(hi));\n"
    "    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(lo)), _mm512_cvtpd_ps(hi), 1);\n}\n"
    /* a row's sum as sum_run_f32 makes it (lane q adds elements q, q + 8, ... in double) */
    "typedef __m512d kj_sum;\n"
    "static inline kj_sum kj_sum_zero(void) { return _mm512_setzero_pd(); }\n"
    "static inline kj_sum kj_sum_add(kj_sum l, kj_v v)\n{\n"
    "    l = _mm512_add_pd(l, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));\n"
    "    return _mm512_add_pd(l, _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)));\n}\n"
    "static inline void kj_sum_lanes(kj_sum l, double *t) { _mm512_storeu_pd(t, l); }\n";

static const char prelude_avx2[] =
    "#include <math.h>\n#include <stdint.h>\n#include \"cpu-math.h\"\n"
    "#define KJ_W 8\n"
    "typedef __m256 kj_v;\n"
    "#define KJ_LD(p) _mm256_loadu_ps(p)\n"
    "#define KJ_ST(p, v) _mm256_storeu_ps((p), (v))\n"
    "#define KJ_NT(p, v) _mm256_stream_ps((p), (v))\n"
    "#define KJ_SET(x) _mm256_set1_ps(x)\n"
    "#define KJ_ADD _mm256_add_ps\n#define KJ_SUB _mm256_sub_ps\n"
    "#define KJ_MUL _mm256_mul_ps\n#define KJ_DIV _mm256_div_ps\n"
    "#define KJ_NEG(v) _mm256_xor_ps((v), _mm256_set1_ps(-0.0f))\n"
    "#define KJ_ABS(v) _mm256_andnot_ps(_mm256_set1_ps(-0.0f), (v))\n"
    "#define KJ_RELU(v) _mm256_blendv_ps((v), _mm256_setzero_ps(), _mm256_cmp_ps((v), _mm256_setzero_ps(), "
    "_CMP_LT_OQ))\n"
    "#define KJ_EXP kv_exp\n#define KJ_TANH kv_tanh\n#define KJ_SIGMOID kv_sigmoid\n#define KJ_ERF kv_erf\n"
    "#define KJ_GELU kv_gelu\n#define KJ_GELU_TANH kv_gelu_tanh\n#define KJ_SILU(v) _mm256_mul_ps((v), "
    "kv_sigmoid(v))\n"
    "#define KJ_FENCE() _mm_sfence()\n"
    "#define KJ_GT(a, b) _mm256_cmp_ps((a), (b), _CMP_GT_OQ)\n"
    "#define KJ_LT(a, b) _mm256_cmp_ps((a), (b), _CMP_LT_OQ)\n"
    "#define KJ_UNORD(a, b) _mm256_cmp_ps((a), (b), _CMP_UNORD_Q)\n"
    "#define KJ_PICK(m, a, b) _mm256_blendv_ps((a), (b), (m))\n"
    "#define KJ_CMP(a, b, pred) _mm256_cmp_ps((a), (b), (pred))\n"
    "#define KJ_SQRT _mm256_sqrt_ps\n"
    "#define KJ_ROUND(v, mode) _mm256_round_ps((v), (mode) | _MM_FROUND_NO_EXC)\n"
    "static inline kj_v kj_rsqrt(kj_v v)\n{\n"
    "    __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, "
    "1));\n"
    "    lo = _mm256_div_pd(_mm256_set1_pd(1.0), _mm256_sqrt_pd(lo));\n"
    "    hi = _mm256_div_pd(_mm256_set1_pd(1.0), _mm256_sqrt_pd(hi));\n"
    "    return _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo));\n}\n"
    "typedef struct { __m256d lo, hi; } kj_sum;\n"
    "static inline kj_sum kj_sum_zero(void) { kj_sum l = {_mm256_setzero_pd(), _mm256_setzero_pd()}; return l; }\n"
    "static inline kj_sum kj_sum_add(kj_sum l, kj_v v)\n{\n"
    "    l.lo = _mm256_add_pd(l.lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));\n"
    "    l.hi = _mm256_add_pd(l.hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));\n    return l;\n}\n"
    "static inline void kj_sum_lanes(kj_sum l, double *t) { _mm256_storeu_pd(t, l.lo); _mm256_storeu_pd(t + 4, "
    "l.hi); "
    "}\n";

/* Written after either prelude: the ops built from its primitives, each the unfused
 * kernel's scalar expression lane by lane (KJ_PICK(m, a, b): m ? b : a; comparisons with
 * NaN are false, as in C). */
static const char common_ops[] =
    /* the eight lanes combined as sum_run_f32 combines them */
    "static inline double kj_sum_total(kj_sum l)\n{\n    double t[8];\n    kj_sum_lanes(l, t);\n"
    "    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));\n}\n"
    /* of equal operands the first, as the unfused kernels: maximum(+0, -0) is +0 */
    "static inline kj_v kj_maximum(kj_v x, kj_v y)\n"
    "{ return KJ_PICK(KJ_UNORD(x, y), KJ_PICK(KJ_LT(x, y), x, y), KJ_ADD(x, y)); }\n"
    "static inline kj_v kj_minimum(kj_v x, kj_v y)\n"
    "{ return KJ_PICK(KJ_UNORD(x, y), KJ_PICK(KJ_LT(y, x), x, y), KJ_ADD(x, y)); }\n"
    "static inline kj_v kj_leaky_relu(kj_v v, kj_v a)\n"
    "{ return KJ_PICK(KJ_LT(v, KJ_SET(0.0f)), v, KJ_MUL(v, a)); }\n"
    "static inline kj_v kj_sign(kj_v v)\n"
    "{ return KJ_PICK(KJ_GT(v, KJ_SET(0.0f)), KJ_PICK(KJ_LT(v, KJ_SET(0.0f)), KJ_SET(0.0f), KJ_SET(-1.0f)), "
    "KJ_SET(1.0f)); }\n"
    /* below lo: lo, or hi when the bounds cross; above hi: hi; NaN stays */
    "static inline kj_v kj_clamp(kj_v v, float lo, float hi)\n"
    "{ return KJ_PICK(KJ_LT(v, KJ_SET(lo)), KJ_PICK(KJ_GT(v, KJ_SET(hi)), v, KJ_SET(hi)), KJ_SET(lo > hi ? hi : "
    "lo)); }\n";

/* The flags of each table's build of cpu-kernels.c (backends/cpu/meson.build), and no
 * contraction of a multiply and an add into one rounding the unfused kernels lack. */
static const char *const flags_avx512[] = {"-mavx2",     "-mfma",      "-mf16c",     "-mavx512f",
                                           "-mavx512dq", "-mavx512bw", "-mavx512vl", NULL};
static const char *const flags_avx2[] = {"-mavx2", "-mfma", "-mf16c", NULL};

/* The vector expression of unary op on register a into b (instruction i's alpha and
 * beta are k[2i] and k[2i + 1], their vectors k<2i> and k<2i+1>); false when the op has
 * none here. pow by a scalar takes the unfused kernel's special cases only. */
bool kiln__cpu_jit_emit_unary(kiln__sbuf *b, int op, int i, int a, double alpha)
{
    char arg[32];
    snprintf(arg, sizeof arg, "r%d", a);
    switch (op) {
    case KILN_UNARY_SQRT: kiln__sbuf_printf(b, "KJ_SQRT(%s)", arg); return true;
    case KILN_UNARY_RSQRT: kiln__sbuf_printf(b, "kj_rsqrt(%s)", arg); return true;
    case KILN_UNARY_RECIPROCAL: kiln__sbuf_printf(b, "KJ_DIV(KJ_SET(1.0f), %s)", arg); return true;
    case KILN_UNARY_SIGN: kiln__sbuf_printf(b, "kj_sign(%s)", arg); return true;
    case KILN_UNARY_FLOOR: kiln__sbuf_printf(b, "KJ_ROUND(%s, _MM_FROUND_TO_NEG_INF)", arg); return true;
    case KILN_UNARY_CEIL: kiln__sbuf_printf(b, "KJ_ROUND(%s, _MM_FROUND_TO_POS_INF)", arg); return true;
    case KILN_UNARY_ROUND: kiln__sbuf_printf(b, "KJ_ROUND(%s, _MM_FROUND_TO_NEAREST_INT)", arg); return true;
    case KILN_UNARY_LEAKY_RELU: kiln__sbuf_printf(b, "kj_leaky_relu(%s, k%d)", arg, 2 * i); return true;
    case KILN_UNARY_CLAMP: kiln__sbuf_printf(b, "kj_clamp(%s, k[%d], k[%d])", arg, 2 * i, 2 * i + 1); return true;
    case KILN_UNARY_POW_SCALAR:
        if ((float)alpha == 2.0f)
            kiln__sbuf_printf(b, "KJ_MUL(%s, %s)", arg, arg);
        else if ((float)alpha == 1.0f)
            kiln__sbuf_printf(b, "%s", arg);
        else if ((float)alpha == 0.5f)
            kiln__sbuf_printf(b, "KJ_SQRT(%s)", arg);
        else if ((float)alpha == -0.5f)
            kiln__sbuf_printf(b, "kj_rsqrt(%s)", arg);
        else
            return false; /* powf itself */
        return true;
    case KILN_UNARY_NEG: kiln__sbuf_printf(b, "KJ_NEG(%s)", arg); return true;
    case KILN_UNARY_ABS: kiln__sbuf_printf(b, "KJ_ABS(%s)", arg); return true;
    case KILN_UNARY_RELU: kiln__sbuf_printf(b, "KJ_RELU(%s)", arg); return true;
    case KILN_UNARY_SQUARE: kiln__sbuf_printf(b, "KJ_MUL(%s, %s)", arg, arg); return true;
    case KILN_UNARY_ADD_SCALAR: kiln__sbuf_printf(b, "KJ_ADD(%s, k%d)", arg, 2 * i); return true;
    case KILN_UNARY_MUL_SCALAR: kiln__sbuf_printf(b, "KJ_MUL(%s, k%d)", arg, 2 * i); return true;
    case KILN_UNARY_EXP: kiln__sbuf_printf(b, "KJ_EXP(%s)", arg); return true;
    case KILN_UNARY_TANH: kiln__sbuf_printf(b, "KJ_TANH(%s)", arg); return true;
    case KILN_UNARY_SIGMOID: kiln__sbuf_printf(b, "KJ_SIGMOID(%s)", arg); return true;
    case KILN_UNARY_ERF: kiln__sbuf_printf(b, "KJ_ERF(%s)", arg); return true;
    case KILN_UNARY_GELU: kiln__sbuf_printf(b, "KJ_GELU(%s)", arg); return true;
    case KILN_UNARY_GELU_TANH: kiln__sbuf_printf(b, "KJ_GELU_TANH(%s)", arg); return true;
    case KILN_UNARY_SILU: kiln__sbuf_printf(b, "KJ_SILU(%s)", arg); return true;
    default: return false;
    }
}

bool kiln__cpu_jit_unary_uses_alpha(int op)
{
    return op == KILN_UNARY_ADD_SCALAR || op == KILN_UNARY_MUL_SCALAR || op == KILN_UNARY_LEAKY_RELU;
}

bool kiln__cpu_jit_emit_value(kiln__sbuf *b, const kiln_fused_instr *in, int i)
{
    static const char *const arithmetic[] = {"KJ_ADD", "KJ_SUB", "KJ_MUL",     "KJ_DIV",
                                             NULL,     NULL,     "kj_maximum", "kj_minimum"};
    /* as C compares: false with a NaN, but != true */
    static const char *const predicate[] = {"_CMP_EQ_OQ", "_CMP_NEQ_UQ", "_CMP_LT_OQ",
                                            "_CMP_LE_OQ", "_CMP_GT_OQ",  "_CMP_GE_OQ"};
    switch (in->code) {
    case KILN_FUSED_UNARY: return kiln__cpu_jit_emit_unary(b, in->op, i, in->a, in->alpha);
    case KILN_FUSED_BINARY:
        if (in->op >= KILN_BINARY_ADD && in->op <= KILN_BINARY_MINIMUM && arithmetic[in->op]) {
            kiln__sbuf_printf(b, "%s(r%d, r%d)", arithmetic[in->op], in->a, in->b);
            return true;
        }
        if (in->op >= KILN_BINARY_EQ && in->op <= KILN_BINARY_GE) { /* 1 or 0, as compare_f32 */
            kiln__sbuf_printf(b, "KJ_PICK(KJ_CMP(r%d, r%d, %s), KJ_SET(0.0f), KJ_SET(1.0f))", in->a, in->b,
                              predicate[in->op - KILN_BINARY_EQ]);
            return true;
        }
        return false;
    case KILN_FUSED_WHERE: /* a where the condition is not 0 (NaN is not), else b: where_f32 */
        kiln__sbuf_printf(b, "KJ_PICK(KJ_CMP(r%d, KJ_SET(0.0f), _CMP_NEQ_UQ), r%d, r%d)", in->a, in->c, in->b);
        return true;
    default: return false;
    }
}

void kiln__cpu_jit_emit_assign(kiln__sbuf *b, const kiln_fused_instr *in, int i, const char *indent)
{
    kiln__sbuf_printf(b, "%skj_v r%d = ", indent, in->dst);
    (void)kiln__cpu_jit_emit_value(b, in, i);
    kiln__sbuf_printf(b, ";\n");
}

/* Whether the planned program is one the loop form covers. */
static bool compilable(const fplan *pl)
{
    const kiln_fused_program *p = pl->p;
    if (p->dtype != KILN_F32 || pl->half)
        return false;
    if (strcmp(pl->k->name, "avx512") != 0 && strcmp(pl->k->name, "avx2") != 0)
        return false;
    if (pl->whole_rows)
        return p->n >= KILN_CPU_JIT_MIN_ROW_ELEMENTS && kiln__cpu_jit_rows_compilable(pl);
    if (pl->has_reduce || p->n < KILN_CPU_JIT_MIN_ELEMENTS)
        return false;
    for (int k = 0; k < p->ninputs; k++) {
        const fin *f = &pl->in[k];
        if (f->kind == IN_OPERAND) /* a product's operand: the product's values come in their own slot */
            continue;
        if (f->dtype != KILN_F32 || f->is_bool || f->copy_in ||
            (f->kind != IN_CONTIG && f->kind != IN_SCALAR && f->kind != IN_ROWS))
            return false;
    }
    for (int k = 0; k < p->noutputs; k++)
        if (!pl->out[k])
            return false;
    kiln__sbuf scratch = {0};
    bool ok = true;
    for (int i = 0; i < p->ninstrs && ok; i++) {
        const kiln_fused_instr *in = &p->instrs[i];
        switch (in->code) {
        case KILN_FUSED_LOAD:
        case KILN_FUSED_CONST:
        case KILN_FUSED_STORE: break;
        case KILN_FUSED_MATMUL:
        case KILN_FUSED_CONV:
        case KILN_FUSED_POOL_GRAD: ok = i == 0 && pl->product; break;
        case KILN_FUSED_UNARY:
        case KILN_FUSED_BINARY:
        case KILN_FUSED_WHERE: ok = kiln__cpu_jit_emit_value(&scratch, in, i); break;
        default: ok = false;
        }
    }
    free(scratch.p);
    return ok;
}

/* The body of one step: every instruction on one vector at offset i (LD and ST name the
 * load and store to use). */
static void emit_step(kiln__sbuf *b, const kiln_fused_program *p, const fplan *pl, const char *ld, const char *st)
{
    for (int i = 0; i < p->ninstrs; i++) {
        const kiln_fused_instr *in = &p->instrs[i];
        switch (in->code) {
        case KILN_FUSED_LOAD:
            if (pl->in[in->arg].kind == IN_SCALAR)
                kiln__sbuf_printf(b, "        kj_v r%d = s%d;\n", in->dst, in->arg);
            else
                kiln__sbuf_printf(b, "        kj_v r%d = %s(in%d + i);\n", in->dst, ld, in->arg);
            break;
        case KILN_FUSED_CONST: kiln__sbuf_printf(b, "        kj_v r%d = k%d;\n", in->dst, 2 * i); break;
        case KILN_FUSED_MATMUL:
        case KILN_FUSED_CONV:
        case KILN_FUSED_POOL_GRAD: kiln__sbuf_printf(b, "        kj_v r%d = %s(prod + i);\n", in->dst, ld); break;
        case KILN_FUSED_UNARY:
        case KILN_FUSED_BINARY:
        case KILN_FUSED_WHERE: kiln__cpu_jit_emit_assign(b, in, i, "        "); break;
        default: /* STORE; a product kept is computed straight into its output already */
            if (!(pl->product && in->a == p->instrs[0].dst && in->arg == pl->product_out))
                kiln__sbuf_printf(b, "        %s(out%d + i, r%d);\n", st, in->arg, in->a);
            break;
        }
    }
}

/* The loop's source for planned program pl (compilable). */
static char *loop_source(const fplan *pl, bool avx512)
{
    const kiln_fused_program *p = pl->p;
    kiln__sbuf b = {.ok = true};
    kiln__sbuf_printf(&b, "/* generated by kiln's cpu backend for a fused program: do not edit */\n%s%s",
                      avx512 ? prelude_avx512 : prelude_avx2, common_ops);
    if (pl->whole_rows) {
        if (!kiln__cpu_jit_rows_source(&b, pl) || !b.ok) {
            free(b.p);
            return NULL;
        }
        return b.p;
    }
    kiln__sbuf_printf(&b, "void kiln_fused_loop(int64_t n, const float *const *in, float *const *out, "
                          "const float *k, int stream, void (*const *fn)(void))\n{\n"
                          "    (void)in; (void)out; (void)k; (void)fn;\n");
    for (int a = 0; a < p->ninputs; a++) {
        if (pl->in[a].kind == IN_SCALAR)
            kiln__sbuf_printf(&b, "    const kj_v s%d = KJ_SET(in[%d][0]);\n", a, a);
        else if (pl->in[a].kind != IN_OPERAND)
            kiln__sbuf_printf(&b, "    const float *in%d = in[%d];\n", a, a);
    }
    if (pl->product) /* the producer's values, in the slot after the inputs */
        kiln__sbuf_printf(&b, "    const float *prod = in[%d];\n", p->ninputs);
    for (int o = 0; o < p->noutputs; o++)
        kiln__sbuf_printf(&b, "    float *out%d = out[%d];\n", o, o);
    for (int i = 0; i < p->ninstrs; i++) {
        const kiln_fused_instr *in = &p->instrs[i];
        if (in->code == KILN_FUSED_CONST ||
            (in->code == KILN_FUSED_UNARY && kiln__cpu_jit_unary_uses_alpha(in->op)))
            kiln__sbuf_printf(&b, "    const kj_v k%d = KJ_SET(k[%d]);\n", 2 * i, 2 * i);
    }
    /* streamed: each contiguous input asked for 4 KiB ahead, where the hardware
     * prefetchers alone left the loop waiting on memory (measured: 8.7 ms without, 5.3
     * with, on the chain of the file comment) */
    kiln__sbuf_printf(&b, "    int64_t i = 0;\n    if (stream) {\n"
                          "        for (; i + KJ_W <= n; i += KJ_W) {\n");
    for (int a = 0; a < p->ninputs; a++)
        if (pl->in[a].kind == IN_CONTIG)
            kiln__sbuf_printf(&b, "        __builtin_prefetch(in%d + i + 1024, 0, 3);\n", a);
    if (pl->product)
        kiln__sbuf_printf(&b, "        __builtin_prefetch(prod + i + 1024, 0, 3);\n");
    emit_step(&b, p, pl, "KJ_LD", "KJ_NT");
    kiln__sbuf_printf(&b, "        }\n        KJ_FENCE();\n    }\n    for (; i + KJ_W <= n; i += KJ_W) {\n");
    emit_step(&b, p, pl, "KJ_LD", "KJ_ST");
    /* the tail through zero-padded copies: every function is per lane, so the padding
     * lanes change nothing in the others (as the kernels' own tails) */
    kiln__sbuf_printf(&b, "    }\n    if (i < n) {\n        int64_t m = n - i;\n");
    for (int a = 0; a < p->ninputs; a++)
        if (pl->in[a].kind != IN_SCALAR && pl->in[a].kind != IN_OPERAND)
            kiln__sbuf_printf(&b,
                              "        float t%d[KJ_W] = {0};\n"
                              "        for (int64_t j = 0; j < m; j++)\n            t%d[j] = in%d[i + j];\n",
                              a, a, a);
    if (pl->product)
        kiln__sbuf_printf(&b, "        float tp[KJ_W] = {0};\n"
                              "        for (int64_t j = 0; j < m; j++)\n            tp[j] = prod[i + j];\n");
    for (int o = 0; o < p->noutputs; o++)
        kiln__sbuf_printf(&b, "        float u%d[KJ_W];\n", o);
    /* the step reads in<a> + i and writes out<o> + i: point them at the copies */
    kiln__sbuf_printf(&b, "        int64_t base = i;\n        i = 0;\n");
    for (int a = 0; a < p->ninputs; a++)
        if (pl->in[a].kind != IN_SCALAR && pl->in[a].kind != IN_OPERAND)
            kiln__sbuf_printf(&b, "        in%d = t%d;\n", a, a);
    if (pl->product)
        kiln__sbuf_printf(&b, "        prod = tp;\n");
    for (int o = 0; o < p->noutputs; o++)
        kiln__sbuf_printf(&b, "        float *o%d = out%d;\n        out%d = u%d;\n", o, o, o, o);
    kiln__sbuf_printf(&b, "        {\n");
    emit_step(&b, p, pl, "KJ_LD", "KJ_ST");
    kiln__sbuf_printf(&b, "        }\n");
    for (int o = 0; o < p->noutputs; o++)
        kiln__sbuf_printf(&b, "        for (int64_t j = 0; j < m; j++)\n            o%d[base + j] = u%d[j];\n", o,
                          o);
    kiln__sbuf_printf(&b, "    }\n}\n");
    if (!b.ok) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

/* ------------------------------------------------------------------ compiled loops */

typedef struct compiled {
    char *source; /* the key: the whole generated text */
    kiln__cpu_jit_loop fn;
    struct compiled *next;
} compiled;

/* Compiled loops and failed sources of this process, for every cpu device: written under
 * the lock, each entry kept (with its library) until the process ends. */
static pthread_mutex_t jit_lock = PTHREAD_MUTEX_INITIALIZER;
static compiled *jit_cache;
static bool jit_unavailable; /* the compiler could not be started: stop trying */
static bool jit_failed_once; /* a compile failed: said once on stderr */

/* Write text into path unless it already holds exactly that (a temporary name, then a
 * rename, so a reader never sees half a file). */
static bool write_file(const char *path, const char *text, size_t len)
{
    FILE *f = fopen(path, "rb");
    if (f) {
        bool same = true;
        for (size_t i = 0; i < len && same; i++)
            same = fgetc(f) == (unsigned char)text[i];
        same = same && fgetc(f) == EOF;
        fclose(f);
        if (same)
            return true;
    }
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid()) >= (int)sizeof tmp)
        return false;
    f = fopen(tmp, "wb");
    if (!f)
        return false;
    bool ok = fwrite(text, 1, len, f) == len;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return false;
    }
    return true;
}

/* Run the compiler: 0 when it exited 0, -1 otherwise (unavailable set when it could not
 * start at all). Its messages go to log. */
static int run_compiler(const char *cc, const char *const *flags, const char *inc, const char *src,
                        const char *lib, const char *log, bool *unavailable)
{
    const char *argv[32];
    int n = 0;
    char incflag[4300];
    snprintf(incflag, sizeof incflag, "-I%s", inc);
    const char *fixed[] = {cc,      "-std=c17", "-O2", "-fno-math-errno", "-ffp-contract=off",
                           "-fPIC", "-shared",  "-w",  incflag,           "-o",
                           lib,     src};
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed - 3; i++)
        argv[n++] = fixed[i];
    for (int i = 0; flags[i]; i++)
        argv[n++] = flags[i];
    argv[n++] = "-o";
    argv[n++] = lib;
    argv[n++] = src;
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    int rc = posix_spawnp(&pid, cc, &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        *unavailable = true;
        return -1;
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
        *unavailable = true; /* the shell's "not found" */
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* ------------------------------------------------------------ the cache's size */

#define KEEP_DEFAULT 512
#define STALE_SECONDS (24 * 3600)

/* KILN_CPU_JIT_KEEP, or the default (saying so once on stderr when the value is not a
 * positive whole number). Called under jit_lock. */
static long keep_limit(void)
{
    static bool warned;
    const char *v = getenv("KILN_CPU_JIT_KEEP");
    if (!v || !*v)
        return KEEP_DEFAULT;
    char *end = NULL;
    long n = strtol(v, &end, 10);
    if (*end || n < 1) {
        if (!warned)
            kiln__warn("cpu: KILN_CPU_JIT_KEEP='%s' is not a positive whole number: keeping %d loops", v,
                       KEEP_DEFAULT);
        warned = true;
        return KEEP_DEFAULT;
    }
    return n;
}

/* Marks lib as used now: its access time, set explicitly, its change time left alone. */
static void mark_used(const char *lib)
{
    struct timespec t[2] = {{0, UTIME_NOW}, {0, UTIME_OMIT}};
    (void)utimensat(AT_FDCWD, lib, t, 0);
}

typedef struct cached_lib {
    char stem[64]; /* "kj-<hash>" */
    struct timespec used;
} cached_lib;

static int oldest_first(const void *a, const void *b)
{
    const struct timespec *x = &((const cached_lib *)a)->used, *y = &((const cached_lib *)b)->used;
    return x->tv_sec != y->tv_sec ? (x->tv_sec < y->tv_sec ? -1 : 1)
                                  : (x->tv_nsec < y->tv_nsec ? -1 : x->tv_nsec > y->tv_nsec);
}

/* Removes folder path and the files in it (header folders hold files only). */
static void remove_folder(const char *path)
{
    DIR *d = opendir(path);
    for (struct dirent *e = d ? readdir(d) : NULL; e; e = readdir(d)) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char f[4700];
        if (snprintf(f, sizeof f, "%s/%s", path, e->d_name) < (int)sizeof f)
            unlink(f);
    }
    if (d)
        closedir(d);
    rmdir(path);
}

/* Bounds the cache directory dir after a compile (see the file comment); inc is the header
 * folder this build uses. Failures are ignored: another process may be pruning too. */
static void prune_cache(const char *dir, const char *inc)
{
    long keep = keep_limit();
    DIR *d = opendir(dir);
    if (!d)
        return;
    cached_lib *libs = NULL;
    size_t n = 0, cap = 0;
    time_t now = time(NULL);
    const char *inc_name = strrchr(inc, '/') ? strrchr(inc, '/') + 1 : inc;
    for (struct dirent *e = readdir(d); e; e = readdir(d)) {
        const char *name = e->d_name;
        size_t len = strlen(name);
        char path[4400];
        struct stat st;
        if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path || stat(path, &st) != 0)
            continue;
        bool stale = now - st.st_mtime > STALE_SECONDS;
        if (!strncmp(name, "include-", 8) && strcmp(name, inc_name) != 0 && stale) {
            remove_folder(path);
        } else if (len > 4 && !strcmp(name + len - 4, ".tmp") && stale) {
            unlink(path);
        } else if (!strncmp(name, "kj-", 3) && len > 3 && len < 64 && !strcmp(name + len - 3, ".so")) {
            if (n == cap) {
                size_t grown_cap = cap ? cap * 2 : 64;
                cached_lib *grown = realloc(libs, grown_cap * sizeof *grown);
                if (!grown)
                    break;
                libs = grown;
                cap = grown_cap;
            }
            snprintf(libs[n].stem, sizeof libs[n].stem, "%.*s", (int)(len - 3), name);
            libs[n].used = st.st_atim;
            n++;
        }
    }
    closedir(d);
    if ((long)n > keep) {
        qsort(libs, n, sizeof *libs, oldest_first);
        for (size_t i = 0; i < n - (size_t)keep; i++) {
            static const char *const exts[] = {".so", ".c", ".log"};
            for (int k = 0; k < 3; k++) {
                char path[4400];
                if (snprintf(path, sizeof path, "%s/%s%s", dir, libs[i].stem, exts[k]) < (int)sizeof path)
                    unlink(path); /* a process that loaded it keeps its mapping */
            }
        }
    }
    free(libs);
}

static kiln__cpu_jit_loop load_loop(const char *lib)
{
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return NULL;
    kiln__cpu_jit_loop fn;
    *(void **)&fn = dlsym(h, "kiln_fused_loop");
    if (!fn)
        dlclose(h);
    return fn; /* the library stays loaded for the process */
}

/* The loop for source src on table avx512/avx2, from the cache directory or compiled
 * into it; NULL when neither works. Called under jit_lock. */
static kiln__cpu_jit_loop build_loop(const char *src, bool avx512)
{
    char dir[4096];
    if (!kiln__fused_cache_dir(dir, sizeof dir - 64, true))
        return NULL;
    strcat(dir, "/cpu-jit");
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return NULL;
    const char *cc = getenv("KILN_CPU_JIT_CC");
    if (!cc || !*cc)
        cc = "cc";
    const char *const *flags = avx512 ? flags_avx512 : flags_avx2;
    /* the name covers all that the library depends on */
    kiln__sbuf id = {.ok = true};
    kiln__sbuf_printf(&id, "%s\n%s\n%s\n", KILN_VERSION_STRING, cc, src);
    for (int i = 0; flags[i]; i++)
        kiln__sbuf_printf(&id, "%s ", flags[i]);
    for (const kiln__cpu_jit_header *h = kiln__cpu_jit_headers; h->name; h++)
        kiln__sbuf_printf(&id, "\n%s\n%s", h->name, h->text);
    if (!id.ok) {
        free(id.p);
        return NULL;
    }
    uint64_t hash = kiln__fused_hash(id.p);
    free(id.p);
    kiln__sbuf headers = {.ok = true};
    for (const kiln__cpu_jit_header *h = kiln__cpu_jit_headers; h->name; h++)
        kiln__sbuf_printf(&headers, "%s\n%s\n", h->name, h->text);
    uint64_t headers_hash = headers.ok ? kiln__fused_hash(headers.p) : 0;
    free(headers.p);
    char inc[4200], path[4200], lib[4200], tmp[4300], log[4200];
    snprintf(inc, sizeof inc, "%s/include-%016llx", dir, (unsigned long long)headers_hash);
    snprintf(path, sizeof path, "%s/kj-%016llx.c", dir, (unsigned long long)hash);
    snprintf(lib, sizeof lib, "%s/kj-%016llx.so", dir, (unsigned long long)hash);
    snprintf(log, sizeof log, "%s/kj-%016llx.log", dir, (unsigned long long)hash);
    kiln__cpu_jit_loop fn = load_loop(lib);
    if (fn) {
        mark_used(lib);
        return fn;
    }
    unlink(lib); /* absent, or a library that does not load: made again */
    if (jit_unavailable)
        return NULL;
    if (mkdir(inc, 0700) != 0 && errno != EEXIST)
        return NULL;
    for (const kiln__cpu_jit_header *h = kiln__cpu_jit_headers; h->name; h++) {
        char hp[4400];
        snprintf(hp, sizeof hp, "%s/%s", inc, h->name);
        if (!write_file(hp, h->text, h->len))
            return NULL;
    }
    if (!write_file(path, src, strlen(src)))
        return NULL;
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", lib, (long)getpid());
    bool unavailable = false;
    int rc = run_compiler(cc, flags, inc, path, tmp, log, &unavailable);
    if (unavailable) {
        jit_unavailable = true;
        kiln__warn("cpu: the C compiler '%s' (KILN_CPU_JIT_CC) cannot be run: fused groups run in "
                   "the block interpreter",
                   cc);
    }
    if (rc != 0 || rename(tmp, lib) != 0) {
        if (!unavailable && !jit_failed_once) {
            jit_failed_once = true;
            kiln__warn("cpu: a fused loop did not compile (%s): it runs in the block interpreter", log);
        }
        unlink(tmp);
        return NULL;
    }
    unlink(log);
    prune_cache(dir, inc);
    return load_loop(lib);
}

kiln__cpu_jit_loop kiln__cpu_jit_get(const kiln__cpu_ctx *ctx, const fplan *pl)
{
    if (!ctx->jit || !compilable(pl))
        return NULL;
    bool avx512 = strcmp(pl->k->name, "avx512") == 0;
    char *src = loop_source(pl, avx512);
    if (!src)
        return NULL;
    pthread_mutex_lock(&jit_lock);
    compiled *c = jit_cache;
    while (c && strcmp(c->source, src) != 0)
        c = c->next;
    if (!c && (c = calloc(1, sizeof *c)) != NULL) {
        c->source = src;
        src = NULL;
        c->fn = build_loop(c->source, avx512); /* NULL: this source runs interpreted */
        c->next = jit_cache;
        jit_cache = c;
    }
    kiln__cpu_jit_loop fn = c ? c->fn : NULL;
    pthread_mutex_unlock(&jit_lock);
    free(src);
    return fn;
}
