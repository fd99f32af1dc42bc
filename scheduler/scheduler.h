/*
 * scheduler/scheduler.h — where inference work runs: one or more worker threads per device,
 * each the only thread that touches its device; model versions loaded as instances on those
 * workers; a dynamic batcher per model that gathers queued requests into one run.
 *
 * The I/O loop never waits on any of it. A request is submitted with host buffers and a done
 * callback; a worker gathers a batch (up to max_batch_size, aiming for a preferred size, waiting
 * at most max_queue_delay_us for one to fill, and less when a request's deadline_ns comes first:
 * the batch then goes in time for it to start), concatenates the inputs along dim 0, runs the
 * model once, splits the outputs and posts every request back to the loop through one
 * uv_async_t, whose callback drains the whole completion queue (a run's requests are posted
 * together, and sends coalesce).
 *
 *     struct kd_sched *s;
 *     kd_sched_new(&s, &(struct kd_sched_options){.loop = loop, .devices = devs, ...}, err, n);
 *     kd_sched_model_load(s, "mnist", &version_info, on_loaded, ud);   // done on the loop
 *     req->model = kd_sched_model_retain(m); ... kd_sched_submit(s, req);
 *     kd_sched_stop(s);   // joins the workers; queued requests complete as KD_SCHED_SHUTDOWN
 *     kd_sched_destroy(s);   // after the loop has delivered the last completions
 *
 * Thread affinity: submit, load, release and the stats/queue readers are called on the loop
 * thread; done callbacks run there too. Model instances live and die on their worker.
 */
#ifndef KD_SCHEDULER_H
#define KD_SCHEDULER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "config.h"
#include "kiln/tensor.h"
#include "repository.h"

#define KD_SCHED_MAX_IO 16
#define KD_SCHED_BATCH_SIZES 64 /* distinct batch sizes the statistics count runs of */

struct kd_sched;
struct kd_sched_model;

struct kd_sched_options {
    uv_loop_t *loop;
    const char *const *devices;     /* device specs the workers open */
    size_t ndevices;
    int workers_per_device;         /* >= 1 */
    size_t max_queue;               /* per model; a full queue refuses submissions */
    /* The training gate ((kd_sched_training_*)): the longest a training step waits for a
     * device's inference to drain before it runs anyway (0: training never waits), and how many
     * training jobs may hold one device at once (0 means 1). */
    int64_t training_max_wait_ms;
    int training_max_jobs;
    int training_nice;              /* CPU priority a training job's thread drops to (0: unchanged) */
    /* Where the scheduler reports what it went on past (a model served unbatched, an autotune
     * file ignored): one finished line, without a newline, at level. It is called on the worker
     * threads, several at once, so it must be thread safe (kilnd's kd_log_sink is: a line is one
     * write). NULL, for a program or test that keeps no log: warnings and errors go to stderr,
     * lines of lower levels are dropped. */
    void (*log)(void *ud, enum kd_log_level level, const char *msg);
    void *log_ud;
    /* A device with no work (no batch, task, model load or free, training job) for this long
     * has the buffers its pool keeps for reuse handed back to the system (kiln_device_trim), by
     * one of its workers; 0: never (the pool keeps them until an allocation needs the room). */
    int64_t pool_idle_trim_ms;
};

/* A host tensor: row-major bytes in dtype. */
struct kd_sched_tensor {
    kiln_dtype dtype;
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    void *data; /* malloc'd, owned by the request, unless borrowed */
    size_t nbytes;
    bool borrowed; /* data is the caller's (read only, alive until done): not freed */
};

enum kd_sched_outcome {
    KD_SCHED_OK = 0,
    KD_SCHED_FAILED,    /* the model refused the input or failed; error says why */
    KD_SCHED_TIMEOUT,   /* its deadline passed before it ran */
    KD_SCHED_CANCELLED, /* the client left before it ran */
    KD_SCHED_SHUTDOWN,  /* the scheduler stopped before it ran */
};

const char *kd_sched_outcome_to_str(enum kd_sched_outcome o);

/*
 * Whose fault a KD_SCHED_FAILED request is, so that the API answers the right status. The
 * scheduler classifies the engine's failure once, where the run fails, by its code
 * (kiln_error_code: a failed op returns NULL, so the code comes beside its message), and the API
 * maps the class.
 */
