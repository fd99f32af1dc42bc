/*
 * clients/watch.h — what `kiln watch` knows about a job, built from its event stream; shared by
 * the plain watcher (clients/watch.c) and the dashboard (clients/dashboard.c).
 */
#ifndef KILN_CLIENTS_WATCH_H
#define KILN_CLIENTS_WATCH_H

#include <stdbool.h>
#include <stddef.h>

#include "cli.h"

/* A metric over training steps; thinned (every other point dropped) past a cap so a long job
 * keeps a bounded history. */
struct kiln_series {
    double *x, *y;
    size_t n, cap;
};

#define KILN_WATCH_LOGS 64

struct kiln_watch {
    long long id;
    char name[128];           /* register_as */
    double epochs, batch_size;
    char state[16];
    char error[256];
    bool done;                /* a final state event arrived */
    int exit_code;            /* 0 succeeded, 1 failed or cancelled */
    char final_metrics[160];  /* "final valid_accuracy ...", from the final state event, or "" */
    /* the newest step event */
    double epoch, batch, batches, step, loss, acc, lr, items_per_sec;
    bool have_step;
    /* the newest epoch event */
    double ep_epoch, ep_train_loss, ep_train_acc, ep_valid_loss, ep_valid_acc, peak_rss_mb, epoch_seconds;
    bool have_epoch;
    struct kiln_series train_loss, train_acc, valid_loss, valid_acc;
    char logs[KILN_WATCH_LOGS][200];
    int nlogs;                /* lines ever added; the ring holds the last KILN_WATCH_LOGS */
    long long events;
    double step_rate;         /* steps per second, smoothed from items_per_sec */
};

/* Fills ID, name and spec from GET /v1/jobs/{id}; 0, or the exit status after printing why. */
int kiln_watch_fetch(const struct kiln_client *cl, struct kiln_watch *w, long long id);
/* Folds one event into W (and prints it as a plain line when PRINT). */
void kiln_watch_apply(struct kiln_watch *w, const char *type, const char *data, bool print);
void kiln_watch_log(struct kiln_watch *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The I-th newest log line (0 = newest), or NULL. */
const char *kiln_watch_log_line(const struct kiln_watch *w, int i);
/* Fraction of the job done, 0..1, and seconds left (NAN when unknown). */
double kiln_watch_progress(const struct kiln_watch *w, double *eta_job, double *eta_epoch);
void kiln_watch_free(struct kiln_watch *w);

/* The ncurses dashboard (clients/dashboard.c); the process exit status. */
int kiln_dashboard_run(const struct kiln_client *cl, struct kiln_watch *w, bool exit_on_end);

#endif /* KILN_CLIENTS_WATCH_H */
