/*
 * clients/predict-output.c — `kiln predict` prints its answer (predict-output.h).
 *
 * JSON outputs are printed from their "data"; an integer output's values are read again from
 * the answer's text, since cJSON keeps numbers as doubles. Binary outputs (KServe's binary
 * tensor extension: the JSON header is Inference-Header-Content-Length bytes long, the outputs'
 * bytes follow in order, each as long as its "binary_data_size") are turned into the same JSON
 * text first, so one printer serves both.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>

#include "buf.h"
#include "predict-output.h"

static const char *str_of(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/*
 * Where each output's "data" array opens in the raw response body, in the order of "outputs"
 * (at most max). cJSON keeps every number as a double, which rounds an INT64 above 2^53, so
 * integer outputs are read again from this text. Returns how many were found.
 */
static int find_data_arrays(const char *p, const char *end, const char **at, int max)
{
    int depth = 0, n = 0;
    bool in_outputs = false;
    const char *key = NULL;
    size_t keylen = 0;
    for (; p < end; p++) {
        if (*p == '"') {
            const char *q = p + 1;
            while (q < end && *q != '"')
                q += *q == '\\' ? 2 : 1;
            const char *t = q + 1;
            while (t < end && strchr(" \t\r\n", *t))
                t++;
            if (t < end && *t == ':') {
                key = p + 1;
                keylen = (size_t)(q - key);
            }
            p = q;
        } else if (*p == '{' || *p == '[') {
            depth++;
            bool is_outputs = key && keylen == 7 && !memcmp(key, "outputs", 7);
            bool is_data = key && keylen == 4 && !memcmp(key, "data", 4);
            if (depth == 2 && *p == '[' && is_outputs)
                in_outputs = true;
            else if (in_outputs && depth == 4 && *p == '[' && is_data && n < max)
                at[n++] = p;
            key = NULL;
        } else if (*p == '}' || *p == ']') {
            if (--depth < 2)
                in_outputs = false;
        } else if (*p == ',') {
            key = NULL;
        }
    }
    return n;
}

/* The next element of a raw JSON array of integers at *p (the array's '[' or the ',' before the
 * element), *p moved past it; false when it is not an integer. */
static bool next_integer(const char **p, const char *end, long long *v)
{
    const char *q = *p + 1;
    while (q < end && strchr(" \t\r\n", *q))
        q++;
    char *e;
    errno = 0;
    *v = strtoll(q, &e, 10);
    if (e == q || errno || (e < end && strchr(".eE", *e)))
        return false;
    while (e < end && strchr(" \t\r\n", *e))
        e++;
    *p = e;
    return true;
}

/*
 * One output of a predict answer, a row per line for a 2-D output: booleans as true/false,
 * integers exactly (from the raw text), floating-point values to 4 places. The "-> class N"
 * hint (the arg max of the row) is only for a floating-point [batch, classes] output of more
 * than one class, the shape of a classifier's scores; for other outputs it means nothing.
 */
/* Four places where that reads well; otherwise (an FP64 of 1e-300 or 1e300) four significant
 * digits with an exponent, rather than 0.0000 or three hundred digits. */
/* s as a JSON string literal, so a label holding '"' or a newline still reads back as one value */
static void print_json_string(const char *s)
{
    putchar('"');
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            printf("\\%c", *c);
        else if (*c == '\n')
            fputs("\\n", stdout);
        else if (*c < 0x20 || *c == 0x7f)
            printf("\\u%04x", *c);
        else
            putchar(*c);
    }
    putchar('"');
}

static void print_float(double x)
{
    double a = fabs(x);
    if (x == 0 || !isfinite(x) || (a >= 1e-3 && a < 1e7))
        printf("%.4f", x);
    else
        printf("%.4e", x);
}

