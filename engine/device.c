/*
 * engine/device.c — opening devices by spec and the process-wide device registry.
 *
 * A spec names a backend and an index ("cpu", "cuda:1", "remote://host:port/cpu"). The
 * registry makes a spec map to one handle, so two parts of a program that open "cpu"
 * share its buffers and thread pool. Every storage holds a device reference, which is
 * why closing a device while tensors live is safe: the backend is closed when the last
 * reference of either kind goes.
 *
 * A spec may carry options ("cpu?threads=2", engine/device-opts.c) and may name a
 * decorator around another spec ("counting:cpu"). Two opens share a handle when they
 * asked for the same canonical spec (options sorted) and the options in effect (the
 * spec's over kiln_device_defaults_set's and the environment's, at each open) are the
 * same: a program that changes a default and reopens gets a device opened with it, and
 * a bad default is refused then. The name (kiln_device_name) is the canonical spec as
 * asked for, with secrets (a remote token) shown as "***"; the registry's key keeps them,
 * so opens with two different tokens never share a session.
 *
 * Backends are found through their registration functions. They are referenced weakly
 * so that a build leaving a backend out still links and reports the backend as absent
 * with a clear message instead of failing at link time.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "remote/remote-spec.h"
#include "tensor-impl.h"

#pragma weak kiln_backend_ref
#pragma weak kiln_backend_cpu
/* Registration functions of backends that may be added later; absent ones resolve to NULL. */
const kiln_backend_iface *kiln_backend_cuda(void) __attribute__((weak));
const kiln_backend_iface *kiln_backend_vulkan(void) __attribute__((weak));
const kiln_backend_iface *kiln_backend_hip(void) __attribute__((weak));
const kiln_backend_iface *kiln_backend_remote(void) __attribute__((weak));
const kiln_backend_iface *kiln_backend_counting(void) __attribute__((weak));
const kiln_backend_iface *kiln_backend_fused(void) __attribute__((weak));

typedef const kiln_backend_iface *(*backend_getter)(void);

typedef struct backend_entry {
    const char *name;
    bool indexed;  /* takes ":N" */
} backend_entry;

static const backend_entry known_backends[] = {
    {"cpu", false}, {"ref", false}, {"cuda", true}, {"vulkan", true}, {"hip", true}, {"remote", false},
};
#define NBACKENDS (sizeof known_backends / sizeof known_backends[0])

static backend_getter getter_of(size_t i)
{
    /* A switch rather than a table of addresses: taking the address of an undefined
     * weak function is fine, but keeping it in one place reads more plainly. */
    switch (i) {
    case 0: return kiln_backend_cpu;
    case 1: return kiln_backend_ref;
    case 2: return kiln_backend_cuda;
    case 3: return kiln_backend_vulkan;
    case 4: return kiln_backend_hip;
    case 5: return kiln_backend_remote;
    default: return NULL;
    }
}

/* The open devices, each under its key: the canonical spec as asked for, secrets in full,
 * then the spec actually opened and every option in effect (kiln_device_open_opts). The
 * key lives here rather than in the device, which holds the name that may be shown. */
typedef struct registry_entry {
    kiln_device *dev;
    struct registry_entry *next;
    char key[];
} registry_entry;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static registry_entry *registry;

static pthread_once_t compiled_once = PTHREAD_ONCE_INIT;
static char compiled_names[128];

static void compute_compiled(void)
{
    size_t used = 0;
    compiled_names[0] = '\0';
    for (size_t i = 0; i < NBACKENDS; i++) {
        backend_getter g = getter_of(i);
        if (!g || !g())
            continue;
        int n = snprintf(compiled_names + used, sizeof compiled_names - used, "%s%s",
                         used ? " " : "", known_backends[i].name);
        if (n < 0 || (size_t)n >= sizeof compiled_names - used)
            break;
        used += (size_t)n;
    }
}

int kiln_device_list(kiln_device_info *out, int max)
{
    if (max < 0 || (max > 0 && !out))
        return kiln__error_set("kiln_device_list: out is NULL or max (%d) is negative", max);
    int total = 0;
    for (size_t i = 0; i < NBACKENDS; i++) {
        backend_getter g = getter_of(i);
        const kiln_backend_iface *be = g ? g() : NULL;
        if (!be || !be->list)
            continue;
        int room = max > total ? max - total : 0;
        int n = be->list(room ? out + total : NULL, room);
        if (n < 0)
            return -1;
        total += n;
    }
    return total;
}

