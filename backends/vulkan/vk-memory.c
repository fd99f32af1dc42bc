/*
 * backends/vulkan/vk-memory.c — device memory: a few large blocks sub-allocated by size
 * class, freed buffers kept per class and reused in stream order, and the uploads and
 * downloads that move bytes through the queue's host-visible staging ring.
 *
 * Blocks. Tensors up to KVK_SMALL_MAX bytes are carved (bump pointer) from shared blocks
 * of KVK_BLOCK_BYTES; larger ones get a block of their own. Either way a freed buffer goes
 * back to its class's free list and is handed out again before any new memory is asked
 * for, so vkAllocateMemory runs once per block, not once per tensor (the count is kept in
 * kvk_alloc.memory_allocations, which the tests read). buffer_trim gives the free
 * dedicated blocks back to the driver.
 *
 * Stream order (backend.h, "buffer_free(q, buf)"). A buffer freed on queue q records q and
 * the timeline value of q's last batch that may still use it. q may take it again at once
 * (its later work runs after), another queue only once q's timeline passed that value.
 *
 * Size limit. A buffer is bound whole as one storage-buffer descriptor, so none may exceed
 * maxStorageBufferRange; a larger one is refused at alloc with a message naming both sizes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vk-impl.h"

#define KVK_BLOCK_BYTES ((VkDeviceSize)64 << 20)
#define KVK_SMALL_MAX ((VkDeviceSize)8 << 20)
#define KVK_MIN_CLASS ((VkDeviceSize)256)

struct kvk_block {
    VkDeviceMemory mem;
    VkBuffer buf;
    VkDeviceSize size, used;
    bool dedicated;
    int live; /* buffers carved from it that exist (in use or free) */
    kvk_block *next;
};

void kvk_alloc_init(kvk_alloc *a)
{
    memset(a, 0, sizeof *a);
    pthread_mutex_init(&a->lock, NULL);
}

/* Classes: 256 B, then two per octave (2^k and 1.5 * 2^k), up to 6 GiB. */
static int class_of(VkDeviceSize n, VkDeviceSize *size)
{
    int i = 0;
    VkDeviceSize s = KVK_MIN_CLASS;
    for (; i < KVK_CLASSES - 1; i++) {
        s = KVK_MIN_CLASS << (i / 2);
        if (i % 2)
            s += s / 2;
        if (s >= n)
            break;
    }
    *size = s;
    return i;
}

static kvk_block *block_new(kvk_device *d, VkDeviceSize size, bool dedicated, const char *op)
{
    kvk_block *b = calloc(1, sizeof *b);
    if (!b) {
        kiln__error_set_code(KILN_ENOMEM, "%s: out of host memory", op);
        return NULL;
    }
    VkBufferCreateInfo bci = {
        .sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
        .size = size,
        .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                 VK_BUFFER_USAGE_TRANSFER_DST_BIT,
        .sharingMode = VK_SHARING_MODE_EXCLUSIVE,
    };
    VkResult r = vkCreateBuffer(d->dev, &bci, NULL, &b->buf);
    if (r != VK_SUCCESS) {
        free(b);
        kvk_vk_error(d, op, "vkCreateBuffer", r);
        return NULL;
    }
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(d->dev, b->buf, &req);
    int type = kvk_memory_type(d, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
    if (type < 0)
        type = kvk_memory_type(d, req.memoryTypeBits, 0);
    VkMemoryAllocateInfo mai = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
        .allocationSize = req.size,
        .memoryTypeIndex = (uint32_t)type,
    };
    r = vkAllocateMemory(d->dev, &mai, NULL, &b->mem);
    if (r != VK_SUCCESS) {
        vkDestroyBuffer(d->dev, b->buf, NULL);
        free(b);
        kvk_vk_error(d, op, "vkAllocateMemory", r);
        return NULL;
    }
    d->alloc.memory_allocations++;
    r = vkBindBufferMemory(d->dev, b->buf, b->mem, 0);
    if (r != VK_SUCCESS) {
        vkFreeMemory(d->dev, b->mem, NULL);
        vkDestroyBuffer(d->dev, b->buf, NULL);
        free(b);
        kvk_vk_error(d, op, "vkBindBufferMemory", r);
        return NULL;
    }
    b->size = size;
    b->dedicated = dedicated;
    d->alloc.block_bytes += size;
    b->next = d->alloc.blocks;
    d->alloc.blocks = b;
    return b;
}

