/*
 * engine/nn/layers-basic.c — the small layers: Linear, Embedding, Dropout, Flatten,
 * the activations (ReLU, LeakyReLU, GELU, SiLU, Sigmoid, Tanh, Softmax, PReLU, SwiGLU,
 * Identity), and the two containers, Sequential and Residual. Each forward is a few
 * tensor.h ops, so autodiff needs nothing from this file.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn-impl.h"

#define CFG(T, m) ((const T *)(m)->config)

static const kiln__field no_fields[1] = {{0}};

/* ------------------------------------------------------------------------ Linear */

kiln_linear_config kiln_linear_config_default(void)
{
    return (kiln_linear_config){.bias = true};
}

static kiln_tensor *linear_run(kiln_module *m, kiln_tensor *x)
{
    const kiln_linear_config *c = CFG(kiln_linear_config, m);
    if (kiln_tensor_ndim(x) < 1 || kiln_tensor_dim(x, -1) != c->in_features) {
        char d[96];
        kiln__module_error(m, "input %s: last dim must be in_features = %lld", kiln__desc_str(x, d, sizeof d),
                           (long long)c->in_features);
        return NULL;
    }
    return kiln_linear(x, kiln_module_get(m, "weight"), kiln_module_get(m, "bias"));
}

static int linear_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    return kiln__forward1(m, n_in, in, out, linear_run);
}

static const kiln_module_class linear_class = {"Linear", linear_forward, NULL};

static const kiln__field linear_fields[] = {
    KILN__FIELD(kiln_linear_config, KILN__F_I64, in_features),
    KILN__FIELD(kiln_linear_config, KILN__F_I64, out_features),
    KILN__FIELD(kiln_linear_config, KILN__F_BOOL, bias),
};

kiln_module *kiln_linear_init(const kiln_linear_config *c, kiln_device *dev, kiln_generator *gen)
{
    KILN__REQUIRE(c && dev, "Linear", "config and device are required");
    KILN__REQUIRE(c->in_features > 0 && c->out_features > 0, "Linear",
                  "in_features and out_features must be > 0 (got %lld, %lld)", (long long)c->in_features,
                  (long long)c->out_features);
    kiln_generator fb;
    gen = kiln__gen_or_default(gen, &fb);
    kiln_module *m = kiln__module_make(&linear_class, 0, &kiln__layer_linear, c, gen);
    if (!m)
        return NULL;
    int rc = kiln_module_add_parameter(m, "weight",
                                       kiln__default_weight(dev, KILN_SHAPE(c->out_features, c->in_features), gen));
    if (rc == 0 && c->bias)
        rc = kiln_module_add_parameter(m, "bias", kiln__default_bias(dev, c->out_features, (double)c->in_features, gen));
    if (rc < 0) {
        kiln_module_free(m);
        return NULL;
    }
    return m;
}

KILN__LAYER(linear, kiln_linear_config, "Linear", linear_fields, KILN__NFIELDS(linear_fields))

/* --------------------------------------------------------------------- Embedding */

kiln_embedding_config kiln_embedding_config_default(void)
{
    return (kiln_embedding_config){.padding_idx = -1};
}

static kiln_tensor *embedding_run(kiln_module *m, kiln_tensor *x)
{
    kiln_dtype dt = kiln_tensor_dtype(x);
    if (dt != KILN_I64 && dt != KILN_I32 && dt != KILN_U8) {
        char d[96];
        kiln__module_error(m, "input %s: indices must be an integer tensor", kiln__desc_str(x, d, sizeof d));
        return NULL;
    }
    const kiln_embedding_config *c = CFG(kiln_embedding_config, m);
    kiln_tensor *w = kiln_module_get(m, "weight");
    kiln_tensor *y = kiln_embedding(w, x);
    if (!y || c->padding_idx < 0 || !kiln_grad_enabled() || !kiln_tensor_requires_grad(w))
        return y;
    /* As PyTorch's, the padding row is looked up but never trained: the positions that
     * read it pass no gradient back (their output is taken detached). */
    kiln_tensor *pad = kiln_eq(x, kiln_full(kiln_tensor_device(x), dt, 0, NULL, (double)c->padding_idx));
    return kiln_where(kiln_unsqueeze(pad, -1), kiln_detach(y), y);
}

