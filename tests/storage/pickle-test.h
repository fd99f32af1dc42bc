/*
 * tests/storage/pickle-test.h — what the .pt reader's tests share: a pickle that must be
 * refused, and the pickle text of a torch tensor over a 4-float storage record '0'.
 */
#ifndef KILN_TESTS_PICKLE_TEST_H
#define KILN_TESTS_PICKLE_TEST_H

#include <string.h>

#include "kiln/kiln.h"
#include "pickle-impl.h"

/* bytes (len) must fail to unpickle with a message holding needle (cmocka's fail_msg). */
static inline void expect_pickle_reject(const char *bytes, size_t len, const char *needle)
{
    kiln_error_clear();
    kiln__pickle *p = kiln__pickle_load(bytes, len, "test", NULL);
    if (p)
        fail_msg("accepted a pickle that should fail with '%s'", needle);
    if (!strstr(kiln_error(), needle))
        fail_msg("message '%s' lacks '%s'", kiln_error(), needle);
}

#define REJECT(lit, needle) expect_pickle_reject(lit, sizeof(lit) - 1, needle)

/* bytes (len) unpickle to a value Python's repr writes as want (test case i); its kind. */
static inline int expect_pickle_describes(const char *bytes, size_t len, const char *want, size_t i)
{
    kiln__pickle *p = kiln__pickle_load(bytes, len, "test", NULL);
    if (!p)
        fail_msg("case %zu: %s", i, kiln_error());
    char text[64];
    kiln__pk_describe(kiln__pickle_root(p), text, sizeof text);
    if (strcmp(text, want) != 0)
        fail_msg("case %zu: %s, want %s", i, text, want);
    int kind = (int)kiln__pickle_root(p)->kind;
    kiln__pickle_free(p);
    return kind;
}

/* torch's persistent id of FloatStorage record '0' on the cpu, 4 elements */
#define STORAGE4                                                                                                  \
    "(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00"                                            \
    "0X\x03\x00\x00\x00"                                                                                          \
    "cpuK\x04tQ"
/* protocol 2, then _rebuild_tensor_v2's global and the start of its argument tuple */
#define REBUILD                                                                                                   \
    "\x80\x02"                                                                                                    \
    "ctorch._utils\n_rebuild_tensor_v2\n("

#endif
