/*
 * onnx-cse.c — common subexpressions of a planned model, computed once.
 *
 * Exporters repeat themselves. torch's exporter writes every layer's shape arithmetic again
 * (Shape, Gather, Unsqueeze, Concat over the same tensors, each Unsqueeze with an axes
 * initializer of its own), and each attention layer turns the same padding mask into an
 * additive one again: the 2-layer test encoder has 429 nodes, 145 of them a repeat of an
 * earlier node on the same inputs. Each repeat is a launch per run on a GPU and an op on
 * the cpu, where the shape arithmetic runs as real ops.
 *
 * Two passes, after constant folding:
 *   1. small constants (at most SMALL_NUMEL elements) with equal dtype, shape and bytes
 *      become one value: the folded Constant nodes, and integer initializers (axes,
 *      shapes), which no optimizer can train. Float initializers are parameters, which a
 *      caller may train or replace one by one (kiln_onnx_param), so they keep their identity
 *      even when equal (two LayerNorm weights that start as ones);
 *   2. in topological order, a live node with the same op type, attributes and inputs
 *      (after step 1 and earlier merges) as an earlier live node is dropped, and its
 *      readers read the earlier node's outputs instead.
 * Not merged: random ops (two draws must differ), nodes without inputs other than
 * constants already folded, and nodes writing a graph output (the output keeps its own
 * value). Results are unchanged bit for bit: the merged nodes would have computed the same
 * values from the same inputs.
 *
 * Beside it, the same reading of small constants marks Gather and GatherElements nodes whose
 * constant index has no negative value (kiln__onnx_mark_index_nonneg).
 */
#include <stdlib.h>
#include <string.h>

#include "error-impl.h"
#include "onnx-impl.h"
#include "onnx-model-impl.h"

#define SMALL_NUMEL 64

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

typedef struct small_const {
    int v;
    uint64_t hash;
    size_t nbytes;
    unsigned char *bytes; /* dtype, ndim, shape, then the data */
} small_const;

/* The canonical form of constant v (dtype, shape, data) into *out; false when v is not a
 * small constant that may share its identity. */
static bool small_form(const kiln_onnx_model *m, int v, small_const *out)
{
    kiln_tensor *t = m->consts[v];
    if (!t || kiln_tensor_numel(t) > SMALL_NUMEL)
        return false;
    kiln_dtype dt = kiln_tensor_dtype(t);
    bool is_float = dt == KILN_F32 || dt == KILN_F64 || dt == KILN_F16 || dt == KILN_BF16;
    if (v < m->nparams && is_float)
        return false; /* a parameter */
    int nd = kiln_tensor_ndim(t);
    size_t data = (size_t)kiln_tensor_numel(t) * kiln_dtype_size(dt);
    size_t head = sizeof(int) * 2 + (size_t)nd * sizeof(int64_t);
    unsigned char *b = malloc(head + data + 1);
    if (!b)
        return false;
    int hdr[2] = {(int)dt, nd};
    memcpy(b, hdr, sizeof hdr);
    memcpy(b + sizeof hdr, kiln_tensor_shape(t), (size_t)nd * sizeof(int64_t));
    if (data && kiln_to_data(t, b + head, data) != 0) {
        free(b);
        return false;
    }
    out->v = v;
    out->nbytes = head + data;
    out->bytes = b;
    out->hash = fnv(0xcbf29ce484222325ull, b, out->nbytes);
    return true;
}

static bool attrs_equal(const kiln__onnx_attr *a, const kiln__onnx_attr *b)
{
    if (strcmp(a->name, b->name) || a->type != b->type || a->i != b->i || a->slen != b->slen ||
        a->nfloats != b->nfloats || a->nints != b->nints || a->nstrings != b->nstrings)
        return false;
    /* compared as bits: a NaN attribute equals itself, -0 does not equal +0 */
    if (memcmp(&a->f, &b->f, sizeof a->f))
        return false;
    if (a->slen && memcmp(a->s, b->s, a->slen))
        return false;
    if (a->nfloats && memcmp(a->floats, b->floats, (size_t)a->nfloats * sizeof *a->floats))
        return false;
    if (a->nints && memcmp(a->ints, b->ints, (size_t)a->nints * sizeof *a->ints))
        return false;
    for (int i = 0; i < a->nstrings; i++)
        if (strcmp(a->strings[i], b->strings[i]))
            return false;
    return a->t == b->t && a->g == b->g; /* a tensor or graph attribute: only the same one */
}

static bool nodes_equal(const kiln__onnx_mnode *a, const kiln__onnx_mnode *b)
{
    if (strcmp(a->info.op_type, b->info.op_type) || a->info.opset != b->info.opset || a->nin != b->nin ||
        a->nout != b->nout || a->info.nattrs != b->info.nattrs)
        return false;
    for (int j = 0; j < a->nin; j++)
        if (a->in[j] != b->in[j])
            return false;
    for (int j = 0; j < a->nout; j++)
        if ((a->out[j] < 0) != (b->out[j] < 0))
            return false;
    for (int i = 0; i < a->info.nattrs; i++)
        if (!attrs_equal(&a->info.attrs[i], &b->info.attrs[i]))
            return false;
    return true;
}

