/*
 * engine/data/readers.c — data sets read from files: IDX (MNIST's format, gzipped or
 * not), CSV with a header, and safetensors.
 *
 * Each reader decodes the whole file at creation into the in-memory arrays form: the
 * sets this targets (Fashion-MNIST is 47 MB of bytes, 188 MB as floats) fit easily, and
 * an error found while reading belongs at creation, with the file and the position, not
 * in the middle of epoch 3 on a worker thread.
 */
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "data-impl.h"
#include "error-impl.h"
#include "kiln/record.h"
#include "storage-impl.h"

kiln_dataset *kiln__dataset_arrays_take(const kiln_dataset_info *info, float *x, double *t, const char *name);

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* -------------------------------------------------------------------------- IDX */

typedef struct idx_file {
    int type;          /* 0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64 */
    int ndim;
    int64_t dims[KILN_MAX_DIMS];
    int64_t count;     /* elements */
    double *values;    /* decoded */
} idx_file;

static int gz_read_exact(gzFile f, void *buf, size_t n, const char *path, int64_t offset, const char *what)
{
    size_t got = 0;
    while (got < n) {
        unsigned chunk = n - got > (1u << 30) ? 1u << 30 : (unsigned)(n - got);
        int r = gzread(f, (char *)buf + got, chunk);
        if (r < 0) {
            int e;
            const char *msg = gzerror(f, &e);
            return kiln__error_set("idx: %s: %s at byte %lld: %s", path, what, (long long)(offset + (int64_t)got),
                                   msg);
        }
        if (r == 0)
            return kiln__error_set("idx: %s: truncated: %s needs %zu bytes at byte %lld, file ends at byte %lld",
                                   path, what, n, (long long)offset, (long long)(offset + (int64_t)got));
        got += (size_t)r;
    }
    return 0;
}

/*
 * The data section: bytes bytes at byte off. The buffer grows with what actually arrives
 * (doubling from 1 MiB), so a header that promises more than the file holds fails at the
 * file's end having allocated about what the file has, not what the header claims; a
 * gzipped file's length is only known by decompressing it.
 */
static int idx_read_data(gzFile f, const char *path, int64_t off, int64_t bytes, unsigned char **out)
{
    size_t want = (size_t)bytes, cap = want < ((size_t)1 << 20) ? want : (size_t)1 << 20, got = 0;
    unsigned char *buf = malloc(cap + 1);
    if (!buf)
        return kiln__error_set("idx: %s: out of memory for %zu bytes of data", path, cap);
    while (got < want) {
        if (got == cap) {
            size_t nc = cap > want - cap ? want : 2 * cap;
            unsigned char *nb = realloc(buf, nc + 1);
            if (!nb) {
                free(buf);
                return kiln__error_set("idx: %s: out of memory for %zu bytes of data", path, nc);
            }
            buf = nb;
            cap = nc;
        }
        unsigned chunk = cap - got > (1u << 30) ? 1u << 30 : (unsigned)(cap - got);
        int r = gzread(f, buf + got, chunk);
        if (r <= 0) {
            int e = Z_OK;
            const char *msg = r < 0 ? gzerror(f, &e) : NULL;
            free(buf);
            if (msg)
                return kiln__error_set("idx: %s: data at byte %lld: %s", path, (long long)(off + (int64_t)got),
                                       msg);
            return kiln__error_set("idx: %s: truncated: header says %lld bytes, file has %lld%s", path,
                                   (long long)(off + bytes), (long long)(off + (int64_t)got),
                                   gzdirect(f) ? "" : " (decompressed)");
        }
        got += (size_t)r;
    }
    *out = buf;
    return 0;
}

