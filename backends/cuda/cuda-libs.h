/*
 * backends/cuda/cuda-libs.h — cuBLASLt, cuDNN and NVRTC, loaded with dlopen when a cuda
 * device first opens (NVRTC when a kernel is first generated) instead of linked into
 * libkiln.
 *
 * Linked, they cost every process that links libkiln their loading time (about 80 ms),
 * GPU or not, and libkiln failed to load at all on a machine without them. The CUDA
 * runtime is linked statically (it finds the driver itself at run time), so libkiln has
 * no CUDA library among its dependencies. A missing library makes the open fail with a
 * message naming it.
 *
 * The files that call these libraries include this header after the libraries' own: each
 * function the backend uses is listed below once, with a pointer of its exact type in a
 * table, and its name is redirected to that pointer, so the call sites read as plain
 * calls. The tables are written once, under a lock, before the first call can be made
 * (kiln__cuda_libs_load), and only read afterwards.
 *
 * A HIP build (KILN_CUDA_HIP) loads hipBLASLt, MIOpen and hipRTC the same way, into the
 * same three tables (KILN_CUDA_CUDNN then says whether MIOpen is used); their declarations
 * come from vendor-hip-libs.h.
 */
#ifndef KILN_CUDA_LIBS_H
#define KILN_CUDA_LIBS_H

#if KILN_CUDA_HIP
/* the HIP build's tables name hipBLASLt, MIOpen and hipRTC (vendor-hip-libs.h); the
 * shared code's cuBLASLt and NVRTC spellings reach them through that header's macros */
#include "vendor-hip-libs.h"

#define KILN_CUDA_LT_FNS(X)                                                                                       \
    X(hipblasLtCreate)                                                                                            \
    X(hipblasLtDestroy)                                                                                           \
    X(hipblasLtMatmul)                                                                                            \
    X(hipblasLtMatmulAlgoGetHeuristic)                                                                            \
    X(hipblasLtMatmulDescCreate)                                                                                  \
    X(hipblasLtMatmulDescDestroy)                                                                                 \
    X(hipblasLtMatmulDescSetAttribute)                                                                            \
    X(hipblasLtMatmulPreferenceCreate)                                                                            \
    X(hipblasLtMatmulPreferenceDestroy)                                                                           \
    X(hipblasLtMatmulPreferenceSetAttribute)                                                                      \
    X(hipblasLtMatrixLayoutCreate)                                                                                \
    X(hipblasLtMatrixLayoutDestroy)                                                                               \
    X(hipblasLtMatrixLayoutSetAttribute)

#define KILN_CUDA_NVRTC_FNS(X)                                                                                    \
    X(hiprtcCompileProgram)                                                                                       \
    X(hiprtcCreateProgram)                                                                                        \
    X(hiprtcDestroyProgram)                                                                                       \
    X(hiprtcGetErrorString)                                                                                       \
    X(hiprtcGetCode)                                                                                              \
    X(hiprtcGetCodeSize)                                                                                          \
    X(hiprtcGetProgramLog)                                                                                        \
    X(hiprtcGetProgramLogSize)

#define KILN_CUDA_DNN_FNS(X)                                                                                      \
    X(miopenConvolutionBackwardData)                                                                              \
    X(miopenConvolutionBackwardDataGetWorkSpaceSize)                                                              \
    X(miopenConvolutionBackwardWeights)                                                                           \
    X(miopenConvolutionBackwardWeightsGetWorkSpaceSize)                                                           \
    X(miopenConvolutionForward)                                                                                   \
    X(miopenConvolutionForwardGetWorkSpaceSize)                                                                   \
    X(miopenCreate)                                                                                               \
    X(miopenCreateConvolutionDescriptor)                                                                          \
    X(miopenCreateTensorDescriptor)                                                                               \
    X(miopenDestroy)                                                                                              \
    X(miopenDestroyConvolutionDescriptor)                                                                         \
    X(miopenDestroyTensorDescriptor)                                                                              \
    X(miopenFindConvolutionBackwardDataAlgorithm)                                                                 \
    X(miopenFindConvolutionBackwardWeightsAlgorithm)                                                              \
    X(miopenFindConvolutionForwardAlgorithm)                                                                      \
    X(miopenGetErrorString)                                                                                       \
    X(miopenInitConvolutionNdDescriptor)                                                                          \
    X(miopenSetConvolutionGroupCount)                                                                             \
    X(miopenSetStream)                                                                                            \
    X(miopenSetTensorDescriptor)

