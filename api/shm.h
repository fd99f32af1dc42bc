/*
 * api/shm.h — Triton's system shared-memory extension: POSIX shared-memory regions a client
 * registers by name (a key for shm_open, an offset into that object and a byte size), which
 * inference requests then read inputs from and write outputs into instead of carrying the bytes
 * in the request and the response. HTTP (/v2/systemsharedmemory/...) and gRPC
 * (SystemSharedMemory*) both speak to the one table kilnd keeps (api/serving.h: kd_serving_shm).
 *
 * Safety:
 * - A region is mapped read-write (shm_open O_RDWR, MAP_SHARED) once, at registration, and only
 *   when the object holds offset + byte_size bytes; nothing outside [offset, offset + byte_size)
 *   of the object is ever mapped, read or written.
 * - Every slice a request names (its own offset and size inside the region) is checked against
 *   the region's byte size, overflow-checked, before the request is queued.
 * - A request holds a reference on each region it uses (kd_shm_slice), so unregistering a region
 *   while a request reads or writes it only takes it out of the table: the mapping goes when the
 *   last request lets go. kd_shm_table_free unregisters every region at shutdown.
 * - The object's size is checked again (fstat) right before each read or write, so an object a
 *   client shrank after registering is refused rather than touched past its end (a shrink racing
 *   the copy itself is not caught: registering is an admin action for that reason).
 * - At most KD_SHM_MAX_REGIONS regions; names are 1..KD_SHM_NAME_MAX of [A-Za-z0-9_.-]; keys are
 *   "/" then 1..KD_SHM_KEY_MAX of the same characters.
 *
 * Thread affinity: the table (register, unregister, status, kd_shm_slice_get) is the I/O loop's.
 * A slice may be read, written and released on any thread (the region's count is atomic).
 */
#ifndef KD_API_SHM_H
#define KD_API_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "scheduler.h"

#define KD_SHM_MAX_REGIONS 256
#define KD_SHM_NAME_MAX 128
#define KD_SHM_KEY_MAX 200

struct kd_shm_table;
struct kd_shm_region;

/* Part of a registered region a request uses: [offset, offset + size) of the region. */
struct kd_shm_slice {
    struct kd_shm_region *region; /* a reference, or NULL when the tensor is not in shared memory */
    uint64_t offset, size;
};

/* One request's slices, by model input and output index. */
struct kd_shm_use {
    struct kd_shm_slice in[KD_SCHED_MAX_IO];
    struct kd_shm_slice out[KD_SCHED_MAX_IO];
};

struct kd_shm_table *kd_shm_table_new(void);
/* Unregisters every region (mappings still used by requests go when those finish). */
void kd_shm_table_free(struct kd_shm_table *t);

/*
 * Maps the object key names, from offset for byte_size bytes, as region name. 0, or an HTTP
 * status with msg: 400 (a malformed name or key, a zero size, an object that does not exist or
 * is smaller than offset + byte_size), 409 (the name is taken), 429 (KD_SHM_MAX_REGIONS reached),
 * 500 (mmap failed).
 */
int kd_shm_register(struct kd_shm_table *t, const char *name, const char *key, uint64_t offset, uint64_t byte_size,
                    char *msg, size_t n);
/* Unregisters name (NULL or "": every region). 0, or 404 with msg for an unknown name. */
int kd_shm_unregister(struct kd_shm_table *t, const char *name, char *msg, size_t n);
/*
 * Calls row for name's region (NULL or "": every region, in registration order). 0, or 404 with
 * msg for an unknown name.
 */
int kd_shm_status(struct kd_shm_table *t, const char *name,
                  void (*row)(void *ud, const char *name, const char *key, uint64_t offset, uint64_t byte_size),
                  void *ud, char *msg, size_t n);
/* Registered regions. */
int kd_shm_count(const struct kd_shm_table *t);

/* Whether name is a well-formed region name. */
bool kd_shm_name_valid(const char *name);

/*
 * The slice [offset, offset + size) of region name, retained into *out. what names the tensor in
 * messages ("input 'x'"). 0, or 400 with msg: an unknown region, or a slice past its byte size.
 */
int kd_shm_slice_get(struct kd_shm_table *t, const char *name, uint64_t offset, uint64_t size, const char *what,
                     struct kd_shm_slice *out, char *msg, size_t n);
/* Where the slice's bytes are, or NULL (msg filled) when the object has shrunk since. Any thread. */
void *kd_shm_slice_ptr(const struct kd_shm_slice *s, char *msg, size_t n);
/* The region's name (for responses). */
const char *kd_shm_slice_region_name(const struct kd_shm_slice *s);
/* Releases the slice's reference (NULL region: nothing). Any thread. */
void kd_shm_slice_release(struct kd_shm_slice *s);
/* Releases every slice of u. Any thread. */
void kd_shm_use_release(struct kd_shm_use *u);
/* Whether u holds any slice. */
bool kd_shm_use_any(const struct kd_shm_use *u);
/*
 * Copies each output of the finished request r (model config c) that u places in shared memory
 * into its slice (any thread: the worker that ran it). 0, or 400 with msg: an output larger than
 * its slice's byte size (nothing written into that slice), or a region that shrank.
 */
int kd_shm_write_outputs(const struct kd_shm_use *u, const kd_model_config *c, const struct kd_sched_request *r,
                         char *msg, size_t msglen);

#endif /* KD_API_SHM_H */
