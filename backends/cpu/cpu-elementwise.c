/*
 * backends/cpu/cpu-elementwise.c — unary, binary and where.
 *
 * Every op runs through the strided iterator (cpu-iter.c), which hands each thread runs
 * of elements. The hot case — f32 in and out with unit strides, or a broadcast scalar
 * operand — goes straight to the f32 kernel table over the whole run. Every other case
 * works in blocks of up to BLOCK elements: gather the operands into a small contiguous
 * buffer converted to the compute type, run the contiguous kernel, scatter the result.
 * Compute types: f32 for f32/f16/bf16 (PyTorch computes half types in f32 as well), f64
 * for f64 and for anything mixing integers into a float result, int64 for integer
 * results so i64 keeps all its bits. One code path thus serves every stride — zero,
 * negative, odd — and every dtype, and the kernels only ever see contiguous arrays.
 */
#include <stdlib.h>

#include "cpu-impl.h"

#define BLOCK 256

typedef enum ctype { CT_F32, CT_F64, CT_I64 } ctype;

/* ------------------------------------------------------------------ gather / scatter */

static void gather_f32(kiln__cpu_ctx *ctx, float *t, const char *p, int64_t s, kiln_dtype dt, int64_t n)
{
    size_t es = kiln__cpu_esize(dt);
    if (dt == KILN_F32) {
        const float *f = (const float *)p;
        for (int64_t i = 0; i < n; i++)
            t[i] = f[i * s];
    } else if (dt == KILN_F16 && s == 1) {
        ctx->k->f16_to_f32(t, (const uint16_t *)p, n);
    } else if (dt == KILN_BF16) {
        const uint16_t *h = (const uint16_t *)p;
        for (int64_t i = 0; i < n; i++)
            t[i] = kiln_bf16_to_f32(h[i * s]);
    } else {
        for (int64_t i = 0; i < n; i++)
            t[i] = (float)kiln__cpu_ld(p + i * s * (int64_t)es, dt);
    }
}

static void scatter_f32(kiln__cpu_ctx *ctx, char *p, int64_t s, kiln_dtype dt, const float *t, int64_t n)
{
    size_t es = kiln__cpu_esize(dt);
    if (dt == KILN_F32) {
        float *f = (float *)p;
        for (int64_t i = 0; i < n; i++)
            f[i * s] = t[i];
    } else if (dt == KILN_F16 && s == 1) {
        ctx->k->f32_to_f16((uint16_t *)p, t, n);
    } else if (dt == KILN_BF16) {
        uint16_t *h = (uint16_t *)p;
        for (int64_t i = 0; i < n; i++)
            h[i * s] = kiln_f32_to_bf16(t[i]);
    } else {
        for (int64_t i = 0; i < n; i++)
            kiln__cpu_st(p + i * s * (int64_t)es, dt, t[i]);
    }
}

static void gather_f64(double *t, const char *p, int64_t s, kiln_dtype dt, int64_t n)
{
    int64_t st = s * (int64_t)kiln__cpu_esize(dt);
    if (dt == KILN_F64) {
        for (int64_t i = 0; i < n; i++)
            t[i] = ((const double *)p)[i * s];
    } else {
        for (int64_t i = 0; i < n; i++)
            t[i] = kiln__cpu_ld(p + i * st, dt);
    }
}

static void scatter_f64(char *p, int64_t s, kiln_dtype dt, const double *t, int64_t n)
{
    int64_t st = s * (int64_t)kiln__cpu_esize(dt);
    for (int64_t i = 0; i < n; i++)
        kiln__cpu_st(p + i * st, dt, t[i]);
}

static void gather_i64(int64_t *t, const char *p, int64_t s, kiln_dtype dt, int64_t n)
{
    int64_t st = s * (int64_t)kiln__cpu_esize(dt);
    for (int64_t i = 0; i < n; i++)
        t[i] = kiln__cpu_ldi(p + i * st, dt);
}

