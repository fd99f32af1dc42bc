/*
 * storage/torch-rename.c — the skip and rename rules of a .pt import: each entry's flattened
 * name is matched against the caller's POSIX extended regexes, skipped or rewritten (\0-\9
 * in a replacement name the match's groups), and the result is indexed by name, refusing two
 * entries that end up with the same one.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error-impl.h"
#include "torch-import-impl.h"

typedef struct pt_buf {
    char s[PT_MAX_NAME + 1];
    size_t n;
    bool overflow;
} pt_buf;

static void pt_buf_put(pt_buf *b, const char *p, size_t n)
{
    if (b->n + n > PT_MAX_NAME) {
        b->overflow = true;
        return;
    }
    memcpy(b->s + b->n, p, n);
    b->n += n;
    b->s[b->n] = 0;
}

/* Replace every match of re in `in` with repl (\0-\9 expand to the match and its groups). */
static int pt_replace_all(kiln_torch_file *pt, const regex_t *re, const char *repl, const char *in, pt_buf *out)
{
    out->n = 0;
    out->s[0] = 0;
    out->overflow = false;
    size_t pos = 0, len = strlen(in);
    regmatch_t m[10];
    bool after_match = false;
    while (pos <= len && !out->overflow && regexec(re, in + pos, 10, m, pos > 0 ? REG_NOTBOL : 0) == 0) {
        /* An empty match right after a match is not a new one (".*" on "abc" gives one
         * replacement, as Rust's regex and Perl do): keep one character and go on. */
        if (after_match && m[0].rm_eo == 0) {
            if (pos < len)
                pt_buf_put(out, in + pos, 1);
            pos++;
            after_match = false;
            continue;
        }
        pt_buf_put(out, in + pos, (size_t)m[0].rm_so);
        for (const char *r = repl; *r; r++) {
            if (r[0] == '\\' && r[1] >= '0' && r[1] <= '9') {
                const regmatch_t *g = &m[r[1] - '0'];
                if (g->rm_so >= 0)
                    pt_buf_put(out, in + pos + g->rm_so, (size_t)(g->rm_eo - g->rm_so));
                r++;
            } else if (r[0] == '\\' && r[1] == '\\') {
                pt_buf_put(out, "\\", 1);
                r++;
            } else {
                pt_buf_put(out, r, 1);
            }
        }
        size_t end = pos + (size_t)m[0].rm_eo;
        after_match = m[0].rm_eo != m[0].rm_so;
        if (!after_match) { /* an empty match: keep one character and move on */
            if (end < len)
                pt_buf_put(out, in + end, 1);
            end++;
        }
        pos = end;
    }
    if (pos < len)
        pt_buf_put(out, in + pos, len - pos);
    if (out->overflow)
        return kiln__error_set("torch %s: renaming '%.200s' gives a name longer than %d bytes", pt->label, in,
                               PT_MAX_NAME);
    return 0;
}

void kiln__pt_rules_free(pt_rules *r)
{
    for (int i = 0; i < r->nr; i++)
        regfree(&r->renames[i]);
    for (int i = 0; i < r->ns; i++)
        regfree(&r->skips[i]);
    free(r->renames);
    free(r->skips);
}

static int pt_compile(kiln_torch_file *pt, regex_t *re, const char *pattern, const char *kind, int i)
{
    if (!pattern)
        return kiln__error_set("torch %s: %s pattern %d is NULL", pt->label, kind, i);
    int rc = regcomp(re, pattern, REG_EXTENDED);
    if (rc != 0) {
        char msg[160];
        regerror(rc, re, msg, sizeof msg);
        return kiln__error_set("torch %s: %s pattern %d '%.200s' is not a valid regex: %s", pt->label, kind, i,
                               pattern, msg);
    }
    return 0;
}

/* Every \1-\9 in replacement i names a group pattern i has (a missing one would expand to
 * nothing and silently shorten names); scanned as pt_replace_all reads it. */
static int pt_check_groups(kiln_torch_file *pt, const regex_t *re, const kiln_torch_options *o, int i)
{
    for (const char *r = o->rename_replacements[i]; *r; r++) {
        if (r[0] != '\\' || !r[1])
            continue;
        if (r[1] >= '1' && r[1] <= '9' && (size_t)(r[1] - '0') > re->re_nsub)
            return kiln__error_set("torch %s: rename replacement %d '%.200s' refers to group %c, but pattern %d "
                                   "'%.200s' has %zu group%s",
                                   pt->label, i, o->rename_replacements[i], r[1], i, o->rename_patterns[i],
                                   re->re_nsub, re->re_nsub == 1 ? "" : "s");
        r++; /* the escaped character */
    }
    return 0;
}

