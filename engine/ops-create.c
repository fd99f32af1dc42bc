/*
 * engine/ops-create.c — creating tensors (constants, ranges, host data, random draws),
 * reading them back, and the data-movement helpers every other op file leans on
 * (strided copy with conversion, fill, casting, index range checks).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "tensor-impl.h"

/* ----------------------------------------------------------- internal helpers */

int kiln__copy_into(kiln_tensor *out, kiln_tensor *in, const char *op)
{
    if (kiln__same_device(out, in, op) < 0)
        return -1;
    if (kiln__numel(out) == 0)
        return 0;
    kiln_tdesc od, id;
    kiln__desc(out, &od);
    kiln__desc(in, &id);
    const kiln_backend_iface *be = kiln__be(out);
    if (!kiln__supports(kiln__dev(out), KILN_ENTRY_COPY, -1, out->dtype, NULL))
        return kiln__unsupported(kiln__dev(out), op, KILN_ENTRY_COPY, -1, out->dtype);
    int rc = be->copy(kiln__ctx(out), &od, &id);
    atomic_fetch_add(&out->storage->version, 1u);
    kiln__stamp(out->storage);
    return rc < 0 ? rc : 0;
}

kiln_tensor *kiln__copy_as(kiln_tensor *t, kiln_dtype dt, const char *op)
{
    kiln_tensor *out = kiln__alloc(kiln__dev(t), dt, t->ndim, t->shape, op);
    if (!out)
        return NULL;
    if (kiln__copy_into(out, t, op) < 0) {
        kiln_tensor_release(out);
        return NULL;
    }
    return out;
}

kiln_tensor *kiln__cast(kiln_tensor *t, kiln_dtype dt, const char *op)
{
    if (t->dtype == dt)
        return kiln_tensor_retain(t);
    return kiln__copy_as(t, dt, op);
}

kiln_tensor *kiln__contiguous(kiln_tensor *t, const char *op)
{
    if (kiln_tensor_is_contiguous(t))
        return kiln_tensor_retain(t);
    return kiln__copy_as(t, t->dtype, op);
}

/* t was just written by an op that reads no tensor (a fill, arange, a random draw): when t
 * covers its whole storage, the value depends on nothing an earlier error could spoil. */
static void stamp_written_from_nothing(kiln_tensor *t)
{
    if (t->offset == 0 && kiln_tensor_is_contiguous(t) &&
        (size_t)kiln__numel(t) * kiln_dtype_size(t->dtype) == t->storage->nbytes)
        kiln__stamp_source(t->storage);
    else
        kiln__stamp(t->storage);
}

int kiln__fill(kiln_tensor *t, double value, const char *op)
{
    if (kiln__numel(t) == 0)
        return 0;
    const kiln_backend_iface *be = kiln__be(t);
    if (!kiln__supports(kiln__dev(t), KILN_ENTRY_FILL, -1, t->dtype, NULL))
        return kiln__unsupported(kiln__dev(t), op, KILN_ENTRY_FILL, -1, t->dtype);
    kiln_tdesc d;
    kiln__desc(t, &d);
    int rc = be->fill(kiln__ctx(t), &d, value);
    atomic_fetch_add(&t->storage->version, 1u);
    stamp_written_from_nothing(t);
    return rc < 0 ? rc : 0;
}

kiln_tensor *kiln__scalar(kiln_device *dev, kiln_dtype dt, double value, const char *op)
{
    kiln_tensor *t = kiln__alloc(dev, dt, 0, NULL, op);
    if (t && kiln__fill(t, value, op) < 0) {
        kiln_tensor_release(t);
        return NULL;
    }
    return t;
}

static double element_to_f64(kiln_dtype dt, const unsigned char *p)
{
    switch (dt) {
    case KILN_F32: { float v; memcpy(&v, p, 4); return v; }
    case KILN_F64: { double v; memcpy(&v, p, 8); return v; }
    case KILN_F16: { uint16_t v; memcpy(&v, p, 2); return kiln_f16_to_f32(v); }
    case KILN_BF16: { uint16_t v; memcpy(&v, p, 2); return kiln_bf16_to_f32(v); }
    case KILN_I64: { int64_t v; memcpy(&v, p, 8); return (double)v; }
    case KILN_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    case KILN_U8: return *p;
    case KILN_BOOL: return *p ? 1.0 : 0.0;
    default: return NAN;
    }
}

