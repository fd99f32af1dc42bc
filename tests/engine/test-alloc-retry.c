/*
 * tests/engine/test-alloc-retry.c — an allocation that fails while the device's pool holds
 * freed buffers of other sizes hands them back and tries again, so the library stays
 * usable after memory ran short: with the address space capped (RLIMIT_AS), 100 MiB
 * tensors are made until one fails and all are freed (into the cpu's pool); then 70 MiB
 * tensors must fit about as many bytes again, where before the pool's parked 100 MiB
 * buffers (a size class no 70 MiB request takes) left room for only a third of them. The
 * tensors' contents are checked after. On cpu, and on vulkan:0 where it opens (lavapipe's
 * memory is host memory, under the same cap).
 *
 * Skipped (77) under AddressSanitizer, whose shadow memory needs an address space no cap
 * leaves, and where the cap cannot be set.
 *
 *   test-alloc-retry
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "kiln/tensor.h"

#include "../lib/under-asan.h"

#define MIB ((int64_t)1 << 20)
#define MAX_TENSORS 256

/* The process's virtual size now, from /proc/self/status (bytes; 0 when unknown). */
static long long vm_size(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %lld kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024;
}

/* As many tensors of `mib` MiB (filled with their index) as fit, up to MAX_TENSORS. */
static int fill(kiln_device *dev, int64_t mib, kiln_tensor **out)
{
    int n = 0;
    while (n < MAX_TENSORS) {
        kiln_tensor *t = kiln_full(dev, KILN_F32, 1, (int64_t[]){mib * MIB / 4}, (double)n);
        if (!t)
            break;
        out[n++] = kiln_keep(t);
    }
    return n;
}

static int run(const char *spec)
{
    kiln_device *dev = kiln_device_open(spec);
    if (!dev) {
        printf("skip %s: does not open here (%s)\n", spec, kiln_error());
        return 0;
    }
    static kiln_tensor *t[MAX_TENSORS];
    kiln_scope_begin();
    int big = fill(dev, 100, t);
    for (int i = 0; i < big; i++)
        kiln_tensor_release(t[i]);
    kiln_scope_end();
    kiln_scope_begin();
    int small = fill(dev, 70, t);
    int failures = 0;
    /* 100 MiB of room makes one 70 MiB tensor and 30 MiB spare: big * 100 / 70 rounded
     * down, give or take the one that did not fit either way */
    int want = big * 100 / 70 - 1;
    if (big < 3 || small < want) {
        printf("FAIL %s: %d tensors of 100 MiB fit, then only %d of 70 MiB (want %d or more): %s\n", spec, big,
               small, want, kiln_error());
        failures++;
    }
    for (int i = 0; i < small; i += 7) {
        float v[2];
        kiln_tensor *ends = kiln_contiguous(kiln_slice(t[i], 0, 0, 2, 1));
        if (!ends || kiln_to_data(ends, v, sizeof v) != 0 || v[0] != (float)i || v[1] != (float)i) {
            printf("FAIL %s: tensor %d does not hold its value after the retry\n", spec, i);
            failures++;
            break;
        }
    }
    for (int i = 0; i < small; i++)
        kiln_tensor_release(t[i]);
    kiln_scope_end();
    printf("%s %s: %d x 100 MiB, then %d x 70 MiB after freeing\n", failures ? "FAIL" : "ok  ", spec, big, small);
    kiln_device_close(dev);
    return failures;
}

int main(void)
{
    if (UNDER_ASAN) {
        printf("skipped: AddressSanitizer's shadow memory needs an uncapped address space\n");
        return 77;
    }
    long long now = vm_size();
    struct rlimit r = {.rlim_cur = (rlim_t)(now + 1536 * MIB), .rlim_max = (rlim_t)(now + 1536 * MIB)};
    if (now <= 0 || setrlimit(RLIMIT_AS, &r) != 0) {
        printf("skipped: the address space cannot be capped here\n");
        return 77;
    }
    int failures = run("cpu") + run("vulkan:0");
    return failures ? 1 : 0;
}
