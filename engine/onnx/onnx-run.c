/*
 * onnx-run.c — running a planned model (onnx-model-impl.h): kiln_onnx_run and the shape
 * inference built on it, the cache of weight-derived values, and the profile.
 *
 * Run: walk the plan; each node runs inside its own scope so the temporaries an operator
 * makes go back at once, and each intermediate is released right after its last reader,
 * so memory stays bounded by the widest cut of the graph rather than its length.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error-impl.h"
#include "kiln/autodiff.h"
#include "onnx-model-impl.h"
#include "tensor-impl.h"

/* ---------------------------------------------------------------- profile */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void kiln__onnx_print_profile(const kiln_onnx_model *m)
{
    double total = 0;
    for (int k = 0; k < m->nnodes; k++)
        total += m->prof_ms[k];
    fprintf(stderr, "onnx profile: %d runs, %.3f ms a run in nodes\n", m->prof_runs,
            m->prof_runs ? total / m->prof_runs : 0.0);
    bool *done = calloc((size_t)m->nnodes + 1, sizeof *done);
    for (int k = 0; done && k < m->nnodes; k++) {
        if (done[k] || m->nodes[k].dead)
            continue;
        double t = 0;
        int cnt = 0;
        for (int j = k; j < m->nnodes; j++)
            if (!done[j] && !m->nodes[j].dead && !strcmp(m->nodes[j].label, m->nodes[k].label)) {
                done[j] = true;
                t += m->prof_ms[j];
                cnt++;
            }
        fprintf(stderr, "onnx profile: %-22s %4d nodes %9.3f ms a run %5.1f%%\n", m->nodes[k].label, cnt,
                m->prof_runs ? t / m->prof_runs : 0.0, total > 0 ? 100.0 * t / total : 0.0);
    }
    free(done);
    if (!m->prof_nodes)
        return;
    /* KILN_ONNX_PROFILE=nodes: every node too, in run order */
    for (int k = 0; k < m->nnodes; k++)
        if (!m->nodes[k].dead)
            fprintf(stderr, "onnx profile: node %-40s %-22s %9.3f ms a run\n", m->nodes[k].info.name,
                    m->nodes[k].label, m->prof_runs ? m->prof_ms[k] / m->prof_runs : 0.0);
}

int kiln__onnx_node_fail(const kiln__onnx_mnode *n, const char *what)
{
    char msg[KILN_ERROR_MAX];
    snprintf(msg, sizeof msg, "%s", kiln_error());
    return kiln__error_restate("onnx: node '%s' (%s) %s: %s", n->info.name, n->info.op_type, what, msg);
}

/* Run node k on the values in vals; outputs go to vals (new references). */
int kiln__onnx_run_node(kiln_onnx_model *m, const kiln__onnx_mnode *n, kiln_tensor **vals)
{
    /* only an If reads more than 64 inputs (what its branches read) */
    kiln_tensor *in_s[64], **in = n->nin <= 64 ? in_s : malloc((size_t)n->nin * sizeof *in), *out[16] = {0};
    int nin = n->nin, nout = n->nout < 16 ? n->nout : 16;
    if (!in)
        return kiln__error_set("onnx: out of memory");
    for (int i = 0; i < nin; i++)
        in[i] = n->in[i] >= 0 ? vals[n->in[i]] : NULL;
    kiln_scope_begin();
    int rc = n->fn(&n->info, n->nin_op < nin ? n->nin_op : nin, in, nout, out);
    if (in != in_s)
        free(in);
    for (int i = 0; i < nout; i++) {
        if (rc == 0 && n->out[i] >= 0 && !out[i] && i == 0)
            rc = -1;
        /* an operator may leave an output nothing reads; one that is read is an error here,
         * naming the node, rather than an absent input to its reader or a nameless
         * "not computed" at the end (last_use is not planned yet while constants fold) */
        if (rc == 0 && n->out[i] >= 0 && !out[i] && m->last_use && m->last_use[n->out[i]] >= 0) {
            kiln__error_set("output %d ('%s') was not produced", i, m->vnames[n->out[i]]);
            rc = -1;
        }
        if (out[i])
            kiln_tensor_retain(out[i]); /* operators return scoped or borrowed refs */
    }
    kiln_scope_end();
    if (rc != 0) {
        for (int i = 0; i < nout; i++)
            kiln_tensor_release(out[i]);
        return kiln__onnx_node_fail(n, "failed");
    }
    for (int i = 0; i < nout; i++) {
        if (n->out[i] >= 0 && !vals[n->out[i]])
            vals[n->out[i]] = out[i];
        else
            kiln_tensor_release(out[i]);
    }
    return 0;
}