static void scatter_i64(char *p, int64_t s, kiln_dtype dt, const int64_t *t, int64_t n)
{
    int64_t st = s * (int64_t)kiln__cpu_esize(dt);
    for (int64_t i = 0; i < n; i++)
        kiln__cpu_sti(p + i * st, dt, t[i]);
}

/* ------------------------------------------------------------------ f64 and i64 unary */

#define DLOOP(EXPR) for (int64_t i = 0; i < n; i++) { double v = x[i]; o[i] = (EXPR); } break

static double d_softplus(double v, double beta, double thr)
{
    return v * beta > thr ? v : log1p(exp(v * beta)) / beta;
}

static void unary_f64(int op, double *restrict o, const double *restrict x, int64_t n, double a, double b)
{
    switch ((kiln_unary_op)op) {
    case KILN_UNARY_NEG: DLOOP(-v);
    case KILN_UNARY_ABS: DLOOP(fabs(v));
    case KILN_UNARY_SIGN: DLOOP(v > 0 ? 1.0 : (v < 0 ? -1.0 : 0.0));
    case KILN_UNARY_EXP: DLOOP(exp(v));
    case KILN_UNARY_LOG: DLOOP(log(v));
    case KILN_UNARY_LOG1P: DLOOP(log1p(v));
    case KILN_UNARY_EXPM1: DLOOP(expm1(v));
    case KILN_UNARY_SQRT: DLOOP(sqrt(v));
    case KILN_UNARY_RSQRT: DLOOP(1.0 / sqrt(v));
    case KILN_UNARY_SQUARE: DLOOP(v * v);
    case KILN_UNARY_RECIPROCAL: DLOOP(1.0 / v);
    case KILN_UNARY_SIN: DLOOP(sin(v));
    case KILN_UNARY_COS: DLOOP(cos(v));
    case KILN_UNARY_TANH: DLOOP(tanh(v));
    case KILN_UNARY_SIGMOID: DLOOP(1.0 / (1.0 + exp(-v)));
    case KILN_UNARY_RELU: DLOOP(v < 0 ? 0.0 : v);
    case KILN_UNARY_LEAKY_RELU: DLOOP(v < 0 ? v * a : v);
    case KILN_UNARY_ELU: DLOOP(v > 0 ? v : a * expm1(v));
    case KILN_UNARY_GELU: DLOOP(0.5 * v * erfc(-v * 0.70710678118654752440));
    case KILN_UNARY_GELU_TANH:
        DLOOP(0.5 * v * (1.0 + tanh(0.79788456080286535588 * (v + 0.044715 * v * v * v))));
    case KILN_UNARY_SILU: DLOOP(v / (1.0 + exp(-v)));
    case KILN_UNARY_SOFTPLUS: DLOOP(d_softplus(v, a, b));
    case KILN_UNARY_ERF: DLOOP(erf(v));
    case KILN_UNARY_FLOOR: DLOOP(floor(v));
    case KILN_UNARY_CEIL: DLOOP(ceil(v));
    case KILN_UNARY_ROUND: DLOOP(nearbyint(v));
    case KILN_UNARY_CLAMP: DLOOP(v != v ? v : (v < a ? (a > b ? b : a) : (v > b ? b : v)));
    /* x ** 0.5 and x ** -0.5 are sqrt and rsqrt, as PyTorch dispatches them (they
     * differ from pow at -inf and -0) */
    case KILN_UNARY_POW_SCALAR:
        if (a == 0.5) {
            DLOOP(sqrt(v));
        } else if (a == -0.5) {
            DLOOP(1.0 / sqrt(v));
        } else {
            DLOOP(a == 2.0 ? v * v : pow(v, a));
        }
    case KILN_UNARY_ADD_SCALAR: DLOOP(v + a);
    case KILN_UNARY_MUL_SCALAR: DLOOP(v * a);
    case KILN_UNARY_ISNAN: DLOOP(v != v);
    case KILN_UNARY_ISINF: DLOOP(isinf(v) ? 1.0 : 0.0);
    case KILN_UNARY_LOGICAL_NOT: DLOOP(v == 0);
    default: break;
    }
}