static void print_output(const cJSON *o, const cJSON *data, const char *raw, const char *end)
{
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(o, "shape");
    const char *dt = str_of(o, "datatype") ? str_of(o, "datatype") : "";
    bool is_float = !strncmp(dt, "FP", 2) || !strcmp(dt, "BF16"), is_bool = !strcmp(dt, "BOOL");
    bool is_int = !strncmp(dt, "INT", 3) || !strncmp(dt, "UINT", 4);
    int nd = cJSON_GetArraySize(shape);
    long long rows = nd == 2 ? (long long)cJSON_GetArrayItem(shape, 0)->valuedouble : 1;
    long long cols = nd == 2 ? (long long)cJSON_GetArrayItem(shape, 1)->valuedouble : cJSON_GetArraySize(data);
    printf("%s (%s", str_of(o, "name"), dt);
    for (int d = 0; d < nd; d++)
        printf("%s%.0f", d ? "x" : " ", cJSON_GetArrayItem(shape, d)->valuedouble);
    printf("):\n");
    const cJSON *v = data ? data->child : NULL; /* walked in order: GetArrayItem per element is quadratic */
    for (long long rr = 0; rr < rows; rr++) {
        long long best = 0;
        double bv = -INFINITY;
        printf("  [");
        for (long long c = 0; c < cols; c++, v = v ? v->next : NULL) {
            double x = cJSON_IsNumber(v) ? v->valuedouble : NAN;
            long long iv;
            printf("%s", c ? ", " : "");
            if (cJSON_IsBool(v) || (is_bool && cJSON_IsNumber(v)))
                printf("%s", cJSON_IsTrue(v) || (cJSON_IsNumber(v) && x != 0) ? "true" : "false");
            else if (is_int && raw && next_integer(&raw, end, &iv))
                printf("%lld", iv);
            else if (cJSON_IsString(v))
                print_json_string(v->valuestring);
            else
                print_float(x);
            if (x > bv) {
                bv = x;
                best = c;
            }
        }
        printf("]");
        if (nd == 2 && cols > 1 && is_float)
            printf("  -> class %lld", best);
        printf("\n");
    }
}

static double half_to_double(uint16_t h)
{
    int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v = exp == 0 ? ldexp(man, -24) : exp == 31 ? (man ? NAN : INFINITY) : ldexp(man | 0x400, exp - 25);
    return sign ? -v : v;
}

