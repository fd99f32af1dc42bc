/*
 * onnx-model.c — from decoded messages to a planned model (onnx-model-impl.h); onnx-run.c
 * runs it.
 *
 * Load: name every value (initializers, graph inputs, node outputs) with an integer id;
 * order the nodes topologically (Kahn's algorithm; a cycle is reported with a node on
 * it); look every operator up (an unknown one fails the load, naming op type and node);
 * fold nodes whose inputs are all small constants — the shape arithmetic exporters emit
 * (Shape -> Gather -> Unsqueeze -> Concat -> Reshape) — by running them once on the
 * model's device; fold BatchNormalization into the Conv before it; and record for every
 * value the last node that reads it. Nodes that read only weights are marked derived;
 * onnx-run.c caches their outputs outside grad mode. An If's branches are planned the same
 * way, each as a model of its own (kiln__onnx_branch_load, onnx-ops-control.c).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "error-impl.h"
#include "kiln/autodiff.h"
#include "kiln/record.h"
#include "onnx-model-impl.h"
#include "storage-impl.h"
#include "tensor-impl.h"

/* Constants up to this many elements are folded; bigger ones (weights) stay graph inputs
 * of their nodes so that training can reach them. */
#define FOLD_MAX_NUMEL 4096

kiln_onnx_options kiln_onnx_options_default(void) {
    return (kiln_onnx_options){.fold_batchnorm = true,
                               .fuse_epilogues = true,
                               .max_file_bytes = 0,
                               .arena = true,
                               .graphs = true,
                               .common_subexpressions = true};
}

/* ------------------------------------------------------------- value names */

static int add_value(kiln_onnx_model *m, char *name, bool owned) {
    if (m->nvalues == m->vcap) {
        int nc = m->vcap ? m->vcap * 2 : 64;
        char **a = realloc(m->vnames, (size_t)nc * sizeof *a);
        if (a) m->vnames = a;
        bool *o = realloc(m->vowned, (size_t)nc * sizeof *o);
        if (o) m->vowned = o;
        kiln_tensor **c = realloc(m->consts, (size_t)nc * sizeof *c);
        if (c) m->consts = c;
        if (!a || !o || !c) return kiln__error_set("onnx: out of memory");
        m->vcap = nc;
    }
    m->vnames[m->nvalues] = name;
    m->vowned[m->nvalues] = owned;
    m->consts[m->nvalues] = NULL;
    return m->nvalues++;
}

/* Value names are looked up through a hash table while the graph is wired. */
typedef struct vmap {
    int cap;
    int *slot;
} vmap;

static int vmap_find(const vmap *vm, const kiln_onnx_model *m, const char *name) {
    for (uint64_t i = kiln__onnx_name_hash(name) & (uint64_t)(vm->cap - 1);;
         i = (i + 1) & (uint64_t)(vm->cap - 1)) {
        int v = vm->slot[i];
        if (v < 0 || !strcmp(m->vnames[v], name)) return v;
    }
}

static void vmap_put(vmap *vm, const kiln_onnx_model *m, int v) {
    uint64_t i = kiln__onnx_name_hash(m->vnames[v]) & (uint64_t)(vm->cap - 1);
    while (vm->slot[i] >= 0) i = (i + 1) & (uint64_t)(vm->cap - 1);
    vm->slot[i] = v;
}

/* --------------------------------------------------------------- planning */

static bool foldable(const kiln_onnx_model *m, const kiln__onnx_mnode *n)
{
    if (!strcmp(n->info.op_type, "Constant")) return true;
    if (n->nin == 0) return !strcmp(n->info.op_type, "Range");
    if (!strcmp(n->info.op_type, "RandomNormal") || !strcmp(n->info.op_type, "Dropout") ||
        !kiln__onnx_if_pure(&n->info))
        return false;
    for (int i = 0; i < n->nin; i++) {
        int v = n->in[i];
        if (v < 0) continue;
        if (!m->consts[v]) return false;
        bool shape_only = !strcmp(n->info.op_type, "Shape") || !strcmp(n->info.op_type, "Size");
        if (!shape_only && kiln_tensor_numel(m->consts[v]) > FOLD_MAX_NUMEL) return false;
    }
    return true;
}

static int fold_constants(kiln_onnx_model *m) {
    for (int k = 0; k < m->nnodes; k++) {
        kiln__onnx_mnode *n = &m->nodes[k];
        if (!foldable(m, n)) continue;
        kiln_no_grad_begin();
        int rc = kiln__onnx_run_node(m, n, m->consts);
        kiln_no_grad_end();
        if (rc) return -1;
        n->dead = true;
    }
    return 0;
}

/* A live node whose inputs are all constants or derived values, and which is not random, is
 * derived; its outputs are derived values. (Small all-constant nodes were folded already.) */
static int mark_derived(kiln_onnx_model *m) {
    if (m->branch)
        return 0;
    bool *dv = calloc((size_t)m->nvalues + 1, sizeof *dv);
    if (!dv) return kiln__error_set("onnx: out of memory");
    for (int k = 0; k < m->nnodes; k++) {
        kiln__onnx_mnode *n = &m->nodes[k];
        if (n->dead || n->nin == 0 || !strcmp(n->info.op_type, "RandomNormal") ||
            !strcmp(n->info.op_type, "RandomUniform") || !strcmp(n->info.op_type, "Dropout") ||
            !kiln__onnx_if_pure(&n->info))
            continue;
        bool all = true;
        for (int i = 0; all && i < n->nin; i++)
            all = n->in[i] < 0 || m->consts[n->in[i]] || dv[n->in[i]];
        if (!all) continue;
        n->derived = true;
        m->nderived++;
        for (int i = 0; i < n->nout; i++)
            if (n->out[i] >= 0) dv[n->out[i]] = true;
    }
    free(dv);
    if (!m->nderived) return 0;
    m->derived_vals = calloc((size_t)m->nvalues + 1, sizeof *m->derived_vals);
    m->derived_src = calloc((size_t)m->nvalues + 1, sizeof *m->derived_src);
    m->derived_ver = calloc((size_t)m->nvalues + 1, sizeof *m->derived_ver);
    if (!m->derived_vals || !m->derived_src || !m->derived_ver) return kiln__error_set("onnx: out of memory");
    return 0;
}

