/*
 * kiln/tensor.h — devices, tensors, scopes, errors and the tensor operations.
 *
 * A short tour:
 *
 *     kiln_device *dev = kiln_device_open("cpu");
 *     kiln_scope_begin();
 *     kiln_tensor *x = kiln_from_data(dev, KILN_F32, KILN_SHAPE(2, 3), host, sizeof host);
 *     kiln_tensor *y = kiln_softmax(kiln_relu(x), -1);
 *     kiln_keep(y);                       // survives the scope; the caller owns it now
 *     kiln_scope_end();                   // releases x and relu(x)
 *     if (!y) fprintf(stderr, "%s\n", kiln_error());
 *     float out[6]; kiln_to_data(y, out, sizeof out);
 *     kiln_tensor_release(y);
 *     kiln_device_close(dev);
 *
 * Ownership: every function that returns a kiln_tensor * returns a new reference to a
 * new object — never its input object again, even when the op has nothing to do (a cast
 * to the same dtype gives a view of the same storage), so each object has one owner.
 * Outside a scope the caller owns it and calls kiln_tensor_release(). While a scope is
 * open on the calling thread, the innermost scope takes that reference and releases it
 * at kiln_scope_end(), unless kiln_keep() hands it to the caller first.
 *
 * Errors: a fallible call returns NULL (or a negative int) and sets a thread-local
 * message, read with kiln_error(), naming the op, the shapes and the dtypes, and beside
 * it a code, read with kiln_error_code(), saying what kind of failure it was (out of
 * memory, ...) where the engine knows. Every op given a NULL tensor returns NULL without
 * touching either, so a chain of calls fails once, at the end, with the first cause.
 *
 * Threads: the engine is safe to call from several threads on distinct tensors. Scopes
 * and the error (message and code) are per thread.
 *
 * Dtype promotion (PyTorch's rules): when two tensors of different dtypes meet in a
 * binary op, the result takes the higher category (bool < integer < floating) and,
 * within a category, the wider type; f16 with bf16 gives f32; u8 with a signed integer
 * gives the next signed integer wide enough (u8+i32 -> i32, u8+i64 -> i64). Scalars
 * (the double arguments of *_scalar ops) never widen a tensor's dtype, except that a
 * non-integral scalar with an integer or bool tensor gives f32. Integer division
 * (kiln_div) gives f32, as PyTorch's true division does; comparisons give bool.
 */
#ifndef KILN_TENSOR_H
#define KILN_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/export.h"

