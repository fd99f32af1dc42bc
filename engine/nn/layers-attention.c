/*
 * engine/nn/layers-attention.c — attention and the transformer blocks:
 * MultiheadAttention (PyTorch's packed in_proj weights, key padding and attention
 * masks, causal), TransformerEncoderLayer and TransformerDecoderLayer (pre- and
 * post-norm), sinusoidal PositionalEncoding and rotary embeddings (RoPE).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn-impl.h"
#include "tensor-impl.h"

/* ------------------------------------------------------------ MultiheadAttention */

kiln_mha_config kiln_mha_config_default(void)
{
    return (kiln_mha_config){.bias = true};
}

/* A boolean "not allowed" mask becomes an additive one: -inf where true. A float mask
 * is already additive. Either comes in dt, the dtype of the attention scores, so that
 * adding it promotes nothing: an f16 module stays f16 whatever its masks. */
static kiln_tensor *additive_mask(kiln_tensor *mask, kiln_dtype dt)
{
    if (!mask)
        return NULL;
    if (kiln_tensor_dtype(mask) != KILN_BOOL)
        return kiln_cast(mask, dt);
    return kiln_masked_fill(
        kiln_zeros(kiln_tensor_device(mask), dt, kiln_tensor_ndim(mask), kiln_tensor_shape(mask)), mask,
        -INFINITY);
}

/* [N, L, E] -> [N, H, L, D] */
static kiln_tensor *split_heads(kiln_tensor *x, int64_t heads)
{
    int64_t n = kiln_tensor_dim(x, 0), l = kiln_tensor_dim(x, 1), e = kiln_tensor_dim(x, 2);
    return kiln_transpose(kiln_reshape(x, KILN_SHAPE(n, l, heads, e / heads)), 1, 2);
}

/* The layers below run each stage (the attention weights; a Transformer sublayer: a
 * block, its residual and its norm) in a scope of its own, ended by kiln__scope_end_keep,
 * so its temporaries go as soon as the stage is done, unless a backward saved them. Held
 * until the layer returned, they stayed alive through the next stage's products: a fused
 * group stored them though nothing read them again, and the layer's peak memory held
 * every stage's temporaries at once. */

