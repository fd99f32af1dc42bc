/*
 * engine/nn/module.c — the module tree: named parameters, buffers and children, the
 * listing and mapping walks (optimizers, checkpoints and device moves all go through
 * them), train/eval and freeze propagation, and the forward wrapper that runs a layer
 * inside its own scope and names the layer in any error. State dicts in and out of a
 * module are in module-state.c.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/record.h"
#include "nn-impl.h"
#include "tensor-impl.h"

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

/* Loading and moving parameters are not part of any graph. */
static void grad_off(void) { kiln_no_grad_begin(); }
static void grad_on(void) { kiln_no_grad_end(); }

/* Parameters are leaves that accumulate gradients; frozen ones are plain tensors. */
static int set_trainable(kiln_tensor *t, bool on)
{
    if (!kiln_dtype_is_float(kiln_tensor_dtype(t)))
        return 0;
    if (kiln_tensor_requires_grad(t) == on)
        return 0;
    return kiln_requires_grad(t, on) ? 0 : -1;
}

/* ------------------------------------------------------------------ construction */

kiln_module *kiln_module_new(const kiln_module_class *cls, void *self)
{
    if (!cls || !cls->forward) {
        kiln__error_set("kiln_module_new: a class with a forward function is required");
        return NULL;
    }
    kiln_module *m = calloc(1, sizeof *m);
    if (!m) {
        if (cls->destroy)
            cls->destroy(self);
        kiln__error_set("kiln_module_new: out of memory");
        return NULL;
    }
    m->cls = cls;
    m->self = self;
    m->training = true;
    m->gen = kiln_generator_make(0);
    return m;
}

void *kiln_module_self(const kiln_module *m) { return m ? m->self : NULL; }

static void free_names(kiln_module *m)
{
    for (int i = 0; i < m->nnames; i++)
        free(m->names[i]);
    free(m->names);
    m->names = NULL;
    m->nnames = 0;
}

static void invalidate_paths(kiln_module *m)
{
    free(m->path);
    m->path = NULL;
    for (int i = 0; i < m->nchildren; i++)
        invalidate_paths(m->children[i].m);
}

void kiln_module_free(kiln_module *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->nentries; i++) {
        free(m->entries[i].name);
        kiln_tensor_release(m->entries[i].t);
    }
    free(m->entries);
    /* A child's name string belongs to the child (children[i].name aliases it). */
    for (int i = 0; i < m->nchildren; i++)
        kiln_module_free(m->children[i].m);
    free(m->children);
    if (m->cls->destroy)
        m->cls->destroy(m->self);
    free(m->config);
    free(m->name);
    free(m->path);
    free_names(m);
    free(m);
}

static bool valid_local_name(const char *name)
{
    return name && *name && !strchr(name, '.');
}

static bool name_taken(const kiln_module *m, const char *name)
{
    for (int i = 0; i < m->nentries; i++)
        if (!strcmp(m->entries[i].name, name))
            return true;
    for (int i = 0; i < m->nchildren; i++)
        if (!strcmp(m->children[i].name, name))
            return true;
    return false;
}

static int add_entry(kiln_module *m, const char *name, kiln_tensor *t, bool buffer)
{
    const char *what = buffer ? "kiln_module_add_buffer" : "kiln_module_add_parameter";
    if (!m || !t) {
        kiln_tensor_release(t);
        return m ? -1 : kiln__error_set("%s: no module", what);
    }
    if (!valid_local_name(name) || name_taken(m, name)) {
        kiln_tensor_release(t);
        return kiln__error_set("%s: name \"%s\" is empty, dotted or already used", what, name ? name : "");
    }
    if (m->nentries == m->capentries) {
        int cap = m->capentries ? 2 * m->capentries : 4;
        kiln__entry *e = realloc(m->entries, (size_t)cap * sizeof *e);
        if (!e) {
            kiln_tensor_release(t);
            return kiln__error_set("%s: out of memory", what);
        }
        m->entries = e;
        m->capentries = cap;
    }
    char *n = dup_str(name);
    if (!n) {
        kiln_tensor_release(t);
        return kiln__error_set("%s: out of memory", what);
    }
    if (!buffer && set_trainable(t, true) < 0) {
        free(n);
        kiln_tensor_release(t);
        return -1;
    }
    m->entries[m->nentries++] = (kiln__entry){.name = n, .t = t, .buffer = buffer};
    return 0;
}

