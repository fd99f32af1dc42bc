/*
 * engine/ops-layout.c — ops that produce new storage by rearranging existing elements:
 * contiguous, clone, cast, to_device, cat, stack, repeat, flip, pad.
 *
 * All of them reduce to the backend's strided copy: the front end builds a view of the
 * destination (a narrow of the output, a negative-stride view of the input, a
 * zero-stride expansion) and lets copy move and convert the elements.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd-impl.h"
#include "tensor-impl.h"

kiln_tensor *kiln_contiguous(kiln_tensor *t)
{
    if (!t)
        return NULL;
    kiln_tensor *out = kiln__contiguous(t, "contiguous");
    if (out && kiln__ad_want(t))
        out = kiln__grad_identity(out, t, "contiguous");
    return kiln__ret(out);
}

kiln_tensor *kiln_clone(kiln_tensor *t)
{
    if (!t)
        return NULL;
    kiln_tensor *out = kiln__copy_as(t, t->dtype, "clone");
    if (out && kiln__ad_want(t))
        out = kiln__grad_identity(out, t, "clone");
    return kiln__ret(out);
}

kiln_tensor *kiln_cast(kiln_tensor *t, kiln_dtype dt)
{
    if (!t)
        return NULL;
    if ((unsigned)dt >= KILN_DTYPE_COUNT) {
        kiln__error_set("cast: invalid dtype %d", (int)dt);
        return NULL;
    }
    kiln_tensor *out = kiln__cast(t, dt, "cast");
    if (out && kiln__ad_want(t))
        out = kiln__grad_identity(out, t, "cast");
    return kiln__ret(out);
}

kiln_tensor *kiln_to_device(kiln_tensor *t, kiln_device *dev)
{
    if (!t)
        return NULL;
    if (!dev) {
        kiln__error_set("to_device: device is NULL");
        return NULL;
    }
    if (kiln__dev(t) == dev)
        return kiln__ret(kiln_tensor_retain(t));
    kiln_tensor *out = kiln__alloc(dev, t->dtype, t->ndim, t->shape, "to_device");
    if (out && kiln__copy_across(out, t, "to_device") < 0) {
        kiln_tensor_release(out);
        out = NULL;
    }
    if (out && kiln__ad_want(t))
        out = kiln__grad_to_device(out, t);
    return kiln__ret(out);
}

/* ----------------------------------------------------------------- cat, stack */

static kiln_tensor *cat_impl(kiln_tensor *const *ts, int n, int dim, const char *op)
{
    if (!ts || n <= 0) {
        kiln__error_set("%s: needs at least one tensor", op);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!ts[i])
            return NULL;
    const kiln_tensor *first = ts[0];
    if (first->ndim == 0) {
        kiln__error_set("%s: zero-dimensional tensors cannot be concatenated", op);
        return NULL;
    }
    int d = kiln__wrap_dim(dim, first->ndim, op);
    if (d < 0)
        return NULL;
    kiln_dtype dt = first->dtype;
    int64_t shape[KILN_MAX_DIMS];
    memcpy(shape, first->shape, sizeof shape);
    shape[d] = 0;
    for (int i = 0; i < n; i++) {
        const kiln_tensor *t = ts[i];
        char da[200], db[200];
        if (kiln__same_device(first, t, op) < 0)
            return NULL;
        bool ok = t->ndim == first->ndim;
        for (int k = 0; ok && k < t->ndim; k++)
            ok = k == d || t->shape[k] == first->shape[k];
        if (!ok) {
            kiln__error_set("%s: %s and %s differ outside dim %d", op, kiln__describe(first, da, sizeof da),
                            kiln__describe(t, db, sizeof db), dim);
            return NULL;
        }
        if (__builtin_add_overflow(shape[d], t->shape[d], &shape[d])) {
            kiln__error_set("%s: result too large", op);
            return NULL;
        }
        dt = kiln_promote_types(dt, t->dtype);
    }
    kiln_tensor *out = kiln__alloc(kiln__dev(first), dt, first->ndim, shape, op);
    if (!out)
        return NULL;
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        int64_t len = ts[i]->shape[d];
        if (len == 0)
            continue;
        kiln_tensor *dst = kiln__narrow(out, d, at, len, op);
        int rc = dst ? kiln__copy_into(dst, ts[i], op) : -1;
        kiln_tensor_release(dst);
        if (rc < 0) {
            kiln_tensor_release(out);
            return NULL;
        }
        at += len;
    }
    return out;
}

