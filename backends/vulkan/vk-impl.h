/*
 * backends/vulkan/vk-impl.h — what the files of the Vulkan backend share: the device, its
 * queues, buffers, and the one way a kernel is launched (kvk_dispatch).
 *
 * Adding a kernel takes three steps:
 *
 *   1. shaders/NAME.comp, a GLSL compute shader that starts with
 *          #version 450
 *          #include "common.glsl"
 *      and declares its parameter block at binding 0 and its operands at 1..n with the
 *      macros of common.glsl (KVK_PARAMS, KVK_BUF_RO / KVK_BUF_WO / KVK_BUF_RW). Its dtypes
 *      come from the variant it is compiled as: variant "f32_i64" is built with
 *      -DKVK_DT0=f32 -DKVK_DT1=i64, and slot k's storage type, compute type, load and store
 *      are Sk/Ck/LDk/STk, FROMFk/FROMLk convert from float/integer values and TOLk widens an
 *      integer to int64 (common.glsl). For #if the build also defines KVK_Fk (1: slot k is a
 *      float dtype), KVK_DTk_IS_BOOL, and KVK_DOUBLE when any slot is f64 (then the double
 *      math of math-double.glsl, kd_exp, kd_log ..., is there too; a shader may define
 *      KVK_DOUBLE itself for a variant that computes in double, as reduce_d.comp does, and
 *      must then only be used where the device has shaderFloat64). The workgroup size is
 *      specialization constants 0..2 (common.glsl declares local_size_x_id = 0 ...);
 *      constants 3.. are the kernel's own (sub-op codes, tile sizes): KVK_SPEC(3, NAME,
 *      default) and so on.
 *   2. a line in backends/vulkan/meson.build naming the shader and its variants (core and nn
 *      have separate lists, so the two never touch each other's lines); glslc compiles each
 *      variant to SPIR-V at build time and shaders/embed.py links them into one table,
 *      looked up by (shader name, variant).
 *   3. a C wrapper that fills a params struct mirrored from the shader's block (std430:
 *      int32/uint32/float members and kvk_view / kvk_scalar, never a double or an int64,
 *      which would make the module need Float64 / Int64 for every dtype) and calls
 *      kvk_dispatch. kvk_view_of turns a kiln_tdesc into the view the shaders index with.
 *
 * Threads. A kvk_device is shared by every queue of it; what queues share (the allocator,
 * the pipeline table, the VkQueue) has its own lock. A kvk_queue is driven by one thread
 * at a time (the engine's rule), so its recording state needs no lock.
 *
 * Ordering. Every dispatch and copy of one queue is recorded into the queue's open command
 * buffer, with a full memory barrier before each, so one queue's work runs in submission
 * order. The buffer is submitted (kvk_flush) when a wait needs it (download, sync,
 * index checks), at event_record, or when it holds KVK_BATCH_MAX commands. Each
 * submission signals the queue's timeline semaphore with the next value; events are
 * (semaphore, value) pairs, and event_wait makes the waiting queue's next submission wait
 * on one. Every engine queue submits to the device's one VkQueue, and the barrier that
 * opens each command buffer also orders it after everything submitted there before: more
 * order than the interface asks for, which a device with several compute queues could
 * trade for overlap (one VkQueue per engine queue, ordered by the events alone).
 *
 * Errors. Anything that goes wrong after a call returned (a failed submit, a lost device, a
 * device-side index check) is kept in the queue (kvk_queue_fail) with the op's name and
 * returned by the next sync or download. A lost device also marks the device, so every
 * later call fails at once with the same message.
 */
#ifndef KILN_VK_IMPL_H
#define KILN_VK_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <vulkan/vulkan.h>

#include "backend.h"
#include "error-impl.h"

