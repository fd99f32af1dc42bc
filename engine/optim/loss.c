/*
 * engine/optim/loss.c — the loss functions of kiln/loss.h, with PyTorch's semantics.
 *
 * Every loss is an expression in the public tensor ops, so every backend runs it and
 * autodiff differentiates it; binary cross-entropy alone records its value as one node
 * with PyTorch's closed-form gradient, which its clamped logs do not have at 0 and 1
 * (bce_backward). The arguments are checked first (shapes, dtypes, class
 * ranges), because a bad target would otherwise surface as an obscure gather or
 * broadcast error far from the cause; checking a class range reads the targets back to
 * the host, a small cost next to the forward pass that produced the logits.
 *
 * Temporaries live in a scope opened by each entry point; only the result is handed to
 * the caller's scope (or to the caller when none is open).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "autograd-impl.h"
#include "error-impl.h"
#include "kiln/loss.h"
#include "tensor-impl.h"

kiln_loss_ce_opts kiln_loss_ce_opts_default(void)
{
    return (kiln_loss_ce_opts){.reduction = KILN_REDUCTION_MEAN, .weight = NULL, .ignore_index = -100,
                               .label_smoothing = 0};
}

/* A 0-d tensor of t's dtype and device, for comparisons and where(). */
static kiln_tensor *scalar_like(kiln_tensor *t, double v)
{
    return t ? kiln_full(kiln__dev(t), t->dtype, 0, NULL, v) : NULL;
}

static int bad_reduction(const char *loss, kiln_reduction r)
{
    return kiln__error_set("%s: unsupported reduction %d", loss, (int)r);
}

static kiln_tensor *reduce(kiln_tensor *l, kiln_reduction r, const char *loss)
{
    switch (r) {
    case KILN_REDUCTION_MEAN:
        return kiln_mean(l, KILN_ALL_DIMS, false);
    case KILN_REDUCTION_SUM:
        return kiln_sum(l, KILN_ALL_DIMS, false);
    case KILN_REDUCTION_NONE:
        return l;
    default:
        bad_reduction(loss, r);
        return NULL;
    }
}

static bool same_shape(const kiln_tensor *a, const kiln_tensor *b)
{
    return a->ndim == b->ndim && memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0;
}

static int shape_error(const char *loss, const char *an, const kiln_tensor *a, const char *bn,
                       const kiln_tensor *b, const char *why)
{
    char x[128], y[128];
    return kiln__error_set("%s: %s %s and %s %s %s", loss, an, kiln__describe(a, x, sizeof x), bn,
                           kiln__describe(b, y, sizeof y), why);
}

static int need_float(const char *loss, const char *what, const kiln_tensor *t)
{
    char x[128];
    if (kiln_dtype_is_float(t->dtype))
        return 0;
    return kiln__error_set("%s: %s %s must be floating", loss, what, kiln__describe(t, x, sizeof x));
}

/* Run body inside a scope of its own and hand only its result out. */
#define LOSS_SCOPED(expr)                                                                  \
    do {                                                                                   \
        kiln_scope_begin();                                                                \
        kiln_tensor *r_ = (expr);                                                          \
        if (r_)                                                                            \
            kiln_tensor_retain(r_);                                                        \
        kiln_scope_end();                                                                  \
        return kiln__ret(r_);                                                              \
    } while (0)

/* ------------------------------------------------------------ cross-entropy, NLL */

static bool is_index_dtype(kiln_dtype dt)
{
    return dt == KILN_I64 || dt == KILN_I32 || dt == KILN_U8;
}

/* Check the class targets: shape input's without dim 1, values in [0, C) unless
 * ignored. Returns the i64 targets with ignored entries replaced by 0, and the
 * validity mask (floating, logp's dtype). */
static int class_targets(const char *loss, kiln_tensor *logp, kiln_tensor *target, int64_t ignore_index,
                         kiln_tensor **safe, kiln_tensor **validf)
{
    int64_t c = logp->shape[1];
    bool ok = target->ndim == logp->ndim - 1 && target->shape[0] == logp->shape[0];
    for (int d = 2; ok && d < logp->ndim; d++)
        ok = target->shape[d - 1] == logp->shape[d];
    if (!ok)
        return shape_error(loss, "input", logp, "target", target, "do not match (target must be input's shape "
                                                                  "without the class dim)");
    kiln_tensor *t = kiln_cast(target, KILN_I64);
    kiln_tensor *ignored = kiln_eq(t, scalar_like(t, (double)ignore_index));
    kiln_tensor *s = kiln_where(ignored, scalar_like(t, 0), t);
    if (!s)
        return -1;
    /* on the device where it can (no wait; an async device reports at its next sync) */
    if (kiln__check_range(s, 0, c, loss, "target class") < 0)
        return -1;
    *safe = s;
    *validf = kiln_cast(kiln_logical_not(ignored), logp->dtype);
    return *validf ? 0 : -1;
}

