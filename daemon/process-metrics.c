/*
 * daemon/process-metrics.c — the process collector's metrics every Prometheus client library
 * exports (process_start_time_seconds, process_cpu_seconds_total, process_resident_memory_bytes,
 * process_virtual_memory_bytes, process_open_fds, process_max_fds), under their standard names,
 * so that dashboards and alerts written for any exporter (file descriptors nearing the limit,
 * CPU per pod) work on kilnd unchanged. Sampled when /metrics renders, from /proc and getrusage.
 */
#include <dirent.h>
#include <stdio.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "process-metrics.h"

static double cpu_seconds(void *ctx)
{
    (void)ctx;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           (double)ru.ru_stime.tv_usec / 1e6;
}

/* field 0 (total program size) or 1 (resident set) of /proc/self/statm, in bytes */
static double statm_bytes(int field)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long v[2] = {0, 0};
    if (f) {
        if (fscanf(f, "%ld %ld", &v[0], &v[1]) != 2)
            v[0] = v[1] = 0;
        fclose(f);
    }
    return (double)v[field] * (double)sysconf(_SC_PAGESIZE);
}

static double resident_bytes(void *ctx)
{
    (void)ctx;
    return statm_bytes(1);
}

static double virtual_bytes(void *ctx)
{
    (void)ctx;
    return statm_bytes(0);
}

static double open_fds(void *ctx)
{
    (void)ctx;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return 0;
    double n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the listing's own descriptor */
}

static double max_fds(void *ctx)
{
    (void)ctx;
    struct rlimit rl;
    return getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (double)rl.rlim_cur : 0;
}

static double start_time(void *ctx)
{
    return *(const double *)ctx;
}

int kd_process_metrics_register(struct kd_metrics *m, double *start_time_s)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    *start_time_s = (double)now.tv_sec + (double)now.tv_nsec / 1e9;
    int rc = kd_metrics_gauge_fn(m, "process_start_time_seconds",
                                 "Start time of the process since the Unix epoch in seconds.", start_time,
                                 start_time_s);
    rc |= kd_metrics_counter_fn(m, "process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
                                cpu_seconds, NULL);
    rc |= kd_metrics_gauge_fn(m, "process_resident_memory_bytes", "Resident memory size in bytes.", resident_bytes,
                              NULL);
    /* kilnd's own name for the same, from before the standard ones */
    rc |= kd_metrics_gauge_fn(m, "kiln_process_resident_memory_bytes", "Resident set size of kilnd.",
                              resident_bytes, NULL);
    rc |= kd_metrics_gauge_fn(m, "process_virtual_memory_bytes", "Virtual memory size in bytes.", virtual_bytes,
                              NULL);
    rc |= kd_metrics_gauge_fn(m, "process_open_fds", "Number of open file descriptors.", open_fds, NULL);
    rc |= kd_metrics_gauge_fn(m, "process_max_fds", "Maximum number of open file descriptors.", max_fds, NULL);
    return rc ? -1 : 0;
}
