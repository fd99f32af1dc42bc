#version 450
/*
 * conv-gemm.comp — convolution as an implicit GEMM, tiled through shared memory like
 * matmul.comp: the im2col matrix is never stored, each tile gathers its slice of it from
 * the image as it loads. One shader serves the three convolution entries, chosen by the
 * specialization constant MODE (4), per group g (gl_WorkGroupID.z):
 *
 *   MODE 0, forward:       out[n, o, q]  = sum_{c, t} w[o, c, t] · x[n, c, in(q, t)]
 *                          M = O/g rows (o), K = C/g · taps (c, t), N = batch · out positions (n, q)
 *   MODE 1, input grad:    gx[n, c, p]   = sum_{o, t} w[o, c, t] · gy[n, o, out(p, t)]
 *                          M = C/g (c), K = O/g · taps (o, t), N = batch · in positions (n, p)
 *   MODE 2, weight grad:   gw[o, c, t]   = sum_{n, q} gy[n, o, q] · x[n, c, in(q, t)]
 *                          M = O/g (o), K = batch · out positions (n, q), N = C/g · taps (c, t)
 *
 * where in(q, t) = q · stride − pad + t · dilation per spatial dim and out(p, t) is its
 * inverse (a tap that does not land on an output position contributes 0). Forward also
 * adds bias[o], a residual and an activation (nn-epilogue.glsl) before its one store.
 * The weight gradient's K (every image position) is long and its result small, so it
 * may be split (ksplit > 1): workgroup z = split · groups + g sums K range
 * [split · kchunk, (split + 1) · kchunk) into its own slice of the partial-sum buffer
 * (binding 6, in ACC), which conv-splitk-sum.comp then adds up in split order.
 * Every operand is contiguous; spatial dims are right-aligned into three. The workgroup
 * is WG_X x WG_Y threads (constants 0, 1), the tile (WG_Y·RM) x (WG_X·RN), K walked in
 * steps of BK (constant 3).
 */
#include "nn-common.glsl"
#include "nn-epilogue.glsl"

#define RM 4
#define RN 4

layout(local_size_x = 16, local_size_y = 16) in;
layout(constant_id = 3) const uint BK = 16;
layout(constant_id = 4) const int MODE = 0;

layout(std430, binding = 0) readonly buffer Params {
    int N, C, O, Cg;
    int Og, has_bias, has_res, act;
    int in_[3], out_[3], k[3], stride[3], pad[3], dil[3];
    float alpha, beta;
    int total, base;
    int ksplit, kchunk;
} P;
layout(std430, binding = 1) writeonly buffer Out { ELEM o[]; };
layout(std430, binding = 2) readonly buffer SrcA { ELEM sa[]; };
layout(std430, binding = 3) readonly buffer SrcB { ELEM sb[]; };
layout(std430, binding = 4) readonly buffer Bias { ELEM bias[]; };
layout(std430, binding = 5) readonly buffer Res { ELEM res[]; };
layout(std430, binding = 6) writeonly buffer Part { ACC part[]; };

const uint TM = gl_WorkGroupSize.y * RM;
const uint TN = gl_WorkGroupSize.x * RN;
shared ACC As[BK * TM];
shared ACC Bs[BK * TN];

int g_ks, g_is, g_os; /* taps, input and output positions per image */

/* the input coordinate of output position q under tap t, or -1 when it is padding */
int in_of(int q, int t)
{
    int ow = q % P.out_[2], oh = (q / P.out_[2]) % P.out_[1], od = q / (P.out_[2] * P.out_[1]);
    int kw = t % P.k[2], kh = (t / P.k[2]) % P.k[1], kd = t / (P.k[2] * P.k[1]);
    int id = od * P.stride[0] - P.pad[0] + kd * P.dil[0];
    int ih = oh * P.stride[1] - P.pad[1] + kh * P.dil[1];
    int iw = ow * P.stride[2] - P.pad[2] + kw * P.dil[2];
    if (id < 0 || id >= P.in_[0] || ih < 0 || ih >= P.in_[1] || iw < 0 || iw >= P.in_[2])
        return -1;
    return (id * P.in_[1] + ih) * P.in_[2] + iw;
}

/* the output position that reads input position p through tap t, or -1 */
int out_of(int p, int t)
{
    int iw = p % P.in_[2], ih = (p / P.in_[2]) % P.in_[1], id = p / (P.in_[2] * P.in_[1]);
    int kw = t % P.k[2], kh = (t / P.k[2]) % P.k[1], kd = t / (P.k[2] * P.k[1]);
    int sd = id + P.pad[0] - kd * P.dil[0], sh = ih + P.pad[1] - kh * P.dil[1], sw = iw + P.pad[2] - kw * P.dil[2];
    if (sd < 0 || sh < 0 || sw < 0 || sd % P.stride[0] != 0 || sh % P.stride[1] != 0 || sw % P.stride[2] != 0)
        return -1;
    int od = sd / P.stride[0], oh = sh / P.stride[1], ow = sw / P.stride[2];
    if (od >= P.out_[0] || oh >= P.out_[1] || ow >= P.out_[2])
        return -1;
    return (od * P.out_[1] + oh) * P.out_[2] + ow;
}

ACC load_a(int g, int m, int kk)
{
    if (MODE == 0) /* w[g·Og + m, c, t], k = (c, t) */
        return LD(sa[((g * P.Og + m) * P.Cg) * g_ks + kk]);
    if (MODE == 1) { /* w[g·Og + o, m, t], k = (o, t) */
        int oo = kk / g_ks, t = kk % g_ks;
        return LD(sa[((g * P.Og + oo) * P.Cg + m) * g_ks + t]);
    }
    /* MODE 2: gy[n, g·Og + m, q], k = (n, q) */
    int n = kk / g_os, q = kk % g_os;
    return LD(sa[(n * P.O + g * P.Og + m) * g_os + q]);
}

