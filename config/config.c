/*
 * config/config.c — loading kilnd's configuration in layers (defaults, JSON file, KILN_*
 * environment, command-line flags) and printing --help and the configuration reference.
 * Every rule about a key lives in config-table.c; this file only walks the table.
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "config-impl.h"
#include "json-keys-impl.h"

/* Flags that are commands rather than keys; one list so --help cannot forget one. */
static const struct {
    const char *flag;
    const char *arg;
    const char *desc;
} command_flags[] = {
    {"--config", "FILE",
     "Read a JSON configuration file (also KILN_CONFIG). Its keys are the configuration keys (each setting's "
     "`key`)."},
    {"--check-config", NULL,
     "Validate the configuration as a start would (log_file, host and api_tokens, model_repository and "
     "example_models, data_dir, device_options, each device opened and closed), leaving nothing behind; print "
     "the result and exit 0 (valid) or 1. A kilnd running on data_dir is noted, not refused."},
    {"--print-config-doc", NULL, "Print the configuration reference (docs/configuration.md) and exit."},
    {"--help", NULL, "Print this help and exit."},
    {"--version", NULL, "Print the version and exit."},
};

const char *kd_log_level_to_str(enum kd_log_level level)
{
    switch (level) {
    case KD_LOG_ERROR: return "error";
    case KD_LOG_WARN: return "warn";
    case KD_LOG_INFO: return "info";
    case KD_LOG_DEBUG: return "debug";
    }
    return "?";
}

void kd_config_free(struct kd_config *cfg)
{
    for (size_t i = 0; i < kd_config_key_count; i++)
        kd_config_free_value(cfg, &kd_config_keys[i]);
    free(cfg->config_file);
    cfg->config_file = NULL;
    free(cfg->notes);
    cfg->notes = NULL;
}

/* Appends one line to cfg->notes; a note lost to a failed allocation is only a lost warning. */
static void add_note(struct kd_config *cfg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_note(struct kd_config *cfg, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    size_t old = cfg->notes ? strlen(cfg->notes) : 0, n = strlen(line);
    char *grown = realloc(cfg->notes, old + n + 2);
    if (!grown)
        return;
    memcpy(grown + old, line, n);
    grown[old + n] = '\n';
    grown[old + n + 1] = '\0';
    cfg->notes = grown;
}

int kd_config_init_defaults(struct kd_config *cfg)
{
    char err[256];
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < kd_config_key_count; i++) {
        const struct kd_config_key *k = &kd_config_keys[i];
        if (kd_config_set_text(cfg, k, k->def, "default", err, sizeof err) != 0) {
            kd_config_free(cfg);
            return -1;
        }
    }
    return 0;
}

static char *read_file(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "config file %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (len + 1 < cap)
            break;
        if (cap >= (64u << 20)) {
            snprintf(err, errlen, "config file %s: larger than 64 MiB", path);
            free(buf);
            fclose(f);
            return NULL;
        }
        char *grown = realloc(buf, cap * 2);
        if (!grown) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = grown;
        cap *= 2;
    }
    int bad = ferror(f) ? errno : 0;
    fclose(f);
    if (!buf || bad) {
        snprintf(err, errlen, "config file %s: %s", path,
                 !buf            ? "out of memory"
                 : bad == EISDIR ? "a folder, not a file"
                                 : strerror(bad));
        free(buf);
        return NULL;
    }
    buf[len] = '\0';
    return buf;
}

/* A key the file gives twice in one object: cJSON would apply both, the later winning. */
struct repeat_err {
    const char *origin;
    char *err;
    size_t errlen;
};

static int repeated_key(void *ud, const char *path, const char *key)
{
    struct repeat_err *r = ud;
    snprintf(r->err, r->errlen, "%s%s%.64s: given twice; keep one (from %s)", path, *path ? "." : "", key,
             r->origin);
    return 1;
}