static int download(kiln_tensor *t, void *out, size_t nbytes, const char *op)
{
    if (nbytes == 0)
        return 0;
    kiln_tensor *c = kiln__contiguous(t, op);
    if (!c)
        return -1;
    const kiln_backend_iface *be = kiln__be(c);
    size_t esz = kiln_dtype_size(c->dtype);
    kiln__queue_touch(c->storage);
    kiln_queue *q = kiln__queue_cur(kiln__dev(c));
    /* a value an earlier error spoiled is never handed out, however often it is read */
    /* c is t, or a copy the drain below vouches for: t's storage is the one to ask about */
    int rc = kiln__spoiled(t->storage, op);
    if (rc == 0) {
        kiln__drain d = kiln__drain_begin(q);
        /* range checks parked on this queue are read first: a violation is this read's error */
        rc = kiln__checks_run(q);
        if (rc == 0)
            rc = be->buffer_download(kiln__ctx(c), c->storage->buf, (size_t)c->offset * esz, out, nbytes);
        rc = kiln__drain_end(q, d, rc);
        /* the drain may just have found the error that spoiled this very value */
        if (rc == 0)
            rc = kiln__spoiled(t->storage, op);
    }
    kiln_tensor_release(c);
    return rc < 0 ? rc : 0;
}

int kiln__read_f64(kiln_tensor *t, double *out, int64_t n, const char *op)
{
    int64_t numel = kiln__numel(t);
    if (numel != n)
        return kiln__error_set("%s: internal read of %lld elements from a tensor of %lld", op,
                               (long long)n, (long long)numel);
    size_t esz = kiln_dtype_size(t->dtype);
    unsigned char *raw = malloc(n ? (size_t)n * esz : 1);
    if (!raw)
        return kiln__error_set("%s: out of memory", op);
    if (download(t, raw, (size_t)n * esz, op) < 0) {
        free(raw);
        return -1;
    }
    for (int64_t i = 0; i < n; i++)
        out[i] = element_to_f64(t->dtype, raw + (size_t)i * esz);
    free(raw);
    return 0;
}

int kiln__index_error(const char *op, const char *noun, int64_t v, int64_t lo, int64_t hi)
{
    if (lo == 0)
        return kiln__error_set_code(KILN_EINVAL, "%s: %s %lld is out of bounds for size %lld", op, noun,
                                    (long long)v, (long long)hi);
    return kiln__error_set_code(KILN_EINVAL, "%s: %s %lld is out of range [%lld, %lld)", op, noun, (long long)v,
                                (long long)lo, (long long)hi);
}

int kiln__check_range(kiln_tensor *index, int64_t lo, int64_t hi, const char *op, const char *noun)
{
    int64_t n = kiln__numel(index);
    if (n == 0)
        return 0;
    kiln_device *dev = kiln__dev(index);
    const kiln_backend_iface *be = dev->be;
    if (kiln__supports(dev, KILN_ENTRY_INDEX_CHECK, -1, index->dtype, NULL)) {
        /* on the device: no wait here; an async device reports at its next sync */
        kiln_tdesc id;
        kiln__desc(index, &id);
        return be->index_check(kiln__ctx(index), &id, lo, hi, op, noun) < 0 ? -1 : 0;
    }
    if (dev->caps.async)
        return kiln__check_defer(index, lo, hi, op, noun);   /* read with the next read */
    if (!kiln__supports(dev, KILN_ENTRY_REDUCE, -1, index->dtype, NULL))
        return kiln__unsupported(dev, op, KILN_ENTRY_REDUCE, -1, index->dtype);
    /* Two reductions and two one-element reads: a wait the device entry avoids. */
    int64_t ones[KILN_MAX_DIMS];
    for (int i = 0; i < index->ndim; i++)
        ones[i] = 1;
    uint32_t mask = index->ndim ? (uint32_t)((1u << index->ndim) - 1) : 0;
    double v[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        kiln_tensor *r = kiln__alloc(dev, index->dtype, index->ndim, ones, op);
        if (!r)
            return -1;
        kiln_tdesc od, id;
        kiln__desc(r, &od);
        kiln__desc(index, &id);
        int rc = be->reduce(kiln__ctx(index), k ? KILN_REDUCE_MAX : KILN_REDUCE_MIN, &od, &id, mask, 0);
        if (rc >= 0)
            rc = kiln__read_f64(r, &v[k], 1, op);
        kiln_tensor_release(r);
        if (rc < 0)
            return -1;
    }
    if (v[0] < (double)lo || v[1] >= (double)hi)
        return kiln__index_error(op, noun, (int64_t)(v[0] < (double)lo ? v[0] : v[1]), lo, hi);
    return 0;
}

