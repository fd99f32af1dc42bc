/*
 * onnx-ops-shape.c — ONNX's shape, layout and indexing operators: Shape, Reshape,
 * Squeeze/Unsqueeze, Transpose, Concat, Split, Slice, Gather, Expand, Pad, Range and
 * friends. Exporters feed these small integer tensors (shapes, axes, pads, starts); they
 * are read to the host with kiln__onnx_read_ints, and are usually constants folded at
 * load. Where an argument moved from an attribute to an input across opsets (Squeeze,
 * Unsqueeze and Split at 13, Slice at 10, Pad at 11), both forms are accepted.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "onnx-impl.h"
#include "tensor-impl.h"

#define MAXI 64

/* A host array of i64 as a 1-D tensor on the node's device. */
static kiln_tensor *i64_tensor(const kiln__onnx_node *n, int count, const int64_t *v) {
    return kiln_from_data(n->dev, KILN_I64, 1, (const int64_t[]){count}, v, (size_t)count * sizeof *v);
}

static int op_shape(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(1);
    int r = kiln_tensor_ndim(in[0]);
    int64_t s = kiln__onnx_attr_int(n, "start", 0), e = kiln__onnx_attr_int(n, "end", r);
    if (s < 0) s += r;
    if (e < 0) e += r;
    s = s < 0 ? 0 : s > r ? r : s;
    e = e < s ? s : e > r ? r : e;
    out[0] = i64_tensor(n, (int)(e - s), kiln_tensor_shape(in[0]) + s);
    return kiln__onnx_ok(out);
}

static int op_size(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(1);
    int64_t v = kiln_tensor_numel(in[0]);
    out[0] = kiln_from_data(n->dev, KILN_I64, 0, NULL, &v, sizeof v);
    return kiln__onnx_ok(out);
}

static int op_reshape(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(2);
    int64_t s[MAXI];
    int k = kiln__onnx_read_ints(n, in[1], s, KILN_MAX_DIMS);
    if (k < 0) return -1;
    bool allowzero = kiln__onnx_attr_int(n, "allowzero", 0) != 0;
    for (int i = 0; i < k; i++)
        if (s[i] == 0 && !allowzero) {
            if (i >= kiln_tensor_ndim(in[0])) return kiln__onnx_fail(n, "shape entry %d copies a missing dim", i);
            s[i] = kiln_tensor_dim(in[0], i);
        }
    out[0] = kiln_reshape(in[0], k, s);
    return kiln__onnx_ok(out);
}

static int op_flatten(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(1);
    int r = kiln_tensor_ndim(in[0]);
    int64_t axis = kiln__onnx_attr_int(n, "axis", 1);
    if (axis < 0) axis += r;
    if (axis < 0 || axis > r) return kiln__onnx_fail(n, "axis out of range");
    int64_t a = 1, b = 1;
    for (int i = 0; i < r; i++) *(i < axis ? &a : &b) *= kiln_tensor_dim(in[0], i);
    out[0] = kiln_reshape(in[0], 2, (const int64_t[]){a, b});
    return kiln__onnx_ok(out);
}

/* axes from the attribute (before opset 13) or the second input. */
static int get_axes(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int idx, int64_t *axes) {
    if (nin > idx && in[idx]) return kiln__onnx_read_ints(n, in[idx], axes, MAXI);
    return kiln__onnx_attr_ints(n, "axes", axes, MAXI);
}

static int op_squeeze(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(1);
    int64_t axes[MAXI];
    int k = get_axes(n, nin, in, 1, axes);
    int r = kiln_tensor_ndim(in[0]);
    if (k < 0) {
        out[0] = kiln_squeeze_all(in[0]);
        return kiln__onnx_ok(out);
    }
    int64_t shape[KILN_MAX_DIMS];
    bool drop[KILN_MAX_DIMS] = {0};
    for (int i = 0; i < k; i++) {
        int a;
        if (kiln__onnx_axis(n, axes[i], r, &a)) return -1;
        if (kiln_tensor_dim(in[0], a) != 1) return kiln__onnx_fail(n, "dim %d is not 1", a);
        drop[a] = true;
    }
    int m = 0;
    for (int i = 0; i < r; i++)
        if (!drop[i]) shape[m++] = kiln_tensor_dim(in[0], i);
    out[0] = kiln_reshape(in[0], m, shape);
    return kiln__onnx_ok(out);
}

