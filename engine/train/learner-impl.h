/*
 * engine/train/learner-impl.h — the learner's state, shared by the loop (learner.c) and
 * the checkpoint code (learner-ckpt.c).
 */
#ifndef KILN_LEARNER_IMPL_H
#define KILN_LEARNER_IMPL_H

#include <stdatomic.h>

#include <cjson/cJSON.h>

#include "kiln/train.h"

enum { KILN__MAX_SUBS = 16, KILN__MAX_METRICS = 32 };

/* Per-class counts of one validation pass (metrics.c): all the macro precision, recall and
 * F1 need, in memory linear in the class count, where the confusion matrix is quadratic (a
 * CSV label of 999999 asks for a million classes). */
typedef struct kiln__class_tally {
    int64_t classes;
    int64_t *hits, *predicted, *actual; /* one allocation, classes each */
} kiln__class_tally;

/** 0, or -1 plus a message. */
int kiln__tally_init(kiln__class_tally *t, int64_t classes);
void kiln__tally_free(kiln__class_tally *t);
void kiln__tally_reset(kiln__class_tally *t);
/** One item: its label and the predicted class (-1: none, a row of scores holding a NaN);
 *  a label outside [0, classes) is not counted, a prediction outside it counts as a miss. */
void kiln__tally_add(kiln__class_tally *t, int64_t label, int64_t prediction);
/** Macro averages with the conventions of kiln_confusion_precision and its siblings. */
double kiln__tally_precision(const kiln__class_tally *t);
double kiln__tally_recall(const kiln__class_tally *t);
double kiln__tally_f1(const kiln__class_tally *t);

struct kiln_learner {
    kiln_learner_config cfg;
    char *ckpt_dir, *best_metric, *es_metric; /* owned copies of cfg's strings */
    kiln_module *model;
    kiln_optim *opt;
    kiln_sched *sched;
    kiln_loader *train, *valid;
    kiln_train_loss_fn loss_fn;
    void *loss_ud;
    struct {
        kiln_train_subscriber fn;
        void *ud;
    } subs[KILN__MAX_SUBS];
    int nsubs;
    atomic_int cancel;
    kiln_generator rng;
    /* progress: completed epochs, optimizer updates, the next batch of the current epoch
     * and the current epoch's partial sums (so a mid-epoch resume reports the same epoch
     * figures) */
    int64_t epoch, step, batch_pos;
    double part_loss;
    int64_t part_n, part_correct;
    cJSON *history;          /* one object per completed epoch */
    kiln__class_tally tally; /* the latest validation's (a classifier) */
    kiln_confusion cm;       /* the same as a matrix, up to KILN_LEARNER_CONFUSION_MAX classes */
    const char *stop_reason;
    /* the latest epoch's metrics */
    int nm;
    const char *mnames[KILN__MAX_METRICS];
    double mvals[KILN__MAX_METRICS];
    char topk_name[40];
    /* keep-best and early stopping, recomputed from the history on resume */
    bool has_best;
    double best_value;
    int64_t best_epoch;
    char best_ckpt[4200];
    bool es_has;
    double es_best;
    int es_bad;
    char last_ckpt[4200];
};

/** Deliver ev (its json filled here) to every subscriber. */
void kiln__learner_emit(kiln_learner *L, kiln_train_event *ev);
/** Update keep-best and early-stopping state with one epoch's metrics object. */
void kiln__learner_track(kiln_learner *L, const cJSON *epoch);
/** Write a checkpoint of the current state; at_epoch_end adds the epoch's metrics for
 *  keep-best retention. 0 or -1. */
int kiln__learner_save(kiln_learner *L, bool at_epoch_end);

#endif /* KILN_LEARNER_IMPL_H */
