/*
 * backends/cuda/cuda-fused.c — fused programs as CUDA C (cuda-fused.h).
 *
 * The body comes from the shared emitter (backends/fused/fused-codegen.c); this file
 * writes the CUDA spellings it uses (the prelude below), compiles with NVRTC
 * (cuda-rtc.c), loads the PTX with the runtime's library API (cudaLibraryLoadData, so
 * libkiln needs no link to the driver library, which machines without a GPU lack) and
 * launches with one parameter struct passed by value: the operand pointers, the element
 * count and row length, the shapes and strides of strided inputs, and every
 * instruction's alpha and beta, so one compiled kernel serves every shape of its key.
 *
 * The ops use the formulas of the prebuilt kernels (cuda-math.cuh) at f32. Adds, subtracts
 * and multiplies between instructions are written with the _rn intrinsics, which the
 * compiler never contracts into a fused multiply-add, so a chain rounds at each op as the
 * unfused launches do; what the two compilers decide inside one op's formula (gelu's
 * products) may still differ in the last bit, so fused and unfused results agree to a
 * few ulps rather than to the bit.
 *
 * Kernels live in a per-device cache keyed by the full key text (its 64-bit hash names
 * the kernel), guarded by the device's lock; a miss compiles outside the lock (NVRTC
 * takes tens of milliseconds) and the first insert wins. The PTX is also kept on disk,
 * beside the Vulkan pipeline cache (kiln__fused_cache_dir), in a file named by a hash of
 * the generated source and the target architecture, the key text at its head (compared
 * on reading: a collision or a cut file is a miss, then rewritten through a temporary
 * name), so a later process skips NVRTC; the driver's JIT cache keeps the PTX's
 * machine code.
 *
 * A HIP build compiles the same source with hipRTC for the GPU's gfx architecture and
 * loads the code object with the module API (kernel_image and the helpers after it); its
 * group reductions go through shared memory only, since a wavefront may be 64 lanes wide.
 */
#include "cuda-fused.h"
#include "error-impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda-impl.h"
#include "cuda-rtc.h"
#include "fused-codegen.h"

/* Mirrors struct kf_params of the prelude (8-byte pointers and integers, 4-byte floats:
 * the same layout in C and in CUDA C). 2,896 bytes, within the 4 KiB every architecture
 * accepts for kernel parameters. */
typedef struct kf_params {
    const void *in[KILN_FUSED_MAX_INPUTS];
    void *out[KILN_FUSED_MAX_OUTPUTS];
    long long n, inner;
    long long shape[KILN_FUSED_MAX_INPUTS][KILN_MAX_DIMS];
    long long stride[KILN_FUSED_MAX_INPUTS][KILN_MAX_DIMS];
    int nd[KILN_FUSED_MAX_INPUTS];
    float k[KILN_FUSED_MAX_INSTRS * 2];
} kf_params;

_Static_assert(sizeof(kf_params) <= 4096, "kernel parameters fit the 4 KiB limit");

/* Threads per block: the group reductions below assume a multiple of 32, at most 1024. */
#define KF_THREADS 256

