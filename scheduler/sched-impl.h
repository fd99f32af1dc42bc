/*
 * scheduler/sched-impl.h — the scheduler's structs, shared by scheduler.c (workers, queues,
 * batching), model.c (building an instance from a repository version, running a batch) and
 * sched-gate.c (training's turn on a device).
 */
#ifndef KILN_SCHED_IMPL_H
#define KILN_SCHED_IMPL_H

#include <pthread.h>

#include "kiln/nn.h"
#include "kiln/onnx.h"
#include "scheduler.h"

struct kiln__sched_worker;

/*
 * What one instance runs: a kiln module or an ONNX graph, exactly one of them. The ONNX graph's
 * outputs come back in graph order, so onnx_out maps each configured output to its graph index.
 */
struct kiln__sched_exec {
    kiln_module *module;
    kiln_onnx_model *onnx;
    int onnx_nout;                      /* graph outputs kiln_onnx_run returns */
    int onnx_out[KILN_SCHED_MAX_IO];
};

struct kiln__sched_instance {
    struct kiln_sched_model *model;
    struct kiln__sched_worker *worker;
    struct kiln__sched_exec exec;       /* touched only on worker's thread */
    bool linked;                        /* in worker->insts (under the scheduler lock) */
    struct kiln__sched_instance *wnext;
};

struct kiln_sched_model {
    struct kiln_sched *sched;
    char *name;
    int64_t version;
    char *path;
    const char *format;                 /* "kiln" or "onnx" (the repository's static strings) */
    /*
     * A deep copy of config.json. An ONNX version's build fills inputs and outputs it does not
     * list (under the lock, before the load completes), so readers on the loop see it complete.
     */
    kiln_model_config cfg;
    struct kiln__sched_gate *gate;      /* the gate of the device its instances run on */
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

/*
 * One device spec's training gate. Workers that drive the same spec share it. Every field is
 * under the scheduler lock.
 */
struct kiln__sched_gate {
    char *spec;
    pthread_cond_t cv;                  /* trainers wait here; workers broadcast when they go idle */
    int jobs;                           /* training jobs holding a slot */
    int waiting;                        /* trainers blocked in begin or acquire */
    struct kiln_sched_training_stats stats;
};

struct kiln__sched_worker {
    struct kiln_sched *sched;
    struct kiln__sched_gate *gate;      /* its device spec's */
    bool running;                       /* a batch or a task is running on it (under the lock) */
    pthread_t thread;
    pthread_cond_t cv;
    kiln_device *dev;
    char *spec;
    bool started;
    struct kiln__sched_ctl *ctl_head, *ctl_tail;
    struct kiln__sched_instance *insts;
    struct kiln__sched_instance *rr;    /* where the next search for work starts */
    struct kiln_sched_task *task_head, *task_tail;  /* kiln_sched_task_submit's queue */
    bool task_turn;                     /* a task goes before the next batch */
};

struct kiln_sched {
    struct kiln_sched_options opts;
    pthread_mutex_t mu;                 /* queues, instance lists, control lists, stats */
    struct kiln__sched_worker *workers;
    size_t nworkers;
    struct kiln__sched_gate *gates;     /* one per distinct device spec */
    size_t ngates;
    bool stopping, stopped;
    struct kiln_sched_model *models;
    uv_async_t async;
    bool async_open;
    pthread_mutex_t done_mu;
    struct kiln_sched_request *done_head, *done_tail;
};

/* Builds one instance on the calling (worker) thread. 0, or -1 with why filled. */
int kiln__sched_build(struct kiln_sched_model *m, kiln_device *dev, struct kiln__sched_exec *out, char *why,
                      size_t n);
/* Frees what kiln__sched_build made (on the same thread); safe on an empty exec. */
void kiln__sched_unbuild(struct kiln__sched_exec *e);

/*
 * Runs n requests (rows rows in all) through module as one batch: inputs concatenated along dim 0
 * when the model batches, outputs split back. Fills each request's outputs, or its outcome/error.
 */
void kiln__sched_run(struct kiln_sched_model *m, struct kiln__sched_exec *e, kiln_device *dev,
                     struct kiln_sched_request **reqs, int n, int64_t rows);

/* sched-gate.c: the gate of device spec, or NULL when no worker drives it. */
struct kiln__sched_gate *kiln__sched_gate_for(struct kiln_sched *s, const char *spec);

int kiln__sched_config_copy(kiln_model_config *dst, const kiln_model_config *src);
void kiln__sched_config_free(kiln_model_config *c);

#endif /* KILN_SCHED_IMPL_H */
