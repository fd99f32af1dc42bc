/*
 * engine/json-keys-impl.h — keys a JSON document gives twice in one object, and the other
 * strict-reading helpers (NUL escapes, text after the value).
 *
 * RFC 8259 leaves a repeated key's meaning to the reader: cJSON finds the first of the two,
 * Python and most tools keep the last, so one file would mean two things. libkiln's model
 * specs and kilnd's job specs and model configs refuse them through this walk (kilnd's
 * inference bodies, read in place without cJSON, have their own: api/jscan-keys.c).
 */
#ifndef KILN_JSON_KEYS_IMPL_H
#define KILN_JSON_KEYS_IMPL_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

/*
 * Calls each(ud, path, key) once for every key an object anywhere under root gives more than
 * once, objects in document order. path names the object: "" for root, then members joined
 * by "." and array elements as "[i]" ("nodes[0].config"). A nonzero return from each stops
 * the walk and is returned; 0 when it ran to the end, -1 when out of memory (objects of more
 * than 16 keys are sorted in a scratch array, so a huge object costs O(k log k), not O(k^2)).
 */
int kiln__json_repeated_keys(const cJSON *root, int (*each)(void *ud, const char *path, const char *key),
                             void *ud);

/*
 * Where the JSON text[0..len) writes a NUL inside a string (the escape \u0000), or -1. cJSON
 * hands strings out as C strings, so such a string reads shorter than it was written: an
 * api_tokens entry "admin:x\u0000secret" would be the token "x". Readers that take strings
 * from untrusted or hand-written JSON refuse the text instead (the safetensors reader too,
 * which also refuses a raw 0 byte in its header).
 */
long kiln__json_nul_escape_at(const char *text, size_t len);

/*
 * text parsed as exactly one JSON value with nothing but whitespace after it. cJSON_Parse
 * stops at the end of the first value, so "{...} garbage" read as the object alone and a
 * damaged or concatenated spec built something. NULL when the text is malformed
 * (*trailing false) or has more after the value (*trailing true); *at is then the byte
 * offset of the error or of the first extra byte, for the caller's message.
 */
cJSON *kiln__json_parse_whole(const char *text, size_t *at, bool *trailing);

#endif /* KILN_JSON_KEYS_IMPL_H */
