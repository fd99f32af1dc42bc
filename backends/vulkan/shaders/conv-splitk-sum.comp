#version 450
/*
 * conv-splitk-sum.comp — the weight gradient from conv-gemm.comp's split-K partial sums:
 * gw[i] = part[0][i] + part[1][i] + ... in split order (a fixed order, so the result does
 * not depend on timing), rounded once to the dtype.
 */
#include "nn-common.glsl"

layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Params {
    int n, splits;
} P;
layout(std430, binding = 1) writeonly buffer GW { ELEM gw[]; };
layout(std430, binding = 2) readonly buffer Part { ACC part[]; };

void main()
{
    int i = nn_item(0);
    if (i >= P.n)
        return;
    ACC s = ACC_ZERO;
    for (int k = 0; k < P.splits; k++)
        s += part[k * P.n + i];
    gw[i] = ST(s);
}