static int idx_read(const char *path, idx_file *out)
{
    memset(out, 0, sizeof *out);
    /* opened without blocking first: a FIFO would hang the reader (and a kilnd job) forever */
    int fd = kiln__open_regular(path, NULL);
    if (fd == KILN__NOT_REGULAR)
        return kiln__error_set("idx: %s: not a regular file", path);
    if (fd < 0)
        return kiln__error_set("idx: %s: cannot open: %s", path, strerror(errno));
    gzFile f = gzdopen(fd, "rb"); /* reads plain files unchanged, so both forms work */
    if (!f) {
        close(fd);
        return kiln__error_set("idx: %s: cannot open: out of memory", path);
    }
    gzbuffer(f, 1 << 17);
    unsigned char hdr[4];
    int rc = gz_read_exact(f, hdr, 4, path, 0, "magic");
    if (rc == 0 && (hdr[0] != 0 || hdr[1] != 0 || hdr[3] < 1 || hdr[3] > KILN_MAX_DIMS))
        rc = kiln__error_set("idx: %s: bad magic %02x %02x %02x %02x at byte 0", path, hdr[0], hdr[1], hdr[2],
                             hdr[3]);
    size_t esz = 0;
    if (rc == 0) {
        out->type = hdr[2];
        switch (out->type) {
        case 0x08: case 0x09: esz = 1; break;
        case 0x0B: esz = 2; break;
        case 0x0C: case 0x0D: esz = 4; break;
        case 0x0E: esz = 8; break;
        default: rc = kiln__error_set("idx: %s: unknown element type 0x%02x at byte 2", path, out->type);
        }
        out->ndim = hdr[3];
    }
    unsigned char dims[4 * KILN_MAX_DIMS];
    if (rc == 0)
        rc = gz_read_exact(f, dims, 4 * (size_t)out->ndim, path, 4, "dimension sizes");
    out->count = 1;
    for (int d = 0; rc == 0 && d < out->ndim; d++) {
        out->dims[d] = (int64_t)dims[4 * d] << 24 | (int64_t)dims[4 * d + 1] << 16 | (int64_t)dims[4 * d + 2] << 8 |
                       dims[4 * d + 3];
        /* three 2^32 dims overflow int64: the product is checked, not wrapped under the limit */
        if (__builtin_mul_overflow(out->count, out->dims[d], &out->count) || out->count > ((int64_t)1 << 34))
            rc = kiln__error_set("idx: %s: dimension %d (byte %d) makes the file implausibly large", path, d,
                                 4 + 4 * d);
    }
    /* A plain file's length is known: a header promising more data than that is refused
     * before anything is allocated. */
    int64_t data_off = 4 + 4 * (int64_t)out->ndim, bytes = out->count * (int64_t)esz;
    struct stat st;
    if (rc == 0 && gzdirect(f) && stat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size - data_off < bytes)
        rc = kiln__error_set("idx: %s: truncated: header says %lld bytes, file has %lld", path,
                             (long long)(data_off + bytes), (long long)st.st_size);
    unsigned char *raw = NULL;
    if (rc == 0)
        rc = idx_read_data(f, path, data_off, bytes, &raw);
    /* More data than the header describes means the dimensions are not this file's (or
     * two files were joined): reading a prefix of it would give items that look fine. */
    unsigned char extra;
    if (rc == 0 && gzread(f, &extra, 1) == 1)
        rc = kiln__error_set("idx: %s: data continues past byte %lld, where the header's dimensions end it", path,
                             (long long)(data_off + bytes));
    if (rc == 0) {
        out->values = malloc((size_t)out->count * sizeof *out->values + 1);
        if (!out->values)
            rc = kiln__error_set("idx: %s: out of memory for %lld elements", path, (long long)out->count);
    }
    for (int64_t i = 0; rc == 0 && i < out->count; i++) {
        const unsigned char *p = raw + i * (int64_t)esz;
        uint32_t u32 = esz == 4 ? (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3] : 0;
        switch (out->type) {
        case 0x08: out->values[i] = p[0]; break;
        case 0x09: out->values[i] = (int8_t)p[0]; break;
        case 0x0B: out->values[i] = (int16_t)(p[0] << 8 | p[1]); break;
        case 0x0C: out->values[i] = (int32_t)u32; break;
        case 0x0D: { float v; memcpy(&v, &u32, 4); out->values[i] = v; break; }
        default: {
            uint64_t u = 0;
            for (int k = 0; k < 8; k++)
                u = u << 8 | p[k];
            double v;
            memcpy(&v, &u, 8);
            out->values[i] = v;
        }
        }
    }
    free(raw);
    gzclose(f);
    if (rc != 0) {
        free(out->values);
        out->values = NULL;
    }
    return rc;
}

