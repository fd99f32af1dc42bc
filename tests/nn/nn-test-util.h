/*
 * tests/nn/nn-test-util.h — helpers for the nn tests: the engine test helpers plus
 * parameter listing and JSON comparisons.
 */
#ifndef KILN_NN_TEST_UTIL_H
#define KILN_NN_TEST_UTIL_H

#include "../engine/test-util.h"
#include "kiln/autodiff.h"
#include "kiln/nn.h"
#include "kiln/record.h"

#include <unistd.h>

/* The names of m's parameters joined by spaces, for one readable assertion. */
static inline char *param_names(kiln_module *m, bool buffers)
{
    int n = buffers ? kiln_module_buffers(m, NULL, 0) : kiln_module_parameters(m, NULL, 0);
    kiln_named_tensor *nt = calloc((size_t)n + 1, sizeof *nt);
    if (buffers)
        kiln_module_buffers(m, nt, n);
    else
        kiln_module_parameters(m, nt, n);
    size_t cap = 64;
    for (int i = 0; i < n; i++)
        cap += strlen(nt[i].name) + 1;
    char *s = calloc(cap, 1);
    for (int i = 0; i < n; i++) {
        if (i)
            strcat(s, " ");
        strcat(s, nt[i].name);
    }
    free(nt);
    return s;
}

#define EXPECT_NAMES(m, buffers, want)                                  \
    do {                                                                \
        char *got_ = param_names((m), (buffers));                       \
        if (strcmp(got_, (want)))                                       \
            fail_msg("names:\n got  %s\n want %s", got_, (want));       \
        free(got_);                                                     \
    } while (0)

#endif
