// pad: out[c] = in[c - lo] inside, else value (MODE 0, constant), the reflection
// (MODE 1) or the nearest edge (MODE 2). lo may be negative (a crop). Slot 0.
#version 450
#include "common.glsl"

KVK_PARAMS {
    KView out_v;
    KView in_v;
    int lo[KVK_MAX_DIMS];
    KScalar value;
};
KVK_BUF_WO(1, S0, out_d);
KVK_BUF_RO(2, S0, in_d);
KVK_SPEC(3, MODE, 0);

void main()
{
    KVK_FOR_EACH(i, out_v.numel) {
        int c[KVK_MAX_DIMS];
        kvk_coords(out_v, i, c);
        int o = kvk_off(out_v, c);
        bool inside = true;
        for (int d = 0; d < out_v.ndim; d++) {
            int s = c[d] - lo[d], len = in_v.shape[d];
            if (s < 0 || s >= len) {
                if (MODE == 0u) inside = false;
                else if (MODE == 1u) s = s < 0 ? -s : 2 * (len - 1) - s;
                else s = s < 0 ? 0 : len - 1;
            }
            c[d] = s;
        }
        if (inside) out_d[o] = in_d[kvk_off(in_v, c)];
        else out_d[o] = ST0(KVK_SCALAR_C0(value));
    }
}
