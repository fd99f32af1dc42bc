/*
 * storage/pickle.c — a restricted unpickler for PyTorch weight files.
 *
 * Python's pickle is a small stack machine whose GLOBAL and REDUCE opcodes can call any
 * function in any module, which is why loading an untrusted .pt file with pickle runs
 * arbitrary code. This interpreter keeps the data opcodes (ints, floats, strings,
 * tuples, lists, dicts, the memo) and replaces the call machinery with a fixed table:
 * a global resolves only if it is one of the few a state_dict needs, and "calling" one
 * builds a plain value here. Nothing else is ever looked up, so a file that names
 * os.system, builtins.eval or any other callable is refused before anything runs.
 *
 * The input is hostile: every read is bounds-checked, every length is checked against
 * the remaining bytes and the limits before allocating, and the number of values, the
 * stack, the marks and the memo are bounded (kiln__pickle_limits), so memory use is
 * linear in the input and capped. Errors read "pickle: <problem> (<source>, byte N)".
 * The machine is here; the globals a weights file may name, and what calling them builds,
 * are in pickle-torch.c, and values as Python prints them in pickle-describe.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error-impl.h"
#include "pickle-impl.h"
#include "pickle-vm.h"

/* Opcode bytes, from the pickle protocol definition (protocols 0-5). */
enum {
    OP_MARK = '(', OP_STOP = '.', OP_POP = '0', OP_POP_MARK = '1', OP_DUP = '2',
    OP_INT = 'I', OP_BININT = 'J', OP_BININT1 = 'K', OP_LONG = 'L', OP_BININT2 = 'M',
    OP_NONE = 'N', OP_PERSID = 'P', OP_BINPERSID = 'Q', OP_REDUCE = 'R',
    OP_BINSTRING = 'T', OP_SHORT_BINSTRING = 'U', OP_BINUNICODE = 'X', OP_APPEND = 'a',
    OP_BUILD = 'b', OP_GLOBAL = 'c', OP_DICT = 'd', OP_EMPTY_DICT = '}', OP_APPENDS = 'e',
    OP_GET = 'g', OP_BINGET = 'h', OP_LONG_BINGET = 'j', OP_LIST = 'l', OP_EMPTY_LIST = ']',
    OP_PUT = 'p', OP_BINPUT = 'q', OP_LONG_BINPUT = 'r', OP_SETITEM = 's', OP_TUPLE = 't',
    OP_EMPTY_TUPLE = ')', OP_SETITEMS = 'u', OP_BINFLOAT = 'G',
    OP_PROTO = 0x80, OP_NEWOBJ = 0x81, OP_TUPLE1 = 0x85, OP_TUPLE2 = 0x86, OP_TUPLE3 = 0x87,
    OP_NEWTRUE = 0x88, OP_NEWFALSE = 0x89, OP_LONG1 = 0x8a, OP_LONG4 = 0x8b,
    OP_BINBYTES = 'B', OP_SHORT_BINBYTES = 'C',
    OP_SHORT_BINUNICODE = 0x8c, OP_BINUNICODE8 = 0x8d, OP_BINBYTES8 = 0x8e, OP_EMPTY_SET = 0x8f,
    OP_ADDITEMS = 0x90, OP_FROZENSET = 0x91, OP_STACK_GLOBAL = 0x93, OP_MEMOIZE = 0x94,
    OP_FRAME = 0x95, OP_BYTEARRAY8 = 0x96,
};

int kiln__pk_fail(pk_state *s, const char *fmt, ...)
{
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiln__error_set("pickle: %s (%s, byte %zu)", msg, s->label, s->op_pos);
}

int kiln__pk_oom(pk_state *s)
{
    return kiln__pk_fail(s, "out of memory");
}

/* Grow *arr (of elem-sized items, capacity *cap) to hold at least need items. */
static int pk_reserve(pk_state *s, void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t ncap = *cap ? *cap : 8;
    while (ncap < need)
        ncap *= 2;
    if (ncap > SIZE_MAX / elem)
        return kiln__pk_oom(s);
    void *n = realloc(*arr, ncap * elem);
    if (!n)
        return kiln__pk_oom(s);
    *arr = n;
    *cap = ncap;
    return 0;
}

