/*
 * onnx-ops-control.c — control flow: the If and Loop operators.
 *
 * An If reads a one-element bool condition and runs one of two graphs held by its
 * attributes (then_branch, else_branch). A branch has no inputs of its own: it reads values
 * of the enclosing graphs by name, and may hold initializers, Constant nodes and further Ifs.
 *
 * Why each branch is a model of its own, planned at load (kiln__onnx_branch_load): every
 * load-time pass (topological order, constant folding, common subexpressions, fused
 * epilogues, liveness, the host plan of shape arithmetic) then applies inside a branch
 * unchanged, and a branch that cannot run (an unknown operator, a name nothing defines) is
 * refused at load, naming the If node and the branch, instead of when a run first takes it.
 *
 * Why the names a branch reads become inputs of its If node (kiln__onnx_scope_branches):
 * the enclosing plan must keep those values until the If has run, and the arena and the
 * in-place path must count a branch's read as the If's. Appended to the node's inputs after
 * the condition, they are ordinary reads to every pass, and a pass that redirects an input
 * (common subexpressions merging two values) redirects what the branch gets with it: the
 * branch binds its inputs by position, from the If node's inputs, not by name.
 *
 * Reading the condition is a host read of a device value (a wait on a device that queues
 * work), so a model whose runs read one records no device graph (onnx-graph.c); a condition
 * that is a constant after folding picks its branch at load, and the If reads nothing.
 *
 * A Loop's body is planned and scoped the same way, except that it declares inputs of its own
 * (iteration number, condition, loop-carried values): the names it reads from outside come
 * after those, and are appended to the node's inputs after its loop-carried values. The loop
 * itself runs on the host (op_loop): each iteration runs the body's plan on the previous
 * iteration's outputs and reads the body's condition, so a model with a Loop is never
 * recorded as a device graph either.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error-impl.h"
#include "onnx-model-impl.h"
#include "tensor-impl.h"

struct kiln__onnx_if {
    kiln_onnx_model *branch[2]; /* then, else: inputs are the names each reads from outside;
                                 * a Loop's body is branch[0], branch[1] NULL */
    int *pos[2];                /* branch b's input i is the node's input pos[b][i] (a Loop
                                 * body's declared inputs have none: -1) */
    int fixed;                  /* the branch a constant condition picked at load, or -1 */
    bool impure;                /* a branch (at any depth) holds a random op: never folded */
    bool loop;                  /* a Loop: branch[0] is its body */
    int ncarried;               /* a Loop: its loop-carried values */
};

/* A Loop that would run longer stops with an error rather than hang: a while loop (a
 * condition and no trip count, or torch's INT64_MAX) whose condition never turns false would
 * otherwise never return, and every iteration keeps its scan outputs. */
#define LOOP_MAX_ITERS (1 << 20)

static const char *const branch_attr[2] = {"then_branch", "else_branch"};

/* ------------------------------------------------------------ name sets */

/* Open addressing over borrowed strings, each with a value (a position); names are looked up
 * once per read, so a model with thousands of values and a few Ifs costs a pass over its
 * names, never a product of them. */
typedef struct nameset {
    int cap, n;
    const char **slot;
    int *val;
} nameset;

/* name's value, or -1 when absent */
static int ns_get(const nameset *s, const char *name)
{
    for (uint64_t i = kiln__onnx_name_hash(name) & (uint64_t)(s->cap - 1);; i = (i + 1) & (uint64_t)(s->cap - 1)) {
        if (!s->slot[i])
            return -1;
        if (!strcmp(s->slot[i], name))
            return s->val[i];
    }
}

static bool ns_has(const nameset *s, const char *name)
{
    return ns_get(s, name) >= 0;
}

static int ns_init(nameset *s, int cap)
{
    *s = (nameset){cap, 0, calloc((size_t)cap, sizeof(char *)), malloc((size_t)cap * sizeof(int))};
    return s->slot && s->val ? 0 : kiln__error_set("onnx: out of memory");
}

static void ns_free(nameset *s)
{
    free(s->slot);
    free(s->val);
}

