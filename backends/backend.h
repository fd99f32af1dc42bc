/*
 * backends/backend.h — the interface every kiln backend implements.
 *
 * The tensor front end (engine/) does all shape work: broadcasting, dtype promotion,
 * views, argument checks. By the time a call reaches a backend every operand is a
 * kiln_tdesc whose shape already matches what the primitive expects (broadcast
 * operands carry 0 strides, flipped ones negative strides), dtypes are the ones the
 * primitive needs, and the output is freshly allocated and contiguous unless stated
 * otherwise. Backends never see a NULL operand that is not marked optional and never
 * need to validate shapes; they do need to honour arbitrary strides on inputs.
 *
 * Device memory is opaque: a kiln_buffer is whatever the backend says it is, and the
 * front end does no pointer arithmetic on it (offsets travel in the descriptor).
 * A primitive returns 0, or a negative KILN_E* code after setting the thread's error
 * message (kiln__error_set in engine/error-impl.h).
 *
 * Queues. Work is submitted to a queue (a stream): every entry other than open,
 * open_spec, open_opts, close, caps and queue_open receives a queue context `q`, which
 * is what queue_open returned, or the device context itself for a backend without
 * queue_open (it then has one queue, and every engine queue of the device shares it).
 * Work on one queue runs in submission order; work on two queues is unordered unless an
 * event orders it (event_record on one, event_wait on the other). A thread that drives a
 * device on a queue of its own (kiln_queue_open + kiln_queue_use in kiln/tensor.h) is the
 * only one entering it; threads that opened none share the device's default queue, so a
 * backend whose queue keeps state beside its stream serializes each entry on it (a
 * per-queue lock: cuda-serial.inc, kvk_queue.lock). The engine keeps the rules below, so a
 * backend never has to order queues on its own:
 *  - a primitive, upload or copy may return before its work is done; buffer_download
 *    (which waits for the work queued before it on q, then reads), sync (waits for q),
 *    event_sync and a host_alloc'd staging read are the only calls that wait;
 *  - a storage is used on another queue than the one that made it only after the engine
 *    recorded an event on every queue that used it and made the new queue wait for it;
 *  - buffer_free(q, buf) is ordered on q: the backend may hand buf out again to work
 *    queued on q after the free, and to other queues once the work queued on q before
 *    the free has finished (record an event at free time, as a stream-ordered allocator
 *    does); the engine frees on a queue that has waited for every other user;
 *  - an error found while the work runs (a device-side index check, a kernel fault) is
 *    kept and returned, with the op's name, by the next sync or buffer_download on q.
 * A backend whose entries all finish before returning (caps.async false: ref, cpu) may
 * leave the queue and event entries NULL; the engine then treats every event as complete
 * at record. docs/architecture.md ("Backend interface") is the author's guide.
 *
 * A backend fills one kiln_backend_iface with designated initializers and exports one
 * registration function. Entries marked optional may be NULL; the front end then
 * composes the op from other primitives (the documented fallbacks) or fails with a
 * message naming the op, dtype and device. A required entry left NULL is reported the
 * same way, never called.
 */
#ifndef KILN_BACKEND_H
#define KILN_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Error codes (KILN_EINVAL, ...) are the public ones of kiln/tensor.h. */

/** A backend's allocation. Opaque to everyone but its backend. */
typedef struct kiln_buffer kiln_buffer;

/** One operand: a strided view of a buffer. Strides and offset are in elements. */
typedef struct kiln_tdesc {
    kiln_buffer *buf;
    int64_t offset;
    kiln_dtype dtype;
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    int64_t strides[KILN_MAX_DIMS];
} kiln_tdesc;

/* ----------------------------------------------------------------- op families */
/* Each enum has a name table in engine/ops-names.c guarded by a static assert on its
 * COUNT, so adding an op breaks the build until every table is updated. */

typedef enum kiln_unary_op {
    KILN_UNARY_NEG = 0,
    KILN_UNARY_ABS,
    KILN_UNARY_SIGN,
    KILN_UNARY_EXP,
    KILN_UNARY_LOG,
    KILN_UNARY_LOG1P,
    KILN_UNARY_EXPM1,
    KILN_UNARY_SQRT,
    KILN_UNARY_RSQRT,
    KILN_UNARY_SQUARE,
    KILN_UNARY_RECIPROCAL,
    KILN_UNARY_SIN,
    KILN_UNARY_COS,
    KILN_UNARY_TANH,
    KILN_UNARY_SIGMOID,
    KILN_UNARY_RELU,
    KILN_UNARY_LEAKY_RELU,  /* alpha = negative slope */
    KILN_UNARY_ELU,         /* alpha */
    KILN_UNARY_GELU,        /* erf form */
    KILN_UNARY_GELU_TANH,
    KILN_UNARY_SILU,
    KILN_UNARY_SOFTPLUS,    /* alpha = beta, beta = threshold */
    KILN_UNARY_ERF,
    KILN_UNARY_FLOOR,
    KILN_UNARY_CEIL,
    KILN_UNARY_ROUND,       /* half to even */
    KILN_UNARY_CLAMP,       /* alpha = lo, beta = hi */
    KILN_UNARY_POW_SCALAR,  /* alpha = exponent */
    KILN_UNARY_ADD_SCALAR,  /* alpha */
    KILN_UNARY_MUL_SCALAR,  /* alpha */
    KILN_UNARY_ISNAN,       /* out is bool */
    KILN_UNARY_ISINF,       /* out is bool */
    KILN_UNARY_LOGICAL_NOT, /* out is bool */
    KILN_UNARY_COUNT
} kiln_unary_op;

