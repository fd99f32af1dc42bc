/*
 * tests/optim/test-loss.c — every loss of the fixture against PyTorch's value
 * (reductions, weights, ignore_index, label smoothing, probability targets, pos_weight,
 * log targets, margins), and bad inputs: shape mismatches, classes out of range, wrong
 * dtypes, bad options, each refused with a message naming the loss and the shapes.
 */
#include "loss-cases.h"

#define RTOL 1e-5
#define ATOL 1e-6

static void test_loss_values(void **state)
{
    (void)state;
    const cJSON *c;
    int n = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(ref_doc, "losses"))
    {
        kiln_scope_begin();
        const char *name = jstr(c, "name");
        kiln_tensor *got = run_loss_case(c, case_input(c, jstr(c, "diff")));
        if (!got)
            fail_msg("%s: %s", name, kiln_error());
        kiln_tensor *want = case_input(c, "value");
        if (kiln_tensor_ndim(got) != kiln_tensor_ndim(want))
            fail_msg("%s: rank %d, PyTorch %d", name, kiln_tensor_ndim(got), kiln_tensor_ndim(want));
        expect_close(got, want, RTOL, ATOL, name);
        kiln_scope_end();
        n++;
    }
    assert_true(n >= 50);
}

static void expect_loss_error(kiln_tensor *got, const char *a, const char *b)
{
    if (got)
        fail_msg("accepted a bad input (wanted an error mentioning %s)", a);
    if (!strstr(kiln_error(), a) || (b && !strstr(kiln_error(), b)))
        fail_msg("error \"%s\" does not mention \"%s\" and \"%s\"", kiln_error(), a, b ? b : "");
}

