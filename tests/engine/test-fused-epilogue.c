/*
 * tests/engine/test-fused-epilogue.c — kiln__epilogue (engine/ops-fused.c) after a matmul
 * on the cpu device, against the composed ops on ref and on cpu (test-fused.c runs them
 * in its group).
 */
#include "test-fused.h"

int epilogue_setup(void **state)
{
    (void)state;
    test_dev = group_ref_dev;
    return test_dev ? 0 : -1;
}

/* ------------------------------------------------------------------ epilogue */

static void check_epilogue(int64_t M, int64_t K, int64_t N)
{
    int64_t as[2] = {M, K}, bs[2] = {K, N}, ys[2] = {M, N}, vs[1] = {N};
    float *ha = host_rand(M * K, 1.0f), *hb = host_rand(K * N, (float)(1.7 / sqrt((double)K)));
    float *hbias = host_rand(N, 0.5f), *hr = host_rand(M * N, 1.0f);
    hr[3] = NAN;
    hr[M * N / 2] = INFINITY;
    hbias[N - 1] = -INFINITY;
    float *aa = host_abs(ha, M * K), *ab = host_abs(hb, K * N), *abias = host_abs(hbias, N),
          *ar = host_abs(hr, M * N);
    kiln_scope_begin();
    kiln_tensor *ar_ = mk(test_dev, 2, as, ha), *br_ = mk(test_dev, 2, bs, hb);
    kiln_tensor *biasr = mk(test_dev, 1, vs, hbias), *rr = mk(test_dev, 2, ys, hr);
    kiln_tensor *ac = mk(cpu_dev, 2, as, ha), *bc = mk(cpu_dev, 2, bs, hb);
    kiln_tensor *biasc = mk(cpu_dev, 1, vs, hbias), *rc = mk(cpu_dev, 2, ys, hr);
    kiln_tensor *mm = kiln_matmul(mk(test_dev, 2, as, aa), mk(test_dev, 2, bs, ab));
    kiln_tensor *mbias = mk(test_dev, 1, vs, abias), *mres = mk(test_dev, 2, ys, ar);
    for (int withb = 0; withb < 2; withb++)
        for (int withr = 0; withr < 2; withr++)
            for (int ai = 0; ai < NACTS; ai++) {
                const act_case *a = &acts[ai];
                char label[160];
                snprintf(label, sizeof label, "matmul %lldx%lldx%lld, %s%s%s", (long long)M, (long long)K,
                         (long long)N, withb ? "bias, " : "", withr ? "residual, " : "", a->name);
                kiln_scope_begin();
                kiln_tensor *yr = kiln_matmul(ar_, br_);
                if (withb)
                    yr = kiln_add(yr, biasr);
                if (withr)
                    yr = kiln_add(yr, rr);
                kiln_tensor *want = compose_act(yr, a);
                kiln_tensor *yu = kiln_matmul(ac, bc);
                if (withb)
                    yu = kiln_add(yu, biasc);
                if (withr)
                    yu = kiln_add(yu, rc);
                kiln_tensor *unf = compose_act(yu, a);
                kiln_tensor *y = kiln_matmul(ac, bc);
                kiln_tensor *got = kiln__epilogue(y, withb ? biasc : NULL, withr ? rc : NULL, a->act, a->alpha,
                                                  a->beta);
                /* a fresh matmul result nobody else holds is written in place */
                assert_ptr_equal(got, y);
                expect_dims(got, 2, ys);
                float *hw = host_of(want), *hu = host_of(unf), *hg = host_of(got);
                kiln_tensor *mt = mm;
                if (withb)
                    mt = kiln_add(mt, mbias);
                if (withr)
                    mt = kiln_add(mt, mres);
                float *m = host_of(mt);
                expect_close("epilogue vs ref", label, hg, hw, m, M * N, K, 1e-5);
                expect_bitwise("epilogue vs unfused cpu", label, hg, hu, M * N);
                free(m);
                free(hw);
                free(hu);
                free(hg);
                kiln_scope_end();
            }
    kiln_scope_end();
    free(ha);
    free(hb);
    free(hbias);
    free(hr);
    free(aa);
    free(ab);
    free(abias);
    free(ar);
}

void test_epilogue_matmul(void **state)
{
    (void)state;
    rng_state = 4;
    check_epilogue(5, 7, 3);
    check_epilogue(33, 64, 45);
    check_epilogue(1, 300, 1000); /* rows longer than the sigmoid's 256-element chunks */
    check_epilogue(64, 16, 257);
}

/* y shared with a view: the epilogue must leave the view's values alone (it takes the
 * separate ops and returns a new tensor). A residual that is y itself likewise. */