/* 1 when added with value v (>= 0), 0 when present, -1 out of memory. Kept at most half full. */
static int ns_add(nameset *s, const char *name, int v)
{
    if (ns_has(s, name))
        return 0;
    if (2 * (s->n + 1) > s->cap) {
        nameset g;
        if (ns_init(&g, s->cap * 2)) {
            ns_free(&g);
            return -1;
        }
        for (int i = 0; i < s->cap; i++)
            if (s->slot[i])
                ns_add(&g, s->slot[i], s->val[i]);
        ns_free(s);
        *s = g;
    }
    uint64_t i = kiln__onnx_name_hash(name) & (uint64_t)(s->cap - 1);
    while (s->slot[i])
        i = (i + 1) & (uint64_t)(s->cap - 1);
    s->slot[i] = name;
    s->val[i] = v;
    s->n++;
    return 1;
}

/* ------------------------------------------------------------- scoping */

/* The names each enclosing graph defines, innermost first. */
typedef struct scope {
    nameset defined;
    const struct scope *up;
} scope;

static bool visible(const scope *sc, const char *name)
{
    for (; sc; sc = sc->up)
        if (ns_has(&sc->defined, name))
            return true;
    return false;
}

static bool is_op(const kiln__onnx_pnode *nd, const char *op)
{
    bool std_domain = !nd->domain || !*nd->domain || !strcmp(nd->domain, "ai.onnx");
    return std_domain && !strcmp(nd->op_type, op);
}

static const kiln__onnx_attr *pattr(const kiln__onnx_pnode *nd, const char *name)
{
    for (int i = 0; i < nd->nattrs; i++)
        if (!strcmp(nd->attrs[i].name, name))
            return &nd->attrs[i];
    return NULL;
}

static int append_name(char ***names, int *n, const char *name)
{
    char **a = realloc(*names, (size_t)(*n + 1) * sizeof *a);
    if (a)
        *names = a;
    char *c = a ? strdup(name) : NULL;
    if (!c)
        return kiln__error_set("onnx: out of memory");
    a[(*n)++] = c;
    return 0;
}

static int scope_graph(kiln__onnx_pmodel *g, bool top, const scope *up);

/* Resolves If node nd, of the graph whose scope is sc: its branches first (so an If nested in
 * one is checked against its own scope), then each name a branch reads is appended to nd's
 * inputs, once. */
static int scope_if(const kiln__onnx_pmodel *g, kiln__onnx_pnode *nd, const scope *sc)
{
    if (nd->ninputs != 1 || !*nd->inputs[0])
        return kiln__error_set("onnx: node '%s' (If) has %d inputs; an If reads one, its condition", nd->name,
                               nd->ninputs);
    nameset have;
    int rc = ns_init(&have, 16) ? -1 : ns_add(&have, nd->inputs[0], 0) < 0 ? -1 : 0;
    for (int b = 0; rc == 0 && b < 2; b++) {
        const kiln__onnx_attr *a = pattr(nd, branch_attr[b]);
        kiln__onnx_pmodel *br = a ? a->g : NULL;
        if (!br) {
            rc = kiln__error_set("onnx: node '%s' (If) has no %s graph", nd->name, branch_attr[b]);
            break;
        }
        if (br->ninputs) {
            rc = kiln__error_set("onnx: node '%s' (If): %s declares inputs; a branch reads the enclosing "
                                 "graphs' values by name",
                                 nd->name, branch_attr[b]);
            break;
        }
        br->opset = g->opset;
        br->ir_version = g->ir_version;
        rc = scope_graph(br, false, sc);
        for (int i = 0; rc == 0 && i < br->ninputs; i++) {
            const char *name = br->inputs[i].name;
            if (!visible(sc, name)) {
                rc = kiln__error_set("onnx: node '%s' (If): %s reads '%s', which no enclosing graph defines",
                                     nd->name, branch_attr[b], name);
                break;
            }
            int added = ns_add(&have, name, nd->ninputs);
            rc = added < 0 ? -1 : added ? append_name(&nd->inputs, &nd->ninputs, name) : 0;
        }
    }
    ns_free(&have);
    return rc;
}

