/*
 * tests/backend-cpu/test-backend-cpu.c — the cpu backend against the ref oracle,
 * through the backend interface directly.
 *
 * Every case builds the same input bytes in both backends, runs one primitive on
 * identical descriptors and compares the outputs element by element (NaN must match
 * NaN; floats within a tolerance per dtype and op family; integers exactly). Inputs come
 * in several layouts — contiguous, transposed, negative strides, broadcast (stride 0),
 * padded rows — with odd shapes such as 5x7x11x13 so vector loops always have a tail.
 * Where ref declines a combination (returns an error), the case is skipped, since the
 * cpu backend is only required to match ref where ref has an answer.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "kiln/tensor.h"

static const kiln_backend_iface *B[2];
static void *CTX[2];
static int failures, checks, skipped;

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t next_rand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static double urand(double lo, double hi)
{
    return lo + (hi - lo) * (double)(next_rand() >> 11) / 9007199254740992.0;
}

static size_t esize(kiln_dtype dt)
{
    switch (dt) {
    case KILN_F64: case KILN_I64: return 8;
    case KILN_F32: case KILN_I32: return 4;
    case KILN_F16: case KILN_BF16: return 2;
    default: return 1;
    }
}
static bool is_float(kiln_dtype dt) { return dt <= KILN_BF16; }

static float h2f(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0) {
        float v = (float)m * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    u = e == 31 ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e + 112) << 23) | (m << 13));
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static double get(const void *p, kiln_dtype dt, int64_t i)
{
    switch (dt) {
    case KILN_F32: return ((const float *)p)[i];
    case KILN_F64: return ((const double *)p)[i];
    case KILN_F16: return h2f(((const uint16_t *)p)[i]);
    case KILN_BF16: { uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16; float f; memcpy(&f, &u, 4); return f; }
    case KILN_I64: return (double)((const int64_t *)p)[i];
    case KILN_I32: return ((const int32_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
    }
}

/* A tensor living in both backends: same bytes, same descriptor. */
typedef struct twin {
    kiln_buffer *buf[2];
    kiln_tdesc d[2];
    size_t nbytes;
} twin;

static int64_t numel(int nd, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= shape[i];
    return n;
}

enum layout { L_CONTIG, L_TRANS, L_NEG, L_BCAST, L_PAD, L_COUNT };
static const char *layout_name[] = {"contig", "transposed", "negative", "broadcast", "padded"};

/* Fill kinds: general floats, positive floats, with specials, small ints, index range. */
enum fillk { F_NORMAL, F_POS, F_SPECIAL, F_INDEX };

static void fill_bytes(void *p, kiln_dtype dt, int64_t n, enum fillk fk, int64_t idx_hi)
{
    for (int64_t i = 0; i < n; i++) {
        double v;
        if (fk == F_INDEX)
            v = (double)(int64_t)urand(0, (double)idx_hi);
        else if (dt == KILN_BOOL)
            v = next_rand() & 1;
        else if (dt == KILN_U8)
            v = (double)(next_rand() % 256);
        else if (!is_float(dt))
            v = (double)((int64_t)(next_rand() % 41) - 20);
        else if (fk == F_POS)
            v = urand(0.05, 4);
        else
            v = urand(-4, 4);
        if (fk == F_SPECIAL && is_float(dt)) {
            uint64_t r = next_rand() % 16;
            if (r == 0) v = NAN;
            else if (r == 1) v = INFINITY;
            else if (r == 2) v = -INFINITY;
            else if (r == 3) v = 0.0;
            else if (r == 4) v = -0.0;
            else if (r == 5) v = urand(-30, 30);
        }
        switch (dt) {
        case KILN_F32: ((float *)p)[i] = (float)v; break;
        case KILN_F64: ((double *)p)[i] = v; break;
        case KILN_F16: case KILN_BF16: {
            float f = (float)v;
            uint32_t u;
            memcpy(&u, &f, 4);
            if (dt == KILN_BF16) {
                ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
            } else {
                /* truncate to a representable half (value exactness matters, not rounding) */
                uint32_t a = u & 0x7fffffffu, s = (u >> 16) & 0x8000u;
                uint16_t h;
                if (a > 0x7f800000u) h = (uint16_t)(s | 0x7e00);
                else if (a >= 0x477fe000u) h = (uint16_t)(s | 0x7c00);
                else if (a < 0x38800000u) h = (uint16_t)s;
                else h = (uint16_t)(s | (((a >> 23) - 112) << 10) | ((a >> 13) & 0x3ff));
                ((uint16_t *)p)[i] = h;
            }
            break;
        }
        case KILN_I64: ((int64_t *)p)[i] = (int64_t)v; break;
        case KILN_I32: ((int32_t *)p)[i] = (int32_t)v; break;
        default: ((uint8_t *)p)[i] = (uint8_t)(int64_t)v; break;
        }
    }
}