static int mha_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    const kiln_mha_config *c = m->config;
    kiln_tensor *q = kiln__in(n_in, in, 0);
    kiln_tensor *k = kiln__in(n_in, in, 1) ? in[1] : q;
    kiln_tensor *v = kiln__in(n_in, in, 2) ? in[2] : k;
    kiln_tensor *kpm = kiln__in(n_in, in, 3), *am = kiln__in(n_in, in, 4);
    if (kiln__check_input(m, q, 3, 2, "query") < 0 || kiln__check_input(m, k, kiln_tensor_ndim(q), -1, "key") < 0 ||
        kiln__check_input(m, v, kiln_tensor_ndim(q), -1, "value") < 0)
        return -1;
    int64_t E = c->embed_dim, H = c->num_heads;
    kiln_tensor *xs[3] = {q, k, v};
    for (int i = 0; i < 3; i++)
        if (kiln_tensor_dim(xs[i], -1) != E) {
            char d[96];
            return kiln__module_error(m, "%s %s: last dim must be embed_dim = %lld",
                                      i == 0 ? "query" : i == 1 ? "key" : "value",
                                      kiln__desc_str(xs[i], d, sizeof d), (long long)E);
        }
    bool unbatched = kiln_tensor_ndim(q) == 2;
    for (int i = 0; i < 3; i++) {
        /* Work batch-first: [N, L, E]. */
        if (unbatched)
            xs[i] = kiln_unsqueeze(xs[i], 0);
        else if (!c->batch_first)
            xs[i] = kiln_transpose(xs[i], 0, 1);
    }
    int64_t N = kiln_tensor_dim(xs[0], 0), L = kiln_tensor_dim(xs[0], 1), S = kiln_tensor_dim(xs[1], 1);
    if (kiln_tensor_dim(xs[1], 0) != N || kiln_tensor_dim(xs[2], 0) != N || kiln_tensor_dim(xs[2], 1) != S)
        return kiln__module_error(m, "query, key and value disagree on batch or key length");
    kiln_tensor *w = kiln_module_get(m, "in_proj_weight"), *b = kiln_module_get(m, "in_proj_bias");
    kiln_tensor *proj[3];
    for (int i = 0; i < 3; i++)
        proj[i] = split_heads(kiln_linear(xs[i], kiln_narrow(w, 0, i * E, E), b ? kiln_narrow(b, 0, i * E, E) : NULL),
                              H);

    if (!proj[0] || !proj[1] || !proj[2])
        return -1;
    kiln_tensor *masks[2] = {kpm, am};
    for (int i = 0; i < 2; i++)
        if (masks[i] && kiln_tensor_dtype(masks[i]) != KILN_BOOL &&
            !kiln_dtype_is_float(kiln_tensor_dtype(masks[i]))) {
            char d[96];
            return kiln__module_error(m, "%s %s: must be bool or floating", i ? "attn_mask" : "key_padding_mask",
                                      kiln__desc_str(masks[i], d, sizeof d));
        }
    /* Masks, all additive in the scores' dtype, broadcast to [N, H, L, S]. */
    kiln_dtype sdt = kiln_tensor_dtype(proj[0]);
    kiln_tensor *mask = NULL;
    if (am) {
        int nd = kiln_tensor_ndim(am);
        bool ok = (nd == 2 && kiln_tensor_dim(am, 0) == L && kiln_tensor_dim(am, 1) == S) ||
                  (nd == 3 && kiln_tensor_dim(am, 0) == N * H && kiln_tensor_dim(am, 1) == L &&
                   kiln_tensor_dim(am, 2) == S);
        if (!ok) {
            char d[96];
            return kiln__module_error(m, "attn_mask %s: expected [%lld, %lld] or [%lld, %lld, %lld]",
                                      kiln__desc_str(am, d, sizeof d), (long long)L, (long long)S,
                                      (long long)(N * H), (long long)L, (long long)S);
        }
        mask = additive_mask(am, sdt);
        if (nd == 3)
            mask = kiln_reshape(mask, KILN_SHAPE(N, H, L, S));
    }
    if (kpm) {
        if (kiln_tensor_ndim(kpm) != (unbatched ? 1 : 2) || kiln_tensor_dim(kpm, -1) != S ||
            (!unbatched && kiln_tensor_dim(kpm, 0) != N)) {
            char d[96];
            return kiln__module_error(m, "key_padding_mask %s: expected [%lld, %lld]", kiln__desc_str(kpm, d, sizeof d),
                                      (long long)N, (long long)S);
        }
        kiln_tensor *pm = kiln_reshape(additive_mask(kpm, sdt), KILN_SHAPE(N, 1, 1, S));
        mask = mask ? kiln_add(mask, pm) : pm;
    }
    kiln_tensor *ctx;
    double p = m->training ? c->dropout : 0;
    /* The per-head products die once merged (no backward reads them): in a scope of their
     * own they are gone before the output projection runs, so a fusing device writes them
     * straight into the merged layout (backends/fused/fused-permute.c). */
    kiln_scope_begin();
    if (p > 0) {
        /* Dropout on the attention weights needs the weights: the unfused path. The
         * scores before the softmax die with this scope (no backward reads them), so a
         * fused group never stores them. */
        int64_t D = E / H;
        kiln_scope_begin();
        kiln_tensor *scores = kiln_mul_scalar(kiln_matmul(proj[0], kiln_transpose(proj[1], -2, -1)), 1.0 / sqrt((double)D));
        if (c->causal) {
            kiln_tensor *ones = kiln_ones(kiln_tensor_device(q), KILN_BOOL, KILN_SHAPE(L, S));
            scores = kiln_masked_fill(scores, kiln_triu(ones, 1), -INFINITY);
        }
        if (mask)
            scores = kiln_add(scores, mask);
        kiln_tensor *weights = kiln__scope_end_keep(kiln_dropout(kiln_softmax(scores, -1), p, true, &m->gen));
        ctx = kiln_matmul(weights, proj[2]);
    } else {
        ctx = kiln_scaled_dot_product_attention(proj[0], proj[1], proj[2], mask, c->causal, 0);
    }
    /* [N, H, L, D] -> [N, L, E] -> out_proj */
    kiln_tensor *merged = kiln__scope_end_keep(kiln_reshape(kiln_transpose(ctx, 1, 2), KILN_SHAPE(N, L, E)));
    kiln_tensor *y = kiln_module_forward(kiln_module_find(m, "out_proj"), merged);
    if (unbatched)
        y = kiln_squeeze(y, 0);
    else if (!c->batch_first)
        y = kiln_transpose(y, 0, 1);
    out[0] = y;
    return y ? 1 : -1;
}

