/*
 * onnx_gridsample.c — GridSample where ONNX Runtime is no reference: non-finite grid
 * values, and gradients.
 *
 *     onnx_gridsample [DEVICE...]      (cpu and ref when none is named)
 *
 * ONNX Runtime and PyTorch disagree on a NaN or infinite grid value (ONNX Runtime samples
 * some fixed pixel, PyTorch gives NaN or 0 by mode), so kiln's rule is checked here against
 * numbers worked out from the spec's formulas: NaN gives NaN; an infinity acts as a limit
 * (0 with zeros padding, the edge with border, NaN under reflection, where it has no
 * reflection); a huge finite value lands on a point of the input under reflection. Then
 * gradients: y is linear in X, so dL/dX (L = sum(y * r)) must equal L's change when one
 * pixel grows by 1; dL/dgrid must match a central difference where the grid sits away from
 * pixel boundaries. Last, AffineGrid over a dim of one pixel with align_corners, where
 * ONNX Runtime puts the pixel at +1 and the spec's reference and PyTorch at -1 (kiln: -1).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "onnx-build.h"
#include "onnx-check.h"

/* X is [1, 1, 3, 4] holding 1..12; the grid a row of P points, all with y = 0 (pixel row
 * 1, holding 5 6 7 8, exactly: its cubic weights there are 0 1 0 0). */
enum {
    H = 3,
    W = 4,
    P = 5
};

static kiln_onnx_model *gridsample_model(kiln_device *dev, const char *mode, const char *padding, int gh, int gw)
{
    static pb g, model;
    pb attrs = {.n = 0};
    g.n = 0;
    ob_input(&g, "x", OB_FLOAT, 4, (const int64_t[]){1, 1, H, W}, NULL);
    ob_input(&g, "grid", OB_FLOAT, 4, (const int64_t[]){1, gh, gw, 2}, NULL);
    ob_attr_str(&attrs, "mode", mode);
    ob_attr_str(&attrs, "padding_mode", padding);
    ob_node(&g, "GridSample", "gs", (const char *[]){"x", "grid", NULL}, (const char *[]){"y", NULL}, &attrs);
    ob_output(&g, "y");
    ob_model(&model, &g, 16);
    kiln_onnx_model *m = kiln_onnx_load_memory(model.b, model.n, dev, NULL);
    CHECK(m, "%s/%s: load: %s", mode, padding, kiln_error());
    return m;
}

/* y for x = 1..12 and the grid's x coordinates gx (y coordinates 0); 0 on success. */
static int sample(kiln_onnx_model *m, kiln_device *dev, const float *gx, int npoints, float *y)
{
    float xv[H * W], gv[2 * 16];
    for (int i = 0; i < H * W; i++)
        xv[i] = (float)(i + 1);
    for (int i = 0; i < npoints; i++) {
        gv[2 * i] = gx[i];
        gv[2 * i + 1] = 0;
    }
    kiln_tensor *in[2] = {kiln_from_data(dev, KILN_F32, 4, (const int64_t[]){1, 1, H, W}, xv, sizeof xv),
                          kiln_from_data(dev, KILN_F32, 4, (const int64_t[]){1, 1, npoints, 2}, gv,
                                         (size_t)npoints * 2 * sizeof(float))},
                *out = NULL;
    int rc = kiln_onnx_run(m, 2, (const char *[]){"x", "grid"}, in, 1, &out);
    if (rc == 0)
        rc = kiln_to_data(out, y, (size_t)npoints * sizeof *y);
    kiln_tensor_release(out);
    kiln_tensor_release(in[0]);
    kiln_tensor_release(in[1]);
    return rc;
}

static bool same(float got, float want)
{
    return isnan(want) ? isnan(got) : fabsf(got - want) <= 1e-5f * fmaxf(1.0f, fabsf(want));
}

