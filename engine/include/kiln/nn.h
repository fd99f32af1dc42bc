/*
 * kiln/nn.h — modules, layers, initializers and models built from JSON specs.
 *
 *     kiln_device *dev = kiln_device_open("cpu");
 *     kiln_generator gen = kiln_generator_make(42);
 *     kiln_linear_config cfg = kiln_linear_config_default();
 *     cfg.in_features = 10;
 *     cfg.out_features = 5;
 *     kiln_module *fc = kiln_linear_init(&cfg, dev, &gen);   // 55 parameters, PyTorch's init
 *
 *     kiln_scope_begin();
 *     kiln_tensor *y = kiln_module_forward(fc, x);            // x [N, 10] -> y [N, 5]
 *     if (!y) fprintf(stderr, "%s\n", kiln_error());          // "Linear '(root)': ..."
 *     kiln_scope_end();
 *
 *     // Parameters for an optimizer: borrowed tensors with dotted names.
 *     int n = kiln_module_parameters(fc, NULL, 0);
 *     kiln_named_tensor *ps = calloc(n, sizeof *ps);
 *     kiln_module_parameters(fc, ps, n);                     // "weight", "bias"
 *
 *     kiln_module *net = kiln_model_from_json(spec_text, dev, &gen);  // a whole graph
 *     kiln_module_free(fc);
 *
 * Modules. A kiln_module is a node in a tree: it owns named parameters (trainable
 * leaves, created with kiln_requires_grad(p, true)), named buffers (state that is saved
 * but not trained, e.g. BatchNorm's running statistics) and named children. Full names
 * join the path with dots, as PyTorch's state_dict does: "encoder.layers.0.attn.q.weight".
 * A module's name inside its parent is its last path element; the root has no name.
 *
 * Listing parameters (for optimizers, savers, device moves): kiln_module_parameters()
 * and kiln_module_visit(). Tensors handed out are borrowed: they live as long as the
 * module and until a call that replaces them (kiln_module_to_device, kiln_module_map),
 * after which list them again (an optimizer made before such a call refuses to step:
 * see kiln_optim_step). kiln_module_load_* write into the module's tensors in place and
 * replace none. Names are valid until the next listing call on the same module or until
 * it is freed.
 *
 * Forward. kiln_module_forward_n() takes N inputs (NULL entries mean "not given" for
 * optional inputs such as masks) and writes up to max_out outputs, returning how many.
 * More inputs than a layer (or a JSON model) takes is an error naming it and the counts,
 * as PyTorch raises on an extra argument; trailing NULL entries do not count.
 * kiln_module_forward() is the one-in, one-out form. Outputs follow tensor.h's
 * ownership rule (the innermost open scope takes them); everything a forward pass
 * creates in between is released before it returns. A failure returns NULL / -1 and
 * kiln_error() names the layer type and path: "Linear 'encoder.fc': input f32[2, 7]:
 * last dim must be in_features = 10" ("(root)" in place of the path for the module
 * forward was called on, as fc above).
 *
 * Layers. Every layer has a plain config struct with PyTorch's defaults
 * (kiln_<layer>_config_default()), a JSON form (kiln_<layer>_config_to_json /
 * _from_json; unknown keys are rejected naming the key) and kiln_<layer>_init(config,
 * device, generator), which draws the weights with PyTorch's default initialization
 * from the given generator (NULL means seed 0). Parameter names equal PyTorch's, so a
 * PyTorch state_dict saved as safetensors loads by name.
 *
 * Threads: a module may be used from one thread at a time.
 */
#ifndef KILN_NN_H
#define KILN_NN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

KILN_API_BEGIN

/* ========================================================================= modules */

typedef struct kiln_module kiln_module;

/** A borrowed tensor and its full dotted name. */
typedef struct kiln_named_tensor {
    const char *name;
    kiln_tensor *tensor;
    bool is_buffer;   /* false for parameters */
} kiln_named_tensor;

/**
 * Write up to max parameters (depth first, in registration order: a module's own
 * parameters before its children's) into out; returns the total number, so a call with
 * out NULL and max 0 sizes the array. Frozen parameters are listed too.
 */
int kiln_module_parameters(kiln_module *m, kiln_named_tensor *out, int max);
/** Same for buffers. */
int kiln_module_buffers(kiln_module *m, kiln_named_tensor *out, int max);
/** Parameters then buffers: everything a checkpoint holds. Returns the total number. */
int kiln_module_state_dict(kiln_module *m, kiln_named_tensor *out, int max);

