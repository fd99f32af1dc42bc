/*
 * storage/pickle-vm.h — the unpickler's state, shared by the machine (pickle.c) and the
 * globals a weights file may call (pickle-torch.c). Internal to those two files.
 */
#ifndef KILN_PICKLE_VM_H
#define KILN_PICKLE_VM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pickle-impl.h"

/* The allowed globals. Storage classes follow PK_G_STORAGE, one per pk_storages row, then
 * the dtypes, one per pk_dtypes row (pickle-torch.c). */
enum {
    PK_G_ORDERED_DICT,
    PK_G_REBUILD_TENSOR,
    PK_G_REBUILD_TENSOR_V2,
    PK_G_REBUILD_TENSOR_V3,
    PK_G_REBUILD_PARAMETER,
    PK_G_REBUILD_PARAMETER_WITH_STATE,
    PK_G_STORAGE,
};

typedef struct pk_obj {
    struct pk_obj *next;
    kiln__pk_value v;
} pk_obj;

struct kiln__pickle {
    pk_obj *objects; /* every value, for freeing */
    const kiln__pk_value *root;
};

typedef struct pk_state {
    const unsigned char *p;
    size_t len, pos, op_pos;
    const char *label;
    kiln__pickle_limits lim;
    kiln__pickle *out;
    size_t nobjects;
    kiln__pk_value **stack;
    size_t sp, stack_cap;
    size_t *marks;
    size_t nmarks, marks_cap;
    kiln__pk_value **memo;
    size_t memo_cap, memo_count; /* slots allocated; slots filled (what MEMOIZE numbers by) */
} pk_state;

/* Record a "pickle: <problem> (<source>, byte N)" error; returns -1. */
__attribute__((format(printf, 2, 3))) int kiln__pk_fail(pk_state *s, const char *fmt, ...);
/* The out-of-memory error; returns -1. */
int kiln__pk_oom(pk_state *s);
/* A new value owned by the pickle; NULL with the error set when out of memory or past
 * the value limit. The two below add to a dict and test for a string. */
kiln__pk_value *kiln__pk_new(pk_state *s, kiln__pk_kind kind);
int kiln__pk_dict_add(pk_state *s, kiln__pk_value *d, kiln__pk_value *k, kiln__pk_value *v);
bool kiln__pk_is_str(const kiln__pk_value *v);

/* pickle-torch.c: resolving GLOBAL, PERSID and REDUCE against the fixed table. */
kiln__pk_value *kiln__pk_global(pk_state *s, const char *module, size_t mlen, const char *name, size_t nlen);
const char *kiln__pk_global_name(int g, char *buf, size_t len);
kiln__pk_value *kiln__pk_persistent(pk_state *s, const kiln__pk_value *pid);
kiln__pk_value *kiln__pk_reduce(pk_state *s, const kiln__pk_value *fn, const kiln__pk_value *args);

#endif /* KILN_PICKLE_VM_H */