/* Walks one JSON object; prefix is "" at the top and "limits." inside the limits group. layers
 * marks the keys (by their index in the table) the file has set, so that one set both ways,
 * nested and dotted, is refused instead of the later one silently winning. */
static int apply_object(struct kd_config *cfg, const cJSON *obj, const char *prefix, const char *origin,
                        enum kd_config_layer *layers, char *err, size_t errlen)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, obj) {
        char name[128];
        snprintf(name, sizeof name, "%s%s", prefix, it->string ? it->string : "");
        const struct kd_config_key *k = kd_config_find(name);
        if (k) {
            size_t at = (size_t)(k - kd_config_keys);
            if (layers[at] == KD_LAYER_FILE) {
                snprintf(err, errlen,
                         "%s: given twice, as a nested key and as the dotted key \"%s\"; keep one (from %s)", name,
                         name, origin);
                return -1;
            }
            layers[at] = KD_LAYER_FILE;
            if (kd_config_set_json(cfg, k, it, origin, err, errlen) != 0)
                return -1;
            continue;
        }
        /* A group is any prefix of a dotted key name ("limits" for "limits.max_body_bytes"). */
        size_t n = strlen(name);
        bool group = false;
        for (size_t i = 0; i < kd_config_key_count && !group && prefix[0] == '\0'; i++)
            group = strncmp(kd_config_keys[i].name, name, n) == 0 && kd_config_keys[i].name[n] == '.';
        if (group) {
            if (!cJSON_IsObject(it)) {
                snprintf(err, errlen, "%s: expected an object (from %s)", name, origin);
                return -1;
            }
            char sub[130];
            snprintf(sub, sizeof sub, "%s.", name);
            if (apply_object(cfg, it, sub, origin, layers, err, errlen) != 0)
                return -1;
            continue;
        }
        snprintf(err, errlen, "%s: unknown key (from %s)", name, origin);
        return -1;
    }
    return 0;
}

/* layers (one per key of the table, all KD_LAYER_DEFAULT on entry) comes back marking the keys
 * the file set, for apply_env to say which of them the environment overrides. */
static int apply_file(struct kd_config *cfg, const char *path, enum kd_config_layer *layers, char *err,
                      size_t errlen)
{
    char *text = read_file(path, err, errlen);
    if (!text)
        return -1;
    char origin[4200];
    snprintf(origin, sizeof origin, "config file %s", path);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    if (!root) {
        size_t at = end ? (size_t)(end - text) : 0;
        snprintf(err, errlen, "config file %s: invalid JSON near byte %zu", path, at);
        free(text);
        return -1;
    }
    long nul = kiln__json_nul_escape_at(text, strlen(text));
    if (nul >= 0) { /* a token or a host would read as its part before the NUL, unseen */
        snprintf(err, errlen,
                 "config file %s: a string holds \\u0000 (a NUL character) at byte %ld; no setting may", path,
                 nul);
        cJSON_Delete(root);
        free(text);
        return -1;
    }
    int rc = 0;
    struct repeat_err repeat = {origin, err, errlen};
    if (!cJSON_IsObject(root)) {
        snprintf(err, errlen, "config file %s: the top level must be a JSON object", path);
        rc = -1;
    } else if ((rc = kiln__json_repeated_keys(root, repeated_key, &repeat)) != 0) {
        if (rc < 0)
            snprintf(err, errlen, "config file %s: out of memory", path);
        rc = -1;
    } else {
        rc = apply_object(cfg, root, "", origin, layers, err, errlen);
    }
    cJSON_Delete(root);
    free(text);
    return rc;
}

static const char *env_lookup(char *const *env, const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; env && env[i]; i++)
        if (strncmp(env[i], name, n) == 0 && env[i][n] == '=')
            return env[i] + n + 1;
    return NULL;
}

/* Edit distance with adjacent transpositions (optimal string alignment), case-insensitive and
 * with underscores skipped, capped at 3: how far a KILN_* name is from a setting's. */
