/*
 * onnx-ops-rnn.c — ONNX's LSTM and GRU.
 *
 * Every attribute the operators define is read, and one kiln does not implement is
 * refused by name rather than ignored: layout (0 and 1), direction, hidden_size (checked
 * against R), clip, linear_before_reset, input_forget (0 only) and activations (the
 * default set only: Sigmoid, Tanh, Tanh for LSTM and Sigmoid, Tanh for GRU, per
 * direction; activation_alpha/beta mean nothing to those). The optional inputs B,
 * sequence_lens, initial_h, initial_c and P (peepholes) are all supported.
 *
 * A layer first goes to the device's fused entry (engine/ops-rnn.c), which takes it when
 * the tensors are f32 and nothing records gradients, with W and R in the device's packed
 * form made once and kept on the node while they stay unchanged (weights_packed);
 * otherwise it is unrolled over time
 * with kiln ops, so autodiff runs through it like any other op. There the input
 * projection of every time step is one matmul up front ([T, B, I] x Wᵀ) and only the
 * recurrent product runs per step; rows past their sequence_lens are held by a mask.
 * Layouts follow ONNX: gates i, o, f, c for LSTM and z, r, h for GRU; X is [T, B, I]
 * (layout 0) or [B, T, I] (layout 1, transposed on the way in and out).
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kiln/autodiff.h"
#include "onnx-impl.h"
#include "rnn-impl.h"
#include "tensor-impl.h"

#define MAX_T 65536

enum { IN_X, IN_W, IN_R, IN_B, IN_SEQ, IN_H0, IN_C0, IN_P };

/* The checked layer: its parameters and its inputs in layout 0 (views, not owned). */
typedef struct rnn_layer {
    kiln_rnn_params p;
    int ng;
    kiln_tensor *x, *w, *r, *b, *h0, *c0, *peep;
    int64_t *lens;           /* B values, or NULL when every row runs all T steps */
} rnn_layer;

static const char *const LSTM_ATTRS[] = {"activation_alpha", "activation_beta", "activations", "clip", "direction",
                                         "hidden_size", "input_forget", "layout", NULL};
static const char *const GRU_ATTRS[] = {"activation_alpha", "activation_beta", "activations", "clip", "direction",
                                        "hidden_size", "layout", "linear_before_reset", NULL};

static kiln_tensor *opt(int nin, kiln_tensor *const *in, int i) { return nin > i ? in[i] : NULL; }

static bool shape_is(kiln_tensor *t, int ndim, const int64_t *want)
{
    if (kiln_tensor_ndim(t) != ndim)
        return false;
    for (int d = 0; d < ndim; d++)
        if (kiln_tensor_dim(t, d) != want[d])
            return false;
    return true;
}

static int check_attrs(const kiln__onnx_node *n, bool lstm, int ndir)
{
    const char *const *known = lstm ? LSTM_ATTRS : GRU_ATTRS;
    for (int i = 0; i < n->nattrs; i++) {
        int k = 0;
        while (known[k] && strcmp(known[k], n->attrs[i].name))
            k++;
        if (!known[k])
            return kiln__onnx_fail(n, "attribute '%s' not supported", n->attrs[i].name);
    }
    const kiln__onnx_attr *a = kiln__onnx_attr_get(n, "activations");
    if (a) {
        int per = lstm ? 3 : 2;
        if (a->nstrings != per * ndir)
            return kiln__onnx_fail(n, "attribute 'activations' lists %d functions; %d directions need %d",
                                   a->nstrings, ndir, per * ndir);
        for (int i = 0; i < a->nstrings; i++) {
            const char *want = i % per == 0 ? "Sigmoid" : "Tanh";
            if (strcasecmp(a->strings[i], want))
                return kiln__onnx_fail(n, "attribute 'activations': '%s' not supported (only the default %s)",
                                       a->strings[i], lstm ? "Sigmoid, Tanh, Tanh" : "Sigmoid, Tanh");
        }
    }
    if (kiln__onnx_attr_get(n, "clip") && !(kiln__onnx_attr_float(n, "clip", 0) > 0))
        return kiln__onnx_fail(n, "attribute 'clip' must be positive");
    if (lstm && kiln__onnx_attr_int(n, "input_forget", 0) != 0)
        return kiln__onnx_fail(n, "attribute 'input_forget' = %lld not supported",
                               (long long)kiln__onnx_attr_int(n, "input_forget", 0));
    int64_t layout = kiln__onnx_attr_int(n, "layout", 0);
    if (layout != 0 && layout != 1)
        return kiln__onnx_fail(n, "attribute 'layout' = %lld (0 or 1)", (long long)layout);
    int64_t lbr = kiln__onnx_attr_int(n, "linear_before_reset", 0);
    if (!lstm && lbr != 0 && lbr != 1)
        return kiln__onnx_fail(n, "attribute 'linear_before_reset' = %lld (0 or 1)", (long long)lbr);
    return 0;
}