int kiln_module_add_parameter(kiln_module *m, const char *name, kiln_tensor *t)
{
    return add_entry(m, name, t, false);
}

int kiln_module_add_buffer(kiln_module *m, const char *name, kiln_tensor *t)
{
    return add_entry(m, name, t, true);
}

int kiln_module_add_child(kiln_module *m, const char *name, kiln_module *child)
{
    if (!m || !child) {
        kiln_module_free(child);
        return m ? -1 : kiln__error_set("kiln_module_add_child: no module");
    }
    if (child->parent || !valid_local_name(name) || name_taken(m, name)) {
        if (!child->parent)
            kiln_module_free(child);
        return kiln__error_set("kiln_module_add_child: name \"%s\" is empty, dotted or already used, "
                               "or the child already has a parent", name ? name : "");
    }
    if (m->nchildren == m->capchildren) {
        int cap = m->capchildren ? 2 * m->capchildren : 4;
        kiln__child *c = realloc(m->children, (size_t)cap * sizeof *c);
        if (!c) {
            kiln_module_free(child);
            return kiln__error_set("kiln_module_add_child: out of memory");
        }
        m->children = c;
        m->capchildren = cap;
    }
    char *n = dup_str(name);
    if (!n) {
        kiln_module_free(child);
        return kiln__error_set("kiln_module_add_child: out of memory");
    }
    child->name = n;
    child->parent = m;
    child->training = m->training;
    invalidate_paths(child);
    m->children[m->nchildren++] = (kiln__child){.name = n, .m = child};
    return 0;
}

/* ------------------------------------------------------------------ introspection */

const char *kiln_module_type(const kiln_module *m) { return m ? m->cls->type : "?"; }

const char *kiln_module_path(kiln_module *m)
{
    if (!m)
        return "";
    if (m->path)
        return m->path;
    if (!m->parent)
        return "";
    const char *pp = kiln_module_path(m->parent);
    size_t n = strlen(pp) + strlen(m->name) + 2;
    m->path = malloc(n);
    if (!m->path)
        return m->name;
    snprintf(m->path, n, "%s%s%s", pp, *pp ? "." : "", m->name);
    return m->path;
}

int kiln_module_child_count(const kiln_module *m) { return m ? m->nchildren : 0; }

kiln_module *kiln_module_child_at(kiln_module *m, int i)
{
    return m && i >= 0 && i < m->nchildren ? m->children[i].m : NULL;
}

const char *kiln_module_child_name(const kiln_module *m, int i)
{
    return m && i >= 0 && i < m->nchildren ? m->children[i].name : NULL;
}

kiln_module *kiln_module_find(kiln_module *m, const char *path)
{
    if (!m || !path)
        return NULL;
    if (!*path)
        return m;
    const char *dot = strchr(path, '.');
    size_t len = dot ? (size_t)(dot - path) : strlen(path);
    for (int i = 0; i < m->nchildren; i++)
        if (strlen(m->children[i].name) == len && !strncmp(m->children[i].name, path, len))
            return dot ? kiln_module_find(m->children[i].m, dot + 1) : m->children[i].m;
    return NULL;
}

kiln_tensor *kiln_module_get(kiln_module *m, const char *name)
{
    if (!m || !name)
        return NULL;
    for (int i = 0; i < m->nentries; i++)
        if (!strcmp(m->entries[i].name, name))
            return m->entries[i].t;
    return NULL;
}

static kiln__entry *lookup_entry(kiln_module *m, const char *dotted)
{
    const char *dot = strrchr(dotted, '.');
    kiln_module *owner = m;
    if (dot) {
        size_t len = (size_t)(dot - dotted);
        char *head = malloc(len + 1);
        if (!head)
            return NULL;
        memcpy(head, dotted, len);
        head[len] = 0;
        owner = kiln_module_find(m, head);
        free(head);
        if (!owner)
            return NULL;
    }
    const char *leaf = dot ? dot + 1 : dotted;
    for (int i = 0; i < owner->nentries; i++)
        if (!strcmp(owner->entries[i].name, leaf))
            return &owner->entries[i];
    return NULL;
}

