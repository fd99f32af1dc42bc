/*
 * tests/conformance/torch-reference.c — checks kiln on "ref" and "cpu" against
 * PyTorch's answers stored in tests/fixtures/torch_reference.{json,bin} (written by
 * tests/fixtures/gen_torch_reference.py; the format is described there). torch is
 * not needed to run this test. A case the fixture marks "known_deviation" is printed
 * (with "NOW MATCHES" once kiln agrees) but does not count.
 *
 *   torch-reference PATH/torch_reference.json [-v]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kiln/tensor.h"

static unsigned char *g_blob;
static size_t g_blob_len;
static bool g_verbose;
static const char *g_fail = "FAIL"; /* "  .." while checking a known deviation */

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        *len = (size_t)n;
    }
    return buf;
}

typedef struct ref_tensor {
    kiln_dtype dt;
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    int64_t numel;
    const void *data;
} ref_tensor;

static bool parse_tensor(const cJSON *j, ref_tensor *t)
{
    const cJSON *dt = cJSON_GetObjectItem(j, "dtype"), *shape = cJSON_GetObjectItem(j, "shape");
    const cJSON *off = cJSON_GetObjectItem(j, "offset"), *nb = cJSON_GetObjectItem(j, "nbytes");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsNumber(off) || !cJSON_IsNumber(nb))
        return false;
    t->dt = strcmp(dt->valuestring, "i64") == 0 ? KILN_I64 : KILN_F32;
    t->ndim = cJSON_GetArraySize(shape);
    if (t->ndim > KILN_MAX_DIMS)
        return false;
    t->numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        t->shape[i] = (int64_t)cJSON_GetArrayItem(shape, i)->valuedouble;
        t->numel *= t->shape[i];
    }
    size_t o = (size_t)off->valuedouble, n = (size_t)nb->valuedouble;
    if (o + n > g_blob_len || n != (size_t)t->numel * kiln_dtype_size(t->dt))
        return false;
    t->data = g_blob + o;
    return true;
}

static double pnum(const cJSON *params, const char *key, double def)
{
    const cJSON *v = cJSON_GetObjectItem(params, key);
    if (cJSON_IsNumber(v))
        return v->valuedouble;
    if (cJSON_IsBool(v))
        return cJSON_IsTrue(v) ? 1 : 0;
    return def;
}

/* Up to 3 entries of an integer array parameter; returns the count. */
static int parr(const cJSON *params, const char *key, int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItem(params, key);
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0;
    for (int i = 0; i < n && i < 8; i++)
        out[i] = (int64_t)cJSON_GetArrayItem(v, i)->valuedouble;
    return n;
}

static int one(kiln_tensor **out, kiln_tensor *t)
{
    out[0] = t;
    return t ? 1 : -1;
}

static int run_unary(const char *fn, const cJSON *p, kiln_tensor *x, kiln_tensor **out)
{
    const cJSON *args = cJSON_GetObjectItem(p, "args");
    double a0 = cJSON_GetArraySize(args) > 0 ? cJSON_GetArrayItem(args, 0)->valuedouble : 0;
    double a1 = cJSON_GetArraySize(args) > 1 ? cJSON_GetArrayItem(args, 1)->valuedouble : 0;
    static const struct {
        const char *name;
        kiln_tensor *(*fn)(kiln_tensor *);
    } plain[] = {{"sign", kiln_sign},   {"relu", kiln_relu},   {"round", kiln_round},
                 {"rsqrt", kiln_rsqrt}, {"log1p", kiln_log1p}, {"sqrt", kiln_sqrt}};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
        if (strcmp(fn, plain[i].name) == 0)
            return one(out, plain[i].fn(x));
    if (strcmp(fn, "pow_scalar") == 0)
        return one(out, kiln_pow_scalar(x, a0));
    if (strcmp(fn, "clamp") == 0)
        return one(out, kiln_clamp(x, a0, a1));
    fprintf(stderr, "torch-reference: unknown unary %s in the fixture\n", fn);
    return -2;
}

