/*
 * backends/remote/wire-check.c — the shape preconditions of backends/backend.h checked on a
 * decoded op (kiln_wire_op_check_shapes), and the span of memory a view touches
 * (kiln_wire_td_span). Neither needs a session: the server (remote-exec.c) adds its own checks
 * of ids, buffer bounds and quotas.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "wire.h"

int kiln_wire_td_span(const kiln_wire_td *td, int64_t *lo, int64_t *hi, bool *empty)
{
    *empty = false;
    int64_t l = td->offset, h = td->offset;
    for (int d = 0; d < td->ndim; d++) {
        if (td->shape[d] == 0) {
            *empty = true;
            *lo = *hi = td->offset;
            return 0;
        }
    }
    for (int d = 0; d < td->ndim; d++) {
        int64_t ext;
        if (__builtin_mul_overflow(td->shape[d] - 1, td->strides[d], &ext))
            return -1;
        if (ext < 0) {
            if (__builtin_add_overflow(l, ext, &l))
                return -1;
        } else if (__builtin_add_overflow(h, ext, &h)) {
            return -1;
        }
    }
    *lo = l;
    *hi = h;
    return 0;
}

static bool same_shape(const kiln_wire_td *a, const kiln_wire_td *b)
{
    if (a->ndim != b->ndim)
        return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d])
            return false;
    return true;
}

static bool contiguous(const kiln_wire_td *t)
{
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->strides[d] != s)
            return false;
        /* An empty view's trailing dims may multiply past int64: not contiguous then. */
        if (__builtin_mul_overflow(s, t->shape[d], &s))
            return false;
    }
    return true;
}

static int64_t numel(const kiln_wire_td *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        if (__builtin_mul_overflow(n, t->shape[d], &n))
            return -1;
    return n;
}

static bool is_float(kiln_dtype dt)
{
    return dt == KILN_F32 || dt == KILN_F64 || dt == KILN_F16 || dt == KILN_BF16;
}

#define CHECK(cond, ...)                                                                                          \
    do {                                                                                                          \
        if (!(cond))                                                                                              \
            return kiln__wire_fail(-1, why, wl, __VA_ARGS__);                                                     \
    } while (0)

/* Convolution / pooling geometry: sizes from the spatial dims of x and out agree. */
static int check_geom(const char *name, int ns, const int64_t *kernel, const int64_t *stride, const int64_t *pad,
                      const int64_t *dil, const kiln_wire_td *x, const kiln_wire_td *out, bool allow_ceil,
                      char *why, size_t wl)
{
    for (int s = 0; s < ns; s++) {
        CHECK(stride[s] >= 1 && stride[s] <= (1 << 20) && dil[s] >= 1 && dil[s] <= (1 << 20) && pad[s] >= 0 &&
                  pad[s] <= (1 << 20) && kernel[s] >= 1 && kernel[s] <= (1 << 20),
              "%s: stride, dilation, padding or kernel out of range in spatial dim %d", name, s);
        int64_t in = x->shape[2 + s];
        CHECK(in <= (INT64_C(1) << 40), "%s: spatial dim %d of %lld is too large", name, s, (long long)in);
        int64_t span = dil[s] * (kernel[s] - 1) + 1;
        int64_t o = in + 2 * pad[s] >= span ? (in + 2 * pad[s] - span) / stride[s] + 1 : 0;
        /* Pooling's ceil_mode (resolved into the output's size by the front end) may add one
         * window, when it starts inside the input or its left padding (PyTorch's rule). */
        int64_t oc = in + 2 * pad[s] >= span ? (in + 2 * pad[s] - span + stride[s] - 1) / stride[s] + 1 : 0;
        if (oc > o && (oc - 1) * stride[s] >= in + pad[s])
            oc--;
        CHECK(in + 2 * pad[s] >= span && (out->shape[2 + s] == o || (allow_ceil && out->shape[2 + s] == oc)),
              "%s: output size %lld in spatial dim %d, expected %lld", name, (long long)out->shape[2 + s], s,
              (long long)o);
    }
    return 0;
}

