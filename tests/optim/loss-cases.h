/*
 * tests/optim/loss-cases.h — run one loss case of the fixture: load its tensors, call
 * the kiln loss its "fn" names with its "args". Shared by the value test and the
 * gradient test, so both exercise exactly the same calls.
 */
#ifndef KILN_TEST_OPTIM_LOSS_CASES_H
#define KILN_TEST_OPTIM_LOSS_CASES_H

#include "fixture.h"

static kiln_reduction reduction_of(const cJSON *args)
{
    const char *r = jstr(args, "reduction");
    if (!r || strcmp(r, "mean") == 0)
        return KILN_REDUCTION_MEAN;
    if (strcmp(r, "sum") == 0)
        return KILN_REDUCTION_SUM;
    if (strcmp(r, "none") == 0)
        return KILN_REDUCTION_NONE;
    if (strcmp(r, "batchmean") == 0)
        return KILN_REDUCTION_BATCHMEAN;
    fail_msg("unknown reduction %s", r);
    return KILN_REDUCTION_MEAN;
}

/* The case's named input, or NULL when the case has none by that name. */
static kiln_tensor *case_input(const cJSON *c, const char *what)
{
    char name[160];
    snprintf(name, sizeof name, "loss.%s.%s", jstr(c, "name"), what);
    return ref_has(name) ? ref_tensor("%s", name) : NULL;
}

/* Call the loss; diff (the input or x1) is passed in so the caller can make it a leaf. */
static kiln_tensor *run_loss_case(const cJSON *c, kiln_tensor *diff)
{
    const char *fn = jstr(c, "fn");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(c, "args");
    kiln_reduction r = reduction_of(args);
    kiln_tensor *target = case_input(c, "target");
    kiln_tensor *weight = case_input(c, "weight");
    if (strcmp(fn, "cross_entropy") == 0 || strcmp(fn, "nll") == 0) {
        kiln_loss_ce_opts o = kiln_loss_ce_opts_default();
        o.reduction = r;
        o.weight = weight;
        o.ignore_index = (int64_t)jnum(args, "ignore_index", -100);
        o.label_smoothing = jnum(args, "label_smoothing", 0);
        return fn[0] == 'c' ? kiln_loss_cross_entropy(diff, target, &o) : kiln_loss_nll(diff, target, &o);
    }
    if (strcmp(fn, "bce") == 0)
        return kiln_loss_bce(diff, target, weight, r);
    if (strcmp(fn, "bce_with_logits") == 0)
        return kiln_loss_bce_with_logits(diff, target, weight, case_input(c, "pos_weight"), r);
    if (strcmp(fn, "mse") == 0)
        return kiln_loss_mse(diff, target, r);
    if (strcmp(fn, "l1") == 0)
        return kiln_loss_l1(diff, target, r);
    if (strcmp(fn, "smooth_l1") == 0)
        return kiln_loss_smooth_l1(diff, target, jnum(args, "beta", 1), r);
    if (strcmp(fn, "huber") == 0)
        return kiln_loss_huber(diff, target, jnum(args, "delta", 1), r);
    if (strcmp(fn, "kl_div") == 0)
        return kiln_loss_kl_div(diff, target, r, jnum(args, "log_target", 0) != 0);
    if (strcmp(fn, "cosine_embedding") == 0)
        return kiln_loss_cosine_embedding(diff, case_input(c, "x2"), target, jnum(args, "margin", 0), r);
    fail_msg("unknown loss %s", fn);
    return NULL;
}

#endif
