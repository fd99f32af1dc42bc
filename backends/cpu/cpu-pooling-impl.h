/*
 * backends/cpu/cpu-pooling-impl.h — the pooling geometry shared by cpu-pooling.c and
 * cpu-adaptive-pool.c.
 */
#ifndef KILN_CPU_POOLING_IMPL_H
#define KILN_CPU_POOLING_IMPL_H

#include <stdint.h>

#include "cpu-impl.h"

/* Planes (N·C), per-dim input and output sizes, kernel, stride, padding and dilation of a
 * pooling over 1-3 spatial dims (unused dims are 1), and the in/out plane sizes. */
typedef struct pgeom {
    int64_t planes;
    int64_t in[3], out[3], k[3], st[3], pad[3], dil[3];
    int64_t isz, osz;
} pgeom;

/* Fill g from the parameters; NULL k/st/pad/dil (adaptive pooling) leave them unset. */
void kiln__cpu_pgeom_init(pgeom *g, int ns, const int64_t *k, const int64_t *st, const int64_t *pad,
                          const int64_t *dil, const kiln_tdesc *x, const kiln_tdesc *y);

#endif /* KILN_CPU_POOLING_IMPL_H */