/* Reads sequence_lens into L->lens (NULL when every row runs all T steps). */
static int read_lens(const kiln__onnx_node *n, kiln_tensor *s, rnn_layer *L)
{
    int64_t B = L->p.batch, T = L->p.steps;
    if (!shape_is(s, 1, &B))
        return kiln__onnx_fail(n, "input 'sequence_lens' must have shape [%lld]", (long long)B);
    if (kiln_tensor_dtype(s) != KILN_I32 && kiln_tensor_dtype(s) != KILN_I64)
        return kiln__onnx_fail(n, "input 'sequence_lens' must be int32");
    int64_t *lens = malloc((size_t)B * sizeof *lens);
    if (!lens)
        return kiln__onnx_fail(n, "out of memory");
    if (kiln__onnx_read_ints(n, s, lens, (int)B) < 0) {
        free(lens);
        return -1;
    }
    bool all = true;
    for (int64_t b = 0; b < B; b++) {
        if (lens[b] < 0 || lens[b] > T) {
            int rc = kiln__onnx_fail(n, "input 'sequence_lens'[%lld] = %lld is outside [0, %lld]", (long long)b,
                                     (long long)lens[b], (long long)T);
            free(lens);
            return rc;
        }
        all = all && lens[b] == T;
    }
    if (all) {
        free(lens);
        lens = NULL;
    }
    L->lens = lens;
    return 0;
}

static int check_layer(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, bool lstm, rnn_layer *L)
{
    memset(L, 0, sizeof *L);
    const char *dir = kiln__onnx_attr_str(n, "direction", "forward");
    int ndir = !strcmp(dir, "bidirectional") ? 2 : 1;
    if (strcmp(dir, "forward") && strcmp(dir, "reverse") && ndir != 2)
        return kiln__onnx_fail(n, "attribute 'direction' = '%s' (forward, reverse or bidirectional)", dir);
    if (check_attrs(n, lstm, ndir))
        return -1;
    L->ng = lstm ? 4 : 3;
    bool batch_first = kiln__onnx_attr_int(n, "layout", 0) == 1;
    kiln_tensor *X = in[IN_X], *W = in[IN_W], *R = in[IN_R];
    if (kiln_tensor_ndim(X) != 3 || kiln_tensor_ndim(W) != 3 || kiln_tensor_ndim(R) != 3)
        return kiln__onnx_fail(n, "X, W and R must be 3-D");
    int64_t H = kiln_tensor_dim(R, 2), G = L->ng * H;
    int64_t T = kiln_tensor_dim(X, batch_first ? 1 : 0), B = kiln_tensor_dim(X, batch_first ? 0 : 1);
    int64_t In = kiln_tensor_dim(X, 2);
    if (kiln__onnx_attr_get(n, "hidden_size") && kiln__onnx_attr_int(n, "hidden_size", 0) != H)
        return kiln__onnx_fail(n, "attribute 'hidden_size' = %lld but R is for %lld",
                               (long long)kiln__onnx_attr_int(n, "hidden_size", 0), (long long)H);
    if (H < 1 || !shape_is(R, 3, (const int64_t[]){ndir, G, H}))
        return kiln__onnx_fail(n, "R must have shape [%d, %lld, %lld]", ndir, (long long)G, (long long)H);
    if (kiln_tensor_dim(W, 0) != ndir || kiln_tensor_dim(W, 1) != G)
        return kiln__onnx_fail(n, "W must have shape [%d, %lld, input size]", ndir, (long long)G);
    if (kiln_tensor_dim(W, 2) != In)
        return kiln__onnx_fail(n, "X has %lld input features but W takes %lld", (long long)In,
                               (long long)kiln_tensor_dim(W, 2));
    if (T > MAX_T)
        return kiln__onnx_fail(n, "sequence too long (%lld steps)", (long long)T);
    kiln_tensor *Bias = opt(nin, in, IN_B), *S = opt(nin, in, IN_SEQ), *H0 = opt(nin, in, IN_H0);
    kiln_tensor *C0 = lstm ? opt(nin, in, IN_C0) : NULL, *P = lstm ? opt(nin, in, IN_P) : NULL;
    if (Bias && !shape_is(Bias, 2, (const int64_t[]){ndir, 2 * G}))
        return kiln__onnx_fail(n, "B must have shape [%d, %lld]", ndir, (long long)(2 * G));
    int64_t sdims[3] = {batch_first ? B : ndir, batch_first ? ndir : B, H};
    if ((H0 && !shape_is(H0, 3, sdims)) || (C0 && !shape_is(C0, 3, sdims)))
        return kiln__onnx_fail(n, "initial_h and initial_c must have shape [%lld, %lld, %lld]", (long long)sdims[0],
                               (long long)sdims[1], (long long)H);
    if (P && !shape_is(P, 2, (const int64_t[]){ndir, 3 * H}))
        return kiln__onnx_fail(n, "P must have shape [%d, %lld]", ndir, (long long)(3 * H));
    static const int swap[3] = {1, 0, 2};
    L->x = batch_first ? kiln_permute(X, 3, swap) : X;
    L->h0 = H0 && batch_first ? kiln_permute(H0, 3, swap) : H0;
    L->c0 = C0 && batch_first ? kiln_permute(C0, 3, swap) : C0;
    L->w = W;
    L->r = R;
    L->b = Bias;
    L->peep = P;
    L->p = (kiln_rnn_params){
        .cell = lstm ? KILN_RNN_LSTM : KILN_RNN_GRU, .ndir = ndir, .reverse = !strcmp(dir, "reverse"),
        .linear_before_reset = !lstm && kiln__onnx_attr_int(n, "linear_before_reset", 0) == 1,
        .clip = kiln__onnx_attr_float(n, "clip", 0), .steps = T, .batch = B, .input = In, .hidden = H,
    };
    if (!L->x || (H0 && !L->h0) || (C0 && !L->c0))
        return -1;
    if (S && read_lens(n, S, L))
        return -1;
    L->p.seq_lens = L->lens;
    return 0;
}

