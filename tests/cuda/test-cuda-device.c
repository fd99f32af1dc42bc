/*
 * tests/cuda/test-cuda-device.c — the cuda backend end to end, against the cpu backend.
 *
 * Without a usable GPU it checks what a user sees there: kiln_device_open("cuda:0")
 * fails with a message naming the device and the reason, bad options are refused by
 * name, and the cpu backend keeps working; the device checks are then reported as
 * skipped. With a GPU (the bench/gpu/run script's machine) it checks: uploads and
 * downloads round-trip, elementwise, reductions, softmax, matmul in f32/f64/f16/bf16
 * (with a transposed operand and broadcast batches), TF32 off by default, Philox draws
 * equal to the cpu's, a convolution, an out-of-range gather reported at the next read
 * with the op's name, a steady loop that reaches cudaMalloc no more after its first
 * pass (the allocator's figures), two queues ordered by events, a recorded graph
 * launched on new inputs (against the cpu) and a recording broken by a host read (refused,
 * reported, the device still working), matmul with cuBLASLt's fused epilogues (bias, relu,
 * a residual, batches; an activation it lacks falls back) against the cpu, profile=on's
 * report of GPU time by entry, and (in a
 * process of its own) a kernel fault that marks the device lost.
 */
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda-impl.h"
#include "kiln/kiln.h"
#include "tensor-impl.h"

static int failures, checks;

#define CHECK(cond, ...)                                                                                          \
    do {                                                                                                          \
        checks++;                                                                                                 \
        if (!(cond)) {                                                                                            \
            failures++;                                                                                           \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                       \
            fprintf(stderr, __VA_ARGS__);                                                                         \
            fprintf(stderr, " (last error: %s)\n", kiln_error());                                                 \
        }                                                                                                         \
    } while (0)

static void test_absent(const char *why)
{
    CHECK(strstr(why, "cuda:0") != NULL, "the message names the device: %s", why);
#if KILN_CUDA_HIP /* libkiln built with -Dgpu_vendor=amd */
    CHECK(strstr(why, "no HIP (AMD GPU) device"), "the message says why: %s", why);
#else
    CHECK(strstr(why, "no CUDA device") || strstr(why, "compute capability"), "the message says why: %s", why);
#endif
    CHECK(strstr(kiln_backends_compiled(), "cuda") != NULL, "cuda is compiled in: %s", kiln_backends_compiled());
    kiln_device *d = kiln_device_open("cuda:0?tf32=maybe");
    CHECK(!d && strstr(kiln_error(), "tf32"), "a bad tf32 value is refused by name");
#if KILN_CUDA_HIP
    d = kiln_device_open("cuda:0?tf32=on");
    CHECK(!d && strstr(kiln_error(), "tf32"), "tf32=on is refused by name in a HIP build: %s", kiln_error());
#endif
    d = kiln_device_open("cuda:0?conv_workspace_mb=lots");
    CHECK(!d && strstr(kiln_error(), "conv_workspace_mb"), "a bad conv_workspace_mb is refused by name: %s",
          kiln_error());
    d = kiln_device_open("cuda:0?conv_workspace_mb=70000");
    CHECK(!d && strstr(kiln_error(), "conv_workspace_mb"), "conv_workspace_mb above 65536 is refused: %s",
          kiln_error());
    d = kiln_device_open("cuda:0?profile=sometimes");
    CHECK(!d && strstr(kiln_error(), "profile"), "a bad profile value is refused by name: %s", kiln_error());
    d = kiln_device_open("cuda:0?bogus=1");
    CHECK(!d && strstr(kiln_error(), "bogus"), "an unknown option is refused by name");
    kiln_device *cpu = kiln_device_open("cpu");
    CHECK(cpu != NULL, "cpu opens beside a missing GPU");
    if (cpu) {
        kiln_tensor *a = kiln_full(cpu, KILN_F32, 1, (int64_t[]){4}, 1.5);
        kiln_tensor *twice = kiln_add(a, a);
        kiln_tensor *s = kiln_sum(twice, KILN_ALL_DIMS, false);
        CHECK(s && kiln_item(s) == 12.0, "cpu still computes");
        kiln_tensor_release(s);
        kiln_tensor_release(twice);
        kiln_device *ref = kiln_device_open("ref");
        kiln_device_memory m;
        CHECK(ref && kiln_device_memory_get(ref, &m) == KILN_ENOTSUP && strstr(kiln_error(), "'ref'"),
              "ref keeps no memory figures, and says so naming the device");
        kiln_device_close(ref);
        CHECK(kiln_device_lost(cpu) == NULL && kiln_device_lost(NULL) == NULL, "a working device is not lost");
        CHECK(!kiln__graph_supported(cpu) && kiln__graph_capture_begin(cpu) == KILN_ENOTSUP &&
                  strstr(kiln_error(), "'cpu'") && strstr(kiln_error(), "does not record graphs"),
              "a backend without graph entries refuses a recording, naming the device");
        CHECK(kiln__graph_capture_end(cpu) == NULL && strstr(kiln_error(), "does not record graphs"),
              "and has none to end");
        kiln_tensor_release(a);
        kiln_device_close(cpu);
    }
}

