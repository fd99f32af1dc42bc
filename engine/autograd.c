/*
 * engine/autograd.c — the autodiff tape: grad mode, leaf state, recording nodes,
 * kiln_backward, gradient checkpointing, and the helpers backward functions share.
 *
 * A node is owned by the tensor it produced (through that tensor's meta) and by the
 * nodes of later ops that consumed the tensor; see autograd-impl.h. kiln_backward walks
 * the nodes reachable from the output, counts for each how many of those nodes feed
 * gradient into it, and runs each backward function once every consumer has delivered,
 * so a tensor used several times gets the sum of its gradients before its own node
 * runs. The per-pass scratch (dependency count, accumulated gradient) lives in the
 * nodes and is cleared when the pass ends, on success or error. Before the first node
 * runs, every tensor the reached nodes saved is checked against the storage version it
 * had when saved: one written in place since fails the pass with no gradient moved.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd-impl.h"

_Thread_local int kiln__no_grad_depth;

void kiln_no_grad_begin(void) { kiln__no_grad_depth++; }

void kiln_no_grad_end(void)
{
    if (kiln__no_grad_depth > 0)
        kiln__no_grad_depth--;
}

bool kiln_grad_enabled(void) { return kiln__no_grad_depth == 0; }

bool kiln__ad_want_n(int n, kiln_tensor *const *ts)
{
    if (kiln__no_grad_depth != 0 || !ts)
        return false;
    for (int i = 0; i < n; i++)
        if (ts[i] && ts[i]->requires_grad)
            return true;
    return false;
}

/* ------------------------------------------------------------------ nodes, metas */

static kiln__meta *meta_of(const kiln_tensor *t) { return (kiln__meta *)t->autograd; }

static kiln__meta *meta_get(kiln_tensor *t)
{
    if (!t->autograd) {
        t->autograd = calloc(1, sizeof(kiln__meta));
        if (!t->autograd)
            kiln__error_set("autograd: out of memory");
    }
    return t->autograd;
}

static void release_saved(kiln__node *n)
{
    for (int k = 0; k < KILN__AD_SAVED_MAX; k++) {
        kiln_tensor_release(n->saved[k]);
        n->saved[k] = NULL;
    }
    for (int k = 0; k < n->nxsaved; k++)
        kiln_tensor_release(n->xsaved[k]);
    free(n->xsaved);
    free(n->xsaved_version);
    n->xsaved = NULL;
    n->xsaved_version = NULL;
    n->nxsaved = 0;
}

/* Drop one reference; nodes whose count reaches zero go on a list and are freed one at
 * a time, so a chain of thousands of ops never recurses. */
static void node_release(kiln__node *n)
{
    kiln__node *list = NULL;
    if (n && atomic_fetch_sub(&n->refcount, 1) == 1) {
        n->free_next = NULL;
        list = n;
    }
    while (list) {
        kiln__node *c = list;
        list = c->free_next;
        for (int i = 0; i < c->nin; i++) {
            kiln__node *in = c->edges[i].node;
            if (in && atomic_fetch_sub(&in->refcount, 1) == 1) {
                in->free_next = list;
                list = in;
            }
            kiln_tensor_release(c->edges[i].leaf);
        }
        release_saved(c);
        kiln_tensor_release(c->acc);
        free(c->edges);
        free(c);
    }
}

void kiln__ad_free_meta(kiln_tensor *t)
{
    kiln__meta *m = meta_of(t);
    t->autograd = NULL;
    if (!m)
        return;
    if (m->node && m->node->retain_meta == m)
        m->node->retain_meta = NULL;
    node_release(m->node);
    kiln_tensor_release(m->grad);
    free(m);
}

