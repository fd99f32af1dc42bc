/*
 * storage/safetensors.c — reading and writing the safetensors format.
 *
 * Layout: an 8-byte little-endian header length N, N bytes of JSON, then the data
 * area. The JSON maps each tensor name to {"dtype", "shape", "data_offsets": [begin,
 * end]} with offsets relative to the data area, plus an optional "__metadata__" object
 * of strings.
 *
 * The reader treats the bytes as hostile: open() validates the whole header (see
 * kiln/record.h for the list of checks) and records each entry's range, so load() is a
 * bounds-checked copy. Opening a file reads only the header and keeps the descriptor;
 * each load reads its tensor's bytes into memory the tensor owns, so another program
 * rewriting or truncating the file later changes nothing kiln holds and cannot fault it.
 * kiln_safetensors_open_mapped is the explicit exception: it maps the file and lends the
 * pages themselves, for callers that promise the file stays as it is.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error-impl.h"
#include "json-keys-impl.h"
#include "kiln/record.h"
#include "safetensors-impl.h"
#include "storage-impl.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "safetensors data is little-endian; a big-endian host needs byte swapping here");

/* The reference implementation refuses headers above 100 MB; so do we. */
#define SAFETENSORS_MAX_HEADER (100u * 1024u * 1024u)

typedef struct st_entry {
    char *name;
    char dtype_str[16];
    int dtype;          /* kiln_dtype, or -1 for a type kiln does not compute in */
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    uint64_t begin;     /* absolute offsets into the data area */
    uint64_t end;
    bool lent;          /* already handed out in place; later loads copy */
} st_entry;

struct kiln_safetensors {
    atomic_int refs;            /* the handle, plus one per tensor using the mapping */
    atomic_int lent_count;
    const unsigned char *bytes; /* memory and mapped handles: the whole image; read handles:
                                   the length and header only (header_copy) */
    size_t len;                 /* bytes at `bytes` */
    uint64_t image_len;         /* the whole image's length (the file's size) */
    bool mapped;
    int fd; /* read handles: where loads read tensors from; else -1 */
    unsigned char *header_copy;
    const unsigned char *data; /* start of the data area (NULL for read handles) */
    uint64_t data_start;       /* offset of the data area in the image */
    uint64_t data_len;
    char *label;                /* file name, for messages */
    st_entry *entries;
    int count;
    char **meta_keys;
    char **meta_values;
    int meta_count;
};

/* Every dtype string the format defines, with its element size, so that a file holding
 * a type kiln cannot compute in still validates and reports a precise error on load. */
static const struct {
    const char *name;
    size_t size;
    int kiln;
} st_dtypes[] = {
    {"F64", 8, KILN_F64}, {"F32", 4, KILN_F32}, {"F16", 2, KILN_F16}, {"BF16", 2, KILN_BF16},
    {"I64", 8, KILN_I64}, {"I32", 4, KILN_I32}, {"U8", 1, KILN_U8},   {"BOOL", 1, KILN_BOOL},
    {"I16", 2, -1},       {"I8", 1, -1},        {"U16", 2, -1},       {"U32", 4, -1},
    {"U64", 8, -1},       {"F8_E4M3", 1, -1},   {"F8_E5M2", 1, -1},
};

const char *kiln__st_dtype_string(kiln_dtype dt)
{
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (st_dtypes[i].kiln == (int)dt)
            return st_dtypes[i].name;
    return NULL;
}

static void st_free_contents(kiln_safetensors *st)
{
    for (int i = 0; i < st->count; i++)
        free(st->entries[i].name);
    free(st->entries);
    for (int i = 0; i < st->meta_count; i++) {
        free(st->meta_keys[i]);
        free(st->meta_values[i]);
    }
    free(st->meta_keys);
    free(st->meta_values);
    free(st->label);
    free(st->header_copy);
    if (st->fd >= 0)
        close(st->fd);
}

