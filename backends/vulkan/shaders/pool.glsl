/*
 * pool.glsl — max or average pooling, one thread per output element, over 1-3 spatial
 * dims padded on the left to three; every leading dim is a "plane". PyTorch's rules, as
 * the ref backend states them: max keeps the window's first position and replaces it on
 * v > max or NaN (the last NaN wins), and reports the flat index within the input plane
 * (an i64, written as two 32-bit halves so no 64-bit integer support is needed); avg
 * divides by the window clipped to [-pad, in + pad) with count_include_pad, else to
 * [0, in). x and out are contiguous. Average windows are summed in SUM: ACC in pool.comp,
 * double in pool-acc64.comp (used where the device has shaderFloat64).
 */
#ifndef SUM
#define SUM ACC
#endif

layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Params {
    int in_[3], out_[3], k[3], stride[3], pad[3], dil[3];
    int is_max, count_include_pad, has_indices, total;
    int base, pad0, pad1, pad2_;
} P;
layout(std430, binding = 1) writeonly buffer Out { ELEM o[]; };
layout(std430, binding = 2) writeonly buffer Idx { uint ind[]; };
layout(std430, binding = 3) readonly buffer X { ELEM x[]; };

void main()
{
    int idx = nn_item(P.base);
    if (idx >= P.total)
        return;
    int on = P.out_[0] * P.out_[1] * P.out_[2], in_n = P.in_[0] * P.in_[1] * P.in_[2];
    int plane = idx / on, i = idx % on;
    int oc[3];
    oc[2] = i % P.out_[2];
    oc[1] = (i / P.out_[2]) % P.out_[1];
    oc[0] = i / (P.out_[2] * P.out_[1]);
    int xbase = plane * in_n;
    if (P.is_max != 0) {
        int first[3], last[3];
        for (int d = 0; d < 3; d++) {
            first[d] = oc[d] * P.stride[d] - P.pad[d];
            last[d] = min(first[d] + (P.k[d] - 1) * P.dil[d] + 1, P.in_[d]);
            while (first[d] < 0)
                first[d] += P.dil[d];
        }
        int best = (first[0] * P.in_[1] + first[1]) * P.in_[2] + first[2];
        ACC m = ACC_ZERO;
        bool have = false;
        for (int i0 = first[0]; i0 < last[0]; i0 += P.dil[0])
            for (int i1 = first[1]; i1 < last[1]; i1 += P.dil[1])
                for (int i2 = first[2]; i2 < last[2]; i2 += P.dil[2]) {
                    int at = (i0 * P.in_[1] + i1) * P.in_[2] + i2;
                    ACC v = LD(x[xbase + at]);
                    if (!have || v > m || isnan(v)) {
                        /* the first element always replaces -inf in the reference,
                         * unless it is -inf itself: then the index stays first */
                        if (have || v > ACC(-1.0 / 0.0) || isnan(v))
                            best = at;
                        m = v;
                        have = true;
                    }
                }
        if (!have)
            m = ACC(-1.0 / 0.0);
        o[idx] = ST(m);
        if (P.has_indices != 0) {
            ind[2 * idx] = uint(best);
            ind[2 * idx + 1] = best < 0 ? 0xffffffffu : 0u;
        }
    } else {
        int lo[3], hi[3];
        float full = 1.0, clipped = 1.0;
        for (int d = 0; d < 3; d++) {
            int start = oc[d] * P.stride[d] - P.pad[d];
            int end = min(start + P.k[d], P.in_[d] + P.pad[d]);
            full *= float(end - start);
            lo[d] = max(start, 0);
            hi[d] = min(end, P.in_[d]);
            clipped *= float(hi[d] - lo[d]);
        }
        /* summed in window order in SUM (double in pool-acc64.comp), as the reference
         * does: a window mixing huge and ordinary values rounds the same way */
        SUM s = SUM(0);
        for (int i0 = lo[0]; i0 < hi[0]; i0++)
            for (int i1 = lo[1]; i1 < hi[1]; i1++)
                for (int i2 = lo[2]; i2 < hi[2]; i2++)
                    s += SUM(LD(x[xbase + (i0 * P.in_[1] + i1) * P.in_[2] + i2]));
        o[idx] = ST(ACC(s / SUM(P.count_include_pad != 0 ? full : clipped)));
    }
}
