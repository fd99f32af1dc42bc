/*
 * engine/ops-index.c — gather, scatter, index_select, slice_assign, one_hot, embedding.
 *
 * Backends are promised in-range i64 indices, so every op here casts i32 indices to i64
 * and checks the range first (one min/max reduction and a two-element read). An index
 * out of range is a caller's mistake that must come back as an error, never as an
 * out-of-bounds access on the device.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "autograd-impl.h"
#include "tensor-impl.h"

/* The index as i64, after checking its dtype, device and value range. */
static kiln_tensor *prepare_index(kiln_tensor *index, const kiln_tensor *t, int64_t size, const char *op)
{
    char ds[200];
    if (index->dtype != KILN_I64 && index->dtype != KILN_I32) {
        kiln__error_set("%s: index must be i64 or i32, got %s", op, kiln__describe(index, ds, sizeof ds));
        return NULL;
    }
    if (kiln__same_device(t, index, op) < 0)
        return NULL;
    kiln_tensor *ix = kiln__cast(index, KILN_I64, op);
    if (ix && kiln__check_range(ix, 0, size, op, "index") < 0) {
        kiln_tensor_release(ix);
        return NULL;
    }
    return ix;
}

/* 0 when t's device takes entry on t's dtype, else the error naming op, dtype and device. */
static int unsupported(kiln_tensor *t, const char *op, kiln_entry entry)
{
    return kiln__supports(kiln__dev(t), entry, -1, t->dtype, NULL) ? 0
                                                                   : kiln__unsupported(kiln__dev(t), op, entry, -1, t->dtype);
}

kiln_tensor *kiln_gather(kiln_tensor *t, int dim, kiln_tensor *index)
{
    if (!t || !index)
        return NULL;
    const char *op = "gather";
    int d = kiln__wrap_dim(dim, t->ndim, op);
    if (d < 0)
        return NULL;
    char dt[200], di[200];
    bool ok = index->ndim == t->ndim;
    for (int i = 0; ok && i < t->ndim; i++)
        ok = i == d || index->shape[i] <= t->shape[i];
    if (!ok) {
        kiln__error_set("%s: index %s does not fit %s outside dim %d", op,
                        kiln__describe(index, di, sizeof di), kiln__describe(t, dt, sizeof dt), dim);
        return NULL;
    }
    kiln_tensor *ix = prepare_index(index, t, t->ndim ? t->shape[d] : 1, op);
    if (!ix)
        return NULL;
    kiln_tensor *out = kiln__alloc(kiln__dev(t), t->dtype, ix->ndim, ix->shape, op);
    int rc = out ? 0 : -1;
    if (rc == 0 && kiln__numel(out) > 0) {
        const kiln_backend_iface *be = kiln__be(t);
        kiln_tdesc od, id, xd;
        kiln__desc(out, &od);
        kiln__desc(t, &id);
        kiln__desc(ix, &xd);
        rc = unsupported(t, op, KILN_ENTRY_GATHER);
        if (rc == 0)
            rc = be->gather(kiln__ctx(t), &od, &id, d, &xd);
    }
    kiln_tensor_release(ix);
    if (rc < 0) {
        kiln_tensor_release(out);
        return NULL;
    }
    if (kiln__ad_want(t))
        out = kiln__grad_gather(out, t, dim, index);
    return kiln__ret(out);
}

