/*
 * onnx_spec.c — operator cases the ONNX spec defines and kiln once got wrong, each a graph of
 * one or a few nodes built here byte by byte, run on cpu and ref:
 *
 *     onnx_spec [DEVICE...]      (cpu and ref when none is named)
 *
 * - LayerNormalization's optional Mean and InvStdDev outputs (f32 whatever x is, the
 *   normalized dims kept as 1) were never made: every run failed "output 'm' was not computed";
 * - integer Div by zero gave INT64_MAX and integer Mod by zero 0; ONNX Runtime fails, and so
 *   must kiln, naming the node;
 * - OneHot refused indices outside [-depth, depth-1], where ONNX gives a row of off_value
 *   (and wraps [-depth, -1], which it did);
 * - an output a node should make but did not is named with that node.
 *
 * The expected numbers are ONNX Runtime 1.32's on the same graphs and inputs.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "onnx-pb.h"

static int failures;
#define CHECK(cond, ...)                                                                                          \
    do {                                                                                                          \
        if (!(cond)) {                                                                                            \
            failures++;                                                                                           \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                  \
            fprintf(stderr, __VA_ARGS__);                                                                         \
            fprintf(stderr, "\n");                                                                                \
        }                                                                                                         \
    } while (0)

/* ------------------------------------------------------------- protobuf bytes */

/* (the writer: onnx-pb.h) */

/* ONNX TensorProto data types */
enum {
    T_FLOAT = 1,
    T_INT32 = 6,
    T_INT64 = 7,
    T_FLOAT16 = 10
};

/* A graph input: ValueInfoProto with its type and shape. */
static void g_input(pb *g, const char *name, int type, int ndim, const int64_t *dims)
{
    pb shape = {.n = 0}, tt = {.n = 0}, ty = {.n = 0}, vi = {.n = 0};
    for (int i = 0; i < ndim; i++) {
        pb d = {.n = 0};
        pb_int(&d, 1, (uint64_t)dims[i]);
        pb_msg(&shape, 1, &d);
    }
    pb_int(&tt, 1, (uint64_t)type);
    pb_msg(&tt, 2, &shape);
    pb_msg(&ty, 1, &tt);
    pb_str(&vi, 1, name);
    pb_msg(&vi, 2, &ty);
    pb_msg(g, 11, &vi);
}

/* An initializer: TensorProto with raw data. */
static void g_init(pb *g, const char *name, int type, int ndim, const int64_t *dims, const void *data, size_t n)
{
    pb t = {.n = 0};
    for (int i = 0; i < ndim; i++)
        pb_int(&t, 1, (uint64_t)dims[i]);
    pb_int(&t, 2, (uint64_t)type);
    pb_str(&t, 8, name);
    pb_bytes(&t, 9, data, n);
    pb_msg(g, 5, &t);
}

static void g_output(pb *g, const char *name)
{
    pb o = {.n = 0};
    pb_str(&o, 1, name);
    pb_msg(g, 12, &o);
}

/* An int attribute, appended to a node's attribute list. */
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

/* ins and outs NULL-ended; "" is an absent one. attrs: attribute fields (attr_*) or NULL. */
static void g_node(pb *g, const char *op, const char *name, const char *const *ins, const char *const *outs,
                   const pb *attrs)
{
    pb n = {.n = 0};
    for (int i = 0; ins[i]; i++)
        pb_str(&n, 1, ins[i]);
    for (int i = 0; outs[i]; i++)
        pb_str(&n, 2, outs[i]);
    pb_str(&n, 3, name);
    pb_str(&n, 4, op);
    if (attrs) {
        memcpy(n.b + n.n, attrs->b, attrs->n);
        n.n += attrs->n;
    }
    pb_msg(g, 1, &n);
}

static kiln_onnx_model *load(const pb *g, kiln_device *dev)
{
    static pb model;
    pb opset = {.n = 0};
    model.n = 0;
    pb_int(&model, 1, 8);
    pb_int(&opset, 2, 17);
    pb_msg(&model, 8, &opset);
    pb_msg(&model, 7, g);
    kiln_onnx_model *m = kiln_onnx_load_memory(model.b, model.n, dev, NULL);
    CHECK(m, "load: %s", kiln_error());
    return m;
}

/* ----------------------------------------------------------------- checking */

