/*
 * engine/ops-reduce.c — reductions, arg-reductions, cumulative sum, sort and topk.
 *
 * Backends always reduce into a keepdim-shaped output of the input's dtype (bool for
 * any/all); the front end picks the result dtype (integer sums give i64, statistics of
 * integers give f32, as PyTorch does), casts the input to it first, and drops the
 * reduced dims afterwards with a view. The mean, var and std of integers are computed in
 * f64 where the device has it and rounded to f32 once. Reductions over an empty dim never reach the
 * backend: their value is known (0 for sum, 1 for prod, NaN for mean, ...).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "autograd-impl.h"
#include "tensor-impl.h"

/* Reduced-dims bit mask from the caller's list; ndims == 0 means every dim. */
static int dims_mask(const kiln_tensor *t, int ndims, const int *dims, uint32_t *mask, const char *op)
{
    *mask = 0;
    if (ndims < 0 || (ndims > 0 && !dims))
        return kiln__error_set("%s: invalid dim list (%d dims)", op, ndims);
    if (ndims == 0) {
        *mask = t->ndim ? (uint32_t)((1u << t->ndim) - 1) : 0;
        return 0;
    }
    for (int i = 0; i < ndims; i++) {
        int d = kiln__wrap_dim(dims[i], t->ndim, op);
        if (d < 0)
            return -1;
        if (t->ndim == 0)
            continue;
        if (*mask & (1u << d))
            return kiln__error_set("%s: dim %d appears twice in the reduction list", op, dims[i]);
        *mask |= 1u << d;
    }
    return 0;
}

static kiln_dtype reduce_dtype(kiln_reduce_op op, kiln_dtype in)
{
    bool fl = kiln_dtype_is_float(in);
    switch (op) {
    case KILN_REDUCE_SUM: case KILN_REDUCE_PROD:
        return fl ? in : KILN_I64;
    case KILN_REDUCE_MAX: case KILN_REDUCE_MIN:
        return in;
    case KILN_REDUCE_ANY: case KILN_REDUCE_ALL:
        return KILN_BOOL;
    default:
        return fl ? in : KILN_F32;
    }
}

/* The value of a reduction over no elements; false when it has none. */
static bool empty_value(kiln_reduce_op op, double *v)
{
    switch (op) {
    case KILN_REDUCE_SUM: case KILN_REDUCE_NORM: case KILN_REDUCE_ANY: *v = 0; return true;
    case KILN_REDUCE_PROD: case KILN_REDUCE_ALL: *v = 1; return true;
    case KILN_REDUCE_LOGSUMEXP: *v = -INFINITY; return true;
    case KILN_REDUCE_MEAN: case KILN_REDUCE_VAR: case KILN_REDUCE_STD: *v = NAN; return true;
    default: return false;
    }
}

/* Drop the reduced dims of a keepdim result (a view of the same storage). */
static kiln_tensor *drop_dims(kiln_tensor *r, uint32_t mask)
{
    int64_t sh[KILN_MAX_DIMS], st[KILN_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < r->ndim; i++) {
        if (mask & (1u << i))
            continue;
        sh[n] = r->shape[i];
        st[n++] = r->strides[i];
    }
    kiln_tensor *v = kiln__view(r, n, sh, st, r->offset);
    kiln_tensor_release(r);
    return v;
}