#else
#include <cublasLt.h>
#include <nvrtc.h>
#if KILN_CUDA_CUDNN
#include <cudnn.h>
#endif

#define KILN_CUDA_LT_FNS(X)                                                                                       \
    X(cublasLtCreate)                                                                                             \
    X(cublasLtDestroy)                                                                                            \
    X(cublasLtGetStatusString)                                                                                    \
    X(cublasLtMatmul)                                                                                             \
    X(cublasLtMatmulAlgoGetHeuristic)                                                                             \
    X(cublasLtMatmulDescCreate)                                                                                   \
    X(cublasLtMatmulDescDestroy)                                                                                  \
    X(cublasLtMatmulDescSetAttribute)                                                                             \
    X(cublasLtMatmulPreferenceCreate)                                                                             \
    X(cublasLtMatmulPreferenceDestroy)                                                                            \
    X(cublasLtMatmulPreferenceSetAttribute)                                                                       \
    X(cublasLtMatrixLayoutCreate)                                                                                 \
    X(cublasLtMatrixLayoutDestroy)                                                                                \
    X(cublasLtMatrixLayoutSetAttribute)

#define KILN_CUDA_NVRTC_FNS(X)                                                                                    \
    X(nvrtcCompileProgram)                                                                                        \
    X(nvrtcCreateProgram)                                                                                         \
    X(nvrtcDestroyProgram)                                                                                        \
    X(nvrtcGetErrorString)                                                                                        \
    X(nvrtcGetPTX)                                                                                                \
    X(nvrtcGetPTXSize)                                                                                            \
    X(nvrtcGetProgramLog)                                                                                         \
    X(nvrtcGetProgramLogSize)

#define KILN_CUDA_DNN_FNS(X)                                                                                      \
    X(cudnnConvolutionBackwardData)                                                                               \
    X(cudnnConvolutionBackwardFilter)                                                                             \
    X(cudnnConvolutionForward)                                                                                    \
    X(cudnnCreate)                                                                                                \
    X(cudnnCreateConvolutionDescriptor)                                                                           \
    X(cudnnCreateFilterDescriptor)                                                                                \
    X(cudnnCreateTensorDescriptor)                                                                                \
    X(cudnnDestroy)                                                                                               \
    X(cudnnDestroyConvolutionDescriptor)                                                                          \
    X(cudnnDestroyFilterDescriptor)                                                                               \
    X(cudnnDestroyTensorDescriptor)                                                                               \
    X(cudnnFindConvolutionBackwardDataAlgorithmEx)                                                                \
    X(cudnnFindConvolutionBackwardFilterAlgorithmEx)                                                              \
    X(cudnnFindConvolutionForwardAlgorithmEx)                                                                     \
    X(cudnnGetConvolutionBackwardDataAlgorithm_v7)                                                                \
    X(cudnnGetConvolutionBackwardFilterAlgorithm_v7)                                                              \
    X(cudnnGetConvolutionForwardAlgorithm_v7)                                                                     \
    X(cudnnGetConvolutionForwardWorkspaceSize)                                                                    \
    X(cudnnGetConvolutionBackwardDataWorkspaceSize)                                                               \
    X(cudnnGetConvolutionBackwardFilterWorkspaceSize)                                                             \
    X(cudnnGetVersion)                                                                                            \
    X(cudnnGetErrorString)                                                                                        \
    X(cudnnSetConvolutionGroupCount)                                                                              \
    X(cudnnSetConvolutionMathType)                                                                                \
    X(cudnnSetConvolutionNdDescriptor)                                                                            \
    X(cudnnSetFilterNdDescriptor)                                                                                 \
    X(cudnnSetStream)                                                                                             \
    X(cudnnSetTensorNdDescriptor)
#endif /* KILN_CUDA_HIP */

#define KILN_CUDA_FN_POINTER(f) __typeof__(f) *f;

