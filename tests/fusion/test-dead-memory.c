/*
 * tests/fusion/test-dead-memory.c — a fused group's dead intermediates give their memory
 * back when they are freed, not at the flush. A value the group makes (its first call
 * touching the buffer writes it) and that is freed while the group is pending is never
 * stored by the fused kernel, so the decorator detaches its block at once (buffer_detach)
 * and the next allocation takes it: the chain below peaks at what unfused execution
 * holds, not one buffer per intermediate. A replayed group (codegen=off) reattaches the
 * detached buffers a later call reads and skips the calls that only write a dead value
 * nothing reads. A buffer the group only reads (made before it) keeps its memory when
 * freed under the group, and the result stays right. The chain again on vulkan:0, whose
 * allocator detaches too, where it opens. (ResNet-50 and the training steps
 * of bench/engine/fusion-bench, whose producers head groups, report their peaks.)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "fusion-test.h"

#define N ((int64_t)1 << 18) /* 1 MiB of f32: an exact size class of the cpu pool */
#define MIB ((int64_t)1 << 20)

static int64_t in_use(kiln_device *d, int64_t *peak)
{
    kiln_device_memory m;
    if (kiln_device_memory_get(d, &m) < 0)
        return -1;
    if (peak)
        *peak = (int64_t)m.peak_in_use_bytes;
    return (int64_t)m.in_use_bytes;
}

/* Every element of t equals want (to float rounding). */
static bool all_equal(kiln_tensor *t, float want)
{
    float *v = malloc((size_t)N * sizeof *v);
    bool ok = v && t && kiln_to_data(t, v, (size_t)N * sizeof *v) == 0;
    for (int64_t i = 0; ok && i < N; i++)
        ok = v[i] == want;
    free(v);
    return ok;
}

/* x = 1 (made and run), then y = 2x, z = y + 1, w = tanh(z), y and z released as soon as
 * the next value is made. Returns the peak above what was in use before y, in MiB. */
static double chain_peak(kiln_device *d, bool *right)
{
    kiln_tensor *x = kiln_full(d, KILN_F32, 1, (int64_t[]){N}, 1.0);
    if (!x || kiln_device_sync(d) < 0 || kiln_device_memory_reset_peak(d) < 0) {
        *right = false;
        kiln_tensor_release(x);
        return -1;
    }
    int64_t base = in_use(d, NULL), peak = 0;
    kiln_tensor *y = kiln_mul_scalar(x, 2);
    kiln_tensor *z = kiln_add_scalar(y, 1);
    kiln_tensor_release(y);
    kiln_tensor *w = kiln_tanh(z);
    kiln_tensor_release(z);
    *right = all_equal(w, tanhf(3.0f));
    (void)in_use(d, &peak);
    kiln_tensor_release(w);
    kiln_tensor_release(x);
    return (double)(peak - base) / (double)MIB;
}

/* The same chain on a GPU backend that detaches (vulkan:0 here: lavapipe, or a GPU), fused
 * against unfused; skipped, saying why, where it does not open. */
static void gpu_chain(const char *plain_spec, const char *fused_spec)
{
    kiln_device *plain = kiln_device_open(plain_spec);
    if (!plain) {
        printf("dead intermediates' memory on %s: skipped: it does not open here (%s)\n", plain_spec,
               kiln_error());
        return;
    }
    kiln_device *fused = kiln_device_open(fused_spec);
    CHECK(fused != NULL, "%s opens: %s", fused_spec, kiln_error());
    if (fused) {
        bool right_plain = false, right_fused = false;
        double unfused_peak = chain_peak(plain, &right_plain), fused_peak = chain_peak(fused, &right_fused);
        CHECK(right_plain && right_fused, "%s: tanh(2x+1) right unfused (%d) and fused (%d)", plain_spec,
              right_plain, right_fused);
        CHECK(fused_peak == unfused_peak && fused_peak > 0, "%s: fused peak %.2f MiB above x, as unfused (%.2f)",
              plain_spec, fused_peak, unfused_peak);
        kiln_device_close(fused);
    }
    kiln_device_close(plain);
}