kiln_dataset *kiln_dataset_idx(const char *images_path, const char *labels_path)
{
    if (!images_path)
        return kiln__error_set("idx: NULL images path"), NULL;
    idx_file im, lb = {0};
    if (idx_read(images_path, &im) < 0)
        return NULL;
    if (labels_path && idx_read(labels_path, &lb) < 0) {
        free(im.values);
        return NULL;
    }
    kiln_dataset_info info = {.length = im.dims[0]};
    kiln_dataset *ds = NULL;
    float *x = NULL;
    double *t = NULL;
    if (labels_path && lb.ndim != 1) {
        kiln__error_set("idx: %s holds a %d-d array, not one label per item", labels_path, lb.ndim);
        goto done;
    }
    if (labels_path && lb.dims[0] != im.dims[0]) {
        kiln__error_set("idx: %s holds %lld items but %s holds %lld labels", images_path, (long long)im.dims[0],
                        labels_path, (long long)lb.dims[0]);
        goto done;
    }
    if (im.ndim == 3) { /* images: one channel */
        info.ndim = 3;
        info.shape[0] = 1;
        info.shape[1] = im.dims[1];
        info.shape[2] = im.dims[2];
    } else {
        info.ndim = im.ndim - 1;
        for (int d = 1; d < im.ndim; d++)
            info.shape[d - 1] = im.dims[d];
    }
    x = malloc((size_t)im.count * sizeof *x + 1);
    t = calloc((size_t)info.length + 1, sizeof *t);
    if (!x || !t) {
        kiln__error_set("idx: %s: out of memory", images_path);
        goto done;
    }
    double scale = im.type == 0x08 ? 1.0 / 255.0 : 1.0;
    for (int64_t i = 0; i < im.count; i++)
        x[i] = (float)(im.values[i] * scale);
    if (labels_path) {
        int64_t maxl = 0;
        for (int64_t i = 0; i < info.length; i++) {
            double v = lb.values[i];
            if (v < 0 || v != floor(v) || v > 1e6) {
                kiln__error_set("idx: %s: label %g of entry %lld (byte %lld) is not a class index", labels_path, v,
                                (long long)i, (long long)(8 + i));
                goto done;
            }
            t[i] = v;
            if ((int64_t)v > maxl)
                maxl = (int64_t)v;
        }
        info.num_classes = maxl + 1;
    }
    char name[200];
    snprintf(name, sizeof name, "idx(%.150s)", base_name(images_path));
    ds = kiln__dataset_arrays_take(&info, x, t, name);
    x = NULL;
    t = NULL;
done:
    free(x);
    free(t);
    free(im.values);
    free(lb.values);
    return ds;
}

/* -------------------------------------------------------------------------- CSV */

/* Split one line into cells in place (commas; double quotes around a cell are removed,
 * "" inside quotes is a quote). Returns the number of cells, or -1 past max. */
static int csv_split(char *line, char **cells, int max)
{
    int n = 0;
    char *p = line;
    for (;;) {
        if (n == max)
            return -1;
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == '"') {
            char *w = ++p;
            cells[n++] = w;
            while (*p) {
                if (*p == '"' && p[1] == '"') {
                    *w++ = '"';
                    p += 2;
                } else if (*p == '"') {
                    p++;
                    break;
                } else {
                    *w++ = *p++;
                }
            }
            *w = 0;
            while (*p && *p != ',')
                p++;
        } else {
            cells[n++] = p;
            while (*p && *p != ',')
                p++;
        }
        char *end = p;
        int more = *p == ',';
        *p = 0;
        /* trim trailing blanks and CR */
        char *c = cells[n - 1];
        size_t len = strlen(c);
        while (len && (c[len - 1] == ' ' || c[len - 1] == '\t' || c[len - 1] == '\r' || c[len - 1] == '\n'))
            c[--len] = 0;
        if (!more)
            return n;
        p = end + 1;
    }
}

/* CSV_MAX_CLASSES bounds a numeric label: a stray 99999999999 is an error, not a
 * hundred-billion-class data set. */
enum {
    CSV_MAX_COLS = 4096,
    CSV_MAX_CLASSES = 1000000
};

/* A whole cell as a finite number (what strtod takes: "1", "1.0", "1e0", " 0x10"). */
static bool csv_number(const char *cell, double *v)
{
    char *end;
    errno = 0;
    *v = strtod(cell, &end);
    return end != cell && !*end && errno != ERANGE && isfinite(*v);
}