kiln_tensor *kiln_cat(kiln_tensor *const *ts, int n, int dim)
{
    kiln_tensor *out = cat_impl(ts, n, dim, "cat");
    if (out && kiln__ad_want_n(n, ts))
        out = kiln__grad_cat(out, ts, n, kiln__wrap_dim(dim, out->ndim, "cat"), false);
    return kiln__ret(out);
}

kiln_tensor *kiln_stack(kiln_tensor *const *ts, int n, int dim)
{
    if (!ts || n <= 0) {
        kiln__error_set("stack: needs at least one tensor");
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!ts[i])
            return NULL;
    const kiln_tensor *first = ts[0];
    if (first->ndim >= KILN_MAX_DIMS) {
        kiln__error_set("stack: %d-d inputs would exceed the rank limit", first->ndim);
        return NULL;
    }
    int d = kiln__wrap_dim(dim, first->ndim + 1, "stack");
    if (d < 0)
        return NULL;
    for (int i = 1; i < n; i++) {
        bool ok = ts[i]->ndim == first->ndim;
        for (int k = 0; ok && k < first->ndim; k++)
            ok = ts[i]->shape[k] == first->shape[k];
        if (!ok) {
            char da[200], db[200];
            kiln__error_set("stack: shapes differ: %s and %s", kiln__describe(first, da, sizeof da),
                            kiln__describe(ts[i], db, sizeof db));
            return NULL;
        }
    }
    kiln_tensor **views = calloc((size_t)n, sizeof *views);
    if (!views) {
        kiln__error_set("stack: out of memory");
        return NULL;
    }
    kiln_tensor *out = NULL;
    int made = 0;
    for (; made < n; made++) {
        const kiln_tensor *t = ts[made];
        int64_t sh[KILN_MAX_DIMS], st[KILN_MAX_DIMS];
        int m = 0;
        for (int k = 0; k <= t->ndim; k++) {
            if (k == d) {
                sh[m] = 1;
                st[m++] = 1;
            }
            if (k < t->ndim) {
                sh[m] = t->shape[k];
                st[m++] = t->strides[k];
            }
        }
        views[made] = kiln__view(t, m, sh, st, t->offset);
        if (!views[made])
            break;
    }
    if (made == n)
        out = cat_impl(views, n, d, "stack");
    for (int i = 0; i < made; i++)
        kiln_tensor_release(views[i]);
    free(views);
    if (out && kiln__ad_want_n(n, ts))
        out = kiln__grad_cat(out, ts, n, d, true);
    return kiln__ret(out);
}

/* ----------------------------------------------------------------- repeat, flip */

