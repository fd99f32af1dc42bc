/*
 * tests/vulkan-nn/test-nn-entries.c — the Vulkan backend's nn entries against the ref
 * oracle, called through the backend interface directly: the gradients and fused entries
 * that the public API reaches only inside autodiff or a graph executor
 * (conv_backward_input, conv_backward_weight, conv_fused with a residual and each
 * activation, epilogue, pool_backward, adaptive_avg_pool_backward,
 * interpolate_backward), over 1-3 spatial dims, groups, strides, padding and dilation,
 * in every float dtype the device has.
 *
 * Each case uploads the same bytes to both devices, runs the entry on identical
 * descriptors and compares the results: normalized squared error for sums over many
 * terms (f32 1e-9, f64 1e-20, f16 1e-5, bf16 1e-4), per element for the epilogues.
 * The device is argv[1] (default vulkan:0: the file sits with the Vulkan suite, whose
 * backend first had these entries; bench/gpu/run also runs it on cuda:0). Exits 77 when
 * the device does not open.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "half.h"
#include "kiln/tensor.h"

static const kiln_backend_iface *B[2]; /* ref, vulkan */
static void *CTX[2];
static int failures, checks;
static uint64_t seed = 0x2545F4914F6CDD1Dull;

static double urand(double lo, double hi)
{
    seed ^= seed << 13;
    seed ^= seed >> 7;
    seed ^= seed << 17;
    return lo + (hi - lo) * (double)(seed >> 11) / 9007199254740992.0;
}

static size_t esize(kiln_dtype dt)
{
    return dt == KILN_F64 || dt == KILN_I64 ? 8 : dt == KILN_F32 ? 4 : 2;
}

static void put(void *p, kiln_dtype dt, int64_t i, double v)
{
    switch (dt) {
    case KILN_F64: ((double *)p)[i] = v; break;
    case KILN_F32: ((float *)p)[i] = (float)v; break;
    case KILN_F16: ((uint16_t *)p)[i] = kiln_f32_to_f16((float)v); break;
    case KILN_BF16: ((uint16_t *)p)[i] = kiln_f32_to_bf16((float)v); break;
    default: ((int64_t *)p)[i] = (int64_t)v; break;
    }
}

static double get(const void *p, kiln_dtype dt, int64_t i)
{
    switch (dt) {
    case KILN_F64: return ((const double *)p)[i];
    case KILN_F32: return ((const float *)p)[i];
    case KILN_F16: return kiln_f16_to_f32(((const uint16_t *)p)[i]);
    case KILN_BF16: return kiln_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return (double)((const int64_t *)p)[i];
    }
}

/* One contiguous tensor on both devices, same bytes. */
typedef struct twin {
    kiln_tdesc d[2];
    int64_t n;
} twin;

static twin make(kiln_dtype dt, int ndim, const int64_t *shape, double lo, double hi)
{
    twin t;
    memset(&t, 0, sizeof t);
    t.n = 1;
    for (int d = 0; d < ndim; d++)
        t.n *= shape[d];
    void *host = calloc((size_t)(t.n + 1), esize(dt));
    for (int64_t i = 0; i < t.n; i++)
        put(host, dt, i, lo == hi ? lo : urand(lo, hi));
    for (int k = 0; k < 2; k++) {
        kiln_tdesc *d = &t.d[k];
        d->buf = B[k]->buffer_alloc(CTX[k], (size_t)(t.n + 1) * esize(dt));
        d->dtype = dt;
        d->ndim = ndim;
        int64_t s = 1;
        for (int i = ndim - 1; i >= 0; i--) {
            d->shape[i] = shape[i];
            d->strides[i] = s;
            s *= shape[i];
        }
        if (!d->buf || B[k]->buffer_upload(CTX[k], d->buf, 0, host, (size_t)t.n * esize(dt)) != 0) {
            fprintf(stderr, "upload failed: %s\n", kiln_error());
            exit(1);
        }
    }
    free(host);
    return t;
}

static void drop(twin *t)
{
    for (int k = 0; k < 2; k++)
        if (t->d[k].buf)
            B[k]->buffer_free(CTX[k], t->d[k].buf);
    memset(t, 0, sizeof *t);
}

