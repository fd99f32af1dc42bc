/*
 * engine/nn/module-state.c — a module's state dict in and out: loading named tensors
 * into the module's own tensors, in place (strict or lenient, with a report of what was
 * missing, unexpected or mismatched), a module's weights read from and written to
 * safetensors, and the list of its generators (the random streams of dropout) that
 * training checkpoints save.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/autodiff.h"
#include "kiln/record.h"
#include "nn-impl.h"
#include "tensor-impl.h"

static void report_add(kiln_load_report *r, const char *section, const char *name, bool *first)
{
    size_t len = strlen(r->text);
    if (len + 8 >= sizeof r->text)
        return;
    if (*first) {
        snprintf(r->text + len, sizeof r->text - len, "%s%s: %s", len ? "; " : "", section, name);
        *first = false;
    } else {
        snprintf(r->text + len, sizeof r->text - len, ", %s", name);
    }
}

typedef struct load_ctx {
    int n;
    const char *const *names;
    kiln_tensor *const *tensors;
    bool *used;
    kiln_tensor **ready; /* per source tensor: its value in the module tensor's dtype and device */
    kiln_load_report *rep;
    bool first;
    int pass; /* LOAD_CHECK, LOAD_CONVERT, LOAD_UNALIAS, LOAD_WRITE */
} load_ctx;

/* A load runs in passes over the module's tensors, so that nothing is written until every
 * name and shape has been checked and every value converted. */
enum {
    LOAD_CHECK,
    LOAD_CONVERT,
    LOAD_UNALIAS,
    LOAD_WRITE
};

static int find_name(const load_ctx *c, const char *name)
{
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->names[i], name))
            return i;
    return -1;
}

static int check_one(load_ctx *c, const char *name, kiln__entry *e, int i)
{
    if (i < 0) {
        c->rep->missing++;
        report_add(c->rep, "missing", name, &c->first);
        return 0;
    }
    c->used[i] = true;
    kiln_tensor *src = c->tensors[i];
    bool same = src && kiln_tensor_ndim(src) == kiln_tensor_ndim(e->t);
    for (int d = 0; same && d < kiln_tensor_ndim(src); d++)
        same = kiln_tensor_shape(src)[d] == kiln_tensor_shape(e->t)[d];
    if (!same) {
        char a[96], b[96];
        kiln_tensor_describe(src, a, sizeof a);
        kiln_tensor_describe(e->t, b, sizeof b);
        kiln__error_set("load_state_dict: \"%s\": source %s does not match the module's %s", name,
                        src ? a : "NULL", b);
        return 1;
    }
    return 0;
}

/* The source's value in the module tensor's dtype, on its device. */
static int convert_one(load_ctx *c, const char *name, kiln__entry *e, int i)
{
    kiln_tensor *t = kiln_keep(kiln_cast(c->tensors[i], kiln_tensor_dtype(e->t)));
    c->ready[i] = t ? kiln_keep(kiln_to_device(t, kiln_tensor_device(e->t))) : NULL;
    kiln_tensor_release(t);
    if (!c->ready[i]) {
        kiln__error_restate("load_state_dict: \"%s\": %s", name, kiln_error());
        return 1;
    }
    return 0;
}

/* A converted source that shares memory with this module tensor (a view of the module's own
 * state) would be overwritten by an earlier write before it is read: it gets a copy. */
static int unalias_one(load_ctx *c, kiln__entry *e)
{
    for (int k = 0; k < c->n; k++) {
        if (!c->ready[k] || !kiln_tensor_shares_storage(c->ready[k], e->t))
            continue;
        kiln_tensor *copy = kiln_keep(kiln_clone(c->ready[k]));
        if (!copy) {
            kiln__error_restate("load_state_dict: \"%s\": %s", c->names[k], kiln_error());
            return 1;
        }
        kiln_tensor_release(c->ready[k]);
        c->ready[k] = copy;
    }
    return 0;
}

