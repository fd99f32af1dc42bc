/*
 * engine/error.c — the thread-local error behind kiln_error() and kiln_error_code().
 *
 * A thread-local buffer instead of an allocated string: setting an error must never
 * fail, not even when the error being reported is an allocation failure. The code sits
 * beside the message, per thread for the same reason the message is: each thread reads
 * the failure of its own last call. A call that returns NULL cannot return a code, so
 * this is how its caller learns what kind of failure it was.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "error-impl.h"
#include "kiln/tensor.h"

static _Thread_local char error_message[KILN_ERROR_MAX];
static _Thread_local int error_code;

static void set_message(const char *fmt, va_list ap)
{
    /* Formatted aside first, so a message may quote the previous one (an argument that is
     * kiln_error() itself) without the source and destination overlapping. */
    char message[KILN_ERROR_MAX];
    vsnprintf(message, sizeof message, fmt, ap);
    memcpy(error_message, message, sizeof message);
}

int kiln__error_vset(const char *fmt, va_list ap)
{
    set_message(fmt, ap);
    error_code = 0;
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

int kiln__error_set_code(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_message(fmt, ap);
    va_end(ap);
    error_code = code < 0 ? code : 0;
    return code < 0 ? code : -1;
}

int kiln__error_restate(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_message(fmt, ap);
    va_end(ap);
    return -1;
}

const char *kiln_error(void)
{
    return error_message;
}

int kiln_error_code(void)
{
    return error_code;
}

void kiln_error_clear(void)
{
    error_message[0] = '\0';
    error_code = 0;
}

/* The warning handler: process-wide by nature (a log is the application's), so behind a lock;
 * warnings are rare, and the handler is called outside it. */
static pthread_mutex_t warning_lock = PTHREAD_MUTEX_INITIALIZER;
static kiln_warning_handler warning_handler;
static void *warning_ud;

void kiln_set_warning_handler(kiln_warning_handler handler, void *ud)
{
    pthread_mutex_lock(&warning_lock);
    warning_handler = handler;
    warning_ud = ud;
    pthread_mutex_unlock(&warning_lock);
}

void kiln__warn(const char *fmt, ...)
{
    char message[KILN_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&warning_lock);
    kiln_warning_handler handler = warning_handler;
    void *ud = warning_ud;
    pthread_mutex_unlock(&warning_lock);
    if (handler)
        handler(ud, message);
    else
        fprintf(stderr, "kiln: %s\n", message);
}
