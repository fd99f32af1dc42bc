/* engine/version.c — the library's version string, fixed at build time. */
#include "kiln/kiln.h"

const char *kiln_version(void)
{
    return KILN_VERSION;
}