static const char prelude[] =
    "typedef long long kf_idx_t;\n"
    "#define KF_IDX kf_idx_t\n"
    "#define KF_ACC double\n"
    "#define KF_FN static __device__ __forceinline__\n"
    "#define KF_NEG_INF (-__longlong_as_double(0x7ff0000000000000LL))\n"
    "struct kf_params {\n"
    "    const void *in[16];\n"
    "    void *out[16];\n"
    "    long long n, inner;\n"
    "    long long shape[16][8];\n"
    "    long long stride[16][8];\n"
    "    int nd[16];\n"
    "    float k[128];\n"
    "};\n"
    "#define KF_PDECL const kf_params &P,\n"
    "#define KF_PARG P,\n"
    "#define KF_N (P.n)\n"
    "#define KF_INNER (P.inner)\n"
    "#define KF_GID ((kf_idx_t)blockIdx.x * blockDim.x + threadIdx.x)\n"
    "#define KF_GSTRIDE ((kf_idx_t)gridDim.x * blockDim.x)\n"
    "#define KF_GROUP ((kf_idx_t)blockIdx.x)\n"
    "#define KF_NGROUPS ((kf_idx_t)gridDim.x)\n"
    "#define KF_LID ((kf_idx_t)threadIdx.x)\n"
    "#define KF_LSIZE ((kf_idx_t)blockDim.x)\n"
    "#define KF_K(j) (P.k[j])\n"
    "#define KF_NDIM(k) (P.nd[k])\n"
    "#define KF_SHAPE(k, d) (P.shape[k][d])\n"
    "#define KF_STRIDE(k, d) (P.stride[k][d])\n"
    "KF_FN double kf_acc(float x) { return (double)x; }\n"
    "KF_FN double kf_acc_n(kf_idx_t x) { return (double)x; }\n"
    "KF_FN double kf_acc_exp(double x) { return exp(x); }\n"
    "KF_FN double kf_acc_log(double x) { return log(x); }\n"
    /* the ops: cuda-math.cuh's kcu_unary_fp / kcu_binary_fp at f32 */
    "KF_FN float ku_neg(float x, float A, float B) { return -x; }\n"
    "KF_FN float ku_abs(float x, float A, float B) { return fabsf(x); }\n"
    "KF_FN float ku_sign(float x, float A, float B) { return (float)((0.0f < x) - (x < 0.0f)); }\n"
    "KF_FN float ku_exp(float x, float A, float B) { return expf(x); }\n"
    "KF_FN float ku_log(float x, float A, float B) { return logf(x); }\n"
    "KF_FN float ku_log1p(float x, float A, float B) { return log1pf(x); }\n"
    "KF_FN float ku_expm1(float x, float A, float B) { return expm1f(x); }\n"
    "KF_FN float ku_sqrt(float x, float A, float B) { return sqrtf(x); }\n"
    "KF_FN float ku_rsqrt(float x, float A, float B) { return 1.0f / sqrtf(x); }\n"
    "KF_FN float ku_square(float x, float A, float B) { return __fmul_rn(x, x); }\n"
    "KF_FN float ku_reciprocal(float x, float A, float B) { return 1.0f / x; }\n"
    "KF_FN float ku_sin(float x, float A, float B) { return sinf(x); }\n"
    "KF_FN float ku_cos(float x, float A, float B) { return cosf(x); }\n"
    "KF_FN float ku_tanh(float x, float A, float B) { return tanhf(x); }\n"
    "KF_FN float ku_sigmoid(float x, float A, float B) { return 1.0f / (1.0f + expf(-x)); }\n"
    "KF_FN float ku_relu(float x, float A, float B) { return x < 0.0f ? 0.0f : x; }\n"
    "KF_FN float ku_leaky_relu(float x, float A, float B) { return x > 0.0f ? x : __fmul_rn(A, x); }\n"
    "KF_FN float ku_elu(float x, float A, float B) { return x > 0.0f ? x : __fmul_rn(A, expm1f(x)); }\n"
    "KF_FN float ku_gelu(float x, float A, float B)\n"
    "{ return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f)); }\n"
    "KF_FN float ku_gelu_tanh(float x, float A, float B)\n"
    "{ return 0.5f * x * (1.0f + tanhf(0.79788456080286535588f * (x + 0.044715f * x * x * x))); }\n"
    "KF_FN float ku_silu(float x, float A, float B) { return x / (1.0f + expf(-x)); }\n"
    "KF_FN float ku_softplus(float x, float A, float B)\n"
    "{ return __fmul_rn(x, A) > B ? x : log1pf(expf(__fmul_rn(x, A))) / A; }\n"
    "KF_FN float ku_erf(float x, float A, float B) { return erff(x); }\n"
    "KF_FN float ku_floor(float x, float A, float B) { return floorf(x); }\n"
    "KF_FN float ku_ceil(float x, float A, float B) { return ceilf(x); }\n"
    "KF_FN float ku_round(float x, float A, float B) { return rintf(x); }\n"
    "KF_FN float ku_clamp(float x, float A, float B)\n"
    "{ if (x != x) return x; x = x < A ? A : x; return x > B ? B : x; }\n"
    "KF_FN float ku_pow_scalar(float x, float A, float B)\n"
    "{ return A == 0.5f ? sqrtf(x) : A == -0.5f ? 1.0f / sqrtf(x) : powf(x, A); }\n"
    "KF_FN float ku_add_scalar(float x, float A, float B) { return __fadd_rn(x, A); }\n"
    "KF_FN float ku_mul_scalar(float x, float A, float B) { return __fmul_rn(x, A); }\n"
    "KF_FN float kb_add(float a, float b) { return __fadd_rn(a, b); }\n"
    "KF_FN float kb_sub(float a, float b) { return __fsub_rn(a, b); }\n"
    "KF_FN float kb_mul(float a, float b) { return __fmul_rn(a, b); }\n"
    "KF_FN float kb_div(float a, float b) { return a / b; }\n"
    "KF_FN float kb_remainder(float a, float b)\n"
    "{ float m = fmodf(a, b); if (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) m = __fadd_rn(m, b); return m; }\n"
    "KF_FN float kb_pow(float a, float b) { return powf(a, b); }\n"
    "#define KF_NAN __int_as_float(0x7fc00000)\n"
    "KF_FN float kb_maximum(float a, float b) { return (a != a || b != b) ? KF_NAN : (a < b ? b : a); }\n"
    "KF_FN float kb_minimum(float a, float b) { return (a != a || b != b) ? KF_NAN : (b < a ? b : a); }\n"
    "KF_FN double kf_nanmax(double a, double b) { return a != a ? a : b != b ? b : (b > a ? b : a); }\n";