static int name_distance(const char *a, const char *b)
{
    char x[64], y[64];
    size_t n = 0, m = 0;
    for (; *a && n < sizeof x; a++)
        if (*a != '_')
            x[n++] = (char)toupper((unsigned char)*a);
    for (; *b && m < sizeof y; b++)
        if (*b != '_')
            y[m++] = (char)toupper((unsigned char)*b);
    if ((n > m ? n - m : m - n) > 3 || n == sizeof x || m == sizeof y)
        return 3;
    int d[65][65];
    for (size_t i = 0; i <= n; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int best = d[i - 1][j - 1] + (x[i - 1] != y[j - 1]);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && x[i - 1] == y[j - 2] && x[i - 2] == y[j - 1] && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[n][m] < 3 ? d[n][m] : 3;
}

/*
 * A KILN_* variable that is no setting but lies close to one (KILN_LOGLEVEL, KILN_PROT,
 * KILN_DRAIN_TIMEOUT): said, not refused, since the engine's own variables (KILN_CPU_THREADS...)
 * and the kiln CLI's (KILN_URL) share the prefix and the environment. Close is within one edit for
 * names of up to six letters, two beyond, underscores and case aside.
 */
static void note_misspelt(struct kd_config *cfg, const char *entry)
{
    size_t len = strcspn(entry, "=");
    char name[64];
    if (strncmp(entry, "KILN_", 5) != 0 || len >= sizeof name || !entry[len])
        return;
    memcpy(name, entry, len);
    name[len] = '\0';
    const struct kd_config_key *nearest = NULL;
    int best = 3;
    for (size_t i = 0; i < kd_config_key_count; i++) {
        const struct kd_config_key *k = &kd_config_keys[i];
        if (!k->env)
            continue;
        if (strcmp(k->env, name) == 0)
            return;
        int d = name_distance(name + 5, k->env + 5);
        if (d < best) {
            best = d;
            nearest = k;
        }
    }
    size_t letters = 0;
    for (const char *c = name + 5; *c; c++)
        letters += *c != '_';
    if (nearest && best <= (letters <= 6 ? 1 : 2))
        add_note(cfg, "environment variable %s is not a kilnd setting and is ignored; did you mean %s (%s)?", name,
                 nearest->env, nearest->name);
}

static int apply_env(struct kd_config *cfg, char *const *env, enum kd_config_layer *layers, char *err,
                     size_t errlen)
{
    for (size_t i = 0; i < kd_config_key_count; i++) {
        const struct kd_config_key *k = &kd_config_keys[i];
        const char *v = env_lookup(env, k->env);
        if (!v)
            continue;
        char origin[64];
        snprintf(origin, sizeof origin, "environment variable %s", k->env);
        if (kd_config_set_text(cfg, k, v, origin, err, errlen) != 0)
            return -1;
        /* the precedence is documented, but a container image's ENV lines are easy to forget */
        if (layers[i] == KD_LAYER_FILE)
            add_note(cfg, "%s: the environment variable %s (%.200s) overrides the value in config file %s",
                     k->name, k->env, v, cfg->config_file ? cfg->config_file : "");
        layers[i] = KD_LAYER_ENV;
    }
    for (size_t i = 0; env && env[i]; i++)
        note_misspelt(cfg, env[i]);
    return 0;
}

static const struct kd_config_key *find_flag(const char *flag, size_t n)
{
    for (size_t i = 0; i < kd_config_key_count; i++) {
        const char *f = kd_config_keys[i].flag;
        if (f && strlen(f) == n && strncmp(f, flag, n) == 0)
            return &kd_config_keys[i];
    }
    return NULL;
}

/* Splits "--name=value" or "--name value"; returns the value or NULL when it is missing. */
static const char *flag_value(int argc, char *const *argv, int *i, size_t *name_len)
{
    const char *arg = argv[*i];
    const char *eq = strchr(arg, '=');
    if (eq) {
        *name_len = (size_t)(eq - arg);
        return eq + 1;
    }
    *name_len = strlen(arg);
    if (*i + 1 >= argc)
        return NULL;
    return argv[++*i];
}

static bool is_flag(const char *arg, const char *flag)
{
    return strcmp(arg, flag) == 0;
}

enum kd_config_action kd_config_load(struct kd_config *cfg, int argc, char *const *argv, char *const *env,
                                     char *err, size_t errlen)
{
    if (kd_config_init_defaults(cfg) != 0) {
        snprintf(err, errlen, "out of memory while loading defaults");
        return KD_CONFIG_ERROR;
    }

    /* where each key's value came from, for the checks of the merged configuration */
    enum kd_config_layer *layers = NULL;
    /* First pass: commands and --config, so the file is applied before env and flags. */
    enum kd_config_action action = KD_CONFIG_RUN;
    const char *config_path = env_lookup(env, "KILN_CONFIG");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (is_flag(a, "--help") || is_flag(a, "-h"))
            action = KD_CONFIG_HELP;
        else if (is_flag(a, "--version"))
            action = action == KD_CONFIG_HELP ? action : KD_CONFIG_VERSION;
        else if (is_flag(a, "--print-config-doc"))
            action = KD_CONFIG_PRINT_DOC;
        else if (is_flag(a, "--check-config") && action == KD_CONFIG_RUN)
            action = KD_CONFIG_CHECK;
        else if (strncmp(a, "--config", 8) == 0 && (a[8] == '\0' || a[8] == '=')) {
            size_t n;
            config_path = flag_value(argc, argv, &i, &n);
            if (!config_path) {
                snprintf(err, errlen, "--config: missing value (from command line)");
                goto fail;
            }
        }
    }
    if (action == KD_CONFIG_HELP || action == KD_CONFIG_VERSION || action == KD_CONFIG_PRINT_DOC)
        return action;

    layers = calloc(kd_config_key_count, sizeof *layers);
    if (!layers) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (config_path && config_path[0]) {
        cfg->config_file = strdup(config_path);
        if (apply_file(cfg, config_path, layers, err, errlen) != 0)
            goto fail;
    }
    if (apply_env(cfg, env, layers, err, errlen) != 0)
        goto fail;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (is_flag(a, "--help") || is_flag(a, "-h") || is_flag(a, "--version") ||
            is_flag(a, "--print-config-doc") || is_flag(a, "--check-config"))
            continue;
        if (strncmp(a, "--config", 8) == 0 && (a[8] == '\0' || a[8] == '=')) {
            if (a[8] == '\0')
                i++;
            continue;
        }
        if (strncmp(a, "--", 2) != 0) {
            snprintf(err, errlen, "unexpected argument '%s' (from command line; see --help)", a);
            goto fail;
        }
        size_t n;
        const char *v = flag_value(argc, argv, &i, &n);
        const struct kd_config_key *k = find_flag(a, n);
        if (!k) {
            /* the tokens are secrets: never on a command line, which every user of the machine can read */
            if (n == strlen("--api-tokens") && strncmp(a, "--api-tokens", n) == 0)
                snprintf(err, errlen,
                         "unknown flag '--api-tokens' (from command line): tokens are set only in the config "
                         "file's api_tokens or KILN_API_TOKENS, since a command line is visible to every user");
            else
                snprintf(err, errlen, "unknown flag '%.*s' (from command line; see --help)", (int)n, a);
            goto fail;
        }
        if (!v) {
            snprintf(err, errlen, "%s: missing value (from command-line flag %s)", k->name, k->flag);
            goto fail;
        }
        char origin[64];
        snprintf(origin, sizeof origin, "command-line flag %s", k->flag);
        if (kd_config_set_text(cfg, k, v, origin, err, errlen) != 0)
            goto fail;
        layers[k - kd_config_keys] = KD_LAYER_FLAG;
    }
    if (kd_config_check_merged(cfg, layers, err, errlen) != 0)
        goto fail;
    free(layers);
    return action;

