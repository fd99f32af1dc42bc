/*
 * onnx_inputs.c — what kiln_onnx_run and kiln_onnx_load refuse, and values past 2^53:
 *
 *     onnx_inputs FIXTURES_DIR
 *
 * Inputs of another dtype than the graph declares (an image as i64, token ids as f32) once
 * ran to wrong or differently typed results, an input named twice ran with one of them, and
 * a directory loaded as "malformed model: no graph". A model built here checks that Slice
 * with INT64_MAX/INT64_MIN steps and int64 constants at INT64_MAX come out exact.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* kiln_onnx_run must fail with a message holding every one of the needles (NULL-ended). */
static void expect_refused(kiln_onnx_model *m, int n, const char *const *names, kiln_tensor *const *ins,
                           const char *const *needles)
{
    kiln_tensor *out[1] = {NULL};
    kiln_error_clear();
    int rc = kiln_onnx_run(m, n, names, ins, 1, out);
    CHECK(rc != 0 && !out[0], "run with bad inputs succeeded");
    for (int i = 0; rc != 0 && needles[i]; i++)
        CHECK(strstr(kiln_error(), needles[i]), "error \"%s\" lacks \"%s\"", kiln_error(), needles[i]);
    kiln_tensor_release(out[0]);
}

/* max |a - b| of two f32 tensors of one shape, or INFINITY */
static double max_diff(kiln_tensor *a, kiln_tensor *b)
{
    kiln_scope_begin();
    kiln_tensor *d = kiln_max(kiln_abs(kiln_sub(kiln_cast(a, KILN_F32), kiln_cast(b, KILN_F32))), KILN_ALL_DIMS,
                              false);
    double v = d ? kiln_item(d) : INFINITY;
    kiln_scope_end();
    return v;
}

static void test_cnn(const char *dir, kiln_device *dev)
{
    char p[512], q[512];
    snprintf(p, sizeof p, "%s/cnn.onnx", dir);
    snprintf(q, sizeof q, "%s/cnn.b1.io.safetensors", dir);
    kiln_onnx_model *m = kiln_onnx_load(p, dev, NULL);
    kiln_safetensors *io = kiln_safetensors_open(q);
    CHECK(m && io, "load cnn: %s", kiln_error());
    if (!m || !io) {
        kiln_onnx_free(m);
        kiln_safetensors_close(io);
        return;
    }
    kiln_tensor *x = kiln_safetensors_load(io, "in.x", dev), *want = kiln_safetensors_load(io, "out.logits", dev);
    const char *names[] = {"x", "x"};
    const kiln_dtype bad[] = {KILN_I64, KILN_F64, KILN_F16, KILN_BOOL};
    for (int i = 0; i < 4; i++) {
        kiln_tensor *xb = kiln_cast(x, bad[i]);
        char given[32];
        snprintf(given, sizeof given, "is %s;", kiln_dtype_name(bad[i]));
        expect_refused(m, 1, names, &xb, (const char *[]){"input 'x'", given, "declares f32", NULL});
        kiln_tensor_release(xb);
    }
    kiln_tensor *two[2] = {x, x};
    expect_refused(m, 2, names, two, (const char *[]){"input 'x' given twice", NULL});
    kiln_tensor *none[1] = {NULL};
    expect_refused(m, 1, names, none, (const char *[]){"input 'x' is NULL", NULL});
    /* a misspelt name alone, and an unknown one beside the right one: each refused by name */
    const char *misspelt[] = {"z"}, *extra[] = {"x", "z"};
    expect_refused(m, 1, misspelt, &x, (const char *[]){"'z' is not an input of the model (its inputs: x)", NULL});
    kiln_tensor *beside[2] = {x, x};
    expect_refused(m, 2, extra, beside, (const char *[]){"'z' is not an input of the model", NULL});
    /* the right input still runs to the reference numbers, twice */
    for (int r = 0; r < 2; r++) {
        kiln_tensor *out[1] = {NULL};
        int rc = kiln_onnx_run(m, 1, names, &x, 1, out);
        CHECK(rc == 0 && max_diff(out[0], want) < 1e-5, "cnn run %d: rc %d, %s", r, rc, kiln_error());
        kiln_tensor_release(out[0]);
    }
    kiln_tensor_release(x);
    kiln_tensor_release(want);
    kiln_safetensors_close(io);
    kiln_onnx_free(m);
}