/* Compare out on both devices: NMSE (nmse true) or per element |a-b| <= tol·|b| + tol. */
static void compare(const char *what, const twin *out, bool nmse)
{
    kiln_dtype dt = out->d[0].dtype;
    size_t bytes = (size_t)out->n * esize(dt);
    void *h[2] = {malloc(bytes + 8), malloc(bytes + 8)};
    checks++;
    for (int k = 0; k < 2; k++)
        if (B[k]->buffer_download(CTX[k], out->d[k].buf, 0, h[k], bytes) != 0) {
            printf("FAIL %s: download: %s\n", what, kiln_error());
            failures++;
            free(h[0]), free(h[1]);
            return;
        }
    double num = 0, den = 0, worst = 0;
    bool nan_mismatch = false;
    for (int64_t i = 0; i < out->n; i++) {
        double want = get(h[0], dt, i), got = get(h[1], dt, i);
        if (isnan(want) != isnan(got)) {
            nan_mismatch = true;
            continue;
        }
        if (isnan(want))
            continue;
        num += (got - want) * (got - want);
        den += want * want;
        double tol = dt == KILN_F64 ? 1e-12 : dt == KILN_F32 ? 1e-6 : dt == KILN_F16 ? 2e-3 : 1.6e-2;
        double e = fabs(got - want) / (fabs(want) + 1.0);
        if (!nmse && e > tol && e > worst)
            worst = e;
    }
    double limit = dt == KILN_F64 ? 1e-20 : dt == KILN_F32 ? 1e-9 : dt == KILN_F16 ? 1e-5 : 1e-4;
    double err = den > 0 ? num / den : num;
    if (nan_mismatch || (nmse && err > limit) || (!nmse && worst > 0)) {
        printf("FAIL %s (%s): %s %.3g\n", what, kiln_dtype_name(dt),
               nan_mismatch ? "NaN mismatch,"
               : nmse       ? "NMSE"
                            : "worst",
               nmse ? err : worst);
        failures++;
    }
    free(h[0]);
    free(h[1]);
}

static bool dtype_ok(kiln_dtype dt, kiln_entry e)
{
    kiln_op_query q = {e, -1, dt, NULL};
    return !B[1]->supports || B[1]->supports(CTX[1], &q);
}

/* ----------------------------------------------------------- convolution */

typedef struct geo {
    int ns;
    int64_t n, c, o, groups, in[3], k[3], stride[3], pad[3], dil[3];
} geo;

static void conv_case(const geo *g, kiln_dtype dt)
{
    kiln_conv_params p = {.nspatial = g->ns, .groups = g->groups};
    int64_t xs[5] = {g->n, g->c}, ws[5] = {g->o, g->c / g->groups}, ys[5] = {g->n, g->o};
    for (int d = 0; d < g->ns; d++) {
        p.stride[d] = g->stride[d];
        p.padding[d] = g->pad[d];
        p.dilation[d] = g->dil[d];
        xs[2 + d] = g->in[d];
        ws[2 + d] = g->k[d];
        ys[2 + d] = (g->in[d] + 2 * g->pad[d] - g->dil[d] * (g->k[d] - 1) - 1) / g->stride[d] + 1;
    }
    char what[160];
    snprintf(what, sizeof what, "%s %dd n%lld c%lld o%lld g%lld k%lld s%lld p%lld d%lld", kiln_dtype_name(dt),
             g->ns, (long long)g->n, (long long)g->c, (long long)g->o, (long long)g->groups, (long long)g->k[0],
             (long long)g->stride[0], (long long)g->pad[0], (long long)g->dil[0]);
    twin x = make(dt, g->ns + 2, xs, -1, 1), w = make(dt, g->ns + 2, ws, -1, 1),
         gy = make(dt, g->ns + 2, ys, -1, 1);
    twin gx = make(dt, g->ns + 2, xs, 0, 0), gw = make(dt, g->ns + 2, ws, 0, 0);
    char name[200];
    int rc = 0;
    for (int k = 0; k < 2 && rc == 0; k++)
        rc = B[k]->conv_backward_input(CTX[k], &p, &gx.d[k], &gy.d[k], &w.d[k]);
    snprintf(name, sizeof name, "conv_backward_input %s", what);
    if (rc != 0)
        printf("FAIL %s: %s\n", name, kiln_error()), failures++;
    else
        compare(name, &gx, true);
    for (int k = 0; k < 2 && rc == 0; k++)
        rc = B[k]->conv_backward_weight(CTX[k], &p, &gw.d[k], &x.d[k], &gy.d[k]);
    snprintf(name, sizeof name, "conv_backward_weight %s", what);
    if (rc != 0)
        printf("FAIL %s: %s\n", name, kiln_error()), failures++;
    else
        compare(name, &gw, true);
    drop(&x), drop(&w), drop(&gy), drop(&gx), drop(&gw);
}