const char *kiln_backends_compiled(void)
{
    pthread_once(&compiled_once, compute_compiled);
    return compiled_names;
}

/* Parse a spec into a backend slot, an index and the canonical spelling. */
static int parse_spec(const char *spec, size_t *slot, int *index, char *canon, size_t canon_len)
{
    static const char usage[] = "expected cpu, ref, cuda:N, vulkan:N, hip:N or remote://host:port/device, "
                                "or a decorator around one: counting:SPEC, fused:SPEC";
    if (strncmp(spec, "remote://", 9) == 0) {
        kiln_remote_addr addr;
        char why[200];
        if (kiln_remote_spec_parse(spec, &addr, why, sizeof why) != 0)
            return kiln__error_set("kiln_device_open: malformed remote spec '%s': %s", spec, why);
        if (strlen(spec) >= canon_len)
            return kiln__error_set("kiln_device_open: spec too long");
        *slot = 5;
        *index = 0;
        snprintf(canon, canon_len, "%s", spec);
        return 0;
    }
    for (size_t i = 0; i < NBACKENDS - 1; i++) {
        const char *name = known_backends[i].name;
        size_t n = strlen(name);
        if (strncmp(spec, name, n) != 0)
            continue;
        const char *rest = spec + n;
        long idx = 0;
        if (*rest == ':') {
            char *end = NULL;
            errno = 0;
            idx = strtol(rest + 1, &end, 10);
            if (rest[1] < '0' || rest[1] > '9' || *end != '\0' || errno || idx > 1024)
                return kiln__error_set("kiln_device_open: bad device index in '%s' (%s)", spec, usage);
        } else if (*rest != '\0') {
            continue;
        }
        if (!known_backends[i].indexed && idx != 0)
            return kiln__error_set("kiln_device_open: backend '%s' has only device 0 ('%s')", name, spec);
        *slot = i;
        *index = (int)idx;
        if (known_backends[i].indexed)
            snprintf(canon, canon_len, "%s:%ld", name, idx);
        else
            snprintf(canon, canon_len, "%s", name);
        return 0;
    }
    return kiln__error_set("kiln_device_open: unknown device spec '%s' (%s)", spec, usage);
}

/* The backend slots of the decorators "counting:INNER" and "fused:INNER", after INNER's
 * spec checked. */
#define COUNTING_SLOT NBACKENDS
#define FUSED_SLOT (NBACKENDS + 1)

static const kiln_backend_iface *backend_of(size_t slot)
{
    if (slot == COUNTING_SLOT)
        return kiln_backend_counting ? kiln_backend_counting() : NULL;
    if (slot == FUSED_SLOT)
        return kiln_backend_fused ? kiln_backend_fused() : NULL;
    backend_getter g = getter_of(slot);
    return g ? g() : NULL;
}

static const char *backend_name_of(size_t slot)
{
    return slot == COUNTING_SLOT ? "counting" : slot == FUSED_SLOT ? "fused" : known_backends[slot].name;
}

bool kiln__backend_name_known(const char *name)
{
    for (size_t slot = 0; slot <= FUSED_SLOT; slot++)
        if (!strcmp(name, backend_name_of(slot)))
            return true;
    return false;
}

/* spec (without options) into its slot, index and canonical spelling; "counting:" and
 * "fused:" wrap any other spec, decorators included. */
static int parse_any(const char *spec, size_t *slot, int *index, char *canon, size_t canon_len)
{
    static const char *const decorators[] = {"counting:", "fused:"};
    for (size_t k = 0; k < 2; k++) {
        size_t n = strlen(decorators[k]);
        if (strncmp(spec, decorators[k], n) != 0)
            continue;
        size_t inner_slot;
        char inner[KILN_SPEC_MAX];
        if (spec[n] == '\0')
            return kiln__error_set("kiln_device_open: decorator '%s' needs a device spec after it (%scpu)",
                                   decorators[k], decorators[k]);
        if (parse_any(spec + n, &inner_slot, index, inner, sizeof inner) < 0)
            return -1;
        *slot = k == 0 ? COUNTING_SLOT : FUSED_SLOT;
        if ((size_t)snprintf(canon, canon_len, "%s%s", decorators[k], inner) >= canon_len)
            return kiln__error_set("kiln_device_open: spec too long");
        return 0;
    }
    return parse_spec(spec, slot, index, canon, canon_len);
}

