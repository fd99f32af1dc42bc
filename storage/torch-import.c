/*
 * storage/torch-import.c — reading PyTorch weight files (torch.save's zip format).
 *
 * Since PyTorch 1.6 torch.save writes a zip archive whose entries share one top folder
 * (named after the file): <top>/data.pkl is a pickle of the saved object in which each
 * tensor's bytes are a persistent reference to a record <top>/data/<key>, stored raw in
 * the file's byte order (<top>/byteorder, "little" when absent). The pickle is read by
 * the restricted interpreter in pickle.c, so no code from the file ever runs; this file
 * does the zip side (through libzip), flattens the object into dotted names, applies the
 * caller's skip and rename rules (torch-rename.c), and copies tensors out.
 *
 * Every tensor's view (offset, sizes, strides) was checked against its storage's
 * claimed element count by the unpickler; here each storage record must exist and hold
 * exactly that many bytes, and records must be no larger than the archive allows, so a
 * load never reads past a record and never allocates more than the file can justify. The
 * first read of each record checks its CRC-32 against the zip directory.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zip.h>
#include <zlib.h>

#include "error-impl.h"
#include "kiln/record.h"
#include "pickle-impl.h"
#include "storage-impl.h"
#include "torch-import-impl.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "torch records are read as little-endian; a big-endian host needs byte swapping here");

/* ------------------------------------------------------------------ small helpers */

static void pt_list_free(pt_list *l)
{
    for (int i = 0; i < l->n; i++) {
        free(l->e[i].name);
        free(l->e[i].source);
        free(l->e[i].value);
    }
    free(l->e);
    free(l->order);
}

void kiln_torch_close(kiln_torch_file *pt)
{
    if (!pt)
        return;
    if (pt->zip)
        zip_discard(pt->zip);
    pthread_mutex_destroy(&pt->lock);
    pt_list_free(&pt->tensors);
    pt_list_free(&pt->others);
    kiln__pickle_free(pt->pk);
    free(pt->crc_checked);
    free(pt->label);
    free(pt);
}

static pt_entry *pt_list_add(kiln_torch_file *pt, pt_list *l)
{
    if (l->n == l->cap) {
        int ncap = l->cap ? l->cap * 2 : 32;
        pt_entry *n = realloc(l->e, (size_t)ncap * sizeof *n);
        if (!n) {
            kiln__error_set("torch %s: out of memory", pt->label);
            return NULL;
        }
        l->e = n;
        l->cap = ncap;
    }
    pt_entry *e = &l->e[l->n++];
    memset(e, 0, sizeof *e);
    e->record = -1;
    return e;
}

/* Stat a record and check that its size is one the archive can justify. */
static int pt_stat(kiln_torch_file *pt, zip_int64_t idx, const char *what, zip_stat_t *st)
{
    zip_stat_init(st);
    if (zip_stat_index(pt->zip, (zip_uint64_t)idx, 0, st) < 0)
        return kiln__error_set("torch %s: cannot stat %s: %s", pt->label, what, zip_strerror(pt->zip));
    if (!(st->valid & ZIP_STAT_SIZE) || !(st->valid & ZIP_STAT_COMP_SIZE) ||
        !(st->valid & ZIP_STAT_COMP_METHOD))
        return kiln__error_set("torch %s: %s has no size in the zip directory", pt->label, what);
    if ((st->valid & ZIP_STAT_ENCRYPTION_METHOD) && st->encryption_method != ZIP_EM_NONE)
        return kiln__error_set("torch %s: %s is encrypted", pt->label, what);
    if (st->comp_size > pt->archive_len)
        return kiln__error_set("torch %s: %s claims %" PRIu64 " bytes in a %" PRIu64 "-byte archive",
                               pt->label, what, (uint64_t)st->comp_size, pt->archive_len);
    if (st->comp_method == ZIP_CM_STORE ? st->size != st->comp_size
                                        : st->size / PT_DEFLATE_RATIO > st->comp_size + 64)
        return kiln__error_set("torch %s: %s claims %" PRIu64 " bytes from %" PRIu64 " stored bytes",
                               pt->label, what, (uint64_t)st->size, (uint64_t)st->comp_size);
    return 0;
}