static const char *act_names[KILN_EPI_COUNT] = {"none",         "relu",       "leaky_relu", "clamp",
                                                "hard_sigmoid", "hard_swish", "sigmoid"};

/* The oracle's epilogue: out[i] = act((out[i] + bias[i % last]) + res[i]) on the host, in
 * float, rounding after each add as the separate ops do. bias or res may be NULL. */
static void host_epilogue(float *out, const float *bias, const float *res, int64_t n, int64_t last, int act,
                          float a, float b)
{
    for (int64_t i = 0; i < n; i++) {
        float v = out[i], t;
        if (bias)
            v = v + bias[i % last];
        if (res)
            v = v + res[i];
        switch (act) {
        case KILN_EPI_RELU: v = v < 0 ? 0.0f : v; break;
        case KILN_EPI_LEAKY_RELU: v = v < 0 ? v * a : v; break;
        case KILN_EPI_CLAMP: v = v < a ? a : (v > b ? b : v); break;
        case KILN_EPI_HARD_SIGMOID:
            t = v * a + b;
            v = t < 0 ? 0.0f : (t > 1 ? 1.0f : t);
            break;
        case KILN_EPI_HARD_SWISH:
            t = v * (1.0f / 6.0f) + 0.5f;
            v = v * (t < 0 ? 0.0f : (t > 1 ? 1.0f : t));
            break;
        case KILN_EPI_SIGMOID: v = (float)(1.0 / (1.0 + exp(-(double)v))); break;
        default: break;
        }
        out[i] = v;
    }
}

/* conv_fused (f32) with a residual and each activation, and the epilogue entry. */
static void fused_cases(void)
{
    kiln_conv_params p = {.nspatial = 2, .groups = 1, .stride = {1, 1}, .padding = {1, 1}, .dilation = {1, 1}};
    int64_t xs[4] = {2, 3, 9, 10}, ws[4] = {5, 3, 3, 3}, ys[4] = {2, 5, 9, 10}, bs[1] = {5};
    twin x = make(KILN_F32, 4, xs, -1, 1), w = make(KILN_F32, 4, ws, -1, 1), b = make(KILN_F32, 1, bs, -1, 1);
    twin res = make(KILN_F32, 4, ys, -2, 2);
    for (int act = 0; act < KILN_EPI_COUNT; act++) {
        twin y = make(KILN_F32, 4, ys, 0, 0);
        kiln_epilogue ep[2];
        for (int k = 0; k < 2; k++)
            ep[k] = (kiln_epilogue){.act = (kiln_epilogue_act)act,
                                    .alpha = act == KILN_EPI_CLAMP ? -0.5 : 0.2,
                                    .beta = act == KILN_EPI_CLAMP ? 0.7 : 0.5,
                                    .residual = &res.d[k]};
        /* ref has no conv_fused: its plain conv, then the epilogue on the host */
        int rc = B[0]->conv(CTX[0], &p, &y.d[0], &x.d[0], &w.d[0], &b.d[0]);
        if (rc == 0)
            rc = B[1]->conv_fused(CTX[1], &p, &y.d[1], &x.d[1], &w.d[1], NULL, &b.d[1], &ep[1]);
        char name[80];
        snprintf(name, sizeof name, "conv_fused residual %s", act_names[act]);
        if (rc != 0) {
            printf("FAIL %s: %s\n", name, kiln_error());
            failures++;
        } else {
            float yh[2 * 5 * 9 * 10], rh[2 * 5 * 9 * 10];
            B[0]->buffer_download(CTX[0], y.d[0].buf, 0, yh, sizeof yh);
            B[0]->buffer_download(CTX[0], res.d[0].buf, 0, rh, sizeof rh);
            host_epilogue(yh, NULL, rh, y.n, 10, act, (float)ep[0].alpha, (float)ep[0].beta);
            B[0]->buffer_upload(CTX[0], y.d[0].buf, 0, yh, sizeof yh);
            compare(name, &y, false);
        }
        drop(&y);
    }
    /* epilogue: out = act(out + bias + residual) in place */
    int64_t os[2] = {7, 37}, lb[1] = {37};
    twin bias = make(KILN_F32, 1, lb, -1, 1), r2 = make(KILN_F32, 2, os, -1, 1);
    for (int act = 0; act < KILN_EPI_COUNT; act++) {
        twin out = make(KILN_F32, 2, os, -3, 3);
        /* the oracle: the host computes act(out + bias + residual) from the same bytes */
        float o0[7 * 37], bh[37], rh[7 * 37];
        B[0]->buffer_download(CTX[0], out.d[0].buf, 0, o0, sizeof o0);
        B[0]->buffer_download(CTX[0], bias.d[0].buf, 0, bh, sizeof bh);
        B[0]->buffer_download(CTX[0], r2.d[0].buf, 0, rh, sizeof rh);
        float a = act == KILN_EPI_CLAMP ? -0.5f : 0.2f, bb = act == KILN_EPI_CLAMP ? 0.7f : 0.5f;
        host_epilogue(o0, bh, rh, out.n, 37, act, a, bb);
        B[0]->buffer_upload(CTX[0], out.d[0].buf, 0, o0, sizeof o0);
        kiln_epilogue ep = {
            .act = (kiln_epilogue_act)act, .alpha = a, .beta = bb, .bias = &bias.d[1], .residual = &r2.d[1]};
        char name[80];
        snprintf(name, sizeof name, "epilogue bias+residual %s", act_names[act]);
        if (B[1]->epilogue(CTX[1], &out.d[1], &ep) != 0) {
            printf("FAIL %s: %s\n", name, kiln_error());
            failures++;
        } else {
            compare(name, &out, false);
        }
        drop(&out);
    }
    drop(&x), drop(&w), drop(&b), drop(&res), drop(&bias), drop(&r2);
}

