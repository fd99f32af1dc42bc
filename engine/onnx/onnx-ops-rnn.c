/*
 * onnx-ops-rnn.c — ONNX's LSTM and GRU, unrolled over time with kiln matmuls so that
 * autodiff runs through them like any other op. The input projection of every time step
 * is one matmul up front ([T, B, I] x Wᵀ); only the recurrent product runs per step.
 * Layouts follow ONNX: gates i, o, f, c for LSTM and z, r, h for GRU; X is [T, B, I]
 * (layout = 0); Y is [T, directions, B, H]. Peepholes, clip, sequence_lens shorter
 * than T and non-default activations are refused rather than silently ignored.
 */
#include <stdlib.h>
#include <string.h>

#include "onnx-impl.h"

#define NEED(k) do { if (nin < (k) || !in[(k) - 1]) return kiln__onnx_fail(n, "needs %d inputs", (k)); } while (0)
#define MAX_T 65536

static int check_common(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int ngates, int *ndir,
                        int64_t *hidden) {
    if (kiln__onnx_attr_int(n, "layout", 0) != 0) return kiln__onnx_fail(n, "layout=1 not supported");
    if (kiln__onnx_attr_get(n, "clip")) return kiln__onnx_fail(n, "clip not supported");
    if (kiln__onnx_attr_get(n, "activations")) {
        const kiln__onnx_attr *a = kiln__onnx_attr_get(n, "activations");
        for (int i = 0; i < a->nstrings; i++) {
            const char *want = (i % (ngates == 4 ? 3 : 2)) == 0 ? "Sigmoid" : "Tanh";
            if (strcmp(a->strings[i], want)) return kiln__onnx_fail(n, "activation '%s' not supported", a->strings[i]);
        }
    }
    const char *dir = kiln__onnx_attr_str(n, "direction", "forward");
    *ndir = !strcmp(dir, "bidirectional") ? 2 : 1;
    if (kiln_tensor_ndim(in[0]) != 3 || kiln_tensor_ndim(in[1]) != 3 || kiln_tensor_ndim(in[2]) != 3)
        return kiln__onnx_fail(n, "X, W and R must be 3-D");
    *hidden = kiln_tensor_dim(in[2], 2);
    if (kiln_tensor_dim(in[1], 0) != *ndir || kiln_tensor_dim(in[1], 1) != ngates * *hidden)
        return kiln__onnx_fail(n, "W has the wrong shape");
    if (kiln_tensor_dim(in[0], 0) > MAX_T) return kiln__onnx_fail(n, "sequence too long");
    if (nin > 4 && in[4]) {
        int64_t T = kiln_tensor_dim(in[0], 0);
        kiln_tensor *mn = kiln_min(in[4], 0, NULL, false);
        if (!mn || kiln_item(mn) != (double)T) return kiln__onnx_fail(n, "sequence_lens shorter than T not supported");
    }
    return 0;
}

/* Row d of a [D, ...] tensor. */
static kiln_tensor *row(kiln_tensor *t, int d) { return kiln_squeeze(kiln_narrow(t, 0, d, 1), 0); }

static kiln_tensor *gate(kiln_tensor *g, int i, int64_t h) { return kiln_narrow(g, -1, i * h, h); }