kiln__node *kiln__ad_record(kiln_tensor *out, const char *name, kiln__backward_fn fn, int n,
                            kiln_tensor *const *ins, bool *failed)
{
    *failed = false;
    if (!out || !kiln_dtype_is_float(out->dtype) || out->autograd)
        return NULL;
    for (int i = 0; i < n; i++)
        if (ins[i] == out)
            return NULL;  /* the op handed its input back: nothing happened to record */
    kiln__node *node = calloc(1, sizeof *node);
    kiln__edge *edges = calloc(n > 0 ? (size_t)n : 1, sizeof *edges);
    kiln__meta *m = calloc(1, sizeof *m);
    if (!node || !edges || !m) {
        free(node);
        free(edges);
        free(m);
        kiln__error_set("%s: out of memory recording the autograd node", name);
        *failed = true;
        return NULL;
    }
    atomic_init(&node->refcount, 1);
    node->name = name;
    node->backward = fn;
    node->nin = n;
    node->edges = edges;
    node->out_dtype = out->dtype;
    node->out_ndim = out->ndim;
    memcpy(node->out_shape, out->shape, sizeof node->out_shape);
    for (int i = 0; i < n; i++) {
        kiln_tensor *t = ins[i];
        if (!t)
            continue;
        edges[i].dtype = t->dtype;
        edges[i].ndim = t->ndim;
        memcpy(edges[i].shape, t->shape, sizeof edges[i].shape);
        if (!t->requires_grad || !kiln_dtype_is_float(t->dtype))
            continue;
        kiln__meta *tm = meta_of(t);
        if (tm && tm->node) {
            atomic_fetch_add(&tm->node->refcount, 1);
            edges[i].node = tm->node;
        } else {
            edges[i].leaf = kiln_tensor_retain(t);
        }
    }
    m->node = node;
    out->autograd = m;
    out->requires_grad = true;
    return node;
}

int kiln__ad_save(kiln__node *node, int k, kiln_tensor *t)
{
    if (!node || !t || k < 0 || k >= KILN__AD_SAVED_MAX)
        return -1;
    kiln_tensor *a = kiln__view(t, t->ndim, t->shape, t->strides, t->offset);
    if (!a)
        return -1;
    kiln_tensor_release(node->saved[k]);
    node->saved[k] = a;
    node->saved_version[k] = atomic_load_explicit(&t->storage->version, memory_order_relaxed);
    return 0;
}

/* ----------------------------------------------------------------- public: leaves */

kiln_tensor *kiln_requires_grad(kiln_tensor *t, bool on)
{
    if (!t)
        return NULL;
    char ds[200];
    kiln__meta *m = meta_of(t);
    if (m && m->node) {
        kiln__error_set("requires_grad: %s is not a leaf (computed by %s); detach it first",
                        kiln__describe(t, ds, sizeof ds), m->node->name);
        return NULL;
    }
    if (!on) {
        t->requires_grad = false;
        return t;
    }
    if (!kiln_dtype_is_float(t->dtype)) {
        kiln__error_set("requires_grad: only floating tensors can require grad, got %s",
                        kiln__describe(t, ds, sizeof ds));
        return NULL;
    }
    if (!meta_get(t))
        return NULL;
    t->requires_grad = true;
    return t;
}

bool kiln_tensor_requires_grad(const kiln_tensor *t) { return t && t->requires_grad; }

bool kiln_tensor_has_grad_fn(const kiln_tensor *t)
{
    return t && t->autograd && meta_of(t)->node;
}

kiln_tensor *kiln_grad(kiln_tensor *t)
{
    if (!t || !t->autograd || !meta_of(t)->grad)
        return NULL;
    return kiln__ret(kiln_tensor_retain(meta_of(t)->grad));
}

int kiln_set_grad(kiln_tensor *t, kiln_tensor *grad)
{
    if (!t)
        return -1;
    if (!grad) {
        kiln_zero_grad(t);
        return 0;
    }
    char dt[200], dg[200];
    bool same = grad->ndim == t->ndim;
    for (int i = 0; same && i < t->ndim; i++)
        same = grad->shape[i] == t->shape[i];
    if (!same)
        return kiln__error_set("set_grad: gradient %s does not match %s", kiln__describe(grad, dg, sizeof dg),
                               kiln__describe(t, dt, sizeof dt));
    if (kiln__same_device(t, grad, "set_grad") < 0)
        return -1;
    if (!kiln_dtype_is_float(t->dtype))
        return kiln__error_set("set_grad: %s is not floating", kiln__describe(t, dt, sizeof dt));
    kiln__meta *m = meta_get(t);
    /* A private copy: the caller's tensor and the stored gradient never alias. */
    kiln_tensor *c = m ? kiln__copy_as(grad, t->dtype, "set_grad") : NULL;
    if (!c)
        return -1;
    kiln_tensor_release(m->grad);
    m->grad = c;
    return 0;
}

void kiln_zero_grad(kiln_tensor *t)
{
    if (!t || !t->autograd)
        return;
    kiln__meta *m = meta_of(t);
    kiln_tensor_release(m->grad);
    m->grad = NULL;
}