static void st_unref(void *arg)
{
    kiln_safetensors *st = arg;
    if (atomic_fetch_sub(&st->refs, 1) != 1)
        return;
    if (st->mapped && st->len > 0)
        munmap((void *)st->bytes, st->len);
    st_free_contents(st);
    free(st);
}

void kiln_safetensors_close(kiln_safetensors *st)
{
    if (st)
        st_unref(st);
}

int kiln_safetensors_zero_copy_count(const kiln_safetensors *st)
{
    return st ? atomic_load(&((kiln_safetensors *)st)->lent_count) : 0;
}

/* ------------------------------------------------- text checks (reader and writer) */

bool kiln__utf8_valid(const char *text, size_t n)
{
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t more;
        unsigned char lo = 0x80, hi = 0xBF; /* the range of the first continuation byte */
        if (c >= 0xC2 && c <= 0xDF)
            more = 1;
        else if (c >= 0xE0 && c <= 0xEF)
            more = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        else if (c >= 0xF0 && c <= 0xF4)
            more = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        else
            return false;
        if (n - i - 1 < more || s[i + 1] < lo || s[i + 1] > hi)
            return false;
        for (size_t k = 2; k <= more; k++)
            if ((s[i + k] & 0xC0) != 0x80)
                return false;
        i += more + 1;
    }
    return true;
}

bool kiln__utf8_string(const char *s)
{
    return kiln__utf8_valid(s, strlen(s));
}

const char *kiln__printable(const char *s, char *buf, size_t len)
{
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p && o + 5 < len; p++) {
        if (*p >= 0x20 && *p < 0x7f)
            buf[o++] = (char)*p;
        else
            o += (size_t)snprintf(buf + o, len - o, "\\x%02x", *p);
    }
    buf[o] = '\0';
    return buf;
}

static int st_cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

const char *kiln__first_duplicate(const char *const *keys, int n, bool *oom)
{
    *oom = false;
    if (n < 2)
        return NULL;
    const char **sorted = malloc((size_t)n * sizeof *sorted);
    if (!sorted) {
        *oom = true;
        return NULL;
    }
    memcpy(sorted, keys, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, st_cmp_str);
    const char *dup = NULL;
    for (int i = 1; i < n && !dup; i++)
        if (strcmp(sorted[i - 1], sorted[i]) == 0)
            dup = sorted[i];
    free(sorted);
    return dup;
}

/* ------------------------------------------------------------------------ reading */

/* An integer from JSON: a number that is integral, non-negative and exactly
 * representable (cJSON stores numbers as double, so 2^53 is the honest bound). 0, -1
 * when it is no non-negative integer, -2 when it is one past 2^53 (too large, not wrong). */
static int st_json_u64(const cJSON *item, uint64_t *out)
{
    if (!cJSON_IsNumber(item))
        return -1;
    double v = item->valuedouble;
    if (v > 9007199254740992.0)
        return v == floor(v) ? -2 : -1; /* inf (1e400) is too large too */
    if (!(v >= 0.0) || v != (double)(uint64_t)v)
        return -1;
    *out = (uint64_t)v;
    return 0;
}

