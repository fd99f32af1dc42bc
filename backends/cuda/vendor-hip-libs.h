/*
 * backends/cuda/vendor-hip-libs.h — what a HIP build of the backend calls in hipBLASLt
 * (standing in for cuBLASLt), MIOpen (for cuDNN) and hipRTC (for NVRTC), and the cuBLASLt
 * and NVRTC spellings of the shared code mapped onto the first and last.
 *
 * The backend loads these libraries with dlopen (cuda-libs.h), so it needs their
 * declarations, never their link-time libraries. hipBLASLt and MIOpen are often not
 * installed where the backend is built (their headers pull in hipBLAS, rocBLAS and more),
 * so the few types, enum values and prototypes the backend uses are declared here, and
 * nothing else. The values and signatures are those of the ROCm 6.2 release's public
 * headers (hipblaslt.h and hipblas-common.h of hipBLASLt 0.8, libhipblaslt.so.0; miopen.h
 * of MIOpen 3.2, libMIOpen.so.1). The hipBLASLt part is the same in ROCm 6.0 and 6.1; ROCm
 * 5.x's hipBLASLt, under the same soname, took its own compute and data type enums in
 * hipblasLtMatmulDescCreate and hipblasLtMatrixLayoutCreate, so a HIP build needs ROCm 6 or
 * later. A missing function shows as a refused load naming it; a changed value would not
 * show at all, which is why the release is named here. hipRTC's header ships with HIP
 * itself and is included as it is.
 *
 * Opaque handles are declared as pointers to incomplete structs of kiln's own naming: only
 * their pointer type travels through the ABI.
 */
#ifndef KILN_CUDA_VENDOR_HIP_LIBS_H
#define KILN_CUDA_VENDOR_HIP_LIBS_H

#include <hip/hip_runtime_api.h>
#include <hip/hiprtc.h>
#include <hip/library_types.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------ hipBLASLt */

typedef enum {
    HIPBLAS_STATUS_SUCCESS = 0,
    HIPBLAS_STATUS_NOT_INITIALIZED = 1,
    HIPBLAS_STATUS_ALLOC_FAILED = 2,
    HIPBLAS_STATUS_INVALID_VALUE = 3,
    HIPBLAS_STATUS_MAPPING_ERROR = 4,
    HIPBLAS_STATUS_EXECUTION_FAILED = 5,
    HIPBLAS_STATUS_INTERNAL_ERROR = 6,
    HIPBLAS_STATUS_NOT_SUPPORTED = 7,
    HIPBLAS_STATUS_ARCH_MISMATCH = 8,
    HIPBLAS_STATUS_HANDLE_IS_NULLPTR = 9,
    HIPBLAS_STATUS_INVALID_ENUM = 10,
    HIPBLAS_STATUS_UNKNOWN = 11
} hipblasStatus_t;

typedef enum {
    HIPBLAS_OP_N = 111,
    HIPBLAS_OP_T = 112,
    HIPBLAS_OP_C = 113
} hipblasOperation_t;

typedef enum {
    HIPBLAS_COMPUTE_32F = 2,
    HIPBLAS_COMPUTE_32F_FAST_TF32 = 6, /* accepted by the API; AMD GPUs have no TF32 (cuda-backend.c) */
    HIPBLAS_COMPUTE_64F = 7
} hipblasComputeType_t;

/* bf16 in hipDataType: HIP 5.x's library_types.h stops at the complex types, ROCm 6
 * numbers it 14 as CUDA does */
#define KILN_HIP_R_16BF ((hipDataType)14)

typedef enum {
    HIPBLASLT_EPILOGUE_DEFAULT = 1,
    HIPBLASLT_EPILOGUE_RELU = 2,
    HIPBLASLT_EPILOGUE_BIAS = 4,
    HIPBLASLT_EPILOGUE_RELU_BIAS = 6
} hipblasLtEpilogue_t;

typedef enum {
    HIPBLASLT_MATMUL_DESC_TRANSA = 0,      /* int32_t (hipblasOperation_t) */
    HIPBLASLT_MATMUL_DESC_TRANSB = 1,      /* int32_t (hipblasOperation_t) */
    HIPBLASLT_MATMUL_DESC_EPILOGUE = 2,    /* uint32_t (hipblasLtEpilogue_t) */
    HIPBLASLT_MATMUL_DESC_BIAS_POINTER = 3 /* const void * */
} hipblasLtMatmulDescAttributes_t;

