/*
 * onnx-ops-roi.c — RoiAlign (opsets 10 and 16), the region pooling of two-stage detectors
 * (Faster and Mask R-CNN heads): each region of interest is cut into output_height x
 * output_width bins, each bin sampled on a grid of points, each point read bilinearly, and
 * the points averaged (or their largest weighted tap kept, ONNX Runtime's "max").
 *
 * Where every point falls depends on the regions only, never on X, so the host lays out the
 * taps (their rows and weights, ONNX Runtime's arithmetic in float) and the device does the
 * reading: X becomes a table of rows, one per (image, pixel), channels in a row, plus a zero
 * row for points outside the map, and each sample slot (point iy, ix of every bin at once) is
 * four row gathers, weighted and summed. A region whose adaptive grid is smaller than the
 * largest one weighs its missing slots 0 (and, for max, adds -inf to them).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error-impl.h"
#include "onnx-impl.h"

/* One region's geometry in the feature map. */
typedef struct roi_geom {
    int64_t batch;
    float start_h, start_w, bin_h, bin_w;
    int64_t grid_h, grid_w;
} roi_geom;

/* The four taps of the point (y, x) of a map of height x width, as ONNX Runtime weighs them:
 * a point beyond one pixel outside the map reads nothing; otherwise it is clamped to the map
 * and read bilinearly. rows: offsets within the image's rows, or -1 with weight 0. */
static void roi_taps(float y, float x, int64_t height, int64_t width, int64_t rows[4], float w[4])
{
    if (y < -1.0f || y > (float)height || x < -1.0f || x > (float)width) {
        for (int k = 0; k < 4; k++)
            rows[k] = -1, w[k] = 0;
        return;
    }
    if (y <= 0)
        y = 0;
    if (x <= 0)
        x = 0;
    int64_t y_low = (int64_t)y, x_low = (int64_t)x, y_high, x_high;
    if (y_low >= height - 1) {
        y_high = y_low = height - 1;
        y = (float)y_low;
    } else {
        y_high = y_low + 1;
    }
    if (x_low >= width - 1) {
        x_high = x_low = width - 1;
        x = (float)x_low;
    } else {
        x_high = x_low + 1;
    }
    float ly = y - (float)y_low, lx = x - (float)x_low, hy = 1.0f - ly, hx = 1.0f - lx;
    w[0] = hy * hx, w[1] = hy * lx, w[2] = ly * hx, w[3] = ly * lx;
    rows[0] = y_low * width + x_low, rows[1] = y_low * width + x_high;
    rows[2] = y_high * width + x_low, rows[3] = y_high * width + x_high;
}

