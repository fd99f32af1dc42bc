/*
 * backends/cpu/cpu-backend.c — the cpu backend's interface table, device life cycle,
 * buffers, and the data-movement entries (fill, arange, copy, rng).
 *
 * Threads and OpenBLAS. The device owns one pool of worker threads sized to the online
 * cores (the threads option overrides). OpenBLAS runs single-threaded and our pool splits
 * the GEMMs into blocks (cpu-gemm.c): the pthreads build of OpenBLAS keeps its own
 * threads spinning on sched_yield for a while after every call, and in a training step,
 * where GEMMs alternate with elementwise ops on our pool, that spinning took a large
 * share of the cores from our workers (more so on a machine shared with other work).
 * blas=openblas gives OpenBLAS the cores instead (the earlier arrangement:
 * BLAS called outside any parallel region, its threads and ours never overlapping).
 * openblas_set_num_threads is process-wide; every cpu device sets the same value unless
 * that option differs between opens.
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "common/philox.h"
#include "cpu-impl.h"

/* ------------------------------------------------------------------ life cycle */

#if defined(__x86_64__)
/* F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know the
 * "f16c" name, and every AVX2 part has it anyway, so one cpuid keeps both compilers happy. */
static bool cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

/* The widest table this CPU runs. The kernels option (base|avx2) caps the choice, so
 * the narrower tables can be tested and timed on a machine that has the wider ones. */
static const kiln__cpu_kernels *pick_kernels(int cap)
{
    if (cap == 1)
        return &kiln__cpu_kernels_base;
#if defined(__x86_64__)
    bool allow512 = cap != 2;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !cpu_has_f16c())
        return &kiln__cpu_kernels_base;
    /* both compilers' __builtin_cpu_supports also check that the OS saves zmm state */
    if (allow512 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
        return &kiln__cpu_kernels_avx512;
    return &kiln__cpu_kernels_avx2;
#else
    return &kiln__cpu_kernels_base;
#endif
}

#define NCHOICES(a) ((int)(sizeof a / sizeof *a))

/* The options (docs/configuration.md; defaults from KILN_CPU_* through the engine's one
 * table): each is checked, not guessed at, since a typo would otherwise measure the
 * default while the user believes otherwise. */
static void *cpu_open_opts(const char *spec, int index, kiln_device_opts *o)
{
    if (index != 0) {
        kiln__error_set("cpu: no device %d (there is one host device, cpu:0)", index);
        return NULL;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN), spin_us = 50, pool_mb = 2048;
    int kernels = 0, blas = 0, conv = KILN__CPU_CONV_AUTO, dw = KILN__CPU_DW_AUTO;
    static const char *const kernel_caps[] = {"auto", "base", "avx2"};
    static const char *const blas_modes[] = {"kiln", "openblas"};
    /* which convolution tile serves the layers both can, and which depthwise kernel: for
     * tests and measurements */
    static const char *const conv_paths[] = {[KILN__CPU_CONV_AUTO] = "auto", [KILN__CPU_CONV_PACKED] = "packed",
                                             [KILN__CPU_CONV_DIRECT] = "direct"};
    static const char *const dw_paths[] = {[KILN__CPU_DW_AUTO] = "auto", [KILN__CPU_DW_PLANES] = "planes"};
    /* fused groups compiled into loops at run time (cpu-fused-jit.c), or interpreted only */
    static const char *const on_off[] = {"on", "off"};
    int jit = 0;
    if (kiln__device_opt_long(o, "cpu", "threads", 1, 256, &n) < 0 ||
        kiln__device_opt_long(o, "cpu", "spin_us", 0, 100000, &spin_us) < 0 ||
        kiln__device_opt_long(o, "cpu", "pool_mb", 0, 1L << 24, &pool_mb) < 0 ||
        kiln__device_opt_choice(o, "cpu", "kernels", kernel_caps, NCHOICES(kernel_caps), &kernels) < 0 ||
        kiln__device_opt_choice(o, "cpu", "blas", blas_modes, NCHOICES(blas_modes), &blas) < 0 ||
        kiln__device_opt_choice(o, "cpu", "conv", conv_paths, NCHOICES(conv_paths), &conv) < 0 ||
        kiln__device_opt_choice(o, "cpu", "depthwise", dw_paths, NCHOICES(dw_paths), &dw) < 0 ||
        kiln__device_opt_choice(o, "cpu", "jit", on_off, NCHOICES(on_off), &jit) < 0)
        return NULL;
    if (n < 1)
        n = 1;
    if (n > 256)
        n = 256;
    kiln__cpu_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) {
        kiln__error_set("cpu: out of memory opening the device");
        return NULL;
    }
    ctx->conv_path = conv;
    ctx->dw_path = dw;
    ctx->jit = jit == 0;
    ctx->pool = kiln__cpu_pool_create((int)n, (int64_t)spin_us * 1000);
    if (!ctx->pool) {
        free(ctx);
        kiln__error_set("cpu: cannot start the thread pool");
        return NULL;
    }
    ctx->nthreads = kiln__cpu_pool_size(ctx->pool);
    kiln__cpu_alloc_init(&ctx->alloc, (size_t)pool_mb << 20);
    ctx->k = pick_kernels(kernels);
    ctx->blas_own_threads = blas == 1;
    openblas_set_num_threads(ctx->blas_own_threads ? ctx->nthreads : 1);
    return ctx;
}