/* weight [C] reshaped to broadcast along dim 1 of a rank-ndim tensor. */
static kiln_tensor *class_view(kiln_tensor *weight, int ndim)
{
    int64_t shape[KILN_MAX_DIMS];
    for (int d = 0; d < ndim; d++)
        shape[d] = 1;
    shape[1] = -1;
    return kiln_reshape(weight, ndim, shape);
}

/* sum / den, the mean over the counted targets' weights. When den is 0 (every target
 * ignored) the value is NaN, as PyTorch's, but the gradient is zero, as PyTorch's, rather
 * than 0 * (1/0) = NaN: a batch that is all padding must leave the parameters as they
 * are. */
static kiln_tensor *weighted_mean(kiln_tensor *sum, kiln_tensor *den)
{
    kiln_tensor *none = kiln_eq(den, scalar_like(den, 0));
    kiln_tensor *mean = kiln_div(sum, kiln_where(none, scalar_like(den, 1), den));
    return kiln_masked_fill(mean, none, NAN);
}

/* NLL over log-probabilities with class-index targets; returns the reduced loss and,
 * through w_eff, the per-element effective weights (the mean's denominator). */
static kiln_tensor *nll_core(const char *loss, kiln_tensor *logp, kiln_tensor *target, const kiln_loss_ce_opts *o,
                             kiln_tensor **w_eff_out, kiln_tensor **validf_out)
{
    kiln_tensor *safe = NULL, *validf = NULL;
    if (class_targets(loss, logp, target, o->ignore_index, &safe, &validf) < 0)
        return NULL;
    kiln_tensor *picked = kiln_squeeze(kiln_gather(logp, 1, kiln_unsqueeze(safe, 1)), 1);
    kiln_tensor *w_eff = validf;
    if (o->weight) {
        kiln_tensor *flat = kiln_reshape(safe, 1, (const int64_t[]){-1});
        kiln_tensor *wt = kiln_reshape(kiln_index_select(kiln_cast(o->weight, logp->dtype), 0, flat), safe->ndim,
                                       safe->shape);
        w_eff = kiln_mul(wt, validf);
    }
    kiln_tensor *l = kiln_neg(kiln_mul(picked, w_eff));
    *w_eff_out = w_eff;
    *validf_out = validf;
    switch (o->reduction) {
    case KILN_REDUCTION_MEAN:
        /* PyTorch divides by the summed weights of the counted targets, not by the
         * number of elements. */
        return weighted_mean(kiln_sum(l, KILN_ALL_DIMS, false), kiln_sum(w_eff, KILN_ALL_DIMS, false));
    case KILN_REDUCTION_SUM:
        return kiln_sum(l, KILN_ALL_DIMS, false);
    case KILN_REDUCTION_NONE:
        return l;
    default:
        bad_reduction(loss, o->reduction);
        return NULL;
    }
}

static int check_ce_args(const char *loss, kiln_tensor *input, const kiln_loss_ce_opts *o)
{
    char x[128], y[128];
    if (need_float(loss, "input", input) < 0)
        return -1;
    if (input->ndim < 1)
        return kiln__error_set("%s: input %s needs a class dim", loss, kiln__describe(input, x, sizeof x));
    if ((unsigned)o->reduction > KILN_REDUCTION_NONE)
        return bad_reduction(loss, o->reduction);
    if (!(o->label_smoothing >= 0 && o->label_smoothing <= 1))
        return kiln__error_set("%s: label_smoothing must be in [0, 1] (got %g)", loss, o->label_smoothing);
    if (o->weight) {
        int64_t c = input->ndim == 1 ? input->shape[0] : input->shape[1];
        if (need_float(loss, "weight", o->weight) < 0)
            return -1;
        if (o->weight->ndim != 1 || o->weight->shape[0] != c)
            return kiln__error_set("%s: weight %s must be [%lld] for input %s", loss,
                                   kiln__describe(o->weight, y, sizeof y), (long long)c,
                                   kiln__describe(input, x, sizeof x));
    }
    return 0;
}