static int64_t ipow(int64_t base, int64_t e)
{
    if (e < 0)
        return base == 1 ? 1 : (base == -1 ? ((e & 1) ? -1 : 1) : 0);
    uint64_t r = 1, b = (uint64_t)base;
    while (e) {
        if (e & 1)
            r *= b;
        b *= b;
        e >>= 1;
    }
    return (int64_t)r;
}

#define ILOOP(EXPR) for (int64_t i = 0; i < n; i++) { int64_t v = x[i]; o[i] = (EXPR); } break

static void unary_i64(int op, int64_t *restrict o, const int64_t *restrict x, int64_t n, double a, double b)
{
    int64_t ia = kiln__cpu_d2i(a);
    switch ((kiln_unary_op)op) {
    case KILN_UNARY_NEG: ILOOP((int64_t)(0 - (uint64_t)v));
    case KILN_UNARY_ABS: ILOOP(v < 0 ? (int64_t)(0 - (uint64_t)v) : v);
    case KILN_UNARY_SIGN: ILOOP((v > 0) - (v < 0));
    case KILN_UNARY_SQUARE: ILOOP((int64_t)((uint64_t)v * (uint64_t)v));
    case KILN_UNARY_RELU: ILOOP(v < 0 ? 0 : v);
    case KILN_UNARY_FLOOR: case KILN_UNARY_CEIL: case KILN_UNARY_ROUND: ILOOP(v);
    case KILN_UNARY_CLAMP: {
        /* lo > hi gives hi, as torch.clamp; fractional bounds round inward. Compared in
         * int64, as ref: through a double, an i64 past 2^53 rounds onto the bound. */
        int64_t lo = kiln__cpu_d2i(ceil(a)), hi = kiln__cpu_d2i(floor(b));
        for (int64_t i = 0; i < n; i++) {
            int64_t v = x[i] < lo ? lo : x[i];
            o[i] = v > hi ? hi : v;
        }
        break;
    }
    case KILN_UNARY_POW_SCALAR: ILOOP(ipow(v, ia));
    case KILN_UNARY_ADD_SCALAR:
        if (a == (double)ia) {
            ILOOP((int64_t)((uint64_t)v + (uint64_t)ia));
        } else {
            ILOOP(kiln__cpu_d2i((double)v + a));
        }
    case KILN_UNARY_MUL_SCALAR:
        if (a == (double)ia) {
            ILOOP((int64_t)((uint64_t)v * (uint64_t)ia));
        } else {
            ILOOP(kiln__cpu_d2i((double)v * a));
        }
    case KILN_UNARY_ISNAN: case KILN_UNARY_ISINF: ILOOP(v & 0);
    case KILN_UNARY_LOGICAL_NOT: ILOOP(v == 0);
    case KILN_UNARY_LEAKY_RELU: ILOOP(v < 0 ? kiln__cpu_d2i((double)v * a) : v);
    default: /* float-valued ops on integers: computed through f64 by the caller */
        break;
    }
}

static bool unary_int_exact(kiln_unary_op op)
{
    switch (op) {
    case KILN_UNARY_NEG: case KILN_UNARY_ABS: case KILN_UNARY_SIGN: case KILN_UNARY_SQUARE:
    case KILN_UNARY_RELU: case KILN_UNARY_FLOOR: case KILN_UNARY_CEIL: case KILN_UNARY_ROUND:
    case KILN_UNARY_CLAMP: case KILN_UNARY_POW_SCALAR: case KILN_UNARY_ADD_SCALAR:
    case KILN_UNARY_MUL_SCALAR: case KILN_UNARY_ISNAN: case KILN_UNARY_ISINF:
    case KILN_UNARY_LOGICAL_NOT: case KILN_UNARY_LEAKY_RELU:
        return true;
    default:
        return false;
    }
}