/* ---------------------------------------------------------------- on a GPU */

static float *host_f32(kiln_tensor *t, int64_t *n)
{
    *n = kiln_tensor_numel(t);
    kiln_tensor *f = kiln_cast(t, KILN_F32);
    float *v = malloc((size_t)(*n > 0 ? *n : 1) * sizeof *v);
    if (!f || !v || kiln_to_data(f, v, (size_t)*n * sizeof *v) < 0) {
        free(v);
        v = NULL;
    }
    kiln_tensor_release(f);
    return v;
}

/* max |a - b| / (|b| + 1) over the elements of two tensors of one shape */
static double max_err(kiln_tensor *a, kiln_tensor *b)
{
    int64_t na = 0, nb = 0;
    float *x = a ? host_f32(a, &na) : NULL, *y = b ? host_f32(b, &nb) : NULL;
    double worst = (x && y && na == nb) ? 0.0 : INFINITY;
    for (int64_t i = 0; x && y && i < na && i < nb; i++) {
        double e = fabs((double)x[i] - (double)y[i]) / (fabs((double)y[i]) + 1.0);
        if (e > worst || isnan(e))
            worst = isnan(e) ? INFINITY : e;
    }
    free(x);
    free(y);
    return worst;
}

static kiln_tensor *on(kiln_tensor *t, kiln_device *dev)
{
    return kiln_to_device(t, dev);
}

