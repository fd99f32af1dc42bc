/*
 * tests/training/test-learner-classes.c — the Learner's classifier edges: outputs wider and
 * narrower than the data's classes, a class count far too large for a confusion matrix, and a
 * run whose loss becomes NaN (its metrics and fail_on_nonfinite_loss).
 *
 * Tiny synthetic data (24 items of 4 features, 3 classes) on the cpu device (KILN_TEST_DEVICE
 * names another, e.g. ref or cuda:0), a few steps each.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

static int failures;
#define CHECK(cond)                                                                                               \
    do {                                                                                                          \
        if (!(cond)) {                                                                                            \
            fprintf(stderr, "%s:%d: check failed: %s (%s)\n", __FILE__, __LINE__, #cond, kiln_error());           \
            failures++;                                                                                           \
        }                                                                                                         \
    } while (0)

enum {
    N = 24,
    F = 4
};

/* One Linear of F features to width class scores. */
static kiln_module *linear(kiln_device *dev, int width)
{
    char spec[400];
    snprintf(spec, sizeof spec,
             "{\"inputs\": [\"x\"], \"nodes\": [{\"name\": \"fc\", \"layer\": \"Linear\", \"config\": "
             "{\"in_features\": %d, \"out_features\": %d}, \"inputs\": [\"x\"]}], \"outputs\": [\"fc\"]}",
             F, width);
    kiln_generator gen = kiln_generator_make(1);
    return kiln_model_from_json(spec, dev, &gen);
}

/* Three separable classes; every feature NaN when poisoned. */
static kiln_dataset *data(bool poisoned)
{
    float x[N * F];
    int64_t y[N];
    for (int i = 0; i < N; i++) {
        y[i] = i % 3;
        for (int f = 0; f < F; f++)
            x[i * F + f] = poisoned ? NAN : (f == y[i] ? 2.0f : 0.0f) + 0.1f * (float)(i % 5);
    }
    return kiln_dataset_from_arrays(N, 1, (int64_t[]){F}, x, y, 3, NULL, 0);
}

struct result {
    int fit; /* kiln_learner_fit's, or -2 when the learner was not created */
    char error[512];
    double valid_accuracy, valid_top2, train_accuracy;
    char *report;
};

/* Two epochs of SGD over a model of width outputs; num_classes as given. */
static struct result train(kiln_device *dev, int width, int64_t num_classes, bool poisoned, bool fail_on_nan)
{
    struct result r = {.fit = -2};
    kiln_module *m = linear(dev, width);
    kiln_optim_config oc = kiln_optim_config_default(KILN_OPTIM_SGD);
    oc.lr = 0.1;
    kiln_optim *opt = m ? kiln_optim_create_module(&oc, m) : NULL;
    kiln_dataset *ds = data(poisoned);
    kiln_loader_config lc = kiln_loader_config_default();
    lc.batch_size = 8;
    kiln_loader *tl = ds ? kiln_loader_create(ds, &lc, dev) : NULL;
    lc.shuffle = false;
    kiln_loader *vl = ds ? kiln_loader_create(ds, &lc, dev) : NULL;
    kiln_learner_config cfg = kiln_learner_config_default();
    cfg.epochs = 2;
    cfg.num_classes = num_classes;
    cfg.topk = 2;
    cfg.fail_on_nonfinite_loss = fail_on_nan;
    kiln_learner *L = opt && tl && vl ? kiln_learner_create(&cfg, m, opt, NULL, tl, vl) : NULL;
    if (!L)
        snprintf(r.error, sizeof r.error, "%s", kiln_error());
    if (L) {
        r.fit = kiln_learner_fit(L);
        snprintf(r.error, sizeof r.error, "%s", r.fit ? kiln_error() : "");
        r.valid_accuracy = kiln_learner_metric(L, "valid_accuracy");
        r.valid_top2 = kiln_learner_metric(L, "valid_top2_accuracy");
        r.train_accuracy = kiln_learner_metric(L, "train_accuracy");
        r.report = kiln_learner_report_json(L);
    }
    kiln_learner_free(L);
    kiln_loader_free(tl);
    kiln_loader_free(vl);
    kiln_dataset_free(ds);
    kiln_optim_free(opt);
    kiln_module_free(m);
    return r;
}

static void test_topk_nan(void)
{
    /* row 0: the label's score is NaN; row 1: another class's is; row 2: clean, label first */
    const float logits[] = {NAN, 0.1f, 0.2f, 0.3f, 0.9f, 0.5f, NAN, 0.1f, 0.9f, 0.2f, 0.1f, 0.0f};
    const int64_t labels[] = {0, 1, 0};
    CHECK(kiln_topk_hits(logits, 3, 4, labels, 4) == 1);
    CHECK(kiln_topk_hits(logits, 3, 4, labels, 1) == 1);
}

static void test_widths(kiln_device *dev)
{
    /* 10 scores for 3 classes: trains, as PyTorch's cross entropy does */
    struct result wide = train(dev, 10, 3, false, false);
    CHECK(wide.fit == 0);
    CHECK(wide.valid_accuracy > 0.9);
    CHECK(wide.report && strstr(wide.report, "\"valid_confusion\""));
    free(wide.report);
    /* 2 scores for 3 classes: refused naming both counts, before the loss complains about a target */
    struct result narrow = train(dev, 2, 3, false, false);
    CHECK(narrow.fit == -1);
    CHECK(strstr(narrow.error, "[8, 2] has 2 class scores an item, fewer than the data's 3 classes") != NULL);
    free(narrow.report);
    /* a million classes (a CSV label of 999999): the learner is made without a million-square
     * matrix, leaves the matrix out of its report, and the narrow model is what fails */
    struct result huge = train(dev, 3, 1000000, false, false);
    CHECK(huge.fit == -1);
    CHECK(strstr(huge.error, "fewer than the data's 1000000 classes") != NULL);
    CHECK(huge.report && !strstr(huge.report, "valid_confusion"));
    free(huge.report);
}

static void test_nan(kiln_device *dev)
{
    /* a NaN model's validation: every item a miss, top-k too */
    struct result kept = train(dev, 3, 3, true, false);
    CHECK(kept.fit == 0);
    CHECK(kept.valid_accuracy == 0);
    CHECK(kept.valid_top2 == 0);
    CHECK(kept.train_accuracy == 0);
    free(kept.report);
    /* stopped at the first NaN loss, naming where */
    struct result stopped = train(dev, 3, 3, true, true);
    CHECK(stopped.fit == -1);
    CHECK(strstr(stopped.error, "loss became NaN at epoch 1 step 1") != NULL);
    CHECK(stopped.report && strstr(stopped.report, "\"error\""));
    free(stopped.report);
}

int main(void)
{
    const char *spec = getenv("KILN_TEST_DEVICE");
    kiln_device *dev = kiln_device_open(spec && spec[0] ? spec : "cpu");
    CHECK(dev != NULL);
    test_topk_nan();
    test_widths(dev);
    test_nan(dev);
    kiln_device_close(dev);
    if (failures)
        fprintf(stderr, "%d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
