/*
 * onnx_resize.c — Resize against the ONNX spec, one node per case, built here byte by byte:
 *
 *     onnx_resize [DEVICE...] [--dump DIR]     (cpu and ref when no device is named)
 *
 * kiln once mapped output to input coordinates by the size ratio, not by 1/scale as the spec
 * says, so a non-integer scale (PyTorch's interpolate with scale_factor 2.5, 1.4, 0.6 ...)
 * gave numbers off by up to 1.06 from ONNX Runtime. Each case resizes a [1, 2, 5, 7] input
 * by scales (or sizes) in every coordinate_transformation_mode and nearest_mode kiln
 * supports and compares with the reference below: the spec's formulas written out per output
 * element (linear as the product of per-dim weights over the 2^4 corners, cubic over the 4^4
 * taps, picked as the spec's reference implementation picks them), evaluated in float as
 * ONNX Runtime does. Unsupported modes must be refused naming the mode.
 *
 * --dump DIR also writes each case's model (NAME.onnx), the input (x.f32) and the reference
 * output (NAME.f32) there: tests/onnx/resize_ort_check.py runs ONNX Runtime on them and
 * compares, which is how this reference was checked against ONNX Runtime 1.32 (all cases
 * within 1e-6).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "onnx-build.h"
#include "onnx-check.h"

enum {
    N = 1,
    C = 2,
    H = 5,
    W = 7
};
static float xin[N * C * H * W];

typedef struct rcase {
    const char *mode, *ct, *nm; /* nm NULL: attribute absent */
    float scales[4];            /* used when sizes[0] == 0 */
    int64_t sizes[4];
    int opset;
    float cubic_a;       /* cubic_coeff_a; 0: attribute absent (-0.75) */
    int exclude_outside; /* written when 1 */
} rcase;

/* ----------------------------------------------------------------- reference */

/* The spec's x_original for output index o of a dim resized in -> out at scale s. */
static float ref_coord(const char *ct, int64_t o, float s, int64_t out, int64_t in)
{
    float x = (float)o, lo = (float)out, li = (float)in;
    if (!strcmp(ct, "half_pixel"))
        return (x + 0.5f) / s - 0.5f;
    if (!strcmp(ct, "pytorch_half_pixel"))
        return lo > 1 ? (x + 0.5f) / s - 0.5f : 0.0f;
    if (!strcmp(ct, "align_corners"))
        return lo == 1 ? 0.0f : x * (li - 1) / (lo - 1);
    if (!strcmp(ct, "asymmetric"))
        return x / s;
    if (!strcmp(ct, "tf_half_pixel_for_nn"))
        return (x + 0.5f) / s;
    /* half_pixel_symmetric */
    float adj = lo / (s * li), center = li / 2, offset = center * (1 - adj);
    return (float)((double)offset + ((double)o + 0.5) / (double)s - 0.5);
}

/* The spec's cubic taps for source coordinate x, as its reference implementation picks
 * them: the fraction past the left tap taken in (0, 1] (a whole coordinate counts as 1
 * past the tap before it), weights by Keys' kernel with parameter a, neighbours past an
 * edge repeating it (the input padded with its edge values), or with exclude_outside
 * weighing nothing and the rest scaled to sum to 1. */
static int ref_cubic(const rcase *c, float x, int64_t in, int64_t idx[4], float wt[4])
{
    float a = c->cubic_a != 0 ? c->cubic_a : -0.75f;
    int64_t left = (int64_t)floorf(x);
    float t = x - floorf(x);
    if (t == 0) {
        t = 1;
        left -= 1;
    }
    const float dist[4] = {1 + t, t, 1 - t, 2 - t};
    float sum = 0;
    for (int k = 0; k < 4; k++) {
        float d = dist[k];
        wt[k] = d <= 1 ? ((a + 2) * d - (a + 3)) * d * d + 1 : ((a * d - 5 * a) * d + 8 * a) * d - 4 * a;
        int64_t i = left - 1 + k;
        if (c->exclude_outside && (i < 0 || i >= in))
            wt[k] = 0;
        sum += wt[k];
        idx[k] = i < 0 ? 0 : i >= in ? in - 1 : i;
    }
    if (c->exclude_outside)
        for (int k = 0; k < 4; k++)
            wt[k] /= sum;
    return 4;
}

