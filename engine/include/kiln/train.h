/*
 * kiln/train.h — the Learner: training and validation loops, metrics, checkpoints,
 * resume, early stopping and a final report.
 *
 *     kiln_learner_config lc = kiln_learner_config_default();
 *     lc.epochs = 10;
 *     lc.num_classes = 10;                       // classification metrics
 *     lc.checkpoint_dir = "var/checkpoints/fmnist";
 *     lc.best_metric = "valid_accuracy";         // keep-best; higher is better
 *     lc.progress = stderr;                      // a progress bar with ETA
 *     kiln_learner *L = kiln_learner_create(&lc, model, opt, sched, train_loader, valid_loader);
 *     kiln_learner_subscribe(L, on_event, ctx);  // per-step and per-epoch metrics
 *     if (resume) kiln_learner_resume(L, "var/checkpoints/fmnist");  // the newest good one
 *     if (kiln_learner_fit(L) < 0) fprintf(stderr, "%s\n", kiln_error());
 *     kiln_learner_write_report(L, "report.json");
 *     kiln_learner_free(L);
 *
 * Steps. Each training batch runs in one kiln scope (forward, loss, backward, and the
 * optimizer update at the end of an accumulation group), so its memory returns to the
 * pool before the next. With grad_accum = k the loss is divided by k, gradients add up
 * over k batches (or the epoch's last, shorter group) and the optimizer steps once.
 * The scheduler steps once per optimizer update (sched_per_step) or once per epoch.
 *
 * Exact resume. The loaders' order is a pure function of (seed, epoch); a checkpoint
 * holds the model's parameters and buffers, the optimizer's and the scheduler's state,
 * the learner's generator and every module's (the streams dropout draws from; see
 * kiln_module_generators), the epoch and the batch position, and the metric history. A
 * learner resumed from it replays the same batches and computes the same losses, bit
 * for bit, as the run that wrote it. A resume is all or nothing: a checkpoint that does
 * not fit (another model, optimizer kind or scheduler) changes nothing.
 *
 * Metrics (per epoch, names as in the history and the report): train_loss,
 * train_accuracy, valid_loss, valid_accuracy, valid_top<k>_accuracy, valid_precision,
 * valid_recall, valid_f1 (macro), lr, items_per_sec, epoch_seconds, peak_rss_mb; the
 * validation confusion matrix is in the report for up to KILN_LEARNER_CONFUSION_MAX
 * classes (the metrics need memory linear in the class count, the matrix quadratic).
 * Steps report loss, accuracy and lr. A classifier's output is [batch, W] with W >=
 * num_classes (logits wider than the classes that occur are fine, as for PyTorch's cross
 * entropy); a row of scores holding a NaN counts as a miss for accuracy and top-k.
 *
 * Threads: a learner runs on the calling thread (its loaders run their own workers);
 * kiln_learner_cancel may be called from any thread or a signal handler.
 */
#ifndef KILN_TRAIN_H
#define KILN_TRAIN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kiln/data.h"
#include "kiln/nn.h"
#include "kiln/optim.h"
#include "kiln/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

KILN_API_BEGIN

/* ------------------------------------------------------------------- metrics */

/** A confusion matrix: counts[label * classes + prediction]. */
typedef struct kiln_confusion {
    int64_t classes;
    int64_t *counts;
} kiln_confusion;

/** 0, or -1 plus a message. */
int kiln_confusion_init(kiln_confusion *cm, int64_t classes);
void kiln_confusion_free(kiln_confusion *cm);
void kiln_confusion_reset(kiln_confusion *cm);
/** Count one (label, prediction) pair; out-of-range values are ignored. */
void kiln_confusion_add(kiln_confusion *cm, int64_t label, int64_t prediction);
int64_t kiln_confusion_total(const kiln_confusion *cm);
double kiln_confusion_accuracy(const kiln_confusion *cm);
/** Macro averages over all classes; a class with no predictions (precision) or no items
 *  (recall) counts as 0, and F1 is the mean of the per-class F1 scores (scikit-learn's
 *  convention with zero_division=0). */
double kiln_confusion_precision(const kiln_confusion *cm);
double kiln_confusion_recall(const kiln_confusion *cm);
double kiln_confusion_f1(const kiln_confusion *cm);

/** How many of n rows of logits [n, classes] have their label among the k largest. A row
 *  holding a NaN is a miss (its order means nothing), as is a label outside [0, classes). */
int64_t kiln_topk_hits(const float *logits, int64_t n, int64_t classes, const int64_t *labels, int k);

/* ------------------------------------------------------------------- events */

typedef enum kiln_train_event_kind {
    KILN_EVENT_STEP = 0,     /* after each training batch */
    KILN_EVENT_EPOCH,        /* after each epoch's validation: the epoch's metrics */
    KILN_EVENT_CHECKPOINT,   /* a checkpoint was written (path) */
    KILN_EVENT_DONE,         /* fit returns (reason in stop_reason) */
} kiln_train_event_kind;

typedef struct kiln_train_event {
    kiln_train_event_kind kind;
    int64_t epoch;           /* 1-based */
    int64_t epochs;
    int64_t batch;           /* STEP: 0-based batch of the epoch */
    int64_t batches;         /* batches per epoch */
    int64_t step;            /* optimizer updates so far */
    int n;                   /* metrics: names[i] = values[i] */
    const char *const *names;
    const double *values;
    const char *path;        /* CHECKPOINT: the folder */
    const char *stop_reason; /* DONE: "completed", "early_stopping", "cancelled", "error" */
    const char *json;        /* the event as one JSON object (for server-sent events) */
} kiln_train_event;