typedef enum {
    HIPBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 0,         /* int32_t */
    HIPBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 1 /* int64_t, in elements */
} hipblasLtMatrixLayoutAttribute_t;

/* hipBLASLt has no operand alignment preferences (cuBLASLt's MIN_ALIGNMENT_*): it checks
 * the pointers itself */
typedef enum {
    HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1 /* uint64_t */
} hipblasLtMatmulPreferenceAttributes_t;

typedef void *hipblasLtHandle_t;
typedef struct kiln_hipblaslt_matmul_desc *hipblasLtMatmulDesc_t;
typedef struct kiln_hipblaslt_matrix_layout *hipblasLtMatrixLayout_t;
typedef struct kiln_hipblaslt_matmul_pref *hipblasLtMatmulPreference_t;

/* passed by value and filled by the library: the layout must be the library's */
typedef struct {
    uint8_t data[16];
    size_t max_workspace_bytes;
} hipblasLtMatmulAlgo_t;

typedef struct {
    hipblasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    hipblasStatus_t state;
    float wavesCount;
    int reserved[4];
} hipblasLtMatmulHeuristicResult_t;

hipblasStatus_t hipblasLtCreate(hipblasLtHandle_t *handle);
hipblasStatus_t hipblasLtDestroy(const hipblasLtHandle_t handle);
hipblasStatus_t hipblasLtMatmulDescCreate(hipblasLtMatmulDesc_t *desc, hipblasComputeType_t compute,
                                          hipDataType scale);
hipblasStatus_t hipblasLtMatmulDescDestroy(const hipblasLtMatmulDesc_t desc);
hipblasStatus_t hipblasLtMatmulDescSetAttribute(hipblasLtMatmulDesc_t desc, hipblasLtMatmulDescAttributes_t attr,
                                                const void *buf, size_t size);
hipblasStatus_t hipblasLtMatrixLayoutCreate(hipblasLtMatrixLayout_t *layout, hipDataType type, uint64_t rows,
                                            uint64_t cols, int64_t ld);
hipblasStatus_t hipblasLtMatrixLayoutDestroy(const hipblasLtMatrixLayout_t layout);
hipblasStatus_t hipblasLtMatrixLayoutSetAttribute(hipblasLtMatrixLayout_t layout,
                                                  hipblasLtMatrixLayoutAttribute_t attr, const void *buf,
                                                  size_t size);
hipblasStatus_t hipblasLtMatmulPreferenceCreate(hipblasLtMatmulPreference_t *pref);
hipblasStatus_t hipblasLtMatmulPreferenceDestroy(const hipblasLtMatmulPreference_t pref);
hipblasStatus_t hipblasLtMatmulPreferenceSetAttribute(hipblasLtMatmulPreference_t pref,
                                                      hipblasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                      size_t size);
hipblasStatus_t hipblasLtMatmulAlgoGetHeuristic(hipblasLtHandle_t handle, hipblasLtMatmulDesc_t desc,
                                                hipblasLtMatrixLayout_t a, hipblasLtMatrixLayout_t b,
                                                hipblasLtMatrixLayout_t c, hipblasLtMatrixLayout_t d,
                                                hipblasLtMatmulPreference_t pref, int requested,
                                                hipblasLtMatmulHeuristicResult_t results[], int *returned);
hipblasStatus_t hipblasLtMatmul(hipblasLtHandle_t handle, hipblasLtMatmulDesc_t desc, const void *alpha,
                                const void *a, hipblasLtMatrixLayout_t adesc, const void *b,
                                hipblasLtMatrixLayout_t bdesc, const void *beta, const void *c,
                                hipblasLtMatrixLayout_t cdesc, void *d, hipblasLtMatrixLayout_t ddesc,
                                const hipblasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_size,
                                hipStream_t stream);

/* hipBLASLt exports no status-to-text function (hipBLAS has one, in another library) */
static inline const char *kiln_hipblas_status_name(hipblasStatus_t st)
{
    static const char *const names[] = {
        "HIPBLAS_STATUS_SUCCESS",           "HIPBLAS_STATUS_NOT_INITIALIZED", "HIPBLAS_STATUS_ALLOC_FAILED",
        "HIPBLAS_STATUS_INVALID_VALUE",     "HIPBLAS_STATUS_MAPPING_ERROR",   "HIPBLAS_STATUS_EXECUTION_FAILED",
        "HIPBLAS_STATUS_INTERNAL_ERROR",    "HIPBLAS_STATUS_NOT_SUPPORTED",   "HIPBLAS_STATUS_ARCH_MISMATCH",
        "HIPBLAS_STATUS_HANDLE_IS_NULLPTR", "HIPBLAS_STATUS_INVALID_ENUM",    "HIPBLAS_STATUS_UNKNOWN"};
    return (unsigned)st < sizeof names / sizeof *names ? names[st] : "an unknown hipBLAS status";
}