/* Per-dim taps of one output index: nearest gives one, linear two, cubic four, with their
 * weights. */
static int ref_taps(const rcase *c, int64_t o, float s, int64_t out, int64_t in, int64_t idx[4], float wt[4])
{
    bool linear = !strcmp(c->mode, "linear");
    if (s == 1.0f && out == in) { /* an unscaled dim is left alone (ONNX Runtime) */
        idx[0] = o;
        wt[0] = 1;
        return 1;
    }
    float x = ref_coord(c->ct, o, s, out, in);
    if (!strcmp(c->mode, "cubic"))
        return ref_cubic(c, x, in, idx, wt);
    if (!linear) {
        float r;
        const char *nm = c->nm ? c->nm : "round_prefer_floor";
        if (c->opset < 11) /* opset 10: ceil when downsampling, else truncate */
            r = s < 1 ? ceilf(x) : truncf(x);
        else if (!strcmp(nm, "floor"))
            r = floorf(x);
        else if (!strcmp(nm, "ceil"))
            r = ceilf(x);
        else if (!strcmp(nm, "round_prefer_ceil"))
            r = roundf(x);
        else /* round_prefer_floor: halves go down */
            r = x - floorf(x) == 0.5f ? floorf(x) : roundf(x);
        idx[0] = r < 0 ? 0 : r > (float)(in - 1) ? in - 1 : (int64_t)r;
        wt[0] = 1;
        return 1;
    }
    if (x < 0)
        x = 0;
    if (x > (float)(in - 1))
        x = (float)(in - 1);
    idx[0] = (int64_t)floorf(x);
    idx[1] = idx[0] + 1 < in ? idx[0] + 1 : in - 1;
    if (idx[0] == idx[1]) {
        wt[0] = wt[1] = 0.5f;
    } else {
        wt[1] = x - (float)idx[0];
        wt[0] = (float)idx[1] - x;
    }
    return 2;
}

static float *reference(const rcase *c, const int64_t in[4], const int64_t out[4], const float s[4])
{
    int64_t total = out[0] * out[1] * out[2] * out[3];
    float *y = calloc((size_t)total, sizeof *y);
    int64_t o[4];
    for (o[0] = 0; o[0] < out[0]; o[0]++)
        for (o[1] = 0; o[1] < out[1]; o[1]++)
            for (o[2] = 0; o[2] < out[2]; o[2]++)
                for (o[3] = 0; o[3] < out[3]; o[3]++) {
                    int64_t idx[4][4];
                    float wt[4][4];
                    int nt[4];
                    for (int d = 0; d < 4; d++)
                        nt[d] = ref_taps(c, o[d], s[d], out[d], in[d], idx[d], wt[d]);
                    double acc = 0;
                    for (int a = 0; a < nt[0]; a++)
                        for (int b = 0; b < nt[1]; b++)
                            for (int e = 0; e < nt[2]; e++)
                                for (int f = 0; f < nt[3]; f++) {
                                    int64_t at = ((idx[0][a] * in[1] + idx[1][b]) * in[2] + idx[2][e]) * in[3] +
                                                 idx[3][f];
                                    acc += (double)wt[0][a] * wt[1][b] * wt[2][e] * wt[3][f] * xin[at];
                                }
                    y[((o[0] * out[1] + o[1]) * out[2] + o[2]) * out[3] + o[3]] = (float)acc;
                }
    return y;
}

/* ----------------------------------------------------------------- the graph */

