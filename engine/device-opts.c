/*
 * engine/device-opts.c — device options: the one table of the environment variables
 * that set their defaults, and parsing "key=value&key=value".
 *
 * A device's options come from three places, later ones winning: the environment (read
 * here and nowhere else, at each open, so a program that sets a variable and reopens
 * sees it), the spec's query ("cpu?threads=2") and the options a program passes apart
 * (kiln_device_open_opts; kilnd's config). The backend checks the values and refuses a
 * bad one naming the option, where it came from and the value; the engine refuses a key
 * no backend consumed. docs/configuration.md lists every row of the table below.
 */
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor-impl.h"

typedef struct env_row {
    const char *backend;   /* "cpu", "remote", or "onnx" (engine options, not a device's) */
    const char *key;
    const char *var;       /* the variable that sets its default */
    const char *alt;       /* a second variable read when var is unset, or NULL */
} env_row;

static const env_row env_table[] = {
    {"cpu", "threads", "KILN_CPU_THREADS", NULL},
    {"cpu", "spin_us", "KILN_CPU_SPIN_US", NULL},
    {"cpu", "conv", "KILN_CPU_CONV", NULL},
    {"cpu", "depthwise", "KILN_CPU_DEPTHWISE", NULL},
    {"cpu", "blas", "KILN_CPU_BLAS", NULL},
    {"cpu", "kernels", "KILN_CPU_KERNELS", NULL},
    {"cpu", "pool_mb", "KILN_CPU_POOL_MB", NULL},
    {"cpu", "jit", "KILN_CPU_JIT", NULL},
    {"cuda", "tf32", "KILN_CUDA_TF32", NULL},
    {"cuda", "conv_workspace_mb", "KILN_CUDA_CONV_WORKSPACE_MB", NULL},
    {"cpu", "fusion", "KILN_CPU_FUSION", NULL},
    {"cuda", "fusion", "KILN_CUDA_FUSION", NULL},
    {"vulkan", "fusion", "KILN_VULKAN_FUSION", NULL},
    {"remote", "timeout_ms", "KILN_REMOTE_TIMEOUT_MS", NULL},
    {"remote", "token", "KILN_REMOTE_TOKEN", "KILN_TOKEN"},
    {"onnx", "arena", "KILN_ONNX_ARENA", NULL},
    {"onnx", "graphs", "KILN_ONNX_GRAPHS", NULL},
    {"onnx", "cse", "KILN_ONNX_CSE", NULL},
    {"onnx", "profile", "KILN_ONNX_PROFILE", NULL},
};

const char *kiln__option_env(const char *backend, const char *key, const char **var)
{
    for (size_t i = 0; i < sizeof env_table / sizeof *env_table; i++) {
        const env_row *r = &env_table[i];
        if (strcmp(r->backend, backend) || strcmp(r->key, key))
            continue;
        const char *v = getenv(r->var);
        if (var)
            *var = r->var;
        if ((!v || !*v) && r->alt) {
            v = getenv(r->alt);
            if (var)
                *var = r->alt;
        }
        return v && *v ? v : NULL;
    }
    return NULL;
}

static int find_key(const kiln_device_opts *o, const char *key)
{
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->kv[i].key, key))
            return i;
    return -1;
}

/* who: the public call the messages name (kiln_device_open, kiln_device_defaults_set) */
static int put(kiln_device_opts *o, const char *key, size_t klen, const char *value, size_t vlen,
               const char *source, bool override, const char *who)
{
    char k[sizeof o->kv[0].key];
    if (klen == 0 || klen >= sizeof k)
        return kiln__error_set("%s: bad option name '%.*s' (%s)", who, (int)(klen > 40 ? 40 : klen), key, source);
    if (vlen >= sizeof o->kv[0].value)
        return kiln__error_set("%s: option %.*s: value too long (%s)", who, (int)klen, key, source);
    memcpy(k, key, klen);
    k[klen] = '\0';
    int i = find_key(o, k);
    if (i >= 0 && !override)
        return 0;
    if (i < 0) {
        if (o->n == KILN_DEVICE_OPTS_MAX)
            return kiln__error_set("%s: more than %d options", who, KILN_DEVICE_OPTS_MAX);
        i = o->n++;
        memcpy(o->kv[i].key, k, klen + 1);
    }
    memcpy(o->kv[i].value, value, vlen);
    o->kv[i].value[vlen] = '\0';
    o->kv[i].source = source;
    o->kv[i].used = false;
    return 0;
}