typedef struct kiln_cuda_lt_api {
    KILN_CUDA_LT_FNS(KILN_CUDA_FN_POINTER)
} kiln_cuda_lt_api;
typedef struct kiln_cuda_nvrtc_api {
    KILN_CUDA_NVRTC_FNS(KILN_CUDA_FN_POINTER)
} kiln_cuda_nvrtc_api;
#if KILN_CUDA_CUDNN
typedef struct kiln_cuda_dnn_api {
    KILN_CUDA_DNN_FNS(KILN_CUDA_FN_POINTER)
} kiln_cuda_dnn_api;
extern kiln_cuda_dnn_api kiln__cuda_dnn_api;
#endif
extern kiln_cuda_lt_api kiln__cuda_lt_api;
extern kiln_cuda_nvrtc_api kiln__cuda_nvrtc_api;

/** Which libraries to load (a bit set). */
enum {
    KILN_CUDA_LIB_LT = 1,
    KILN_CUDA_LIB_DNN = 2,
    KILN_CUDA_LIB_NVRTC = 4
};

/** Loads the libraries of `which` not loaded yet (cuDNN only when the backend was built
 *  with it). 0, or -1 with "<who>: cannot load <soname> (<why>)" as the error. */
int kiln__cuda_libs_load(int which, const char *who);
/** Opens soname and resolves the n (at most 64) names into fns, which are written only
 *  when every one resolves; the library then stays open. 0, or -1 with a message naming
 *  the library (and the missing function). */
int kiln__cuda_lib_open(const char *soname, const char *const *names, void **fns, int n, const char *who);

/* Below, the names call through the tables (not in cuda-libs.c, which fills them). */
#if !defined(KILN_CUDA_LIBS_IMPL) && KILN_CUDA_HIP
#define hipblasLtCreate kiln__cuda_lt_api.hipblasLtCreate
#define hipblasLtDestroy kiln__cuda_lt_api.hipblasLtDestroy
#define hipblasLtMatmul kiln__cuda_lt_api.hipblasLtMatmul
#define hipblasLtMatmulAlgoGetHeuristic kiln__cuda_lt_api.hipblasLtMatmulAlgoGetHeuristic
#define hipblasLtMatmulDescCreate kiln__cuda_lt_api.hipblasLtMatmulDescCreate
#define hipblasLtMatmulDescDestroy kiln__cuda_lt_api.hipblasLtMatmulDescDestroy
#define hipblasLtMatmulDescSetAttribute kiln__cuda_lt_api.hipblasLtMatmulDescSetAttribute
#define hipblasLtMatmulPreferenceCreate kiln__cuda_lt_api.hipblasLtMatmulPreferenceCreate
#define hipblasLtMatmulPreferenceDestroy kiln__cuda_lt_api.hipblasLtMatmulPreferenceDestroy
#define hipblasLtMatmulPreferenceSetAttribute kiln__cuda_lt_api.hipblasLtMatmulPreferenceSetAttribute
#define hipblasLtMatrixLayoutCreate kiln__cuda_lt_api.hipblasLtMatrixLayoutCreate
#define hipblasLtMatrixLayoutDestroy kiln__cuda_lt_api.hipblasLtMatrixLayoutDestroy
#define hipblasLtMatrixLayoutSetAttribute kiln__cuda_lt_api.hipblasLtMatrixLayoutSetAttribute
#define hiprtcCompileProgram kiln__cuda_nvrtc_api.hiprtcCompileProgram
#define hiprtcCreateProgram kiln__cuda_nvrtc_api.hiprtcCreateProgram
#define hiprtcDestroyProgram kiln__cuda_nvrtc_api.hiprtcDestroyProgram
#define hiprtcGetErrorString kiln__cuda_nvrtc_api.hiprtcGetErrorString
#define hiprtcGetCode kiln__cuda_nvrtc_api.hiprtcGetCode
#define hiprtcGetCodeSize kiln__cuda_nvrtc_api.hiprtcGetCodeSize
#define hiprtcGetProgramLog kiln__cuda_nvrtc_api.hiprtcGetProgramLog
#define hiprtcGetProgramLogSize kiln__cuda_nvrtc_api.hiprtcGetProgramLogSize
#if KILN_CUDA_CUDNN
#define miopenConvolutionBackwardData kiln__cuda_dnn_api.miopenConvolutionBackwardData
#define miopenConvolutionBackwardDataGetWorkSpaceSize                                                             \
    kiln__cuda_dnn_api.miopenConvolutionBackwardDataGetWorkSpaceSize
