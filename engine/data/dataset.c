/*
 * engine/data/dataset.c — the data set object, in-memory arrays, and the index and
 * value transforms (map, shuffle, range, subset, split, windows, normalize).
 *
 * A transform is a data set whose get asks its source for one or more items and
 * rewrites them. Index transforms keep a table of source indices; nothing is copied,
 * so a shuffled split of a 60,000-image set costs two index arrays.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data-impl.h"
#include "error-impl.h"

/* ---------------------------------------------------------------------- sizes */

bool kiln__data_count(int64_t count, int64_t per, size_t elem, int64_t *out)
{
    int64_t n;
    /* below PTRDIFF_MAX / elem, so that the callers' (n + 1) * elem byte counts (the
     * spare element keeps an empty set off malloc(0)) cannot wrap either */
    if (count < 0 || per < 0 || __builtin_mul_overflow(count, per, &n) || n >= (int64_t)(PTRDIFF_MAX / elem))
        return false;
    *out = n;
    return true;
}

int64_t kiln__data_numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        if (!kiln__data_count(n, shape[d], sizeof(float), &n))
            return -1;
    return n;
}

const char *kiln__data_shape_str(int ndim, const int64_t *shape, char *buf, size_t len)
{
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < ndim && o < len; d++)
        o += (size_t)snprintf(buf + o, len - o, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (o < len)
        snprintf(buf + o, len - o, "]");
    return buf;
}

/* ------------------------------------------------------------------ the object */

kiln_dataset *kiln__dataset_new(const kiln__dataset_class *cls, void *self, kiln_dataset *source,
                                const kiln_dataset_info *info, const char *name)
{
    /* Every loader buffer is sized from feature_numel: a shape whose product does not fit
     * (windows of a large item, a bad header) is refused here, not wrapped. */
    int nd = info->ndim < 0 ? 0 : info->ndim > KILN_MAX_DIMS ? KILN_MAX_DIMS : info->ndim;
    int64_t numel = nd == info->ndim ? kiln__data_numel(nd, info->shape) : -1;
    kiln_dataset *ds = numel < 0 ? NULL : calloc(1, sizeof *ds);
    if (!ds) {
        if (cls->destroy)
            cls->destroy(self);
        char sh[256];
        if (numel < 0)
            kiln__error_set("data: %s%s%s: feature shape %s is too large to address", source ? source->name : "",
                            source ? "|" : "", name, kiln__data_shape_str(nd, info->shape, sh, sizeof sh));
        else
            kiln__error_set("data: out of memory");
        return NULL;
    }
    ds->cls = cls;
    ds->self = self;
    ds->source = source ? kiln_dataset_retain(source) : NULL;
    ds->info = *info;
    ds->info.feature_numel = numel;
    atomic_init(&ds->refs, 1);
    if (source)
        snprintf(ds->name, sizeof ds->name, "%.180s|%s", source->name, name);
    else
        snprintf(ds->name, sizeof ds->name, "%s", name);
    return ds;
}

kiln_dataset_info kiln_dataset_get_info(const kiln_dataset *ds)
{
    kiln_dataset_info none = {0};
    return ds ? ds->info : none;
}

int64_t kiln_dataset_length(const kiln_dataset *ds)
{
    return ds ? ds->info.length : 0;
}

const char *kiln_dataset_name(const kiln_dataset *ds)
{
    return ds ? ds->name : "";
}

int kiln_dataset_get(const kiln_dataset *ds, int64_t i, float *x, double *target, uint64_t key)
{
    if (!ds || !x || !target)
        return kiln__error_set("dataset_get: NULL argument");
    if (i < 0 || i >= ds->info.length)
        return kiln__error_set("dataset_get: %s: index %lld out of range [0, %lld)", ds->name, (long long)i,
                               (long long)ds->info.length);
    return ds->cls->get(ds, i, x, target, key);
}

kiln_dataset *kiln_dataset_retain(kiln_dataset *ds)
{
    if (ds)
        atomic_fetch_add(&ds->refs, 1);
    return ds;
}