static int run_binary(const char *fn, kiln_tensor *a, kiln_tensor *b, kiln_tensor **out)
{
    if (strcmp(fn, "maximum") == 0)
        return one(out, kiln_maximum(a, b));
    if (strcmp(fn, "minimum") == 0)
        return one(out, kiln_minimum(a, b));
    if (strcmp(fn, "remainder") == 0)
        return one(out, kiln_remainder(a, b));
    if (strcmp(fn, "div") == 0)
        return one(out, kiln_div(a, b));
    fprintf(stderr, "torch-reference: unknown binary %s in the fixture\n", fn);
    return -2;
}

static int run_op(const char *op, const cJSON *p, kiln_tensor **in, int nin, kiln_tensor **out)
{
    const cJSON *fnj = cJSON_GetObjectItem(p, "fn");
    const char *fn = cJSON_IsString(fnj) ? fnj->valuestring : "";
    if (strcmp(op, "unary") == 0)
        return run_unary(fn, p, in[0], out);
    if (strcmp(op, "binary") == 0)
        return run_binary(fn, in[0], in[1], out);
    int64_t a[8] = {0}, b[8] = {0}, c[8] = {0}, d[8] = {0};
    if (strcmp(op, "gelu") == 0)
        return one(out, kiln_gelu(in[0], pnum(p, "tanh", 0) != 0));
    if (strcmp(op, "silu") == 0)
        return one(out, kiln_silu(in[0]));
    if (strcmp(op, "elu") == 0)
        return one(out, kiln_elu(in[0], pnum(p, "alpha", 1)));
    if (strcmp(op, "softplus") == 0)
        return one(out, kiln_softplus(in[0], pnum(p, "beta", 1), pnum(p, "threshold", 20)));
    if (strcmp(op, "softmax") == 0)
        return one(out, kiln_softmax(in[0], (int)pnum(p, "dim", -1)));
    if (strcmp(op, "log_softmax") == 0)
        return one(out, kiln_log_softmax(in[0], (int)pnum(p, "dim", -1)));
    if (strcmp(op, "logsumexp") == 0) {
        int dim = (int)pnum(p, "dim", -1);
        return one(out, kiln_logsumexp(in[0], 1, &dim, false));
    }
    if (strcmp(op, "layer_norm") == 0)
        return one(out, kiln_layer_norm(in[0], (int)pnum(p, "nnorm", 1), in[1], in[2], pnum(p, "eps", 1e-5)));
    if (strncmp(op, "conv", 4) == 0) {
        kiln_conv_opts o;
        memset(&o, 0, sizeof o);
        int ns = parr(p, "stride", a);
        parr(p, "padding", b);
        parr(p, "dilation", c);
        parr(p, "output_padding", d);
        for (int i = 0; i < ns && i < 3; i++) {
            o.stride[i] = a[i];
            o.padding[i] = b[i];
            o.dilation[i] = c[i];
            o.output_padding[i] = d[i];
        }
        o.groups = (int64_t)pnum(p, "groups", 1);
        kiln_tensor *bias = nin > 2 ? in[2] : NULL;
        if (strcmp(op, "conv1d") == 0)
            return one(out, kiln_conv1d(in[0], in[1], bias, &o));
        if (strcmp(op, "conv2d") == 0)
            return one(out, kiln_conv2d(in[0], in[1], bias, &o));
        if (strcmp(op, "conv_transpose2d") == 0)
            return one(out, kiln_conv_transpose2d(in[0], in[1], bias, &o));
    }
    if (strcmp(op, "max_pool2d") == 0 || strcmp(op, "avg_pool2d") == 0) {
        kiln_pool_opts o;
        memset(&o, 0, sizeof o);
        parr(p, "kernel", a);
        parr(p, "stride", b);
        parr(p, "padding", c);
        int nd = parr(p, "dilation", d);
        for (int i = 0; i < 2; i++) {
            o.kernel[i] = a[i];
            o.stride[i] = b[i];
            o.padding[i] = c[i];
            o.dilation[i] = nd ? d[i] : 1;
        }
        o.ceil_mode = pnum(p, "ceil_mode", 0) != 0;
        o.count_include_pad = pnum(p, "count_include_pad", 1) != 0;
        if (op[0] == 'a')
            return one(out, kiln_avg_pool2d(in[0], &o));
        kiln_tensor *idx = NULL;
        out[0] = kiln_max_pool2d(in[0], &o, &idx);
        out[1] = idx;
        return out[0] && idx ? 2 : -1;
    }
    if (strcmp(op, "adaptive_avg_pool2d") == 0) {
        parr(p, "out", a);
        return one(out, kiln_adaptive_avg_pool2d(in[0], a[0], a[1]));
    }
    if (strcmp(op, "interpolate") == 0) {
        parr(p, "out", a);
        const cJSON *m = cJSON_GetObjectItem(p, "mode");
        kiln_interp_mode mode = cJSON_IsString(m) && strcmp(m->valuestring, "bilinear") == 0
                                    ? KILN_INTERP_BILINEAR
                                    : KILN_INTERP_NEAREST;
        return one(out, kiln_interpolate(in[0], a[0], a[1], mode, pnum(p, "align_corners", 0) != 0));
    }
    if (strcmp(op, "var") == 0 || strcmp(op, "std") == 0) {
        int n = parr(p, "dims", a), dims[8];
        for (int i = 0; i < n; i++)
            dims[i] = (int)a[i];
        double corr = pnum(p, "correction", 1);
        bool keep = pnum(p, "keepdim", 0) != 0;
        if (op[0] == 'v')
            return one(out, kiln_var(in[0], n, n ? dims : NULL, corr, keep));
        return one(out, kiln_std(in[0], n, n ? dims : NULL, corr, keep));
    }
    if (strcmp(op, "remainder") == 0)
        return one(out, kiln_remainder(in[0], in[1]));
    if (strcmp(op, "round") == 0)
        return one(out, kiln_round(in[0]));
    if (strcmp(op, "cumsum") == 0)
        return one(out, kiln_cumsum(in[0], (int)pnum(p, "dim", 0)));
    if (strcmp(op, "sort") == 0) {
        if (kiln_sort(in[0], (int)pnum(p, "dim", -1), pnum(p, "descending", 0) != 0, &out[0], &out[1]) < 0)
            return -1;
        return 2;
    }
    if (strcmp(op, "topk") == 0) {
        if (kiln_topk(in[0], (int64_t)pnum(p, "k", 1), (int)pnum(p, "dim", -1), pnum(p, "largest", 1) != 0,
                      &out[0], &out[1]) < 0)
            return -1;
        return 2;
    }
    if (strcmp(op, "matmul") == 0)
        return one(out, kiln_matmul(in[0], in[1]));
    if (strcmp(op, "linear") == 0)
        return one(out, kiln_linear(in[0], in[1], nin > 2 ? in[2] : NULL));
    if (strcmp(op, "sdpa") == 0)
        return one(out, kiln_scaled_dot_product_attention(in[0], in[1], in[2], nin > 3 ? in[3] : NULL,
                                                          pnum(p, "causal", 0) != 0, 0));
    if (strcmp(op, "batch_norm") == 0) {
        bool training = pnum(p, "training", 0) != 0;
        out[0] = kiln_batch_norm(in[0], in[1], in[2], in[3], in[4], training, pnum(p, "momentum", 0.1),
                                 pnum(p, "eps", 1e-5));
        if (!out[0])
            return -1;
        if (!training)
            return 1;
        out[1] = in[1];
        out[2] = in[2];
        return 3;
    }
    if (strcmp(op, "group_norm") == 0)
        return one(out, kiln_group_norm(in[0], (int64_t)pnum(p, "groups", 1), in[1], in[2], pnum(p, "eps", 1e-5)));
    if (strcmp(op, "pad") == 0) {
        int n = parr(p, "pads", a);
        const cJSON *m = cJSON_GetObjectItem(p, "mode");
        const char *ms = cJSON_IsString(m) ? m->valuestring : "constant";
        kiln_pad_mode mode = strcmp(ms, "reflect") == 0     ? KILN_PAD_REFLECT
                             : strcmp(ms, "replicate") == 0 ? KILN_PAD_REPLICATE
                                                            : KILN_PAD_CONSTANT;
        return one(out, kiln_pad(in[0], n, a, mode, pnum(p, "value", 0)));
    }
    fprintf(stderr, "torch-reference: unknown op %s in the fixture\n", op);
    return -2;
}