kiln_tensor *kiln_repeat(kiln_tensor *t, int ndim, const int64_t *repeats)
{
    if (!t)
        return NULL;
    if (ndim < t->ndim || ndim > KILN_MAX_DIMS || (ndim > 0 && !repeats)) {
        kiln__error_set("repeat: %d repeat counts for a %d-d tensor", ndim, t->ndim);
        return NULL;
    }
    int64_t sh[KILN_MAX_DIMS] = {0};
    int lead = ndim - t->ndim;
    for (int i = 0; i < ndim; i++) {
        if (repeats[i] < 0) {
            kiln__error_set("repeat: negative repeat count %lld", (long long)repeats[i]);
            return NULL;
        }
        sh[i] = i < lead ? 1 : t->shape[i - lead];
    }
    kiln_tensor *x = kiln__reshape(t, ndim, sh, "repeat");
    /* One dim at a time: insert a size-1 dim before it, expand that to the count, make
     * it contiguous and merge the two, so no step needs more than ndim + 1 dims. */
    for (int d = 0; x && d < ndim; d++) {
        if (repeats[d] == 1)
            continue;
        if (ndim == KILN_MAX_DIMS) {
            kiln__error_set("repeat: repeating a %d-d tensor exceeds the rank limit", ndim);
            kiln_tensor_release(x);
            return NULL;
        }
        int64_t vs[KILN_MAX_DIMS], vt[KILN_MAX_DIMS], ms[KILN_MAX_DIMS];
        int m = 0;
        for (int k = 0; k < ndim; k++) {
            if (k == d) {
                vs[m] = repeats[d];
                vt[m++] = 0;
            }
            vs[m] = x->shape[k];
            vt[m++] = x->strides[k];
            ms[k] = k == d ? repeats[d] * x->shape[k] : x->shape[k];
        }
        kiln_tensor *v = kiln__view(x, m, vs, vt, x->offset);
        kiln_tensor *c = v ? kiln__copy_as(v, x->dtype, "repeat") : NULL;
        kiln_tensor *r = c ? kiln__reshape(c, ndim, ms, "repeat") : NULL;
        kiln_tensor_release(v);
        kiln_tensor_release(c);
        kiln_tensor_release(x);
        x = r;
    }
    if (x && x->storage == t->storage) {
        kiln_tensor *c = kiln__copy_as(x, x->dtype, "repeat");
        kiln_tensor_release(x);
        x = c;
    }
    if (x && kiln__ad_want(t))
        x = kiln__grad_repeat(x, t, ndim, repeats);
    return kiln__ret(x);
}

kiln_tensor *kiln_flip(kiln_tensor *t, int ndims, const int *dims)
{
    if (!t)
        return NULL;
    if (ndims < 0 || ndims > t->ndim || (ndims > 0 && !dims)) {
        kiln__error_set("flip: %d dims for a %d-d tensor", ndims, t->ndim);
        return NULL;
    }
    int64_t st[KILN_MAX_DIMS];
    memcpy(st, t->strides, sizeof st);
    int64_t offset = t->offset;
    bool seen[KILN_MAX_DIMS] = {false};
    for (int i = 0; i < ndims; i++) {
        int d = kiln__wrap_dim(dims[i], t->ndim, "flip");
        if (d < 0)
            return NULL;
        if (seen[d]) {
            kiln__error_set("flip: dim %d repeats", dims[i]);
            return NULL;
        }
        seen[d] = true;
        if (t->shape[d] > 1) {
            offset += (t->shape[d] - 1) * t->strides[d];
            st[d] = -t->strides[d];
        }
    }
    kiln_tensor *v = kiln__view(t, t->ndim, t->shape, st, offset);
    kiln_tensor *out = v ? kiln__copy_as(v, t->dtype, "flip") : NULL;
    kiln_tensor_release(v);
    if (out && kiln__ad_want(t))
        out = kiln__grad_flip(out, t, ndims, dims);
    return kiln__ret(out);
}

/* ------------------------------------------------------------------------ pad */

