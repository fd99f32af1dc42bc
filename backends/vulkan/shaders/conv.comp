#version 450
/*
 * conv.comp — direct convolution, one thread per output element, over 1-3 spatial dims
 * padded on the left to three (unused dims have size 1), with groups, stride, padding
 * and dilation. x and w are contiguous; out is contiguous [N, O, D', H', W'].
 * Optionally adds bias[o], then a residual (same shape as out), then applies an
 * activation (nn-epilogue.glsl) before the single store: conv_fused's epilogue.
 */
#include "nn-common.glsl"
#include "nn-epilogue.glsl"

layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Params {
    int N, C, O, Cg;
    int Og, has_bias, has_res, act;
    int in_[3], out_[3], k[3], stride[3], pad[3], dil[3];
    float alpha, beta;
    int total, base;
} P;
layout(std430, binding = 1) writeonly buffer Out { ELEM o[]; };
layout(std430, binding = 2) readonly buffer X { ELEM x[]; };
layout(std430, binding = 3) readonly buffer W { ELEM w[]; };
layout(std430, binding = 4) readonly buffer Bias { ELEM bias[]; };
layout(std430, binding = 5) readonly buffer Res { ELEM res[]; };

void main()
{
    int idx = nn_item(P.base);
    if (idx >= P.total)
        return;
    int ow = idx % P.out_[2];
    int t = idx / P.out_[2];
    int oh = t % P.out_[1];
    t /= P.out_[1];
    int od = t % P.out_[0];
    t /= P.out_[0];
    int oc = t % P.O;
    int n = t / P.O;
    int grp = oc / P.Og;
    int in_size = P.in_[0] * P.in_[1] * P.in_[2];
    int k_size = P.k[0] * P.k[1] * P.k[2];
    ACC acc = ACC_ZERO;
    for (int c = 0; c < P.Cg; c++) {
        int xbase = (n * P.C + grp * P.Cg + c) * in_size;
        int wbase = (oc * P.Cg + c) * k_size;
        for (int kd = 0; kd < P.k[0]; kd++) {
            int id = od * P.stride[0] - P.pad[0] + kd * P.dil[0];
            if (id < 0 || id >= P.in_[0])
                continue;
            for (int kh = 0; kh < P.k[1]; kh++) {
                int ih = oh * P.stride[1] - P.pad[1] + kh * P.dil[1];
                if (ih < 0 || ih >= P.in_[1])
                    continue;
                int xrow = xbase + (id * P.in_[1] + ih) * P.in_[2];
                int wrow = wbase + (kd * P.k[1] + kh) * P.k[2];
                for (int kw = 0; kw < P.k[2]; kw++) {
                    int iw = ow * P.stride[2] - P.pad[2] + kw * P.dil[2];
                    if (iw >= 0 && iw < P.in_[2])
                        acc += LD(x[xrow + iw]) * LD(w[wrow + kw]);
                }
            }
        }
    }
    if (P.has_bias != 0)
        acc += LD(bias[oc]);
    if (P.has_res != 0 || P.act != EPI_NONE) {
        /* only the f32 variant is called with an epilogue (conv_fused is f32 only); it
         * rounds as the separate ops would: the conv's result first, then each add */
        precise float v = float(acc);
        if (P.has_res != 0)
            v = v + float(LD(res[idx]));
        acc = ACC(epi_apply(P.act, v, P.alpha, P.beta));
    }
    o[idx] = ST(acc);
}