/** The most operand buffers of one dispatch (bindings 1..KVK_MAX_BUFS). */
#define KVK_MAX_BUFS 8
/** The most kernel-specific specialization constants (ids 3 .. 3 + KVK_SPEC_MAX - 1). */
#define KVK_SPEC_MAX 8
/** Commands recorded into one command buffer before it is submitted on its own. */
#define KVK_BATCH_MAX 256
/** The default workgroup size of 1-D kernels. */
#define KVK_WG 128
/** The most workgroups a kernel is launched with along x; 1-D kernels loop over the rest
 *  (every device allows at least 65535). */
#define KVK_GROUPS_MAX 65535u

typedef struct kvk_device kvk_device;
typedef struct kvk_queue kvk_queue;
typedef struct kvk_block kvk_block;

/* ------------------------------------------------------------------ buffers */

/** A tensor's memory: a range of one device-memory block (vk-memory.c). */
struct kiln_buffer {
    kvk_block *block;
    VkBuffer vkbuf;      /* the block's buffer, every sub-allocation shares it */
    VkDeviceSize offset; /* byte offset inside the block, aligned for binding */
    VkDeviceSize nbytes; /* what was asked for */
    VkDeviceSize cls;    /* the size class it was carved as (>= nbytes) */
    /* while free: which queue freed it and the timeline value that free followed */
    kvk_queue *freed_on;
    uint64_t freed_after;
    struct kiln_buffer *next;
    /* its sub-allocation went back to the free lists (buffer_detach): block is NULL until
     * buffer_reattach carves it another */
    bool detached;
};

/* ------------------------------------------------------------------ views and scalars */

/** A strided view as the shaders see it (std430, mirrored by KView in common.glsl): offset
 *  and strides in elements of the operand's dtype, shape padded with 1 to KILN_MAX_DIMS.
 *  contig is 1 when the view is row-major contiguous (shaders then skip the index math). */
typedef struct kvk_view {
    int32_t offset;
    int32_t ndim;
    int32_t numel;
    int32_t contig;
    int32_t shape[KILN_MAX_DIMS];
    int32_t strides[KILN_MAX_DIMS];
} kvk_view;

/** A double scalar in every form a shader may want it (std430, KScalar in common.glsl):
 *  f as float, i as int32 (truncated, saturated), d the double's bits, l the int64's
 *  (truncated, saturated) as low/high words. KVK_SCALAR_C0(s) picks slot 0's form. */
typedef struct kvk_scalar {
    float f;
    int32_t i;
    uint32_t d[2];
    uint32_t l[2];
} kvk_scalar;

/** v's view. -1 with "op: ..." set when an offset or stride does not fit in int32. */
int kvk_view_of(kvk_view *v, const kiln_tdesc *t, const char *op);
/** Views of n operands of one shape with their dims merged where every operand allows
 *  (size-1 dims dropped, adjacent dims fused), so shaders do less index math. Same error. */
int kvk_views_of(kvk_view *v, const kiln_tdesc *const *t, int n, const char *op);
kvk_scalar kvk_scalar_of(double v);
/** v as t is, dims unmerged (for kernels that address one dim by number). */
int kvk_view_exact(kvk_view *v, const kiln_tdesc *t, const char *op);
int64_t kvk_numel(const kiln_tdesc *t);

/* ------------------------------------------------------------------ dispatch */

/** Specialization constants of one pipeline: ids 0..2 the workgroup size (0 means 1), ids
 *  3.. c[0..n-1]. A pipeline is built once per (shader, variant, spec) and cached. */
typedef struct kvk_spec {
    uint32_t wg[3];
    uint32_t n;
    uint32_t c[KVK_SPEC_MAX];
} kvk_spec;

/** A 1-D spec with workgroup size KVK_WG and the given constants. */
kvk_spec kvk_spec_1d(int n, const uint32_t *c);

/**
 * Record one compute dispatch on q: shader `shader` compiled as `variant`, spec constants
 * spec (NULL: a 1-D KVK_WG workgroup, no constants), params (params_bytes, copied now into
 * q's host-visible ring) bound at binding 0, bufs[i] bound at binding i + 1 over its whole
 * range (NULL entries are bound to a small dummy buffer), and gx·gy·gz workgroups. Returns
 * 0, or a negative KILN_E* code with "op: ..." set (an unknown shader or variant names
 * both; the device's own failures are kept for the next sync as well).
 */