/* Resolves Loop node nd, of the graph whose scope is sc: its body first, then each name the
 * body reads from outside is appended to nd's inputs, once (a name the node already reads,
 * an initial value say, is found at its position). */
static int scope_loop(const kiln__onnx_pmodel *g, kiln__onnx_pnode *nd, const scope *sc)
{
    const kiln__onnx_attr *a = pattr(nd, "body");
    kiln__onnx_pmodel *body = a ? a->g : NULL;
    if (!body)
        return kiln__error_set("onnx: node '%s' (Loop) has no body graph", nd->name);
    if (nd->ninputs < 2)
        return kiln__error_set("onnx: node '%s' (Loop) has %d inputs; a Loop reads a trip count and a "
                               "condition (either may be empty), then its loop-carried values",
                               nd->name, nd->ninputs);
    /* the spec's loop of neither: for (i = 0; ; i++), which never ends */
    if (!*nd->inputs[0] && !*nd->inputs[1])
        return kiln__error_set("onnx: node '%s' (Loop) has neither a trip count nor a condition: it would "
                               "never end",
                               nd->name);
    if (body->ninputs != nd->ninputs)
        return kiln__error_set("onnx: node '%s' (Loop): body declares %d inputs; a Loop of %d loop-carried "
                               "values needs %d (iteration number, condition, the values)",
                               nd->name, body->ninputs, nd->ninputs - 2, nd->ninputs);
    body->ndeclared = body->ninputs;
    body->opset = g->opset;
    body->ir_version = g->ir_version;
    nameset have;
    int rc = ns_init(&have, 16);
    for (int j = 0; rc == 0 && j < nd->ninputs; j++)
        if (*nd->inputs[j])
            rc = ns_add(&have, nd->inputs[j], j) < 0 ? -1 : 0;
    if (rc == 0)
        rc = scope_graph(body, false, sc);
    for (int i = body->ndeclared; rc == 0 && i < body->ninputs; i++) {
        const char *name = body->inputs[i].name;
        if (!visible(sc, name)) {
            rc = kiln__error_set("onnx: node '%s' (Loop): body reads '%s', which no enclosing graph defines",
                                 nd->name, name);
            break;
        }
        int added = ns_add(&have, name, nd->ninputs);
        rc = added < 0 ? -1 : added ? append_name(&nd->inputs, &nd->ninputs, name) : 0;
    }
    ns_free(&have);
    return rc;
}

/* Names g defines: initializers and node outputs, the top graph's inputs and a Loop body's
 * declared ones (a branch's other inputs are the names it reads from outside, set below). */
static int defined_names(const kiln__onnx_pmodel *g, bool top, nameset *s)
{
    int rc = ns_init(s, 16);
    for (int i = 0; rc == 0 && i < g->ninits; i++)
        rc = ns_add(s, g->inits[i].name, 0) < 0 ? -1 : 0;
    for (int i = 0; rc == 0 && i < (top ? g->ninputs : g->ndeclared); i++)
        rc = ns_add(s, g->inputs[i].name, 0) < 0 ? -1 : 0;
    for (int k = 0; rc == 0 && k < g->nnodes; k++)
        for (int j = 0; rc == 0 && j < g->nodes[k].noutputs; j++)
            if (*g->nodes[k].outputs[j])
                rc = ns_add(s, g->nodes[k].outputs[j], 0) < 0 ? -1 : 0;
    return rc;
}

/* A branch's free name: one more input, of no declared type or shape. */
static int add_free(kiln__onnx_pmodel *g, const char *name)
{
    kiln__onnx_pvalue *v = realloc(g->inputs, (size_t)(g->ninputs + 1) * sizeof *v);
    if (v)
        g->inputs = v;
    char *c = v ? strdup(name) : NULL;
    if (!c)
        return kiln__error_set("onnx: out of memory");
    v[g->ninputs++] = (kiln__onnx_pvalue){.name = c, .ndim = -1};
    return 0;
}

