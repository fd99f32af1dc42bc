/*
 * tests/fusion/test-wrapped.c — the fused decorator's set of wrapped buffers (host memory a
 * caller lent through buffer_wrap_host, an ONNX model's planned arena for one). A wrapped
 * buffer freed while a pending group still reads it must make the group run first and go at
 * once, its owner's release called before buffer_free returns: the owner may reuse the
 * memory then. On "fused:cpu" the cpu says which buffers are wrapped (buffer_is_wrapped);
 * over the counting decorator, which does not, the fused decorator keeps its own set:
 * hundreds of buffers, freed in a shuffled order, take it through its growth and through
 * deletions inside probe runs; each must still be recognised.
 */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "fusion-test.h"
#include "tensor-impl.h"

#define NWRAP 300
#define LEN 16

static int released[NWRAP];

static void release_one(void *ud)
{
    released[(int *)ud - released]++;
}

static kiln_tdesc flat16(kiln_buffer *b)
{
    kiln_tdesc d = {.buf = b, .offset = 0, .dtype = KILN_F32, .ndim = 1};
    d.shape[0] = LEN;
    d.strides[0] = 1;
    return d;
}

static void wrapped_on(const char *spec)
{
    kiln_device *dev = kiln_device_open(spec);
    CHECK(dev != NULL, "open %s: %s", spec, kiln_error());
    if (!dev)
        return;
    const kiln_backend_iface *be = kiln__device_iface(dev);
    void *ctx = kiln__device_ctx(dev);
    static float host[NWRAP][LEN];
    kiln_buffer *wrapped[NWRAP];
    memset(released, 0, sizeof released);
    for (int i = 0; i < NWRAP; i++) {
        for (int k = 0; k < LEN; k++)
            host[i][k] = (float)(i * LEN + k);
        wrapped[i] = be->buffer_wrap_host(ctx, host[i], sizeof host[i], release_one, &released[i]);
        CHECK(wrapped[i] != NULL, "wrap %d: %s", i, kiln_error());
        if (!wrapped[i])
            return;
    }
    int order[NWRAP];
    for (int i = 0; i < NWRAP; i++)
        order[i] = i;
    uint64_t seed = 7;
    for (int i = NWRAP - 1; i > 0; i--) {
        int j = test_pick(&seed, i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    int early = 0, wrong = 0;
    for (int n = 0; n < NWRAP; n++) {
        int i = order[n];
        if (n % 3 == 2) { /* not read by any group: goes at once as well */
            be->buffer_free(ctx, wrapped[i]);
            early += released[i] == 1;
            continue;
        }
        kiln_buffer *out = be->buffer_alloc(ctx, sizeof host[i]);
        kiln_tdesc od = flat16(out), id = flat16(wrapped[i]);
        CHECK(be->unary(ctx, KILN_UNARY_NEG, &od, &id, 0, 0) == 0, "neg of wrapped %d: %s", i, kiln_error());
        be->buffer_free(ctx, wrapped[i]);
        /* recognised as wrapped: the group ran and the owner got its memory back at once */
        early += released[i] == 1;
        float got[LEN];
        CHECK(be->buffer_download(ctx, out, 0, got, sizeof got) == 0, "download: %s", kiln_error());
        for (int k = 0; k < LEN; k++)
            wrong += got[k] != -(float)(i * LEN + k);
        be->buffer_free(ctx, out);
    }
    CHECK(early == NWRAP, "every wrapped buffer went back to its owner within its free (%d of %d)", early, NWRAP);
    CHECK(wrong == 0, "the groups read the lent memory before it went back (%d wrong values)", wrong);
    int twice = 0;
    for (int i = 0; i < NWRAP; i++)
        twice += released[i] != 1;
    CHECK(twice == 0, "each release ran exactly once (%d did not)", twice);
    kiln_device_close(dev);
}

void test_wrapped(void)
{
    wrapped_on("fused:cpu?min_elements=0");
    wrapped_on("fused:counting:cpu?min_elements=0");
}