int kiln_retain_grad(kiln_tensor *t)
{
    if (!t)
        return -1;
    if (!t->requires_grad) {
        char ds[200];
        return kiln__error_set("retain_grad: %s does not require grad", kiln__describe(t, ds, sizeof ds));
    }
    kiln__meta *m = meta_of(t);
    if (m && m->node) {
        m->retain = true;
        m->node->retain_meta = m;
    }
    return 0;  /* a leaf keeps its gradient anyway */
}

kiln_tensor *kiln_detach(kiln_tensor *t)
{
    if (!t)
        return NULL;
    return kiln__ret(kiln__view(t, t->ndim, t->shape, t->strides, t->offset));
}

/* ------------------------------------------------------------------- backward pass */

static _Atomic uint64_t task_counter;

typedef struct nodevec {
    kiln__node **v;
    size_t n, cap;
} nodevec;

static int vec_push(nodevec *s, kiln__node *n)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        kiln__node **v = realloc(s->v, cap * sizeof *v);
        if (!v)
            return kiln__error_set("backward: out of memory");
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = n;
    return 0;
}

/* A gradient the engine may keep: a tensor nothing else views, else a private copy. */
static kiln_tensor *own_copy(kiln_tensor *g)
{
    if (atomic_load(&g->refcount) == 1 && atomic_load(&g->storage->refcount) == 1 &&
        kiln_tensor_is_contiguous(g))
        return kiln_tensor_retain(g);
    return kiln__copy_as(g, g->dtype, "backward");
}

/* slot += g (out of place); g is borrowed. A gradient that ends up in a .grad (keep)
 * must not alias anything else; one in flight between nodes may, since no op writes in
 * place, and sharing it saves a copy per view op on the way. */
static int accumulate(kiln_tensor **slot, kiln_tensor *g, bool keep)
{
    if (!*slot) {
        *slot = keep ? own_copy(g) : kiln_tensor_retain(g);
        return *slot ? 0 : -1;
    }
    kiln_tensor *s = kiln__binary(KILN_BINARY_ADD, *slot, g);
    if (!s)
        return -1;
    kiln_tensor_release(*slot);
    *slot = s;
    return 0;
}

static bool same_shape(int an, const int64_t *as, int bn, const int64_t *bs)
{
    if (an != bn)
        return false;
    for (int i = 0; i < an; i++)
        if (as[i] != bs[i])
            return false;
    return true;
}

/* Run one node's backward and route its input gradients. */
static int run_node(kiln__node *n, kiln_tensor *gout, bool retain_graph, nodevec *ready)
{
    if (n->retain_meta && accumulate(&n->retain_meta->grad, gout, true) < 0)
        return -1;
    if (n->freed)
        return kiln__error_set("backward: the graph behind %s was already freed by an earlier backward; "
                               "pass retain_graph to go through it twice", n->name);
    if (!n->backward)
        return kiln__error_set("backward: op '%s' has no backward", n->name);
    kiln_tensor **gin = calloc(n->nin > 0 ? (size_t)n->nin : 1, sizeof *gin);
    if (!gin)
        return kiln__error_set("backward: out of memory");
    kiln_scope_begin();
    int rc = n->backward(n, gout, gin);
    /* Take the engine's own reference before the private scope lets go of them. */
    for (int i = 0; i < n->nin; i++) {
        if (rc < 0 || !kiln__ad_needs(n, i))
            gin[i] = NULL;
        kiln_tensor_retain(gin[i]);
    }
    kiln_scope_end();
    if (rc == 0 && !retain_graph) {
        release_saved(n);
        n->freed = true;
    }
    for (int i = 0; rc == 0 && i < n->nin; i++) {
        kiln__edge *e = &n->edges[i];
        kiln_tensor *g = gin[i];
        if (!g)
            continue;
        char dg[200], ds[160];
        if (!same_shape(g->ndim, g->shape, e->ndim, e->shape)) {
            rc = kiln__error_set("backward of %s: gradient %s for input %d does not match its shape %s",
                                 n->name, kiln__describe(g, dg, sizeof dg), i,
                                 kiln__shape_str(e->ndim, e->shape, ds, sizeof ds));
            break;
        }
        if (g->dtype != e->dtype) {
            kiln_tensor *c = kiln__cast(g, e->dtype, n->name);
            kiln_tensor_release(g);
            gin[i] = g = c;
            if (!g) {
                rc = -1;
                break;
            }
        }
        if (e->node)
            rc = accumulate(&e->node->acc, g, false);
        else if (e->leaf && e->leaf->autograd)
            rc = accumulate(&meta_of(e->leaf)->grad, g, true);
    }
    for (int i = 0; i < n->nin; i++)
        kiln_tensor_release(gin[i]);
    free(gin);
    if (rc < 0)
        return -1;
    /* Last input first onto the stack, so the first input's node runs next: backward
     * functions make input 0's gradient last (matmul, linear), and on a fusing device
     * the ops of that next node (an activation's backward, a residual's sum) join the
     * product still pending there as its epilogue. */
    for (int i = n->nin - 1; i >= 0; i--) {
        kiln__node *c = n->edges[i].node;
        if (c && --c->deps == 0 && vec_push(ready, c) < 0)
            return -1;
    }
    return 0;
}

