/*
 * api/jscan.c — the strict in-place JSON scanner and exact number conversion (see jscan.h).
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jscan-impl.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

void kd_jscan_init(struct kd_jscan *s, const char *p, size_t len)
{
    s->start = s->p = p ? p : "";
    s->end = s->p + (p ? len : 0);
    s->depth = 0;
    s->err = NULL;
    s->err_at = 0;
    s->keys = NULL;
    s->errbuf[0] = '\0';
}

int kd_jscan_fail(struct kd_jscan *s, const char *why)
{
    if (!s->err) {
        s->err = why;
        s->err_at = (size_t)(s->p - s->start);
    }
    s->p = s->end; /* nothing after the first error is read */
    for (struct kd_jkeys *k = s->keys; k; k = k->outer) {
        free(k->heap); /* its object never closes now */
        k->heap = NULL;
    }
    s->keys = NULL;
    return -1;
}

static void ws(struct kd_jscan *s)
{
    const char *p = s->p;
    while (p < s->end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    s->p = p;
}

enum kd_jtype kd_jscan_peek(struct kd_jscan *s)
{
    ws(s);
    if (s->err || s->p >= s->end)
        return KD_J_NONE;
    switch (*s->p) {
    case '{': return KD_J_OBJECT;
    case '[': return KD_J_ARRAY;
    case '"': return KD_J_STRING;
    case 't': return KD_J_TRUE;
    case 'f': return KD_J_FALSE;
    case 'n': return KD_J_NULL;
    case '-': return KD_J_NUMBER;
    default: return *s->p >= '0' && *s->p <= '9' ? KD_J_NUMBER : KD_J_NONE;
    }
}

int kd_jscan_finish(struct kd_jscan *s)
{
    ws(s);
    if (s->err)
        return -1;
    return s->p == s->end ? 0 : kd_jscan_fail(s, "unexpected bytes after the JSON value");
}

/* ---- numbers ------------------------------------------------------------------------------- */

struct num {
    bool neg, integer, many;    /* many: more than 19 significant digits */
    int nd;                     /* significant digits in m */
    uint64_t m;
    int64_t e10;                /* value = m * 10^e10 (when !many) */
};

static inline bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/*
 * Eight ASCII digits at p as their value, or -1 when the eight bytes are not all digits. A
 * float printed as a double has 17 significant digits, and m = 10 m + d per digit is a chain of
 * dependent multiplies; this takes three for eight digits. Bytes load little-endian, so the
 * first digit is the lowest byte.
 */
static inline int64_t eight_digits(const char *p)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t v;
    memcpy(&v, p, sizeof v);
    /* every high nibble 3 (0x30-0x3f), and no low nibble above 9 (adding 6 would carry into it) */
    if ((v & 0xF0F0F0F0F0F0F0F0u) != 0x3030303030303030u ||
        ((v + 0x0606060606060606u) & 0xF0F0F0F0F0F0F0F0u) != 0x3030303030303030u)
        return -1;
    v -= 0x3030303030303030u;
    v = (v * 10 + (v >> 8)) & 0x00FF00FF00FF00FFu;   /* 16-bit lanes of two digits, 0..99 */
    v = (v * 100 + (v >> 16)) & 0x0000FFFF0000FFFFu; /* 32-bit lanes of four, 0..9999 */
    return (int64_t)((v & 0xFFFFFFFFu) * 10000 + (v >> 32));
#else
    (void)p;
    return -1;
#endif
}

/* Eight more significant digits at q, when they are there and m has room for them. */
static inline bool take_eight(const char *q, const char *end, struct num *n)
{
    if (n->nd > 11 || end - q < 8)
        return false;
    int64_t c = eight_digits(q);
    if (c < 0)
        return false;
    n->m = n->m * 100000000u + (uint64_t)c;
    n->nd += 8;
    return true;
}