kiln__pk_value *kiln__pk_new(pk_state *s, kiln__pk_kind kind)
{
    if (s->nobjects >= s->lim.max_objects) {
        kiln__pk_fail(s, "more than %zu values", s->lim.max_objects);
        return NULL;
    }
    pk_obj *o = calloc(1, sizeof *o);
    if (!o) {
        kiln__pk_oom(s);
        return NULL;
    }
    o->next = s->out->objects;
    s->out->objects = o;
    s->nobjects++;
    o->v.kind = kind;
    return &o->v;
}

static int pk_push(pk_state *s, kiln__pk_value *v)
{
    if (!v)
        return -1;
    if (s->sp >= s->lim.max_stack)
        return kiln__pk_fail(s, "stack deeper than %zu", s->lim.max_stack);
    if (pk_reserve(s, (void **)&s->stack, &s->stack_cap, s->sp + 1, sizeof *s->stack) < 0)
        return -1;
    s->stack[s->sp++] = v;
    return 0;
}

/* The stack entries above the innermost mark belong to it; below it they are off limits. */
static size_t pk_base(const pk_state *s)
{
    return s->nmarks ? s->marks[s->nmarks - 1] : 0;
}

static kiln__pk_value *pk_pop(pk_state *s)
{
    if (s->sp <= pk_base(s)) {
        kiln__pk_fail(s, "stack underflow");
        return NULL;
    }
    return s->stack[--s->sp];
}

static kiln__pk_value *pk_top(pk_state *s)
{
    if (s->sp <= pk_base(s)) {
        kiln__pk_fail(s, "stack underflow");
        return NULL;
    }
    return s->stack[s->sp - 1];
}

static int pk_pop_mark(pk_state *s, size_t *mark)
{
    if (!s->nmarks)
        return kiln__pk_fail(s, "no MARK to close");
    *mark = s->marks[--s->nmarks];
    return 0;
}

static const unsigned char *pk_take(pk_state *s, size_t n)
{
    if (n > s->len - s->pos) {
        kiln__pk_fail(s, "truncated: needs %zu more bytes, %zu left", n, s->len - s->pos);
        return NULL;
    }
    const unsigned char *r = s->p + s->pos;
    s->pos += n;
    return r;
}

static int pk_uint(pk_state *s, size_t n, uint64_t *out)
{
    const unsigned char *b = pk_take(s, n);
    if (!b)
        return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v |= (uint64_t)b[i] << (8 * i);
    *out = v;
    return 0;
}

/* A text line (protocol 0 arguments), without its newline, bounded to keep it a line. */
static const char *pk_line(pk_state *s, size_t *n)
{
    size_t max = s->len - s->pos < 4096 ? s->len - s->pos : 4096;
    const unsigned char *nl = memchr(s->p + s->pos, '\n', max);
    if (!nl) {
        kiln__pk_fail(s, "missing newline in a text argument");
        return NULL;
    }
    const char *r = (const char *)s->p + s->pos;
    *n = (size_t)(nl - (s->p + s->pos));
    s->pos += *n + 1;
    return r;
}

static kiln__pk_value *pk_string(pk_state *s, kiln__pk_kind kind, size_t n)
{
    if (n > s->lim.max_string) {
        kiln__pk_fail(s, "string of %zu bytes exceeds the %zu-byte limit", n, s->lim.max_string);
        return NULL;
    }
    const unsigned char *b = pk_take(s, n);
    if (!b)
        return NULL;
    kiln__pk_value *v = kiln__pk_new(s, kind);
    if (!v)
        return NULL;
    char *c = malloc(n + 1);
    if (!c) {
        kiln__pk_oom(s);
        return NULL;
    }
    memcpy(c, b, n);
    c[n] = 0;
    v->u.str.s = c;
    v->u.str.len = n;
    return v;
}

static kiln__pk_value *pk_int(pk_state *s, int64_t i)
{
    kiln__pk_value *v = kiln__pk_new(s, KILN__PK_INT);
    if (v)
        v->u.i = i;
    return v;
}

/* An integer int64 cannot hold, kept as text (a checkpoint's 2**70 is a value to list, not a
 * reason to refuse the file; nothing that needs a number accepts one). */
