/*
 * backends/vulkan/vk-conv.c — convolution over 1-3 spatial dims with groups, stride,
 * padding and dilation: the forward (shaders/conv.comp, which also carries conv_fused's
 * residual and activation), the input gradient (conv-bwd-input.comp, also the forward of
 * a transposed convolution) and the weight gradient (conv-bwd-weight.comp), plus the
 * in-place epilogue entry (epilogue.comp).
 *
 * The three run as implicit GEMMs (conv-gemm.comp, the MODE constant picks which):
 * tiled through shared memory like matmul, each tile gathering its slice of the im2col
 * matrix from the image as it loads, so nothing the size of im2col is ever stored. A
 * problem whose GEMM has more column tiles than one launch holds takes the direct
 * kernels instead (one thread per output, or one workgroup per weight).
 *
 * Each gradient is computed by gathering (every element of the result sums the terms
 * that reach it) rather than by scattering with atomics: every element is written exactly
 * once, in a fixed order, so results do not depend on timing and the caller's buffer
 * needs no zeroing. The spatial dims are right-aligned into three, as the ref backend
 * does, so one kernel serves 1-, 2- and 3-d.
 */
#include <string.h>

#include "vk-nn-impl.h"

/* Mirrors the params blocks of conv.comp, conv-bwd-input.comp and conv-bwd-weight.comp
 * (the gradients name the three flag slots pad0..pad2 and leave them 0). */
typedef struct conv_params {
    int32_t N, C, O, Cg;
    int32_t Og, has_bias, has_res, act;
    int32_t in[3], out[3], k[3], stride[3], pad[3], dil[3];
    float alpha, beta;
    int32_t total, base;
    int32_t ksplit, kchunk; /* conv-gemm's weight gradient only */
} conv_params;

/* The backward kernels' block: the same geometry without alpha and beta. */
typedef struct conv_bwd_params {
    int32_t N, C, O, Cg;
    int32_t Og, unused[3];
    int32_t in[3], out[3], k[3], stride[3], pad[3], dil[3];
    int32_t total, base;
} conv_bwd_params;

/* Fill the geometry of c from x [N, C, S...], w [O, C/g, K...], y [N, O, S'...]. */
static int geometry(conv_params *c, const kiln_conv_params *p, const kiln_tdesc *x, const kiln_tdesc *w,
                    const kiln_tdesc *y, const char *op)
{
    int ns = p->nspatial;
    if (ns < 1 || ns > 3 || x->ndim != ns + 2 || w->ndim != ns + 2 || y->ndim != ns + 2 || p->groups < 1)
        return kiln__error_set("%s: %d spatial dims do not match the operands", op, ns), KILN_EINVAL;
    const kiln_tdesc *all[3] = {x, w, y};
    for (int i = 0; i < 3; i++) {
        int rc = kvknn_fits(kvk_numel(all[i]), op, "an operand's element count");
        if (rc < 0)
            return rc;
    }
    memset(c, 0, sizeof *c);
    c->N = (int32_t)x->shape[0];
    c->C = (int32_t)x->shape[1];
    c->O = (int32_t)w->shape[0];
    c->Cg = (int32_t)w->shape[1];
    c->Og = (int32_t)(w->shape[0] / p->groups);
    for (int d = 0; d < 3; d++) {
        int s = d - (3 - ns);
        c->in[d] = (int32_t)(s >= 0 ? x->shape[2 + s] : 1);
        c->out[d] = (int32_t)(s >= 0 ? y->shape[2 + s] : 1);
        c->k[d] = (int32_t)(s >= 0 ? w->shape[2 + s] : 1);
        c->stride[d] = (int32_t)(s >= 0 ? p->stride[s] : 1);
        c->pad[d] = (int32_t)(s >= 0 ? p->padding[s] : 0);
        c->dil[d] = (int32_t)(s >= 0 ? p->dilation[s] : 1);
        if (c->stride[d] < 1 || c->dil[d] < 1)
            return kiln__error_set("%s: stride and dilation must be positive", op), KILN_EINVAL;
    }
    return 0;
}

