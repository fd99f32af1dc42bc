/*
 * tests/autodiff/test-saved-version.c — a tensor the tape saved for backward and then
 * written in place (an optimizer step, a module load, clipping, a write through another
 * view of its storage) makes backward fail with an
 * error naming the op, the tensor and its versions, and leaves every gradient as it was;
 * writes the tape does not depend on (a tensor it did not save, a write before the forward,
 * a step after backward in the usual loop, the input of a relu or of exp, whose backward
 * reads the output, the operands of add, sub and the scalar shifts and scales, batch
 * norm's running statistics) change nothing.
 *
 * Usage: test-saved-version [DEVICE] (ref by default); exits 77 when DEVICE does not open.
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
#include "kiln/nn.h"
#include "kiln/optim.h"

static const char *dev_spec = "ref";
static kiln_device *dev;

static int setup(void **state)
{
    (void)state;
    return dev ? 0 : -1;
}

static kiln_tensor *vec(int64_t n, const float *v)
{
    return kiln_from_data(dev, KILN_F32, 1, &n, v, (size_t)n * sizeof(float));
}

static kiln_tensor *param(int64_t n, const float *v)
{
    return kiln_requires_grad(vec(n, v), true);
}

static void expect_values(kiln_tensor *t, const double *want, int n)
{
    if (!t)
        fail_msg("tensor is NULL: %s", kiln_error());
    double got[16];
    assert_int_equal(kiln_tensor_numel(t), n);
    assert_int_equal(kiln_to_data(kiln_cast(t, KILN_F64), got, (size_t)n * sizeof(double)), 0);
    for (int i = 0; i < n; i++)
        if (fabs(got[i] - want[i]) > 1e-6)
            fail_msg("element %d: got %.9g, want %.9g", i, got[i], want[i]);
}
#define EXPECT(t, ...)                                                                                            \
    expect_values((t), (const double[]){__VA_ARGS__}, (int)(sizeof((double[]){__VA_ARGS__}) / sizeof(double)))

static void expect_error(const char *what)
{
    if (!strstr(kiln_error(), what))
        fail_msg("the error should mention \"%s\": %s", what, kiln_error());
}

static kiln_optim *sgd(double lr, int n, kiln_tensor *const *params)
{
    kiln_optim_config c = kiln_optim_config_default(KILN_OPTIM_SGD);
    c.lr = lr;
    kiln_optim *opt = kiln_optim_create(&c, n, params, NULL);
    assert_non_null(opt);
    return opt;
}

static kiln_tensor *sum(kiln_tensor *t)
{
    return kiln_sum(t, KILN_ALL_DIMS, false);
}

/* The reproducer: an optimizer step between the forward and the backward. The forward used
 * w = [3, 4], so dloss/dx = [3, 4]; backward may not answer [2, 3] from the stepped w. */
static void test_step_between_forward_and_backward(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *w = param(2, (float[]){3, 4});
    kiln_tensor *x = param(2, (float[]){1, 1});
    kiln_tensor *loss = sum(kiln_mul(x, w));
    kiln_optim *opt = sgd(1, 1, &w);
    assert_int_equal(kiln_optim_step_grads(opt, (kiln_tensor *[]){kiln_ones_like(w)}), 1);
    EXPECT(w, 2, 3);
    assert_int_not_equal(kiln_backward(loss, NULL), 0);
    expect_error("mul");
    expect_error("f32[2]");
    expect_error("modified in place");
    expect_error("version 0");
    expect_error("now 1");
    assert_null(kiln_grad(x));
    assert_null(kiln_grad(w));
    /* a forward after the step sees the new w, and its backward is consistent with it */
    assert_int_equal(kiln_backward(sum(kiln_mul(x, w)), NULL), 0);
    EXPECT(kiln_grad(x), 2, 3);
    EXPECT(kiln_grad(w), 1, 1);
    kiln_optim_free(opt);
    kiln_scope_end();
}

/* No gradient changes, not even those a branch without the modified tensor would have
 * delivered before the pass reached the op that saved it. */