/* ------------------------------------------------------------------ composed path */

/* Row d of a [D, ...] tensor. */
static kiln_tensor *row(kiln_tensor *t, int d) { return kiln_squeeze(kiln_narrow(t, 0, d, 1), 0); }

static kiln_tensor *gate(kiln_tensor *g, int i, int64_t h) { return kiln_narrow(g, -1, i * h, h); }

static kiln_tensor *clipped(kiln_tensor *t, double clip) { return clip > 0 ? kiln_clamp(t, -clip, clip) : t; }

/* One direction over all steps; ys[t] gets each step's output, *h and *c the final state. */
static int run_direction(const kiln__onnx_node *n, const rnn_layer *L, int d, kiln_tensor *masks,
                         kiln_tensor **ys, kiln_tensor **hout, kiln_tensor **cout)
{
    const kiln_rnn_params *p = &L->p;
    bool lstm = p->cell == KILN_RNN_LSTM, lbr = p->linear_before_reset;
    bool reverse = p->ndir == 2 ? d == 1 : p->reverse;
    int64_t H = p->hidden, ng = L->ng;
    double clip = p->clip;
    kiln_dtype dt = kiln_tensor_dtype(L->x);
    kiln_tensor *Rt = kiln_transpose(row(L->r, d), 0, 1);
    kiln_tensor *xw = kiln_matmul(L->x, kiln_transpose(row(L->w, d), 0, 1)); /* [T, B, ng H] */
    kiln_tensor *rb = NULL;
    if (L->b) {
        kiln_tensor *b = row(L->b, d);
        kiln_tensor *wb = kiln_narrow(b, 0, 0, ng * H);
        rb = kiln_narrow(b, 0, ng * H, ng * H);
        if (lstm || !lbr) {
            xw = kiln_add(xw, kiln_add(wb, rb));
            rb = NULL;
        } else {
            xw = kiln_add(xw, wb);
        }
    }
    kiln_tensor *pi = NULL, *po = NULL, *pf = NULL;
    if (L->peep) {
        kiln_tensor *pd = row(L->peep, d);
        pi = gate(pd, 0, H), po = gate(pd, 1, H), pf = gate(pd, 2, H);
    }
    const int64_t state[2] = {p->batch, H};
    kiln_tensor *h = L->h0 ? row(L->h0, d) : kiln_zeros(n->dev, dt, 2, state);
    kiln_tensor *c = lstm && L->c0 ? row(L->c0, d) : kiln_zeros(n->dev, dt, 2, state);
    for (int64_t s = 0; s < p->steps; s++) {
        int64_t t = reverse ? p->steps - 1 - s : s;
        kiln_tensor *xt = kiln_squeeze(kiln_narrow(xw, 0, t, 1), 0);
        kiln_tensor *hn, *cn = c;
        if (lstm) {
            kiln_tensor *g = kiln_add(xt, kiln_matmul(h, Rt));
            kiln_tensor *gi = gate(g, 0, H), *go = gate(g, 1, H), *gf = gate(g, 2, H);
            if (pi) {
                gi = kiln_add(gi, kiln_mul(pi, c));
                gf = kiln_add(gf, kiln_mul(pf, c));
            }
            kiln_tensor *ig = kiln_sigmoid(clipped(gi, clip)), *fg = kiln_sigmoid(clipped(gf, clip));
            kiln_tensor *cg = kiln_tanh(clipped(gate(g, 3, H), clip));
            cn = kiln_add(kiln_mul(fg, c), kiln_mul(ig, cg));
            if (po)
                go = kiln_add(go, kiln_mul(po, cn));
            hn = kiln_mul(kiln_sigmoid(clipped(go, clip)), kiln_tanh(cn));
        } else {
            kiln_tensor *Rzr = kiln_narrow(Rt, 1, 0, 2 * H), *Rh = kiln_narrow(Rt, 1, 2 * H, H);
            kiln_tensor *zr = kiln_add(kiln_narrow(xt, -1, 0, 2 * H), kiln_matmul(h, Rzr));
            if (rb)
                zr = kiln_add(zr, kiln_narrow(rb, 0, 0, 2 * H));
            zr = kiln_sigmoid(clipped(zr, clip));
            kiln_tensor *z = gate(zr, 0, H), *r = gate(zr, 1, H), *pre;
            if (lbr) {
                kiln_tensor *rh = kiln_matmul(h, Rh);
                if (rb)
                    rh = kiln_add(rh, kiln_narrow(rb, 0, 2 * H, H));
                pre = kiln_add(gate(xt, 2, H), kiln_mul(r, rh));
            } else {
                pre = kiln_add(gate(xt, 2, H), kiln_matmul(kiln_mul(r, h), Rh));
            }
            kiln_tensor *nt = kiln_tanh(clipped(pre, clip));
            /* h = (1 - z) n + z h = n + z (h - n) */
            hn = kiln_add(nt, kiln_mul(z, kiln_sub(h, nt)));
        }
        if (masks) { /* rows past their length keep their state and output zeros */
            kiln_tensor *m = kiln_squeeze(kiln_narrow(masks, 0, t, 1), 0);
            ys[t] = kiln_mul(m, hn);
            h = kiln_add(h, kiln_mul(m, kiln_sub(hn, h)));
            if (lstm)
                c = kiln_add(c, kiln_mul(m, kiln_sub(cn, c)));
        } else {
            ys[t] = h = hn;
            c = cn;
        }
        if (!h || !ys[t] || !c)
            return -1;
    }
    *hout = h;
    *cout = c;
    return h && c ? 0 : -1;
}

