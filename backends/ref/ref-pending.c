/*
 * backends/ref/ref-pending.c — primitives of the ref backend that are not written yet.
 * Each answers KILN_ENOTSUP with a message, so the front end gets an honest error
 * rather than a missing entry. This file shrinks as the real ones land.
 */
#include "ref-impl.h"

#define PENDING(name) ref_fail(KILN_ENOTSUP, "ref " name ": not implemented yet")

int kiln__ref_gather(void *ctx, const kiln_tdesc *out, const kiln_tdesc *in, int dim,
                     const kiln_tdesc *index) { return PENDING("gather"); }
int kiln__ref_scatter(void *ctx, const kiln_tdesc *out, int dim, const kiln_tdesc *index,
                      const kiln_tdesc *src, bool accumulate) { return PENDING("scatter"); }
int kiln__ref_index_select(void *ctx, const kiln_tdesc *out, const kiln_tdesc *in, int dim,
                           const kiln_tdesc *index) { return PENDING("index_select"); }
int kiln__ref_index_add(void *ctx, const kiln_tdesc *out, int dim, const kiln_tdesc *index,
                        const kiln_tdesc *src) { return PENDING("index_add"); }
int kiln__ref_pad(void *ctx, kiln_pad_mode mode, const kiln_tdesc *out, const kiln_tdesc *in,
                  const int64_t *pads, double value) { return PENDING("pad"); }
int kiln__ref_matmul(void *ctx, const kiln_tdesc *out, const kiln_tdesc *a, const kiln_tdesc *b)
{ return PENDING("matmul"); }
int kiln__ref_conv(void *ctx, const kiln_conv_params *p, const kiln_tdesc *out, const kiln_tdesc *x,
                   const kiln_tdesc *w, const kiln_tdesc *bias) { return PENDING("conv"); }
int kiln__ref_conv_backward_input(void *ctx, const kiln_conv_params *p, const kiln_tdesc *grad_x,
                                  const kiln_tdesc *grad_out, const kiln_tdesc *w)
{ return PENDING("conv_backward_input"); }
int kiln__ref_conv_backward_weight(void *ctx, const kiln_conv_params *p, const kiln_tdesc *grad_w,
                                   const kiln_tdesc *x, const kiln_tdesc *grad_out)
{ return PENDING("conv_backward_weight"); }
int kiln__ref_pool(void *ctx, const kiln_pool_params *p, const kiln_tdesc *out,
                   const kiln_tdesc *indices, const kiln_tdesc *x) { return PENDING("pool"); }
int kiln__ref_pool_backward(void *ctx, const kiln_pool_params *p, const kiln_tdesc *grad_x,
                            const kiln_tdesc *grad_out, const kiln_tdesc *indices)
{ return PENDING("pool_backward"); }
int kiln__ref_adaptive_avg_pool(void *ctx, int nspatial, const kiln_tdesc *out, const kiln_tdesc *x)
{ return PENDING("adaptive_avg_pool"); }
int kiln__ref_adaptive_avg_pool_backward(void *ctx, int nspatial, const kiln_tdesc *grad_x,
                                         const kiln_tdesc *grad_out)
{ return PENDING("adaptive_avg_pool_backward"); }
int kiln__ref_interpolate(void *ctx, kiln_interp_mode mode, bool align_corners,
                          const kiln_tdesc *out, const kiln_tdesc *x)
{ return PENDING("interpolate"); }
int kiln__ref_interpolate_backward(void *ctx, kiln_interp_mode mode, bool align_corners,
                                   const kiln_tdesc *grad_x, const kiln_tdesc *grad_out)
{ return PENDING("interpolate_backward"); }
int kiln__ref_softmax(void *ctx, bool log, const kiln_tdesc *out, const kiln_tdesc *in, int dim)
{ return PENDING("softmax"); }
int kiln__ref_layer_norm(void *ctx, const kiln_tdesc *out, const kiln_tdesc *mean,
                         const kiln_tdesc *rstd, const kiln_tdesc *x, const kiln_tdesc *weight,
                         const kiln_tdesc *bias, int64_t inner, double eps)
{ return PENDING("layer_norm"); }