static void test_gpu(kiln_device *gpu, kiln_device *cpu)
{
    kiln_generator g = kiln_generator_make(7);
    int64_t shape[] = {3, 257, 129};
    kiln_tensor *x_cpu = kiln_rand_normal(cpu, KILN_F32, 3, shape, 0, 1, &g);
    kiln_tensor *x = on(x_cpu, gpu);
    CHECK(x && max_err(x, x_cpu) == 0.0, "upload and download round-trip exactly");

    kiln_tensor *s = kiln_add(x, x), *s_cpu = kiln_add(x_cpu, x_cpu);
    CHECK(max_err(s, s_cpu) == 0.0, "add is exact");
    kiln_tensor *ge = kiln_gelu(x, false), *ge_cpu = kiln_gelu(x_cpu, false);
    CHECK(max_err(ge, ge_cpu) < 1e-6, "gelu: %g", max_err(ge, ge_cpu));
    kiln_tensor *sm = kiln_softmax(x, 2), *sm_cpu = kiln_softmax(x_cpu, 2);
    CHECK(max_err(sm, sm_cpu) < 1e-6, "softmax: %g", max_err(sm, sm_cpu));
    int dims[] = {1};
    kiln_tensor *su = kiln_sum(x, 1, dims, false), *su_cpu = kiln_sum(x_cpu, 1, dims, false);
    CHECK(max_err(su, su_cpu) < 1e-5, "sum over dim 1: %g", max_err(su, su_cpu));
    kiln_tensor_release(s);
    kiln_tensor_release(s_cpu);
    kiln_tensor_release(ge);
    kiln_tensor_release(ge_cpu);
    kiln_tensor_release(sm);
    kiln_tensor_release(sm_cpu);
    kiln_tensor_release(su);
    kiln_tensor_release(su_cpu);

    /* few outputs of long reductions, as a convolution's bias gradient sums [N, C, H, W] over
     * N, H and W: each output's sum is split among blocks (kcu_reduce_splits), plain and
     * through a transposed view, sum and mean, against the cpu */
    kiln_scope_begin();
    kiln_tensor *big_cpu = kiln_rand_normal(cpu, KILN_F32, 4, (int64_t[]){8, 3, 64, 64}, 0, 1, &g);
    kiln_tensor *big = on(big_cpu, gpu);
    int nhw[] = {0, 2, 3}, nwh[] = {0, 1, 2};
    CHECK(max_err(kiln_sum(big, 3, nhw, false), kiln_sum(big_cpu, 3, nhw, false)) < 1e-5,
          "a split sum over N, H, W matches the cpu");
    CHECK(max_err(kiln_mean(big, 3, nhw, true), kiln_mean(big_cpu, 3, nhw, true)) < 1e-6,
          "a split mean over N, H, W (keepdim) matches the cpu");
    kiln_tensor *big_t = kiln_transpose(big, 1, 3), *big_t_cpu = kiln_transpose(big_cpu, 1, 3);
    CHECK(max_err(kiln_sum(big_t, 3, nwh, false), kiln_sum(big_t_cpu, 3, nwh, false)) < 1e-5,
          "a split sum through a transposed view matches the cpu");
    kiln_scope_end();

    /* matmul: batched a [3, 65, 47] times a transposed b [33, 47]ᵀ, each dtype */
    kiln_dtype dts[] = {KILN_F32, KILN_F64, KILN_F16, KILN_BF16};
    double tol[] = {1e-5, 1e-12, 2e-2, 5e-2};
    for (int i = 0; i < 4; i++) {
        kiln_tensor *a_cpu = kiln_rand_uniform(cpu, dts[i], 3, (int64_t[]){3, 65, 47}, -1, 1, &g);
        kiln_tensor *bt_cpu = kiln_rand_uniform(cpu, dts[i], 2, (int64_t[]){33, 47}, -1, 1, &g);
        kiln_tensor *b_cpu = kiln_transpose(bt_cpu, 0, 1);
        kiln_tensor *a = on(a_cpu, gpu), *bt = on(bt_cpu, gpu);
        kiln_tensor *b = kiln_transpose(bt, 0, 1);
        kiln_tensor *m = kiln_matmul(a, b);
        /* the reference in f64 on the cpu */
        kiln_tensor *a64 = kiln_cast(a_cpu, KILN_F64), *b64 = kiln_cast(b_cpu, KILN_F64);
        kiln_tensor *m_ref = kiln_matmul(a64, b64);
        double e = max_err(m, m_ref);
        CHECK(m && e < tol[i], "matmul dtype %d: error %g", (int)dts[i], e);
        kiln_tensor *list[] = {a_cpu, bt_cpu, b_cpu, a, bt, b, m, a64, b64, m_ref};
        for (size_t j = 0; j < sizeof list / sizeof *list; j++)
            kiln_tensor_release(list[j]);
    }

    /* f32 matmul is exact f32 by default: a product whose exact result TF32 would round.
     * 1 + 2^-12 needs 13 mantissa bits; TF32 keeps 10. */
    {
        kiln_tensor *a = kiln_full(gpu, KILN_F32, 2, (int64_t[]){64, 64}, 1.0 + 1.0 / 4096);
        kiln_tensor *b = kiln_eye(gpu, KILN_F32, 64, 64);
        kiln_tensor *m = kiln_matmul(a, b);
        int64_t n = 0;
        float *v = m ? host_f32(m, &n) : NULL;
        CHECK(v && v[0] == (float)(1.0 + 1.0 / 4096), "f32 matmul keeps f32 precision: %.9g", v ? v[0] : 0.0);
        free(v);
        kiln_tensor_release(a);
        kiln_tensor_release(b);
        kiln_tensor_release(m);
    }

    /* Philox: the same generator state draws the same numbers on both devices */
    kiln_generator g1 = kiln_generator_make(1234), g2 = kiln_generator_make(1234);
    kiln_tensor *ru = kiln_rand_uniform(gpu, KILN_F32, 1, (int64_t[]){100003}, -2, 3, &g1);
    kiln_tensor *ru_cpu = kiln_rand_uniform(cpu, KILN_F32, 1, (int64_t[]){100003}, -2, 3, &g2);
    CHECK(max_err(ru, ru_cpu) == 0.0, "uniform draws equal the cpu's: %g", max_err(ru, ru_cpu));
    kiln_tensor *rn = kiln_rand_normal(gpu, KILN_F32, 1, (int64_t[]){100003}, 0, 1, &g1);
    kiln_tensor *rn_cpu = kiln_rand_normal(cpu, KILN_F32, 1, (int64_t[]){100003}, 0, 1, &g2);
    CHECK(max_err(rn, rn_cpu) < 1e-6, "normal draws equal the cpu's: %g", max_err(rn, rn_cpu));
    kiln_tensor_release(ru);
    kiln_tensor_release(ru_cpu);
    kiln_tensor_release(rn);
    kiln_tensor_release(rn_cpu);

    /* a convolution with bias, stride and padding */
    {
        kiln_tensor *cx_cpu = kiln_rand_normal(cpu, KILN_F32, 4, (int64_t[]){2, 3, 17, 19}, 0, 1, &g);
        kiln_tensor *cw_cpu = kiln_rand_normal(cpu, KILN_F32, 4, (int64_t[]){8, 3, 3, 3}, 0, 1, &g);
        kiln_tensor *cb_cpu = kiln_rand_normal(cpu, KILN_F32, 1, (int64_t[]){8}, 0, 1, &g);
        kiln_conv_opts o = {.stride = {2, 2}, .padding = {1, 1}};
        kiln_tensor *cx = on(cx_cpu, gpu), *cw = on(cw_cpu, gpu), *cb = on(cb_cpu, gpu);
        kiln_tensor *y = kiln_conv2d(cx, cw, cb, &o), *y_cpu = kiln_conv2d(cx_cpu, cw_cpu, cb_cpu, &o);
        CHECK(y && max_err(y, y_cpu) < 1e-4, "conv2d: %g", max_err(y, y_cpu));
        kiln_tensor *list[] = {cx_cpu, cw_cpu, cb_cpu, cx, cw, cb, y, y_cpu};
        for (size_t j = 0; j < sizeof list / sizeof *list; j++)
            kiln_tensor_release(list[j]);
    }

    /* an index out of range: reported at the next read, naming the op */
    {
        int64_t idx_host[] = {0, 5, 1};
        kiln_tensor *src = kiln_arange(gpu, KILN_F32, 0, 4, 1);
        kiln_tensor *idx = kiln_from_data(gpu, KILN_I64, 1, (int64_t[]){3}, idx_host, sizeof idx_host);
        kiln_tensor *gth = kiln_gather(src, 0, idx);
        float out[3];
        int rc = gth ? kiln_to_data(gth, out, sizeof out) : -1;
        CHECK(rc < 0 && strstr(kiln_error(), "gather") && strstr(kiln_error(), "5"),
              "an out-of-range gather index is reported with the op's name");
        kiln_tensor_release(src);
        kiln_tensor_release(idx);
        kiln_tensor_release(gth);
        kiln_tensor *ok = kiln_full(gpu, KILN_F32, 1, (int64_t[]){2}, 2.0);
        kiln_tensor *oks = ok ? kiln_sum(ok, KILN_ALL_DIMS, false) : NULL;
        CHECK(oks && kiln_item(oks) == 4.0, "the queue works after the error");
        kiln_tensor_release(oks);
        kiln_tensor_release(ok);
    }

    /* a steady loop reaches cudaMalloc only in its first pass */
    kiln_cuda_device *dev = kiln__device_ctx(gpu) ? ((kiln_cuda_queue *)kiln__device_ctx(gpu))->dev : NULL;
    uint64_t raw_after_first = 0;
    for (int it = 0; it < 5 && dev; it++) {
        kiln_scope_begin();
        kiln_tensor *h = kiln_gelu(
            kiln_add(kiln_matmul(x, kiln_transpose(x, 1, 2)), kiln_full(gpu, KILN_F32, 1, (int64_t[]){257}, 1)),
            false);
        CHECK(h && kiln_device_sync(gpu) == 0, "steady loop pass %d", it);
        kiln_scope_end();
        kiln_cuda_alloc_stats st;
        kiln__cuda_alloc_stats_get(&dev->alloc, &st);
        if (it == 0)
            raw_after_first = st.raw_allocs;
        else
            CHECK(st.raw_allocs == raw_after_first, "pass %d allocated from the device (%llu, was %llu)", it,
                  (unsigned long long)st.raw_allocs, (unsigned long long)raw_after_first);
    }
    kiln_device_memory m;
    CHECK(kiln_device_memory_get(gpu, &m) == 0, "the cuda device keeps memory figures");
    CHECK(m.in_use_bytes > 0 && m.reserved_bytes == m.in_use_bytes + m.cached_bytes &&
              m.peak_in_use_bytes >= m.in_use_bytes,
          "figures add up: in use %llu, cached %llu, reserved %llu, peak %llu", (unsigned long long)m.in_use_bytes,
          (unsigned long long)m.cached_bytes, (unsigned long long)m.reserved_bytes,
          (unsigned long long)m.peak_in_use_bytes);
    CHECK(m.device_allocs == raw_after_first && m.reuses > 0,
          "device allocations %llu (after the first pass %llu), "
          "reuses %llu",
          (unsigned long long)m.device_allocs, (unsigned long long)raw_after_first, (unsigned long long)m.reuses);
    CHECK(kiln_device_lost(gpu) == NULL, "the device works");
    kiln_tensor_release(x);
    kiln_tensor_release(x_cpu);
}