static void to_bwd(conv_bwd_params *b, const conv_params *c)
{
    memset(b, 0, sizeof *b);
    b->N = c->N, b->C = c->C, b->O = c->O, b->Cg = c->Cg, b->Og = c->Og;
    memcpy(b->in, c->in, sizeof b->in);
    memcpy(b->out, c->out, sizeof b->out);
    memcpy(b->k, c->k, sizeof b->k);
    memcpy(b->stride, c->stride, sizeof b->stride);
    memcpy(b->pad, c->pad, sizeof b->pad);
    memcpy(b->dil, c->dil, sizeof b->dil);
}

#define GEMM_BK 16

enum {
    MODE_FORWARD = 0,
    MODE_INPUT_GRAD = 1,
    MODE_WEIGHT_GRAD = 2
};

/* Launch conv-gemm in mode over bufs (out, A source, B source, bias, residual); 1 when
 * the GEMM does not fit one launch (the caller takes the direct kernel), else 0 / error. */
static int gemm(kvk_queue *q, const char *op, int mode, kiln_dtype dt, kiln_buffer *const *bufs,
                const void *params, size_t bytes, const conv_params *c)
{
    int64_t ks = (int64_t)c->k[0] * c->k[1] * c->k[2];
    int64_t is = (int64_t)c->in[0] * c->in[1] * c->in[2], os = (int64_t)c->out[0] * c->out[1] * c->out[2];
    int64_t rows = mode == MODE_INPUT_GRAD ? c->Cg : c->Og;
    int64_t cols = mode == MODE_FORWARD ? c->N * os : mode == MODE_INPUT_GRAD ? c->N * is : c->Cg * ks;
    int64_t groups = c->Og > 0 ? c->O / c->Og : 1;
    kvk_spec spec = {.n = 2, .c = {GEMM_BK, (uint32_t)mode}};
    kvknn_gemm_wg(rows, cols, spec.wg);
    int64_t tile_n = (int64_t)spec.wg[0] * 4, tile_m = (int64_t)spec.wg[1] * 4;
    int64_t tx = (cols + tile_n - 1) / tile_n, ty = (rows + tile_m - 1) / tile_m;
    if (tx > KVK_GROUPS_MAX || ty > KVK_GROUPS_MAX || groups > KVK_GROUPS_MAX)
        return 1;
    if (tx == 0 || ty == 0 || groups == 0)
        return 0;
    int64_t depth = mode == MODE_FORWARD ? c->Cg * ks : mode == MODE_INPUT_GRAD ? c->Og * ks : c->N * os;
    int rc;
    if (mode != MODE_WEIGHT_GRAD && (rc = kvk_loop_check(q, op, kvknn_gemm_steps(spec.wg, depth, GEMM_BK),
                                                         "a GEMM depth of %lld", (long long)depth)) < 0)
        return rc;
    if (mode != MODE_WEIGHT_GRAD)
        return kvk_dispatch(q, op, "conv-gemm", kvk_dtype_name(dt), &spec, bufs, 5, params, bytes, (uint32_t)tx,
                            (uint32_t)ty, (uint32_t)groups);
    /* The weight gradient sums over every image position (K = batch x output positions)
     * into a small result: few tiles, each walking a long K. Split K so the device has
     * about 128 workgroups, into partial sums that conv-splitk-sum adds up in order. */
    int64_t k = c->N * os, tiles = tx * ty * groups, splits = 1;
    if (tiles < 128 && k >= 4 * 256) {
        splits = 128 / tiles;
        if (splits > k / 256)
            splits = k / 256;
        if (splits > 64)
            splits = 64;
    }
    /* where the driver stops long shader loops (llvmpipe), as many slices as keep each
     * under its limit */
    uint32_t limit = q->d->feat.loop_limit;
    int64_t most = limit ? (int64_t)limit / 2 / kvknn_gemm_steps(spec.wg, GEMM_BK, GEMM_BK) * GEMM_BK : k;
    if (most > 0 && (k + splits - 1) / splits > most)
        splits = (k + most - 1) / most;
    conv_params p = *c;
    int64_t chunk = (k + splits - 1) / splits;
    chunk = (chunk + GEMM_BK - 1) / GEMM_BK * GEMM_BK;
    splits = (k + chunk - 1) / chunk;
    if (splits <= 1 || groups * splits > KVK_GROUPS_MAX)
        chunk = k;
    if ((rc = kvk_loop_check(q, op, kvknn_gemm_steps(spec.wg, chunk, GEMM_BK), "a GEMM depth of %lld",
                             (long long)chunk)) < 0)
        return rc;
    if (splits <= 1 || groups * splits > KVK_GROUPS_MAX) {
        p.ksplit = 1;
        return kvk_dispatch(q, op, "conv-gemm", kvk_dtype_name(dt), &spec, bufs, 5, &p, sizeof p, (uint32_t)tx,
                            (uint32_t)ty, (uint32_t)groups);
    }
    p.ksplit = (int32_t)splits;
    p.kchunk = (int32_t)chunk;
    int64_t n = (int64_t)c->O * c->Cg * ks;
    size_t acc = dt == KILN_F64 ? 8 : 4;
    rc = kvknn_fits(n * splits, op, "the split weight gradient's partial sums");
    if (rc < 0)
        return rc;
    kiln_buffer *part = kvk_buffer_alloc(q, (size_t)(n * splits) * acc);
    if (!part)
        return kiln__error_set_code(KILN_ENOMEM, "%s: no device memory for %lld partial sums", op,
                                    (long long)(n * splits));
    kiln_buffer *with_part[6] = {bufs[0], bufs[1], bufs[2], NULL, NULL, part};
    rc = kvk_dispatch(q, op, "conv-gemm", kvk_dtype_name(dt), &spec, with_part, 6, &p, sizeof p, (uint32_t)tx,
                      (uint32_t)ty, (uint32_t)(groups * splits));
    if (rc == 0) {
        int32_t sum_params[2] = {(int32_t)n, (int32_t)splits};
        kiln_buffer *sum_bufs[2] = {bufs[0], part};
        rc = kvknn_launch_items(q, op, "conv-splitk-sum", dt, sum_bufs, 2, sum_params, sizeof sum_params, n);
    }
    kvk_buffer_free(q, part);
    return rc;
}