static kiln_tensor *scatter_impl(kiln_tensor *t, int dim, kiln_tensor *index, kiln_tensor *src,
                                 bool accumulate, const char *op)
{
    int d = kiln__wrap_dim(dim, t->ndim, op);
    if (d < 0)
        return NULL;
    if (kiln__same_device(t, src, op) < 0)
        return NULL;
    char dt[200], di[200], dsrc[200];
    bool ok = index->ndim == t->ndim && src->ndim == t->ndim;
    for (int i = 0; ok && i < t->ndim; i++)
        ok = index->shape[i] <= src->shape[i] && (i == d || index->shape[i] <= t->shape[i]);
    if (!ok) {
        kiln__error_set("%s: index %s must fit both src %s and %s (outside dim %d)", op,
                        kiln__describe(index, di, sizeof di), kiln__describe(src, dsrc, sizeof dsrc),
                        kiln__describe(t, dt, sizeof dt), dim);
        return NULL;
    }
    kiln_tensor *ix = prepare_index(index, t, t->ndim ? t->shape[d] : 1, op);
    if (!ix)
        return NULL;
    /* The backend walks the index; give it src cut to the index's shape. */
    kiln_tensor *cs = kiln__cast(src, t->dtype, op);
    kiln_tensor *vs = cs ? kiln__view(cs, cs->ndim, ix->shape, cs->strides, cs->offset) : NULL;
    kiln_tensor *out = vs ? kiln__copy_as(t, t->dtype, op) : NULL;
    int rc = out ? 0 : -1;
    if (rc == 0 && kiln__numel(ix) > 0) {
        const kiln_backend_iface *be = kiln__be(t);
        kiln_tdesc od, xd, sd;
        kiln__desc(out, &od);
        kiln__desc(ix, &xd);
        kiln__desc(vs, &sd);
        rc = unsupported(t, op, KILN_ENTRY_SCATTER);
        if (rc == 0)
            rc = be->scatter(kiln__ctx(t), &od, d, &xd, &sd, accumulate);
    }
    kiln_tensor_release(ix);
    kiln_tensor_release(cs);
    kiln_tensor_release(vs);
    if (rc < 0) {
        kiln_tensor_release(out);
        return NULL;
    }
    return out;
}

kiln_tensor *kiln_scatter(kiln_tensor *t, int dim, kiln_tensor *index, kiln_tensor *src)
{
    if (!t || !index || !src)
        return NULL;
    kiln_tensor *out = scatter_impl(t, dim, index, src, false, "scatter");
    if (out && (kiln__ad_want(t) || kiln__ad_want(src)))
        out = kiln__grad_scatter(out, t, dim, index, src, false);
    return kiln__ret(out);
}

kiln_tensor *kiln_scatter_add(kiln_tensor *t, int dim, kiln_tensor *index, kiln_tensor *src)
{
    if (!t || !index || !src)
        return NULL;
    kiln_tensor *out = scatter_impl(t, dim, index, src, true, "scatter_add");
    if (out && (kiln__ad_want(t) || kiln__ad_want(src)))
        out = kiln__grad_scatter(out, t, dim, index, src, true);
    return kiln__ret(out);
}

