/*
 * common/error-impl.h — how libkiln code records an error for kiln_error().
 *
 * The message is per thread, so concurrent callers never see each other's errors.
 * Write it as "op: what went wrong (shapes, dtypes)", e.g.
 *   kiln__error_set("add: cannot broadcast f32[2, 3] with f32[4]");
 */
#ifndef KILN_ERROR_IMPL_H
#define KILN_ERROR_IMPL_H

#include <stdarg.h>

#define KILN_ERROR_MAX 512

/** Set the calling thread's error message (printf format). Always returns -1 so that
 *  `return kiln__error_set(...)` reads naturally in int-returning functions. */
int kiln__error_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int kiln__error_vset(const char *fmt, va_list ap);

#endif /* KILN_ERROR_IMPL_H */