typedef enum kiln_binary_op {
    KILN_BINARY_ADD = 0,
    KILN_BINARY_SUB,
    KILN_BINARY_MUL,
    KILN_BINARY_DIV,
    KILN_BINARY_REMAINDER,
    KILN_BINARY_POW,
    KILN_BINARY_MAXIMUM,
    KILN_BINARY_MINIMUM,
    KILN_BINARY_EQ,          /* comparisons and logical ops: out is bool */
    KILN_BINARY_NE,
    KILN_BINARY_LT,
    KILN_BINARY_LE,
    KILN_BINARY_GT,
    KILN_BINARY_GE,
    KILN_BINARY_LOGICAL_AND,
    KILN_BINARY_LOGICAL_OR,
    KILN_BINARY_LOGICAL_XOR,
    KILN_BINARY_COUNT
} kiln_binary_op;

typedef enum kiln_reduce_op {
    KILN_REDUCE_SUM = 0,
    KILN_REDUCE_MEAN,
    KILN_REDUCE_PROD,
    KILN_REDUCE_MAX,
    KILN_REDUCE_MIN,
    KILN_REDUCE_VAR,        /* param = correction */
    KILN_REDUCE_STD,        /* param = correction */
    KILN_REDUCE_LOGSUMEXP,
    KILN_REDUCE_NORM,       /* param = p */
    KILN_REDUCE_ANY,        /* out is bool */
    KILN_REDUCE_ALL,        /* out is bool */
    KILN_REDUCE_COUNT
} kiln_reduce_op;

typedef enum kiln_rng_kind {
    KILN_RNG_UNIFORM = 0,   /* p0 = low, p1 = high */
    KILN_RNG_NORMAL,        /* p0 = mean, p1 = std */
    KILN_RNG_BERNOULLI,     /* p0 = p */
    KILN_RNG_INT,           /* [p0, p1): integers within +-2^53, so exact as doubles */
    KILN_RNG_COUNT
} kiln_rng_kind;

typedef enum kiln_pool_kind {
    KILN_POOL_MAX = 0,
    KILN_POOL_AVG,
    KILN_POOL_COUNT
} kiln_pool_kind;

/** Resolved convolution geometry: every field filled, nspatial in 1..3. */
typedef struct kiln_conv_params {
    int nspatial;
    int64_t stride[3];
    int64_t padding[3];
    int64_t dilation[3];
    int64_t groups;
} kiln_conv_params;

/** Resolved pooling geometry: every field filled, nspatial in 1..3. */
typedef struct kiln_pool_params {
    int nspatial;
    kiln_pool_kind kind;
    int64_t kernel[3];
    int64_t stride[3];
    int64_t padding[3];
    int64_t dilation[3];
    bool count_include_pad;
} kiln_pool_params;

/** The scalars of one fused Adam/AdamW step (torch.optim's _single_tensor_adam), per
 *  element, with g = -grad when maximize:
 *      decoupled: p *= param_scale             (AdamW: 1 - lr * weight_decay)
 *      else:      g += weight_decay * p        (Adam's L2 term; weight_decay may be 0)
 *      m += (1 - beta1) * (g - m);  v = beta2 * v + (1 - beta2) * g * g
 *      s = amsgrad ? (vmax = max(vmax, v)) : v
 *      p -= step_size * m / (sqrt(s) * inv_bc2_sqrt + eps)
 *  where step_size = lr / (1 - beta1^t) and inv_bc2_sqrt = 1 / sqrt(1 - beta2^t). */
typedef struct kiln_adam_params {
    double beta1, beta2, eps, weight_decay, param_scale, step_size, inv_bc2_sqrt;
    bool decoupled, amsgrad, maximize;
} kiln_adam_params;

/** The activation of a fused epilogue (kiln_epilogue). Each matches the engine's own op
 *  to the bit where the op is one pass (relu, leaky_relu, clamp, sigmoid) and composes
 *  in the same order where it is not (hard_sigmoid: clamp(x·alpha + beta, 0, 1) with a
 *  rounding after the multiply and after the add; hard_swish: x · hard_sigmoid(x) with
 *  alpha 1/6, beta 1/2). NaN propagates through every one. */
typedef enum kiln_epilogue_act {
    KILN_EPI_NONE = 0,
    KILN_EPI_RELU,
    KILN_EPI_LEAKY_RELU,    /* alpha = negative slope */
    KILN_EPI_CLAMP,         /* alpha = lo, beta = hi */
    KILN_EPI_HARD_SIGMOID,  /* alpha, beta */
    KILN_EPI_HARD_SWISH,
    KILN_EPI_SIGMOID,
    KILN_EPI_COUNT
} kiln_epilogue_act;

/** What a producer does to each output element before it stores it:
 *  out = act(out + bias[last index] + residual), any of the three optional. bias is
 *  contiguous with out's last dim as its length (the epilogue entry only; a convolution
 *  takes its per-channel bias separately); residual is contiguous with out's shape. Both
 *  have out's dtype. */
typedef struct kiln_epilogue {
    kiln_epilogue_act act;
    double alpha, beta;
    const kiln_tdesc *bias;
    const kiln_tdesc *residual;
} kiln_epilogue;

