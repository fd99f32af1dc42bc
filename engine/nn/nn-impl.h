/*
 * engine/nn/nn-impl.h — the module struct and what the nn files share: layer type
 * descriptors (config field tables that drive JSON), initializers and small helpers.
 * Nothing here is public; kiln/nn.h is the contract.
 */
#ifndef KILN_NN_IMPL_H
#define KILN_NN_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/autodiff.h"
#include "kiln/nn.h"
#include "error-impl.h"
#include <stdio.h>

typedef struct kiln__entry {
    char *name;
    kiln_tensor *t;
    bool buffer;
    bool frozen;
} kiln__entry;

typedef struct kiln__child {
    char *name;
    kiln_module *m;
} kiln__child;

struct kiln__layer_type;

struct kiln_module {
    const kiln_module_class *cls;
    void *self;
    char *name;             /* local name in the parent; NULL for a root */
    kiln_module *parent;
    bool training;
    kiln__entry *entries;
    int nentries, capentries;
    kiln__child *children;
    int nchildren, capchildren;
    const struct kiln__layer_type *ltype; /* layers built from a config */
    void *config;           /* a copy of that config (ltype->config_size bytes) */
    kiln_generator gen;     /* for dropout and other random forward work */
    char *path;             /* cache for kiln_module_path */
    char **names;           /* cache for the listing calls */
    int nnames;
};

/* ------------------------------------------------------------ config field tables */

typedef enum kiln__field_kind {
    KILN__F_I64,    /* int64_t */
    KILN__F_F64,    /* double */
    KILN__F_BOOL,   /* bool */
    KILN__F_ENUM,   /* int, written as one of names[] */
    KILN__F_I64N,   /* int64_t[n]; JSON gives one integer (repeated) or n of them */
    KILN__F_SHAPE,  /* int64_t[n] plus an int count at aux; JSON gives 1..n integers */
} kiln__field_kind;

typedef struct kiln__field {
    const char *name;
    kiln__field_kind kind;
    size_t off;
    int n;                     /* I64N / SHAPE: capacity */
    size_t aux;                /* SHAPE: offset of the int count */
    const char *const *names;  /* ENUM: NULL-terminated */
} kiln__field;

typedef struct kiln__layer_type {
    const char *name;          /* "Linear" */
    size_t config_size;
    const kiln__field *fields;
    int nfields;
    void (*defaults)(void *config);
    kiln_module *(*init)(const void *config, kiln_device *dev, kiln_generator *gen);
    /* Inputs forward_n takes (the optional ones included in max_in): more is an error
     * rather than inputs silently left unused. */
    int min_in, max_in;
} kiln__layer_type;

/* One descriptor per layer, defined by KILN__LAYER in the layer's file. */
#define KILN__LAYER_LIST(X)                                                                       \
    X(linear) X(conv1d) X(conv2d) X(conv_transpose1d) X(conv_transpose2d) X(batch_norm1d)          \
    X(batch_norm2d) X(layer_norm) X(rms_norm) X(group_norm) X(embedding) X(dropout) X(max_pool1d)   \
    X(max_pool2d) X(avg_pool1d) X(avg_pool2d) X(adaptive_avg_pool1d) X(adaptive_avg_pool2d)         \
    X(flatten) X(relu) X(silu) X(sigmoid) X(tanh) X(identity) X(leaky_relu) X(gelu) X(softmax)      \
    X(prelu) X(swiglu) X(mha) X(transformer_encoder_layer) X(transformer_decoder_layer)             \
    X(positional_encoding) X(rotary) X(lstm) X(gru)
#define KILN__LAYER_EXTERN(L) extern const kiln__layer_type kiln__layer_##L;
KILN__LAYER_LIST(KILN__LAYER_EXTERN)

/* Defines a layer's descriptor and its public JSON functions, given its config type T,
 * its PyTorch class name, its field table and the inputs it takes (KILN__LAYER: exactly
 * one). kiln_L_config_default and kiln_L_init are written by hand in the layer's file,
 * before this. */
#define KILN__LAYER(L, T, tname, fields, nfields) KILN__LAYER_IN(L, T, tname, fields, nfields, 1, 1)
/* The macro keeps its hand-made alignment. */
/* clang-format off */
#define KILN__LAYER_IN(L, T, tname, fields, nfields, min_in, max_in)                            \
    static void L##_defaults_(void *c) { *(T *)c = kiln_##L##_config_default(); }                \
    static kiln_module *L##_init_(const void *c, kiln_device *d, kiln_generator *g)              \
    {                                                                                           \
        return kiln_##L##_init((const T *)c, d, g);                                             \
    }                                                                                           \
    const kiln__layer_type kiln__layer_##L = {tname, sizeof(T), fields, nfields, L##_defaults_,  \
                                              L##_init_, min_in, max_in};                       \
    char *kiln_##L##_config_to_json(const T *c) { return kiln__config_to_json(&kiln__layer_##L, c); } \
    int kiln_##L##_config_from_json(const char *j, T *c)                                        \
    {                                                                                           \
        return kiln__config_from_json(&kiln__layer_##L, j, c);                                  \
    }
/* clang-format on */
#define KILN__NFIELDS(f) ((int)(sizeof(f) / sizeof((f)[0])))
#define KILN__FIELD(T, kind, name) {#name, kind, offsetof(T, name), 0, 0, NULL}
#define KILN__FIELD_N(T, name, n) {#name, KILN__F_I64N, offsetof(T, name), n, 0, NULL}
#define KILN__FIELD_ENUM(T, name, names) {#name, KILN__F_ENUM, offsetof(T, name), 0, 0, names}
#define KILN__FIELD_SHAPE(T, name, n, count) {#name, KILN__F_SHAPE, offsetof(T, name), n, offsetof(T, count), NULL}

/* A config check in init: error "Layer config: ..." and NULL when cond fails. */
#define KILN__REQUIRE(cond, tname, ...)                                                         \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            char why_[256];                                                                     \
            snprintf(why_, sizeof why_, __VA_ARGS__);                                           \
            kiln__error_set("%s config: %s", tname, why_);                                      \
            return NULL;                                                                        \
        }                                                                                       \
    } while (0)

