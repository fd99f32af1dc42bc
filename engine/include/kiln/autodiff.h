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
 * second time through it is an error unless retain_graph is set.
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
