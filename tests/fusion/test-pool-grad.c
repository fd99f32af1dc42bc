/*
 * tests/fusion/test-pool-grad.c — a max pooling's gradient as the producer of a fused
 * group (KILN_FUSED_POOL_GRAD), and small independent calls that leave a group pending.
 *
 * Through the API: relu -> max pooling (1-d and 2-d; overlapping windows, padding,
 * dilation, ceil mode) -> a weighted sum, differentiated fused ("fused:counting:cpu") and
 * unfused ("counting:cpu"): the input's gradient must be equal to the bit, and the
 * pooling's gradient must have reached the kernels inside a fused program (no
 * pool_backward call below the decorator), with the relu's backward as its epilogue. The
 * same against ref within 1e-6. Through the cpu's fused_run: a program whose gradient is
 * also stored (computed straight into its output) must equal the pool_backward entry's.
 * A convolution's bias gradient before the pooling, fused and unfused.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "fused-program.h"
#include "fusion-test.h"
#include "kiln/autodiff.h"
#include "kiln/tensor.h"

static uint64_t calls_to(kiln_device *d, const char *entry)
{
    kiln_device_counters c;
    uint64_t n = 0;
    kiln_device_counters_get(d, &c, entry, &n);
    return n;
}

static float *download(kiln_tensor *t, int64_t *n)
{
    *n = kiln_tensor_numel(t);
    float *p = malloc((size_t)*n * sizeof(float));
    if (kiln_to_data(t, p, (size_t)*n * sizeof(float)) != 0) {
        free(p);
        return NULL;
    }
    return p;
}

typedef struct pool_case {
    int nspatial;
    int64_t size, kernel, stride, padding, dilation;
    bool ceil_mode;
} pool_case;

/* a.grad for loss = sum(max_pool(relu(a)) * w) on dev, or NULL */
static float *pool_grad(kiln_device *dev, const pool_case *pc, int64_t *n)
{
    kiln_scope_begin();
    kiln_generator g = kiln_generator_make(5 + (uint64_t)pc->size);
    int64_t shape[4] = {3, 4, pc->size, pc->size};
    int nd = pc->nspatial + 2;
    /* values on a coarse grid: ties inside windows exercise the forward's index choice */
    kiln_tensor *a = kiln_requires_grad(
        kiln_mul_scalar(kiln_round(kiln_mul_scalar(kiln_rand_normal(dev, KILN_F32, nd, shape, 0, 1, &g), 4)),
                        0.25),
        true);
    kiln_pool_opts o = {.ceil_mode = pc->ceil_mode};
    for (int d = 0; d < pc->nspatial; d++) {
        o.kernel[d] = pc->kernel;
        o.stride[d] = pc->stride;
        o.padding[d] = pc->padding;
        o.dilation[d] = pc->dilation;
    }
    kiln_tensor *r = kiln_relu(a);
    kiln_tensor *p = pc->nspatial == 1 ? kiln_max_pool1d(r, &o, NULL) : kiln_max_pool2d(r, &o, NULL);
    float *out = NULL;
    if (p) {
        kiln_tensor *w = kiln_rand_uniform(dev, KILN_F32, kiln_tensor_ndim(p), kiln_tensor_shape(p), -1, 1, &g);
        kiln_tensor *loss = kiln_sum(kiln_mul(p, w), 0, NULL, false);
        if (loss && kiln_backward(loss, NULL) == 0)
            out = download(kiln_grad(a), n);
    }
    kiln_scope_end();
    return out;
}

