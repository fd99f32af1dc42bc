/*
 * engine/ops-shape.c — view ops: reshape, flatten, squeeze, permute, expand, slicing and
 * splitting, plus the broadcasting rule the elementwise ops share.
 *
 * A view is a new (shape, strides, offset) over the same storage; nothing is copied or
 * sent to the backend. Reshape is a view whenever the old strides allow it (the
 * criterion PyTorch uses: every run of merged dims must be contiguous within itself)
 * and a contiguous copy otherwise.
 */
#include <stdio.h>
#include <string.h>

#include "autograd-impl.h"
#include "tensor-impl.h"

/* Record a reshaping view (reshape, flatten, squeeze, ...) when t asks for gradients. */
static kiln_tensor *shaped(kiln_tensor *out, kiln_tensor *t, const char *name)
{
    if (out && kiln__ad_want(t))
        out = kiln__grad_reshape(out, t, name);
    return out;
}

/* ------------------------------------------------------------------ broadcasting */

int kiln__broadcast_shape(int an, const int64_t *as, int bn, const int64_t *bs, int64_t *out,
                          const char *op, const kiln_tensor *a, const kiln_tensor *b)
{
    int n = an > bn ? an : bn;
    for (int i = 0; i < n; i++) {
        int ai = an - n + i, bi = bn - n + i;
        int64_t x = ai >= 0 ? as[ai] : 1, y = bi >= 0 ? bs[bi] : 1;
        if (x == y || y == 1)
            out[i] = x;
        else if (x == 1)
            out[i] = y;
        else {
            char da[200], db[200];
            if (a && b)
                kiln__error_set("%s: cannot broadcast %s with %s", op, kiln__describe(a, da, sizeof da),
                                kiln__describe(b, db, sizeof db));
            else
                kiln__error_set("%s: cannot broadcast %s with %s", op, kiln__shape_str(an, as, da, sizeof da),
                                kiln__shape_str(bn, bs, db, sizeof db));
            return -1;
        }
    }
    return n;
}

kiln_tensor *kiln__expand(kiln_tensor *t, int ndim, const int64_t *shape, const char *op)
{
    char d[200], s[160];
    if (ndim < t->ndim || ndim > KILN_MAX_DIMS) {
        kiln__error_set("%s: cannot expand %s to %s", op, kiln__describe(t, d, sizeof d),
                        kiln__shape_str(ndim, shape, s, sizeof s));
        return NULL;
    }
    int64_t sh[KILN_MAX_DIMS], st[KILN_MAX_DIMS];
    int lead = ndim - t->ndim;
    for (int i = 0; i < ndim; i++) {
        int j = i - lead;
        int64_t want = shape[i];
        if (j < 0) {
            if (want < 0)
                goto bad;
            sh[i] = want;
            st[i] = 0;
            continue;
        }
        if (want == -1 || want == t->shape[j]) {
            sh[i] = t->shape[j];
            st[i] = t->strides[j];
        } else if (t->shape[j] == 1 && want >= 0) {
            sh[i] = want;
            st[i] = 0;
        } else {
            goto bad;
        }
    }
    /* an expanded view allocates nothing, but its element count must still be one int64 holds:
     * a count that wrapped (2^31 x 2^31 x 4 is 0 modulo 2^64) made a view of "0 elements" that
     * reshape, sum and mean then took at its word */
    int64_t numel = 0;
    if (!kiln__numel_ok(ndim, sh, &numel)) {
        kiln__error_set_code(KILN_ETOOLARGE, "%s: %s expanded to %s has more elements than an int64 counts", op,
                             kiln__describe(t, d, sizeof d), kiln__shape_str(ndim, sh, s, sizeof s));
        return NULL;
    }
    return kiln__view(t, ndim, sh, st, t->offset);
bad:
    kiln__error_set("%s: cannot expand %s to %s", op, kiln__describe(t, d, sizeof d),
                    kiln__shape_str(ndim, shape, s, sizeof s));
    return NULL;
}

kiln_tensor *kiln_expand(kiln_tensor *t, int ndim, const int64_t *shape)
{
    if (!t)
        return NULL;
    kiln_tensor *out = kiln__expand(t, ndim, shape, "expand");
    if (out && kiln__ad_want(t))
        out = kiln__grad_expand(out, t);
    return kiln__ret(out);
}

/* ----------------------------------------------------------------------- reshape */