/* ------------------------------------------------------------------- creation */

kiln_tensor *kiln_empty(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape)
{
    return kiln__ret(kiln__alloc(dev, dt, ndim, shape, "empty"));
}

static kiln_tensor *full_impl(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape,
                              double value, const char *op)
{
    kiln_tensor *t = kiln__alloc(dev, dt, ndim, shape, op);
    if (t && kiln__fill(t, value, op) < 0) {
        kiln_tensor_release(t);
        return NULL;
    }
    return kiln__ret(t);
}

kiln_tensor *kiln_zeros(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape)
{
    return full_impl(dev, dt, ndim, shape, 0.0, "zeros");
}

kiln_tensor *kiln_ones(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape)
{
    return full_impl(dev, dt, ndim, shape, 1.0, "ones");
}

/* PyTorch's rule for a value put into an integer dtype: the fraction goes (2.5 -> 2), but
 * a value outside the dtype's range, NaN or an infinity is an error, where a backend's
 * conversion would wrap it (300 -> 44 in u8) or leave an arbitrary number. bool takes
 * any value (nonzero is true); floating dtypes round, an overflow becoming inf. */
int kiln__check_int_value(kiln_dtype dt, double value, const char *op, const char *what)
{
    double lo = 0, hi = 0;
    if (kiln_dtype_is_float(dt) || !kiln__dtype_int_range(dt, &lo, &hi))
        return 0;
    double t = trunc(value);
    if (t >= lo && t < hi)
        return 0;
    return kiln__error_set("%s: %s %.17g does not fit %s, which holds [%.0f, %.0f)", op, what, value,
                           kiln_dtype_name(dt), lo, hi);
}

kiln_tensor *kiln_full(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape, double value)
{
    if (kiln__check_int_value(dt, value, "full", "value") < 0)
        return NULL;
    return full_impl(dev, dt, ndim, shape, value, "full");
}

static int run_arange(kiln_tensor *t, double start, double step, const char *op)
{
    if (kiln__numel(t) == 0)
        return 0;
    const kiln_backend_iface *be = kiln__be(t);
    if (!kiln__supports(kiln__dev(t), KILN_ENTRY_ARANGE, -1, t->dtype, NULL))
        return kiln__unsupported(kiln__dev(t), op, KILN_ENTRY_ARANGE, -1, t->dtype);
    kiln_tdesc d;
    kiln__desc(t, &d);
    int rc = be->arange(kiln__ctx(t), &d, start, step);
    stamp_written_from_nothing(t);
    return rc < 0 ? rc : 0;
}

kiln_tensor *kiln_arange(kiln_device *dev, kiln_dtype dt, double start, double end, double step)
{
    if (!isfinite(start) || !isfinite(end) || !isfinite(step) || step == 0) {
        kiln__error_set("arange: start %g, end %g and step %g must be finite with a nonzero step", start,
                        end, step);
        return NULL;
    }
    double len = ceil((end - start) / step);
    if (len < 0) {
        kiln__error_set("arange: step %g goes away from end (start %g, end %g)", step, start, end);
        return NULL;
    }
    if (len > 9.0e18) {
        kiln__error_set("arange: %g elements is too many", len);
        return NULL;
    }
    int64_t n = (int64_t)len;
    if (n > 0 && (kiln__check_int_value(dt, start, "arange", "start") < 0 ||
                  kiln__check_int_value(dt, start + (double)(n - 1) * step, "arange", "last value") < 0))
        return NULL;
    kiln_tensor *t = kiln__alloc(dev, dt, 1, &n, "arange");
    if (t && run_arange(t, start, step, "arange") < 0) {
        kiln_tensor_release(t);
        return NULL;
    }
    return kiln__ret(t);
}

