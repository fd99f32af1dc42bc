/*
 * engine/autotune-impl.h — the autotune cache's internal interface (engine/autotune.c):
 * for backends that time their kernel choices once per shape class.
 */
#ifndef KILN_AUTOTUNE_IMPL_H
#define KILN_AUTOTUNE_IMPL_H

#include <stdbool.h>
#include <stdint.h>

/** The value stored for (device, key) into *value: 1 when there is one, else 0.
 *  device names the device and its driver, key the kernel and shape class; neither holds
 *  a tab or a newline. */
int kiln__autotune_lookup(const char *device, const char *key, int64_t *value);
/** Record the winner (value > 0) for (device, key), persisted when a folder is set. */
void kiln__autotune_store(const char *device, const char *key, int64_t value);

#endif /* KILN_AUTOTUNE_IMPL_H */
