/*
 * adaptive-pool.glsl — adaptive average pooling and its input gradient, one thread per
 * element of the result (BACKWARD defined: grad_x). Output cell i of a dim covers input
 * [floor(i*in/out), ceil((i+1)*in/out)), as PyTorch; the backward gathers from the cells
 * that cover an input element, so it writes each once without atomics. Contiguous
 * operands; dims padded on the left to three, leading dims are planes.
 */

layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Params {
    int in_[3], out_[3];
    int total, base;
} P;
layout(std430, binding = 1) writeonly buffer Dst { ELEM dst[]; };
layout(std430, binding = 2) readonly buffer Src { ELEM src[]; };

int cell_lo(int i, int n_in, int n_out) { return (i * n_in) / n_out; }
int cell_hi(int i, int n_in, int n_out) { return ((i + 1) * n_in + n_out - 1) / n_out; }

void main()
{
    int idx = nn_item(P.base);
    if (idx >= P.total)
        return;
    int on = P.out_[0] * P.out_[1] * P.out_[2], in_n = P.in_[0] * P.in_[1] * P.in_[2];
#ifndef BACKWARD
    int plane = idx / on, i = idx % on;
    int c[3] = int[3](i / (P.out_[2] * P.out_[1]), (i / P.out_[2]) % P.out_[1], i % P.out_[2]);
    int lo[3], hi[3];
    float count = 1.0;
    for (int d = 0; d < 3; d++) {
        lo[d] = cell_lo(c[d], P.in_[d], P.out_[d]);
        hi[d] = cell_hi(c[d], P.in_[d], P.out_[d]);
        count *= float(hi[d] - lo[d]);
    }
    ACC s = ACC_ZERO;
    for (int i0 = lo[0]; i0 < hi[0]; i0++)
        for (int i1 = lo[1]; i1 < hi[1]; i1++)
            for (int i2 = lo[2]; i2 < hi[2]; i2++)
                s += LD(src[plane * in_n + (i0 * P.in_[1] + i1) * P.in_[2] + i2]);
    dst[idx] = ST(s / ACC(count));
#else
    int plane = idx / in_n, i = idx % in_n;
    int c[3] = int[3](i / (P.in_[2] * P.in_[1]), (i / P.in_[2]) % P.in_[1], i % P.in_[2]);
    int lo[3], hi[3];
    for (int d = 0; d < 3; d++) {
        /* cells whose range can hold c[d]: from just below c*out/in to just above */
        lo[d] = max((c[d] * P.out_[d]) / P.in_[d] - 1, 0);
        hi[d] = min(((c[d] + 1) * P.out_[d]) / P.in_[d] + 1, P.out_[d] - 1);
    }
    ACC acc = ACC_ZERO;
    for (int o0 = lo[0]; o0 <= hi[0]; o0++) {
        if (c[0] < cell_lo(o0, P.in_[0], P.out_[0]) || c[0] >= cell_hi(o0, P.in_[0], P.out_[0]))
            continue;
        for (int o1 = lo[1]; o1 <= hi[1]; o1++) {
            if (c[1] < cell_lo(o1, P.in_[1], P.out_[1]) || c[1] >= cell_hi(o1, P.in_[1], P.out_[1]))
                continue;
            for (int o2 = lo[2]; o2 <= hi[2]; o2++) {
                if (c[2] < cell_lo(o2, P.in_[2], P.out_[2]) || c[2] >= cell_hi(o2, P.in_[2], P.out_[2]))
                    continue;
                float count = 1.0;
                int oc[3] = int[3](o0, o1, o2);
                for (int d = 0; d < 3; d++)
                    count *= float(cell_hi(oc[d], P.in_[d], P.out_[d]) - cell_lo(oc[d], P.in_[d], P.out_[d]));
                acc += LD(src[plane * on + (o0 * P.out_[1] + o1) * P.out_[2] + o2]) / ACC(count);
            }
        }
    }
    dst[idx] = ST(acc);
#endif
}