static int check_conv(const kiln_wire_op *op, const kiln_wire_td *out, const kiln_wire_td *x,
                      const kiln_wire_td *w, char *why, size_t wl)
{
    const char *name = kiln_wire_prim_lookup(op->prim)->name;
    int ns = (int)op->i[0];
    CHECK(ns >= 1 && ns <= 3, "%s: nspatial %d not in 1..3", name, ns);
    const int64_t *stride = &op->i[1], *pad = &op->i[4], *dil = &op->i[7];
    int64_t groups = op->i[10];
    CHECK(x->ndim == ns + 2 && w->ndim == ns + 2 && out->ndim == ns + 2, "%s: operands must have %d dims", name,
          ns + 2);
    CHECK(groups >= 1 && x->shape[1] % groups == 0 && w->shape[0] % groups == 0 &&
              w->shape[1] == x->shape[1] / groups, /* divided, not multiplied: sizes are untrusted */
          "%s: groups %lld do not divide the channels", name, (long long)groups);
    CHECK(out->shape[0] == x->shape[0] && out->shape[1] == w->shape[0], "%s: batch or channel mismatch", name);
    CHECK(out->dtype == x->dtype && w->dtype == x->dtype, "%s: operands must share a dtype", name);
    return check_geom(name, ns, &w->shape[2], stride, pad, dil, x, out, false, why, wl);
}

static int check_pool(const kiln_wire_op *op, const kiln_wire_td *out, const kiln_wire_td *idx,
                      const kiln_wire_td *x, char *why, size_t wl)
{
    const char *name = kiln_wire_prim_lookup(op->prim)->name;
    int ns = (int)op->i[0];
    CHECK(ns >= 1 && ns <= 3, "%s: nspatial %d not in 1..3", name, ns);
    CHECK(x->ndim == ns + 2 && out->ndim == ns + 2, "%s: operands must have %d dims", name, ns + 2);
    CHECK(out->shape[0] == x->shape[0] && out->shape[1] == x->shape[1], "%s: batch or channel mismatch", name);
    CHECK(out->dtype == x->dtype, "%s: operands must share a dtype", name);
    if (idx->id) {
        CHECK(op->sub == KILN_POOL_MAX, "%s: indices only with max pooling", name);
        CHECK(idx->dtype == KILN_I64 && same_shape(idx, out), "%s: indices must be i64 of the output's shape",
              name);
    }
    /* The geometry first: it bounds kernel and padding, so doubling the padding cannot overflow. */
    if (check_geom(name, ns, &op->i[1], &op->i[4], &op->i[7], &op->i[10], x, out, true, why, wl) < 0)
        return -1;
    for (int s = 0; s < ns; s++)
        CHECK(2 * op->i[7 + s] <= op->i[1 + s], "%s: padding more than half the kernel", name);
    return 0;
}

