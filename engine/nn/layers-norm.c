/*
 * engine/nn/layers-norm.c — normalization layers: BatchNorm1d/2d (running statistics
 * as buffers, momentum or cumulative averaging, num_batches_tracked), LayerNorm,
 * GroupNorm and RMSNorm (written out from reductions, as it has no fused op).
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn-impl.h"

/* ------------------------------------------------------------------- BatchNorm */

kiln_batch_norm_config kiln_batch_norm1d_config_default(void)
{
    return (kiln_batch_norm_config){.eps = 1e-5, .momentum = 0.1, .affine = true, .track_running_stats = true};
}
kiln_batch_norm_config kiln_batch_norm2d_config_default(void) { return kiln_batch_norm1d_config_default(); }

static kiln__entry *own_entry(kiln_module *m, const char *name)
{
    for (int i = 0; i < m->nentries; i++)
        if (!strcmp(m->entries[i].name, name))
            return &m->entries[i];
    return NULL;
}

static int batch_norm_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    const kiln_batch_norm_config *c = m->config;
    bool two_d = !strcmp(m->cls->type, "BatchNorm2d");
    kiln_tensor *x = kiln__in(n_in, in, 0);
    if (kiln__check_input(m, x, two_d ? 4 : 2, two_d ? -1 : 3, "input") < 0)
        return -1;
    if (kiln_tensor_dim(x, 1) != c->num_features) {
        char d[96];
        return kiln__module_error(m, "input %s: dim 1 must be num_features = %lld", kiln__desc_str(x, d, sizeof d),
                                  (long long)c->num_features);
    }
    kiln_tensor *rm = kiln_module_get(m, "running_mean"), *rv = kiln_module_get(m, "running_var");
    bool use_batch = m->training || !c->track_running_stats;
    double momentum = c->momentum;
    kiln__entry *nb = NULL;
    kiln_tensor *next = NULL;
    if (m->training && c->track_running_stats) {
        /* num_batches_tracked counts training batches; with momentum None (<= 0 here)
         * the running stats are a cumulative average, momentum 1 / count. The new count
         * is kept only once the batch went through: a refused one (too few values per
         * channel) changes no buffer. */
        nb = own_entry(m, "num_batches_tracked");
        next = kiln_keep(kiln_add_scalar(nb->t, 1)); /* i64: never recorded */
        if (!next)
            return -1;
        if (momentum <= 0)
            momentum = 1.0 / kiln_item(next);
    }
    /* Without tracked stats rm and rv are NULL and batch statistics are used always. */
    out[0] = kiln_batch_norm(x, rm, rv, kiln_module_get(m, "weight"), kiln_module_get(m, "bias"), use_batch,
                             momentum, c->eps);
    if (next && out[0]) {
        kiln_tensor_release(nb->t);
        nb->t = next;
    } else {
        kiln_tensor_release(next);
    }
    return out[0] ? 1 : -1;
}

static const kiln_module_class bn1d_class = {"BatchNorm1d", batch_norm_forward, NULL};
static const kiln_module_class bn2d_class = {"BatchNorm2d", batch_norm_forward, NULL};

static const kiln__field bn_fields[] = {
    KILN__FIELD(kiln_batch_norm_config, KILN__F_I64, num_features),
    KILN__FIELD(kiln_batch_norm_config, KILN__F_F64, eps),
    KILN__FIELD(kiln_batch_norm_config, KILN__F_F64, momentum),
    KILN__FIELD(kiln_batch_norm_config, KILN__F_BOOL, affine),
    KILN__FIELD(kiln_batch_norm_config, KILN__F_BOOL, track_running_stats),
};

static kiln_module *bn_init(const kiln_module_class *cls, const kiln__layer_type *lt, const kiln_batch_norm_config *c,
                            kiln_device *dev)
{
    KILN__REQUIRE(c && dev, lt->name, "config and device are required");
    KILN__REQUIRE(c->num_features > 0, lt->name, "num_features must be > 0");
    KILN__REQUIRE(c->eps > 0, lt->name, "eps must be > 0");
    kiln_module *m = kiln__module_make(cls, 0, lt, c, NULL);
    if (!m)
        return NULL;
    int64_t n = c->num_features;
    int rc = 0;
    if (c->affine) {
        rc = kiln_module_add_parameter(m, "weight", kiln_keep(kiln_init_ones(dev, KILN_SHAPE(n))));
        if (rc == 0)
            rc = kiln_module_add_parameter(m, "bias", kiln_keep(kiln_init_zeros(dev, KILN_SHAPE(n))));
    }
    if (rc == 0 && c->track_running_stats) {
        rc = kiln_module_add_buffer(m, "running_mean", kiln_keep(kiln_zeros(dev, KILN_F32, KILN_SHAPE(n))));
        if (rc == 0)
            rc = kiln_module_add_buffer(m, "running_var", kiln_keep(kiln_ones(dev, KILN_F32, KILN_SHAPE(n))));
        if (rc == 0)
            rc = kiln_module_add_buffer(m, "num_batches_tracked", kiln_keep(kiln_zeros(dev, KILN_I64, 0, NULL)));
    }
    if (rc < 0) {
        kiln_module_free(m);
        return NULL;
    }
    return m;
}

