/*
 * tests/engine/test-batch-norm.c — batch norm with too few values per channel for batch
 * statistics (an empty batch, one item, an empty spatial dim): refused with the shape in
 * the message and the running statistics left exactly as they were, on every backend that
 * opens here (the check is in the engine, before any op is queued), with and without
 * autograd recording, and through a BatchNorm1d module. The good paths still compute the
 * right values.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "kiln/kiln.h"

/* the backends batch norm is dispatched to; those that do not open here are skipped */
static const char *const specs[] = {"ref",          "cpu?threads=1", "fused:cpu?threads=1",
                                    "counting:ref", "vulkan:0",      "cuda:0"};

static void read3(kiln_tensor *t, float out[3])
{
    assert_non_null(t);
    assert_int_equal(kiln_to_data(t, out, 3 * sizeof(float)), 0);
}

static void expect3(kiln_tensor *t, float a, float b, float c, double tol, const char *what)
{
    float v[3];
    read3(t, v);
    const float want[3] = {a, b, c};
    for (int i = 0; i < 3; i++)
        if (!(fabs((double)v[i] - (double)want[i]) <= tol))
            fail_msg("%s[%d] = %.9g, want %.9g", what, i, (double)v[i], (double)want[i]);
}

static void expect_refused(const char *shape)
{
    const char *e = kiln_error();
    if (!strstr(e, "more than 1 value per channel") || !strstr(e, shape))
        fail_msg("error '%s' should refuse %s", e, shape);
}

/* Running statistics [1, 2, 3] and [4, 5, 6]: exact in f32, so "unchanged" is equality. */
static void stats(kiln_device *dev, kiln_tensor **rm, kiln_tensor **rv)
{
    *rm = kiln_from_data(dev, KILN_F32, KILN_SHAPE(3), (float[]){1, 2, 3}, 3 * sizeof(float));
    *rv = kiln_from_data(dev, KILN_F32, KILN_SHAPE(3), (float[]){4, 5, 6}, 3 * sizeof(float));
    assert_non_null(*rm);
    assert_non_null(*rv);
}

static void check_device(kiln_device *dev, const char *spec)
{
    kiln_scope_begin();
    kiln_tensor *rm, *rv;
    stats(dev, &rm, &rv);
    kiln_tensor *w = kiln_ones(dev, KILN_F32, KILN_SHAPE(3)), *b = kiln_zeros(dev, KILN_F32, KILN_SHAPE(3));

    /* an empty batch, one item, an empty length: refused, the statistics untouched */
    kiln_error_clear();
    assert_null(kiln_batch_norm(kiln_zeros(dev, KILN_F32, KILN_SHAPE(0, 3)), rm, rv, w, b, true, 0.1, 1e-5));
    expect_refused("f32[0, 3]");
    assert_null(kiln_batch_norm(kiln_ones(dev, KILN_F32, KILN_SHAPE(1, 3)), rm, rv, w, b, true, 0.1, 1e-5));
    expect_refused("f32[1, 3]");
    assert_null(
        kiln_batch_norm(kiln_zeros(dev, KILN_F32, KILN_SHAPE(2, 3, 0)), rm, rv, NULL, NULL, true, 0.1, 1e-5));
    expect_refused("f32[2, 3, 0]");
    /* without running statistics the batch's are used in eval too: the same refusal */
    assert_null(
        kiln_batch_norm(kiln_zeros(dev, KILN_F32, KILN_SHAPE(0, 3)), NULL, NULL, NULL, NULL, false, 0.1, 1e-5));
    expect_refused("f32[0, 3]");
    /* the autograd path (one recorded node) refuses the same way */
    kiln_tensor *wg = kiln_requires_grad(kiln_ones(dev, KILN_F32, KILN_SHAPE(3)), true);
    kiln_tensor *xg = kiln_requires_grad(kiln_zeros(dev, KILN_F32, KILN_SHAPE(0, 3)), true);
    assert_null(kiln_batch_norm(xg, rm, rv, wg, b, true, 0.1, 1e-5));
    expect_refused("f32[0, 3]");
    /* integer running statistics would take a truncated update: refused, naming them */
    kiln_tensor *rm_int = kiln_from_data(dev, KILN_I64, KILN_SHAPE(3), (int64_t[]){1, 2, 3}, 3 * sizeof(int64_t));
    assert_null(kiln_batch_norm(kiln_ones(dev, KILN_F32, KILN_SHAPE(2, 3)), rm_int, rv, w, b, true, 0.1, 1e-5));
    if (!strstr(kiln_error(), "running_mean i64[3] must be a floating-point tensor"))
        fail_msg("integer running_mean: %s", kiln_error());
    expect3(rm, 1, 2, 3, 0, "running_mean after the refusals");
    expect3(rv, 4, 5, 6, 0, "running_var after the refusals");

    /* eval with running statistics needs none from the batch: an empty batch is fine */
    kiln_tensor *ye = kiln_batch_norm(kiln_zeros(dev, KILN_F32, KILN_SHAPE(0, 3)), rm, rv, w, b, false, 0.1, 1e-5);
    assert_non_null(ye);
    assert_int_equal(kiln_tensor_numel(ye), 0);
    /* no channels: nothing to normalize and no statistics */
    kiln_tensor *y0 = kiln_batch_norm(kiln_zeros(dev, KILN_F32, KILN_SHAPE(4, 0)), NULL, NULL, NULL, NULL, true,
                                      0.1, 1e-5);
    assert_non_null(y0);
    assert_int_equal(kiln_tensor_numel(y0), 0);

    /* a real batch still trains: x = [[1, 2, 3], [3, 4, 5]], batch mean [2, 3, 4], biased
     * variance 1, unbiased 2; running = 0.9 running + 0.1 batch */
    kiln_tensor *x = kiln_from_data(dev, KILN_F32, KILN_SHAPE(2, 3), (float[]){1, 2, 3, 3, 4, 5},
                                    6 * sizeof(float));
    kiln_tensor *y = kiln_batch_norm(x, rm, rv, w, b, true, 0.1, 0);
    assert_non_null(y);
    float out[6];
    assert_int_equal(kiln_to_data(y, out, sizeof out), 0);
    for (int i = 0; i < 6; i++)
        if (fabs(out[i] - (i < 3 ? -1.0 : 1.0)) > 1e-5)
            fail_msg("%s: y[%d] = %g", spec, i, (double)out[i]);
    expect3(rm, 1.1f, 2.1f, 3.1f, 1e-6, "running_mean after a batch");
    expect3(rv, 3.8f, 4.7f, 5.6f, 1e-6, "running_var after a batch");
    kiln_scope_end();
}