/**
 * The generators m's tree draws forward-time randomness from (Dropout, and the dropout in
 * MultiheadAttention, the Transformer layers, PositionalEncoding, LSTM and GRU): one per
 * module, m first, then each child's tree in order. Writes up to max pointers into out
 * (borrowed, valid as long as the modules: read them to save the streams, assign them to
 * restore) and each module's kiln_module_path into paths (valid until the tree changes);
 * either may be NULL. Returns the total number (out and paths NULL, max 0 sizes the
 * arrays). They are not in the state dict; kiln/train.h's checkpoints save them, so that a
 * resumed run draws the same dropout masks as the uninterrupted one.
 */
int kiln_module_generators(kiln_module *m, kiln_generator **out, const char **paths, int max);

/**
 * Called for every parameter and buffer with its full name (valid during the call)
 * and the tensor (borrowed). A nonzero return stops the walk and is returned.
 */
typedef int (*kiln_module_visit_fn)(void *ud, const char *name, kiln_tensor *t, bool is_buffer);
int kiln_module_visit(kiln_module *m, kiln_module_visit_fn fn, void *ud);

/**
 * Replace every parameter and buffer with fn's result: fn returns a new reference
 * (never NULL on success) or NULL plus an error, which stops the map and is reported
 * as -1. Replaced parameters keep their trainable/frozen state.
 */
typedef kiln_tensor *(*kiln_module_map_fn)(void *ud, const char *name, kiln_tensor *t, bool is_buffer);
int kiln_module_map(kiln_module *m, kiln_module_map_fn fn, void *ud);

/** Number of trainable parameter elements (frozen ones excluded when trainable_only). */
int64_t kiln_module_parameter_count(kiln_module *m, bool trainable_only);

/** Train (true) or eval (false) mode for m and every descendant. */
void kiln_module_train(kiln_module *m, bool training);
bool kiln_module_is_training(const kiln_module *m);

/** Freeze (requires_grad off) or unfreeze every parameter of m and its descendants. */
int kiln_module_freeze(kiln_module *m, bool frozen);

/** Move every parameter and buffer to dev (see the note on borrowed tensors above). */
int kiln_module_to_device(kiln_module *m, kiln_device *dev);

/** Layer type ("Linear", "Sequential", "Model", ...). */
const char *kiln_module_type(const kiln_module *m);
/** Full dotted path from the root ("" for the root). Valid until the tree changes. */
const char *kiln_module_path(kiln_module *m);
int kiln_module_child_count(const kiln_module *m);
kiln_module *kiln_module_child_at(kiln_module *m, int i);
const char *kiln_module_child_name(const kiln_module *m, int i);
/** Descendant by dotted path ("layers.0.attn"), or NULL. */
kiln_module *kiln_module_find(kiln_module *m, const char *path);
/** Own parameter or buffer by local name ("weight"), borrowed, or NULL. */
kiln_tensor *kiln_module_get(kiln_module *m, const char *name);
/** Parameter or buffer anywhere below m by full dotted name, borrowed, or NULL. */
kiln_tensor *kiln_module_lookup(kiln_module *m, const char *dotted);
/** The layer's config as JSON (malloc'd, free()), or NULL for modules without one. */
char *kiln_module_config_json(const kiln_module *m);
/**
 * The JSON spec a model was built from by kiln_model_from_json (malloc'd, free()): given to
 * kiln_model_from_json again it builds a model of the same structure and tensor names, so
 * that spec and state dict together make the model again (training checkpoints store it).
 * NULL with an error for any other module (a layer, a container, a custom class).
 */
char *kiln_model_spec_json(const kiln_module *m);

/** Free m and its children (only roots: a child belongs to its parent). NULL is a no-op. */
void kiln_module_free(kiln_module *m);

/** Run the module (see "Forward" above). */
int kiln_module_forward_n(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out);
kiln_tensor *kiln_module_forward(kiln_module *m, kiln_tensor *x);

/* ------------------------------------------------------------- state dict import */

/** What an import did not match. */
typedef struct kiln_load_report {
    int missing;        /* module tensors the source did not have */
    int unexpected;     /* source tensors the module does not have */
    char text[1024];    /* "missing: a.weight, ...; unexpected: ..." (truncated) */
} kiln_load_report;

