/*
 * scheduler/trainer.h — training jobs: the job spec (parsed and checked on the loop thread; at
 * submission its device is also opened once, and its model built once and run on one item shaped
 * like the data's, so a spec that cannot run is refused there) and the run of one job (on the
 * daemon's training thread), which builds the model, data sets, optimizer and Learner from the
 * spec, resumes from a checkpoint when one exists, trains, and adds the trained model to the
 * repository.
 *
 *     struct kd_jobspec s;
 *     char problems[2048];
 *     if (kd_jobspec_parse(text, &env, &s, problems, sizeof problems) != 0) -> 400 problems
 *     ...on the training thread:
 *     struct kd_trainer_result res;
 *     kd_trainer_run(&s, &run, &res);    // hooks get every event; res says how it ended
 *     kd_jobspec_free(&s);
 *
 * docs/jobs.md is the reference of the spec's fields.
 */
#ifndef KD_SCHEDULER_TRAINER_H
#define KD_SCHEDULER_TRAINER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/optim.h"

struct kd_sched;

/* Where a spec's paths may point: every data path must resolve (realpath) under a root. */
struct kd_jobspec_env {
    const char *const *roots;
    size_t nroots;
    const char *models_root;          /* the repository, for a model to fine-tune (NULL: none) */
    /* Submission (false when a queued job is parsed again to run, which meets these problems
     * itself): refuse a key given twice, and ask resumable about resume_from_job when it is
     * given. (kd_jobspec_check_runnable does the slow checks, off the loop.) */
    bool submit;
    int (*resumable)(void *ud, int64_t job, char *why, size_t len); /* 0, or -1 with why */
    void *resumable_ud;
};

/*
 * The devices kilnd drives, for every spec parsed from then on: those of sched's workers (NULL,
 * the default: any device spec that opens, "cpu" when a spec names none). A job's device must
 * then be one of them, named as configured or as the device calls itself ("vulkan:0" for one
 * configured as "vulkan"), as serving matches a model's device; the spec keeps the configured
 * spelling, which the served model's config.json repeats, and a spec without a device takes
 * the first configured one. Call it once the scheduler runs and before the first spec is
 * parsed (kilnd: where the jobs module starts), and with NULL before the scheduler goes.
 */
void kd_jobspec_set_devices(struct kd_sched *sched);

struct kd_jobspec {
    char *model_json;                 /* the model's JSON graph spec (NULL for an ONNX model) */
    char *model_onnx;                 /* fine-tuning: the ONNX file trained through (real path) */
    char *init_weights;               /* fine-tuning a kiln model: its model.kiln (the start) */
    char *base_model;                 /* fine-tuning a repository model: its name, and version */
    int64_t base_version;
    char *data_type;                  /* "fashion_mnist", "idx" or "csv" */
    char *train_a, *train_b;          /* idx: images, labels; csv: file, NULL; fashion_mnist: dir */
    char *valid_a, *valid_b;          /* a separate validation set (NULL: none or split) */
    char *label_column;               /* csv */
    bool normalize;                   /* fashion_mnist: its mean and std */
    int64_t limit, valid_limit;       /* use the first N items (0: all) */
    double valid_split;               /* 0: no split */
    double label_smoothing;
    kiln_optim_config optim;
    int grad_accum; /* batches whose gradients add up to one update (1) */
    bool has_sched, sched_per_step;
    kiln_sched_config sched;
    int64_t epochs, batch_size;
    char *device; /* as configured (kd_jobspec_set_devices), or as given */
    uint64_t seed;
    int workers;
    int64_t ckpt_every_epochs, ckpt_every_steps;
    int keep_last;
    char *best_metric;
    bool best_max;
    char *early_metric;
    bool early_max;
    int patience;
    double min_delta;
    char *register_as;                /* repository model name, or NULL */
    int max_batch_size;               /* for the served model's config.json */
    int64_t resume_from_job;          /* continue from that job's checkpoints (0: none) */
};

/*
 * Parse and check a job spec. On failure returns -1 and writes every problem found, each
 * "field: what is wrong", separated by "\n", into problems.
 */
int kd_jobspec_parse(const char *json, const struct kd_jobspec_env *env, struct kd_jobspec *out, char *problems,
                     size_t len);
/* What a parsed spec needs to run at all: its device opens (and is closed again); its model
 * (JSON or ONNX) builds on the ref device and, where the data's item shape is known cheaply (the
 * IDX header, the CSV header line), takes one zero item of that shape and gives [1, W] class
 * scores with W at least the data's class count when that is known (IDX labels); and its
 * optimizer and scheduler accept their settings over the model's parameters. Slow for a large
 * model, a GPU's first context or a remote device: call it off the loop thread. 0, or -1 with
 * one "field: problem" line per problem in problems, as kd_jobspec_parse writes them. */
int kd_jobspec_check_runnable(const struct kd_jobspec *s, char *problems, size_t len);
void kd_jobspec_free(struct kd_jobspec *s);

/* What a run reports while it goes: type is "step", "epoch", "checkpoint" or "log" (a "log" event
 * is {"message": ...}, with "level": "warning" for a problem the run went on past). warn gets the
 * same warnings' messages for kilnd's own log (NULL: none). */
struct kd_trainer_hooks {
    void *ud;
    void (*event)(void *ud, const char *type, const char *json);
    void (*progress)(void *ud, double fraction);
    void (*checkpoint)(void *ud, const char *path, int64_t step);
    void (*warn)(void *ud, const char *message);
};

struct kd_trainer_run {
    const struct kd_jobspec *spec;
    const char *checkpoint_dir;       /* this job's checkpoints (created) */
    const char *resume_dir;           /* resume from its newest good checkpoint, or NULL */
    const char *models_root;          /* the repository */
    int64_t version_floor;            /* the new version is above it (a registry's highest) */
    const char *scratch_dir;          /* where the model version is staged */
    const char *source;               /* what runs it (e.g. "kilnd job 7 ..."), written into the
                                       * version's source.json with the final metrics, so a
                                       * restarted run finds the version it already added
                                       * (kd_repository_find_source); NULL: none */
    atomic_bool *cancel;              /* set by another thread: stop before the next step */
    struct kd_trainer_hooks hooks;
};

struct kd_trainer_result {
    char stop_reason[32];             /* "completed", "early_stopping", "cancelled", "error" */
    char error[512];
    int64_t version;                  /* the repository version added (0: none) */
    char *metrics_json;               /* {"valid_accuracy":..., ...} of the last epoch; free() */
    bool resumed;
    int64_t resumed_step;
};

/* 0 when training ended (completed, early stopping, cancelled), -1 with res->error otherwise. */
int kd_trainer_run(const struct kd_trainer_run *run, struct kd_trainer_result *res);

#endif /* KD_SCHEDULER_TRAINER_H */
