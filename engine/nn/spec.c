/*
 * engine/nn/spec.c — models built from a JSON graph spec (see kiln/nn.h for the
 * format). Parsing resolves every input name, orders the nodes topologically (a cycle
 * is reported with a node on it), builds each layer as a child named after its node,
 * and, when the spec gives example input shapes, runs one dry forward so that shapes
 * that cannot connect are refused at build time with the failing node named.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json-keys-impl.h"
#include "nn-impl.h"
#include "storage-impl.h"

/* A JSON spec is a few kilobytes; this bounds what a wrong path can make us read. */
#define MODEL_SPEC_MAX_BYTES ((size_t)64 << 20)

typedef enum op_kind {
    OP_LAYER = -1,
    OP_ADD = 0, OP_SUB, OP_MUL, OP_CAT, OP_FLATTEN, OP_RESHAPE, OP_MEAN, OP_RELU, OP_GELU, OP_SILU,
    OP_SIGMOID, OP_TANH, OP_SOFTMAX, OP_TRANSPOSE, OP_SELECT, OP_COUNT
} op_kind;

/* Name and the parameter keys each functional op accepts. */
static const struct {
    const char *name;
    const char *keys; /* space separated */
    int min_in, max_in;
} ops[OP_COUNT] = {
    [OP_ADD] = {"add", "", 2, 64},          [OP_SUB] = {"sub", "", 2, 2},
    [OP_MUL] = {"mul", "", 2, 64},          [OP_CAT] = {"cat", "dim", 1, 64},
    [OP_FLATTEN] = {"flatten", "start_dim end_dim", 1, 1},
    [OP_RESHAPE] = {"reshape", "shape", 1, 1},
    [OP_MEAN] = {"mean", "dims keepdim", 1, 1},
    [OP_RELU] = {"relu", "", 1, 1},         [OP_GELU] = {"gelu", "", 1, 1},
    [OP_SILU] = {"silu", "", 1, 1},         [OP_SIGMOID] = {"sigmoid", "", 1, 1},
    [OP_TANH] = {"tanh", "", 1, 1},         [OP_SOFTMAX] = {"softmax", "dim", 1, 1},
    [OP_TRANSPOSE] = {"transpose", "dim0 dim1", 1, 1},
    [OP_SELECT] = {"select", "dim index", 1, 1},
};

typedef struct gnode {
    char *name;
    op_kind op;
    kiln_module *layer;   /* borrowed: a child of the model */
    int nin, nout;
    int *in;              /* value ids */
    int first_value;      /* id of output 0 */
    int64_t dim, dim1, start, end, index;
    int64_t shape[KILN_MAX_DIMS];
    int nshape;
    int dims[KILN_MAX_DIMS];
    int ndims;
    bool keepdim;
} gnode;

typedef struct graph {
    int ninputs;
    char **input_names;
    int nnodes;
    gnode *nodes;
    int *order;           /* topological order of node indices */
    int nvalues;
    int noutputs;
    int *outputs;         /* value ids */
    char *spec;           /* the spec it was built from, for kiln_model_spec_json */
} graph;

static void graph_free(void *p)
{
    graph *g = p;
    if (!g)
        return;
    for (int i = 0; i < g->ninputs; i++)
        free(g->input_names[i]);
    free(g->input_names);
    for (int i = 0; i < g->nnodes; i++) {
        free(g->nodes[i].name);
        free(g->nodes[i].in);
    }
    free(g->nodes);
    free(g->order);
    free(g->outputs);
    free(g->spec);
    free(g);
}