static int scope_graph(kiln__onnx_pmodel *g, bool top, const scope *up)
{
    scope sc = {.up = up};
    nameset fr = {0, 0, NULL, NULL};
    int rc = defined_names(g, top, &sc.defined);
    for (int k = 0; rc == 0 && k < g->nnodes; k++)
        if (is_op(&g->nodes[k], "If"))
            rc = scope_if(g, &g->nodes[k], &sc);
        else if (is_op(&g->nodes[k], "Loop"))
            rc = scope_loop(g, &g->nodes[k], &sc);
    if (rc == 0 && !top)
        rc = ns_init(&fr, 16);
    /* what a branch reads that it does not define: node inputs (an inner If's appended ones
     * included) and outputs that name an outer value */
    for (int k = 0; rc == 0 && !top && k < g->nnodes; k++)
        for (int j = 0; rc == 0 && j < g->nodes[k].ninputs; j++) {
            const char *name = g->nodes[k].inputs[j];
            if (*name && !ns_has(&sc.defined, name)) {
                int added = ns_add(&fr, name, 0);
                rc = added < 0 ? -1 : added ? add_free(g, name) : 0;
            }
        }
    for (int i = 0; rc == 0 && !top && i < g->noutputs; i++) {
        const char *name = g->outputs[i].name;
        if (*name && !ns_has(&sc.defined, name)) {
            int added = ns_add(&fr, name, 0);
            rc = added < 0 ? -1 : added ? add_free(g, name) : 0;
        }
    }
    ns_free(&fr);
    ns_free(&sc.defined);
    return rc;
}

int kiln__onnx_scope_branches(kiln__onnx_pmodel *pm)
{
    return scope_graph(pm, true, NULL);
}

/* ---------------------------------------------------------------- load */

static bool node_impure(const kiln__onnx_mnode *n)
{
    const char *op = n->info.op_type;
    return !strncmp(op, "Random", 6) || !strcmp(op, "Dropout") || !strcmp(op, "Bernoulli") ||
           !strcmp(op, "Multinomial") || (n->info.ctl && n->info.ctl->impure);
}

/* Branch b of If node n (c its state, pn its decoded node, at its inputs by name). */
static int setup_branch(kiln_onnx_model *m, kiln__onnx_if *c, int b, const kiln__onnx_pnode *pn, const nameset *at,
                        const kiln_onnx_options *o)
{
    const kiln__onnx_attr *a = pattr(pn, branch_attr[b]);
    kiln__onnx_pmodel *br = a ? a->g : NULL; /* present: kiln__onnx_scope_branches checked */
    if (!br)
        return kiln__error_set("onnx: node '%s' (If) has no %s graph", pn->name, branch_attr[b]);
    if (br->noutputs != pn->noutputs)
        return kiln__error_set("onnx: node '%s' (If): %s has %d outputs; the node has %d", pn->name,
                               branch_attr[b], br->noutputs, pn->noutputs);
    c->branch[b] = kiln__onnx_branch_load(m->dev, br, o);
    if (!c->branch[b]) {
        const char *e = kiln_error();
        char msg[KILN_ERROR_MAX];
        snprintf(msg, sizeof msg, "%s", strncmp(e, "onnx: ", 6) ? e : e + 6);
        return kiln__error_set("onnx: node '%s' (If), %s: %s", pn->name, branch_attr[b], msg);
    }
    c->pos[b] = malloc(((size_t)br->ninputs + 1) * sizeof *c->pos[b]);
    if (!c->pos[b])
        return kiln__error_set("onnx: out of memory");
    for (int i = 0; i < br->ninputs; i++) {
        c->pos[b][i] = ns_get(at, br->inputs[i].name);
        if (c->pos[b][i] < 0) /* kiln__onnx_scope_branches appended every one */
            return kiln__error_set("onnx: node '%s' (If): %s reads '%s', which the node does not", pn->name,
                                   branch_attr[b], br->inputs[i].name);
    }
    for (int k = 0; k < c->branch[b]->nnodes; k++)
        c->impure = c->impure || node_impure(&c->branch[b]->nodes[k]);
    return 0;
}

