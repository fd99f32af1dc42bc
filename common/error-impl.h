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

/** Set the calling thread's error message (printf format), with no code: kiln_error_code()
 *  reads 0 until the next error. Always returns -1 so that `return kiln__error_set(...)`
 *  reads naturally in int-returning functions. */
int kiln__error_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int kiln__error_vset(const char *fmt, va_list ap);
/** Set the calling thread's error message and its code (a negative KILN_E* of kiln/tensor.h;
 *  anything else records 0), for kiln_error_code(). Returns code (-1 when it is not negative,
 *  so the result always reads as a failure): `return kiln__error_set_code(KILN_ENOMEM, "%s:
 *  out of memory", op);` gives the caller the code the message is kept with. */
int kiln__error_set_code(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** Set a message that restates the current failure (its text quoted behind a prefix: "node
 *  'fc': %s"), keeping the failure's code: the cause decides what kind of failure it is, not
 *  the caller that adds its name. Returns -1, as kiln__error_set does. A caller that copied the
 *  message aside and made other calls since passes the code it read with it to
 *  kiln__error_set_code instead. */
int kiln__error_restate(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A warning through kiln_set_warning_handler's handler (stderr by default); no prefix, no
 * newline. */
void kiln__warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif /* KILN_ERROR_IMPL_H */