static void block_release(kvk_device *d, kvk_block *b)
{
    kvk_block **pp = &d->alloc.blocks;
    while (*pp && *pp != b)
        pp = &(*pp)->next;
    if (*pp)
        *pp = b->next;
    d->alloc.block_bytes -= b->size;
    vkDestroyBuffer(d->dev, b->buf, NULL);
    vkFreeMemory(d->dev, b->mem, NULL);
    free(b);
}

void kvk_alloc_destroy(kvk_device *d)
{
    kvk_alloc *a = &d->alloc;
    for (int c = 0; c < KVK_CLASSES; c++) {
        kiln_buffer *b = a->free_list[c];
        while (b) {
            kiln_buffer *n = b->next;
            free(b);
            b = n;
        }
        a->free_list[c] = NULL;
    }
    while (a->blocks)
        block_release(d, a->blocks);
}

/* May queue q take buffer b, freed on b->freed_on? */
static bool reusable(kvk_device *d, const kiln_buffer *b, const kvk_queue *q)
{
    if (!b->freed_on || b->freed_on == q)
        return true;
    uint64_t v = 0;
    return vkGetSemaphoreCounterValue(d->dev, b->freed_on->timeline, &v) == VK_SUCCESS && v >= b->freed_after;
}

/* The in-use figure (kvk_memory) moves by delta bytes; under the allocator's lock. */
static void note_in_use(kvk_alloc *a, int64_t delta)
{
    a->in_use_bytes = (uint64_t)((int64_t)a->in_use_bytes + delta);
    if (a->in_use_bytes > a->peak_in_use_bytes)
        a->peak_in_use_bytes = a->in_use_bytes;
}

static kiln_buffer *alloc_locked(kvk_device *d, kvk_queue *q, size_t nbytes, const char *op)
{
    VkDeviceSize cls;
    int c = class_of(nbytes ? nbytes : 1, &cls);
    for (kiln_buffer **pp = &d->alloc.free_list[c]; *pp; pp = &(*pp)->next) {
        kiln_buffer *b = *pp;
        if (reusable(d, b, q)) {
            *pp = b->next;
            b->next = NULL;
            b->nbytes = nbytes;
            b->freed_on = NULL;
            d->alloc.reuses++;
            note_in_use(&d->alloc, (int64_t)b->cls);
            return b;
        }
    }
    kiln_buffer *b = calloc(1, sizeof *b);
    if (!b) {
        kiln__error_set_code(KILN_ENOMEM, "%s: out of host memory", op);
        return NULL;
    }
    kvk_block *blk = NULL;
    if (cls > KVK_SMALL_MAX) {
        blk = block_new(d, cls, true, op);
    } else {
        VkDeviceSize need = cls;
        for (kvk_block *k = d->alloc.blocks; k; k = k->next)
            if (!k->dedicated && k->size - k->used >= need) {
                blk = k;
                break;
            }
        if (!blk) {
            VkDeviceSize bs = KVK_BLOCK_BYTES;
            if (bs > d->feat.device_memory / 4 && d->feat.device_memory)
                bs = KVK_SMALL_MAX * 2;
            blk = block_new(d, bs, false, op);
        }
    }
    if (!blk) {
        free(b);
        return NULL;
    }
    b->block = blk;
    b->vkbuf = blk->buf;
    b->offset = blk->dedicated ? 0 : blk->used;
    b->cls = cls;
    b->nbytes = nbytes;
    if (!blk->dedicated)
        blk->used += cls; /* classes are multiples of 64 >= the binding alignment */
    blk->live++;
    note_in_use(&d->alloc, (int64_t)cls);
    return b;
}

kiln_buffer *kvk_buffer_alloc_device(kvk_device *d, size_t nbytes, const char *op)
{
    pthread_mutex_lock(&d->alloc.lock);
    kiln_buffer *b = alloc_locked(d, NULL, nbytes, op);
    pthread_mutex_unlock(&d->alloc.lock);
    return b;
}