static kiln_tensor *reduce_impl(kiln_reduce_op op, kiln_tensor *t, int ndims, const int *dims,
                                bool keepdim, double param)
{
    const char *name = kiln__reduce_name(op);
    uint32_t mask;
    if (dims_mask(t, ndims, dims, &mask, name) < 0)
        return NULL;
    kiln_dtype odt = reduce_dtype(op, t->dtype), cdt = odt;
    /* An f32 copy of an integer tensor holds its values only to 2^24, and the sums of a
     * mean or a variance of large integers lose the rest in an f32 accumulator: those
     * compute in f64 where the device has it (the result is still f32, rounded once). */
    if (!kiln_dtype_is_float(t->dtype) &&
        (op == KILN_REDUCE_MEAN || op == KILN_REDUCE_VAR || op == KILN_REDUCE_STD) &&
        kiln__supports(kiln__dev(t), KILN_ENTRY_REDUCE, (int)op, KILN_F64, NULL))
        cdt = KILN_F64;
    int64_t kshape[KILN_MAX_DIMS];
    bool empty_reduce = false;
    for (int i = 0; i < t->ndim; i++) {
        kshape[i] = (mask & (1u << i)) ? 1 : t->shape[i];
        if ((mask & (1u << i)) && t->shape[i] == 0)
            empty_reduce = true;
    }
    kiln_tensor *out = kiln__alloc(kiln__dev(t), cdt, t->ndim, kshape, name);
    if (!out)
        return NULL;
    int rc = 0;
    if (kiln__numel(out) == 0) {
        /* nothing to compute */
    } else if (empty_reduce) {
        double v;
        char ds[200];
        if (empty_value(op, &v))
            rc = kiln__fill(out, v, name);
        else
            rc = kiln__error_set("%s: cannot reduce %s over an empty dim (no identity)", name,
                                 kiln__describe(t, ds, sizeof ds));
    } else {
        const kiln_backend_iface *be = kiln__be(t);
        kiln_tensor *in = (op == KILN_REDUCE_ANY || op == KILN_REDUCE_ALL) ? kiln_tensor_retain(t)
                                                                           : kiln__cast(t, cdt, name);
        if (!in) {
            rc = -1;
        } else if (!kiln__supports(kiln__dev(t), KILN_ENTRY_REDUCE, (int)op, in->dtype, NULL)) {
            rc = kiln__unsupported(kiln__dev(t), name, KILN_ENTRY_REDUCE, (int)op, in->dtype);
        } else {
            kiln_tdesc od, id;
            kiln__desc(out, &od);
            kiln__desc(in, &id);
            rc = be->reduce(kiln__ctx(t), op, &od, &id, mask, param);
        }
        kiln_tensor_release(in);
    }
    if (rc == 0 && cdt != odt) {
        kiln_tensor *r = kiln__cast(out, odt, name);
        kiln_tensor_release(out);
        out = r;
        rc = r ? 0 : -1;
    }
    if (rc < 0) {
        kiln_tensor_release(out);
        return NULL;
    }
    return keepdim ? out : drop_dims(out, mask);
}

/* The public form: compute, then record when the input asks for gradients. */
static kiln_tensor *reduce_pub(kiln_reduce_op op, kiln_tensor *t, int ndims, const int *dims,
                               bool keepdim, double param)
{
    kiln_tensor *out = reduce_impl(op, t, ndims, dims, keepdim, param);
    if (out && kiln__ad_want(t))
        out = kiln__grad_reduce(out, op, t, ndims, dims, keepdim, param);
    return out;
}

#define REDUCE(fn, OP)                                                                  \
    kiln_tensor *kiln_##fn(kiln_tensor *t, int ndims, const int *dims, bool keepdim)    \
    {                                                                                   \
        return t ? kiln__ret(reduce_pub(OP, t, ndims, dims, keepdim, 0)) : NULL;        \
    }

REDUCE(sum, KILN_REDUCE_SUM)
REDUCE(mean, KILN_REDUCE_MEAN)
REDUCE(prod, KILN_REDUCE_PROD)
REDUCE(max, KILN_REDUCE_MAX)
REDUCE(min, KILN_REDUCE_MIN)
REDUCE(logsumexp, KILN_REDUCE_LOGSUMEXP)
REDUCE(any, KILN_REDUCE_ANY)
REDUCE(all, KILN_REDUCE_ALL)

kiln_tensor *kiln_var(kiln_tensor *t, int ndims, const int *dims, double correction, bool keepdim)
{
    return t ? kiln__ret(reduce_pub(KILN_REDUCE_VAR, t, ndims, dims, keepdim, correction)) : NULL;
}

kiln_tensor *kiln_std(kiln_tensor *t, int ndims, const int *dims, double correction, bool keepdim)
{
    return t ? kiln__ret(reduce_pub(KILN_REDUCE_STD, t, ndims, dims, keepdim, correction)) : NULL;
}

kiln_tensor *kiln_norm(kiln_tensor *t, double p, int ndims, const int *dims, bool keepdim)
{
    if (!t)
        return NULL;
    if (isnan(p) || p < 0) {
        kiln__error_set("norm: p %g must be non-negative", p);
        return NULL;
    }
    return kiln__ret(reduce_pub(KILN_REDUCE_NORM, t, ndims, dims, keepdim, p));
}

/* ------------------------------------------------------------- arg-reductions */