#ifdef __cplusplus
extern "C" {
#endif

KILN_API_BEGIN

/** The most dimensions a tensor may have. */
#define KILN_MAX_DIMS 8

/** Element types. The order is part of the wire protocol; append only. */
typedef enum kiln_dtype {
    KILN_F32 = 0,
    KILN_F64,
    KILN_F16,
    KILN_BF16,
    KILN_I64,
    KILN_I32,
    KILN_U8,
    KILN_BOOL,
    KILN_DTYPE_COUNT
} kiln_dtype;

/** Short name ("f32", "bf16", ...); "?" for an invalid value. */
const char *kiln_dtype_name(kiln_dtype dt);
/** Parse a short name; returns -1 when unknown. */
int kiln_dtype_from_name(const char *name);
/** Bytes per element; 0 for an invalid value. */
size_t kiln_dtype_size(kiln_dtype dt);
bool kiln_dtype_is_float(kiln_dtype dt);
/** The dtype two tensors of types a and b promote to (see the rules above). */
kiln_dtype kiln_promote_types(kiln_dtype a, kiln_dtype b);

/** Shape literal helper: kiln_zeros(dev, KILN_F32, KILN_SHAPE(2, 3)). */
#define KILN_SHAPE(...) \
    (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (const int64_t[]){__VA_ARGS__}
/** Dims literal helper for reductions: kiln_sum(x, KILN_DIMS(0, 2), true). */
#define KILN_DIMS(...) (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)), (const int[]){__VA_ARGS__}
/** All dims, for reductions: kiln_sum(x, KILN_ALL_DIMS, false). */
#define KILN_ALL_DIMS 0, NULL

/* ------------------------------------------------------------------------- errors */

/** The calling thread's last error message ("" when none). Valid until the next error. */
const char *kiln_error(void);
/**
 * The code of the calling thread's last error: one of the negative KILN_E* codes below
 * when the call that failed knew what kind of failure it was (out of memory, a device
 * failure, ...), 0 when it set only a message, or when there is no error. Set and cleared
 * together with kiln_error()'s message, so it reaches the caller of a call that returns
 * NULL (every tensor op) as well as one that returns the code. A message that restates an
 * earlier failure ("Linear 'fc': matmul: cannot allocate ...") keeps that failure's code.
 * Decide by the code; the message is for people and its words may change.
 */
int kiln_error_code(void);
/** Clear the calling thread's error message and code. */
void kiln_error_clear(void);

/**
 * Where libkiln's warnings go: things it did on its own that a user should hear of, and that
 * are no call's failure (an autotune cache ignored as corrupt, a fused kernel that did not
 * compile and runs unfused, a pipeline cache passed over). By default each is one line on
 * stderr, "kiln: <message>"; an application with a log of its own (kilnd) passes a handler,
 * called with the message (no prefix, no newline) on whichever thread warned, and NULL to
 * go back to stderr. Any thread; a handler set while another thread warns gets that warning
 * or the next. Profiles asked for by environment (KILN_ONNX_PROFILE) still print to stderr.
 */
typedef void (*kiln_warning_handler)(void *ud, const char *message);
void kiln_set_warning_handler(kiln_warning_handler handler, void *ud);

/* Negative codes returned by the int-returning calls (with the message set as above), and
 * kept for kiln_error_code(). Append only. */
#define KILN_EINVAL (-1)  /* an argument the caller should not have sent */
#define KILN_ENOMEM (-2)  /* allocation failed: memory in use now, which may free up */
#define KILN_ENOTSUP (-3) /* the backend does not do this op/dtype */
#define KILN_EDEVICE (-4) /* the device failed */
#define KILN_EIO (-5)     /* a file or socket failed */
/* one buffer passes a limit of the device or of the address space at this size: no memory
 * freed makes it fit, a smaller one may */
#define KILN_ETOOLARGE (-6)

/* ------------------------------------------------------------------------ devices */

typedef struct kiln_device kiln_device;

/**
 * Open a device by spec: "cpu", "ref", "cuda:0", "vulkan:0", "hip:0",
 * "remote://host:port/cpu" (an IPv6 address in brackets: "remote://[::1]:8080/cpu"), "counting:SPEC" (a decorator that counts what SPEC's device
 * is asked to do), "fused:SPEC" (a decorator that fuses elementwise chains for SPEC's
 * device), each optionally followed by options: "cpu?threads=2&conv=direct".
 * The options of every backend and the environment variables that set their defaults
 * are listed in docs/configuration.md; an unknown option or a bad value refuses the
 * open with a message naming it. Opening the same spec (options included) twice gives
 * the same handle with one more reference, as long as the options in effect are the
 * same: a default (kiln_device_defaults_set) or an environment variable changed since
 * gives a device of its own, opened with it (and a bad value is refused then). A spec
 * that names the fused decorator and sets fusion=off is refused. Returns NULL with a
 * message when the spec is malformed or the backend is not compiled in or not present.
 */
kiln_device *kiln_device_open(const char *spec);
/** kiln_device_open(spec) with options given apart: "key=value&key=value" (or NULL),
 *  applied over those in spec. For a program (kilnd) that keeps them in its config. */
kiln_device *kiln_device_open_opts(const char *spec, const char *options);
/** Options every later open of backend's devices starts from ("threads=2&conv=direct";
 *  NULL or "" clears them): over the environment's defaults, under a spec's own options.
 *  backend is a backend's name without index ("cpu", "cuda", "vulkan", "hip", "ref",
 *  "remote") or a decorator's ("counting", "fused"), compiled in or not. The values are
 *  checked when a device opens. For a program that keeps them in its config (kilnd's
 *  device_options). -1 with a message when backend is unknown or the text malformed. */
int kiln_device_defaults_set(const char *backend, const char *options);
/** Drop a reference taken by kiln_device_open. Tensors keep their device alive. */
void kiln_device_close(kiln_device *dev);
/** The canonical spec as opened ("cpu", "cuda:0", "cpu?threads=2", ...), secrets shown as
 *  "***" ("remote://h:8080/cpu?token=***"), so it may be logged. Devices opened with
 *  different defaults or environments may share a name. */
const char *kiln_device_name(const kiln_device *dev);
/** spec as written, with the values of secret options (a remote token) shown as "***", the
 *  way kiln_device_name shows them: for a program that names a configured spec in its logs
 *  or errors. Writes at most len bytes (truncating) and returns out. */
char *kiln_device_spec_redact(const char *spec, char *out, size_t len);
/** Wait until all work queued on the device, on every queue, has finished; reports an
 *  error that work found (a device-side index check names its op). 0 or negative.
 *  On an asynchronous device (vulkan, cuda, remote) such an error is found late, by the
 *  next sync or read of its queue, after later work may have used the failed op's result.
 *  So it spoils, for good, every tensor its queue wrote since the queue last drained
 *  without an error, and everything computed from those later: reading one (kiln_to_data,
 *  kiln_item, a save, a move to another device) fails with the error however often it is
 *  read, and a sync after work that read one fails again. Tensors written before that
 *  point, and uploads, fills and random draws (which read no tensor), stay good, and new
 *  work runs. A thread sharing the queue (the device's default one) may meet another
 *  thread's error this way; threads that must not use kiln_queue_open. */
int kiln_device_sync(kiln_device *dev);

/** What a counting device ("counting:cpu") has been asked to do since it opened; see
 *  kiln_device_counters. Fields are cumulative. */
typedef struct kiln_device_counters {
    uint64_t calls;              /* primitive entries called, all kinds */
    uint64_t uploads, upload_bytes;
    uint64_t downloads, download_bytes; /* host reads: each waits for the device */
    uint64_t syncs;
    uint64_t peer_copies;
    uint64_t events_recorded, event_waits;
} kiln_device_counters;
/** Fill *out from a device that keeps counters (the counting decorator); -1 with a
 *  message for one that does not. calls_of, when not NULL, receives the count of the
 *  primitive entry named entry ("matmul", "unary", ...; 0 for an unknown name). */
int kiln_device_counters_get(kiln_device *dev, kiln_device_counters *out, const char *entry, uint64_t *calls_of);

/** A device allocator's figures (the caching allocators of the cuda, vulkan and cpu
 *  backends), in bytes of device memory unless named otherwise. */
typedef struct kiln_device_memory {
    uint64_t in_use_bytes;   /* held by live buffers */
    uint64_t cached_bytes;   /* freed buffers kept for reuse */
    uint64_t reserved_bytes; /* taken from the device: in use + cached */
    uint64_t peak_in_use_bytes;
    uint64_t device_allocs; /* allocations that reached the device (cudaMalloc; on cpu, the system) */
    uint64_t reuses;        /* allocations served from the cache */
} kiln_device_memory;
/** Fill *out from a device whose backend keeps memory figures; KILN_ENOTSUP with a
 *  message naming the device for one that keeps none (ref, remote). Any thread. */
int kiln_device_memory_get(kiln_device *dev, kiln_device_memory *out);
/** Start dev's peak_in_use_bytes again from what is in use now, to measure the peak of
 *  one piece of work (a forward, a training step); 0, or KILN_ENOTSUP with a message
 *  naming the device for one that keeps no figures. Any thread. */
int kiln_device_memory_reset_peak(kiln_device *dev);
/**
 * Hand the buffers dev keeps for reuse (freed by the engine, used by no tensor: the
 * cached_bytes of kiln_device_memory) back to the system, largest first, until at least
 * bytes are released or none are left (SIZE_MAX: all of them). Returns the bytes
 * released: 0 when nothing was cached, for a backend that keeps no pool (ref, whose frees
 * go straight back, and remote) and for a NULL dev (with a message). vulkan releases its
 * buffers of their own memory block and keeps the shared 64 MiB blocks small buffers are
 * carved from, so some cached bytes may remain there.
 *
 * A device keeps what it frees until an allocation fails (the engine trims then and
 * retries), so a process that ran one large workload holds its memory afterwards; a
 * program that knows the device is idle (kilnd after limits.pool_idle_trim_ms) gives it
 * back here. The next allocations then reserve memory afresh, so trimming between the
 * steps of a running workload only slows it.
 *
 * Thread affinity: as an op, from a thread that uses dev: the trim goes through the
 * calling thread's current queue on dev (kiln_queue_use), and on an asynchronous device
 * it may wait for that queue's work that last used a buffer it releases. Other threads
 * may keep using dev meanwhile: the pool has its own lock, and a buffer whose last use
 * may still be running on another queue is waited for (cuda) or left alone (vulkan).
 */
size_t kiln_device_trim(kiln_device *dev, size_t bytes);
/** Why dev stopped working — a fault that lost the device's state (an illegal address on
 *  a GPU), after which every op on it fails — or NULL while it works (and for NULL). */
const char *kiln_device_lost(kiln_device *dev);

/* ------------------------------------------------------------------ queues, events */

/**
 * A queue (a stream) of one device: work submitted to it runs in order; work on two
 * queues is ordered only by events. Each thread has a current queue per device (the
 * device's default queue until kiln_queue_use), and every op, upload and download that
 * thread makes on the device goes to it. The engine orders a tensor's uses across
 * queues by itself (a tensor made on one queue and read on another waits for its
 * producer), so queues change only what may overlap, never a result. On ref and cpu
 * work finishes when it is submitted; their queues and events are complete at once.
 * Thread affinity: a queue is used by one thread at a time.
 */
typedef struct kiln_queue kiln_queue;
typedef struct kiln_event kiln_event;

/** A new queue on dev; NULL with a message on failure. */
kiln_queue *kiln_queue_open(kiln_device *dev);
/** Wait for q's work, make the default queue current again on the calling thread if q
 *  was current there (close a queue on the thread that uses it), and drop q. Tensors
 *  made on q stay valid: the backend queue lives until the last of them is freed. NULL
 *  is a no-op. */
void kiln_queue_close(kiln_queue *q);
/** Make q the calling thread's current queue for q's device (NULL for dev: back to the
 *  default queue). Returns the queue it replaces (NULL for the default). A queue of
 *  another device changes nothing and sets an error. */
kiln_queue *kiln_queue_use(kiln_device *dev, kiln_queue *q);
/** The calling thread's current queue for dev. */
kiln_queue *kiln_queue_current(kiln_device *dev);
/** Wait for the work queued on q (q only), reporting an error it found. */
int kiln_queue_sync(kiln_queue *q);
/** Mark the current end of q's work; NULL with a message on failure. */
kiln_event *kiln_event_record(kiln_queue *q);
/** Work submitted to q after this call runs after ev's work; the host does not wait. */
int kiln_event_wait(kiln_queue *q, kiln_event *ev);
/** The host waits for ev's work; reports an error it found. */
int kiln_event_sync(kiln_event *ev);
/** 1 when ev's work finished, 0 while it runs, negative on error. */
int kiln_event_query(kiln_event *ev);
void kiln_event_free(kiln_event *ev);

/** Host memory dev can copy from and to without staging (pinned where the backend has
 *  it, else plain aligned memory), 64-byte aligned; free with kiln_host_free on the same
 *  device. An upload from it may be read until the queue passes it: keep it unchanged
 *  until an event recorded after the upload completes (kiln_event_sync). */
void *kiln_host_alloc(kiln_device *dev, size_t nbytes);
void kiln_host_free(kiln_device *dev, void *ptr);
/** Space-separated names of the backends compiled into this build. */
const char *kiln_backends_compiled(void);

/** One physical device a compiled backend found (kiln_device_list). */
typedef struct kiln_device_info {
    char spec[64];         /* what kiln_device_open takes: "vulkan:0" */
    char name[128];        /* the device's own name */
    char driver[192];      /* its driver, with version where the driver says */
    uint64_t memory_bytes; /* device memory (its largest device-local heap); 0: unknown */
} kiln_device_info;
/** The physical devices of the compiled backends that enumerate theirs (vulkan: every
 *  device the Vulkan loader lists), in spec order: up to max written to out; returns how
 *  many there are (which may exceed max), or -1 with kiln_error() set. A backend whose
 *  driver is missing lists nothing. */
int kiln_device_list(kiln_device_info *out, int max);

/* ------------------------------------------------------------------------ tensors */

typedef struct kiln_tensor kiln_tensor;

/** Add a reference; returns t. */
kiln_tensor *kiln_tensor_retain(kiln_tensor *t);
/** Drop a reference (frees storage when the last view goes). NULL is a no-op. */
void kiln_tensor_release(kiln_tensor *t);

int kiln_tensor_ndim(const kiln_tensor *t);
/** Size of dim d; negative d counts from the end. */
int64_t kiln_tensor_dim(const kiln_tensor *t, int d);
/** Pointer to the shape array (ndim entries), valid while t lives. */
const int64_t *kiln_tensor_shape(const kiln_tensor *t);
/** Pointer to the strides (in elements), valid while t lives. */
const int64_t *kiln_tensor_strides(const kiln_tensor *t);
int64_t kiln_tensor_numel(const kiln_tensor *t);
kiln_dtype kiln_tensor_dtype(const kiln_tensor *t);
kiln_device *kiln_tensor_device(const kiln_tensor *t);
bool kiln_tensor_is_contiguous(const kiln_tensor *t);
/** True when a and b view the same storage. */
bool kiln_tensor_shares_storage(const kiln_tensor *a, const kiln_tensor *b);
/** Write "f32[2, 3]" into buf; returns buf. */
char *kiln_tensor_describe(const kiln_tensor *t, char *buf, size_t len);

/* ------------------------------------------------------------------------- scopes */

/** Open a scope on this thread; scopes nest. */
void kiln_scope_begin(void);
/** Release every tensor the innermost scope holds and close it. */
void kiln_scope_end(void);
/** Take t out of the scopes: the caller owns the reference now. Returns t. */
kiln_tensor *kiln_keep(kiln_tensor *t);

/* ----------------------------------------------------------------------- creation */

kiln_tensor *kiln_empty(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape);
kiln_tensor *kiln_zeros(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape);
kiln_tensor *kiln_ones(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape);
/**
 * Every element value, as PyTorch's full: an integer dtype drops the fraction (2.5 -> 2)
 * but refuses a value outside its range, NaN or an infinity (u8 with 300) rather than wrap
 * it; bool takes any value (nonzero is true); floating dtypes round (f16 past 65504 is inf).
 * The same holds for kiln_full_like, kiln_masked_fill, and arange's and linspace's values.
 */
kiln_tensor *kiln_full(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape, double value);
/** [start, end) by step; the length is ceil((end - start) / step). */
kiln_tensor *kiln_arange(kiln_device *dev, kiln_dtype dt, double start, double end, double step);
kiln_tensor *kiln_linspace(kiln_device *dev, kiln_dtype dt, double start, double end, int64_t steps);
/** n x m with ones on the main diagonal; n, m >= 0 (m = n for a square one). */
kiln_tensor *kiln_eye(kiln_device *dev, kiln_dtype dt, int64_t n, int64_t m);
/**
 * A tensor holding a copy of host data laid out contiguously (row-major) in dtype dt.
 * nbytes must equal numel * dtype size, so a short buffer is an error, never an over-read.
 */
kiln_tensor *kiln_from_data(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape,
                            const void *data, size_t nbytes);
/**
 * A contiguous tensor whose storage is the caller's host memory, used in place: no copy.
 * data must be 64-byte aligned, writable and hold numel * dtype size bytes. When the
 * tensor's storage dies, release(release_ud) runs (release may be NULL). Only devices that
 * keep tensors in host memory can do this (cpu and ref); elsewhere, or for misaligned data,
 * NULL and an error, and release is not called: the caller still owns the memory and may
 * fall back to kiln_from_data. Writes through the tensor (an optimizer step) change data.
 * The caller may read and write data between any two ops, on a fused device too: there an op
 * that reads or writes lent memory runs before it returns (with the fused group it joined),
 * so a refilled buffer never reaches an op that already returned, while ops on its results
 * fuse as usual.
 */
kiln_tensor *kiln_from_host_memory(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape, void *data,
                                   void (*release)(void *), void *release_ud);
/** Copy t (any layout) into host memory, row-major; nbytes must be numel * dtype size. */
int kiln_to_data(const kiln_tensor *t, void *out, size_t nbytes);
/** Read a one-element tensor as double; NAN and an error otherwise. */
double kiln_item(const kiln_tensor *t);

kiln_tensor *kiln_empty_like(const kiln_tensor *t);
kiln_tensor *kiln_zeros_like(const kiln_tensor *t);
kiln_tensor *kiln_ones_like(const kiln_tensor *t);
kiln_tensor *kiln_full_like(const kiln_tensor *t, double value);

/**
 * Counter-based random numbers (Philox4x32-10): element i of a draw uses counter
 * (offset + i) under key seed, so a given generator state yields the same numbers on
 * every backend and thread count. Each draw advances offset by the elements it used.
 * Plain data: copy it to save and restore the state.
 */
typedef struct kiln_generator {
    uint64_t seed;
    uint64_t offset;
} kiln_generator;

kiln_generator kiln_generator_make(uint64_t seed);
kiln_tensor *kiln_rand_uniform(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape,
                               double low, double high, kiln_generator *gen);
kiln_tensor *kiln_rand_normal(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape,
                              double mean, double std, kiln_generator *gen);
/** 1 with probability p, else 0 (dtype dt). */
kiln_tensor *kiln_rand_bernoulli(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape,
                                 double p, kiln_generator *gen);
/**
 * Integers uniform in [low, high), which must fit dt (u8: [0, 256); f16: its finite
 * range; f32 rounds values past 2^24) and lie within [-2^53, 2^53]. Why that bound: the
 * bounds reach every backend (ref, cpu, cuda, vulkan, remote, through the decorators) as
 * the doubles of its rng entry and of the remote wire protocol, exact only up to 2^53; a
 * wider range would draw other numbers on some backends or none at all, breaking the
 * promise above of the same numbers everywhere. Carrying int64 bounds would change that
 * interface and the wire protocol; ranges that wide are refused instead.
 */
kiln_tensor *kiln_rand_int(kiln_device *dev, kiln_dtype dt, int ndim, const int64_t *shape,
                           int64_t low, int64_t high, kiln_generator *gen);

/* --------------------------------------------------------------- shapes and views */
/* View ops share storage with their input; the rest copy. Negative dims count from
 * the end. A -1 entry in a reshape is inferred. */

kiln_tensor *kiln_reshape(kiln_tensor *t, int ndim, const int64_t *shape);  /* view when possible */
kiln_tensor *kiln_flatten(kiln_tensor *t, int start_dim, int end_dim);
kiln_tensor *kiln_unflatten(kiln_tensor *t, int dim, int nsizes, const int64_t *sizes);
kiln_tensor *kiln_squeeze(kiln_tensor *t, int dim);      /* view */
kiln_tensor *kiln_squeeze_all(kiln_tensor *t);           /* view */
kiln_tensor *kiln_unsqueeze(kiln_tensor *t, int dim);    /* view */
kiln_tensor *kiln_permute(kiln_tensor *t, int ndim, const int *order);  /* view */
kiln_tensor *kiln_transpose(kiln_tensor *t, int d0, int d1);             /* view */
kiln_tensor *kiln_expand(kiln_tensor *t, int ndim, const int64_t *shape); /* view; -1 keeps */
/** Elements start, start+step, ... below end along dim (clamped like Python). View. */
kiln_tensor *kiln_slice(kiln_tensor *t, int dim, int64_t start, int64_t end, int64_t step);
kiln_tensor *kiln_narrow(kiln_tensor *t, int dim, int64_t start, int64_t length); /* view */
/** Split into pieces of split_size along dim; writes up to max_out views, returns count. */
int kiln_split(kiln_tensor *t, int64_t split_size, int dim, kiln_tensor **out, int max_out);
int kiln_chunk(kiln_tensor *t, int chunks, int dim, kiln_tensor **out, int max_out);
kiln_tensor *kiln_cat(kiln_tensor *const *ts, int n, int dim);
kiln_tensor *kiln_stack(kiln_tensor *const *ts, int n, int dim);
kiln_tensor *kiln_repeat(kiln_tensor *t, int ndim, const int64_t *repeats);
kiln_tensor *kiln_flip(kiln_tensor *t, int ndims, const int *dims);

typedef enum kiln_pad_mode {
    KILN_PAD_CONSTANT = 0,
    KILN_PAD_REFLECT,
    KILN_PAD_REPLICATE,
} kiln_pad_mode;
/** pads as PyTorch's F.pad: (last_lo, last_hi, prev_lo, prev_hi, ...), npads even. */
kiln_tensor *kiln_pad(kiln_tensor *t, int npads, const int64_t *pads, kiln_pad_mode mode, double value);
kiln_tensor *kiln_tril(kiln_tensor *t, int64_t diagonal);
kiln_tensor *kiln_triu(kiln_tensor *t, int64_t diagonal);
/** A view sharing t's storage when t is already contiguous, else a contiguous copy. */
kiln_tensor *kiln_contiguous(kiln_tensor *t);
/** A copy (always a new storage). */
kiln_tensor *kiln_clone(kiln_tensor *t);
kiln_tensor *kiln_cast(kiln_tensor *t, kiln_dtype dt);
kiln_tensor *kiln_to_device(kiln_tensor *t, kiln_device *dev);

/* -------------------------------------------------------------------- elementwise */
/* Unary ops keep the dtype (floating ops on integer input give f32, as PyTorch does).
 * On f16/bf16 the gradients of elu, gelu (both forms), silu, softplus and erf are taken
 * in f32 and rounded once, as PyTorch's are (in half, the x² of gelu's tanh form
 * overflows from |x| = 256). Odd functions keep the sign of zero (sin, tanh, erf, expm1,
 * elu, gelu, silu of -0 are -0); sign gives +0 for both zeros and for NaN, as PyTorch's.
 * On a bool tensor, as in PyTorch: neg, abs, relu, floor, ceil, round and clamp are refused
 * (NULL, KILN_EINVAL, a message naming the op and the dtype; cast first); sign is the
 * identity; square, and pow_scalar / add_scalar / mul_scalar with an integral scalar,
 * compute in i64; the floating functions give f32. */

kiln_tensor *kiln_neg(kiln_tensor *t);
kiln_tensor *kiln_abs(kiln_tensor *t);
kiln_tensor *kiln_sign(kiln_tensor *t);
kiln_tensor *kiln_exp(kiln_tensor *t);
kiln_tensor *kiln_log(kiln_tensor *t);
kiln_tensor *kiln_log1p(kiln_tensor *t);
kiln_tensor *kiln_expm1(kiln_tensor *t);
kiln_tensor *kiln_sqrt(kiln_tensor *t);
kiln_tensor *kiln_rsqrt(kiln_tensor *t);
kiln_tensor *kiln_square(kiln_tensor *t);
kiln_tensor *kiln_reciprocal(kiln_tensor *t);
kiln_tensor *kiln_sin(kiln_tensor *t);
kiln_tensor *kiln_cos(kiln_tensor *t);
kiln_tensor *kiln_tanh(kiln_tensor *t);
kiln_tensor *kiln_sigmoid(kiln_tensor *t);
kiln_tensor *kiln_relu(kiln_tensor *t);
kiln_tensor *kiln_leaky_relu(kiln_tensor *t, double negative_slope);
kiln_tensor *kiln_elu(kiln_tensor *t, double alpha);
/** GELU; tanh_approx selects the tanh form, otherwise the exact erf form. */
kiln_tensor *kiln_gelu(kiln_tensor *t, bool tanh_approx);
kiln_tensor *kiln_silu(kiln_tensor *t);
/** log(1 + exp(beta x)) / beta, linear above threshold (PyTorch's defaults: 1, 20). */
kiln_tensor *kiln_softplus(kiln_tensor *t, double beta, double threshold);
kiln_tensor *kiln_erf(kiln_tensor *t);
kiln_tensor *kiln_floor(kiln_tensor *t);
kiln_tensor *kiln_ceil(kiln_tensor *t);
/** Round half to even, as PyTorch. */
kiln_tensor *kiln_round(kiln_tensor *t);
/** Clamp to [lo, hi]; pass -INFINITY / INFINITY for one-sided. An integer tensor with
 *  integral bounds stays integer and is compared exactly (i64 past 2^53 included); a
 *  fractional or NaN bound computes in f32. */
kiln_tensor *kiln_clamp(kiln_tensor *t, double lo, double hi);
kiln_tensor *kiln_pow_scalar(kiln_tensor *t, double exponent);
kiln_tensor *kiln_isnan(kiln_tensor *t);  /* bool */
kiln_tensor *kiln_isinf(kiln_tensor *t);  /* bool */
kiln_tensor *kiln_logical_not(kiln_tensor *t); /* bool */

/* Binary ops broadcast and promote (see the top of this file). When both operands are
 * bool (the promoted dtype is bool), add is logical or, mul logical and, maximum / minimum
 * or / and, and sub, remainder and pow are refused (KILN_EINVAL), as PyTorch refuses them;
 * div computes in f32. */
kiln_tensor *kiln_add(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_sub(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_mul(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_div(kiln_tensor *a, kiln_tensor *b);
/** Python-style remainder: the result has the sign of b. On integer tensors a zero divisor
 *  gives 0 where PyTorch raises: refusing it would need a read of b's values, a wait the
 *  engine's asynchronous queues otherwise never make (the ONNX importer's Mod, whose spec
 *  calls it an error, reads them and refuses). */
kiln_tensor *kiln_remainder(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_pow(kiln_tensor *a, kiln_tensor *b);
/** Elementwise max / min; NaN wherever either operand is NaN; of equal operands (+0 and -0
 *  included) the first, so maximum(+0, -0) is +0 and maximum(-0, +0) is -0, on every
 *  backend (std::max's rule, which PyTorch's scalar kernel follows). Gradient, as PyTorch's:
 *  all of it to the operand that wins, half to each on a tie (equal values, +0 and -0
 *  included), all of it to both where either is NaN. */
kiln_tensor *kiln_maximum(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_minimum(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_eq(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_ne(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_lt(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_le(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_gt(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_ge(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_logical_and(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_logical_or(kiln_tensor *a, kiln_tensor *b);
kiln_tensor *kiln_logical_xor(kiln_tensor *a, kiln_tensor *b);
/* Tensor-scalar forms. */
kiln_tensor *kiln_add_scalar(kiln_tensor *a, double s);
kiln_tensor *kiln_mul_scalar(kiln_tensor *a, double s);
/** cond ? a : b, all three broadcast; cond is bool. */
kiln_tensor *kiln_where(kiln_tensor *cond, kiln_tensor *a, kiln_tensor *b);
/** t with value where mask (bool, broadcast to t) is true. */
kiln_tensor *kiln_masked_fill(kiln_tensor *t, kiln_tensor *mask, double value);

/* --------------------------------------------------------------------- reductions */
/* dims: ndims entries (negative count from the end); ndims == 0 reduces every dim.
 * Integer sums and products give i64; mean, var and std of integers give f32, computed
 * in f64 where the device has f64, so large integers (past 2^24) keep their precision.
 *
 * NaN, the same on every backend (and as PyTorch): sum, mean, prod, max, min, var, std,
 * logsumexp and the p-norms give NaN for a lane holding one (the 0-norm counts it as
 * nonzero, any and all as true); argmax and argmin give the index of the lane's first
 * NaN (a NaN counts as both the largest and the smallest value); sort, argsort and topk
 * order NaN after every number and all NaNs as equal, so ascending puts them last and
 * descending (topk largest) first, in their original order (the sort is stable); -0 and
 * +0 compare equal there. */

kiln_tensor *kiln_sum(kiln_tensor *t, int ndims, const int *dims, bool keepdim);
kiln_tensor *kiln_mean(kiln_tensor *t, int ndims, const int *dims, bool keepdim);
kiln_tensor *kiln_prod(kiln_tensor *t, int ndims, const int *dims, bool keepdim);
kiln_tensor *kiln_max(kiln_tensor *t, int ndims, const int *dims, bool keepdim);
kiln_tensor *kiln_min(kiln_tensor *t, int ndims, const int *dims, bool keepdim);
/** Variance with Bessel-style correction (1 = unbiased, PyTorch's default). */
kiln_tensor *kiln_var(kiln_tensor *t, int ndims, const int *dims, double correction, bool keepdim);
/** The square root of kiln_var; its gradient is 0 where the std is 0, as PyTorch's. */
kiln_tensor *kiln_std(kiln_tensor *t, int ndims, const int *dims, double correction, bool keepdim);
kiln_tensor *kiln_logsumexp(kiln_tensor *t, int ndims, const int *dims, bool keepdim);
/** p-norm (p = 2 for Euclidean; INFINITY for max-abs). */
kiln_tensor *kiln_norm(kiln_tensor *t, double p, int ndims, const int *dims, bool keepdim);
kiln_tensor *kiln_any(kiln_tensor *t, int ndims, const int *dims, bool keepdim);  /* bool */
kiln_tensor *kiln_all(kiln_tensor *t, int ndims, const int *dims, bool keepdim);  /* bool */
kiln_tensor *kiln_argmax(kiln_tensor *t, int dim, bool keepdim);  /* i64 */
kiln_tensor *kiln_argmin(kiln_tensor *t, int dim, bool keepdim);  /* i64 */
kiln_tensor *kiln_cumsum(kiln_tensor *t, int dim);
/** Sorted values and (optionally) i64 indices along dim; stable. */
int kiln_sort(kiln_tensor *t, int dim, bool descending, kiln_tensor **values, kiln_tensor **indices);
kiln_tensor *kiln_argsort(kiln_tensor *t, int dim, bool descending);
/** The k largest (or smallest) along dim, sorted. */
int kiln_topk(kiln_tensor *t, int64_t k, int dim, bool largest, kiln_tensor **values,
              kiln_tensor **indices);

/* ----------------------------------------------------------------------- indexing */

/** out[i][j] = t[index[i][j]][j] for dim 0 (and so on), as torch.gather. index is i64. */
kiln_tensor *kiln_gather(kiln_tensor *t, int dim, kiln_tensor *index);
/** A copy of t with src written at index along dim. */
kiln_tensor *kiln_scatter(kiln_tensor *t, int dim, kiln_tensor *index, kiln_tensor *src);
/** A copy of t with src added at index along dim (duplicates accumulate). */
kiln_tensor *kiln_scatter_add(kiln_tensor *t, int dim, kiln_tensor *index, kiln_tensor *src);
kiln_tensor *kiln_index_select(kiln_tensor *t, int dim, kiln_tensor *index);
/** A copy of t with src (broadcast) written into the slice [start:end:step] of dim. */
kiln_tensor *kiln_slice_assign(kiln_tensor *t, int dim, int64_t start, int64_t end, int64_t step,
                               kiln_tensor *src);
/** Integer classes -> one-hot of dtype dt with num_classes columns appended. */
kiln_tensor *kiln_one_hot(kiln_tensor *index, int64_t num_classes, kiln_dtype dt);
/** Rows of weight [V, D] picked by integer indices of any shape: shape (..., D). */
kiln_tensor *kiln_embedding(kiln_tensor *weight, kiln_tensor *indices);

/* ----------------------------------------------------------------- linear algebra */

/** Matrix product with NumPy semantics: 1-D operands, batch dims broadcast. */
kiln_tensor *kiln_matmul(kiln_tensor *a, kiln_tensor *b);
/** x · Wᵀ + b, weight [out, in], bias [out] or NULL. */
kiln_tensor *kiln_linear(kiln_tensor *x, kiln_tensor *weight, kiln_tensor *bias);

/* ---------------------------------------------------------------- nn primitives */

/** Convolution settings for 1, 2 or 3 spatial dims; unused entries are ignored. */
typedef struct kiln_conv_opts {
    int64_t stride[3];    /* 0 means 1 */
    int64_t padding[3];
    int64_t dilation[3];  /* 0 means 1 */
    int64_t groups;       /* 0 means 1 */
    int64_t output_padding[3]; /* transposed convolution only */
} kiln_conv_opts;

/** x [N, C, L...], weight [O, C/groups, K...], bias [O] or NULL; opts NULL = defaults. */
kiln_tensor *kiln_conv1d(kiln_tensor *x, kiln_tensor *weight, kiln_tensor *bias, const kiln_conv_opts *opts);
kiln_tensor *kiln_conv2d(kiln_tensor *x, kiln_tensor *weight, kiln_tensor *bias, const kiln_conv_opts *opts);
kiln_tensor *kiln_conv3d(kiln_tensor *x, kiln_tensor *weight, kiln_tensor *bias, const kiln_conv_opts *opts);
/** weight [C_in, C_out/groups, K...] as PyTorch's ConvTranspose. */
kiln_tensor *kiln_conv_transpose1d(kiln_tensor *x, kiln_tensor *weight, kiln_tensor *bias, const kiln_conv_opts *opts);
kiln_tensor *kiln_conv_transpose2d(kiln_tensor *x, kiln_tensor *weight, kiln_tensor *bias, const kiln_conv_opts *opts);

typedef struct kiln_pool_opts {
    int64_t kernel[3];
    int64_t stride[3];    /* 0 means the kernel size */
    int64_t padding[3];
    int64_t dilation[3];  /* 0 means 1; max pooling only */
    bool ceil_mode;
    bool count_include_pad; /* average pooling; PyTorch's default is true */
} kiln_pool_opts;

/** Max pooling; when indices is not NULL it receives i64 flat indices per plane. */
kiln_tensor *kiln_max_pool1d(kiln_tensor *x, const kiln_pool_opts *opts, kiln_tensor **indices);
kiln_tensor *kiln_max_pool2d(kiln_tensor *x, const kiln_pool_opts *opts, kiln_tensor **indices);
kiln_tensor *kiln_avg_pool1d(kiln_tensor *x, const kiln_pool_opts *opts);
kiln_tensor *kiln_avg_pool2d(kiln_tensor *x, const kiln_pool_opts *opts);
kiln_tensor *kiln_adaptive_avg_pool1d(kiln_tensor *x, int64_t out_l);
kiln_tensor *kiln_adaptive_avg_pool2d(kiln_tensor *x, int64_t out_h, int64_t out_w);

typedef enum kiln_interp_mode {
    KILN_INTERP_NEAREST = 0,
    KILN_INTERP_BILINEAR,
} kiln_interp_mode;
/** Resize [N, C, H, W] to out_h × out_w. */
kiln_tensor *kiln_interpolate(kiln_tensor *x, int64_t out_h, int64_t out_w, kiln_interp_mode mode,
                              bool align_corners);

kiln_tensor *kiln_softmax(kiln_tensor *t, int dim);
kiln_tensor *kiln_log_softmax(kiln_tensor *t, int dim);
/** Normalize over the last nnorm dims; weight and bias (shape of those dims) may be NULL. */
kiln_tensor *kiln_layer_norm(kiln_tensor *x, int nnorm, kiln_tensor *weight, kiln_tensor *bias, double eps);
/**
 * x [N, C, ...]. training: normalize with batch statistics and, when running_mean /
 * running_var are given, update them in place with momentum (PyTorch's convention,
 * unbiased variance for the running estimate). Not training: use the running stats.
 * Batch statistics (training, or no running stats given) need more than 1 value per
 * channel: an empty batch, one item of [N, C], or an empty spatial dim gives NULL with
 * the shape in the message, and the running stats are left untouched. f16 and bf16
 * inputs are normalized in f32 (statistics, running-stat update, and the gradient), as
 * PyTorch does, and the result is rounded back to the input's dtype.
 */
kiln_tensor *kiln_batch_norm(kiln_tensor *x, kiln_tensor *running_mean, kiln_tensor *running_var,
                             kiln_tensor *weight, kiln_tensor *bias, bool training, double momentum,
                             double eps);
/** x [N, C, ...] normalized over each group of C / groups channels; weight and bias [C]
 *  may be NULL. f16 and bf16 inputs are normalized in f32, as in batch_norm. */
kiln_tensor *kiln_group_norm(kiln_tensor *x, int64_t groups, kiln_tensor *weight, kiln_tensor *bias,
                             double eps);
/** Zero elements with probability p and scale the rest by 1/(1-p); identity when !training. */
kiln_tensor *kiln_dropout(kiln_tensor *x, double p, bool training, kiln_generator *gen);
/**
 * softmax(q kᵀ / sqrt(d) + mask) v. q [..., L, D], k [..., S, D], v [..., S, Dv].
 * mask: NULL, bool (true = keep) or float (added, cast to q's dtype first, so an f16
 * attention stays f16), broadcast to [..., L, S]. causal masks out positions j > i.
 * scale <= 0 means 1/sqrt(D).
 */
kiln_tensor *kiln_scaled_dot_product_attention(kiln_tensor *q, kiln_tensor *k, kiln_tensor *v,
                                               kiln_tensor *mask, bool causal, double scale);

KILN_API_END

#ifdef __cplusplus
}
#endif
#endif /* KILN_TENSOR_H */
