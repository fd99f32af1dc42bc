#version 450
/*
 * pool-bwd.comp — the input gradient of pool.comp, one thread per grad_x element: it
 * visits the outputs whose window can reach it and adds their gradient (max: where the
 * output's index names this element; avg: the output's gradient over its divisor).
 * Gathering instead of scattering needs no atomics, writes every element once and sums
 * in a fixed order. grad_out and indices are contiguous; indices are read as the low
 * halves of their i64 values.
 */
#include "nn-common.glsl"

layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Params {
    int in_[3], out_[3], k[3], stride[3], pad[3], dil[3];
    int is_max, count_include_pad, has_indices, total;
    int base, pad0, pad1, pad2_;
} P;
layout(std430, binding = 1) writeonly buffer GX { ELEM gx[]; };
layout(std430, binding = 2) readonly buffer GY { ELEM gy[]; };
layout(std430, binding = 3) readonly buffer Idx { uint ind[]; };

/* the outputs o along one dim whose window [o*s - p, o*s - p + (k-1)*d] holds i */
void out_range(int d, int i, out int lo, out int hi)
{
    int reach = (P.k[d] - 1) * (P.is_max != 0 ? P.dil[d] : 1);
    int num = i + P.pad[d] - reach;
    lo = num <= 0 ? 0 : (num + P.stride[d] - 1) / P.stride[d];
    hi = min((i + P.pad[d]) / P.stride[d], P.out_[d] - 1);
}

void main()
{
    int idx = nn_item(P.base);
    if (idx >= P.total)
        return;
    int on = P.out_[0] * P.out_[1] * P.out_[2], in_n = P.in_[0] * P.in_[1] * P.in_[2];
    int plane = idx / in_n, at = idx % in_n;
    int ic[3];
    ic[2] = at % P.in_[2];
    ic[1] = (at / P.in_[2]) % P.in_[1];
    ic[0] = at / (P.in_[2] * P.in_[1]);
    int lo[3], hi[3];
    for (int d = 0; d < 3; d++)
        out_range(d, ic[d], lo[d], hi[d]);
    ACC acc = ACC_ZERO;
    int gbase = plane * on;
    for (int o0 = lo[0]; o0 <= hi[0]; o0++)
        for (int o1 = lo[1]; o1 <= hi[1]; o1++)
            for (int o2 = lo[2]; o2 <= hi[2]; o2++) {
                int oi = gbase + (o0 * P.out_[1] + o1) * P.out_[2] + o2;
                if (P.is_max != 0) {
                    if (int(ind[2 * oi]) == at && ind[2 * oi + 1] == 0u)
                        acc += LD(gy[oi]);
                    continue;
                }
                int oc[3] = int[3](o0, o1, o2);
                float full = 1.0, clipped = 1.0;
                bool inside = true;
                for (int d = 0; d < 3; d++) {
                    int start = oc[d] * P.stride[d] - P.pad[d];
                    int end = min(start + P.k[d], P.in_[d] + P.pad[d]);
                    full *= float(end - start);
                    clipped *= float(min(end, P.in_[d]) - max(start, 0));
                    inside = inside && ic[d] >= start && ic[d] < end;
                }
                if (inside)
                    acc += LD(gy[oi]) / ACC(P.count_include_pad != 0 ? full : clipped);
            }
    gx[idx] = ST(acc);
}