/* ------------------------------------------------- weight-derived values */

/* The cache holds while every constant a derived node reads (those refresh_derived recorded a
 * storage for) has the storage and version it had when the cache was made. */
static bool derived_fresh(const kiln_onnx_model *m)
{
    if (!m->derived_fresh)
        return false;
    for (int v = 0; v < m->nvalues; v++) {
        const kiln_tensor *t = m->consts[v];
        if (m->derived_src[v] && (m->derived_src[v] != (const void *)t->storage ||
                                  m->derived_ver[v] != atomic_load(&t->storage->version)))
            return false;
    }
    return true;
}

void kiln__onnx_derived_drop(kiln_onnx_model *m)
{
    for (int v = 0; m->derived_vals && v < m->nvalues; v++)
        if (!m->consts[v]) {
            kiln_tensor_release(m->derived_vals[v]);
            m->derived_vals[v] = NULL;
        }
    m->derived_fresh = false;
}

/* Runs every derived node once, without grad and outside any activation arena, keeping the
 * outputs some ordinary node (or the graph) reads; the intermediates go. */
static int refresh_derived(kiln_onnx_model *m)
{
    kiln__onnx_derived_drop(m);
    kiln_tensor **vals = m->derived_vals;
    for (int v = 0; v < m->nvalues; v++)
        vals[v] = m->consts[v];
    kiln_no_grad_begin();
    int rc = 0;
    for (int k = 0; rc == 0 && k < m->nnodes; k++) {
        const kiln__onnx_mnode *n = &m->nodes[k];
        if (n->dead || !n->derived)
            continue;
        rc = kiln__onnx_run_node(m, n, vals);
        for (int i = 0; rc == 0 && i < n->nin; i++) {
            int v = n->in[i];
            if (v >= 0 && m->consts[v]) {
                m->derived_src[v] = m->consts[v]->storage;
                m->derived_ver[v] = atomic_load(&m->consts[v]->storage->version);
            }
        }
    }
    kiln_no_grad_end();
    if (rc) {
        kiln__onnx_derived_drop(m);
        return -1;
    }
    /* a derived value no ordinary node and no graph output reads is an intermediate */
    bool *needed = calloc((size_t)m->nvalues + 1, sizeof *needed);
    if (!needed) {
        kiln__onnx_derived_drop(m);
        return kiln__error_set("onnx: out of memory");
    }
    for (int k = 0; k < m->nnodes; k++)
        for (int i = 0; !m->nodes[k].dead && !m->nodes[k].derived && i < m->nodes[k].nin; i++)
            if (m->nodes[k].in[i] >= 0)
                needed[m->nodes[k].in[i]] = true;
    for (int i = 0; i < m->noutputs; i++)
        needed[m->output_vals[i]] = true;
    for (int v = 0; v < m->nvalues; v++)
        if (!m->consts[v] && vals[v] && !needed[v]) {
            kiln_tensor_release(vals[v]);
            vals[v] = NULL;
        }
    free(needed);
    m->derived_fresh = true;
    return 0;
}

/* --------------------------------------------------------------- running */

int kiln__onnx_bind_inputs(kiln_onnx_model *m, kiln_tensor *const *given, kiln_tensor **vals)
{
    for (int i = 0; i < m->ninputs; i++) {
        kiln_tensor *t = given[i];
        vals[m->input_vals[i]] = kiln_tensor_device(t) == m->dev ? kiln_tensor_retain(t)
                                                                 : kiln_to_device(t, m->dev);
        if (kiln_tensor_device(t) != m->dev && vals[m->input_vals[i]])
            kiln_keep(vals[m->input_vals[i]]);
        if (!vals[m->input_vals[i]])
            return -1;
    }
    return 0;
}

