/*
 * resize.glsl — interpolate (nearest or (bi/tri)linear) and, with BACKWARD defined, its
 * input gradient; one thread per element of the result. The source taps of an output
 * coordinate are the ref backend's (PyTorch's): nearest is min(floor(dst * (float)(in /
 * out)), in - 1); linear uses (in - 1) / (out - 1) with align_corners, else the
 * half-pixel rule clamped at 0, with the second tap clamped to the last row. The
 * backward gathers: for each input coordinate it visits the outputs whose taps can name
 * it and adds weight x gradient for each tap that does, so no atomics are needed.
 * Contiguous operands; dims padded on the left to three, leading dims are planes.
 */

layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Params {
    int in_[3], out_[3];
    int nearest, align_corners, total, base;
} P;
layout(std430, binding = 1) writeonly buffer Dst { ELEM dst[]; };
layout(std430, binding = 2) readonly buffer Src { ELEM src[]; };

/* taps of output coordinate o along dim d: indices i0, i1 and weights w0, w1. The linear
 * source coordinate is a ratio of integers, num / den, so its integer part is exact and
 * its fraction is rounded once, in ACC (double for f64): what the reference's double
 * arithmetic gives, to the output dtype's precision. */
void taps(int d, int o, out int i0, out int i1, out ACC w0, out ACC w1)
{
    int n_in = P.in_[d], n_out = P.out_[d];
    if (P.nearest != 0) {
        if (n_out == n_in) {
            i0 = o;
        } else if (n_out == 2 * n_in) {
            i0 = o >> 1;
        } else {
            /* the reference rounds in float here: (float)in / out, then times dst */
            precise float scale = float(n_in) / float(n_out);
            precise float s = float(o) * scale;
            i0 = min(int(floor(s)), n_in - 1);
        }
        i1 = i0;
        w0 = ACC(1);
        w1 = ACC(0);
        return;
    }
    int64_t num, den;
    if (P.align_corners != 0) {
        num = n_out > 1 ? int64_t(n_in - 1) * int64_t(o) : 0l;
        den = n_out > 1 ? int64_t(n_out - 1) : 1l;
    } else {
        /* in / out * (o + 0.5) - 0.5 = (in * (2o + 1) - out) / (2 out), clamped at 0 */
        num = max(int64_t(n_in) * int64_t(2 * o + 1) - int64_t(n_out), 0l);
        den = 2l * int64_t(n_out);
    }
    i0 = int(num / den);
    ACC l1 = ACC(num - int64_t(i0) * den) / ACC(den);
    i1 = i0 + (i0 < n_in - 1 ? 1 : 0);
    w0 = ACC(1) - l1;
    w1 = l1;
}

#ifdef BACKWARD
/* the weight output coordinate o gives input coordinate i along dim d */
ACC weight_of(int d, int o, int i)
{
    int i0, i1;
    ACC w0, w1;
    taps(d, o, i0, i1, w0, w1);
    return (i0 == i ? w0 : ACC(0)) + (i1 == i && P.nearest == 0 ? w1 : ACC(0));
}

/* outputs along dim d that can name input i, with two rows of slack each side */
void out_span(int d, int i, out int lo, out int hi)
{
    int n_in = P.in_[d], n_out = P.out_[d];
    float inv = P.align_corners != 0 && P.nearest == 0 && n_in > 1 ? float(n_out - 1) / float(n_in - 1)
                                                                    : float(n_out) / float(n_in);
    lo = max(int(floor(float(i - 1) * inv)) - 2, 0);
    hi = min(int(ceil(float(i + 2) * inv)) + 2, n_out - 1);
}
#endif

void main()
{
    int idx = nn_item(P.base);
    if (idx >= P.total)
        return;
    int on = P.out_[0] * P.out_[1] * P.out_[2], in_n = P.in_[0] * P.in_[1] * P.in_[2];
#ifndef BACKWARD
    int plane = idx / on, i = idx % on;
    int c[3] = int[3](i / (P.out_[2] * P.out_[1]), (i / P.out_[2]) % P.out_[1], i % P.out_[2]);
    int ti[3][2];
    ACC tw[3][2];
    for (int d = 0; d < 3; d++)
        taps(d, c[d], ti[d][0], ti[d][1], tw[d][0], tw[d][1]);
    int nt = P.nearest != 0 ? 1 : 2;
    ACC acc = ACC_ZERO;
    for (int a = 0; a < nt; a++)
        for (int b = 0; b < nt; b++)
            for (int e = 0; e < nt; e++) {
                ACC wgt = tw[0][a] * tw[1][b] * tw[2][e];
                acc = fma(wgt, LD(src[plane * in_n + (ti[0][a] * P.in_[1] + ti[1][b]) * P.in_[2] + ti[2][e]]), acc);
            }
    dst[idx] = ST(acc);
#else
    int plane = idx / in_n, i = idx % in_n;
    int c[3] = int[3](i / (P.in_[2] * P.in_[1]), (i / P.in_[2]) % P.in_[1], i % P.in_[2]);
    int lo[3], hi[3];
    for (int d = 0; d < 3; d++)
        out_span(d, c[d], lo[d], hi[d]);
    ACC acc = ACC_ZERO;
    for (int o0 = lo[0]; o0 <= hi[0]; o0++) {
        ACC w0 = weight_of(0, o0, c[0]);
        if (w0 == ACC(0))
            continue;
        for (int o1 = lo[1]; o1 <= hi[1]; o1++) {
            ACC w1 = weight_of(1, o1, c[1]);
            if (w1 == ACC(0))
                continue;
            for (int o2 = lo[2]; o2 <= hi[2]; o2++) {
                ACC w2 = weight_of(2, o2, c[2]);
                if (w2 == ACC(0))
                    continue;
                acc = fma(w0 * w1 * w2, LD(src[plane * on + (o0 * P.out_[1] + o1) * P.out_[2] + o2]), acc);
            }
        }
    }
    dst[idx] = ST(acc);
#endif
}