static void release_all(kvk_queue *q, kvknn_operand *o, int n)
{
    for (int i = 0; i < n; i++)
        kvknn_release(q, &o[i]);
}

/* conv and conv_fused: ep NULL for a plain convolution. */
static int conv_forward(kvk_queue *q, const char *op, const kiln_conv_params *p, const kiln_tdesc *out,
                        const kiln_tdesc *x, const kiln_tdesc *w, const kiln_tdesc *bias, const kiln_epilogue *ep)
{
    kiln_dtype dt = out->dtype;
    if (!kvknn_float_ok(q->d, dt) || (ep && dt != KILN_F32))
        return kvknn_unsupported(op, dt);
    conv_params c;
    int rc = geometry(&c, p, x, w, out, op);
    if (rc < 0)
        return rc;
    int64_t total = kvk_numel(out);
    if (total == 0)
        return 0;
    kvknn_operand o[5];
    memset(o, 0, sizeof o);
    const kiln_tdesc *res = ep ? ep->residual : NULL;
    if ((rc = kvknn_output(q, &o[0], out, false, op)) < 0 || (rc = kvknn_input(q, &o[1], x, op)) < 0 ||
        (rc = kvknn_input(q, &o[2], w, op)) < 0 || (rc = kvknn_input(q, &o[3], bias, op)) < 0 ||
        (rc = kvknn_input(q, &o[4], res, op)) < 0) {
        release_all(q, o, 5);
        return rc;
    }
    c.has_bias = bias != NULL;
    c.has_res = res != NULL;
    c.act = ep ? (int32_t)ep->act : KILN_EPI_NONE;
    c.alpha = ep ? (float)ep->alpha : 0.0f;
    c.beta = ep ? (float)ep->beta : 0.0f;
    c.total = (int32_t)total;
    kiln_buffer *bias_buf = bias ? o[3].d.buf : NULL, *res_buf = res ? o[4].d.buf : NULL;
    kiln_buffer *bufs[5] = {o[0].d.buf, o[2].d.buf, o[1].d.buf, bias_buf, res_buf}; /* out, w, x */
    rc = gemm(q, op, MODE_FORWARD, dt, bufs, &c, sizeof c, &c);
    if (rc == 1) {
        kiln_buffer *direct[5] = {o[0].d.buf, o[1].d.buf, o[2].d.buf, bias_buf, res_buf};
        int64_t taps[3] = {c.k[0], c.k[1], c.k[2]};
        rc = kvk_loop_check(q, op, c.Cg * (1 + kvknn_nest_steps(taps)),
                            "%d input channels of a %d x %d x %d kernel", c.Cg, c.k[0], c.k[1], c.k[2]);
        if (rc == 0)
            rc = kvknn_launch_items(q, op, "conv", dt, direct, 5, &c, sizeof c, total);
    }
    if (rc == 0)
        rc = kvknn_output_done(q, &o[0], op);
    release_all(q, o, 5);
    return rc;
}