static int st_parse_entry(kiln_safetensors *st, const cJSON *item, st_entry *e)
{
    const char *name = item->string;
    if (!cJSON_IsObject(item))
        return kiln__error_set("safetensors %s: entry '%.200s' is not an object", st->label, name);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dtype) || !cJSON_IsArray(shape) || !cJSON_IsArray(offsets))
        return kiln__error_set("safetensors %s: entry '%.200s' needs string 'dtype', array 'shape' "
                               "and array 'data_offsets'", st->label, name);
    size_t elem = 0;
    e->dtype = -1;
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++) {
        if (strcmp(dtype->valuestring, st_dtypes[i].name) == 0) {
            elem = st_dtypes[i].size;
            e->dtype = st_dtypes[i].kiln;
            snprintf(e->dtype_str, sizeof e->dtype_str, "%s", st_dtypes[i].name);
        }
    }
    if (elem == 0)
        return kiln__error_set("safetensors %s: entry '%.200s' has unknown dtype '%.32s'", st->label,
                               name, dtype->valuestring);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > KILN_MAX_DIMS)
        return kiln__error_set("safetensors %s: entry '%.200s' has %d dims (kiln allows %d)", st->label,
                               name, ndim, KILN_MAX_DIMS);
    e->ndim = ndim;
    uint64_t bytes = elem;
    for (int d = 0; d < ndim; d++) {
        uint64_t n;
        int r = st_json_u64(cJSON_GetArrayItem(shape, d), &n);
        if (r == -2)
            return kiln__error_set("safetensors %s: entry '%.200s' shape[%d] %g is too large (kiln reads "
                                   "sizes up to 2^53)",
                                   st->label, name, d, cJSON_GetArrayItem(shape, d)->valuedouble);
        if (r < 0)
            return kiln__error_set("safetensors %s: entry '%.200s' shape[%d] is not a non-negative "
                                   "integer", st->label, name, d);
        if (n != 0 && bytes > UINT64_MAX / n)
            return kiln__error_set("safetensors %s: entry '%.200s' shape overflows", st->label, name);
        bytes *= n;
        e->shape[d] = (int64_t)n;
    }
    int r0 = cJSON_GetArraySize(offsets) == 2 ? st_json_u64(cJSON_GetArrayItem(offsets, 0), &e->begin) : -1;
    int r1 = r0 == 0 ? st_json_u64(cJSON_GetArrayItem(offsets, 1), &e->end) : r0;
    if (r1 == -2)
        return kiln__error_set("safetensors %s: entry '%.200s' data_offsets are too large (past 2^53)", st->label,
                               name);
    if (r1 < 0)
        return kiln__error_set("safetensors %s: entry '%.200s' data_offsets must be two non-negative "
                               "integers", st->label, name);
    if (e->begin > e->end || e->end > st->data_len)
        return kiln__error_set("safetensors %s: entry '%.200s' data_offsets [%llu, %llu] lie outside the "
                               "%llu-byte data area", st->label, name, (unsigned long long)e->begin,
                               (unsigned long long)e->end, (unsigned long long)st->data_len);
    if (e->end - e->begin != bytes) {
        char dims[160] = "";
        size_t used = 0;
        for (int d = 0; d < ndim && used < sizeof dims; d++)
            used += (size_t)snprintf(dims + used, sizeof dims - used, "%s%lld", d ? ", " : "",
                                     (long long)e->shape[d]);
        return kiln__error_set("safetensors %s: entry '%.200s' holds %llu bytes but %s[%s] needs %llu",
                               st->label, name, (unsigned long long)(e->end - e->begin),
                               e->dtype_str, dims, (unsigned long long)bytes);
    }
    e->name = strdup(name);
    if (!e->name)
        return kiln__error_set("safetensors %s: out of memory", st->label);
    return 0;
}