static void api_cases(void)
{
    static const pool_case cases[] = {
        {2, 28, 2, 2, 0, 1, false}, /* the CNN's: non-overlapping windows */
        {2, 17, 3, 2, 1, 1, false}, /* overlapping windows, padding */
        {2, 17, 3, 2, 1, 1, true},  /* ceil mode: partial windows */
        {2, 20, 2, 1, 0, 2, false}, /* dilation */
        {1, 60, 4, 3, 2, 1, false}, {2, 6, 1, 1, 0, 1, false},
    };
    kiln_device *fused = kiln_device_open("fused:counting:cpu?min_elements=0");
    kiln_device *plain = kiln_device_open("counting:cpu");
    kiln_device *ref = kiln_device_open("ref");
    CHECK(fused && plain && ref, "open the devices: %s", kiln_error());
    if (!fused || !plain || !ref)
        goto out;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const pool_case *pc = &cases[i];
        char what[160];
        snprintf(what, sizeof what, "max_pool%dd size %lld k%lld s%lld p%lld d%lld%s after relu", pc->nspatial,
                 (long long)pc->size, (long long)pc->kernel, (long long)pc->stride, (long long)pc->padding,
                 (long long)pc->dilation, pc->ceil_mode ? " ceil" : "");
        uint64_t pb0 = calls_to(fused, "pool_backward"), f0 = calls_to(fused, "fused");
        int64_t nf = 0, np = 0, nr = 0;
        float *gf = pool_grad(fused, pc, &nf), *gp = pool_grad(plain, pc, &np), *gr = pool_grad(ref, pc, &nr);
        CHECK(gf && gp && gr && nf == np && nf == nr, "%s: gradients on every device: %s", what, kiln_error());
        if (gf && gp && gr && nf == np && nf == nr) {
            int64_t bad = -1, far = -1;
            for (int64_t k = 0; k < nf; k++) {
                if (bad < 0 && memcmp(&gf[k], &gp[k], sizeof(float)))
                    bad = k;
                if (far < 0 && !(fabsf(gf[k] - gr[k]) <= 1e-6f * (1 + fabsf(gr[k]))))
                    far = k;
            }
            CHECK(bad < 0, "%s: element %lld fused %.9g, unfused %.9g", what, (long long)bad,
                  bad >= 0 ? gf[bad] : 0.0, bad >= 0 ? gp[bad] : 0.0);
            CHECK(far < 0, "%s: element %lld fused %.9g, ref %.9g", what, (long long)far, far >= 0 ? gf[far] : 0.0,
                  far >= 0 ? gr[far] : 0.0);
            double nonzero = 0;
            for (int64_t k = 0; k < nf; k++)
                nonzero += gf[k] != 0;
            CHECK(nonzero > 0, "%s: the gradient is not all zeros", what);
        }
        CHECK(calls_to(fused, "pool_backward") == pb0 && calls_to(fused, "fused") > f0,
              "%s: the pooling's gradient ran inside a fused program (pool_backward calls %llu -> %llu)", what,
              (unsigned long long)pb0, (unsigned long long)calls_to(fused, "pool_backward"));
        free(gf);
        free(gp);
        free(gr);
    }
out:
    kiln_device_close(fused);
    kiln_device_close(plain);
    kiln_device_close(ref);
}

/* The bias gradient of conv -> relu -> max pooling on dev (six images of eight
 * size x size planes), and the reduce calls that reached dev's kernels during the backward. */
static float *conv_bias_grad(kiln_device *dev, int64_t size, uint64_t *reduces)
{
    kiln_scope_begin();
    kiln_generator g = kiln_generator_make(17);
    kiln_tensor *x = kiln_rand_normal(dev, KILN_F32, 4, (int64_t[]){6, 3, size, size}, 0, 1, &g);
    kiln_tensor *w = kiln_requires_grad(kiln_rand_normal(dev, KILN_F32, 4, (int64_t[]){8, 3, 3, 3}, 0, 0.3, &g),
                                        true);
    kiln_tensor *b = kiln_requires_grad(kiln_rand_normal(dev, KILN_F32, 1, (int64_t[]){8}, 0, 0.1, &g), true);
    kiln_conv_opts co = {.padding = {1, 1}};
    kiln_pool_opts po = {.kernel = {2, 2}, .stride = {2, 2}};
    kiln_tensor *p = kiln_max_pool2d(kiln_relu(kiln_conv2d(x, w, b, &co)), &po, NULL);
    float *out = NULL;
    if (p) {
        kiln_tensor *v = kiln_rand_uniform(dev, KILN_F32, 4, kiln_tensor_shape(p), -1, 1, &g);
        kiln_tensor *loss = kiln_sum(kiln_mul(p, v), 0, NULL, false);
        if (loss && kiln_device_sync(dev) == 0) {
            uint64_t r0 = calls_to(dev, "reduce");
            int64_t n = 0;
            if (kiln_backward(loss, NULL) == 0)
                out = download(kiln_grad(b), &n);
            *reduces = calls_to(dev, "reduce") - r0;
        }
    }
    kiln_scope_end();
    return out;
}

/* A convolution's bias gradient (plane sums, then a batch sum) after a pooling gradient's
 * group: fused near unfused and ref, with as many reduce calls (the plane sums do not join
 * the group: see docs/architecture.md). Planes of 16x16 and 40x40. */
