/*
 * onnx-host.c — shape arithmetic on the host for models on an asynchronous device.
 *
 * Exporters compute shapes inside the graph: Shape -> Gather -> Unsqueeze -> Concat ->
 * Reshape, Slice bounds from Shape, and the like. On a GPU each of those small integer
 * tensors would live in device memory, and every operator reading one as an argument
 * (Reshape's shape, Slice's starts) would download it: a wait for everything queued before
 * it, dozens of times per run (a BERT encoder: 144 Reshapes, 36 Slices), and no CUDA graph
 * could be captured across it. So when the model's device does not keep its buffers in host
 * memory, the plan marks such nodes "host": Shape and Size, and the operators of a small list
 * of shape-arithmetic ops whose inputs are all host values or small constants. They run on a
 * cpu device the model opens for them; the constants they read get cpu copies, made once. A
 * device node receives a host value as it is at the inputs it reads as integer arguments
 * (the table below), where it also reads small constants' cpu copies, and an upload of a host
 * value at any other input, so every operator still sees operands of one device.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "error-impl.h"
#include "onnx-model-impl.h"
#include "tensor-impl.h"

/* Constants up to this many elements count as shape arithmetic's operands. */
#define HOST_CONST_MAX 64

/* Operators that may run on the host when every input is a host value or a small constant:
 * the ones exporters use for shape arithmetic. Range and Expand may make tensors a little
 * larger than a shape (positions, masks); their device readers get an upload. */
static const char *const host_ops[] = {
    "Gather",     "Unsqueeze", "Squeeze", "Concat", "Slice",    "Cast",    "Add", "Sub",  "Mul",
    "Div",        "Equal",     "Where",   "Range",  "Identity", "Reshape", "Not", "Less", "Greater",
    "Min",        "Max",       "Neg",     "Abs",    "Floor",    "Ceil",    "Mod", "And",  "Or",
    "ReduceProd", "Sqrt",      "Expand",  "Tile",   "Flatten",  NULL};

/* Where a device operator reads an input only as integer or scalar arguments (through
 * kiln__onnx_read_ints or read_scalar): a host value stays on the host there. */
typedef struct int_args {
    const char *op;
    unsigned inputs; /* bit i: input i */
} int_args;

static const int_args int_arg_inputs[] = {
    {"Reshape", 1u << 1},
    {"Expand", 1u << 1},
    {"Tile", 1u << 1},
    {"Unsqueeze", 1u << 1},
    {"Squeeze", 1u << 1},
    {"Split", 1u << 1},
    {"Slice", (1u << 1) | (1u << 2) | (1u << 3) | (1u << 4)},
    {"Pad", (1u << 1) | (1u << 2) | (1u << 3)},
    {"ConstantOfShape", 1u << 0},
    {"Range", (1u << 0) | (1u << 1) | (1u << 2)},
    {"TopK", 1u << 1},
    {"CumSum", 1u << 1},
    {"ReduceMean", 1u << 1},
    {"ReduceSum", 1u << 1},
    {"ReduceMax", 1u << 1},
    {"ReduceMin", 1u << 1},
    {"ReduceProd", 1u << 1},
    {"Clip", (1u << 1) | (1u << 2)},
    {"If", 1u << 0},                 /* a host condition is read where it is: no download, no wait */
    {"Loop", (1u << 0) | (1u << 1)}, /* its trip count and condition, likewise */
    {NULL, 0},
};

static bool listed(const char *op)
{
    for (int i = 0; host_ops[i]; i++)
        if (!strcmp(host_ops[i], op))
            return true;
    return false;
}

bool kiln__onnx_reads_int_arg(const kiln__onnx_mnode *n, int input)
{
    for (int i = 0; int_arg_inputs[i].op; i++)
        if (!strcmp(int_arg_inputs[i].op, n->info.op_type))
            return input < 32 && ((int_arg_inputs[i].inputs >> input) & 1u);
    return false;
}

static bool small_const(const kiln_onnx_model *m, const bool *param, int v)
{
    return m->consts[v] && !param[v] && kiln_tensor_numel(m->consts[v]) <= HOST_CONST_MAX;
}