int kvk_conv(void *q, const kiln_conv_params *p, const kiln_tdesc *out, const kiln_tdesc *x, const kiln_tdesc *w,
             const kiln_tdesc *bias)
{
    return conv_forward(q, "conv", p, out, x, w, bias, NULL);
}

int kvk_conv_fused(void *q, const kiln_conv_params *p, const kiln_tdesc *out, const kiln_tdesc *x,
                   const kiln_tdesc *w, const kiln_tdesc *wpacked, const kiln_tdesc *bias, const kiln_epilogue *ep)
{
    (void)wpacked; /* no packed layout: conv_pack_size is not offered, so this is never set */
    return conv_forward(q, "conv_fused", p, out, x, w, bias, ep);
}

int kvk_conv_backward_input(void *vq, const kiln_conv_params *p, const kiln_tdesc *grad_x,
                            const kiln_tdesc *grad_out, const kiln_tdesc *w)
{
    kvk_queue *q = vq;
    const char *op = "conv_backward_input";
    kiln_dtype dt = grad_x->dtype;
    if (!kvknn_float_ok(q->d, dt))
        return kvknn_unsupported(op, dt);
    conv_params c;
    int rc = geometry(&c, p, grad_x, w, grad_out, op);
    if (rc < 0)
        return rc;
    int64_t total = kvk_numel(grad_x);
    if (total == 0)
        return 0;
    kvknn_operand o[3];
    memset(o, 0, sizeof o);
    if ((rc = kvknn_output(q, &o[0], grad_x, false, op)) < 0 || (rc = kvknn_input(q, &o[1], grad_out, op)) < 0 ||
        (rc = kvknn_input(q, &o[2], w, op)) < 0) {
        release_all(q, o, 3);
        return rc;
    }
    conv_bwd_params b;
    to_bwd(&b, &c);
    b.total = (int32_t)total;
    kiln_buffer *bufs[5] = {o[0].d.buf, o[2].d.buf, o[1].d.buf, NULL, NULL}; /* out, w, grad_out */
    c.total = (int32_t)total;
    rc = gemm(q, op, MODE_INPUT_GRAD, dt, bufs, &c, sizeof c, &c);
    if (rc == 1) {
        kiln_buffer *direct[3] = {o[0].d.buf, o[1].d.buf, o[2].d.buf};
        int64_t taps[3] = {c.k[0], c.k[1], c.k[2]};
        rc = kvk_loop_check(q, op, kvknn_nest_steps(taps) * (1 + (int64_t)c.Og),
                            "%d output channels of a %d x %d x %d kernel", c.Og, c.k[0], c.k[1], c.k[2]);
        if (rc == 0)
            rc = kvknn_launch_items(q, op, "conv-bwd-input", dt, direct, 3, &b, sizeof b, total);
    }
    if (rc == 0)
        rc = kvknn_output_done(q, &o[0], op);
    release_all(q, o, 3);
    return rc;
}

