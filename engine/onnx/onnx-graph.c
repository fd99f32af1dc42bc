/*
 * onnx-graph.c — running a planned model as a recorded graph on a device that records
 * them (backend.h, "graphs"; kiln_onnx_options.graphs).
 *
 * A small model on a GPU spends more time submitting its ops than running them. So, per
 * input signature (the dtypes and shapes of the inputs, the outputs asked for, and the
 * calling thread's queue), without grad:
 *   1st run: op by op, as always (it also makes what a run makes once: the cuBLASLt
 *            and cuDNN choices, workspaces, caches);
 *   2nd run: the inputs are copied into buffers the signature keeps, the plan runs while
 *            the queue records, and the recording becomes a graph, launched at once;
 *   later:   the inputs are copied into those buffers, the graph is launched, and the
 *            outputs (buffers of the graph) are copied into new tensors for the caller.
 * A recording breaks when the plan does something that cannot be replayed (it reads
 * device data on the host, waits, orders queues): the backend refuses the entry, the plan
 * fails, the recording is dropped without having run, and the run goes op by op. Host
 * data the plan uploads (a Shape node's result, a constant made from attributes) is
 * recorded as it was: an ONNX plan's host data depends on the input signature and the
 * attributes only, never on input values, which would take a host read to learn. The signature then stays op by op (no second try), and the stats keep
 * the reason. Nothing of this is ever an error for the caller.
 *
 * What a graph addresses must not move while it lives: the constants and the cached
 * weight-derived values are checked by identity and write version at every launch (an
 * optimizer step or a refreshed cache drops the graph and starts the signature over);
 * intermediates live in the graph's own memory (the backend's allocator keeps them).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error-impl.h"
#include "kiln/autodiff.h"
#include "onnx-model-impl.h"
#include "tensor-impl.h"

#define GRAPH_SLOTS 4

typedef enum {
    SLOT_FREE = 0,
    SLOT_WARM,     /* ran once op by op: the next run records */
    SLOT_RECORDED, /* has a graph */
    SLOT_EAGER,    /* its recording broke: runs op by op */
} slot_state;

typedef struct graph_slot {
    slot_state state;
    uint64_t last_use;
    /* the signature */
    kiln_queue *queue; /* compared only, not dereferenced */
    uint64_t weights;  /* weights_stamp when the slot was made */
    int ninputs, noutputs;
    kiln_dtype *dtype;
    int *ndim;
    int64_t (*shape)[KILN_MAX_DIMS];
    /* SLOT_RECORDED */
    kiln__graph *graph;
    kiln_tensor **inputs;  /* the buffers the graph reads its inputs from */
    kiln_tensor **outputs; /* what the graph writes its outputs to */
} graph_slot;

struct kiln__onnx_graphs {
    bool enabled;
    uint64_t clock;
    graph_slot slot[GRAPH_SLOTS];
    kiln_onnx_graph_stats stats;
};

kiln__onnx_graphs *kiln__onnx_graphs_new(bool enabled)
{
    kiln__onnx_graphs *g = calloc(1, sizeof *g);
    if (!g) {
        kiln__error_set("onnx: out of memory");
        return NULL;
    }
    g->enabled = enabled;
    return g;
}

static void slot_clear(graph_slot *s)
{
    for (int i = 0; s->inputs && i < s->ninputs; i++)
        kiln_tensor_release(s->inputs[i]);
    for (int i = 0; s->outputs && i < s->noutputs; i++)
        kiln_tensor_release(s->outputs[i]);
    kiln__graph_free(s->graph);
    free(s->inputs);
    free(s->outputs);
    free(s->dtype);
    free(s->ndim);
    free(s->shape);
    memset(s, 0, sizeof *s);
}

void kiln__onnx_graphs_drop(kiln__onnx_graphs *g)
{
    for (int i = 0; g && i < GRAPH_SLOTS; i++)
        slot_clear(&g->slot[i]);
}

void kiln__onnx_graphs_free(kiln__onnx_graphs *g)
{
    kiln__onnx_graphs_drop(g);
    free(g);
}

int kiln__onnx_graphs_stats(const kiln__onnx_graphs *g, kiln_onnx_graph_stats *out)
{
    *out = g->stats;
    out->enabled = g->enabled;
    out->graphs = 0;
    for (int i = 0; i < GRAPH_SLOTS; i++)
        out->graphs += g->slot[i].state == SLOT_RECORDED;
    return 0;
}

/* The identity and write version of everything constant a run reads: a graph recorded
 * for one stamp addresses those buffers and assumes their contents. */