int kiln__pt_rules_compile(kiln_torch_file *pt, const kiln_torch_options *o, pt_rules *r)
{
    memset(r, 0, sizeof *r);
    if (!o)
        return 0;
    if (o->n_renames < 0 || o->n_skips < 0 || (o->n_renames && (!o->rename_patterns || !o->rename_replacements)) ||
        (o->n_skips && !o->skip_patterns))
        return kiln__error_set("torch %s: malformed options (counts without arrays)", pt->label);
    r->renames = calloc((size_t)o->n_renames + 1, sizeof *r->renames);
    r->skips = calloc((size_t)o->n_skips + 1, sizeof *r->skips);
    if (!r->renames || !r->skips)
        return kiln__error_set("torch %s: out of memory", pt->label);
    for (; r->nr < o->n_renames; r->nr++) {
        if (!o->rename_replacements[r->nr])
            return kiln__error_set("torch %s: rename replacement %d is NULL", pt->label, r->nr);
        if (pt_compile(pt, &r->renames[r->nr], o->rename_patterns[r->nr], "rename", r->nr) < 0)
            return -1;
        if (pt_check_groups(pt, &r->renames[r->nr], o, r->nr) < 0) {
            r->nr++; /* compiled: freed with the others */
            return -1;
        }
    }
    for (; r->ns < o->n_skips; r->ns++)
        if (pt_compile(pt, &r->skips[r->ns], o->skip_patterns[r->ns], "skip", r->ns) < 0)
            return -1;
    return 0;
}

static int pt_cmp_order(const void *a, const void *b, void *list)
{
    const pt_list *l = list;
    return strcmp(l->e[*(const int *)a].name, l->e[*(const int *)b].name);
}

/* Skip, then rename. Names are computed for every entry first and the list compacted
 * only once all succeeded, so on an error every string is still owned by its entry. */
int kiln__pt_apply_rules(kiln_torch_file *pt, pt_list *l, const kiln_torch_options *o, const pt_rules *r)
{
    pt_buf *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    int rc = 0;
    if (!a || !b)
        rc = kiln__error_set("torch %s: out of memory", pt->label);
    for (int i = 0; i < l->n && rc == 0; i++) {
        pt_entry *e = &l->e[i];
        bool skip = false;
        for (int k = 0; k < r->ns && !skip; k++)
            skip = regexec(&r->skips[k], e->source, 0, NULL, 0) == 0;
        if (skip)
            continue; /* name stays NULL: dropped below */
        snprintf(a->s, sizeof a->s, "%s", e->source);
        for (int k = 0; k < r->nr && rc == 0; k++) {
            rc = pt_replace_all(pt, &r->renames[k], o->rename_replacements[k], a->s, b);
            if (rc == 0)
                memcpy(a->s, b->s, b->n + 1);
        }
        /* An empty name cannot be looked up for what it was (a bare tensor saved alone is
         * stored as "", and keeps that name) */
        if (rc == 0 && !a->s[0] && e->source[0])
            rc = kiln__error_set("torch %s: renaming '%.200s' gives an empty name", pt->label, e->source);
        if (rc == 0 && !(e->name = strdup(a->s)))
            rc = kiln__error_set("torch %s: out of memory", pt->label);
    }
    free(a);
    free(b);
    if (rc != 0)
        return rc;
    int kept = 0;
    for (int i = 0; i < l->n; i++) {
        if (l->e[i].name) {
            l->e[kept++] = l->e[i];
        } else {
            free(l->e[i].source);
            free(l->e[i].value);
        }
    }
    l->n = kept;
    return 0;
}

int kiln__pt_index(kiln_torch_file *pt, pt_list *l, const char *kind)
{
    l->order = malloc(((size_t)l->n + 1) * sizeof *l->order);
    if (!l->order)
        return kiln__error_set("torch %s: out of memory", pt->label);
    for (int i = 0; i < l->n; i++)
        l->order[i] = i;
    qsort_r(l->order, (size_t)l->n, sizeof *l->order, pt_cmp_order, l);
    for (int i = 1; i < l->n; i++) {
        const pt_entry *x = &l->e[l->order[i - 1]], *y = &l->e[l->order[i]];
        if (strcmp(x->name, y->name) == 0)
            return kiln__error_set("torch %s: %s '%.200s' and '%.200s' both end up named '%.200s'", pt->label,
                                   kind, x->source, y->source, x->name);
    }
    return 0;
}