/* Resolve a -1 entry and check the element count; writes the final shape. */
static int infer_shape(const kiln_tensor *t, int ndim, const int64_t *shape, int64_t *out,
                       const char *op)
{
    char d[200], s[160];
    if (ndim < 0 || ndim > KILN_MAX_DIMS || (ndim > 0 && !shape))
        return kiln__error_set("%s: rank %d is not supported (0..%d)", op, ndim, KILN_MAX_DIMS);
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == -1) {
            if (infer >= 0)
                return kiln__error_set("%s: only one dimension can be -1 in %s", op,
                                       kiln__shape_str(ndim, shape, s, sizeof s));
            infer = i;
        } else if (shape[i] < 0) {
            return kiln__error_set("%s: invalid size %lld in %s", op, (long long)shape[i],
                                   kiln__shape_str(ndim, shape, s, sizeof s));
        } else if (__builtin_mul_overflow(known, shape[i], &known)) {
            return kiln__error_set("%s: shape %s is too large", op, kiln__shape_str(ndim, shape, s, sizeof s));
        }
        out[i] = shape[i];
    }
    int64_t numel = kiln__numel(t);
    if (infer >= 0) {
        if (known == 0 || numel % known != 0)
            return kiln__error_set("%s: cannot reshape %s into %s", op, kiln__describe(t, d, sizeof d),
                                   kiln__shape_str(ndim, shape, s, sizeof s));
        out[infer] = numel / known;
    } else if (known != numel) {
        return kiln__error_set("%s: cannot reshape %s into %s", op, kiln__describe(t, d, sizeof d),
                               kiln__shape_str(ndim, shape, s, sizeof s));
    }
    return 0;
}

/* Strides for viewing t as shape without a copy; false when the layout forbids it. */
static bool view_strides(const kiln_tensor *t, int ndim, const int64_t *shape, int64_t *strides)
{
    if (kiln__numel(t) == 0 || kiln_tensor_is_contiguous(t)) {
        kiln__contig_strides(ndim, shape, strides);
        return true;
    }
    int view_d = ndim - 1;
    int64_t base = t->strides[t->ndim - 1];
    int64_t tnumel = 1, vnumel = 1;
    for (int td = t->ndim - 1; td >= 0; td--) {
        tnumel *= t->shape[td];
        if (td == 0 || (t->shape[td - 1] != 1 && t->strides[td - 1] != tnumel * base)) {
            while (view_d >= 0 && (vnumel < tnumel || shape[view_d] == 1)) {
                strides[view_d] = vnumel * base;
                vnumel *= shape[view_d];
                view_d--;
            }
            if (vnumel != tnumel)
                return false;
            if (td > 0) {
                base = t->strides[td - 1];
                tnumel = 1;
                vnumel = 1;
            }
        }
    }
    return view_d == -1;
}

kiln_tensor *kiln__reshape(kiln_tensor *t, int ndim, const int64_t *shape, const char *op)
{
    int64_t sh[KILN_MAX_DIMS], st[KILN_MAX_DIMS];
    if (infer_shape(t, ndim, shape, sh, op) < 0)
        return NULL;
    if (view_strides(t, ndim, sh, st))
        return kiln__view(t, ndim, sh, st, t->offset);
    kiln_tensor *c = kiln__copy_as(t, t->dtype, op);
    if (!c)
        return NULL;
    kiln__contig_strides(ndim, sh, st);
    kiln_tensor *v = kiln__view(c, ndim, sh, st, 0);
    kiln_tensor_release(c);
    return v;
}

kiln_tensor *kiln_reshape(kiln_tensor *t, int ndim, const int64_t *shape)
{
    if (!t)
        return NULL;
    return kiln__ret(shaped(kiln__reshape(t, ndim, shape, "reshape"), t, "reshape"));
}

kiln_tensor *kiln_flatten(kiln_tensor *t, int start_dim, int end_dim)
{
    if (!t)
        return NULL;
    if (t->ndim == 0) {
        int64_t one = 1;
        return kiln__ret(shaped(kiln__reshape(t, 1, &one, "flatten"), t, "flatten"));
    }
    int s = kiln__wrap_dim(start_dim, t->ndim, "flatten");
    int e = kiln__wrap_dim(end_dim, t->ndim, "flatten");
    if (s < 0 || e < 0)
        return NULL;
    if (s > e) {
        kiln__error_set("flatten: start_dim %d comes after end_dim %d", start_dim, end_dim);
        return NULL;
    }
    int64_t sh[KILN_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < s; i++)
        sh[n++] = t->shape[i];
    int64_t m = 1;
    for (int i = s; i <= e; i++)
        m *= t->shape[i];
    sh[n++] = m;
    for (int i = e + 1; i < t->ndim; i++)
        sh[n++] = t->shape[i];
    return kiln__ret(shaped(kiln__reshape(t, n, sh, "flatten"), t, "flatten"));
}