/* Labels: numeric or strings, decided by the column's first label (data.h). */
enum {
    LABELS_UNDECIDED,
    LABELS_NUMERIC,
    LABELS_STRINGS
};

/* The class of a string label, in order of first appearance (a new name is appended);
 * -1 when out of memory. */
static int csv_class(char ***classes, int *nclasses, const char *cell)
{
    for (int k = 0; k < *nclasses; k++)
        if (strcmp((*classes)[k], cell) == 0)
            return k;
    char **nc = realloc(*classes, (size_t)(*nclasses + 1) * sizeof *nc);
    if (!nc)
        return -1;
    *classes = nc;
    if (!(nc[*nclasses] = strdup(cell)))
        return -1;
    return (*nclasses)++;
}

/* The index of the header cell named name, or -1 with the error set when no cell or more
 * than one carries that name (which of two equal names was meant cannot be known). */
static int csv_column(const char *path, char **header, int ncols, const char *name)
{
    int found = -1;
    for (int c = 0; c < ncols; c++) {
        if (strcmp(header[c], name) != 0)
            continue;
        if (found >= 0) {
            kiln__error_set("csv: %s: line 1: columns %d and %d are both named '%s'", path, found + 1, c + 1,
                            name);
            return -1;
        }
        found = c;
    }
    if (found < 0)
        kiln__error_set("csv: %s: line 1: no column named '%s'", path, name);
    return found;
}