enum kd_sched_fault {
    KD_SCHED_FAULT_INPUT = 0, /* the request's data (an index out of range, a shape the model
                                 refuses): 400, INVALID_ARGUMENT */
    KD_SCHED_FAULT_MEMORY,    /* memory ran out; it may free up: 503 with Retry-After, RESOURCE_EXHAUSTED */
    KD_SCHED_FAULT_TOO_LARGE, /* one buffer passes a limit of the device at this request's size (a
                                 smaller batch may fit): 413, RESOURCE_EXHAUSTED */
    KD_SCHED_FAULT_INTERNAL,  /* the server's own (the model disagrees with its config.json, the
                                 backend lacks an op, the device failed): 500, INTERNAL */
};

/* The class of an engine failure with code (kiln_error_code(): a negative KILN_E*) and message
 * msg (kiln_error()'s). The code decides; msg is read only when code is 0, a failure set without
 * one (its words then say what it was). */
enum kd_sched_fault kd_sched_fault_of(int code, const char *msg);

struct kd_sched_request {
    struct kd_sched_model *model;       /* a reference; released by the caller after done */
    int ninputs;                        /* in the model's input order */
    struct kd_sched_tensor inputs[KD_SCHED_MAX_IO];
    int noutputs;                       /* filled by the worker, in the model's output order */
    struct kd_sched_tensor outputs[KD_SCHED_MAX_IO];
    const atomic_bool *cancelled;       /* may be NULL */
    uint64_t deadline_ns;               /* uv_hrtime() clock; 0 for none */
    void (*done)(struct kd_sched_request *r);
    /*
     * Optional: runs on the worker that took the request, outside the scheduler's lock, before
     * the request joins its run. It finishes what the loop left to the workers (the API decodes
     * JSON tensor data there, so that every core parses). The inputs' dtypes, shapes and buffers
     * must already be set at submit: the batcher groups by them. 0, or -1 with error filled: the
     * request then completes as KD_SCHED_FAILED without running.
     */
    int (*prepare)(struct kd_sched_request *r);
    /*
     * Optional: runs on the worker after the run (whatever its outcome), outside the lock, before
     * the request is posted back: work on the results that need not wait for the loop (the API
     * encodes the response body there).
     */
    void (*finish)(struct kd_sched_request *r);
    void *ud;
    /* results, valid in done */
    enum kd_sched_outcome outcome;
    enum kd_sched_fault fault; /* for KD_SCHED_FAILED */
    /* Room for an engine message (KILN_ERROR_MAX, 512) behind the scheduler's prefix, so that the
     * client gets it whole. */
    char error[1024];
    uint64_t enqueued_ns, started_ns, finished_ns;
    int batch_size;                     /* requests' rows in the run it was part of */
    struct kd_sched_request *next;      /* the scheduler's */
};

/* What a model's statistics extension reports; times in nanoseconds. */
struct kd_sched_stats {
    /* Requests, as Triton counts them: success and fail count every request to the version
     * (fail: refused input, a full queue, a timeout, a cancel, a failed run), queue those taken
     * off its queue (their wait), compute those that succeeded (each with its run's time). */
    uint64_t success_count, fail_count, queue_count, compute_count, inference_count;
    uint64_t success_ns, fail_ns, queue_ns, compute_request_ns;
    /* Runs: execution_count those with a request that succeeded, as Triton counts executions;
     * runs and compute_ns every run (the deadline lead's estimate of a run's time). */
    uint64_t execution_count, runs, compute_ns;
    uint64_t last_inference_ms;         /* wall clock, ms since the epoch */
    /* Runs by their exact batch size (rows), ascending, as Triton reports batch_stats: the first
     * KD_SCHED_BATCH_SIZES distinct sizes a version runs (runs of later new sizes count only in
     * execution_count). */
    struct kd_sched_batch_stat {
        int64_t size;
        uint64_t count, compute_ns;
    } batches[KD_SCHED_BATCH_SIZES];
    int nbatches;
};

int kd_sched_new(struct kd_sched **out, const struct kd_sched_options *o, char *err, size_t errlen);
/* Stops the workers: requests still queued complete as KD_SCHED_SHUTDOWN (delivered by the loop). */
void kd_sched_stop(struct kd_sched *s);
/* After stop and after the loop ran the last callbacks; closes the async handle first (run the loop). */
void kd_sched_close(struct kd_sched *s);
/* Not kiln_sched_free: libkiln exports that name for the learning-rate scheduler (kiln/optim.h),
 * and a definition in kilnd would take its place for every caller in the process. */
