/*
 * catalog/repository.h — kilnd's model repository: <data_dir>/models/<name>/<version>/.
 *
 *     kd_repository *repo = kd_repository_open("var/models");
 *     for (int i = 0; i < kd_repository_count(repo); i++) {
 *         const kd_model_info *m = kd_repository_model(repo, i);
 *         if (!m->valid) { log("%s: %s", m->name, m->why); continue; }
 *         for (int v = 0; v < m->nversions; v++)
 *             if (m->versions[v].served) load(m->versions[v].path, &m->versions[v].config);
 *     }
 *     int64_t v;
 *     kd_repository_add_version(repo, "resnet", "/incoming/resnet", 0, &v); // next version
 *     kd_repository_close(repo);
 *
 * Layout: a folder per model (name: [A-Za-z0-9_.-], at most 128 characters, no leading dot,
 * no ".."), in it a folder per version (a positive integer without leading zeros) holding
 * model.kiln (a kiln record; its config is the model's JSON spec) or model.onnx, and
 * config.json. A config.json directly in the model folder applies to every version that
 * has none of its own. docs/storage.md has the config.json reference.
 *
 * Scanning never stops at a bad model: each model and version says whether it is valid
 * and why not. Every path is resolved with realpath and must stay under the repository
 * root, so a symlink cannot lead outside it. Adding a version copies the files into a
 * temporary folder, validates it, fsyncs and renames it into place. A version may carry a
 * source.json naming what produced it (a training job writes one); kd_repository_find_source
 * looks a version up by it.
 */
#ifndef KD_CATALOG_REPOSITORY_H
#define KD_CATALOG_REPOSITORY_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KD_MODEL_NAME_MAX 128
/* kd_repository_name_valid's rule, for messages that refuse a name */
#define KD_MODEL_NAME_RULE "1 to 128 characters of A-Z a-z 0-9 _ . -, not starting with a dot, no '..'"

/** One input or output: name, KServe datatype ("FP32", "INT64", ...), shape (-1 = dynamic).
 *  An output may name a label file (config.json's label_filename: one class name a line, in the
 *  version folder or else the model folder), read at the scan: labels[i] names class index i. */
typedef struct kd_model_tensor_spec {
    char *name;
    char *datatype;
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    char *label_filename; /* NULL: none */
    char *label_text;     /* the file's text, each line ended by '\0'; labels point into it */
    char **labels;
    int64_t nlabels;
} kd_model_tensor_spec;

/** Frees what a spec owns (not the spec itself). */
void kd_model_tensor_spec_free(kd_model_tensor_spec *s);
/** A deep copy of src into dst (zeroed on failure). 0, or -1 when out of memory. */
int kd_model_tensor_spec_copy(kd_model_tensor_spec *dst, const kd_model_tensor_spec *src);

typedef enum kd_version_policy {
    KD_VERSION_LATEST = 0, /* the latest_n highest valid versions (default 1) */
    KD_VERSION_ALL,
    KD_VERSION_SPECIFIC, /* the listed versions that are valid */
} kd_version_policy;

typedef struct kd_model_config {
    int ninputs, noutputs;
    kd_model_tensor_spec *inputs, *outputs;
    int max_batch_size;         /* 0: the model does not batch */
    int64_t max_queue_delay_us; /* dynamic batching: longest wait to fill a batch */
    int npreferred;
    int64_t preferred_batch_sizes[16];
    char *device;       /* "cpu" by default */
    int instance_count; /* >= 1 */
    kd_version_policy policy;
    int latest_n;
    int nspecific;
    int64_t *specific;
} kd_model_config;

/** Frees what a config holds and zeroes it (an empty one, or one a failed copy left with NULL
 *  arrays, is fine). */
void kd_repository_config_free(kd_model_config *c);

typedef struct kd_model_version {
    int64_t version;
    char *path;         /* resolved folder */
    const char *format; /* "kiln" or "onnx"; NULL when invalid */
    bool valid;
    char *why;   /* reason when not valid */
    bool served; /* chosen by the version policy */
    kd_model_config config;
} kd_model_version;

typedef struct kd_model_info {
    char *name;
    char *path;
    bool valid; /* at least one valid version and a valid policy */
    char *why;
    kd_version_policy policy;
    int nversions; /* every version folder found, ascending */
    kd_model_version *versions;
} kd_model_info;

typedef struct kd_repository kd_repository;

/**
 * Open and scan an existing folder (never created here). NULL plus kiln_error() when it is
 * missing, not a folder or cannot be read. Entries of the root other than folders (a README.md)
 * and hidden ones are not models and are passed over.
 */
kd_repository *kd_repository_open(const char *root);
void kd_repository_close(kd_repository *repo);
/** Re-read the folder. 0, or negative when the root itself cannot be read. */
int kd_repository_scan(kd_repository *repo);
int kd_repository_count(const kd_repository *repo);
/** Models in name order; valid until the next scan, add or remove. */
const kd_model_info *kd_repository_model(const kd_repository *repo, int i);
const kd_model_info *kd_repository_find(const kd_repository *repo, const char *name);
/** True for a name that may come from outside ([A-Za-z0-9_.-], no leading dot, no ".."). */
bool kd_repository_name_valid(const char *name);
/**
 * Copy the regular files of src_dir into a new version of name (version 0: one above the
 * highest present), atomically. *out_version (may be NULL) receives it. The new version
 * must validate. 0, or a negative code plus kiln_error(); nothing is left on failure.
 */
int kd_repository_add_version(kd_repository *repo, const char *name, const char *src_dir, int64_t version,
                              int64_t *out_version);
/**
 * kd_repository_add_version with version 0, the new version also above floor: a caller that knows
 * of versions whose folders are gone (a registry) passes the highest, so that a number once given
 * to a model is never given to another.
 */
int kd_repository_add_version_above(kd_repository *repo, const char *name, const char *src_dir, int64_t floor,
                                    int64_t *out_version);
/** Remove one version (renamed out of sight first, then deleted). 0 or negative. */
int kd_repository_remove_version(kd_repository *repo, const char *name, int64_t version);

/** The file a version may carry to say what made it: {"source": "<who>", ...} (any other keys). */
#define KD_REPOSITORY_SOURCE_FILE "source.json"
/**
 * The highest version of name (as of the last scan) whose source.json has "source" equal to
 * source: how a producer that wrote a version and then stopped finds it again instead of adding
 * another. *json (may be NULL) receives that file's text (malloc'd, the caller frees it).
 * Returns the version, 0 when no version says so, or a negative code plus kiln_error().
 * Unreadable or malformed source.json files are passed over (they say nothing).
 */
int64_t kd_repository_find_source(const kd_repository *repo, const char *name, const char *source, char **json);

#ifdef __cplusplus
}
#endif
#endif /* KD_CATALOG_REPOSITORY_H */