#define KF_STR_(x) #x
#define KF_STR(x) KF_STR_(x)

/* Group reductions over the whole block (every thread calls them). */
#if KILN_CUDA_HIP
/* AMD wavefronts are 32 or 64 lanes wide depending on the GPU, so the HIP build reduces
 * through shared memory alone, halving the active threads each step (KF_THREADS is a power
 * of two); the first barrier keeps a previous call's readers of part[0] ahead of the
 * writes. */
static const char group_reduce[] = "template <bool MAX> static __device__ double kf_group(double v)\n"
                                   "{\n"
                                   "    __shared__ double part[" KF_STR(
                                       KF_THREADS) "];\n"
                                                   "    __syncthreads();\n"
                                                   "    part[threadIdx.x] = v;\n"
                                                   "    __syncthreads();\n"
                                                   "    for (unsigned s = blockDim.x >> 1; s > 0; s >>= 1) {\n"
                                                   "        if (threadIdx.x < s) {\n"
                                                   "            double w = part[threadIdx.x + s];\n"
                                                   "            part[threadIdx.x] = MAX ? "
                                                   "kf_nanmax(part[threadIdx.x], w) : part[threadIdx.x] + w;\n"
                                                   "        }\n"
                                                   "        __syncthreads();\n"
                                                   "    }\n"
                                                   "    return part[0];\n"
                                                   "}\n"
                                                   "#define kf_group_max(v) kf_group<true>(v)\n"
                                                   "#define kf_group_sum(v) kf_group<false>(v)\n";
#else
static const char group_reduce[] =
    "template <bool MAX> static __device__ double kf_group(double v)\n"
    "{\n"
    "    __shared__ double part[32];\n"
    "    for (int o = 16; o > 0; o >>= 1) {\n"
    "        double w = __shfl_down_sync(0xffffffffu, v, o);\n"
    "        v = MAX ? kf_nanmax(v, w) : v + w;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;\n"
    "    __syncthreads();\n"
    "    if (threadIdx.x < 32) {\n"
    "        v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : (MAX ? KF_NEG_INF : 0.0);\n"
    "        for (int o = 16; o > 0; o >>= 1) {\n"
    "            double w = __shfl_down_sync(0xffffffffu, v, o);\n"
    "            v = MAX ? kf_nanmax(v, w) : v + w;\n"
    "        }\n"
    "        if (threadIdx.x == 0) part[0] = v;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    return part[0];\n"
    "}\n"
    "#define kf_group_max(v) kf_group<true>(v)\n"
    "#define kf_group_sum(v) kf_group<false>(v)\n";
