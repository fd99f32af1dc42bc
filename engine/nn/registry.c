/*
 * engine/nn/registry.c — the table of layer types by PyTorch class name, used by
 * kiln_layer_from_json and the JSON model builder.
 */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "nn-impl.h"

#define REGISTRY_ENTRY(L) &kiln__layer_##L,
static const kiln__layer_type *const registry[] = {KILN__LAYER_LIST(REGISTRY_ENTRY)};

int kiln__layer_types(const kiln__layer_type *const **out)
{
    *out = registry;
    return (int)(sizeof registry / sizeof registry[0]);
}

const kiln__layer_type *kiln__layer_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof registry / sizeof registry[0]; i++)
        if (!strcmp(registry[i]->name, name))
            return registry[i];
    return NULL;
}

int kiln_layer_count(void) { return (int)(sizeof registry / sizeof registry[0]); }

const char *kiln_layer_name(int i)
{
    return i >= 0 && i < kiln_layer_count() ? registry[i]->name : NULL;
}

kiln_module *kiln_layer_from_json(const char *layer, const char *config_json, kiln_device *dev,
                                  kiln_generator *gen)
{
    const kiln__layer_type *lt = kiln__layer_find(layer);
    if (!lt) {
        kiln__error_set("unknown layer \"%s\"", layer ? layer : "(null)");
        return NULL;
    }
    /* Configs are small plain structs; this bound is checked when types register. */
    _Alignas(max_align_t) unsigned char cfg[512];
    if (lt->config_size > sizeof cfg) {
        kiln__error_set("%s: config too large", lt->name);
        return NULL;
    }
    int rc = config_json && *config_json ? kiln__config_from_json(lt, config_json, cfg)
                                         : kiln__config_from_cjson(lt, NULL, cfg);
    return rc < 0 ? NULL : lt->init(cfg, dev, gen);
}
