/*
 * tests/conformance/conformance.h — the case descriptor shared by the conformance
 * harness (harness.c) and the case tables (cases-*.c).
 *
 * A case names an op family, the inputs it needs (dtype, logical shape, how the values
 * are drawn and which non-contiguous view presents them), a build function that calls
 * the public API on one device, integer/double parameters the build function reads,
 * and the tolerance its outputs must meet against the same case on device "ref".
 * The harness draws every input once on the host, uploads the same bytes to each
 * device, runs the build function, downloads the outputs, checks that the inputs came
 * back untouched, and compares.
 */
#ifndef KILN_CONFORMANCE_H
#define KILN_CONFORMANCE_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln/tensor.h"

#define CONF_MAX_IN 6
#define CONF_MAX_OUT 6

/* How an input's values are drawn. */
typedef enum conf_gen {
    G_UNI = 0,   /* uniform in [lo, hi); integers are floored */
    G_INT,       /* integers in [lo, hi), stored in any dtype */
    G_BOOL,      /* 0/1 with probability 1/2 */
    G_SPECIAL,   /* uniform [lo, hi) mixed with NaN, +-Inf, +-0, huge, tiny, halves */
    G_UIDX,      /* indices in [0, hi), distinct along dim (int)lo of the input */
    G_DISTINCT,  /* distinct values: a permutation of the element count times lo, minus hi */
    G_CAUSAL,    /* bool lower-triangular pattern over the last two dims */
} conf_gen;

/* Which view presents an input to the op (the base tensor is uploaded contiguous). */
typedef enum conf_view {
    V_NONE = 0,
    V_T,        /* base has the last two dims swapped; transpose(-1, -2) */
    V_STEP,     /* base dim 0 is 2n+1; slice(0, 1, end, 2) */
    V_FLIP,     /* flip(dim 0 and the last dim) */
    V_EXPAND,   /* base dim 0 is 1; expand to the shape */
    V_PERM,     /* base has the dims reversed; permute back */
    V_NARROW,   /* base last dim is n+3; narrow(-1, 2, n) */
} conf_view;

typedef struct conf_input {
    int dt;              /* a kiln_dtype, or -1 for the case dtype */
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    conf_gen gen;
    double lo, hi;
    conf_view view;
    bool mutated;        /* written in place by the op on purpose (running stats) */
} conf_input;

typedef enum conf_tol {
    TOL_DEFAULT = 0,     /* chosen from the output dtype: rel for elementwise */
    TOL_EXACT,           /* bit-equal values (NaN agrees with NaN) */
    TOL_REL,             /* |got - ref| <= a * |ref| + b per element */
    TOL_NMSE,            /* sum (got - ref)^2 / sum ref^2 <= a */
} conf_tol;

struct conf_case;
/* Build the op on dev from the prepared inputs; write outputs, return their count or
 * -1 when an op returned NULL (kiln_error() holds why). */
typedef int (*conf_build_fn)(const struct conf_case *c, kiln_device *dev, kiln_tensor **in,
                             kiln_tensor **out);

typedef struct conf_case {
    const char *op;          /* family name: filter key and --list row */
    char label[200];         /* parameters, dtypes and shapes, for messages */
    kiln_dtype dt;           /* the case dtype (inputs with dt -1 take it) */
    int nin;
    conf_input in[CONF_MAX_IN];
    conf_build_fn build;
    int64_t p[16];           /* integer parameters, meaning per build function */
    double d[4];             /* double parameters */
    conf_tol tol;
    double tol_a, tol_b;
    const char *expect_error; /* bad-input case: the build must fail with this in the message */
    bool expect_mismatch;     /* harness self-test: a planted fault the comparison must catch */
} conf_case;

/* Register a case (copied). */
void conf_add(const conf_case *c);
/* The device "ref" and the first target device (NULL when none), for cross-device cases. */
kiln_device *conf_ref_device(void);
kiln_device *conf_other_device(kiln_device *dev);

/* Input shorthands. SHAPE(...) fills ndim and shape. */
#define SHAPE(...) .ndim = (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), .shape = {__VA_ARGS__}

/* A case with op, dtype and build function set and everything else zero. */
conf_case conf_make(const char *op, kiln_dtype dt, conf_build_fn build);
/* Append an input (dt -1 = the case dtype); shape as KILN_SHAPE(...) or 0, NULL. */
void conf_in(conf_case *c, int dt, int ndim, const int64_t *shape, conf_gen gen, double lo, double hi,
             conf_view view);
/* Label "dtype in0 in1 ... extra" from the inputs, then register the case. */
void conf_push(conf_case *c, const char *extra_fmt, ...) __attribute__((format(printf, 2, 3)));

/* Set c->label from a format. */
void conf_label(conf_case *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "f32[5, 7]" style text of an input spec, into buf. */
const char *conf_shape_str(const conf_input *in, char *buf, int len);

/* The case tables. */
void conf_cases_create(void);
void conf_cases_shape(void);
void conf_cases_elementwise(void);
void conf_cases_reduce(void);
void conf_cases_optim(void);
void conf_cases_index(void);
void conf_cases_linalg(void);
void conf_cases_nn(void);
void conf_cases_errors(void);
void conf_cases_threads(void);
void conf_cases_selftest(void);

#endif /* KILN_CONFORMANCE_H */
