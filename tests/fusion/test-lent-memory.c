/*
 * tests/fusion/test-lent-memory.c — host memory a caller lends with kiln_from_host_memory, on
 * fused devices. The caller may write its memory between any two ops (a data loader refilling
 * its batch buffer) and may read it after an op that writes through the tensor (an optimizer
 * step on lent parameters): each op touching lent memory must have run when it returns, as on
 * the plain cpu. A fused device used to record such an op and read the memory only at its
 * flush, so a refill reached an op that had already returned. Ops on values made from lent
 * memory still fuse as before.
 */
#include <stdlib.h>
#include <string.h>

#include "fusion-test.h"
#include "kiln/optim.h"

#define LENT_N (1 << 18) /* over the cpu's min_elements: every op here starts or joins a group */

static void lent_on(const char *spec)
{
    kiln_device *dev = kiln_device_open(spec);
    CHECK(dev != NULL, "open %s: %s", spec, kiln_error());
    if (!dev)
        return;
    float *buf = aligned_alloc(64, LENT_N * sizeof(float));
    for (int i = 0; i < LENT_N; i++)
        buf[i] = 1.0f;
    kiln_tensor *x = kiln_from_host_memory(dev, KILN_F32, 1, (int64_t[]){LENT_N}, buf, NULL, NULL);
    CHECK(x != NULL, "%s: from_host_memory: %s", spec, kiln_error());
    uint64_t calls_before = fusion_calls_of(dev, "fused");
    kiln_tensor *x1 = kiln_add_scalar(x, 1.0); /* reads lent memory: runs before it returns */
    kiln_tensor *y = kiln_relu(x1);            /* and these fuse as before */
    kiln_tensor *z = kiln_mul_scalar(y, 3.0);
    for (int i = 0; i < LENT_N; i++) /* the caller refills its buffer */
        buf[i] = 50.0f;
    float first = 0, last = 0;
    kiln_tensor *head = kiln_slice(z, 0, 0, 1, 1), *tail = kiln_slice(z, 0, LENT_N - 1, LENT_N, 1);
    CHECK(kiln_to_data(head, &first, sizeof first) == 0 && kiln_to_data(tail, &last, sizeof last) == 0,
          "%s: read: %s", spec, kiln_error());
    CHECK(first == 6.0f && last == 6.0f, "%s: ops that returned before the refill saw the old data: %g %g, want 6",
          spec, first, last);
    if (strncmp(spec, "fused:counting", 14) == 0) /* counted below the decorator */
        CHECK(fusion_calls_of(dev, "fused") > calls_before, "%s: relu and mul on its result still fused", spec);
    /* an op writing through the lent tensor (gradients clamped in place): its result is in the
     * memory when it returns */
    for (int i = 0; i < LENT_N; i++)
        buf[i] = i % 2 ? -5.0f : 5.0f;
    CHECK(kiln_grads_clip_value(1, &x, 1.0) == 0, "%s: clip in place: %s", spec, kiln_error());
    CHECK(buf[0] == 1.0f && buf[LENT_N - 1] == -1.0f,
          "%s: the clamp of lent memory is there when it returns: %g %g, want 1 -1", spec, buf[0],
          buf[LENT_N - 1]);
    kiln_tensor *ts[] = {x1, y, z, head, tail, x};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
        kiln_tensor_release(ts[i]);
    kiln_device_close(dev);
    free(buf);
}

void test_lent_memory(void)
{
    lent_on("cpu?fusion=on");
    lent_on("fused:cpu?min_elements=0");
    lent_on("fused:ref");
    lent_on("fused:counting:cpu"); /* counted below the decorator, which keeps its own sets */
    lent_on("counting:fused:cpu"); /* the counting decorator passes the lent wrap on */
}
