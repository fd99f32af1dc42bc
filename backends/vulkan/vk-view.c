/*
 * backends/vulkan/vk-view.c — turning kiln_tdesc operands into the views and scalars the
 * shaders read (int32 index math, dims merged where every operand allows), and the
 * dtype / variant names the shader table is keyed by.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "vk-impl.h"

int64_t kvk_numel(const kiln_tdesc *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    return n;
}

static bool fits(int64_t v)
{
    return v >= INT32_MIN && v <= INT32_MAX;
}

/* The largest element offset the view reaches, from its offset and strides. */
static int check_range(const kiln_tdesc *t, const char *op)
{
    int64_t n = kvk_numel(t), hi = t->offset, lo = t->offset;
    if (n == 0)
        return 0;
    for (int d = 0; d < t->ndim; d++) {
        int64_t reach = (t->shape[d] - 1) * t->strides[d];
        if (reach > 0)
            hi += reach;
        else
            lo += reach;
    }
    if (!fits(n) || !fits(hi) || lo < 0 || !fits(t->offset))
        return kiln__error_set("%s: a %s view of %lld elements reaching element %lld is beyond the vulkan "
                               "backend's 32-bit index range",
                               op, kvk_dtype_name(t->dtype), (long long)n, (long long)hi);
    return 0;
}

static bool is_contig(const int32_t *shape, const int32_t *strides, int ndim)
{
    int64_t expect = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        if (shape[d] != 1 && strides[d] != expect)
            return false;
        expect *= shape[d];
    }
    return true;
}

int kvk_view_of(kvk_view *v, const kiln_tdesc *t, const char *op)
{
    return kvk_views_of(v, &t, 1, op);
}

int kvk_views_of(kvk_view *v, const kiln_tdesc *const *t, int n, const char *op)
{
    for (int k = 0; k < n; k++)
        if (check_range(t[k], op) < 0)
            return KILN_EINVAL;
    /* merged dims: drop size-1 dims, fuse d into the previous kept dim when every
     * operand's stride of the previous equals its stride of d times d's size */
    int64_t shape[KILN_MAX_DIMS];
    int64_t strides[KVK_MAX_BUFS][KILN_MAX_DIMS];
    int nd = 0;
    int ndim = t[0]->ndim;
    for (int d = 0; d < ndim; d++) {
        int64_t s = t[0]->shape[d];
        if (s == 1)
            continue;
        bool fuse = nd > 0;
        for (int k = 0; fuse && k < n; k++)
            if (strides[k][nd - 1] != t[k]->strides[d] * s)
                fuse = false;
        if (fuse) {
            shape[nd - 1] *= s;
            for (int k = 0; k < n; k++)
                strides[k][nd - 1] = t[k]->strides[d];
        } else {
            shape[nd] = s;
            for (int k = 0; k < n; k++)
                strides[k][nd] = t[k]->strides[d];
            nd++;
        }
    }
    int64_t numel = kvk_numel(t[0]);
    if (numel == 0)
        nd = 0;
    for (int k = 0; k < n; k++) {
        memset(&v[k], 0, sizeof v[k]);
        v[k].offset = (int32_t)t[k]->offset;
        v[k].ndim = nd;
        v[k].numel = (int32_t)numel;
        for (int d = 0; d < KILN_MAX_DIMS; d++) {
            v[k].shape[d] = d < nd ? (int32_t)shape[d] : 1;
            v[k].strides[d] = d < nd ? (int32_t)strides[k][d] : 0;
        }
        v[k].contig = is_contig(v[k].shape, v[k].strides, nd);
    }
    return 0;
}

static int64_t sat_i64(double v)
{
    if (isnan(v))
        return 0;
    if (v >= 9223372036854775808.0)
        return INT64_MAX;
    if (v < -9223372036854775808.0)
        return INT64_MIN;
    return (int64_t)v;
}

kvk_scalar kvk_scalar_of(double v)
{
    kvk_scalar s;
    s.f = (float)v;
    int64_t l = sat_i64(v);
    s.i = (int32_t)(uint32_t)(uint64_t)l;
    uint64_t bits;
    memcpy(&bits, &v, 8);
    s.d[0] = (uint32_t)bits;
    s.d[1] = (uint32_t)(bits >> 32);
    s.l[0] = (uint32_t)(uint64_t)l;
    s.l[1] = (uint32_t)((uint64_t)l >> 32);
    return s;
}

const char *kvk_dtype_name(kiln_dtype dt)
{
    static const char *const names[KILN_DTYPE_COUNT] = {
        [KILN_F32] = "f32", [KILN_F64] = "f64", [KILN_F16] = "f16", [KILN_BF16] = "bf16",
        [KILN_I64] = "i64", [KILN_I32] = "i32", [KILN_U8] = "u8",   [KILN_BOOL] = "bool",
    };
    return (unsigned)dt < KILN_DTYPE_COUNT ? names[dt] : "?";
}

const char *kvk_variant(char *buf, size_t len, int n, const kiln_dtype *dts)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && used < len; i++) {
        int w = snprintf(buf + used, len - used, "%s%s", i ? "_" : "", kvk_dtype_name(dts[i]));
        if (w < 0)
            break;
        used += (size_t)w;
    }
    return buf;
}

kvk_spec kvk_spec_1d(int n, const uint32_t *c)
{
    kvk_spec s = {.wg = {KVK_WG, 1, 1}, .n = 0};
    for (int i = 0; i < n && i < KVK_SPEC_MAX; i++)
        s.c[s.n++] = c[i];
    return s;
}

uint32_t kvk_groups(int64_t n, uint32_t wg)
{
    int64_t g = (n + wg - 1) / wg;
    if (g < 1)
        g = 1;
    if (g > KVK_GROUPS_MAX)
        g = KVK_GROUPS_MAX;
    return (uint32_t)g;
}

int kvk_view_exact(kvk_view *v, const kiln_tdesc *t, const char *op)
{
    if (check_range(t, op) < 0)
        return KILN_EINVAL;
    memset(v, 0, sizeof *v);
    v->offset = (int32_t)t->offset;
    v->ndim = t->ndim;
    v->numel = (int32_t)kvk_numel(t);
    for (int d = 0; d < KILN_MAX_DIMS; d++) {
        v->shape[d] = d < t->ndim ? (int32_t)t->shape[d] : 1;
        v->strides[d] = d < t->ndim ? (int32_t)t->strides[d] : 0;
    }
    v->contig = is_contig(v->shape, v->strides, t->ndim);
    return 0;
}
