/*
 * tests/remote/test_remote_client.c — the remote backend against a real kilnd (suite 'remote').
 *
 *     test_remote_client KILND ops|autodiff|errors|threads
 *
 * ops: each case builds its inputs from the same host data on "cpu" and on
 * remote://127.0.0.1:PORT/cpu and runs the same engine calls — elementwise with broadcasts and
 * non-contiguous views, matmul, reductions, sort, convolution and pooling, indexing, softmax and
 * layer norm, random numbers, padding, casts — and the results must be bit-identical: the server
 * runs the same cpu kernels on the same inputs.
 * autodiff: a two-layer network's loss and every gradient, local against remote.
 * errors: a refused connection, an unknown device, missing and wrong bearer tokens, an allocation
 * past the session's limit refused at once, an error of a pipelined op reported by the next sync
 * (naming the op), the session going on after it, and kilnd killed mid-session:
 * kiln_device_lost names the server at once, later calls fail with a message, nothing hangs.
 * threads: two threads on one remote device, each on its own tensors.
 */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"
#include "test_remote_client_daemon.h"

static const char *g_kilnd;
static int g_failed;

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                            \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fprintf(stderr, "\n");                                                                                     \
            g_failed++;                                                                                                \
        }                                                                                                              \
    } while (0)

/* ---- inputs from host data -------------------------------------------------------------------- */

static uint64_t g_seed;

static float next_val(void)
{
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((int64_t)(g_seed >> 40) % 2000) / 500.0f - 2.0f; /* [-2, 2) in steps of 1/500 */
}

/* An f32 tensor of the given shape with values from the case's stream. */
static kiln_tensor *T(kiln_device *dev, int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++)
        v[i] = next_val();
    kiln_tensor *t = kiln_from_data(dev, KILN_F32, ndim, shape, v, (size_t)n * sizeof *v);
    free(v);
    return t;
}

static kiln_tensor *I64(kiln_device *dev, int ndim, const int64_t *shape, const int64_t *vals)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return kiln_from_data(dev, KILN_I64, ndim, shape, vals, (size_t)n * sizeof *vals);
}

/* ---- comparing ---------------------------------------------------------------------------------- */

/* Both tensors' dtype, shape and bytes agree. */
static bool same(const char *what, kiln_tensor *a, kiln_tensor *b)
{
    if (!a || !b) {
        CHECK(a && b, "%s: %s result missing: %s", what, a ? "remote" : "local", kiln_error());
        return false;
    }
    if (kiln_tensor_dtype(a) != kiln_tensor_dtype(b) || kiln_tensor_ndim(a) != kiln_tensor_ndim(b) ||
        kiln_tensor_numel(a) != kiln_tensor_numel(b)) {
        CHECK(false, "%s: dtype or shape differ", what);
        return false;
    }
    for (int i = 0; i < kiln_tensor_ndim(a); i++)
        if (kiln_tensor_dim(a, i) != kiln_tensor_dim(b, i)) {
            CHECK(false, "%s: dim %d differs", what, i);
            return false;
        }
    size_t nb = (size_t)kiln_tensor_numel(a) * kiln_dtype_size(kiln_tensor_dtype(a));
    uint8_t *x = malloc(nb ? nb : 1), *y = malloc(nb ? nb : 1);
    int ra = kiln_to_data(a, x, nb);
    int rb = kiln_to_data(b, y, nb);
    bool ok = ra == 0 && rb == 0 && memcmp(x, y, nb) == 0;
    if (ra || rb)
        CHECK(false, "%s: reading back failed: %s", what, kiln_error());
    else if (!ok) {
        size_t k = 0;
        while (k < nb && x[k] == y[k])
            k++;
        CHECK(false, "%s: bytes differ from offset %zu of %zu", what, k, nb);
    }
    free(x);
    free(y);
    return ok;
}

typedef kiln_tensor *(*case_fn)(kiln_device *dev);

/* Runs fn on both devices from the same inputs and compares. */
static void run_case(const char *name, case_fn fn, kiln_device *local, kiln_device *remote)
{
    kiln_scope_begin();
    g_seed = 12345;
    kiln_tensor *a = fn(local);
    g_seed = 12345;
    kiln_tensor *b = fn(remote);
    if (kiln_tensor_device(b) != remote && b)
        CHECK(false, "%s: the remote result lives on %s", name, kiln_device_name(kiln_tensor_device(b)));
    bool ok = same(name, a, b);
    kiln_scope_end();
    printf("%-28s %s\n", name, ok ? "ok" : "FAIL");
}

