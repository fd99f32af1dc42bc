#version 450
/*
 * epilogue.comp — out = act(out + bias[last index] + residual) in place over a
 * contiguous f32 output, rounding after each add as the separate ops would
 * (nn-epilogue.glsl has the activations).
 */
#include "nn-common.glsl"
#include "nn-epilogue.glsl"

layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Params {
    int n, last, has_bias, has_res;
    int act, base, pad0, pad1;
    float alpha, beta;
} P;
layout(std430, binding = 1) buffer Out { float o[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) readonly buffer Res { float res[]; };

void main()
{
    int i = nn_item(P.base);
    if (i >= P.n)
        return;
    precise float v = o[i];
    if (P.has_bias != 0)
        v = v + bias[i % P.last];
    if (P.has_res != 0)
        v = v + res[i];
    o[i] = epi_apply(P.act, v, P.alpha, P.beta);
}
