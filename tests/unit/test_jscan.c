/*
 * tests/unit/test_jscan.c — the in-place JSON scanner that decodes inference bodies.
 *
 * Its claims are checked, not assumed: numbers convert bit for bit as strtof / strtod do
 * (hand-picked hard cases near rounding midpoints, subnormals and overflow, the edges of the
 * fast path, then a few hundred thousand random decimal tokens); the grammar is RFC 8259's exactly (every lenient extension
 * of common parsers is refused); strings unescape to the right UTF-8; whole-number parsing is
 * exact at the int64 limits.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "jscan.h"

/* Both conversions of tok compared bit for bit with the C library's. */
static void check_number(const char *tok)
{
    size_t n = strlen(tok);
    float f = 0, fref = strtof(tok, NULL);
    double d = 0, dref = strtod(tok, NULL);
    long lf = kd_json_to_f32(tok, tok + n, &f);
    long ld = kd_json_to_f64(tok, tok + n, &d);
    if (lf != (long)n || ld != (long)n || memcmp(&f, &fref, sizeof f) || memcmp(&d, &dref, sizeof d))
        fail_msg("'%s': f32 %a (len %ld) vs strtof %a; f64 %a (len %ld) vs strtod %a", tok, (double)f, lf,
                 (double)fref, d, ld, dref);
}