int kiln__onnx_plan_host(kiln_onnx_model *m)
{
    if (m->dev->caps.host_memory)
        return 0; /* a cpu-memory device reads its integers in place */
    bool *host = calloc((size_t)m->nvalues + 1, sizeof *host);
    bool *param = calloc((size_t)m->nvalues + 1, sizeof *param);
    if (!host || !param) {
        free(host);
        free(param);
        return kiln__error_set("onnx: out of memory");
    }
    /* a trainable constant stays on the device: gradients must reach it */
    for (int i = 0; i < m->nparams; i++)
        param[m->param_vals[i]] = true;
    int nhost = 0;
    for (int k = 0; k < m->nnodes; k++) {
        kiln__onnx_mnode *n = &m->nodes[k];
        if (n->dead || n->derived)
            continue;
        bool shape_op = !strcmp(n->info.op_type, "Shape") || !strcmp(n->info.op_type, "Size");
        bool any_host = false, all_host = n->nin > 0;
        for (int j = 0; j < n->nin; j++) {
            int v = n->in[j];
            if (v < 0)
                continue;
            if (host[v])
                any_host = true;
            else if (!small_const(m, param, v))
                all_host = false;
        }
        n->host = shape_op || (any_host && all_host && listed(n->info.op_type));
        if (!n->host)
            continue;
        nhost++;
        for (int j = 0; j < n->nout; j++)
            if (n->out[j] >= 0)
                host[n->out[j]] = true;
    }
    /* device nodes reading integer arguments from small constants read cpu copies */
    for (int k = 0; k < m->nnodes; k++) {
        const kiln__onnx_mnode *n = &m->nodes[k];
        for (int j = 0; !n->dead && !n->host && j < n->nin; j++)
            if (n->in[j] >= 0 && small_const(m, param, n->in[j]) && kiln__onnx_reads_int_arg(n, j))
                nhost++;
    }
    free(param);
    if (nhost == 0) {
        free(host);
        return 0;
    }
    m->host_dev = kiln_device_open("cpu?threads=1");
    m->host_consts = calloc((size_t)m->nvalues + 1, sizeof *m->host_consts);
    m->host_const_ver = calloc((size_t)m->nvalues + 1, sizeof *m->host_const_ver);
    if (!m->host_dev || !m->host_consts || !m->host_const_ver) {
        free(host);
        return kiln__error_restate("onnx: cannot open the cpu device for shape arithmetic: %s", kiln_error());
    }
    m->host_vals = host;
    for (int k = 0; k < m->nnodes; k++) {
        kiln__onnx_mnode *n = &m->nodes[k];
        if (n->dead)
            continue;
        if (n->host) {
            n->info.dev = m->host_dev;
            n->inplace = KILN__ONNX_IP_NONE;
            continue;
        }
        /* a device node with a host input: operands are swapped per call, never in place */
        for (int j = 0; j < n->nin; j++)
            if (n->in[j] >= 0 && host[n->in[j]])
                n->inplace = KILN__ONNX_IP_NONE;
    }
    return 0;
}

bool kiln__onnx_reads_host_const(const kiln_onnx_model *m, const kiln__onnx_mnode *n, int input)
{
    int v = n->in[input];
    return m->host_dev && v >= 0 && m->consts[v] &&
           (n->host || (kiln_tensor_numel(m->consts[v]) <= HOST_CONST_MAX && kiln__onnx_reads_int_arg(n, input)));
}

kiln_tensor *kiln__onnx_host_const(kiln_onnx_model *m, int v)
{
    unsigned ver = atomic_load(&m->consts[v]->storage->version);
    if (m->host_consts[v] && m->host_const_ver[v] != ver) { /* the constant was written since */
        kiln_tensor_release(m->host_consts[v]);
        m->host_consts[v] = NULL;
    }
    if (!m->host_consts[v]) {
        kiln_tensor *c = kiln_to_device(m->consts[v], m->host_dev);
        if (!c)
            return NULL;
        /* made inside a run's scope, kept by the model until it is freed */
        kiln_keep(c);
        m->host_consts[v] = c;
        m->host_const_ver[v] = ver;
    }
    return m->host_consts[v];
}

void kiln__onnx_host_free(kiln_onnx_model *m)
{
    for (int v = 0; m->host_consts && v < m->nvalues; v++)
        kiln_tensor_release(m->host_consts[v]);
    free(m->host_consts);
    free(m->host_const_ver);
    free(m->host_vals);
    if (m->host_dev)
        kiln_device_close(m->host_dev);
    m->host_consts = NULL;
    m->host_const_ver = NULL;
    m->host_vals = NULL;
    m->host_dev = NULL;
}