static void test_no_partial_accumulation(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *w = param(2, (float[]){3, 4});
    kiln_tensor *x = param(2, (float[]){1, 1});
    assert_int_equal(kiln_set_grad(x, vec(2, (float[]){10, 20})), 0);
    kiln_tensor *loss = kiln_add(sum(kiln_mul_scalar(x, 2)), sum(kiln_mul(kiln_exp(x), w)));
    kiln_tensor *loss2 = kiln_add(sum(kiln_mul(kiln_exp(x), w)), sum(kiln_mul_scalar(x, 2)));
    kiln_optim *opt = sgd(1, 1, &w);
    assert_int_equal(kiln_optim_step_grads(opt, (kiln_tensor *[]){kiln_ones_like(w)}), 1);
    assert_int_not_equal(kiln_backward(loss, NULL), 0);
    expect_error("modified in place");
    EXPECT(kiln_grad(x), 10, 20);
    assert_null(kiln_grad(w));
    assert_int_not_equal(kiln_backward(loss2, NULL), 0);
    EXPECT(kiln_grad(x), 10, 20);
    assert_null(kiln_grad(w));
    kiln_optim_free(opt);
    kiln_scope_end();
}

/* Adam (the fused in-place step where the backend has one) trips it the same way. */
static void test_adam_step(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *w = param(2, (float[]){3, 4});
    kiln_tensor *x = param(2, (float[]){1, 1});
    kiln_tensor *loss = sum(kiln_mul(x, w));
    kiln_optim_config c = kiln_optim_config_default(KILN_OPTIM_ADAM);
    c.lr = 0.5;
    kiln_optim *opt = kiln_optim_create(&c, 1, &w, NULL);
    assert_non_null(opt);
    assert_int_equal(kiln_optim_step_grads(opt, (kiln_tensor *[]){kiln_ones_like(w)}), 1);
    EXPECT(w, 2.5, 3.5); /* Adam's first step moves by lr */
    assert_int_not_equal(kiln_backward(loss, NULL), 0);
    expect_error("modified in place");
    assert_null(kiln_grad(x));
    kiln_optim_free(opt);
    kiln_scope_end();
}

/* In-place writes the tape does not depend on: a tensor the graph never saved (w only
 * reaches it through a cast, which copies), an unrelated tensor, and a write before the
 * forward. */
static void test_writes_the_graph_does_not_depend_on(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *w = param(2, (float[]){3, 4});
    kiln_tensor *u = param(2, (float[]){5, 6});
    kiln_tensor *x = kiln_requires_grad(kiln_cast(vec(2, (float[]){1, 2}), KILN_F64), true);
    kiln_tensor *loss = sum(kiln_mul(x, kiln_cast(w, KILN_F64)));
    kiln_tensor *both[2] = {w, u};
    kiln_optim *opt = sgd(1, 2, both);
    assert_int_equal(kiln_optim_step_grads(opt, (kiln_tensor *[]){kiln_ones_like(w), kiln_ones_like(u)}), 1);
    EXPECT(w, 2, 3);
    EXPECT(u, 4, 5);
    assert_int_equal(kiln_backward(loss, NULL), 0);
    EXPECT(kiln_grad(x), 3, 4); /* the values the forward used */
    EXPECT(kiln_grad(w), 1, 2);
    /* a write before the forward */
    kiln_zero_grad(x);
    assert_int_equal(kiln_optim_step_grads(opt, (kiln_tensor *[]){kiln_full_like(w, -2), NULL}), 1);
    kiln_tensor *y = kiln_cast(x, KILN_F32);
    assert_int_equal(kiln_backward(sum(kiln_mul(y, w)), NULL), 0);
    EXPECT(kiln_grad(x), 4, 5);
    kiln_optim_free(opt);
    kiln_scope_end();
}

/* A relu's backward reads its output, as PyTorch's does, so its input is not saved: a step
 * on that input between the forward and the backward spoils nothing, and the gradient
 * takes the forward's mask (w was [-1, 2, 3]). */
static void test_relu_keeps_only_its_output(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *w = param(3, (float[]){-1, 2, 3});
    kiln_tensor *loss = sum(kiln_mul(kiln_relu(w), vec(3, (float[]){5, 6, 7})));
    kiln_optim *opt = sgd(1, 1, &w);
    assert_int_equal(kiln_optim_step_grads(opt, (kiln_tensor *[]){kiln_full_like(w, 10)}), 1);
    EXPECT(w, -11, -8, -7);
    assert_int_equal(kiln_backward(loss, NULL), 0);
    EXPECT(kiln_grad(w), 0, 6, 7);
    kiln_optim_free(opt);
    kiln_scope_end();
}

/* Views share their storage's version: a write through another view of it trips the check,
 * even where the elements written are not the ones saved (as PyTorch's shared counter does). */
