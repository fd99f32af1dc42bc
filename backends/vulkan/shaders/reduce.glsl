// reduce: one workgroup per output element; its threads stride over the reduced
// elements and combine in shared memory. Slot 0 out, slot 1 in; OP is kiln_reduce_op.
// A sum of few outputs over many elements splits (vk-reduce.c): with splits > 1, workgroup
// g sums elements [s * chunk, (s + 1) * chunk) of output g / splits (s = g % splits) into
// slot 0's element g, a contiguous scratch of partial sums; a second dispatch then reduces
// each output's partials in order, dividing a mean by divisor (the whole run's length).
// Integer in and out with sum/prod/max/min run in int64 (wrapping); everything else in
// FT (double when a slot is f64, else float), var/std in two passes over the data.
#include "common.glsl"
#if KVK_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif

KVK_PARAMS {
    KView out_v;
    KView outer_v; // in, reduced dims collapsed to 1: the base of each output's elements
    KView inner_v; // in, kept dims collapsed to 1, offset 0: the reduced elements
    KScalar param;
    int splits;  // 1, or the split pass's partial sums per output
    int chunk;   // elements each partial sum covers (the whole run when not split)
    int divisor; // a mean's count when it is not the run's length (0: the run's length)
};
KVK_BUF_WO(1, S0, out_d);
KVK_BUF_RO(2, S1, in_d);
KVK_SPEC(3, OP, 0);

#define WG 128
#if KVK_DOUBLE
#define FT double
#define FP packDouble2x32(uvec2(param.dlo, param.dhi))
#else
#define FT float
#define FP param.f
#endif
#if KVK_DOUBLE
#define R_EXP(x) kd_exp(x)
#define R_LOG(x) kd_log(x)
#define R_POW(x, y) kd_pow(x, y)
#else
#define R_EXP(x) exp(x)
#define R_LOG(x) kvk_log(x)
#define R_POW(x, y) pow(x, y)
#endif
#define FINF FT(uintBitsToFloat(0x7f800000u))

shared FT sf[WG];
shared int64_t si[WG];

#if KVK_F1
#define LOADF(off) FT(LD1(in_d[off]))
#else
#define LOADF(off) FT(TOL1(LD1(in_d[off])))
#endif


FT combine_f(uint op, FT a, FT b)
{
    if (op == 3u) return isnan(a) ? a : (isnan(b) ? b : (b > a ? b : a));
    if (op == 4u) return isnan(a) ? a : (isnan(b) ? b : (b < a ? b : a));
    if (op == 2u) return a * b;
    if (op == 10u) return (a != FT(0) && b != FT(0)) ? FT(1) : FT(0);
    if (op == 9u) return (a != FT(0) || b != FT(0)) ? FT(1) : FT(0);
    if (op == 100u) return isnan(a) ? a : (isnan(b) ? b : max(a, b)); // max magnitude (norm inf)
    if (op == 101u) return isnan(a) ? a : (isnan(b) ? b : min(a, b)); // min magnitude (norm -inf)
    return a + b;
}

FT tree_f(uint op, FT v)
{
    uint t = gl_LocalInvocationID.x;
#if KVK_SUBGROUP
    if (op == 0u) {
        // sums: each subgroup adds in registers, then the subgroups' partial sums meet
        // in shared memory (max/min keep the tree: NaN order is not the subgroup's)
        FT part = subgroupAdd(v);
        if (subgroupElect()) sf[gl_SubgroupID] = part;
        barrier();
        FT r = FT(0);
        for (uint k = 0u; k < gl_NumSubgroups; k++) r += sf[k];
        barrier();
        return r;
    }
#endif
    sf[t] = v;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (t < s) sf[t] = combine_f(op, sf[t], sf[t + s]);
        barrier();
    }
    FT r = sf[0];
    barrier();
    return r;
}

int64_t tree_i(uint op, int64_t v)
{
    uint t = gl_LocalInvocationID.x;
    si[t] = v;
    barrier();
    for (uint s = WG / 2u; s > 0u; s >>= 1) {
        if (t < s) {
            int64_t a = si[t], b = si[t + s];
            si[t] = op == 2u ? a * b : op == 3u ? (b > a ? b : a) : op == 4u ? (b < a ? b : a) : a + b;
        }
        barrier();
    }
    int64_t r = si[0];
    barrier();
    return r;
}

