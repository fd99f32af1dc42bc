// arg_reduce: the index of the first max (IS_MAX) or min along a lane; NaN counts as the
// extreme (the first NaN wins). One workgroup per lane, or, for a lane longer than the
// host's chunk (vk-reduce.c), one per chunk of it: PASS_CHUNKS then writes each chunk's
// pick into slot 0 (picks of lane l at l * splits ...), and PASS_PICKS picks among them,
// reading their values again, so ties still go to the first index. No thread's loop grows
// past chunk / WG, whatever the lane's length. Slot 0 is i64 out, slot 1 in.
#version 450
#include "common.glsl"

KVK_PARAMS {
    KView out_v;
    KView lane_v; // in with the reduced dim set to 1
    int len;
    int step;     // in's stride along the dim
    int splits;   // chunks per lane (1: the lane is one chunk)
    int chunk;    // elements per chunk
};
KVK_BUF_WO(1, S0, out_d);
KVK_BUF_RO(2, S1, in_d);
KVK_BUF_RO(3, int64_t, picks_d);
KVK_SPEC(3, IS_MAX, 1);
KVK_SPEC(4, PASS, 0);

#define PASS_CHUNKS 0u
#define PASS_PICKS 1u
#define WG 128
#if KVK_F1
#if KVK_DOUBLE
#define VT double
#else
#define VT float
#endif
#define LOADV(o) VT(LD1(in_d[o]))
#else
#define VT int64_t
#define LOADV(o) TOL1(LD1(in_d[o]))
#endif

shared VT sv[WG];
shared int sj[WG];

// does (v, j) go before (w, k)?
bool better(VT v, int j, VT w, int k)
{
#if KVK_F1
    if (isnan(w)) return isnan(v) && j < k;
    if (isnan(v)) return true;
#endif
    if (v == w) return j < k;
    return IS_MAX != 0u ? v > w : v < w;
}

void main()
{
    uint t = gl_LocalInvocationID.x;
    int total = out_v.numel * (PASS == PASS_PICKS ? 1 : splits);
    for (int g = int(gl_WorkGroupID.x); g < total; g += int(gl_NumWorkGroups.x)) {
        int l = PASS == PASS_PICKS ? g : g / splits;
        int base = kvk_at(lane_v, l);
        // candidates c in [lo, hi): elements of the chunk, or the lane's chunk picks
        int lo = PASS == PASS_PICKS ? 0 : (g - l * splits) * chunk;
        int hi = PASS == PASS_PICKS ? splits : min(len, lo + chunk);
        int bj = PASS == PASS_PICKS ? int(picks_d[l * splits]) : lo;
        VT best = LOADV(base + bj * step);
        for (int c = lo + int(t); c < hi; c += WG) {
            int j = PASS == PASS_PICKS ? int(picks_d[l * splits + c]) : c;
            VT v = LOADV(base + j * step);
            if (better(v, j, best, bj)) {
                best = v;
                bj = j;
            }
        }
        sv[t] = best;
        sj[t] = bj;
        barrier();
        for (uint s = WG / 2u; s > 0u; s >>= 1) {
            if (t < s && better(sv[t + s], sj[t + s], sv[t], sj[t])) {
                sv[t] = sv[t + s];
                sj[t] = sj[t + s];
            }
            barrier();
        }
        if (t == 0u)
            out_d[PASS == PASS_CHUNKS && splits > 1 ? g : kvk_at(out_v, l)] = ST0(FROML0(int64_t(sj[0])));
        barrier();
    }
}