static const kiln_module_class mha_class = {"MultiheadAttention", mha_forward, NULL};
static const kiln__field mha_fields[] = {
    KILN__FIELD(kiln_mha_config, KILN__F_I64, embed_dim),
    KILN__FIELD(kiln_mha_config, KILN__F_I64, num_heads),
    KILN__FIELD(kiln_mha_config, KILN__F_F64, dropout),
    KILN__FIELD(kiln_mha_config, KILN__F_BOOL, bias),
    KILN__FIELD(kiln_mha_config, KILN__F_BOOL, batch_first),
    KILN__FIELD(kiln_mha_config, KILN__F_BOOL, causal),
};

kiln_module *kiln_mha_init(const kiln_mha_config *c, kiln_device *dev, kiln_generator *gen)
{
    KILN__REQUIRE(c && dev, "MultiheadAttention", "config and device are required");
    KILN__REQUIRE(c->embed_dim > 0 && c->num_heads > 0 && c->embed_dim % c->num_heads == 0, "MultiheadAttention",
                  "num_heads (%lld) must divide embed_dim (%lld)", (long long)c->num_heads, (long long)c->embed_dim);
    KILN__REQUIRE(c->dropout >= 0 && c->dropout < 1, "MultiheadAttention", "dropout must be in [0, 1)");
    kiln_generator fb;
    gen = kiln__gen_or_default(gen, &fb);
    kiln_module *m = kiln__module_make(&mha_class, 0, &kiln__layer_mha, c, gen);
    if (!m)
        return NULL;
    int64_t E = c->embed_dim;
    /* PyTorch: xavier_uniform in_proj, zero in_proj bias, out_proj as a Linear with a
     * zero bias. */
    int rc = kiln_module_add_parameter(m, "in_proj_weight",
                                       kiln_keep(kiln_init_xavier_uniform(dev, KILN_SHAPE(3 * E, E), 1.0, gen)));
    if (rc == 0 && c->bias)
        rc = kiln_module_add_parameter(m, "in_proj_bias", kiln_keep(kiln_init_zeros(dev, KILN_SHAPE(3 * E))));
    kiln_linear_config lc = {.in_features = E, .out_features = E, .bias = c->bias};
    if (rc == 0) {
        kiln_module *op = kiln_linear_init(&lc, dev, gen);
        rc = op ? kiln_module_add_child(m, "out_proj", op) : -1;
        if (rc == 0 && c->bias)
            rc = kiln__module_replace(op, "bias", kiln_keep(kiln_init_zeros(dev, KILN_SHAPE(E))));
    }
    if (rc < 0) {
        kiln_module_free(m);
        return NULL;
    }
    return m;
}

/* (query, key, value, key_padding_mask, attn_mask) */
KILN__LAYER_IN(mha, kiln_mha_config, "MultiheadAttention", mha_fields, KILN__NFIELDS(mha_fields), 1, 5)

/* ---------------------------------------------------------- Transformer layers */

static const char *const act_names[] = {"relu", "gelu", NULL};