/* Make a twin view of logical shape with the given layout, filled per fk. */
static twin make(kiln_dtype dt, int nd, const int64_t *shape, enum layout lay, enum fillk fk,
                 int64_t idx_hi)
{
    twin t;
    memset(&t, 0, sizeof t);
    kiln_tdesc d;
    memset(&d, 0, sizeof d);
    d.dtype = dt;
    d.ndim = nd;
    for (int i = 0; i < nd; i++)
        d.shape[i] = shape[i];
    int64_t span = 1, off = 0;
    if (lay == L_TRANS && nd >= 2) {
        /* storage in reversed dim order */
        int64_t s = 1;
        for (int i = 0; i < nd; i++) {
            d.strides[i] = s;
            s *= shape[i];
        }
        span = s;
    } else {
        int64_t s = 1;
        for (int i = nd - 1; i >= 0; i--) {
            int64_t extra = (lay == L_PAD && i == nd - 1) ? 3 : 0;
            d.strides[i] = s;
            s *= shape[i] + extra;
        }
        span = s;
        if (lay == L_BCAST && nd >= 1) {
            /* dims 0 (and 2) broadcast */
            for (int i = 0; i < nd; i += 2)
                d.strides[i] = 0;
        }
        if (lay == L_NEG && nd >= 1) {
            int l = nd - 1;
            off = (shape[l] - 1) * d.strides[l];
            d.strides[l] = -d.strides[l];
            if (nd >= 2) {
                off += (shape[0] - 1) * d.strides[0];
                d.strides[0] = -d.strides[0];
            }
        }
    }
    if (numel(nd, shape) == 0)
        span = 1;
    off += 2; /* a non-zero offset everywhere */
    d.offset = off;
    size_t nbytes = (size_t)(span + off + 2) * esize(dt);
    void *host = malloc(nbytes);
    fill_bytes(host, dt, span + off + 2, fk, idx_hi);
    for (int b = 0; b < 2; b++) {
        t.buf[b] = B[b]->buffer_alloc(CTX[b], nbytes);
        B[b]->buffer_upload(CTX[b], t.buf[b], 0, host, nbytes);
        t.d[b] = d;
        t.d[b].buf = t.buf[b];
    }
    t.nbytes = nbytes;
    free(host);
    return t;
}

static twin make_out(kiln_dtype dt, int nd, const int64_t *shape)
{
    return make(dt, nd, shape, L_CONTIG, F_NORMAL, 0);
}

static void drop(twin *t)
{
    for (int b = 0; b < 2; b++)
        if (t->buf[b])
            B[b]->buffer_free(CTX[b], t->buf[b]);
    memset(t, 0, sizeof *t);
}

/* Compare the logical elements of out in both backends. */
static void compare(const char *what, const twin *o, double rtol, double atol)
{
    checks++;
    void *h[2];
    for (int b = 0; b < 2; b++) {
        h[b] = malloc(o->nbytes);
        B[b]->buffer_download(CTX[b], o->buf[b], 0, h[b], o->nbytes);
    }
    const kiln_tdesc *d = &o->d[0];
    int64_t n = numel(d->ndim, d->shape);
    int bad = 0;
    for (int64_t li = 0; li < n; li++) {
        int64_t rem = li, off = d->offset;
        for (int i = d->ndim - 1; i >= 0; i--) {
            off += (rem % d->shape[i]) * d->strides[i];
            rem /= d->shape[i];
        }
        double c = get(h[0], d->dtype, off), r = get(h[1], d->dtype, off);
        bool ok;
        if (r != r || c != c)
            ok = (r != r) && (c != c);
        else if (isinf(r) || isinf(c))
            ok = r == c;
        else
            ok = fabs(c - r) <= atol + rtol * fabs(r);
        if (!ok) {
            if (bad < 4)
                fprintf(stderr, "FAIL %s [%lld]: cpu %.9g ref %.9g\n", what, (long long)li, c, r);
            bad++;
        }
    }
    /* sentinels: the two elements past the view's end of the buffer must agree */
    if (bad) {
        failures++;
        fprintf(stderr, "FAIL %s: %d of %lld elements differ\n", what, bad, (long long)n);
    }
    free(h[0]);
    free(h[1]);
}

static double tol_for(kiln_dtype dt, double f32tol)
{
    switch (dt) {
    case KILN_F32: return f32tol;
    case KILN_F64: return 1e-12;
    case KILN_F16: return 2e-3;
    case KILN_BF16: return 1.6e-2;
    default: return 0;
    }
}

/* Judge one pair of results; false (and a skip) when ref declines the case. */
static bool run2(int rc, int rr, const char *what)
{
    if (rr != 0) {
        skipped++;
        return false;
    }
    if (rc != 0) {
        fprintf(stderr, "FAIL %s: cpu returned %d: %s\n", what, rc, kiln_error());
        failures++;
        return false;
    }
    return true;
}

#include "cases.inc"

