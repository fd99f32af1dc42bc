/*
 * onnx-ops-select.c — ONNX operators that pick, mask or arrange elements: Hardmax, Shrink,
 * EyeLike, Compress, ReverseSequence, NonMaxSuppression, CenterCropPad and Unique.
 *
 * Compress, ReverseSequence, NonMaxSuppression and Unique read their input on the host
 * (the condition, the sequence lengths, the scores and boxes), as ONNX Runtime does: their
 * output shapes, or the order of their work, depend on those values. The others are tensor
 * ops on the device.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error-impl.h"
#include "onnx-impl.h"

/* Hardmax: 1 at the first maximum along axis, 0 elsewhere (before opset 13, along the
 * second dim of x flattened to 2-D at axis, as Softmax then). */
static int op_hardmax(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out)
{
    KILN__ONNX_NEED(1);
    kiln_tensor *x = in[0];
    int r = kiln_tensor_ndim(x), a;
    if (r < 1)
        return kiln__onnx_fail(n, "x must have at least one dim");
    if (kiln__onnx_axis(n, kiln__onnx_attr_int(n, "axis", n->opset < 13 ? 1 : -1), r, &a))
        return -1;
    kiln_tensor *v = x;
    int along = a;
    if (n->opset < 13) {
        int64_t p = 1, q = 1;
        for (int i = 0; i < r; i++)
            *(i < a ? &p : &q) *= kiln_tensor_dim(x, i);
        v = kiln_reshape(x, 2, (const int64_t[]){p, q});
        along = 1;
    }
    int rv = kiln_tensor_ndim(v);
    kiln_tensor *hot = kiln_one_hot(kiln_argmax(v, along, false), kiln_tensor_dim(v, along), kiln_tensor_dtype(x));
    /* one_hot appends the class dim last: move it back to its place */
    int order[KILN_MAX_DIMS];
    for (int i = 0, k = 0; i < rv; i++)
        order[i] = i == along ? rv - 1 : k++;
    kiln_tensor *y = kiln_contiguous(kiln_permute(hot, rv, order));
    out[0] = n->opset < 13 ? kiln_reshape(y, r, kiln_tensor_shape(x)) : y;
    return kiln__onnx_ok(out);
}

/* Shrink: x + bias below -lambd, x - bias above lambd, 0 between. */
static int op_shrink(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out)
{
    KILN__ONNX_NEED(1);
    kiln_tensor *x = in[0];
    double bias = kiln__onnx_attr_float(n, "bias", 0), lambd = kiln__onnx_attr_float(n, "lambd", 0.5);
    kiln_tensor *below = kiln_lt(x, kiln_full_like(x, -lambd)), *above = kiln_gt(x, kiln_full_like(x, lambd));
    out[0] = kiln_where(below, kiln_add_scalar(x, bias),
                        kiln_where(above, kiln_add_scalar(x, -bias), kiln_zeros_like(x)));
    return kiln__onnx_ok(out);
}

/* EyeLike: ones on the diagonal offset by k of a matrix shaped like x (2-D), in the dtype
 * attribute's type or x's. */
static int op_eye_like(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out)
{
    KILN__ONNX_NEED(1);
    kiln_tensor *x = in[0];
    if (kiln_tensor_ndim(x) != 2)
        return kiln__onnx_fail(n, "x must be 2-D, not rank %d", kiln_tensor_ndim(x));
    kiln_dtype dt = kiln_tensor_dtype(x);
    if (kiln__onnx_attr_get(n, "dtype")) {
        int t = kiln__onnx_kdtype((int)kiln__onnx_attr_int(n, "dtype", 1));
        if (t < 0)
            return kiln__onnx_fail(n, "dtype %lld has no kiln form",
                                   (long long)kiln__onnx_attr_int(n, "dtype", 1));
        dt = (kiln_dtype)t;
    }
    int64_t rows = kiln_tensor_dim(x, 0), cols = kiln_tensor_dim(x, 1), k = kiln__onnx_attr_int(n, "k", 0);
    /* a diagonal at offset k is the ones of a row index i == j - k: the product of two
     * one-dim ramps compared */
    kiln_device *dev = kiln_tensor_device(x);
    kiln_tensor *i = kiln_reshape(kiln_arange(dev, KILN_I64, 0, (double)rows, 1), 2, (const int64_t[]){rows, 1});
    kiln_tensor *j = kiln_reshape(kiln_arange(dev, KILN_I64, (double)-k, (double)(cols - k), 1), 2,
                                  (const int64_t[]){1, cols});
    out[0] = kiln_cast(kiln_eq(i, j), dt);
    return kiln__onnx_ok(out);
}