kiln_module *kiln_batch_norm1d_init(const kiln_batch_norm_config *c, kiln_device *dev, kiln_generator *gen)
{
    return bn_init(&bn1d_class, &kiln__layer_batch_norm1d, c, dev);
}

kiln_module *kiln_batch_norm2d_init(const kiln_batch_norm_config *c, kiln_device *dev, kiln_generator *gen)
{
    return bn_init(&bn2d_class, &kiln__layer_batch_norm2d, c, dev);
}

KILN__LAYER(batch_norm1d, kiln_batch_norm_config, "BatchNorm1d", bn_fields, KILN__NFIELDS(bn_fields))
KILN__LAYER(batch_norm2d, kiln_batch_norm_config, "BatchNorm2d", bn_fields, KILN__NFIELDS(bn_fields))

/* ------------------------------------------------ LayerNorm and RMSNorm share a check */

static int check_trailing(kiln_module *m, kiln_tensor *x, int nd, const int64_t *shape)
{
    int xd = kiln_tensor_ndim(x);
    bool ok = x && xd >= nd;
    for (int i = 0; ok && i < nd; i++)
        ok = kiln_tensor_dim(x, xd - nd + i) == shape[i];
    if (ok)
        return 0;
    char d[96], want[96];
    kiln_tensor_describe(x, d, sizeof d);
    size_t l = 0;
    want[0] = 0;
    for (int i = 0; i < nd; i++)
        l += (size_t)snprintf(want + l, sizeof want - l, "%s%lld", i ? ", " : "", (long long)shape[i]);
    return kiln__module_error(m, "input %s: trailing dims must be normalized_shape [%s]", x ? d : "NULL", want);
}

kiln_layer_norm_config kiln_layer_norm_config_default(void)
{
    return (kiln_layer_norm_config){.eps = 1e-5, .elementwise_affine = true, .bias = true};
}

static int layer_norm_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    const kiln_layer_norm_config *c = m->config;
    kiln_tensor *x = kiln__in(n_in, in, 0);
    if (check_trailing(m, x, c->ndim, c->normalized_shape) < 0)
        return -1;
    out[0] = kiln_layer_norm(x, c->ndim, kiln_module_get(m, "weight"), kiln_module_get(m, "bias"), c->eps);
    return out[0] ? 1 : -1;
}

static const kiln_module_class layer_norm_class = {"LayerNorm", layer_norm_forward, NULL};
static const kiln__field layer_norm_fields[] = {
    KILN__FIELD_SHAPE(kiln_layer_norm_config, normalized_shape, 4, ndim),
    KILN__FIELD(kiln_layer_norm_config, KILN__F_F64, eps),
    KILN__FIELD(kiln_layer_norm_config, KILN__F_BOOL, elementwise_affine),
    KILN__FIELD(kiln_layer_norm_config, KILN__F_BOOL, bias),
};

static int check_shape(const int64_t *shape, int nd)
{
    if (nd < 1 || nd > 4)
        return -1;
    for (int i = 0; i < nd; i++)
        if (shape[i] <= 0)
            return -1;
    return 0;
}

kiln_module *kiln_layer_norm_init(const kiln_layer_norm_config *c, kiln_device *dev, kiln_generator *gen)
{
    KILN__REQUIRE(c && dev, "LayerNorm", "config and device are required");
    KILN__REQUIRE(check_shape(c->normalized_shape, c->ndim) == 0, "LayerNorm",
                  "normalized_shape needs 1 to 4 sizes > 0 (ndim %d)", c->ndim);
    kiln_module *m = kiln__module_make(&layer_norm_class, 0, &kiln__layer_layer_norm, c, NULL);
    if (!m)
        return NULL;
    int rc = 0;
    if (c->elementwise_affine) {
        rc = kiln_module_add_parameter(m, "weight", kiln_keep(kiln_init_ones(dev, c->ndim, c->normalized_shape)));
        if (rc == 0 && c->bias)
            rc = kiln_module_add_parameter(m, "bias", kiln_keep(kiln_init_zeros(dev, c->ndim, c->normalized_shape)));
    }
    if (rc < 0) {
        kiln_module_free(m);
        return NULL;
    }
    return m;
}

KILN__LAYER(layer_norm, kiln_layer_norm_config, "LayerNorm", layer_norm_fields, KILN__NFIELDS(layer_norm_fields))

kiln_rms_norm_config kiln_rms_norm_config_default(void)
{
    return (kiln_rms_norm_config){.eps = 0, .elementwise_affine = true};
}

