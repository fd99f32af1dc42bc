/*
 * api/jscan.h — a strict JSON scanner that reads a request body in place: no tree, no
 * allocation, one pass over the bytes. The inference decoder uses it so a tensor's "data" array
 * goes straight from the request into the tensor buffer instead of through one heap node per
 * number.
 *
 * The grammar is RFC 8259's, exactly: no comments, no trailing commas, no NaN or Infinity, no
 * leading zeros, no control characters inside strings, surrogate escapes paired. Nesting is
 * bounded by KD_JSCAN_MAX_DEPTH. The first error stops the scanner: err says what was wrong and
 * err_at where.
 *
 * Keys: RFC 8259 leaves a repeated key's meaning to the reader (cJSON takes the first, Python
 * the last), so a request that repeats one would mean different things to different readers.
 * kd_jscan_skip refuses an object that repeats a key, as does any object its caller opens with
 * kd_jscan_object_begin_keys; keys compare after unescaping ("a" and "\u0061" are one key).
 *
 * Numbers convert exactly as strtof / strtod would (round to nearest, ties to even), bit for bit.
 * A mantissa m <= 2^53 with a decimal exponent of at most 22 takes Clinger's fast path: one
 * multiply or divide in double, correctly rounded; for a float, that double is rounded again,
 * which is right unless it is exactly a float rounding midpoint. Those, and a mantissa of at most
 * 19 significant digits with a decimal exponent of at most 27, are scaled in long double, which
 * holds both exactly and rounds once; the result is then rounded to float or double, which gives
 * the correctly rounded answer unless the long double landed exactly on a rounding midpoint of
 * the narrower type — those, and every other number, go to strtof / strtod.
 */
#ifndef KD_API_JSCAN_H
#define KD_API_JSCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KD_JSCAN_MAX_DEPTH 64

enum kd_jtype {
    KD_J_NONE = 0, /* end of input, or a byte no value starts with */
    KD_J_OBJECT,
    KD_J_ARRAY,
    KD_J_STRING,
    KD_J_NUMBER,
    KD_J_TRUE,
    KD_J_FALSE,
    KD_J_NULL,
};

/*
 * The keys read so far of one object whose keys must differ. Its first KD_JKEYS_INLINE keys are
 * compared as they come, each with the ones before (objects are small: a request's hold a handful
 * of keys); an object with more moves them to the heap and sorts them when it closes, so a large
 * object costs O(k log k) rather than O(k^2). The caller only declares one; the scanner fills it,
 * and frees what it allocated when the object closes or the scanner fails.
 */
#define KD_JKEYS_INLINE 16
struct kd_jkeys {
    struct kd_jkeys *outer;          /* the enclosing checked object, if any */
    int depth;                       /* the scanner's depth inside this object */
    size_t n, cap;                   /* keys read; room in heap */
    const char *at[KD_JKEYS_INLINE]; /* each key's opening quote, in document order */
    const char **heap;               /* past KD_JKEYS_INLINE keys: every key, as pairs (where, the body's end) */
};

struct kd_jscan {
    const char *start, *p, *end;
    int depth;
    const char *err;       /* static text (or errbuf), NULL while all is well */
    size_t err_at;         /* byte offset of the error */
    struct kd_jkeys *keys; /* the innermost open object whose keys are checked (NULL: none) */
    char errbuf[96];       /* an error that quotes the input: "duplicate key 'data' ..." */
};

void kd_jscan_init(struct kd_jscan *s, const char *p, size_t len);
/* Marks the scanner failed at its current position (keeps the first error). Returns -1. */
int kd_jscan_fail(struct kd_jscan *s, const char *why);

/* Skips whitespace; the type of the value that starts there (KD_J_NONE when none can). */
enum kd_jtype kd_jscan_peek(struct kd_jscan *s);
/* Checks and skips one whole value (an object that repeats a key is an error). 0, or -1 with err set. */
int kd_jscan_skip(struct kd_jscan *s);
/*
 * Skips one array or object following only its brackets and strings, without checking anything
 * else (numbers, commas, colons, literals, bracket kinds). On a valid value it ends exactly where
 * kd_jscan_skip would; on an invalid one it may succeed, so whatever it skipped must still be
 * checked strictly before the document is trusted. It is several times faster, which lets the
 * I/O loop find the end of a large "data" array and leave checking it to a worker. 0, or -1 with
 * err set (not at a bracket, or the input ends first).
 */
int kd_jscan_skip_lax(struct kd_jscan *s);
/* 0 when only whitespace is left, else -1 with err set. */
int kd_jscan_finish(struct kd_jscan *s);

/*
 * Reads a string value, unescaped to UTF-8 and NUL-terminated, into out (cap bytes). Returns its
 * length; -1 with err set when it is not a valid string; -2 when it is valid but does not fit
 * (the scanner is then past it and out holds a truncated prefix).
 */
long kd_jscan_string(struct kd_jscan *s, char *out, size_t cap);

/*
 * Containers. Begin consumes the opening bracket. Then call member / element with i = the number
 * of members or elements already read: each returns 1 when one follows (for an object its key has
 * been read into key, truncated to cap, and the ':' consumed), 0 after the closing bracket, and
 * -1 with err set on malformed input.
 */
int kd_jscan_object_begin(struct kd_jscan *s);
/*
 * kd_jscan_object_begin, after which member fails ("duplicate key 'k' in an object", err_at at
 * the repeat) on a key the object already had. keys is the caller's (uninitialised is fine) and
 * must outlive the object: read it to its closing '}' or until the scanner fails.
 */
int kd_jscan_object_begin_keys(struct kd_jscan *s, struct kd_jkeys *keys);
int kd_jscan_member(struct kd_jscan *s, int i, char *key, size_t cap);
int kd_jscan_array_begin(struct kd_jscan *s);
int kd_jscan_element(struct kd_jscan *s, int i);

/*
 * Number conversion of the JSON number at the start of [p, end). Each returns the bytes it
 * consumed, or 0 when no JSON number starts there (out untouched). -1 only from the strtof /
 * strtod fallback when a copy of a very long token cannot be allocated.
 */
long kd_json_to_f32(const char *p, const char *end, float *out);
long kd_json_to_f64(const char *p, const char *end, double *out);
/*
 * An integer in [lo, hi] exactly: the token may have a fraction or exponent ("2.0", "1e3") as
 * long as its value is a whole number. Returns the bytes consumed, 0 when no JSON number starts
 * there, -2 when it is a number but not a whole one in range (the length is then in *len).
 */
long kd_json_to_int(const char *p, const char *end, int64_t lo, int64_t hi, int64_t *out, size_t *len);

enum kd_json_whole {
    KD_WHOLE_OK,
    KD_WHOLE_FRACTION, /* the value has a fractional part */
    KD_WHOLE_TOO_BIG,  /* its magnitude is past 2^64 - 1 */
};
/*
 * The value of the JSON number token [p, end), already checked against the grammar, as a sign
 * and a magnitude up to 2^64 - 1, from its digits alone (no double, so nothing is rounded):
 * "1e3" and "2.50e1" are whole, "2.5" is not. *magnitude is 0 unless KD_WHOLE_OK.
 */
enum kd_json_whole kd_json_whole_of(const char *p, const char *end, bool *negative, uint64_t *magnitude);

/* The scanner's current number: checks it, converts it and moves past it (0, or -1 with err). */
int kd_jscan_f64(struct kd_jscan *s, double *out);

#endif /* KD_API_JSCAN_H */