static void test_encoder(const char *dir, kiln_device *dev)
{
    char p[512], q[512];
    snprintf(p, sizeof p, "%s/encoder.onnx", dir);
    snprintf(q, sizeof q, "%s/encoder.io.safetensors", dir);
    kiln_onnx_model *m = kiln_onnx_load(p, dev, NULL);
    kiln_safetensors *io = kiln_safetensors_open(q);
    CHECK(m && io, "load encoder: %s", kiln_error());
    if (!m || !io) {
        kiln_onnx_free(m);
        kiln_safetensors_close(io);
        return;
    }
    kiln_tensor *ids = kiln_safetensors_load(io, "in.ids", dev), *mask = kiln_safetensors_load(io, "in.mask", dev);
    kiln_tensor *want = kiln_safetensors_load(io, "out.h", dev);
    const char *names[] = {kiln_onnx_input_name(m, 0), kiln_onnx_input_name(m, 1)};
    CHECK(!strcmp(names[0], "ids"), "encoder's first input is ids, not %s", names[0]);
    kiln_tensor *fids = kiln_cast(ids, KILN_F32);
    expect_refused(m, 2, names, (kiln_tensor *[]){fids, mask},
                   (const char *[]){"input 'ids' is f32; the model declares i64", NULL});
    kiln_tensor *out[1] = {NULL};
    int rc = kiln_onnx_run(m, 2, names, (kiln_tensor *[]){ids, mask}, 1, out);
    CHECK(rc == 0 && max_diff(out[0], want) < 1e-5, "encoder run: rc %d, %s", rc, kiln_error());
    kiln_tensor_release(out[0]);
    kiln_tensor_release(fids);
    kiln_tensor_release(ids);
    kiln_tensor_release(mask);
    kiln_tensor_release(want);
    kiln_safetensors_close(io);
    kiln_onnx_free(m);
}

static void test_load_errors(kiln_device *dev)
{
    char tmp[] = "/tmp/kiln-onnx-dir-XXXXXX";
    CHECK(mkdtemp(tmp), "mkdtemp");
    kiln_error_clear();
    CHECK(!kiln_onnx_load(tmp, dev, NULL) && strstr(kiln_error(), "cannot open") && strstr(kiln_error(), tmp) &&
              strstr(kiln_error(), "not a regular file"),
          "a directory: %s", kiln_error());
    rmdir(tmp);
    CHECK(!kiln_onnx_load(tmp, dev, NULL) && strstr(kiln_error(), "cannot open") &&
              strstr(kiln_error(), "No such file or directory"),
          "a missing file: %s", kiln_error());
}

/* ---------------------------------------------- a model built byte by byte */

/* (the writer: onnx-pb.h) */

/* TensorProto: int64 [1] holding v */
static pb i64_tensor(const char *name, int64_t v)
{
    pb t = {.n = 0};
    pb_int(&t, 1, 1);
    pb_int(&t, 2, 7);
    if (name)
        pb_str(&t, 8, name);
    pb_bytes(&t, 9, &v, sizeof v);
    return t;
}

static pb node(const char *op, const char *const *ins, int nin, const char *out, const pb *attr)
{
    pb n = {.n = 0};
    for (int i = 0; i < nin; i++)
        pb_str(&n, 1, ins[i]);
    pb_str(&n, 2, out);
    pb_str(&n, 3, out);
    pb_str(&n, 4, op);
    if (attr)
        pb_msg(&n, 5, attr);
    return n;
}