void test_epilogue_shared(void **state)
{
    (void)state;
    rng_state = 5;
    int64_t as[2] = {6, 5}, bs[2] = {5, 8}, vs[1] = {8};
    float *ha = host_rand(30, 1.0f), *hb = host_rand(40, 1.0f), *hbias = host_rand(8, 1.0f);
    kiln_scope_begin();
    kiln_tensor *a = mk(cpu_dev, 2, as, ha), *b = mk(cpu_dev, 2, bs, hb), *bias = mk(cpu_dev, 1, vs, hbias);

    kiln_tensor *y = kiln_matmul(a, b);
    kiln_tensor *view = kiln_reshape(y, KILN_SHAPE(48)); /* holds y's storage too */
    float *before = host_of(y);
    kiln_tensor *z = kiln__epilogue(y, bias, NULL, KILN_EPI_RELU, 0, 0);
    assert_non_null(z);
    assert_ptr_not_equal(z, y);
    float *after = host_of(view), *hz = host_of(z), *want = host_of(kiln_relu(kiln_add(kiln_matmul(a, b), bias)));
    expect_bitwise("view of y after epilogue", "shared y", after, before, 48);
    expect_bitwise("epilogue on shared y", "shared y", hz, want, 48);

    kiln_tensor *y2 = kiln_matmul(a, b);
    float *h2 = host_of(y2);
    kiln_tensor *z2 = kiln__epilogue(y2, NULL, y2, KILN_EPI_NONE, 0, 0);
    float *hz2 = host_of(z2);
    for (int i = 0; i < 48; i++)
        assert_true(same_bits(hz2[i], h2[i] + h2[i]));

    free(ha);
    free(hb);
    free(hbias);
    free(before);
    free(after);
    free(hz);
    free(want);
    free(h2);
    free(hz2);
    kiln_scope_end();
}

/* Bias or residual shapes and dtypes the in-place path does not take: the separate ops
 * broadcast and promote as kiln_add does. */
void test_epilogue_fallbacks(void **state)
{
    (void)state;
    rng_state = 6;
    int64_t as[2] = {4, 3}, bs[2] = {3, 6};
    float *ha = host_rand(12, 1.0f), *hb = host_rand(18, 1.0f), *hv = host_rand(24, 1.0f);
    kiln_scope_begin();
    kiln_tensor *a = mk(cpu_dev, 2, as, ha), *b = mk(cpu_dev, 2, bs, hb);
    kiln_tensor *col = mk(cpu_dev, KILN_SHAPE(4, 1), hv);  /* broadcast over columns */
    kiln_tensor *row2 = mk(cpu_dev, KILN_SHAPE(1, 6), hv); /* a bias that is not 1-D */
    kiln_tensor *r64 = kiln_cast(mk(cpu_dev, KILN_SHAPE(4, 6), hv), KILN_F64);

    kiln_tensor *z = kiln__epilogue(kiln_matmul(a, b), NULL, col, KILN_EPI_LEAKY_RELU, 0.1, 0);
    float *hz = host_of(z), *hw = host_of(kiln_leaky_relu(kiln_add(kiln_matmul(a, b), col), 0.1));
    expect_dims(z, KILN_SHAPE(4, 6));
    expect_bitwise("residual [4,1]", "epilogue fallback", hz, hw, 24);
    free(hz);
    free(hw);

    z = kiln__epilogue(kiln_matmul(a, b), row2, NULL, KILN_EPI_HARD_SWISH, 0, 0);
    hz = host_of(z);
    hw = host_of(compose_act(kiln_add(kiln_matmul(a, b), row2), &acts[8]));
    expect_bitwise("bias [1,6]", "epilogue fallback", hz, hw, 24);
    free(hz);
    free(hw);

    z = kiln__epilogue(kiln_matmul(a, b), NULL, r64, KILN_EPI_SIGMOID, 0, 0);
    assert_non_null(z);
    assert_int_equal(kiln_tensor_dtype(z), KILN_F64);
    double gz[24], gw[24];
    assert_int_equal(kiln_to_data(z, gz, sizeof gz), 0);
    assert_int_equal(kiln_to_data(kiln_sigmoid(kiln_add(kiln_matmul(a, b), r64)), gw, sizeof gw), 0);
    for (int i = 0; i < 24; i++)
        assert_true(gz[i] == gw[i]);

    /* shapes that do not broadcast: an error, as from kiln_add */
    kiln_error_clear();
    assert_null(kiln__epilogue(kiln_matmul(a, b), NULL, mk(cpu_dev, KILN_SHAPE(5), hv), KILN_EPI_RELU, 0, 0));
    assert_true(kiln_error()[0] != 0);
    assert_null(kiln__epilogue(NULL, NULL, NULL, KILN_EPI_RELU, 0, 0));
    kiln_scope_end();
    free(ha);
    free(hb);
    free(hv);
}