static void test_nonfinite(kiln_device *dev)
{
    /* x coordinates: NaN, +inf, -inf, 1e30 and 0.5 (pixel coordinate 2.5 without
     * align_corners: halfway between 7 and 8) */
    const float gx[P] = {NAN, INFINITY, -INFINITY, 1e30f, 0.5f};
    const char *modes[] = {"bilinear", "nearest", "bicubic"}, *pads[] = {"zeros", "border", "reflection"};
    /* 0.5: bilinear (7 + 8) / 2; nearest rounds 2.5 half to even, to 2: 7; bicubic with
     * a = -0.75 at t = 0.5 weighs taps 1..4 by -0.09375, 0.59375, 0.59375, -0.09375, and
     * tap 4 is 0 (zeros) or 8 (border; reflection maps 4 to 3) */
    const float half[3][3] = {{7.5f, 7.5f, 7.5f}, {7, 7, 7}, {8.34375f, 7.59375f, 7.59375f}};
    for (int mi = 0; mi < 3; mi++)
        for (int pi = 0; pi < 3; pi++) {
            kiln_onnx_model *m = gridsample_model(dev, modes[mi], pads[pi], 1, P);
            float y[P];
            if (!m || sample(m, dev, gx, P, y)) {
                CHECK(0, "%s/%s: run: %s", modes[mi], pads[pi], kiln_error());
                kiln_onnx_free(m);
                continue;
            }
            bool zeros = pi == 0, border = pi == 1;
            const float want[4] = {NAN,
                                   zeros    ? 0
                                   : border ? 8
                                            : NAN,
                                   zeros    ? 0
                                   : border ? 5
                                            : NAN,
                                   zeros    ? 0
                                   : border ? 8
                                            : NAN};
            for (int i = 0; i < 4; i++) {
                if (i == 3 && pi == 2) /* reflected from 1e30: a point within the row, whose cubic
                                        * lobes may overshoot the row's values by a little */
                    CHECK(mi == 2 ? isfinite(y[i]) && fabsf(y[i] - 6.5f) < 2.5f : y[i] >= 5 && y[i] <= 8,
                          "%s/%s: 1e30 reflected gave %g, not a point of the row", modes[mi], pads[pi],
                          (double)y[i]);
                else
                    CHECK(same(y[i], want[i]), "%s/%s: grid x %g gave %g, want %g", modes[mi], pads[pi],
                          (double)gx[i], (double)y[i], (double)want[i]);
            }
            CHECK(same(y[4], half[mi][pi]), "%s/%s: grid x 0.5 gave %g, want %g", modes[mi], pads[pi],
                  (double)y[4], (double)half[mi][pi]);
            kiln_onnx_free(m);
        }
}

/* L = sum(y * r) for X and grid given, with gradients into dx, dgrid when asked. */
static double loss(kiln_onnx_model *m, kiln_device *dev, const float *xv, const float *gv, const float *r, int np,
                   float *dx, float *dgrid)
{
    kiln_tensor *x = kiln_from_data(dev, KILN_F32, 4, (const int64_t[]){1, 1, H, W}, xv, H * W * sizeof(float));
    kiln_tensor *g = kiln_from_data(dev, KILN_F32, 4, (const int64_t[]){1, 2, np / 2, 2}, gv, (size_t)np * 2 * 4);
    if (dx) {
        kiln_requires_grad(x, true);
        kiln_requires_grad(g, true);
    }
    kiln_tensor *in[2] = {x, g}, *y = NULL;
    double l = NAN;
    if (kiln_onnx_run(m, 2, (const char *[]){"x", "grid"}, in, 1, &y) == 0) {
        kiln_tensor *rt = kiln_from_data(dev, KILN_F32, 4, (const int64_t[]){1, 1, 2, np / 2}, r, (size_t)np * 4);
        kiln_scope_begin(); /* the loss's intermediates end with it */
        kiln_tensor *ld = kiln_cast(kiln_sum(kiln_mul(y, rt), 0, NULL, false), KILN_F64);
        if (dx && kiln_backward(ld, NULL) == 0) {
            CHECK(kiln_to_data(kiln_grad(x), dx, H * W * sizeof(float)) == 0, "grad x: %s", kiln_error());
            CHECK(kiln_to_data(kiln_grad(g), dgrid, (size_t)np * 2 * 4) == 0, "grad grid: %s", kiln_error());
        } else if (dx) {
            CHECK(0, "backward: %s", kiln_error());
        }
        if (ld)
            kiln_to_data(ld, &l, sizeof l);
        kiln_scope_end();
        kiln_tensor_release(rt);
    }
    kiln_tensor_release(y);
    kiln_tensor_release(x);
    kiln_tensor_release(g);
    return l;
}