kiln_dataset *kiln_dataset_csv(const char *path, const char *label_column, int nfeatures,
                               const char *const *feature_columns)
{
    if (!path)
        return kiln__error_set("csv: NULL path"), NULL;
    if (nfeatures < 0)
        return kiln__error_set("csv: %s: nfeatures %d < 0", path, nfeatures), NULL;
    int fd = kiln__open_regular(path, NULL); /* a FIFO would hang the reader */
    if (fd == KILN__NOT_REGULAR)
        return kiln__error_set("csv: %s: not a regular file", path), NULL;
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (!f) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return kiln__error_set("csv: %s: cannot open: %s", path, strerror(e)), NULL;
    }
    char *line = NULL, **cells = malloc(CSV_MAX_COLS * sizeof *cells);
    size_t cap = 0;
    int *cols = NULL, label_col = -1, ncols = 0, nfeat = 0;
    float *x = NULL;
    double *t = NULL;
    char **classes = NULL;
    int nclasses = 0, label_kind = LABELS_UNDECIDED;
    int64_t n = 0, rows_cap = 0, lineno = 1, first_label_line = 0, max_label = -1;
    kiln_dataset *ds = NULL;
    if (!cells)
        goto oom;
    if (getline(&line, &cap, f) < 0) {
        kiln__error_set("csv: %s: line 1: empty file, a header is required", path);
        goto done;
    }
    ncols = csv_split(line, cells, CSV_MAX_COLS);
    if (ncols < 1) {
        kiln__error_set("csv: %s: line 1: more than %d columns", path, CSV_MAX_COLS);
        goto done;
    }
    if (label_column && (label_col = csv_column(path, cells, ncols, label_column)) < 0)
        goto done;
    cols = malloc((size_t)(ncols + nfeatures + 1) * sizeof *cols);
    if (!cols)
        goto oom;
    if (feature_columns && nfeatures > 0) {
        for (int k = 0; k < nfeatures; k++) {
            if (!feature_columns[k]) {
                kiln__error_set("csv: %s: feature column %d is NULL", path, k);
                goto done;
            }
            if ((cols[k] = csv_column(path, cells, ncols, feature_columns[k])) < 0)
                goto done;
            /* a label learnt from itself, or a feature counted twice, is a mistake the
             * numbers would never show */
            if (cols[k] == label_col) {
                kiln__error_set("csv: %s: column '%s' is the label column and cannot also be a feature", path,
                                feature_columns[k]);
                goto done;
            }
            for (int j = 0; j < k; j++)
                if (cols[j] == cols[k]) {
                    kiln__error_set("csv: %s: feature column '%s' is listed twice", path, feature_columns[k]);
                    goto done;
                }
        }
        nfeat = nfeatures;
    } else {
        for (int c = 0; c < ncols; c++)
            if (c != label_col)
                cols[nfeat++] = c;
    }
    if (nfeat < 1) {
        kiln__error_set("csv: %s: line 1: no feature columns", path);
        goto done;
    }
    for (;;) {
        ssize_t len = getline(&line, &cap, f);
        if (len < 0)
            break;
        lineno++;
        char *s = line;
        while (*s && isspace((unsigned char)*s))
            s++;
        if (!*s)
            continue; /* blank lines (a trailing newline) are not rows */
        int got = csv_split(line, cells, CSV_MAX_COLS);
        if (got != ncols) {
            kiln__error_set("csv: %s: line %lld: %d cells, the header has %d", path, (long long)lineno, got, ncols);
            goto done;
        }
        if (n == rows_cap) {
            rows_cap = rows_cap ? rows_cap * 2 : 256;
            int64_t xn;
            if (!kiln__data_count(rows_cap, nfeat, sizeof *x, &xn))
                goto oom;
            float *nx = realloc(x, (size_t)xn * sizeof *x);
            if (!nx)
                goto oom;
            x = nx;
            double *nt = realloc(t, (size_t)rows_cap * sizeof *t);
            if (!nt)
                goto oom;
            t = nt;
        }
        for (int k = 0; k < nfeat; k++) {
            const char *cell = cells[cols[k]];
            double v;
            if (!csv_number(cell, &v)) {
                kiln__error_set("csv: %s: line %lld, column %d: '%.40s' is not a number", path,
                                (long long)lineno, cols[k] + 1, cell);
                goto done;
            }
            /* Features are stored as f32: 1e40 is finite as a double but would become inf,
             * which poisons every loss it touches, so it is refused like any non-number. */
            float fv = (float)v;
            if (isinf(fv)) {
                kiln__error_set("csv: %s: line %lld, column %d: '%.40s' is outside the f32 range (magnitude "
                                "at most %g)",
                                path, (long long)lineno, cols[k] + 1, cell, (double)FLT_MAX);
                goto done;
            }
            x[n * nfeat + k] = fv;
        }
        t[n] = 0;
        if (label_col >= 0) {
            const char *cell = cells[label_col];
            if (!*cell) {
                kiln__error_set("csv: %s: line %lld: empty label", path, (long long)lineno);
                goto done;
            }
            /* Numeric labels are class indices as written: mapping them by first
             * appearance would renumber the classes whenever one label is odd, so an odd
             * one is an error instead. */
            double v;
            bool num = csv_number(cell, &v);
            if (label_kind == LABELS_UNDECIDED) {
                label_kind = num ? LABELS_NUMERIC : LABELS_STRINGS;
                first_label_line = lineno;
            }
            if (label_kind == LABELS_NUMERIC) {
                if (!num || v < 0 || v != floor(v) || v >= CSV_MAX_CLASSES) {
                    kiln__error_set("csv: %s: line %lld, column %d: label '%.40s' is not a class index: the label "
                                    "column is numeric (its first label, line %lld, is a number), so every label "
                                    "must be an integer in [0, %d)",
                                    path, (long long)lineno, label_col + 1, cell, (long long)first_label_line,
                                    CSV_MAX_CLASSES);
                    goto done;
                }
                t[n] = v;
                if ((int64_t)v > max_label)
                    max_label = (int64_t)v;
            } else {
                int c = csv_class(&classes, &nclasses, cell);
                if (c < 0)
                    goto oom;
                t[n] = c;
            }
        }
        n++;
    }
    if (ferror(f)) {
        kiln__error_set("csv: %s: read error after line %lld", path, (long long)lineno);
        goto done;
    }
    if (label_col >= 0) {
        kiln_dataset_info info = {.length = n,
                                  .ndim = 1,
                                  .shape = {nfeat},
                                  .num_classes = label_kind == LABELS_NUMERIC ? max_label + 1 : nclasses};
        char name[200];
        snprintf(name, sizeof name, "csv(%.150s)", base_name(path));
        ds = kiln__dataset_arrays_take(&info, x ? x : malloc(1), t ? t : malloc(1), name);
        if (ds && label_kind == LABELS_STRINGS) { /* the names go with the data set */
            ds->class_names = classes;
            ds->nclass_names = nclasses;
            classes = NULL;
            nclasses = 0;
        }
    } else {
        kiln_dataset_info info = {.length = n, .ndim = 1, .shape = {nfeat}};
        char name[200];
        snprintf(name, sizeof name, "csv(%.150s)", base_name(path));
        ds = kiln__dataset_arrays_take(&info, x ? x : malloc(1), t ? t : malloc(1), name);
    }
    x = NULL;
    t = NULL;
    goto done;
