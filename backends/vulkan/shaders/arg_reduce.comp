// arg_reduce: the index of the first max (IS_MAX) or min along a lane; NaN counts as the
// extreme (the first NaN wins). One workgroup per lane. Slot 0 is i64 out, slot 1 in.
#version 450
#include "common.glsl"

KVK_PARAMS {
    KView out_v;
    KView lane_v; // in with the reduced dim set to 1
    int len;
    int step;     // in's stride along the dim
};
KVK_BUF_WO(1, S0, out_d);
KVK_BUF_RO(2, S1, in_d);
KVK_SPEC(3, IS_MAX, 1);

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
    for (int l = int(gl_WorkGroupID.x); l < out_v.numel; l += int(gl_NumWorkGroups.x)) {
        int base = kvk_at(lane_v, l);
        VT best = LOADV(base);
        int bj = 0;
        for (int j = int(t); j < len; j += WG) {
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
        if (t == 0u) out_d[kvk_at(out_v, l)] = ST0(FROML0(int64_t(sj[0])));
        barrier();
    }
}
