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
 * bounds-checked copy. Files are memory-mapped read-only: opening a multi-gigabyte
 * model costs page-table entries, not a read of the whole file.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
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
#include "kiln/record.h"
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
    const unsigned char *bytes; /* whole file */
    size_t len;
    bool mapped;
    const unsigned char *data;  /* start of the data area */
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

static const char *st_dtype_string_of(kiln_dtype dt)
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
    cJSON_ArrayForEach(kv, meta)
    {
        if (!cJSON_IsString(kv))
            return kiln__error_set("safetensors %s: __metadata__ value for '%s' is not a string",
                                   st->label, kv->string);
        int i = st->meta_count;
        st->meta_keys[i] = strdup(kv->string);
        st->meta_values[i] = strdup(kv->valuestring);
        st->meta_count++; /* counted before the check so close() frees a half-made pair */
        if (!st->meta_keys[i] || !st->meta_values[i])
            return kiln__error_set("safetensors %s: out of memory", st->label);
    }
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
 * would come out cut short: "a\u0000b" read as "a". Escapes are walked in order so that
 * an escaped backslash before "u0000" is not taken for one. */
static bool st_header_has_nul(const char *text, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (text[i] == '\0')
            return true;
        if (text[i] != '\\' || i + 1 >= n)
            continue;
        if (text[i + 1] == 'u' && i + 5 < n && !memcmp(text + i + 2, "0000", 4))
            return true;
        i++; /* the escaped character */
    }
    return false;
}

static int st_parse(kiln_safetensors *st)
{
    if (st->len < 8)
        return kiln__error_set("safetensors %s: %zu bytes is too short for a header length",
                               st->label, st->len);
    uint64_t hlen;
    memcpy(&hlen, st->bytes, 8);
    if (hlen > SAFETENSORS_MAX_HEADER)
        return kiln__error_set("safetensors %s: header length %llu exceeds the %u-byte limit",
                               st->label, (unsigned long long)hlen, SAFETENSORS_MAX_HEADER);
    if (hlen > st->len - 8)
        return kiln__error_set("safetensors %s: header length %llu runs past the end of the "
                               "%zu-byte file", st->label, (unsigned long long)hlen, st->len);
    if (hlen < 2 || st->bytes[8] != '{')
        return kiln__error_set("safetensors %s: header does not start with a JSON object",
                               st->label);
    st->data = st->bytes + 8 + hlen;
    st->data_len = st->len - 8 - hlen;

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
        rc = st_parse_entry(st, item, &st->entries[st->count]);
        if (rc == 0)
            st->count++;
    }
    cJSON_Delete(root);
    if (rc == 0)
        rc = st_check_layout(st);
    return rc;
}

kiln_safetensors *kiln_safetensors_open_memory(const void *data, size_t len)
{
    kiln_safetensors *st = calloc(1, sizeof *st);
    if (!st || !(st->label = strdup("<memory>"))) {
        free(st);
        kiln__error_set("safetensors: out of memory");
        return NULL;
    }
    atomic_init(&st->refs, 1);
    st->bytes = data;
    st->len = data ? len : 0;
    if (st_parse(st) != 0) {
        kiln_safetensors_close(st);
        return NULL;
    }
    return st;
}

kiln_safetensors *kiln_safetensors_open(const char *path)
{
    if (!path) {
        kiln__error_set("safetensors: no path given");
        return NULL;
    }
    kiln_safetensors *st = calloc(1, sizeof *st);
    if (!st || !(st->label = strdup(path))) {
        free(st);
        kiln__error_set("safetensors %s: out of memory", path);
        return NULL;
    }
    atomic_init(&st->refs, 1);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        kiln__error_set("safetensors %s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        kiln__error_set("safetensors %s: not a regular file", path);
        goto fail;
    }
    st->len = (size_t)sb.st_size;
    if (st->len > 0) {
        /* Private and writable: tensors lent in place may be updated (an optimizer step),
         * which copies the touched pages and never reaches the file. */
        void *m = mmap(NULL, st->len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            kiln__error_set("safetensors %s: mmap: %s", path, strerror(errno));
            st->len = 0;
            goto fail;
        }
        st->bytes = m;
        st->mapped = true;
    }
    close(fd);
    fd = -1;
    if (st_parse(st) != 0)
        goto fail;
    return st;
fail:
    if (fd >= 0)
        close(fd);
    kiln_safetensors_close(st);
    return NULL;
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

kiln_tensor *kiln_safetensors_load(const kiln_safetensors *st, const char *name, kiln_device *dev)
{
    if (!st || !dev)
        return NULL;
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

/* ------------------------------------------------------------------------ writing */

static char *st_build_header(int n, const char *const *names, kiln_tensor *const *tensors, int nmeta,
                             const char *const *meta_keys, const char *const *meta_values)
{
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return NULL;
    if (nmeta > 0) {
        cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
        for (int i = 0; meta && i < nmeta; i++)
            if (!cJSON_AddStringToObject(meta, meta_keys[i], meta_values[i]))
                meta = NULL;
        if (!meta)
            goto fail;
    }
    uint64_t offset = 0;
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_AddObjectToObject(root, names[i]);
        if (!e)
            goto fail;
        kiln_dtype dt = kiln_tensor_dtype(tensors[i]);
        uint64_t bytes = (uint64_t)kiln_tensor_numel(tensors[i]) * kiln_dtype_size(dt);
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
        if (!cJSON_AddStringToObject(e, "dtype", st_dtype_string_of(dt)) || !shape || !offs)
            goto fail;
        for (int d = 0; d < kiln_tensor_ndim(tensors[i]); d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)kiln_tensor_dim(tensors[i], d)));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(offset + bytes)));
        offset += bytes;
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
fail:
    cJSON_Delete(root);
    return NULL;
}