/* -1 when an in-place write reached the storage of saved alias t since the node saved it
 * (at version then): its backward would use values the forward never saw. */
static int check_saved(const kiln__node *n, const kiln_tensor *t, unsigned then)
{
    unsigned now = atomic_load_explicit(&t->storage->version, memory_order_relaxed);
    if (now == then)
        return 0;
    char ds[200];
    return kiln__error_set("backward: the tensor %s that %s saved for its backward was modified in place "
                           "after the forward (saved at version %u, now %u): an optimizer step, module load "
                           "or other in-place write reached it (or a view of its storage) between the forward "
                           "and this backward; no gradient was changed. Run the forward again after the write, "
                           "or give the op a clone of the tensor",
                           kiln__describe(t, ds, sizeof ds), n->name, then, now);
}

/* Every tensor the node saved still holds what the forward used. */
static int check_saved_versions(const kiln__node *n)
{
    for (int k = 0; k < KILN__AD_SAVED_MAX; k++)
        if (n->saved[k] && check_saved(n, n->saved[k], n->saved_version[k]) < 0)
            return -1;
    for (int k = 0; k < n->nxsaved; k++)
        if (n->xsaved[k] && check_saved(n, n->xsaved[k], n->xsaved_version[k]) < 0)
            return -1;
    return 0;
}

/* The gradient that starts the pass, as a tensor the engine owns. */
static kiln_tensor *seed_grad(kiln_tensor *out, kiln_tensor *grad_output)
{
    char d1[200], d2[200];
    if (grad_output) {
        if (!same_shape(grad_output->ndim, grad_output->shape, out->ndim, out->shape)) {
            kiln__error_set("backward: grad_output %s does not match the output %s",
                            kiln__describe(grad_output, d1, sizeof d1), kiln__describe(out, d2, sizeof d2));
            return NULL;
        }
        if (kiln__same_device(out, grad_output, "backward") < 0)
            return NULL;
        return kiln__cast(grad_output, out->dtype, "backward");
    }
    if (kiln__numel(out) != 1) {
        kiln__error_set("backward: the output %s has more than one element; pass grad_output",
                        kiln__describe(out, d1, sizeof d1));
        return NULL;
    }
    kiln_tensor *g = kiln__alloc(kiln__dev(out), out->dtype, out->ndim, out->shape, "backward");
    if (g && kiln__fill(g, 1.0, "backward") < 0) {
        kiln_tensor_release(g);
        return NULL;
    }
    return g;
}

