/*
 * tests/autodiff/test-autodiff.c — the tape's semantics: accumulation across backward
 * calls and zero_grad, set_grad, no-grad sections, detach, retain_grad, retain_graph
 * and the freed-graph error, the error for an op without a backward, a tensor used
 * twice, checkpointing, leaf rules, and that tapes are freed when their outputs die
 * (the sanitizer build turns a leaked node into a failure).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "autograd-impl.h"
#include "kiln/autodiff.h"

static kiln_device *dev;

static int setup(void **state)
{
    (void)state;
    dev = kiln_device_open("ref");
    return dev ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    kiln_device_close(dev);
    return 0;
}

static kiln_tensor *vec(int64_t n, const double *v)
{
    return kiln_from_data(dev, KILN_F64, 1, &n, v, (size_t)n * sizeof(double));
}

static void expect_values(kiln_tensor *t, const double *want, int n)
{
    if (!t)
        fail_msg("tensor is NULL: %s", kiln_error());
    double got[16];
    assert_int_equal(kiln_tensor_numel(t), n);
    assert_int_equal(kiln_to_data(kiln_cast(t, KILN_F64), got, (size_t)n * sizeof(double)), 0);
    for (int i = 0; i < n; i++)
        if (fabs(got[i] - want[i]) > 1e-12)
            fail_msg("element %d: got %.15g, want %.15g", i, got[i], want[i]);
}
#define EXPECT(t, ...) expect_values((t), (const double[]){__VA_ARGS__}, \
    (int)(sizeof((double[]){__VA_ARGS__}) / sizeof(double)))

static void test_accumulate_and_zero(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *x = kiln_requires_grad(vec(3, (double[]){1, 2, 3}), true);
    assert_true(kiln_tensor_requires_grad(x));
    assert_false(kiln_tensor_has_grad_fn(x));
    assert_null(kiln_grad(x));
    /* x used twice in one expression: d(x*x + 3x)/dx = 2x + 3 */
    kiln_tensor *y = kiln_add(kiln_mul(x, x), kiln_mul_scalar(x, 3));
    assert_true(kiln_tensor_has_grad_fn(y));
    assert_int_equal(kiln_backward(kiln_sum(y, KILN_ALL_DIMS, false), NULL), 0);
    EXPECT(kiln_grad(x), 5, 7, 9);
    /* a second backward over a new graph adds */
    assert_int_equal(kiln_backward(kiln_sum(kiln_mul_scalar(x, 2), KILN_ALL_DIMS, false), NULL), 0);
    EXPECT(kiln_grad(x), 7, 9, 11);
    kiln_zero_grad(x);
    assert_null(kiln_grad(x));
    assert_int_equal(kiln_backward(kiln_sum(x, KILN_ALL_DIMS, false), NULL), 0);
    EXPECT(kiln_grad(x), 1, 1, 1);
    /* set_grad replaces (and copies), NULL clears */
    kiln_tensor *g = vec(3, (double[]){4, 5, 6});
    assert_int_equal(kiln_set_grad(x, g), 0);
    EXPECT(kiln_grad(x), 4, 5, 6);
    assert_int_not_equal(kiln_set_grad(x, vec(2, (double[]){1, 2})), 0);
    assert_int_equal(kiln_set_grad(x, NULL), 0);
    assert_null(kiln_grad(x));
    /* grad_output for a non-scalar output; backward from a leaf itself */
    kiln_tensor *z = kiln_mul_scalar(x, 2);
    assert_int_equal(kiln_backward(z, vec(3, (double[]){1, 0, -1})), 0);
    EXPECT(kiln_grad(x), 2, 0, -2);
    assert_int_not_equal(kiln_backward(kiln_mul_scalar(x, 2), NULL), 0);
    assert_non_null(strstr(kiln_error(), "more than one element"));
    kiln_zero_grad(x);
    assert_int_equal(kiln_backward(x, vec(3, (double[]){1, 2, 3})), 0);
    EXPECT(kiln_grad(x), 1, 2, 3);
    kiln_scope_end();
}

