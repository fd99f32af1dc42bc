/*
 * engine/json-keys.c — keys a JSON document gives twice in one object (json-keys-impl.h).
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json-keys-impl.h"

static int key_order(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Each repeated key of the object o once; 0, each's nonzero, or -1 when out of memory. */
static int object_repeats(const cJSON *o, const char *path, int (*each)(void *, const char *, const char *),
                          void *ud)
{
    int n = cJSON_GetArraySize(o);
    if (n <= 16) { /* a key repeated is reported at its first place; later places skip it */
        for (const cJSON *a = o->child; a; a = a->next) {
            bool seen = false, again = false;
            for (const cJSON *p = o->child; p != a && !seen; p = p->next)
                seen = strcmp(p->string, a->string) == 0;
            for (const cJSON *b = a->next; b && !seen && !again; b = b->next)
                again = strcmp(a->string, b->string) == 0;
            int rc = again ? each(ud, path, a->string) : 0;
            if (rc)
                return rc;
        }
        return 0;
    }
    const char **keys = malloc((size_t)n * sizeof *keys);
    if (!keys)
        return -1;
    int i = 0, rc = 0;
    for (const cJSON *c = o->child; c; c = c->next)
        keys[i++] = c->string;
    qsort(keys, (size_t)n, sizeof *keys, key_order);
    for (i = 1; i < n && !rc; i++)
        if (strcmp(keys[i - 1], keys[i]) == 0 && (i < 2 || strcmp(keys[i - 2], keys[i]) != 0))
            rc = each(ud, path, keys[i]);
    free(keys);
    return rc;
}

static int walk(const cJSON *v, const char *path, int (*each)(void *, const char *, const char *), void *ud)
{
    int rc = cJSON_IsObject(v) && cJSON_GetArraySize(v) > 1 ? object_repeats(v, path, each, ud) : 0;
    int i = 0;
    for (const cJSON *c = v->child; c && !rc; c = c->next, i++) {
        if (!cJSON_IsObject(c) && !cJSON_IsArray(c))
            continue;
        char sub[256];
        if (cJSON_IsObject(v))
            snprintf(sub, sizeof sub, "%s%s%.64s", path, *path ? "." : "", c->string);
        else
            snprintf(sub, sizeof sub, "%s[%d]", path, i);
        rc = walk(c, sub, each, ud);
    }
    return rc;
}

int kiln__json_repeated_keys(const cJSON *root, int (*each)(void *ud, const char *path, const char *key), void *ud)
{
    return root ? walk(root, "", each, ud) : 0;
}

long kiln__json_nul_escape_at(const char *text, size_t len)
{
    for (size_t i = 0; i + 1 < len; i++) {
        if (text[i] != '\\')
            continue;
        /* an escape: "\u0000" (any case of hex digits) is a NUL; anything else, and an escaped
         * backslash before a "u0000" that is then plain text, is skipped whole */
        if (text[i + 1] == 'u' && i + 5 < len && text[i + 2] == '0' && text[i + 3] == '0' && text[i + 4] == '0' &&
            text[i + 5] == '0')
            return (long)i;
        i++;
    }
    return -1;
}

cJSON *kiln__json_parse_whole(const char *text, size_t *at, bool *trailing)
{
    const char *end = NULL;
    *trailing = false;
    *at = 0;
    cJSON *v = cJSON_ParseWithOpts(text, &end, false);
    if (!v) {
        *at = end && end >= text ? (size_t)(end - text) : 0;
        return NULL;
    }
    /* Whitespace as cJSON skips it (require_null_terminated's rule): any byte up to ' '. */
    const char *p = end;
    while (*p && (unsigned char)*p <= ' ')
        p++;
    if (*p) {
        *at = (size_t)(p - text);
        *trailing = true;
        cJSON_Delete(v);
        return NULL;
    }
    return v;
}