static kiln__pk_value *pk_bigint(pk_state *s, const char *text, size_t n)
{
    kiln__pk_value *v = kiln__pk_new(s, KILN__PK_BIGINT);
    char *c = v ? malloc(n + 1) : NULL;
    if (!c) {
        if (v)
            kiln__pk_oom(s);
        return NULL;
    }
    memcpy(c, text, n);
    c[n] = '\0';
    v->u.str.s = c;
    v->u.str.len = n;
    return v;
}

/* Decimal digits of the n-byte little-endian magnitude mag (destroyed), into out. */
static size_t pk_decimal(unsigned char *mag, size_t n, char *out)
{
    size_t nd = 0;
    for (;;) {
        unsigned rem = 0;
        bool zero = true;
        for (size_t i = n; i-- > 0;) { /* divide by 10, most significant byte first */
            unsigned cur = rem << 8 | mag[i];
            mag[i] = (unsigned char)(cur / 10);
            rem = cur % 10;
            zero = zero && mag[i] == 0;
        }
        out[nd++] = (char)('0' + rem);
        if (zero)
            break;
    }
    for (size_t i = 0; i < nd / 2; i++) { /* the digits came out least significant first */
        char t = out[i];
        out[i] = out[nd - 1 - i];
        out[nd - 1 - i] = t;
    }
    return nd;
}

/* LONG1/LONG4: little-endian two's complement. int64 when it fits; otherwise a BIGINT with
 * its exact decimal value up to 64 bytes (154 digits), and its size beyond. */
static kiln__pk_value *pk_long(pk_state *s, uint64_t n)
{
    const unsigned char *b = pk_take(s, (size_t)n);
    if (!b)
        return NULL;
    bool negative = n > 0 && (b[n - 1] & 0x80);
    size_t used = (size_t)n; /* bytes beyond the sign extension */
    while (used > 0 && b[used - 1] == (negative ? 0xff : 0x00))
        used--;
    if (used < 8 || (used == 8 && (b[7] & 0x80) == (negative ? 0x80 : 0))) {
        uint64_t u = negative ? ~(uint64_t)0 : 0;
        for (size_t i = 0; i < used; i++) {
            u &= ~((uint64_t)0xff << (8 * i));
            u |= (uint64_t)b[i] << (8 * i);
        }
        int64_t i;
        memcpy(&i, &u, sizeof i);
        return pk_int(s, i);
    }
    if (n > 64) {
        char text[64];
        int len = snprintf(text, sizeof text, "<integer of %" PRIu64 " bytes>", n);
        return pk_bigint(s, text, (size_t)len);
    }
    unsigned char mag[64];
    unsigned carry = 1;
    for (size_t i = 0; i < n; i++) { /* |value|: two's complement negation when negative */
        unsigned x = negative ? (unsigned)(unsigned char)~b[i] + carry : b[i];
        mag[i] = (unsigned char)x;
        carry = negative ? x >> 8 : 0;
    }
    char text[200];
    size_t len = negative;
    text[0] = '-';
    len += pk_decimal(mag, (size_t)n, text + len);
    return pk_bigint(s, text, len);
}

/* Protocol 0 INT/LONG text: "01"/"00" are True/False (INT only), else a decimal; one past
 * int64 is kept as its text (without leading zeros), as LONG1 keeps one. */
static kiln__pk_value *pk_text_int(pk_state *s, bool is_long)
{
    size_t n;
    const char *l = pk_line(s, &n);
    if (!l)
        return NULL;
    if (!is_long && n == 2 && (memcmp(l, "01", 2) == 0 || memcmp(l, "00", 2) == 0)) {
        kiln__pk_value *v = kiln__pk_new(s, KILN__PK_BOOL);
        if (v)
            v->u.b = l[1] == '1';
        return v;
    }
    if (is_long && n > 0 && l[n - 1] == 'L')
        n--;
    size_t sign = n > 0 && (l[0] == '-' || l[0] == '+');
    bool digits = n > sign;
    for (size_t k = sign; k < n && digits; k++)
        digits = l[k] >= '0' && l[k] <= '9';
    if (!digits) {
        kiln__pk_fail(s, "malformed text integer");
        return NULL;
    }
    char buf[32];
    if (n < sizeof buf) {
        memcpy(buf, l, n);
        buf[n] = 0;
        errno = 0;
        long long v = strtoll(buf, NULL, 10);
        if (errno != ERANGE)
            return pk_int(s, v);
    }
    size_t first = sign; /* the text without a plus sign or leading zeros */
    while (first + 1 < n && l[first] == '0')
        first++;
    char text[4100]; /* pk_line bounds a line to 4096 bytes */
    size_t len = 0;
    if (l[0] == '-')
        text[len++] = '-';
    memcpy(text + len, l + first, n - first);
    return pk_bigint(s, text, len + n - first);
}