#endif

static bool valid_name(const char *name)
{
    if (!name || !name[0] || strlen(name) > 64)
        return false;
    for (const char *c = name; *c; c++) {
        bool letter = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || *c == '_';
        if (!letter && !(c != name && *c >= '0' && *c <= '9'))
            return false;
    }
    return true;
}

char *kiln__cuda_fused_source(const kiln_fused_program *p, const char *name, int *why)
{
    *why = 0;
    if (!valid_name(name)) {
        *why = KILN_EINVAL;
        kiln__error_set("cuda fused: kernel name '%s' is not a C identifier", name ? name : "(null)");
        return NULL;
    }
    if (kiln__fused_codegen_check(p, INT64_MAX / 2) < 0) {
        *why = KILN_ENOTSUP;
        return NULL;
    }
    kiln__sbuf b = {.p = malloc(16384), .cap = 16384, .ok = true};
    if (!b.p) {
        *why = kiln__error_set_code(KILN_ENOMEM, "cuda fused: out of memory");
        return NULL;
    }
    b.p[0] = '\0';
    char key[4096];
    kiln__sbuf_printf(&b, "// generated by kiln for the fused program %.3000s\n%s",
                      kiln__fused_codegen_key(p, key, sizeof key), prelude);
    kiln__sbuf_printf(&b, "%s", group_reduce);
    for (int k = 0; k < p->ninputs; k++) {
        if (p->inputs[k].dtype == KILN_BOOL)
            kiln__sbuf_printf(&b, "#define KF_LD%d(idx) (((const unsigned char *)P.in[%d])[idx] ? 1.0f : 0.0f)\n",
                              k, k);
        else
            kiln__sbuf_printf(&b, "#define KF_LD%d(idx) (((const float *)P.in[%d])[idx])\n", k, k);
    }
    for (int k = 0; k < p->noutputs; k++) {
        if (p->outputs[k].dtype == KILN_BOOL)
            kiln__sbuf_printf(&b, "#define KF_ST%d(idx, v) (((unsigned char *)P.out[%d])[idx] = (v) != 0.0f)\n", k,
                              k);
        else
            kiln__sbuf_printf(&b, "#define KF_ST%d(idx, v) (((float *)P.out[%d])[idx] = (v))\n", k, k);
    }
    kiln__sbuf_printf(&b,
                      "#define KF_KERNEL_BEGIN extern \"C\" __global__ void __launch_bounds__(%d) "
                      "%s(const kf_params P) {\n"
                      "#define KF_KERNEL_END }\n",
                      KF_THREADS, name);
    kiln__fused_emit_body(&b, p);
    if (!b.ok) {
        free(b.p);
        *why = kiln__error_set_code(KILN_ENOMEM, "cuda fused: out of memory");
        return NULL;
    }
    return b.p;
}

/* ------------------------------------------------------------------ the cache */

typedef struct fused_kernel {
    char *key;
    uint64_t hash;
    bool failed; /* NVRTC refused the source: groups of this key replay */
#if KILN_CUDA_HIP
    hipModule_t module;
    hipFunction_t fn;
#else
    cudaLibrary_t lib;
    cudaKernel_t kernel;
#endif
    struct fused_kernel *next;
} fused_kernel;

/* What differs between the vendors, as one set of helpers each: the compiled form of a
 * kernel (its image), loading it, and launching it. CUDA: PTX (kept on disk, below) loaded
 * with the runtime's library API. HIP: a code object compiled by hipRTC for the device's
 * gfx architecture and loaded with the module API; code objects are not kept on disk (each
 * process compiles its kernels once). */
