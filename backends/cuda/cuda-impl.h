/*
 * backends/cuda/cuda-impl.h — what the C files of the cuda backend share.
 *
 * A device (kiln_cuda_device) owns the caching allocator, the cuBLASLt handle, the
 * convolution algorithm cache and the device-lost state. A queue (kiln_cuda_queue) is one
 * CUDA stream with its own pinned staging chunks for uploads, its cuBLASLt/cuDNN
 * workspace, its cuDNN handle (cuDNN handles are not shared between threads) and the
 * slots where asynchronous index checks park violations. Every work entry receives a
 * queue: the engine opens the default queue through queue_open as well.
 *
 * Errors: every CUDA, cuBLAS and cuDNN status is checked where it is returned and turned
 * into a kiln error naming the op and the device (kiln__cuda_fail). An error that leaves
 * the CUDA context unusable (an illegal address, a kernel fault, a lost device: "sticky"
 * errors) marks the device lost; from then on every entry fails at once with the
 * original cause, and kiln__cuda_device_lost reports it for health checks.
 *
 * Built with KILN_CUDA_HIP, the same files drive an AMD GPU through HIP
 * (vendor-hip-host.h; docs/cuda.md "HIP"): the names below keep their CUDA spelling.
 */
#ifndef KILN_CUDA_IMPL_H
#define KILN_CUDA_IMPL_H

#if KILN_CUDA_HIP
#include "vendor-hip-host.h" /* the HIP runtime under the CUDA names */
#else
#include <cuda_runtime.h>
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "cuda-alloc.h"
#include "cuda-kernels.h"
#include "error-impl.h"

/** Pinned chunks per queue for staging uploads of pageable memory, and their size. */
#define KILN_CUDA_STAGES 4
#define KILN_CUDA_STAGE_BYTES ((size_t)8 << 20)
/** Index checks that may be parked on a queue between two syncs. */
#define KILN_CUDA_CHECK_SLOTS 64
/** The workspace each queue gives cuBLASLt and cuDNN: large enough for cuDNN's fastest
 *  algorithms on batch-64 ResNet-sized convolutions, made once per queue. */
#define KILN_CUDA_WORKSPACE_BYTES ((size_t)128 << 20)

struct kiln_buffer {
    kiln_cuda_block *blk;
    size_t nbytes;
};

struct kiln_backend_event {
    cudaEvent_t ev;
};

typedef struct kiln__cuda_conv_cache kiln__cuda_conv_cache;
typedef struct kiln__cuda_profile kiln__cuda_profile;
typedef struct kiln__cuda_lt_cache kiln__cuda_lt_cache;
typedef struct kiln__cuda_fused_cache kiln__cuda_fused_cache;
typedef struct kiln__cuda_ep_ways kiln__cuda_ep_ways;

/** How a product with an epilogue runs (cuda-blas.c): cuBLASLt's epilogue, or the plain
 *  product then the epilogue kernel. */
enum {
    KILN_CUDA_EP_TIMED = 0,
    KILN_CUDA_EP_FUSED = 1,
    KILN_CUDA_EP_SEPARATE = 2
};

typedef struct kiln_cuda_device {
    int index;
    char name[24]; /* "cuda:0", for messages */
    char gpu[256]; /* the GPU's own name */
    int cc_major, cc_minor;
    char arch[64]; /* HIP: the GPU's gfx architecture (gcnArchName), the target of generated kernels */
    size_t total_mem;
    kiln_cuda_alloc alloc;
    bool tf32;          /* option tf32=on: f32 matmul and convolution may use TF32 tensor cores */
    bool profile;       /* option profile=on: each queue sums its GPU time by entry (cuda-profile.c) */
    size_t conv_search_bytes; /* option conv_workspace_mb: scratch cuDNN's algorithm search may use */
    void *blas_lt;      /* cublasLtHandle_t */
    char blas_tune_dev[128]; /* the device as the autotune file names timed matmul choices */
    pthread_mutex_t mu;      /* guards lost_why, conv_cache, fused_cache, lt_cache, ep_ways */
    atomic_bool lost;
    char lost_why[256];
    kiln__cuda_conv_cache *conv_cache;
    kiln__cuda_lt_cache *lt_cache;       /* cuBLASLt's chosen algorithms by geometry (cuda-blas.c) */
    kiln__cuda_ep_ways *ep_ways;         /* how each timed product with a bias runs (cuda-blas.c) */
    /* tests: KILN_CUDA_EP_TIMED (0) times the two ways of a large product with an epilogue,
     * KILN_CUDA_EP_FUSED or KILN_CUDA_EP_SEPARATE takes that one */
    int ep_way_forced;
    kiln__cuda_fused_cache *fused_cache; /* generated kernels (cuda-fused.c) */
} kiln_cuda_device;