void kiln_dataset_free(kiln_dataset *ds)
{
    while (ds && atomic_fetch_sub(&ds->refs, 1) == 1) {
        kiln_dataset *src = ds->source;
        if (ds->cls->destroy)
            ds->cls->destroy(ds->self);
        for (int64_t c = 0; c < ds->nclass_names; c++)
            free(ds->class_names[c]);
        free(ds->class_names);
        free(ds);
        ds = src; /* drop the reference the transform held, without recursion */
    }
}

/* --------------------------------------------------------------------- random */

uint64_t kiln__data_mix(uint64_t a, uint64_t b)
{
    uint64_t z = a + 0x9e3779b97f4a7c15ull * (b + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double kiln__data_uniform(uint64_t key, uint64_t draw)
{
    return (double)(kiln__data_mix(key, draw) >> 11) * (1.0 / 9007199254740992.0);
}

/* Fisher-Yates driven by the counter hash, so the result depends only on (seed, n). */
static void permute(uint64_t seed, int64_t n, int64_t *out)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(kiln__data_mix(seed, (uint64_t)i) % (uint64_t)(i + 1));
        int64_t t = out[i];
        out[i] = out[j];
        out[j] = t;
    }
}

void kiln_data_permutation(uint64_t seed, int64_t epoch, int64_t n, int64_t *out)
{
    permute(kiln__data_mix(seed, 0x5eed0000ull + (uint64_t)epoch), n, out);
}

/* --------------------------------------------------------------- in-memory arrays */

typedef struct arrays {
    float *x;
    double *t;
    int64_t fnum, tslots;
} arrays;

static int arrays_get(const kiln_dataset *ds, int64_t i, float *x, double *target, uint64_t key)
{
    const arrays *a = ds->self;
    memcpy(x, a->x + i * a->fnum, (size_t)a->fnum * sizeof *x);
    memcpy(target, a->t + i * a->tslots, (size_t)a->tslots * sizeof *target);
    return 0;
}

static void arrays_destroy(void *self)
{
    arrays *a = self;
    if (a) {
        free(a->x);
        free(a->t);
        free(a);
    }
}

static const kiln__dataset_class arrays_class = {"arrays", arrays_get, arrays_destroy};

/* Shared by the readers that decode everything up front: takes x and t. */
kiln_dataset *kiln__dataset_arrays_take(const kiln_dataset_info *info, float *x, double *t, const char *name);
kiln_dataset *kiln__dataset_arrays_take(const kiln_dataset_info *info, float *x, double *t, const char *name)
{
    arrays *a = calloc(1, sizeof *a);
    if (!a) {
        free(x);
        free(t);
        kiln__error_set("data: out of memory");
        return NULL;
    }
    a->x = x;
    a->t = t;
    a->fnum = kiln__data_numel(info->ndim, info->shape); /* -1: kiln__dataset_new refuses the shape */
    a->tslots = kiln__target_slots(info);
    return kiln__dataset_new(&arrays_class, a, NULL, info, name);
}

