/*
 * tests/vulkan-nn/vulkan-probe.c — exit 0 when device vulkan:0 opens, 77 (a test's skip)
 * with the reason when it does not, so the scripted tests of the suite skip cleanly on a
 * machine without a Vulkan device.
 */
#include <stdio.h>

#include "kiln/kiln.h"

int main(int argc, char **argv)
{
    const char *spec = argc > 1 ? argv[1] : "vulkan:0";
    kiln_device *dev = kiln_device_open(spec);
    if (!dev) {
        printf("skipped: %s does not open: %s\n", spec, kiln_error());
        return 77;
    }
    printf("%s\n", kiln_device_name(dev));
    kiln_device_close(dev);
    return 0;
}