static void test_backends(void **state)
{
    (void)state;
    int opened = 0;
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) {
        kiln_device *dev = kiln_device_open(specs[i]);
        if (!dev) {
            printf("# %s: skipped (%s)\n", specs[i], kiln_error());
            continue;
        }
        printf("# %s\n", specs[i]);
        check_device(dev, specs[i]);
        kiln_device_close(dev);
        opened++;
    }
    assert_true(opened >= 4); /* ref, cpu and the decorators always open */
}

/* The trial's case: a BatchNorm1d in training mode given f32[0, 3] used to put NaN into its
 * running statistics for good. */
static void test_module(void **state)
{
    (void)state;
    kiln_device *dev = kiln_device_open("cpu?threads=1");
    assert_non_null(dev);
    const char *spec = "{\"inputs\":[\"x\"],\"nodes\":[{\"name\":\"bn\",\"layer\":\"BatchNorm1d\",\"config\":"
                       "{\"num_features\":3},\"inputs\":[\"x\"]}],\"outputs\":[\"bn\"]}";
    kiln_module *m = kiln_model_from_json(spec, dev, NULL);
    assert_non_null(m);
    kiln_scope_begin();
    assert_null(kiln_module_forward(m, kiln_zeros(dev, KILN_F32, KILN_SHAPE(0, 3))));
    expect_refused("f32[0, 3]");
    expect3(kiln_module_lookup(m, "bn.running_mean"), 0, 0, 0, 0, "module running_mean");
    expect3(kiln_module_lookup(m, "bn.running_var"), 1, 1, 1, 0, "module running_var");
    /* the refused batch was not counted either (it would change a cumulative average) */
    int64_t tracked = -1;
    assert_int_equal(kiln_to_data(kiln_module_lookup(m, "bn.num_batches_tracked"), &tracked, sizeof tracked), 0);
    assert_int_equal(tracked, 0);
    /* eval afterwards: the fresh statistics, so y = x / sqrt(1 + eps), finite */
    kiln_module_train(m, false);
    kiln_tensor *x = kiln_from_data(dev, KILN_F32, KILN_SHAPE(1, 3), (float[]){1, -2, 3}, 3 * sizeof(float));
    double k = 1 / sqrt(1 + 1e-5);
    expect3(kiln_module_forward(m, x), (float)k, (float)(-2 * k), (float)(3 * k), 1e-6, "eval output");
    /* a training batch that goes through is counted */
    kiln_module_train(m, true);
    assert_non_null(kiln_module_forward(m, kiln_zeros(dev, KILN_F32, KILN_SHAPE(2, 3))));
    assert_int_equal(kiln_to_data(kiln_module_lookup(m, "bn.num_batches_tracked"), &tracked, sizeof tracked), 0);
    assert_int_equal(tracked, 1);
    kiln_scope_end();
    kiln_module_free(m);
    kiln_device_close(dev);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backends),
        cmocka_unit_test(test_module),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