/* The body of Loop node pn (c its state, at its inputs by name). */
static int setup_body(kiln_onnx_model *m, kiln__onnx_if *c, const kiln__onnx_pnode *pn, const nameset *at,
                      const kiln_onnx_options *o)
{
    const kiln__onnx_attr *a = pattr(pn, "body");
    kiln__onnx_pmodel *body = a ? a->g : NULL; /* present: kiln__onnx_scope_branches checked */
    if (!body || body->ndeclared < 2)
        return kiln__error_set("onnx: node '%s' (Loop) has no body graph", pn->name);
    c->ncarried = body->ndeclared - 2;
    if (pn->noutputs < c->ncarried || body->noutputs != 1 + pn->noutputs)
        return kiln__error_set("onnx: node '%s' (Loop): body has %d outputs; a Loop of %d loop-carried values "
                               "and %d outputs needs %d (condition, the values, the scan outputs)",
                               pn->name, body->noutputs, c->ncarried, pn->noutputs,
                               1 + (pn->noutputs > c->ncarried ? pn->noutputs : c->ncarried));
    c->branch[0] = kiln__onnx_branch_load(m->dev, body, o);
    if (!c->branch[0]) {
        const char *e = kiln_error();
        char msg[KILN_ERROR_MAX];
        snprintf(msg, sizeof msg, "%s", strncmp(e, "onnx: ", 6) ? e : e + 6);
        return kiln__error_set("onnx: node '%s' (Loop), body: %s", pn->name, msg);
    }
    /* an input that is also an initializer of the body would shift the positions below */
    if (c->branch[0]->ninputs != body->ninputs)
        return kiln__error_set("onnx: node '%s' (Loop): body declares an initializer as an input", pn->name);
    c->pos[0] = malloc(((size_t)body->ninputs + 1) * sizeof *c->pos[0]);
    if (!c->pos[0])
        return kiln__error_set("onnx: out of memory");
    for (int i = 0; i < body->ninputs; i++) {
        c->pos[0][i] = i < body->ndeclared ? -1 : ns_get(at, body->inputs[i].name);
        if (i >= body->ndeclared && c->pos[0][i] < 0) /* kiln__onnx_scope_branches appended it */
            return kiln__error_set("onnx: node '%s' (Loop): body reads '%s', which the node does not", pn->name,
                                   body->inputs[i].name);
    }
    for (int k = 0; k < c->branch[0]->nnodes; k++)
        c->impure = c->impure || node_impure(&c->branch[0]->nodes[k]);
    return 0;
}

int kiln__onnx_if_setup(kiln_onnx_model *m, kiln__onnx_mnode *n, const kiln__onnx_pnode *pn,
                        const kiln_onnx_options *o)
{
    kiln__onnx_if *c = calloc(1, sizeof *c);
    if (!c)
        return kiln__error_set("onnx: out of memory");
    c->fixed = -1;
    c->loop = !strcmp(pn->op_type, "Loop");
    n->info.ctl = c;    /* freed with the model, whatever happens below */
    n->nin_op = n->nin; /* the operator reads the branches' inputs at their positions */
    nameset at;         /* the node's inputs by name: where each branch input is */
    int rc = ns_init(&at, 16);
    for (int j = 0; rc == 0 && j < pn->ninputs; j++)
        if (*pn->inputs[j])
            rc = ns_add(&at, pn->inputs[j], j) < 0 ? -1 : 0;
    if (c->loop)
        rc = rc ? rc : setup_body(m, c, pn, &at, o);
    for (int b = 0; rc == 0 && !c->loop && b < 2; b++)
        rc = setup_branch(m, c, b, pn, &at, o);
    ns_free(&at);
    return rc;
}

void kiln__onnx_if_settle(kiln_onnx_model *m)
{
    for (int k = 0; k < m->nnodes; k++) {
        kiln__onnx_mnode *n = &m->nodes[k];
        kiln__onnx_if *c = n->info.ctl;
        if (!c || n->dead)
            continue;
        if (c->loop) { /* reads its trip count, condition and body's conditions at every run */
            if (!m->reads_cond && !n->derived)
                m->reads_cond = n;
            continue;
        }
        kiln_tensor *cond = n->in[0] >= 0 ? m->consts[n->in[0]] : NULL;
        if (c->fixed < 0 && cond && kiln_tensor_dtype(cond) == KILN_BOOL && kiln_tensor_numel(cond) == 1) {
            double v = kiln_item(cond);
            if (!isnan(v))
                c->fixed = v != 0 ? 0 : 1;
            kiln_error_clear(); /* a failed read leaves the check to the run */
        }
        /* a derived node runs outside any graph (its results are cached before the run) */
        if (!m->reads_cond && !n->derived)
            m->reads_cond = c->fixed < 0 ? n : c->branch[c->fixed]->reads_cond;
    }
}