/* Opening by index alone (tests that drive the table directly): the environment's
 * defaults, as kiln_device_open("cpu") would give. */
static void *cpu_open(int index)
{
    kiln_device_opts o = {0};
    if (kiln__device_opts_env("cpu", &o) < 0)
        return NULL;
    return cpu_open_opts("cpu", index, &o);
}

static void cpu_close(void *vctx)
{
    kiln__cpu_ctx *ctx = vctx;
    if (!ctx)
        return;
    kiln__cpu_pool_destroy(ctx->pool);
    kiln__cpu_alloc_fini(&ctx->alloc);
    free(ctx);
}

static void cpu_caps(void *ctx, kiln_backend_caps *out)
{
    memset(out, 0, sizeof *out);
    for (int i = 0; i < KILN_DTYPE_COUNT; i++)
        out->dtype[i] = true;
    out->host_memory = true;
    out->async = false;
    out->fusion_min_elements = KILN_CPU_FUSION_MIN_ELEMENTS;
    out->fused_row_reduce = true;
    out->matmul_strided_out = true;
}

/* ------------------------------------------------------------------ buffers */

static kiln_buffer *cpu_buffer_alloc(void *ctx, size_t nbytes)
{
    kiln_buffer *b = kiln__cpu_buffer_get(ctx, nbytes);
    if (!b)
        kiln__error_set_code(KILN_ENOMEM, "cpu: cannot allocate %zu bytes", nbytes);
    return b;
}

static void cpu_buffer_free(void *ctx, kiln_buffer *b)
{
    if (b && b->wrapped) {
        if (b->release)
            b->release(b->release_ud);
        free(b);
        return;
    }
    kiln__cpu_buffer_put(ctx, b);
}

static bool cpu_buffer_detach(void *ctx, kiln_buffer *b)
{
    return kiln__cpu_buffer_detach(ctx, b);
}

static int cpu_buffer_reattach(void *ctx, kiln_buffer *b)
{
    return kiln__cpu_buffer_reattach(ctx, b);
}

static size_t cpu_buffer_trim(void *ctx, size_t bytes)
{
    return kiln__cpu_alloc_trim(ctx, bytes);
}

static int cpu_memory(void *ctx, kiln_device_memory *out)
{
    kiln__cpu_alloc_figures(ctx, out);
    return 0;
}

static int cpu_memory_reset_peak(void *ctx)
{
    kiln__cpu_alloc_reset_peak(ctx);
    return 0;
}

static kiln_buffer *cpu_buffer_wrap_host(void *ctx, void *ptr, size_t nbytes, void (*release)(void *),
                                         void *release_ud)
{
    kiln_buffer *b = calloc(1, sizeof *b);
    if (!b) {
        kiln__error_set("cpu: out of memory wrapping %zu bytes", nbytes);
        return NULL;
    }
    b->data = ptr;
    b->nbytes = nbytes;
    b->cap = nbytes;
    b->cls = -1;
    b->wrapped = true;
    b->release = release;
    b->release_ud = release_ud;
    return b;
}

static bool cpu_buffer_is_wrapped(void *ctx, const kiln_buffer *b)
{
    return b && b->wrapped;
}

typedef struct memcpy_job {
    char *dst;
    const char *src;
} memcpy_job;

static void memcpy_range(void *argp, int64_t begin, int64_t end)
{
    memcpy_job *j = argp;
    memcpy(j->dst + begin, j->src + begin, (size_t)(end - begin));
}

