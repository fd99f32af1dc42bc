/*
 * backends/cuda/cuda-fused.h — the cuda backend's fused_run: a kiln_fused_program
 * (backends/fused-program.h) generated as CUDA C, compiled to PTX with NVRTC, loaded with
 * cudaLibraryLoadData and cached per device by a hash of the program's shape-independent
 * key (kiln__fused_codegen_key), so a group of one signature is compiled once per process;
 * the PTX is also kept on disk, so a later process skips NVRTC.
 */
#ifndef KILN_CUDA_FUSED_H
#define KILN_CUDA_FUSED_H

#include <stdbool.h>

#include "fused-program.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The CUDA C source of the program's kernel, named `name` (a C identifier): malloc'd, or
 *  NULL with KILN_ENOTSUP in *why when the generator does not write this program (no
 *  message), or NULL with KILN_ENOMEM / KILN_EINVAL (a bad name) and the thread's error.
 *  The source depends only on the program's key: two programs with one key (shapes,
 *  strides, buffers and parameters aside) get the same text. */
char *kiln__cuda_fused_source(const kiln_fused_program *p, const char *name, int *why);

/** The PTX of p's kernel `name` (its key text in key) for compute capability
 *  major.minor: read from the disk cache (kiln__fused_cache_dir, file
 *  cuda-fused-<hash of the source>-<major><minor>.ptx, the key at its head) when there,
 *  else compiled with NVRTC and written there (*from_disk says which). malloc'd, or NULL
 *  with *rc: KILN_ENOTSUP (no message) for a program the generator does not write, or
 *  another code with the thread's error. */
char *kiln__cuda_fused_ptx(const kiln_fused_program *p, const char *key, const char *name, int major, int minor,
                           bool *from_disk, int *rc);

/** The fused_run entry (ctx: a kiln_cuda_queue). KILN_ENOTSUP without a message for a
 *  program the generator does not write; the fusion layer then replays the group. */
int kiln__cuda_fused_run(void *ctx, const kiln_fused_program *p);

/** Unloads every cached kernel of the device (at close; ctx: a kiln_cuda_device). */
void kiln__cuda_fused_fini(void *dev);

#ifdef __cplusplus
}
#endif
#endif /* KILN_CUDA_FUSED_H */