kiln_tensor *kiln_linspace(kiln_device *dev, kiln_dtype dt, double start, double end, int64_t steps)
{
    if (steps < 0) {
        kiln__error_set("linspace: steps %lld must be non-negative", (long long)steps);
        return NULL;
    }
    if (steps > 0 && (kiln__check_int_value(dt, start, "linspace", "start") < 0 ||
                      kiln__check_int_value(dt, end, "linspace", "end") < 0))
        return NULL;
    kiln_tensor *t = kiln__alloc(dev, dt, 1, &steps, "linspace");
    if (!t)
        return NULL;
    double step = steps > 1 ? (end - start) / (double)(steps - 1) : 0.0;
    int rc = run_arange(t, start, step, "linspace");
    if (rc == 0 && steps > 1) {
        /* Pin the last element to end exactly: start + (n-1)*step can miss it by an ulp. */
        int64_t one = 1, st = 1;
        kiln_tensor *last = kiln__view(t, 1, &one, &st, steps - 1);
        rc = last ? kiln__fill(last, end, "linspace") : -1;
        kiln_tensor_release(last);
    }
    if (rc < 0) {
        kiln_tensor_release(t);
        return NULL;
    }
    return kiln__ret(t);
}

kiln_tensor *kiln_eye(kiln_device *dev, kiln_dtype dt, int64_t n, int64_t m)
{
    if (n < 0 || m < 0) { /* as PyTorch's eye: no negative m standing for "m = n" */
        kiln__error_set("eye: n %lld and m %lld must be non-negative", (long long)n, (long long)m);
        return NULL;
    }
    int64_t shape[2] = {n, m};
    kiln_tensor *t = kiln__alloc(dev, dt, 2, shape, "eye");
    if (!t)
        return NULL;
    int rc = kiln__fill(t, 0.0, "eye");
    int64_t k = n < m ? n : m;
    if (rc == 0 && k > 0) {
        int64_t st = m + 1;
        kiln_tensor *diag = kiln__view(t, 1, &k, &st, 0);
        rc = diag ? kiln__fill(diag, 1.0, "eye") : -1;
        kiln_tensor_release(diag);
    }
    if (rc < 0) {
        kiln_tensor_release(t);
        return NULL;
    }
    return kiln__ret(t);
}

kiln_tensor *kiln_from_host_memory(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape, void *data,
                                   void (*release)(void *), void *release_ud)
{
    if (!dev) {
        kiln__error_set("from_host_memory: device is NULL");
        return NULL;
    }
    if (data && (uintptr_t)data % 64 != 0) {
        kiln__error_set("from_host_memory: data at %p is not 64-byte aligned", data);
        return NULL;
    }
    return kiln__ret(kiln__alloc_wrapped(dev, dt, ndim, shape, data, release, release_ud, "from_host_memory"));
}

kiln_tensor *kiln_from_data(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape,
                            const void *data, size_t nbytes)
{
    kiln_tensor *t = kiln__alloc(dev, dt, ndim, shape, "from_data");
    if (!t)
        return NULL;
    size_t want = t->storage->nbytes;
    char d[200];
    if (nbytes != want) {
        kiln__error_set("from_data: %s needs %zu bytes, got %zu", kiln__describe(t, d, sizeof d), want, nbytes);
        kiln_tensor_release(t);
        return NULL;
    }
    if (want && !data) {
        kiln__error_set("from_data: data is NULL for %s", kiln__describe(t, d, sizeof d));
        kiln_tensor_release(t);
        return NULL;
    }
    if (want) {
        int rc = dev->be->buffer_upload(kiln__qctx(dev), t->storage->buf, 0, data, want);
        if (rc < 0) {
            kiln_tensor_release(t);
            return NULL;
        }
    }
    kiln__stamp_source(t->storage);
    return kiln__ret(t);
}

int kiln_to_data(const kiln_tensor *t, void *out, size_t nbytes)
{
    if (!t)
        return -1;
    size_t want = (size_t)kiln__numel(t) * kiln_dtype_size(t->dtype);
    char d[200];
    if (nbytes != want)
        return kiln__error_set("to_data: %s holds %zu bytes, buffer has %zu", kiln__describe(t, d, sizeof d),
                               want, nbytes);
    if (want && !out)
        return kiln__error_set("to_data: output buffer is NULL");
    return download((kiln_tensor *)t, out, want, "to_data");
}