/* Large copies use both cores: one core does not saturate the memory bus here. */
static void par_memcpy(kiln__cpu_ctx *ctx, void *dst, const void *src, size_t n)
{
    if (n < (1u << 20)) {
        memcpy(dst, src, n);
        return;
    }
    memcpy_job j = {dst, src};
    kiln__cpu_parallel_for(ctx, (int64_t)n, 1 << 19, memcpy_range, &j);
}

static int cpu_buffer_upload(void *ctx, kiln_buffer *dst, size_t off, const void *src, size_t n)
{
    if (off > dst->nbytes || n > dst->nbytes - off)
        return kiln__error_set("cpu upload: %zu bytes at %zu past a %zu-byte buffer", n, off,
                               dst->nbytes), KILN_EINVAL;
    par_memcpy(ctx, (char *)dst->data + off, src, n);
    return 0;
}

static int cpu_buffer_download(void *ctx, kiln_buffer *src, size_t off, void *dst, size_t n)
{
    if (off > src->nbytes || n > src->nbytes - off)
        return kiln__error_set("cpu download: %zu bytes at %zu past a %zu-byte buffer", n, off,
                               src->nbytes), KILN_EINVAL;
    par_memcpy(ctx, dst, (char *)src->data + off, n);
    return 0;
}

static void *cpu_buffer_host_ptr(void *ctx, kiln_buffer *b)
{
    b->exported = true; /* its block stays where the caller was told it is */
    return b->data;
}

static int cpu_sync(void *ctx)
{
    return 0;
}

/* ------------------------------------------------------------------ fill, arange */

typedef struct fill_job {
    kiln_dtype dt;
    union { double d; int64_t i; } v;
    bool is_int;
} fill_job;

static void fill_row(void *argp, char *const *p, const int64_t *s, int64_t n)
{
    const fill_job *j = argp;
    char *o = p[0];
    size_t es = kiln__cpu_esize(j->dt);
    _Alignas(8) unsigned char pat[8];
    if (j->is_int)
        kiln__cpu_sti(pat, j->dt, j->v.i);
    else
        kiln__cpu_st(pat, j->dt, j->v.d);
    int64_t st = s[0] * (int64_t)es;
    switch (es) {
    case 8: { uint64_t v; memcpy(&v, pat, 8);
        if (s[0] == 1) { uint64_t *q = (uint64_t *)o; for (int64_t i = 0; i < n; i++) q[i] = v; }
        else for (int64_t i = 0; i < n; i++) memcpy(o + i * st, &v, 8);
        break; }
    case 4: { uint32_t v; memcpy(&v, pat, 4);
        if (s[0] == 1) { uint32_t *q = (uint32_t *)o; for (int64_t i = 0; i < n; i++) q[i] = v; }
        else for (int64_t i = 0; i < n; i++) memcpy(o + i * st, &v, 4);
        break; }
    case 2: { uint16_t v; memcpy(&v, pat, 2);
        if (s[0] == 1) { uint16_t *q = (uint16_t *)o; for (int64_t i = 0; i < n; i++) q[i] = v; }
        else for (int64_t i = 0; i < n; i++) memcpy(o + i * st, &v, 2);
        break; }
    default:
        if (s[0] == 1) memset(o, pat[0], (size_t)n);
        else for (int64_t i = 0; i < n; i++) o[i * st] = (char)pat[0];
        break;
    }
}

int kiln__cpu_fill(void *vctx, const kiln_tdesc *out, double value)
{
    fill_job j = {.dt = out->dtype, .is_int = kiln__cpu_is_int(out->dtype)};
    if (j.is_int)
        j.v.i = kiln__cpu_d2i(value);
    else
        j.v.d = value;
    kiln__cpu_iter it;
    const kiln_tdesc *ops[1] = {out};
    kiln__cpu_iter_init(&it, 1, ops);
    kiln__cpu_iter_run(vctx, &it, 1 << 16, fill_row, &j);
    return 0;
}

typedef struct arange_job {
    const kiln_tdesc *out;
    double start, step;
} arange_job;