kiln_transformer_config kiln_transformer_encoder_layer_config_default(void)
{
    return (kiln_transformer_config){.dim_feedforward = 2048, .dropout = 0.1, .activation = KILN_ACT_RELU,
                                     .layer_norm_eps = 1e-5, .bias = true};
}
kiln_transformer_config kiln_transformer_decoder_layer_config_default(void)
{
    return kiln_transformer_encoder_layer_config_default();
}

static kiln_tensor *child(kiln_module *m, const char *name, kiln_tensor *x)
{
    return kiln_module_forward(kiln_module_find(m, name), x);
}

static kiln_tensor *ff_block(kiln_module *m, const kiln_transformer_config *c, kiln_tensor *x)
{
    kiln_scope_begin(); /* the activation before the dropout goes with this stage */
    kiln_tensor *h = child(m, "linear1", x);
    h = c->activation == KILN_ACT_GELU ? kiln_gelu(h, false) : kiln_relu(h);
    h = kiln__scope_end_keep(child(m, "dropout", h));
    return child(m, "dropout2", child(m, "linear2", h));
}

static kiln_tensor *attn_block(kiln_module *m, const char *attn, const char *drop, kiln_tensor *q, kiln_tensor *kv,
                               kiln_tensor *kpm, kiln_tensor *mask)
{
    kiln_tensor *args[5] = {q, kv, kv, kpm, mask}, *y;
    if (kiln_module_forward_n(kiln_module_find(m, attn), 5, args, 1, &y) != 1)
        return NULL;
    return child(m, drop, y);
}

static int encoder_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    const kiln_transformer_config *c = m->config;
    kiln_tensor *x = kiln__in(n_in, in, 0), *mask = kiln__in(n_in, in, 1), *kpm = kiln__in(n_in, in, 2);
    if (kiln__check_input(m, x, 3, 2, "src") < 0)
        return -1;
    kiln_scope_begin();
    if (c->norm_first) {
        kiln_tensor *h = child(m, "norm1", x);
        x = kiln__scope_end_keep(kiln_add(x, attn_block(m, "self_attn", "dropout1", h, h, kpm, mask)));
        kiln_scope_begin();
        x = kiln__scope_end_keep(kiln_add(x, ff_block(m, c, child(m, "norm2", x))));
    } else {
        x = kiln__scope_end_keep(
            child(m, "norm1", kiln_add(x, attn_block(m, "self_attn", "dropout1", x, x, kpm, mask))));
        kiln_scope_begin();
        x = kiln__scope_end_keep(child(m, "norm2", kiln_add(x, ff_block(m, c, x))));
    }
    out[0] = x;
    return x ? 1 : -1;
}

static int decoder_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    const kiln_transformer_config *c = m->config;
    kiln_tensor *x = kiln__in(n_in, in, 0), *mem = kiln__in(n_in, in, 1);
    kiln_tensor *tmask = kiln__in(n_in, in, 2), *mmask = kiln__in(n_in, in, 3);
    kiln_tensor *tkpm = kiln__in(n_in, in, 4), *mkpm = kiln__in(n_in, in, 5);
    if (kiln__check_input(m, x, 3, 2, "tgt") < 0 || kiln__check_input(m, mem, kiln_tensor_ndim(x), -1, "memory") < 0)
        return -1;
    kiln_scope_begin();
    if (c->norm_first) {
        kiln_tensor *h = child(m, "norm1", x);
        x = kiln__scope_end_keep(kiln_add(x, attn_block(m, "self_attn", "dropout1", h, h, tkpm, tmask)));
        kiln_scope_begin();
        x = kiln__scope_end_keep(
            kiln_add(x, attn_block(m, "multihead_attn", "dropout2", child(m, "norm2", x), mem, mkpm, mmask)));
        kiln_scope_begin();
        x = kiln__scope_end_keep(kiln_add(x, ff_block(m, c, child(m, "norm3", x))));
    } else {
        x = kiln__scope_end_keep(
            child(m, "norm1", kiln_add(x, attn_block(m, "self_attn", "dropout1", x, x, tkpm, tmask))));
        kiln_scope_begin();
        x = kiln__scope_end_keep(
            child(m, "norm2", kiln_add(x, attn_block(m, "multihead_attn", "dropout2", x, mem, mkpm, mmask))));
        kiln_scope_begin();
        x = kiln__scope_end_keep(child(m, "norm3", kiln_add(x, ff_block(m, c, x))));
    }
    out[0] = x;
    return x ? 1 : -1;
}