/* ---- cases ---------------------------------------------------------------------------------------- */

static kiln_tensor *c_add_broadcast(kiln_device *d)
{
    return kiln_add(T(d, KILN_SHAPE(3, 4)), T(d, KILN_SHAPE(4)));
}

static kiln_tensor *c_mul_transposed(kiln_device *d)
{
    return kiln_mul(kiln_transpose(T(d, KILN_SHAPE(4, 3)), 0, 1), T(d, KILN_SHAPE(3, 4)));
}

static kiln_tensor *c_sub_strided(kiln_device *d)
{
    kiln_tensor *a = kiln_slice(T(d, KILN_SHAPE(6, 8)), 1, 1, 8, 2); /* [6, 4], step 2, offset 1 */
    kiln_tensor *b = kiln_flip(T(d, KILN_SHAPE(6, 4)), KILN_DIMS(0));
    return kiln_sub(a, b);
}

static kiln_tensor *c_div_expand(kiln_device *d)
{
    kiln_tensor *b = kiln_add_scalar(kiln_abs(T(d, KILN_SHAPE(1, 3, 1))), 0.5);
    return kiln_div(T(d, KILN_SHAPE(2, 3, 4)), kiln_expand(b, KILN_SHAPE(2, 3, 4)));
}

static kiln_tensor *c_unary_chain(kiln_device *d)
{
    kiln_tensor *a = T(d, KILN_SHAPE(5, 7));
    return kiln_add(kiln_gelu(kiln_tanh(kiln_exp(a)), false), kiln_sigmoid(kiln_sqrt(kiln_abs(a))));
}

static kiln_tensor *c_where(kiln_device *d)
{
    kiln_tensor *a = T(d, KILN_SHAPE(4, 5)), *b = T(d, KILN_SHAPE(5));
    return kiln_where(kiln_gt(a, b), a, kiln_mul_scalar(b, 3.0));
}

static kiln_tensor *c_matmul(kiln_device *d)
{
    return kiln_matmul(T(d, KILN_SHAPE(2, 3, 5)), kiln_transpose(T(d, KILN_SHAPE(2, 4, 5)), 1, 2));
}

static kiln_tensor *c_linear_f64(kiln_device *d)
{
    kiln_tensor *x = kiln_cast(T(d, KILN_SHAPE(6, 9)), KILN_F64);
    kiln_tensor *w = kiln_cast(T(d, KILN_SHAPE(4, 9)), KILN_F64);
    kiln_tensor *b = kiln_cast(T(d, KILN_SHAPE(4)), KILN_F64);
    return kiln_linear(x, w, b);
}

static kiln_tensor *c_reductions(kiln_device *d)
{
    kiln_tensor *a = T(d, KILN_SHAPE(3, 4, 5));
    kiln_tensor *parts[] = {
        kiln_reshape(kiln_sum(a, KILN_DIMS(0, 2), true), KILN_SHAPE(-1)),
        kiln_reshape(kiln_mean(a, KILN_DIMS(1), false), KILN_SHAPE(-1)),
        kiln_reshape(kiln_max(a, KILN_DIMS(2), false), KILN_SHAPE(-1)),
        kiln_reshape(kiln_var(a, KILN_DIMS(0), 1.0, false), KILN_SHAPE(-1)),
        kiln_reshape(kiln_logsumexp(a, KILN_DIMS(2), false), KILN_SHAPE(-1)),
        kiln_reshape(kiln_cast(kiln_argmax(a, 1, false), KILN_F32), KILN_SHAPE(-1)),
        kiln_reshape(kiln_cumsum(a, 2), KILN_SHAPE(-1)),
    };
    return kiln_cat(parts, 7, 0);
}

static kiln_tensor *c_sort(kiln_device *d)
{
    kiln_tensor *v = NULL, *i = NULL;
    kiln_sort(T(d, KILN_SHAPE(4, 9)), 1, true, &v, &i);
    return kiln_add(kiln_cast(i, KILN_F32), v);
}