/* ------------------------------------------------------------------ unary entry */

typedef struct unary_job {
    kiln__cpu_ctx *ctx;
    int op;
    ctype ct;
    kiln_dtype od, id;
    double a, b;
} unary_job;

static void unary_row(void *argp, char *const *p, const int64_t *s, int64_t n)
{
    const unary_job *j = argp;
    if (j->ct == CT_F32 && j->od == KILN_F32 && j->id == KILN_F32 && s[0] == 1 && s[1] == 1) {
        j->ctx->k->unary_f32(j->op, (float *)p[0], (const float *)p[1], n, (float)j->a, (float)j->b);
        return;
    }
    size_t oes = kiln__cpu_esize(j->od), ies = kiln__cpu_esize(j->id);
    for (int64_t done = 0; done < n; done += BLOCK) {
        int64_t m = n - done < BLOCK ? n - done : BLOCK;
        char *op = p[0] + done * s[0] * (int64_t)oes;
        const char *ip = p[1] + done * s[1] * (int64_t)ies;
        if (j->ct == CT_F32) {
            float ti[BLOCK], to[BLOCK];
            gather_f32(j->ctx, ti, ip, s[1], j->id, m);
            j->ctx->k->unary_f32(j->op, to, ti, m, (float)j->a, (float)j->b);
            scatter_f32(j->ctx, op, s[0], j->od, to, m);
        } else if (j->ct == CT_F64) {
            double ti[BLOCK], to[BLOCK];
            gather_f64(ti, ip, s[1], j->id, m);
            unary_f64(j->op, to, ti, m, j->a, j->b);
            scatter_f64(op, s[0], j->od, to, m);
        } else {
            int64_t ti[BLOCK], to[BLOCK];
            gather_i64(ti, ip, s[1], j->id, m);
            unary_i64(j->op, to, ti, m, j->a, j->b);
            scatter_i64(op, s[0], j->od, to, m);
        }
    }
}

static bool is_half_or_f32(kiln_dtype dt)
{
    return dt == KILN_F32 || dt == KILN_F16 || dt == KILN_BF16;
}

int kiln__cpu_unary(void *vctx, kiln_unary_op op, const kiln_tdesc *out, const kiln_tdesc *in,
                    double alpha, double beta)
{
    if ((unsigned)op >= KILN_UNARY_COUNT)
        return kiln__error_set("cpu unary: unknown op %d", (int)op), KILN_EINVAL;
    unary_job j = {vctx, op, CT_F64, out->dtype, in->dtype, alpha, beta};
    bool bool_op = op == KILN_UNARY_ISNAN || op == KILN_UNARY_ISINF || op == KILN_UNARY_LOGICAL_NOT;
    if (kiln__cpu_is_int(in->dtype) && (kiln__cpu_is_int(out->dtype) || bool_op) &&
        unary_int_exact(op))
        j.ct = CT_I64;
    else if (!bool_op && is_half_or_f32(in->dtype) && is_half_or_f32(out->dtype))
        j.ct = CT_F32;
    kiln__cpu_iter it;
    const kiln_tdesc *ops[2] = {out, in};
    kiln__cpu_iter_init(&it, 2, ops);
    bool heavy = op != KILN_UNARY_NEG && op != KILN_UNARY_ABS && op != KILN_UNARY_RELU &&
                 op != KILN_UNARY_ADD_SCALAR && op != KILN_UNARY_MUL_SCALAR &&
                 op != KILN_UNARY_SQUARE;
    kiln__cpu_iter_run(vctx, &it, heavy ? 2048 : 16384, unary_row, &j);
    return 0;
}

/* ------------------------------------------------------------------ binary */

