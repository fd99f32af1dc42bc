/*
 * backends/cuda/vendor-hip.h — the CUDA names kiln's kernels use, mapped onto HIP.
 *
 * The kernels are written once, in CUDA. Built with hipcc (KILN_CUDA_HIP defined), this
 * header takes the place of the CUDA runtime headers and spells each CUDA name the
 * kernels and launchers use as its HIP twin, so the same sources compile for AMD GPUs.
 * A name missing here is a compile error in the `hip` build check, never a silent fork.
 * The host side (the C files) has its own mapping, vendor-hip-host.h, since it is plain C
 * built by any C compiler.
 *
 * Kernels avoid warp-size assumptions (AMD wavefronts are 64 wide): block reductions go
 * through shared memory, never through 32-lane shuffles.
 */
#ifndef KILN_CUDA_VENDOR_HIP_H
#define KILN_CUDA_VENDOR_HIP_H

#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>

/* runtime types and status */
#define cudaStream_t hipStream_t
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorInvalidValue hipErrorInvalidValue
#define cudaErrorMemoryAllocation hipErrorOutOfMemory
#define cudaGetLastError hipGetLastError
#define cudaPeekAtLastError hipPeekAtLastError
#define cudaGetErrorString hipGetErrorString
#define cudaGetErrorName hipGetErrorName

/* runtime calls the launchers make */
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaFuncSetAttribute hipFuncSetAttribute

/* half precision: the kernels keep f16 as raw 16-bit words and convert through these */
#define KCU_HALF __half
/* __ushort_as_half, __half_as_ushort, __half2float and __float2half_rn are spelled the
 * same in HIP's amd_hip_fp16.h. */

#endif /* KILN_CUDA_VENDOR_HIP_H */