kiln_buffer *kvk_buffer_alloc(void *vq, size_t nbytes)
{
    kvk_queue *q = vq;
    kvk_device *d = q->d;
    if (atomic_load(&d->lost)) {
        kiln__error_set_code(KILN_EDEVICE, "buffer_alloc: the vulkan device '%s' was lost", d->name);
        return NULL;
    }
    if (nbytes > d->feat.max_range) {
        kiln__error_set_code(
            KILN_ETOOLARGE,
            "buffer_alloc: a buffer of %zu bytes exceeds the device's maxStorageBufferRange of %llu "
            "bytes ('%s'); split the tensor or use another device",
            nbytes, (unsigned long long)d->feat.max_range, d->name);
        return NULL;
    }
    pthread_mutex_lock(&d->alloc.lock);
    kiln_buffer *b = alloc_locked(d, q, nbytes, "buffer_alloc");
    pthread_mutex_unlock(&d->alloc.lock);
    return b;
}

void kvk_buffer_free(void *vq, kiln_buffer *b)
{
    if (!b)
        return;
    kvk_queue *q = vq;
    kvk_device *d = q ? q->d : NULL;
    if (!d) {
        /* the device's own buffers (dummy), freed at close: straight back to its block */
        b->block->live--;
        free(b);
        return;
    }
    if (b->detached) { /* its sub-allocation is in the free lists already */
        free(b);
        return;
    }
    VkDeviceSize cls;
    int c = class_of(b->cls, &cls);
    pthread_mutex_lock(&q->lock);
    uint64_t after = q->open ? q->next_value : q->next_value - 1;
    pthread_mutex_unlock(&q->lock);
    pthread_mutex_lock(&d->alloc.lock);
    b->freed_on = q;
    b->freed_after = after;
    b->next = d->alloc.free_list[c];
    d->alloc.free_list[c] = b;
    note_in_use(&d->alloc, -(int64_t)b->cls);
    pthread_mutex_unlock(&d->alloc.lock);
}

bool kvk_buffer_detach(void *vq, kiln_buffer *b)
{
    kvk_queue *q = vq;
    if (!b || !q || b->detached)
        return false;
    /* the free lists link sub-allocation records: the memory leaves under a record of its
     * own, freed on q as the buffer itself would be, so that b stays the caller's handle */
    kiln_buffer *record = calloc(1, sizeof *record);
    if (!record)
        return false;
    record->block = b->block, record->vkbuf = b->vkbuf, record->offset = b->offset;
    record->nbytes = b->nbytes, record->cls = b->cls;
    b->block = NULL, b->vkbuf = VK_NULL_HANDLE, b->offset = 0;
    b->detached = true;
    kvk_buffer_free(q, record);
    return true;
}

int kvk_buffer_reattach(void *vq, kiln_buffer *b)
{
    kvk_queue *q = vq;
    if (!b->detached)
        return 0;
    pthread_mutex_lock(&q->d->alloc.lock);
    kiln_buffer *record = alloc_locked(q->d, q, b->nbytes, "buffer_reattach");
    pthread_mutex_unlock(&q->d->alloc.lock);
    if (!record)
        return KILN_ENOMEM;
    b->block = record->block, b->vkbuf = record->vkbuf, b->offset = record->offset, b->cls = record->cls;
    b->freed_on = NULL;
    b->detached = false;
    free(record);
    return 0;
}

int kvk_memory(void *ctx, kiln_device_memory *out)
{
    kvk_device *d = ctx;
    kvk_alloc *a = &d->alloc;
    pthread_mutex_lock(&a->lock);
    /* reserved: every block taken from the driver; what is not in use (free lists and
     * the unused tails of shared blocks) counts as cached */
    *out = (kiln_device_memory){
        .in_use_bytes = a->in_use_bytes,
        .cached_bytes = a->block_bytes > a->in_use_bytes ? a->block_bytes - a->in_use_bytes : 0,
        .reserved_bytes = a->block_bytes,
        .peak_in_use_bytes = a->peak_in_use_bytes,
        .device_allocs = a->memory_allocations,
        .reuses = a->reuses,
    };
    pthread_mutex_unlock(&a->lock);
    return 0;
}

int kvk_memory_reset_peak(void *ctx)
{
    kvk_device *d = ctx;
    pthread_mutex_lock(&d->alloc.lock);
    d->alloc.peak_in_use_bytes = d->alloc.in_use_bytes;
    pthread_mutex_unlock(&d->alloc.lock);
    return 0;
}