static kiln_tensor *c_conv(kiln_device *d)
{
    kiln_conv_opts o = {.stride = {2, 2}, .padding = {1, 1}};
    kiln_tensor *y = kiln_conv2d(T(d, KILN_SHAPE(2, 3, 9, 9)), T(d, KILN_SHAPE(4, 3, 3, 3)), T(d, KILN_SHAPE(4)), &o);
    kiln_conv_opts t = {.stride = {2, 2}};
    kiln_tensor *z = kiln_conv_transpose2d(y, T(d, KILN_SHAPE(4, 2, 2, 2)), NULL, &t); /* conv_backward_input */
    return kiln_sum(z, KILN_DIMS(1), false);
}

static kiln_tensor *c_pool(kiln_device *d)
{
    kiln_tensor *x = T(d, KILN_SHAPE(2, 3, 8, 8)), *idx = NULL;
    kiln_pool_opts mp = {.kernel = {2, 2}};
    kiln_tensor *m = kiln_max_pool2d(x, &mp, &idx);
    kiln_pool_opts ap = {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .count_include_pad = true};
    kiln_tensor *a = kiln_avg_pool2d(x, &ap);
    kiln_tensor *parts[] = {kiln_reshape(m, KILN_SHAPE(-1)), kiln_reshape(kiln_cast(idx, KILN_F32), KILN_SHAPE(-1)),
                            kiln_reshape(a, KILN_SHAPE(-1)),
                            kiln_reshape(kiln_adaptive_avg_pool2d(x, 3, 3), KILN_SHAPE(-1))};
    return kiln_cat(parts, 4, 0);
}

static kiln_tensor *c_indexing(kiln_device *d)
{
    kiln_tensor *a = T(d, KILN_SHAPE(5, 6));
    static const int64_t gi[] = {0, 5, 2, 2, 1, 4, 3, 0, 5, 1}, si[] = {4, 0, 2, 2};
    kiln_tensor *g = kiln_gather(a, 1, I64(d, KILN_SHAPE(5, 2), gi));
    kiln_tensor *s = kiln_index_select(a, 0, I64(d, KILN_SHAPE(4), si));
    kiln_tensor *sa = kiln_scatter_add(a, 0, I64(d, KILN_SHAPE(1, 4), si), T(d, KILN_SHAPE(1, 4)));
    kiln_tensor *e = kiln_embedding(T(d, KILN_SHAPE(6, 3)), I64(d, KILN_SHAPE(2, 2), si));
    kiln_tensor *parts[] = {kiln_reshape(g, KILN_SHAPE(-1)), kiln_reshape(s, KILN_SHAPE(-1)),
                            kiln_reshape(sa, KILN_SHAPE(-1)), kiln_reshape(e, KILN_SHAPE(-1))};
    return kiln_cat(parts, 4, 0);
}

static kiln_tensor *c_softmax_norm(kiln_device *d)
{
    kiln_tensor *a = T(d, KILN_SHAPE(4, 10));
    kiln_tensor *parts[] = {kiln_softmax(a, 1), kiln_log_softmax(kiln_transpose(a, 0, 1), 0),
                            kiln_layer_norm(a, 1, T(d, KILN_SHAPE(10)), T(d, KILN_SHAPE(10)), 1e-5)};
    return kiln_cat((kiln_tensor *[]){kiln_reshape(parts[0], KILN_SHAPE(-1)), kiln_reshape(parts[1], KILN_SHAPE(-1)),
                                      kiln_reshape(parts[2], KILN_SHAPE(-1))},
                    3, 0);
}

static kiln_tensor *c_random(kiln_device *d)
{
    kiln_generator g = kiln_generator_make(7);
    kiln_tensor *u = kiln_rand_uniform(d, KILN_F32, KILN_SHAPE(64), -1.0, 2.0, &g);
    kiln_tensor *n = kiln_rand_normal(d, KILN_F32, KILN_SHAPE(64), 0.5, 2.0, &g);
    kiln_tensor *p = kiln_dropout(kiln_ones(d, KILN_F32, KILN_SHAPE(64)), 0.3, true, &g);
    kiln_tensor *r = kiln_cast(kiln_rand_int(d, KILN_I64, KILN_SHAPE(64), -5, 9, &g), KILN_F32);
    return kiln_cat((kiln_tensor *[]){u, n, p, r}, 4, 0);
}