/* Conv followed by BatchNormalization (inference form) becomes one Conv:
 * W' = W * g/sqrt(var+eps) per output channel, b' = (b - mean) * g/sqrt(var+eps) + beta. */
static int fold_batchnorm(kiln_onnx_model *m, const int *readers) {
    for (int k = 0; k < m->nnodes; k++) {
        kiln__onnx_mnode *bn = &m->nodes[k];
        if (bn->dead || strcmp(bn->info.op_type, "BatchNormalization") || bn->nin < 5 || bn->nout != 1) continue;
        int x = bn->in[0];
        if (x < 0 || readers[x] != 1) continue;
        kiln__onnx_mnode *cv = NULL;
        for (int j = 0; j < k; j++)
            if (!m->nodes[j].dead && !strcmp(m->nodes[j].info.op_type, "Conv") && m->nodes[j].out[0] == x)
                cv = &m->nodes[j];
        if (!cv || cv->nin < 2 || cv->in[1] < 0 || !m->consts[cv->in[1]]) continue;
        bool ok = true;
        for (int i = 1; i < 5; i++) ok = ok && bn->in[i] >= 0 && m->consts[bn->in[i]];
        if (cv->nin >= 3 && cv->in[2] >= 0 && !m->consts[cv->in[2]]) ok = false;
        if (!ok) continue;
        double eps = kiln__onnx_attr_float(&bn->info, "epsilon", 1e-5);
        kiln_tensor *w = m->consts[cv->in[1]];
        int64_t oc = kiln_tensor_dim(w, 0);
        int64_t bshape[KILN_MAX_DIMS] = {oc};
        for (int d = 1; d < kiln_tensor_ndim(w); d++) bshape[d] = 1;
        kiln_no_grad_begin();
        kiln_scope_begin();
        kiln_tensor *s = kiln_mul(m->consts[bn->in[1]],
                                  kiln_rsqrt(kiln_add_scalar(m->consts[bn->in[4]], eps)));
        kiln_tensor *nw = kiln_mul(w, kiln_reshape(s, kiln_tensor_ndim(w), bshape));
        kiln_tensor *b0 = cv->nin >= 3 && cv->in[2] >= 0 ? m->consts[cv->in[2]] : kiln_zeros_like(s);
        kiln_tensor *nb = kiln_add(kiln_mul(kiln_sub(b0, m->consts[bn->in[3]]), s), m->consts[bn->in[2]]);
        nw = kiln_keep(kiln_contiguous(nw));
        nb = kiln_keep(kiln_contiguous(nb));
        kiln_scope_end();
        kiln_no_grad_end();
        if (!nw || !nb) { kiln_tensor_release(nw); kiln_tensor_release(nb); return -1; }
        char nm[2][256];
        snprintf(nm[0], sizeof nm[0], "%s.folded_weight", cv->info.name);
        snprintf(nm[1], sizeof nm[1], "%s.folded_bias", cv->info.name);
        int ids[2];
        for (int i = 0; i < 2; i++) {
            char *c = strdup(nm[i]);
            ids[i] = c ? add_value(m, c, true) : kiln__error_set("onnx: out of memory");
            if (ids[i] < 0) { free(c); kiln_tensor_release(nw); kiln_tensor_release(nb); return -1; }
            m->consts[ids[i]] = i == 0 ? nw : nb;
        }
        if (cv->nin < 3) {
            int *ni = realloc(cv->in, 3 * sizeof *ni);
            if (!ni) return kiln__error_set("onnx: out of memory");
            cv->in = ni;
            cv->nin = cv->nin_op = 3;
        }
        cv->in[1] = ids[0];
        cv->in[2] = ids[1];
        cv->out[0] = bn->out[0];
        bn->dead = true;
    }
    return 0;
}

/* The activation an epilogue can apply for node n, with its parameters; KILN_EPI_NONE
 * when n is not one (or a Clip whose bounds are not constants). */
