// scatter (MODE 0: index has src's layout, out[c with c[dim] = index[c]] = / += src[c])
// and index_add (MODE 1: out[c with c[dim] = index[c[dim]]] += src[c]). One thread per
// line along dim, in order, so duplicates resolve as on the host (last write wins; sums
// in index order); a long line is walked by several dispatches in turn, each taking the
// positions [k0, k1) (vk-index.c), so no invocation's loop outgrows the driver's limit.
// Out-of-range indices (after one wrap) are skipped. Slot 0 out and src, slot 1 the index.
#version 450
#include "common.glsl"

KVK_PARAMS {
    KView line_v; // the iteration shape with dim sized 1
    KView out_v;
    KView src_v;
    KView idx_v;
    int dim;
    int len;  // the iteration shape's size along dim
    int size; // out.shape[dim]
    int k0;   // the positions along dim this dispatch walks: [k0, k1)
    int k1;
};
KVK_BUF_RW(1, S0, out_d);
KVK_BUF_RO(2, S0, src_d);
KVK_BUF_RO(3, S1, idx_d);
KVK_SPEC(3, MODE, 0);
KVK_SPEC(4, ACCUMULATE, 0);

void main()
{
    KVK_FOR_EACH(l, line_v.numel) {
        int c[KVK_MAX_DIMS];
        kvk_coords(line_v, l, c);
        for (int k = k0; k < k1; k++) {
            c[dim] = k;
            int64_t j = MODE == 0u ? TOL1(LD1(idx_d[kvk_off(idx_v, c)])) : TOL1(LD1(idx_d[idx_v.offset + k * idx_v.strides[0]]));
            if (j < 0l) j += int64_t(size);
            if (j < 0l || j >= int64_t(size)) continue;
            int s = kvk_off(src_v, c);
            c[dim] = int(j);
            int o = kvk_off(out_v, c);
            c[dim] = k;
            if (ACCUMULATE != 0u) {
#if KVK_F0
#if KVK_DOUBLE
                out_d[o] = ST0(C0(double(LD0(out_d[o])) + double(LD0(src_d[s]))));
#else
                out_d[o] = ST0(C0(LD0(out_d[o]) + LD0(src_d[s])));
#endif
#else
                out_d[o] = ST0(FROML0(TOL0(LD0(out_d[o])) + TOL0(LD0(src_d[s]))));
#endif
            } else {
                out_d[o] = src_d[s];
            }
        }
    }
}