typedef struct kiln_cuda_check_slot {
    const char *op, *noun;
    int64_t lo, hi;
} kiln_cuda_check_slot;

/** Graphs launched on a queue whose index checks wait for the queue's next report. */
#define KILN_CUDA_PENDING_GRAPHS 8

/** A recorded graph (cuda-graph.c). Its index checks write to slots of its own (in its
 *  pool), which every launch fills again and the queue's next report reads. */
struct kiln_backend_graph {
    struct kiln_cuda_queue *q;
    cudaGraphExec_t exec;
    kiln_cuda_graph_pool pool;
    kiln_cuda_block *check_blk; /* KILN_CUDA_CHECK_SLOTS kcu_index_flag; NULL without checks */
    kiln_cuda_check_slot checks[KILN_CUDA_CHECK_SLOTS];
    int nchecks;
    bool pending; /* launched since the queue's last report */
    /* pinned copies of the host data uploaded while recording, which every launch copies
     * again: chunks of at least KILN_CUDA_GRAPH_HOST_CHUNK bytes, filled in order */
    void **host;
    int nhost, host_cap;
    size_t host_used, host_size; /* of the last chunk */
};
#define KILN_CUDA_GRAPH_HOST_CHUNK ((size_t)64 << 10)

typedef struct kiln_cuda_queue {
    kiln_cuda_device *dev;
    /* recursive; held by every entry that works on the queue (cuda-serial.inc): the engine's
     * default queue is shared by every thread that opened none of its own */
    pthread_mutex_t lock;
    cudaStream_t stream;
    const char *last_op; /* the op queued last: named when an asynchronous fault surfaces */
    /* upload staging: chunk i is free once stage_ev[i] completed */
    void *stage[KILN_CUDA_STAGES];
    cudaEvent_t stage_ev[KILN_CUDA_STAGES];
    bool stage_used[KILN_CUDA_STAGES];
    int stage_next;
    /* asynchronous index checks: device slots and what each one checked */
    kiln_cuda_block *check_blk; /* KILN_CUDA_CHECK_SLOTS kcu_index_flag, zeroed */
    kiln_cuda_check_slot checks[KILN_CUDA_CHECK_SLOTS];
    int nchecks;
    /* cuBLASLt / cuDNN scratch, taken from the allocator on first use */
    kiln_cuda_block *workspace;
    kiln_cuda_block *retired_ws; /* workspaces replaced by a larger one, chained by next */
    void *dnn; /* cudnnHandle_t, made on first convolution */
    /* graph recording (cuda-graph.c): the graph this stream records now, and what broke
     * the recording (empty while nothing did) */
    struct kiln_backend_graph *recording;
    char broken[200];
    /* graphs launched since the last report whose index checks are still to be read, and
     * a violation read from a graph freed before that report (reported by it) */
    struct kiln_backend_graph *pending[KILN_CUDA_PENDING_GRAPHS];
    int npending;
    bool kept;
    kiln_cuda_check_slot kept_check;
    int64_t kept_value;
    /* GPU time by entry (cuda-profile.c), made at the first timed entry with profile=on */
    kiln__cuda_profile *prof;
    bool prof_failed;
} kiln_cuda_queue;

/* cuda-profile.c: GPU time by entry with the device option profile=on. begin records the
 * start event of an entry and says whether it will be timed; end records its end event
 * (name: a string that outlives the queue); resolve sums the completed pairs (it waits for
 * the last); report resolves, prints the sums to stderr and frees the profile. */