/** The cell of a fused recurrent layer (kiln_rnn_params). */
typedef enum kiln_rnn_cell {
    KILN_RNN_LSTM = 0,      /* gates i, o, f, c (ONNX order); peepholes optional */
    KILN_RNN_GRU,           /* gates z, r, h */
    KILN_RNN_CELL_COUNT
} kiln_rnn_cell;

/** One recurrent layer as ONNX defines LSTM and GRU, with the default activations
 *  (sigmoid for the gates, tanh elsewhere), resolved by the front end: directions 1 or 2
 *  (the second runs from the last step to the first), T >= 1 steps of B >= 1 rows of I
 *  inputs, H hidden units. seq_lens (host memory, B values in [0, T], optional) ends row
 *  b after seq_lens[b] steps: its later Y rows are zero and its final state is the one
 *  after its last step (a reverse direction starts at step seq_lens[b] - 1). clip > 0
 *  clamps every gate's pre-activation to [-clip, clip]. */
typedef struct kiln_rnn_params {
    kiln_rnn_cell cell;
    int ndir;
    bool reverse;              /* ndir 1: run from the last step to the first */
    bool linear_before_reset;  /* GRU: r multiplies (h·Rhᵀ + Rbh) rather than h */
    double clip;               /* 0: none */
    int64_t steps, batch, input, hidden; /* T, B, I, H */
    const int64_t *seq_lens;
} kiln_rnn_params;

/** The operands of a fused recurrent layer, every one f32 and contiguous, G = 4 (LSTM)
 *  or 3 (GRU), D = ndir: x [T, B, I], w [D, G·H, I], r [D, G·H, H], and optional (NULL)
 *  bias [D, 2·G·H] (Wb then Rb), h0 and c0 [D, B, H] (zeros when absent), peep [D, 3·H]
 *  (LSTM: i, o, f); outputs y [T, D, B, H], yh [D, B, H], yc [D, B, H] (LSTM only).
 *  packed (optional) is w and r as the backend's rnn_pack wrote them for the same cell,
 *  directions, input and hidden sizes. */
typedef struct kiln_rnn_operands {
    const kiln_tdesc *x, *w, *r, *bias, *h0, *c0, *peep;
    const kiln_tdesc *y, *yh, *yc;
    const kiln_tdesc *packed;
} kiln_rnn_operands;

/** The primitive entries, one per kiln_backend_iface op slot: what a capability query
 *  (supports) names and what the counting decorator counts. Names in engine/ops-names.c. */
typedef enum kiln_entry {
    KILN_ENTRY_FILL = 0,
    KILN_ENTRY_ARANGE,
    KILN_ENTRY_COPY,
    KILN_ENTRY_RNG,
    KILN_ENTRY_UNARY,
    KILN_ENTRY_BINARY,
    KILN_ENTRY_WHERE,
    KILN_ENTRY_REDUCE,
    KILN_ENTRY_ARG_REDUCE,
    KILN_ENTRY_CUMSUM,
    KILN_ENTRY_SORT,
    KILN_ENTRY_GATHER,
    KILN_ENTRY_SCATTER,
    KILN_ENTRY_INDEX_SELECT,
    KILN_ENTRY_INDEX_ADD,
    KILN_ENTRY_MATMUL,
    KILN_ENTRY_CONV,
    KILN_ENTRY_CONV_BACKWARD_INPUT,
    KILN_ENTRY_CONV_BACKWARD_WEIGHT,
    KILN_ENTRY_CONV_FUSED,
    KILN_ENTRY_CONV_PACK,
    KILN_ENTRY_EPILOGUE,
    KILN_ENTRY_POOL,
    KILN_ENTRY_POOL_BACKWARD,
    KILN_ENTRY_ADAPTIVE_AVG_POOL,
    KILN_ENTRY_ADAPTIVE_AVG_POOL_BACKWARD,
    KILN_ENTRY_INTERPOLATE,
    KILN_ENTRY_INTERPOLATE_BACKWARD,
    KILN_ENTRY_PAD,
    KILN_ENTRY_SOFTMAX,
    KILN_ENTRY_LAYER_NORM,
    KILN_ENTRY_ADAM_STEP,
    KILN_ENTRY_INDEX_CHECK,
    KILN_ENTRY_RNN,
    KILN_ENTRY_RNN_PACK,
    KILN_ENTRY_FUSED,
    KILN_ENTRY_COUNT
} kiln_entry;

/** One capability question: may the engine call `entry` with sub-op `op` (a
 *  kiln_unary_op, kiln_binary_op, kiln_reduce_op, kiln_rng_kind, kiln_pool_kind,
 *  kiln_interp_mode or kiln_pad_mode value; -1 for entries without one) on dtype `dtype`
 *  (the output's, or for index and reduction entries the data input's), with `params`
 *  (a kiln_conv_params or kiln_pool_params for those entries, else NULL)? */
typedef struct kiln_op_query {
    kiln_entry entry;
    int op;
    kiln_dtype dtype;
    const void *params;
} kiln_op_query;

/** Options for one device, as the engine resolved them: each key once, the spec's
 *  ?key=value pairs over the environment's defaults (docs/configuration.md). `source`
 *  says where a value came from ("KILN_CPU_THREADS" or "spec"), for messages. A backend
 *  consumes the keys it knows and marks them used; the engine refuses the open, naming
 *  the key, when one is left unused. */
#define KILN_DEVICE_OPTS_MAX 16
typedef struct kiln_device_opts {
    int n;
    struct {
        char key[32];
        char value[96];
        const char *source;
        bool used;
    } kv[KILN_DEVICE_OPTS_MAX];
} kiln_device_opts;

