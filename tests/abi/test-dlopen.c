/*
 * tests/abi/test-dlopen.c — libkiln loaded with dlopen after the program started, as a
 * Python binding or a plugin host loads it.
 *
 * libkiln's per-op thread-locals use the initial-exec TLS model (common/tls-impl.h),
 * which a library loaded late can only have while they fit in the static TLS surplus
 * glibc keeps. This program proves the load succeeds, and that ops (which read those
 * variables: scopes, queue bindings, the record cache, the pool's worker flag) give the
 * right values on the main thread and on a thread started after the load.
 *
 * Usage: test-dlopen PATH-TO-libkiln.so
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kiln/tensor.h"

typedef struct api {
    __typeof__(kiln_device_open) *device_open;
    __typeof__(kiln_device_close) *device_close;
    __typeof__(kiln_from_data) *from_data;
    __typeof__(kiln_add) *add;
    __typeof__(kiln_sum) *sum;
    __typeof__(kiln_to_data) *to_data;
    __typeof__(kiln_scope_begin) *scope_begin;
    __typeof__(kiln_scope_end) *scope_end;
    __typeof__(kiln_error) *error;
} api;

/* sum(x + x) over 1..n on the cpu device, inside a scope: n(n+1). */
static bool sum_twice(const api *k, int n, double *got)
{
    kiln_device *dev = k->device_open("cpu");
    if (!dev) {
        fprintf(stderr, "device_open: %s\n", k->error());
        return false;
    }
    float host[4096];
    for (int i = 0; i < n; i++)
        host[i] = (float)(i + 1);
    k->scope_begin();
    kiln_tensor *x = k->from_data(dev, KILN_F32, 1, (int64_t[]){n}, host, (size_t)n * sizeof *host);
    kiln_tensor *s = k->sum(k->add(x, x), KILN_ALL_DIMS, false);
    float out = 0;
    bool ok = s && k->to_data(s, &out, sizeof out) == 0;
    if (!ok)
        fprintf(stderr, "ops: %s\n", k->error());
    k->scope_end();
    k->device_close(dev);
    *got = out;
    return ok;
}

typedef struct job {
    const api *k;
    bool ok;
    double got;
} job;

static void *on_thread(void *arg)
{
    job *j = arg;
    j->ok = sum_twice(j->k, 4096, &j->got);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH-TO-libkiln.so\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    api k;
    void **slots[] = {(void **)&k.device_open, (void **)&k.device_close, (void **)&k.from_data,
                      (void **)&k.add,         (void **)&k.sum,          (void **)&k.to_data,
                      (void **)&k.scope_begin, (void **)&k.scope_end,    (void **)&k.error};
    const char *names[] = {"kiln_device_open", "kiln_device_close", "kiln_from_data", "kiln_add",  "kiln_sum",
                           "kiln_to_data",     "kiln_scope_begin",  "kiln_scope_end", "kiln_error"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        *slots[i] = dlsym(lib, names[i]);
        if (!*slots[i]) {
            fprintf(stderr, "dlsym %s: %s\n", names[i], dlerror());
            return 1;
        }
    }
    double main_sum = 0;
    if (!sum_twice(&k, 100, &main_sum) || main_sum != 100.0 * 101.0) {
        fprintf(stderr, "main thread: sum %.1f, want %.1f\n", main_sum, 100.0 * 101.0);
        return 1;
    }
    job j = {.k = &k};
    pthread_t t;
    if (pthread_create(&t, NULL, on_thread, &j) != 0 || pthread_join(t, NULL) != 0) {
        fprintf(stderr, "pthread_create failed\n");
        return 1;
    }
    if (!j.ok || j.got != 4096.0 * 4097.0) {
        fprintf(stderr, "second thread: sum %.1f, want %.1f\n", j.got, 4096.0 * 4097.0);
        return 1;
    }
    printf("dlopen: ok (sums %.0f and %.0f)\n", main_sum, j.got);
    return 0;
}
