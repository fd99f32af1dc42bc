/*
 * tests/conformance/harness.c — runs every registered case on each compiled-in device
 * other than "ref" that opens, and compares it with the same case on "ref".
 *
 *   conformance                 run everything, print failures and a summary line
 *   conformance --list          also print an op x backend table of pass/fail/skip
 *   conformance -o OP[,OP..]    only these op families
 *   conformance -b BACKEND      only this target backend ("ref" compares ref with itself);
 *                               a whole spec (counting:cpu, remote://h:p/cpu) opens that device
 *   conformance -v              print every case
 *   conformance --self-test     plant faults on the target devices (a wrong value, a NaN, a
 *                               write into an input, a wrong shape or dtype) and check that
 *                               every one is caught
 *
 * Inputs are drawn on the host from a fixed seed, uploaded byte for byte to each
 * device, and downloaded again after the op: an input that changed (a write through a
 * view, an out-of-bounds store into a neighbouring region of the base) is a failure.
 * A device that answers an op with an "unsupported" error is counted as skipped, except
 * that "cpu" must support everything "ref" does.
 */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

/* ------------------------------------------------------------------ registry */

static conf_case *g_cases;
static int g_ncases, g_capcases;
static kiln_device *g_ref;
static kiln_device *g_targets[8];
static int g_ntargets;
static bool g_verbose;

void conf_add(const conf_case *c)
{
    if (g_ncases == g_capcases) {
        g_capcases = g_capcases ? 2 * g_capcases : 256;
        g_cases = realloc(g_cases, (size_t)g_capcases * sizeof *g_cases);
        if (!g_cases) {
            fprintf(stderr, "conformance: out of memory\n");
            exit(2);
        }
    }
    g_cases[g_ncases++] = *c;
}

kiln_device *conf_ref_device(void) { return g_ref; }

kiln_device *conf_other_device(kiln_device *dev)
{
    if (dev != g_ref)
        return g_ref;
    for (int t = 0; t < g_ntargets; t++)
        if (g_targets[t] != dev)
            return g_targets[t];
    return NULL;
}

void conf_label(conf_case *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->label, sizeof c->label, fmt, ap);
    va_end(ap);
}

const char *conf_shape_str(const conf_input *in, char *buf, int len)
{
    int n = snprintf(buf, (size_t)len, "[");
    for (int i = 0; i < in->ndim && n < len; i++)
        n += snprintf(buf + n, (size_t)(len - n), i ? ", %lld" : "%lld", (long long)in->shape[i]);
    if (n < len)
        snprintf(buf + n, (size_t)(len - n), "]");
    return buf;
}

conf_case conf_make(const char *op, kiln_dtype dt, conf_build_fn build)
{
    conf_case c;
    memset(&c, 0, sizeof c);
    c.op = op;
    c.dt = dt;
    c.build = build;
    return c;
}

void conf_in(conf_case *c, int dt, int ndim, const int64_t *shape, conf_gen gen, double lo, double hi,
             conf_view view)
{
    conf_input *in = &c->in[c->nin++];
    memset(in, 0, sizeof *in);
    in->dt = dt;
    in->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        in->shape[d] = shape[d];
    in->gen = gen;
    in->lo = lo;
    in->hi = hi;
    in->view = view;
}

static const char *view_names[] = {"", "T", "step", "flip", "expand", "perm", "narrow"};

void conf_push(conf_case *c, const char *extra_fmt, ...)
{
    char extra[120] = "";
    if (extra_fmt) {
        va_list ap;
        va_start(ap, extra_fmt);
        vsnprintf(extra, sizeof extra, extra_fmt, ap);
        va_end(ap);
    }
    int n = snprintf(c->label, sizeof c->label, "%s", kiln_dtype_name(c->dt));
    for (int k = 0; k < c->nin && n < (int)sizeof c->label; k++) {
        char sh[64];
        const conf_input *in = &c->in[k];
        n += snprintf(c->label + n, sizeof c->label - (size_t)n, " %s%s%s%s",
                      in->dt >= 0 && in->dt != (int)c->dt ? kiln_dtype_name((kiln_dtype)in->dt) : "",
                      conf_shape_str(in, sh, sizeof sh), in->view ? ":" : "", view_names[in->view]);
    }
    if (*extra && n < (int)sizeof c->label)
        snprintf(c->label + n, sizeof c->label - (size_t)n, " %s", extra);
    conf_add(c);
}