/* Sets the host values a device node saw as uploads back in vals and drops the uploads. */
static void put_back_host_values(kiln_tensor **vals, const int *held_v, kiln_tensor *const *held,
                                 kiln_tensor *const *upload, int n)
{
    for (int i = 0; i < n; i++) {
        vals[held_v[i]] = held[i];
        kiln_tensor_release(upload[i]);
    }
}

/* A node's per-call arrays in kiln__onnx_run_plan: on the stack for nodes of at most 64
 * inputs, on the heap for a model with a wider node (an If, which reads everything its
 * branches read). */
typedef struct node_scratch {
    kiln_tensor **cin, **held, **upload, **in;
    int *held_v;
    bool *dies;
} node_scratch;

static int run_nodes(kiln_onnx_model *m, kiln_tensor **vals, kiln_tensor *const *consts, bool use_derived,
                     const node_scratch *sc)
{
    kiln_tensor **cin = sc->cin, **held = sc->held, **upload = sc->upload;
    int *held_v = sc->held_v;
    for (int k = 0; k < m->nnodes; k++) {
        const kiln__onnx_mnode *n = &m->nodes[k];
        if (n->dead || (use_derived && n->derived))
            continue;
        /* on a device that queues work the profile waits around each node, so a node's time
         * is its own device work and not the queue's it happens to wait for */
        bool prof_sync = m->prof_ms && m->dev->caps.async;
        if (prof_sync && kiln_device_sync(m->dev) < 0)
            return -1;
        /* constants are borrowed into the value array for the call only (a host node's as
         * their cpu copies) */
        for (int j = 0; j < n->nin; j++) {
            int v = n->in[j];
            cin[j] = v >= 0 && consts[v] ? consts[v] : NULL;
            if (cin[j] && cin[j] == m->consts[v] && kiln__onnx_reads_host_const(m, n, j) &&
                !(cin[j] = kiln__onnx_host_const(m, v))) {
                for (int i = 0; i < j; i++) /* give back what was borrowed so far */
                    if (cin[i])
                        vals[n->in[i]] = NULL;
                return -1;
            }
            if (cin[j] && !vals[v])
                vals[v] = cin[j];
            else
                cin[j] = NULL;
        }
        /* a host value read as data by a device node: an upload, swapped in for the call */
        int nup = 0;
        if (m->host_vals && !n->host) {
            for (int j = 0; j < n->nin; j++) {
                int v = n->in[j];
                if (v < 0 || !m->host_vals[v] || !vals[v] || kiln_tensor_device(vals[v]) == m->dev ||
                    kiln__onnx_reads_int_arg(n, j))
                    continue;
                kiln_tensor *u = kiln_to_device(vals[v], m->dev);
                if (!u) {
                    kiln__onnx_node_fail(n, "uploading a shape value");
                    put_back_host_values(vals, held_v, held, upload, nup);
                    for (int i = 0; i < n->nin; i++)
                        if (cin[i])
                            vals[n->in[i]] = NULL;
                    return -1;
                }
                kiln_keep(u);
                held_v[nup] = v;
                held[nup] = vals[v];
                upload[nup] = u;
                vals[v] = u;
                nup++;
            }
        }
        double t0 = m->prof_ms ? now_ms() : 0;
        int r = 0, used = -1;
        if (n->inplace && n->out[0] >= 0 && !vals[n->out[0]]) {
            /* an input read by no later node may take the result (onnx-inplace.c) */
            kiln_tensor **in = sc->in;
            bool *dies = sc->dies;
            for (int j = 0; j < n->nin; j++) {
                int v = n->in[j];
                in[j] = v >= 0 ? vals[v] : NULL;
                dies[j] = v >= 0 && m->last_use[v] == k && !consts[v] && vals[v];
                for (int i = 0; i < j; i++)
                    if (n->in[i] == v)
                        dies[i] = dies[j] = false;
            }
            r = kiln__onnx_inplace(&n->info, n->inplace, n->nin, in, dies, &used);
            if (r < 0)
                r = kiln__onnx_node_fail(n, "failed");
            else if (r == 1) {
                vals[n->out[0]] = vals[n->in[used]];
                vals[n->in[used]] = NULL;
                r = 0;
            }
        }
        if (used < 0 && r == 0)
            r = kiln__onnx_run_node(m, n, vals);
        put_back_host_values(vals, held_v, held, upload, nup);
        if (prof_sync && r == 0 && kiln_device_sync(m->dev) < 0)
            r = kiln__onnx_node_fail(n, "failed on the device");
        if (m->prof_ms)
            m->prof_ms[k] += now_ms() - t0;
        for (int j = 0; j < n->nin; j++)
            if (cin[j])
                vals[n->in[j]] = NULL;
        if (r)
            return -1;
        for (int j = 0; j < n->nin; j++) {
            int v = n->in[j];
            if (v >= 0 && m->last_use[v] == k && !consts[v]) {
                kiln_tensor_release(vals[v]);
                vals[v] = NULL;
            }
        }
    }
    return 0;
}