/* Where fusion=on is the default: the backends on which every measured row gained or
 * held (docs/performance.md, "Automatic kernel fusion"). vulkan: generated kernels, on
 * lavapipe the elementwise chains 8-24x, a training step 1.44x, no row slower beyond
 * noise, and on an H100 through NVIDIA's driver the chains 1.19x and 1.74x. Only where
 * the backend was built with its generator (fused_run): without it the decorator would
 * replay every group op by op, an indirection that buys nothing. Not cpu (large chains
 * gain 2-4.5x, but the decorator's per-call cost makes small models 17% slower). cuda:
 * on an H100 the elementwise chains 1.9-3.6x, the CNN and Transformer training steps 1.09x
 * and 1.16x, BERT 1.25x at batch 1 and 1.33x at batch 8 (CUDA graphs record the fused
 * kernels); on an H200 BERT 1.25x and 1.39x while ResNet-50 held (1.00x at batch 1 and 64).
 * An earlier ResNet-50 loss fused on an H100 (2.59 -> 3.49 ms), measured while each process
 * timed its own cuDNN algorithms, did not recur once the choices persist in the autotune
 * file and both runs use the same convolutions. */
static const char *fusion_default(size_t slot)
{
    const kiln_backend_iface *be = backend_of(slot);
    const char *name = backend_name_of(slot);
    return (!strcmp(name, "vulkan") || !strcmp(name, "cuda")) && be && be->fused_run ? "on" : NULL;
}

/* The backends a canonical spec opens, outermost first ("counting:fused:cpu": counting,
 * fused, cpu), as slots; how many (at most max). */
static int chain_of(const char *canon, size_t *slots, int max)
{
    int n = 0;
    while (n < max) {
        if (strncmp(canon, "counting:", 9) == 0) {
            slots[n++] = COUNTING_SLOT;
            canon += 9;
        } else if (strncmp(canon, "fused:", 6) == 0) {
            slots[n++] = FUSED_SLOT;
            canon += 6;
        } else {
            for (size_t i = 0; i < NBACKENDS; i++) {
                size_t len = strlen(known_backends[i].name);
                if (strncmp(canon, known_backends[i].name, len) == 0 &&
                    (canon[len] == '\0' || canon[len] == ':')) {
                    slots[n++] = i;
                    break;
                }
            }
            break;
        }
    }
    return n;
}

#define CHAIN_MAX 32 /* decorators nest at most KILN_SPEC_MAX / strlen("fused:") deep */

static bool chain_has(const char *canon, size_t slot)
{
    size_t chain[CHAIN_MAX];
    int n = chain_of(canon, chain, CHAIN_MAX);
    for (int i = 0; i < n; i++)
        if (chain[i] == slot)
            return true;
    return false;
}

/* The option fusion=on|off (spec, options, KILN_<BACKEND>_FUSION, then the backend's
 * default): on opens the device through the fused decorator (slot and canon become its),
 * while the device keeps the name it was asked for. The engine consumes the key for every
 * backend, so none of them refuses it. A spec that names the decorator ("fused:cpu") and
 * turns fusion off contradicts itself and is refused rather than guessed at. */