static kiln_tensor *ce_body(const char *loss, kiln_tensor *input, kiln_tensor *target, const kiln_loss_ce_opts *o,
                            bool from_logits)
{
    if (check_ce_args(loss, input, o) < 0)
        return NULL;
    bool unbatched = input->ndim == 1;
    bool probs = kiln_dtype_is_float(target->dtype);
    if (!probs && !is_index_dtype(target->dtype)) {
        char x[128];
        kiln__error_set("%s: target %s must be integer class indices%s", loss, kiln__describe(target, x, sizeof x),
                        from_logits ? " or floating class probabilities" : "");
        return NULL;
    }
    if (probs && !from_logits) {
        shape_error(loss, "input", input, "target", target, "need integer class-index targets");
        return NULL;
    }
    if (probs && !same_shape(input, target)) {
        shape_error(loss, "input", input, "target", target, "do not match (probability targets take input's shape)");
        return NULL;
    }
    if (unbatched) {
        if (!probs && target->ndim != 0) {
            shape_error(loss, "input", input, "target", target, "do not match (unbatched input takes a 0-d target)");
            return NULL;
        }
        input = kiln_unsqueeze(input, 0);
        target = kiln_unsqueeze(target, 0);
    }
    kiln_tensor *logp = from_logits ? kiln_log_softmax(input, 1) : input;
    if (!logp)
        return NULL;
    int64_t c = logp->shape[1];
    double eps = from_logits ? o->label_smoothing : 0;
    kiln_tensor *wview = o->weight ? class_view(kiln_cast(o->weight, logp->dtype), logp->ndim) : NULL;
    kiln_tensor *out;
    if (probs) {
        kiln_tensor *t = kiln_cast(target, logp->dtype);
        if (eps > 0)
            t = kiln_add_scalar(kiln_mul_scalar(t, 1 - eps), eps / (double)c);
        kiln_tensor *prod = kiln_mul(logp, t);
        if (wview)
            prod = kiln_mul(prod, wview);
        kiln_tensor *per = kiln_neg(kiln_sum(prod, KILN_DIMS(1), false));
        out = reduce(per, o->reduction, loss);
    } else {
        kiln_tensor *w_eff = NULL, *validf = NULL;
        out = nll_core(loss, logp, target, o, &w_eff, &validf);
        if (out && eps > 0) {
            /* PyTorch: (1 - eps) * nll + eps / C * smooth, where smooth is the (weighted)
             * sum of -logp over classes, zero at ignored targets, and normalized like
             * the nll term under mean reduction. */
            kiln_tensor *lw = wview ? kiln_mul(logp, wview) : logp;
            kiln_tensor *smooth = kiln_mul(kiln_neg(kiln_sum(lw, KILN_DIMS(1), false)), validf);
            kiln_tensor *sr = NULL;
            if (o->reduction == KILN_REDUCTION_MEAN)
                sr = weighted_mean(kiln_sum(smooth, KILN_ALL_DIMS, false),
                                   kiln_sum(wview ? w_eff : validf, KILN_ALL_DIMS, false));
            else
                sr = reduce(smooth, o->reduction, loss);
            out = kiln_add(kiln_mul_scalar(out, 1 - eps), kiln_mul_scalar(sr, eps / (double)c));
        }
    }
    if (out && unbatched && o->reduction == KILN_REDUCTION_NONE)
        out = kiln_squeeze(out, 0);
    return out;
}

kiln_tensor *kiln_loss_cross_entropy(kiln_tensor *input, kiln_tensor *target, const kiln_loss_ce_opts *opts)
{
    if (!input || !target)
        return NULL;
    kiln_loss_ce_opts o = opts ? *opts : kiln_loss_ce_opts_default();
    LOSS_SCOPED(ce_body("cross_entropy", input, target, &o, true));
}

kiln_tensor *kiln_loss_nll(kiln_tensor *input, kiln_tensor *target, const kiln_loss_ce_opts *opts)
{
    if (!input || !target)
        return NULL;
    kiln_loss_ce_opts o = opts ? *opts : kiln_loss_ce_opts_default();
    if (o.label_smoothing != 0) {
        kiln__error_set("nll_loss: label_smoothing is a cross_entropy option (got %g)", o.label_smoothing);
        return NULL;
    }
    LOSS_SCOPED(ce_body("nll_loss", input, target, &o, false));
}