static int op_unsqueeze(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(1);
    int64_t axes[MAXI];
    int k = get_axes(n, nin, in, 1, axes);
    int r = kiln_tensor_ndim(in[0]);
    if (k < 0) return kiln__onnx_fail(n, "no axes");
    int nr = r + k;
    if (nr > KILN_MAX_DIMS) return kiln__onnx_fail(n, "result rank %d too large", nr);
    bool ins[KILN_MAX_DIMS] = {0};
    for (int i = 0; i < k; i++) {
        int a;
        if (kiln__onnx_axis(n, axes[i], nr, &a)) return -1;
        if (ins[a]) return kiln__onnx_fail(n, "axis %d given twice", a);
        ins[a] = true;
    }
    int64_t shape[KILN_MAX_DIMS];
    for (int i = 0, j = 0; i < nr; i++) shape[i] = ins[i] ? 1 : kiln_tensor_dim(in[0], j++);
    out[0] = kiln_reshape(in[0], nr, shape);
    return kiln__onnx_ok(out);
}

static int op_transpose(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(1);
    int r = kiln_tensor_ndim(in[0]);
    int64_t p[MAXI];
    int order[KILN_MAX_DIMS];
    int k = kiln__onnx_attr_ints(n, "perm", p, MAXI);
    if (k >= 0 && k != r) return kiln__onnx_fail(n, "perm has %d entries for rank %d", k, r);
    for (int i = 0; i < r; i++) {
        if (k < 0) { order[i] = r - 1 - i; continue; }
        if (kiln__onnx_axis(n, p[i], r, &order[i])) return -1;
    }
    out[0] = kiln_contiguous(kiln_permute(in[0], r, order));
    return kiln__onnx_ok(out);
}

/* Shape arithmetic on a device whose buffers are host memory (cpu, and the host device that
 * runs a GPU model's shape arithmetic): a Concat of small int64 vectors is read and written
 * on the host, one allocation instead of a copy per input (torch's exporter concatenates
 * shape values a dozen times a layer). NULL when the inputs are not such vectors. */
static kiln_tensor *concat_small_ints(kiln_tensor *const *ts, int m)
{
    enum {
        MAXV = 64
    };
    kiln_device *dev = kiln__dev(ts[0]);
    int64_t vals[MAXV];
    int64_t total = 0;
    for (int i = 0; i < m; i++) {
        const kiln_tensor *t = ts[i];
        if (t->ndim != 1 || !kiln__onnx_small_host_ints(t, dev, MAXV - total))
            return NULL;
        total += t->shape[0];
    }
    total = 0;
    for (int i = 0; i < m; i++) {
        int64_t k = ts[i]->shape[0];
        if (k && kiln_to_data(ts[i], vals + total, (size_t)k * sizeof *vals) != 0)
            return NULL;
        total += k;
    }
    return kiln_from_data(dev, KILN_I64, 1, &total, vals, (size_t)total * sizeof *vals);
}

static int op_concat(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(1);
    int a;
    kiln_tensor *ts[64];
    int m = 0;
    for (int i = 0; i < nin; i++)
        if (in[i] && (kiln_tensor_numel(in[i]) > 0 || kiln_tensor_ndim(in[i]) > 1)) ts[m++] = in[i];
    if (m == 0) ts[m++] = in[0];
    if (kiln__onnx_axis(n, kiln__onnx_attr_int(n, "axis", 0), kiln_tensor_ndim(ts[0]), &a)) return -1;
    out[0] = a == 0 ? concat_small_ints(ts, m) : NULL;
    if (!out[0])
        out[0] = kiln_cat(ts, m, a);
    return kiln__onnx_ok(out);
}