static int apply_fusion_option(const kiln_device_opts *given, size_t *slot, char *canon, size_t canon_len)
{
    /* the defaults and variable of the backend at the bottom of a decorated spec: KILN_CPU_FUSION
     * is about cpu devices, "counting:cpu" among them, as "counting:cpu?fusion=on" is */
    size_t chain[CHAIN_MAX];
    int depth = chain_of(canon, chain, CHAIN_MAX);
    kiln_device_opts all = *given;
    if (kiln__device_opts_env(backend_name_of(depth > 0 ? chain[depth - 1] : *slot), &all) < 0)
        return -1;
    const char *src = NULL;
    const char *v = kiln__device_opts_take(&all, "fusion", &src);
    if (!v && (v = fusion_default(*slot)) != NULL)
        src = "the backend's default";
    if (v && strcmp(v, "on") && strcmp(v, "off"))
        return kiln__error_set("option fusion (from %s) must be on or off, not '%s'", src, v);
    bool decorated = chain_has(canon, FUSED_SLOT);
    if (v && !strcmp(v, "off") && decorated)
        return kiln__error_set("'%s' names the fusion decorator while option fusion=off (from %s) turns fusion "
                               "off; drop one of them",
                               canon, src);
    if (!v || !strcmp(v, "off") || decorated)
        return 0;
    char inner[KILN_SPEC_MAX];
    snprintf(inner, sizeof inner, "%s", canon);
    if ((size_t)snprintf(canon, canon_len, "fused:%s", inner) >= canon_len)
        return kiln__error_set("spec too long");
    *slot = FUSED_SLOT;
    return 0;
}

/* The fusion decorator's own options (backends/fused) reaching a backend opened without it.
 * From the defaults or the environment they are meant for that backend's fused devices and do
 * not apply to this one (one opened with fusion=off); given with this device (spec or options)
 * they would be ignored, so they are refused saying why. */
static int decorator_only_options(const char *name, kiln_device_opts *o)
{
    static const char *const keys[] = {"codegen", "min_elements"};
    for (int i = 0; i < o->n; i++) {
        bool decorator = false;
        for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
            decorator = decorator || !strcmp(o->kv[i].key, keys[k]);
        if (!decorator || o->kv[i].used)
            continue;
        if (!strcmp(o->kv[i].source, "spec") || !strcmp(o->kv[i].source, "options"))
            return kiln__error_set_code(KILN_EINVAL,
                                        "option %s (from %s) belongs to the fusion decorator, "
                                        "and this %s device opens without fusion; drop it or add fusion=on",
                                        o->kv[i].key, o->kv[i].source, name);
        o->kv[i].used = true;
    }
    return 0;
}

/* Open backend be on spec/index with opts; checks that every option was used. */
static void *open_backend(const kiln_backend_iface *be, const char *name, const char *canon, int index,
                          kiln_device_opts *opts)
{
    if (kiln__device_opts_env(name, opts) < 0)
        return NULL;
    (void)kiln__device_opts_take(opts, "fusion", NULL); /* the engine's: apply_fusion_option */
    /* decorators pass what they do not use to the device below: the backend at the bottom judges */
    if (be != backend_of(FUSED_SLOT) && be != backend_of(COUNTING_SLOT) && decorator_only_options(name, opts) < 0)
        return NULL;
    void *ctx = NULL;
    if (be->open_opts) {
        ctx = be->open_opts(canon, index, opts);
    } else {
        /* a backend without options: anything given is unknown to it */
        if (kiln__device_opts_check_used(name, opts) < 0)
            return NULL;
        ctx = be->open_spec ? be->open_spec(canon) : be->open ? be->open(index) : NULL;
    }
    if (ctx && kiln__device_opts_check_used(name, opts) < 0) {
        char why[KILN_ERROR_MAX];
        snprintf(why, sizeof why, "%s", kiln_error());
        if (be->close)
            be->close(ctx);
        kiln__error_set("%s", why);
        return NULL;
    }
    return ctx;
}

void *kiln__backend_open(const char *spec, kiln_device_opts *o, const kiln_backend_iface **out_be)
{
    size_t slot = 0;
    int index = 0;
    char canon[KILN_SPEC_MAX];
    if (parse_any(spec, &slot, &index, canon, sizeof canon) < 0)
        return NULL;
    const kiln_backend_iface *be = backend_of(slot);
    if (!be) {
        kiln__error_set("backend '%s' is not compiled into this build (compiled: %s)", backend_name_of(slot),
                        kiln_backends_compiled());
        return NULL;
    }
    *out_be = be;
    return open_backend(be, backend_name_of(slot), canon, index, o);
}

kiln_device *kiln_device_open(const char *spec)
{
    return kiln_device_open_opts(spec, NULL);
}

/* Options whose values are secrets: shown as "***" in a device's name, so that neither
 * kiln_device_name nor a message that names the device (logs) carries them. */
static const char *const secret_options[] = {"token"};