static int epilogue_act(const kiln_onnx_model *m, const kiln__onnx_mnode *n, double *alpha, double *beta)
{
    const char *op = n->info.op_type;
    *alpha = *beta = 0;
    if (n->nout != 1 || n->nin < 1) return KILN_EPI_NONE;
    if (!strcmp(op, "Relu")) return KILN_EPI_RELU;
    if (!strcmp(op, "Sigmoid")) return KILN_EPI_SIGMOID;
    if (!strcmp(op, "HardSwish")) return KILN_EPI_HARD_SWISH;
    if (!strcmp(op, "LeakyRelu")) {
        *alpha = kiln__onnx_attr_float(&n->info, "alpha", 0.01);
        return KILN_EPI_LEAKY_RELU;
    }
    if (!strcmp(op, "HardSigmoid")) {
        *alpha = kiln__onnx_attr_float(&n->info, "alpha", 0.2);
        *beta = kiln__onnx_attr_float(&n->info, "beta", 0.5);
        return KILN_EPI_HARD_SIGMOID;
    }
    if (!strcmp(op, "Clip")) {
        double lo = -INFINITY, hi = INFINITY;
        if (n->info.opset < 11) {
            lo = kiln__onnx_attr_float(&n->info, "min", -INFINITY);
            hi = kiln__onnx_attr_float(&n->info, "max", INFINITY);
        } else {
            for (int i = 1; i < n->nin && i < 3; i++) {
                int v = n->in[i];
                if (v < 0) continue;
                double d;
                if (!m->consts[v] || kiln_tensor_numel(m->consts[v]) != 1 ||
                    kiln__onnx_read_scalar(&n->info, m->consts[v], &d))
                    return KILN_EPI_NONE;
                if (i == 1) lo = d;
                else hi = d;
            }
        }
        if (lo > hi) return KILN_EPI_NONE;   /* kiln_clamp refuses it: keep its error */
        *alpha = lo;
        *beta = hi;
        return KILN_EPI_CLAMP;
    }
    return KILN_EPI_NONE;
}

static int append_input(kiln__onnx_mnode *n, int v)
{
    int *ni = realloc(n->in, (size_t)(n->nin + 2) * sizeof *ni);
    if (!ni) return kiln__error_set("onnx: out of memory");
    n->in = ni;
    n->in[n->nin] = v;
    return n->nin++;
}

/*
 * Conv, MatMul and Gemm absorb the chain after them: an Add whose other operand is
 * ready by the time the producer runs (a residual computed earlier, or a constant bias
 * of a MatMul), then an activation. Only links whose input is read by that link alone
 * (not by another node, not a graph output) are taken, so no value a later node needs
 * disappears. The absorbed nodes are marked dead and the producer takes over their
 * output value; the producer's operator reads the fuse_* fields (onnx-ops-nn.c).
 */
static int fuse_epilogues(kiln_onnx_model *m) {
    int rc = -1;
    int *readers = calloc((size_t)m->nvalues + 1, sizeof *readers);
    int *reader = calloc((size_t)m->nvalues + 1, sizeof *reader);
    int *producer = malloc(((size_t)m->nvalues + 1) * sizeof *producer);
    if (!readers || !reader || !producer) { kiln__error_set("onnx: out of memory"); goto out; }
    for (int v = 0; v < m->nvalues; v++) producer[v] = -1;
    for (int k = 0; k < m->nnodes; k++) {
        const kiln__onnx_mnode *n = &m->nodes[k];
        if (n->dead) continue;
        for (int j = 0; j < n->nin; j++)
            if (n->in[j] >= 0) {
                readers[n->in[j]]++;
                reader[n->in[j]] = k;
            }
        for (int j = 0; j < n->nout; j++)
            if (n->out[j] >= 0) producer[n->out[j]] = k;
    }
    for (int i = 0; i < m->noutputs; i++) readers[m->output_vals[i]] += 2;
    for (int k = 0; k < m->nnodes; k++) {
        kiln__onnx_mnode *c = &m->nodes[k];
        const char *op = c->info.op_type;
        bool conv = !strcmp(op, "Conv"), matmul = !strcmp(op, "MatMul"), gemm = !strcmp(op, "Gemm");
        if (c->dead || (!conv && !matmul && !gemm) || c->nout != 1 || c->out[0] < 0) continue;
        char label[48];
        snprintf(label, sizeof label, "%s", op);
        int v = c->out[0];
        kiln__onnx_mnode *r = readers[v] == 1 ? &m->nodes[reader[v]] : NULL;
        if (r && !r->dead && (conv || matmul) && !strcmp(r->info.op_type, "Add") && r->nin == 2 && r->nout == 1 &&
            r->out[0] >= 0 && r->in[0] != r->in[1]) {
            int u = r->in[0] == v ? r->in[1] : r->in[0];
            bool is_bias = matmul && u >= 0 && m->consts[u] && kiln_tensor_ndim(m->consts[u]) == 1;
            bool ready = u >= 0 && (m->consts[u] || producer[u] < k);
            if (ready) {
                int at = append_input(c, u);
                if (at < 0) goto out;
                if (is_bias) c->info.fuse_bias = at;
                else c->info.fuse_residual = at;
                c->out[0] = v = r->out[0];
                r->dead = true;
                snprintf(label, sizeof label, "%s+Add", op);
            }
        }
        r = readers[v] == 1 ? &m->nodes[reader[v]] : NULL;
        double a, b;
        int act = r && !r->dead && r->out[0] >= 0 && r->in[0] == v ? epilogue_act(m, r, &a, &b) : KILN_EPI_NONE;
        if (act != KILN_EPI_NONE) {
            c->info.fuse_act = act;
            c->info.fuse_alpha = a;
            c->info.fuse_beta = b;
            c->out[0] = r->out[0];
            r->dead = true;
            size_t len = strlen(label);
            snprintf(label + len, sizeof label - len, "+%s", r->info.op_type);
        }
        snprintf(c->label, sizeof c->label, "%s", label);
    }
    rc = 0;
out:
    free(readers);
    free(reader);
    free(producer);
    return rc;
}