/* Into the module's own tensor, not a new one in its place: whoever holds it (an optimizer
 * made before the load, as PyTorch's usual order has it) sees the loaded values. */
static int write_one(load_ctx *c, const char *name, kiln__entry *e, int i)
{
    char op[200];
    snprintf(op, sizeof op, "load_state_dict: \"%.150s\"", name);
    return kiln__copy_into(e->t, c->ready[i], op) < 0 ? 1 : 0;
}

static int load_one(void *ud, const char *name, kiln__entry *e)
{
    load_ctx *c = ud;
    int i = find_name(c, name);
    switch (c->pass) {
    case LOAD_CHECK: return check_one(c, name, e, i);
    case LOAD_CONVERT: return i < 0 ? 0 : convert_one(c, name, e, i);
    case LOAD_UNALIAS: return unalias_one(c, e);
    default: return i < 0 ? 0 : write_one(c, name, e, i);
    }
}

typedef struct named_index {
    const char *name;
    int i;
} named_index;

static int by_name(const void *a, const void *b)
{
    const named_index *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->i > y->i) - (x->i < y->i);
}

/* Every name present and none given twice. A NULL name was skipped without a word, and a
 * repeated one loaded its first tensor and listed the second as "unexpected", naming a key
 * the module has: both are the caller's mistake, so they refuse the load. Sorted, so that a
 * state dict of many thousand entries costs n log n. */
static int check_names(int n, const char *const *names)
{
    for (int i = 0; i < n; i++)
        if (!names[i])
            return kiln__error_set("load_state_dict: name %d is NULL", i);
    if (n < 2)
        return 0;
    named_index *ix = malloc((size_t)n * sizeof *ix);
    if (!ix)
        return kiln__error_set("load_state_dict: out of memory");
    for (int i = 0; i < n; i++)
        ix[i] = (named_index){names[i], i};
    qsort(ix, (size_t)n, sizeof *ix, by_name);
    int rc = 0;
    for (int k = 1; k < n && rc == 0; k++)
        if (!strcmp(ix[k - 1].name, ix[k].name))
            rc = kiln__error_set("load_state_dict: key \"%.150s\" is given twice (names %d and %d)", ix[k].name,
                                 ix[k - 1].i, ix[k].i);
    free(ix);
    return rc;
}

static void load_ctx_free(load_ctx *c)
{
    for (int i = 0; c->ready && i < c->n; i++)
        kiln_tensor_release(c->ready[i]);
    free(c->ready);
    free(c->used);
}

int kiln_module_load_state_dict(kiln_module *m, int n, const char *const *names, kiln_tensor *const *tensors,
                                bool strict, kiln_load_report *report)
{
    if (!m || n < 0 || (n > 0 && (!names || !tensors)))
        return kiln__error_set("load_state_dict: no module or bad arguments");
    kiln_load_report local;
    kiln_load_report *rep = report ? report : &local;
    memset(rep, 0, sizeof *rep);
    if (check_names(n, names) < 0)
        return -1;
    load_ctx c = {.n = n, .names = names, .tensors = tensors, .rep = rep, .first = true, .pass = LOAD_CHECK};
    c.used = calloc((size_t)n + 1, sizeof *c.used);
    c.ready = calloc((size_t)n + 1, sizeof *c.ready);
    if (!c.used || !c.ready) {
        load_ctx_free(&c);
        return kiln__error_set("load_state_dict: out of memory");
    }
    int rc = kiln__module_walk_all(m, load_one, &c);
    if (rc) {
        load_ctx_free(&c);
        return -1;
    }
    c.first = true;
    for (int i = 0; i < n; i++)
        if (!c.used[i]) {
            rep->unexpected++;
            report_add(rep, "unexpected", names[i], &c.first); /* never NULL: check_names */
        }
    if (strict && (rep->missing || rep->unexpected)) {
        load_ctx_free(&c);
        return kiln__error_set("load_state_dict (strict): %d missing and %d unexpected keys: %s", rep->missing,
                               rep->unexpected, rep->text);
    }
    kiln_no_grad_begin();
    for (c.pass = LOAD_CONVERT; rc == 0 && c.pass <= LOAD_WRITE; c.pass++)
        rc = kiln__module_walk_all(m, load_one, &c);
    kiln_no_grad_end();
    load_ctx_free(&c);
    return rc ? -1 : 0;
}

