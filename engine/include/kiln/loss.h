/*
 * kiln/loss.h — loss functions with PyTorch's semantics (torch.nn.functional).
 *
 *     kiln_scope_begin();
 *     kiln_tensor *logits = kiln_linear(x, w, b);                  // [N, C]
 *     kiln_loss_ce_opts o = kiln_loss_ce_opts_default();           // mean, ignore -100
 *     o.label_smoothing = 0.1;
 *     kiln_tensor *loss = kiln_loss_cross_entropy(logits, labels, &o);  // labels i64 [N]
 *     if (!loss) fprintf(stderr, "%s\n", kiln_error());
 *     kiln_backward(loss, NULL);
 *     kiln_scope_end();
 *
 * Every loss is composed from the tensor ops of kiln/tensor.h, so it runs on every
 * backend and autodiff differentiates it like any other expression. Log-probabilities
 * come from log_softmax and the logit forms use softplus, so large logits neither
 * overflow nor lose precision.
 *
 * Reductions: KILN_REDUCTION_MEAN (the default, value 0), _SUM and _NONE (per-element
 * or per-sample losses, as PyTorch returns them). _BATCHMEAN is accepted by the KL
 * divergence only.
 *
 * Errors: a shape mismatch, a class index out of range, a target of the wrong dtype or
 * an unsupported reduction gives NULL and a message naming the loss and the shapes.
 * Unlike PyTorch, the elementwise losses do not broadcast input against target (PyTorch
 * only warns, and the broadcast is nearly always a bug): the shapes must be equal.
 * Inputs given as NULL give NULL without touching the message, as every op does.
 */
#ifndef KILN_LOSS_H
#define KILN_LOSS_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

KILN_API_BEGIN

typedef enum kiln_reduction {
    KILN_REDUCTION_MEAN = 0,
    KILN_REDUCTION_SUM,
    KILN_REDUCTION_NONE,
    KILN_REDUCTION_BATCHMEAN, /* KL divergence only: sum / batch size */
} kiln_reduction;

/** Options of cross-entropy and NLL. Start from kiln_loss_ce_opts_default(). */
typedef struct kiln_loss_ce_opts {
    kiln_reduction reduction;
    /** Per-class weights [C] (floating) or NULL. With mean reduction and class-index
     *  targets the sum is divided by the summed weights of the non-ignored targets. */
    kiln_tensor *weight;
    /** Targets equal to this class contribute 0 and do not count in the mean (-100).
     *  With mean reduction and every target ignored the loss is NaN (0 / 0), as
     *  PyTorch's, and its gradient is zero, as PyTorch's: a batch of padding alone
     *  leaves the parameters unchanged. */
    int64_t ignore_index;
    /** In [0, 1]: mix the target with the uniform distribution (cross-entropy only). */
    double label_smoothing;
} kiln_loss_ce_opts;

/** PyTorch's defaults: mean, no weight, ignore_index -100, no smoothing. */
kiln_loss_ce_opts kiln_loss_ce_opts_default(void);

/**
 * Cross-entropy of logits input [N, C, d1...] (or [C] unbatched) against either class
 * indices (integer, [N, d1...]) or class probabilities (floating, input's shape).
 * opts NULL means the defaults. Reduction none gives [N, d1...].
 */
kiln_tensor *kiln_loss_cross_entropy(kiln_tensor *input, kiln_tensor *target, const kiln_loss_ce_opts *opts);
/** Negative log-likelihood of log-probabilities input [N, C, d1...] and class indices. */
kiln_tensor *kiln_loss_nll(kiln_tensor *input, kiln_tensor *target, const kiln_loss_ce_opts *opts);

/**
 * Binary cross-entropy of probabilities input (each in [0, 1]) against target of the
 * same shape; weight (broadcast to input) or NULL. Logs are clamped at -100 as PyTorch's.
 * The gradient is PyTorch's closed form, w (x - t) / max(x (1 - x), 1e-12) for input
 * (finite at 0 and 1, where a saturated sigmoid puts it) and, for target, w times the
 * difference of the clamped logs, log(1 - x) - log(x).
 */
kiln_tensor *kiln_loss_bce(kiln_tensor *input, kiln_tensor *target, kiln_tensor *weight,
                           kiln_reduction reduction);
/**
 * Binary cross-entropy on logits, computed as (1 - t) x + (1 + (pw - 1) t) softplus(-x),
 * which never overflows. pos_weight broadcasts along the last (class) dim; NULL = 1.
 */
kiln_tensor *kiln_loss_bce_with_logits(kiln_tensor *input, kiln_tensor *target, kiln_tensor *weight,
                                       kiln_tensor *pos_weight, kiln_reduction reduction);

kiln_tensor *kiln_loss_mse(kiln_tensor *input, kiln_tensor *target, kiln_reduction reduction);
kiln_tensor *kiln_loss_l1(kiln_tensor *input, kiln_tensor *target, kiln_reduction reduction);
/** 0.5 d² / beta where |d| < beta, else |d| - 0.5 beta; beta 0 is L1 (PyTorch's default 1). */
kiln_tensor *kiln_loss_smooth_l1(kiln_tensor *input, kiln_tensor *target, double beta,
                                 kiln_reduction reduction);
/** 0.5 d² where |d| < delta, else delta (|d| - 0.5 delta); delta > 0 (default 1). */
kiln_tensor *kiln_loss_huber(kiln_tensor *input, kiln_tensor *target, double delta,
                             kiln_reduction reduction);
/**
 * KL divergence with input as log-probabilities: target (log(target) - input), or with
 * log_target, exp(target) (target - input). Zero targets contribute 0. Mean averages
 * over every element (as PyTorch's 'mean'); batchmean divides the sum by input's dim 0.
 */
kiln_tensor *kiln_loss_kl_div(kiln_tensor *input, kiln_tensor *target, kiln_reduction reduction,
                              bool log_target);
/**
 * Cosine embedding loss of x1, x2 [N, D] (or [D]) with y [N] (or []) holding 1 or -1:
 * 1 - cos where y = 1, max(0, cos - margin) where y = -1.
 */
kiln_tensor *kiln_loss_cosine_embedding(kiln_tensor *x1, kiln_tensor *x2, kiln_tensor *y, double margin,
                                        kiln_reduction reduction);

KILN_API_END

#ifdef __cplusplus
}
#endif
#endif /* KILN_LOSS_H */