void kd_sched_destroy(struct kd_sched *s);

/*
 * Loads version v of name on the device its config names, instance_count times. done runs on
 * the loop with the model (one reference, the caller's) or NULL and a reason. Returns 0 when the
 * load started, -1 out of memory, -2 when no worker drives that device, -3 when the scheduler is
 * stopping (kilnd is shutting down).
 */
int kd_sched_model_load(struct kd_sched *s, const char *name, const kd_model_version *v,
                        void (*done)(void *ud, struct kd_sched_model *m, const char *why), void *ud);

struct kd_sched_model *kd_sched_model_retain(struct kd_sched_model *m);
/* The last reference frees the instances on their workers. */
void kd_sched_model_release(struct kd_sched_model *m);

const char *kd_sched_model_name(const struct kd_sched_model *m);
int64_t kd_sched_model_version(const struct kd_sched_model *m);
/* Why m cannot run any more — one of the devices its instances run on was lost, written as
 * "device 'SPEC': <the backend's message>" into why — 1; 0 while every device works. */
int kd_sched_model_lost(const struct kd_sched_model *m, char *why, size_t whylen);
/* For an ONNX version, inputs and outputs config.json leaves out are the graph's own (read at load). */
const kd_model_config *kd_sched_model_config(const struct kd_sched_model *m);
/* "kiln" (model.kiln) or "onnx" (model.onnx). */
const char *kd_sched_model_format(const struct kd_sched_model *m);
size_t kd_sched_model_queued(const struct kd_sched_model *m);
void kd_sched_model_stats(const struct kd_sched_model *m, struct kd_sched_stats *out);
/* A reload of the same version goes on counting where the version it replaces had got to, as
 * /metrics does (its series are the version's): called before to takes requests. */
void kd_sched_model_carry_stats(struct kd_sched_model *to, const struct kd_sched_model *from);
/* A request to m refused before it was queued (its input, a full queue): a failure in m's
 * statistics, waited_ns from its arrival. Any thread. */
void kd_sched_model_count_refused(struct kd_sched_model *m, uint64_t waited_ns);

/*
 * Queues r. 0, or -1 when the model's queue is full (answer 503; done will not run).
 * Every input's dim 0 is its batch when the model batches (max_batch_size > 0).
 */
int kd_sched_submit(struct kd_sched *s, struct kd_sched_request *r);

/* The kiln dtype of a KServe datatype name ("FP32" -> KILN_F32), or -1. */
int kd_sched_dtype_of(const char *datatype);

/* Frees the input and output buffers a request holds. */
void kd_sched_request_clear(struct kd_sched_request *r);

/*
 * Generic work for a device's worker (remote tensor sessions use it): run is called on the worker
 * thread that owns the device, then done on the loop thread. A worker alternates between queued
 * tasks and ready inference batches, so neither can starve the other. Buffers a task allocates
 * belong to that worker's device: a client whose state lives on a device keeps using the worker
 * that kd_sched_worker_for gave it.
 */
struct kd_sched_task {
    void (*run)(struct kd_sched_task *t, kiln_device *dev); /* worker thread */
    void (*done)(struct kd_sched_task *t);                  /* loop thread, exactly once */
    void *ud;
    bool shutdown;                      /* in done: the scheduler stopped before run was called */
    /* the scheduler's */
    struct kd_sched_task *next;
    struct kd_sched_request carrier; /* takes the completion through the loop's async queue */
};

/* A device's idle trims (kd_sched_options.pool_idle_trim_ms) since the scheduler started. */
struct kd_sched_pool_stats {
    uint64_t trims;          /* trims that ran: one per idle stretch that followed work */
    uint64_t released_bytes; /* cached buffers they handed back to the system */
};

/* *out for device (a spec as configured, or as the device names itself): 0, or -1 when no worker
 * drives it. Any thread. */
int kd_sched_pool_stats(struct kd_sched *s, const char *device, struct kd_sched_pool_stats *out);

/* A worker driving device spec (the hint spreads clients over several), or -1 when none does. */
int kd_sched_worker_for(struct kd_sched *s, const char *device, unsigned hint);
/* 0 while every device the workers drive works; -1 with why ("device 'vulkan:0': ... was
 * lost") once one failed for good. Any thread. */