/* ----------------------------------------------------------------- binary losses */

static int check_pair(const char *loss, kiln_tensor *input, kiln_tensor *target, kiln_reduction r)
{
    if (need_float(loss, "input", input) < 0 || need_float(loss, "target", target) < 0)
        return -1;
    if (!same_shape(input, target))
        return shape_error(loss, "input", input, "target", target, "must have the same shape");
    if ((unsigned)r > KILN_REDUCTION_NONE)
        return bad_reduction(loss, r);
    return 0;
}

/* -(t log x + (1 - t) log(1 - x)), with PyTorch's clamp of both logs at -100 so that
 * x = 0 and x = 1 give finite losses. */
static kiln_tensor *bce_value(kiln_tensor *x, kiln_tensor *t)
{
    kiln_tensor *lx = kiln_clamp(kiln_log(x), -100, INFINITY);
    kiln_tensor *l1x = kiln_clamp(kiln_log1p(kiln_neg(x)), -100, INFINITY);
    return kiln_neg(kiln_add(kiln_mul(t, lx), kiln_mul(kiln_add_scalar(kiln_neg(t), 1), l1x)));
}

/* PyTorch's gradients of the unweighted elementwise loss:
 *     d/dx = (x - t) / max(x (1 - x), 1e-12),   d/dt = log(1 - x) - log(x)
 * the first finite at x = 0 and 1 (0 where x equals t there), the second with the
 * forward's clamped logs (PyTorch leaves them unclamped: +-inf at x = 0 and 1). Half
 * dtypes compute in f32, where 1e-12 does not flush to zero. */
static int bce_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    kiln_tensor *x = n->saved[0], *t = n->saved[1];
    kiln_dtype ct = n->out_dtype == KILN_F64 ? KILN_F64 : KILN_F32;
    kiln_tensor *xf = kiln_cast(x, ct), *tf = kiln_cast(t, ct), *gf = kiln_cast(g, ct);
    if (kiln__ad_needs(n, 0)) {
        kiln_tensor *den = kiln_clamp(kiln_mul(xf, kiln_add_scalar(kiln_neg(xf), 1)), 1e-12, INFINITY);
        gin[0] = kiln_mul(gf, kiln_div(kiln_sub(xf, tf), den));
        if (!gin[0])
            return -1;
    }
    if (kiln__ad_needs(n, 1)) {
        kiln_tensor *lx = kiln_clamp(kiln_log(xf), -100, INFINITY);
        kiln_tensor *l1x = kiln_clamp(kiln_log1p(kiln_neg(xf)), -100, INFINITY);
        gin[1] = kiln_mul(gf, kiln_sub(l1x, lx));
        if (!gin[1])
            return -1;
    }
    return 0;
}

/* Record l = bce_value(x, t), computed with recording off, as one node. */
static kiln_tensor *bce_record(kiln_tensor *l, kiln_tensor *x, kiln_tensor *t)
{
    bool failed;
    kiln_tensor *ins[2] = {x, t};
    kiln__node *n = kiln__ad_record(l, "binary_cross_entropy", bce_backward, 2, ins, &failed);
    if (n)
        failed = kiln__ad_save(n, 0, x) < 0 || kiln__ad_save(n, 1, t) < 0;
    return kiln__ad_fail(l, failed);
}

static kiln_tensor *bce_body(kiln_tensor *x, kiln_tensor *t, kiln_tensor *weight, kiln_reduction r)
{
    const char *loss = "binary_cross_entropy";
    if (check_pair(loss, x, t, r) < 0)
        return NULL;
    if (kiln_tensor_numel(x) > 0) {
        double lo = kiln_item(kiln_min(x, KILN_ALL_DIMS, false));
        double hi = kiln_item(kiln_max(x, KILN_ALL_DIMS, false));
        if (!(lo >= 0 && hi <= 1)) {
            char b[128];
            kiln__error_set("%s: input %s must lie in [0, 1] (found %g .. %g)", loss, kiln__describe(x, b, sizeof b),
                            lo, hi);
            return NULL;
        }
    }
    /* The clamped-log expression is the value only: differentiated, it gives 0 * inf =
     * NaN wherever x is exactly 0 or 1 (a saturated sigmoid), so it is recorded as one
     * node with PyTorch's closed-form backward (bce_backward). */
    bool record = kiln__ad_want(x) || kiln__ad_want(t);
    if (record)
        kiln_no_grad_begin();
    kiln_tensor *l = bce_value(x, t);
    if (record) {
        kiln_no_grad_end();
        if (l)
            l = bce_record(l, x, t);
    }
    if (weight)
        l = kiln_mul(l, weight);
    return reduce(l, r, loss);
}

