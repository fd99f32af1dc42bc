// fill: out[i] = value, over out's (possibly strided) view.
#version 450
#include "common.glsl"

KVK_PARAMS {
    KView out_v;
    KScalar value;
};
KVK_BUF_WO(1, S0, out_d);

void main()
{
    S0 v = ST0(KVK_SCALAR_C0(value));
    KVK_FOR_EACH(i, out_v.numel)
        out_d[kvk_at(out_v, i)] = v;
}