static int pk_seq_add(pk_state *s, kiln__pk_value *seq, kiln__pk_value *item)
{
    if (pk_reserve(s, (void **)&seq->u.seq.items, &seq->u.seq.cap, seq->u.seq.n + 1, sizeof item) < 0)
        return -1;
    seq->u.seq.items[seq->u.seq.n++] = item;
    return 0;
}

int kiln__pk_dict_add(pk_state *s, kiln__pk_value *d, kiln__pk_value *k, kiln__pk_value *v)
{
    size_t cap = d->u.dict.cap;
    if (pk_reserve(s, (void **)&d->u.dict.keys, &cap, d->u.dict.n + 1, sizeof k) < 0)
        return -1;
    cap = d->u.dict.cap;
    if (pk_reserve(s, (void **)&d->u.dict.vals, &cap, d->u.dict.n + 1, sizeof v) < 0)
        return -1;
    d->u.dict.cap = cap;
    d->u.dict.keys[d->u.dict.n] = k;
    d->u.dict.vals[d->u.dict.n++] = v;
    return 0;
}

/* Collect stack[from..sp) into a new tuple or list and drop them from the stack. */
static kiln__pk_value *pk_collect(pk_state *s, kiln__pk_kind kind, size_t from)
{
    kiln__pk_value *t = kiln__pk_new(s, kind);
    if (!t)
        return NULL;
    for (size_t i = from; i < s->sp; i++)
        if (pk_seq_add(s, t, s->stack[i]) < 0)
            return NULL;
    s->sp = from;
    return t;
}

static int pk_memo_put(pk_state *s, uint64_t idx)
{
    /* A pickler numbers memo slots 0, 1, 2, ... one per distinct object, so an index past
     * the number of values made so far is malformed; refusing it keeps the memo's size
     * proportional to the input instead of to a number the file picks. */
    if (idx >= s->lim.max_memo || idx > s->nobjects)
        return kiln__pk_fail(s, "memo index %" PRIu64 " is beyond the %zu values made so far (limit %zu)", idx,
                             s->nobjects, s->lim.max_memo);
    kiln__pk_value *top = pk_top(s);
    if (!top)
        return -1;
    size_t old = s->memo_cap;
    if (pk_reserve(s, (void **)&s->memo, &s->memo_cap, (size_t)idx + 1, sizeof *s->memo) < 0)
        return -1;
    memset(s->memo + old, 0, (s->memo_cap - old) * sizeof *s->memo);
    if (!s->memo[idx])
        s->memo_count++;
    s->memo[idx] = top;
    return 0;
}

static int pk_memo_get(pk_state *s, uint64_t idx)
{
    if (idx >= s->memo_cap || !s->memo[idx])
        return kiln__pk_fail(s, "memo index %" PRIu64 " was never stored", idx);
    return pk_push(s, s->memo[idx]);
}

bool kiln__pk_is_str(const kiln__pk_value *v)
{
    return v && v->kind == KILN__PK_STR;
}