/* cuda-blas.c's cuBLASLt spellings: the hipBLASLt API is the same shape, name for name */
#define cublasStatus_t hipblasStatus_t
#define CUBLAS_STATUS_SUCCESS HIPBLAS_STATUS_SUCCESS
#define CUBLAS_STATUS_ALLOC_FAILED HIPBLAS_STATUS_ALLOC_FAILED
#define CUBLAS_STATUS_EXECUTION_FAILED HIPBLAS_STATUS_EXECUTION_FAILED
#define CUBLAS_STATUS_NOT_SUPPORTED HIPBLAS_STATUS_NOT_SUPPORTED
#define cublasOperation_t hipblasOperation_t
#define CUBLAS_OP_N HIPBLAS_OP_N
#define CUBLAS_OP_T HIPBLAS_OP_T
#define cublasComputeType_t hipblasComputeType_t
#define CUBLAS_COMPUTE_32F HIPBLAS_COMPUTE_32F
#define CUBLAS_COMPUTE_32F_FAST_TF32 HIPBLAS_COMPUTE_32F_FAST_TF32
#define CUBLAS_COMPUTE_64F HIPBLAS_COMPUTE_64F
#define cudaDataType_t hipDataType
#define CUDA_R_32F HIP_R_32F
#define CUDA_R_64F HIP_R_64F
#define CUDA_R_16F HIP_R_16F
#define CUDA_R_16BF KILN_HIP_R_16BF
#define cublasLtHandle_t hipblasLtHandle_t
#define cublasLtMatmulDesc_t hipblasLtMatmulDesc_t
#define cublasLtMatrixLayout_t hipblasLtMatrixLayout_t
#define cublasLtMatmulPreference_t hipblasLtMatmulPreference_t
#define cublasLtMatmulHeuristicResult_t hipblasLtMatmulHeuristicResult_t
#define cublasLtMatmulAlgo_t hipblasLtMatmulAlgo_t
#define cublasLtEpilogue_t hipblasLtEpilogue_t
#define CUBLASLT_EPILOGUE_DEFAULT HIPBLASLT_EPILOGUE_DEFAULT
#define CUBLASLT_EPILOGUE_RELU HIPBLASLT_EPILOGUE_RELU
#define CUBLASLT_EPILOGUE_BIAS HIPBLASLT_EPILOGUE_BIAS
#define CUBLASLT_EPILOGUE_RELU_BIAS HIPBLASLT_EPILOGUE_RELU_BIAS
#define CUBLASLT_MATMUL_DESC_TRANSA HIPBLASLT_MATMUL_DESC_TRANSA
#define CUBLASLT_MATMUL_DESC_TRANSB HIPBLASLT_MATMUL_DESC_TRANSB
#define CUBLASLT_MATMUL_DESC_EPILOGUE HIPBLASLT_MATMUL_DESC_EPILOGUE
#define CUBLASLT_MATMUL_DESC_BIAS_POINTER HIPBLASLT_MATMUL_DESC_BIAS_POINTER
#define CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT HIPBLASLT_MATRIX_LAYOUT_BATCH_COUNT
#define CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET HIPBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET
#define CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
#define cublasLtGetStatusString kiln_hipblas_status_name
#define cublasLtCreate hipblasLtCreate
#define cublasLtDestroy hipblasLtDestroy
#define cublasLtMatmul hipblasLtMatmul
#define cublasLtMatmulAlgoGetHeuristic hipblasLtMatmulAlgoGetHeuristic
#define cublasLtMatmulDescCreate hipblasLtMatmulDescCreate
#define cublasLtMatmulDescDestroy hipblasLtMatmulDescDestroy
#define cublasLtMatmulDescSetAttribute hipblasLtMatmulDescSetAttribute
#define cublasLtMatmulPreferenceCreate hipblasLtMatmulPreferenceCreate
#define cublasLtMatmulPreferenceDestroy hipblasLtMatmulPreferenceDestroy
#define cublasLtMatmulPreferenceSetAttribute hipblasLtMatmulPreferenceSetAttribute
#define cublasLtMatrixLayoutCreate hipblasLtMatrixLayoutCreate
#define cublasLtMatrixLayoutDestroy hipblasLtMatrixLayoutDestroy
#define cublasLtMatrixLayoutSetAttribute hipblasLtMatrixLayoutSetAttribute