static void test_views_share_the_version(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *base = param(4, (float[]){1, 2, 3, 4});
    kiln_tensor *x = param(2, (float[]){1, 1});
    kiln_tensor *loss = sum(kiln_mul(x, kiln_slice(base, 0, 0, 2, 1)));
    kiln_tensor *tail = kiln_detach(kiln_slice(base, 0, 2, 4, 1));
    kiln_optim *opt = sgd(1, 1, &tail);
    assert_int_equal(kiln_optim_step_grads(opt, (kiln_tensor *[]){kiln_ones_like(tail)}), 1);
    EXPECT(base, 1, 2, 2, 3);
    assert_int_not_equal(kiln_backward(loss, NULL), 0);
    expect_error("mul");
    expect_error("modified in place");
    assert_null(kiln_grad(x));
    assert_null(kiln_grad(base));
    kiln_optim_free(opt);
    /* the other way round: the graph saved the base, the write goes through a view */
    kiln_tensor *w = param(2, (float[]){3, 4});
    loss = sum(kiln_mul(x, w));
    kiln_tensor *first = kiln_detach(kiln_slice(w, 0, 0, 1, 1));
    opt = sgd(1, 1, &first);
    assert_int_equal(kiln_optim_step_grads(opt, (kiln_tensor *[]){kiln_ones_like(first)}), 1);
    EXPECT(w, 2, 4);
    assert_int_not_equal(kiln_backward(loss, NULL), 0);
    expect_error("modified in place");
    assert_null(kiln_grad(x));
    kiln_optim_free(opt);
    kiln_scope_end();
}

/* The usual loop: forward, backward, step, zero_grad, and again. */
static void test_normal_loop(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *w = param(2, (float[]){3, 4});
    kiln_tensor *x = vec(2, (float[]){0.5, 2});
    kiln_optim *opt = sgd(0.5, 1, &w);
    for (int i = 0; i < 3; i++) {
        kiln_scope_begin();
        kiln_optim_zero_grad(opt);
        assert_int_equal(kiln_backward(sum(kiln_mul(kiln_square(w), x)), NULL), 0);
        assert_int_equal(kiln_optim_step(opt), 1);
        kiln_scope_end();
    }
    /* dloss/dw = 2 w x, so w <- w (1 - x): [3, 4] -> [1.5, -4] -> [0.75, 4] -> [0.375, -4] */
    EXPECT(w, 0.375, -4);
    kiln_optim_free(opt);
    kiln_scope_end();
}

/* Two backward passes over a retained graph still add up; a step between them trips the
 * second and leaves the first pass's gradients. */
static void test_retain_graph(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *w = param(2, (float[]){3, 4});
    kiln_tensor *x = param(2, (float[]){1, 2});
    kiln_tensor *loss = sum(kiln_mul(x, w));
    assert_int_equal(kiln_backward_retain(loss, NULL, true), 0);
    assert_int_equal(kiln_backward_retain(loss, NULL, true), 0);
    EXPECT(kiln_grad(x), 6, 8);
    EXPECT(kiln_grad(w), 2, 4);
    kiln_optim *opt = sgd(1, 1, &w);
    assert_int_equal(kiln_optim_step(opt), 1);
    EXPECT(w, 1, 0);
    assert_int_not_equal(kiln_backward_retain(loss, NULL, true), 0);
    expect_error("modified in place");
    EXPECT(kiln_grad(x), 6, 8);
    EXPECT(kiln_grad(w), 2, 4);
    kiln_optim_free(opt);
    kiln_scope_end();
}

/* A module load writes into the module's own parameters in place. */
static void test_module_load(void **state)
{
    (void)state;
    kiln_linear_config cfg = kiln_linear_config_default();
    cfg.in_features = 2;
    cfg.out_features = 1;
    cfg.bias = false;
    kiln_generator gen = kiln_generator_make(1);
    kiln_module *fc = kiln_linear_init(&cfg, dev, &gen);
    assert_non_null(fc);
    kiln_scope_begin();
    const char *names[1] = {"weight"};
    kiln_tensor *w0 = kiln_from_data(dev, KILN_F32, KILN_SHAPE(1, 2), (float[]){3, 4}, 2 * sizeof(float));
    assert_int_equal(kiln_module_load_state_dict(fc, 1, names, &w0, true, NULL), 0);
    kiln_tensor *x = kiln_requires_grad(
        kiln_from_data(dev, KILN_F32, KILN_SHAPE(1, 2), (float[]){1, 1}, 2 * sizeof(float)), true);
    kiln_tensor *loss = sum(kiln_module_forward(fc, x));
    kiln_tensor *w1 = kiln_from_data(dev, KILN_F32, KILN_SHAPE(1, 2), (float[]){7, 8}, 2 * sizeof(float));
    assert_int_equal(kiln_module_load_state_dict(fc, 1, names, &w1, true, NULL), 0);
    assert_int_not_equal(kiln_backward(loss, NULL), 0);
    expect_error("modified in place");
    expect_error("f32[1, 2]");
    assert_null(kiln_grad(x));
    /* a forward after the load: dloss/dx = the loaded weight */
    assert_int_equal(kiln_backward(sum(kiln_module_forward(fc, x)), NULL), 0);
    EXPECT(kiln_grad(x), 7, 8);
    kiln_scope_end();
    kiln_module_free(fc);
}