double kiln_item(const kiln_tensor *t)
{
    if (!t)
        return NAN;
    char d[200];
    if (kiln__numel(t) != 1) {
        kiln__error_set("item: %s has %lld elements, not 1", kiln__describe(t, d, sizeof d),
                        (long long)kiln__numel(t));
        return NAN;
    }
    double v = NAN;
    if (kiln__read_f64((kiln_tensor *)t, &v, 1, "item") < 0)
        return NAN;
    return v;
}

kiln_tensor *kiln_empty_like(const kiln_tensor *t)
{
    return t ? kiln_empty(kiln__dev(t), t->dtype, t->ndim, t->shape) : NULL;
}

kiln_tensor *kiln_zeros_like(const kiln_tensor *t)
{
    return t ? kiln_zeros(kiln__dev(t), t->dtype, t->ndim, t->shape) : NULL;
}

kiln_tensor *kiln_ones_like(const kiln_tensor *t)
{
    return t ? kiln_ones(kiln__dev(t), t->dtype, t->ndim, t->shape) : NULL;
}

kiln_tensor *kiln_full_like(const kiln_tensor *t, double value)
{
    return t ? kiln_full(kiln__dev(t), t->dtype, t->ndim, t->shape, value) : NULL;
}

/* ------------------------------------------------------------------- random */

static _Atomic uint64_t default_offset;
#define KILN_DEFAULT_SEED 0x6b696c6e5eedull

kiln_generator kiln_generator_make(uint64_t seed)
{
    kiln_generator g = {seed, 0};
    return g;
}

uint64_t kiln__gen_take(kiln_generator *gen, uint64_t n, uint64_t *seed)
{
    if (!gen) {
        *seed = KILN_DEFAULT_SEED;
        return atomic_fetch_add(&default_offset, n);
    }
    *seed = gen->seed;
    uint64_t off = gen->offset;
    gen->offset += n;
    return off;
}

static kiln_tensor *rng_impl(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape,
                             kiln_rng_kind kind, double p0, double p1, kiln_generator *gen,
                             const char *op)
{
    kiln_tensor *t = kiln__alloc(dev, dt, ndim, shape, op);
    if (!t)
        return NULL;
    int64_t n = kiln__numel(t);
    if (n == 0)
        return kiln__ret(t);
    if (!kiln__supports(dev, KILN_ENTRY_RNG, -1, dt, NULL)) {
        kiln__unsupported(dev, op, KILN_ENTRY_RNG, -1, dt);
        kiln_tensor_release(t);
        return NULL;
    }
    uint64_t seed = 0;
    uint64_t off = kiln__gen_take(gen, (uint64_t)n, &seed);
    kiln_tdesc d;
    kiln__desc(t, &d);
    if (dev->be->rng(kiln__qctx(dev), kind, &d, seed, off, p0, p1) < 0) {
        kiln_tensor_release(t);
        return NULL;
    }
    stamp_written_from_nothing(t);
    return kiln__ret(t);
}

kiln_tensor *kiln_rand_uniform(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape,
                               double low, double high, kiln_generator *gen)
{
    if (!kiln_dtype_is_float(dt) || !(low <= high) || !isfinite(low) || !isfinite(high)) {
        kiln__error_set("rand_uniform: needs a floating dtype and finite low <= high (got %s, %g, %g)",
                        kiln_dtype_name(dt), low, high);
        return NULL;
    }
    return rng_impl(dev, dt, ndim, shape, KILN_RNG_UNIFORM, low, high, gen, "rand_uniform");
}

kiln_tensor *kiln_rand_normal(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape,
                              double mean, double std, kiln_generator *gen)
{
    if (!kiln_dtype_is_float(dt) || !(std >= 0) || !isfinite(mean) || !isfinite(std)) {
        kiln__error_set("rand_normal: needs a floating dtype, finite mean and std >= 0 (got %s, %g, %g)",
                        kiln_dtype_name(dt), mean, std);
        return NULL;
    }
    return rng_impl(dev, dt, ndim, shape, KILN_RNG_NORMAL, mean, std, gen, "rand_normal");
}

kiln_tensor *kiln_rand_bernoulli(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape,
                                 double p, kiln_generator *gen)
{
    if (!(p >= 0 && p <= 1)) {
        kiln__error_set("rand_bernoulli: p %g must lie in [0, 1]", p);
        return NULL;
    }
    return rng_impl(dev, dt, ndim, shape, KILN_RNG_BERNOULLI, p, 0, gen, "rand_bernoulli");
}