#if KILN_CUDA_HIP
static char *kernel_image(kiln_cuda_device *dev, const kiln_fused_program *p, const char *key, const char *name,
                          int *rc)
{
    (void)key;
    char *src = kiln__cuda_fused_source(p, name, rc);
    if (!src)
        return NULL;
    char *code = NULL;
    *rc = kiln__cuda_rtc_compile_gfx(src, name, dev->arch, &code, NULL);
    free(src);
    return code;
}

static cudaError_t image_load(fused_kernel *k, const char *image, const char *name)
{
    cudaError_t e = hipModuleLoadData(&k->module, image);
    if (e == cudaSuccess && (e = hipModuleGetFunction(&k->fn, k->module, name)) != cudaSuccess)
        hipModuleUnload(k->module);
    return e;
}

static void image_unload(fused_kernel *k)
{
    hipModuleUnload(k->module);
}

/* a code object the runtime cannot take for this GPU: its groups replay */
static bool image_refused(cudaError_t e)
{
    return e == hipErrorInvalidImage || e == hipErrorNoBinaryForGpu || e == hipErrorInvalidKernelFile ||
           e == hipErrorSharedObjectInitFailed;
}

static cudaError_t kernel_launch(const fused_kernel *k, unsigned grid, void **args, cudaStream_t stream)
{
    return hipModuleLaunchKernel(k->fn, grid, 1, 1, KF_THREADS, 1, 1, 0, stream, args, NULL);
}
#else
static char *kernel_image(kiln_cuda_device *dev, const kiln_fused_program *p, const char *key, const char *name,
                          int *rc)
{
    bool from_disk = false;
    return kiln__cuda_fused_ptx(p, key, name, dev->cc_major, dev->cc_minor, &from_disk, rc);
}

static cudaError_t image_load(fused_kernel *k, const char *image, const char *name)
{
    cudaError_t e = cudaLibraryLoadData(&k->lib, image, NULL, NULL, 0, NULL, NULL, 0);
    if (e == cudaSuccess && (e = cudaLibraryGetKernel(&k->kernel, k->lib, name)) != cudaSuccess)
        cudaLibraryUnload(k->lib);
    return e;
}

static void image_unload(fused_kernel *k)
{
    cudaLibraryUnload(k->lib);
}

/* PTX the driver cannot take (a driver older than NVRTC's PTX, no JIT): its groups replay */
static bool image_refused(cudaError_t e)
{
    return e == cudaErrorInvalidPtx || e == cudaErrorUnsupportedPtxVersion ||
           e == cudaErrorNoKernelImageForDevice || e == cudaErrorJitCompilerNotFound ||
           e == cudaErrorJitCompilationDisabled;
}

static cudaError_t kernel_launch(const fused_kernel *k, unsigned grid, void **args, cudaStream_t stream)
{
    return cudaLaunchKernel((const void *)k->kernel, (dim3){grid, 1, 1}, (dim3){KF_THREADS, 1, 1}, args, 0,
                            stream);
}
#endif

#define CACHE_BUCKETS 64

struct kiln__cuda_fused_cache {
    fused_kernel *bucket[CACHE_BUCKETS];
    uint64_t compiled; /* kernels compiled so far (a test reads it) */
};

static void kernel_free(fused_kernel *k)
{
    if (!k->failed)
        image_unload(k);
    free(k->key);
    free(k);
}

static fused_kernel *lookup(kiln_cuda_device *dev, const char *key, uint64_t h)
{
    if (!dev->fused_cache)
        return NULL;
    for (fused_kernel *k = dev->fused_cache->bucket[h % CACHE_BUCKETS]; k; k = k->next)
        if (k->hash == h && !strcmp(k->key, key))
            return k;
    return NULL;
}

/* ------------------------------------------------------------------ the disk cache */

#if !KILN_CUDA_HIP