static int op_split(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(1);
    int a, r = kiln_tensor_ndim(in[0]);
    if (kiln__onnx_axis(n, kiln__onnx_attr_int(n, "axis", 0), r, &a)) return -1;
    int64_t sizes[MAXI];
    int k = nin > 1 && in[1] ? kiln__onnx_read_ints(n, in[1], sizes, MAXI) : kiln__onnx_attr_ints(n, "split", sizes, MAXI);
    int64_t dim = kiln_tensor_dim(in[0], a);
    if (k < 0) {
        /* equal parts; the last one smaller when it does not divide (opset 18) */
        int parts = nout;
        int64_t each = (dim + parts - 1) / parts;
        for (int i = 0; i < parts; i++) sizes[i] = i < parts - 1 ? each : dim - each * (parts - 1);
        k = parts;
    }
    if (k != nout) return kiln__onnx_fail(n, "%d sizes for %d outputs", k, nout);
    int64_t at = 0;
    for (int i = 0; i < k; i++) {
        if (sizes[i] < 0 || at + sizes[i] > dim) return kiln__onnx_fail(n, "split sizes exceed the dim");
        out[i] = kiln_contiguous(kiln_narrow(in[0], a, at, sizes[i]));
        if (!out[i]) return -1;
        at += sizes[i];
    }
    return 0;
}

static int op_slice(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(1);
    int64_t st[MAXI], en[MAXI], ax[MAXI], sp[MAXI];
    int k, ka, ks = -1;
    if (n->opset < 10) {
        k = kiln__onnx_attr_ints(n, "starts", st, MAXI);
        if (kiln__onnx_attr_ints(n, "ends", en, MAXI) != k || k < 0) return kiln__onnx_fail(n, "starts/ends mismatch");
        ka = kiln__onnx_attr_ints(n, "axes", ax, MAXI);
    } else {
        KILN__ONNX_NEED(3);
        k = kiln__onnx_read_ints(n, in[1], st, MAXI);
        if (k < 0 || kiln__onnx_read_ints(n, in[2], en, MAXI) != k) return kiln__onnx_fail(n, "starts/ends mismatch");
        ka = nin > 3 && in[3] ? kiln__onnx_read_ints(n, in[3], ax, MAXI) : -1;
        ks = nin > 4 && in[4] ? kiln__onnx_read_ints(n, in[4], sp, MAXI) : -1;
    }
    if ((ka >= 0 && ka != k) || (ks >= 0 && ks != k)) return kiln__onnx_fail(n, "axes/steps length mismatch");
    int r = kiln_tensor_ndim(in[0]);
    kiln_tensor *t = in[0];
    for (int i = 0; i < k; i++) {
        int a;
        if (kiln__onnx_axis(n, ka >= 0 ? ax[i] : i, r, &a)) return -1;
        int64_t step = ks >= 0 ? sp[i] : 1, d = kiln_tensor_dim(t, a);
        if (step == 0) return kiln__onnx_fail(n, "step 0");
        int64_t s = st[i], e = en[i];
        if (s < 0) s += d;
        if (e < 0) e += d;
        if (step > 0) {
            s = s < 0 ? 0 : s > d ? d : s;
            e = e < 0 ? 0 : e > d ? d : e;
            t = kiln_slice(t, a, s, e < s ? s : e, step);
        } else {
            /* negative steps: pick indices s, s+step, ... above e, by flipping */
            s = s < 0 ? -1 : s > d - 1 ? d - 1 : s;
            e = e < -1 ? -1 : e > d - 1 ? d - 1 : e;
            if (s <= e) {
                t = kiln_narrow(t, a, 0, 0);
            } else {
                /* -step overflows for INT64_MIN, and any step past s - e picks one index */
                int64_t ns = step < -(s - e) ? s - e : -step;
                int dims[1] = {a};
                kiln_tensor *f = kiln_flip(t, 1, dims);       /* index j -> d-1-j */
                t = kiln_slice(f, a, d - 1 - s, d - s + (s - e - 1) / ns * ns, ns);
            }
        }
    }
    out[0] = t == in[0] ? (t) : kiln_contiguous(t);
    return kiln__onnx_ok(out);
}