static int run_dirs(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out,
                    bool lstm) {
    int ndir = 1, ng = lstm ? 4 : 3;
    int64_t H = 0;
    if (check_common(n, nin, in, ng, &ndir, &H)) return -1;
    if (lstm && nin > 7 && in[7]) return kiln__onnx_fail(n, "peepholes not supported");
    bool lbr = !lstm && kiln__onnx_attr_int(n, "linear_before_reset", 0) != 0;
    kiln_tensor *X = in[0];
    int64_t T = kiln_tensor_dim(X, 0), B = kiln_tensor_dim(X, 1);
    const char *dir = kiln__onnx_attr_str(n, "direction", "forward");
    kiln_tensor *ys[2], *hs[2], *cs[2];
    kiln_tensor **steps = calloc((size_t)(T ? T : 1), sizeof *steps);
    if (!steps) return kiln__onnx_fail(n, "out of memory");
    for (int d = 0; d < ndir; d++) {
        bool reverse = (ndir == 2 && d == 1) || !strcmp(dir, "reverse");
        kiln_tensor *W = row(in[1], d), *R = row(in[2], d);
        kiln_tensor *Rt = kiln_transpose(R, 0, 1);
        kiln_tensor *xw = kiln_matmul(X, kiln_transpose(W, 0, 1));          /* [T, B, ng H] */
        kiln_tensor *rb = NULL;
        if (nin > 3 && in[3]) {
            kiln_tensor *b = row(in[3], d);
            kiln_tensor *wb = kiln_narrow(b, 0, 0, ng * H);
            rb = kiln_narrow(b, 0, ng * H, ng * H);
            if (lstm || !lbr) { xw = kiln_add(xw, kiln_add(wb, rb)); rb = NULL; }
            else xw = kiln_add(xw, wb);
        }
        kiln_tensor *h = nin > 5 && in[5] ? row(in[5], d) : kiln_zeros(n->dev, kiln_tensor_dtype(X), 2, (const int64_t[]){B, H});
        kiln_tensor *c = lstm && nin > 6 && in[6] ? row(in[6], d) : kiln_zeros(n->dev, kiln_tensor_dtype(X), 2, (const int64_t[]){B, H});
        for (int64_t s = 0; s < T; s++) {
            int64_t t = reverse ? T - 1 - s : s;
            kiln_tensor *xt = kiln_squeeze(kiln_narrow(xw, 0, t, 1), 0);
            if (lstm) {
                kiln_tensor *g = kiln_add(xt, kiln_matmul(h, Rt));
                kiln_tensor *ig = kiln_sigmoid(gate(g, 0, H)), *og = kiln_sigmoid(gate(g, 1, H));
                kiln_tensor *fg = kiln_sigmoid(gate(g, 2, H)), *cg = kiln_tanh(gate(g, 3, H));
                c = kiln_add(kiln_mul(fg, c), kiln_mul(ig, cg));
                h = kiln_mul(og, kiln_tanh(c));
            } else {
                kiln_tensor *Rz = kiln_narrow(Rt, 1, 0, 2 * H), *Rh = kiln_narrow(Rt, 1, 2 * H, H);
                kiln_tensor *zr = kiln_sigmoid(kiln_add(kiln_narrow(xt, -1, 0, 2 * H), kiln_add(kiln_matmul(h, Rz),
                                  rb ? kiln_narrow(rb, 0, 0, 2 * H) : kiln_zeros_like(kiln_narrow(xt, -1, 0, 2 * H)))));
                kiln_tensor *z = gate(zr, 0, H), *r = gate(zr, 1, H);
                kiln_tensor *hn;
                if (lbr) {
                    kiln_tensor *rh = kiln_matmul(h, Rh);
                    if (rb) rh = kiln_add(rh, kiln_narrow(rb, 0, 2 * H, H));
                    hn = kiln_tanh(kiln_add(gate(xt, 2, H), kiln_mul(r, rh)));
                } else {
                    hn = kiln_tanh(kiln_add(gate(xt, 2, H), kiln_matmul(kiln_mul(r, h), Rh)));
                }
                /* h = (1 - z) hn + z h = hn + z (h - hn) */
                h = kiln_add(hn, kiln_mul(z, kiln_sub(h, hn)));
            }
            if (!h) { free(steps); return -1; }
            steps[t] = h;
        }
        ys[d] = T ? kiln_stack(steps, (int)T, 0) : kiln_zeros(n->dev, kiln_tensor_dtype(X), 3, (const int64_t[]){0, B, H});
        hs[d] = h;
        cs[d] = c;
    }
    free(steps);
    out[0] = (kiln_stack(ys, ndir, 1));
    if (nout > 1) out[1] = (kiln_stack(hs, ndir, 0));
    if (lstm && nout > 2) out[2] = (kiln_stack(cs, ndir, 0));
    if (!out[0] || (nout > 1 && !out[1]) || (lstm && nout > 2 && !out[2])) return -1;
    return 0;
}

static int op_lstm(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    NEED(3);
    return run_dirs(n, nin, in, nout, out, true);
}

static int op_gru(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out) {
    NEED(3);
    return run_dirs(n, nin, in, nout, out, false);
}

const kiln__onnx_op kiln__onnx_ops_rnn[] = {
    {"LSTM", op_lstm},
    {"GRU", op_gru},
    {NULL, NULL},
};