/* out: f32 (or cast to it) of the given shape holding want within tol. */
static void expect(const char *what, kiln_tensor *out, kiln_dtype dt, int ndim, const int64_t *shape,
                   const float *want, double tol)
{
    CHECK(out, "%s: no output", what);
    if (!out)
        return;
    char d[160];
    kiln_tensor_describe(out, d, sizeof d);
    bool same = kiln_tensor_dtype(out) == dt && kiln_tensor_ndim(out) == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = kiln_tensor_dim(out, i) == shape[i];
    CHECK(same, "%s: got %s", what, d);
    if (!same)
        return;
    int64_t n = kiln_tensor_numel(out);
    float got[64] = {0};
    kiln_tensor *f = kiln_cast(out, KILN_F32);
    CHECK(n <= 64 && f && kiln_to_data(f, got, (size_t)n * sizeof *got) == 0, "%s: read: %s", what, kiln_error());
    kiln_tensor_release(f);
    for (int64_t i = 0; i < n && i < 64; i++)
        CHECK(got[i] == want[i] || fabs((double)got[i] - want[i]) <= tol, "%s[%lld]: %.9g, want %.9g", what,
              (long long)i, got[i], want[i]);
}

/* A run that must fail with every needle (NULL-ended) in its message. */
static void expect_fail(const char *what, kiln_onnx_model *m, int nin, const char *const *names,
                        kiln_tensor *const *ins, const char *const *needles)
{
    kiln_tensor *out[3] = {NULL, NULL, NULL};
    int no = kiln_onnx_output_count(m) < 3 ? kiln_onnx_output_count(m) : 3;
    kiln_error_clear();
    int rc = kiln_onnx_run(m, nin, names, ins, no, out);
    CHECK(rc != 0, "%s: the run succeeded", what);
    for (int i = 0; rc != 0 && needles[i]; i++)
        CHECK(strstr(kiln_error(), needles[i]), "%s: error \"%s\" lacks \"%s\"", what, kiln_error(), needles[i]);
    for (int i = 0; i < no; i++)
        kiln_tensor_release(out[i]);
}

static float xs(int i)
{
    return (float)((i * 7) % 11 - 5) * 0.37f;
}

/* ---------------------------------------------------- LayerNormalization */

