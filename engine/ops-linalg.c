/*
 * engine/ops-linalg.c — matrix products with NumPy semantics, and linear layers.
 *
 * The backend multiplies [B..., M, K] by [B..., K, N] with identical batch dims; the
 * front end turns 1-d operands into matrices (and drops the added dim afterwards) and
 * broadcasts batch dims with 0 strides, so a [K, N] weight shared by a whole batch is
 * never copied. A graph executor's MatMul with a folded bias and activation goes through
 * kiln__matmul_epilogue, which hands the epilogue to the backend's matmul when it fuses it.
 */
#include <stdio.h>
#include <string.h>

#include "autograd-impl.h"
#include "tensor-impl.h"

/* a·b; with ep (f32, checked by the caller), the backend's matmul_fused is tried first
 * and *fused says whether it applied ep. */
static kiln_tensor *matmul_impl(kiln_tensor *a, kiln_tensor *b, const char *op, const kiln_epilogue *ep,
                                bool *fused)
{
    char da[200], db[200];
    if (kiln__same_device(a, b, op) < 0)
        return NULL;
    if (a->ndim == 0 || b->ndim == 0) {
        kiln__error_set("%s: both operands need at least 1 dim (%s, %s)", op, kiln__describe(a, da, sizeof da),
                        kiln__describe(b, db, sizeof db));
        return NULL;
    }
    kiln_dtype dt = kiln_promote_types(a->dtype, b->dtype);
    if (dt == KILN_BOOL) {
        kiln__error_set("%s: bool operands are not supported (%s, %s)", op, kiln__describe(a, da, sizeof da),
                        kiln__describe(b, db, sizeof db));
        return NULL;
    }
    kiln_tensor *ca = kiln__cast(a, dt, op);
    kiln_tensor *cb = ca ? kiln__cast(b, dt, op) : NULL;
    if (!cb) {
        kiln_tensor_release(ca);
        return NULL;
    }
    /* Matrix views of both operands (of the cast copies, whose strides may differ). */
    int64_t as[KILN_MAX_DIMS], ast[KILN_MAX_DIMS], bs[KILN_MAX_DIMS], bst[KILN_MAX_DIMS];
    int an = ca->ndim, bn = cb->ndim;
    memcpy(as, ca->shape, sizeof as);
    memcpy(ast, ca->strides, sizeof ast);
    memcpy(bs, cb->shape, sizeof bs);
    memcpy(bst, cb->strides, sizeof bst);
    if (an == 1) {
        as[1] = as[0]; ast[1] = ast[0];
        as[0] = 1; ast[0] = 0;
        an = 2;
    }
    if (bn == 1) {
        bs[1] = 1; bst[1] = 0;
        bn = 2;
    }
    int64_t M = as[an - 2], K = as[an - 1], K2 = bs[bn - 2], N = bs[bn - 1];
    int64_t batch[KILN_MAX_DIMS];
    int nb = -1;
    if (K != K2)
        kiln__error_set("%s: %s and %s cannot be multiplied (%lld != %lld)", op,
                        kiln__describe(a, da, sizeof da), kiln__describe(b, db, sizeof db), (long long)K,
                        (long long)K2);
    else
        nb = kiln__broadcast_shape(an - 2, as, bn - 2, bs, batch, op, a, b);
    if (nb + 2 > KILN_MAX_DIMS) {
        kiln__error_set("%s: result rank exceeds %d", op, KILN_MAX_DIMS);
        nb = -1;
    }
    if (nb < 0) {
        kiln_tensor_release(ca);
        kiln_tensor_release(cb);
        return NULL;
    }
    int64_t oshape[KILN_MAX_DIMS];
    memcpy(oshape, batch, sizeof(int64_t) * (size_t)nb);
    oshape[nb] = M;
    oshape[nb + 1] = N;
    kiln_tensor *va = kiln__view(ca, an, as, ast, ca->offset);
    kiln_tensor *vb = va ? kiln__view(cb, bn, bs, bst, cb->offset) : NULL;
    kiln_tensor *out = vb ? kiln__alloc(kiln__dev(a), dt, nb + 2, oshape, op) : NULL;
    int rc = out ? 0 : -1;
    if (rc == 0 && kiln__numel(out) > 0) {
        if (K == 0) {
            rc = kiln__fill(out, 0, op);
        } else {
            const kiln_backend_iface *be = kiln__be(a);
            if (!kiln__supports(kiln__dev(a), KILN_ENTRY_MATMUL, -1, dt, NULL)) {
                rc = kiln__unsupported(kiln__dev(a), op, KILN_ENTRY_MATMUL, -1, dt);
            } else {
                int64_t ashape[KILN_MAX_DIMS], bshape[KILN_MAX_DIMS];
                memcpy(ashape, batch, sizeof(int64_t) * (size_t)nb);
                memcpy(bshape, batch, sizeof(int64_t) * (size_t)nb);
                ashape[nb] = M; ashape[nb + 1] = K;
                bshape[nb] = K; bshape[nb + 1] = N;
                kiln_tdesc od, ad, bd;
                kiln__desc(out, &od);
                kiln__bcast_desc(va, nb + 2, ashape, &ad);
                kiln__bcast_desc(vb, nb + 2, bshape, &bd);
                rc = KILN_ENOTSUP;
                if (ep && be->matmul_fused) {
                    rc = be->matmul_fused(kiln__ctx(a), &od, &ad, &bd, ep);
                    *fused = rc >= 0;
                }
                if (rc == KILN_ENOTSUP)
                    rc = be->matmul(kiln__ctx(a), &od, &ad, &bd);
            }
        }
    }
    kiln_tensor_release(ca);
    kiln_tensor_release(cb);
    kiln_tensor_release(va);
    kiln_tensor_release(vb);
    if (rc < 0) {
        kiln_tensor_release(out);
        return NULL;
    }
    if (a->ndim > 1 && b->ndim > 1)
        return out;
    /* Drop the dims that 1-d operands borrowed. */
    int64_t fs[KILN_MAX_DIMS];
    int fn = 0;
    for (int i = 0; i < nb; i++)
        fs[fn++] = batch[i];
    if (a->ndim > 1)
        fs[fn++] = M;
    if (b->ndim > 1)
        fs[fn++] = N;
    kiln_tensor *r = kiln__reshape(out, fn, fs, op);
    kiln_tensor_release(out);
    return r;
}

