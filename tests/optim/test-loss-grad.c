/*
 * tests/optim/test-loss-grad.c — the gradient of every loss with respect to its input
 * (x1 for the cosine embedding loss), through kiln's autodiff, against
 * torch.autograd's: backward of the sum of the loss (so reduction none is covered too).
 */
#include "kiln/autodiff.h"
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

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_loss_gradients),
};

FIXTURE_MAIN(tests)