static kiln_tensor *run_op(const gnode *n, kiln_tensor **x)
{
    kiln_tensor *y = NULL;
    switch (n->op) {
    case OP_ADD:
    case OP_MUL:
        y = x[0];
        for (int i = 1; i < n->nin; i++)
            y = n->op == OP_ADD ? kiln_add(y, x[i]) : kiln_mul(y, x[i]);
        return n->nin == 1 ? kiln__identity(y) : y;
    case OP_SUB: return kiln_sub(x[0], x[1]);
    case OP_CAT: return kiln_cat(x, n->nin, (int)n->dim);
    case OP_FLATTEN: return kiln_flatten(x[0], (int)n->start, (int)n->end);
    case OP_RESHAPE: return kiln_reshape(x[0], n->nshape, n->shape);
    case OP_MEAN: return kiln_mean(x[0], n->ndims, n->ndims ? n->dims : NULL, n->keepdim);
    case OP_RELU: return kiln_relu(x[0]);
    case OP_GELU: return kiln_gelu(x[0], false);
    case OP_SILU: return kiln_silu(x[0]);
    case OP_SIGMOID: return kiln_sigmoid(x[0]);
    case OP_TANH: return kiln_tanh(x[0]);
    case OP_SOFTMAX: return kiln_softmax(x[0], (int)n->dim);
    case OP_TRANSPOSE: return kiln_transpose(x[0], (int)n->dim, (int)n->dim1);
    case OP_SELECT: {
        int64_t size = kiln_tensor_dim(x[0], (int)n->dim);
        int64_t i = n->index < 0 ? n->index + size : n->index;
        if (size < 0 || i < 0 || i >= size) {
            kiln__error_set("select: index %lld out of range for size %lld", (long long)n->index, (long long)size);
            return NULL;
        }
        return kiln_squeeze(kiln_narrow(x[0], (int)n->dim, i, 1), (int)n->dim);
    }
    default:
        break;
    }
    return y;
}

/* Release value id (a node's output, held by the forward's scope) if step is its last
 * reader's. */
static void release_value(kiln_tensor **v, const int *last, int ninputs, int id, int step)
{
    if (id < ninputs || !v[id] || last[id] != step)
        return;
    kiln_tensor_release(kiln_keep(v[id]));
    v[id] = NULL;
}

static int model_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    const graph *g = m->self;
    if (n_in < g->ninputs)
        return kiln__module_error(m, "needs %d inputs (got %d)", g->ninputs, n_in);
    /* Extra inputs would be ignored in silence (a caller's mistake); trailing NULLs mean
     * "not given", as for any module. */
    int given = n_in;
    while (given > g->ninputs && !in[given - 1])
        given--;
    if (given > g->ninputs)
        return kiln__module_error(m, "takes %d input%s (got %d)", g->ninputs, g->ninputs == 1 ? "" : "s", given);
    kiln_tensor **v = calloc((size_t)g->nvalues + 1, sizeof *v);
    /* the step of g->order after which each value is read no more (-1: never read; the
     * outputs: never released). A value goes as soon as its last reader has run, unless
     * a backward saved it: held to the end, a layer's output stayed alive through every
     * later layer (the network's whole activations at once, and a fused group stored a
     * convolution's output before its relu though nothing read it again). */
    int *last = malloc(((size_t)g->nvalues + 1) * sizeof *last);
    if (!v || !last) {
        free(v);
        free(last);
        return kiln__module_error(m, "out of memory");
    }
    for (int i = 0; i <= g->nvalues; i++)
        last[i] = -1;
    for (int k = 0; k < g->nnodes; k++)
        for (int i = 0; i < g->nodes[g->order[k]].nin; i++)
            last[g->nodes[g->order[k]].in[i]] = k;
    for (int i = 0; i < g->noutputs; i++)
        last[g->outputs[i]] = g->nnodes;
    int rc = -1;
    for (int i = 0; i < g->ninputs; i++) {
        if (!in[i]) {
            kiln__module_error(m, "input \"%s\" is missing", g->input_names[i]);
            goto done;
        }
        v[i] = in[i];
    }
    for (int k = 0; k < g->nnodes; k++) {
        const gnode *n = &g->nodes[g->order[k]];
        kiln_tensor *args[64];
        for (int i = 0; i < n->nin; i++)
            args[i] = v[n->in[i]];
        if (n->op == OP_LAYER) {
            int got = kiln_module_forward_n(n->layer, n->nin, args, n->nout, v + n->first_value);
            if (got < 0)
                goto done;
            if (got < n->nout) {
                kiln__module_error(m, "node '%s' declares %d outputs, its layer gave %d", n->name, n->nout, got);
                goto done;
            }
        } else {
            kiln_tensor *y = run_op(n, args);
            if (!y) {
                char msg[KILN_ERROR_MAX];
                snprintf(msg, sizeof msg, "%s", kiln_error());
                kiln__module_restate(m, "node '%s' (%s): %s", n->name, ops[n->op].name, msg);
                goto done;
            }
            v[n->first_value] = y;
        }
        /* the inputs (the caller's) stay; a layer's extra outputs nobody reads go at once */
        for (int i = 0; i < n->nin; i++)
            release_value(v, last, g->ninputs, n->in[i], k);
        for (int o = 0; o < n->nout; o++)
            release_value(v, last, g->ninputs, n->first_value + o, -1);
    }
    rc = g->noutputs < max_out ? g->noutputs : max_out;
    for (int i = 0; i < rc; i++)
        out[i] = kiln__identity(v[g->outputs[i]]);
