/*
 * backends/cuda/cuda-libs.c — loading cuBLASLt, cuDNN and NVRTC at run time (cuda-libs.h).
 *
 * Each library is opened by the soname of the major version the backend was compiled
 * against (the headers say which) through the loader's search path, then from the lib
 * folder of the toolkit it was built with (KILN_CUDA_LIBDIR: where a linked library was
 * found before, through libkiln's run path), and every function the backend calls is looked
 * up once. A library stays loaded for the life of the process: the tables point into it, and
 * a device may open again later. A failed load leaves the table untouched, is reported with
 * the library's name and dlerror's reason, and is tried again at the next open (the user
 * may have fixed LD_LIBRARY_PATH in between, for a long-running program that cannot).
 *
 * A HIP build loads libhipblaslt.so.0 and libMIOpen.so.1 (ROCm 6's sonames; the ABI
 * vendor-hip-libs.h declares) and hipRTC: libhiprtc.so.<HIP major> where ROCm
 * ships it apart (5.3 and later), else the HIP runtime itself, which carried it before.
 */
#define KILN_CUDA_LIBS_IMPL
#include "cuda-libs.h"

#if KILN_CUDA_HIP
#include "vendor-hip-host.h"
#else
#include <cuda_runtime_api.h>
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "error-impl.h"

#define STR_(x) #x
#define STR(x) STR_(x)

kiln_cuda_lt_api kiln__cuda_lt_api;
kiln_cuda_nvrtc_api kiln__cuda_nvrtc_api;
#if KILN_CUDA_CUDNN
kiln_cuda_dnn_api kiln__cuda_dnn_api;
#endif

/* Guards the tables while they are written and the loaded bits; a table is read without
 * it only after its bit was set under it (the load happens before the device or the
 * generated kernel that calls through it exists). */
static pthread_mutex_t libs_mu = PTHREAD_MUTEX_INITIALIZER;
static int libs_loaded;

int kiln__cuda_lib_open(const char *soname, const char *const *names, void **fns, int n, const char *who)
{
    if (n > 64)
        return kiln__error_set("%s: %d functions of %s asked, at most 64", who, n, soname);
    void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        char why[256];
        const char *e = dlerror();
        snprintf(why, sizeof why, "%s", e ? e : "not found");
#ifdef KILN_CUDA_LIBDIR
        char path[512];
        snprintf(path, sizeof path, "%s/%s", KILN_CUDA_LIBDIR, soname);
        if (!strchr(soname, '/'))
            h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
#endif
        if (!h)
            return kiln__error_set("%s: cannot load %s (%s); install it or put its folder on LD_LIBRARY_PATH", who,
                                   soname, why);
    }
    void *found[64];
    for (int i = 0; i < n; i++) {
        dlerror();
        found[i] = dlsym(h, names[i]);
        if (!found[i]) {
            const char *why = dlerror();
            kiln__error_set("%s: %s lacks %s (%s): a different version than the one kiln was built for?", who,
                            soname, names[i], why ? why : "no such symbol");
            dlclose(h);
            return -1;
        }
    }
    for (int i = 0; i < n; i++)
        fns[i] = found[i];
    return 0; /* h stays open: the table points into it */
}

#define NAME_OF(f) #f,

static int load_lt(const char *who)
{
    static const char *const names[] = {KILN_CUDA_LT_FNS(NAME_OF)};
    _Static_assert(sizeof names / sizeof *names == sizeof(kiln_cuda_lt_api) / sizeof(void *),
                   "one name per cuBLASLt (hipBLASLt) pointer");
#if KILN_CUDA_HIP
    const char *soname = "libhipblaslt.so.0";
#else
    const char *soname = "libcublasLt.so." STR(CUBLAS_VER_MAJOR);
#endif
    return kiln__cuda_lib_open(soname, names, (void **)&kiln__cuda_lt_api, (int)(sizeof names / sizeof *names),
                               who);
}

static int load_nvrtc(const char *who)
{
    static const char *const names[] = {KILN_CUDA_NVRTC_FNS(NAME_OF)};
    _Static_assert(sizeof names / sizeof *names == sizeof(kiln_cuda_nvrtc_api) / sizeof(void *),
                   "one name per NVRTC (hipRTC) pointer");
    char soname[32];
#if KILN_CUDA_HIP
    snprintf(soname, sizeof soname, "libhiprtc.so.%d", HIP_VERSION_MAJOR);
    if (kiln__cuda_lib_open(soname, names, (void **)&kiln__cuda_nvrtc_api, (int)(sizeof names / sizeof *names),
                            who) == 0)
        return 0;
    snprintf(soname, sizeof soname, "libamdhip64.so.%d", HIP_VERSION_MAJOR);
#else
    snprintf(soname, sizeof soname, "libnvrtc.so.%d", CUDART_VERSION / 1000);
#endif
    return kiln__cuda_lib_open(soname, names, (void **)&kiln__cuda_nvrtc_api, (int)(sizeof names / sizeof *names),
                               who);
}

#if KILN_CUDA_CUDNN
static int load_dnn(const char *who)
{
    static const char *const names[] = {KILN_CUDA_DNN_FNS(NAME_OF)};
    _Static_assert(sizeof names / sizeof *names == sizeof(kiln_cuda_dnn_api) / sizeof(void *),
                   "one name per cuDNN (MIOpen) pointer");
#if KILN_CUDA_HIP
    const char *soname = "libMIOpen.so.1";
#else
    const char *soname = "libcudnn.so." STR(CUDNN_MAJOR);
#endif
    return kiln__cuda_lib_open(soname, names, (void **)&kiln__cuda_dnn_api, (int)(sizeof names / sizeof *names),
                               who);
}
#endif

int kiln__cuda_libs_load(int which, const char *who)
{
#if !KILN_CUDA_CUDNN
    which &= ~KILN_CUDA_LIB_DNN;
#endif
    pthread_mutex_lock(&libs_mu);
    int rc = 0;
    if ((which & KILN_CUDA_LIB_LT) && !(libs_loaded & KILN_CUDA_LIB_LT)) {
        rc = load_lt(who);
        if (rc == 0)
            libs_loaded |= KILN_CUDA_LIB_LT;
    }
#if KILN_CUDA_CUDNN
    if (rc == 0 && (which & KILN_CUDA_LIB_DNN) && !(libs_loaded & KILN_CUDA_LIB_DNN)) {
        rc = load_dnn(who);
        if (rc == 0)
            libs_loaded |= KILN_CUDA_LIB_DNN;
    }
#endif
    if (rc == 0 && (which & KILN_CUDA_LIB_NVRTC) && !(libs_loaded & KILN_CUDA_LIB_NVRTC)) {
        rc = load_nvrtc(who);
        if (rc == 0)
            libs_loaded |= KILN_CUDA_LIB_NVRTC;
    }
    pthread_mutex_unlock(&libs_mu);
    return rc < 0 ? -1 : 0;
}
