/*
 * config/config-impl.h — the shape of the configuration table, shared by the table itself
 * (config_table.c) and the loaders and printers (config.c). Nothing outside config/ sees it.
 */
#ifndef KILN_CONFIG_IMPL_H
#define KILN_CONFIG_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

struct cJSON;

enum kiln__config_type {
    KILN__CT_STRING,    /* min/max bound the length */
    KILN__CT_INT,       /* min/max bound the value */
    KILN__CT_ENUM,      /* stored as the index into choices */
    KILN__CT_STRLIST,   /* JSON array of strings; comma-separated in env and flags */
};

struct kiln__config_key {
    const char *name;               /* dotted: "port", "limits.max_body_bytes" */
    enum kiln__config_type type;
    size_t offset;                  /* into struct kiln_config */
    int64_t min, max;
    const char *const *choices;     /* KILN__CT_ENUM only, NULL-terminated */
    const char *def;                /* the default, written as an env value would be */
    const char *env;                /* "KILN_PORT" */
    const char *flag;               /* "--port", or NULL when only file and env set it */
    const char *desc;
};

extern const struct kiln__config_key kiln__config_keys[];
extern const size_t kiln__config_key_count;

const struct kiln__config_key *kiln__config_find(const char *name);

/* Each setter validates and stores; on failure it writes "<key>: <why> (<origin>)" to err. */
int kiln__config_set_text(struct kiln_config *cfg, const struct kiln__config_key *k,
                          const char *text, const char *origin, char *err, size_t errlen);
int kiln__config_set_json(struct kiln_config *cfg, const struct kiln__config_key *k,
                          const struct cJSON *v, const char *origin, char *err, size_t errlen);

void kiln__config_free_value(struct kiln_config *cfg, const struct kiln__config_key *k);

/* A human-readable rendering of the bounds ("0..65535", "one of text, json"). */
void kiln__config_describe_bounds(const struct kiln__config_key *k, char *buf, size_t len);

const char *kiln__config_type_name(enum kiln__config_type t);

#endif /* KILN_CONFIG_IMPL_H */