bool kiln__onnx_if_pure(const kiln__onnx_node *n)
{
    return !n->ctl || !n->ctl->impure;
}

void kiln__onnx_if_drop_packs(kiln__onnx_if *c)
{
    for (int b = 0; c && b < 2; b++)
        for (int k = 0; c->branch[b] && k < c->branch[b]->nnodes; k++) {
            kiln__onnx_mnode *n = &c->branch[b]->nodes[k];
            kiln_tensor_release(n->pack.t);
            n->pack = (kiln__onnx_pack){0};
            kiln__onnx_if_drop_packs(n->info.ctl);
        }
}

void kiln__onnx_if_free(kiln__onnx_if *c)
{
    if (!c)
        return;
    for (int b = 0; b < 2; b++) {
        kiln_onnx_free(c->branch[b]);
        free(c->pos[b]);
    }
    free(c);
}

/* ------------------------------------------------------------------ run */

/* A condition's value, read on the host (on a queueing device, a wait). */
static int read_flag(const kiln__onnx_node *n, const kiln_tensor *t, const char *what, bool *v)
{
    char d[128];
    if (kiln_tensor_dtype(t) != KILN_BOOL || kiln_tensor_numel(t) != 1)
        return kiln__onnx_fail(n, "%s must be a bool tensor of one element, not %s", what,
                               kiln_tensor_describe(t, d, sizeof d));
    double x = kiln_item(t);
    if (isnan(x))
        return -1;
    *v = x != 0;
    return 0;
}

static int op_if(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out)
{
    const kiln__onnx_if *c = n->ctl;
    if (!c)
        return kiln__onnx_fail(n, "the node has no branches");
    int b = c->fixed;
    if (b < 0) {
        bool v = false; /* read_flag sets it on success; -O3 cannot tell */
        if (nin < 1 || !in[0])
            return kiln__onnx_fail(n, "the condition is absent");
        if (read_flag(n, in[0], "the condition", &v))
            return -1;
        b = v ? 0 : 1;
    }
    const kiln_onnx_model *br = c->branch[b];
    kiln_tensor **given = calloc((size_t)br->ninputs + 1, sizeof *given);
    if (!given)
        return kiln__error_set("onnx: out of memory");
    for (int i = 0; i < br->ninputs; i++)
        given[i] = c->pos[b][i] < nin ? in[c->pos[b][i]] : NULL;
    int rc = kiln__onnx_run_branch(c->branch[b], given, nout, out);
    free(given);
    if (rc) {
        char msg[KILN_ERROR_MAX];
        snprintf(msg, sizeof msg, "%s", kiln_error());
        return kiln__error_set("%s: %s", branch_attr[b], msg);
    }
    for (int i = 0; i < nout; i++)
        kiln__ret(out[i]); /* the node's scope owns them, as with any operator */
    return 0;
}

/* A Loop's trip count: at most INT64_MAX (torch writes it for a while loop), none below 0. */
static int read_trips(const kiln__onnx_node *n, const kiln_tensor *t, int64_t *trips)
{
    char d[128];
    kiln_dtype dt = kiln_tensor_dtype(t);
    if ((dt != KILN_I64 && dt != KILN_I32) || kiln_tensor_numel(t) != 1)
        return kiln__onnx_fail(n, "the trip count must be an integer tensor of one element, not %s",
                               kiln_tensor_describe(t, d, sizeof d));
    double x = kiln_item(t);
    if (isnan(x))
        return -1;
    *trips = x <= 0 ? 0 : x >= 9.2e18 ? INT64_MAX : (int64_t)x;
    return 0;
}