kiln_tensor *kiln_module_lookup(kiln_module *m, const char *dotted)
{
    if (!m || !dotted)
        return NULL;
    kiln__entry *e = lookup_entry(m, dotted);
    return e ? e->t : NULL;
}

/* ------------------------------------------------------------------------- walks */

typedef struct walk {
    char *buf;
    size_t len, cap;
} walk;

static int walk_push(walk *w, const char *part)
{
    size_t need = w->len + strlen(part) + 2;
    if (need > w->cap) {
        size_t cap = need * 2;
        char *b = realloc(w->buf, cap);
        if (!b)
            return kiln__error_set("module walk: out of memory");
        w->buf = b;
        w->cap = cap;
    }
    if (w->len)
        w->buf[w->len++] = '.';
    strcpy(w->buf + w->len, part);
    w->len += strlen(part);
    return 0;
}

static int walk_entries(kiln_module *m, walk *w, kiln__entry_fn fn, void *ud)
{
    size_t base = w->len;
    for (int i = 0; i < m->nentries; i++) {
        if (walk_push(w, m->entries[i].name) < 0)
            return -1;
        int rc = fn(ud, w->buf, &m->entries[i]);
        w->len = base;
        w->buf[base] = 0;
        if (rc)
            return rc;
    }
    for (int i = 0; i < m->nchildren; i++) {
        if (walk_push(w, m->children[i].name) < 0)
            return -1;
        int rc = walk_entries(m->children[i].m, w, fn, ud);
        w->len = base;
        w->buf[base] = 0;
        if (rc)
            return rc;
    }
    return 0;
}

int kiln__module_walk_all(kiln_module *m, kiln__entry_fn fn, void *ud)
{
    walk w = {0};
    if (walk_push(&w, "") < 0)
        return -1;
    w.len = 0;
    w.buf[0] = 0;
    int rc = walk_entries(m, &w, fn, ud);
    free(w.buf);
    return rc;
}

typedef struct list_ctx {
    kiln_module *root;
    kiln_named_tensor *out;
    int max, n;
    int want; /* 1 params, 2 buffers, 3 both */
    bool oom;
} list_ctx;

static int list_one(void *ud, const char *name, kiln__entry *e)
{
    list_ctx *c = ud;
    if (!(c->want & (e->buffer ? 2 : 1)))
        return 0;
    if (c->out && c->n < c->max) {
        char *d = dup_str(name);
        if (!d) {
            c->oom = true;
            return 1;
        }
        c->root->names[c->root->nnames++] = d;
        c->out[c->n] = (kiln_named_tensor){.name = d, .tensor = e->t, .is_buffer = e->buffer};
    }
    c->n++;
    return 0;
}

static int list_entries(kiln_module *m, kiln_named_tensor *out, int max, int want)
{
    if (!m)
        return kiln__error_set("kiln_module_parameters: no module");
    free_names(m);
    if (out && max > 0) {
        m->names = calloc((size_t)max, sizeof *m->names);
        if (!m->names)
            return kiln__error_set("kiln_module_parameters: out of memory");
    }
    list_ctx c = {.root = m, .out = out, .max = out ? max : 0, .want = want};
    int rc = kiln__module_walk_all(m, list_one, &c);
    if (rc < 0 || c.oom)
        return kiln__error_set("kiln_module_parameters: out of memory");
    return c.n;
}