static void test_layer_norm(kiln_device *dev)
{
    /* A: axis 1 of [2, 3, 4] with scale and bias, all three outputs */
    pb g = {.n = 0}, at = {.n = 0};
    float x[24], w[12], b[12];
    for (int i = 0; i < 24; i++)
        x[i] = xs(i);
    for (int j = 0; j < 12; j++) {
        w[j] = 1.0f + 0.1f * (float)j;
        b[j] = 0.05f * (float)j - 0.2f;
    }
    g_input(&g, "x", T_FLOAT, 3, (const int64_t[]){2, 3, 4});
    g_init(&g, "w", T_FLOAT, 2, (const int64_t[]){3, 4}, w, sizeof w);
    g_init(&g, "b", T_FLOAT, 2, (const int64_t[]){3, 4}, b, sizeof b);
    attr_int(&at, "axis", 1);
    g_node(&g, "LayerNormalization", "ln", (const char *[]){"x", "w", "b", NULL},
           (const char *[]){"y", "m", "r", NULL}, &at);
    g_output(&g, "y");
    g_output(&g, "m");
    g_output(&g, "r");
    kiln_onnx_model *m = load(&g, dev);
    kiln_tensor *xt = kiln_from_data(dev, KILN_F32, 3, (const int64_t[]){2, 3, 4}, x, sizeof x);
    kiln_tensor *out[3] = {0};
    if (m && kiln_onnx_run(m, 1, (const char *[]){"x"}, &xt, 3, out) == 0) {
        static const float y[24] = {-1.57714903f,   0.648746431f,  -0.670890808f, 2.06580138f,   0.595929921f,
                                    -1.11431682f,   2.22331333f,   0.362832099f,  -1.73802412f,  2.20054388f,
                                    -0.0505470037f, -2.54201269f,  0.395681083f,  -0.924385369f, 1.78451836f,
                                    0.30199334f,    -1.44046497f,  1.91827226f,   0.0133554954f, -2.15149498f,
                                    1.85707641f,    -0.470232546f, -3.05747485f,  1.60093021f};
        expect("LN A y", out[0], KILN_F32, 3, (const int64_t[]){2, 3, 4}, y, 1e-5);
        expect("LN A mean", out[1], KILN_F32, 3, (const int64_t[]){2, 1, 1},
               (const float[]){-0.154166669f, 0.0616666675f}, 1e-5);
        expect("LN A invstddev", out[2], KILN_F32, 3, (const int64_t[]){2, 1, 1},
               (const float[]){0.812077999f, 0.878153861f}, 1e-5);
    } else {
        CHECK(0, "LN A run: %s", kiln_error());
    }
    for (int i = 0; i < 3; i++)
        kiln_tensor_release(out[i]);
    kiln_tensor_release(xt);
    kiln_onnx_free(m);

    /* B: f16 x, only Mean a graph output (Y read by nothing): Mean is f32, as stash_type says */
    g.n = 0;
    uint16_t ones16[4];
    kiln_tensor *one = kiln_full(dev, KILN_F16, 1, (const int64_t[]){4}, 1.0);
    kiln_to_data(one, ones16, sizeof ones16);
    kiln_tensor_release(one);
    g_input(&g, "x", T_FLOAT16, 2, (const int64_t[]){2, 4});
    g_init(&g, "w", T_FLOAT16, 1, (const int64_t[]){4}, ones16, sizeof ones16);
    g_node(&g, "LayerNormalization", "ln", (const char *[]){"x", "w", NULL}, (const char *[]){"y", "m", NULL},
           NULL);
    g_output(&g, "m");
    m = load(&g, dev);
    kiln_tensor *x32 = kiln_from_data(dev, KILN_F32, 2, (const int64_t[]){2, 4}, x, 8 * sizeof *x);
    xt = kiln_cast(x32, KILN_F16);
    out[0] = NULL;
    if (m && kiln_onnx_run(m, 1, (const char *[]){"x"}, &xt, 1, out) == 0)
        expect("LN B mean", out[0], KILN_F32, 2, (const int64_t[]){2, 1}, (const float[]){0.0f, 0.185058609f},
               1e-5);
    else
        CHECK(0, "LN B run: %s", kiln_error());
    kiln_tensor_release(out[0]);
    kiln_tensor_release(xt);
    kiln_onnx_free(m);

    /* C: InvStdDev without Mean (its output named ""), epsilon 0.5 */
    g.n = 0;
    at.n = 0;
    float w4[4] = {1, 1, 1, 1};
    g_input(&g, "x", T_FLOAT, 2, (const int64_t[]){2, 4});
    g_init(&g, "w", T_FLOAT, 1, (const int64_t[]){4}, w4, sizeof w4);
    attr_float(&at, "epsilon", 0.5f);
    g_node(&g, "LayerNormalization", "ln", (const char *[]){"x", "w", NULL}, (const char *[]){"y", "", "r", NULL},
           &at);
    g_output(&g, "y");
    g_output(&g, "r");
    m = load(&g, dev);
    out[0] = out[1] = NULL;
    if (m && kiln_onnx_run(m, 1, (const char *[]){"x"}, &x32, 2, out) == 0) {
        static const float y[8] = {-1.17355704f, 0.469422758f, -0.469422817f, 1.17355692f,
                                   0.158891976f, -1.11224389f, 1.11224389f,   -0.158891976f};
        expect("LN C y", out[0], KILN_F32, 2, (const int64_t[]){2, 4}, y, 1e-5);
        expect("LN C invstddev", out[1], KILN_F32, 2, (const int64_t[]){2, 1},
               (const float[]){0.634355128f, 0.858875513f}, 1e-5);
    } else {
        CHECK(0, "LN C run: %s", kiln_error());
    }
    kiln_tensor_release(out[0]);
    kiln_tensor_release(out[1]);
    kiln_tensor_release(x32);
    kiln_onnx_free(m);
}

/* ------------------------------------------------------- Div and Mod by zero */

/* Div, Mod and Mod fmod=1 of a by b, each its own graph output. */
static kiln_onnx_model *div_mod_model(kiln_device *dev, int type, int64_t n)
{
    pb g = {.n = 0}, at = {.n = 0};
    g_input(&g, "a", type, 1, &n);
    g_input(&g, "b", type, 1, &n);
    g_node(&g, "Div", "dz", (const char *[]){"a", "b", NULL}, (const char *[]){"y", NULL}, NULL);
    g_node(&g, "Mod", "mz", (const char *[]){"a", "b", NULL}, (const char *[]){"z", NULL}, NULL);
    attr_int(&at, "fmod", 1);
    g_node(&g, "Mod", "fz", (const char *[]){"a", "b", NULL}, (const char *[]){"f", NULL}, &at);
    g_output(&g, "y");
    g_output(&g, "z");
    g_output(&g, "f");
    return load(&g, dev);
}

