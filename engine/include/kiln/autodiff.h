/*
 * kiln/autodiff.h — reverse-mode automatic differentiation.
 *
 *     kiln_tensor *w = kiln_requires_grad(kiln_rand_normal(...), true);
 *     kiln_scope_begin();
 *     kiln_tensor *loss = kiln_mean(kiln_square(kiln_sub(kiln_matmul(x, w), y)), KILN_ALL_DIMS, false);
 *     kiln_backward(loss, NULL);
 *     kiln_tensor *g = kiln_grad(w);     // accumulated dloss/dw (a new reference, scoped)
 *     ...
 *     kiln_scope_end();                  // the tape and every temporary go back to the pool
 *
 * The tape is recorded by the tensor front end, so it works on every backend. Each op
 * whose inputs require gradients records a node holding what its backward needs; the
 * node is freed as soon as backward has passed through it (or when its output dies
 * without backward ever running).
 *
 * Gradients accumulate across kiln_backward calls until kiln_zero_grad. Only floating
 * dtypes can require gradients. An op with no derivative (comparisons, argmax, integer
 * ops) produces an output that does not require grad; backward through an op kiln has
 * no backward for is an error naming the op.
 *
 * In-place writes. A node keeps the tensors its backward reads (inputs, its output) as
 * aliases of their storage, not copies. Every in-place write the library makes into an
 * existing tensor (kiln_optim_step and _step_grads, kiln_module_load_*,
 * kiln_grads_clip_norm and _value, batch norm's running statistics, a Learner resume) moves a version counter
 * that the storage's views share; backward compares the version of each tensor the graph
 * saved with the one it had when saved, before any gradient moves. A mismatch is an error
 * naming the op, the tensor and both versions ("backward: the tensor f32[2] that mul saved
 * for its backward was modified in place after the forward (saved at version 0, now 1)
 * ..."), and no gradient changes. So a step between a forward and its backward fails
 * rather than giving gradients of a function the forward never computed; the usual order
 * (forward, backward, step) never trips it, and neither does a write to a tensor the graph
 * did not save. Writes the library cannot see are not checked: memory a tensor made with
 * kiln_from_host_memory borrows, written by its owner, and tensors a checkpointed
 * function reaches through its ud rather than its inputs.
 *
 * Threads: the grad mode (kiln_no_grad_begin/end) is per thread. Backward runs on the
 * calling thread; do not run two backward passes over the same graph concurrently.
 */
#ifndef KILN_AUTODIFF_H
#define KILN_AUTODIFF_H

#include <stdbool.h>

#include "kiln/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

KILN_API_BEGIN

/** Make t a leaf that accumulates gradients (on = true) or stop that. Returns t
 *  (no new reference); NULL plus an error for a non-floating dtype or a non-leaf. */
kiln_tensor *kiln_requires_grad(kiln_tensor *t, bool on);
/** True when t is a leaf that requires grad or the output of a recorded op. */
bool kiln_tensor_requires_grad(const kiln_tensor *t);
/** True when t was created by a recorded op (it has a backward node). */
bool kiln_tensor_has_grad_fn(const kiln_tensor *t);

/**
 * Backpropagate from output. grad_output NULL means output is a one-element tensor and
 * its gradient is 1. Leaves (and tensors marked with kiln_retain_grad) accumulate into
 * their .grad. The graph behind output is released as it is used: calling backward a
 * second time through it is an error unless retain_graph is set. A tensor the graph saved
 * and something wrote in place since is an error too (see "In-place writes" above),
 * reported before any .grad changes.
 */
int kiln_backward(kiln_tensor *output, kiln_tensor *grad_output);
int kiln_backward_retain(kiln_tensor *output, kiln_tensor *grad_output, bool retain_graph);

/** The accumulated gradient of t: a new reference, or NULL (without an error) when
 *  none has been computed yet. */
kiln_tensor *kiln_grad(kiln_tensor *t);
/** Replace t's accumulated gradient (NULL clears it). Shapes must match. */
int kiln_set_grad(kiln_tensor *t, kiln_tensor *grad);
/** Forget t's accumulated gradient. */
void kiln_zero_grad(kiln_tensor *t);
/** Keep the gradient of a non-leaf (intermediate) tensor during backward. */
int kiln_retain_grad(kiln_tensor *t);
/** A view of t that shares storage but is cut from the graph. */
kiln_tensor *kiln_detach(kiln_tensor *t);

/** While a no-grad section is open on this thread, ops record nothing. Nest freely. */
void kiln_no_grad_begin(void);
void kiln_no_grad_end(void);
bool kiln_grad_enabled(void);

/**
 * Gradient checkpointing: run fn(ud, inputs) without keeping its intermediates; in
 * backward, run it again with recording on to get them. fn must be deterministic (use
 * explicit kiln_generator states) and return a new reference.
 */
typedef kiln_tensor *(*kiln_checkpoint_fn)(void *ud, int n, kiln_tensor *const *inputs);
kiln_tensor *kiln_checkpoint(kiln_checkpoint_fn fn, void *ud, int n, kiln_tensor *const *inputs);

KILN_API_END

#ifdef __cplusplus
}
#endif
#endif /* KILN_AUTODIFF_H */