/* One opcode. Returns 1 at STOP, 0 to continue, -1 on error. */
static int pk_step(pk_state *s)
{
    s->op_pos = s->pos;
    const unsigned char *opb = pk_take(s, 1);
    if (!opb)
        return kiln__pk_fail(s, "no STOP opcode before the end of the data");
    int op = *opb;
    uint64_t n;
    size_t mark = 0, ln, ln2;
    kiln__pk_value *v, *w, *x;
    const char *l1, *l2;
    switch (op) {
    case OP_PROTO:
        if (pk_uint(s, 1, &n) < 0)
            return -1;
        if (n > 5)
            return kiln__pk_fail(s, "pickle protocol %" PRIu64 " is newer than 5", n);
        return 0;
    case OP_FRAME: /* frames only batch reads; the whole pickle is already in memory */
        return pk_uint(s, 8, &n);
    case OP_STOP:
        if (!(v = pk_pop(s)))
            return -1;
        s->out->root = v;
        return 1;
    case OP_MARK:
        if (s->nmarks >= s->lim.max_marks)
            return kiln__pk_fail(s, "MARKs nested deeper than %zu", s->lim.max_marks);
        if (pk_reserve(s, (void **)&s->marks, &s->marks_cap, s->nmarks + 1, sizeof *s->marks) < 0)
            return -1;
        s->marks[s->nmarks++] = s->sp;
        return 0;
    case OP_POP:
        if (s->sp > pk_base(s)) {
            s->sp--;
            return 0;
        }
        return pk_pop_mark(s, &mark);
    case OP_POP_MARK:
        if (pk_pop_mark(s, &mark) < 0)
            return -1;
        s->sp = mark;
        return 0;
    case OP_DUP:
        return (v = pk_top(s)) ? pk_push(s, v) : -1;
    case OP_NONE: return pk_push(s, kiln__pk_new(s, KILN__PK_NONE));
    case OP_NEWTRUE:
    case OP_NEWFALSE:
        if (!(v = kiln__pk_new(s, KILN__PK_BOOL)))
            return -1;
        v->u.b = op == OP_NEWTRUE;
        return pk_push(s, v);
    case OP_BININT:
        if (pk_uint(s, 4, &n) < 0)
            return -1;
        return pk_push(s, pk_int(s, (int32_t)(uint32_t)n));
    case OP_BININT1:
    case OP_BININT2:
        if (pk_uint(s, op == OP_BININT1 ? 1 : 2, &n) < 0)
            return -1;
        return pk_push(s, pk_int(s, (int64_t)n));
    case OP_LONG1:
    case OP_LONG4:
        if (pk_uint(s, op == OP_LONG1 ? 1 : 4, &n) < 0)
            return -1;
        return pk_push(s, pk_long(s, n));
    case OP_INT:
    case OP_LONG:
        return pk_push(s, pk_text_int(s, op == OP_LONG));
    case OP_BINFLOAT: {
        const unsigned char *b = pk_take(s, 8);
        if (!b)
            return -1;
        uint64_t u = 0;
        for (int i = 0; i < 8; i++)
            u = u << 8 | b[i]; /* big-endian on the wire */
        if (!(v = kiln__pk_new(s, KILN__PK_FLOAT)))
            return -1;
        memcpy(&v->u.f, &u, sizeof u);
        return pk_push(s, v);
    }
    case OP_SHORT_BINUNICODE:
    case OP_SHORT_BINSTRING:
    case OP_SHORT_BINBYTES:
        if (pk_uint(s, 1, &n) < 0)
            return -1;
        return pk_push(s, pk_string(s, op == OP_SHORT_BINBYTES ? KILN__PK_BYTES : KILN__PK_STR, (size_t)n));
    case OP_BINUNICODE:
    case OP_BINSTRING:
    case OP_BINBYTES:
        if (pk_uint(s, 4, &n) < 0)
            return -1;
        if (op == OP_BINSTRING && n > INT32_MAX)
            return kiln__pk_fail(s, "negative string length");
        return pk_push(s, pk_string(s, op == OP_BINBYTES ? KILN__PK_BYTES : KILN__PK_STR, (size_t)n));
    case OP_BINUNICODE8:
    case OP_BINBYTES8:
    case OP_BYTEARRAY8:
        if (pk_uint(s, 8, &n) < 0)
            return -1;
        if (n > s->lim.max_string)
            return kiln__pk_fail(s, "string of %" PRIu64 " bytes exceeds the %zu-byte limit", n,
                                 s->lim.max_string);
        return pk_push(s, pk_string(s, op == OP_BINUNICODE8 ? KILN__PK_STR : KILN__PK_BYTES, (size_t)n));
    case OP_EMPTY_DICT: return pk_push(s, kiln__pk_new(s, KILN__PK_DICT));
    case OP_EMPTY_LIST:
    case OP_EMPTY_SET: /* a set is kept as a list: nothing in a weights file needs set semantics */
        return pk_push(s, kiln__pk_new(s, KILN__PK_LIST));
    case OP_EMPTY_TUPLE: return pk_push(s, kiln__pk_new(s, KILN__PK_TUPLE));
    case OP_TUPLE1:
    case OP_TUPLE2:
    case OP_TUPLE3: {
        size_t k = (size_t)(op - OP_TUPLE1 + 1);
        if (s->sp < pk_base(s) + k)
            return kiln__pk_fail(s, "stack underflow");
        return pk_push(s, pk_collect(s, KILN__PK_TUPLE, s->sp - k));
    }
    case OP_TUPLE:
    case OP_LIST:
    case OP_FROZENSET:
        if (pk_pop_mark(s, &mark) < 0)
            return -1;
        return pk_push(s, pk_collect(s, op == OP_TUPLE ? KILN__PK_TUPLE : KILN__PK_LIST, mark));
    case OP_DICT:
        if (pk_pop_mark(s, &mark) < 0)
            return -1;
        if ((s->sp - mark) % 2)
            return kiln__pk_fail(s, "DICT with an odd number of items");
        if (!(v = kiln__pk_new(s, KILN__PK_DICT)))
            return -1;
        for (size_t i = mark; i < s->sp; i += 2)
            if (kiln__pk_dict_add(s, v, s->stack[i], s->stack[i + 1]) < 0)
                return -1;
        s->sp = mark;
        return pk_push(s, v);
    case OP_APPEND:
        if (!(w = pk_pop(s)) || !(v = pk_top(s)))
            return -1;
        if (v->kind != KILN__PK_LIST)
            return kiln__pk_fail(s, "APPEND to something that is not a list");
        return pk_seq_add(s, v, w);
    case OP_APPENDS:
    case OP_ADDITEMS:
        if (pk_pop_mark(s, &mark) < 0)
            return -1;
        if (mark == 0 || mark <= pk_base(s) || s->stack[mark - 1]->kind != KILN__PK_LIST)
            return kiln__pk_fail(s, "APPENDS to something that is not a list");
        for (size_t i = mark; i < s->sp; i++)
            if (pk_seq_add(s, s->stack[mark - 1], s->stack[i]) < 0)
                return -1;
        s->sp = mark;
        return 0;
    case OP_SETITEM:
        if (!(w = pk_pop(s)) || !(x = pk_pop(s)) || !(v = pk_top(s)))
            return -1;
        if (v->kind != KILN__PK_DICT)
            return kiln__pk_fail(s, "SETITEM on something that is not a dict");
        return kiln__pk_dict_add(s, v, x, w);
    case OP_SETITEMS:
        if (pk_pop_mark(s, &mark) < 0)
            return -1;
        if (mark == 0 || mark <= pk_base(s) || s->stack[mark - 1]->kind != KILN__PK_DICT)
            return kiln__pk_fail(s, "SETITEMS on something that is not a dict");
        if ((s->sp - mark) % 2)
            return kiln__pk_fail(s, "SETITEMS with an odd number of items");
        for (size_t i = mark; i < s->sp; i += 2)
            if (kiln__pk_dict_add(s, s->stack[mark - 1], s->stack[i], s->stack[i + 1]) < 0)
                return -1;
        s->sp = mark;
        return 0;
    case OP_BINPUT:
    case OP_LONG_BINPUT:
        if (pk_uint(s, op == OP_BINPUT ? 1 : 4, &n) < 0)
            return -1;
        return pk_memo_put(s, n);
    case OP_MEMOIZE:
        return pk_memo_put(s, s->memo_count); /* Python numbers it len(memo) */
    case OP_BINGET:
    case OP_LONG_BINGET:
        if (pk_uint(s, op == OP_BINGET ? 1 : 4, &n) < 0)
            return -1;
        return pk_memo_get(s, n);
    case OP_PUT:
    case OP_GET: {
        if (!(l1 = pk_line(s, &ln)))
            return -1;
        char buf[24];
        /* the line is a slice of the input, not a C string: check it byte by byte */
        bool digits = ln > 0 && ln < sizeof buf;
        for (size_t k = 0; digits && k < ln; k++)
            digits = l1[k] >= '0' && l1[k] <= '9';
        if (!digits)
            return kiln__pk_fail(s, "malformed memo index");
        memcpy(buf, l1, ln);
        buf[ln] = 0;
        n = strtoull(buf, NULL, 10);
        return op == OP_PUT ? pk_memo_put(s, n) : pk_memo_get(s, n);
    }
    case OP_GLOBAL:
        if (!(l1 = pk_line(s, &ln)) || !(l2 = pk_line(s, &ln2)))
            return -1;
        return pk_push(s, kiln__pk_global(s, l1, ln, l2, ln2));
    case OP_STACK_GLOBAL:
        if (!(w = pk_pop(s)) || !(v = pk_pop(s)))
            return -1;
        if (!kiln__pk_is_str(v) || !kiln__pk_is_str(w))
            return kiln__pk_fail(s, "STACK_GLOBAL needs two strings");
        return pk_push(s, kiln__pk_global(s, v->u.str.s, v->u.str.len, w->u.str.s, w->u.str.len));
    case OP_REDUCE:
    case OP_NEWOBJ:
        if (!(w = pk_pop(s)) || !(v = pk_pop(s)))
            return -1;
        if (op == OP_NEWOBJ && !(v->kind == KILN__PK_GLOBAL && v->u.global == PK_G_ORDERED_DICT))
            return kiln__pk_fail(s, "NEWOBJ is only supported for OrderedDict");
        return pk_push(s, kiln__pk_reduce(s, v, w));
    case OP_BUILD:
        /* Instance state: an OrderedDict's attributes (a state_dict's _metadata) or a
         * parameter's; neither carries weights, so the state is dropped. */
        if (!(w = pk_pop(s)) || !(v = pk_top(s)))
            return -1;
        if (v->kind != KILN__PK_DICT && v->kind != KILN__PK_TENSOR)
            return kiln__pk_fail(s, "BUILD on something that is neither a dict nor a tensor");
        return 0;
    case OP_BINPERSID:
        if (!(w = pk_pop(s)))
            return -1;
        return pk_push(s, kiln__pk_persistent(s, w));
    default:
        if (op >= 0x20 && op < 0x7f)
            return kiln__pk_fail(s, "opcode '%c' (0x%02x) is not supported in a weights file", op, op);
        return kiln__pk_fail(s, "opcode 0x%02x is not supported in a weights file", op);
    }
}

