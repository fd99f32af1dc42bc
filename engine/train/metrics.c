/*
 * engine/train/metrics.c — classification metrics computed on the host from counts:
 * the confusion matrix and the macro precision/recall/F1 derived from it, and top-k hits
 * from a batch of logits. Keeping the counts (not running averages) makes the epoch
 * figures exact and lets a checkpoint or a report carry the whole matrix.
 */
#include <stdlib.h>
#include <string.h>

#include "error-impl.h"
#include "kiln/train.h"

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
         * lower index, as a stable descending sort would order them). */
        int64_t better = 0;
        for (int64_t c = 0; c < classes && better < k; c++)
            if (row[c] > row[y] || (row[c] == row[y] && c < y))
                better++;
        hits += better < k;
    }
    return hits;
}