/* Negative indices count from the end of the gathered dim. */
static kiln_tensor *fix_index(kiln_tensor *idx, int64_t d) {
    kiln_tensor *i = kiln_cast(idx, KILN_I64);
    return kiln_where(kiln_lt(i, kiln_zeros_like(i)), kiln_add_scalar(i, (double)d), i);
}

/* Shape arithmetic as in concat_small_ints: a Gather from a small int64 vector (a Shape's
 * result) on a host-memory device, read and written on the host, negative indices wrapped
 * and the range checked there. 0 when the operands are not such (nothing done), 1 when
 * out[0] was made, -1 with a message. */
static int gather_small_ints(const kiln__onnx_node *n, kiln_tensor *data, kiln_tensor *idx, kiln_tensor **out)
{
    enum {
        MAXV = 64
    };
    kiln_device *dev = kiln__dev(data);
    int64_t nd = data->ndim == 1 ? data->shape[0] : -1, ni = kiln_tensor_numel(idx);
    if (nd < 0 || !kiln__onnx_small_host_ints(data, dev, MAXV) || !kiln__onnx_small_host_ints(idx, dev, MAXV))
        return 0;
    int64_t d[MAXV], ix[MAXV], res[MAXV];
    if ((nd && kiln_to_data(data, d, (size_t)nd * sizeof *d) != 0) ||
        (ni && kiln_to_data(idx, ix, (size_t)ni * sizeof *ix) != 0))
        return -1;
    for (int64_t i = 0; i < ni; i++) {
        int64_t k = ix[i] < 0 ? ix[i] + nd : ix[i];
        if (k < 0 || k >= nd)
            return kiln__onnx_fail(n, "index %lld is out of bounds for size %lld", (long long)ix[i],
                                   (long long)nd);
        res[i] = d[k];
    }
    out[0] = kiln_from_data(dev, KILN_I64, idx->ndim, idx->shape, res, (size_t)ni * sizeof *res);
    return out[0] ? 1 : -1;
}

static int op_gather(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(2);
    int a, r = kiln_tensor_ndim(in[0]);
    if (kiln__onnx_axis(n, kiln__onnx_attr_int(n, "axis", 0), r, &a)) return -1;
    if (n->has_index_scalar && n->index_scalar < kiln_tensor_dim(in[0], a)) {
        /* a constant single index: a view of the data (one past the end takes the op below,
         * which reports it) */
        out[0] = kiln_squeeze(kiln_narrow(in[0], a, n->index_scalar, 1), a);
        return kiln__onnx_ok(out);
    }
    int small = a == 0 ? gather_small_ints(n, in[0], in[1], out) : 0;
    if (small)
        return small < 0 ? -1 : 0;
    int ri = kiln_tensor_ndim(in[1]);
    if (r - 1 + ri > KILN_MAX_DIMS) return kiln__onnx_fail(n, "result rank too large");
    kiln_tensor *idx = n->index_nonneg ? kiln_cast(in[1], KILN_I64) : fix_index(in[1], kiln_tensor_dim(in[0], a));
    kiln_tensor *flat = kiln_reshape(idx, 1, (const int64_t[]){kiln_tensor_numel(in[1])});
    kiln_tensor *g = kiln_index_select(in[0], a, flat);
    int64_t shape[KILN_MAX_DIMS];
    int m = 0;
    for (int i = 0; i < a; i++) shape[m++] = kiln_tensor_dim(in[0], i);
    for (int i = 0; i < ri; i++) shape[m++] = kiln_tensor_dim(in[1], i);
    for (int i = a + 1; i < r; i++) shape[m++] = kiln_tensor_dim(in[0], i);
    out[0] = kiln_reshape(g, m, shape);
    return kiln__onnx_ok(out);
}

