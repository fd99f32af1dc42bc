/*
 * onnx_more.c — the operators of engine/onnx/onnx-ops-more.c, each a one-node graph built
 * here byte by byte and run on the devices named (cpu and ref when none):
 *
 *     onnx_more [DEVICE...]
 *
 * Every expected value is computed here in double from the ONNX spec's formulas, never
 * with kiln's ops: ScatterElements and Scatter (each reduction, negative indices and
 * axis, integer data), PRelu (slope broadcast one way), ReduceL1/L2/SumSquare/LogSum/
 * LogSumExp (axes attribute at opset 13 and input at 18, negative axes, keepdims 0 and
 * 1, noop_with_empty_axes, integers), DepthToSpace (DCR, CRD) and SpaceToDepth, Mish,
 * Selu, Celu, Softsign, ThresholdedRelu, and the trigonometric functions swept over
 * their domains, edges included, in f32 and f64 within 1e-6 relative of libm's double.
 * Bad inputs (an index out of range, an unknown reduction or mode, a rank or axis out
 * of range, a slope that does not broadcast, integer input to a float-only operator)
 * must fail the run with an error naming the node and the fault.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "onnx-check.h"
#include "onnx-pb.h"

/* ------------------------------------------------------------- graph building */

static int onnx_type(kiln_dtype dt)
{
    switch (dt) {
    case KILN_F32: return 1;
    case KILN_I32: return 6;
    case KILN_I64: return 7;
    case KILN_F16: return 10;
    case KILN_F64: return 11;
    default: return 0;
    }
}

static void attr_int(pb *attrs, const char *name, int64_t v)
{
    pb a = {.n = 0};
    pb_str(&a, 1, name);
    pb_int(&a, 20, 2);
    pb_int(&a, 3, (uint64_t)v);
    pb_msg(attrs, 5, &a);
}
static void attr_float(pb *attrs, const char *name, float v)
{
    pb a = {.n = 0};
    pb_str(&a, 1, name);
    pb_int(&a, 20, 1);
    pb_varint(&a, 2 << 3 | 5);
    memcpy(a.b + a.n, &v, 4);
    a.n += 4;
    pb_msg(attrs, 5, &a);
}
static void attr_str(pb *attrs, const char *name, const char *v)
{
    pb a = {.n = 0};
    pb_str(&a, 1, name);
    pb_int(&a, 20, 3);
    pb_str(&a, 4, v);
    pb_msg(attrs, 5, &a);
}
static void attr_ints(pb *attrs, const char *name, int k, const int64_t *v)
{
    pb a = {.n = 0};
    pb_str(&a, 1, name);
    pb_int(&a, 20, 7);
    for (int i = 0; i < k; i++)
        pb_int(&a, 8, (uint64_t)v[i]);
    pb_msg(attrs, 5, &a);
}

/* One node 'node' of op over graph inputs named a, b, c... (their types and shapes taken
 * from ins), output y, at opset. Returns y, or NULL with the error copied to err. */
static kiln_tensor *run_node(kiln_device *dev, int64_t opset, const char *op, const char *node, int nin,
                             kiln_tensor *const *ins, const pb *attrs, char *err, size_t errlen)
{
    static const char *names[] = {"a", "b", "c", "d"};
    static pb g, model;
    pb n = {.n = 0}, opst = {.n = 0};
    g.n = model.n = 0;
    for (int i = 0; i < nin; i++) {
        pb shape = {.n = 0}, tt = {.n = 0}, ty = {.n = 0}, vi = {.n = 0};
        for (int d = 0; d < kiln_tensor_ndim(ins[i]); d++) {
            pb dm = {.n = 0};
            pb_int(&dm, 1, (uint64_t)kiln_tensor_dim(ins[i], d));
            pb_msg(&shape, 1, &dm);
        }
        pb_int(&tt, 1, (uint64_t)onnx_type(kiln_tensor_dtype(ins[i])));
        pb_msg(&tt, 2, &shape);
        pb_msg(&ty, 1, &tt);
        pb_str(&vi, 1, names[i]);
        pb_msg(&vi, 2, &ty);
        pb_msg(&g, 11, &vi);
        pb_str(&n, 1, names[i]);
    }
    pb_str(&n, 2, "y");
    pb_str(&n, 3, node);
    pb_str(&n, 4, op);
    if (attrs) {
        memcpy(n.b + n.n, attrs->b, attrs->n);
        n.n += attrs->n;
    }
    pb_msg(&g, 1, &n);
    pb o = {.n = 0};
    pb_str(&o, 1, "y");
    pb_msg(&g, 12, &o);
    pb_int(&model, 1, 8);
    pb_int(&opst, 2, (uint64_t)opset);
    pb_msg(&model, 8, &opst);
    pb_msg(&model, 7, &g);
    kiln_onnx_model *m = kiln_onnx_load_memory(model.b, model.n, dev, NULL);
    kiln_tensor *y = NULL;
    if (!m || kiln_onnx_run(m, nin, names, ins, 1, &y) != 0) {
        snprintf(err, errlen, "%s", kiln_error());
        kiln_tensor_release(y);
        y = NULL;
    }
    kiln_onnx_free(m);
    return y;
}

