// gather (MODE 0): out[c] = in[c with c[dim] = index[c]]; index_select (MODE 1):
// out[c] = in[c with c[dim] = index[c[dim]]] over a 1-D index. Negative indices wrap
// once; one still out of range is clamped (its error comes from index_check).
// Slot 0 out and in, slot 1 the index.
#version 450
#include "common.glsl"

KVK_PARAMS {
    KView out_v;
    KView in_v;
    KView idx_v;
    int dim;
    int size; // in.shape[dim]
};
KVK_BUF_WO(1, S0, out_d);
KVK_BUF_RO(2, S0, in_d);
KVK_BUF_RO(3, S1, idx_d);
KVK_SPEC(3, MODE, 0);

void main()
{
    KVK_FOR_EACH(i, out_v.numel) {
        int c[KVK_MAX_DIMS];
        kvk_coords(out_v, i, c);
        int o = kvk_off(out_v, c);
        int64_t j = MODE == 0u ? TOL1(LD1(idx_d[kvk_off(idx_v, c)])) : TOL1(LD1(idx_d[idx_v.offset + c[dim] * idx_v.strides[0]]));
        if (j < 0l) j += int64_t(size);
        c[dim] = int(clamp(j, 0l, int64_t(max(size - 1, 0))));
        out_d[o] = in_d[kvk_off(in_v, c)];
    }
}