/* ------------------------------------------------------------ host values */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_u01(uint64_t *s) { return (double)(rng_next(s) >> 11) * 0x1.0p-53; }

static uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* subnormal or zero in f16 */
        float v;
        memcpy(&v, &a, 4);
        double m = nearbyint((double)v * 16777216.0); /* units of 2^-24, ties to even */
        return (uint16_t)(sign | (uint16_t)m);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | (uint16_t)((r - 0x38000000u) >> 13));
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0) {
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (exp == 31)
        u = sign | 0x7f800000u | (man << 13);
    else
        u = sign | ((exp + 112u) << 23) | (man << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void store(kiln_dtype dt, void *buf, int64_t i, double v)
{
    switch (dt) {
    case KILN_F32: ((float *)buf)[i] = (float)v; break;
    case KILN_F64: ((double *)buf)[i] = v; break;
    case KILN_F16: ((uint16_t *)buf)[i] = f32_to_f16((float)v); break;
    case KILN_BF16: ((uint16_t *)buf)[i] = f32_to_bf16((float)v); break;
    case KILN_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case KILN_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case KILN_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case KILN_BOOL: ((uint8_t *)buf)[i] = v != 0; break;
    default: break;
    }
}

static double load(kiln_dtype dt, const void *buf, int64_t i)
{
    switch (dt) {
    case KILN_F32: return ((const float *)buf)[i];
    case KILN_F64: return ((const double *)buf)[i];
    case KILN_F16: return f16_to_f32(((const uint16_t *)buf)[i]);
    case KILN_BF16: return bf16_to_f32(((const uint16_t *)buf)[i]);
    case KILN_I64: return (double)((const int64_t *)buf)[i];
    case KILN_I32: return ((const int32_t *)buf)[i];
    case KILN_U8: return ((const uint8_t *)buf)[i];
    case KILN_BOOL: return ((const uint8_t *)buf)[i] != 0;
    default: return NAN;
    }
}

static int64_t load_int(kiln_dtype dt, const void *buf, int64_t i)
{
    if (dt == KILN_I64)
        return ((const int64_t *)buf)[i];
    return (int64_t)load(dt, buf, i);
}

/* A prepared input: the host bytes of its contiguous base and the base shape. */
typedef struct prepared {
    kiln_dtype dt;
    int ndim;
    int64_t base[KILN_MAX_DIMS];
    int64_t numel;
    void *bytes;
    size_t nbytes;
} prepared;

static const double specials[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 1e30, -1e30, 1e-30,
                                  0.5, -0.5, 1.5, 2.5, -2.5, 1e4, -1e4, 88.0, -100.0};

static void prepare(const conf_case *c, int k, prepared *p)
{
    const conf_input *in = &c->in[k];
    p->dt = in->dt < 0 ? c->dt : (kiln_dtype)in->dt;
    p->ndim = in->ndim;
    for (int d = 0; d < in->ndim; d++)
        p->base[d] = in->shape[d];
    int nd = in->ndim;
    switch (in->view) {
    case V_T:
        p->base[nd - 2] = in->shape[nd - 1];
        p->base[nd - 1] = in->shape[nd - 2];
        break;
    case V_STEP: p->base[0] = 2 * in->shape[0] + 1; break;
    case V_EXPAND: p->base[0] = 1; break;
    case V_PERM:
        for (int d = 0; d < nd; d++)
            p->base[d] = in->shape[nd - 1 - d];
        break;
    case V_NARROW: p->base[nd - 1] = in->shape[nd - 1] + 3; break;
    default: break;
    }
    p->numel = 1;
    for (int d = 0; d < nd; d++)
        p->numel *= p->base[d];
    p->nbytes = (size_t)p->numel * kiln_dtype_size(p->dt);
    p->bytes = calloc(p->nbytes ? p->nbytes : 1, 1);
    uint64_t s = 0x1234567ull + (uint64_t)(c - g_cases) * 7919u + (uint64_t)k * 104729u;
    switch (in->gen) {
    case G_UNI:
        for (int64_t i = 0; i < p->numel; i++) {
            double v = in->lo + (in->hi - in->lo) * rng_u01(&s);
            store(p->dt, p->bytes, i, kiln_dtype_is_float(p->dt) ? v : floor(v));
        }
        break;
    case G_INT:
        for (int64_t i = 0; i < p->numel; i++) {
            int64_t span = (int64_t)(in->hi - in->lo);
            store(p->dt, p->bytes, i, in->lo + (double)(int64_t)(rng_next(&s) % (uint64_t)span));
        }
        break;
    case G_BOOL:
        for (int64_t i = 0; i < p->numel; i++)
            store(p->dt, p->bytes, i, (double)(rng_next(&s) & 1));
        break;
    case G_SPECIAL: {
        int nsp = (int)(sizeof specials / sizeof specials[0]);
        for (int64_t i = 0; i < p->numel; i++) {
            double v = in->lo + (in->hi - in->lo) * rng_u01(&s);
            if (rng_next(&s) % 3 == 0)
                v = specials[rng_next(&s) % (uint64_t)nsp];
            store(p->dt, p->bytes, i, v);
        }
        break;
    }
    case G_UIDX: {
        /* Lines along dim d of the (contiguous) shape get distinct values < n. */
        int d = (int)in->lo;
        int64_t n = (int64_t)in->hi, len = in->shape[d], inner = 1;
        for (int e = d + 1; e < nd; e++)
            inner *= in->shape[e];
        int64_t outer = p->numel / (len * inner);
        int64_t *perm = malloc((size_t)n * sizeof *perm);
        for (int64_t o = 0; o < outer; o++)
            for (int64_t j = 0; j < inner; j++) {
                for (int64_t i = 0; i < n; i++)
                    perm[i] = i;
                for (int64_t i = n - 1; i > 0; i--) {
                    int64_t r = (int64_t)(rng_next(&s) % (uint64_t)(i + 1)), t = perm[i];
                    perm[i] = perm[r];
                    perm[r] = t;
                }
                for (int64_t i = 0; i < len; i++)
                    store(p->dt, p->bytes, (o * len + i) * inner + j, (double)perm[i]);
            }
        free(perm);
        break;
    }
    case G_DISTINCT: {
        int64_t *perm = malloc((size_t)(p->numel ? p->numel : 1) * sizeof *perm);
        for (int64_t i = 0; i < p->numel; i++)
            perm[i] = i;
        for (int64_t i = p->numel - 1; i > 0; i--) {
            int64_t r = (int64_t)(rng_next(&s) % (uint64_t)(i + 1)), t = perm[i];
            perm[i] = perm[r];
            perm[r] = t;
        }
        for (int64_t i = 0; i < p->numel; i++)
            store(p->dt, p->bytes, i, (double)perm[i] * in->lo - in->hi);
        free(perm);
        break;
    }
    case G_CAUSAL: {
        int64_t rows = p->base[nd - 2], cols = p->base[nd - 1];
        for (int64_t i = 0; i < p->numel; i++) {
            int64_t r = (i / cols) % rows, col = i % cols;
            store(p->dt, p->bytes, i, col <= r || col == cols - 1 ? 1.0 : 0.0);
        }
        break;
    }
    }
}

/* Upload a prepared input to dev and present it through its view. */
static kiln_tensor *present(const conf_input *in, const prepared *p, kiln_device *dev,
                            kiln_tensor **base)
{
    *base = kiln_from_data(dev, p->dt, p->ndim, p->base, p->bytes, p->nbytes);
    kiln_tensor *t = *base;
    int nd = in->ndim;
    switch (in->view) {
    case V_NONE: return t;
    case V_T: return kiln_transpose(t, -2, -1);
    case V_STEP: return kiln_slice(t, 0, 1, p->base[0], 2);
    case V_FLIP: return nd > 1 ? kiln_flip(t, KILN_DIMS(0, -1)) : kiln_flip(t, KILN_DIMS(0));
    case V_EXPAND: return kiln_expand(t, in->ndim, in->shape);
    case V_PERM: {
        int order[KILN_MAX_DIMS];
        for (int d = 0; d < nd; d++)
            order[d] = nd - 1 - d;
        return kiln_permute(t, nd, order);
    }
    case V_NARROW: return kiln_narrow(t, -1, 2, in->shape[nd - 1]);
    }
    return t;
}

/* ------------------------------------------------------------ running one case */

typedef struct result {
    int status;                /* 0 ok, 1 error, 2 unsupported */
    char msg[600];
    int nout;
    kiln_dtype dt[CONF_MAX_OUT];
    int ndim[CONF_MAX_OUT];
    int64_t shape[CONF_MAX_OUT][KILN_MAX_DIMS];
    int64_t numel[CONF_MAX_OUT];
    void *data[CONF_MAX_OUT];
} result;

static void result_free(result *r)
{
    for (int i = 0; i < CONF_MAX_OUT; i++) {
        free(r->data[i]);
        r->data[i] = NULL;
    }
}

static bool contains_ci(const char *hay, const char *needle)
{
    size_t n = strlen(needle);
    for (; *hay; hay++) {
        size_t i = 0;
        while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i]))
            i++;
        if (i == n)
            return true;
    }
    return false;
}

