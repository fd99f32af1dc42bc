/*
 * api/tensor-devices.c — the devices a remote tensor session may name in its HELLO: the ones
 * the workers drive, configured without options, matched by device identity rather than by
 * spelling ("cpu" and "cpu:0" are one device).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor-devices.h"
#include "wire.h"

int kd_offered_init(struct kd_offered_devices *set, size_t cap)
{
    set->v = calloc(cap ? cap : 1, sizeof *set->v);
    set->n = 0;
    set->cap = set->v ? cap : 0;
    return set->v ? 0 : -1;
}

void kd_offered_free(struct kd_offered_devices *set)
{
    free(set->v);
    set->v = NULL;
    set->n = set->cap = 0;
}

/*
 * name with every device index written as kiln_device_open reads it: a ":0" index dropped (for
 * the backends it counts, "vulkan" is "vulkan:0"; for the others, "cpu:0" is "cpu") and leading
 * zeros gone ("cuda:01" is "cuda:1"). Two names with one key name one device once opened; an
 * index too long to be one is kept as written (and so matches nothing).
 */
static void name_key(const char *name, char *key, size_t n)
{
    size_t used = 0;
    key[0] = '\0';
    for (const char *part = name;; part += strcspn(part, ":") + 1) {
        size_t len = strcspn(part, ":"), digits = strspn(part, "0123456789");
        if (part != name && digits == len && len > 0 && len <= 9) {
            long index = strtol(part, NULL, 10);
            if (index != 0)
                used += (size_t)snprintf(key + used, n - used, ":%ld", index);
        } else {
            used += (size_t)snprintf(key + used, n - used, "%s%.*s", part == name ? "" : ":", (int)len, part);
        }
        if (used >= n) {
            snprintf(key, n, "%s", name); /* cannot happen for a wire name; compare as written */
            return;
        }
        if (!part[len])
            return;
    }
}

/* Whether a HELLO can carry name: the protocol's own rule, by a HELLO encoded and decoded. */
static bool wire_name_ok(const char *name)
{
    if (strlen(name) > KILN_WIRE_NAME_MAX)
        return false;
    kiln_wire_msg m = {.h = {.version = KILN_WIRE_VERSION_MAX, .type = KILN_WIRE_HELLO}}, back;
    m.u.hello.min_version = m.u.hello.max_version = KILN_WIRE_VERSION_MAX;
    strcpy(m.u.hello.device, name);
    kiln_wire_buf b = {0};
    size_t used;
    char why[96];
    bool ok = kiln_wire_encode(&b, &m, why, sizeof why) == 0 &&
              kiln_wire_decode(b.p, b.len, 0, &back, &used, why, sizeof why) == 0;
    kiln_wire_buf_free(&b);
    return ok;
}

/*
 * kd_sched_each_device's callback (ctx: the set): offers a device the workers drive to sessions unless its spec
 * carries options (cpu?threads=2): a HELLO's name carries none, and a session asking for "cpu"
 * gets what kiln_device_open("cpu") gives here, never a device configured otherwise. Remote
 * devices (remote://...) are not offered either; neither can be named on the wire.
 */
void kd_offered_add(void *ctx, const char *spec, kiln_device *dev)
{
    struct kd_offered_devices *set = ctx;
    const char *name = kiln_device_name(dev);
    if (!wire_name_ok(name) || set->n >= set->cap)
        return;
    struct kd_offered_device *od = &set->v[set->n++];
    od->spec = spec;
    od->dev = dev;
    snprintf(od->name, sizeof od->name, "%s", name);
    name_key(name, od->key, sizeof od->key);
}

/*
 * The offered device a HELLO names, or NULL. Compared as devices, not strings: "cpu" and "cpu:0",
 * "vulkan" and "vulkan:0" are one. The keys pick the candidate without opening anything on a
 * client's say-so; the library has the last word: opening a spec whose device is open already
 * hands back that same device (the options in effect included), so only the same handle counts.
 */
const struct kd_offered_device *kd_offered_named(const struct kd_offered_devices *set, const char *name)
{
    char key[KILN_WIRE_NAME_MAX + 1];
    name_key(name, key, sizeof key);
    for (size_t i = 0; i < set->n; i++) {
        if (strcmp(set->v[i].key, key) != 0)
            continue;
        kiln_device *dev = kiln_device_open(name);
        bool same = dev == set->v[i].dev;
        if (dev)
            kiln_device_close(dev);
        if (same)
            return &set->v[i];
    }
    return NULL;
}