kiln_tensor *kiln_loss_bce(kiln_tensor *input, kiln_tensor *target, kiln_tensor *weight, kiln_reduction reduction)
{
    if (!input || !target)
        return NULL;
    LOSS_SCOPED(bce_body(input, target, weight, reduction));
}

static kiln_tensor *bce_logits_body(kiln_tensor *x, kiln_tensor *t, kiln_tensor *weight, kiln_tensor *pos_weight,
                                    kiln_reduction r)
{
    const char *loss = "binary_cross_entropy_with_logits";
    if (check_pair(loss, x, t, r) < 0)
        return NULL;
    /* -log(sigmoid(x)) = softplus(-x): finite for any x, and smooth at 0 for autodiff. */
    kiln_tensor *nls = kiln_softplus(kiln_neg(x), 1, 20);
    if (pos_weight)
        nls = kiln_mul(nls, kiln_add_scalar(kiln_mul(kiln_add_scalar(pos_weight, -1), t), 1));
    kiln_tensor *l = kiln_add(kiln_mul(kiln_add_scalar(kiln_neg(t), 1), x), nls);
    if (weight)
        l = kiln_mul(l, weight);
    return reduce(l, r, loss);
}

kiln_tensor *kiln_loss_bce_with_logits(kiln_tensor *input, kiln_tensor *target, kiln_tensor *weight,
                                       kiln_tensor *pos_weight, kiln_reduction reduction)
{
    if (!input || !target)
        return NULL;
    LOSS_SCOPED(bce_logits_body(input, target, weight, pos_weight, reduction));
}

/* --------------------------------------------------------------- regression losses */

kiln_tensor *kiln_loss_mse(kiln_tensor *input, kiln_tensor *target, kiln_reduction reduction)
{
    if (!input || !target)
        return NULL;
    if (check_pair("mse_loss", input, target, reduction) < 0)
        return NULL;
    LOSS_SCOPED(reduce(kiln_square(kiln_sub(input, target)), reduction, "mse_loss"));
}

kiln_tensor *kiln_loss_l1(kiln_tensor *input, kiln_tensor *target, kiln_reduction reduction)
{
    if (!input || !target)
        return NULL;
    if (check_pair("l1_loss", input, target, reduction) < 0)
        return NULL;
    LOSS_SCOPED(reduce(kiln_abs(kiln_sub(input, target)), reduction, "l1_loss"));
}

/* where(|d| < k, 0.5 d² * a, b * (|d| - 0.5 k)): smooth L1 has a = 1/beta, b = 1;
 * Huber has a = 1, b = delta. */
static kiln_tensor *quad_lin(kiln_tensor *input, kiln_tensor *target, double k, double a, double b, kiln_reduction r,
                             const char *loss)
{
    kiln_tensor *d = kiln_sub(input, target);
    kiln_tensor *ad = kiln_abs(d);
    kiln_tensor *quad = kiln_mul_scalar(kiln_square(d), 0.5 * a);
    kiln_tensor *lin = kiln_mul_scalar(kiln_add_scalar(ad, -0.5 * k), b);
    return reduce(kiln_where(kiln_lt(ad, scalar_like(ad, k)), quad, lin), r, loss);
}

kiln_tensor *kiln_loss_smooth_l1(kiln_tensor *input, kiln_tensor *target, double beta, kiln_reduction reduction)
{
    const char *loss = "smooth_l1_loss";
    if (!input || !target)
        return NULL;
    if (check_pair(loss, input, target, reduction) < 0)
        return NULL;
    if (!(beta >= 0)) {
        kiln__error_set("%s: beta must be non-negative (got %g)", loss, beta);
        return NULL;
    }
    if (beta == 0) /* PyTorch's special case: plain L1 */
        LOSS_SCOPED(reduce(kiln_abs(kiln_sub(input, target)), reduction, loss));
    LOSS_SCOPED(quad_lin(input, target, beta, 1 / beta, 1, reduction, loss));
}