/* Compare one output; returns true when it matches. */
static bool check(const char *name, const char *dev, int o, kiln_tensor *t, const ref_tensor *r, double rtol,
                  double atol)
{
    if (kiln_tensor_ndim(t) != r->ndim || memcmp(kiln_tensor_shape(t), r->shape, (size_t)r->ndim * 8) != 0) {
        char buf[128];
        printf("%s %-26s %-4s output %d: shape %s differs from torch's\n", g_fail, name, dev, o,
               kiln_tensor_describe(t, buf, sizeof buf));
        return false;
    }
    kiln_tensor *c = kiln_cast(t, r->dt);
    size_t nb = (size_t)r->numel * kiln_dtype_size(r->dt);
    void *got = malloc(nb ? nb : 1);
    bool ok = c && kiln_to_data(c, got, nb) == 0;
    if (!ok)
        printf("%s %-26s %-4s output %d: download failed: %s\n", g_fail, name, dev, o, kiln_error());
    double worst = 0;
    int64_t wi = -1;
    for (int64_t i = 0; ok && i < r->numel; i++) {
        if (r->dt == KILN_I64) {
            int64_t g = ((int64_t *)got)[i], e;
            memcpy(&e, (const char *)r->data + i * 8, 8);
            if (g != e) {
                printf("%s %-26s %-4s output %d element %lld: %lld, torch %lld\n", g_fail, name, dev, o,
                       (long long)i, (long long)g, (long long)e);
                ok = false;
            }
            continue;
        }
        float g = ((float *)got)[i], e;
        memcpy(&e, (const char *)r->data + i * 4, 4);
        bool special = isnan(g) || isnan(e) || isinf(g) || isinf(e);
        double excess = special ? ((isnan(g) && isnan(e)) || g == e ? 0 : INFINITY)
                                : fabs((double)g - e) - (rtol * fabs((double)e) + atol);
        if (excess > worst) {
            worst = excess;
            wi = i;
        }
    }
    if (ok && wi >= 0) {
        float g = ((float *)got)[wi], e;
        memcpy(&e, (const char *)r->data + wi * 4, 4);
        printf("%s %-26s %-4s output %d element %lld: %.9g, torch %.9g (tolerance %.2g*|torch| + %.2g)\n",
               g_fail, name, dev, o, (long long)wi, g, e, rtol, atol);
        ok = false;
    }
    free(got);
    return ok;
}