/* Bytes per element of datatype, or 0 for BYTES (length-prefixed) and an unknown name. */
static size_t element_size(const char *dt)
{
    static const struct {
        const char *name;
        size_t size;
    } sizes[] = {
        {"BOOL", 1},  {"INT8", 1},   {"UINT8", 1}, {"INT16", 2}, {"UINT16", 2}, {"FP16", 2}, {"BF16", 2},
        {"INT32", 4}, {"UINT32", 4}, {"FP32", 4},  {"INT64", 8}, {"UINT64", 8}, {"FP64", 8},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (!strcmp(dt, sizes[i].name))
            return sizes[i].size;
    return 0;
}

/* The n-byte binary part of output o as a JSON array's text into t, NUL-ended (integers exact, floats to
 * 17 digits, booleans, BYTES as strings); 0, or -1 with the reason in why. */
static int binary_as_json(const cJSON *o, const unsigned char *b, size_t n, struct kd_buf *t, char *why,
                          size_t why_len)
{
    const char *dt = str_of(o, "datatype") ? str_of(o, "datatype") : "";
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(o, "shape"), *d;
    double count = 1;
    cJSON_ArrayForEach(d, shape) count *= cJSON_IsNumber(d) ? d->valuedouble : NAN;
    size_t size = element_size(dt);
    bool is_bytes = !strcmp(dt, "BYTES");
    if (!is_bytes && (!size || !(count >= 0) || count * (double)size != (double)n)) {
        snprintf(why, why_len, "output '%s': %zu bytes of binary data, but %s of that shape takes %.0f",
                 str_of(o, "name") ? str_of(o, "name") : "?", n, dt, count * (double)size);
        return -1;
    }
    bool ok = kd_buf_puts(t, "[") == 0;
    size_t at = 0;
    for (size_t i = 0; ok && at < n; i++) {
        const unsigned char *e = b + at;
        if (i)
            ok = kd_buf_puts(t, ",") == 0;
        if (is_bytes) {
            uint32_t len;
            if (n - at < 4 || (memcpy(&len, e, 4), n - at - 4 < len)) {
                snprintf(why, why_len, "output '%s': a BYTES element runs past the binary data",
                         str_of(o, "name") ? str_of(o, "name") : "?");
                return -1;
            }
            /* a JSON string of the element's bytes, every one kept (a NUL too) */
            ok = ok && kd_buf_puts(t, "\"") == 0 && kd_buf_json_escape(t, (const char *)e + 4, len) == 0 &&
                 kd_buf_puts(t, "\"") == 0;
            at += 4 + (size_t)len;
            continue;
        }
        union {
            int8_t i8;
            uint8_t u8;
            int16_t i16;
            uint16_t u16;
            int32_t i32;
            uint32_t u32;
            int64_t i64;
            uint64_t u64;
            float f32;
            double f64;
        } v;
        memcpy(&v, e, size);
        if (!strcmp(dt, "BOOL"))
            ok = kd_buf_printf(t, "%s", v.u8 ? "true" : "false") == 0;
        else if (!strcmp(dt, "INT8"))
            ok = kd_buf_printf(t, "%d", v.i8) == 0;
        else if (!strcmp(dt, "UINT8"))
            ok = kd_buf_printf(t, "%u", v.u8) == 0;
        else if (!strcmp(dt, "INT16"))
            ok = kd_buf_printf(t, "%d", v.i16) == 0;
        else if (!strcmp(dt, "UINT16"))
            ok = kd_buf_printf(t, "%u", v.u16) == 0;
        else if (!strcmp(dt, "INT32"))
            ok = kd_buf_printf(t, "%" PRId32, v.i32) == 0;
        else if (!strcmp(dt, "UINT32"))
            ok = kd_buf_printf(t, "%" PRIu32, v.u32) == 0;
        else if (!strcmp(dt, "INT64"))
            ok = kd_buf_printf(t, "%" PRId64, v.i64) == 0;
        else if (!strcmp(dt, "UINT64"))
            ok = kd_buf_printf(t, "%" PRIu64, v.u64) == 0;
        else {
            double x = !strcmp(dt, "FP16")   ? half_to_double(v.u16)
                       : !strcmp(dt, "BF16") ? (double)(union {
                                                   uint32_t u;
                                                   float f;
                                               }){.u = (uint32_t)v.u16 << 16}
                                                   .f
                       : !strcmp(dt, "FP32") ? (double)v.f32
                                             : v.f64;
            /* JSON has no NaN or infinity: the printer shows a non-number as nan */
            ok = isfinite(x) ? kd_buf_printf(t, "%.17g", x) == 0 : kd_buf_puts(t, "null") == 0;
        }
        at += size;
    }
    /* NUL-ended, as the answer's own text is: the integer reader's strtoll stops at it */
    if (!ok || kd_buf_append(t, "]", 2) != 0) {
        snprintf(why, why_len, "out of memory");
        return -1;
    }
    t->len--;
    return 0;
}

/* Inference-Header-Content-Length's value among r's headers, or -1 when absent or malformed. */
static long long header_length(const struct response *r)
{
    static const char name[] = "\r\ninference-header-content-length:";
    for (const char *p = r->raw; p && p < r->body; p++) {
        if (strncasecmp(p, name, sizeof name - 1) != 0)
            continue;
        char *end;
        errno = 0;
        long long v = strtoll(p + sizeof name - 1, &end, 10);
        return errno || v < 0 || end == p + sizeof name - 1 ? -1 : v;
    }
    return -1;
}

int kiln_cli_print_infer_response(const struct response *r, const char *what)
{
    long long json_len = header_length(r);
    bool binary = json_len >= 0;
    if (binary && (size_t)json_len > r->body_len) {
        fprintf(stderr, "kiln: %s: Inference-Header-Content-Length %lld is past the body's %zu bytes\n", what,
                json_len, r->body_len);
        return -1;
    }
    size_t header_len = binary ? (size_t)json_len : r->body_len;
    cJSON *j = cJSON_ParseWithLength(r->body, header_len), *o;
    if (!j) {
        fprintf(stderr, "kiln: %s: the answer is not JSON\n", what);
        return -1;
    }
    const char *raw_data[64];
    int nraw = find_data_arrays(r->body, r->body + header_len, raw_data, 64), k = 0;
    const unsigned char *bin = (const unsigned char *)r->body + header_len,
                        *bin_end = (const unsigned char *)r->body + r->body_len;
    int rc = 0;
    cJSON_ArrayForEach(o, cJSON_GetObjectItemCaseSensitive(j, "outputs"))
    {
        const cJSON *size = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "parameters"),
                                                             "binary_data_size");
        if (!cJSON_IsNumber(size)) {
            /* outputs with "data" are counted in order by find_data_arrays */
            print_output(o, cJSON_GetObjectItemCaseSensitive(o, "data"), k < nraw ? raw_data[k] : NULL,
                         r->body + header_len);
            k++;
            continue;
        }
        char why[300];
        double n = size->valuedouble;
        if (!binary || !(n >= 0) || n > (double)(bin_end - bin)) {
            fprintf(stderr, "kiln: %s: output '%s' has binary_data_size %.0f, but the answer %s\n", what,
                    str_of(o, "name") ? str_of(o, "name") : "?", n,
                    binary ? "holds fewer bytes" : "has no Inference-Header-Content-Length");
            rc = -1;
            break;
        }
        struct kd_buf text = {0};
        int made = binary_as_json(o, bin, (size_t)n, &text, why, sizeof why);
        cJSON *data = made == 0 ? cJSON_ParseWithLength(text.data, text.len) : NULL;
        if (!data) {
            fprintf(stderr, "kiln: %s: %s\n", what, made == 0 ? "out of memory" : why);
            kd_buf_free(&text);
            rc = -1;
            break;
        }
        print_output(o, data, text.data, text.data + text.len);
        cJSON_Delete(data);
        kd_buf_free(&text);
        bin += (size_t)n;
    }
    cJSON_Delete(j);
    return rc;
}