/* One graph output: op of a by b. */
static kiln_onnx_model *binary_model(kiln_device *dev, const char *op, const char *name, int type, int64_t n,
                                     bool fmod)
{
    pb g = {.n = 0}, at = {.n = 0};
    g_input(&g, "a", type, 1, &n);
    g_input(&g, "b", type, 1, &n);
    if (fmod)
        attr_int(&at, "fmod", 1);
    g_node(&g, op, name, (const char *[]){"a", "b", NULL}, (const char *[]){"y", NULL}, fmod ? &at : NULL);
    g_output(&g, "y");
    return load(&g, dev);
}

static void test_div_mod(kiln_device *dev)
{
    const char *names[] = {"a", "b"};
    /* i32 (the device path): truncating Div, Python and C remainders, no zero */
    kiln_onnx_model *m = div_mod_model(dev, T_INT32, 5);
    int32_t a[5] = {7, -7, 7, -7, 9}, b[5] = {2, 2, -2, -3, 4};
    kiln_tensor *ins[2] = {kiln_from_data(dev, KILN_I32, 1, (const int64_t[]){5}, a, sizeof a),
                           kiln_from_data(dev, KILN_I32, 1, (const int64_t[]){5}, b, sizeof b)};
    kiln_tensor *out[3] = {0};
    if (m && kiln_onnx_run(m, 2, names, ins, 3, out) == 0) {
        const int64_t five[1] = {5};
        expect("Div i32", out[0], KILN_I32, 1, five, (const float[]){3, -3, -3, 2, 2}, 0);
        expect("Mod i32", out[1], KILN_I32, 1, five, (const float[]){1, 1, -1, -1, 1}, 0);
        expect("Mod fmod i32", out[2], KILN_I32, 1, five, (const float[]){1, -1, 1, -1, 1}, 0);
    } else {
        CHECK(0, "Div/Mod i32 run: %s", kiln_error());
    }
    for (int i = 0; i < 3; i++)
        kiln_tensor_release(out[i]);
    kiln_tensor_release(ins[1]);
    kiln_onnx_free(m);

    /* a zero divisor: i32 (device path), i64 [3] (shape values, on the host), i64 [70] */
    b[3] = 0;
    ins[1] = kiln_from_data(dev, KILN_I32, 1, (const int64_t[]){5}, b, sizeof b);
    int64_t a64[70], b64[70];
    for (int i = 0; i < 70; i++) {
        a64[i] = i - 35;
        b64[i] = i == 69 ? 0 : (i % 5) + 1;
    }
    kiln_tensor *small[2] = {kiln_from_data(dev, KILN_I64, 1, (const int64_t[]){3}, (int64_t[]){7, -7, 5}, 24),
                             kiln_from_data(dev, KILN_I64, 1, (const int64_t[]){3}, (int64_t[]){2, 2, 0}, 24)};
    kiln_tensor *big[2] = {kiln_from_data(dev, KILN_I64, 1, (const int64_t[]){70}, a64, sizeof a64),
                           kiln_from_data(dev, KILN_I64, 1, (const int64_t[]){70}, b64, sizeof b64)};
    struct {
        const char *op, *name, *needle;
        bool fmod;
    } cases[] = {{"Div", "dz", "integer division by zero", false},
                 {"Mod", "mz", "integer modulo by zero", false},
                 {"Mod", "fz", "integer modulo by zero", true}};
    for (int c = 0; c < 3; c++) {
        char node[64];
        snprintf(node, sizeof node, "node '%s' (%s)", cases[c].name, cases[c].op);
        const char *needles[] = {node, cases[c].needle, NULL};
        m = binary_model(dev, cases[c].op, cases[c].name, T_INT32, 5, cases[c].fmod);
        if (m)
            expect_fail("i32 by zero", m, 2, names, ins, needles);
        kiln_onnx_free(m);
        m = binary_model(dev, cases[c].op, cases[c].name, T_INT64, 3, cases[c].fmod);
        if (m)
            expect_fail("i64 [3] by zero", m, 2, names, small, needles);
        kiln_onnx_free(m);
        m = binary_model(dev, cases[c].op, cases[c].name, T_INT64, 70, cases[c].fmod);
        if (m)
            expect_fail("i64 [70] by zero", m, 2, names, big, needles);
        kiln_onnx_free(m);
    }
    /* float division by zero stays IEEE's */
    m = binary_model(dev, "Div", "df", T_FLOAT, 2, false);
    kiln_tensor *fl[2] = {kiln_from_data(dev, KILN_F32, 1, (const int64_t[]){2}, (float[]){1, -2}, 8),
                          kiln_from_data(dev, KILN_F32, 1, (const int64_t[]){2}, (float[]){0, 4}, 8)};
    out[0] = NULL;
    if (m && kiln_onnx_run(m, 2, names, fl, 1, out) == 0)
        expect("Div f32 by zero", out[0], KILN_F32, 1, (const int64_t[]){2}, (const float[]){INFINITY, -0.5f}, 0);
    else
        CHECK(0, "Div f32 run: %s", kiln_error());
    kiln_tensor_release(out[0]);
    kiln_onnx_free(m);
    for (int i = 0; i < 2; i++) {
        kiln_tensor_release(ins[i]);
        kiln_tensor_release(small[i]);
        kiln_tensor_release(big[i]);
        kiln_tensor_release(fl[i]);
    }
}

