/*
 * config/config-impl.h — the shape of the configuration table, shared by the table itself
 * (config-table.c) and the loaders and printers (config.c). Nothing outside config/ sees it.
 */
#ifndef KD_CONFIG_IMPL_H
#define KD_CONFIG_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

struct cJSON;

enum kd_config_type {
    KD_CT_STRING,  /* min/max bound the length */
    KD_CT_INT,     /* min/max bound the value */
    KD_CT_ENUM,    /* stored as the index into choices */
    KD_CT_STRLIST, /* JSON array of strings; comma-separated in env and flags */
};

struct kd_config_key {
    const char *name;               /* dotted: "port", "limits.max_body_bytes" */
    enum kd_config_type type;
    size_t offset; /* into struct kd_config */
    int64_t min, max;
    const char *const *choices;     /* KD_CT_ENUM only, NULL-terminated */
    const char *def;                /* the default, written as an env value would be */
    const char *env;                /* "KILN_PORT" */
    const char *flag;               /* "--port", or NULL when only file and env set it */
    const char *desc;
};

extern const struct kd_config_key kd_config_keys[];
extern const size_t kd_config_key_count;

const struct kd_config_key *kd_config_find(const char *name);

/* Each setter validates and stores; on failure it writes "<key>: <why> (<origin>)" to err. */
int kd_config_set_text(struct kd_config *cfg, const struct kd_config_key *k, const char *text, const char *origin,
                       char *err, size_t errlen);
int kd_config_set_json(struct kd_config *cfg, const struct kd_config_key *k, const struct cJSON *v,
                       const char *origin, char *err, size_t errlen);

/* The layer a key's value came from, for messages about the merged configuration. */
enum kd_config_layer {
    KD_LAYER_DEFAULT = 0,
    KD_LAYER_FILE,
    KD_LAYER_ENV,
    KD_LAYER_FLAG,
};

/*
 * The rules that relate two keys, checked once every layer is in: a layer checked alone would
 * refuse what a later one makes valid (a file's long api_tokens token with KILN_MAX_HEADER_BYTES
 * raised). layers[i] is where the value of kd_config_keys[i] came from; a message names both keys,
 * their values' origins and the limit. 0, or -1 with the message in err.
 */
int kd_config_check_merged(const struct kd_config *cfg, const enum kd_config_layer *layers, char *err,
                           size_t errlen);

void kd_config_free_value(struct kd_config *cfg, const struct kd_config_key *k);

/* A human-readable rendering of the bounds ("0..65535", "one of text, json"). */
void kd_config_describe_bounds(const struct kd_config_key *k, char *buf, size_t len);

const char *kd_config_type_name(enum kd_config_type t);

#endif /* KD_CONFIG_IMPL_H */
