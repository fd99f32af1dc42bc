/*
 * tests/lib/edge-devices.h — the device sweep of the edge-case tests (autodiff's
 * test-grad-edges.c, nn's test-layer-edges.c): each case runs on every backend that opens
 * here, so a behaviour one backend gets wrong shows up under that backend's name. Include
 * after <cmocka.h> and kiln/tensor.h.
 */
#ifndef KILN_TESTS_EDGE_DEVICES_H
#define KILN_TESTS_EDGE_DEVICES_H

#include <stdio.h>
#include <string.h>

#include "kiln/tensor.h"

static const char *const edge_devices[] = {"ref", "cpu", "cpu?fusion=on", "vulkan:0"};

typedef void (*edge_fn)(kiln_device *dev, const char *spec);

/* Run f on every device of edge_devices that this build and machine have; the cpu and
 * ref devices must open, vulkan:0 is skipped (with a line saying so) where it does not. */
static inline void on_each_device(edge_fn f)
{
    for (size_t d = 0; d < sizeof edge_devices / sizeof edge_devices[0]; d++) {
        const char *spec = edge_devices[d];
        kiln_device *dev = kiln_device_open(spec);
        if (!dev) {
            if (strncmp(spec, "vulkan", 6) == 0) {
                printf("# %s does not open here (%s): skipped\n", spec, kiln_error());
                continue;
            }
            fail_msg("cannot open %s: %s", spec, kiln_error());
        }
        kiln_scope_begin();
        f(dev, spec);
        kiln_scope_end();
        kiln_device_close(dev);
    }
}

#endif /* KILN_TESTS_EDGE_DEVICES_H */
