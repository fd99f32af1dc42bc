/*
 * backends/cuda/cuda-pool.cu — max and average pooling and adaptive average pooling over
 * 1 to 3 spatial dims, with their backwards.
 *
 * Windows follow the ref backend (backends/ref/ref-nn.c), which quotes PyTorch: max keeps
 * the first position and replaces it on `v > max || isnan(v)`, reporting the flat index
 * within the input plane; average divides by the window clipped to [-pad, in + pad) with
 * count_include_pad and to [0, in) without; adaptive bounds are floor(i·in/out) and
 * ceil((i+1)·in/out). Spatial dims are padded to three with leading 1s. One thread per
 * output element; the backwards zero their gradient and then scatter into it atomically
 * (windows overlap when stride < kernel), so their sums may differ from the ref backend's
 * in the last bits.
 */
#include "cuda-math.cuh"

/* The geometry, padded to three spatial dims. */
struct kcu_pool_geom {
    int64_t in[3], out[3], kernel[3], stride[3], pad[3], dil[3];
    int64_t in_n, out_n, planes;
    int kind; /* 0 max, 1 avg */
    bool count_include_pad;
};

__device__ __forceinline__ void kcu_unflatten3(int64_t i, const int64_t *size, int64_t *o)
{
    o[2] = i % size[2];
    o[1] = (i / size[2]) % size[1];
    o[0] = i / (size[2] * size[1]);
}

/* Adds v to element e of a float gradient. */
__device__ __forceinline__ void kcu_atomic_add_d(void *base, int dt, int64_t e, double v)
{
    if (dt == KCU_F32)
        atomicAdd((float *)base + e, (float)v);
    else if (dt == KCU_F64)
        atomicAdd((double *)base + e, v);
    else
        kcu_atomic_add_narrow(base, dt, e, v, 0);
}

/* The avg window of output position o, clipped; the divisor by count_include_pad. */
__device__ __forceinline__ double kcu_avg_window(const kcu_pool_geom &g, const int64_t *o, int64_t *lo, int64_t *hi)
{
    double full = 1, clipped = 1;
    for (int d = 0; d < 3; d++) {
        int64_t start = o[d] * g.stride[d] - g.pad[d];
        int64_t end = start + g.kernel[d] < g.in[d] + g.pad[d] ? start + g.kernel[d] : g.in[d] + g.pad[d];
        full *= (double)(end - start);
        lo[d] = start > 0 ? start : 0;
        hi[d] = end < g.in[d] ? end : g.in[d];
        clipped *= (double)(hi[d] - lo[d]);
    }
    return g.count_include_pad ? full : clipped;
}

__global__ void k_pool(kcu_pool_geom g, kcu_view out, kcu_view idx, kcu_view x)
{
    int64_t total = g.planes * g.out_n;
    KCU_GRID_LOOP(i, total)
    {
        int64_t pl = i / g.out_n, o[3];
        kcu_unflatten3(i - pl * g.out_n, g.out, o);
        int64_t base = pl * g.in_n;
        double v;
        if (g.kind == 0) {
            int64_t first[3], last[3];
            for (int d = 0; d < 3; d++) {
                first[d] = o[d] * g.stride[d] - g.pad[d];
                last[d] = first[d] + (g.kernel[d] - 1) * g.dil[d] + 1;
                if (last[d] > g.in[d])
                    last[d] = g.in[d];
                while (first[d] < 0)
                    first[d] += g.dil[d];
            }
            int64_t best = (first[0] * g.in[1] + first[1]) * g.in[2] + first[2];
            double m = -INFINITY;
            for (int64_t a = first[0]; a < last[0]; a += g.dil[0])
                for (int64_t b = first[1]; b < last[1]; b += g.dil[1])
                    for (int64_t c = first[2]; c < last[2]; c += g.dil[2]) {
                        int64_t at = (a * g.in[1] + b) * g.in[2] + c;
                        double val = kcu_load_d(x.base, x.dtype, kcu_offset(x, base + at));
                        if (val > m || val != val) {
                            m = val;
                            best = at;
                        }
                    }
            v = m;
            if (idx.base)
                kcu_store_i(idx.base, idx.dtype, kcu_offset(idx, i), best);
        } else {
            int64_t lo[3], hi[3];
            double div = kcu_avg_window(g, o, lo, hi);
            double s = 0;
            for (int64_t a = lo[0]; a < hi[0]; a++)
                for (int64_t b = lo[1]; b < hi[1]; b++)
                    for (int64_t c = lo[2]; c < hi[2]; c++)
                        s += kcu_load_d(x.base, x.dtype, kcu_offset(x, base + (a * g.in[1] + b) * g.in[2] + c));
            v = s / div;
        }
        kcu_store_d(out.base, out.dtype, kcu_offset(out, i), v);
    }
}