static int run_composed(const kiln__onnx_node *n, const rnn_layer *L, kiln_tensor **y, kiln_tensor **yh,
                        kiln_tensor **yc)
{
    const kiln_rnn_params *p = &L->p;
    int64_t T = p->steps, B = p->batch;
    kiln_dtype dt = kiln_tensor_dtype(L->x);
    kiln_tensor *masks = NULL;
    if (L->lens) {
        float *m = malloc((size_t)(T * B + 1) * sizeof *m);
        if (!m)
            return kiln__onnx_fail(n, "out of memory");
        for (int64_t t = 0; t < T; t++)
            for (int64_t b = 0; b < B; b++)
                m[t * B + b] = t < L->lens[b] ? 1.0f : 0.0f;
        masks = kiln_cast(kiln_from_data(n->dev, KILN_F32, 3, (const int64_t[]){T, B, 1}, m,
                                         (size_t)(T * B) * sizeof *m), dt);
        free(m);
        if (!masks)
            return -1;
    }
    kiln_tensor *ys[2], *hs[2], *cs[2];
    kiln_tensor **steps = calloc((size_t)(T ? T : 1), sizeof *steps);
    if (!steps)
        return kiln__onnx_fail(n, "out of memory");
    for (int d = 0; d < p->ndir; d++) {
        if (run_direction(n, L, d, masks, steps, &hs[d], &cs[d])) {
            free(steps);
            return -1;
        }
        ys[d] = T ? kiln_stack(steps, (int)T, 0) : kiln_zeros(n->dev, dt, 3, (const int64_t[]){0, B, p->hidden});
    }
    free(steps);
    *y = kiln_stack(ys, p->ndir, 1);
    *yh = kiln_stack(hs, p->ndir, 0);
    if (yc)
        *yc = kiln_stack(cs, p->ndir, 0);
    return *y && *yh && (!yc || *yc) ? 0 : -1;
}

