/*
 * tests/backend-iface/test-deferred-errors.c — an error an asynchronous device reports late
 * spoils the values it touched, for good.
 *
 * On vulkan:0 an out-of-range index is found on the device and reported at the next drain
 * of the queue (a read or a sync). Before, only that first drain failed: a second read of
 * the same result, or of a result computed from it, answered rc 0 with made-up values, and
 * a save wrote them to disk. Checked here: every later read of a spoiled value fails with
 * the error, so does a value computed from it afterwards, while values that depend on
 * nothing that failed (an upload, a value read cleanly before) stay readable and new work
 * runs. Skips (77) where no asynchronous device opens.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

static int failures;
#define CHECK(cond)                                                                                               \
    do {                                                                                                          \
        if (!(cond)) {                                                                                            \
            fprintf(stderr, "%s:%d: check failed: %s (%s)\n", __FILE__, __LINE__, #cond, kiln_error());           \
            failures++;                                                                                           \
        }                                                                                                         \
    } while (0)

static bool read_fails_with(kiln_tensor *t, const char *needle)
{
    float out[8];
    kiln_error_clear();
    int rc = kiln_to_data(t, out, (size_t)kiln_tensor_numel(t) * sizeof(float));
    return rc < 0 && strstr(kiln_error(), needle) != NULL;
}

static void run(const char *spec)
{
    kiln_device *dev = kiln_device_open(spec);
    if (!dev)
        return;
    printf("%s\n", spec);
    kiln_scope_begin(); /* what the checks make along the way */
    float w[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    kiln_tensor *weights = kiln_from_data(dev, KILN_F32, KILN_SHAPE(4, 2), w, sizeof w);
    kiln_tensor *before = kiln_mul_scalar(weights, 2); /* computed and synced before the error */
    CHECK(kiln_device_sync(dev) == 0);

    int64_t bad[3] = {0, 7, 1};
    kiln_tensor *idx = kiln_from_data(dev, KILN_I64, KILN_SHAPE(3), bad, sizeof bad);
    kiln_tensor *rows = kiln_embedding(weights, idx);
    kiln_tensor *scaled = kiln_mul_scalar(rows, 10);
    CHECK(rows && scaled);
    if (!rows || !scaled) {
        kiln_scope_end();
        return;
    }
    /* the drain reports the error once... */
    kiln_error_clear();
    CHECK(kiln_device_sync(dev) < 0 && strstr(kiln_error(), "out of bounds"));
    int code = kiln_error_code();
    CHECK(code < 0);
    /* ...and the values it spoiled never read as good afterwards, however often they are read,
     * each restatement with the failure's code (callers decide by it) */
    CHECK(read_fails_with(scaled, "out of bounds"));
    CHECK(read_fails_with(scaled, "lost to an earlier error"));
    CHECK(kiln_error_code() == code);
    CHECK(read_fails_with(rows, "lost to an earlier error"));
    CHECK(kiln_error_code() == code);
    kiln_error_clear();
    CHECK(isnan(kiln_item(kiln_sum(scaled, KILN_ALL_DIMS, false))));
    /* work that reads a spoiled value later is spoiled too, and so is its queue's drain */
    kiln_tensor *later = kiln_add_scalar(scaled, 1);
    CHECK(later != NULL);
    kiln_error_clear();
    CHECK(kiln_device_sync(dev) < 0 && strstr(kiln_error(), "out of bounds"));
    CHECK(kiln_error_code() == code);
    CHECK(read_fails_with(later, "lost to an earlier error"));
    CHECK(kiln_error_code() == code);
    /* a save writes nothing it cannot vouch for */
    const char *path = "deferred-errors-test.safetensors";
    const char *names[] = {"scaled"};
    remove(path);
    kiln_error_clear();
    CHECK(kiln_safetensors_save(path, 1, names, &scaled, 0, NULL, NULL) < 0);
    FILE *f = fopen(path, "rb");
    CHECK(f == NULL);
    if (f)
        fclose(f);
    remove(path);

    /* what the error did not touch stays good, and new work runs */
    float got[8];
    CHECK(kiln_to_data(weights, got, sizeof got) == 0 && got[7] == 8);
    CHECK(kiln_to_data(before, got, sizeof got) == 0 && got[7] == 16);
    int64_t good[2] = {3, 0};
    kiln_tensor *ok = kiln_embedding(weights, kiln_from_data(dev, KILN_I64, KILN_SHAPE(2), good, sizeof good));
    CHECK(kiln_to_data(ok, got, 4 * sizeof(float)) == 0 && got[0] == 7 && got[1] == 8 && got[2] == 1);
    CHECK(kiln_device_sync(dev) == 0);
    kiln_tensor_release(weights);
    kiln_tensor_release(before);
    kiln_tensor_release(idx);
    kiln_tensor_release(rows);
    kiln_tensor_release(scaled);
    kiln_tensor_release(later);
    kiln_tensor_release(ok);
    kiln_scope_end();
    kiln_device_close(dev);
}

int main(void)
{
    const char *specs[] = {"vulkan:0", "vulkan:0?fusion=off"};
    int opened = 0;
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) {
        kiln_device *probe = kiln_device_open(specs[i]);
        if (!probe)
            continue;
        kiln_device_close(probe);
        opened++;
        run(specs[i]);
    }
    if (!opened) {
        printf("skipped: no asynchronous device opens (%s)\n", kiln_error());
        return 77;
    }
    if (failures)
        fprintf(stderr, "%d checks failed\n", failures);
    return failures ? 1 : 0;
}