oom:
    kiln__error_set("csv: %s: out of memory at line %lld", path, (long long)lineno);
done:
    for (int k = 0; k < nclasses; k++)
        free(classes[k]);
    free(classes);
    free(x);
    free(t);
    free(cols);
    free(cells);
    free(line);
    fclose(f);
    return ds;
}

/* ------------------------------------------------------------------ safetensors */

kiln_dataset *kiln_dataset_safetensors(const char *path, const char *features_name, const char *target_name)
{
    if (!path || !features_name)
        return kiln__error_set("safetensors data set: NULL argument"), NULL;
    kiln_device *dev = kiln_device_open("cpu");
    kiln_safetensors *st = dev ? kiln_safetensors_open(path) : NULL;
    kiln_dataset *ds = NULL;
    kiln_tensor *fx = NULL, *ty = NULL;
    float *x = NULL;
    double *t = NULL;
    if (!st)
        goto done;
    kiln_tensor *raw = kiln_safetensors_load(st, features_name, dev);
    if (!raw) {
        kiln__error_restate("safetensors data set: %s: tensor '%s': %s", path, features_name, kiln_error());
        goto done;
    }
    fx = kiln_cast(raw, KILN_F32);
    kiln_tensor_release(raw);
    if (!fx || kiln_tensor_ndim(fx) < 1)
        goto bad_shape;
    kiln_dataset_info info = {.length = kiln_tensor_dim(fx, 0), .ndim = kiln_tensor_ndim(fx) - 1};
    for (int d = 1; d < kiln_tensor_ndim(fx); d++)
        info.shape[d - 1] = kiln_tensor_dim(fx, d);
    int64_t total = kiln_tensor_numel(fx);
    x = malloc((size_t)total * sizeof *x + 1);
    if (!x || kiln_to_data(fx, x, (size_t)total * sizeof *x) < 0)
        goto done;
    if (target_name) {
        kiln_tensor *r = kiln_safetensors_load(st, target_name, dev);
        if (!r) {
            kiln__error_restate("safetensors data set: %s: tensor '%s': %s", path, target_name, kiln_error());
            goto done;
        }
        bool cls = !kiln_dtype_is_float(kiln_tensor_dtype(r));
        ty = kiln_cast(r, KILN_F64);
        kiln_tensor_release(r);
        if (!ty || kiln_tensor_ndim(ty) < 1 || kiln_tensor_dim(ty, 0) != info.length || (cls && kiln_tensor_ndim(ty) != 1)) {
            kiln__error_set("safetensors data set: %s: '%s' does not hold one target per item of '%s' (%lld)", path,
                            target_name, features_name, (long long)info.length);
            goto done;
        }
        int64_t tn = kiln_tensor_numel(ty);
        t = malloc((size_t)tn * sizeof *t + 1);
        if (!t || kiln_to_data(ty, t, (size_t)tn * sizeof *t) < 0)
            goto done;
        if (cls) {
            int64_t maxl = 0;
            for (int64_t i = 0; i < tn; i++) {
                if (t[i] < 0) {
                    kiln__error_set("safetensors data set: %s: '%s' entry %lld is %g, not a class index", path,
                                    target_name, (long long)i, t[i]);
                    goto done;
                }
                if ((int64_t)t[i] > maxl)
                    maxl = (int64_t)t[i];
            }
            info.num_classes = maxl + 1;
        } else {
            info.target_numel = info.length ? tn / info.length : 0;
        }
    } else {
        t = calloc((size_t)info.length + 1, sizeof *t);
        if (!t)
            goto done;
    }
    char name[200];
    snprintf(name, sizeof name, "safetensors(%.150s)", base_name(path));
    ds = kiln__dataset_arrays_take(&info, x, t, name);
    x = NULL;
    t = NULL;
    goto done;
bad_shape:
    kiln__error_set("safetensors data set: %s: '%s' needs at least one dim (the items)", path, features_name);
done:
    free(x);
    free(t);
    kiln_tensor_release(fx);
    kiln_tensor_release(ty);
    kiln_safetensors_close(st);
    kiln_device_close(dev);
    return ds;
}