kiln_dataset *kiln_dataset_from_arrays(int64_t n, int ndim, const int64_t *shape, const float *features,
                                       const int64_t *labels, int64_t num_classes, const float *targets,
                                       int64_t target_numel)
{
    if (n < 0 || ndim < 0 || ndim > KILN_MAX_DIMS || (ndim > 0 && !shape) || (n > 0 && !features))
        return kiln__error_set("dataset_from_arrays: bad shape or NULL features"), NULL;
    kiln_dataset_info info = {.length = n, .ndim = ndim};
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 1)
            return kiln__error_set("dataset_from_arrays: dim %d is %lld", d, (long long)shape[d]), NULL;
        info.shape[d] = shape[d];
    }
    if (labels) {
        info.num_classes = num_classes;
        if (num_classes < 1)
            return kiln__error_set("dataset_from_arrays: labels need num_classes > 0"), NULL;
    } else if (targets) {
        if (target_numel < 0)
            return kiln__error_set("dataset_from_arrays: target_numel %lld < 0", (long long)target_numel), NULL;
        info.target_numel = target_numel;
    }
    /* Checked before anything is allocated or copied: a product that wraps would size the
     * copy below (and every batch of a loader) from a small, wrong count. */
    int64_t ts = kiln__target_slots(&info), fnum = kiln__data_numel(ndim, info.shape), xn = 0, tn = 0;
    if (fnum < 0 || !kiln__data_count(n, fnum, sizeof(float), &xn) ||
        !kiln__data_count(n, ts, sizeof(double), &tn)) {
        char sh[256];
        return kiln__error_set("dataset_from_arrays: %lld items of feature shape %s are too large to address",
                               (long long)n, kiln__data_shape_str(ndim, info.shape, sh, sizeof sh)),
               NULL;
    }
    float *x = malloc((size_t)(xn + 1) * sizeof *x);
    double *t = calloc((size_t)(tn + 1), sizeof *t);
    if (!x || !t) {
        free(x);
        free(t);
        return kiln__error_set("dataset_from_arrays: out of memory"), NULL;
    }
    if (n > 0)
        memcpy(x, features, (size_t)xn * sizeof *x);
    for (int64_t i = 0; i < n; i++) {
        if (labels) {
            if (labels[i] < 0 || labels[i] >= num_classes) {
                free(x);
                free(t);
                return kiln__error_set("dataset_from_arrays: label %lld of item %lld outside [0, %lld)",
                                       (long long)labels[i], (long long)i, (long long)num_classes),
                       NULL;
            }
            t[i] = (double)labels[i];
        } else if (targets) {
            for (int64_t k = 0; k < ts; k++)
                t[i * ts + k] = targets[i * ts + k];
        }
    }
    return kiln__dataset_arrays_take(&info, x, t, "arrays");
}

/* ------------------------------------------------------------------------ map */

typedef struct map_self {
    kiln_dataset_map_fn fn;
    void *ud;
} map_self;

static int map_get(const kiln_dataset *ds, int64_t i, float *x, double *target, uint64_t key)
{
    const map_self *m = ds->self;
    if (kiln_dataset_get(ds->source, i, x, target, key) < 0)
        return -1;
    return m->fn(m->ud, x, target, key) < 0 ? -1 : 0;
}

kiln_dataset *kiln_dataset_map(kiln_dataset *ds, kiln_dataset_map_fn fn, void *ud)
{
    if (!ds || !fn)
        return kiln__error_set("dataset_map: NULL argument"), NULL;
    static const kiln__dataset_class cls = {"map", map_get, free};
    map_self *m = malloc(sizeof *m);
    if (!m)
        return kiln__error_set("dataset_map: out of memory"), NULL;
    m->fn = fn;
    m->ud = ud;
    return kiln__dataset_new(&cls, m, ds, &ds->info, "map");
}

/* ---------------------------------------------------------- index transforms */

typedef struct index_self {
    int64_t *idx;
} index_self;

static int index_get(const kiln_dataset *ds, int64_t i, float *x, double *target, uint64_t key)
{
    const index_self *s = ds->self;
    return kiln_dataset_get(ds->source, s->idx[i], x, target, key);
}

static void index_destroy(void *self)
{
    index_self *s = self;
    if (s) {
        free(s->idx);
        free(s);
    }
}

static const kiln__dataset_class index_class = {"index", index_get, index_destroy};

/* A table of n indices (one spare entry: n == 0 is not malloc(0)); NULL with the error
 * set. n is checked because it can come straight from the caller. */
static int64_t *index_alloc(int64_t n, const char *op)
{
    int64_t total;
    if (!kiln__data_count(n, 1, sizeof(int64_t), &total))
        return kiln__error_set("%s: %lld indices are too many to address", op, (long long)n), NULL;
    int64_t *idx = malloc((size_t)(total + 1) * sizeof *idx);
    if (!idx)
        kiln__error_set("%s: out of memory for %lld indices", op, (long long)n);
    return idx;
}

