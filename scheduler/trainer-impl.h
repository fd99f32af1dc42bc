/*
 * scheduler/trainer-impl.h — what the trainer's files share:
 *   trainer-spec.c      the job spec: parsing and checking (loop thread)
 *   trainer-run.c       a job's run on the training thread
 *   trainer-register.c  the trained model into the repository
 */
#ifndef KILN_SCHEDULER_TRAINER_IMPL_H
#define KILN_SCHEDULER_TRAINER_IMPL_H

#include "kiln/data.h"
#include "kiln/nn.h"
#include "trainer.h"

/* Metric names the Learner produces, NULL-terminated; keep-best and early stopping use one. */
extern const char *const kiln__trainer_metrics[];

/* Adds model (in eval mode) as the next version of run->spec->register_as; fills res->version,
 * or res->error and returns -1. */
int kiln__trainer_register(const struct kiln_trainer_run *run, kiln_module *model, const kiln_dataset_info *info,
                           struct kiln_trainer_result *res);

#endif /* KILN_SCHEDULER_TRAINER_IMPL_H */