int kiln_wire_op_check_shapes(const kiln_wire_op *op, char *why, size_t wl)
{
    const kiln_wire_prim_info *info = kiln_wire_prim_lookup(op->prim);
    CHECK(info && op->ntd == info->ntd, "unknown primitive %d", (int)op->prim);
    const kiln_wire_td *t = op->td;
    for (int k = 0; k < op->ntd; k++)
        CHECK(t[k].id == 0 || numel(&t[k]) >= 0, "%s: operand %d has too many elements", info->name, k);
    const char *name = info->name;
    switch (op->prim) {
    case KILN_WIRE_P_FILL: return 0;
    case KILN_WIRE_P_ARANGE:
    case KILN_WIRE_P_RNG: CHECK(contiguous(&t[0]), "%s: output must be contiguous", name); return 0;
    case KILN_WIRE_P_COPY: CHECK(same_shape(&t[0], &t[1]), "copy: shapes differ"); return 0;
    case KILN_WIRE_P_UNARY: CHECK(same_shape(&t[0], &t[1]), "unary: shapes differ"); return 0;
    case KILN_WIRE_P_BINARY: {
        CHECK(same_shape(&t[0], &t[1]) && same_shape(&t[0], &t[2]), "binary: shapes differ");
        CHECK(t[1].dtype == t[2].dtype, "binary: a and b must share a dtype");
        return 0;
    }
    case KILN_WIRE_P_WHERE:
        CHECK(same_shape(&t[0], &t[1]) && same_shape(&t[0], &t[2]) && same_shape(&t[0], &t[3]),
              "where: shapes differ");
        CHECK(t[1].dtype == KILN_BOOL && t[2].dtype == t[0].dtype && t[3].dtype == t[0].dtype,
              "where: cond must be bool, a and b the output's dtype");
        return 0;
    case KILN_WIRE_P_REDUCE: {
        CHECK(t[0].ndim == t[1].ndim, "reduce: output must keep the input's rank");
        CHECK(op->i[0] >= 0 && (op->i[0] >> t[1].ndim) == 0, "reduce: mask names dims the input lacks");
        for (int d = 0; d < t[1].ndim; d++)
            CHECK(t[0].shape[d] == (((op->i[0] >> d) & 1) ? 1 : t[1].shape[d]), "reduce: output size in dim %d",
                  d);
        CHECK(contiguous(&t[0]), "reduce: output must be contiguous");
        return 0;
    }
    case KILN_WIRE_P_ARG_REDUCE:
    case KILN_WIRE_P_CUMSUM:
    case KILN_WIRE_P_SOFTMAX: {
        int64_t dim = op->i[0];
        CHECK(dim >= 0 && dim < t[1].ndim, "%s: dim %lld out of range", name, (long long)dim);
        CHECK(t[0].ndim == t[1].ndim, "%s: ranks differ", name);
        for (int d = 0; d < t[1].ndim; d++)
            CHECK(t[0].shape[d] == (op->prim == KILN_WIRE_P_ARG_REDUCE && d == dim ? 1 : t[1].shape[d]),
                  "%s: output size in dim %d", name, d);
        if (op->prim == KILN_WIRE_P_ARG_REDUCE)
            CHECK(t[0].dtype == KILN_I64, "arg_reduce: output must be i64");
        if (op->prim == KILN_WIRE_P_SOFTMAX)
            CHECK(is_float(t[0].dtype) && is_float(t[1].dtype), "softmax: operands must be floating point");
        CHECK(contiguous(&t[0]), "%s: output must be contiguous", name);
        return 0;
    }
    case KILN_WIRE_P_SORT: {
        int64_t dim = op->i[0];
        CHECK(dim >= 0 && dim < t[2].ndim, "sort: dim out of range");
        CHECK(same_shape(&t[0], &t[2]) && same_shape(&t[1], &t[2]), "sort: shapes differ");
        CHECK(t[1].dtype == KILN_I64 && t[0].dtype == t[2].dtype, "sort: indices must be i64");
        CHECK(contiguous(&t[0]) && contiguous(&t[1]), "sort: outputs must be contiguous");
        return 0;
    }
    case KILN_WIRE_P_GATHER:
    case KILN_WIRE_P_SCATTER:
    case KILN_WIRE_P_INDEX_SELECT:
    case KILN_WIRE_P_INDEX_ADD: {
        /* gather/index_select: out, in, index. scatter/index_add: out, index, src. */
        bool fwd = op->prim == KILN_WIRE_P_GATHER || op->prim == KILN_WIRE_P_INDEX_SELECT;
        const kiln_wire_td *out = &t[0], *data = fwd ? &t[1] : &t[2], *index = fwd ? &t[2] : &t[1];
        int64_t dim = op->i[0];
        CHECK(dim >= 0 && dim < out->ndim && out->ndim == data->ndim, "%s: dim or ranks out of range", name);
        CHECK(index->dtype == KILN_I64 && out->dtype == data->dtype,
              "%s: index must be i64, data the output's dtype", name);
        CHECK(contiguous(out), "%s: output must be contiguous", name);
        if (op->prim == KILN_WIRE_P_INDEX_SELECT || op->prim == KILN_WIRE_P_INDEX_ADD) {
            /* out[.., idx[i], ..] along dim; index is 1-d with as many entries as the indexed side */
            const kiln_wire_td *indexed = op->prim == KILN_WIRE_P_INDEX_SELECT ? out : data;
            CHECK(index->ndim == 1 && index->shape[0] == indexed->shape[dim], "%s: index length", name);
            for (int d = 0; d < out->ndim; d++)
                CHECK(d == dim || out->shape[d] == data->shape[d], "%s: size in dim %d", name, d);
        } else {
            /* gather: index has out's shape; scatter: index has src's shape; other dims fit. */
            const kiln_wire_td *small = fwd ? out : data, *big = fwd ? data : out;
            CHECK(same_shape(index, small), "%s: index must have the %s's shape", name, fwd ? "output" : "source");
            for (int d = 0; d < out->ndim; d++)
                CHECK(d == dim || small->shape[d] <= big->shape[d], "%s: size in dim %d", name, d);
        }
        return 0;
    }
    case KILN_WIRE_P_MATMUL: {
        const kiln_wire_td *o = &t[0], *a = &t[1], *b = &t[2];
        int nd = o->ndim;
        CHECK(nd >= 2 && a->ndim == nd && b->ndim == nd, "matmul: operands need the same rank >= 2");
        for (int d = 0; d < nd - 2; d++)
            CHECK(a->shape[d] == o->shape[d] && b->shape[d] == o->shape[d], "matmul: batch dim %d", d);
        CHECK(a->shape[nd - 2] == o->shape[nd - 2] && b->shape[nd - 1] == o->shape[nd - 1] &&
                  a->shape[nd - 1] == b->shape[nd - 2],
              "matmul: inner sizes do not agree");
        CHECK(a->dtype == b->dtype && a->dtype == o->dtype, "matmul: operands must share a dtype");
        CHECK(contiguous(o), "matmul: output must be contiguous");
        return 0;
    }
    case KILN_WIRE_P_CONV:
        if (check_conv(op, &t[0], &t[1], &t[2], why, wl) < 0)
            return -1;
        if (t[3].id)
            CHECK(t[3].ndim == 1 && t[3].shape[0] == t[2].shape[0] && t[3].dtype == t[0].dtype,
                  "conv: bias must be [O] of the output's dtype");
        CHECK(contiguous(&t[0]), "conv: output must be contiguous");
        return 0;
    case KILN_WIRE_P_CONV_BWD_INPUT: /* grad_x, grad_out, w */
        if (check_conv(op, &t[1], &t[0], &t[2], why, wl) < 0)
            return -1;
        CHECK(contiguous(&t[0]), "%s: output must be contiguous", name);
        return 0;
    case KILN_WIRE_P_CONV_BWD_WEIGHT: /* grad_w, x, grad_out */
        if (check_conv(op, &t[2], &t[1], &t[0], why, wl) < 0)
            return -1;
        CHECK(contiguous(&t[0]), "%s: output must be contiguous", name);
        return 0;
    case KILN_WIRE_P_POOL: /* out, indices, x */
        if (check_pool(op, &t[0], &t[1], &t[2], why, wl) < 0)
            return -1;
        CHECK(contiguous(&t[0]), "pool: output must be contiguous");
        return 0;
    case KILN_WIRE_P_POOL_BWD: /* grad_x, grad_out, indices */
        if (check_pool(op, &t[1], &t[2], &t[0], why, wl) < 0)
            return -1;
        CHECK(op->sub != KILN_POOL_MAX || t[2].id, "pool_backward: max pooling needs indices");
        CHECK(contiguous(&t[0]), "pool_backward: output must be contiguous");
        return 0;
    case KILN_WIRE_P_ADAPTIVE_AVG_POOL:
    case KILN_WIRE_P_ADAPTIVE_AVG_POOL_BWD:
    case KILN_WIRE_P_INTERPOLATE:
    case KILN_WIRE_P_INTERPOLATE_BWD: {
        int ns = op->prim == KILN_WIRE_P_INTERPOLATE || op->prim == KILN_WIRE_P_INTERPOLATE_BWD ? 2
                                                                                                : (int)op->i[0];
        CHECK(ns >= 1 && ns <= 3, "%s: nspatial %d not in 1..3", name, ns);
        CHECK(t[0].ndim == t[1].ndim && t[0].ndim >= ns, "%s: ranks", name);
        /* the input side is read at positions derived from the output's: it must not be empty
         * when the output is not */
        const kiln_wire_td *src = op->prim == KILN_WIRE_P_ADAPTIVE_AVG_POOL || op->prim == KILN_WIRE_P_INTERPOLATE
                                      ? &t[1]
                                      : &t[0];
        const kiln_wire_td *dst = src == &t[1] ? &t[0] : &t[1];
        CHECK(numel(dst) == 0 || numel(src) > 0, "%s: empty input for a non-empty output", name);
        for (int d = 0; d < t[0].ndim - ns; d++)
            CHECK(t[0].shape[d] == t[1].shape[d], "%s: leading dim %d differs", name, d);
        CHECK(t[0].dtype == t[1].dtype && is_float(t[0].dtype), "%s: operands must share a floating dtype", name);
        CHECK(contiguous(&t[0]), "%s: output must be contiguous", name);
        return 0;
    }
    case KILN_WIRE_P_PAD: {
        CHECK(t[0].ndim == t[1].ndim, "pad: ranks differ");
        for (int d = 0; d < t[0].ndim; d++) {
            int64_t lo = op->i[2 * d], hi = op->i[2 * d + 1], sz;
            CHECK(t[1].shape[d] <= (INT64_C(1) << 60), "pad: dim %d of the input is too large", d);
            CHECK(lo >= -t[1].shape[d] && hi >= -t[1].shape[d] && lo <= (1LL << 40) && hi <= (1LL << 40),
                  "pad: padding of dim %d out of range", d);
            sz = t[1].shape[d] + lo + hi;
            CHECK(sz == t[0].shape[d], "pad: output size in dim %d", d);
            if (op->sub != KILN_PAD_CONSTANT)
                CHECK(t[1].shape[d] > 0 && lo >= 0 && hi >= 0 &&
                          (op->sub != KILN_PAD_REFLECT || (lo < t[1].shape[d] && hi < t[1].shape[d])),
                      "pad: reflect/replicate padding of dim %d too large for the input", d);
        }
        CHECK(t[0].dtype == t[1].dtype, "pad: dtypes differ");
        CHECK(contiguous(&t[0]), "pad: output must be contiguous");
        return 0;
    }
    case KILN_WIRE_P_LAYER_NORM: { /* out, mean, rstd, x, weight, bias */
        int64_t inner = op->i[0], n = numel(&t[3]);
        CHECK(same_shape(&t[0], &t[3]) && t[0].dtype == t[3].dtype && is_float(t[0].dtype),
              "layer_norm: output must match x");
        CHECK(inner >= 1 && n % inner == 0, "layer_norm: inner %lld does not divide x", (long long)inner);
        for (int k = 1; k <= 2; k++)
            if (t[k].id)
                CHECK((t[k].dtype == KILN_F32 || t[k].dtype == KILN_F64) && numel(&t[k]) == n / inner &&
                          contiguous(&t[k]),
                      "layer_norm: mean/rstd must be f32/f64 with one entry per row");
        for (int k = 4; k <= 5; k++)
            if (t[k].id)
                CHECK(numel(&t[k]) == inner && t[k].dtype == t[3].dtype,
                      "layer_norm: weight/bias must have `inner` entries of x's dtype");
        CHECK(contiguous(&t[0]) && contiguous(&t[3]), "layer_norm: x and out must be contiguous");
        return 0;
    }
    default: return kiln__wire_fail(-1, why, wl, "unknown primitive %d", (int)op->prim);
    }
}
