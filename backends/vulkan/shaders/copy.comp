// copy: out[i] = convert(in[i]) over two views of one shape (slot 0 out, slot 1 in).
#version 450
#include "common.glsl"

KVK_PARAMS {
    KView out_v;
    KView in_v;
};
KVK_BUF_WO(1, S0, out_d);
KVK_BUF_RO(2, S1, in_d);

void main()
{
    KVK_FOR_EACH(i, out_v.numel) {
        C1 x = LD1(in_d[kvk_at(in_v, i)]);
#if KVK_F1
        out_d[kvk_at(out_v, i)] = ST0(FROMF0(x));
#else
        out_d[kvk_at(out_v, i)] = ST0(FROML0(TOL1(x)));
#endif
    }
}