static const kiln_module_class encoder_class = {"TransformerEncoderLayer", encoder_forward, NULL};
static const kiln_module_class decoder_class = {"TransformerDecoderLayer", decoder_forward, NULL};

static const kiln__field transformer_fields[] = {
    KILN__FIELD(kiln_transformer_config, KILN__F_I64, d_model),
    KILN__FIELD(kiln_transformer_config, KILN__F_I64, nhead),
    KILN__FIELD(kiln_transformer_config, KILN__F_I64, dim_feedforward),
    KILN__FIELD(kiln_transformer_config, KILN__F_F64, dropout),
    KILN__FIELD_ENUM(kiln_transformer_config, activation, act_names),
    KILN__FIELD(kiln_transformer_config, KILN__F_F64, layer_norm_eps),
    KILN__FIELD(kiln_transformer_config, KILN__F_BOOL, batch_first),
    KILN__FIELD(kiln_transformer_config, KILN__F_BOOL, norm_first),
    KILN__FIELD(kiln_transformer_config, KILN__F_BOOL, bias),
    KILN__FIELD(kiln_transformer_config, KILN__F_BOOL, causal),
};

static kiln_module *transformer_init(const kiln_module_class *cls, const kiln__layer_type *lt, bool decoder,
                                     const kiln_transformer_config *c, kiln_device *dev, kiln_generator *gen)
{
    const char *tn = lt->name;
    KILN__REQUIRE(c && dev, tn, "config and device are required");
    KILN__REQUIRE(c->d_model > 0 && c->nhead > 0 && c->d_model % c->nhead == 0, tn,
                  "nhead (%lld) must divide d_model (%lld)", (long long)c->nhead, (long long)c->d_model);
    KILN__REQUIRE(c->dim_feedforward > 0, tn, "dim_feedforward must be > 0");
    KILN__REQUIRE(c->dropout >= 0 && c->dropout < 1, tn, "dropout must be in [0, 1)");
    KILN__REQUIRE(c->activation == KILN_ACT_RELU || c->activation == KILN_ACT_GELU, tn,
                  "activation must be \"relu\" or \"gelu\"");
    kiln_generator fb;
    gen = kiln__gen_or_default(gen, &fb);
    kiln_module *m = kiln__module_make(cls, 0, lt, c, gen);
    if (!m)
        return NULL;
    kiln_mha_config ac = {.embed_dim = c->d_model, .num_heads = c->nhead, .dropout = c->dropout,
                          .bias = c->bias, .batch_first = c->batch_first, .causal = c->causal};
    kiln_mha_config cc = ac;
    cc.causal = false;
    kiln_linear_config l1 = {.in_features = c->d_model, .out_features = c->dim_feedforward, .bias = c->bias};
    kiln_linear_config l2 = {.in_features = c->dim_feedforward, .out_features = c->d_model, .bias = c->bias};
    kiln_layer_norm_config nc = {.normalized_shape = {c->d_model}, .ndim = 1, .eps = c->layer_norm_eps,
                                 .elementwise_affine = true, .bias = c->bias};
    kiln_dropout_config dc = {.p = c->dropout};
    /* PyTorch's registration order, so state_dict listings match. */
    int rc = kiln_module_add_child(m, "self_attn", kiln_mha_init(&ac, dev, gen));
    if (rc == 0 && decoder)
        rc = kiln_module_add_child(m, "multihead_attn", kiln_mha_init(&cc, dev, gen));
    if (rc == 0)
        rc = kiln_module_add_child(m, "linear1", kiln_linear_init(&l1, dev, gen));
    if (rc == 0)
        rc = kiln_module_add_child(m, "dropout", kiln_dropout_init(&dc, dev, gen));
    if (rc == 0)
        rc = kiln_module_add_child(m, "linear2", kiln_linear_init(&l2, dev, gen));
    const char *norms[] = {"norm1", "norm2", "norm3"}, *drops[] = {"dropout1", "dropout2", "dropout3"};
    for (int i = 0; rc == 0 && i < (decoder ? 3 : 2); i++)
        rc = kiln_module_add_child(m, norms[i], kiln_layer_norm_init(&nc, dev, gen));
    for (int i = 0; rc == 0 && i < (decoder ? 3 : 2); i++)
        rc = kiln_module_add_child(m, drops[i], kiln_dropout_init(&dc, dev, gen));
    if (rc < 0) {
        kiln_module_free(m);
        return NULL;
    }
    return m;
}