int kiln_module_load_safetensors(kiln_module *m, const char *path, bool strict, kiln_load_report *report)
{
    if (!m)
        return kiln__error_set("load_safetensors: no module");
    kiln_safetensors *st = kiln_safetensors_open(path);
    if (!st)
        return -1;
    int n = kiln_safetensors_count(st);
    const char **names = calloc((size_t)n + 1, sizeof *names);
    kiln_tensor **ts = calloc((size_t)n + 1, sizeof *ts);
    int rc = -1;
    if (!names || !ts) {
        kiln__error_set("load_safetensors: out of memory");
        goto out;
    }
    /* Load on the device of the first module tensor; import moves them anyway. */
    kiln_named_tensor first;
    kiln_device *dev = NULL;
    if (kiln_module_state_dict(m, &first, 1) > 0)
        dev = kiln_tensor_device(first.tensor);
    if (!dev) {
        rc = kiln_module_load_state_dict(m, 0, NULL, NULL, strict, report);
        goto out;
    }
    /* Only the tensors the module has are read: the others are reported as unexpected (by name,
     * from a NULL tensor), so a file with extra entries in a dtype kiln cannot hold (an int8
     * scale, a float8 copy) still loads leniently, and nothing is read only to be dropped. */
    for (int i = 0; i < n; i++) {
        names[i] = kiln_safetensors_name(st, i);
        if (!kiln_module_lookup(m, names[i]))
            continue;
        ts[i] = kiln_keep(kiln_safetensors_load(st, names[i], dev));
        if (!ts[i])
            goto out;
    }
    rc = kiln_module_load_state_dict(m, n, names, ts, strict, report);
out:
    if (ts)
        for (int i = 0; i < n; i++)
            kiln_tensor_release(ts[i]);
    free(ts);
    free(names);
    kiln_safetensors_close(st);
    return rc;
}

int kiln_module_save_safetensors(kiln_module *m, const char *path)
{
    int n = kiln_module_state_dict(m, NULL, 0);
    if (n < 0)
        return -1;
    kiln_named_tensor *nt = calloc((size_t)n + 1, sizeof *nt);
    const char **names = calloc((size_t)n + 1, sizeof *names);
    kiln_tensor **ts = calloc((size_t)n + 1, sizeof *ts);
    int rc = -1;
    if (!nt || !names || !ts) {
        kiln__error_set("save_safetensors: out of memory");
    } else if (kiln_module_state_dict(m, nt, n) == n) {
        for (int i = 0; i < n; i++) {
            names[i] = nt[i].name;
            ts[i] = nt[i].tensor;
        }
        rc = kiln_safetensors_save(path, n, names, ts, 0, NULL, NULL);
    }
    free(nt);
    free(names);
    free(ts);
    return rc;
}

/* ------------------------------------------------------------------ generators */

static int collect_generators(kiln_module *m, kiln_generator **out, const char **paths, int max, int n)
{
    if (n < max) {
        if (out)
            out[n] = &m->gen;
        if (paths)
            paths[n] = kiln_module_path(m);
    }
    n++;
    for (int i = 0; i < m->nchildren; i++)
        n = collect_generators(m->children[i].m, out, paths, max, n);
    return n;
}

int kiln_module_generators(kiln_module *m, kiln_generator **out, const char **paths, int max)
{
    if (!m)
        return kiln__error_set("kiln_module_generators: no module");
    return collect_generators(m, out, paths, (out || paths) && max > 0 ? max : 0, 0);
}