/* ------------------------------------------------------------------ MIOpen */

typedef enum {
    miopenStatusSuccess = 0,
    miopenStatusNotInitialized = 1,
    miopenStatusInvalidValue = 2,
    miopenStatusBadParm = 3,
    miopenStatusAllocFailed = 4,
    miopenStatusInternalError = 5,
    miopenStatusNotImplemented = 6,
    miopenStatusUnknownError = 7,
    miopenStatusUnsupportedOp = 8
} miopenStatus_t;

typedef enum {
    miopenHalf = 0,
    miopenFloat = 1,
    miopenBFloat16 = 5,
    miopenDouble = 6
} miopenDataType_t;

typedef enum {
    miopenConvolution = 0 /* cross-correlation, as kiln's (and cuDNN's CROSS_CORRELATION) */
} miopenConvolutionMode_t;

/* Find reports one algorithm of one direction per entry: the union's member is the
 * direction's. The algorithm is kept as an int between Find and the run (hip-miopen.c). */
typedef enum {
    miopenConvolutionFwdAlgoGEMM = 0
} miopenConvFwdAlgorithm_t;
typedef enum {
    miopenConvolutionBwdWeightsAlgoGEMM = 0
} miopenConvBwdWeightsAlgorithm_t;
typedef enum {
    miopenConvolutionBwdDataAlgoGEMM = 0
} miopenConvBwdDataAlgorithm_t;

typedef struct {
    union {
        miopenConvFwdAlgorithm_t fwd_algo;
        miopenConvBwdWeightsAlgorithm_t bwd_weights_algo;
        miopenConvBwdDataAlgorithm_t bwd_data_algo;
    };
    float time;    /* milliseconds */
    size_t memory; /* workspace bytes */
} miopenConvAlgoPerf_t;

typedef struct kiln_miopen_handle *miopenHandle_t;
typedef struct kiln_miopen_tensor_desc *miopenTensorDescriptor_t;
typedef struct kiln_miopen_conv_desc *miopenConvolutionDescriptor_t;

const char *miopenGetErrorString(miopenStatus_t error);
miopenStatus_t miopenCreate(miopenHandle_t *handle);
miopenStatus_t miopenDestroy(miopenHandle_t handle);
miopenStatus_t miopenSetStream(miopenHandle_t handle, hipStream_t stream);
miopenStatus_t miopenCreateTensorDescriptor(miopenTensorDescriptor_t *desc);
miopenStatus_t miopenSetTensorDescriptor(miopenTensorDescriptor_t desc, miopenDataType_t type, int ndims,
                                         const int *dims, const int *strides);
miopenStatus_t miopenDestroyTensorDescriptor(miopenTensorDescriptor_t desc);
miopenStatus_t miopenCreateConvolutionDescriptor(miopenConvolutionDescriptor_t *desc);
miopenStatus_t miopenInitConvolutionNdDescriptor(miopenConvolutionDescriptor_t desc, int nspatial, const int *pad,
                                                 const int *stride, const int *dilation,
                                                 miopenConvolutionMode_t mode);
miopenStatus_t miopenSetConvolutionGroupCount(miopenConvolutionDescriptor_t desc, int groups);
miopenStatus_t miopenDestroyConvolutionDescriptor(miopenConvolutionDescriptor_t desc);
miopenStatus_t miopenConvolutionForwardGetWorkSpaceSize(miopenHandle_t handle,
                                                        const miopenTensorDescriptor_t w_desc,
                                                        const miopenTensorDescriptor_t x_desc,
                                                        const miopenConvolutionDescriptor_t conv,
                                                        const miopenTensorDescriptor_t y_desc, size_t *bytes);
miopenStatus_t miopenFindConvolutionForwardAlgorithm(miopenHandle_t handle, const miopenTensorDescriptor_t x_desc,
                                                     const void *x, const miopenTensorDescriptor_t w_desc,
                                                     const void *w, const miopenConvolutionDescriptor_t conv,
                                                     const miopenTensorDescriptor_t y_desc, void *y,
                                                     const int requested, int *returned,
                                                     miopenConvAlgoPerf_t *perf, void *workspace,
                                                     size_t workspace_bytes, bool exhaustive);
