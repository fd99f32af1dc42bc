#version 450
/*
 * softmax.comp — softmax or log-softmax (LOG_SOFTMAX, specialization constant 3) along
 * the middle dim of a contiguous [outer, len, inner] input; one workgroup per (outer,
 * inner) lane, its threads striding over len. The max (NaN wins, as the reference) and
 * the sum of exp(v − max) go through a tree in shared memory, so the order is fixed.
 * A max of ±inf makes every term NaN, as PyTorch.
 */
#include "nn-common.glsl"
#include "nn-math.glsl"

layout(local_size_x = 64) in;
layout(constant_id = 3) const int LOG_SOFTMAX = 0;

layout(std430, binding = 0) readonly buffer Params {
    int outer, len, inner, base;
} P;
layout(std430, binding = 1) writeonly buffer Out { ELEM o[]; };
layout(std430, binding = 2) readonly buffer In { ELEM x[]; };

shared ACC red[gl_WorkGroupSize.x];

#define EXP(v) nn_exp(v)
#define LOG(v) nn_log(v)

void main()
{
    int lane = nn_group(P.base);
    if (lane >= P.outer * P.inner)
        return; /* uniform across the workgroup */
    int base = (lane / P.inner) * P.len * P.inner + lane % P.inner;
    uint t = gl_LocalInvocationID.x, nt = gl_WorkGroupSize.x;
    ACC m = ACC(-1.0 / 0.0);
    for (int j = int(t); j < P.len; j += int(nt)) {
        ACC v = LD(x[base + j * P.inner]);
        m = v > m || isnan(v) ? v : m;
    }
    red[t] = m;
    barrier();
    for (uint s = nt / 2; s > 0; s >>= 1) {
        if (t < s) {
            ACC a = red[t], b = red[t + s];
            red[t] = b > a || isnan(b) ? b : a;
        }
        barrier();
    }
    m = red[0];
    barrier();
    ACC sum = ACC_ZERO;
    for (int j = int(t); j < P.len; j += int(nt))
        sum += EXP(LD(x[base + j * P.inner]) - m);
    red[t] = sum;
    barrier();
    for (uint s = nt / 2; s > 0; s >>= 1) {
        if (t < s)
            red[t] += red[t + s];
        barrier();
    }
    sum = red[0];
    ACC ls = LOG_SOFTMAX != 0 ? LOG(sum) : ACC_ZERO;
    for (int j = int(t); j < P.len; j += int(nt)) {
        ACC v = LD(x[base + j * P.inner]) - m;
        o[base + j * P.inner] = ST(LOG_SOFTMAX != 0 ? v - ls : EXP(v) / sum);
    }
}