done:
    free(v);
    free(last);
    return rc;
}

static const kiln_module_class model_class = {"Model", model_forward, graph_free};

/* ----------------------------------------------------------------------- parsing */

static int spec_error(const char *node, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int spec_error(const char *node, const char *fmt, ...)
{
    char msg[KILN_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (node)
        return kiln__error_set("model spec: node '%s': %s", node, msg);
    return kiln__error_set("model spec: %s", msg);
}

static bool key_in(const char *key, const char *list)
{
    size_t n = strlen(key);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ' ');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && !strncmp(p, key, n))
            return true;
        p += l;
        while (*p == ' ')
            p++;
    }
    return false;
}

static int get_i64(const char *node, const cJSON *o, const char *key, int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(int64_t)v->valuedouble)
        return spec_error(node, "\"%s\" must be an integer", key);
    *out = (int64_t)v->valuedouble;
    return 0;
}

static int get_int_list(const char *node, const cJSON *o, const char *key, int64_t *out, int *n)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v)
        return 0;
    if (cJSON_IsNumber(v)) {
        *n = 1;
        return get_i64(node, o, key, out);
    }
    int len = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (len < 0 || len > KILN_MAX_DIMS)
        return spec_error(node, "\"%s\" must be a list of at most %d integers", key, KILN_MAX_DIMS);
    for (int i = 0; i < len; i++) {
        const cJSON *it = cJSON_GetArrayItem(v, i);
        if (!cJSON_IsNumber(it) || it->valuedouble != (double)(int64_t)it->valuedouble)
            return spec_error(node, "\"%s\" must hold integers", key);
        out[i] = (int64_t)it->valuedouble;
    }
    *n = len;
    return 0;
}

static int name_index(char *const *names, int n, const char *s)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], s))
            return i;
    return -1;
}

/* "node" or "node:k" -> value id, or -1 with an error naming the consumer. */
static int resolve(const graph *g, const char *consumer, const char *ref)
{
    int i = name_index(g->input_names, g->ninputs, ref);
    if (i >= 0)
        return i;
    char base[256];
    snprintf(base, sizeof base, "%s", ref);
    long k = 0;
    char *colon = strrchr(base, ':');
    if (colon) {
        char *end;
        k = strtol(colon + 1, &end, 10);
        if (*end || end == colon + 1)
            colon = NULL, k = 0;
        else
            *colon = 0;
    }
    for (int n = 0; n < g->nnodes; n++)
        if (!strcmp(g->nodes[n].name, base)) {
            if (k < 0 || k >= g->nodes[n].nout)
                return spec_error(consumer, "input \"%s\": node '%s' has %d output(s)", ref, base, g->nodes[n].nout);
            return g->nodes[n].first_value + (int)k;
        }
    return spec_error(consumer, "input \"%s\" is neither a model input nor a node", ref);
}

static int value_owner(const graph *g, int value)
{
    for (int n = 0; n < g->nnodes; n++)
        if (value >= g->nodes[n].first_value && value < g->nodes[n].first_value + g->nodes[n].nout)
            return n;
    return -1;
}

