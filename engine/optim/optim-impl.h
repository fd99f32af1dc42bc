/*
 * engine/optim/optim-impl.h — the optimizer's private body, shared by the files of
 * engine/optim: the update rules (optim.c), state export and import (optim-state.c),
 * clipping (clip.c) and the autodiff-facing entry points (optim-autograd.c).
 */
#ifndef KILN_OPTIM_IMPL_H
#define KILN_OPTIM_IMPL_H

#include <stdint.h>

#include "kiln/optim.h"

/* Per-parameter state slots; which ones a kind uses is in kiln__optim_slot_name. */
#define KILN_OPTIM_SLOTS 3

typedef struct kiln__optim_pstate {
    kiln_tensor *param;                  /* one reference held */
    char *name;
    kiln_tensor *slot[KILN_OPTIM_SLOTS]; /* NULL until the first update touches it */
    kiln_tensor *accum;                  /* summed gradients while accumulating */
    int64_t step;                        /* updates this parameter has received */
} kiln__optim_pstate;

struct kiln_optim {
    kiln_optim_config cfg;
    int n;
    kiln__optim_pstate *p;
    int64_t steps;        /* updates made */
    int accum_count;      /* calls since the last update (accumulation) */
};

/** Name of slot i for kind ("momentum_buffer", "exp_avg", ...) or NULL when unused. */
const char *kiln__optim_slot_name(kiln_optim_kind kind, int i);
/** Check a config; -1 plus a message naming what is wrong. */
int kiln__optim_check_config(const kiln_optim_config *cfg, const char *op);
/** Write src into dst's own storage (shapes equal; dtype converted). The one place the
 *  optimizer writes in place, so every in-place write goes through one function. */
int kiln__optim_write(kiln_tensor *dst, kiln_tensor *src, const char *op);

#endif /* KILN_OPTIM_IMPL_H */
