/*
 * storage/record.c — a module's state on disk: named tensors plus its JSON config.
 *
 * A record is a safetensors file (written by kiln_safetensors_save) whose __metadata__
 * carries "kiln.record" and "kiln.config", so other safetensors readers still open it.
 * Compression wraps the whole file: "KILNZSTD", the uncompressed size as a little-endian
 * u64, then one zstd frame. The magic cannot be mistaken for a plain file, whose first 8
 * bytes are a header length that the reader refuses above 100 MB.
 *
 * Compressed saving first lets kiln_safetensors_save write the plain file to a temporary
 * sibling (so the one safetensors writer stays the only one), then compresses it into the
 * destination through the atomic-file helpers and removes the sibling on every path.
 *
 * Loading by slots is where version tolerance lives: the caller says which names, dtypes
 * and shapes it expects and the report says what did not line up.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "error-impl.h"
#include "kiln/record.h"
#include "storage-impl.h"

#define RECORD_MAGIC "KILNZSTD"
#define RECORD_MAGIC_LEN 8
/* A decompressed record larger than this is refused rather than allocated: the size field
 * is untrusted input. */
#define RECORD_MAX_RAW ((uint64_t)1 << 40)
/* zstd level 3 is its own default: most of the gain for a fraction of the time. */
#define RECORD_ZSTD_LEVEL 3

struct kiln_record {
    kiln_safetensors *st;
    unsigned char *raw;   /* decompressed image (or in-memory copy) the handle points into */
    char *config;
    bool compressed;
};

/* ----------------------------------------------------------------------- saving */

static int record_compress_file(const char *raw_path, const char *path)
{
    char *raw = NULL;
    size_t raw_len = 0;
    int rc = kiln__read_file(raw_path, (size_t)RECORD_MAX_RAW, &raw, &raw_len);
    if (rc != 0)
        return rc;
    size_t bound = ZSTD_compressBound(raw_len);
    unsigned char *out = malloc(RECORD_MAGIC_LEN + 8 + bound);
    if (!out) {
        free(raw);
        return kiln__error_set_code(KILN_ENOMEM, "record save %s: out of memory compressing", path);
    }
    /* The frame carries zstd's content checksum (xxhash64 of the data), which decompression
     * checks: a flipped byte in the file is an error at open, never weights that load wrong.
     * Frames written before it had none; they still open. */
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    size_t z = cctx ? ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, RECORD_ZSTD_LEVEL) : (size_t)-1;
    if (cctx && !ZSTD_isError(z))
        z = ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
    if (cctx && !ZSTD_isError(z))
        z = ZSTD_compress2(cctx, out + RECORD_MAGIC_LEN + 8, bound, raw, raw_len);
    ZSTD_freeCCtx(cctx);
    free(raw);
    if (ZSTD_isError(z)) {
        free(out);
        return kiln__error_set("record save %s: zstd: %s", path, ZSTD_getErrorName(z)), KILN_EIO;
    }
    memcpy(out, RECORD_MAGIC, RECORD_MAGIC_LEN);
    uint64_t n = raw_len;
    memcpy(out + RECORD_MAGIC_LEN, &n, 8);
    rc = kiln__write_file_atomic(path, out, RECORD_MAGIC_LEN + 8 + z);
    free(out);
    return rc;
}

int kiln_record_save(const char *path, int n, const char *const *names, kiln_tensor *const *tensors,
                     const char *config_json, unsigned flags)
{
    if (!path)
        return kiln__error_set("record save: path is NULL"), KILN_EINVAL;
    if (flags & ~(unsigned)KILN_RECORD_ZSTD)
        return kiln__error_set("record save %s: unknown flags 0x%x", path, flags), KILN_EINVAL;
    const char *config = config_json ? config_json : "{}";
    /* One JSON object and nothing after it: cJSON_Parse alone stops at the end of the first
     * value, so "{} trailing" would be stored and read back as text no parser accepts. */
    const char *end = NULL;
    cJSON *parsed = cJSON_ParseWithOpts(config, &end, true);
    bool object = cJSON_IsObject(parsed);
    cJSON_Delete(parsed);
    if (!parsed)
        return kiln__error_set("record save %s: the config is not valid JSON (at byte %zu)", path,
                               end ? (size_t)(end - config) : (size_t)0),
               KILN_EINVAL;
    if (!object)
        return kiln__error_set("record save %s: the config must be a JSON object", path), KILN_EINVAL;
    const char *keys[] = {"kiln.record", "kiln.config"};
    const char *values[] = {"1", config};
    if (!(flags & KILN_RECORD_ZSTD))
        return kiln_safetensors_save(path, n, names, tensors, 2, keys, values);

    /* Plain image to a sibling, then compress it into place. */
    size_t len = strlen(path) + 48;
    char *raw_path = malloc(len);
    if (!raw_path)
        return kiln__error_set_code(KILN_ENOMEM, "record save %s: out of memory", path);
    static unsigned counter;
    snprintf(raw_path, len, "%s.tmp.raw.%ld.%u", path, (long)getpid(), __atomic_fetch_add(&counter, 1, 0));
    int rc = kiln_safetensors_save(raw_path, n, names, tensors, 2, keys, values);
    if (rc == 0)
        rc = record_compress_file(raw_path, path);
    unlink(raw_path);
    free(raw_path);
    return rc;
}

