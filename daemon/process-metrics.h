/*
 * daemon/process-metrics.h — the standard process_* metrics (process-metrics.c).
 */
#ifndef KD_DAEMON_PROCESS_METRICS_H
#define KD_DAEMON_PROCESS_METRICS_H

#include "metrics.h"

/* Registers them on m; start_time_s (kept by the caller for the life of m) receives the
 * wall-clock start time they report. 0, or -1 out of memory. */
int kd_process_metrics_register(struct kd_metrics *m, double *start_time_s);

#endif