bool kiln__cuda_prof_begin(kiln_cuda_queue *q);
void kiln__cuda_prof_end(kiln_cuda_queue *q, const char *name);
void kiln__cuda_prof_resolve(kiln_cuda_queue *q);
void kiln__cuda_prof_report(kiln_cuda_queue *q);

/** The registration function (engine/device.c refers to it weakly). */
const kiln_backend_iface *kiln_backend_cuda(void);

/* ------------------------------------------------------------------ errors */

/** Turns a failed CUDA status into the thread's error ("<op> on cuda:N: <name>: <text>"),
 *  marks the device lost when the status is sticky, and returns the kiln code. */
int kiln__cuda_fail(kiln_cuda_device *dev, int status, const char *op);
/** Status check for a queued op: 0, or kiln__cuda_fail's code. */
static inline int kiln__cuda_check(kiln_cuda_queue *q, int status, const char *op)
{
    q->last_op = op;
    return status == 0 ? 0 : kiln__cuda_fail(q->dev, status, op);
}
/** Nonzero (the error set, naming op and the original cause) when the device is lost. */
int kiln__cuda_lost_check(kiln_cuda_device *dev, const char *op);
/** Makes the device current for this thread and refuses work on a lost device. */
int kiln__cuda_enter(kiln_cuda_device *dev, const char *op);
/** Whether the device was lost, and why (NULL while it works). */
const char *kiln__cuda_device_lost(kiln_cuda_device *dev);

/* ------------------------------------------------------- graphs (cuda-graph.c) */

/** An entry that cannot be recorded in a graph, called while q records: breaks the
 *  recording (capture_end then says why) and returns KILN_ENOTSUP with a message. */
int kiln__cuda_refuse_recording(kiln_cuda_queue *q, const char *op, const char *why);
/** 0 while q does not record; kiln__cuda_refuse_recording's refusal while it does. */
static inline int kiln__cuda_not_recording(kiln_cuda_queue *q, const char *op, const char *why)
{
    return q->recording ? kiln__cuda_refuse_recording(q, op, why) : 0;
}
/** index_check while q records: the check goes to the graph's own slots. */
int kiln__cuda_graph_index_check(kiln_cuda_queue *q, const kiln_tdesc *index, int64_t lo, int64_t hi,
                                 const char *op, const char *noun);
/** buffer_upload while q records: src is copied into pinned memory the graph keeps, and
 *  the recorded copy (done again by every launch) reads from there. */
int kiln__cuda_graph_upload(kiln_cuda_queue *q, void *dst, const void *src, size_t n);
int kiln__cuda_capture_begin(void *q);
kiln_backend_graph *kiln__cuda_capture_end(void *q);
int kiln__cuda_graph_launch(void *q, kiln_backend_graph *g);
void kiln__cuda_graph_free(void *q, kiln_backend_graph *g);

/* ---------------------------------------------------------------- operands */

/** The device view of a descriptor (base pointer, offset, shape, strides). */
kcu_view kiln__cuda_view(const kiln_tdesc *t);
/** The view of an optional operand: a NULL base when t is NULL. */
kcu_view kiln__cuda_view_opt(const kiln_tdesc *t);
/** The device address of t's first element. */
void *kiln__cuda_ptr(const kiln_tdesc *t);
/** A queue's workspace of at least KILN_CUDA_WORKSPACE_BYTES, NULL + error on failure. */
void *kiln__cuda_workspace(kiln_cuda_queue *q, const char *op);
/** The queue's workspace grown to at least bytes (the block it replaces stays alive until the
 *  queue closes: recorded graphs may address it); NULL + error on failure. */
void *kiln__cuda_workspace_grow(kiln_cuda_queue *q, size_t bytes, const char *op);
/** Makes blk (taken from the allocator) the queue's workspace; the old one is kept as by
 *  kiln__cuda_workspace_grow. */