static double d_remainder(double a, double b)
{
    double r = fmod(a, b);
    if (r != 0 && ((r < 0) != (b < 0)))
        r += b;
    return r;
}

#define DBLOOP(EXPR) for (int64_t i = 0; i < n; i++) { double x = a[i], y = b[i]; o[i] = (EXPR); } break

static void binary_f64(int op, double *restrict o, const double *restrict a, const double *restrict b, int64_t n)
{
    switch ((kiln_binary_op)op) {
    case KILN_BINARY_ADD: DBLOOP(x + y);
    case KILN_BINARY_SUB: DBLOOP(x - y);
    case KILN_BINARY_MUL: DBLOOP(x * y);
    case KILN_BINARY_DIV: DBLOOP(x / y);
    case KILN_BINARY_REMAINDER: DBLOOP(d_remainder(x, y));
    case KILN_BINARY_POW: DBLOOP(pow(x, y));
    /* of equal operands the first, as ref and std::max: maximum(+0, -0) is +0 */
    case KILN_BINARY_MAXIMUM: DBLOOP((x != x || y != y) ? x + y : (x < y ? y : x));
    case KILN_BINARY_MINIMUM: DBLOOP((x != x || y != y) ? x + y : (y < x ? y : x));
    case KILN_BINARY_EQ: DBLOOP(x == y);
    case KILN_BINARY_NE: DBLOOP(x != y);
    case KILN_BINARY_LT: DBLOOP(x < y);
    case KILN_BINARY_LE: DBLOOP(x <= y);
    case KILN_BINARY_GT: DBLOOP(x > y);
    case KILN_BINARY_GE: DBLOOP(x >= y);
    case KILN_BINARY_LOGICAL_AND: DBLOOP((x != 0) && (y != 0));
    case KILN_BINARY_LOGICAL_OR: DBLOOP((x != 0) || (y != 0));
    case KILN_BINARY_LOGICAL_XOR: DBLOOP((x != 0) != (y != 0));
    default: break;
    }
}

static int64_t i_div(int64_t x, int64_t y)
{
    if (y == 0)
        return 0;
    if (y == -1)
        return (int64_t)(0 - (uint64_t)x);
    int64_t q = x / y;
    if (x % y != 0 && ((x < 0) != (y < 0)))
        q--; /* floor, as Python's // */
    return q;
}

static int64_t i_rem(int64_t x, int64_t y)
{
    if (y == 0 || y == -1)
        return 0;
    int64_t r = x % y;
    if (r != 0 && ((r < 0) != (y < 0)))
        r += y;
    return r;
}

#define IBLOOP(EXPR) for (int64_t i = 0; i < n; i++) { int64_t x = a[i], y = b[i]; o[i] = (EXPR); } break

static void binary_i64(int op, int64_t *restrict o, const int64_t *restrict a, const int64_t *restrict b, int64_t n)
{
    switch ((kiln_binary_op)op) {
    case KILN_BINARY_ADD: IBLOOP((int64_t)((uint64_t)x + (uint64_t)y));
    case KILN_BINARY_SUB: IBLOOP((int64_t)((uint64_t)x - (uint64_t)y));
    case KILN_BINARY_MUL: IBLOOP((int64_t)((uint64_t)x * (uint64_t)y));
    case KILN_BINARY_DIV: IBLOOP(i_div(x, y));
    case KILN_BINARY_REMAINDER: IBLOOP(i_rem(x, y));
    case KILN_BINARY_POW: IBLOOP(ipow(x, y));
    case KILN_BINARY_MAXIMUM: IBLOOP(x < y ? y : x);
    case KILN_BINARY_MINIMUM: IBLOOP(y < x ? y : x);
    case KILN_BINARY_EQ: IBLOOP(x == y);
    case KILN_BINARY_NE: IBLOOP(x != y);
    case KILN_BINARY_LT: IBLOOP(x < y);
    case KILN_BINARY_LE: IBLOOP(x <= y);
    case KILN_BINARY_GT: IBLOOP(x > y);
    case KILN_BINARY_GE: IBLOOP(x >= y);
    case KILN_BINARY_LOGICAL_AND: IBLOOP((x != 0) && (y != 0));
    case KILN_BINARY_LOGICAL_OR: IBLOOP((x != 0) || (y != 0));
    case KILN_BINARY_LOGICAL_XOR: IBLOOP((x != 0) != (y != 0));
    default: break;
    }
}

