/*
 * api/tensor-devices.h — the devices remote tensor sessions may name (tensor-devices.c).
 */
#ifndef KD_TENSOR_DEVICES_H
#define KD_TENSOR_DEVICES_H

#include <stdbool.h>
#include <stddef.h>

#include "kiln/kiln.h"
#include "wire.h"

/* A device sessions may name: one the workers drive, configured without options. */
struct kd_offered_device {
    const char *spec;                  /* as configured: what kd_sched_worker_for takes */
    kiln_device *dev;                  /* the workers' handle: the device's identity */
    char name[KILN_WIRE_NAME_MAX + 1]; /* kiln_device_name: what WELCOME lists */
    char key[KILN_WIRE_NAME_MAX + 1];  /* the name with its indices as kiln_device_open reads them */
};

struct kd_offered_devices {
    struct kd_offered_device *v;
    size_t n, cap;
};

/** Room for cap devices; 0, or -1 out of memory. */
int kd_offered_init(struct kd_offered_devices *set, size_t cap);
void kd_offered_free(struct kd_offered_devices *set);
/** kd_sched_each_device's callback, ctx the set: offers dev unless its spec carries options
 *  or its name cannot travel in a HELLO. */
void kd_offered_add(void *ctx, const char *spec, kiln_device *dev);
/** The offered device a HELLO's name means (the same device once opened), or NULL. */
const struct kd_offered_device *kd_offered_named(const struct kd_offered_devices *set, const char *name);

#endif /* KD_TENSOR_DEVICES_H */