static void build(const rcase *c, pb *model)
{
    static pb g;
    pb attrs = {.n = 0};
    g.n = 0;
    const int64_t xd[4] = {N, C, H, W}, four = 4;
    ob_input(&g, "x", OB_FLOAT, 4, xd, NULL);
    const char *sin = c->sizes[0] ? "sizes" : "scales";
    if (c->sizes[0])
        ob_init(&g, "sizes", OB_INT64, 1, &four, c->sizes, sizeof c->sizes);
    else
        ob_init(&g, "scales", OB_FLOAT, 1, &four, c->scales, sizeof c->scales);
    /* roi is optional from opset 13 only: an empty one before */
    const float no_roi = 0;
    const int64_t zero = 0;
    if (c->opset >= 11 && c->opset < 13)
        ob_init(&g, "roi", OB_FLOAT, 1, &zero, &no_roi, 0);
    ob_attr_str(&attrs, "mode", c->mode);
    if (c->opset >= 11)
        ob_attr_str(&attrs, "coordinate_transformation_mode", c->ct);
    if (c->nm)
        ob_attr_str(&attrs, "nearest_mode", c->nm);
    if (c->cubic_a != 0)
        ob_attr_float(&attrs, "cubic_coeff_a", c->cubic_a);
    if (c->exclude_outside)
        ob_attr_int(&attrs, "exclude_outside", 1);
    const char *ins11[] = {"x", c->opset < 13 ? "roi" : "", c->sizes[0] ? "" : "scales",
                           c->sizes[0] ? "sizes" : NULL, NULL};
    const char *ins10[] = {"x", sin, NULL};
    ob_node(&g, "Resize", "resize_node", c->opset >= 11 ? ins11 : ins10, (const char *[]){"y", NULL}, &attrs);
    ob_output(&g, "y");
    ob_model(model, &g, c->opset);
}

static void case_name(const rcase *c, char *buf, size_t n)
{
    if (c->sizes[0])
        snprintf(buf, n, "op%d_%s_%s_%s_size%lldx%lld", c->opset, c->mode, c->ct, c->nm ? c->nm : "-",
                 (long long)c->sizes[2], (long long)c->sizes[3]);
    else
        snprintf(buf, n, "op%d_%s_%s_%s_scale%gx%g", c->opset, c->mode, c->ct, c->nm ? c->nm : "-",
                 (double)c->scales[2], (double)c->scales[3]);
    if (c->cubic_a != 0 || c->exclude_outside) {
        size_t len = strlen(buf);
        snprintf(buf + len, n - len, "_a%g%s", (double)(c->cubic_a != 0 ? c->cubic_a : -0.75f),
                 c->exclude_outside ? "_excl" : "");
    }
}

static void run_case(const rcase *c, kiln_device *dev, const char *dump)
{
    static pb model;
    char name[160];
    case_name(c, name, sizeof name);
    build(c, &model);
    int64_t in[4] = {N, C, H, W}, out[4];
    float s[4];
    for (int d = 0; d < 4; d++) {
        if (c->sizes[0]) {
            out[d] = c->sizes[d];
            s[d] = (float)out[d] / (float)in[d];
        } else {
            s[d] = c->scales[d];
            out[d] = (int64_t)(s[d] * (float)in[d]);
        }
    }
    float *want = reference(c, in, out, s);
    int64_t total = out[0] * out[1] * out[2] * out[3];
    if (dump) {
        char p[512];
        snprintf(p, sizeof p, "%s/%s.onnx", dump, name);
        FILE *f = fopen(p, "wb");
        if (f) {
            fwrite(model.b, 1, model.n, f);
            fclose(f);
        }
        snprintf(p, sizeof p, "%s/%s.f32", dump, name);
        f = fopen(p, "wb");
        if (f) {
            fwrite(want, sizeof *want, (size_t)total, f);
            fclose(f);
        }
    }
    kiln_onnx_model *m = kiln_onnx_load_memory(model.b, model.n, dev, NULL);
    CHECK(m, "%s: load: %s", name, kiln_error());
    kiln_tensor *x = kiln_from_data(dev, KILN_F32, 4, in, xin, sizeof xin), *y = NULL;
    if (m && x && kiln_onnx_run(m, 1, (const char *[]){"x"}, &x, 1, &y) == 0) {
        bool shape_ok = kiln_tensor_ndim(y) == 4;
        for (int d = 0; shape_ok && d < 4; d++)
            shape_ok = kiln_tensor_dim(y, d) == out[d];
        CHECK(shape_ok, "%s: output shape [%lld, %lld, %lld, %lld], want [%lld, %lld, %lld, %lld]", name,
              (long long)kiln_tensor_dim(y, 0), (long long)kiln_tensor_dim(y, 1), (long long)kiln_tensor_dim(y, 2),
              (long long)kiln_tensor_dim(y, 3), (long long)out[0], (long long)out[1], (long long)out[2],
              (long long)out[3]);
        float *got = malloc((size_t)total * sizeof *got);
        if (shape_ok && got && kiln_to_data(y, got, (size_t)total * sizeof *got) == 0) {
            double worst = 0;
            int64_t at = 0;
            for (int64_t i = 0; i < total; i++) {
                double e = fabs((double)got[i] - want[i]) / fmax(1.0, fabs(want[i]));
                if (!(e <= worst)) {
                    worst = e;
                    at = i;
                }
            }
            CHECK(worst <= 1e-5, "%s: element %lld is %g, want %g (relative error %.3g)", name, (long long)at,
                  (double)got[at], (double)want[at], worst);
        }
        free(got);
    } else if (m) {
        CHECK(0, "%s: run: %s", name, kiln_error());
    }
    kiln_tensor_release(y);
    kiln_tensor_release(x);
    kiln_onnx_free(m);
    free(want);
}