/* ------------------------------------------------------------------ the operators */

/* W and R in the device's packed form, made at the first run that can use it and kept
 * while both are the same storages at the same write versions (an optimizer step, a copy
 * into a weight, or a refresh of the weight-derived values makes it again); NULL while
 * either records gradients (the layer is then composed) or the device has no such form. */
static kiln_tensor *weights_packed(const kiln__onnx_node *n, const rnn_layer *L)
{
    kiln__onnx_pack *pk = n->pack;
    if (!pk || kiln_tensor_requires_grad(L->w) || kiln_tensor_requires_grad(L->r))
        return NULL;
    unsigned vw = atomic_load(&L->w->storage->version), vr = atomic_load(&L->r->storage->version);
    if (pk->tried && (pk->storage != L->w->storage || pk->version != vw || pk->storage2 != L->r->storage ||
                      pk->version2 != vr || (pk->t && kiln__dev(pk->t) != kiln__dev(L->w)))) {
        kiln_tensor_release(pk->t);
        *pk = (kiln__onnx_pack){0};
    }
    if (!pk->tried) {
        kiln_no_grad_begin();
        pk->t = kiln_keep(kiln__rnn_pack(&L->p, L->w, L->r));
        kiln_no_grad_end();
        pk->tried = true;
        pk->storage = L->w->storage, pk->version = vw;
        pk->storage2 = L->r->storage, pk->version2 = vr;
    }
    return pk->t;
}

static int run_rnn(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out, bool lstm)
{
    KILN__ONNX_NEED(3);
    if (lstm && nin > IN_P + 1)
        return kiln__onnx_fail(n, "has %d inputs (at most %d)", nin, IN_P + 1);
    rnn_layer L;
    if (check_layer(n, nin, in, lstm, &L)) {
        free(L.lens);
        return -1;
    }
    kiln_tensor *y = NULL, *yh = NULL, *yc = NULL;
    int rc = kiln__rnn(&L.p, L.x, L.w, L.r, L.b, L.h0, L.c0, L.peep, weights_packed(n, &L), &y, &yh,
                       lstm ? &yc : NULL);
    if (rc == 0)
        rc = run_composed(n, &L, &y, &yh, lstm ? &yc : NULL) ? -1 : 1;
    free(L.lens);
    if (rc < 0)
        return -1;
    if (kiln__onnx_attr_int(n, "layout", 0) == 1) { /* back to [B, T, D, H] and [B, D, H] */
        static const int yorder[4] = {2, 0, 1, 3}, sorder[3] = {1, 0, 2};
        y = kiln_permute(y, 4, yorder);
        yh = kiln_permute(yh, 3, sorder);
        if (yc)
            yc = kiln_permute(yc, 3, sorder);
        if (!y || !yh || (lstm && !yc))
            return -1;
    }
    out[0] = y;
    if (nout > 1)
        out[1] = yh;
    if (lstm && nout > 2)
        out[2] = yc;
    return 0;
}

static int op_lstm(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out)
{
    return run_rnn(n, nin, in, nout, out, true);
}

static int op_gru(const kiln__onnx_node *n, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out)
{
    return run_rnn(n, nin, in, nout, out, false);
}

const kiln__onnx_op kiln__onnx_ops_rnn[] = {
    {"LSTM", op_lstm},
    {"GRU", op_gru},
    {NULL, NULL},
};