/* Two queues of one device: a tensor made on one and read on the other is ordered by the
 * engine's events, and a block freed on one queue and taken on the other is not reused
 * before the first queue's work on it has finished (the allocator's cross-stream order).
 * Without those, the sums below come out wrong, at least some of the time. */
static void test_queues(kiln_device *gpu)
{
    kiln_queue *q1 = kiln_queue_open(gpu), *q2 = kiln_queue_open(gpu);
    CHECK(q1 && q2, "two queues open");
    if (!q1 || !q2) {
        kiln_queue_close(q1);
        kiln_queue_close(q2);
        return;
    }
    int64_t n = 1 << 24;
    for (int i = 1; i <= 8; i++) {
        kiln_queue_use(gpu, q1);
        kiln_tensor *a = kiln_full(gpu, KILN_F32, 1, &n, (double)i);
        kiln_tensor *b1 = kiln_gelu(a, false), *b = kiln_gelu(b1, false); /* keeps q1 busy */
        kiln_tensor_release(b1);
        kiln_tensor *made = kiln_full(gpu, KILN_F32, 1, &n, 0.5 * i);
        kiln_tensor_release(a);
        kiln_tensor_release(b); /* parked on q1 while its kernels may still run */
        kiln_queue_use(gpu, q2);
        kiln_tensor *c = kiln_full(gpu, KILN_F32, 1, &n, 2.0 * i); /* may take a q1 block */
        kiln_tensor *sc = kiln_sum(c, KILN_ALL_DIMS, false);
        kiln_tensor *sm = kiln_sum(made, KILN_ALL_DIMS, false); /* made on q1, read on q2 */
        CHECK(sc && kiln_item(sc) == 2.0 * i * (double)n, "round %d: a fresh tensor on q2 sums to %g", i,
              sc ? kiln_item(sc) : 0.0);
        CHECK(sm && kiln_item(sm) == 0.5 * i * (double)n, "round %d: q1's tensor read on q2 sums to %g", i,
              sm ? kiln_item(sm) : 0.0);
        kiln_tensor_release(sc);
        kiln_tensor_release(sm);
        kiln_tensor_release(c);
        kiln_tensor_release(made);
    }
    kiln_queue_use(gpu, NULL);
    kiln_queue_close(q1);
    kiln_queue_close(q2);
}

/* A graph recorded from a matmul, a bias and a gelu, launched three times on new inputs
 * copied into the buffer it reads, each result against the cpu; then a recording that a
 * host read breaks. */