/* Depth-first topological order; state 1 = on the stack (a cycle when met again). */
static int visit(graph *g, int n, char *state, int *pos)
{
    if (state[n] == 2)
        return 0;
    if (state[n] == 1)
        return spec_error(g->nodes[n].name, "is part of a cycle");
    state[n] = 1;
    for (int i = 0; i < g->nodes[n].nin; i++) {
        int owner = value_owner(g, g->nodes[n].in[i]);
        if (owner >= 0 && visit(g, owner, state, pos) < 0)
            return -1;
    }
    state[n] = 2;
    g->order[(*pos)++] = n;
    return 0;
}

static int parse_node(graph *g, kiln_module *model, const cJSON *jn, gnode *n, kiln_device *dev, kiln_generator *gen)
{
    const cJSON *jname = cJSON_GetObjectItemCaseSensitive(jn, "name");
    if (!cJSON_IsString(jname) || !*jname->valuestring || strchr(jname->valuestring, '.') ||
        strchr(jname->valuestring, ':'))
        return spec_error(NULL, "node %d needs a \"name\" without '.' or ':'", (int)(n - g->nodes));
    n->name = strdup(jname->valuestring);
    if (!n->name)
        return spec_error(NULL, "out of memory");
    const char *nm = n->name;
    const cJSON *jlayer = cJSON_GetObjectItemCaseSensitive(jn, "layer");
    const cJSON *jop = cJSON_GetObjectItemCaseSensitive(jn, "op");
    if (!!jlayer == !!jop)
        return spec_error(nm, "needs exactly one of \"layer\" and \"op\"");
    n->nout = 1;
    n->end = -1;
    n->start = 1;
    n->dim = -1;
    if (jlayer) {
        n->op = OP_LAYER;
        for (const cJSON *it = jn->child; it; it = it->next)
            if (!key_in(it->string, "name layer config inputs outputs"))
                return spec_error(nm, "unknown key \"%s\"", it->string);
        if (!cJSON_IsString(jlayer))
            return spec_error(nm, "\"layer\" must be a string");
        const kiln__layer_type *lt = kiln__layer_find(jlayer->valuestring);
        if (!lt)
            return spec_error(nm, "unknown layer \"%s\"", jlayer->valuestring);
        int64_t nout = 1;
        if (get_i64(nm, jn, "outputs", &nout) < 0)
            return -1;
        if (nout < 1 || nout > 8)
            return spec_error(nm, "\"outputs\" must be in [1, 8]");
        n->nout = (int)nout;
        _Alignas(max_align_t) unsigned char cfg[512];
        if (lt->config_size > sizeof cfg)
            return spec_error(nm, "config too large");
        if (kiln__config_from_cjson(lt, cJSON_GetObjectItemCaseSensitive(jn, "config"), cfg) < 0) {
            char msg[KILN_ERROR_MAX];
            snprintf(msg, sizeof msg, "%s", kiln_error());
            return spec_error(nm, "%s", msg);
        }
        kiln_module *layer = lt->init(cfg, dev, gen);
        if (!layer) {
            char msg[KILN_ERROR_MAX];
            snprintf(msg, sizeof msg, "%s", kiln_error());
            return spec_error(nm, "%s", msg);
        }
        if (kiln_module_add_child(model, nm, layer) < 0)
            return spec_error(nm, "duplicate node name");
        n->layer = layer;
    } else {
        if (!cJSON_IsString(jop))
            return spec_error(nm, "\"op\" must be a string");
        n->op = OP_COUNT;
        for (int k = 0; k < OP_COUNT; k++)
            if (!strcmp(ops[k].name, jop->valuestring))
                n->op = (op_kind)k;
        if (n->op == OP_COUNT)
            return spec_error(nm, "unknown op \"%s\"", jop->valuestring);
        for (const cJSON *it = jn->child; it; it = it->next)
            if (!key_in(it->string, "name op inputs") && !key_in(it->string, ops[n->op].keys))
                return spec_error(nm, "unknown key \"%s\" for op %s", it->string, ops[n->op].name);
        int64_t dims[KILN_MAX_DIMS];
        int nd = 0;
        const cJSON *kd = cJSON_GetObjectItemCaseSensitive(jn, "keepdim");
        if (kd && !cJSON_IsBool(kd))
            return spec_error(nm, "\"keepdim\" must be true or false");
        n->keepdim = cJSON_IsTrue(kd);
        if (get_i64(nm, jn, "dim", &n->dim) < 0 || get_i64(nm, jn, "dim0", &n->dim) < 0 ||
            get_i64(nm, jn, "dim1", &n->dim1) < 0 || get_i64(nm, jn, "start_dim", &n->start) < 0 ||
            get_i64(nm, jn, "end_dim", &n->end) < 0 || get_i64(nm, jn, "index", &n->index) < 0 ||
            get_int_list(nm, jn, "shape", n->shape, &n->nshape) < 0 || get_int_list(nm, jn, "dims", dims, &nd) < 0)
            return -1;
        if (n->op == OP_RESHAPE && n->nshape == 0)
            return spec_error(nm, "reshape needs \"shape\"");
        n->ndims = nd;
        for (int i = 0; i < nd; i++)
            n->dims[i] = (int)dims[i];
    }
    return 0;
}