/* Clipping writes into the gradient tensors it is given. */
static void test_clip_in_place(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *x = param(2, (float[]){1, 1});
    kiln_tensor *g = vec(2, (float[]){3, -4});
    kiln_tensor *loss = sum(kiln_mul(x, g));
    assert_int_equal(kiln_grads_clip_value(1, &g, 1), 0);
    EXPECT(g, 1, -1);
    assert_int_not_equal(kiln_backward(loss, NULL), 0);
    expect_error("modified in place");
    assert_null(kiln_grad(x));
    kiln_scope_end();
}

/* Batch norm's running statistics, updated in place by a training-mode call, after an
 * eval-mode forward normalised with them: the forward's (x - mean) saves nothing and its
 * scale 1/sqrt(var + eps) is a tensor of its own, so backward gives the gradient of the
 * forward that ran. */
static void test_batch_norm_running_stats(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *mean = vec(1, (float[]){0});
    kiln_tensor *var = vec(1, (float[]){1});
    kiln_tensor *x = kiln_requires_grad(
        kiln_from_data(dev, KILN_F32, KILN_SHAPE(2, 1), (float[]){1, 3}, 2 * sizeof(float)), true);
    kiln_tensor *loss = sum(kiln_square(kiln_batch_norm(x, mean, var, NULL, NULL, false, 0.1, 1e-5)));
    assert_non_null(kiln_batch_norm(kiln_detach(x), mean, var, NULL, NULL, true, 0.5, 1e-5));
    EXPECT(mean, 1);
    assert_int_equal(kiln_backward(loss, NULL), 0);
    double g[2];
    assert_int_equal(kiln_to_data(kiln_cast(kiln_reshape(kiln_grad(x), KILN_SHAPE(2)), KILN_F64), g, sizeof g), 0);
    /* d/dx sum(((x - 0) / sqrt(1 + eps))^2) = 2x / (1 + eps), with the stats before the update */
    assert_true(fabs(g[0] - 2 / (1 + 1e-5)) < 1e-5 && fabs(g[1] - 6 / (1 + 1e-5)) < 1e-5);
    kiln_scope_end();
}

/* Only what a backward reads is saved, as PyTorch's: add's and sub's operands and sum's
 * input may be written in place before backward; mul keeps an operand only for the other's
 * gradient, so writing the operand whose gradient nobody needs is fine, and writing the
 * one that is read still fails. */
static void test_ops_save_only_what_backward_reads(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *x = param(2, (float[]){1, 2});
    kiln_tensor *r = vec(2, (float[]){10, 20});
    kiln_tensor *s = vec(2, (float[]){3, 4});
    /* loss = sum((x + r) - s) + sum(x): dloss/dx = 2 */
    kiln_tensor *loss = kiln_add(sum(kiln_sub(kiln_add(x, r), s)), sum(x));
    kiln_tensor *rs[2] = {r, s};
    kiln_optim *opt = sgd(1, 2, rs);
    assert_int_equal(kiln_optim_step_grads(opt, (kiln_tensor *[]){kiln_ones_like(r), kiln_ones_like(s)}), 1);
    EXPECT(r, 9, 19);
    assert_int_equal(kiln_backward(loss, NULL), 0);
    EXPECT(kiln_grad(x), 2, 2);
    kiln_optim_free(opt);
    /* mul: c needs no gradient, so x is not kept (only c, for x's gradient) */
    kiln_zero_grad(x);
    kiln_tensor *c = vec(2, (float[]){5, 6});
    kiln_tensor *m = sum(kiln_mul(x, c));
    opt = sgd(1, 1, &x);
    assert_int_equal(kiln_optim_step_grads(opt, (kiln_tensor *[]){kiln_ones_like(x)}), 1);
    EXPECT(x, 0, 1);
    assert_int_equal(kiln_backward(m, NULL), 0);
    EXPECT(kiln_grad(x), 5, 6);
    kiln_optim_free(opt);
    /* ... and writing c, which x's gradient reads, still fails */
    kiln_zero_grad(x);
    m = sum(kiln_mul(x, c));
    opt = sgd(1, 1, &c);
    assert_int_equal(kiln_optim_step_grads(opt, (kiln_tensor *[]){kiln_ones_like(c)}), 1);
    assert_int_not_equal(kiln_backward(m, NULL), 0);
    expect_error("modified in place");
    kiln_optim_free(opt);
    kiln_scope_end();
}

