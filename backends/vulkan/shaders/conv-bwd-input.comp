#version 450
/*
 * conv-bwd-input.comp — grad_x of a convolution, one thread per grad_x element: the sum
 * over the output positions and kernel taps that read it (the adjoint of conv.comp),
 * so every element is written once and nothing needs zeroing or atomics. Also the
 * forward of a transposed convolution; grad_x's sizes come from grad_x itself, so an
 * output_padding row that no tap reaches gets 0.
 */
#include "nn-common.glsl"

layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Params {
    int N, C, O, Cg;
    int Og, pad0, pad1, pad2_;
    int in_[3], out_[3], k[3], stride[3], pad[3], dil[3];
    int total, base;
} P;
layout(std430, binding = 1) writeonly buffer GX { ELEM gx[]; };
layout(std430, binding = 2) readonly buffer GY { ELEM gy[]; };
layout(std430, binding = 3) readonly buffer W { ELEM w[]; };

void main()
{
    int idx = nn_item(P.base);
    if (idx >= P.total)
        return;
    int iw = idx % P.in_[2];
    int t = idx / P.in_[2];
    int ih = t % P.in_[1];
    t /= P.in_[1];
    int id = t % P.in_[0];
    t /= P.in_[0];
    int c = t % P.C;
    int n = t / P.C;
    int grp = c / P.Cg, cg = c % P.Cg;
    int out_size = P.out_[0] * P.out_[1] * P.out_[2];
    int k_size = P.k[0] * P.k[1] * P.k[2];
    ACC acc = ACC_ZERO;
    for (int kd = 0; kd < P.k[0]; kd++) {
        int sd = id + P.pad[0] - kd * P.dil[0];
        if (sd < 0 || sd % P.stride[0] != 0 || sd / P.stride[0] >= P.out_[0])
            continue;
        int od = sd / P.stride[0];
        for (int kh = 0; kh < P.k[1]; kh++) {
            int sh = ih + P.pad[1] - kh * P.dil[1];
            if (sh < 0 || sh % P.stride[1] != 0 || sh / P.stride[1] >= P.out_[1])
                continue;
            int oh = sh / P.stride[1];
            for (int kw = 0; kw < P.k[2]; kw++) {
                int sw = iw + P.pad[2] - kw * P.dil[2];
                if (sw < 0 || sw % P.stride[2] != 0 || sw / P.stride[2] >= P.out_[2])
                    continue;
                int ow = sw / P.stride[2];
                int opos = (od * P.out_[1] + oh) * P.out_[2] + ow;
                int tap = (kd * P.k[1] + kh) * P.k[2] + kw;
                for (int og = 0; og < P.Og; og++) {
                    int oc = grp * P.Og + og;
                    acc += LD(gy[(n * P.O + oc) * out_size + opos]) * LD(w[(oc * P.Cg + cg) * k_size + tap]);
                }
            }
        }
    }
    gx[idx] = ST(acc);
}