static int st_parse_metadata(kiln_safetensors *st, const cJSON *meta)
{
    if (!cJSON_IsObject(meta))
        return kiln__error_set("safetensors %s: __metadata__ is not an object", st->label);
    int n = cJSON_GetArraySize(meta);
    st->meta_keys = calloc((size_t)n + 1, sizeof(char *));
    st->meta_values = calloc((size_t)n + 1, sizeof(char *));
    if (!st->meta_keys || !st->meta_values)
        return kiln__error_set("safetensors %s: out of memory", st->label);
    const cJSON *kv;
    char shown[220];
    cJSON_ArrayForEach(kv, meta)
    {
        if (!kiln__utf8_string(kv->string))
            return kiln__error_set("safetensors %s: __metadata__ key '%s' is not valid UTF-8", st->label,
                                   kiln__printable(kv->string, shown, sizeof shown));
        if (!cJSON_IsString(kv))
            return kiln__error_set("safetensors %s: __metadata__ value for '%s' is not a string",
                                   st->label, kv->string);
        if (!kiln__utf8_string(kv->valuestring))
            return kiln__error_set("safetensors %s: __metadata__ value for '%.200s' is not valid UTF-8", st->label,
                                   kv->string);
        int i = st->meta_count;
        st->meta_keys[i] = strdup(kv->string);
        st->meta_values[i] = strdup(kv->valuestring);
        st->meta_count++; /* counted before the check so close() frees a half-made pair */
        if (!st->meta_keys[i] || !st->meta_values[i])
            return kiln__error_set("safetensors %s: out of memory", st->label);
    }
    /* JSON readers disagree on a repeated key (kiln's took the first, Python's the last),
     * so a file that has one means different things to different readers */
    bool oom;
    const char *dup = kiln__first_duplicate((const char *const *)st->meta_keys, st->meta_count, &oom);
    if (oom)
        return kiln__error_set("safetensors %s: out of memory", st->label);
    if (dup)
        return kiln__error_set("safetensors %s: __metadata__ key '%.200s' appears more than once", st->label, dup);
    return 0;
}

