/*
 * scheduler/sched-impl.h — the scheduler's structs, shared by scheduler.c (workers, queues,
 * batching), model.c (building an instance from a repository version, running a batch),
 * model-checks.c (what a load checks, and learns by dry runs, before an instance is served),
 * sched-gate.c (training's turn on a device) and sched-pool.c (an idle device's pool trim).
 */
#ifndef KD_SCHED_IMPL_H
#define KD_SCHED_IMPL_H

#include <pthread.h>

#include "kiln/nn.h"
#include "kiln/onnx.h"
#include "scheduler.h"

struct kd_sched_worker;

/*
 * What one instance runs: a kiln module or an ONNX graph, exactly one of them. The ONNX graph's
 * outputs come back in graph order, so onnx_out maps each configured output to its graph index.
 */
struct kd_sched_exec {
    kiln_module *module;
    kiln_onnx_model *onnx;
    int onnx_nout;                      /* graph outputs kiln_onnx_run returns */
    int onnx_out[KD_SCHED_MAX_IO];
};

struct kd_sched_instance {
    struct kd_sched_model *model;
    struct kd_sched_worker *worker;
    struct kd_sched_exec exec;          /* touched only on worker's thread */
    bool linked;                        /* in worker->insts (under the scheduler lock) */
    struct kd_sched_instance *wnext;
};

struct kd_sched_model {
    struct kd_sched *sched;
    char *name;
    int64_t version;
    char *path;
    const char *format;                 /* "kiln" or "onnx" (the repository's static strings) */
    /*
     * A deep copy of config.json. An ONNX version's build fills inputs and outputs it does not
     * list (under the lock, before the load completes), so readers on the loop see it complete.
     */
    kd_model_config cfg;
    bool outputs_checked;       /* an ONNX version's outputs were learned or checked (scheduler lock) */
    bool batch_decided;         /* an instance has taken on the batching check (scheduler lock) */
    atomic_bool split_warned;   /* a batch whose outputs did not split was logged (once) */
    struct kd_sched_gate *gate; /* the gate of the device its instances run on */
    atomic_int refs;
    atomic_int pending;                 /* instance loads or frees still to finish */
    int ninst;
    struct kd_sched_instance *inst;
    char why[256];                      /* first load failure */
    void (*load_done)(void *ud, struct kd_sched_model *m, const char *why);
    void *load_ud;
    struct kd_sched_request load_req; /* carries the load's completion to the loop */
    /* under the scheduler lock */
    struct kd_sched_request *head, *tail;
    size_t queued;
    struct kd_sched_stats stats;
    struct kd_sched_model *prev, *next; /* every live model, for shutdown */
};

struct kd_sched_ctl {
    void (*fn)(struct kd_sched_worker *w, void *arg);
    void *arg;
    struct kd_sched_ctl *next;
};

/*
 * One device spec's training gate. Workers that drive the same spec share it, and its device:
 * the gate also keeps when the device's pool is due for its idle trim (sched-pool.c). Every field
 * is under the scheduler lock.
 */
struct kd_sched_gate {
    char *spec;
    pthread_cond_t cv;                  /* trainers wait here; workers broadcast when they go idle */
    int jobs;                           /* training jobs holding a slot */
    int waiting;                        /* trainers blocked in begin or acquire */
    struct kd_sched_training_stats stats;
    uint64_t work_ended_ns; /* when work on the device last ended (uv_hrtime) */
    bool pool_trimmed;      /* trimmed since (or no work yet): no trim is due */
    struct kd_sched_pool_stats pool;
};

struct kd_sched_worker {
    struct kd_sched *sched;
    struct kd_sched_gate *gate;         /* its device spec's */
    bool running;                       /* a batch or a task is running on it (under the lock) */
    pthread_t thread;
    pthread_cond_t cv;
    kiln_device *dev;
    char *spec;
    bool started;
    struct kd_sched_ctl *ctl_head, *ctl_tail;
    struct kd_sched_instance *insts;
    struct kd_sched_instance *rr;                /* where the next search for work starts */
    struct kd_sched_task *task_head, *task_tail; /* kd_sched_task_submit's queue */
    bool task_turn;                     /* a task goes before the next batch */
};

struct kd_sched {
    struct kd_sched_options opts;
    pthread_mutex_t mu;                 /* queues, instance lists, control lists, stats */
    struct kd_sched_worker *workers;
    size_t nworkers;
    struct kd_sched_gate *gates; /* one per distinct device spec */
    size_t ngates;
    bool stopping, stopped;
    struct kd_sched_model *models;
    uv_async_t async;
    bool async_open;
    uv_timer_t expire; /* answers queued requests at their deadline (sched-expire.c) */
    bool expire_open;
    uint64_t expire_due_ns; /* when it fires next; 0 when it is not armed */
    pthread_mutex_t done_mu;
    struct kd_sched_request *done_head, *done_tail;
};

/* Hands requests back to the loop, which runs their done callbacks. Any thread. */
void kd_sched_post_done_n(struct kd_sched *s, struct kd_sched_request **rs, int n);

/* sched-expire.c, on the loop thread: a queued request is answered as timed out when its
 * deadline passes, not only when a worker next takes it off the queue. */
void kd_sched_expire_init(struct kd_sched *s, uv_loop_t *loop);
void kd_sched_expire_arm(struct kd_sched *s, uint64_t deadline_ns);
void kd_sched_expire_close(struct kd_sched *s);