static bool is_secret(const char *key)
{
    for (size_t i = 0; i < sizeof secret_options / sizeof *secret_options; i++)
        if (!strcmp(key, secret_options[i]))
            return true;
    return false;
}

char *kiln_device_spec_redact(const char *spec, char *out, size_t len)
{
    if (!out || len == 0)
        return out;
    out[0] = 0;
    if (!spec)
        return out;
    /* decorators nest ("counting:remote://h:p/cpu?token=x"): options follow the first '?' */
    const char *q = strchr(spec, '?');
    size_t n = q ? (size_t)(q - spec) + 1 : strlen(spec);
    snprintf(out, len, "%.*s", (int)n, spec);
    for (const char *p = q ? q + 1 : NULL; p && *p;) {
        const char *amp = strchr(p, '&'), *end = amp ? amp : p + strlen(p);
        const char *eq = memchr(p, '=', (size_t)(end - p));
        char key[64];
        snprintf(key, sizeof key, "%.*s", eq ? (int)(eq - p) : 0, p);
        size_t used = strlen(out);
        if (eq && is_secret(key))
            snprintf(out + used, len - used, "%s=***%s", key, amp ? "&" : "");
        else
            snprintf(out + used, len - used, "%.*s", (int)(end - p) + (amp ? 1 : 0), p);
        p = amp ? amp + 1 : NULL;
    }
    return out;
}

/* canon, then "?" and the options sorted when there are any; secrets masked when asked.
 * -1 with the error set when it does not fit. */
static int spell(const char *canon, const kiln_device_opts *opts, bool mask, char *out, size_t len)
{
    kiln_device_opts shown = *opts;
    for (int i = 0; mask && i < shown.n; i++)
        if (is_secret(shown.kv[i].key))
            snprintf(shown.kv[i].value, sizeof shown.kv[i].value, "***");
    char optstr[KILN_DEVICE_OPTS_MAX * sizeof opts->kv[0].key * 5];
    kiln__device_opts_canon(&shown, optstr, sizeof optstr);
    int n = snprintf(out, len, "%s%s%s", canon, optstr[0] ? "?" : "", optstr);
    if (n < 0 || (size_t)n >= len || strlen(optstr) + 1 >= sizeof optstr)
        return kiln__error_set("kiln_device_open: spec too long");
    return 0;
}

/* The registry's key of a device asked for as name_in_full (secrets unmasked) that opens
 * canon with given options: name_in_full, then canon with every option in effect, the
 * given ones over the defaults and the environment of each backend canon opens (as the
 * open will apply them: the outermost backend's first). */
static int registry_key(const char *name_in_full, const char *canon, const kiln_device_opts *given, char *key,
                        size_t len)
{
    kiln_device_opts all = *given;
    size_t chain[CHAIN_MAX];
    int n = chain_of(canon, chain, CHAIN_MAX);
    for (int i = 0; i < n; i++)
        if (kiln__device_opts_env(backend_name_of(chain[i]), &all) < 0)
            return -1;
    /* the name's length first: no option value can make two different pairs read alike */
    int used = snprintf(key, len, "%zu:%s ", strlen(name_in_full), name_in_full);
    if (used < 0 || (size_t)used >= len)
        return kiln__error_set("kiln_device_open: spec too long");
    return spell(canon, &all, false, key + used, len - (size_t)used);
}

static registry_entry *registry_find(const char *key)
{
    for (registry_entry *e = registry; e; e = e->next) {
        if (strcmp(e->key, key) != 0)
            continue;
        /* a device whose last reference went is on its way out (kiln__device_release
         * unlinks it next): open a new one beside it rather than bring it back */
        int n = atomic_load(&e->dev->refcount);
        while (n > 0 && !atomic_compare_exchange_weak(&e->dev->refcount, &n, n + 1))
            ;
        if (n > 0)
            return e;
    }
    return NULL;
}