/* Lexes one JSON number: its length, or 0 when none starts at p. */
static size_t lex_number(const char *p, const char *end, struct num *n)
{
    const char *q = p;
    int64_t frac = 0, exp = 0;
    n->neg = n->many = false;
    n->integer = true;
    n->nd = 0;
    n->m = 0;
    if (q < end && *q == '-') {
        n->neg = true;
        q++;
    }
    if (q >= end || !is_digit(*q))
        return 0;
    if (*q == '0') {
        q++;
    } else {
        for (;;) {
            if (take_eight(q, end, n)) {
                q += 8;
                continue;
            }
            if (q >= end || !is_digit(*q))
                break;
            if (n->nd < 19) {
                n->m = n->m * 10 + (uint64_t)(*q - '0');
                n->nd++;
            } else {
                n->many = true;
            }
            q++;
        }
    }
    if (q < end && *q == '.') {
        q++;
        if (q >= end || !is_digit(*q))
            return 0;
        n->integer = false;
        for (;;) {
            /* past any leading zeros, every digit is significant */
            if ((n->nd > 0 || (q < end && *q != '0')) && take_eight(q, end, n)) {
                frac += 8;
                q += 8;
                continue;
            }
            if (q >= end || !is_digit(*q))
                break;
            if (n->nd == 0 && *q == '0') {
                frac++; /* a leading zero only moves the point */
            } else if (n->nd < 19) {
                n->m = n->m * 10 + (uint64_t)(*q - '0');
                n->nd++;
                frac++;
            } else {
                n->many = true;
            }
            q++;
        }
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        bool eneg = false;
        q++;
        if (q < end && (*q == '+' || *q == '-'))
            eneg = *q++ == '-';
        if (q >= end || !is_digit(*q))
            return 0;
        n->integer = false;
        for (; q < end && is_digit(*q); q++)
            if (exp < 100000000)
                exp = exp * 10 + (*q - '0'); /* far beyond any finite double; saturating is exact enough */
        if (eneg)
            exp = -exp;
    }
    n->e10 = exp - frac;
    return (size_t)(q - p);
}

/* strtof / strtod need a terminated string; the token is copied (on the stack when short). */
static int slow_convert(const char *p, size_t len, bool single, double *d, float *f)
{
    char small[128], *buf = small;
    if (len >= sizeof small && !(buf = malloc(len + 1)))
        return -1;
    memcpy(buf, p, len);
    buf[len] = '\0';
    if (single)
        *f = strtof(buf, NULL);
    else
        *d = strtod(buf, NULL);
    if (buf != small)
        free(buf);
    return 0;
}

#if LDBL_MANT_DIG >= 64
/* 10^0 .. 10^27: 5^27 < 2^64, so each is exact in a 64-bit significand. */
static const long double p10[] = {
    1e0L,  1e1L,  1e2L,  1e3L,  1e4L,  1e5L,  1e6L,  1e7L,  1e8L,  1e9L,  1e10L, 1e11L, 1e12L, 1e13L,
    1e14L, 1e15L, 1e16L, 1e17L, 1e18L, 1e19L, 1e20L, 1e21L, 1e22L, 1e23L, 1e24L, 1e25L, 1e26L, 1e27L,
};

/*
 * m and 10^|e10| are exact, so one multiply or divide gives the decimal value correctly rounded
 * to long double. Rounding that again to a narrower type is correct unless the long double is
 * exactly a midpoint of the narrower type (every such midpoint lies on the long double grid, so
 * the value and its long double are never on opposite sides of one).
 */
static bool scaled(const struct num *n, long double *v)
{
    if (n->many || n->e10 < -27 || n->e10 > 27)
        return false;
    long double m = (long double)n->m;
    *v = n->e10 >= 0 ? m * p10[n->e10] : m / p10[-n->e10];
    return true;
}
#endif

#if FLT_EVAL_METHOD == 0
/* 10^0 .. 10^22: 5^22 < 2^53, so each is exact in a double. */
static const double p10d[] = {
    1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
};