static void test_graphs(kiln_device *gpu, kiln_device *cpu)
{
    kiln_cuda_device *dev = ((kiln_cuda_queue *)kiln__device_ctx(gpu))->dev;
    kiln_generator g = kiln_generator_make(11);
    kiln_tensor *x_cpu = kiln_rand_normal(cpu, KILN_F32, 2, (int64_t[]){33, 70}, 0, 1, &g);
    kiln_tensor *w_cpu = kiln_rand_normal(cpu, KILN_F32, 2, (int64_t[]){70, 45}, 0, 1, &g);
    kiln_tensor *b_cpu = kiln_rand_normal(cpu, KILN_F32, 1, (int64_t[]){45}, 0, 1, &g);
    kiln_tensor *x = on(x_cpu, gpu), *w = on(w_cpu, gpu), *b = on(b_cpu, gpu), *y = NULL;
    CHECK(kiln__graph_supported(gpu), "cuda records graphs");
    CHECK(kiln_device_sync(gpu) == 0 && kiln__graph_capture_begin(gpu) == 0, "recording starts");
    kiln_scope_begin();
    y = kiln_keep(kiln_gelu(kiln_add(kiln_matmul(x, w), b), false));
    kiln_scope_end();
    kiln_cuda_alloc_stats st;
    kiln__cuda_alloc_stats_get(&dev->alloc, &st);
    CHECK(st.graph_pools == 1 && st.graph_bytes > 0, "the recording's buffers are the graph's (%zu bytes)",
          st.graph_bytes);
    kiln__graph *gr = kiln__graph_capture_end(gpu);
    CHECK(y && gr, "the recording makes a graph");
    for (int round = 0; gr && y && round < 3; round++) {
        kiln_tensor *xn_cpu = kiln_rand_normal(cpu, KILN_F32, 2, (int64_t[]){33, 70}, 0, 1 + round, &g);
        kiln_tensor *xn = on(xn_cpu, gpu);
        CHECK(xn && kiln__copy_into(x, xn, "test") == 0, "new inputs copied in");
        CHECK(kiln__graph_launch(gr) == 0, "launch %d", round);
        kiln_tensor *mm = kiln_matmul(xn_cpu, w_cpu), *ad = kiln_add(mm, b_cpu), *want = kiln_gelu(ad, false);
        double e = max_err(y, want);
        CHECK(e < 1e-4, "launch %d against the cpu: %g", round, e);
        kiln_tensor *list[] = {xn_cpu, xn, mm, ad, want};
        for (size_t j = 0; j < sizeof list / sizeof *list; j++)
            kiln_tensor_release(list[j]);
    }
    kiln_queue *other = kiln_queue_open(gpu);
    if (gr && other) {
        kiln_queue_use(gpu, other);
        CHECK(kiln__graph_launch(gr) < 0 && strstr(kiln_error(), "queue"),
              "a graph is launched only on the queue that recorded it");
        kiln_queue_use(gpu, NULL);
    }
    kiln_queue_close(other);
    kiln_tensor_release(y);
    kiln__graph_free(gr);
    kiln__cuda_alloc_stats_get(&dev->alloc, &st);
    CHECK(st.graph_pools == 0 && st.graph_bytes == 0, "freed graphs hold no memory (%zu bytes in %llu pools)",
          st.graph_bytes, (unsigned long long)st.graph_pools);

    /* an index check recorded in a graph: each launch checks the indices it finds, and a
     * bad one is reported by the next read, naming the op, as outside a graph */
    {
        int64_t good[] = {3, 0, 2}, bad[] = {1, 9, 0};
        kiln_tensor *src = kiln_arange(gpu, KILN_F32, 10, 14, 1); /* 10, 11, 12, 13 */
        kiln_tensor *idx = kiln_from_data(gpu, KILN_I64, 1, (int64_t[]){3}, good, sizeof good);
        kiln_tensor *picked = NULL;
        CHECK(src && idx && kiln_device_sync(gpu) == 0 && kiln__graph_capture_begin(gpu) == 0,
              "recording a gather starts");
        kiln_scope_begin();
        picked = kiln_keep(kiln_gather(src, 0, idx));
        kiln_scope_end();
        kiln__graph *gg = kiln__graph_capture_end(gpu);
        CHECK(picked && gg, "a gather with its index check records: %s", gg ? "" : kiln_error());
        float got[3] = {0};
        for (int round = 0; gg && picked && round < 3; round++) {
            int64_t *use = round == 1 ? bad : good;
            kiln_tensor *in = kiln_from_data(gpu, KILN_I64, 1, (int64_t[]){3}, use, 3 * sizeof *use);
            CHECK(in && kiln__copy_into(idx, in, "test") == 0 && kiln__graph_launch(gg) == 0, "launch %d", round);
            int rc = kiln_to_data(picked, got, sizeof got);
            if (round == 1)
                CHECK(rc < 0 && strstr(kiln_error(), "gather") && strstr(kiln_error(), "9"),
                      "an out-of-range index inside a launched graph is reported, naming the op");
            else
                CHECK(rc == 0 && got[0] == 10 + (float)use[0] && got[1] == 10 + (float)use[1] &&
                          got[2] == 10 + (float)use[2],
                      "launch %d gathers %g %g %g", round, got[0], got[1], got[2]);
            kiln_tensor_release(in);
        }
        kiln_tensor_release(picked);
        kiln__graph_free(gg);
        kiln_tensor_release(src);
        kiln_tensor_release(idx);
    }

    /* an upload while recording: its bytes as they were are uploaded by every launch */
    {
        float host[4] = {1, 2, 3, 4}, got[4] = {0};
        CHECK(kiln__graph_capture_begin(gpu) == 0, "recording an upload starts");
        kiln_scope_begin();
        kiln_tensor *twice = kiln_keep(
            kiln_mul_scalar(kiln_from_data(gpu, KILN_F32, 1, (int64_t[]){4}, host, sizeof host), 2.0));
        kiln_scope_end();
        host[0] = 100; /* changed after the upload: the recording kept its own copy */
        kiln__graph *gu = kiln__graph_capture_end(gpu);
        CHECK(twice && gu, "an upload records");
        for (int round = 0; gu && twice && round < 2; round++) {
            CHECK(kiln__graph_launch(gu) == 0 && kiln_to_data(twice, got, sizeof got) == 0 && got[0] == 2 &&
                      got[3] == 8,
                  "launch %d of a recorded upload gives %g .. %g", round, got[0], got[3]);
        }
        kiln_tensor_release(twice);
        kiln__graph_free(gu);
    }

    /* a host read while recording: refused, the recording broken and saying why */
    CHECK(kiln__graph_capture_begin(gpu) == 0, "a second recording starts");
    kiln_tensor *s = kiln_sum(x, KILN_ALL_DIMS, false);
    float v = 0;
    int rc = s ? kiln_to_data(s, &v, sizeof v) : 0;
    CHECK(rc < 0 && strstr(kiln_error(), "records a graph"), "a download while recording is refused");
    kiln_tensor_release(s);
    kiln__graph *broken = kiln__graph_capture_end(gpu);
    CHECK(!broken && strstr(kiln_error(), "buffer_download"), "the broken recording names the download");
    kiln__graph_free(broken);
    CHECK(kiln_device_lost(gpu) == NULL, "a broken recording does not lose the device");
    kiln_tensor *s2 = kiln_sum(x, KILN_ALL_DIMS, false), *s2_cpu = NULL;
    kiln_tensor *xc = kiln_to_device(x, cpu);
    s2_cpu = xc ? kiln_sum(xc, KILN_ALL_DIMS, false) : NULL;
    CHECK(s2 && s2_cpu && max_err(s2, s2_cpu) < 1e-5, "the queue computes after a broken recording");
    kiln__cuda_alloc_stats_get(&dev->alloc, &st);
    CHECK(st.graph_pools == 0 && st.graph_bytes == 0, "a broken recording's memory went back");
    kiln_tensor *list[] = {x_cpu, w_cpu, b_cpu, x, w, b, s2, s2_cpu, xc};
    for (size_t j = 0; j < sizeof list / sizeof *list; j++)
        kiln_tensor_release(list[j]);
}

