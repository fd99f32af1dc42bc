/*
 * backends/vulkan/vk-matmul.c — batched matmul (shaders/matmul.comp): out [B..., M, N]
 * = a [B..., M, K] · b [B..., K, N], with a and b read through their strides (a
 * transposed or sliced operand costs no copy) and batch dims broadcast by 0 strides.
 *
 * The kernel tiles out in blocks of up to 64 x 64 (a workgroup of up to 16 x 16 threads,
 * 4 x 4 outputs per thread; narrower where out is: kvknn_gemm_wg) and walks K through
 * shared memory in steps of 16; the workgroup size and the K step are specialization
 * constants, so a device with other sweet spots needs no new shader.
 * Floats accumulate in float (double for f64); i32 and i64 wrap as the reference does.
 *
 * A VK_KHR_cooperative_matrix path is not built: the glslc this tree is built with
 * (shaderc 2023.2 / glslang 11) does not know GL_KHR_cooperative_matrix, and a kernel
 * that cannot be compiled or tested here is not shipped. Devices that have the
 * extension run the tiled kernel like every other.
 */
#include <string.h>

#include "vk-nn-impl.h"

#define MM_RM 4 /* rows per thread: matmul.comp's RM */
#define MM_RN 4 /* columns per thread: RN */
#define MM_BK 16
#define MM_BATCH_DIMS 6

/* Mirrors matmul.comp's params block (std430, int32 only). */
typedef struct mm_params {
    int32_t M, N, K, nbatch_dims;
    int32_t a_off, a_sm, a_sk, b_off;
    int32_t b_sk, b_sn, out_off, batch_base;
    int32_t bshape[MM_BATCH_DIMS];
    int32_t a_sb[MM_BATCH_DIMS];
    int32_t b_sb[MM_BATCH_DIMS];
    int32_t k_begin, k_end, accumulate;
} mm_params;

int kvk_matmul(void *vq, const kiln_tdesc *out, const kiln_tdesc *a, const kiln_tdesc *b)
{
    kvk_queue *q = vq;
    const char *op = "matmul";
    kiln_dtype dt = out->dtype;
    if (!kvknn_float_ok(q->d, dt) && dt != KILN_I32 && dt != KILN_I64)
        return kvknn_unsupported(op, dt);
    int nd = out->ndim, nb = nd - 2;
    if (nd < 2 || a->ndim < 2 || b->ndim < 2 || nb > MM_BATCH_DIMS)
        return kiln__error_set("%s: operands need 2 to %d dims", op, MM_BATCH_DIMS + 2), KILN_EINVAL;
    kvk_view check;
    int rc;
    if ((rc = kvk_view_of(&check, out, op)) < 0 || (rc = kvk_view_of(&check, a, op)) < 0 ||
        (rc = kvk_view_of(&check, b, op)) < 0)
        return rc;
    mm_params p;
    memset(&p, 0, sizeof p);
    p.M = (int32_t)out->shape[nd - 2];
    p.N = (int32_t)out->shape[nd - 1];
    p.K = (int32_t)a->shape[a->ndim - 1];
    p.a_off = (int32_t)a->offset;
    p.a_sm = (int32_t)a->strides[a->ndim - 2];
    p.a_sk = (int32_t)a->strides[a->ndim - 1];
    p.b_off = (int32_t)b->offset;
    p.b_sk = (int32_t)b->strides[b->ndim - 2];
    p.b_sn = (int32_t)b->strides[b->ndim - 1];
    p.out_off = (int32_t)out->offset;
    p.nbatch_dims = nb;
    int64_t batch = 1;
    for (int d = 0; d < nb; d++) {
        int da = d - (nd - a->ndim), db = d - (nd - b->ndim);
        p.bshape[d] = (int32_t)out->shape[d];
        p.a_sb[d] = (int32_t)(da >= 0 && a->shape[da] != 1 ? a->strides[da] : 0);
        p.b_sb[d] = (int32_t)(db >= 0 && b->shape[db] != 1 ? b->strides[db] : 0);
        batch *= out->shape[d];
    }
    if (batch == 0 || p.M == 0 || p.N == 0)
        return 0;
    kvk_spec spec = {.n = 1, .c = {MM_BK}};
    kvknn_gemm_wg(p.M, p.N, spec.wg);
    int64_t tn = (int64_t)spec.wg[0] * MM_RN, tm = (int64_t)spec.wg[1] * MM_RM;
    int64_t tiles_n = (p.N + tn - 1) / tn, tiles_m = (p.M + tm - 1) / tm;
    if (tiles_n > KVK_GROUPS_MAX || tiles_m > KVK_GROUPS_MAX)
        return kiln__error_set("%s: a %d x %d result is more tiles than one launch holds", op, p.M, p.N),
               KILN_EINVAL;
    /* K in one dispatch, or where the driver stops long shader loops (llvmpipe) in as many
     * as keep each under its limit, run in turn, each adding to the sums before it */
    int64_t span = p.K > 0 ? p.K : 1;
    uint32_t limit = q->d->feat.loop_limit;
    if (limit && kvknn_gemm_steps(spec.wg, span, MM_BK) >= limit / 2)
        span = (int64_t)limit / 2 / kvknn_gemm_steps(spec.wg, MM_BK, MM_BK) * MM_BK;
    kiln_buffer *bufs[3] = {out->buf, a->buf, b->buf};
    for (int64_t k0 = 0; k0 == 0 || k0 < p.K; k0 += span) {
        p.k_begin = (int32_t)k0;
        p.k_end = (int32_t)(k0 + span < p.K ? k0 + span : p.K);
        p.accumulate = k0 > 0;
        for (int64_t b0 = 0; b0 < batch; b0 += KVK_GROUPS_MAX) {
            int64_t nz = batch - b0 < KVK_GROUPS_MAX ? batch - b0 : KVK_GROUPS_MAX;
            p.batch_base = (int32_t)b0;
            rc = kvk_dispatch(q, op, "matmul", kvk_dtype_name(dt), &spec, bufs, 3, &p, sizeof p, (uint32_t)tiles_n,
                              (uint32_t)tiles_m, (uint32_t)nz);
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}