miopenStatus_t miopenConvolutionForward(miopenHandle_t handle, const void *alpha,
                                        const miopenTensorDescriptor_t x_desc, const void *x,
                                        const miopenTensorDescriptor_t w_desc, const void *w,
                                        const miopenConvolutionDescriptor_t conv, miopenConvFwdAlgorithm_t algo,
                                        const void *beta, const miopenTensorDescriptor_t y_desc, void *y,
                                        void *workspace, size_t workspace_bytes);
miopenStatus_t miopenConvolutionBackwardDataGetWorkSpaceSize(
    miopenHandle_t handle, const miopenTensorDescriptor_t dy_desc, const miopenTensorDescriptor_t w_desc,
    const miopenConvolutionDescriptor_t conv, const miopenTensorDescriptor_t dx_desc, size_t *bytes);
miopenStatus_t miopenFindConvolutionBackwardDataAlgorithm(
    miopenHandle_t handle, const miopenTensorDescriptor_t dy_desc, const void *dy,
    const miopenTensorDescriptor_t w_desc, const void *w, const miopenConvolutionDescriptor_t conv,
    const miopenTensorDescriptor_t dx_desc, void *dx, const int requested, int *returned,
    miopenConvAlgoPerf_t *perf, void *workspace, size_t workspace_bytes, bool exhaustive);
miopenStatus_t miopenConvolutionBackwardData(miopenHandle_t handle, const void *alpha,
                                             const miopenTensorDescriptor_t dy_desc, const void *dy,
                                             const miopenTensorDescriptor_t w_desc, const void *w,
                                             const miopenConvolutionDescriptor_t conv,
                                             miopenConvBwdDataAlgorithm_t algo, const void *beta,
                                             const miopenTensorDescriptor_t dx_desc, void *dx, void *workspace,
                                             size_t workspace_bytes);
miopenStatus_t miopenConvolutionBackwardWeightsGetWorkSpaceSize(
    miopenHandle_t handle, const miopenTensorDescriptor_t dy_desc, const miopenTensorDescriptor_t x_desc,
    const miopenConvolutionDescriptor_t conv, const miopenTensorDescriptor_t dw_desc, size_t *bytes);
miopenStatus_t miopenFindConvolutionBackwardWeightsAlgorithm(
    miopenHandle_t handle, const miopenTensorDescriptor_t dy_desc, const void *dy,
    const miopenTensorDescriptor_t x_desc, const void *x, const miopenConvolutionDescriptor_t conv,
    const miopenTensorDescriptor_t dw_desc, void *dw, const int requested, int *returned,
    miopenConvAlgoPerf_t *perf, void *workspace, size_t workspace_bytes, bool exhaustive);
miopenStatus_t miopenConvolutionBackwardWeights(miopenHandle_t handle, const void *alpha,
                                                const miopenTensorDescriptor_t dy_desc, const void *dy,
                                                const miopenTensorDescriptor_t x_desc, const void *x,
                                                const miopenConvolutionDescriptor_t conv,
                                                miopenConvBwdWeightsAlgorithm_t algo, const void *beta,
                                                const miopenTensorDescriptor_t dw_desc, void *dw, void *workspace,
                                                size_t workspace_bytes);

/* ------------------------------------------------------------------ hipRTC */

/* cuda-rtc.c's NVRTC spellings: hipRTC's API is the same, with a code object where NVRTC
 * gives PTX */
#define nvrtcProgram hiprtcProgram
#define nvrtcResult hiprtcResult
#define NVRTC_SUCCESS HIPRTC_SUCCESS
#define nvrtcCompileProgram hiprtcCompileProgram
#define nvrtcCreateProgram hiprtcCreateProgram
#define nvrtcDestroyProgram hiprtcDestroyProgram
#define nvrtcGetErrorString hiprtcGetErrorString
#define nvrtcGetPTX hiprtcGetCode
#define nvrtcGetPTXSize hiprtcGetCodeSize
#define nvrtcGetProgramLog hiprtcGetProgramLog
#define nvrtcGetProgramLogSize hiprtcGetProgramLogSize

#endif /* KILN_CUDA_VENDOR_HIP_LIBS_H */