static void test_loss_bad_inputs(void **state)
{
    (void)state;
    kiln_scope_begin();
    kiln_tensor *logits = kiln_zeros(dev, KILN_F32, KILN_SHAPE(4, 3));
    kiln_tensor *t4 = kiln_from_data(dev, KILN_I64, KILN_SHAPE(4), (const int64_t[]){0, 1, 2, 1}, 32);
    kiln_tensor *t5 = kiln_zeros(dev, KILN_I64, KILN_SHAPE(5));
    kiln_tensor *big = kiln_from_data(dev, KILN_I64, KILN_SHAPE(4), (const int64_t[]){0, 3, 2, 1}, 32);
    kiln_tensor *negt = kiln_from_data(dev, KILN_I64, KILN_SHAPE(4), (const int64_t[]){0, -1, 2, 1}, 32);
    expect_loss_error(kiln_loss_cross_entropy(logits, t5, NULL), "cross_entropy", "i64[5]");
    expect_loss_error(kiln_loss_cross_entropy(logits, big, NULL), "cross_entropy", "out of bounds for size");
    expect_loss_error(kiln_loss_cross_entropy(logits, negt, NULL), "cross_entropy", "-1");
    /* -100 is the default ignore_index: ignored, not out of range. */
    kiln_tensor *ign = kiln_from_data(dev, KILN_I64, KILN_SHAPE(4), (const int64_t[]){0, -100, 2, 1}, 32);
    assert_non_null(kiln_loss_cross_entropy(logits, ign, NULL));
    kiln_tensor *bt = kiln_zeros(dev, KILN_BOOL, KILN_SHAPE(4));
    expect_loss_error(kiln_loss_cross_entropy(logits, bt, NULL), "cross_entropy", "bool");
    kiln_tensor *probs = kiln_zeros(dev, KILN_F32, KILN_SHAPE(4, 2));
    expect_loss_error(kiln_loss_cross_entropy(logits, probs, NULL), "cross_entropy", "f32[4, 2]");
    kiln_loss_ce_opts o = kiln_loss_ce_opts_default();
    o.weight = kiln_ones(dev, KILN_F32, KILN_SHAPE(4));
    expect_loss_error(kiln_loss_cross_entropy(logits, t4, &o), "cross_entropy", "weight");
    o = kiln_loss_ce_opts_default();
    o.label_smoothing = 1.5;
    expect_loss_error(kiln_loss_cross_entropy(logits, t4, &o), "cross_entropy", "label_smoothing");
    o = kiln_loss_ce_opts_default();
    o.label_smoothing = 0.1;
    expect_loss_error(kiln_loss_nll(logits, t4, &o), "nll_loss", "label_smoothing");
    o.label_smoothing = 0;
    o.reduction = KILN_REDUCTION_BATCHMEAN;
    expect_loss_error(kiln_loss_cross_entropy(logits, t4, &o), "cross_entropy", "reduction");
    kiln_tensor *ilog = kiln_zeros(dev, KILN_I64, KILN_SHAPE(4, 3));
    expect_loss_error(kiln_loss_cross_entropy(ilog, t4, NULL), "cross_entropy", "floating");
    expect_loss_error(kiln_loss_nll(logits, probs, NULL), "nll_loss", "f32[4, 3]");

    kiln_tensor *a = kiln_zeros(dev, KILN_F32, KILN_SHAPE(2, 3));
    kiln_tensor *b = kiln_zeros(dev, KILN_F32, KILN_SHAPE(3, 2));
    expect_loss_error(kiln_loss_mse(a, b, KILN_REDUCTION_MEAN), "mse_loss", "f32[3, 2]");
    expect_loss_error(kiln_loss_l1(a, b, KILN_REDUCTION_SUM), "l1_loss", "f32[2, 3]");
    expect_loss_error(kiln_loss_smooth_l1(a, a, -1, KILN_REDUCTION_SUM), "smooth_l1_loss", "beta");
    expect_loss_error(kiln_loss_huber(a, a, 0, KILN_REDUCTION_SUM), "huber_loss", "delta");
    expect_loss_error(kiln_loss_mse(a, a, KILN_REDUCTION_BATCHMEAN), "mse_loss", "reduction");
    expect_loss_error(kiln_loss_bce_with_logits(a, b, NULL, NULL, KILN_REDUCTION_MEAN),
                      "binary_cross_entropy_with_logits", "f32[3, 2]");
    kiln_tensor *out = kiln_full(dev, KILN_F32, KILN_SHAPE(2, 3), 1.5);
    expect_loss_error(kiln_loss_bce(out, a, NULL, KILN_REDUCTION_MEAN), "binary_cross_entropy", "[0, 1]");
    expect_loss_error(kiln_loss_kl_div(a, b, KILN_REDUCTION_BATCHMEAN, false), "kl_div", "f32[3, 2]");
    kiln_tensor *y = kiln_ones(dev, KILN_F32, KILN_SHAPE(3));
    expect_loss_error(kiln_loss_cosine_embedding(a, a, y, 0, KILN_REDUCTION_MEAN), "cosine_embedding_loss",
                      "f32[3]");
    /* NULL inputs chain quietly: NULL out, the earlier message kept. */
    kiln_error_clear();
    assert_null(kiln_loss_mse(NULL, a, KILN_REDUCTION_MEAN));
    assert_null(kiln_loss_cross_entropy(logits, NULL, NULL));
    assert_string_equal(kiln_error(), "");
    kiln_scope_end();
}

/* Losses hand their result to the caller's scope and leave no temporaries behind. */
static void test_loss_scope(void **state)
{
    (void)state;
    kiln_tensor *x = kiln_zeros(dev, KILN_F32, KILN_SHAPE(3, 4));
    kiln_tensor *t = kiln_zeros(dev, KILN_I64, KILN_SHAPE(3));
    kiln_tensor *l = kiln_loss_cross_entropy(x, t, NULL); /* no scope: caller owns it */
    assert_non_null(l);
    assert_true(fabs(kiln_item(l) - log(4.0)) < 1e-6);
    kiln_tensor_release(l);
    kiln_tensor_release(x);
    kiln_tensor_release(t);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_loss_values),
    cmocka_unit_test(test_loss_bad_inputs),
    cmocka_unit_test(test_loss_scope),
};

FIXTURE_MAIN(tests)
