/*
 * tests/optim/test-loss-grad.c — the gradient of every loss with respect to its input
 * (x1 for the cosine embedding loss), through kiln's autodiff, against
 * torch.autograd's: backward of the sum of the loss (so reduction none is covered too).
 */
#include "kiln/autodiff.h"
#include "kiln/nn.h"
#include "loss-cases.h"

#define RTOL 1e-4
#define ATOL 1e-6

static void test_loss_gradients(void **state)
{
    (void)state;
    const cJSON *c;
    int n = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(ref_doc, "losses"))
    {
        if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "grad")))
            continue;
        kiln_scope_begin();
        const char *name = jstr(c, "name");
        kiln_tensor *x = kiln_clone(case_input(c, jstr(c, "diff")));
        assert_non_null(kiln_requires_grad(x, true));
        kiln_tensor *loss = run_loss_case(c, x);
        if (!loss)
            fail_msg("%s: %s", name, kiln_error());
        kiln_tensor *total = kiln_sum(loss, KILN_ALL_DIMS, false);
        if (kiln_backward(total, NULL) < 0)
            fail_msg("%s: backward: %s", name, kiln_error());
        kiln_tensor *g = kiln_grad(x);
        if (!g)
            fail_msg("%s: no gradient reached the input", name);
        char what[160];
        snprintf(what, sizeof what, "%s gradient", name);
        expect_close(g, case_input(c, "grad"), RTOL, ATOL, what);
        kiln_requires_grad(x, false);
        kiln_scope_end();
        n++;
    }
    assert_true(n >= 50);
}

/* kiln_optim_step reads kiln_grad(); clipping through the optimizer goes back into the
 * gradients with kiln_set_grad. Both must equal the explicit-gradient path. */
static void test_optim_autograd_path(void **state)
{
    (void)state;
    kiln_generator gen = kiln_generator_make(3);
    kiln_scope_begin();
    kiln_tensor *x = kiln_rand_normal(dev, KILN_F32, KILN_SHAPE(8, 3), 0, 1, &gen);
    kiln_tensor *y = kiln_rand_normal(dev, KILN_F32, KILN_SHAPE(8, 2), 0, 1, &gen);
    kiln_tensor *w0 = kiln_rand_normal(dev, KILN_F32, KILN_SHAPE(2, 3), 0, 1, &gen);
    kiln_tensor *wa = kiln_clone(w0), *wb = kiln_clone(w0);
    assert_non_null(kiln_requires_grad(wa, true));
    kiln_optim_config cfg = kiln_optim_config_default(KILN_OPTIM_ADAM);
    cfg.lr = 0.1;
    kiln_optim *oa = kiln_optim_create(&cfg, 1, &wa, NULL);
    kiln_optim *ob = kiln_optim_create(&cfg, 1, &wb, NULL);
    for (int s = 0; s < 5; s++) {
        kiln_scope_begin();
        kiln_tensor *loss = kiln_loss_mse(kiln_linear(x, wa, NULL), y, KILN_REDUCTION_MEAN);
        assert_int_equal(kiln_backward(loss, NULL), 0);
        kiln_tensor *g = kiln_clone(kiln_grad(wa));
        double n1 = kiln_optim_clip_grad_norm(oa, 0.5, 2);
        double n2 = kiln_grads_clip_norm(1, &g, 0.5, 2);
        assert_true(n1 > 0 && fabs(n1 - n2) <= 1e-6 * n2);
        expect_close(kiln_grad(wa), g, 1e-6, 1e-7, "clipped through the optimizer");
        assert_int_equal(kiln_optim_step(oa), 1);
        assert_int_equal(kiln_optim_step_grads(ob, &g), 1);
        kiln_optim_zero_grad(oa);
        assert_null(kiln_grad(wa));
        expect_close(wa, wb, 1e-6, 1e-7, "kiln_optim_step");
        kiln_scope_end();
    }
    assert_false(kiln_tensor_has_grad_fn(wa)); /* updates are not recorded */
    kiln_optim_free(oa);
    kiln_optim_free(ob);
    kiln_requires_grad(wa, false);
    kiln_scope_end();
}

/* The constructor from an nn module takes its parameters under their dotted names. */
static void test_optim_from_module(void **state)
{
    (void)state;
    kiln_generator gen = kiln_generator_make(5);
    kiln_linear_config lc = kiln_linear_config_default();
    lc.in_features = 3;
    lc.out_features = 2;
    kiln_module *fc = kiln_linear_init(&lc, dev, &gen);
    assert_non_null(fc);
    kiln_optim_config cfg = kiln_optim_config_default(KILN_OPTIM_SGD);
    kiln_optim *opt = kiln_optim_create_module(&cfg, fc);
    if (!opt)
        fail_msg("%s", kiln_error());
    assert_int_equal(kiln_optim_param_count(opt), 2);
    assert_string_equal(kiln_optim_param_name(opt, 0), "weight");
    assert_string_equal(kiln_optim_param_name(opt, 1), "bias");
    kiln_optim_free(opt);
    kiln_module_free(fc);
    assert_null(kiln_optim_create_module(&cfg, NULL));
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_optim_from_module),
    cmocka_unit_test(test_loss_gradients),
    cmocka_unit_test(test_optim_autograd_path),
};

FIXTURE_MAIN(tests)