static int plan(kiln_onnx_model *m, const kiln_onnx_options *o) {
    kiln__onnx_pmodel *pm = m->pm;
    int total = pm->ninits + pm->ninputs;
    for (int i = 0; i < pm->nnodes; i++) total += pm->nodes[i].noutputs;
    vmap vm = {1, NULL};
    while (vm.cap < 2 * total + 2) vm.cap *= 2;
    vm.slot = malloc((size_t)vm.cap * sizeof *vm.slot);
    int *producer = NULL, *indeg = NULL, *order = NULL, *readers = NULL, **users = NULL, *nusers = NULL;
    int rc = -1;
    if (!vm.slot) { kiln__error_set("onnx: out of memory"); goto out; }
    for (int i = 0; i < vm.cap; i++) vm.slot[i] = -1;

    for (int i = 0; i < pm->ninits; i++) {
        kiln__onnx_ptensor *pt = &pm->inits[i];
        if (vmap_find(&vm, m, pt->name) >= 0) { kiln__error_set("onnx: initializer '%s' given twice", pt->name); goto out; }
        if (pt->external) { kiln__error_set("onnx: initializer '%s': external data not loaded", pt->name); goto out; }
        int v = add_value(m, pt->name, false);
        if (v < 0) goto out;
        vmap_put(&vm, m, v);
        m->consts[v] = kiln__onnx_ptensor_to_tensor(pt, m->dev);
        if (!m->consts[v]) goto out;
        free(pt->data);       /* the device copy is the only one kept */
        pt->data = NULL;
    }
    m->nparams = m->nvalues;
    m->param_vals = malloc((size_t)(m->nparams + 1) * sizeof *m->param_vals);
    m->input_vals = malloc((size_t)(pm->ninputs + 1) * sizeof *m->input_vals);
    m->input_info = malloc((size_t)(pm->ninputs + 1) * sizeof *m->input_info);
    m->output_vals = malloc((size_t)(pm->noutputs + 1) * sizeof *m->output_vals);
    m->nodes = calloc((size_t)pm->nnodes + 1, sizeof *m->nodes);
    if (!m->param_vals || !m->input_vals || !m->input_info || !m->output_vals || !m->nodes) {
        kiln__error_set("onnx: out of memory");
        goto out;
    }
    for (int i = 0; i < m->nparams; i++) m->param_vals[i] = i;
    for (int i = 0; i < pm->ninputs; i++) {
        if (vmap_find(&vm, m, pm->inputs[i].name) >= 0) continue;   /* an initializer listed as input */
        /* a declared type kiln has no tensors of (STRING, complex, 8-bit floats) is refused here:
         * it would otherwise be reported as f32 and fail at the first run */
        int et = pm->inputs[i].elem_type;
        if (et && kiln__onnx_kdtype(et) < 0) {
            kiln__error_set("onnx: input '%s' is of ONNX type %d (%s), which kiln has no tensors of",
                            pm->inputs[i].name, et,
                            et == 8                ? "STRING"
                            : et == 14 || et == 15 ? "complex"
                                                   : "not a number type kiln holds");
            goto out;
        }
        int v = add_value(m, pm->inputs[i].name, false);
        if (v < 0) goto out;
        vmap_put(&vm, m, v);
        m->input_info[m->ninputs] = &pm->inputs[i];
        m->input_vals[m->ninputs++] = v;
    }
    int first_node_value = m->nvalues;
    /* Node outputs: each value has exactly one producer (SSA). */
    producer = malloc(((size_t)total + 1) * sizeof *producer);
    if (!producer) { kiln__error_set("onnx: out of memory"); goto out; }
    for (int k = 0; k < pm->nnodes; k++) {
        kiln__onnx_pnode *pn = &pm->nodes[k];
        for (int j = 0; j < pn->noutputs; j++) {
            if (!*pn->outputs[j]) continue;
            if (vmap_find(&vm, m, pn->outputs[j]) >= 0) {
                kiln__error_set("onnx: value '%s' is produced twice (node '%s')", pn->outputs[j], pn->name);
                goto out;
            }
            int v = add_value(m, pn->outputs[j], false);
            if (v < 0) goto out;
            vmap_put(&vm, m, v);
            producer[v - first_node_value] = k;
        }
    }
    /* Kahn's algorithm over node indices. */
    indeg = calloc((size_t)pm->nnodes + 1, sizeof *indeg);
    nusers = calloc((size_t)pm->nnodes + 1, sizeof *nusers);
    users = calloc((size_t)pm->nnodes + 1, sizeof *users);
    order = malloc(((size_t)pm->nnodes + 1) * sizeof *order);
    if (!indeg || !nusers || !users || !order) { kiln__error_set("onnx: out of memory"); goto out; }
    for (int k = 0; k < pm->nnodes; k++) {
        kiln__onnx_pnode *pn = &pm->nodes[k];
        for (int j = 0; j < pn->ninputs; j++) {
            if (!*pn->inputs[j]) continue;
            int v = vmap_find(&vm, m, pn->inputs[j]);
            if (v < 0) {
                kiln__error_set("onnx: node '%s' (%s) reads '%s', which nothing produces", pn->name, pn->op_type,
                                pn->inputs[j]);
                goto out;
            }
            if (v < first_node_value) continue;
            int p = producer[v - first_node_value];
            int *u = realloc(users[p], (size_t)(nusers[p] + 1) * sizeof *u);
            if (!u) { kiln__error_set("onnx: out of memory"); goto out; }
            users[p] = u;
            u[nusers[p]++] = k;
            indeg[k]++;
        }
    }
    int head = 0, tail = 0;
    for (int k = 0; k < pm->nnodes; k++)
        if (!indeg[k]) order[tail++] = k;
    while (head < tail) {
        int k = order[head++];
        for (int j = 0; j < nusers[k]; j++)
            if (--indeg[users[k][j]] == 0) order[tail++] = users[k][j];
    }
    if (tail < pm->nnodes) {
        for (int k = 0; k < pm->nnodes; k++)
            if (indeg[k]) {
                kiln__error_set("onnx: the graph has a cycle through node '%s' (%s)", pm->nodes[k].name,
                                pm->nodes[k].op_type);
                goto out;
            }
    }
    /* Operators, in topological order so the first unsupported one is reported. */
    for (int t = 0; t < pm->nnodes; t++) {
        kiln__onnx_pnode *pn = &pm->nodes[order[t]];
        kiln__onnx_mnode *n = &m->nodes[t];
        n->info = (kiln__onnx_node){.name = pn->name, .op_type = pn->op_type, .opset = pm->opset,
                                    .nattrs = pn->nattrs, .attrs = pn->attrs, .dev = m->dev,
                                    .fuse_residual = -1, .fuse_bias = -1};
        m->nnodes = t + 1;
        bool std_domain = !pn->domain || !*pn->domain || !strcmp(pn->domain, "ai.onnx");
        n->fn = std_domain ? kiln__onnx_find_op(pn->op_type) : NULL;
        if (!n->fn) {
            kiln__error_set("onnx: unsupported operator '%s%s%s' (node '%s')", std_domain ? "" : pn->domain,
                            std_domain ? "" : ".", pn->op_type, pn->name);
            goto out;
        }
        /* an If's (a Loop's) inputs past its condition (values) are what it reads: any number */
        bool is_if = std_domain && (!strcmp(pn->op_type, "If") || !strcmp(pn->op_type, "Loop"));
        if ((pn->ninputs > 64 && !is_if) || pn->noutputs > 16) {
            kiln__error_set("onnx: node '%s' (%s) has too many inputs or outputs", pn->name, pn->op_type);
            goto out;
        }
        snprintf(n->label, sizeof n->label, "%s", pn->op_type);
        if (o->fuse_epilogues && !strcmp(pn->op_type, "Conv")) n->info.pack = &n->pack;
        if (!strcmp(pn->op_type, "LSTM") || !strcmp(pn->op_type, "GRU"))
            n->info.pack = &n->pack;
        if (!strcmp(pn->op_type, "QuantizeLinear") && pn->ninputs > 2)
            n->info.quant_type = kiln__onnx_declared_type(pm, pn->inputs[2]);
        if ((!strcmp(pn->op_type, "QLinearConv") || !strcmp(pn->op_type, "QLinearMatMul")) && pn->ninputs > 7)
            n->info.quant_type = kiln__onnx_declared_type(pm, pn->inputs[7]);
        n->nin = n->nin_op = pn->ninputs;
        n->nout = pn->noutputs;
        n->inplace = pn->noutputs == 1 ? kiln__onnx_inplace_kind(pn->op_type) : KILN__ONNX_IP_NONE;
        n->in = malloc(((size_t)n->nin + 1) * sizeof *n->in);
        n->out = malloc(((size_t)n->nout + 1) * sizeof *n->out);
        if (!n->in || !n->out) { kiln__error_set("onnx: out of memory"); goto out; }
        for (int j = 0; j < n->nin; j++) n->in[j] = *pn->inputs[j] ? vmap_find(&vm, m, pn->inputs[j]) : -1;
        for (int j = 0; j < n->nout; j++) n->out[j] = *pn->outputs[j] ? vmap_find(&vm, m, pn->outputs[j]) : -1;
        if (is_if && kiln__onnx_if_setup(m, n, pn, o))
            goto out;
    }
    for (int i = 0; i < pm->noutputs; i++) {
        int v = vmap_find(&vm, m, pm->outputs[i].name);
        if (v < 0) { kiln__error_set("onnx: graph output '%s' is never produced", pm->outputs[i].name); goto out; }
        m->output_vals[m->noutputs++] = v;
    }
    if (fold_constants(m)) goto out;
    if (mark_derived(m)) goto out;
    if (o->common_subexpressions && kiln__onnx_cse(m, NULL))
        goto out;
    kiln__onnx_mark_index_nonneg(m);
    readers = calloc((size_t)m->nvalues + 1, sizeof *readers);
    if (!readers) { kiln__error_set("onnx: out of memory"); goto out; }
    for (int k = 0; k < m->nnodes; k++)
        for (int j = 0; !m->nodes[k].dead && j < m->nodes[k].nin; j++)
            if (m->nodes[k].in[j] >= 0) readers[m->nodes[k].in[j]]++;
    for (int i = 0; i < m->noutputs; i++) readers[m->output_vals[i]] += 2;
    if (o->fold_batchnorm && fold_batchnorm(m, readers)) goto out;
    if (o->fuse_epilogues && fuse_epilogues(m)) goto out;
    m->last_use = malloc(((size_t)m->nvalues + 1) * sizeof *m->last_use);
    if (!m->last_use) { kiln__error_set("onnx: out of memory"); goto out; }
    for (int v = 0; v < m->nvalues; v++) m->last_use[v] = -1;
    m->live_nodes = 0;
    for (int k = 0; k < m->nnodes; k++) {
        if (m->nodes[k].dead) continue;
        m->live_nodes++;
        if (m->nodes[k].nin > m->max_nin)
            m->max_nin = m->nodes[k].nin;
        for (int j = 0; j < m->nodes[k].nin; j++)
            if (m->nodes[k].in[j] >= 0) m->last_use[m->nodes[k].in[j]] = k;
    }
    for (int i = 0; i < m->noutputs; i++) m->last_use[m->output_vals[i]] = m->nnodes;
    kiln__onnx_if_settle(m);
    if (kiln__onnx_plan_host(m))
        goto out;
    rc = 0;
out:
    if (users)
        for (int k = 0; k < pm->nnodes; k++) free(users[k]);
    free(users); free(nusers); free(indeg); free(order); free(producer); free(readers); free(vm.slot);
    return rc;
}