static bool is_unsupported(const char *msg)
{
    return contains_ci(msg, "unsupported") || contains_ci(msg, "not supported") ||
           contains_ci(msg, "enotsup") || contains_ci(msg, "not implemented") ||
           contains_ci(msg, "not defined for");
}

#define GUARD_N 1024
#define GUARD_VALUE 1515870810.0 /* 0x5a5a5a5a */

static void run_on(const conf_case *c, kiln_device *dev, const prepared *prep, result *r)
{
    memset(r, 0, sizeof *r);
    kiln_scope_begin();
    kiln_tensor *base[CONF_MAX_IN] = {0}, *in[CONF_MAX_IN] = {0}, *out[CONF_MAX_OUT] = {0};
    /* Guard tensors allocated around the inputs: an op that writes past its buffers
     * into a neighbouring allocation of the device's pool shows up here. */
    kiln_tensor *guard[2];
    guard[0] = kiln_full(dev, KILN_I32, KILN_SHAPE(GUARD_N), GUARD_VALUE);
    for (int k = 0; k < c->nin; k++) {
        in[k] = present(&c->in[k], &prep[k], dev, &base[k]);
        if (!in[k]) {
            r->status = 1;
            snprintf(r->msg, sizeof r->msg, "preparing input %d failed: %s", k, kiln_error());
            kiln_scope_end();
            return;
        }
    }
    guard[1] = kiln_full(dev, KILN_I32, KILN_SHAPE(GUARD_N), GUARD_VALUE);
    kiln_error_clear();
    int nout = c->build(c, dev, in, out);
    /* an asynchronous device may report what it finds while the work runs (an index out of
     * range) at the next sync instead: the message must then name the op all the same */
    if (c->expect_error && nout >= 0 && kiln_device_sync(dev) < 0)
        nout = -1;
    if (c->expect_error) {
        if (nout >= 0) {
            r->status = 1;
            snprintf(r->msg, sizeof r->msg, "expected an error mentioning \"%s\", the call succeeded",
                     c->expect_error);
        } else if (!strstr(kiln_error(), c->expect_error)) {
            r->status = 1;
            snprintf(r->msg, sizeof r->msg, "error message \"%s\" does not mention \"%s\"",
                     kiln_error(), c->expect_error);
        }
        kiln_scope_end();
        return;
    }
    if (nout < 0) {
        const char *m = kiln_error();
        r->status = is_unsupported(m) ? 2 : 1;
        snprintf(r->msg, sizeof r->msg, "%s", *m ? m : "(a call returned NULL with no message)");
        kiln_scope_end();
        return;
    }
    r->nout = nout;
    for (int i = 0; i < nout && r->status == 0; i++) {
        kiln_tensor *t = out[i];
        r->dt[i] = kiln_tensor_dtype(t);
        r->ndim[i] = kiln_tensor_ndim(t);
        memcpy(r->shape[i], kiln_tensor_shape(t), (size_t)r->ndim[i] * sizeof(int64_t));
        r->numel[i] = kiln_tensor_numel(t);
        size_t nb = (size_t)r->numel[i] * kiln_dtype_size(r->dt[i]);
        r->data[i] = malloc(nb ? nb : 1);
        if (kiln_to_data(t, r->data[i], nb) < 0) {
            r->status = 1;
            snprintf(r->msg, sizeof r->msg, "downloading output %d failed: %s", i, kiln_error());
        }
    }
    for (int g = 0; g < 2 && r->status == 0; g++) {
        int32_t back[GUARD_N];
        if (!guard[g] || kiln_to_data(guard[g], back, sizeof back) < 0) {
            r->status = 1;
            snprintf(r->msg, sizeof r->msg, "guard tensor %d unavailable: %s", g, kiln_error());
            break;
        }
        for (int i = 0; i < GUARD_N; i++)
            if (back[i] != (int32_t)GUARD_VALUE) {
                r->status = 1;
                snprintf(r->msg, sizeof r->msg, "guard tensor %d element %d overwritten (%d)", g, i, back[i]);
                break;
            }
    }
    /* Sentinel: inputs (their whole base storage) must come back as uploaded. */
    for (int k = 0; k < c->nin && r->status == 0; k++) {
        if (c->in[k].mutated)
            continue;
        void *back = malloc(prep[k].nbytes ? prep[k].nbytes : 1);
        if (kiln_to_data(base[k], back, prep[k].nbytes) < 0) {
            r->status = 1;
            snprintf(r->msg, sizeof r->msg, "downloading input %d failed: %s", k, kiln_error());
        } else if (memcmp(back, prep[k].bytes, prep[k].nbytes) != 0) {
            int64_t first = 0;
            size_t es = kiln_dtype_size(prep[k].dt);
            while (memcmp((char *)back + first * (int64_t)es, (char *)prep[k].bytes + first * (int64_t)es, es) == 0)
                first++;
            r->status = 1;
            snprintf(r->msg, sizeof r->msg,
                     "input %d was modified by the op (first changed element %lld: %g -> %g)", k,
                     (long long)first, load(prep[k].dt, prep[k].bytes, first), load(prep[k].dt, back, first));
        }
        free(back);
    }
    kiln_scope_end();
}