static int build(kiln_module *model, graph *g, const cJSON *root, kiln_device *dev, kiln_generator *gen)
{
    if (!cJSON_IsObject(root))
        return spec_error(NULL, "must be a JSON object");
    for (const cJSON *it = root->child; it; it = it->next)
        if (!key_in(it->string, "inputs nodes outputs example_inputs"))
            return spec_error(NULL, "unknown key \"%s\"", it->string);
    const cJSON *ji = cJSON_GetObjectItemCaseSensitive(root, "inputs");
    const cJSON *jn = cJSON_GetObjectItemCaseSensitive(root, "nodes");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(root, "outputs");
    if (!cJSON_IsArray(ji) || !cJSON_IsArray(jn) || !cJSON_IsArray(jo) || cJSON_GetArraySize(ji) < 1 ||
        cJSON_GetArraySize(jo) < 1)
        return spec_error(NULL, "needs non-empty \"inputs\", \"nodes\" and \"outputs\" lists");
    g->ninputs = cJSON_GetArraySize(ji);
    g->nnodes = cJSON_GetArraySize(jn);
    g->noutputs = cJSON_GetArraySize(jo);
    g->input_names = calloc((size_t)g->ninputs, sizeof *g->input_names);
    g->nodes = calloc((size_t)g->nnodes + 1, sizeof *g->nodes);
    g->order = calloc((size_t)g->nnodes + 1, sizeof *g->order);
    g->outputs = calloc((size_t)g->noutputs, sizeof *g->outputs);
    if (!g->input_names || !g->nodes || !g->order || !g->outputs)
        return spec_error(NULL, "out of memory");
    for (int i = 0; i < g->ninputs; i++) {
        const cJSON *s = cJSON_GetArrayItem(ji, i);
        if (!cJSON_IsString(s) || !*s->valuestring)
            return spec_error(NULL, "\"inputs\" must hold names");
        if (name_index(g->input_names, i, s->valuestring) >= 0)
            return spec_error(NULL, "input \"%s\" is listed twice", s->valuestring);
        g->input_names[i] = strdup(s->valuestring);
        if (!g->input_names[i])
            return spec_error(NULL, "out of memory");
    }
    /* First pass: nodes, layers and output counts; names are checked for clashes. */
    int next_value = g->ninputs;
    for (int k = 0; k < g->nnodes; k++) {
        const cJSON *node = cJSON_GetArrayItem(jn, k);
        if (!cJSON_IsObject(node))
            return spec_error(NULL, "node %d must be an object", k);
        if (parse_node(g, model, node, &g->nodes[k], dev, gen) < 0)
            return -1;
        for (int j = 0; j < k; j++)
            if (!strcmp(g->nodes[j].name, g->nodes[k].name))
                return spec_error(g->nodes[k].name, "the name is used twice");
        if (name_index(g->input_names, g->ninputs, g->nodes[k].name) >= 0)
            return spec_error(g->nodes[k].name, "the name is also a model input");
        g->nodes[k].first_value = next_value;
        next_value += g->nodes[k].nout;
    }
    g->nvalues = next_value;
    /* Second pass: inputs by name (nodes may be listed in any order). */
    for (int k = 0; k < g->nnodes; k++) {
        gnode *n = &g->nodes[k];
        const cJSON *ins = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(jn, k), "inputs");
        if (!cJSON_IsArray(ins) || cJSON_GetArraySize(ins) < 1)
            return spec_error(n->name, "needs a non-empty \"inputs\" list");
        n->nin = cJSON_GetArraySize(ins);
        if (n->op == OP_LAYER) {
            /* The layer's own arity: an extra input would never reach it. */
            const kiln__layer_type *lt = n->layer->ltype;
            char a[40];
            if (n->nin < lt->min_in || n->nin > lt->max_in)
                return spec_error(n->name, "layer %s takes %s (got %d)", lt->name,
                                  kiln__arity_str(lt, a, sizeof a), n->nin);
        } else if (n->nin < ops[n->op].min_in || n->nin > ops[n->op].max_in) {
            int lo = ops[n->op].min_in, hi = ops[n->op].max_in;
            if (lo == hi)
                return spec_error(n->name, "op %s takes %d input%s (got %d)", ops[n->op].name, lo,
                                  lo == 1 ? "" : "s", n->nin);
            return spec_error(n->name, "op %s takes %d to %d inputs (got %d)", ops[n->op].name, lo, hi, n->nin);
        }
        n->in = calloc((size_t)n->nin, sizeof *n->in);
        if (!n->in)
            return spec_error(NULL, "out of memory");
        for (int i = 0; i < n->nin; i++) {
            const cJSON *s = cJSON_GetArrayItem(ins, i);
            if (!cJSON_IsString(s))
                return spec_error(n->name, "\"inputs\" must hold names");
            if ((n->in[i] = resolve(g, n->name, s->valuestring)) < 0)
                return -1;
        }
    }
    for (int i = 0; i < g->noutputs; i++) {
        const cJSON *s = cJSON_GetArrayItem(jo, i);
        if (!cJSON_IsString(s))
            return spec_error(NULL, "\"outputs\" must hold names");
        if ((g->outputs[i] = resolve(g, "(outputs)", s->valuestring)) < 0)
            return -1;
    }
    char *state = calloc((size_t)g->nnodes + 1, 1);
    if (!state)
        return spec_error(NULL, "out of memory");
    int pos = 0, rc = 0;
    for (int k = 0; rc == 0 && k < g->nnodes; k++)
        rc = visit(g, k, state, &pos);
    free(state);
    return rc;
}

