/*
 * backends/ref/ref-linalg.c — matmul and convolution (forward, input gradient, weight
 * gradient).
 *
 * matmul is the triple loop over each batch entry, accumulating in double (or wrapping
 * int64 for integer dtypes), with the batch entries walked by the shared iterator so
 * broadcast batch dims (0 strides) cost nothing.
 *
 * The three convolution primitives are one loop nest, conv_nest, that visits every
 * (output position, input channel, kernel tap) triple exactly once and differs only in
 * which of x, w, y it accumulates into. Running all three through the same nest is what
 * makes them obviously consistent: the input gradient is the exact adjoint of the
 * forward. Spatial dims are padded to three (1-, 2- and 3-d use the same code), the
 * operands are staged as contiguous double arrays, and the sizes of grad_x come from
 * grad_x itself, so a transposed convolution with output_padding is just a larger
 * grad_x whose extra rows no tap reaches (they stay 0).
 */
#include <stdlib.h>

#include "ref-impl.h"

/* ------------------------------------------------------------------- matmul */

int kiln__ref_matmul(void *ctx, const kiln_tdesc *out, const kiln_tdesc *a, const kiln_tdesc *b)
{
    if (out->dtype == KILN_BOOL || a->dtype == KILN_BOOL || b->dtype == KILN_BOOL)
        return ref_fail(KILN_ENOTSUP, "ref matmul: bool operands are not supported");
    int nd = out->ndim, nb = nd - 2;
    if (nd < 2 || a->ndim < 2 || b->ndim < 2)
        return ref_fail(KILN_EINVAL, "ref matmul: operands need at least 2 dims");
    int64_t M = out->shape[nd - 2], N = out->shape[nd - 1], K = a->shape[a->ndim - 1];
    int64_t am = a->strides[a->ndim - 2], ak = a->strides[a->ndim - 1];
    int64_t bk = b->strides[b->ndim - 2], bn = b->strides[b->ndim - 1];
    int64_t om = out->strides[nd - 2], on = out->strides[nd - 1];

    /* Batch strides aligned from the right; a missing batch dim broadcasts (stride 0). */
    int64_t sa[KILN_MAX_DIMS] = {0}, sb[KILN_MAX_DIMS] = {0};
    for (int d = 0; d < nb; d++) {
        int da = d - (nd - a->ndim), db = d - (nd - b->ndim);
        sa[d] = da >= 0 && a->shape[da] != 1 ? a->strides[da] : 0;
        sb[d] = db >= 0 && b->shape[db] != 1 ? b->strides[db] : 0;
    }
    ref_iter it;
    int64_t nbatch = ref_iter_init(&it, nb, out->shape);
    ref_iter_add_t(&it, out);
    ref_iter_add(&it, a->offset, sa);
    ref_iter_add(&it, b->offset, sb);
    bool fl = ref_is_float(out->dtype);
    unsigned char *ob = ref_data(out);
    const unsigned char *ab = ref_data(a), *bb = ref_data(b);
    for (int64_t t = 0; t < nbatch; t++, ref_iter_next(&it)) {
        for (int64_t m = 0; m < M; m++) {
            for (int64_t n = 0; n < N; n++) {
                double fs = 0;
                int64_t is = 0;
                for (int64_t k = 0; k < K; k++) {
                    int64_t ia = it.off[1] + m * am + k * ak, ib = it.off[2] + k * bk + n * bn;
                    if (fl)
                        fs += ref_getf(a->dtype, ab, ia) * ref_getf(b->dtype, bb, ib);
                    else
                        is = ref_wadd(is, ref_wmul(ref_geti(a->dtype, ab, ia),
                                                   ref_geti(b->dtype, bb, ib)));
                }
                if (fl)
                    ref_setf(out->dtype, ob, it.off[0] + m * om + n * on, fs);
                else
                    ref_seti(out->dtype, ob, it.off[0] + m * om + n * on, is);
            }
        }
    }
    return 0;
}

/* -------------------------------------------------------------- convolution */

/** Geometry with the spatial dims right-aligned into three (leading ones are size 1). */
typedef struct conv_geom {
    int64_t batch, cin, cout, cin_g, cout_g;
    int64_t in[3], out[3], k[3], stride[3], pad[3], dil[3];
    int64_t in_size, out_size, k_size;
} conv_geom;

static void geom_init(conv_geom *g, const kiln_conv_params *p, const kiln_tdesc *x,
                      const kiln_tdesc *w, const kiln_tdesc *y)
{
    int ns = p->nspatial;
    g->batch = x->shape[0];
    g->cin = x->shape[1];
    g->cout = w->shape[0];
    g->cin_g = w->shape[1];
    g->cout_g = g->cout / (p->groups > 0 ? p->groups : 1);
    g->in_size = g->out_size = g->k_size = 1;
    for (int d = 0; d < 3; d++) {
        int s = d - (3 - ns); /* index into the caller's spatial dims, < 0 when padded */
        g->in[d] = s >= 0 ? x->shape[2 + s] : 1;
        g->out[d] = s >= 0 ? y->shape[2 + s] : 1;
        g->k[d] = s >= 0 ? w->shape[2 + s] : 1;
        g->stride[d] = s >= 0 ? p->stride[s] : 1;
        g->pad[d] = s >= 0 ? p->padding[s] : 0;
        g->dil[d] = s >= 0 ? p->dilation[s] : 1;
        g->in_size *= g->in[d];
        g->out_size *= g->out[d];
        g->k_size *= g->k[d];
    }
}