static void arange_range(void *argp, int64_t b, int64_t e)
{
    const arange_job *j = argp;
    kiln_dtype dt = j->out->dtype;
    char *o = kiln__cpu_ptr(j->out);
    size_t es = kiln__cpu_esize(dt);
    int64_t st = j->out->ndim ? j->out->strides[j->out->ndim - 1] : 1;
    if (dt == KILN_F32 && st == 1) {
        float *q = (float *)o;
        for (int64_t i = b; i < e; i++)
            q[i] = (float)(j->start + (double)i * j->step);
        return;
    }
    for (int64_t i = b; i < e; i++)
        kiln__cpu_st(o + i * st * (int64_t)es, dt, j->start + (double)i * j->step);
}

int kiln__cpu_arange(void *vctx, const kiln_tdesc *out, double start, double step)
{
    /* out is 1-D (or contiguous): the flat index walks its last stride */
    if (out->ndim > 1 && !kiln__cpu_contig(out))
        return kiln__error_set("cpu arange: expects a 1-D or contiguous output"), KILN_EINVAL;
    kiln_tdesc flat = *out;
    if (out->ndim != 1) {
        flat.ndim = 1;
        flat.shape[0] = kiln__cpu_numel(out);
        flat.strides[0] = 1;
    }
    arange_job j = {&flat, start, step};
    kiln__cpu_parallel_for(vctx, flat.shape[0], 1 << 15, arange_range, &j);
    return 0;
}

/* ------------------------------------------------------------------ copy */

typedef struct copy_job {
    kiln__cpu_ctx *ctx;
    kiln_dtype od, id;
} copy_job;

static void copy_row(void *argp, char *const *p, const int64_t *s, int64_t n)
{
    const copy_job *j = argp;
    char *o = p[0];
    const char *x = p[1];
    kiln_dtype od = j->od, id = j->id;
    int64_t os = s[0] * (int64_t)kiln__cpu_esize(od), is = s[1] * (int64_t)kiln__cpu_esize(id);
    if (od == id) {
        size_t es = kiln__cpu_esize(od);
        if (s[0] == 1 && s[1] == 1) {
            memcpy(o, x, (size_t)n * es);
            return;
        }
        switch (es) {
        case 8: for (int64_t i = 0; i < n; i++) memcpy(o + i * os, x + i * is, 8); break;
        case 4: for (int64_t i = 0; i < n; i++) memcpy(o + i * os, x + i * is, 4); break;
        case 2: for (int64_t i = 0; i < n; i++) memcpy(o + i * os, x + i * is, 2); break;
        default: for (int64_t i = 0; i < n; i++) o[i * os] = x[i * is]; break;
        }
        return;
    }
    if (s[0] == 1 && s[1] == 1) {
        if (od == KILN_F32 && id == KILN_F16) {
            j->ctx->k->f16_to_f32((float *)o, (const uint16_t *)x, n);
            return;
        }
        if (od == KILN_F16 && id == KILN_F32) {
            j->ctx->k->f32_to_f16((uint16_t *)o, (const float *)x, n);
            return;
        }
        if (od == KILN_F32 && id == KILN_BF16) {
            float *q = (float *)o;
            const uint16_t *h = (const uint16_t *)x;
            for (int64_t i = 0; i < n; i++)
                q[i] = kiln_bf16_to_f32(h[i]);
            return;
        }
        if (od == KILN_F64 && id == KILN_F32) {
            double *q = (double *)o;
            const float *f = (const float *)x;
            for (int64_t i = 0; i < n; i++)
                q[i] = f[i];
            return;
        }
        if (od == KILN_F32 && id == KILN_F64) {
            float *q = (float *)o;
            const double *f = (const double *)x;
            for (int64_t i = 0; i < n; i++)
                q[i] = (float)f[i];
            return;
        }
    }
    if (kiln__cpu_is_int(id) && kiln__cpu_is_int(od)) {
        for (int64_t i = 0; i < n; i++)
            kiln__cpu_sti(o + i * os, od, kiln__cpu_ldi(x + i * is, id));
    } else if (kiln__cpu_is_int(id)) {
        for (int64_t i = 0; i < n; i++)
            kiln__cpu_sti(o + i * os, od, kiln__cpu_ldi(x + i * is, id));
    } else {
        for (int64_t i = 0; i < n; i++)
            kiln__cpu_st(o + i * os, od, kiln__cpu_ld(x + i * is, id));
    }
}

