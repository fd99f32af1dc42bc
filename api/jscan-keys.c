/*
 * api/jscan-keys.c — the keys of an object the scanner checks for repeats (jscan.h, "Keys"):
 * compared after unescaping, each with the ones before while an object is small, sorted when a
 * large one closes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jscan-impl.h"

/* A key's bytes as they unescape, one at a time (keys read and found valid before). */
struct key_cur {
    const char *p, *end;
    char enc[4];
    size_t n, i;
};

/* The key's next byte, or -1 at its closing quote. */
static int key_byte(struct key_cur *c)
{
    if (c->i < c->n)
        return (unsigned char)c->enc[c->i++];
    if (*c->p == '"')
        return -1;
    struct kd_jscan t;
    kd_jscan_init(&t, c->p, (size_t)(c->end - c->p));
    c->p = kd_jscan_str_char(&t, c->p, c->enc, &c->n);
    c->i = 1;
    return (unsigned char)c->enc[0];
}

/* The keys at a and b (their opening quotes) in the order of their unescaped bytes. */
static int key_cmp(const char *a, const char *b, const char *end)
{
    /* Most keys hold no escape: plain bytes decide it without decoding. */
    while (*++a == *++b && *a != '"' && *a != '\\')
        ;
    if (*a != '\\' && *b != '\\')
        return *a == *b ? 0 : *a == '"' ? -1 : *b == '"' ? 1 : (unsigned char)*a < (unsigned char)*b ? -1 : 1;
    struct key_cur x = {a, end, {0}, 0, 0}, y = {b, end, {0}, 0, 0};
    for (int c, d;;)
        if ((c = key_byte(&x)) != (d = key_byte(&y)) || c < 0)
            return c == d ? 0 : c < d ? -1 : 1;
}

/* qsort's order of a large object's keys, each held as (where it is, the body's end): by key,
 * then by place, so that a repeat follows the first of its key. */
static int key_order(const void *x, const void *y)
{
    const char *const *a = x, *const *b = y;
    int c = key_cmp(a[0], b[0], a[1]);
    return c ? c : (a[0] > b[0]) - (a[0] < b[0]);
}

/* Fails s at the repeated key at `at`, quoting (40 bytes of) it. */
static int key_repeated(struct kd_jscan *s, const char *at)
{
    struct kd_jscan t;
    char key[41];
    kd_jscan_init(&t, at, (size_t)(s->end - at));
    long n = kd_jscan_string(&t, key, sizeof key); /* valid: it was read before */
    if (!s->err)
        snprintf(s->errbuf, sizeof s->errbuf, "duplicate key '%s%s' in an object", key, n == -2 ? "..." : "");
    s->p = at;
    return kd_jscan_fail(s, s->errbuf);
}

/* Notes the key at `at` of the checked object k: 0, or -1 with s failed when k had it already. */
int kd_jscan_key_add(struct kd_jscan *s, struct kd_jkeys *k, const char *at)
{
    /* the first bytes tell most keys apart without a call (unless one is an escape) */
    for (size_t i = 0; i < k->n && k->n < KD_JKEYS_INLINE; i++)
        if ((k->at[i][1] == at[1] || k->at[i][1] == '\\' || at[1] == '\\') && key_cmp(k->at[i], at, s->end) == 0)
            return key_repeated(s, at);
    if (k->n < KD_JKEYS_INLINE)
        return k->at[k->n++] = at, 0;
    if (!k->heap || k->n == k->cap) {
        size_t cap = k->cap ? 2 * k->cap : 4 * KD_JKEYS_INLINE;
        const char **h = realloc(k->heap, 2 * cap * sizeof *h);
        if (!h)
            return kd_jscan_fail(s, "out of memory"); /* which frees k->heap */
        for (size_t i = 0; !k->heap && i < k->n; i++)
            h[2 * i] = k->at[i], h[2 * i + 1] = s->end;
        k->heap = h;
        k->cap = cap;
    }
    k->heap[2 * k->n] = at;
    k->heap[2 * k->n++ + 1] = s->end;
    return 0;
}

/* The checked object k has closed: a large one's keys are sorted and compared now. */
int kd_jscan_keys_close(struct kd_jscan *s, struct kd_jkeys *k)
{
    s->keys = k->outer;
    if (!k->heap)
        return 0;
    qsort(k->heap, k->n, 2 * sizeof *k->heap, key_order);
    const char *first = NULL; /* of the repeats, the one the document reaches first */
    for (size_t i = 2; i < 2 * k->n; i += 2)
        if ((!first || k->heap[i] < first) && key_cmp(k->heap[i - 2], k->heap[i], s->end) == 0)
            first = k->heap[i];
    free(k->heap);
    k->heap = NULL;
    return first ? key_repeated(s, first) : 0;
}