static int parse_for(const char *text, const char *source, kiln_device_opts *o, const char *who)
{
    if (!text)
        return 0;
    const char *p = text;
    while (*p) {
        const char *end = strchr(p, '&');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        if (len == 0) {
            p += end ? 1 : 0;
            if (!end)
                break;
            continue;
        }
        if (!eq)
            return kiln__error_set("%s: option '%.*s' has no value (expected key=value, %s)", who,
                                   (int)(len > 60 ? 60 : len), p, source);
        /* one text naming a key twice ("fusion=on&fusion=off") says two things: which was
         * meant cannot be known, so neither is taken (a later source overrides an earlier one) */
        char key[sizeof o->kv[0].key];
        size_t klen = (size_t)(eq - p);
        if (klen > 0 && klen < sizeof key) {
            memcpy(key, p, klen);
            key[klen] = '\0';
            int seen = find_key(o, key);
            if (seen >= 0 && !strcmp(o->kv[seen].source, source))
                return kiln__error_set_code(KILN_EINVAL, "%s: option %s is given twice (%s)", who, key, source);
        }
        if (put(o, p, klen, eq + 1, len - klen - 1, source, true, who) < 0)
            return -1;
        p += len + (end ? 1 : 0);
    }
    return 0;
}

int kiln__device_opts_parse(const char *text, const char *source, kiln_device_opts *o)
{
    return parse_for(text, source, o, "kiln_device_open");
}

/* Defaults a program set (kiln_device_defaults_set: kilnd's device_options), applied over
 * the environment and under a spec's options. Process-wide by nature (they describe how
 * the process wants its devices), so guarded by a lock and copied out at each open. */
#define DEFAULTS_MAX 8
static pthread_mutex_t defaults_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char backend[32];
    char options[256];
} defaults[DEFAULTS_MAX];

int kiln_device_defaults_set(const char *backend, const char *options)
{
    if (!backend || !*backend || strlen(backend) >= sizeof defaults[0].backend)
        return kiln__error_set("kiln_device_defaults_set: bad backend name");
    /* a misspelt backend would hold its options where no open ever reads them */
    if (!kiln__backend_name_known(backend))
        return kiln__error_set("kiln_device_defaults_set: unknown backend '%s' (expected %s)", backend,
                               KILN__BACKEND_NAMES);
    if (options && strlen(options) >= sizeof defaults[0].options)
        return kiln__error_set("kiln_device_defaults_set: options for %s too long", backend);
    kiln_device_opts check = {0};
    if (parse_for(options, "device_options", &check, "kiln_device_defaults_set") < 0)
        return -1;
    pthread_mutex_lock(&defaults_lock);
    int slot = -1;
    for (int i = 0; i < DEFAULTS_MAX && slot < 0; i++)
        if (!strcmp(defaults[i].backend, backend))
            slot = i;
    for (int i = 0; i < DEFAULTS_MAX && slot < 0; i++)
        if (!defaults[i].backend[0])
            slot = i;
    if (slot >= 0) {
        snprintf(defaults[slot].backend, sizeof defaults[slot].backend, "%s", options && *options ? backend : "");
        snprintf(defaults[slot].options, sizeof defaults[slot].options, "%s", options ? options : "");
    }
    pthread_mutex_unlock(&defaults_lock);
    return slot >= 0 ? 0 : kiln__error_set("kiln_device_defaults_set: more than %d backends", DEFAULTS_MAX);
}