static void default_tol(kiln_dtype dt, double *a, double *b)
{
    switch (dt) {
    case KILN_F64: *a = 1e-10; *b = 1e-12; break;
    case KILN_F16: *a = 2e-3; *b = 1e-4; break;
    case KILN_BF16: *a = 1.6e-2; *b = 1e-3; break;
    default: *a = 1e-5; *b = 1e-6; break;
    }
}

/* Compare a target result with ref; on mismatch write why into msg and return false. */
static bool compare(const conf_case *c, const result *ref, const result *got, char *msg, size_t len)
{
    if (ref->nout != got->nout) {
        snprintf(msg, len, "%d outputs, ref gave %d", got->nout, ref->nout);
        return false;
    }
    for (int o = 0; o < ref->nout; o++) {
        if (ref->dt[o] != got->dt[o]) {
            snprintf(msg, len, "output %d dtype %s, ref %s", o, kiln_dtype_name(got->dt[o]),
                     kiln_dtype_name(ref->dt[o]));
            return false;
        }
        if (ref->ndim[o] != got->ndim[o] ||
            memcmp(ref->shape[o], got->shape[o], (size_t)ref->ndim[o] * sizeof(int64_t)) != 0) {
            snprintf(msg, len, "output %d shape differs from ref (ndim %d vs %d, numel %lld vs %lld)", o,
                     got->ndim[o], ref->ndim[o], (long long)got->numel[o], (long long)ref->numel[o]);
            return false;
        }
        kiln_dtype dt = ref->dt[o];
        int64_t n = ref->numel[o];
        if (!kiln_dtype_is_float(dt)) {
            for (int64_t i = 0; i < n; i++)
                if (load_int(dt, got->data[o], i) != load_int(dt, ref->data[o], i)) {
                    snprintf(msg, len, "output %d element %lld: %lld, ref %lld", o, (long long)i,
                             (long long)load_int(dt, got->data[o], i),
                             (long long)load_int(dt, ref->data[o], i));
                    return false;
                }
            continue;
        }
        conf_tol kind = c->tol;
        double ta = c->tol_a, tb = c->tol_b;
        if (kind == TOL_DEFAULT) {
            kind = TOL_REL;
            default_tol(dt, &ta, &tb);
        } else if (kind == TOL_NMSE && ta == 0) {
            ta = dt == KILN_F64 ? 1e-20 : dt == KILN_F16 ? 1e-5 : dt == KILN_BF16 ? 1e-4 : 1e-9;
        } else if (kind == TOL_REL && dt != KILN_F32 && dt != KILN_F64) {
            double da, db; /* a case's f32 tolerance never tightens a half-precision output */
            default_tol(dt, &da, &db);
            ta = ta > da ? ta : da;
            tb = tb > db ? tb : db;
        }
        double num = 0, den = 0, worst = -1;
        int64_t worst_i = -1;
        for (int64_t i = 0; i < n; i++) {
            double g = load(dt, got->data[o], i), r = load(dt, ref->data[o], i);
            if (isnan(r) || isnan(g) || isinf(r) || isinf(g)) {
                if ((isnan(r) != isnan(g)) || (!isnan(r) && g != r)) {
                    snprintf(msg, len, "output %d element %lld: %g, ref %g (NaN/Inf disagree)", o,
                             (long long)i, g, r);
                    return false;
                }
                continue;
            }
            double e = fabs(g - r);
            if (kind == TOL_EXACT && g != r) {
                snprintf(msg, len, "output %d element %lld: %.9g, ref %.9g (exact match required)", o,
                         (long long)i, g, r);
                return false;
            }
            if (kind == TOL_REL) {
                double excess = e - (ta * fabs(r) + tb);
                if (excess > 0 && (worst_i < 0 || excess > worst)) {
                    worst = excess;
                    worst_i = i;
                }
            }
            num += e * e;
            den += r * r;
        }
        if (kind == TOL_REL && worst_i >= 0) {
            double g = load(dt, got->data[o], worst_i), r = load(dt, ref->data[o], worst_i);
            snprintf(msg, len, "output %d element %lld: %.9g, ref %.9g (|diff| %.3g > %.3g*|ref| + %.3g)",
                     o, (long long)worst_i, g, r, fabs(g - r), ta, tb);
            return false;
        }
        if (kind == TOL_NMSE) {
            double nmse = den > 0 ? num / den : num;
            if (!(nmse <= ta)) {
                snprintf(msg, len, "output %d NMSE %.3g > %.3g", o, nmse, ta);
                return false;
            }
        }
    }
    return true;
}