enum conv_mode { CONV_FORWARD, CONV_GRAD_INPUT, CONV_GRAD_WEIGHT };

/**
 * Visit every (n, o, output position, c, tap) whose input position lies inside x and
 * accumulate into y (forward), x (input gradient) or w (weight gradient).
 */
static void conv_nest(enum conv_mode mode, const conv_geom *g, double *x, double *w, double *y)
{
    for (int64_t n = 0; n < g->batch; n++)
    for (int64_t o = 0; o < g->cout; o++) {
        int64_t grp = o / g->cout_g;
        for (int64_t od = 0; od < g->out[0]; od++)
        for (int64_t oh = 0; oh < g->out[1]; oh++)
        for (int64_t ow = 0; ow < g->out[2]; ow++) {
            int64_t yi = (n * g->cout + o) * g->out_size + (od * g->out[1] + oh) * g->out[2] + ow;
            for (int64_t c = 0; c < g->cin_g; c++) {
                int64_t xbase = (n * g->cin + grp * g->cin_g + c) * g->in_size;
                int64_t wbase = (o * g->cin_g + c) * g->k_size;
                for (int64_t kd = 0; kd < g->k[0]; kd++) {
                    int64_t id = od * g->stride[0] - g->pad[0] + kd * g->dil[0];
                    if (id < 0 || id >= g->in[0])
                        continue;
                    for (int64_t kh = 0; kh < g->k[1]; kh++) {
                        int64_t ih = oh * g->stride[1] - g->pad[1] + kh * g->dil[1];
                        if (ih < 0 || ih >= g->in[1])
                            continue;
                        for (int64_t kw = 0; kw < g->k[2]; kw++) {
                            int64_t iw = ow * g->stride[2] - g->pad[2] + kw * g->dil[2];
                            if (iw < 0 || iw >= g->in[2])
                                continue;
                            int64_t xi = xbase + (id * g->in[1] + ih) * g->in[2] + iw;
                            int64_t wi = wbase + (kd * g->k[1] + kh) * g->k[2] + kw;
                            switch (mode) {
                            case CONV_FORWARD: y[yi] += x[xi] * w[wi]; break;
                            case CONV_GRAD_INPUT: x[xi] += y[yi] * w[wi]; break;
                            case CONV_GRAD_WEIGHT: w[wi] += x[xi] * y[yi]; break;
                            }
                        }
                    }
                }
            }
        }
    }
}

/**
 * Stage the two known operands, zero the third, run the nest and store the third.
 * x, w, y are the descriptors in forward naming; `result` is the one being computed.
 */
static int conv_run(const char *op, enum conv_mode mode, const kiln_conv_params *p,
                    const kiln_tdesc *x, const kiln_tdesc *w, const kiln_tdesc *y,
                    const kiln_tdesc *bias)
{
    if (p->nspatial < 1 || p->nspatial > 3)
        return ref_fail(KILN_EINVAL, "ref %s: nspatial must be 1..3, got %d", op, p->nspatial);
    int rc;
    if ((rc = ref_require_float(op, x)) || (rc = ref_require_float(op, w)) ||
        (rc = ref_require_float(op, y)))
        return rc;
    conv_geom g;
    geom_init(&g, p, x, w, y);
    double *xs = mode == CONV_GRAD_INPUT ? ref_zeros(ref_numel(x), op) : ref_read_flat(x, op);
    double *ws = mode == CONV_GRAD_WEIGHT ? ref_zeros(ref_numel(w), op) : ref_read_flat(w, op);
    double *ys = mode == CONV_FORWARD ? ref_zeros(ref_numel(y), op) : ref_read_flat(y, op);
    double *bs = bias ? ref_read_flat(bias, op) : NULL;
    if (!xs || !ws || !ys || (bias && !bs)) {
        free(xs), free(ws), free(ys), free(bs);
        return KILN_ENOMEM;
    }
    conv_nest(mode, &g, xs, ws, ys);
    if (mode == CONV_FORWARD) {
        if (bs)
            for (int64_t n = 0; n < g.batch; n++)
                for (int64_t o = 0; o < g.cout; o++)
                    for (int64_t s = 0; s < g.out_size; s++)
                        ys[(n * g.cout + o) * g.out_size + s] += bs[o];
        ref_write_flat(y, ys);
    } else if (mode == CONV_GRAD_INPUT) {
        ref_write_flat(x, xs);
    } else {
        ref_write_flat(w, ws);
    }
    free(xs), free(ws), free(ys), free(bs);
    return 0;
}

int kiln__ref_conv(void *ctx, const kiln_conv_params *p, const kiln_tdesc *out, const kiln_tdesc *x,
                   const kiln_tdesc *w, const kiln_tdesc *bias)
{
    return conv_run("conv", CONV_FORWARD, p, x, w, out, bias);
}

int kiln__ref_conv_backward_input(void *ctx, const kiln_conv_params *p, const kiln_tdesc *grad_x,
                                  const kiln_tdesc *grad_out, const kiln_tdesc *w)
{
    return conv_run("conv_backward_input", CONV_GRAD_INPUT, p, grad_x, w, grad_out, NULL);
}

int kiln__ref_conv_backward_weight(void *ctx, const kiln_conv_params *p, const kiln_tdesc *grad_w,
                                   const kiln_tdesc *x, const kiln_tdesc *grad_out)
{
    return conv_run("conv_backward_weight", CONV_GRAD_WEIGHT, p, x, grad_w, grad_out, NULL);
}