kiln_tensor *kiln_rand_int(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape,
                           int64_t low, int64_t high, kiln_generator *gen)
{
    if (low >= high || dt == KILN_BOOL) {
        kiln__error_set("rand_int: needs low < high and a non-bool dtype (got [%lld, %lld), %s)",
                        (long long)low, (long long)high, kiln_dtype_name(dt));
        return NULL;
    }
    /* The bounds reach every backend as the rng entry's doubles (backend.h, and the remote
     * wire's float parameters), exact only up to 2^53: past that a backend would draw from
     * another range than asked, or overflow converting back (tensor.h says why not wider). */
    const int64_t exact = (int64_t)1 << 53;
    if (low < -exact || high > exact) {
        kiln__error_set("rand_int: bounds [%lld, %lld) must lie within [-2^53, 2^53] (+-%lld)", (long long)low,
                        (long long)high, (long long)exact);
        return NULL;
    }
    double lo = 0, hi = 0;
    if (kiln__dtype_int_range(dt, &lo, &hi) && ((double)low < lo || (double)high > hi)) {
        kiln__error_set("rand_int: [%lld, %lld) does not fit %s, which holds [%.0f, %.0f)", (long long)low,
                        (long long)high, kiln_dtype_name(dt), lo, hi);
        return NULL;
    }
    return rng_impl(dev, dt, ndim, shape, KILN_RNG_INT, (double)low, (double)high, gen, "rand_int");
}

/* Device to device when the backend can (buffer_copy_peer), else through host memory
 * the destination can upload from without staging. */
int kiln__copy_across(kiln_tensor *out, kiln_tensor *t, const char *op)
{
    kiln_device *dst = kiln__dev(out), *srcdev = kiln__dev(t);
    size_t nbytes = (size_t)kiln__numel(t) * kiln_dtype_size(t->dtype);
    if (nbytes == 0)
        return 0;
    kiln_tensor *c = kiln__contiguous(t, op);
    if (!c)
        return -1;
    int rc = KILN_ENOTSUP;
    if (kiln__spoiled(t->storage, op) < 0) {
        kiln_tensor_release(c);
        return -1;
    }
    bool peer = false;
    if (dst->be == srcdev->be && dst->be->buffer_copy_peer) {
        kiln__queue_touch(c->storage);
        kiln__queue_touch(out->storage);
        rc = dst->be->buffer_copy_peer(kiln__qctx(dst), out->storage->buf, 0, kiln__qctx(srcdev), c->storage->buf,
                                       (size_t)c->offset * kiln_dtype_size(c->dtype), nbytes);
        peer = rc == 0;
        if (rc < 0 && rc != KILN_ENOTSUP) {
            kiln_tensor_release(c);
            return rc;
        }
    }
    if (rc == KILN_ENOTSUP && srcdev->caps.host_memory) {
        /* from host memory: through plain memory the upload copies or stages before it
         * returns (buffer_upload's contract), so nothing waits for the destination */
        void *host = malloc(nbytes);
        rc = host ? download(c, host, nbytes, op)
                  : kiln__error_set_code(KILN_ENOMEM, "%s: out of host memory (%zu bytes)", op, nbytes);
        if (rc == 0)
            rc = dst->be->buffer_upload(kiln__qctx(dst), out->storage->buf, 0, host, nbytes);
        free(host);
    } else if (rc == KILN_ENOTSUP) {
        void *host = kiln_host_alloc(dst, nbytes);
        rc = host ? download(c, host, nbytes, op) : -1;
        if (rc == 0)
            rc = dst->be->buffer_upload(kiln__qctx(dst), out->storage->buf, 0, host, nbytes);
        /* an upload from host_alloc memory may read it until the queue passes it */
        if (rc == 0 && dst->be->host_alloc && dst->be->sync)
            rc = dst->be->sync(kiln__qctx(dst));
        kiln_host_free(dst, host);
    }
    /* through the host, the value was read back whole and unspoiled: it depends on nothing
     * still running on either device */
    if (rc == 0 && !peer && nbytes == out->storage->nbytes)
        kiln__stamp_source(out->storage);
    else
        kiln__stamp(out->storage);
    kiln_tensor_release(c);
    return rc < 0 ? -1 : 0;
}