/* Read n bytes of an open record into buf (NULL: read and drop them), adding them to *crc
 * when crc is given. */
static int pt_fread(kiln_torch_file *pt, zip_file_t *f, const char *what, unsigned char *buf, uint64_t n,
                    uLong *crc)
{
    unsigned char scratch[16384];
    while (n > 0) {
        unsigned char *to = buf ? buf : scratch;
        uint64_t want = buf ? n : (n < sizeof scratch ? n : sizeof scratch);
        zip_int64_t got = zip_fread(f, to, want);
        if (got < 0)
            return kiln__error_set("torch %s: reading %s failed: %s", pt->label, what,
                                   zip_error_strerror(zip_file_get_error(f)));
        if (got == 0)
            return kiln__error_set("torch %s: %s ends early", pt->label, what);
        if (crc)
            *crc = crc32_z(*crc, to, (z_size_t)got);
        if (buf)
            buf += got;
        n -= (uint64_t)got;
    }
    return 0;
}

/* Read bytes [lo, lo + n) of record idx into buf. The first read of a record reads all of
 * it and checks its CRC-32 against the zip directory: libzip checks only when a read runs
 * into the record's end, which reading exactly a tensor's bytes never does, so a flipped bit
 * would load as a wrong value. Later reads of the record (other views of one storage) read
 * only their bytes, seeking where the record is stored uncompressed (all torch writes). */
static int pt_read(kiln_torch_file *pt, zip_int64_t idx, const char *what, uint64_t lo, void *buf, uint64_t n)
{
    bool check = !pt->crc_checked[idx];
    zip_stat_t zs;
    if (check) {
        if (pt_stat(pt, idx, what, &zs) < 0)
            return -1;
        if (!(zs.valid & ZIP_STAT_CRC))
            return kiln__error_set("torch %s: %s has no CRC-32 in the zip directory", pt->label, what);
    }
    zip_file_t *f = zip_fopen_index(pt->zip, (zip_uint64_t)idx, 0);
    if (!f)
        return kiln__error_set("torch %s: cannot open %s: %s", pt->label, what, zip_strerror(pt->zip));
    uLong crc = crc32(0L, Z_NULL, 0);
    uLong *sum = check ? &crc : NULL;
    int rc = 0;
    if (lo > 0 && (check || zip_fseek(f, (zip_int64_t)lo, SEEK_SET) < 0))
        rc = pt_fread(pt, f, what, NULL, lo, sum);
    if (rc == 0)
        rc = pt_fread(pt, f, what, buf, n, sum);
    if (rc == 0 && check) {
        rc = pt_fread(pt, f, what, NULL, zs.size - lo - n, sum);
        if (rc == 0 && crc != (uLong)zs.crc)
            rc = kiln__error_set("torch %s: %s fails its CRC-32 check (the zip directory says %08" PRIx32
                                 ", the bytes give %08lx): the file is damaged",
                                 pt->label, what, (uint32_t)zs.crc, (unsigned long)crc);
        if (rc == 0)
            pt->crc_checked[idx] = 1;
    }
    zip_fclose(f);
    return rc;
}

/* A whole small record (data.pkl, byteorder) into a fresh buffer. */
static unsigned char *pt_slurp(kiln_torch_file *pt, zip_int64_t idx, const char *what, uint64_t max, size_t *len)
{
    zip_stat_t st;
    if (pt_stat(pt, idx, what, &st) < 0)
        return NULL;
    if (st.size > max) {
        kiln__error_set("torch %s: %s is %" PRIu64 " bytes, more than the %" PRIu64 " allowed", pt->label,
                        what, (uint64_t)st.size, max);
        return NULL;
    }
    unsigned char *b = malloc(st.size ? st.size : 1);
    if (!b) {
        kiln__error_set("torch %s: out of memory reading %s", pt->label, what);
        return NULL;
    }
    if (pt_read(pt, idx, what, 0, b, st.size) < 0) {
        free(b);
        return NULL;
    }
    *len = st.size;
    return b;
}

