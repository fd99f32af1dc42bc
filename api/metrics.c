/*
 * api/metrics.c — counters, gauges and histograms in a small registry, rendered in the
 * Prometheus text exposition format (version 0.0.4). Families and series are created rarely
 * and kept in linked lists; updates go straight through the series pointer.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

struct kd_metric_series {
    struct kd_metric_series *next;
    char *labels[KD_METRIC_MAX_LABELS];
    double value;               /* counter and gauge value; histogram sum */
    uint64_t count;             /* histogram observations */
    uint64_t *bucket_counts;    /* histogram, not cumulative; one per bound */
    const struct kd_metric_family *family;
};

struct kd_metric_family {
    struct kd_metric_family *next;
    char *name;
    char *help;
    enum kd_metric_type type;
    size_t nlabels;
    char *label_names[KD_METRIC_MAX_LABELS];
    double *buckets;
    size_t nbuckets;
    double (*fn)(void *ctx);
    void *fn_ctx;
    struct kd_metric_series *series;
    struct kd_metric_series **series_tail;
};

struct kd_metrics {
    struct kd_metric_family *families;
    struct kd_metric_family **tail;
};

const double kd_metrics_request_seconds_buckets[KD_METRICS_REQUEST_SECONDS_NBUCKETS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

struct kd_metrics *kd_metrics_new(void)
{
    struct kd_metrics *m = calloc(1, sizeof *m);
    if (m)
        m->tail = &m->families;
    return m;
}

static void series_free(struct kd_metric_series *s)
{
    for (size_t i = 0; i < KD_METRIC_MAX_LABELS; i++)
        free(s->labels[i]);
    free(s->bucket_counts);
    free(s);
}

static void family_free(struct kd_metric_family *f)
{
    for (struct kd_metric_series *s = f->series, *next; s; s = next) {
        next = s->next;
        series_free(s);
    }
    for (size_t i = 0; i < KD_METRIC_MAX_LABELS; i++)
        free(f->label_names[i]);
    free(f->name);
    free(f->help);
    free(f->buckets);
    free(f);
}

void kd_metrics_free(struct kd_metrics *m)
{
    if (!m)
        return;
    for (struct kd_metric_family *f = m->families, *next; f; f = next) {
        next = f->next;
        family_free(f);
    }
    free(m);
}

struct kd_metric_family *kd_metrics_family(struct kd_metrics *m, const char *name, const char *help,
                                           enum kd_metric_type type, const char *const *label_names,
                                           const double *buckets, size_t nbuckets)
{
    struct kd_metric_family *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->type = type;
    f->name = strdup(name);
    f->help = strdup(help);
    f->series_tail = &f->series;
    bool ok = f->name && f->help;
    for (size_t i = 0; ok && label_names && label_names[i]; i++) {
        if (i == KD_METRIC_MAX_LABELS) {
            ok = false;
            break;
        }
        f->label_names[i] = strdup(label_names[i]);
        ok = f->label_names[i] != NULL;
        f->nlabels = i + 1;
    }
    if (ok && type == KD_METRIC_HISTOGRAM && nbuckets) {
        f->buckets = malloc(nbuckets * sizeof *f->buckets);
        ok = f->buckets != NULL;
        if (ok) {
            memcpy(f->buckets, buckets, nbuckets * sizeof *buckets);
            f->nbuckets = nbuckets;
        }
    }
    if (!ok) {
        family_free(f);
        return NULL;
    }
    *m->tail = f;
    m->tail = &f->next;
    return f;
}

static int sampled(struct kd_metrics *m, const char *name, const char *help, enum kd_metric_type type,
                   double (*fn)(void *ctx), void *ctx)
{
    struct kd_metric_family *f = kd_metrics_family(m, name, help, type, NULL, NULL, 0);
    if (!f)
        return -1;
    f->fn = fn;
    f->fn_ctx = ctx;
    return 0;
}

int kd_metrics_gauge_fn(struct kd_metrics *m, const char *name, const char *help, double (*fn)(void *ctx),
                        void *ctx)
{
    return sampled(m, name, help, KD_METRIC_GAUGE, fn, ctx);
}

int kd_metrics_counter_fn(struct kd_metrics *m, const char *name, const char *help, double (*fn)(void *ctx),
                          void *ctx)
{
    return sampled(m, name, help, KD_METRIC_COUNTER, fn, ctx);
}

struct kd_metric_series *kd_metrics_series(struct kd_metric_family *f, const char *const *label_values)
{
    for (struct kd_metric_series *s = f->series; s; s = s->next) {
        bool same = true;
        for (size_t i = 0; i < f->nlabels && same; i++)
            same = strcmp(s->labels[i], label_values[i]) == 0;
        if (same)
            return s;
    }
    struct kd_metric_series *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->family = f;
    bool ok = true;
    for (size_t i = 0; i < f->nlabels && ok; i++)
        ok = (s->labels[i] = strdup(label_values[i])) != NULL;
    if (ok && f->type == KD_METRIC_HISTOGRAM)
        ok = (s->bucket_counts = calloc(f->nbuckets + 1, sizeof *s->bucket_counts)) != NULL;
    if (!ok) {
        series_free(s);
        return NULL;
    }
    *f->series_tail = s;
    f->series_tail = &s->next;
    return s;
}

void kd_metric_add(struct kd_metric_series *s, double v)
{
    s->value += v;
}

void kd_metric_set(struct kd_metric_series *s, double v)
{
    s->value = v;
}

void kd_metric_observe(struct kd_metric_series *s, double v)
{
    const struct kd_metric_family *f = s->family;
    size_t i = 0;
    while (i < f->nbuckets && v > f->buckets[i])
        i++;
    s->bucket_counts[i]++;
    s->count++;
    s->value += v;
}

static const char *type_name(enum kd_metric_type t)
{
    switch (t) {
    case KD_METRIC_COUNTER: return "counter";
    case KD_METRIC_GAUGE: return "gauge";
    case KD_METRIC_HISTOGRAM: return "histogram";
    }
    return "untyped";
}

/* Label values escape backslash, quote and newline; HELP text escapes backslash and newline. */
static int put_escaped(struct kd_buf *out, const char *s, bool quote)
{
    for (; *s; s++) {
        const char *rep = NULL;
        if (*s == '\\')
            rep = "\\\\";
        else if (*s == '\n')
            rep = "\\n";
        else if (*s == '"' && quote)
            rep = "\\\"";
        if (rep ? kd_buf_puts(out, rep) : kd_buf_append(out, s, 1))
            return -1;
    }
    return 0;
}

static int put_number(struct kd_buf *out, double v)
{
    if (isinf(v))
        return kd_buf_puts(out, v > 0 ? "+Inf" : "-Inf");
    if (isnan(v))
        return kd_buf_puts(out, "NaN");
    if (v == (double)(int64_t)v && fabs(v) < 9e15)
        return kd_buf_printf(out, "%lld", (long long)v);
    /* The shortest of %.15g and %.17g that reads back exactly, so 0.1 + 0.2 stays readable. */
    char text[32];
    snprintf(text, sizeof text, "%.15g", v);
    if (strtod(text, NULL) != v)
        snprintf(text, sizeof text, "%.17g", v);
    return kd_buf_puts(out, text);
}

/* Writes {a="x",b="y"[,le="..."]}, or nothing when there are no labels at all. */
static int put_labels(struct kd_buf *out, const struct kd_metric_family *f, const struct kd_metric_series *s,
                      const char *le)
{
    if (f->nlabels == 0 && !le)
        return 0;
    int rc = kd_buf_puts(out, "{");
    for (size_t i = 0; i < f->nlabels && rc == 0; i++) {
        rc |= kd_buf_printf(out, "%s%s=\"", i ? "," : "", f->label_names[i]);
        rc |= put_escaped(out, s->labels[i], true);
        rc |= kd_buf_puts(out, "\"");
    }
    if (le && rc == 0)
        rc |= kd_buf_printf(out, "%sle=\"%s\"", f->nlabels ? "," : "", le);
    return rc | kd_buf_puts(out, "}");
}

static int render_histogram(struct kd_buf *out, const struct kd_metric_family *f, const struct kd_metric_series *s)
{
    int rc = 0;
    uint64_t cumulative = 0;
    char le[64];
    for (size_t i = 0; i <= f->nbuckets && rc == 0; i++) {
        cumulative += s->bucket_counts[i];
        if (i < f->nbuckets)
            snprintf(le, sizeof le, "%g", f->buckets[i]);
        else
            snprintf(le, sizeof le, "+Inf");
        rc |= kd_buf_printf(out, "%s_bucket", f->name);
        rc |= put_labels(out, f, s, le);
        rc |= kd_buf_printf(out, " %llu\n", (unsigned long long)cumulative);
    }
    rc |= kd_buf_printf(out, "%s_sum", f->name);
    rc |= put_labels(out, f, s, NULL);
    rc |= kd_buf_puts(out, " ");
    rc |= put_number(out, s->value);
    rc |= kd_buf_printf(out, "\n%s_count", f->name);
    rc |= put_labels(out, f, s, NULL);
    rc |= kd_buf_printf(out, " %llu\n", (unsigned long long)s->count);
    return rc;
}

int kd_metrics_render(struct kd_metrics *m, struct kd_buf *out)
{
    int rc = 0;
    for (const struct kd_metric_family *f = m->families; f && rc == 0; f = f->next) {
        rc |= kd_buf_printf(out, "# HELP %s ", f->name);
        rc |= put_escaped(out, f->help, false);
        rc |= kd_buf_printf(out, "\n# TYPE %s %s\n", f->name, type_name(f->type));
        if (f->fn) {
            rc |= kd_buf_printf(out, "%s ", f->name);
            rc |= put_number(out, f->fn(f->fn_ctx));
            rc |= kd_buf_puts(out, "\n");
            continue;
        }
        for (const struct kd_metric_series *s = f->series; s && rc == 0; s = s->next) {
            if (f->type == KD_METRIC_HISTOGRAM) {
                rc |= render_histogram(out, f, s);
                continue;
            }
            rc |= kd_buf_puts(out, f->name);
            rc |= put_labels(out, f, s, NULL);
            rc |= kd_buf_puts(out, " ");
            rc |= put_number(out, s->value);
            rc |= kd_buf_puts(out, "\n");
        }
    }
    return rc ? -1 : 0;
}
