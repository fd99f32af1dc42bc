/*
 * kiln/optim.h — optimizers, gradient clipping and accumulation, learning-rate schedulers.
 *
 *     kiln_tensor *params[] = {w1, b1, w2, b2};            // leaves with requires_grad
 *     const char *names[] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
 *     kiln_optim_config cfg = kiln_optim_config_default(KILN_OPTIM_ADAMW);
 *     cfg.lr = 3e-4;
 *     kiln_optim *opt = kiln_optim_create(&cfg, 4, params, names);
 *     kiln_sched_config sc = kiln_sched_config_default(KILN_SCHED_COSINE);
 *     sc.t_max = epochs;
 *     kiln_sched *sched = kiln_sched_create(&sc, opt);    // drives opt's lr
 *     for (...) {
 *         kiln_scope_begin();
 *         kiln_backward(loss_of_a_batch(), NULL);
 *         kiln_optim_clip_grad_norm(opt, 1.0, 2.0);       // optional; returns the norm
 *         kiln_optim_step(opt);                           // reads kiln_grad(p), updates p
 *         kiln_optim_zero_grad(opt);
 *         kiln_scope_end();
 *         kiln_sched_step(sched);                         // once per epoch (or per step)
 *     }
 *     kiln_sched_free(sched);
 *     kiln_optim_free(opt);
 *
 * Update rules are PyTorch's (torch.optim, the default single-tensor path) written with
 * the tensor ops, so they run on every backend; they run inside a no-grad section and
 * write the new values into the parameters' own storage, so every holder of a
 * parameter sees the update. kiln_optim_step_grads takes the gradients explicitly,
 * for callers that compute them some other way (and for tests).
 *
 * A parameter whose gradient is NULL is skipped, state and all, as PyTorch skips a
 * parameter whose .grad is None.
 *
 * Checkpoints: kiln_optim_state_export gives the per-parameter state as named tensors
 * ("<param name>.<slot>", e.g. "fc1.weight.exp_avg") plus a JSON document holding the
 * hyperparameters and step counts; kiln_optim_state_import restores it exactly, so a run
 * restored mid-way continues bit for bit as the uninterrupted one. kiln_optim_state_save
 * and _load put both into one safetensors file (the JSON in its metadata).
 *
 * Threads: an optimizer or scheduler is used by one thread at a time.
 */
#ifndef KILN_OPTIM_H
#define KILN_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

KILN_API_BEGIN

/* ------------------------------------------------------------------- optimizers */

typedef enum kiln_optim_kind {
    KILN_OPTIM_SGD = 0,
    KILN_OPTIM_ADAM,
    KILN_OPTIM_ADAMW,
    KILN_OPTIM_RMSPROP,
    KILN_OPTIM_ADAGRAD,
    KILN_OPTIM_KIND_COUNT
} kiln_optim_kind;

/** "sgd", "adam", "adamw", "rmsprop", "adagrad"; "?" otherwise. */
const char *kiln_optim_kind_name(kiln_optim_kind kind);
/** Parse a name above; -1 when unknown. */
int kiln_optim_kind_from_name(const char *name);

/** Hyperparameters; fields that do not apply to the kind are ignored. Start from
 *  kiln_optim_config_default(kind), which holds PyTorch's defaults for that kind. */
typedef struct kiln_optim_config {
    kiln_optim_kind kind;
    double lr;
    double weight_decay;      /* L2 added to the gradient; AdamW: decoupled decay */
    double momentum;          /* SGD, RMSprop */
    double dampening;         /* SGD */
    bool nesterov;            /* SGD (needs momentum > 0 and dampening 0) */
    double beta1, beta2;      /* Adam, AdamW */
    double eps;               /* Adam(W) 1e-8, RMSprop 1e-8, Adagrad 1e-10 */
    bool amsgrad;             /* Adam, AdamW */
    double alpha;             /* RMSprop smoothing constant (0.99) */
    bool centered;            /* RMSprop */
    double lr_decay;          /* Adagrad */
    double initial_accumulator_value; /* Adagrad */
    bool maximize;            /* ascend instead of descend */
    /** Gradient accumulation: the update happens on every accumulate_steps-th call of
     *  step, with the mean of the gradients given since the last update. 0 or 1: every call. */
    int accumulate_steps;
} kiln_optim_config;

