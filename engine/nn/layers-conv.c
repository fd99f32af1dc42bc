/*
 * engine/nn/layers-conv.c — convolutions (Conv1d/2d, ConvTranspose1d/2d) and pooling
 * (Max/Avg Pool1d/2d, AdaptiveAvgPool1d/2d). One forward per family serves both
 * spatial ranks; the descriptor's name tells the rank.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn-impl.h"

/* The module's spatial rank and whether it is a transposed convolution live in self. */
typedef struct conv_self {
    int rank;
    bool transposed;
} conv_self;

kiln_conv_config kiln_conv1d_config_default(void)
{
    return (kiln_conv_config){.stride = {1, 1}, .dilation = {1, 1}, .groups = 1, .bias = true};
}
kiln_conv_config kiln_conv2d_config_default(void) { return kiln_conv1d_config_default(); }
kiln_conv_config kiln_conv_transpose1d_config_default(void) { return kiln_conv1d_config_default(); }
kiln_conv_config kiln_conv_transpose2d_config_default(void) { return kiln_conv1d_config_default(); }

static int conv_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    const conv_self *s = m->self;
    const kiln_conv_config *c = m->config;
    kiln_tensor *x = kiln__in(n_in, in, 0);
    if (kiln__check_input(m, x, s->rank + 2, s->rank + 1, "input") < 0)
        return -1;
    int cdim = kiln_tensor_ndim(x) == s->rank + 2 ? 1 : 0;
    if (kiln_tensor_dim(x, cdim) != c->in_channels) {
        char d[96];
        return kiln__module_error(m, "input %s: channel dim %d must be in_channels = %lld",
                                  kiln__desc_str(x, d, sizeof d), cdim, (long long)c->in_channels);
    }
    kiln_conv_opts o = {.groups = c->groups};
    for (int i = 0; i < s->rank; i++) {
        o.stride[i] = c->stride[i];
        o.padding[i] = c->padding[i];
        o.dilation[i] = c->dilation[i];
        o.output_padding[i] = c->output_padding[i];
    }
    kiln_tensor *w = kiln_module_get(m, "weight"), *b = kiln_module_get(m, "bias");
    if (s->transposed)
        out[0] = s->rank == 1 ? kiln_conv_transpose1d(x, w, b, &o) : kiln_conv_transpose2d(x, w, b, &o);
    else
        out[0] = s->rank == 1 ? kiln_conv1d(x, w, b, &o) : kiln_conv2d(x, w, b, &o);
    return out[0] ? 1 : -1;
}

static const kiln_module_class conv1d_class = {"Conv1d", conv_forward, free};
static const kiln_module_class conv2d_class = {"Conv2d", conv_forward, free};
static const kiln_module_class convt1d_class = {"ConvTranspose1d", conv_forward, free};
static const kiln_module_class convt2d_class = {"ConvTranspose2d", conv_forward, free};

static kiln_module *conv_init(const kiln_module_class *cls, const kiln__layer_type *lt, int rank, bool transposed,
                              const kiln_conv_config *c, kiln_device *dev, kiln_generator *gen)
{
    const char *tn = lt->name;
    KILN__REQUIRE(c && dev, tn, "config and device are required");
    KILN__REQUIRE(c->in_channels > 0 && c->out_channels > 0, tn, "in_channels and out_channels must be > 0");
    KILN__REQUIRE(c->groups > 0 && c->in_channels % c->groups == 0 && c->out_channels % c->groups == 0, tn,
                  "groups (%lld) must divide in_channels (%lld) and out_channels (%lld)", (long long)c->groups,
                  (long long)c->in_channels, (long long)c->out_channels);
    for (int i = 0; i < rank; i++) {
        KILN__REQUIRE(c->kernel_size[i] > 0, tn, "kernel_size must be > 0");
        KILN__REQUIRE(c->stride[i] > 0 && c->dilation[i] > 0 && c->padding[i] >= 0, tn,
                      "stride and dilation must be > 0 and padding >= 0");
        KILN__REQUIRE(c->output_padding[i] >= 0 && (transposed || c->output_padding[i] == 0), tn,
                      "output_padding is for transposed convolutions only");
    }
    kiln_generator fb;
    gen = kiln__gen_or_default(gen, &fb);
    kiln_module *m = kiln__module_make(cls, sizeof(conv_self), lt, c, gen);
    if (!m)
        return NULL;
    *(conv_self *)m->self = (conv_self){rank, transposed};
    int64_t shape[4];
    shape[0] = transposed ? c->in_channels : c->out_channels;
    shape[1] = (transposed ? c->out_channels : c->in_channels) / c->groups;
    for (int i = 0; i < rank; i++)
        shape[2 + i] = c->kernel_size[i];
    double fan_in, fan_out;
    kiln__fans(rank + 2, shape, &fan_in, &fan_out);
    int rc = kiln_module_add_parameter(m, "weight", kiln__default_weight(dev, rank + 2, shape, gen));
    if (rc == 0 && c->bias)
        rc = kiln_module_add_parameter(m, "bias", kiln__default_bias(dev, c->out_channels, fan_in, gen));
    if (rc < 0) {
        kiln_module_free(m);
        return NULL;
    }
    return m;
}

