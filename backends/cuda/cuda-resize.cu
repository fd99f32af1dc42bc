/*
 * backends/cuda/cuda-resize.cu — nearest and (bi/tri)linear interpolation over the trailing
 * 1 to 3 spatial dims of [N, C, S...], and its backward.
 *
 * Source taps follow the ref backend (backends/ref/ref-nn.c), which quotes PyTorch: nearest
 * uses the legacy rule src = min(floor(dst · (float)(in/out)), in − 1) (exact copies for
 * out = in and out = 2·in); linear uses the align_corners scale (in − 1)/(out − 1), or the
 * half-pixel rule clamped at 0. One thread per output element; the backward zeroes its
 * gradient and adds each output's share to its taps atomically.
 */
#include "cuda-math.cuh"

struct kcu_resize_geom {
    int64_t in[3], out[3], in_n, out_n, planes;
    int mode; /* 0 nearest, 1 linear */
    bool align_corners;
};

struct kcu_taps {
    int64_t i[2];
    double w[2];
    int n;
};

__device__ __forceinline__ kcu_taps kcu_interp_taps(int mode, bool align, int64_t dst, int64_t in, int64_t out)
{
    kcu_taps t;
    t.n = 1;
    t.w[0] = 1;
    t.w[1] = 0;
    t.i[1] = 0;
    if (mode == 0) {
        if (out == in) {
            t.i[0] = dst;
        } else if (out == 2 * in) {
            t.i[0] = dst >> 1;
        } else {
            float scale = (float)in / (float)out;
            int64_t s = (int64_t)floorf((float)dst * scale);
            t.i[0] = s < in - 1 ? s : in - 1;
        }
        return t;
    }
    double scale, src;
    if (align) {
        scale = out > 1 ? (double)(in - 1) / (double)(out - 1) : 0.0;
        src = scale * (double)dst;
    } else {
        scale = (double)in / (double)out;
        src = scale * ((double)dst + 0.5) - 0.5;
        if (src < 0)
            src = 0;
    }
    int64_t i0 = (int64_t)src;
    double l1 = src - (double)i0;
    t.n = 2;
    t.i[0] = i0;
    t.i[1] = i0 + (i0 < in - 1 ? 1 : 0);
    t.w[0] = 1.0 - l1;
    t.w[1] = l1;
    return t;
}

__global__ void k_resize(kcu_resize_geom g, kcu_view x, kcu_view y, bool backward)
{
    int64_t total = g.planes * g.out_n;
    KCU_GRID_LOOP(i, total)
    {
        int64_t pl = i / g.out_n, r = i - pl * g.out_n, o[3];
        o[2] = r % g.out[2];
        o[1] = (r / g.out[2]) % g.out[1];
        o[0] = r / (g.out[2] * g.out[1]);
        kcu_taps t[3];
        for (int d = 0; d < 3; d++)
            t[d] = kcu_interp_taps(g.mode, g.align_corners, o[d], g.in[d], g.out[d]);
        double gy = backward ? kcu_load_d(y.base, y.dtype, kcu_offset(y, i)) : 0.0, acc = 0;
        for (int a = 0; a < t[0].n; a++)
            for (int b = 0; b < t[1].n; b++)
                for (int c = 0; c < t[2].n; c++) {
                    double w = t[0].w[a] * t[1].w[b] * t[2].w[c];
                    int64_t at = kcu_offset(x, pl * g.in_n + (t[0].i[a] * g.in[1] + t[1].i[b]) * g.in[2] + t[2].i[c]);
                    if (!backward)
                        acc += w * kcu_load_d(x.base, x.dtype, at);
                    else if (x.dtype == KCU_F32)
                        atomicAdd((float *)x.base + at, (float)(w * gy));
                    else if (x.dtype == KCU_F64)
                        atomicAdd((double *)x.base + at, w * gy);
                    else
                        kcu_atomic_add_narrow(x.base, x.dtype, at, w * gy, 0);
                }
        if (!backward)
            kcu_store_d(y.base, y.dtype, kcu_offset(y, i), acc);
    }
}

static kcu_resize_geom kcu_resize_geometry(int mode, bool align, const kcu_view *x, const kcu_view *y)
{
    kcu_resize_geom g;
    int ns = x->ndim - 2;
    g.in_n = g.out_n = 1;
    for (int d = 0; d < 3; d++) {
        int k = d - (3 - ns);
        g.in[d] = k >= 0 ? x->shape[2 + k] : 1;
        g.out[d] = k >= 0 ? y->shape[2 + k] : 1;
        g.in_n *= g.in[d];
        g.out_n *= g.out[d];
    }
    g.planes = x->shape[0] * x->shape[1];
    g.mode = mode;
    g.align_corners = align;
    return g;
}

extern "C" int kcu_interpolate(kcu_stream s, int mode, bool align_corners, const kcu_view *out, const kcu_view *x)
{
    kcu_resize_geom g = kcu_resize_geometry(mode, align_corners, x, out);
    int64_t total = g.planes * g.out_n;
    if (total == 0 || g.in_n == 0)
        return 0;
    k_resize<<<kcu_blocks(total), KCU_THREADS, 0, (cudaStream_t)s>>>(g, *x, *out, false);
    return KCU_LAUNCHED();
}

extern "C" int kcu_interpolate_backward(kcu_stream s, int mode, bool align_corners, const kcu_view *grad_x,
                                        const kcu_view *grad_out)
{
    int rc = kcu_fill(s, grad_x, 0.0);
    if (rc)
        return rc;
    kcu_resize_geom g = kcu_resize_geometry(mode, align_corners, grad_x, grad_out);
    int64_t total = g.planes * g.out_n;
    if (total == 0 || g.in_n == 0)
        return 0;
    k_resize<<<kcu_blocks(total), KCU_THREADS, 0, (cudaStream_t)s>>>(g, *grad_x, *grad_out, true);
    return KCU_LAUNCHED();
}