static int embedding_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    return kiln__forward1(m, n_in, in, out, embedding_run);
}

static const kiln_module_class embedding_class = {"Embedding", embedding_forward, NULL};

static const kiln__field embedding_fields[] = {
    KILN__FIELD(kiln_embedding_config, KILN__F_I64, num_embeddings),
    KILN__FIELD(kiln_embedding_config, KILN__F_I64, embedding_dim),
    KILN__FIELD(kiln_embedding_config, KILN__F_I64, padding_idx),
};

kiln_module *kiln_embedding_init(const kiln_embedding_config *c, kiln_device *dev, kiln_generator *gen)
{
    KILN__REQUIRE(c && dev, "Embedding", "config and device are required");
    KILN__REQUIRE(c->num_embeddings > 0 && c->embedding_dim > 0, "Embedding",
                  "num_embeddings and embedding_dim must be > 0");
    KILN__REQUIRE(c->padding_idx < c->num_embeddings, "Embedding", "padding_idx %lld is out of range",
                  (long long)c->padding_idx);
    kiln_generator fb;
    gen = kiln__gen_or_default(gen, &fb);
    kiln_module *m = kiln__module_make(&embedding_class, 0, &kiln__layer_embedding, c, gen);
    if (!m)
        return NULL;
    kiln_scope_begin();
    kiln_tensor *w = kiln_init_normal(dev, KILN_SHAPE(c->num_embeddings, c->embedding_dim), 0, 1, gen);
    if (c->padding_idx >= 0) {
        /* The padding row starts at zero, as PyTorch's. */
        kiln_tensor *z = kiln_zeros(dev, KILN_F32, KILN_SHAPE(1, c->embedding_dim));
        w = kiln_slice_assign(w, 0, c->padding_idx, c->padding_idx + 1, 1, z);
    }
    kiln_keep(w);
    kiln_scope_end();
    if (kiln_module_add_parameter(m, "weight", w) < 0) {
        kiln_module_free(m);
        return NULL;
    }
    return m;
}

KILN__LAYER(embedding, kiln_embedding_config, "Embedding", embedding_fields, KILN__NFIELDS(embedding_fields))

/* ----------------------------------------------------------------------- Dropout */

kiln_dropout_config kiln_dropout_config_default(void)
{
    return (kiln_dropout_config){.p = 0.5};
}

static kiln_tensor *dropout_run(kiln_module *m, kiln_tensor *x)
{
    const kiln_dropout_config *c = CFG(kiln_dropout_config, m);
    if (!m->training || c->p == 0)
        return kiln__identity(x);
    return kiln_dropout(x, c->p, true, &m->gen);
}

static int dropout_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    return kiln__forward1(m, n_in, in, out, dropout_run);
}

static const kiln_module_class dropout_class = {"Dropout", dropout_forward, NULL};

static const kiln__field dropout_fields[] = {
    KILN__FIELD(kiln_dropout_config, KILN__F_F64, p),
};

kiln_module *kiln_dropout_init(const kiln_dropout_config *c, kiln_device *dev, kiln_generator *gen)
{
    KILN__REQUIRE(c, "Dropout", "config is required");
    KILN__REQUIRE(c->p >= 0 && c->p <= 1, "Dropout", "p must be in [0, 1] (got %g)", c->p);
    kiln_generator fb;
    return kiln__module_make(&dropout_class, 0, &kiln__layer_dropout, c, kiln__gen_or_default(gen, &fb));
}

KILN__LAYER(dropout, kiln_dropout_config, "Dropout", dropout_fields, KILN__NFIELDS(dropout_fields))

/* ----------------------------------------------------------------------- Flatten */

kiln_flatten_config kiln_flatten_config_default(void)
{
    return (kiln_flatten_config){.start_dim = 1, .end_dim = -1};
}

