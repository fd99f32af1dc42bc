/*
 * storage/pickle-impl.h — the restricted unpickler behind PyTorch import (not public).
 *
 * kiln__pickle_load interprets a pickle byte string (protocols 0-5, the opcodes a
 * torch.save'd state_dict or checkpoint uses) into a tree of plain values. It never runs
 * code: the only globals it resolves are the handful a weights file needs, each mapped
 * to a fixed behaviour here (OrderedDict builds a dict, _rebuild_tensor_v2 and _v3 record a
 * tensor view, torch.FloatStorage and torch.uint16 name a dtype). Every other global refuses
 * the file.
 *
 * Persistent ids (BINPERSID) are interpreted as torch.save's storage references
 * ('storage', <Storage class>, key, location, numel); checking that the key names a
 * real record of the right size is the zip reader's job (torch-import.c).
 *
 * All values live in one arena owned by the kiln__pickle handle; the tree may share
 * sub-values (memo GETs) and may even be cyclic, so walkers must bound their depth.
 */
#ifndef KILN_PICKLE_IMPL_H
#define KILN_PICKLE_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/tensor.h"

typedef enum kiln__pk_kind {
    KILN__PK_NONE,
    KILN__PK_BOOL,
    KILN__PK_INT,
    KILN__PK_BIGINT, /* an integer outside int64: its decimal text in u.str (never a size or key) */
    KILN__PK_FLOAT,
    KILN__PK_STR,
    KILN__PK_BYTES,
    KILN__PK_TUPLE,
    KILN__PK_LIST,
    KILN__PK_DICT,
    KILN__PK_GLOBAL,  /* an allowed callable or class; see pk_global in pickle.c */
    KILN__PK_STORAGE, /* a persistent id naming a torch storage record */
    KILN__PK_TENSOR,  /* a strided view of a storage */
} kiln__pk_kind;

typedef struct kiln__pk_value kiln__pk_value;

/** A storage reference as torch.save writes it in a persistent id. */
typedef struct kiln__pk_storage {
    const char *key;       /* record name under <archive>/data/ */
    const char *type_name; /* "FloatStorage", ... */
    int dtype;             /* kiln_dtype, or -1 for a torch dtype kiln has no equivalent of */
    size_t elem_size;      /* bytes per element in the file */
    uint64_t numel;        /* elements in the storage, as the file claims */
    bool untyped;          /* torch.storage.UntypedStorage: bytes, retyped by _rebuild_tensor_v3 */
} kiln__pk_storage;

/**
 * A tensor: a view of `storage` (offsets and strides in elements, all non-negative). A view
 * kiln can list but not load (an expand()ed one, more dims than KILN_MAX_DIMS) does not
 * refuse the file, as an unsupported dtype does not: `refused` says why, and only loading
 * that tensor fails. With too_many_dims, ndim is 0 and size/stride are unset (they do not fit).
 */
typedef struct kiln__pk_tensor {
    const kiln__pk_value *storage;
    uint64_t offset;
    int ndim;
    int64_t size[KILN_MAX_DIMS];
    int64_t stride[KILN_MAX_DIMS];
    bool too_many_dims;
    char refused[160]; /* "" when loadable; else completes "tensor 'name' ..." */
} kiln__pk_tensor;

struct kiln__pk_value {
    kiln__pk_kind kind;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *s; /* NUL-terminated copy; may hold NULs for bytes */
            size_t len;
        } str;
        struct {
            kiln__pk_value **items;
            size_t n, cap;
        } seq; /* tuple, list */
        struct {
            kiln__pk_value **keys, **vals;
            size_t n, cap;
        } dict; /* insertion order, as OrderedDict keeps it */
        int global;
        kiln__pk_storage storage;
        kiln__pk_tensor *tensor;
    } u;
};

/** Bounds on what one pickle may make the reader allocate. Zero fields take defaults. */
typedef struct kiln__pickle_limits {
    size_t max_objects;     /* values created (default 4 M) */
    size_t max_stack;       /* entries on the stack at once (default 1 M) */
    size_t max_marks;       /* nested MARKs (default 4096) */
    size_t max_memo;        /* highest memo index + 1 (default 4 M) */
    size_t max_string;      /* bytes in one string (default 16 MiB) */
} kiln__pickle_limits;

typedef struct kiln__pickle kiln__pickle;

/**
 * Interpret len bytes (copied as needed; data may be freed afterwards). label names the
 * source in messages ("model.pt:model/data.pkl"). NULL plus kiln_error() on any
 * malformed, unsupported or disallowed content.
 */
kiln__pickle *kiln__pickle_load(const void *data, size_t len, const char *label,
                                const kiln__pickle_limits *limits);
/** The value STOP returned. */
const kiln__pk_value *kiln__pickle_root(const kiln__pickle *p);
void kiln__pickle_free(kiln__pickle *p);

/** Python-style short description of a scalar ("3", "0.5", "'adam'", "True", "None"). */
void kiln__pk_describe(const kiln__pk_value *v, char *buf, size_t len);

#endif /* KILN_PICKLE_IMPL_H */