/* ---------------------------------------------------------------------- opening */

static kiln_record *record_finish(kiln_record *rec, const char *label)
{
    if (!rec->st) {
        kiln_record_close(rec);
        return NULL;
    }
    const char *cfg = kiln_safetensors_metadata(rec->st, "kiln.config");
    rec->config = strdup(cfg ? cfg : "{}");
    if (!rec->config) {
        kiln__error_set("record %s: out of memory", label);
        kiln_record_close(rec);
        return NULL;
    }
    return rec;
}

/* Decompress a "KILNZSTD" image into rec->raw and open it. */
static int record_inflate(kiln_record *rec, const unsigned char *data, size_t len, const char *label)
{
    if (len < RECORD_MAGIC_LEN + 8)
        return kiln__error_set("record %s: compressed header is truncated", label), KILN_EINVAL;
    uint64_t raw_len;
    memcpy(&raw_len, data + RECORD_MAGIC_LEN, 8);
    const unsigned char *frame = data + RECORD_MAGIC_LEN + 8;
    size_t frame_len = len - RECORD_MAGIC_LEN - 8;
    unsigned long long content = ZSTD_getFrameContentSize(frame, frame_len);
    if (content == ZSTD_CONTENTSIZE_ERROR || raw_len > RECORD_MAX_RAW ||
        (content != ZSTD_CONTENTSIZE_UNKNOWN && content != raw_len))
        return kiln__error_set("record %s: corrupt compressed record (size %llu, frame says %llu)", label,
                               (unsigned long long)raw_len, content), KILN_EINVAL;
    rec->raw = malloc(raw_len ? (size_t)raw_len : 1);
    if (!rec->raw)
        return kiln__error_set_code(KILN_ENOMEM, "record %s: out of memory for %llu bytes", label,
                                    (unsigned long long)raw_len);
    size_t got = ZSTD_decompress(rec->raw, (size_t)raw_len, frame, frame_len);
    if (ZSTD_isError(got) || got != raw_len)
        return kiln__error_set("record %s: corrupt compressed record: %s", label,
                               ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short frame"), KILN_EINVAL;
    rec->compressed = true;
    rec->st = kiln_safetensors_open_memory(rec->raw, (size_t)raw_len);
    return rec->st ? 0 : KILN_EINVAL;
}

kiln_record *kiln_record_open_memory(const void *data, size_t len)
{
    if (!data && len)
        return kiln__error_set("record: NULL data"), NULL;
    kiln_record *rec = calloc(1, sizeof *rec);
    if (!rec)
        return kiln__error_set("record: out of memory"), NULL;
    if (len >= RECORD_MAGIC_LEN && memcmp(data, RECORD_MAGIC, RECORD_MAGIC_LEN) == 0) {
        if (record_inflate(rec, data, len, "(memory)") != 0) {
            kiln_record_close(rec);
            return NULL;
        }
        return record_finish(rec, "(memory)");
    }
    rec->raw = malloc(len ? len : 1);
    if (!rec->raw) {
        kiln_record_close(rec);
        return kiln__error_set("record: out of memory"), NULL;
    }
    if (len)
        memcpy(rec->raw, data, len);
    rec->st = kiln_safetensors_open_memory(rec->raw, len);
    return record_finish(rec, "(memory)");
}

kiln_record *kiln_record_open(const char *path)
{
    if (!path)
        return kiln__error_set("record open: path is NULL"), NULL;
    unsigned char head[RECORD_MAGIC_LEN];
    int fd = kiln__open_regular(path, NULL);
    if (fd == KILN__NOT_REGULAR)
        return kiln__error_set("record %s: not a regular file", path), NULL;
    if (fd < 0)
        return kiln__error_set("record %s: %s", path, strerror(errno)), NULL;
    ssize_t got = read(fd, head, sizeof head);
    close(fd);
    kiln_record *rec = calloc(1, sizeof *rec);
    if (!rec)
        return kiln__error_set("record %s: out of memory", path), NULL;
    if (got == RECORD_MAGIC_LEN && memcmp(head, RECORD_MAGIC, RECORD_MAGIC_LEN) == 0) {
        char *img = NULL;
        size_t len = 0;
        if (kiln__read_file(path, (size_t)RECORD_MAX_RAW, &img, &len) != 0 ||
            record_inflate(rec, (unsigned char *)img, len, path) != 0) {
            free(img);
            kiln_record_close(rec);
            return NULL;
        }
        free(img);
        return record_finish(rec, path);
    }
    /* Plain: let the safetensors reader map it. */
    rec->st = kiln_safetensors_open(path);
    return record_finish(rec, path);
}

void kiln_record_close(kiln_record *rec)
{
    if (!rec)
        return;
    kiln_safetensors_close(rec->st);
    free(rec->raw);
    free(rec->config);
    free(rec);
}

const char *kiln_record_config(const kiln_record *rec)
{
    return rec ? rec->config : NULL;
}

bool kiln_record_compressed(const kiln_record *rec)
{
    return rec && rec->compressed;
}

const kiln_safetensors *kiln_record_tensors(const kiln_record *rec)
{
    return rec ? rec->st : NULL;
}

/* ---------------------------------------------------------------------- loading */

static int report_add(int *count, char ***list, const char *name)
{
    char **next = realloc(*list, (size_t)(*count + 1) * sizeof **list);
    if (!next)
        return KILN_ENOMEM;
    *list = next;
    if (!(next[*count] = strdup(name)))
        return KILN_ENOMEM;
    (*count)++;
    return 0;
}

void kiln_record_report_free(kiln_record_report *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->nmissing; i++)
        free(r->missing[i]);
    for (int i = 0; i < r->nunexpected; i++)
        free(r->unexpected[i]);
    for (int i = 0; i < r->nconverted; i++)
        free(r->converted[i]);
    free(r->missing);
    free(r->unexpected);
    free(r->converted);
    memset(r, 0, sizeof *r);
}