kiln_tensor *kiln_matmul(kiln_tensor *a, kiln_tensor *b)
{
    if (!a || !b)
        return NULL;
    kiln_tensor *out = matmul_impl(a, b, "matmul", NULL, NULL);
    if (out && (kiln__ad_want(a) || kiln__ad_want(b)))
        out = kiln__grad_matmul(out, a, b);
    return kiln__ret(out);
}

kiln_tensor *kiln_linear(kiln_tensor *x, kiln_tensor *weight, kiln_tensor *bias)
{
    if (!x || !weight)
        return NULL;
    char dx[200], dw[200];
    if (weight->ndim != 2 || x->ndim < 1 || x->shape[x->ndim - 1] != weight->shape[1]) {
        kiln__error_set("linear: input %s does not match weight %s [out, in]", kiln__describe(x, dx, sizeof dx),
                        kiln__describe(weight, dw, sizeof dw));
        return NULL;
    }
    if (bias && (bias->ndim != 1 || bias->shape[0] != weight->shape[0])) {
        kiln__error_set("linear: bias %s must be [%lld]", kiln__describe(bias, dx, sizeof dx),
                        (long long)weight->shape[0]);
        return NULL;
    }
    int64_t wt_shape[2] = {weight->shape[1], weight->shape[0]};
    int64_t wt_strides[2] = {weight->strides[1], weight->strides[0]};
    kiln_tensor *wt = kiln__view(weight, 2, wt_shape, wt_strides, weight->offset);
    kiln_tensor *y = wt ? matmul_impl(x, wt, "linear", NULL, NULL) : NULL;
    kiln_tensor_release(wt);
    if (y && bias) {
        kiln_tensor *z = kiln__binary(KILN_BINARY_ADD, y, bias);
        kiln_tensor_release(y);
        y = z;
    }
    if (y && (kiln__ad_want(x) || kiln__ad_want(weight) || kiln__ad_want(bias)))
        y = kiln__grad_linear(y, x, weight, bias);
    return kiln__ret(y);
}

static bool contiguous(const kiln_tensor *t)
{
    int64_t want = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->strides[d] != want)
            return false;
        want *= t->shape[d];
    }
    return true;
}

kiln_tensor *kiln__matmul_epilogue(kiln_tensor *a, kiln_tensor *b, kiln_tensor *bias, kiln_tensor *residual,
                                   kiln_epilogue_act act, double alpha, double beta)
{
    if (!a || !b)
        return NULL;
    /* the fused entry takes what kiln__epilogue's in-place path takes, on the product of
     * two f32 matrices (or stacks of them) that nothing differentiates */
    bool fast = kiln__be(a)->matmul_fused && a->dtype == KILN_F32 && b->dtype == KILN_F32 && a->ndim >= 2 &&
                b->ndim >= 2 && !kiln__ad_want(a) && !kiln__ad_want(b) && !kiln__ad_want(bias) &&
                !kiln__ad_want(residual) && !(act == KILN_EPI_CLAMP && alpha > beta) &&
                kiln__dev(a) == kiln__dev(b);
    int64_t n = b->shape[b->ndim - 1];
    if (fast && bias)
        fast = bias->dtype == KILN_F32 && bias->ndim == 1 && bias->shape[0] == n &&
               kiln__dev(bias) == kiln__dev(a);
    if (fast && residual) {
        /* the product's shape: a's and b's batch dims broadcast, then [M, N] */
        int64_t batch[KILN_MAX_DIMS];
        int nb = kiln__broadcast_shape(a->ndim - 2, a->shape, b->ndim - 2, b->shape, batch, "matmul", a, b);
        fast = nb >= 0 && residual->dtype == KILN_F32 && residual->ndim == nb + 2 && contiguous(residual) &&
               kiln__dev(residual) == kiln__dev(a);
        for (int d = 0; fast && d < nb; d++)
            fast = residual->shape[d] == batch[d];
        fast = fast && residual->shape[nb] == a->shape[a->ndim - 2] && residual->shape[nb + 1] == n;
        if (nb < 0)
            kiln_error_clear(); /* kiln_matmul below reports the mismatch itself */
    }
    if (!fast)
        return kiln__epilogue(kiln_matmul(a, b), bias, residual, act, alpha, beta);
    kiln_tdesc bd, rd;
    kiln_epilogue ep = {act, alpha, beta, NULL, NULL};
    if (bias) {
        kiln__desc(bias, &bd);
        ep.bias = &bd;
    }
    if (residual) {
        kiln__desc(residual, &rd);
        ep.residual = &rd;
    }
    bool fused = false;
    kiln_tensor *y = matmul_impl(a, b, "matmul", &ep, &fused);
    if (!y || fused)
        return kiln__ret(y);
    return kiln__epilogue(kiln__ret(y), bias, residual, act, alpha, beta);
}