#define CONV_FIELDS(tbl, n, extra)                                                        \
    static const kiln__field tbl[] = {                                                    \
        KILN__FIELD(kiln_conv_config, KILN__F_I64, in_channels),                          \
        KILN__FIELD(kiln_conv_config, KILN__F_I64, out_channels),                         \
        KILN__FIELD_N(kiln_conv_config, kernel_size, n),                                  \
        KILN__FIELD_N(kiln_conv_config, stride, n),                                       \
        KILN__FIELD_N(kiln_conv_config, padding, n),                                      \
        KILN__FIELD_N(kiln_conv_config, dilation, n),                                     \
        KILN__FIELD(kiln_conv_config, KILN__F_I64, groups),                               \
        KILN__FIELD(kiln_conv_config, KILN__F_BOOL, bias),                                \
        extra                                                                             \
    };
#define NO_EXTRA
CONV_FIELDS(conv1d_fields, 1, NO_EXTRA)
CONV_FIELDS(conv2d_fields, 2, NO_EXTRA)
CONV_FIELDS(convt1d_fields, 1, KILN__FIELD_N(kiln_conv_config, output_padding, 1))
CONV_FIELDS(convt2d_fields, 2, KILN__FIELD_N(kiln_conv_config, output_padding, 2))

kiln_module *kiln_conv1d_init(const kiln_conv_config *c, kiln_device *dev, kiln_generator *gen)
{
    return conv_init(&conv1d_class, &kiln__layer_conv1d, 1, false, c, dev, gen);
}
kiln_module *kiln_conv2d_init(const kiln_conv_config *c, kiln_device *dev, kiln_generator *gen)
{
    return conv_init(&conv2d_class, &kiln__layer_conv2d, 2, false, c, dev, gen);
}
kiln_module *kiln_conv_transpose1d_init(const kiln_conv_config *c, kiln_device *dev, kiln_generator *gen)
{
    return conv_init(&convt1d_class, &kiln__layer_conv_transpose1d, 1, true, c, dev, gen);
}
kiln_module *kiln_conv_transpose2d_init(const kiln_conv_config *c, kiln_device *dev, kiln_generator *gen)
{
    return conv_init(&convt2d_class, &kiln__layer_conv_transpose2d, 2, true, c, dev, gen);
}

KILN__LAYER(conv1d, kiln_conv_config, "Conv1d", conv1d_fields, KILN__NFIELDS(conv1d_fields))
KILN__LAYER(conv2d, kiln_conv_config, "Conv2d", conv2d_fields, KILN__NFIELDS(conv2d_fields))
KILN__LAYER(conv_transpose1d, kiln_conv_config, "ConvTranspose1d", convt1d_fields, KILN__NFIELDS(convt1d_fields))
KILN__LAYER(conv_transpose2d, kiln_conv_config, "ConvTranspose2d", convt2d_fields, KILN__NFIELDS(convt2d_fields))

/* ----------------------------------------------------------------------- pooling */

typedef struct pool_self {
    int rank;
    bool avg;
} pool_self;

