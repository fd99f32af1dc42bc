#version 450
/*
 * conv-bwd-weight.comp — grad_w of a convolution, one workgroup per grad_w element
 * (o, c, kd, kh, kw): its threads split the (batch, output position) pairs, each sums
 * its share, and a tree in shared memory adds the partial sums, so the result does not
 * depend on timing. Workgroup ids past 65535 continue in gl_WorkGroupID.y.
 */
#include "nn-common.glsl"

layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Params {
    int N, C, O, Cg;
    int Og, pad0, pad1, pad2_;
    int in_[3], out_[3], k[3], stride[3], pad[3], dil[3];
    int total, base;
} P;
layout(std430, binding = 1) writeonly buffer GW { ELEM gw[]; };
layout(std430, binding = 2) readonly buffer X { ELEM x[]; };
layout(std430, binding = 3) readonly buffer GY { ELEM gy[]; };

shared ACC part[gl_WorkGroupSize.x];

void main()
{
    int idx = nn_group(P.base);
    if (idx >= P.total)
        return; /* uniform across the workgroup */
    int kw = idx % P.k[2];
    int t = idx / P.k[2];
    int kh = t % P.k[1];
    t /= P.k[1];
    int kd = t % P.k[0];
    t /= P.k[0];
    int cg = t % P.Cg;
    int oc = t / P.Cg;
    int grp = oc / P.Og;
    int c = grp * P.Cg + cg;
    int in_size = P.in_[0] * P.in_[1] * P.in_[2];
    int out_size = P.out_[0] * P.out_[1] * P.out_[2];
    ACC acc = ACC_ZERO;
    int work = P.N * out_size;
    for (int j = int(gl_LocalInvocationID.x); j < work; j += int(gl_WorkGroupSize.x)) {
        int n = j / out_size, opos = j % out_size;
        int ow = opos % P.out_[2];
        int oh = (opos / P.out_[2]) % P.out_[1];
        int od = opos / (P.out_[2] * P.out_[1]);
        int id = od * P.stride[0] - P.pad[0] + kd * P.dil[0];
        int ih = oh * P.stride[1] - P.pad[1] + kh * P.dil[1];
        int iw = ow * P.stride[2] - P.pad[2] + kw * P.dil[2];
        if (id < 0 || id >= P.in_[0] || ih < 0 || ih >= P.in_[1] || iw < 0 || iw >= P.in_[2])
            continue;
        acc += LD(x[(n * P.C + c) * in_size + (id * P.in_[1] + ih) * P.in_[2] + iw]) *
               LD(gy[(n * P.O + oc) * out_size + opos]);
    }
    part[gl_LocalInvocationID.x] = acc;
    barrier();
    for (uint s = gl_WorkGroupSize.x / 2; s > 0; s >>= 1) {
        if (gl_LocalInvocationID.x < s)
            part[gl_LocalInvocationID.x] += part[gl_LocalInvocationID.x + s];
        barrier();
    }
    if (gl_LocalInvocationID.x == 0)
        gw[idx] = ST(part[0]);
}