kiln_tensor *kiln_unflatten(kiln_tensor *t, int dim, int nsizes, const int64_t *sizes)
{
    if (!t)
        return NULL;
    int d = kiln__wrap_dim(dim, t->ndim, "unflatten");
    if (d < 0)
        return NULL;
    if (nsizes < 1 || !sizes || t->ndim - 1 + nsizes > KILN_MAX_DIMS) {
        kiln__error_set("unflatten: %d sizes do not fit a %d-d tensor", nsizes, t->ndim);
        return NULL;
    }
    int64_t sh[KILN_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < d; i++)
        sh[n++] = t->shape[i];
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < nsizes; i++) {
        if (sizes[i] == -1 && infer < 0)
            infer = n;
        else if (sizes[i] < 0) {
            kiln__error_set("unflatten: invalid size %lld", (long long)sizes[i]);
            return NULL;
        } else
            known *= sizes[i];
        sh[n++] = sizes[i];
    }
    int64_t size = t->ndim ? t->shape[d] : 1;
    if (infer >= 0) {
        if (known == 0 || size % known != 0)
            goto bad;
        sh[infer] = size / known;
    } else if (known != size) {
        goto bad;
    }
    for (int i = d + 1; i < t->ndim; i++)
        sh[n++] = t->shape[i];
    return kiln__ret(shaped(kiln__reshape(t, n, sh, "unflatten"), t, "unflatten"));
bad:
    kiln__error_set("unflatten: sizes do not multiply to %lld (dim %d)", (long long)size, dim);
    return NULL;
}

/* -------------------------------------------------------------------- squeezing */

kiln_tensor *kiln_squeeze(kiln_tensor *t, int dim)
{
    if (!t)
        return NULL;
    int d = kiln__wrap_dim(dim, t->ndim, "squeeze");
    if (d < 0)
        return NULL;
    int64_t sh[KILN_MAX_DIMS], st[KILN_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (i == d && t->shape[i] == 1)
            continue;
        sh[n] = t->shape[i];
        st[n++] = t->strides[i];
    }
    return kiln__ret(shaped(kiln__view(t, n, sh, st, t->offset), t, "squeeze"));
}

kiln_tensor *kiln_squeeze_all(kiln_tensor *t)
{
    if (!t)
        return NULL;
    int64_t sh[KILN_MAX_DIMS], st[KILN_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 1)
            continue;
        sh[n] = t->shape[i];
        st[n++] = t->strides[i];
    }
    return kiln__ret(shaped(kiln__view(t, n, sh, st, t->offset), t, "squeeze_all"));
}

kiln_tensor *kiln_unsqueeze(kiln_tensor *t, int dim)
{
    if (!t)
        return NULL;
    if (t->ndim >= KILN_MAX_DIMS) {
        kiln__error_set("unsqueeze: a %d-d tensor is already at the rank limit", t->ndim);
        return NULL;
    }
    int d = kiln__wrap_dim(dim, t->ndim + 1, "unsqueeze");
    if (d < 0)
        return NULL;
    int64_t sh[KILN_MAX_DIMS], st[KILN_MAX_DIMS];
    int n = 0;
    for (int i = 0; i <= t->ndim; i++) {
        if (i == d) {
            sh[n] = 1;
            st[n++] = i < t->ndim ? t->strides[i] * t->shape[i] : 1;
        }
        if (i < t->ndim) {
            sh[n] = t->shape[i];
            st[n++] = t->strides[i];
        }
    }
    return kiln__ret(shaped(kiln__view(t, n, sh, st, t->offset), t, "unsqueeze"));
}

/* ------------------------------------------------------------------- permuting */