void kiln__cuda_workspace_adopt(kiln_cuda_queue *q, kiln_cuda_block *blk);
/** The size of the queue's workspace (0 before its first use). */
size_t kiln__cuda_workspace_size(const kiln_cuda_queue *q);

/* ----------------------------------------------------------- entry points */

int kiln__cuda_fill(void *q, const kiln_tdesc *out, double value);
int kiln__cuda_arange(void *q, const kiln_tdesc *out, double start, double step);
int kiln__cuda_copy(void *q, const kiln_tdesc *out, const kiln_tdesc *in);
int kiln__cuda_rng(void *q, kiln_rng_kind kind, const kiln_tdesc *out, uint64_t seed, uint64_t offset, double p0,
                   double p1);
int kiln__cuda_unary(void *q, kiln_unary_op op, const kiln_tdesc *out, const kiln_tdesc *in, double alpha,
                     double beta);
int kiln__cuda_binary(void *q, kiln_binary_op op, const kiln_tdesc *out, const kiln_tdesc *a, const kiln_tdesc *b);
int kiln__cuda_where(void *q, const kiln_tdesc *out, const kiln_tdesc *cond, const kiln_tdesc *a,
                     const kiln_tdesc *b);
int kiln__cuda_reduce(void *q, kiln_reduce_op op, const kiln_tdesc *out, const kiln_tdesc *in, uint32_t mask,
                      double param);
int kiln__cuda_arg_reduce(void *q, bool is_max, const kiln_tdesc *out, const kiln_tdesc *in, int dim);
int kiln__cuda_cumsum(void *q, const kiln_tdesc *out, const kiln_tdesc *in, int dim);
int kiln__cuda_sort(void *q, const kiln_tdesc *values, const kiln_tdesc *indices, const kiln_tdesc *in, int dim,
                    bool descending);
int kiln__cuda_index_check(void *q, const kiln_tdesc *index, int64_t lo, int64_t hi, const char *op,
                           const char *noun);
int kiln__cuda_gather(void *q, const kiln_tdesc *out, const kiln_tdesc *in, int dim, const kiln_tdesc *index);
int kiln__cuda_scatter(void *q, const kiln_tdesc *out, int dim, const kiln_tdesc *index, const kiln_tdesc *src,
                       bool accumulate);
int kiln__cuda_index_select(void *q, const kiln_tdesc *out, const kiln_tdesc *in, int dim,
                            const kiln_tdesc *index);
int kiln__cuda_index_add(void *q, const kiln_tdesc *out, int dim, const kiln_tdesc *index, const kiln_tdesc *src);
int kiln__cuda_pad(void *q, kiln_pad_mode mode, const kiln_tdesc *out, const kiln_tdesc *in, const int64_t *pads,
                   double value);
int kiln__cuda_softmax(void *q, bool log, const kiln_tdesc *out, const kiln_tdesc *in, int dim);
int kiln__cuda_layer_norm(void *q, const kiln_tdesc *out, const kiln_tdesc *mean, const kiln_tdesc *rstd,
                          const kiln_tdesc *x, const kiln_tdesc *weight, const kiln_tdesc *bias, int64_t inner,
                          double eps);
int kiln__cuda_epilogue(void *q, const kiln_tdesc *out, const kiln_epilogue *ep);
int kiln__cuda_adam_step(void *q, const kiln_adam_params *p, const kiln_tdesc *param, const kiln_tdesc *grad,
                         const kiln_tdesc *exp_avg, const kiln_tdesc *exp_avg_sq,
                         const kiln_tdesc *max_exp_avg_sq);
int kiln__cuda_pool(void *q, const kiln_pool_params *p, const kiln_tdesc *out, const kiln_tdesc *indices,
                    const kiln_tdesc *x);
int kiln__cuda_pool_backward(void *q, const kiln_pool_params *p, const kiln_tdesc *grad_x,
                             const kiln_tdesc *grad_out, const kiln_tdesc *indices);
int kiln__cuda_adaptive_avg_pool(void *q, int nspatial, const kiln_tdesc *out, const kiln_tdesc *x);
int kiln__cuda_adaptive_avg_pool_backward(void *q, int nspatial, const kiln_tdesc *grad_x,
                                          const kiln_tdesc *grad_out);