/*
 * Clinger's fast path: when m <= 2^53 and |e10| <= 22, m and 10^|e10| are exact doubles, so one
 * IEEE multiply or divide (evaluated in double: FLT_EVAL_METHOD 0) rounds the decimal value
 * once, correctly. Most numbers a client sends (a few significant digits, a small exponent) take
 * it; it costs a fraction of the long double path.
 */
static bool fast_double(const struct num *n, double *v)
{
    if (n->many || n->m > (uint64_t)1 << 53 || n->e10 < -22 || n->e10 > 22)
        return false;
    double m = (double)n->m;
    *v = n->e10 >= 0 ? m * p10d[n->e10] : m / p10d[-n->e10];
    return true;
}

/*
 * For a float the double only has to land on the right side of every float rounding midpoint,
 * so a mantissa past 2^53 (up to 19 digits: the "17 significant digits" of a float printed as a
 * double, which is what most JSON encoders send) works too. Rounding m to double and then the
 * product or quotient puts v within (2u + u^2)|x| of the decimal value x (u = 2^-53), under 2 of
 * v's ulps (under 3 even if the integer conversion truncated). A float midpoint has 25 significant
 * bits, so in a double it reads as low 29 mantissa bits 1 followed by 28 zeros; when v is more
 * than 4 ulps from that pattern, no midpoint lies between v and x (the nearest one across a
 * binade boundary is 2^27 ulps away), and rounding v to float rounds x. With m <= 2^53, v is x
 * correctly rounded, and only v exactly on a midpoint is unsafe. Both hold for normal floats only:
 * the nonzero values here lie in [1e-22, 1e41], and the overflow threshold is itself a midpoint.
 */
static bool fast_float(const struct num *n, float *f)
{
    if (n->many || n->e10 < -22 || n->e10 > 22)
        return false;
    double v = (double)n->m;
    v = n->e10 >= 0 ? v * p10d[n->e10] : v / p10d[-n->e10];
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    uint64_t off = (bits & 0x1FFFFFFFu) - 0x10000000u + 4u; /* wraps when far below the midpoint */
    if (n->m <= (uint64_t)1 << 53 ? (bits & 0x1FFFFFFFu) == 0x10000000u : off <= 8u)
        return false;
    *f = (float)v;
    return true;
}
#endif

/*
 * The number lexed from [p, p + len) as a float (single) or a double, correctly rounded: by
 * Clinger's fast path in double when it applies, else exactly from the long double when that
 * rounding is safe, else through strtof / strtod. The length, or -1 when the fallback cannot
 * copy the token.
 */
static long convert(const char *p, size_t len, const struct num *n, bool single, float *f, double *d)
{
    if (!n->many && n->m == 0) {
        if (single)
            *f = n->neg ? -0.0f : 0.0f;
        else
            *d = n->neg ? -0.0 : 0.0;
        return (long)len;
    }
#if FLT_EVAL_METHOD == 0
    if (single) {
        float x;
        if (fast_float(n, &x)) {
            *f = n->neg ? -x : x;
            return (long)len;
        }
    } else {
        double x;
        if (fast_double(n, &x)) {
            *d = n->neg ? -x : x;
            return (long)len;
        }
    }
#endif
#if LDBL_MANT_DIG >= 64
    long double v;
    if (scaled(n, &v)) {
        /* r: v rounded to the target type (in long double); g: its neighbour on v's side */
        long double r, g;
        if (single) {
            float x = (float)v;
            r = x;
            g = nextafterf(x, v > r ? INFINITY : -INFINITY);
        } else {
            double x = (double)v;
            r = x;
            g = nextafter(x, v > r ? INFINITY : -INFINITY);
        }
        if (!isinf(r) && (r == v || (r + g) / 2 != v)) {
            if (single)
                *f = n->neg ? -(float)r : (float)r;
            else
                *d = n->neg ? -(double)r : (double)r;
            return (long)len;
        }
    }
#endif
    return slow_convert(p, len, single, d, f) == 0 ? (long)len : -1;
}