kiln_pool_config kiln_max_pool1d_config_default(void)
{
    return (kiln_pool_config){.dilation = {1, 1}, .count_include_pad = true};
}
kiln_pool_config kiln_max_pool2d_config_default(void) { return kiln_max_pool1d_config_default(); }
kiln_pool_config kiln_avg_pool1d_config_default(void) { return kiln_max_pool1d_config_default(); }
kiln_pool_config kiln_avg_pool2d_config_default(void) { return kiln_max_pool1d_config_default(); }

static int pool_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    const pool_self *s = m->self;
    const kiln_pool_config *c = m->config;
    kiln_tensor *x = kiln__in(n_in, in, 0);
    if (kiln__check_input(m, x, s->rank + 2, s->rank + 1, "input") < 0)
        return -1;
    kiln_pool_opts o = {.ceil_mode = c->ceil_mode, .count_include_pad = c->count_include_pad};
    for (int i = 0; i < s->rank; i++) {
        o.kernel[i] = c->kernel_size[i];
        o.stride[i] = c->stride[i];
        o.padding[i] = c->padding[i];
        o.dilation[i] = c->dilation[i];
    }
    if (s->avg)
        out[0] = s->rank == 1 ? kiln_avg_pool1d(x, &o) : kiln_avg_pool2d(x, &o);
    else
        out[0] = s->rank == 1 ? kiln_max_pool1d(x, &o, NULL) : kiln_max_pool2d(x, &o, NULL);
    return out[0] ? 1 : -1;
}

static const kiln_module_class maxpool1d_class = {"MaxPool1d", pool_forward, free};
static const kiln_module_class maxpool2d_class = {"MaxPool2d", pool_forward, free};
static const kiln_module_class avgpool1d_class = {"AvgPool1d", pool_forward, free};
static const kiln_module_class avgpool2d_class = {"AvgPool2d", pool_forward, free};

static kiln_module *pool_init(const kiln_module_class *cls, const kiln__layer_type *lt, int rank, bool avg,
                              const kiln_pool_config *c)
{
    const char *tn = lt->name;
    KILN__REQUIRE(c, tn, "config is required");
    for (int i = 0; i < rank; i++) {
        KILN__REQUIRE(c->kernel_size[i] > 0, tn, "kernel_size must be > 0");
        KILN__REQUIRE(c->stride[i] >= 0 && c->dilation[i] > 0, tn, "stride must be >= 0, dilation > 0");
        KILN__REQUIRE(c->padding[i] >= 0 && 2 * c->padding[i] <= c->kernel_size[i], tn,
                      "padding must be at most half the kernel size");
    }
    kiln_module *m = kiln__module_make(cls, sizeof(pool_self), lt, c, NULL);
    if (m)
        *(pool_self *)m->self = (pool_self){rank, avg};
    return m;
}

#define POOL_FIELDS(tbl, n, last)                                                         \
    static const kiln__field tbl[] = {                                                    \
        KILN__FIELD_N(kiln_pool_config, kernel_size, n),                                  \
        KILN__FIELD_N(kiln_pool_config, stride, n),                                       \
        KILN__FIELD_N(kiln_pool_config, padding, n),                                      \
        KILN__FIELD(kiln_pool_config, KILN__F_BOOL, ceil_mode),                           \
        last,                                                                             \
    };
POOL_FIELDS(maxpool1d_fields, 1, KILN__FIELD_N(kiln_pool_config, dilation, 1))
POOL_FIELDS(maxpool2d_fields, 2, KILN__FIELD_N(kiln_pool_config, dilation, 2))
POOL_FIELDS(avgpool1d_fields, 1, KILN__FIELD(kiln_pool_config, KILN__F_BOOL, count_include_pad))
POOL_FIELDS(avgpool2d_fields, 2, KILN__FIELD(kiln_pool_config, KILN__F_BOOL, count_include_pad))