void test_dead_memory(void)
{
    gpu_chain("vulkan:0?fusion=off", "fused:counting:vulkan:0?min_elements=0");

    kiln_device *plain = kiln_device_open("cpu");
    kiln_device *fused = kiln_device_open("fused:counting:cpu?min_elements=0");
    kiln_device *replay = kiln_device_open("fused:counting:cpu?codegen=off&min_elements=0");
    CHECK(plain && fused && replay, "devices open: %s", kiln_error());
    if (!plain || !fused || !replay)
        goto out;

    bool right = false;
    double unfused_peak = chain_peak(plain, &right);
    CHECK(right && unfused_peak == 2, "unfused: tanh(2x+1) right (%d), peak %.2f MiB above x (two live values)",
          right, unfused_peak);
    uint64_t fused_before = fusion_calls_of(fused, "fused");
    double fused_peak = chain_peak(fused, &right);
    CHECK(right && fusion_calls_of(fused, "fused") == fused_before + 1,
          "fused: tanh(2x+1) right (%d), one fused call", right);
    /* each dead intermediate's block went back when it was released (held to the flush,
     * y, z and w would all be in use: 3 MiB) */
    CHECK(fused_peak == unfused_peak, "fused peak %.2f MiB above x, as unfused (%.2f)", fused_peak, unfused_peak);

    /* replayed: y and z are read by later calls, so they get memory again at the flush */
    double replay_peak = chain_peak(replay, &right);
    CHECK(right && fusion_calls_of(replay, "fused") == 0,
          "codegen=off: tanh(2x+1) right (%d) without a fused call", right);
    CHECK(replay_peak <= 3, "codegen=off peak %.2f MiB (at most y, z and w)", replay_peak);

    /* replayed: a dead value nothing reads is not computed at all */
    kiln_tensor *x = kiln_full(replay, KILN_F32, 1, (int64_t[]){N}, 0.5);
    CHECK(x && kiln_device_sync(replay) == 0, "x made: %s", kiln_error());
    uint64_t unary_before = fusion_calls_of(replay, "unary");
    kiln_tensor *dead = kiln_exp(x);
    kiln_tensor *live = kiln_tanh(x);
    kiln_tensor_release(dead);
    CHECK(all_equal(live, tanhf(0.5f)), "codegen=off: tanh(x) right beside a dead exp(x)");
    CHECK(fusion_calls_of(replay, "unary") == unary_before + 1,
          "codegen=off ran %llu unary calls for one live value",
          (unsigned long long)(fusion_calls_of(replay, "unary") - unary_before));
    kiln_tensor_release(live);
    kiln_tensor_release(x);

    /* a buffer the group reads, made before it and freed under it, keeps its memory */
    for (int k = 0; k < 2; k++) {
        kiln_device *d = k ? replay : fused;
        kiln_tensor *a = kiln_full(d, KILN_F32, 1, (int64_t[]){N}, 0.25);
        CHECK(a && kiln_device_sync(d) == 0, "a made: %s", kiln_error());
        kiln_tensor *b = kiln_neg(a);
        kiln_tensor_release(a);
        kiln_tensor *c = kiln_full(d, KILN_F32, 1, (int64_t[]){N}, 7.0); /* a new block: not a's */
        kiln_tensor *e = kiln_add(b, c);
        CHECK(all_equal(e, 6.75f), "%s: -a + 7 right after a was freed under the group",
              k ? "codegen=off" : "fused");
        kiln_tensor_release(b);
        kiln_tensor_release(c);
        kiln_tensor_release(e);
    }
    int64_t left = in_use(fused, NULL);
    CHECK(left == 0, "fused device: %lld bytes still in use after every tensor was released", (long long)left);
out:
    kiln_device_close(plain);
    kiln_device_close(fused);
    kiln_device_close(replay);
}
