/*
 * backends/fused/fused-permute.c — a copy of a matrix product into a permuted layout,
 * folded into the product: the product written straight into the copy's output.
 *
 * Attention computes per head: its products come out [N, H, L, D], and merging the heads
 * back into [N, L, H·D] for the output projection is a copy through a permutation
 * (forward), as is splitting each gradient of q, k and v back into its projection's
 * layout (backward). When the product is read by nothing but that copy (it is dead by the
 * time the group runs), the fusion layer asks the inner backend's matmul to write each
 * batch's matrix at its place in the copy's output (rows whole, ldc the row stride there),
 * where unfused the product is written, read back and written again. Only on a backend
 * whose caps say matmul_strided_out; the bits are the matmul's own either way.
 */
#include "fused-codegen.h"
#include "fused-impl.h"

/* The element count of a shape. */
static int64_t count(const kiln_tdesc *d)
{
    int64_t n = 1;
    for (int i = 0; i < d->ndim; i++)
        n *= d->shape[i];
    return n;
}

bool kiln__fused_permuted_store(const frec *product, const frec *copy, kiln_tdesc *store)
{
    const kiln_tdesc *po = &product->out, *v = &copy->x, *o = &copy->out;
    if (product->entry != KILN_ENTRY_MATMUL || copy->entry != KILN_ENTRY_COPY || po->dtype != KILN_F32 ||
        v->dtype != KILN_F32 || o->dtype != KILN_F32 || v->buf != po->buf || v->offset != po->offset ||
        !kiln__fused_contiguous(po) || !kiln__fused_contiguous(o) || o->ndim != v->ndim || po->ndim < 2 ||
        count(po) == 0 || count(v) != count(po) || o->buf == product->x.buf || o->buf == product->y.buf ||
        o->buf == po->buf)
        return false;
    for (int d = 0; d < v->ndim; d++)
        if (o->shape[d] != v->shape[d])
            return false;
    /* each dim of the view is one dim of the product (same size, the product's stride):
     * that product dim then steps through the output as the view's dim does */
    int64_t ostride[KILN_MAX_DIMS], st = 1;
    for (int d = o->ndim - 1; d >= 0; d--) {
        ostride[d] = st;
        st *= o->shape[d];
    }
    *store = *po;
    store->buf = o->buf;
    store->offset = o->offset;
    bool used[KILN_MAX_DIMS] = {false};
    for (int p = 0; p < po->ndim; p++)
        store->strides[p] = 0; /* dims of size 1: never stepped */
    for (int d = 0; d < v->ndim; d++) {
        if (v->shape[d] == 1)
            continue;
        int p = 0;
        while (p < po->ndim && (used[p] || po->shape[p] != v->shape[d] || po->strides[p] != v->strides[d]))
            p++;
        if (p == po->ndim)
            return false;
        used[p] = true;
        store->strides[p] = ostride[d];
    }
    bool same = true;
    for (int p = 0; p < po->ndim; p++) {
        if (po->shape[p] > 1 && !used[p])
            return false;
        same = same && (po->shape[p] == 1 || store->strides[p] == po->strides[p]);
    }
    /* a plain copy joins groups as it is; rows must stay whole (the caps' promise) */
    int last = po->ndim - 1;
    return !same && (po->shape[last] == 1 || store->strides[last] == 1);
}