typedef struct kiln_backend_iface kiln_backend_iface;

/** A fused group of elementwise ops as one program (backends/fused-program.h). */
typedef struct kiln_fused_program kiln_fused_program;

/** The value of option key (marked used; *source says where it came from), or NULL. */
const char *kiln__device_opts_take(kiln_device_opts *o, const char *key, const char **source);
/** Option key as a whole number in [lo, hi] into *out: 1 when given, 0 when absent (out
 *  untouched), -1 with "<backend>: option <key> (from <source>) must be ..." otherwise. */
int kiln__device_opt_long(kiln_device_opts *o, const char *backend, const char *key, long lo, long hi, long *out);
/** Option key as the index of one of n choices, with the same returns. */
int kiln__device_opt_choice(kiln_device_opts *o, const char *backend, const char *key, const char *const *choices,
                            int n, int *out);
/** Parse "k=v&k=v" into o (later keys replace earlier); source names it in messages. */
int kiln__device_opts_parse(const char *text, const char *source, kiln_device_opts *o);
/** Add the environment's defaults for backend's options that o does not set. */
int kiln__device_opts_env(const char *backend, kiln_device_opts *o);
/** The environment's value for an option of backend (NULL: unset); *var names it. */
const char *kiln__option_env(const char *backend, const char *key, const char **var);
/** A decorator's inner device: open the backend that spec names (its own options in o,
 *  completed from the environment), returning its context and interface. Every key
 *  of o must be used by the inner backend (or taken by the decorator before). */
void *kiln__backend_open(const char *spec, kiln_device_opts *o, const kiln_backend_iface **be);

/** The message of an index_check violation, set as the error (returns KILN_EINVAL):
 *  "<op>: <noun> <v> is out of bounds for size <hi>" (lo 0), else "... out of range
 *  [lo, hi)": "gather: index 7 is out of bounds for size 3". */
int kiln__index_error(const char *op, const char *noun, int64_t v, int64_t lo, int64_t hi);

/** The entry's name ("matmul"), and whether interface be fills its slot (engine). */
const char *kiln__entry_name(kiln_entry e);
/** A unary or binary sub-op's name ("abs", "remainder"), for a backend's messages (engine). */
const char *kiln__unary_name(kiln_unary_op op);
const char *kiln__binary_name(kiln_binary_op op);
bool kiln__iface_has(const kiln_backend_iface *be, kiln_entry e);

/** Counts a decorator keeps (backends/counting): per entry, and the traffic. */
typedef struct kiln_backend_counters {
    uint64_t calls[KILN_ENTRY_COUNT];
    uint64_t uploads, upload_bytes;
    uint64_t downloads, download_bytes;   /* host reads: each one waits for the device */
    uint64_t syncs, peer_copies, peer_copy_bytes;
    uint64_t allocs, frees;
    uint64_t events_recorded, event_waits, event_syncs;
} kiln_backend_counters;

/** An event: one point in one queue's work. Opaque to everyone but its backend. */
typedef struct kiln_backend_event kiln_backend_event;

/** A recorded stretch of one queue's work that runs again as one launch (a CUDA graph).
 *  Opaque to everyone but its backend. */
typedef struct kiln_backend_graph kiln_backend_graph;

/** What a backend can do, for the router and the conformance suite. */
typedef struct kiln_backend_caps {
    bool dtype[KILN_DTYPE_COUNT];   /* dtypes it stores and computes */
    bool host_memory;               /* buffers are plain host memory (zero-copy download) */
    bool async;                     /* primitives may return before the work is done */
    /* Under the fusion decorator, a call whose largest operand has fewer elements than this
     * starts no group: it runs as it is (0: every call may fuse). For a backend where the
     * recording costs more than a small call saves (the cpu: its small operands sit in the
     * caches already, and the call costs under a microsecond). */
    int64_t fusion_min_elements;
    /* Its fused_run takes ROW_REDUCE instructions (backends/fused-program.h): without it,
     * the fusion layer ends a group at a reduction whose result a later call reads. */
    bool fused_row_reduce;
    /* Its matmul writes an out whose rows are whole (unit stride along them) but whose rows
     * and batches lie anywhere, none overlapping (a permutation of a contiguous layout), as
     * fast as a contiguous one: the fusion layer then folds a copy of a dead product into a
     * permuted layout (attention's head merging) into the matmul's out. */
    bool matmul_strided_out;
} kiln_backend_caps;

