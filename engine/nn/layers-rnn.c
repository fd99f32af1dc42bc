/*
 * engine/nn/layers-rnn.c — LSTM and GRU: multi-layer, bidirectional, batch_first,
 * with PyTorch's gate order and parameter names. The input projection of a whole
 * sequence is one matmul; the recurrence is a loop over time steps of small ops,
 * which autodiff records like any other graph.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn-impl.h"

typedef struct rnn_self {
    bool lstm;
} rnn_self;

kiln_rnn_config kiln_lstm_config_default(void)
{
    return (kiln_rnn_config){.num_layers = 1, .bias = true};
}
kiln_rnn_config kiln_gru_config_default(void) { return kiln_lstm_config_default(); }

static kiln_tensor *param(kiln_module *m, const char *kind, int64_t layer, bool reverse)
{
    char name[64];
    snprintf(name, sizeof name, "%s_l%lld%s", kind, (long long)layer, reverse ? "_reverse" : "");
    return kiln_module_get(m, name);
}

static kiln_tensor *step_of(kiln_tensor *seq, int64_t t)
{
    return kiln_squeeze(kiln_narrow(seq, 0, t, 1), 0);
}

/* One direction of one layer over x [L, N, I]: returns [L, N, H] and updates *h, *c. */
static kiln_tensor *run_direction(kiln_module *m, bool lstm, int64_t layer, bool reverse, kiln_tensor *x,
                                  kiln_tensor **h, kiln_tensor **c)
{
    const kiln_rnn_config *cfg = m->config;
    int64_t H = cfg->hidden_size, L = kiln_tensor_dim(x, 0);
    kiln_tensor *wih = param(m, "weight_ih", layer, reverse), *whh = param(m, "weight_hh", layer, reverse);
    kiln_tensor *bih = param(m, "bias_ih", layer, reverse), *bhh = param(m, "bias_hh", layer, reverse);
    kiln_tensor *xi = kiln_linear(x, wih, bih); /* [L, N, G·H] */
    kiln_tensor **outs = calloc((size_t)(L ? L : 1), sizeof *outs);
    if (!outs) {
        kiln__module_error(m, "out of memory");
        return NULL;
    }
    for (int64_t s = 0; s < L; s++) {
        int64_t t = reverse ? L - 1 - s : s;
        kiln_tensor *gi = step_of(xi, t), *gh = kiln_linear(*h, whh, bhh);
        if (lstm) {
            /* gates i, f, g, o */
            kiln_tensor *g = kiln_add(gi, gh);
            kiln_tensor *ig = kiln_sigmoid(kiln_narrow(g, -1, 0, H));
            kiln_tensor *fg = kiln_sigmoid(kiln_narrow(g, -1, H, H));
            kiln_tensor *gg = kiln_tanh(kiln_narrow(g, -1, 2 * H, H));
            kiln_tensor *og = kiln_sigmoid(kiln_narrow(g, -1, 3 * H, H));
            *c = kiln_add(kiln_mul(fg, *c), kiln_mul(ig, gg));
            *h = kiln_mul(og, kiln_tanh(*c));
        } else {
            /* gates r, z, n; the hidden part of n is scaled by r after its bias */
            kiln_tensor *r = kiln_sigmoid(kiln_add(kiln_narrow(gi, -1, 0, H), kiln_narrow(gh, -1, 0, H)));
            kiln_tensor *z = kiln_sigmoid(kiln_add(kiln_narrow(gi, -1, H, H), kiln_narrow(gh, -1, H, H)));
            kiln_tensor *n = kiln_tanh(kiln_add(kiln_narrow(gi, -1, 2 * H, H), kiln_mul(r, kiln_narrow(gh, -1, 2 * H, H))));
            /* h' = (1 - z) n + z h = n + z (h - n) */
            *h = kiln_add(n, kiln_mul(z, kiln_sub(*h, n)));
        }
        outs[t] = *h;
    }
    kiln_tensor *y = L ? kiln_stack(outs, (int)L, 0) : NULL;
    free(outs);
    return y;
}