static int backward_pass(kiln__node *root, kiln_tensor *g0, bool retain_graph)
{
    uint64_t task = atomic_fetch_add(&task_counter, 1) + 1;
    nodevec all = {0}, stack = {0}, ready = {0};
    int rc = 0;
    if (root->task != 0) {
        kiln_tensor_release(g0);
        return kiln__error_set("backward: %s is already part of a backward pass in progress "
                               "(a checkpointed function must take such tensors as inputs)", root->name);
    }
    root->task = task;
    root->deps = 0;
    root->acc = g0;
    if (vec_push(&all, root) < 0 || vec_push(&stack, root) < 0)
        rc = -1;
    /* Discover the graph and count, for each node, the edges that feed it. Each node's
     * saved tensors are checked here, while it is at hand: before any gradient moves, so
     * a stale one leaves every .grad as it was. */
    while (rc == 0 && stack.n > 0) {
        kiln__node *n = stack.v[--stack.n];
        rc = check_saved_versions(n);
        for (int i = 0; rc == 0 && i < n->nin; i++) {
            kiln__node *c = n->edges[i].node;
            if (!c)
                continue;
            if (c->task == 0) {
                c->task = task;
                c->deps = 0;
                if (vec_push(&all, c) < 0 || vec_push(&stack, c) < 0)
                    rc = -1;
            } else if (c->task != task) {
                rc = kiln__error_set("backward: %s is already part of a backward pass in progress "
                                     "(a checkpointed function must take such tensors as inputs)", c->name);
            }
            c->deps++;
        }
    }
    if (rc == 0)
        rc = vec_push(&ready, root);
    while (rc == 0 && ready.n > 0) {
        kiln__node *n = ready.v[--ready.n];
        kiln_tensor *g = n->acc;
        n->acc = NULL;
        if (g) {
            rc = run_node(n, g, retain_graph, &ready);
        } else {
            /* Nothing flowed into this node: its inputs get nothing from it either. */
            for (int i = 0; rc == 0 && i < n->nin; i++) {
                kiln__node *c = n->edges[i].node;
                if (c && --c->deps == 0)
                    rc = vec_push(&ready, c);
            }
        }
        kiln_tensor_release(g);
    }
    for (size_t i = 0; i < all.n; i++) {
        kiln__node *n = all.v[i];
        kiln_tensor_release(n->acc);
        n->acc = NULL;
        n->task = 0;
        n->deps = 0;
    }
    free(all.v);
    free(stack.v);
    free(ready.v);
    return rc;
}

int kiln_backward_retain(kiln_tensor *output, kiln_tensor *grad_output, bool retain_graph)
{
    if (!output)
        return -1;
    char ds[200];
    if (!output->requires_grad)
        return kiln__error_set("backward: the output %s does not require grad (no input of its ops "
                               "requires grad, or it was computed with grad off)",
                               kiln__describe(output, ds, sizeof ds));
    kiln_tensor *g0 = seed_grad(output, grad_output);
    if (!g0)
        return -1;
    kiln_no_grad_begin();
    kiln__meta *m = meta_of(output);
    int rc;
    if (!m->node) {
        rc = accumulate(&m->grad, g0, true);
        kiln_tensor_release(g0);
    } else {
        rc = backward_pass(m->node, g0, retain_graph);
    }
    kiln_no_grad_end();
    return rc < 0 ? -1 : 0;
}

int kiln_backward(kiln_tensor *output, kiln_tensor *grad_output)
{
    return kiln_backward_retain(output, grad_output, false);
}

/* ----------------------------------------------------------------- checkpointing */

static int checkpoint_backward(kiln__node *n, kiln_tensor *gout, kiln_tensor **gin)
{
    kiln_checkpoint_fn fn;
    memcpy(&fn, n->blob, sizeof fn);
    int k = n->nxsaved;
    kiln_tensor **d = calloc(k > 0 ? (size_t)k : 1, sizeof *d);
    if (!d)
        return kiln__error_set("checkpoint: out of memory");
    /* Recompute with recording on, from detached copies of the inputs that need grads. */
    int depth = kiln__no_grad_depth;
    kiln__no_grad_depth = 0;
    int rc = 0;
    for (int i = 0; rc == 0 && i < k; i++) {
        kiln_tensor *x = n->xsaved[i];
        if (x && kiln__ad_needs(n, i)) {
            d[i] = kiln_requires_grad(kiln_detach(x), true);
            rc = d[i] ? 0 : -1;
        } else {
            d[i] = x;
        }
    }
    kiln_tensor *y = rc == 0 ? fn(n->pv[0], k, d) : NULL;
    if (rc == 0 && !y)
        rc = -1;
    if (rc == 0 && !y->requires_grad)
        rc = kiln__error_set("checkpoint: the recomputed output does not require grad");
    if (rc == 0)
        rc = kiln_backward(y, gout);
    for (int i = 0; rc == 0 && i < k; i++)
        if (d[i] && kiln__ad_needs(n, i))
            gin[i] = kiln_grad(d[i]);
    kiln_tensor_release(y);
    kiln__no_grad_depth = depth;
    free(d);
    return rc;
}