static void conv_bias_sums(void)
{
    kiln_device *fused = kiln_device_open("fused:counting:cpu?min_elements=0");
    kiln_device *plain = kiln_device_open("counting:cpu");
    kiln_device *ref = kiln_device_open("ref");
    CHECK(fused && plain && ref, "open the devices: %s", kiln_error());
    for (int64_t size = 16; fused && plain && ref && size <= 40; size += 24) {
        uint64_t rf = 0, rp = 0, rr = 0;
        float *bf = conv_bias_grad(fused, size, &rf), *bp = conv_bias_grad(plain, size, &rp);
        float *br = conv_bias_grad(ref, size, &rr);
        CHECK(bf && bp && br, "conv bias gradients (%lld): %s", (long long)size, kiln_error());
        for (int k = 0; bf && bp && br && k < 8; k++)
            CHECK(fabsf(bf[k] - bp[k]) <= 1e-5f * (1 + fabsf(bp[k])) &&
                      fabsf(bf[k] - br[k]) <= 1e-4f * (1 + fabsf(br[k])),
                  "conv bias gradient %d (%lld): fused %.9g, unfused %.9g, ref %.9g", k, (long long)size, bf[k],
                  bp[k], br[k]);
        CHECK(rp == 2 && rf == rp,
              "conv bias (%lld): reduce calls %llu fused, %llu unfused (plane sums, batch sum)", (long long)size,
              (unsigned long long)rf, (unsigned long long)rp);
        free(bf);
        free(bp);
        free(br);
    }
    kiln_device_close(fused);
    kiln_device_close(plain);
    kiln_device_close(ref);
}

/* Through the cpu's fused_run: grad_x stored and relu(grad_x) * 2 stored, against the
 * pool_backward entry into a zeroed buffer and the unfused relu and mul. */
static void stored_gradient(void)
{
    kiln_device *dev = kiln_device_open("cpu");
    CHECK(dev != NULL, "open cpu: %s", kiln_error());
    if (!dev)
        return;
    const kiln_backend_iface *be = kiln__device_iface(dev);
    void *ctx = kiln__device_ctx(dev);
    enum {
        N = 2,
        C = 3,
        H = 9,
        W = 8,
        OH = 4,
        OW = 4
    };
    int64_t n = N * C * H * W, no = N * C * OH * OW;
    float go[N * C * OH * OW];
    int64_t ix[N * C * OH * OW];
    uint64_t s = 77;
    for (int64_t i = 0; i < no; i++) {
        go[i] = (float)((double)test_rand(&s) / (double)(1ull << 31) * 4.0 - 2.0);
        /* any index within the plane, repeats included (an overlapping window's case) */
        ix[i] = (int64_t)(test_rand(&s) % (uint64_t)(H * W));
    }
    ix[5] = H * W + 3; /* outside its plane: skipped, never written */
    kiln_buffer *bgo = be->buffer_alloc(ctx, sizeof go), *bix = be->buffer_alloc(ctx, sizeof ix);
    kiln_buffer *bgx = be->buffer_alloc(ctx, (size_t)n * sizeof(float));
    kiln_buffer *bout = be->buffer_alloc(ctx, (size_t)n * sizeof(float));
    kiln_buffer *bref = be->buffer_alloc(ctx, (size_t)n * sizeof(float));
    be->buffer_upload(ctx, bgo, 0, go, sizeof go);
    be->buffer_upload(ctx, bix, 0, ix, sizeof ix);
    kiln_tdesc dgo = {.buf = bgo, .dtype = KILN_F32, .ndim = 4, .shape = {N, C, OH, OW}};
    kiln_tdesc dix = dgo;
    dix.buf = bix;
    dix.dtype = KILN_I64;
    kiln_tdesc dgx = {.buf = bgx, .dtype = KILN_F32, .ndim = 4, .shape = {N, C, H, W}};
    for (int d = 3, st = 1; d >= 0; d--) {
        dgo.strides[d] = dix.strides[d] = d == 3 ? 1 : dgo.strides[d + 1] * dgo.shape[d + 1];
        dgx.strides[d] = st;
        st *= (int)dgx.shape[d];
    }
    kiln_tdesc dout = dgx, dref = dgx;
    dout.buf = bout;
    dref.buf = bref;
    kiln_pool_params pp = {.nspatial = 2, .kind = KILN_POOL_MAX, .kernel = {2, 2}, .stride = {2, 2}};
    kiln_tdesc ins[2] = {dgo, dix}, outs[2] = {dgx, dout};
    kiln_fused_instr code[] = {
        {.code = KILN_FUSED_POOL_GRAD, .dst = 0, .arg = 0, .arg2 = 1, .arg3 = -1},
        {.code = KILN_FUSED_STORE, .a = 0, .arg = 0},
        {.code = KILN_FUSED_UNARY, .op = KILN_UNARY_RELU, .dst = 1, .a = 0},
        {.code = KILN_FUSED_CONST, .dst = 2, .alpha = 2},
        {.code = KILN_FUSED_BINARY, .op = KILN_BINARY_MUL, .dst = 3, .a = 1, .b = 2},
        {.code = KILN_FUSED_STORE, .a = 3, .arg = 1},
    };
    kiln_fused_program p = {.dtype = KILN_F32,
                            .n = n,
                            .ninputs = 2,
                            .noutputs = 2,
                            .ninstrs = 6,
                            .nregs = 4,
                            .inputs = ins,
                            .outputs = outs,
                            .instrs = code,
                            .pool = &pp,
                            .pool_grad_x = &dgx};
    be->fill(ctx, &dgx, 7); /* overwritten whole: the producer zeroes its planes itself */
    CHECK(be->fused_run(ctx, &p) == 0, "fused_run of a stored pooling gradient: %s", kiln_error());
    /* the entry takes the forward's indices on trust: give it an in-plane index carrying
     * nothing, which is what the skipped one contributed */
    ix[5] = 0;
    go[5] = 0;
    be->buffer_upload(ctx, bix, 0, ix, sizeof ix);
    be->buffer_upload(ctx, bgo, 0, go, sizeof go);
    be->fill(ctx, &dref, 0);
    be->pool_backward(ctx, &pp, &dref, &dgo, &dix);
    float *a = malloc((size_t)n * sizeof(float)), *b = malloc((size_t)n * sizeof(float)),
          *c = malloc((size_t)n * sizeof(float));
    be->buffer_download(ctx, bgx, 0, a, (size_t)n * sizeof(float));
    be->buffer_download(ctx, bout, 0, b, (size_t)n * sizeof(float));
    be->buffer_download(ctx, bref, 0, c, (size_t)n * sizeof(float));
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++) {
        float want = c[i] > 0 ? c[i] * 2 : 0;
        if (memcmp(&a[i], &c[i], sizeof(float)) || b[i] != want)
            bad = i;
    }
    CHECK(bad < 0, "stored pooling gradient: element %lld: grad %.9g (entry %.9g), epilogue %.9g", (long long)bad,
          bad >= 0 ? a[bad] : 0.0, bad >= 0 ? c[bad] : 0.0, bad >= 0 ? b[bad] : 0.0);
    free(a);
    free(b);
    free(c);
    be->buffer_free(ctx, bgo);
    be->buffer_free(ctx, bix);
    be->buffer_free(ctx, bgx);
    be->buffer_free(ctx, bout);
    be->buffer_free(ctx, bref);
    kiln_device_close(dev);
}

