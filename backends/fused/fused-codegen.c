/*
 * backends/fused/fused-codegen.c — the shared half of the GPU code generators
 * (fused-codegen.h): program checks, cache keys and the kernel body, written once for
 * CUDA C and GLSL; and kiln__fused_key (fused-program.h), the program's shape that every
 * backend's code cache (the cpu's block tuner and compiled loops included) keys on.
 */
#include "fused-codegen.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void kiln__sbuf_printf(kiln__sbuf *b, const char *fmt, ...)
{
    if (!b->ok)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = b->cap > b->len ? vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap) : -2;
        va_end(ap);
        if (n == -1) {
            b->ok = false;
            return;
        }
        if (n >= 0 && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t need = n >= 0 ? (size_t)n : 256;
        size_t cap = (b->cap + need + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->ok = false;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

static const char *const unary_names[KILN_UNARY_COUNT] = {
    [KILN_UNARY_NEG] = "ku_neg",
    [KILN_UNARY_ABS] = "ku_abs",
    [KILN_UNARY_SIGN] = "ku_sign",
    [KILN_UNARY_EXP] = "ku_exp",
    [KILN_UNARY_LOG] = "ku_log",
    [KILN_UNARY_LOG1P] = "ku_log1p",
    [KILN_UNARY_EXPM1] = "ku_expm1",
    [KILN_UNARY_SQRT] = "ku_sqrt",
    [KILN_UNARY_RSQRT] = "ku_rsqrt",
    [KILN_UNARY_SQUARE] = "ku_square",
    [KILN_UNARY_RECIPROCAL] = "ku_reciprocal",
    [KILN_UNARY_SIN] = "ku_sin",
    [KILN_UNARY_COS] = "ku_cos",
    [KILN_UNARY_TANH] = "ku_tanh",
    [KILN_UNARY_SIGMOID] = "ku_sigmoid",
    [KILN_UNARY_RELU] = "ku_relu",
    [KILN_UNARY_LEAKY_RELU] = "ku_leaky_relu",
    [KILN_UNARY_ELU] = "ku_elu",
    [KILN_UNARY_GELU] = "ku_gelu",
    [KILN_UNARY_GELU_TANH] = "ku_gelu_tanh",
    [KILN_UNARY_SILU] = "ku_silu",
    [KILN_UNARY_SOFTPLUS] = "ku_softplus",
    [KILN_UNARY_ERF] = "ku_erf",
    [KILN_UNARY_FLOOR] = "ku_floor",
    [KILN_UNARY_CEIL] = "ku_ceil",
    [KILN_UNARY_ROUND] = "ku_round",
    [KILN_UNARY_CLAMP] = "ku_clamp",
    [KILN_UNARY_POW_SCALAR] = "ku_pow_scalar",
    [KILN_UNARY_ADD_SCALAR] = "ku_add_scalar",
    [KILN_UNARY_MUL_SCALAR] = "ku_mul_scalar",
    /* isnan, isinf and logical_not give bools: the fusion layer does not record them */
};

static const char *const binary_names[KILN_BINARY_GE + 1] = {
    [KILN_BINARY_ADD] = "kb_add",
    [KILN_BINARY_SUB] = "kb_sub",
    [KILN_BINARY_MUL] = "kb_mul",
    [KILN_BINARY_DIV] = "kb_div",
    [KILN_BINARY_REMAINDER] = "kb_remainder",
    [KILN_BINARY_POW] = "kb_pow",
    [KILN_BINARY_MAXIMUM] = "kb_maximum",
    [KILN_BINARY_MINIMUM] = "kb_minimum",
    [KILN_BINARY_EQ] = "==",
    [KILN_BINARY_NE] = "!=",
    [KILN_BINARY_LT] = "<",
    [KILN_BINARY_LE] = "<=",
    [KILN_BINARY_GT] = ">",
    [KILN_BINARY_GE] = ">=",
};

const char *kiln__fused_unary_name(int op)
{
    return (unsigned)op < KILN_UNARY_COUNT ? unary_names[op] : NULL;
}

bool kiln__fused_contiguous(const kiln_tdesc *d)
{
    int64_t s = 1;
    for (int i = d->ndim - 1; i >= 0; i--) {
        if (d->shape[i] != 1 && d->strides[i] != s)
            return false;
        s *= d->shape[i];
    }
    return true;
}

kiln__fused_layout kiln__fused_layout_of(const kiln_tdesc *d)
{
    if (kiln__fused_contiguous(d))
        return KILN__FUSED_CONTIG;
    for (int k = 0; k < d->ndim; k++)
        if (d->shape[k] != 1 && d->strides[k] != 0)
            return KILN__FUSED_GATHER;
    return KILN__FUSED_SCALAR;
}

/* The largest element offset the view reaches (its offset plus every dim's extent). */
static int64_t reach(const kiln_tdesc *d)
{
    int64_t hi = d->offset, lo = d->offset;
    for (int k = 0; k < d->ndim; k++) {
        if (d->shape[k] <= 1)
            continue;
        int64_t ext = (d->shape[k] - 1) * d->strides[k];
        if (ext > 0)
            hi += ext;
        else
            lo += ext;
    }
    return lo < 0 ? -1 : hi;
}

static bool reads_a(kiln_fused_code c)
{
    return c == KILN_FUSED_UNARY || c == KILN_FUSED_BINARY || c == KILN_FUSED_WHERE || c == KILN_FUSED_STORE ||
           c == KILN_FUSED_REDUCE || c == KILN_FUSED_SOFTMAX;
}

int kiln__fused_codegen_check(const kiln_fused_program *p, int64_t max_index)
{
    if (p->dtype != KILN_F32 || p->ninstrs < 1 || p->ninstrs > KILN_FUSED_MAX_INSTRS || p->ninputs < 0 ||
        p->ninputs > KILN_FUSED_MAX_INPUTS || p->noutputs < 1 || p->noutputs > KILN_FUSED_MAX_OUTPUTS ||
        p->nregs < 0 || p->nregs > KILN_FUSED_MAX_INSTRS * 2 || p->n < 0 || p->n > max_index)
        return KILN_ENOTSUP;
    if (p->reduce_inner < 0 || (p->reduce_inner > 0 && p->n % p->reduce_inner))
        return KILN_ENOTSUP;
    /* rows run one group each: a few long rows would leave most of a GPU idle, where the
     * unfused reduction and softmax split a row over many groups */
    if (p->reduce_inner > KILN__FUSED_LONG_ROW && p->n / p->reduce_inner < KILN__FUSED_FEW_ROWS)
        return KILN_ENOTSUP;
    for (int i = 0; i < p->ninputs; i++) {
        const kiln_tdesc *d = &p->inputs[i];
        int64_t r = reach(d);
        if ((d->dtype != KILN_F32 && d->dtype != KILN_BOOL) || d->ndim > KILN_MAX_DIMS || r < 0 || r > max_index)
            return KILN_ENOTSUP;
    }
    for (int i = 0; i < p->noutputs; i++) {
        const kiln_tdesc *d = &p->outputs[i];
        if ((d->dtype != KILN_F32 && d->dtype != KILN_BOOL) || !kiln__fused_contiguous(d) || d->offset < 0 ||
            d->offset > max_index - p->n)
            return KILN_ENOTSUP;
    }
    bool defined[KILN_FUSED_MAX_INSTRS * 2] = {false};
    for (int i = 0; i < p->ninstrs; i++) {
        const kiln_fused_instr *in = &p->instrs[i];
        kiln_fused_code c = in->code;
        if ((unsigned)c >= KILN_FUSED_CODE_COUNT)
            return KILN_ENOTSUP;
        bool rb = c == KILN_FUSED_BINARY || c == KILN_FUSED_WHERE, rc = c == KILN_FUSED_WHERE;
        if ((reads_a(c) && ((unsigned)in->a >= (unsigned)p->nregs || !defined[in->a])) ||
            (rb && ((unsigned)in->b >= (unsigned)p->nregs || !defined[in->b])) ||
            (rc && ((unsigned)in->c >= (unsigned)p->nregs || !defined[in->c])))
            return KILN_ENOTSUP;
        switch (c) {
        case KILN_FUSED_LOAD:
            if ((unsigned)in->arg >= (unsigned)p->ninputs)
                return KILN_ENOTSUP;
            break;
        case KILN_FUSED_UNARY:
            if (!kiln__fused_unary_name(in->op))
                return KILN_ENOTSUP;
            break;
        case KILN_FUSED_BINARY:
            if ((unsigned)in->op > KILN_BINARY_GE)
                return KILN_ENOTSUP;
            break;
        case KILN_FUSED_STORE:
            if ((unsigned)in->arg >= (unsigned)p->noutputs)
                return KILN_ENOTSUP;
            break;
        case KILN_FUSED_REDUCE:
            if ((unsigned)in->arg >= (unsigned)p->noutputs || p->reduce_inner <= 0 ||
                (in->op != KILN_REDUCE_SUM && in->op != KILN_REDUCE_MEAN) || p->outputs[in->arg].dtype != KILN_F32)
                return KILN_ENOTSUP;
            break;
        case KILN_FUSED_SOFTMAX:
            if (p->reduce_inner <= 0)
                return KILN_ENOTSUP;
            break;
        case KILN_FUSED_CONST:
        case KILN_FUSED_WHERE: break;
        default: return KILN_ENOTSUP; /* a code the generators do not emit (MATMUL, CONV, LAYER_NORM) */
        }
        if (c != KILN_FUSED_STORE && c != KILN_FUSED_REDUCE) {
            if ((unsigned)in->dst >= (unsigned)p->nregs || defined[in->dst])
                return KILN_ENOTSUP;
            defined[in->dst] = true;
        }
    }
    return 0;
}

char *kiln__fused_codegen_key(const kiln_fused_program *p, char *buf, size_t len)
{
    kiln__fused_key(p, buf, len);
    size_t at = strlen(buf);
    if (at + 4 + (size_t)p->noutputs < len) {
        at += (size_t)snprintf(buf + at, len - at, " o:");
        for (int i = 0; i < p->noutputs; i++)
            buf[at++] = p->outputs[i].dtype == KILN_BOOL ? 'b' : 'f';
        buf[at] = '\0';
    }
    if (at + 4 < len)
        snprintf(buf + at, len - at, " %s", p->reduce_inner > 0 ? "rows" : "flat");
    return buf;
}

uint64_t kiln__fused_hash(const char *text)
{
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        h ^= *c;
        h *= 1099511628211ull;
    }
    return h;
}

bool kiln__fused_cache_dir(char *dir, size_t len, bool create)
{
    const char *data = getenv("KILN_DATA_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (data && *data)
        n = snprintf(dir, len, "%s/cache", data);
    else if (xdg && *xdg)
        n = snprintf(dir, len, "%s/kiln", xdg);
    else if (home && *home)
        n = snprintf(dir, len, "%s/.cache/kiln", home);
    else
        return false;
    if (n < 0 || (size_t)n >= len)
        return false;
    if (!create)
        return true;
    for (char *c = dir + 1; *c; c++)
        if (*c == '/') {
            *c = '\0';
            bool ok = mkdir(dir, 0755) == 0 || errno == EEXIST;
            *c = '/';
            if (!ok)
                return false;
        }
    return mkdir(dir, 0755) == 0 || errno == EEXIST;
}

/* ------------------------------------------------------------------ the body */

enum {
    PASS_VALUES, /* instructions before a softmax, nothing stored */
    PASS_FINAL   /* every instruction, stores and reductions */
};

/* One instruction's statement (ind: indentation). */
static void emit_instr(kiln__sbuf *b, const kiln_fused_program *p, int i, int pass, const char *ind)
{
    const kiln_fused_instr *in = &p->instrs[i];
    switch (in->code) {
    case KILN_FUSED_LOAD: {
        kiln__fused_layout l = kiln__fused_layout_of(&p->inputs[in->arg]);
        if (l == KILN__FUSED_CONTIG)
            kiln__sbuf_printf(b, "%sfloat r%d = KF_LD%d(i);\n", ind, in->dst, in->arg);
        else if (l == KILN__FUSED_SCALAR)
            kiln__sbuf_printf(b, "%sfloat r%d = KF_LD%d(0);\n", ind, in->dst, in->arg);
        else
            kiln__sbuf_printf(b, "%sfloat r%d = KF_LD%d(kf_gather_off_%d(KF_PARG i));\n", ind, in->dst, in->arg,
                              in->arg);
        break;
    }
    case KILN_FUSED_CONST: kiln__sbuf_printf(b, "%sfloat r%d = KF_K(%d);\n", ind, in->dst, 2 * i); break;
    case KILN_FUSED_UNARY:
        kiln__sbuf_printf(b, "%sfloat r%d = %s(r%d, KF_K(%d), KF_K(%d));\n", ind, in->dst,
                          kiln__fused_unary_name(in->op), in->a, 2 * i, 2 * i + 1);
        break;
    case KILN_FUSED_BINARY:
        if (in->op <= KILN_BINARY_MINIMUM)
            kiln__sbuf_printf(b, "%sfloat r%d = %s(r%d, r%d);\n", ind, in->dst, binary_names[in->op], in->a,
                              in->b);
        else
            kiln__sbuf_printf(b, "%sfloat r%d = (r%d %s r%d) ? 1.0f : 0.0f;\n", ind, in->dst, in->a,
                              binary_names[in->op], in->b);
        break;
    case KILN_FUSED_WHERE:
        kiln__sbuf_printf(b, "%sfloat r%d = (r%d != 0.0f) ? r%d : r%d;\n", ind, in->dst, in->a, in->b, in->c);
        break;
    case KILN_FUSED_SOFTMAX:
        if (in->op)
            kiln__sbuf_printf(b, "%sfloat r%d = float((kf_acc(r%d) - kf_shift%d) - kf_lse%d);\n", ind, in->dst,
                              in->a, i, i);
        else
            kiln__sbuf_printf(b, "%sfloat r%d = float(kf_acc_exp(kf_acc(r%d) - kf_shift%d) / kf_sum%d);\n", ind,
                              in->dst, in->a, i, i);
        break;
    case KILN_FUSED_STORE:
        if (pass == PASS_FINAL)
            kiln__sbuf_printf(b, "%sKF_ST%d(i, r%d);\n", ind, in->arg, in->a);
        break;
    case KILN_FUSED_REDUCE:
        if (pass == PASS_FINAL)
            kiln__sbuf_printf(b, "%skf_red%d += kf_acc(r%d);\n", ind, i, in->a);
        break;
    default: break;
    }
}

static void emit_instrs(kiln__sbuf *b, const kiln_fused_program *p, int end, int pass, const char *ind)
{
    for (int i = 0; i < end; i++)
        emit_instr(b, p, i, pass, ind);
}

static void emit_gathers(kiln__sbuf *b, const kiln_fused_program *p)
{
    for (int k = 0; k < p->ninputs; k++) {
        if (kiln__fused_layout_of(&p->inputs[k]) != KILN__FUSED_GATHER)
            continue;
        kiln__sbuf_printf(b,
                          "KF_FN KF_IDX kf_gather_off_%d(KF_PDECL KF_IDX i)\n{\n"
                          "    KF_IDX off = KF_IDX(0);\n"
                          "    for (int d = KF_NDIM(%d) - 1; d >= 0; d--) {\n"
                          "        KF_IDX s = KF_SHAPE(%d, d);\n"
                          "        off += (i %% s) * KF_STRIDE(%d, d);\n"
                          "        i /= s;\n"
                          "    }\n    return off;\n}\n",
                          k, k, k, k);
    }
}

void kiln__fused_emit_body(kiln__sbuf *b, const kiln_fused_program *p)
{
    emit_gathers(b, p);
    kiln__sbuf_printf(b, "KF_KERNEL_BEGIN\n");
    if (p->reduce_inner == 0) {
        kiln__sbuf_printf(b, "    for (KF_IDX i = KF_GID; i < KF_N; i += KF_GSTRIDE) {\n");
        emit_instrs(b, p, p->ninstrs, PASS_FINAL, "        ");
        kiln__sbuf_printf(b, "    }\n");
        kiln__sbuf_printf(b, "KF_KERNEL_END\n");
        return;
    }
    kiln__sbuf_printf(b, "    for (KF_IDX row = KF_GROUP; row < KF_N / KF_INNER; row += KF_NGROUPS) {\n");
    const char *loop = "        for (KF_IDX j = KF_LID; j < KF_INNER; j += KF_LSIZE) {\n"
                       "            KF_IDX i = row * KF_INNER + j;\n";
    for (int s = 0; s < p->ninstrs; s++) {
        const kiln_fused_instr *in = &p->instrs[s];
        if (in->code != KILN_FUSED_SOFTMAX)
            continue;
        /* the row's maximum (a NaN wins, as in the unfused softmax), then its sum of
         * exponentials, both over the values feeding the softmax */
        kiln__sbuf_printf(b, "        KF_ACC kf_max%d = KF_NEG_INF;\n%s", s, loop);
        emit_instrs(b, p, s, PASS_VALUES, "            ");
        kiln__sbuf_printf(b,
                          "            KF_ACC v = kf_acc(r%d);\n"
                          "            if (kf_max%d == kf_max%d && (v != v || v > kf_max%d))\n"
                          "                kf_max%d = v;\n        }\n"
                          "        kf_max%d = kf_group_max(kf_max%d);\n"
                          "        KF_ACC kf_shift%d = isinf(kf_max%d) ? kf_acc(0.0f) : kf_max%d;\n"
                          "        KF_ACC kf_sum%d = kf_acc(0.0f);\n%s",
                          in->a, s, s, s, s, s, s, s, s, s, s, loop);
        emit_instrs(b, p, s, PASS_VALUES, "            ");
        kiln__sbuf_printf(b,
                          "            kf_sum%d += kf_acc_exp(kf_acc(r%d) - kf_shift%d);\n        }\n"
                          "        kf_sum%d = kf_group_sum(kf_sum%d);\n"
                          "        KF_ACC kf_lse%d = kf_acc_log(kf_sum%d);\n",
                          s, in->a, s, s, s, s, s);
    }
    for (int r = 0; r < p->ninstrs; r++)
        if (p->instrs[r].code == KILN_FUSED_REDUCE)
            kiln__sbuf_printf(b, "        KF_ACC kf_red%d = kf_acc(0.0f);\n", r);
    kiln__sbuf_printf(b, "%s", loop);
    emit_instrs(b, p, p->ninstrs, PASS_FINAL, "            ");
    kiln__sbuf_printf(b, "        }\n");
    for (int r = 0; r < p->ninstrs; r++) {
        const kiln_fused_instr *in = &p->instrs[r];
        if (in->code != KILN_FUSED_REDUCE)
            continue;
        kiln__sbuf_printf(b, "        kf_red%d = kf_group_sum(kf_red%d);\n", r, r);
        kiln__sbuf_printf(b, "        if (KF_LID == 0)\n            KF_ST%d(row, float(kf_red%d%s));\n", in->arg,
                          r, in->op == KILN_REDUCE_MEAN ? " / kf_acc_n(KF_INNER)" : "");
    }
    kiln__sbuf_printf(b, "    }\n");
    kiln__sbuf_printf(b, "KF_KERNEL_END\n");
}

/* ------------------------------------------------------------------ key */

char *kiln__fused_key(const kiln_fused_program *p, char *buf, size_t len)
{
    size_t at = 0;
#define PUT(...)                                                                                                  \
    do {                                                                                                          \
        if (at < len) {                                                                                           \
            int w = snprintf(buf + at, len - at, __VA_ARGS__);                                                    \
            at += w > 0 ? (size_t)w : 0;                                                                          \
        }                                                                                                         \
    } while (0)
    static const char layout_letter[] = {
        [KILN__FUSED_CONTIG] = 'c', [KILN__FUSED_SCALAR] = 's', [KILN__FUSED_GATHER] = 'g'};
    if (len)
        buf[0] = '\0';
    PUT("%s", kiln_dtype_name(p->dtype));
    for (int i = 0; i < p->ninputs; i++) {
        const kiln_tdesc *d = &p->inputs[i];
        PUT(" i%d:%s%c", i, d->dtype == KILN_BOOL ? "b" : "", layout_letter[kiln__fused_layout_of(d)]);
    }
    for (int i = 0; i < p->ninstrs; i++) {
        const kiln_fused_instr *in = &p->instrs[i];
        PUT(" %d.%d:%d,%d,%d,%d,%d", (int)in->code, in->op, in->dst, in->a, in->b, in->c, in->arg);
        if (in->code == KILN_FUSED_MATMUL || in->code == KILN_FUSED_CONV || in->code == KILN_FUSED_POOL_GRAD)
            PUT(",%d,%d", in->arg2, in->arg3);
    }
#undef PUT
    return buf;
}
