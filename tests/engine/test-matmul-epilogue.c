/*
 * tests/engine/test-matmul-epilogue.c — kiln__matmul_epilogue (engine/ops-linalg.c), the
 * product with a bias, a residual and an activation that a backend's matmul_fused entry
 * may apply as it stores (cuda: cuBLASLt's epilogues; tests/cuda/test-cuda-device.c checks
 * that path on a GPU). Here, on cpu and ref, which have no such entry: the result equals the
 * separate ops bit for bit (plain, batched, a residual that broadcasts, an activation with
 * parameters), gradients flow when an operand requires them, and bad shapes fail with
 * matmul's or add's message.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kiln/autodiff.h"
#include "kiln/kiln.h"
#include "tensor-impl.h"

static int failures, checks;

#define CHECK(cond, ...)                                                                                          \
    do {                                                                                                          \
        checks++;                                                                                                 \
        if (!(cond)) {                                                                                            \
            failures++;                                                                                           \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                       \
            fprintf(stderr, __VA_ARGS__);                                                                         \
            fprintf(stderr, " (last error: %s)\n", kiln_error());                                                 \
        }                                                                                                         \
    } while (0)

/* Same shape and the same f32 bits. */
static bool same(kiln_tensor *a, kiln_tensor *b)
{
    if (!a || !b || kiln_tensor_ndim(a) != kiln_tensor_ndim(b) || kiln_tensor_numel(a) != kiln_tensor_numel(b))
        return false;
    for (int d = 0; d < kiln_tensor_ndim(a); d++)
        if (kiln_tensor_dim(a, d) != kiln_tensor_dim(b, d))
            return false;
    int64_t n = kiln_tensor_numel(a);
    float x[512], y[512];
    if (n > 512 || kiln_to_data(a, x, (size_t)n * sizeof *x) || kiln_to_data(b, y, (size_t)n * sizeof *y))
        return false;
    return memcmp(x, y, (size_t)n * sizeof *x) == 0;
}

static void check_device(const char *spec)
{
    kiln_device *dev = kiln_device_open(spec);
    CHECK(dev != NULL, "open %s", spec);
    if (!dev)
        return;
    kiln_generator g = kiln_generator_make(5);
    kiln_scope_begin();
    kiln_tensor *a = kiln_rand_normal(dev, KILN_F32, 2, (int64_t[]){5, 7}, 0, 1, &g);
    kiln_tensor *a3 = kiln_rand_normal(dev, KILN_F32, 3, (int64_t[]){2, 5, 7}, 0, 1, &g);
    kiln_tensor *b = kiln_rand_normal(dev, KILN_F32, 2, (int64_t[]){7, 3}, 0, 1, &g);
    kiln_tensor *bias = kiln_rand_normal(dev, KILN_F32, 1, (int64_t[]){3}, 0, 1, &g);
    kiln_tensor *res = kiln_rand_normal(dev, KILN_F32, 2, (int64_t[]){5, 3}, 0, 1, &g);
    kiln_tensor *res3 = kiln_rand_normal(dev, KILN_F32, 3, (int64_t[]){2, 5, 3}, 0, 1, &g);
    kiln_tensor *col = kiln_rand_normal(dev, KILN_F32, 2, (int64_t[]){5, 1}, 0, 1, &g);

    kiln_tensor *got = kiln__matmul_epilogue(a, b, bias, res, KILN_EPI_RELU, 0, 0);
    kiln_tensor *want = kiln_relu(kiln_add(kiln_add(kiln_matmul(a, b), bias), res));
    CHECK(same(got, want), "%s: bias, residual, relu", spec);

    got = kiln__matmul_epilogue(a3, b, bias, res3, KILN_EPI_CLAMP, -0.5, 0.75);
    want = kiln_clamp(kiln_add(kiln_add(kiln_matmul(a3, b), bias), res3), -0.5, 0.75);
    CHECK(same(got, want), "%s: batched, clamp", spec);

    got = kiln__matmul_epilogue(a, b, NULL, col, KILN_EPI_LEAKY_RELU, 0.2, 0);
    want = kiln_leaky_relu(kiln_add(kiln_matmul(a, b), col), 0.2);
    CHECK(same(got, want), "%s: a residual that broadcasts", spec);

    got = kiln__matmul_epilogue(a, b, NULL, NULL, KILN_EPI_NONE, 0, 0);
    CHECK(same(got, kiln_matmul(a, b)), "%s: nothing to fold is the product", spec);

    /* gradients: the same as through the separate ops */
    kiln_tensor *bw = kiln_requires_grad(kiln_clone(b), true);
    kiln_tensor *loss = kiln_sum(kiln__matmul_epilogue(a, bw, bias, NULL, KILN_EPI_RELU, 0, 0), KILN_ALL_DIMS,
                                 false);
    CHECK(bw && loss && kiln_backward(loss, NULL) == 0, "%s: backward through the epilogue", spec);
    kiln_tensor *g1 = bw ? kiln_grad(bw) : NULL;
    kiln_tensor *bw2 = kiln_requires_grad(kiln_clone(b), true);
    kiln_tensor *loss2 = kiln_sum(kiln_relu(kiln_add(kiln_matmul(a, bw2), bias)), KILN_ALL_DIMS, false);
    CHECK(bw2 && loss2 && kiln_backward(loss2, NULL) == 0, "backward through the ops");
    kiln_tensor *g2 = bw2 ? kiln_grad(bw2) : NULL;
    CHECK(g1 && g2 && same(g1, g2), "%s: the weight's gradient equals the separate ops'", spec);
    CHECK(g1 && kiln_tensor_numel(g1) == 21, "%s: a gradient of the weight's size", spec);

    /* bad shapes fail with the op's message */
    kiln_error_clear();
    kiln_tensor *bad = kiln__matmul_epilogue(a, a, bias, NULL, KILN_EPI_RELU, 0, 0);
    CHECK(!bad && strstr(kiln_error(), "cannot be multiplied"), "%s: inner dims that differ", spec);
    kiln_error_clear();
    bad = kiln__matmul_epilogue(a, b, NULL, kiln_rand_normal(dev, KILN_F32, 1, (int64_t[]){4}, 0, 1, &g),
                                KILN_EPI_RELU, 0, 0);
    CHECK(!bad && kiln_error()[0], "%s: a residual that does not broadcast", spec);
    CHECK(!kiln__matmul_epilogue(NULL, b, NULL, NULL, KILN_EPI_RELU, 0, 0), "a NULL operand gives NULL");
    kiln_scope_end();
    kiln_device_close(dev);
}

int main(void)
{
    check_device("cpu");
    check_device("ref");
    printf("test-matmul-epilogue: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