typedef struct kiln_backend_iface {
    const char *name;

    /* --- life cycle: ctx is what open returned. */
    void *(*open)(int index);               /* NULL + message when absent */
    /** Optional: open from the whole spec (remote://host:port/device), for backends whose
     *  devices are named by more than an index. engine/device.c calls it instead of open
     *  when set. NULL + message on failure. */
    void *(*open_spec)(const char *spec);
    /** Optional: open with options (kiln_device_opts: mark each key used). Called instead
     *  of open_spec and open when set; spec is the canonical spec without its options. A
     *  bad value is refused with a message naming the option, its source and the value. */
    void *(*open_opts)(const char *spec, int index, kiln_device_opts *opts);
    void (*close)(void *ctx);
    void (*caps)(void *ctx, kiln_backend_caps *out);

    /* --- queues and events (optional as a group: see the file comment). */
    /** A new queue of the device ctx; its context is what the work entries receive.
     *  NULL + message when the device has no more. */
    void *(*queue_open)(void *ctx);
    /** Called after sync(q) returned; q is not used again. */
    void (*queue_close)(void *q);
    /** Mark the current end of q's work. NULL + message on failure. */
    kiln_backend_event *(*event_record)(void *q);
    /** Work queued on q after this call runs after ev's work finished; the host does not
     *  wait. NULL entry: the device runs all its queues in one order (the remote session),
     *  so the order is already implied. */
    int (*event_wait)(void *q, kiln_backend_event *ev);
    /** The host waits until ev's work finished; reports the errors sync would. q is the
     *  queue ev was recorded on. */
    int (*event_sync)(void *q, kiln_backend_event *ev);
    /** 1 when ev's work finished, 0 while it runs, negative on a device error. */
    int (*event_query)(void *q, kiln_backend_event *ev);
    void (*event_free)(void *q, kiln_backend_event *ev);

    /** Optional: what the device supports beyond non-NULL entries and caps.dtype. NULL:
     *  every non-NULL entry takes every dtype caps.dtype lists, with any parameters. */
    bool (*supports)(void *q, const kiln_op_query *query);

    /* --- buffers (pooled inside the backend: size classes, reuse before malloc). Every
     *     entry from here on receives a queue context (see the file comment). */
    kiln_buffer *(*buffer_alloc)(void *ctx, size_t nbytes);
    /** Ordered on the queue: see "buffer_free(q, buf)" in the file comment. */
    void (*buffer_free)(void *ctx, kiln_buffer *buf);
    /** Copy n bytes of host memory src into dst, queued on q. The caller may reuse or free
     *  src as soon as this returns: the backend copies it (or stages it) before returning.
     *  The one exception is src inside memory that this device's host_alloc returned: the
     *  backend may read it until the work queued before the next event recorded on q has
     *  finished, so the caller keeps that memory unchanged until then (event_sync). */
    int (*buffer_upload)(void *ctx, kiln_buffer *dst, size_t dst_offset, const void *src, size_t n);
    /** Wait for the work queued on q before this call, then copy n bytes into host dst
     *  (the caller's, written before return). Reports errors kept from earlier work. */
    int (*buffer_download)(void *ctx, kiln_buffer *src, size_t src_offset, void *dst, size_t n);
    /** Optional: the host address of a host-memory buffer (zero-copy paths). */
    void *(*buffer_host_ptr)(void *ctx, kiln_buffer *buf);
    /** Wait for the work queued on q (this queue only), reporting a kept error. */
    int (*sync)(void *ctx);
    /** Optional: host memory the device reads and writes without an extra staging copy
     *  (pinned, page-locked), 64-byte aligned; NULL + message on failure. The engine
     *  stages uploads and cross-device copies through it. NULL entry: aligned_alloc. */
    void *(*host_alloc)(void *ctx, size_t nbytes);
    /** Frees what host_alloc returned (its work finished: the caller synced). */
    void (*host_free)(void *ctx, void *ptr);
    /** Optional: copy n bytes from src (a buffer of src_q's device, another device of the
     *  same backend) into dst, device to device, queued on q after the work queued on
     *  src_q so far (the backend orders the two queues itself). KILN_ENOTSUP without a
     *  message when the two devices cannot (no peer access): the engine then downloads
     *  into host_alloc memory and uploads. */
    int (*buffer_copy_peer)(void *ctx, kiln_buffer *dst, size_t dst_offset, void *src_q, kiln_buffer *src,
                            size_t src_offset, size_t n);
    /** Optional: this device's counters (a decorator's; see kiln_device_counters). */
    int (*counters)(void *ctx, kiln_backend_counters *out);

    /* --- data movement and creation */
    /** out[i] = value (cast to out's dtype). */
    int (*fill)(void *ctx, const kiln_tdesc *out, double value);
    /** out[i] = start + i * step over out's flat contiguous index. */
    int (*arange)(void *ctx, const kiln_tdesc *out, double start, double step);
    /** Strided copy with dtype conversion; in and out have the same shape. out may be a
     *  non-contiguous view (slice_assign, cat), so honour out's strides too. */
    int (*copy)(void *ctx, const kiln_tdesc *out, const kiln_tdesc *in);
    /** Philox draw into contiguous out; element i uses counter offset + i. KILN_RNG_INT's
     *  bounds are integers within +-2^53 (kiln_rand_int refuses wider ones): a backend
     *  refuses others with KILN_EINVAL rather than draw from a range nobody asked for. */
    int (*rng)(void *ctx, kiln_rng_kind kind, const kiln_tdesc *out, uint64_t seed, uint64_t offset,
               double p0, double p1);

    /* --- elementwise */
    int (*unary)(void *ctx, kiln_unary_op op, const kiln_tdesc *out, const kiln_tdesc *in,
                 double alpha, double beta);
    /** a and b have out's shape (broadcast by strides) and the same dtype. out may be
     *  the very same view as a or b (same buffer, offset, strides and dtype: an in-place
     *  update, which the ONNX executor uses); no other overlap is allowed. */
    int (*binary)(void *ctx, kiln_binary_op op, const kiln_tdesc *out, const kiln_tdesc *a,
                  const kiln_tdesc *b);
    /** out = cond ? a : b; cond is bool, a and b share out's dtype; all out's shape. */
    int (*where)(void *ctx, const kiln_tdesc *out, const kiln_tdesc *cond, const kiln_tdesc *a,
                 const kiln_tdesc *b);

    /* --- reductions. out has in's rank with size 1 on each reduced dim (keepdim);
     *     reduce_mask bit d set means dim d is reduced. */
    int (*reduce)(void *ctx, kiln_reduce_op op, const kiln_tdesc *out, const kiln_tdesc *in,
                  uint32_t reduce_mask, double param);
    /** i64 out (keepdim shape) holding the index of the first max (or min) along dim. */
    int (*arg_reduce)(void *ctx, bool is_max, const kiln_tdesc *out, const kiln_tdesc *in, int dim);
    int (*cumsum)(void *ctx, const kiln_tdesc *out, const kiln_tdesc *in, int dim);
    /** Stable sort along dim; values and indices (i64) have in's shape. */
    int (*sort)(void *ctx, const kiln_tdesc *values, const kiln_tdesc *indices, const kiln_tdesc *in,
                int dim, bool descending);

    /** Optional: check on the device that every value of the integer tensor index lies
     *  in [lo, hi). An async backend keeps a violation and reports it from the next sync
     *  or buffer_download on q (a device-side assert); one that finishes at submission
     *  may return it at once. The message is kiln__index_error's; op and noun are static
     *  strings ("gather", "index"), so an async backend may keep the pointers. NULL: the engine reads the index's extremes to the host instead
     *  (one wait per indexing op). */
    int (*index_check)(void *ctx, const kiln_tdesc *index, int64_t lo, int64_t hi, const char *op,
                       const char *noun);

    /* --- indexing. index is i64; index_check has run on it (so it may still be out of
     *     range on an async device: a kernel must not read or write outside its buffers,
     *     whatever the index holds: clamp or skip, the error comes from the check). */
    int (*gather)(void *ctx, const kiln_tdesc *out, const kiln_tdesc *in, int dim,
                  const kiln_tdesc *index);
    /** out already holds a copy of the destination; write (or add) src at index. */
    int (*scatter)(void *ctx, const kiln_tdesc *out, int dim, const kiln_tdesc *index,
                   const kiln_tdesc *src, bool accumulate);
    int (*index_select)(void *ctx, const kiln_tdesc *out, const kiln_tdesc *in, int dim,
                        const kiln_tdesc *index);
    /** out[..., idx[i], ...] += src[..., i, ...] along dim (backward of index_select). */
    int (*index_add)(void *ctx, const kiln_tdesc *out, int dim, const kiln_tdesc *index,
                     const kiln_tdesc *src);

    /* --- linear algebra. a [B..., M, K], b [B..., K, N], out [B..., M, N] contiguous;
     *     batch dims already broadcast to out's. */
    int (*matmul)(void *ctx, const kiln_tdesc *out, const kiln_tdesc *a, const kiln_tdesc *b);

    /* --- convolution. x [N, C, S...], w [O, C/g, K...], bias [O] (optional), out [N, O, S'...]. */
    int (*conv)(void *ctx, const kiln_conv_params *p, const kiln_tdesc *out, const kiln_tdesc *x,
                const kiln_tdesc *w, const kiln_tdesc *bias);
    /** grad_x [N, C, S...] = conv's input gradient; also the forward of transposed conv. */
    int (*conv_backward_input)(void *ctx, const kiln_conv_params *p, const kiln_tdesc *grad_x,
                               const kiln_tdesc *grad_out, const kiln_tdesc *w);
    /** grad_w [O, C/g, K...] = conv's weight gradient. */
    int (*conv_backward_weight)(void *ctx, const kiln_conv_params *p, const kiln_tdesc *grad_w,
                                const kiln_tdesc *x, const kiln_tdesc *grad_out);

    /** Optional: conv followed by ep (its residual only; ep->bias unused), applied where
     *  each output element is produced so the result is written once. The front end
     *  calls it for f32 outputs with nothing requiring grad; NULL makes it run conv and
     *  then the epilogue entry (or composed ops). */
    int (*conv_fused)(void *ctx, const kiln_conv_params *p, const kiln_tdesc *out, const kiln_tdesc *x,
                      const kiln_tdesc *w, const kiln_tdesc *wpacked, const kiln_tdesc *bias,
                      const kiln_epilogue *ep);
    /** Optional: how many f32 elements w's pre-packed form takes, 0 when the backend has
     *  none for it or would not use it for a convolution of geometry p over inputs shaped
     *  like x; and writing it into packed (contiguous, that long). A graph executor packs
     *  a constant weight once and hands the copy to conv_fused as wpacked (optional
     *  there: a backend may pick a path that reads w instead). */
    int64_t (*conv_pack_size)(void *ctx, const kiln_conv_params *p, const kiln_tdesc *x, const kiln_tdesc *w);
    int (*conv_pack)(void *ctx, const kiln_tdesc *packed, const kiln_tdesc *w);
    /** Optional: out = act(out + bias + residual) in place; out contiguous. */
    int (*epilogue)(void *ctx, const kiln_tdesc *out, const kiln_epilogue *ep);
    /** Optional: matmul's product followed by ep (bias over out's last dim, a residual of
     *  out's shape, the activation), applied as the product is stored. The front end calls
     *  it for f32 operands with nothing requiring grad, a residual that is not out; it
     *  returns KILN_ENOTSUP without a message for an epilogue it does not fuse (an
     *  activation it lacks), and the front end then runs matmul and the epilogue entry.
     *  The additions may round in another order than matmul then epilogue (a GEMM adds
     *  the residual as its C operand before the bias): a last-bit difference. */
    int (*matmul_fused)(void *ctx, const kiln_tdesc *out, const kiln_tdesc *a, const kiln_tdesc *b,
                        const kiln_epilogue *ep);

    /* --- pooling. indices (i64, out's shape) optional, max only: flat index within the
     *     input plane, as PyTorch returns. */
    int (*pool)(void *ctx, const kiln_pool_params *p, const kiln_tdesc *out, const kiln_tdesc *indices,
                const kiln_tdesc *x);
    /** grad_x is zero-filled by the caller; max uses indices, avg spreads evenly. */
    int (*pool_backward)(void *ctx, const kiln_pool_params *p, const kiln_tdesc *grad_x,
                         const kiln_tdesc *grad_out, const kiln_tdesc *indices);
    /** Adaptive average pooling over the last nspatial dims of x into out's sizes. */
    int (*adaptive_avg_pool)(void *ctx, int nspatial, const kiln_tdesc *out, const kiln_tdesc *x);
    int (*adaptive_avg_pool_backward)(void *ctx, int nspatial, const kiln_tdesc *grad_x,
                                      const kiln_tdesc *grad_out);
    int (*interpolate)(void *ctx, kiln_interp_mode mode, bool align_corners, const kiln_tdesc *out,
                       const kiln_tdesc *x);
    int (*interpolate_backward)(void *ctx, kiln_interp_mode mode, bool align_corners,
                                const kiln_tdesc *grad_x, const kiln_tdesc *grad_out);
    /** Constant / reflect / replicate padding; pads[2*d], pads[2*d+1] = lo, hi of dim d. */
    int (*pad)(void *ctx, kiln_pad_mode mode, const kiln_tdesc *out, const kiln_tdesc *in,
               const int64_t *pads, double value);

    /* --- fused normalizations (optional: the front end composes them when NULL). */
    /** Softmax or log-softmax along dim. */
    int (*softmax)(void *ctx, bool log, const kiln_tdesc *out, const kiln_tdesc *in, int dim);
    /** Normalize over the trailing `inner` elements of each row; weight/bias optional
     *  (length inner); mean and rstd (f32/f64, one per row) optional outputs. */
    int (*layer_norm)(void *ctx, const kiln_tdesc *out, const kiln_tdesc *mean, const kiln_tdesc *rstd,
                      const kiln_tdesc *x, const kiln_tdesc *weight, const kiln_tdesc *bias,
                      int64_t inner, double eps);

    /* --- zero-copy (optional, host-memory backends only). */
    /** A buffer over memory the caller owns (a mapped file, say), used in place.
     *  buffer_free on it calls release(release_ud) instead of freeing or pooling the
     *  memory. ptr is aligned to 64 bytes and writable (copy-on-write mappings are). */
    kiln_buffer *(*buffer_wrap_host)(void *ctx, void *ptr, size_t nbytes, void (*release)(void *),
                                     void *release_ud);
    /** Optional, beside buffer_wrap_host: whether buf came from it (its memory is the
     *  caller's). A decorator that defers frees (backends/fused) asks this instead of
     *  keeping a set of the buffers it saw wrapped. */
    bool (*buffer_is_wrapped)(void *ctx, const kiln_buffer *buf);
    /** Optional, beside buffer_wrap_host: the same wrap, over memory its caller may read and
     *  write between any two calls (kiln_from_host_memory). A backend that defers calls
     *  (backends/fused) runs each call reading or writing such a buffer before the call
     *  returns, so the caller's later writes never reach an earlier call and each call's
     *  result is in the memory when it returns, as on a backend that runs calls at once.
     *  NULL: the engine wraps with buffer_wrap_host. */
    kiln_buffer *(*buffer_lend_host)(void *ctx, void *ptr, size_t nbytes, void (*release)(void *),
                                     void *release_ud);
    /** Hand buffers the backend keeps for reuse (freed by the engine, not in use) back to
     *  the system, largest first, until at least `bytes` are released or none are left;
     *  returns the bytes released. For a caller that has taken a workload's memory over
     *  itself (the ONNX executor's activation arena), so that the same memory is not
     *  held twice. Optional. */
    size_t (*buffer_trim)(void *ctx, size_t bytes);
    /** Optional, for a decorator that defers frees (backends/fused): give buf's memory back
     *  to the backend now, keeping buf a valid handle for buffer_reattach or buffer_free
     *  later. The caller promises that nothing reads or writes buf until it is reattached
     *  (a fused group's dead intermediate, freed while the group is pending: the fused
     *  kernel never stores it, so its memory can serve the next allocation at once).
     *  Returns whether the memory went; false keeps buf as it was (wrapped memory, an
     *  address handed out by buffer_host_ptr). */
    bool (*buffer_detach)(void *ctx, kiln_buffer *buf);
    /** Beside buffer_detach (required with it): memory for a detached buf again, its
     *  contents undefined (the decorator replays the group after all). 0, or negative
     *  with an error set. */
    int (*buffer_reattach)(void *ctx, kiln_buffer *buf);

    /* --- fused optimizer updates (optional: the front end composes them from the
     * elementwise primitives when NULL, as it does for the remote backend). */
    /** One Adam/AdamW step in place, elementwise over contiguous tensors of one float
     *  dtype and shape: param, grad (read only), exp_avg, exp_avg_sq, and max_exp_avg_sq
     *  when p->amsgrad (else NULL). See kiln_adam_params for the arithmetic. */
    int (*adam_step)(void *ctx, const kiln_adam_params *p, const kiln_tdesc *param,
                     const kiln_tdesc *grad, const kiln_tdesc *exp_avg, const kiln_tdesc *exp_avg_sq,
                     const kiln_tdesc *max_exp_avg_sq);

    /** Optional: one LSTM/GRU layer (kiln_rnn_params, kiln_rnn_operands) in one call, for
     *  inference: the front end calls it when nothing requires grad and composes the layer
     *  from matmuls and elementwise ops otherwise, or when NULL. p->seq_lens is host memory
     *  the caller owns only during the call: an async backend copies it before returning. */
    int (*rnn)(void *ctx, const kiln_rnn_params *p, const kiln_rnn_operands *o);
    /** Optional: how many f32 elements the pre-packed form of a layer's w and r takes (it
     *  depends on p's cell, ndir, input and hidden only), 0 when the backend has none; and
     *  writing it into packed (contiguous, that long). A graph executor packs constant
     *  weights once and hands the copy to rnn as o->packed (optional there: a backend may
     *  pick a path that reads w and r instead). */
    int64_t (*rnn_pack_size)(void *ctx, const kiln_rnn_params *p);
    int (*rnn_pack)(void *ctx, const kiln_rnn_params *p, const kiln_tdesc *packed, const kiln_tdesc *w,
                    const kiln_tdesc *r);

    /* --- device state (optional; ctx is the device context, as for counters). */
    /** The allocator's figures (kiln_device_memory_get). */
    int (*memory)(void *ctx, kiln_device_memory *out);
    /** Optional, beside memory: peak_in_use_bytes starts again from in_use_bytes now
     *  (kiln_device_memory_reset_peak); 0, or KILN_ENOTSUP with a message (a decorator
     *  over a backend that keeps no figures). */
    int (*memory_reset_peak)(void *ctx);
    /** Why the device stopped working, or NULL while it works (kiln_device_lost). */
    const char *(*lost)(void *ctx);

    /** Optional: the code generator hook of the fusion layer (backends/fused): run one
     *  fused program (backends/fused-program.h) as one kernel. KILN_ENOTSUP without a
     *  message when the backend cannot run this program (a dtype or op it does not
     *  generate); the fusion layer then replays the group's ops one by one. */
    int (*fused_run)(void *ctx, const kiln_fused_program *prog);

    /* --- graphs (optional as a group: all four or none; docs/architecture.md "Graphs").
     *     A graph executor records one run of a planned model on a queue and launches the
     *     recording again for later runs of the same shapes, so a small model is not
     *     bound by the cost of submitting each op. */
    /** Record q's work from now on instead of running it. While q records, an entry on q
     *  that cannot be recorded (anything that waits: buffer_download, sync, event_sync,
     *  event_query; an ordering between queues) fails with KILN_ENOTSUP and a message
     *  saying so, and the recording is broken. buffer_upload records the bytes src holds
     *  at record time: every launch uploads those same bytes. Buffers allocated on q while it records belong to the graph:
     *  freed, they are reused only by the same recording, and they stay reserved for the
     *  graph until graph_free (a launch writes them again); one still held when the graph
     *  is freed returns to the backend's pool when it is freed. Returns 0, or a negative
     *  code with a message when q cannot record now (it already records). */
    int (*capture_begin)(void *ctx);
    /** Optional, for decorators that fill the four entries whatever their inner device
     *  does: whether this device (ctx: the device context) records graphs. NULL: the four
     *  entries being there says it does. */
    bool (*graphs)(void *ctx);
    /** Stop recording on q (always: q runs its work again afterwards). The graph, or NULL
     *  with a message naming what broke the recording; nothing recorded has run either
     *  way, so the caller runs (or launches) the work itself. */
    kiln_backend_graph *(*capture_end)(void *ctx);
    /** Queue one run of g on q, which must be the queue that recorded it (KILN_ENOTSUP
     *  with a message otherwise). The run reads and writes the buffers the recording
     *  used, at the same addresses: the caller puts new inputs into them first. */
    int (*graph_launch)(void *ctx, kiln_backend_graph *g);
    /** Frees g after its queued launches (q is the queue that recorded it; the backend
     *  orders the release itself) and hands its kept buffers back to the pool. */
    void (*graph_free)(void *ctx, kiln_backend_graph *g);

    /* --- devices (optional) */
    /** The physical devices this backend finds, for kiln_device_list: up to max into out;
     *  returns how many there are (0 when its driver is missing), or -1 with a message. */
    int (*list)(kiln_device_info *out, int max);
} kiln_backend_iface;


/** Registration: each backend exports one of these, listed in engine/device.c. */
const kiln_backend_iface *kiln_backend_ref(void);
const kiln_backend_iface *kiln_backend_cpu(void);
const kiln_backend_iface *kiln_backend_remote(void);
const kiln_backend_iface *kiln_backend_counting(void);
const kiln_backend_iface *kiln_backend_fused(void);

/** An open device's backend, the context work for it is submitted with on the calling
 *  thread (its current queue), and its capabilities, for libkiln code outside the engine
 *  that drives a device through this interface itself (backends/remote/remote-exec.c). */
const kiln_backend_iface *kiln__device_iface(const kiln_device *dev);
void *kiln__device_ctx(const kiln_device *dev);
const kiln_backend_caps *kiln__device_caps(const kiln_device *dev);

#ifdef __cplusplus
}
#endif
#endif /* KILN_BACKEND_H */