/* PyTorch's dims, checked here so the layer agrees with torch.nn.Flatten on every input:
 * a 0-d input counts as one dim for wrapping (so dims must lie in [-1, 0]: the default
 * start_dim 1 is an error, Flatten(0, -1) gives [1]), and start_dim may not come after
 * end_dim once both are wrapped. */
static kiln_tensor *flatten_run(kiln_module *m, kiln_tensor *x)
{
    const kiln_flatten_config *c = CFG(kiln_flatten_config, m);
    int nd = kiln_tensor_ndim(x), wrap = nd > 0 ? nd : 1;
    int64_t dims[2] = {c->start_dim, c->end_dim};
    const char *names[2] = {"start_dim", "end_dim"};
    char d[96];
    for (int i = 0; i < 2; i++) {
        if (dims[i] < -wrap || dims[i] >= wrap) {
            kiln__module_error(m, "input %s: %s %lld is out of range (expected in [%d, %d])",
                               kiln__desc_str(x, d, sizeof d), names[i], (long long)dims[i], -wrap, wrap - 1);
            return NULL;
        }
        if (dims[i] < 0)
            dims[i] += wrap;
    }
    if (dims[0] > dims[1]) {
        kiln__module_error(m, "input %s: start_dim %lld comes after end_dim %lld", kiln__desc_str(x, d, sizeof d),
                           (long long)c->start_dim, (long long)c->end_dim);
        return NULL;
    }
    if (nd == 0)
        return kiln_reshape(x, KILN_SHAPE(1));
    return kiln_flatten(x, (int)dims[0], (int)dims[1]);
}

static int flatten_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    return kiln__forward1(m, n_in, in, out, flatten_run);
}

static const kiln_module_class flatten_class = {"Flatten", flatten_forward, NULL};

static const kiln__field flatten_fields[] = {
    KILN__FIELD(kiln_flatten_config, KILN__F_I64, start_dim),
    KILN__FIELD(kiln_flatten_config, KILN__F_I64, end_dim),
};

kiln_module *kiln_flatten_init(const kiln_flatten_config *c, kiln_device *dev, kiln_generator *gen)
{
    KILN__REQUIRE(c, "Flatten", "config is required");
    return kiln__module_make(&flatten_class, 0, &kiln__layer_flatten, c, NULL);
}

KILN__LAYER(flatten, kiln_flatten_config, "Flatten", flatten_fields, KILN__NFIELDS(flatten_fields))

/* ------------------------------------------------- activations without settings */