__global__ void k_pool_backward(kcu_pool_geom g, kcu_view gx, kcu_view gy, kcu_view idx)
{
    int64_t total = g.planes * g.out_n;
    KCU_GRID_LOOP(i, total)
    {
        int64_t pl = i / g.out_n, o[3];
        double grad = kcu_load_d(gy.base, gy.dtype, kcu_offset(gy, i));
        int64_t base = pl * g.in_n;
        if (g.kind == 0) {
            int64_t at = kcu_load_i(idx.base, idx.dtype, kcu_offset(idx, i));
            if (at >= 0 && at < g.in_n)
                kcu_atomic_add_d(gx.base, gx.dtype, kcu_offset(gx, base + at), grad);
            continue;
        }
        kcu_unflatten3(i - pl * g.out_n, g.out, o);
        int64_t lo[3], hi[3];
        double share = grad / kcu_avg_window(g, o, lo, hi);
        for (int64_t a = lo[0]; a < hi[0]; a++)
            for (int64_t b = lo[1]; b < hi[1]; b++)
                for (int64_t c = lo[2]; c < hi[2]; c++)
                    kcu_atomic_add_d(gx.base, gx.dtype, kcu_offset(gx, base + (a * g.in[1] + b) * g.in[2] + c),
                                     share);
    }
}

/* Pads a view's trailing nspatial dims to three and counts its planes. */
static void kcu_spatial(const kcu_view *v, int nspatial, int64_t *size, int64_t *n, int64_t *planes)
{
    *n = 1;
    for (int d = 0; d < 3; d++) {
        int k = d - (3 - nspatial);
        size[d] = k >= 0 ? v->shape[v->ndim - nspatial + k] : 1;
        *n *= size[d];
    }
    *planes = 1;
    for (int d = 0; d < v->ndim - nspatial; d++)
        *planes *= v->shape[d];
}

static kcu_pool_geom kcu_geom(const kcu_pool_params *p, const kcu_view *x, const kcu_view *y)
{
    kcu_pool_geom g;
    int64_t planes_y;
    kcu_spatial(x, p->nspatial, g.in, &g.in_n, &g.planes);
    kcu_spatial(y, p->nspatial, g.out, &g.out_n, &planes_y);
    for (int d = 0; d < 3; d++) {
        int k = d - (3 - p->nspatial);
        g.kernel[d] = k >= 0 ? p->kernel[k] : 1;
        g.stride[d] = k >= 0 ? p->stride[k] : 1;
        g.pad[d] = k >= 0 ? p->padding[k] : 0;
        g.dil[d] = k >= 0 ? p->dilation[k] : 1;
    }
    g.kind = p->kind;
    g.count_include_pad = p->count_include_pad;
    return g;
}

extern "C" int kcu_pool(kcu_stream s, const kcu_pool_params *p, const kcu_view *out, const kcu_view *indices,
                        const kcu_view *x)
{
    kcu_pool_geom g = kcu_geom(p, x, out);
    int64_t total = g.planes * g.out_n;
    if (total == 0)
        return 0;
    k_pool<<<kcu_blocks(total), KCU_THREADS, 0, (cudaStream_t)s>>>(g, *out, *indices, *x);
    return KCU_LAUNCHED();
}