int kvk_dispatch(kvk_queue *q, const char *op, const char *shader, const char *variant, const kvk_spec *spec,
                 kiln_buffer *const *bufs, int nbufs, const void *params, size_t params_bytes, uint32_t gx,
                 uint32_t gy, uint32_t gz);

/** Workgroups for n items at wg per group, capped at KVK_GROUPS_MAX (at least 1). */
uint32_t kvk_groups(int64_t n, uint32_t wg);

/** The dtype's variant name ("f32", "bf16", ...) as the shader lists spell it. */
const char *kvk_dtype_name(kiln_dtype dt);
/** "a_b[_c]" into buf from the dtype names of n dtypes. */
const char *kvk_variant(char *buf, size_t len, int n, const kiln_dtype *dts);

/** The SPIR-V of shader/variant embedded at build time (vk-shaders.c, generated), or NULL. */
const uint32_t *kvk_shader_code(const char *shader, const char *variant, size_t *nbytes);

/* ------------------------------------------------------------------ device */

/** What the device can do that the kernels depend on (vk-device.c fills it at open). */
typedef struct kvk_features {
    bool f16;            /* 16-bit storage + shaderFloat16: f16 and bf16 */
    bool f64;            /* shaderFloat64 */
    bool subgroup_arith; /* subgroup arithmetic in compute shaders */
    uint32_t subgroup_size;
    VkDeviceSize max_range;      /* maxStorageBufferRange */
    VkDeviceSize align;          /* binding offset alignment used for every buffer */
    uint32_t max_wg_invocations; /* maxComputeWorkGroupInvocations */
    VkDeviceSize device_memory;  /* the largest device-local heap */
    /* Loop iterations one invocation may run, every loop of the shader counted together,
     * before the driver stops them and carries on with whatever it has (llvmpipe, the
     * driver of lavapipe, does so after 65535, silently); 0: no such limit. Kernels keep
     * their loops short of it, and the few that cannot refuse (kvk_loop_check). */
    uint32_t loop_limit;
} kvk_features;

/** Sub-allocator state (vk-memory.c). Guarded by lock. */
#define KVK_CLASSES 50
typedef struct kvk_alloc {
    pthread_mutex_t lock;
    kvk_block *blocks;
    kiln_buffer *free_list[KVK_CLASSES]; /* freed buffers of each size class */
    uint64_t memory_allocations;         /* vkAllocateMemory calls so far */
    uint64_t block_bytes;                /* device memory held in blocks */
    uint64_t in_use_bytes;               /* size classes of the buffers handed out */
    uint64_t peak_in_use_bytes;
    uint64_t reuses; /* allocations served from a free list */
} kvk_alloc;

struct kvk_device {
    int index;
    VkInstance instance; /* the process-wide one (vk-device.c) */
    VkPhysicalDevice phys;
    VkDevice dev;
    VkQueue vkq;
    uint32_t family;
    pthread_mutex_t submit_lock; /* vkQueueSubmit on vkq */
    VkPhysicalDeviceProperties props;
    VkPhysicalDeviceMemoryProperties memprops;
    kvk_features feat;
    bool dtype_ok[KILN_DTYPE_COUNT];
    char name[VK_MAX_PHYSICAL_DEVICE_NAME_SIZE];
    char driver[VK_MAX_DRIVER_NAME_SIZE + VK_MAX_DRIVER_INFO_SIZE + 4];
    PFN_vkCmdPushDescriptorSetKHR push_descriptors;
    VkDescriptorSetLayout set_layout; /* binding 0 params + KVK_MAX_BUFS operands */
    VkPipelineLayout pipe_layout;
    kvk_alloc alloc;
    kiln_buffer *dummy; /* bound where a dispatch passes NULL */
    /* pipelines (vk-pipeline.c) */
    pthread_mutex_t pipe_lock;
    struct kvk_pipeline **pipelines; /* hash buckets */
    VkPipelineCache cache;
    char cache_path[1024]; /* "" when no data directory is known */
    bool cache_loaded;     /* the file existed and was accepted */
    atomic_bool lost;      /* VK_ERROR_DEVICE_LOST seen: every later call fails */
    kvk_queue *queues;     /* every open queue, for the device-wide wait at close */
    struct kvk_fused_cache *fused; /* generated fused kernels (vk-fused.c), under pipe_lock */
    pthread_mutex_t queues_lock;
};