/* y = x * 3; a small independent call; z = tanh(y + x); a small read of y. The small
 * call runs at once and leaves the group pending, so the multiply, the add and the tanh
 * reach the kernels as one program (no binary call below the decorator), where a flush
 * would have replayed the lone multiply; the read of y flushes first and sees its value.
 * Values equal the unfused device's to the bit. */
static float *chain(kiln_device *dev, float *small_out)
{
    kiln_generator g = kiln_generator_make(3);
    kiln_tensor *x = kiln_rand_uniform(dev, KILN_F32, KILN_SHAPE(512, 512), -1, 1, &g);
    kiln_tensor *y = kiln_mul_scalar(x, 3);
    kiln_tensor *small = kiln_neg(kiln_full(dev, KILN_F32, KILN_SHAPE(4), 2.0));
    kiln_tensor *z = kiln_tanh(kiln_add(y, x));
    kiln_tensor *yrow = kiln_contiguous(kiln_slice(y, 0, 0, 1, 1));
    float *out = malloc(2 * 512 * sizeof(float));
    if (kiln_to_data(small, small_out, 4 * sizeof(float)) != 0 ||
        kiln_to_data(yrow, out, 512 * sizeof(float)) != 0 ||
        kiln_to_data(kiln_contiguous(kiln_slice(z, 0, 7, 8, 1)), out + 512, 512 * sizeof(float)) != 0) {
        free(out);
        return NULL;
    }
    return out;
}

static void independent_small_calls(void)
{
    kiln_device *dev = kiln_device_open("fused:counting:cpu");
    kiln_device *plain = kiln_device_open("cpu");
    CHECK(dev && plain, "open the devices: %s", kiln_error());
    if (!dev || !plain)
        return;
    kiln_scope_begin();
    kiln_device_sync(dev);
    uint64_t b0 = calls_to(dev, "binary"), f0 = calls_to(dev, "fused");
    float sf[4], sp[4];
    float *vf = chain(dev, sf), *vp = chain(plain, sp);
    CHECK(vf && vp, "the chains ran: %s", kiln_error());
    if (vf && vp)
        CHECK(!memcmp(vf, vp, 2 * 512 * sizeof(float)) && sf[0] == -2 && sf[3] == -2,
              "fused values equal unfused (small call %g)", (double)sf[0]);
    CHECK(calls_to(dev, "binary") == b0 && calls_to(dev, "fused") == f0 + 1,
          "the chain ran as one program around the small call (binary calls %llu, programs %llu)",
          (unsigned long long)(calls_to(dev, "binary") - b0), (unsigned long long)(calls_to(dev, "fused") - f0));
    free(vf);
    free(vp);
    kiln_scope_end();
    kiln_device_close(dev);
    kiln_device_close(plain);
}

void test_pool_grad(void)
{
    api_cases();
    conv_bias_sums();
    stored_gradient();
    independent_small_calls();
}