static kiln_tensor *c_pad_interp(kiln_device *d)
{
    kiln_tensor *x = T(d, KILN_SHAPE(1, 2, 4, 5));
    kiln_tensor *p = kiln_pad(x, 4, (const int64_t[]){1, 2, 2, 1}, KILN_PAD_REFLECT, 0.0);
    kiln_tensor *q = kiln_pad(x, 2, (const int64_t[]){3, 0}, KILN_PAD_CONSTANT, -1.5);
    kiln_tensor *i = kiln_interpolate(x, 7, 9, KILN_INTERP_BILINEAR, false);
    return kiln_cat((kiln_tensor *[]){kiln_reshape(p, KILN_SHAPE(-1)), kiln_reshape(q, KILN_SHAPE(-1)),
                                      kiln_reshape(i, KILN_SHAPE(-1))},
                    3, 0);
}

static kiln_tensor *c_ints_bools(kiln_device *d)
{
    kiln_tensor *a = kiln_arange(d, KILN_I64, -7, 17, 1);
    kiln_tensor *r = kiln_remainder(a, kiln_full(d, KILN_I64, KILN_SHAPE(1), 5));
    kiln_tensor *m = kiln_cast(kiln_any(kiln_gt(kiln_reshape(r, KILN_SHAPE(4, 6)), kiln_full(d, KILN_I64, KILN_SHAPE(1), 3)),
                                        KILN_DIMS(1), false),
                               KILN_I64);
    return kiln_cat((kiln_tensor *[]){r, m}, 2, 0);
}

static kiln_tensor *c_assign_views(kiln_device *d)
{
    /* copies into non-contiguous outputs (slice_assign, cat along an inner dim) */
    kiln_tensor *a = T(d, KILN_SHAPE(4, 6));
    kiln_tensor *s = kiln_slice_assign(a, 1, 0, 6, 2, T(d, KILN_SHAPE(4, 3)));
    return kiln_cat((kiln_tensor *[]){s, kiln_permute(T(d, KILN_SHAPE(2, 4)), 2, (const int[]){1, 0})}, 2, 1);
}

static kiln_tensor *c_large(kiln_device *d)
{
    /* a buffer spread over several batches: 600k floats up, a matmul, the result down */
    kiln_tensor *a = T(d, KILN_SHAPE(600, 1000));
    return kiln_sum(kiln_mul_scalar(a, 0.5), KILN_DIMS(1), false);
}

static int test_ops(void)
{
    test_daemon dm;
    if (test_daemon_start(&dm, g_kilnd, NULL, NULL) != 0)
        return 1;
    kiln_device *local = kiln_device_open("cpu");
    kiln_device *remote = kiln_device_open(dm.spec);
    CHECK(remote, "open %s: %s", dm.spec, kiln_error());
    if (remote) {
        CHECK(strcmp(kiln_device_name(remote), dm.spec) == 0, "name %s", kiln_device_name(remote));
        struct { const char *name; case_fn fn; } cases[] = {
            {"add_broadcast", c_add_broadcast}, {"mul_transposed", c_mul_transposed},
            {"sub_strided_flipped", c_sub_strided}, {"div_expand", c_div_expand},
            {"unary_chain", c_unary_chain},     {"where_compare", c_where},
            {"matmul_batched", c_matmul},       {"linear_f64", c_linear_f64},
            {"reductions", c_reductions},       {"sort", c_sort},
            {"conv_and_transposed", c_conv},    {"pooling", c_pool},
            {"indexing", c_indexing},           {"softmax_layer_norm", c_softmax_norm},
            {"random", c_random},               {"pad_interpolate", c_pad_interp},
            {"ints_bools", c_ints_bools},       {"assign_views", c_assign_views},
            {"large_upload", c_large},
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            run_case(cases[i].name, cases[i].fn, local, remote);
        CHECK(kiln_device_sync(remote) == 0, "sync: %s", kiln_error());
        kiln_device_close(remote);
    }
    kiln_device_close(local);
    test_daemon_stop(&dm);
    return g_failed ? 1 : 0;
}

/* ---- autodiff ------------------------------------------------------------------------------------- */

static int test_autodiff(void)
{
    test_daemon dm;
    if (test_daemon_start(&dm, g_kilnd, NULL, NULL) != 0)
        return 1;
    kiln_device *devs[2] = {kiln_device_open("cpu"), kiln_device_open(dm.spec)};
    CHECK(devs[1], "open: %s", kiln_error());
    kiln_tensor *res[2][5] = {{0}};
    for (int k = 0; k < 2 && devs[k]; k++) {
        kiln_scope_begin();
        g_seed = 99;
        kiln_device *d = devs[k];
        kiln_tensor *x = T(d, KILN_SHAPE(8, 12));
        kiln_tensor *w1 = kiln_requires_grad(T(d, KILN_SHAPE(16, 12)), true);
        kiln_tensor *b1 = kiln_requires_grad(T(d, KILN_SHAPE(16)), true);
        kiln_tensor *w2 = kiln_requires_grad(T(d, KILN_SHAPE(5, 16)), true);
        static const int64_t lab[] = {0, 4, 2, 1, 3, 3, 0, 2};
        kiln_tensor *y = I64(d, KILN_SHAPE(8), lab);
        kiln_tensor *h = kiln_relu(kiln_linear(x, w1, b1));
        kiln_tensor *logits = kiln_linear(kiln_layer_norm(h, 1, NULL, NULL, 1e-5), w2, NULL);
        kiln_loss_ce_opts o = kiln_loss_ce_opts_default();
        kiln_tensor *loss = kiln_loss_cross_entropy(logits, y, &o);
        CHECK(kiln_backward(loss, NULL) == 0, "backward on %s: %s", kiln_device_name(d), kiln_error());
        res[k][0] = kiln_keep(loss);
        res[k][1] = kiln_keep(kiln_grad(w1));
        res[k][2] = kiln_keep(kiln_grad(b1));
        res[k][3] = kiln_keep(kiln_grad(w2));
        res[k][4] = kiln_keep(logits);
        kiln_scope_end();
    }
    static const char *names[] = {"loss", "grad w1", "grad b1", "grad w2", "logits"};
    for (int i = 0; i < 5 && devs[1]; i++) {
        bool ok = same(names[i], res[0][i], res[1][i]);
        printf("autodiff %-10s %s\n", names[i], ok ? "ok" : "FAIL");
    }
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 5; i++)
            kiln_tensor_release(res[k][i]);
    kiln_device_close(devs[1]);
    kiln_device_close(devs[0]);
    test_daemon_stop(&dm);
    return g_failed ? 1 : 0;
}