kiln_optim_config kiln_optim_config_default(kiln_optim_kind kind);

typedef struct kiln_optim kiln_optim;

/**
 * An optimizer over n >= 1 parameters (floating leaf tensors, any device; the optimizer
 * holds a reference to each). names may be NULL ("param.<i>" is used) or n unique names,
 * which key the exported state. NULL plus a message for a bad config or parameter list:
 * an empty one (n = 0), a NULL or repeated parameter, a non-floating one, or a non-leaf
 * (the output of a recorded op: "can't optimize a non-leaf tensor", naming it).
 */
kiln_optim *kiln_optim_create(const kiln_optim_config *cfg, int n, kiln_tensor *const *params,
                              const char *const *names);
typedef struct kiln_module kiln_module; /* kiln/nn.h */
/** An optimizer over every parameter of a module tree (kiln_module_parameters: frozen
 *  ones included, as model.parameters(); they get no gradient and are skipped), keyed
 *  by their dotted names; a module with no parameters at all is refused, as n = 0 is.
 *  The optimizer holds the tensors listed now: create it after any kiln_module_to_device
 *  or other map that replaces them. Loading weights (kiln_module_load_*) writes into
 *  those tensors, so it may come before or after. */
kiln_optim *kiln_optim_create_module(const kiln_optim_config *cfg, kiln_module *m);
void kiln_optim_free(kiln_optim *opt);

/**
 * One update with explicit gradients: grads[i] (same shape as params[i], or NULL to
 * skip it). Returns 1 when the parameters were updated, 0 when none was: the gradients
 * were only accumulated (accumulate_steps > 1), or no parameter had a gradient (every
 * grads[i] NULL, or nothing accumulated over the window), which changes no parameter and
 * no state and is not counted by kiln_optim_steps. Negative plus a message on error
 * (nothing is changed then).
 */
int kiln_optim_step_grads(kiln_optim *opt, kiln_tensor *const *grads);
/** kiln_optim_step_grads with each parameter's accumulated kiln_grad(), with its return
 *  values (0 when no parameter has a gradient, e.g. before any backward). With
 *  accumulate_steps > 1 the gradients are taken into the optimizer's buffers, so call
 *  kiln_optim_zero_grad after every step (as usual). A parameter that nothing but the
 *  optimizer holds any more (its module replaced it: kiln_module_to_device or
 *  kiln_module_map after the optimizer was created) is an error naming it, nothing
 *  changed, rather than an update no model would see. */
int kiln_optim_step(kiln_optim *opt);
/** kiln_zero_grad on every parameter. */
void kiln_optim_zero_grad(kiln_optim *opt);

double kiln_optim_lr(const kiln_optim *opt);
/** Set the lr: 0, or -1 plus a message, nothing changed, for a NaN, infinite or negative
 *  lr (one step with such an lr would write NaN into every parameter). */
int kiln_optim_set_lr(kiln_optim *opt, double lr);
/** The current config (lr and momentum as schedulers last set them). */
kiln_optim_config kiln_optim_get_config(const kiln_optim *opt);
/** SGD/RMSprop momentum or Adam beta1, whichever the kind uses (one-cycle cycles it).
 *  0, or -1 plus a message, nothing changed, for a value kiln_optim_create would refuse
 *  (NaN, infinite, negative; beta1 >= 1). */
int kiln_optim_set_momentum(kiln_optim *opt, double momentum);
/** Number of updates made: the steps that returned 1 (accumulation calls that did not
 *  update, and steps where no parameter had a gradient, do not count). */
int64_t kiln_optim_steps(const kiln_optim *opt);
int kiln_optim_param_count(const kiln_optim *opt);
kiln_tensor *kiln_optim_param(const kiln_optim *opt, int i); /* borrowed */
const char *kiln_optim_param_name(const kiln_optim *opt, int i);

/* --------------------------------------------------------------- state export */