void main()
{
    uint t = gl_LocalInvocationID.x;
    int nsplit = splits > 1 ? splits : 1;
    int total = outer_v.numel * nsplit;
    for (int g = int(gl_WorkGroupID.x); g < total; g += int(gl_NumWorkGroups.x)) {
        int o = g / nsplit;
        int lo = (g - o * nsplit) * chunk;
        int n = min(inner_v.numel - lo, chunk); // this workgroup's elements: lo .. hi - 1
        int hi = lo + n;
        int base = kvk_at(outer_v, o);
        int dst = nsplit > 1 ? g : kvk_at(out_v, o);
#if KVK_F0 == 0 && KVK_F1 == 0
        if (OP == 0u || OP == 2u || OP == 3u || OP == 4u) {
            int64_t acc = OP == 2u ? 1l : (OP == 0u ? 0l : TOL1(LD1(in_d[base])));
            for (int i = lo + int(t); i < hi; i += WG) {
                int64_t v = TOL1(LD1(in_d[base + kvk_at(inner_v, i)]));
                acc = OP == 2u ? acc * v : OP == 3u ? (v > acc ? v : acc) : OP == 4u ? (v < acc ? v : acc) : acc + v;
            }
            int64_t r = tree_i(OP, acc);
            if (t == 0u) out_d[dst] = ST0(FROML0(r));
            continue;
        }
#endif
        FT r;
        if (OP == 0u || OP == 1u || OP == 2u || OP == 9u || OP == 10u || OP == 3u || OP == 4u) {
            uint op = OP == 1u ? 0u : OP;
            FT acc = op == 2u || op == 10u ? FT(1) : FT(0);
            if ((op == 3u || op == 4u) && n > 0) acc = LOADF(base);
            for (int i = lo + int(t); i < hi; i += WG) {
                FT v = LOADF(base + kvk_at(inner_v, i));
                if (op == 9u || op == 10u) v = v != FT(0) || isnan(v) ? FT(1) : FT(0);
                acc = combine_f(op, acc, v);
            }
            r = tree_f(op, acc);
            if (OP == 1u) r = r / FT(divisor > 0 ? divisor : n);
        } else if (OP == 5u || OP == 6u) {
            FT acc = FT(0);
            for (int i = lo + int(t); i < hi; i += WG) acc += LOADF(base + kvk_at(inner_v, i));
            FT mean = tree_f(0u, acc) / FT(n);
            FT m2 = FT(0);
            for (int i = lo + int(t); i < hi; i += WG) {
                FT d = LOADF(base + kvk_at(inner_v, i)) - mean;
                m2 += d * d;
            }
            m2 = tree_f(0u, m2);
            FT denom = FT(n) - FP;
            FT var = m2 / (denom > FT(0) ? denom : FT(0));
            r = OP == 5u ? var : sqrt(var);
        } else if (OP == 7u) {
            FT m = -FINF;
            for (int i = lo + int(t); i < hi; i += WG) {
                FT v = LOADF(base + kvk_at(inner_v, i));
                m = isnan(m) ? m : (isnan(v) ? v : max(m, v));
            }
            m = tree_f(100u, m);
            if (isnan(m)) {
                r = m;
            } else {
                if (isinf(m)) m = FT(0);
                FT s = FT(0);
                for (int i = lo + int(t); i < hi; i += WG) s += R_EXP(LOADF(base + kvk_at(inner_v, i)) - m);
                s = tree_f(0u, s);
                r = R_LOG(s) + m;
            }
        } else {
            // norm, p = param
            FT p = FP;
            if (isinf(p)) {
                FT acc = p > FT(0) ? FT(0) : FINF;
                uint op = p > FT(0) ? 100u : 101u;
                for (int i = lo + int(t); i < hi; i += WG) acc = combine_f(op, acc, abs(LOADF(base + kvk_at(inner_v, i))));
                r = n == 0 ? FT(0) : tree_f(op, acc);
            } else {
                FT acc = FT(0);
                for (int i = lo + int(t); i < hi; i += WG) {
                    FT a = abs(LOADF(base + kvk_at(inner_v, i)));
                    acc += p == FT(0) ? (a != FT(0) || isnan(a) ? FT(1) : FT(0)) : p == FT(1) ? a : p == FT(2) ? a * a : R_POW(a, p);
                }
                acc = tree_f(0u, acc);
                r = p == FT(0) || p == FT(1) ? acc : p == FT(2) ? sqrt(acc) : R_POW(acc, FT(1) / p);
            }
        }
        if (t == 0u) {
#if KVK_F0
            out_d[dst] = ST0(C0(r));
#else
            out_d[dst] = ST0(FROMF0(r));
#endif
        }
    }
}
