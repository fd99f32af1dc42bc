/*
 * kiln/kiln.h — the whole public API of libkiln in one include.
 *
 * libkiln is a plain C library: engine (tensors, autodiff, nn, training, ONNX),
 * backends and storage. It never starts threads behind a plain call; thread pools
 * belong to devices and are created when a device is opened.
 */
#ifndef KILN_KILN_H
#define KILN_KILN_H

#include "kiln/autodiff.h"
#include "kiln/data.h"
#include "kiln/loss.h"
#include "kiln/nn.h"
#include "kiln/onnx.h"
#include "kiln/optim.h"
#include "kiln/record.h"
#include "kiln/tensor.h"
#include "kiln/train.h"

#ifdef __cplusplus
extern "C" {
#endif

KILN_API_BEGIN

/** The library version, "MAJOR.MINOR.PATCH". */
const char *kiln_version(void);

/** The folder of the autotune cache (autotune.tsv: kernel choices timed once per shape
 *  class and device, reused by later runs; kilnd passes its data directory). NULL or ""
 *  falls back to the environment's KILN_AUTOTUNE_DIR, and with neither the choices last
 *  for the process only. A malformed file is ignored with a line on stderr. Returns 0,
 *  or -1 when the name is too long. */
int kiln_autotune_dir_set(const char *dir);

KILN_API_END

#ifdef __cplusplus
}
#endif
#endif /* KILN_KILN_H */
