/*
 * engine/error.c — the thread-local error message behind kiln_error().
 *
 * A thread-local buffer instead of an allocated string: setting an error must never
 * fail, not even when the error being reported is an allocation failure.
 */
#include <stdio.h>
#include <string.h>

#include "error-impl.h"
#include "kiln/tensor.h"

static _Thread_local char error_message[KILN_ERROR_MAX];

int kiln__error_vset(const char *fmt, va_list ap)
{
    /* Formatted aside first, so a message may quote the previous one (an argument that is
     * kiln_error() itself) without the source and destination overlapping. */
    char message[KILN_ERROR_MAX];
    vsnprintf(message, sizeof message, fmt, ap);
    memcpy(error_message, message, sizeof message);
    return -1;
}

int kiln__error_set(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kiln__error_vset(fmt, ap);
    va_end(ap);
    return -1;
}

const char *kiln_error(void)
{
    return error_message;
}

void kiln_error_clear(void)
{
    error_message[0] = '\0';
}