/* The file is "<key>\n" then the PTX text. NULL when absent, of another key, or cut. */
static char *disk_read(const char *path, const char *key)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *all = NULL;
    long len = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) > 0 && len < (16L << 20) && fseek(f, 0, SEEK_SET) == 0 &&
        (all = malloc((size_t)len + 1)) && fread(all, 1, (size_t)len, f) == (size_t)len) {
        all[len] = '\0';
    } else {
        free(all);
        all = NULL;
    }
    fclose(f);
    size_t klen = strlen(key);
    if (!all || (size_t)len <= klen + 1 || memcmp(all, key, klen) != 0 || all[klen] != '\n' ||
        strlen(all) != (size_t)len || !strstr(all + klen + 1, ".entry ")) {
        free(all);
        return NULL;
    }
    memmove(all, all + klen + 1, (size_t)len - klen); /* the PTX and its terminator */
    return all;
}

static void disk_write(const char *path, const char *key, const char *ptx)
{
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return;
    bool ok = fprintf(f, "%s\n%s", key, ptx) > 0;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0)
        unlink(tmp);
}

char *kiln__cuda_fused_ptx(const kiln_fused_program *p, const char *key, const char *name, int major, int minor,
                           bool *from_disk, int *rc)
{
    *from_disk = false;
    char *src = kiln__cuda_fused_source(p, name, rc);
    if (!src)
        return NULL;
    /* named by the source (which holds the key and the generator's whole text), so a
     * changed generator never reads an old kernel */
    char dir[900], path[1000] = "";
    if (kiln__fused_cache_dir(dir, sizeof dir, true))
        snprintf(path, sizeof path, "%s/cuda-fused-%016llx-%d%d.ptx", dir,
                 (unsigned long long)kiln__fused_hash(src), major, minor);
    char *ptx = path[0] ? disk_read(path, key) : NULL;
    if (ptx) {
        *from_disk = true;
    } else if ((*rc = kiln__cuda_rtc_compile(src, name, major, minor, &ptx, NULL)) == 0 && path[0]) {
        disk_write(path, key, ptx);
    }
    free(src);
    return ptx;
}
#endif /* !KILN_CUDA_HIP */

/* The entry of a key whose kernel cannot be made here: said once on stderr, and its groups
 * replay from then on (a generator or toolchain problem, not the program's). NULL when out
 * of memory (the thread's error stays set). */
static fused_kernel *failed_entry(kiln_cuda_device *dev, const char *key, uint64_t h, const char *why)
{
    kiln__warn("fused on %s: %s; such groups run unfused", dev->name, why);
    fused_kernel *k = calloc(1, sizeof *k);
    if (!k || !(k->key = strdup(key))) {
        free(k);
        return NULL;
    }
    k->hash = h;
    k->failed = true;
    return k;
}

/* Compiles (or reads) and loads the kernel of key (a miss), outside the device lock. */
static fused_kernel *build(kiln_cuda_device *dev, const kiln_fused_program *p, const char *key, uint64_t h,
                           int *rc)
{
    char name[32];
    snprintf(name, sizeof name, "kf_%016llx", (unsigned long long)h);
    char *image = kernel_image(dev, p, key, name, rc);
    if (!image)
        return *rc == KILN_EINVAL ? failed_entry(dev, key, h, kiln_error()) : NULL;
    fused_kernel *k = calloc(1, sizeof *k);
    if (!k || !(k->key = strdup(key))) {
        free(k);
        free(image);
        *rc = kiln__error_set("fused on %s: out of memory", dev->name);
        return NULL;
    }
    k->hash = h;
    cudaError_t e = image_load(k, image, name);
    free(image);
    if (e == cudaSuccess)
        return k;
    free(k->key);
    free(k);
    if (image_refused(e)) {
        cudaGetLastError(); /* not sticky: clear it */
        char why[200];
        snprintf(why, sizeof why, "the driver cannot load the generated kernel (%s)", cudaGetErrorString(e));
        return failed_entry(dev, key, h, why);
    }
    *rc = kiln__cuda_fail(dev, e, "fused (loading a generated kernel)");
    return NULL;
}

