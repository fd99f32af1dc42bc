/*
 * engine/grad-shape.c — recording hooks and backward functions of the view, layout and
 * indexing ops: reshape and friends, permute, expand, slicing, cat/stack, repeat, flip,
 * pad, identity-like copies (contiguous, clone, cast), to_device, gather, scatter,
 * index_select, slice_assign and embedding.
 *
 * Backward of a selection writes the gradient back where the elements came from: a
 * slice goes into a zero tensor with slice_assign, an index goes through index_add or
 * scatter_add (so repeated indices accumulate), reflect/replicate padding folds the
 * padded border back with one index_add per padded dim.
 */
#include <stdlib.h>
#include <string.h>

#include "autograd-impl.h"

/* --------------------------------------------------------------- reshape, permute */

static int reshape_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    gin[0] = kiln_reshape(g, n->edges[0].ndim, n->edges[0].shape);
    return gin[0] ? 0 : -1;
}

kiln_tensor *kiln__grad_reshape(kiln_tensor *out, kiln_tensor *t, const char *name)
{
    bool failed;
    kiln__ad_record(out, name, reshape_backward, 1, &t, &failed);
    return kiln__ad_fail(out, failed);
}

static int permute_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    int inv[KILN_MAX_DIMS];
    int nd = n->edges[0].ndim;
    for (int i = 0; i < nd; i++)
        inv[n->iv[i]] = i;
    gin[0] = kiln_permute(g, nd, inv);
    return gin[0] ? 0 : -1;
}

kiln_tensor *kiln__grad_permute(kiln_tensor *out, kiln_tensor *t, int ndim, const int *order)
{
    bool failed;
    kiln__node *n = kiln__ad_record(out, "permute", permute_backward, 1, &t, &failed);
    for (int i = 0; n && i < ndim; i++)
        n->iv[i] = order[i] < 0 ? order[i] + ndim : order[i];
    return kiln__ad_fail(out, failed);
}

static int expand_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    gin[0] = kiln__sum_to(g, n->edges[0].ndim, n->edges[0].shape);
    return gin[0] ? 0 : -1;
}

kiln_tensor *kiln__grad_expand(kiln_tensor *out, kiln_tensor *t)
{
    bool failed;
    kiln__ad_record(out, "expand", expand_backward, 1, &t, &failed);
    return kiln__ad_fail(out, failed);
}

/* ----------------------------------------------------------------------- slicing */

static int slice_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    kiln_tensor *z = kiln_zeros(kiln__dev(g), g->dtype, n->edges[0].ndim, n->edges[0].shape);
    gin[0] = kiln_slice_assign(z, (int)n->iv[0], n->iv[1], n->iv[2], n->iv[3], g);
    return gin[0] ? 0 : -1;
}

kiln_tensor *kiln__grad_slice(kiln_tensor *out, kiln_tensor *t, int dim, int64_t start, int64_t end,
                              int64_t step, const char *name)
{
    bool failed;
    kiln__node *n = kiln__ad_record(out, name, slice_backward, 1, &t, &failed);
    if (n) {
        n->iv[0] = dim;
        n->iv[1] = start;
        n->iv[2] = end;
        n->iv[3] = step;
    }
    return kiln__ad_fail(out, failed);
}

/* -------------------------------------------------------------------- cat, stack */

static int cat_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    int d = (int)n->iv[0];
    bool stack = n->iv[1];
    int64_t at = 0;
    for (int i = 0; i < n->nin; i++) {
        int64_t len = stack ? 1 : n->edges[i].shape[d];
        if (kiln__ad_needs(n, i)) {
            kiln_tensor *piece = kiln_narrow(g, d, at, len);
            gin[i] = stack ? kiln_squeeze(piece, d) : piece;
            if (!gin[i])
                return -1;
        }
        at += len;
    }
    return 0;
}

kiln_tensor *kiln__grad_cat(kiln_tensor *out, kiln_tensor *const *ts, int n, int dim, bool stack)
{
    bool failed;
    kiln__node *node = kiln__ad_record(out, stack ? "stack" : "cat", cat_backward, n, ts, &failed);
    if (node) {
        node->iv[0] = dim;
        node->iv[1] = stack;
    }
    return kiln__ad_fail(out, failed);
}