long kd_json_to_f32(const char *p, const char *end, float *out)
{
    struct num n;
    size_t len = lex_number(p, end, &n);
    double unused;
    return len ? convert(p, len, &n, true, out, &unused) : 0;
}

long kd_json_to_f64(const char *p, const char *end, double *out)
{
    struct num n;
    size_t len = lex_number(p, end, &n);
    float unused;
    return len ? convert(p, len, &n, false, &unused, out) : 0;
}

/*
 * The value of the JSON number token [p, end) (already checked against the grammar) as a sign
 * and a magnitude, from its digits: "1e3" and "2.50e1" are whole numbers, "2.5" is not. No step
 * goes through a double, so nothing is rounded.
 */
enum kd_json_whole kd_json_whole_of(const char *p, const char *end, bool *negative, uint64_t *magnitude)
{
    *negative = p < end && *p == '-';
    if (*negative)
        p++;
    char digits[64]; /* the significant digits, without leading zeros: more than 20 cannot fit */
    size_t ndigits = 0;
    long long scale = 0; /* the kept digits times 10^scale: the value, less any digit dropped */
    bool dropped_nonzero = false, point = false;
    for (; p < end && ((*p >= '0' && *p <= '9') || *p == '.'); p++) {
        if (*p == '.') {
            point = true;
            continue;
        }
        if (point)
            scale--;
        if (ndigits == 0 && *p == '0')
            continue;
        if (ndigits < sizeof digits) {
            digits[ndigits++] = *p;
        } else {
            scale++;
            dropped_nonzero = dropped_nonzero || *p != '0';
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        bool exp_negative = p < end && *p == '-';
        if (p < end && (*p == '-' || *p == '+'))
            p++;
        long long exponent = 0;
        for (; p < end && *p >= '0' && *p <= '9'; p++)
            if (exponent < 1000000000)
                exponent = exponent * 10 + (*p - '0');
        scale += exp_negative ? -exponent : exponent;
    }
    *magnitude = 0;
    /* Over 64 significant digits, a whole number would have more than 20: past 2^64 - 1. */
    if (dropped_nonzero)
        return (long long)ndigits + scale > 20 ? KD_WHOLE_TOO_BIG : KD_WHOLE_FRACTION;
    while (ndigits > 0 && digits[ndigits - 1] == '0') {
        ndigits--;
        scale++;
    }
    if (ndigits == 0)
        return KD_WHOLE_OK; /* zero, whatever its exponent */
    if (scale < 0)
        return KD_WHOLE_FRACTION;
    if ((long long)ndigits + scale > 20)
        return KD_WHOLE_TOO_BIG;
    uint64_t m = 0;
    for (size_t i = 0; i < ndigits; i++) {
        unsigned d = (unsigned)(digits[i] - '0');
        if (m > (UINT64_MAX - d) / 10)
            return KD_WHOLE_TOO_BIG;
        m = m * 10 + d;
    }
    for (long long i = 0; i < scale; i++) {
        if (m > UINT64_MAX / 10)
            return KD_WHOLE_TOO_BIG;
        m *= 10;
    }
    *magnitude = m;
    return KD_WHOLE_OK;
}

long kd_json_to_int(const char *p, const char *end, int64_t lo, int64_t hi, int64_t *out, size_t *lenp)
{
    struct num n;
    size_t len = lex_number(p, end, &n);
    if (!len)
        return 0;
    *lenp = len;
    int64_t v;
    if (!n.many) {
        uint64_t m = n.m;
        int64_t e = n.e10;
        if (m != 0) {
            for (; e < 0; e++) { /* "12.50e1": trailing zeros of m absorb a negative exponent */
                if (m % 10)
                    return -2;
                m /= 10;
            }
            for (; e > 0; e--) {
                if (m > UINT64_MAX / 10)
                    return -2;
                m *= 10;
            }
        }
        if (n.neg) {
            if (m > (uint64_t)INT64_MAX + 1)
                return -2;
            v = m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m;
        } else {
            if (m > (uint64_t)INT64_MAX)
                return -2;
            v = (int64_t)m;
        }
    } else {
        /* Over 19 significant digits ("9007199254740993.0000"): digit by digit, since a double
         * would round it. */
        bool neg;
        uint64_t m;
        if (kd_json_whole_of(p, p + len, &neg, &m) != KD_WHOLE_OK)
            return -2;
        if (neg ? m > (uint64_t)INT64_MAX + 1 : m > (uint64_t)INT64_MAX)
            return -2;
        v = !neg ? (int64_t)m : m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m;
    }
    if (v < lo || v > hi)
        return -2;
    *out = v;
    return (long)len;
}

int kd_jscan_f64(struct kd_jscan *s, double *out)
{
    ws(s);
    if (s->err)
        return -1;
    long len = kd_json_to_f64(s->p, s->end, out);
    if (len <= 0)
        return kd_jscan_fail(s, len < 0 ? "out of memory" : "invalid number");
    s->p += len;
    return 0;
}

/* ---- strings ------------------------------------------------------------------------------- */

static int hex4(const char *p, const char *end, unsigned *v)
{
    if (end - p < 4)
        return -1;
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                            : 16u;
        if (d > 15)
            return -1;
        *v = *v << 4 | d;
    }
    return 0;
}

