#version 450
/*
 * adam.comp — one fused Adam/AdamW step in place over contiguous param, grad, exp_avg,
 * exp_avg_sq (and max_exp_avg_sq with amsgrad), one thread per element, in the order of
 * kiln_adam_params (backends/backend.h). Every intermediate rounds where the composed
 * update's primitives would (precise: no fma contraction), in float for f32, f16 and
 * bf16 and in double for f64, whose scalars arrive as raw bits.
 */
#include "nn-common.glsl"

layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Params {
    int n, base, l2, scale;
    int amsgrad, maximize, pad0, pad1;
    /* as floats: param_scale, weight_decay, 1 - beta1, beta2, 1 - beta2, inv_bc2_sqrt, eps, -step_size */
    float f[8];
    /* the same eight as double bits, (lo, hi) pairs */
    uint d[16];
} P;
layout(std430, binding = 1) buffer Param { ELEM param[]; };
layout(std430, binding = 2) readonly buffer Grad { ELEM grad[]; };
layout(std430, binding = 3) buffer M1 { ELEM m1[]; };
layout(std430, binding = 4) buffer M2 { ELEM m2[]; };
layout(std430, binding = 5) buffer VMax { ELEM vmax[]; };

ACC scalar(int i)
{
    return nn_scalar(ACC_ZERO, P.f[i], P.d[2 * i], P.d[2 * i + 1]);
}

void main()
{
    int i = nn_item(P.base);
    if (i >= P.n)
        return;
    precise ACC x = LD(param[i]);
    precise ACC g = LD(grad[i]);
    if (P.maximize != 0)
        g = -g;
    if (P.scale != 0)
        x = x * scalar(0);
    if (P.l2 != 0) {
        precise ACC t = x * scalar(1);
        g = g + t;
    }
    precise ACC m = LD(m1[i]);
    precise ACC d = g - m;
    d = d * scalar(2);
    m = m + d;
    precise ACC v = LD(m2[i]);
    precise ACC a = v * scalar(3);
    precise ACC b = g * g;
    b = b * scalar(4);
    v = a + b;
    ACC s = v;
    if (P.amsgrad != 0) {
        ACC vx = LD(vmax[i]);
        if (isnan(vx) || isnan(s))
            vx = ACC(0.0 / 0.0);
        else if (s > vx)
            vx = s;
        vmax[i] = ST(vx);
        s = vx;
    }
    precise ACC den = sqrt(s);
    den = den * scalar(5);
    den = den + scalar(6);
    precise ACC step = m / den;
    step = step * scalar(7);
    x = x + step;
    param[i] = ST(x);
    m1[i] = ST(m);
    m2[i] = ST(v);
}