kiln_tensor *kiln_loss_huber(kiln_tensor *input, kiln_tensor *target, double delta, kiln_reduction reduction)
{
    const char *loss = "huber_loss";
    if (!input || !target)
        return NULL;
    if (check_pair(loss, input, target, reduction) < 0)
        return NULL;
    if (!(delta > 0)) {
        kiln__error_set("%s: delta must be positive (got %g)", loss, delta);
        return NULL;
    }
    LOSS_SCOPED(quad_lin(input, target, delta, 1, delta, reduction, loss));
}

/* ------------------------------------------------------------------ KL divergence */

static kiln_tensor *kl_body(kiln_tensor *input, kiln_tensor *target, kiln_reduction r, bool log_target)
{
    const char *loss = "kl_div";
    if (check_pair(loss, input, target, r == KILN_REDUCTION_BATCHMEAN ? KILN_REDUCTION_SUM : r) < 0)
        return NULL;
    kiln_tensor *l;
    if (log_target) {
        l = kiln_mul(kiln_exp(target), kiln_sub(target, input));
    } else {
        /* xlogy(t, t): 0 where t is 0; log(1) keeps the unselected lanes finite, so
         * no NaN leaks into gradients through the multiplication. */
        kiln_tensor *zero = kiln_eq(target, scalar_like(target, 0));
        kiln_tensor *safe = kiln_where(zero, scalar_like(target, 1), target);
        l = kiln_sub(kiln_mul(target, kiln_log(safe)), kiln_mul(target, input));
    }
    if (r == KILN_REDUCTION_BATCHMEAN) {
        if (input->ndim < 1) {
            kiln__error_set("kl_div: batchmean needs a batch dim (input is 0-d)");
            return NULL;
        }
        return kiln_mul_scalar(kiln_sum(l, KILN_ALL_DIMS, false), 1.0 / (double)input->shape[0]);
    }
    return reduce(l, r, loss);
}

kiln_tensor *kiln_loss_kl_div(kiln_tensor *input, kiln_tensor *target, kiln_reduction reduction, bool log_target)
{
    if (!input || !target)
        return NULL;
    LOSS_SCOPED(kl_body(input, target, reduction, log_target));
}

/* ---------------------------------------------------------- cosine embedding loss */

static kiln_tensor *cosine_body(kiln_tensor *x1, kiln_tensor *x2, kiln_tensor *y, double margin, kiln_reduction r)
{
    const char *loss = "cosine_embedding_loss";
    if (check_pair(loss, x1, x2, r) < 0)
        return NULL;
    if (x1->ndim < 1 || x1->ndim > 2 || y->ndim != x1->ndim - 1 || (y->ndim == 1 && y->shape[0] != x1->shape[0])) {
        char a[128], b[128];
        kiln__error_set("%s: inputs %s need a target of shape [N] (or [] for 1-d inputs), got %s", loss,
                        kiln__describe(x1, a, sizeof a), kiln__describe(y, b, sizeof b));
        return NULL;
    }
    int dim = x1->ndim - 1;
    const double eps = 1e-12; /* PyTorch's EPSILON: keeps zero vectors finite */
    kiln_tensor *prod = kiln_sum(kiln_mul(x1, x2), KILN_DIMS(dim), false);
    kiln_tensor *m1 = kiln_add_scalar(kiln_sum(kiln_mul(x1, x1), KILN_DIMS(dim), false), eps);
    kiln_tensor *m2 = kiln_add_scalar(kiln_sum(kiln_mul(x2, x2), KILN_DIMS(dim), false), eps);
    kiln_tensor *cosv = kiln_div(prod, kiln_sqrt(kiln_mul(m1, m2)));
    kiln_tensor *zero = kiln_zeros_like(cosv);
    kiln_tensor *pos = kiln_where(kiln_eq(y, scalar_like(y, 1)), kiln_add_scalar(kiln_neg(cosv), 1), zero);
    kiln_tensor *neg = kiln_where(kiln_eq(y, scalar_like(y, -1)), kiln_clamp(kiln_add_scalar(cosv, -margin), 0,
                                                                              INFINITY), zero);
    return reduce(kiln_add(pos, neg), r, loss);
}

kiln_tensor *kiln_loss_cosine_embedding(kiln_tensor *x1, kiln_tensor *x2, kiln_tensor *y, double margin,
                                        kiln_reduction reduction)
{
    if (!x1 || !x2 || !y)
        return NULL;
    LOSS_SCOPED(cosine_body(x1, x2, y, margin, reduction));
}