static void test_leaf_rules(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *i = kiln_arange(dev, KILN_I64, 0, 3, 1);
    assert_null(kiln_requires_grad(i, true));
    assert_non_null(strstr(kiln_error(), "floating"));
    kiln_tensor *x = kiln_requires_grad(vec(2, (double[]){1, 2}), true);
    kiln_tensor *y = kiln_exp(x);
    assert_null(kiln_requires_grad(y, false));
    assert_non_null(strstr(kiln_error(), "not a leaf"));
    /* comparisons, argmax and integer results never require grad */
    assert_false(kiln_tensor_requires_grad(kiln_gt(x, kiln_zeros_like(x))));
    assert_false(kiln_tensor_requires_grad(kiln_argmax(x, 0, false)));
    assert_false(kiln_tensor_requires_grad(kiln_isnan(x)));
    assert_int_not_equal(kiln_backward(kiln_sum(kiln_gt(x, kiln_zeros_like(x)), KILN_ALL_DIMS, false), NULL), 0);
    assert_non_null(strstr(kiln_error(), "does not require grad"));
    /* turning it off: later ops record nothing */
    kiln_requires_grad(x, false);
    assert_false(kiln_tensor_requires_grad(kiln_exp(x)));
    kiln_scope_end();
}

static void test_no_grad(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *x = kiln_requires_grad(vec(2, (double[]){1, 2}), true);
    assert_true(kiln_grad_enabled());
    kiln_no_grad_begin();
    kiln_no_grad_begin();
    assert_false(kiln_grad_enabled());
    kiln_tensor *a = kiln_exp(x);
    kiln_no_grad_end();
    kiln_tensor *b = kiln_mul(x, x);
    kiln_no_grad_end();
    assert_true(kiln_grad_enabled());
    assert_false(kiln_tensor_requires_grad(a));
    assert_false(kiln_tensor_has_grad_fn(b));
    /* a no-grad result used later is a constant */
    assert_int_equal(kiln_backward(kiln_sum(kiln_mul(x, a), KILN_ALL_DIMS, false), NULL), 0);
    EXPECT(kiln_grad(x), exp(1), exp(2));
    kiln_scope_end();
}

static void test_detach(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *x = kiln_requires_grad(vec(2, (double[]){3, 4}), true);
    kiln_tensor *y = kiln_mul(x, x);
    kiln_tensor *d = kiln_detach(y);
    assert_true(kiln_tensor_shares_storage(d, y));
    assert_false(kiln_tensor_requires_grad(d));
    assert_false(kiln_tensor_has_grad_fn(d));
    /* d(y.detach() * x)/dx = y */
    assert_int_equal(kiln_backward(kiln_sum(kiln_mul(d, x), KILN_ALL_DIMS, false), NULL), 0);
    EXPECT(kiln_grad(x), 9, 16);
    /* a detached view can become a leaf of its own */
    assert_non_null(kiln_requires_grad(d, true));
    kiln_scope_end();
}

static void test_retain_grad(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *x = kiln_requires_grad(vec(2, (double[]){1, 2}), true);
    kiln_tensor *h = kiln_mul_scalar(x, 3);
    kiln_tensor *h2 = kiln_exp(x);
    assert_int_equal(kiln_retain_grad(h), 0);
    kiln_tensor *loss = kiln_sum(kiln_add(kiln_square(h), h2), KILN_ALL_DIMS, false);
    assert_int_equal(kiln_backward(loss, NULL), 0);
    EXPECT(kiln_grad(h), 6, 12);        /* 2h */
    assert_null(kiln_grad(h2));         /* not retained */
    EXPECT(kiln_grad(x), 18 + exp(1), 36 + exp(2));
    assert_int_not_equal(kiln_retain_grad(vec(1, (double[]){1})), 0);
    kiln_scope_end();
}