typedef struct binary_job {
    kiln__cpu_ctx *ctx;
    int op;
    ctype ct;
    kiln_dtype od, id;
} binary_job;

/* f32 comparisons into bool (the masks of relu, clamp and max-pool gradients), any
 * input strides: one compare per element instead of the generic path's conversion of
 * both operands to double and back. NaN compares false except under NE, as in C. */
#define CMP_LOOP(OPR)                                                                  \
    for (int64_t i = 0; i < n; i++)                                                    \
        o[i] = a[i * sa] OPR b[i * sb];                                                \
    return true

static bool compare_f32(int op, uint8_t *restrict o, const float *restrict a, int64_t sa,
                        const float *restrict b, int64_t sb, int64_t n)
{
    switch (op) {
    case KILN_BINARY_EQ: CMP_LOOP(==);
    case KILN_BINARY_NE: CMP_LOOP(!=);
    case KILN_BINARY_LT: CMP_LOOP(<);
    case KILN_BINARY_LE: CMP_LOOP(<=);
    case KILN_BINARY_GT: CMP_LOOP(>);
    case KILN_BINARY_GE: CMP_LOOP(>=);
    default: return false;
    }
}

static void binary_row(void *argp, char *const *p, const int64_t *s, int64_t n)
{
    const binary_job *j = argp;
    if (j->ct == CT_F32 && j->od == KILN_F32 && j->id == KILN_F32 && s[0] == 1 &&
        (s[1] == 0 || s[1] == 1) && (s[2] == 0 || s[2] == 1)) {
        j->ctx->k->binary_f32(j->op, (float *)p[0], (const float *)p[1], s[1],
                              (const float *)p[2], s[2], n);
        return;
    }
    if (j->id == KILN_F32 && j->od == KILN_BOOL && s[0] == 1 &&
        compare_f32(j->op, (uint8_t *)p[0], (const float *)p[1], s[1], (const float *)p[2], s[2], n))
        return;
    size_t oes = kiln__cpu_esize(j->od), ies = kiln__cpu_esize(j->id);
    for (int64_t done = 0; done < n; done += BLOCK) {
        int64_t m = n - done < BLOCK ? n - done : BLOCK;
        char *op = p[0] + done * s[0] * (int64_t)oes;
        const char *ap = p[1] + done * s[1] * (int64_t)ies;
        const char *bp = p[2] + done * s[2] * (int64_t)ies;
        if (j->ct == CT_F32) {
            float ta[BLOCK], tb[BLOCK], to[BLOCK];
            gather_f32(j->ctx, ta, ap, s[1], j->id, m);
            gather_f32(j->ctx, tb, bp, s[2], j->id, m);
            j->ctx->k->binary_f32(j->op, to, ta, 1, tb, 1, m);
            scatter_f32(j->ctx, op, s[0], j->od, to, m);
        } else if (j->ct == CT_F64) {
            double ta[BLOCK], tb[BLOCK], to[BLOCK];
            gather_f64(ta, ap, s[1], j->id, m);
            gather_f64(tb, bp, s[2], j->id, m);
            binary_f64(j->op, to, ta, tb, m);
            scatter_f64(op, s[0], j->od, to, m);
        } else {
            int64_t ta[BLOCK], tb[BLOCK], to[BLOCK];
            gather_i64(ta, ap, s[1], j->id, m);
            gather_i64(tb, bp, s[2], j->id, m);
            binary_i64(j->op, to, ta, tb, m);
            scatter_i64(op, s[0], j->od, to, m);
        }
    }
}

