/*
 * scheduler/sched-impl.h — the scheduler's structs, shared by scheduler.c (workers, queues,
 * batching) and model.c (building an instance from a repository version, running a batch).
 */
#ifndef KILN_SCHED_IMPL_H
#define KILN_SCHED_IMPL_H

#include <pthread.h>

#include "kiln/nn.h"
#include "scheduler.h"

struct kiln__sched_worker;

struct kiln__sched_instance {
    struct kiln_sched_model *model;
    struct kiln__sched_worker *worker;
    kiln_module *module;                /* touched only on worker's thread */
    bool linked;                        /* in worker->insts (under the scheduler lock) */
    struct kiln__sched_instance *wnext;
};

struct kiln_sched_model {
    struct kiln_sched *sched;
    char *name;
    int64_t version;
    char *path;
    kiln_model_config cfg;              /* a deep copy */
    atomic_int refs;
    atomic_int pending;                 /* instance loads or frees still to finish */
    int ninst;
    struct kiln__sched_instance *inst;
    char why[256];                      /* first load failure */
    void (*load_done)(void *ud, struct kiln_sched_model *m, const char *why);
    void *load_ud;
    struct kiln_sched_request load_req; /* carries the load's completion to the loop */
    /* under the scheduler lock */
    struct kiln_sched_request *head, *tail;
    size_t queued;
    struct kiln_sched_stats stats;
    struct kiln_sched_model *prev, *next;   /* every live model, for shutdown */
};

struct kiln__sched_ctl {
    void (*fn)(struct kiln__sched_worker *w, void *arg);
    void *arg;
    struct kiln__sched_ctl *next;
};

struct kiln__sched_worker {
    struct kiln_sched *sched;
    pthread_t thread;
    pthread_cond_t cv;
    kiln_device *dev;
    char *spec;
    bool started;
    struct kiln__sched_ctl *ctl_head, *ctl_tail;
    struct kiln__sched_instance *insts;
    struct kiln__sched_instance *rr;    /* where the next search for work starts */
};

struct kiln_sched {
    struct kiln_sched_options opts;
    pthread_mutex_t mu;                 /* queues, instance lists, control lists, stats */
    struct kiln__sched_worker *workers;
    size_t nworkers;
    bool stopping, stopped;
    struct kiln_sched_model *models;
    uv_async_t async;
    bool async_open;
    pthread_mutex_t done_mu;
    struct kiln_sched_request *done_head, *done_tail;
};

/* Builds one instance's module on the calling (worker) thread. 0, or -1 with why filled. */
int kiln__sched_build(struct kiln_sched_model *m, kiln_device *dev, kiln_module **out, char *why, size_t n);

/*
 * Runs n requests (rows rows in all) through module as one batch: inputs concatenated along dim 0
 * when the model batches, outputs split back. Fills each request's outputs, or its outcome/error.
 */
void kiln__sched_run(struct kiln_sched_model *m, kiln_module *module, kiln_device *dev,
                     struct kiln_sched_request **reqs, int n, int64_t rows);

int kiln__sched_config_copy(kiln_model_config *dst, const kiln_model_config *src);
void kiln__sched_config_free(kiln_model_config *c);

#endif /* KILN_SCHED_IMPL_H */