/* buffer_trim hands parked buffers back, largest first, and the pool still serves
 * allocations afterwards; ref parks nothing, so it releases nothing. */
static void trim_case(void)
{
    const size_t sizes[3] = {3u << 20, 1u << 20, 4096};
    kiln_buffer *bufs[3];
    for (int i = 0; i < 3; i++) {
        bufs[i] = B[0]->buffer_alloc(CTX[0], sizes[i]);
        checks++;
        if (!bufs[i]) {
            failures++;
            fprintf(stderr, "FAIL trim: cannot allocate %zu bytes\n", sizes[i]);
            return;
        }
    }
    B[0]->buffer_trim(CTX[0], SIZE_MAX); /* start from an empty pool */
    for (int i = 0; i < 3; i++)
        B[0]->buffer_free(CTX[0], bufs[i]);
    /* one byte asks for at least one buffer, the largest: 3 MiB rounds to its class */
    size_t got = B[0]->buffer_trim(CTX[0], 1);
    checks++;
    if (got < sizes[0] || got >= sizes[0] + sizes[1]) {
        failures++;
        fprintf(stderr, "FAIL trim: asked for 1 byte, released %zu (want the 3 MiB buffer alone)\n", got);
    }
    size_t rest = B[0]->buffer_trim(CTX[0], SIZE_MAX);
    checks++;
    if (rest < sizes[1] + sizes[2]) {
        failures++;
        fprintf(stderr, "FAIL trim: the rest released %zu bytes, want at least %zu\n", rest, sizes[1] + sizes[2]);
    }
    checks++;
    if (B[0]->buffer_trim(CTX[0], SIZE_MAX) != 0) {
        failures++;
        fprintf(stderr, "FAIL trim: an empty pool released something\n");
    }
    kiln_buffer *again = B[0]->buffer_alloc(CTX[0], sizes[0]);
    checks++;
    if (!again || !B[0]->buffer_host_ptr(CTX[0], again)) {
        failures++;
        fprintf(stderr, "FAIL trim: no allocation after trimming\n");
    } else {
        memset(B[0]->buffer_host_ptr(CTX[0], again), 1, sizes[0]);
    }
    B[0]->buffer_free(CTX[0], again);
    checks++;
    if (B[1]->buffer_trim(CTX[1], SIZE_MAX) != 0) {
        failures++;
        fprintf(stderr, "FAIL trim: ref released memory it never parks\n");
    }
}

/* The tuning variables read at open: a bad value refuses the open with a message naming
 * the variable and the value, and good ones open a working device. */
static void env_case(void)
{
    static const struct {
        const char *var, *value;
        bool ok;
    } cases[] = {
        {"KILN_CPU_CONV", "packd", false}, {"KILN_CPU_CONV", "direct", true}, {"KILN_CPU_CONV", "auto", true},
        {"KILN_CPU_SPIN_US", "fast", false}, {"KILN_CPU_SPIN_US", "-1", false},
        {"KILN_CPU_SPIN_US", "100001", false}, {"KILN_CPU_SPIN_US", "50us", false},
        {"KILN_CPU_SPIN_US", "0", true},
        {"KILN_CPU_DEPTHWISE", "plane", false}, {"KILN_CPU_DEPTHWISE", "planes", true},
        {"KILN_CPU_DEPTHWISE", "auto", true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        setenv(cases[i].var, cases[i].value, 1);
        kiln_error_clear();
        void *ctx = B[0]->open(0);
        checks++;
        if (cases[i].ok != (ctx != NULL) ||
            (!ctx && (!strstr(kiln_error(), cases[i].var) || !strstr(kiln_error(), cases[i].value)))) {
            failures++;
            fprintf(stderr, "FAIL env %s=%s: open %s (%s)\n", cases[i].var, cases[i].value,
                    ctx ? "succeeded" : "failed", kiln_error());
        }
        if (ctx) {
            /* the device serves allocations */
            kiln_buffer *b = B[0]->buffer_alloc(ctx, 1 << 20);
            checks++;
            if (!b) {
                failures++;
                fprintf(stderr, "FAIL env %s=%s: no buffer\n", cases[i].var, cases[i].value);
            }
            B[0]->buffer_free(ctx, b);
            B[0]->close(ctx);
        }
        unsetenv(cases[i].var);
    }
}

int main(void)
{
    B[0] = kiln_backend_cpu();
    B[1] = kiln_backend_ref();
    for (int b = 0; b < 2; b++) {
        CTX[b] = B[b]->open(0);
        if (!CTX[b]) {
            fprintf(stderr, "cannot open backend %s: %s\n", B[b]->name, kiln_error());
            return 1;
        }
    }
    run_all();
    trim_case();
    env_case();
    for (int b = 0; b < 2; b++)
        B[b]->close(CTX[b]);
    printf("backend-cpu: %d checks, %d failures, %d skipped (ref declined)\n", checks, failures,
           skipped);
    return failures ? 1 : 0;
}