static const char *str_fail(struct kd_jscan *s, const char *at, const char *why)
{
    s->p = at; /* err_at */
    kd_jscan_fail(s, why);
    return NULL;
}

/*
 * One character of a string at p (not its closing quote), unescaped into enc (*k bytes): where
 * the next one starts, or NULL with s failed.
 */
const char *kd_jscan_str_char(struct kd_jscan *s, const char *p, char enc[4], size_t *k)
{
    const char *end = s->end;
    unsigned char c = (unsigned char)*p;
    *k = 1;
    if (c < 0x20)
        return str_fail(s, p, "control character inside a string");
    if (c != '\\') {
        enc[0] = (char)c;
        return p + 1;
    }
    if (end - p < 2)
        return str_fail(s, p, "unterminated string");
    static const char esc[] = "\"\"\\\\//b\bf\fn\nr\rt\t"; /* each escape letter, then its byte */
    char e = p[1];
    p += 2;
    for (int i = 0; i < 16; i += 2)
        if (esc[i] == e)
            return enc[0] = esc[i + 1], p;
    if (e != 'u')
        return str_fail(s, p - 1, "bad escape in a string");
    unsigned cp, lo;
    if (hex4(p, end, &cp) != 0)
        return str_fail(s, p, "bad \\u escape");
    p += 4;
    if (cp >= 0xDC00 && cp <= 0xDFFF)
        return str_fail(s, p, "unpaired surrogate escape");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, end, &lo) != 0 || lo < 0xDC00 || lo > 0xDFFF)
            return str_fail(s, p, "unpaired surrogate escape");
        p += 6;
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    }
    /* UTF-8: six bits a continuation byte from the end, the rest under the lead byte's marker
     * (0xC0, 0xE0 or 0xF0 for 2, 3 or 4 bytes: 0xFF00 >> k) */
    *k = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    for (size_t i = *k; i-- > 1; cp >>= 6)
        enc[i] = (char)(0x80 | (cp & 0x3F));
    enc[0] = (char)(*k == 1 ? cp : (0xFF00u >> *k & 0xFF) | cp);
    return p;
}

