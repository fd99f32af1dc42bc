/*
 * backends/vulkan/vk-elementwise.c — unary, binary and where: one thread per output
 * element over merged strided views, the sub-op chosen by a specialization constant.
 */
#include <math.h>

#include "vk-impl.h"

typedef struct unary_params {
    kvk_view out, in;
    kvk_scalar alpha, beta, lo_i, hi_i;
    int32_t alpha_integral;
} unary_params;

int kvk_unary(void *vq, kiln_unary_op op, const kiln_tdesc *out, const kiln_tdesc *in, double alpha, double beta)
{
    kvk_queue *q = vq;
    /* unary.comp's bool results are the predicates' and sign's; for any other op it would
     * write false. The front end refuses those ops on bool (ops-elementwise.c); a direct
     * caller gets a refusal too, as from ref. */
    if (out->dtype == KILN_BOOL && op != KILN_UNARY_ISNAN && op != KILN_UNARY_ISINF &&
        op != KILN_UNARY_LOGICAL_NOT && !(op == KILN_UNARY_SIGN && in->dtype == KILN_BOOL))
        return kiln__error_set_code(KILN_ENOTSUP, "vulkan unary: %s is not supported from %s to bool",
                                    kiln__unary_name(op), kiln_dtype_name(in->dtype));
    unary_params p = {0};
    const kiln_tdesc *ops[2] = {out, in};
    if (kvk_views_of(&p.out, ops, 2, "unary") < 0)
        return KILN_EINVAL;
    if (p.out.numel == 0)
        return 0;
    p.alpha = kvk_scalar_of(alpha);
    p.beta = kvk_scalar_of(beta);
    p.lo_i = kvk_scalar_of(ceil(alpha));
    p.hi_i = kvk_scalar_of(floor(beta));
    p.alpha_integral = isfinite(alpha) && alpha == floor(alpha) && fabs(alpha) < 9007199254740992.0;
    kiln_dtype dts[2] = {out->dtype, in->dtype};
    char variant[16];
    uint32_t c[1] = {(uint32_t)op};
    kvk_spec spec = kvk_spec_1d(1, c);
    kiln_buffer *bufs[2] = {out->buf, in->buf};
    return kvk_dispatch(q, "unary", "unary", kvk_variant(variant, sizeof variant, 2, dts), &spec, bufs, 2, &p,
                        sizeof p, kvk_groups(p.out.numel, KVK_WG), 1, 1);
}

typedef struct binary_params {
    kvk_view out, a, b;
} binary_params;

int kvk_binary(void *vq, kiln_binary_op op, const kiln_tdesc *out, const kiln_tdesc *a, const kiln_tdesc *b)
{
    kvk_queue *q = vq;
    /* as ref: of the arithmetic ops only add, mul, maximum and minimum have a bool result
     * (the front end refuses the rest on bool) */
    if (out->dtype == KILN_BOOL && op <= KILN_BINARY_MINIMUM && op != KILN_BINARY_ADD && op != KILN_BINARY_MUL &&
        op != KILN_BINARY_MAXIMUM && op != KILN_BINARY_MINIMUM)
        return kiln__error_set_code(KILN_ENOTSUP, "vulkan binary: %s is not defined for bool",
                                    kiln__binary_name(op));
    binary_params p;
    const kiln_tdesc *ops[3] = {out, a, b};
    if (kvk_views_of(&p.out, ops, 3, "binary") < 0)
        return KILN_EINVAL;
    if (p.out.numel == 0)
        return 0;
    kiln_dtype dts[2] = {out->dtype, a->dtype};
    char variant[16];
    uint32_t c[1] = {(uint32_t)op};
    kvk_spec spec = kvk_spec_1d(1, c);
    kiln_buffer *bufs[3] = {out->buf, a->buf, b->buf};
    return kvk_dispatch(q, "binary", "binary", kvk_variant(variant, sizeof variant, 2, dts), &spec, bufs, 3, &p,
                        sizeof p, kvk_groups(p.out.numel, KVK_WG), 1, 1);
}

typedef struct where_params {
    kvk_view out, cond, a, b;
} where_params;

int kvk_where(void *vq, const kiln_tdesc *out, const kiln_tdesc *cond, const kiln_tdesc *a, const kiln_tdesc *b)
{
    kvk_queue *q = vq;
    where_params p;
    const kiln_tdesc *ops[4] = {out, cond, a, b};
    if (kvk_views_of(&p.out, ops, 4, "where") < 0)
        return KILN_EINVAL;
    if (p.out.numel == 0)
        return 0;
    kiln_dtype dts[2] = {out->dtype, cond->dtype};
    char variant[16];
    kiln_buffer *bufs[4] = {out->buf, cond->buf, a->buf, b->buf};
    return kvk_dispatch(q, "where", "where", kvk_variant(variant, sizeof variant, 2, dts), NULL, bufs, 4, &p,
                        sizeof p, kvk_groups(p.out.numel, KVK_WG), 1, 1);
}