/**
 * Copy n named tensors into the module's parameters and buffers. Each tensor is cast to
 * the module tensor's dtype and moved to its device, then written into the module's own
 * tensor in place, as PyTorch's load_state_dict copies: the tensor objects stay the same,
 * so whatever holds them (an optimizer created before the load, PyTorch's usual order)
 * sees the loaded values. A shape mismatch is an error naming the key, and nothing is
 * changed. strict: any missing or unexpected key is an error (nothing is changed);
 * lenient: matching keys load and the rest is reported. In either mode a NULL name or a
 * key given twice is an error naming it (nothing is changed). report may be NULL.
 */
int kiln_module_load_state_dict(kiln_module *m, int n, const char *const *names, kiln_tensor *const *tensors,
                                bool strict, kiln_load_report *report);
/** The same from a safetensors file, and saving the state dict to one (atomically). */
int kiln_module_load_safetensors(kiln_module *m, const char *path, bool strict, kiln_load_report *report);
int kiln_module_save_safetensors(kiln_module *m, const char *path);

/* ------------------------------------------------------------- custom modules */

/**
 * A module type. forward gets the inputs as passed to kiln_module_forward_n and writes
 * up to max_out new references; it returns the number of outputs or -1 with an error.
 * It may create temporaries freely: the caller runs it inside a scope. destroy frees
 * self (may be NULL).
 */
typedef struct kiln_module_class {
    const char *type;
    int (*forward)(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out);
    void (*destroy)(void *self);
} kiln_module_class;

/** A new root module of class cls with private data self (freed by cls->destroy). */
kiln_module *kiln_module_new(const kiln_module_class *cls, void *self);
void *kiln_module_self(const kiln_module *m);
/** Register a parameter (takes the reference t; marks it requires_grad) or a buffer. */
int kiln_module_add_parameter(kiln_module *m, const char *name, kiln_tensor *t);
int kiln_module_add_buffer(kiln_module *m, const char *name, kiln_tensor *t);
/** Attach child (a root) under name; m owns it afterwards, also when this fails. */
int kiln_module_add_child(kiln_module *m, const char *name, kiln_module *child);

/* ==================================================================== initializers */
/* torch.nn.init semantics. Fans come from [out, in, k...] shapes: fan_in = in * prod(k),
 * fan_out = out * prod(k). Results are new f32 tensors (tensor.h's ownership rule);
 * gen NULL means a fresh generator with seed 0. */

typedef enum kiln_nonlinearity {
    KILN_GAIN_LINEAR = 0,  /* gain 1 (also conv, identity) */
    KILN_GAIN_SIGMOID,     /* 1 */
    KILN_GAIN_TANH,        /* 5/3 */
    KILN_GAIN_RELU,        /* sqrt(2) */
    KILN_GAIN_LEAKY_RELU,  /* sqrt(2 / (1 + slope^2)) */
    KILN_GAIN_SELU,        /* 3/4 */
} kiln_nonlinearity;

typedef enum kiln_fan_mode { KILN_FAN_IN = 0, KILN_FAN_OUT } kiln_fan_mode;

/** The recommended gain for nl; param is the leaky_relu negative slope. */
double kiln_init_gain(kiln_nonlinearity nl, double param);
kiln_tensor *kiln_init_zeros(kiln_device *dev, int ndim, const int64_t *shape);
kiln_tensor *kiln_init_ones(kiln_device *dev, int ndim, const int64_t *shape);
kiln_tensor *kiln_init_constant(kiln_device *dev, int ndim, const int64_t *shape, double value);
kiln_tensor *kiln_init_uniform(kiln_device *dev, int ndim, const int64_t *shape, double low, double high,
                               kiln_generator *gen);
kiln_tensor *kiln_init_normal(kiln_device *dev, int ndim, const int64_t *shape, double mean, double std,
                              kiln_generator *gen);
/** Glorot: uniform(±gain·sqrt(6 / (fan_in + fan_out))), normal(0, gain·sqrt(2 / (fan_in + fan_out))). */
kiln_tensor *kiln_init_xavier_uniform(kiln_device *dev, int ndim, const int64_t *shape, double gain,
                                      kiln_generator *gen);
kiln_tensor *kiln_init_xavier_normal(kiln_device *dev, int ndim, const int64_t *shape, double gain,
                                     kiln_generator *gen);
