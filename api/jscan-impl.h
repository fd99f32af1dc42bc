/*
 * api/jscan-impl.h — what jscan.c and jscan-keys.c share beyond jscan.h.
 */
#ifndef KD_API_JSCAN_IMPL_H
#define KD_API_JSCAN_IMPL_H

#include "jscan.h"

/* One character of a string at p (not its closing quote), unescaped into enc (*k bytes): where
 * the next one starts, or NULL with s failed (err_at at the bad escape or byte). */
const char *kd_jscan_str_char(struct kd_jscan *s, const char *p, char enc[4], size_t *k);
/* Notes the key at `at` (its opening quote) of the checked object k: 0, or -1 with s failed
 * ("duplicate key ...") when k had it already. */
int kd_jscan_key_add(struct kd_jscan *s, struct kd_jkeys *k, const char *at);
/* The checked object k has closed (s->keys moves out to the enclosing one): a large object's
 * keys are sorted and compared now. 0, or -1 with s failed at the first repeat. */
int kd_jscan_keys_close(struct kd_jscan *s, struct kd_jkeys *k);

#endif /* KD_API_JSCAN_IMPL_H */