/* ------------------------------------------------------------------- repeat, flip */

static int repeat_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    int nd = (int)n->iv[KILN_MAX_DIMS];
    kiln_tensor *x = g;
    /* Fold one repeated dim at a time: [.., r*s, ..] -> [.., r, s, ..] summed over r. */
    for (int d = 0; x && d < nd; d++) {
        int64_t r = n->iv[d];
        if (r == 1)
            continue;
        int64_t sh[KILN_MAX_DIMS + 1];
        int m = 0;
        for (int k = 0; k < nd; k++) {
            if (k == d) {
                sh[m++] = r;
                sh[m++] = r ? x->shape[k] / r : 0;
            } else {
                sh[m++] = x->shape[k];
            }
        }
        if (m > KILN_MAX_DIMS)
            return kiln__error_set("backward of repeat: too many dims");
        x = kiln_sum(kiln_reshape(x, m, sh), KILN_DIMS(d), false);
    }
    gin[0] = x ? kiln_reshape(x, n->edges[0].ndim, n->edges[0].shape) : NULL;
    return gin[0] ? 0 : -1;
}

kiln_tensor *kiln__grad_repeat(kiln_tensor *out, kiln_tensor *t, int ndim, const int64_t *repeats)
{
    bool failed;
    kiln__node *n = kiln__ad_record(out, "repeat", repeat_backward, 1, &t, &failed);
    if (n) {
        for (int i = 0; i < ndim; i++)
            n->iv[i] = repeats[i];
        n->iv[KILN_MAX_DIMS] = ndim;
    }
    return kiln__ad_fail(out, failed);
}

static int flip_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    int dims[KILN_MAX_DIMS];
    int nd = (int)n->iv[KILN_MAX_DIMS];
    for (int i = 0; i < nd; i++)
        dims[i] = (int)n->iv[i];
    gin[0] = nd ? kiln_flip(g, nd, dims) : g;
    return gin[0] ? 0 : -1;
}

kiln_tensor *kiln__grad_flip(kiln_tensor *out, kiln_tensor *t, int ndims, const int *dims)
{
    bool failed;
    kiln__node *n = kiln__ad_record(out, "flip", flip_backward, 1, &t, &failed);
    if (n) {
        for (int i = 0; i < ndims; i++)
            n->iv[i] = dims[i];
        n->iv[KILN_MAX_DIMS] = ndims;
    }
    return kiln__ad_fail(out, failed);
}

/* ------------------------------------------------------------------------- pad */

/* For each output position along a padded dim, the input position it copies. */
static kiln_tensor *pad_source_index(kiln_device *dev, int64_t size, int64_t lo, int64_t hi, bool reflect)
{
    int64_t nout = size + lo + hi;
    int64_t *idx = malloc((size_t)(nout > 0 ? nout : 1) * sizeof *idx);
    if (!idx) {
        kiln__error_set("backward of pad: out of memory");
        return NULL;
    }
    for (int64_t j = 0; j < nout; j++) {
        int64_t p = j - lo;
        if (reflect) {
            if (p < 0)
                p = -p;
            if (p >= size)
                p = 2 * (size - 1) - p;
        } else {
            p = p < 0 ? 0 : p >= size ? size - 1 : p;
        }
        idx[j] = p;
    }
    kiln_tensor *t = kiln_from_data(dev, KILN_I64, 1, &nout, idx, (size_t)nout * sizeof *idx);
    free(idx);
    return t;
}

static int pad_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    int npads = (int)n->iv[2 * KILN_MAX_DIMS];
    kiln_pad_mode mode = (kiln_pad_mode)n->iv[2 * KILN_MAX_DIMS + 1];
    int nd = n->edges[0].ndim;
    if (mode == KILN_PAD_CONSTANT) {
        int64_t neg[2 * KILN_MAX_DIMS];
        for (int i = 0; i < npads; i++)
            neg[i] = -n->iv[i];
        gin[0] = kiln_pad(g, npads, neg, KILN_PAD_CONSTANT, 0);
        return gin[0] ? 0 : -1;
    }
    kiln_tensor *x = g;
    for (int i = 0; x && i < npads / 2; i++) {
        int d = nd - 1 - i;
        int64_t lo = n->iv[2 * i], hi = n->iv[2 * i + 1];
        if (lo == 0 && hi == 0)
            continue;
        int64_t size = n->edges[0].shape[d];
        kiln_tensor *idx = pad_source_index(kiln__dev(g), size, lo, hi, mode == KILN_PAD_REFLECT);
        x = kiln__index_add_dim(x, d, size, idx);
    }
    gin[0] = x;
    return x ? 0 : -1;
}

