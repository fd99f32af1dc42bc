// where: out = cond ? a : b (slot 0 out/a/b, slot 1 the bool cond), bits copied as stored.
#version 450
#include "common.glsl"

KVK_PARAMS {
    KView out_v;
    KView c_v;
    KView a_v;
    KView b_v;
};
KVK_BUF_WO(1, S0, out_d);
KVK_BUF_RO(2, S1, c_d);
KVK_BUF_RO(3, S0, a_d);
KVK_BUF_RO(4, S0, b_d);

void main()
{
    KVK_FOR_EACH(i, out_v.numel) {
        bool c = c_d[kvk_at(c_v, i)] != S1(0);
        out_d[kvk_at(out_v, i)] = c ? a_d[kvk_at(a_v, i)] : b_d[kvk_at(b_v, i)];
    }
}
