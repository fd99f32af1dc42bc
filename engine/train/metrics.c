/*
 * engine/train/metrics.c — classification metrics computed on the host from counts:
 * the confusion matrix and the macro precision/recall/F1 derived from it, and top-k hits
 * from a batch of logits. Keeping the counts (not running averages) makes the epoch
 * figures exact and lets a checkpoint or a report carry the whole matrix. The learner's
 * per-class tally gives the same macro figures from counts linear in the class count.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error-impl.h"
#include "kiln/train.h"
#include "learner-impl.h"

int kiln_confusion_init(kiln_confusion *cm, int64_t classes)
{
    if (!cm || classes < 1 || classes > 100000)
        return kiln__error_set("confusion_init: %lld classes", (long long)classes);
    cm->classes = classes;
    cm->counts = calloc((size_t)(classes * classes), sizeof *cm->counts);
    return cm->counts ? 0 : kiln__error_set("confusion_init: out of memory");
}

void kiln_confusion_free(kiln_confusion *cm)
{
    if (cm) {
        free(cm->counts);
        cm->counts = NULL;
        cm->classes = 0;
    }
}

void kiln_confusion_reset(kiln_confusion *cm)
{
    if (cm && cm->counts)
        memset(cm->counts, 0, (size_t)(cm->classes * cm->classes) * sizeof *cm->counts);
}

void kiln_confusion_add(kiln_confusion *cm, int64_t label, int64_t prediction)
{
    if (cm && cm->counts && label >= 0 && label < cm->classes && prediction >= 0 && prediction < cm->classes)
        cm->counts[label * cm->classes + prediction]++;
}

int64_t kiln_confusion_total(const kiln_confusion *cm)
{
    int64_t t = 0;
    for (int64_t i = 0; cm && i < cm->classes * cm->classes; i++)
        t += cm->counts[i];
    return t;
}

double kiln_confusion_accuracy(const kiln_confusion *cm)
{
    int64_t total = kiln_confusion_total(cm), hit = 0;
    for (int64_t c = 0; cm && c < cm->classes; c++)
        hit += cm->counts[c * cm->classes + c];
    return total ? (double)hit / (double)total : 0.0;
}

/* Per-class true positives, predicted and actual counts. */
static void class_counts(const kiln_confusion *cm, int64_t c, double *tp, double *pred, double *actual)
{
    *tp = (double)cm->counts[c * cm->classes + c];
    *pred = *actual = 0;
    for (int64_t k = 0; k < cm->classes; k++) {
        *pred += (double)cm->counts[k * cm->classes + c];
        *actual += (double)cm->counts[c * cm->classes + k];
    }
}

double kiln_confusion_precision(const kiln_confusion *cm)
{
    if (!cm || cm->classes < 1)
        return 0;
    double sum = 0, tp, pred, actual;
    for (int64_t c = 0; c < cm->classes; c++) {
        class_counts(cm, c, &tp, &pred, &actual);
        sum += pred > 0 ? tp / pred : 0;
    }
    return sum / (double)cm->classes;
}

double kiln_confusion_recall(const kiln_confusion *cm)
{
    if (!cm || cm->classes < 1)
        return 0;
    double sum = 0, tp, pred, actual;
    for (int64_t c = 0; c < cm->classes; c++) {
        class_counts(cm, c, &tp, &pred, &actual);
        sum += actual > 0 ? tp / actual : 0;
    }
    return sum / (double)cm->classes;
}

double kiln_confusion_f1(const kiln_confusion *cm)
{
    if (!cm || cm->classes < 1)
        return 0;
    double sum = 0, tp, pred, actual;
    for (int64_t c = 0; c < cm->classes; c++) {
        class_counts(cm, c, &tp, &pred, &actual);
        double p = pred > 0 ? tp / pred : 0, r = actual > 0 ? tp / actual : 0;
        sum += p + r > 0 ? 2 * p * r / (p + r) : 0;
    }
    return sum / (double)cm->classes;
}

int64_t kiln_topk_hits(const float *logits, int64_t n, int64_t classes, const int64_t *labels, int k)
{
    int64_t hits = 0;
    for (int64_t i = 0; i < n; i++) {
        const float *row = logits + i * classes;
        int64_t y = labels[i];
        if (y < 0 || y >= classes)
            continue;
        /* The label is in the top k when fewer than k classes beat it (ties go to the
         * lower index, as a stable descending sort would order them). Every comparison
         * with a NaN is false, so without the NaN test nothing would beat a label whose
         * score is NaN and a diverged model would score every item a hit. */
        int64_t better = 0;
        bool nan = false;
        for (int64_t c = 0; c < classes && !nan; c++) {
            nan = isnan(row[c]);
            better += row[c] > row[y] || (row[c] == row[y] && c < y);
        }
        hits += !nan && better < k;
    }
    return hits;
}

/* ---- the learner's per-class tally --------------------------------------------------------- */

int kiln__tally_init(kiln__class_tally *t, int64_t classes)
{
    memset(t, 0, sizeof *t);
    if (classes < 1 || classes > ((int64_t)1 << 40))
        return kiln__error_set("class tally: %lld classes", (long long)classes);
    int64_t *all = calloc((size_t)classes * 3, sizeof *all);
    if (!all)
        return kiln__error_set("class tally: out of memory for %lld classes", (long long)classes);
    *t = (kiln__class_tally){classes, all, all + classes, all + 2 * classes};
    return 0;
}

void kiln__tally_free(kiln__class_tally *t)
{
    free(t->hits);
    memset(t, 0, sizeof *t);
}

void kiln__tally_reset(kiln__class_tally *t)
{
    if (t->hits)
        memset(t->hits, 0, (size_t)t->classes * 3 * sizeof *t->hits);
}

void kiln__tally_add(kiln__class_tally *t, int64_t label, int64_t prediction)
{
    if (!t->hits || label < 0 || label >= t->classes)
        return;
    t->actual[label]++;
    if (prediction >= 0 && prediction < t->classes)
        t->predicted[prediction]++;
    t->hits[label] += prediction == label;
}

double kiln__tally_precision(const kiln__class_tally *t)
{
    double sum = 0;
    for (int64_t c = 0; c < t->classes; c++)
        sum += t->predicted[c] > 0 ? (double)t->hits[c] / (double)t->predicted[c] : 0;
    return t->classes ? sum / (double)t->classes : 0;
}

double kiln__tally_recall(const kiln__class_tally *t)
{
    double sum = 0;
    for (int64_t c = 0; c < t->classes; c++)
        sum += t->actual[c] > 0 ? (double)t->hits[c] / (double)t->actual[c] : 0;
    return t->classes ? sum / (double)t->classes : 0;
}

double kiln__tally_f1(const kiln__class_tally *t)
{
    double sum = 0;
    for (int64_t c = 0; c < t->classes; c++) {
        double p = t->predicted[c] > 0 ? (double)t->hits[c] / (double)t->predicted[c] : 0;
        double r = t->actual[c] > 0 ? (double)t->hits[c] / (double)t->actual[c] : 0;
        sum += p + r > 0 ? 2 * p * r / (p + r) : 0;
    }
    return t->classes ? sum / (double)t->classes : 0;
}
