#version 450
/*
 * matmul.comp — out[b, m, n] = sum_k a[b, m, k] * b[b, k, n], batched, tiled through
 * shared memory.
 *
 * A workgroup of WG_X x WG_Y threads (specialization constants 0 and 1) computes a
 * (WG_Y * RM) x (WG_X * RN) tile of out, walking K in steps of BK (constant 3): each
 * step stages a TM x BK slice of a and a BK x TN slice of b in shared memory, then every
 * thread accumulates its RM x RN outputs from them. a and b are read through their
 * strides (a transposed or sliced view costs nothing extra); out is contiguous. Batch
 * entries are gl_WorkGroupID.z + batch_base, unflattened over up to six batch dims with
 * each operand's own batch strides (0 where it broadcasts). A dispatch walks K from
 * k_begin to k_end; with `accumulate` it adds out's value to its sums (vk-matmul.c cuts a K
 * too long for the driver's loop limit into such dispatches, run in turn).
 */
#include "nn-common.glsl"

#define RM 4
#define RN 4

layout(local_size_x = 16, local_size_y = 16) in;
layout(constant_id = 3) const uint BK = 16;

layout(std430, binding = 0) readonly buffer Params {
    int M, N, K, nbatch_dims;
    int a_off, a_sm, a_sk, b_off;
    int b_sk, b_sn, out_off, batch_base;
    int bshape[6];
    int a_sb[6];
    int b_sb[6];
    int k_begin, k_end, accumulate;
} P;
layout(std430, binding = 1) buffer Out { ELEM o[]; };
layout(std430, binding = 2) readonly buffer A { ELEM a[]; };
layout(std430, binding = 3) readonly buffer B { ELEM b[]; };

const uint TM = gl_WorkGroupSize.y * RM;
const uint TN = gl_WorkGroupSize.x * RN;
shared ACC As[BK * TM];
shared ACC Bs[BK * TN];

void main()
{
    uint batch = gl_WorkGroupID.z + uint(P.batch_base);
    int abase = P.a_off, bbase = P.b_off;
    uint rest = batch;
    for (int d = P.nbatch_dims - 1; d >= 0; d--) {
        int i = int(rest % uint(P.bshape[d]));
        rest /= uint(P.bshape[d]);
        abase += i * P.a_sb[d];
        bbase += i * P.b_sb[d];
    }
    int obase = P.out_off + int(batch) * P.M * P.N;

    uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
    uint lid = ty * gl_WorkGroupSize.x + tx;
    uint nthreads = gl_WorkGroupSize.x * gl_WorkGroupSize.y;
    int row0 = int(gl_WorkGroupID.y * TM), col0 = int(gl_WorkGroupID.x * TN);

    ACC acc[RM][RN];
    for (int i = 0; i < RM; i++)
        for (int j = 0; j < RN; j++)
            acc[i][j] = ACC_ZERO;

    for (int k0 = P.k_begin; k0 < P.k_end; k0 += int(BK)) {
        for (uint t = lid; t < BK * TM; t += nthreads) {
            int r = int(t / BK), kk = int(t % BK);
            int gr = row0 + r, gk = k0 + kk;
            As[kk * TM + r] = gr < P.M && gk < P.K ? LD(a[abase + gr * P.a_sm + gk * P.a_sk]) : ACC_ZERO;
        }
        for (uint t = lid; t < BK * TN; t += nthreads) {
            int kk = int(t / TN), c = int(t % TN);
            int gc = col0 + c, gk = k0 + kk;
            Bs[kk * TN + c] = gc < P.N && gk < P.K ? LD(b[bbase + gk * P.b_sk + gc * P.b_sn]) : ACC_ZERO;
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
        if (r >= P.M)
            continue;
        for (int j = 0; j < RN; j++) {
            int c = col0 + int(tx) + j * int(gl_WorkGroupSize.x);
            if (c < P.N)
                o[obase + r * P.N + c] = ST(P.accumulate != 0 ? LD(o[obase + r * P.N + c]) + acc[i][j] : acc[i][j]);
        }
    }
}