int kiln__onnx_run_plan(kiln_onnx_model *m, kiln_tensor **vals, kiln_tensor *const *consts, bool use_derived,
                        int noutputs, kiln_tensor **out)
{
    kiln_tensor *ptrs[4][64];
    int held_v[64];
    bool dies[64];
    node_scratch sc = {ptrs[0], ptrs[1], ptrs[2], ptrs[3], held_v, dies};
    void *wide = NULL;
    if (m->max_nin > 64) {
        size_t w = (size_t)m->max_nin;
        wide = malloc(w * (4 * sizeof(kiln_tensor *) + sizeof(int) + sizeof(bool)));
        if (!wide)
            return kiln__error_set("onnx: out of memory");
        kiln_tensor **p = wide;
        int *iv = (int *)(void *)(p + 4 * w); /* after the pointers: aligned for ints */
        sc = (node_scratch){p, p + w, p + 2 * w, p + 3 * w, iv, (bool *)(iv + w)};
    }
    int rc = run_nodes(m, vals, consts, use_derived, &sc);
    free(wide);
    if (rc)
        return -1;
    for (int i = 0; i < noutputs; i++) {
        int v = m->output_vals[i];
        kiln_tensor *t = vals[v] ? vals[v] : consts[v];
        if (!t) {
            /* the node that should have made it, found only on this error path */
            for (int k = 0; k < m->nnodes; k++)
                for (int j = 0; j < m->nodes[k].nout; j++)
                    if (m->nodes[k].out[j] == v)
                        return kiln__error_set("onnx: output '%s' was not computed (output %d of node '%s' (%s))",
                                               m->vnames[v], j, m->nodes[k].info.name, m->nodes[k].info.op_type);
            kiln__error_set("onnx: output '%s' was not computed", m->vnames[v]);
            return -1;
        }
        /* a graph output computed on the host goes back to the model's device */
        out[i] = kiln_tensor_device(t) == m->dev ? kiln_tensor_retain(t) : kiln_to_device(t, m->dev);
        if (!out[i])
            return -1;
        if (kiln_tensor_device(t) != m->dev)
            kiln_keep(out[i]);
    }
    m->prof_runs++;
    return 0;
}

int kiln__onnx_run_branch(kiln_onnx_model *m, kiln_tensor *const *given, int noutputs, kiln_tensor **out)
{
    for (int i = 0; i < noutputs; i++)
        out[i] = NULL;
    for (int i = 0; i < m->ninputs; i++)
        if (!given[i]) /* an optional output nothing made, read by the branch */
            return kiln__error_set("onnx: '%s' was not computed", m->vnames[m->input_vals[i]]);
    kiln_tensor **vals = calloc((size_t)m->nvalues + 1, sizeof *vals);
    if (!vals)
        return kiln__error_set("onnx: out of memory");
    /* the enclosing run's values are bound as the branch's inputs: it holds a reference of its
     * own, so none of them is ever the only one the in-place path needs to overwrite it */
    int rc = kiln__onnx_bind_inputs(m, given, vals);
    if (rc == 0)
        rc = kiln__onnx_run_plan(m, vals, m->consts, false, noutputs, out);
    for (int v = 0; v < m->nvalues; v++)
        if (!m->consts[v])
            kiln_tensor_release(vals[v]);
    free(vals);
    if (rc)
        for (int i = 0; i < noutputs; i++) {
            kiln_tensor_release(out[i]);
            out[i] = NULL;
        }
    return rc;
}

