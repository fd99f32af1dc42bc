/*
 * tests/fuzz/fuzz_pickle.c — libFuzzer target for the restricted unpickler used by the
 * PyTorch importer (storage/pickle.c).
 *
 * Any byte string must either be refused with a message or give a value tree; the tree
 * is then walked (bounded: it may share sub-trees and even contain cycles) and every
 * value described, so a malformed tree would show up as a sanitizer report.
 */
#include <stddef.h>
#include <stdint.h>

#include "pickle-impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void walk(const kiln__pk_value *v, int depth, size_t *budget)
{
    char text[64];
    if (!v || depth > 16 || *budget == 0)
        return;
    (*budget)--;
    kiln__pk_describe(v, text, sizeof text);
    switch (v->kind) {
    case KILN__PK_TUPLE:
    case KILN__PK_LIST:
        for (size_t i = 0; i < v->u.seq.n; i++)
            walk(v->u.seq.items[i], depth + 1, budget);
        break;
    case KILN__PK_DICT:
        for (size_t i = 0; i < v->u.dict.n; i++) {
            walk(v->u.dict.keys[i], depth + 1, budget);
            walk(v->u.dict.vals[i], depth + 1, budget);
        }
        break;
    case KILN__PK_TENSOR:
        walk(v->u.tensor->storage, depth + 1, budget);
        break;
    default:
        break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* tighter limits than the defaults keep each run fast without hiding the limit paths */
    kiln__pickle_limits lim = {.max_objects = 1u << 16, .max_memo = 1u << 16, .max_string = 1u << 16};
    kiln__pickle *p = kiln__pickle_load(data, size, "fuzz", &lim);
    if (!p)
        return 0;
    size_t budget = 1u << 16;
    walk(kiln__pickle_root(p), 0, &budget);
    kiln__pickle_free(p);
    return 0;
}