/* ----------------------------------------------------------------- OneHot */

static void test_one_hot(kiln_device *dev)
{
    /* indices in range, wrapped (-1, -4) and outside [-4, 3] (5, -5), off -1, on 3 */
    static const float want[3][24] = {
        {3, -1, -1, -1, -1, -1, 3, -1, -1, -1, -1, 3, -1, -1, -1, -1, 3, -1, -1, -1, -1, -1, -1, -1},
        {3, -1, -1, -1, 3, -1, -1, -1, -1, -1, -1, -1, -1, 3, -1, -1, -1, -1, -1, -1, 3, -1, -1, -1},
        {3, -1, -1, -1, -1, -1, -1, 3, -1, -1, -1, 3, -1, 3, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1}};
    static const int64_t shapes[3][3] = {{2, 3, 4}, {4, 2, 3}, {2, 4, 3}};
    const int axes[3] = {-1, 0, 1};
    int64_t idx[6] = {0, 2, -1, 5, -4, -5}, depth = 4;
    float values[2] = {-1, 3};
    kiln_tensor *it = kiln_from_data(dev, KILN_I64, 2, (const int64_t[]){2, 3}, idx, sizeof idx);
    for (int k = 0; k < 3; k++) {
        pb g = {.n = 0}, at = {.n = 0};
        g_input(&g, "i", T_INT64, 2, (const int64_t[]){2, 3});
        g_init(&g, "d", T_INT64, 1, (const int64_t[]){1}, &depth, sizeof depth);
        g_init(&g, "v", T_FLOAT, 1, (const int64_t[]){2}, values, sizeof values);
        attr_int(&at, "axis", axes[k]);
        g_node(&g, "OneHot", "oh", (const char *[]){"i", "d", "v", NULL}, (const char *[]){"y", NULL}, &at);
        g_output(&g, "y");
        kiln_onnx_model *m = load(&g, dev);
        kiln_tensor *out[1] = {NULL};
        char what[32];
        snprintf(what, sizeof what, "OneHot axis %d", axes[k]);
        if (m && kiln_onnx_run(m, 1, (const char *[]){"i"}, &it, 1, out) == 0)
            expect(what, out[0], KILN_F32, 3, shapes[k], want[k], 0);
        else
            CHECK(0, "%s run: %s", what, kiln_error());
        kiln_tensor_release(out[0]);
        kiln_onnx_free(m);
    }
    kiln_tensor_release(it);
}

/* ------------------------------------------- an output a node did not make */

/* A Relu declared with two outputs makes one; the second, a graph output, is missing: the error
 * names the node, whether it runs with the graph or was folded as a constant at load. */
static void test_missing_output(kiln_device *dev)
{
    float v[2] = {-1, 2};
    for (int folded = 0; folded < 2; folded++) {
        pb g = {.n = 0};
        if (folded)
            g_init(&g, "x", T_FLOAT, 1, (const int64_t[]){2}, v, sizeof v);
        else
            g_input(&g, "x", T_FLOAT, 1, (const int64_t[]){2});
        g_node(&g, "Relu", "r2", (const char *[]){"x", NULL}, (const char *[]){"y", "z", NULL}, NULL);
        g_output(&g, "z");
        kiln_onnx_model *m = load(&g, dev);
        kiln_tensor *x = kiln_from_data(dev, KILN_F32, 1, (const int64_t[]){2}, v, sizeof v);
        if (m)
            expect_fail(folded ? "missing output (folded)" : "missing output", m, folded ? 0 : 1,
                        (const char *[]){"x"}, &x, (const char *[]){"node 'r2' (Relu)", "'z'", NULL});
        kiln_tensor_release(x);
        kiln_onnx_free(m);
    }
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
        test_layer_norm(dev);
        test_div_mod(dev);
        test_one_hot(dev);
        test_missing_output(dev);
        kiln_device_close(dev);
    }
    printf("onnx_spec: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