int kiln_safetensors_save(const char *path, int n, const char *const *names, kiln_tensor *const *tensors,
                          int nmeta, const char *const *meta_keys, const char *const *meta_values)
{
    if (!path || n < 0 || nmeta < 0 || (n > 0 && (!names || !tensors)) ||
        (nmeta > 0 && (!meta_keys || !meta_values)))
        return kiln__error_set("safetensors save: invalid arguments"), KILN_EINVAL;
    for (int i = 0; i < n; i++) {
        if (!tensors[i])
            return kiln__error_set("safetensors save %s: tensor '%s' is NULL", path,
                                   names[i] ? names[i] : "(null)"), KILN_EINVAL;
        if (!names[i] || !names[i][0] || strcmp(names[i], "__metadata__") == 0)
            return kiln__error_set("safetensors save %s: tensor %d has an invalid name", path, i),
                   KILN_EINVAL;
        for (int j = 0; j < i; j++)
            if (strcmp(names[i], names[j]) == 0)
                return kiln__error_set("safetensors save %s: duplicate name '%s'", path, names[i]),
                       KILN_EINVAL;
    }
    for (int i = 0; i < nmeta; i++)
        if (!meta_keys[i] || !meta_values[i])
            return kiln__error_set("safetensors save %s: metadata pair %d is NULL", path, i),
                   KILN_EINVAL;

    char *header = st_build_header(n, names, tensors, nmeta, meta_keys, meta_values);
    if (!header)
        return kiln__error_set("safetensors save %s: out of memory building the header", path),
               KILN_ENOMEM;
    /* Pad the header with spaces (JSON whitespace) so the data area starts 64-byte
     * aligned in the file: readers that map it can then use tensors in place. */
    size_t hlen = strlen(header);
    size_t padded = ((hlen + 8 + 63) & ~(size_t)63) - 8;
    int rc = 0;
    kiln__atomic_file f;
    unsigned char *buf = NULL;
    if ((rc = kiln__atomic_open(&f, path)) != 0) {
        free(header);
        return rc;
    }
    uint64_t hlen64 = padded;
    char spaces[64];
    memset(spaces, ' ', sizeof spaces);
    rc = kiln__atomic_write(&f, &hlen64, 8);
    if (rc == 0)
        rc = kiln__atomic_write(&f, header, hlen);
    if (rc == 0)
        rc = kiln__atomic_write(&f, spaces, padded - hlen);
    for (int i = 0; i < n && rc == 0; i++) {
        size_t bytes = (size_t)kiln_tensor_numel(tensors[i]) * kiln_dtype_size(kiln_tensor_dtype(tensors[i]));
        if (bytes == 0)
            continue;
        unsigned char *next = realloc(buf, bytes);
        if (!next) {
            rc = kiln__error_set("safetensors save %s: out of memory for '%s'", path, names[i]);
            rc = KILN_ENOMEM;
            break;
        }
        buf = next;
        if (kiln_to_data(tensors[i], buf, bytes) != 0) {
            rc = KILN_EINVAL; /* kiln_to_data set the message */
            break;
        }
        rc = kiln__atomic_write(&f, buf, bytes);
    }
    free(buf);
    free(header);
    if (rc == 0)
        return kiln__atomic_commit(&f);
    kiln__atomic_abort(&f);
    return rc;
}