static zip_int64_t pt_locate(kiln_torch_file *pt, const char *rest)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", pt->top, rest);
    return zip_name_locate(pt->zip, path, 0);
}

/* ------------------------------------------------------------------ flattening */

typedef struct pt_name {
    char s[PT_MAX_NAME + 1];
    size_t n;
} pt_name;

static int pt_add_tensor(kiln_torch_file *pt, const pt_name *nm, const kiln__pk_tensor *t)
{
    const kiln__pk_storage *st = &t->storage->u.storage;
    char rest[300], what[1024];
    snprintf(rest, sizeof rest, "data/%s", st->key);
    snprintf(what, sizeof what, "record '%s/%s' of tensor '%.200s'", pt->top, rest, nm->s);
    zip_int64_t idx = pt_locate(pt, rest);
    if (idx < 0)
        return kiln__error_set("torch %s: %s is missing", pt->label, what);
    zip_stat_t zs;
    if (pt_stat(pt, idx, what, &zs) < 0)
        return -1;
    uint64_t want = st->numel * st->elem_size; /* cannot overflow: checked by the unpickler */
    if (zs.size != want)
        return kiln__error_set("torch %s: %s holds %" PRIu64 " bytes but %" PRIu64 " %s elements need %" PRIu64,
                               pt->label, what, (uint64_t)zs.size, st->numel, st->type_name, want);
    pt_entry *e = pt_list_add(pt, &pt->tensors);
    if (!e)
        return -1;
    e->t = t;
    e->record = idx;
    e->source = strdup(nm->s);
    if (!e->source)
        return kiln__error_set("torch %s: out of memory", pt->label);
    return 0;
}

static int pt_add_other(kiln_torch_file *pt, const pt_name *nm, const kiln__pk_value *v)
{
    char text[200];
    kiln__pk_describe(v, text, sizeof text);
    pt_entry *e = pt_list_add(pt, &pt->others);
    if (!e)
        return -1;
    e->source = strdup(nm->s);
    e->value = strdup(text);
    if (!e->source || !e->value)
        return kiln__error_set("torch %s: out of memory", pt->label);
    return 0;
}

/* Append ".part" (no dot at the root) to nm; returns the old length to restore, or -1. */
static int pt_push_name(kiln_torch_file *pt, pt_name *nm, const char *part, size_t plen, size_t *old)
{
    *old = nm->n;
    size_t extra = plen + (nm->n ? 1 : 0);
    if (memchr(part, 0, plen))
        return kiln__error_set("torch %s: a key under '%.200s' contains a NUL byte", pt->label, nm->s);
    if (nm->n + extra > PT_MAX_NAME)
        return kiln__error_set("torch %s: a name under '%.200s' is longer than %d bytes", pt->label, nm->s,
                               PT_MAX_NAME);
    if (nm->n)
        nm->s[nm->n++] = '.';
    memcpy(nm->s + nm->n, part, plen);
    nm->n += plen;
    nm->s[nm->n] = 0;
    return 0;
}