kiln_device *kiln_device_open_opts(const char *spec, const char *options)
{
    if (!spec) {
        kiln__error_set("kiln_device_open: spec is NULL");
        return NULL;
    }
    /* spec?k=v&k=v: the query is the device's options (applied over the environment) */
    char base[KILN_SPEC_MAX];
    const char *q = strchr(spec, '?');
    size_t blen = q ? (size_t)(q - spec) : strlen(spec);
    if (blen >= sizeof base) {
        kiln__error_set("kiln_device_open: spec too long");
        return NULL;
    }
    memcpy(base, spec, blen);
    base[blen] = '\0';
    kiln_device_opts opts = {0};
    if (kiln__device_opts_parse(q ? q + 1 : NULL, "spec", &opts) < 0 ||
        kiln__device_opts_parse(options, "options", &opts) < 0)
        return NULL;
    size_t slot = 0;
    int index = 0;
    char canon[KILN_SPEC_MAX], name[KILN_SPEC_MAX], name_in_full[KILN_SPEC_MAX];
    char key[2 * KILN_SPEC_MAX + KILN_DEVICE_OPTS_MAX * sizeof opts.kv[0].key * 5];
    if (parse_any(base, &slot, &index, canon, sizeof canon) < 0 ||
        spell(canon, &opts, true, name, sizeof name) < 0 ||
        spell(canon, &opts, false, name_in_full, sizeof name_in_full) < 0)
        return NULL;
    /* An option's bad value reads as the backend's own do ("cannot open 'SPEC': option ..."),
     * though the engine judges this one before any backend opens. */
    if (apply_fusion_option(&opts, &slot, canon, sizeof canon) < 0) {
        char why[KILN_ERROR_MAX];
        snprintf(why, sizeof why, "%s", kiln_error());
        kiln__error_restate("kiln_device_open: cannot open '%s': %s", name, why);
        return NULL;
    }
    if (registry_key(name_in_full, canon, &opts, key, sizeof key) < 0)
        return NULL;

    pthread_mutex_lock(&registry_lock);
    registry_entry *found = registry_find(key);
    if (found) {
        pthread_mutex_unlock(&registry_lock);
        return found->dev;
    }
    const kiln_backend_iface *be = backend_of(slot);
    if (!be) {
        pthread_mutex_unlock(&registry_lock);
        kiln__error_set("kiln_device_open: backend '%s' is not compiled into this build (compiled: %s)",
                        backend_name_of(slot), kiln_backends_compiled());
        return NULL;
    }
    size_t klen = strlen(key);
    kiln_device *dev = calloc(1, sizeof *dev);
    registry_entry *entry = malloc(sizeof *entry + klen + 1);
    if (!dev || !entry) {
        pthread_mutex_unlock(&registry_lock);
        free(dev);
        free(entry);
        kiln__error_set("kiln_device_open: out of memory");
        return NULL;
    }
    kiln_error_clear();
    void *ctx = open_backend(be, backend_name_of(slot), canon, index, &opts);
    if (!ctx) {
        char why[KILN_ERROR_MAX];
        snprintf(why, sizeof why, "%s", kiln_error()[0] ? kiln_error() : "the backend reported no reason");
        pthread_mutex_unlock(&registry_lock);
        free(dev);
        free(entry);
        kiln__error_restate("kiln_device_open: cannot open '%s': %s", name, why); /* the reason's code kept */
        return NULL;
    }
    snprintf(dev->spec, sizeof dev->spec, "%s", name);
    dev->be = be;
    dev->ctx = ctx;
    atomic_init(&dev->refcount, 1);
    if (be->caps)
        be->caps(ctx, &dev->caps);
    if (kiln__queue_init_device(dev) < 0) {
        char why[KILN_ERROR_MAX];
        snprintf(why, sizeof why, "%s", kiln_error());
        pthread_mutex_unlock(&registry_lock);
        if (be->close)
            be->close(ctx);
        free(dev);
        free(entry);
        kiln__error_restate("kiln_device_open: cannot open '%s': %s", name, why); /* the reason's code kept */
        return NULL;
    }
    entry->dev = dev;
    memcpy(entry->key, key, klen + 1);
    entry->next = registry;
    registry = entry;
    pthread_mutex_unlock(&registry_lock);
    return dev;
}

/* The caller holds a reference already, so the count is above zero and stays so. */
void kiln__device_retain(kiln_device *dev)
{
    atomic_fetch_add(&dev->refcount, 1);
}