/* ------------------------------------------------------------ bookkeeping */

enum { ST_PASS, ST_FAIL, ST_SKIP, ST_NSTATES };

typedef struct op_row {
    const char *op;
    int count[1 + 8][ST_NSTATES]; /* column 0 is ref, then the targets */
} op_row;

static op_row *g_rows;
static int g_nrows;

static op_row *row_for(const char *op)
{
    for (int i = 0; i < g_nrows; i++)
        if (strcmp(g_rows[i].op, op) == 0)
            return &g_rows[i];
    g_rows = realloc(g_rows, (size_t)(g_nrows + 1) * sizeof *g_rows);
    memset(&g_rows[g_nrows], 0, sizeof *g_rows);
    g_rows[g_nrows].op = op;
    return &g_rows[g_nrows++];
}

static bool in_list(const char *list, const char *name)
{
    if (!list)
        return true;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0)
            return true;
        if (!e)
            break;
        p = e + 1;
    }
    return false;
}

static void usage(void)
{
    fprintf(stderr, "usage: conformance [--list] [-o OP[,OP...]] [-b BACKEND|SPEC (remote://host:port/device, counting:cpu, cpu?threads=1)] [-v]\n");
}

int main(int argc, char **argv)
{
    bool list = false, self_test = false;
    const char *ops = NULL, *backend = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--list") == 0 || strcmp(argv[i], "-l") == 0)
            list = true;
        else if (strcmp(argv[i], "--self-test") == 0)
            self_test = true;
        else if (strcmp(argv[i], "-v") == 0)
            g_verbose = true;
        else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc)
            ops = argv[++i];
        else if (strcmp(argv[i], "-b") == 0 && i + 1 < argc)
            backend = argv[++i];
        else {
            usage();
            return 2;
        }
    }

    g_ref = kiln_device_open("ref");
    if (!g_ref) {
        fprintf(stderr, "conformance: cannot open the ref device: %s\n", kiln_error());
        return 1;
    }
    char compiled[256];
    snprintf(compiled, sizeof compiled, "%s", kiln_backends_compiled());
    printf("backends compiled: %s\n", compiled);
    for (char *save = NULL, *tok = strtok_r(compiled, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        if (strcmp(tok, "ref") == 0 || (backend && strcmp(tok, backend) != 0))
            continue;
        kiln_device *d = kiln_device_open(tok);
        if (!d) {
            printf("backend %s: does not open here (%s); not tested\n", tok, kiln_error());
            continue;
        }
        if (g_ntargets < 8)
            g_targets[g_ntargets++] = d;
    }
    /* a device named by a whole spec: -b remote://host:port/cpu, -b counting:cpu (a
     * decorator), -b cpu?threads=1 (options) */
    if (backend && (strchr(backend, ':') || strchr(backend, '?'))) {
        kiln_device *d = kiln_device_open(backend);
        if (!d)
            printf("backend %s: does not open here (%s); not tested\n", backend, kiln_error());
        else
            g_targets[g_ntargets++] = d;
    }
    if (backend && strcmp(backend, "ref") == 0) /* ref against itself: a determinism check */
        g_targets[g_ntargets++] = kiln_device_open("ref");
    if (backend && strcmp(backend, "ref") != 0 && g_ntargets == 0) {
        fprintf(stderr, "conformance: backend %s is not available\n", backend);
        return 1;
    }

    if (self_test) {
        conf_cases_selftest();
    } else {
        conf_cases_create();
        conf_cases_shape();
        conf_cases_elementwise();
        conf_cases_reduce();
        conf_cases_index();
        conf_cases_linalg();
        conf_cases_nn();
        conf_cases_optim();
        conf_cases_errors();
        conf_cases_threads();
    }

    int passed = 0, failed = 0, skipped = 0, ran_cases = 0;
    for (int ci = 0; ci < g_ncases; ci++) {
        const conf_case *c = &g_cases[ci];
        if (!in_list(ops, c->op))
            continue;
        ran_cases++;
        op_row *row = row_for(c->op);
        prepared prep[CONF_MAX_IN];
        for (int k = 0; k < c->nin; k++)
            prepare(c, k, &prep[k]);

        result ref;
        run_on(c, g_ref, prep, &ref);
        if (ref.status == 1) {
            printf("FAIL %-18s ref     %s: %s\n", c->op, c->label, ref.msg);
            row->count[0][ST_FAIL]++;
            failed++;
        } else if (ref.status == 2) {
            row->count[0][ST_SKIP]++;
            if (g_verbose)
                printf("skip %-18s ref     %s: %s\n", c->op, c->label, ref.msg);
        } else {
            row->count[0][ST_PASS]++;
            if (g_ntargets == 0)
                passed++;
        }
        if (ref.status == 2 && g_ntargets == 0)
            skipped++;

        for (int t = 0; t < g_ntargets; t++) {
            const char *dn = kiln_device_name(g_targets[t]);
            int st;
            char why[700] = "";
            if (c->expect_error) {
                result got;
                run_on(c, g_targets[t], prep, &got);
                st = got.status == 0 ? ST_PASS : ST_FAIL;
                snprintf(why, sizeof why, "%s", got.msg);
                result_free(&got);
            } else if (ref.status != 0) {
                st = ST_SKIP;
                snprintf(why, sizeof why, "not run: ref %s", ref.status == 2 ? "unsupported" : "failed");
            } else {
                result got;
                run_on(c, g_targets[t], prep, &got);
                if (got.status == 2) {
                    if (strcmp(dn, "cpu") == 0) {
                        st = ST_FAIL;
                        snprintf(why, sizeof why, "skipped (unsupported) on cpu although ref supports it: %s",
                                 got.msg);
                    } else {
                        st = ST_SKIP;
                        snprintf(why, sizeof why, "skipped (unsupported): %s", got.msg);
                    }
                } else if (got.status == 1) {
                    st = ST_FAIL;
                    snprintf(why, sizeof why, "%s", got.msg);
                } else {
                    st = compare(c, &ref, &got, why, sizeof why) ? ST_PASS : ST_FAIL;
                }
                result_free(&got);
                if (c->expect_mismatch) {
                    if (st == ST_FAIL) {
                        st = ST_PASS;
                        char tmp[sizeof why];
                        /* the message is cut to fit rather than overflowing into a warning */
                        snprintf(tmp, sizeof tmp, "caught: %.680s", why);
                        snprintf(why, sizeof why, "%s", tmp);
                    } else if (st == ST_PASS) {
                        st = ST_FAIL;
                        snprintf(why, sizeof why, "the planted fault went unnoticed");
                    }
                }
            }
            row->count[1 + t][st]++;
            if (st == ST_PASS)
                passed++;
            else if (st == ST_FAIL)
                failed++;
            else
                skipped++;
            if (st == ST_FAIL)
                printf("FAIL %-18s %-7s %s: %s\n", c->op, dn, c->label, why);
            else if (g_verbose)
                printf("%s %-18s %-7s %s%s%s\n", st == ST_PASS ? "ok  " : "skip", c->op, dn, c->label,
                       *why ? ": " : "", why);
        }
        result_free(&ref);
        for (int k = 0; k < c->nin; k++)
            free(prep[k].bytes);
    }

    if (list) {
        printf("\n%-22s %-16s", "op", "ref");
        for (int t = 0; t < g_ntargets; t++)
            printf(" %-22s", kiln_device_name(g_targets[t]));
        printf("\n");
        for (int r = 0; r < g_nrows; r++) {
            printf("%-22s", g_rows[r].op);
            for (int col = 0; col <= g_ntargets; col++) {
                int *n = g_rows[r].count[col];
                char cell[64];
                if (n[ST_FAIL])
                    snprintf(cell, sizeof cell, "FAIL %d/%d", n[ST_FAIL], n[ST_PASS] + n[ST_FAIL] + n[ST_SKIP]);
                else if (n[ST_PASS] && n[ST_SKIP])
                    snprintf(cell, sizeof cell, "pass %d, skip %d", n[ST_PASS], n[ST_SKIP]);
                else if (n[ST_SKIP])
                    snprintf(cell, sizeof cell, "unsupported %d", n[ST_SKIP]);
                else
                    snprintf(cell, sizeof cell, "pass %d", n[ST_PASS]);
                printf(" %-*s", col == 0 ? 16 : 22, cell);
            }
            printf("\n");
        }
        printf("\n");
    }

    printf("%d cases on ref and %d target backend(s); skipped (unsupported): %d\n", ran_cases,
           g_ntargets, skipped);
    printf("conformance: %d passed, %d failed, %d skipped\n", passed, failed, skipped);
    free(g_rows);
    free(g_cases);
    for (int t = 0; t < g_ntargets; t++)
        kiln_device_close(g_targets[t]);
    kiln_device_close(g_ref);
    return failed ? 1 : 0;
}