static uint64_t weights_stamp(const kiln_onnx_model *m, kiln_tensor *const *consts)
{
    uint64_t h = 1469598103934665603ull;
    for (int v = 0; v < m->nvalues; v++) {
        const kiln_tensor *t = consts[v];
        if (!t)
            continue;
        uint64_t parts[3] = {(uint64_t)(uintptr_t)t, (uint64_t)(uintptr_t)t->storage,
                             atomic_load(&t->storage->version)};
        for (int k = 0; k < 3; k++)
            h = (h ^ parts[k]) * 1099511628211ull;
    }
    return h;
}

static bool slot_matches(const graph_slot *s, kiln_queue *q, int n, kiln_tensor *const *given, int noutputs)
{
    if (s->state == SLOT_FREE || s->queue != q || s->ninputs != n || s->noutputs != noutputs)
        return false;
    for (int i = 0; i < n; i++) {
        const kiln_tensor *t = given[i];
        if (t->dtype != s->dtype[i] || t->ndim != s->ndim[i] ||
            memcmp(t->shape, s->shape[i], (size_t)t->ndim * sizeof(int64_t)))
            return false;
    }
    return true;
}

/* Makes slot s the signature of this run (state WARM); false when out of memory. */
static bool slot_make(graph_slot *s, kiln_queue *q, int n, kiln_tensor *const *given, int noutputs,
                      uint64_t weights)
{
    slot_clear(s);
    s->dtype = calloc((size_t)n + 1, sizeof *s->dtype);
    s->ndim = calloc((size_t)n + 1, sizeof *s->ndim);
    s->shape = calloc((size_t)n + 1, sizeof *s->shape);
    if (!s->dtype || !s->ndim || !s->shape) {
        slot_clear(s);
        return false;
    }
    for (int i = 0; i < n; i++) {
        s->dtype[i] = given[i]->dtype;
        s->ndim[i] = given[i]->ndim;
        memcpy(s->shape[i], given[i]->shape, (size_t)given[i]->ndim * sizeof(int64_t));
    }
    s->queue = q;
    s->ninputs = n;
    s->noutputs = noutputs;
    s->weights = weights;
    s->state = SLOT_WARM;
    return true;
}

/* Copies the caller's input into the buffer the graph reads (a device copy, after an
 * upload when the input lives on another device). */
static int copy_in(kiln_onnx_model *m, kiln_tensor *dst, kiln_tensor *src)
{
    if (kiln_tensor_device(src) == m->dev)
        return kiln__copy_into(dst, src, "onnx graph input") < 0 ? -1 : 0;
    kiln_scope_begin();
    kiln_tensor *t = kiln_to_device(src, m->dev);
    int rc = t ? kiln__copy_into(dst, t, "onnx graph input") : -1;
    kiln_scope_end();
    return rc < 0 ? -1 : 0;
}

/* New references to copies of the graph's outputs (the next launch overwrites them). */
static int copy_out(graph_slot *s, int noutputs, kiln_tensor **out)
{
    kiln_scope_begin();
    int rc = 0;
    for (int i = 0; i < noutputs && rc == 0; i++) {
        kiln_tensor *c = kiln_clone(s->outputs[i]);
        if (c)
            out[i] = kiln_tensor_retain(c);
        else
            rc = -1;
    }
    kiln_scope_end();
    if (rc)
        for (int i = 0; i < noutputs; i++) {
            kiln_tensor_release(out[i]);
            out[i] = NULL;
        }
    return rc;
}

static int launch(kiln_onnx_model *m, graph_slot *s, kiln_tensor *const *given, int noutputs, kiln_tensor **out)
{
    for (int i = 0; i < s->ninputs; i++)
        if (copy_in(m, s->inputs[i], given[i]))
            return -1;
    if (kiln__graph_launch(s->graph) < 0)
        return -1;
    return copy_out(s, noutputs, out);
}

/* The signature's recording; 1 when it made a graph (s RECORDED), 0 when it broke (s
 * EAGER, the reason kept, the error cleared). */
