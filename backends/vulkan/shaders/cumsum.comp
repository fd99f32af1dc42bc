// cumsum: one thread per lane, in order along the dim (float dtypes accumulate in FT,
// integers in int64 wrapping). Slot 0 out, slot 1 in.
#version 450
#include "common.glsl"

KVK_PARAMS {
    KView out_lane;
    KView in_lane;
    int len;
    int out_step;
    int in_step;
};
KVK_BUF_WO(1, S0, out_d);
KVK_BUF_RO(2, S1, in_d);

void main()
{
    KVK_FOR_EACH(l, out_lane.numel) {
        int ob = kvk_at(out_lane, l), ib = kvk_at(in_lane, l);
#if KVK_F0
#if KVK_DOUBLE
#define CT double
#else
#define CT float
#endif
        CT s = CT(0);
        for (int j = 0; j < len; j++) {
#if KVK_F1
            s += CT(LD1(in_d[ib + j * in_step]));
#else
            s += CT(TOL1(LD1(in_d[ib + j * in_step])));
#endif
            out_d[ob + j * out_step] = ST0(C0(s));
        }
#else
        int64_t s = 0l;
        for (int j = 0; j < len; j++) {
#if KVK_F1
            s += kvk_f2l(LD1(in_d[ib + j * in_step]));
#else
            s += TOL1(LD1(in_d[ib + j * in_step]));
#endif
            out_d[ob + j * out_step] = ST0(FROML0(s));
        }
#endif
    }
}