/* A dry forward with zeros of the example shapes (eval mode, no gradients recorded). */
static int dry_run(kiln_module *model, const graph *g, const cJSON *ex, kiln_device *dev)
{
    if (!cJSON_IsObject(ex))
        return spec_error(NULL, "\"example_inputs\" must be an object");
    for (const cJSON *it = ex->child; it; it = it->next)
        if (name_index(g->input_names, g->ninputs, it->string) < 0)
            return spec_error(NULL, "example_inputs: \"%s\" is not a model input", it->string);
    kiln_tensor *in[64] = {0};
    if (g->ninputs > 64)
        return spec_error(NULL, "at most 64 inputs");
    int rc = 0;
    kiln_scope_begin();
    for (int i = 0; rc == 0 && i < g->ninputs; i++) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(ex, g->input_names[i]);
        if (!cJSON_IsObject(e)) {
            rc = spec_error(NULL, "example_inputs: \"%s\" needs {\"shape\": [...]}", g->input_names[i]);
            break;
        }
        for (const cJSON *k = e->child; rc == 0 && k; k = k->next)
            if (!key_in(k->string, "shape dtype"))
                rc = spec_error(NULL, "example_inputs: \"%s\": unknown key \"%s\"", g->input_names[i], k->string);
        int64_t shape[KILN_MAX_DIMS];
        int nd = 0;
        if (rc == 0 && (get_int_list(g->input_names[i], e, "shape", shape, &nd) < 0 || nd < 1))
            rc = spec_error(NULL, "example_inputs: \"%s\" needs a shape", g->input_names[i]);
        const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        int dt = KILN_F32;
        if (rc == 0 && jd && (!cJSON_IsString(jd) || (dt = kiln_dtype_from_name(jd->valuestring)) < 0))
            rc = spec_error(NULL, "example_inputs: \"%s\": unknown dtype", g->input_names[i]);
        if (rc == 0 && !(in[i] = kiln_zeros(dev, (kiln_dtype)dt, nd, shape)))
            rc = -1;
    }
    if (rc == 0) {
        bool training = model->training;
        kiln_module_train(model, false);
        kiln_no_grad_begin();
        kiln_tensor *out[64];
        if (kiln_module_forward_n(model, g->ninputs, in, 64, out) < 0) {
            char msg[KILN_ERROR_MAX];
            snprintf(msg, sizeof msg, "%s", kiln_error());
            rc = spec_error(NULL, "shapes do not connect: %s", msg);
        }
        kiln_no_grad_end();
        kiln_module_train(model, training);
    }
    kiln_scope_end();
    return rc;
}