static void numbers_hard_cases(void **state)
{
    (void)state;
    static const char *const cases[] = {
        "0", "-0", "0.0", "-0.0e5", "1", "-1", "0.1", "0.2", "0.3", "1e23", "8.589973e9", "3.4028235e38",
        "3.4028236e38", "3.40282357e38", "1e39", "-1e39", "1e-45", "1.4e-45", "7e-46", "7.1e-46",
        "1.17549435e-38", "1.1754942e-38", "2.2250738585072011e-308", "2.2250738585072014e-308",
        "4.9406564584124654e-324", "2.4703282292062328e-324", "1.7976931348623157e308",
        "1.7976931348623159e308", "1e309", "1e-400",
        /* 1 + 2^-24 is the midpoint between 1 and the next float: ties to even gives 1 */
        "1.000000059604644775390625", "1.0000000596046447753906251", "1.0000000596046447753906249",
        /* the midpoint between 1 and the next double */
        "1.00000000000000011102230246251565404236316680908203125",
        "1.00000000000000011102230246251565404236316680908203124",
        "7.038531e-26", "9007199254740993", "9007199254740992.5", "123456789012345678901234567890",
        "0.000000000000000000000000000001", "1234567890123456789", "12345678901234567890",
        "16777217", "16777217.000000001", "33554435", "4.35e-2", "12.50e1", "1E+2", "1e-0",
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        check_number(cases[i]);
}

/* xorshift64*: a fixed seed keeps the test repeatable. */
static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static void numbers_random(void **state)
{
    (void)state;
    uint64_t s = 0x9e3779b97f4a7c15ull;
    char tok[96];
    for (int it = 0; it < 300000; it++) {
        size_t k = 0;
        if (rng_next(&s) & 1)
            tok[k++] = '-';
        int ndig = 1 + (int)(rng_next(&s) % 24);
        int point = (int)(rng_next(&s) % (uint64_t)(ndig + 1));
        bool lead_zero = (rng_next(&s) % 4) == 0;
        if (lead_zero) {
            tok[k++] = '0';
            tok[k++] = '.';
            int zeros = (int)(rng_next(&s) % 12);
            while (zeros--)
                tok[k++] = '0';
            point = -1;
        }
        for (int i = 0; i < ndig; i++) {
            if (i == point && i > 0)
                tok[k++] = '.';
            char c = (char)('0' + rng_next(&s) % 10);
            if (i == 0 && !lead_zero && c == '0')
                c = '1';
            tok[k++] = c;
        }
        if (rng_next(&s) % 3) {
            int e = (int)(rng_next(&s) % 101) - 50;
            if (rng_next(&s) % 8 == 0)
                e = (int)(rng_next(&s) % 700) - 350;
            k += (size_t)snprintf(tok + k, sizeof tok - k, "e%d", e);
        }
        tok[k] = '\0';
        check_number(tok);
    }
}

/* Floats just around every float midpoint in a range: where double rounding would go wrong. */
static void numbers_near_midpoints(void **state)
{
    (void)state;
    uint64_t s = 12345;
    char tok[64];
    for (int it = 0; it < 20000; it++) {
        uint32_t bits = (uint32_t)(rng_next(&s) % 0x7f000000u);
        float a;
        memcpy(&a, &bits, sizeof a);
        double mid = ((double)a + (double)nextafterf(a, INFINITY)) / 2; /* exact in double */
        for (int delta = -1; delta <= 1; delta++) {
            double v = delta ? nextafter(mid, delta > 0 ? INFINITY : -INFINITY) : mid;
            snprintf(tok, sizeof tok, "%.17g", v);
            check_number(tok);
            snprintf(tok, sizeof tok, "%.9g", v);
            check_number(tok);
        }
    }
}

/*
 * The edges of the fast paths (Clinger's: m <= 2^53, |decimal exponent| <= 22, then double ->
 * float; and FP32's past 2^53): their bounds on both sides, signed zeros, subnormals beside them,
 * and the double-rounding traps.
 */
static void numbers_fast_path_edges(void **state)
{
    (void)state;
    static const char *const cases[] = {
        /* the mantissa bound: 2^53 takes the fast path, 2^53 + 1 does not */
        "9007199254740991", "9007199254740992", "9007199254740993", "-9007199254740992", "9007199254740992e22",
        "9007199254740993e22", "9007199254740992e-22", "9007199254740993e-22", "9007199254740992e-23",
        "9007199254740992e23", "900719925474099.2", "900719925474099.3e1",
        /* the exponent bound, also reached through the point or leading zeros */
        "1e22", "1e23", "-1e22", "1e-22", "1e-23", "17e22", "17e23", "123456789e-22", "123456789e-23",
        "0.0000000000000000000001", "0.00000000000000000000001", "10000000000000000000000", "1000000000000000000000.0",
        "4.5e-21", "4.5e-24", "3.4028234e38", "3.4028235e38",
        /* signed zeros */
        "0", "-0", "-0.0", "-0e22", "-0.000e-23", "0e-400", "-0e400",
        /* subnormal floats and doubles (never the fast path, but right beside it) */
        "1e-45", "1.4e-45", "7e-46", "1e-40", "1.17549421e-38", "1e-320", "4.9e-324", "2.5e-324", "2.4e-324",
        /* float midpoints that are exact doubles: the fast path must step aside, ties go to even */
        "16777217", "16777219", "-16777217", "33554434", "33554438", "1677721.7e1", "8388608.5", "8388609.5",
        "4194304.25", "4194304.75", "562949986975744", "0.5000000298023223876953125",
        /* decimals whose correctly rounded double is a float midpoint although they are not: a
         * naive double -> float would round these the wrong way */
        "5365846864879131e-17", "8622707333415746e-18", "8622707333415747e-18", "8758797912597656e-13",
        "5021415252685547e-13", "3267909772694111e-17", "7517229532822967e-18", "3434441947937012e-14",
        "3104258632659912e-14", "8613262474536896e-16", "5376469612121582e-14", "4630693674087524e-15",
        "-5365846864879131e-17", "-3267909772694111e-17",
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        check_number(cases[i]);

    char tok[96];
    /* Every float midpoint (2a+1) * 2^j for a few a, written out exactly: integers up to 2^53
     * and fractions whose mantissas straddle 2^53. */
    uint64_t s = 777;
    for (int it = 0; it < 400; it++) {
        uint64_t a = ((uint64_t)1 << 23) + rng_next(&s) % ((uint64_t)1 << 23);
        for (int j = -14; j <= 29; j++) {
            double mid = ldexp((double)(2 * a + 1), j - 1); /* the midpoint above a * 2^j */
            snprintf(tok, sizeof tok, "%.*f", j < 1 ? 1 - j : 0, mid);
            check_number(tok);
            snprintf(tok, sizeof tok, "%.17g", nextafter(mid, INFINITY));
            check_number(tok);
            snprintf(tok, sizeof tok, "%.17g", nextafter(mid, -INFINITY));
            check_number(tok);
        }
    }
    /* 17 to 19 digits a few double ulps either side of a float midpoint: the FP32 path past 2^53
     * rounds in double twice and must step aside within its error bound of the midpoint. */
    for (int it = 0; it < 3000; it++) {
        double lg = -20 + (double)(rng_next(&s) % 5600) / 100; /* 1e-20 .. 1e36 */
        float a = (float)pow(10, lg);
        double mid = ((double)a + (double)nextafterf(a, INFINITY)) / 2, v = mid;
        for (int k = 0; k < 8; k++)
            v = nextafter(v, -INFINITY);
        for (int k = -8; k <= 8; k++, v = nextafter(v, INFINITY))
            for (int digits = 17; digits <= 19; digits++) {
                snprintf(tok, sizeof tok, "%.*g", digits, v);
                check_number(tok);
            }
    }
    /* Mantissas around 2^53 and random 16-digit ones, with exponents across the bound. */
    for (int e = -24; e <= 24; e++) {
        for (int64_t dm = -3; dm <= 3; dm++) {
            snprintf(tok, sizeof tok, "%llde%d", (long long)(((int64_t)1 << 53) + dm), e);
            check_number(tok);
        }
        for (int it = 0; it < 200; it++) {
            snprintf(tok, sizeof tok, "%llue%d", (unsigned long long)(rng_next(&s) % ((uint64_t)1 << 53)), e);
            check_number(tok);
        }
    }
}

/* Digit runs read eight bytes at a time: a run cut at every offset by each byte that borders a
 * digit (':' and '/' neighbour '9' and '0'; 0xb0-0xb9 and 0x30-0x39 differ in the top bit),
 * with the buffer going on after it, must end where a byte-at-a-time read ends. */
static void numbers_digit_runs(void **state)
{
    (void)state;
    static const char stops[] = {':', '/', ',', ']', ' ', '.', 'e', '\0', (char)0xb5, (char)0xba, '\x7f'};
    static const char *const heads[] = {"", "0.", "0.000", "-", "-0.0", "12.", "1234567890.0"};
    char buf[96], tok[96];
    for (size_t h = 0; h < sizeof heads / sizeof *heads; h++)
        for (int run = 1; run <= 26; run++)
            for (size_t k = 0; k < sizeof stops; k++) {
                size_t n = strlen(heads[h]);
                memcpy(buf, heads[h], n);
                for (int i = 0; i < run; i++)
                    buf[n++] = (char)('1' + (i * 7 + run) % 9);
                size_t toklen = n;
                buf[n++] = stops[k];
                memcpy(buf + n, "12345678901234567890", 20); /* more digits past the stop */
                n += 20;
                if (stops[k] == '.' || stops[k] == 'e')
                    toklen = 0; /* "1.1234..." or "1e1234...": the token runs on; only compare lengths below */
                float f;
                double d;
                long lf = kd_json_to_f32(buf, buf + n, &f), ld = kd_json_to_f64(buf, buf + n, &d);
                if (toklen == 0) {
                    assert_int_equal(lf, ld);
                    continue;
                }
                memcpy(tok, buf, toklen);
                tok[toklen] = '\0';
                if (lf != (long)toklen || ld != (long)toklen)
                    fail_msg("'%s' then 0x%02x: lengths %ld, %ld", tok, (unsigned char)stops[k], lf, ld);
                check_number(tok);
                float fref = strtof(tok, NULL);
                double dref = strtod(tok, NULL);
                assert_memory_equal(&f, &fref, sizeof f);
                assert_memory_equal(&d, &dref, sizeof d);
                int64_t v;
                size_t vlen;
                if (h == 0 && run <= 18) {
                    assert_int_equal(kd_json_to_int(buf, buf + n, INT64_MIN, INT64_MAX, &v, &vlen), (long)toklen);
                    assert_true((double)v == dref);
                }
            }
}

static void numbers_not_json(void **state)
{
    (void)state;
    static const char *const bad[] = {"", "-", "+1", ".5", "1.", "1e", "1e+", "-.5", "x", "NaN", "Infinity"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        float f = 42;
        double d = 42;
        const char *t = bad[i];
        assert_int_equal(kd_json_to_f32(t, t + strlen(t), &f), 0);
        assert_int_equal(kd_json_to_f64(t, t + strlen(t), &d), 0);
        assert_true(f == 42 && d == 42); /* untouched */
    }
    /* A leading zero ends the token: "01" is the number 0 followed by a stray byte. */
    double d;
    assert_int_equal(kd_json_to_f64("01", "01" + 2, &d), 1);
}

static void integers(void **state)
{
    (void)state;
    struct {
        const char *tok;
        int64_t lo, hi;
        long rc;
        int64_t v;
    } cases[] = {
        {"2.0", INT64_MIN, INT64_MAX, 3, 2},
        {"1e3", INT64_MIN, INT64_MAX, 3, 1000},
        {"12.50e1", INT64_MIN, INT64_MAX, 7, 125},
        {"1.5", INT64_MIN, INT64_MAX, -2, 0},
        {"9223372036854775807", INT64_MIN, INT64_MAX, 19, INT64_MAX},
        {"9223372036854775808", INT64_MIN, INT64_MAX, -2, 0},
        {"-9223372036854775808", INT64_MIN, INT64_MAX, 20, INT64_MIN},
        {"-9223372036854775809", INT64_MIN, INT64_MAX, -2, 0},
        {"1e19", INT64_MIN, INT64_MAX, -2, 0},
        {"255", 0, 255, 3, 255},
        {"256", 0, 255, -2, 0},
        {"-1", 0, 255, -2, 0},
        {"-0", 0, 255, 2, 0},
        {"100000000000000000000e-5", INT64_MIN, INT64_MAX, 24, 1000000000000000},
        /* over 19 significant digits: exact, never through a double (which gives ...992) */
        {"9007199254740993.0000", INT64_MIN, INT64_MAX, 21, 9007199254740993},
        {"-9223372036854775808.000", INT64_MIN, INT64_MAX, 24, INT64_MIN},
        {"9223372036854775807.0000", INT64_MIN, INT64_MAX, 24, INT64_MAX},
        {"9223372036854775808.0000", INT64_MIN, INT64_MAX, -2, 0},
        {"9007199254740993.00001", INT64_MIN, INT64_MAX, -2, 0},
        {"12345678901234567800e-2", INT64_MIN, INT64_MAX, 23, 123456789012345678},
        {"12345678901234567891e-2", INT64_MIN, INT64_MAX, -2, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int64_t v = -7;
        size_t len = 0;
        const char *t = cases[i].tok;
        long rc = kd_json_to_int(t, t + strlen(t), cases[i].lo, cases[i].hi, &v, &len);
        if (rc != cases[i].rc || (rc > 0 && v != cases[i].v))
            fail_msg("'%s': rc %ld value %lld, expected rc %ld value %lld", t, rc, (long long)v, cases[i].rc,
                     (long long)cases[i].v);
    }
}

static bool accepts(const char *doc)
{
    struct kd_jscan s;
    kd_jscan_init(&s, doc, strlen(doc));
    return kd_jscan_skip(&s) == 0 && kd_jscan_finish(&s) == 0 && s.err == NULL;
}

static void grammar(void **state)
{
    (void)state;
    static const char *const good[] = {
        "{}", "[]", " [ ] ", "0", "-0.5e-3", "\"\"", "true", "false", "null",
        "{\"a\":[1,2,{\"b\":null}],\"c\":\"\\u00e9\\n\\\"\"}", "[\"\\ud83d\\ude00\"]", "\t\r\n{ \"k\" : 1 }\n",
    };
    static const char *const bad[] = {
        "", " ", "[1,]", "{\"a\":1,}", "[01]", "{'a':1}", "[NaN]", "[Infinity]", "[-Infinity]",
        "// c\n[]", "/* c */[]", "[1] x", "[1", "{\"a\"}", "{\"a\" 1}", "{1:2}", "\"a\nb\"", "\"\\x41\"",
        "\"\\ud800\"", "\"\\ude00\"", "\"\\ud800\\u0041\"", "[.5]", "[1.]", "[+1]", "tru", "nul", "[true false]",
        "\"abc", "[\"\\u12\"]", "\xef\xbb\xbf[]",
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        if (!accepts(good[i]))
            fail_msg("refused valid JSON: %s", good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (accepts(bad[i]))
            fail_msg("accepted invalid JSON: %s", bad[i]);

    /* nesting: 64 levels are fine, 65 are refused with a message and its position */
    char deep[200];
    for (int depth = 64; depth <= 65; depth++) {
        memset(deep, '[', (size_t)depth);
        memset(deep + depth, ']', (size_t)depth);
        deep[2 * depth] = '\0';
        struct kd_jscan s;
        kd_jscan_init(&s, deep, strlen(deep));
        int rc = kd_jscan_skip(&s);
        if (depth == 64) {
            assert_int_equal(rc, 0);
        } else {
            assert_int_equal(rc, -1);
            assert_string_equal(s.err, "nested too deeply");
        }
    }
}

static void strings_and_containers(void **state)
{
    (void)state;
    const char *doc = "{\"na\\u006de\": \"caf\\u00e9 \\ud83d\\ude00\", \"list\": [1, 2.5, -3], \"long\": \"abcdef\"}";
    struct kd_jscan s;
    kd_jscan_init(&s, doc, strlen(doc));
    char key[16], val[32];
    assert_int_equal(kd_jscan_object_begin(&s), 0);
    assert_int_equal(kd_jscan_member(&s, 0, key, sizeof key), 1);
    assert_string_equal(key, "name");
    assert_int_equal(kd_jscan_string(&s, val, sizeof val), 10);
    assert_memory_equal(val, "caf\xc3\xa9 \xf0\x9f\x98\x80", 11);
    assert_int_equal(kd_jscan_member(&s, 1, key, sizeof key), 1);
    assert_string_equal(key, "list");
    assert_int_equal(kd_jscan_array_begin(&s), 0);
    double sum = 0, x;
    int i = 0;
    while (kd_jscan_element(&s, i) == 1) {
        assert_int_equal(kd_jscan_f64(&s, &x), 0);
        sum += x;
        i++;
    }
    assert_int_equal(i, 3);
    assert_true(sum == 0.5);
    assert_int_equal(kd_jscan_member(&s, 2, key, sizeof key), 1);
    /* does not fit: -2, a truncated prefix, and the scanner is past the value */
    char small[4];
    assert_int_equal(kd_jscan_string(&s, small, sizeof small), -2);
    assert_string_equal(small, "abc");
    assert_int_equal(kd_jscan_member(&s, 3, key, sizeof key), 0);
    assert_int_equal(kd_jscan_finish(&s), 0);

    /* the first error sticks and says where it was */
    const char *bad = "[1, 2, ]";
    kd_jscan_init(&s, bad, strlen(bad));
    assert_int_equal(kd_jscan_skip(&s), -1);
    assert_non_null(s.err);
    assert_int_equal(s.err_at, 7);
    assert_int_equal(kd_jscan_finish(&s), -1);
}

/* Where kd_jscan_skip_lax ends (-1: it failed) and where the strict skip ends (-1: invalid). */
static void lax_and_strict(const char *doc, size_t n, long *lax, long *strict)
{
    struct kd_jscan s;
    kd_jscan_init(&s, doc, n);
    *lax = kd_jscan_skip_lax(&s) == 0 ? (long)(s.p - doc) : -1;
    kd_jscan_init(&s, doc, n);
    *strict = kd_jscan_skip(&s) == 0 ? (long)(s.p - doc) : -1;
}

static void lax_skip(void **state)
{
    (void)state;
    /* valid values: the lax skip ends where the strict one does, whatever follows */
    static const char *const good[] = {
        "[]", "{}", " [1, 2.5e3, -0] tail", "[[[]],[{}]] ,", "{\"a]\":\"}[\",\"b\":[\"\\\"]\"]}x",
        "[\"\\\\\"]]", "[\"\\\\\\\"]\"] ]", "{\"k\":{\"k\":{\"k\":[true,false,null]}}}}}",
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        long lax, strict;
        lax_and_strict(good[i], strlen(good[i]), &lax, &strict);
        if (strict < 0 || lax != strict)
            fail_msg("'%s': lax skip ends at %ld, strict at %ld", good[i], lax, strict);
    }
    /* what it does not check it lets through; what it follows must be whole */
    static const char *const loose[] = {"[1,,]", "[01]", "[}", "{1:2}", "[nonsense]"};
    for (size_t i = 0; i < sizeof loose / sizeof *loose; i++) {
        long lax, strict;
        lax_and_strict(loose[i], strlen(loose[i]), &lax, &strict);
        assert_int_equal(lax, (long)strlen(loose[i]));
        assert_int_equal(strict, -1);
    }
    static const char *const cut[] = {"", "1", "\"[]\"", "[", "[[]", "[\"]", "[\"\\\"]", "[\"\\", "{\"a\":[1}"};
    for (size_t i = 0; i < sizeof cut / sizeof *cut; i++) {
        struct kd_jscan s;
        kd_jscan_init(&s, cut[i], strlen(cut[i]));
        if (kd_jscan_skip_lax(&s) != -1 || !s.err)
            fail_msg("'%s': the lax skip should fail", cut[i]);
    }
    /* A long array, so the 16-byte steps run, with a bracket or quote at every offset of a step. */
    for (int at = 0; at < 40; at++) {
        char doc[128];
        int n = 0;
        doc[n++] = '[';
        for (int k = 0; k < at; k++)
            doc[n++] = k % 3 == 2 ? '\n' : ' ';
        const char *inner = at % 3 == 0 ? "[1]" : at % 3 == 1 ? "{\"}\":\"]\"}" : "\"[\"";
        memcpy(doc + n, inner, strlen(inner));
        n += (int)strlen(inner);
        doc[n++] = ']';
        memcpy(doc + n, " ,]]]]]]]]]]]]]]]]]]", 20);
        n += 20;
        long lax, strict;
        lax_and_strict(doc, (size_t)n, &lax, &strict);
        if (strict < 0 || lax != strict)
            fail_msg("'%.*s': lax skip ends at %ld, strict at %ld", n, doc, lax, strict);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(numbers_hard_cases),
        cmocka_unit_test(numbers_random),
        cmocka_unit_test(numbers_near_midpoints),
        cmocka_unit_test(numbers_fast_path_edges),
        cmocka_unit_test(numbers_digit_runs),
        cmocka_unit_test(numbers_not_json),
        cmocka_unit_test(integers),
        cmocka_unit_test(grammar),
        cmocka_unit_test(strings_and_containers),
        cmocka_unit_test(lax_skip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