/** He: std = gain(nl, a) / sqrt(fan); uniform bound sqrt(3)·std. a is the leaky slope. */
kiln_tensor *kiln_init_kaiming_uniform(kiln_device *dev, int ndim, const int64_t *shape, double a,
                                       kiln_fan_mode mode, kiln_nonlinearity nl, kiln_generator *gen);
kiln_tensor *kiln_init_kaiming_normal(kiln_device *dev, int ndim, const int64_t *shape, double a,
                                      kiln_fan_mode mode, kiln_nonlinearity nl, kiln_generator *gen);
/** A (semi-)orthogonal matrix times gain: rows = shape[0], columns the rest flattened. */
kiln_tensor *kiln_init_orthogonal(kiln_device *dev, int ndim, const int64_t *shape, double gain,
                                  kiln_generator *gen);

/* ========================================================================== layers */
/*
 * For each layer L below, with config type T:
 *     T            kiln_L_config_default(void);       PyTorch's defaults; required sizes 0
 *     char        *kiln_L_config_to_json(const T *);   malloc'd JSON object, free()
 *     int          kiln_L_config_from_json(const char *json, T *out);  defaults, then keys;
 *                                                      unknown key / bad value: -1, key named
 *     kiln_module *kiln_L_init(const T *, kiln_device *, kiln_generator *);
 * JSON keys equal the field names. Array fields (kernel_size, ...) accept one integer
 * (repeated) or a list. Layers are also reachable by their PyTorch class name through
 * kiln_layer_from_json ("Linear", "Conv2d", ...; the name is given with each layer).
 */
#define KILN_NN_LAYER_API(L, T)                                                  \
    T kiln_##L##_config_default(void);                                           \
    char *kiln_##L##_config_to_json(const T *config);                            \
    int kiln_##L##_config_from_json(const char *json, T *config);                \
    kiln_module *kiln_##L##_init(const T *config, kiln_device *dev, kiln_generator *gen);

/** Build a layer by PyTorch class name from a JSON config object (NULL or "" = defaults). */
kiln_module *kiln_layer_from_json(const char *layer, const char *config_json, kiln_device *dev,
                                  kiln_generator *gen);
/** Number of layer types and the i-th name, for listings and error messages. */
int kiln_layer_count(void);
const char *kiln_layer_name(int i);

/** Layers without settings (ReLU, SiLU, Sigmoid, Tanh, Identity). */
typedef struct kiln_empty_config {
    char reserved;
} kiln_empty_config;

/** "Linear": y = x Wᵀ + b. weight [out, in], bias [out]. Input [..., in]. */
typedef struct kiln_linear_config {
    int64_t in_features;   /* required */
    int64_t out_features;  /* required */
    bool bias;             /* true */
} kiln_linear_config;
KILN_NN_LAYER_API(linear, kiln_linear_config)

/**
 * "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d". Array fields hold one entry
 * per spatial dim (the 1-d layers use entry 0). weight [out, in/groups, k...] (transposed:
 * [in, out/groups, k...]), bias [out]. Input [N, C, L] / [N, C, H, W] or unbatched.
 */
typedef struct kiln_conv_config {
    int64_t in_channels;        /* required */
    int64_t out_channels;       /* required */
    int64_t kernel_size[2];     /* required */
    int64_t stride[2];          /* 1 */
    int64_t padding[2];         /* 0 */
    int64_t dilation[2];        /* 1 */
    int64_t output_padding[2];  /* 0; transposed only */
    int64_t groups;             /* 1 */
    bool bias;                  /* true */
} kiln_conv_config;
KILN_NN_LAYER_API(conv1d, kiln_conv_config)
KILN_NN_LAYER_API(conv2d, kiln_conv_config)
KILN_NN_LAYER_API(conv_transpose1d, kiln_conv_config)
KILN_NN_LAYER_API(conv_transpose2d, kiln_conv_config)

/**
 * "BatchNorm1d" (input [N, C] or [N, C, L]), "BatchNorm2d" ([N, C, H, W]). Parameters
 * weight, bias (affine); buffers running_mean, running_var, num_batches_tracked (i64)
 * when track_running_stats. momentum <= 0 means a cumulative average, as PyTorch's None.
 */
typedef struct kiln_batch_norm_config {
    int64_t num_features;       /* required */
    double eps;                 /* 1e-5 */
    double momentum;            /* 0.1 */
    bool affine;                /* true */
    bool track_running_stats;   /* true */
} kiln_batch_norm_config;
KILN_NN_LAYER_API(batch_norm1d, kiln_batch_norm_config)
KILN_NN_LAYER_API(batch_norm2d, kiln_batch_norm_config)