/* ----------------------------------------------------------- pooling and resizing */

static void pool_case(kiln_dtype dt, kiln_pool_kind kind, int ns, const int64_t *xs, int64_t k, int64_t s,
                      int64_t pd, int64_t dil, bool include_pad)
{
    kiln_pool_params p = {.nspatial = ns, .kind = kind, .count_include_pad = include_pad};
    int64_t ys[5] = {xs[0], xs[1]};
    for (int d = 0; d < ns; d++) {
        p.kernel[d] = k, p.stride[d] = s, p.padding[d] = pd, p.dilation[d] = kind == KILN_POOL_MAX ? dil : 1;
        ys[2 + d] = (xs[2 + d] + 2 * pd - p.dilation[d] * (k - 1) - 1) / s + 1;
    }
    twin x = make(dt, ns + 2, xs, -3, 3), y = make(dt, ns + 2, ys, 0, 0), idx = make(KILN_I64, ns + 2, ys, 0, 0);
    twin gy = make(dt, ns + 2, ys, -1, 1), gx = make(dt, ns + 2, xs, 0, 0);
    bool max = kind == KILN_POOL_MAX;
    int rc = 0;
    for (int kk = 0; kk < 2 && rc == 0; kk++)
        rc = B[kk]->pool(CTX[kk], &p, &y.d[kk], max ? &idx.d[kk] : NULL, &x.d[kk]);
    for (int kk = 0; kk < 2 && rc == 0; kk++)
        rc = B[kk]->pool_backward(CTX[kk], &p, &gx.d[kk], &gy.d[kk], max ? &idx.d[kk] : NULL);
    char name[120];
    snprintf(name, sizeof name, "pool_backward %s %dd k%lld s%lld p%lld d%lld%s", max ? "max" : "avg", ns,
             (long long)k, (long long)s, (long long)pd, (long long)dil, include_pad ? " include_pad" : "");
    if (rc != 0)
        printf("FAIL %s: %s\n", name, kiln_error()), failures++;
    else
        compare(name, &gx, true);
    drop(&x), drop(&y), drop(&idx), drop(&gy), drop(&gx);
}

static void adaptive_case(kiln_dtype dt, int ns, const int64_t *xs, const int64_t *ys)
{
    twin gy = make(dt, ns + 2, ys, -1, 1), gx = make(dt, ns + 2, xs, 0, 0);
    int rc = 0;
    for (int k = 0; k < 2 && rc == 0; k++)
        rc = B[k]->adaptive_avg_pool_backward(CTX[k], ns, &gx.d[k], &gy.d[k]);
    char name[80];
    snprintf(name, sizeof name, "adaptive_avg_pool_backward %dd %lld -> %lld", ns, (long long)xs[ns + 1],
             (long long)ys[ns + 1]);
    if (rc != 0)
        printf("FAIL %s: %s\n", name, kiln_error()), failures++;
    else
        compare(name, &gx, true);
    drop(&gy), drop(&gx);
}