static void test_int64_edges(kiln_device *dev)
{
    const int64_t max = INT64_MAX, min = INT64_MIN;
    pb g = {.n = 0};
    /* x: f32 [2, 3] */
    pb dim2 = {.n = 0}, dim3 = {.n = 0}, shape = {.n = 0}, tt = {.n = 0}, ty = {.n = 0}, vi = {.n = 0};
    pb_int(&dim2, 1, 2);
    pb_int(&dim3, 1, 3);
    pb_msg(&shape, 1, &dim2);
    pb_msg(&shape, 1, &dim3);
    pb_int(&tt, 1, 1);
    pb_msg(&tt, 2, &shape);
    pb_msg(&ty, 1, &tt);
    pb_str(&vi, 1, "x");
    pb_msg(&vi, 2, &ty);
    const char *inits[] = {"s0", "emax", "ax", "pmax", "sm1", "emin", "pmin", "three"};
    const int64_t initv[] = {0, max, 1, max, -1, min, min, 3};
    for (int i = 0; i < 8; i++) {
        pb t = i64_tensor(inits[i], initv[i]);
        pb_msg(&g, 5, &t);
    }
    /* a[:, ::huge] and a[:, ::-huge] (the last column) */
    pb n1 = node("Slice", (const char *[]){"x", "s0", "emax", "ax", "pmax"}, 5, "y_step", NULL);
    pb n2 = node("Slice", (const char *[]){"x", "sm1", "emin", "ax", "pmin"}, 5, "y_back", NULL);
    pb aint = {.n = 0}, aval = {.n = 0};
    pb_str(&aint, 1, "value_int");
    pb_int(&aint, 20, 2);
    pb_int(&aint, 3, (uint64_t)max);
    pb n3 = node("Constant", NULL, 0, "c_max", &aint);
    pb vt = i64_tensor(NULL, max);
    pb_str(&aval, 1, "value");
    pb_int(&aval, 20, 4);
    pb_msg(&aval, 5, &vt);
    pb n4 = node("ConstantOfShape", (const char *[]){"three"}, 1, "z_max", &aval);
    pb_msg(&g, 1, &n1);
    pb_msg(&g, 1, &n2);
    pb_msg(&g, 1, &n3);
    pb_msg(&g, 1, &n4);
    pb_str(&g, 2, "edges");
    pb_msg(&g, 11, &vi);
    const char *outs[] = {"y_step", "y_back", "c_max", "z_max"};
    for (int i = 0; i < 4; i++) {
        pb o = {.n = 0};
        pb_str(&o, 1, outs[i]);
        pb_msg(&g, 12, &o);
    }
    pb model = {.n = 0}, opset = {.n = 0};
    pb_int(&model, 1, 8);
    pb_int(&opset, 2, 17);
    pb_msg(&model, 8, &opset);
    pb_msg(&model, 7, &g);

    kiln_onnx_model *m = kiln_onnx_load_memory(model.b, model.n, dev, NULL);
    CHECK(m, "load the built model: %s", kiln_error());
    if (!m)
        return;
    float xv[6] = {1, 2, 3, 4, 5, 6};
    kiln_tensor *x = kiln_from_data(dev, KILN_F32, KILN_SHAPE(2, 3), xv, sizeof xv);
    kiln_tensor *out[4] = {0};
    int rc = kiln_onnx_run(m, 1, (const char *[]){"x"}, &x, 4, out);
    CHECK(rc == 0, "run the built model: %s", kiln_error());
    if (rc == 0) {
        float a[2] = {0}, b[2] = {0};
        int64_t c = 0, z[3] = {0};
        CHECK(kiln_tensor_numel(out[0]) == 2 && kiln_to_data(out[0], a, sizeof a) == 0 && a[0] == 1 && a[1] == 4,
              "Slice step INT64_MAX: %lld elements %g %g", (long long)kiln_tensor_numel(out[0]), a[0], a[1]);
        CHECK(kiln_tensor_numel(out[1]) == 2 && kiln_to_data(out[1], b, sizeof b) == 0 && b[0] == 3 && b[1] == 6,
              "Slice step INT64_MIN: %lld elements %g %g", (long long)kiln_tensor_numel(out[1]), b[0], b[1]);
        CHECK(kiln_to_data(out[2], &c, sizeof c) == 0 && c == max, "Constant value_int INT64_MAX: %lld",
              (long long)c);
        CHECK(kiln_to_data(out[3], z, sizeof z) == 0 && z[0] == max && z[2] == max,
              "ConstantOfShape INT64_MAX: %lld %lld", (long long)z[0], (long long)z[2]);
    }
    for (int i = 0; i < 4; i++)
        kiln_tensor_release(out[i]);
    kiln_tensor_release(x);
    kiln_onnx_free(m);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s FIXTURES_DIR\n", argv[0]);
        return 2;
    }
    const char *specs[] = {"cpu", "ref"};
    for (int i = 0; i < 2; i++) {
        kiln_device *dev = kiln_device_open(specs[i]);
        CHECK(dev, "open %s: %s", specs[i], kiln_error());
        if (!dev)
            continue;
        test_cnn(argv[1], dev);
        test_encoder(argv[1], dev);
        test_load_errors(dev);
        test_int64_edges(dev);
        kiln_device_close(dev);
    }
    printf("onnx_inputs: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