/** "LayerNorm" over the last ndim dims. weight ones, bias zeros. */
typedef struct kiln_layer_norm_config {
    int64_t normalized_shape[4];  /* required; JSON: integer or list */
    int ndim;                     /* entries used (set by JSON) */
    double eps;                   /* 1e-5 */
    bool elementwise_affine;      /* true */
    bool bias;                    /* true */
} kiln_layer_norm_config;
KILN_NN_LAYER_API(layer_norm, kiln_layer_norm_config)

/** "RMSNorm": x / sqrt(mean(x², last ndim dims) + eps) · weight. eps <= 0 means the
 *  dtype's machine epsilon, as PyTorch's eps=None. */
typedef struct kiln_rms_norm_config {
    int64_t normalized_shape[4];  /* required */
    int ndim;
    double eps;                   /* 0 (machine epsilon) */
    bool elementwise_affine;      /* true */
} kiln_rms_norm_config;
KILN_NN_LAYER_API(rms_norm, kiln_rms_norm_config)

/** "GroupNorm": input [N, C, ...]. weight ones, bias zeros. */
typedef struct kiln_group_norm_config {
    int64_t num_groups;    /* required */
    int64_t num_channels;  /* required */
    double eps;            /* 1e-5 */
    bool affine;           /* true */
} kiln_group_norm_config;
KILN_NN_LAYER_API(group_norm, kiln_group_norm_config)

/** "Embedding": weight [num_embeddings, embedding_dim] ~ normal(0, 1); integer input. */
typedef struct kiln_embedding_config {
    int64_t num_embeddings;  /* required */
    int64_t embedding_dim;   /* required */
    int64_t padding_idx;     /* -1 = none; otherwise that row starts at zero and, as
                              * PyTorch's, gets no gradient (it never trains) */
} kiln_embedding_config;
KILN_NN_LAYER_API(embedding, kiln_embedding_config)

/** "Dropout": zero with probability p in training mode; identity in eval mode. */
typedef struct kiln_dropout_config {
    double p;  /* 0.5 */
} kiln_dropout_config;
KILN_NN_LAYER_API(dropout, kiln_dropout_config)

/** "MaxPool1d", "MaxPool2d", "AvgPool1d", "AvgPool2d". */
typedef struct kiln_pool_config {
    int64_t kernel_size[2];    /* required */
    int64_t stride[2];         /* 0 = kernel_size (PyTorch's None) */
    int64_t padding[2];        /* 0 */
    int64_t dilation[2];       /* 1; max pooling only */
    bool ceil_mode;            /* false */
    bool count_include_pad;    /* true; average pooling only */
} kiln_pool_config;
KILN_NN_LAYER_API(max_pool1d, kiln_pool_config)
KILN_NN_LAYER_API(max_pool2d, kiln_pool_config)
KILN_NN_LAYER_API(avg_pool1d, kiln_pool_config)
KILN_NN_LAYER_API(avg_pool2d, kiln_pool_config)

/** "AdaptiveAvgPool1d" (entry 0), "AdaptiveAvgPool2d". */
typedef struct kiln_adaptive_pool_config {
    int64_t output_size[2];  /* required */
} kiln_adaptive_pool_config;
KILN_NN_LAYER_API(adaptive_avg_pool1d, kiln_adaptive_pool_config)
KILN_NN_LAYER_API(adaptive_avg_pool2d, kiln_adaptive_pool_config)

/** "Flatten": dims start_dim..end_dim into one. */
typedef struct kiln_flatten_config {
    int64_t start_dim;  /* 1 */
    int64_t end_dim;    /* -1 */
} kiln_flatten_config;
KILN_NN_LAYER_API(flatten, kiln_flatten_config)

/* Activations. "ReLU", "SiLU", "Sigmoid", "Tanh", "Identity" take no settings. */
KILN_NN_LAYER_API(relu, kiln_empty_config)
KILN_NN_LAYER_API(silu, kiln_empty_config)
KILN_NN_LAYER_API(sigmoid, kiln_empty_config)
KILN_NN_LAYER_API(tanh, kiln_empty_config)
KILN_NN_LAYER_API(identity, kiln_empty_config)

/** "LeakyReLU". */
typedef struct kiln_leaky_relu_config {
    double negative_slope;  /* 0.01 */
} kiln_leaky_relu_config;
KILN_NN_LAYER_API(leaky_relu, kiln_leaky_relu_config)

