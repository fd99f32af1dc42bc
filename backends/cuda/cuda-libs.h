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
 */
#ifndef KILN_CUDA_LIBS_H
#define KILN_CUDA_LIBS_H

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
    X(cudnnGetErrorString)                                                                                        \
    X(cudnnSetConvolutionGroupCount)                                                                              \
    X(cudnnSetConvolutionMathType)                                                                                \
    X(cudnnSetConvolutionNdDescriptor)                                                                            \
    X(cudnnSetFilterNdDescriptor)                                                                                 \
    X(cudnnSetStream)                                                                                             \
    X(cudnnSetTensorNdDescriptor)

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
#ifndef KILN_CUDA_LIBS_IMPL
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