int kiln__cpu_copy(void *vctx, const kiln_tdesc *out, const kiln_tdesc *in)
{
    kiln__cpu_ctx *ctx = vctx;
    if (out->dtype == in->dtype && kiln__cpu_contig(out) && kiln__cpu_contig(in)) {
        size_t n = (size_t)kiln__cpu_numel(out) * kiln__cpu_esize(out->dtype);
        if (n && kiln__cpu_ptr(out) != kiln__cpu_ptr(in))
            par_memcpy(ctx, kiln__cpu_ptr(out), kiln__cpu_ptr(in), n);
        return 0;
    }
    copy_job j = {ctx, out->dtype, in->dtype};
    kiln__cpu_iter it;
    const kiln_tdesc *ops[2] = {out, in};
    kiln__cpu_iter_init(&it, 2, ops);
    kiln__cpu_iter_run(ctx, &it, 1 << 15, copy_row, &j);
    return 0;
}

/* ------------------------------------------------------------------ rng */

typedef struct rng_job {
    const kiln__cpu_kernels *k;
    const kiln_tdesc *out;
    kiln_rng_kind kind;
    uint64_t seed, offset;
    double p0, p1;
} rng_job;

/* Uniform and Bernoulli draws, the common case: Philox over runs of counters at once (the
 * kernel table's philox_u01), then the same transform and store as one at a time. */
static void rng_range(void *argp, int64_t b, int64_t e);

static void rng_range_fast(const rng_job *j, int64_t b, int64_t e)
{
    kiln_dtype dt = j->out->dtype;
    char *o = kiln__cpu_ptr(j->out);
    size_t es = kiln__cpu_esize(dt);
    double u[256];
    for (int64_t i0 = b; i0 < e; i0 += 256) {
        int64_t m = e - i0 < 256 ? e - i0 : 256;
        j->k->philox_u01(u, j->offset + (uint64_t)i0, j->seed, m);
        char *q = o + i0 * (int64_t)es;
        if (dt == KILN_F32) { /* the common case, without a store per dtype per element */
            float *f = (float *)q;
            if (j->kind == KILN_RNG_UNIFORM)
                for (int64_t t = 0; t < m; t++)
                    f[t] = (float)(j->p0 + (j->p1 - j->p0) * u[t]);
            else
                for (int64_t t = 0; t < m; t++)
                    f[t] = u[t] < j->p0 ? 1.0f : 0.0f;
        } else if (j->kind == KILN_RNG_UNIFORM)
            for (int64_t t = 0; t < m; t++)
                kiln__cpu_st(q + t * (int64_t)es, dt, j->p0 + (j->p1 - j->p0) * u[t]);
        else
            for (int64_t t = 0; t < m; t++)
                kiln__cpu_sti(q + t * (int64_t)es, dt, u[t] < j->p0 ? 1 : 0);
    }
}

static void rng_range(void *argp, int64_t b, int64_t e)
{
    const rng_job *j = argp;
    if (j->kind == KILN_RNG_UNIFORM || j->kind == KILN_RNG_BERNOULLI) {
        rng_range_fast(j, b, e);
        return;
    }
    kiln_dtype dt = j->out->dtype;
    char *o = kiln__cpu_ptr(j->out);
    size_t es = kiln__cpu_esize(dt);
    int64_t lo = (int64_t)j->p0, hi = (int64_t)j->p1;
    for (int64_t i = b; i < e; i++) {
        uint64_t c = j->offset + (uint64_t)i;
        char *q = o + i * (int64_t)es;
        switch (j->kind) {
        case KILN_RNG_UNIFORM:
            kiln__cpu_st(q, dt, j->p0 + (j->p1 - j->p0) * kiln_rng_uniform01(c, j->seed));
            break;
        case KILN_RNG_NORMAL:
            kiln__cpu_st(q, dt, j->p0 + j->p1 * kiln_rng_normal01(c, j->seed));
            break;
        case KILN_RNG_BERNOULLI:
            kiln__cpu_sti(q, dt, kiln_rng_uniform01(c, j->seed) < j->p0 ? 1 : 0);
            break;
        default:
            kiln__cpu_sti(q, dt, hi > lo ? kiln_rng_int(c, j->seed, lo, hi) : lo);
            break;
        }
    }
}