static void interp_case(kiln_dtype dt, int ns, const int64_t *xs, const int64_t *ys, kiln_interp_mode mode,
                        bool align)
{
    twin gy = make(dt, ns + 2, ys, -1, 1), gx = make(dt, ns + 2, xs, 0, 0);
    int rc = 0;
    for (int k = 0; k < 2 && rc == 0; k++)
        rc = B[k]->interpolate_backward(CTX[k], mode, align, &gx.d[k], &gy.d[k]);
    char name[100];
    snprintf(name, sizeof name, "interpolate_backward %s %dd %lld -> %lld%s", mode ? "linear" : "nearest", ns,
             (long long)xs[ns + 1], (long long)ys[ns + 1], align ? " align_corners" : "");
    if (rc != 0)
        printf("FAIL %s: %s\n", name, kiln_error()), failures++;
    else
        compare(name, &gx, true);
    drop(&gy), drop(&gx);
}

int main(int argc, char **argv)
{
    /* the device under test: vulkan:0 by default; bench/gpu/run names cuda:0 too */
    const char *spec = argc > 1 ? argv[1] : "vulkan:0";
    kiln_device *ref = kiln_device_open("ref"), *vk = kiln_device_open(spec);
    if (!vk) {
        printf("skipped: %s does not open: %s\n", spec, kiln_error());
        return 77;
    }
    if (!ref)
        return fprintf(stderr, "ref: %s\n", kiln_error()), 1;
    kiln_device *dev[2] = {ref, vk};
    for (int k = 0; k < 2; k++) {
        B[k] = kiln__device_iface(dev[k]);
        CTX[k] = kiln__device_ctx(dev[k]);
    }
    static const geo geos[] = {
        {2, 3, 4, 6, 1, {9, 11}, {3, 3}, {1, 1}, {1, 1}, {1, 1}},
        {2, 2, 4, 6, 2, {8, 7}, {3, 2}, {2, 1}, {1, 0}, {2, 1}},
        {1, 2, 3, 5, 1, {17}, {5}, {2}, {2}, {1}},
        {3, 1, 2, 4, 2, {5, 6, 4}, {2, 3, 2}, {1, 2, 1}, {1, 1, 1}, {1, 1, 1}},
        {2, 2, 6, 6, 6, {7, 7}, {3, 3}, {2, 2}, {1, 1}, {1, 1}},
        {2, 16, 8, 16, 1, {14, 14}, {3, 3}, {1, 1}, {1, 1}, {1, 1}},
        {1, 3, 5, 4, 1, {9}, {1}, {3}, {0}, {1}},
    };
    static const kiln_dtype dts[4] = {KILN_F32, KILN_F64, KILN_F16, KILN_BF16};
    for (int t = 0; t < 4; t++) {
        if (!dtype_ok(dts[t], KILN_ENTRY_CONV_BACKWARD_WEIGHT)) {
            printf("%s: not supported by this device, its cases not run\n", kiln_dtype_name(dts[t]));
            continue;
        }
        for (size_t i = 0; i < sizeof geos / sizeof geos[0]; i++)
            conv_case(&geos[i], dts[t]);
        int64_t x2[4] = {2, 3, 11, 13}, x1[3] = {2, 3, 17};
        pool_case(dts[t], KILN_POOL_MAX, 2, x2, 3, 2, 1, 1, false);
        pool_case(dts[t], KILN_POOL_MAX, 2, x2, 3, 1, 1, 2, false);
        pool_case(dts[t], KILN_POOL_AVG, 2, x2, 3, 2, 1, 1, true);
        pool_case(dts[t], KILN_POOL_AVG, 2, x2, 3, 2, 1, 1, false);
        pool_case(dts[t], KILN_POOL_MAX, 1, x1, 4, 3, 2, 1, false);
        int64_t a_out[4] = {2, 3, 4, 5}, a_up[4] = {2, 3, 15, 20};
        adaptive_case(dts[t], 2, x2, a_out);
        adaptive_case(dts[t], 2, x2, a_up);
        int64_t i_up[4] = {2, 3, 22, 30}, i_dn[4] = {2, 3, 5, 6};
        for (int mode = 0; mode < 2; mode++)
            for (int align = 0; align < 1 + mode; align++) {
                interp_case(dts[t], 2, x2, i_up, (kiln_interp_mode)mode, align);
                interp_case(dts[t], 2, x2, i_dn, (kiln_interp_mode)mode, align);
            }
    }
    fused_cases();
    printf("%d checks, %d failed\n", checks, failures);
    kiln_device_close(vk);
    kiln_device_close(ref);
    return failures ? 1 : 0;
}