kiln_tensor *kiln_pad(kiln_tensor *t, int npads, const int64_t *pads, kiln_pad_mode mode, double value)
{
    if (!t)
        return NULL;
    char ds[200];
    if (npads < 0 || npads % 2 || npads / 2 > t->ndim || (npads && !pads)) {
        kiln__error_set("pad: %d pad values for %s (need an even count, at most 2 per dim)", npads,
                        kiln__describe(t, ds, sizeof ds));
        return NULL;
    }
    if (mode != KILN_PAD_CONSTANT && mode != KILN_PAD_REFLECT && mode != KILN_PAD_REPLICATE) {
        kiln__error_set("pad: unknown mode %d", (int)mode);
        return NULL;
    }
    int64_t full[2 * KILN_MAX_DIMS] = {0};
    for (int i = 0; i < npads / 2; i++) {
        int d = t->ndim - 1 - i;
        full[2 * d] = pads[2 * i];
        full[2 * d + 1] = pads[2 * i + 1];
    }
    /* Negative constant padding crops: narrow first, then pad what remains. */
    kiln_tensor *src = kiln_tensor_retain(t);
    int64_t shape[KILN_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++) {
        int64_t lo = full[2 * d], hi = full[2 * d + 1];
        int64_t size = src->shape[d];
        if (lo < 0 || hi < 0) {
            if (mode != KILN_PAD_CONSTANT || (lo < 0 ? -lo : 0) + (hi < 0 ? -hi : 0) > size) {
                kiln__error_set("pad: negative padding (%lld, %lld) not allowed for dim %d of %s",
                                (long long)lo, (long long)hi, d, kiln__describe(t, ds, sizeof ds));
                kiln_tensor_release(src);
                return NULL;
            }
            int64_t cut_lo = lo < 0 ? -lo : 0, cut_hi = hi < 0 ? -hi : 0;
            kiln_tensor *n = kiln__narrow(src, d, cut_lo, size - cut_lo - cut_hi, "pad");
            kiln_tensor_release(src);
            if (!n)
                return NULL;
            src = n;
            full[2 * d] = lo < 0 ? 0 : lo;
            full[2 * d + 1] = hi < 0 ? 0 : hi;
            size = src->shape[d];
        }
        if (mode == KILN_PAD_REFLECT && (full[2 * d] >= size || full[2 * d + 1] >= size) &&
            (full[2 * d] || full[2 * d + 1])) {
            kiln__error_set("pad: reflect padding (%lld, %lld) must be below the size %lld of dim %d",
                            (long long)full[2 * d], (long long)full[2 * d + 1], (long long)size, d);
            kiln_tensor_release(src);
            return NULL;
        }
        if (mode == KILN_PAD_REPLICATE && size == 0 && (full[2 * d] || full[2 * d + 1])) {
            kiln__error_set("pad: cannot replicate-pad the empty dim %d", d);
            kiln_tensor_release(src);
            return NULL;
        }
        shape[d] = size + full[2 * d] + full[2 * d + 1];
    }
    kiln_tensor *out = kiln__alloc(kiln__dev(t), t->dtype, t->ndim, shape, "pad");
    int rc = out ? 0 : -1;
    if (rc == 0 && kiln__numel(out) > 0) {
        const kiln_backend_iface *be = kiln__be(t);
        if (kiln__supports(kiln__dev(t), KILN_ENTRY_PAD, (int)mode, t->dtype, NULL)) {
            kiln_tdesc od, id;
            kiln__desc(out, &od);
            kiln__desc(src, &id);
            rc = be->pad(kiln__ctx(t), mode, &od, &id, full, value);
        } else if (mode == KILN_PAD_CONSTANT) {
            rc = kiln__fill(out, value, "pad");
            kiln_tensor *dst = kiln_tensor_retain(out);
            for (int d = 0; rc == 0 && d < t->ndim; d++) {
                kiln_tensor *n = kiln__narrow(dst, d, full[2 * d], src->shape[d], "pad");
                kiln_tensor_release(dst);
                dst = n;
                rc = n ? 0 : -1;
            }
            if (rc == 0)
                rc = kiln__copy_into(dst, src, "pad");
            kiln_tensor_release(dst);
        } else {
            rc = kiln__unsupported(kiln__dev(t), "pad", KILN_ENTRY_PAD, (int)mode, t->dtype);
        }
    }
    kiln_tensor_release(src);
    if (rc < 0) {
        kiln_tensor_release(out);
        return NULL;
    }
    if (kiln__ad_want(t))
        out = kiln__grad_pad(out, t, npads, pads, mode);
    return kiln__ret(out);
}