kiln__pickle *kiln__pickle_load(const void *data, size_t len, const char *label,
                                const kiln__pickle_limits *limits)
{
    pk_state s = {.p = data, .len = len, .label = label ? label : "pickle"};
    if (limits)
        s.lim = *limits;
    if (!s.lim.max_objects)
        s.lim.max_objects = 4u << 20;
    if (!s.lim.max_stack)
        s.lim.max_stack = 1u << 20;
    if (!s.lim.max_marks)
        s.lim.max_marks = 4096;
    if (!s.lim.max_memo)
        s.lim.max_memo = 4u << 20;
    if (!s.lim.max_string)
        s.lim.max_string = 16u << 20;
    s.out = calloc(1, sizeof *s.out);
    if (!s.out) {
        kiln__error_set("pickle: out of memory (%s)", s.label);
        return NULL;
    }
    if (!data && len) {
        free(s.out);
        kiln__error_set("pickle: no data (%s)", s.label);
        return NULL;
    }
    int rc = 0;
    while (rc == 0)
        rc = pk_step(&s);
    free(s.stack);
    free(s.marks);
    free(s.memo);
    if (rc < 0) {
        kiln__pickle_free(s.out);
        return NULL;
    }
    return s.out;
}

const kiln__pk_value *kiln__pickle_root(const kiln__pickle *p)
{
    return p ? p->root : NULL;
}

void kiln__pickle_free(kiln__pickle *p)
{
    if (!p)
        return;
    pk_obj *o = p->objects;
    while (o) {
        pk_obj *next = o->next;
        switch (o->v.kind) {
        case KILN__PK_STR:
        case KILN__PK_BYTES:
        case KILN__PK_BIGINT: free((char *)o->v.u.str.s); break;
        case KILN__PK_TUPLE:
        case KILN__PK_LIST:
            free(o->v.u.seq.items);
            break;
        case KILN__PK_DICT:
            free(o->v.u.dict.keys);
            free(o->v.u.dict.vals);
            break;
        case KILN__PK_TENSOR:
            free(o->v.u.tensor);
            break;
        default:
            break;
        }
        free(o);
        o = next;
    }
    free(p);
}