static int pt_walk(kiln_torch_file *pt, const kiln__pk_value *v, pt_name *nm, int depth)
{
    if (++pt->visited > PT_MAX_LEAVES)
        return kiln__error_set("torch %s: more than %u values to flatten", pt->label, PT_MAX_LEAVES);
    if (depth > PT_MAX_DEPTH)
        return kiln__error_set("torch %s: '%.200s' is nested deeper than %d levels", pt->label, nm->s,
                               PT_MAX_DEPTH);
    size_t old;
    char num[32];
    switch (v->kind) {
    case KILN__PK_TENSOR:
        return pt_add_tensor(pt, nm, v->u.tensor);
    case KILN__PK_DICT:
        if (v->u.dict.n == 0)
            break;
        for (size_t i = 0; i < v->u.dict.n; i++) {
            const kiln__pk_value *k = v->u.dict.keys[i];
            const char *part = num;
            size_t plen;
            if (k->kind == KILN__PK_STR) {
                part = k->u.str.s;
                plen = k->u.str.len;
            } else if (k->kind == KILN__PK_INT) {
                plen = (size_t)snprintf(num, sizeof num, "%" PRId64, k->u.i);
            } else {
                return kiln__error_set("torch %s: a key under '%.200s' is neither a string nor an integer",
                                       pt->label, nm->s);
            }
            if (pt_push_name(pt, nm, part, plen, &old) < 0 || pt_walk(pt, v->u.dict.vals[i], nm, depth + 1) < 0)
                return -1;
            nm->n = old;
            nm->s[old] = 0;
        }
        return 0;
    case KILN__PK_LIST:
    case KILN__PK_TUPLE:
        if (v->u.seq.n == 0)
            break;
        for (size_t i = 0; i < v->u.seq.n; i++) {
            size_t plen = (size_t)snprintf(num, sizeof num, "%zu", i);
            if (pt_push_name(pt, nm, num, plen, &old) < 0 || pt_walk(pt, v->u.seq.items[i], nm, depth + 1) < 0)
                return -1;
            nm->n = old;
            nm->s[old] = 0;
        }
        return 0;
    default:
        break;
    }
    return pt_add_other(pt, nm, v);
}

/* ------------------------------------------------------------------ opening */

/* Everything after the zip opened: find the archive's folder, refuse what is not a
 * state_dict-style torch.save file, interpret data.pkl, flatten, apply the rules. */
static int pt_setup(kiln_torch_file *pt, const kiln_torch_options *o)
{
    zip_int64_t n = zip_get_num_entries(pt->zip, 0);
    if (n <= 0)
        return kiln__error_set("torch %s: the zip archive is empty", pt->label);
    if ((uint64_t)n > PT_MAX_ENTRIES)
        return kiln__error_set("torch %s: %" PRId64 " records is more than the %u allowed", pt->label, (int64_t)n,
                               PT_MAX_ENTRIES);
    pt->crc_checked = calloc((size_t)n, 1);
    if (!pt->crc_checked)
        return kiln__error_set("torch %s: out of memory", pt->label);
    /* torch names the folder after the file and reads it from the first record, as here */
    const char *first = zip_get_name(pt->zip, 0, ZIP_FL_ENC_RAW);
    const char *slash = first ? strchr(first, '/') : NULL;
    if (!slash || slash == first || (size_t)(slash - first) >= sizeof pt->top)
        return kiln__error_set("torch %s: the first record is not inside a folder: not a torch.save file",
                               pt->label);
    memcpy(pt->top, first, (size_t)(slash - first));
    pt->top[slash - first] = 0;

    if (pt_locate(pt, "constants.pkl") >= 0 || pt_locate(pt, "code/") >= 0)
        return kiln__error_set("torch %s: this is a TorchScript archive (torch.jit.save); save the weights "
                               "with torch.save(model.state_dict(), path) instead", pt->label);
    zip_int64_t pkl = pt_locate(pt, "data.pkl");
    if (pkl < 0)
        return kiln__error_set("torch %s: no %s/data.pkl record: not a torch.save file", pt->label, pt->top);

    zip_int64_t bo = pt_locate(pt, "byteorder");
    if (bo >= 0) {
        size_t len;
        unsigned char *b = pt_slurp(pt, bo, "the byteorder record", 16, &len);
        if (!b)
            return -1;
        bool little = len == 6 && memcmp(b, "little", 6) == 0, big = len == 3 && memcmp(b, "big", 3) == 0;
        free(b);
        if (big)
            return kiln__error_set("torch %s: the file was written on a big-endian machine; kiln reads "
                                   "little-endian files only (re-save it on a little-endian one)", pt->label);
        if (!little)
            return kiln__error_set("torch %s: the byteorder record is neither 'little' nor 'big'", pt->label);
    }

    size_t len;
    char what[300];
    snprintf(what, sizeof what, "%s/data.pkl", pt->top);
    unsigned char *bytes = pt_slurp(pt, pkl, what, PT_MAX_PICKLE, &len);
    if (!bytes)
        return -1;
    char label[700];
    snprintf(label, sizeof label, "%s:%s", pt->label, what);
    pt->pk = kiln__pickle_load(bytes, len, label, NULL);
    free(bytes);
    if (!pt->pk)
        return -1;

    pt_name *nm = calloc(1, sizeof *nm);
    if (!nm)
        return kiln__error_set("torch %s: out of memory", pt->label);
    int rc = pt_walk(pt, kiln__pickle_root(pt->pk), nm, 0);
    free(nm);
    if (rc < 0)
        return -1;

    pt_rules rules;
    rc = kiln__pt_rules_compile(pt, o, &rules);
    if (rc == 0)
        rc = kiln__pt_apply_rules(pt, &pt->tensors, o, &rules);
    if (rc == 0)
        rc = kiln__pt_apply_rules(pt, &pt->others, o, &rules);
    kiln__pt_rules_free(&rules);
    if (rc == 0)
        rc = kiln__pt_index(pt, &pt->tensors, "tensors");
    if (rc == 0)
        rc = kiln__pt_index(pt, &pt->others, "values");
    return rc;
}