/* Takes idx. */
static kiln_dataset *index_view(kiln_dataset *ds, int64_t n, int64_t *idx, const char *name)
{
    index_self *s = malloc(sizeof *s);
    if (!s) {
        free(idx);
        return kiln__error_set("data: out of memory"), NULL;
    }
    s->idx = idx;
    kiln_dataset_info info = ds->info;
    info.length = n;
    return kiln__dataset_new(&index_class, s, ds, &info, name);
}

kiln_dataset *kiln_dataset_shuffle(kiln_dataset *ds, uint64_t seed)
{
    if (!ds)
        return kiln__error_set("dataset_shuffle: NULL data set"), NULL;
    int64_t n = ds->info.length;
    int64_t *idx = index_alloc(n, "dataset_shuffle");
    if (!idx)
        return NULL;
    permute(kiln__data_mix(seed, 0x5407f1e0ull), n, idx);
    return index_view(ds, n, idx, "shuffle");
}

kiln_dataset *kiln_dataset_range(kiln_dataset *ds, int64_t start, int64_t count)
{
    if (!ds)
        return kiln__error_set("dataset_range: NULL data set"), NULL;
    /* count is compared with what is left after start: start + count may overflow */
    if (start < 0 || count < 0 || start > ds->info.length || count > ds->info.length - start)
        return kiln__error_set("dataset_range: %s: start %lld, count %lld: not inside [0, %lld)", ds->name,
                               (long long)start, (long long)count, (long long)ds->info.length),
               NULL;
    int64_t *idx = index_alloc(count, "dataset_range");
    if (!idx)
        return NULL;
    for (int64_t i = 0; i < count; i++)
        idx[i] = start + i;
    return index_view(ds, count, idx, "range");
}

kiln_dataset *kiln_dataset_subset(kiln_dataset *ds, int64_t n, const int64_t *indices)
{
    if (!ds || (n > 0 && !indices))
        return kiln__error_set("dataset_subset: NULL argument"), NULL;
    if (n < 0)
        return kiln__error_set("dataset_subset: %lld indices", (long long)n), NULL;
    int64_t *idx = index_alloc(n, "dataset_subset");
    if (!idx)
        return NULL;
    for (int64_t i = 0; i < n; i++) {
        if (indices[i] < 0 || indices[i] >= ds->info.length) {
            free(idx);
            return kiln__error_set("dataset_subset: %s: index %lld (entry %lld) outside [0, %lld)", ds->name,
                                   (long long)indices[i], (long long)i, (long long)ds->info.length),
                   NULL;
        }
        idx[i] = indices[i];
    }
    return index_view(ds, n, idx, "subset");
}

int kiln_dataset_split(kiln_dataset *ds, double valid_fraction, uint64_t seed, kiln_dataset **train,
                       kiln_dataset **valid)
{
    if (!ds || !train || !valid)
        return kiln__error_set("dataset_split: NULL argument");
    *train = *valid = NULL;
    if (!(valid_fraction >= 0 && valid_fraction <= 1))
        return kiln__error_set("dataset_split: fraction %g outside [0, 1]", valid_fraction);
    int64_t n = ds->info.length;
    /* (double)n rounds up for n past 2^53: clamp, so that n - nv is never negative */
    double fv = valid_fraction * (double)n;
    int64_t nv = fv >= (double)n ? n : (int64_t)llround(fv);
    int64_t *perm = index_alloc(n, "dataset_split");
    int64_t *vi = perm ? index_alloc(nv, "dataset_split") : NULL;
    int64_t *ti = vi ? index_alloc(n - nv, "dataset_split") : NULL;
    if (!perm || !vi || !ti) {
        free(perm);
        free(vi);
        return -1;
    }
    permute(kiln__data_mix(seed, 0x5b117ull), n, perm);
    memcpy(vi, perm, (size_t)nv * sizeof *vi);
    memcpy(ti, perm + nv, (size_t)(n - nv) * sizeof *ti);
    free(perm);
    *valid = index_view(ds, nv, vi, "split.valid");
    *train = index_view(ds, n - nv, ti, "split.train");
    if (!*valid || !*train) {
        kiln_dataset_free(*valid);
        kiln_dataset_free(*train);
        *train = *valid = NULL;
        return -1;
    }
    return 0;
}