static int record(kiln_onnx_model *m, kiln__onnx_graphs *gs, graph_slot *s, kiln_tensor *const *given,
                  kiln_tensor *const *consts, bool use_derived)
{
    int n = s->ninputs, nout = s->noutputs;
    if (m->reads_cond) {
        /* an If reading its condition waits for the device, which a recording refuses, or,
         * with a condition already on the host, would keep the branch this run took for
         * every launch (a Loop: its number of iterations): refused before anything is
         * recorded */
        snprintf(gs->stats.last_broken, sizeof gs->stats.last_broken,
                 "node '%s' (%s) reads its condition on the host at every run", m->reads_cond->info.name,
                 m->reads_cond->info.op_type);
        gs->stats.broken++;
        s->state = SLOT_EAGER;
        return 0;
    }
    kiln_tensor **vals = calloc((size_t)m->nvalues + 1, sizeof *vals);
    s->inputs = calloc((size_t)n + 1, sizeof *s->inputs);
    s->outputs = calloc((size_t)nout + 1, sizeof *s->outputs);
    bool recording = false;
    int rc = vals && s->inputs && s->outputs ? 0 : kiln__error_set("onnx: out of memory");
    /* the buffers the graph reads its inputs from: made and filled before recording */
    for (int i = 0; rc == 0 && i < n; i++) {
        s->inputs[i] = kiln__alloc(m->dev, s->dtype[i], s->ndim[i], s->shape[i], "onnx graph input");
        rc = s->inputs[i] ? copy_in(m, s->inputs[i], given[i]) : -1;
        if (rc == 0)
            vals[m->input_vals[i]] = kiln_tensor_retain(s->inputs[i]);
    }
    if (rc == 0)
        rc = kiln__graph_capture_begin(m->dev) < 0 ? -1 : 0;
    recording = rc == 0;
    if (rc == 0)
        rc = kiln__onnx_run_plan(m, vals, consts, use_derived, nout, s->outputs);
    /* the intermediates still held go back while recording: into the graph's memory */
    for (int v = 0; vals && v < m->nvalues; v++)
        if (!m->consts[v])
            kiln_tensor_release(vals[v]);
    free(vals);
    kiln__graph *graph = NULL;
    if (recording) {
        char plan_error[KILN_ERROR_MAX] = "";
        int plan_code = kiln_error_code();
        if (rc)
            snprintf(plan_error, sizeof plan_error, "%s", kiln_error());
        graph = kiln__graph_capture_end(m->dev);
        if (rc) /* the plan's failure says more than "the recording broke" */
            kiln__error_set_code(plan_code, "%s", plan_error);
    }
    if (rc == 0 && graph) {
        s->graph = graph;
        s->state = SLOT_RECORDED;
        gs->stats.recorded++;
        return 1;
    }
    kiln__graph_free(graph);
    snprintf(gs->stats.last_broken, sizeof gs->stats.last_broken, "%s", kiln_error());
    gs->stats.broken++;
    kiln_error_clear();
    /* the signature stays (so it is not recorded again), without the buffers */
    for (int i = 0; s->inputs && i < n; i++)
        kiln_tensor_release(s->inputs[i]);
    for (int i = 0; s->outputs && i < nout; i++)
        kiln_tensor_release(s->outputs[i]);
    free(s->inputs);
    free(s->outputs);
    s->inputs = s->outputs = NULL;
    s->state = SLOT_EAGER;
    return 0;
}

int kiln__onnx_graph_run(kiln_onnx_model *m, kiln_tensor *const *given, kiln_tensor *const *consts,
                         bool use_derived, int noutputs, kiln_tensor **out)
{
    kiln__onnx_graphs *gs = m->graphs;
    if (!gs->enabled || kiln_grad_enabled() || m->prof_ms || !kiln__graph_supported(m->dev))
        return 0;
    gs->stats.last_run_graph = false;
    kiln_queue *q = kiln_queue_current(m->dev);
    uint64_t weights = weights_stamp(m, consts);
    graph_slot *s = NULL;
    for (int i = 0; i < GRAPH_SLOTS && !s; i++)
        if (slot_matches(&gs->slot[i], q, m->ninputs, given, noutputs))
            s = &gs->slot[i];
    if (s && s->weights != weights) {
        /* the weights moved or were written: what the graph assumes no longer holds */
        slot_clear(s);
        s = NULL;
    }
    gs->clock++;
    if (!s) {
        /* a new signature: its first run goes op by op, in the least recently used slot */
        graph_slot *lru = &gs->slot[0];
        for (int i = 1; i < GRAPH_SLOTS; i++)
            if (gs->slot[i].last_use < lru->last_use)
                lru = &gs->slot[i];
        if (slot_make(lru, q, m->ninputs, given, noutputs, weights))
            lru->last_use = gs->clock;
        gs->stats.eager++;
        return 0;
    }
    s->last_use = gs->clock;
    if (s->state == SLOT_EAGER) {
        gs->stats.eager++;
        return 0;
    }
    if (s->state == SLOT_WARM && !record(m, gs, s, given, consts, use_derived)) {
        gs->stats.eager++;
        return 0;
    }
    if (launch(m, s, given, noutputs, out) < 0)
        return -1;
    gs->stats.launched++;
    gs->stats.last_run_graph = true;
    return 1;
}
