/*
 * catalog/repository-config.c — a model version's serving configuration: config.json read and
 * checked into a kd_model_config (tensors, batching, device, instances, version policy). Unknown,
 * misspelt or repeated keys are refused by name, so a typo never passes as a default.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json-keys-impl.h"
#include "repository-impl.h"

static const char *const datatypes[] = {"BOOL", "UINT8", "INT32", "INT64", "FP16", "BF16", "FP32", "FP64"};

void kd_model_tensor_spec_free(kd_model_tensor_spec *s)
{
    free(s->name);
    free(s->datatype);
    free(s->label_filename);
    free(s->label_text);
    free(s->labels);
    memset(s, 0, sizeof *s);
}

int kd_model_tensor_spec_copy(kd_model_tensor_spec *dst, const kd_model_tensor_spec *src)
{
    *dst = *src;
    dst->name = strdup(src->name ? src->name : "");
    dst->datatype = strdup(src->datatype ? src->datatype : "");
    dst->label_filename = src->label_filename ? strdup(src->label_filename) : NULL;
    dst->label_text = NULL;
    dst->labels = NULL;
    bool ok = dst->name && dst->datatype && (dst->label_filename || !src->label_filename);
    if (ok && src->nlabels > 0) {
        /* the text is one block of '\0'-ended lines: copy it whole and point at the same offsets */
        const char *last = src->labels[src->nlabels - 1];
        size_t size = (size_t)(last - src->label_text) + strlen(last) + 1;
        dst->label_text = malloc(size);
        dst->labels = malloc((size_t)src->nlabels * sizeof *dst->labels);
        ok = dst->label_text && dst->labels;
        if (ok) {
            memcpy(dst->label_text, src->label_text, size);
            for (int64_t i = 0; i < src->nlabels; i++)
                dst->labels[i] = dst->label_text + (src->labels[i] - src->label_text);
        }
    }
    if (!ok) {
        kd_model_tensor_spec_free(dst);
        return -1;
    }
    return 0;
}

void kd_repository_config_free(kd_model_config *c)
{
    for (int i = 0; c->inputs && i < c->ninputs; i++)
        kd_model_tensor_spec_free(&c->inputs[i]);
    for (int i = 0; c->outputs && i < c->noutputs; i++)
        kd_model_tensor_spec_free(&c->outputs[i]);
    free(c->inputs);
    free(c->outputs);
    free(c->device);
    free(c->specific);
    memset(c, 0, sizeof *c);
}

static bool json_int(const cJSON *j, int64_t lo, int64_t hi, int64_t *out)
{
    if (!cJSON_IsNumber(j) || j->valuedouble != (double)(int64_t)j->valuedouble || j->valuedouble < (double)lo ||
        j->valuedouble > (double)hi)
        return false;
    *out = (int64_t)j->valuedouble;
    return true;
}

/*
 * Refuse keys of obj outside known (NULL-terminated): a misspelt "max_batch_sise" would
 * otherwise be ignored without a word. where names the object in the message ("config.json",
 * "config.json dynamic_batching"). 0 or -1 + why.
 */
static int check_keys(const cJSON *obj, const char *const *known, const char *where, char *why, size_t wl)
{
    if (!cJSON_IsObject(obj))
        return 0;
    for (const cJSON *it = obj->child; it; it = it->next) {
        bool ok = false;
        for (int k = 0; known[k] && !ok; k++)
            ok = strcmp(it->string, known[k]) == 0;
        if (!ok) {
            /* Triton's config.pbtxt names (which kilnd's /config answers in, for tritonclient):
             * what config.json calls them */
            static const struct {
                const char *triton, *hint;
            } hints[] = {
                {"input", "did you mean 'inputs'?"},
                {"output", "did you mean 'outputs'?"},
                {"max_queue_delay_microseconds", "did you mean 'max_queue_delay_us'?"},
                {"preferred_batch_size", "did you mean 'preferred_batch_sizes'?"},
                {"instance_group", "config.json takes 'instance_count' and 'device'"},
                {"data_type", "did you mean 'datatype' (\"FP32\", not \"TYPE_FP32\")?"},
                {"dims", "did you mean 'shape'? (it includes the batch dimension, as -1)"},
                {"name", "the model's folder names it"},
                {"platform", "model.onnx or model.kiln in the version folder says the format"},
                {"backend", "model.onnx or model.kiln in the version folder says the format"},
            };
            const char *hint = NULL;
            for (size_t h = 0; h < sizeof hints / sizeof hints[0] && !hint; h++)
                if (strcmp(it->string, hints[h].triton) == 0)
                    hint = hints[h].hint;
            size_t len = (size_t)snprintf(why, wl, "%s: unknown key '%.64s'", where, it->string);
            if (hint && len < wl)
                len += (size_t)snprintf(why + len, wl - len, ", %s", hint);
            if (len < wl)
                len += (size_t)snprintf(why + len, wl - len, " (known:");
            for (int k = 0; known[k] && len < wl; k++)
                len += (size_t)snprintf(why + len, wl - len, " %s", known[k]);
            if (len < wl)
                snprintf(why + len, wl - len, ")");
            return -1;
        }
    }
    return 0;
}