fail:
    free(layers);
    kd_config_free(cfg);
    return KD_CONFIG_ERROR;
}

static void print_default(FILE *out, const struct kd_config_key *k, bool markdown)
{
    const char *q = markdown ? "`" : "";
    if (k->type == KD_CT_STRLIST) {
        fprintf(out, "%s[", q);
        const char *p = k->def;
        bool first = true;
        while (*p) {
            const char *comma = strchr(p, ',');
            int n = comma ? (int)(comma - p) : (int)strlen(p);
            fprintf(out, "%s\"%.*s\"", first ? "" : ", ", n, p);
            first = false;
            if (!comma)
                break;
            p = comma + 1;
        }
        fprintf(out, "]%s", q);
    } else if (k->type == KD_CT_INT) {
        fprintf(out, "%s%s%s", q, k->def, q);
    } else {
        fprintf(out, "%s\"%s\"%s", q, k->def, q);
    }
}

void kd_config_print_help(FILE *out, const char *prog)
{
    fprintf(out, "usage: %s [options]\n\nkilnd serves the kiln engine over HTTP.\n\n", prog);
    for (size_t i = 0; i < sizeof command_flags / sizeof command_flags[0]; i++) {
        char left[64];
        snprintf(left, sizeof left, "%s%s%s", command_flags[i].flag, command_flags[i].arg ? " " : "",
                 command_flags[i].arg ? command_flags[i].arg : "");
        fprintf(out, "  %-26s %s\n", left, command_flags[i].desc);
    }
    fprintf(out, "\nConfiguration (precedence: file < environment < flags):\n");
    for (size_t i = 0; i < kd_config_key_count; i++) {
        const struct kd_config_key *k = &kd_config_keys[i];
        char left[64], bounds[128];
        snprintf(left, sizeof left, "%s %s", k->flag ? k->flag : "(file/env only)",
                 k->flag ? (k->type == KD_CT_INT ? "N" : "VALUE") : "");
        kd_config_describe_bounds(k, bounds, sizeof bounds);
        fprintf(out, "  %-26s %s\n  %-26s key %s, env %s, %s, default ", left, k->desc, "", k->name,
                k->env, bounds);
        print_default(out, k, false);
        fputc('\n', out);
    }
}

