/*
 * catalog/repository-impl.h — what the model repository's files share (repository.c: scanning,
 * adding and removing versions; repository-config.c: config.json). Internal to catalog/;
 * repository.h is the interface.
 */
#ifndef KD_CATALOG_REPOSITORY_IMPL_H
#define KD_CATALOG_REPOSITORY_IMPL_H

#include <stdbool.h>
#include <stddef.h>

#include "repository.h"

/*
 * Parse and check config.json text into c; why receives the reason on failure. io_optional: the
 * inputs and outputs may be left out (an ONNX graph declares its own; the server reads them at load).
 * 0, or -1 with c left empty.
 */
int kd_repository_config_parse(const char *text, kd_model_config *c, bool io_optional, char *why, size_t wl);

#endif /* KD_CATALOG_REPOSITORY_IMPL_H */