static int op_gather_elements(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(2);
    int a;
    if (kiln__onnx_axis(n, kiln__onnx_attr_int(n, "axis", 0), kiln_tensor_ndim(in[0]), &a)) return -1;
    kiln_tensor *idx = n->index_nonneg ? kiln_cast(in[1], KILN_I64) : fix_index(in[1], kiln_tensor_dim(in[0], a));
    out[0] = kiln_gather(in[0], a, idx);
    return kiln__onnx_ok(out);
}

/* Expand broadcasts both ways: the result has the broadcast of the two shapes. */
static int op_expand(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(2);
    int64_t s[MAXI], res[KILN_MAX_DIMS], xs[KILN_MAX_DIMS];
    int k = kiln__onnx_read_ints(n, in[1], s, KILN_MAX_DIMS);
    if (k < 0) return -1;
    int r = kiln_tensor_ndim(in[0]);
    int m = k > r ? k : r;
    for (int i = 0; i < m; i++) {
        int64_t a = i - (m - r) >= 0 ? kiln_tensor_dim(in[0], i - (m - r)) : 1;
        int64_t b = i - (m - k) >= 0 ? s[i - (m - k)] : 1;
        xs[i] = a;
        if (a != b && a != 1 && b != 1) return kiln__onnx_fail(n, "shapes do not broadcast");
        res[i] = a == 1 ? b : a;
    }
    out[0] = kiln_contiguous(kiln_expand(kiln_reshape(in[0], m, xs), m, res));
    return kiln__onnx_ok(out);
}

static int op_tile(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(2);
    int64_t rep[MAXI];
    int k = kiln__onnx_read_ints(n, in[1], rep, KILN_MAX_DIMS);
    if (k < 0) return -1;
    if (k != kiln_tensor_ndim(in[0])) return kiln__onnx_fail(n, "repeats length differs from the rank");
    out[0] = kiln_repeat(in[0], k, rep);
    return kiln__onnx_ok(out);
}

static int op_pad(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(1);
    int64_t p[2 * MAXI], ax[MAXI];
    int r = kiln_tensor_ndim(in[0]);
    int k = n->opset < 11 ? kiln__onnx_attr_ints(n, "pads", p, 2 * MAXI)
                          : (nin > 1 && in[1] ? kiln__onnx_read_ints(n, in[1], p, 2 * MAXI) : -1);
    double value = n->opset < 11 ? kiln__onnx_attr_float(n, "value", 0.0) : 0.0;
    if (n->opset >= 11 && nin > 2 && in[2] && kiln_tensor_numel(in[2]) == 1 &&
        kiln__onnx_read_scalar(n, in[2], &value))
        return -1;
    int ka = nin > 3 && in[3] ? kiln__onnx_read_ints(n, in[3], ax, MAXI) : -1;
    if (ka < 0) { ka = r; for (int i = 0; i < r; i++) ax[i] = i; }
    if (k != 2 * ka) return kiln__onnx_fail(n, "pads has %d entries for %d axes", k, ka);
    int64_t tp[2 * KILN_MAX_DIMS] = {0};        /* kiln order: last dim first, (lo, hi) */
    for (int i = 0; i < ka; i++) {
        int a;
        if (kiln__onnx_axis(n, ax[i], r, &a)) return -1;
        tp[2 * (r - 1 - a)] = p[i];
        tp[2 * (r - 1 - a) + 1] = p[i + ka];
    }
    const char *mode = kiln__onnx_attr_str(n, "mode", "constant");
    kiln_pad_mode pm = !strcmp(mode, "reflect") ? KILN_PAD_REFLECT
                     : !strcmp(mode, "edge")    ? KILN_PAD_REPLICATE
                                                : KILN_PAD_CONSTANT;
    if (strcmp(mode, "constant") && strcmp(mode, "reflect") && strcmp(mode, "edge"))
        return kiln__onnx_fail(n, "mode '%s' not supported", mode);
    out[0] = kiln_pad(in[0], 2 * r, tp, pm, value);
    return kiln__onnx_ok(out);
}