static kiln_tensor *mk(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape, const double *v)
{
    int64_t k = 1;
    for (int i = 0; i < ndim; i++)
        k *= shape[i];
    kiln_tensor *d = kiln_from_data(dev, KILN_F64, ndim, shape, v, (size_t)k * sizeof *v);
    kiln_tensor *t = kiln_cast(d, dt);
    kiln_tensor_release(d);
    return t;
}

/* Values of t as doubles into v (at most max). */
static int64_t readd(kiln_tensor *t, double *v, int64_t max)
{
    int64_t k = kiln_tensor_numel(t);
    kiln_tensor *c = kiln_cast(t, KILN_F64);
    int rc = k <= max && c ? kiln_to_data(c, v, (size_t)k * sizeof *v) : -1;
    kiln_tensor_release(c);
    return rc ? -1 : k;
}

/* y: dtype dt, shape, values want within rel * |want| + abs (NaN must be NaN). Returns the
 * largest relative difference seen. Releases y. */
static double expect(const char *what, kiln_tensor *y, const char *err, kiln_dtype dt, int ndim,
                     const int64_t *shape, const double *want, double rel, double abs)
{
    double worst = 0;
    CHECK(y, "%s: run failed: %s", what, err);
    if (!y)
        return worst;
    char d[160];
    kiln_tensor_describe(y, d, sizeof d);
    bool same = kiln_tensor_dtype(y) == dt && kiln_tensor_ndim(y) == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = kiln_tensor_dim(y, i) == shape[i];
    CHECK(same, "%s: got %s", what, d);
    static double got[8192];
    int64_t k = same ? readd(y, got, 8192) : -1;
    CHECK(!same || k >= 0, "%s: read: %s", what, kiln_error());
    int bad = 0;
    for (int64_t i = 0; i < k; i++) {
        double w = want[i], g = got[i];
        bool okv = isnan(w) ? isnan(g) : g == w || fabs(g - w) <= rel * fabs(w) + abs;
        if (!isnan(w) && w != 0 && isfinite(w))
            worst = fmax(worst, fabs(g - w) / fabs(w));
        if (!okv && bad++ < 5)
            CHECK(0, "%s[%lld]: %.17g, want %.17g", what, (long long)i, g, w);
        else if (!okv)
            failures++;
    }
    kiln_tensor_release(y);
    return worst;
}

/* A run that must fail naming the node and carrying every needle (NULL-ended). */
static void expect_fail(const char *what, kiln_tensor *y, const char *err, const char *node,
                        const char *const *needles)
{
    CHECK(!y, "%s: the run succeeded", what);
    kiln_tensor_release(y);
    if (y)
        return;
    char nm[80];
    snprintf(nm, sizeof nm, "node '%s'", node);
    CHECK(strstr(err, nm), "%s: error \"%s\" lacks \"%s\"", what, err, nm);
    for (int i = 0; needles[i]; i++)
        CHECK(strstr(err, needles[i]), "%s: error \"%s\" lacks \"%s\"", what, err, needles[i]);
}

static char err[1024];

/* ------------------------------------------------------------ ScatterElements */

/* The spec's loop: for each index position p, data[p with axis replaced by idx[p]] op= upd[p]. */
static void scatter_ref(double *out, const double *data, const int64_t *dshape, const double *idx,
                        const double *upd, const int64_t *ishape, int r, int axis, const char *red)
{
    int64_t total = 1, ni = 1;
    for (int i = 0; i < r; i++) {
        total *= dshape[i];
        ni *= ishape[i];
    }
    memcpy(out, data, (size_t)total * sizeof *out);
    for (int64_t p = 0; p < ni; p++) {
        int64_t rest = p, off = 0, stride = 1;
        for (int d = r - 1; d >= 0; d--) {
            int64_t c = rest % ishape[d];
            rest /= ishape[d];
            if (d == axis) {
                int64_t v = (int64_t)idx[p];
                c = v < 0 ? v + dshape[d] : v;
            }
            off += c * stride;
            stride *= dshape[d];
        }
        double *o = &out[off], u = upd[p];
        if (!strcmp(red, "none"))
            *o = u;
        else if (!strcmp(red, "add"))
            *o += u;
        else if (!strcmp(red, "mul"))
            *o *= u;
        else if (!strcmp(red, "max"))
            *o = fmax(*o, u);
        else
            *o = fmin(*o, u);
    }
}