kiln_module *kiln_transformer_encoder_layer_init(const kiln_transformer_config *c, kiln_device *dev,
                                                 kiln_generator *gen)
{
    return transformer_init(&encoder_class, &kiln__layer_transformer_encoder_layer, false, c, dev, gen);
}

kiln_module *kiln_transformer_decoder_layer_init(const kiln_transformer_config *c, kiln_device *dev,
                                                 kiln_generator *gen)
{
    return transformer_init(&decoder_class, &kiln__layer_transformer_decoder_layer, true, c, dev, gen);
}

/* Encoder: (src, src_mask, src_key_padding_mask); decoder: (tgt, memory, tgt_mask,
 * memory_mask, tgt_key_padding_mask, memory_key_padding_mask). */
KILN__LAYER_IN(transformer_encoder_layer, kiln_transformer_config, "TransformerEncoderLayer", transformer_fields,
               KILN__NFIELDS(transformer_fields), 1, 3)
KILN__LAYER_IN(transformer_decoder_layer, kiln_transformer_config, "TransformerDecoderLayer", transformer_fields,
               KILN__NFIELDS(transformer_fields), 2, 6)

/* ---------------------------------------------------------- PositionalEncoding */

kiln_positional_encoding_config kiln_positional_encoding_config_default(void)
{
    return (kiln_positional_encoding_config){.max_len = 5000, .batch_first = true};
}

/* Angles position · base^(-2i/d) for positions [0, len) and i in [0, d/2): [len, d/2]. */
static kiln_tensor *angles(kiln_device *dev, int64_t len, int64_t d, double base)
{
    kiln_tensor *pos = kiln_reshape(kiln_arange(dev, KILN_F32, 0, (double)len, 1), KILN_SHAPE(len, 1));
    kiln_tensor *freq = kiln_exp(kiln_mul_scalar(kiln_arange(dev, KILN_F32, 0, (double)d, 2), -log(base) / (double)d));
    return kiln_mul(pos, freq);
}

static int posenc_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    const kiln_positional_encoding_config *c = m->config;
    kiln_tensor *x = kiln__in(n_in, in, 0);
    if (kiln__check_input(m, x, 3, -1, "input") < 0)
        return -1;
    int64_t L = kiln_tensor_dim(x, c->batch_first ? 1 : 0), D = kiln_tensor_dim(x, 2);
    if (D != c->d_model || L > c->max_len) {
        char d[96];
        return kiln__module_error(m, "input %s: needs d_model = %lld features and at most max_len = %lld positions",
                                  kiln__desc_str(x, d, sizeof d), (long long)c->d_model, (long long)c->max_len);
    }
    kiln_tensor *a = angles(kiln_tensor_device(x), L, D, 10000.0);
    kiln_tensor *sc[2] = {kiln_sin(a), kiln_cos(a)};
    /* Interleave: sin on even features, cos on odd ones. */
    kiln_tensor *pe = kiln_reshape(kiln_stack(sc, 2, -1), KILN_SHAPE(L, D));
    if (!c->batch_first)
        pe = kiln_unsqueeze(pe, 1);
    kiln_tensor *y = kiln_add(x, kiln_cast(pe, kiln_tensor_dtype(x)));
    if (c->dropout > 0 && m->training)
        y = kiln_dropout(y, c->dropout, true, &m->gen);
    out[0] = y;
    return y ? 1 : -1;
}