/* f32 rows with one operand constant along each row: a per-channel scale or shift of an
 * NCHW map ([N, C, H, W] by [N or 1, C, 1, 1], a squeeze-excitation block's Mul). One
 * kernel call per row, without the general walk's index arithmetic and carries for every
 * 49-element row of a 7x7 map. */
typedef struct bcast_rows {
    kiln__cpu_ctx *ctx;
    int op;
    float *o;
    const float *a, *b;
    int64_t n, so, sa, sb, ia, ib; /* row length; outer strides; inner strides (0 or 1) */
} bcast_rows;

static void bcast_rows_range(void *argp, int64_t r0, int64_t r1)
{
    const bcast_rows *r = argp;
    for (int64_t i = r0; i < r1; i++)
        r->ctx->k->binary_f32(r->op, r->o + i * r->so, r->a + i * r->sa, r->ia, r->b + i * r->sb, r->ib, r->n);
}

static bool binary_bcast_rows(kiln__cpu_ctx *ctx, int op, const kiln__cpu_iter *it)
{
    if (it->ndim != 2 || it->stride[0][1] != 1)
        return false;
    const int64_t ia = it->stride[1][1], ib = it->stride[2][1];
    if ((ia != 0 && ia != 1) || (ib != 0 && ib != 1) || ia == ib)
        return false;
    bcast_rows r = {ctx, op, (float *)it->base[0], (const float *)it->base[1], (const float *)it->base[2],
                    it->shape[1], it->stride[0][0], it->stride[1][0], it->stride[2][0], ia, ib};
    /* the general walk's grain: splitting MobileNetV3's 28K-element maps over two
     * threads made those Muls slower (region start-up, lines moving between cores) */
    int64_t grain = 16384 / r.n > 0 ? 16384 / r.n : 1;
    kiln__cpu_parallel_for(ctx, it->shape[0], grain, bcast_rows_range, &r);
    return true;
}

int kiln__cpu_binary(void *vctx, kiln_binary_op op, const kiln_tdesc *out, const kiln_tdesc *a,
                     const kiln_tdesc *b)
{
    if ((unsigned)op >= KILN_BINARY_COUNT)
        return kiln__error_set("cpu binary: unknown op %d", (int)op), KILN_EINVAL;
    if (a->dtype != b->dtype)
        return kiln__error_set("cpu binary: operands differ in dtype (%s, %s)",
                               kiln_dtype_name(a->dtype), kiln_dtype_name(b->dtype)), KILN_EINVAL;
    binary_job j = {vctx, op, CT_F64, out->dtype, a->dtype};
    bool arith = op <= KILN_BINARY_MINIMUM;
    if (kiln__cpu_is_int(a->dtype) && (!arith || kiln__cpu_is_int(out->dtype)))
        j.ct = CT_I64;
    else if (arith && is_half_or_f32(a->dtype) && is_half_or_f32(out->dtype))
        j.ct = CT_F32;
    kiln__cpu_iter it;
    const kiln_tdesc *ops[3] = {out, a, b};
    kiln__cpu_iter_init(&it, 3, ops);
    if (j.ct == CT_F32 && out->dtype == KILN_F32 && a->dtype == KILN_F32 && op <= KILN_BINARY_MINIMUM &&
        binary_bcast_rows(vctx, op, &it))
        return 0;
    bool heavy = op == KILN_BINARY_POW || op == KILN_BINARY_REMAINDER;
    kiln__cpu_iter_run(vctx, &it, heavy ? 2048 : 16384, binary_row, &j);
    return 0;
}

/* ------------------------------------------------------------------ where */

typedef struct where_job {
    size_t es;
} where_job;