/* Where a Loop's state lives while it runs: the loop-carried values (references of its own)
 * and every iteration's scan outputs, in order (nscan per iteration). */
typedef struct loop_state {
    int ncarried, nscan;
    kiln_tensor **cur, **seq;
    int64_t nseq, cap;
} loop_state;

static void loop_state_free(loop_state *st)
{
    for (int i = 0; st->cur && i < st->ncarried; i++)
        kiln_tensor_release(st->cur[i]);
    for (int64_t i = 0; i < st->nseq; i++)
        kiln_tensor_release(st->seq[i]);
    free(st->cur);
    free(st->seq);
}

/* Takes one iteration's body outputs bout (cond, carried, scans; new references) into st;
 * checks each scan output's shape against the first iteration's. */
static int loop_take(const kiln__onnx_node *n, loop_state *st, kiln_tensor **bout, int64_t it)
{
    int rc = 0;
    for (int k = 0; k < st->nscan; k++) {
        const kiln_tensor *t = bout[1 + st->ncarried + k], *t0 = it > 0 ? st->seq[k] : t;
        bool same = kiln_tensor_ndim(t) == kiln_tensor_ndim(t0) && kiln_tensor_dtype(t) == kiln_tensor_dtype(t0);
        for (int d = 0; same && d < kiln_tensor_ndim(t); d++)
            same = kiln_tensor_dim(t, d) == kiln_tensor_dim(t0, d);
        if (!same && rc == 0) {
            char d0[128], d1[128];
            rc = kiln__onnx_fail(n,
                                 "scan output %d is %s at iteration %lld and %s at iteration 0; each "
                                 "iteration's must have one shape",
                                 k, kiln_tensor_describe(t, d1, sizeof d1), (long long)it,
                                 kiln_tensor_describe(t0, d0, sizeof d0));
        }
    }
    if (rc == 0 && st->nseq + st->nscan > st->cap) {
        int64_t cap = st->cap ? 2 * st->cap : 16 * (st->nscan + 1);
        kiln_tensor **g = realloc(st->seq, (size_t)cap * sizeof *g);
        if (!g)
            rc = kiln__error_set("onnx: out of memory");
        else
            st->seq = g, st->cap = cap;
    }
    for (int i = 0; i < st->ncarried; i++) {
        kiln_tensor_release(st->cur[i]);
        st->cur[i] = bout[1 + i];
    }
    for (int k = 0; k < st->nscan; k++) {
        if (rc == 0)
            st->seq[st->nseq++] = bout[1 + st->ncarried + k];
        else
            kiln_tensor_release(bout[1 + st->ncarried + k]);
    }
    kiln_tensor_release(bout[0]);
    return rc;
}

/* Scan output k over niter iterations: stacked along a new axis 0. With no iteration no
 * tensor says what the rest of the shape is: as ONNX Runtime does, it is the body's declared
 * output shape (an unknown dim 0) after the 0, [0] when none is declared, of its declared
 * type (f32 when none). */
static kiln_tensor *loop_scan(const kiln__onnx_node *n, const kiln__onnx_if *c, loop_state *st, int k,
                              int64_t niter)
{
    if (niter == 0) {
        const kiln__onnx_pvalue *pv = &c->branch[0]->pm->outputs[1 + st->ncarried + k];
        int dt = kiln__onnx_kdtype(pv->elem_type), nd = pv->ndim < KILN_MAX_DIMS ? pv->ndim : -1;
        int64_t shape[KILN_MAX_DIMS + 1] = {0};
        for (int d = 0; d < nd; d++)
            shape[1 + d] = pv->dims[d] < 0 ? 0 : pv->dims[d];
        return kiln_empty(n->dev, dt < 0 ? KILN_F32 : (kiln_dtype)dt, nd < 0 ? 1 : 1 + nd, shape);
    }
    kiln_tensor **ts = malloc((size_t)niter * sizeof *ts);
    if (!ts) {
        kiln__error_set("onnx: out of memory");
        return NULL;
    }
    for (int64_t i = 0; i < niter; i++)
        ts[i] = st->seq[i * st->nscan + k];
    kiln_tensor *r = niter > INT32_MAX ? NULL : kiln_stack(ts, (int)niter, 0);
    free(ts);
    return r;
}

