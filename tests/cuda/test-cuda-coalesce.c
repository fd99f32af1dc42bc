/*
 * tests/cuda/test-cuda-coalesce.c — kcu_coalesce (backends/cuda/cuda-kernels.h), the host-side
 * step before an elementwise, copy or reduction launch that merges the dims every operand
 * steps through alike. Needs no GPU: for random shapes with size-1 dims, permuted
 * (transposed) layouts, broadcast (stride 0) and negative strides, every flat index must name
 * the same element of every view before and after; contiguous views must become one dim, and a
 * head transpose of [B, S, H, D] three.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-kernels.h"

static int failures, checks;

#define CHECK(cond, ...)                                                                                          \
    do {                                                                                                          \
        checks++;                                                                                                 \
        if (!(cond)) {                                                                                            \
            failures++;                                                                                           \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                  \
            fprintf(stderr, __VA_ARGS__);                                                                         \
            fprintf(stderr, "\n");                                                                                \
        }                                                                                                         \
    } while (0)

/* The element offset of flat index i over `shape`'s dims with v's strides (the kernels'
 * kcu_offset_in, on the host). */
static int64_t offset_of(const kcu_view *shape, const kcu_view *v, int64_t i)
{
    int64_t off = v->offset;
    for (int d = shape->ndim - 1; d >= 0; d--) {
        int64_t n = shape->shape[d];
        off += (i % n) * v->strides[d];
        i /= n;
    }
    return off;
}

static int64_t numel(const kcu_view *v)
{
    int64_t n = 1;
    for (int d = 0; d < v->ndim; d++)
        n *= v->shape[d];
    return n;
}

/* A view of `shape` laid out in a random order of its dims (a permuted contiguous tensor),
 * with some dims broadcast (stride 0) or reversed (negative stride) when allowed. */
static kcu_view random_view(int ndim, const int64_t *shape, bool broadcast, unsigned *seed)
{
    kcu_view v;
    memset(&v, 0, sizeof v);
    v.ndim = ndim;
    v.offset = 1000;
    int order[KCU_MAX_DIMS];
    for (int d = 0; d < ndim; d++)
        order[d] = d;
    if (rand_r(seed) % 2)
        for (int d = ndim - 1; d > 0; d--) {
            int j = rand_r(seed) % (d + 1), t = order[d];
            order[d] = order[j];
            order[j] = t;
        }
    int64_t step = 1;
    for (int k = ndim - 1; k >= 0; k--) {
        int d = order[k];
        v.shape[d] = shape[d];
        v.strides[d] = step;
        step *= shape[d];
        if (broadcast && rand_r(seed) % 4 == 0)
            v.strides[d] = 0;
        else if (rand_r(seed) % 8 == 0)
            v.strides[d] = -v.strides[d];
    }
    return v;
}

static void random_cases(void)
{
    unsigned seed = 12345;
    int bad = 0;
    for (int c = 0; c < 2000; c++) {
        int ndim = rand_r(&seed) % 7, nv = 1 + rand_r(&seed) % 4;
        int64_t shape[KCU_MAX_DIMS];
        for (int d = 0; d < ndim; d++)
            shape[d] = 1 + rand_r(&seed) % 4;
        kcu_view before[4], after[4];
        kcu_view *ptrs[4] = {NULL, NULL, NULL, NULL};
        for (int k = 0; k < nv; k++) {
            /* the out view (k == 0) is laid out contiguously half of the time, as outputs are */
            before[k] = random_view(ndim, shape, k > 0, &seed);
            if (k == 0 && c % 2 == 0) {
                int64_t step = 1;
                for (int d = ndim - 1; d >= 0; d--) {
                    before[k].strides[d] = step;
                    step *= shape[d];
                }
            }
            after[k] = before[k];
            ptrs[k] = &after[k];
        }
        kcu_coalesce(ptrs, nv);
        int64_t n = numel(&before[0]);
        CHECK(numel(&after[0]) == n, "case %d: %lld elements before, %lld after", c, (long long)n,
              (long long)numel(&after[0]));
        for (int k = 0; k < nv && !bad; k++) {
            CHECK(after[k].ndim <= before[k].ndim, "case %d: view %d gained dims", c, k);
            for (int64_t i = 0; i < n; i++)
                if (offset_of(&before[0], &before[k], i) != offset_of(&after[0], &after[k], i)) {
                    CHECK(false,
                          "case %d (ndim %d, %d views): view %d, flat index %lld: offset %lld before, %lld "
                          "after",
                          c, ndim, nv, k, (long long)i, (long long)offset_of(&before[0], &before[k], i),
                          (long long)offset_of(&after[0], &after[k], i));
                    bad = 1;
                    break;
                }
        }
    }
    CHECK(!bad, "every flat index names the same element after coalescing");
}