/* The device options (libkiln's engine/device-opts.c keeps the variables): devices in the
 * devices list take them in their spec, so kilnd passes them through unchanged. */
static const char device_options_doc[] =
    "\n"
    "## Device options\n"
    "\n"
    "Each entry of `devices` (and a training job's `device`) is a device spec, which may carry options "
    "after a `?`: `\"cpu?threads=2&conv=direct\"`, `\"remote://10.0.0.5:8080/cpu?timeout_ms=5000\"`. The "
    "environment variables below set their defaults (read when a device opens); an option in the spec "
    "wins. An unknown option, or a bad value, refuses the open with a message naming the option, where "
    "the value came from and the value. `counting:SPEC` wraps a device in the counting decorator (it "
    "takes `hide=ENTRY,DTYPE,...` and hands the other options to SPEC's device). `fused:SPEC` wraps it "
    "in the fusion decorator (docs/architecture.md, \"Automatic kernel fusion\"), which is also what the "
    "option `fusion=on` does to any device while keeping the device's name. A spec that names the "
    "decorator and turns fusion off (`fused:cpu?fusion=off`, or `fusion=off` from the options or the "
    "decorator's device_options) contradicts itself and is refused; `KILN_<BACKEND>_FUSION=off` does not "
    "override an explicit `fused:`.\n"
    "\n"
    "Opening a spec while a device of the same spec is open shares that device only when the options in "
    "effect are the same: the spec's, then `device_options` (`kiln_device_defaults_set`), then the "
    "environment, as read at each open. When a default or a variable changed since, the open gets a "
    "device of its own, opened with the new options, and a bad value is refused by that open, naming it. "
    "Two differently configured devices of one backend coexist, as `cpu` and `cpu?threads=2` always "
    "have: on cpu each has its own thread pool and buffer pool (OpenBLAS's thread count is process-wide "
    "and follows the device opened last), on vulkan each its own logical device on the same GPU, on cuda "
    "each its own streams and memory pool on the same GPU, on remote each its own session. Such a device "
    "keeps the name it was asked for (`kiln_device_name`), so two devices may share a name.\n"
    "\n"
    "A secret never appears in a device's name or in a message: `remote://10.0.0.5:8080/cpu?token=abc` "
    "is named `remote://10.0.0.5:8080/cpu?token=***`, and a token from the environment is not part of "
    "the name at all. Opens with different tokens are different sessions, whatever their names show.\n"
    "\n"
    "| backend | option | environment | values | default |\n"
    "|---|---|---|---|---|\n"
    "| cpu | `threads` | `KILN_CPU_THREADS` | 1..256 | online cores |\n"
    "| cpu | `spin_us` | `KILN_CPU_SPIN_US` | 0..100000 (microseconds a worker polls before sleeping) | "
    "50 |\n"
    "| cpu | `conv` | `KILN_CPU_CONV` | auto, packed, direct (convolution tile) | auto |\n"
    "| cpu | `depthwise` | `KILN_CPU_DEPTHWISE` | auto, planes (depthwise kernel) | auto |\n"
    "| cpu | `blas` | `KILN_CPU_BLAS` | kiln (our pool splits GEMMs), openblas (OpenBLAS's threads) | "
    "kiln |\n"
    "| cpu | `kernels` | `KILN_CPU_KERNELS` | auto, base, avx2 (cap on the SIMD tables) | auto |\n"
    "| cpu | `pool_mb` | `KILN_CPU_POOL_MB` | 0..16777216 (MiB of freed buffers kept for reuse) | 2048 |\n"
    "| cpu | `jit` | `KILN_CPU_JIT` | on, off (large elementwise fused groups compiled at run time into "
    "one loop; off: the block interpreter only) | on |\n"
    "| cuda | `tf32` | `KILN_CUDA_TF32` | off, on (f32 matmul and convolution may use TF32 tensor cores) "
    "| off |\n"
    "| cuda | `conv_workspace_mb` | `KILN_CUDA_CONV_WORKSPACE_MB` | 0..65536: MiB of scratch the "
    "convolution algorithm search may offer cuDNN; an algorithm that wins with more than the queue's 128 "
    "MiB workspace grows it (0: the 128 MiB workspace only) | 1024, at most an eighth of the GPU's "
    "memory |\n"
    "| cuda | `profile` | `KILN_CUDA_PROFILE` | off, on (each queue times its entries on the GPU and "
    "prints the sums by entry to stderr when it closes; nothing is timed inside a recorded graph) | off "
    "|\n"
    "| remote | `timeout_ms` | `KILN_REMOTE_TIMEOUT_MS` | 1..86400000 (bound on every wait; a wait that "
    "runs out names where the value was set: the spec, the options, device_options, the variable, or the "
    "default) | 30000 |\n"
    "| remote | `token` | `KILN_REMOTE_TOKEN`, then `KILN_TOKEN` | bearer token (shown as `***`) | none "
    "|\n"
    "| counting | `hide` | — | entries and dtypes the device refuses | none |\n"
    "| any | `fusion` | `KILN_CPU_FUSION` (cpu), `KILN_CUDA_FUSION` (cuda), `KILN_VULKAN_FUSION` "
    "(vulkan) | on, off (record elementwise ops lazily and run them as fused kernels; a backend's variable "
    "and defaults cover its decorated specs too, `counting:cpu`) | on for vulkan "
    "and cuda, off elsewhere |\n"
    "| fused | `codegen` | — | on, off (off: groups are recorded but replayed op by op, for comparisons) "
    "| on |\n"
    "| fused | `min_elements` | — | 0..2^40: a call whose operands all have fewer elements, arriving "
    "with no group pending, runs as it is (0: every call may fuse) | the inner backend's: 65536 on cpu, "
    "0 elsewhere |\n"
    "\n"
    "`codegen` and `min_elements` belong to the fusion decorator. Among a backend's defaults\n"
    "(`device_options`) they apply to that backend's fused devices and are left aside by a device\n"
    "of it opened with fusion off; given in the spec of a device opened without fusion they are\n"
    "refused (`cpu?min_elements=5` without `fusion=on`), since they would do nothing there.\n"
    "\n"
    "On the cpu, a fused group of elementwise ops over 2^18 elements or more (contiguous,\n"
    "row-broadcast or scalar f32 inputs; the ops with a vector form, comparisons and where), a\n"
    "product's epilogue, and a group that takes its rows whole (softmax, layer norm, row sums;\n"
    "rows a multiple of 16, from 2^16 elements) is compiled at run time\n"
    "into one vector loop by the system's C compiler and kept as a shared object in the cache\n"
    "directory (`$KILN_DATA_DIR/cache/cpu-jit`, else `$XDG_CACHE_HOME/kiln/cpu-jit`, else\n"
    "`~/.cache/kiln/cpu-jit`), so a restart loads it without compiling. The option `jit=off`\n"
    "(`KILN_CPU_JIT=off`) turns that off (every group then runs in the block interpreter); "
    "`KILN_CPU_JIT_CC` names\n"
    "the compiler (default `cc`). Without a compiler, or when one fails, the interpreter runs\n"
    "the group: the results are the same to the bit either way. `KILN_CPU_JIT_KEEP` (default 512)\n"
    "bounds the folder: after each compile it keeps that many loops, the most recently used\n"
    "(a load from the cache sets the library's access time), and removes header folders of other\n"
    "kiln builds and temporary files older than a day; a value that is not a positive whole\n"
    "number is said on stderr and the default applies.\n"
    "\n"
    "The autotune cache (kernel choices timed once per shape class and device, `autotune.tsv`) lives in "
    "the folder `kiln_autotune_dir_set` names, else in `KILN_AUTOTUNE_DIR`; kilnd sets it to its "
    "`data_dir` unless `KILN_AUTOTUNE_DIR` is set. A model can ship a warmed `autotune.tsv` beside its "
    "`model.kiln` or `model.onnx` (in the version folder): kilnd merges it into the cache when the model "
    "loads (`kiln_autotune_merge_file`), taking the choices the cache lacks; a corrupt shipped file is "
    "ignored with a log line and the model loads as usual. A malformed cache file is ignored with a line "
    "on stderr and rewritten, and entries timed by another kiln version are dropped.\n"
    "\n"
    "Two engine settings are read from the same table: `KILN_ONNX_ARENA` (0 or 1: the default of "
    "`kiln_onnx_options.arena`) and `KILN_ONNX_PROFILE` (1: time per op type, `nodes`: per node).\n"
    "`KILN_ONNX_GRAPHS` (0 or 1) sets `kiln_onnx_options.graphs` likewise: recorded graphs on devices "
    "that record them (cuda).\n"
    "`KILN_ONNX_CSE` (0 or 1) sets `kiln_onnx_options.common_subexpressions` likewise: repeated nodes "
    "dropped at load (docs/onnx.md).\n";