/* --------------------------------------------------------------- loading */

/* External data must stay inside the model's folder: a relative path without "..". */
static int load_external(kiln__onnx_pmodel *pm, const char *model_path) {
    for (int i = 0; i < pm->ninits; i++) {
        kiln__onnx_ptensor *t = &pm->inits[i];
        if (!t->external) continue;
        if (!model_path) return kiln__error_set("onnx: tensor '%s' uses external data, which a model loaded "
                                                "from memory cannot have", t->name);
        const char *loc = t->ext_location;
        if (!*loc || loc[0] == '/' || strstr(loc, "..") || strchr(loc, '\\'))
            return kiln__error_set("onnx: tensor '%s': external data path '%s' leaves the model's folder",
                                   t->name, loc);
        const char *slash = strrchr(model_path, '/');
        size_t dl = slash ? (size_t)(slash - model_path + 1) : 0;
        size_t pl = dl + strlen(loc) + 1;
        char *path = malloc(pl);
        if (!path) return kiln__error_set("onnx: out of memory");
        memcpy(path, model_path, dl);
        strcpy(path + dl, loc);
        int fd = kiln__open_regular(path, NULL); /* a FIFO would hang the loader */
        int open_errno = errno;
        free(path);
        FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
        if (!f) {
            if (fd >= 0) {
                open_errno = errno;
                close(fd);
            }
            return kiln__error_set("onnx: tensor '%s': cannot open external data '%s' (beside the model): %s",
                                   t->name, loc,
                                   fd == KILN__NOT_REGULAR ? "not a regular file" : strerror(open_errno));
        }
        int64_t want = (int64_t)t->nbytes;
        if (t->ext_length >= 0 && t->ext_length != want) {
            fclose(f);
            return kiln__error_set("onnx: tensor '%s': external length %lld, but its dims need %lld bytes", t->name,
                                   (long long)t->ext_length, (long long)want);
        }
        size_t esz = kiln_dtype_size((kiln_dtype)t->kdtype);
        bool same = (t->onnx_type == KILN__ONNX_FLOAT || t->onnx_type == KILN__ONNX_DOUBLE ||
                     t->onnx_type == KILN__ONNX_INT64 || t->onnx_type == KILN__ONNX_INT32 ||
                     t->onnx_type == KILN__ONNX_FLOAT16 || t->onnx_type == KILN__ONNX_BFLOAT16 ||
                     t->onnx_type == KILN__ONNX_UINT8 || t->onnx_type == KILN__ONNX_BOOL);
        if (!same || esz == 0) { fclose(f); return kiln__error_set("onnx: tensor '%s': external data of this type is not supported", t->name); }
        t->data = malloc(t->nbytes ? t->nbytes : 1);
        if (!t->data) { fclose(f); return kiln__error_set("onnx: out of memory"); }
        int ok = fseeko(f, (off_t)t->ext_offset, SEEK_SET) == 0 && fread(t->data, 1, t->nbytes, f) == t->nbytes;
        fclose(f);
        if (!ok) return kiln__error_set("onnx: tensor '%s': external data '%s' is too short", t->name, loc);
        t->external = false;
    }
    return 0;
}