int kd_sched_device_health(struct kd_sched *s, char *why, size_t whylen);
/* 1 with why as kd_sched_device_health writes it when a worker driving device (a spec as
 * configured, or as the device names itself) lost it; 0 otherwise. Any thread. A device opened
 * again by its spec is the same handle, lost too, so this is what says whether work can run. */
int kd_sched_device_lost(struct kd_sched *s, const char *device, char *why, size_t whylen);
/* fn(ctx, spec, dev) once per distinct device the workers drive (for its memory figures);
 * called on the loop thread while the workers run, so fn may only use thread-safe calls. */
void kd_sched_each_device(struct kd_sched *s, void (*fn)(void *ctx, const char *spec, kiln_device *dev),
                          void *ctx);
/* Queues t on worker; 0, or -1 when the scheduler is stopping (done will not run). */
int kd_sched_task_submit(struct kd_sched *s, int worker, struct kd_sched_task *t);

/*
 * The training gate: inference preempts training on a shared device between training steps.
 *
 * A training job does not run on the device's workers (a step is a long chain of ops with its
 * own memory scope); it runs on its own thread and asks the scheduler for the device around
 * every step:
 *
 *     struct kd_sched_training t;
 *     if (kd_sched_training_begin(s, "cpu", &cancel, &t) == 0) {   // a job slot on the device
 *         for each step:
 *             kd_sched_training_acquire(&t);   // waits while inference is pending
 *             ...the step...
 *             kd_sched_training_release(&t);
 *         kd_sched_training_end(&t);
 *     }
 *
 * acquire waits while the device has inference work: requests queued for a model whose
 * instances live on it, a batch running on one of its workers, or a task queued or running
 * there. Inference itself never waits for training; it shares the device with at most the one
 * step that was already in flight when it arrived. So that training cannot starve under constant
 * load, acquire gives up waiting after training_max_wait_ms and lets the step run anyway (a
 * "forced" step). A set cancel flag or a stopping scheduler ends any wait at once (the caller
 * should then stop training; the flag is polled, so a canceller need not call anything here).
 *
 * begin admits at most training_max_jobs jobs per device, waiting for a slot otherwise. A device
 * spec no worker drives is not gated: begin and acquire return 0 at once.
 *
 * Most of an inference request's time is not on the device but on the I/O loop (HTTP, JSON), and
 * a step in flight competes with it for the cores. So begin also lowers the calling thread's CPU
 * priority to nice training_nice (never raising it back: the thread is the job's; threads it
 * starts afterwards, such as data loaders, inherit it). Threads shared with inference (the cpu
 * backend's pool workers, OpenBLAS's) keep theirs.
 *
 * Thread affinity: begin, acquire, release and end on the training job's thread; stats and wake
 * from any thread.
 */
struct kd_sched_training {
    struct kd_sched *sched;
    int dev;                            /* index of the gated device, -1 when not gated */
    const atomic_bool *cancel;          /* may be NULL */
    bool holding;                       /* between acquire and release */
    uint64_t yields, forced, wait_ns;   /* this job's (see kd_sched_training_stats) */
};

/* Totals over every device since the scheduler started. */
struct kd_sched_training_stats {
    uint64_t steps;                     /* steps run: releases after an acquire */
    uint64_t yields;                    /* acquires that found inference pending and waited */
    uint64_t forced;                    /* of those, the ones that ran because the wait bound passed */
    uint64_t wait_ns;                   /* time training spent waiting for inference */
    int jobs;                           /* training jobs holding a device now */
    int waiting;                        /* trainers blocked in begin or acquire now */
};

/* 0 with a job slot held; 1 when cancel was set or the scheduler stopped while waiting (no slot). */
int kd_sched_training_begin(struct kd_sched *s, const char *device, const atomic_bool *cancel,
                            struct kd_sched_training *t);
/* Before a step: 0 go; 1 when cancel was set or the scheduler stopped (the step should not run). */
int kd_sched_training_acquire(struct kd_sched_training *t);
void kd_sched_training_release(struct kd_sched_training *t);
/* Gives the job slot back (releasing a step still held). */
void kd_sched_training_end(struct kd_sched_training *t);
/* Wakes every waiting trainer so it rechecks its cancel flag now rather than at its next poll. */
void kd_sched_training_wake(struct kd_sched *s);
void kd_sched_training_stats(struct kd_sched *s, struct kd_sched_training_stats *out);

#endif /* KD_SCHEDULER_H */