void kd_config_print_doc(FILE *out)
{
    fprintf(out,
            "# kilnd configuration\n\n"
            "<!-- Generated by `kilnd --print-config-doc` from config/config-table.c; do not edit by hand. -->\n\n"
            "kilnd reads its settings in layers; a later layer overrides an earlier one:\n\n"
            "1. the defaults below;\n"
            "2. a JSON file named by `--config FILE` (or `KILN_CONFIG`);\n"
            "3. environment variables `KILN_*`;\n"
            "4. command-line flags.\n\n"
            "An unknown key in the file, an unknown flag, a value of the wrong type or out of range "
            "stops the start with a message naming the key and where the value came from (file path, "
            "environment variable or flag). Rules that relate two settings (each `api_tokens` token must be "
            "at least 64 bytes shorter than `limits.max_header_bytes`) are checked once every layer is in, on "
            "the final values: a long token in the file is accepted when `KILN_MAX_HEADER_BYTES` or "
            "`--max-header-bytes` raises the limit enough, and one that still does not fit is refused naming "
            "both settings, where each value came from and the limit. "
            "`kilnd --check-config` validates without starting "
            "(exit 0 when valid, 1 otherwise), with the checks a start makes before it serves: `log_file` "
            "must open for appending, a `host` beyond loopback needs `api_tokens`, `host` must resolve, "
            "`grpc_port` must differ from `port`, `model_repository` (when "
            "set) and `example_models` (when set) must be existing folders kilnd can read, `data_dir` must be "
            "creatable and writable, `device_options` must parse and every device in `devices` must open "
            "(each is opened and closed again). What the check creates to find out (a log file, a missing "
            "data folder) it removes again. A kilnd already running on `data_dir` is noted in the output, not "
            "refused: checking a new configuration before restarting that kilnd is what the check is for. "
            "Two things are warned about, at start (log level warn) and by the check (on stderr), but not "
            "refused: an environment variable overriding a value the file sets (a container image's `ENV` "
            "lines are easy to forget), and a `KILN_*` variable that is no setting but one or two letters "
            "from one (`KILN_LOGLEVEL`, `KILN_PROT`), which is ignored. Other `KILN_*` variables are left "
            "alone: the device options below, the engine's and the `kiln` CLI's share the prefix. "
            "In the JSON file, dotted keys are nested objects: "
            "`limits.max_body_bytes` is written `{\"limits\": {\"max_body_bytes\": 1048576}}`; a key given "
            "twice, or both nested and dotted, is refused. "
            "Lists are JSON arrays in the file and comma-separated in the environment and on the "
            "command line.\n\n"
            "| key | type | default | bounds | environment | flag | description |\n"
            "|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < kd_config_key_count; i++) {
        const struct kd_config_key *k = &kd_config_keys[i];
        char bounds[128];
        kd_config_describe_bounds(k, bounds, sizeof bounds);
        fprintf(out, "| `%s` | %s | ", k->name, kd_config_type_name(k->type));
        print_default(out, k, true);
        fprintf(out, " | %s | `%s` | %s%s%s | %s |\n", bounds, k->env, k->flag ? "`" : "",
                k->flag ? k->flag : "—", k->flag ? "`" : "", k->desc);
    }
    fprintf(out, "\n## Command flags\n\n| flag | description |\n|---|---|\n");
    for (size_t i = 0; i < sizeof command_flags / sizeof command_flags[0]; i++)
        fprintf(out, "| `%s%s%s` | %s |\n", command_flags[i].flag, command_flags[i].arg ? " " : "",
                command_flags[i].arg ? command_flags[i].arg : "", command_flags[i].desc);
    fprintf(out,
            "\n## Example\n\n```json\n{\n  \"host\": \"127.0.0.1\",\n  \"port\": 8080,\n"
            "  \"data_dir\": \"/var/lib/kiln\",\n  \"devices\": [\"cpu\"],\n"
            "  \"limits\": {\"max_body_bytes\": 67108864, \"request_timeout_ms\": 30000},\n"
            "  \"log_format\": \"json\"\n}\n```\n");
    fputs(device_options_doc, out);
}