/* The declared shape of a graph input against what the caller gives: the rank and every fixed
 * dim must match (a symbolic or unknown dim, -1, takes any size; an input declared without a
 * shape takes any). Checked before anything runs: a model exported at batch 1 and fed batch 3
 * would otherwise run to a wrong result, or fail deep inside with some Reshape's error. The
 * wording is kilnd's (api/infer.c), so both say the same of the same input. */
static int check_shape(const char *name, const kiln__onnx_pvalue *pv, const kiln_tensor *t)
{
    if (pv->ndim < 0)
        return 0;
    int nd = kiln_tensor_ndim(t);
    if (nd != pv->ndim)
        return kiln__error_set("onnx: run: input '%s' has %d dims; the model expects %d", name, nd, pv->ndim);
    for (int d = 0; d < nd; d++)
        if (pv->dims[d] >= 0 && kiln_tensor_dim(t, d) != pv->dims[d])
            return kiln__error_set("onnx: run: input '%s': dim %d is %lld; the model expects %lld", name, d,
                                   (long long)kiln_tensor_dim(t, d), (long long)pv->dims[d]);
    return 0;
}

int kiln_onnx_run(kiln_onnx_model *m, int ninputs, const char *const *input_names, kiln_tensor *const *inputs,
                  int noutputs, kiln_tensor **out)
{
    if (!m || (ninputs && (!input_names || !inputs)) || (noutputs && !out))
        return kiln__error_set("onnx: run: NULL argument");
    if (noutputs > m->noutputs)
        return kiln__error_set("onnx: run: %d outputs asked, the graph has %d", noutputs, m->noutputs);
    for (int i = 0; i < noutputs; i++)
        out[i] = NULL;
    kiln_tensor **vals = calloc((size_t)m->nvalues + 1, sizeof *vals);
    kiln_tensor **given = calloc((size_t)m->ninputs + 1, sizeof *given);
    kiln__onnx_arena_run *arena = NULL;
    int rc = -1;
    if (!vals || !given) {
        kiln__error_set("onnx: out of memory");
        goto out;
    }
    /* a name the graph does not take (a misspelt 'z' for 'x') is refused by name: left to the
     * check below, it read as "input 'x' not given", or passed unseen beside the right ones */
    for (int j = 0; j < ninputs; j++) {
        bool known = false;
        for (int i = 0; input_names[j] && i < m->ninputs && !known; i++)
            known = strcmp(input_names[j], m->vnames[m->input_vals[i]]) == 0;
        if (!known) {
            char list[256] = "";
            for (int i = 0; i < m->ninputs; i++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                         m->vnames[m->input_vals[i]]);
            if (input_names[j])
                kiln__error_set("onnx: run: '%.64s' is not an input of the model (its inputs: %s)", input_names[j],
                                list);
            else
                kiln__error_set("onnx: run: input name %d is NULL (the model's inputs: %s)", j, list);
            goto out;
        }
    }
    for (int i = 0; i < m->ninputs; i++) {
        const char *name = m->vnames[m->input_vals[i]];
        int at = -1;
        for (int j = 0; j < ninputs; j++) {
            if (!input_names[j] || strcmp(input_names[j], name))
                continue;
            if (at >= 0) { /* which of the two was meant is anybody's guess */
                kiln__error_set("onnx: run: input '%s' given twice (at %d and %d)", name, at, j);
                goto out;
            }
            at = j;
        }
        if (at < 0 || !inputs[at]) {
            kiln__error_set(at < 0 ? "onnx: run: input '%s' not given" : "onnx: run: input '%s' is NULL", name);
            goto out;
        }
        given[i] = inputs[at];
        /* the graph's operators were typed for the declared dtype: another one would run
         * to a wrong or differently typed result (ids as f32, an image as i64) */
        int want = m->input_info[i]->elem_type ? kiln__onnx_kdtype(m->input_info[i]->elem_type) : -1;
        if (want >= 0 && kiln_tensor_dtype(given[i]) != (kiln_dtype)want) {
            kiln__error_set("onnx: run: input '%s' is %s; the model declares %s", name,
                            kiln_dtype_name(kiln_tensor_dtype(given[i])), kiln_dtype_name((kiln_dtype)want));
            goto out;
        }
        if (check_shape(name, m->input_info[i], given[i]))
            goto out;
    }
    /* weight-derived values: cached outside grad mode, made before the arena so that no
     * planned block ever holds one */
    bool use_derived = m->nderived && !kiln_grad_enabled();
    if (use_derived && !derived_fresh(m) && refresh_derived(m))
        goto out;
    kiln_tensor *const *consts = use_derived ? m->derived_vals : m->consts;
    if (m->graphs) {
        /* a recorded graph for these shapes serves the run (onnx-graph.c), or it runs
         * here: the first run of a signature, or one whose recording broke */
        int g = kiln__onnx_graph_run(m, given, consts, use_derived, noutputs, out);
        if (g < 0)
            goto out;
        if (g == 1) {
            rc = 0;
            goto out;
        }
    }
    /* from here every allocation on the device is recorded or placed by a plan */
    arena = kiln__onnx_arena_begin(m->arenas, m->dev, m->ninputs, given, noutputs);
    if (kiln__onnx_bind_inputs(m, given, vals) || kiln__onnx_run_plan(m, vals, consts, use_derived, noutputs, out))
        goto out;
    rc = 0;
out:
    for (int v = 0; vals && v < m->nvalues; v++)
        if (!m->consts[v]) /* lent constants and cached values are set back to NULL after each call */
            kiln_tensor_release(vals[v]);
    if (rc)
        for (int i = 0; i < noutputs; i++) {
            kiln_tensor_release(out[i]);
            out[i] = NULL;
        }
    kiln__onnx_arena_end(arena, rc == 0, noutputs, out);
    free(vals);
    free(given);
    return rc;
}