/* The unary ops keep only what their backward reads: nothing for the scalar shift and
 * scale and neg, the output for exp (and tanh, sigmoid, sqrt...), the input for square
 * (and gelu, log, sin...). A step on what is not kept spoils nothing; a step on what is
 * still fails. */
static void test_unary_ops_save_only_what_backward_reads(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *x = param(2, (float[]){1, 2});
    /* loss = sum(3 (x + 1)) - sum(x): dloss/dx = 2; a step on x spoils nothing */
    kiln_tensor *loss = kiln_sub(sum(kiln_mul_scalar(kiln_add_scalar(x, 1), 3)), sum(kiln_neg(kiln_neg(x))));
    kiln_optim *opt = sgd(1, 1, &x);
    assert_int_equal(kiln_optim_step_grads(opt, (kiln_tensor *[]){kiln_ones_like(x)}), 1);
    assert_int_equal(kiln_backward(loss, NULL), 0);
    EXPECT(kiln_grad(x), 2, 2);
    /* exp reads its output: a step on its input spoils nothing, and the gradient is the
     * forward's exp(x) (x was [0, 1]) */
    kiln_zero_grad(x);
    loss = sum(kiln_exp(x));
    assert_int_equal(kiln_optim_step_grads(opt, (kiln_tensor *[]){kiln_ones_like(x)}), 1);
    assert_int_equal(kiln_backward(loss, NULL), 0);
    EXPECT(kiln_grad(x), 1, exp(1));
    /* square reads its input: a step on it still fails */
    kiln_zero_grad(x);
    loss = sum(kiln_square(x));
    assert_int_equal(kiln_optim_step_grads(opt, (kiln_tensor *[]){kiln_ones_like(x)}), 1);
    assert_int_not_equal(kiln_backward(loss, NULL), 0);
    expect_error("modified in place");
    kiln_optim_free(opt);
    kiln_scope_end();
}

static kiln_tensor *square_block(void *ud, int n, kiln_tensor *const *in)
{
    (void)ud, (void)n;
    return kiln_mul(in[0], in[0]);
}

/* A checkpointed block recomputes from its inputs: those must not have changed either. */
static void test_checkpoint_input(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *x = param(2, (float[]){3, 4});
    kiln_tensor *loss = sum(kiln_checkpoint(square_block, NULL, 1, &x));
    kiln_optim *opt = sgd(1, 1, &x);
    assert_int_equal(kiln_optim_step_grads(opt, (kiln_tensor *[]){kiln_ones_like(x)}), 1);
    assert_int_not_equal(kiln_backward(loss, NULL), 0);
    expect_error("checkpoint");
    expect_error("modified in place");
    assert_null(kiln_grad(x));
    assert_int_equal(kiln_backward(sum(kiln_checkpoint(square_block, NULL, 1, &x)), NULL), 0);
    EXPECT(kiln_grad(x), 4, 6);
    kiln_optim_free(opt);
    kiln_scope_end();
}

int main(int argc, char **argv)
{
    if (argc > 1)
        dev_spec = argv[1];
    dev = kiln_device_open(dev_spec);
    if (!dev) {
        printf("skipped: %s does not open: %s\n", dev_spec, kiln_error());
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step_between_forward_and_backward),
        cmocka_unit_test(test_no_partial_accumulation),
        cmocka_unit_test(test_adam_step),
        cmocka_unit_test(test_writes_the_graph_does_not_depend_on),
        cmocka_unit_test(test_ops_save_only_what_backward_reads),
        cmocka_unit_test(test_unary_ops_save_only_what_backward_reads),
        cmocka_unit_test(test_relu_keeps_only_its_output),
        cmocka_unit_test(test_views_share_the_version),
        cmocka_unit_test(test_normal_loop),
        cmocka_unit_test(test_retain_graph),
        cmocka_unit_test(test_module_load),
        cmocka_unit_test(test_clip_in_place),
        cmocka_unit_test(test_batch_norm_running_stats),
        cmocka_unit_test(test_checkpoint_input),
    };
    int rc = cmocka_run_group_tests_name(dev_spec, tests, setup, NULL);
    kiln_device_close(dev);
    return rc;
}