static void test_retain_graph(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *x = kiln_requires_grad(vec(2, (double[]){1, 2}), true);
    kiln_tensor *e = kiln_exp(kiln_mul(x, x));
    kiln_tensor *loss = kiln_sum(e, KILN_ALL_DIMS, false);
    kiln__node *en = ((kiln__meta *)e->autograd)->node;
    assert_int_equal(kiln_backward_retain(loss, NULL, true), 0);
    assert_non_null(en->saved[1]); /* exp's output, kept for the next pass */
    assert_null(en->saved[0]);     /* its input: its backward never reads it */
    assert_int_equal(kiln_backward_retain(loss, NULL, false), 0);
    assert_null(en->saved[0]);           /* released as soon as the node ran */
    assert_null(en->saved[1]);
    assert_true(en->freed);
    EXPECT(kiln_grad(x), 2 * 2 * exp(1), 2 * 4 * exp(4));
    /* the graph was freed by the second pass */
    assert_int_not_equal(kiln_backward(loss, NULL), 0);
    assert_non_null(strstr(kiln_error(), "already freed"));
    assert_non_null(strstr(kiln_error(), "retain_graph"));
    EXPECT(kiln_grad(x), 2 * 2 * exp(1), 2 * 4 * exp(4));
    kiln_scope_end();
}

static void test_no_backward_error(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *x = kiln_requires_grad(vec(2, (double[]){1, 2}), true);
    /* an op recorded without a backward function (as a future op might be) */
    kiln_tensor *y = kiln_exp(kiln_detach(x));
    bool failed;
    kiln__node *n = kiln__ad_record(y, "mystery_op", NULL, 1, &x, &failed);
    assert_non_null(n);
    assert_false(failed);
    assert_int_not_equal(kiln_backward(kiln_sum(kiln_mul_scalar(y, 2), KILN_ALL_DIMS, false), NULL), 0);
    assert_non_null(strstr(kiln_error(), "'mystery_op' has no backward"));
    assert_null(kiln_grad(x));
    kiln_scope_end();
}

/* The tape is freed with its outputs, whether or not backward runs (the ASan build
 * checks the "freed" part; here a long chain checks that freeing does not recurse). */
static void test_tape_lifetime(void **state)
{
    (void)state;
    kiln_tensor *x = kiln_requires_grad(vec(2, (double[]){1, 2}), true);
    kiln_scope_begin();
    kiln_tensor *y = x;
    for (int i = 0; i < 20000; i++)
        y = kiln_add_scalar(y, 1e-3);
    kiln_tensor *kept = kiln_keep(kiln_sum(y, KILN_ALL_DIMS, false));
    kiln_scope_end();     /* the intermediates go; kept still owns the whole chain */
    assert_true(kiln_tensor_has_grad_fn(kept));
    assert_int_equal(kiln_backward(kept, NULL), 0);
    kiln_scope_begin();
    EXPECT(kiln_grad(x), 1, 1);
    kiln_scope_end();
    kiln_tensor_release(kept);
    /* an unused graph goes with its scope */
    kiln_scope_begin();
    kiln_tensor *z = kiln_matmul(kiln_unsqueeze(x, 0), kiln_unsqueeze(kiln_exp(x), 1));
    assert_true(kiln_tensor_has_grad_fn(z));
    kiln_scope_end();
    kiln_tensor_release(x);
}

static kiln_tensor *block(void *ud, int n, kiln_tensor *const *in)
{
    (void)n;
    kiln_tensor *w = ud;
    kiln_tensor *h = kiln_tanh(kiln_matmul(in[0], w));
    return kiln_mul(kiln_sigmoid(h), in[1]);
}