/* The dtype an op gives for inputs of dtype a (and b): -1 with a message when it fails. */
static int rule_dtype(kiln_device *dev, const char *op, kiln_dtype a, int b)
{
    if (strcmp(op, "promote") == 0)
        return (int)kiln_promote_types(a, (kiln_dtype)b);
    kiln_scope_begin();
    kiln_tensor *x = kiln_ones(dev, a, KILN_SHAPE(3)), *y = b >= 0 ? kiln_ones(dev, (kiln_dtype)b, KILN_SHAPE(3)) : NULL;
    kiln_tensor *r = NULL;
    static const struct {
        const char *name;
        kiln_tensor *(*fn)(kiln_tensor *, kiln_tensor *);
    } bin[] = {{"add", kiln_add}, {"mul", kiln_mul}, {"div", kiln_div}, {"maximum", kiln_maximum},
               {"eq", kiln_eq},   {"lt", kiln_lt},   {"logical_and", kiln_logical_and}};
    static const struct {
        const char *name;
        kiln_tensor *(*fn)(kiln_tensor *);
    } un[] = {{"neg", kiln_neg},         {"abs", kiln_abs},     {"exp", kiln_exp},
              {"sqrt", kiln_sqrt},       {"sigmoid", kiln_sigmoid}, {"relu", kiln_relu},
              {"floor", kiln_floor},     {"sign", kiln_sign},   {"isnan", kiln_isnan},
              {"logical_not", kiln_logical_not}};
    for (size_t i = 0; i < sizeof bin / sizeof bin[0]; i++)
        if (strcmp(op, bin[i].name) == 0)
            r = bin[i].fn(x, y);
    for (size_t i = 0; i < sizeof un / sizeof un[0]; i++)
        if (strcmp(op, un[i].name) == 0)
            r = un[i].fn(x);
    if (strcmp(op, "sum") == 0)
        r = kiln_sum(x, KILN_ALL_DIMS, false);
    else if (strcmp(op, "prod") == 0)
        r = kiln_prod(x, KILN_ALL_DIMS, false);
    else if (strcmp(op, "mean") == 0)
        r = kiln_mean(x, KILN_ALL_DIMS, false);
    else if (strcmp(op, "any") == 0)
        r = kiln_any(x, KILN_ALL_DIMS, false);
    else if (strcmp(op, "cumsum") == 0)
        r = kiln_cumsum(x, 0);
    else if (strcmp(op, "argmax") == 0)
        r = kiln_argmax(x, 0, false);
    else if (strcmp(op, "softmax") == 0)
        r = kiln_softmax(x, 0);
    else if (strcmp(op, "add_scalar_2.5") == 0)
        r = kiln_add_scalar(x, 2.5);
    else if (strcmp(op, "add_scalar_2") == 0)
        r = kiln_add_scalar(x, 2);
    else if (strcmp(op, "mul_scalar_2.5") == 0)
        r = kiln_mul_scalar(x, 2.5);
    int dt = r ? (int)kiln_tensor_dtype(r) : -1;
    kiln_scope_end();
    return dt;
}

