/*
 * tests/optim/fixture.h — shared by the optim tests: the device under test (argv[1],
 * "ref" by default), the PyTorch reference from tests/fixtures/optim (written by
 * tests/fixtures/gen_optim_reference.py) and tolerance checks that report the worst
 * element.
 */
#ifndef KILN_TEST_OPTIM_FIXTURE_H
#define KILN_TEST_OPTIM_FIXTURE_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <cjson/cJSON.h>

#include "kiln/kiln.h"
#include "kiln/loss.h"
#include "kiln/optim.h"
#include "kiln/record.h"

static const char *dev_spec = "ref";
static kiln_device *dev;
static kiln_safetensors *ref_st;
static cJSON *ref_doc;

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s)
        s[n] = 0;
    fclose(f);
    return s;
}

static int fixture_setup(void **state)
{
    (void)state;
    dev = kiln_device_open(dev_spec);
    if (!dev) {
        fprintf(stderr, "cannot open %s: %s\n", dev_spec, kiln_error());
        return -1;
    }
    ref_st = kiln_safetensors_open(KILN_FIXTURES "/optim/reference.safetensors");
    char *json = slurp(KILN_FIXTURES "/optim/reference.json");
    ref_doc = json ? cJSON_Parse(json) : NULL;
    free(json);
    if (!ref_st || !ref_doc) {
        fprintf(stderr, "cannot read the fixtures in %s/optim: %s\n", KILN_FIXTURES, kiln_error());
        return -1;
    }
    return 0;
}

static int fixture_teardown(void **state)
{
    (void)state;
    kiln_safetensors_close(ref_st);
    cJSON_Delete(ref_doc);
    kiln_device_close(dev);
    return 0;
}

/* A reference tensor on the device under test (scope-held when a scope is open). */
static kiln_tensor *ref_tensor(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static kiln_tensor *ref_tensor(const char *fmt, ...)
{
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    kiln_tensor *t = kiln_safetensors_load(ref_st, name, dev);
    if (!t)
        fail_msg("fixture tensor %s: %s", name, kiln_error());
    return t;
}

__attribute__((unused)) static bool ref_has(const char *name) { return kiln_safetensors_find(ref_st, name) >= 0; }

/* All of t as doubles (malloc'd). */
static double *host_f64(kiln_tensor *t)
{
    if (!t)
        fail_msg("tensor is NULL: %s", kiln_error());
    int64_t n = kiln_tensor_numel(t);
    double *out = malloc(sizeof(double) * (size_t)(n ? n : 1));
    kiln_tensor *c = kiln_cast(t, KILN_F64);
    assert_non_null(c);
    assert_int_equal(kiln_to_data(c, out, sizeof(double) * (size_t)n), 0);
    kiln_tensor_release(c);
    return out;
}

static double worst_rel; /* the largest |got - want| / (|want| + atol/rtol) seen, for the log */

/* Every element within rtol * |want| + atol (NaN matches NaN); names the worst one. */
__attribute__((unused)) static void expect_close(kiln_tensor *got, kiln_tensor *want, double rtol, double atol, const char *what)
{
    if (!got)
        fail_msg("%s: NULL: %s", what, kiln_error());
    int64_t n = kiln_tensor_numel(want);
    if (kiln_tensor_numel(got) != n)
        fail_msg("%s: %lld elements, want %lld", what, (long long)kiln_tensor_numel(got), (long long)n);
    double *g = host_f64(got), *w = host_f64(want);
    for (int64_t i = 0; i < n; i++) {
        if (isnan(w[i]) && isnan(g[i]))
            continue;
        double err = fabs(g[i] - w[i]);
        double rel = err / (fabs(w[i]) + atol / rtol);
        if (rel > worst_rel)
            worst_rel = rel;
        if (!(err <= rtol * fabs(w[i]) + atol))
            fail_msg("%s: element %lld is %.9g, PyTorch %.9g (error %.3g)", what, (long long)i, g[i], w[i], err);
    }
    free(g);
    free(w);
}

static double jnum(const cJSON *o, const char *key, double dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : cJSON_IsBool(v) ? (double)cJSON_IsTrue(v) : dflt;
}

static const char *jstr(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* argv[1] picks the device. */
#define FIXTURE_MAIN(tests)                                                                \
    int main(int argc, char **argv)                                                        \
    {                                                                                      \
        if (argc > 1)                                                                      \
            dev_spec = argv[1];                                                            \
        int rc = cmocka_run_group_tests(tests, fixture_setup, fixture_teardown);           \
        fprintf(stderr, "worst relative error against PyTorch: %.3g\n", worst_rel);        \
        return rc;                                                                         \
    }

#endif