/* The first key config.json gives twice, as the load's reason (json-keys-impl.h says why). */
struct repeat_why {
    char *why;
    size_t wl;
};

static int repeated_key(void *ud, const char *path, const char *key)
{
    struct repeat_why *r = ud;
    snprintf(r->why, r->wl, "config.json%s%s: key '%.64s' is given twice", *path ? " " : "", path, key);
    return 1;
}

static int parse_tensors(const cJSON *arr, const char *key, kd_model_tensor_spec **out, int *n, bool optional,
                         char *why, size_t wl)
{
    if (!arr && optional)
        return 0;
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) == 0)
        return snprintf(why, wl, "config.json: '%s' must be a non-empty array", key), -1;
    int count = cJSON_GetArraySize(arr);
    *out = calloc((size_t)count, sizeof **out);
    if (!*out)
        return snprintf(why, wl, "out of memory"), -1;
    *n = count;
    for (int i = 0; i < count; i++) {
        const cJSON *t = cJSON_GetArrayItem(arr, i);
        static const char *const input_keys[] = {"name", "datatype", "shape", NULL};
        static const char *const output_keys[] = {"name", "datatype", "shape", "label_filename", NULL};
        bool outputs = strcmp(key, "outputs") == 0;
        char where[48];
        snprintf(where, sizeof where, "config.json %s[%d]", key, i);
        if (check_keys(t, outputs ? output_keys : input_keys, where, why, wl))
            return -1;
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "datatype");
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
        if (!cJSON_IsString(name) || !name->valuestring[0] || !cJSON_IsString(dt) || !cJSON_IsArray(shape) ||
            cJSON_GetArraySize(shape) > KILN_MAX_DIMS)
            return snprintf(why, wl, "config.json: %s[%d] needs a name, a datatype and a shape of at most %d dims",
                            key, i, KILN_MAX_DIMS),
                   -1;
        bool known = false;
        for (size_t k = 0; k < sizeof datatypes / sizeof datatypes[0]; k++)
            known |= strcmp(dt->valuestring, datatypes[k]) == 0;
        if (!known)
            return snprintf(why, wl, "config.json: %s '%.64s' has unknown datatype '%.16s'", key,
                            name->valuestring, dt->valuestring),
                   -1;
        kd_model_tensor_spec *s = &(*out)[i];
        s->ndim = cJSON_GetArraySize(shape);
        for (int d = 0; d < s->ndim; d++)
            if (!json_int(cJSON_GetArrayItem(shape, d), -1, INT64_C(1) << 40, &s->shape[d]) || s->shape[d] == 0)
                return snprintf(why, wl, "config.json: %s '%.64s' shape[%d] must be -1 or positive", key,
                                name->valuestring, d),
                       -1;
        s->name = strdup(name->valuestring);
        s->datatype = strdup(dt->valuestring);
        if (!s->name || !s->datatype)
            return snprintf(why, wl, "out of memory"), -1;
        const cJSON *labels = cJSON_GetObjectItemCaseSensitive(t, "label_filename");
        /* "" is Triton's "no labels"; otherwise a plain file name, never a path out of the folder */
        if (labels && (!cJSON_IsString(labels) ||
                       (labels->valuestring[0] && !kd_repository_name_valid(labels->valuestring))))
            return snprintf(
                       why, wl,
                       "config.json: output '%.64s': label_filename must be the name of a file in the version "
                       "or the model folder (" KD_MODEL_NAME_RULE ")",
                       name->valuestring),
                   -1;
        if (labels && labels->valuestring[0] && !(s->label_filename = strdup(labels->valuestring)))
            return snprintf(why, wl, "out of memory"), -1;
    }
    return 0;
}