long kd_jscan_string(struct kd_jscan *s, char *out, size_t cap)
{
    ws(s);
    if (s->err)
        return -1;
    if (s->p >= s->end || *s->p != '"')
        return kd_jscan_fail(s, "expected a string");
    const char *p = s->p + 1, *end = s->end;
    size_t n = 0;
    bool over = false;
    for (;;) {
        if (p >= end) {
            s->p = p;
            return kd_jscan_fail(s, "unterminated string");
        }
        if (*p == '"') {
            p++;
            break;
        }
        char enc[4];
        size_t k = 1;
        if ((unsigned char)*p >= 0x20 && *p != '\\') /* a plain byte: no call for it */
            enc[0] = *p++;
        else if (!(p = kd_jscan_str_char(s, p, enc, &k)))
            return -1;
        if (!over && out && n + k < cap)
            memcpy(out + n, enc, k);
        else
            over = true;
        if (!over)
            n += k;
    }
    s->p = p;
    if (!out)
        return 0;
    if (over && cap) {
        /* Valid but too long: keep whole UTF-8 characters of the prefix only. */
        size_t t = n;
        while (t > 0 && ((unsigned char)out[t - 1] & 0xC0) == 0x80)
            t--;
        if (t > 0 && (unsigned char)out[t - 1] >= 0xC0) {
            unsigned char lead = (unsigned char)out[t - 1];
            size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
            if (n - (t - 1) < need)
                n = t - 1;
        }
    }
    if (cap)
        out[n] = '\0';
    return over ? -2 : (long)n;
}

/* ---- containers ---------------------------------------------------------------------------- */

static int open_bracket(struct kd_jscan *s, char c, const char *what)
{
    ws(s);
    if (s->err)
        return -1;
    if (s->p >= s->end || *s->p != c)
        return kd_jscan_fail(s, what);
    if (s->depth >= KD_JSCAN_MAX_DEPTH)
        return kd_jscan_fail(s, "nested too deeply");
    s->depth++;
    s->p++;
    return 0;
}

int kd_jscan_object_begin(struct kd_jscan *s)
{
    return open_bracket(s, '{', "expected an object");
}

/* Not inlined: GCC's -Wdangling-pointer takes kd_jscan_skip's keys for one that outlives it, not
 * seeing that the object's close (or the scanner's failure) always takes it back out. */
__attribute__((noinline)) int kd_jscan_object_begin_keys(struct kd_jscan *s, struct kd_jkeys *keys)
{
    if (open_bracket(s, '{', "expected an object") != 0)
        return -1;
    keys->outer = s->keys; /* (at[] is left as it is: n says how much of it counts) */
    keys->depth = s->depth;
    keys->n = keys->cap = 0;
    keys->heap = NULL;
    s->keys = keys;
    return 0;
}

int kd_jscan_array_begin(struct kd_jscan *s)
{
    return open_bracket(s, '[', "expected an array");
}

int kd_jscan_member(struct kd_jscan *s, int i, char *key, size_t cap)
{
    ws(s);
    if (s->err)
        return -1;
    if (s->p < s->end && *s->p == '}' && i >= 0) {
        s->p++;
        struct kd_jkeys *k = s->keys && s->keys->depth == s->depth ? s->keys : NULL;
        s->depth--;
        return k && kd_jscan_keys_close(s, k) != 0 ? -1 : 0;
    }
    if (i > 0) {
        if (s->p >= s->end || *s->p != ',')
            return kd_jscan_fail(s, "expected ',' or '}'");
        s->p++;
        ws(s);
    }
    if (s->p >= s->end || *s->p != '"')
        return kd_jscan_fail(s, "expected a string key");
    const char *at = s->p;
    if (kd_jscan_string(s, key, cap) == -1)
        return -1;
    ws(s);
    if (s->p >= s->end || *s->p != ':')
        return kd_jscan_fail(s, "expected ':'");
    s->p++;
    if (s->keys && s->keys->depth == s->depth && kd_jscan_key_add(s, s->keys, at) != 0)
        return -1;
    return 1;
}