/* Runs the body once per iteration on the host: the iteration number and condition are made
 * here, the loop-carried values are the previous iteration's outputs, and the body's
 * condition is read after each (ignored without a condition input, as the spec says). */
static int op_loop(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out)
{
    const kiln__onnx_if *c = n->ctl;
    if (!c || !c->branch[0])
        return kiln__onnx_fail(n, "the node has no body");
    kiln_onnx_model *body = c->branch[0];
    loop_state st = {.ncarried = c->ncarried, .nscan = nout - c->ncarried};
    int64_t trips = INT64_MAX;
    bool has_cond = nin > 1 && in[1], cond = true;
    if (nin > 0 && in[0] && read_trips(n, in[0], &trips))
        return -1;
    if (has_cond && read_flag(n, in[1], "the condition", &cond))
        return -1;
    if (!has_cond && trips > LOOP_MAX_ITERS)
        return kiln__onnx_fail(n, "the trip count %lld is more than the %d iterations a Loop may run",
                               (long long)trips, LOOP_MAX_ITERS);
    /* (a name the body reads may be an initial value: the node's inputs can be fewer) */
    if (nin < 2 + st.ncarried || st.nscan < 0)
        return kiln__onnx_fail(n, "has %d inputs and %d outputs; its body needs more", nin, nout);
    for (int i = 0; i < st.ncarried; i++)
        if (!in[2 + i])
            return kiln__onnx_fail(n, "loop-carried value %d is absent", i);
    kiln_tensor **given = calloc((size_t)body->ninputs + 1, sizeof *given);
    kiln_tensor **bout = calloc((size_t)nout + 2, sizeof *bout);
    st.cur = calloc((size_t)st.ncarried + 1, sizeof *st.cur);
    int rc = given && bout && st.cur ? 0 : kiln__error_set("onnx: out of memory");
    for (int i = 0; rc == 0 && i < st.ncarried; i++)
        st.cur[i] = kiln_tensor_retain(in[2 + i]);
    for (int i = 2 + st.ncarried; rc == 0 && i < body->ninputs; i++)
        given[i] = c->pos[0][i] < nin ? in[c->pos[0][i]] : NULL;
    int64_t it = 0;
    for (; rc == 0 && it < trips && cond; it++) {
        if (it == LOOP_MAX_ITERS) {
            rc = kiln__onnx_fail(n, "still running after %d iterations, the most a Loop may run", LOOP_MAX_ITERS);
            break;
        }
        kiln_scope_begin(); /* this iteration's number and condition */
        given[0] = kiln_full(n->dev, KILN_I64, 0, NULL, (double)it);
        given[1] = kiln_full(n->dev, KILN_BOOL, 0, NULL, cond ? 1 : 0);
        for (int i = 0; i < st.ncarried; i++)
            given[2 + i] = st.cur[i];
        rc = given[0] && given[1] ? kiln__onnx_run_branch(body, given, 1 + nout, bout) : -1;
        kiln_scope_end();
        if (rc) {
            char msg[KILN_ERROR_MAX];
            snprintf(msg, sizeof msg, "%s", kiln_error());
            rc = kiln__error_set("body, iteration %lld: %s", (long long)it, msg);
            break;
        }
        if (has_cond)
            rc = read_flag(n, bout[0], "the body's condition", &cond);
        rc = loop_take(n, &st, bout, it) || rc ? -1 : 0;
    }
    for (int i = 0; rc == 0 && i < st.ncarried; i++) {
        out[i] = kiln__ret(st.cur[i]); /* the node's scope owns them, as with any operator */
        st.cur[i] = NULL;
    }
    for (int k = 0; rc == 0 && k < st.nscan; k++)
        rc = (out[st.ncarried + k] = loop_scan(n, c, &st, k, it)) ? 0 : -1;
    loop_state_free(&st);
    free(given);
    free(bout);
    return rc;
}

const kiln__onnx_op kiln__onnx_ops_control[] = {
    {"If", op_if},
    {"Loop", op_loop},
    {NULL, NULL},
};
