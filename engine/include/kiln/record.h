/*
 * kiln/record.h — tensors on disk: the safetensors format.
 *
 *     kiln_safetensors *st = kiln_safetensors_open("model.safetensors");
 *     if (!st) { fprintf(stderr, "%s\n", kiln_error()); return 1; }
 *     kiln_tensor *w = kiln_safetensors_load(st, "fc.weight", dev);
 *     kiln_safetensors_close(st);   // loaded tensors own their data; closing is safe
 *
 *     kiln_tensor *ts[] = {w, b};
 *     const char *names[] = {"fc.weight", "fc.bias"};
 *     kiln_safetensors_save("out.safetensors", 2, names, ts, 0, NULL, NULL);
 *
 * Files are untrusted input. Opening one checks everything before any tensor is read:
 * the header length against the file, the header is a JSON object of entries with a
 * known dtype, a shape of non-negative integers and two offsets inside the data area,
 * shape × dtype size equal to the byte range, no duplicate names, ranges that neither
 * overlap nor leave holes (as the reference implementation requires), and __metadata__
 * holding only strings. Anything else is refused with a message naming the file, the
 * entry and the problem; nothing is ever read out of bounds.
 *
 * Writing goes to a temporary name in the same folder, is fsynced, renamed over the
 * destination and the folder fsynced, so a crash leaves either the old file or the new
 * one, never a torn one.
 */
#ifndef KILN_RECORD_H
#define KILN_RECORD_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/** An opened, validated safetensors file (memory-mapped when opened from a path). */
typedef struct kiln_safetensors kiln_safetensors;

/** Open and validate a file. NULL plus kiln_error() when it cannot be read or is malformed. */
kiln_safetensors *kiln_safetensors_open(const char *path);
/**
 * Validate bytes already in memory (for network payloads and fuzzing). The bytes are
 * not copied: they must outlive the handle.
 */
kiln_safetensors *kiln_safetensors_open_memory(const void *data, size_t len);
void kiln_safetensors_close(kiln_safetensors *st);

/** Number of tensors in the file. */
int kiln_safetensors_count(const kiln_safetensors *st);
/** Name of tensor i (0 <= i < count), in header order; NULL when out of range. */
const char *kiln_safetensors_name(const kiln_safetensors *st, int i);
/** Index of the tensor called name, or -1. */
int kiln_safetensors_find(const kiln_safetensors *st, const char *name);
/**
 * Describe tensor i: its dtype (or -1 when the file's dtype has no kiln equivalent,
 * e.g. I16), rank and shape (shape must hold KILN_MAX_DIMS entries). Returns 0 or -1.
 */
int kiln_safetensors_info(const kiln_safetensors *st, int i, int *dtype, int *ndim, int64_t *shape);
/** The file's dtype string of tensor i ("F32", "I16", ...). */
const char *kiln_safetensors_dtype_string(const kiln_safetensors *st, int i);
/** A copy of the named tensor on dev. NULL plus a message when absent or not loadable. */
kiln_tensor *kiln_safetensors_load(const kiln_safetensors *st, const char *name, kiln_device *dev);
/** The __metadata__ value for key, or NULL. */
const char *kiln_safetensors_metadata(const kiln_safetensors *st, const char *key);
/** Number of __metadata__ entries, and the i-th key. */
int kiln_safetensors_metadata_count(const kiln_safetensors *st);
const char *kiln_safetensors_metadata_key(const kiln_safetensors *st, int i);

/**
 * Write n named tensors (any device, any layout) and nmeta metadata pairs to path,
 * atomically (see above). Names must be unique and non-empty. Returns 0, or a negative
 * code plus a message; on failure the destination is untouched.
 */
int kiln_safetensors_save(const char *path, int n, const char *const *names, kiln_tensor *const *tensors,
                          int nmeta, const char *const *meta_keys, const char *const *meta_values);

#ifdef __cplusplus
}
#endif
#endif /* KILN_RECORD_H */