static kiln_torch_file *pt_new(const char *label, uint64_t archive_len)
{
    kiln_torch_file *pt = calloc(1, sizeof *pt);
    if (!pt || !(pt->label = strdup(label))) {
        free(pt);
        kiln__error_set("torch %s: out of memory", label);
        return NULL;
    }
    pthread_mutex_init(&pt->lock, NULL);
    pt->archive_len = archive_len;
    return pt;
}

/* What to say about bytes that are not a zip archive. */
static int pt_not_zip(const char *label, const unsigned char *head, size_t n)
{
    if (n >= 2 && head[0] == 0x80 && head[1] <= 5)
        return kiln__error_set("torch %s: this is the legacy (pre-1.6, non-zip) torch.save format, which kiln "
                               "does not read; re-save it with a current PyTorch: "
                               "torch.save(torch.load(path), path)", label);
    return kiln__error_set("torch %s: not a zip archive, so not a torch.save file", label);
}

static kiln_torch_file *pt_finish(kiln_torch_file *pt, zip_t *zip, zip_error_t *ze, const kiln_torch_options *o)
{
    if (!zip) {
        kiln__error_set("torch %s: cannot read the zip archive: %s", pt->label, zip_error_strerror(ze));
        zip_error_fini(ze);
        kiln_torch_close(pt);
        return NULL;
    }
    zip_error_fini(ze);
    pt->zip = zip;
    if (pt_setup(pt, o) < 0) {
        kiln_torch_close(pt);
        return NULL;
    }
    return pt;
}

kiln_torch_file *kiln_torch_open(const char *path, const kiln_torch_options *opts)
{
    if (!path) {
        kiln__error_set("torch: path is NULL");
        return NULL;
    }
    struct stat sb;
    int fd = kiln__open_regular(path, &sb);
    if (fd == KILN__NOT_REGULAR) {
        kiln__error_set("torch %s: not a regular file", path);
        return NULL;
    }
    if (fd < 0) {
        kiln__error_set("torch %s: %s", path, strerror(errno));
        return NULL;
    }
    unsigned char head[4] = {0};
    ssize_t got = read(fd, head, sizeof head);
    if (got < 4 || memcmp(head, "PK", 2) != 0) {
        close(fd);
        pt_not_zip(path, head, got > 0 ? (size_t)got : 0);
        return NULL;
    }
    kiln_torch_file *pt = pt_new(path, (uint64_t)sb.st_size);
    if (!pt) {
        close(fd);
        return NULL;
    }
    /* libzip reads through its own descriptor from here; the size above bounds records */
    zip_error_t ze;
    zip_error_init(&ze);
    zip_t *zip = zip_fdopen(fd, ZIP_RDONLY | ZIP_CHECKCONS, &ze.zip_err);
    if (!zip)
        close(fd);
    return pt_finish(pt, zip, &ze, opts);
}