static int st_cmp_begin(const void *a, const void *b)
{
    const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int st_cmp_name(const void *a, const void *b)
{
    return strcmp((*(const st_entry *const *)a)->name, (*(const st_entry *const *)b)->name);
}

/* Ranges must tile the data area exactly and names must be unique. */
static int st_check_layout(kiln_safetensors *st)
{
    if (st->count == 0) {
        if (st->data_len != 0)
            return kiln__error_set("safetensors %s: %llu data bytes but no tensors", st->label,
                                   (unsigned long long)st->data_len);
        return 0;
    }
    st_entry **order = malloc((size_t)st->count * sizeof *order);
    if (!order)
        return kiln__error_set("safetensors %s: out of memory", st->label);
    for (int i = 0; i < st->count; i++)
        order[i] = &st->entries[i];
    int rc = 0;
    qsort(order, (size_t)st->count, sizeof *order, st_cmp_name);
    for (int i = 1; i < st->count && rc == 0; i++)
        if (strcmp(order[i - 1]->name, order[i]->name) == 0)
            rc = kiln__error_set("safetensors %s: duplicate entry '%.200s'", st->label, order[i]->name);
    qsort(order, (size_t)st->count, sizeof *order, st_cmp_begin);
    uint64_t expect = 0;
    for (int i = 0; i < st->count && rc == 0; i++) {
        if (order[i]->begin < expect)
            rc = kiln__error_set("safetensors %s: entry '%.200s' overlaps another entry's bytes", st->label,
                                 order[i]->name);
        else if (order[i]->begin > expect)
            rc = kiln__error_set("safetensors %s: bytes %llu..%llu before entry '%.200s' belong to no "
                                 "tensor", st->label, (unsigned long long)expect,
                                 (unsigned long long)order[i]->begin, order[i]->name);
        expect = order[i]->end;
    }
    if (rc == 0 && expect != st->data_len)
        rc = kiln__error_set("safetensors %s: the last %llu data bytes belong to no tensor", st->label,
                             (unsigned long long)(st->data_len - expect));
    free(order);
    return rc;
}

/* cJSON keeps strings NUL-terminated, so a name or value holding \u0000 (or a raw 0 byte)
 * would come out cut short: "a\u0000b" read as "a" (json-keys-impl.h). */
static bool st_header_has_nul(const char *text, size_t n)
{
    return memchr(text, '\0', n) != NULL || kiln__json_nul_escape_at(text, n) >= 0;
}

/* What the first bytes of a file that is not safetensors say it is, with the call that reads
 * it, or NULL. Asked only once the header is refused: a header length of "PK\3\4..." is
 * some 10^17 bytes, which said nothing useful. */
static const char *other_format(const unsigned char *b, size_t n)
{
    if (n >= 4 && !memcmp(b, "PK\x03\x04", 4))
        return "a zip archive, as torch.save writes a PyTorch checkpoint: read it with kiln_torch_open";
    if (n >= 2 && b[0] == 0x80 && b[1] >= 2 && b[1] <= 5)
        return "a Python pickle (a PyTorch checkpoint of the legacy format?): read it with kiln_torch_open";
    if (n >= 8 && !memcmp(b, "\x89HDF\r\n\x1a\n", 8))
        return "HDF5 (a Keras .h5 model?)";
    if (n >= 4 && !memcmp(b, "GGUF", 4))
        return "a GGUF model";
    if (n >= 6 && !memcmp(b, "\x93NUMPY", 6))
        return "a NumPy .npy array";
    if (n >= 2 && b[0] == 0x08 && b[1] >= 3 && b[1] <= 12) /* ModelProto's ir_version comes first */
        return "an ONNX model, it seems: load it with kiln_onnx_load";
    return NULL;
}

static int st_parse_header(kiln_safetensors *st);

/* Validate the header. st->bytes holds at least the 8-byte length and, when that length
 * is within bounds, the whole header; st->image_len is the size of the whole image. */
static int st_parse(kiln_safetensors *st)
{
    int rc = st_parse_header(st);
    const char *what = rc < 0 ? other_format(st->bytes, st->len < 16 ? st->len : 16) : NULL;
    if (what) {
        char why[KILN_ERROR_MAX];
        snprintf(why, sizeof why, "%s", kiln_error());
        return kiln__error_restate("%s (the file is %s)", why, what);
    }
    return rc;
}

static int st_parse_header(kiln_safetensors *st)
{
    if (st->image_len < 8)
        return kiln__error_set("safetensors %s: %llu bytes is too short for a header length", st->label,
                               (unsigned long long)st->image_len);
    uint64_t hlen;
    memcpy(&hlen, st->bytes, 8);
    if (hlen > SAFETENSORS_MAX_HEADER)
        return kiln__error_set("safetensors %s: header length %llu exceeds the %u-byte limit",
                               st->label, (unsigned long long)hlen, SAFETENSORS_MAX_HEADER);
    if (hlen > st->image_len - 8)
        return kiln__error_set("safetensors %s: header length %llu runs past the end of the %llu-byte file",
                               st->label, (unsigned long long)hlen, (unsigned long long)st->image_len);
    if (hlen < 2 || st->bytes[8] != '{')
        return kiln__error_set("safetensors %s: header does not start with a JSON object",
                               st->label);
    st->data_start = 8 + hlen;
    st->data = st->fd < 0 ? st->bytes + st->data_start : NULL;
    st->data_len = st->image_len - 8 - hlen;

    const char *text = (const char *)st->bytes + 8, *end = NULL;
    if (st_header_has_nul(text, (size_t)hlen))
        return kiln__error_set("safetensors %s: header holds a NUL character (\\u0000 or a raw 0 byte), "
                               "which would cut a name short",
                               st->label);
    cJSON *root = cJSON_ParseWithLengthOpts(text, (size_t)hlen, &end, false);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kiln__error_set("safetensors %s: header is not valid JSON", st->label);
    }
    /* after the object only padding: writers pad the header with spaces (JSON whitespace) */
    for (; end && end < text + hlen; end++)
        if (*end != ' ' && *end != '\t' && *end != '\n' && *end != '\r') {
            cJSON_Delete(root);
            return kiln__error_set("safetensors %s: header has bytes other than whitespace after its JSON object "
                                   "(at byte %zu)",
                                   st->label, (size_t)(end - text));
        }
    int n = cJSON_GetArraySize(root);
    int rc = 0;
    st->entries = calloc((size_t)n + 1, sizeof *st->entries);
    if (!st->entries)
        rc = kiln__error_set("safetensors %s: out of memory", st->label);
    const cJSON *item;
    cJSON_ArrayForEach(item, root)
    {
        if (rc != 0)
            break;
        if (strcmp(item->string, "__metadata__") == 0) {
            if (st->meta_keys)
                rc = kiln__error_set("safetensors %s: duplicate __metadata__", st->label);
            else
                rc = st_parse_metadata(st, item);
            continue;
        }
        if (item->string[0] == '\0') {
            rc = kiln__error_set("safetensors %s: an entry has an empty name", st->label);
            break;
        }
        if (!kiln__utf8_string(item->string)) {
            char shown[220];
            rc = kiln__error_set("safetensors %s: entry name '%s' is not valid UTF-8", st->label,
                                 kiln__printable(item->string, shown, sizeof shown));
            break;
        }
        rc = st_parse_entry(st, item, &st->entries[st->count]);
        if (rc == 0)
            st->count++;
    }
    cJSON_Delete(root);
    if (rc == 0)
        rc = st_check_layout(st);
    /* The names and metadata were checked above, each with its key named; this catches
     * invalid bytes anywhere else (a field kiln ignores), which Python's reader refuses. */
    if (rc == 0 && !kiln__utf8_valid(text, (size_t)hlen))
        rc = kiln__error_set("safetensors %s: header is not valid UTF-8", st->label);
    return rc;
}