static void test_gradients(kiln_device *dev)
{
    enum {
        NP = 6
    };
    /* coordinates well inside pixels' spans (none within 0.02 of a whole pixel coordinate
     * after denormalizing), so the loss is smooth around each */
    const float gv[NP * 2] = {-0.83f, -0.41f, -0.2f, 0.37f,  0.11f, -0.9f,
                              0.62f,  0.44f,  0.93f, -0.06f, 0.31f, 0.79f};
    const float r[NP] = {1.0f, -0.5f, 2.0f, 0.25f, -1.5f, 0.75f};
    const char *modes[] = {"bilinear", "bicubic"}, *pads[] = {"zeros", "border", "reflection"};
    float xv[H * W];
    for (int i = 0; i < H * W; i++)
        xv[i] = sinf((float)i) * 2.0f;
    for (int mi = 0; mi < 2; mi++)
        for (int pi = 0; pi < 3; pi++) {
            kiln_onnx_model *m = gridsample_model(dev, modes[mi], pads[pi], 2, NP / 2);
            if (!m)
                continue;
            float dx[H * W], dg[NP * 2];
            double l0 = loss(m, dev, xv, gv, r, NP, dx, dg);
            CHECK(isfinite(l0), "%s/%s: loss %g: %s", modes[mi], pads[pi], l0, kiln_error());
            /* X: exact steps of 1, the loss being linear in X */
            double worst = 0;
            for (int p = 0; p < H * W; p++) {
                float xs[H * W];
                memcpy(xs, xv, sizeof xs);
                xs[p] += 1;
                double d = loss(m, dev, xs, gv, r, NP, NULL, NULL) - l0;
                worst = fmax(worst, fabs(d - dx[p]));
            }
            CHECK(worst < 1e-4, "%s/%s: dL/dX off by %g from L's change", modes[mi], pads[pi], worst);
            /* grid: central differences */
            worst = 0;
            const float h = 1e-3f;
            for (int k = 0; k < NP * 2; k++) {
                float gp[NP * 2], gm[NP * 2];
                memcpy(gp, gv, sizeof gp);
                memcpy(gm, gv, sizeof gm);
                gp[k] += h;
                gm[k] -= h;
                double d = (loss(m, dev, xv, gp, r, NP, NULL, NULL) - loss(m, dev, xv, gm, r, NP, NULL, NULL)) /
                           ((double)gp[k] - (double)gm[k]);
                worst = fmax(worst, fabs(d - dg[k]) / fmax(1.0, fabs(d)));
            }
            CHECK(worst < 2e-2, "%s/%s: dL/dgrid off by %g (relative) from central differences", modes[mi],
                  pads[pi], worst);
            kiln_onnx_free(m);
        }
}

/* AffineGrid over [1, 1, 2, 1] (H 2, W 1): base x is -1 with align_corners (the spec's
 * arange and PyTorch's linspace for one point) and 0 without; base y is -1, 1 with it and
 * -0.5, 0.5 without. */
static void test_affine_one_pixel(kiln_device *dev)
{
    const float th[6] = {1.5f, 0.25f, 0.125f, -0.5f, 2.0f, 0.75f};
    for (int align = 0; align < 2; align++) {
        static pb g, model;
        pb attrs = {.n = 0};
        g.n = 0;
        const int64_t size[4] = {1, 1, 2, 1}, four = 4;
        ob_input(&g, "theta", OB_FLOAT, 3, (const int64_t[]){1, 2, 3}, NULL);
        ob_init(&g, "size", OB_INT64, 1, &four, size, sizeof size);
        ob_attr_int(&attrs, "align_corners", align);
        ob_node(&g, "AffineGrid", "ag", (const char *[]){"theta", "size", NULL}, (const char *[]){"grid", NULL},
                &attrs);
        ob_output(&g, "grid");
        ob_model(&model, &g, 20);
        kiln_onnx_model *m = kiln_onnx_load_memory(model.b, model.n, dev, NULL);
        kiln_tensor *t = kiln_from_data(dev, KILN_F32, 3, (const int64_t[]){1, 2, 3}, th, sizeof th), *out = NULL;
        float got[4] = {0};
        int rc = m && t ? kiln_onnx_run(m, 1, (const char *[]){"theta"}, &t, 1, &out) : -1;
        CHECK(rc == 0 && kiln_tensor_numel(out) == 4 && kiln_to_data(out, got, sizeof got) == 0,
              "AffineGrid align_corners=%d: %s", align, kiln_error());
        float bx = align ? -1.0f : 0.0f, by[2] = {align ? -1.0f : -0.5f, align ? 1.0f : 0.5f};
        for (int i = 0; i < 2; i++) {
            float wx = th[0] * bx + th[1] * by[i] + th[2], wy = th[3] * bx + th[4] * by[i] + th[5];
            CHECK(same(got[2 * i], wx) && same(got[2 * i + 1], wy),
                  "AffineGrid align_corners=%d, row %d: (%g, %g), want (%g, %g)", align, i, (double)got[2 * i],
                  (double)got[2 * i + 1], (double)wx, (double)wy);
        }
        kiln_tensor_release(out);
        kiln_tensor_release(t);
        kiln_onnx_free(m);
    }
}

int main(int argc, char **argv)
{
    const char *defaults[] = {"cpu", "ref"};
    int nd = argc > 1 ? argc - 1 : 2;
    for (int k = 0; k < nd; k++) {
        const char *spec = argc > 1 ? argv[k + 1] : defaults[k];
        kiln_device *dev = kiln_device_open(spec);
        if (!dev) { /* no such device here: skipped, as the other ONNX tests do */
            fprintf(stderr, "%s: %s\n", spec, kiln_error());
            return 77;
        }
        int before = failures;
        test_nonfinite(dev);
        test_gradients(dev);
        test_affine_one_pixel(dev);
        printf("%s: %d failures\n", spec, failures - before);
        kiln_device_close(dev);
    }
    return failures ? 1 : 0;
}
