/*
 * storage/torch-import-impl.h — what the .pt reader (torch-import.c) and its renaming rules
 * (torch-rename.c) share: the limits, the flattened entries and the open file.
 */
#ifndef KILN_TORCH_IMPORT_IMPL_H
#define KILN_TORCH_IMPORT_IMPL_H

#include <pthread.h>
#include <regex.h>
#include <stddef.h>
#include <stdint.h>
#include <zip.h>

#include "kiln/record.h"
#include "pickle-impl.h"

#define PT_MAX_NAME 4096           /* bytes in a flattened or renamed name */
#define PT_MAX_DEPTH 64            /* nesting of dicts and lists */
#define PT_MAX_LEAVES (1u << 20)   /* values visited while flattening (shared sub-trees count again) */
#define PT_MAX_PICKLE (256u << 20) /* bytes of data.pkl */
#define PT_MAX_ENTRIES (1u << 20)  /* records in the archive */
#define PT_DEFLATE_RATIO 1100u     /* deflate cannot expand more than ~1032:1 */

typedef struct pt_entry {
    char *name;               /* after renaming */
    char *source;             /* as flattened from the file */
    const kiln__pk_tensor *t; /* tensor entries: lives in the pickle arena */
    char *value;              /* other entries: the value as text */
    zip_int64_t record;       /* tensor entries: archive index of the storage record */
} pt_entry;

typedef struct pt_list {
    pt_entry *e;
    int n, cap;
    int *order; /* indices sorted by name, for find() */
} pt_list;

struct kiln_torch_file {
    zip_t *zip;
    pthread_mutex_t lock; /* a zip_t is not safe to read from two threads at once */
    char *label;
    char top[256];
    uint64_t archive_len;
    kiln__pickle *pk;
    pt_list tensors, others;
    size_t visited;
    unsigned char *crc_checked; /* per archive record: its CRC-32 was checked (under lock) */
};

/* The caller's rename and skip patterns, compiled. */
typedef struct pt_rules {
    regex_t *renames, *skips;
    int nr, ns;
} pt_rules;

/* torch-rename.c: compile the options' patterns (0 or -1 with the error set), free them,
 * rename and drop the entries of l, and sort l by name refusing two equal names. */
int kiln__pt_rules_compile(kiln_torch_file *pt, const kiln_torch_options *o, pt_rules *r);
void kiln__pt_rules_free(pt_rules *r);
int kiln__pt_apply_rules(kiln_torch_file *pt, pt_list *l, const kiln_torch_options *o, const pt_rules *r);
int kiln__pt_index(kiln_torch_file *pt, pt_list *l, const char *kind);

#endif /* KILN_TORCH_IMPORT_IMPL_H */