static fused_kernel *kernel_for(kiln_cuda_device *dev, const kiln_fused_program *p, int *rc)
{
    char key[4096];
    kiln__fused_codegen_key(p, key, sizeof key);
    if (strlen(key) >= sizeof key - 1) {
        *rc = KILN_ENOTSUP; /* a key this long may be truncated: never cached under it */
        return NULL;
    }
    uint64_t h = kiln__fused_hash(key);
    pthread_mutex_lock(&dev->mu);
    fused_kernel *k = lookup(dev, key, h);
    pthread_mutex_unlock(&dev->mu);
    if (k && k->failed)
        *rc = KILN_ENOTSUP;
    if (k)
        return k->failed ? NULL : k;
    fused_kernel *fresh = build(dev, p, key, h, rc);
    if (!fresh)
        return NULL;
    pthread_mutex_lock(&dev->mu);
    if (!dev->fused_cache && !(dev->fused_cache = calloc(1, sizeof *dev->fused_cache))) {
        pthread_mutex_unlock(&dev->mu);
        kernel_free(fresh);
        *rc = kiln__error_set("fused on %s: out of memory", dev->name);
        return NULL;
    }
    k = lookup(dev, key, h);
    if (!k) {
        fused_kernel **head = &dev->fused_cache->bucket[h % CACHE_BUCKETS];
        fresh->next = *head;
        *head = k = fresh;
        dev->fused_cache->compiled++;
        fresh = NULL;
    }
    pthread_mutex_unlock(&dev->mu);
    if (fresh) /* another thread inserted the same key meanwhile */
        kernel_free(fresh);
    if (k->failed) {
        *rc = KILN_ENOTSUP;
        return NULL;
    }
    return k;
}

void kiln__cuda_fused_fini(void *vdev)
{
    kiln_cuda_device *dev = vdev;
    if (!dev->fused_cache)
        return;
    for (int b = 0; b < CACHE_BUCKETS; b++) {
        for (fused_kernel *k = dev->fused_cache->bucket[b], *next; k; k = next) {
            next = k->next;
            kernel_free(k);
        }
    }
    free(dev->fused_cache);
    dev->fused_cache = NULL;
}

/* ------------------------------------------------------------------ run */

static const size_t elem_size[KILN_DTYPE_COUNT] = {4, 8, 2, 2, 8, 4, 1, 1};

int kiln__cuda_fused_run(void *vq, const kiln_fused_program *p)
{
    kiln_cuda_queue *q = vq;
    if (kiln__fused_codegen_check(p, INT64_MAX / 2) < 0)
        return KILN_ENOTSUP;
    int rc = kiln__cuda_enter(q->dev, "fused");
    if (rc)
        return rc;
    if (p->n == 0)
        return 0;
    fused_kernel *k = kernel_for(q->dev, p, &rc);
    if (!k)
        return rc;
    kf_params P;
    memset(&P, 0, sizeof P);
    for (int i = 0; i < p->ninputs; i++) {
        const kiln_tdesc *d = &p->inputs[i];
        P.in[i] = (const char *)d->buf->blk->ptr + (size_t)d->offset * elem_size[d->dtype];
        P.nd[i] = d->ndim;
        for (int dim = 0; dim < d->ndim; dim++) {
            P.shape[i][dim] = d->shape[dim];
            P.stride[i][dim] = d->strides[dim];
        }
    }
    for (int i = 0; i < p->noutputs; i++)
        P.out[i] = kiln__cuda_ptr(&p->outputs[i]);
    P.n = p->n;
    P.inner = p->reduce_inner;
    for (int i = 0; i < p->ninstrs; i++) {
        P.k[2 * i] = (float)p->instrs[i].alpha;
        P.k[2 * i + 1] = (float)p->instrs[i].beta;
    }
    int64_t work = p->reduce_inner > 0 ? p->n / p->reduce_inner : (p->n + KF_THREADS - 1) / KF_THREADS;
    unsigned grid = work < 1 ? 1u : work > (1 << 20) ? (1u << 20) : (unsigned)work;
    void *args[] = {&P};
    return kiln__cuda_check(q, kernel_launch(k, grid, args, q->stream), "fused");
}