/* ---- errors --------------------------------------------------------------------------------------- */

static bool has(const char *s, const char *needle)
{
    return s && strstr(s, needle) != NULL;
}

static int test_errors(void)
{
    setenv("KILN_REMOTE_TIMEOUT_MS", "10000", 1);
    unsetenv("KILN_TOKEN");
    unsetenv("KILN_REMOTE_TOKEN");

    /* a port nobody listens on: a kilnd that was stopped leaves one behind */
    test_daemon gone;
    if (test_daemon_start(&gone, g_kilnd, NULL, NULL) != 0)
        return 1;
    char spec[160];
    snprintf(spec, sizeof spec, "%s", gone.spec);
    test_daemon_stop(&gone);
    kiln_device *d = kiln_device_open(spec);
    CHECK(!d && has(kiln_error(), "Connection refused") && has(kiln_error(), "127.0.0.1"), "refused: %s",
          d ? "opened" : kiln_error());
    printf("connection refused: %s\n", kiln_error());

    /* an IPv6 address in brackets, as in a URL; without them, or with a path after the device,
     * the spec is refused saying how it is written */
    d = kiln_device_open("remote://::1:8080/cpu");
    CHECK(!d && has(kiln_error(), "remote://[::1]:8080/cpu"), "unbracketed IPv6: %s", kiln_error());
    d = kiln_device_open("remote://127.0.0.1:8080/cpu/extra");
    CHECK(!d && has(kiln_error(), "the device is one name after the port"), "a path after the device: %s",
          kiln_error());
    const char *v6[] = {"--host", "::1", NULL};
    test_daemon six;
    if (test_daemon_start(&six, g_kilnd, v6, NULL) != 0) {
        printf("skipped: IPv6 remote device (kilnd could not listen on ::1 here)\n");
    } else {
        snprintf(spec, sizeof spec, "remote://[::1]:%d/cpu", six.port);
        d = kiln_device_open(spec);
        CHECK(d, "%s: %s", spec, kiln_error());
        if (d) {
            kiln_tensor *one = kiln_full(d, KILN_F32, KILN_SHAPE(2), 2.5);
            float got[2] = {0};
            CHECK(kiln_to_data(one, got, sizeof got) == 0 && got[0] == 2.5f && got[1] == 2.5f,
                  "and it computes there over IPv6: %s", kiln_error());
            kiln_tensor_release(one);
            kiln_device_close(d);
        }
        test_daemon_stop(&six);
    }

    /* devices named as devices: "cpu" opens the cpu kilnd drives as cpu:0, and the device it
     * drives with options (not offered, so never in the WELCOME) does not spoil the session */
    const char *spellings[] = {"--devices", "cpu:0,cpu?threads=2", NULL};
    test_daemon named;
    if (test_daemon_start(&named, g_kilnd, spellings, NULL) != 0)
        return 1;
    d = kiln_device_open(named.spec);
    CHECK(d, "remote cpu on a kilnd driving cpu:0: %s", kiln_error());
    if (d) {
        kiln_tensor *one = kiln_full(d, KILN_F32, KILN_SHAPE(2), 1.5);
        float two[2] = {0};
        CHECK(kiln_to_data(one, two, sizeof two) == 0 && two[0] == 1.5f && two[1] == 1.5f,
              "and it computes there: %s", kiln_error());
        kiln_tensor_release(one);
        kiln_device_close(d);
    }
    test_daemon_stop(&named);

    /* tokens, quota */
    const char *env[] = {"KILN_API_TOKENS=read:s3cret", NULL};
    const char *flags[] = {"--remote-max-live-bytes", "1000000", NULL};
    test_daemon dm;
    if (test_daemon_start(&dm, g_kilnd, flags, env) != 0)
        return 1;
    d = kiln_device_open(dm.spec);
    CHECK(!d && has(kiln_error(), "401") && has(kiln_error(), "bearer token"), "no token: %s", d ? "opened" : kiln_error());
    printf("no token: %s\n", kiln_error());
    setenv("KILN_TOKEN", "wrong", 1);
    d = kiln_device_open(dm.spec);
    CHECK(!d && has(kiln_error(), "401") && has(kiln_error(), "invalid"), "wrong token: %s", d ? "opened" : kiln_error());
    printf("wrong token: %s\n", kiln_error());
    setenv("KILN_TOKEN", "s3cret", 1);
    char bad[200];
    snprintf(bad, sizeof bad, "remote://127.0.0.1:%d/nosuch", dm.port);
    d = kiln_device_open(bad);
    CHECK(!d && has(kiln_error(), "nosuch") && has(kiln_error(), "drives: cpu"),
          "unknown device: %s", d ? "opened" : kiln_error());
    printf("unknown device: %s\n", kiln_error());
    d = kiln_device_open(dm.spec);
    CHECK(d, "right token: %s", kiln_error());
    if (d) {
        /* 2 MB is past the session's 1 MB: the limit is known from WELCOME, so the allocation
         * is refused at once, naming the size and the limit */
        kiln_tensor *big = kiln_zeros(d, KILN_F32, KILN_SHAPE(500000));
        CHECK(!big && has(kiln_error(), "zeros: cannot allocate") &&
                  has(kiln_error(), "2000000 bytes is more than the server lets a session hold (1000000 bytes"),
              "quota: %s", big ? "allocated" : kiln_error());
        printf("refused at once: %s\n", kiln_error());
        /* an index out of range, which only the server sees: the check is pipelined with the op,
         * the next sync says so, naming the op */
        kiln_tensor *small = kiln_full(d, KILN_F32, KILN_SHAPE(4), 2.5);
        static const int64_t nine[] = {9};
        kiln_tensor *bad_index = I64(d, KILN_SHAPE(1), nine);
        kiln_tensor *picked = kiln_index_select(small, 0, bad_index);
        CHECK(picked, "index_select is queued without waiting: %s", kiln_error());
        CHECK(kiln_device_sync(d) != 0 && has(kiln_error(), "index_select: index 9 is out of bounds for size 4"),
              "pipelined error: %s", kiln_error());
        printf("pipelined error: %s\n", kiln_error());
        /* reported once; the session goes on */
        float v[4] = {0};
        int rc = kiln_to_data(small, v, sizeof v);
        CHECK(rc == 0 && v[0] == 2.5f && v[3] == 2.5f, "after the error: rc %d, %s, %g", rc, kiln_error(), v[0]);
        CHECK(kiln_device_lost(d) == NULL, "an op's error does not lose the device: %s", kiln_device_lost(d));
        kiln_tensor_release(picked);
        kiln_tensor_release(bad_index);
        kiln_tensor_release(small);
        CHECK(kiln_device_sync(d) == 0, "sync: %s", kiln_error());

        /* kilnd killed mid-session */
        kiln_tensor *a = kiln_full(d, KILN_F32, KILN_SHAPE(16), 1.0);
        float full[16];
        CHECK(kiln_to_data(a, full, sizeof full) == 0 && full[15] == 1.0f, "before the kill: %s", kiln_error());
        CHECK(kiln_device_lost(d) == NULL, "before the kill: lost %s", kiln_device_lost(d));
        test_daemon_kill(&dm, SIGKILL);
        /* reported lost as soon as the connection is gone, before any call fails, naming the
         * server (the device looks at the idle connection without waiting) */
        char server[64];
        snprintf(server, sizeof server, "127.0.0.1:%d", dm.port);
        const char *lost = kiln_device_lost(d);
        CHECK(lost && has(lost, server) && has(lost, "connection lost"), "lost after the kill, idle: %s",
              lost ? lost : "(null)");
        printf("device lost: %s\n", lost ? lost : "(null)");
        kiln_tensor *b = kiln_add(a, a);
        float out[16];
        rc = b ? kiln_to_data(b, out, sizeof out) : -1;
        CHECK(rc != 0 && (has(kiln_error(), "connection lost") || has(kiln_error(), "closed")), "after kill: rc %d, %s",
              rc, kiln_error());
        printf("server killed: %s\n", kiln_error());
        /* every later call fails too, at once */
        kiln_tensor *c = kiln_mul(a, a);
        rc = c ? kiln_to_data(c, out, sizeof out) : -1;
        CHECK(rc != 0 && has(kiln_error(), "connection lost"), "later call: %s", kiln_error());
        CHECK(kiln_device_sync(d) != 0 && has(kiln_error(), "connection lost"), "sync after kill: %s", kiln_error());
        lost = kiln_device_lost(d);
        CHECK(lost && has(lost, server) && has(lost, "connection lost"), "lost after the failures: %s",
              lost ? lost : "(null)");
        kiln_tensor_release(a);
        kiln_tensor_release(b);
        kiln_tensor_release(c);
        kiln_device_close(d);
    }
    test_daemon_stop(&dm);
    unsetenv("KILN_TOKEN");
    return g_failed ? 1 : 0;
}

