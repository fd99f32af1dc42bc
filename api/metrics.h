/*
 * api/metrics.h — the metrics registry and its one renderer (Prometheus text exposition
 * format). Subsystems register families once at start-up, resolve the series they update to
 * pointers, and then bump plain numbers on their hot paths.
 *
 * Thread affinity: the registry is updated and rendered on the I/O loop thread only.
 *
 *     struct kiln_metric_family *f = kiln_metrics_family(m, "kiln_http_requests_total",
 *         "HTTP requests served.", KILN_METRIC_COUNTER, (const char *[]){"route", "code", NULL}, NULL, 0);
 *     struct kiln_metric_series *s = kiln_metrics_series(f, (const char *[]){"/v2", "200", NULL});
 *     kiln_metric_add(s, 1);
 */
#ifndef KILN_API_METRICS_H
#define KILN_API_METRICS_H

#include <stddef.h>

#include "buf.h"

enum kiln_metric_type {
    KILN_METRIC_COUNTER,
    KILN_METRIC_GAUGE,
    KILN_METRIC_HISTOGRAM,
};

#define KILN_METRIC_MAX_LABELS 4

struct kiln_metrics;
struct kiln_metric_family;
struct kiln_metric_series;

struct kiln_metrics *kiln_metrics_new(void);
void kiln_metrics_free(struct kiln_metrics *m);

/*
 * label_names is NULL-terminated (or NULL for none). buckets are the histogram's upper bounds,
 * ascending, +Inf implied. Returns NULL when out of memory.
 */
struct kiln_metric_family *kiln_metrics_family(struct kiln_metrics *m, const char *name,
                                               const char *help, enum kiln_metric_type type,
                                               const char *const *label_names,
                                               const double *buckets, size_t nbuckets);

/* A gauge sampled when rendering, e.g. uptime. */
int kiln_metrics_gauge_fn(struct kiln_metrics *m, const char *name, const char *help,
                          double (*fn)(void *ctx), void *ctx);
/* A counter kept by another thread (fn must read it safely), sampled when rendering. */
int kiln_metrics_counter_fn(struct kiln_metrics *m, const char *name, const char *help,
                            double (*fn)(void *ctx), void *ctx);

/* Finds or creates the series with these label values (same count as the family's names). */
struct kiln_metric_series *kiln_metrics_series(struct kiln_metric_family *f,
                                               const char *const *label_values);

void kiln_metric_add(struct kiln_metric_series *s, double v);
void kiln_metric_set(struct kiln_metric_series *s, double v);
void kiln_metric_observe(struct kiln_metric_series *s, double v);

int kiln_metrics_render(struct kiln_metrics *m, struct kiln_buf *out);

#endif /* KILN_API_METRICS_H */