#define miopenConvolutionBackwardWeights kiln__cuda_dnn_api.miopenConvolutionBackwardWeights
#define miopenConvolutionBackwardWeightsGetWorkSpaceSize                                                          \
    kiln__cuda_dnn_api.miopenConvolutionBackwardWeightsGetWorkSpaceSize
#define miopenConvolutionForward kiln__cuda_dnn_api.miopenConvolutionForward
#define miopenConvolutionForwardGetWorkSpaceSize kiln__cuda_dnn_api.miopenConvolutionForwardGetWorkSpaceSize
#define miopenCreate kiln__cuda_dnn_api.miopenCreate
#define miopenCreateConvolutionDescriptor kiln__cuda_dnn_api.miopenCreateConvolutionDescriptor
#define miopenCreateTensorDescriptor kiln__cuda_dnn_api.miopenCreateTensorDescriptor
#define miopenDestroy kiln__cuda_dnn_api.miopenDestroy
#define miopenDestroyConvolutionDescriptor kiln__cuda_dnn_api.miopenDestroyConvolutionDescriptor
#define miopenDestroyTensorDescriptor kiln__cuda_dnn_api.miopenDestroyTensorDescriptor
#define miopenFindConvolutionBackwardDataAlgorithm kiln__cuda_dnn_api.miopenFindConvolutionBackwardDataAlgorithm
#define miopenFindConvolutionBackwardWeightsAlgorithm                                                             \
    kiln__cuda_dnn_api.miopenFindConvolutionBackwardWeightsAlgorithm
#define miopenFindConvolutionForwardAlgorithm kiln__cuda_dnn_api.miopenFindConvolutionForwardAlgorithm
#define miopenGetErrorString kiln__cuda_dnn_api.miopenGetErrorString
#define miopenInitConvolutionNdDescriptor kiln__cuda_dnn_api.miopenInitConvolutionNdDescriptor
#define miopenSetConvolutionGroupCount kiln__cuda_dnn_api.miopenSetConvolutionGroupCount
#define miopenSetStream kiln__cuda_dnn_api.miopenSetStream
#define miopenSetTensorDescriptor kiln__cuda_dnn_api.miopenSetTensorDescriptor
#endif
#elif !defined(KILN_CUDA_LIBS_IMPL)
#define cublasLtCreate kiln__cuda_lt_api.cublasLtCreate
#define cublasLtDestroy kiln__cuda_lt_api.cublasLtDestroy
#define cublasLtGetStatusString kiln__cuda_lt_api.cublasLtGetStatusString
#define cublasLtMatmul kiln__cuda_lt_api.cublasLtMatmul
#define cublasLtMatmulAlgoGetHeuristic kiln__cuda_lt_api.cublasLtMatmulAlgoGetHeuristic
#define cublasLtMatmulDescCreate kiln__cuda_lt_api.cublasLtMatmulDescCreate
#define cublasLtMatmulDescDestroy kiln__cuda_lt_api.cublasLtMatmulDescDestroy
#define cublasLtMatmulDescSetAttribute kiln__cuda_lt_api.cublasLtMatmulDescSetAttribute
#define cublasLtMatmulPreferenceCreate kiln__cuda_lt_api.cublasLtMatmulPreferenceCreate
#define cublasLtMatmulPreferenceDestroy kiln__cuda_lt_api.cublasLtMatmulPreferenceDestroy
#define cublasLtMatmulPreferenceSetAttribute kiln__cuda_lt_api.cublasLtMatmulPreferenceSetAttribute
#define cublasLtMatrixLayoutCreate kiln__cuda_lt_api.cublasLtMatrixLayoutCreate
#define cublasLtMatrixLayoutDestroy kiln__cuda_lt_api.cublasLtMatrixLayoutDestroy
#define cublasLtMatrixLayoutSetAttribute kiln__cuda_lt_api.cublasLtMatrixLayoutSetAttribute
#define nvrtcCompileProgram kiln__cuda_nvrtc_api.nvrtcCompileProgram
#define nvrtcCreateProgram kiln__cuda_nvrtc_api.nvrtcCreateProgram
#define nvrtcDestroyProgram kiln__cuda_nvrtc_api.nvrtcDestroyProgram
#define nvrtcGetErrorString kiln__cuda_nvrtc_api.nvrtcGetErrorString
#define nvrtcGetPTX kiln__cuda_nvrtc_api.nvrtcGetPTX
#define nvrtcGetPTXSize kiln__cuda_nvrtc_api.nvrtcGetPTXSize
#define nvrtcGetProgramLog kiln__cuda_nvrtc_api.nvrtcGetProgramLog
#define nvrtcGetProgramLogSize kiln__cuda_nvrtc_api.nvrtcGetProgramLogSize
#if KILN_CUDA_CUDNN
#define cudnnConvolutionBackwardData kiln__cuda_dnn_api.cudnnConvolutionBackwardData
#define cudnnConvolutionBackwardFilter kiln__cuda_dnn_api.cudnnConvolutionBackwardFilter
#define cudnnConvolutionForward kiln__cuda_dnn_api.cudnnConvolutionForward
#define cudnnCreate kiln__cuda_dnn_api.cudnnCreate
#define cudnnCreateConvolutionDescriptor kiln__cuda_dnn_api.cudnnCreateConvolutionDescriptor
#define cudnnCreateFilterDescriptor kiln__cuda_dnn_api.cudnnCreateFilterDescriptor
#define cudnnCreateTensorDescriptor kiln__cuda_dnn_api.cudnnCreateTensorDescriptor
#define cudnnDestroy kiln__cuda_dnn_api.cudnnDestroy
#define cudnnDestroyConvolutionDescriptor kiln__cuda_dnn_api.cudnnDestroyConvolutionDescriptor
#define cudnnDestroyFilterDescriptor kiln__cuda_dnn_api.cudnnDestroyFilterDescriptor
#define cudnnDestroyTensorDescriptor kiln__cuda_dnn_api.cudnnDestroyTensorDescriptor
#define cudnnFindConvolutionBackwardDataAlgorithmEx kiln__cuda_dnn_api.cudnnFindConvolutionBackwardDataAlgorithmEx
#define cudnnFindConvolutionBackwardFilterAlgorithmEx                                                             \
    kiln__cuda_dnn_api.cudnnFindConvolutionBackwardFilterAlgorithmEx