static void known_cases(void)
{
    /* a contiguous [2, 1, 3, 4] and a contiguous partner: one dim of 24 */
    kcu_view a, b;
    memset(&a, 0, sizeof a);
    a.ndim = 4;
    int64_t sh[4] = {2, 1, 3, 4}, st[4] = {12, 12, 4, 1};
    memcpy(a.shape, sh, sizeof sh);
    memcpy(a.strides, st, sizeof st);
    b = a;
    kcu_view *vs[2] = {&a, &b};
    kcu_coalesce(vs, 2);
    CHECK(a.ndim == 1 && a.shape[0] == 24 && a.strides[0] == 1 && b.ndim == 1,
          "contiguous: one dim of 24 (%d dims)", a.ndim);
    /* out [B, H, S, D] contiguous, in = [B, S, H, D] contiguous read through a transpose of S and H */
    int64_t B = 8, S = 128, H = 12, D = 64;
    kcu_view out, in;
    memset(&out, 0, sizeof out);
    out.ndim = 4;
    int64_t osh[4] = {B, H, S, D}, ost[4] = {H * S * D, S * D, D, 1}, ist[4] = {S * H * D, D, H * D, 1};
    memcpy(out.shape, osh, sizeof osh);
    memcpy(out.strides, ost, sizeof ost);
    in = out;
    memcpy(in.strides, ist, sizeof ist);
    kcu_view *pair[2] = {&out, &in};
    kcu_view out0 = out, in0 = in;
    kcu_coalesce(pair, 2);
    CHECK(out.ndim == 4, "a head transpose keeps its four dims: %d", out.ndim);
    /* out [B, H, D, S] contiguous from in [B, H, S, D] with its last two dims transposed */
    out = out0;
    in = in0;
    int64_t tsh[4] = {B, H, D, S}, tost[4] = {H * D * S, D * S, S, 1}, tist[4] = {H * S * D, S * D, 1, D};
    memcpy(out.shape, tsh, sizeof tsh);
    memcpy(out.strides, tost, sizeof tost);
    memcpy(in.shape, tsh, sizeof tsh);
    memcpy(in.strides, tist, sizeof tist);
    kcu_coalesce(pair, 2);
    CHECK(out.ndim == 3 && out.shape[0] == B * H && in.strides[0] == S * D,
          "a transpose of the last two dims merges the batch dims: %d dims", out.ndim);
    /* a view broadcast along its rows beside a contiguous out keeps two */
    kcu_view o2, bias;
    memset(&o2, 0, sizeof o2);
    o2.ndim = 2;
    o2.shape[0] = 5;
    o2.shape[1] = 7;
    o2.strides[0] = 7;
    o2.strides[1] = 1;
    bias = o2;
    bias.strides[0] = 0;
    kcu_view *pb[2] = {&o2, &bias};
    kcu_coalesce(pb, 2);
    CHECK(o2.ndim == 2 && bias.strides[0] == 0, "a row broadcast keeps two dims: %d", o2.ndim);
    /* all dims of size 1: 0-d */
    kcu_view one;
    memset(&one, 0, sizeof one);
    one.ndim = 3;
    one.shape[0] = one.shape[1] = one.shape[2] = 1;
    kcu_view *po[1] = {&one};
    kcu_coalesce(po, 1);
    CHECK(one.ndim == 0, "a single element becomes 0-d: %d dims", one.ndim);
}

int main(void)
{
    random_cases();
    known_cases();
    printf("test-cuda-coalesce: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