static int rnn_forward(kiln_module *m, int n_in, kiln_tensor *const *in, int max_out, kiln_tensor **out)
{
    const kiln_rnn_config *cfg = m->config;
    bool lstm = ((const rnn_self *)m->self)->lstm;
    kiln_tensor *x = kiln__in(n_in, in, 0), *h0 = kiln__in(n_in, in, 1), *c0 = lstm ? kiln__in(n_in, in, 2) : NULL;
    if (kiln__check_input(m, x, 3, 2, "input") < 0)
        return -1;
    if (kiln_tensor_dim(x, -1) != cfg->input_size) {
        char d[96];
        return kiln__module_error(m, "input %s: last dim must be input_size = %lld", kiln__desc_str(x, d, sizeof d),
                                  (long long)cfg->input_size);
    }
    bool unbatched = kiln_tensor_ndim(x) == 2;
    if (unbatched)
        x = kiln_unsqueeze(x, 1);
    else if (cfg->batch_first)
        x = kiln_transpose(x, 0, 1);
    int64_t N = kiln_tensor_dim(x, 1), H = cfg->hidden_size, dirs = cfg->bidirectional ? 2 : 1;
    int64_t S = cfg->num_layers * dirs;
    kiln_tensor *states[2] = {h0, c0};
    for (int i = 0; i < 2; i++) {
        if (!states[i]) {
            states[i] = kiln_zeros(kiln_tensor_device(x), kiln_tensor_dtype(x), KILN_SHAPE(S, N, H));
            continue;
        }
        if (unbatched)
            states[i] = kiln_unsqueeze(states[i], 1);
        if (kiln_tensor_ndim(states[i]) != 3 || kiln_tensor_dim(states[i], 0) != S ||
            kiln_tensor_dim(states[i], 1) != N || kiln_tensor_dim(states[i], 2) != H) {
            char d[96];
            return kiln__module_error(m, "%s %s: expected [%lld, %lld, %lld]", i ? "c0" : "h0",
                                      kiln__desc_str(states[i], d, sizeof d), (long long)S, (long long)N, (long long)H);
        }
    }
    kiln_tensor *hn[64], *cn[64];
    if (S > 64)
        return kiln__module_error(m, "at most 64 layers × directions are supported");
    kiln_tensor *layer_in = x;
    for (int64_t l = 0; l < cfg->num_layers; l++) {
        kiln_tensor *dir_out[2];
        for (int64_t d = 0; d < dirs; d++) {
            int64_t k = l * dirs + d;
            kiln_tensor *h = step_of(states[0], k), *c = lstm ? step_of(states[1], k) : NULL;
            dir_out[d] = run_direction(m, lstm, l, d == 1, layer_in, &h, &c);
            if (!dir_out[d])
                return -1;
            hn[k] = h;
            cn[k] = c;
        }
        layer_in = dirs == 2 ? kiln_cat(dir_out, 2, -1) : dir_out[0];
        if (cfg->dropout > 0 && m->training && l + 1 < cfg->num_layers)
            layer_in = kiln_dropout(layer_in, cfg->dropout, true, &m->gen);
    }
    kiln_tensor *y = layer_in, *h_n = kiln_stack(hn, (int)S, 0), *c_n = lstm ? kiln_stack(cn, (int)S, 0) : NULL;
    if (unbatched) {
        y = kiln_squeeze(y, 1);
        h_n = kiln_squeeze(h_n, 1);
        c_n = c_n ? kiln_squeeze(c_n, 1) : NULL;
    } else if (cfg->batch_first) {
        y = kiln_transpose(y, 0, 1);
    }
    kiln_tensor *res[3] = {y, h_n, c_n};
    int n = lstm ? 3 : 2;
    if (n > max_out)
        n = max_out;
    for (int i = 0; i < n; i++)
        out[i] = res[i];
    return n;
}

static const kiln_module_class lstm_class = {"LSTM", rnn_forward, free};
static const kiln_module_class gru_class = {"GRU", rnn_forward, free};