/* Forget queue q in the free lists (q finished its work and is closing). */
void kvk_alloc_forget_queue(kvk_device *d, kvk_queue *q)
{
    pthread_mutex_lock(&d->alloc.lock);
    for (int c = 0; c < KVK_CLASSES; c++)
        for (kiln_buffer *b = d->alloc.free_list[c]; b; b = b->next)
            if (b->freed_on == q)
                b->freed_on = NULL;
    pthread_mutex_unlock(&d->alloc.lock);
}

size_t kvk_buffer_trim(void *vq, size_t bytes)
{
    kvk_queue *q = vq;
    kvk_device *d = q->d;
    size_t released = 0;
    pthread_mutex_lock(&q->lock);
    pthread_mutex_lock(&d->alloc.lock);
    for (int c = KVK_CLASSES - 1; c >= 0 && released < bytes; c--) {
        kiln_buffer **pp = &d->alloc.free_list[c];
        while (*pp && released < bytes) {
            kiln_buffer *b = *pp;
            if (b->block->dedicated && reusable(d, b, q)) {
                *pp = b->next;
                released += b->block->size;
                if (b->freed_on == q && b->freed_after >= q->next_value - 1) {
                    /* its last use may still run: wait for it before freeing the memory */
                    kvk_flush(q, "buffer_trim");
                    kvk_wait_value(q, b->freed_after, "buffer_trim");
                }
                block_release(d, b->block);
                free(b);
            } else {
                pp = &b->next;
            }
        }
    }
    pthread_mutex_unlock(&d->alloc.lock);
    pthread_mutex_unlock(&q->lock);
    return released;
}

static int upload_locked(kvk_queue *q, kiln_buffer *dst, size_t off, const void *src, size_t n);

int kvk_buffer_upload(void *vq, kiln_buffer *dst, size_t off, const void *src, size_t n)
{
    kvk_queue *q = vq;
    return KVK_LOCKED(q, upload_locked(q, dst, off, src, n));
}

static int upload_locked(kvk_queue *q, kiln_buffer *dst, size_t off, const void *src, size_t n)
{
    if (n == 0)
        return 0;
    if (off + n > dst->nbytes)
        return kiln__error_set("buffer_upload: %zu bytes at offset %zu overrun a buffer of %llu bytes", n, off,
                               (unsigned long long)dst->nbytes),
               KILN_EINVAL;
    VkBuffer sbuf;
    VkDeviceSize soff;
    void *p = kvk_host_stage(q, n, &sbuf, &soff, "buffer_upload");
    if (!p)
        return KILN_ENOMEM;
    memcpy(p, src, n);
    VkCommandBuffer cmd = kvk_record(q, "buffer_upload");
    if (!cmd)
        return KILN_EDEVICE;
    VkBufferCopy region = {.srcOffset = soff, .dstOffset = dst->offset + off, .size = n};
    vkCmdCopyBuffer(cmd, sbuf, dst->vkbuf, 1, &region);
    return 0;
}

static int download_locked(kvk_queue *q, kiln_buffer *src, size_t off, void *dst, size_t n);

int kvk_buffer_download(void *vq, kiln_buffer *src, size_t off, void *dst, size_t n)
{
    kvk_queue *q = vq;
    return KVK_LOCKED(q, download_locked(q, src, off, dst, n));
}

static int download_locked(kvk_queue *q, kiln_buffer *src, size_t off, void *dst, size_t n)
{
    if (off + n > src->nbytes)
        return kiln__error_set("buffer_download: %zu bytes at offset %zu overrun a buffer of %llu bytes", n, off,
                               (unsigned long long)src->nbytes),
               KILN_EINVAL;
    void *p = NULL;
    if (n) {
        VkBuffer sbuf;
        VkDeviceSize soff;
        p = kvk_host_stage(q, n, &sbuf, &soff, "buffer_download");
        if (!p)
            return KILN_ENOMEM;
        VkCommandBuffer cmd = kvk_record(q, "buffer_download");
        if (!cmd)
            return KILN_EDEVICE;
        VkBufferCopy region = {.srcOffset = src->offset + off, .dstOffset = soff, .size = n};
        vkCmdCopyBuffer(cmd, src->vkbuf, sbuf, 1, &region);
    }
    int rc = kvk_sync(q);
    if (rc < 0)
        return rc;
    if (n)
        memcpy(dst, p, n);
    return 0;
}