int kd_repository_config_parse(const char *text, kd_model_config *c, bool io_optional, char *why, size_t wl)
{
    memset(c, 0, sizeof *c);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(text, &end, 1);
    int rc = -1;
    int64_t v = 0;
    if (!j) {
        /* where it went wrong, as a request body's error says: a trailing comma is a line away */
        size_t at = end && end >= text ? (size_t)(end - text) : 0, line = 1;
        for (size_t i = 0; i < at && text[i]; i++)
            line += text[i] == '\n';
        snprintf(why, wl, "config.json: not valid JSON (line %zu, byte %zu)", line, at);
        goto out;
    }
    if (!cJSON_IsObject(j)) {
        snprintf(why, wl, "config.json: not a JSON object");
        goto out;
    }
    long nul = kiln__json_nul_escape_at(text, strlen(text));
    if (nul >= 0) { /* a device or a file name would read as its part before the NUL */
        snprintf(why, wl, "config.json: a string holds \\u0000 (a NUL character) at byte %ld", nul);
        goto out;
    }
    struct repeat_why rw = {why, wl};
    int repeats = kiln__json_repeated_keys(j, repeated_key, &rw);
    if (repeats != 0) {
        if (repeats < 0)
            snprintf(why, wl, "out of memory");
        goto out;
    }
    static const char *const top_keys[] = {"inputs", "outputs",        "max_batch_size", "dynamic_batching",
                                           "device", "instance_count", "version_policy", NULL};
    static const char *const batching_keys[] = {"max_queue_delay_us", "preferred_batch_sizes", NULL};
    static const char *const policy_keys[] = {"latest", "all", "specific", NULL};
    static const char *const latest_keys[] = {"num_versions", NULL}, *const all_keys[] = {NULL},
                             *const specific_keys[] = {"versions", NULL};
    const cJSON *vp = cJSON_GetObjectItemCaseSensitive(j, "version_policy");
    if (check_keys(j, top_keys, "config.json", why, wl) ||
        check_keys(cJSON_GetObjectItemCaseSensitive(j, "dynamic_batching"), batching_keys,
                   "config.json dynamic_batching", why, wl) ||
        check_keys(vp, policy_keys, "config.json version_policy", why, wl) ||
        check_keys(cJSON_GetObjectItemCaseSensitive(vp, "latest"), latest_keys,
                   "config.json version_policy.latest", why, wl) ||
        check_keys(cJSON_GetObjectItemCaseSensitive(vp, "all"), all_keys, "config.json version_policy.all", why,
                   wl) ||
        check_keys(cJSON_GetObjectItemCaseSensitive(vp, "specific"), specific_keys,
                   "config.json version_policy.specific", why, wl))
        goto out;
    if (parse_tensors(cJSON_GetObjectItemCaseSensitive(j, "inputs"), "inputs", &c->inputs, &c->ninputs,
                      io_optional, why, wl) ||
        parse_tensors(cJSON_GetObjectItemCaseSensitive(j, "outputs"), "outputs", &c->outputs, &c->noutputs,
                      io_optional, why, wl))
        goto out;
    const cJSON *mb = cJSON_GetObjectItemCaseSensitive(j, "max_batch_size");
    if (mb && !json_int(mb, 0, 1 << 20, &v)) {
        snprintf(why, wl, "config.json: max_batch_size must be an integer within 0..%d", 1 << 20);
        goto out;
    }
    c->max_batch_size = mb ? (int)v : 0;
    const cJSON *db = cJSON_GetObjectItemCaseSensitive(j, "dynamic_batching");
    if (db && c->max_batch_size == 0) {
        /* applied or refused, never dropped: a model that does not batch has nothing to batch */
        snprintf(why, wl,
                 "config.json: dynamic_batching needs max_batch_size 1 or more (it is %s): set it, or remove "
                 "dynamic_batching",
                 mb ? "0" : "not set, so 0");
        goto out;
    }
    if (db) {
        const cJSON *delay = cJSON_GetObjectItemCaseSensitive(db, "max_queue_delay_us");
        const cJSON *pref = cJSON_GetObjectItemCaseSensitive(db, "preferred_batch_sizes");
        if (!cJSON_IsObject(db) || (delay && !json_int(delay, 0, INT64_C(3600000000), &c->max_queue_delay_us)) ||
            (pref && (!cJSON_IsArray(pref) || cJSON_GetArraySize(pref) > 16))) {
            snprintf(why, wl,
                     "config.json: dynamic_batching must be an object, its max_queue_delay_us an integer within "
                     "0..3600000000 (an hour) and its preferred_batch_sizes a list of at most 16");
            goto out;
        }
        for (int i = 0; pref && i < cJSON_GetArraySize(pref); i++) {
            const cJSON *size = cJSON_GetArrayItem(pref, i);
            if (!json_int(size, 1, c->max_batch_size, &c->preferred_batch_sizes[i])) {
                char given[32] = "not an integer";
                if (cJSON_IsNumber(size))
                    snprintf(given, sizeof given, "%g", size->valuedouble);
                snprintf(why, wl,
                         "config.json: preferred_batch_sizes[%d] is %s; it must be an integer within "
                         "1..max_batch_size (%d)",
                         i, given, c->max_batch_size);
                goto out;
            }
            c->npreferred++;
        }
    }
    const cJSON *dev = cJSON_GetObjectItemCaseSensitive(j, "device");
    if (dev && (!cJSON_IsString(dev) || !dev->valuestring[0])) {
        snprintf(why, wl, "config.json: device must be a string such as \"cpu\" or \"cuda:0\"");
        goto out;
    }
    c->device = strdup(dev ? dev->valuestring : "cpu");
    const cJSON *ic = cJSON_GetObjectItemCaseSensitive(j, "instance_count");
    if (ic && !json_int(ic, 1, 1024, &v)) {
        snprintf(why, wl, "config.json: instance_count must be within 1..1024");
        goto out;
    }
    c->instance_count = ic ? (int)v : 1;
    c->policy = KD_VERSION_LATEST;
    c->latest_n = 1;
    if (vp) {
        /* Exactly one policy, each as Triton spells it; a policy that does not parse is an error,
         * never a fall-through to the next one. */
        const cJSON *latest = cJSON_GetObjectItemCaseSensitive(vp, "latest");
        const cJSON *all = cJSON_GetObjectItemCaseSensitive(vp, "all");
        const cJSON *spec = cJSON_GetObjectItemCaseSensitive(vp, "specific");
        const cJSON *nv = cJSON_GetObjectItemCaseSensitive(latest, "num_versions");
        const cJSON *vs = cJSON_GetObjectItemCaseSensitive(spec, "versions");
        if (!cJSON_IsObject(vp) || (latest != NULL) + (all != NULL) + (spec != NULL) != 1) {
            snprintf(why, wl, "config.json: version_policy must hold exactly one of latest, all and specific");
            goto out;
        }
        if (latest && (!cJSON_IsObject(latest) || !json_int(nv, 1, 1 << 20, &v))) {
            snprintf(why, wl, "config.json: version_policy.latest must be {\"num_versions\": N}, N within 1..%d",
                     1 << 20);
            goto out;
        }
        if (all && !cJSON_IsObject(all)) {
            snprintf(why, wl, "config.json: version_policy.all must be {}");
            goto out;
        }
        if (spec && (!cJSON_IsObject(spec) || !cJSON_IsArray(vs) || cJSON_GetArraySize(vs) == 0)) {
            snprintf(why, wl,
                     "config.json: version_policy.specific must be {\"versions\": [V, ...]}, at least one");
            goto out;
        }
        if (latest) {
            c->latest_n = (int)v;
        } else if (all) {
            c->policy = KD_VERSION_ALL;
        } else if (spec) {
            c->policy = KD_VERSION_SPECIFIC;
            c->nspecific = cJSON_GetArraySize(vs);
            c->specific = calloc((size_t)c->nspecific + 1, sizeof *c->specific);
            for (int i = 0; c->specific && i < c->nspecific; i++)
                if (!json_int(cJSON_GetArrayItem(vs, i), 1, INT64_MAX / 2, &c->specific[i])) {
                    snprintf(why, wl, "config.json: specific versions must be positive integers");
                    goto out;
                }
        }
    }
    rc = c->device ? 0 : (snprintf(why, wl, "out of memory"), -1);
out:
    cJSON_Delete(j);
    if (rc != 0)
        kd_repository_config_free(c);
    return rc;
}