int kiln_onnx_infer_shapes(kiln_onnx_model *m, int64_t sym_value, int noutputs, int *ndims,
                           int64_t (*shapes)[KILN_MAX_DIMS])
{
    if (!m || sym_value < 1 || noutputs > m->noutputs)
        return kiln__error_set("onnx: infer_shapes: bad arguments");
    kiln_tensor **ins = calloc((size_t)m->ninputs + 1, sizeof *ins);
    const char **names = calloc((size_t)m->ninputs + 1, sizeof *names);
    kiln_tensor **outs = calloc((size_t)m->noutputs + 1, sizeof *outs);
    int rc = -1;
    if (!ins || !names || !outs) {
        kiln__error_set("onnx: out of memory");
        goto out;
    }
    for (int i = 0; i < m->ninputs; i++) {
        const kiln__onnx_pvalue *pv = m->input_info[i];
        int64_t shape[KILN_MAX_DIMS];
        int nd = pv->ndim < 0 ? 0 : pv->ndim;
        for (int d = 0; d < nd; d++)
            shape[d] = pv->dims[d] < 0 ? sym_value : pv->dims[d];
        int kdt = kiln__onnx_kdtype(pv->elem_type ? pv->elem_type : KILN__ONNX_FLOAT);
        names[i] = pv->name;
        ins[i] = kiln_zeros(m->dev, kdt < 0 ? KILN_F32 : (kiln_dtype)kdt, nd, shape);
        if (ins[i] && kiln_tensor_numel(ins[i]) >= 0)
            kiln_keep(ins[i]);
        if (!ins[i])
            goto out;
    }
    kiln_no_grad_begin();
    rc = kiln_onnx_run(m, m->ninputs, names, ins, m->noutputs, outs);
    kiln_no_grad_end();
    for (int i = 0; rc == 0 && i < noutputs; i++) {
        ndims[i] = kiln_tensor_ndim(outs[i]);
        memcpy(shapes[i], kiln_tensor_shape(outs[i]), (size_t)ndims[i] * sizeof(int64_t));
    }
out:
    for (int i = 0; ins && i < m->ninputs; i++)
        kiln_tensor_release(ins[i]);
    for (int i = 0; outs && i < m->noutputs; i++)
        kiln_tensor_release(outs[i]);
    free(ins);
    free(names);
    free(outs);
    return rc;
}