/* owned: buf is kiln_onnx_load's own mapping, whose tensor bytes the decoder may give back */
static kiln_onnx_model *load_bytes(const uint8_t *buf, size_t len, bool owned, const char *path, kiln_device *dev,
                                   const kiln_onnx_options *opts)
{
    kiln_onnx_options o = opts ? *opts : kiln_onnx_options_default();
    if (!dev) { kiln__error_set("onnx: no device"); return NULL; }
    kiln__onnx_pmodel *pm = owned ? kiln__onnx_decode_consuming((uint8_t *)buf, len) : kiln__onnx_decode(buf, len);
    if (!pm) return NULL;
    if (load_external(pm, path) || kiln__onnx_scope_branches(pm)) {
        kiln__onnx_pmodel_free(pm);
        return NULL;
    }
    if (pm->opset != 0 && (pm->opset < 7 || pm->opset > 23)) {
        kiln__error_set("onnx: opset %lld is outside what kiln supports (7..23)", (long long)pm->opset);
        kiln__onnx_pmodel_free(pm);
        return NULL;
    }
    kiln_onnx_model *m = calloc(1, sizeof *m);
    if (!m) { kiln__onnx_pmodel_free(pm); kiln__error_set("onnx: out of memory"); return NULL; }
    m->pm = pm;
    m->dev = dev;
    /* the environment's defaults, read through the engine's one table (device-opts.c) */
    const char *cse = kiln__option_env("onnx", "cse", NULL);
    if (cse && *cse)
        o.common_subexpressions = strcmp(cse, "0") != 0;
    if (plan(m, &o)) {
        kiln_onnx_free(m);
        return NULL;
    }
    const char *arena = kiln__option_env("onnx", "arena", NULL);
    if (arena && *arena) o.arena = strcmp(arena, "0") != 0;
    m->arenas = kiln__onnx_arenas_new(o.arena);
    if (!m->arenas) { kiln_onnx_free(m); return NULL; }
    const char *graphs = kiln__option_env("onnx", "graphs", NULL);
    if (graphs && *graphs)
        o.graphs = strcmp(graphs, "0") != 0;
    m->graphs = kiln__onnx_graphs_new(o.graphs);
    if (!m->graphs) {
        kiln_onnx_free(m);
        return NULL;
    }
    const char *prof = kiln__option_env("onnx", "profile", NULL);
    if (prof && *prof && strcmp(prof, "0")) m->prof_ms = calloc((size_t)m->nnodes + 1, sizeof *m->prof_ms);
    m->prof_nodes = prof && !strcmp(prof, "nodes");
    return m;
}

