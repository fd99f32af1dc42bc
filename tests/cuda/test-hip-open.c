/*
 * tests/cuda/test-hip-open.c — the HIP build of the cuda backend opened where there is no AMD
 * GPU: the open fails cleanly with a message naming the device and the reason, and
 * tf32=on is refused by name before any device is looked for (AMD GPUs have no TF32).
 *
 * Built only by tests/cuda/hip-build-check.sh, against the backend's HIP objects, and run
 * there; it calls the backend's interface table directly (the engine's registry is not
 * linked whole into that program). On a machine with an AMD GPU the open succeeds, and the
 * test closes the device and says so instead.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-impl.h"
#include "kiln/kiln.h"

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

int main(void)
{
    const kiln_backend_iface *cuda = kiln_backend_cuda();
    CHECK(cuda && !strcmp(cuda->name, "cuda"), "the HIP build registers as cuda");
    unsetenv("KILN_CUDA_TF32");
    void *dev = cuda->open(0);
    if (dev) {
        cuda->close(dev);
        printf("test-hip-open: cuda:0 opened (an AMD GPU is here); the no-GPU checks do not apply\n");
        return 0;
    }
    char why[512];
    snprintf(why, sizeof why, "%s", kiln_error());
    CHECK(strstr(why, "cuda:0") != NULL, "the message names the device: %s", why);
    CHECK(strstr(why, "no HIP (AMD GPU) device is available") != NULL, "the message says why: %s", why);
    setenv("KILN_CUDA_TF32", "on", 1);
    dev = cuda->open(0);
    CHECK(!dev && strstr(kiln_error(), "tf32=on is not available in a HIP build"), "tf32=on is refused by name");
    unsetenv("KILN_CUDA_TF32");
    printf("test-hip-open: %d checks, %d failed (%s)\n", checks, failures, why);
    return failures ? 1 : 0;
}