/* The first repeated key ends the walk with the error (json-keys-impl.h says why they are
 * refused). */
static int repeated_key(void *ud, const char *path, const char *key)
{
    (void)ud;
    kiln__error_set("model spec: key '%.64s' is given twice in %s%s", key, *path ? "" : "the spec", path);
    return 1;
}

kiln_module *kiln_model_from_json(const char *json, kiln_device *dev, kiln_generator *gen)
{
    if (!json || !dev) {
        kiln__error_set("model spec: no JSON text or device");
        return NULL;
    }
    size_t at;
    bool trailing;
    cJSON *root = kiln__json_parse_whole(json, &at, &trailing);
    if (!root) {
        if (trailing)
            kiln__error_set("model spec: text after the JSON value, at byte %zu: \"%.30s\"", at, json + at);
        else
            kiln__error_set("model spec: malformed JSON at byte %zu, near \"%.30s\"", at, json + at);
        return NULL;
    }
    int rk = kiln__json_repeated_keys(root, repeated_key, NULL);
    if (rk != 0) {
        if (rk < 0)
            kiln__error_set("model spec: out of memory");
        cJSON_Delete(root);
        return NULL;
    }
    kiln_generator fb;
    gen = kiln__gen_or_default(gen, &fb);
    graph *g = calloc(1, sizeof *g);
    kiln_module *m = g ? kiln_module_new(&model_class, g) : NULL;
    if (!m) {
        cJSON_Delete(root);
        kiln__error_set("model spec: out of memory");
        return NULL;
    }
    int rc = build(m, g, root, dev, gen);
    const cJSON *ex = cJSON_GetObjectItemCaseSensitive(root, "example_inputs");
    if (rc == 0 && ex)
        rc = dry_run(m, g, ex, dev);
    /* As parsed (one line, the same keys): what checkpoints store to build the model again. */
    char *spec = rc == 0 ? cJSON_PrintUnformatted(root) : NULL;
    if (rc == 0 && (!spec || !(g->spec = strdup(spec))))
        rc = kiln__error_set("model spec: out of memory");
    cJSON_free(spec);
    cJSON_Delete(root);
    if (rc < 0) {
        kiln_module_free(m);
        return NULL;
    }
    return m;
}

char *kiln_model_spec_json(const kiln_module *m)
{
    const graph *g = m && m->cls == &model_class ? m->self : NULL;
    if (!g || !g->spec) {
        kiln__error_set("kiln_model_spec_json: %s was not built from a JSON model spec",
                        m ? kiln_module_type(m) : "no module");
        return NULL;
    }
    char *copy = strdup(g->spec);
    if (!copy)
        kiln__error_set("kiln_model_spec_json: out of memory");
    return copy;
}

kiln_module *kiln_model_from_json_file(const char *path, kiln_device *dev, kiln_generator *gen)
{
    char *buf = NULL;
    if (!path) {
        kiln__error_set("model spec: path is NULL");
        return NULL;
    }
    if (kiln__read_file(path, MODEL_SPEC_MAX_BYTES, &buf, NULL) < 0) {
        kiln__error_restate("model spec: cannot read %s: %s", path, kiln_error());
        return NULL;
    }
    kiln_module *m = kiln_model_from_json(buf, dev, gen);
    free(buf);
    return m;
}
