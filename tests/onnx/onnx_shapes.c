/*
 * onnx_shapes.c — kiln_onnx_run checks every input against the shape the graph declares:
 *
 *     onnx_shapes [DEVICE]      (cpu when none is named)
 *
 * It once took any shape: a model exported at batch 1 and fed batch 3 ran silently (Identity
 * here) or failed deep inside with an unrelated Reshape error. ONNX Runtime refuses, and kilnd
 * already did (api/infer.c); now the run is refused before anything runs, naming the input,
 * the dim, the given and expected sizes, in kilnd's words. Symbolic dims (dim_param) and dims
 * with neither value nor name take any size; so does an input declared without a shape.
 */
#include <stdio.h>
#include <string.h>

#include "kiln/kiln.h"
#include "onnx-build.h"
#include "onnx-check.h"

static kiln_device *dev;
static kiln_onnx_model *model;

/* Runs with x (fixed [1, 2, 3]), s (["batch", 3]), u ([?, 2]) and a (no shape) of these
 * shapes; want NULL: must succeed, else the error must hold each '|'-separated part of want. */
static void run(const int64_t *xs, int xnd, const int64_t *ss, int snd, kiln_dtype sdt, const char *want)
{
    const int64_t us[2] = {4, 2}, as[3] = {2, 2, 2};
    kiln_tensor *in[4] = {kiln_zeros(dev, KILN_F32, xnd, xs), kiln_zeros(dev, sdt, snd, ss),
                          kiln_zeros(dev, KILN_F32, 2, us), kiln_zeros(dev, KILN_F32, 3, as)};
    kiln_tensor *out[4] = {0};
    int rc = kiln_onnx_run(model, 4, (const char *[]){"x", "s", "u", "a"}, in, 4, out);
    if (!want) {
        CHECK(rc == 0, "run: %s", kiln_error());
        CHECK(rc || (kiln_tensor_ndim(out[0]) == 2 && kiln_tensor_dim(out[0], 0) == 1 &&
                     kiln_tensor_dim(out[0], 1) == 6),
              "the reshaped x is not [1, 6]");
    } else {
        const char *e = kiln_error();
        bool all = rc != 0;
        char parts[256];
        snprintf(parts, sizeof parts, "%s", want);
        for (char *p = strtok(parts, "|"); all && p; p = strtok(NULL, "|"))
            all = strstr(e, p) != NULL;
        CHECK(all, "want an error with '%s', got %s", want, rc == 0 ? "success" : e);
    }
    for (int i = 0; i < 4; i++) {
        kiln_tensor_release(in[i]);
        kiln_tensor_release(out[i]);
    }
}

int main(int argc, char **argv)
{
    dev = kiln_device_open(argc > 1 ? argv[1] : "cpu");
    if (!dev) {
        fprintf(stderr, "%s\n", kiln_error());
        return 1;
    }
    /* x [1, 2, 3] -> Reshape [1, 6] (a batch-1 export's flatten); s, u, a -> Identity */
    static pb g, m;
    const int64_t xd[3] = {1, 2, 3}, sd[2] = {-1, 3}, ud[2] = {-2, 2}, two = 2, flat[2] = {1, 6};
    ob_input(&g, "x", OB_FLOAT, 3, xd, NULL);
    ob_input(&g, "s", OB_FLOAT, 2, sd, "batch");
    ob_input(&g, "u", OB_FLOAT, 2, ud, NULL);
    ob_input(&g, "a", OB_FLOAT, -1, NULL, NULL);
    ob_init(&g, "flat", OB_INT64, 1, &two, flat, sizeof flat);
    ob_node(&g, "Reshape", "flatten", (const char *[]){"x", "flat", NULL}, (const char *[]){"xo", NULL}, NULL);
    ob_node(&g, "Identity", "id_s", (const char *[]){"s", NULL}, (const char *[]){"so", NULL}, NULL);
    ob_node(&g, "Identity", "id_u", (const char *[]){"u", NULL}, (const char *[]){"uo", NULL}, NULL);
    ob_node(&g, "Identity", "id_a", (const char *[]){"a", NULL}, (const char *[]){"ao", NULL}, NULL);
    ob_output(&g, "xo");
    ob_output(&g, "so");
    ob_output(&g, "uo");
    ob_output(&g, "ao");
    ob_model(&m, &g, 17);
    model = kiln_onnx_load_memory(m.b, m.n, dev, NULL);
    if (!model) {
        fprintf(stderr, "load: %s\n", kiln_error());
        return 1;
    }
    const int64_t x_ok[3] = {1, 2, 3}, x_b3[3] = {3, 2, 3}, x_d2[3] = {1, 2, 4}, x_r2[2] = {1, 6};
    const int64_t s7[2] = {7, 3}, s1[2] = {1, 3}, s_bad[2] = {7, 4}, s_r3[3] = {7, 3, 1};
    /* fixed dims as declared, the symbolic and unknown ones at any size */
    run(x_ok, 3, s7, 2, KILN_F32, NULL);
    run(x_ok, 3, s1, 2, KILN_F32, NULL);
    /* a batch-1 export fed batch 3: refused before the Reshape could fail */
    run(x_b3, 3, s7, 2, KILN_F32, "input 'x': dim 0 is 3; the model expects 1");
    run(x_d2, 3, s7, 2, KILN_F32, "input 'x': dim 2 is 4; the model expects 3");
    run(x_r2, 2, s7, 2, KILN_F32, "input 'x' has 2 dims; the model expects 3");
    /* a symbolic dim frees only itself */
    run(x_ok, 3, s_bad, 2, KILN_F32, "input 's': dim 1 is 4; the model expects 3");
    run(x_ok, 3, s_r3, 3, KILN_F32, "input 's' has 3 dims; the model expects 2");
    /* the dtype is still checked */
    run(x_ok, 3, s7, 2, KILN_I64, "input 's' is i64|declares f32");
    /* the model still runs after refused calls, and the dry run takes the declared shapes */
    run(x_ok, 3, s1, 2, KILN_F32, NULL);
    int nd[4];
    int64_t shapes[4][KILN_MAX_DIMS];
    CHECK(kiln_onnx_infer_shapes(model, 5, 4, nd, shapes) == 0, "infer_shapes: %s", kiln_error());
    kiln_onnx_free(model);
    kiln_device_close(dev);
    if (failures)
        fprintf(stderr, "%d failures\n", failures);
    else
        printf("input shape checks: ok\n");
    return failures ? 1 : 0;
}