static void where_row(void *argp, char *const *p, const int64_t *s, int64_t n)
{
    const where_job *j = argp;
    const uint8_t *c = (const uint8_t *)p[1];
    if (j->es == 4 && s[0] == 1 && s[1] == 1 && s[2] == 1 && s[3] == 1) {
        uint32_t *o = (uint32_t *)p[0];
        const uint32_t *a = (const uint32_t *)p[2], *b = (const uint32_t *)p[3];
        for (int64_t i = 0; i < n; i++)
            o[i] = c[i] ? a[i] : b[i];
        return;
    }
    if (j->es == 4 && s[0] == 1 && s[1] == 1 && s[2] == 1 && s[3] == 0) {
        /* a gradient mask: select a tensor or a broadcast constant. Masks are close to
         * random, so the select is arithmetic (vectorized) rather than a branch. */
        uint32_t *o = (uint32_t *)p[0];
        const uint32_t *a = (const uint32_t *)p[2], bv = *(const uint32_t *)p[3];
        for (int64_t i = 0; i < n; i++) {
            uint32_t m = 0u - (uint32_t)(c[i] != 0);
            o[i] = (a[i] & m) | (bv & ~m);
        }
        return;
    }
    if (j->es == 4 && s[0] == 1) {
        /* other broadcasts, with the cond strided */
        uint32_t *o = (uint32_t *)p[0];
        const uint32_t *a = (const uint32_t *)p[2], *b = (const uint32_t *)p[3];
        int64_t sc = s[1], sa = s[2], sb = s[3];
        for (int64_t i = 0; i < n; i++) {
            uint32_t m = 0u - (uint32_t)(c[i * sc] != 0);
            o[i] = (a[i * sa] & m) | (b[i * sb] & ~m);
        }
        return;
    }
    int64_t es = (int64_t)j->es;
    for (int64_t i = 0; i < n; i++) {
        const char *src = c[i * s[1]] ? p[2] + i * s[2] * es : p[3] + i * s[3] * es;
        memcpy(p[0] + i * s[0] * es, src, (size_t)es);
    }
}

int kiln__cpu_where(void *vctx, const kiln_tdesc *out, const kiln_tdesc *cond, const kiln_tdesc *a,
                    const kiln_tdesc *b)
{
    if (a->dtype != out->dtype || b->dtype != out->dtype) {
        /* mixed dtypes: convert a and b to out's dtype first */
        kiln__cpu_ctx *ctx = vctx;
        struct kiln_buffer *ha = NULL, *hb = NULL;
        size_t nb = (size_t)kiln__cpu_numel(out) * kiln__cpu_esize(out->dtype) + 64;
        ha = kiln__cpu_buffer_get(ctx, nb);
        hb = kiln__cpu_buffer_get(ctx, nb);
        if (!ha || !hb) {
            kiln__cpu_buffer_put(ctx, ha);
            kiln__cpu_buffer_put(ctx, hb);
            return kiln__cpu_enomem("where");
        }
        kiln_tdesc ta, tb;
        kiln__cpu_desc_contig(&ta, ha, out->dtype, out->ndim, out->shape);
        kiln__cpu_desc_contig(&tb, hb, out->dtype, out->ndim, out->shape);
        kiln__cpu_copy(ctx, &ta, a);
        kiln__cpu_copy(ctx, &tb, b);
        int rc = kiln__cpu_where(ctx, out, cond, &ta, &tb);
        kiln__cpu_buffer_put(ctx, ha);
        kiln__cpu_buffer_put(ctx, hb);
        return rc;
    }
    where_job j = {kiln__cpu_esize(out->dtype)};
    kiln__cpu_iter it;
    const kiln_tdesc *ops[4] = {out, cond, a, b};
    kiln__cpu_iter_init(&it, 4, ops);
    kiln__cpu_iter_run(vctx, &it, 16384, where_row, &j);
    return 0;
}
