/*
 * engine/data/data-impl.h — the inside of a kiln_dataset, shared by the files of
 * engine/data: a small class table (get, destroy) plus the item description, and the
 * counter-based hash every random choice in the pipeline is drawn from.
 */
#ifndef KILN_DATA_IMPL_H
#define KILN_DATA_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "kiln/data.h"

typedef struct kiln__dataset_class {
    const char *type;
    int (*get)(const kiln_dataset *ds, int64_t i, float *x, double *target, uint64_t key);
    void (*destroy)(void *self);
} kiln__dataset_class;

struct kiln_dataset {
    const kiln__dataset_class *cls;
    void *self;
    kiln_dataset *source;         /* held reference for transforms; NULL for sources */
    kiln_dataset_info info;
    atomic_int refs;
    char name[256];
    /* names of classes 0..nclass_names-1 where the source has them (a CSV's label names), owned;
     * kiln_dataset_class_name asks the source chain for them */
    char **class_names;
    int64_t nclass_names;
};

/** A new data set with one reference; takes self (destroyed on failure) and a new
 *  reference to source (may be NULL). */
kiln_dataset *kiln__dataset_new(const kiln__dataset_class *cls, void *self, kiln_dataset *source,
                                const kiln_dataset_info *info, const char *name);

/** splitmix64 of (a, b): the mixing step behind keys and permutations. */
uint64_t kiln__data_mix(uint64_t a, uint64_t b);
/** A uniform double in [0, 1) from a key and a draw number. */
double kiln__data_uniform(uint64_t key, uint64_t draw);

/**
 * The element count of a feature shape, or -1 when a dim is negative or the product
 * overflows int64 or would not fit in memory as floats (a shape from a file header or a
 * caller must not wrap to a small count that later sizes an allocation).
 */
int64_t kiln__data_numel(int ndim, const int64_t *shape);
/** count items of per elements of size elem: false when count * per * elem overflows
 *  what one allocation can hold; else *out is the element count count * per. */
bool kiln__data_count(int64_t count, int64_t per, size_t elem, int64_t *out);
/** "[d0, d1, ...]" into buf, for messages. */
const char *kiln__data_shape_str(int ndim, const int64_t *shape, char *buf, size_t len);

/** The number of target doubles a get writes (at least 1). */
static inline int64_t kiln__target_slots(const kiln_dataset_info *info)
{
    return info->num_classes > 0 || info->target_numel < 1 ? 1 : info->target_numel;
}

#endif /* KILN_DATA_IMPL_H */