/** The layer type called name, or NULL. */
const kiln__layer_type *kiln__layer_find(const char *name);
/** Every registered layer type, for listing; returns the count. */
int kiln__layer_types(const kiln__layer_type *const **out);

/** Fill config (defaults first) from a cJSON object; unknown keys and bad values are
 *  errors naming the layer and the key. obj may be NULL (defaults only). */
int kiln__config_from_cjson(const kiln__layer_type *lt, const void *obj, void *config);
void *kiln__config_to_cjson(const kiln__layer_type *lt, const void *config);
int kiln__config_from_json(const kiln__layer_type *lt, const char *json, void *config);
char *kiln__config_to_json(const kiln__layer_type *lt, const void *config);

/** Record lt and a copy of config in m (for kiln_module_config_json). */
int kiln__module_set_config(kiln_module *m, const kiln__layer_type *lt, const void *config);
/** A new module of class cls for layer lt with a zeroed self of self_size bytes. */
kiln_module *kiln__module_make(const kiln_module_class *cls, size_t self_size, const kiln__layer_type *lt,
                               const void *config, kiln_generator *gen);

/** Replace m's own parameter or buffer name with t (taking the reference). */
int kiln__module_replace(kiln_module *m, const char *name, kiln_tensor *t);
/** "Linear 'path'" prefix for messages, written into buf. */
const char *kiln__module_label(kiln_module *m, char *buf, size_t len);
/** Set an error prefixed with the module's label; returns -1. */
int kiln__module_error(kiln_module *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** kiln__module_error for the failure of an op inside m, its message quoted in fmt: the op's
 *  code (kiln_error_code) stays with the message; returns -1. */
int kiln__module_restate(kiln_module *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** Check that x has ndim dims (any of ndim_a, ndim_b when ndim_b >= 0). */
int kiln__check_input(kiln_module *m, kiln_tensor *x, int ndim_a, int ndim_b, const char *what);
/** Forward of a one-input, one-output layer: checks the input and calls fn. */
typedef kiln_tensor *(*kiln__forward1_fn)(kiln_module *m, kiln_tensor *x);
int kiln__forward1(kiln_module *m, int n_in, kiln_tensor *const *in, kiln_tensor **out, kiln__forward1_fn fn);
/** "1 input" or "1 to 5 inputs": a layer type's arity for messages, written into buf. */
const char *kiln__arity_str(const kiln__layer_type *lt, char *buf, size_t len);
/** Input i when given, else NULL. */
static inline kiln_tensor *kiln__in(int n_in, kiln_tensor *const *in, int i) { return i < n_in ? in[i] : NULL; }
/** Describe a tensor for messages into buf. */
const char *kiln__desc_str(const kiln_tensor *t, char *buf, size_t len);
/** A view of x that the current scope owns: identity layers return it. */
kiln_tensor *kiln__identity(kiln_tensor *x);

/* -------------------------------------------------------------- initializers (init.c) */

/** fan_in, fan_out of a weight shaped as PyTorch computes them ([out, in, k...]). */
void kiln__fans(int ndim, const int64_t *shape, double *fan_in, double *fan_out);
/** A parameter tensor drawn uniform(lo, hi) or normal(mean, std), f32. */
kiln_tensor *kiln__uniform(kiln_device *dev, int ndim, const int64_t *shape, double lo, double hi,
                           kiln_generator *gen);
/** PyTorch's default weight init for Linear/Conv: kaiming_uniform(a = sqrt(5)), which
 *  is uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)); the bias uses the same bound. */
kiln_tensor *kiln__default_weight(kiln_device *dev, int ndim, const int64_t *shape, kiln_generator *gen);
kiln_tensor *kiln__default_bias(kiln_device *dev, int64_t n, double fan_in, kiln_generator *gen);

/** A generator for a module: gen, or a fixed seed 0 one when gen is NULL. */
kiln_generator *kiln__gen_or_default(kiln_generator *gen, kiln_generator *fallback);

/* module.c's walk, shared with module-state.c: depth-first over the entries of m and its
 * children, calling fn with each entry's full dotted name; stops at the first nonzero. */
typedef int (*kiln__entry_fn)(void *ud, const char *name, kiln__entry *e);
int kiln__module_walk_all(kiln_module *m, kiln__entry_fn fn, void *ud);
/* Put t (a reference the call takes) in e's slot, keeping the slot's role: parameters stay
 * trainable unless frozen. 0, or -1 with the error set. */
int kiln__module_replace_entry(kiln__entry *e, kiln_tensor *t);

#endif /* KILN_NN_IMPL_H */