kiln_torch_file *kiln_torch_open_memory(const void *data, size_t len, const kiln_torch_options *opts)
{
    if (!data && len) {
        kiln__error_set("torch: data is NULL");
        return NULL;
    }
    if (len < 4 || memcmp(data, "PK", 2) != 0) {
        pt_not_zip("<memory>", data, len);
        return NULL;
    }
    kiln_torch_file *pt = pt_new("<memory>", len);
    if (!pt)
        return NULL;
    zip_error_t ze;
    zip_error_init(&ze);
    zip_source_t *src = zip_source_buffer_create(data, len, 0, &ze);
    zip_t *zip = NULL;
    if (src) {
        zip = zip_open_from_source(src, ZIP_RDONLY | ZIP_CHECKCONS, &ze);
        if (!zip)
            zip_source_free(src); /* on success the archive owns the source */
    }
    return pt_finish(pt, zip, &ze, opts);
}

/* ------------------------------------------------------------------ accessors */

int kiln_torch_count(const kiln_torch_file *pt)
{
    return pt ? pt->tensors.n : 0;
}

const char *kiln_torch_name(const kiln_torch_file *pt, int i)
{
    return pt && i >= 0 && i < pt->tensors.n ? pt->tensors.e[i].name : NULL;
}

const char *kiln_torch_source_name(const kiln_torch_file *pt, int i)
{
    return pt && i >= 0 && i < pt->tensors.n ? pt->tensors.e[i].source : NULL;
}