kiln_tensor *kiln__grad_pad(kiln_tensor *out, kiln_tensor *t, int npads, const int64_t *pads,
                            kiln_pad_mode mode)
{
    bool failed;
    kiln__node *n = kiln__ad_record(out, "pad", pad_backward, 1, &t, &failed);
    if (n) {
        for (int i = 0; i < npads; i++)
            n->iv[i] = pads[i];
        n->iv[2 * KILN_MAX_DIMS] = npads;
        n->iv[2 * KILN_MAX_DIMS + 1] = mode;
    }
    return kiln__ad_fail(out, failed);
}

/* ------------------------------------------------- identity copies, to_device */

static int identity_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    (void)n;
    gin[0] = g;
    return 0;
}

kiln_tensor *kiln__grad_identity(kiln_tensor *out, kiln_tensor *t, const char *name)
{
    bool failed;
    kiln__ad_record(out, name, identity_backward, 1, &t, &failed);
    return kiln__ad_fail(out, failed);
}

static int to_device_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    gin[0] = kiln_to_device(g, kiln__dev(n->saved[0]));
    return gin[0] ? 0 : -1;
}

kiln_tensor *kiln__grad_to_device(kiln_tensor *out, kiln_tensor *t)
{
    bool failed;
    kiln__node *n = kiln__ad_record(out, "to_device", to_device_backward, 1, &t, &failed);
    if (n) {
        /* An empty tensor on the source device: keeps that device open, costs nothing. */
        int64_t zero = 0;
        kiln_tensor *anchor = kiln__alloc(kiln__dev(t), t->dtype, 1, &zero, "to_device");
        failed = !anchor || kiln__ad_save(n, 0, anchor) < 0;
        kiln_tensor_release(anchor);
    }
    return kiln__ad_fail(out, failed);
}

/* --------------------------------------------------------------------- indexing */

static bool save_index(kiln__node *n, int k, kiln_tensor *index)
{
    kiln_tensor *ix = kiln__cast(index, KILN_I64, n->name);
    bool ok = ix && kiln__ad_save(n, k, ix) == 0;
    kiln_tensor_release(ix);
    return ok;
}

static int gather_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    kiln_tensor *z = kiln_zeros(kiln__dev(g), g->dtype, n->edges[0].ndim, n->edges[0].shape);
    gin[0] = kiln_scatter_add(z, (int)n->iv[0], n->saved[0], g);
    return gin[0] ? 0 : -1;
}

kiln_tensor *kiln__grad_gather(kiln_tensor *out, kiln_tensor *t, int dim, kiln_tensor *index)
{
    bool failed;
    kiln__node *n = kiln__ad_record(out, "gather", gather_backward, 1, &t, &failed);
    if (n) {
        n->iv[0] = dim;
        failed = !save_index(n, 0, index);
    }
    return kiln__ad_fail(out, failed);
}

static int scatter_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    int d = (int)n->iv[0];
    bool accumulate = n->iv[1];
    kiln_tensor *ix = n->saved[0];
    if (kiln__ad_needs(n, 0)) {
        /* Overwritten positions got nothing from t; added ones pass the gradient on. */
        gin[0] = accumulate ? g : kiln_scatter(g, d, ix, kiln_zeros(kiln__dev(g), g->dtype, ix->ndim, ix->shape));
        if (!gin[0])
            return -1;
    }
    if (kiln__ad_needs(n, 1)) {
        kiln_tensor *gs = kiln_gather(g, d, ix);
        /* src may be larger than the index: its other elements were never read. */
        int64_t pads[2 * KILN_MAX_DIMS];
        int nd = n->edges[1].ndim;
        for (int i = 0; i < nd; i++) {
            pads[2 * i] = 0;
            pads[2 * i + 1] = n->edges[1].shape[nd - 1 - i] - ix->shape[nd - 1 - i];
        }
        gin[1] = nd ? kiln_pad(gs, 2 * nd, pads, KILN_PAD_CONSTANT, 0) : gs;
        if (!gin[1])
            return -1;
    }
    return 0;
}