static int rms_norm_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    const kiln_rms_norm_config *c = m->config;
    kiln_tensor *x = kiln__in(n_in, in, 0);
    if (check_trailing(m, x, c->ndim, c->normalized_shape) < 0)
        return -1;
    double eps = c->eps > 0 ? c->eps : kiln_tensor_dtype(x) == KILN_F64 ? DBL_EPSILON : FLT_EPSILON;
    int dims[4];
    for (int i = 0; i < c->ndim; i++)
        dims[i] = -c->ndim + i;
    kiln_tensor *ms = kiln_mean(kiln_square(x), c->ndim, dims, true);
    kiln_tensor *y = kiln_mul(x, kiln_rsqrt(kiln_add_scalar(ms, eps)));
    kiln_tensor *w = kiln_module_get(m, "weight");
    out[0] = w ? kiln_mul(y, w) : y;
    return out[0] ? 1 : -1;
}

static const kiln_module_class rms_norm_class = {"RMSNorm", rms_norm_forward, NULL};
static const kiln__field rms_norm_fields[] = {
    KILN__FIELD_SHAPE(kiln_rms_norm_config, normalized_shape, 4, ndim),
    KILN__FIELD(kiln_rms_norm_config, KILN__F_F64, eps),
    KILN__FIELD(kiln_rms_norm_config, KILN__F_BOOL, elementwise_affine),
};

kiln_module *kiln_rms_norm_init(const kiln_rms_norm_config *c, kiln_device *dev, kiln_generator *gen)
{
    KILN__REQUIRE(c && dev, "RMSNorm", "config and device are required");
    KILN__REQUIRE(check_shape(c->normalized_shape, c->ndim) == 0, "RMSNorm",
                  "normalized_shape needs 1 to 4 sizes > 0 (ndim %d)", c->ndim);
    kiln_module *m = kiln__module_make(&rms_norm_class, 0, &kiln__layer_rms_norm, c, NULL);
    if (m && c->elementwise_affine &&
        kiln_module_add_parameter(m, "weight", kiln_keep(kiln_init_ones(dev, c->ndim, c->normalized_shape))) < 0) {
        kiln_module_free(m);
        return NULL;
    }
    return m;
}

KILN__LAYER(rms_norm, kiln_rms_norm_config, "RMSNorm", rms_norm_fields, KILN__NFIELDS(rms_norm_fields))

/* ------------------------------------------------------------------- GroupNorm */

kiln_group_norm_config kiln_group_norm_config_default(void)
{
    return (kiln_group_norm_config){.eps = 1e-5, .affine = true};
}

static int group_norm_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    const kiln_group_norm_config *c = m->config;
    kiln_tensor *x = kiln__in(n_in, in, 0);
    if (!x || kiln_tensor_ndim(x) < 2 || kiln_tensor_dim(x, 1) != c->num_channels) {
        char d[96];
        return kiln__module_error(m, "input %s: expected [N, %lld, ...]", kiln__desc_str(x, d, sizeof d),
                                  (long long)c->num_channels);
    }
    out[0] = kiln_group_norm(x, c->num_groups, kiln_module_get(m, "weight"), kiln_module_get(m, "bias"), c->eps);
    return out[0] ? 1 : -1;
}

static const kiln_module_class group_norm_class = {"GroupNorm", group_norm_forward, NULL};
static const kiln__field group_norm_fields[] = {
    KILN__FIELD(kiln_group_norm_config, KILN__F_I64, num_groups),
    KILN__FIELD(kiln_group_norm_config, KILN__F_I64, num_channels),
    KILN__FIELD(kiln_group_norm_config, KILN__F_F64, eps),
    KILN__FIELD(kiln_group_norm_config, KILN__F_BOOL, affine),
};

kiln_module *kiln_group_norm_init(const kiln_group_norm_config *c, kiln_device *dev, kiln_generator *gen)
{
    KILN__REQUIRE(c && dev, "GroupNorm", "config and device are required");
    KILN__REQUIRE(c->num_groups > 0 && c->num_channels > 0 && c->num_channels % c->num_groups == 0, "GroupNorm",
                  "num_groups (%lld) must divide num_channels (%lld)", (long long)c->num_groups,
                  (long long)c->num_channels);
    kiln_module *m = kiln__module_make(&group_norm_class, 0, &kiln__layer_group_norm, c, NULL);
    if (!m)
        return NULL;
    int rc = 0;
    if (c->affine) {
        rc = kiln_module_add_parameter(m, "weight", kiln_keep(kiln_init_ones(dev, KILN_SHAPE(c->num_channels))));
        if (rc == 0)
            rc = kiln_module_add_parameter(m, "bias", kiln_keep(kiln_init_zeros(dev, KILN_SHAPE(c->num_channels))));
    }
    if (rc < 0) {
        kiln_module_free(m);
        return NULL;
    }
    return m;
}

KILN__LAYER(group_norm, kiln_group_norm_config, "GroupNorm", group_norm_fields, KILN__NFIELDS(group_norm_fields))
