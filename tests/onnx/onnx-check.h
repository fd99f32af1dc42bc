/*
 * tests/onnx/onnx-check.h — the counting check the ONNX tests built on onnx-pb.h share: a
 * failed CHECK prints its place and message and counts in `failures`, and the test goes on
 * (main returns failures ? 1 : 0).
 */
#ifndef KILN_TESTS_ONNX_CHECK_H
#define KILN_TESTS_ONNX_CHECK_H

#include <stdio.h>

static int failures;

#define CHECK(cond, ...)                                                                                          \
    do {                                                                                                          \
        if (!(cond)) {                                                                                            \
            failures++;                                                                                           \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                  \
            fprintf(stderr, __VA_ARGS__);                                                                         \
            fprintf(stderr, "\n");                                                                                \
        }                                                                                                         \
    } while (0)

#endif /* KILN_TESTS_ONNX_CHECK_H */