kiln_tensor *kiln_permute(kiln_tensor *t, int ndim, const int *order)
{
    if (!t)
        return NULL;
    if (ndim != t->ndim || (ndim > 0 && !order)) {
        kiln__error_set("permute: %d dims given for a %d-d tensor", ndim, t->ndim);
        return NULL;
    }
    int64_t sh[KILN_MAX_DIMS], st[KILN_MAX_DIMS];
    bool seen[KILN_MAX_DIMS] = {false};
    for (int i = 0; i < ndim; i++) {
        int d = kiln__wrap_dim(order[i], ndim, "permute");
        if (d < 0)
            return NULL;
        if (seen[d]) {
            kiln__error_set("permute: dim %d repeats in the order", order[i]);
            return NULL;
        }
        seen[d] = true;
        sh[i] = t->shape[d];
        st[i] = t->strides[d];
    }
    kiln_tensor *out = kiln__view(t, ndim, sh, st, t->offset);
    if (out && kiln__ad_want(t))
        out = kiln__grad_permute(out, t, ndim, order);
    return kiln__ret(out);
}

kiln_tensor *kiln_transpose(kiln_tensor *t, int d0, int d1)
{
    if (!t)
        return NULL;
    int a = kiln__wrap_dim(d0, t->ndim, "transpose");
    int b = a < 0 ? -1 : kiln__wrap_dim(d1, t->ndim, "transpose");
    if (a < 0 || b < 0)
        return NULL;
    int64_t sh[KILN_MAX_DIMS], st[KILN_MAX_DIMS];
    memcpy(sh, t->shape, sizeof sh);
    memcpy(st, t->strides, sizeof st);
    if (t->ndim > 0) {
        sh[a] = t->shape[b];
        st[a] = t->strides[b];
        sh[b] = t->shape[a];
        st[b] = t->strides[a];
    }
    kiln_tensor *out = kiln__view(t, t->ndim, sh, st, t->offset);
    if (out && kiln__ad_want(t)) {
        int order[KILN_MAX_DIMS];
        for (int i = 0; i < t->ndim; i++)
            order[i] = i == a ? b : i == b ? a : i;
        out = kiln__grad_permute(out, t, t->ndim, order);
    }
    return kiln__ret(out);
}

/* ------------------------------------------------------------ slicing, splitting */

/* Python's clamping for start/end with a positive step; returns the resulting length.
 * The length is counted as 1 + (e - s - 1) / step, never e - s + step - 1, which overflows
 * int64 for a step near INT64_MAX (a[:, ::huge] has one element per row, as in Python). */
static int64_t clamp_slice(int64_t size, int64_t *start, int64_t *end, int64_t step)
{
    int64_t s = *start, e = *end;
    if (s < 0)
        s += size;
    if (e < 0)
        e += size;
    if (s < 0)
        s = 0;
    if (s > size)
        s = size;
    if (e < s)
        e = s;
    if (e > size)
        e = size;
    *start = s;
    *end = e;
    return e > s ? 1 + (e - s - 1) / step : 0;
}

kiln_tensor *kiln__slice(kiln_tensor *t, int dim, int64_t start, int64_t end, int64_t step,
                         const char *op)
{
    if (t->ndim == 0) {
        kiln__error_set("%s: cannot slice a 0-d tensor", op);
        return NULL;
    }
    int d = kiln__wrap_dim(dim, t->ndim, op);
    if (d < 0)
        return NULL;
    if (step <= 0) {
        kiln__error_set("%s: step %lld must be positive", op, (long long)step);
        return NULL;
    }
    int64_t len = clamp_slice(t->shape[d], &start, &end, step);
    int64_t sh[KILN_MAX_DIMS], st[KILN_MAX_DIMS];
    memcpy(sh, t->shape, sizeof sh);
    memcpy(st, t->strides, sizeof st);
    sh[d] = len;
    /* with at most one element the stride is never stepped, so a step past the dim (a
     * huge one included) keeps the old stride rather than a product that may overflow */
    if (len <= 1)
        st[d] = t->strides[d];
    else if (__builtin_mul_overflow(t->strides[d], step, &st[d])) {
        kiln__error_set("%s: step %lld times stride %lld of dim %d overflows", op, (long long)step,
                        (long long)t->strides[d], d);
        return NULL;
    }
    return kiln__view(t, t->ndim, sh, st, t->offset + (len > 0 ? start * t->strides[d] : 0));
}