static int pt_find(const pt_list *l, const char *name)
{
    int lo = 0, hi = l->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(l->e[l->order[mid]].name, name);
        if (c == 0)
            return l->order[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

int kiln_torch_find(const kiln_torch_file *pt, const char *name)
{
    return pt && name ? pt_find(&pt->tensors, name) : -1;
}

int kiln_torch_info(const kiln_torch_file *pt, int i, int *dtype, int *ndim, int64_t *shape)
{
    if (!pt || i < 0 || i >= pt->tensors.n)
        return kiln__error_set("torch: no tensor at index %d", i); /* as kiln_safetensors_info says */
    const kiln__pk_tensor *t = pt->tensors.e[i].t;
    if (t->too_many_dims) /* its shape does not fit the caller's KILN_MAX_DIMS entries */
        return kiln__error_set("torch %s: tensor '%.200s' %s", pt->label, pt->tensors.e[i].name, t->refused);
    if (dtype)
        *dtype = t->storage->u.storage.dtype;
    if (ndim)
        *ndim = t->ndim;
    if (shape)
        memcpy(shape, t->size, (size_t)t->ndim * sizeof *shape);
    return 0;
}

const char *kiln_torch_storage_type(const kiln_torch_file *pt, int i)
{
    return pt && i >= 0 && i < pt->tensors.n ? pt->tensors.e[i].t->storage->u.storage.type_name : NULL;
}

int kiln_torch_other_count(const kiln_torch_file *pt)
{
    return pt ? pt->others.n : 0;
}

const char *kiln_torch_other_name(const kiln_torch_file *pt, int i)
{
    return pt && i >= 0 && i < pt->others.n ? pt->others.e[i].name : NULL;
}

const char *kiln_torch_other_value(const kiln_torch_file *pt, int i)
{
    return pt && i >= 0 && i < pt->others.n ? pt->others.e[i].value : NULL;
}

/* ------------------------------------------------------------------ loading */

/* Copy the view's elements, row-major, from span (storage elements [first, ...)). */
static void pt_gather(const kiln__pk_tensor *t, size_t elem, const unsigned char *span, uint64_t first,
                      unsigned char *out, uint64_t numel)
{
    int64_t idx[KILN_MAX_DIMS] = {0};
    uint64_t at = t->offset - first; /* element offset of idx within span */
    for (uint64_t k = 0; k < numel; k++) {
        memcpy(out + k * elem, span + at * elem, elem);
        for (int d = t->ndim - 1; d >= 0; d--) { /* odometer step over the last dims first */
            if (++idx[d] < t->size[d]) {
                at += (uint64_t)t->stride[d];
                break;
            }
            at -= (uint64_t)t->stride[d] * (uint64_t)(t->size[d] - 1);
            idx[d] = 0;
        }
    }
}

kiln_tensor *kiln_torch_load(const kiln_torch_file *cpt, const char *name, kiln_device *dev)
{
    if (!cpt) {
        kiln__error_set("torch load '%.200s': the file handle (pt) is NULL", name ? name : "(null)");
        return NULL;
    }
    if (!dev) {
        kiln__error_set("torch %s: load '%.200s': the device (dev) is NULL", cpt->label, name ? name : "(null)");
        return NULL;
    }
    kiln_torch_file *pt = (kiln_torch_file *)cpt; /* only the lock and the zip cursor change */
    int i = kiln_torch_find(pt, name);
    if (i < 0) {
        kiln__error_set("torch %s: no tensor named '%.200s'", pt->label, name ? name : "(null)");
        return NULL;
    }
    const pt_entry *e = &pt->tensors.e[i];
    const kiln__pk_tensor *t = e->t;
    const kiln__pk_storage *st = &t->storage->u.storage;
    if (t->refused[0]) {
        kiln__error_set("torch %s: tensor '%.200s' %s", pt->label, e->name, t->refused);
        return NULL;
    }
    if (st->dtype < 0) {
        kiln__error_set("torch %s: tensor '%.200s' is stored as %s, a dtype kiln does not support", pt->label,
                        e->name, st->type_name);
        return NULL;
    }
    size_t elem = st->elem_size;
    uint64_t numel = 1, last = t->offset;
    for (int d = 0; d < t->ndim; d++)
        numel *= (uint64_t)t->size[d]; /* bounded by the storage's element count (pickle.c) */
    for (int d = 0; d < t->ndim && numel > 0; d++)
        last += (uint64_t)(t->size[d] - 1) * (uint64_t)t->stride[d];
    unsigned char *out = malloc(numel ? numel * elem : 1), *span = NULL;
    if (!out) {
        kiln__error_set("torch %s: out of memory loading '%.200s'", pt->label, e->name);
        return NULL;
    }
    int rc = 0;
    if (numel > 0) {
        uint64_t span_bytes = (last - t->offset + 1) * elem; /* last < storage numel: checked */
        span = malloc(span_bytes);
        char what[1024];
        snprintf(what, sizeof what, "record '%s/data/%s' of tensor '%.200s'", pt->top, st->key, e->source);
        if (!span)
            rc = kiln__error_set("torch %s: out of memory loading '%.200s'", pt->label, e->name);
        if (rc == 0) {
            pthread_mutex_lock(&pt->lock);
            rc = pt_read(pt, e->record, what, t->offset * elem, span, span_bytes);
            pthread_mutex_unlock(&pt->lock);
        }
        if (rc == 0)
            pt_gather(t, elem, span, t->offset, out, numel);
        free(span);
        /* A bool byte other than 0 or 1 is undefined once read as _Bool: normalize. */
        if (rc == 0 && st->dtype == KILN_BOOL)
            for (uint64_t k = 0; k < numel; k++)
                out[k] = out[k] != 0;
    }
    kiln_tensor *r = NULL;
    if (rc == 0)
        r = kiln_from_data(dev, (kiln_dtype)st->dtype, t->ndim, t->size, out, numel * elem);
    free(out);
    return r;
}
