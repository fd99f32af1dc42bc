/*
 * api/logf.h — formatting a log line for a service's log sink. Every service of the API (server,
 * serving, jobs, remote tensors) is handed the same kind of sink in its options, a function that
 * takes a finished line; this is the one place that formats one, so a service's log call is a
 * macro over it rather than a copy of the same few lines.
 */
#ifndef KD_API_LOGF_H
#define KD_API_LOGF_H

#include <stdarg.h>

#include "config.h"

typedef void (*kd_log_sink_fn)(void *ud, enum kd_log_level level, const char *msg);

/* Formats fmt (at most ~1 KiB; longer lines are cut) and hands it to sink; nothing when sink is NULL. */
void kd_api_logv(kd_log_sink_fn sink, void *ud, enum kd_log_level level, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));
void kd_api_logf(kd_log_sink_fn sink, void *ud, enum kd_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif /* KD_API_LOGF_H */