/** One submitted (or recording) command buffer and what it keeps alive. */
typedef struct kvk_batch {
    VkCommandBuffer cmd;
    uint64_t value; /* timeline value it signals */
    int ncmds;
    struct kvk_batch *next;
} kvk_batch;

/** A host-visible ring chunk: params and upload staging (vk-queue.c). */
typedef struct kvk_host_chunk {
    VkBuffer buf;
    VkDeviceMemory mem;
    void *map;
    VkDeviceSize size, used;
    uint64_t last_value; /* the last batch that reads it; reusable once that completed */
    struct kvk_host_chunk *next;
} kvk_host_chunk;

#define KVK_MAX_WAITS 16

struct kvk_queue {
    kvk_device *d;
    /* recursive: the device's default queue is shared by every thread that has not opened
     * its own, so each entry that records, submits or waits holds it */
    pthread_mutex_t lock;
    VkCommandPool pool;
    VkSemaphore timeline;
    uint64_t next_value;    /* the value the open batch will signal */
    kvk_batch *open;        /* recording, or NULL */
    kvk_batch *inflight;    /* submitted, oldest first */
    kvk_batch *spare;       /* finished, command buffers ready to reset */
    kvk_host_chunk *chunks; /* ring of host-visible chunks; the head is the one in use */
    VkSemaphore wait_sem[KVK_MAX_WAITS];
    uint64_t wait_value[KVK_MAX_WAITS];
    int nwaits;
    /* the first error of work already returned from, reported by the next sync/download */
    int err;
    char err_msg[KILN_ERROR_MAX];
    /* device-side checks (index_check): a small buffer the kernels write the first
     * violation into; read and reset at sync */
    kiln_buffer *check_buf;
    bool check_pending;
    const char *check_op[32], *check_noun[32];
    int64_t check_lo[32], check_hi[32];
    int ncheck;
    kvk_queue *next; /* in the device's list */
};

/** The event handed to the engine: one point of one queue's timeline. */
struct kiln_backend_event {
    kvk_queue *q;
    uint64_t value;
};

/* vk-device.c */
void *kvk_open(int index);
void *kvk_open_opts(const char *spec, int index, kiln_device_opts *o);
void kvk_close(void *ctx);
void kvk_caps(void *ctx, kiln_backend_caps *out);
bool kvk_supports(void *q, const kiln_op_query *query);
int kvk_list(kiln_device_info *out, int max);
const char *kvk_lost(void *ctx);
/** The allocator's figures (kiln_device_memory_get); ctx is the device. */
int kvk_memory(void *ctx, kiln_device_memory *out);
int kvk_memory_reset_peak(void *ctx);
/** 0 when a kernel whose invocations each run at most `steps` loop iterations (all its
 *  loops together) gives right values on q's device; KILN_ENOTSUP with "op: <fmt ...>
 *  takes ..." set where the device stops shader loops sooner (feat.loop_limit). fmt names
 *  what makes the loops long ("a row of %d elements"). */
