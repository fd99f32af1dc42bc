/*
 * scheduler/trainer-impl.h — what the trainer's files share:
 *   trainer-spec.c      the job spec: parsing and checking (loop thread)
 *   trainer-spec-settings.c  the spec's training settings (loss, optimizer, scheduler, ...)
 *   trainer-run.c       a job's run on the training thread
 *   trainer-register.c  the trained model into the repository
 *   trainer-onnx.c      fine-tuning an ONNX graph and writing it back
 */
#ifndef KD_SCHEDULER_TRAINER_IMPL_H
#define KD_SCHEDULER_TRAINER_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "kiln/data.h"
#include "kiln/nn.h"
#include "trainer.h"

/* Metric names the Learner produces, NULL-terminated; keep-best and early stopping use one. */
extern const char *const kd_trainer_metrics[];

/* ---- the job spec's parse, shared by trainer-spec.c and trainer-spec-settings.c ---------------- */

/* Every problem a spec has, one "field: problem" line each, into the caller's buf (cut at len);
 * count goes on counting past it. */
struct kd_spec_problems {
    char *buf;
    size_t len, used;
    int count;
};

/* trainer-spec.c: adds "field: <fmt>" to p. */
void kd_spec_problem(struct kd_spec_problems *p, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* obj's member key (case-sensitive), or NULL. */
const cJSON *kd_spec_get(const cJSON *obj, const char *key);
/* The readers of obj's member key, reported as field: a number within [lo, hi], an integer within
 * [lo, hi], true or false into *out (an absent key keeps *out); a non-empty string (malloc'd;
 * NULL when absent, a problem then if required). */
void kd_spec_number(struct kd_spec_problems *p, const cJSON *obj, const char *key, const char *field, double lo,
                    double hi, double *out);
void kd_spec_integer(struct kd_spec_problems *p, const cJSON *obj, const char *key, const char *field, int64_t lo,
                     int64_t hi, int64_t *out);
void kd_spec_boolean(struct kd_spec_problems *p, const cJSON *obj, const char *key, const char *field, bool *out);
char *kd_spec_string(struct kd_spec_problems *p, const cJSON *obj, const char *key, const char *field,
                     bool required);
/* A problem for each member of obj not in allowed (NULL-terminated), named prefix + key. */
void kd_spec_unknown_keys(struct kd_spec_problems *p, const cJSON *obj, const char *prefix,
                          const char *const *allowed);

/* trainer-spec-settings.c: whether name is one of kd_trainer_metrics. */
bool kd_spec_known_metric(const char *name);
/* The sections of root (each optional) into s: "loss", "optimizer", "scheduler", "checkpoint" and
 * "early_stopping", with their defaults where absent. */
void kd_spec_parse_loss(struct kd_spec_problems *p, const cJSON *root, struct kd_jobspec *s);
void kd_spec_parse_optimizer(struct kd_spec_problems *p, const cJSON *root, struct kd_jobspec *s);
void kd_spec_parse_scheduler(struct kd_spec_problems *p, const cJSON *root, struct kd_jobspec *s);
void kd_spec_parse_checkpoint(struct kd_spec_problems *p, const cJSON *root, struct kd_jobspec *s);
void kd_spec_parse_early_stopping(struct kd_spec_problems *p, const cJSON *root, struct kd_jobspec *s);

/* Adds model (in eval mode) as the next version of run->spec->register_as, its output width
 * class scores an item (kd_trainer_output_width); where train's classes have names, they go
 * with it as labels.txt (the output's label_filename). Fills res->version, or res->error and
 * returns -1. */
int kd_trainer_register(const struct kd_trainer_run *run, kiln_module *model, const kiln_dataset *train,
                        const kiln_dataset_info *info, int64_t width, struct kd_trainer_result *res);

/* trainer-run.c: what a spec's training items look like, as far as a cheap look tells: the item
 * shape from the IDX images' header or the CSV header line (ndim 0: not known), the class count
 * from IDX labels of bytes (0: not known), and what that look found wrong: a label column the CSV
 * header does not have, IDX images and labels of different counts (problem "" when nothing; the
 * spec's field it concerns in problem_field). */
struct kd_trainer_items {
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    int64_t num_classes;
    const char *problem_field;
    char problem[2048];
};
void kd_trainer_probe_items(const struct kd_jobspec *s, struct kd_trainer_items *out);
/* One zero item of items' shape through model on dev (eval mode, no gradients, its training mode
 * put back): the width W of its [1, W] class scores, or -1 with why filled when the model does
 * not take the item, does not give [1, W], or gives fewer scores than items->num_classes. */
int64_t kd_trainer_output_width(kiln_module *model, kiln_device *dev, const struct kd_trainer_items *items,
                                char *why, size_t len);

/* trainer-onnx.c: the ONNX file at path as a module whose parameters are the graph's floating
 * initializers (fine-tuning); NULL with err filled. */
kiln_module *kd_trainer_onnx_module(const char *path, kiln_device *dev, char *err, size_t errlen);
/* A cheap look at the file a spec names: 0 when it reads as an ONNX ModelProto, else -1 with
 * why filled (a phrase to put after the path). */
int kd_trainer_onnx_check(const char *path, char *why, size_t len);
/* Writes dst: the ONNX file src with the float initializers holding model's trained values.
 * model comes from kd_trainer_onnx_module. 0, or -1 with err filled. */
int kd_trainer_onnx_write(kiln_module *model, const char *src, const char *dst, char *err, size_t errlen);

#endif /* KD_SCHEDULER_TRAINER_IMPL_H */