kiln_tensor *kiln_slice(kiln_tensor *t, int dim, int64_t start, int64_t end, int64_t step)
{
    if (!t)
        return NULL;
    kiln_tensor *out = kiln__slice(t, dim, start, end, step, "slice");
    if (out && kiln__ad_want(t))
        out = kiln__grad_slice(out, t, dim, start, end, step, "slice");
    return kiln__ret(out);
}

kiln_tensor *kiln__narrow(kiln_tensor *t, int dim, int64_t start, int64_t length, const char *op)
{
    if (t->ndim == 0) {
        kiln__error_set("%s: cannot narrow a 0-d tensor", op);
        return NULL;
    }
    int d = kiln__wrap_dim(dim, t->ndim, op);
    if (d < 0)
        return NULL;
    int64_t size = t->shape[d];
    if (start < 0 && start >= -size)
        start += size;
    if (start < 0 || start > size || length < 0 || length > size - start) {
        char ds[200];
        kiln__error_set("%s: start %lld + length %lld exceeds dim %d of %s", op, (long long)start,
                        (long long)length, dim, kiln__describe(t, ds, sizeof ds));
        return NULL;
    }
    int64_t sh[KILN_MAX_DIMS];
    memcpy(sh, t->shape, sizeof sh);
    sh[d] = length;
    return kiln__view(t, t->ndim, sh, t->strides, t->offset + start * t->strides[d]);
}

kiln_tensor *kiln_narrow(kiln_tensor *t, int dim, int64_t start, int64_t length)
{
    if (!t)
        return NULL;
    kiln_tensor *out = kiln__narrow(t, dim, start, length, "narrow");
    if (out && kiln__ad_want(t)) {
        int64_t size = t->shape[kiln__wrap_dim(dim, t->ndim, "narrow")];
        int64_t s0 = start < 0 ? start + size : start;
        out = kiln__grad_slice(out, t, dim, s0, s0 + length, 1, "narrow");
    }
    return kiln__ret(out);
}

static int split_impl(kiln_tensor *t, int64_t split_size, int dim, kiln_tensor **out, int max_out,
                      const char *op)
{
    if (!t)
        return -1;
    if (t->ndim == 0)
        return kiln__error_set("%s: cannot split a 0-d tensor", op);
    int d = kiln__wrap_dim(dim, t->ndim, op);
    if (d < 0)
        return -1;
    int64_t size = t->shape[d];
    if (split_size < 0 || (split_size == 0 && size != 0))
        return kiln__error_set("%s: split size %lld must be positive", op, (long long)split_size);
    int64_t count = size == 0 ? 1 : (size + split_size - 1) / split_size;
    if (count > (int64_t)1 << 30)
        return kiln__error_set("%s: %lld pieces is too many", op, (long long)count);
    if (!out || max_out <= 0)
        return (int)count;  /* a query for the piece count */
    if (count > max_out)
        return kiln__error_set("%s: %lld pieces do not fit in %d output slots", op, (long long)count, max_out);
    for (int64_t i = 0; i < count; i++) {
        int64_t start = i * split_size;
        int64_t len = size - start < split_size ? size - start : split_size;
        out[i] = kiln__narrow(t, d, start, len, op);
        if (out[i] && kiln__ad_want(t))
            out[i] = kiln__grad_slice(out[i], t, d, start, start + len, 1, op);
        if (!out[i]) {
            for (int64_t j = 0; j < i; j++) {
                kiln_tensor_release(out[j]);
                out[j] = NULL;
            }
            return -1;
        }
    }
    for (int64_t i = 0; i < count; i++)
        out[i] = kiln__ret(out[i]);
    return (int)count;
}

int kiln_split(kiln_tensor *t, int64_t split_size, int dim, kiln_tensor **out, int max_out)
{
    return split_impl(t, split_size, dim, out, max_out, "split");
}

int kiln_chunk(kiln_tensor *t, int chunks, int dim, kiln_tensor **out, int max_out)
{
    if (!t)
        return -1;
    if (chunks <= 0)
        return kiln__error_set("chunk: chunks %d must be positive", chunks);
    int d = t->ndim ? kiln__wrap_dim(dim, t->ndim, "chunk") : -1;
    if (d < 0)
        return t->ndim ? -1 : kiln__error_set("chunk: cannot chunk a 0-d tensor");
    int64_t size = t->shape[d];
    int64_t split_size = (size + chunks - 1) / chunks;
    return split_impl(t, split_size, dim, out, max_out, "chunk");
}