/** Exported optimizer state; free with kiln_optim_state_free. */
typedef struct kiln_optim_state {
    int n;                    /* named tensors */
    char **names;
    kiln_tensor **tensors;    /* owned references (copies, not views of the live state) */
    char *json;               /* {"format":"kiln-optim-1","config":{...},"steps":...} */
} kiln_optim_state;

int kiln_optim_state_export(const kiln_optim *opt, kiln_optim_state *out);
/** Restore hyperparameters, step counts and state tensors (copied to each parameter's
 *  device and dtype). The kind and the parameter names and shapes must match (the shapes
 *  as the JSON records them, so a state with no tensors yet is checked too); otherwise -1
 *  plus a message naming the parameter (and both shapes), and nothing is changed. */
int kiln_optim_state_import(kiln_optim *opt, int n, const char *const *names, kiln_tensor *const *tensors,
                            const char *json);
void kiln_optim_state_free(kiln_optim_state *st);
/** Export into one safetensors file (atomic write), JSON under metadata "kiln.optim". */
int kiln_optim_state_save(const kiln_optim *opt, const char *path);
int kiln_optim_state_load(kiln_optim *opt, const char *path);

/* ------------------------------------------------------------ gradient clipping */

/**
 * Scale the gradients so that their global norm_type-norm (2 for Euclidean, INFINITY
 * for max-abs) is at most max_norm, as torch.nn.utils.clip_grad_norm_ does
 * (coefficient max_norm / (norm + 1e-6), applied only when below 1). Writes into the
 * given gradient tensors in place; NULL entries are skipped. Returns the norm before
 * clipping, or a negative value plus a message on error.
 */
double kiln_grads_clip_norm(int n, kiln_tensor *const *grads, double max_norm, double norm_type);
/** Clamp every gradient element to [-clip, clip], in place. 0 or negative on error. */
int kiln_grads_clip_value(int n, kiln_tensor *const *grads, double clip);
/** The same on the optimizer's parameters' kiln_grad(). */
double kiln_optim_clip_grad_norm(kiln_optim *opt, double max_norm, double norm_type);
int kiln_optim_clip_grad_value(kiln_optim *opt, double clip);

/* ------------------------------------------------------------------ schedulers */

typedef enum kiln_sched_kind {
    KILN_SCHED_CONSTANT = 0,  /* lr * factor for total_iters steps, then lr (ConstantLR) */
    KILN_SCHED_LINEAR,        /* start_factor -> end_factor over total_iters (LinearLR) */
    KILN_SCHED_STEP,          /* lr * gamma^(t / step_size) */
    KILN_SCHED_MULTISTEP,     /* lr * gamma^(milestones passed) */
    KILN_SCHED_EXPONENTIAL,   /* lr * gamma^t */
    KILN_SCHED_COSINE,        /* CosineAnnealingLR(t_max, eta_min) */
    KILN_SCHED_COSINE_RESTARTS, /* CosineAnnealingWarmRestarts(t_0, t_mult, eta_min) */
    KILN_SCHED_ONE_CYCLE,     /* OneCycleLR, two phases */
    KILN_SCHED_NOAM,          /* factor * d_model^-0.5 * min(t^-0.5, t * warmup^-1.5) */
    KILN_SCHED_KIND_COUNT
} kiln_sched_kind;

#define KILN_SCHED_MAX_MILESTONES 16

/** Scheduler hyperparameters; fields that do not apply to the kind are ignored. Start from
 *  kiln_sched_config_default(kind), whose values are shown in parentheses below: PyTorch's
 *  defaults where PyTorch has one, the Transformer paper's for NOAM (d_model 512, warm-up
 *  4000). Where PyTorch requires the value (t_max, step_size, total_steps, t_0) the
 *  default is 1, which is rarely what a run wants: set it. */
