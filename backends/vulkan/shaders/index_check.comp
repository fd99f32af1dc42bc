// index_check: a device-side range check. PASS 0 finds the first (lowest flat index)
// element outside [lo, hi) with an atomic max of its complement; PASS 1 has that element
// write its value, so the report names the same element the host would. The check
// buffer holds 4 words per slot: the complemented index + 1 (0: none), unused, and the
// value's low and high words. Slot 0 is the index dtype.
#version 450
#include "common.glsl"

KVK_PARAMS {
    KView idx_v;
    uint slot;
    uint lo_lo, lo_hi, hi_lo, hi_hi;
};
KVK_BUF_RO(1, S0, idx_d);
layout(std430, set = 0, binding = 2) buffer KCheck { uint check[]; };
KVK_SPEC(3, PASS, 0);

void main()
{
    int64_t lo = int64_t(packUint2x32(uvec2(lo_lo, lo_hi))), hi = int64_t(packUint2x32(uvec2(hi_lo, hi_hi)));
    KVK_FOR_EACH(i, idx_v.numel) {
        int64_t v = TOL0(LD0(idx_d[kvk_at(idx_v, i)]));
        if (v < lo || v >= hi) {
            uint mark = 0xffffffffu - uint(i);
            if (PASS == 0u) {
                atomicMax(check[4u * slot], mark);
            } else if (check[4u * slot] == mark) {
                uvec2 w = unpackUint2x32(uint64_t(v));
                check[4u * slot + 2u] = w.x;
                check[4u * slot + 3u] = w.y;
            }
        }
    }
}
