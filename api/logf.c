/*
 * api/logf.c — formatting a log line for a service's log sink (see logf.h).
 */
#include <stdio.h>

#include "logf.h"

void kd_api_logv(kd_log_sink_fn sink, void *ud, enum kd_log_level level, const char *fmt, va_list ap)
{
    if (!sink)
        return;
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    sink(ud, level, msg);
}

void kd_api_logf(kd_log_sink_fn sink, void *ud, enum kd_log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kd_api_logv(sink, ud, level, fmt, ap);
    va_end(ap);
}