/* ---- threads -------------------------------------------------------------------------------------- */

static void *worker(void *arg)
{
    kiln_device *d = arg;
    intptr_t bad = 0;
    for (int i = 0; i < 60; i++) {
        kiln_scope_begin();
        kiln_tensor *a = kiln_full(d, KILN_F32, KILN_SHAPE(32), (double)i);
        kiln_tensor *b = kiln_add_scalar(kiln_mul_scalar(a, 2.0), 1.0);
        float v[32];
        if (kiln_to_data(b, v, sizeof v) != 0 || v[0] != (float)(2 * i + 1) || v[31] != (float)(2 * i + 1))
            bad++;
        kiln_scope_end();
    }
    return (void *)bad;
}

static int test_threads(void)
{
    test_daemon dm;
    if (test_daemon_start(&dm, g_kilnd, NULL, NULL) != 0)
        return 1;
    kiln_device *d = kiln_device_open(dm.spec);
    CHECK(d, "open: %s", kiln_error());
    if (d) {
        pthread_t th[3];
        for (int i = 0; i < 3; i++)
            pthread_create(&th[i], NULL, worker, d);
        for (int i = 0; i < 3; i++) {
            void *r;
            pthread_join(th[i], &r);
            CHECK(r == NULL, "thread %d: %ld wrong results", i, (long)(intptr_t)r);
        }
        kiln_device_close(d);
    }
    test_daemon_stop(&dm);
    printf("threads %s\n", g_failed ? "FAIL" : "ok");
    return g_failed ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s KILND ops|autodiff|errors|threads\n", argv[0]);
        return 2;
    }
    g_kilnd = argv[1];
    const char *what = argv[2];
    int rc = !strcmp(what, "ops")        ? test_ops()
             : !strcmp(what, "autodiff") ? test_autodiff()
             : !strcmp(what, "errors")   ? test_errors()
             : !strcmp(what, "threads")  ? test_threads()
                                         : 2;
    if (rc == 0)
        printf("%s: all passed\n", what);
    return rc;
}