static kiln_tensor *arg_impl(kiln_tensor *t, int dim, bool keepdim, bool is_max)
{
    const char *name = is_max ? "argmax" : "argmin";
    int d = kiln__wrap_dim(dim, t->ndim, name);
    if (d < 0)
        return NULL;
    char ds[200];
    if (t->ndim > 0 && t->shape[d] == 0) {
        kiln__error_set("%s: dim %d of %s is empty", name, dim, kiln__describe(t, ds, sizeof ds));
        return NULL;
    }
    if (t->ndim == 0) {
        /* A single element: its index is 0. */
        kiln_tensor *z = kiln__scalar(kiln__dev(t), KILN_I64, 0, name);
        return z;
    }
    int64_t kshape[KILN_MAX_DIMS];
    memcpy(kshape, t->shape, sizeof kshape);
    kshape[d] = 1;
    kiln_tensor *out = kiln__alloc(kiln__dev(t), KILN_I64, t->ndim, kshape, name);
    if (!out)
        return NULL;
    int rc = 0;
    if (kiln__numel(out) > 0) {
        const kiln_backend_iface *be = kiln__be(t);
        if (!kiln__supports(kiln__dev(t), KILN_ENTRY_ARG_REDUCE, -1, t->dtype, NULL)) {
            rc = kiln__unsupported(kiln__dev(t), name, KILN_ENTRY_ARG_REDUCE, -1, t->dtype);
        } else {
            kiln_tdesc od, id;
            kiln__desc(out, &od);
            kiln__desc(t, &id);
            rc = be->arg_reduce(kiln__ctx(t), is_max, &od, &id, d);
        }
    }
    if (rc < 0) {
        kiln_tensor_release(out);
        return NULL;
    }
    return keepdim ? out : drop_dims(out, 1u << d);
}

kiln_tensor *kiln_argmax(kiln_tensor *t, int dim, bool keepdim)
{
    return t ? kiln__ret(arg_impl(t, dim, keepdim, true)) : NULL;
}

kiln_tensor *kiln_argmin(kiln_tensor *t, int dim, bool keepdim)
{
    return t ? kiln__ret(arg_impl(t, dim, keepdim, false)) : NULL;
}

kiln_tensor *kiln_cumsum(kiln_tensor *t, int dim)
{
    if (!t)
        return NULL;
    int d = kiln__wrap_dim(dim, t->ndim, "cumsum");
    if (d < 0)
        return NULL;
    kiln_dtype dt = kiln_dtype_is_float(t->dtype) ? t->dtype : KILN_I64;
    if (t->ndim == 0) {
        kiln_tensor *c = kiln__copy_as(t, dt, "cumsum");
        if (c && kiln__ad_want(t))
            c = kiln__grad_cumsum(c, t, d);
        return kiln__ret(c);
    }
    kiln_tensor *in = kiln__cast(t, dt, "cumsum");
    kiln_tensor *out = in ? kiln__alloc(kiln__dev(t), dt, t->ndim, t->shape, "cumsum") : NULL;
    int rc = out ? 0 : -1;
    if (rc == 0 && kiln__numel(out) > 0) {
        const kiln_backend_iface *be = kiln__be(t);
        if (!kiln__supports(kiln__dev(t), KILN_ENTRY_CUMSUM, -1, t->dtype, NULL)) {
            rc = kiln__unsupported(kiln__dev(t), "cumsum", KILN_ENTRY_CUMSUM, -1, t->dtype);
        } else {
            kiln_tdesc od, id;
            kiln__desc(out, &od);
            kiln__desc(in, &id);
            rc = be->cumsum(kiln__ctx(t), &od, &id, d);
        }
    }
    kiln_tensor_release(in);
    if (rc < 0) {
        kiln_tensor_release(out);
        return NULL;
    }
    if (kiln__ad_want(t))
        out = kiln__grad_cumsum(out, t, d);
    return kiln__ret(out);
}

/* ---------------------------------------------------------------- sort, topk */