typedef struct kiln_sched_config {
    kiln_sched_kind kind;
    double factor;            /* CONSTANT (1/3); NOAM (1) */
    int64_t total_iters;      /* CONSTANT (5), LINEAR (5) */
    double start_factor, end_factor; /* LINEAR (1/3, 1) */
    double gamma;                    /* STEP, MULTISTEP, EXPONENTIAL (0.1) */
    int64_t step_size;               /* STEP (1) */
    int nmilestones;          /* MULTISTEP: increasing */
    int64_t milestones[KILN_SCHED_MAX_MILESTONES];
    int64_t t_max;            /* COSINE (1) */
    double eta_min;           /* COSINE, COSINE_RESTARTS (0) */
    int64_t t_0, t_mult;      /* COSINE_RESTARTS (1, 1) */
    /* ONE_CYCLE: the base lr is ignored; max_lr is the peak. */
    double max_lr;            /* 0.1 */
    int64_t total_steps;      /* 1 */
    double pct_start;         /* 0.3 */
    bool anneal_linear;       /* false: cosine */
    double div_factor;        /* 25: initial lr = max_lr / div_factor */
    double final_div_factor;  /* 1e4: min lr = initial lr / final_div_factor */
    bool cycle_momentum;      /* true: momentum (or beta1) from max_momentum down and back */
    double base_momentum, max_momentum; /* 0.85, 0.95 */
    int64_t d_model;                    /* NOAM (512) */
    int64_t noam_warmup;                /* NOAM (4000) */
    /** Linear warm-up before any kind: for t < warmup_steps the lr is base * (ws +
     *  (1 - ws) t / warmup_steps) with ws = warmup_start_factor, where base is the base
     *  lr (ONE_CYCLE: its initial lr, max_lr / div_factor, with max_momentum held); from
     *  then on the schedule runs with its own step count t - warmup_steps (PyTorch's
     *  SequentialLR of LinearLR and the schedule). 0: none (the default). */
    int64_t warmup_steps;
    double warmup_start_factor; /* 1/3 */
} kiln_sched_config;

kiln_sched_config kiln_sched_config_default(kiln_sched_kind kind);
const char *kiln_sched_kind_name(kiln_sched_kind kind);

/** The lr at step t (0 = before the first kiln_sched_step) from base_lr, in closed form.
 *  NAN plus a message for an invalid config, a step past ONE_CYCLE's total_steps, or any
 *  step whose lr is not a finite number >= 0 (an exponential overflowing, say). */
double kiln_sched_lr_at(const kiln_sched_config *cfg, double base_lr, int64_t t);
/** The momentum one-cycle sets at step t, max_momentum during a warm-up (NAN unless
 *  ONE_CYCLE with cycle_momentum). */
double kiln_sched_momentum_at(const kiln_sched_config *cfg, int64_t t);

typedef struct kiln_sched kiln_sched;

/**
 * A scheduler driving opt's lr (opt may be NULL: then base lr 1 and only kiln_sched_lr
 * reports it). The base lr is opt's lr at creation; creation sets opt's lr to the step-0
 * value, as PyTorch's constructors do.
 */
kiln_sched *kiln_sched_create(const kiln_sched_config *cfg, kiln_optim *opt);
/** Same, with an explicit base lr. */
kiln_sched *kiln_sched_create_base(const kiln_sched_config *cfg, kiln_optim *opt, double base_lr);
void kiln_sched_free(kiln_sched *s);
/** Advance one step, set the optimizer's lr (and momentum), return the new lr. A step
 *  whose lr kiln_sched_lr_at refuses (ONE_CYCLE past total_steps, as PyTorch raises
 *  there) returns NAN plus a message and changes nothing: not the step, not the lr. */
double kiln_sched_step(kiln_sched *s);
double kiln_sched_lr(const kiln_sched *s);
int64_t kiln_sched_last_step(const kiln_sched *s);
/** {"format":"kiln-sched-1","kind":"cosine","step":12,"base_lr":0.1}; free() it. */
char *kiln_sched_state_export(const kiln_sched *s);
/** Restore the step (and base lr) and re-apply the lr to the optimizer. 0, or -1 plus a
 *  message and nothing changed (a state of another kind, or whose step has no valid lr). */
int kiln_sched_state_import(kiln_sched *s, const char *json);
/** Whether kiln_sched_state_import(s, json) would succeed, changing nothing: 0 or -1 plus
 *  the message it would give (for callers that restore several objects all or nothing). */
int kiln_sched_state_check(const kiln_sched *s, const char *json);

KILN_API_END

#ifdef __cplusplus
}
#endif
#endif /* KILN_OPTIM_H */
