#version 450
/*
 * layer-norm.comp — layer normalization over contiguous rows of `inner` elements, one
 * workgroup per row: the mean, then the biased variance around it (two passes, so a row
 * far from zero loses nothing to cancellation), each summed through a tree in shared
 * memory; rstd = 1 / sqrt(var + eps); y = (x − mean) · rstd [· weight] [+ bias]. mean
 * and rstd are written when asked (binding 5 and 6, STAT: float, double for f64).
 */
#include "nn-common.glsl"

layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Params {
    int rows, inner, has_weight, has_bias;
    int has_mean, has_rstd, base, pad0;
    float eps;
    uint eps_bits_lo, eps_bits_hi, pad1;
} P;
layout(std430, binding = 1) writeonly buffer Out { ELEM o[]; };
layout(std430, binding = 2) readonly buffer X { ELEM x[]; };
layout(std430, binding = 3) readonly buffer Wt { ELEM wt[]; };
layout(std430, binding = 4) readonly buffer Bs { ELEM bs[]; };
layout(std430, binding = 5) writeonly buffer Mean { STAT mean_out[]; };
layout(std430, binding = 6) writeonly buffer Rstd { STAT rstd_out[]; };

shared ACC red[gl_WorkGroupSize.x];

ACC tree_sum(ACC v)
{
    uint t = gl_LocalInvocationID.x;
    red[t] = v;
    barrier();
    for (uint s = gl_WorkGroupSize.x / 2; s > 0; s >>= 1) {
        if (t < s)
            red[t] += red[t + s];
        barrier();
    }
    ACC r = red[0];
    barrier();
    return r;
}

void main()
{
    int row = nn_group(P.base);
    if (row >= P.rows)
        return; /* uniform across the workgroup */
    int base = row * P.inner;
    int t = int(gl_LocalInvocationID.x), nt = int(gl_WorkGroupSize.x);
    ACC s = ACC_ZERO;
    for (int j = t; j < P.inner; j += nt)
        s += LD(x[base + j]);
    ACC mu = tree_sum(s) / ACC(P.inner);
    ACC q = ACC_ZERO;
    for (int j = t; j < P.inner; j += nt) {
        ACC d = LD(x[base + j]) - mu;
        q += d * d;
    }
    ACC var = tree_sum(q) / ACC(P.inner);
    ACC eps = nn_scalar(ACC_ZERO, P.eps, P.eps_bits_lo, P.eps_bits_hi);
    ACC rstd = ACC(1.0) / sqrt(var + eps);
    for (int j = t; j < P.inner; j += nt) {
        ACC y = (LD(x[base + j]) - mu) * rstd;
        if (P.has_weight != 0)
            y *= LD(wt[j]);
        if (P.has_bias != 0)
            y += LD(bs[j]);
        o[base + j] = ST(y);
    }
    if (t == 0) {
        if (P.has_mean != 0)
            mean_out[row] = STAT(mu);
        if (P.has_rstd != 0)
            rstd_out[row] = STAT(rstd);
    }
}
