/*
 * backends/cuda/cuda-conv-operands.c — what the convolution libraries' callers share
 * (cuda-dnn.c for cuDNN, hip-miopen.c for MIOpen): packed copies of strided operands,
 * which both libraries want packed in row-major order (cuda-blas.c makes its copies of
 * layouts cuBLASLt cannot read with them too), the per-channel bias added after
 * the convolution as its own launch, and conv_fused: the convolution, then its bias,
 * residual and activation in one pass (one launch and one read and write of the output
 * where the unfused ops take three).
 */
#include "cuda-impl.h"

bool kiln__cuda_packed(const kiln_tdesc *t)
{
    int64_t want = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->strides[d] != want)
            return false;
        want *= t->shape[d];
    }
    return true;
}

int kiln__cuda_operand_packed(kiln__cuda_operands *c, const kiln_tdesc *t, const kiln_tdesc **out)
{
    *out = t;
    if (kiln__cuda_packed(t))
        return 0;
    return kiln__cuda_operand_as(c, t, t->dtype, true, out);
}

int kiln__cuda_operand_as(kiln__cuda_operands *c, const kiln_tdesc *t, kiln_dtype dtype, bool copy,
                          const kiln_tdesc **out)
{
    static const size_t esize[KILN_DTYPE_COUNT] = {4, 8, 2, 2, 8, 4, 1, 1};
    *out = t;
    if (c->n >= (int)(sizeof c->scratch / sizeof c->scratch[0])) {
        kiln__error_set("%s on %s: more operand copies than a call holds", c->op, c->q->dev->name);
        return KILN_EINVAL;
    }
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    size_t bytes = (size_t)n * esize[dtype];
    int i = c->n;
    bool oom = false;
    c->scratch[i] = kiln__cuda_alloc_get(&c->q->dev->alloc, c->q->stream, bytes, &oom);
    if (!c->scratch[i]) {
        if (!oom)
            return KILN_EDEVICE;
        return kiln__error_set_code(KILN_ENOMEM, "%s on %s: out of device memory for an operand copy", c->op,
                                    c->q->dev->name);
    }
    c->n++;
    c->holders[i] = (struct kiln_buffer){.blk = c->scratch[i], .nbytes = bytes};
    kiln_tdesc *cp = &c->copies[i];
    *cp = *t;
    cp->dtype = dtype;
    cp->buf = &c->holders[i];
    cp->offset = 0;
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        cp->strides[d] = s;
        s *= t->shape[d];
    }
    *out = cp;
    if (!copy)
        return 0;
    kcu_view dv = kiln__cuda_view(cp), sv = kiln__cuda_view(t);
    return kiln__cuda_check(c->q, kcu_copy(c->q->stream, &dv, &sv), c->op);
}

void kiln__cuda_operands_release(kiln__cuda_operands *c)
{
    for (int i = 0; i < c->n; i++)
        kiln__cuda_alloc_put(&c->q->dev->alloc, c->q->stream, c->scratch[i]);
    c->n = 0;
}

int kiln__cuda_conv_add_bias(kiln_cuda_queue *q, const kiln_tdesc *y, const kiln_tdesc *bias, const char *op)
{
    kcu_view o = kiln__cuda_view(y), b = kiln__cuda_view(bias);
    int64_t plane = 1;
    for (int d = 2; d < y->ndim; d++)
        plane *= y->shape[d];
    return kiln__cuda_check(q, kcu_channel_bias(q->stream, &o, &b, y->shape[1], plane), op);
}

int kiln__cuda_conv_fused(void *vq, const kiln_conv_params *p, const kiln_tdesc *out, const kiln_tdesc *x,
                          const kiln_tdesc *w, const kiln_tdesc *wpacked, const kiln_tdesc *bias,
                          const kiln_epilogue *ep)
{
    (void)wpacked; /* cuDNN and MIOpen read the weight as it is */
    kiln_cuda_queue *q = vq;
    if (out->dtype != KILN_F32 || (unsigned)ep->act >= KILN_EPI_COUNT || !kiln__cuda_packed(out))
        return kiln__error_set("conv_fused on %s: f32 into a contiguous output only", q->dev->name), KILN_ENOTSUP;
    int rc = kiln__cuda_conv(q, p, out, x, w, NULL);
    if (rc)
        return rc;
    kiln__cuda_operands ops = {.q = q, .op = "conv_fused"};
    const kiln_tdesc *res = ep->residual;
    if (res)
        rc = kiln__cuda_operand_packed(&ops, res, &res);
    if (!rc && (bias || res || ep->act != KILN_EPI_NONE)) {
        kcu_view o = kiln__cuda_view(out), b = kiln__cuda_view_opt(bias), r = kiln__cuda_view_opt(res);
        int64_t plane = 1;
        for (int d = 2; d < out->ndim; d++)
            plane *= out->shape[d];
        rc = kiln__cuda_check(
            q, kcu_conv_epilogue(q->stream, &o, &b, &r, out->shape[1], plane, (int)ep->act, ep->alpha, ep->beta),
            "conv_fused");
    }
    kiln__cuda_operands_release(&ops);
    return rc;
}