int kiln_module_parameters(kiln_module *m, kiln_named_tensor *out, int max) { return list_entries(m, out, max, 1); }
int kiln_module_buffers(kiln_module *m, kiln_named_tensor *out, int max) { return list_entries(m, out, max, 2); }
int kiln_module_state_dict(kiln_module *m, kiln_named_tensor *out, int max)
{
    /* Parameters first, then buffers, so that optimizers and checkpoints agree on order. */
    int np = list_entries(m, NULL, 0, 1);
    if (np < 0)
        return -1;
    if (!out || max <= 0)
        return list_entries(m, NULL, 0, 3);
    free_names(m);
    m->names = calloc((size_t)max, sizeof *m->names);
    if (!m->names)
        return kiln__error_set("kiln_module_state_dict: out of memory");
    list_ctx c = {.root = m, .out = out, .max = max, .want = 1};
    if (kiln__module_walk_all(m, list_one, &c) < 0 || c.oom)
        return kiln__error_set("kiln_module_state_dict: out of memory");
    list_ctx b = {.root = m, .out = out + (c.n < max ? c.n : max), .max = max - (c.n < max ? c.n : max),
                  .want = 2};
    if (kiln__module_walk_all(m, list_one, &b) < 0 || b.oom)
        return kiln__error_set("kiln_module_state_dict: out of memory");
    return c.n + b.n;
}

typedef struct visit_ctx {
    kiln_module_visit_fn fn;
    void *ud;
} visit_ctx;

static int visit_one(void *ud, const char *name, kiln__entry *e)
{
    visit_ctx *c = ud;
    return c->fn(c->ud, name, e->t, e->buffer);
}

int kiln_module_visit(kiln_module *m, kiln_module_visit_fn fn, void *ud)
{
    if (!m || !fn)
        return kiln__error_set("kiln_module_visit: no module or function");
    visit_ctx c = {fn, ud};
    return kiln__module_walk_all(m, visit_one, &c);
}

/* A replacement keeps the slot's role: parameters stay trainable unless frozen. */
int kiln__module_replace_entry(kiln__entry *e, kiln_tensor *t)
{
    if (!e->buffer && set_trainable(t, !e->frozen) < 0) {
        kiln_tensor_release(t);
        return -1;
    }
    kiln_tensor_release(e->t);
    e->t = t;
    return 0;
}

typedef struct map_ctx {
    kiln_module_map_fn fn;
    void *ud;
} map_ctx;

static int map_one(void *ud, const char *name, kiln__entry *e)
{
    map_ctx *c = ud;
    kiln_tensor *t = c->fn(c->ud, name, e->t, e->buffer);
    if (!t)
        return -1;
    return kiln__module_replace_entry(e, t) < 0 ? -1 : 0;
}

int kiln_module_map(kiln_module *m, kiln_module_map_fn fn, void *ud)
{
    if (!m || !fn)
        return kiln__error_set("kiln_module_map: no module or function");
    map_ctx c = {fn, ud};
    return kiln__module_walk_all(m, map_one, &c) ? -1 : 0;
}

static kiln_tensor *to_device_one(void *ud, const char *name, kiln_tensor *t, bool is_buffer)
{
    kiln_device *dev = ud;
    kiln_tensor *r = kiln_to_device(t, dev);
    if (!r)
        return NULL;
    /* kiln_to_device hands back a result the scope may own; the module keeps it. */
    kiln_keep(r);
    if (kiln_tensor_shares_storage(r, t)) {
        /* Already there: a distinct leaf keeps the module's tensor identity simple. */
        kiln_tensor *c = kiln_keep(kiln_clone(r));
        kiln_tensor_release(r);
        return c;
    }
    return r;
}

int kiln_module_to_device(kiln_module *m, kiln_device *dev)
{
    if (!dev)
        return kiln__error_set("kiln_module_to_device: no device");
    int rc;
    grad_off();
    rc = kiln_module_map(m, to_device_one, dev);
    grad_on();
    return rc;
}

static int64_t count_entries(const kiln_module *m, bool trainable_only)
{
    int64_t n = 0;
    for (int i = 0; i < m->nentries; i++)
        if (!m->entries[i].buffer && !(trainable_only && m->entries[i].frozen))
            n += kiln_tensor_numel(m->entries[i].t);
    for (int i = 0; i < m->nchildren; i++)
        n += count_entries(m->children[i].m, trainable_only);
    return n;
}

int64_t kiln_module_parameter_count(kiln_module *m, bool trainable_only)
{
    return m ? count_entries(m, trainable_only) : 0;
}

void kiln_module_train(kiln_module *m, bool training)
{
    if (!m)
        return;
    m->training = training;
    for (int i = 0; i < m->nchildren; i++)
        kiln_module_train(m->children[i].m, training);
}

