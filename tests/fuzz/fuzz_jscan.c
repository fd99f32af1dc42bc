/*
 * tests/fuzz/fuzz_jscan.c — libFuzzer target for the inference body's JSON scanner (api/jscan.c).
 *
 * Any byte string must be scanned without reading out of bounds, and every number token the
 * scanner converts must equal the C library's conversion bit for bit (a differential check:
 * strtof / strtod on a terminated copy are the reference). Strings decode into buffers of every
 * small size without overrunning them. The lax skip the I/O loop uses ends where the strict
 * skip does on every valid array or object.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jscan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void walk(struct kd_jscan *s, int depth)
{
    char key[8], str[5];
    switch (kd_jscan_peek(s)) {
    case KD_J_OBJECT:
        if (kd_jscan_object_begin(s) == 0)
            for (int i = 0; kd_jscan_member(s, i, key, sizeof key) == 1; i++)
                walk(s, depth + 1);
        break;
    case KD_J_ARRAY:
        if (kd_jscan_array_begin(s) == 0)
            for (int i = 0; kd_jscan_element(s, i) == 1; i++)
                walk(s, depth + 1);
        break;
    case KD_J_STRING: (void)kd_jscan_string(s, str, sizeof str); break;
    case KD_J_NUMBER: {
        double d;
        (void)kd_jscan_f64(s, &d);
        break;
    }
    default: (void)kd_jscan_skip(s); break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *)data;
    struct kd_jscan s;
    kd_jscan_init(&s, p, size);
    int strict = kd_jscan_skip(&s);
    const char *strict_end = s.p;
    (void)kd_jscan_finish(&s);
    /* The lax skip ends where the strict one does on a valid array or object (so it fails only
     * on invalid ones). */
    kd_jscan_init(&s, p, size);
    enum kd_jtype t = kd_jscan_peek(&s);
    int lax = kd_jscan_skip_lax(&s);
    if ((t == KD_J_ARRAY || t == KD_J_OBJECT) && strict == 0 && (lax != 0 || s.p != strict_end))
        abort();
    kd_jscan_init(&s, p, size);
    walk(&s, 0);

    /* Differential: the number token at the start of the input, if there is one. */
    float f;
    double d;
    long lf = kd_json_to_f32(p, p + size, &f);
    long ld = kd_json_to_f64(p, p + size, &d);
    if (lf != ld)
        abort();
    if (lf > 0) {
        char *tok = malloc((size_t)lf + 1);
        if (!tok)
            return 0;
        memcpy(tok, p, (size_t)lf);
        tok[lf] = '\0';
        float fref = strtof(tok, NULL);
        double dref = strtod(tok, NULL);
        free(tok);
        if (memcmp(&f, &fref, sizeof f) || memcmp(&d, &dref, sizeof d))
            abort();
        int64_t v;
        size_t len = 0;
        long li = kd_json_to_int(p, p + size, INT64_MIN, INT64_MAX, &v, &len);
        if (li > 0 && (double)v != dref && !(dref >= 9.2e18 || dref <= -9.2e18))
            abort(); /* a whole number must agree with its double (exactly, below 2^63) */
    }
    return 0;
}