kiln_onnx_model *kiln__onnx_branch_load(kiln_device *dev, kiln__onnx_pmodel *g, const kiln_onnx_options *o)
{
    kiln_onnx_model *m = calloc(1, sizeof *m);
    if (!m) {
        kiln__error_set("onnx: out of memory");
        return NULL;
    }
    *m = (kiln_onnx_model){.dev = dev, .pm = g, .branch = true};
    if (plan(m, o)) {
        kiln_onnx_free(m);
        return NULL;
    }
    return m;
}

kiln_onnx_model *kiln_onnx_load_memory(const void *data, size_t len, kiln_device *dev,
                                       const kiln_onnx_options *opts) {
    if (!data && len) { kiln__error_set("onnx: NULL data"); return NULL; }
    return load_bytes(data, len, false, NULL, dev, opts);
}

/* A model file's bytes, in a private anonymous mapping rather than malloc's memory: the
 * decoder gives each tensor's pages back as it copies them (kiln__onnx_decode_consuming). */
typedef struct file_bytes {
    uint8_t *base;
    size_t len, cap;
} file_bytes;

static void file_bytes_free(file_bytes *fb)
{
    if (fb->base)
        munmap(fb->base, fb->cap);
    *fb = (file_bytes){0};
}

/* Room for at least want bytes, keeping what was read. */
static int file_bytes_reserve(file_bytes *fb, size_t want)
{
    if (want <= fb->cap)
        return 0;
    size_t page = (size_t)sysconf(_SC_PAGESIZE), cap = (want + page - 1) / page * page;
    void *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return -1;
    if (fb->len)
        memcpy(p, fb->base, fb->len);
    if (fb->base)
        munmap(fb->base, fb->cap);
    fb->base = p;
    fb->cap = cap;
    return 0;
}

/* Reads fd to its end, at most max bytes; sized by fstat, and grown should the file grow
 * while it is read. 0, or -1 with the error set. */
static int read_model_file(int fd, const char *path, size_t max, file_bytes *fb)
{
    struct stat st;
    size_t want = fstat(fd, &st) == 0 && st.st_size > 0 ? (size_t)st.st_size : 0;
    if (want > max)
        return kiln__error_set("onnx: '%s' is larger than %zu bytes", path, max);
    if (file_bytes_reserve(fb, want + 1)) /* one more: the end is a read of 0 bytes, not a full buffer */
        return kiln__error_set("onnx: out of memory reading '%s'", path);
    for (;;) {
        if (fb->len == fb->cap && file_bytes_reserve(fb, fb->cap * 2))
            return kiln__error_set("onnx: out of memory reading '%s'", path);
        ssize_t got = read(fd, fb->base + fb->len, fb->cap - fb->len);
        if (got < 0 && errno == EINTR)
            continue;
        /* a read error (a directory gives EISDIR) told apart from the end of the file, or the
         * bytes read so far would be parsed as a truncated model */
        if (got < 0)
            return kiln__error_set("onnx: cannot read '%s': %s", path, strerror(errno));
        if (got == 0)
            return 0;
        fb->len += (size_t)got;
        if (fb->len > max)
            return kiln__error_set("onnx: '%s' is larger than %zu bytes", path, max);
    }
}

kiln_onnx_model *kiln_onnx_load(const char *path, kiln_device *dev, const kiln_onnx_options *opts) {
    size_t max = opts && opts->max_file_bytes ? opts->max_file_bytes : ((size_t)2 << 30);
    /* opened without blocking first: a FIFO in a model folder would hang the loader */
    int fd = path ? kiln__open_regular(path, NULL) : -1;
    if (fd == KILN__NOT_REGULAR) {
        kiln__error_set("onnx: cannot open '%s': not a regular file", path);
        return NULL;
    }
    if (fd < 0) {
        kiln__error_set("onnx: cannot open '%s': %s", path ? path : "(null)", path ? strerror(errno) : "no path");
        return NULL;
    }
    file_bytes fb = {0};
    int rc = read_model_file(fd, path, max, &fb);
    close(fd);
    kiln_onnx_model *m = rc == 0 ? load_bytes(fb.base, fb.len, true, path, dev, opts) : NULL;
    file_bytes_free(&fb);
    return m;
}

void kiln_onnx_free(kiln_onnx_model *m) {
    if (!m) return;
    if (m->prof_ms)
        kiln__onnx_print_profile(m);
    free(m->prof_ms);
    kiln__onnx_graphs_free(m->graphs); /* first: its graphs address the values below */
    kiln__onnx_derived_drop(m); /* before the constants: it tells cached values from lent constants */
    for (int v = 0; v < m->nvalues; v++) {
        kiln_tensor_release(m->consts[v]);
        if (m->vowned[v]) free(m->vnames[v]);
    }
    for (int k = 0; k < m->nnodes; k++) {
        free(m->nodes[k].in);
        free(m->nodes[k].out);
        kiln_tensor_release(m->nodes[k].pack.t);
        kiln__onnx_if_free(m->nodes[k].info.ctl);
    }
    free(m->derived_vals); free(m->derived_src); free(m->derived_ver);
    free(m->nodes); free(m->vnames); free(m->vowned); free(m->consts); free(m->last_use);
    free(m->input_vals); free(m->input_info); free(m->output_vals); free(m->param_vals);
    if (!m->branch)
        kiln__onnx_pmodel_free(m->pm);
    kiln__onnx_arenas_free(m->arenas);
    kiln__onnx_host_free(m);
    free(m);
}

