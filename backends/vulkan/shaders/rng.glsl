// rng body: Philox draws into contiguous out, element i at counter offset + i (identical
// to common/philox.h). RNG_DOUBLE: the uniform and Bernoulli arithmetic in double, as
// the host's is; the normal's log and cos are float (GLSL has them in float only).
#include "common.glsl"

KVK_PARAMS {
    KView out_v;
    uint seed_lo, seed_hi, off_lo, off_hi;
    KScalar p0;
    KScalar p1;
};
KVK_BUF_WO(1, S0, out_d);
KVK_SPEC(3, KIND, 0);

#if RNG_DOUBLE
#define RT double
#define P0 packDouble2x32(uvec2(p0.dlo, p0.dhi))
#define P1 packDouble2x32(uvec2(p1.dlo, p1.dhi))
#else
#define RT float
#define P0 p0.f
#define P1 p1.f
#endif

RT u01(uint hi, uint lo)
{
    uint64_t bits = ((uint64_t(hi) << 21) ^ uint64_t(lo >> 11)) & ((1ul << 53) - 1ul);
    return RT(bits) * RT(1.0 / 9007199254740992.0);
}

void main()
{
    uint64_t off = packUint2x32(uvec2(off_lo, off_hi));
    KVK_FOR_EACH(i, out_v.numel) {
        uint64_t c = off + uint64_t(i);
        uvec4 r = kvk_philox(unpackUint2x32(c), uvec2(seed_lo, seed_hi));
        int o = kvk_at(out_v, i);
        if (KIND == 0u) {
            // precise: no fused multiply-add, so the draw rounds as the reference computes it
            precise RT v = P0 + (P1 - P0) * u01(r.x, r.y);
            out_d[o] = ST0(FROMF0(v));
        } else if (KIND == 1u) {
            RT u1 = u01(r.x, r.y), u2 = u01(r.z, r.w);
#if RNG_DOUBLE
            u1 = max(u1, 1e-300LF);
            RT n = sqrt(-2.0LF * kd_log(u1)) * kd_cos(6.283185307179586476925LF * u2);
#else
            float f1 = max(float(u1), 1e-30);
            RT n = RT(sqrt(-2.0 * log(f1)) * cos(6.283185307179586 * float(u2)));
#endif
            out_d[o] = ST0(FROMF0(P0 + P1 * n));
        } else if (KIND == 2u) {
            out_d[o] = ST0(FROML0(u01(r.x, r.y) < P0 ? 1l : 0l));
        } else {
            int64_t lo = KVK_SCALAR_i64(p0), hi = KVK_SCALAR_i64(p1);
            int64_t v = lo;
            if (hi > lo) {
                uint64_t range = uint64_t(hi - lo);
                uint64_t x = (uint64_t(r.x) << 32) | uint64_t(r.y);
                v = lo + int64_t(x % range);
            }
            out_d[o] = ST0(FROML0(v));
        }
    }
}