/** "GELU": approximate "none" (erf) or "tanh". */
typedef enum kiln_gelu_approx { KILN_GELU_NONE = 0, KILN_GELU_TANH } kiln_gelu_approx;
typedef struct kiln_gelu_config {
    int approximate;  /* KILN_GELU_NONE */
} kiln_gelu_config;
KILN_NN_LAYER_API(gelu, kiln_gelu_config)

/** "Softmax" along dim. */
typedef struct kiln_softmax_config {
    int64_t dim;  /* -1 (PyTorch has no default; the last dim is the common choice) */
} kiln_softmax_config;
KILN_NN_LAYER_API(softmax, kiln_softmax_config)

/** "PReLU": learnable slope, weight [num_parameters] = init; one per channel (dim 1)
 *  when num_parameters > 1. */
typedef struct kiln_prelu_config {
    int64_t num_parameters;  /* 1 */
    double init;             /* 0.25 */
} kiln_prelu_config;
KILN_NN_LAYER_API(prelu, kiln_prelu_config)

/** "SwiGLU" as an activation: split dim in halves a, b and return silu(a) · b
 *  (the gated unit of LLaMA-style feed-forward blocks; put Linear layers around it). */
typedef struct kiln_swiglu_config {
    int64_t dim;  /* -1 */
} kiln_swiglu_config;
KILN_NN_LAYER_API(swiglu, kiln_swiglu_config)

/**
 * "MultiheadAttention", as PyTorch's nn.MultiheadAttention (same dims for q, k, v):
 * parameters in_proj_weight [3E, E], in_proj_bias [3E], out_proj.weight [E, E],
 * out_proj.bias [E] (xavier_uniform / zeros, as PyTorch). forward_n inputs:
 * (query, key, value, key_padding_mask, attn_mask), trailing ones optional, NULL = none;
 * one input means self-attention. Shapes [N, L, E] when batch_first, else [L, N, E].
 * key_padding_mask [N, S]: bool true = ignore that key (or a float mask, added);
 * attn_mask [L, S] or [N·heads, L, S]: bool true = not allowed (or float, added).
 * Masks of any other dtype are refused; float masks are cast to the module's compute
 * dtype (an f16 module with an f32 mask stays f16: -1e9 there becomes -inf). causal adds
 * the mask j > i. Output: the attention output (no weights), in the dtype of the
 * projections (the module's).
 */
typedef struct kiln_mha_config {
    int64_t embed_dim;   /* required */
    int64_t num_heads;   /* required; divides embed_dim */
    double dropout;      /* 0 (on the attention weights, training only) */
    bool bias;           /* true */
    bool batch_first;    /* false */
    bool causal;         /* false */
} kiln_mha_config;
KILN_NN_LAYER_API(mha, kiln_mha_config)

/**
 * "TransformerEncoderLayer" / "TransformerDecoderLayer", PyTorch's structure and names
 * (self_attn, [multihead_attn,] linear1, linear2, norm1, norm2, [norm3], dropouts).
 * Encoder inputs: (src, src_mask, src_key_padding_mask). Decoder inputs: (tgt, memory,
 * tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask). causal applies
 * a causal mask to the (decoder's or encoder's) self-attention.
 */
typedef enum kiln_activation { KILN_ACT_RELU = 0, KILN_ACT_GELU } kiln_activation;
typedef struct kiln_transformer_config {
    int64_t d_model;          /* required */
    int64_t nhead;            /* required */
    int64_t dim_feedforward;  /* 2048 */
    double dropout;           /* 0.1 */
    int activation;           /* KILN_ACT_RELU; JSON "relu" | "gelu" */
    double layer_norm_eps;    /* 1e-5 */
    bool batch_first;         /* false */
    bool norm_first;          /* false (post-norm) */
    bool bias;                /* true */
    bool causal;              /* false */
} kiln_transformer_config;
KILN_NN_LAYER_API(transformer_encoder_layer, kiln_transformer_config)
KILN_NN_LAYER_API(transformer_decoder_layer, kiln_transformer_config)

/** "PositionalEncoding": x + the sinusoidal table of "Attention is all you need"
 *  (sin on even features, cos on odd), then dropout. Input [N, L, D] when batch_first,
 *  else [L, N, D]. No parameters. */
