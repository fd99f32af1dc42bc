// sort: stable sort along a dim by rank: element j of a lane goes to position
// #{k before j} + #{k < j tied with j}, with NaN after every number (ascending; the whole
// order reversed for descending, as the host's merge sort). One workgroup per lane,
// O(len^2) comparisons, which suits the lane lengths sort sees. Slot 0 is values and in,
// slot 1 the i64 indices. HAS_VALUES / HAS_INDICES say which outputs exist.
#version 450
#include "common.glsl"

KVK_PARAMS {
    KView in_lane;
    KView val_lane;
    KView idx_lane;
    int len;
    int in_step;
    int val_step;
    int idx_step;
};
KVK_BUF_RO(1, S0, in_d);
KVK_BUF_WO(2, S0, val_d);
KVK_BUF_WO(3, S1, idx_d);
KVK_SPEC(3, DESCENDING, 0);
KVK_SPEC(4, HAS_VALUES, 1);
KVK_SPEC(5, HAS_INDICES, 1);

#if KVK_F0
#if KVK_DOUBLE
#define VT double
#else
#define VT float
#endif
#define LOADV(o) VT(LD0(in_d[o]))
#else
#define VT int64_t
#define LOADV(o) TOL0(LD0(in_d[o]))
#endif

// strict ascending "a before b", NaN last
bool asc_before(VT a, VT b)
{
#if KVK_F0
    if (isnan(a)) return false;
    if (isnan(b)) return true;
#endif
    return a < b;
}
bool before(VT a, VT b) { return DESCENDING != 0u ? asc_before(b, a) : asc_before(a, b); }

void main()
{
    for (int l = int(gl_WorkGroupID.x); l < in_lane.numel; l += int(gl_NumWorkGroups.x)) {
        int ib = kvk_at(in_lane, l);
        for (int j = int(gl_LocalInvocationID.x); j < len; j += int(gl_WorkGroupSize.x)) {
            VT v = LOADV(ib + j * in_step);
            int rank = 0;
            for (int k = 0; k < len; k++) {
                VT w = LOADV(ib + k * in_step);
                if (before(w, v) || (k < j && !before(v, w))) rank++;
            }
            if (HAS_VALUES != 0u) val_d[kvk_at(val_lane, l) + rank * val_step] = in_d[ib + j * in_step];
            if (HAS_INDICES != 0u) idx_d[kvk_at(idx_lane, l) + rank * idx_step] = ST1(int64_t(j));
        }
    }
}