int kiln_onnx_arena_stats_get(kiln_onnx_model *m, kiln_onnx_arena_stats *out) {
    if (!m || !out) return kiln__error_set("onnx: arena_stats_get: NULL argument");
    return kiln__onnx_arenas_stats(m->arenas, out);
}

int kiln_onnx_graph_stats_get(kiln_onnx_model *m, kiln_onnx_graph_stats *out)
{
    if (!m || !out)
        return kiln__error_set("onnx: graph_stats_get: NULL argument");
    int rc = kiln__onnx_graphs_stats(m->graphs, out);
    out->supported = kiln__graph_supported(m->dev);
    return rc;
}

/* --------------------------------------------------------------- queries */

int64_t kiln_onnx_opset(const kiln_onnx_model *m) { return m ? m->pm->opset : -1; }
int kiln_onnx_node_count(const kiln_onnx_model *m) { return m ? m->live_nodes : -1; }
int kiln_onnx_input_count(const kiln_onnx_model *m) { return m ? m->ninputs : -1; }
const char *kiln_onnx_input_name(const kiln_onnx_model *m, int i) {
    return m && i >= 0 && i < m->ninputs ? m->vnames[m->input_vals[i]] : NULL;
}
int kiln_onnx_input_info(const kiln_onnx_model *m, int i, int *ndim, int64_t *shape) {
    if (!m || i < 0 || i >= m->ninputs) return -1;
    const kiln__onnx_pvalue *pv = m->input_info[i];
    if (ndim) *ndim = pv->ndim;
    for (int d = 0; shape && d < pv->ndim; d++) shape[d] = pv->dims[d];
    int k = kiln__onnx_kdtype(pv->elem_type);
    return k < 0 ? KILN_F32 : k;
}
int kiln_onnx_output_count(const kiln_onnx_model *m) { return m ? m->noutputs : -1; }
int kiln_onnx_output_info(const kiln_onnx_model *m, int i, int *ndim, int64_t *shape)
{
    if (!m || i < 0 || i >= m->noutputs || i >= m->pm->noutputs)
        return -1;
    const kiln__onnx_pvalue *pv = &m->pm->outputs[i];
    if (ndim)
        *ndim = pv->ndim;
    for (int d = 0; shape && d < pv->ndim; d++)
        shape[d] = pv->dims[d];
    return pv->elem_type ? kiln__onnx_kdtype(pv->elem_type) : -1;
}
const char *kiln_onnx_output_name(const kiln_onnx_model *m, int i) {
    return m && i >= 0 && i < m->noutputs ? m->vnames[m->output_vals[i]] : NULL;
}
int kiln_onnx_param_count(const kiln_onnx_model *m) { return m ? m->nparams : -1; }
const char *kiln_onnx_param_name(const kiln_onnx_model *m, int i) {
    return m && i >= 0 && i < m->nparams ? m->vnames[m->param_vals[i]] : NULL;
}
kiln_tensor *kiln_onnx_param(const kiln_onnx_model *m, int i) {
    return m && i >= 0 && i < m->nparams ? m->consts[m->param_vals[i]] : NULL;
}

int kiln_onnx_set_trainable(kiln_onnx_model *m, bool on) {
    if (!m) return kiln__error_set("onnx: NULL model");
    kiln__onnx_graphs_drop(m->graphs); /* recorded without grad, for the weights as they were */
    /* packed weights are copies: training changes the originals, so they are made again
     * at the next run that can use them */
    for (int k = 0; k < m->nnodes; k++) {
        kiln_tensor_release(m->nodes[k].pack.t);
        m->nodes[k].pack = (kiln__onnx_pack){0};
        kiln__onnx_if_drop_packs(m->nodes[k].info.ctl);
    }
    for (int i = 0; i < m->nparams; i++) {
        kiln_tensor *t = m->consts[m->param_vals[i]];
        if (t && kiln_dtype_is_float(kiln_tensor_dtype(t)) && !kiln_requires_grad(t, on)) return -1;
    }
    return 0;
}

int kiln_onnx_save_params(const kiln_onnx_model *m, const char *path) {
    if (!m || !path) return kiln__error_set("onnx: save_params: NULL argument");
    const char **names = malloc(((size_t)m->nparams + 1) * sizeof *names);
    kiln_tensor **ts = malloc(((size_t)m->nparams + 1) * sizeof *ts);
    int n = 0, rc;
    if (!names || !ts) { free(names); free(ts); return kiln__error_set("onnx: out of memory"); }
    for (int i = 0; i < m->nparams; i++) {
        kiln_tensor *t = m->consts[m->param_vals[i]];
        if (!t || !kiln_dtype_is_float(kiln_tensor_dtype(t)) || !*m->vnames[m->param_vals[i]]) continue;
        names[n] = m->vnames[m->param_vals[i]];
        ts[n++] = t;
    }
    rc = kiln_safetensors_save(path, n, names, ts, 0, NULL, NULL);
    free(names);
    free(ts);
    return rc;
}