static int op_range(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(3);
    double s, l, d;
    if (kiln__onnx_read_scalar(n, in[0], &s) || kiln__onnx_read_scalar(n, in[1], &l) ||
        kiln__onnx_read_scalar(n, in[2], &d))
        return -1;
    if (d == 0) return kiln__onnx_fail(n, "delta 0");
    if ((l - s) / d > (double)(1 << 30)) return kiln__onnx_fail(n, "range too long");
    out[0] = kiln_arange(n->dev, kiln_tensor_dtype(in[0]), s, l, d);
    return kiln__onnx_ok(out);
}

/* The first element of an attribute tensor of a plain dtype, read on the host. */
static bool host_scalar(const kiln__onnx_ptensor *t, double *v)
{
    if (t->kdtype < 0 || t->nbytes < kiln_dtype_size((kiln_dtype)t->kdtype))
        return false;
    switch (t->kdtype) {
    case KILN_F32: {
        float f;
        memcpy(&f, t->data, sizeof f);
        *v = f;
        return true;
    }
    case KILN_F64: memcpy(v, t->data, sizeof *v); return true;
    case KILN_I64: {
        int64_t i;
        memcpy(&i, t->data, sizeof i);
        *v = (double)i;
        return true;
    }
    case KILN_I32: {
        int32_t i;
        memcpy(&i, t->data, sizeof i);
        *v = i;
        return true;
    }
    case KILN_U8:
    case KILN_BOOL: *v = *(const uint8_t *)t->data; return true;
    default: return false;
    }
}

static int op_constant_of_shape(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout,
                                kiln_tensor **out) {
    KILN__ONNX_NEED(1);
    int64_t s[MAXI];
    int k = kiln__onnx_read_ints(n, in[0], s, KILN_MAX_DIMS);
    if (k < 0) return -1;
    const kiln__onnx_attr *a = kiln__onnx_attr_get(n, "value");
    kiln_dtype dt = KILN_F32;
    double v = 0;
    if (a && a->t && a->t->data && a->t->numel >= 1 && host_scalar(a->t, &v)) {
        /* read from the attribute's own bytes: no device round trip per run */
        dt = (kiln_dtype)a->t->kdtype;
    } else if (a && a->t) {
        kiln_tensor *c = kiln__onnx_ptensor_to_tensor(a->t, n->dev);
        if (!c) return -1;
        dt = kiln_tensor_dtype(c);
        v = kiln_item(c);
        /* c is scoped: released with the node's scope */
        if (dt == KILN_I64 && kiln_tensor_numel(c) == 1 && fabs(v) > 9007199254740992.0) {
            out[0] = kiln_contiguous(kiln_expand(kiln_reshape(c, 0, NULL), k, s));
            return kiln__onnx_ok(out);
        }
    }
    if (dt == KILN_I64 && fabs(v) > 9007199254740992.0 && a && a->t && a->t->data) {
        /* an int64 past 2^53 (INT64_MAX standing for "no limit") from its own bytes: through
         * the double kiln_full takes it would round, and 2^63 fits no int64 */
        kiln_tensor *one = kiln_from_data(n->dev, KILN_I64, 0, NULL, a->t->data, sizeof(int64_t));
        out[0] = kiln_contiguous(kiln_expand(one, k, s));
        return kiln__onnx_ok(out);
    }
    out[0] = kiln_full(n->dev, dt, k, s, v);
    return kiln__onnx_ok(out);
}

static int op_constant(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    const kiln__onnx_attr *a;
    if ((a = kiln__onnx_attr_get(n, "value")) && a->t) out[0] = kiln__onnx_ptensor_to_tensor(a->t, n->dev);
    else if ((a = kiln__onnx_attr_get(n, "value_float"))) out[0] = kiln_full(n->dev, KILN_F32, 0, NULL, a->f);
    else if ((a = kiln__onnx_attr_get(n, "value_int"))) /* exact: an int64 may not survive a double */
        out[0] = kiln_from_data(n->dev, KILN_I64, 0, NULL, &a->i, sizeof a->i);
    else if ((a = kiln__onnx_attr_get(n, "value_ints"))) out[0] = i64_tensor(n, a->nints, a->ints);
    else if ((a = kiln__onnx_attr_get(n, "value_floats"))) {
        out[0] = kiln_cast(kiln_from_data(n->dev, KILN_F64, 1, (const int64_t[]){a->nfloats}, a->floats,
                                          (size_t)a->nfloats * sizeof(double)), KILN_F32);
    } else return kiln__onnx_fail(n, "no supported value attribute");
    return kiln__onnx_ok(out);
}

