/*
 * tests/lib/under-asan.h — UNDER_ASAN: 1 when the test is built with AddressSanitizer (gcc's
 * __SANITIZE_ADDRESS__, clang's __has_feature), else 0. Tests that measure memory (resident
 * set, allocation failures) say what they skip under it: its shadow memory and quarantine
 * change both.
 */
#ifndef KILN_TESTS_UNDER_ASAN_H
#define KILN_TESTS_UNDER_ASAN_H

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

#endif /* KILN_TESTS_UNDER_ASAN_H */