ACC load_b(int g, int kk, int nn)
{
    if (MODE == 0) { /* x[n, g·Cg + c, in(q, t)], k = (c, t), n = (n, q) */
        int c = kk / g_ks, t = kk % g_ks, n = nn / g_os, q = nn % g_os;
        int p = in_of(q, t);
        return p < 0 ? ACC_ZERO : LD(sb[(n * P.C + g * P.Cg + c) * g_is + p]);
    }
    if (MODE == 1) { /* gy[n, g·Og + o, out(p, t)], k = (o, t), n = (n, p) */
        int oo = kk / g_ks, t = kk % g_ks, n = nn / g_is, p = nn % g_is;
        int q = out_of(p, t);
        return q < 0 ? ACC_ZERO : LD(sb[(n * P.O + g * P.Og + oo) * g_os + q]);
    }
    /* MODE 2: x[n, g·Cg + c, in(q, t)], k = (n, q), n = (c, t) */
    int n = kk / g_os, q = kk % g_os, c = nn / g_ks, t = nn % g_ks;
    int p = in_of(q, t);
    return p < 0 ? ACC_ZERO : LD(sb[(n * P.C + g * P.Cg + c) * g_is + p]);
}

void store(int g, int m, int nn, ACC v)
{
    if (MODE == 0) {
        int n = nn / g_os, q = nn % g_os, oc = g * P.Og + m;
        int at = (n * P.O + oc) * g_os + q;
        if (P.has_bias != 0)
            v += LD(bias[oc]);
        if (P.has_res != 0 || P.act != EPI_NONE) {
            /* f32 only (conv_fused): rounds as the separate ops would, conv result first */
            precise float e = float(v);
            if (P.has_res != 0)
                e = e + float(LD(res[at]));
            v = ACC(epi_apply(P.act, e, P.alpha, P.beta));
        }
        o[at] = ST(v);
    } else if (MODE == 1) {
        int n = nn / g_is, p = nn % g_is;
        o[(n * P.C + g * P.Cg + m) * g_is + p] = ST(v);
    } else if (P.ksplit > 1) {
        int split = int(gl_WorkGroupID.z) / (P.O / P.Og);
        part[split * P.O * P.Cg * g_ks + ((g * P.Og + m) * P.Cg) * g_ks + nn] = v;
    } else {
        o[((g * P.Og + m) * P.Cg) * g_ks + nn] = ST(v);
    }
}

void main()
{
    g_ks = P.k[0] * P.k[1] * P.k[2];
    g_is = P.in_[0] * P.in_[1] * P.in_[2];
    g_os = P.out_[0] * P.out_[1] * P.out_[2];
    int ngroups = P.O / P.Og;
    int g = int(gl_WorkGroupID.z) % ngroups;
    int M = MODE == 1 ? P.Cg : P.Og;
    int K = MODE == 0 ? P.Cg * g_ks : MODE == 1 ? P.Og * g_ks : P.N * g_os;
    int kbegin = 0;
    if (MODE == 2 && P.ksplit > 1) {
        kbegin = (int(gl_WorkGroupID.z) / ngroups) * P.kchunk;
        K = min(K, kbegin + P.kchunk);
    }
    int Ncols = MODE == 0 ? P.N * g_os : MODE == 1 ? P.N * g_is : P.Cg * g_ks;

    uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
    uint lid = ty * gl_WorkGroupSize.x + tx;
    uint nthreads = gl_WorkGroupSize.x * gl_WorkGroupSize.y;
    int row0 = int(gl_WorkGroupID.y * TM), col0 = int(gl_WorkGroupID.x * TN);

    ACC acc[RM][RN];
    for (int i = 0; i < RM; i++)
        for (int j = 0; j < RN; j++)
            acc[i][j] = ACC_ZERO;

    for (int k0 = kbegin; k0 < K; k0 += int(BK)) {
        for (uint t = lid; t < BK * TM; t += nthreads) {
            int r = int(t / BK), kk = int(t % BK);
            int gr = row0 + r, gk = k0 + kk;
            As[kk * TM + r] = gr < M && gk < K ? load_a(g, gr, gk) : ACC_ZERO;
        }
        for (uint t = lid; t < BK * TN; t += nthreads) {
            int kk = int(t / TN), c = int(t % TN);
            int gc = col0 + c, gk = k0 + kk;
            Bs[kk * TN + c] = gc < Ncols && gk < K ? load_b(g, gk, gc) : ACC_ZERO;
        }
        barrier();
        for (uint kk = 0; kk < BK; kk++) {
            ACC av[RM], bv[RN];
            for (int i = 0; i < RM; i++)
                av[i] = As[kk * TM + ty + i * gl_WorkGroupSize.y];
            for (int j = 0; j < RN; j++)
                bv[j] = Bs[kk * TN + tx + j * gl_WorkGroupSize.x];
            for (int i = 0; i < RM; i++)
                for (int j = 0; j < RN; j++)
                    acc[i][j] += av[i] * bv[j];
        }
        barrier();
    }
    for (int i = 0; i < RM; i++) {
        int r = row0 + int(ty) + i * int(gl_WorkGroupSize.y);
        if (r >= M)
            continue;
        for (int j = 0; j < RN; j++) {
            int c = col0 + int(tx) + j * int(gl_WorkGroupSize.x);
            if (c < Ncols)
                store(g, r, c, acc[i][j]);
        }
    }
}