/* kiln__matmul_epilogue on cuda against matmul then the epilogue on the cpu: the fused
 * entry takes bias, relu and a residual (cuBLASLt's epilogue and its C operand), and an
 * activation cuBLASLt lacks falls back to the epilogue kernel, with the same result. */
static void test_matmul_epilogue(kiln_device *gpu, kiln_device *cpu)
{
    kiln_generator g = kiln_generator_make(21);
    kiln_cuda_queue *q = kiln__device_ctx(gpu);
    struct {
        const char *name;
        int batch; /* 0: plain matrices */
        bool bias, residual, weight_t;
        kiln_epilogue_act act;
        bool fused; /* cuBLASLt applies it */
    } cases[] = {
        {"bias+relu", 0, true, false, false, KILN_EPI_RELU, true},
        {"bias", 0, true, false, true, KILN_EPI_NONE, true},
        {"relu", 0, false, false, false, KILN_EPI_RELU, true},
        {"residual+bias+relu", 0, true, true, false, KILN_EPI_RELU, true},
        {"batched bias+residual", 3, true, true, false, KILN_EPI_NONE, true},
        {"bias+sigmoid (falls back)", 0, true, false, false, KILN_EPI_SIGMOID, false},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int64_t m = 37, k = 53, n = 29;
        int nd = cases[c].batch ? 3 : 2;
        int64_t as[3] = {cases[c].batch, m, k}, os[3] = {cases[c].batch, m, n};
        kiln_scope_begin();
        kiln_tensor *a_cpu = kiln_rand_normal(cpu, KILN_F32, nd, cases[c].batch ? as : as + 1, 0, 1, &g);
        kiln_tensor *w_cpu = cases[c].weight_t
                                 ? kiln_transpose(kiln_rand_normal(cpu, KILN_F32, 2, (int64_t[]){n, k}, 0, 1, &g),
                                                  0, 1)
                                 : kiln_rand_normal(cpu, KILN_F32, 2, (int64_t[]){k, n}, 0, 1, &g);
        kiln_tensor *b_cpu = cases[c].bias ? kiln_rand_normal(cpu, KILN_F32, 1, &n, 0, 1, &g) : NULL;
        kiln_tensor *r_cpu = cases[c].residual
                                 ? kiln_rand_normal(cpu, KILN_F32, nd, cases[c].batch ? os : os + 1, 0, 1, &g)
                                 : NULL;
        kiln_tensor *a = on(a_cpu, gpu), *b = b_cpu ? on(b_cpu, gpu) : NULL, *r = r_cpu ? on(r_cpu, gpu) : NULL;
        kiln_tensor *w = cases[c].weight_t ? kiln_transpose(on(kiln_transpose(w_cpu, 0, 1), gpu), 0, 1)
                                           : on(w_cpu, gpu);
        q->last_op = NULL;
        kiln_tensor *y = kiln__matmul_epilogue(a, w, b, r, cases[c].act, 0, 0);
        bool took_fused = q->last_op && !strcmp(q->last_op, "matmul_fused");
        kiln_tensor *want = kiln__epilogue(kiln_matmul(a_cpu, w_cpu), b_cpu, r_cpu, cases[c].act, 0, 0);
        double e = max_err(y, want);
        CHECK(y && e < 1e-5, "matmul epilogue %s against the cpu: %g", cases[c].name, e);
        CHECK(took_fused == cases[c].fused, "matmul epilogue %s: cuBLASLt %s it (last op %s)", cases[c].name,
              took_fused ? "fused" : "did not fuse", q->last_op ? q->last_op : "none");
        /* the second call of a geometry takes the kept algorithm: the same result, bit for bit */
        kiln_tensor *again = kiln__matmul_epilogue(a, w, b, r, cases[c].act, 0, 0);
        CHECK(again && max_err(again, y) == 0.0, "matmul epilogue %s again (kept algorithm): the same result",
              cases[c].name);
        kiln_scope_end();
    }
    CHECK(q->dev->lt_cache != NULL, "cuBLASLt's choices are kept per device");
    /* a product large enough that its candidates are timed (cuda-blas.c, lt_tune): the
     * winner computes the same product as the cpu, plain and with a bias */
    kiln_scope_begin();
    kiln_tensor *a_cpu = kiln_rand_normal(cpu, KILN_F32, 2, (int64_t[]){512, 384}, 0, 1, &g);
    kiln_tensor *w_cpu = kiln_rand_normal(cpu, KILN_F32, 2, (int64_t[]){384, 640}, 0, 1, &g);
    kiln_tensor *b_cpu = kiln_rand_normal(cpu, KILN_F32, 1, (int64_t[]){640}, 0, 1, &g);
    kiln_tensor *a = on(a_cpu, gpu), *w = on(w_cpu, gpu), *b = on(b_cpu, gpu);
    double e1 = max_err(kiln_matmul(a, w), kiln_matmul(a_cpu, w_cpu));
    double e2 = max_err(kiln__matmul_epilogue(a, w, b, NULL, KILN_EPI_NONE, 0, 0),
                        kiln__epilogue(kiln_matmul(a_cpu, w_cpu), b_cpu, NULL, KILN_EPI_NONE, 0, 0));
    /* f32 sums of 384 terms in another order than the cpu's: within 1e-4 of |b| + 1 */
    CHECK(e1 < 1e-4 && e2 < 1e-4, "a timed product and its biased form match the cpu: %g, %g", e1, e2);
    /* such a product with an epilogue runs either through cuBLASLt's epilogue or as the plain
     * product and the epilogue kernel (timed once, the faster kept): each way, then the timed
     * choice, against the cpu, and the kept choice again bit for bit */
    kiln_tensor *want = kiln__epilogue(kiln_matmul(a_cpu, w_cpu), b_cpu, NULL, KILN_EPI_RELU, 0, 0);
    const int ways[] = {KILN_CUDA_EP_FUSED, KILN_CUDA_EP_SEPARATE, KILN_CUDA_EP_TIMED};
    const char *way_names[] = {"cuBLASLt's epilogue", "the product, then the epilogue kernel", "the timed way"};
    for (int i = 0; i < 3; i++) {
        q->dev->ep_way_forced = ways[i];
        q->last_op = NULL;
        kiln_tensor *y = kiln__matmul_epilogue(a, w, b, NULL, KILN_EPI_RELU, 0, 0);
        double e = max_err(y, want);
        CHECK(y && e < 1e-4, "a large product with bias and relu by %s matches the cpu: %g", way_names[i], e);
        CHECK(q->last_op && !strcmp(q->last_op, "matmul_fused"), "%s runs as matmul_fused (last op %s)",
              way_names[i], q->last_op ? q->last_op : "none");
    }
    CHECK(q->dev->ep_ways != NULL, "the timed way is kept per device");
    kiln_tensor *y1 = kiln__matmul_epilogue(a, w, b, NULL, KILN_EPI_RELU, 0, 0);
    kiln_tensor *y2 = kiln__matmul_epilogue(a, w, b, NULL, KILN_EPI_RELU, 0, 0);
    CHECK(y1 && y2 && max_err(y1, y2) == 0.0, "the kept way gives the same result again");
    kiln_scope_end();
}

