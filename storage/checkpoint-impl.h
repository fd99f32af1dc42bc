/*
 * storage/checkpoint-impl.h — what the checkpoint writer and reader (checkpoint.c) share with
 * listing, "latest good" and retention (checkpoint-list.c). Internal to storage/.
 */
#ifndef KILN_CHECKPOINT_IMPL_H
#define KILN_CHECKPOINT_IMPL_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

/** "a/b", malloc'd; NULL when out of memory. */
char *kiln__ckpt_path_join(const char *a, const char *b);
/** A JSON number that is an integer in 0..2^53 (what the manifest's step and epoch may be). */
bool kiln__ckpt_json_i64(const cJSON *j, int64_t *out);
/** Read and check dir/MANIFEST (checksum line, JSON, step, epoch, files); its JSON body, or
 *  NULL with the reason in kiln_error(). */
cJSON *kiln__ckpt_read_manifest(const char *dir);
/** Every file the manifest lists has the recorded size and hash, and every required file is
 *  listed: 0, or a negative code with the reason in kiln_error() (reads every byte). */
int kiln__ckpt_verify_files(const char *dir, const cJSON *manifest);
/** The step in a folder name after prefix ("step-000001200" -> 1200), or -1. */
int64_t kiln__ckpt_name_step(const char *name, const char *prefix);
/** A metric as the manifest stores it: a number, or "inf", "-inf" or "nan". */
bool kiln__ckpt_metric_of(const cJSON *m, double *value);
/** Move the folder path under root out of sight (.trash-*), then delete it. */
int kiln__ckpt_discard_dir(const char *root, const char *path);

#endif /* KILN_CHECKPOINT_IMPL_H */