void kiln__device_release(kiln_device *dev)
{
    if (!dev)
        return;
    if (atomic_fetch_sub(&dev->refcount, 1) != 1)
        return;
    /* the last reference: nobody can take another (kiln_device_open skips a device at
     * zero), so this thread alone unlinks and closes it */
    pthread_mutex_lock(&registry_lock);
    for (registry_entry **p = &registry; *p; p = &(*p)->next) {
        if ((*p)->dev == dev) {
            registry_entry *gone = *p;
            *p = gone->next;
            free(gone);
            break;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    kiln__queue_fini_device(dev);
    if (dev->be->close)
        dev->be->close(dev->ctx);
    free(dev);
}

void kiln_device_close(kiln_device *dev)
{
    kiln__device_release(dev);
}

const char *kiln_device_name(const kiln_device *dev)
{
    return dev ? dev->spec : "";
}

int kiln_device_counters_get(kiln_device *dev, kiln_device_counters *out, const char *entry, uint64_t *calls_of)
{
    if (!dev || !out)
        return kiln__error_set("kiln_device_counters_get: device or output is NULL");
    if (!dev->be->counters)
        return kiln__error_set("kiln_device_counters_get: device '%s' keeps no counters (open \"counting:%s\")",
                               dev->spec, dev->spec);
    kiln_backend_counters c;
    memset(&c, 0, sizeof c);
    if (dev->be->counters(dev->ctx, &c) < 0) {
        char why[KILN_ERROR_MAX];
        snprintf(why, sizeof why, "%s", kiln_error());
        return kiln__error_restate("kiln_device_counters_get: device '%s': %s", dev->spec, why);
    }
    memset(out, 0, sizeof *out);
    for (int e = 0; e < KILN_ENTRY_COUNT; e++)
        out->calls += c.calls[e];
    out->uploads = c.uploads;
    out->upload_bytes = c.upload_bytes;
    out->downloads = c.downloads;
    out->download_bytes = c.download_bytes;
    out->syncs = c.syncs;
    out->peer_copies = c.peer_copies;
    out->events_recorded = c.events_recorded;
    out->event_waits = c.event_waits;
    if (calls_of) {
        int e = kiln__entry_by_name(entry);
        *calls_of = e >= 0 ? c.calls[e] : 0;
    }
    return 0;
}

/* A memory entry's KILN_ENOTSUP (a decorator whose inner backend keeps no figures): the
 * message gains the calling function and the device's spec. */
static int name_device_in_error(const kiln_device *dev, const char *fn, int rc)
{
    if (rc == KILN_ENOTSUP) {
        char why[KILN_ERROR_MAX];
        snprintf(why, sizeof why, "%s", kiln_error());
        kiln__error_set_code(KILN_ENOTSUP, "%s: device '%s': %s", fn, dev->spec, why);
    }
    return rc;
}

int kiln_device_memory_get(kiln_device *dev, kiln_device_memory *out)
{
    if (!dev || !out)
        return kiln__error_set_code(KILN_EINVAL, "kiln_device_memory_get: device or output is NULL");
    memset(out, 0, sizeof *out);
    if (!dev->be->memory) {
        return kiln__error_set_code(KILN_ENOTSUP,
                                    "kiln_device_memory_get: device '%s' (backend %s) keeps no memory figures",
                                    dev->spec, dev->be->name);
    }
    return name_device_in_error(dev, "kiln_device_memory_get", dev->be->memory(dev->ctx, out));
}

int kiln_device_memory_reset_peak(kiln_device *dev)
{
    if (!dev)
        return kiln__error_set_code(KILN_EINVAL, "kiln_device_memory_reset_peak: device is NULL");
    if (!dev->be->memory_reset_peak)
        kiln__error_set_code(KILN_ENOTSUP, "backend %s keeps no memory figures", dev->be->name);
    return name_device_in_error(dev, "kiln_device_memory_reset_peak",
                                dev->be->memory_reset_peak ? dev->be->memory_reset_peak(dev->ctx) : KILN_ENOTSUP);
}

size_t kiln_device_trim(kiln_device *dev, size_t bytes)
{
    if (!dev) {
        kiln__error_set("kiln_device_trim: device is NULL");
        return 0;
    }
    if (!dev->be->buffer_trim || bytes == 0)
        return 0;
    return dev->be->buffer_trim(kiln__qctx(dev), bytes);
}

const char *kiln_device_lost(kiln_device *dev)
{
    return dev && dev->be->lost ? dev->be->lost(dev->ctx) : NULL;
}
