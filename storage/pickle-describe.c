/*
 * storage/pickle-describe.c — a pickled value as Python's repr writes it, for the non-tensor
 * leaves a .pt file lists (kiln_torch_other_value): floats with the fewest digits that read
 * back, strings quoted and escaped as repr does, integers of any size.
 */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pickle-impl.h"
#include "pickle-vm.h"

/* A float as Python's repr writes it: the fewest digits that read back as the same double,
 * positional while the decimal exponent is in [-4, 16), else d.ddde+XX; an integral value
 * keeps ".0" so that 2.0 is not read as the int 2; "-0.0", "inf", "nan". */
static void python_float(double f, char *buf, size_t len)
{
    if (f != f) {
        snprintf(buf, len, "nan");
        return;
    }
    if (f == HUGE_VAL || f == -HUGE_VAL) {
        snprintf(buf, len, "%sinf", f < 0 ? "-" : "");
        return;
    }
    char sci[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(sci, sizeof sci, "%.*e", p - 1, f);
        if (strtod(sci, NULL) == f)
            break;
    }
    /* sci: [-]d[.ddd]e(+|-)XX: the digits without the point, and the exponent */
    const char *m = sci + (sci[0] == '-');
    char digits[24];
    size_t nd = 0;
    for (const char *c = m; *c && *c != 'e' && nd + 1 < sizeof digits; c++)
        if (*c != '.')
            digits[nd++] = *c;
    digits[nd] = '\0';
    int e = atoi(strchr(sci, 'e') + 1);
    const char *sign = sci[0] == '-' ? "-" : "";
    if (e < -4 || e >= 16) {
        snprintf(buf, len, "%s%c%s%.*s%c%c%02d", sign, digits[0], nd > 1 ? "." : "", (int)(nd - 1), digits + 1,
                 'e', e < 0 ? '-' : '+', e < 0 ? -e : e);
    } else if (e < 0) { /* 0.000ddd: -e - 1 zeros after the point (at most 3) */
        snprintf(buf, len, "%s0.%.*s%s", sign, -e - 1, "000", digits);
    } else if ((size_t)e + 1 >= nd) { /* ddd000.0: e + 1 - nd zeros (at most 15) */
        snprintf(buf, len, "%s%s%.*s.0", sign, digits, (int)((size_t)e + 1 - nd), "000000000000000");
    } else {
        snprintf(buf, len, "%s%.*s.%s", sign, e + 1, digits, digits + e + 1);
    }
}

/* A str as Python's repr writes it: single quotes unless it holds ' and no ", backslash
 * escapes for \\, \n, \r, \t, the quote and other control bytes (\xhh); other bytes as they
 * are (UTF-8). Cut with "..." where buf is too short. */
static void python_str(const char *s, size_t n, char *buf, size_t len)
{
    if (len < 8) {
        if (len)
            buf[0] = '\0';
        return;
    }
    bool single = memchr(s, '\'', n) == NULL || memchr(s, '"', n) != NULL;
    char q = single ? '\'' : '"';
    size_t o = 0;
    buf[o++] = q;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '\\' || c == (unsigned char)q)
            snprintf(esc, sizeof esc, "\\%c", c);
        else if (c == '\n' || c == '\r' || c == '\t')
            snprintf(esc, sizeof esc, "\\%c", c == '\n' ? 'n' : c == '\r' ? 'r' : 't');
        else if (c < 0x20 || c == 0x7f)
            snprintf(esc, sizeof esc, "\\x%02x", c);
        else
            esc[0] = (char)c, esc[1] = '\0';
        size_t k = strlen(esc);
        if (o + k + 5 > len) { /* room for ...' and the NUL */
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        memcpy(buf + o, esc, k);
        o += k;
    }
    buf[o++] = q;
    buf[o] = '\0';
}

void kiln__pk_describe(const kiln__pk_value *v, char *buf, size_t len)
{
    if (!len)
        return;
    switch (v ? v->kind : KILN__PK_NONE) {
    case KILN__PK_NONE: snprintf(buf, len, "None"); break;
    case KILN__PK_BOOL: snprintf(buf, len, "%s", v->u.b ? "True" : "False"); break;
    case KILN__PK_INT: snprintf(buf, len, "%" PRId64, v->u.i); break;
    case KILN__PK_BIGINT: snprintf(buf, len, "%s", v->u.str.s); break;
    case KILN__PK_FLOAT: python_float(v->u.f, buf, len); break;
    case KILN__PK_STR: python_str(v->u.str.s, v->u.str.len, buf, len); break;
    case KILN__PK_BYTES: snprintf(buf, len, "<%zu bytes>", v->u.str.len); break;
    case KILN__PK_TUPLE: snprintf(buf, len, "<tuple of %zu>", v->u.seq.n); break;
    case KILN__PK_LIST: snprintf(buf, len, "<list of %zu>", v->u.seq.n); break;
    case KILN__PK_DICT: snprintf(buf, len, "<dict of %zu>", v->u.dict.n); break;
    case KILN__PK_GLOBAL: {
        char g[96];
        snprintf(buf, len, "<%s>", kiln__pk_global_name(v->u.global, g, sizeof g));
        break;
    }
    case KILN__PK_STORAGE: snprintf(buf, len, "<storage '%s'>", v->u.storage.key); break;
    case KILN__PK_TENSOR: snprintf(buf, len, "<tensor>"); break;
    }
}
