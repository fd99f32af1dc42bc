/*
 * scheduler/trainer-impl.h — what the trainer's files share:
 *   trainer-spec.c      the job spec: parsing and checking (loop thread)
 *   trainer-run.c       a job's run on the training thread
 *   trainer-register.c  the trained model into the repository
 *   trainer-onnx.c      fine-tuning an ONNX graph and writing it back
 */
#ifndef KD_SCHEDULER_TRAINER_IMPL_H
#define KD_SCHEDULER_TRAINER_IMPL_H

#include "kiln/data.h"
#include "kiln/nn.h"
#include "trainer.h"

/* Metric names the Learner produces, NULL-terminated; keep-best and early stopping use one. */
extern const char *const kd_trainer_metrics[];

/* Adds model (in eval mode) as the next version of run->spec->register_as; fills res->version,
 * or res->error and returns -1. */
int kd_trainer_register(const struct kd_trainer_run *run, kiln_module *model, const kiln_dataset_info *info,
                        struct kd_trainer_result *res);

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
