// arange body: out[i] = start + i * step over out's flat index, in double where
// ARANGE_DOUBLE (the device has shaderFloat64, as ref's arithmetic is double) else float.
#include "common.glsl"

KVK_PARAMS {
    KView out_v;
    KScalar start;
    KScalar step;
};
KVK_BUF_WO(1, S0, out_d);

void main()
{
    KVK_FOR_EACH(i, out_v.numel) {
#if ARANGE_DOUBLE
        double v = packDouble2x32(uvec2(start.dlo, start.dhi)) + double(i) * packDouble2x32(uvec2(step.dlo, step.dhi));
#else
        float v = start.f + float(i) * step.f;
#endif
        out_d[kvk_at(out_v, i)] = ST0(FROMF0(v));
    }
}