bool kiln_module_is_training(const kiln_module *m) { return m && m->training; }

int kiln_module_freeze(kiln_module *m, bool frozen)
{
    if (!m)
        return kiln__error_set("kiln_module_freeze: no module");
    for (int i = 0; i < m->nentries; i++) {
        kiln__entry *e = &m->entries[i];
        if (e->buffer)
            continue;
        e->frozen = frozen;
        if (set_trainable(e->t, !frozen) < 0)
            return -1;
    }
    for (int i = 0; i < m->nchildren; i++)
        if (kiln_module_freeze(m->children[i].m, frozen) < 0)
            return -1;
    return 0;
}

/* ----------------------------------------------------------------------- forward */

const char *kiln__module_label(kiln_module *m, char *buf, size_t len)
{
    const char *p = kiln_module_path(m);
    snprintf(buf, len, "%s '%s'", kiln_module_type(m), *p ? p : "(root)");
    return buf;
}

/* The innermost failing module names itself once; outer modules leave the message. */
static _Thread_local bool error_tagged;

/* The message fmt names m; code (0 for none) is kept with it for kiln_error_code(). */
static int module_verror(kiln_module *m, int code, const char *fmt, va_list ap)
{
    char label[160], msg[KILN_ERROR_MAX];
    vsnprintf(msg, sizeof msg, fmt, ap);
    kiln__error_set_code(code, "%s: %s", kiln__module_label(m, label, sizeof label), msg);
    error_tagged = true;
    return -1;
}

int kiln__module_error(kiln_module *m, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    module_verror(m, 0, fmt, ap);
    va_end(ap);
    return -1;
}

int kiln__module_restate(kiln_module *m, const char *fmt, ...)
{
    int code = kiln_error_code();
    va_list ap;
    va_start(ap, fmt);
    module_verror(m, code, fmt, ap);
    va_end(ap);
    return -1;
}

int kiln__check_input(kiln_module *m, kiln_tensor *x, int ndim_a, int ndim_b, const char *what)
{
    if (!x)
        return kiln__module_error(m, "%s is missing", what);
    int nd = kiln_tensor_ndim(x);
    if (nd == ndim_a || (ndim_b >= 0 && nd == ndim_b))
        return 0;
    char d[96];
    kiln_tensor_describe(x, d, sizeof d);
    if (ndim_b >= 0)
        return kiln__module_error(m, "%s %s: expected %d or %d dims", what, d, ndim_a, ndim_b);
    return kiln__module_error(m, "%s %s: expected %d dims", what, d, ndim_a);
}

kiln_tensor *kiln__identity(kiln_tensor *x)
{
    return x ? kiln_reshape(x, kiln_tensor_ndim(x), kiln_tensor_shape(x)) : NULL;
}

static _Thread_local int forward_depth;

const char *kiln__arity_str(const kiln__layer_type *lt, char *buf, size_t len)
{
    if (lt->min_in == lt->max_in)
        snprintf(buf, len, "%d input%s", lt->max_in, lt->max_in == 1 ? "" : "s");
    else
        snprintf(buf, len, "%d to %d inputs", lt->min_in, lt->max_in);
    return buf;
}

/* A layer given more inputs than it takes: PyTorch raises on an extra argument, and an
 * input dropped in silence hides a wiring mistake. Trailing NULLs mean "not given". */
static int check_arity(kiln_module *m, int n_in, kiln_tensor *const *in)
{
    int given = n_in;
    while (given > 0 && !in[given - 1])
        given--;
    if (!m->ltype || given <= m->ltype->max_in)
        return 0;
    char a[40];
    return kiln__module_error(m, "takes %s (got %d)", kiln__arity_str(m->ltype, a, sizeof a), given);
}