static const kiln_module_class posenc_class = {"PositionalEncoding", posenc_forward, NULL};
static const kiln__field posenc_fields[] = {
    KILN__FIELD(kiln_positional_encoding_config, KILN__F_I64, d_model),
    KILN__FIELD(kiln_positional_encoding_config, KILN__F_I64, max_len),
    KILN__FIELD(kiln_positional_encoding_config, KILN__F_F64, dropout),
    KILN__FIELD(kiln_positional_encoding_config, KILN__F_BOOL, batch_first),
};

kiln_module *kiln_positional_encoding_init(const kiln_positional_encoding_config *c, kiln_device *dev,
                                           kiln_generator *gen)
{
    KILN__REQUIRE(c && c->d_model > 0 && c->d_model % 2 == 0, "PositionalEncoding", "d_model must be even and > 0");
    KILN__REQUIRE(c->max_len > 0 && c->dropout >= 0 && c->dropout < 1, "PositionalEncoding",
                  "max_len must be > 0 and dropout in [0, 1)");
    kiln_generator fb;
    return kiln__module_make(&posenc_class, 0, &kiln__layer_positional_encoding, c, kiln__gen_or_default(gen, &fb));
}

KILN__LAYER(positional_encoding, kiln_positional_encoding_config, "PositionalEncoding", posenc_fields,
            KILN__NFIELDS(posenc_fields))

/* ------------------------------------------------------------------------ RoPE */

kiln_rotary_config kiln_rotary_config_default(void)
{
    return (kiln_rotary_config){.base = 10000.0};
}

static int rotary_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    const kiln_rotary_config *c = m->config;
    kiln_tensor *x = kiln__in(n_in, in, 0);
    if (!x || kiln_tensor_ndim(x) < 2 || kiln_tensor_dim(x, -1) != c->dim) {
        char d[96];
        return kiln__module_error(m, "input %s: expected [..., L, %lld]", kiln__desc_str(x, d, sizeof d),
                                  (long long)c->dim);
    }
    int64_t L = kiln_tensor_dim(x, -2), half = c->dim / 2;
    kiln_tensor *a = angles(kiln_tensor_device(x), L, c->dim, c->base);
    kiln_tensor *aa[2] = {a, a};
    kiln_tensor *full = kiln_cat(aa, 2, -1); /* [L, dim] */
    kiln_tensor *cs = kiln_cast(kiln_cos(full), kiln_tensor_dtype(x));
    kiln_tensor *sn = kiln_cast(kiln_sin(full), kiln_tensor_dtype(x));
    /* rotate_half(x) = [-x2, x1] */
    kiln_tensor *halves[2] = {kiln_neg(kiln_narrow(x, -1, half, half)), kiln_narrow(x, -1, 0, half)};
    kiln_tensor *rot = kiln_cat(halves, 2, -1);
    out[0] = kiln_add(kiln_mul(x, cs), kiln_mul(rot, sn));
    return out[0] ? 1 : -1;
}

static const kiln_module_class rotary_class = {"RotaryEmbedding", rotary_forward, NULL};
static const kiln__field rotary_fields[] = {
    KILN__FIELD(kiln_rotary_config, KILN__F_I64, dim),
    KILN__FIELD(kiln_rotary_config, KILN__F_F64, base),
};

kiln_module *kiln_rotary_init(const kiln_rotary_config *c, kiln_device *dev, kiln_generator *gen)
{
    KILN__REQUIRE(c && c->dim > 0 && c->dim % 2 == 0, "RotaryEmbedding", "dim must be even and > 0");
    KILN__REQUIRE(c->base > 1, "RotaryEmbedding", "base must be > 1");
    return kiln__module_make(&rotary_class, 0, &kiln__layer_rotary, c, NULL);
}

KILN__LAYER(rotary, kiln_rotary_config, "RotaryEmbedding", rotary_fields, KILN__NFIELDS(rotary_fields))