int kiln__cpu_rng(void *vctx, kiln_rng_kind kind, const kiln_tdesc *out, uint64_t seed,
                  uint64_t offset, double p0, double p1)
{
    kiln__cpu_ctx *ctx = vctx;
    /* rng_range converts the bounds to int64: out of range that is undefined, so refuse
     * what the engine never sends (kiln_rand_int keeps them within 2^53), as ref does */
    if (kind == KILN_RNG_INT && !(p0 >= -9007199254740992.0 && p1 <= 9007199254740992.0 && p0 < p1))
        return kiln__error_set("cpu rng: invalid integer range [%g, %g)", p0, p1), KILN_EINVAL;
    if (!kiln__cpu_contig(out)) {
        /* draw into contiguous scratch, then scatter into the view */
        struct kiln_buffer *h;
        int64_t n = kiln__cpu_numel(out);
        if (!kiln__cpu_scratch_get(ctx, (size_t)n * kiln__cpu_esize(out->dtype), &h))
            return kiln__cpu_enomem("rng");
        kiln_tdesc t;
        kiln__cpu_desc_contig(&t, h, out->dtype, out->ndim, out->shape);
        int rc = kiln__cpu_rng(ctx, kind, &t, seed, offset, p0, p1);
        if (rc == 0)
            kiln__cpu_copy(ctx, out, &t);
        kiln__cpu_scratch_put(ctx, h);
        return rc;
    }
    rng_job j = {ctx->k, out, kind, seed, offset, p0, p1};
    kiln__cpu_parallel_for(ctx, kiln__cpu_numel(out), 4096, rng_range, &j);
    return 0;
}

/* ------------------------------------------------------------------ the table */

static const kiln_backend_iface cpu_iface = {
    .name = "cpu",
    .open = cpu_open,
    .open_opts = cpu_open_opts,
    .close = cpu_close,
    .caps = cpu_caps,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_free = cpu_buffer_free,
    .buffer_upload = cpu_buffer_upload,
    .buffer_download = cpu_buffer_download,
    .buffer_host_ptr = cpu_buffer_host_ptr,
    .buffer_wrap_host = cpu_buffer_wrap_host,
    .buffer_is_wrapped = cpu_buffer_is_wrapped,
    .buffer_trim = cpu_buffer_trim,
    .buffer_detach = cpu_buffer_detach,
    .buffer_reattach = cpu_buffer_reattach,
    .memory = cpu_memory,
    .memory_reset_peak = cpu_memory_reset_peak,
    .sync = cpu_sync,
    .fill = kiln__cpu_fill,
    .arange = kiln__cpu_arange,
    .copy = kiln__cpu_copy,
    .rng = kiln__cpu_rng,
    .unary = kiln__cpu_unary,
    .binary = kiln__cpu_binary,
    .where = kiln__cpu_where,
    .reduce = kiln__cpu_reduce,
    .arg_reduce = kiln__cpu_arg_reduce,
    .cumsum = kiln__cpu_cumsum,
    .sort = kiln__cpu_sort,
    .gather = kiln__cpu_gather,
    .scatter = kiln__cpu_scatter,
    .index_select = kiln__cpu_index_select,
    .index_check = kiln__cpu_index_check,
    .index_add = kiln__cpu_index_add,
    .matmul = kiln__cpu_matmul,
    .conv = kiln__cpu_conv,
    .conv_fused = kiln__cpu_conv_fused,
    .conv_pack_size = kiln__cpu_conv_pack_size,
    .conv_pack = kiln__cpu_conv_pack,
    .epilogue = kiln__cpu_epilogue,
    .rnn = kiln__cpu_rnn,
    .rnn_pack_size = kiln__cpu_rnn_pack_size,
    .rnn_pack = kiln__cpu_rnn_pack_weights,
    .conv_backward_input = kiln__cpu_conv_backward_input,
    .conv_backward_weight = kiln__cpu_conv_backward_weight,
    .pool = kiln__cpu_pooling,
    .pool_backward = kiln__cpu_pooling_backward,
    .adaptive_avg_pool = kiln__cpu_adaptive_avg_pool,
    .adaptive_avg_pool_backward = kiln__cpu_adaptive_avg_pool_backward,
    .interpolate = kiln__cpu_interpolate,
    .interpolate_backward = kiln__cpu_interpolate_backward,
    .pad = kiln__cpu_pad,
    .softmax = kiln__cpu_softmax,
    .layer_norm = kiln__cpu_layer_norm,
    .adam_step = kiln__cpu_adam_step,
    .fused_run = kiln__cpu_fused_run,
};

const kiln_backend_iface *kiln_backend_cpu(void)
{
    return &cpu_iface;
}