static kiln_tensor *index_select_impl(kiln_tensor *t, int dim, kiln_tensor *index, const char *op)
{
    char di[200];
    if (t->ndim == 0) {
        kiln__error_set("%s: cannot index a 0-d tensor", op);
        return NULL;
    }
    int d = kiln__wrap_dim(dim, t->ndim, op);
    if (d < 0)
        return NULL;
    if (index->ndim > 1) {
        kiln__error_set("%s: index must be 1-d, got %s", op, kiln__describe(index, di, sizeof di));
        return NULL;
    }
    kiln_tensor *ix = prepare_index(index, t, t->shape[d], op);
    if (!ix)
        return NULL;
    int64_t n = kiln__numel(ix);
    kiln_tensor *ix1 = kiln__reshape(ix, 1, &n, op);
    kiln_tensor_release(ix);
    if (!ix1)
        return NULL;
    int64_t shape[KILN_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    shape[d] = n;
    kiln_tensor *out = kiln__alloc(kiln__dev(t), t->dtype, t->ndim, shape, op);
    int rc = out ? 0 : -1;
    if (rc == 0 && kiln__numel(out) > 0) {
        const kiln_backend_iface *be = kiln__be(t);
        kiln_tdesc od, id, xd;
        kiln__desc(out, &od);
        kiln__desc(t, &id);
        kiln__desc(ix1, &xd);
        rc = unsupported(t, op, KILN_ENTRY_INDEX_SELECT);
        if (rc == 0)
            rc = be->index_select(kiln__ctx(t), &od, &id, d, &xd);
    }
    kiln_tensor_release(ix1);
    if (rc < 0) {
        kiln_tensor_release(out);
        return NULL;
    }
    return out;
}

kiln_tensor *kiln_index_select(kiln_tensor *t, int dim, kiln_tensor *index)
{
    if (!t || !index)
        return NULL;
    kiln_tensor *out = index_select_impl(t, dim, index, "index_select");
    if (out && kiln__ad_want(t))
        out = kiln__grad_index_select(out, t, dim, index);
    return kiln__ret(out);
}

kiln_tensor *kiln_slice_assign(kiln_tensor *t, int dim, int64_t start, int64_t end, int64_t step,
                               kiln_tensor *src)
{
    if (!t || !src)
        return NULL;
    const char *op = "slice_assign";
    if (kiln__same_device(t, src, op) < 0)
        return NULL;
    kiln_tensor *out = kiln__copy_as(t, t->dtype, op);
    kiln_tensor *dst = out ? kiln__slice(out, dim, start, end, step, op) : NULL;
    kiln_tensor *es = dst ? kiln__expand(src, dst->ndim, dst->shape, op) : NULL;
    int rc = es ? kiln__copy_into(dst, es, op) : -1;
    kiln_tensor_release(dst);
    kiln_tensor_release(es);
    if (rc < 0) {
        kiln_tensor_release(out);
        return NULL;
    }
    if (kiln__ad_want(t) || kiln__ad_want(src))
        out = kiln__grad_slice_assign(out, t, dim, start, end, step, src);
    return kiln__ret(out);
}

kiln_tensor *kiln_one_hot(kiln_tensor *index, int64_t num_classes, kiln_dtype dt)
{
    if (!index)
        return NULL;
    const char *op = "one_hot";
    char di[200];
    if (kiln_dtype_is_float(index->dtype) || index->dtype == KILN_BOOL) {
        kiln__error_set("%s: classes must be an integer tensor, got %s", op,
                        kiln__describe(index, di, sizeof di));
        return NULL;
    }
    if ((unsigned)dt >= KILN_DTYPE_COUNT || index->ndim >= KILN_MAX_DIMS) {
        kiln__error_set("%s: invalid dtype or rank for %s", op, kiln__describe(index, di, sizeof di));
        return NULL;
    }
    kiln_tensor *ix = kiln__cast(index, KILN_I64, op);
    if (!ix)
        return NULL;
    if (num_classes < 0) {
        /* PyTorch's -1: one more than the largest class present. */
        int64_t n = kiln__numel(ix);
        num_classes = 0;
        if (n > 0) {
            kiln_tensor *m = kiln_max(ix, KILN_ALL_DIMS, false);
            double v = m ? kiln_item(m) : NAN;
            kiln_tensor_release(m);
            if (isnan(v)) {
                kiln_tensor_release(ix);
                return NULL;
            }
            num_classes = (int64_t)v + 1;
        }
    }
    if (kiln__check_range(ix, 0, num_classes, op, "index") < 0) {
        kiln_tensor_release(ix);
        return NULL;
    }
    kiln_device *dev = kiln__dev(index);
    int64_t shape[KILN_MAX_DIMS];
    memcpy(shape, ix->shape, sizeof shape);
    shape[ix->ndim] = 1;
    kiln_tensor *col = kiln__reshape(ix, ix->ndim + 1, shape, op);
    kiln_tensor_release(ix);
    if (!col)
        return NULL;
    kiln_scope_begin();
    kiln__ret(col);
    kiln_tensor *classes = kiln_arange(dev, KILN_I64, 0, (double)num_classes, 1);
    kiln_tensor *hit = classes ? kiln_eq(col, classes) : NULL;
    return kiln__scope_end_keep(hit ? kiln_cast(hit, dt) : NULL);
}

kiln_tensor *kiln_embedding(kiln_tensor *weight, kiln_tensor *indices)
{
    if (!weight || !indices)
        return NULL;
    const char *op = "embedding";
    char dw[200];
    if (weight->ndim != 2 || indices->ndim >= KILN_MAX_DIMS) {
        kiln__error_set("%s: weight must be 2-d [V, D], got %s", op, kiln__describe(weight, dw, sizeof dw));
        return NULL;
    }
    int64_t n = kiln__numel(indices);
    kiln_tensor *flat = kiln__reshape(indices, 1, &n, op);
    kiln_tensor *rows = flat ? index_select_impl(weight, 0, flat, op) : NULL;
    kiln_tensor_release(flat);
    if (!rows)
        return NULL;
    int64_t shape[KILN_MAX_DIMS];
    memcpy(shape, indices->shape, sizeof shape);
    shape[indices->ndim] = weight->shape[1];
    kiln_tensor *out = kiln__reshape(rows, indices->ndim + 1, shape, op);
    kiln_tensor_release(rows);
    if (out && kiln__ad_want(weight))
        out = kiln__grad_embedding(out, weight, indices);
    return kiln__ret(out);
}