#define SIMPLE_ACTIVATION(L, tname, expr)                                                         \
    kiln_empty_config kiln_##L##_config_default(void) { return (kiln_empty_config){0}; }          \
    static kiln_tensor *L##_run(kiln_module *m, kiln_tensor *x) { return expr; }                  \
    static int L##_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out,         \
                           kiln_tensor **out)                                                     \
    {                                                                                             \
        return kiln__forward1(m, n_in, in, out, L##_run);                                         \
    }                                                                                             \
    static const kiln_module_class L##_class = {tname, L##_forward, NULL};                        \
    kiln_module *kiln_##L##_init(const kiln_empty_config *c, kiln_device *dev, kiln_generator *gen) \
    {                                                                                             \
        kiln_empty_config d = {0};                                                                \
        return kiln__module_make(&L##_class, 0, &kiln__layer_##L, c ? c : &d, NULL);               \
    }                                                                                             \
    KILN__LAYER(L, kiln_empty_config, tname, no_fields, 0)

SIMPLE_ACTIVATION(relu, "ReLU", kiln_relu(x))
SIMPLE_ACTIVATION(silu, "SiLU", kiln_silu(x))
SIMPLE_ACTIVATION(sigmoid, "Sigmoid", kiln_sigmoid(x))
SIMPLE_ACTIVATION(tanh, "Tanh", kiln_tanh(x))
SIMPLE_ACTIVATION(identity, "Identity", kiln__identity(x))

/* ------------------------------------------------------------------- LeakyReLU */

kiln_leaky_relu_config kiln_leaky_relu_config_default(void)
{
    return (kiln_leaky_relu_config){.negative_slope = 0.01};
}

static kiln_tensor *leaky_relu_run(kiln_module *m, kiln_tensor *x)
{
    return kiln_leaky_relu(x, CFG(kiln_leaky_relu_config, m)->negative_slope);
}

static int leaky_relu_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    return kiln__forward1(m, n_in, in, out, leaky_relu_run);
}

static const kiln_module_class leaky_relu_class = {"LeakyReLU", leaky_relu_forward, NULL};
static const kiln__field leaky_relu_fields[] = {
    KILN__FIELD(kiln_leaky_relu_config, KILN__F_F64, negative_slope),
};

kiln_module *kiln_leaky_relu_init(const kiln_leaky_relu_config *c, kiln_device *dev, kiln_generator *gen)
{
    KILN__REQUIRE(c, "LeakyReLU", "config is required");
    return kiln__module_make(&leaky_relu_class, 0, &kiln__layer_leaky_relu, c, NULL);
}

KILN__LAYER(leaky_relu, kiln_leaky_relu_config, "LeakyReLU", leaky_relu_fields, KILN__NFIELDS(leaky_relu_fields))

/* ------------------------------------------------------------------------ GELU */

static const char *const gelu_names[] = {"none", "tanh", NULL};

kiln_gelu_config kiln_gelu_config_default(void)
{
    return (kiln_gelu_config){.approximate = KILN_GELU_NONE};
}

static kiln_tensor *gelu_run(kiln_module *m, kiln_tensor *x)
{
    return kiln_gelu(x, CFG(kiln_gelu_config, m)->approximate == KILN_GELU_TANH);
}

static int gelu_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    return kiln__forward1(m, n_in, in, out, gelu_run);
}

static const kiln_module_class gelu_class = {"GELU", gelu_forward, NULL};
static const kiln__field gelu_fields[] = {
    KILN__FIELD_ENUM(kiln_gelu_config, approximate, gelu_names),
};

kiln_module *kiln_gelu_init(const kiln_gelu_config *c, kiln_device *dev, kiln_generator *gen)
{
    KILN__REQUIRE(c && (c->approximate == KILN_GELU_NONE || c->approximate == KILN_GELU_TANH), "GELU",
                  "approximate must be \"none\" or \"tanh\"");
    return kiln__module_make(&gelu_class, 0, &kiln__layer_gelu, c, NULL);
}

KILN__LAYER(gelu, kiln_gelu_config, "GELU", gelu_fields, KILN__NFIELDS(gelu_fields))

/* --------------------------------------------------------------------- Softmax */

kiln_softmax_config kiln_softmax_config_default(void)
{
    return (kiln_softmax_config){.dim = -1};
}

static kiln_tensor *softmax_run(kiln_module *m, kiln_tensor *x)
{
    return kiln_softmax(x, (int)CFG(kiln_softmax_config, m)->dim);
}

static int softmax_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    return kiln__forward1(m, n_in, in, out, softmax_run);
}

static const kiln_module_class softmax_class = {"Softmax", softmax_forward, NULL};
static const kiln__field softmax_fields[] = {
    KILN__FIELD(kiln_softmax_config, KILN__F_I64, dim),
};

kiln_module *kiln_softmax_init(const kiln_softmax_config *c, kiln_device *dev, kiln_generator *gen)
{
    KILN__REQUIRE(c, "Softmax", "config is required");
    return kiln__module_make(&softmax_class, 0, &kiln__layer_softmax, c, NULL);
}

KILN__LAYER(softmax, kiln_softmax_config, "Softmax", softmax_fields, KILN__NFIELDS(softmax_fields))

/* ----------------------------------------------------------------------- PReLU */

kiln_prelu_config kiln_prelu_config_default(void)
{
    return (kiln_prelu_config){.num_parameters = 1, .init = 0.25};
}

