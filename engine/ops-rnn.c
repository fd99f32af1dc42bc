/*
 * engine/ops-rnn.c — an LSTM or GRU layer handed to the device in one call (the backend's
 * optional rnn entry), for inference. The ONNX executor (engine/onnx/onnx-ops-rnn.c) tries
 * it first and composes the layer from matmuls and elementwise ops when it is not taken,
 * which is also the path that records gradients; both give ONNX's arithmetic, so a device
 * without the entry (ref, remote) returns the same values.
 */
#include "autograd-impl.h"
#include "error-impl.h"
#include "rnn-impl.h"
#include "tensor-impl.h"

/* Operands the entry can read: f32 on x's device, nothing that records gradients. */
static bool usable(const kiln_tensor *t, const kiln_device *dev)
{
    return !t || (t->dtype == KILN_F32 && kiln__dev(t) == dev && !kiln__ad_want(t));
}

kiln_tensor *kiln__rnn_pack(const kiln_rnn_params *p, kiln_tensor *w, kiln_tensor *r)
{
    if (!w || !r)
        return NULL;
    kiln_device *dev = kiln__dev(w);
    const kiln_backend_iface *be = dev->be;
    if (!be->rnn_pack_size || !be->rnn_pack || !usable(w, dev) || !usable(r, dev) ||
        !kiln__supports(dev, KILN_ENTRY_RNN, (int)p->cell, KILN_F32, p))
        return NULL;
    int64_t n = be->rnn_pack_size(kiln__qctx(dev), p);
    if (n <= 0)
        return NULL;
    kiln_tensor *packed = kiln__alloc(dev, KILN_F32, 1, &n, "rnn_pack");
    kiln_tensor *cw = packed ? kiln__contiguous(w, "rnn_pack") : NULL,
                *cr = cw ? kiln__contiguous(r, "rnn_pack") : NULL;
    bool ok = cr != NULL;
    if (ok) {
        kiln_tdesc pd, wd, rd;
        kiln__desc(packed, &pd);
        kiln__desc(cw, &wd);
        kiln__desc(cr, &rd);
        ok = be->rnn_pack(kiln__qctx(dev), p, &pd, &wd, &rd) >= 0;
    }
    kiln_tensor_release(cw);
    kiln_tensor_release(cr);
    if (!ok) {
        kiln_tensor_release(packed);
        return NULL;
    }
    return kiln__ret(packed);
}

int kiln__rnn(const kiln_rnn_params *p, kiln_tensor *x, kiln_tensor *w, kiln_tensor *r, kiln_tensor *bias,
              kiln_tensor *h0, kiln_tensor *c0, kiln_tensor *peep, kiln_tensor *packed, kiln_tensor **y,
              kiln_tensor **yh, kiln_tensor **yc)
{
    *y = *yh = NULL;
    if (yc)
        *yc = NULL;
    if (!x || !w || !r)
        return 0;
    kiln_device *dev = kiln__dev(x);
    const kiln_backend_iface *be = dev->be;
    bool lstm = p->cell == KILN_RNN_LSTM;
    kiln_tensor *ins[7] = {x, w, r, bias, h0, lstm ? c0 : NULL, lstm ? peep : NULL};
    if (!kiln__supports(dev, KILN_ENTRY_RNN, (int)p->cell, KILN_F32, p) || p->steps < 1 || p->batch < 1 || p->hidden < 1 || p->input < 1 || (p->ndir != 1 && p->ndir != 2))
        return 0;
    for (int i = 0; i < 7; i++)
        if (!usable(ins[i], dev))
            return 0;
    kiln_tensor *c[7] = {0};
    int64_t D = p->ndir;
    kiln_tensor *out[3] = {
        kiln__alloc(dev, KILN_F32, 4, (const int64_t[]){p->steps, D, p->batch, p->hidden}, "rnn"),
        kiln__alloc(dev, KILN_F32, 3, (const int64_t[]){D, p->batch, p->hidden}, "rnn"),
        lstm && yc ? kiln__alloc(dev, KILN_F32, 3, (const int64_t[]){D, p->batch, p->hidden}, "rnn") : NULL,
    };
    bool ok = out[0] && out[1] && (!lstm || !yc || out[2]);
    for (int i = 0; ok && i < 7; i++)
        if (ins[i] && !(c[i] = kiln__contiguous(ins[i], "rnn")))
            ok = false;
    if (ok) {
        kiln_tdesc d[7], od[3];
        for (int i = 0; i < 7; i++)
            if (c[i])
                kiln__desc(c[i], &d[i]);
        for (int i = 0; i < 3; i++)
            if (out[i])
                kiln__desc(out[i], &od[i]);
        /* an LSTM whose caller does not want Y_c still needs the cell state written somewhere */
        kiln_tensor *cell = lstm && !out[2] ? kiln__alloc(dev, KILN_F32, 3, (const int64_t[]){D, p->batch, p->hidden}, "rnn") : NULL;
        kiln_tdesc cd;
        if (cell)
            kiln__desc(cell, &cd);
        ok = !lstm || out[2] || cell;
        kiln_tdesc pd;
        bool with_packed = packed && kiln__dev(packed) == dev && packed->dtype == KILN_F32 &&
                           kiln_tensor_is_contiguous(packed);
        if (with_packed)
            kiln__desc(packed, &pd);
        kiln_rnn_operands o = {
            .x = &d[0],
            .w = &d[1],
            .r = &d[2],
            .bias = c[3] ? &d[3] : NULL,
            .h0 = c[4] ? &d[4] : NULL,
            .c0 = c[5] ? &d[5] : NULL,
            .peep = c[6] ? &d[6] : NULL,
            .y = &od[0],
            .yh = &od[1],
            .yc = out[2] ? &od[2]
                  : cell ? &cd
                         : NULL,
            .packed = with_packed ? &pd : NULL,
        };
        if (ok && be->rnn(kiln__qctx(dev), p, &o) < 0)
            ok = false;
        kiln_tensor_release(cell);
    }
    for (int i = 0; i < 7; i++)
        kiln_tensor_release(c[i]);
    if (!ok) {
        for (int i = 0; i < 3; i++)
            kiln_tensor_release(out[i]);
        return -1;
    }
    *y = kiln__ret(out[0]);
    *yh = kiln__ret(out[1]);
    if (yc)
        *yc = out[2] ? kiln__ret(out[2]) : NULL;
    return 1;
}
