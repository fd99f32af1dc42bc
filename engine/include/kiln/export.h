/*
 * kiln/export.h — which libkiln functions a program may link against.
 *
 * libkiln is compiled with -fvisibility=hidden, so nothing it defines is visible outside
 * the shared library unless a public header says so. Every header in kiln/ wraps its
 * declarations in KILN_API_BEGIN ... KILN_API_END, which gives exactly those functions
 * default visibility; everything else (the kiln__ internals, the backends, storage's
 * helpers) stays inside the library. tests/abi checks the result with nm -D.
 *
 * Programs built inside the source tree that need the internals (kilnd, most tests, the
 * benches, the fuzz targets) link libkiln_internal.a, made from the same objects.
 */
#ifndef KILN_EXPORT_H
#define KILN_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define KILN_API_BEGIN _Pragma("GCC visibility push(default)")
#define KILN_API_END _Pragma("GCC visibility pop")
#else
#define KILN_API_BEGIN
#define KILN_API_END
#endif

#endif /* KILN_EXPORT_H */