static kiln_safetensors *st_new(const char *label)
{
    kiln_safetensors *st = calloc(1, sizeof *st);
    if (!st || !(st->label = strdup(label))) {
        free(st);
        kiln__error_set("safetensors %s: out of memory", label);
        return NULL;
    }
    atomic_init(&st->refs, 1);
    st->fd = -1;
    return st;
}

kiln_safetensors *kiln_safetensors_open_memory(const void *data, size_t len)
{
    kiln_safetensors *st = st_new("<memory>");
    if (!st)
        return NULL;
    st->bytes = data;
    st->len = data ? len : 0;
    st->image_len = st->len;
    if (st_parse(st) != 0) {
        kiln_safetensors_close(st);
        return NULL;
    }
    return st;
}

/* n bytes at offset into buf. 0, or -1 with errno set (0 when the file ended first). */
static int st_pread_all(int fd, void *buf, size_t n, uint64_t offset)
{
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)offset);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (r == 0)
                errno = 0;
            return -1;
        }
        p += r;
        n -= (size_t)r;
        offset += (uint64_t)r;
    }
    return 0;
}

/* A read handle: the 8-byte length, then the header it announces when that is within the
 * bounds st_parse enforces (otherwise st_parse refuses on the length alone). */
static int st_read_header(kiln_safetensors *st, const char *path)
{
    size_t want = st->image_len < 8 ? 0 : 8;
    unsigned char head[8];
    if (want == 8) {
        if (st_pread_all(st->fd, head, 8, 0) != 0)
            return kiln__error_set("safetensors %s: %s", path, errno ? strerror(errno) : "the file shrank");
        uint64_t hlen;
        memcpy(&hlen, head, 8);
        if (hlen <= SAFETENSORS_MAX_HEADER && hlen <= st->image_len - 8)
            want = 8 + (size_t)hlen;
    }
    st->header_copy = malloc(want ? want : 1);
    if (!st->header_copy)
        return kiln__error_set("safetensors %s: out of memory for the header", path);
    memcpy(st->header_copy, head, want < 8 ? want : 8);
    if (want > 8 && st_pread_all(st->fd, st->header_copy + 8, want - 8, 8) != 0)
        return kiln__error_set("safetensors %s: %s", path, errno ? strerror(errno) : "the file shrank");
    st->bytes = st->header_copy;
    st->len = want;
    return 0;
}