int kiln__device_opts_env(const char *backend, kiln_device_opts *o)
{
    char given[sizeof defaults[0].options] = "";
    pthread_mutex_lock(&defaults_lock);
    for (int i = 0; i < DEFAULTS_MAX; i++)
        if (!strcmp(defaults[i].backend, backend))
            snprintf(given, sizeof given, "%s", defaults[i].options);
    pthread_mutex_unlock(&defaults_lock);
    if (given[0]) {
        kiln_device_opts d = {0};
        if (kiln__device_opts_parse(given, "device_options", &d) < 0)
            return -1;
        for (int i = 0; i < d.n; i++)
            if (put(o, d.kv[i].key, strlen(d.kv[i].key), d.kv[i].value, strlen(d.kv[i].value), "device_options",
                    false, "kiln_device_open") < 0)
                return -1;
    }
    for (size_t i = 0; i < sizeof env_table / sizeof *env_table; i++) {
        const env_row *r = &env_table[i];
        if (strcmp(r->backend, backend))
            continue;
        const char *var = NULL;
        const char *v = kiln__option_env(backend, r->key, &var);
        if (v && put(o, r->key, strlen(r->key), v, strlen(v), var, false, "kiln_device_open") < 0)
            return -1;
    }
    return 0;
}

int kiln__device_opts_check_used(const char *backend, const kiln_device_opts *o)
{
    for (int i = 0; i < o->n; i++)
        if (!o->kv[i].used)
            return kiln__error_set("unknown option '%s' for backend %s (from %s)", o->kv[i].key,
                                   backend, o->kv[i].source);
    return 0;
}

const char *kiln__device_opts_take(kiln_device_opts *o, const char *key, const char **source)
{
    for (int i = 0; o && i < o->n; i++)
        if (!strcmp(o->kv[i].key, key)) {
            o->kv[i].used = true;
            if (source)
                *source = o->kv[i].source;
            return o->kv[i].value;
        }
    return NULL;
}

void kiln__device_opts_canon(const kiln_device_opts *o, char *buf, size_t len)
{
    /* sorted by key, so equal option sets name one device */
    int order[KILN_DEVICE_OPTS_MAX];
    for (int i = 0; i < o->n; i++)
        order[i] = i;
    for (int i = 1; i < o->n; i++)
        for (int j = i; j > 0 && strcmp(o->kv[order[j - 1]].key, o->kv[order[j]].key) > 0; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < o->n && used < len; i++) {
        int n = snprintf(buf + used, len - used, "%s%s=%s", i ? "&" : "", o->kv[order[i]].key, o->kv[order[i]].value);
        if (n < 0)
            break;
        used += (size_t)n;
    }
}

int kiln__device_opt_long(kiln_device_opts *o, const char *backend, const char *key, long lo, long hi, long *out)
{
    const char *src = NULL;
    const char *v = kiln__device_opts_take(o, key, &src);
    if (!v)
        return 0;
    char *end = NULL;
    long x = strtol(v, &end, 10);
    /* digits only (a '-' where negatives are allowed): strtol alone would take " 5" and "+5" */
    bool digits = isdigit((unsigned char)v[0]) || (v[0] == '-' && lo < 0 && isdigit((unsigned char)v[1]));
    if (!digits || *end || x < lo || x > hi)
        return kiln__error_set("%s: option %s (from %s) must be a whole number from %ld to %ld, got '%s'", backend, key,
                               src, lo, hi, v);
    *out = x;
    return 1;
}

int kiln__device_opt_choice(kiln_device_opts *o, const char *backend, const char *key, const char *const *choices,
                            int n, int *out)
{
    const char *src = NULL;
    const char *v = kiln__device_opts_take(o, key, &src);
    if (!v)
        return 0;
    for (int i = 0; i < n; i++)
        if (!strcmp(v, choices[i])) {
            *out = i;
            return 1;
        }
    char list[128] = "";
    for (int i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i == 0 ? "" : i == n - 1 ? " or " : ", ",
                 choices[i]);
    return kiln__error_set("%s: option %s (from %s) must be %s, got '%s'", backend, key, src, list, v);
}