/* Check kiln's result dtypes against PyTorch's; returns the number of mismatches. */
static int check_dtype_rules(const cJSON *rules, kiln_device *dev, const char *dn, int *checked, int *known_n)
{
    int bad = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, rules)
    {
        const char *op = cJSON_GetObjectItem(r, "op")->valuestring;
        const cJSON *bj = cJSON_GetObjectItem(r, "b");
        int a = kiln_dtype_from_name(cJSON_GetObjectItem(r, "a")->valuestring);
        int b = cJSON_IsString(bj) ? kiln_dtype_from_name(bj->valuestring) : -1;
        int want = kiln_dtype_from_name(cJSON_GetObjectItem(r, "result")->valuestring);
        if (a < 0 || want < 0 || (cJSON_IsString(bj) && b < 0))
            continue;
        kiln_error_clear();
        int got = rule_dtype(dev, op, (kiln_dtype)a, b);
        (*checked)++;
        const cJSON *known = cJSON_GetObjectItem(r, "known_deviation");
        if (cJSON_IsString(known)) {
            (*checked)--;
            (*known_n)++;
            printf("%s dtype %-16s %-4s %s: known deviation from PyTorch: %s\n", got == want ? "NOW MATCHES" : "known",
                   op, dn, kiln_dtype_name((kiln_dtype)a), known->valuestring);
        } else if (got != want) {
            bad++;
            printf("FAIL dtype %-16s %-4s %s%s%s: kiln %s, torch %s%s%s\n", op, dn, kiln_dtype_name((kiln_dtype)a),
                   b >= 0 ? " with " : "", b >= 0 ? kiln_dtype_name((kiln_dtype)b) : "",
                   got < 0 ? "fails" : kiln_dtype_name((kiln_dtype)got), kiln_dtype_name((kiln_dtype)want),
                   got < 0 ? ": " : "", got < 0 ? kiln_error() : "");
        }
    }
    return bad;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: torch-reference PATH/torch_reference.json [-v]\n");
        return 2;
    }
    g_verbose = argc > 2 && strcmp(argv[2], "-v") == 0;
    size_t jlen;
    char *text = read_file(argv[1], &jlen);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    if (!root) {
        fprintf(stderr, "torch-reference: cannot read %s\n", argv[1]);
        return 1;
    }
    const cJSON *data = cJSON_GetObjectItem(root, "data");
    char path[4096];
    const char *slash = strrchr(argv[1], '/');
    int dirlen = slash ? (int)(slash - argv[1] + 1) : 0;
    snprintf(path, sizeof path, "%.*s%s", dirlen, argv[1], cJSON_IsString(data) ? data->valuestring : "");
    g_blob = (unsigned char *)read_file(path, &g_blob_len);
    if (!g_blob) {
        fprintf(stderr, "torch-reference: cannot read %s\n", path);
        return 1;
    }

    static const char *devices[] = {"ref", "cpu"};
    int passed = 0, failed = 0, known_n = 0;
    const cJSON *cases = cJSON_GetObjectItem(root, "cases");
    for (int di = 0; di < 2; di++) {
        kiln_device *dev = kiln_device_open(devices[di]);
        if (!dev) {
            printf("FAIL device %s does not open: %s\n", devices[di], kiln_error());
            failed++;
            continue;
        }
        const cJSON *cs;
        cJSON_ArrayForEach(cs, cases)
        {
            const char *name = cJSON_GetObjectItem(cs, "name")->valuestring;
            const char *op = cJSON_GetObjectItem(cs, "op")->valuestring;
            const cJSON *params = cJSON_GetObjectItem(cs, "params");
            double rtol = pnum(cs, "rtol", 1e-5), atol = pnum(cs, "atol", 1e-6);
            g_fail = cJSON_IsString(cJSON_GetObjectItem(cs, "known_deviation")) ? "  .." : "FAIL";
            kiln_scope_begin();
            kiln_tensor *in[8] = {0}, *out[8] = {0};
            int nin = 0;
            bool ok = true;
            const cJSON *j;
            cJSON_ArrayForEach(j, cJSON_GetObjectItem(cs, "inputs"))
            {
                ref_tensor r;
                if (nin == 8 || !parse_tensor(j, &r)) {
                    ok = false;
                    break;
                }
                in[nin++] = kiln_from_data(dev, r.dt, r.ndim, r.shape, r.data,
                                           (size_t)r.numel * kiln_dtype_size(r.dt));
            }
            if (!ok) {
                printf("%s %-26s %-4s: malformed fixture\n", g_fail, name, devices[di]);
            } else {
                kiln_error_clear();
                int nout = run_op(op, params, in, nin, out);
                int no = 0;
                cJSON_ArrayForEach(j, cJSON_GetObjectItem(cs, "outputs"))
                    no++;
                if (nout < 0 || nout != no) {
                    printf("%s %-26s %-4s: %s\n", g_fail, name, devices[di],
                           nout < 0 ? kiln_error() : "wrong number of outputs");
                    ok = false;
                } else {
                    int o = 0;
                    cJSON_ArrayForEach(j, cJSON_GetObjectItem(cs, "outputs"))
                    {
                        ref_tensor r;
                        if (!parse_tensor(j, &r) || !check(name, devices[di], o, out[o], &r, rtol, atol))
                            ok = false;
                        o++;
                    }
                }
            }
            kiln_scope_end();
            const cJSON *known = cJSON_GetObjectItem(cs, "known_deviation");
            if (cJSON_IsString(known)) {
                known_n++;
                printf("%s %-26s %-4s known deviation from PyTorch: %s\n", ok ? "NOW MATCHES" : "known",
                       name, devices[di], known->valuestring);
            } else if (ok) {
                passed++;
                if (g_verbose)
                    printf("ok   %-26s %s\n", name, devices[di]);
            } else {
                failed++;
            }
        }
        int checked = 0, bad = check_dtype_rules(cJSON_GetObjectItem(root, "dtype_rules"), dev, devices[di], &checked,
                                    &known_n);
        failed += bad;
        passed += checked - bad;
        kiln_device_close(dev);
    }
    if (known_n)
        printf("%d known deviation(s) from PyTorch listed above (not counted)\n", known_n);
    printf("torch-reference: %d passed, %d failed\n", passed, failed);
    cJSON_Delete(root);
    free(text);
    free(g_blob);
    return failed ? 1 : 0;
}