static uint64_t node_hash(const kiln__onnx_mnode *n)
{
    uint64_t h = fnv(0xcbf29ce484222325ull, n->info.op_type, strlen(n->info.op_type));
    h = fnv(h, n->in, (size_t)n->nin * sizeof *n->in);
    for (int i = 0; i < n->info.nattrs; i++) {
        const kiln__onnx_attr *a = &n->info.attrs[i];
        h = fnv(h, &a->i, sizeof a->i);
        if (a->nints)
            h = fnv(h, a->ints, (size_t)a->nints * sizeof *a->ints);
    }
    return h;
}

static bool mergeable(const kiln__onnx_mnode *n, const bool *is_output)
{
    const char *op = n->info.op_type;
    if (n->dead || n->nin == 0 || !strncmp(op, "Random", 6) || !strcmp(op, "Dropout") ||
        !strcmp(op, "Bernoulli") || !strcmp(op, "Multinomial"))
        return false;
    for (int j = 0; j < n->nout; j++)
        if (n->out[j] >= 0 && is_output[n->out[j]])
            return false;
    return true;
}

void kiln__onnx_mark_index_nonneg(kiln_onnx_model *m)
{
    for (int k = 0; k < m->nnodes; k++) {
        kiln__onnx_mnode *n = &m->nodes[k];
        const char *op = n->info.op_type;
        if (n->dead || n->nin < 2 || n->in[1] < 0 || (strcmp(op, "Gather") && strcmp(op, "GatherElements")))
            continue;
        kiln_tensor *idx = m->consts[n->in[1]];
        int64_t numel = idx ? kiln_tensor_numel(idx) : 0;
        if (!idx || numel > 4096 || numel == 0)
            continue;
        kiln_tensor *i64 = kiln_cast(idx, KILN_I64);
        int64_t *v = malloc((size_t)numel * sizeof *v);
        bool nonneg = i64 && v && kiln_to_data(i64, v, (size_t)numel * sizeof *v) == 0;
        for (int64_t i = 0; nonneg && i < numel; i++)
            nonneg = v[i] >= 0;
        if (nonneg && numel == 1 && kiln_tensor_ndim(idx) == 0 && !strcmp(op, "Gather")) {
            n->info.has_index_scalar = true;
            n->info.index_scalar = v[0];
        }
        free(v);
        kiln_tensor_release(i64);
        kiln_error_clear(); /* a failed read only leaves the node as it was */
        n->info.index_nonneg = nonneg;
    }
}

int kiln__onnx_cse(kiln_onnx_model *m, int *merged_out)
{
    int rc = -1, merged = 0, nsmall = 0;
    size_t cap = 16;
    while (cap < 2 * (size_t)m->nnodes + 2)
        cap *= 2;
    int *alias = malloc(((size_t)m->nvalues + 1) * sizeof *alias);
    bool *is_output = calloc((size_t)m->nvalues + 1, sizeof *is_output);
    small_const *smalls = calloc((size_t)m->nvalues + 1, sizeof *smalls);
    int *table = malloc(cap * sizeof *table);
    uint64_t *hashes = malloc(((size_t)m->nnodes + 1) * sizeof *hashes);
    if (!alias || !is_output || !smalls || !table || !hashes) {
        kiln__error_set("onnx: out of memory");
        goto out;
    }
    for (int v = 0; v < m->nvalues; v++)
        alias[v] = v;
    for (int i = 0; i < m->noutputs; i++)
        is_output[m->output_vals[i]] = true;

    /* 1. equal small constants: one value (a linear search per hash match is fine: a model
     *    has a few hundred of them) */
    for (int v = 0; v < m->nvalues; v++) {
        small_const s;
        if (!small_form(m, v, &s))
            continue;
        int same = -1;
        for (int i = 0; i < nsmall && same < 0; i++)
            if (smalls[i].hash == s.hash && smalls[i].nbytes == s.nbytes &&
                !memcmp(smalls[i].bytes, s.bytes, s.nbytes))
                same = smalls[i].v;
        if (same >= 0) {
            alias[v] = same;
            free(s.bytes);
        } else {
            smalls[nsmall++] = s;
        }
    }

    /* 2. equal nodes, in topological order */
    for (size_t i = 0; i < cap; i++)
        table[i] = -1;
    for (int k = 0; k < m->nnodes; k++) {
        kiln__onnx_mnode *n = &m->nodes[k];
        if (n->dead)
            continue;
        for (int j = 0; j < n->nin; j++)
            if (n->in[j] >= 0)
                n->in[j] = alias[n->in[j]];
        if (!mergeable(n, is_output))
            continue;
        uint64_t h = node_hash(n);
        hashes[k] = h;
        size_t slot = (size_t)h & (cap - 1);
        int earlier = -1;
        while (table[slot] >= 0) {
            int e = table[slot];
            if (hashes[e] == h && nodes_equal(&m->nodes[e], n)) {
                earlier = e;
                break;
            }
            slot = (slot + 1) & (cap - 1);
        }
        if (earlier < 0) {
            table[slot] = k;
            continue;
        }
        const kiln__onnx_mnode *e = &m->nodes[earlier];
        for (int j = 0; j < n->nout; j++)
            if (n->out[j] >= 0)
                alias[n->out[j]] = e->out[j];
        n->dead = true;
        merged++;
    }
    if (merged_out)
        *merged_out = merged;
    rc = 0;
out:
    for (int i = 0; i < nsmall; i++)
        free(smalls[i].bytes);
    free(smalls);
    free(alias);
    free(is_output);
    free(table);
    free(hashes);
    return rc;
}
