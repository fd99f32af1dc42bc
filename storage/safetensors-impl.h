/*
 * storage/safetensors-impl.h — what the safetensors reader (safetensors.c) and writer
 * (safetensors-write.c) share. Internal to storage/.
 */
#ifndef KILN_SAFETENSORS_IMPL_H
#define KILN_SAFETENSORS_IMPL_H

#include <stdbool.h>
#include <stddef.h>

#include "kiln/tensor.h"

/** The format's dtype string of a kiln dtype ("F32"), or NULL. */
const char *kiln__st_dtype_string(kiln_dtype dt);

/**
 * Whether n bytes are UTF-8 as RFC 3629 defines it (no overlong forms, no surrogates,
 * nothing past U+10FFFF): what Python's safetensors accepts, so a file kiln writes or
 * takes is one every reader can open. kiln__utf8_string: the same for a C string.
 */
bool kiln__utf8_valid(const char *text, size_t n);
bool kiln__utf8_string(const char *s);

/** s for a message, in buf: at most len - 1 bytes, every byte outside printable ASCII as
 *  \xNN (s may be the invalid UTF-8 being complained about). Returns buf. */
const char *kiln__printable(const char *s, char *buf, size_t len);

/** The first of n strings that occurs twice, or NULL; NULL with *oom set when out of
 *  memory. Sorts a copy, so a million keys cost n log n comparisons, not n squared. */
const char *kiln__first_duplicate(const char *const *keys, int n, bool *oom);

#endif /* KILN_SAFETENSORS_IMPL_H */