int kiln_module_forward_n(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    if (!m)
        return kiln__error_set("kiln_module_forward: no module");
    if (n_in < 0 || (n_in > 0 && !in) || max_out < 1 || !out)
        return kiln__error_set("kiln_module_forward: bad arguments");
    if (forward_depth++ == 0)
        error_tagged = false;
    for (int i = 0; i < max_out; i++)
        out[i] = NULL;
    if (check_arity(m, n_in, in) < 0) {
        forward_depth--;
        return -1;
    }
    kiln_scope_begin();
    int n = m->cls->forward(m, n_in, in, max_out, out);
    bool ok = n > 0 && n <= max_out;
    for (int i = 0; ok && i < n; i++)
        ok = out[i] != NULL;
    if (ok)
        for (int i = 0; i < n; i++)
            kiln_keep(out[i]);
    kiln_scope_end();
    forward_depth--;
    if (!ok) {
        for (int i = 0; i < max_out; i++)
            out[i] = NULL;
        if (!error_tagged) {
            char msg[KILN_ERROR_MAX];
            snprintf(msg, sizeof msg, "%s", *kiln_error() ? kiln_error() : "forward failed");
            kiln__module_restate(m, "%s", msg);
        }
        return -1;
    }
    for (int i = 0; i < n; i++)
        out[i] = kiln__ret(out[i]);
    return n;
}

kiln_tensor *kiln_module_forward(kiln_module *m, kiln_tensor *x)
{
    kiln_tensor *out[8];
    int n = kiln_module_forward_n(m, 1, &x, 8, out);
    if (n < 0)
        return NULL;
    /* Extra outputs (an RNN's final states) are dropped in the one-output form. */
    for (int i = 1; i < n; i++)
        kiln_tensor_release(out[i]);
    return out[0];
}

/* -------------------------------------------------------------- layer plumbing */

int kiln__module_set_config(kiln_module *m, const kiln__layer_type *lt, const void *config)
{
    void *c = malloc(lt->config_size);
    if (!c)
        return kiln__error_set("%s: out of memory", lt->name);
    memcpy(c, config, lt->config_size);
    free(m->config);
    m->config = c;
    m->ltype = lt;
    return 0;
}

kiln_module *kiln__module_make(const kiln_module_class *cls, size_t self_size, const kiln__layer_type *lt,
                               const void *config, kiln_generator *gen)
{
    void *self = NULL;
    if (self_size) {
        self = calloc(1, self_size);
        if (!self) {
            kiln__error_set("%s: out of memory", cls->type);
            return NULL;
        }
    }
    kiln_module *m = kiln_module_new(cls, self);
    if (!m)
        return NULL;
    if (lt && kiln__module_set_config(m, lt, config) < 0) {
        kiln_module_free(m);
        return NULL;
    }
    if (gen) {
        /* Forward-time randomness (dropout) gets its own stream derived from gen. */
        m->gen = kiln_generator_make(gen->seed * 0x9E3779B97F4A7C15ull + gen->offset + 1);
        gen->offset += 1;
    }
    return m;
}

char *kiln_module_config_json(const kiln_module *m)
{
    if (!m || !m->ltype) {
        kiln__error_set("kiln_module_config_json: %s has no layer config", m ? m->cls->type : "no module");
        return NULL;
    }
    return kiln__config_to_json(m->ltype, m->config);
}

kiln_generator *kiln__gen_or_default(kiln_generator *gen, kiln_generator *fallback)
{
    if (gen)
        return gen;
    *fallback = kiln_generator_make(0);
    return fallback;
}

int kiln__forward1(kiln_module *m, int n_in, kiln_tensor *const *in, kiln_tensor **out, kiln__forward1_fn fn)
{
    if (n_in < 1 || !in[0])
        return kiln__module_error(m, "needs an input tensor");
    out[0] = fn(m, in[0]);
    return out[0] ? 1 : -1;
}

const char *kiln__desc_str(const kiln_tensor *t, char *buf, size_t len)
{
    if (!t)
        snprintf(buf, len, "NULL");
    else
        kiln_tensor_describe(t, buf, len);
    return buf;
}

int kiln__module_replace(kiln_module *m, const char *name, kiln_tensor *t)
{
    if (!t)
        return -1;
    for (int i = 0; i < m->nentries; i++)
        if (!strcmp(m->entries[i].name, name))
            return kiln__module_replace_entry(&m->entries[i], t);
    kiln_tensor_release(t);
    return kiln__error_set("%s: no tensor named \"%s\"", m->cls->type, name);
}
