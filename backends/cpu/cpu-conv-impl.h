/*
 * backends/cpu/cpu-conv-impl.h — what the convolution files share: the geometry of a call,
 * the fused epilogue as the kernels apply it, the direct path's stride-phased grid (which the
 * depthwise and packed paths reuse), and the helpers cpu-conv.c lends to
 * cpu-conv-packed.c, cpu-conv-depthwise.c and cpu-conv-backward.c.
 */
#ifndef KILN_CPU_CONV_IMPL_H
#define KILN_CPU_CONV_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "cpu-impl.h"

typedef struct geom {
    int64_t N, C, O, G, Cg, Og;
    int64_t in[3], out[3], k[3], st[3], pad[3], dil[3];
    int64_t isz, osz, ksz; /* products */
    bool direct;           /* 1x1, stride 1, no padding */
} geom;

/* A fused epilogue as the kernels apply it: res has the output's layout [N, O, S'...]
 * (contiguous f32) or is NULL; act is a kiln_epilogue_act. NULL when there is none. */
typedef struct conv_ep {
    const float *res;
    int act;
    float a, b;
    /* a fused program's epilogue (res NULL and act none then), applied to each tile as
     * it is stored by the direct path, and by one pass after the others */
    const kiln__cpu_chain *chain;
    bool chain_full; /* the chain reads a tensor laid out as the output */
} conv_ep;

/* the epilogue of a call that has none, so the tile loops need not test for NULL */
extern const conv_ep kiln__cpu_conv_no_ep;

#define DT_QMAX 48 /* the largest tile a kernel table may ask for (positions, channels) */
#define DT_OMAX 8

typedef struct dconv {
    int64_t N, Ci, Co;              /* batch, input and output channels */
    int64_t H, W, ph, pw, s;        /* input size, the padding on each side, stride */
    int64_t Hg, Wg, OH, OW, pp, cs; /* phase plane and output size, phase plane and channel size */
    int64_t nk, nob, ntile;
    int64_t to, tq; /* the table's tile: channels, positions */
    int64_t nobg;   /* jobs per tile: groups of channel blocks */
    bool inplace;   /* xp is x itself (1x1, stride 1, no padding) */
    bool rows;      /* weights read in place as [Co, Ci·nk] rows */
    bool wmajor;    /* jobs walk channel blocks outside, tiles inside */
    const float *x; /* [N, Ci, H, W] */
    float *xp;      /* [N, Ci, s·s, Hg, Wg] + slack */
    const float *w; /* the weights as given, for packing */
    int64_t sa, sc, skh, skw, KW;
    float *wpack;        /* [nob, Ci, nk, TO]; with rows, the last block's [TO, Ci·nk] */
    const int64_t *offs; /* [nk] */
    const float *bias;   /* [Co] or NULL */
    float *out;          /* [N, Co, OH, OW] */
    const conv_ep *ep;   /* applied to each run of outputs as it is stored */
    const kiln__cpu_kernels *k;
} dconv;

/* An operand as a kernel reads it: its pointer and the scratch buffer holding it, if any. */
typedef struct opnd {
    void *p;
    struct kiln_buffer *h;
} opnd;

/* cpu-conv.c */
void kiln__cpu_conv_geom_init(geom *g, const kiln_conv_params *p, const kiln_tdesc *x, const kiln_tdesc *w,
                              const kiln_tdesc *y);
void kiln__cpu_conv_im2col(kiln__cpu_ctx *ctx, const geom *g, void *col, void *img, bool dbl);
void kiln__cpu_conv_col2im(kiln__cpu_ctx *ctx, const geom *g, void *col, void *img, bool dbl);
void kiln__cpu_conv_direct_grid(dconv *d, int64_t H, int64_t W, int64_t ph, int64_t pw, int64_t s, int64_t KH,
                                int64_t KW, int64_t dh, int64_t dw);
void kiln__cpu_conv_direct_offsets(const dconv *d, int64_t *offs, int64_t KH, int64_t KW, int64_t dh, int64_t dw);
void kiln__cpu_conv_direct_pad(void *argp, int64_t b, int64_t e);
int64_t kiln__cpu_conv_direct_pad_grain(const dconv *d);
void kiln__cpu_conv_direct_job_run(kiln__cpu_ctx *ctx, int64_t n, kiln__cpu_range_fn fn, void *arg);
bool kiln__cpu_conv_direct_ok(const kiln__cpu_ctx *ctx, const geom *g, bool dbl);
bool kiln__cpu_conv_direct_run(kiln__cpu_ctx *ctx, int64_t N, int64_t Ci, int64_t Co, int64_t H, int64_t W,
                               int64_t ph, int64_t pw, int64_t KH, int64_t KW, int64_t dh, int64_t dw, int64_t s,
                               const float *x, const float *w, int64_t sa, int64_t sc, int64_t skh, int64_t skw,
                               const float *bias, float *out, const conv_ep *ep);
void *kiln__cpu_conv_out_buffer(kiln__cpu_ctx *ctx, const kiln_tdesc *d, kiln_dtype ct, opnd *o);
void kiln__cpu_conv_release(kiln__cpu_ctx *ctx, opnd *ops, int n);

/* cpu-conv-packed.c */
bool kiln__cpu_conv_packed_ok(const kiln__cpu_ctx *ctx, const geom *g, bool dbl, const kiln_tdesc *wpacked);
bool kiln__cpu_conv_packed_run(kiln__cpu_ctx *ctx, const geom *g, const float *x, const float *wpack,
                               const float *bias, float *out, const conv_ep *ep);

/* cpu-conv-depthwise.c */
bool kiln__cpu_conv_depthwise_ok(const kiln__cpu_ctx *ctx, const geom *g, bool dbl);
bool kiln__cpu_conv_depthwise_run(kiln__cpu_ctx *ctx, const geom *g, const float *x, const float *w,
                                  const float *bias, float *out, const conv_ep *ep);

#endif /* KILN_CPU_CONV_IMPL_H */
