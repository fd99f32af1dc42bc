/*
 * bench/engine/bench-resnet.h — ResNet-50 built with the C API, for the fusion bench.
 */
#ifndef KILN_BENCH_RESNET_H
#define KILN_BENCH_RESNET_H

#include <stdint.h>

#include "kiln/nn.h"
#include "kiln/tensor.h"

/** ResNet-50 for [N, 3, H, W] inputs with `classes` outputs, weights drawn from g (the
 *  layers' default initialisation), batch norms with momentum 1; NULL on failure. */
kiln_module *bench_resnet50(kiln_device *dev, kiln_generator *g, int64_t classes);

/** One training-mode forward of batch without gradients, so each batch norm's running
 *  statistics become that batch's, then eval mode; 0, or -1 with kiln_error(). */
int bench_resnet_calibrate(kiln_module *net, kiln_tensor *batch);

#endif