kiln_module *kiln_max_pool1d_init(const kiln_pool_config *c, kiln_device *dev, kiln_generator *gen)
{
    return pool_init(&maxpool1d_class, &kiln__layer_max_pool1d, 1, false, c);
}
kiln_module *kiln_max_pool2d_init(const kiln_pool_config *c, kiln_device *dev, kiln_generator *gen)
{
    return pool_init(&maxpool2d_class, &kiln__layer_max_pool2d, 2, false, c);
}
kiln_module *kiln_avg_pool1d_init(const kiln_pool_config *c, kiln_device *dev, kiln_generator *gen)
{
    return pool_init(&avgpool1d_class, &kiln__layer_avg_pool1d, 1, true, c);
}
kiln_module *kiln_avg_pool2d_init(const kiln_pool_config *c, kiln_device *dev, kiln_generator *gen)
{
    return pool_init(&avgpool2d_class, &kiln__layer_avg_pool2d, 2, true, c);
}

KILN__LAYER(max_pool1d, kiln_pool_config, "MaxPool1d", maxpool1d_fields, KILN__NFIELDS(maxpool1d_fields))
KILN__LAYER(max_pool2d, kiln_pool_config, "MaxPool2d", maxpool2d_fields, KILN__NFIELDS(maxpool2d_fields))
KILN__LAYER(avg_pool1d, kiln_pool_config, "AvgPool1d", avgpool1d_fields, KILN__NFIELDS(avgpool1d_fields))
KILN__LAYER(avg_pool2d, kiln_pool_config, "AvgPool2d", avgpool2d_fields, KILN__NFIELDS(avgpool2d_fields))

/* ------------------------------------------------------------- adaptive pooling */

kiln_adaptive_pool_config kiln_adaptive_avg_pool1d_config_default(void) { return (kiln_adaptive_pool_config){{0}}; }
kiln_adaptive_pool_config kiln_adaptive_avg_pool2d_config_default(void) { return (kiln_adaptive_pool_config){{0}}; }

static int adaptive1d_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    const kiln_adaptive_pool_config *c = m->config;
    kiln_tensor *x = kiln__in(n_in, in, 0);
    if (kiln__check_input(m, x, 3, 2, "input") < 0)
        return -1;
    out[0] = kiln_adaptive_avg_pool1d(x, c->output_size[0]);
    return out[0] ? 1 : -1;
}

static int adaptive2d_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    const kiln_adaptive_pool_config *c = m->config;
    kiln_tensor *x = kiln__in(n_in, in, 0);
    if (kiln__check_input(m, x, 4, 3, "input") < 0)
        return -1;
    out[0] = kiln_adaptive_avg_pool2d(x, c->output_size[0], c->output_size[1]);
    return out[0] ? 1 : -1;
}

static const kiln_module_class adaptive1d_class = {"AdaptiveAvgPool1d", adaptive1d_forward, NULL};
static const kiln_module_class adaptive2d_class = {"AdaptiveAvgPool2d", adaptive2d_forward, NULL};
static const kiln__field adaptive1d_fields[] = {KILN__FIELD_N(kiln_adaptive_pool_config, output_size, 1)};
static const kiln__field adaptive2d_fields[] = {KILN__FIELD_N(kiln_adaptive_pool_config, output_size, 2)};

kiln_module *kiln_adaptive_avg_pool1d_init(const kiln_adaptive_pool_config *c, kiln_device *dev, kiln_generator *gen)
{
    KILN__REQUIRE(c && c->output_size[0] > 0, "AdaptiveAvgPool1d", "output_size must be > 0");
    return kiln__module_make(&adaptive1d_class, 0, &kiln__layer_adaptive_avg_pool1d, c, NULL);
}

kiln_module *kiln_adaptive_avg_pool2d_init(const kiln_adaptive_pool_config *c, kiln_device *dev, kiln_generator *gen)
{
    KILN__REQUIRE(c && c->output_size[0] > 0 && c->output_size[1] > 0, "AdaptiveAvgPool2d",
                  "output_size must be > 0");
    return kiln__module_make(&adaptive2d_class, 0, &kiln__layer_adaptive_avg_pool2d, c, NULL);
}

KILN__LAYER(adaptive_avg_pool1d, kiln_adaptive_pool_config, "AdaptiveAvgPool1d", adaptive1d_fields,
            KILN__NFIELDS(adaptive1d_fields))
KILN__LAYER(adaptive_avg_pool2d, kiln_adaptive_pool_config, "AdaptiveAvgPool2d", adaptive2d_fields,
            KILN__NFIELDS(adaptive2d_fields))