static void test_scatter(kiln_device *dev)
{
    double data[12], upd[6], want[12];
    for (int i = 0; i < 12; i++)
        data[i] = (i * 5 % 7) - 2.5;
    for (int i = 0; i < 6; i++)
        upd[i] = 1.25 * i - 3;
    const int64_t ds[] = {3, 4}, is[] = {2, 3};
    /* axis 0: rows, one negative; axis -1: columns, with a repeat (add, mul accumulate) */
    const double idx0[] = {1, -1, 0, 2, 0, -2};
    const double idx1[] = {3, 0, -1, 1, 1, 2};
    const char *reds[] = {"none", "add", "mul", "max", "min"};
    kiln_tensor *dt = mk(dev, KILN_F32, 2, ds, data), *ut = mk(dev, KILN_F32, 2, is, upd);
    for (int ax = 0; ax < 2; ax++) {
        kiln_tensor *it = mk(dev, KILN_I64, 2, is, ax ? idx1 : idx0);
        for (int r = 0; r < 5; r++) {
            if (ax == 1 && r == 0)
                continue; /* a repeated index without reduction has no defined result */
            pb at = {.n = 0};
            attr_int(&at, "axis", ax ? -1 : 0);
            attr_str(&at, "reduction", reds[r]);
            kiln_tensor *in[] = {dt, it, ut};
            char what[64];
            snprintf(what, sizeof what, "ScatterElements axis %d %s", ax, reds[r]);
            scatter_ref(want, data, ds, ax ? idx1 : idx0, upd, is, 2, ax, reds[r]);
            expect(what, run_node(dev, 18, "ScatterElements", "se", 3, in, &at, err, sizeof err), err, KILN_F32, 2,
                   ds, want, 1e-6, 0);
        }
        kiln_tensor_release(it);
    }
    /* integer data and i32 indices, add; then the deprecated Scatter at opset 10 */
    kiln_tensor *di = mk(dev, KILN_I64, 2, ds, (const double[]){1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
    kiln_tensor *ui = mk(dev, KILN_I64, 2, is, (const double[]){100, 200, 300, 400, 500, 600});
    kiln_tensor *ii = mk(dev, KILN_I32, 2, is, idx1);
    pb at = {.n = 0};
    attr_int(&at, "axis", 1);
    attr_str(&at, "reduction", "add");
    scatter_ref(want, (const double[]){1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, ds, idx1,
                (const double[]){100, 200, 300, 400, 500, 600}, is, 2, 1, "add");
    expect("ScatterElements i64 add",
           run_node(dev, 16, "ScatterElements", "se", 3, (kiln_tensor *[]){di, ii, ui}, &at, err, sizeof err), err,
           KILN_I64, 2, ds, want, 0, 0);
    at.n = 0;
    attr_str(&at, "reduction", "mul");
    attr_int(&at, "axis", 1);
    scatter_ref(want, (const double[]){1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, ds, idx1,
                (const double[]){100, 200, 300, 400, 500, 600}, is, 2, 1, "mul");
    expect("ScatterElements i64 mul",
           run_node(dev, 16, "ScatterElements", "se", 3, (kiln_tensor *[]){di, ii, ui}, &at, err, sizeof err), err,
           KILN_I64, 2, ds, want, 0, 0);
    kiln_tensor *it = mk(dev, KILN_I64, 2, is, idx0);
    scatter_ref(want, data, ds, idx0, upd, is, 2, 0, "none");
    expect("Scatter opset 10",
           run_node(dev, 10, "Scatter", "sc", 3, (kiln_tensor *[]){dt, it, ut}, NULL, err, sizeof err), err,
           KILN_F32, 2, ds, want, 1e-6, 0);

    /* refused: index 3 of 3 rows, -4, an unknown reduction, ranks, float indices, shapes */
    kiln_tensor *bad = mk(dev, KILN_I64, 2, is, (const double[]){0, 1, 3, 0, 0, 0});
    expect_fail(
        "ScatterElements index 3",
        run_node(dev, 18, "ScatterElements", "bad_se", 3, (kiln_tensor *[]){dt, bad, ut}, NULL, err, sizeof err),
        err, "bad_se", (const char *[]){"index 3 out of range", NULL});
    kiln_tensor_release(bad);
    bad = mk(dev, KILN_I64, 2, is, (const double[]){0, 1, -4, 0, 0, 0});
    expect_fail(
        "ScatterElements index -4",
        run_node(dev, 18, "ScatterElements", "bad_se", 3, (kiln_tensor *[]){dt, bad, ut}, NULL, err, sizeof err),
        err, "bad_se", (const char *[]){"index -4 out of range", NULL});
    kiln_tensor_release(bad);
    at.n = 0;
    attr_str(&at, "reduction", "mean");
    expect_fail(
        "ScatterElements reduction mean",
        run_node(dev, 18, "ScatterElements", "bad_se", 3, (kiln_tensor *[]){dt, it, ut}, &at, err, sizeof err),
        err, "bad_se", (const char *[]){"reduction 'mean'", NULL});
    kiln_tensor *i1 = mk(dev, KILN_I64, 1, (const int64_t[]){2}, idx0);
    kiln_tensor *u1 = mk(dev, KILN_F32, 1, (const int64_t[]){2}, upd);
    expect_fail(
        "ScatterElements rank",
        run_node(dev, 18, "ScatterElements", "bad_se", 3, (kiln_tensor *[]){dt, i1, u1}, NULL, err, sizeof err),
        err, "bad_se", (const char *[]){"rank", NULL});
    kiln_tensor *fi = mk(dev, KILN_F32, 2, is, idx0);
    expect_fail(
        "ScatterElements float indices",
        run_node(dev, 18, "ScatterElements", "bad_se", 3, (kiln_tensor *[]){dt, fi, ut}, NULL, err, sizeof err),
        err, "bad_se", (const char *[]){"indices must be integers", NULL});
    at.n = 0;
    attr_int(&at, "axis", 2);
    expect_fail(
        "ScatterElements axis 2",
        run_node(dev, 18, "ScatterElements", "bad_se", 3, (kiln_tensor *[]){dt, it, ut}, &at, err, sizeof err),
        err, "bad_se", (const char *[]){"axis 2 out of range", NULL});
    kiln_tensor *u23 = mk(dev, KILN_F32, 2, (const int64_t[]){3, 2}, upd);
    expect_fail(
        "ScatterElements updates shape",
        run_node(dev, 18, "ScatterElements", "bad_se", 3, (kiln_tensor *[]){dt, it, u23}, NULL, err, sizeof err),
        err, "bad_se", (const char *[]){"updates dim", NULL});
    kiln_tensor *t[] = {dt, ut, di, ui, ii, it, i1, u1, fi, u23};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        kiln_tensor_release(t[i]);
}

/* -------------------------------------------------------------------- PRelu */

static void test_prelu(kiln_device *dev)
{
    const int64_t xs[] = {2, 3, 2, 2};
    double x[24], want[24];
    for (int i = 0; i < 24; i++)
        x[i] = (i * 7 % 11) - 5.0;
    kiln_tensor *xt = mk(dev, KILN_F32, 4, xs, x);
    struct {
        const char *what;
        int ndim;
        int64_t shape[4];
        double v[3];
    } cases[] = {
        {"PRelu per channel [3,1,1]", 3, {3, 1, 1}, {0.25, -0.5, 2}},
        {"PRelu last dim [2]", 1, {2}, {0.1, 0.3}},
        {"PRelu one slope [1]", 1, {1}, {0.2}},
        {"PRelu [1,3,1,1]", 4, {1, 3, 1, 1}, {0.25, -0.5, 2}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        kiln_tensor *st = mk(dev, KILN_F32, cases[c].ndim, cases[c].shape, cases[c].v);
        for (int i = 0; i < 24; i++) {
            /* the slope element broadcast to x's position i */
            int64_t rest = i, off = 0, stride = 1;
            for (int d = 3; d >= 0; d--) {
                int64_t cx = rest % xs[d];
                rest /= xs[d];
                int sd = d - (4 - cases[c].ndim);
                if (sd >= 0) {
                    off += (cases[c].shape[sd] == 1 ? 0 : cx) * stride;
                    stride *= cases[c].shape[sd];
                }
            }
            want[i] = x[i] < 0 ? cases[c].v[off] * x[i] : x[i];
        }
        expect(cases[c].what,
               run_node(dev, 16, "PRelu", "pr", 2, (kiln_tensor *[]){xt, st}, NULL, err, sizeof err), err,
               KILN_F32, 4, xs, want, 1e-7, 0);
        kiln_tensor_release(st);
    }
    /* integers (opset 16 allows them) */
    kiln_tensor *xi = mk(dev, KILN_I32, 4, xs, x),
                *si = mk(dev, KILN_I32, 3, (const int64_t[]){3, 1, 1}, (const double[]){2, -1, 3});
    for (int i = 0; i < 24; i++)
        want[i] = x[i] < 0 ? (double[]){2, -1, 3}[(i / 4) % 3] * x[i] : x[i];
    expect("PRelu i32", run_node(dev, 16, "PRelu", "pr", 2, (kiln_tensor *[]){xi, si}, NULL, err, sizeof err), err,
           KILN_I32, 4, xs, want, 0, 0);
    /* a slope that broadcasts only the other way, and one of the wrong size */
    kiln_tensor *s5 = mk(dev, KILN_F32, 5, (const int64_t[]){1, 2, 3, 2, 2}, x);
    expect_fail("PRelu slope rank",
                run_node(dev, 16, "PRelu", "bad_pr", 2, (kiln_tensor *[]){xt, s5}, NULL, err, sizeof err), err,
                "bad_pr", (const char *[]){"does not broadcast", NULL});
    kiln_tensor *s4 = mk(dev, KILN_F32, 1, (const int64_t[]){4}, x);
    expect_fail("PRelu slope size",
                run_node(dev, 16, "PRelu", "bad_pr", 2, (kiln_tensor *[]){xt, s4}, NULL, err, sizeof err), err,
                "bad_pr", (const char *[]){"does not broadcast", "f32[4]", NULL});
    kiln_tensor *t[] = {xt, xi, si, s5, s4};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        kiln_tensor_release(t[i]);
}

/* --------------------------------------------------------------- reductions */

enum {
    L1,
    L2,
    SSQ,
    LOGSUM,
    LSE
};

/* x [2, 3, 4] reduced over the dims in mask (a bit per dim), as the spec defines each. */
static int reduce_ref(int kind, const double *x, int mask, double *out, int64_t *kshape)
{
    const int64_t s[3] = {2, 3, 4};
    double acc[24];
    int n = 0;
    for (int i = 0; i < 3; i++)
        kshape[i] = mask >> i & 1 ? 1 : s[i];
    for (int o = 0; o < 24; o++)
        acc[o] = kind == LSE ? -INFINITY : 0;
    for (int i = 0; i < 24; i++) {
        int c[3] = {i / 12, i / 4 % 3, i % 4};
        int o = 0;
        for (int d = 0; d < 3; d++)
            o = o * (int)kshape[d] + (mask >> d & 1 ? 0 : c[d]);
        double v = x[i];
        if (kind == LSE) {
            double m = fmax(acc[o], v);
            acc[o] = m + log(exp(acc[o] - m) + exp(v - m));
        } else {
            acc[o] += kind == L1 ? fabs(v) : kind == LOGSUM ? v : v * v;
        }
    }
    n = (int)(kshape[0] * kshape[1] * kshape[2]);
    for (int o = 0; o < n; o++)
        out[o] = kind == L2 ? sqrt(acc[o]) : kind == LOGSUM ? log(acc[o]) : acc[o];
    return n;
}

static void test_reduce(kiln_device *dev)
{
    static const char *ops[] = {"ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"};
    const int64_t xs[] = {2, 3, 4};
    double x[24], xp[24], want[24];
    for (int i = 0; i < 24; i++) {
        x[i] = ((i * 7) % 13 - 6) * 0.7;
        xp[i] = 0.3 + (i * 5 % 9) * 0.45; /* LogSum needs positive sums */
    }
    struct {
        int nax;
        int64_t ax[3];
        int mask;
    } axs[] = {{1, {1}, 2}, {2, {-1, 0}, 5}, {0, {0}, 7}, {1, {-3}, 1}, {3, {0, 1, 2}, 7}};
    kiln_tensor *xt = mk(dev, KILN_F32, 3, xs, x), *xpt = mk(dev, KILN_F32, 3, xs, xp);
    for (int k = 0; k < 5; k++) {
        kiln_tensor *in = k == LOGSUM ? xpt : xt;
        const double *xv = k == LOGSUM ? xp : x;
        for (size_t a = 0; a < sizeof axs / sizeof *axs; a++)
            for (int keep = 0; keep < 2; keep++)
                for (int opset = 13; opset <= 18; opset += 5) {
                    int64_t ks[3], os[3];
                    int on = 0;
                    reduce_ref(k, xv, axs[a].mask, want, ks);
                    for (int d = 0; d < 3; d++)
                        if (keep || !(axs[a].mask >> d & 1))
                            os[on++] = ks[d];
                    pb at = {.n = 0};
                    attr_int(&at, "keepdims", keep);
                    kiln_tensor *axt = NULL;
                    if (opset < 18 && axs[a].nax)
                        attr_ints(&at, "axes", axs[a].nax, axs[a].ax);
                    if (opset >= 18 && axs[a].nax) {
                        double av[3] = {(double)axs[a].ax[0], (double)axs[a].ax[1], (double)axs[a].ax[2]};
                        axt = mk(dev, KILN_I64, 1, (const int64_t[]){axs[a].nax}, av);
                    }
                    char what[96];
                    snprintf(what, sizeof what, "%s axes #%zu keepdims %d opset %d", ops[k], a, keep, opset);
                    kiln_tensor *y = run_node(dev, opset, ops[k], "rd", axt ? 2 : 1, (kiln_tensor *[]){in, axt},
                                              &at, err, sizeof err);
                    expect(what, y, err, KILN_F32, on, os, want, 2e-6, 0);
                    kiln_tensor_release(axt);
                }
        /* noop_with_empty_axes (opset 18): no axis reduced, the elementwise part alone */
        pb at = {.n = 0};
        attr_int(&at, "noop_with_empty_axes", 1);
        for (int i = 0; i < 24; i++)
            want[i] = k == L1 || k == L2 ? fabs(xv[i])
                      : k == SSQ         ? xv[i] * xv[i]
                      : k == LOGSUM      ? log(xv[i])
                                         : xv[i];
        char what[96];
        snprintf(what, sizeof what, "%s noop_with_empty_axes", ops[k]);
        expect(what, run_node(dev, 18, ops[k], "rd", 1, &in, &at, err, sizeof err), err, KILN_F32, 3, xs, want,
               2e-6, 0);
        /* an axis out of range, named */
        at.n = 0;
        attr_ints(&at, "axes", 1, (const int64_t[]){3});
        expect_fail(what, run_node(dev, 13, ops[k], "bad_rd", 1, &in, &at, err, sizeof err), err, "bad_rd",
                    (const char *[]){"axis 3 out of range for rank 3", NULL});
    }
    /* integers: L1 and SumSquare exact, L2, LogSum and LogSumExp truncated (as ONNX Runtime) */
    double xi[24];
    for (int i = 0; i < 24; i++)
        xi[i] = (i * 7) % 13 - 4;
    kiln_tensor *it = mk(dev, KILN_I32, 3, xs, xi), *i64 = mk(dev, KILN_I64, 3, xs, xp);
    for (int k = 0; k < 5; k++) {
        int64_t ks[3];
        pb at = {.n = 0};
        attr_ints(&at, "axes", 1, (const int64_t[]){-1});
        bool pos = k == LOGSUM;
        double xv[24];
        kiln_tensor *in = pos ? i64 : it;
        for (int i = 0; i < 24; i++)
            xv[i] = pos ? trunc(xp[i]) : xi[i];
        int nn = reduce_ref(k, xv, 4, want, ks);
        for (int i = 0; i < nn; i++)
            want[i] = trunc(want[i]);
        char what[96];
        snprintf(what, sizeof what, "%s integers", ops[k]);
        expect(what, run_node(dev, 13, ops[k], "rd", 1, &in, &at, err, sizeof err), err, pos ? KILN_I64 : KILN_I32,
               3, ks, want, 0, 0);
    }
    kiln_tensor *t[] = {xt, xpt, it, i64};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        kiln_tensor_release(t[i]);
}

/* ---------------------------------------------------- DepthToSpace, SpaceToDepth */

static void test_depth_space(kiln_device *dev)
{
    enum {
        N = 2,
        C = 8,
        H = 2,
        W = 3,
        B = 2,
        CB = C / (B * B)
    };
    double x[N * C * H * W], want[N * C * H * W];
    for (int i = 0; i < N * C * H * W; i++)
        x[i] = i * 3 - 7; /* integers, so the i64 case reads the same values */
    const int64_t xs[] = {N, C, H, W}, ys[] = {N, CB, H * B, W * B};
    kiln_tensor *xt = mk(dev, KILN_F32, 4, xs, x);
    for (int crd = 1; crd >= 0; crd--) { /* DCR last: the default-mode case below reuses want */
        /* the spec: DCR reads channel (i b + j) C' + c, CRD channel c b² + i b + j */
        for (int nn = 0; nn < N; nn++)
            for (int c = 0; c < CB; c++)
                for (int h = 0; h < H * B; h++)
                    for (int w = 0; w < W * B; w++) {
                        int i = h % B, j = w % B;
                        int ch = crd ? c * B * B + i * B + j : (i * B + j) * CB + c;
                        want[((nn * CB + c) * H * B + h) * W * B + w] = x[((nn * C + ch) * H + h / B) * W + w / B];
                    }
        pb at = {.n = 0};
        attr_int(&at, "blocksize", B);
        attr_str(&at, "mode", crd ? "CRD" : "DCR");
        expect(crd ? "DepthToSpace CRD" : "DepthToSpace DCR",
               run_node(dev, 13, "DepthToSpace", "d2s", 1, &xt, &at, err, sizeof err), err, KILN_F32, 4, ys, want,
               0, 0);
    }
    /* default mode DCR, on integers */
    kiln_tensor *xi = mk(dev, KILN_I64, 4, xs, x);
    pb at = {.n = 0};
    attr_int(&at, "blocksize", B);
    expect("DepthToSpace default i64", run_node(dev, 11, "DepthToSpace", "d2s", 1, &xi, &at, err, sizeof err), err,
           KILN_I64, 4, ys, want, 0, 0);
    /* SpaceToDepth of [N, CB, H b, W b]: y[n, (i b + j) C + c, h, w] = x[n, c, h b + i, w b + j] */
    kiln_tensor *yt = mk(dev, KILN_F32, 4, ys, x);
    for (int nn = 0; nn < N; nn++)
        for (int c = 0; c < CB; c++)
            for (int h = 0; h < H * B; h++)
                for (int w = 0; w < W * B; w++) {
                    int i = h % B, j = w % B, ch = (i * B + j) * CB + c;
                    want[((nn * C + ch) * H + h / B) * W + w / B] = x[((nn * CB + c) * H * B + h) * W * B + w];
                }
    expect("SpaceToDepth", run_node(dev, 13, "SpaceToDepth", "s2d", 1, &yt, &at, err, sizeof err), err, KILN_F32,
           4, xs, want, 0, 0);
    /* refused: a mode that does not exist, rank 3, channels not a multiple of b², odd H */
    pb bad = {.n = 0};
    attr_int(&bad, "blocksize", B);
    attr_str(&bad, "mode", "RCD");
    expect_fail("DepthToSpace mode", run_node(dev, 13, "DepthToSpace", "bad_d2s", 1, &xt, &bad, err, sizeof err),
                err, "bad_d2s", (const char *[]){"mode 'RCD'", NULL});
    kiln_tensor *x3 = mk(dev, KILN_F32, 3, (const int64_t[]){C, H, W}, x);
    expect_fail("DepthToSpace rank", run_node(dev, 13, "DepthToSpace", "bad_d2s", 1, &x3, &at, err, sizeof err),
                err, "bad_d2s", (const char *[]){"rank 4", NULL});
    pb b3 = {.n = 0};
    attr_int(&b3, "blocksize", 3);
    expect_fail("DepthToSpace channels",
                run_node(dev, 13, "DepthToSpace", "bad_d2s", 1, &xt, &b3, err, sizeof err), err, "bad_d2s",
                (const char *[]){"not a multiple", NULL});
    expect_fail("SpaceToDepth height", run_node(dev, 13, "SpaceToDepth", "bad_s2d", 1, &xt, &at, err, sizeof err),
                err, "bad_s2d", (const char *[]){"multiples of blocksize", NULL});
    kiln_tensor *t[] = {xt, xi, yt, x3};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        kiln_tensor_release(t[i]);
}

/* -------------------------------------------------------------- activations */

static double f_mish(double x, double a)
{
    return x * tanh(log1p(exp(x)));
}
static double f_selu(double x, double a)
{
    const double alpha = 1.67326319217681884765625, gamma = 1.05070102214813232421875;
    return gamma * (x > 0 ? x : alpha * expm1(x));
}
static double f_celu(double x, double a)
{
    return fmax(0, x) + fmin(0, a * expm1(x / a));
}
static double f_softsign(double x, double a)
{
    return x / (1 + fabs(x));
}
static double f_thr(double x, double a)
{
    return x > a ? x : 0;
}

static void test_activations(kiln_device *dev)
{
    enum {
        K = 400
    };
    double x[K], want[K];
    for (int i = 0; i < K; i++)
        x[i] = (float)((i - K / 2) * 0.11);
    x[0] = -1e-7, x[1] = 1e-7, x[2] = 0, x[3] = 0.5, x[4] = 1, x[5] = 60;
    const int64_t s[] = {K};
    struct {
        const char *op;
        double (*f)(double, double);
        double a;
        const char *attr;
    } cases[] = {{"Mish", f_mish, 0, NULL},
                 {"Selu", f_selu, 0, NULL},
                 {"Celu", f_celu, 1, NULL},
                 {"Celu", f_celu, 2, "alpha"},
                 {"Softsign", f_softsign, 0, NULL},
                 {"ThresholdedRelu", f_thr, 1, NULL},
                 {"ThresholdedRelu", f_thr, 0.5, "alpha"}};
    for (int dt = 0; dt < 2; dt++) {
        kiln_tensor *xt = mk(dev, dt ? KILN_F64 : KILN_F32, 1, s, x);
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            pb at = {.n = 0};
            if (cases[c].attr)
                attr_float(&at, cases[c].attr, (float)cases[c].a);
            for (int i = 0; i < K; i++)
                want[i] = cases[c].f(x[i], cases[c].a);
            char what[64];
            snprintf(what, sizeof what, "%s %s %s", cases[c].op, dt ? "f64" : "f32", cases[c].attr ? "alpha" : "");
            double w = expect(what, run_node(dev, 18, cases[c].op, "act", 1, &xt, &at, err, sizeof err), err,
                              dt ? KILN_F64 : KILN_F32, 1, s, want, dt ? 1e-12 : 1e-6, 1e-300);
            printf("  %-28s max rel diff %.3g\n", what, w);
        }
        kiln_tensor_release(xt);
    }
    kiln_tensor *xi = mk(dev, KILN_I32, 1, s, x);
    expect_fail("Mish i32", run_node(dev, 18, "Mish", "bad_act", 1, &xi, NULL, err, sizeof err), err, "bad_act",
                (const char *[]){"float tensor", "i32", NULL});
    kiln_tensor_release(xi);
}

/* ------------------------------------------------------------- trigonometry */

static void test_trig(kiln_device *dev)
{
    enum {
        K = 4096
    };
    static double x[K], want[K];
    struct {
        const char *op;
        double (*f)(double);
        double lo, hi; /* the magnitudes swept, log-spaced, both signs when lo < 0 ... */
        bool both;     /* ... and negative ones too */
        double e0, e1; /* edges added: e0 and its neighbours, e1 and its neighbours */
    } cases[] = {
        {"Sinh", sinh, 1e-30, 89.4, true, 0, 20},
        {"Cosh", cosh, 1e-30, 89.4, true, 0, 20},
        {"Tan", tan, 1e-30, 1e4, true, 1.5707963267948966, 3.14159265358979},
        {"Asinh", asinh, 1e-30, 1e30, true, 0, 268435456.0},
        {"Acosh", acosh, 1, 1e30, false, 1, 268435456.0},
        {"Atanh", atanh, 1e-30, 1, true, 0, 1},
        {"Atan", atan, 1e-30, 1e30, true, 0.66, 2.41421356237309504880},
        {"Asin", asin, 1e-30, 1, true, 0, 1},
        {"Acos", acos, 1e-30, 1, true, 0, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (int dt = 0; dt < 2; dt++) {
            kiln_dtype kd = dt ? KILN_F64 : KILN_F32;
            int k = 0;
            double lg0 = log(cases[c].lo), lg1 = log(cases[c].hi);
            for (int i = 0; i < 1800; i++) {
                double v = exp(lg0 + (lg1 - lg0) * i / 1799.0);
                if (i == 1799)
                    v = cases[c].hi;
                if (!dt)
                    v = (float)v;
                if (v > cases[c].hi) /* rounding to f32 may step past the domain's end */
                    v = dt ? v : nextafterf((float)v, 0);
                x[k++] = v;
                if (cases[c].both)
                    x[k++] = -v;
            }
            for (int e = 0; e < 2; e++) {
                double v = e ? cases[c].e1 : cases[c].e0;
                double vf = dt ? v : (float)v;
                double up = dt ? nextafter(vf, INFINITY) : nextafterf((float)vf, INFINITY);
                double dn = dt ? nextafter(vf, -INFINITY) : nextafterf((float)vf, -INFINITY);
                x[k++] = vf, x[k++] = up, x[k++] = dn;
                if (cases[c].both)
                    x[k++] = -vf, x[k++] = -up, x[k++] = -dn;
            }
            for (int i = 0; i < 40; i++) /* uniform over [-1, 1] (a part of most domains) */
                x[k++] = dt ? -1 + i / 19.5 : (float)(-1 + i / 19.5);
            for (int i = 0; i < k; i++)
                want[i] = cases[c].f(x[i]);
            /* cases[c].f gives NaN outside the domain, which the run must give too */
            const int64_t s[] = {k};
            kiln_tensor *xt = mk(dev, kd, 1, s, x);
            char what[64];
            snprintf(what, sizeof what, "%s %s", cases[c].op, dt ? "f64" : "f32");
            double w = expect(what, run_node(dev, 18, cases[c].op, "tr", 1, &xt, NULL, err, sizeof err), err, kd,
                              1, s, want, 1e-6, 0);
            printf("  %-28s max rel diff %.3g over %d points\n", what, w, k);
            kiln_tensor_release(xt);
        }
    /* outside the domains: NaN, as libm; and integers refused */
    const double out[] = {0.5, -2, 1.5, -1.5};
    kiln_tensor *ot = mk(dev, KILN_F32, 1, (const int64_t[]){4}, out);
    const double nan4[] = {NAN, NAN, NAN, NAN};
    kiln_tensor *lo = mk(dev, KILN_F32, 1, (const int64_t[]){2}, out);
    expect("Acosh below 1", run_node(dev, 18, "Acosh", "tr", 1, &lo, NULL, err, sizeof err), err, KILN_F32, 1,
           (const int64_t[]){2}, nan4, 0, 0);
    kiln_tensor_release(lo);
    expect("Asin outside [-1, 1]", run_node(dev, 18, "Asin", "tr", 1, &ot, NULL, err, sizeof err), err, KILN_F32,
           1, (const int64_t[]){4}, (const double[]){asin(0.5), NAN, NAN, NAN}, 1e-6, 0);
    expect("Atanh outside [-1, 1]", run_node(dev, 18, "Atanh", "tr", 1, &ot, NULL, err, sizeof err), err, KILN_F32,
           1, (const int64_t[]){4}, (const double[]){atanh(0.5), NAN, NAN, NAN}, 1e-6, 0);
    kiln_tensor *it = mk(dev, KILN_I64, 1, (const int64_t[]){2}, out);
    expect_fail("Atan i64", run_node(dev, 18, "Atan", "bad_tr", 1, &it, NULL, err, sizeof err), err, "bad_tr",
                (const char *[]){"float tensor", NULL});
    kiln_tensor_release(ot);
    kiln_tensor_release(it);
}

int main(int argc, char **argv)
{
    const char *specs[] = {"cpu", "ref"};
    int n = argc > 1 ? argc - 1 : 2;
    for (int i = 0; i < n; i++) {
        const char *spec = argc > 1 ? argv[i + 1] : specs[i];
        kiln_device *dev = kiln_device_open(spec);
        CHECK(dev, "open %s: %s", spec, kiln_error());
        if (!dev)
            continue;
        printf("%s:\n", spec);
        test_scatter(dev);
        test_prelu(dev);
        test_reduce(dev);
        test_depth_space(dev);
        test_activations(dev);
        test_trig(dev);
        kiln_device_close(dev);
    }
    printf("onnx_more: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