#define cudnnFindConvolutionForwardAlgorithmEx kiln__cuda_dnn_api.cudnnFindConvolutionForwardAlgorithmEx
#define cudnnGetConvolutionBackwardDataAlgorithm_v7 kiln__cuda_dnn_api.cudnnGetConvolutionBackwardDataAlgorithm_v7
#define cudnnGetConvolutionBackwardFilterAlgorithm_v7                                                             \
    kiln__cuda_dnn_api.cudnnGetConvolutionBackwardFilterAlgorithm_v7
#define cudnnGetConvolutionForwardAlgorithm_v7 kiln__cuda_dnn_api.cudnnGetConvolutionForwardAlgorithm_v7
#define cudnnGetConvolutionForwardWorkspaceSize kiln__cuda_dnn_api.cudnnGetConvolutionForwardWorkspaceSize
#define cudnnGetConvolutionBackwardDataWorkspaceSize                                                              \
    kiln__cuda_dnn_api.cudnnGetConvolutionBackwardDataWorkspaceSize
#define cudnnGetConvolutionBackwardFilterWorkspaceSize                                                            \
    kiln__cuda_dnn_api.cudnnGetConvolutionBackwardFilterWorkspaceSize
#define cudnnGetVersion kiln__cuda_dnn_api.cudnnGetVersion
#define cudnnGetErrorString kiln__cuda_dnn_api.cudnnGetErrorString
#define cudnnSetConvolutionGroupCount kiln__cuda_dnn_api.cudnnSetConvolutionGroupCount
#define cudnnSetConvolutionMathType kiln__cuda_dnn_api.cudnnSetConvolutionMathType
#define cudnnSetConvolutionNdDescriptor kiln__cuda_dnn_api.cudnnSetConvolutionNdDescriptor
#define cudnnSetFilterNdDescriptor kiln__cuda_dnn_api.cudnnSetFilterNdDescriptor
#define cudnnSetStream kiln__cuda_dnn_api.cudnnSetStream
#define cudnnSetTensorNdDescriptor kiln__cuda_dnn_api.cudnnSetTensorNdDescriptor
#endif
#endif

#endif /* KILN_CUDA_LIBS_H */
