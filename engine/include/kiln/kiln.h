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

/** Merge a warmed autotune file (autotune.tsv's format; kilnd takes one shipped beside a
 *  model, in its version folder, when the model loads) into the cache: its entries of
 *  this kiln version that the cache lacks are taken, and written to the cache's folder
 *  when one is set; choices already timed here are kept. A stale file's entries (another
 *  kiln version) are dropped with a line on stderr. Returns the number of entries taken
 *  (0 when the file does not exist), or -1 with the thread error naming the file and
 *  the reason when it cannot be read or is corrupt (then nothing is taken). */
int kiln_autotune_merge_file(const char *path);

KILN_API_END

#ifdef __cplusplus
}
#endif
#endif /* KILN_KILN_H */
