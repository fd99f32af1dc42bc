/*
 * engine/rnn-impl.h — the fused recurrent layer (ops-rnn.c), for graph executors.
 */
#ifndef KILN_RNN_IMPL_H
#define KILN_RNN_IMPL_H

#include "backend.h"
#include "kiln/tensor.h"

/*
 * One LSTM or GRU layer (backends/backend.h: kiln_rnn_params, kiln_rnn_operands) through
 * the device's rnn entry. The caller has checked every shape against p; bias, h0, c0 and
 * peep may be NULL, yc is written for an LSTM only. Returns 1 with the outputs set (they
 * belong to the innermost scope, as the public ops' results do), 0 when the entry cannot
 * take the layer (no entry, not f32, operands on several devices, something requires
 * grad: the caller composes the layer from tensor ops), -1 with a message on failure.
 */
int kiln__rnn(const kiln_rnn_params *p, kiln_tensor *x, kiln_tensor *w, kiln_tensor *r, kiln_tensor *bias,
              kiln_tensor *h0, kiln_tensor *c0, kiln_tensor *peep, kiln_tensor *packed, kiln_tensor **y,
              kiln_tensor **yh, kiln_tensor **yc);
/*
 * w and r (shaped as kiln__rnn takes them) in the device's pre-packed form for layers of p's
 * cell, directions, input and hidden sizes, to hand to kiln__rnn as packed while they stay
 * unchanged; NULL when the device has no such form or cannot take the layer (nothing set:
 * the layer runs from w and r), or with a message on failure.
 */
kiln_tensor *kiln__rnn_pack(const kiln_rnn_params *p, kiln_tensor *w, kiln_tensor *r);

#endif /* KILN_RNN_IMPL_H */