/** Called on the learner's thread; keep it short. Pointers are valid during the call. */
typedef void (*kiln_train_subscriber)(void *ud, const kiln_train_event *ev);

/* ------------------------------------------------------------------- learner */

/** A loss of the model output and the batch target; a new reference (scoped). */
typedef kiln_tensor *(*kiln_train_loss_fn)(void *ud, kiln_tensor *output, kiln_tensor *target);

typedef struct kiln_learner_config {
    int64_t epochs;                  /* 1 */
    int64_t num_classes;             /* > 0: accuracy, top-k, precision/recall/F1, confusion */
    int topk;                        /* 5 */
    int grad_accum;                  /* 1 */
    bool sched_per_step;             /* true: scheduler steps per update; false: per epoch */
    const char *checkpoint_dir;      /* NULL: no checkpoints */
    int64_t checkpoint_every_epochs; /* 1 (0: never by epoch) */
    int64_t checkpoint_every_steps;  /* 0: never by step */
    int keep_last;                   /* 2 */
    const char *best_metric;         /* NULL: no keep-best; e.g. "valid_accuracy" */
    bool best_max;                   /* true: higher is better */
    const char *early_stop_metric;   /* NULL: no early stopping */
    bool early_stop_max;             /* true: higher is better */
    int patience;                    /* epochs without improvement before stopping (3) */
    double min_delta;                /* improvement smaller than this does not count (0) */
    /* NULL: quiet; else a progress line, redrawn per step on a terminal, once an epoch otherwise */
    FILE *progress;
    uint64_t seed;                   /* the learner's generator (kiln_learner_rng) */
    /* false: a NaN or infinite training loss is recorded and training goes on. true: fit
     * fails at the first one, before that batch's update, with "loss became NaN at epoch
     * E step S" (S: the optimizer update the batch belongs to, 1-based), as PyTorch
     * Lightning's terminate_on_nan / detect_anomaly stop a diverged run. */
    bool fail_on_nonfinite_loss;
} kiln_learner_config;

/** Classes up to which the learner keeps the validation confusion matrix for the report. */
#define KILN_LEARNER_CONFUSION_MAX 1024

kiln_learner_config kiln_learner_config_default(void);

typedef struct kiln_learner kiln_learner;

/**
 * A learner over model, opt (over the model's parameters), sched (may be NULL), the
 * training loader and a validation loader (may be NULL). Nothing is owned: the caller
 * frees them after the learner. Strings in cfg are copied. NULL plus a message for a
 * config out of range (negative num_classes or checkpoint intervals among them), a
 * best_metric or early_stop_metric the learner would never record with this config and
 * loaders, or an optimizer with a parameter that is not one of the model's tensors.
 */
kiln_learner *kiln_learner_create(const kiln_learner_config *cfg, kiln_module *model, kiln_optim *opt,
                                  kiln_sched *sched, kiln_loader *train, kiln_loader *valid);
/** The loss (default: cross-entropy of logits against class indices). */
void kiln_learner_set_loss(kiln_learner *L, kiln_train_loss_fn fn, void *ud);
/** Add a subscriber (up to 16). 0 or -1. */
int kiln_learner_subscribe(kiln_learner *L, kiln_train_subscriber fn, void *ud);
/**
 * Restore everything from a checkpoint: path is a checkpoint folder, or a checkpoint root
 * (the newest one that verifies; each newer one passed over is named, with why, in a notice
 * on cfg.progress, else stderr). The next fit continues where that run was, and until it
 * completes an epoch kiln_learner_metric and the report give the checkpoint's latest epoch
 * metrics and confusion matrix, so a finished run resumed reports what it reported. 0, or -1
 * with nothing changed; a checkpoint of another model is refused naming the first model
 * tensor it lacks or holds in another shape. A checkpoint written before module generators
 * were saved resumes with the modules' current streams and a notice.
 */
int kiln_learner_resume(kiln_learner *L, const char *path);
/**
 * Train until cfg.epochs, early stopping or cancellation. 0 when it stopped for one of
 * those reasons (see kiln_learner_stop_reason), -1 plus a message on an error (a
 * scheduler refusing its step, one-cycle past total_steps, among them).
 */
int kiln_learner_fit(kiln_learner *L);
/** Evaluate the model on a loader: writes loss and (classification) accuracy. 0 or -1. */
int kiln_learner_evaluate(kiln_learner *L, kiln_loader *ld, double *loss, double *accuracy);
/** Ask fit to stop before its next step. Async-signal-safe. */
void kiln_learner_cancel(kiln_learner *L);
const char *kiln_learner_stop_reason(const kiln_learner *L);
/** Epochs completed and optimizer updates so far. */
int64_t kiln_learner_epoch(const kiln_learner *L);
int64_t kiln_learner_step(const kiln_learner *L);
/** The latest epoch value of a metric; NAN when none. */
double kiln_learner_metric(const kiln_learner *L, const char *name);
/** The learner's generator (saved in checkpoints); use it for dropout and the like. */
kiln_generator *kiln_learner_rng(kiln_learner *L);
/**
 * The final report: {"stop_reason", "epochs_completed", "steps", "history": [{epoch
 * metrics...}], "valid_confusion": [[...]] (a classifier of up to
 * KILN_LEARNER_CONFUSION_MAX classes), "best": {"metric", "value", "epoch", "checkpoint"},
 * "last_checkpoint"}. malloc'd; free().
 */
char *kiln_learner_report_json(const kiln_learner *L);
/** Write the report atomically. 0 or -1. */
int kiln_learner_write_report(const kiln_learner *L, const char *path);
void kiln_learner_free(kiln_learner *L);

KILN_API_END

#ifdef __cplusplus
}
#endif
#endif /* KILN_TRAIN_H */