static const kiln__field rnn_fields[] = {
    KILN__FIELD(kiln_rnn_config, KILN__F_I64, input_size),
    KILN__FIELD(kiln_rnn_config, KILN__F_I64, hidden_size),
    KILN__FIELD(kiln_rnn_config, KILN__F_I64, num_layers),
    KILN__FIELD(kiln_rnn_config, KILN__F_BOOL, bias),
    KILN__FIELD(kiln_rnn_config, KILN__F_BOOL, batch_first),
    KILN__FIELD(kiln_rnn_config, KILN__F_F64, dropout),
    KILN__FIELD(kiln_rnn_config, KILN__F_BOOL, bidirectional),
};

static kiln_module *rnn_init(const kiln_module_class *cls, const kiln__layer_type *lt, bool lstm,
                             const kiln_rnn_config *c, kiln_device *dev, kiln_generator *gen)
{
    const char *tn = lt->name;
    KILN__REQUIRE(c && dev, tn, "config and device are required");
    KILN__REQUIRE(c->input_size > 0 && c->hidden_size > 0, tn, "input_size and hidden_size must be > 0");
    KILN__REQUIRE(c->num_layers > 0 && c->num_layers <= 32, tn, "num_layers must be in [1, 32]");
    KILN__REQUIRE(c->dropout >= 0 && c->dropout < 1, tn, "dropout must be in [0, 1)");
    kiln_generator fb;
    gen = kiln__gen_or_default(gen, &fb);
    kiln_module *m = kiln__module_make(cls, sizeof(rnn_self), lt, c, gen);
    if (!m)
        return NULL;
    ((rnn_self *)m->self)->lstm = lstm;
    int64_t G = lstm ? 4 : 3, H = c->hidden_size, dirs = c->bidirectional ? 2 : 1;
    double k = 1.0 / sqrt((double)H);
    int rc = 0;
    for (int64_t l = 0; rc == 0 && l < c->num_layers; l++)
        for (int64_t d = 0; rc == 0 && d < dirs; d++) {
            int64_t in = l == 0 ? c->input_size : H * dirs;
            const char *suf = d ? "_reverse" : "";
            char name[64];
            snprintf(name, sizeof name, "weight_ih_l%lld%s", (long long)l, suf);
            rc = kiln_module_add_parameter(m, name, kiln__uniform(dev, KILN_SHAPE(G * H, in), -k, k, gen));
            snprintf(name, sizeof name, "weight_hh_l%lld%s", (long long)l, suf);
            if (rc == 0)
                rc = kiln_module_add_parameter(m, name, kiln__uniform(dev, KILN_SHAPE(G * H, H), -k, k, gen));
            if (c->bias) {
                snprintf(name, sizeof name, "bias_ih_l%lld%s", (long long)l, suf);
                if (rc == 0)
                    rc = kiln_module_add_parameter(m, name, kiln__uniform(dev, KILN_SHAPE(G * H), -k, k, gen));
                snprintf(name, sizeof name, "bias_hh_l%lld%s", (long long)l, suf);
                if (rc == 0)
                    rc = kiln_module_add_parameter(m, name, kiln__uniform(dev, KILN_SHAPE(G * H), -k, k, gen));
            }
        }
    if (rc < 0) {
        kiln_module_free(m);
        return NULL;
    }
    return m;
}

kiln_module *kiln_lstm_init(const kiln_rnn_config *c, kiln_device *dev, kiln_generator *gen)
{
    return rnn_init(&lstm_class, &kiln__layer_lstm, true, c, dev, gen);
}

kiln_module *kiln_gru_init(const kiln_rnn_config *c, kiln_device *dev, kiln_generator *gen)
{
    return rnn_init(&gru_class, &kiln__layer_gru, false, c, dev, gen);
}

/* (x, h0, c0) and (x, h0) */
KILN__LAYER_IN(lstm, kiln_rnn_config, "LSTM", rnn_fields, KILN__NFIELDS(rnn_fields), 1, 3)
KILN__LAYER_IN(gru, kiln_rnn_config, "GRU", rnn_fields, KILN__NFIELDS(rnn_fields), 1, 2)