/* A mode kiln does not implement: refused with a message naming it, no crash or leak. */
static void refused(kiln_device *dev, const char *mode, const char *ct, const char *nm, const char *needle)
{
    static pb model;
    rcase c = {mode, ct, nm, {1, 1, 1.5f, 1.5f}, {0}, 19, 0, 0};
    build(&c, &model);
    kiln_onnx_model *m = kiln_onnx_load_memory(model.b, model.n, dev, NULL);
    kiln_tensor *x = kiln_from_data(dev, KILN_F32, 4, (const int64_t[]){N, C, H, W}, xin, sizeof xin), *y = NULL;
    int rc = m && x ? kiln_onnx_run(m, 1, (const char *[]){"x"}, &x, 1, &y) : -1;
    const char *e = kiln_error();
    CHECK(rc != 0 && strstr(e, needle) && strstr(e, "resize_node"), "%s/%s/%s: want an error naming '%s', got %s",
          mode, ct, nm ? nm : "-", needle, rc == 0 ? "success" : e);
    kiln_tensor_release(y);
    kiln_tensor_release(x);
    kiln_onnx_free(m);
}

int main(int argc, char **argv)
{
    const char *devs[8] = {0}, *dump = NULL;
    int nd = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dump") && i + 1 < argc)
            dump = argv[++i];
        else if (nd < 8)
            devs[nd++] = argv[i];
    }
    if (!nd) {
        devs[nd++] = "cpu";
        devs[nd++] = "ref";
    }
    uint32_t seed = 12345;
    for (int i = 0; i < N * C * H * W; i++) {
        seed = seed * 1664525u + 1013904223u;
        xin[i] = (float)(seed >> 8) / (float)(1u << 24) * 4.0f - 2.0f;
    }
    static const float sc[] = {2.5f, 1.5f, 0.6f, 1.4f, 2.7f, 1.3f, 2.0f, 3.0f, 0.5f};
    static const char *cts[] = {"half_pixel", "pytorch_half_pixel",   "align_corners",
                                "asymmetric", "tf_half_pixel_for_nn", "half_pixel_symmetric"};
    static const char *nms[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
    static const int64_t sizes[][4] = {{N, C, 12, 17}, {N, C, 3, 4}, {N, C, 5, 9}, {N, C, 13, 7}};
    for (int k = 0; k < nd; k++) {
        kiln_device *dev = kiln_device_open(devs[k]);
        if (!dev) {
            fprintf(stderr, "%s: %s\n", devs[k], kiln_error());
            return 1;
        }
        int before = failures, ncases = 0;
        for (size_t ct = 0; ct < sizeof cts / sizeof cts[0]; ct++) {
            for (size_t s = 0; s < sizeof sc / sizeof sc[0]; s++) {
                rcase c = {"linear", cts[ct], NULL, {1, 1, sc[s], sc[s]}, {0}, 19, 0, 0};
                run_case(&c, dev, k ? NULL : dump);
                c.mode = "cubic";
                run_case(&c, dev, k ? NULL : dump);
                ncases += 2;
                for (size_t nm = 0; nm < sizeof nms / sizeof nms[0]; nm++) {
                    c.mode = "nearest";
                    c.nm = nms[nm];
                    run_case(&c, dev, k ? NULL : dump);
                    ncases++;
                }
            }
            for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
                rcase c = {"linear", cts[ct], NULL, {0}, {sizes[z][0], sizes[z][1], sizes[z][2], sizes[z][3]},
                           19,       0,       0};
                run_case(&c, dev, k ? NULL : dump);
                c.mode = "cubic";
                run_case(&c, dev, k ? NULL : dump);
                c.mode = "nearest";
                c.nm = "round_prefer_ceil";
                run_case(&c, dev, k ? NULL : dump);
                ncases += 3;
            }
        }
        /* different scales per dim, one of them 1; the default modes; PyTorch's exports
         * (opset 11 and 17: nearest asymmetric/floor, linear pytorch_half_pixel) */
        const rcase more[] = {
            {"linear", "half_pixel", NULL, {1, 1, 1.0f, 2.5f}, {0}, 19, 0, 0},
            {"linear", "pytorch_half_pixel", NULL, {1, 1, 0.6f, 1.4f}, {0}, 11, 0, 0},
            {"nearest", "asymmetric", "floor", {1, 1, 1.4f, 2.7f}, {0}, 17, 0, 0},
            {"nearest", "asymmetric", "floor", {1, 1, 2.0f, 4.0f}, {0}, 11, 0, 0},
            {"nearest", "half_pixel", NULL, {1, 1, 1.3f, 0.6f}, {0}, 13, 0, 0},
            {"nearest", "asymmetric", NULL, {1, 1, 2.5f, 0.6f}, {0}, 10, 0, 0},
            {"nearest", "asymmetric", NULL, {1, 1, 2.0f, 2.0f}, {0}, 10, 0, 0},
            /* cubic: PyTorch's bicubic exports (a = -0.75 written out; align_corners and
             * pytorch_half_pixel, opset 11 and 17), TensorFlow's a = -0.5, taps past the
             * edge excluded, one dim unscaled, a 1-D resize along the last dim only */
            {"cubic", "pytorch_half_pixel", NULL, {1, 1, 2.0f, 2.0f}, {0}, 11, -0.75f, 0},
            {"cubic", "align_corners", NULL, {1, 1, 1.5f, 2.5f}, {0}, 17, -0.75f, 0},
            {"cubic", "half_pixel", NULL, {1, 1, 2.5f, 0.6f}, {0}, 19, -0.5f, 0},
            {"cubic", "half_pixel", NULL, {1, 1, 2.5f, 1.4f}, {0}, 19, 0, 1},
            {"cubic", "asymmetric", NULL, {1, 1, 0.6f, 3.0f}, {0}, 19, -0.5f, 1},
            {"cubic", "align_corners", NULL, {0}, {N, C, 9, 4}, 19, 0, 1},
            {"cubic", "half_pixel", NULL, {1, 1, 1.0f, 2.7f}, {0}, 19, 0, 0},
        };
        for (size_t i = 0; i < sizeof more / sizeof more[0]; i++, ncases++)
            run_case(&more[i], dev, k ? NULL : dump);
        refused(dev, "area", "half_pixel", NULL, "'area'");
        refused(dev, "linear", "tf_crop_and_resize", NULL, "tf_crop_and_resize");
        refused(dev, "nearest", "half_pixel", "round_to_odd", "round_to_odd");
        printf("%s: %d Resize cases, %d failures\n", devs[k], ncases, failures - before);
        kiln_device_close(dev);
    }
    if (failures)
        fprintf(stderr, "%d failures\n", failures);
    return failures ? 1 : 0;
}