static kiln_tensor *prelu_run(kiln_module *m, kiln_tensor *x)
{
    const kiln_prelu_config *c = CFG(kiln_prelu_config, m);
    kiln_tensor *w = kiln_module_get(m, "weight");
    if (c->num_parameters > 1) {
        /* One slope per channel (dim 1): shape the weight [C, 1, ...] to broadcast. */
        int nd = kiln_tensor_ndim(x);
        if (nd < 2 || kiln_tensor_dim(x, 1) != c->num_parameters) {
            char d[96];
            kiln__module_error(m, "input %s: dim 1 must equal num_parameters = %lld",
                               kiln__desc_str(x, d, sizeof d), (long long)c->num_parameters);
            return NULL;
        }
        int64_t shape[KILN_MAX_DIMS];
        shape[0] = c->num_parameters;
        for (int i = 1; i < nd - 1; i++)
            shape[i] = 1;
        w = kiln_reshape(w, nd - 1, shape);
    } else if (kiln_tensor_ndim(x) == 0) {
        /* A 0-d input keeps its shape (as PyTorch's): the [1] weight would broadcast it to [1]. */
        w = kiln_reshape(w, 0, NULL);
    }
    /* prelu(x) = relu(x) - w · relu(-x) */
    return kiln_sub(kiln_relu(x), kiln_mul(w, kiln_relu(kiln_neg(x))));
}

static int prelu_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    return kiln__forward1(m, n_in, in, out, prelu_run);
}

static const kiln_module_class prelu_class = {"PReLU", prelu_forward, NULL};
static const kiln__field prelu_fields[] = {
    KILN__FIELD(kiln_prelu_config, KILN__F_I64, num_parameters),
    KILN__FIELD(kiln_prelu_config, KILN__F_F64, init),
};

kiln_module *kiln_prelu_init(const kiln_prelu_config *c, kiln_device *dev, kiln_generator *gen)
{
    KILN__REQUIRE(c && dev, "PReLU", "config and device are required");
    KILN__REQUIRE(c->num_parameters > 0, "PReLU", "num_parameters must be > 0");
    kiln_module *m = kiln__module_make(&prelu_class, 0, &kiln__layer_prelu, c, NULL);
    if (m && kiln_module_add_parameter(m, "weight",
                                       kiln_keep(kiln_init_constant(dev, KILN_SHAPE(c->num_parameters), c->init))) < 0) {
        kiln_module_free(m);
        return NULL;
    }
    return m;
}

KILN__LAYER(prelu, kiln_prelu_config, "PReLU", prelu_fields, KILN__NFIELDS(prelu_fields))

/* ---------------------------------------------------------------------- SwiGLU */

kiln_swiglu_config kiln_swiglu_config_default(void)
{
    return (kiln_swiglu_config){.dim = -1};
}

static kiln_tensor *swiglu_run(kiln_module *m, kiln_tensor *x)
{
    int dim = (int)CFG(kiln_swiglu_config, m)->dim;
    int64_t n = kiln_tensor_dim(x, dim);
    if (n < 0 || n % 2) {
        char d[96];
        kiln__module_error(m, "input %s: dim %d must have an even size", kiln__desc_str(x, d, sizeof d), dim);
        return NULL;
    }
    kiln_tensor *a = kiln_narrow(x, dim, 0, n / 2);
    kiln_tensor *b = kiln_narrow(x, dim, n / 2, n / 2);
    return kiln_mul(kiln_silu(a), b);
}

static int swiglu_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    return kiln__forward1(m, n_in, in, out, swiglu_run);
}

static const kiln_module_class swiglu_class = {"SwiGLU", swiglu_forward, NULL};
static const kiln__field swiglu_fields[] = {
    KILN__FIELD(kiln_swiglu_config, KILN__F_I64, dim),
};

kiln_module *kiln_swiglu_init(const kiln_swiglu_config *c, kiln_device *dev, kiln_generator *gen)
{
    KILN__REQUIRE(c, "SwiGLU", "config is required");
    return kiln__module_make(&swiglu_class, 0, &kiln__layer_swiglu, c, NULL);
}