kiln_tensor *kiln__grad_scatter(kiln_tensor *out, kiln_tensor *t, int dim, kiln_tensor *index,
                                kiln_tensor *src, bool accumulate)
{
    bool failed;
    kiln_tensor *ins[2] = {t, src};
    kiln__node *n = kiln__ad_record(out, accumulate ? "scatter_add" : "scatter", scatter_backward, 2, ins,
                                    &failed);
    if (n) {
        n->iv[0] = dim < 0 ? dim + t->ndim : dim;
        n->iv[1] = accumulate;
        failed = !save_index(n, 0, index);
    }
    return kiln__ad_fail(out, failed);
}

static int index_select_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    int d = (int)n->iv[0];
    gin[0] = kiln__index_add_dim(g, d, n->edges[0].shape[d], n->saved[0]);
    return gin[0] ? 0 : -1;
}

kiln_tensor *kiln__grad_index_select(kiln_tensor *out, kiln_tensor *t, int dim, kiln_tensor *index)
{
    bool failed;
    kiln__node *n = kiln__ad_record(out, "index_select", index_select_backward, 1, &t, &failed);
    if (n) {
        n->iv[0] = dim < 0 ? dim + t->ndim : dim;
        int64_t len = kiln__numel(index);
        kiln_tensor *flat = kiln__reshape(index, 1, &len, n->name);
        failed = !flat || !save_index(n, 0, flat);
        kiln_tensor_release(flat);
    }
    return kiln__ad_fail(out, failed);
}

static int slice_assign_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    int d = (int)n->iv[0];
    int64_t s = n->iv[1], e = n->iv[2], step = n->iv[3];
    if (kiln__ad_needs(n, 0)) {
        gin[0] = kiln_slice_assign(g, d, s, e, step, kiln__const_like(g, 0));
        if (!gin[0])
            return -1;
    }
    if (kiln__ad_needs(n, 1)) {
        gin[1] = kiln__sum_to(kiln_slice(g, d, s, e, step), n->edges[1].ndim, n->edges[1].shape);
        if (!gin[1])
            return -1;
    }
    return 0;
}

kiln_tensor *kiln__grad_slice_assign(kiln_tensor *out, kiln_tensor *t, int dim, int64_t start,
                                     int64_t end, int64_t step, kiln_tensor *src)
{
    bool failed;
    kiln_tensor *ins[2] = {t, src};
    kiln__node *n = kiln__ad_record(out, "slice_assign", slice_assign_backward, 2, ins, &failed);
    if (n) {
        n->iv[0] = dim;
        n->iv[1] = start;
        n->iv[2] = end;
        n->iv[3] = step;
    }
    return kiln__ad_fail(out, failed);
}

static int embedding_backward(kiln__node *n, kiln_tensor *g, kiln_tensor **gin)
{
    int64_t V = n->edges[0].shape[0], D = n->edges[0].shape[1];
    kiln_tensor *g2 = kiln_reshape(g, KILN_SHAPE(-1, D));
    gin[0] = kiln__index_add_dim(g2, 0, V, n->saved[0]);
    return gin[0] ? 0 : -1;
}

kiln_tensor *kiln__grad_embedding(kiln_tensor *out, kiln_tensor *weight, kiln_tensor *indices)
{
    bool failed;
    kiln__node *n = kiln__ad_record(out, "embedding", embedding_backward, 1, &weight, &failed);
    if (n) {
        int64_t len = kiln__numel(indices);
        kiln_tensor *flat = kiln__reshape(indices, 1, &len, n->name);
        failed = !flat || !save_index(n, 0, flat);
        kiln_tensor_release(flat);
    }
    return kiln__ad_fail(out, failed);
}