/* Compress: the slices along axis (or the elements of x flattened, without one) whose
 * condition entry is true; the condition may be shorter than the dim, not longer. */
static int op_compress(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out)
{
    KILN__ONNX_NEED(2);
    kiln_tensor *x = in[0], *cond = in[1];
    int a = 0;
    if (kiln__onnx_attr_get(n, "axis")) {
        if (kiln__onnx_axis(n, kiln__onnx_attr_int(n, "axis", 0), kiln_tensor_ndim(x), &a))
            return -1;
    } else {
        int64_t all = kiln_tensor_numel(x);
        x = kiln_reshape(x, 1, &all);
    }
    if (kiln_tensor_ndim(cond) != 1 || kiln_tensor_dtype(cond) != KILN_BOOL)
        return kiln__onnx_fail(n, "condition must be a 1-D bool tensor");
    int64_t len = kiln_tensor_dim(cond, 0), dim = kiln_tensor_dim(x, a);
    if (len > dim)
        return kiln__onnx_fail(n, "condition has %lld entries for a dim of %lld", (long long)len, (long long)dim);
    unsigned char *c = malloc((size_t)(len ? len : 1));
    int64_t *idx = malloc((size_t)(len ? len : 1) * sizeof *idx), kept = 0;
    if (!c || !idx || kiln_to_data(cond, c, (size_t)len)) {
        free(c);
        free(idx);
        return kiln__onnx_fail(n, "could not read the condition");
    }
    for (int64_t i = 0; i < len; i++)
        if (c[i])
            idx[kept++] = i;
    kiln_tensor *it = kiln_from_data(kiln_tensor_device(x), KILN_I64, 1, &kept, idx, (size_t)kept * sizeof *idx);
    free(c);
    free(idx);
    out[0] = kiln_index_select(x, a, it);
    return kiln__onnx_ok(out);
}

/* ReverseSequence: along time_axis, the first sequence_lens[b] steps of batch entry b in
 * reverse order, the rest as they are; a gather along the time axis whose index varies with
 * the time and batch positions only. */
static int op_reverse_sequence(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout,
                               kiln_tensor **out)
{
    KILN__ONNX_NEED(2);
    kiln_tensor *x = in[0];
    int r = kiln_tensor_ndim(x), ta, ba;
    if (r < 2)
        return kiln__onnx_fail(n, "x must have at least 2 dims, not %d", r);
    if (kiln__onnx_axis(n, kiln__onnx_attr_int(n, "time_axis", 0), r, &ta) ||
        kiln__onnx_axis(n, kiln__onnx_attr_int(n, "batch_axis", 1), r, &ba))
        return -1;
    if (ta == ba || ta > 1 || ba > 1)
        return kiln__onnx_fail(n, "time_axis and batch_axis must be 0 and 1, in either order");
    int64_t steps = kiln_tensor_dim(x, ta), batch = kiln_tensor_dim(x, ba);
    int64_t *lens = malloc((size_t)(batch ? batch : 1) * sizeof *lens);
    int64_t cells = steps * batch, *idx = malloc((size_t)(cells > 0 ? cells : 1) * sizeof *idx);
    int c = lens && idx ? kiln__onnx_read_ints(n, in[1], lens, (int)(batch < 1 << 20 ? batch : 1 << 20)) : -1;
    int rc = 0;
    if (c != batch) {
        rc = c < 0 ? -1
                   : kiln__onnx_fail(n, "sequence_lens has %d entries for a batch of %lld", c, (long long)batch);
        goto done;
    }
    for (int64_t b = 0; b < batch; b++) {
        if (lens[b] < 0 || lens[b] > steps) {
            rc = kiln__onnx_fail(n, "sequence_lens[%lld] is %lld, outside [0, %lld]", (long long)b,
                                 (long long)lens[b], (long long)steps);
            goto done;
        }
        for (int64_t t = 0; t < steps; t++) /* laid out as the two leading dims of x */
            idx[ta == 0 ? t * batch + b : b * steps + t] = t < lens[b] ? lens[b] - 1 - t : t;
    }
    int64_t ishape[KILN_MAX_DIMS];
    for (int d = 0; d < r; d++)
        ishape[d] = d < 2 ? kiln_tensor_dim(x, d) : 1;
    kiln_tensor *it = kiln_from_data(kiln_tensor_device(x), KILN_I64, r, ishape, idx,
                                     (size_t)(steps * batch) * sizeof *idx);
    out[0] = kiln_gather(x, ta, kiln_expand(it, r, kiln_tensor_shape(x)));
    rc = kiln__onnx_ok(out);
done:
    free(lens);
    free(idx);
    return rc;
}