int kvk_conv_backward_weight(void *vq, const kiln_conv_params *p, const kiln_tdesc *grad_w, const kiln_tdesc *x,
                             const kiln_tdesc *grad_out)
{
    kvk_queue *q = vq;
    const char *op = "conv_backward_weight";
    kiln_dtype dt = grad_w->dtype;
    if (!kvknn_float_ok(q->d, dt))
        return kvknn_unsupported(op, dt);
    conv_params c;
    int rc = geometry(&c, p, x, grad_w, grad_out, op);
    if (rc < 0)
        return rc;
    int64_t total = kvk_numel(grad_w);
    if (total == 0)
        return 0;
    if (kvk_numel(grad_out) == 0) /* no term reaches any weight */
        return kvk_fill(q, grad_w, 0.0);
    kvknn_operand o[3];
    memset(o, 0, sizeof o);
    if ((rc = kvknn_output(q, &o[0], grad_w, false, op)) < 0 || (rc = kvknn_input(q, &o[1], x, op)) < 0 ||
        (rc = kvknn_input(q, &o[2], grad_out, op)) < 0) {
        release_all(q, o, 3);
        return rc;
    }
    conv_bwd_params b;
    to_bwd(&b, &c);
    b.total = (int32_t)total;
    kiln_buffer *bufs[5] = {o[0].d.buf, o[2].d.buf, o[1].d.buf, NULL, NULL}; /* out, grad_out, x */
    c.total = (int32_t)total;
    rc = gemm(q, op, MODE_WEIGHT_GRAD, dt, bufs, &c, sizeof c, &c);
    if (rc == 1) {
        kiln_buffer *direct[3] = {o[0].d.buf, o[1].d.buf, o[2].d.buf};
        int64_t work = (int64_t)c.N * c.out[0] * c.out[1] * c.out[2];
        rc = kvk_loop_check(q, op, (work + KVKNN_WG - 1) / KVKNN_WG + 8, "%lld batch positions", (long long)work);
        if (rc == 0)
            rc = kvknn_launch_groups(q, op, "conv-bwd-weight", dt, direct, 3, &b, sizeof b, total, 0, NULL);
    }
    if (rc == 0)
        rc = kvknn_output_done(q, &o[0], op);
    release_all(q, o, 3);
    return rc;
}

/* Mirrors epilogue.comp's params block. */
typedef struct epi_params {
    int32_t n, last, has_bias, has_res;
    int32_t act, base, pad0, pad1;
    float alpha, beta;
} epi_params;

int kvk_epilogue(void *vq, const kiln_tdesc *out, const kiln_epilogue *ep)
{
    kvk_queue *q = vq;
    const char *op = "epilogue";
    if (out->dtype != KILN_F32)
        return kvknn_unsupported(op, out->dtype);
    int64_t n = kvk_numel(out), last = out->ndim ? out->shape[out->ndim - 1] : 1;
    int rc = kvknn_fits(n, op, "the output's element count");
    if (rc < 0 || n == 0 || last == 0)
        return rc;
    kvknn_operand o[3];
    memset(o, 0, sizeof o);
    if ((rc = kvknn_output(q, &o[0], out, true, op)) < 0 || (rc = kvknn_input(q, &o[1], ep->bias, op)) < 0 ||
        (rc = kvknn_input(q, &o[2], ep->residual, op)) < 0) {
        release_all(q, o, 3);
        return rc;
    }
    epi_params e = {.n = (int32_t)n,
                    .last = (int32_t)last,
                    .has_bias = ep->bias != NULL,
                    .has_res = ep->residual != NULL,
                    .act = (int32_t)ep->act,
                    .alpha = (float)ep->alpha,
                    .beta = (float)ep->beta};
    kiln_buffer *bufs[3] = {o[0].d.buf, ep->bias ? o[1].d.buf : NULL, ep->residual ? o[2].d.buf : NULL};
    rc = kvknn_launch_items(q, op, "epilogue", KILN_F32, bufs, 3, &e, sizeof e, n);
    if (rc == 0)
        rc = kvknn_output_done(q, &o[0], op);
    release_all(q, o, 3);
    return rc;
}