typedef struct kiln_positional_encoding_config {
    int64_t d_model;   /* required, even */
    int64_t max_len;   /* 5000 */
    double dropout;    /* 0 */
    bool batch_first;  /* true */
} kiln_positional_encoding_config;
KILN_NN_LAYER_API(positional_encoding, kiln_positional_encoding_config)

/** "RotaryEmbedding" (RoPE): rotates feature pairs (i, i + dim/2) of x [..., L, dim] by
 *  angle position · base^(-2i/dim), positions counted along dim -2. No parameters. */
typedef struct kiln_rotary_config {
    int64_t dim;   /* required, even */
    double base;   /* 10000 */
} kiln_rotary_config;
KILN_NN_LAYER_API(rotary, kiln_rotary_config)

/**
 * "LSTM" / "GRU", PyTorch's gate order (LSTM: i, f, g, o; GRU: r, z, n) and names
 * weight_ih_l{k}[_reverse], weight_hh_l{k}, bias_ih_l{k}, bias_hh_l{k}, all
 * uniform(±1/sqrt(hidden_size)). forward_n inputs: (x, h0, c0) (states optional; c0
 * LSTM only), x [L, N, I] or [N, L, I] when batch_first, or unbatched [L, I]. Outputs:
 * (output, h_n[, c_n]); output holds both directions concatenated.
 */
typedef struct kiln_rnn_config {
    int64_t input_size;   /* required */
    int64_t hidden_size;  /* required */
    int64_t num_layers;   /* 1 */
    bool bias;            /* true */
    bool batch_first;     /* false */
    double dropout;       /* 0; between layers, training only */
    bool bidirectional;   /* false */
} kiln_rnn_config;
KILN_NN_LAYER_API(lstm, kiln_rnn_config)
KILN_NN_LAYER_API(gru, kiln_rnn_config)

/* ====================================================================== containers */

/** An empty "Sequential": children "0", "1", ... each fed the previous output. */
kiln_module *kiln_sequential_new(void);
/** Append child (taking ownership, also on failure) under the next index. */
int kiln_sequential_append(kiln_module *seq, kiln_module *child);

/** "Residual": y = body(x) + shortcut(x), or body(x) + x when shortcut is NULL. Takes
 *  ownership of both (children "body" and "shortcut"). */
kiln_module *kiln_residual_new(kiln_module *body, kiln_module *shortcut);

/* =================================================================== JSON models */
/*
 * A model is a graph written in JSON:
 *
 *   {"inputs": ["x"],
 *    "nodes": [
 *      {"name": "fc1",  "layer": "Linear", "config": {"in_features": 4, "out_features": 8}, "inputs": ["x"]},
 *      {"name": "act",  "op": "relu", "inputs": ["fc1"]},
 *      {"name": "skip", "op": "add",  "inputs": ["act", "fc1"]},
 *      {"name": "rnn",  "layer": "LSTM", "config": {...}, "inputs": ["x"], "outputs": 3}
 *    ],
 *    "outputs": ["skip"],
 *    "example_inputs": {"x": {"shape": [2, 4], "dtype": "f32"}}}
 *
 * Node names are unique; a node's "inputs" name graph inputs or earlier or later nodes
 * (the graph is ordered topologically; a cycle is an error naming a node on it). A node
 * with "outputs": k > 1 exposes "name:0" ... "name:k-1" (plain "name" is output 0).
 * "layer" nodes become children named after the node, so parameter names read
 * "fc1.weight". "op" nodes are functional: add, sub, mul (two or more inputs, broadcast),
 * cat (with "dim"), flatten ("start_dim", "end_dim"), reshape ("shape"), mean ("dims",
 * "keepdim"), relu, gelu, silu, sigmoid, tanh, softmax ("dim"), transpose ("dim0",
 * "dim1"), select ("dim", "index": picks one position and drops the dim). When
 * "example_inputs" is given, kiln_model_from_json runs a dry forward with zeros of those
 * shapes (integers for i64) and rejects a spec whose shapes cannot connect, naming the
 * node. Unknown keys anywhere are rejected.
 */
kiln_module *kiln_model_from_json(const char *json, kiln_device *dev, kiln_generator *gen);
/** The same, reading the spec from a file. */
kiln_module *kiln_model_from_json_file(const char *path, kiln_device *dev, kiln_generator *gen);

KILN_API_END

#ifdef __cplusplus
}
#endif
#endif /* KILN_NN_H */