static void test_checkpoint(void **state)
{
    (void)state;
    double xv[6] = {0.1, -0.2, 0.3, 0.4, -0.5, 0.6}, wv[6] = {0.5, -1, 0.25, 0.75, -0.3, 0.2};
    double ref[3][6];
    for (int mode = 0; mode < 2; mode++) {
        kiln_scope_begin();
        kiln_tensor *x = kiln_requires_grad(kiln_from_data(dev, KILN_F64, KILN_SHAPE(2, 3), xv, sizeof xv), true);
        kiln_tensor *w = kiln_requires_grad(kiln_from_data(dev, KILN_F64, KILN_SHAPE(3, 2), wv, sizeof wv), true);
        kiln_tensor *s = kiln_requires_grad(kiln_from_data(dev, KILN_F64, KILN_SHAPE(2), xv, 2 * sizeof(double)), true);
        kiln_tensor *pre = kiln_exp(x);             /* a recorded op before the block */
        kiln_tensor *in[2] = {pre, s};
        kiln_tensor *y = mode ? kiln_checkpoint(block, w, 2, in) : block(w, 2, in);
        assert_non_null(y);
        if (mode) {
            assert_true(kiln_tensor_has_grad_fn(y));
        }
        assert_int_equal(kiln_backward(kiln_sum(kiln_square(y), KILN_ALL_DIMS, false), NULL), 0);
        kiln_tensor *gs[3] = {kiln_grad(x), kiln_grad(w), kiln_grad(s)};
        for (int k = 0; k < 3; k++) {
            double got[6] = {0};
            assert_non_null(gs[k]);
            assert_int_equal(kiln_to_data(gs[k], got, (size_t)kiln_tensor_numel(gs[k]) * sizeof(double)), 0);
            for (int j = 0; j < kiln_tensor_numel(gs[k]); j++) {
                if (mode == 0)
                    ref[k][j] = got[j];
                else if (fabs(got[j] - ref[k][j]) > 1e-12)
                    fail_msg("checkpoint grad %d[%d]: %.15g vs %.15g", k, j, got[j], ref[k][j]);
            }
        }
        kiln_scope_end();
    }
    /* without any input requiring grad, checkpoint is a plain call */
    kiln_scope_begin();
    kiln_tensor *c = kiln_ones(dev, KILN_F64, KILN_SHAPE(2, 3));
    kiln_tensor *w = kiln_ones(dev, KILN_F64, KILN_SHAPE(3, 2));
    kiln_tensor *in[2] = {c, kiln_ones(dev, KILN_F64, KILN_SHAPE(2))};
    kiln_tensor *y = kiln_checkpoint(block, w, 2, in);
    assert_non_null(y);
    assert_false(kiln_tensor_requires_grad(y));
    kiln_scope_end();
}

/* Gradients come back in each input's dtype; mixed-dtype binary ops and casts. */
static void test_dtypes(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *a = kiln_requires_grad(kiln_cast(vec(2, (double[]){1, 2}), KILN_F32), true);
    kiln_tensor *b = kiln_requires_grad(vec(2, (double[]){3, 4}), true);
    kiln_tensor *y = kiln_mul(a, b); /* f64 */
    assert_int_equal(kiln_tensor_dtype(y), KILN_F64);
    assert_int_equal(kiln_backward(kiln_sum(y, KILN_ALL_DIMS, false), NULL), 0);
    assert_int_equal(kiln_tensor_dtype(kiln_grad(a)), KILN_F32);
    EXPECT(kiln_grad(a), 3, 4);
    EXPECT(kiln_grad(b), 1, 2);
    kiln_scope_end();
}

/* A leaf's gradient outlives the scope its backward ran in. */
static void test_scope_clean(void **state)
{
    (void)state;
    kiln_tensor *x = kiln_requires_grad(vec(3, (double[]){1, 2, 3}), true);
    kiln_scope_begin();
    kiln_tensor *loss = kiln_sum(kiln_softmax(kiln_mul(x, x), 0), KILN_ALL_DIMS, false);
    assert_int_equal(kiln_backward(loss, NULL), 0);
    kiln_scope_end();
    kiln_scope_begin();
    assert_non_null(kiln_grad(x));
    kiln_scope_end();
    kiln_tensor_release(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accumulate_and_zero),
        cmocka_unit_test(test_leaf_rules),
        cmocka_unit_test(test_no_grad),
        cmocka_unit_test(test_detach),
        cmocka_unit_test(test_retain_grad),
        cmocka_unit_test(test_retain_graph),
        cmocka_unit_test(test_no_backward_error),
        cmocka_unit_test(test_tape_lifetime),
        cmocka_unit_test(test_checkpoint),
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_scope_clean),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
