/*
 * backends/cuda/vendor-hip-host.h — the CUDA runtime names the backend's host side (the C
 * files) uses, mapped onto the HIP runtime, as vendor-hip.h does for the kernels.
 *
 * A HIP build (KILN_CUDA_HIP=1, __HIP_PLATFORM_AMD__) includes this header where a CUDA
 * build includes <cuda_runtime.h>; the C files keep their CUDA spelling. Only the C API
 * (hip_runtime_api.h) is used, so any C compiler builds the host side. A name missing here
 * is a compile error in the `hip` build check. The few calls whose HIP form takes other
 * arguments are mapped as function-like macros below; what differs in kind (the fused
 * kernels' module API, the pointer attribute field, the sticky error list) stays in the
 * file that uses it, under KILN_CUDA_HIP.
 */
#ifndef KILN_CUDA_VENDOR_HIP_HOST_H
#define KILN_CUDA_VENDOR_HIP_HOST_H

#include <hip/hip_runtime_api.h>
#include <hip/hip_version.h>

/* types */
#define cudaError_t hipError_t
#define cudaStream_t hipStream_t
#define cudaEvent_t hipEvent_t
#define cudaGraph_t hipGraph_t
#define cudaGraphExec_t hipGraphExec_t
#define cudaDeviceProp hipDeviceProp_t              /* used as struct cudaDeviceProp */
#define cudaPointerAttributes hipPointerAttribute_t /* used as struct cudaPointerAttributes */
#define cudaStreamCaptureMode hipStreamCaptureMode  /* used as enum cudaStreamCaptureMode */

/* status */
#define cudaSuccess hipSuccess
#define cudaErrorMemoryAllocation hipErrorOutOfMemory
#define cudaErrorNotReady hipErrorNotReady
#define cudaErrorIllegalAddress hipErrorIllegalAddress
#define cudaErrorLaunchFailure hipErrorLaunchFailure
#define cudaErrorAssert hipErrorAssert
#define cudaErrorLaunchTimeout hipErrorLaunchTimeOut
#define cudaErrorECCUncorrectable hipErrorECCNotCorrectable
#define cudaErrorContextIsDestroyed hipErrorContextIsDestroyed
#define cudaErrorCudartUnloading hipErrorDeinitialized
#define cudaGetLastError hipGetLastError
#define cudaPeekAtLastError hipPeekAtLastError
#define cudaGetErrorString hipGetErrorString
#define cudaGetErrorName hipGetErrorName

/* devices */
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaDriverGetVersion hipDriverGetVersion
#define cudaRuntimeGetVersion hipRuntimeGetVersion
#define cudaSetDevice hipSetDevice
#define cudaDeviceSynchronize hipDeviceSynchronize

/* memory */
#define cudaMalloc hipMalloc
#define cudaFree hipFree
/* cudaHostAlloc and cudaFreeHost: HIP's twins of those names are deprecated for these */
#define cudaHostAlloc hipHostMalloc
#define cudaHostAllocPortable hipHostMallocPortable
#define cudaFreeHost hipHostFree
#define cudaMemcpy hipMemcpy
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaPointerGetAttributes hipPointerGetAttributes
#define cudaMemoryTypeHost hipMemoryTypeHost

/* streams and events */
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaStreamWaitEvent hipStreamWaitEvent
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaEventCreate hipEventCreate
#define cudaEventDestroy hipEventDestroy
#define cudaEventElapsedTime hipEventElapsedTime
#define cudaEventRecord hipEventRecord
#define cudaEventSynchronize hipEventSynchronize
#define cudaEventQuery hipEventQuery

/* graphs (stream capture) */
#define cudaStreamBeginCapture hipStreamBeginCapture
#define cudaStreamEndCapture hipStreamEndCapture
#define cudaStreamCaptureModeRelaxed hipStreamCaptureModeRelaxed
#define cudaStreamCaptureModeThreadLocal hipStreamCaptureModeThreadLocal
#define cudaThreadExchangeStreamCaptureMode hipThreadExchangeStreamCaptureMode
#define cudaGraphDestroy hipGraphDestroy
#define cudaGraphExecDestroy hipGraphExecDestroy
#define cudaGraphLaunch hipGraphLaunch
/* CUDA 12's three-argument form (flags, always 0 here) against HIP's older five-argument
 * one, whose error node and log the backend does not read */
#define cudaGraphInstantiate(exec, graph, flags) hipGraphInstantiate((exec), (graph), NULL, NULL, 0)

#endif /* KILN_CUDA_VENDOR_HIP_HOST_H */