kiln_tensor *kiln_checkpoint(kiln_checkpoint_fn fn, void *ud, int n, kiln_tensor *const *inputs)
{
    if (!fn || n < 0 || (n > 0 && !inputs)) {
        kiln__error_set("checkpoint: needs a function and %d inputs", n);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!inputs[i])
            return NULL;
    if (!kiln__ad_want_n(n, inputs))
        return fn(ud, n, inputs);
    kiln_no_grad_begin();
    kiln_tensor *y = fn(ud, n, inputs);
    kiln_no_grad_end();
    if (!y)
        return NULL;
    if (y->autograd) {
        /* fn handed back a tensor with its own history (an input, say): give the
         * checkpoint node an alias of it to own. */
        kiln_tensor *a = kiln__view(y, y->ndim, y->shape, y->strides, y->offset);
        kiln_tensor_release(y);
        if (!a)
            return NULL;
        y = kiln__ret(a);
    }
    bool failed;
    kiln__node *node = kiln__ad_record(y, "checkpoint", checkpoint_backward, n, inputs, &failed);
    if (node) {
        node->xsaved = calloc((size_t)(n > 0 ? n : 1), sizeof *node->xsaved);
        node->xsaved_version = calloc((size_t)(n > 0 ? n : 1), sizeof *node->xsaved_version);
        failed = !node->xsaved || !node->xsaved_version;
        for (int i = 0; !failed && i < n; i++) {
            kiln_tensor *x = inputs[i];
            node->xsaved[i] = kiln__view(x, x->ndim, x->shape, x->strides, x->offset);
            node->xsaved_version[i] = atomic_load_explicit(&x->storage->version, memory_order_relaxed);
            node->nxsaved = i + 1;
            failed = !node->xsaved[i];
        }
        memcpy(node->blob, &fn, sizeof fn);
        node->pv[0] = ud;
    }
    if (failed) {
        kiln_tensor_release(y);
        return NULL;
    }
    return y;
}

/* ------------------------------------------------------- helpers for backward fns */

kiln_tensor *kiln__sum_to(kiln_tensor *g, int ndim, const int64_t *shape)
{
    if (!g)
        return NULL;
    if (same_shape(g->ndim, g->shape, ndim, shape))
        return g;
    int dims[KILN_MAX_DIMS], nd = 0;
    int lead = g->ndim - ndim;
    for (int i = 0; i < g->ndim; i++)
        if (i < lead || (shape[i - lead] == 1 && g->shape[i] != 1))
            dims[nd++] = i;
    kiln_tensor *r = nd ? kiln_sum(g, nd, dims, true) : g;
    return kiln_reshape(r, ndim, shape);
}

kiln_tensor *kiln__const_like(const kiln_tensor *t, double v)
{
    return kiln_full(kiln__dev(t), t->dtype, 0, NULL, v);
}

kiln_tensor *kiln__index_add_dim(kiln_tensor *src, int d, int64_t size, kiln_tensor *idx1d)
{
    if (!src || !idx1d)
        return NULL;
    int64_t shape[KILN_MAX_DIMS];
    memcpy(shape, src->shape, sizeof shape);
    shape[d] = size;
    const kiln_backend_iface *be = kiln__be(src);
    kiln_tensor *ix = kiln__cast(idx1d, KILN_I64, "index_add");
    kiln_tensor *cix = ix ? kiln__contiguous(ix, "index_add") : NULL;
    kiln_tensor_release(ix);
    kiln_tensor *out = cix ? kiln__alloc(kiln__dev(src), src->dtype, src->ndim, shape, "index_add") : NULL;
    int rc = out ? kiln__fill(out, 0, "index_add") : -1;
    if (rc == 0 && kiln__numel(src) > 0) {
        if (!kiln__supports(kiln__dev(src), KILN_ENTRY_INDEX_ADD, -1, src->dtype, NULL)) {
            rc = kiln__unsupported(kiln__dev(src), "index_add", KILN_ENTRY_INDEX_ADD, -1, src->dtype);
        } else {
            kiln_tdesc od, xd, sd;
            kiln__desc(out, &od);
            kiln__desc(cix, &xd);
            kiln__desc(src, &sd);
            rc = be->index_add(kiln__ctx(src), &od, d, &xd, &sd);
        }
    }
    kiln_tensor_release(cix);
    if (rc < 0) {
        kiln_tensor_release(out);
        return NULL;
    }
    return kiln__ret(out);
}