static int sort_impl(kiln_tensor *t, int dim, bool descending, kiln_tensor **values,
                     kiln_tensor **indices, const char *name)
{
    *values = *indices = NULL;
    int d = kiln__wrap_dim(dim, t->ndim, name);
    if (d < 0)
        return -1;
    if (t->ndim == 0) {
        *values = kiln__copy_as(t, t->dtype, name);
        *indices = *values ? kiln__scalar(kiln__dev(t), KILN_I64, 0, name) : NULL;
        if (!*indices) {
            kiln_tensor_release(*values);
            *values = NULL;
            return -1;
        }
        return 0;
    }
    kiln_tensor *v = kiln__alloc(kiln__dev(t), t->dtype, t->ndim, t->shape, name);
    kiln_tensor *ix = v ? kiln__alloc(kiln__dev(t), KILN_I64, t->ndim, t->shape, name) : NULL;
    int rc = ix ? 0 : -1;
    if (rc == 0 && kiln__numel(v) > 0) {
        const kiln_backend_iface *be = kiln__be(t);
        if (!kiln__supports(kiln__dev(t), KILN_ENTRY_SORT, -1, t->dtype, NULL)) {
            rc = kiln__unsupported(kiln__dev(t), name, KILN_ENTRY_SORT, -1, t->dtype);
        } else {
            kiln_tdesc vd, xd, id;
            kiln__desc(v, &vd);
            kiln__desc(ix, &xd);
            kiln__desc(t, &id);
            rc = be->sort(kiln__ctx(t), &vd, &xd, &id, d, descending);
        }
    }
    if (rc < 0) {
        kiln_tensor_release(v);
        kiln_tensor_release(ix);
        return -1;
    }
    *values = v;
    *indices = ix;
    return 0;
}

int kiln_sort(kiln_tensor *t, int dim, bool descending, kiln_tensor **values, kiln_tensor **indices)
{
    if (values)
        *values = NULL;
    if (indices)
        *indices = NULL;
    if (!t)
        return -1;
    if (!values)
        return kiln__error_set("sort: values output is NULL");
    kiln_tensor *v, *ix;
    if (sort_impl(t, dim, descending, &v, &ix, "sort") < 0)
        return -1;
    if (kiln__ad_want(t) && !(v = kiln__grad_sort(v, t, kiln__wrap_dim(dim, t->ndim, "sort"), ix, "sort"))) {
        kiln_tensor_release(ix);
        return -1;
    }
    if (indices)
        *indices = kiln__ret(ix);
    else
        kiln_tensor_release(ix);
    *values = kiln__ret(v);
    return 0;
}

kiln_tensor *kiln_argsort(kiln_tensor *t, int dim, bool descending)
{
    if (!t)
        return NULL;
    kiln_tensor *v, *ix;
    if (sort_impl(t, dim, descending, &v, &ix, "argsort") < 0)
        return NULL;
    kiln_tensor_release(v);
    return kiln__ret(ix);
}

int kiln_topk(kiln_tensor *t, int64_t k, int dim, bool largest, kiln_tensor **values,
              kiln_tensor **indices)
{
    if (values)
        *values = NULL;
    if (indices)
        *indices = NULL;
    if (!t)
        return -1;
    if (!values)
        return kiln__error_set("topk: values output is NULL");
    int d = kiln__wrap_dim(dim, t->ndim, "topk");
    if (d < 0)
        return -1;
    int64_t size = t->ndim ? t->shape[d] : 1;
    char ds[200];
    if (k < 0 || k > size)
        return kiln__error_set("topk: k %lld out of range for dim %d of %s", (long long)k, dim,
                               kiln__describe(t, ds, sizeof ds));
    kiln_tensor *v, *ix;
    if (sort_impl(t, dim, largest, &v, &ix, "topk") < 0)
        return -1;
    if (kiln__ad_want(t) && t->ndim == 0 && !(v = kiln__grad_sort(v, t, 0, ix, "topk"))) {
        kiln_tensor_release(ix);
        return -1;
    }
    if (t->ndim == 0) {
        *values = kiln__ret(v);
        if (indices)
            *indices = kiln__ret(ix);
        else
            kiln_tensor_release(ix);
        return 0;
    }
    kiln_tensor *nv = kiln__narrow(v, d, 0, k, "topk");
    kiln_tensor *nx = nv ? kiln__narrow(ix, d, 0, k, "topk") : NULL;
    kiln_tensor *cv = nx ? kiln__contiguous(nv, "topk") : NULL;
    kiln_tensor *cx = cv ? kiln__contiguous(nx, "topk") : NULL;
    kiln_tensor_release(v);
    kiln_tensor_release(ix);
    kiln_tensor_release(nv);
    kiln_tensor_release(nx);
    if (cx && kiln__ad_want(t) && !(cv = kiln__grad_sort(cv, t, d, cx, "topk"))) {
        kiln_tensor_release(cx);
        return -1;
    }
    if (!cx) {
        kiln_tensor_release(cv);
        return -1;
    }
    *values = kiln__ret(cv);
    if (indices)
        *indices = kiln__ret(cx);
    else
        kiln_tensor_release(cx);
    return 0;
}