static int op_dropout(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(1);
    out[0] = (in[0]);
    if (nout > 1) out[1] = kiln_ones(n->dev, KILN_BOOL, kiln_tensor_ndim(in[0]), kiln_tensor_shape(in[0]));
    return kiln__onnx_ok(out);
}

static int op_trilu(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(1);
    double k = 0;
    if (nin > 1 && in[1] && kiln__onnx_read_scalar(n, in[1], &k)) return -1;
    out[0] = kiln__onnx_attr_int(n, "upper", 1) ? kiln_triu(in[0], (int64_t)k) : kiln_tril(in[0], (int64_t)k);
    return kiln__onnx_ok(out);
}

static int op_one_hot(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    KILN__ONNX_NEED(3);
    double depth;
    if (kiln__onnx_read_scalar(n, in[1], &depth)) return -1;
    if (kiln_tensor_numel(in[2]) != 2) return kiln__onnx_fail(n, "values must hold [off, on]");
    int r = kiln_tensor_ndim(in[0]), a;
    if (kiln__onnx_axis(n, kiln__onnx_attr_int(n, "axis", -1), r + 1, &a)) return -1;
    if (!(depth >= 1 && depth < 0x1p62))
        return kiln__onnx_fail(n, "depth %g is out of range", depth);
    int64_t d = (int64_t)depth;
    /* ONNX wraps indices in [-depth, -1] and gives a row of off_value for any outside
     * [-depth, depth-1]; kiln_one_hot refuses those, so they go in as 0 and their row is
     * masked off */
    kiln_tensor *idx = kiln_cast(in[0], KILN_I64);
    kiln_tensor *inside = kiln_logical_and(kiln_ge(idx, kiln_full(n->dev, KILN_I64, 0, NULL, (double)-d)),
                                           kiln_lt(idx, kiln_full(n->dev, KILN_I64, 0, NULL, (double)d)));
    kiln_tensor *safe = kiln_where(inside, fix_index(idx, d), kiln_zeros_like(idx));
    kiln_tensor *oh = kiln_logical_and(kiln_one_hot(safe, d, KILN_BOOL), kiln_unsqueeze(inside, r));
    int order[KILN_MAX_DIMS];
    for (int i = 0, j = 0; i <= r; i++) order[i] = i == a ? r : j++;
    oh = kiln_permute(oh, r + 1, order);
    kiln_tensor *off = kiln_narrow(in[2], 0, 0, 1), *on = kiln_narrow(in[2], 0, 1, 1);
    out[0] = kiln_where(oh, kiln_reshape(on, 0, NULL), kiln_reshape(off, 0, NULL));
    return kiln__onnx_ok(out);
}

const kiln__onnx_op kiln__onnx_ops_shape[] = {
    {"Shape", op_shape}, {"Size", op_size}, {"Reshape", op_reshape}, {"Flatten", op_flatten},
    {"Squeeze", op_squeeze}, {"Unsqueeze", op_unsqueeze}, {"Transpose", op_transpose},
    {"Concat", op_concat}, {"Split", op_split}, {"Slice", op_slice}, {"Gather", op_gather},
    {"GatherElements", op_gather_elements}, {"Expand", op_expand}, {"Tile", op_tile}, {"Pad", op_pad},
    {"Range", op_range}, {"ConstantOfShape", op_constant_of_shape}, {"Constant", op_constant},
    {"Dropout", op_dropout}, {"Trilu", op_trilu}, {"OneHot", op_one_hot},
    {NULL, NULL},
};