int kd_jscan_element(struct kd_jscan *s, int i)
{
    ws(s);
    if (s->err)
        return -1;
    if (s->p < s->end && *s->p == ']') {
        s->p++;
        s->depth--;
        return 0;
    }
    if (i > 0) {
        if (s->p >= s->end || *s->p != ',')
            return kd_jscan_fail(s, "expected ',' or ']'");
        s->p++;
    }
    return 1;
}

static int literal(struct kd_jscan *s, const char *word, size_t n)
{
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0)
        return kd_jscan_fail(s, "expected a value");
    s->p += n;
    return 0;
}

int kd_jscan_skip(struct kd_jscan *s)
{
    int r, i;
    switch (kd_jscan_peek(s)) {
    case KD_J_OBJECT: {
        struct kd_jkeys keys;
        if (kd_jscan_object_begin_keys(s, &keys) != 0)
            return -1;
        for (i = 0; (r = kd_jscan_member(s, i, NULL, 0)) > 0; i++)
            if (kd_jscan_skip(s) != 0)
                return -1;
        return r;
    }
    case KD_J_ARRAY:
        if (kd_jscan_array_begin(s) != 0)
            return -1;
        for (i = 0; (r = kd_jscan_element(s, i)) > 0; i++)
            if (kd_jscan_skip(s) != 0)
                return -1;
        return r;
    case KD_J_STRING: return kd_jscan_string(s, NULL, 0) == -1 ? -1 : 0;
    case KD_J_NUMBER: {
        struct num n;
        size_t len = lex_number(s->p, s->end, &n);
        if (!len)
            return kd_jscan_fail(s, "invalid number");
        s->p += len;
        return 0;
    }
    case KD_J_TRUE: return literal(s, "true", 4);
    case KD_J_FALSE: return literal(s, "false", 5);
    case KD_J_NULL: return literal(s, "null", 4);
    default: return kd_jscan_fail(s, "expected a value");
    }
}

/* ---- the lax skip -------------------------------------------------------------------------- */

/* The first of [ ] { } " at or after p, or end. */
static const char *next_structural(const char *p, const char *end)
{
#if defined(__SSE2__)
    /* 16 bytes a step: '{' and '}' differ from '[' and ']' only in bit 5, so clearing it folds
     * the four brackets onto two compares. */
    const __m128i fold = _mm_set1_epi8((char)0xDF), open = _mm_set1_epi8('['), close = _mm_set1_epi8(']'),
                  quote = _mm_set1_epi8('"');
    for (; end - p >= 16; p += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
        __m128i f = _mm_and_si128(v, fold);
        __m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(f, open), _mm_cmpeq_epi8(f, close)),
                                   _mm_cmpeq_epi8(v, quote));
        unsigned mask = (unsigned)_mm_movemask_epi8(hit);
        if (mask)
            return p + __builtin_ctz(mask);
    }
#endif
    for (; p < end; p++)
        if (*p == '[' || *p == ']' || *p == '{' || *p == '}' || *p == '"')
            return p;
    return end;
}

int kd_jscan_skip_lax(struct kd_jscan *s)
{
    ws(s);
    if (s->err)
        return -1;
    if (s->p >= s->end || (*s->p != '[' && *s->p != '{'))
        return kd_jscan_fail(s, "expected an array or an object");
    const char *p = s->p + 1, *end = s->end;
    size_t depth = 1;
    while ((p = next_structural(p, end)) < end) {
        char c = *p++;
        if (c == '"') {
            while (p < end && *p != '"')
                p += *p == '\\' && end - p >= 2 ? 2 : 1; /* an escape may hide a quote */
            if (p >= end)
                break;
            p++;
        } else if (c == '[' || c == '{') {
            depth++;
        } else if (--depth == 0) {
            s->p = p;
            return 0;
        }
    }
    s->p = end;
    return kd_jscan_fail(s, "unterminated array or object");
}