static kiln_safetensors *st_open_path(const char *path, bool map)
{
    if (!path) {
        kiln__error_set("safetensors: no path given");
        return NULL;
    }
    kiln_safetensors *st = st_new(path);
    if (!st)
        return NULL;
    struct stat sb;
    int fd = kiln__open_regular(path, &sb);
    if (fd == KILN__NOT_REGULAR) {
        kiln__error_set("safetensors %s: not a regular file", path);
        goto fail;
    }
    if (fd < 0) {
        kiln__error_set("safetensors %s: %s", path, strerror(errno));
        goto fail;
    }
    st->image_len = (uint64_t)sb.st_size;
    if (!map) {
        st->fd = fd; /* closed with the handle */
        if (st_read_header(st, path) != 0)
            goto fail;
    } else {
        if (st->image_len > 0) {
            /* Private and writable: tensors lent in place may be updated (an optimizer step),
             * which copies the touched pages and never reaches the file. */
            void *m = mmap(NULL, (size_t)st->image_len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
            if (m == MAP_FAILED) {
                kiln__error_set("safetensors %s: mmap: %s", path, strerror(errno));
                close(fd);
                goto fail;
            }
            st->bytes = m;
            st->len = (size_t)st->image_len;
            st->mapped = true;
        }
        close(fd);
    }
    if (st_parse(st) != 0)
        goto fail;
    return st;
fail:
    kiln_safetensors_close(st);
    return NULL;
}

kiln_safetensors *kiln_safetensors_open(const char *path)
{
    return st_open_path(path, false);
}

kiln_safetensors *kiln_safetensors_open_mapped(const char *path)
{
    return st_open_path(path, true);
}

int kiln_safetensors_count(const kiln_safetensors *st)
{
    return st ? st->count : 0;
}

const char *kiln_safetensors_name(const kiln_safetensors *st, int i)
{
    return st && i >= 0 && i < st->count ? st->entries[i].name : NULL;
}

int kiln_safetensors_find(const kiln_safetensors *st, const char *name)
{
    if (!st || !name)
        return -1;
    for (int i = 0; i < st->count; i++)
        if (strcmp(st->entries[i].name, name) == 0)
            return i;
    return -1;
}

int kiln_safetensors_info(const kiln_safetensors *st, int i, int *dtype, int *ndim, int64_t *shape)
{
    if (!st || i < 0 || i >= st->count)
        return kiln__error_set("safetensors: no tensor at index %d", i);
    const st_entry *e = &st->entries[i];
    if (dtype)
        *dtype = e->dtype;
    if (ndim)
        *ndim = e->ndim;
    if (shape)
        memcpy(shape, e->shape, (size_t)e->ndim * sizeof *shape);
    return 0;
}

const char *kiln_safetensors_dtype_string(const kiln_safetensors *st, int i)
{
    return st && i >= 0 && i < st->count ? st->entries[i].dtype_str : NULL;
}

/* A read handle's load: the tensor's bytes read from the file into memory the tensor owns,
 * 64-byte aligned so that a host-memory device uses it in place (one copy, not two); other
 * devices copy it in. */
static kiln_tensor *st_load_read(const kiln_safetensors *st, const st_entry *e, kiln_device *dev)
{
    size_t n = (size_t)(e->end - e->begin);
    size_t cap = (n + 63) & ~(size_t)63;
    unsigned char *buf = aligned_alloc(64, cap ? cap : 64);
    if (!buf) {
        kiln__error_set("safetensors %s: out of memory loading '%s' (%zu bytes)", st->label, e->name, n);
        return NULL;
    }
    if (st_pread_all(st->fd, buf, n, st->data_start + e->begin) != 0) {
        kiln__error_set("safetensors %s: reading tensor '%s': %s", st->label, e->name,
                        errno ? strerror(errno) : "the file ended early (it changed after it was opened)");
        free(buf);
        return NULL;
    }
    /* A bool byte other than 0 or 1 is undefined behaviour once read as _Bool, and a file
     * is untrusted: normalize to 0/1 on the way in. */
    if (e->dtype == KILN_BOOL)
        for (size_t k = 0; k < n; k++)
            buf[k] = buf[k] != 0;
    if (n > 0) {
        kiln_tensor *t = kiln_from_host_memory(dev, (kiln_dtype)e->dtype, e->ndim, e->shape, buf, free, buf);
        if (t)
            return t;
        kiln_error_clear(); /* a device with memory of its own: copy below */
    }
    kiln_tensor *t = kiln_from_data(dev, (kiln_dtype)e->dtype, e->ndim, e->shape, buf, n);
    free(buf);
    return t;
}

kiln_tensor *kiln_safetensors_load(const kiln_safetensors *st, const char *name, kiln_device *dev)
{
    if (!st) {
        kiln__error_set("safetensors load '%s': the file handle (st) is NULL", name ? name : "(null)");
        return NULL;
    }
    if (!dev) {
        kiln__error_set("safetensors %s: load '%s': the device (dev) is NULL", st->label, name ? name : "(null)");
        return NULL;
    }
    int i = kiln_safetensors_find(st, name);
    if (i < 0) {
        kiln__error_set("safetensors %s: no tensor named '%s'", st->label, name ? name : "(null)");
        return NULL;
    }
    const st_entry *e = &st->entries[i];
    if (e->dtype < 0) {
        kiln__error_set("safetensors %s: tensor '%s' has dtype %s, which kiln does not support",
                        st->label, e->name, e->dtype_str);
        return NULL;
    }
    if (st->fd >= 0)
        return st_load_read(st, e, dev);
    const unsigned char *src = st->data + e->begin;
    size_t n = (size_t)(e->end - e->begin);
    /* Zero copy: a mapped file's bytes become the tensor's storage when the device keeps
     * tensors in host memory and the data is aligned as its buffers are. Each entry is
     * lent once, so two loads never alias; bools are excluded because their bytes must
     * be normalized first. */
    kiln_safetensors *mst = (kiln_safetensors *)st;
    if (st->mapped && e->dtype != KILN_BOOL && n > 0 && (uintptr_t)src % 64 == 0 && !e->lent) {
        atomic_fetch_add(&mst->refs, 1);
        kiln_tensor *t = kiln_from_host_memory(dev, (kiln_dtype)e->dtype, e->ndim, e->shape, (void *)src, st_unref,
                                               mst);
        if (t) {
            ((st_entry *)e)->lent = true;
            atomic_fetch_add(&mst->lent_count, 1);
            return t;
        }
        atomic_fetch_sub(&mst->refs, 1); /* not lent after all: copy below */
        kiln_error_clear();
    }
    if (e->dtype != KILN_BOOL)
        return kiln_from_data(dev, (kiln_dtype)e->dtype, e->ndim, e->shape, src, n);
    /* A bool byte other than 0 or 1 is undefined behaviour once read as _Bool, and a file
     * is untrusted: normalize to 0/1 on the way in. */
    unsigned char *norm = malloc(n ? n : 1);
    if (!norm) {
        kiln__error_set("safetensors %s: out of memory loading '%s'", st->label, e->name);
        return NULL;
    }
    for (size_t k = 0; k < n; k++)
        norm[k] = src[k] != 0;
    kiln_tensor *t = kiln_from_data(dev, KILN_BOOL, e->ndim, e->shape, norm, n);
    free(norm);
    return t;
}

const char *kiln_safetensors_metadata(const kiln_safetensors *st, const char *key)
{
    if (!st || !key)
        return NULL;
    for (int i = 0; i < st->meta_count; i++)
        if (strcmp(st->meta_keys[i], key) == 0)
            return st->meta_values[i];
    return NULL;
}

int kiln_safetensors_metadata_count(const kiln_safetensors *st)
{
    return st ? st->meta_count : 0;
}

const char *kiln_safetensors_metadata_key(const kiln_safetensors *st, int i)
{
    return st && i >= 0 && i < st->meta_count ? st->meta_keys[i] : NULL;
}