extern "C" int kcu_pool_backward(kcu_stream s, const kcu_pool_params *p, const kcu_view *grad_x,
                                 const kcu_view *grad_out, const kcu_view *indices)
{
    int rc = kcu_fill(s, grad_x, 0.0);
    if (rc)
        return rc;
    kcu_pool_geom g = kcu_geom(p, grad_x, grad_out);
    int64_t total = g.planes * g.out_n;
    if (total == 0)
        return 0;
    k_pool_backward<<<kcu_blocks(total), KCU_THREADS, 0, (cudaStream_t)s>>>(g, *grad_x, *grad_out, *indices);
    return KCU_LAUNCHED();
}

/* --------------------------------------------------------- adaptive average */

__device__ __forceinline__ double kcu_adaptive_window(const kcu_pool_geom &g, const int64_t *o, int64_t *lo,
                                                      int64_t *hi)
{
    double count = 1;
    for (int d = 0; d < 3; d++) {
        lo[d] = (o[d] * g.in[d]) / g.out[d];
        hi[d] = ((o[d] + 1) * g.in[d] + g.out[d] - 1) / g.out[d];
        count *= (double)(hi[d] - lo[d]);
    }
    return count;
}

__global__ void k_adaptive_avg(kcu_pool_geom g, kcu_view out, kcu_view x)
{
    int64_t total = g.planes * g.out_n;
    KCU_GRID_LOOP(i, total)
    {
        int64_t pl = i / g.out_n, o[3], lo[3], hi[3];
        kcu_unflatten3(i - pl * g.out_n, g.out, o);
        double count = kcu_adaptive_window(g, o, lo, hi), s = 0;
        int64_t base = pl * g.in_n;
        for (int64_t a = lo[0]; a < hi[0]; a++)
            for (int64_t b = lo[1]; b < hi[1]; b++)
                for (int64_t c = lo[2]; c < hi[2]; c++)
                    s += kcu_load_d(x.base, x.dtype, kcu_offset(x, base + (a * g.in[1] + b) * g.in[2] + c));
        kcu_store_d(out.base, out.dtype, kcu_offset(out, i), s / count);
    }
}

__global__ void k_adaptive_avg_backward(kcu_pool_geom g, kcu_view gx, kcu_view gy)
{
    int64_t total = g.planes * g.out_n;
    KCU_GRID_LOOP(i, total)
    {
        int64_t pl = i / g.out_n, o[3], lo[3], hi[3];
        kcu_unflatten3(i - pl * g.out_n, g.out, o);
        double share = kcu_load_d(gy.base, gy.dtype, kcu_offset(gy, i)) / kcu_adaptive_window(g, o, lo, hi);
        int64_t base = pl * g.in_n;
        for (int64_t a = lo[0]; a < hi[0]; a++)
            for (int64_t b = lo[1]; b < hi[1]; b++)
                for (int64_t c = lo[2]; c < hi[2]; c++)
                    kcu_atomic_add_d(gx.base, gx.dtype, kcu_offset(gx, base + (a * g.in[1] + b) * g.in[2] + c),
                                     share);
    }
}

extern "C" int kcu_adaptive_avg_pool(kcu_stream s, int nspatial, const kcu_view *out, const kcu_view *x)
{
    kcu_pool_params p = {0};
    p.nspatial = nspatial;
    kcu_pool_geom g = kcu_geom(&p, x, out);
    int64_t total = g.planes * g.out_n;
    if (total == 0)
        return 0;
    k_adaptive_avg<<<kcu_blocks(total), KCU_THREADS, 0, (cudaStream_t)s>>>(g, *out, *x);
    return KCU_LAUNCHED();
}

extern "C" int kcu_adaptive_avg_pool_backward(kcu_stream s, int nspatial, const kcu_view *grad_x,
                                              const kcu_view *grad_out)
{
    int rc = kcu_fill(s, grad_x, 0.0);
    if (rc)
        return rc;
    kcu_pool_params p = {0};
    p.nspatial = nspatial;
    kcu_pool_geom g = kcu_geom(&p, grad_x, grad_out);
    int64_t total = g.planes * g.out_n;
    if (total == 0)
        return 0;
    k_adaptive_avg_backward<<<kcu_blocks(total), KCU_THREADS, 0, (cudaStream_t)s>>>(g, *grad_x, *grad_out);
    return KCU_LAUNCHED();
}