int kiln__cuda_interpolate(void *q, kiln_interp_mode mode, bool align_corners, const kiln_tdesc *out,
                           const kiln_tdesc *x);
int kiln__cuda_interpolate_backward(void *q, kiln_interp_mode mode, bool align_corners, const kiln_tdesc *grad_x,
                                    const kiln_tdesc *grad_out);
/** Reports (and clears) the first violation parked by index checks on q; waits for q. */
int kiln__cuda_checks_report(kiln_cuda_queue *q);

/* cuda-blas.c */
int kiln__cuda_matmul(void *q, const kiln_tdesc *out, const kiln_tdesc *a, const kiln_tdesc *b);
int kiln__cuda_matmul_fused(void *q, const kiln_tdesc *out, const kiln_tdesc *a, const kiln_tdesc *b,
                            const kiln_epilogue *ep);
int kiln__cuda_blas_init(kiln_cuda_device *dev);
void kiln__cuda_blas_fini(kiln_cuda_device *dev);

/* cuda-conv-operands.c: what cuda-dnn.c and hip-miopen.c share, and cuda-blas.c's operand copies. */
/** Packed copies of a call's strided operands (a convolution's, a matmul's), made on q's stream. */
typedef struct kiln__cuda_operands {
    kiln_cuda_queue *q;
    const char *op; /* for messages */
    kiln_cuda_block *scratch[3];
    struct kiln_buffer holders[3];
    kiln_tdesc copies[3];
    int n;
} kiln__cuda_operands;
/** Whether t is packed in row-major order (size-1 dims aside). */
bool kiln__cuda_packed(const kiln_tdesc *t);
/** t itself when packed, else a packed copy (queued on c->q's stream) kept until
 *  kiln__cuda_operands_release. 0, or a negative code with a message. */
int kiln__cuda_operand_packed(kiln__cuda_operands *c, const kiln_tdesc *t, const kiln_tdesc **out);
/** A packed copy of t in dtype (converted as kcu_copy converts; with copy false its contents
 *  are left unset, for an output), kept until kiln__cuda_operands_release. */
int kiln__cuda_operand_as(kiln__cuda_operands *c, const kiln_tdesc *t, kiln_dtype dtype, bool copy,
                          const kiln_tdesc **out);
void kiln__cuda_operands_release(kiln__cuda_operands *c);
/** y += bias per output channel (dim 1), as its own launch. */
int kiln__cuda_conv_add_bias(kiln_cuda_queue *q, const kiln_tdesc *y, const kiln_tdesc *bias, const char *op);
/** The conv_fused entry (backend.h): the convolution, then bias, residual and activation in
 *  one pass over the output (f32). */
int kiln__cuda_conv_fused(void *q, const kiln_conv_params *p, const kiln_tdesc *out, const kiln_tdesc *x,
                          const kiln_tdesc *w, const kiln_tdesc *wpacked, const kiln_tdesc *bias,
                          const kiln_epilogue *ep);

/* cuda-dnn.c (cuDNN), cuda-dnn-absent.c (neither), hip-miopen.c (a HIP build's MIOpen) */
int kiln__cuda_conv(void *q, const kiln_conv_params *p, const kiln_tdesc *out, const kiln_tdesc *x,
                    const kiln_tdesc *w, const kiln_tdesc *bias);
int kiln__cuda_conv_backward_input(void *q, const kiln_conv_params *p, const kiln_tdesc *grad_x,
                                   const kiln_tdesc *grad_out, const kiln_tdesc *w);
int kiln__cuda_conv_backward_weight(void *q, const kiln_conv_params *p, const kiln_tdesc *grad_w,
                                    const kiln_tdesc *x, const kiln_tdesc *grad_out);
bool kiln__cuda_conv_supports(const kiln_conv_params *p, kiln_dtype dt);
void kiln__cuda_dnn_queue_fini(kiln_cuda_queue *q);
void kiln__cuda_dnn_device_fini(kiln_cuda_device *dev);

#endif /* KILN_CUDA_IMPL_H */