static void shape_text(char *buf, size_t len, int ndim, const int64_t *shape)
{
    size_t used = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < ndim && used < len; d++)
        used += (size_t)snprintf(buf + used, len - used, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (used < len)
        snprintf(buf + used, len - used, "]");
}

/* "a, b, c" of a name list, shortened for the error message. */
static void names_text(char *buf, size_t len, int n, char **names)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && used + 1 < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s'%s'", i ? ", " : "", names[i]);
}

int kiln_record_load_slots(const kiln_record *rec, int n, const kiln_record_slot *slots, kiln_device *dev,
                           kiln_record_mode mode, kiln_tensor **out, kiln_record_report *report)
{
    kiln_record_report local = {0};
    kiln_record_report *r = report ? report : &local;
    memset(r, 0, sizeof *r);
    for (int i = 0; i < n && out; i++)
        out[i] = NULL;
    if (!rec || !dev || n < 0 || (n > 0 && (!slots || !out)))
        return kiln__error_set("record load: invalid arguments"), KILN_EINVAL;
    const kiln_safetensors *st = rec->st;
    int rc = 0;

    /* Pass 1: match names and check shapes before any tensor is created. */
    for (int i = 0; i < n && rc == 0; i++) {
        const kiln_record_slot *s = &slots[i];
        if (!s->name) {
            rc = kiln__error_set("record load: slot %d has no name", i);
            rc = KILN_EINVAL;
            break;
        }
        /* -1 is "as stored"; any other value outside the dtypes is a caller's mistake, not
         * a wish to keep the stored dtype */
        if (s->dtype < -1 || s->dtype >= KILN_DTYPE_COUNT) {
            kiln__error_set("record load: slot '%s' asks for dtype %d, which is neither a kiln dtype nor -1 "
                            "(as stored)",
                            s->name, s->dtype);
            rc = KILN_EINVAL;
            break;
        }
        /* The shape compare and the message walk s->ndim entries of s->shape, which holds
         * KILN_MAX_DIMS: a larger rank would read past the slot. */
        if (s->ndim < -1 || s->ndim > KILN_MAX_DIMS) {
            kiln__error_set("record load: slot '%s' has ndim %d, which is neither -1 (any shape) nor "
                            "0..%d (KILN_MAX_DIMS)",
                            s->name, s->ndim, KILN_MAX_DIMS);
            rc = KILN_EINVAL;
            break;
        }
        int idx = kiln_safetensors_find(st, s->name);
        if (idx < 0) {
            if (report_add(&r->nmissing, &r->missing, s->name) != 0)
                rc = KILN_ENOMEM;
            continue;
        }
        int dt, ndim;
        int64_t shape[KILN_MAX_DIMS];
        kiln_safetensors_info(st, idx, &dt, &ndim, shape);
        if (s->ndim >= 0 && (ndim != s->ndim || memcmp(shape, s->shape, (size_t)ndim * sizeof *shape) != 0)) {
            char want[160], have[160];
            shape_text(want, sizeof want, s->ndim, s->shape);
            shape_text(have, sizeof have, ndim, shape);
            kiln__error_set("record load: '%s' has shape %s in the file but %s is expected", s->name, have, want);
            rc = KILN_EINVAL;
        }
    }
    for (int j = 0; rc == 0 && j < kiln_safetensors_count(st); j++) {
        const char *name = kiln_safetensors_name(st, j);
        bool asked = false;
        for (int i = 0; i < n && !asked; i++)
            asked = strcmp(slots[i].name, name) == 0;
        if (!asked && report_add(&r->nunexpected, &r->unexpected, name) != 0)
            rc = KILN_ENOMEM;
    }
    if (rc == KILN_ENOMEM)
        kiln__error_set("record load: out of memory");
    if (rc == 0 && mode == KILN_RECORD_STRICT) {
        /* Optional slots may be missing even in strict mode. */
        int required = 0;
        char **req = calloc((size_t)r->nmissing + 1, sizeof *req);
        for (int m = 0; req && m < r->nmissing; m++)
            for (int i = 0; i < n; i++)
                if (strcmp(slots[i].name, r->missing[m]) == 0 && !slots[i].optional) {
                    req[required++] = r->missing[m];
                    break;
                }
        char list[400];
        if (!req) {
            rc = kiln__error_set("record load: out of memory");
            rc = KILN_ENOMEM;
        } else if (required > 0) {
            names_text(list, sizeof list, required, req);
            kiln__error_set("record load (strict): %d missing key(s): %s", required, list);
            rc = KILN_EINVAL;
        } else if (r->nunexpected > 0) {
            names_text(list, sizeof list, r->nunexpected, r->unexpected);
            kiln__error_set("record load (strict): %d unexpected key(s): %s", r->nunexpected, list);
            rc = KILN_EINVAL;
        }
        free(req);
    }

    /* Pass 2: load and convert. Our own scope owns intermediates; results are kept. */
    kiln_scope_begin();
    for (int i = 0; i < n && rc == 0; i++) {
        const kiln_record_slot *s = &slots[i];
        int idx = kiln_safetensors_find(st, s->name);
        if (idx < 0)
            continue;
        kiln_tensor *t = kiln_safetensors_load(st, s->name, dev);
        if (t && s->dtype >= 0 && (int)kiln_tensor_dtype(t) != s->dtype) { /* dtype checked in pass 1 */
            t = kiln_cast(t, (kiln_dtype)s->dtype);
            if (t && report_add(&r->nconverted, &r->converted, s->name) != 0) {
                kiln__error_set("record load: out of memory");
                t = NULL;
            }
        }
        if (!t) {
            rc = KILN_EINVAL;
            break;
        }
        out[i] = kiln_keep(t);
    }
    kiln_scope_end();
    if (rc != 0)
        for (int i = 0; i < n; i++) {
            kiln_tensor_release(out[i]);
            out[i] = NULL;
        }
    if (!report)
        kiln_record_report_free(&local);
    return rc;
}