/* profile=on: the queue's GPU time by entry goes to stderr when the device closes, each
 * entry with the number of calls it made (read back from a file stderr was pointed at). */
static void test_profile(void)
{
    char path[] = "/tmp/kiln-cuda-profile-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "a file for stderr");
    if (fd < 0)
        return;
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    kiln_device *gpu = kiln_device_open("cuda:0?fusion=off&profile=on");
    bool opened = gpu != NULL;
    double got = 0;
    if (gpu) {
        kiln_tensor *a = kiln_full(gpu, KILN_F32, 2, (int64_t[]){64, 64}, 0.5);
        kiln_tensor *p = kiln_matmul(a, a);
        kiln_tensor *s = p ? kiln_add(p, a) : NULL;
        kiln_tensor *total = s ? kiln_sum(s, KILN_ALL_DIMS, false) : NULL;
        got = total ? kiln_item(total) : 0;
        kiln_tensor_release(total);
        kiln_tensor_release(s);
        kiln_tensor_release(p);
        kiln_tensor_release(a);
        kiln_device_close(gpu);
    }
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    CHECK(opened, "cuda:0?profile=on opens");
    /* every element of a@a is 64 * 0.25 = 16; plus a (0.5) */
    CHECK(got == 64 * 64 * 16.5, "the profiled device computes: %g", got);
    char text[4096] = {0};
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = 0;
    if (f)
        fclose(f);
    unlink(path);
    const char *mm = strstr(text, "cuda profile cuda:0: matmul "),
               *bin = strstr(text, "cuda profile cuda:0: binary ");
    long mm_calls = 0, bin_calls = 0;
    if (mm)
        sscanf(mm + strlen("cuda profile cuda:0: matmul "), " %ld calls", &mm_calls);
    if (bin)
        sscanf(bin + strlen("cuda profile cuda:0: binary "), " %ld calls", &bin_calls);
    CHECK(strstr(text, "GPU time by entry") != NULL, "the report's header is printed: %s", text);
    CHECK(mm_calls == 1, "one matmul call is counted (%ld): %s", mm_calls, text);
    CHECK(bin_calls == 1, "the one add is counted (%ld): %s", bin_calls, text);
}