KILN__LAYER(swiglu, kiln_swiglu_config, "SwiGLU", swiglu_fields, KILN__NFIELDS(swiglu_fields))

/* ------------------------------------------------------------------ Sequential */

/* How many of n_in inputs are given: trailing NULLs mean "not given". */
static int given_inputs(int n_in, kiln_tensor *const *in)
{
    while (n_in > 0 && !in[n_in - 1])
        n_in--;
    return n_in;
}

static int sequential_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    if (m->nchildren == 0) {
        if (n_in < 1 || !in[0])
            return kiln__module_error(m, "needs an input tensor");
        if (given_inputs(n_in, in) > 1)
            return kiln__module_error(m, "is empty and takes 1 input (got %d)", given_inputs(n_in, in));
        out[0] = kiln__identity(in[0]);
        return 1;
    }
    /* The first child sees every input; later ones get the previous first output, which
     * is released as soon as the next child has taken it (autograd holds what backward
     * needs): held to the end of the sequence, every activation of a deep network stayed
     * alive at once, and a fusing device had to store each one, never knowing it dead. */
    kiln_tensor *x = NULL;
    for (int i = 0; i < m->nchildren; i++) {
        kiln_tensor *y = i == 0 ? kiln_module_forward_n(m->children[0].m, n_in, in, 1, out) == 1 ? out[0] : NULL
                                : kiln_module_forward(m->children[i].m, x);
        if (i > 0)
            kiln_tensor_release(x);
        x = y;
        if (!x)
            return -1;
    }
    out[0] = x;
    return 1;
}

static const kiln_module_class sequential_class = {"Sequential", sequential_forward, NULL};

kiln_module *kiln_sequential_new(void)
{
    return kiln_module_new(&sequential_class, NULL);
}

int kiln_sequential_append(kiln_module *seq, kiln_module *child)
{
    if (!seq || seq->cls != &sequential_class) {
        kiln_module_free(child);
        return kiln__error_set("kiln_sequential_append: not a Sequential");
    }
    char name[24];
    snprintf(name, sizeof name, "%d", seq->nchildren);
    return kiln_module_add_child(seq, name, child);
}

/* -------------------------------------------------------------------- Residual */

static int residual_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    if (n_in < 1 || !in[0])
        return kiln__module_error(m, "needs an input tensor");
    if (given_inputs(n_in, in) > 1)
        return kiln__module_error(m, "takes 1 input (got %d)", given_inputs(n_in, in));
    kiln_tensor *y = kiln_module_forward(kiln_module_find(m, "body"), in[0]);
    kiln_module *sc = kiln_module_find(m, "shortcut");
    kiln_tensor *s = sc ? kiln_module_forward(sc, in[0]) : in[0];
    if (!y || !s)
        return -1;
    out[0] = kiln_add(y, s);
    if (!out[0]) {
        char a[96], b[96];
        return kiln__module_error(m, "body output %s and shortcut %s cannot be added", kiln__desc_str(y, a, sizeof a),
                                  kiln__desc_str(s, b, sizeof b));
    }
    return 1;
}

static const kiln_module_class residual_class = {"Residual", residual_forward, NULL};

kiln_module *kiln_residual_new(kiln_module *body, kiln_module *shortcut)
{
    if (!body) {
        kiln_module_free(shortcut);
        kiln__error_set("kiln_residual_new: a body is required");
        return NULL;
    }
    kiln_module *m = kiln_module_new(&residual_class, NULL);
    if (!m) {
        kiln_module_free(body);
        kiln_module_free(shortcut);
        return NULL;
    }
    int rc = kiln_module_add_child(m, "body", body);
    if (shortcut && rc == 0)
        rc = kiln_module_add_child(m, "shortcut", shortcut);
    else if (shortcut)
        kiln_module_free(shortcut);
    if (rc < 0) {
        kiln_module_free(m);
        return NULL;
    }
    return m;
}