int kvk_loop_check(kvk_queue *q, const char *op, int64_t steps, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/** Map a VkResult to a KILN_E* code with "op: what (VkResult name)" set; marks the device
 *  lost on VK_ERROR_DEVICE_LOST. */
int kvk_vk_error(kvk_device *d, const char *op, const char *what, VkResult r);
const char *kvk_result_name(VkResult r);
/** The memory type index with all of want's flags among bits, or -1. */
int kvk_memory_type(kvk_device *d, uint32_t bits, VkMemoryPropertyFlags want);

/* vk-memory.c */
void kvk_alloc_init(kvk_alloc *a);
void kvk_alloc_destroy(kvk_device *d);
kiln_buffer *kvk_buffer_alloc(void *q, size_t nbytes);
void kvk_buffer_free(void *q, kiln_buffer *b);
bool kvk_buffer_detach(void *q, kiln_buffer *b);
int kvk_buffer_reattach(void *q, kiln_buffer *b);
size_t kvk_buffer_trim(void *q, size_t bytes);
void kvk_alloc_forget_queue(kvk_device *d, kvk_queue *q);
int kvk_buffer_upload(void *q, kiln_buffer *dst, size_t off, const void *src, size_t n);
int kvk_buffer_download(void *q, kiln_buffer *src, size_t off, void *dst, size_t n);
/** A buffer straight from the device (for the device's own use: dummy, check buffers). */
kiln_buffer *kvk_buffer_alloc_device(kvk_device *d, size_t nbytes, const char *op);

/* vk-queue.c */
void *kvk_queue_open(void *ctx);
void kvk_queue_close(void *q);
/** The open command buffer of q (begun on first use), with a barrier after the previous
 *  command recorded; NULL with the error set when the device cannot give one. */
VkCommandBuffer kvk_record(kvk_queue *q, const char *op);
/** Submit q's open batch (if any) with its pending waits; 0 or KILN_E* (the error is also
 *  kept for the next sync). */
int kvk_flush(kvk_queue *q, const char *op);
/** Wait until q's timeline reaches value, retire finished batches. */
int kvk_wait_value(kvk_queue *q, uint64_t value, const char *op);
/** Completed value of q's timeline (retiring finished batches). */
uint64_t kvk_completed(kvk_queue *q);
/** Copy n bytes of src into q's host ring for the open batch: *buf and *off locate it (aligned
 *  to the device's binding alignment). NULL on failure with the error set. */
void *kvk_host_stage(kvk_queue *q, size_t n, VkBuffer *buf, VkDeviceSize *off, const char *op);
/** Keep the first error for the next sync/download of q (code, message "op: ..."). */
void kvk_queue_fail(kvk_queue *q, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/** Return (and clear) q's kept error, setting the thread error; 0 when none. */
int kvk_queue_take_error(kvk_queue *q);
int kvk_sync(void *q);
#define KVK_LOCKED(q, expr) (pthread_mutex_lock(&(q)->lock), kvk__unlock_ret((q), (expr)))
static inline int kvk__unlock_ret(kvk_queue *q, int rc)
{
    pthread_mutex_unlock(&q->lock);
    return rc;
}
int kvk_check_slot(kvk_queue *q, const char *op, const char *noun, int64_t lo, int64_t hi);
kiln_backend_event *kvk_event_record(void *q);
int kvk_event_wait(void *q, kiln_backend_event *ev);
int kvk_event_sync(void *q, kiln_backend_event *ev);
int kvk_event_query(void *q, kiln_backend_event *ev);
void kvk_event_free(void *q, kiln_backend_event *ev);

/* vk-pipeline.c */
int kvk_pipelines_init(kvk_device *d);
void kvk_pipelines_destroy(kvk_device *d);
/** Write the pipeline cache to its file now (also done at close). */
int kvk_pipeline_cache_save(kvk_device *d);
/** A compute pipeline from SPIR-V made at run time (code, nbytes), through the device's
 *  persisted pipeline cache; *module is its shader module (the caller destroys both).
 *  VK_NULL_HANDLE with "op: ..." set on failure. */
VkPipeline kvk_pipeline_from_spirv(kvk_device *d, const char *op, const uint32_t *code, size_t nbytes,
                                   const kvk_spec *spec, VkShaderModule *module);
/** kvk_dispatch with a pipeline the caller built (kvk_pipeline_from_spirv). */
int kvk_dispatch_pipeline(kvk_queue *q, const char *op, VkPipeline pipe, kiln_buffer *const *bufs, int nbufs,
                          const void *params, size_t params_bytes, uint32_t gx, uint32_t gy, uint32_t gz);

/* vk-fused.c, built with libshaderc: fused programs (backends/fused-program.h) generated as
 * GLSL. Weak: without shaderc the table's fused_run is NULL and groups are replayed. */
int kvk_fused_run(void *q, const kiln_fused_program *p) __attribute__((weak));
/** Destroys the device's generated pipelines (at close, before the pipeline cache). */
void kvk_fused_destroy(kvk_device *d) __attribute__((weak));
/** The embedded GLSL headers generated kernels include (vk-glsl-text.c). */
typedef struct kvk_glsl_text {
    const char *name, *text;
    size_t len;
} kvk_glsl_text;
extern const kvk_glsl_text kvk_glsl_texts[];

/* ------------------------------------------------------------------ the primitives */
/* Core (vk-data.c, vk-elementwise.c, vk-reduce.c, vk-sort.c, vk-index.c). */
int kvk_fill(void *q, const kiln_tdesc *out, double value);
int kvk_arange(void *q, const kiln_tdesc *out, double start, double step);
int kvk_copy(void *q, const kiln_tdesc *out, const kiln_tdesc *in);
int kvk_rng(void *q, kiln_rng_kind kind, const kiln_tdesc *out, uint64_t seed, uint64_t offset, double p0,
            double p1);
int kvk_unary(void *q, kiln_unary_op op, const kiln_tdesc *out, const kiln_tdesc *in, double alpha, double beta);
int kvk_binary(void *q, kiln_binary_op op, const kiln_tdesc *out, const kiln_tdesc *a, const kiln_tdesc *b);
int kvk_where(void *q, const kiln_tdesc *out, const kiln_tdesc *cond, const kiln_tdesc *a, const kiln_tdesc *b);
int kvk_reduce(void *q, kiln_reduce_op op, const kiln_tdesc *out, const kiln_tdesc *in, uint32_t mask,
               double param);
int kvk_arg_reduce(void *q, bool is_max, const kiln_tdesc *out, const kiln_tdesc *in, int dim);
int kvk_cumsum(void *q, const kiln_tdesc *out, const kiln_tdesc *in, int dim);
int kvk_sort(void *q, const kiln_tdesc *values, const kiln_tdesc *indices, const kiln_tdesc *in, int dim,
             bool descending);
int kvk_index_check(void *q, const kiln_tdesc *index, int64_t lo, int64_t hi, const char *op, const char *noun);
int kvk_gather(void *q, const kiln_tdesc *out, const kiln_tdesc *in, int dim, const kiln_tdesc *index);
int kvk_scatter(void *q, const kiln_tdesc *out, int dim, const kiln_tdesc *index, const kiln_tdesc *src,
                bool accumulate);
int kvk_index_select(void *q, const kiln_tdesc *out, const kiln_tdesc *in, int dim, const kiln_tdesc *index);
int kvk_index_add(void *q, const kiln_tdesc *out, int dim, const kiln_tdesc *index, const kiln_tdesc *src);
int kvk_pad(void *q, kiln_pad_mode mode, const kiln_tdesc *out, const kiln_tdesc *in, const int64_t *pads,
            double value);

/* NN kernels (vk-matmul*, vk-conv*, vk-pool*, vk-norm*, vk-optim*). Declared weak: the table
 * in vk-backend.c names them all, and one not linked in leaves its entry NULL (the engine
 * then composes the op or refuses it by name). */
#define KVK_WEAK __attribute__((weak))
KVK_WEAK int kvk_matmul(void *q, const kiln_tdesc *out, const kiln_tdesc *a, const kiln_tdesc *b);
KVK_WEAK int kvk_conv(void *q, const kiln_conv_params *p, const kiln_tdesc *out, const kiln_tdesc *x,
                      const kiln_tdesc *w, const kiln_tdesc *bias);
KVK_WEAK int kvk_conv_backward_input(void *q, const kiln_conv_params *p, const kiln_tdesc *grad_x,
                                     const kiln_tdesc *grad_out, const kiln_tdesc *w);
KVK_WEAK int kvk_conv_backward_weight(void *q, const kiln_conv_params *p, const kiln_tdesc *grad_w,
                                      const kiln_tdesc *x, const kiln_tdesc *grad_out);
KVK_WEAK int kvk_conv_fused(void *q, const kiln_conv_params *p, const kiln_tdesc *out, const kiln_tdesc *x,
                            const kiln_tdesc *w, const kiln_tdesc *wpacked, const kiln_tdesc *bias,
                            const kiln_epilogue *ep);
KVK_WEAK int64_t kvk_conv_pack_size(void *q, const kiln_conv_params *p, const kiln_tdesc *x, const kiln_tdesc *w);
KVK_WEAK int kvk_conv_pack(void *q, const kiln_tdesc *packed, const kiln_tdesc *w);
KVK_WEAK int kvk_epilogue(void *q, const kiln_tdesc *out, const kiln_epilogue *ep);
KVK_WEAK int kvk_pool(void *q, const kiln_pool_params *p, const kiln_tdesc *out, const kiln_tdesc *indices,
                      const kiln_tdesc *x);
KVK_WEAK int kvk_pool_backward(void *q, const kiln_pool_params *p, const kiln_tdesc *grad_x,
                               const kiln_tdesc *grad_out, const kiln_tdesc *indices);
KVK_WEAK int kvk_adaptive_avg_pool(void *q, int nspatial, const kiln_tdesc *out, const kiln_tdesc *x);
KVK_WEAK int kvk_adaptive_avg_pool_backward(void *q, int nspatial, const kiln_tdesc *grad_x,
                                            const kiln_tdesc *grad_out);
KVK_WEAK int kvk_interpolate(void *q, kiln_interp_mode mode, bool align_corners, const kiln_tdesc *out,
                             const kiln_tdesc *x);
KVK_WEAK int kvk_interpolate_backward(void *q, kiln_interp_mode mode, bool align_corners, const kiln_tdesc *grad_x,
                                      const kiln_tdesc *grad_out);
KVK_WEAK int kvk_softmax(void *q, bool log, const kiln_tdesc *out, const kiln_tdesc *in, int dim);
KVK_WEAK int kvk_layer_norm(void *q, const kiln_tdesc *out, const kiln_tdesc *mean, const kiln_tdesc *rstd,
                            const kiln_tdesc *x, const kiln_tdesc *weight, const kiln_tdesc *bias, int64_t inner,
                            double eps);
KVK_WEAK int kvk_adam_step(void *q, const kiln_adam_params *p, const kiln_tdesc *param, const kiln_tdesc *grad,
                           const kiln_tdesc *exp_avg, const kiln_tdesc *exp_avg_sq,
                           const kiln_tdesc *max_exp_avg_sq);
KVK_WEAK int kvk_rnn(void *q, const kiln_rnn_params *p, const kiln_rnn_operands *o);
/** Optional capability answers of the NN kernels: true when this file's kernels take the
 *  query (entry, op, dtype, params). Weak: absent means "every dtype the device has". */
KVK_WEAK bool kvk_nn_supports(kvk_queue *q, const kiln_op_query *query);

/* t lifted to at least one dim (a 0-d tensor is [1]): the kernels index one dim or more. */
static inline kiln_tdesc kvk_lifted(const kiln_tdesc *t)
{
    kiln_tdesc r = *t;
    if (r.ndim == 0) {
        r.ndim = 1;
        r.shape[0] = 1;
        r.strides[0] = 1;
    }
    return r;
}

#endif /* KILN_VK_IMPL_H */
