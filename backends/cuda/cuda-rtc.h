/*
 * backends/cuda/cuda-rtc.h — kernels generated at run time: CUDA C source written by
 * kiln for one fused chain of elementwise ops, compiled to PTX by NVRTC.
 *
 * The chain form is what a fusion pass hands a GPU backend: several unary ops over one
 * f32 tensor become one kernel, one read and one write per element instead of one per
 * op. NVRTC is a compiler library and needs no GPU, so source generation and compilation
 * are tested on any machine with the toolkit (tests/cuda/test-cuda-rtc.c); loading the
 * PTX (cuModuleLoadData) and launching it need a device.
 */
#ifndef KILN_CUDA_RTC_H
#define KILN_CUDA_RTC_H

#include <stddef.h>

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The CUDA C source of `extern "C" __global__ void <name>(float *out, const float *in,
 *  long long n)` applying ops[0], then ops[1], ... to each element (alpha/beta per op
 *  where the op takes them, as kiln_unary_op documents). malloc'd; NULL + the thread's
 *  error for an op the generator does not know, a bad name or no ops. */
char *kiln__cuda_codegen_unary_chain(const char *name, const kiln_unary_op *ops, const double *alpha,
                                     const double *beta, int nops);

/** Compiles source to PTX for compute capability major.minor (virtual architecture
 *  compute_XY): 0 with *ptx malloc'd (its size in *ptx_len when given), or a negative code
 *  with the thread's error quoting NVRTC's log. */
int kiln__cuda_rtc_compile(const char *source, const char *name, int major, int minor, char **ptx,
                           size_t *ptx_len);

/** The HIP build's twin of kiln__cuda_rtc_compile: compiles source with hipRTC to a code
 *  object for the gfx architecture arch (a device's gcnArchName, e.g.
 *  "gfx90a:sramecc+:xnack-"): 0 with *code malloc'd and its size in *code_len (when given),
 *  or a negative code with the thread's error quoting hipRTC's log. */
int kiln__cuda_rtc_compile_gfx(const char *source, const char *name, const char *arch, char **code,
                               size_t *code_len);

#ifdef __cplusplus
}
#endif
#endif /* KILN_CUDA_RTC_H */