/* ------------------------------------------------------------------ NonMaxSuppression */

typedef struct nms_box {
    float y1, x1, y2, x2;
} nms_box;

typedef struct nms_candidate {
    float score;
    int64_t index;
} nms_candidate;

/* Higher scores first; equal scores in box order (ONNX Runtime's order). */
static int nms_order(const void *pa, const void *pb)
{
    const nms_candidate *a = pa, *b = pb;
    if (a->score != b->score)
        return a->score > b->score ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

/* Whether b overlaps a kept box a by more than threshold in IoU (a box of no area never
 * suppresses, nor is suppressed). */
static bool nms_suppresses(const nms_box *a, const nms_box *b, float threshold)
{
    float ay1 = fminf(a->y1, a->y2), ay2 = fmaxf(a->y1, a->y2), ax1 = fminf(a->x1, a->x2),
          ax2 = fmaxf(a->x1, a->x2);
    float by1 = fminf(b->y1, b->y2), by2 = fmaxf(b->y1, b->y2), bx1 = fminf(b->x1, b->x2),
          bx2 = fmaxf(b->x1, b->x2);
    float area_a = (ay2 - ay1) * (ax2 - ax1), area_b = (by2 - by1) * (bx2 - bx1);
    if (area_a <= 0 || area_b <= 0)
        return false;
    float ih = fminf(ay2, by2) - fmaxf(ay1, by1), iw = fminf(ax2, bx2) - fmaxf(ax1, bx1);
    if (ih <= 0 || iw <= 0)
        return false;
    float inter = ih * iw;
    return inter / (area_a + area_b - inter) > threshold;
}

/* NonMaxSuppression: per batch entry and class, the boxes scoring above score_threshold
 * in descending score, each kept unless a kept box overlaps it by more than iou_threshold,
 * at most max_output_boxes_per_class of them; [kept, 3] rows of (batch, class, box). */
static int op_non_max_suppression(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout,
                                  kiln_tensor **out)
{
    KILN__ONNX_NEED(2);
    kiln_tensor *boxes = in[0], *scores = in[1];
    if (kiln_tensor_ndim(boxes) != 3 || kiln_tensor_dim(boxes, 2) != 4 || kiln_tensor_ndim(scores) != 3 ||
        kiln_tensor_dim(scores, 0) != kiln_tensor_dim(boxes, 0) ||
        kiln_tensor_dim(scores, 2) != kiln_tensor_dim(boxes, 1))
        return kiln__onnx_fail(n, "boxes must be [batch, boxes, 4] and scores [batch, classes, boxes]");
    int64_t nb = kiln_tensor_dim(boxes, 0), nbox = kiln_tensor_dim(boxes, 1), ncls = kiln_tensor_dim(scores, 1);
    double max_out = 0, iou = 0, score_min = -INFINITY;
    if ((nin > 2 && in[2] && kiln__onnx_read_scalar(n, in[2], &max_out)) ||
        (nin > 3 && in[3] && kiln__onnx_read_scalar(n, in[3], &iou)) ||
        (nin > 4 && in[4] && kiln__onnx_read_scalar(n, in[4], &score_min)))
        return -1;
    if (!(iou >= 0 && iou <= 1))
        return kiln__onnx_fail(n, "iou_threshold %g is outside [0, 1]", iou);
    bool centers = kiln__onnx_attr_int(n, "center_point_box", 0) != 0;
    int64_t per_class = max_out < 0 ? 0 : max_out > (double)nbox ? nbox : (int64_t)max_out;
    size_t nboxes = (size_t)(nb * nbox), nscores = (size_t)(nb * ncls * nbox);
    float *bv = malloc((nboxes ? nboxes : 1) * 4 * sizeof *bv), *sv = malloc((nscores ? nscores : 1) * sizeof *sv);
    nms_box *box = malloc((nboxes ? nboxes : 1) * sizeof *box);
    nms_candidate *cand = malloc((size_t)(nbox ? nbox : 1) * sizeof *cand);
    int64_t *kept = malloc((size_t)(nbox ? nbox : 1) * sizeof *kept);
    size_t cap = 64, count = 0;
    int64_t *rows = malloc(cap * 3 * sizeof *rows);
    int rc = -1;
    if (!bv || !sv || !box || !cand || !kept || !rows) {
        kiln__onnx_fail(n, "out of memory");
        goto done;
    }
    if (kiln_to_data(kiln_cast(boxes, KILN_F32), bv, nboxes * 4 * sizeof *bv) ||
        kiln_to_data(kiln_cast(scores, KILN_F32), sv, nscores * sizeof *sv))
        goto done;
    for (size_t i = 0; i < nboxes; i++) {
        const float *v = bv + 4 * i;
        box[i] = centers ? (nms_box){v[1] - v[3] / 2, v[0] - v[2] / 2, v[1] + v[3] / 2, v[0] + v[2] / 2}
                         : (nms_box){v[0], v[1], v[2], v[3]};
    }
    for (int64_t b = 0; b < nb; b++)
        for (int64_t c = 0; c < ncls && per_class > 0; c++) {
            const float *s = sv + (size_t)((b * ncls + c) * nbox);
            int64_t nc = 0, nk = 0;
            for (int64_t i = 0; i < nbox; i++)
                if (s[i] > score_min)
                    cand[nc++] = (nms_candidate){s[i], i};
            qsort(cand, (size_t)nc, sizeof *cand, nms_order);
            for (int64_t i = 0; i < nc && nk < per_class; i++) {
                const nms_box *bx = &box[b * nbox + cand[i].index];
                bool keep = true;
                for (int64_t k = 0; keep && k < nk; k++)
                    keep = !nms_suppresses(&box[b * nbox + kept[k]], bx, (float)iou);
                if (!keep)
                    continue;
                kept[nk++] = cand[i].index;
                if (count == cap) {
                    int64_t *grown = realloc(rows, cap * 2 * 3 * sizeof *rows);
                    if (!grown) {
                        kiln__onnx_fail(n, "out of memory");
                        goto done;
                    }
                    rows = grown;
                    cap *= 2;
                }
                rows[3 * count] = b, rows[3 * count + 1] = c, rows[3 * count + 2] = cand[i].index;
                count++;
            }
        }
    out[0] = kiln_from_data(kiln_tensor_device(boxes), KILN_I64, 2, (const int64_t[]){(int64_t)count, 3}, rows,
                            count * 3 * sizeof *rows);
    rc = kiln__onnx_ok(out);
done:
    free(bv);
    free(sv);
    free(box);
    free(cand);
    free(kept);
    free(rows);
    return rc;
}

/* CenterCropPad (opset 18): each dim in axes (default all) cropped to, or zero-padded to,
 * the given size about its centre, the odd element going to the end. */
static int op_center_crop_pad(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout,
                              kiln_tensor **out)
{
    KILN__ONNX_NEED(2);
    kiln_tensor *x = in[0];
    int r = kiln_tensor_ndim(x), axes[KILN_MAX_DIMS];
    int64_t ax[KILN_MAX_DIMS], size[KILN_MAX_DIMS];
    int na = kiln__onnx_attr_ints(n, "axes", ax, KILN_MAX_DIMS);
    if (na < 0)
        for (na = 0; na < r; na++)
            ax[na] = na;
    for (int i = 0; i < na; i++)
        if (kiln__onnx_axis(n, ax[i], r, &axes[i]))
            return -1;
    int c = kiln__onnx_read_ints(n, in[1], size, KILN_MAX_DIMS);
    if (c < 0)
        return -1;
    if (c != na)
        return kiln__onnx_fail(n, "shape has %d entries for %d axes", c, na);
    kiln_tensor *y = x;
    for (int i = 0; y && i < na; i++) {
        int d = axes[i];
        int64_t dim = kiln_tensor_dim(y, d), want = size[i];
        if (want < 0)
            return kiln__onnx_fail(n, "shape[%d] is negative (%lld)", i, (long long)want);
        if (want < dim) {
            y = kiln_narrow(y, d, (dim - want) / 2, want);
        } else if (want > dim) {
            int64_t pads[2 * KILN_MAX_DIMS] = {0};
            pads[2 * (r - 1 - d)] = (want - dim) / 2;
            pads[2 * (r - 1 - d) + 1] = want - dim - (want - dim) / 2;
            y = kiln_pad(y, 2 * (r - d), pads, KILN_PAD_CONSTANT, 0);
        }
    }
    out[0] = y ? kiln_contiguous(y) : NULL;
    return kiln__onnx_ok(out);
}

/* ------------------------------------------------------------------ Unique */

typedef struct unique_ctx {
    const double *v; /* the slices, each len values */
    int64_t len;
} unique_ctx;

/* Total order on slices: values ascending, NaN after every number and equal to NaN (so
 * NaNs group together instead of each being its own value). */
static int slice_cmp(const unique_ctx *u, int64_t a, int64_t b)
{
    for (int64_t k = 0; k < u->len; k++) {
        double x = u->v[a * u->len + k], y = u->v[b * u->len + k];
        bool xn = isnan(x), yn = isnan(y);
        if (xn || yn) {
            if (xn != yn)
                return xn ? 1 : -1;
            continue;
        }
        if (x != y)
            return x < y ? -1 : 1;
    }
    return 0;
}

/* Sorts idx[0, m) by slice, ties by index (a merge sort: qsort has no context argument). */
static void unique_sort(const unique_ctx *u, int64_t *idx, int64_t *tmp, int64_t m)
{
    if (m < 2)
        return;
    int64_t h = m / 2;
    unique_sort(u, idx, tmp, h);
    unique_sort(u, idx + h, tmp, m - h);
    int64_t i = 0, j = h, k = 0;
    while (i < h && j < m)
        tmp[k++] = slice_cmp(u, idx[j], idx[i]) < 0 ? idx[j++] : idx[i++];
    while (i < h)
        tmp[k++] = idx[i++];
    while (j < m)
        tmp[k++] = idx[j++];
    memcpy(idx, tmp, (size_t)m * sizeof *idx);
}

/* Unique: the distinct elements (or slices along axis) of x, sorted ascending or in the order
 * of their first occurrence, with the first occurrence of each, each element's position in
 * the result, and the counts. Found on the host; the values are then picked from x on its
 * device, so they keep their exact bits and dtype. */
static int op_unique(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out)
{
    KILN__ONNX_NEED(1);
    kiln_tensor *x = in[0];
    int r = kiln_tensor_ndim(x), a = 0;
    bool has_axis = kiln__onnx_attr_get(n, "axis") != NULL, sorted = kiln__onnx_attr_int(n, "sorted", 1) != 0;
    if (has_axis && kiln__onnx_axis(n, kiln__onnx_attr_int(n, "axis", 0), r, &a))
        return -1;
    kiln_tensor *xs = x;
    if (!has_axis) {
        int64_t all = kiln_tensor_numel(x);
        xs = kiln_reshape(x, 1, &all);
    } else if (a != 0) {
        int order[KILN_MAX_DIMS];
        for (int i = 0, k = 1; i < r; i++)
            order[i == a ? 0 : k++] = i;
        xs = kiln_contiguous(kiln_permute(x, r, order));
    }
    if (!xs)
        return -1;
    int64_t m = kiln_tensor_dim(xs, 0), total = kiln_tensor_numel(xs), len = m ? total / m : 0;
    double *v = malloc((size_t)(total ? total : 1) * sizeof *v);
    int64_t *sorted_idx = malloc((size_t)(m ? m : 1) * 6 * sizeof(int64_t));
    int rc = -1;
    if (!v || !sorted_idx) {
        kiln__onnx_fail(n, "out of memory");
        goto done;
    }
    int64_t *tmp = sorted_idx + m, *group = tmp + m, *first = group + m, *counts = first + m, *pos = counts + m;
    if (kiln_to_data(kiln_cast(xs, KILN_F64), v, (size_t)total * sizeof *v))
        goto done;
    unique_ctx u = {v, len};
    for (int64_t i = 0; i < m; i++)
        sorted_idx[i] = i;
    unique_sort(&u, sorted_idx, tmp, m);
    /* groups in sorted order; a group's first member is its first occurrence (ties kept
     * in index order) */
    int64_t ng = 0;
    for (int64_t i = 0; i < m; i++) {
        if (i == 0 || slice_cmp(&u, sorted_idx[i - 1], sorted_idx[i]) != 0) {
            first[ng] = sorted_idx[i];
            counts[ng++] = 0;
        }
        group[sorted_idx[i]] = ng - 1;
        counts[ng - 1]++;
    }
    /* pos[g]: the group's place in the output (sorted order, or by first occurrence) */
    for (int64_t g = 0; g < ng; g++)
        pos[g] = g;
    if (!sorted) { /* order the groups by their first occurrence: walk x and number them */
        int64_t next = 0;
        for (int64_t g = 0; g < ng; g++)
            pos[g] = -1;
        for (int64_t i = 0; i < m; i++)
            if (pos[group[i]] < 0)
                pos[group[i]] = next++;
    }
    int64_t *of = tmp /* the sort's scratch, free again */, *cnt = malloc((size_t)(ng ? ng : 1) * sizeof *cnt),
            *inv = malloc((size_t)(m ? m : 1) * sizeof *inv);
    if (!cnt || !inv) {
        free(cnt);
        free(inv);
        kiln__onnx_fail(n, "out of memory");
        goto done;
    }
    for (int64_t g = 0; g < ng; g++) {
        of[pos[g]] = first[g];
        cnt[pos[g]] = counts[g];
    }
    for (int64_t i = 0; i < m; i++)
        inv[i] = pos[group[i]];
    kiln_device *dev = kiln_tensor_device(x);
    kiln_tensor *firsts = kiln_from_data(dev, KILN_I64, 1, &ng, of, (size_t)ng * sizeof *of);
    out[0] = has_axis ? kiln_index_select(x, a, firsts) : kiln_index_select(xs, 0, firsts);
    if (nout > 1)
        out[1] = firsts;
    if (nout > 2)
        out[2] = kiln_from_data(dev, KILN_I64, 1, &m, inv, (size_t)m * sizeof *inv);
    if (nout > 3)
        out[3] = kiln_from_data(dev, KILN_I64, 1, &ng, cnt, (size_t)ng * sizeof *cnt);
    free(cnt);
    free(inv);
    rc = 0;
    for (int i = 0; i < nout && i < 4; i++)
        if (!out[i])
            rc = -1;
done:
    free(v);
    free(sorted_idx);
    return rc;
}

const kiln__onnx_op kiln__onnx_ops_select[] = {
    {"Hardmax", op_hardmax},
    {"Shrink", op_shrink},
    {"EyeLike", op_eye_like},
    {"Compress", op_compress},
    {"ReverseSequence", op_reverse_sequence},
    {"NonMaxSuppression", op_non_max_suppression},
    {"CenterCropPad", op_center_crop_pad},
    {"Unique", op_unique},
    {NULL, NULL},
};