/* -------------------------------------------------------------------- windows */

typedef struct windows_self {
    int64_t size, stride;
} windows_self;

static int windows_get(const kiln_dataset *ds, int64_t i, float *x, double *target, uint64_t key)
{
    const windows_self *w = ds->self;
    const kiln_dataset *src = ds->source;
    int64_t fnum = src->info.feature_numel;
    for (int64_t k = 0; k < w->size; k++)
        if (kiln_dataset_get(src, i * w->stride + k, x + k * fnum, target, kiln__data_mix(key, (uint64_t)k)) < 0)
            return -1;
    return 0; /* target holds the last item's, as documented */
}

kiln_dataset *kiln_dataset_windows(kiln_dataset *ds, int64_t size, int64_t stride)
{
    if (!ds)
        return kiln__error_set("dataset_windows: NULL data set"), NULL;
    if (size < 1 || stride < 1 || ds->info.ndim >= KILN_MAX_DIMS)
        return kiln__error_set("dataset_windows: size %lld, stride %lld must be >= 1", (long long)size,
                               (long long)stride),
               NULL;
    static const kiln__dataset_class cls = {"windows", windows_get, free};
    windows_self *w = malloc(sizeof *w);
    if (!w)
        return kiln__error_set("dataset_windows: out of memory"), NULL;
    w->size = size;
    w->stride = stride;
    kiln_dataset_info info = ds->info;
    info.length = ds->info.length < size ? 0 : (ds->info.length - size) / stride + 1;
    info.ndim = ds->info.ndim + 1;
    info.shape[0] = size;
    for (int d = 0; d < ds->info.ndim; d++)
        info.shape[d + 1] = ds->info.shape[d];
    return kiln__dataset_new(&cls, w, ds, &info, "windows");
}

/* ------------------------------------------------------------------ normalize */

typedef struct normalize_self {
    int n;
    float mean[64], inv_std[64];
} normalize_self;

static int normalize_get(const kiln_dataset *ds, int64_t i, float *x, double *target, uint64_t key)
{
    const normalize_self *s = ds->self;
    if (kiln_dataset_get(ds->source, i, x, target, key) < 0)
        return -1;
    int64_t total = ds->info.feature_numel, per = total / s->n;
    for (int c = 0; c < s->n; c++) {
        float m = s->mean[c], k = s->inv_std[c];
        float *p = x + (int64_t)c * per;
        for (int64_t j = 0; j < per; j++)
            p[j] = (p[j] - m) * k;
    }
    return 0;
}

kiln_dataset *kiln_dataset_normalize(kiln_dataset *ds, int nchannels, const float *mean, const float *std)
{
    if (!ds || !mean || !std)
        return kiln__error_set("dataset_normalize: NULL argument"), NULL;
    int64_t c0 = ds->info.ndim > 0 ? ds->info.shape[0] : 1;
    if (nchannels < 1 || nchannels > 64 || (nchannels != 1 && nchannels != c0))
        return kiln__error_set("dataset_normalize: %s: %d channels given, features have %lld in dim 0", ds->name,
                               nchannels, (long long)c0),
               NULL;
    static const kiln__dataset_class cls = {"normalize", normalize_get, free};
    normalize_self *s = malloc(sizeof *s);
    if (!s)
        return kiln__error_set("dataset_normalize: out of memory"), NULL;
    s->n = nchannels;
    for (int c = 0; c < nchannels; c++) {
        if (!(std[c] > 0)) {
            free(s);
            return kiln__error_set("dataset_normalize: std[%d] = %g must be > 0", c, (double)std[c]), NULL;
        }
        s->mean[c] = mean[c];
        s->inv_std[c] = 1.0f / std[c];
    }
    return kiln__dataset_new(&cls, s, ds, &ds->info, "normalize");
}