/* Run in a process of its own (--lose-device), since it ruins the CUDA context: a kernel
 * writing at an invalid address is a sticky fault, which the next sync reports naming
 * the op queued last, and after which the device refuses work with the original cause. */
static int lose_device(void)
{
    kiln_device *gpu = kiln_device_open("cuda:0?fusion=off");
    if (!gpu) {
        fprintf(stderr, "lose-device: %s\n", kiln_error());
        return 1;
    }
    kiln_cuda_queue *q = kiln__device_ctx(gpu);
    kcu_view bad;
    memset(&bad, 0, sizeof bad);
    bad.base = (void *)(uintptr_t)0x1000; /* never a device allocation */
    bad.ndim = 1;
    bad.shape[0] = 1 << 20;
    bad.strides[0] = 1;
    bad.dtype = KILN_F32;
    CHECK(kiln__cuda_check(q, kcu_fill(q->stream, &bad, 1.0), "fill at an invalid address") == 0,
          "the faulty kernel launches");
    int rc = kiln_device_sync(gpu);
    const char *msg = kiln_error();
    CHECK(rc == KILN_EDEVICE && strstr(msg, "fill at an invalid address") && strstr(msg, "lost"),
          "the fault is reported at sync, naming the op and the lost device: rc %d, %s", rc, msg);
    const char *why = kiln_device_lost(gpu);
    CHECK(why && strstr(why, "fill at an invalid address"), "the device is marked lost, with the cause: %s",
          why ? why : "(not lost)");
    kiln_tensor *t = kiln_full(gpu, KILN_F32, 1, (int64_t[]){4}, 1.0);
    CHECK(!t && strstr(kiln_error(), "was lost earlier"), "later work is refused with the cause");
    kiln_tensor_release(t);
    printf("lose-device: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}

static void test_lost(const char *self)
{
    pid_t pid;
    char *argv[] = {(char *)self, "--lose-device", NULL};
    extern char **environ;
    int rc = posix_spawn(&pid, self, NULL, NULL, argv, environ);
    int status = 0;
    CHECK(rc == 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "the device-lost run passed (spawn %d, status %d)", rc, status);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--lose-device") == 0)
        return lose_device();
    /* the backend itself (fusion=off, whatever the default): the checks below reach into its
     * context (kiln__device_ctx) */
    kiln_device *gpu = kiln_device_open("cuda:0?fusion=off");
    if (!gpu) {
        char why[512];
        snprintf(why, sizeof why, "%s", kiln_error());
        test_absent(why);
        printf("test-cuda-device: no usable GPU (%s); %d checks of that case, %d failures; the device checks "
               "were skipped\n",
               why, checks, failures);
        return failures ? 1 : 0;
    }
    kiln_device *cpu = kiln_device_open("cpu");
    test_gpu(gpu, cpu);
    test_queues(gpu);
    test_graphs(gpu, cpu);
    test_matmul_epilogue(gpu, cpu);
    test_profile();
    test_lost(argv[0]);
    kiln_device_close(gpu);
    kiln_device_close(cpu);
    printf("test-cuda-device: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