/* Reports a line through the scheduler's log hook (kd_sched_options.log); without one, a warning
 * or an error goes to stderr and the rest is dropped. Any thread. */
void kd_sched_logf(const struct kd_sched *s, enum kd_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Builds one instance on the calling (worker) thread. 0, or -1 with why filled. */
int kd_sched_build(struct kd_sched_model *m, kiln_device *dev, struct kd_sched_exec *out, char *why, size_t n);
/* Frees what kd_sched_build made (on the same thread); safe on an empty exec. */
void kd_sched_unbuild(struct kd_sched_exec *e);

/*
 * Runs n requests (rows rows in all) through module as one batch: inputs concatenated along dim 0
 * when the model batches, outputs split back. Fills each request's outputs, or its outcome/error.
 */
void kd_sched_run(struct kd_sched_model *m, struct kd_sched_exec *e, kiln_device *dev,
                  struct kd_sched_request **reqs, int n, int64_t rows);

/* The KServe datatype name of a kiln dtype ("FP32" for KILN_F32), or NULL for one kilnd does not serve. */
const char *kd_sched_datatype_of(kiln_dtype dt);

/*
 * model-checks.c: what a load checks before an instance is served. kd_sched_onnx_inputs: the
 * graph's inputs as specs (names borrowed from g, in graph order), checked against and shaped by
 * those config.json lists (cfg_in, ncfg_in; none: the graph's declarations). 0, or -1 with why.
 */
int kd_sched_onnx_inputs(kiln_onnx_model *g, const kd_model_tensor_spec *cfg_in, int ncfg_in,
                         kd_model_tensor_spec *ins, char *why, size_t n);
/* The dry runs on zeros one build makes of g (ins: kd_sched_onnx_inputs's, borrowed), each size
 * at most once. check_batching: kd_sched_check_batching will run, so the outputs are learned from
 * its runs. NULL when out of memory. */
struct kd_sched_probe;
struct kd_sched_probe *kd_sched_probe_new(kiln_onnx_model *g, kiln_device *dev, const kd_model_tensor_spec *ins,
                                          int nins, bool check_batching);
void kd_sched_probe_free(struct kd_sched_probe *p);
/* The graph outputs' datatypes and shapes (-1 where a dim follows the inputs' free dims; names
 * borrowed from g) in outs, in graph order. every_dim false may hold the free dims beside the
 * batch at 1 and then returns 1, so that a dim that follows only them shows as 1. 0 or 1, or -1
 * with why. */
int kd_sched_probe_outputs(struct kd_sched_probe *p, bool every_dim, kd_model_tensor_spec *outs, char *why,
                           size_t n);
/* config.json's outputs (c) against the dry runs: the same datatype and rank, and no dim both fix
 * at different sizes. Where the runs fail, nothing is checked. 0, or -1 with why. */
int kd_sched_probe_check_outputs(struct kd_sched_probe *p, const kd_model_config *c, char *why, size_t n);
/* Whether the instance e of c batches: every input has a free dim 0 and, for an ONNX graph
 * (through p), over dry runs at two batch sizes (the inputs' other free dims 1) every configured
 * output's dim 0 is the batch and its other dims stay the same (a kiln record: config.json
 * declares every output's dim 0 free; p NULL). 0, or -1 with why naming the input or output. */
int kd_sched_check_batching(const kd_model_config *c, const struct kd_sched_exec *e, struct kd_sched_probe *p,
                            char *why, size_t n);

/* sched-gate.c: the gate of device spec, or NULL when no worker drives it. */
struct kd_sched_gate *kd_sched_gate_for(struct kd_sched *s, const char *spec);
/* Under the lock: inference work queued or running on g's device. */
bool kd_sched_gate_busy(const struct kd_sched *s, const struct kd_sched_gate *g);

/* sched-pool.c, under the scheduler's lock. Work (a batch, a task, a control task, a training
 * job) on g's device ended now: its pool's idle time starts over. */
void kd_sched_pool_work_ended(struct kd_sched_gate *g);
/* For worker w with nothing to run: when its device's pool is due for the idle trim (uv_hrtime
 * clock), or 0 when none is (trimming is off, it was trimmed since the last work, or the device
 * is busy: the work's end times the next one). */
uint64_t kd_sched_pool_trim_due(const struct kd_sched *s, const struct kd_sched_worker *w);
/* Trims w's device's pool on w's thread, dropping the lock while the trim runs. */
void kd_sched_pool_trim(struct kd_sched *s, struct kd_sched_worker *w);
/* Wakes g's workers to time the trim of work that ended off them (a training job's). */
void kd_sched_pool_wake(struct kd_sched *s, struct kd_sched_gate *g);

/* sched-batch.c, under the scheduler's lock. The rows r adds to a batch of m (its first input's
 * batch dim; 1 for a model that does not batch). */
int64_t kd_sched_rows_of(const struct kd_sched_model *m, const struct kd_sched_request *r);
/* How many requests from the head of m's queue should run now (0: not yet; then *wake_ns says
 * when to look again, 0 for never). */
int kd_sched_batch_ready(const struct kd_sched_model *m, uint64_t now, uint64_t *wake_ns);
/* A deep copy of src (model.c); freed with the catalog's kd_repository_config_free. */
int kd_sched_config_copy(kd_model_config *dst, const kd_model_config *src);

#endif /* KD_SCHED_IMPL_H */
