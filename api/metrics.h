/*
 * api/metrics.h — the metrics registry and its one renderer (Prometheus text exposition
 * format). Subsystems register families once at start-up, resolve the series they update to
 * pointers, and then bump plain numbers on their hot paths.
 *
 * Thread affinity: the registry is updated and rendered on the I/O loop thread only.
 *
 *     struct kd_metric_family *f = kd_metrics_family(m, "kiln_http_requests_total",
 *         "HTTP requests served.", KD_METRIC_COUNTER, (const char *[]){"route", "code", NULL}, NULL, 0);
 *     struct kd_metric_series *s = kd_metrics_series(f, (const char *[]){"/v2", "200", NULL});
 *     kd_metric_add(s, 1);
 */
#ifndef KD_API_METRICS_H
#define KD_API_METRICS_H

#include <stddef.h>

#include "buf.h"

enum kd_metric_type {
    KD_METRIC_COUNTER,
    KD_METRIC_GAUGE,
    KD_METRIC_HISTOGRAM,
};

#define KD_METRIC_MAX_LABELS 4

struct kd_metrics;
struct kd_metric_family;
struct kd_metric_series;

struct kd_metrics *kd_metrics_new(void);
void kd_metrics_free(struct kd_metrics *m);

/*
 * label_names is NULL-terminated (or NULL for none). buckets are the histogram's upper bounds,
 * ascending, +Inf implied. Returns NULL when out of memory.
 */
struct kd_metric_family *kd_metrics_family(struct kd_metrics *m, const char *name, const char *help,
                                           enum kd_metric_type type, const char *const *label_names,
                                           const double *buckets, size_t nbuckets);

/* A gauge sampled when rendering, e.g. uptime. */
int kd_metrics_gauge_fn(struct kd_metrics *m, const char *name, const char *help, double (*fn)(void *ctx),
                        void *ctx);
/* A counter kept by another thread (fn must read it safely), sampled when rendering. */
int kd_metrics_counter_fn(struct kd_metrics *m, const char *name, const char *help, double (*fn)(void *ctx),
                          void *ctx);

/* Finds or creates the series with these label values (same count as the family's names). */
struct kd_metric_series *kd_metrics_series(struct kd_metric_family *f, const char *const *label_values);

void kd_metric_add(struct kd_metric_series *s, double v);
void kd_metric_set(struct kd_metric_series *s, double v);
void kd_metric_observe(struct kd_metric_series *s, double v);

int kd_metrics_render(struct kd_metrics *m, struct kd_buf *out);

/* The bounds of the request-duration histograms, in seconds: one set for HTTP and gRPC, so that
 * the two protocols' latencies compare bucket by bucket. */
#define KD_METRICS_REQUEST_SECONDS_NBUCKETS 16
extern const double kd_metrics_request_seconds_buckets[KD_METRICS_REQUEST_SECONDS_NBUCKETS];

#endif /* KD_API_METRICS_H */