static int op_roi_align(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out)
{
    KILN__ONNX_NEED(3);
    kiln_tensor *x = in[0], *rois = in[1], *bidx = in[2];
    if (kiln_tensor_ndim(x) != 4 || !kiln_dtype_is_float(kiln_tensor_dtype(x)))
        return kiln__onnx_fail(n, "X must be a float (N, C, H, W) map");
    if (kiln_tensor_ndim(rois) != 2 || kiln_tensor_dim(rois, 1) != 4 || kiln_tensor_ndim(bidx) != 1 ||
        kiln_tensor_dim(bidx, 0) != kiln_tensor_dim(rois, 0))
        return kiln__onnx_fail(n, "rois must be (num_rois, 4) and batch_indices (num_rois)");
    const char *mode = kiln__onnx_attr_str(n, "mode", "avg");
    bool max = !strcmp(mode, "max");
    if (!max && strcmp(mode, "avg"))
        return kiln__onnx_fail(n, "mode '%s' is not supported (avg, max)", mode);
    const char *ct = n->opset >= 16 ? kiln__onnx_attr_str(n, "coordinate_transformation_mode", "half_pixel")
                                    : "output_half_pixel";
    bool half = !strcmp(ct, "half_pixel");
    if (!half && strcmp(ct, "output_half_pixel"))
        return kiln__onnx_fail(n, "coordinate_transformation_mode '%s' is not supported", ct);
    int64_t ph = kiln__onnx_attr_int(n, "output_height", 1), pw = kiln__onnx_attr_int(n, "output_width", 1);
    int64_t ratio = kiln__onnx_attr_int(n, "sampling_ratio", 0);
    float scale = (float)kiln__onnx_attr_float(n, "spatial_scale", 1.0);
    if (ph < 1 || pw < 1 || ph > 4096 || pw > 4096 || ratio < 0 || ratio > 64)
        return kiln__onnx_fail(n, "output size %lldx%lld or sampling_ratio %lld out of range", (long long)ph,
                               (long long)pw, (long long)ratio);
    int64_t nimg = kiln_tensor_dim(x, 0), ch = kiln_tensor_dim(x, 1), height = kiln_tensor_dim(x, 2);
    int64_t width = kiln_tensor_dim(x, 3), nroi = kiln_tensor_dim(rois, 0), bins = nroi * ph * pw;
    float *rv = malloc((size_t)(nroi ? nroi : 1) * 4 * sizeof *rv);
    int64_t *bv = malloc((size_t)(nroi ? nroi : 1) * sizeof *bv);
    roi_geom *geo = malloc((size_t)(nroi ? nroi : 1) * sizeof *geo);
    int64_t *rows = malloc((size_t)(bins ? bins : 1) * 4 * sizeof *rows);
    float *wts = malloc((size_t)(bins ? bins : 1) * 5 * sizeof *wts), *count = wts + 4 * bins;
    int rc = -1;
    if (!rv || !bv || !geo || !rows || !wts) {
        kiln__onnx_fail(n, "out of memory");
        goto done;
    }
    if (kiln_to_data(kiln_cast(rois, KILN_F32), rv, (size_t)nroi * 4 * sizeof *rv) ||
        kiln_to_data(kiln_cast(bidx, KILN_I64), bv, (size_t)nroi * sizeof *bv))
        goto done;
    int64_t max_gh = 1, max_gw = 1;
    for (int64_t r = 0; r < nroi; r++) {
        if (bv[r] < 0 || bv[r] >= nimg) {
            kiln__onnx_fail(n, "batch_indices[%lld] is %lld, outside [0, %lld)", (long long)r, (long long)bv[r],
                            (long long)nimg);
            goto done;
        }
        const float *q = rv + 4 * r, offset = half ? 0.5f : 0.0f;
        roi_geom *g = &geo[r];
        g->batch = bv[r];
        g->start_w = q[0] * scale - offset, g->start_h = q[1] * scale - offset;
        float rw = q[2] * scale - offset - g->start_w, rh = q[3] * scale - offset - g->start_h;
        if (!half) {
            rw = rw > 1.0f ? rw : 1.0f;
            rh = rh > 1.0f ? rh : 1.0f;
        }
        if (!isfinite(rw) || !isfinite(rh)) {
            kiln__onnx_fail(n, "region %lld is not finite", (long long)r);
            goto done;
        }
        g->bin_h = rh / (float)ph, g->bin_w = rw / (float)pw;
        g->grid_h = ratio > 0 ? ratio : (int64_t)ceilf(rh / (float)ph);
        g->grid_w = ratio > 0 ? ratio : (int64_t)ceilf(rw / (float)pw);
        /* an adaptive grid over a region far larger than the map would take as many slots:
         * bounded, as a point grid finer than the pixels gains nothing */
        if (g->grid_h > 4 * height + 4 || g->grid_w > 4 * width + 4 || g->grid_h < 0 || g->grid_w < 0) {
            kiln__onnx_fail(n, "region %lld needs a %lldx%lld sampling grid per bin, more than the map has pixels",
                            (long long)r, (long long)g->grid_h, (long long)g->grid_w);
            goto done;
        }
        max_gh = g->grid_h > max_gh ? g->grid_h : max_gh;
        max_gw = g->grid_w > max_gw ? g->grid_w : max_gw;
        int64_t cnt = g->grid_h * g->grid_w;
        for (int64_t b = 0; b < ph * pw; b++)
            count[r * ph * pw + b] = (float)(cnt > 1 ? cnt : 1);
    }
    /* the table: X channels-last, rows (image, pixel), then the zero row */
    kiln_device *dev = kiln_tensor_device(x);
    int64_t zero_row = nimg * height * width;
    kiln_tensor *table = kiln__onnx_pixel_rows(x, false), *acc = NULL;
    for (int64_t iy = 0; table && iy < max_gh; iy++)
        for (int64_t ix = 0; ix < max_gw; ix++) {
            /* slot (iy, ix) of every bin: its taps, and (max) -inf where a region's grid has no such point */
            float *skip = max ? malloc((size_t)(bins ? bins : 1) * sizeof *skip) : NULL;
            if (max && !skip) {
                kiln__onnx_fail(n, "out of memory");
                goto done;
            }
            for (int64_t r = 0; r < nroi; r++) {
                const roi_geom *g = &geo[r];
                bool present = iy < g->grid_h && ix < g->grid_w;
                for (int64_t by = 0; by < ph; by++)
                    for (int64_t bx = 0; bx < pw; bx++) {
                        int64_t bin = (r * ph + by) * pw + bx, tr[4];
                        float tw[4];
                        float yy = g->start_h + (float)by * g->bin_h +
                                   ((float)iy + 0.5f) * g->bin_h / (float)(g->grid_h ? g->grid_h : 1);
                        float xx = g->start_w + (float)bx * g->bin_w +
                                   ((float)ix + 0.5f) * g->bin_w / (float)(g->grid_w ? g->grid_w : 1);
                        roi_taps(yy, xx, height, width, tr, tw);
                        for (int k = 0; k < 4; k++) {
                            bool use = present && tr[k] >= 0;
                            rows[k * bins + bin] = use ? g->batch * height * width + tr[k] : zero_row;
                            wts[k * bins + bin] = use ? tw[k] : 0;
                        }
                        if (skip)
                            skip[bin] = present ? 0.0f : -INFINITY;
                    }
            }
            kiln_tensor *val = NULL;
            for (int k = 0; k < 4; k++) {
                kiln_tensor *g = kiln_index_select(
                    table, 0,
                    kiln_from_data(dev, KILN_I64, 1, &bins, rows + k * bins, (size_t)bins * sizeof *rows));
                kiln_tensor *w = kiln_cast(kiln_from_data(dev, KILN_F32, 2, (const int64_t[]){bins, 1},
                                                          wts + k * bins, (size_t)bins * sizeof *wts),
                                           kiln_tensor_dtype(x));
                kiln_tensor *term = kiln_mul(w, g);
                val = !val ? term : max ? kiln_maximum(val, term) : kiln_add(val, term);
            }
            if (max) {
                val = kiln_add(val, kiln_cast(kiln_from_data(dev, KILN_F32, 2, (const int64_t[]){bins, 1}, skip,
                                                             (size_t)bins * sizeof *skip),
                                              kiln_tensor_dtype(x)));
                free(skip);
            }
            acc = !acc ? val : max ? kiln_maximum(acc, val) : kiln_add(acc, val);
        }
    if (acc && !max)
        acc = kiln_div(acc, kiln_cast(kiln_from_data(dev, KILN_F32, 2, (const int64_t[]){bins, 1}, count,
                                                     (size_t)bins * sizeof *count),
                                      kiln_tensor_dtype(x)));
    out[0] = acc ? kiln_contiguous(kiln_permute(kiln_reshape(acc, 4, (const int64_t[]){nroi, ph, pw, ch}), 4,
                                                (const int[]){0, 3, 1, 2}))
                 : NULL;
    rc = out[0] ? 0 : -1;
done:
    free(rv);
    free(bv);
    free(geo);
    free(rows);
    free(wts);
    return rc;
}

const kiln__onnx_op kiln__onnx_ops_roi[] = {
    {"RoiAlign", op_roi_align},
    {NULL, NULL},
};
