/*
 * engine/nn/config.c — layer configs to and from JSON, driven by one field table per
 * layer (name, kind, offset), so no layer writes its own parser and every layer rejects
 * unknown keys, wrong types and out-of-range values the same way, naming the key.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json-keys-impl.h"
#include "nn-impl.h"

static const kiln__field *find_field(const kiln__layer_type *lt, const char *key)
{
    for (int i = 0; i < lt->nfields; i++)
        if (!strcmp(lt->fields[i].name, key))
            return &lt->fields[i];
    return NULL;
}

/* JSON numbers are doubles: accept only those that are exact integers in range. */
static int get_int(const kiln__layer_type *lt, const char *key, const cJSON *v, int64_t *out)
{
    if (!cJSON_IsNumber(v))
        return kiln__error_set("%s config: \"%s\" must be an integer", lt->name, key);
    double d = v->valuedouble;
    if (!(d == floor(d)) || d < -9.0e15 || d > 9.0e15)
        return kiln__error_set("%s config: \"%s\" must be an integer (got %g)", lt->name, key, d);
    *out = (int64_t)d;
    return 0;
}

static int set_field(const kiln__layer_type *lt, const kiln__field *f, const cJSON *v, char *base)
{
    switch (f->kind) {
    case KILN__F_I64:
        return get_int(lt, f->name, v, (int64_t *)(base + f->off));
    case KILN__F_F64:
        if (!cJSON_IsNumber(v))
            return kiln__error_set("%s config: \"%s\" must be a number", lt->name, f->name);
        *(double *)(base + f->off) = v->valuedouble;
        return 0;
    case KILN__F_BOOL:
        if (!cJSON_IsBool(v))
            return kiln__error_set("%s config: \"%s\" must be true or false", lt->name, f->name);
        *(bool *)(base + f->off) = cJSON_IsTrue(v);
        return 0;
    case KILN__F_ENUM:
        if (cJSON_IsString(v))
            for (int i = 0; f->names[i]; i++)
                if (!strcmp(f->names[i], v->valuestring)) {
                    *(int *)(base + f->off) = i;
                    return 0;
                }
        {
            char opts[200] = "";
            for (int i = 0; f->names[i]; i++) {
                size_t l = strlen(opts);
                snprintf(opts + l, sizeof opts - l, "%s\"%s\"", i ? ", " : "", f->names[i]);
            }
            return kiln__error_set("%s config: \"%s\" must be one of %s", lt->name, f->name, opts);
        }
    case KILN__F_I64N:
    case KILN__F_SHAPE: {
        int64_t *arr = (int64_t *)(base + f->off);
        if (cJSON_IsNumber(v)) {
            int64_t x = 0; /* set by get_int on success; GCC -O3 cannot see that */
            if (get_int(lt, f->name, v, &x) < 0)
                return -1;
            int n = f->kind == KILN__F_SHAPE ? 1 : f->n;
            for (int i = 0; i < n; i++)
                arr[i] = x;
            if (f->kind == KILN__F_SHAPE)
                *(int *)(base + f->aux) = 1;
            return 0;
        }
        int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
        bool ok = f->kind == KILN__F_SHAPE ? n >= 1 && n <= f->n : n == f->n;
        if (!ok) {
            if (f->kind == KILN__F_SHAPE)
                return kiln__error_set("%s config: \"%s\" must be an integer or a list of 1 to %d integers",
                                       lt->name, f->name, f->n);
            return kiln__error_set("%s config: \"%s\" must be an integer or a list of %d integers", lt->name,
                                   f->name, f->n);
        }
        for (int i = 0; i < n; i++)
            if (get_int(lt, f->name, cJSON_GetArrayItem(v, i), &arr[i]) < 0)
                return -1;
        if (f->kind == KILN__F_SHAPE)
            *(int *)(base + f->aux) = n;
        return 0;
    }
    }
    return kiln__error_set("%s config: \"%s\" has an unknown kind", lt->name, f->name);
}

int kiln__config_from_cjson(const kiln__layer_type *lt, const void *obj, void *config)
{
    const cJSON *o = obj;
    lt->defaults(config);
    if (!o)
        return 0;
    if (!cJSON_IsObject(o))
        return kiln__error_set("%s config: must be a JSON object", lt->name);
    for (const cJSON *it = o->child; it; it = it->next) {
        const kiln__field *f = find_field(lt, it->string);
        if (!f) {
            char known[400] = "";
            for (int i = 0; i < lt->nfields; i++) {
                size_t l = strlen(known);
                snprintf(known + l, sizeof known - l, "%s%s", i ? ", " : "", lt->fields[i].name);
            }
            return kiln__error_set("%s config: unknown key \"%s\" (known: %s)", lt->name, it->string,
                                   lt->nfields ? known : "none");
        }
        if (set_field(lt, f, it, config) < 0)
            return -1;
    }
    return 0;
}

int kiln__config_from_json(const kiln__layer_type *lt, const char *json, void *config)
{
    if (!json || !config)
        return kiln__error_set("%s config: no JSON text or config", lt->name);
    size_t at;
    bool trailing;
    cJSON *o = kiln__json_parse_whole(json, &at, &trailing);
    if (!o) {
        lt->defaults(config);
        if (trailing)
            return kiln__error_set("%s config: text after the JSON value, at byte %zu: \"%.30s\"", lt->name, at,
                                   json + at);
        return kiln__error_set("%s config: malformed JSON at byte %zu", lt->name, at);
    }
    int rc = kiln__config_from_cjson(lt, o, config);
    cJSON_Delete(o);
    return rc;
}

void *kiln__config_to_cjson(const kiln__layer_type *lt, const void *config)
{
    const char *base = config;
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; o && i < lt->nfields; i++) {
        const kiln__field *f = &lt->fields[i];
        cJSON *v = NULL;
        switch (f->kind) {
        case KILN__F_I64:
            v = cJSON_CreateNumber((double)*(const int64_t *)(base + f->off));
            break;
        case KILN__F_F64:
            v = cJSON_CreateNumber(*(const double *)(base + f->off));
            break;
        case KILN__F_BOOL:
            v = cJSON_CreateBool(*(const bool *)(base + f->off));
            break;
        case KILN__F_ENUM: {
            int e = *(const int *)(base + f->off);
            int n = 0;
            while (f->names[n])
                n++;
            v = cJSON_CreateString(e >= 0 && e < n ? f->names[e] : "?");
            break;
        }
        case KILN__F_I64N:
        case KILN__F_SHAPE: {
            int n = f->kind == KILN__F_SHAPE ? *(const int *)(base + f->aux) : f->n;
            const int64_t *arr = (const int64_t *)(base + f->off);
            v = cJSON_CreateArray();
            for (int k = 0; v && k < n; k++)
                cJSON_AddItemToArray(v, cJSON_CreateNumber((double)arr[k]));
            break;
        }
        }
        if (!v) {
            cJSON_Delete(o);
            return NULL;
        }
        cJSON_AddItemToObject(o, f->name, v);
    }
    return o;
}

char *kiln__config_to_json(const kiln__layer_type *lt, const void *config)
{
    if (!config) {
        kiln__error_set("%s config: NULL", lt->name);
        return NULL;
    }
    cJSON *o = kiln__config_to_cjson(lt, config);
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!s)
        kiln__error_set("%s config: out of memory", lt->name);
    return s;
}
